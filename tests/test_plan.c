/* `qtitan plan` (train/train_plan.h) on job configs: the parameter, gradient and optimizer
 * bytes equal a count written out by hand from the debugmodel's shapes (the flavor table in
 * src/core/model_spec.c), the FLOPs per step equal 6 x matmul parameters + attention per token
 * times the step's tokens, the total is the sum of its parts, FSDP sharding divides the per-rank
 * state, tensor and sequence parallelism shrink a rank's parameters and activations as counted by
 * hand, MoE models are planned, a LoRA run's merged export is counted on rank 0, and bad configs
 * fail with a sentence. */
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

#include "ops/gemm.h"
#include "train/train_plan.h"

static int plan(TrainPlan *p, int argc, char **argv, Err *err) {
    JobConfig cfg;
    if (config_load(&cfg, NULL, argc, argv, err) != 0) return -1;
    int rc = train_plan_compute(p, &cfg, err);
    config_free(&cfg);
    return rc;
}

static void test_debugmodel(void **state) {
    (void)state;
    char *argv[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                    "--training.seq_len=32", "--model.tokenizer_path=/nonexistent",
                    "--training.dataset_path=/nonexistent.jsonl"};
    TrainPlan p;
    Err err;
    assert_int_equal(plan(&p, 5, argv, &err), 0);
    /* debugmodel: dim 256, 8 layers, 16 heads, 8 kv heads, head_dim 128, ffn 3072, vocab 2048,
     * tied. Every tensor is a multiple of 16 floats, so the arena has no padding. */
    double D = 256, L = 8, HE = 16 * 128, KE = 8 * 128, E = 128, F = 3072, V = 2048;
    double layer_mm = D * HE * 2 + D * KE * 2 + 3 * D * F;
    double numel = V * D + L * (layer_mm + 2 * D + 2 * E) + D;
    assert_true(p.params == 4 * numel);
    assert_true(p.grads == 4 * numel);
    assert_true(p.optim == 8 * numel);
    double fpt = 6 * (L * layer_mm + V * D) + 12 * L * HE * 32;
    assert_true(p.flops_per_token == fpt);
    assert_true(p.flops_per_step == fpt * 3 * 32);
    assert_true(p.acts > 0 && p.baseline > 0);
    assert_true(p.tokenizer == 0 && p.dataset == 0); /* missing files count nothing */
    double sum =
        p.params + p.grads + p.optim + p.acts + p.workspace + p.tokenizer + p.dataset + p.baseline;
    assert_true(p.total == sum);
    assert_string_equal(p.ac, "none");

    /* Full checkpointing: fewer activations, more hardware FLOPs, same model FLOPs. */
    char *full[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                    "--training.seq_len=32", "--activation_checkpoint.mode=full"};
    TrainPlan f;
    assert_int_equal(plan(&f, 4, full, &err), 0);
    assert_true(f.acts < p.acts);
    assert_true(f.flops_per_step == p.flops_per_step);
    assert_true(f.hw_flops_per_step > f.flops_per_step);

    /* FSDP over 4 ranks: a quarter of the state per rank, activations unchanged. */
    char *fsdp[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                    "--training.seq_len=32", "--parallelism.data_parallel_shard_degree=4"};
    TrainPlan s;
    assert_int_equal(plan(&s, 4, fsdp, &err), 0);
    assert_true(s.params == p.params / 4 && s.optim == p.optim / 4);
    assert_true(s.acts == p.acts);
    assert_true(s.notes[0][0] != 0);

    /* A background checkpoint writer stages parameters and moments once more: 1.5x the
     * optimizer's two moments, and only with checkpoints on. */
    char *as[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                  "--training.seq_len=32", "--checkpoint.async_mode=async",
                  "--checkpoint.enable=true"};
    TrainPlan a;
    assert_int_equal(plan(&a, 5, as, &err), 0);
    assert_true(a.ckpt_staging == p.params + p.optim && a.ckpt_staging == 1.5 * p.optim);
    assert_true(a.total == p.total + a.ckpt_staging);
    assert_int_equal(plan(&a, 4, as, &err), 0); /* checkpoints off */
    assert_true(a.ckpt_staging == 0 && a.total == p.total);
}

static void test_moe(void **state) {
    (void)state;
    char *argv[] = {"--model.flavor=debugmodel_moe", "--training.local_batch_size=2",
                    "--training.seq_len=16"};
    TrainPlan p;
    Err err;
    assert_int_equal(plan(&p, 3, argv, &err), 0);
    /* debugmodel_moe: untied, 64 experts of ffn 768 in every layer, a router per layer. The
     * expert_bias buffers (64 per layer) sit in the parameter arena too. */
    double D = 256, L = 8, HE = 2048, KE = 1024, E = 128, V = 2048, X = 64, Fm = 768;
    double layer = D * HE * 2 + D * KE * 2 + X * D + 3 * X * Fm * D + 2 * D + 2 * E;
    double numel = 2 * V * D + L * layer + D;
    assert_true(p.params >= 4 * numel && p.params <= 4 * (numel + L * X) + 64 * 200);
    assert_true(p.acts > 0);
}

/* Tensor parallel over 2 ranks: a rank's parameters are its half of every attention and FFN
 * matrix plus the whole norms and embedding (counted by hand as above); sequence parallelism
 * keeps each layer's residual stream (x, xn1, xmid, xn2 and the two rstd) for half the
 * tokens. */
static void test_tensor_parallel(void **state) {
    (void)state;
    char *tp[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                  "--training.seq_len=32", "--parallelism.tensor_parallel_degree=2"};
    TrainPlan p, one;
    Err err;
    assert_int_equal(plan(&p, 4, tp, &err), 0);
    assert_int_equal(plan(&one, 3, tp, &err), 0);
    double D = 256, L = 8, HE = 16 * 128, KE = 8 * 128, E = 128, F = 3072, V = 2048;
    double layer_mm = D * HE * 2 + D * KE * 2 + 3 * D * F;
    assert_true(p.params == 4 * (V * D + L * (layer_mm / 2 + 2 * D + 2 * E) + D));
    assert_true(p.numel == one.numel);
    assert_true(p.acts < one.acts);
    assert_int_equal(p.tp, 2);
    assert_int_equal(p.sp, 0);

    /* Per layer (4 layers less 2 layers, halved), with and without sequence parallelism. */
    double per_layer[2];
    for (int sp = 0; sp < 2; sp++) {
        char *a[] = {"--model.flavor=debugmodel", "--training.local_batch_size=3",
                     "--training.seq_len=32",     "--parallelism.tensor_parallel_degree=2",
                     "--model.n_layers=4",        "--parallelism.enable_sequence_parallel=true"};
        TrainPlan four, two;
        assert_int_equal(plan(&four, 5 + sp, a, &err), 0);
        a[4] = "--model.n_layers=2";
        assert_int_equal(plan(&two, 5 + sp, a, &err), 0);
        assert_int_equal(four.sp, sp);
        per_layer[sp] = (four.acts - two.acts) / 2;
    }
    double n = 3 * 32 / 2;
    assert_true(per_layer[0] - per_layer[1] == 4 * (4 * n * D + 2 * n));
}

static void test_errors(void **state) {
    (void)state;
    TrainPlan p;
    Err err;
    char *moe[] = {"--model.flavor=debugmodel_moe", "--model.top_k=0"};
    assert_int_equal(plan(&p, 2, moe, &err), -1);
    assert_non_null(strstr(err.msg, "top_k"));
    char *flavor[] = {"--model.flavor=7B"};
    assert_int_equal(plan(&p, 1, flavor, &err), -1);
    char *seq[] = {"--model.flavor=debugmodel", "--training.seq_len=1000000"};
    assert_int_equal(plan(&p, 2, seq, &err), -1);
    char *sp[] = {"--model.flavor=debugmodel", "--training.seq_len=31",
                  "--parallelism.tensor_parallel_degree=2",
                  "--parallelism.enable_sequence_parallel=true"};
    assert_int_equal(plan(&p, 4, sp, &err), -1);
    assert_string_equal(err.msg, "training.seq_len (with parallelism.enable_sequence_parallel) = "
                                 "31 is not divisible by parallelism.tensor_parallel_degree = 2");
    char *moe_tp[] = {"--model.flavor=debugmodel_moe", "--parallelism.tensor_parallel_degree=2"};
    assert_int_equal(plan(&p, 2, moe_tp, &err), -1);
    assert_non_null(strstr(err.msg, "parallelism.expert_parallel_degree = 1 is not a multiple "
                                    "of parallelism.tensor_parallel_degree = 2"));
}

/* Expert parallelism: a rank computes X / ep experts of every MoE layer and keeps 1 / (dp_shard
 * x tp / ep) of them (FSDP over its replica's ranks holding the same experts) and 1/dp_shard of
 * the rest. So on FSDP 4 a rank keeps a quarter of the experts with EP 4 (X / 4, whole) and with
 * EP 2 (X / 2, halved), as without EP; on HSDP 2 x 2 with EP 2 half of them (replicas hold
 * copies), as plain HSDP; and under TP 2 x FSDP 2 a quarter with EP 2 as with EP 4. */
static void test_expert_parallel(void **state) {
    (void)state;
    Err err;
    TrainPlan fsdp, ep4, ep2, hsdp, hsdp_ep2, tp_ep2, tp_ep4;
#define MOE "--model.flavor=debugmodel_moe", "--training.seq_len=32"
#define SHARD(n) "--parallelism.data_parallel_shard_degree=" #n
#define EPD(n) "--parallelism.expert_parallel_degree=" #n
    char *a[] = {MOE, SHARD(4)};
    char *b[] = {MOE, SHARD(4), EPD(4)};
    char *c[] = {MOE, SHARD(4), EPD(2)};
    char *d[] = {MOE, "--parallelism.data_parallel_replicate_degree=2", SHARD(2)};
    char *e[] = {MOE, "--parallelism.data_parallel_replicate_degree=2", SHARD(2), EPD(2)};
    char *f[] = {MOE, "--parallelism.tensor_parallel_degree=2", SHARD(2), EPD(2)};
    char *g[] = {MOE, "--parallelism.tensor_parallel_degree=2", SHARD(2), EPD(4)};
    assert_int_equal(plan(&fsdp, 3, a, &err), 0);
    assert_int_equal(plan(&ep4, 4, b, &err), 0);
    assert_int_equal(plan(&ep2, 4, c, &err), 0);
    assert_int_equal(plan(&hsdp, 4, d, &err), 0);
    assert_int_equal(plan(&hsdp_ep2, 5, e, &err), 0);
    assert_int_equal(plan(&tp_ep2, 5, f, &err), 0);
    assert_int_equal(plan(&tp_ep4, 5, g, &err), 0);
#undef MOE
#undef SHARD
#undef EPD
    assert_true(fabs(ep4.params - fsdp.params) < 1e-6 * fsdp.params);
    assert_true(fabs(ep2.params - fsdp.params) < 1e-6 * fsdp.params);
    assert_true(fabs(hsdp_ep2.params - hsdp.params) < 1e-6 * hsdp.params);
    assert_true(fabs(hsdp_ep2.grads - hsdp.grads) < 1e-6 * hsdp.grads);
    assert_true(fabs(tp_ep2.params - tp_ep4.params) < 1e-6 * tp_ep4.params);
    /* debugmodel_moe: 8 layers of 64 experts, 3 x 768 x 256 floats each; the rest (attention,
     * router, embedding, head) is the same on both FSDP 4 meshes, so it cancels. */
    double experts = 8.0 * 64 * 3 * 768 * 256 * 4;
    assert_true(fabs((ep2.params - ep4.params)) < 1e-6 * experts);
    assert_true(fabs(ep2.optim - 2 * ep2.grads) < 1);
    /* The gather workspaces hold a layer's X / ep experts, not all of them. */
    assert_true(ep2.fsdp_workspace < fsdp.fsdp_workspace);
    assert_true(ep4.fsdp_workspace < ep2.fsdp_workspace);
}

/* bf16 mixed precision on FSDP 2: the layers are gathered in bf16 from each rank's bf16 copy of
 * its shard (2 bytes per shard element, in the workspace), into bf16 twins of the workspaces
 * (plus a bf16 receive buffer where the bf16 products widen, beside the widened twin), and only
 * their norms in fp32. */
static void test_bf16_fsdp(void **state) {
    (void)state;
    Err err;
    char *a[] = {"--model.flavor=debugmodel", "--training.seq_len=32",
                 "--parallelism.data_parallel_shard_degree=2",
                 "--training.mixed_precision_param=bfloat16"};
    TrainPlan p32, p16;
    assert_int_equal(plan(&p32, 3, a, &err), 0);
    assert_int_equal(plan(&p16, 4, a, &err), 0);
    PlanUnits u;
    train_plan_units(&u, &p16.spec, 1, 1);
    assert_true(p16.fsdp_workspace == train_plan_fsdp_workspace(&u, 2, 0, 0));
    double D = 256, HE = 16 * 128, KE = 8 * 128, F = 3072, V = 2048, L = 8;
    double layer = 2 * D + 2 * 128 + 2 * D * HE + 2 * D * KE + 3 * D * F, edge = V * D + D;
    double twin = gemm_bf16_widens() ? 4 + 2 : 2, norms = 2 * D + 2 * 128;
    /* the edge (the embedding's unit) gathered in fp32; a layer's fp32 matmul weights never */
    assert_true(
        fabs(p16.fsdp_workspace - (2 * norms + edge) * 4 - (2 * layer + edge) * (4 + twin)) < 1);
    double shard = (V * D + L * layer + D) / 2; /* a rank's elements */
    assert_true(p16.params == p32.params);
    assert_true(fabs(p16.workspace - p32.workspace -
                     (p16.fsdp_workspace - p32.fsdp_workspace + GEMM_BF16_SCRATCH_BYTES +
                      2 * shard)) < 64 * 64);
}

/* LoRA: AdamW state and gradients for the adapters (r (I + O) per targeted linear), none for
 * the frozen base; configs/qwen3_4b_lora.toml plans to at most 20 GiB at seq_len 2048. */
static void test_lora(void **state) {
    (void)state;
    TrainPlan p;
    Err err;
    char *argv[] = {"--model.flavor=debugmodel",
                    "--training.local_batch_size=2",
                    "--training.seq_len=32",
                    "--model.tokenizer_path=/nonexistent",
                    "--training.dataset_path=/nonexistent.jsonl",
                    "--lora.rank=4",
                    "--lora.targets=layers.*.attention.wq,layers.*.feed_forward.w2"};
    assert_int_equal(plan(&p, 7, argv, &err), 0);
    const ModelSpec *s = &p.spec;
    double per_layer = 4.0 * (s->dim + s->n_heads * s->head_dim) + 4.0 * (s->hidden_dim + s->dim);
    double adapters = per_layer * s->n_layers;
    assert_true(p.lora_numel == adapters);
    assert_true(p.optim == 2.0 * 4.0 * adapters);
    assert_true(p.grads == 4.0 * adapters);
    /* FSDP 2: half the frozen base per rank, half the adapters with their gradients and AdamW
     * state, gather workspaces without a gradient half for the base, and two layers' adapters
     * gathered with their gradients (and the reduce-scatter's scratch of one rank's half). */
    char *sharded[8];
    memcpy(sharded, argv, sizeof argv);
    sharded[7] = "--parallelism.data_parallel_shard_degree=2";
    TrainPlan p2;
    assert_int_equal(plan(&p2, 8, sharded, &err), 0);
    assert_true(p2.lora_numel == adapters);
    assert_true(p2.optim == p.optim / 2 && p2.grads == p.grads / 2);
    assert_true(fabs((p.params - 4.0 * adapters) - 2.0 * (p2.params - 2.0 * adapters)) < 64.0);
    assert_true(p.lora_workspace == 0);
    assert_true(p2.lora_workspace == 4.0 * (2 * 2 * per_layer + 2 * per_layer / 2));
    PlanUnits u;
    train_plan_units(&u, s, 1, 1);
    assert_true(p2.fsdp_workspace == train_plan_fsdp_workspace(&u, 0, 1, 0));
    assert_true(2.0 * p2.fsdp_workspace == train_plan_fsdp_workspace(&u, 0, 0, 0));
    /* TP 2: a rank keeps its blocks, B's half rows of the column-split wq with all of A, A's
     * half columns of the row-split w2 with all of B. */
    char *tp2[8];
    memcpy(tp2, argv, sizeof argv);
    tp2[7] = "--parallelism.tensor_parallel_degree=2";
    TrainPlan pt;
    assert_int_equal(plan(&pt, 8, tp2, &err), 0);
    double tp_layer =
        4.0 * (s->dim + s->n_heads * s->head_dim / 2) + 4.0 * (s->hidden_dim / 2 + s->dim);
    assert_true(pt.optim == 2.0 * 4.0 * tp_layer * s->n_layers);
    assert_true(pt.lora_workspace == 4.0 * (2 * 2 * tp_layer + 2 * tp_layer));
    /* A bf16 base on FSDP 2: the matmul weights and the embedding (tied) take 2 bytes per
     * parameter of a rank's half, the norms 4; the gather workspaces hold the former in bf16
     * (plus a widened fp32 copy where the bf16 products widen), the norms in fp32. */
    char *b16[9];
    memcpy(b16, sharded, sizeof sharded);
    b16[8] = "--lora.base_dtype=bfloat16";
    TrainPlan p2b;
    assert_int_equal(plan(&p2b, 9, b16, &err), 0);
    double D = s->dim, HE = (double)s->n_heads * s->head_dim,
           KE = (double)s->n_kv_heads * s->head_dim;
    double in_bf16 =
        s->vocab_size * D + s->n_layers * (2 * D * HE + 2 * D * KE + 3 * D * s->hidden_dim);
    double norms = s->n_layers * (2 * D + 2 * s->head_dim) + D;
    assert_true(s->tie_embeddings);
    assert_true(fabs((p2b.params - 2.0 * adapters) - (2.0 * in_bf16 + 4.0 * norms) / 2) <
                64.0 * 64);
    assert_true(fabs((p2.params - p2b.params) - in_bf16) < 64.0 * 64);
    double wide = gemm_bf16_widens() ? 4.0 : 0.0;
    double layer_mm = 2 * D * HE + 2 * D * KE + 3 * D * s->hidden_dim;
    assert_true(p2b.fsdp_workspace == train_plan_fsdp_workspace(&u, 0, 1, 1));
    assert_true(fabs(p2b.fsdp_workspace - (2 * layer_mm + s->vocab_size * D) * (2.0 + wide) -
                     (2 * (2 * D + 2 * s->head_dim) + D) * 4.0) < 1.0);

    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) return;
    char cfgpath[1024];
    snprintf(cfgpath, sizeof cfgpath, "%s/configs/qwen3_4b_lora.toml", src);
    JobConfig cfg;
    assert_int_equal(config_load(&cfg, cfgpath, 0, NULL, &err), 0);
    if (train_plan_compute(&p, &cfg, &err)) fail_msg("%s", err.msg);
    config_free(&cfg);
    printf("configs/qwen3_4b_lora.toml plans %.3f GiB\n", p.total / 1073741824.0);
    assert_int_equal(p.T, 2048);
    assert_true(p.total <= 20.0 * 1073741824.0);
}

/* [sample]: rank 0's KV cache counted for every prompt at its length in bytes plus
 * max_new_tokens; on many processes a whole copy, or one edge unit and one layer at a time,
 * the two differing by exactly the weights not held; the way named; "units" refused on one
 * process. */
static void test_samples(void **state) {
    (void)state;
    Err err;
    char *argv[] = {"--model.flavor=debugmodel",
                    "--training.local_batch_size=2",
                    "--training.seq_len=32",
                    "--model.tokenizer_path=/nonexistent",
                    "--training.dataset_path=/nonexistent.jsonl",
                    "--sample.freq=5",
                    "--sample.max_new_tokens=12",
                    "--sample.prompts=ab\ncdef",
                    "--parallelism.data_parallel_shard_degree=2",
                    "--sample.gather=whole"};
    TrainPlan one, whole, units, autop;
    assert_int_equal(plan(&one, 8, argv, &err), 0);
    assert_int_equal(one.sample_way, SAMPLE_OWN);
    /* 2 prompts of at most 4 bytes + 12 new tokens: 16 positions, keys and values per layer */
    double D = 256, L = 8, KE = 8 * 128, E = 128, F = 3072, V = 2048, HE = 16 * 128;
    double kv = 2 * L * 2 * 16 * KE * 4;
    assert_true(one.sample > kv && one.sample < kv + 8 * 1048576.0);
    double sum = one.params + one.grads + one.optim + one.acts + one.workspace + one.tokenizer +
                 one.dataset + one.baseline + one.sample;
    assert_true(one.total == sum);
    assert_int_equal(plan(&whole, 10, argv, &err), 0);
    assert_int_equal(whole.sample_way, SAMPLE_WHOLE);
    argv[9] = "--sample.gather=units";
    assert_int_equal(plan(&units, 10, argv, &err), 0);
    assert_int_equal(units.sample_way, SAMPLE_UNITWISE);
    double layer = D * HE * 2 + D * KE * 2 + 3 * D * F + 2 * D + 2 * E;
    double numel = V * D + L * layer + D, edge = V * D + D; /* tied: the norm with the embedding */
    assert_true(whole.sample - units.sample == 4 * (numel - edge - layer));
    assert_string_equal(train_plan_sample_way_name(units.sample_way), "one unit at a time");
    argv[9] = "--sample.gather=auto"; /* a few MiB fit any machine that runs the tests */
    assert_int_equal(plan(&autop, 10, argv, &err), 0);
    assert_int_equal(autop.sample_way, SAMPLE_WHOLE);
    assert_true(autop.total == whole.total);
    argv[8] = "--sample.gather=units";
    assert_int_equal(plan(&units, 9, argv, &err), -1);
    assert_non_null(strstr(err.msg, "sample.gather = \"units\" gathers the model from its shards "
                                    "one unit at a time, which needs more than one process"));
}

/* LoRA with checkpoint.last_save_in_hf: rank 0's merged export after training counted in the
 * total: the writer's output buffer and a chunk of 65536 floats; on FSDP 2 the targeted
 * weights of one layer (merged whole), never the whole model; on TP 2 every split weight of a
 * layer (its parts joined) and the largest one's gather. Without the export, nothing. */
static void test_merged_export(void **state) {
    (void)state;
    Err err;
    char *argv[] = {"--model.flavor=debugmodel",
                    "--training.local_batch_size=2",
                    "--training.seq_len=32",
                    "--model.tokenizer_path=/nonexistent",
                    "--training.dataset_path=/nonexistent.jsonl",
                    "--lora.rank=4",
                    "--lora.targets=layers.*.attention.wq,layers.*.feed_forward.w2",
                    "--checkpoint.enable=true",
                    "--checkpoint.last_save_in_hf=true",
                    "--parallelism.data_parallel_shard_degree=2"};
    double D = 256, KE = 8 * 128, F = 3072, HE = 16 * 128, writer = 1048576 + 4 * 65536;
    TrainPlan none, one, fsdp, tp;
    assert_int_equal(plan(&none, 7, argv, &err), 0);
    assert_true(none.merged_export == 0);
    assert_int_equal(plan(&one, 9, argv, &err), 0);
    assert_true(one.merged_export == writer);
    assert_int_equal(plan(&fsdp, 10, argv, &err), 0);
    assert_true(fsdp.merged_export == writer + 4 * (HE * D + D * F));
    /* A bf16 base's layer arrives in bf16: all its matmul weights are staged widened. */
    char *b16[11];
    memcpy(b16, argv, sizeof argv);
    b16[10] = "--lora.base_dtype=bfloat16";
    TrainPlan base16;
    assert_int_equal(plan(&base16, 11, b16, &err), 0);
    assert_true(base16.merged_export == writer + 4 * (2 * D * HE + 2 * D * KE + 3 * D * F));
    argv[9] = "--parallelism.tensor_parallel_degree=2";
    assert_int_equal(plan(&tp, 10, argv, &err), 0);
    assert_true(tp.merged_export == writer + 4 * (D * HE * 2 + D * KE * 2 + 3 * D * F + D * F));
    double sum = tp.params + tp.grads + tp.optim + tp.acts + tp.workspace + tp.tokenizer +
                 tp.dataset + tp.baseline + tp.sample + tp.merged_export;
    assert_true(tp.total == sum);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expert_parallel),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_bf16_fsdp),
        cmocka_unit_test(test_debugmodel),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_tensor_parallel),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_merged_export),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
