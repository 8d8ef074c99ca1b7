/* Fuzzes the JSONL reader: arbitrary bytes are split into lines and every line goes through
 * the "text" extraction, which must fail with a FILE:LINE sentence or return the string. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *buf = (const char *)data;
    size_t pos = 0, len;
    const char *line;
    int64_t lineno = 0;
    while (jsonl_next_line(buf, size, &pos, &line, &len) == 0) {
        lineno++;
        if (line < buf || line + len > buf + size) abort();
        if (jsonl_is_blank(line, len)) continue;
        char *text = NULL;
        size_t tl = 0;
        Err err;
        err.msg[0] = 0;
        if (jsonl_parse_text(line, len, NULL, "fuzz.jsonl", lineno, &text, &tl, &err) == 0) {
            if (!text || text[tl] != 0) abort();
            free(text);
        } else if (strncmp(err.msg, "fuzz.jsonl:", 11) != 0) {
            abort();
        }
    }
    return 0;
}
