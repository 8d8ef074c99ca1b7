/* Chat formats: a conversation (system / user / assistant / tool messages, and the tool
 * definitions the model may call) rendered to token ids
 * exactly as transformers' apply_chat_template renders it with the model's own template, with
 * a flag per token that marks assistant output (what supervised fine-tuning learns).
 *
 * qtitan does not run Jinja: it recognises the chat_template of a tokenizer folder (the
 * tokenizer_config.json beside the loaded tokenizer.json, or chat_template.jinja) by its hash
 * and renders the format it names in C. Known: Qwen3's (thinking tags, enable_thinking), in its
 * first and its string-content revision, and the Qwen3 2507 Instruct and Thinking templates.
 * docs/finetune.md gives the rules and which tokens count as assistant output. */
#ifndef QT_CHAT_TEMPLATE_H
#define QT_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/err.h"
#include "text/tokenizer.h"

typedef enum ChatRole { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_TOOL, CHAT_NROLES } ChatRole;

/* "system", "user", "assistant", "tool" to a role; -1 (no err written) for anything else. */
int chat_role_parse(const char *name, size_t len, ChatRole *out);
const char *chat_role_name(ChatRole role);

/* The names an assistant's reasoning may come under, in the order transformers takes the first
 * that is not null and hands to the template as reasoning_content (its
 * _alias_reasoning_fields): what the JSON Lines and Parquet readers of chat data read. */
#define CHAT_N_REASONING_KEYS 3
extern const char *const chat_reasoning_keys[CHAT_N_REASONING_KEYS];

/* One message. Strings are UTF-8 with explicit lengths (JSON strings may hold NUL bytes). */
typedef struct ChatMessage {
    ChatRole role;
    const char *content;
    size_t content_len;
    /* 1 when the message's content is null (content is then ""): what the later Qwen3
     * templates render as empty and the first one cannot render. */
    int content_null;
    /* An assistant's reasoning_content, or NULL: then the reasoning is what content holds
     * between <think> and </think>, as the template reads it. */
    const char *reasoning;
    size_t reasoning_len;
    /* An assistant's tool calls: a JSON array of objects, each {"name": STRING, "arguments":
     * ANY} or {"function": {"name", "arguments"}} (OpenAI's shape), checked by the data reader
     * (chat_tool_calls_check); NULL when none. */
    const json_t *tool_calls;
} ChatMessage;

typedef struct ChatOptions {
    int add_generation_prompt; /* end with an open assistant turn, for generation */
    /* 0: that open turn starts with an empty think block; only for a template that reads
     * enable_thinking (chat_format_thinking_switch), others refuse 0 with a sentence. */
    int enable_thinking;
    /* The tool definitions offered to the model: a JSON array of objects (JSON schemas, as
     * apply_chat_template's tools=), written into the system turn; NULL or [] for none. */
    const json_t *tools;
} ChatOptions;

/* Token ids and, for each, 1 when it is assistant output. */
typedef struct ChatTokens {
    uint32_t *ids;
    uint8_t *assistant;
    size_t n, cap;
} ChatTokens;
void chat_tokens_free(ChatTokens *t);

typedef struct ChatFormat ChatFormat;

/* The chat format of tok's folder. An error sentence names the file when the folder has no
 * chat template, or one qtitan does not know, or the tokenizer lacks the format's tokens. tok
 * must outlive the format. */
ChatFormat *chat_format_load(const Tokenizer *tok, Err *err);
/* The same with the template read from `where` (chat_template_read; TRL's chat_template_path)
 * instead of tok's folder; NULL or "" means tok's folder. */
ChatFormat *chat_format_load_at(const Tokenizer *tok, const char *where, Err *err);
/* Reads a chat template's text (malloc'd, NUL-terminated, *len bytes) from `where`: a folder
 * (its chat_template.jinja, else its tokenizer_config.json's chat_template, as transformers
 * reads them), a file ending in .json (a tokenizer_config.json: its chat_template), or any
 * other file (the template itself, as chat_template.jinja holds it). *file (malloc'd, also on
 * failure) is the file read, for sentences. */
int chat_template_read(const char *where, char **text, size_t *len, char **file, Err *err);
/* The format of a template's text (text[0..len)) read from `file` (named in sentences). */
ChatFormat *chat_format_from_text(const Tokenizer *tok, const char *text, size_t len,
                                  const char *file, Err *err);
void chat_format_free(ChatFormat *cf);
/* Short name of the recognised format ("qwen3", "qwen3-2507-instruct", ...), for logs. */
const char *chat_format_name(const ChatFormat *cf);
/* 1 when the template reads enable_thinking (Qwen3's hybrid models), 0 when it ignores it (the
 * 2507 Instruct and Thinking templates). */
int chat_format_thinking_switch(const ChatFormat *cf);

/* Checks an assistant message's "tool_calls" value: an array of objects that each name a
 * function (a "name" string) and carry its "arguments" (a JSON string, written as it is, or any
 * other JSON value, written as JSON), directly or inside a "function" object. The sentence names
 * the call by index. */
int chat_tool_calls_check(const json_t *calls, Err *err);
/* Checks a conversation's "tools" value: an array of objects. */
int chat_tools_check(const json_t *tools, Err *err);

/* Renders msgs[0..n) into out (its previous contents are replaced). Fails with a sentence for
 * an empty conversation. Thread-safe for concurrent calls on one format. */
int chat_render(const ChatFormat *cf, const ChatMessage *msgs, size_t n, ChatOptions opt,
                ChatTokens *out, Err *err);

/* Appends to out the ids of a prompt as one user turn (after a system turn when system is not
 * NULL or ""), ending with the open assistant turn (add_generation_prompt; enable_thinking as
 * given), with the tools offered when tools is a non-empty array: what generate --chat and
 * chat samples during training feed the model. */
int chat_render_prompt(const ChatFormat *cf, const char *system, const char *prompt,
                       int enable_thinking, const json_t *tools, IdVec *out, Err *err);

#endif
