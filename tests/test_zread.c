/* Unit tests for src/core/zread (compressed corpora): gzip and zstd streams written here with
 * zlib's and libzstd's own compressors decode to the original bytes, concatenated members and
 * frames included; truncated, corrupt, empty and mislabelled files are one sentence naming the
 * file and the offset; a dataset read from .jsonl.gz / .jsonl.zst holds the same documents and
 * ids as the plain .jsonl, across the reader's block boundary; a bad line inside a compressed
 * file is named by file and line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "byte_encode_util.h"
#include "core/fs.h"
#include "core/zread.h"
#include "text/dataset.h"

static char g_dir[256];

static char *path_in(const char *name) {
    return fs_join(g_dir, name);
}

static void write_bytes(const char *name, const void *data, size_t len, const char *mode) {
    char *p = path_in(name);
    FILE *f = fopen(p, mode);
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    free(p);
}

/* One gzip member of data, appended to name (so two calls make a two-member file). */
static void append_gzip(const char *name, const char *data, size_t len) {
    char *p = path_in(name);
    gzFile g = gzopen(p, "ab6");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, data, (unsigned)len), (int)len);
    assert_int_equal(gzclose(g), Z_OK);
    free(p);
}

static void append_zstd(const char *name, const char *data, size_t len) {
    size_t cap = ZSTD_compressBound(len);
    char *z = malloc(cap);
    size_t n = ZSTD_compress(z, cap, data, len, 3);
    assert_false(ZSTD_isError(n));
    write_bytes(name, z, n, "ab");
    free(z);
}

static char *read_back(const char *name, size_t *len, Err *err) {
    char *p = path_in(name), *data = NULL;
    int rc = zread_all(p, &data, len, err);
    free(p);
    return rc == 0 ? data : NULL;
}

/* Lines of varied length with a deterministic generator: JSONL documents. */
static char *make_jsonl(size_t target, size_t *len) {
    char *s = malloc(target + 4096);
    size_t n = 0;
    uint32_t x = 12345;
    for (int doc = 0; n < target; doc++) {
        n += (size_t)sprintf(s + n, "{\"text\": \"doc %d ", doc);
        x = x * 1664525u + 1013904223u;
        int words = 1 + (int)(x >> 22) % 300;
        for (int w = 0; w < words; w++)
            n += (size_t)sprintf(s + n, "w%u ", (x >> (w % 16)) & 0xfff);
        n += (size_t)sprintf(s + n, "\"}\n");
    }
    *len = n;
    return s;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_zread_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    Err err;
    fs_remove_tree(g_dir, &err);
    return 0;
}

static void test_round_trip(void **state) {
    (void)state;
    size_t len;
    char *text = make_jsonl(3u << 20, &len);
    size_t half = len / 2;
    append_gzip("two.jsonl.gz", text, half);
    append_gzip("two.jsonl.gz", text + half, len - half);
    append_zstd("two.jsonl.zst", text, half);
    append_zstd("two.jsonl.zst", text + half, len - half);
    write_bytes("plain.jsonl", text, len, "wb");
    const char *names[] = {"two.jsonl.gz", "two.jsonl.zst", "plain.jsonl"};
    for (int i = 0; i < 3; i++) {
        Err err = {{0}};
        size_t got;
        char *back = read_back(names[i], &got, &err);
        if (!back) fail_msg("%s: %s", names[i], err.msg);
        assert_int_equal(got, len);
        assert_memory_equal(back, text, len);
        free(back);
    }
    free(text);
}

/* The error must name the file and contain want. */
static void expect_error(const char *name, const char *want) {
    Err err = {{0}};
    size_t len;
    char *back = read_back(name, &len, &err);
    if (back) fail_msg("%s: expected an error containing \"%s\"", name, want);
    char *p = path_in(name);
    if (!strstr(err.msg, p) || !strstr(err.msg, want))
        fail_msg("%s: got \"%s\", expected the path and \"%s\"", name, err.msg, want);
    free(p);
}

static void test_bad_streams(void **state) {
    (void)state;
    size_t len;
    char *text = make_jsonl(200000, &len);
    append_gzip("full.gz", text, len);
    append_zstd("full.zst", text, len);
    char *p = path_in("full.gz"), *gz;
    size_t gz_len;
    Err err = {{0}};
    assert_int_equal(fs_read_all(p, &gz, &gz_len, &err), 0);
    free(p);
    p = path_in("full.zst");
    char *zs;
    size_t zs_len;
    assert_int_equal(fs_read_all(p, &zs, &zs_len, &err), 0);
    free(p);

    /* Cut inside the stream: the end offset is the file's length. */
    char want[128];
    write_bytes("cut.jsonl.gz", gz, gz_len - 100, "wb");
    snprintf(want, sizeof want, "truncated gzip data: the file ends at byte %zu inside",
             gz_len - 100);
    expect_error("cut.jsonl.gz", want);
    write_bytes("cut.jsonl.zst", zs, zs_len - 100, "wb");
    snprintf(want, sizeof want, "truncated zstd data: the file ends at byte %zu inside a frame",
             zs_len - 100);
    expect_error("cut.jsonl.zst", want);
    /* Only the 8-byte gzip trailer (CRC-32, length) missing is truncation too. */
    write_bytes("trailer.gz", gz, gz_len - 4, "wb");
    expect_error("trailer.gz", "truncated gzip data");

    /* Damage in the middle: a sentence with the compressed offset, never a silent result. */
    gz[gz_len / 2] ^= 0x55;
    gz[gz_len / 2 + 1] ^= 0x55;
    write_bytes("bad.gz", gz, gz_len, "wb");
    expect_error("bad.gz", "corrupt gzip data near compressed byte ");
    zs[zs_len / 2] ^= 0x55;
    zs[zs_len / 2 + 1] ^= 0x55;
    write_bytes("bad.zst", zs, zs_len, "wb");
    expect_error("bad.zst", "corrupt zstd data near compressed byte ");

    /* Not compressed at all, though named so; and empty. */
    write_bytes("plain.jsonl.gz", text, 1000, "wb");
    expect_error("plain.jsonl.gz",
                 "corrupt gzip data near compressed byte 2 (incorrect header check)");
    write_bytes("plain.jsonl.zst", text, 1000, "wb");
    expect_error("plain.jsonl.zst", "corrupt zstd data near compressed byte");
    write_bytes("empty.gz", "", 0, "wb");
    expect_error("empty.gz", "empty file; expected gzip data");
    /* A whole member, then garbage: the garbage is not a second member. */
    p = path_in("tail.gz");
    FILE *f = fopen(p, "wb");
    fwrite(gz, 1, 10, f); /* a gzip header alone, then nothing: truncated */
    fclose(f);
    free(p);
    expect_error("tail.gz", "truncated gzip data");
    free(gz);
    free(zs);
    free(text);
}

static int open_ds(Dataset *ds, const char *name, Err *err) {
    static char spec[512], cache[512];
    DatasetEncoder enc = {byte_encode, NULL, 7, 256, 257};
    DatasetOptions o;
    dataset_options_default(&o);
    snprintf(spec, sizeof spec, "%s/%s", g_dir, name);
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    o.path = spec;
    o.cache_dir = cache;
    o.seq_len = 16;
    o.seed = 1;
    return dataset_open(ds, &o, &enc, err);
}

static void test_dataset_compressed(void **state) {
    (void)state;
    /* Past the reader's 4 MiB block, so a line is carried across a block boundary; a BOM and
     * CRLF line ends as editors write them. */
    size_t len;
    char *text = make_jsonl((5u << 20), &len);
    char *bom = malloc(len + 3);
    memcpy(bom, "\xef\xbb\xbf", 3);
    memcpy(bom + 3, text, len);
    write_bytes("c.jsonl", bom, len + 3, "wb");
    append_gzip("c-train.00000-of-01024.json.gz", bom, len + 3);
    append_zstd("c.jsonl.zst", bom, len + 3);
    Dataset plain;
    Err err = {{0}};
    if (open_ds(&plain, "c.jsonl", &err) != 0) fail_msg("%s", err.msg);
    assert_true(plain.n_docs > 1000);
    const char *names[] = {"c-train.00000-of-01024.json.gz", "c.jsonl.zst"};
    for (int i = 0; i < 2; i++) {
        Dataset ds;
        if (open_ds(&ds, names[i], &err) != 0) fail_msg("%s: %s", names[i], err.msg);
        assert_int_equal(ds.n_docs, plain.n_docs);
        assert_int_equal(ds.n_tokens, plain.n_tokens);
        assert_memory_equal(ds.offsets, plain.offsets, (size_t)(plain.n_docs + 1) * 8);
        assert_memory_equal(ds.ids, plain.ids, (size_t)plain.n_tokens * 4);
        dataset_close(&ds);
    }
    dataset_close(&plain);
    free(bom);
    free(text);

    /* A bad line inside a compressed file: named by the file and its line. */
    const char *bad = "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"txt\": \"c\"}\n";
    append_gzip("bad.jsonl.gz", bad, strlen(bad));
    Dataset ds;
    assert_int_not_equal(open_ds(&ds, "bad.jsonl.gz", &err), 0);
    char *p = path_in("bad.jsonl.gz");
    char want[600];
    snprintf(want, sizeof want, "%s:3:", p);
    if (!strstr(err.msg, want)) fail_msg("got \"%s\", expected \"%s\"", err.msg, want);
    free(p);
    /* A truncated one stops the dataset, not a silent partial read. */
    write_bytes("cut.jsonl.zst", "\x28\xb5\x2f\xfd\x00", 5, "wb");
    assert_int_not_equal(open_ds(&ds, "cut.jsonl.zst", &err), 0);
    assert_non_null(strstr(err.msg, "truncated zstd data"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_streams),
        cmocka_unit_test(test_dataset_compressed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
