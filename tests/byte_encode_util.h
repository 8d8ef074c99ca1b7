/* A byte-level encoder for dataset tests: token id = byte value (EOS is the caller's, e.g.
 * 256), so expected ids can be read off the text. */
#ifndef QT_TEST_BYTE_ENCODE_UTIL_H
#define QT_TEST_BYTE_ENCODE_UTIL_H

#include <stdlib.h>

#include "core/err.h"
#include "text/idvec.h"

static inline void byte_ids_append(IdVec *out, const char *text, size_t len) {
    if (out->n + len > out->cap) {
        out->cap = out->n + len + 16;
        out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
    }
    for (size_t i = 0; i < len; i++)
        out->ids[out->n++] = (unsigned char)text[i];
}

static inline int byte_encode(const void *ctx, const char *text, size_t len, IdVec *out, Err *err) {
    (void)ctx;
    (void)err;
    byte_ids_append(out, text, len);
    return 0;
}

#endif
