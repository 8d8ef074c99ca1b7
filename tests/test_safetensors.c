/* Unit tests for src/io/safetensors: a file written by the Python package (read, and
 * reproduced byte for byte), round trips in F32/BF16/F16, HF shards, and malformed input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/strutil.h"
#include "io/safetensors.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_st_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    Err err;
    return fs_remove_tree(g_dir, &err);
}

static char *tmp_path(const char *name) {
    return fs_join(g_dir, name);
}

static char *fixture(const char *name) {
    const char *src = getenv("QT_SOURCE_DIR");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/tests/fixtures/safetensors/%s", src ? src : ".", name);
    return xstrdup(buf);
}

/* One tensor of the Python fixture's listing. */
typedef struct Ref {
    char name[128];
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    float vals[64];
} Ref;

static int load_refs(Ref *refs, int cap) {
    char *p = fixture("py_written.txt"), *text;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(p, &text, &len, &err), 0);
    free(p);
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && n < cap;
         line = strtok_r(NULL, "\n", &save)) {
        Ref *r = &refs[n++];
        char *tok, *s2 = NULL;
        tok = strtok_r(line, " ", &s2);
        snprintf(r->name, sizeof r->name, "%s", tok);
        assert_int_equal(dtype_parse(strtok_r(NULL, " ", &s2), &r->dtype), 0);
        r->ndim = atoi(strtok_r(NULL, " ", &s2));
        r->numel = 1;
        for (int d = 0; d < r->ndim; d++) {
            r->shape[d] = atoll(strtok_r(NULL, " ", &s2));
            r->numel *= r->shape[d];
        }
        for (int64_t i = 0; i < r->numel; i++)
            r->vals[i] = strtof(strtok_r(NULL, " ", &s2), 0);
    }
    free(text);
    return n;
}

static void test_python_fixture_read(void **state) {
    (void)state;
    Ref refs[16];
    int n = load_refs(refs, 16);
    assert_int_equal(n, 9);
    char *p = fixture("py_written.safetensors");
    StFile f;
    Err err;
    assert_int_equal(st_open(&f, p, &err), 0);
    assert_int_equal(f.n, n);
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_find(&f, refs[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, refs[i].dtype);
        assert_int_equal(t->ndim, refs[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            assert_int_equal(t->shape[d], refs[i].shape[d]);
        assert_int_equal(t->numel, refs[i].numel);
        float got[64];
        st_to_f32(t, got);
        /* Bitwise, so -0.0 must stay -0.0. */
        assert_memory_equal(got, refs[i].vals, (size_t)t->numel * sizeof(float));
    }
    assert_null(st_find(&f, "nope"));
    st_close(&f);
    free(p);
}

static void test_python_fixture_bytes(void **state) {
    (void)state;
    Ref refs[16];
    int n = load_refs(refs, 16);
    /* Encode the listed values into each dtype with our converters, then write. */
    static unsigned char raw[16][512];
    StWriter w;
    st_writer_init(&w);
    for (int i = 0; i < n; i++) {
        Ref *r = &refs[i];
        for (int64_t j = 0; j < r->numel; j++) {
            float v = r->vals[j];
            switch (r->dtype) {
            case DT_I64:
                ((int64_t *)raw[i])[j] = (int64_t)v;
                break;
            case DT_I32:
                ((int32_t *)raw[i])[j] = (int32_t)v;
                break;
            case DT_U8:
                raw[i][j] = (unsigned char)v;
                break;
            default:
                dtype_from_f32(raw[i] + j * dtype_size(r->dtype), &v, r->dtype, 1);
            }
        }
        st_writer_add(&w, r->name, r->dtype, r->ndim, r->shape, raw[i]);
    }
    st_writer_set_metadata(&w, "format", "pt");
    char *out = tmp_path("ours.safetensors");
    Err err;
    assert_int_equal(st_write_finish(&w, out, &err), 0);
    st_writer_free(&w);
    char *a, *b, *p = fixture("py_written.safetensors");
    size_t na, nb;
    assert_int_equal(fs_read_all(p, &a, &na, &err), 0);
    assert_int_equal(fs_read_all(out, &b, &nb, &err), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    char *tmp = tmp_path("ours.safetensors.tmp");
    assert_false(fs_exists(tmp));
    free(tmp);
    free(a);
    free(b);
    free(p);
    free(out);
}

static void roundtrip_dtype(DType dt) {
    enum { R = 5, C = 7 };
    float src[R * C], got[R * C], expect[R * C];
    Rng rng;
    rng_seed(&rng, 7, (uint64_t)dt);
    for (int i = 0; i < R * C; i++)
        src[i] = rng_normal(&rng) * 3.0f;
    src[0] = -0.0f;
    for (int i = 0; i < R * C; i++) {
        uint16_t h;
        switch (dt) {
        case DT_BF16:
            expect[i] = bf16_to_f32(f32_to_bf16(src[i]));
            break;
        case DT_F16:
            h = f32_to_f16(src[i]);
            expect[i] = f16_to_f32(h);
            break;
        default:
            expect[i] = src[i];
        }
    }
    int64_t shape[2] = {R, C}, shape1[1] = {3}, shape0[1] = {0};
    /* The same values stored raw (already converted) and converted while writing. */
    unsigned char raw[R * C * 4];
    dtype_from_f32(raw, src, dt, R * C);
    const float odd[3] = {1, 2, 3};
    StWriter w;
    st_writer_init(&w);
    st_writer_add_f32(&w, "conv", dt, 2, shape, src);
    st_writer_add(&w, "raw", dt, 2, shape, raw);
    st_writer_add_f32(&w, "small", DT_F32, 1, shape1, odd);
    st_writer_add_f32(&w, "empty", dt, 1, shape0, NULL);
    char *path = tmp_path("rt.safetensors");
    Err err;
    assert_int_equal(st_write_finish(&w, path, &err), 0);
    st_writer_free(&w);
    StFile f;
    assert_int_equal(st_open(&f, path, &err), 0);
    assert_int_equal(f.n, 4);
    /* The header is padded so that the data section starts 8-byte aligned. */
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);
    assert_int_equal(hlen % 8, 0);
    const char *names[2] = {"conv", "raw"};
    for (int k = 0; k < 2; k++) {
        const StTensor *t = st_find(&f, names[k]);
        assert_non_null(t);
        assert_int_equal(t->dtype, dt);
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[0], R);
        assert_int_equal(t->shape[1], C);
        assert_int_equal(t->nbytes, R * C * dtype_size(dt));
        st_to_f32(t, got);
        assert_memory_equal(got, expect, sizeof got);
    }
    const StTensor *e = st_find(&f, "empty");
    assert_non_null(e);
    assert_int_equal(e->numel, 0);
    st_to_f32(st_find(&f, "small"), got);
    assert_memory_equal(got, odd, sizeof odd);
    st_close(&f);
    free(path);
}

static void test_roundtrip_f32(void **state) {
    (void)state;
    roundtrip_dtype(DT_F32);
}
static void test_roundtrip_bf16(void **state) {
    (void)state;
    roundtrip_dtype(DT_BF16);
}
static void test_roundtrip_f16(void **state) {
    (void)state;
    roundtrip_dtype(DT_F16);
}

/* kB of this process's resident file-backed pages (Linux /proc/self/status RssFile). */
static long rss_file_kb(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "RssFile: %ld", &kb) == 1) break;
    if (fp) fclose(fp);
    return kb;
}

/* st_release_range drops the mapped pages wholly inside a converted range from the resident
 * memory (16 MiB of F32 read: RssFile grows by >= 15 MiB, then falls by as much), keeps the
 * pages it only partly covers, and the data reads the same again afterwards. */
static void test_release_range(void **state) {
    (void)state;
    enum { N = 4 << 20 };
    float *src = malloc(N * sizeof *src), *got = malloc(N * sizeof *got);
    for (long i = 0; i < N; i++)
        src[i] = (float)i;
    int64_t shape[1] = {N};
    StWriter w;
    st_writer_init(&w);
    st_writer_add_f32(&w, "big", DT_F32, 1, shape, src);
    char *path = tmp_path("release.safetensors");
    Err err;
    assert_int_equal(st_write_finish(&w, path, &err), 0);
    st_writer_free(&w);
    StFile f;
    assert_int_equal(st_open(&f, path, &err), 0);
    const StTensor *t = st_find(&f, "big");
    long before = rss_file_kb();
    if (before < 0) skip(); /* no /proc */
    st_to_f32(t, got);
    long read = rss_file_kb();
    assert_true(read - before >= 15 * 1024);
    st_release_range(t, 0, N);
    long released = rss_file_kb();
    assert_true(read - released >= 15 * 1024);
    st_release_range(t, 1, 2); /* 8 bytes: no whole page, nothing dropped or faulted */
    assert_true(rss_file_kb() - released < 64);
    st_to_f32(t, got);
    assert_memory_equal(got, src, N * sizeof *src);
    st_close(&f);
    free(path);
    free(src);
    free(got);
}

static void test_sharded_roundtrip(void **state) {
    (void)state;
    char *dir = tmp_path("hf");
    Err err;
    assert_int_equal(fs_mkdirs(dir, &err), 0);
    /* Sizes 40, 40, 100, 20 bytes with a 64-byte limit. huggingface_hub's split
     * (split_torch_state_dict_into_shards(max_shard_size=64)) gives {z.a}, {x.big}, {y.b, w.c}:
     * the oversized tensor is numbered before the shard still open. */
    float a[10], b[10], big[25], c[5];
    for (int i = 0; i < 25; i++) {
        if (i < 10) a[i] = (float)i, b[i] = -(float)i;
        if (i < 5) c[i] = 0.5f * (float)i;
        big[i] = 100.0f + (float)i;
    }
    int64_t s10[1] = {10}, s25[2] = {5, 5}, s5[1] = {5};
    StWriter w;
    st_writer_init(&w);
    st_writer_add_f32(&w, "z.a", DT_F32, 1, s10, a);
    st_writer_add_f32(&w, "y.b", DT_F32, 1, s10, b);
    st_writer_add_f32(&w, "x.big", DT_F32, 2, s25, big);
    st_writer_add_f32(&w, "w.c", DT_F32, 1, s5, c);
    assert_int_equal(st_write_hf_shards(&w, dir, 64, &err), 0);
    const char *names[3] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors"};
    for (int i = 0; i < 3; i++) {
        char *p = fs_join(dir, names[i]);
        assert_true(fs_exists(p));
        free(p);
    }
    char *ip = fs_join(dir, "model.safetensors.index.json");
    json_t *idx = json_load_path(ip, &err);
    assert_non_null(idx);
    int64_t total = 0;
    assert_int_equal(
        json_req_int(json_object_get(idx, "metadata"), "total_size", &total, "idx", &err), 0);
    assert_int_equal(total, 40 + 40 + 100 + 20);
    json_t *wm = json_object_get(idx, "weight_map");
    assert_string_equal(json_string_value(json_object_get(wm, "z.a")), names[0]);
    assert_string_equal(json_string_value(json_object_get(wm, "x.big")), names[1]);
    assert_string_equal(json_string_value(json_object_get(wm, "y.b")), names[2]);
    assert_string_equal(json_string_value(json_object_get(wm, "w.c")), names[2]);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_parameters")),
        50);
    json_decref(idx);

    StSet s;
    assert_int_equal(st_set_open(&s, dir, &err), 0);
    assert_int_equal(s.nfiles, 3);
    float got[25];
    st_to_f32(st_set_find(&s, "x.big"), got);
    assert_memory_equal(got, big, sizeof big);
    st_to_f32(st_set_find(&s, "y.b"), got);
    assert_memory_equal(got, b, sizeof b);
    assert_null(st_set_find(&s, "nope"));
    st_set_close(&s);
    /* The index file itself names the same set. */
    assert_int_equal(st_set_open(&s, ip, &err), 0);
    assert_int_equal(s.nfiles, 3);
    assert_non_null(st_set_find(&s, "w.c"));
    st_set_close(&s);

    /* A large limit gives one model.safetensors and removes the stale index. */
    assert_int_equal(st_write_hf_shards(&w, dir, 1u << 20, &err), 0);
    assert_false(fs_exists(ip));
    assert_int_equal(st_set_open(&s, dir, &err), 0);
    assert_int_equal(s.nfiles, 1);
    assert_true(str_ends_with(s.files[0].path, "/model.safetensors"));
    st_to_f32(st_set_find(&s, "w.c"), got);
    assert_memory_equal(got, c, sizeof c);
    st_set_close(&s);
    st_writer_free(&w);
    free(ip);
    free(dir);
}

/* ---- malformed input ---- */

static char *write_raw(const char *name, const void *bytes, size_t n) {
    char *p = tmp_path(name);
    Err err;
    assert_int_equal(fs_write_atomic(p, bytes, n, &err), 0);
    return p;
}

/* Header text plus data_len zero bytes, with a correct length prefix. */
static char *write_st(const char *name, const char *hdr, size_t data_len) {
    size_t h = strlen(hdr), n = 8 + h + data_len;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, hdr, h);
    char *p = write_raw(name, buf, n);
    free(buf);
    return p;
}

static void expect_open_fails(const char *path, const char *w1, const char *w2) {
    StFile f;
    Err err;
    err.msg[0] = 0;
    assert_int_equal(st_open(&f, path, &err), -1);
    if (!strstr(err.msg, "bad.safetensors") || !strstr(err.msg, w1) || (w2 && !strstr(err.msg, w2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err.msg, w1, w2 ? w2 : "");
    /* One sentence: no newline. */
    assert_null(strchr(err.msg, '\n'));
}

static void bad_header(const char *hdr, size_t data_len, const char *w1, const char *w2) {
    char *p = write_st("bad.safetensors", hdr, data_len);
    expect_open_fails(p, w1, w2);
    free(p);
}

static void test_malformed_framing(void **state) {
    (void)state;
    char *p = write_raw("bad.safetensors", "\x10\0\0", 3);
    expect_open_fails(p, "too short", "3 bytes");
    free(p);
    /* Header length 100 but only 10 header bytes present. */
    unsigned char b[18] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    p = write_raw("bad.safetensors", b, sizeof b);
    expect_open_fails(p, "header length 100", "past the end");
    free(p);
    /* Header length over the 100 MB cap. */
    unsigned char big[16] = {0, 0, 0, 0x10, 0, 0, 0, 0};
    p = write_raw("bad.safetensors", big, sizeof big);
    expect_open_fails(p, "over the", "limit");
    free(p);
    unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    p = write_raw("bad.safetensors", huge, sizeof huge);
    expect_open_fails(p, "header length", "limit");
    free(p);
    p = write_raw("bad.safetensors", "", 0);
    expect_open_fails(p, "too short", "0 bytes");
    free(p);
}

static void test_malformed_header(void **state) {
    (void)state;
    bad_header("{\"a\": ", 0, "not valid JSON", "byte");
    bad_header("[1, 2]", 0, "not an object", NULL);
    bad_header("{\"a\": 5}", 0, "tensor \"a\"", "expected an object");
    bad_header("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               "unknown dtype \"F64\"", "tensor \"a\"");
    bad_header("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "dtype", NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "non-negative", "dimension 0");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
               "non-negative integer", NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,4]}}", 4,
               "\"shape\" must be an array", NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
               "\"data_offsets\":[0,4]}}",
               4, "9 dimensions", "at most 8");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows", NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8,
               "end past the data section of 8 bytes", "[0, 16]");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
               "span 12 bytes but shape [2, 2] of F32 needs 16", "tensor \"a\"");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16,
               "begin after end", "[8, 4]");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 16,
               "non-negative", "data_offsets");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, "[begin, end]",
               NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, "overlap", "\"b\" (data_offsets [4, 12])");
    bad_header("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__", "string");
    bad_header("{\"__metadata__\":[]}", 0, "__metadata__", "object");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "not valid JSON", "duplicate");
    /* A zero-byte tensor may sit anywhere; it owns no bytes. */
    char *p = write_st("ok.safetensors",
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"e\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[4,4]}}",
                       8);
    StFile f;
    Err err;
    assert_int_equal(st_open(&f, p, &err), 0);
    st_close(&f);
    free(p);
    /* A directory or a missing file is an error, not a crash. */
    assert_int_equal(st_open(&f, g_dir, &err), -1);
    assert_non_null(strstr(err.msg, "not a regular file"));
    char *missing = tmp_path("missing.safetensors");
    assert_int_equal(st_open(&f, missing, &err), -1);
    assert_non_null(strstr(err.msg, "missing.safetensors"));
    free(missing);
}

/* st_convert_range converts every value into F32 and into BF16 (a BF16 source copied, others
 * rounded as f32_to_bf16 rounds) and returns the index of the first NaN or infinity, from
 * aligned data (the parallel pass, chunks of 65536) and from data at an odd address (the bounce
 * buffer), for each float dtype: the loaders' finiteness check. */
static void test_convert_finds_nonfinite(void **state) {
    (void)state;
    enum { N = 3 * 65536 + 5 };
    const DType types[3] = {DT_F32, DT_BF16, DT_F16};
    float *v = xmalloc(N * sizeof *v), *got = xmalloc(N * sizeof *got);
    uint16_t *got16 = xmalloc(N * sizeof *got16);
    unsigned char *raw = xmalloc(4 * N + 1);
    for (int k = 0; k < N; k++)
        v[k] = (float)((k * 37) % 201 - 100) * 0.0625f; /* exact in all three types */
    for (int d = 0; d < 3; d++)
        for (int odd = 0; odd < 2; odd++)
            for (int c = 0; c < 3; c++) {
                /* c 0: all finite; 1: a NaN in the third chunk and an infinity in the
                 * second, so the infinity is first; 2: an infinity at the very end. */
                size_t es = dtype_size(types[d]);
                StTensor t = {.dtype = types[d],
                              .ndim = 1,
                              .shape = {N},
                              .numel = N,
                              .data = raw + odd,
                              .nbytes = N * es};
                int64_t want = c == 0 ? -1 : c == 1 ? 65536 + 9 : N - 1;
                float *w = xmalloc(N * sizeof *w);
                memcpy(w, v, N * sizeof *w);
                if (c == 1) w[2 * 65536 + 3] = NAN, w[65536 + 9] = -INFINITY;
                if (c == 2) w[N - 1] = INFINITY;
                unsigned char *tmp = xmalloc(N * es);
                dtype_from_f32(tmp, w, types[d], N);
                memcpy(raw + odd, tmp, N * es);
                free(tmp);
                assert_int_equal(st_convert_range(&t, DT_F32, got, 0, N), want);
                assert_int_equal(st_convert_range(&t, DT_BF16, got16, 0, N), want);
                for (int k = 0; k < N; k++) {
                    if (isnan(w[k])) {
                        assert_true(isnan(got[k]));
                        continue;
                    }
                    assert_true(got[k] == w[k]);
                    assert_int_equal(got16[k], f32_to_bf16(w[k]));
                }
                /* A range: indices count from its start. */
                if (c == 1)
                    assert_int_equal(st_convert_range(&t, DT_F32, got, 65536, N - 65536), 9);
                free(w);
            }
    free(v), free(got), free(got16), free(raw);
}

/* Other writers need not pad the header, so data can start at any byte offset. */
static void test_unaligned_data(void **state) {
    (void)state;
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[8,10]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[11,13]}} ";
    size_t h = strlen(hdr), n = 8 + h + 13;
    assert_true((8 + h) % 2 == 1);
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, hdr, h);
    const float a[2] = {1.5f, -3.25f};
    const uint16_t b = 0x4049, c = 0x3c00; /* bf16 3.140625, f16 1.0 */
    memcpy(buf + 8 + h, a, 8);
    memcpy(buf + 8 + h + 8, &b, 2);
    memcpy(buf + 8 + h + 11, &c, 2);
    char *p = write_raw("unaligned.safetensors", buf, n);
    free(buf);
    StFile f;
    Err err;
    assert_int_equal(st_open(&f, p, &err), 0);
    float got[2];
    st_to_f32(st_find(&f, "a"), got);
    assert_memory_equal(got, a, sizeof a);
    st_to_f32(st_find(&f, "b"), got);
    assert_true(got[0] == 3.140625f);
    st_to_f32(st_find(&f, "c"), got);
    assert_true(got[0] == 1.0f);
    st_close(&f);
    free(p);
}

/* Elements [lo, lo + n) of t as fp32 and as bf16 equal those of the references want (F32) and
 * want16 (BF16), NaN for NaN. */
static void check_fp8_range(const StTensor *t, const float *want, const uint16_t *want16,
                            int64_t lo, int64_t n) {
    float *got = xmalloc((size_t)n * sizeof *got);
    uint16_t *got16 = xmalloc((size_t)n * sizeof *got16);
    st_convert_range(t, DT_F32, got, lo, n);
    st_convert_range(t, DT_BF16, got16, lo, n);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[lo + i])) {
            assert_true(isnan(got[i]));
            continue;
        }
        assert_memory_equal(&got[i], &want[lo + i], sizeof *got);
        if (want16) assert_int_equal(got16[i], want16[lo + i]);
    }
    free(got), free(got16);
}

/* fp8 block-quantized weights against torch (tools/make_safetensors_fixture.py): every
 * float8_e4m3fn code, and a grid whose edge blocks are cut short, whole and by ranges. */
static void test_fp8_blocks(void **state) {
    (void)state;
    char *p = fixture("fp8_blocks.safetensors");
    StSet s;
    Err err;
    assert_int_equal(st_set_open(&s, p, &err), 0);
    assert_int_equal(st_set_has_fp8(&s), 1);
    const int64_t block[2] = {3, 4};
    assert_int_equal(st_set_pair_fp8(&s, block, &err), 2);
    const StTensor *codes = st_set_find(&s, "codes.weight");
    const StTensor *ragged = st_set_find(&s, "ragged.weight");
    assert_non_null(codes->scale);
    assert_true(codes->scale == st_set_find(&s, "codes.weight_scale_inv"));
    assert_true(codes->scale->is_scale && ragged->scale->is_scale && !codes->is_scale);
    assert_true(st_set_find(&s, "codes.expected")->scale == NULL);
    float want[256], got[256];
    uint16_t want16[70];
    st_to_f32(st_set_find(&s, "codes.expected"), want);
    /* 0x7f is the first NaN code */
    assert_int_equal(st_to_f32(codes, got), 0x7f);
    check_fp8_range(codes, want, NULL, 0, 256);
    for (int c = 0; c < 256; c++) /* the inline decoder alone, too */
        if (!isnan(want[c])) assert_true(f8e4m3_to_f32((uint8_t)c) == want[c]);
    assert_true(f8e4m3_to_f32(0x7e) == 448.0f && f8e4m3_to_f32(0x01) == 0x1p-9f);
    st_to_f32(st_set_find(&s, "ragged.expected"), want);
    st_convert_range(st_set_find(&s, "ragged.expected_bf16"), DT_BF16, want16, 0, 70);
    assert_int_equal(st_to_f32(ragged, got), -1);
    check_fp8_range(ragged, want, want16, 0, 70);
    for (int64_t lo = 0; lo < 70; lo += 3) /* ranges starting and ending inside rows */
        for (int64_t n = 1; lo + n <= 70; n += 7)
            check_fp8_range(ragged, want, want16, lo, n);
    st_set_close(&s);
    /* Another block size gives other grid shapes: the first weight's scales are named. */
    assert_int_equal(st_set_open(&s, p, &err), 0);
    const int64_t wrong[2] = {4, 4};
    assert_int_equal(st_set_pair_fp8(&s, wrong, &err), -1);
    assert_non_null(strstr(err.msg, "\"codes.weight_scale_inv\" has shape [6, 4], expected "
                                    "[4, 4]"));
    assert_non_null(strstr(err.msg, "fp8_blocks.safetensors"));
    st_set_close(&s);
    free(p);
}

/* Writes w.weight (F8_E4M3, ndim / shape) with, when sdt is not DT_COUNT, w.weight_scale_inv
 * of dtype sdt and shape grid, opens the file as a set and pairs it with block; returns what
 * st_set_pair_fp8 returns (err holds its sentence). */
static int pair_written(const int64_t *shape, int ndim, DType sdt, const int64_t *grid,
                        const int64_t block[2], Err *err) {
    static const uint8_t w8[12] = {0x38, 0x40, 0xb8, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    static const int32_t i32[2] = {1, 1};
    StWriter w;
    st_writer_init(&w);
    st_writer_add(&w, "w.weight", DT_F8_E4M3, ndim, shape, w8);
    if (sdt != DT_COUNT) st_writer_add(&w, "w.weight_scale_inv", sdt, 2, grid, i32);
    char *p = tmp_path("fp8_pair.safetensors");
    assert_int_equal(st_write_finish(&w, p, err), 0);
    st_writer_free(&w);
    StSet s;
    if (st_set_open(&s, p, err) != 0) fail_msg("%s", err->msg);
    int rc = st_set_pair_fp8(&s, block, err);
    st_set_close(&s);
    free(p);
    return rc;
}

/* An F8_E4M3 weight without scales, with scales of a dtype that is not a float, or not a
 * matrix: one sentence naming the tensor. */
static void test_fp8_pairing_errors(void **state) {
    (void)state;
    const int64_t mat[2] = {3, 4}, cube[3] = {1, 3, 4}, grid[2] = {1, 2}, block[2] = {4, 2};
    const struct {
        DType scale_dtype; /* DT_COUNT: no scales */
        int cube;
        const char *want;
    } cases[] = {{DT_COUNT, 0, "has no \"w.weight_scale_inv\" (its block scales)"},
                 {DT_I32, 0, "\"w.weight_scale_inv\" has dtype I32, expected F32, BF16 or F16"},
                 {DT_F32, 1, "\"w.weight\" is F8_E4M3 with 3 dimensions"}};
    Err err;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int rc = pair_written(cases[c].cube ? cube : mat, cases[c].cube ? 3 : 2,
                              cases[c].scale_dtype, grid, block, &err);
        assert_int_equal(rc, -1);
        if (!strstr(err.msg, cases[c].want)) fail_msg("got: %s", err.msg);
    }
    /* An empty weight whose other dimension is near INT64_MAX: its block grid is counted
     * without overflow (the sanitizer build checks), and it pairs with an empty scale. */
    const int64_t wide[2] = {0, INT64_MAX}, wide_grid[2] = {0, INT64_MAX / 2 + 1};
    if (pair_written(wide, 2, DT_F32, wide_grid, block, &err) != 1) fail_msg("%s", err.msg);
}

static void test_bad_index(void **state) {
    (void)state;
    char *dir = tmp_path("idx");
    Err err;
    StSet s;
    assert_int_equal(fs_mkdirs(dir, &err), 0);
    assert_int_equal(st_set_open(&s, dir, &err), -1);
    assert_non_null(strstr(err.msg, "neither model.safetensors"));
    char *shard = fs_join(dir, "s1.safetensors");
    float v[2] = {1, 2};
    int64_t sh[1] = {2};
    StWriter w;
    st_writer_init(&w);
    st_writer_add(&w, "t1", DT_F32, 1, sh, v);
    st_writer_add(&w, "t2", DT_F32, 1, sh, v);
    assert_int_equal(st_write_finish(&w, shard, &err), 0);
    char *idx = fs_join(dir, "model.safetensors.index.json");
    struct {
        const char *json, *w1, *w2;
    } cases[] = {
        {"{\"weight_map\":{\"t1\":\"s1.safetensors\",\"t2\":\"s2.safetensors\"}}",
         "shard \"s2.safetensors\"", "does not exist"},
        {"{\"weight_map\":{\"t1\":\"s1.safetensors\",\"t9\":\"s1.safetensors\"}}", "tensor \"t9\"",
         "no such tensor"},
        {"{\"weight_map\":{\"t1\":\"../s1.safetensors\"}}", "not a plain file name", NULL},
        {"{\"weight_map\":{\"t1\":3}}", "must be a file name", NULL},
        {"{\"metadata\":{}}", "weight_map", NULL},
        {"{\"weight_map\":", "invalid JSON", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(fs_write_atomic(idx, cases[i].json, strlen(cases[i].json), &err), 0);
        err.msg[0] = 0;
        assert_int_equal(st_set_open(&s, dir, &err), -1);
        if (!strstr(err.msg, "model.safetensors.index.json") || !strstr(err.msg, cases[i].w1) ||
            (cases[i].w2 && !strstr(err.msg, cases[i].w2)))
            fail_msg("case %zu: message \"%s\"", i, err.msg);
        assert_int_equal(s.nfiles, 0);
    }
    /* The same tensor in two shards. */
    char *shard2 = fs_join(dir, "s2.safetensors");
    assert_int_equal(st_write_finish(&w, shard2, &err), 0);
    const char *dup = "{\"weight_map\":{\"t1\":\"s1.safetensors\",\"t2\":\"s2.safetensors\"}}";
    assert_int_equal(fs_write_atomic(idx, dup, strlen(dup), &err), 0);
    assert_int_equal(st_set_open(&s, dir, &err), -1);
    assert_non_null(strstr(err.msg, "appears in both"));
    st_writer_free(&w);
    free(shard2);
    free(shard);
    free(idx);
    free(dir);
}

static void test_writer_rejects(void **state) {
    (void)state;
    float v[1] = {1};
    int64_t sh[1] = {1};
    StWriter w;
    Err err;
    st_writer_init(&w);
    st_writer_add(&w, "x", DT_F32, 1, sh, v);
    st_writer_add(&w, "x", DT_F32, 1, sh, v);
    char *p = tmp_path("dup.safetensors");
    assert_int_equal(st_write_finish(&w, p, &err), -1);
    assert_non_null(strstr(err.msg, "added twice"));
    assert_false(fs_exists(p));
    st_writer_free(&w);
    free(p);
    /* Names that JSON must escape survive the trip. */
    st_writer_init(&w);
    st_writer_add(&w, "q\"uote\\back\nline\x01", DT_F32, 1, sh, v);
    p = tmp_path("esc.safetensors");
    assert_int_equal(st_write_finish(&w, p, &err), 0);
    StFile f;
    assert_int_equal(st_open(&f, p, &err), 0);
    assert_non_null(st_find(&f, "q\"uote\\back\nline\x01"));
    st_close(&f);
    st_writer_free(&w);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_fixture_read), cmocka_unit_test(test_python_fixture_bytes),
        cmocka_unit_test(test_roundtrip_f32),       cmocka_unit_test(test_roundtrip_bf16),
        cmocka_unit_test(test_roundtrip_f16),       cmocka_unit_test(test_sharded_roundtrip),
        cmocka_unit_test(test_malformed_framing),   cmocka_unit_test(test_malformed_header),
        cmocka_unit_test(test_unaligned_data),      cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_writer_rejects),      cmocka_unit_test(test_convert_finds_nonfinite),
        cmocka_unit_test(test_release_range),       cmocka_unit_test(test_fp8_blocks),
        cmocka_unit_test(test_fp8_pairing_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
