/* The dataset with the real Qwen3 tokenizer on the C4 sample (needs ../shared;
 * exits 77 without it): every document's cached ids match Hugging Face's
 * (lengths and FNV-1a hashes from tests/fixtures/tokenizer/c4_qwen3.jsonl, made
 * by tools/tokenizer_fixtures.py), one EOS (<|endoftext|>) follows each
 * document, the result does not depend on the thread count, and a second open
 * reuses the cache without tokenizing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "text/dataset.h"

static Tokenizer *qwen;
static char *src_path, *fixture_path;
static char tmp_dir[64];

static uint64_t fnv64(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void open_c4(Dataset *ds, const char *cache, int threads) {
    DatasetEncoder enc;
    Err err;
    assert_int_equal(dataset_encoder_for_tokenizer(&enc, qwen, &err), 0);
    assert_int_equal(enc.eos_id, 151643);
    DatasetOptions o;
    dataset_options_default(&o);
    o.path = src_path;
    char *dir = fs_join(tmp_dir, cache);
    o.cache_dir = dir;
    o.seq_len = 2048;
    o.seed = 7;
    o.shuffle = 0;
    o.threads = threads;
    double t0 = seconds();
    if (dataset_open(ds, &o, &enc, &err) != 0) fail_msg("%s", err.msg);
    double dt = seconds() - t0;
    if (!ds->cache_reused)
        fprintf(stderr, "C4 sample on %d thread(s): %lld tokens in %.2f s (%.0f tokens/s)\n",
                threads, (long long)ds->n_tokens, dt, (double)ds->n_tokens / dt);
    free(dir);
}

static void test_c4_matches_hf(void **state) {
    (void)state;
    Dataset ds;
    open_c4(&ds, "c2", 2);
    assert_int_equal(ds.cache_reused, 0);
    char *want;
    size_t wlen;
    Err err;
    assert_int_equal(fs_read_all(fixture_path, &want, &wlen, &err), 0);
    char *save;
    char *line = strtok_r(want, "\n", &save); /* the header names the source file */
    int64_t total = 0, d = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        json_t *w = json_loads(line, 0, NULL);
        assert_non_null(w);
        assert_true(d < ds.n_docs);
        int64_t n = (int64_t)(ds.offsets[d + 1] - ds.offsets[d]);
        char hex[32];
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)fnv64(ds.ids + ds.offsets[d], (size_t)n * sizeof(uint32_t)));
        if (n != json_integer_value(json_object_get(w, "n")) ||
            strcmp(hex, json_string_value(json_object_get(w, "fnv64"))) != 0)
            fail_msg("C4 document %lld: cached ids differ from HF", (long long)d + 1);
        total += n;
        d++;
        json_decref(w);
    }
    free(want);
    assert_int_equal(d, 800);
    assert_int_equal(ds.n_docs, 800);
    assert_int_equal(ds.n_tokens, total);
    assert_int_equal(ds.epoch_len, total + 800);
    /* Unshuffled rows: document 0's ids, then EOS, then document 1's. */
    Batch b;
    batch_alloc(&b, 1, 2048);
    assert_int_equal(dataset_rows(&ds, 0, 1, &b, &err), 0);
    int64_t n0 = (int64_t)ds.offsets[1];
    for (int64_t t = 0; t < n0; t++)
        assert_int_equal(b.tokens[t], ds.ids[t]);
    assert_int_equal(b.tokens[n0], 151643);
    assert_int_equal(b.tokens[n0 + 1], ds.ids[n0]);
    assert_int_equal(b.positions[n0 + 1], 0);
    assert_int_equal(b.doc_ids[n0 + 1], 1);
    batch_free(&b);
    fprintf(stderr, "C4 sample: %lld documents, %lld tokens + %lld EOS per epoch\n",
            (long long)ds.n_docs, (long long)ds.n_tokens, (long long)ds.n_docs);
    dataset_close(&ds);
}

static void test_threads_and_reuse(void **state) {
    (void)state;
    Dataset a, b;
    open_c4(&a, "c1", 1);
    open_c4(&b, "c2", 2); /* made by the previous test */
    assert_int_equal(b.cache_reused, 1);
    char *x, *y;
    size_t lx, ly;
    Err err;
    assert_int_equal(fs_read_all(a.cache_path, &x, &lx, &err), 0);
    assert_int_equal(fs_read_all(b.cache_path, &y, &ly, &err), 0);
    assert_int_equal(lx, ly);
    assert_memory_equal(x, y, lx);
    free(x);
    free(y);
    struct stat s1, s2;
    assert_int_equal(stat(a.cache_path, &s1), 0);
    dataset_close(&a);
    dataset_close(&b);
    open_c4(&a, "c1", 1);
    assert_int_equal(a.cache_reused, 1);
    assert_int_equal(stat(a.cache_path, &s2), 0);
    assert_true(s1.st_ino == s2.st_ino && s1.st_mtim.tv_sec == s2.st_mtim.tv_sec &&
                s1.st_mtim.tv_nsec == s2.st_mtim.tv_nsec);
    dataset_close(&a);
}

int main(void) {
    const char *shared = getenv("QT_SHARED_DIR");
    const char *source = getenv("QT_SOURCE_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!shared || !source || !fs_exists(shared)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    char *tok = fs_join(shared, "tokenizers/qwen3");
    src_path = fs_join(shared, "data/c4_sample/c4_sample.jsonl");
    fixture_path = fs_join(source, "tests/fixtures/tokenizer/c4_qwen3.jsonl");
    if (!fs_exists(tok) || !fs_exists(src_path) || !fs_exists(fixture_path)) {
        fprintf(stderr, "the Qwen3 tokenizer, the C4 sample or its fixture is missing\n");
        return 1;
    }
    Err err;
    qwen = tokenizer_load(tok, &err);
    free(tok);
    if (!qwen) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_dsqwen_XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_c4_matches_hf),
        cmocka_unit_test(test_threads_and_reuse),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fs_remove_tree(tmp_dir, &err);
    tokenizer_free(qwen);
    free(src_path);
    free(fixture_path);
    return rc;
}
