/* GEMM backends behind ops/gemm.h: the reference loops, oneDNN matmul primitives (cached per
 * problem) and dnnl_sgemm, and the choice of path for bf16 products: oneDNN's bf16 matmul, or
 * dnnl_sgemm on widened operands where fp32 FMA is the faster unit. The cache exists because
 * creating a matmul primitive costs 0.1-1 ms (JIT code generation) while a training step
 * repeats the same few dozen shapes thousands of times. */
#include "ops/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/err.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/peak_record.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/gemm_amx.h"
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

/* How bf16 products run under auto (QT_GEMM_BF16=auto|widen|onednn|amx): oneDNN's bf16 matmul,
 * dnnl_sgemm on operands widened to fp32, or qtitan's AMX tile kernel (kernels/gemm_amx.h) for
 * every product with K <= BF16_K_SPLIT and oneDNN's matmul beyond (the LM head's dX, where
 * oneDNN's K chunks measured faster: bench/README.md "AMX tiles"). The products of bf16 values
 * are exact in fp32, so all compute the same sums in a different order. widen is one choice;
 * onednn and amx are the native ones, which checkpoints and ranks agree on as "not widened":
 * the native path of a host with AMX is amx. */
typedef enum Bf16Path {
    BF16_AUTO,
    BF16_WIDEN = GEMM_BF16_WIDEN,
    BF16_ONEDNN = GEMM_BF16_ONEDNN,
    BF16_AMX = GEMM_BF16_AMX
} Bf16Path;
static const char *const bf16_path_names[] = GEMM_BF16_PATH_NAMES;
#define N_BF16_PATHS 4
_Static_assert(GEMM_AMX_SCRATCH_BYTES <= GEMM_BF16_SCRATCH_BYTES,
               "the AMX path packs into the bf16 scratch");

/* oneDNN 2.6's bf16 matmul slows down on very long reductions: the LM head's dX = dlogits E
 * (K = 151936) ran at 245 GFLOP/s on 2 threads against 450-700 when cut into K chunks of about
 * 8192 summed into C (bench/README.md "GEMM"). The widened path cuts K the same way, so its
 * blocks of widened operands stay bounded. The cut depends on K alone, so results stay
 * reproducible. */
#define BF16_K_SPLIT 16384
#define BF16_K_CHUNK 8192

static pthread_once_t g_once = PTHREAD_ONCE_INIT, g_bf16_once = PTHREAD_ONCE_INIT;
static Backend g_backend = BK_AUTO;
static Bf16Path g_bf16 = BF16_AUTO; /* never BF16_AUTO after bf16_path() */
static dnnl_engine_t g_engine;
static char g_desc[384];
static char g_bf16_why[192];
static Bf16Path g_bf16_adopted = BF16_AUTO;   /* gemm_bf16_adopt: another process's choice */
static Bf16Path g_bf16_preferred = BF16_AUTO; /* gemm_bf16_prefer: a resumed run's */
static char g_bf16_preferred_why[96];

/* fp32 under auto: dnnl_sgemm, except products x W^T (op(B) = B^T, a linear's forward) of
 * GEMM_F32_MATMUL_M_MIN to GEMM_F32_MATMUL_M_MAX rows (ops/gemm.h), which take the matmul
 * primitive. sgemm packs all of B^T on every call, work that grows with N x K whatever M is; from
 * 16 rows on (below, a kernel for few rows takes them) it ran 20-30 GFLOP/s at 16-24 rows and 60-70
 * at 64 on 0.6B weights, where the matmul primitive ran 130-175, and the primitive still led
 * by 1.5x at 256 rows (AMD EPYC, 2 threads; bench/README.md, "Products of few rows"). Such products
 * are a prompt or an eval line of a few dozen tokens, or a small micro-batch (a MoE expert's rows
 * change from call to call: gemm_f32_varying). From 512 rows on the two are even on that host, and
 * sgemm led by 10-18% on an Intel Xeon, so larger products stay on sgemm. */
static int small_m_matmul(int tb, int M, int shape_kept) {
    /* Not inside a parallel region: threads there run the same shape at once, and all but one
     * would take a scratchpad of their own per call (matmul_cached). */
    return g_backend == BK_AUTO && shape_kept && tb && M >= GEMM_F32_MATMUL_M_MIN &&
           M <= GEMM_F32_MATMUL_M_MAX && !omp_in_parallel();
}

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
                         k->ldc,
                         k->bf16                ? "fp32-conversion"
                         : g_backend == BK_AUTO ? "dnnl_sgemm"
                                                : "reference");
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

/* Seconds of one PROBE_N^3 product: dnnl_sgemm on fp32 (bf16 0) or oneDNN's bf16 matmul
 * (bf16 1); a negative value when it cannot run. The size is a small model product (512-token
 * rows against a 512-wide weight block): large enough for both to reach their steady rate,
 * about 1-2 ms each on this 2-core host. */
#define PROBE_N 512
#define PROBE_REPS 8
static double probe_once(int bf16, const float *A, const uint16_t *Ah, float *C) {
    const int n = PROBE_N;
    Key k = {1, 0, 0, n, n, n, n, n, n, 1.0f, 0.0f};
    double t0 = now_seconds();
    int rc = bf16 ? matmul_cached(&k, Ah, Ah, C)
                  : dnnl_sgemm('N', 'N', n, n, n, 1.0f, A, n, A, n, 0.0f, C, n) != dnnl_success;
    return rc ? -1.0 : now_seconds() - t0;
}

/* The bf16 path under auto: QT_GEMM_BF16 when set; with AMX the tiles, untimed (a tile
 * multiplies at 16x the FMA unit's rate per cycle, and the one timing that ever picked the
 * widened route on an AMX host was a loaded one: sgemm 53 GFLOP/s against the bf16 matmul's
 * 39, both a tenth of their rates, while the test suite ran on both cores); else the faster of
 * the two on this host. Without AMX the bf16 unit (vdpbf16ps) runs at half the fp32 FMA rate
 * on some CPUs and at twice it on others. The ISA's expectation (widened) stands unless
 * oneDNN's bf16 matmul is PROBE_MARGIN times faster. The two are timed in turn, best of
 * PROBE_REPS each, so a busy stretch hits both, and each rate is kept as the best this machine
 * has shown (core/peak_record.h, units PROBE_UNIT_F32 and PROBE_UNIT_BF16): the choice follows
 * the best rates, not this run's. On a loaded machine single timings swing by a factor (the
 * test suite on two cores: sgemm 21-86 GFLOP/s against 24-67 for a bf16 matmul that runs at
 * 430 when quiet), and a choice made afresh in each process made two runs of one config
 * differ in their last bits; with the records it changes only while a record is still rising. */
#define PROBE_MARGIN 1.25
#define PROBE_UNIT_F32 "gemm probe sgemm"
#define PROBE_UNIT_BF16 "gemm probe bf16 matmul"

/* This run's GFLOP/s of a probe unit taken into the machine's record; returns the best. */
static double probe_best(const char *unit, double gflops, long *runs) {
    PeakRecord self;
    peak_record_this_machine(&self, unit, omp_get_max_threads());
    char *dir = fs_cache_dir("peaks"), *path = peak_record_path(dir, &self);
    double best = 1e3 * peak_record_update(path, &self, gflops * 1e-3, runs);
    free(path);
    free(dir);
    return best;
}
static Bf16Path native_path(void) {
    return gemm_amx_ready() ? BF16_AMX : BF16_ONEDNN;
}

static void choose_bf16_path(void) {
    if (g_bf16_adopted != BF16_AUTO) {
        g_bf16 = g_bf16_adopted;
        snprintf(g_bf16_why, sizeof g_bf16_why, "%s: rank 0's choice, which every rank runs",
                 bf16_path_names[g_bf16]);
        return;
    }
    const char *env = getenv("QT_GEMM_BF16");
    g_bf16 = BF16_AUTO;
    if (env && *env) {
        for (int i = 0; i < N_BF16_PATHS; i++)
            if (strcmp(env, bf16_path_names[i]) == 0) g_bf16 = (Bf16Path)i;
        if (g_bf16 == BF16_AUTO && strcmp(env, "auto") != 0)
            log_warn("gemm: QT_GEMM_BF16=%s is not one of auto, widen, onednn, amx; using auto",
                     env);
        if (g_bf16 == BF16_AMX && !gemm_amx_ready()) {
            log_warn("gemm: QT_GEMM_BF16=amx but this CPU (or kernel) offers no AMX; using auto");
            g_bf16 = BF16_AUTO;
        }
    }
    if (g_bf16 != BF16_AUTO) {
        snprintf(g_bf16_why, sizeof g_bf16_why, "QT_GEMM_BF16=%s", bf16_path_names[g_bf16]);
        return;
    }
    if (g_bf16_preferred != BF16_AUTO) {
        g_bf16 = g_bf16_preferred;
        snprintf(g_bf16_why, sizeof g_bf16_why, "%s", g_bf16_preferred_why);
        return;
    }
    const char *impl = probe_impl(1);
    if (!impl) {
        g_bf16 = BF16_WIDEN;
        snprintf(g_bf16_why, sizeof g_bf16_why, "no oneDNN bf16 on this CPU");
        return;
    }
    if (strstr(impl, "amx")) {
        g_bf16 = native_path();
        snprintf(g_bf16_why, sizeof g_bf16_why, "AMX, taken without timing");
        return;
    }
    const int n = PROBE_N;
    float *A = xmalloc((size_t)n * n * sizeof *A), *C = xmalloc((size_t)n * n * sizeof *C);
    uint16_t *Ah = xmalloc((size_t)n * n * sizeof *Ah);
    for (long i = 0; i < (long)n * n; i++) {
        A[i] = (float)(i % 7 - 3) * 0.125f;
        Ah[i] = f32_to_bf16(A[i]);
    }
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep <= PROBE_REPS; rep++) /* rep 0 warms up (and JIT-compiles) */
        for (int bf16 = 0; bf16 < 2; bf16++) {
            double t = probe_once(bf16, A, Ah, C);
            if (rep > 0 && t >= 0 && t < best[bf16]) best[bf16] = t;
        }
    free(A), free(Ah), free(C);
    double flop = 2.0 * n * n * n, f32 = flop / best[0] * 1e-9, b16 = flop / best[1] * 1e-9;
    long runs = 1;
    double f32_best = probe_best(PROBE_UNIT_F32, f32, &runs);
    double b16_best = probe_best(PROBE_UNIT_BF16, b16, &runs);
    g_bf16 = b16_best > PROBE_MARGIN * f32_best ? BF16_ONEDNN : BF16_WIDEN;
    snprintf(g_bf16_why, sizeof g_bf16_why,
             "no AMX; on %d^3 sgemm %.0f GFLOP/s, bf16 matmul %.0f: the best of %ld run(s) on this "
             "machine, this run %.0f and %.0f",
             n, f32_best, b16_best, runs, f32, b16);
}

static void describe(void);
static void init_once(void);

/* Logs the backend line: once at the first GEMM, once more when the bf16 path is chosen; even
 * when first reached from a quiet check. */
static void announce(void) {
    describe();
    int was = log_set_info(1);
    log_info("gemm: %s", g_desc);
    log_set_info(was);
}

/* The bf16 path is chosen (and, under auto, timed) at the first bf16 product or question, not
 * at the first GEMM: a process that multiplies in fp32 alone (eval, fp32 generate) never pays
 * for the probe products. */
static void choose_bf16_once(void) {
    if (g_engine) choose_bf16_path();
    announce();
}

static Bf16Path bf16_path(void) {
    pthread_once(&g_once, init_once);
    pthread_once(&g_bf16_once, choose_bf16_once);
    return g_bf16;
}

/* 1 when bf16 products run as fp32 GEMMs on widened operands under the active backend. */
static int widens(void) {
    return g_backend == BK_AUTO ? bf16_path() == BF16_WIDEN
                                : g_backend != BK_DNNL || !probe_impl(1);
}

static void describe(void) {
    const dnnl_version_t *v = dnnl_version();
    int nt = omp_get_max_threads();
    if (g_backend == BK_REF) {
        snprintf(g_desc, sizeof g_desc, "reference loops (fp32; bf16 widened), %d threads", nt);
    } else if (g_backend == BK_AUTO) {
        char bdesc[256];
        if (g_bf16 == BF16_AUTO)
            snprintf(bdesc, sizeof bdesc, "bf16 path picked at the first bf16 product");
        else if (g_bf16 == BF16_WIDEN)
            snprintf(bdesc, sizeof bdesc, "bf16 as dnnl_sgemm on widened operands (%s)",
                     g_bf16_why);
        else if (g_bf16 == BF16_AMX)
            snprintf(bdesc, sizeof bdesc, "bf16 via qtitan's AMX tiles, oneDNN %s beyond K %d (%s)",
                     probe_impl(1), BF16_K_SPLIT, g_bf16_why);
        else
            snprintf(bdesc, sizeof bdesc, "bf16 via %s (%s)", probe_impl(1), g_bf16_why);
        snprintf(g_desc, sizeof g_desc,
                 "oneDNN %d.%d.%d (fp32 via dnnl_sgemm, x W^T of %d-%d rows via matmul; %s), %d "
                 "threads",
                 v->major, v->minor, v->patch, GEMM_F32_MATMUL_M_MIN, GEMM_F32_MATMUL_M_MAX, bdesc,
                 nt);
    } else if (g_backend == BK_SGEMM) {
        snprintf(g_desc, sizeof g_desc,
                 "oneDNN %d.%d.%d dnnl_sgemm (fp32; bf16 widened to fp32), %d threads", v->major,
                 v->minor, v->patch, nt);
    } else {
        const char *f = probe_impl(0), *b = probe_impl(1);
        char bdesc[96];
        if (b)
            snprintf(bdesc, sizeof bdesc, "bf16 via %s", b);
        else
            snprintf(bdesc, sizeof bdesc, "bf16 widened to fp32 (no oneDNN bf16 on this CPU)");
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
    announce();
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

int gemm_bf16_widens(void) {
    pthread_once(&g_once, init_once);
    return widens();
}

int gemm_bf16_path(void) {
    pthread_once(&g_once, init_once);
    if (g_backend != BK_AUTO) return widens() ? GEMM_BF16_WIDEN : GEMM_BF16_ONEDNN;
    return (int)bf16_path();
}

/* A path this process can run: amx needs AMX. */
static int runnable(int path) {
    return path == BF16_WIDEN || path == BF16_ONEDNN || (path == BF16_AMX && gemm_amx_ready());
}

int gemm_bf16_adopt(int path) {
    pthread_once(&g_once, init_once);
    if (g_backend != BK_AUTO) return 0; /* a forced backend decides the same on every rank */
    if (!runnable(path)) return -1;
    g_bf16_adopted = (Bf16Path)path;
    pthread_once(&g_bf16_once, choose_bf16_once); /* chosen now, or already before */
    return (int)g_bf16 == path ? 0 : -1;
}

void gemm_bf16_prefer(int path, const char *why) {
    pthread_once(&g_once, init_once);
    if (g_backend != BK_AUTO || !runnable(path)) return; /* a forced backend decides alike */
    g_bf16_preferred = (Bf16Path)path;
    snprintf(g_bf16_preferred_why, sizeof g_bf16_preferred_why, "%s", why);
}

/* ---- widened weight copies -------------------------------------------------------------- */

/* Live regions of widened copies. Only models and training slots register, a handful at a
 * time; a linear scan under a lock costs nanoseconds per product. */
#define MAX_REGIONS 64
static struct {
    const float *base;
    size_t n;
} g_regions[MAX_REGIONS];
static pthread_mutex_t g_region_lock = PTHREAD_MUTEX_INITIALIZER;

uint16_t *gemm_widened_register(float *base, size_t n) {
    uint16_t *handle = NULL;
    pthread_mutex_lock(&g_region_lock);
    for (int i = 0; i < MAX_REGIONS && !handle; i++)
        if (!g_regions[i].base) {
            g_regions[i].base = base, g_regions[i].n = n;
            handle = (uint16_t *)(void *)base;
        }
    pthread_mutex_unlock(&g_region_lock);
    return handle;
}

void gemm_widened_unregister(const float *base) {
    pthread_mutex_lock(&g_region_lock);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (g_regions[i].base == base) g_regions[i].base = NULL, g_regions[i].n = 0;
    pthread_mutex_unlock(&g_region_lock);
}

float *gemm_widened_values(const uint16_t *p) {
    float *out = NULL;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_region_lock);
    for (int i = 0; i < MAX_REGIONS && !out; i++) {
        uintptr_t h = (uintptr_t)g_regions[i].base;
        if (h && a >= h && a < h + g_regions[i].n * sizeof(uint16_t))
            out = (float *)g_regions[i].base + (a - h) / sizeof(uint16_t);
    }
    pthread_mutex_unlock(&g_region_lock);
    return out;
}

/* ---- weights prepacked for the AMX path ------------------------------------------------- */

/* Registered weights: W (rows x cols), its forward form op(B) = W^T at fwd and its backward
 * form op(B) = W at bwd (gemm_amx_prepack layouts). A model registers one per matmul weight
 * (a few hundred); a scan under a lock, after a range check that turns away every other
 * operand, costs well under a microsecond per product. */
#define MAX_PACKED 2048
typedef struct Packed {
    const uint16_t *w;
    int rows, cols;
    uint16_t *fwd, *bwd;
} Packed;
static Packed g_packed[MAX_PACKED];
static int g_npacked;
static uintptr_t g_packed_lo = UINTPTR_MAX, g_packed_hi; /* every registered W lies within */
static pthread_mutex_t g_packed_lock = PTHREAD_MUTEX_INITIALIZER;

int gemm_bf16_prepacks(void) {
    const char *e = getenv("QT_GEMM_PREPACK");
    if (e && strcmp(e, "0") == 0) return 0;
    pthread_once(&g_once, init_once);
    return g_backend == BK_AUTO && bf16_path() == BF16_AMX;
}

size_t gemm_bf16_packed_values(int rows, int cols) {
    return gemm_amx_packed_values(cols, rows) + gemm_amx_packed_values(rows, cols);
}

int gemm_bf16_pack_register(const uint16_t *w, int rows, int cols, uint16_t *dst) {
    pthread_mutex_lock(&g_packed_lock);
    int rc = -1;
    if (g_npacked < MAX_PACKED) {
        g_packed[g_npacked++] =
            (Packed){w, rows, cols, dst, dst + gemm_amx_packed_values(cols, rows)};
        if ((uintptr_t)w < g_packed_lo) g_packed_lo = (uintptr_t)w;
        if ((uintptr_t)w > g_packed_hi) g_packed_hi = (uintptr_t)w;
        rc = 0;
    }
    pthread_mutex_unlock(&g_packed_lock);
    return rc;
}

void gemm_bf16_pack_unregister(const void *base, size_t bytes) {
    uintptr_t lo = (uintptr_t)base, hi = lo + bytes;
    pthread_mutex_lock(&g_packed_lock);
    int n = 0;
    for (int i = 0; i < g_npacked; i++)
        if ((uintptr_t)g_packed[i].w < lo || (uintptr_t)g_packed[i].w >= hi)
            g_packed[n++] = g_packed[i];
    g_npacked = n;
    pthread_mutex_unlock(&g_packed_lock);
}

/* The entry of W, copied out; 0 when W is not registered. */
static int packed_entry(const uint16_t *w, Packed *out) {
    uintptr_t a = (uintptr_t)w;
    int found = 0;
    pthread_mutex_lock(&g_packed_lock);
    if (a >= g_packed_lo && a <= g_packed_hi)
        for (int i = 0; i < g_npacked && !found; i++)
            if (g_packed[i].w == w) *out = g_packed[i], found = 1;
    pthread_mutex_unlock(&g_packed_lock);
    return found;
}

void gemm_bf16_weight_written(const uint16_t *w) {
    Packed p;
    if (!packed_entry(w, &p)) return;
    int tok = prof_begin("bf16 weight prepack", "", 0);
    gemm_amx_prepack(w, 1, p.cols, p.cols, p.rows, p.fwd);
    gemm_amx_prepack(w, 0, p.cols, p.rows, p.cols, p.bwd);
    prof_end(tok);
}

/* The packed form of op(B) when B is a registered weight, whole, in one of its two roles. */
static const uint16_t *packed_form(const uint16_t *B, int tb, int ldb, int K, int N) {
    Packed p;
    if (!packed_entry(B, &p) || ldb != p.cols) return NULL;
    if (tb && K == p.cols && N == p.rows) return p.fwd;
    if (!tb && K == p.rows && N == p.cols) return p.bwd;
    return NULL;
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

/* shape_kept: the caller repeats this shape (gemm_f32), so a primitive built for it is reused;
 * 0 for gemm_f32_varying. */
static void gemm_f32_run(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc, int shape_kept) {
    pthread_once(&g_once, init_once);
    if (trivial(M, N, K, beta, C, ldc)) return;
    if (g_backend == BK_DNNL || small_m_matmul(tb, M, shape_kept)) {
        Key k = {0, !!ta, !!tb, M, N, K, lda, ldb, ldc, alpha, beta};
        if (matmul_cached(&k, A, B, C) == 0) return;
    }
    if (g_backend == BK_SGEMM || g_backend == BK_AUTO) {
        if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc) == dnnl_success)
            return;
    }
    gemm_f32_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- bf16 products on widened operands -------------------------------------------------- */

/* Values per widened block of one operand; a block of the other operand shares the scratch
 * (GEMM_BF16_SCRATCH_BYTES in all). With K cut at BF16_K_SPLIT a block keeps >= 256 rows. */
#define WIDEN_CAP (GEMM_BF16_SCRATCH_BYTES / 2 / sizeof(float))

/* The K chunk length of a bf16 product with reduction length K. */
static int k_chunk(int K) {
    int chunks = K > BF16_K_SPLIT ? (K + BF16_K_CHUNK - 1) / BF16_K_CHUNK : 1;
    return (K + chunks - 1) / chunks;
}

/* Scratch for widened blocks, allocated on first use and kept: products run one at a time in a
 * step, so one buffer serves them and a step allocates nothing. Concurrent callers (tests,
 * products issued inside a parallel region) take the next free buffer, or one of their own for
 * that call when all are busy. */
#define N_SCRATCH 4
static struct {
    float *buf;
    int busy;
} g_scratch[N_SCRATCH];

static float *scratch_take(int *slot) {
    for (int i = 0; i < N_SCRATCH; i++)
        if (!__atomic_exchange_n(&g_scratch[i].busy, 1, __ATOMIC_ACQUIRE)) {
            if (!g_scratch[i].buf) g_scratch[i].buf = xmalloc(GEMM_BF16_SCRATCH_BYTES);
            *slot = i;
            return g_scratch[i].buf;
        }
    *slot = -1;
    return xmalloc(GEMM_BF16_SCRATCH_BYTES);
}

static void scratch_give(float *buf, int slot) {
    if (slot < 0)
        free(buf);
    else
        __atomic_store_n(&g_scratch[slot].busy, 0, __ATOMIC_RELEASE);
}

/* Seconds spent widening on the thread that drives the step (the op profile's thread), kept
 * out of the GEMM time so the profile shows them as their own row. */
static double g_widen_seconds;

/* One operand op(X) of a bf16 product: bf16 values at h (row stride ld, stored transposed when
 * t), or a widened weight copy when w is set (the same element at w). */
typedef struct Operand {
    const uint16_t *h;
    const float *w;
    int t, ld;
} Operand;

/* op(X)[r0:r0+nr, c0:c0+nc] as fp32: in place for a widened copy, else widened into buf
 * (dense). Returns its address; *ld gets its row stride as stored. */
static const float *block(const Operand *x, int r0, int c0, int nr, int nc, float *buf, int *ld) {
    int sr0 = x->t ? c0 : r0, sc0 = x->t ? r0 : c0;
    int rows = x->t ? nc : nr, cols = x->t ? nr : nc;
    if (x->w) {
        *ld = x->ld;
        return x->w + (long)sr0 * x->ld + sc0;
    }
    const uint16_t *src = x->h + (long)sr0 * x->ld + sc0;
    double t0 = prof_timing() ? now_seconds() : 0;
    int tok = prof_begin("bf16 widen (inside GEMMs)", "", 0);
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            buf[(long)r * cols + c] = bf16_to_f32(src[(long)r * x->ld + c]);
    prof_end(tok);
    if (tok >= 0) g_widen_seconds += now_seconds() - t0;
    *ld = cols;
    return buf;
}

/* C = alpha op(A) op(B) + beta C as fp32 GEMMs: the products of bf16 values are exact in fp32,
 * so this differs from a native bf16 kernel only in summation order. Operands that are not
 * widened copies are widened in blocks of at most WIDEN_CAP values (K cut as k_chunk cuts it,
 * then M or N), so nothing here grows with the problem. */
static void bf16_widened(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                         int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    Operand a = {A, gemm_widened_values(A), ta, lda}, b = {B, gemm_widened_values(B), tb, ldb};
    int kc = k_chunk(K);
    int mc = a.w || (long)M * kc <= (long)WIDEN_CAP ? M : (int)(WIDEN_CAP / kc);
    int nc = b.w || (long)N * kc <= (long)WIDEN_CAP ? N : (int)(WIDEN_CAP / kc);
    int slot;
    float *buf = a.w && b.w ? NULL : scratch_take(&slot);
    for (int k0 = 0; k0 < K; k0 += kc) {
        int k = K - k0 < kc ? K - k0 : kc;
        float bt = k0 == 0 ? beta : 1.0f;
        const float *aw = NULL; /* op(A)'s block, kept across N blocks when M is not cut */
        int ldaw = 0;
        for (int n0 = 0; n0 < N; n0 += nc) {
            int n = N - n0 < nc ? N - n0 : nc, ldbw;
            const float *bw = block(&b, k0, n0, k, n, buf ? buf + WIDEN_CAP : NULL, &ldbw);
            for (int m0 = 0; m0 < M; m0 += mc) {
                int m = M - m0 < mc ? M - m0 : mc;
                if (!aw || mc < M) aw = block(&a, m0, k0, m, k, buf, &ldaw);
                gemm_f32_run(ta, tb, m, n, k, alpha, aw, ldaw, bw, ldbw, bt,
                             C + (long)m0 * ldc + n0, ldc, 1);
            }
        }
    }
    if (buf) scratch_give(buf, slot);
}

static void gemm_bf16_run(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                          int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    pthread_once(&g_once, init_once);
    if (trivial(M, N, K, beta, C, ldc)) return;
    int onednn = g_backend == BK_DNNL || (g_backend == BK_AUTO && bf16_path() != BF16_WIDEN);
    if (!onednn || gemm_widened_values(A) || gemm_widened_values(B)) {
        bf16_widened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (g_backend == BK_AUTO && g_bf16 == BF16_AMX) {
        const uint16_t *bp = packed_form(B, tb, ldb, K, N);
        if (bp || K <= BF16_K_SPLIT) {
            int slot;
            float *buf = scratch_take(&slot);
            int rc = bp ? gemm_amx_bf16_packed(ta, M, N, K, alpha, A, lda, bp, beta, C, ldc, buf)
                        : gemm_amx_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, buf);
            scratch_give(buf, slot);
            if (rc == 0) return;
        }
    }
    int kc = k_chunk(K);
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
static void gemm_timed(const char *name, int M, int N, int K, double t0, double excluded) {
    prof_gemm_add(now_seconds() - t0 - excluded);
    if (!trace_recording()) return; /* inside a parallel region: on the calling thread's track */
    char args[64];
    snprintf(args, sizeof args, "\"M\": %d, \"N\": %d, \"K\": %d", M, N, K);
    trace_span(name, NULL, "gemm", t0, args);
}

/* gemm_f32_run timed into the op profile, as both entries below are. */
static void gemm_f32_timed(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc,
                           int shape_kept) {
    double t0 = prof_timing() ? now_seconds() : 0;
    gemm_f32_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, shape_kept);
    if (t0 > 0) gemm_timed("gemm_f32", M, N, K, t0, 0);
}

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    gemm_f32_timed(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1);
}

void gemm_f32_varying(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    gemm_f32_timed(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0);
}

void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
               const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    double t0 = prof_timing() ? now_seconds() : 0, widen0 = g_widen_seconds;
    gemm_amx_pack_timing(t0 > 0 && !omp_in_parallel());
    double pack0 = gemm_amx_pack_seconds();
    gemm_bf16_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    double packing = gemm_amx_pack_seconds() - pack0;
    if (packing > 0) prof_gemm_part("bf16 operand packing (inside GEMMs)", packing);
    if (t0 > 0) gemm_timed("gemm_bf16", M, N, K, t0, g_widen_seconds - widen0 + packing);
}
