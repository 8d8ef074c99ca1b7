/* The rows of CompatKey (config_compat.h): torchtitan's keys without a JobConfig field here.
 * Reasons are one clause, printed after "has no effect here: " or after the refused value. */
#include "core/config_compat.h"

#include <string.h>

#define N(s, k, t, same, why)                                                                      \
    { s, k, t, same, COMPAT_NOTICE, why }
#define R(s, k, t, same, why)                                                                      \
    { s, k, t, same, COMPAT_REFUSE, why }

#define NO_PP                                                                                      \
    "it only applies with parallelism.pipeline_parallel_degree > 1, which qtitan does not have"
#define NO_CP                                                                                      \
    "it only applies with parallelism.context_parallel_degree > 1, which qtitan does not have"
#define NO_FT "it only applies with fault_tolerance.enable, which qtitan does not have"
#define NO_COMPILE                                                                                 \
    "qtitan has no graph compiler; its fused kernels are chosen with [[override]] "                \
    "(docs/kernels.md)"
#define NO_GC "qtitan is C: there is no garbage collector to schedule"
#define NO_WORKERS                                                                                 \
    "qtitan reads batches from its token cache in the training process; there are no loader "      \
    "workers"

const CompatKey CONFIG_COMPAT[] = {
    N("job", "config_file", 's', NULL,
      "a file cannot name another config file; give it with --config or --job.config_file"),
    N("job", "save_config_file", 's', NULL,
      "job.print_config = true prints the resolved config as TOML, and an HF export keeps it as "
      "job.toml"),
    R("job", "custom_config_module", 's', "\"\"",
      "qtitan has no Python modules to extend its config with"),
    N("job", "use_for_integration_test", 'b', "*", ""),

    N("profiling", "profiler_active", 'i', NULL,
      "each profiled step is traced whole; profile_freq picks the steps"),
    N("profiling", "profiler_warmup", 'i', NULL, "qtitan's trace needs no warm-up steps"),
    N("profiling", "enable_memory_snapshot", 'b', "false",
      "qtitan allocates its arenas before the first step; `qtitan plan` prints them by part"),
    N("profiling", "save_memory_snapshot_folder", 's', NULL,
      "qtitan writes no memory snapshots (profiling.enable_memory_snapshot)"),

    N("metrics", "disable_color_printing", 'b', "true", "qtitan's log has no colors"),
    R("metrics", "enable_wandb", 'b', "false",
      "qtitan does not log to Weights & Biases; use metrics.enable_tensorboard or "
      "DUMP/metrics.jsonl"),
    N("metrics", "wandb_project", 's', NULL, "qtitan does not log to Weights & Biases"),
    N("metrics", "wandb_run_name", 's', NULL, "qtitan does not log to Weights & Biases"),

    N("model", "print_after_conversion", 'b', "false",
      "LoRA, the one converter, logs its adapters in one line, and kernel replacements are logged "
      "one line each"),

    N("optimizer", "implementation", 's', NULL,
      "qtitan runs Adam and AdamW as one fused loop over each parameter shard"),
    N("optimizer", "early_step_in_backward", 'b', "false",
      "qtitan steps after the whole backward, so gradients can be clipped by their total norm"),

    N("training", "enable_cpu_offload", 'b', "false",
      "parameters, gradients and optimizer state already live in host memory"),
    R("training", "dtype", 's', "\"float32\"",
      "training entirely in bfloat16 (no float32 master weights) is not available; "
      "training.mixed_precision_param = \"bfloat16\" keeps float32 masters"),
    R("training", "mixed_precision_reduce", 's', "\"float32\"",
      "gradients are reduced in float32 only"),
    N("training", "gc_freq", 'i', NULL, NO_GC),
    N("training", "gc_debug", 'b', "false", NO_GC),
    N("training", "max_steps", 'i', NULL, "qtitan's schedule spans training.steps"),
    N("training", "compile", 'b', "false", NO_COMPILE),
    N("training.dataloader", "num_workers", 'i', "0", NO_WORKERS),
    N("training.dataloader", "persistent_workers", 'b', "false", NO_WORKERS),
    N("training.dataloader", "pin_memory", 'b', "false", "there is no device memory to pin for"),
    N("training.dataloader", "prefetch_factor", 'i', NULL, NO_WORKERS),
    N("validation.dataloader", "num_workers", 'i', "0", NO_WORKERS),
    N("validation.dataloader", "persistent_workers", 'b', "false", NO_WORKERS),
    N("validation.dataloader", "pin_memory", 'b', "false", "there is no device memory to pin for"),
    N("validation.dataloader", "prefetch_factor", 'i', NULL, NO_WORKERS),

    N("parallelism", "fsdp_reshard_after_forward", 's', "\"default\"|\"always\"",
      "qtitan's FSDP always frees a layer's gathered weights after its forward and gathers them "
      "again for backward"),
    N("parallelism", "disable_loss_parallel", 'b', "false",
      "the loss is computed where the tokens are, with or without sequence parallel"),
    N("parallelism", "enable_async_tensor_parallel", 'b', "false",
      "tensor-parallel collectives are not overlapped with matmuls (torchtitan also needs compile "
      "for this)"),
    N("parallelism", "enable_compiled_autograd", 'b', "false", NO_COMPILE),
    R("parallelism", "pipeline_parallel_degree", 'i', "1",
      "qtitan has no pipeline parallelism; use data_parallel_shard_degree and "
      "tensor_parallel_degree"),
    N("parallelism", "pipeline_parallel_split_points", 'l', "[]", NO_PP),
    N("parallelism", "module_fqns_per_model_part", 'l', NULL, NO_PP),
    N("parallelism", "pipeline_parallel_first_stage_less_layers", 'i', "1", NO_PP),
    N("parallelism", "pipeline_parallel_last_stage_less_layers", 'i', "1", NO_PP),
    N("parallelism", "pipeline_parallel_layers_per_stage", 'i', NULL, NO_PP),
    N("parallelism", "pipeline_parallel_schedule", 's', "\"1F1B\"", NO_PP),
    N("parallelism", "pipeline_parallel_schedule_csv", 's', "\"\"", NO_PP),
    N("parallelism", "pipeline_parallel_microbatch_size", 'i', "1", NO_PP),
    N("parallelism", "pipeline_parallel_expert_parallel_overlap", 'b', "true", NO_PP),
    R("parallelism", "context_parallel_degree", 'i', "1",
      "qtitan has no context parallelism; parallelism.enable_sequence_parallel splits the tokens "
      "of norms and the loss within the tensor-parallel group"),
    N("parallelism", "context_parallel_load_balancer", 's', "\"headtail\"", NO_CP),
    N("parallelism", "context_parallel_rotate_method", 's', "\"allgather\"", NO_CP),
    R("parallelism", "expert_tensor_parallel_degree", 'i', "1",
      "qtitan's expert parallelism keeps every expert whole on one rank of the expert-parallel "
      "group (tensor parallelism is not applied inside experts)"),
    R("parallelism", "expert_parallel_comm_backend", 's', "\"standard\"",
      "tokens move between expert-parallel ranks with the communicator's all-to-all; there is "
      "no DeepEP"),

    N("checkpoint", "enable_ft_dataloader_checkpoints", 'b', "true", NO_FT),
    N("checkpoint", "initial_load_in_hf_quantized", 'b', "false",
      "fp8 block-quantized HF weights (F8_E4M3 with their weight_scale_inv, declared by the "
      "quantization_config of the config.json beside them) are read dequantized whether or not "
      "it is set"),
    R("checkpoint", "create_seed_checkpoint", 'b', "false",
      "every rank initializes the same weights from training.seed, so no seed checkpoint is "
      "needed"),
    N("checkpoint", "skip_last_save", 'b', "false",
      "the last step is always saved when checkpoint.enable is set"),

    N("activation_checkpoint", "per_op_sac_force_recompute_mm_shapes_by_fqns", 'l', NULL,
      "qtitan's op-level selective mode (selective_ac_option = \"op\") keeps the output of every "
      "matmul and attention and recomputes the norms and RoPE (docs/model.md, Memory); which "
      "matmuls it recomputes is not selectable"),
    N("activation_checkpoint", "early_stop", 'b', "false",
      "recomputation covers one layer at a time"),
    N("activation_checkpoint", "memory_budget", 'n', NULL,
      "activation_checkpoint.mode = \"memory_budget\" needs torch.compile, which qtitan does not "
      "have"),
    N("activation_checkpoint", "visualize_memory_budget_pareto", 'b', "false",
      "activation_checkpoint.mode = \"memory_budget\" is not available"),
    N("activation_checkpoint", "preserve_rng_state", 'b', "*", ""),
    N("activation_checkpoint", "determinism_check", 's', NULL,
      "recomputation is bitwise identical to the first forward (the forward draws no random "
      "numbers)"),
    N("activation_checkpoint", "debug", 'b', "false", "qtitan's recomputation has no debug mode"),

    N("compile", "enable", 'b', "false", NO_COMPILE),
    N("compile", "components", 'l', NULL, NO_COMPILE),
    N("compile", "backend", 's', NULL, NO_COMPILE),

    N("quantize.linear.float8", "enable_fsdp_float8_all_gather", 'b', "false", COMPAT_NO_FP8),
    N("quantize.linear.float8", "precompute_float8_dynamic_scale_for_fsdp", 'b', "false",
      COMPAT_NO_FP8),
    N("quantize.linear.float8", "force_recompute_fp8_weight_in_bwd", 'b', "false", COMPAT_NO_FP8),
    N("quantize.linear.float8", "recipe_name", 's', NULL, COMPAT_NO_FP8),
    N("quantize.linear.float8", "filter_fqns", 'l', NULL, COMPAT_NO_FP8),
    N("quantize.linear.float8", "emulate", 'b', "false", COMPAT_NO_FP8),
    N("quantize.linear.mx", "mxfp8_dim1_cast_kernel_choice", 's', NULL, COMPAT_NO_FP8),
    N("quantize.linear.mx", "recipe_name", 's', NULL, COMPAT_NO_FP8),
    N("quantize.linear.mx", "filter_fqns", 'l', NULL, COMPAT_NO_FP8),
    N("quantize.grouped_mm.float8", "fqns", 'l', "[]", COMPAT_NO_FP8),
    /* The same keys under their sections' names before torchtitan's [quantize] (2025). */
    N("float8", "enable_fsdp_float8_all_gather", 'b', "false", COMPAT_NO_FP8),
    N("float8", "precompute_float8_dynamic_scale_for_fsdp", 'b', "false", COMPAT_NO_FP8),
    N("float8", "force_recompute_fp8_weight_in_bwd", 'b', "false", COMPAT_NO_FP8),
    N("float8", "recipe_name", 's', NULL, COMPAT_NO_FP8),
    N("float8", "filter_fqns", 'l', NULL, COMPAT_NO_FP8),
    N("float8", "emulate", 'b', "false", COMPAT_NO_FP8),
    N("float8", "moe_fqns_prototype", 'l', "[]", COMPAT_NO_FP8),
    N("mx", "mxfp8_dim1_cast_kernel_choice", 's', NULL, COMPAT_NO_FP8),
    N("mx", "recipe_name", 's', NULL, COMPAT_NO_FP8),
    N("mx", "filter_fqns", 'l', NULL, COMPAT_NO_FP8),
    N("quantize.grouped_mm.mx", "recipe_name", 's', NULL, COMPAT_NO_FP8),
    N("quantize.grouped_mm.mx", "fqns", 'l', "[]", COMPAT_NO_FP8),

    N("comm", "trace_buf_size", 'i', NULL,
      "qtitan has no collective flight recorder; a stuck collective ends the run with a sentence "
      "(docs/distributed.md)"),
    N("comm", "save_traces_folder", 's', NULL, "qtitan has no collective flight recorder"),
    N("comm", "save_traces_file_prefix", 's', NULL, "qtitan has no collective flight recorder"),
    R("comm", "mode", 's', "\"default\"",
      "qtitan has no fake or local-tensor communicator; `qtitan plan` checks a job without running "
      "it"),

    N("memory_estimation", "enable", 'b', "false",
      "`qtitan plan` prints the memory per rank by part without training"),
    N("memory_estimation", "enabled", 'b', "false",
      "`qtitan plan` prints the memory per rank by part without training"),
    N("memory_estimation", "disable_fake_mode", 'b', NULL,
      "`qtitan plan` prints the memory per rank by part without training"),

    R("fault_tolerance", "enable", 'b', "false",
      "qtitan has no TorchFT integration; a failed rank stops the run and it resumes from the last "
      "checkpoint"),
    N("fault_tolerance", "process_group", 's', NULL, NO_FT),
    N("fault_tolerance", "process_group_timeout_ms", 'i', NULL, NO_FT),
    N("fault_tolerance", "replica_id", 'i', NULL, NO_FT),
    N("fault_tolerance", "group_size", 'i', NULL, NO_FT),
    N("fault_tolerance", "min_replica_size", 'i', NULL, NO_FT),
    N("fault_tolerance", "semi_sync_method", 's', NULL, NO_FT),
    N("fault_tolerance", "sync_steps", 'i', NULL, NO_FT),
    N("fault_tolerance", "should_quantize", 'b', NULL, NO_FT),
    N("fault_tolerance", "fragment_sync_delay", 'i', NULL, NO_FT),
    N("fault_tolerance", "fragment_update_alpha", 'n', NULL, NO_FT),

    R("experimental", "custom_import", 's', "\"\"", "qtitan has no Python modules to import"),
    R("experimental", "custom_args_module", 's', "\"\"",
      "qtitan has no Python modules to extend its config with"),

    N("debug", "deterministic_warn_only", 'b', "*", ""),
};
const int CONFIG_COMPAT_N = (int)(sizeof CONFIG_COMPAT / sizeof CONFIG_COMPAT[0]);

const CompatKey *config_compat_find(const char *section, const char *key) {
    for (int i = 0; i < CONFIG_COMPAT_N; i++)
        if (strcmp(CONFIG_COMPAT[i].section, section) == 0 &&
            strcmp(CONFIG_COMPAT[i].key, key) == 0)
            return &CONFIG_COMPAT[i];
    return NULL;
}
