/* Fuzzes the chat data line parser: every line of arbitrary bytes goes through each
 * conversation format, which must fail with a FILE:LINE sentence or give messages whose
 * strings lie inside the parsed JSON. The first byte picks the format. Tool definitions and
 * tool calls, which the chat format writes as JSON the way Python's json.dumps does
 * (json_dumps_py), must read back as the same values. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "text/chat_data.h"
#include "text/jsonl.h"

/* json_dumps_py(v) parses back to a value equal to v. */
static void round_trip(const json_t *v) {
    size_t n;
    char *text = json_dumps_py(v, &n);
    json_error_t je;
    json_t *back = json_loadb(text, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!back || !json_equal(back, v)) abort();
    json_decref(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    DataFormat format = (DataFormat)(DATA_MESSAGES + data[0] % 3);
    const char *buf = (const char *)data + 1;
    size_t pos = 0, len;
    const char *line;
    int64_t lineno = 0;
    while (jsonl_next_line(buf, size - 1, &pos, &line, &len) == 0) {
        lineno++;
        json_t *root;
        ChatMessage *msgs;
        size_t n;
        const json_t *tools;
        Err err;
        err.msg[0] = 0;
        if (chat_data_parse_line(line, len, format, "fuzz.jsonl", lineno, &root, &msgs, &n, &tools,
                                 &err) == 0) {
            if (tools) round_trip(tools);
            if (!root || n == 0) abort();
            for (size_t i = 0; i < n; i++) {
                if (msgs[i].role >= CHAT_NROLES || !msgs[i].content) abort();
                if (msgs[i].content_null && msgs[i].content_len) abort();
                if (msgs[i].tool_calls) round_trip(msgs[i].tool_calls);
                if (msgs[i].content_len && msgs[i].content[msgs[i].content_len - 1] == 0 &&
                    msgs[i].content[msgs[i].content_len] != 0)
                    abort();
            }
            free(msgs);
            json_decref(root);
        } else if (strncmp(err.msg, "fuzz.jsonl:", 11) != 0 || root) {
            abort();
        }
    }
    return 0;
}
