/* qtitan generate: text from an HF model directory or a training checkpoint, through the
 * KV-cache decoder (infer/). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "infer/beam.h"
#include "infer/gen_config.h"
#include "infer/generate.h"
#include "infer/infer_model.h"
#include "text/chat_data.h"
#include "text/chat_template.h"
#include "text/jsonl.h"
#include "text/prompt_lines.h"

#define MAX_STOP 16

static const char *USAGE =
    "usage: qtitan generate (--model HFDIR | --checkpoint STEP_DIR)\n"
    "                       (--prompt TEXT | --prompt-file F | --messages F | --interactive)\n"
    "                       [options]\n"
    "\n"
    "Continues each prompt with the model and prints the new text: one prompt streams it to\n"
    "stdout as it comes; a prompt file (one prompt a line; blank lines skipped) runs its\n"
    "prompts as one batch and prints each completion under a `--- prompt N` line. Prompt and\n"
    "generation speed (tokens/s) go to stderr at the end. Generation stops at an EOS id\n"
    "(config.json's and generation_config.json's eos_token_id, <|im_end|>, <|endoftext|>),\n"
    "at a --stop string, or after --max-new-tokens.\n"
    "\n"
    "  --model HFDIR          an HF model directory (config.json, safetensors, tokenizer.json)\n"
    "  --checkpoint STEP_DIR  a training checkpoint step (DUMP/checkpoint/step-N) or folder\n"
    "                         (its newest complete step), with the config.json and tokenizer\n"
    "                         files the trainer saved in it; a run on many processes: its\n"
    "                         folder or FOLDER/rank-K/step-N, the ranks' parts joined as read\n"
    "  --adapter DIR          a peft LoRA adapter folder (adapter_config.json +\n"
    "                         adapter_model.safetensors, e.g. a LoRA run's DUMP/adapter) for the\n"
    "                         base model, merged into its weights as the run's merged export is\n"
    "  --chat                 wrap each prompt as a user turn in the tokenizer's chat format\n"
    "                         (Qwen3: <|im_start|>role ... <|im_end|>), as transformers'\n"
    "                         apply_chat_template(add_generation_prompt=True) renders it\n"
    "  --messages F           continue conversations: F holds one a line, as chat data does\n"
    "                         ({\"messages\": [{\"role\", \"content\"}, ...], \"tools\": [...]},\n"
    "                         or ShareGPT's conversations / from / value), each rendered in\n"
    "                         the chat format with the open assistant turn (implies --chat;\n"
    "                         a line's own tools win over --tools); run as one batch\n"
    "  --interactive          chat: each line of stdin is a user turn, answered (streamed)\n"
    "                         with the whole conversation so far in the chat format; /reset\n"
    "                         starts a new one, /exit or the end of input ends (implies\n"
    "                         --chat; turn T samples from --seed + T)\n"
    "  --chat-template PATH   with --chat: render with this template (a .jinja file, a\n"
    "                         tokenizer_config.json or a folder), as apply_chat_template(\n"
    "                         chat_template=...) does; default: the --adapter folder's when it\n"
    "                         holds one (as TRL saves it there), else the model's\n"
    "  --system TEXT          with --chat: a system turn first\n"
    "  --no-thinking          with --chat: enable_thinking=False (an empty think block)\n"
    "  --tools FILE           with --chat: offer the tools of FILE, a JSON array of tool\n"
    "                         definitions (JSON schemas, as apply_chat_template's tools=),\n"
    "                         in the system turn\n"
    "  --max-new-tokens N     default 128\n"
    "  --temperature T        0 = greedy; default 0.8\n"
    "                         (a model folder's generation_config.json gives the defaults of\n"
    "                         these sampling options instead, as transformers' generate()\n"
    "                         takes them: greedy unless do_sample is true, then its\n"
    "                         temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff,\n"
    "                         eta_cutoff, or 1.0, 50, 1.0, none, 1.0, 0, 0; and\n"
    "                         its repetition_penalty and no_repeat_ngram_size, or 1 and 0)\n"
    "  --top-k K              keep the K most likely tokens (0 = off, the default)\n"
    "  --top-p P              keep the most likely tokens whose probabilities sum to P, in\n"
    "                         (0, 1]; default 1 (off)\n"
    "  --min-p P              keep tokens at least P times as likely as the best, in [0, 1];\n"
    "                         default 0 (off)\n"
    "  --typical-p P          keep the tokens whose surprise is closest to the entropy until\n"
    "                         their probabilities sum to P, in (0, 1]; default 1 (off)\n"
    "  --epsilon-cutoff E     keep the tokens of probability >= E, in [0, 1); default 0 (off)\n"
    "  --eta-cutoff E         keep the tokens of probability >= min(E, sqrt(E) exp(-entropy)),\n"
    "                         in [0, 1); default 0 (off)\n"
    "  --repetition-penalty R > 0: the logits of ids already in the prompt or the completion\n"
    "                         are divided by R where positive, multiplied where negative\n"
    "                         (transformers' repetition_penalty; greedy decoding too);\n"
    "                         default 1 (off)\n"
    "  --no-repeat-ngram-size N  never complete an N-gram the prompt or the completion\n"
    "                         already holds (transformers' no_repeat_ngram_size; greedy\n"
    "                         decoding too); default 0 (off)\n"
    "  --assistant-model DIR  assisted (speculative) decoding with a smaller draft model of the\n"
    "                         same vocabulary (transformers' assistant_model): its greedy ids\n"
    "                         are checked in one pass of the model and kept while they are\n"
    "                         what would be chosen; the same ids as without it\n"
    "  --assistant-tokens N   draft ids a step (num_assistant_tokens); default 20, or\n"
    "                         generation_config.json's\n"
    "  --assistant-confidence P  stop drafting after an id the draft gives a probability below\n"
    "                         P (assistant_confidence_threshold); default 0.4, or\n"
    "                         generation_config.json's\n"
    "  --prompt-lookup N      prompt lookup decoding (transformers' prompt_lookup_num_tokens):\n"
    "                         where the last ids occurred before in the prompt or completion,\n"
    "                         the up to N ids that followed are checked in one pass and kept\n"
    "                         while they are what would be chosen; the same ids as without it,\n"
    "                         fewer passes on text that repeats its input; default 0 (off), or\n"
    "                         generation_config.json's\n"
    "  --prompt-lookup-ngram G  match the last G ids, then fewer (max_matching_ngram_size);\n"
    "                         default 2\n"
    "  --num-return-sequences N  N completions of each prompt, sampled (temperature > 0), as\n"
    "                         transformers' num_return_sequences: the prompt is run once and\n"
    "                         its cache copied; with --num-beams, the N best beams; default 1\n"
    "  --num-beams N          beam search with N beams (transformers' num_beams with\n"
    "                         do_sample=False; needs temperature 0); default 1, or\n"
    "                         generation_config.json's\n"
    "  --length-penalty F     beam search: a finished beam's score is its summed\n"
    "                         log-probability over (its new tokens) ^ F; default 1\n"
    "  --early-stopping true|false|never  beam search: stop once N beams have finished\n"
    "                         (true), when no running beam can beat them (false, the\n"
    "                         default), or as false with F taken at --max-new-tokens (never)\n"
    "  --seed N               default 0; sequence i of the batch (prompt by prompt, each\n"
    "                         prompt's completions in turn) draws from stream i of the seed\n"
    "  --stop STRING          end a completion before STRING (repeatable, up to 16)\n"
    "  --min-new-tokens N     no EOS before N new tokens (transformers' min_new_tokens);\n"
    "                         default 0, or generation_config.json's (which also gives\n"
    "                         transformers' other logits processors, applied as it applies\n"
    "                         them: min_length, suppress_tokens, begin_suppress_tokens,\n"
    "                         bad_words_ids, sequence_bias, encoder_repetition_penalty,\n"
    "                         encoder_no_repeat_ngram_size, forced_bos_token_id,\n"
    "                         forced_eos_token_id, exponential_decay_length_penalty)\n"
    "  --dtype float32|bfloat16  weights of the matrix products (default float32)\n"
    "  --json                 one JSON object a completion: prompt, prompt_ids, ids, text,\n"
    "                         logprobs (the model's log-probability of each new id) and\n"
    "                         finish_reason (eos, stop, length); with --num-return-sequences,\n"
    "                         also sequence (1-based, within its prompt); with --num-beams,\n"
    "                         also score (transformers' sequences_scores)\n";

typedef struct GenArgs {
    const char *model, *checkpoint, *adapter, *prompt, *prompt_file, *system, *dtype, *tools_file,
        *chat_template;
    const char *messages_file; /* --messages: conversations to continue, one a line */
    const char *assistant;     /* --assistant-model: the draft model's folder */
    int assistant_tokens, set_assistant_tokens; /* --assistant-tokens */
    float assistant_confidence;                 /* --assistant-confidence */
    int set_assistant_confidence;
    int64_t *linenos; /* with --messages: each conversation's line in the file */
    json_t *tools;    /* --tools FILE's array, read by generate_run */
    int chat, thinking, json, interactive;
    long max_new;
    long n_return; /* --num-return-sequences */
    SampleParams sp;
    BeamParams beams;
    LogitProcs procs; /* --min-new-tokens, and generation_config.json's logits processors */
    /* Which of --max-new-tokens, --temperature, --top-k, --top-p, --min-p,
     * --repetition-penalty, --no-repeat-ngram-size were given: the others come from
     * generation_config.json when the model has one. */
    int set_max_new, set_temperature, set_top_k, set_top_p, set_min_p, set_rep, set_ngram;
    int set_beams, set_length_penalty, set_early_stopping;  /* likewise for beam search */
    int set_min_new, set_typical, set_epsilon, set_eta;     /* --typical-p and the cutoffs */
    int lookup, lookup_ngram, set_lookup, set_lookup_ngram; /* --prompt-lookup[-ngram] */
    unsigned long long seed;
    const char *stop[MAX_STOP];
    int n_stop;
} GenArgs;

static int parse_long(const char *opt, const char *s, long lo, long *out, Err *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return err_set(err, "%s %s: expected an integer >= %ld", opt, s, lo);
    *out = v;
    return 0;
}

/* A count flag: an integer >= lo into *out, values above cap taken as cap (they mean "all"),
 * and *set marked. */
static int parse_count(const char *opt, const char *s, long lo, int cap, int *out, int *set,
                       Err *err) {
    long v;
    TRY(parse_long(opt, s, lo, &v, err));
    *out = v > cap ? cap : (int)v;
    *set = 1;
    return 0;
}

static int parse_float(const char *opt, const char *s, float *out, Err *err) {
    double v;
    TRY(cli_number(opt, s, &v, err));
    *out = (float)v;
    return 0;
}

static int parse_args(GenArgs *a, int argc, char **argv, Err *err) {
    memset(a, 0, sizeof *a);
    a->max_new = 128;
    a->n_return = 1;
    a->thinking = 1;
    a->dtype = "float32";
    a->beams = BEAM_PARAMS_DEFAULT;
    a->assistant_tokens = 20;       /* transformers' num_assistant_tokens and */
    a->assistant_confidence = 0.4f; /* assistant_confidence_threshold */
    a->sp = (SampleParams){.temperature = 0.8f,
                           .top_k = 0,
                           .top_p = 1.0f,
                           .min_p = 0.0f,
                           .typical_p = 1.0f,
                           .repetition_penalty = 1.0f};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "--chat") == 0) {
            a->chat = 1;
            continue;
        }
        if (strcmp(o, "--no-thinking") == 0) {
            a->thinking = 0;
            continue;
        }
        if (strcmp(o, "--json") == 0) {
            a->json = 1;
            continue;
        }
        if (strcmp(o, "--interactive") == 0) {
            a->interactive = 1;
            continue;
        }
        if (i + 1 >= argc)
            return err_set(err, "option %s needs a value (see qtitan generate --help)", o);
        const char *v = argv[++i];
        long n;
        if (strcmp(o, "--model") == 0)
            a->model = v;
        else if (strcmp(o, "--checkpoint") == 0)
            a->checkpoint = v;
        else if (strcmp(o, "--adapter") == 0)
            a->adapter = v;
        else if (strcmp(o, "--assistant-model") == 0)
            a->assistant = v;
        else if (strcmp(o, "--prompt") == 0)
            a->prompt = v;
        else if (strcmp(o, "--prompt-file") == 0)
            a->prompt_file = v;
        else if (strcmp(o, "--messages") == 0)
            a->messages_file = v;
        else if (strcmp(o, "--system") == 0)
            a->system = v;
        else if (strcmp(o, "--tools") == 0)
            a->tools_file = v;
        else if (strcmp(o, "--chat-template") == 0)
            a->chat_template = v;
        else if (strcmp(o, "--dtype") == 0)
            a->dtype = v;
        else if (strcmp(o, "--max-new-tokens") == 0) {
            TRY(parse_long(o, v, 1, &a->max_new, err));
            a->set_max_new = 1;
        } else if (strcmp(o, "--top-k") == 0) {
            TRY(parse_count(o, v, 0, 1000000000, &a->sp.top_k, &a->set_top_k, err));
        } else if (strcmp(o, "--no-repeat-ngram-size") == 0) {
            TRY(parse_count(o, v, 0, 1000000, &a->sp.no_repeat_ngram_size, &a->set_ngram, err));
        } else if (strcmp(o, "--assistant-tokens") == 0) {
            TRY(parse_count(o, v, 1, GEN_MAX_CANDIDATES, &a->assistant_tokens,
                            &a->set_assistant_tokens, err));
        } else if (strcmp(o, "--assistant-confidence") == 0) {
            TRY(parse_float(o, v, &a->assistant_confidence, err));
            if (!(a->assistant_confidence >= 0 && a->assistant_confidence <= 1))
                return err_set(err, "--assistant-confidence %s: must be in [0, 1]", v);
            a->set_assistant_confidence = 1;
        } else if (strcmp(o, "--prompt-lookup") == 0) {
            TRY(parse_count(o, v, 0, GEN_MAX_CANDIDATES, &a->lookup, &a->set_lookup, err));
        } else if (strcmp(o, "--prompt-lookup-ngram") == 0) {
            TRY(parse_count(o, v, 1, 64, &a->lookup_ngram, &a->set_lookup_ngram, err));
        } else if (strcmp(o, "--num-return-sequences") == 0) {
            TRY(parse_long(o, v, 1, &a->n_return, err));
            if (a->n_return > 65536)
                return err_set(err, "--num-return-sequences %s: at most 65536", v);
        } else if (strcmp(o, "--min-new-tokens") == 0) {
            TRY(parse_count(o, v, 0, 1000000000, &a->procs.min_new_tokens, &a->set_min_new, err));
        } else if (strcmp(o, "--num-beams") == 0) {
            TRY(parse_long(o, v, 1, &n, err));
            if (n > 1024) return err_set(err, "--num-beams %s: at most 1024", v);
            a->beams.num_beams = (int)n;
            a->set_beams = 1;
        } else if (strcmp(o, "--length-penalty") == 0) {
            TRY(parse_float(o, v, &a->beams.length_penalty, err));
            if (!isfinite(a->beams.length_penalty))
                return err_set(err, "--length-penalty %s: expected a finite number", v);
            a->set_length_penalty = 1;
        } else if (strcmp(o, "--early-stopping") == 0) {
            if (strcmp(v, "true") == 0)
                a->beams.early_stopping = BEAM_STOP_EARLY;
            else if (strcmp(v, "false") == 0)
                a->beams.early_stopping = BEAM_STOP_HEURISTIC;
            else if (strcmp(v, "never") == 0)
                a->beams.early_stopping = BEAM_STOP_NEVER;
            else
                return err_set(err, "--early-stopping %s: expected true, false or never", v);
            a->set_early_stopping = 1;
        } else if (strcmp(o, "--seed") == 0) {
            TRY(parse_long(o, v, 0, &n, err));
            a->seed = (unsigned long long)n;
        } else if (strcmp(o, "--temperature") == 0) {
            TRY(parse_float(o, v, &a->sp.temperature, err));
            if (a->sp.temperature < 0)
                return err_set(err, "--temperature %s: must be >= 0 (0 is greedy)", v);
            a->set_temperature = 1;
        } else if (strcmp(o, "--top-p") == 0) {
            TRY(parse_float(o, v, &a->sp.top_p, err));
            if (!(a->sp.top_p > 0 && a->sp.top_p <= 1))
                return err_set(err, "--top-p %s: must be in (0, 1]", v);
            a->set_top_p = 1;
        } else if (strcmp(o, "--min-p") == 0) {
            TRY(parse_float(o, v, &a->sp.min_p, err));
            if (!(a->sp.min_p >= 0 && a->sp.min_p <= 1))
                return err_set(err, "--min-p %s: must be in [0, 1]", v);
            a->set_min_p = 1;
        } else if (strcmp(o, "--typical-p") == 0) {
            TRY(parse_float(o, v, &a->sp.typical_p, err));
            if (!(a->sp.typical_p > 0 && a->sp.typical_p <= 1))
                return err_set(err, "--typical-p %s: must be in (0, 1]", v);
            a->set_typical = 1;
        } else if (strcmp(o, "--epsilon-cutoff") == 0 || strcmp(o, "--eta-cutoff") == 0) {
            int eps = o[2] == 'e' && o[3] == 'p';
            float *f = eps ? &a->sp.epsilon : &a->sp.eta;
            TRY(parse_float(o, v, f, err));
            if (!(*f >= 0 && *f < 1)) return err_set(err, "%s %s: must be in [0, 1)", o, v);
            *(eps ? &a->set_epsilon : &a->set_eta) = 1;
        } else if (strcmp(o, "--repetition-penalty") == 0) {
            TRY(parse_float(o, v, &a->sp.repetition_penalty, err));
            if (!(a->sp.repetition_penalty > 0) || isinf(a->sp.repetition_penalty))
                return err_set(err, "--repetition-penalty %s: must be a number > 0 (1 = off)", v);
            a->set_rep = 1;
        } else if (strcmp(o, "--stop") == 0) {
            if (!*v) return err_set(err, "--stop: the stop string is empty");
            if (a->n_stop == MAX_STOP)
                return err_set(err, "--stop: at most %d stop strings", MAX_STOP);
            a->stop[a->n_stop++] = v;
        } else {
            return err_set(err, "unknown option %s (see qtitan generate --help)", o);
        }
    }
    if (!a->model == !a->checkpoint)
        return err_set(
            err, "give one of --model HFDIR or --checkpoint STEP_DIR (see qtitan generate --help)");
    if (!!a->prompt + !!a->prompt_file + !!a->messages_file + a->interactive != 1)
        return err_set(err, "give one of --prompt TEXT, --prompt-file F, --messages F or "
                            "--interactive (see qtitan generate --help)");
    if (a->interactive) a->chat = 1;
    if (a->interactive && a->n_return > 1)
        return err_set(err, "--num-return-sequences does not apply to --interactive (one answer "
                            "a turn)");
    if (a->interactive && a->beams.num_beams > 1)
        return err_set(err, "--num-beams does not apply to --interactive (answers are streamed)");
    if (a->messages_file && a->system)
        return err_set(err, "--system does not apply to --messages: a conversation gives its own "
                            "system turn");
    if (a->messages_file) a->chat = 1;
    if (strcmp(a->dtype, "float32") != 0 && strcmp(a->dtype, "bfloat16") != 0)
        return err_set(err, "--dtype %s: expected float32 or bfloat16", a->dtype);
    if ((a->system || !a->thinking || a->tools_file || a->chat_template) && !a->chat)
        return err_set(err, "--system, --tools, --chat-template and --no-thinking need --chat");
    return 0;
}

/* --messages F: its conversations, one JSON object a line (blank lines skipped), as p's texts,
 * and their line numbers. */
static int read_conversation_lines(PromptLines *p, GenArgs *a, Err *err) {
    char *data;
    size_t len, pos, line_len;
    TRY(fs_read_all(a->messages_file, &data, &len, err));
    *p = (PromptLines){.data = data};
    int cap = 0;
    const char *line;
    int64_t ln = 0;
    pos = jsonl_bom_len(data, len);
    while (jsonl_next_line(data, len, &pos, &line, &line_len) == 0) {
        ln++;
        if (jsonl_is_blank(line, line_len)) continue;
        if (p->n == cap) {
            cap = cap ? 2 * cap : 16;
            p->text = xrealloc(p->text, (size_t)cap * sizeof *p->text);
            a->linenos = xrealloc(a->linenos, (size_t)cap * sizeof *a->linenos);
        }
        ((char *)line)[line_len] = 0; /* its line end, or the buffer's final NUL */
        p->text[p->n] = (char *)line;
        a->linenos[p->n++] = ln;
    }
    if (p->n == 0) {
        prompt_lines_free(p);
        return err_set(err, "%s holds no conversation (one JSON object a line)", a->messages_file);
    }
    return 0;
}

/* The prompts' texts: --prompt, the prompts of --prompt-file, or the conversations of
 * --messages. */
static int read_prompts(PromptLines *p, GenArgs *a, Err *err) {
    if (a->messages_file) return read_conversation_lines(p, a, err);
    if (a->prompt) return prompt_lines_one(p, a->prompt, err);
    char *data;
    size_t len;
    TRY(fs_read_all(a->prompt_file, &data, &len, err));
    int rc = prompt_lines_split(p, data, len, a->prompt_file, err);
    free(data);
    return rc;
}

/* Conversation i of --messages rendered for generation: the line read as chat data's messages
 * (text/chat_data.h: role / content, or ShareGPT's names; its "tools", else --tools), then
 * the open assistant turn. */
static int encode_conversation(const GenArgs *a, const ChatFormat *cf, const char *line, int i,
                               IdVec *out, Err *err) {
    json_t *root;
    ChatMessage *msgs;
    size_t n;
    const json_t *tools;
    TRY(chat_data_parse_line(line, strlen(line), DATA_MESSAGES, a->messages_file, a->linenos[i],
                             &root, &msgs, &n, &tools, err));
    ChatTokens ct = {0};
    ChatOptions opt = {.add_generation_prompt = 1,
                       .enable_thinking = a->thinking,
                       .tools = tools ? tools : a->tools};
    int rc = chat_render(cf, msgs, n, opt, &ct, err);
    if (rc) err_wrap(err, "%s:%lld", a->messages_file, (long long)a->linenos[i]);
    for (size_t k = 0; rc == 0 && k < ct.n; k++)
        idvec_push(out, ct.ids[k]);
    chat_tokens_free(&ct);
    free(msgs);
    json_decref(root);
    return rc;
}

/* Prompt i's ids: the text, with --chat the rendered user turn, with --messages the rendered
 * conversation. */
static int encode_prompt(const GenArgs *a, const Tokenizer *tok, const ChatFormat *cf,
                         const char *text, int i, IdVec *out, Err *err) {
    if (a->messages_file) return encode_conversation(a, cf, text, i, out, err);
    if (!cf) return tokenizer_encode(tok, text, strlen(text), out, err);
    return chat_render_prompt(cf, a->system, text, a->thinking, a->tools, out, err);
}

static void stream_stdout(void *ctx, int i, const char *text, size_t len) {
    (void)ctx, (void)i;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* sequence: the completion's number within its prompt (--num-return-sequences), 0: none. */
static void print_json(const char *prompt, const IdVec *pid, const GenOutput *g, int sequence,
                       int beams) {
    json_t *o = json_object(), *pids = json_array(), *ids = json_array(), *lps = json_array();
    for (size_t t = 0; t < pid->n; t++)
        json_array_append_new(pids, json_integer(pid->ids[t]));
    for (int t = 0; t < g->n; t++) {
        json_array_append_new(ids, json_integer(g->ids[t]));
        json_array_append_new(lps, json_real(g->logprobs[t]));
    }
    json_object_set_new(o, "prompt", json_string(prompt));
    json_object_set_new(o, "prompt_ids", pids);
    json_object_set_new(o, "ids", ids);
    json_object_set_new(o, "text", json_stringn(g->text ? g->text : "", g->text_len));
    json_object_set_new(o, "logprobs", lps);
    json_object_set_new(o, "finish_reason", json_string(g->finish));
    if (sequence) json_object_set_new(o, "sequence", json_integer(sequence));
    if (beams) json_object_set_new(o, "score", json_real(g->score));
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    json_decref(o);
}

/* --tools FILE: a JSON array of tool definitions. */
static int read_tools(GenArgs *a, Err *err) {
    if (!a->tools_file) return 0;
    a->tools = json_load_path(a->tools_file, err);
    if (!a->tools) return -1;
    if (chat_tools_check(a->tools, err)) {
        err_wrap(err, "%s", a->tools_file);
        json_decref(a->tools);
        a->tools = NULL;
        return -1;
    }
    return 0;
}

/* The model folder's generation_config.json (infer/gen_config.h): its EOS ids join the stop
 * set, and its sampling and max_new_tokens fill what the flags leave unset, as transformers'
 * generate() takes them; stderr says what came from it and what it sets that is not applied. */
static int apply_gen_config(GenArgs *a, InferModel *im, Err *err) {
    GenConfig gc;
    TRY(gen_config_read(im->dir, &gc, err));
    if (!gc.found) return 0;
    for (int i = 0; i < gc.n_eos; i++)
        infer_model_add_eos(im, gc.eos[i]);
    if (!a->set_temperature) a->sp.temperature = gc.sp.temperature;
    if (!a->set_top_k) a->sp.top_k = gc.sp.top_k;
    if (!a->set_top_p) a->sp.top_p = gc.sp.top_p;
    if (!a->set_min_p) a->sp.min_p = gc.sp.min_p;
    if (!a->set_typical) a->sp.typical_p = gc.sp.typical_p;
    if (!a->set_epsilon) a->sp.epsilon = gc.sp.epsilon;
    if (!a->set_eta) a->sp.eta = gc.sp.eta;
    if (!a->set_rep) a->sp.repetition_penalty = gc.sp.repetition_penalty;
    if (!a->set_ngram) a->sp.no_repeat_ngram_size = gc.sp.no_repeat_ngram_size;
    if (!a->set_lookup) a->lookup = gc.lookup_tokens;
    if (!a->set_assistant_tokens && gc.assistant_tokens > 0)
        a->assistant_tokens = gc.assistant_tokens;
    if (!a->set_assistant_confidence && gc.assistant_confidence >= 0)
        a->assistant_confidence = gc.assistant_confidence;
    if (!a->set_lookup_ngram) a->lookup_ngram = gc.lookup_ngram;
    if (!a->set_max_new && gc.max_new_tokens > 0) a->max_new = gc.max_new_tokens;
    int min_new = a->procs.min_new_tokens;
    a->procs = gc.procs;
    if (a->set_min_new) a->procs.min_new_tokens = min_new;
    if (!a->set_beams) a->beams.num_beams = gc.beams.num_beams;
    if (!a->set_length_penalty) a->beams.length_penalty = gc.beams.length_penalty;
    if (!a->set_early_stopping) a->beams.early_stopping = gc.beams.early_stopping;
    char how[192];
    sample_describe(how, sizeof how, &a->sp);
    char beams[96] = "", procs[320];
    sample_procs_describe(procs, sizeof procs, &a->procs);
    if (a->beams.num_beams > 1)
        snprintf(beams, sizeof beams, ", %d beams, length-penalty %g, early-stopping %s",
                 a->beams.num_beams, a->beams.length_penalty,
                 beam_stop_name(a->beams.early_stopping));
    fprintf(stderr,
            "sampling: %s%s%s, max-new-tokens %ld (%s/generation_config.json, do_sample %s, where "
            "no flag says otherwise)\n",
            how, beams, procs, a->max_new, im->dir, gc.do_sample ? "true" : "false");
    if (gc.ignored[0])
        fprintf(stderr,
                "note: %s/generation_config.json sets %s, which qtitan does not apply (it samples "
                "with temperature, top-k, top-p, min-p, a repetition penalty and an n-gram ban, "
                "and searches beams without sampling)\n",
                im->dir, gc.ignored);
    return 0;
}

/* cands: where candidate ids came from ("prompt lookup", "draft model"), for their count. */
static void print_stats(const GenStats *st, int n, const char *dtype, const char *cands) {
    char reused[48] = "", lookup[128] = "";
    if (st->reused_tokens)
        snprintf(reused, sizeof reused, " (and %ld held in the cache)", st->reused_tokens);
    if (st->lookup_proposed)
        snprintf(lookup, sizeof lookup,
                 ", %s: %ld of %ld candidate ids kept, %ld passes after the prompts", cands,
                 st->lookup_accepted, st->lookup_proposed, st->passes);
    fprintf(stderr,
            "generate: prompt %ld tokens%s in %.3f s (%.1f tokens/s), generation %ld tokens in "
            "%.3f s (%.1f tokens/s), %d sequence%s, %s%s\n",
            st->prompt_tokens, reused, st->prefill_s, st->prompt_tokens / fmax(st->prefill_s, 1e-9),
            st->new_tokens, st->decode_s, st->new_tokens / fmax(st->decode_s, 1e-9), n,
            n == 1 ? "" : "s", dtype, lookup);
}

/* The model, its generation_config.json and (with --chat) its chat format, for a run. */
static int open_for_generation(GenArgs *a, InferModel *im, ChatFormat **cf, Err *err) {
    *cf = NULL;
    TRY(cli_open_model(im, a->model, a->checkpoint, a->adapter, 1, 1,
                       strcmp(a->dtype, "bfloat16") == 0, err));
    int rc = apply_gen_config(a, im, err);
    if (rc == 0 && !im->tok)
        rc = err_set(err, "%s has no tokenizer.json; generate needs one to encode the prompt",
                     im->dir);
    if (rc == 0 && a->chat &&
        !(*cf = chat_format_load_at(im->tok, cli_chat_template(a->chat_template, a->adapter), err)))
        rc = -1;
    if (rc) infer_model_close(im);
    return rc;
}

/* Whether ids (n tokens) leave room for --max-new-tokens in the model's context, and are ids
 * the model has; what names the prompt in the sentence. */
static int check_prompt(const GenArgs *a, InferModel *im, const IdVec *ids, const char *what,
                        Err *err) {
    int ctx = im->m.spec.max_seq_len;
    if (ids->n == 0) return err_set(err, "%s is empty: it encodes to no token", what);
    if ((long)ids->n + a->max_new > ctx)
        return err_set(err,
                       "%s has %zu tokens; with --max-new-tokens %ld that exceeds the model's "
                       "context of %d positions (max_position_embeddings in %s)",
                       what, ids->n, a->max_new, ctx, im->dir);
    return qwen3_check_tokens(&im->m, (const int32_t *)ids->ids, (long)ids->n, 0, "prompt", err);
}

/* One user line after another from stdin, each answered with the whole conversation so far
 * rendered in the chat format. The replies join the conversation as assistant turns, as
 * transformers' chat keeps them. One decoder serves every turn: its cache keeps the ids the
 * new rendering starts with (the earlier turns, up to where the template renders an answer
 * otherwise than it was generated, e.g. without its think block), so a turn runs only its new
 * tokens; it grows (and starts over) when a turn needs more positions than it has. */
static int interactive_run(GenArgs *a, Err *err) {
    if (a->assistant)
        return err_set(err, "--assistant-model applies to --prompt, --prompt-file and --messages "
                            "runs, not --interactive");
    InferModel im;
    ChatFormat *cf;
    TRY(open_for_generation(a, &im, &cf, err));
    ChatMessage *msgs = NULL;
    char **texts = NULL; /* the messages' contents, owned */
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 0, tty = isatty(0), turn = 0;
    if (a->system) {
        msgs = xcalloc(cap = 8, sizeof *msgs), texts = xcalloc(cap, sizeof *texts);
        texts[0] = xstrdup(a->system);
        msgs[n++] = (ChatMessage){
            .role = CHAT_SYSTEM, .content = texts[0], .content_len = strlen(texts[0])};
    }
    size_t first = n; /* /reset keeps the system turn */
    Decoder d = {0};
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t len = getline(&line, &line_cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0) continue;
        if (strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            for (size_t k = first; k < n; k++)
                free(texts[k]);
            n = first;
            fputs("(a new conversation)\n", stderr);
            continue;
        }
        if (n + 2 > cap) {
            cap = cap ? 2 * cap : 8;
            msgs = xrealloc(msgs, cap * sizeof *msgs);
            texts = xrealloc(texts, cap * sizeof *texts);
        }
        texts[n] = xstrdup(line);
        msgs[n] = (ChatMessage){.role = CHAT_USER, .content = texts[n], .content_len = (size_t)len};
        n++;
        ChatTokens ct = {0};
        ChatOptions opt = {
            .add_generation_prompt = 1, .enable_thinking = a->thinking, .tools = a->tools};
        IdVec ids = {0};
        char what[48];
        snprintf(what, sizeof what, "the conversation at turn %d", turn + 1);
        rc = chat_render(cf, msgs, n, opt, &ct, err);
        for (size_t k = 0; rc == 0 && k < ct.n; k++)
            idvec_push(&ids, ct.ids[k]);
        chat_tokens_free(&ct);
        if (rc == 0) rc = check_prompt(a, &im, &ids, what, err);
        GenOutput out = {0};
        GenStats st = {0};
        int need = (int)ids.n + (int)a->max_new;
        if (rc == 0 && need > d.C) {
            /* Twice what this turn needs, for the turns after it, within the context. */
            int cap = need > im.m.spec.max_seq_len / 2 ? im.m.spec.max_seq_len : 2 * need;
            decoder_free(&d);
            rc = decoder_create(&d, &im.m, 1, cap, err);
        }
        if (rc == 0) {
            const int32_t *ptr = (const int32_t *)ids.ids;
            int plen = (int)ids.n;
            GenOptions o = {.max_new_tokens = (int)a->max_new,
                            .sample = a->sp,
                            .seed = a->seed + (unsigned long long)turn,
                            .eos = im.eos,
                            .n_eos = im.n_eos,
                            .stop = a->stop,
                            .n_stop = a->n_stop,
                            .procs = &a->procs,
                            .reuse_cache = 1,
                            .lookup_tokens = a->lookup,
                            .lookup_ngram = a->lookup_ngram};
            rc = generate(&d, im.tok, &ptr, &plen, 1, &o, &out, a->json ? NULL : stream_stdout,
                          NULL, &st, err);
        }
        if (rc == 0) {
            if (a->json)
                print_json(line, &ids, &out, 0, 0);
            else
                putchar('\n');
            fflush(stdout);
            print_stats(&st, 1, a->dtype, "prompt lookup");
            texts[n] = xmalloc(out.text_len + 1);
            memcpy(texts[n], out.text ? out.text : "", out.text_len);
            texts[n][out.text_len] = '\0';
            msgs[n] = (ChatMessage){
                .role = CHAT_ASSISTANT, .content = texts[n], .content_len = out.text_len};
            n++;
            turn++;
        }
        gen_output_free(&out);
        idvec_free(&ids);
        if (rc) break;
    }
    decoder_free(&d);
    for (size_t k = 0; k < n; k++)
        free(texts[k]);
    free(texts), free(msgs), free(line);
    chat_format_free(cf);
    infer_model_close(&im);
    return rc;
}

/* What beam search needs of the options (infer/beam.h), in their flags' words. */
static int check_beams(const GenArgs *a, Err *err) {
    int k = a->beams.num_beams;
    if (a->sp.temperature > 0)
        return err_set(
            err,
            "--num-beams %d searches without sampling (transformers' do_sample=False): "
            "give --temperature 0 (the temperature is %g%s)",
            k, a->sp.temperature,
            a->set_temperature ? "" : ", the default or the model's generation_config.json's");
    if (a->n_return > k)
        return err_set(err,
                       "--num-return-sequences %ld: at most --num-beams (%d), the finished beams",
                       a->n_return, k);
    if (a->n_stop > 0)
        return err_set(err, "--stop does not apply to beam search (--num-beams %d)", k);
    if (a->assistant)
        return err_set(err, "--assistant-model does not apply to beam search (--num-beams %d)", k);
    if (a->lookup > 0)
        return err_set(err, "--prompt-lookup %d does not apply to beam search (--num-beams %d)%s",
                       a->lookup, k,
                       a->set_lookup ? "" : " (it is the model's generation_config.json's)");
    return 0;
}

/* Prompts searched side by side (beam_search), at most this many at once. */
#define BEAM_BATCH 16

/* Beam search over prompts ptr[i * K] (i < n), BEAM_BATCH at a time, the K best beams of each
 * into out[i * K ...]; st sums the runs' counts and times. */
static int beam_prompts(Decoder *d, const InferModel *im, const int32_t **ptr, const int *lens,
                        int n, int K, const GenOptions *o, const BeamParams *bp, GenOutput *out,
                        GenStats *st, Err *err) {
    const int32_t *group[BEAM_BATCH];
    int glen[BEAM_BATCH];
    for (int i0 = 0; i0 < n; i0 += BEAM_BATCH) {
        int g = n - i0 < BEAM_BATCH ? n - i0 : BEAM_BATCH;
        for (int i = 0; i < g; i++)
            group[i] = ptr[(i0 + i) * K], glen[i] = lens[(i0 + i) * K];
        GenStats one;
        TRY(beam_search(d, im->tok, group, glen, g, o, bp, out + (long)i0 * K, K, &one, err));
        st->prompt_tokens += one.prompt_tokens, st->new_tokens += one.new_tokens;
        st->prefill_s += one.prefill_s, st->decode_s += one.decode_s;
    }
    return 0;
}

/* --assistant-model: the draft model (the run's dtype, no adapter) and a decoder of S
 * sequences of C positions for it; its vocabulary must be the model's. */
static int open_draft(const GenArgs *a, const InferModel *im, InferModel *dm, Decoder *dd, int S,
                      int C, Err *err) {
    if (a->lookup > 0)
        return err_set(err,
                       "--assistant-model and --prompt-lookup %d are two sources of candidates: "
                       "give one%s",
                       a->lookup, a->set_lookup ? "" : " (the lookup is generation_config.json's)");
    TRY(infer_model_open(dm, a->assistant, NULL, NULL, 1, 1, strcmp(a->dtype, "bfloat16") == 0,
                         err));
    int rc = 0;
    if (dm->m.spec.vocab_size != im->m.spec.vocab_size)
        rc = err_set(err,
                     "--assistant-model %s has a vocabulary of %d ids and the model %d: the draft "
                     "must share the model's tokenizer",
                     a->assistant, dm->m.spec.vocab_size, im->m.spec.vocab_size);
    if (rc == 0 && C > dm->m.spec.max_seq_len)
        rc = err_set(err,
                     "--assistant-model %s has a context of %d positions, fewer than the %d this "
                     "run needs",
                     a->assistant, dm->m.spec.max_seq_len, C);
    if (rc == 0) rc = decoder_create(dd, &dm->m, S, C, err);
    if (rc) infer_model_close(dm);
    return rc;
}

static int generate_run(GenArgs *a, Err *err) {
    if (a->interactive) return interactive_run(a, err);
    PromptLines pr;
    TRY(read_prompts(&pr, a, err));
    InferModel im;
    ChatFormat *cf;
    if (open_for_generation(a, &im, &cf, err)) {
        prompt_lines_free(&pr);
        return -1;
    }
    int rc = 0, beams = a->beams.num_beams > 1;
    if (beams) rc = check_beams(a, err);
    if (a->n_return > 1 && a->sp.temperature == 0 && !beams)
        rc = err_set(err,
                     "--num-return-sequences %ld needs sampling: greedy decoding (temperature "
                     "0%s) gives each prompt one completion",
                     a->n_return, a->set_temperature ? "" : ", the model's generation_config.json");
    if (rc == 0 && (long)pr.n * a->n_return > (1L << 20))
        rc = err_set(err, "%d prompts x --num-return-sequences %ld is more than 1048576 sequences",
                     pr.n, a->n_return);
    /* The batch: each prompt's n_return sequences in turn, all reading the prompt's ids. */
    int K = rc ? 1 : (int)a->n_return, n = pr.n * K;
    IdVec *ids = xcalloc((size_t)pr.n, sizeof *ids);
    const int32_t **ptr = xcalloc((size_t)n, sizeof *ptr);
    int *lens = xcalloc((size_t)n, sizeof *lens);
    int longest = 0;
    for (int i = 0; i < pr.n && rc == 0; i++) {
        rc = encode_prompt(a, im.tok, cf, pr.text[i], i, &ids[i], err);
        char what[32];
        snprintf(what, sizeof what, "prompt %d", i + 1);
        if (rc == 0) rc = check_prompt(a, &im, &ids[i], what, err);
        for (int k = 0; k < K; k++) {
            ptr[i * K + k] = (const int32_t *)ids[i].ids;
            lens[i * K + k] = (int)ids[i].n;
        }
        if ((int)ids[i].n > longest) longest = (int)ids[i].n;
    }
    Decoder d = {0}, dd = {0};
    InferModel dm = {0};
    GenOutput *out = xcalloc((size_t)n, sizeof *out);
    GenStats st = {0};
    if (rc == 0 && a->assistant && !beams)
        rc = open_draft(a, &im, &dm, &dd, n, longest + (int)a->max_new, err);
    /* Beam search runs up to BEAM_BATCH prompts side by side, each in num_beams rows. */
    if (rc == 0)
        rc = decoder_create(
            &d, &im.m, beams ? a->beams.num_beams * (pr.n < BEAM_BATCH ? pr.n : BEAM_BATCH) : n,
            longest + (int)a->max_new, err);
    if (rc == 0) {
        GenOptions o = {.max_new_tokens = (int)a->max_new,
                        .sample = a->sp,
                        .seed = a->seed,
                        .eos = im.eos,
                        .n_eos = im.n_eos,
                        .stop = a->stop,
                        .n_stop = a->n_stop,
                        .procs = &a->procs,
                        .lookup_tokens = a->lookup,
                        .lookup_ngram = a->lookup_ngram,
                        .draft = dm.m.table ? &dd : NULL,
                        .draft_tokens = a->assistant_tokens,
                        .draft_confidence = a->assistant_confidence};
        int streaming = n == 1 && !a->json && !beams;
        if (beams)
            rc = beam_prompts(&d, &im, ptr, lens, pr.n, K, &o, &a->beams, out, &st, err);
        else
            rc = generate(&d, im.tok, ptr, lens, n, &o, out, streaming ? stream_stdout : NULL, NULL,
                          &st, err);
        for (int j = 0; j < n && rc == 0; j++) {
            int i = j / K, k = j % K;
            if (a->json)
                print_json(pr.text[i], &ids[i], &out[j], K > 1 ? k + 1 : 0, beams);
            else if (streaming)
                putchar('\n');
            else if (K > 1)
                printf("--- prompt %d, sequence %d\n%.*s\n", i + 1, k + 1, (int)out[j].text_len,
                       out[j].text);
            else
                printf("--- prompt %d\n%.*s\n", i + 1, (int)out[j].text_len, out[j].text);
        }
        for (int j = 0; j < n; j++)
            gen_output_free(&out[j]);
        fflush(stdout);
    }
    if (rc == 0) print_stats(&st, n, a->dtype, a->assistant ? "draft model" : "prompt lookup");
    decoder_free(&d);
    if (dm.m.table) decoder_free(&dd), infer_model_close(&dm);
    for (int i = 0; i < pr.n; i++)
        idvec_free(&ids[i]);
    free(ids), free(ptr), free(lens), free(out);
    prompt_lines_free(&pr);
    if (cf) chat_format_free(cf);
    infer_model_close(&im);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        fputs(USAGE, stdout);
        return 0;
    }
    log_info_to_stderr(); /* stdout carries the generated text only */
    GenArgs a;
    Err err;
    if (parse_args(&a, argc, argv, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    int rc = read_tools(&a, &err) || generate_run(&a, &err);
    if (rc) fprintf(stderr, "error: %s\n", err.msg);
    json_decref(a.tools);
    free(a.linenos);
    return rc ? 1 : 0;
}
