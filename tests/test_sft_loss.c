/* The loss of a masked chat batch equals transformers' loss with the same labels
 * (tests/fixtures/chat/masked_loss.json from tools/make_masked_loss_fixture.py, the tiny Qwen3
 * of tests/fixtures/train_parity): conversations packed into one row with the document mask,
 * and one conversation a row with padding, both within 1e-5 relative. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_config.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "ops/cross_entropy.h"

enum { MAXB = 3, MAXT = 24 };

static Qwen3 model;
static json_t *fixture;

/* Lays the fixture's conversations out as chat_data.c does: conversation c of row r takes
 * positions from *fill on, position i holds ids[i] and the target labels[i + 1] (HF labels
 * are already the next token); the rest of each row is padding in its own segment. */
static void layout(int rows, int T, int32_t *tok, int32_t *tgt, int32_t *pos, int32_t *doc) {
    const json_t *convs = json_object_get(fixture, "conversations");
    int r = 0, fill = 0, seg = 0;
    for (size_t c = 0; c < json_array_size(convs); c++) {
        const json_t *ids = json_object_get(json_array_get(convs, c), "ids");
        const json_t *lab = json_object_get(json_array_get(convs, c), "labels");
        int n = (int)json_array_size(ids);
        if (rows > 1 && c > 0) r++, fill = 0, seg = 0;
        assert_true(r < rows && fill + n <= T);
        for (int i = 0; i < n; i++) {
            int k = r * T + fill + i;
            tok[k] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
            tgt[k] = i + 1 < n ? (int32_t)json_integer_value(json_array_get(lab, (size_t)i + 1))
                               : CE_IGNORE;
            pos[k] = i;
            doc[k] = seg;
        }
        fill += n;
        seg++;
    }
    for (int rr = 0; rr < rows; rr++) {
        int start = 0;
        while (start < T && tok[rr * T + start] >= 0)
            start++;
        for (int t = start; t < T; t++) {
            int k = rr * T + t;
            tok[k] = 0;
            tgt[k] = CE_IGNORE;
            pos[k] = t - start;
            doc[k] = 99;
        }
    }
}

static void check(int rows, int T) {
    int32_t tok[MAXB * MAXT], tgt[MAXB * MAXT], pos[MAXB * MAXT], doc[MAXB * MAXT];
    for (int i = 0; i < MAXB * MAXT; i++)
        tok[i] = -1;
    layout(rows, T, tok, tgt, pos, doc);
    float loss = qwen3_forward(&model, tok, tgt, pos, doc, rows, T);
    double want = json_real_value(json_object_get(fixture, "loss"));
    fprintf(stderr, "%d row(s) of %d: loss %.8f over %ld labels, transformers %.8f\n", rows, T,
            loss, model.n_valid, want);
    assert_int_equal(model.n_valid, json_integer_value(json_object_get(fixture, "count")));
    assert_true(fabs(loss - want) <= 1e-5 * fabs(want));
}

static void test_packed(void **state) {
    (void)state;
    check(1, MAXT);
}

static void test_padded(void **state) {
    (void)state;
    check(MAXB, 9);
}

int main(void) {
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) return 77;
    Err err;
    char *dir = fs_join(src, "tests/fixtures/train_parity");
    char *cfg = fs_join(dir, "config.json"), *w = fs_join(dir, "model.safetensors");
    char *fix = fs_join(src, "tests/fixtures/chat/masked_loss.json");
    ModelSpec spec;
    StSet set;
    fixture = json_load_path(fix, &err);
    if (!fixture || model_spec_from_hf_config(&spec, cfg, &err) ||
        qwen3_create(&model, &spec, MAXB, MAXT, AC_NONE, &err) || st_set_open(&set, w, &err) ||
        qwen3_load_hf(&model, &set, w, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_set_close(&set);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_padded),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    qwen3_free(&model);
    json_decref(fixture);
    free(dir);
    free(cfg);
    free(w);
    free(fix);
    return rc;
}
