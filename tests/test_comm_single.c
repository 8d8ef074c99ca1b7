/* Unit tests for the single-process communicator and, on one process, the FSDP plan: every
 * collective is the identity or a copy, and the flat-parameter layout puts every element of
 * every parameter in exactly one rank's shard (checked by simulating each rank's plan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "dist/comm.h"
#include "dist/fsdp.h"

static void test_single_collectives(void **state) {
    (void)state;
    Comm *c = comm_single_create();
    Err err;
    assert_int_equal(c->rank, 0);
    assert_int_equal(c->size, 1);
    assert_int_equal(comm_barrier(c, &err), 0);
    float x[5] = {1, 2, 3, 4, 5}, y[5] = {0};
    double d[2] = {0.5, -2};
    assert_int_equal(comm_all_reduce_sum(c, x, 5, COMM_F32, &err), 0);
    assert_true(x[0] == 1 && x[4] == 5);
    assert_int_equal(comm_all_reduce_sum(c, d, 2, COMM_F64, &err), 0);
    assert_true(d[0] == 0.5 && d[1] == -2);
    assert_int_equal(comm_all_gather(c, y, x, 5, COMM_F32, &err), 0);
    assert_memory_equal(x, y, sizeof x);
    memset(y, 0, sizeof y);
    assert_int_equal(comm_reduce_scatter_sum(c, y, x, 5, COMM_F32, &err), 0);
    assert_memory_equal(x, y, sizeof x);
    CommReq *req = (CommReq *)1;
    assert_int_equal(comm_iall_gather(c, y, x, 5, COMM_F32, &req, &err), 0);
    int done = 0;
    assert_int_equal(comm_test(c, req, &done, &err), 0);
    assert_int_equal(done, 1);
    assert_int_equal(comm_wait(c, req, &err), 0);
    assert_int_equal(comm_broadcast(c, d, sizeof d, 0, &err), 0);
    assert_int_equal(comm_broadcast(c, d, sizeof d, 1, &err), -1);
    assert_string_equal(err.msg, "broadcast root 1 is not a rank of a 1-process job");
    size_t three = 3, two = 2;
    memset(y, 0, sizeof y);
    assert_int_equal(comm_all_to_all_v(c, y, &three, x, &three, COMM_F32, &err), 0);
    assert_memory_equal(x, y, 3 * sizeof(float));
    assert_int_equal(comm_all_to_all_v(c, y, &two, x, &three, COMM_F32, &err), -1);
    assert_string_equal(err.msg, "all-to-all on one process sends 3 elements but receives 2");
    assert_int_equal(comm_agree(c, 0, &err), 0);
    err_set(&err, "local failure");
    assert_int_equal(comm_agree(c, -1, &err), -1);
    assert_string_equal(err.msg, "local failure");
    Comm *sub;
    assert_int_equal(comm_split(c, 3, 0, &sub, &err), 0);
    assert_int_equal(sub->size, 1);
    comm_destroy(sub);
    comm_destroy(c);
}

static void test_init_without_mpirun(void **state) {
    (void)state;
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMIX_RANK");
    Comm *c;
    Err err;
    int argc = 1;
    char *args[] = {"qtitan", NULL}, **argv = args;
    assert_int_equal(comm_init(&c, &argc, &argv, &err), 0);
    assert_string_equal(c->kind, "single");
    comm_destroy(c);
}

#ifndef QTITAN_HAVE_MPI
/* Started by mpirun with several processes but built without MPI: an error, not a silent
 * single-process run that would train N copies of the same thing. */
static void test_init_needs_mpi(void **state) {
    (void)state;
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    Comm *c;
    Err err;
    int argc = 1;
    char *args[] = {"qtitan", NULL}, **argv = args;
    assert_int_equal(comm_init(&c, &argc, &argv, &err), -1);
    assert_non_null(strstr(err.msg, "built without MPI"));
    unsetenv("OMPI_COMM_WORLD_SIZE");
}
#endif

/* Parameter sizes with awkward remainders; units 0 and 2 hold several, unit 1 none. */
static const size_t NUMEL[] = {37, 1, 100, 16, 5, 333};
static const int UNIT[] = {0, 0, 2, 2, 3, 0};
#define NP 6
#define NU 4

static void test_fsdp_layout(void **state) {
    (void)state;
    Err err;
    FsdpPlan p;
    assert_int_equal(fsdp_plan(&p, NUMEL, UNIT, NP, NU, 3, 1, &err), 0);
    /* unit 0: 37 -> 48, 1 -> 64, 333 -> 400 (aligned to 16), padded to 48*k: 432. */
    assert_int_equal(p.params[0].full_offset, 0);
    assert_int_equal(p.params[1].full_offset, 48);
    assert_int_equal(p.params[5].full_offset, 64);
    assert_int_equal(p.units[0].full_numel, 432);
    assert_int_equal(p.units[1].full_numel, 0);
    assert_int_equal(p.units[2].full_numel, 144); /* 100 -> 112, +16 = 128, padded to 144 */
    assert_int_equal(p.units[2].shard_offset, 144);
    assert_int_equal(p.shard_numel, 144 + 0 + 48 + 16);
    assert_int_equal(p.max_full_numel, 432);
    assert_int_equal(p.max_unit_shard, 144);
    fsdp_plan_free(&p);
    int bad_unit[] = {0, 4};
    assert_int_equal(fsdp_plan(&p, NUMEL, bad_unit, 2, NU, 2, 0, &err), -1);
    assert_string_equal(err.msg, "FSDP parameter 1 names unit 4, outside 0..3");
    assert_int_equal(fsdp_plan(&p, NUMEL, UNIT, NP, NU, 2, 2, &err), -1);
}

/* For P simulated ranks: cutting full parameters into shards and concatenating the unit
 * pieces in rank order (what all-gather does) gives back every parameter exactly; summing
 * per-rank full gradients and taking each rank's piece (what reduce-scatter does) matches
 * the shard of the serial sum. */
static void check_ranks(int P) {
    Err err;
    Rng rng;
    rng_seed(&rng, 7, (uint64_t)P);
    float *full[NP];
    for (int i = 0; i < NP; i++) {
        full[i] = malloc(NUMEL[i] * sizeof(float));
        rng_fill_normal(&rng, full[i], (long)NUMEL[i], 1.0f);
    }
    FsdpPlan plans[4];
    float *shards[4];
    size_t covered[NP] = {0};
    for (int k = 0; k < P; k++) {
        assert_int_equal(fsdp_plan(&plans[k], NUMEL, UNIT, NP, NU, P, k, &err), 0);
        shards[k] = malloc(plans[k].shard_numel * sizeof(float));
        fsdp_shard_from_full(&plans[k], shards[k], (const float *const *)full);
        for (int i = 0; i < NP; i++) {
            size_t lo, hi, at;
            fsdp_param_shard(&plans[k], i, &lo, &hi, &at);
            covered[i] += hi - lo;
        }
    }
    for (int i = 0; i < NP; i++)
        assert_int_equal(covered[i], NUMEL[i]);
    float *work = calloc(plans[0].max_full_numel + 1, sizeof(float));
    for (int u = 0; u < NU; u++) {
        const FsdpUnit *U = &plans[0].units[u];
        for (int k = 0; k < P; k++)
            memcpy(work + k * U->shard_numel, shards[k] + U->shard_offset,
                   U->shard_numel * sizeof(float));
        for (int i = 0; i < NP; i++)
            if (UNIT[i] == u)
                assert_memory_equal(work + plans[0].params[i].full_offset, full[i],
                                    NUMEL[i] * sizeof(float));
    }
    double a, b;
    unsigned char repl[NP] = {0, 1, 0, 0, 1, 0};
    double want_a = 0, want_b = 0, got_a = 0, got_b = 0;
    for (int i = 0; i < NP; i++)
        for (size_t j = 0; j < NUMEL[i]; j++)
            *(repl[i] ? &want_b : &want_a) += (double)full[i][j] * full[i][j];
    for (int k = 0; k < P; k++) {
        fsdp_shard_sq_sums(&plans[k], shards[k], repl, &a, &b);
        got_a += a, got_b += b;
    }
    assert_true(fabs(got_a - want_a) <= 1e-12 * want_a);
    assert_true(fabs(got_b - want_b) <= 1e-12 * want_b + 1e-300);
    for (int k = 0; k < P; k++) {
        free(shards[k]);
        fsdp_plan_free(&plans[k]);
    }
    for (int i = 0; i < NP; i++)
        free(full[i]);
    free(work);
}

static void test_fsdp_shards_cover(void **state) {
    (void)state;
    for (int P = 1; P <= 4; P++)
        check_ranks(P);
}

static void test_fsdp_single_gather_scatter(void **state) {
    (void)state;
    Comm *c = comm_single_create();
    Err err;
    FsdpPlan p;
    assert_int_equal(fsdp_plan(&p, NUMEL, UNIT, NP, NU, 1, 0, &err), 0);
    float *shard = calloc(p.shard_numel, sizeof(float));
    float *grad = calloc(p.shard_numel, sizeof(float));
    float *full = calloc(p.max_full_numel, sizeof(float));
    float *scratch = calloc(p.max_unit_shard, sizeof(float));
    for (size_t i = 0; i < p.shard_numel; i++)
        shard[i] = (float)i;
    assert_int_equal(fsdp_gather_unit(&p, c, full, shard, 2, COMM_F32, &err), 0);
    assert_memory_equal(full, shard + p.units[2].shard_offset,
                        p.units[2].full_numel * sizeof(float));
    /* Reduce-scatter accumulates: twice the same gradient gives double. */
    assert_int_equal(fsdp_reduce_scatter_unit(&p, c, grad, full, 2, scratch, &err), 0);
    FsdpReq req;
    assert_int_equal(fsdp_reduce_scatter_unit_start(&p, c, grad, full, 2, scratch, &req, &err), 0);
    assert_int_equal(fsdp_wait(c, &req, &err), 0);
    for (size_t i = 0; i < p.units[2].shard_numel; i++)
        assert_true(grad[p.units[2].shard_offset + i] == 2 * full[i]);
    assert_true(grad[0] == 0);
    assert_int_equal(fsdp_gather_unit(&p, c, full, shard, 9, COMM_F32, &err), -1);
    assert_string_equal(err.msg, "FSDP unit 9 is outside 0..3");
    free(shard);
    free(grad);
    free(full);
    free(scratch);
    fsdp_plan_free(&p);
    comm_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_collectives),
        cmocka_unit_test(test_init_without_mpirun),
#ifndef QTITAN_HAVE_MPI
        cmocka_unit_test(test_init_needs_mpi),
#endif
        cmocka_unit_test(test_fsdp_layout),
        cmocka_unit_test(test_fsdp_shards_cover),
        cmocka_unit_test(test_fsdp_single_gather_scatter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
