/* GEMM backends behind ops/gemm.h: the reference loops, oneDNN matmul primitives (cached per
 * problem, the default) and dnnl_sgemm. The cache exists because creating a matmul primitive
 * costs 0.1-1 ms (JIT code generation) while a training step repeats the same few dozen
 * shapes thousands of times. */
#include "ops/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/err.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/op_profile.h"

void gemm_f32_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (long)i * ldc;
        if (beta == 0.0f)
            for (int j = 0; j < N; j++)
                c[j] = 0.0f;
        else if (beta != 1.0f)
            for (int j = 0; j < N; j++)
                c[j] *= beta;
        for (int k = 0; k < K; k++) {
            float a = alpha * (ta ? A[(long)k * lda + i] : A[(long)i * lda + k]);
            if (!tb) {
                const float *b = B + (long)k * ldb;
                for (int j = 0; j < N; j++)
                    c[j] += a * b[j];
            } else {
                for (int j = 0; j < N; j++)
                    c[j] += a * B[(long)j * ldb + k];
            }
        }
    }
}

typedef enum Backend { BK_REF, BK_DNNL, BK_SGEMM, BK_AUTO } Backend;
static const char *const backend_names[] = {"ref", "dnnl", "sgemm", "auto"};
#define N_BACKENDS 4

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static Backend g_backend = BK_AUTO;
static dnnl_engine_t g_engine;
static char g_desc[160];

/* ---- oneDNN matmul primitive cache ------------------------------------------------------ */

typedef struct Key {
    int bf16, ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
} Key;

typedef struct Entry {
    Key key;
    dnnl_primitive_t prim; /* NULL: oneDNN has no implementation for this problem */
    size_t scratch_bytes;
    /* The primitive's scratchpad, allocated on its first run and reused, so repeated problems
     * (every training step after the first) allocate nothing here; busy guards it when two
     * threads run the same problem at once (the second then takes its own, as before). */
    void *scratch;
    int busy;
    struct Entry *next;
} Entry;

/* Chained table; entries live until exit. Past CACHE_MAX entries new problems get a
 * primitive that is built, run and destroyed per call, so a stream of ever-new shapes cannot
 * grow memory without bound. */
#define CACHE_BUCKETS 1024
#define CACHE_MAX 4096
static Entry *g_buckets[CACHE_BUCKETS];
static int g_count;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const Key *k) {
    /* FNV-1a over the fields; the struct has no padding (ints and floats only). */
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int key_eq(const Key *a, const Key *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

/* Builds the matmul primitive for one problem; NULL when oneDNN cannot (e.g. bf16 on a CPU
 * without AVX-512). Scratchpad is user-managed so concurrent calls never share one. */
static dnnl_primitive_t build_matmul(const Key *k, size_t *scratch_bytes) {
    dnnl_data_type_t in_t = k->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {k->M, k->K}, b_dims = {k->K, k->N}, c_dims = {k->M, k->N};
    /* op(A)(m,k) sits at m*lda+k, or at k*lda+m when A is stored transposed. */
    dnnl_dims_t a_str = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
    dnnl_dims_t b_str = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
    dnnl_dims_t c_str = {k->ldc, 1};
    if (dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, in_t, a_str) ||
        dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, in_t, b_str) ||
        dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str))
        return NULL;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md)) return NULL;
    dnnl_primitive_attr_t attr;
    if (dnnl_primitive_attr_create(&attr)) return NULL;
    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (k->alpha != 1.0f) dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
    dnnl_post_ops_t po = NULL;
    if (k->beta != 0.0f) {
        dnnl_post_ops_create(&po);
        dnnl_post_ops_append_sum(po, k->beta);
        dnnl_primitive_attr_set_post_ops(attr, po);
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return NULL;
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    *scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    dnnl_primitive_t prim = NULL;
    st = dnnl_primitive_create(&prim, pd);
    dnnl_primitive_desc_destroy(pd);
    return st == dnnl_success ? prim : NULL;
}

/* Runs prim on the given buffers with scratch (scratch_bytes of it; NULL: a block allocated for
 * this call); returns 0 on success. */
static int run_matmul(dnnl_primitive_t prim, size_t scratch_bytes, void *scratch, const void *A,
                      const void *B, float *C) {
    const dnnl_memory_desc_t *md;
    const_dnnl_primitive_desc_t pd;
    if (dnnl_primitive_get_primitive_desc(prim, &pd)) return -1;
    dnnl_memory_t mem[4] = {0};
    int args_kind[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    void *bufs[4] = {(void *)A, (void *)B, C, NULL};
    dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                         dnnl_query_scratchpad_md};
    int n = scratch_bytes ? 4 : 3, rc = -1;
    void *own = NULL;
    if (scratch_bytes && !scratch) {
        if (posix_memalign(&own, 64, scratch_bytes)) return -1;
        scratch = own;
    }
    bufs[3] = scratch;
    dnnl_exec_arg_t args[4];
    dnnl_stream_t stream = NULL;
    for (int i = 0; i < n; i++) {
        md = dnnl_primitive_desc_query_md(pd, q[i], 0);
        if (!md || dnnl_memory_create(&mem[i], md, g_engine, bufs[i])) goto out;
        args[i] = (dnnl_exec_arg_t){args_kind[i], mem[i]};
    }
    if (dnnl_stream_create(&stream, g_engine, dnnl_stream_default_flags)) goto out;
    if (dnnl_primitive_execute(prim, stream, n, args) || dnnl_stream_wait(stream)) goto out;
    rc = 0;
out:
    if (stream) dnnl_stream_destroy(stream);
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    free(own);
    return rc;
}

/* Looks the problem up (building it on a miss) and runs it; -1 when oneDNN cannot. */
static int matmul_cached(const Key *k, const void *A, const void *B, float *C) {
    uint64_t h = key_hash(k) % CACHE_BUCKETS;
    pthread_mutex_lock(&g_lock);
    Entry *e = g_buckets[h];
    while (e && !key_eq(&e->key, k))
        e = e->next;
    if (!e && g_count < CACHE_MAX) {
        e = calloc(1, sizeof *e);
        if (e) {
            e->key = *k;
            e->prim = build_matmul(k, &e->scratch_bytes);
            if (!e->prim) /* once per problem: the fallback is correct but slow */
                log_warn("gemm: oneDNN has no %s matmul for ta=%d tb=%d M=%d N=%d K=%d lda=%d "
                         "ldb=%d ldc=%d; using the %s fallback",
                         k->bf16 ? "bf16" : "fp32", k->ta, k->tb, k->M, k->N, k->K, k->lda, k->ldb,
                         k->ldc, k->bf16 ? "fp32-conversion" : "reference");
            e->next = g_buckets[h];
            g_buckets[h] = e;
            g_count++;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (e && !e->prim) return -1;
    if (e) {
        if (__atomic_exchange_n(&e->busy, 1, __ATOMIC_ACQUIRE))
            return run_matmul(e->prim, e->scratch_bytes, NULL, A, B, C);
        if (e->scratch_bytes && !e->scratch && posix_memalign(&e->scratch, 64, e->scratch_bytes))
            e->scratch = NULL; /* run_matmul then allocates for the call */
        int rc = run_matmul(e->prim, e->scratch_bytes, e->scratch, A, B, C);
        __atomic_store_n(&e->busy, 0, __ATOMIC_RELEASE);
        return rc;
    }
    size_t sb = 0;
    dnnl_primitive_t p = build_matmul(k, &sb);
    if (!p) return -1;
    int rc = run_matmul(p, sb, NULL, A, B, C);
    dnnl_primitive_destroy(p);
    return rc;
}

/* ---- backend selection ------------------------------------------------------------------ */

/* Names the implementation oneDNN picks for a 64^3 product of the given type, or NULL. */
static const char *probe_impl(int bf16) {
    Key k = {bf16, 0, 0, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f};
    size_t sb;
    dnnl_primitive_t p = build_matmul(&k, &sb);
    if (!p) return NULL;
    const_dnnl_primitive_desc_t pd;
    const char *s = NULL;
    static char buf[2][64];
    if (!dnnl_primitive_get_primitive_desc(p, &pd) &&
        !dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) && s) {
        snprintf(buf[bf16], sizeof buf[bf16], "%s", s);
        s = buf[bf16];
    }
    dnnl_primitive_destroy(p);
    return s ? s : "?";
}

static void describe(void) {
    const dnnl_version_t *v = dnnl_version();
    int nt = omp_get_max_threads();
    if (g_backend == BK_REF) {
        snprintf(g_desc, sizeof g_desc, "reference loops (fp32; bf16 converted), %d threads", nt);
    } else if (g_backend == BK_AUTO) {
        const char *b = probe_impl(1);
        snprintf(g_desc, sizeof g_desc,
                 "oneDNN %d.%d.%d (fp32 via dnnl_sgemm, bf16 via %s), %d threads", v->major,
                 v->minor, v->patch, b ? b : "fp32 conversion", nt);
    } else if (g_backend == BK_SGEMM) {
        snprintf(g_desc, sizeof g_desc,
                 "oneDNN %d.%d.%d dnnl_sgemm (fp32; bf16 converted to fp32), %d threads", v->major,
                 v->minor, v->patch, nt);
    } else {
        const char *f = probe_impl(0), *b = probe_impl(1);
        char bdesc[96];
        if (b)
            snprintf(bdesc, sizeof bdesc, "bf16 via %s", b);
        else
            snprintf(bdesc, sizeof bdesc, "bf16 converted to fp32 (no oneDNN bf16 on this CPU)");
        snprintf(g_desc, sizeof g_desc, "oneDNN %d.%d.%d matmul (fp32 via %s, %s), %d threads",
                 v->major, v->minor, v->patch, f ? f : "?", bdesc, nt);
    }
}

static int parse_backend(const char *name, Backend *out) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (strcmp(name, backend_names[i]) == 0) {
            *out = (Backend)i;
            return 0;
        }
    return -1;
}

static void init_once(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
    const char *env = getenv("QT_GEMM");
    if (env && *env && parse_backend(env, &g_backend) != 0)
        log_warn("gemm: QT_GEMM=%s is not one of auto, dnnl, sgemm, ref; using auto", env);
    if (!g_engine && g_backend != BK_REF) {
        log_warn("gemm: oneDNN CPU engine unavailable; using the reference loops");
        g_backend = BK_REF;
    }
    describe();
    log_info("gemm: %s", g_desc);
}

int gemm_set_backend(const char *name) {
    pthread_once(&g_once, init_once);
    if (parse_backend(name, &g_backend) != 0) return -1;
    if (!g_engine) g_backend = BK_REF;
    describe();
    return 0;
}

const char *gemm_backend_name(void) {
    pthread_once(&g_once, init_once);
    return g_desc;
}

/* ---- entry points ----------------------------------------------------------------------- */

/* Problems every backend agrees on without calling it: empty C, or K = 0 (C = beta*C). */
static int trivial(int M, int N, int K, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 1;
    if (K > 0) return 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(long)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(long)i * ldc + j];
    return 1;
}

static void gemm_f32_run(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc) {
    pthread_once(&g_once, init_once);
    if (trivial(M, N, K, beta, C, ldc)) return;
    if (g_backend == BK_DNNL) {
        Key k = {0, !!ta, !!tb, M, N, K, lda, ldb, ldc, alpha, beta};
        if (matmul_cached(&k, A, B, C) == 0) return;
    } else if (g_backend == BK_SGEMM || g_backend == BK_AUTO) {
        if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc) == dnnl_success)
            return;
    }
    gemm_f32_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Widens rows x cols bf16 values (row stride ld) into a dense fp32 copy. */
static float *widen(const uint16_t *X, int rows, int cols, int ld) {
    float *out = xmalloc((size_t)rows * cols * sizeof *out);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[(long)r * cols + c] = bf16_to_f32(X[(long)r * ld + c]);
    return out;
}

/* The fallback for bf16: the products of bf16 values are exact in fp32, so this differs from a
 * native bf16 kernel only in summation order. */
static void bf16_widened(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                         int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    float *a = widen(A, ta ? K : M, ta ? M : K, lda);
    float *b = widen(B, tb ? N : K, tb ? K : N, ldb);
    gemm_f32_run(ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, C, ldc);
    free(a);
    free(b);
}

/* oneDNN 2.6's bf16 matmul slows down on very long reductions: the LM head's dX = dlogits E
 * (K = 151936) ran at 245 GFLOP/s on 2 threads against 450-700 when cut into K chunks of about
 * 8192 summed into C (bench/README.md "GEMM"). The cut depends on K alone, so results stay
 * reproducible. */
#define BF16_K_SPLIT 16384
#define BF16_K_CHUNK 8192

static void gemm_bf16_run(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                          int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    pthread_once(&g_once, init_once);
    if (trivial(M, N, K, beta, C, ldc)) return;
    if (g_backend != BK_DNNL && g_backend != BK_AUTO) {
        bf16_widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int chunks = K > BF16_K_SPLIT ? (K + BF16_K_CHUNK - 1) / BF16_K_CHUNK : 1;
    int kc = (K + chunks - 1) / chunks;
    for (int k0 = 0; k0 < K; k0 += kc) {
        int k = K - k0 < kc ? K - k0 : kc;
        /* op(A)[:, k0:k0+k] and op(B)[k0:k0+k, :] */
        const uint16_t *a = A + (ta ? (long)k0 * lda : k0);
        const uint16_t *b = B + (tb ? k0 : (long)k0 * ldb);
        float bt = k0 == 0 ? beta : 1.0f;
        Key key = {1, !!ta, !!tb, M, N, k, lda, ldb, ldc, alpha, bt};
        if (matmul_cached(&key, a, b, C) != 0)
            bf16_widened(ta, tb, M, N, k, alpha, a, lda, b, ldb, bt, C, ldc);
    }
}

/* The public entry points time each GEMM for the op profile (ops/op_profile.h) and, with its
 * shape, for a profiler trace (core/trace.h). */
static void gemm_timed(const char *name, int M, int N, int K, double t0) {
    prof_gemm_add(now_seconds() - t0);
    if (!trace_recording()) return; /* inside a parallel region: on the calling thread's track */
    char args[64];
    snprintf(args, sizeof args, "\"M\": %d, \"N\": %d, \"K\": %d", M, N, K);
    trace_span(name, NULL, "gemm", t0, args);
}

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    double t0 = prof_timing() ? now_seconds() : 0;
    gemm_f32_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (t0 > 0) gemm_timed("gemm_f32", M, N, K, t0);
}

void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
               const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    double t0 = prof_timing() ? now_seconds() : 0;
    gemm_bf16_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (t0 > 0) gemm_timed("gemm_bf16", M, N, K, t0);
}
