/* Chat and instruction training data (see chat_data.h): JSONL lines to conversations, rendered
 * and masked once at open, then laid out into rows per epoch. */
#include "text/chat_data.h"

#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/ignore_target.h"
#include "core/log.h"
#include "core/rng.h"
#include "text/jsonl.h"
#include "text/parquet.h"

/* The shuffle's rng stream, apart from the pretraining dataset's and other users of the seed. */
#define CHAT_SHUFFLE_STREAM 0x4348415400000000ull

/* Rows of one epoch: row r holds conversations perm[first[r] .. first[r+1]). */
struct ChatEpoch {
    int64_t epoch, n_rows;
    int64_t *perm;   /* (n_conv,) */
    int64_t *first;  /* (n_rows + 1,) */
    int64_t *labels; /* (n_rows,) targets that count per row */
};

static const char *FORMAT_KEYS[] = {"a \"text\" string", "a \"messages\" array",
                                    "\"prompt\" and \"completion\"",
                                    "\"instruction\" and \"output\""};

/* ---- one line to messages ------------------------------------------------------------------ */

/* A message's role from its name, or the sentence that says what is there instead. A ShareGPT
 * message (the role under "from") may also say "human" (user) or "gpt" (assistant). */
static int read_role(const char *name, size_t len, const char *where, const char *what, long long i,
                     int sharegpt, ChatRole *out, Err *err) {
    if (chat_role_parse(name, len, out) == 0) return 0;
    if (sharegpt && len == 5 && memcmp(name, "human", 5) == 0) return *out = CHAT_USER, 0;
    if (sharegpt && len == 3 && memcmp(name, "gpt", 3) == 0) return *out = CHAT_ASSISTANT, 0;
    return err_set(
        err, "%s: %s[%lld].%s \"%.*s\" is not \"system\", \"user\", \"assistant\"%s or \"tool\"",
        where, what, i, sharegpt ? "from" : "role", (int)(len > 60 ? 60 : len), name,
        sharegpt ? ", \"human\", \"gpt\"" : "");
}

/* A message's tool_calls (JSON null or absent: none), checked: only an assistant message makes
 * them (the template writes no others), each names its function and carries arguments. */
static int set_tool_calls(ChatMessage *cm, const json_t *calls, const char *where, const char *what,
                          long long i, Err *err) {
    if (!calls || json_is_null(calls)) return 0;
    if (cm->role != CHAT_ASSISTANT)
        return err_set(err,
                       "%s: %s[%lld] is a %s message with tool_calls, which only an assistant "
                       "message makes",
                       where, what, i, chat_role_name(cm->role));
    if (chat_tool_calls_check(calls, err)) {
        err_wrap(err, "%s: %s[%lld]", where, what, i);
        return -1;
    }
    cm->tool_calls = calls;
    return 0;
}

/* Appends the messages of a JSON array (objects with role, content, optional reasoning and, on
 * assistant messages, tool_calls); `what` is the array's key for error sentences. A message
 * may give its role under "from" and its content under "value" instead (ShareGPT's names, which
 * TRL renames to role and content: "from" and "value" win where both are there). */
static int read_message_array(const json_t *arr, const char *what, const char *where,
                              ChatMessage **msgs, size_t *n, size_t *cap, Err *err) {
    size_t i;
    const json_t *m;
    json_array_foreach(arr, i, m) {
        if (!json_is_object(m))
            return err_set(err,
                           "%s: %s[%zu] must be an object with \"role\" and \"content\", "
                           "found %s",
                           where, what, i, json_kind(m));
        const json_t *from = json_object_get(m, "from"), *value = json_object_get(m, "value");
        const json_t *role = from ? from : json_object_get(m, "role"),
                     *content = value ? value : json_object_get(m, "content"),
                     *calls = json_object_get(m, "tool_calls");
        const char *role_key = from ? "from" : "role";
        if (!json_is_string(role))
            return err_set(err,
                           "%s: %s[%zu].%s must be a string (\"system\", \"user\", "
                           "\"assistant\" or \"tool\"), found %s",
                           where, what, i, role_key, role ? json_kind(role) : "nothing");
        ChatMessage cm = {0};
        TRY(read_role(json_string_value(role), json_string_length(role), where, what, (long long)i,
                      from != NULL, &cm.role, err));
        /* Null content is the chat format's to render or refuse; a missing one is read as null
         * only beside tool calls (OpenAI's shape of a turn that only calls tools). */
        int with_calls = calls && !json_is_null(calls);
        if (!content && !with_calls)
            return err_set(err, "%s: %s[%zu] has no \"content\"", where, what, i);
        if (content && !json_is_null(content) && !json_is_string(content))
            return err_set(err, "%s: %s[%zu].%s must be a string or null, found %s", where, what, i,
                           value ? "value" : "content", json_kind(content));
        cm.content_null = !json_is_string(content);
        cm.content = cm.content_null ? "" : json_string_value(content);
        cm.content_len = cm.content_null ? 0 : json_string_length(content);
        for (size_t k = 0; k < CHAT_N_REASONING_KEYS && !cm.reasoning; k++) {
            const json_t *r = json_object_get(m, chat_reasoning_keys[k]);
            if (!r || json_is_null(r)) continue;
            if (!json_is_string(r))
                return err_set(err, "%s: %s[%zu].%s must be a string, found %s", where, what, i,
                               chat_reasoning_keys[k], json_kind(r));
            cm.reasoning = json_string_value(r);
            cm.reasoning_len = json_string_length(r);
        }
        TRY(set_tool_calls(&cm, calls, where, what, (long long)i, err));
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 8;
            *msgs = xrealloc(*msgs, *cap * sizeof **msgs);
        }
        (*msgs)[(*n)++] = cm;
    }
    return 0;
}

/* A field that is a string (one message of `role`) or an array of messages. */
static int read_turns(const json_t *obj, const char *key, ChatRole role, int required,
                      const char *where, ChatMessage **msgs, size_t *n, size_t *cap, Err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return required ? err_set(err, "%s: the object has no \"%s\" field", where, key) : 0;
    if (json_is_array(v)) return read_message_array(v, key, where, msgs, n, cap, err);
    if (!json_is_string(v))
        return err_set(err, "%s: \"%s\" must be a string or an array of messages, found %s", where,
                       key, json_kind(v));
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        *msgs = xrealloc(*msgs, *cap * sizeof **msgs);
    }
    (*msgs)[(*n)++] = (ChatMessage){
        .role = role, .content = json_string_value(v), .content_len = json_string_length(v)};
    return 0;
}

static int opt_string(const json_t *obj, const char *key, const char *where, const json_t **out,
                      Err *err) {
    *out = json_object_get(obj, key);
    if (*out && !json_is_string(*out))
        return err_set(err, "%s: \"%s\" must be a string, found %s", where, key, json_kind(*out));
    return 0;
}

/* Alpaca-style rows: the user turn is the instruction, then a blank line and the input when
 * there is one; the assistant turn is the output. */
static int read_instruction(json_t *holder, const json_t *obj, const char *where,
                            ChatMessage **msgs, size_t *n, size_t *cap, Err *err) {
    const json_t *ins, *inp, *out;
    TRY(opt_string(obj, "instruction", where, &ins, err));
    TRY(opt_string(obj, "input", where, &inp, err));
    TRY(opt_string(obj, "output", where, &out, err));
    if (!ins) return err_set(err, "%s: the object has no \"instruction\" field", where);
    if (!out) return err_set(err, "%s: the object has no \"output\" field", where);
    size_t li = json_string_length(ins), lp = inp ? json_string_length(inp) : 0;
    char *user = xmalloc(li + 2 + lp + 1);
    memcpy(user, json_string_value(ins), li);
    size_t lu = li;
    if (lp) {
        memcpy(user + lu, "\n\n", 2);
        memcpy(user + lu + 2, json_string_value(inp), lp);
        lu += 2 + lp;
    }
    json_t *s = json_stringn_nocheck(user, lu);
    free(user);
    json_array_append_new(holder, s);
    *cap = 2;
    *msgs = xmalloc(2 * sizeof **msgs);
    (*msgs)[0] =
        (ChatMessage){.role = CHAT_USER, .content = json_string_value(s), .content_len = lu};
    (*msgs)[1] = (ChatMessage){.role = CHAT_ASSISTANT,
                               .content = json_string_value(out),
                               .content_len = json_string_length(out)};
    *n = 2;
    return 0;
}

int chat_data_parse_line(const char *line, size_t len, DataFormat format, const char *file,
                         int64_t lineno, json_t **root, ChatMessage **msgs, size_t *n,
                         const json_t **tools, Err *err) {
    *root = NULL;
    *msgs = NULL;
    *n = 0;
    *tools = NULL;
    char where[1100];
    snprintf(where, sizeof where, "%s:%lld", file, (long long)lineno);
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    if (!j)
        return err_set(err,
                       "%s: not valid JSON at column %d (%s); expected one object with %s "
                       "per line",
                       where, je.column, je.text, FORMAT_KEYS[format]);
    /* The holder owns the parsed line and any text made from it (the instruction turn). */
    json_t *holder = json_array();
    json_array_append_new(holder, j);
    *root = holder;
    size_t cap = 0;
    int rc = 0;
    if (!json_is_object(j))
        rc = err_set(err, "%s: expected a JSON object with %s, found %s", where,
                     FORMAT_KEYS[format], json_kind(j));
    else if (format == DATA_MESSAGES) {
        /* "conversations" is ShareGPT's name for the list, which TRL renames to "messages". */
        const char *key = json_object_get(j, "messages") ? "messages" : "conversations";
        const json_t *m = json_object_get(j, key);
        if (!m)
            rc = err_set(err, "%s: the object has no \"messages\" (or \"conversations\") field",
                         where);
        else if (!json_is_array(m))
            rc = err_set(err, "%s: \"%s\" must be an array, found %s", where, key, json_kind(m));
        else
            rc = read_message_array(m, key, where, msgs, n, &cap, err);
    } else if (format == DATA_PROMPT_COMPLETION) {
        rc = read_turns(j, "prompt", CHAT_USER, 1, where, msgs, n, &cap, err);
        if (rc == 0) rc = read_turns(j, "completion", CHAT_ASSISTANT, 1, where, msgs, n, &cap, err);
    } else if (format == DATA_INSTRUCTION) {
        rc = read_instruction(holder, j, where, msgs, n, &cap, err);
    } else {
        rc = err_set(err, "%s: training.data_format \"text\" is not a conversation format", where);
    }
    if (rc == 0 && *n == 0) rc = err_set(err, "%s: the conversation has no messages", where);
    /* The tool definitions offered in the conversation (TRL's "tools" column). */
    const json_t *t = rc == 0 && format != DATA_INSTRUCTION ? json_object_get(j, "tools") : NULL;
    if (t && !json_is_null(t)) {
        if (chat_tools_check(t, err)) {
            err_wrap(err, "%s", where);
            rc = -1;
        } else {
            *tools = t;
        }
    }
    if (rc != 0) {
        free(*msgs);
        *msgs = NULL;
        *n = 0;
        json_decref(holder);
        *root = NULL;
    }
    return rc;
}

/* ---- reading and rendering ----------------------------------------------------------------- */

typedef struct Grow {
    size_t cap_tok, cap_conv;
} Grow;

/* Keeps conversation tok (rendered) as the next one, or counts it as dropped. */
static int keep(ChatData *cd, Grow *g, const ChatTokens *tok, const char *where, Err *err) {
    int64_t L = (int64_t)tok->n, T = cd->opt.seq_len;
    int any_assistant = 0;
    for (size_t i = 0; i < tok->n; i++)
        any_assistant |= tok->assistant[i];
    if (!any_assistant && !cd->opt.train_on_all_tokens)
        return err_set(err,
                       "%s: the conversation has no assistant turn, so there is nothing to learn "
                       "(every target would be -100)",
                       where);
    if (L > T) {
        if (cd->opt.too_long == TOO_LONG_DROP) {
            cd->n_dropped++;
            return 0;
        }
        cd->n_truncated++;
    }
    int64_t K = L < T ? L : T, labels = 0;
    if (cd->n_tokens + K > (int64_t)g->cap_tok) {
        g->cap_tok = 2 * (size_t)(cd->n_tokens + K) + 1024;
        cd->ids = xrealloc(cd->ids, g->cap_tok * sizeof *cd->ids);
        cd->targets = xrealloc(cd->targets, g->cap_tok * sizeof *cd->targets);
    }
    for (int64_t i = 0; i < K; i++) {
        int counts = i + 1 < L && (cd->opt.train_on_all_tokens || tok->assistant[i + 1]);
        cd->ids[cd->n_tokens + i] = tok->ids[i];
        cd->targets[cd->n_tokens + i] = counts ? (int32_t)tok->ids[i + 1] : CE_IGNORE;
        labels += counts;
    }
    /* Truncation can leave no assistant token inside the row: nothing to learn there. */
    if (labels == 0) {
        if (L > T) cd->n_truncated--;
        cd->n_dropped++;
        return 0;
    }
    if ((size_t)cd->n_conv + 2 > g->cap_conv) {
        g->cap_conv = 2 * (size_t)cd->n_conv + 64;
        cd->off = xrealloc(cd->off, g->cap_conv * sizeof *cd->off);
        cd->labels = xrealloc(cd->labels, g->cap_conv * sizeof *cd->labels);
    }
    cd->n_tokens += K;
    cd->n_labels += labels;
    cd->labels[cd->n_conv] = labels;
    cd->off[++cd->n_conv] = cd->n_tokens;
    return 0;
}

/* Rows of a Parquet file's "messages" (or "conversations") column, checked as they come and
 * rendered a batch at a time in parallel, then kept in row order as JSON Lines lines are (the
 * rows' strings are copied: the pages they lie in are released as the reader moves on). */
enum { PQ_BATCH = 1024 };

typedef struct PqSlot {
    int64_t row;
    ChatMessage *msgs;
    int64_t n, cap;
    char *text; /* the row's contents and reasonings, which msgs point into */
    ChatTokens tok;
    int rc;
    Err err;
} PqSlot;

typedef struct ParquetRows {
    ChatData *cd;
    Grow *g;
    const ChatFormat *cf;
    const char *file;
    int64_t *lines;
    const char *column; /* "messages", or ShareGPT's "conversations" (roles "human", "gpt") */
    PqSlot *slots;      /* PQ_BATCH rows waiting to be rendered */
    int n;
} ParquetRows;

static void pq_where(const ParquetRows *pr, int64_t row, char *where, size_t cap) {
    snprintf(where, cap, "%s: row %lld", pr->file, (long long)row + 1);
}

/* Renders the waiting rows in parallel and keeps them in order; the first failure (in row
 * order) is the one reported. */
static int pq_flush(ParquetRows *pr, Err *err) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int i = 0; i < pr->n; i++) {
        PqSlot *s = &pr->slots[i];
        s->rc =
            chat_render(pr->cf, s->msgs, (size_t)s->n, (ChatOptions){0, 1, NULL}, &s->tok, &s->err);
    }
    int rc = 0;
    for (int i = 0; i < pr->n; i++) {
        PqSlot *s = &pr->slots[i];
        char where[1100];
        pq_where(pr, s->row, where, sizeof where);
        if (rc == 0 && s->rc != 0) {
            *err = s->err;
            rc = err_wrap(err, "%s", where);
        }
        if (rc == 0) rc = keep(pr->cd, pr->g, &s->tok, where, err);
        for (int64_t k = 0; k < s->n; k++)
            json_decref((json_t *)s->msgs[k].tool_calls);
        free(s->text);
        s->text = NULL;
        s->n = 0;
    }
    pr->n = 0;
    return rc;
}

/* A row's messages, checked (roles, tool calls) and copied into the next slot. */
static int pq_take(ParquetRows *pr, int64_t row, const ParquetStr *roles,
                   const ParquetStr *contents, const ParquetStr *reasonings,
                   const json_t *const *tool_calls, int64_t n, Err *err) {
    char where[1100];
    pq_where(pr, row, where, sizeof where);
    if (n == 0) return err_set(err, "%s: the conversation has no messages", where);
    PqSlot *s = &pr->slots[pr->n];
    if (n > s->cap) {
        s->cap = n;
        s->msgs = xrealloc(s->msgs, (size_t)n * sizeof *s->msgs);
    }
    size_t bytes = 1;
    for (int64_t i = 0; i < n; i++)
        bytes += (contents[i].p ? contents[i].n : 0) + (reasonings[i].p ? reasonings[i].n : 0);
    s->text = xmalloc(bytes);
    s->row = row;
    s->n = 0;
    size_t at = 0;
    int sharegpt = strcmp(pr->column, "conversations") == 0;
    for (int64_t i = 0; i < n; i++) {
        ChatMessage *m = &s->msgs[s->n];
        *m = (ChatMessage){0};
        int rc = roles[i].p
                     ? 0
                     : err_set(err, "%s: messages[%lld] has no \"role\"", where, (long long)i);
        if (rc == 0)
            rc = read_role(roles[i].p, roles[i].n, where, pr->column, (long long)i, sharegpt,
                           &m->role, err);
        if (rc == 0)
            rc = set_tool_calls(m, tool_calls ? tool_calls[i] : NULL, where, pr->column,
                                (long long)i, err);
        if (rc != 0) {
            for (int64_t k = 0; k < s->n; k++)
                json_decref((json_t *)s->msgs[k].tool_calls);
            free(s->text);
            s->text = NULL;
            s->n = 0;
            return -1;
        }
        json_incref((json_t *)m->tool_calls);
        m->content_null = !contents[i].p;
        m->content = s->text + at;
        if (contents[i].p) {
            memcpy(s->text + at, contents[i].p, contents[i].n);
            m->content_len = contents[i].n;
            at += contents[i].n;
        }
        if (reasonings[i].p) {
            m->reasoning = s->text + at;
            m->reasoning_len = reasonings[i].n;
            memcpy(s->text + at, reasonings[i].p, reasonings[i].n);
            at += reasonings[i].n;
        }
        s->n++;
    }
    pr->n++;
    return 0;
}

/* A row's failure, reported after the waiting rows are rendered: an earlier row that fails is
 * the one to report. */
static int pq_fail(ParquetRows *pr, Err *err) {
    Err mine = *err;
    if (pq_flush(pr, err) == 0) *err = mine;
    return -1;
}

static int parquet_row(void *ctx, int64_t row, const ParquetStr *roles, const ParquetStr *contents,
                       const ParquetStr *reasonings, const json_t *const *tool_calls, int64_t n,
                       Err *err) {
    ParquetRows *pr = ctx;
    (*pr->lines)++;
    if (pq_take(pr, row, roles, contents, reasonings, tool_calls, n, err) != 0)
        return pq_fail(pr, err);
    return pr->n == PQ_BATCH ? pq_flush(pr, err) : 0;
}

/* A row of string columns: prompt and completion, or instruction, input and output (as the
 * JSON Lines shapes of the same names read them). */
static int parquet_flat_row(void *ctx, int64_t row, const ParquetStr *v, Err *err) {
    ParquetRows *pr = ctx;
    char where[1100];
    pq_where(pr, row, where, sizeof where);
    int instr = pr->cd->opt.format == DATA_INSTRUCTION;
    const char *const names[2][3] = {{"prompt", "completion", ""},
                                     {"instruction", "input", "output"}};
    for (int k = 0; k < 2 + instr; k++)
        if (!v[k].p && !(instr && k == 1)) {
            err_set(err, "%s: \"%s\" is null", where, names[instr][k]);
            return pq_fail(pr, err);
        }
    ParquetStr user = v[0], answer = v[instr ? 2 : 1];
    char *joined = NULL;
    if (instr && v[1].p && v[1].n) { /* the instruction, a blank line, the input */
        joined = xmalloc(user.n + 2 + v[1].n + 1);
        memcpy(joined, user.p, user.n);
        memcpy(joined + user.n, "\n\n", 2);
        memcpy(joined + user.n + 2, v[1].p, v[1].n);
        user = (ParquetStr){joined, user.n + 2 + v[1].n};
    }
    ParquetStr roles[2] = {{"user", 4}, {"assistant", 9}}, contents[2] = {user, answer},
               none[2] = {{NULL, 0}, {NULL, 0}};
    int rc = parquet_row(ctx, row, roles, contents, none, NULL, 2, err);
    free(joined);
    return rc;
}

/* A Parquet file of conversations (text/parquet.h): its "messages" column, or the string
 * columns of the prompt_completion and instruction shapes. */
static int read_parquet(ChatData *cd, Grow *g, const char *file, const ChatFormat *cf,
                        int64_t *lines, Err *err) {
    const char *map;
    size_t len;
    TRY(fs_map_read(file, &map, &len, err));
    const char *buf = len ? map : "";
    ParquetRows pr = {cd, g, cf, file, lines, "messages", xcalloc(PQ_BATCH, sizeof(PqSlot)), 0};
    /* Tool definitions change every rendered conversation; not read from Parquet, they must
     * not be dropped in silence. */
    int tools = 0, rc = parquet_has_column(buf, len, file, "tools", &tools, err);
    if (rc == 0 && tools)
        rc = err_set(err,
                     "%s: the conversations have a \"tools\" column (tool definitions), which "
                     "qtitan reads from JSON Lines only; write the rows as JSON Lines (datasets' "
                     "Dataset.to_json does)",
                     file);
    if (rc != 0) {
        free(pr.slots);
        fs_unmap(map, len);
        return -1;
    }
    if (cd->opt.format == DATA_MESSAGES) {
        /* ShareGPT's "conversations" when there is no "messages" column. */
        int has_messages = 0;
        rc = parquet_has_column(buf, len, file, "messages", &has_messages, err);
        if (rc == 0 && !has_messages &&
            parquet_has_column(buf, len, file, "conversations", &has_messages, err) == 0 &&
            has_messages)
            pr.column = "conversations";
        if (rc == 0)
            rc = parquet_read_conversations(buf, len, file, pr.column, parquet_row, &pr, err);
    } else {
        int instr = cd->opt.format == DATA_INSTRUCTION;
        const char *cols[3] = {instr ? "instruction" : "prompt", instr ? "input" : "completion",
                               "output"};
        const int required[3] = {1, !instr, 1};
        rc = parquet_read_rows(buf, len, file, cols, required, 2 + instr, parquet_flat_row, &pr,
                               err);
    }
    /* The rows still waiting: rendered and kept, or, after a reader's failure, rendered so an
     * earlier row's failure is the one reported (and their tool calls released either way). */
    rc = rc == 0 ? pq_flush(&pr, err) : pq_fail(&pr, err);
    for (int i = 0; i < PQ_BATCH; i++) {
        free(pr.slots[i].msgs);
        free(pr.slots[i].text);
        chat_tokens_free(&pr.slots[i].tok);
    }
    free(pr.slots);
    fs_unmap(map, len);
    return rc;
}

/* Lines of a JSON Lines file rendered a batch at a time, in parallel over the lines (each one
 * parsed and rendered on its own: chat_render and the tokenizer are thread-safe), then kept in
 * file order, so the data and the first error reported do not depend on the thread count. */
enum { RENDER_BATCH = 1024 };

typedef struct RenderSlot {
    const char *line;
    size_t len;
    int64_t lineno;
    ChatTokens tok;
    int rc;
    Err err;
} RenderSlot;

static void render_slot(const ChatData *cd, const ChatFormat *cf, const char *file, RenderSlot *s) {
    json_t *root;
    ChatMessage *msgs;
    size_t n;
    const json_t *tools;
    s->rc = chat_data_parse_line(s->line, s->len, cd->opt.format, file, s->lineno, &root, &msgs, &n,
                                 &tools, &s->err);
    if (s->rc != 0) return;
    s->rc = chat_render(cf, msgs, n, (ChatOptions){0, 1, tools}, &s->tok, &s->err);
    if (s->rc != 0) err_wrap(&s->err, "%s:%lld", file, (long long)s->lineno);
    free(msgs);
    json_decref(root);
}

static int read_file(ChatData *cd, Grow *g, const char *file, const ChatFormat *cf, int64_t *lines,
                     Err *err) {
    char *buf;
    size_t len;
    if (parquet_is_name(file)) return read_parquet(cd, g, file, cf, lines, err);
    TRY(fs_read_all(file, &buf, &len, err));
    size_t pos = jsonl_bom_len(buf, len), line_len;
    const char *line;
    int64_t lineno = 0;
    int rc = 0, more = 1;
    RenderSlot *slots = xcalloc(RENDER_BATCH, sizeof *slots);
    json_object_seed(0); /* before any thread parses JSON */
    while (rc == 0 && more) {
        int n = 0;
        while (n < RENDER_BATCH &&
               (more = jsonl_next_line(buf, len, &pos, &line, &line_len) == 0)) {
            lineno++;
            if (jsonl_is_blank(line, line_len)) continue;
            slots[n].line = line;
            slots[n].len = line_len;
            slots[n++].lineno = lineno;
        }
#pragma omp parallel for schedule(dynamic, 16)
        for (int i = 0; i < n; i++)
            render_slot(cd, cf, file, &slots[i]);
        for (int i = 0; i < n && rc == 0; i++) {
            (*lines)++;
            if (slots[i].rc != 0) {
                *err = slots[i].err;
                rc = -1;
                break;
            }
            char where[1100];
            snprintf(where, sizeof where, "%s:%lld", file, (long long)slots[i].lineno);
            rc = keep(cd, g, &slots[i].tok, where, err);
        }
    }
    for (int i = 0; i < RENDER_BATCH; i++)
        chat_tokens_free(&slots[i].tok);
    free(slots);
    free(buf);
    return rc;
}

static int chat_data_open_in(ChatData *cd, const ChatDataOptions *opt, const ChatFormat *cf,
                             uint32_t pad_id, Err *err) {
    memset(cd, 0, sizeof *cd);
    cd->opt = *opt;
    cd->opt.path = xstrdup(opt->path);
    cd->pad_id = pad_id;
    if (opt->format == DATA_TEXT)
        return err_set(err, "chat data needs training.data_format \"messages\", "
                            "\"prompt_completion\" or \"instruction\"");
    Grow g = {0};
    cd->off = xcalloc(1, sizeof *cd->off);
    g.cap_conv = 1;
    int64_t lines = 0, files = 0;
    char *list = xstrdup(opt->path), *save = NULL;
    int rc = 0;
    for (char *f = strtok_r(list, ",", &save); f && rc == 0; f = strtok_r(NULL, ",", &save)) {
        if (!fs_exists(f)) {
            rc = err_set(err, "dataset file %s does not exist", f);
            break;
        }
        rc = read_file(cd, &g, f, cf, &lines, err);
        files++;
    }
    free(list);
    if (rc == 0 && cd->n_conv == 0)
        rc = err_set(err,
                     "dataset '%s' holds no conversation to train on (%lld line(s), %lld longer "
                     "than seq_len %d dropped)",
                     opt->path, (long long)lines, (long long)cd->n_dropped, opt->seq_len);
    if (rc != 0) {
        chat_data_close(cd);
        return -1;
    }
    cd->epoch_start = xcalloc(1, sizeof *cd->epoch_start);
    cd->n_epoch_start = 1;
    log_info("%s: %lld conversation(s) from %lld file(s) in the %s format, %lld tokens, "
             "%lld targets (%s); longer than seq_len %d: %lld truncated, %lld dropped",
             opt->what ? opt->what : "chat data", (long long)cd->n_conv, (long long)files,
             chat_format_name(cf), (long long)cd->n_tokens, (long long)cd->n_labels,
             opt->train_on_all_tokens ? "every token" : "assistant output only", opt->seq_len,
             (long long)cd->n_truncated, (long long)cd->n_dropped);
    return 0;
}

int chat_data_open(ChatData *cd, const ChatDataOptions *opt, const ChatFormat *cf, uint32_t pad_id,
                   Err *err) {
    size_t scope = err_oom_push("reading the chat data %s", opt->path);
    int r = chat_data_open_in(cd, opt, cf, pad_id, err);
    err_oom_pop(scope);
    return r;
}

static void epoch_free(ChatEpoch *e) {
    if (!e) return;
    free(e->perm);
    free(e->first);
    free(e->labels);
    free(e);
}

void chat_data_close(ChatData *cd) {
    free((char *)cd->opt.path);
    free(cd->ids);
    free(cd->targets);
    free(cd->off);
    free(cd->labels);
    epoch_free(cd->epochs[0]);
    epoch_free(cd->epochs[1]);
    free(cd->epoch_start);
    memset(cd, 0, sizeof *cd);
}

/* ---- rows ---------------------------------------------------------------------------------- */

static int64_t conv_len(const ChatData *cd, int64_t c) {
    return cd->off[c + 1] - cd->off[c];
}

static ChatEpoch *get_epoch(ChatData *cd, int64_t epoch) {
    for (int i = 0; i < 2; i++)
        if (cd->epochs[i] && cd->epochs[i]->epoch == epoch) {
            if (i == 1) {
                ChatEpoch *t = cd->epochs[0];
                cd->epochs[0] = cd->epochs[1];
                cd->epochs[1] = t;
            }
            return cd->epochs[0];
        }
    epoch_free(cd->epochs[1]);
    cd->epochs[1] = cd->epochs[0];
    int64_t n = cd->n_conv, T = cd->opt.seq_len;
    ChatEpoch *e = xcalloc(1, sizeof *e);
    e->epoch = epoch;
    e->perm = xmalloc((size_t)n * sizeof *e->perm);
    e->first = xmalloc((size_t)(n + 1) * sizeof *e->first);
    e->labels = xcalloc((size_t)n, sizeof *e->labels);
    for (int64_t i = 0; i < n; i++)
        e->perm[i] = i;
    if (cd->opt.shuffle) {
        Rng r;
        rng_seed(&r, cd->opt.seed, CHAT_SHUFFLE_STREAM + (uint64_t)epoch);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
            int64_t t = e->perm[i];
            e->perm[i] = e->perm[j];
            e->perm[j] = t;
        }
    }
    int64_t fill = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t l = conv_len(cd, e->perm[k]);
        if (k == 0 || !cd->opt.packing || fill + l > T) {
            e->first[e->n_rows++] = k;
            fill = 0;
        }
        fill += l;
        e->labels[e->n_rows - 1] += cd->labels[e->perm[k]];
    }
    e->first[e->n_rows] = n;
    cd->epochs[0] = e;
    return e;
}

/* The epoch of global row g and the row within it. */
static ChatEpoch *locate(ChatData *cd, int64_t g, int64_t *r) {
    while (cd->epoch_start[cd->n_epoch_start - 1] <= g) {
        int64_t last = cd->n_epoch_start - 1;
        int64_t rows = get_epoch(cd, last)->n_rows;
        cd->epoch_start =
            xrealloc(cd->epoch_start, (size_t)(cd->n_epoch_start + 1) * sizeof *cd->epoch_start);
        cd->epoch_start[cd->n_epoch_start++] = cd->epoch_start[last] + rows;
    }
    int64_t e = cd->n_epoch_start - 2;
    while (cd->epoch_start[e] > g)
        e--;
    *r = g - cd->epoch_start[e];
    return get_epoch(cd, e);
}

int64_t chat_data_epoch_rows(ChatData *cd, int64_t epoch) {
    return get_epoch(cd, epoch)->n_rows;
}

int64_t chat_data_labels(ChatData *cd, int64_t row, int nrows) {
    int64_t sum = 0;
    for (int b = 0; b < nrows; b++) {
        int64_t r;
        ChatEpoch *e = locate(cd, row + b, &r);
        sum += e->labels[r];
    }
    return sum;
}

int chat_data_rows(ChatData *cd, int64_t row, int nrows, Batch *out, int64_t *labels, Err *err) {
    int T = cd->opt.seq_len;
    if (row < 0 || nrows < 0 || nrows > out->B || out->T != T)
        return err_set(err,
                       "chat_data_rows: rows [%lld, +%d) into a (%d, %d) batch, expected "
                       "row >= 0 and a batch of at least that many rows of seq_len %d",
                       (long long)row, nrows, out->B, out->T, T);
    int64_t sum = 0;
    for (int b = 0; b < nrows; b++) {
        int64_t r;
        ChatEpoch *e = locate(cd, row + b, &r);
        sum += e->labels[r];
        uint32_t *tok = out->tokens + (size_t)b * T;
        int32_t *tgt = out->targets + (size_t)b * T;
        int32_t *pos = out->positions + (size_t)b * T;
        int32_t *doc = out->doc_ids + (size_t)b * T;
        int t = 0, seg = 0;
        for (int64_t k = e->first[r]; k < e->first[r + 1]; k++, seg++) {
            int64_t c = e->perm[k], l = conv_len(cd, c);
            for (int64_t i = 0; i < l; i++, t++) {
                tok[t] = cd->ids[cd->off[c] + i];
                tgt[t] = cd->targets[cd->off[c] + i];
                pos[t] = (int32_t)i;
                doc[t] = seg;
            }
        }
        /* Padding: its own segment, so no conversation attends to it; never a target. */
        for (int p = 0; t < T; t++, p++) {
            tok[t] = cd->pad_id;
            tgt[t] = CE_IGNORE;
            pos[t] = p;
            doc[t] = seg;
        }
    }
    if (labels) *labels = sum;
    return 0;
}
