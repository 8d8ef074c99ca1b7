/* Unit tests for src/core: dtype conversion, rng, arena, strings, file helpers, JSON errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/strutil.h"

static void test_bf16_rounding(void **state) {
    (void)state;
    /* 1 + 2^-8 is exactly halfway between two bf16 values; ties go to even (1.0). */
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
    /* 1 + 3*2^-8 is halfway too; the even neighbour is 1 + 2^-6. */
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f);
}

static void test_f16_roundtrip(void **state) {
    (void)state;
    const float exact[] = {0.0f, 1.0f, -2.0f, 65504.0f, 0x1p-14f, 0x1p-24f, 0.333251953125f};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        assert_true(f16_to_f32(f32_to_f16(exact[i])) == exact[i]);
    assert_true(isinf(f16_to_f32(f32_to_f16(1e6f))));
    /* 1 + 2^-11 ties to even: 1.0. */
    assert_true(f16_to_f32(f32_to_f16(1.0f + 0x1p-11f)) == 1.0f);
}

static void test_rng_streams(void **state) {
    (void)state;
    Rng a, b, c;
    rng_seed(&a, 42, 0);
    rng_seed(&b, 42, 0);
    rng_seed(&c, 42, 1);
    int same = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = rng_u64(&a);
        assert_true(x == rng_u64(&b));
        same += x == rng_u64(&c);
    }
    assert_true(same == 0);
    double sum = 0, sq = 0;
    for (int i = 0; i < 100000; i++) {
        float z = rng_normal(&a);
        sum += z;
        sq += z * z;
    }
    assert_true(fabs(sum / 100000) < 0.02);
    assert_true(fabs(sq / 100000 - 1.0) < 0.02);
}

/* The counter-based fill gives the same bits on 1, 2 and 3 threads and for a prefix (so the
 * vector body and the scalar remainder agree wherever a thread's share starts or ends), is
 * the Box-Muller pair of its documented bits to libm's accuracy, and is normal(0, std). */
static void test_rng_counter_fill(void **state) {
    (void)state;
    enum { N = 200001, SHORT = 1001 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(SHORT * sizeof *c);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    rng_fill_normal_counter(7, 3, a, N, 0.5f);
    for (int t = 2; t <= 3; t++) {
        omp_set_num_threads(t);
        rng_fill_normal_counter(7, 3, b, N, 0.5f);
        assert_memory_equal(a, b, N * sizeof *a);
    }
    omp_set_num_threads(threads);
    rng_fill_normal_counter(7, 3, c, SHORT, 0.5f);
    assert_memory_equal(a, c, SHORT * sizeof *a);
    /* A piece from an even offset is that run of the whole (an odd length ends on a cosine). */
    rng_fill_normal_counter_at(7, 3, c, 1000, 37, 0.5f);
    assert_memory_equal(a + 1000, c, 37 * sizeof *a);
    rng_fill_normal_counter(7, 4, b, N, 0.5f);
    int same = 0;
    for (long i = 0; i < N; i++)
        same += a[i] == b[i];
    assert_true(same < 10);

    double err = 0, sum = 0, sq = 0;
    for (long i = 0; i < N; i++) {
        uint64_t h = rng_counter_u64(7, 3, (uint64_t)i / 2);
        double u = (double)((h >> 40) + 1) / 16777216.0;
        double angle = 6.283185307179586 * (double)(h & 0xffffff) / 16777216.0;
        double z = sqrt(-2.0 * log(u)) * (i % 2 ? sin(angle) : cos(angle));
        double e = fabs(a[i] - 0.5 * z) / (1.0 + fabs(z));
        err = e > err ? e : err;
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    assert_true(err < 1e-6);
    double mean = sum / N, sd = sqrt(sq / N - mean * mean);
    /* The standard error of the mean is 0.5 / sqrt(N) = 0.0011. */
    assert_true(fabs(mean) < 0.005);
    assert_true(fabs(sd - 0.5) < 0.005);
    free(a);
    free(b);
    free(c);
}

static void test_arena_counting_matches(void **state) {
    (void)state;
    Arena count, real;
    Err err;
    arena_init_counting(&count, "test");
    assert_null(arena_alloc(&count, 10));
    assert_null(arena_floats(&count, 100));
    assert_int_equal(arena_init(&real, "test", count.used, &err), 0);
    char *p = arena_alloc(&real, 10);
    float *q = arena_floats(&real, 100);
    assert_true(((uintptr_t)p & 63) == 0 && ((uintptr_t)q & 63) == 0);
    assert_true(real.used == count.used);
    arena_free(&real);
}

/* arena_init maps (and so clears) every page before it returns, on all threads, so the first
 * step takes no page fault there (core/device.c); the memory reads as zeros. mincore() reports
 * an anonymous page resident only once it is mapped. */
static void test_arena_pages_mapped(void **state) {
    (void)state;
    long page = sysconf(_SC_PAGESIZE);
    int before = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        size_t bytes = (size_t)page * 2053 + 100; /* pages not a multiple of the threads */
        Arena a;
        Err err;
        assert_int_equal(arena_init(&a, "test", bytes, &err), 0);
        size_t npages = (a.capacity + (size_t)page - 1) / (size_t)page;
        unsigned char *vec = malloc(npages);
        assert_int_equal(mincore(a.base, a.capacity, vec), 0);
        size_t resident = 0;
        for (size_t i = 0; i < npages; i++)
            resident += vec[i] & 1;
        assert_int_equal(resident, npages);
        for (size_t i = 0; i < a.capacity; i += 4093)
            assert_int_equal(a.base[i], 0);
        free(vec);
        arena_free(&a);
    }
    omp_set_num_threads(before);
}

/* An arena knows its device; on the CPU the host view is the memory itself (no copy), and a
 * build without a GPU backend finds no "cuda" device. */
static void test_arena_device(void **state) {
    (void)state;
    Arena a, count;
    Err err;
    arena_init_counting(&count, "test");
    assert_null(count.device);
    assert_int_equal(arena_init(&a, "test", 256, &err), 0);
    assert_ptr_equal(a.device, &device_cpu);
    float *p = arena_floats(&a, 16), staging[16];
    p[3] = 2.5f;
    const float *h = device_host_view(a.device, staging, p, 16 * sizeof *p);
    assert_ptr_equal(h, p);
    assert_true(h[3] == 2.5f);
    assert_ptr_equal(device_find("cpu"), &device_cpu);
    assert_null(device_find("cuda"));
    arena_free(&a);
}

static void test_strings(void **state) {
    (void)state;
    assert_int_equal(str_edit_distance("kitten", "sitting"), 3);
    const char *names[] = {"local_batch_size", "global_batch_size", "seq_len"};
    assert_string_equal(str_nearest("local_bach_size", names, 3), "local_batch_size");
    assert_null(str_nearest("completely_unrelated_words", names, 3));
    assert_true(str_glob_match("layers.*.attention.rope", "layers.3.attention.rope"));
    assert_true(str_glob_match("*.rope", "layers.12.attention.rope"));
    assert_false(str_glob_match("layers.*.attention.rope", "layers.3.attention.sdpa"));
    assert_true(str_glob_match("layers.1*", "layers.12.moe"));
    assert_false(str_glob_match("layers.1", "layers.12"));
}

static void test_fs_atomic_and_json_errors(void **state) {
    (void)state;
    char dir[] = "/tmp/qt_core_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = fs_join(dir, "a.json");
    Err err;
    const char *bad = "{\n  \"a\": 1,\n  \"b\": }\n";
    assert_int_equal(fs_write_atomic(path, bad, strlen(bad), &err), 0);
    assert_null(json_load_path(path, &err));
    /* The sentence names the file and the line of the fault. */
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, ":3:"));
    const char *good = "{\"n\": 3, \"s\": \"x\"}";
    assert_int_equal(fs_write_atomic(path, good, strlen(good), &err), 0);
    json_t *j = json_load_path(path, &err);
    assert_non_null(j);
    int64_t n = 0;
    assert_int_equal(json_req_int(j, "n", &n, path, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(json_req_int(j, "s", &n, path, &err), -1);
    assert_non_null(strstr(err.msg, "\"s\" must be an integer"));
    assert_int_equal(json_req_int(j, "missing", &n, path, &err), -1);
    json_decref(j);
    assert_true(fs_exists_in(dir, "a.json"));
    assert_false(fs_exists_in(dir, "b.json"));
    char *sub = fs_join(dir, "x/y/z");
    assert_int_equal(fs_mkdirs(sub, &err), 0);
    assert_true(fs_is_dir(sub));
    assert_int_equal(fs_remove_tree(dir, &err), 0);
    assert_false(fs_exists(dir));
    free(sub);
    free(path);
    /* folder keys relative to job.dump_folder: an absolute one is used as it is */
    char *rel = fs_resolve("runs/a", "checkpoint"), *abs = fs_resolve("runs/a", "/data/ckpt");
    assert_string_equal(rel, "runs/a/checkpoint");
    assert_string_equal(abs, "/data/ckpt");
    free(rel);
    free(abs);
    /* fs_path_under, by text: the spellings of one folder and of folders inside it. */
    const char *under[][2] = {{"out/merged", "out/merged"},
                              {"out/./merged/", "out//merged"},
                              {"out/merged/ck", "out/merged"},
                              {"out/x/../merged", "out/merged"},
                              {"/a/b", "/"},
                              {"../m", ".."},
                              {"a/..", "."},
                              {"/../a", "/a"}};
    for (size_t i = 0; i < sizeof under / sizeof under[0]; i++)
        if (!fs_path_under(under[i][0], under[i][1])) fail_msg("%s %s", under[i][0], under[i][1]);
    const char *apart[][2] = {{"out/merged2", "out/merged"},
                              {"out", "out/merged"},
                              {"out/merged/../ck", "out/merged"},
                              {"m", "../m"}};
    for (size_t i = 0; i < sizeof apart / sizeof apart[0]; i++)
        if (fs_path_under(apart[i][0], apart[i][1])) fail_msg("%s %s", apart[i][0], apart[i][1]);
    /* fs_dir_of, as dirname(1). */
    const char *dirs[][2] = {{"a/b", "a"}, {"a/b/", "a"},  {"a//b", "a"},    {"/x", "/"},
                             {"/", "/"},   {"//", "/"},    {"x", "."},       {"", "."},
                             {"x/", "."},  {"/a/b", "/a"}, {"./t.json", "."}};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char *d = fs_dir_of(dirs[i][0]);
        if (strcmp(d, dirs[i][1]) != 0) fail_msg("fs_dir_of(\"%s\") = \"%s\"", dirs[i][0], d);
        free(d);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_roundtrip),
        cmocka_unit_test(test_rng_streams),
        cmocka_unit_test(test_rng_counter_fill),
        cmocka_unit_test(test_arena_counting_matches),
        cmocka_unit_test(test_arena_device),
        cmocka_unit_test(test_arena_pages_mapped),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_fs_atomic_and_json_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
