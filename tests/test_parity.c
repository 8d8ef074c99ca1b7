/* Parity with Hugging Face transformers' Qwen3ForCausalLM in fp32: for every fixture under
 * tests/fixtures/parity/ (made by tools/make_parity_fixtures.py), load the checkpoint, run
 * forward and backward on its token lines, and compare logits, loss and every parameter
 * gradient with the values HF computed. Lines of equal length run as one batch; every
 * fixture also runs with all lines packed into one row (document mask, positions restarting
 * at 0), which must match HF running the lines separately. The measured errors are printed.
 * `qtitan eval --dump-logits` (QT_BINARY) on each fixture writes HF's logits too. */
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
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "io/token_lines.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "parity_util.h"

#define TOL_LOGITS 1e-4 /* max abs diff / max |logit| */
#define TOL_LOSS 1e-5   /* relative */
#define TOL_GRAD 1e-4   /* relative L2 per tensor */

/* Reads config.json here rather than through io/hf_config, so the test does not trust the
 * code under test for the architecture. */
static void read_spec(ModelSpec *s, const char *dir) {
    char *path = fs_join(dir, "config.json");
    Err err;
    json_t *j = json_load_path(path, &err);
    assert_non_null(j);
    memset(s, 0, sizeof *s);
    int64_t v;
    assert_int_equal(json_req_int(j, "hidden_size", &v, path, &err), 0), s->dim = (int)v;
    assert_int_equal(json_req_int(j, "num_hidden_layers", &v, path, &err), 0);
    s->n_layers = (int)v;
    assert_int_equal(json_req_int(j, "num_attention_heads", &v, path, &err), 0);
    s->n_heads = (int)v;
    assert_int_equal(json_req_int(j, "num_key_value_heads", &v, path, &err), 0);
    s->n_kv_heads = (int)v;
    assert_int_equal(json_req_int(j, "head_dim", &v, path, &err), 0), s->head_dim = (int)v;
    assert_int_equal(json_req_int(j, "intermediate_size", &v, path, &err), 0);
    s->hidden_dim = (int)v;
    assert_int_equal(json_req_int(j, "vocab_size", &v, path, &err), 0), s->vocab_size = (int)v;
    assert_int_equal(json_req_num(j, "rms_norm_eps", &s->norm_eps, path, &err), 0);
    assert_int_equal(json_opt_bool(j, "tie_word_embeddings", &s->tie_embeddings, path, &err), 0);
    json_t *rp = json_object_get(j, "rope_parameters");
    s->rope_theta = 0;
    if (rp)
        assert_int_equal(json_req_num(rp, "rope_theta", &s->rope_theta, path, &err), 0);
    else
        assert_int_equal(json_req_num(j, "rope_theta", &s->rope_theta, path, &err), 0);
    const char *type = "default";
    if (rp) assert_int_equal(json_opt_str(rp, "rope_type", &type, path, &err), 0);
    if (strcmp(type, "yarn") == 0) { /* transformers' defaults for what the file leaves out */
        RopeScaling *r = &s->rope_scaling;
        *r = (RopeScaling){.type = ROPE_YARN, .beta_fast = 32, .beta_slow = 1, .truncate = 1};
        assert_int_equal(json_req_num(rp, "factor", &r->factor, path, &err), 0);
        assert_int_equal(json_req_int(rp, "original_max_position_embeddings", &v, path, &err), 0);
        r->original_max_seq_len = (int)v;
    } else {
        assert_string_equal(type, "default");
    }
    json_decref(j);
    free(path);
}

/* Forward + backward of all lines, batched (packed = 0, equal lengths) or packed in one row;
 * compares with expected. */
static Errs run_case(Qwen3 *m, const TokenLines *tl, const StFile *exp, int packed) {
    Errs e = parity_forward(m, tl, exp, packed);
    qwen3_backward(m, 0);
    HfKeyTable keys;
    hf_keys_build(&keys, &m->spec);
    for (int i = 0; i < m->nparams; i++) {
        const Qwen3Param *p = &m->table[i];
        const char *hf = NULL;
        int k = hf_keys_find_param(&keys, p->name);
        for (int h = 0; h < keys.nhf && !hf; h++)
            if (keys.hf[h].param == k) hf = keys.hf[h].name;
        assert_non_null(hf);
        const StTensor *t = st_find(exp, hf);
        assert_non_null(t);
        assert_true(t->numel == p->numel);
        float *ref = malloc((size_t)t->numel * sizeof(float));
        st_to_f32(t, ref);
        parity_grad(&e, p, ref);
        free(ref);
    }
    hf_keys_free(&keys);
    return e;
}

static void test_parity(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    char root[4096];
    snprintf(root, sizeof root, "%s/tests/fixtures/parity", src ? src : ".");
    struct dirent **names;
    int n = scandir(root, &names, NULL, alphasort);
    assert_true(n > 0);
    int checked = 0;
    for (int f = 0; f < n; f++) {
        if (names[f]->d_name[0] == '.') {
            free(names[f]);
            continue;
        }
        char fixture[256];
        snprintf(fixture, sizeof fixture, "%s", names[f]->d_name);
        char *dir = fs_join(root, fixture);
        free(names[f]);
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
        /* Activation checkpointing must not change a bit; it runs packed only. */
        const AcMode acs[] = {AC_NONE, AC_FULL, AC_SELECTIVE, ac_every(2)};
        for (int ai = 0; ai < 4; ai++) {
            AcMode ac = acs[ai];
            Qwen3 m;
            assert_int_equal(qwen3_create(&m, &s, tl.n, (int)tl.total, ac, &err), 0);
            if (qwen3_load_hf(&m, &set, dir, &err)) fail_msg("%s", err.msg);
            for (int packed = equal && ac == AC_NONE ? 0 : 1; packed <= 1; packed++) {
                Errs e = run_case(&m, &tl, &exp, packed);
                printf("%-20s %-7s %-7s logits %.2e  loss %.2e  grad %.2e (worst %s)\n", fixture,
                       packed ? "packed" : "batched",
                       ac == AC_FULL        ? "ac=full"
                       : ac == AC_SELECTIVE ? "ac=sel"
                       : ac == AC_NONE      ? "ac=none"
                                            : "ac=2",
                       e.logits, e.loss, e.grad, e.worst_grad);
                assert_true(e.logits <= TOL_LOGITS);
                assert_true(e.loss <= TOL_LOSS);
                assert_true(e.grad <= TOL_GRAD);
            }
            qwen3_free(&m);
        }
        checked++;
        st_close(&exp);
        st_set_close(&set);
        token_lines_free(&tl);
        free(tokens), free(expected), free(dir);
    }
    free(names);
    assert_true(checked >= 6);
}

/* Max abs difference / max |logit| between the logits.L tensors of two files, over every line;
 * a NaN or a missing or misshaped tensor gives NaN. */
static double logits_err(const StFile *got, const StFile *want, int lines) {
    double worst = 0;
    for (int l = 0; l < lines; l++) {
        char name[32];
        snprintf(name, sizeof name, "logits.%d", l);
        const StTensor *g = st_find(got, name), *w = st_find(want, name);
        assert_non_null(w);
        if (!g || g->numel != w->numel) return NAN;
        float *a = malloc((size_t)g->numel * sizeof(float)),
              *b = malloc((size_t)w->numel * sizeof(float));
        st_to_f32(g, a);
        st_to_f32(w, b);
        double r = rel_err(a, b, w->numel);
        if (isnan(r) || r > worst) worst = r;
        free(a), free(b);
    }
    return worst;
}

static void test_eval_dump_logits(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR"), *bin = getenv("QT_BINARY");
    assert_non_null(src);
    assert_non_null(bin);
    char root[4096], tmp[] = "/tmp/qt_parity_dump_XXXXXX";
    snprintf(root, sizeof root, "%s/tests/fixtures/parity", src);
    assert_non_null(mkdtemp(tmp));
    struct dirent **names;
    int n = scandir(root, &names, NULL, alphasort), checked = 0;
    assert_true(n > 0);
    for (int f = 0; f < n; f++) {
        if (names[f]->d_name[0] != '.') {
            char *dir = fs_join(root, names[f]->d_name), *out = fs_join(tmp, "logits.safetensors");
            char *want = fs_join(dir, "expected.safetensors"), cmd[16384];
            snprintf(
                cmd, sizeof cmd,
                "'%s' eval --model '%s' --tokens '%s/tokens.txt' --dump-logits '%s' >/dev/null",
                bin, dir, dir, out);
            assert_int_equal(system(cmd), 0);
            Err err;
            StFile g, w;
            if (st_open(&g, out, &err) || st_open(&w, want, &err)) fail_msg("%s", err.msg);
            TokenLines tl;
            char *tokens = fs_join(dir, "tokens.txt");
            assert_int_equal(token_lines_read(&tl, tokens, 1 << 30, 1 << 20, &err), 0);
            double e = logits_err(&g, &w, tl.n);
            printf("%-20s qtitan eval --dump-logits: logits %.2e\n", names[f]->d_name, e);
            assert_true(e <= TOL_LOGITS);
            checked++;
            token_lines_free(&tl);
            st_close(&g), st_close(&w);
            unlink(out);
            free(dir), free(out), free(want), free(tokens);
        }
        free(names[f]);
    }
    free(names);
    rmdir(tmp);
    assert_true(checked >= 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parity),
                                       cmocka_unit_test(test_eval_dump_logits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
