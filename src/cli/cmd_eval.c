/* qtitan eval: mean next-token cross-entropy of an HF Qwen3 checkpoint on token-id lines, on
 * the fp32 reference path. Lines are packed into rows with a document mask and positions
 * restarting at 0, which gives exactly the result of running each line alone. With --dataset:
 * loss, perplexity and bits per byte on a text dataset read as training reads it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "infer/choices.h"
#include "infer/dataset_eval.h"
#include "infer/infer_model.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/token_lines.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "text/chat_data.h"
#include "text/chat_template.h"

/* Rows are at least this long, so short lines share a forward pass. */
#define EVAL_MIN_ROW 2048

static const char *USAGE =
    "usage: qtitan eval --model HFDIR --tokens FILE [--adapter DIR] [--dump-logits "
    "OUT.safetensors]\n"
    "       qtitan eval (--model HFDIR | --checkpoint STEP_DIR) --dataset PATH [--adapter DIR]\n"
    "                   [--seq-len N] [--max-tokens N] [--data-format FORMAT] [--text-field F]\n"
    "                   [--chat-template PATH] [--stride S] [--dtype float32|bfloat16]\n"
    "       qtitan eval (--model HFDIR | --checkpoint STEP_DIR) --choices FILE [--adapter DIR]\n"
    "                   [--seq-len N] [--dtype float32|bfloat16] [--json]\n"
    "\n"
    "Prints `loss: X`, the mean next-token cross-entropy over all predicted positions of all\n"
    "lines of FILE (one sequence of whitespace-separated token ids per line), for the\n"
    "Qwen3ForCausalLM or Qwen3MoeForCausalLM checkpoint in HFDIR (config.json +\n"
    "safetensors) in fp32.\n"
    "--adapter DIR merges a peft adapter folder (adapter_config.json +\n"
    "adapter_model.safetensors, e.g. a LoRA run's DUMP/adapter) into the weights as peft's\n"
    "merge_and_unload does: LoRA, rsLoRA, DoRA, rank and alpha patterns, modules_to_save and\n"
    "trainable token rows.\n"
    "--dump-logits writes each line's logits as F32 logits.0, logits.1, ... (len, vocab).\n"
    "\n"
    "--dataset reads PATH as training.dataset_path is read (JSONL with a \"text\" field, text\n"
    "files, directories, globs; comma-separated) with the model's tokenizer, packs it into rows\n"
    "of --seq-len tokens (default the smaller of 2048 and the model's context) in source order,\n"
    "documents each followed by EOS and masked from each other as in training, and prints the\n"
    "mean loss over every token after the first (or the first --max-tokens of them), its\n"
    "perplexity exp(loss) and bits per byte (summed loss / ln 2 / the UTF-8 bytes of the\n"
    "predicted text, EOS excluded). STEP_DIR is a training checkpoint step or folder (of a run\n"
    "on many processes too: its ranks' parts are joined as they are read).\n"
    "--stride S evaluates as Hugging Face's sliding-window perplexity: the text as one\n"
    "sequence (documents joined by EOS, not masked from each other), in windows of --seq-len\n"
    "tokens starting every S tokens (1 <= S < --seq-len); each window predicts the tokens\n"
    "the ones before it did not, with up to seq-len - S tokens of context before them. The\n"
    "same tokens are predicted, each once.\n"
    "--text-field F reads a document's text from field (JSON Lines) or column (Parquet) F\n"
    "instead of \"text\" (training.dataset_text_field).\n"
    "--data-format messages | prompt_completion | instruction reads PATH as training reads\n"
    "conversations of that shape (training.data_format): rendered with the tokenizer folder's\n"
    "chat format, packed into rows of --seq-len tokens in source order, conversations longer\n"
    "than a row truncated; the loss is the mean over the assistant targets (as SFT training\n"
    "and its validation compute it), with their count; --max-tokens does not apply.\n"
    "--chat-template PATH renders them with another template (training.chat_template_path):\n"
    "a .jinja file, a tokenizer_config.json or a folder.\n"
    "\n"
    "--dtype float32|bfloat16 (--dataset, --choices): the weights of the matrix products\n"
    "(default float32); bfloat16 holds them without fp32 copies, as generate --dtype does.\n"
    "\n"
    "--choices FILE scores multiple-choice questions as lm-evaluation-harness scores its\n"
    "multiple_choice tasks: FILE holds one JSON object a line, {\"context\": \"...\",\n"
    "\"choices\": [\"...\", ...], \"label\": INDEX}; each choice's log-likelihood after the\n"
    "context (lm-eval's encoding: the context's trailing whitespace goes to the choice) picks\n"
    "the prediction, as is (acc), over the choice's characters (acc_norm) or its UTF-8 bytes\n"
    "(acc_bytes); each is printed with its standard error. A request longer than --seq-len + 1\n"
    "tokens (default the smaller of 2048 and the context) is cut from the left, as lm-eval cuts\n"
    "at its max_length. --json prints each question's log-likelihoods and predictions, a line\n"
    "each, before the summary.\n";

typedef struct EvalArgs {
    const char *model, *checkpoint, *tokens, *dump, *adapter, *dataset, *seq_len, *max_tokens,
        *data_format, *text_field, *chat_template, *stride, *choices, *dtype;
    int json; /* --json, with --choices */
} EvalArgs;

static int parse_args(EvalArgs *a, int argc, char **argv, Err *err) {
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            a->json = 1;
            continue;
        }
        const char **slot = strcmp(argv[i], "--model") == 0           ? &a->model
                            : strcmp(argv[i], "--checkpoint") == 0    ? &a->checkpoint
                            : strcmp(argv[i], "--tokens") == 0        ? &a->tokens
                            : strcmp(argv[i], "--dump-logits") == 0   ? &a->dump
                            : strcmp(argv[i], "--adapter") == 0       ? &a->adapter
                            : strcmp(argv[i], "--dataset") == 0       ? &a->dataset
                            : strcmp(argv[i], "--seq-len") == 0       ? &a->seq_len
                            : strcmp(argv[i], "--max-tokens") == 0    ? &a->max_tokens
                            : strcmp(argv[i], "--data-format") == 0   ? &a->data_format
                            : strcmp(argv[i], "--text-field") == 0    ? &a->text_field
                            : strcmp(argv[i], "--chat-template") == 0 ? &a->chat_template
                            : strcmp(argv[i], "--stride") == 0        ? &a->stride
                            : strcmp(argv[i], "--choices") == 0       ? &a->choices
                            : strcmp(argv[i], "--dtype") == 0         ? &a->dtype
                                                                      : NULL;
        if (!slot) return err_set(err, "unknown option %s (see qtitan eval --help)", argv[i]);
        if (i + 1 >= argc) return err_set(err, "option %s needs a value", argv[i]);
        *slot = argv[++i];
    }
    if (a->json && !a->choices) return err_set(err, "--json goes with --choices");
    if (a->dtype && strcmp(a->dtype, "float32") != 0 && strcmp(a->dtype, "bfloat16") != 0)
        return err_set(err, "--dtype %s: expected float32 or bfloat16", a->dtype);
    if (a->choices) {
        if (!a->model == !a->checkpoint)
            return err_set(err,
                           "give one of --model HFDIR or --checkpoint STEP_DIR with --choices");
        if (a->dataset || a->tokens || a->dump || a->max_tokens || a->data_format ||
            a->text_field || a->chat_template || a->stride)
            return err_set(err, "--choices takes --adapter, --seq-len, --dtype and --json; "
                                "--dataset, --tokens and their options do not go with it");
        return 0;
    }
    if (a->dataset) {
        if (!a->model == !a->checkpoint)
            return err_set(err,
                           "give one of --model HFDIR or --checkpoint STEP_DIR with --dataset");
        if (a->tokens || a->dump)
            return err_set(err, "--tokens and --dump-logits do not go with --dataset");
        return 0;
    }
    if (a->checkpoint || a->seq_len || a->max_tokens || a->data_format || a->text_field ||
        a->chat_template || a->stride || a->dtype)
        return err_set(err, "--checkpoint, --seq-len, --max-tokens, --data-format, --text-field, "
                            "--chat-template, --stride and --dtype go with --dataset (--seq-len "
                            "and --dtype with --choices too)");
    if (!a->model) return err_set(err, "--model HFDIR is required (see qtitan eval --help)");
    if (!a->tokens)
        return err_set(err, "--tokens FILE or --dataset PATH is required (see qtitan eval --help)");
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
    if (qwen3_hf_open(&set, a->model, err) || check_dump_target(a, &set, err) ||
        qwen3_hf_check(&spec, &set, a->model, err))
        goto out_set;
    if (qwen3_create_forward(&m, &spec, 1, (int)row, NULL, err)) goto out_set;
    if (qwen3_load_hf(&m, &set, a->model, err)) goto out_model;
    if (a->adapter && qwen3_merge_peft(&m, a->adapter, err)) goto out_model;

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

static int parse_count(const char *opt, const char *s, long *out, Err *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1)
        return err_set(err, "%s %s: expected an integer >= 1", opt, s);
    *out = v;
    return 0;
}

/* --data-format with a conversation shape: the loss over the assistant targets of the
 * conversations of a->dataset in source order, packed into rows of seq_len tokens. */
static int eval_chat(const EvalArgs *a, InferModel *im, DataFormat format, long seq_len, Err *err) {
    ChatFormat *cf =
        chat_format_load_at(im->tok, cli_chat_template(a->chat_template, a->adapter), err);
    if (!cf) return -1;
    DatasetEncoder enc;
    ChatData cd;
    int rc = dataset_encoder_for_tokenizer(&enc, im->tok, err);
    ChatDataOptions opt = {.path = a->dataset,
                           .format = format,
                           .seq_len = (int)seq_len,
                           .shuffle = 0,
                           .packing = 1,
                           .too_long = TOO_LONG_TRUNCATE};
    if (rc == 0) rc = chat_data_open(&cd, &opt, cf, enc.eos_id, err);
    chat_format_free(cf);
    if (rc) return -1;
    EvalPlan plan = eval_plan_chat(&cd, 0);
    EvalSource src = eval_source_chat(&cd);
    double loss_sum = 0;
    int64_t n = 0, bytes = 0;
    rc = eval_rows(&im->m, &src, &plan, 0, 1, 1, &loss_sum, &n, err);
    /* The bytes of the assistant text the targets stand for; the turns' end tokens (and EOS)
     * stand for no text, as EOS does in text data. */
    uint32_t skip[2] = {(uint32_t)enc.eos_id, 0};
    int nskip = 1;
    int64_t im_end = tokenizer_token_id(im->tok, "<|im_end|>");
    if (im_end >= 0) skip[nskip++] = (uint32_t)im_end;
    if (rc == 0) rc = eval_chat_bytes(&cd, im->tok, skip, nskip, &bytes, err);
    if (rc == 0) {
        double loss = loss_sum / (double)n;
        printf("loss: %.8f\nperplexity: %.6f\nbits_per_byte: %.6f\n", loss, exp(loss),
               bytes > 0 ? loss_sum / log(2.0) / (double)bytes : 0.0);
        printf("tokens: %lld  bytes: %lld  rows: %lld x %ld  conversations: %lld\n", (long long)n,
               (long long)bytes, (long long)plan.n_rows, seq_len, (long long)cd.n_conv);
    }
    chat_data_close(&cd);
    return rc;
}

/* The model of --model / --checkpoint for text read with its tokenizer (`opt` names the option
 * in sentences), for rows of *seq_len tokens (0: the smaller of 2048 and the context, written
 * back); stride > 0 is checked against it. The rows are sized from config.json's context
 * before the model is built, so the weights are read once. decoder: only a Decoder runs the
 * model (it holds the activations of one token). Without a config.json infer_model_open says
 * what is missing. */
static int open_for_text(const EvalArgs *a, const char *opt, long stride, long *seq_len,
                         int decoder, InferModel *im, Err *err) {
    char *step = NULL;
    if (a->checkpoint) TRY(cli_checkpoint_step(a->checkpoint, &step, err));
    const char *dir = step ? step : a->model;
    char *cfg = fs_join(dir, "config.json");
    int rc = 0;
    if (fs_exists(cfg)) {
        ModelSpec spec;
        rc = model_spec_from_hf_config(&spec, cfg, err);
        int ctx = rc == 0 ? spec.max_seq_len : 0;
        if (rc == 0 && !*seq_len) *seq_len = ctx < 2048 ? ctx : 2048;
        if (rc == 0 && *seq_len > ctx)
            rc = err_set(err, "--seq-len %ld exceeds the model's context of %d positions", *seq_len,
                         ctx);
        if (rc == 0 && stride) rc = eval_windows_check(stride, *seq_len, err);
        if (rc == 0 && !fs_exists_in(dir, "tokenizer.json"))
            rc = err_set(err, "%s has no tokenizer.json; %s needs the model's tokenizer", dir, opt);
    }
    free(cfg);
    if (rc == 0)
        rc = cli_open_model(im, a->model, a->checkpoint, a->adapter, 1,
                            *seq_len && !decoder ? (int)*seq_len : 1,
                            a->dtype && !strcmp(a->dtype, "bfloat16"), err);
    free(step);
    return rc;
}

static int eval_dataset(const EvalArgs *a, Err *err) {
    long seq_len = 0, max_tokens = 0, stride = 0;
    DataFormat format = DATA_TEXT;
    if (a->seq_len) TRY(parse_count("--seq-len", a->seq_len, &seq_len, err));
    if (a->max_tokens) TRY(parse_count("--max-tokens", a->max_tokens, &max_tokens, err));
    if (a->stride) TRY(parse_count("--stride", a->stride, &stride, err));
    if (a->data_format && config_data_format(a->data_format, &format))
        return err_set(err,
                       "--data-format %s: expected text, messages, prompt_completion or "
                       "instruction",
                       a->data_format);
    if (format == DATA_TEXT && a->chat_template)
        return err_set(err,
                       "--chat-template goes with --data-format messages, prompt_completion or "
                       "instruction (text data renders no conversation)");
    if (format != DATA_TEXT && stride)
        return err_set(err,
                       "--stride reads text data as one sequence; with --data-format %s the "
                       "conversations are rows of their own",
                       a->data_format);
    if (format != DATA_TEXT && max_tokens)
        return err_set(err,
                       "--max-tokens counts the positions of text data; with --data-format "
                       "%s every assistant target of the file counts",
                       a->data_format);
    InferModel im;
    TRY(open_for_text(a, "--dataset", stride, &seq_len, 0, &im, err));
    int rc = 0;
    if (format != DATA_TEXT) {
        rc = eval_chat(a, &im, format, seq_len, err);
        infer_model_close(&im);
        return rc;
    }
    DatasetEncoder enc;
    DatasetOptions opt;
    dataset_options_default(&opt);
    opt.path = a->dataset;
    opt.seq_len = (int)seq_len;
    opt.shuffle = 0;
    opt.text_field = a->text_field;
    Dataset ds;
    rc = dataset_encoder_for_tokenizer(&enc, im.tok, err);
    if (rc == 0) rc = dataset_open(&ds, &opt, &enc, err);
    if (rc) {
        infer_model_close(&im);
        return -1;
    }
    EvalPlan plan = eval_plan(&ds, max_tokens);
    double loss_sum = 0;
    int64_t n = 0, bytes = 0;
    if (plan.n_targets < 1)
        rc = err_set(err, "%s: the dataset has no token to predict", a->dataset);
    EvalSource src = eval_source_dataset(&ds);
    EvalPlan rows = plan; /* --stride: the windows are the rows */
    EvalWindows win = {0};
    if (rc == 0 && stride) {
        rc = eval_windows_open(&win, &ds, plan.n_targets, (int)stride, err);
        if (rc == 0) src = eval_source_windows(&win), rows = eval_windows_plan(&win);
    }
    if (rc == 0) rc = eval_rows(&im.m, &src, &rows, 0, 1, 1, &loss_sum, &n, err);
    if (rc == 0) rc = eval_plan_bytes(&ds, &plan, im.tok, &bytes, err);
    if (rc == 0) {
        double loss = loss_sum / (double)n;
        printf("loss: %.8f\nperplexity: %.6f\nbits_per_byte: %.6f\n", loss, exp(loss),
               bytes > 0 ? loss_sum / log(2.0) / (double)bytes : 0.0);
        char shape[64] = "";
        if (stride) snprintf(shape, sizeof shape, " windows, stride %ld", stride);
        printf("tokens: %lld  bytes: %lld  rows: %lld x %ld%s  documents: %lld\n", (long long)n,
               (long long)bytes, (long long)rows.n_rows, seq_len, shape, (long long)ds.n_docs);
    }
    eval_windows_close(&win);
    dataset_close(&ds);
    infer_model_close(&im);
    return rc;
}

/* The token an empty context stands for, as lm-eval's HFLM takes it (prefix_token_id): the
 * tokenizer's bos_token, else its eos_token (tokenizer_config.json), else <|endoftext|>. */
static int prefix_token(const InferModel *im, int32_t *out, Err *err) {
    char *path = fs_join(im->dir, "tokenizer_config.json");
    const char *keys[2] = {"bos_token", "eos_token"};
    int64_t id = -1;
    int exists = fs_exists(path);
    json_t *root = exists ? json_load_path(path, err) : NULL;
    if (exists && !root) {
        free(path);
        return -1;
    }
    for (int k = 0; k < 2 && root && id < 0; k++) {
        const json_t *v = json_object_get(root, keys[k]);
        if (json_is_object(v)) v = json_object_get(v, "content"); /* an AddedToken */
        if (json_is_string(v)) id = tokenizer_token_id(im->tok, json_string_value(v));
    }
    json_decref(root);
    free(path);
    if (id < 0) id = tokenizer_token_id(im->tok, "<|endoftext|>");
    if (id < 0)
        return err_set(err,
                       "%s: the tokenizer has no bos_token, eos_token or <|endoftext|> for an "
                       "empty context to stand for",
                       im->dir);
    *out = (int32_t)id;
    return 0;
}

/* --choices: multiple-choice accuracy (infer/choices.h). */
static int eval_choices(const EvalArgs *a, Err *err) {
    long seq_len = 0;
    if (a->seq_len) TRY(parse_count("--seq-len", a->seq_len, &seq_len, err));
    ChoiceSet cs;
    TRY(choice_set_read(&cs, a->choices, err));
    InferModel im;
    if (open_for_text(a, "--choices", 0, &seq_len, 1, &im, err)) {
        choice_set_free(&cs);
        return -1;
    }
    int32_t prefix = 0;
    double *ll = xcalloc((size_t)cs.n_choices, sizeof *ll);
    int *pred = xcalloc((size_t)cs.n * 3, sizeof *pred);
    ChoiceStats st;
    int rc = prefix_token(&im, &prefix, err);
    if (rc == 0) rc = choice_score(&im.m, (int)seq_len, im.tok, prefix, &cs, ll, &st, err);
    if (rc) err_wrap(err, "%s", a->choices);
    if (rc == 0) {
        ChoiceMetrics mt;
        choice_metrics(&cs, ll, &mt, pred);
        for (int i = 0, k = 0; a->json && i < cs.n; k += cs.item[i++].n) {
            json_t *o = json_object(), *lls = json_array();
            for (int j = 0; j < cs.item[i].n; j++)
                json_array_append_new(lls, json_real(ll[k + j]));
            json_object_set_new(o, "line", json_integer(cs.item[i].line));
            json_object_set_new(o, "loglikelihoods", lls);
            json_object_set_new(o, "pred", json_integer(pred[3 * i]));
            json_object_set_new(o, "pred_norm", json_integer(pred[3 * i + 1]));
            json_object_set_new(o, "pred_bytes", json_integer(pred[3 * i + 2]));
            json_object_set_new(
                o, "label", cs.item[i].label >= 0 ? json_integer(cs.item[i].label) : json_null());
            char *text = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
            puts(text);
            free(text);
            json_decref(o);
        }
        if (mt.n > 0)
            printf("acc: %.6f  stderr %.6f\nacc_norm: %.6f  stderr %.6f\n"
                   "acc_bytes: %.6f  stderr %.6f\n",
                   mt.acc, mt.acc_se, mt.acc_norm, mt.acc_norm_se, mt.acc_bytes, mt.acc_bytes_se);
        printf("questions: %d  labelled: %d  choices: %ld  tokens: %ld  passes: %ld  seq-len: "
               "%ld\n",
               cs.n, mt.n, cs.n_choices, st.tokens, st.rows, seq_len);
    }
    free(ll), free(pred);
    infer_model_close(&im);
    choice_set_free(&cs);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    log_info_to_stderr(); /* stdout carries the results only */
    EvalArgs a;
    Err err;
    if (parse_args(&a, argc, argv, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    if (a.choices   ? eval_choices(&a, &err)
        : a.dataset ? eval_dataset(&a, &err)
                    : eval_run(&a, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
