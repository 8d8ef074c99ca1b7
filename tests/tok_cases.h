/* Test helper (header-only, included by the tokenizer tests): reads the HF reference cases of
 * the JSONL files in tests/fixtures/tokenizer/ (see tools/tokenizer_fixtures.py) and checks a
 * tokenizer against them. */
#ifndef QT_TOK_CASES_H
#define QT_TOK_CASES_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "text/tokenizer.h"

/* Input bytes of a case: "text", "hex" (raw bytes) or "repeat" ([[piece, count], ...]). */
static char *case_input(const json_t *c, size_t *len) {
    json_t *v;
    if ((v = json_object_get(c, "text"))) {
        *len = json_string_length(v);
        char *s = malloc(*len + 1);
        memcpy(s, json_string_value(v), *len + 1);
        return s;
    }
    if ((v = json_object_get(c, "hex"))) {
        const char *h = json_string_value(v);
        *len = strlen(h) / 2;
        char *s = malloc(*len + 1);
        for (size_t i = 0; i < *len; i++) {
            unsigned b;
            sscanf(h + 2 * i, "%2x", &b);
            s[i] = (char)b;
        }
        s[*len] = 0;
        return s;
    }
    v = json_object_get(c, "repeat");
    size_t cap = 1, n = 0, i;
    json_t *part;
    json_array_foreach(v, i, part) cap += json_string_length(json_array_get(part, 0)) *
                                          (size_t)json_integer_value(json_array_get(part, 1));
    char *s = malloc(cap);
    json_array_foreach(v, i, part) {
        const char *p = json_string_value(json_array_get(part, 0));
        size_t pl = strlen(p);
        for (json_int_t k = 0; k < json_integer_value(json_array_get(part, 1)); k++, n += pl)
            memcpy(s + n, p, pl);
    }
    s[n] = 0;
    *len = n;
    return s;
}

/* Checks every case of fixture `file` (relative to tests/fixtures/tokenizer/): ids equal HF's,
 * and decoding them gives HF's decoded text. Returns the number of failing cases. */
static int check_cases(const Tokenizer *t, const char *file, int *n_cases) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/%s", getenv("QT_SOURCE_DIR"), file);
    char *data;
    size_t dlen;
    Err err;
    if (fs_read_all(path, &data, &dlen, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int fails = 0;
    *n_cases = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &je);
        if (!c) {
            fprintf(stderr, "%s: bad line: %s\n", path, je.text);
            fails++;
            continue;
        }
        (*n_cases)++;
        size_t len;
        char *in = case_input(c, &len);
        IdVec ids = {0};
        int bad = tokenizer_encode(t, in, len, &ids, &err) != 0;
        json_t *want = json_object_get(c, "ids");
        bad |= ids.n != json_array_size(want);
        for (size_t i = 0; !bad && i < ids.n; i++)
            bad |= ids.ids[i] != (uint32_t)json_integer_value(json_array_get(want, i));
        json_t *dec = json_object_get(c, "decoded");
        if (!bad && dec) {
            char *text;
            size_t tl;
            bad |= tokenizer_decode(t, ids.ids, ids.n, &text, &tl, &err) != 0;
            if (!bad) {
                bad |= tl != json_string_length(dec) || memcmp(text, json_string_value(dec), tl);
                free(text);
            }
        }
        if (bad) {
            fails++;
            if (fails <= 5)
                fprintf(stderr, "%s: mismatch on case %.200s\n  got %zu ids:", file, line, ids.n);
            for (size_t i = 0; fails <= 5 && i < ids.n && i < 40; i++)
                fprintf(stderr, " %u", ids.ids[i]);
            if (fails <= 5) fprintf(stderr, "\n");
        }
        idvec_free(&ids);
        free(in);
        json_decref(c);
    }
    free(data);
    return fails;
}

#endif
