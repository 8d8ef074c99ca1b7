/* Training data: source discovery, tokenization into the .qtds cache, the shuffled packed
 * stream and its per-rank rows. The rules are in dataset.h and docs/data.md. */
#include "text/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/strutil.h"
#include "core/zread.h"
#include "text/jsonl.h"
#include "text/parquet.h"

/* Cache file layout (little-endian): this header, ids u32[n_tokens] at ids_offset, zero
 * padding to 8 bytes, offsets u64[n_docs + 1] at offsets_offset, nothing after. */
#define QTDS_MAGIC "QTITANDS"
#define QTDS_VERSION 1u
#define QTDS_HEADER_SIZE 128u

typedef struct CacheHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t key;          /* hash of the sources, the encoder and the version */
    uint64_t encoder_hash; /* tokenizer hash */
    uint32_t eos_id;
    uint32_t vocab_size;
    uint64_t n_docs;
    uint64_t n_tokens;
    uint64_t n_skipped;
    uint64_t n_files;
    uint64_t ids_offset;
    uint64_t offsets_offset;
    uint64_t file_size;
    uint64_t payload_hash; /* payload_hash() of everything after the header */
    uint8_t reserved[16];
    uint64_t header_hash; /* FNV-1a of the 120 bytes before it */
} CacheHeader;
_Static_assert(sizeof(CacheHeader) == QTDS_HEADER_SIZE, "cache header is 128 bytes");

/* The order of one epoch: perm[k] is the k-th document; start[k] its first stream offset in the
 * epoch (start[n_docs] == epoch_len). */
struct EpochOrder {
    int64_t epoch;
    int64_t *perm;  /* (n_docs,) */
    int64_t *start; /* (n_docs + 1,) */
};

/* Lines tokenized per parallel round: bounds memory while keeping threads busy. */
#define CHUNK_DOCS 4096
/* The shuffle's rng stream, apart from the streams other users of the seed take. */
#define SHUFFLE_STREAM 0x5348554646000000ull

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ull

void dataset_options_default(DatasetOptions *o) {
    memset(o, 0, sizeof *o);
    o->shuffle = 1;
    o->document_mask = 1;
}

/* ---- sources ---------------------------------------------------------------------------- */

typedef struct SourceList {
    char **paths;
    int64_t n, cap;
} SourceList;

static void sources_add(SourceList *s, const char *path) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->paths = xrealloc(s->paths, (size_t)s->cap * sizeof *s->paths);
    }
    s->paths[s->n++] = xstrdup(path);
}

static void sources_free(SourceList *s) {
    for (int64_t i = 0; i < s->n; i++)
        free(s->paths[i]);
    free(s->paths);
    memset(s, 0, sizeof *s);
}

/* By the name without a .gz / .zst ending: C4 ships as c4-train.00000-of-01024.json.gz. */
static int is_jsonl(const char *path) {
    char *plain = xmalloc(strlen(path) + 1);
    zread_plain_name(path, plain);
    int yes = str_ends_with(plain, ".jsonl") || str_ends_with(plain, ".json");
    free(plain);
    return yes;
}

static int is_data_file(const char *path) {
    char *plain = xmalloc(strlen(path) + 1);
    zread_plain_name(path, plain);
    int yes = is_jsonl(plain) || str_ends_with(plain, ".txt") ||
              (parquet_is_name(path) && !strcmp(plain, path));
    free(plain);
    return yes;
}

static int add_directory(SourceList *s, const char *dir, Err *err) {
    char *pattern = fs_join(dir, "*");
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    free(pattern);
    int64_t before = s->n;
    if (rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat st;
            if (is_data_file(g.gl_pathv[i]) && stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode))
                sources_add(s, g.gl_pathv[i]);
        }
        globfree(&g);
    }
    if (s->n == before)
        return err_set(err,
                       "dataset directory %s holds no .jsonl, .json or .txt files (plain, .gz "
                       "or .zst) and no .parquet files",
                       dir);
    return 0;
}

/* Expands the comma-separated entries into files, in entry order, each glob sorted. */
static int expand_sources(SourceList *s, const char *spec, Err *err) {
    char *copy = xstrdup(spec);
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        size_t n = strlen(tok);
        while (n > 0 && (tok[n - 1] == ' ' || tok[n - 1] == '\t'))
            tok[--n] = 0;
        if (n == 0) continue;
        if (strpbrk(tok, "*?[")) {
            glob_t g;
            int grc = glob(tok, 0, NULL, &g);
            int64_t before = s->n;
            if (grc == 0) {
                for (size_t i = 0; i < g.gl_pathc; i++) {
                    struct stat st;
                    if (stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode))
                        sources_add(s, g.gl_pathv[i]);
                }
                globfree(&g);
            }
            if (s->n == before) rc = err_set(err, "dataset glob '%s' matches no files", tok);
            continue;
        }
        struct stat st;
        if (stat(tok, &st) != 0) {
            rc = errno == ENOENT ? err_set(err, "dataset file %s does not exist", tok)
                                 : err_sys(err, "cannot stat dataset file %s", tok);
        } else if (S_ISDIR(st.st_mode)) {
            rc = add_directory(s, tok, err);
        } else if (!S_ISREG(st.st_mode)) {
            rc = err_set(err, "dataset path %s is not a regular file or directory", tok);
        } else {
            sources_add(s, tok);
        }
    }
    free(copy);
    if (rc == 0 && s->n == 0) rc = err_set(err, "dataset path '%s' names no files", spec);
    return rc;
}

/* The cache key: every input that changes the cache's bytes. mtime and size stand for the
 * content, as in make: hashing terabytes on every start would cost more than tokenizing. */
static int cache_key(const SourceList *s, const DatasetOptions *o, const DatasetEncoder *enc,
                     uint64_t *key, Err *err) {
    uint64_t h = fnv1a(FNV_INIT, QTDS_MAGIC, 8);
    uint32_t v = QTDS_VERSION;
    h = fnv1a(h, &v, sizeof v);
    h = fnv1a(h, &enc->hash, sizeof enc->hash);
    h = fnv1a(h, &enc->eos_id, sizeof enc->eos_id);
    h = fnv1a(h, &enc->vocab_size, sizeof enc->vocab_size);
    int64_t skip = o->skip_bad_lines != 0;
    h = fnv1a(h, &skip, sizeof skip);
    /* Another field is another dataset; the default keeps the keys of caches made before the
     * field could be chosen. */
    if (strcmp(o->text_field, "text")) h = fnv1a(h, o->text_field, strlen(o->text_field) + 1);
    for (int64_t i = 0; i < s->n; i++) {
        struct stat st;
        SYS_CHECK(stat(s->paths[i], &st) == 0, err, "cannot stat dataset file %s", s->paths[i]);
        char real[PATH_MAX];
        const char *name = realpath(s->paths[i], real) ? real : s->paths[i];
        h = fnv1a(h, name, strlen(name) + 1);
        int64_t meta[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                           (int64_t)st.st_mtim.tv_nsec};
        h = fnv1a(h, meta, sizeof meta);
    }
    *key = h;
    return 0;
}

/* ---- cache validation --------------------------------------------------------------------- */

/* A hash of n 64-bit words in four independent lanes, so that it runs at memory speed. Each
 * step is a bijection of the lane state, hence any change of one word changes the result. */
static uint64_t payload_hash(const uint64_t *w, size_t n) {
    const uint64_t P = 0x9e3779b97f4a7c15ull;
    uint64_t h[4] = {1, 2, 3, 4};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) {
            h[j] = (h[j] ^ w[i + j]) * P;
            h[j] ^= h[j] >> 32;
        }
    for (int j = 0; i < n; i++, j++) {
        h[j] = (h[j] ^ w[i]) * P;
        h[j] ^= h[j] >> 32;
    }
    uint64_t r = n;
    for (int j = 0; j < 4; j++) {
        r = (r ^ h[j]) * P;
        r ^= r >> 32;
    }
    return r;
}

static uint64_t header_hash(const CacheHeader *h) {
    return fnv1a(FNV_INIT, h, offsetof(CacheHeader, header_hash));
}

/* Checks a mapped cache against what this open expects; on a mismatch writes the reason. */
static int cache_check(const void *map, size_t size, uint64_t key, const DatasetEncoder *enc,
                       char *why, size_t why_len) {
    if (size < QTDS_HEADER_SIZE) {
        snprintf(why, why_len, "%zu bytes, shorter than the %u-byte header", size,
                 QTDS_HEADER_SIZE);
        return -1;
    }
    CacheHeader h;
    memcpy(&h, map, sizeof h);
    if (memcmp(h.magic, QTDS_MAGIC, 8) != 0) {
        snprintf(why, why_len, "bad magic, not a qtitan dataset cache");
        return -1;
    }
    if (h.version != QTDS_VERSION || h.header_size != QTDS_HEADER_SIZE) {
        snprintf(why, why_len, "format version %u, expected %u", h.version, QTDS_VERSION);
        return -1;
    }
    if (header_hash(&h) != h.header_hash) {
        snprintf(why, why_len, "header checksum mismatch");
        return -1;
    }
    if (h.key != key || h.encoder_hash != enc->hash || h.eos_id != enc->eos_id ||
        h.vocab_size != enc->vocab_size) {
        snprintf(why, why_len, "made for other sources or another tokenizer");
        return -1;
    }
    uint64_t ids_end = QTDS_HEADER_SIZE + 4 * h.n_tokens;
    uint64_t off_at = (ids_end + 7) & ~7ull;
    if (h.n_tokens > (UINT64_MAX / 8) || h.n_docs > (UINT64_MAX / 16) ||
        h.ids_offset != QTDS_HEADER_SIZE || h.offsets_offset != off_at ||
        h.file_size != off_at + 8 * (h.n_docs + 1) || h.file_size != size) {
        snprintf(why, why_len, "size %zu does not match its header (%llu bytes expected)", size,
                 (unsigned long long)h.file_size);
        return -1;
    }
    /* One pass over the payload at open: a cache with a flipped id would otherwise train on
     * wrong tokens without a sign. */
    if (payload_hash((const uint64_t *)((const char *)map + QTDS_HEADER_SIZE),
                     (size - QTDS_HEADER_SIZE) / 8) != h.payload_hash) {
        snprintf(why, why_len, "payload checksum mismatch");
        return -1;
    }
    const uint64_t *off = (const uint64_t *)((const char *)map + off_at);
    if (off[0] != 0 || off[h.n_docs] != h.n_tokens) {
        snprintf(why, why_len, "document offsets do not span the ids");
        return -1;
    }
    for (uint64_t d = 0; d < h.n_docs; d++)
        if (off[d + 1] < off[d]) {
            snprintf(why, why_len, "document offsets decrease at document %llu",
                     (unsigned long long)d);
            return -1;
        }
    return 0;
}

/* Maps path and validates it. 0: usable; 1: absent or unusable (reason logged); -1: error. */
static int cache_try_open(Dataset *ds, const char *path, const DatasetEncoder *enc, Err *err) {
    if (!fs_exists(path)) return 1;
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return err_wrap(err, "dataset cache (remove it)");
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    close(fd);
    if (size && map == MAP_FAILED) return err_sys(err, "cannot map dataset cache %s", path);
    char why[256];
    if (cache_check(map ? map : "", size, ds->key, enc, why, sizeof why) != 0) {
        log_warn("dataset cache %s is unusable (%s); rebuilding it", path, why);
        if (map) munmap(map, size);
        return 1;
    }
    CacheHeader h;
    memcpy(&h, map, sizeof h);
    ds->map = map;
    ds->map_len = size;
    ds->n_docs = (int64_t)h.n_docs;
    ds->n_tokens = (int64_t)h.n_tokens;
    ds->n_skipped = (int64_t)h.n_skipped;
    ds->n_files = (int64_t)h.n_files;
    ds->content_hash = h.payload_hash;
    ds->ids = (const uint32_t *)((const char *)map + h.ids_offset);
    ds->offsets = (const uint64_t *)((const char *)map + h.offsets_offset);
    return 0;
}

/* ---- cache building ----------------------------------------------------------------------- */

typedef struct Writer {
    int fd;
    const char *path;
    char *buf;
    size_t n, cap;
    uint64_t written;
} Writer;

static int write_all(int fd, const void *data, size_t len, const char *path, Err *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        SYS_CHECK(w > 0, err, "cannot write dataset cache %s", path);
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int writer_put(Writer *w, const void *data, size_t len, Err *err) {
    if (w->n + len > w->cap) {
        TRY(write_all(w->fd, w->buf, w->n, w->path, err));
        w->n = 0;
    }
    if (len > w->cap) {
        TRY(write_all(w->fd, data, len, w->path, err));
    } else {
        memcpy(w->buf + w->n, data, len);
        w->n += len;
    }
    w->written += len;
    return 0;
}

static int writer_flush(Writer *w, Err *err) {
    TRY(write_all(w->fd, w->buf, w->n, w->path, err));
    w->n = 0;
    return 0;
}

/* One document to tokenize: its text span in a mapped source and, after the parallel round,
 * its ids or the reason it failed. */
typedef struct Slot {
    const char *line;
    size_t len;
    int64_t lineno;
    IdVec ids;
    int status; /* 0 ok, 1 bad JSONL line (skippable), 2 fatal, 3 empty text (dropped) */
    char *msg;
} Slot;

typedef struct Build {
    const DatasetEncoder *enc;
    const DatasetOptions *opt;
    Writer w;
    uint64_t *offsets; /* (n_docs + 1,) */
    int64_t n_docs, cap_docs;
    uint64_t n_tokens;
    int64_t n_skipped;
    char first_skip[512];
    Progress prog;       /* over the source files' bytes (compressed bytes for .gz / .zst) */
    double bytes_before; /* of the files already tokenized */
} Build;

static void tokenize_slot(Slot *s, const char *file, int jsonl, const char *field,
                          const DatasetEncoder *enc) {
    Err e;
    char *text = NULL;
    size_t tl;
    if (jsonl) {
        if (jsonl_parse_text(s->line, s->len, field, file, s->lineno, &text, &tl, &e) != 0) {
            s->status = 1;
            s->msg = xstrdup(e.msg);
            return;
        }
    }
    const char *t = jsonl ? text : s->line;
    size_t n = jsonl ? tl : s->len;
    size_t scope = jsonl ? err_oom_push("tokenizing %s:%lld (%zu bytes of text)", file,
                                        (long long)s->lineno, n)
                         : err_oom_push("tokenizing %s (%zu bytes)", file, n);
    if (n == 0) {
        s->status = 3;
    } else if (enc->encode(enc->ctx, t, n, &s->ids, &e) != 0) {
        s->status = 2;
        if (jsonl) {
            char buf[sizeof e.msg];
            snprintf(buf, sizeof buf, "%s:%lld: %s", file, (long long)s->lineno, e.msg);
            s->msg = xstrdup(buf);
        } else {
            char buf[sizeof e.msg];
            snprintf(buf, sizeof buf, "%s: %s", file, e.msg);
            s->msg = xstrdup(buf);
        }
    } else {
        for (size_t i = 0; i < s->ids.n; i++)
            if (s->ids.ids[i] >= enc->vocab_size) {
                char buf[256];
                snprintf(buf, sizeof buf,
                         "%s: the tokenizer produced id %u, not below its vocab size %u", file,
                         s->ids.ids[i], enc->vocab_size);
                s->status = 2;
                s->msg = xstrdup(buf);
                break;
            }
    }
    free(text);
    err_oom_pop(scope);
}

/* Tokenizes slots in parallel, then appends them in order: the bytes do not depend on the
 * thread count. */
static int flush_slots(Build *b, Slot *slots, int64_t n, const char *file, int jsonl, Err *err) {
    int nt = b->opt->threads > 0 ? b->opt->threads : omp_get_max_threads();
    if (n < 2) nt = 1;
    const DatasetEncoder *enc = b->enc;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        tokenize_slot(&slots[i], file, jsonl, b->opt->text_field, enc);
    int rc = 0;
    for (int64_t i = 0; i < n; i++) {
        Slot *s = &slots[i];
        if (rc == 0) {
            if (s->status == 2 || (s->status == 1 && !b->opt->skip_bad_lines)) {
                rc = err_set(err, "%s", s->msg);
            } else if (s->status == 1) {
                if (b->n_skipped++ == 0)
                    snprintf(b->first_skip, sizeof b->first_skip, "%s", s->msg);
            } else if (s->status == 0) {
                rc = writer_put(&b->w, s->ids.ids, s->ids.n * sizeof(uint32_t), err);
                b->n_tokens += s->ids.n;
                if (b->n_docs + 2 > b->cap_docs) {
                    b->cap_docs = b->cap_docs * 2 + 1024;
                    b->offsets = xrealloc(b->offsets, (size_t)b->cap_docs * sizeof(uint64_t));
                }
                b->offsets[++b->n_docs] = b->n_tokens;
            }
        }
        free(s->ids.ids);
        free(s->msg);
        memset(s, 0, sizeof *s);
    }
    return rc;
}

/* Tokenizes the whole lines of buf[*pos, len) in rounds of CHUNK_DOCS; *lineno counts on. */
static int tokenize_lines(Build *b, const char *buf, size_t len, size_t *pos, int64_t *lineno,
                          const char *path, Slot *slots, Err *err) {
    int rc = 0;
    int64_t n = 0;
    const char *line;
    size_t line_len;
    while (rc == 0 && jsonl_next_line(buf, len, pos, &line, &line_len) == 0) {
        ++*lineno;
        if (jsonl_is_blank(line, line_len)) continue;
        slots[n++] = (Slot){.line = line, .len = line_len, .lineno = *lineno};
        if (n == CHUNK_DOCS) {
            rc = flush_slots(b, slots, n, path, 1, err);
            n = 0;
            if (!zread_is_compressed(path))
                progress_update(&b->prog, b->bytes_before + (double)*pos);
        }
    }
    if (rc == 0 && n > 0) rc = flush_slots(b, slots, n, path, 1, err);
    return rc;
}

/* Plain bytes of a compressed file per block: whole lines are tokenized, the partial last one
 * moves to the front; memory is a block plus the longest line, whatever the file's size. */
#define STREAM_BLOCK (4u << 20)

/* A batch of a Parquet column's values (parquet_stream_group): documents, tokenized
 * CHUNK_DOCS at a time as lines are. */
typedef struct ParquetDocs {
    Build *b;
    const char *path;
    Slot *slots;
    int64_t row;
} ParquetDocs;

static int parquet_docs(void *ctx, const ParquetStr *v, int64_t n, Err *err) {
    ParquetDocs *d = ctx;
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < n; i += CHUNK_DOCS) {
        int64_t k = n - i < CHUNK_DOCS ? n - i : CHUNK_DOCS;
        for (int64_t j = 0; j < k; j++)
            d->slots[j] = (Slot){.line = v[i + j].p, .len = v[i + j].n, .lineno = ++d->row};
        rc = flush_slots(d->b, d->slots, k, d->path, 0, err);
    }
    return rc;
}

static void parquet_progress(void *ctx, int64_t end) {
    Build *b = ((ParquetDocs *)ctx)->b;
    progress_update(&b->prog, b->bytes_before + (double)end);
}

/* The text column of a Parquet file (text/parquet.h), row group by row group, each non-null
 * value a document, streamed a batch of pages at a time. */
static int tokenize_parquet(Build *b, const char *path, const char *map, size_t size, Slot *slots,
                            Err *err) {
    ParquetDocs docs = {b, path, slots, 0};
    return parquet_stream_column(map, size, path, b->opt->text_field, parquet_docs,
                                 parquet_progress, &docs, err);
}

static int tokenize_compressed(Build *b, const char *path, Slot *slots, Err *err) {
    char *plain = xmalloc(strlen(path) + 1);
    zread_plain_name(path, plain);
    int parquet = parquet_is_name(plain);
    free(plain);
    if (parquet)
        return err_set(err,
                       "%s: a compressed Parquet file; Parquet compresses its own pages, so "
                       "decompress the file first",
                       path);
    if (!is_jsonl(path)) {
        char *text;
        size_t len;
        TRY(zread_all(path, &text, &len, err));
        slots[0].line = text;
        slots[0].len = len;
        int rc = len ? flush_slots(b, slots, 1, path, 0, err) : 0;
        free(text);
        return rc;
    }
    ZRead *z;
    TRY(zread_open(&z, path, err));
    size_t cap = STREAM_BLOCK, have = 0;
    char *buf = xmalloc(cap);
    int64_t lineno = 0;
    int rc = 0, first = 1, eof = 0;
    while (rc == 0 && !eof) {
        if (have == cap) {
            /* One line that fills the block: grow it, up to the cap of a file read whole (a
             * small corrupt or hostile .gz can unpack to one endless line). */
            if (cap >= FS_READ_ALL_MAX) {
                rc = err_set(err, "%s:%lld: a line longer than %zu bytes", path,
                             (long long)lineno + 1, FS_READ_ALL_MAX);
                break;
            }
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        size_t got;
        rc = zread_read(z, buf + have, cap - have, &got, err);
        if (rc != 0) break;
        eof = got == 0;
        have += got;
        if (!eof && have < cap) continue;
        size_t end = have;
        if (!eof) {
            while (end > 0 && buf[end - 1] != '\n')
                end--;
            if (end == 0) continue; /* one line longer than the block: grow it */
        }
        size_t pos = first ? jsonl_bom_len(buf, end) : 0;
        first = 0;
        rc = tokenize_lines(b, buf, end, &pos, &lineno, path, slots, err);
        progress_update(&b->prog, b->bytes_before + (double)zread_in_offset(z));
        memmove(buf, buf + end, have - end);
        have -= end;
    }
    free(buf);
    zread_close(z);
    return rc;
}

static int tokenize_file(Build *b, const char *path, Slot *slots, Err *err) {
    if (zread_is_compressed(path)) return tokenize_compressed(b, path, slots, err);
    const char *map;
    size_t size;
    TRY(fs_map_read(path, &map, &size, err));
    /* An empty Parquet file is still read, to be refused; an empty text file holds nothing. */
    if (size == 0 && !parquet_is_name(path)) return 0;
    int rc = 0;
    if (parquet_is_name(path)) {
        rc = tokenize_parquet(b, path, map, size, slots, err);
    } else if (!is_jsonl(path)) {
        slots[0].line = map;
        slots[0].len = size;
        rc = flush_slots(b, slots, 1, path, 0, err);
    } else {
        size_t pos = jsonl_bom_len(map, size);
        int64_t lineno = 0;
        rc = tokenize_lines(b, map, size, &pos, &lineno, path, slots, err);
    }
    fs_unmap(map, size);
    return rc;
}

static int cache_build(Dataset *ds, const SourceList *src, const DatasetEncoder *enc, Err *err) {
    char *tmp = fs_tmp_name(ds->cache_path);
    Build b = {.enc = enc, .opt = &ds->opt};
    b.w.fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (b.w.fd < 0) {
        err_sys(err, "cannot create dataset cache %s", tmp);
        free(tmp);
        return -1;
    }
    b.w.path = tmp;
    b.w.cap = 1 << 20;
    b.w.buf = xmalloc(b.w.cap);
    b.cap_docs = 1024;
    b.offsets = xmalloc((size_t)b.cap_docs * sizeof(uint64_t));
    b.offsets[0] = 0;
    Slot *slots = xcalloc(CHUNK_DOCS, sizeof *slots);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    CacheHeader h;
    memset(&h, 0, sizeof h);
    int rc = writer_put(&b.w, &h, sizeof h, err);
    double total = 0;
    for (int64_t i = 0; i < src->n; i++) {
        struct stat fst;
        if (stat(src->paths[i], &fst) == 0) total += (double)fst.st_size;
    }
    char what[160];
    snprintf(what, sizeof what, "tokenizing %s", ds->opt.path);
    progress_start(&b.prog, what, total, "MB", 1e6);
    for (int64_t i = 0; rc == 0 && i < src->n; i++) {
        rc = tokenize_file(&b, src->paths[i], slots, err);
        struct stat fst;
        if (stat(src->paths[i], &fst) == 0) b.bytes_before += (double)fst.st_size;
        progress_update(&b.prog, b.bytes_before);
    }
    progress_finish(&b.prog);
    if (rc == 0 && b.n_docs == 0) {
        if (b.n_skipped)
            rc = err_set(err,
                         "dataset '%s' holds no documents: all %lld line(s) were bad (the "
                         "first: %s)",
                         ds->opt.path, (long long)b.n_skipped, b.first_skip);
        else
            rc = err_set(err, "dataset '%s' holds no documents (%lld file(s), all empty)",
                         ds->opt.path, (long long)src->n);
    }
    if (rc == 0) {
        static const char zeros[8];
        size_t pad = (size_t)((8 - b.w.written % 8) % 8);
        rc = writer_put(&b.w, zeros, pad, err);
    }
    if (rc == 0) {
        memcpy(h.magic, QTDS_MAGIC, 8);
        h.version = QTDS_VERSION;
        h.header_size = QTDS_HEADER_SIZE;
        h.key = ds->key;
        h.encoder_hash = enc->hash;
        h.eos_id = enc->eos_id;
        h.vocab_size = enc->vocab_size;
        h.n_docs = (uint64_t)b.n_docs;
        h.n_tokens = b.n_tokens;
        h.n_skipped = (uint64_t)b.n_skipped;
        h.n_files = (uint64_t)src->n;
        h.ids_offset = QTDS_HEADER_SIZE;
        h.offsets_offset = b.w.written;
        h.file_size = b.w.written + 8 * ((uint64_t)b.n_docs + 1);
        rc = writer_put(&b.w, b.offsets, 8 * ((size_t)b.n_docs + 1), err);
    }
    if (rc == 0) rc = writer_flush(&b.w, err);
    if (rc == 0) {
        /* The payload is hashed from the file as written, read back through a mapping. */
        void *map = mmap(NULL, h.file_size, PROT_READ, MAP_SHARED, b.w.fd, 0);
        if (map == MAP_FAILED) {
            rc = err_sys(err, "cannot map dataset cache %s", tmp);
        } else {
            h.payload_hash = payload_hash((const uint64_t *)((char *)map + QTDS_HEADER_SIZE),
                                          (h.file_size - QTDS_HEADER_SIZE) / 8);
            munmap(map, h.file_size);
            h.header_hash = header_hash(&h);
        }
    }
    if (rc == 0 && pwrite(b.w.fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        rc = err_sys(err, "cannot write dataset cache %s", tmp);
    if (rc == 0 && fsync(b.w.fd) != 0) rc = err_sys(err, "cannot flush dataset cache %s", tmp);
    if (close(b.w.fd) != 0 && rc == 0) rc = err_sys(err, "cannot close dataset cache %s", tmp);
    if (rc == 0 && rename(tmp, ds->cache_path) != 0)
        rc = err_sys(err, "cannot rename %s to %s", tmp, ds->cache_path);
    if (rc == 0) rc = fs_sync_dir(ds->opt.cache_dir, err);
    if (rc != 0) unlink(tmp);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc == 0) {
        if (b.n_skipped)
            log_warn("dataset: skipped %lld bad line(s); the first: %s", (long long)b.n_skipped,
                     b.first_skip);
        log_info("dataset: tokenized %lld document(s), %llu tokens in %.2f s (%.0f tokens/s)",
                 (long long)b.n_docs, (unsigned long long)b.n_tokens, secs,
                 secs > 0 ? (double)b.n_tokens / secs : 0.0);
    }
    free(slots);
    free(b.offsets);
    free(b.w.buf);
    free(tmp);
    return rc;
}

/* ---- open / close ------------------------------------------------------------------------- */

static int dataset_open_in(Dataset *ds, const DatasetOptions *opt, const DatasetEncoder *enc,
                           Err *err) {
    memset(ds, 0, sizeof *ds);
    if (!opt->path || !*opt->path) return err_set(err, "dataset path is empty");
    if (opt->seq_len < 1)
        return err_set(err, "dataset seq_len is %d, expected at least 1", opt->seq_len);
    if (enc->eos_id >= enc->vocab_size)
        return err_set(err, "tokenizer EOS id %u is not below its vocab size %u", enc->eos_id,
                       enc->vocab_size);
    ds->opt = *opt;
    ds->opt.path = xstrdup(opt->path);
    ds->opt.cache_dir =
        opt->cache_dir && *opt->cache_dir ? xstrdup(opt->cache_dir) : fs_cache_dir("datasets");
    ds->opt.text_field = xstrdup(opt->text_field && *opt->text_field ? opt->text_field : "text");
    ds->eos_id = enc->eos_id;
    ds->vocab_size = enc->vocab_size;
    SourceList src = {0};
    int rc = expand_sources(&src, opt->path, err);
    if (rc == 0) rc = cache_key(&src, &ds->opt, enc, &ds->key, err);
    if (rc == 0 && fs_mkdirs(ds->opt.cache_dir, err) != 0)
        rc = err_wrap(err, "dataset cache directory");
    if (rc == 0) {
        char name[32];
        snprintf(name, sizeof name, "%016llx.qtds", (unsigned long long)ds->key);
        ds->cache_path = fs_join(ds->opt.cache_dir, name);
        rc = cache_try_open(ds, ds->cache_path, enc, err);
        if (rc == 0) {
            ds->cache_reused = 1;
        } else if (rc == 1) {
            rc = cache_build(ds, &src, enc, err);
            if (rc == 0) {
                rc = cache_try_open(ds, ds->cache_path, enc, err);
                if (rc == 1)
                    rc = err_set(err, "dataset cache %s was written but does not read back",
                                 ds->cache_path);
            }
        }
    }
    sources_free(&src);
    if (rc != 0) {
        dataset_close(ds);
        return -1;
    }
    ds->epoch_len = ds->n_tokens + ds->n_docs;
    log_info("dataset: %s: %lld file(s), %lld document(s), %lld tokens + %lld EOS, cache %s (%s)",
             ds->opt.path, (long long)ds->n_files, (long long)ds->n_docs, (long long)ds->n_tokens,
             (long long)ds->n_docs, ds->cache_path, ds->cache_reused ? "reused" : "new");
    if (ds->epoch_len < (int64_t)opt->seq_len + 1)
        log_warn("dataset: %s holds %lld tokens per epoch, fewer than one row of seq_len + 1 = "
                 "%d; each row repeats the data",
                 ds->opt.path, (long long)ds->epoch_len, opt->seq_len + 1);
    return 0;
}

int dataset_open(Dataset *ds, const DatasetOptions *opt, const DatasetEncoder *enc, Err *err) {
    size_t scope = err_oom_push("reading the dataset %s", opt->path ? opt->path : "");
    int r = dataset_open_in(ds, opt, enc, err);
    err_oom_pop(scope);
    return r;
}

static void order_free(EpochOrder *o) {
    if (!o) return;
    free(o->perm);
    free(o->start);
    free(o);
}

void dataset_close(Dataset *ds) {
    if (ds->map) munmap(ds->map, ds->map_len);
    free((char *)ds->opt.path);
    free((char *)ds->opt.cache_dir);
    free((char *)ds->opt.text_field);
    free(ds->cache_path);
    order_free(ds->orders[0]);
    order_free(ds->orders[1]);
    memset(ds, 0, sizeof *ds);
}

/* ---- the packed stream -------------------------------------------------------------------- */

static EpochOrder *get_order(Dataset *ds, int64_t epoch) {
    for (int i = 0; i < 2; i++)
        if (ds->orders[i] && ds->orders[i]->epoch == epoch) {
            if (i == 1) {
                EpochOrder *t = ds->orders[0];
                ds->orders[0] = ds->orders[1];
                ds->orders[1] = t;
            }
            return ds->orders[0];
        }
    order_free(ds->orders[1]);
    ds->orders[1] = ds->orders[0];
    EpochOrder *o = xmalloc(sizeof *o);
    int64_t n = ds->n_docs;
    o->epoch = epoch;
    o->perm = xmalloc((size_t)n * sizeof *o->perm);
    o->start = xmalloc((size_t)(n + 1) * sizeof *o->start);
    for (int64_t i = 0; i < n; i++)
        o->perm[i] = i;
    if (ds->opt.shuffle) {
        /* Fisher-Yates from (seed, epoch) alone, so any epoch's order is known without the
         * ones before it. */
        Rng r;
        rng_seed(&r, ds->opt.seed, SHUFFLE_STREAM + (uint64_t)epoch);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
            int64_t t = o->perm[i];
            o->perm[i] = o->perm[j];
            o->perm[j] = t;
        }
    }
    o->start[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t d = o->perm[k];
        o->start[k + 1] = o->start[k] + (int64_t)(ds->offsets[d + 1] - ds->offsets[d]) + 1;
    }
    ds->orders[0] = o;
    return o;
}

/* Reads stream[pos .. pos + n) into ids and marks in is_end (NULL: not wanted) the EOS that
 * close documents. */
static int read_stream(Dataset *ds, int64_t pos, int64_t n, uint32_t *ids, uint8_t *is_end,
                       Err *err) {
    int64_t L = ds->epoch_len, done = 0;
    while (done < n) {
        int64_t epoch = pos / L, off = pos % L;
        EpochOrder *o = get_order(ds, epoch);
        /* The last k with start[k] <= off. */
        int64_t lo = 0, hi = ds->n_docs - 1;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if (o->start[mid] <= off)
                lo = mid;
            else
                hi = mid - 1;
        }
        for (int64_t k = lo; k < ds->n_docs && done < n; k++) {
            int64_t d = o->perm[k];
            const uint32_t *doc = ds->ids + ds->offsets[d];
            int64_t len = (int64_t)(ds->offsets[d + 1] - ds->offsets[d]);
            int64_t within = k == lo ? off - o->start[k] : 0;
            for (; within < len && done < n; within++, done++) {
                uint32_t id = doc[within];
                if (id >= ds->vocab_size)
                    return err_set(err,
                                   "dataset cache %s is damaged: id %u of document %lld is not "
                                   "below the vocab size %u; delete the file to rebuild it",
                                   ds->cache_path, id, (long long)d, ds->vocab_size);
                ids[done] = id;
                if (is_end) is_end[done] = 0;
            }
            if (done < n) {
                ids[done] = ds->eos_id;
                if (is_end) is_end[done] = 1;
                done++;
            }
        }
        pos = (epoch + 1) * L;
    }
    return 0;
}

int dataset_read_stream(Dataset *ds, int64_t pos, int64_t n, uint32_t *ids, Err *err) {
    return read_stream(ds, pos, n, ids, NULL, err);
}

void batch_alloc(Batch *b, int B, int T) {
    b->B = B;
    b->T = T;
    size_t n = (size_t)B * (size_t)T;
    b->tokens = xmalloc(n * sizeof *b->tokens);
    b->targets = xmalloc(n * sizeof *b->targets);
    b->positions = xmalloc(n * sizeof *b->positions);
    b->doc_ids = xmalloc(n * sizeof *b->doc_ids);
}

void batch_free(Batch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->positions);
    free(b->doc_ids);
    memset(b, 0, sizeof *b);
}

int dataset_rows(Dataset *ds, int64_t row, int nrows, Batch *out, Err *err) {
    int T = ds->opt.seq_len;
    if (row < 0 || nrows < 0 || nrows > out->B || out->T != T)
        return err_set(err,
                       "dataset_rows: rows [%lld, +%d) into a (%d, %d) batch, expected "
                       "row >= 0 and a batch of at least that many rows of seq_len %d",
                       (long long)row, nrows, out->B, out->T, T);
    if (row > (INT64_MAX - nrows - 1) / T)
        return err_set(err, "dataset row %lld is past the largest stream position", (long long)row);
    uint32_t *ids = xmalloc(((size_t)T + 1) * sizeof *ids);
    uint8_t *is_end = xmalloc((size_t)T + 1);
    int rc = 0;
    for (int b = 0; b < nrows && rc == 0; b++) {
        rc = read_stream(ds, (row + b) * T, T + 1, ids, is_end, err);
        if (rc != 0) break;
        uint32_t *tok = out->tokens + (size_t)b * T;
        int32_t *tgt = out->targets + (size_t)b * T;
        int32_t *pos = out->positions + (size_t)b * T;
        int32_t *doc = out->doc_ids + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            tok[t] = ids[t];
            tgt[t] = (int32_t)ids[t + 1];
            if (!ds->opt.document_mask) {
                pos[t] = t;
                doc[t] = 0;
            } else if (t == 0) {
                pos[t] = 0;
                doc[t] = 0;
            } else {
                /* The EOS belongs to the document it closes; the next token starts anew. */
                pos[t] = is_end[t - 1] ? 0 : pos[t - 1] + 1;
                doc[t] = doc[t - 1] + is_end[t - 1];
            }
        }
    }
    free(ids);
    free(is_end);
    return rc;
}

/* ---- checkpoint state --------------------------------------------------------------------- */

void dataset_state_save(const Dataset *ds, DatasetState *st) {
    int64_t p = ds->next_row * ds->opt.seq_len;
    st->row = ds->next_row;
    st->epoch = p / ds->epoch_len;
    st->offset = p % ds->epoch_len;
}

int dataset_state_restore(Dataset *ds, const DatasetState *st, Err *err) {
    if (st->row < 0 || st->row > INT64_MAX / ds->opt.seq_len / 2)
        return err_set(err, "checkpoint data position row %lld is out of range",
                       (long long)st->row);
    int64_t p = st->row * ds->opt.seq_len;
    int64_t epoch = p / ds->epoch_len, offset = p % ds->epoch_len;
    if (epoch != st->epoch || offset != st->offset)
        return err_set(err,
                       "checkpoint data position (row %lld = epoch %lld, offset %lld) does "
                       "not fit dataset %s, where row %lld is epoch %lld, offset %lld: the "
                       "data or seq_len changed since the checkpoint",
                       (long long)st->row, (long long)st->epoch, (long long)st->offset,
                       ds->opt.path, (long long)st->row, (long long)epoch, (long long)offset);
    ds->next_row = st->row;
    return 0;
}

json_t *dataset_state_to_json(const DatasetState *st) {
    return json_pack("{s:I, s:I, s:I}", "row", (json_int_t)st->row, "epoch", (json_int_t)st->epoch,
                     "offset", (json_int_t)st->offset);
}

int dataset_state_from_json(const json_t *j, DatasetState *st, const char *what, Err *err) {
    TRY(json_req_int(j, "row", &st->row, what, err));
    TRY(json_req_int(j, "epoch", &st->epoch, what, err));
    TRY(json_req_int(j, "offset", &st->offset, what, err));
    return 0;
}
