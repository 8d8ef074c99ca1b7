/* Unit tests for src/dist/mesh: resolving [parallelism], rank coordinates (tp fastest, as
 * torchtitan), and the one-sentence errors for meshes that cannot work. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "dist/mesh.h"

/* A Qwen3-0.6B-shaped config on `world` processes, everything else valid. */
static MeshConfig base(int world, int r, int s, int t) {
    MeshConfig c = {.world = world,
                    .dp_replicate = r,
                    .dp_shard = s,
                    .tp = t,
                    .n_heads = 16,
                    .n_kv_heads = 8,
                    .hidden_dim = 3072,
                    .vocab_size = 151936,
                    .seq_len = 2048,
                    .local_batch = 2,
                    .global_batch = -1};
    return c;
}

static void test_shard_takes_the_rest(void **state) {
    (void)state;
    MeshConfig c = base(8, 2, -1, 2);
    c.global_batch = 32;
    MeshDims d;
    Err err;
    assert_int_equal(mesh_resolve(&d, &c, 0, &err), 0);
    assert_int_equal(d.dp_shard, 2);
    assert_int_equal(d.dp, 4);
    assert_int_equal(d.grad_accum_steps, 4); /* 32 / (4 ranks x 2 rows) */
    char line[128];
    mesh_describe(line, sizeof line, &d);
    assert_string_equal(line, "mesh [dp_replicate 2, dp_shard 2, tp 2] on 8 processes, 4 "
                              "microbatch(es) per step");
    assert_int_equal(d.sequence_parallel, 0);
    c.sequence_parallel = 1;
    assert_int_equal(mesh_resolve(&d, &c, 0, &err), 0);
    assert_int_equal(d.sequence_parallel, 1);
    mesh_describe(line, sizeof line, &d);
    assert_string_equal(line, "mesh [dp_replicate 2, dp_shard 2, tp 2 + sequence parallel] on 8 "
                              "processes, 4 microbatch(es) per step");
    c = base(1, 1, -1, 1);
    assert_int_equal(mesh_resolve(&d, &c, 0, &err), 0);
    assert_int_equal(d.dp_shard, 1);
    assert_int_equal(d.global_batch, 2); /* -1: one local batch per data-parallel rank */
    assert_int_equal(d.grad_accum_steps, 1);
}

static void test_coordinates(void **state) {
    (void)state;
    /* 2 x 3 x 2 on 12 ranks: rank = (r*3 + s)*2 + t, written out for a few by hand. */
    MeshConfig c = base(12, 2, 3, 2);
    const int expect[][4] = {{0, 0, 0, 0}, {1, 0, 0, 1}, {2, 0, 1, 0}, {5, 0, 2, 1},
                             {6, 1, 0, 0}, {9, 1, 1, 1}, {11, 1, 2, 1}};
    Err err;
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        MeshDims d;
        assert_int_equal(mesh_resolve(&d, &c, expect[i][0], &err), 0);
        assert_int_equal(d.r, expect[i][1]);
        assert_int_equal(d.s, expect[i][2]);
        assert_int_equal(d.t, expect[i][3]);
        assert_int_equal(d.dp_rank, expect[i][1] * 3 + expect[i][2]);
    }
    MeshDims d;
    for (int rank = 0; rank < 12; rank++) {
        assert_int_equal(mesh_resolve(&d, &c, rank, &err), 0);
        assert_int_equal(mesh_rank_of(&d, d.r, d.s, d.t), rank);
    }
}

static void expect_error(MeshConfig c, const char *sentence) {
    Err err = {{0}};
    MeshDims d;
    assert_int_equal(mesh_resolve(&d, &c, 0, &err), -1);
    assert_string_equal(err.msg, sentence);
    /* Every rank must print the same sentence, so the rank cannot appear in it. */
    for (int rank = 1; rank < c.world; rank++) {
        Err other = {{0}};
        assert_int_equal(mesh_resolve(&d, &c, rank, &other), -1);
        assert_string_equal(other.msg, err.msg);
    }
}

static void test_invalid_meshes(void **state) {
    (void)state;
    expect_error(base(4, 1, 3, 1),
                 "the device mesh data_parallel_replicate_degree x data_parallel_shard_degree x "
                 "tensor_parallel_degree = 1 x 3 x 1 = 3 does not match the 4 processes of the "
                 "job");
    expect_error(base(6, 1, -1, 4),
                 "parallelism.data_parallel_shard_degree = -1 cannot fill 6 processes: 6 is not "
                 "a multiple of data_parallel_replicate_degree x tensor_parallel_degree = 1 x 4 "
                 "= 4");
    expect_error(base(2, 0, -1, 1),
                 "parallelism.data_parallel_replicate_degree = 0 must be at least 1");
    expect_error(base(2, 1, 0, 1), "parallelism.data_parallel_shard_degree = 0 must be at least "
                                   "1, or -1 to take the processes left");
    expect_error(base(2, 1, -1, 0), "parallelism.tensor_parallel_degree = 0 must be at least 1");
    MeshConfig c = base(3, 1, 1, 3);
    c.n_heads = 15, c.hidden_dim = 3, c.vocab_size = 3;
    expect_error(c, "model n_kv_heads = 8 is not divisible by parallelism.tensor_parallel_degree "
                    "= 3");
    c = base(4, 1, 1, 4);
    c.hidden_dim = 3070;
    expect_error(c, "model hidden_dim = 3070 is not divisible by "
                    "parallelism.tensor_parallel_degree = 4");
    c = base(2, 1, 1, 2);
    c.num_experts = 8;
    expect_error(c, "parallelism.expert_parallel_degree = 1 is not a multiple of "
                    "parallelism.tensor_parallel_degree = 2: a mixture-of-experts model splits "
                    "its experts over the tensor-parallel ranks (and over data_parallel_shard "
                    "ranks beyond them)");
    c = base(2, 1, -1, 1);
    c.ep = 2;
    expect_error(c, "parallelism.expert_parallel_degree = 2 needs a mixture-of-experts model "
                    "(this one is dense)");
    c.num_experts = 6, c.ep = 4;
    expect_error(c, "parallelism.expert_parallel_degree = 4 spans 4 data_parallel_shard rank(s) "
                    "per tensor-parallel rank, which does not divide data_parallel_shard_degree "
                    "= 2");
    c = base(2, 1, 1, 2);
    c.num_experts = 8, c.ep = 2, c.local_batch = 1, c.seq_len = 31;
    expect_error(c, "training.local_batch_size x training.seq_len = 1 x 31 = 31 tokens is not "
                    "divisible by parallelism.tensor_parallel_degree = 2: the tensor-parallel "
                    "ranks split a micro-batch's tokens between them for the experts");
    c = base(4, 1, -1, 1);
    c.num_experts = 6, c.ep = 4;
    expect_error(c, "model num_experts = 6 is not divisible by parallelism.expert_parallel_degree "
                    "= 4");
    c = base(2, 1, 1, 2);
    c.n_heads = 5;
    expect_error(c, "model n_heads = 5 is not divisible by parallelism.tensor_parallel_degree = 2");
    c = base(2, 1, 1, 2);
    c.sequence_parallel = 1, c.seq_len = 1023;
    expect_error(c, "training.seq_len (with parallelism.enable_sequence_parallel) = 1023 is not "
                    "divisible by parallelism.tensor_parallel_degree = 2");
    c = base(4, 2, 2, 1);
    c.global_batch = 12;
    expect_error(c, "training.global_batch_size = 12 is not divisible by data-parallel ranks x "
                    "training.local_batch_size = 4 x 2 = 8 (data-parallel ranks = replicate 2 x "
                    "shard 2)");
    c = base(1, 1, 1, 1);
    c.local_batch = 0;
    expect_error(c, "training.local_batch_size = 0 must be at least 1");
}

static void test_valid_tp_shapes(void **state) {
    (void)state;
    /* Without tensor parallelism no shape constraint applies, and unknown shapes (0) skip. */
    MeshConfig c = base(2, 1, -1, 1);
    c.n_heads = 15, c.n_kv_heads = 5, c.hidden_dim = 3071;
    MeshDims d;
    Err err;
    assert_int_equal(mesh_resolve(&d, &c, 1, &err), 0);
    c = base(4, 1, -1, 4);
    c.n_heads = c.n_kv_heads = 0, c.hidden_dim = c.vocab_size = 0;
    assert_int_equal(mesh_resolve(&d, &c, 3, &err), 0);
    assert_int_equal(d.t, 3);
}

/* Expert-parallel groups: ep / tp consecutive dp_shard ranks times the tp group, index q =
 * (s % ep_in) * tp + t (torchtitan's layout with expert_tensor_parallel_degree = 1). */
static void test_ep_layout(void **state) {
    (void)state;
    MeshConfig c = base(8, 1, 4, 2);
    c.num_experts = 8, c.ep = 4;
    const int want_q[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    for (int rank = 0; rank < 8; rank++) {
        MeshDims d;
        Err err;
        assert_int_equal(mesh_resolve(&d, &c, rank, &err), 0);
        assert_int_equal(d.ep, 4);
        assert_int_equal(d.ep_in, 2);
        assert_int_equal(d.q, want_q[rank]);
    }
    c = base(4, 1, -1, 1); /* a dense model keeps ep 1 */
    MeshDims d;
    Err err;
    assert_int_equal(mesh_resolve(&d, &c, 3, &err), 0);
    assert_int_equal(d.ep, 1);
    assert_int_equal(d.q, 0);
}

/* Every row of a global batch is taken exactly once per step, whatever the mesh. */
static void test_rows_cover_the_batch(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 1, 1}, {1, 2, 1}, {1, 4, 1}, {2, 2, 1}, {1, 2, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int R = shapes[k][0], S = shapes[k][1], T = shapes[k][2], world = R * S * T;
        MeshConfig c = base(world, R, S, T);
        c.local_batch = 2, c.global_batch = 16;
        int taken[16] = {0};
        for (int rank = 0; rank < world; rank++) {
            MeshDims d;
            Err err;
            assert_int_equal(mesh_resolve(&d, &c, rank, &err), 0);
            if (d.t != 0) continue; /* tensor-parallel peers share their rows */
            for (int micro = 0; micro < d.grad_accum_steps; micro++) {
                long first = mesh_first_row(&d, c.local_batch, micro);
                for (long j = first; j < first + c.local_batch; j++) {
                    assert_true(j >= 0 && j < 16);
                    taken[j]++;
                }
            }
        }
        for (int j = 0; j < 16; j++)
            assert_int_equal(taken[j], 1);
    }
    /* Two ranks, two microbatches: rank 1 takes rows 2-3 then 6-7. */
    MeshConfig c = base(2, 1, -1, 1);
    c.global_batch = 8;
    MeshDims d;
    Err err;
    assert_int_equal(mesh_resolve(&d, &c, 1, &err), 0);
    assert_int_equal(mesh_first_row(&d, 2, 0), 2);
    assert_int_equal(mesh_first_row(&d, 2, 1), 6);
}

static void test_single_process_mesh(void **state) {
    (void)state;
    Comm *world = comm_single_create();
    MeshConfig c = base(99, 1, -1, 1); /* world is taken from the communicator */
    Mesh m;
    Err err;
    assert_int_equal(mesh_create(&m, world, &c, &err), 0);
    assert_int_equal(m.dims.world, 1);
    assert_int_equal(m.dp_shard->size, 1);
    assert_int_equal(m.tp->size, 1);
    double norm;
    assert_int_equal(mesh_global_norm(&norm, &m, 9.0, 16.0, &err), 0);
    assert_true(norm == 5.0);
    mesh_destroy(&m);
    c.tp = 2;
    assert_int_equal(mesh_create(&m, world, &c, &err), -1);
    comm_destroy(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_takes_the_rest),
        cmocka_unit_test(test_coordinates),
        cmocka_unit_test(test_invalid_meshes),
        cmocka_unit_test(test_valid_tp_shapes),
        cmocka_unit_test(test_ep_layout),
        cmocka_unit_test(test_rows_cover_the_batch),
        cmocka_unit_test(test_single_process_mesh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
