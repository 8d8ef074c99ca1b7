/* LoRA (model/lora.h) against HF peft (tests/fixtures/lora, tools/make_lora_fixture.py, on the
 * tiny Qwen3 of tests/fixtures/train_parity): the loss and every adapter gradient of one masked
 * batch, and five AdamW steps through trainer_run (clipping active, only the adapters
 * trained); a finite-difference check of the adapter backward; peft's file format written and
 * read back with peft's key names and shapes; merging, also of a bf16 base against peft's
 * merge_and_unload; the error sentences. */
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
#include "core/json.h"
#include "fd_util.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "train/train_qwen3.h"
#include "train/trainer.h"

enum { STEPS = 5, B = 2, T = 12, RANK = 4 };

#include "trainer_harness.h"

static char *fix_dir, *base_dir;
static ModelSpec spec;
static json_t *expected;
static char *const ALL[] = {"layers.*.attention.*", "layers.*.feed_forward.*"};

/* The tiny base model, frozen as LoRA training creates it (no gradient arena, so the
 * comparisons below also show that skipping the base's weight gradients leaves the adapters'
 * gradients as peft has them). */
static void setup_base(Qwen3 *m, const Qwen3Modules *impl, int base_bf16) {
    Err err;
    char *w = fs_join(base_dir, "model.safetensors");
    StSet set;
    if (qwen3_create_frozen_with(m, &spec, B, T, AC_NONE, impl, base_bf16, &err) ||
        st_set_open(&set, w, &err) || qwen3_load_hf(m, &set, w, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(m->grad_arena.capacity, 0);
    assert_null(m->g.tok_embeddings);
    assert_null(m->g.layers[1].w2);
    st_set_close(&set);
    free(w);
}

/* The base with adapters on every linear read from the peft fixture. */
static void setup_model_as(Qwen3 *m, Lora *lo, int load_adapters, const Qwen3Modules *impl,
                           int base_bf16) {
    Err err;
    setup_base(m, impl, base_bf16);
    if (lora_create(lo, &spec, RANK, 8.0, 0, ALL, 2, B * T, &(LoraWhere){"test", "test", "test"}, 1,
                    &err))
        fail_msg("%s", err.msg);
    assert_int_equal(lo->n, 2 * 7);
    if (load_adapters && lora_load_peft(lo, &spec, fix_dir, &err)) fail_msg("%s", err.msg);
    m->lora = lo;
}

static void setup_model(Qwen3 *m, Lora *lo, int load_adapters) {
    setup_model_as(m, lo, load_adapters, NULL, 0);
}

/* B rows of T tokens and targets from a JSON object {"tokens": [[...]], "targets": [[...]]}. */
static void read_batch(const json_t *b, int32_t *tok, int32_t *tgt) {
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            tok[r * T + t] = (int32_t)json_integer_value(
                json_array_get(json_array_get(json_object_get(b, "tokens"), r), t));
            tgt[r * T + t] = (int32_t)json_integer_value(
                json_array_get(json_array_get(json_object_get(b, "targets"), r), t));
        }
}

static void batch(int step, int32_t *tok, int32_t *tgt) {
    read_batch(json_array_get(json_object_get(expected, "batches"), (size_t)step), tok, tgt);
}

/* Largest |ours - want| over largest |want| of a tensor. */
static double rel_diff(const float *ours, const StTensor *t) {
    float *want = malloc((size_t)t->numel * sizeof *want);
    st_to_f32(t, want);
    double d = 0, w = 0;
    for (long k = 0; k < t->numel; k++) {
        double e = fabs((double)ours[k] - want[k]);
        if (isnan(e) || e > d) d = e;
        if (fabs(want[k]) > w) w = fabs(want[k]);
    }
    free(want);
    return d / w;
}

/* Every adapter gradient of lo equals peft's "grad.<key>" in dir/expected.safetensors. */
static void assert_grads_match(const Lora *lo, const char *dir) {
    char *p = fs_join(dir, "expected.safetensors");
    StFile f;
    Err err;
    if (st_open(&f, p, &err)) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < lo->n; i++)
        for (int w = 0; w < 2; w++) {
            char key[200], full[210];
            lora_peft_key(key, sizeof key, &spec, &lo->ad[i], w ? 'B' : 'A');
            snprintf(full, sizeof full, "grad.%s", key);
            const StTensor *t = st_find(&f, full);
            if (!t) fail_msg("no %s", full);
            double d = rel_diff(w ? lo->ad[i].db : lo->ad[i].da, t);
            if (isnan(d) || d > worst) worst = d;
        }
    printf("adapter gradients: largest difference / largest value %.3g\n", worst);
    assert_true(worst < 1e-4);
    st_close(&f);
    free(p);
}

static void test_loss_and_grads_match_peft(void **state) {
    (void)state;
    Qwen3 m;
    Lora lo;
    setup_model(&m, &lo, 1);
    int32_t tok[B * T], tgt[B * T];
    batch(0, tok, tgt);
    qwen3_zero_grads(&m);
    lora_zero_grads(&lo);
    float loss = qwen3_forward(&m, tok, tgt, NULL, NULL, B, T);
    qwen3_backward(&m, 0);
    double want = json_number_value(
        json_object_get(json_array_get(json_object_get(expected, "steps"), 0), "loss"));
    printf("loss %.7f, peft %.7f\n", loss, want);
    assert_true(fabs(loss - want) <= 1e-5 * want);
    assert_grads_match(&lo, fix_dir);
    lora_free(&lo);
    qwen3_free(&m);
}

/* sqrt(sum (a - b)^2 / sum b^2) */
static double rel_l2(const float *a, const float *b, long n) {
    double d = 0, w = 0;
    for (long k = 0; k < n; k++) {
        d += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
        w += (double)b[k] * b[k];
    }
    return sqrt(d / w);
}

/* lora.base_dtype = "bfloat16": the base's matmul weights and embedding only in bf16 (no fp32
 * copy), the same sizes qwen3_sizes tells the plan, under 55% of the fp32 base's bytes; the
 * loss and adapter gradients against the fp32 base within the mixed-precision bounds of
 * docs/training.md (loss 1%, each gradient 5% relative L2). */
static void test_bf16_base(void **state) {
    (void)state;
    Qwen3 m32, m16;
    Lora l32, l16;
    /* Training's kernels: the references have no bf16 path, which the model refuses. */
    Qwen3Modules *cpu = train_qwen3_modules(&spec, NULL, 0);
    Err err;
    assert_int_equal(qwen3_create_frozen_with(&m16, &spec, B, T, AC_NONE, NULL, 1, &err), -1);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "has no bf16 path"));
    setup_model_as(&m32, &l32, 1, cpu, 0);
    setup_model_as(&m16, &l16, 1, cpu, 1);
    Qwen3Sizes z;
    if (qwen3_sizes(&z, &spec, B, T, AC_NONE, 1, cpu, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m16.param_arena.capacity, z.base_bf16_param_bytes);
    assert_int_equal(m16.bf16_arena.capacity, z.base_bf16_bytes);
    assert_null(m16.p.layers[0].wq);
    assert_null(m16.p.tok_embeddings);
    assert_non_null(m16.p.layers[0].q_norm);
    const Qwen3Param *e = qwen3_find_param(&m16, "tok_embeddings.weight");
    assert_non_null(e);
    assert_ptr_equal(e->data_bf16, m16.pb.tok_embeddings);
    /* The weights' bytes (the bf16 arena less its matmul scratch) against the fp32 base. */
    size_t scratch =
        m16.bf16_arena.capacity - (size_t)((char *)m16.pb.scratch - (char *)m16.bf16_arena.base);
    double frac = (double)(m16.param_arena.capacity + m16.bf16_arena.capacity - scratch) /
                  (double)m32.param_arena.capacity;
    printf("bf16 base: %.3f of the fp32 base's bytes\n", frac);
    assert_true(frac < 0.55);
    int32_t tok[B * T], tgt[B * T];
    batch(0, tok, tgt);
    Qwen3 *ms[2] = {&m32, &m16};
    float loss[2];
    for (int k = 0; k < 2; k++) {
        lora_zero_grads(k ? &l16 : &l32);
        loss[k] = qwen3_forward(ms[k], tok, tgt, NULL, NULL, B, T);
        qwen3_backward(ms[k], 0);
    }
    double dl = fabs(loss[1] - loss[0]) / loss[0], worst = 0;
    for (int i = 0; i < l32.n; i++) {
        LoraAdapter *a = &l32.ad[i], *b = &l16.ad[i];
        double da = rel_l2(b->da, a->da, (long)RANK * a->in);
        double db = rel_l2(b->db, a->db, (long)a->out * RANK);
        if (!(da <= worst)) worst = da;
        if (!(db <= worst)) worst = db;
    }
    printf("bf16 base: loss %.7f vs fp32 %.7f (rel %.2g), worst adapter gradient rel L2 %.3g\n",
           loss[1], loss[0], dl, worst);
    assert_true(dl <= 0.01);
    assert_true(worst <= 0.05);
    lora_free(&l32);
    lora_free(&l16);
    qwen3_free(&m32);
    qwen3_free(&m16);
    free(cpu);
}

/* ---- five steps through trainer_run ---- */

static void test_five_steps_match_peft(void **state) {
    (void)state;
    Harness *r = calloc(1, sizeof *r);
    Lora lo;
    setup_model(&r->m, &lo, 1);
    for (int s = 0; s < STEPS; s++)
        batch(s, r->tok[s], r->tgt[s]);
    int n = 2 * lo.n;
    CkptTensor *params = calloc((size_t)n, sizeof *params);
    float **grads = calloc((size_t)n, sizeof *grads);
    char(*names)[200] = calloc((size_t)n, sizeof *names);
    for (int i = 0; i < lo.n; i++) {
        LoraAdapter *ad = &lo.ad[i];
        lora_peft_key(names[2 * i], 200, &spec, ad, 'A');
        lora_peft_key(names[2 * i + 1], 200, &spec, ad, 'B');
        params[2 * i] = (CkptTensor){names[2 * i], 2, {RANK, ad->in}, ad->a, NULL};
        params[2 * i + 1] = (CkptTensor){names[2 * i + 1], 2, {ad->out, RANK}, ad->b, NULL};
        grads[2 * i] = ad->da;
        grads[2 * i + 1] = ad->db;
    }
    harness_run(r, n, params, grads, 0.05);
    double worst_loss, worst_norm;
    harness_compare(r, json_object_get(expected, "steps"), "peft", &worst_loss, &worst_norm);
    char *p = fs_join(fix_dir, "expected.safetensors");
    StFile f;
    Err err;
    if (st_open(&f, p, &err)) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        char full[210];
        snprintf(full, sizeof full, "final.%s", names[i]);
        const StTensor *t = st_find(&f, full);
        if (!t) fail_msg("no %s", full);
        double d = rel_diff(params[i].data, t);
        if (isnan(d) || d > worst) worst = d;
    }
    printf("max relative difference: loss %.3g, grad_norm %.3g, final adapters %.3g\n", worst_loss,
           worst_norm, worst);
    assert_true(worst_loss < 1e-5);
    assert_true(worst_norm < 1e-5);
    assert_true(worst < 1e-4);
    st_close(&f);
    free(p);
    free(params);
    free(grads);
    free(names);
    lora_free(&lo);
    qwen3_free(&r->m);
    free(r);
}

typedef struct FdAdapter {
    const Lora *lo;
    LoraAdapter *ad;
    const float *x, *R;
    float *y;
    long N, O;
} FdAdapter;

static double fd_adapter_loss(void *ctx) {
    FdAdapter *c = ctx;
    memset(c->y, 0, (size_t)(c->N * c->O) * sizeof(float));
    lora_forward(c->lo, c->ad, c->y, c->x, c->N);
    return project(c->y, c->R, c->N * c->O);
}

/* Finite differences of the adapter alone: loss = sum(y * R) in double with
 * y = s (x A^T) B^T (the base linear's part has its own checks) is linear in each of x, A and
 * B, so central differences are exact up to rounding and every gradient entry is checked. */
static void test_finite_differences(void **state) {
    (void)state;
    enum { N = 5, I = 7, O = 6, R = 3 };
    rng_seed(&rng, 11, 0);
    ModelSpec tiny = spec;
    Lora lo;
    Err err;
    char *const q[] = {"layers.0.attention.wq"};
    assert_int_equal(
        lora_create(&lo, &tiny, R, 5.0, 0, q, 1, N, &(LoraWhere){"test", "test", "test"}, 1, &err),
        0);
    LoraAdapter ad = lo.ad[0]; /* same buffers, a smaller shape */
    ad.in = ad.in_l = I;
    ad.out = ad.out_l = O;
    float *x = randn(N * I, 1.0f), *Rp = randn(N * O, 1.0f), *y = zeros(N * O);
    float *dx = zeros(N * I);
    rng_fill_normal(&rng, ad.a, R * I, 0.5f);
    rng_fill_normal(&rng, ad.b, O * R, 0.5f);
    memset(ad.da, 0, R * I * sizeof(float));
    memset(ad.db, 0, O * R * sizeof(float));
    lora_forward(&lo, &ad, y, x, N);
    lora_backward(&lo, &ad, dx, Rp, x, N); /* dy = R */
    FdAdapter c = {&lo, &ad, x, Rp, y, N, O};
    /* Linear in each input: differences of 0.25 are exact up to rounding, every entry probed. */
    fd_check("adapter dx", x, N * I, dx, fd_adapter_loss, &c, 0.25f, N * I, 1e-4);
    fd_check("adapter dA", ad.a, R * I, ad.da, fd_adapter_loss, &c, 0.25f, R * I, 1e-4);
    fd_check("adapter dB", ad.b, O * R, ad.db, fd_adapter_loss, &c, 0.25f, O * R, 1e-4);
    free(x);
    free(Rp);
    free(y);
    free(dx);
    lora_free(&lo);
}

/* Written in peft's format: the same keys and shapes as peft's own file, read back equal; a
 * fresh adapter (B = 0) changes nothing; merging W + s B A gives the unmerged logits. */
static void test_peft_files_and_merge(void **state) {
    (void)state;
    Qwen3 m;
    Lora lo, back;
    setup_model(&m, &lo, 1);
    char tmpl[] = "/tmp/qt_lora_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    Err err;
    if (lora_save_peft(&lo, &spec, tmpl, "base", lo.param, &err)) fail_msg("%s", err.msg);
    StFile ours, theirs;
    char *a = fs_join(tmpl, "adapter_model.safetensors"),
         *b = fs_join(fix_dir, "adapter_model.safetensors");
    assert_int_equal(st_open(&ours, a, &err), 0);
    assert_int_equal(st_open(&theirs, b, &err), 0);
    assert_int_equal(ours.n, theirs.n);
    for (int i = 0; i < ours.n; i++) {
        assert_string_equal(ours.tensors[i].name, theirs.tensors[i].name);
        assert_int_equal(ours.tensors[i].ndim, 2);
        assert_memory_equal(ours.tensors[i].shape, theirs.tensors[i].shape, 2 * sizeof(int64_t));
    }
    st_close(&ours);
    st_close(&theirs);
    assert_int_equal(lora_create(&back, &spec, RANK, 8.0, 0, ALL, 2, B * T,
                                 &(LoraWhere){"test", "test", "test"}, 1, &err),
                     0);
    if (lora_load_peft(&back, &spec, tmpl, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < lo.n; i++) {
        assert_memory_equal(back.ad[i].a, lo.ad[i].a, (size_t)RANK * lo.ad[i].in * 4);
        assert_memory_equal(back.ad[i].b, lo.ad[i].b, (size_t)lo.ad[i].out * RANK * 4);
    }
    char *cfg_path = fs_join(tmpl, "adapter_config.json");
    json_t *cfg = json_load_path(cfg_path, &err);
    free(cfg_path);
    assert_non_null(cfg);
    assert_int_equal(json_array_size(json_object_get(cfg, "target_modules")), 7);
    json_decref(cfg);

    /* Merge: logits of W + s B A without adapters equal the adapted model's. */
    int32_t tok[B * T], tgt[B * T];
    batch(2, tok, tgt);
    long N = B * T, V = spec.vocab_size;
    qwen3_forward(&m, tok, NULL, NULL, NULL, B, T);
    float *want = malloc((size_t)(N * V) * sizeof *want);
    memcpy(want, m.a.logits, (size_t)(N * V) * sizeof *want);
    float *sites[7];
    for (int i = 0; i < lo.n; i++) {
        Qwen3LayerParams *p = &m.p.layers[lo.ad[i].layer];
        float *ws[7] = {p->wq, p->wk, p->wv, p->wo, p->w1, p->w3, p->w2};
        memcpy(sites, ws, sizeof ws);
        lora_merge(&lo, &lo.ad[i], lo.ad[i].a, lo.ad[i].b, sites[lo.ad[i].site], 0, lo.ad[i].out);
    }
    m.lora = NULL;
    qwen3_forward(&m, tok, NULL, NULL, NULL, B, T);
    double d = 0, mx = 0;
    for (long k = 0; k < N * V; k++) {
        if (fabs(m.a.logits[k] - want[k]) > d) d = fabs(m.a.logits[k] - want[k]);
        if (fabs(want[k]) > mx) mx = fabs(want[k]);
    }
    printf("merged logits: largest difference %.3g of %.3g\n", d, mx);
    assert_true(d <= 1e-5 * mx);
    free(want);
    free(a);
    free(b);
    fs_remove_tree(tmpl, &err);
    lora_free(&back);
    lora_free(&lo);
    qwen3_free(&m);
}

/* ---- the merged export of a bf16 base ---- */

/* fp32 to bf16 and back, round to nearest even (finite x): the rounding torch's
 * .to(torch.bfloat16) does, written out here so the expectation does not come from the code
 * under test. */
static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The spacing of bf16 values at x. */
static double bf16_ulp(double x) {
    int e;
    frexp(x == 0 ? 1e-30 : x, &e);
    return ldexp(1.0, e - 8);
}

/* Reads tensor name of dir/model.safetensors as fp32 into a new buffer of numel floats. */
static float *read_merged(const char *dir, const char *name, long numel, DType want) {
    char *p = fs_join(dir, "model.safetensors");
    StFile f;
    Err err;
    if (st_open(&f, p, &err)) fail_msg("%s", err.msg);
    const StTensor *t = st_find(&f, name);
    if (!t) fail_msg("%s has no %s", p, name);
    assert_int_equal(t->numel, numel);
    assert_int_equal(t->dtype, want);
    float *out = malloc((size_t)numel * sizeof *out);
    st_to_f32(t, out);
    st_close(&f);
    free(p);
    return out;
}

/* LoRA on a base held in bf16 (lora.base_dtype), exported merged on one process: each
 * targeted weight is bf16(W) widened exactly plus s B A in fp32, written in the export dtype.
 * In float32 it equals that sum computed here in double (within fp32 rounding); in bfloat16
 * it equals HF peft's merge_and_unload on the base loaded in bf16 (tests/fixtures/lora/
 * merged_bf16.safetensors, tools/make_lora_merge_fixture.py); the untargeted weights held in
 * bf16 are bf16(W) exactly, the norms W. */
static void test_bf16_base_merged_export(void **state) {
    (void)state;
    Err err;
    TrainQwen3 *q = train_qwen3_create(&spec, B, T, AC_NONE, NULL, NULL, 1, 1, &err);
    if (!q) fail_msg("%s", err.msg);
    if (train_qwen3_load_hf(q, base_dir, &err)) fail_msg("%s", err.msg);
    Lora lo;
    if (lora_create(&lo, &spec, RANK, 8.0, 0, ALL, 2, B * T, &(LoraWhere){"test", "test", "test"},
                    1, &err) ||
        lora_load_peft(&lo, &spec, fix_dir, &err))
        fail_msg("%s", err.msg);
    TrainModel tm;
    if (train_qwen3_model_lora(q, &lo, &tm, &err)) fail_msg("%s", err.msg);
    Qwen3 *m = train_qwen3_qwen3(q);
    assert_null(m->p.layers[0].wq); /* held in bf16 only */
    char tmpl[] = "/tmp/qt_lora_merge_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *d32 = fs_join(tmpl, "f32"), *d16 = fs_join(tmpl, "bf16");
    HfExportOptions o = {.dtype = DT_F32};
    if (train_qwen3_export_merged(q, d32, &o, &err)) fail_msg("%s", err.msg);
    m->lora = &lo; /* the export detaches the adapters; the bf16 weights stay unmerged */
    o.dtype = DT_BF16;
    if (train_qwen3_export_merged(q, d16, &o, &err)) fail_msg("%s", err.msg);

    char *bp = fs_join(base_dir, "model.safetensors"),
         *pp = fs_join(fix_dir, "merged_bf16.safetensors");
    StFile base, peft;
    if (st_open(&base, bp, &err) || st_open(&peft, pp, &err)) fail_msg("%s", err.msg);
    double worst32 = 0;
    long n16 = 0, off16 = 0;
    for (int i = 0; i < lo.n; i++) {
        const LoraAdapter *ad = &lo.ad[i];
        char key[200];
        lora_peft_key(key, sizeof key, &spec, ad, 'A');
        /* "base_model.model." + module + ".lora_A.weight" -> module + ".weight" */
        char *name = key + strlen("base_model.model.");
        strcpy(strstr(name, ".lora_A.weight"), ".weight");
        long O = ad->out, I = ad->in, numel = O * I;
        const StTensor *wt = st_find(&base, name), *pt = st_find(&peft, name);
        if (!wt || !pt) fail_msg("no %s in the fixtures", name);
        float *w = malloc((size_t)numel * sizeof *w), *want16 = malloc((size_t)numel * sizeof *w);
        st_to_f32(wt, w);
        st_to_f32(pt, want16);
        float *got32 = read_merged(d32, name, numel, DT_F32);
        float *got16 = read_merged(d16, name, numel, DT_BF16);
        for (long o_ = 0; o_ < O; o_++)
            for (long k = 0; k < I; k++) {
                /* the error of fp32 arithmetic scales with the terms' magnitudes */
                double delta = 0, mag = 0;
                for (int j = 0; j < RANK; j++) {
                    double t = (double)ad->b[o_ * RANK + j] * ad->a[(long)j * I + k];
                    delta += t;
                    mag += fabs(t);
                }
                delta *= 8.0 / RANK;
                double wb = bf16_round(w[o_ * I + k]), want = wb + delta;
                double e = fabs(got32[o_ * I + k] - want) / (fabs(wb) + mag * 8.0 / RANK);
                if (!(e <= worst32)) worst32 = e;
                double d = fabs((double)got16[o_ * I + k] - want16[o_ * I + k]);
                if (d != 0) off16++;
                assert_true(d <= bf16_ulp(want16[o_ * I + k]));
            }
        n16 += numel;
        free(w);
        free(want16);
        free(got32);
        free(got16);
    }
    printf("bf16 base, merged export: float32 within %.3g relative of bf16(W) + s B A; bfloat16 "
           "%ld of %ld values differ from peft's merge_and_unload (by one bf16 step)\n",
           worst32, off16, n16);
    assert_true(worst32 <= 1e-6);
    assert_true(off16 <= n16 / 1000);
    /* Untargeted: the embedding held in bf16 is bf16(W) exactly in both; a norm is W. */
    const char *plain[] = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"};
    for (int k = 0; k < 3; k++) {
        const StTensor *wt = st_find(&base, plain[k]);
        assert_non_null(wt);
        float *w = malloc((size_t)wt->numel * sizeof *w);
        st_to_f32(wt, w);
        float *g32 = read_merged(d32, plain[k], (long)wt->numel, DT_F32);
        for (long j = 0; j < wt->numel; j++)
            assert_true(g32[j] == (k < 2 ? bf16_round(w[j]) : w[j]));
        free(g32);
        free(w);
    }
    st_close(&base);
    st_close(&peft);
    free(bp);
    free(pp);
    fs_remove_tree(tmpl, &err);
    free(d32);
    free(d16);
    lora_free(&lo);
    train_qwen3_free(q);
}

/* rsLoRA (peft's use_rslora, tools/make_lora_fixture.py's rslora/): the adapter folder read
 * alone, as generate and eval read one, scales by alpha / sqrt(r) = 4 (plain LoRA's alpha / r
 * would be 2), and the loss and every adapter gradient of one masked batch equal peft's; the
 * folder written back says use_rslora and reads back the same; [lora] without use_rslora
 * refuses it. */
static void test_rslora_matches_peft(void **state) {
    (void)state;
    Err err;
    char *dir = fs_join(fix_dir, "rslora"), *ex_path = fs_join(dir, "expected.json");
    json_t *ex = json_load_path(ex_path, &err);
    assert_non_null(ex);
    Lora lo;
    if (lora_open_peft(&lo, &spec, dir, B * T, &err)) fail_msg("%s", err.msg);
    assert_true(lo.rslora);
    assert_true(lo.scale == 4.0f);
    assert_int_equal(lo.n, 2 * 3);
    Qwen3 m;
    setup_base(&m, NULL, 0);
    m.lora = &lo;
    int32_t tok[B * T], tgt[B * T];
    read_batch(ex, tok, tgt);
    qwen3_zero_grads(&m);
    lora_zero_grads(&lo);
    float loss = qwen3_forward(&m, tok, tgt, NULL, NULL, B, T);
    qwen3_backward(&m, 0);
    double want = json_number_value(json_object_get(ex, "loss"));
    printf("rsLoRA loss %.7f, peft %.7f\n", loss, want);
    assert_true(fabs(loss - want) <= 1e-5 * want);
    assert_grads_match(&lo, dir);

    char tmpl[] = "/tmp/qt_rslora_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    if (lora_save_peft(&lo, &spec, tmpl, "base", lo.param, &err)) fail_msg("%s", err.msg);
    char *cfg_path = fs_join(tmpl, "adapter_config.json");
    json_t *cfg = json_load_path(cfg_path, &err);
    assert_non_null(cfg);
    assert_true(json_is_true(json_object_get(cfg, "use_rslora")));
    json_decref(cfg);
    Lora back, plain;
    if (lora_open_peft(&back, &spec, tmpl, B * T, &err)) fail_msg("%s", err.msg);
    assert_true(back.rslora && back.scale == lo.scale && back.n == lo.n);
    for (int i = 0; i < lo.n; i++) {
        assert_memory_equal(back.ad[i].a, lo.ad[i].a, (size_t)RANK * lo.ad[i].in * 4);
        assert_memory_equal(back.ad[i].b, lo.ad[i].b, (size_t)lo.ad[i].out * RANK * 4);
    }
    char *const three[] = {"layers.*.attention.wq", "layers.*.attention.wv",
                           "layers.*.feed_forward.w2"};
    assert_int_equal(lora_create(&plain, &spec, RANK, 8.0, 0, three, 3, 8,
                                 &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 1, &err),
                     0);
    assert_int_not_equal(lora_load_peft(&plain, &spec, dir, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "use_rslora = true, but [lora] has rank = 4, alpha = 8 and "
                                    "use_rslora = false"));
    lora_free(&plain);
    fs_remove_tree(tmpl, &err);
    free(cfg_path);
    lora_free(&back);
    lora_free(&lo);
    qwen3_free(&m);
    json_decref(ex);
    free(ex_path);
    free(dir);
}

/* adapter_config.json: r, lora_alpha and use_rslora read; each peft setting of a LoRA variant
 * qtitan does not compute is refused by name, never ignored; settings of how the adapters were
 * chosen or initialised, and keys unknown here, are not read. */
static void expect_config(const char *json, int ok, const char *what) {
    LoraPeftConfig c;
    Err err;
    int rc = lora_peft_config_parse(json, strlen(json), "adapter_config.json", &c, &err);
    if (ok) {
        if (rc) fail_msg("%s: %s", json, err.msg);
        return;
    }
    if (rc == 0) fail_msg("accepted: %s", json);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "adapter_config.json"));
    assert_non_null(strstr(err.msg, what));
}

static void test_peft_config(void **state) {
    (void)state;
    LoraPeftConfig c;
    Err err;
    const char *full = "{\"r\": 16, \"lora_alpha\": 32, \"use_rslora\": true, \"peft_type\": "
                       "\"LORA\", \"rank_pattern\": {}, \"alpha_pattern\": {}, \"use_dora\": "
                       "false, \"modules_to_save\": null, \"loftq_config\": {}, "
                       "\"init_lora_weights\": \"pissa\", \"target_modules\": \"q_proj\", "
                       "\"layers_to_transform\": [0, 1], \"some_future_key\": 3}";
    assert_int_equal(lora_peft_config_parse(full, strlen(full), "a.json", &c, &err), 0);
    assert_int_equal(c.r, 16);
    assert_true(c.alpha == 32 && c.rslora == 1);
    const char *plain = "{\"r\": 8, \"lora_alpha\": 8.5}";
    assert_int_equal(lora_peft_config_parse(plain, strlen(plain), "a.json", &c, &err), 0);
    assert_true(c.r == 8 && c.alpha == 8.5 && c.rslora == 0);

    const char *variants[][2] = {
        {"\"use_dora\": true", "\"use_dora\" is set (DoRA"},
        {"\"rank_pattern\": {\"q_proj\": 8}", "\"rank_pattern\" is set"},
        {"\"alpha_pattern\": {\"q_proj\": 8}", "\"alpha_pattern\" is set"},
        {"\"modules_to_save\": [\"lm_head\"]", "\"modules_to_save\" is set"},
        {"\"trainable_token_indices\": [5, 6]", "\"trainable_token_indices\" is set"},
        {"\"lora_bias\": true", "\"lora_bias\" is set"},
        {"\"layer_replication\": [[0, 2]]", "\"layer_replication\" is set"},
        {"\"target_parameters\": [\"experts.gate_up_proj\"]", "\"target_parameters\" is set"},
        {"\"alora_invocation_tokens\": [1, 2]", "\"alora_invocation_tokens\" is set"},
        {"\"use_qalora\": true", "\"use_qalora\" is set"},
        {"\"use_rslora\": 1", "use_rslora"},
        {"\"peft_type\": \"IA3\"", "peft_type is IA3 where qtitan reads LoRA adapters only"},
        {"\"peft_type\": 3", "peft_type is not a string"},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"r\": 8, \"lora_alpha\": 16, %s}", variants[i][0]);
        expect_config(json, 0, variants[i][1]);
    }
    expect_config("{\"lora_alpha\": 16}", 0, "r");
    expect_config("{\"r\": 8}", 0, "lora_alpha");
    expect_config("{\"r\": 0, \"lora_alpha\": 16}", 0, "r = 0 must be an integer from 1");
    expect_config("{\"r\": 4294967296, \"lora_alpha\": 16}", 0, "r = 4294967296 must be");
    expect_config("{\"r\": 8, \"lora_alpha\": -2}", 0, "lora_alpha = -2 must be");
    expect_config("{\"r\": 8, \"lora_alpha\": \"16\"}", 0, "lora_alpha");
    expect_config("[8, 16]", 0, "expected a JSON object");
    expect_config("{\"r\": 8, ", 0, "adapter_config.json:1:");
}

static void expect_create_error(int rank, double alpha, char *const *targets, int nt,
                                const char *what) {
    Lora lo;
    Err err;
    assert_int_not_equal(lora_create(&lo, &spec, rank, alpha, 0, targets, nt, 8,
                                     &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 1, &err),
                         0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "job.toml: "));
    assert_non_null(strstr(err.msg, what));
}

/* lora.targets as peft users write them: module leaves (q_proj), a leaf with its parent
 * (mlp.down_proj), a full HF module name, a glob over HF names, all-linear; a part of a leaf
 * ("proj") names nothing, as in peft. */
static int created_sites(char *const *targets, int nt, unsigned *sites) {
    Lora lo;
    Err err;
    if (lora_create(&lo, &spec, 2, 8.0, 0, targets, nt, 8,
                    &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 0, &err))
        return -1;
    memset(sites, 0, 2 * sizeof *sites);
    for (int i = 0; i < lo.n; i++)
        sites[lo.ad[i].layer] |= 1u << lo.ad[i].site;
    int n = lo.n;
    lora_free(&lo);
    return n;
}

static void test_peft_target_names(void **state) {
    (void)state;
    unsigned sites[2];
    const unsigned q = 1u << LORA_WQ, k = 1u << LORA_WK, v = 1u << LORA_WV, o = 1u << LORA_WO,
                   w1 = 1u << LORA_W1, w3 = 1u << LORA_W3, w2 = 1u << LORA_W2;
    char *const leaves[] = {"q_proj", "mlp.down_proj"};
    assert_int_equal(created_sites(leaves, 2, sites), 4);
    assert_true(sites[0] == (q | w2) && sites[1] == (q | w2));
    char *const all[] = {"all-linear"};
    assert_int_equal(created_sites(all, 1, sites), 14);
    assert_true(sites[0] == (q | k | v | o | w1 | w3 | w2) && sites[1] == sites[0]);
    char *const full[] = {"model.layers.1.self_attn.v_proj", "model.layers.*.mlp.gate_proj"};
    assert_int_equal(created_sites(full, 2, sites), 3);
    assert_true(sites[0] == w1 && sites[1] == (v | w1));
    char *const mixed[] = {"layers.0.attention.wo", "up_proj", "self_attn.k_proj"};
    assert_int_equal(created_sites(mixed, 3, sites), 5);
    assert_true(sites[0] == (o | w3 | k) && sites[1] == (w3 | k));
    char *const part[] = {"proj"}, *const parent[] = {"self_attn"};
    assert_int_equal(created_sites(part, 1, sites), -1);
    assert_int_equal(created_sites(parent, 1, sites), -1);
}

static void test_bad_input(void **state) {
    (void)state;
    char *const q[] = {"layers.*.attention.wq"}, *const none[] = {"layers.*.attention.qkv"},
                *const ffn[] = {"layers.0.feed_forward.w2"};
    expect_create_error(0, 8, q, 1, "lora.rank = 0 must be >= 1");
    expect_create_error(4, 0, q, 1, "lora.alpha = 0 must be > 0");
    expect_create_error(4, -1, q, 1, "lora.alpha = -1 must be > 0");
    expect_create_error(4, 8, q, 0, "lora.targets is empty");
    expect_create_error(4, 8, none, 1, "lora.targets match no linear layer");
    /* w2 is (32, 64): rank 33 does not fit its smaller side. */
    expect_create_error(33, 8, ffn, 1,
                        "larger than layers.0.feed_forward.w2 (32 x 64) allows (32)");

    /* The peft folder of another rank, and one with an adapter [lora] does not target. */
    Lora lo;
    Err err;
    assert_int_equal(lora_create(&lo, &spec, 2, 8.0, 0, ALL, 2, 8,
                                 &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 1, &err),
                     0);
    assert_int_not_equal(lora_load_peft(&lo, &spec, fix_dir, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(
        strstr(err.msg, "r = 4, lora_alpha = 8 and use_rslora = false, but [lora] has rank = 2"));
    lora_free(&lo);
    assert_int_equal(lora_create(&lo, &spec, RANK, 8.0, 0, q, 1, 8,
                                 &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 1, &err),
                     0);
    assert_int_not_equal(lora_load_peft(&lo, &spec, fix_dir, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "holds 28 tensors where [lora] targets 2 linears"));
    lora_free(&lo);

    /* A model of another shape: the keys are there but misshaped. */
    ModelSpec wide = spec;
    wide.dim = 48;
    assert_int_equal(lora_create(&lo, &wide, RANK, 8.0, 0, ALL, 2, 8,
                                 &(LoraWhere){"job.toml", "job.toml", "job.toml"}, 1, &err),
                     0);
    assert_int_not_equal(lora_load_peft(&lo, &wide, fix_dir, &err), 0);
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "does not fit the model's [lora] adapters"));
    assert_non_null(strstr(err.msg, "is misshaped"));
    lora_free(&lo);
}

/* Dropout (peft's lora_dropout): with a fixed mask the adapter is still linear in x, A and B,
 * so finite differences check the masked backward entry by entry; the mask is a function of
 * (seed, row, adapter, token) (the same on a second draw, another for another row), keeps about
 * 1 - p of the inputs, and is off outside training (eval). */
static void test_dropout(void **state) {
    (void)state;
    enum { N = 6, T = 3, I = 7, O = 6, R = 3 };
    rng_seed(&rng, 12, 0);
    Lora lo;
    Err err;
    char *const q[] = {"layers.0.attention.wq"};
    assert_int_equal(lora_create(&lo, &spec, R, 5.0, 0, q, 1, 4096,
                                 &(LoraWhere){"test", "test", "test"}, 1, &err),
                     0);
    LoraAdapter *ad = &lo.ad[0]; /* its buffers hold this smaller shape */
    ad->in = ad->in_l = I;
    ad->out = ad->out_l = O;
    lora_set_dropout(&lo, 0.3, 99);
    float *x = randn(N * I, 1.0f), *Rp = randn(N * O, 1.0f), *y = zeros(N * O), *y2 = zeros(N * O);
    float *y0 = zeros(N * O), *dx = zeros(N * I);
    rng_fill_normal(&rng, ad->a, R * I, 0.5f);
    rng_fill_normal(&rng, ad->b, O * R, 0.5f);
    lora_forward(&lo, ad, y0, x, N); /* not dropping: the plain adapter */
    lora_dropout_rows(&lo, 40, T);   /* rows 40 and 41 */
    memset(ad->da, 0, R * I * sizeof(float));
    memset(ad->db, 0, O * R * sizeof(float));
    lora_forward(&lo, ad, y, x, N);
    lora_backward(&lo, ad, dx, Rp, x, N);
    lora_forward(&lo, ad, y2, x, N);
    assert_memory_equal(y, y2, N * O * sizeof(float)); /* drawn again: the same mask */
    assert_memory_not_equal(y, y0, N * O * sizeof(float));
    FdAdapter c = {&lo, ad, x, Rp, y2, N, O};
    fd_check("dropout dx", x, N * I, dx, fd_adapter_loss, &c, 0.25f, N * I, 1e-4);
    fd_check("dropout dA", ad->a, R * I, ad->da, fd_adapter_loss, &c, 0.25f, R * I, 1e-4);
    fd_check("dropout dB", ad->b, O * R, ad->db, fd_adapter_loss, &c, 0.25f, O * R, 1e-4);
    lora_dropout_rows(&lo, 41, T); /* another row pair: another mask */
    memset(y2, 0, N * O * sizeof(float));
    lora_forward(&lo, ad, y2, x, N);
    assert_memory_not_equal(y, y2, N * O * sizeof(float));
    lora_dropout_rows(&lo, -1, 0); /* eval: no dropout */
    memset(y2, 0, N * O * sizeof(float));
    lora_forward(&lo, ad, y2, x, N);
    assert_memory_equal(y0, y2, N * O * sizeof(float));
    /* The kept fraction and the 1 / (1 - p) scale: one input of 1 on 4096 rows. */
    ad->in = ad->in_l = 1;
    const float one = 1.0f;
    int kept = 0;
    for (int k = 0; k < 4096; k++) {
        lora_dropout_rows(&lo, k, 1);
        lora_forward(&lo, ad, y2, &one, 1);
        float v = lo.xd[0]; /* dropout(1) */
        kept += v != 0.0f;
        if (v != 0.0f) assert_float_equal(v, 1.0f / 0.7f, 1e-6);
    }
    printf("dropout 0.3: kept %d of 4096\n", kept);
    assert_in_range(kept, 4096 * 0.7 - 120, 4096 * 0.7 + 120); /* 4 standard deviations */
    free(x), free(Rp), free(y), free(y2), free(y0), free(dx);
    lora_free(&lo);
}

/* Tensor parallelism (lora_set_tp, lora_block): two ranks, each running its block of a
 * column-split (wq) and a row-split (wo) linear with dropout on its blocks of the factors, give
 * one process's output, input gradient and adapter gradients: the split factor's gradient
 * blocks joined, the whole factor's partial sums (lora_tp_whole) summed, as the driver does. */
static void test_tp_blocks(void **state) {
    (void)state;
    enum { N = 6 };
    rng_seed(&rng, 13, 0);
    Lora lo;
    Err err;
    char *const q[] = {"layers.0.attention.wq", "layers.0.attention.wo"};
    assert_int_equal(lora_create(&lo, &spec, RANK, 8.0, 0, q, 2, N,
                                 &(LoraWhere){"test", "test", "test"}, 1, &err),
                     0);
    lora_set_dropout(&lo, 0.2, 5);
    rng_fill_normal(&rng, lo.param, lora_numel(&lo), 0.5f);
    long ng = lora_numel(&lo);
    float *want_g = zeros(ng);
    for (int k = 0; k < lo.n; k++) {
        LoraAdapter *ad = &lo.ad[k];
        int I = ad->in, O = ad->out;
        assert_int_equal(I % 2, 0);
        assert_int_equal(O % 2, 0);
        float *x = randn((long)N * I, 1.0f), *dy = randn((long)N * O, 1.0f);
        float *y = zeros((long)N * O), *dx = zeros((long)N * I);
        float *ys = zeros((long)N * O), *dxs = zeros((long)N * I);
        float *xl = zeros((long)N * I), *dyl = zeros((long)N * O);
        float *yl = zeros((long)N * O), *dxl = zeros((long)N * I);
        lora_set_tp(&lo, 1, 0);
        lora_zero_grads(&lo);
        lora_dropout_rows(&lo, 7, N / 2);
        lora_forward(&lo, ad, y, x, N);
        lora_backward(&lo, ad, dx, dy, x, N);
        memcpy(want_g, lo.grad, (size_t)ng * sizeof(float));
        lora_zero_grads(&lo);
        float *a = ad->a, *b = ad->b, *da = ad->da, *db = ad->db;
        for (int t = 0; t < 2; t++) {
            lora_set_tp(&lo, 2, t);
            int il = ad->in_l, ol = ad->out_l;
            /* this rank's factors and their gradients, of the local shapes */
            float *al = zeros((long)RANK * il), *bl = zeros((long)ol * RANK);
            float *dal = zeros((long)RANK * il), *dbl = zeros((long)ol * RANK);
            lora_block(&lo, ad, a, b, al, bl);
            ad->a = al, ad->b = bl, ad->da = dal, ad->db = dbl;
            for (int n = 0; n < N; n++) {
                memcpy(xl + n * il, x + n * I + ad->in_off, (size_t)il * sizeof(float));
                memcpy(dyl + n * ol, dy + n * O + ad->out_off, (size_t)ol * sizeof(float));
            }
            memset(yl, 0, (size_t)N * ol * sizeof(float));
            memset(dxl, 0, (size_t)N * il * sizeof(float));
            lora_forward(&lo, ad, yl, xl, N);
            lora_backward(&lo, ad, dxl, dyl, xl, N);
            for (int n = 0; n < N; n++) {
                for (int o = 0; o < ol; o++)
                    ys[n * O + ad->out_off + o] += yl[n * ol + o];
                for (int j = 0; j < il; j++)
                    dxs[n * I + ad->in_off + j] += dxl[n * il + j];
            }
            /* the gradient blocks back at their places of the whole factors, added */
            for (int j = 0; j < RANK; j++)
                for (int c = 0; c < il; c++)
                    da[j * I + ad->in_off + c] += dal[j * il + c];
            for (long e = 0; e < (long)ol * RANK; e++)
                db[(long)ad->out_off * RANK + e] += dbl[e];
            assert_int_equal(lora_tp_whole(ad, 'A'), il == I);
            assert_int_equal(lora_tp_whole(ad, 'B'), ol == O);
            ad->a = a, ad->b = b, ad->da = da, ad->db = db;
            free(al), free(bl), free(dal), free(dbl);
        }
        /* Column-split: its blocks of y, partial dx; row-split the other way round. */
        assert_true(ad->site == LORA_WQ ? ad->out_l == O / 2 && ad->in_l == I
                                        : ad->in_l == I / 2 && ad->out_l == O);
        assert_true(rel_l2(ys, y, (long)N * O) < 1e-6);
        assert_true(rel_l2(dxs, dx, (long)N * I) < 1e-6);
        assert_true(rel_l2(lo.grad, want_g, ng) < 1e-6);
        free(x), free(dy), free(y), free(dx), free(ys), free(dxs);
        free(xl), free(dyl), free(yl), free(dxl);
    }
    lora_dropout_rows(&lo, -1, 0);
    free(want_g);
    lora_free(&lo);
}

/* lora_peft_merge (inference: generate / eval --adapter) refuses a folder whose tensors it
 * would not all use: a lora_B without its lora_A, a factor of a layer the model does not have,
 * a magnitude without use_dora; and leaves the weights untouched when it refuses (everything
 * is checked before anything is merged). */
static void test_merge_refusals(void **state) {
    (void)state;
    HfKeyTable t;
    hf_keys_build(&t, &spec);
    float **params = xcalloc((size_t)t.nparams, sizeof *params);
    for (int k = 0; k < t.nparams; k++)
        params[k] = xcalloc((size_t)t.params[k].numel, sizeof(float));
    int q = hf_keys_find_hf(&t, "model.layers.0.self_attn.q_proj.weight");
    assert_true(q >= 0);
    int64_t O = t.hf[q].shape[0], I = t.hf[q].shape[1];
    float *v = xcalloc((size_t)(O * I), sizeof *v);
    for (long i = 0; i < O * I; i++)
        v[i] = 0.5f;
    static const struct {
        const char *keys[3];
        const char *want;
    } cases[] = {
        {{"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", NULL},
         "q_proj.lora_B.weight but not base_model.model.model.layers.0.self_attn.q_proj.lora_A"},
        {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
          "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
          "base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight"},
         "layers.99.self_attn.q_proj.lora_A.weight is not an adapter of this model's linears"},
        {{"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", NULL},
         "q_proj.lora_magnitude_vector but not"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char tmpl[] = "/tmp/qt_merge_XXXXXX";
        assert_non_null(mkdtemp(tmpl));
        Err err;
        char *cfg = fs_join(tmpl, "adapter_config.json");
        const char *text = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4}";
        assert_int_equal(fs_write_atomic(cfg, text, strlen(text), &err), 0);
        StWriter w;
        st_writer_init(&w);
        for (int k = 0; k < 3 && cases[c].keys[k]; k++) {
            const char *key = cases[c].keys[k];
            int64_t shape[2] = {strstr(key, "lora_A") ? 2 : O, strstr(key, "lora_B") ? 2 : I};
            int mag = strstr(key, "magnitude") != NULL;
            st_writer_add_f32(&w, key, DT_F32, mag ? 1 : 2, mag ? &O : shape, v);
        }
        char *st = fs_join(tmpl, "adapter_model.safetensors");
        assert_int_equal(st_write_finish(&w, st, &err), 0);
        st_writer_free(&w);
        assert_int_not_equal(lora_peft_merge(&spec, params, tmpl, &err), 0);
        fprintf(stderr, "expected error: %s\n", err.msg);
        if (!strstr(err.msg, cases[c].want)) fail_msg("case %zu: %s", c, err.msg);
        for (int k = 0; k < t.nparams; k++)
            for (long i = 0; i < t.params[k].numel; i++)
                assert_true(params[k][i] == 0.0f);
        unlink(cfg), unlink(st), rmdir(tmpl);
        free(cfg), free(st);
    }
    for (int k = 0; k < t.nparams; k++)
        free(params[k]);
    free(params), free(v);
    hf_keys_free(&t);
}

int main(void) {
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) return 77;
    fix_dir = fs_join(src, "tests/fixtures/lora");
    base_dir = fs_join(src, "tests/fixtures/train_parity");
    Err err;
    char *cfg = fs_join(base_dir, "config.json"), *ex = fs_join(fix_dir, "expected.json");
    expected = json_load_path(ex, &err);
    if (!expected || model_spec_from_hf_config(&spec, cfg, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_and_grads_match_peft),
        cmocka_unit_test(test_five_steps_match_peft),
        cmocka_unit_test(test_bf16_base),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_tp_blocks),
        cmocka_unit_test(test_peft_files_and_merge),
        cmocka_unit_test(test_bf16_base_merged_export),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_rslora_matches_peft),
        cmocka_unit_test(test_peft_config),
        cmocka_unit_test(test_peft_target_names),
        cmocka_unit_test(test_merge_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    json_decref(expected);
    free(cfg);
    free(ex);
    free(fix_dir);
    free(base_dir);
    return rc;
}
