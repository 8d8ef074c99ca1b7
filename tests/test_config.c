/* Unit tests for the job config: defaults, file + command-line precedence, suggestion and
 * type/range/enum errors with file:line, model field replacements and [[override]] entries
 * kept with their lines, dataset path resolution, the dump round trip, every
 * configs/ TOML file in the repository loading cleanly, docs/config.md listing every key
 * with the code's default, and torchtitan's keys: each known, with notices and refusals by
 * value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/fs.h"

/* Writes text to a fresh temporary file; path must hold 64 bytes. */
static void write_tmp(char *path, const char *text) {
    strcpy(path, "/tmp/qt_test_config_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
}

/* Loads text (as a file) plus argv; returns config_load's status and fills err. */
static int load(JobConfig *cfg, const char *text, int argc, char **argv, Err *err, char *path_out) {
    char path[64];
    write_tmp(path, text);
    int rc = config_load(cfg, path, argc, argv, err);
    if (path_out) strcpy(path_out, path);
    unlink(path);
    return rc;
}

static void load_ok(JobConfig *cfg, const char *text, int argc, char **argv) {
    Err err = {{0}};
    if (load(cfg, text, argc, argv, &err, NULL) != 0) fail_msg("unexpected error: %s", err.msg);
}

/* The error must equal "<tmpfile>:<rest>" exactly, so tests pin the whole sentence. */
static void expect_file_error(const char *text, int argc, char **argv, const char *rest) {
    JobConfig cfg;
    Err err = {{0}};
    char path[64];
    if (load(&cfg, text, argc, argv, &err, path) == 0) {
        config_free(&cfg);
        fail_msg("expected an error for: %s", text);
    }
    char want[1024];
    snprintf(want, sizeof want, "%s:%s", path, rest);
    assert_string_equal(err.msg, want);
}

static void expect_error_contains(const char *text, int argc, char **argv, const char *frag) {
    JobConfig cfg;
    Err err = {{0}};
    if (load(&cfg, text, argc, argv, &err, NULL) == 0) {
        config_free(&cfg);
        fail_msg("expected an error for: %s", text);
    }
    if (!strstr(err.msg, frag)) fail_msg("error '%s' lacks '%s'", err.msg, frag);
    /* A failed load leaves a zeroed config that config_free accepts. */
    config_free(&cfg);
}

static void test_defaults(void **state) {
    (void)state;
    JobConfig c;
    Err err = {{0}};
    assert_int_equal(config_load(&c, NULL, 0, NULL, &err), 0);
    assert_string_equal(c.job.dump_folder, "./outputs");
    assert_string_equal(c.model.name, "qwen3");
    assert_string_equal(c.model.flavor, "debugmodel");
    assert_string_equal(c.model.hf_assets_path, "");
    assert_string_equal(c.model.tokenizer_path, "");
    assert_int_equal(c.model.n_fields, 0);
    assert_int_equal(c.optimizer.name, OPTIMIZER_ADAMW);
    assert_true(c.optimizer.lr == 8e-4);
    assert_true(c.optimizer.eps == 1e-8);
    assert_true(c.optimizer.beta1 == 0.9);
    assert_true(c.optimizer.beta2 == 0.95);
    assert_true(c.optimizer.weight_decay == 0.1);
    assert_int_equal(c.optimizer.exempt_norms_and_embeddings, 0);
    assert_int_equal(c.lr_scheduler.warmup_steps, 200);
    assert_true(c.lr_scheduler.decay_ratio < 0);
    assert_int_equal(c.lr_scheduler.decay_type, DECAY_LINEAR);
    assert_true(c.lr_scheduler.min_lr_factor == 0.0);
    assert_int_equal(c.training.local_batch_size, 8);
    assert_int_equal(c.training.global_batch_size, -1);
    assert_int_equal(c.training.seq_len, 2048);
    assert_int_equal(c.training.steps, 10000);
    assert_true(c.training.max_norm == 1.0);
    assert_string_equal(c.training.dataset, "c4_test");
    assert_string_equal(c.training.dataset_path, "");
    assert_int_equal(c.training.seed, 0);
    assert_int_equal(c.training.deterministic, 0);
    assert_int_equal(c.training.mixed_precision_param, DT_F32);
    assert_int_equal(c.training.device, DEVICE_CPU);
    assert_int_equal(c.training.document_mask, 1);
    assert_int_equal(c.training.skip_nonfinite, 0);
    assert_int_equal(c.parallelism.data_parallel_replicate_degree, 1);
    assert_int_equal(c.parallelism.data_parallel_shard_degree, -1);
    assert_int_equal(c.parallelism.tensor_parallel_degree, 1);
    assert_int_equal(c.parallelism.enable_sequence_parallel, 0);
    assert_int_equal(c.checkpoint.enable, 0);
    assert_string_equal(c.checkpoint.folder, "checkpoint");
    assert_int_equal(c.checkpoint.interval, 500);
    assert_int_equal(c.checkpoint.keep_latest_k, 10);
    assert_string_equal(c.checkpoint.initial_load_path, "");
    assert_int_equal(c.checkpoint.initial_load_in_hf, 0);
    assert_int_equal(c.checkpoint.last_save_in_hf, 0);
    assert_int_equal(c.checkpoint.last_save_model_only, 0);
    assert_int_equal(c.checkpoint.export_dtype, DT_F32);
    assert_int_equal(c.activation_checkpoint.mode, AC_NONE);
    assert_int_equal(c.metrics.log_freq, 1);
    assert_true(c.metrics.peak_tflops == 0.0);
    assert_int_equal(c.n_overrides, 0);
    assert_string_equal(c.path, "");
    config_free(&c);
}

static void test_file_values(void **state) {
    (void)state;
    JobConfig c;
    load_ok(&c,
            "[job]\ndescription = \"x\"\n"
            "[optimizer]\nname = \"Adam\"\nlr = 1  # an integer where a float is expected\n"
            "beta2 = 0.999\n"
            "[lr_scheduler]\ndecay_ratio = 0.2\ndecay_type = \"cosine\"\n"
            "[training]\nseq_len = 256\nmixed_precision_param = \"bfloat16\"\ndevice = \"auto\"\n"
            "seed = 1234567890123\ndataset_path = \"/data/x.jsonl\"\n"
            "[checkpoint]\nenable = true\nexport_dtype = \"float16\"\n"
            "[activation_checkpoint]\nmode = \"selective\"\n",
            0, NULL);
    assert_string_equal(c.job.description, "x");
    assert_int_equal(c.optimizer.name, OPTIMIZER_ADAM);
    assert_true(c.optimizer.lr == 1.0);
    assert_true(c.optimizer.beta2 == 0.999);
    assert_true(c.lr_scheduler.decay_ratio == 0.2);
    assert_int_equal(c.lr_scheduler.decay_type, DECAY_COSINE);
    assert_int_equal(c.training.seq_len, 256);
    assert_int_equal(c.training.mixed_precision_param, DT_BF16);
    assert_int_equal(c.training.device, DEVICE_AUTO);
    assert_true(c.training.seed == 1234567890123LL);
    assert_int_equal(c.checkpoint.enable, 1);
    assert_int_equal(c.checkpoint.export_dtype, DT_F16);
    assert_int_equal(c.activation_checkpoint.mode, AC_SELECTIVE);
    /* Dotted keys at the top level are the same as sections. */
    config_free(&c);
    load_ok(&c, "training.steps = 7\n", 0, NULL);
    assert_int_equal(c.training.steps, 7);
    config_free(&c);
}

static void test_command_line_wins(void **state) {
    (void)state;
    JobConfig c;
    char *argv[] = {"--training.steps=20",
                    "--optimizer.lr",
                    "3e-4",
                    "--checkpoint.enable",
                    "--model.n_layers=2",
                    "--model.flavor",
                    "debugmodel_moe",
                    "--training.dataset_path=/tmp/a b.jsonl",
                    "--training.seed=-0",
                    "--job.description=\"quoted\"",
                    "--metrics.peak_tflops=100"};
    load_ok(&c,
            "[training]\nsteps = 5\n[optimizer]\nlr = 1e-3\n[checkpoint]\nenable = false\n"
            "[model]\nn_layers = 4\ntop_k = 2\n",
            11, argv);
    assert_int_equal(c.training.steps, 20);
    assert_true(c.optimizer.lr == 3e-4);
    assert_int_equal(c.checkpoint.enable, 1);
    assert_string_equal(c.model.flavor, "debugmodel_moe");
    assert_string_equal(c.training.dataset_path, "/tmp/a b.jsonl");
    assert_string_equal(c.job.description, "quoted");
    assert_true(c.metrics.peak_tflops == 100.0);
    /* n_layers keeps its place; the command line replaced its value and line. */
    assert_int_equal(c.model.n_fields, 2);
    assert_string_equal(c.model.fields[0].field, "n_layers");
    assert_string_equal(c.model.fields[0].value, "2");
    assert_int_equal(c.model.fields[0].line, 0);
    assert_string_equal(c.model.fields[1].field, "top_k");
    assert_string_equal(c.model.fields[1].value, "2");
    assert_int_equal(c.model.fields[1].line, 9);
    config_free(&c);

    /* --config inside argv, bool flag followed by another option, --key value. */
    char path[64];
    write_tmp(path, "[training]\nsteps = 5\n");
    char cfgopt[80];
    snprintf(cfgopt, sizeof cfgopt, "--config=%s", path);
    char *argv2[] = {"--checkpoint.enable",
                     "--training.seq_len",
                     "64",
                     cfgopt,
                     "--parallelism.data_parallel_shard_degree",
                     "-1"};
    Err err = {{0}};
    assert_int_equal(config_load(&c, NULL, 6, argv2, &err), 0);
    assert_int_equal(c.training.steps, 5);
    assert_int_equal(c.training.seq_len, 64);
    assert_int_equal(c.checkpoint.enable, 1);
    assert_string_equal(c.path, path);
    config_free(&c);
    char *argv3[] = {"--config", path, "--checkpoint.enable=false"};
    assert_int_equal(config_load(&c, NULL, 3, argv3, &err), 0);
    assert_int_equal(c.checkpoint.enable, 0);
    config_free(&c);
    unlink(path);
}

static void test_command_line_errors(void **state) {
    (void)state;
    JobConfig c;
    Err err = {{0}};
    char *a1[] = {"--training.local_bach_size=4"};
    assert_int_equal(config_load(&c, NULL, 1, a1, &err), -1);
    assert_string_equal(err.msg, "command line: unknown key \"local_bach_size\" in [training]; "
                                 "did you mean \"local_batch_size\"?");
    char *a2[] = {"--trainig.steps=4"};
    assert_int_equal(config_load(&c, NULL, 1, a2, &err), -1);
    assert_string_equal(err.msg,
                        "command line: unknown section [trainig]; did you mean [training]?");
    char *a3[] = {"--training.steps=abc"};
    assert_int_equal(config_load(&c, NULL, 1, a3, &err), -1);
    assert_string_equal(err.msg, "command line: training.steps = \"abc\" has the wrong type (a "
                                 "string); expected an integer >= 1");
    char *a4[] = {"--training.steps"};
    assert_int_equal(config_load(&c, NULL, 1, a4, &err), -1);
    assert_string_equal(err.msg, "command line: --training.steps needs a value");
    char *a5[] = {"steps=4"};
    assert_int_equal(config_load(&c, NULL, 1, a5, &err), -1);
    assert_non_null(strstr(err.msg, "unexpected argument \"steps=4\""));
    char *a6[] = {"--override.target=x"};
    assert_int_equal(config_load(&c, NULL, 1, a6, &err), -1);
    assert_non_null(strstr(err.msg, "only be given in a config file"));
    char *a7[] = {"--model.n_layer=2"};
    assert_int_equal(config_load(&c, NULL, 1, a7, &err), -1);
    assert_string_equal(err.msg, "command line: unknown key \"n_layer\" in [model]; did you mean "
                                 "\"n_layers\"?");
    char *a8[] = {"--model.n_layers=two"};
    assert_int_equal(config_load(&c, NULL, 1, a8, &err), -1);
    assert_non_null(strstr(err.msg, "model.n_layers = \"two\" has the wrong type"));
    expect_file_error(
        "[model]\nrope_scaling = 3\n", 0, NULL,
        "2: model.rope_scaling = 3 has the wrong type (an integer); expected a string");
    expect_file_error("[model]\nrope_scaling = \"ntk\"\n", 0, NULL,
                      "2: model field rope_scaling = \"ntk\" is not one of \"none\", \"linear\", "
                      "\"yarn\"");
    char *a9[] = {"--training.device=gpu"};
    assert_int_equal(config_load(&c, NULL, 1, a9, &err), -1);
    assert_string_equal(err.msg, "command line: training.device = \"gpu\" is not allowed; "
                                 "expected one of \"cpu\", \"cuda\", \"auto\"");
    char *a10[] = {"--config"};
    assert_int_equal(config_load(&c, NULL, 1, a10, &err), -1);
    assert_non_null(strstr(err.msg, "--config needs a file name"));
    char *a11[] = {"--config=/nonexistent/qt.toml"};
    assert_int_equal(config_load(&c, NULL, 1, a11, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/qt.toml"));
    char *a12[] = {"--model.norm_eps=1e-5x"};
    assert_int_equal(config_load(&c, NULL, 1, a12, &err), -1);
    /* Only one file is read: a second --config must not be silently ignored. */
    char *a13[] = {"--config", "a.toml", "--config=b.toml"};
    assert_int_equal(config_load(&c, NULL, 3, a13, &err), -1);
    assert_string_equal(err.msg, "command line: --config is given twice (a.toml, then b.toml); a "
                                 "run reads one config file");
}

static void test_unknown_names(void **state) {
    (void)state;
    expect_file_error("[training]\nsteps = 3\n\n# c\nlocal_bach_size = 4\n", 0, NULL,
                      "5: unknown key \"local_bach_size\" in [training]; did you mean "
                      "\"local_batch_size\"?");
    expect_file_error("[job]\n[trainig]\nsteps = 3\n", 0, NULL,
                      "2: unknown section [trainig]; did you mean [training]?");
    expect_file_error("[xyzzyxyzzyxyzzy]\n", 0, NULL, "1: unknown section [xyzzyxyzzyxyzzy]");
    expect_file_error("[model]\nn_layer = 3\n", 0, NULL,
                      "2: unknown key \"n_layer\" in [model]; did you mean \"n_layers\"?");
    expect_file_error("[model]\nflavr = \"0.6B\"\n", 0, NULL,
                      "2: unknown key \"flavr\" in [model]; did you mean \"flavor\"?");
    expect_file_error("[training.sub]\nx = 1\n", 0, NULL,
                      "1: unknown key \"sub\" in [training]; did you mean \"seed\"?");
    expect_file_error("training = 5\n", 0, NULL,
                      "1: training must be a table ([training]), not an "
                      "integer");
}

static void test_type_and_range_errors(void **state) {
    (void)state;
    expect_file_error("[training]\nseq_len = -5\n", 0, NULL,
                      "2: training.seq_len = -5 is out of range; expected an integer >= 1");
    expect_file_error("[training]\nseq_len = \"128\"\n", 0, NULL,
                      "2: training.seq_len = \"128\" has the wrong type (a string); expected an "
                      "integer >= 1");
    expect_file_error("[training]\nseq_len = 12.0\n", 0, NULL,
                      "2: training.seq_len = 12.0 has the wrong type (a float); expected an "
                      "integer >= 1");
    expect_file_error("[training]\nglobal_batch_size = -2\n", 0, NULL,
                      "2: training.global_batch_size = -2 is out of range; expected an integer "
                      ">= 1, or -1 for local_batch_size x dp");
    expect_file_error("[optimizer]\nlr = -1e-3\n", 0, NULL,
                      "2: optimizer.lr = -0.001 is out of range; expected a number >= 0");
    expect_file_error("[optimizer]\nbeta1 = 1.0\n", 0, NULL,
                      "2: optimizer.beta1 = 1.0 is out of range; expected a number in [0, 1)");
    expect_file_error("[optimizer]\neps = 0\n", 0, NULL,
                      "2: optimizer.eps = 0 is out of range; expected a number > 0");
    expect_file_error("[optimizer]\nlr = nan\n", 0, NULL,
                      "2: optimizer.lr = nan is out of range; expected a number >= 0");
    expect_file_error("[optimizer]\nlr = inf\n", 0, NULL,
                      "2: optimizer.lr = inf is out of range; expected a number >= 0");
    expect_file_error("[training]\nmax_norm = 0\n", 0, NULL,
                      "2: training.max_norm = 0 is out of range; expected a number > 0, or inf "
                      "for no clipping");
    expect_file_error("[training]\nmax_norm = -inf\n", 0, NULL,
                      "2: training.max_norm = -inf is out of range; expected a number > 0, or "
                      "inf for no clipping");
    expect_file_error(
        "[optimizer]\nname = \"SGD\"\n", 0, NULL,
        "2: optimizer.name = \"SGD\" is not allowed; expected one of \"AdamW\", \"Adam\"");
    expect_file_error("[lr_scheduler]\ndecay_type = \"exp\"\n", 0, NULL,
                      "2: lr_scheduler.decay_type = \"exp\" is not allowed; expected one of "
                      "\"linear\", \"sqrt\", \"cosine\"");
    expect_file_error("[lr_scheduler]\nwarmup_steps = -1\n", 0, NULL,
                      "2: lr_scheduler.warmup_steps = -1 is out of range; expected an integer >= "
                      "0");
    expect_file_error("[checkpoint]\nkeep_latest_k = -1\n", 0, NULL,
                      "2: checkpoint.keep_latest_k = -1 is out of range; expected an integer >= "
                      "0 (0 keeps all)");
    expect_file_error("[checkpoint]\nenable = 1\n", 0, NULL,
                      "2: checkpoint.enable = 1 has the wrong type (an integer); expected true or "
                      "false");
    expect_file_error("[checkpoint]\nexport_dtype = 16\n", 0, NULL,
                      "2: checkpoint.export_dtype = 16 has the wrong type; expected one of "
                      "\"float32\", \"bfloat16\", \"float16\"");
    expect_file_error("[training]\nmixed_precision_param = \"float16\"\n", 0, NULL,
                      "2: training.mixed_precision_param = \"float16\" is not allowed; expected "
                      "one of \"float32\", \"bfloat16\"");
    expect_file_error("[training]\nsteps = 3000000000\n", 0, NULL,
                      "2: training.steps = 3000000000 is out of range; expected an integer >= 1");
    expect_file_error("[model]\nn_layers = \"4\"\n", 0, NULL,
                      "2: model.n_layers = \"4\" has the wrong type (a string); expected a number "
                      "or a boolean");
    expect_file_error("[model]\nn_layers = 2.5\n", 0, NULL,
                      "2: model field n_layers = \"2.5\" is not an integer");
    expect_file_error("[model]\nflavor = \"0.6b\"\n", 0, NULL,
                      "2: unknown model flavor \"0.6b\"; did you mean \"0.6B\"? (flavors: "
                      "\"debugmodel\", \"debugmodel_moe\", \"0.6B\", \"1.7B\", \"4B\", \"8B\", "
                      "\"14B\", \"32B\", \"30B-A3B\", \"235B-A22B\")");
    expect_file_error("[model]\nname = \"llama3\"\n", 0, NULL,
                      "2: model.name = \"llama3\" is not allowed; expected one of \"qwen3\"");
    expect_file_error("[model]\nflavor = \"hf\"\n", 0, NULL,
                      "2: model.flavor = \"hf\" needs model.hf_assets_path (the HF model "
                      "directory with config.json)");
    /* A check across keys names where the value came from: the command line here. */
    char *hf[] = {"--model.flavor=hf"};
    expect_error_contains("", 1, hf, "command line: model.flavor = \"hf\" needs");
    /* An empty dump folder is an error where it is set. */
    expect_file_error("[job]\ndump_folder = \"\"\n", 0, NULL,
                      "2: job.dump_folder = \"\" is empty; expected a directory path");
    /* TOML syntax errors come through with file:line. */
    expect_file_error("[training]\nsteps = 3\nsteps = 4\n", 0, NULL,
                      "3: duplicate key \"steps\" in [training] (first defined on line 2)");
}

static void test_model_fields(void **state) {
    (void)state;
    JobConfig c;
    load_ok(&c,
            "[model]\nflavor = \"debugmodel_moe\"\nnum_experts = 8\ntop_k = 2\n"
            "norm_eps = 1e-5\ntie_embeddings = true\nrope_theta = 10000\n",
            0, NULL);
    assert_int_equal(c.model.n_fields, 5);
    const char *want[5][3] = {{"num_experts", "8", "3"},
                              {"top_k", "2", "4"},
                              {"norm_eps", "1e-05", "5"},
                              {"tie_embeddings", "true", "6"},
                              {"rope_theta", "10000", "7"}};
    for (int i = 0; i < 5; i++) {
        assert_string_equal(c.model.fields[i].field, want[i][0]);
        assert_string_equal(c.model.fields[i].value, want[i][1]);
        assert_int_equal(c.model.fields[i].line, atoi(want[i][2]));
    }
    ModelSpec spec;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&spec, c.model.flavor, &err), 0);
    assert_int_equal(config_apply_model_fields(&spec, &c, &err), 0);
    assert_int_equal(spec.num_experts, 8);
    assert_int_equal(spec.top_k, 2);
    assert_true(spec.norm_eps == 1e-5);
    assert_int_equal(spec.tie_embeddings, 1);
    assert_true(spec.rope_theta == 10000.0);
    assert_int_equal(spec.n_layers, 8);
    assert_int_equal(model_spec_validate(&spec, &err), 0);
    /* A value that no longer parses is reported where it was set. */
    free(c.model.fields[1].value);
    c.model.fields[1].value = strdup("two");
    assert_int_equal(config_apply_model_fields(&spec, &c, &err), -1);
    char want_msg[256];
    snprintf(want_msg, sizeof want_msg, "%s:4: model field top_k = \"two\" is not an integer",
             c.path);
    assert_string_equal(err.msg, want_msg);
    c.model.fields[1].line = 0;
    assert_int_equal(config_apply_model_fields(&spec, &c, &err), -1);
    assert_string_equal(err.msg, "command line: model field top_k = \"two\" is not an integer");
    config_free(&c);
}

/* Values that parse but make an invalid model are reported where a field the message names
 * was set ("dim" must not match "head_dim"). */
static void test_model_validation_origin(void **state) {
    (void)state;
    JobConfig c;
    char *argv[] = {"--model.n_kv_heads=3"};
    load_ok(&c, "[model]\nhead_dim = 7\ndim = 32\n", 0, NULL);
    ModelSpec spec;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&spec, c.model.flavor, &err), 0);
    assert_int_equal(config_apply_model_fields(&spec, &c, &err), 0);
    assert_int_equal(config_validate_model(&spec, &c, &err), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:2: model head_dim = 7 must be even (RoPE rotates pairs)",
             c.path);
    assert_string_equal(err.msg, want);
    config_free(&c);
    load_ok(&c, "[model]\nn_heads = 8\n", 1, argv);
    assert_int_equal(model_spec_flavor(&spec, c.model.flavor, &err), 0);
    assert_int_equal(config_apply_model_fields(&spec, &c, &err), 0);
    assert_int_equal(config_validate_model(&spec, &c, &err), -1);
    assert_string_equal(err.msg, "command line: model n_heads = 8 is not a multiple of "
                                 "n_kv_heads = 3");
    config_free(&c);
}

static void test_model_field_text(void **state) {
    (void)state;
    /* Floats keep a float look and read back exactly; integers stay integers. */
    JobConfig c;
    char *argv[] = {"--model.rope_theta=1e6", "--model.norm_eps=0.1", "--model.dim=+64",
                    "--model.norm_topk_prob=false", "--model.router_aux_loss_coef=1e-3"};
    load_ok(&c, "", 5, argv);
    assert_string_equal(c.model.fields[0].value, "1000000.0");
    assert_string_equal(c.model.fields[1].value, "0.1");
    assert_string_equal(c.model.fields[2].value, "64");
    assert_string_equal(c.model.fields[3].value, "false");
    assert_string_equal(c.model.fields[4].value, "0.001");
    config_free(&c);
    /* A boolean model field alone means true, like a boolean key, also before another option. */
    char *argv2[] = {"--model.tie_embeddings", "--training.steps=3", "--model.norm_topk_prob"};
    load_ok(&c, "", 3, argv2);
    assert_int_equal(c.model.n_fields, 2);
    assert_string_equal(c.model.fields[0].value, "true");
    assert_string_equal(c.model.fields[1].value, "true");
    assert_int_equal(c.training.steps, 3);
    config_free(&c);
}

static void test_overrides(void **state) {
    (void)state;
    JobConfig c;
    load_ok(&c,
            "[training]\nsteps = 1\n\n"
            "[[override]]\ntarget = \"layers.*.attention.rope\"\nkernel = \"rope_nogather\"\n\n"
            "[[override]]\n"
            "target = \"layers.*.attention.sdpa\"\nkernel = \"flash\"\ndescription = \"fast\"\n",
            0, NULL);
    assert_int_equal(c.n_overrides, 2);
    assert_string_equal(c.overrides[0].target, "layers.*.attention.rope");
    assert_string_equal(c.overrides[0].kernel, "rope_nogather");
    assert_string_equal(c.overrides[0].description, "");
    assert_int_equal(c.overrides[0].line, 4);
    assert_string_equal(c.overrides[1].kernel, "flash");
    assert_string_equal(c.overrides[1].description, "fast");
    assert_int_equal(c.overrides[1].line, 8);
    config_free(&c);
    expect_file_error("[[override]]\ntarget = \"x\"\n", 0, NULL,
                      "1: [[override]] entry needs a non-empty kernel");
    expect_file_error("\n[[override]]\ntarget = \"x\"\nkernal = \"y\"\n", 0, NULL,
                      "4: unknown key \"kernal\" in [override]; did you mean \"kernel\"?");
    expect_file_error("[[override]]\ntarget = 3\nkernel = \"y\"\n", 0, NULL,
                      "2: override.target = 3 has the wrong type (an integer); expected a string");
    expect_file_error("[override]\ntarget = \"x\"\n", 0, NULL,
                      "1: override must be written as [[override]] entries (an array of tables), "
                      "not a table");
    expect_file_error("override = [1]\n", 0, NULL,
                      "1: override entries must be tables ([[override]]), not an integer");
}

static void test_dataset_path(void **state) {
    (void)state;
    JobConfig c;
    Err err = {{0}};
    char *p;
    config_init(&c);
    unsetenv("QT_C4_TEST_PATH");
    assert_int_equal(config_dataset_path(&c, &p, &err), 0);
    assert_string_equal(p, "../shared/data/c4_sample/c4_sample.jsonl");
    free(p);
    setenv("QT_C4_TEST_PATH", "/somewhere/c4.jsonl", 1);
    assert_int_equal(config_dataset_path(&c, &p, &err), 0);
    assert_string_equal(p, "/somewhere/c4.jsonl");
    free(p);
    setenv("QT_C4_TEST_PATH", "", 1);
    assert_int_equal(config_dataset_path(&c, &p, &err), 0);
    assert_string_equal(p, "../shared/data/c4_sample/c4_sample.jsonl");
    free(p);
    unsetenv("QT_C4_TEST_PATH");
    char *argv[] = {"--training.dataset_path=/x/y.jsonl"};
    config_free(&c);
    assert_int_equal(config_load(&c, NULL, 1, argv, &err), 0);
    assert_int_equal(config_dataset_path(&c, &p, &err), 0);
    assert_string_equal(p, "/x/y.jsonl");
    free(p);
    config_free(&c);
    char *argv2[] = {"--training.dataset=wiki"};
    assert_int_equal(config_load(&c, NULL, 1, argv2, &err), 0);
    assert_int_equal(config_dataset_path(&c, &p, &err), -1);
    assert_string_equal(err.msg, "training.dataset = \"wiki\" is not a built-in dataset (only "
                                 "\"c4_test\"); set training.dataset_path to its file");
    config_free(&c);
}

static void test_derived(void **state) {
    (void)state;
    JobConfig c;
    Err err = {{0}};
    const char *tok;
    config_init(&c);
    assert_int_equal(config_tokenizer_path(&c, &tok, &err), -1);
    assert_non_null(strstr(err.msg, "model.tokenizer_path"));
    config_free(&c);
    char *argv[] = {"--model.hf_assets_path=/m", "--training.global_batch_size=32",
                    "--training.local_batch_size=4"};
    assert_int_equal(config_load(&c, NULL, 3, argv, &err), 0);
    assert_int_equal(config_tokenizer_path(&c, &tok, &err), 0);
    assert_string_equal(tok, "/m");
    int accum;
    assert_int_equal(config_grad_accum_steps(&c, 2, &accum, &err), 0);
    assert_int_equal(accum, 4);
    assert_int_equal(config_grad_accum_steps(&c, 3, &accum, &err), -1);
    assert_non_null(strstr(err.msg, "global_batch_size = 32 is not a multiple"));
    c.training.global_batch_size = -1;
    assert_int_equal(config_grad_accum_steps(&c, 3, &accum, &err), 0);
    assert_int_equal(accum, 1);
    config_free(&c);
    assert_string_equal(config_decay_type_name(DECAY_SQRT), "sqrt");
    assert_string_equal(config_device_name(DEVICE_CUDA), "cuda");
    assert_string_equal(config_ac_mode_name(AC_FULL), "full");
    assert_string_equal(config_dtype_name(DT_BF16), "bfloat16");
}

static char *dump_to_string(const JobConfig *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_dump(c, f);
    fclose(f);
    return buf;
}

static void test_dump_roundtrip(void **state) {
    (void)state;
    JobConfig a, b;
    char *argv[] = {"--job.description=say \"hi\"\\ok\ttab",
                    "--optimizer.lr=3e-4",
                    "--lr_scheduler.decay_ratio=0.1",
                    "--training.seed=99",
                    "--model.n_layers=2",
                    "--checkpoint.export_dtype=bfloat16",
                    "--training.max_norm=inf",
                    "--model.rope_scaling=yarn"};
    load_ok(&a,
            "[model]\nnorm_eps = 1e-5\n[[override]]\ntarget = \"a.*\"\nkernel = \"k\"\n"
            "description = \"d\"\n",
            8, argv);
    char *text = dump_to_string(&a);
    load_ok(&b, text, 0, NULL);
    char *text2 = dump_to_string(&b);
    assert_string_equal(text, text2);
    assert_string_equal(b.job.description, "say \"hi\"\\ok\ttab");
    assert_true(b.optimizer.lr == 3e-4);
    assert_true(b.lr_scheduler.decay_ratio == 0.1);
    assert_true(b.training.seed == 99);
    assert_int_equal(b.checkpoint.export_dtype, DT_BF16);
    assert_true(isinf(b.training.max_norm) && b.training.max_norm > 0);
    assert_int_equal(b.model.n_fields, 3);
    assert_string_equal(b.model.fields[1].value, "2");
    /* A string field is written as a TOML string. */
    assert_non_null(strstr(text, "\nrope_scaling = \"yarn\"\n"));
    assert_string_equal(b.model.fields[2].value, "yarn");
    assert_int_equal(b.n_overrides, 1);
    assert_string_equal(b.overrides[0].description, "d");
    free(text);
    free(text2);
    config_free(&a);
    config_free(&b);
    /* Unset decay_ratio stays unset. */
    config_init(&a);
    text = dump_to_string(&a);
    load_ok(&b, text, 0, NULL);
    assert_true(b.lr_scheduler.decay_ratio < 0);
    free(text);
    config_free(&a);
    config_free(&b);
}

static void test_repo_configs(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char pattern[1024];
    snprintf(pattern, sizeof pattern, "%s/configs/*.toml", src);
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= 1);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        JobConfig c;
        Err err = {{0}};
        if (config_load(&c, g.gl_pathv[i], 0, NULL, &err) != 0)
            fail_msg("%s does not load: %s", g.gl_pathv[i], err.msg);
        config_free(&c);
    }
    globfree(&g);
}

/* docs/config.md has a row for every key with the default config_init gives it, and one for
 * every model field, so the reference cannot drift from the code. */
static void test_docs_list_every_key(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/config.md", src);
    char *doc;
    size_t doc_len;
    Err err = {{0}};
    if (fs_read_all(path, &doc, &doc_len, &err) != 0) fail_msg("%s", err.msg);
    JobConfig c;
    config_init(&c);
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *f = open_memstream(&dump, &dump_len);
    assert_non_null(f);
    config_dump(&c, f);
    fclose(f);
    char section[64] = "", row[160];
    int keys = 0;
    char *save;
    for (char *line = strtok_r(dump, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char key[64], value[256];
        if (sscanf(line, "[%63[^]]", section) == 1) continue;
        if (sscanf(line, "%63s = %255[^\n]", key, value) != 2) continue;
        snprintf(row, sizeof row, "| `%s.%s` | ", section, key);
        const char *r = strstr(doc, row);
        if (!r) fail_msg("docs/config.md has no row for %s.%s", section, key);
        /* The default is the first code span after the type cell, on the same line. */
        const char *cell = strstr(r + strlen(row), "| `");
        const char *eol = strchr(r, '\n');
        if (!cell || (eol && cell > eol))
            fail_msg("docs/config.md: %s.%s has no default", section, key);
        cell += 3;
        const char *end = strchr(cell, '`');
        char shown[256];
        snprintf(shown, sizeof shown, "%.*s", (int)(end - cell), cell);
        int same = strcmp(shown, value) == 0;
        if (!same) {
            char *e1, *e2;
            double a = strtod(shown, &e1), b = strtod(value, &e2);
            same = e1 != shown && !*e1 && e2 != value && !*e2 && a == b;
        }
        if (!same)
            fail_msg("docs/config.md gives %s.%s the default %s; config_init gives %s", section,
                     key, shown, value);
        keys++;
    }
    assert_true(keys >= 40);
    for (int i = 0; i < MODEL_SPEC_NFIELDS; i++) {
        snprintf(row, sizeof row, "| `%s` | ", model_spec_field_name(i));
        if (!strstr(doc, row))
            fail_msg("docs/config.md has no row for model field %s", model_spec_field_name(i));
    }
    free(dump);
    free(doc);
    config_free(&c);
}

/* Every leaf key of torchtitan's job config (tests/fixtures/torchtitan/all_keys.toml, written
 * from torchtitan's job_config.py, not from qtitan's tables) loads: implemented or noted. */
static void test_torchtitan_every_key(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/torchtitan/all_keys.toml", src);
    JobConfig c;
    Err err = {{0}};
    if (config_load(&c, path, 0, NULL, &err) != 0) fail_msg("all_keys.toml: %s", err.msg);
    assert_int_equal(c.training.seed, 42); /* debug.seed */
    assert_int_equal(c.training.mixed_precision_param, DT_BF16);
    assert_int_equal(c.lr_scheduler.total_steps, 20000);
    assert_true(c.n_notices >= 30);
    int compile_backend = 0;
    for (int i = 0; i < c.n_notices; i++)
        if (strstr(c.notices[i], "all_keys.toml:135: compile.backend = \"inductor\" has no effect "
                                 "here: qtitan has no graph compiler"))
            compile_backend = 1;
    assert_true(compile_backend);
    config_free(&c);
}

/* One notice for a value that changes nothing here; none for a value qtitan already honours. */
static void test_torchtitan_notices(void **state) {
    (void)state;
    JobConfig c;
    char path[64];
    Err err = {{0}};
    assert_int_equal(load(&c, "[compile]\nenable = false\n", 0, NULL, &err, path), 0);
    assert_int_equal(c.n_notices, 0);
    config_free(&c);
    assert_int_equal(load(&c, "[compile]\nenable = true\n", 0, NULL, &err, path), 0);
    assert_int_equal(c.n_notices, 1);
    char want[512];
    snprintf(want, sizeof want,
             "%s:2: compile.enable = true has no effect here: qtitan has no graph compiler; its "
             "fused kernels are chosen with [[override]] (docs/kernels.md)",
             path);
    assert_string_equal(c.notices[0], want);
    config_free(&c);
    /* Nested sections on the command line split at the last dot; lists are comma-separated. */
    char *argv[] = {"--quantize.linear.float8.filter_fqns=output,layers.0.attention.wq",
                    "--parallelism.fsdp_reshard_after_forward", "always"};
    load_ok(&c, "", 3, argv);
    assert_int_equal(c.n_notices, 1);
    assert_string_equal(c.notices[0],
                        "command line: quantize.linear.float8.filter_fqns = [\"output\", "
                        "\"layers.0.attention.wq\"] has no effect here: qtitan trains in float32 "
                        "or bfloat16; float8 and MX training are not available (model.converters)");
    config_free(&c);
    /* torchtitan's other names for qtitan's keys. */
    load_ok(&c, "[training.data]\nname = \"c4\"\n[debug]\nseed = 7\ndeterministic = true\n", 0,
            NULL);
    assert_string_equal(c.training.dataset, "c4");
    assert_int_equal(c.training.seed, 7);
    assert_int_equal(c.training.deterministic, 1);
    char *ds = NULL;
    assert_int_not_equal(config_dataset_path(&c, &ds, &err), 0);
    assert_non_null(strstr(err.msg, "training.dataset = \"c4\" reads C4 from files you give: set "
                                    "training.dataset_path"));
    config_free(&c);
}

/* A value that asks for something qtitan cannot do is one sentence naming key and value. */
static void test_torchtitan_refusals(void **state) {
    (void)state;
    expect_file_error("[parallelism]\npipeline_parallel_degree = 4\n", 0, NULL,
                      "2: parallelism.pipeline_parallel_degree = 4 is not available: qtitan has "
                      "no pipeline parallelism; use data_parallel_shard_degree and "
                      "tensor_parallel_degree");
    expect_file_error("[model]\nconverters = [\"float8\"]\n", 0, NULL,
                      "2: model.converters = [\"float8\"] is not available: qtitan trains in "
                      "float32 or bfloat16; float8 and MX training are not available "
                      "(model.converters); the one converter here is \"lora\" (docs/finetune.md)");
    expect_file_error("[compile]\nenable = 1\n", 0, NULL,
                      "2: compile.enable = 1 has the wrong type (an integer); expected true or "
                      "false");
    expect_file_error("[quantize.linear.float8]\nemulat = false\n", 0, NULL,
                      "2: unknown key \"emulat\" in [quantize.linear.float8]; did you mean "
                      "\"emulate\"?");
    expect_file_error("[lr_scheduler]\ntotal_steps = 0\n", 0, NULL,
                      "2: lr_scheduler.total_steps = 0 is out of range; expected an integer >= 1, "
                      "or -1 for training.steps");
    JobConfig c;
    Err err = {{0}};
    char *argv[] = {"--parallelism.context_parallel_degree=2"};
    assert_int_not_equal(config_load(&c, NULL, 1, argv, &err), 0);
    assert_non_null(strstr(err.msg, "command line: parallelism.context_parallel_degree = 2 is not "
                                    "available: qtitan has no context parallelism"));
}

/* torchtitan's LoRA converter: model.converters = ["lora"] with [lora] rank / alpha / dropout /
 * apply_to_all_linears, torchtitan's defaults (rank 8, every linear) where [lora] is silent. */
static void test_torchtitan_lora_converter(void **state) {
    (void)state;
    JobConfig c;
    char path[64];
    Err err = {{0}};
    assert_int_equal(load(&c, "[model]\nconverters = [\"lora\"]\n", 0, NULL, &err, path), 0);
    assert_int_equal(c.lora.rank, 8);
    assert_true(c.lora.alpha == 16);
    assert_string_equal(c.lora.targets, "all-linear");
    assert_int_equal(c.n_notices, 1);
    char want[512];
    snprintf(want, sizeof want,
             "%s:2: model.converters = [\"lora\"] puts adapters of rank 8 on every linear of the "
             "layers (lora.targets = [\"all-linear\"]); torchtitan's converter also puts them on "
             "the output projection and MoE routers, which qtitan does not",
             path);
    assert_string_equal(c.notices[0], want);
    /* The resolved config reads back as the same job, LoRA written out as qtitan's keys. */
    char *text = dump_to_string(&c);
    assert_non_null(strstr(text, "converters = [\"lora\"]\n"));
    assert_null(strstr(text, "apply_to_all_linears"));
    JobConfig b;
    load_ok(&b, text, 0, NULL);
    char *text2 = dump_to_string(&b);
    assert_string_equal(text, text2);
    free(text);
    free(text2);
    config_free(&b);
    config_free(&c);
    /* torchtitan's recipe's [lora] section; false is the attention's four linears. */
    load_ok(&c,
            "[model]\nconverters = [\"lora\"]\n[lora]\nrank = 4\nalpha = 32.0\ndropout = 0.1\n"
            "apply_to_all_linears = false\n",
            0, NULL);
    assert_int_equal(c.lora.rank, 4);
    assert_true(c.lora.alpha == 32 && c.lora.dropout == 0.1);
    assert_string_equal(c.lora.targets, "layers.*.attention.wq,layers.*.attention.wk,"
                                        "layers.*.attention.wv,layers.*.attention.wo");
    assert_int_equal(c.n_notices, 0);
    config_free(&c);
    /* lora.targets and apply_to_all_linears are one setting: the later wins, the command line
     * last; without the converter the switch still picks the targets of lora.rank's adapters. */
    char *targets[] = {"--lora.targets=q_proj"};
    load_ok(&c, "[model]\nconverters = [\"lora\"]\n[lora]\napply_to_all_linears = true\n", 1,
            targets);
    assert_string_equal(c.lora.targets, "q_proj");
    assert_int_equal(c.n_notices, 0);
    config_free(&c);
    load_ok(&c, "[lora]\nrank = 2\ntargets = [\"q_proj\"]\napply_to_all_linears = true\n", 0, NULL);
    assert_int_equal(c.lora.rank, 2);
    assert_string_equal(c.lora.targets, "all-linear");
    config_free(&c);
    /* The command line turns the converter on, or off again ("" is the empty list). */
    char *on[] = {"--model.converters=lora"};
    load_ok(&c, "", 1, on);
    assert_int_equal(c.lora.rank, 8);
    config_free(&c);
    char *off[] = {"--model.converters="};
    load_ok(&c, "[model]\nconverters = [\"float8\"]\n", 1, off);
    assert_int_equal(c.lora.rank, 0);
    assert_string_equal(c.lora.targets, "layers.*.attention.wq,layers.*.attention.wv");
    config_free(&c);
    /* Asking for LoRA and turning it off is one sentence; so is any other converter. */
    assert_int_not_equal(
        load(&c, "[model]\nconverters = [\"lora\"]\n[lora]\nrank = 0\n", 0, NULL, &err, path), 0);
    snprintf(want, sizeof want,
             "%s:4: lora.rank = 0 turns LoRA off, but model.converters = [\"lora\"] (%s:2) asks "
             "for it; give a rank >= 1, or none for torchtitan's 8",
             path, path);
    assert_string_equal(err.msg, want);
    char *mixed[] = {"--model.converters=lora,mx"};
    expect_error_contains("", 1, mixed,
                          "command line: model.converters = [\"lora\", \"mx\"] is not available: "
                          "qtitan trains in float32 or bfloat16");
    expect_file_error("[lora]\napply_to_all_linears = 1\n", 0, NULL,
                      "2: lora.apply_to_all_linears = 1 has the wrong type (an integer); expected "
                      "true or false");
}

/* Recipes written before torchtitan's 2025 renames load: the old names of implemented keys set
 * them, and the old [float8] / [mx] sections get the notices of their [quantize] successors. */
static void test_torchtitan_older_names(void **state) {
    (void)state;
    JobConfig c;
    load_ok(&c,
            "[training]\nbatch_size = 3\n[checkpoint]\nenable_checkpoint = true\n"
            "[validation]\nenabled = true\n[memory_estimation]\nenabled = false\n"
            "[float8]\nenable_fsdp_float8_all_gather = false\n"
            "precompute_float8_dynamic_scale_for_fsdp = false\n"
            "force_recompute_fp8_weight_in_bwd = false\nemulate = false\n"
            "moe_fqns_prototype = []\nfilter_fqns = [\"output\"]\n"
            "[mx]\nrecipe_name = \"mxfp8\"\n",
            0, NULL);
    assert_int_equal(c.training.local_batch_size, 3);
    assert_int_equal(c.checkpoint.enable, 1);
    assert_int_equal(c.validation.enable, 1);
    assert_int_equal(c.n_notices, 2);
    assert_int_equal(c.debug.moe_force_load_balance, 0);
    assert_non_null(strstr(c.notices[0], ":15: float8.filter_fqns = [\"output\"] has no effect "
                                         "here: qtitan trains in float32 or bfloat16"));
    assert_non_null(strstr(c.notices[1], ":17: mx.recipe_name = \"mxfp8\" has no effect here"));
    /* The resolved config writes the current names only. */
    char *text = dump_to_string(&c);
    assert_null(strstr(text, "enable_checkpoint"));
    assert_null(strstr(text, "\nbatch_size"));
    assert_non_null(strstr(text, "local_batch_size = 3\n"));
    free(text);
    config_free(&c);
    char *lb[] = {"--training.debug_moe_force_load_balance=true", "--lr_scheduler.lr_min=0.1",
                  "--job.print_args=true", "--checkpoint.model_weights_only=true"};
    JobConfig d;
    load_ok(&d, "[checkpoint]\nlast_save_model_only = false\n", 4, lb);
    assert_int_equal(d.debug.moe_force_load_balance, 1);
    assert_true(d.lr_scheduler.min_lr_factor == 0.1);
    assert_int_equal(d.job.print_config, 1);
    assert_int_equal(d.checkpoint.last_save_model_only, 1);
    assert_int_equal(d.n_notices, 0);
    config_free(&d);
    expect_file_error("[float8]\nemulate = 1\n", 0, NULL,
                      "2: float8.emulate = 1 has the wrong type (an integer); expected true or "
                      "false");
    char *cli[] = {"--checkpoint.enable_checkpoint=false", "--training.batch_size=0"};
    expect_error_contains("[checkpoint]\nenable = true\n", 2, cli,
                          "command line: training.batch_size = 0 is out of range; expected an "
                          "integer >= 1");
}

/* The command line wins over the file for torchtitan's keys too: a refused or noticed value
 * in the file set back on the command line to one qtitan honours runs without a word, and a
 * value the command line asks for that qtitan cannot honour names the command line. */
static void test_torchtitan_command_line_wins(void **state) {
    (void)state;
    JobConfig c;
    char *off[] = {"--metrics.enable_wandb=false", "--compile.enable=false"};
    load_ok(&c, "[metrics]\nenable_wandb = true\n[compile]\nenable = true\n", 2, off);
    assert_int_equal(c.n_notices, 0);
    config_free(&c);
    Err err = {{0}};
    char *on[] = {"--metrics.enable_wandb", "--compile.enable=true"};
    assert_int_not_equal(load(&c, "[metrics]\nenable_wandb = false\n", 2, on, &err, NULL), 0);
    assert_non_null(strstr(err.msg, "command line: metrics.enable_wandb = true is not available"));
    /* The notice names where the value that counts came from, once. */
    char *noticed[] = {"--compile.enable=true"};
    load_ok(&c, "[compile]\nenable = true\n", 1, noticed);
    assert_int_equal(c.n_notices, 1);
    assert_non_null(strstr(c.notices[0], "command line: compile.enable = true has no effect here"));
    config_free(&c);
}

/* torchtitan's --job.config_file names the file as --config does. */
static void test_job_config_file(void **state) {
    (void)state;
    char path[64], arg[96];
    write_tmp(path, "[training]\nsteps = 17\n");
    snprintf(arg, sizeof arg, "--job.config_file=%s", path);
    char *argv1[] = {arg};
    JobConfig c;
    Err err = {{0}};
    assert_int_equal(config_load(&c, NULL, 1, argv1, &err), 0);
    assert_int_equal(c.training.steps, 17);
    config_free(&c);
    char *argv2[] = {"--job.config_file", path, "--config", path};
    assert_int_not_equal(config_load(&c, NULL, 4, argv2, &err), 0);
    assert_non_null(strstr(err.msg, "is given twice"));
    unlink(path);
}

/* activation_checkpoint.selective_ac_option: torchtitan's "op" or a number of layers, read
 * under mode = "selective" (config_ac); anything else is one sentence naming the line. */
static void test_selective_ac_option(void **state) {
    (void)state;
    static const struct {
        const char *mode, *option;
        AcMode want;
    } cases[] = {
        {"selective", NULL, AC_SELECTIVE}, /* qtitan's default "op" */
        {"selective", "op", AC_SELECTIVE},
        {"selective", "2", AC_EVERY + 2},
        {"selective", "12", AC_EVERY + 12},
        {"selective", "1", AC_FULL}, /* torchtitan wraps every layer for 1 and 0 */
        {"selective", "0", AC_FULL},
        {"selective", "99999999999999999999", AC_EVERY + AC_EVERY_MAX},
        {"full", "2", AC_FULL}, /* the option is read in selective mode only */
        {"none", "3", AC_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        int n =
            snprintf(text, sizeof text, "[activation_checkpoint]\nmode = \"%s\"\n", cases[i].mode);
        if (cases[i].option)
            snprintf(text + n, sizeof text - (size_t)n, "selective_ac_option = \"%s\"\n",
                     cases[i].option);
        JobConfig c;
        load_ok(&c, text, 0, NULL);
        if (config_ac(&c) != cases[i].want)
            fail_msg("mode %s, option %s: %d, expected %d", cases[i].mode,
                     cases[i].option ? cases[i].option : "(none)", (int)config_ac(&c),
                     (int)cases[i].want);
        config_free(&c);
    }
    char buf[32];
    assert_string_equal(config_ac_text(ac_every(2), buf, sizeof buf), "every 2nd layer");
    assert_string_equal(config_ac_text(ac_every(11), buf, sizeof buf), "every 11th layer");
    assert_string_equal(config_ac_text(ac_every(21), buf, sizeof buf), "every 21st layer");
    assert_string_equal(config_ac_text(AC_SELECTIVE, buf, sizeof buf), "selective");
    char flags[128];
    assert_string_equal(config_ac_flags(ac_every(3), flags, sizeof flags),
                        "--activation_checkpoint.mode=selective "
                        "--activation_checkpoint.selective_ac_option=3");
    assert_string_equal(config_ac_flags(AC_SELECTIVE, flags, sizeof flags),
                        "--activation_checkpoint.mode=selective "
                        "--activation_checkpoint.selective_ac_option=op");
    assert_string_equal(config_ac_flags(AC_FULL, flags, sizeof flags),
                        "--activation_checkpoint.mode=full");
    /* The flags read back as the mode they name. */
    const AcMode back[] = {AC_NONE, AC_FULL, AC_SELECTIVE, ac_every(2), ac_every(40)};
    for (int i = 0; i < 5; i++) {
        char *argv[2];
        char a[128], b[128];
        config_ac_flags(back[i], flags, sizeof flags);
        int n = sscanf(flags, "%127s %127s", a, b);
        argv[0] = a, argv[1] = b;
        JobConfig c;
        load_ok(&c, "", n, argv);
        assert_int_equal(config_ac(&c), back[i]);
        config_free(&c);
    }
    expect_file_error("[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = "
                      "\"layer\"\n",
                      0, NULL,
                      "3: activation_checkpoint.selective_ac_option = \"layer\" is not allowed; "
                      "expected \"op\" or a number of layers such as \"2\" (every 2nd layer "
                      "checkpointed whole)");
    const char *bad[] = {"-2", "2.5", "", " 2", "OP"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "[activation_checkpoint]\nselective_ac_option = \"%s\"\n",
                 bad[i]);
        expect_error_contains(text, 0, NULL, "selective_ac_option");
    }
    expect_error_contains("", 1, (char *[]){"--activation_checkpoint.selective_ac_option=x"},
                          "expected \"op\" or a number of layers");
    expect_error_contains("[activation_checkpoint]\nselective_ac_option = 2\n", 0, NULL,
                          "expected a string");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selective_ac_option),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_values),
        cmocka_unit_test(test_command_line_wins),
        cmocka_unit_test(test_command_line_errors),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_type_and_range_errors),
        cmocka_unit_test(test_model_fields),
        cmocka_unit_test(test_model_validation_origin),
        cmocka_unit_test(test_model_field_text),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_dataset_path),
        cmocka_unit_test(test_derived),
        cmocka_unit_test(test_dump_roundtrip),
        cmocka_unit_test(test_repo_configs),
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_torchtitan_every_key),
        cmocka_unit_test(test_torchtitan_notices),
        cmocka_unit_test(test_torchtitan_lora_converter),
        cmocka_unit_test(test_torchtitan_older_names),
        cmocka_unit_test(test_torchtitan_command_line_wins),
        cmocka_unit_test(test_torchtitan_refusals),
        cmocka_unit_test(test_job_config_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
