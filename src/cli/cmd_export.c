/* qtitan export: a training checkpoint as a Hugging Face model directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/fs.h"
#include "infer/infer_model.h"
#include "io/hf_export.h"
#include "train/ckpt_dist.h"
#include "train/train_hf.h"

static const char *USAGE =
    "usage: qtitan export --checkpoint STEP_DIR --out HFDIR [--dtype float32|bfloat16|float16]\n"
    "                     [--max-shard-size 5GB] [--tokenizer DIR]\n"
    "       qtitan export --model HFDIR --adapter DIR --out HFDIR [--dtype ...]\n"
    "                     [--max-shard-size 5GB] [--tokenizer DIR]\n"
    "\n"
    "Writes checkpoint STEP_DIR (DUMP/checkpoint/step-N, or a checkpoint folder: its newest\n"
    "complete step) as an HF model directory that transformers loads with\n"
    "AutoModelForCausalLM.from_pretrained: config.json, model.safetensors or shards with\n"
    "model.safetensors.index.json, and the tokenizer files saved in the checkpoint (--tokenizer\n"
    "takes them from DIR instead). --dtype defaults to float32; lm_head.weight is left out when\n"
    "the embeddings are tied.\n"
    "\n"
    "A run on many processes: STEP_DIR is its checkpoint folder (with latest.json; its newest\n"
    "committed step) or FOLDER/rank-K/step-N (that step); each tensor is joined from the\n"
    "ranks' pieces while it is written; the tokenizer files are those the run saved in the\n"
    "folder (--tokenizer DIR: DIR's).\n"
    "\n"
    "--model HFDIR --adapter DIR writes the HF model HFDIR with the peft adapter folder DIR\n"
    "merged into its weights, as peft's merge_and_unload then save_pretrained write it (LoRA,\n"
    "rsLoRA, DoRA, rank and alpha patterns, modules_to_save, trainable tokens): the tokenizer\n"
    "files and generation_config.json of HFDIR, then those the adapter folder holds (a LoRA\n"
    "run saves its tokenizer and chat template there).\n";

static int parse_dtype(const char *s, DType *out) {
    *out = strcmp(s, "float32") == 0    ? DT_F32
           : strcmp(s, "bfloat16") == 0 ? DT_BF16
           : strcmp(s, "float16") == 0  ? DT_F16
                                        : DT_U8;
    return *out == DT_U8 ? -1 : 0;
}

/* --model with --adapter: the model with the adapter merged (infer_model_open, fp32), written
 * through hf_export; the tokenizer files of the model (or --tokenizer), then the adapter
 * folder's over them. */
static int export_merged(const char *model, const char *adapter, const char *out,
                         const HfExportOptions *o, Err *err) {
    TRY(hf_export_check_out_dir(out, err));
    InferModel im;
    TRY(infer_model_open(&im, model, NULL, adapter, 1, 1, 0, err));
    HfExportTensor *ts = xcalloc((size_t)im.m.nparams, sizeof *ts);
    int n = 0;
    for (int i = 0; i < im.m.nparams; i++)
        if (im.m.table[i].kind->hf)
            ts[n++] = (HfExportTensor){.name = im.m.table[i].name,
                                       .numel = im.m.table[i].numel,
                                       .data = im.m.table[i].data};
    HfExportOptions opt = *o;
    opt.extra = &im.extra;
    if (!opt.tokenizer || !*opt.tokenizer) opt.tokenizer = model;
    int rc = hf_export(out, &im.m.spec, ts, n, &opt, err);
    if (rc == 0 && !o->tokenizer && fs_exists_in(adapter, "tokenizer.json"))
        rc = hf_export_copy_tokenizer(adapter, out, err);
    free(ts);
    infer_model_close(&im);
    return rc;
}

int cmd_export(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    const char *ckpt = NULL, *out = NULL, *dtype = "float32", *shard = NULL, *tok = NULL;
    const char *model = NULL, *adapter = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--checkpoint") == 0       ? &ckpt
                            : strcmp(argv[i], "--model") == 0          ? &model
                            : strcmp(argv[i], "--adapter") == 0        ? &adapter
                            : strcmp(argv[i], "--out") == 0            ? &out
                            : strcmp(argv[i], "--dtype") == 0          ? &dtype
                            : strcmp(argv[i], "--max-shard-size") == 0 ? &shard
                            : strcmp(argv[i], "--tokenizer") == 0      ? &tok
                                                                       : NULL;
        if (!slot || i + 1 >= argc) {
            fprintf(stderr, "error: %s option %s (see qtitan export --help)\n",
                    slot ? "missing value for" : "unknown", argv[i]);
            return 2;
        }
        *slot = argv[++i];
    }
    if (!!ckpt == !!model || !out || (model && !adapter) || (ckpt && adapter)) {
        fprintf(stderr, "error: give --checkpoint STEP_DIR, or --model HFDIR with --adapter DIR, "
                        "and --out (see qtitan export --help)\n");
        return 2;
    }
    Err err;
    HfExportOptions o = {.tokenizer = tok};
    if (parse_dtype(dtype, &o.dtype) != 0) {
        fprintf(stderr, "error: --dtype %s is not one of float32, bfloat16, float16\n", dtype);
        return 2;
    }
    if (shard && hf_parse_size(shard, &o.max_shard_bytes, &err) != 0) {
        fprintf(stderr, "error: --max-shard-size: %s\n", err.msg);
        return 2;
    }
    if (tok && fs_is_dir(tok)) {
        /* Files are copied from the directory when present: without this check a wrong
         * directory gives an HF model with no tokenizer and no error. */
        if (!fs_exists_in(tok, "tokenizer.json")) {
            fprintf(stderr, "error: --tokenizer %s: the directory has no tokenizer.json\n", tok);
            return 1;
        }
    }
    if (model) {
        int rc = export_merged(model, adapter, out, &o, &err);
        if (rc == 0)
            fprintf(stderr, "export: wrote %s from %s with the adapter %s merged (%s)\n", out,
                    model, adapter, dtype);
        else
            fprintf(stderr, "error: %s\n", err.msg);
        return rc == 0 ? 0 : 1;
    }
    if (ckpt_dist_is_sharded_path(ckpt)) {
        /* A run on many processes: the ranks' pieces are joined while the files are written. */
        int64_t step;
        int rc = ckpt_dist_export_path(ckpt, out, o.dtype, o.max_shard_bytes, tok, &step, &err);
        if (rc == 0)
            fprintf(stderr, "export: wrote %s from step %lld of the sharded checkpoint %s (%s)\n",
                    out, (long long)step, ckpt, dtype);
        else
            fprintf(stderr, "error: %s\n", err.msg);
        return rc == 0 ? 0 : 1;
    }
    char *state = fs_join(ckpt, "train_state.json");
    char *step_dir = NULL;
    int rc = 0;
    if (fs_exists(state)) {
        step_dir = xstrdup(ckpt);
    } else {
        int64_t step;
        int found = ckpt_find_latest(ckpt, &step, &step_dir, &err);
        if (found == 0)
            rc = err_set(&err,
                         "%s is not a checkpoint (no train_state.json) and holds "
                         "no complete step-N checkpoint",
                         ckpt);
        else if (found < 0)
            rc = -1;
    }
    free(state);
    if (rc == 0) rc = train_hf_export_checkpoint(step_dir, out, &o, &err);
    if (rc == 0)
        fprintf(stderr, "export: wrote %s from %s (%s)\n", out, step_dir, dtype);
    else
        fprintf(stderr, "error: %s\n", err.msg);
    free(step_dir);
    return rc == 0 ? 0 : 1;
}
