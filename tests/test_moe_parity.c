/* Parity with Hugging Face transformers' Qwen3MoeForCausalLM in fp32: for every fixture under
 * tests/fixtures/moe_parity/ (made by tools/make_moe_parity_fixtures.py, which keeps router
 * top-k choices away from ties), load the checkpoint, run forward and backward on its token
 * lines, and compare logits, loss (with the router auxiliary loss where the fixture has it)
 * and every parameter gradient, router gate and experts included, with what HF computed.
 * Runs with both experts implementations (grouped, reference), batched and packed, and with
 * full and selective activation checkpointing. The measured errors are printed.
 *
 * HF keys: the product's loaders (train_qwen3_load_hf, qwen3_load_hf) must fill every
 * parameter exactly as this test's own stacking of the per-expert tensors does, and a sharded
 * export through io/hf_keys must hold exactly the fixture's keys and values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "io/token_lines.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "parity_util.h"
#include "train/train_qwen3.h"

#define TOL_LOGITS 1e-4 /* max abs diff / max |logit| */
#define TOL_LOSS 1e-5   /* relative */
#define TOL_GRAD 1e-4   /* relative L2 per tensor */

static int get_int(const json_t *j, const char *key, const char *path) {
    Err err;
    int64_t v;
    if (json_req_int(j, key, &v, path, &err)) fail_msg("%s", err.msg);
    return (int)v;
}

/* Reads config.json here rather than through io/hf_config, so the test does not trust the code
 * under test for the architecture. HF adds the auxiliary loss only with output_router_logits. */
static void read_spec(ModelSpec *s, const char *dir) {
    char *path = fs_join(dir, "config.json");
    Err err;
    json_t *j = json_load_path(path, &err);
    assert_non_null(j);
    memset(s, 0, sizeof *s);
    s->dim = get_int(j, "hidden_size", path);
    s->n_layers = get_int(j, "num_hidden_layers", path);
    s->n_heads = get_int(j, "num_attention_heads", path);
    s->n_kv_heads = get_int(j, "num_key_value_heads", path);
    s->head_dim = get_int(j, "head_dim", path);
    s->hidden_dim = get_int(j, "intermediate_size", path);
    s->vocab_size = get_int(j, "vocab_size", path);
    s->num_experts = json_object_get(j, "num_local_experts") ? get_int(j, "num_local_experts", path)
                                                             : get_int(j, "num_experts", path);
    s->top_k = get_int(j, "num_experts_per_tok", path);
    s->moe_hidden_dim = get_int(j, "moe_intermediate_size", path);
    s->decoder_sparse_step = get_int(j, "decoder_sparse_step", path);
    assert_int_equal(json_req_num(j, "rms_norm_eps", &s->norm_eps, path, &err), 0);
    assert_int_equal(json_opt_bool(j, "tie_word_embeddings", &s->tie_embeddings, path, &err), 0);
    assert_int_equal(json_opt_bool(j, "norm_topk_prob", &s->norm_topk_prob, path, &err), 0);
    int aux = 0;
    assert_int_equal(json_opt_bool(j, "output_router_logits", &aux, path, &err), 0);
    assert_int_equal(json_req_num(j, "router_aux_loss_coef", &s->router_aux_loss_coef, path, &err),
                     0);
    if (!aux) s->router_aux_loss_coef = 0;
    const json_t *mo = json_object_get(j, "mlp_only_layers");
    size_t i;
    json_t *v;
    json_array_foreach(mo, i, v) s->mlp_only_layers[json_integer_value(v)] = 1;
    json_t *rp = json_object_get(j, "rope_parameters");
    assert_non_null(rp);
    assert_int_equal(json_req_num(rp, "rope_theta", &s->rope_theta, path, &err), 0);
    json_decref(j);
    free(path);
}

/* HF key of qtitan parameter `name`; experts (stacked) get the key of expert e. Returns 0 for
 * parameters HF does not have (expert_bias). */
static int hf_key(char *out, size_t cap, const char *name, int e) {
    static const char *const map[][2] = {
        {"attention_norm.weight", "input_layernorm.weight"},
        {"attention.wq.weight", "self_attn.q_proj.weight"},
        {"attention.wk.weight", "self_attn.k_proj.weight"},
        {"attention.wv.weight", "self_attn.v_proj.weight"},
        {"attention.wo.weight", "self_attn.o_proj.weight"},
        {"attention.q_norm.weight", "self_attn.q_norm.weight"},
        {"attention.k_norm.weight", "self_attn.k_norm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
        {"feed_forward.w3.weight", "mlp.up_proj.weight"},
        {"feed_forward.w2.weight", "mlp.down_proj.weight"},
        {"moe.router.gate.weight", "mlp.gate.weight"},
        {"moe.experts.w1", "mlp.experts.%d.gate_proj.weight"},
        {"moe.experts.w3", "mlp.experts.%d.up_proj.weight"},
        {"moe.experts.w2", "mlp.experts.%d.down_proj.weight"},
    };
    if (strcmp(name, "tok_embeddings.weight") == 0)
        return snprintf(out, cap, "model.embed_tokens.weight"), 1;
    if (strcmp(name, "norm.weight") == 0) return snprintf(out, cap, "model.norm.weight"), 1;
    if (strcmp(name, "output.weight") == 0) return snprintf(out, cap, "lm_head.weight"), 1;
    int layer, off = 0;
    assert_int_equal(sscanf(name, "layers.%d.%n", &layer, &off), 1);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(name + off, map[i][0]) == 0) {
            char suffix[96];
            snprintf(suffix, sizeof suffix, map[i][1], e);
            snprintf(out, cap, "model.layers.%d.%s", layer, suffix);
            return 1;
        }
    assert_string_equal(name + off, "moe.expert_bias");
    return 0;
}

static int n_slices(const Qwen3Param *p) {
    return p->ndim == 3 ? (int)p->shape[0] : 1;
}

/* Copies tensor(s) `name` of the HF files into p (stacking experts); `grad` picks the
 * gradient buffer and the expected file. */
static void fill(float *dst, const Qwen3Param *p, const StSet *set, const StFile *f) {
    long per = p->numel / n_slices(p);
    for (int e = 0; e < n_slices(p); e++) {
        char key[160];
        assert_true(hf_key(key, sizeof key, p->name, e));
        const StTensor *t = set ? st_set_find(set, key) : st_find(f, key);
        if (!t) fail_msg("%s missing", key);
        assert_int_equal(t->numel, per);
        st_to_f32(t, dst + e * per);
    }
}

static void load(Qwen3 *m, const StSet *set) {
    for (int i = 0; i < m->nparams; i++)
        if (m->table[i].kind->role != ROLE_BUFFER) fill(m->table[i].data, &m->table[i], set, NULL);
}

static Errs run_case(Qwen3 *m, const TokenLines *tl, const StFile *exp, int packed) {
    Errs e = parity_forward(m, tl, exp, packed);
    qwen3_backward(m, 0);
    for (int i = 0; i < m->nparams; i++) {
        const Qwen3Param *p = &m->table[i];
        if (p->kind->role == ROLE_BUFFER) {
            for (long k = 0; k < p->numel; k++)
                assert_true(p->grad[k] == 0.0f);
            continue;
        }
        float *ref = malloc((size_t)p->numel * sizeof(float));
        fill(ref, p, NULL, exp);
        /* the fixtures route tokens to every expert */
        assert_true(parity_grad(&e, p, ref) > 0);
        free(ref);
    }
    return e;
}

/* Import with the product's loader and export sharded through io/hf_keys, against this test's
 * own mapping. m holds the fixture's weights loaded by load(). */
static void check_hf_io(const Qwen3 *m, const char *dir) {
    Err err;
    TrainQwen3 *q = train_qwen3_create(&m->spec, 1, 4, 0, NULL, NULL, 0, 0, &err);
    if (!q) fail_msg("%s", err.msg);
    if (train_qwen3_load_hf(q, dir, &err)) fail_msg("%s", err.msg);
    TrainModel tm;
    train_qwen3_model(q, &tm, 0);
    assert_int_equal(tm.nparams, m->nparams);
    for (int i = 0; i < m->nparams; i++) {
        assert_string_equal(tm.params[i].name, m->table[i].name);
        assert_memory_equal(tm.params[i].data, m->table[i].data,
                            (size_t)m->table[i].numel * sizeof(float));
        /* expert_bias is balancing state: never decayed */
        if (m->table[i].kind->role == ROLE_BUFFER) assert_int_equal(tm.decay[i], 0);
    }
    train_qwen3_free(q);
    /* The model's own loader (qtitan eval) too. */
    Qwen3 m2;
    if (qwen3_create(&m2, &m->spec, 1, 4, AC_NONE, &err)) fail_msg("%s", err.msg);
    StSet set;
    if (qwen3_hf_open(&set, dir, &err)) fail_msg("%s", err.msg);
    if (qwen3_load_hf(&m2, &set, dir, &err)) fail_msg("%s", err.msg);
    st_set_close(&set);
    for (int i = 0; i < m->nparams; i++)
        assert_memory_equal(m2.table[i].data, m->table[i].data,
                            (size_t)m->table[i].numel * sizeof(float));
    qwen3_free(&m2);

    HfKeyTable keys;
    hf_keys_build(&keys, &m->spec);
    assert_int_equal(keys.nparams, m->nparams);
    const float **params = calloc((size_t)keys.nparams, sizeof *params);
    for (int i = 0; i < keys.nparams; i++) {
        const Qwen3Param *p = qwen3_find_param(m, keys.params[i].name);
        assert_non_null(p);
        assert_int_equal(keys.params[i].numel, p->numel);
        assert_int_equal(keys.params[i].ndim, p->ndim);
        for (int d = 0; d < p->ndim; d++)
            assert_int_equal(keys.params[i].shape[d], p->shape[d]);
        assert_int_equal(keys.params[i].kind->id == PK_EXPERT_BIAS, p->kind->role == ROLE_BUFFER);
        params[i] = p->data;
    }
    char tmp[] = "/tmp/qt_moe_export_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    StWriter w;
    st_writer_init(&w);
    hf_keys_add_to_writer(&w, &keys, params, DT_F32);
    if (st_write_hf_shards(&w, tmp, 64 * 1024, &err)) fail_msg("%s", err.msg);
    st_writer_free(&w);
    StSet exported, orig;
    if (st_set_open(&exported, tmp, &err)) fail_msg("%s", err.msg);
    if (qwen3_hf_open(&orig, dir, &err)) fail_msg("%s", err.msg);
    assert_true(exported.nfiles > 1); /* sharded, with an index */
    HfCheck chk;
    assert_int_equal(hf_keys_check(&chk, &keys, &exported), 0);
    hf_check_free(&chk);
    int n_orig = 0, n_exp = 0;
    for (int f = 0; f < orig.nfiles; f++)
        for (int t = 0; t < orig.files[f].n; t++) {
            const StTensor *a = &orig.files[f].tensors[t], *b = st_set_find(&exported, a->name);
            if (m->spec.tie_embeddings && strcmp(a->name, "lm_head.weight") == 0) continue;
            if (a->is_scale) continue; /* an fp8 weight's scales: exported dequantized */
            if (!b) fail_msg("export lacks %s", a->name);
            if (a->scale) { /* fp8 block-quantized: the export holds its fp32 values */
                float *want = malloc((size_t)a->numel * sizeof *want);
                assert_int_equal(st_to_f32(a, want), -1);
                assert_int_equal(b->nbytes, (size_t)a->numel * sizeof *want);
                assert_memory_equal(want, b->data, b->nbytes);
                free(want);
            } else {
                assert_int_equal(a->nbytes, b->nbytes);
                assert_memory_equal(a->data, b->data, a->nbytes);
            }
            n_orig++;
        }
    for (int f = 0; f < exported.nfiles; f++)
        n_exp += exported.files[f].n;
    assert_int_equal(n_exp, n_orig); /* nothing extra: no expert_bias, no tied lm_head */
    st_set_close(&exported);
    st_set_close(&orig);
    fs_remove_tree(tmp, &err);
    free(params);
    hf_keys_free(&keys);
}

static void check_fixture(const char *root, const char *fixture) {
    char *dir = fs_join(root, fixture);
    ModelSpec s;
    read_spec(&s, dir);
    Err err;
    char *tokens = fs_join(dir, "tokens.txt"), *expected = fs_join(dir, "expected.safetensors");
    TokenLines tl;
    assert_int_equal(token_lines_read(&tl, tokens, s.vocab_size, 1 << 20, &err), 0);
    int equal = 1;
    for (int l = 1; l < tl.n; l++)
        equal &= tl.start[l + 1] - tl.start[l] == tl.start[1] - tl.start[0];
    StSet set;
    if (qwen3_hf_open(&set, dir, &err)) fail_msg("%s", err.msg);
    StFile exp;
    if (st_open(&exp, expected, &err)) fail_msg("%s", err.msg);
    /* (experts implementation, activation checkpointing, load_balance_coeff): the bias exists
     * but is zero in the last run, which must not change anything. */
    static const struct {
        const MoeExpertsOp *impl;
        AcMode ac;
        double lbc;
    } runs[] = {{&moe_experts_grouped, AC_NONE, 0},
                {&moe_experts_reference, AC_NONE, 0},
                {&moe_experts_grouped, AC_FULL, 1e-3},
                {&moe_experts_grouped, AC_SELECTIVE, 0}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        s.load_balance_coeff = runs[r].lbc;
        Qwen3 m;
        if (qwen3_create(&m, &s, tl.n, (int)tl.total, runs[r].ac, &err)) fail_msg("%s", err.msg);
        load(&m, &set);
        if (r == sizeof runs / sizeof runs[0] - 2) check_hf_io(&m, dir); /* has expert_bias */
        for (int i = 0; i < s.n_layers; i++)
            if (m.mod.layers[i].experts) m.mod.layers[i].experts = runs[r].impl;
        for (int packed = equal && r == 0 ? 0 : 1; packed <= 1; packed++) {
            Errs e = run_case(&m, &tl, &exp, packed);
            printf("%-20s %-9s %-7s %-7s logits %.2e  loss %.2e  grad %.2e (worst %s)\n", fixture,
                   runs[r].impl->h.name, packed ? "packed" : "batched",
                   runs[r].ac == AC_FULL ? "ac=full"
                   : runs[r].ac          ? "ac=sel"
                                         : "ac=none",
                   e.logits, e.loss, e.grad, e.worst_grad);
            assert_true(e.logits <= TOL_LOGITS);
            assert_true(e.loss <= TOL_LOSS);
            assert_true(e.grad <= TOL_GRAD);
        }
        qwen3_free(&m);
    }
    st_close(&exp);
    st_set_close(&set);
    token_lines_free(&tl);
    free(tokens), free(expected), free(dir);
}

static void test_moe_parity(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    char root[4096];
    snprintf(root, sizeof root, "%s/tests/fixtures/moe_parity", src ? src : ".");
    struct dirent **names;
    int n = scandir(root, &names, NULL, alphasort);
    assert_true(n > 0);
    int checked = 0;
    for (int f = 0; f < n; f++) {
        if (names[f]->d_name[0] != '.') {
            check_fixture(root, names[f]->d_name);
            checked++;
        }
        free(names[f]);
    }
    free(names);
    assert_true(checked >= 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_parity)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
