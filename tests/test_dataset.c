/* Unit tests for src/text/dataset and jsonl: sources, bad input, the cache (reuse, invalidation,
 * damage), packing against an oracle built here from the documents, shuffling, the per-rank
 * split and the checkpoint state. A byte encoder stands in for the tokenizer: id = byte value,
 * EOS = 256, so every expected id is known from the text alone. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "byte_encode_util.h"
#include "core/fs.h"
#include "core/rng.h"
#include "text/dataset.h"
#include "text/jsonl.h"

#define EOS 256u

typedef struct ByteCtx {
    long calls;
} ByteCtx;

/* byte_encode, counting its calls. */
static int counting_byte_encode(const void *ctx, const char *text, size_t len, IdVec *out,
                                Err *err) {
    (void)err;
#pragma omp atomic
    ((ByteCtx *)ctx)->calls++;
    byte_ids_append(out, text, len);
    return 0;
}

static ByteCtx g_ctx;

static DatasetEncoder byte_encoder(uint64_t hash) {
    DatasetEncoder e = {counting_byte_encode, &g_ctx, hash, EOS, 257};
    return e;
}

static char g_dir[256];

static char *path_in(const char *name) {
    return fs_join(g_dir, name);
}

static void write_file(const char *name, const char *text) {
    char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    free(p);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_dataset_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    Err err;
    fs_remove_tree(g_dir, &err);
    return 0;
}

static DatasetOptions opts(const char *path, int T) {
    static char spec[4096];
    static char cache[512];
    DatasetOptions o;
    dataset_options_default(&o);
    /* Entries are relative to the test directory. */
    spec[0] = 0;
    char *copy = strdup(path), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (spec[0]) strcat(spec, ",");
        strcat(spec, g_dir);
        strcat(spec, "/");
        strcat(spec, t);
    }
    free(copy);
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    o.path = spec;
    o.cache_dir = cache;
    o.seq_len = T;
    o.seed = 1234;
    return o;
}

/* The documents of ds in cache order, as strings of ids compared to the expected texts. */
static void assert_docs(const Dataset *ds, const char *const *texts, int n) {
    assert_int_equal(ds->n_docs, n);
    int64_t total = 0;
    for (int d = 0; d < n; d++) {
        size_t len = strlen(texts[d]);
        assert_int_equal(ds->offsets[d + 1] - ds->offsets[d], len);
        for (size_t i = 0; i < len; i++)
            assert_int_equal(ds->ids[ds->offsets[d] + i], (unsigned char)texts[d][i]);
        total += (int64_t)len;
    }
    assert_int_equal(ds->n_tokens, total);
    assert_int_equal(ds->epoch_len, total + n);
}

static void test_jsonl_text_glob(void **state) {
    (void)state;
    write_file("a.jsonl",
               "{\"text\": \"hello\", \"url\": \"x\"}\n\n{\"text\": \"caf\\u00e9\\n\"}\r\n");
    write_file("c.jsonl", "\xef\xbb\xbf  {\"text\":\"third\"}");
    write_file("b.txt", "plain text\nwith two lines\n");
    write_file("skip.md", "not data");
    DatasetEncoder enc = byte_encoder(1);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("*.jsonl,b.txt", 4);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    const char *want[] = {"hello", "caf\xc3\xa9\n", "third", "plain text\nwith two lines\n"};
    assert_docs(&ds, want, 4);
    assert_int_equal(ds.n_files, 3);
    dataset_close(&ds);
    /* A directory takes its .jsonl/.json/.txt files in name order. */
    o = opts(".", 4);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    const char *want_dir[] = {"hello", "caf\xc3\xa9\n", "plain text\nwith two lines\n", "third"};
    assert_docs(&ds, want_dir, 4);
    dataset_close(&ds);
    /* NUL inside a JSON string is kept: the tokenizer takes (text, len). */
    write_file("nul.jsonl", "{\"text\": \"a\\u0000b\"}\n");
    o = opts("nul.jsonl", 4);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(ds.n_tokens, 3);
    assert_int_equal(ds.ids[1], 0);
    dataset_close(&ds);
}

static void expect_open_error(const char *path, int skip, const char *needle) {
    DatasetEncoder enc = byte_encoder(1);
    Dataset ds;
    Err err = {{0}};
    DatasetOptions o = opts(path, strcmp(needle, "seq_len") == 0 ? 0 : 4);
    o.skip_bad_lines = skip;
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("error \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_bad_input(void **state) {
    (void)state;
    write_file("bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"ok\"\n{\"text\": \"ok\"}\n");
    expect_open_error("bad.jsonl", 0, "bad.jsonl:3: not valid JSON");
    write_file("notext.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
    expect_open_error("notext.jsonl", 0, "notext.jsonl:2: the object has no \"text\" field");
    write_file("num.jsonl", "{\"text\": 5}\n");
    expect_open_error("num.jsonl", 0, "num.jsonl:1: \"text\" must be a string, found a number");
    write_file("arr.jsonl", "[1, 2]\n");
    expect_open_error("arr.jsonl", 0, "arr.jsonl:1: expected a JSON object");
    write_file("empty.jsonl", "");
    write_file("blank.jsonl", "\n  \n\r\n");
    expect_open_error("empty.jsonl,blank.jsonl", 0, "holds no documents (2 file(s), all empty)");
    expect_open_error("missing.jsonl", 0, "missing.jsonl does not exist");
    expect_open_error("nothing*.jsonl", 0, "matches no files");
    write_file("allbad.jsonl", "x\ny\n");
    expect_open_error("allbad.jsonl", 1, "all 2 line(s) were bad (the first: ");
    char *dir = path_in("emptydir");
    mkdir(dir, 0755);
    free(dir);
    expect_open_error("emptydir", 0, "holds no .jsonl, .json or .txt files");
    expect_open_error("bad.jsonl", 0, "seq_len");
}

static void test_skip_bad_lines(void **state) {
    (void)state;
    write_file(
        "mixed.jsonl",
        "{\"text\": \"one\"}\nnot json\n{\"text\": \"two\"}\n{\"t\": 1}\n{\"text\": \"3\"}\n");
    DatasetEncoder enc = byte_encoder(1);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("mixed.jsonl", 4);
    o.skip_bad_lines = 1;
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    const char *want[] = {"one", "two", "3"};
    assert_docs(&ds, want, 3);
    assert_int_equal(ds.n_skipped, 2);
    dataset_close(&ds);
}

static void stat_of(const char *path, struct stat *st) {
    assert_int_equal(stat(path, st), 0);
}

static void test_cache_reuse_and_invalidation(void **state) {
    (void)state;
    write_file("r.jsonl", "{\"text\": \"first doc\"}\n{\"text\": \"second\"}\n");
    DatasetEncoder enc = byte_encoder(7);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("r.jsonl", 4);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(ds.cache_reused, 0);
    char *cache = strdup(ds.cache_path);
    dataset_close(&ds);
    struct stat a, b;
    stat_of(cache, &a);
    long calls = g_ctx.calls;
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(ds.cache_reused, 1);
    assert_string_equal(ds.cache_path, cache);
    assert_int_equal(g_ctx.calls, calls); /* nothing was tokenized */
    const char *want[] = {"first doc", "second"};
    assert_docs(&ds, want, 2);
    dataset_close(&ds);
    stat_of(cache, &b);
    assert_true(a.st_ino == b.st_ino && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
                a.st_mtim.tv_sec == b.st_mtim.tv_sec);
    /* Another tokenizer hash: another cache. */
    DatasetEncoder enc2 = byte_encoder(8);
    assert_int_equal(dataset_open(&ds, &o, &enc2, &err), 0);
    assert_int_equal(ds.cache_reused, 0);
    assert_string_not_equal(ds.cache_path, cache);
    dataset_close(&ds);
    /* A changed source: another cache with the new content. */
    write_file("r.jsonl",
               "{\"text\": \"first doc\"}\n{\"text\": \"second\"}\n{\"text\": \"3rd\"}\n");
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(ds.cache_reused, 0);
    const char *want3[] = {"first doc", "second", "3rd"};
    assert_docs(&ds, want3, 3);
    dataset_close(&ds);
    free(cache);
}

static void corrupt(const char *path, long at, const void *bytes, size_t n) {
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, n, at), (ssize_t)n);
    close(fd);
}

static void reopen_expect_rebuilt(DatasetOptions *o, DatasetEncoder *enc) {
    Dataset ds;
    Err err;
    assert_int_equal(dataset_open(&ds, o, enc, &err), 0);
    assert_int_equal(ds.cache_reused, 0);
    const char *want[] = {"abcdef", "gh"};
    assert_docs(&ds, want, 2);
    dataset_close(&ds);
}

static void test_damaged_cache(void **state) {
    (void)state;
    write_file("dmg.jsonl", "{\"text\": \"abcdef\"}\n{\"text\": \"gh\"}\n");
    DatasetEncoder enc = byte_encoder(9);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("dmg.jsonl", 3);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    char *cache = strdup(ds.cache_path);
    dataset_close(&ds);
    /* Truncated. */
    assert_int_equal(truncate(cache, 100), 0);
    reopen_expect_rebuilt(&o, &enc);
    /* Bad magic. */
    corrupt(cache, 0, "X", 1);
    reopen_expect_rebuilt(&o, &enc);
    /* A header field changed (n_docs), so the header checksum fails. */
    corrupt(cache, 40, "\x05", 1);
    reopen_expect_rebuilt(&o, &enc);
    /* Decreasing document offsets (the last 24 bytes are offsets 0, 6, 8). */
    struct stat st;
    stat_of(cache, &st);
    uint64_t bad = 9;
    corrupt(cache, st.st_size - 16, &bad, 8);
    reopen_expect_rebuilt(&o, &enc);
    /* Extra bytes at the end. */
    int fd = open(cache, O_WRONLY | O_APPEND);
    assert_int_equal(write(fd, "zz", 2), 2);
    close(fd);
    reopen_expect_rebuilt(&o, &enc);
    /* Any one byte changed anywhere (header, ids, padding, offsets) is caught. */
    stat_of(cache, &st);
    for (long at = 0; at < st.st_size; at++) {
        char byte;
        fd = open(cache, O_RDONLY);
        assert_int_equal(pread(fd, &byte, 1, at), 1);
        close(fd);
        byte ^= 0x20;
        corrupt(cache, at, &byte, 1);
        reopen_expect_rebuilt(&o, &enc);
    }
    /* An id out of the vocab written under an open dataset is caught when a row reads it. */
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(ds.cache_reused, 1);
    uint32_t big = 5000;
    corrupt(cache, 128 + 4, &big, 4);
    Batch b;
    batch_alloc(&b, 4, 3);
    assert_int_equal(dataset_rows(&ds, 0, 4, &b, &err), -1);
    assert_non_null(strstr(err.msg, "is damaged"));
    assert_non_null(strstr(err.msg, cache));
    batch_free(&b);
    dataset_close(&ds);
    /* A directory where the cache file goes is named as such (it was "cannot map ...: No such
     * device"), and so is a cache directory that is a file. */
    assert_int_equal(unlink(cache), 0);
    assert_int_equal(mkdir(cache, 0755), 0);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), -1);
    char want[1024];
    snprintf(want, sizeof want, "dataset cache (remove it): %s is a directory, not a regular file",
             cache);
    assert_string_equal(err.msg, want);
    assert_int_equal(rmdir(cache), 0);
    write_file("cache_is_a_file", "x");
    DatasetOptions in_file = o;
    char *file = path_in("cache_is_a_file");
    in_file.cache_dir = file;
    assert_int_equal(dataset_open(&ds, &in_file, &enc, &err), -1);
    snprintf(want, sizeof want, "dataset cache directory: %s exists and is not a directory", file);
    assert_string_equal(err.msg, want);
    free(file);
    free(cache);
}

/* Random documents of 1..maxlen printable bytes, written as JSONL; returns the texts. */
static char **make_corpus(const char *name, int n, int maxlen, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed, 0);
    char **docs = malloc((size_t)n * sizeof *docs);
    char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    free(p);
    for (int d = 0; d < n; d++) {
        int len = 1 + (int)rng_below(&r, (uint64_t)maxlen);
        docs[d] = malloc((size_t)len + 1);
        for (int i = 0; i < len; i++)
            docs[d][i] = (char)('a' + rng_below(&r, 26));
        docs[d][len] = 0;
        fprintf(f, "{\"text\": \"%s\"}\n", docs[d]);
    }
    fclose(f);
    return docs;
}

static void free_corpus(char **docs, int n) {
    for (int d = 0; d < n; d++)
        free(docs[d]);
    free(docs);
}

static void assert_batch_equal(const Batch *a, int arow, const Batch *b, int brow, int n) {
    size_t off_a = (size_t)arow * a->T, off_b = (size_t)brow * b->T, k = (size_t)n * a->T;
    assert_memory_equal(a->tokens + off_a, b->tokens + off_b, k * sizeof *a->tokens);
    assert_memory_equal(a->targets + off_a, b->targets + off_b, k * sizeof *a->targets);
    assert_memory_equal(a->positions + off_a, b->positions + off_b, k * sizeof *a->positions);
    assert_memory_equal(a->doc_ids + off_a, b->doc_ids + off_b, k * sizeof *a->doc_ids);
}

static void read_all(const char *path, char **data, size_t *len) {
    Err err;
    assert_int_equal(fs_read_all(path, data, len, &err), 0);
}

static void test_threads_and_chunks_identical(void **state) {
    (void)state;
    const int n = 5000; /* more than one tokenization round */
    char **docs = make_corpus("big.jsonl", n, 40, 5);
    DatasetEncoder enc = byte_encoder(11);
    Dataset d1, d4;
    Err err;
    DatasetOptions o = opts("big.jsonl", 16);
    o.threads = 1;
    o.cache_dir = path_in("c1");
    assert_int_equal(dataset_open(&d1, &o, &enc, &err), 0);
    assert_docs(&d1, (const char *const *)docs, n);
    free((char *)o.cache_dir);
    o.threads = 4;
    o.cache_dir = path_in("c4");
    assert_int_equal(dataset_open(&d4, &o, &enc, &err), 0);
    free((char *)o.cache_dir);
    char *a, *b;
    size_t la, lb;
    read_all(d1.cache_path, &a, &la);
    read_all(d4.cache_path, &b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    dataset_close(&d1);
    dataset_close(&d4);
    free_corpus(docs, n);
}

/* Packing oracle without shuffle: the stream is the documents in order, each + EOS, repeated.
 * Positions restart at each row and after each EOS; doc ids count EOS seen in the row. */
static void test_packing_oracle(void **state) {
    (void)state;
    const int n = 13, T = 7;
    char **docs = make_corpus("pk.jsonl", n, 9, 6);
    int64_t L = 0;
    for (int d = 0; d < n; d++)
        L += (int64_t)strlen(docs[d]) + 1;
    uint32_t *stream = malloc((size_t)L * sizeof *stream);
    uint8_t *last = malloc((size_t)L);
    int64_t k = 0;
    for (int d = 0; d < n; d++) {
        for (size_t i = 0; docs[d][i]; i++, k++) {
            stream[k] = (unsigned char)docs[d][i];
            last[k] = 0;
        }
        stream[k] = EOS;
        last[k++] = 1;
    }
    DatasetEncoder enc = byte_encoder(12);
    for (int mask = 0; mask < 2; mask++) {
        Dataset ds;
        Err err;
        DatasetOptions o = opts("pk.jsonl", T);
        o.shuffle = 0;
        o.document_mask = mask;
        assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
        const int rows = (int)(3 * L / T) + 2; /* three epochs and a bit */
        Batch b;
        batch_alloc(&b, rows, T);
        assert_int_equal(dataset_rows(&ds, 0, rows, &b, &err), 0);
        for (int g = 0; g < rows; g++) {
            int32_t pos = 0, doc = 0;
            for (int t = 0; t < T; t++) {
                int64_t p = (int64_t)g * T + t;
                if (t > 0 && last[(p - 1) % L]) {
                    pos = 0;
                    doc++;
                } else if (t > 0) {
                    pos++;
                }
                size_t i = (size_t)g * T + t;
                assert_int_equal(b.tokens[i], stream[p % L]);
                assert_int_equal(b.targets[i], (int32_t)stream[(p + 1) % L]);
                assert_int_equal(b.positions[i], mask ? pos : t);
                assert_int_equal(b.doc_ids[i], mask ? doc : 0);
            }
        }
        batch_free(&b);
        dataset_close(&ds);
    }
    free(stream);
    free(last);
    free_corpus(docs, n);
}

/* Splits the stream read through rows back into documents at EOS. */
static void epoch_docs(Dataset *ds, int64_t epoch, char **out, int n) {
    int64_t L = ds->epoch_len, T = ds->opt.seq_len;
    int64_t first = epoch * L / T, last = ((epoch + 1) * L + T - 1) / T;
    Batch b;
    Err err;
    batch_alloc(&b, (int)(last - first), (int)T);
    assert_int_equal(dataset_rows(ds, first, (int)(last - first), &b, &err), 0);
    int64_t skip = epoch * L - first * T;
    int d = 0;
    size_t len = 0;
    char buf[256];
    for (int64_t p = skip; p < skip + L; p++) {
        uint32_t id = b.tokens[p];
        if (id == EOS) {
            buf[len] = 0;
            assert_true(d < n);
            out[d++] = strdup(buf);
            len = 0;
        } else {
            buf[len++] = (char)id;
        }
    }
    assert_int_equal(d, n);
    batch_free(&b);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_shuffle_epochs(void **state) {
    (void)state;
    const int n = 40, T = 16;
    char **docs = make_corpus("sh.jsonl", n, 12, 7);
    DatasetEncoder enc = byte_encoder(13);
    Dataset ds, ds2;
    Err err;
    DatasetOptions o = opts("sh.jsonl", T);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    o.seed = 99;
    assert_int_equal(dataset_open(&ds2, &o, &enc, &err), 0);
    char *e0[40], *e1[40], *e0b[40], *other[40], *sorted[40];
    epoch_docs(&ds, 0, e0, n);
    epoch_docs(&ds, 1, e1, n);
    epoch_docs(&ds, 0, e0b, n);
    epoch_docs(&ds2, 0, other, n);
    int same01 = 1, same_seed = 1, same_input = 1;
    for (int d = 0; d < n; d++) {
        same01 &= strcmp(e0[d], e1[d]) == 0;
        same_seed &= strcmp(e0[d], other[d]) == 0;
        same_input &= strcmp(e0[d], docs[d]) == 0;
        assert_string_equal(e0[d], e0b[d]);
    }
    assert_false(same01);
    assert_false(same_seed);
    assert_false(same_input);
    /* Every epoch holds each document once. */
    char **lists[] = {e0, e1, other};
    memcpy(sorted, docs, sizeof sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    for (int l = 0; l < 3; l++) {
        qsort(lists[l], (size_t)n, sizeof(char *), cmp_str);
        for (int d = 0; d < n; d++)
            assert_string_equal(lists[l][d], sorted[d]);
    }
    for (int d = 0; d < n; d++) {
        free(e0[d]);
        free(e1[d]);
        free(e0b[d]);
        free(other[d]);
    }
    dataset_close(&ds);
    dataset_close(&ds2);
    free_corpus(docs, n);
}

/* Global batch `step` read whole == 2 ranks' halves == 4 ranks' quarters == microbatches, and
 * the same after reopening the dataset. */
static void test_rank_split(void **state) {
    (void)state;
    const int n = 20, T = 8, G = 8;
    char **docs = make_corpus("rk.jsonl", n, 10, 8);
    DatasetEncoder enc = byte_encoder(14);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("rk.jsonl", T);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    Batch whole[12], part;
    batch_alloc(&part, G, T);
    for (int step = 0; step < 12; step++) { /* several epochs */
        batch_alloc(&whole[step], G, T);
        int64_t base = (int64_t)step * G;
        assert_int_equal(dataset_rows(&ds, base, G, &whole[step], &err), 0);
        /* Any run of the step's rows, as a rank's micro-batch reads one (train/data_feed.c
         * says which), is those rows of the whole batch. */
        for (int share = G / 2; share >= 1; share /= 2)
            for (int first = 0; first < G; first += share) {
                assert_int_equal(dataset_rows(&ds, base + first, share, &part, &err), 0);
                assert_batch_equal(&whole[step], first, &part, 0, share);
            }
    }
    /* Rows depend only on (seed, step): a fresh open gives the same batches, in any order. */
    Dataset again;
    assert_int_equal(dataset_open(&again, &o, &enc, &err), 0);
    for (int step = 11; step >= 0; step--) {
        assert_int_equal(dataset_rows(&again, (int64_t)step * G, G, &part, &err), 0);
        assert_batch_equal(&whole[step], 0, &part, 0, G);
        batch_free(&whole[step]);
    }
    batch_free(&part);
    dataset_close(&again);
    dataset_close(&ds);
    free_corpus(docs, n);
}

static void test_state_resume(void **state) {
    (void)state;
    const int n = 30, T = 8, G = 4;
    char **docs = make_corpus("st.jsonl", n, 20, 9);
    DatasetEncoder enc = byte_encoder(15);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("st.jsonl", T);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    Batch b[10], r;
    DatasetState saved = {0};
    for (int step = 0; step < 10; step++) {
        if (step == 6) dataset_state_save(&ds, &saved);
        batch_alloc(&b[step], G, T);
        assert_int_equal(dataset_rows(&ds, ds.next_row, G, &b[step], &err), 0);
        ds.next_row += G;
    }
    dataset_close(&ds);
    assert_int_equal(saved.row, 6 * G);
    json_t *j = dataset_state_to_json(&saved);
    DatasetState back;
    assert_int_equal(dataset_state_from_json(j, &back, "train_state.json", &err), 0);
    json_decref(j);
    assert_memory_equal(&saved, &back, sizeof saved);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    assert_int_equal(dataset_state_restore(&ds, &back, &err), 0);
    batch_alloc(&r, G, T);
    for (int step = 6; step < 10; step++) {
        assert_int_equal(dataset_rows(&ds, ds.next_row, G, &r, &err), 0);
        assert_batch_equal(&b[step], 0, &r, 0, G);
        ds.next_row += G;
    }
    dataset_close(&ds);
    /* Another seq_len: the saved position does not fit and says so. */
    o.seq_len = 5;
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    back.row = 7; /* a row whose epoch/offset differ between seq_len 8 and 5 */
    back.epoch = 0;
    back.offset = 56;
    assert_int_equal(dataset_state_restore(&ds, &back, &err), -1);
    assert_non_null(strstr(err.msg, "changed since the checkpoint"));
    json_t *bad = json_pack("{s:I}", "row", (json_int_t)3);
    assert_int_equal(dataset_state_from_json(bad, &back, "train_state.json", &err), -1);
    assert_non_null(strstr(err.msg, "\"epoch\""));
    json_decref(bad);
    dataset_close(&ds);
    batch_free(&r);
    for (int step = 0; step < 10; step++)
        batch_free(&b[step]);
    free_corpus(docs, n);
}

/* A dataset shorter than one row still packs: rows run through several epochs. */
static void test_tiny_dataset(void **state) {
    (void)state;
    write_file("tiny.txt", "ab");
    DatasetEncoder enc = byte_encoder(16);
    Dataset ds;
    Err err;
    DatasetOptions o = opts("tiny.txt", 8);
    assert_int_equal(dataset_open(&ds, &o, &enc, &err), 0);
    Batch b;
    batch_alloc(&b, 2, 8);
    assert_int_equal(dataset_rows(&ds, 0, 2, &b, &err), 0);
    const uint32_t want[] = {'a', 'b', EOS, 'a', 'b', EOS, 'a', 'b'};
    for (int t = 0; t < 8; t++)
        assert_int_equal(b.tokens[t], want[t]);
    assert_int_equal(b.doc_ids[7], 2);
    assert_int_equal(b.positions[7], 1);
    assert_int_equal(b.tokens[8], EOS); /* row 1 starts at stream position 8 */
    batch_free(&b);
    dataset_close(&ds);
}

static void test_jsonl_lines(void **state) {
    (void)state;
    const char buf[] = "a\r\n\nbc\nlast";
    size_t pos = 0, len;
    const char *line;
    const char *want[] = {"a", "", "bc", "last"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(jsonl_next_line(buf, sizeof buf - 1, &pos, &line, &len), 0);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(line, want[i], len);
    }
    assert_int_equal(jsonl_next_line(buf, sizeof buf - 1, &pos, &line, &len), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_lines),
        cmocka_unit_test(test_jsonl_text_glob),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_skip_bad_lines),
        cmocka_unit_test(test_cache_reuse_and_invalidation),
        cmocka_unit_test(test_damaged_cache),
        cmocka_unit_test(test_threads_and_chunks_identical),
        cmocka_unit_test(test_packing_oracle),
        cmocka_unit_test(test_shuffle_epochs),
        cmocka_unit_test(test_rank_split),
        cmocka_unit_test(test_state_resume),
        cmocka_unit_test(test_tiny_dataset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
