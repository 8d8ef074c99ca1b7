/* The BPE trainer's merges against a naive oracle written here: on a corpus of ASCII words with
 * different frequencies, every merge must be a most frequent adjacent pair of the segmentation
 * that the earlier merges left (counted over words weighted by how often they occur), and
 * training stops only when the vocabulary is full or no pair occurs twice. Among tied pairs any
 * choice is accepted (the tie-break rule is HF's, checked by tools/check_bpe_train.py).
 * test_bpe_train checks round trips and compression, which a trainer that chose the wrong
 * pairs would also pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "text/bpe_train.h"

#define SP "\xC4\xA0" /* the byte-level character of a space */

enum { MAXW = 16, MAXS = 24, SYM = 48, MAXM = 64 };

static const char *const WORDS[] = {"the",    "then",   "there", "other", "hello",  "help",
                                    "yellow", "mellow", "low",   "lower", "newest", "widest"};
#define NW (sizeof WORDS / sizeof WORDS[0])

typedef struct Word {
    char sym[MAXS][SYM];
    int n, count;
} Word;

/* Weighted count of the adjacent pair (a, b) over the current segmentation, and the largest
 * count of any pair. */
static int pair_count(const Word *w, int nw, const char *a, const char *b, int *max) {
    static char pa[MAXW * MAXS][SYM], pb[MAXW * MAXS][SYM];
    static int pc[MAXW * MAXS];
    int np = 0, want = 0;
    for (int i = 0; i < nw; i++)
        for (int k = 0; k + 1 < w[i].n; k++) {
            int j = 0;
            while (j < np && (strcmp(pa[j], w[i].sym[k]) || strcmp(pb[j], w[i].sym[k + 1])))
                j++;
            if (j == np) {
                strcpy(pa[j], w[i].sym[k]);
                strcpy(pb[j], w[i].sym[k + 1]);
                pc[j] = 0;
                np++;
            }
            pc[j] += w[i].count;
        }
    *max = 0;
    for (int j = 0; j < np; j++) {
        if (pc[j] > *max) *max = pc[j];
        if (!strcmp(pa[j], a) && !strcmp(pb[j], b)) want = pc[j];
    }
    return want;
}

/* Replaces every (a, b) in every word by the merged symbol, left to right. */
static void apply(Word *w, int nw, const char *a, const char *b) {
    for (int i = 0; i < nw; i++)
        for (int k = 0; k + 1 < w[i].n; k++)
            if (!strcmp(w[i].sym[k], a) && !strcmp(w[i].sym[k + 1], b)) {
                strcat(w[i].sym[k], w[i].sym[k + 1]);
                memmove(w[i].sym[k + 1], w[i].sym[k + 2], (size_t)(w[i].n - k - 2) * SYM);
                w[i].n--;
            }
}

static void test_merges_follow_frequency(void **state) {
    (void)state;
    /* Word i occurs 3 + 7 i times; every occurrence is " word" (a space, then letters). */
    Word w[NW];
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    for (size_t i = 0; i < NW; i++) {
        w[i].count = 3 + 7 * (int)i;
        w[i].n = 0;
        strcpy(w[i].sym[w[i].n++], SP);
        for (const char *c = WORDS[i]; *c; c++) {
            w[i].sym[w[i].n][0] = *c;
            w[i].sym[w[i].n++][1] = 0;
        }
    }
    /* Interleaved, so no run of one word forms a longer pre-token. */
    for (int round = 0; round < 3 + 7 * (int)NW; round++)
        for (size_t i = 0; i < NW; i++)
            if (round < w[i].count) len += (size_t)snprintf(text + len, cap - len, " %s", WORDS[i]);
    static const char *const special[] = {"<|endoftext|>"};
    BpeTrainOptions opt = {256 + MAXM + 1, 2, special, 1};
    BpeTrainer *tr = bpe_trainer_new(&opt);
    bpe_trainer_add(tr, text, len);
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/qt_bpe_order_%d", (int)getpid());
    size_t nmerges;
    Err err;
    int rc = bpe_trainer_finish(tr, dir, &nmerges, &err);
    if (rc) fail_msg("%s", err.msg);
    bpe_trainer_free(tr);
    char *path = fs_join(dir, "tokenizer.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t nm = json_array_size(merges);
    assert_true(nm == nmerges && nm >= 20);
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        char pa[SYM], pb[SYM];
        if (json_is_string(m)) {
            const char *t = json_string_value(m), *sp = strchr(t, ' ');
            assert_non_null(sp);
            snprintf(pa, sizeof pa, "%.*s", (int)(sp - t), t);
            snprintf(pb, sizeof pb, "%s", sp + 1);
        } else {
            snprintf(pa, sizeof pa, "%s", json_string_value(json_array_get(m, 0)));
            snprintf(pb, sizeof pb, "%s", json_string_value(json_array_get(m, 1)));
        }
        int max, got = pair_count(w, (int)NW, pa, pb, &max);
        if (got != max || got < 2)
            fail_msg("merge %zu (\"%s\" \"%s\") has count %d; the most frequent pair has %d", i, pa,
                     pb, got, max);
        apply(w, (int)NW, pa, pb);
    }
    /* It stopped because the vocabulary is full or no pair is left twice. */
    int max;
    pair_count(w, (int)NW, "", "", &max);
    assert_true(nm == MAXM || max < 2);
    printf("%zu merges, each the most frequent pair at its turn\n", nm);
    json_decref(root);
    fs_remove_tree(dir, &err);
    free(path);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_follow_frequency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
