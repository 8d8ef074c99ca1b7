/* The step-time model (train/steptime.h) on a model small enough to count by hand (dim 32, 2
 * layers, 4 heads of 8, 2 kv heads, FFN 64, vocabulary 640, tied; 2 x 32 tokens per rank): the
 * FSDP unit sizes and gather / reduce-scatter bytes and times, the compute time from the MFU
 * formula, tensor parallelism's all-reduces and its unsplit lm_head, a dp_shard group that
 * crosses hosts and a replicate group whose ranks share a host link, expert parallelism as the
 * trainer runs it (the all-to-all of each tp rank's block, the counts, the experts' FSDP group,
 * the router's tp sum; EP x TP inside and across hosts), overlap, the enumeration of meshes, and
 * the sentences for malformed --cluster values and meshes that do not fit the cluster. Every
 * expected number is written out from the shapes here, not taken from the program. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/steptime.h"

#define TINY                                                                                       \
    "--model.flavor=debugmodel", "--model.dim=32", "--model.n_layers=2", "--model.n_heads=4",      \
        "--model.n_kv_heads=2", "--model.head_dim=8", "--model.hidden_dim=64",                     \
        "--model.vocab_size=640", "--training.seq_len=32", "--training.local_batch_size=2",        \
        "--model.tokenizer_path=/nonexistent", "--training.dataset_path=/nonexistent.jsonl"

static const double V = 640, D = 32, L = 2, H = 4, E = 8, T = 32, N = 64; /* N = 2 x 32 */
/* Per layer: attention_norm D, wq H*E*D, wk and wv 2*E*D each... (kv heads 2), wo D*H*E,
 * q_norm and k_norm E, ffn_norm D, w1 w3 w2 3*F*D. */
static const double LAYER = 32 + 1024 + 512 + 512 + 1024 + 8 + 8 + 32 + 3 * 2048; /* 9296 */
static const double EDGE = 640 * 32 + 32; /* tied: embedding + final norm, 20512 */

static Cluster cluster(int hosts, int per_host) {
    return (Cluster){.hosts = hosts,
                     .per_host = per_host,
                     .peak_tflops = 1,
                     .compute_eff = 0.5,
                     .intra_gbs = 1,
                     .inter_gbs = 0.1,
                     .latency_us = 10,
                     .overlap = 0,
                     .gather_bytes = 4,
                     .mem_gib = 64};
}

static void load(JobConfig *cfg, char **argv, int argc) {
    Err err;
    int rc = config_load(cfg, NULL, argc, argv, &err);
    if (rc != 0) fail_msg("%s", err.msg);
}

static void near(double got, double want) {
    if (!(fabs(got - want) <= 1e-9 * fabs(want) + 1e-15))
        fail_msg("got %.12g, want %.12g", got, want);
}

static const StepCollective *find(const StepTime *s, const char *what) {
    for (int i = 0; i < s->ncoll; i++)
        if (strcmp(s->coll[i].what, what) == 0) return &s->coll[i];
    return NULL;
}

/* FLOPs per token by the MFU convention: 6 x matmul parameters + 12 x L x H x E x T. */
static double flops_per_token(void) {
    double matmul = L * (D * H * E + 2 * D * 2 * E + H * E * D + 3 * D * 64) + V * D;
    return 6 * matmul + 12 * L * H * E * T;
}

/* With no --gather-dtype the model moves what qtitan moves: under bf16 mixed precision each
 * layer whole in bf16 plus its four norms (D, D, E, E) in fp32, the tied edge unit (the
 * embedding's lookup reads fp32) in fp32; with a LoRA bf16 base a layer's matmul weights and the
 * embedding in bf16, the norms in fp32. */
static void test_gather_dtype_of_the_job(void **state) {
    (void)state;
    const double NORMS = 32 + 32 + 8 + 8, MATMUL = LAYER - NORMS;
    char *bf[] = {TINY, "--training.mixed_precision_param=bfloat16"};
    char *lora[] = {TINY, "--lora.rank=2", "--lora.base_dtype=bfloat16",
                    "--checkpoint.last_save_in_hf=false"};
    double want[2] = {EDGE * 4 + 2 * (LAYER * 2 + NORMS * 4),
                      (EDGE - 32) * 2 + 32 * 4 + 2 * (MATMUL * 2 + NORMS * 4)};
    for (int k = 0; k < 2; k++) {
        JobConfig cfg;
        if (k == 0)
            load(&cfg, bf, sizeof bf / sizeof bf[0]);
        else
            load(&cfg, lora, sizeof lora / sizeof lora[0]);
        Cluster c = cluster(1, 2);
        c.gather_bytes = 0;
        StepMesh m;
        Err err;
        assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
        StepTime s;
        assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
        const StepCollective *g = find(&s, "FSDP all-gather");
        assert_non_null(g);
        near(g->bytes * g->count, want[k]);
        config_free(&cfg);
    }
}

static void test_fsdp_one_host(void **state) {
    (void)state;
    char *argv[] = {TINY};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 2);
    StepMesh m;
    Err err;
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(m.shard, 2); /* data_parallel_shard_degree = -1 takes both ranks */
    StepTime s;
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    /* Units: the tied edge (gathered once: it stays gathered through backward) and two layers
     * (the last two layers are still gathered when backward starts): 3 gathers, 3
     * reduce-scatters, of EDGE + 2 LAYER floats each way. */
    double bytes = (EDGE + 2 * LAYER) * 4;
    const StepCollective *g = find(&s, "FSDP all-gather"), *r = find(&s, "FSDP reduce-scatter");
    assert_non_null(g);
    assert_non_null(r);
    near(g->count, 3);
    near(g->bytes * g->count, bytes);
    near(g->seconds, 3 * 10e-6 + 0.5 * bytes / 1e9);
    near(r->seconds, 3 * 10e-6 + 0.5 * bytes / 1e9);
    assert_false(g->cross_host);
    /* The gather workspaces: two layers and the edge, parameters and gradient, fp32. */
    near(s.plan.fsdp_workspace, (2 * LAYER + EDGE) * 8);
    /* Compute: one rank's 64 tokens at half of 1 TFLOP/s; nothing overlaps (overlap 0). */
    near(s.rank_flops, flops_per_token() * N);
    near(s.compute_s, flops_per_token() * N / 0.5e12);
    near(s.overlap_s, 0);
    near(s.exposed_s, 2 * (3 * 10e-6 + 0.5 * bytes / 1e9));
    near(s.step_s, s.compute_s + s.exposed_s);
    near(s.tokens_per_s, 2 * N / s.step_s);
    near(s.mfu, 100 * flops_per_token() * N / s.step_s / 1e12);

    /* Full overlap hides all but the first gather (the edge unit's). */
    c.overlap = 1;
    StepTime o;
    assert_int_equal(steptime_estimate(&o, &cfg, &m, &c, &err), 0);
    double first = 10e-6 + 0.5 * EDGE * 4 / 1e9, all = s.exposed_s;
    double hidden = all - first < o.compute_s ? all - first : o.compute_s;
    near(o.overlap_s, hidden);
    near(o.exposed_s, all - hidden);
    config_free(&cfg);
}

static void test_tp_and_hosts(void **state) {
    (void)state;
    char *argv[] = {TINY, "--parallelism.tensor_parallel_degree=2"};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 2);
    StepMesh m;
    StepTime s;
    Err err;
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    /* Two all-reduces of (N, D) fp32 per layer forward and two backward; no FSDP (shard 1). */
    const StepCollective *a = find(&s, "TP all-reduce");
    assert_non_null(a);
    assert_null(find(&s, "FSDP all-gather"));
    near(a->count, 8);
    near(a->bytes, N * D * 4);
    near(a->seconds, 2 * (8 * 10e-6 + 0.5 * 8 * N * D * 4 / 1e9));
    /* Each tp rank computes half of everything but lm_head, which it runs whole. */
    double head = 6 * V * D * N;
    near(s.rank_flops, (flops_per_token() * N - head) / 2 + head);
    /* q_norm's and k_norm's gradients (E floats each) summed over tp per layer. */
    const StepCollective *q = find(&s, "TP norm all-reduce");
    assert_non_null(q);
    near(q->count, 2 * L);
    near(q->bytes, E * 4);
    near(q->seconds, 2 * (4 * 10e-6 + 0.5 * 4 * E * 4 / 1e9));
    near(s.exposed_s, a->seconds + q->seconds);
    config_free(&cfg);

    /* Two more all-reduces for each layer backward recomputes: under full checkpointing all
     * but the last; layer-wise every 2nd of 4 layers, layer 2 (4 keeps its activations in the
     * shared set); every 2nd of 2, none. */
    static const struct {
        const char *ac, *layers;
        double count;
    } acs[] = {{"--activation_checkpoint.mode=full", "--model.n_layers=2", 4 * 2 + 2},
               {"--activation_checkpoint.selective_ac_option=2", "--model.n_layers=2", 4 * 2},
               {"--activation_checkpoint.selective_ac_option=2", "--model.n_layers=4", 4 * 4 + 2}};
    for (int i = 0; i < 3; i++) {
        char *ta[] = {TINY, "--parallelism.tensor_parallel_degree=2",
                      "--activation_checkpoint.mode=selective", (char *)acs[i].ac,
                      (char *)acs[i].layers};
        load(&cfg, ta, sizeof ta / sizeof ta[0]);
        assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
        assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
        a = find(&s, "TP all-reduce");
        assert_non_null(a);
        near(a->count, acs[i].count);
        config_free(&cfg);
    }

    /* With sequence parallelism the two layer norms' gradients (D floats) are summed too. */
    char *sq[] = {TINY, "--parallelism.tensor_parallel_degree=2",
                  "--parallelism.enable_sequence_parallel=true"};
    load(&cfg, sq, sizeof sq / sizeof sq[0]);
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    q = find(&s, "TP norm all-reduce");
    assert_non_null(q);
    near(q->count, 4 * L);
    near(q->bytes * q->count, L * 2 * (E + D) * 4);
    near(q->seconds, 2 * (8 * 10e-6 + 0.5 * L * 2 * (E + D) * 4 / 1e9));
    config_free(&cfg);

    /* FSDP over two hosts of one rank: the group's ring goes through the host link. */
    char *fs[] = {TINY};
    load(&cfg, fs, sizeof fs / sizeof fs[0]);
    c = cluster(2, 1);
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    const StepCollective *g = find(&s, "FSDP all-gather");
    assert_true(g && g->cross_host);
    near(g->seconds, 3 * 10e-6 + 0.5 * (EDGE + 2 * LAYER) * 4 / 0.1e9);
    config_free(&cfg);

    /* HSDP 2 x 2 on two hosts of two: the shard groups stay inside a host, the two replicate
     * groups each cross it, sharing its link (half of 0.1 GB/s each); the all-reduce moves
     * the gradient slice once per step. */
    char *hs[] = {TINY, "--parallelism.data_parallel_replicate_degree=2",
                  "--parallelism.data_parallel_shard_degree=2"};
    load(&cfg, hs, sizeof hs / sizeof hs[0]);
    c = cluster(2, 2);
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    g = find(&s, "FSDP all-gather");
    const StepCollective *h = find(&s, "HSDP all-reduce");
    assert_true(g && !g->cross_host);
    assert_true(h && h->cross_host);
    near(h->seconds, 2 * (10e-6 + 0.5 * s.plan.grads / 0.05e9));
    config_free(&cfg);
}

#define TINY_MOE                                                                                   \
    "--model.flavor=debugmodel_moe", "--model.dim=32", "--model.n_layers=2", "--model.n_heads=4",  \
        "--model.n_kv_heads=2", "--model.head_dim=8", "--model.vocab_size=640",                    \
        "--model.num_experts=4", "--model.top_k=2", "--model.moe_hidden_dim=16",                   \
        "--training.seq_len=32", "--training.local_batch_size=2"

/* The tiny MoE model: 2 MoE layers of 4 experts of 3 x 16 x 32 floats, top 2, N = 64 tokens
 * per rank. */
static const double EXPERT = 3 * 16 * 32, X = 4, K = 2;

static void test_expert_parallel(void **state) {
    (void)state;
    char *argv[] = {TINY_MOE};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 4);
    StepMesh m = {.rep = 1, .shard = 4, .tp = 1, .ep = 2, .ac = AC_NONE};
    StepTime s, f;
    Err err;
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    /* Per MoE layer: dispatch and combine forward, the gradients there and back backward, each
     * rank sending its N x top_k rows of D floats to the other rank of its pair; and once
     * per forward the per-expert row counts. */
    const StepCollective *a = find(&s, "EP all-to-all"), *k = find(&s, "EP all-to-all (counts)");
    assert_non_null(a);
    assert_non_null(k);
    near(a->count, 2 * 4);
    near(a->bytes, N * K * D * 4);
    near(a->seconds, 8 * (10e-6 + 0.5 * N * K * D * 4 / 1e9));
    near(k->count, 2);
    near(k->seconds, 2 * (10e-6 + 0.5 * X * 4 / 1e9));
    /* Each rank computes 2 of the 4 experts and keeps half of them: they are gathered over
     * the 2 ranks holding the same experts (ranks 2 apart), once per layer (the last two
     * layers stay gathered into backward), and reduce-scattered once. */
    const StepCollective *g = find(&s, "FSDP all-gather (experts)");
    const StepCollective *r = find(&s, "FSDP reduce-scatter (experts)");
    assert_non_null(g);
    assert_non_null(r);
    assert_int_equal(g->ranks, 2);
    assert_string_equal(g->group, "ep_shard");
    double xb = 2 * (X / 2 * EXPERT) * 4;
    near(g->bytes * g->count, xb);
    near(g->seconds, 2 * 10e-6 + 0.5 * xb / 1e9);
    near(r->seconds, 2 * 10e-6 + 0.5 * xb / 1e9);
    /* Without EP the experts are gathered whole with the layer, and no all-to-all runs. */
    m.ep = 1;
    assert_int_equal(steptime_estimate(&f, &cfg, &m, &c, &err), 0);
    assert_null(find(&f, "EP all-to-all"));
    assert_null(find(&f, "FSDP all-gather (experts)"));
    assert_true(f.mem_bytes > s.mem_bytes); /* larger gather workspaces */
    /* EP must be a multiple of tp whose dp_shard part divides dp_shard: training's sentence. */
    m.ep = 3;
    assert_int_equal(steptime_estimate(&f, &cfg, &m, &c, &err), -1);
    assert_non_null(strstr(err.msg, "expert_parallel_degree = 3 spans 3 data_parallel_shard"));
    config_free(&cfg);
}

/* EP x TP as qtitan runs it: the EP group is the tp pair (ep 2 = tp 2), each tp rank sending
 * its block of N / 2 tokens; the experts' FSDP group is the ranks with the same experts; the
 * router's gradient is summed over tp; across hosts the all-to-all goes through the host link. */
static void test_expert_tensor_parallel(void **state) {
    (void)state;
    char *argv[] = {TINY_MOE};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 4);
    StepMesh m = {.rep = 1, .shard = 2, .tp = 2, .ep = 2, .ac = AC_NONE};
    StepTime s;
    Err err;
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    const StepCollective *a = find(&s, "EP all-to-all");
    assert_non_null(a);
    assert_int_equal(a->ranks, 2);
    near(a->count, 8);
    near(a->bytes, N / 2 * K * D * 4);
    near(a->seconds, 8 * (10e-6 + 0.5 * N / 2 * K * D * 4 / 1e9));
    const StepCollective *r = find(&s, "TP router all-reduce");
    assert_non_null(r);
    near(r->count, 2);
    near(r->seconds, 2 * (2 * 10e-6 + 0.5 * 2 * X * D * 4 / 1e9));
    const StepCollective *t = find(&s, "TP all-reduce");
    assert_true(t && t->count == 8);
    const StepCollective *g = find(&s, "FSDP all-gather (experts)");
    assert_true(g && g->ranks == 2);
    near(g->bytes * g->count, 2 * (X / 2 * EXPERT) * 4);
    /* Experts and their tokens split over tp as well: each rank computes half of all but
     * lm_head. */
    double head = 6 * V * D * N;
    near(s.rank_flops, (s.plan.hw_flops_per_step - head) / 2 + head);

    /* EP 4 = 2 dp_shard ranks x tp 2 on two hosts of two: every rank keeps its experts whole
     * (no experts' FSDP), and half of each rank's rows leave its host: the host's two ranks
     * push N / 2 x top_k rows each through its link. */
    c = cluster(2, 2);
    m.ep = 4;
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    a = find(&s, "EP all-to-all");
    assert_true(a && a->cross_host && a->ranks == 4);
    double b = N / 2 * K * D * 4;
    near(a->seconds, 8 * (3 * 10e-6 + 2 * 0.5 * b / 0.1e9));
    assert_null(find(&s, "FSDP all-gather (experts)"));
    /* A MoE model under tp 2 needs EP: training's sentence. */
    m.ep = 1;
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), -1);
    assert_non_null(strstr(err.msg, "is not a multiple of parallelism.tensor_parallel_degree"));
    /* The enumeration offers EP x TP meshes. */
    StepTime best[64];
    int valid, n = steptime_enumerate(best, 64, &valid, &cfg, &c), found = 0;
    for (int i = 0; i < n; i++)
        found |= best[i].mesh.tp == 2 && best[i].mesh.ep >= 2;
    assert_true(found);
    config_free(&cfg);
}

/* LoRA on FSDP 2 x TP 2: the frozen base is gathered as before (the tied edge once, two layers)
 * but has no gradients to reduce-scatter or norms to sum; the adapters (wq and wv by default:
 * rank 2 x (32 + 32) and 2 x (32 + 16) per layer) are sharded like their base: a rank's
 * tensor-parallel blocks of them (wq column-split: all of A and half of B's rows, 2 x 32 +
 * 16 x 2; wv: 2 x 32 + 8 x 2) are gathered with their layer's unit, as often (once per
 * micro-batch here: both layers are still gathered when backward starts, as the base's count
 * has it), and their gradients reduce-scattered over the two FSDP ranks once per micro-batch;
 * the compute has no weight-gradient products for the base. */
static void test_lora(void **state) {
    (void)state;
    char *argv[] = {TINY, "--lora.rank=2", "--parallelism.tensor_parallel_degree=2"};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 4);
    StepMesh m;
    StepTime s;
    Err err;
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), 0);
    assert_int_equal(m.shard, 2);
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), 0);
    double adapters = L * (2 * (32 + 32) + 2 * (32 + 16)); /* 448 */
    near(s.plan.lora_numel, adapters);
    double blocks = L * ((2 * 32 + 16 * 2) + (2 * 32 + 8 * 2)); /* 352 */
    near(s.plan.lora_blocks, blocks);
    const StepCollective *r = find(&s, "LoRA reduce-scatter"), *ag = find(&s, "LoRA all-gather");
    assert_non_null(r);
    assert_non_null(ag);
    assert_int_equal(r->ranks, 2);
    near(r->count, s.plan.micro * L);
    near(r->bytes, blocks * 4 / L);
    near(ag->count, s.plan.micro * L);
    near(ag->bytes, blocks * 4 / L);
    assert_null(find(&s, "LoRA all-reduce"));
    assert_null(find(&s, "FSDP reduce-scatter"));
    assert_null(find(&s, "TP norm all-reduce"));
    assert_null(find(&s, "HSDP all-reduce"));
    const StepCollective *g = find(&s, "FSDP all-gather");
    assert_true(g && g->count == 3);
    /* Executed FLOPs: the convention's 6 per matmul parameter less the base's 2 of dW, plus 6
     * per adapter element; tp halves all but lm_head, which runs its forward and dX whole. */
    double matmul = L * (D * H * E + 2 * D * 2 * E + H * E * D + 3 * D * 64) + V * D;
    double hw = (flops_per_token() - 2 * matmul + 6 * adapters) * N, head = 4 * V * D * N;
    near(s.plan.hw_flops_per_step, hw);
    near(s.rank_flops, (hw - head) / 2 + head);
    config_free(&cfg);
}

static void test_enumerate(void **state) {
    (void)state;
    char *argv[] = {TINY};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    Cluster c = cluster(1, 2);
    StepTime best[16];
    int valid;
    /* [1,2,1] and [2,1,1], and tp 2 with and without sequence parallelism, each under four
     * checkpointing modes (none, selective, every 2nd layer, full). */
    int n = steptime_enumerate(best, 16, &valid, &cfg, &c);
    assert_int_equal(valid, 16);
    assert_int_equal(n, 16);
    for (int i = 1; i < n; i++)
        assert_true(best[i - 1].tokens_per_s >= best[i].tokens_per_s);
    /* Nothing fits: least memory first. */
    c.mem_gib = 1e-6;
    n = steptime_enumerate(best, 4, &valid, &cfg, &c);
    assert_int_equal(n, 4);
    for (int i = 1; i < n; i++)
        assert_true(best[i - 1].mem_bytes <= best[i].mem_bytes);
    config_free(&cfg);
}

static void expect_cluster_error(const char *text, const char *want) {
    int h = -1, g = -1;
    Err err;
    assert_int_equal(steptime_parse_cluster(text, &h, &g, &err), -1);
    if (!strstr(err.msg, want)) fail_msg("%s: %s", text, err.msg);
}

static void test_bad_input(void **state) {
    (void)state;
    int h, g;
    Err err;
    assert_int_equal(steptime_parse_cluster("2x8", &h, &g, &err), 0);
    assert_true(h == 2 && g == 8);
    const char *bad[] = {"",     "2",    "x8",     "2x",   "0x8",           "2x0",
                         "2x8x", "2 x8", "-1x8",   "2x8a", "99999999999x1", "2X8",
                         "+2x8", "2x+8", "65537x1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_cluster_error(bad[i], "expected HOSTSxGPUS");
    /* Each part in range, the product past what a mesh counts (it wrapped to negative
     * degrees); the largest product still parses. */
    expect_cluster_error("65536x65536", "65536 x 65536 = 4294967296 ranks, more than the 4194304");
    expect_cluster_error("32768x65536", "ranks, more than the 4194304");
    assert_int_equal(steptime_parse_cluster("65536x64", &h, &g, &err), 0);
    Cluster c = cluster(1, 2);
    c.compute_eff = 1.5;
    assert_int_equal(steptime_check_cluster(&c, &err), -1);
    assert_non_null(strstr(err.msg, "--eff 1.5: expected a number from"));
    c = cluster(1, 2);
    c.intra_gbs = 0;
    assert_int_equal(steptime_check_cluster(&c, &err), -1);
    assert_non_null(strstr(err.msg, "--intra-bw 0"));
    c = cluster(1, 2);
    c.overlap = NAN;
    assert_int_equal(steptime_check_cluster(&c, &err), -1);
    assert_non_null(strstr(err.msg, "--overlap"));

    /* The job's mesh against the cluster: 3 ranks of tp do not make 2 ranks. */
    char *argv[] = {TINY, "--parallelism.tensor_parallel_degree=3",
                    "--parallelism.data_parallel_shard_degree=1"};
    JobConfig cfg;
    load(&cfg, argv, sizeof argv / sizeof argv[0]);
    c = cluster(1, 2);
    StepMesh m;
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), -1);
    assert_non_null(strstr(err.msg, "1 x 1 x 3 = 3 does not match the cluster's 2 ranks"));
    config_free(&cfg);
    char *rest[] = {TINY, "--parallelism.data_parallel_replicate_degree=3"};
    load(&cfg, rest, sizeof rest / sizeof rest[0]);
    assert_int_equal(steptime_job_mesh(&m, &cfg, &c, &err), -1);
    assert_non_null(strstr(err.msg, "multiple of data_parallel_replicate_degree"));
    /* A mesh the model cannot split: tp 2 with 3 kv heads is training's own sentence. */
    config_free(&cfg);
    char *odd[] = {TINY, "--model.n_heads=3", "--model.n_kv_heads=3"};
    load(&cfg, odd, sizeof odd / sizeof odd[0]);
    StepTime s;
    m = (StepMesh){.rep = 1, .shard = 1, .tp = 2, .ep = 1, .ac = AC_NONE};
    assert_int_equal(steptime_estimate(&s, &cfg, &m, &c, &err), -1);
    assert_non_null(strstr(err.msg, "tensor_parallel_degree"));
    config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsdp_one_host),
        cmocka_unit_test(test_gather_dtype_of_the_job),
        cmocka_unit_test(test_tp_and_hosts),
        cmocka_unit_test(test_expert_parallel),
        cmocka_unit_test(test_expert_tensor_parallel),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_enumerate),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
