/* Multi-process test program for src/dist, run under mpirun by tests/e2e_mpi_comm.sh.
 *   mpi_comm collectives   every collective, the mesh and FSDP, each checked against a serial
 *                          computation that every rank repeats locally from the same seeds
 *   mpi_comm abort         rank 1 fails and calls comm_abort while the others wait
 *   mpi_comm exit          the last rank exits(4) without MPI_Finalize mid-collective
 *   mpi_comm bench [N]     times the rank-ordered all-reduce and reduce-scatter of N floats
 *                          against MPI_Allreduce / MPI_Reduce_scatter_block (not a test)
 * Every rank regenerates every other rank's inputs (rng stream = rank), so the reference is
 * computed without communication. A failed check ends the whole job through comm_abort. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/log.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/fsdp.h"
#include "dist/mesh.h"

static Comm *W;
static int checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            char m_[512];                                                                          \
            int k_ = snprintf(m_, sizeof m_, "%s:%d: check failed: ", __FILE__, __LINE__);         \
            snprintf(m_ + k_, sizeof m_ - (size_t)k_, __VA_ARGS__);                                \
            comm_abort(1, m_);                                                                     \
        }                                                                                          \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        Err e_ = {{0}};                                                                            \
        if ((call) != 0) {                                                                         \
            char m_[1200];                                                                         \
            snprintf(m_, sizeof m_, "%s:%d: %s", __FILE__, __LINE__, e_.msg);                      \
            comm_abort(1, m_);                                                                     \
        }                                                                                          \
    } while (0)
#define E (&e_)

/* The values rank `r` contributes to test `tag`. */
static void fill(float *x, size_t n, int tag, int r) {
    Rng g;
    rng_seed(&g, 1000 + (uint64_t)tag, (uint64_t)r);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_normal(&g) * (float)(1 + (i % 7) * 1000);
}

/* Serial reference: rank-order sum of every rank's `fill` in fp32. */
static void serial_sum(float *out, size_t n, int tag, int P) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (int r = 0; r < P; r++) {
        fill(x, n, tag, r);
        for (size_t i = 0; i < n; i++)
            out[i] = r == 0 ? x[i] : out[i] + x[i];
    }
    free(x);
}

static void test_all_reduce(void) {
    int P = W->size;
    const size_t sizes[] = {1, 2, 3, 5, 1000, 4097, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want);
        fill(x, n, (int)k, W->rank);
        serial_sum(want, n, (int)k, P);
        OK(comm_all_reduce_sum(W, x, n, COMM_F32, E));
        CHECK(memcmp(x, want, n * sizeof *x) == 0, "f32 all-reduce of %zu differs from serial", n);
        free(x);
        free(want);
    }
    /* Doubles: rank r contributes 1/(r+3) and r*1e10; rank order makes it exact to compare. */
    double d[2] = {1.0 / (W->rank + 3), W->rank * 1e10}, want[2] = {0, 0};
    for (int r = 0; r < P; r++)
        want[0] = r ? want[0] + 1.0 / (r + 3) : 1.0 / 3, want[1] += r * 1e10;
    OK(comm_all_reduce_sum(W, d, 2, COMM_F64, E));
    CHECK(d[0] == want[0] && d[1] == want[1], "f64 all-reduce %.17g vs %.17g", d[0], want[0]);
}

static void test_broadcast_gather_scatter(void) {
    int P = W->size, me = W->rank;
    double blob[3] = {me, me * 2.0, -1};
    OK(comm_broadcast(W, blob, sizeof blob, P - 1, E));
    CHECK(blob[0] == P - 1 && blob[1] == 2.0 * (P - 1), "broadcast from root %d", P - 1);

    const size_t n = 7;
    float mine[7], *all = malloc(n * P * sizeof *all), *want = malloc(n * sizeof *want);
    fill(mine, n, 50, me);
    OK(comm_all_gather(W, all, mine, n, COMM_F32, E));
    for (int r = 0; r < P; r++) {
        fill(want, n, 50, r);
        CHECK(memcmp(all + r * n, want, n * sizeof *want) == 0, "all-gather chunk %d", r);
    }
    /* Reduce-scatter: everyone contributes n*P, keeps the sum of its chunk. */
    float *in = malloc(n * P * sizeof *in), *ref = malloc(n * P * sizeof *ref), out[7];
    fill(in, n * P, 51, me);
    serial_sum(ref, n * P, 51, P);
    OK(comm_reduce_scatter_sum(W, out, in, n, COMM_F32, E));
    CHECK(memcmp(out, ref + me * n, n * sizeof *out) == 0, "reduce-scatter chunk %d", me);

    /* Two outstanding non-blocking collectives, completed in reverse order. */
    CommReq *rg, *rs;
    float out2[7], *all2 = malloc(n * P * sizeof *all2);
    OK(comm_iall_gather(W, all2, mine, n, COMM_F32, &rg, E));
    OK(comm_ireduce_scatter_sum(W, out2, in, n, COMM_F32, &rs, E));
    OK(comm_wait(W, rs, E));
    OK(comm_wait(W, rg, E));
    CHECK(memcmp(all2, all, n * P * sizeof *all) == 0, "non-blocking all-gather");
    CHECK(memcmp(out2, out, sizeof out) == 0, "non-blocking reduce-scatter");

    /* A ninth outstanding collective is refused with a sentence, identically on every rank,
     * and the eight in flight still complete. */
    CommReq *many[9];
    float *sink = malloc(9 * n * P * sizeof *sink);
    for (int i = 0; i < 8; i++)
        OK(comm_iall_gather(W, sink + i * n * P, mine, n, COMM_F32, &many[i], E));
    Err e9 = {{0}};
    CHECK(comm_iall_gather(W, sink + 8 * n * P, mine, n, COMM_F32, &many[8], &e9) == -1 &&
              strstr(e9.msg, "more than 8 non-blocking collectives are outstanding") != NULL,
          "ninth outstanding collective: '%s'", e9.msg);
    for (int i = 7; i >= 0; i--)
        OK(comm_wait(W, many[i], E));
    CHECK(memcmp(sink + 7 * n * P, all, n * P * sizeof *all) == 0, "pooled all-gather");
    free(sink);
    free(all);
    free(all2);
    free(want);
    free(in);
    free(ref);
}

static void test_split(void) {
    int P = W->size, me = W->rank;
    Comm *sub;
    /* Even and odd ranks, each group ordered by descending world rank. */
    OK(comm_split(W, me % 2, -me, &sub, E));
    int members = 0, my_index = 0;
    double want = 0;
    for (int r = P - 1; r >= 0; r--)
        if (r % 2 == me % 2) {
            if (r == me) my_index = members;
            members++;
            want += r;
        }
    CHECK(sub->size == members && sub->rank == my_index, "split: rank %d of %d, want %d of %d",
          sub->rank, sub->size, my_index, members);
    double v = me;
    OK(comm_all_reduce_sum(sub, &v, 1, COMM_F64, E));
    CHECK(v == want, "split all-reduce %g, want %g", v, want);
    OK(comm_barrier(sub, E));
    comm_destroy(sub);
}

/* All-to-all with per-peer counts: rank r sends (r + p) % 3 elements to rank p (some empty),
 * each element naming its sender, receiver and position, so every byte's route is checked. */
static void test_all_to_all_v(void) {
    int P = W->size, me = W->rank;
    size_t *sc = calloc((size_t)P, sizeof *sc), *rc = calloc((size_t)P, sizeof *rc);
    size_t ns = 0, nr = 0;
    for (int p = 0; p < P; p++) {
        sc[p] = (size_t)((me + p) % 3), rc[p] = (size_t)((p + me) % 3);
        ns += sc[p], nr += rc[p];
    }
    float *in = malloc((ns + 1) * sizeof *in), *out = malloc((nr + 1) * sizeof *out);
    size_t at = 0;
    for (int p = 0; p < P; p++)
        for (size_t i = 0; i < sc[p]; i++)
            in[at++] = (float)(me * 10000 + p * 100 + (int)i);
    OK(comm_all_to_all_v(W, out, rc, in, sc, COMM_F32, E));
    at = 0;
    for (int p = 0; p < P; p++)
        for (size_t i = 0; i < rc[p]; i++, at++)
            CHECK(out[at] == (float)(p * 10000 + me * 100 + (int)i),
                  "all-to-all: element %zu from rank %d is %g", i, p, out[at]);
    free(in), free(out), free(sc), free(rc);
}

/* A failure on one rank becomes the same error on all: no rank is left waiting. */
static void test_agree(void) {
    Err e = {{0}};
    OK(comm_agree(W, 0, E));
    int fails = W->rank == W->size - 1 || W->rank == 1 % W->size;
    int rc = fails ? err_set(&e, "could not open data/rows-%d.bin", W->rank) : 0;
    rc = comm_agree(W, rc, &e);
    char want[64];
    int first = 1 % W->size;
    if (W->size == 1)
        snprintf(want, sizeof want, "could not open data/rows-0.bin");
    else
        snprintf(want, sizeof want, "rank %d: could not open data/rows-%d.bin", first, first);
    CHECK(rc == -1 && strcmp(e.msg, want) == 0, "comm_agree gave %d '%s', want '%s'", rc, e.msg,
          want);
}

/* Checks that every sub-communicator of the mesh holds exactly the ranks that share its
 * coordinates: the sum of world ranks over each group equals the sum computed from
 * mesh_rank_of. */
static void test_mesh(int R, int S, int T) {
    MeshConfig c = {.dp_replicate = R,
                    .dp_shard = S,
                    .tp = T,
                    .n_heads = 16,
                    .n_kv_heads = 8,
                    .local_batch = 1};
    Mesh m;
    OK(mesh_create(&m, W, &c, E));
    const MeshDims *d = &m.dims;
    CHECK(mesh_rank_of(d, d->r, d->s, d->t) == W->rank, "mesh coordinates");
    double want[4] = {0, 0, 0, 0};
    for (int r = 0; r < d->dp_replicate; r++)
        want[0] += mesh_rank_of(d, r, d->s, d->t);
    for (int s = 0; s < d->dp_shard; s++)
        want[1] += mesh_rank_of(d, d->r, s, d->t);
    for (int t = 0; t < d->tp; t++)
        want[2] += mesh_rank_of(d, d->r, d->s, t);
    for (int r = 0; r < d->dp_replicate; r++)
        for (int s = 0; s < d->dp_shard; s++)
            want[3] += mesh_rank_of(d, r, s, d->t);
    Comm *groups[4] = {m.dp_replicate, m.dp_shard, m.tp, m.dp};
    const int index[4] = {d->r, d->s, d->t, d->dp_rank};
    for (int g = 0; g < 4; g++) {
        double v = W->rank;
        OK(comm_all_reduce_sum(groups[g], &v, 1, COMM_F64, E));
        CHECK(v == want[g], "mesh %dx%dx%d group %d sums %g, want %g", R, S, T, g, v, want[g]);
        CHECK(groups[g]->rank == index[g], "mesh group %d rank %d, want %d", g, groups[g]->rank,
              index[g]);
    }
    /* Global norm: tp-sharded squares differ on every rank and add over dp_shard and tp;
     * tp-replicated ones are equal across tp and add over dp_shard only; replicas (other r)
     * are not added. */
    double norm, want_sq = 0;
    for (int s = 0; s < d->dp_shard; s++) {
        want_sq += 0.5 * (s + 1);
        for (int t = 0; t < d->tp; t++)
            want_sq += mesh_rank_of(d, d->r, s, t) + 1;
    }
    OK(mesh_global_norm(&norm, &m, W->rank + 1, 0.5 * (d->s + 1), E));
    CHECK(fabs(norm - sqrt(want_sq)) <= 1e-12 * sqrt(want_sq),
          "mesh %dx%dx%d norm %.17g, want %.17g", R, S, T, norm, sqrt(want_sq));
    mesh_destroy(&m);
}

/* FSDP on a mesh [R, S, 1]: gather gives back the full parameters; reduce-scatter (and the
 * replica all-reduce) gives each rank its piece of the serial sum of all ranks' gradients;
 * the global norm matches a serial one. Gradients of rank w for unit u come from fill(tag
 * 100 + u, w). */
static void test_fsdp(int R) {
    MeshConfig c = {.dp_replicate = R, .dp_shard = -1, .tp = 1, .local_batch = 1};
    Mesh m;
    OK(mesh_create(&m, W, &c, E));
    const size_t numel[] = {1000, 17, 3, 4096, 77, 5};
    const int unit[] = {0, 0, 1, 1, 2, 2};
    const int NPAR = 6, NUNIT = 3;
    FsdpPlan p;
    OK(fsdp_plan(&p, numel, unit, NPAR, NUNIT, m.dims.dp_shard, m.dims.s, E));
    float *params[6];
    for (int i = 0; i < NPAR; i++) {
        params[i] = malloc(numel[i] * sizeof(float));
        fill(params[i], numel[i], 90 + i, 0);
    }
    float *shard = malloc(p.shard_numel * sizeof *shard);
    fsdp_shard_from_full(&p, shard, (const float *const *)params);
    float *full[2] = {malloc(p.max_full_numel * sizeof(float)),
                      malloc(p.max_full_numel * sizeof(float))};
    /* Gather unit 0 blocking, then units 1 and 2 with prefetch into alternating buffers. */
    OK(fsdp_gather_unit(&p, m.dp_shard, full[0], shard, 0, COMM_F32, E));
    for (int u = 0; u < NUNIT; u++) {
        FsdpReq next;
        if (u + 1 < NUNIT)
            OK(fsdp_gather_unit_start(&p, m.dp_shard, full[(u + 1) % 2], shard, u + 1, COMM_F32,
                                      &next, E));
        for (int i = 0; i < NPAR; i++)
            if (unit[i] == u)
                CHECK(memcmp(full[u % 2] + p.params[i].full_offset, params[i],
                             numel[i] * sizeof(float)) == 0,
                      "gathered parameter %d", i);
        if (u + 1 < NUNIT) {
            /* Poll until the prefetch has moved (every rank polls, so it progresses), then
             * complete it. */
            int done = 0;
            long spins = 0;
            while (!done && spins++ < 100000000L)
                OK(fsdp_test(m.dp_shard, &next, &done, E));
            CHECK(done, "prefetch of unit %d never finished", u + 1);
            OK(fsdp_wait(m.dp_shard, &next, E));
        }
    }
    /* A bf16 shard (a LoRA run's bf16 base) gathers the same layout in half the bytes: every
     * unit's parameters arrive as the bf16 bit patterns of the fp32 ones, and a sum of bf16 is
     * refused. */
    uint16_t *bshard = malloc(p.shard_numel * sizeof *bshard);
    uint16_t *bfull = malloc(p.max_full_numel * sizeof *bfull);
    for (size_t i = 0; i < p.shard_numel; i++)
        bshard[i] = f32_to_bf16(shard[i]);
    for (int u = 0; u < NUNIT; u++) {
        OK(fsdp_gather_unit(&p, m.dp_shard, bfull, bshard, u, COMM_BF16, E));
        for (int i = 0; i < NPAR; i++)
            for (size_t j = 0; unit[i] == u && j < numel[i]; j++)
                CHECK(bfull[p.params[i].full_offset + j] == f32_to_bf16(params[i][j]),
                      "bf16 gather of parameter %d element %zu", i, j);
    }
    Err berr;
    CHECK(comm_all_reduce_sum(m.dp_shard, bfull, 4, COMM_BF16, &berr) == -1 &&
              strstr(berr.msg, "not bf16"),
          "an all-reduce of bf16 is refused");
    free(bshard);
    free(bfull);
    /* Gradients: every unit twice (two microbatches) to exercise accumulation; the first
     * microbatch reduce-scatters blocking, the second keeps one reduce-scatter in flight
     * while the next unit's gradient is made (two gradient buffers, two scratches). */
    float *grad = calloc(p.shard_numel, sizeof *grad);
    float *g[2], *scratch[2];
    for (int k = 0; k < 2; k++) {
        g[k] = malloc(p.max_full_numel * sizeof(float));
        scratch[k] = malloc(p.max_unit_shard * sizeof(float));
    }
    for (int u = NUNIT - 1; u >= 0; u--) {
        fill(g[0], p.units[u].full_numel, 100 + u, W->rank);
        OK(fsdp_reduce_scatter_unit(&p, m.dp_shard, grad, g[0], u, scratch[0], E));
    }
    FsdpReq pending, started;
    for (int u = NUNIT - 1; u >= 0; u--) {
        int k = u % 2;
        fill(g[k], p.units[u].full_numel, 100 + u + 10, W->rank);
        OK(fsdp_reduce_scatter_unit_start(&p, m.dp_shard, grad, g[k], u, scratch[k], &started, E));
        if (u < NUNIT - 1) OK(fsdp_wait(m.dp_shard, &pending, E));
        pending = started;
    }
    OK(fsdp_wait(m.dp_shard, &pending, E));
    OK(fsdp_all_reduce_replicas(&p, m.dp_replicate, grad, E));
    /* Two serial references. `tot` is the plain double sum of every rank's and microbatch's
     * gradient, for a tolerance check scaled by the sum of magnitudes; `want` below repeats
     * the parallel path's association (per replica the rank-order sum over its shard group,
     * accumulated over microbatches, then the rank-order sum over replicas) for an exact
     * check. */
    double sq_serial = 0, sq_a, sq_b, norm;
    for (int u = 0; u < NUNIT; u++) {
        size_t F = p.units[u].full_numel;
        double *tot = calloc(F, sizeof *tot), *mag = calloc(F, sizeof *mag);
        float *x = malloc(F * sizeof *x);
        for (int micro = 0; micro < 2; micro++)
            for (int w = 0; w < W->size; w++) {
                fill(x, F, 100 + u + 10 * micro, w);
                for (size_t i = 0; i < F; i++)
                    tot[i] += x[i], mag[i] += fabsf(x[i]);
            }
        /* Both microbatch sums were reduced separately per shard piece, then accumulated;
         * the replica all-reduce then sums accumulated shards, so redo that association. */
        size_t n = p.units[u].shard_numel, off = (size_t)m.dims.s * n;
        float *want = calloc(n, sizeof *want);
        for (int r = 0; r < m.dims.dp_replicate; r++) {
            float *acc = calloc(n, sizeof *acc), *v = malloc((n ? n : 1) * sizeof *v);
            for (int micro = 0; micro < 2; micro++) {
                for (int s = 0; s < m.dims.dp_shard; s++) {
                    fill(x, F, 100 + u + 10 * micro, mesh_rank_of(&m.dims, r, s, 0));
                    for (size_t i = 0; i < n; i++)
                        v[i] = s ? v[i] + x[off + i] : x[off + i];
                }
                for (size_t i = 0; i < n; i++)
                    acc[i] += v[i];
            }
            for (size_t i = 0; i < n; i++)
                want[i] = r ? want[i] + acc[i] : acc[i];
            free(acc);
            free(v);
        }
        CHECK(memcmp(grad + p.units[u].shard_offset, want, n * sizeof *want) == 0,
              "reduce-scattered gradient of unit %d", u);
        for (size_t i = 0; i < n; i++)
            CHECK(fabs(want[i] - tot[off + i]) <= 1e-6 * mag[off + i],
                  "unit %d element %zu: %g vs serial %g", u, i, want[i], tot[off + i]);
        for (int i = 0; i < NPAR; i++)
            if (unit[i] == u)
                for (size_t j = 0; j < numel[i]; j++) {
                    double v = tot[p.params[i].full_offset + j];
                    sq_serial += v * v;
                }
        free(want);
        free(tot);
        free(mag);
        free(x);
    }
    fsdp_shard_sq_sums(&p, grad, NULL, &sq_a, &sq_b);
    OK(mesh_global_norm(&norm, &m, sq_a, sq_b, E));
    CHECK(fabs(norm - sqrt(sq_serial)) <= 1e-5 * sqrt(sq_serial), "grad norm %.9g vs %.9g", norm,
          sqrt(sq_serial));
    double norm0 = norm;
    OK(comm_broadcast(W, &norm0, sizeof norm0, 0, E));
    CHECK(norm0 == norm, "grad norm differs between ranks");
    for (int i = 0; i < NPAR; i++)
        free(params[i]);
    free(shard);
    free(full[0]);
    free(full[1]);
    free(grad);
    for (int k = 0; k < 2; k++)
        free(g[k]), free(scratch[k]);
    fsdp_plan_free(&p);
    mesh_destroy(&m);
}

static void bench(size_t n) {
    int P = W->size;
    n = (n + P - 1) / P * P;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    fill(x, n, 7, W->rank);
    const int reps = 10;
    double t[4];
    for (int k = 0; k < 4; k++) {
        OK(comm_barrier(W, E));
        double t0 = MPI_Wtime();
        for (int i = 0; i < reps; i++) {
            if (k == 0) OK(comm_all_reduce_sum(W, x, n, COMM_F32, E));
            if (k == 1) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (k == 2) OK(comm_reduce_scatter_sum(W, y, x, n / P, COMM_F32, E));
            if (k == 3)
                MPI_Reduce_scatter_block(x, y, (int)(n / P), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        t[k] = (MPI_Wtime() - t0) / reps;
    }
    log_info("bench %zu floats on %d processes: all-reduce %.2f ms (MPI_Allreduce %.2f ms), "
             "reduce-scatter %.2f ms (MPI_Reduce_scatter_block %.2f ms)",
             n, P, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3);
    /* The step-time model's inputs (train/steptime.h): the all-gather's bandwidth, counted as
     * a ring counts it ((P - 1) / P of the gathered bytes per rank), and the per-message
     * latency from an 8-float all-gather. */
    double tg[2];
    for (int k = 0; k < 2; k++) {
        size_t m = k == 0 ? n / P : 8;
        int r = k == 0 ? reps : 200;
        OK(comm_barrier(W, E));
        double t0 = MPI_Wtime();
        for (int i = 0; i < r; i++)
            OK(comm_all_gather(W, y, x, m, COMM_F32, E));
        tg[k] = (MPI_Wtime() - t0) / r;
    }
    /* The same small all-gather after 2 ms of work on each rank, as a training step's
     * collectives come: on a shared machine the ranks arrive apart and the wait includes the
     * time a peer was not scheduled, which a tight loop of collectives never sees. */
    double synced = 0;
    volatile double sink = 0;
    for (int i = 0; i < 50; i++) {
        double t0 = MPI_Wtime();
        while (MPI_Wtime() - t0 < 2e-3)
            sink += 1;
        double t1 = MPI_Wtime();
        OK(comm_all_gather(W, y, x, 8, COMM_F32, E));
        synced += MPI_Wtime() - t1;
    }
    double moved = (double)(P - 1) / P * (double)n * sizeof(float);
    log_info("bench all-gather of %zu floats: %.2f ms, %.3f GB/s; 8 floats: %.1f us, %.1f us per "
             "message; after 2 ms of work: %.1f us per message",
             n, tg[0] * 1e3, moved / tg[0] / 1e9, tg[1] * 1e6, tg[1] * 1e6 / (P - 1),
             synced / 50 * 1e6 / (P - 1));
    free(x);
    free(y);
}

int main(int argc, char **argv) {
    Err err;
    if (comm_init(&W, &argc, &argv, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    const char *mode = argc > 1 ? argv[1] : "collectives";
    int P = W->size;
    if (strcmp(mode, "collectives") == 0) {
        test_all_reduce();
        test_broadcast_gather_scatter();
        test_split();
        test_all_to_all_v();
        test_agree();
        test_mesh(1, -1, 1);
        if (P % 2 == 0) test_mesh(1, P / 2, 2), test_mesh(P / 2, 1, 2), test_mesh(2, -1, 1);
        test_fsdp(1);
        if (P % 2 == 0) test_fsdp(2);
        OK(comm_barrier(W, E));
        log_info("mpi_comm: %d checks passed on %d processes (%s)", checks, P, W->kind);
    } else if (strcmp(mode, "bench") == 0) {
        bench(argc > 2 ? (size_t)atol(argv[2]) : (size_t)1 << 24);
    } else if (strcmp(mode, "abort") == 0) {
        if (W->rank == 1 % P)
            comm_abort(3, "rank-local failure: could not read data/shard-1.bin (test)");
        OK(comm_barrier(W, E)); /* the others wait here and must be ended by the abort */
        comm_abort(1, "barrier returned although rank 1 aborted");
    } else if (strcmp(mode, "exit") == 0) {
        if (W->rank == P - 1) {
            fprintf(stderr, "[rank %d] exiting with status 4 mid-job (test)\n", W->rank);
            exit(4);
        }
        double v = 1;
        OK(comm_all_reduce_sum(W, &v, 1, COMM_F64, E));
        comm_abort(1, "all-reduce returned although a rank had exited");
    } else {
        fprintf(stderr, "usage: mpi_comm collectives|abort|exit|bench [N]\n");
        comm_destroy(W);
        return 2;
    }
    comm_destroy(W);
    return 0;
}
