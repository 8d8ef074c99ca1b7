/* A growable buffer of token ids, the output of the BPE word encoder and of the tokenizer. Its
 * own header so that text/bpe.h and text/tokenizer.h both read it without including each
 * other. */
#ifndef QT_IDVEC_H
#define QT_IDVEC_H

#include <stddef.h>
#include <stdint.h>

typedef struct IdVec {
    uint32_t *ids;
    size_t n, cap;
} IdVec;
void idvec_push(IdVec *v, uint32_t id);
void idvec_free(IdVec *v);

#endif
