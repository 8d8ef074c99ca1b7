/* BPE training. Documents are cut at special tokens, NFC-normalized and split by the Qwen
 * scanner; each distinct pre-token becomes a word (bytes + count). Merging repeatedly takes
 * the most frequent adjacent pair (ties: smallest pair of ids, so runs are deterministic),
 * found through a max-heap with lazy deletion; only the words holding that pair are
 * rewritten, found through a per-pair list of words. Ids: 0-255 are the bytes, then one id
 * per new token string in merge order, then the special tokens. */
#include "text/bpe_train.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/fs.h"
#include "text/pretok.h"
#include "text/utf8.h"

typedef struct Word {
    uint32_t *sym;
    uint32_t n;
    int64_t count;
    uint32_t mark; // last merge step that rewrote this word
} Word;

typedef struct Pair {
    uint64_t key; // left << 32 | right; UINT64_MAX when the slot is empty
    int64_t count;
    uint32_t *words; // indices of words that held this pair (may repeat or be stale)
    uint32_t n_words, cap_words, touched;
} Pair;

typedef struct HeapItem {
    int64_t count;
    uint64_t key;
} HeapItem;

struct BpeTrainer {
    BpeTrainOptions opt;
    char **special; // copies of opt.special
    /* Word counting: open addressing over byte strings. */
    char *wblob;
    size_t wblob_n, wblob_cap;
    size_t *woff; // (n_words + 1)
    int64_t *wcount;
    uint32_t *wmap;
    size_t wmap_cap, n_words, words_cap;
    /* Training state. */
    Word *words;
    Pair *pairs;
    size_t pairs_cap, n_pairs;
    HeapItem *heap;
    size_t heap_n, heap_cap;
    /* Tokens: bytes of each id, and string -> id. */
    char *tblob;
    size_t tblob_n, tblob_cap;
    size_t *toff; // (n_tok + 1)
    size_t n_tok, tok_cap;
    uint32_t *tmap;
    size_t tmap_cap;
    uint32_t (*merges)[2];
    size_t n_merges;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

BpeTrainer *bpe_trainer_new(const BpeTrainOptions *opt) {
    BpeTrainer *tr = xcalloc(1, sizeof *tr);
    tr->opt = *opt;
    tr->special = xcalloc(opt->n_special + 1, sizeof *tr->special);
    for (size_t i = 0; i < opt->n_special; i++)
        tr->special[i] = xstrdup(opt->special[i]);
    tr->wmap_cap = 1 << 16;
    tr->wmap = xmalloc(tr->wmap_cap * sizeof *tr->wmap);
    memset(tr->wmap, 0xFF, tr->wmap_cap * sizeof *tr->wmap);
    tr->words_cap = 1024;
    tr->woff = xmalloc((tr->words_cap + 1) * sizeof *tr->woff);
    tr->wcount = xmalloc(tr->words_cap * sizeof *tr->wcount);
    tr->woff[0] = 0;
    return tr;
}

void bpe_trainer_free(BpeTrainer *tr) {
    if (!tr) return;
    for (size_t i = 0; i < tr->opt.n_special; i++)
        free(tr->special[i]);
    free(tr->special);
    free(tr->wblob);
    free(tr->woff);
    free(tr->wcount);
    free(tr->wmap);
    if (tr->words)
        for (size_t i = 0; i < tr->n_words; i++)
            free(tr->words[i].sym);
    free(tr->words);
    for (size_t i = 0; tr->pairs && i < tr->pairs_cap; i++)
        free(tr->pairs[i].words);
    free(tr->pairs);
    free(tr->heap);
    free(tr->tblob);
    free(tr->toff);
    free(tr->tmap);
    free(tr->merges);
    free(tr);
}

/* ---- counting */

static void word_map_grow(BpeTrainer *tr) {
    size_t cap = tr->wmap_cap * 2;
    uint32_t *m = xmalloc(cap * sizeof *m);
    memset(m, 0xFF, cap * sizeof *m);
    for (size_t w = 0; w < tr->n_words; w++) {
        size_t h = hash_bytes(tr->wblob + tr->woff[w], tr->woff[w + 1] - tr->woff[w]) & (cap - 1);
        while (m[h] != UINT32_MAX)
            h = (h + 1) & (cap - 1);
        m[h] = (uint32_t)w;
    }
    free(tr->wmap);
    tr->wmap = m;
    tr->wmap_cap = cap;
}

static int count_piece(void *ctx, const char *s, size_t n) {
    BpeTrainer *tr = ctx;
    size_t mask = tr->wmap_cap - 1, h = hash_bytes(s, n) & mask;
    for (;;) {
        uint32_t w = tr->wmap[h];
        if (w == UINT32_MAX) break;
        if (tr->woff[w + 1] - tr->woff[w] == n && memcmp(tr->wblob + tr->woff[w], s, n) == 0) {
            tr->wcount[w]++;
            return 0;
        }
        h = (h + 1) & mask;
    }
    if (tr->n_words == tr->words_cap) {
        tr->words_cap *= 2;
        tr->woff = xrealloc(tr->woff, (tr->words_cap + 1) * sizeof *tr->woff);
        tr->wcount = xrealloc(tr->wcount, tr->words_cap * sizeof *tr->wcount);
    }
    if (tr->wblob_n + n > tr->wblob_cap) {
        tr->wblob_cap = (tr->wblob_n + n) * 2 + 4096;
        tr->wblob = xrealloc(tr->wblob, tr->wblob_cap);
    }
    memcpy(tr->wblob + tr->wblob_n, s, n);
    tr->wblob_n += n;
    size_t w = tr->n_words++;
    tr->woff[w + 1] = tr->wblob_n;
    tr->wcount[w] = 1;
    tr->wmap[h] = (uint32_t)w;
    if (tr->n_words * 2 > tr->wmap_cap) word_map_grow(tr);
    return 0;
}

static void count_text(BpeTrainer *tr, const char *s, size_t n) {
    if (n == 0) return;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r >= 0) pretok_qwen((const char *)nfc, (size_t)r, count_piece, tr);
    free(nfc);
}

void bpe_trainer_add(BpeTrainer *tr, const char *text, size_t len) {
    char *fixed = NULL;
    if (utf8_valid_prefix(text, len) != len) text = fixed = utf8_repair(text, len, &len);
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        for (size_t k = 0; k < tr->opt.n_special; k++) {
            size_t sl = strlen(tr->special[k]);
            if (sl && sl <= len - i && memcmp(text + i, tr->special[k], sl) == 0) {
                count_text(tr, text + start, i - start);
                start = i + sl;
                i = start - 1;
                break;
            }
        }
    }
    count_text(tr, text + start, len - start);
    free(fixed);
}

/* ---- tokens */

static void tok_map_insert(BpeTrainer *tr, uint32_t id);

static void tok_map_grow(BpeTrainer *tr) {
    tr->tmap_cap = tr->tmap_cap ? tr->tmap_cap * 2 : 1024;
    free(tr->tmap);
    tr->tmap = xmalloc(tr->tmap_cap * sizeof *tr->tmap);
    memset(tr->tmap, 0xFF, tr->tmap_cap * sizeof *tr->tmap);
    for (size_t id = 0; id < tr->n_tok; id++)
        tok_map_insert(tr, (uint32_t)id);
}

static void tok_map_insert(BpeTrainer *tr, uint32_t id) {
    size_t mask = tr->tmap_cap - 1,
           h = hash_bytes(tr->tblob + tr->toff[id], tr->toff[id + 1] - tr->toff[id]) & mask;
    while (tr->tmap[h] != UINT32_MAX)
        h = (h + 1) & mask;
    tr->tmap[h] = id;
}

/* Id of the token with bytes s[0..n), creating it when new. */
static uint32_t tok_intern(BpeTrainer *tr, const char *s, size_t n) {
    if (tr->tmap_cap) {
        size_t mask = tr->tmap_cap - 1, h = hash_bytes(s, n) & mask;
        for (uint32_t id; (id = tr->tmap[h]) != UINT32_MAX; h = (h + 1) & mask)
            if (tr->toff[id + 1] - tr->toff[id] == n && memcmp(tr->tblob + tr->toff[id], s, n) == 0)
                return id;
    }
    if (tr->n_tok + 1 >= tr->tok_cap) {
        tr->tok_cap = tr->tok_cap ? tr->tok_cap * 2 : 1024;
        tr->toff = xrealloc(tr->toff, (tr->tok_cap + 1) * sizeof *tr->toff);
    }
    if (tr->tblob_n + n > tr->tblob_cap) {
        tr->tblob_cap = (tr->tblob_n + n) * 2 + 4096;
        tr->tblob = xrealloc(tr->tblob, tr->tblob_cap);
    }
    if (tr->n_tok == 0) tr->toff[0] = 0;
    memcpy(tr->tblob + tr->tblob_n, s, n);
    tr->tblob_n += n;
    uint32_t id = (uint32_t)tr->n_tok++;
    tr->toff[id + 1] = tr->tblob_n;
    if (tr->n_tok * 2 > tr->tmap_cap)
        tok_map_grow(tr);
    else
        tok_map_insert(tr, id);
    return id;
}

/* ---- pairs and heap */

static Pair *pair_slot(BpeTrainer *tr, uint64_t key);

static void pairs_grow(BpeTrainer *tr) {
    Pair *old = tr->pairs;
    size_t old_cap = tr->pairs_cap;
    tr->pairs_cap = old_cap ? old_cap * 2 : 1 << 16;
    tr->pairs = xcalloc(tr->pairs_cap, sizeof *tr->pairs);
    for (size_t i = 0; i < tr->pairs_cap; i++)
        tr->pairs[i].key = UINT64_MAX;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].key == UINT64_MAX) continue;
        size_t mask = tr->pairs_cap - 1, h = mix64(old[i].key) & mask;
        while (tr->pairs[h].key != UINT64_MAX)
            h = (h + 1) & mask;
        tr->pairs[h] = old[i];
    }
    free(old);
}

static Pair *pair_slot(BpeTrainer *tr, uint64_t key) {
    if ((tr->n_pairs + 1) * 2 > tr->pairs_cap) pairs_grow(tr);
    size_t mask = tr->pairs_cap - 1, h = mix64(key) & mask;
    while (tr->pairs[h].key != UINT64_MAX && tr->pairs[h].key != key)
        h = (h + 1) & mask;
    if (tr->pairs[h].key == UINT64_MAX) {
        tr->pairs[h].key = key;
        tr->n_pairs++;
    }
    return &tr->pairs[h];
}

static int heap_less(const HeapItem *a, const HeapItem *b) {
    /* Max-heap on count, then the smaller pair first. */
    return a->count != b->count ? a->count > b->count : a->key < b->key;
}

static void heap_push(BpeTrainer *tr, int64_t count, uint64_t key) {
    if (tr->heap_n == tr->heap_cap) {
        tr->heap_cap = tr->heap_cap ? tr->heap_cap * 2 : 1 << 16;
        tr->heap = xrealloc(tr->heap, tr->heap_cap * sizeof *tr->heap);
    }
    HeapItem it = {count, key};
    size_t i = tr->heap_n++;
    while (i > 0 && heap_less(&it, &tr->heap[(i - 1) / 2])) {
        tr->heap[i] = tr->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    tr->heap[i] = it;
}

static HeapItem heap_pop(BpeTrainer *tr) {
    HeapItem top = tr->heap[0], last = tr->heap[--tr->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= tr->heap_n) break;
        if (c + 1 < tr->heap_n && heap_less(&tr->heap[c + 1], &tr->heap[c])) c++;
        if (!heap_less(&tr->heap[c], &last)) break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    if (tr->heap_n > 0) tr->heap[i] = last;
    return top;
}

/* Adds delta occurrences of (a, b); with delta > 0 the word joins the pair's list. Pairs are
 * re-pushed on the heap once per step, through `touched`. */
static void pair_add(BpeTrainer *tr, uint32_t a, uint32_t b, int64_t delta, uint32_t word,
                     uint64_t **touched, size_t *n_touched, size_t *cap_touched, uint32_t step) {
    Pair *p = pair_slot(tr, (uint64_t)a << 32 | b);
    p->count += delta;
    if (delta > 0 && (p->n_words == 0 || p->words[p->n_words - 1] != word)) {
        if (p->n_words == p->cap_words) {
            p->cap_words = p->cap_words ? p->cap_words * 2 : 4;
            p->words = xrealloc(p->words, p->cap_words * sizeof *p->words);
        }
        p->words[p->n_words++] = word;
    }
    if (p->touched != step) {
        p->touched = step;
        if (*n_touched == *cap_touched) {
            *cap_touched = *cap_touched ? *cap_touched * 2 : 1024;
            *touched = xrealloc(*touched, *cap_touched * sizeof **touched);
        }
        (*touched)[(*n_touched)++] = p->key;
    }
}

static void train(BpeTrainer *tr) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok_intern(tr, &c, 1);
    }
    tr->words = xcalloc(tr->n_words + 1, sizeof *tr->words);
    uint64_t *touched = NULL;
    size_t n_touched = 0, cap_touched = 0;
    for (size_t w = 0; w < tr->n_words; w++) {
        Word *wd = &tr->words[w];
        wd->n = (uint32_t)(tr->woff[w + 1] - tr->woff[w]);
        wd->sym = xmalloc((wd->n + 1) * sizeof *wd->sym);
        wd->count = tr->wcount[w];
        for (uint32_t i = 0; i < wd->n; i++)
            wd->sym[i] = (uint8_t)tr->wblob[tr->woff[w] + i];
        for (uint32_t i = 0; i + 1 < wd->n; i++)
            pair_add(tr, wd->sym[i], wd->sym[i + 1], wd->count, (uint32_t)w, &touched, &n_touched,
                     &cap_touched, 1);
    }
    for (size_t i = 0; i < n_touched; i++)
        heap_push(tr, pair_slot(tr, touched[i])->count, touched[i]);
    size_t target =
        tr->opt.vocab_size > tr->opt.n_special ? tr->opt.vocab_size - tr->opt.n_special : 0;
    tr->merges = xmalloc((target + 1) * sizeof *tr->merges);
    int64_t min_count = tr->opt.min_frequency > 1 ? tr->opt.min_frequency : 1;
    char *cat = NULL;
    size_t cat_cap = 0;
    uint32_t *list = NULL;
    size_t list_cap = 0;
    for (uint32_t step = 2; tr->n_tok < target && tr->heap_n > 0; step++) {
        HeapItem top = heap_pop(tr);
        Pair *p = pair_slot(tr, top.key);
        if (p->count != top.count) continue; /* stale entry */
        if (p->count < min_count) break;
        uint32_t a = (uint32_t)(top.key >> 32), b = (uint32_t)top.key;
        size_t la = tr->toff[a + 1] - tr->toff[a], lb = tr->toff[b + 1] - tr->toff[b];
        if (la + lb > cat_cap) cat = xrealloc(cat, cat_cap = 2 * (la + lb));
        memcpy(cat, tr->tblob + tr->toff[a], la);
        memcpy(cat + la, tr->tblob + tr->toff[b], lb);
        uint32_t id = tok_intern(tr, cat, la + lb);
        tr->merges[tr->n_merges][0] = a;
        tr->merges[tr->n_merges][1] = b;
        tr->n_merges++;
        /* The pair's word list changes while words are rewritten; walk a copy. */
        p = pair_slot(tr, top.key);
        size_t nl = p->n_words;
        if (nl > list_cap) list = xrealloc(list, (list_cap = nl * 2) * sizeof *list);
        memcpy(list, p->words, nl * sizeof *list);
        n_touched = 0;
        for (size_t k = 0; k < nl; k++) {
            Word *wd = &tr->words[list[k]];
            if (wd->mark == step) continue;
            wd->mark = step;
            int has = 0;
            for (uint32_t i = 0; i + 1 < wd->n && !has; i++)
                has = wd->sym[i] == a && wd->sym[i + 1] == b;
            if (!has) continue;
            for (uint32_t i = 0; i + 1 < wd->n; i++)
                pair_add(tr, wd->sym[i], wd->sym[i + 1], -wd->count, list[k], &touched, &n_touched,
                         &cap_touched, step);
            uint32_t o = 0;
            for (uint32_t i = 0; i < wd->n; i++) {
                if (i + 1 < wd->n && wd->sym[i] == a && wd->sym[i + 1] == b) {
                    wd->sym[o++] = id;
                    i++;
                } else {
                    wd->sym[o++] = wd->sym[i];
                }
            }
            wd->n = o;
            for (uint32_t i = 0; i + 1 < wd->n; i++)
                pair_add(tr, wd->sym[i], wd->sym[i + 1], wd->count, list[k], &touched, &n_touched,
                         &cap_touched, step);
        }
        for (size_t i = 0; i < n_touched; i++) {
            Pair *q = pair_slot(tr, touched[i]);
            if (q->count > 0) heap_push(tr, q->count, touched[i]);
        }
    }
    free(cat);
    free(list);
    free(touched);
}

/* ---- output */

/* Byte-level text of a token (GPT-2 alphabet); returns a malloc'd NUL-terminated string. */
static char *byte_level(const char *s, size_t n) {
    char *out = xmalloc(2 * n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int b = (uint8_t)s[i];
        uint32_t cp = (uint32_t)b;
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
            cp = 256u + (uint32_t)(b <= 32 ? b : b <= 160 ? b - 127 + 33 : 67);
        }
        o += (size_t)utf8_encode(out + o, cp);
    }
    out[o] = 0;
    return out;
}

static json_t *bytelevel_obj(void) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 0, "use_regex", 0);
}

static int write_json(const char *dir, const char *name, json_t *j, Err *err) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *path = fs_join(dir, name);
    int rc = fs_write_atomic(path, s, strlen(s), err);
    free(path);
    free(s);
    return rc;
}

const char *const bpe_train_files[BPE_TRAIN_NFILES] = {"tokenizer.json", "tokenizer_config.json"};

int bpe_trainer_finish(BpeTrainer *tr, const char *dir, size_t *n_merges, Err *err) {
    if (tr->opt.vocab_size < 256 + tr->opt.n_special)
        return err_set(err, "vocab size %u is below 256 byte tokens + %zu special tokens",
                       tr->opt.vocab_size, tr->opt.n_special);
    train(tr);
    *n_merges = tr->n_merges;
    json_t *vocab = json_object();
    for (size_t id = 0; id < tr->n_tok; id++) {
        char *s = byte_level(tr->tblob + tr->toff[id], tr->toff[id + 1] - tr->toff[id]);
        json_object_set_new(vocab, s, json_integer((json_int_t)id));
        free(s);
    }
    json_t *merges = json_array();
    for (size_t i = 0; i < tr->n_merges; i++) {
        uint32_t a = tr->merges[i][0], b = tr->merges[i][1];
        char *sa = byte_level(tr->tblob + tr->toff[a], tr->toff[a + 1] - tr->toff[a]);
        char *sb = byte_level(tr->tblob + tr->toff[b], tr->toff[b + 1] - tr->toff[b]);
        json_array_append_new(merges, json_pack("[s, s]", sa, sb));
        free(sa);
        free(sb);
    }
    json_t *added = json_array(), *decoder_map = json_object();
    for (size_t k = 0; k < tr->opt.n_special; k++) {
        json_int_t id = (json_int_t)(tr->n_tok + k);
        json_array_append_new(added,
                              json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content",
                                        tr->special[k], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                        "normalized", 0, "special", 1));
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)id);
        json_object_set_new(decoder_map, key,
                            json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", tr->special[k],
                                      "lstrip", 0, "normalized", 0, "rstrip", 0, "single_word", 0,
                                      "special", 1));
    }
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                              PRETOK_QWEN_PATTERN, "behavior", "Isolated", "invert", 0);
    json_t *tok = json_pack(
        "{s:s, s:n, s:n, s:o, s:{s:s}, s:{s:s, s:[o, o]}, s:o, s:o, s:{s:s, s:n, s:n, s:s, s:s, "
        "s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
        "NFC", "pre_tokenizer", "type", "Sequence", "pretokenizers", split, bytelevel_obj(),
        "post_processor", bytelevel_obj(), "decoder", bytelevel_obj(), "model", "type", "BPE",
        "dropout", "unk_token", "continuing_subword_prefix", "", "end_of_word_suffix", "",
        "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    const char *eos = tr->opt.n_special ? tr->special[0] : NULL;
    json_t *cfg =
        json_pack("{s:b, s:b, s:o, s:n, s:b, s:s?, s:s, s:I, s:s?, s:b, s:s, s:n}", "add_bos_token",
                  0, "add_prefix_space", 0, "added_tokens_decoder", decoder_map, "bos_token",
                  "clean_up_tokenization_spaces", 0, "eos_token", eos, "errors", "replace",
                  "model_max_length", (json_int_t)131072, "pad_token", eos, "split_special_tokens",
                  0, "tokenizer_class", "Qwen2Tokenizer", "unk_token");
    int rc = -1;
    if (!tok || !cfg)
        err_set(err, "internal error: cannot build the tokenizer JSON");
    else if (fs_mkdirs(dir, err) == 0 && write_json(dir, bpe_train_files[0], tok, err) == 0 &&
             write_json(dir, bpe_train_files[1], cfg, err) == 0)
        rc = 0;
    json_decref(tok);
    json_decref(cfg);
    return rc;
}
