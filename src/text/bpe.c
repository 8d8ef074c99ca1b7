/* BPE merging. Short words use a quadratic scan over adjacent pairs (fast for the usual
 * handful of bytes); long ones use a priority queue of (rank, position) over a linked list
 * of symbols, so a 100k-byte word stays O(n log n). Both pick the lowest rank, leftmost first,
 * which is what HF tokenizers' queue does; tests compare the two. */
#include "text/bpe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

void bpe_init(Bpe *b, size_t n_merges) {
    static uint64_t next_tag = 1;
    memset(b, 0, sizeof *b);
    b->cap = 16;
    while (b->cap < n_merges * 2 + 16)
        b->cap *= 2;
    b->slots = xmalloc(b->cap * sizeof *b->slots);
    for (size_t i = 0; i < b->cap; i++)
        b->slots[i].key = UINT64_MAX;
    for (int i = 0; i < 256; i++)
        b->byte_id[i] = BPE_NONE;
    b->tag = __atomic_fetch_add(&next_tag, 1, __ATOMIC_RELAXED);
}

void bpe_free(Bpe *b) {
    free(b->slots);
    memset(b, 0, sizeof *b);
}

int bpe_add_merge(Bpe *b, uint32_t left, uint32_t right, uint32_t merged, uint32_t rank) {
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = b->cap - 1, h = mix64(key) & mask;
    while (b->slots[h].key != UINT64_MAX) {
        if (b->slots[h].key == key) return -1;
        h = (h + 1) & mask;
    }
    b->slots[h] = (BpeSlot){key, rank, merged};
    b->n++;
    return 0;
}

int bpe_lookup(const Bpe *b, uint32_t left, uint32_t right, uint32_t *rank, uint32_t *merged) {
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = b->cap - 1, h = mix64(key) & mask;
    for (;;) {
        const BpeSlot *sl = &b->slots[h];
        if (sl->key == key) {
            *rank = sl->rank;
            *merged = sl->merged;
            return 1;
        }
        uint64_t k = sl->key;
        if (k == UINT64_MAX) return 0;
        h = (h + 1) & mask;
    }
}

/* Quadratic scan: ids[0..m) with rank[k]/merged[k] for the pair (ids[k], ids[k+1]). */
static void merge_scan(const Bpe *b, uint32_t *ids, size_t m, IdVec *out) {
    uint32_t rankbuf[64], mergedbuf[64];
    uint32_t *rank = m <= 64 ? rankbuf : xmalloc(m * sizeof *rank);
    uint32_t *merged = m <= 64 ? mergedbuf : xmalloc(m * sizeof *merged);
    for (size_t k = 0; k + 1 < m; k++)
        if (!bpe_lookup(b, ids[k], ids[k + 1], &rank[k], &merged[k])) rank[k] = BPE_NONE;
    while (m > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < m; k++)
            if (rank[k] < rank[best]) best = k;
        if (rank[best] == BPE_NONE) break;
        ids[best] = merged[best];
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof *ids);
        memmove(rank + best, rank + best + 1, (m - best - 2) * sizeof *rank);
        memmove(merged + best, merged + best + 1, (m - best - 2) * sizeof *merged);
        m--;
        if (best > 0 &&
            !bpe_lookup(b, ids[best - 1], ids[best], &rank[best - 1], &merged[best - 1]))
            rank[best - 1] = BPE_NONE;
        if (best + 1 < m && !bpe_lookup(b, ids[best], ids[best + 1], &rank[best], &merged[best]))
            rank[best] = BPE_NONE;
    }
    for (size_t k = 0; k < m; k++)
        idvec_push(out, ids[k]);
    if (rank != rankbuf) free(rank);
    if (merged != mergedbuf) free(merged);
}

typedef struct {
    uint32_t rank, pos, merged;
} QItem;

static int qless(const QItem *a, const QItem *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void qpush(QItem *q, size_t *n, QItem it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!qless(&it, &q[p])) break;
        q[i] = q[p];
        i = p;
    }
    q[i] = it;
}

static QItem qpop(QItem *q, size_t *n) {
    QItem top = q[0], last = q[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && qless(&q[c + 1], &q[c])) c++;
        if (!qless(&q[c], &last)) break;
        q[i] = q[c];
        i = c;
    }
    if (*n > 0) q[i] = last;
    return top;
}

/* Priority-queue merge over a linked list; a popped entry is stale when its left symbol was
 * absorbed, has no right neighbour any more, or the pair there now merges to another id. */
static void merge_heap(const Bpe *b, uint32_t *ids, size_t m, IdVec *out) {
    int64_t *prev = xmalloc(m * sizeof *prev), *next = xmalloc(m * sizeof *next);
    uint8_t *alive = xmalloc(m);
    QItem *q = xmalloc((3 * m + 1) * sizeof *q); // m - 1 pairs, then at most 2 per merge
    size_t nq = 0;
    for (size_t k = 0; k < m; k++) {
        prev[k] = (int64_t)k - 1;
        next[k] = k + 1 < m ? (int64_t)k + 1 : -1;
        alive[k] = 1;
    }
    for (size_t k = 0; k + 1 < m; k++) {
        QItem it = {0, (uint32_t)k, 0};
        if (bpe_lookup(b, ids[k], ids[k + 1], &it.rank, &it.merged)) qpush(q, &nq, it);
    }
    while (nq > 0) {
        QItem it = qpop(q, &nq);
        size_t p = it.pos;
        if (!alive[p] || next[p] < 0) continue;
        size_t r = (size_t)next[p];
        uint32_t rank, merged;
        if (!bpe_lookup(b, ids[p], ids[r], &rank, &merged) || merged != it.merged) continue;
        ids[p] = merged;
        alive[r] = 0;
        next[p] = next[r];
        if (next[r] >= 0) prev[next[r]] = (int64_t)p;
        if (prev[p] >= 0) {
            QItem n = {0, (uint32_t)prev[p], 0};
            if (bpe_lookup(b, ids[prev[p]], ids[p], &n.rank, &n.merged)) qpush(q, &nq, n);
        }
        if (next[p] >= 0) {
            QItem n = {0, (uint32_t)p, 0};
            if (bpe_lookup(b, ids[p], ids[next[p]], &n.rank, &n.merged)) qpush(q, &nq, n);
        }
    }
    for (int64_t k = 0; k >= 0 && (size_t)k < m; k = next[k])
        idvec_push(out, ids[k]);
    free(prev);
    free(next);
    free(alive);
    free(q);
}

void bpe_encode_word_uncached(const Bpe *b, const uint8_t *w, size_t n, int heap, IdVec *out) {
    uint32_t buf[64];
    uint32_t *ids = n <= 64 ? buf : xmalloc(n * sizeof *ids);
    size_t m = 0;
    /* Bytes without a token are dropped, as HF's BPE does when there is no unk_token. */
    for (size_t i = 0; i < n; i++)
        if (b->byte_id[w[i]] != BPE_NONE) ids[m++] = b->byte_id[w[i]];
    if (m > 0) {
        if (heap)
            merge_heap(b, ids, m, out);
        else
            merge_scan(b, ids, m, out);
    }
    if (ids != buf) free(ids);
}

/* Per-thread direct-mapped cache of short words; an entry is valid for the tokenizer whose
 * tag it carries. */
#define CACHE_SLOTS 16384
#define CACHE_KEY 22
#define CACHE_IDS 8
typedef struct {
    uint64_t tag;
    uint8_t klen, nids;
    char key[CACHE_KEY];
    uint32_t ids[CACHE_IDS];
} CacheSlot;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static void cache_key_init(void) {
    pthread_key_create(&cache_key, free);
}

static CacheSlot *thread_cache(void) {
    pthread_once(&cache_once, cache_key_init);
    CacheSlot *c = pthread_getspecific(cache_key);
    if (!c) {
        c = xcalloc(CACHE_SLOTS, sizeof *c);
        pthread_setspecific(cache_key, c);
    }
    return c;
}

void bpe_encode_word(const Bpe *b, const uint8_t *w, size_t n, IdVec *out) {
    if (n == 1 && b->byte_id[w[0]] != BPE_NONE) {
        idvec_push(out, b->byte_id[w[0]]);
        return;
    }
    if (n > CACHE_KEY) {
        bpe_encode_word_uncached(b, w, n, n > 128, out);
        return;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ w[i]) * 1099511628211ull;
    CacheSlot *s = &thread_cache()[mix64(h) & (CACHE_SLOTS - 1)];
    if (s->tag == b->tag && s->klen == n && memcmp(s->key, w, n) == 0) {
        for (int i = 0; i < s->nids; i++)
            idvec_push(out, s->ids[i]);
        return;
    }
    size_t start = out->n;
    bpe_encode_word_uncached(b, w, n, 0, out);
    size_t got = out->n - start;
    if (got <= CACHE_IDS) {
        s->tag = b->tag;
        s->klen = (uint8_t)n;
        s->nids = (uint8_t)got;
        /* Guarded: an empty word or result may come with NULL pointers, which memcpy may not
         * be given even for 0 bytes. */
        if (n) memcpy(s->key, w, n);
        if (got) memcpy(s->ids, out->ids + start, got * sizeof *s->ids);
    }
}
