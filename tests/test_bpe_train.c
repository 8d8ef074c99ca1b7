/* BPE trainer: trains on generated text, re-loads the written tokenizer.json with our loader
 * and checks round trips, special tokens, compression, determinism and speed. (HF loading the
 * same output is checked by tools/check_bpe_train.py, since CI has no Python.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "core/timer.h"
#include "text/bpe_train.h"
#include "text/tokenizer.h"

static const char *const WORDS[] = {"the",
                                    "of",
                                    "and",
                                    "to",
                                    "in",
                                    "is",
                                    "that",
                                    "for",
                                    "it",
                                    "with",
                                    "as",
                                    "was",
                                    "on",
                                    "model",
                                    "token",
                                    "training",
                                    "data",
                                    "learning",
                                    "language",
                                    "caf\xc3\xa9",
                                    "na\xc3\xafve",
                                    "\xe4\xb8\xad\xe6\x96\x87",
                                    "2024",
                                    "42",
                                    "it's",
                                    "they're",
                                    "I'll",
                                    "(",
                                    ")",
                                    ",",
                                    ".",
                                    "!",
                                    "?",
                                    "\n",
                                    "\n\n",
                                    "  ",
                                    "\t"};

/* n bytes (about) of pseudo-text from a fixed seed. */
static char *corpus(size_t n, uint64_t seed, size_t *len) {
    Rng r;
    rng_seed(&r, seed, 0);
    char *s = malloc(n + 64);
    size_t o = 0;
    while (o < n) {
        if (rng_below(&r, 3) == 0) {
            /* A made-up word, so there are thousands of distinct pre-tokens. */
            size_t l = 2 + rng_below(&r, 7);
            for (size_t i = 0; i < l; i++)
                s[o++] = "etaoinshrdlucmfw"[rng_below(&r, 16)];
        } else {
            const char *w = WORDS[rng_below(&r, sizeof WORDS / sizeof WORDS[0])];
            size_t l = strlen(w);
            memcpy(s + o, w, l);
            o += l;
        }
        s[o++] = ' ';
    }
    s[o] = 0;
    *len = o;
    return s;
}

static char *train_to(const char *tag, const char *text, size_t len, uint32_t vocab,
                      size_t *merges) {
    static const char *const special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    BpeTrainOptions opt = {vocab, 2, special, 3};
    BpeTrainer *tr = bpe_trainer_new(&opt);
    bpe_trainer_add(tr, text, len);
    bpe_trainer_add(tr, "a<|endoftext|>b", 15);
    char *dir = malloc(256);
    snprintf(dir, 256, "/tmp/qt_bpe_train_%d_%s", (int)getpid(), tag);
    Err err;
    int rc = bpe_trainer_finish(tr, dir, merges, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    bpe_trainer_free(tr);
    return dir;
}

static void cleanup(char *dir) {
    Err err;
    fs_remove_tree(dir, &err);
    free(dir);
}

static void test_train_and_reload(void **state) {
    (void)state;
    size_t len, merges;
    char *text = corpus(200000, 1, &len);
    char *dir = train_to("a", text, len, 512, &merges);
    Err err;
    Tokenizer *t = tokenizer_load(dir, &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    assert_int_equal(tokenizer_vocab_size(t), 512);
    assert_true(merges > 100);
    assert_int_equal(tokenizer_token_id(t, "<|endoftext|>"), 509);
    assert_int_equal(tokenizer_token_id(t, "<|im_end|>"), 511);
    /* Round trips, including text never seen in training. */
    const char *samples[] = {
        "the model was training on data, it's 2024!",
        "  unseen: \xf0\x9f\x91\x8d zebra \xd0\xb6\xd0\xb8\xd0\xb7\xd0\xbd\xd1\x8c\r\n",
        "na\xc3\xafve caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87"};
    for (size_t i = 0; i < 3; i++) {
        IdVec ids = {0};
        assert_int_equal(tokenizer_encode(t, samples[i], strlen(samples[i]), &ids, &err), 0);
        char *dec;
        size_t dl;
        assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, &dec, &dl, &err), 0);
        assert_string_equal(dec, samples[i]);
        free(dec);
        idvec_free(&ids);
    }
    IdVec ids = {0};
    assert_int_equal(tokenizer_encode(t, "<|im_start|>x<|im_end|>", 23, &ids, &err), 0);
    assert_int_equal(ids.ids[0], 510);
    assert_int_equal(ids.ids[ids.n - 1], 511);
    idvec_free(&ids);
    /* Merges compress the training text well below one id per byte. */
    assert_int_equal(tokenizer_encode(t, text, len, &ids, &err), 0);
    assert_true(ids.n * 2 < len);
    idvec_free(&ids);
    tokenizer_free(t);
    /* The same input gives the same file. */
    char *dir2 = train_to("b", text, len, 512, &merges);
    char *p1 = fs_join(dir, "tokenizer.json"), *p2 = fs_join(dir2, "tokenizer.json");
    char *d1, *d2;
    size_t l1, l2;
    assert_int_equal(fs_read_all(p1, &d1, &l1, &err), 0);
    assert_int_equal(fs_read_all(p2, &d2, &l2, &err), 0);
    assert_true(l1 == l2 && memcmp(d1, d2, l1) == 0);
    free(d1);
    free(d2);
    free(p1);
    free(p2);
    cleanup(dir);
    cleanup(dir2);
    free(text);
}

/* A vocabulary of 2048 on 2 MB trains in a few seconds. */
static void test_train_speed(void **state) {
    (void)state;
    size_t len, merges;
    char *text = corpus(2000000, 2, &len);
    /* More distinct words than the fixed list gives: numbered variants. */
    for (size_t i = 0; i + 8 < len; i += 97)
        text[i] = (char)('a' + (i / 97) % 26);
    double t0 = now_seconds();
    char *dir = train_to("c", text, len, 2048, &merges);
    double dt = now_seconds() - t0;
    fprintf(stderr, "trained %zu merges on %zu bytes in %.2f s\n", merges, len, dt);
    assert_true(dt < 30.0);
    cleanup(dir);
    free(text);
}

static void test_bad_vocab_size(void **state) {
    (void)state;
    static const char *const special[] = {"<|endoftext|>"};
    BpeTrainOptions opt = {100, 2, special, 1};
    BpeTrainer *tr = bpe_trainer_new(&opt);
    Err err;
    size_t merges;
    assert_int_equal(bpe_trainer_finish(tr, "/tmp/qt_never_written", &merges, &err), -1);
    assert_non_null(strstr(err.msg, "vocab size 100"));
    bpe_trainer_free(tr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_and_reload),
        cmocka_unit_test(test_train_speed),
        cmocka_unit_test(test_bad_vocab_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
