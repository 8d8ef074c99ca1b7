/* Fuzzes the chat data line parser: every line of arbitrary bytes goes through each
 * conversation format, which must fail with a FILE:LINE sentence or give messages whose
 * strings lie inside the parsed JSON. The first byte picks the format. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_data.h"
#include "text/jsonl.h"

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
        Err err;
        err.msg[0] = 0;
        if (chat_data_parse_line(line, len, format, "fuzz.jsonl", lineno, &root, &msgs, &n, &err) ==
            0) {
            if (!root || n == 0) abort();
            for (size_t i = 0; i < n; i++) {
                if (msgs[i].role > CHAT_ASSISTANT || !msgs[i].content) abort();
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
