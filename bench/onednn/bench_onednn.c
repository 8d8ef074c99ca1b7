/* oneDNN on the products the trainer issues, for comparing oneDNN versions: the same source
 * builds against the 2.x API (Debian's libdnnl-dev, which CMake uses for build/bench_onednn)
 * and the 3.x API (PyPI's onednn-devel packages; bench/onednn/run.sh builds that one).
 * It uses nothing of qtitan, so a version can be measured before qtitan is ported to it.
 * Usage: bench_onednn [--reps R] [--only SUBSTRING] [--list]   (--only: products whose "shape
 * linear_product" contains it, e.g. "debugmodel" or "0.6B w13"; --list: print the products'
 * names, one a line, and time nothing) For each linear of the debugmodel
 * (512 tokens) and Qwen3-0.6B (1024 tokens) shapes, the forward Y = X W^T, the input gradient dX =
 * dY W and the weight gradient dW += dY^T X (cpu_linear.c's three calls), in fp32 through
 * dnnl_sgemm (the trainer's fp32 path) and through a matmul primitive, and in bf16 (bf16 inputs,
 * fp32 output) through a matmul primitive (the trainer's bf16 path), and for the two weight
 * products also with the weight reordered beforehand into the layout the primitive picks
 * (format_tag any; the reorder's own time printed beside it). Primitives and memory objects
 * are built once; each figure is the best of R timed calls after one warm-up call. Each call is
 * timed twice: by the wall clock and by the process's CPU time (all threads; run it with
 * OMP_WAIT_POLICY=passive so waiting threads sleep instead of spinning), because on a machine
 * shared with other jobs the wall clock mostly measures the queue for the cores while the CPU
 * time still measures the work. Prints one line per product:
 *   version shape product path GFLOP/s(wall) GFLOP/CPU-s */
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) {
    return clock_s(CLOCK_MONOTONIC);
}

static double cpu_now(void) {
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

typedef struct Product {
    const char *name;
    int ta, tb, M, N, K;
    float beta;
} Product;

static dnnl_engine_t engine;
static dnnl_stream_t stream;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != dnnl_success) {                                                              \
            fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #call);                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* C (M x N, row-major, fp32) = op(A) op(B) + beta C, as src/ops/gemm.c describes it. packed:
 * B's layout left to the primitive (format_tag any), as a weight written once per optimizer
 * step in the GEMM's own layout would be (issue 20, point 1). */
static dnnl_primitive_t build(const Product *p, int bf16, int packed) {
    dnnl_data_type_t t = bf16 ? dnnl_bf16 : dnnl_f32;
    int lda = p->ta ? p->M : p->K, ldb = p->tb ? p->K : p->N;
    dnnl_dims_t ad = {p->M, p->K}, bd = {p->K, p->N}, cd = {p->M, p->N};
    dnnl_dims_t as = {p->ta ? 1 : lda, p->ta ? lda : 1}, bs = {p->tb ? 1 : ldb, p->tb ? ldb : 1};
    dnnl_dims_t cs = {p->N, 1};
    dnnl_primitive_attr_t attr;
    CHECK(dnnl_primitive_attr_create(&attr));
    dnnl_post_ops_t po = NULL;
    if (p->beta != 0.0f) {
        CHECK(dnnl_post_ops_create(&po));
#if DNNL_VERSION_MAJOR >= 3
        CHECK(dnnl_post_ops_append_sum(po, p->beta, 0, dnnl_data_type_undef));
#else
        CHECK(dnnl_post_ops_append_sum(po, p->beta));
#endif
        CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    }
    dnnl_primitive_desc_t pd;
#if DNNL_VERSION_MAJOR >= 3
    dnnl_memory_desc_t a, b, c;
    CHECK(dnnl_memory_desc_create_with_strides(&a, 2, ad, t, as));
    if (packed)
        CHECK(dnnl_memory_desc_create_with_tag(&b, 2, bd, t, dnnl_format_tag_any));
    else
        CHECK(dnnl_memory_desc_create_with_strides(&b, 2, bd, t, bs));
    CHECK(dnnl_memory_desc_create_with_strides(&c, 2, cd, dnnl_f32, cs));
    CHECK(dnnl_matmul_primitive_desc_create(&pd, engine, a, b, NULL, c, attr));
    dnnl_memory_desc_destroy(a);
    dnnl_memory_desc_destroy(b);
    dnnl_memory_desc_destroy(c);
#else
    dnnl_memory_desc_t a, b, c;
    CHECK(dnnl_memory_desc_init_by_strides(&a, 2, ad, t, as));
    if (packed)
        CHECK(dnnl_memory_desc_init_by_tag(&b, 2, bd, t, dnnl_format_tag_any));
    else
        CHECK(dnnl_memory_desc_init_by_strides(&b, 2, bd, t, bs));
    CHECK(dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    CHECK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    CHECK(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL));
#endif
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    dnnl_primitive_t prim;
    CHECK(dnnl_primitive_create(&prim, pd));
    dnnl_primitive_desc_destroy(pd);
    return prim;
}

/* B (plain, strided as product p stores it) reordered into the layout of prim's weights, into
 * a new buffer (*out, to free); returns the reorder's best seconds over reps calls. */
static double pack_b(const Product *p, dnnl_primitive_t prim, void *B, void **out, int reps) {
    int ldb = p->tb ? p->K : p->N;
    dnnl_dims_t bd = {p->K, p->N}, bs = {p->tb ? 1 : ldb, p->tb ? ldb : 1};
    const_dnnl_primitive_desc_t pd;
    CHECK(dnnl_primitive_get_primitive_desc(prim, &pd));
#if DNNL_VERSION_MAJOR >= 3
    const_dnnl_memory_desc_t to = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
#else
    const dnnl_memory_desc_t *to = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
#endif
    *out = malloc(dnnl_memory_desc_get_size(to));
    dnnl_memory_t src, dst;
    dnnl_primitive_desc_t rpd;
#if DNNL_VERSION_MAJOR >= 3
    dnnl_memory_desc_t from;
    CHECK(dnnl_memory_desc_create_with_strides(&from, 2, bd, dnnl_bf16, bs));
    CHECK(dnnl_memory_create(&src, from, engine, B));
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, NULL));
    dnnl_memory_desc_destroy(from);
#else
    dnnl_memory_desc_t from;
    CHECK(dnnl_memory_desc_init_by_strides(&from, 2, bd, dnnl_bf16, bs));
    CHECK(dnnl_memory_create(&src, &from, engine, B));
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, &from, engine, to, engine, NULL));
#endif
    CHECK(dnnl_memory_create(&dst, to, engine, *out));
    dnnl_primitive_t r;
    CHECK(dnnl_primitive_create(&r, rpd));
    dnnl_primitive_desc_destroy(rpd);
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) {
        double t0 = now();
        CHECK(dnnl_primitive_execute(r, stream, 2, a));
        CHECK(dnnl_stream_wait(stream));
        double dt = now() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    dnnl_primitive_destroy(r);
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(dst);
    return best;
}

/* Best GFLOP/s of reps timed calls of one product on one path (0 sgemm, 1 matmul fp32,
 * 2 matmul bf16, 3 matmul bf16 with B packed beforehand, whose reorder's best seconds go to
 * *pack_s); the best GFLOP per CPU-second goes to *cpu_rate. */
static double time_product(const Product *p, int path, int reps, void *A, void *B, float *C,
                           double *pack_s, double *cpu_rate) {
    int lda = p->ta ? p->M : p->K, ldb = p->tb ? p->K : p->N;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3];
    dnnl_exec_arg_t args[3];
    void *packed = NULL;
    if (path > 0) {
        prim = build(p, path >= 2, path == 3);
        if (path == 3) *pack_s = pack_b(p, prim, B, &packed, reps);
        const_dnnl_primitive_desc_t pd;
        CHECK(dnnl_primitive_get_primitive_desc(prim, &pd));
        dnnl_query_t q[3] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
        int kind[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        void *buf[3] = {A, packed ? packed : B, C};
        for (int i = 0; i < 3; i++) {
            CHECK(dnnl_memory_create(&mem[i], dnnl_primitive_desc_query_md(pd, q[i], 0), engine,
                                     buf[i]));
            args[i] = (dnnl_exec_arg_t){kind[i], mem[i]};
        }
    }
    double best = 1e30, best_cpu = 1e30;
    for (int rep = 0; rep <= reps; rep++) {
        double t0 = now(), c0 = cpu_now();
        if (path == 0)
            CHECK(dnnl_sgemm(p->ta ? 'T' : 'N', p->tb ? 'T' : 'N', p->M, p->N, p->K, 1.0f, A, lda,
                             B, ldb, p->beta, C, p->N));
        else {
            CHECK(dnnl_primitive_execute(prim, stream, 3, args));
            CHECK(dnnl_stream_wait(stream));
        }
        double dt = now() - t0, dc = cpu_now() - c0;
        if (rep > 0 && dt < best) best = dt; /* call 0 warms caches (and JITs) */
        if (rep > 0 && dc < best_cpu) best_cpu = dc;
    }
    if (prim) {
        for (int i = 0; i < 3; i++)
            dnnl_memory_destroy(mem[i]);
        dnnl_primitive_destroy(prim);
    }
    free(packed);
    double gflop = 2.0 * p->M * p->N * p->K * 1e-9;
    *cpu_rate = gflop / best_cpu;
    return gflop / best;
}

typedef struct Shape {
    const char *name;
    int tokens, D, HE, KE, F, V;
} Shape;

int main(int argc, char **argv) {
    int reps = 3, list = 0;
    const char *only = "";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--list") == 0)
            list = 1;
        else {
            fprintf(stderr, "usage: bench_onednn [--reps R] [--only SUBSTRING] [--list]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    const dnnl_version_t *v = dnnl_version();
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", v->major, v->minor, v->patch);
    const Shape shapes[] = {
        {"debugmodel", 512, 256, 2048, 1024, 3072, 2048},
        {"0.6B", 1024, 1024, 2048, 1024, 3072, 151936},
    };
    const char *paths[] = {"sgemm_f32", "matmul_f32", "matmul_bf16", "matmul_bf16_packed"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const Shape *sh = &shapes[s];
        /* (name, in, out) of each linear; w1 and w3 share a shape. */
        struct {
            const char *name;
            int in, out;
        } lin[] = {{"wq", sh->D, sh->HE}, {"wkv", sh->D, sh->KE}, {"wo", sh->HE, sh->D},
                   {"w13", sh->D, sh->F}, {"w2", sh->F, sh->D},   {"lm_head", sh->D, sh->V}};
        for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
            int N = sh->tokens, I = lin[l].in, O = lin[l].out;
            Product prods[3] = {{"fwd", 0, 1, N, O, I, 0.0f},
                                {"dX", 0, 0, N, I, O, 0.0f},
                                {"dW", 1, 0, O, I, N, 1.0f}};
            if (list) {
                for (int k = 0; k < 3; k++) {
                    char name[96];
                    snprintf(name, sizeof name, "%s %s_%s", sh->name, lin[l].name, prods[k].name);
                    if (strstr(name, only)) printf("%s\n", name);
                }
                continue;
            }
            size_t big = (size_t)O * I > (size_t)N * O ? (size_t)O * I : (size_t)N * O;
            if ((size_t)N * I > big) big = (size_t)N * I;
            float *A = malloc(big * 4), *B = malloc(big * 4), *C = malloc(big * 4);
            uint16_t *Ah = malloc(big * 2), *Bh = malloc(big * 2);
            for (size_t i = 0; i < big; i++) {
                A[i] = (float)((i * 7) % 13) * 0.01f;
                B[i] = (float)((i * 5) % 11) * 0.01f;
                C[i] = 0.0f;
                Ah[i] = (uint16_t)(0x3c00 + (i * 7) % 64); /* bf16 values near 0.01 */
                Bh[i] = (uint16_t)(0x3c00 + (i * 5) % 64);
            }
            for (int k = 0; k < 3; k++) {
                char name[96];
                snprintf(name, sizeof name, "%s %s_%s", sh->name, lin[l].name, prods[k].name);
                if (!strstr(name, only)) continue;
                /* Packing B only pays for the weight products (fwd, dX), not dW's X. */
                int npaths = k < 2 ? 4 : 3;
                for (int path = 0; path < npaths; path++) {
                    double pack_s = 0, cpu_rate = 0;
                    double g = time_product(&prods[k], path, reps, path >= 2 ? (void *)Ah : A,
                                            path >= 2 ? (void *)Bh : B, C, &pack_s, &cpu_rate);
                    if (path == 3)
                        printf("%s %s %s %.1f %.1f (reorder %.4f s)\n", ver, name, paths[path], g,
                               cpu_rate, pack_s);
                    else
                        printf("%s %s %s %.1f %.1f\n", ver, name, paths[path], g, cpu_rate);
                    fflush(stdout);
                }
            }
            free(A);
            free(B);
            free(C);
            free(Ah);
            free(Bh);
        }
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    return 0;
}
