/* Metrics: FLOPs per token on known shapes (numbers worked out by hand below), the exact
 * console line, the JSONL record, the steady-state summary, and a sane measured peak. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/progress.h"
#include "train/metrics.h"

/* Qwen3-0.6B: D 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128, FFN 3072, vocab 151936,
 * tied. Per layer: wq 1024*2048 = 2,097,152; wk = wv = 1024*1024 = 1,048,576 each; wo
 * 2,097,152; attention 6,291,456. FFN 3*1024*3072 = 9,437,184. Layer 15,728,640; 28 layers
 * 440,401,920; lm_head 151936*1024 = 155,582,464; matmul params 595,984,384.
 * At seq_len 4096: 6*595,984,384 = 3,575,906,304 plus 12*28*16*128*4096 = 2,818,572,288
 * gives 6,394,478,592 FLOPs per token. */
static void test_flops_dense(void **state) {
    (void)state;
    ModelSpec s;
    memset(&s, 0, sizeof s);
    s.dim = 1024;
    s.n_layers = 28;
    s.n_heads = 16;
    s.n_kv_heads = 8;
    s.head_dim = 128;
    s.hidden_dim = 3072;
    s.vocab_size = 151936;
    s.tie_embeddings = 1;
    assert_true(metrics_matmul_params(&s) == 595984384.0);
    assert_true(metrics_flops_per_token(&s, 4096) == 6394478592.0);
}

/* Qwen3-30B-A3B: D 2048, 48 layers, 32 heads, 4 kv heads, head_dim 128, 128 experts, top 8,
 * expert FFN 768, every layer MoE. Attention per layer 2048*4096*2 + 2*2048*512 =
 * 18,874,368; MoE per layer: router 2048*128 = 262,144 plus 8*3*2048*768 = 37,748,736, so
 * 38,010,880; 48 layers 2,736,377,856; lm_head 311,164,928; active matmul params
 * 3,041,656,832. At seq_len 4096: 18,249,940,992 + 12*48*32*128*4096 = 9,663,676,416,
 * total 27,913,617,408. With layer 0 dense (mlp_only_layers), F = 6144 there instead:
 * + 3*2048*6144 - 38,010,880 = 37,748,736 - 38,010,880 = -262,144 params. */
static void test_flops_moe(void **state) {
    (void)state;
    ModelSpec s;
    memset(&s, 0, sizeof s);
    s.dim = 2048;
    s.n_layers = 48;
    s.n_heads = 32;
    s.n_kv_heads = 4;
    s.head_dim = 128;
    s.hidden_dim = 6144;
    s.vocab_size = 151936;
    s.num_experts = 128;
    s.top_k = 8;
    s.moe_hidden_dim = 768;
    s.decoder_sparse_step = 1;
    assert_true(metrics_matmul_params(&s) == 3041656832.0);
    assert_true(metrics_flops_per_token(&s, 4096) == 27913617408.0);
    s.mlp_only_layers[0] = 1;
    assert_true(metrics_matmul_params(&s) == 3041656832.0 - 262144.0);
}

static void test_console_line(void **state) {
    (void)state;
    StepMetrics m = {.step = 1,
                     .loss = 12.049591,
                     .grad_norm = 1.73362,
                     .memory_gib = 59.8991,
                     .memory_pct = 21.6512,
                     .tps = 441.3,
                     .tflops = 7.9812,
                     .mfu = 0.3249};
    char buf[256];
    metrics_format_line(buf, sizeof buf, &m);
    assert_string_equal(buf, "step:  1  loss: 12.04959  grad_norm:  1.7336  memory: "
                             "59.90GiB(21.65%)  tps: 441  tflops: 7.98  mfu: 0.32%");
    m.step = 1234;
    m.loss = 2.5;
    m.grad_norm = 0.25;
    m.memory_gib = 3.0;
    m.memory_pct = 5.0;
    m.tps = 12345.5;
    m.tflops = 1.0;
    m.mfu = 45.678;
    metrics_format_line(buf, sizeof buf, &m);
    assert_string_equal(buf, "step: 1234  loss:  2.50000  grad_norm:  0.2500  memory: "
                             " 3.00GiB(5.00%)  tps: 12346  tflops: 1.00  mfu: 45.68%");
    /* With the total and the time left (724.4 s rounds to 12m04s). */
    m.step = 40;
    m.total_steps = 1000;
    m.eta_s = 724.4;
    metrics_format_line(buf, sizeof buf, &m);
    assert_string_equal(buf, "step: 40/1000  loss:  2.50000  grad_norm:  0.2500  memory: "
                             " 3.00GiB(5.00%)  tps: 12346  tflops: 1.00  mfu: 45.68%  eta: "
                             "12m04s");
    char d[32];
    format_duration(d, sizeof d, 3723.0);
    assert_string_equal(d, "1h02m03s");
    format_duration(d, sizeof d, 59.4);
    assert_string_equal(d, "0m59s");
}

static void test_fill_and_jsonl(void **state) {
    (void)state;
    StepMetrics m = {.step = 3, .loss = 7.25, .grad_norm = 1.5, .lr = 3e-4};
    /* 8192 tokens in 2 s at 1e9 FLOPs/token on a 10 TFLOP/s peak: 4096 tps, 4.096 TFLOP/s,
     * 40.96% MFU. */
    metrics_fill(&m, 8192, 2.0, 1e9, 10.0);
    assert_true(m.tps == 4096.0);
    assert_true(fabs(m.tflops - 4.096) < 1e-12);
    assert_true(fabs(m.mfu - 40.96) < 1e-9);
    assert_true(m.memory_gib > 0 && m.memory_pct > 0 && m.memory_pct < 100);

    char dir[] = "/tmp/qt_metrics_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *sub = fs_join(dir, "dump");
    MetricsWriter w;
    Err err;
    assert_int_equal(metrics_writer_open(&w, sub, 0, &err), 0);
    MetricsExtra extra[2] = {{"comm_s", 0.125}, {"moe_max_load", 1.5}};
    assert_int_equal(metrics_writer_write(&w, &m, extra, 2, &err), 0);
    m.step = 4;
    m.loss = NAN;
    assert_int_equal(metrics_writer_write(&w, &m, NULL, 0, &err), 0);
    metrics_writer_close(&w);
    char *path = fs_join(sub, "metrics.jsonl"), *data;
    size_t len;
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    char *nl = strchr(data, '\n');
    assert_non_null(nl);
    json_error_t je;
    json_t *o = json_loadb(data, (size_t)(nl - data), 0, &je);
    assert_non_null(o);
    const char *keys[] = {"step",   "loss", "grad_norm",   "lr",     "memory_gib",  "tps",
                          "tflops", "mfu",  "step_time_s", "comm_s", "moe_max_load"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_non_null(json_object_get(o, keys[i]));
    assert_int_equal(json_integer_value(json_object_get(o, "step")), 3);
    assert_true(json_real_value(json_object_get(o, "lr")) == 3e-4);
    assert_true(json_real_value(json_object_get(o, "comm_s")) == 0.125);
    json_decref(o);
    o = json_loads(nl + 1, 0, &je);
    assert_non_null(o);
    assert_true(json_is_null(json_object_get(o, "loss")));
    json_decref(o);
    free(data);
    /* Resuming from step 4 keeps both lines (steps 3 and 4) and appends. */
    assert_int_equal(metrics_writer_open(&w, sub, 4, &err), 0);
    m.step = 5;
    assert_int_equal(metrics_writer_write(&w, &m, NULL, 0, &err), 0);
    metrics_writer_close(&w);
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += data[i] == '\n';
    assert_int_equal(lines, 3);
    free(data);
    /* Resuming from step 3 drops the records of steps 4 and 5, which the run redoes, and a torn
     * last line (a crash mid-write). */
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs("{\"step\": 6, \"lo", f);
    fclose(f);
    assert_int_equal(metrics_writer_open(&w, sub, 3, &err), 0);
    m.step = 4;
    m.loss = 2.5;
    assert_int_equal(metrics_writer_write(&w, &m, NULL, 0, &err), 0);
    metrics_writer_close(&w);
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    int64_t steps[8];
    int n = 0;
    for (char *line = data; line < data + len && n < 8;) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        json_t *r = json_loadb(line, (size_t)(end - line), 0, &je);
        assert_non_null(r);
        steps[n++] = json_integer_value(json_object_get(r, "step"));
        json_decref(r);
        line = end + 1;
    }
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 3);
    assert_int_equal(steps[1], 4);
    /* A fresh run (no checkpoint) in the same folder never truncates the records: they move to
     * metrics.1.jsonl, then metrics.2.jsonl, and metrics.jsonl holds the new run only. */
    for (int run = 1; run <= 2; run++) {
        assert_int_equal(metrics_writer_open(&w, sub, 0, &err), 0);
        m.step = 1;
        assert_int_equal(metrics_writer_write(&w, &m, NULL, 0, &err), 0);
        metrics_writer_close(&w);
        char name[32], *kept_data;
        size_t kept_len;
        snprintf(name, sizeof name, "metrics.%d.jsonl", run);
        char *kept = fs_join(sub, name);
        assert_int_equal(fs_read_all(kept, &kept_data, &kept_len, &err), 0);
        if (run == 1) assert_memory_equal(kept_data, data, len);
        free(kept_data);
        free(kept);
    }
    free(data);
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    assert_non_null(strstr(data, "\"step\":1,"));
    assert_int_equal(strchr(data, '\n') + 1 - data, (long)len);
    free(data);
    assert_int_equal(fs_remove_tree(dir, &err), 0);
    free(path);
    free(sub);
    /* An unwritable place is an error, not a crash. */
    assert_int_equal(metrics_writer_open(&w, "/proc/qt_no_such_dir", 0, &err), -1);
}

static void test_summary(void **state) {
    (void)state;
    MetricsSummary s = {0};
    char buf[256];
    StepMetrics a = {.step = 1, .tps = 10, .tflops = 1, .mfu = 1};
    metrics_summary_add(&s, &a);
    metrics_summary_format(buf, sizeof buf, &s);
    assert_non_null(strstr(buf, "not enough steps"));
    StepMetrics b = {.step = 2, .tps = 400, .tflops = 4, .mfu = 2};
    StepMetrics c = {.step = 3, .tps = 600, .tflops = 6, .mfu = 4};
    metrics_summary_add(&s, &b);
    metrics_summary_add(&s, &c);
    metrics_summary_format(buf, sizeof buf, &s);
    assert_string_equal(buf, "steady state over 2 steps (first step excluded): tps: 500  "
                             "tflops: 5.00  mfu: 3.00%");
}

static void test_peak(void **state) {
    (void)state;
    double t = metrics_measure_peak_tflops(0.05);
    printf("measured peak: %.3f TFLOP/s\n", t);
    /* Any CPU does more than 1 GFLOP/s and less than 1 PFLOP/s of fp32 FMA. */
    assert_true(t > 1e-3 && t < 1e3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flops_dense),  cmocka_unit_test(test_flops_moe),
        cmocka_unit_test(test_console_line), cmocka_unit_test(test_fill_and_jsonl),
        cmocka_unit_test(test_summary),      cmocka_unit_test(test_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
