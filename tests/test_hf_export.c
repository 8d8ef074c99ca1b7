/* HF export of training checkpoints (train_hf_export_checkpoint, which `qtitan export` and
 * checkpoint.last_save_in_hf share): a checkpoint saved with its config.json and tokenizer file
 * is exported, re-read with the safetensors reader and compared with the checkpoint's tensors
 * bit for bit in fp32 (rounded as torch rounds in bf16 / fp16); the file set is exactly what
 * transformers expects (lm_head.weight absent when tied, MoE expert_bias never written, an
 * index when sharded), config.json reads back to the same spec, the tokenizer is copied. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/hf_keys.h"
#include "train/checkpoint.h"
#include "train/train_hf.h"

static char g_dir[64];

static const char TOKENIZER[] = "{\"model\": {\"type\": \"BPE\"}, \"note\": \"a stand-in\"}\n";

typedef struct Ckpt {
    ModelSpec spec;
    HfKeyTable t;
    CkptTensor *tensors;
    float **data;
    char *step_dir;
} Ckpt;

/* Saves a checkpoint of random parameters for the fixture's spec (lbc > 0 adds expert_bias). */
static void make_ckpt(Ckpt *c, const char *fixture, double lbc, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/hf_keys/%s.config.json", getenv("QT_SOURCE_DIR"),
             fixture);
    Err err;
    if (model_spec_from_hf_config(&c->spec, path, &err) != 0) fail_msg("%s", err.msg);
    c->spec.load_balance_coeff = lbc;
    hf_keys_build(&c->t, &c->spec);
    c->tensors = calloc((size_t)c->t.nparams, sizeof *c->tensors);
    c->data = calloc((size_t)c->t.nparams, sizeof *c->data);
    Rng r;
    rng_seed(&r, 3, 0);
    for (int i = 0; i < c->t.nparams; i++) {
        const ParamInfo *q = &c->t.params[i];
        c->data[i] = malloc((size_t)q->numel * sizeof(float));
        rng_fill_normal(&r, c->data[i], (size_t)q->numel, 1.0f);
        c->tensors[i] = (CkptTensor){q->name, q->ndim, {0}, c->data[i], NULL};
        memcpy(c->tensors[i].shape, q->shape, sizeof q->shape);
    }
    size_t len;
    char *cfg = model_spec_hf_config_text(&c->spec, NULL, "float32", &len, &err);
    assert_non_null(cfg);
    CkptFile files[2] = {{"config.json", cfg, len},
                         {"tokenizer.json", TOKENIZER, sizeof TOKENIZER - 1}};
    CkptState st = {.step = 7, .files = files, .nfiles = 2};
    char *root = fs_join(g_dir, name);
    if (ckpt_save(root, &st, c->tensors, c->t.nparams, NULL, 0, 0, &err) != 0)
        fail_msg("%s", err.msg);
    c->step_dir = fs_join(root, "step-7");
    free(root);
    free(cfg);
}

static void free_ckpt(Ckpt *c) {
    for (int i = 0; i < c->t.nparams; i++)
        free(c->data[i]);
    free(c->data);
    free(c->tensors);
    free(c->step_dir);
    hf_keys_free(&c->t);
}

/* Exports c as dt and checks everything the file comment lists. */
static void check_export(const Ckpt *c, DType dt, size_t shard, int sharded) {
    char name[64];
    snprintf(name, sizeof name, "export-%s-%d-%zu", dtype_name(dt), c->spec.num_experts, shard);
    char *out = fs_join(g_dir, name);
    HfExportOptions o = {.dtype = dt, .max_shard_bytes = shard};
    Err err;
    if (train_hf_export_checkpoint(c->step_dir, out, &o, &err) != 0) fail_msg("%s", err.msg);
    StSet set;
    if (st_set_open(&set, out, &err) != 0) fail_msg("%s", err.msg);
    /* sharded: one file per few tensors, listed in the index */
    assert_true(sharded ? set.nfiles > 1 : set.nfiles == 1);
    char *index = fs_join(out, "model.safetensors.index.json");
    assert_int_equal(fs_exists(index), sharded);
    free(index);
    HfCheck chk;
    int problems = hf_keys_check(&chk, &c->t, &set);
    for (int i = 0; i < chk.nunexpected; i++)
        printf("unexpected %s\n", chk.unexpected[i]);
    assert_int_equal(problems, 0);
    hf_check_free(&chk);
    int ntensors = 0;
    for (int f = 0; f < set.nfiles; f++) {
        ntensors += set.files[f].n;
        for (int i = 0; i < set.files[f].n; i++) {
            assert_null(strstr(set.files[f].tensors[i].name, "expert_bias"));
            assert_int_equal(set.files[f].tensors[i].dtype, dt);
        }
    }
    assert_int_equal(ntensors, c->t.nhf);
    assert_int_equal(st_set_find(&set, "lm_head.weight") == NULL, c->spec.tie_embeddings);
    for (int i = 0; i < c->t.nparams; i++) {
        const ParamInfo *q = &c->t.params[i];
        if (!q->kind->hf) continue;
        size_t n = (size_t)q->numel;
        float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        unsigned char *tmp = malloc(n * 4);
        dtype_from_f32(tmp, c->data[i], dt, n);
        dtype_to_f32(want, tmp, dt, n);
        assert_int_equal(hf_keys_load_param(got, &c->t, i, &set, &err), 0);
        assert_memory_equal(got, want, n * sizeof(float));
        if (dt == DT_F32) assert_memory_equal(got, c->data[i], n * sizeof(float));
        free(got);
        free(want);
        free(tmp);
    }
    st_set_close(&set);
    ModelSpec back;
    char *cfg = fs_join(out, "config.json");
    if (model_spec_from_hf_config(&back, cfg, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(back.n_layers, c->spec.n_layers);
    assert_int_equal(back.dim, c->spec.dim);
    assert_int_equal(back.num_experts, c->spec.num_experts);
    assert_int_equal(back.tie_embeddings, c->spec.tie_embeddings);
    char *text;
    size_t len;
    assert_int_equal(fs_read_all(cfg, &text, &len, &err), 0);
    assert_non_null(strstr(text, dt == DT_F32    ? "\"torch_dtype\": \"float32\""
                                 : dt == DT_BF16 ? "\"torch_dtype\": \"bfloat16\""
                                                 : "\"torch_dtype\": \"float16\""));
    free(text);
    free(cfg);
    char *tokp = fs_join(out, "tokenizer.json");
    assert_int_equal(fs_read_all(tokp, &text, &len, &err), 0);
    assert_string_equal(text, TOKENIZER);
    free(text);
    free(tokp);
    free(out);
}

static void test_dense_tied(void **state) {
    (void)state;
    Ckpt c;
    make_ckpt(&c, "dense_tied", 0, "dense_tied");
    assert_true(c.spec.tie_embeddings);
    check_export(&c, DT_F32, 0, 0);
    check_export(&c, DT_BF16, 0, 0);
    check_export(&c, DT_F32, 4000, 1);
    free_ckpt(&c);
}

static void test_dense_untied(void **state) {
    (void)state;
    Ckpt c;
    make_ckpt(&c, "dense_untied", 0, "dense_untied");
    check_export(&c, DT_F16, 0, 0);
    free_ckpt(&c);
}

static void test_moe_with_expert_bias(void **state) {
    (void)state;
    Ckpt c;
    make_ckpt(&c, "moe", 1e-3, "moe");
    assert_true(hf_keys_find_param(&c.t, "layers.0.moe.expert_bias") >= 0);
    check_export(&c, DT_F32, 0, 0);
    free_ckpt(&c);
}

/* Values an export cannot carry are refused by name: beyond float16's range (torch's .half()
 * would write an infinity) and, in any dtype, a NaN. bfloat16 takes the large value. */
static void test_values_out_of_range(void **state) {
    (void)state;
    Ckpt c;
    make_ckpt(&c, "dense_untied", 0, "range");
    HfExportTensor *ts = calloc((size_t)c.t.nparams, sizeof *ts);
    for (int i = 0; i < c.t.nparams; i++)
        ts[i] = (HfExportTensor){
            .name = c.t.params[i].name, .numel = c.t.params[i].numel, .data = c.data[i]};
    int w1 = hf_keys_find_param(&c.t, "layers.1.feed_forward.w1.weight");
    char *out = fs_join(g_dir, "range_out");
    Err err;
    c.data[w1][5] = 65519.0f; /* still rounds to 65504 */
    HfExportOptions o = {.dtype = DT_F16};
    if (hf_export(out, &c.spec, ts, c.t.nparams, &o, &err) != 0) fail_msg("%s", err.msg);
    c.data[w1][5] = -65520.0f;
    assert_int_equal(hf_export(out, &c.spec, ts, c.t.nparams, &o, &err), -1);
    assert_non_null(strstr(err.msg, "tensor layers.1.feed_forward.w1.weight "
                                    "(model.layers.1.mlp.gate_proj.weight) holds -65520 at "
                                    "element 5, beyond float16's range (65504); export as "
                                    "bfloat16 or float32"));
    o.dtype = DT_BF16;
    if (hf_export(out, &c.spec, ts, c.t.nparams, &o, &err) != 0) fail_msg("%s", err.msg);
    c.data[w1][5] = NAN;
    assert_int_equal(hf_export(out, &c.spec, ts, c.t.nparams, &o, &err), -1);
    assert_non_null(strstr(err.msg, "w1.weight (model.layers.1.mlp.gate_proj.weight) holds a NaN "
                                    "at element 5; weights must be finite"));
    free(out);
    free(ts);
    free_ckpt(&c);
    /* A stacked expert parameter names the expert the value is in, as the files do. */
    make_ckpt(&c, "moe", 1e-3, "range_moe");
    ts = calloc((size_t)c.t.nparams, sizeof *ts);
    for (int i = 0; i < c.t.nparams; i++)
        ts[i] = (HfExportTensor){
            .name = c.t.params[i].name, .numel = c.t.params[i].numel, .data = c.data[i]};
    int x = hf_keys_find_param(&c.t, "layers.0.moe.experts.w2");
    assert_true(x >= 0);
    int64_t per = c.t.params[x].numel / c.spec.num_experts;
    c.data[x][2 * per + 1] = INFINITY;
    out = fs_join(g_dir, "range_moe_out");
    assert_int_equal(hf_export(out, &c.spec, ts, c.t.nparams, &o, &err), -1);
    assert_non_null(strstr(err.msg, "(model.layers.0.mlp.experts.2.down_proj.weight) holds an "
                                    "infinity"));
    free(out);
    free(ts);
    free_ckpt(&c);
}

static void test_errors(void **state) {
    (void)state;
    Ckpt c;
    make_ckpt(&c, "dense_tied", 0, "errors");
    Err err;
    HfExportOptions o = {.dtype = DT_F32};
    /* An output folder that holds something else is not replaced. */
    char *out = fs_join(g_dir, "not_hf");
    assert_int_equal(fs_mkdirs(out, &err), 0);
    char *keep = fs_join(out, "notes.txt");
    assert_int_equal(fs_write_atomic(keep, "x", 1, &err), 0);
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, out, &o, &err), -1);
    assert_non_null(strstr(err.msg, "notes.txt, which an export does not write"));
    assert_true(fs_exists(keep));
    /* An earlier export is replaced as a whole (through "DIR/" as well as "DIR")... */
    char *hf = fs_join(g_dir, "hf_again"), *hf_slash = fs_join(hf, "");
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, hf, &o, &err), 0);
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, hf_slash, &o, &err), 0);
    assert_true(fs_exists_in(hf, "config.json"));
    /* ...but not once it holds anything else too (a README, .git): config.json is no licence
     * to delete the rest. */
    char *readme = fs_join(hf, "README.md");
    assert_int_equal(fs_write_atomic(readme, "x", 1, &err), 0);
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, hf, &o, &err), -1);
    assert_non_null(strstr(err.msg, "README.md"));
    assert_true(fs_exists(readme));
    free(readme);
    free(hf_slash);
    /* A checkpoint also holds a config.json but is never replaced: not the step being
     * exported (which was replaced, optimizer state and all), nor a sharded checkpoint
     * folder. */
    char *train_state = fs_join(c.step_dir, "train_state.json");
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, c.step_dir, &o, &err), -1);
    assert_non_null(strstr(err.msg, "is a training checkpoint (it holds train_state.json)"));
    assert_true(fs_exists(train_state));
    char *latest = fs_join(hf, "latest.json");
    assert_int_equal(fs_write_atomic(latest, "{}", 2, &err), 0);
    assert_int_equal(hf_export_check_not_checkpoint(hf, &err), -1);
    assert_non_null(strstr(err.msg, "(it holds latest.json)"));
    assert_int_equal(unlink(latest), 0);
    free(latest);
    free(train_state);
    /* A corrupted checkpoint is refused (the export verifies checksums). */
    char *model = fs_join(c.step_dir, "model.safetensors");
    FILE *f = fopen(model, "r+b");
    assert_non_null(f);
    fseek(f, -4, SEEK_END);
    fputc(0x5a, f);
    fclose(f);
    assert_int_equal(train_hf_export_checkpoint(c.step_dir, hf, &o, &err), -1);
    assert_non_null(strstr(err.msg, "corrupted"));
    free(model);
    free(hf);
    free(keep);
    free(out);
    free_ckpt(&c);
    size_t n;
    assert_int_equal(hf_parse_size("5GB", &n, &err), 0);
    assert_true(n == 5000000000u);
    assert_int_equal(hf_parse_size("2MiB", &n, &err), 0);
    assert_true(n == 2097152u);
    assert_int_equal(hf_parse_size("100", &n, &err), 0);
    assert_true(n == 100u);
    assert_int_equal(hf_parse_size("5 parsecs", &n, &err), -1);
    assert_int_equal(hf_parse_size("-3GB", &n, &err), -1);
}

int main(void) {
    if (!getenv("QT_SOURCE_DIR")) return 77;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_hf_export_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_tied),
        cmocka_unit_test(test_dense_untied),
        cmocka_unit_test(test_moe_with_expert_bias),
        cmocka_unit_test(test_values_out_of_range),
        cmocka_unit_test(test_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    Err err;
    fs_remove_tree(g_dir, &err);
    return rc;
}
