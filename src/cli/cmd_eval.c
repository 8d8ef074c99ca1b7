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
#include "model/qwen3.h"
#include "model/qwen3_hf.h"

/* Rows are at least this long, so short lines share a forward pass. */
#define EVAL_MIN_ROW 2048

static const char *USAGE =
    "usage: qtitan eval --model HFDIR --tokens FILE [--dump-logits OUT.safetensors]\n"
    "\n"
    "Prints `loss: X`, the mean next-token cross-entropy over all predicted positions of all\n"
    "lines of FILE (one sequence of whitespace-separated token ids per line), for the\n"
    "Qwen3ForCausalLM or Qwen3MoeForCausalLM checkpoint in HFDIR (config.json +\n"
    "safetensors) in fp32.\n"
    "--dump-logits writes each line's logits as F32 logits.0, logits.1, ... (len, vocab).\n";

typedef struct EvalArgs {
    const char *model, *tokens, *dump;
} EvalArgs;

static int parse_args(EvalArgs *a, int argc, char **argv, Err *err) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--model") == 0         ? &a->model
                            : strcmp(argv[i], "--tokens") == 0      ? &a->tokens
                            : strcmp(argv[i], "--dump-logits") == 0 ? &a->dump
                                                                    : NULL;
        if (!slot) return err_set(err, "unknown option %s (see qtitan eval --help)", argv[i]);
        if (i + 1 >= argc) return err_set(err, "option %s needs a value", argv[i]);
        *slot = argv[++i];
    }
    if (!a->model) return err_set(err, "--model HFDIR is required (see qtitan eval --help)");
    if (!a->tokens) return err_set(err, "--tokens FILE is required (see qtitan eval --help)");
    return 0;
}

/* --dump-logits must not replace one of the files eval reads (under any name): the tokens, the
 * config or a weight file would be lost behind a success. */
static int check_dump_target(const EvalArgs *a, const StSet *set, Err *err) {
    if (!a->dump) return 0;
    char *config = fs_join(a->model, "config.json");
    char *index = fs_join(a->model, "model.safetensors.index.json");
    const char *hit = fs_same_file(a->dump, a->tokens) ? a->tokens
                      : fs_same_file(a->dump, config)  ? config
                      : fs_same_file(a->dump, index)   ? index
                                                       : NULL;
    for (int i = 0; !hit && i < set->nfiles; i++)
        if (fs_same_file(a->dump, set->files[i].path)) hit = set->files[i].path;
    int rc = hit ? err_set(err,
                           "--dump-logits %s is %s, one of eval's inputs; writing it would "
                           "destroy that input",
                           a->dump, hit)
                 : 0;
    free(config);
    free(index);
    return rc;
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
    int32_t *tgt = NULL, *pos = NULL, *doc = NULL;
    float *dump = NULL;
    rc = -1;
    memset(&m, 0, sizeof m);
    /* The weights are checked against config.json before the model's memory is sized: a wrong
     * vocab or shape costs a sentence, not gigabytes first. */
    if (st_set_open(&set, a->model, err) || check_dump_target(a, &set, err) ||
        qwen3_hf_check(&spec, &set, a->model, err))
        goto out_set;
    if (qwen3_create_forward(&m, &spec, 1, (int)row, err)) goto out_set;
    if (qwen3_load_hf(&m, &set, a->model, err)) goto out_model;

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
        if (wrc) goto out_model;
    }
    rc = 0;
out_model:
    qwen3_free(&m);
out_set:
    st_set_close(&set);
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
