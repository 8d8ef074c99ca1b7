/* qtitan eval: mean next-token cross-entropy of an HF Qwen3 checkpoint on token-id lines, on
 * the fp32 reference path. Lines are packed into rows with a document mask and positions
 * restarting at 0, which gives exactly the result of running each line alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/token_lines.h"
#include "model/lora.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"

/* Rows are at least this long, so short lines share a forward pass. */
#define EVAL_MIN_ROW 2048

static const char *USAGE =
    "usage: qtitan eval --model HFDIR --tokens FILE [--adapter DIR] [--dump-logits "
    "OUT.safetensors]\n"
    "\n"
    "Prints `loss: X`, the mean next-token cross-entropy over all predicted positions of all\n"
    "lines of FILE (one sequence of whitespace-separated token ids per line), for the\n"
    "Qwen3ForCausalLM or Qwen3MoeForCausalLM checkpoint in HFDIR (config.json +\n"
    "safetensors) in fp32.\n"
    "--adapter DIR adds the LoRA adapters of a peft adapter folder (adapter_config.json +\n"
    "adapter_model.safetensors, e.g. a LoRA run's DUMP/adapter) to the model.\n"
    "--dump-logits writes each line's logits as F32 logits.0, logits.1, ... (len, vocab).\n";

typedef struct EvalArgs {
    const char *model, *tokens, *dump, *adapter;
} EvalArgs;

static int parse_args(EvalArgs *a, int argc, char **argv, Err *err) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--model") == 0         ? &a->model
                            : strcmp(argv[i], "--tokens") == 0      ? &a->tokens
                            : strcmp(argv[i], "--dump-logits") == 0 ? &a->dump
                            : strcmp(argv[i], "--adapter") == 0     ? &a->adapter
                                                                    : NULL;
        if (!slot) return err_set(err, "unknown option %s (see qtitan eval --help)", argv[i]);
        if (i + 1 >= argc) return err_set(err, "option %s needs a value", argv[i]);
        *slot = argv[++i];
    }
    if (!a->model) return err_set(err, "--model HFDIR is required (see qtitan eval --help)");
    if (!a->tokens) return err_set(err, "--tokens FILE is required (see qtitan eval --help)");
    return 0;
}

static int eval_run(const EvalArgs *a, Err *err) {
    if (!fs_is_dir(a->model)) return err_set(err, "model directory %s does not exist", a->model);
    ModelSpec spec;
    char *config = fs_join(a->model, "config.json");
    int rc = model_spec_from_hf_config(&spec, config, err);
    free(config);
    if (rc) return -1;
    TokenLines tl;
    TRY(token_lines_read(&tl, a->tokens, spec.vocab_size, 1L << 24, err));

    long longest = 0;
    for (int l = 0; l < tl.n; l++)
        if (tl.start[l + 1] - tl.start[l] > longest) longest = tl.start[l + 1] - tl.start[l];
    if (tl.total == tl.n) {
        token_lines_free(&tl);
        return err_set(err, "%s: every line has a single token, so no position is predicted",
                       a->tokens);
    }
    long row = longest > EVAL_MIN_ROW ? longest : EVAL_MIN_ROW;
    if (row > tl.total) row = tl.total;

    Qwen3 m;
    StSet set;
    memset(&set, 0, sizeof set);
    Lora lo;
    memset(&lo, 0, sizeof lo);
    int32_t *tgt = NULL, *pos = NULL, *doc = NULL;
    float *dump = NULL;
    rc = -1;
    if (qwen3_create(&m, &spec, 1, (int)row, AC_NONE, err)) goto out_lines;
    if (st_set_open(&set, a->model, err)) goto out_model;
    if (qwen3_load_hf(&m, &set, a->model, err)) goto out_set;
    if (a->adapter) {
        if (lora_open_peft(&lo, &spec, a->adapter, row, err)) goto out_set;
        m.lora = &lo;
    }

    long N = tl.total, V = spec.vocab_size;
    tgt = xmalloc((size_t)N * sizeof *tgt);
    pos = xmalloc((size_t)N * sizeof *pos);
    doc = xmalloc((size_t)N * sizeof *doc);
    for (int l = 0; l < tl.n; l++)
        for (long i = tl.start[l]; i < tl.start[l + 1]; i++) {
            tgt[i] = i + 1 < tl.start[l + 1] ? tl.ids[i + 1] : CE_IGNORE;
            pos[i] = (int32_t)(i - tl.start[l]);
            doc[i] = l;
        }
    if (a->dump) dump = xmalloc((size_t)N * V * sizeof *dump);

    double loss_sum = 0.0;
    long n_valid = 0;
    /* Greedy rows of whole lines. */
    for (int l0 = 0; l0 < tl.n;) {
        int l1 = l0 + 1;
        while (l1 < tl.n && tl.start[l1 + 1] - tl.start[l0] <= row)
            l1++;
        long s = tl.start[l0], T = tl.start[l1] - s;
        qwen3_forward(&m, tl.ids + s, tgt + s, pos + s, doc + s, 1, (int)T);
        loss_sum += m.loss_sum;
        n_valid += m.n_valid;
        if (dump) memcpy(dump + s * V, m.a.logits, (size_t)(T * V) * sizeof *dump);
        l0 = l1;
    }
    printf("loss: %.8f\n", loss_sum / (double)n_valid);

    if (dump) {
        StWriter w;
        st_writer_init(&w);
        for (int l = 0; l < tl.n; l++) {
            char name[32];
            snprintf(name, sizeof name, "logits.%d", l);
            int64_t shape[2] = {tl.start[l + 1] - tl.start[l], V};
            st_writer_add(&w, name, DT_F32, 2, shape, dump + tl.start[l] * V);
        }
        int wrc = st_write_finish(&w, a->dump, err);
        st_writer_free(&w);
        if (wrc) goto out_set;
    }
    rc = 0;
out_set:
    lora_free(&lo);
    st_set_close(&set);
out_model:
    qwen3_free(&m);
out_lines:
    token_lines_free(&tl);
    free(tgt), free(pos), free(doc), free(dump);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    EvalArgs a;
    Err err;
    if (parse_args(&a, argc, argv, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    if (eval_run(&a, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
