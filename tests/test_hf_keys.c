/* Unit tests for src/io/hf_keys: the HF key table against the tensors transformers'
 * save_pretrained wrote (fixtures from tools/make_hf_key_fixture.py), the qtitan parameter
 * table, export/load round trips and the checker's missing / unexpected / misshaped lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_hfk_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    Err err;
    return fs_remove_tree(g_dir, &err);
}

static char *fixture(const char *name, const char *ext) {
    const char *src = getenv("QT_SOURCE_DIR");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/tests/fixtures/hf_keys/%s%s", src ? src : ".", name, ext);
    return xstrdup(buf);
}

static void load_spec(ModelSpec *s, const char *name) {
    char *p = fixture(name, ".config.json");
    Err err;
    if (model_spec_from_hf_config(s, p, &err) != 0) fail_msg("%s", err.msg);
    free(p);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void check_against_transformers(const char *name) {
    ModelSpec s;
    load_spec(&s, name);
    HfKeyTable t;
    hf_keys_build(&t, &s);
    char **lines = xmalloc((size_t)t.nhf * sizeof *lines);
    size_t total = 0;
    for (int i = 0; i < t.nhf; i++) {
        char buf[256];
        const HfTensor *h = &t.hf[i];
        if (h->ndim == 1)
            snprintf(buf, sizeof buf, "%s %lld\n", h->name, (long long)h->shape[0]);
        else
            snprintf(buf, sizeof buf, "%s %lld,%lld\n", h->name, (long long)h->shape[0],
                     (long long)h->shape[1]);
        lines[i] = xstrdup(buf);
        total += strlen(buf);
    }
    qsort(lines, (size_t)t.nhf, sizeof *lines, cmp_str);
    char *ours = xcalloc(total + 1, 1);
    for (int i = 0; i < t.nhf; i++) {
        strcat(ours, lines[i]);
        free(lines[i]);
    }
    free(lines);
    char *p = fixture(name, ".txt"), *want;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(p, &want, &len, &err), 0);
    if (strcmp(ours, want) != 0)
        fail_msg("%s: our HF keys\n%s\ntransformers\n%s", name, ours, want);
    free(want);
    free(ours);
    free(p);
    hf_keys_free(&t);
}

static void test_keys_dense_tied(void **state) {
    (void)state;
    check_against_transformers("dense_tied");
}
static void test_keys_dense_untied(void **state) {
    (void)state;
    check_against_transformers("dense_untied");
}
static void test_keys_moe(void **state) {
    (void)state;
    check_against_transformers("moe");
}
static void test_keys_moe_step2_tied(void **state) {
    (void)state;
    check_against_transformers("moe_step2_tied");
}

static void test_param_table(void **state) {
    (void)state;
    ModelSpec s;
    load_spec(&s, "moe");
    s.load_balance_coeff = 1e-3;
    HfKeyTable t;
    hf_keys_build(&t, &s);
    /* 3 layers, layer 1 dense: 8 attention-side + (3 dense | 4 MoE + expert_bias). */
    assert_int_equal(t.nparams, 1 + 3 * 8 + 3 + 2 * 5 + 1 + 1);
    int p = hf_keys_find_param(&t, "layers.0.moe.experts.w2");
    assert_true(p >= 0);
    assert_int_equal(t.params[p].kind->role, ROLE_EXPERTS);
    assert_int_equal(t.params[p].ndim, 3);
    assert_int_equal(t.params[p].shape[0], 4);
    assert_int_equal(t.params[p].shape[1], 16);
    assert_int_equal(t.params[p].shape[2], 12);
    assert_int_equal(t.params[p].kind->init, INIT_RESIDUAL);
    p = hf_keys_find_param(&t, "layers.2.moe.expert_bias");
    assert_true(p >= 0);
    assert_null(t.params[p].kind->hf);
    assert_int_equal(t.params[p].kind->role, ROLE_BUFFER);
    p = hf_keys_find_param(&t, "layers.1.feed_forward.w2.weight");
    assert_true(p >= 0 && t.params[p].kind->tp == TP_COLS && t.params[p].kind->role == ROLE_LINEAR);
    assert_true(hf_keys_find_param(&t, "layers.1.moe.experts.w1") < 0);
    p = hf_keys_find_param(&t, "layers.0.attention.wq.weight");
    assert_int_equal(t.params[p].shape[0], 4 * 8);
    assert_int_equal(t.params[p].kind->decay, DECAY_ALWAYS);
    assert_int_equal(
        t.params[hf_keys_find_param(&t, "layers.0.attention.q_norm.weight")].kind->decay,
        DECAY_NORMS);
    assert_int_equal(t.params[hf_keys_find_param(&t, "tok_embeddings.weight")].kind->decay,
                     DECAY_EMBEDDINGS);
    assert_int_equal(t.params[hf_keys_find_param(&t, "layers.0.attention.wo.weight")].kind->init,
                     INIT_RESIDUAL);
    assert_true(hf_keys_find_param(&t, "output.weight") >= 0);
    int h = hf_keys_find_hf(&t, "model.layers.2.mlp.experts.3.up_proj.weight");
    assert_true(h >= 0);
    assert_int_equal(t.hf[h].expert, 3);
    assert_string_equal(t.params[t.hf[h].param].name, "layers.2.moe.experts.w3");
    assert_int_equal(hf_keys_find_hf(&t, "model.layers.1.mlp.gate.weight"), -1);
    hf_keys_free(&t);
    load_spec(&s, "dense_tied");
    hf_keys_build(&t, &s);
    assert_int_equal(hf_keys_find_param(&t, "output.weight"), -1);
    assert_int_equal(hf_keys_find_hf(&t, "lm_head.weight"), -1);
    hf_keys_free(&t);
}

/* Fills every parameter with distinct random values. */
static float **make_params(const HfKeyTable *t, uint64_t seed) {
    float **ps = xmalloc((size_t)t->nparams * sizeof *ps);
    Rng r;
    rng_seed(&r, seed, 0);
    for (int i = 0; i < t->nparams; i++) {
        ps[i] = xmalloc((size_t)t->params[i].numel * sizeof(float));
        for (int64_t j = 0; j < t->params[i].numel; j++)
            ps[i][j] = rng_normal(&r);
    }
    return ps;
}

static void free_params(const HfKeyTable *t, float **ps) {
    for (int i = 0; i < t->nparams; i++)
        free(ps[i]);
    free(ps);
}

static void roundtrip(const char *name, DType dt, size_t shard_bytes) {
    ModelSpec s;
    load_spec(&s, name);
    HfKeyTable t;
    hf_keys_build(&t, &s);
    float **ps = make_params(&t, 11);
    char *dir = fs_join(g_dir, name);
    Err err;
    assert_int_equal(fs_mkdirs(dir, &err), 0);
    StWriter w;
    st_writer_init(&w);
    hf_keys_add_to_writer(&w, &t, (const float *const *)ps, dt);
    assert_int_equal(st_write_hf_shards(&w, dir, shard_bytes, &err), 0);
    st_writer_free(&w);
    StSet set;
    assert_int_equal(st_set_open(&set, dir, &err), 0);
    assert_true(shard_bytes > 100000 ? set.nfiles == 1 : set.nfiles > 1);
    HfCheck c;
    assert_int_equal(hf_keys_check(&c, &t, &set), 0);
    hf_check_free(&c);
    for (int i = 0; i < t.nparams; i++) {
        const ParamInfo *q = &t.params[i];
        float *got = xmalloc((size_t)q->numel * sizeof(float));
        float *want = xmalloc((size_t)q->numel * sizeof(float));
        unsigned char *tmp = xmalloc((size_t)q->numel * 4);
        dtype_from_f32(tmp, ps[i], dt, (size_t)q->numel);
        dtype_to_f32(want, tmp, dt, (size_t)q->numel);
        assert_int_equal(hf_keys_load_param(got, &t, i, &set, &err), 0);
        assert_memory_equal(got, want, (size_t)q->numel * sizeof(float));
        /* In pieces (a bf16 base loads so): the same values; across experts when stacked. */
        int64_t lo = q->numel / 3, n = q->numel - lo - 1;
        if (n > 0) {
            memset(got, 0, (size_t)n * sizeof(float));
            assert_int_equal(hf_keys_load_param_range(got, &t, i, &set, lo, n, &err), 0);
            assert_memory_equal(got, want + lo, (size_t)n * sizeof(float));
        }
        free(got);
        free(want);
        free(tmp);
    }
    /* Expert e of a stacked parameter is HF's experts.{e} tensor. */
    if (s.num_experts > 0) {
        int layer = 0;
        while (!model_spec_layer_is_moe(&s, layer))
            layer++;
        char hn[HF_KEY_MAX], qn[HF_KEY_MAX];
        snprintf(hn, sizeof hn, "model.layers.%d.mlp.experts.2.down_proj.weight", layer);
        snprintf(qn, sizeof qn, "layers.%d.moe.experts.w2", layer);
        const StTensor *st = st_set_find(&set, hn);
        assert_non_null(st);
        int p = hf_keys_find_param(&t, qn);
        float v[16 * 12];
        st_to_f32(st, v);
        float want[16 * 12];
        unsigned char tmp[16 * 12 * 4];
        dtype_from_f32(tmp, ps[p] + 2 * 16 * 12, dt, 16 * 12);
        dtype_to_f32(want, tmp, dt, 16 * 12);
        assert_memory_equal(v, want, sizeof v);
    }
    st_set_close(&set);
    free_params(&t, ps);
    hf_keys_free(&t);
    free(dir);
}

static void test_roundtrip_dense_f32(void **state) {
    (void)state;
    roundtrip("dense_untied", DT_F32, 1u << 20);
}
static void test_roundtrip_moe_bf16_sharded(void **state) {
    (void)state;
    roundtrip("moe", DT_BF16, 2000);
}
static void test_roundtrip_tied_f16_sharded(void **state) {
    (void)state;
    roundtrip("moe_step2_tied", DT_F16, 3000);
}

static int has(char **list, int n, const char *needle) {
    for (int i = 0; i < n; i++)
        if (strstr(list[i], needle)) return 1;
    return 0;
}

static void test_check_reports(void **state) {
    (void)state;
    ModelSpec s;
    load_spec(&s, "dense_tied");
    HfKeyTable t;
    hf_keys_build(&t, &s);
    float **ps = make_params(&t, 3);
    StWriter w;
    st_writer_init(&w);
    /* Everything except model.norm.weight; q_proj of layer 1 misshaped; one extra key; a
     * tied lm_head.weight of the right shape (ignored); an integer-typed k_norm. */
    static int32_t ints[8];
    for (int i = 0; i < t.nhf; i++) {
        const HfTensor *h = &t.hf[i];
        if (strcmp(h->name, "model.norm.weight") == 0) continue;
        if (strcmp(h->name, "model.layers.1.self_attn.q_proj.weight") == 0) {
            int64_t bad[2] = {h->shape[1], h->shape[0]};
            st_writer_add_f32(&w, h->name, DT_F32, 2, bad, ps[h->param]);
            continue;
        }
        if (strcmp(h->name, "model.layers.0.self_attn.k_norm.weight") == 0) {
            st_writer_add(&w, h->name, DT_I32, 1, h->shape, ints);
            continue;
        }
        st_writer_add_f32(&w, h->name, DT_BF16, h->ndim, h->shape, ps[h->param]);
    }
    int64_t lm[2] = {40, 16}, ex[1] = {3};
    st_writer_add_f32(&w, "lm_head.weight", DT_F32, 2, lm, ps[0]);
    st_writer_add_f32(&w, "model.layers.0.self_attn.q_proj.bias", DT_F32, 1, ex, ps[0]);
    char *p = fs_join(g_dir, "check.safetensors");
    Err err;
    assert_int_equal(st_write_finish(&w, p, &err), 0);
    st_writer_free(&w);
    StSet set;
    assert_int_equal(st_set_open(&set, p, &err), 0);
    HfCheck c;
    assert_int_equal(hf_keys_check(&c, &t, &set), 4);
    assert_int_equal(c.nmissing, 1);
    assert_true(has(c.missing, c.nmissing, "model.norm.weight (expected [16])"));
    assert_int_equal(c.nunexpected, 1);
    assert_true(has(c.unexpected, c.nunexpected, "model.layers.0.self_attn.q_proj.bias [3]"));
    assert_int_equal(c.nwrong, 2);
    assert_true(has(c.wrong, c.nwrong,
                    "model.layers.1.self_attn.q_proj.weight: shape [16, 32], expected [32, 16]"));
    assert_true(has(c.wrong, c.nwrong, "k_norm.weight: dtype I32"));
    hf_check_free(&c);
    int q = hf_keys_find_param(&t, "layers.1.attention.wq.weight");
    float *buf = xmalloc((size_t)t.params[q].numel * sizeof(float));
    assert_int_equal(hf_keys_load_param(buf, &t, q, &set, &err), -1);
    assert_non_null(strstr(err.msg, "q_proj.weight\" has shape [16, 32], expected [32, 16]"));
    q = hf_keys_find_param(&t, "norm.weight");
    assert_int_equal(hf_keys_load_param(buf, &t, q, &set, &err), -1);
    assert_non_null(strstr(err.msg, "no tensor \"model.norm.weight\""));
    free(buf);
    st_set_close(&set);
    free(p);
    free_params(&t, ps);
    hf_keys_free(&t);
}

/* A NaN or an infinity in an HF file is refused at load, naming the HF tensor and the element
 * (counted within that tensor, so within one expert's slice of a stacked parameter): trained
 * from, it would make the first loss NaN and the run would blame the learning rate. The check
 * is the conversion's own (dtype_convert), so it is tried for files of every float dtype and
 * for loads into fp32 and into bf16 (weights held in bf16 only). */
static void refuse_nonfinite(DType dt) {
    ModelSpec s;
    load_spec(&s, "moe");
    HfKeyTable t;
    hf_keys_build(&t, &s);
    float **ps = make_params(&t, 5);
    int layer = 0;
    while (!model_spec_layer_is_moe(&s, layer))
        layer++;
    char qn[HF_KEY_MAX], want[256];
    snprintf(qn, sizeof qn, "layers.%d.moe.experts.w2", layer);
    int w2 = hf_keys_find_param(&t, qn), norm = hf_keys_find_param(&t, "norm.weight");
    ps[w2][2 * 16 * 12 + 7] = NAN; /* expert 2, element 7 */
    ps[w2][3 * 16 * 12 + 1] = INFINITY;
    ps[norm][3] = -INFINITY;
    ps[norm][5] = NAN;
    char name[64];
    snprintf(name, sizeof name, "nonfinite_%s", dtype_name(dt));
    char *dir = fs_join(g_dir, name);
    Err err;
    assert_int_equal(fs_mkdirs(dir, &err), 0);
    StWriter w;
    st_writer_init(&w);
    hf_keys_add_to_writer(&w, &t, (const float *const *)ps, dt);
    assert_int_equal(st_write_hf_shards(&w, dir, 1u << 20, &err), 0);
    st_writer_free(&w);
    StSet set;
    assert_int_equal(st_set_open(&set, dir, &err), 0);
    float *buf = xmalloc((size_t)t.params[w2].numel * sizeof(float));
    snprintf(want, sizeof want,
             "HF tensor \"model.layers.%d.mlp.experts.2.down_proj.weight\" holds a NaN at "
             "element 7; weights must be finite",
             layer);
    const char *want_norm =
        "HF tensor \"model.norm.weight\" holds an infinity at element 3; weights must be finite";
    assert_int_equal(hf_keys_load_param(buf, &t, w2, &set, &err), -1);
    assert_string_equal(err.msg, want);
    assert_int_equal(hf_keys_load_param(buf, &t, norm, &set, &err), -1);
    assert_string_equal(err.msg, want_norm);
    assert_int_equal(hf_keys_load_param_bf16((uint16_t *)buf, &t, w2, &set, &err), -1);
    assert_string_equal(err.msg, want);
    assert_int_equal(hf_keys_load_param_bf16((uint16_t *)buf, &t, norm, &set, &err), -1);
    assert_string_equal(err.msg, want_norm);
    /* Experts 0 and 1 are finite: a range of them alone loads. */
    assert_int_equal(hf_keys_load_param_range(buf, &t, w2, &set, 0, 2 * 16 * 12, &err), 0);
    free(buf);
    st_set_close(&set);
    free_params(&t, ps);
    hf_keys_free(&t);
    free(dir);
}

static void test_load_refuses_nonfinite(void **state) {
    (void)state;
    refuse_nonfinite(DT_BF16);
    refuse_nonfinite(DT_F16);
    refuse_nonfinite(DT_F32);
}

/* Loads a directory transformers wrote (tests/fixtures/hf_tiny) through the shard index and
 * checks each HF tensor's slice of the loaded parameters against its first value and sum as
 * read by the Python safetensors package. */
static void load_transformers_dir(const char *name) {
    const char *src = getenv("QT_SOURCE_DIR");
    char dir[1024], sums[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/hf_tiny/%s", src ? src : ".", name);
    snprintf(sums, sizeof sums, "%s.sums", dir);
    char *cfg = fs_join(dir, "config.json");
    ModelSpec s;
    Err err;
    if (model_spec_from_hf_config(&s, cfg, &err) != 0) fail_msg("%s", err.msg);
    free(cfg);
    HfKeyTable t;
    hf_keys_build(&t, &s);
    StSet set;
    if (st_set_open(&set, dir, &err) != 0) fail_msg("%s", err.msg);
    HfCheck c;
    assert_int_equal(hf_keys_check(&c, &t, &set), 0);
    hf_check_free(&c);
    float **ps = xmalloc((size_t)t.nparams * sizeof *ps);
    for (int i = 0; i < t.nparams; i++) {
        ps[i] = xmalloc((size_t)t.params[i].numel * sizeof(float));
        if (hf_keys_load_param(ps[i], &t, i, &set, &err) != 0) fail_msg("%s", err.msg);
    }
    char *text;
    size_t len;
    assert_int_equal(fs_read_all(sums, &text, &len, &err), 0);
    int lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *s2 = NULL, *key = strtok_r(line, " ", &s2);
        double first = strtod(strtok_r(NULL, " ", &s2), NULL);
        double sum = strtod(strtok_r(NULL, " ", &s2), NULL);
        int h = hf_keys_find_hf(&t, key);
        if (h < 0) fail_msg("%s: %s is not in the key table", name, key);
        const HfTensor *ht = &t.hf[h];
        const float *v = ps[ht->param] + (ht->expert < 0 ? 0 : ht->expert * ht->numel);
        /* bf16 values have 8 significant bits, so a float64 sum is exact in any order. */
        double got = 0;
        for (int64_t i = 0; i < ht->numel; i++)
            got += v[i];
        if ((double)v[0] != first || got != sum)
            fail_msg("%s: %s first %a sum %a, Python read %a and %a", name, key, (double)v[0], got,
                     first, sum);
        lines++;
    }
    assert_int_equal(lines, t.nhf);
    free(text);
    for (int i = 0; i < t.nparams; i++)
        free(ps[i]);
    free(ps);
    st_set_close(&set);
    hf_keys_free(&t);
}

static void test_load_transformers_dense_tied(void **state) {
    (void)state;
    load_transformers_dir("dense_tied");
}
static void test_load_transformers_moe_sharded(void **state) {
    (void)state;
    load_transformers_dir("moe_sharded");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_dense_tied),
        cmocka_unit_test(test_keys_dense_untied),
        cmocka_unit_test(test_keys_moe),
        cmocka_unit_test(test_keys_moe_step2_tied),
        cmocka_unit_test(test_param_table),
        cmocka_unit_test(test_roundtrip_dense_f32),
        cmocka_unit_test(test_roundtrip_moe_bf16_sharded),
        cmocka_unit_test(test_roundtrip_tied_f16_sharded),
        cmocka_unit_test(test_check_reports),
        cmocka_unit_test(test_load_refuses_nonfinite),
        cmocka_unit_test(test_load_transformers_dense_tied),
        cmocka_unit_test(test_load_transformers_moe_sharded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
