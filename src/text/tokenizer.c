/* Loading an HF tokenizer.json (byte-level BPE) and the encode / decode pipeline:
 *   added tokens split out (non-normalized ones on the raw text) -> normalizer per remaining
 *   piece -> normalized added tokens -> pre-tokenizer steps -> BPE per pre-token.
 * Invalid UTF-8 input is first repaired: every maximal invalid subpart becomes U+FFFD, which is
 * what Python's bytes.decode("utf-8", errors="replace") gives before HF ever sees the text
 * (HF's Rust API takes &str, so it never sees invalid UTF-8 at all). */
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/fs.h"
#include "core/json.h"
#include "text/bpe.h"
#include "text/pretok.h"
#include "text/tokjson.h"
#include "text/utf8.h"

typedef struct Added {
    char *content; // matched text (NFC-normalized for normalized tokens)
    size_t len;
    uint32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} Added;

/* One group of added tokens matched in one pass (leftmost, then longest). */
typedef struct AddedSet {
    Added **tok;
    size_t n;
    uint8_t first[256]; // 1 when some token starts with this byte
} AddedSet;

enum { STEP_QWEN, STEP_REGEX, STEP_BYTELEVEL };
typedef struct Step {
    int kind;
    PretokRegex *re; // STEP_REGEX, or STEP_BYTELEVEL with use_regex
    int add_prefix_space;
} Step;

struct Tokenizer {
    char *path;
    uint64_t hash;
    uint32_t n_ids;  // vocab size: max id + 1
    char *tok_blob;  // token strings, back to back
    size_t *tok_off; // (n_ids + 1) offsets; an id without a token has an empty range
    uint8_t *has_tok;
    char *dec_blob; // decoded bytes of each token
    size_t *dec_off;
    uint32_t *map; // open-addressing table over ids: string -> id
    size_t map_cap;
    Bpe bpe;
    int ignore_merges;
    int norm[8]; // utf8proc option sets applied in order
    int n_norm;
    Added *added;
    size_t n_added;
    AddedSet raw_set, norm_set;
    Step steps[8];
    int n_steps;
    int decoder_bytelevel;
};

/* ---- byte-level alphabet (GPT-2): printable bytes stand for themselves, the rest are
 * shifted to U+0100 and up in byte order. */

static uint32_t byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174)) n++;
    return 256u + (uint32_t)n;
}

/* Inverse: byte of a byte-level character, or -1. */
static int char_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    /* The shifted characters U+0100.. stand for bytes 0-32, 127-160 and 173, in order. */
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 32 + 34) return (int)(127 + k - 33);
    return 173;
}

/* ---- string -> id table */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static const char *tok_str(const Tokenizer *t, uint32_t id, size_t *len) {
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_blob + t->tok_off[id];
}

static int64_t map_find(const Tokenizer *t, const char *s, size_t n) {
    size_t mask = t->map_cap - 1, h = hash_bytes(s, n) & mask;
    for (;;) {
        uint32_t id = t->map[h];
        if (id == UINT32_MAX) return -1;
        size_t l;
        const char *ts = tok_str(t, id, &l);
        if (l == n && memcmp(ts, s, n) == 0) return id;
        h = (h + 1) & mask;
    }
}

/* Inserts id under its string; returns the id it displaced (the later one wins, so an added
 * token replaces a vocab entry with the same text, as in HF) or -1. */
static int64_t map_insert(Tokenizer *t, uint32_t id) {
    size_t l;
    const char *s = tok_str(t, id, &l);
    size_t mask = t->map_cap - 1, h = hash_bytes(s, l) & mask;
    while (t->map[h] != UINT32_MAX) {
        size_t l2;
        const char *s2 = tok_str(t, t->map[h], &l2);
        if (l2 == l && memcmp(s, s2, l) == 0) {
            int64_t old = t->map[h];
            t->map[h] = id;
            return old;
        }
        h = (h + 1) & mask;
    }
    t->map[h] = id;
    return -1;
}

/* ---- loading */

static int parse_normalizer(Tokenizer *t, const json_t *n, const char *path, Err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = NULL;
    if (!json_is_object(n) || json_opt_str(n, "type", &type, path, err) != 0 || !type)
        return err_set(err, "%s: normalizer must be an object with a \"type\"", path);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return err_set(err, "%s: normalizer Sequence needs a \"normalizers\" array", path);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) TRY(parse_normalizer(t, v, path, err));
        return 0;
    }
    int opt;
    if (strcmp(type, "NFC") == 0)
        opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (strcmp(type, "NFD") == 0)
        opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (strcmp(type, "NFKC") == 0)
        opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (strcmp(type, "NFKD") == 0)
        opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return err_set(err,
                       "%s: normalizer type \"%s\" is not supported (expected NFC, NFD, NFKC, "
                       "NFKD, Sequence or null)",
                       path, type);
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0]))
        return err_set(err, "%s: too many normalizers (at most 8)", path);
    t->norm[t->n_norm++] = opt;
    return 0;
}

static int add_step(Tokenizer *t, Step s, const char *path, Err *err) {
    if (t->n_steps == (int)(sizeof t->steps / sizeof t->steps[0])) {
        pretok_regex_free(s.re);
        return err_set(err, "%s: too many pre-tokenizers (at most 8)", path);
    }
    t->steps[t->n_steps++] = s;
    return 0;
}

/* Escapes a literal for PCRE2. */
static char *quote_literal(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}", s[i])) out[o++] = '\\';
        out[o++] = s[i];
    }
    out[o] = 0;
    return out;
}

static int parse_pretok(Tokenizer *t, const json_t *p, const char *path, Err *err) {
    const char *type = NULL;
    if (!json_is_object(p) || json_opt_str(p, "type", &type, path, err) != 0 || !type)
        return err_set(err, "%s: pre_tokenizer must be an object with a \"type\"", path);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return err_set(err, "%s: pre_tokenizer Sequence needs a \"pretokenizers\" array", path);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) TRY(parse_pretok(t, v, path, err));
        return 0;
    }
    Step s = {0};
    if (strcmp(type, "ByteLevel") == 0) {
        int use_regex = 1;
        TRY(json_opt_bool(p, "add_prefix_space", &s.add_prefix_space, path, err));
        TRY(json_opt_bool(p, "use_regex", &use_regex, path, err));
        s.kind = STEP_BYTELEVEL;
        if (use_regex && !(s.re = pretok_regex_compile(PRETOK_GPT2_PATTERN, path, err))) return -1;
        return add_step(t, s, path, err);
    }
    if (strcmp(type, "Split") != 0)
        return err_set(err,
                       "%s: pre_tokenizer type \"%s\" is not supported (expected Split, "
                       "ByteLevel or Sequence)",
                       path, type);
    const char *behavior = NULL;
    int invert = 0;
    TRY(json_opt_str(p, "behavior", &behavior, path, err));
    TRY(json_opt_bool(p, "invert", &invert, path, err));
    if (!behavior || strcmp(behavior, "Isolated") != 0 || invert)
        return err_set(err,
                       "%s: pre_tokenizer Split supports behavior \"Isolated\" with invert "
                       "false only (got \"%s\"%s)",
                       path, behavior ? behavior : "(none)", invert ? ", invert true" : "");
    json_t *pat = json_object_get(p, "pattern");
    const char *rx = NULL, *lit = NULL;
    if (json_is_object(pat)) {
        rx = json_string_value(json_object_get(pat, "Regex"));
        lit = json_string_value(json_object_get(pat, "String"));
    }
    if (!rx && !lit)
        return err_set(err,
                       "%s: pre_tokenizer Split needs \"pattern\": {\"Regex\": ...} or "
                       "{\"String\": ...}",
                       path);
    if (rx && strcmp(rx, PRETOK_QWEN_PATTERN) == 0) {
        s.kind = STEP_QWEN;
        return add_step(t, s, path, err);
    }
    char *q = rx ? xstrdup(rx) : quote_literal(lit);
    s.kind = STEP_REGEX;
    s.re = pretok_regex_compile(q, path, err);
    free(q);
    if (!s.re) return -1;
    return add_step(t, s, path, err);
}

static int parse_decoder(Tokenizer *t, const json_t *d, const char *path, Err *err) {
    if (!d || json_is_null(d)) return 0;
    const char *type = NULL;
    if (!json_is_object(d) || json_opt_str(d, "type", &type, path, err) != 0 || !type)
        return err_set(err, "%s: decoder must be an object with a \"type\"", path);
    if (strcmp(type, "ByteLevel") != 0)
        return err_set(err, "%s: decoder type \"%s\" is not supported (expected ByteLevel)", path,
                       type);
    t->decoder_bytelevel = 1;
    return 0;
}

/* Token tables, string map and merges from the flat vocab / merges. */
static int build_model(Tokenizer *t, const TokJson *tj, const char *path, Err *err) {
    /* Ids: vocab and added tokens together decide the table size. */
    uint64_t max_id = 0;
    size_t blob = 0;
    for (size_t k = 0; k < tj->n_vocab; k++) {
        if (tj->vocab[k].id >= (1 << 24))
            return err_set(err, "%s: model.vocab[\"%s\"] must be an id in [0, 2^24)", path,
                           tj->vocab[k].s);
        if ((uint64_t)tj->vocab[k].id > max_id) max_id = (uint64_t)tj->vocab[k].id;
        blob += tj->vocab[k].len;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].id > max_id) max_id = t->added[i].id;
        blob += t->added[i].len;
    }
    t->n_ids = tj->n_vocab + t->n_added > 0 ? (uint32_t)max_id + 1 : 0;
    t->tok_off = xcalloc(t->n_ids + 1, sizeof *t->tok_off);
    t->has_tok = xcalloc(t->n_ids + 1, 1);
    t->tok_blob = xmalloc(blob + 1);
    /* Lengths first, then prefix sums, then copies, so strings sit in id order. */
    size_t *len = xcalloc(t->n_ids + 1, sizeof *len);
    const char **src = xcalloc(t->n_ids + 1, sizeof *src);
    for (size_t k = 0; k < tj->n_vocab; k++) {
        uint32_t id = (uint32_t)tj->vocab[k].id;
        if (t->has_tok[id]) {
            err_set(err, "%s: model.vocab gives id %u to two tokens (\"%s\" and \"%s\")", path, id,
                    src[id], tj->vocab[k].s);
            free(len);
            free(src);
            return -1;
        }
        t->has_tok[id] = 1;
        len[id] = tj->vocab[k].len;
        src[id] = tj->vocab[k].s;
    }
    uint8_t *is_added = xcalloc(t->n_ids + 1, 1), *is_vocab = xcalloc(t->n_ids + 1, 1);
    for (size_t k = 0; k < tj->n_vocab; k++)
        is_vocab[tj->vocab[k].id] = 1;
    for (size_t i = 0; i < t->n_added; i++) {
        uint32_t id = t->added[i].id;
        t->has_tok[id] = 1;
        is_added[id] = 1;
        len[id] = t->added[i].len;
        src[id] = t->added[i].content;
    }
    for (uint32_t id = 0; id < t->n_ids; id++) {
        t->tok_off[id + 1] = t->tok_off[id] + len[id];
        if (len[id]) memcpy(t->tok_blob + t->tok_off[id], src[id], len[id]);
    }
    free(len);
    free(src);
    t->map_cap = 16;
    while (t->map_cap < 2 * (size_t)t->n_ids + 16)
        t->map_cap *= 2;
    t->map = xmalloc(t->map_cap * sizeof *t->map);
    memset(t->map, 0xFF, t->map_cap * sizeof *t->map);
    /* The model's vocabulary first: merges and byte tokens resolve against it alone. (An added
     * token that reuses a vocab id with other text replaces that text, as id_to_token does in
     * HF; merges naming the old text then fail to load.) */
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!is_vocab[id]) continue;
        if (map_insert(t, id) >= 0) {
            size_t l;
            const char *s = tok_str(t, id, &l);
            free(is_added);
            free(is_vocab);
            return err_set(err, "%s: model.vocab has the token \"%.*s\" twice", path, (int)l, s);
        }
    }

    bpe_init(&t->bpe, tj->n_merges);
    for (int b = 0; b < 256; b++) {
        char c[4];
        int n = utf8_encode(c, byte_char(b));
        int64_t id = map_find(t, c, (size_t)n);
        if (id >= 0) t->bpe.byte_id[b] = (uint32_t)id;
    }
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t i = 0; i < tj->n_merges; i++) {
        const TokMerge *m = &tj->merges[i];
        if (m->la + m->lb > cat_cap) cat = xrealloc(cat, cat_cap = 2 * (m->la + m->lb) + 64);
        memcpy(cat, m->a, m->la);
        memcpy(cat + m->la, m->b, m->lb);
        int64_t ia = map_find(t, m->a, m->la), ib = map_find(t, m->b, m->lb),
                im = map_find(t, cat, m->la + m->lb);
        int rc = 0;
        if (ia < 0 || ib < 0 || im < 0)
            rc = err_set(err,
                         "%s: model.merges[%zu] (\"%.*s\" \"%.*s\") refers to a token not in "
                         "model.vocab (\"%.*s\")",
                         path, i, (int)m->la, m->a, (int)m->lb, m->b,
                         ia < 0   ? (int)m->la
                         : ib < 0 ? (int)m->lb
                                  : 16,
                         ia < 0   ? m->a
                         : ib < 0 ? m->b
                                  : "the merged token");
        else if (bpe_add_merge(&t->bpe, (uint32_t)ia, (uint32_t)ib, (uint32_t)im, (uint32_t)i))
            rc = err_set(err, "%s: model.merges[%zu] (\"%.*s\" \"%.*s\") repeats an earlier merge",
                         path, i, (int)m->la, m->a, (int)m->lb, m->b);
        if (rc) {
            free(cat);
            free(is_added);
            free(is_vocab);
            return -1;
        }
    }
    free(cat);
    /* Then added tokens, which win for their text in tokenizer_token_id, as in HF. */
    for (uint32_t id = 0; id < t->n_ids; id++)
        if (is_added[id]) map_insert(t, id);
    free(is_added);
    free(is_vocab);
    return 0;
}

/* Splits a merge entry ("a b" or ["a", "b"]) into its two token strings (pointing into the
 * jansson value). */
static int merge_parts(const json_t *m, TokMerge *out, size_t idx, const char *path, Err *err) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return err_set(err,
                           "%s: model.merges[%zu] \"%s\" is not two tokens split by one "
                           "space",
                           path, idx, s);
        out->a = s;
        out->la = (uint32_t)(sp - s);
        out->b = sp + 1;
        out->lb = (uint32_t)strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        out->a = json_string_value(json_array_get(m, 0));
        out->la = (uint32_t)json_string_length(json_array_get(m, 0));
        out->b = json_string_value(json_array_get(m, 1));
        out->lb = (uint32_t)json_string_length(json_array_get(m, 1));
        return 0;
    }
    return err_set(err, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", path, idx);
}

/* Vocab and merges from the jansson tree (when the fast path declined) into flat arrays. */
static int flatten_model(TokJson *tj, const json_t *vocab, const json_t *merges, const char *path,
                         Err *err) {
    const char *key;
    json_t *v;
    tj->vocab = xmalloc((json_object_size(vocab) + 1) * sizeof *tj->vocab);
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            return err_set(err, "%s: model.vocab[\"%s\"] must be an id in [0, 2^24)", path, key);
        TokVocab *e = &tj->vocab[tj->n_vocab++];
        e->s = key;
        e->len = (uint32_t)strlen(key);
        e->id = json_integer_value(v);
    }
    size_t i;
    json_t *m;
    tj->merges = xmalloc((json_array_size(merges) + 1) * sizeof *tj->merges);
    json_array_foreach(merges, i, m) TRY(merge_parts(m, &tj->merges[tj->n_merges++], i, path, err));
    return 0;
}

static int parse_model(Tokenizer *t, const json_t *model, const TokJson *fast, const char *path,
                       Err *err) {
    if (!json_is_object(model)) return err_set(err, "%s: missing \"model\" object", path);
    const char *type = NULL;
    TRY(json_opt_str(model, "type", &type, path, err));
    if (type && strcmp(type, "BPE") != 0)
        return err_set(err, "%s: model type \"%s\" is not supported (expected BPE)", path, type);
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
        return err_set(err, "%s: model.dropout is not supported (expected null)", path);
    const char *pre = NULL, *suf = NULL;
    TRY(json_opt_str(model, "continuing_subword_prefix", &pre, path, err));
    TRY(json_opt_str(model, "end_of_word_suffix", &suf, path, err));
    if ((pre && *pre) || (suf && *suf))
        return err_set(err,
                       "%s: model.continuing_subword_prefix / end_of_word_suffix are not "
                       "supported for byte-level BPE (expected empty)",
                       path);
    int byte_fallback = 0;
    TRY(json_opt_bool(model, "byte_fallback", &byte_fallback, path, err));
    if (byte_fallback)
        return err_set(err, "%s: model.byte_fallback is not supported (expected false)", path);
    TRY(json_opt_bool(model, "ignore_merges", &t->ignore_merges, path, err));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return err_set(err, "%s: model.vocab must be an object", path);
    if (!json_is_array(merges)) return err_set(err, "%s: model.merges must be an array", path);
    TokJson flat = {0};
    if (!fast) {
        int rc = flatten_model(&flat, vocab, merges, path, err);
        if (rc == 0) rc = build_model(t, &flat, path, err);
        tokjson_free(&flat);
        return rc;
    }
    return build_model(t, fast, path, err);
}

static char *map_one(const char *s, size_t n, int opt, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    if (r < 0) { /* cannot happen on valid UTF-8; keep the text unchanged */
        *out_len = n;
        char *c = xmalloc(n + 1);
        memcpy(c, s, n);
        c[n] = 0;
        return c;
    }
    *out_len = (size_t)r;
    return (char *)dst;
}

/* Applies one utf8proc normalization (options opt) to s[0..n) into a malloc'd copy. HF's
 * normalization tables predate the Unicode 13 composition U+11935 U+11930 -> U+11938, the one
 * place where they and utf8proc disagree (tools/check_nfc_vs_hf.py), so composing forms cut
 * the text between those two characters and normalize the parts on their own. */
static char *normalize_copy(const char *s, size_t n, int opt, size_t *out_len) {
    static const char pair[] = "\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0";
    const char *cut = (opt & UTF8PROC_COMPOSE) ? memmem(s, n, pair, 8) : NULL;
    if (!cut) return map_one(s, n, opt, out_len);
    char *out = NULL;
    size_t len = 0, start = 0;
    while (start < n) {
        cut = memmem(s + start, n - start, pair, 8);
        size_t end = cut ? (size_t)(cut - s) + 4 : n, l;
        char *part = map_one(s + start, end - start, opt, &l);
        out = xrealloc(out, len + l + 1);
        memcpy(out + len, part, l);
        len += l;
        free(part);
        start = end;
    }
    out[len] = 0;
    *out_len = len;
    return out;
}

static int parse_added(Tokenizer *t, const json_t *list, const char *path, Err *err) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return err_set(err, "%s: added_tokens must be an array", path);
    t->added = xcalloc(json_array_size(list) + 1, sizeof *t->added);
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        char what[64];
        snprintf(what, sizeof what, "added_tokens[%zu]", i);
        Added *a = &t->added[t->n_added];
        int64_t id = -1;
        json_t *c = json_object_get(v, "content");
        if (!json_is_object(v) || !json_is_string(c) || json_string_length(c) == 0)
            return err_set(err, "%s: %s needs a non-empty string \"content\"", path, what);
        if (json_req_int(v, "id", &id, path, err) != 0) return err_wrap(err, "%s", what);
        if (id < 0 || id >= (1 << 24))
            return err_set(err, "%s: %s.id must be in [0, 2^24)", path, what);
        a->id = (uint32_t)id;
        a->len = json_string_length(c);
        a->content = xmalloc(a->len + 1);
        memcpy(a->content, json_string_value(c), a->len + 1);
        t->n_added++;
        if (json_opt_bool(v, "special", &a->special, path, err) ||
            json_opt_bool(v, "normalized", &a->normalized, path, err) ||
            json_opt_bool(v, "lstrip", &a->lstrip, path, err) ||
            json_opt_bool(v, "rstrip", &a->rstrip, path, err) ||
            json_opt_bool(v, "single_word", &a->single_word, path, err))
            return err_wrap(err, "%s", what);
        if (utf8_valid_prefix(a->content, a->len) != a->len)
            return err_set(err, "%s: %s.content is not valid UTF-8", path, what);
    }
    return 0;
}

static void build_set(AddedSet *set, Added **tok, size_t n) {
    set->tok = tok;
    set->n = n;
    memset(set->first, 0, sizeof set->first);
    for (size_t i = 0; i < n; i++)
        set->first[(uint8_t)tok[i]->content[0]] = 1;
}

/* Matching content of normalized added tokens is their normalized form. */
static void build_sets(Tokenizer *t) {
    Added **raw = xcalloc(t->n_added + 1, sizeof *raw),
          **nrm = xcalloc(t->n_added + 1, sizeof *nrm);
    size_t nr = 0, nn = 0;
    for (size_t i = 0; i < t->n_added; i++) {
        Added *a = &t->added[i];
        if (a->normalized) {
            for (int k = 0; k < t->n_norm; k++) {
                size_t l;
                char *c = normalize_copy(a->content, a->len, t->norm[k], &l);
                free(a->content);
                a->content = c;
                a->len = l;
            }
            if (a->len) nrm[nn++] = a;
        } else {
            raw[nr++] = a;
        }
    }
    build_set(&t->raw_set, raw, nr);
    build_set(&t->norm_set, nrm, nn);
}

/* Decoded bytes of every id: ByteLevel maps each character back to its byte; a token with a
 * character outside the byte alphabet decodes to its own text (both as HF's decoder). */
static void build_decode(Tokenizer *t) {
    t->dec_off = xcalloc(t->n_ids + 1, sizeof *t->dec_off);
    t->dec_blob = xmalloc(t->tok_off[t->n_ids] + 1);
    size_t o = 0;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        size_t l;
        const char *s = tok_str(t, id, &l);
        size_t start = o;
        int ok = t->decoder_bytelevel;
        for (size_t i = 0; ok && i < l;) {
            int w;
            int b = char_byte(utf8_decode((const uint8_t *)s, i, &w));
            if (b < 0)
                ok = 0;
            else
                t->dec_blob[o++] = (char)b;
            i += (size_t)w;
        }
        if (!ok) {
            o = start;
            if (l) memcpy(t->dec_blob + o, s, l);
            o += l;
        }
        t->dec_off[id + 1] = o;
    }
}

static uint64_t hash_file(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    for (; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    h ^= h >> 33;
    return h * 0xc4ceb9fe1a85ec53ull ^ (h >> 29);
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->path);
    free(t->tok_blob);
    free(t->tok_off);
    free(t->has_tok);
    free(t->dec_blob);
    free(t->dec_off);
    free(t->map);
    bpe_free(&t->bpe);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->raw_set.tok);
    free(t->norm_set.tok);
    for (int i = 0; i < t->n_steps; i++)
        pretok_regex_free(t->steps[i].re);
    free(t);
}

static int load_json(Tokenizer *t, const json_t *root, const TokJson *fast, const char *path,
                     Err *err) {
    if (!json_is_object(root)) return err_set(err, "%s: expected a JSON object", path);
    json_t *model = json_object_get(root, "model");
    if (!model) return err_set(err, "%s: missing \"model\"", path);
    TRY(parse_added(t, json_object_get(root, "added_tokens"), path, err));
    TRY(parse_normalizer(t, json_object_get(root, "normalizer"), path, err));
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!pre || json_is_null(pre))
        return err_set(err, "%s: pre_tokenizer is null; a byte-level BPE needs ByteLevel", path);
    TRY(parse_pretok(t, pre, path, err));
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].kind == STEP_BYTELEVEL && i != t->n_steps - 1)
            return err_set(err, "%s: pre_tokenizer ByteLevel must come last", path);
    if (t->n_steps == 0 || t->steps[t->n_steps - 1].kind != STEP_BYTELEVEL)
        return err_set(err,
                       "%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is "
                       "supported)",
                       path);
    TRY(parse_decoder(t, json_object_get(root, "decoder"), path, err));
    TRY(parse_model(t, model, fast, path, err));
    build_sets(t);
    build_decode(t);
    return 0;
}

static Tokenizer *load_mem(const char *data, size_t len, const char *name, int try_fast, Err *err) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->path = xstrdup(name);
    t->hash = hash_file(data, len);
    TokJson fast;
    int have_fast = try_fast && tokjson_split(&fast, data, len);
    json_t *root = have_fast ? json_load_mem(fast.rest, fast.rest_len, t->path, err)
                             : json_load_mem(data, len, t->path, err);
    if (have_fast && !root) {
        /* jansson reports the error at its place in the original text. */
        tokjson_free(&fast);
        have_fast = 0;
        root = json_load_mem(data, len, t->path, err);
    }
    int rc = root ? load_json(t, root, have_fast ? &fast : NULL, t->path, err) : -1;
    json_decref(root);
    if (have_fast) tokjson_free(&fast);
    if (rc != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

Tokenizer *tokenizer_load_mem(const char *data, size_t len, const char *name, Err *err) {
    return load_mem(data, len, name, 1, err);
}

Tokenizer *tokenizer_load_mem_jansson(const char *data, size_t len, const char *name, Err *err) {
    return load_mem(data, len, name, 0, err);
}

static Tokenizer *tokenizer_load_in(const char *path, Err *err) {
    char *file = fs_is_dir(path) ? fs_join(path, "tokenizer.json") : xstrdup(path);
    char *data;
    size_t len;
    Tokenizer *t = NULL;
    if (fs_read_all(file, &data, &len, err) == 0) {
        t = tokenizer_load_mem(data, len, file, err);
        free(data);
    }
    free(file);
    return t;
}

Tokenizer *tokenizer_load(const char *path, Err *err) {
    size_t scope = err_oom_push("reading the tokenizer %s", path);
    Tokenizer *r = tokenizer_load_in(path, err);
    err_oom_pop(scope);
    return r;
}

const Bpe *tokenizer_bpe(const Tokenizer *t) {
    return &t->bpe;
}
uint32_t tokenizer_vocab_size(const Tokenizer *t) {
    return t->n_ids;
}
int tokenizer_has_id(const Tokenizer *t, uint32_t id) {
    return id < t->n_ids && t->has_tok[id];
}
uint64_t tokenizer_hash(const Tokenizer *t) {
    return t->hash;
}
const char *tokenizer_path(const Tokenizer *t) {
    return t->path;
}
int64_t tokenizer_token_id(const Tokenizer *t, const char *token) {
    return map_find(t, token, strlen(token));
}

/* ---- encoding */

typedef struct EncCtx {
    const Tokenizer *t;
    IdVec *out;
    Err *err;
    int step;
} EncCtx;

static int run_steps(const Tokenizer *t, int step, const char *s, size_t n, IdVec *out, Err *err);

static int step_piece(void *vctx, const char *s, size_t n) {
    EncCtx *c = vctx;
    return run_steps(c->t, c->step, s, n, c->out, c->err);
}

static void bpe_piece(const Tokenizer *t, const char *s, size_t n, IdVec *out) {
    if (t->ignore_merges) {
        /* The whole pre-token as a vocabulary entry skips the merges. */
        char buf[128]; /* byte-level characters take at most 2 bytes */
        if (n <= sizeof buf / 2) {
            size_t o = 0;
            for (size_t i = 0; i < n; i++)
                o += (size_t)utf8_encode(buf + o, byte_char((uint8_t)s[i]));
            int64_t id = map_find(t, buf, o);
            if (id >= 0) {
                idvec_push(out, (uint32_t)id);
                return;
            }
        }
    }
    bpe_encode_word(&t->bpe, (const uint8_t *)s, n, out);
}

static int run_steps(const Tokenizer *t, int step, const char *s, size_t n, IdVec *out, Err *err) {
    if (n == 0) return 0;
    if (step == t->n_steps) {
        bpe_piece(t, s, n, out);
        return 0;
    }
    const Step *st = &t->steps[step];
    EncCtx c = {t, out, err, step + 1};
    if (st->kind == STEP_QWEN) return pretok_qwen(s, n, step_piece, &c);
    if (st->kind == STEP_REGEX) return pretok_regex_split(st->re, s, n, step_piece, &c, err);
    /* ByteLevel: optional prefix space, optional GPT-2 split; bytes go to BPE as they are. */
    char *tmp = NULL;
    if (st->add_prefix_space && s[0] != ' ') {
        tmp = xmalloc(n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, s, n);
        s = tmp;
        n++;
    }
    int rc = st->re ? pretok_regex_split(st->re, s, n, step_piece, &c, err)
                    : run_steps(t, step + 1, s, n, out, err);
    free(tmp);
    return rc;
}

/* A word character for single_word, as the \w of Rust's regex crate that HF uses:
 * Alphabetic, marks, connector punctuation, decimal digits and the joiners. Alphabetic is
 * letters, letter numbers and Other_Alphabetic, whose members outside the marks are the
 * circled and squared Latin letters listed here. */
static int is_word_char(uint32_t cp) {
    if (cp < 0x80)
        return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
        (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
        (cp >= 0x1F170 && cp <= 0x1F189))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* Start of the code point that ends at s[end) (end > 0). */
static size_t prev_char(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

typedef int (*GapFn)(const Tokenizer *t, const char *s, size_t n, IdVec *out, Err *err);

/* Splits out the tokens of `set` (leftmost, then longest), honouring single_word, lstrip and
 * rstrip the way HF's AddedVocabulary does; gaps go to `gap`. */
static int split_added(const Tokenizer *t, const AddedSet *set, const char *s, size_t n, GapFn gap,
                       IdVec *out, Err *err) {
    if (set->n == 0) return gap(t, s, n, out, err);
    size_t pos = 0, start_off = 0;
    while (pos < n) {
        const Added *best = NULL;
        size_t at = pos;
        for (; at < n; at++) {
            if (!set->first[(uint8_t)s[at]]) continue;
            for (size_t k = 0; k < set->n; k++) {
                const Added *a = set->tok[k];
                if (a->len <= n - at && memcmp(s + at, a->content, a->len) == 0 &&
                    (!best || a->len > best->len))
                    best = a;
            }
            if (best) break;
        }
        if (!best) break;
        size_t start = at, stop = at + best->len;
        pos = stop;
        if (best->single_word) {
            int w;
            int left_word =
                start > 0 && is_word_char(utf8_decode((const uint8_t *)s, prev_char(s, start), &w));
            int right_word = stop < n && is_word_char(utf8_decode((const uint8_t *)s, stop, &w));
            if (left_word || right_word) continue;
        }
        if (best->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = prev_char(s, ns);
                int w;
                if (!utf8_is_space(utf8_decode((const uint8_t *)s, p, &w))) break;
                ns = p;
            }
            start = ns > start_off ? ns : start_off;
        }
        if (best->rstrip) {
            int w;
            while (stop < n && utf8_is_space(utf8_decode((const uint8_t *)s, stop, &w)))
                stop += (size_t)w;
        }
        if (start > start_off) TRY(gap(t, s + start_off, start - start_off, out, err));
        idvec_push(out, best->id);
        start_off = stop;
    }
    if (start_off < n) TRY(gap(t, s + start_off, n - start_off, out, err));
    return 0;
}

static int pretok_gap(const Tokenizer *t, const char *s, size_t n, IdVec *out, Err *err) {
    return run_steps(t, 0, s, n, out, err);
}

/* 1 when every normalizer leaves s unchanged: each code point is ASCII, or has combining
 * class 0, no decomposition and no part in any canonical composition (then it is NFC, NFD,
 * NFKC and NFKD quick-check "yes" and nothing can reorder). Hangul is composed by rule, not by
 * table, so it always takes the full pass. */
static int norm_is_identity(const char *str, size_t n) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int w;
        uint32_t cp = utf8_decode(s, i, &w);
        if ((cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xAC00 && cp <= 0xD7A3)) return 0;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->combining_class != 0 || p->decomp_seqindex != UINT16_MAX ||
            p->comb_index != UINT16_MAX)
            return 0;
        i += (size_t)w;
    }
    return 1;
}

static int normalize_gap(const Tokenizer *t, const char *s, size_t n, IdVec *out, Err *err) {
    if (t->n_norm == 0 || norm_is_identity(s, n))
        return split_added(t, &t->norm_set, s, n, pretok_gap, out, err);
    char *cur = NULL;
    size_t len = n;
    for (int k = 0; k < t->n_norm; k++) {
        size_t l;
        char *next = normalize_copy(cur ? cur : s, len, t->norm[k], &l);
        free(cur);
        cur = next;
        len = l;
    }
    int rc = split_added(t, &t->norm_set, cur, len, pretok_gap, out, err);
    free(cur);
    return rc;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out, Err *err) {
    char *fixed = NULL;
    if (utf8_valid_prefix(text, len) != len) {
        fixed = utf8_repair(text, len, &len);
        text = fixed;
    }
    int rc = split_added(t, &t->raw_set, text, len, normalize_gap, out, err);
    free(fixed);
    return rc;
}

int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, char **text, size_t *len,
                     Err *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->n_ids || !t->has_tok[ids[i]])
            return err_set(err, "token id %u at position %zu is not in the vocabulary of %s",
                           ids[i], i, t->path);
        total += t->dec_off[ids[i] + 1] - t->dec_off[ids[i]] + (t->decoder_bytelevel ? 0 : 1);
    }
    char *raw = xmalloc(total + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        /* Without a decoder HF joins the tokens with spaces. */
        if (!t->decoder_bytelevel && i > 0) raw[o++] = ' ';
        size_t l = t->dec_off[ids[i] + 1] - t->dec_off[ids[i]];
        if (l) memcpy(raw + o, t->dec_blob + t->dec_off[ids[i]], l); /* no blob when all are "" */
        o += l;
    }
    raw[o] = 0;
    if (utf8_valid_prefix(raw, o) == o) {
        *text = raw;
        *len = o;
        return 0;
    }
    *text = utf8_repair(raw, o, len);
    free(raw);
    return 0;
}

void decode_stream_init(DecodeStream *s, size_t reserve) {
    memset(s, 0, sizeof *s);
    s->cap = reserve + 1;
    s->text = xmalloc(s->cap);
    s->text[0] = 0;
    s->raw_cap = 16;
    s->raw = xmalloc(s->raw_cap);
}

/* Grows *buf (capacity *cap) to hold need bytes, at least doubling. */
static void grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap * 2 > need ? *cap * 2 : need;
    *buf = xrealloc(*buf, c);
    *cap = c;
}

int decode_stream_push(DecodeStream *s, const Tokenizer *t, uint32_t id, Err *err) {
    if (id >= t->n_ids || !t->has_tok[id])
        return err_set(err, "token id %u at position %zu is not in the vocabulary of %s", id, s->n,
                       t->path);
    size_t l = t->dec_off[id + 1] - t->dec_off[id];
    grow(&s->raw, &s->raw_cap, s->raw_len + l + 1);
    /* Without a decoder HF joins the tokens with spaces. */
    if (!t->decoder_bytelevel && s->n > 0) s->raw[s->raw_len++] = ' ';
    if (l) memcpy(s->raw + s->raw_len, t->dec_blob + t->dec_off[id], l);
    s->raw_len += l;
    s->n++;
    /* Redo the text from the first byte that could change. */
    grow(&s->text, &s->cap, s->final + 3 * s->raw_len + 1);
    size_t used, used_out;
    s->len = s->final + utf8_repair_into(s->raw, s->raw_len, s->text + s->final, &used, &used_out);
    s->text[s->len] = 0;
    s->final += used_out;
    memmove(s->raw, s->raw + used, s->raw_len - used);
    s->raw_len -= used;
    return 0;
}

void decode_stream_free(DecodeStream *s) {
    free(s->text), free(s->raw);
    memset(s, 0, sizeof *s);
}
