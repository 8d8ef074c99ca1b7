/* The host-side readers (checkpoint save and load, gradient clipping, HF export) reach a
 * tensor's memory only through its Device: a fake device whose memory the host cannot read in
 * place (to_host / from_host copy from and to a private buffer; the pointer the readers get
 * holds NaNs) must give the same files and norms as the same values in host memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/fs.h"
#include "core/rng.h"
#include "core/strutil.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/hf_keys.h"
#include "train/checkpoint.h"
#include "train/clip.h"

/* The fake device's one allocation: `shown` is the pointer handed out (NaNs, never read by a
 * correct reader), `held` the real contents at the same offsets. */
static struct {
    float *shown, *held;
    size_t n;
    long to_host_calls, from_host_calls;
} fake;

static size_t fake_offset(const void *p, size_t bytes) {
    size_t off = (size_t)((const char *)p - (const char *)fake.shown);
    assert_true(off + bytes <= fake.n * sizeof(float));
    return off;
}

static void fake_to_host(void *dst, const void *src, size_t bytes) {
    memcpy(dst, (const char *)fake.held + fake_offset(src, bytes), bytes);
    fake.to_host_calls++;
}

static void fake_from_host(void *dst, const void *src, size_t bytes) {
    memcpy((char *)fake.held + fake_offset(dst, bytes), src, bytes);
    fake.from_host_calls++;
}

static const Device fake_device = {"fake", NULL, NULL, fake_to_host, fake_from_host, 0};

/* n values in fake memory, and the same values in host memory (returned). */
static float *fake_init(size_t n, uint64_t seed) {
    fake.n = n;
    fake.shown = malloc(n * sizeof(float));
    fake.held = malloc(n * sizeof(float));
    float *host = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        fake.shown[i] = NAN;
    Rng rng;
    rng_seed(&rng, seed, 0);
    rng_fill_normal(&rng, host, n, 0.02f);
    memcpy(fake.held, host, n * sizeof(float));
    fake.to_host_calls = fake.from_host_calls = 0;
    return host;
}

static void fake_free(void) {
    free(fake.shown);
    free(fake.held);
}

static void test_clip_reads_through_device(void **state) {
    (void)state;
    enum { N = 200003 }; /* several clip chunks, the last one ragged */
    float *host = fake_init(N, 3);
    GradRef on_host[1] = {{host, N, NULL}}, on_fake[1] = {{fake.shown, N, &fake_device}};
    double want = grad_global_norm(on_host, 1);
    assert_true(isfinite(want) && want > 0);
    assert_true(grad_global_norm(on_fake, 1) == want); /* bitwise: same chunks, same order */
    assert_true(fake.to_host_calls > 0);
    /* Clipping writes the scaled values back into device memory, not into the host view. */
    int finite;
    assert_true(grad_clip(on_host, 1, 0.5, &finite) == want && finite);
    assert_true(grad_clip(on_fake, 1, 0.5, &finite) == want && finite);
    assert_true(fake.from_host_calls > 0);
    assert_memory_equal(fake.held, host, N * sizeof(float));
    assert_true(isnan(fake.shown[0]) && isnan(fake.shown[N - 1]));
    free(host);
    fake_free();
}

static char *save_one(const CkptTensor *t, int n) {
    char tmpl[] = "/tmp/qt_devrd_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *root = fs_join(tmpl, "checkpoint");
    CkptState st = {.step = 1, .optim_step = 1, .lr = 1e-3};
    Err err;
    int rc = ckpt_save(root, &st, t, n, t, 0, 0, &err);
    if (rc != 0) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    return root;
}

static void remove_root(char *root) {
    Err err;
    *strrchr(root, '/') = 0;
    fs_remove_tree(root, &err);
    free(root);
}

static void test_checkpoint_reads_through_device(void **state) {
    (void)state;
    enum { N = (1 << 16) * 2 + 5 }; /* more than one staging chunk of the writer */
    float *host = fake_init(N, 5);
    CkptTensor on_host = {"w", 1, {N}, host, NULL};
    CkptTensor on_fake = {"w", 1, {N}, fake.shown, &fake_device};
    char *a = save_one(&on_host, 1), *b = save_one(&on_fake, 1);
    assert_true(fake.to_host_calls >= 3);
    char *fa = fs_join(a, "step-1/model.safetensors"), *fb = fs_join(b, "step-1/model.safetensors");
    char *da, *db;
    size_t la, lb;
    Err err;
    assert_int_equal(fs_read_all(fa, &da, &la, &err), 0);
    assert_int_equal(fs_read_all(fb, &db, &lb, &err), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la); /* the same bytes as from host memory */
    /* Loading writes device memory through from_host. */
    memset(fake.held, 0, N * sizeof(float));
    char *step = fs_join(b, "step-1");
    CkptState st;
    int rc = ckpt_load(step, &st, &on_fake, 1, &on_fake, 0, &err);
    if (rc != 0) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    json_decref(st.data_position);
    assert_true(fake.from_host_calls > 0);
    assert_memory_equal(fake.held, host, N * sizeof(float));
    assert_true(isnan(fake.shown[0]));
    free(step);
    free(da);
    free(db);
    free(fa);
    free(fb);
    remove_root(a);
    remove_root(b);
    free(host);
    fake_free();
}

/* Exports every parameter of a small fixture model from the host or from the fake device. */
static char *export_from(const ModelSpec *spec, const HfKeyTable *t, const float *base,
                         const Device *dev, const char *name) {
    HfExportTensor *ts = calloc((size_t)t->nparams, sizeof *ts);
    size_t off = 0;
    for (int i = 0; i < t->nparams; i++) {
        ts[i] = (HfExportTensor){.name = t->params[i].name,
                                 .numel = t->params[i].numel,
                                 .data = base + off,
                                 .device = dev};
        off += (size_t)t->params[i].numel;
    }
    char tmpl[] = "/tmp/qt_devrd_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *out = fs_join(tmpl, name);
    HfExportOptions o = {.dtype = DT_BF16};
    Err err;
    if (hf_export(out, spec, ts, t->nparams, &o, &err) != 0) fail_msg("%s", err.msg);
    free(ts);
    return out;
}

static void test_export_reads_through_device(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/hf_keys/dense_untied.config.json",
             getenv("QT_SOURCE_DIR"));
    ModelSpec spec;
    Err err;
    if (model_spec_from_hf_config(&spec, path, &err) != 0) fail_msg("%s", err.msg);
    HfKeyTable t;
    hf_keys_build(&t, &spec);
    size_t n = 0;
    for (int i = 0; i < t.nparams; i++)
        n += (size_t)t.params[i].numel;
    float *host = fake_init(n, 7);
    char *a = export_from(&spec, &t, host, NULL, "host");
    char *b = export_from(&spec, &t, fake.shown, &fake_device, "fake");
    assert_true(fake.to_host_calls > 0);
    char *fa = fs_join(a, "model.safetensors"), *fb = fs_join(b, "model.safetensors");
    char *da, *db;
    size_t la, lb;
    assert_int_equal(fs_read_all(fa, &da, &la, &err), 0);
    assert_int_equal(fs_read_all(fb, &db, &lb, &err), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    free(da);
    free(db);
    free(fa);
    free(fb);
    remove_root(a);
    remove_root(b);
    hf_keys_free(&t);
    free(host);
    fake_free();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clip_reads_through_device),
        cmocka_unit_test(test_checkpoint_reads_through_device),
        cmocka_unit_test(test_export_reads_through_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
