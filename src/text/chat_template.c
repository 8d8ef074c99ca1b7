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

struct ChatFormat {
    const Tokenizer *tok;
    const char *name;
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

static const struct {
    const char *name;
    uint64_t hash;
} KNOWN[] = {
    /* Qwen3 (0.6B to 235B-A22B): hybrid thinking, the template of tokenizer_config.json. */
    {"qwen3", 0x2bfdb7aa9754484eull},
};

static const char *ROLE_NAMES[] = {"system", "user", "assistant"};

int chat_role_parse(const char *name, size_t len, ChatRole *out) {
    for (int r = 0; r < 3; r++)
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

/* Reads the template text of the folder that holds tok's tokenizer.json: chat_template.jinja
 * wins over tokenizer_config.json's chat_template, as in transformers. */
static int read_template(const char *dir, char **text, size_t *len, char **file, Err *err) {
    *file = fs_join(dir, "chat_template.jinja");
    if (fs_exists(*file)) return fs_read_all(*file, text, len, err);
    free(*file);
    *file = fs_join(dir, "tokenizer_config.json");
    if (!fs_exists(*file))
        return err_set(err,
                       "%s: not found, so the tokenizer has no chat template (chat data and "
                       "--chat need the model's tokenizer folder, which holds it)",
                       *file);
    json_t *root = json_load_path(*file, err);
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
                       *file);
    }
    *len = json_string_length(ct);
    *text = xmalloc(*len + 1);
    memcpy(*text, json_string_value(ct), *len + 1);
    json_decref(root);
    return 0;
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

ChatFormat *chat_format_load(const Tokenizer *tok, Err *err) {
    const char *path = tokenizer_path(tok);
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : xstrdup(".");
    char *text = NULL, *file = NULL;
    size_t len = 0;
    ChatFormat *cf = NULL;
    if (read_template(dir, &text, &len, &file, err)) goto done;
    uint64_t h = fnv64(text, len);
    const char *name = NULL;
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (KNOWN[i].hash == h) name = KNOWN[i].name;
    if (!name) {
        err_set(err,
                "%s: the chat template (%zu bytes, hash %016llx) is not one qtitan renders "
                "(known: Qwen3's)",
                file, len, (unsigned long long)h);
        goto done;
    }
    cf = xcalloc(1, sizeof *cf);
    cf->tok = tok;
    cf->name = name;
    if (special_id(tok, "<|im_start|>", &cf->im_start, file, err) ||
        special_id(tok, "<|im_end|>", &cf->im_end, file, err) ||
        tokenizer_encode(tok, "assistant\n", 10, &cf->header, err)) {
        chat_format_free(cf);
        cf = NULL;
    }
done:
    free(dir);
    free(text);
    free(file);
    return cf;
}

void chat_format_free(ChatFormat *cf) {
    if (!cf) return;
    idvec_free(&cf->header);
    free(cf);
}

const char *chat_format_name(const ChatFormat *cf) {
    return cf->name;
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

/* A growable byte string for one gap's text. */
typedef struct Buf {
    char *p;
    size_t n, cap;
} Buf;
static void buf_add(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_lit(Buf *b, const char *s) {
    buf_add(b, s, strlen(s));
}

/* Encodes b's text and appends its ids; ids from the (header_len)th on get the flag
 * `assistant`, the ones before it 0. */
static int encode_gap(const ChatFormat *cf, const Buf *b, size_t header_len, uint8_t assistant,
                      IdVec *scratch, ChatTokens *out, Err *err) {
    scratch->n = 0;
    TRY(tokenizer_encode(cf->tok, b->p ? b->p : "", b->n, scratch, err));
    for (size_t i = 0; i < scratch->n; i++)
        push(out, scratch->ids[i], i >= header_len ? assistant : 0);
    return 0;
}

/* "<|im_start|>role\ncontent<|im_end|>\n" of a system or user turn. */
static int plain_turn(const ChatFormat *cf, const ChatMessage *m, Buf *b, IdVec *scratch,
                      ChatTokens *out, Err *err) {
    push(out, cf->im_start, 0);
    b->n = 0;
    buf_lit(b, chat_role_name(m->role));
    buf_lit(b, "\n");
    buf_add(b, m->content, m->content_len);
    TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    push(out, cf->im_end, 0);
    b->n = 0;
    buf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

/* An assistant turn. Reasoning comes from reasoning_content, else from content's think tags
 * (content keeps what follows the last </think>); it is shown only in turns after the last user
 * query, and the final turn always gets a think block, empty or not. */
static int assistant_turn(const ChatFormat *cf, const ChatMessage *m, int after_query, int last,
                          Buf *b, IdVec *scratch, ChatTokens *out, Err *err) {
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
    buf_lit(b, "assistant\n");
    if (after_query && (last || reasoning.n > 0)) {
        Span r = rstrip_nl(lstrip_nl(reasoning)), c = lstrip_nl(content);
        buf_lit(b, "<think>\n");
        buf_add(b, r.p, r.n);
        buf_lit(b, "\n</think>\n\n");
        buf_add(b, c.p, c.n);
    } else {
        buf_add(b, content.p, content.n);
    }
    TRY(tokenizer_encode(cf->tok, b->p, b->n, (scratch->n = 0, scratch), err));
    size_t h = 0;
    while (h < cf->header.n && h < scratch->n && scratch->ids[h] == cf->header.ids[h])
        h++;
    for (size_t i = 0; i < scratch->n; i++)
        push(out, scratch->ids[i], i >= h);
    push(out, cf->im_end, 1);
    b->n = 0;
    buf_lit(b, "\n");
    return encode_gap(cf, b, 0, 0, scratch, out, err);
}

static int render_qwen3(const ChatFormat *cf, const ChatMessage *msgs, size_t n, ChatOptions opt,
                        Buf *b, IdVec *scratch, ChatTokens *out, Err *err) {
    /* The last user message that is not a tool response: reasoning shows only after it. */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        Span c = {msgs[k].content, msgs[k].content_len};
        if (msgs[k].role == CHAT_USER &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == CHAT_ASSISTANT)
            TRY(assistant_turn(cf, &msgs[i], i > last_query, i + 1 == n, b, scratch, out, err));
        else
            TRY(plain_turn(cf, &msgs[i], b, scratch, out, err));
    }
    if (opt.add_generation_prompt) {
        push(out, cf->im_start, 0);
        b->n = 0;
        buf_lit(b, "assistant\n");
        if (!opt.enable_thinking) buf_lit(b, "<think>\n\n</think>\n\n");
        TRY(encode_gap(cf, b, 0, 0, scratch, out, err));
    }
    return 0;
}

int chat_render(const ChatFormat *cf, const ChatMessage *msgs, size_t n, ChatOptions opt,
                ChatTokens *out, Err *err) {
    out->n = 0;
    if (n == 0) return err_set(err, "a conversation needs at least one message");
    Buf b = {0};
    IdVec scratch = {0};
    int rc = render_qwen3(cf, msgs, n, opt, &b, &scratch, out, err);
    free(b.p);
    idvec_free(&scratch);
    return rc;
}
