/* Unit tests for src/train/shard_slice (and the resharding reader of src/train/ckpt_dist.h):
 * a tensor cut up as one mesh holds it (FSDP pieces of tensor-parallel row or column blocks,
 * expert-parallel blocks of a 3-D tensor) is read back as another mesh wants it, bitwise,
 * against an element-by-element gather of the whole tensor; slices that leave a gap or
 * overlap, a layout that disagrees with its file, and malformed layout entries each fail with
 * a sentence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "train/ckpt_dist.h"
#include "train/shard_slice.h"

/* out = s's elements of full, one by one from their coordinates (the reference). */
static void gather(const ShardSlice *s, const float *full, float *out) {
    for (int64_t j = 0; j < s->numel; j++) {
        int64_t r = s->start + j, idx[CKPT_MAX_DIMS], g = 0;
        for (int d = s->ndim - 1; d >= 0; d--) {
            idx[d] = r % s->box_len[d];
            r /= s->box_len[d];
        }
        for (int d = 0; d < s->ndim; d++)
            g = g * s->shape[d] + s->box_off[d] + idx[d];
        out[j] = full[g];
    }
}

/* Slices of a (rows, cols) or (X, rows, cols) tensor: `parts` blocks along dimension dim
 * (-1: one block, the whole), each cut into `pieces` runs of nearly equal length. */
static int cut(ShardSlice *out, int ndim, const int64_t *shape, int dim, int parts, int pieces) {
    int n = 0;
    for (int t = 0; t < parts; t++) {
        ShardSlice b;
        shard_slice_whole(&b, ndim, shape);
        if (dim >= 0) {
            b.box_len[dim] = shape[dim] / parts;
            b.box_off[dim] = t * b.box_len[dim];
        }
        int64_t box = shard_slice_box_numel(&b);
        for (int k = 0; k < pieces; k++) {
            out[n] = b;
            out[n].start = box * k / pieces;
            out[n].numel = box * (k + 1) / pieces - out[n].start;
            n++;
        }
    }
    return n;
}

typedef struct Layout {
    int dim, parts, pieces;
} Layout;

static void check_reshard(int ndim, const int64_t *shape, const Layout *from, const Layout *to) {
    int64_t total = 1;
    for (int d = 0; d < ndim; d++)
        total *= shape[d];
    float *full = malloc((size_t)total * sizeof *full);
    for (int64_t i = 0; i < total; i++)
        full[i] = (float)i * 0.25f - 3.0f;
    ShardSlice src_s[32], dst_s[32];
    int ns = cut(src_s, ndim, shape, from->dim, from->parts, from->pieces);
    int nd = cut(dst_s, ndim, shape, to->dim, to->parts, to->pieces);
    ShardSource src[32];
    float *data[32];
    for (int k = 0; k < ns; k++) {
        data[k] = malloc((size_t)src_s[k].numel * sizeof(float) + 1);
        gather(&src_s[k], full, data[k]);
        src[k] = (ShardSource){src_s[k], data[k], "file"};
    }
    Err err;
    for (int k = 0; k < nd; k++) {
        float *got = malloc((size_t)dst_s[k].numel * sizeof(float) + 1);
        float *want = malloc((size_t)dst_s[k].numel * sizeof(float) + 1);
        gather(&dst_s[k], full, want);
        if (shard_copy(&dst_s[k], got, src, ns, "w", &err) != 0) fail_msg("%s", err.msg);
        assert_memory_equal(got, want, (size_t)dst_s[k].numel * sizeof(float));
        free(got), free(want);
    }
    for (int k = 0; k < ns; k++)
        free(data[k]);
    free(full);
}

static void test_reshard(void **state) {
    (void)state;
    const int64_t m[2] = {6, 8}, e[3] = {4, 3, 2};
    const Layout whole = {-1, 1, 1}, fsdp4 = {-1, 1, 4}, fsdp3 = {-1, 1, 3};
    const Layout tp2rows = {0, 2, 2}, tp2cols = {1, 2, 3}, ep2 = {0, 2, 2}, ep4 = {0, 4, 1};
    const Layout *two_d[] = {&whole, &fsdp4, &fsdp3, &tp2rows, &tp2cols};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            check_reshard(2, m, two_d[a], two_d[b]);
    const Layout *three_d[] = {&whole, &fsdp3, &ep2, &ep4};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            check_reshard(3, e, three_d[a], three_d[b]);
}

static void test_gaps_and_overlaps(void **state) {
    (void)state;
    const int64_t shape[2] = {4, 4};
    float data[16] = {0}, out[16];
    ShardSlice s[4], want;
    cut(s, 2, shape, -1, 1, 4);
    shard_slice_whole(&want, 2, shape);
    ShardSource src[4];
    for (int k = 0; k < 4; k++)
        src[k] = (ShardSource){s[k], data, "f"};
    Err err;
    assert_int_equal(shard_copy(&want, out, src, 4, "w", &err), 0);
    /* The third piece missing: element 8 is held by none. */
    src[2] = src[3];
    assert_int_equal(shard_copy(&want, out, src, 3, "w", &err), -1);
    assert_non_null(strstr(err.msg, "do not hold element 8 of its 16"));
    /* A piece that overlaps its neighbour. */
    cut(s, 2, shape, -1, 1, 4);
    for (int k = 0; k < 4; k++)
        src[k] = (ShardSource){s[k], data, "f"};
    src[1].slice.start -= 1, src[1].slice.numel += 1;
    assert_int_equal(shard_copy(&want, out, src, 4, "w", &err), -1);
    assert_non_null(strstr(err.msg, "hold twice"));
    /* Another shape. */
    const int64_t other[2] = {2, 8};
    shard_slice_whole(&src[0].slice, 2, other);
    assert_int_equal(shard_copy(&want, out, src, 1, "w", &err), -1);
    assert_non_null(strstr(err.msg, "another shape"));
}

static void test_json(void **state) {
    (void)state;
    ShardSlice s[2], back;
    const int64_t shape[3] = {4, 3, 2};
    cut(s, 3, shape, 0, 2, 1); /* the second expert-parallel block */
    json_t *j = shard_slice_to_json(&s[1]);
    Err err;
    assert_int_equal(shard_slice_from_json(j, &back, "layout.json", "w", &err), 0);
    assert_true(shard_slice_equal(&s[1], &back));
    json_decref(j);
    static const struct {
        const char *text, *says;
    } BAD[] = {
        {"[]", "is not an object"},
        {"{\"shape\": [4], \"box_offset\": [0], \"box_shape\": [5], \"start\": 0, \"numel\": 1}",
         "past its size 4"},
        {"{\"shape\": [4], \"box_offset\": [0], \"box_shape\": [4], \"start\": 2, \"numel\": 3}",
         "not inside its box of 4"},
        {"{\"shape\": [4, 2], \"box_offset\": [0], \"box_shape\": [4, 2], \"start\": 0, "
         "\"numel\": 1}",
         "as many entries"},
        {"{\"shape\": [0], \"box_offset\": [0], \"box_shape\": [1], \"start\": 0, \"numel\": 1}",
         "w.shape must be a list of 1 to 8 integers >= 1"},
        {"{\"shape\": [1,1,1,1,1,1,1,1,1], \"box_offset\": [0], \"box_shape\": [1], \"start\": 0, "
         "\"numel\": 1}",
         "w.shape must be"},
        {"{\"shape\": [4], \"box_offset\": [0], \"box_shape\": [4], \"start\": 0}", "numel"},
        {"{\"shape\": [281474976710656, 281474976710656], \"box_offset\": [0, 0], "
         "\"box_shape\": [1, 1], \"start\": 0, \"numel\": 1}",
         "too many elements"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        json_t *b = json_loads(BAD[i].text, 0, NULL);
        assert_non_null(b);
        assert_int_equal(shard_slice_from_json(b, &back, "layout.json", "w", &err), -1);
        if (!strstr(err.msg, BAD[i].says)) fail_msg("%s: got \"%s\"", BAD[i].text, err.msg);
        json_decref(b);
    }
}

/* A layout.json whose slice disagrees with the file it describes is one sentence. */
static void test_layout_disagrees(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_shard_slice_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    float w[4] = {1, 2, 3, 4}, back[8];
    CkptTensor piece = {"w", 1, {4}, w, NULL};
    const char *layout = "{\"format\": \"qtitan-shard-layout\", \"version\": 1, \"tensors\": "
                         "{\"w\": {\"shape\": [8], \"box_offset\": [0], \"box_shape\": [8], "
                         "\"start\": 0, \"numel\": 5}}}";
    CkptFile f = {CKPT_DIST_LAYOUT, layout, strlen(layout)};
    CkptState st = {.step = 3, .files = &f, .nfiles = 1};
    Err err;
    char *dir = ckpt_dist_rank_dir(tmpl, 0);
    assert_int_equal(ckpt_save(dir, &st, &piece, 1, NULL, 0, 0, &err), 0);
    CkptDistFound found = {.step = 3, .ranks = 1, .mesh = {1, 1, 1, 1}};
    CkptDistReader r;
    assert_int_equal(ckpt_dist_reader_open_found(&r, NULL, tmpl, &found, 0, &err), 0);
    CkptTensor whole = {"w", 1, {8}, back, NULL};
    assert_int_equal(ckpt_dist_read_into(&r, &whole, 1, NULL, 1, 0, NULL, &err), -1);
    assert_non_null(
        strstr(err.msg, "holds 4 elements of w, but its layout.json gives its slice 5"));
    ckpt_dist_reader_close(&r);
    free(dir);
    assert_int_equal(fs_remove_tree(tmpl, &err), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_gaps_and_overlaps),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_layout_disagrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
