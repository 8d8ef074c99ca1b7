/* Chat formats rendered to ids (see chat_template.h). The model's Jinja template is not run:
 * its text is recognised by hash and the format it names is rendered here, piece by piece.
 *
 * Ids: the tokenizer splits text at added tokens before anything else (as HF does), so the
 * text between two special tokens is encoded on its own; <|im_start|> and <|im_end|> are pushed
 * as ids and each gap is encoded separately, which gives the ids of the whole rendered string.
 *
 * Assistant flags: a token is assistant output when any of its bytes comes from the assistant
 * turn's body (what follows "<|im_start|>assistant\n") or it is the turn's <|im_end|>; that is
 * the rule of transformers' return_assistant_tokens_mask with a {% generation %} block around
 * the body and <|im_end|>. The body and its header share one gap, so the header's own tokens are
 * the common prefix of the gap's ids and the header's ids alone. */
#include "text/chat_template.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/strbuf.h"
#include "core/strutil.h"
#include "text/jsonl.h"

/* How a template opens the assistant turn of a generation prompt. */
typedef enum GenPrompt {
    GEN_HYBRID, /* "assistant\n", then an empty think block when enable_thinking is false */
    GEN_PLAIN,  /* "assistant\n" whatever enable_thinking says */
    GEN_THINK,  /* "assistant\n<think>\n" whatever enable_thinking says */
} GenPrompt;

/* A template qtitan renders: its name, the hash of its exact text, and what sets it apart. */
typedef struct Known {
    const char *name, *what;
    uint64_t hash;
    GenPrompt gen;
    int null_content; /* renders null content as empty (the first Qwen3 template fails on it) */
} Known;

struct ChatFormat {
    const Tokenizer *tok;
    const Known *known;
    char *file;
    uint32_t im_start, im_end;
    IdVec header; /* ids of "assistant\n" */
};

/* FNV-1a of a template's text: the formats qtitan renders, by the exact template they stand
 * for. */
static uint64_t fnv64(const char *s, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001B3ull;
    return h;
}

/* tools/qwen3_templates.py derives the later texts from the first and prints their hashes. */
static const Known KNOWN[] = {
    /* Qwen3 0.6B to 235B-A22B, hybrid thinking, as released (April 2025). */
    {"qwen3", "Qwen3's hybrid-thinking template as first released", 0x2bfdb7aa9754484eull,
     GEN_HYBRID, 0},
    /* The same models' template as revised: content read only when it is a string. */
    {"qwen3", "Qwen3's hybrid-thinking template (string-content revision)", 0x959a4551391a6549ull,
     GEN_HYBRID, 1},
    {"qwen3-2507-instruct", "the Qwen3 Instruct-2507 template", 0x69358583e08559dbull, GEN_PLAIN,
     1},
    {"qwen3-2507-thinking", "the Qwen3 Thinking-2507 template", 0xcd0d41a64dfce181ull, GEN_THINK,
     1},
};

const char *const chat_reasoning_keys[CHAT_N_REASONING_KEYS] = {"reasoning_content", "thinking",
                                                                "reasoning"};

static const char *ROLE_NAMES[CHAT_NROLES] = {"system", "user", "assistant", "tool"};

int chat_role_parse(const char *name, size_t len, ChatRole *out) {
    for (int r = 0; r < CHAT_NROLES; r++)
        if (strlen(ROLE_NAMES[r]) == len && memcmp(ROLE_NAMES[r], name, len) == 0) {
            *out = (ChatRole)r;
            return 0;
        }
    return -1;
}

const char *chat_role_name(ChatRole role) {
    return ROLE_NAMES[role];
}

void chat_tokens_free(ChatTokens *t) {
    free(t->ids);
    free(t->assistant);
    memset(t, 0, sizeof *t);
}

static void push(ChatTokens *t, uint32_t id, uint8_t assistant) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->ids = xrealloc(t->ids, t->cap * sizeof *t->ids);
        t->assistant = xrealloc(t->assistant, t->cap);
    }
    t->ids[t->n] = id;
    t->assistant[t->n++] = assistant;
}

/* The chat_template of a tokenizer_config.json (a list of named templates: the "default" one). */
static int read_template_json(const char *file, char **text, size_t *len, Err *err) {
    json_t *root = json_load_path(file, err);
    if (!root) return -1;
    const json_t *ct = json_object_get(root, "chat_template");
    /* A list holds named templates; "default" is the chat one. */
    if (json_is_array(ct)) {
        const json_t *found = NULL, *v;
        size_t i;
        json_array_foreach(ct, i, v) {
            const char *nm = json_string_value(json_object_get(v, "name"));
            if (nm && strcmp(nm, "default") == 0) found = json_object_get(v, "template");
        }
        ct = found;
    }
    if (!json_is_string(ct)) {
        json_decref(root);
        return err_set(err, "%s: no \"chat_template\" string, so the tokenizer has no chat format",
                       file);
    }
    *len = json_string_length(ct);
    *text = xmalloc(*len + 1);
    memcpy(*text, json_string_value(ct), *len + 1);
    json_decref(root);
    return 0;
}

int chat_template_read(const char *where, char **text, size_t *len, char **file, Err *err) {
    *text = NULL;
    *len = 0;
    if (!fs_is_dir(where)) {
        *file = xstrdup(where);
        if (!fs_exists(where))
            return err_set(err,
                           "%s: not found (expected a chat template: a .jinja file, a "
                           "tokenizer_config.json or a tokenizer folder)",
                           where);
        return str_ends_with(where, ".json") ? read_template_json(where, text, len, err)
                                             : fs_read_all(where, text, len, err);
    }
    /* chat_template.jinja wins over tokenizer_config.json's chat_template, as in transformers. */
    *file = fs_join(where, "chat_template.jinja");
    if (fs_exists(*file)) return fs_read_all(*file, text, len, err);
    free(*file);
    *file = fs_join(where, "tokenizer_config.json");
    if (!fs_exists(*file))
        return err_set(err,
                       "%s: not found, so the tokenizer has no chat template (chat data and "
                       "--chat need the model's tokenizer folder, which holds it)",
                       *file);
    return read_template_json(*file, text, len, err);
}

static int special_id(const Tokenizer *tok, const char *s, uint32_t *out, const char *file,
                      Err *err) {
    int64_t id = tokenizer_token_id(tok, s);
    if (id < 0)
        return err_set(err, "%s: the chat format needs the token %s, which %s does not have", file,
                       s, tokenizer_path(tok));
    *out = (uint32_t)id;
    return 0;
}

ChatFormat *chat_format_from_text(const Tokenizer *tok, const char *text, size_t len,
                                  const char *file, Err *err) {
    uint64_t h = fnv64(text, len);
    const Known *known = NULL;
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (KNOWN[i].hash == h) known = &KNOWN[i];
    if (!known) {
        err_set(err,
                "%s: the chat template (%zu bytes, hash %016llx) is not one qtitan renders "
                "(known: Qwen3's, first and string-content revisions, and Qwen3 Instruct-2507's "
                "and Thinking-2507's)",
                file, len, (unsigned long long)h);
        return NULL;
    }
    ChatFormat *cf = xcalloc(1, sizeof *cf);
    cf->tok = tok;
    cf->known = known;
    cf->file = xstrdup(file);
    if (special_id(tok, "<|im_start|>", &cf->im_start, file, err) ||
        special_id(tok, "<|im_end|>", &cf->im_end, file, err) ||
        tokenizer_encode(tok, "assistant\n", 10, &cf->header, err)) {
        chat_format_free(cf);
        return NULL;
    }
    return cf;
}

ChatFormat *chat_format_load_at(const Tokenizer *tok, const char *where, Err *err) {
    char *dir = where && *where ? xstrdup(where) : fs_dir_of(tokenizer_path(tok));
    char *text = NULL, *file = NULL;
    size_t len = 0;
    ChatFormat *cf = NULL;
    if (chat_template_read(dir, &text, &len, &file, err) == 0)
        cf = chat_format_from_text(tok, text, len, file, err);
    free(dir);
    free(text);
    free(file);
    return cf;
}

ChatFormat *chat_format_load(const Tokenizer *tok, Err *err) {
    return chat_format_load_at(tok, NULL, err);
}

void chat_format_free(ChatFormat *cf) {
    if (!cf) return;
    idvec_free(&cf->header);
    free(cf->file);
    free(cf);
}

const char *chat_format_name(const ChatFormat *cf) {
    return cf->known->name;
}

int chat_format_thinking_switch(const ChatFormat *cf) {
    return cf->known->gen == GEN_HYBRID;
}

/* A byte range of a message, and the Python string methods the template applies to it. */
typedef struct Span {
    const char *p;
    size_t n;
} Span;

static Span lstrip_nl(Span s) {
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}
static Span rstrip_nl(Span s) {
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}
static int starts_with(Span s, const char *lit) {
    size_t l = strlen(lit);
    return s.n >= l && memcmp(s.p, lit, l) == 0;
}
static int ends_with(Span s, const char *lit) {
    size_t l = strlen(lit);
    return s.n >= l && memcmp(s.p + s.n - l, lit, l) == 0;
}
/* Offset of the first (last) occurrence of lit in s, or -1. */
static long find_first(Span s, const char *lit) {
    size_t l = strlen(lit);
    for (size_t i = 0; i + l <= s.n; i++)
        if (memcmp(s.p + i, lit, l) == 0) return (long)i;
    return -1;
}
static long find_last(Span s, const char *lit) {
    size_t l = strlen(lit);
    for (size_t i = s.n >= l ? s.n - l + 1 : 0; i-- > 0;)
        if (memcmp(s.p + i, lit, l) == 0) return (long)i;
    return -1;
}

/* Encodes b's text and appends its ids; ids from the (header_len)th on get the flag
 * `assistant`, the ones before it 0. */
static int encode_gap(const ChatFormat *cf, const StrBuf *b, size_t header_len, uint8_t assistant,
                      IdVec *scratch, ChatTokens *out, Err *err) {
    scratch->n = 0;
    TRY(tokenizer_encode(cf->tok, b->p ? b->p : "", b->n, scratch, err));
    for (size_t i = 0; i < scratch->n; i++)
        push(out, scratch->ids[i], i >= header_len ? assistant : 0);
    return 0;
}

/* "<|im_start|>role\ncontent<|im_end|>\n" of a system or user turn. */
static int plain_turn(const ChatFormat *cf, const ChatMessage *m, StrBuf *b, IdVec *scratch,
                      ChatTokens *out, Err *err) {
    push(out, cf->im_start, 0);
    b->n = 0;
    strbuf_lit(b, chat_role_name(m->role));
    strbuf_lit(b, "\n");
    strbuf_add(b, m->content, m->content_len);
    TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    push(out, cf->im_end, 0);
    b->n = 0;
    strbuf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

/* The object a tool call names its function in: the call itself, or its "function" when that
 * is truthy as Jinja tests it (the template's `if tool_call.function`). */
static const json_t *tool_call_function(const json_t *call) {
    const json_t *f = json_object_get(call, "function");
    int truthy = f && !json_is_null(f) && !json_is_false(f) &&
                 !(json_is_object(f) && json_object_size(f) == 0) &&
                 !(json_is_array(f) && json_array_size(f) == 0) &&
                 !(json_is_string(f) && json_string_length(f) == 0) &&
                 !(json_is_integer(f) && json_integer_value(f) == 0) &&
                 !(json_is_real(f) && json_real_value(f) == 0);
    return truthy ? f : call;
}

int chat_tool_calls_check(const json_t *calls, Err *err) {
    if (!json_is_array(calls))
        return err_set(err, "tool_calls must be an array of calls, found %s", json_kind(calls));
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        if (!json_is_object(call))
            return err_set(err, "tool_calls[%zu] must be an object, found %s", i, json_kind(call));
        const json_t *f = tool_call_function(call);
        const char *in = f == call ? "" : ".function";
        if (!json_is_object(f))
            return err_set(err, "tool_calls[%zu].function must be an object, found %s", i,
                           json_kind(f));
        const json_t *name = json_object_get(f, "name");
        if (!json_is_string(name))
            return err_set(err, "tool_calls[%zu]%s.name must be a string, found %s", i, in,
                           name ? json_kind(name) : "nothing");
        if (!json_object_get(f, "arguments"))
            return err_set(err, "tool_calls[%zu]%s has no \"arguments\" (a JSON string or object)",
                           i, in);
    }
    return 0;
}

int chat_tools_check(const json_t *tools, Err *err) {
    if (!json_is_array(tools))
        return err_set(err, "tools must be an array of tool definitions, found %s",
                       json_kind(tools));
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (!json_is_object(t))
            return err_set(err, "tools[%zu] must be an object (a JSON schema), found %s", i,
                           json_kind(t));
    }
    return 0;
}

/* Appends v as the template's `| tojson` writes it. */
static void buf_json(StrBuf *b, const json_t *v) {
    size_t n;
    char *text = json_dumps_py(v, &n);
    strbuf_add(b, text, n);
    free(text);
}

/* An assistant's tool calls after its content: each
 * <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, a newline before every call
 * but a first one that follows empty content; string arguments are written as they are,
 * others as JSON. */
static void tool_calls_text(StrBuf *b, const json_t *calls, Span content) {
    size_t i;
    const json_t *call;
    json_array_foreach(calls, i, call) {
        if (i > 0 || content.n > 0) strbuf_lit(b, "\n");
        const json_t *f = tool_call_function(call);
        const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
        strbuf_lit(b, "<tool_call>\n{\"name\": \"");
        if (json_is_string(name)) strbuf_add(b, json_string_value(name), json_string_length(name));
        strbuf_lit(b, "\", \"arguments\": ");
        if (json_is_string(args))
            strbuf_add(b, json_string_value(args), json_string_length(args));
        else if (args)
            buf_json(b, args);
        strbuf_lit(b, "}\n</tool_call>");
    }
}

/* An assistant turn. Reasoning comes from reasoning_content, else from content's think tags
 * (content keeps what follows the last </think>); it is shown only in turns after the last user
 * query, and the final turn always gets a think block, empty or not. Tool calls follow the
 * content inside the turn, so they are assistant output. */
static int assistant_turn(const ChatFormat *cf, const ChatMessage *m, int after_query, int last,
                          StrBuf *b, IdVec *scratch, ChatTokens *out, Err *err) {
    Span content = {m->content, m->content_len}, reasoning = {"", 0};
    if (m->reasoning) {
        reasoning = (Span){m->reasoning, m->reasoning_len};
    } else if (find_first(content, "</think>") >= 0) {
        Span all = content;
        long close_last = find_last(all, "</think>");
        content = lstrip_nl((Span){all.p + close_last + 8, all.n - (size_t)close_last - 8});
        Span before = rstrip_nl((Span){all.p, (size_t)find_first(all, "</think>")});
        long open = find_last(before, "<think>");
        if (open >= 0) before = (Span){before.p + open + 7, before.n - (size_t)open - 7};
        reasoning = lstrip_nl(before);
    }
    push(out, cf->im_start, 0);
    b->n = 0;
    strbuf_lit(b, "assistant\n");
    if (after_query && (last || reasoning.n > 0)) {
        Span r = rstrip_nl(lstrip_nl(reasoning)), c = lstrip_nl(content);
        strbuf_lit(b, "<think>\n");
        strbuf_add(b, r.p, r.n);
        strbuf_lit(b, "\n</think>\n\n");
        strbuf_add(b, c.p, c.n);
    } else {
        strbuf_add(b, content.p, content.n);
    }
    if (json_array_size(m->tool_calls)) tool_calls_text(b, m->tool_calls, content);
    TRY(tokenizer_encode(cf->tok, b->p, b->n, (scratch->n = 0, scratch), err));
    size_t h = 0;
    while (h < cf->header.n && h < scratch->n && scratch->ids[h] == cf->header.ids[h])
        h++;
    for (size_t i = 0; i < scratch->n; i++)
        push(out, scratch->ids[i], i >= h);
    push(out, cf->im_end, 1);
    b->n = 0;
    strbuf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

/* The system turn that offers tools: the first message's content when it is a system one, then
 * each definition as JSON on its own line inside <tools></tools>, and how to call them. */
static int tools_turn(const ChatFormat *cf, const ChatMessage *first, const json_t *tools,
                      StrBuf *b, IdVec *scratch, ChatTokens *out, Err *err) {
    push(out, cf->im_start, 0);
    b->n = 0;
    strbuf_lit(b, "system\n");
    if (first->role == CHAT_SYSTEM) {
        strbuf_add(b, first->content, first->content_len);
        strbuf_lit(b, "\n\n");
    }
    strbuf_lit(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n"
                  "<tools>");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        strbuf_lit(b, "\n");
        buf_json(b, json_array_get(tools, i));
    }
    strbuf_lit(b, "\n</tools>\n\nFor each function call, return a json object with function name "
                  "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                  "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    push(out, cf->im_end, 0);
    b->n = 0;
    strbuf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

/* Tool results msgs[i..j) (a run of tool messages) as one user turn, each wrapped in
 * <tool_response></tool_response> on its own lines. */
static int tool_turn(const ChatFormat *cf, const ChatMessage *msgs, size_t i, size_t j, StrBuf *b,
                     IdVec *scratch, ChatTokens *out, Err *err) {
    push(out, cf->im_start, 0);
    b->n = 0;
    strbuf_lit(b, "user");
    for (; i < j; i++) {
        strbuf_lit(b, "\n<tool_response>\n");
        strbuf_add(b, msgs[i].content, msgs[i].content_len);
        strbuf_lit(b, "\n</tool_response>");
    }
    TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    push(out, cf->im_end, 0);
    b->n = 0;
    strbuf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

static int render_qwen3(const ChatFormat *cf, const ChatMessage *msgs, size_t n, ChatOptions opt,
                        StrBuf *b, IdVec *scratch, ChatTokens *out, Err *err) {
    int tools = json_array_size(opt.tools) > 0;
    if (tools) TRY(tools_turn(cf, &msgs[0], opt.tools, b, scratch, out, err));
    /* The last user message with content that is not a tool response: reasoning shows only
     * after it. */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        Span c = {msgs[k].content, msgs[k].content_len};
        if (msgs[k].role == CHAT_USER && !msgs[k].content_null &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == CHAT_ASSISTANT) {
            TRY(assistant_turn(cf, &msgs[i], i > last_query, i + 1 == n, b, scratch, out, err));
        } else if (msgs[i].role == CHAT_TOOL) {
            size_t j = i + 1;
            while (j < n && msgs[j].role == CHAT_TOOL)
                j++;
            TRY(tool_turn(cf, msgs, i, j, b, scratch, out, err));
            i = j - 1;
        } else if (!(tools && i == 0 && msgs[i].role == CHAT_SYSTEM)) {
            TRY(plain_turn(cf, &msgs[i], b, scratch, out, err));
        }
    }
    if (opt.add_generation_prompt) {
        push(out, cf->im_start, 0);
        b->n = 0;
        strbuf_lit(b, "assistant\n");
        if (cf->known->gen == GEN_THINK) strbuf_lit(b, "<think>\n");
        if (cf->known->gen == GEN_HYBRID && !opt.enable_thinking)
            strbuf_lit(b, "<think>\n\n</think>\n\n");
        TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    }
    return 0;
}

/* What the template cannot render, in one sentence: null content where it fails on it (the
 * first system message's always: it is read directly), enable_thinking off where it ignores
 * it. */
static int check_renderable(const ChatFormat *cf, const ChatMessage *msgs, size_t n,
                            ChatOptions opt, Err *err) {
    if (n == 0) return err_set(err, "a conversation needs at least one message");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].content_null) continue;
        if (i == 0 && msgs[i].role == CHAT_SYSTEM)
            return err_set(err,
                           "messages[0] is a system message with null content, which %s (%s) "
                           "cannot render: give it a string",
                           cf->known->what, cf->file);
        if (!cf->known->null_content)
            return err_set(err,
                           "messages[%zu].content is null, which %s (%s) cannot render: give "
                           "a string (\"\" for none)",
                           i, cf->known->what, cf->file);
    }
    if (opt.add_generation_prompt && !opt.enable_thinking && !chat_format_thinking_switch(cf))
        return err_set(err,
                       "%s (%s) has no thinking switch: it ignores enable_thinking, so turning "
                       "thinking off asks for what it does not render",
                       cf->known->what, cf->file);
    return 0;
}

int chat_render(const ChatFormat *cf, const ChatMessage *msgs, size_t n, ChatOptions opt,
                ChatTokens *out, Err *err) {
    out->n = 0;
    TRY(check_renderable(cf, msgs, n, opt, err));
    StrBuf b = {0};
    IdVec scratch = {0};
    int rc = render_qwen3(cf, msgs, n, opt, &b, &scratch, out, err);
    free(b.p);
    idvec_free(&scratch);
    return rc;
}

int chat_render_prompt(const ChatFormat *cf, const char *system, const char *prompt,
                       int enable_thinking, const json_t *tools, IdVec *out, Err *err) {
    ChatMessage msgs[2];
    size_t n = 0;
    if (system && system[0])
        msgs[n++] =
            (ChatMessage){.role = CHAT_SYSTEM, .content = system, .content_len = strlen(system)};
    msgs[n++] = (ChatMessage){.role = CHAT_USER, .content = prompt, .content_len = strlen(prompt)};
    ChatTokens ct = {0};
    ChatOptions opt = {
        .add_generation_prompt = 1, .enable_thinking = enable_thinking, .tools = tools};
    int rc = chat_render(cf, msgs, n, opt, &ct, err);
    for (size_t i = 0; rc == 0 && i < ct.n; i++)
        idvec_push(out, ct.ids[i]);
    chat_tokens_free(&ct);
    return rc;
}
