/* Byte-level BPE merges: the merge table keyed by the pair of ids, and the word encoder that
 * applies merges by rank (lowest first, leftmost among equals), as HF tokenizers' BPE model. */
#ifndef QT_BPE_H
#define QT_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "text/idvec.h"

#define BPE_NONE UINT32_MAX

/* One merge-table slot: key and value side by side, so a lookup touches one cache line. */
typedef struct BpeSlot {
    uint64_t key;    // left << 32 | right, or UINT64_MAX when empty
    uint32_t rank;   // merge priority (lower first)
    uint32_t merged; // id of the merged token
} BpeSlot;

typedef struct Bpe {
    BpeSlot *slots; // (cap) open addressing, linear probing
    size_t cap, n;
    uint32_t byte_id[256]; // id of the token for each single byte, BPE_NONE when missing
    uint64_t tag;          // unique per loaded tokenizer: keys the per-thread word cache
} Bpe;

void bpe_init(Bpe *b, size_t n_merges);
void bpe_free(Bpe *b);
/* Adds merge (left, right) -> merged with the given rank; returns -1 when the pair is there. */
int bpe_add_merge(Bpe *b, uint32_t left, uint32_t right, uint32_t merged, uint32_t rank);
/* Rank and merged id of a pair; returns 0 when there is no such merge. */
int bpe_lookup(const Bpe *b, uint32_t left, uint32_t right, uint32_t *rank, uint32_t *merged);

/* Appends the ids of one pre-token (raw bytes; each byte starts as its own symbol). Uses a
 * per-thread cache of short words. */
void bpe_encode_word(const Bpe *b, const uint8_t *w, size_t n, IdVec *out);
/* The same without the cache, for testing: `heap` picks the priority-queue algorithm (used for
 * long words) instead of the quadratic scan (used for short ones). */
void bpe_encode_word_uncached(const Bpe *b, const uint8_t *w, size_t n, int heap, IdVec *out);

#endif
