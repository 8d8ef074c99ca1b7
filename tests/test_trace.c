/* Unit tests for src/core/trace: nothing is recorded unless a step is; a recorded step is
 * written as Chrome trace-event JSON (parsed back here with jansson) with the step span, one
 * complete event per span in order, microsecond times inside the step, the rank as pid, and
 * names that need JSON escaping escaped; op calls timed through ops/op_profile.h and GEMMs
 * through gemm_f32 become events while recording, with QT_PROFILE off; spans recorded by two
 * OpenMP threads lie on two named tracks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/trace.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_peak.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"
#include "ops/op_profile.h"

static void test_trace_file(void **state) {
    (void)state;
    char dir[] = "/tmp/qt_trace_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(trace_recording(), 0);
    trace_span("ignored", NULL, "forward", trace_now(), NULL); /* not recording: dropped */
    assert_int_equal(prof_timing(), 0);

    trace_start();
    assert_int_equal(trace_recording(), 1);
    assert_int_equal(prof_timing(), 1);
    double t0 = trace_now();
    usleep(2000);
    trace_span("all_reduce_sum", NULL, "collective", t0, NULL);
    int tok = prof_begin("sdpa", "cpu", 1);
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4];
    gemm_f32(0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    prof_end(tok);
    trace_span("odd \"name\"", "k\\1", "forward", trace_now(), "\"x\": 1");
    Err err;
    assert_int_equal(trace_write(dir, 7, 3, &err), 0);
    assert_int_equal(trace_recording(), 0);

    char path[128];
    snprintf(path, sizeof path, "%s/iteration_7/rank3_trace.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s (line %d)", path, je.text, je.line);
    json_t *ev = json_object_get(root, "traceEvents");
    assert_true(json_is_array(ev));
    /* process name, the driver's thread name and sort index, the step, then the spans in the
     * order they ended. */
    const char *want[][2] = {{"step", "step"},
                             {"all_reduce_sum", "collective"},
                             {"gemm_f32", "gemm"},
                             {"sdpa [cpu]", "backward"},
                             {"odd \"name\" [k\\1]", "forward"}};
    size_t n = json_array_size(ev);
    assert_int_equal(n, 3 + 5);
    double step_dur = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), 3);
        if (i < 3) {
            assert_string_equal(ph, "M");
            continue;
        }
        assert_string_equal(ph, "X");
        assert_string_equal(json_string_value(json_object_get(e, "name")), want[i - 3][0]);
        assert_string_equal(json_string_value(json_object_get(e, "cat")), want[i - 3][1]);
        double ts = json_number_value(json_object_get(e, "ts"));
        double dur = json_number_value(json_object_get(e, "dur"));
        assert_true(ts >= 0 && dur >= 0);
        if (i == 3) {
            step_dur = dur;
            assert_true(ts == 0);
        } else {
            assert_true(ts + dur <= step_dur + 1e-3); /* inside the step */
        }
        if (i == 4) assert_true(dur >= 1500); /* the 2 ms sleep, in microseconds */
    }
    json_t *g = json_array_get(ev, 5);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(g, "args"), "K")), 2);
    json_decref(root);
    fs_remove_tree(dir, &err);
}

/* Spans recorded inside a parallel region lie on each thread's own track (tid), every track
 * named by a thread_name event, the driver's among them. */
static void test_trace_threads(void **state) {
    (void)state;
    char dir[] = "/tmp/qt_trace_XXXXXX";
    assert_non_null(mkdtemp(dir));
    trace_start();
#pragma omp parallel num_threads(2)
    {
        double t0 = trace_now();
        usleep(1000);
#pragma omp barrier
        trace_span("tile", NULL, "thread", t0, NULL);
    }
    Err err;
    assert_int_equal(trace_write(dir, 1, 0, &err), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/iteration_1/rank0_trace.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s (line %d)", path, je.text, je.line);
    json_t *ev = json_object_get(root, "traceEvents");
    json_int_t tiles[2], named[4];
    int ntiles = 0, nnamed = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        if (strcmp(name, "tile") == 0 && ntiles < 2) tiles[ntiles++] = tid;
        if (strcmp(name, "thread_name") == 0 && nnamed < 4) named[nnamed++] = tid;
    }
    assert_int_equal(ntiles, 2);
    assert_true(tiles[0] != tiles[1]);
    assert_int_equal(nnamed, 2);
    for (int k = 0; k < 2; k++)
        assert_true(tiles[k] == named[0] || tiles[k] == named[1]);
    assert_true(named[0] == (json_int_t)gettid() || named[1] == (json_int_t)gettid());
    json_decref(root);
    fs_remove_tree(dir, &err);
}

/* Attention's own product kernels (not gemm_f32 / gemm_bf16 calls) count in the GEMM column of
 * the sdpa rows on every AVX-512 route, fp32 and bf16 pairs alike (AMX tiles where present),
 * and the softmax work between them does not: 0 < GEMM seconds < row seconds. */
static void test_sdpa_products_timed(void **state) {
    (void)state;
    if (!simd_avx512_active()) skip();
    prof_reset();
    trace_start(); /* op calls are timed while a trace records */
    enum { B = 1, T = 200, H = 4, K = 2, E = 64 };
    long nq = (long)B * T * H * E, nk = (long)B * T * K * E;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *o = malloc(nq * sizeof *o), *dout = malloc(nq * sizeof *dout);
    float *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk),
          *dv = malloc(nk * sizeof *dv);
    float *lse = malloc((size_t)B * H * T * sizeof *lse);
    uint16_t *scratch = malloc(SDPA_BF16_SCRATCH(B, T, K, E) * sizeof *scratch);
    for (long i = 0; i < nq; i++)
        q[i] = (float)((i * 37) % 101) / 101 - 0.5f, dout[i] = (float)((i * 53) % 97) / 97 - 0.5f;
    for (long i = 0; i < nk; i++)
        k[i] = (float)((i * 29) % 89) / 89 - 0.5f, v[i] = (float)((i * 31) % 83) / 83 - 0.5f;
    const SdpaOp *op = &sdpa_cpu;
    int bf16 = cpu_has_avx512_bf16();
    for (int prec = 0; prec <= bf16; prec++) {
        const char *impl = prec ? "bf16" : "fp32"; /* two rows, one per route */
        int tok = prof_begin("sdpa", impl, 0);
        if (prec)
            op->forward_bf16(o, lse, q, k, v, NULL, B, T, H, K, E, scratch);
        else
            op->forward(o, lse, q, k, v, NULL, B, T, H, K, E);
        prof_end(tok);
        tok = prof_begin("sdpa", impl, 1);
        if (prec)
            op->backward_bf16(dq, dk, dv, dout, q, k, v, o, lse, NULL, B, T, H, K, E, scratch);
        else
            op->backward(dq, dk, dv, dout, q, k, v, o, lse, NULL, B, T, H, K, E);
        prof_end(tok);
        for (int bwd = 0; bwd < 2; bwd++) {
            double sec, gemm;
            assert_int_equal(prof_row("sdpa", impl, bwd, &sec, &gemm), 0);
            if (!(gemm > 0 && gemm < sec))
                fail_msg("sdpa %s %s: GEMM %.6f s of %.6f s", impl, bwd ? "bwd" : "fwd", gemm, sec);
        }
    }
    char dir[] = "/tmp/qt_trace_XXXXXX";
    assert_non_null(mkdtemp(dir));
    Err err;
    assert_int_equal(trace_write(dir, 1, 0, &err), 0); /* ends the recording */
    fs_remove_tree(dir, &err);
    prof_reset();
    free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
    free(scratch);
}

int main(void) {
    unsetenv("QT_PROFILE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_file),
        cmocka_unit_test(test_trace_threads),
        cmocka_unit_test(test_sdpa_products_timed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
