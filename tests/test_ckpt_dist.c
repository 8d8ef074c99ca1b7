/* Sharded checkpoints (src/train/ckpt_dist.h) on the single-process communicator: the commit
 * marker, keep_latest_k pruning per rank, refusing shards saved by another number of ranks,
 * and the offline reader that assembles each full parameter from 2 and 3 ranks' FSDP pieces
 * and from FSDP x TP pieces (checked bitwise against the tensors that were cut up), and the
 * HF export of a sharded checkpoint, FSDP, TP and FSDP x TP (byte for byte the files an export
 * of the whole tensors writes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "dist/fsdp.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"
#include "train/ckpt_dist.h"

static const int MESH1[4] = {1, 1, 1, 1};

static char *tmp_root(void) {
    char tmpl[] = "/tmp/qt_ckpt_dist_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return strdup(tmpl);
}

static void write_marker(const char *root, int ranks, const char *steps, int64_t step) {
    char *path = fs_join(root, CKPT_DIST_MARKER), text[256];
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": %d, \"step\": %lld, "
                     "\"steps\": [%s]}\n",
                     ranks, (long long)step, steps);
    Err err;
    assert_int_equal(fs_write_atomic(path, text, (size_t)n, &err), 0);
    free(path);
}

/* The marker of a run on the mesh [1, dp_shard, tp] that committed step `step` alone. */
static void write_mesh_marker(const char *root, int dp_shard, int tp, int64_t step) {
    char *path = fs_join(root, CKPT_DIST_MARKER), text[256];
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": %d, \"mesh\": "
                     "[1, %d, %d], \"step\": %lld, \"steps\": [%lld]}\n",
                     dp_shard * tp, dp_shard, tp, (long long)step, (long long)step);
    Err err;
    assert_int_equal(fs_write_atomic(path, text, (size_t)n, &err), 0);
    free(path);
}

static void test_save_find_prune(void **state) {
    (void)state;
    char *root = tmp_root();
    Comm *c = comm_single_create();
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, m[8] = {0}, v[8] = {0};
    CkptTensor model = {"w", 1, {8}, w, NULL};
    CkptTensor optim[2] = {{"w.exp_avg", 1, {8}, m, NULL}, {"w.exp_avg_sq", 1, {8}, v, NULL}};
    Err err;
    CkptDistFound f;
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 0);
    for (int64_t s = 1; s <= 3; s++) {
        CkptState st = {.step = s, .optim_step = s};
        w[0] = (float)s;
        assert_int_equal(ckpt_dist_save(c, MESH1, root, &st, &model, NULL, 1, optim, 2, 2, &err),
                         0);
    }
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 1);
    assert_int_equal(f.step, 3);
    assert_int_equal(f.ranks, 1);
    char *path = ckpt_dist_found_dir(root, &f, 0);
    assert_non_null(strstr(path, "rank-0/step-3"));
    CkptState st;
    w[0] = 0;
    assert_int_equal(ckpt_load(path, &st, &model, 1, optim, 2, &err), 0);
    assert_true(w[0] == 3.0f);
    json_decref(st.data_position);
    free(path);
    /* keep_latest_k = 2: step 1 is gone, 2 and 3 stay. */
    char *dir = ckpt_dist_rank_dir(root, 0);
    char *s1 = fs_join(dir, "step-1"), *s2 = fs_join(dir, "step-2");
    assert_false(fs_exists(s1));
    assert_true(fs_exists(s2));
    /* load_step picks a listed step; one that is not there is a sentence. */
    assert_int_equal(ckpt_dist_locate(c, root, 2, &f, &err), 1);
    assert_int_equal(f.step, 2);
    assert_int_equal(ckpt_dist_locate(c, root, 1, &f, &err), -1);
    assert_non_null(strstr(err.msg, "checkpoint.load_step = 1"));
    /* A crash before the marker named step 3 leaves step 2 current. */
    write_marker(root, 1, "2", 2);
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 1);
    assert_int_equal(f.step, 2);
    /* Shards of another world size are found, to be resharded (ranks 1-3 here: links to rank
     * 0's step, enough for the check that every rank's folder of the step is complete). */
    write_marker(root, 4, "2", 2);
    char *links[4] = {NULL};
    for (int k = 1; k < 4; k++) {
        char *rdir = ckpt_dist_rank_dir(root, k);
        assert_int_equal(fs_mkdirs(rdir, &err), 0);
        links[k] = fs_join(rdir, "step-2");
        assert_int_equal(symlink(s2, links[k]), 0);
        free(rdir);
    }
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 1);
    assert_int_equal(f.ranks, 4);
    assert_int_equal(f.mesh[1], 4);
    assert_int_equal(f.mesh[3], 1); /* no mesh: no expert parallelism */
    /* Rank 3's folder of the only listed step gone: skipped (a warning), nothing to resume. */
    assert_int_equal(unlink(links[3]), 0);
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 0);
    for (int k = 1; k < 4; k++)
        free(links[k]);
    /* One process's newer step wins over the sharded one. */
    CkptState one = {.step = 5, .optim_step = 5};
    assert_int_equal(ckpt_save(root, &one, &model, 1, optim, 2, 0, &err), 0);
    assert_int_equal(ckpt_dist_locate(NULL, root, -1, &f, &err), 1);
    assert_int_equal(f.step, 5);
    assert_int_equal(f.ranks, 0);
    path = ckpt_dist_found_dir(root, &f, 3);
    assert_non_null(strstr(path, "/step-5"));
    assert_null(strstr(path, "rank-"));
    free(path);
    write_marker(root, 1, "\"x\"", 2);
    assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), -1);
    assert_non_null(strstr(err.msg, "steps[0]"));
    free(s1);
    free(s2);
    free(dir);
    comm_destroy(c);
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(root);
}

/* Cuts three parameters in two units into `ranks` FSDP shards, saves each rank's pieces as
 * ckpt_save does for a trainer on that rank, and reads every parameter back whole. */
static void reader_round_trip(int ranks) {
    enum { NP = 3 };
    const size_t numel[NP] = {37, 200, 5};
    const int unit[NP] = {0, 1, 1};
    const char *names[NP] = {"tok_embeddings.weight", "layers.0.attention.wq.weight",
                             "layers.0.attention_norm.weight"};
    float *full[NP];
    Rng r;
    rng_seed(&r, 11, (uint64_t)ranks);
    for (int i = 0; i < NP; i++) {
        full[i] = malloc(numel[i] * sizeof(float));
        rng_fill_normal(&r, full[i], (long)numel[i], 1.0f);
    }
    char *root = tmp_root();
    Err err;
    for (int k = 0; k < ranks; k++) {
        FsdpPlan p;
        assert_int_equal(fsdp_plan(&p, numel, unit, NP, 2, ranks, k, &err), 0);
        float *shard = calloc(p.shard_numel + 1, sizeof(float));
        fsdp_shard_from_full(&p, shard, (const float *const *)full);
        CkptTensor pieces[NP];
        int n = 0;
        for (int i = 0; i < NP; i++) {
            size_t lo, hi, at;
            fsdp_param_shard(&p, i, &lo, &hi, &at);
            if (hi > lo)
                pieces[n++] = (CkptTensor){names[i], 1, {(int64_t)(hi - lo)}, shard + at, NULL};
        }
        CkptState st = {.step = 7};
        char *dir = ckpt_dist_rank_dir(root, k);
        assert_int_equal(ckpt_save(dir, &st, pieces, n, NULL, 0, 0, &err), 0);
        free(dir);
        free(shard);
        fsdp_plan_free(&p);
    }
    CkptDistReader rd;
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), -1); /* no marker yet */
    write_marker(root, ranks, "7", 7);
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), 0);
    for (int i = 0; i < NP; i++) {
        float *back = calloc(numel[i], sizeof(float));
        assert_int_equal(ckpt_dist_reader_tensor(&rd, names[i], back, numel[i], numel[i], &err), 0);
        assert_memory_equal(back, full[i], numel[i] * sizeof(float));
        /* The wrong size is caught. */
        assert_int_equal(
            ckpt_dist_reader_tensor(&rd, names[i], back, numel[i] + 1, numel[i] + 1, &err), -1);
        free(back);
        free(full[i]);
    }
    ckpt_dist_reader_close(&rd);
    /* A marker that names more ranks (tp 2) than saved files: the first missing one is named. */
    write_mesh_marker(root, ranks, 2, 7);
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), -1);
    char want[32];
    snprintf(want, sizeof want, "rank-%d", ranks);
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(root);
}

static void test_reader(void **state) {
    (void)state;
    reader_round_trip(2);
    reader_round_trip(3);
}

static void assert_same_file(const char *a, const char *b) {
    char *da, *db;
    size_t na, nb;
    Err err;
    assert_int_equal(fs_read_all(a, &da, &na, &err), 0);
    assert_int_equal(fs_read_all(b, &db, &nb, &err), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(da, db, na);
    free(da);
    free(db);
}

/* Every file of ref is in got with the same bytes, and got has no other; returns the count. */
static int assert_same_dir(const char *ref, const char *got) {
    int n = 0, m = 0;
    DIR *d = opendir(ref);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *a = fs_join(ref, e->d_name), *b = fs_join(got, e->d_name);
        assert_same_file(a, b);
        free(a), free(b);
        n++;
    }
    closedir(d);
    d = opendir(got);
    while ((e = readdir(d)))
        m += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(n, m);
    return n;
}

/* Tensor-parallel rank t's part of parameter p, cut as docs/distributed.md says the trainer
 * does: a block of rows or of columns by the table's split, the rest whole. */
static size_t tp_part(float *out, const float *full, const ParamInfo *p, int t, int tp) {
    size_t numel = (size_t)p->numel, n = numel / (size_t)tp;
    if (p->kind->tp == TP_ROWS) {
        memcpy(out, full + (size_t)t * n, n * sizeof *out);
        return n;
    }
    if (p->kind->tp == TP_COLS) {
        size_t C = (size_t)p->shape[1], c = C / (size_t)tp;
        for (size_t r = 0; r < (size_t)p->shape[0]; r++)
            memcpy(out + r * c, full + r * C + (size_t)t * c, c * sizeof *out);
        return n;
    }
    memcpy(out, full, numel * sizeof *out);
    return numel;
}

/* A tiny model's parameters (random, expert_bias included) are cut into tp tensor-parallel
 * parts and each part into dp_shard FSDP shards, saved as the sharded checkpoint of the mesh
 * [1, dp_shard, tp] (rank s * tp + t holds shard s of part t); its HF export must be the export
 * of the whole tensors. tie: "true" / "false", or NULL for the flavor's. */
static void export_round_trip(const char *flavor, const char *tie, int dp_shard, int tp,
                              DType dtype, size_t shard_bytes, int want_files) {
    ModelSpec spec;
    Err err;
    assert_int_equal(model_spec_flavor(&spec, flavor, &err), 0);
    const char *fields[][2] = {{"dim", "16"},
                               {"n_layers", "2"},
                               {"n_heads", "4"},
                               {"n_kv_heads", "2"},
                               {"head_dim", "8"},
                               {"hidden_dim", "24"},
                               {"vocab_size", "50"},
                               {"num_experts", "4"},
                               {"top_k", "2"},
                               {"moe_hidden_dim", "12"},
                               {"load_balance_coeff", "0.01"}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (spec.num_experts > 0 || i < 7)
            assert_int_equal(model_spec_set_field(&spec, fields[i][0], fields[i][1], &err), 0);
    if (tie) assert_int_equal(model_spec_set_field(&spec, "tie_embeddings", tie, &err), 0);
    assert_int_equal(model_spec_validate(&spec, &err), 0);
    HfKeyTable t;
    hf_keys_build(&t, &spec);
    int np = t.nparams;
    float **full = calloc((size_t)np, sizeof *full);
    size_t *numel = calloc((size_t)np, sizeof *numel);
    int *unit = calloc((size_t)np, sizeof *unit);
    const char **names = calloc((size_t)np, sizeof *names);
    Rng r;
    rng_seed(&r, 5, (uint64_t)(dp_shard * tp));
    for (int i = 0; i < np; i++) {
        numel[i] = (size_t)t.params[i].numel;
        unit[i] = t.params[i].layer + 1; /* -1 (embedding, norm, head) -> unit 0 */
        names[i] = t.params[i].name;
        full[i] = malloc(numel[i] * sizeof(float));
        rng_fill_normal(&r, full[i], (long)numel[i], 1.0f);
    }
    char *root = tmp_root();
    float **part = calloc((size_t)np, sizeof *part);
    size_t *part_numel = calloc((size_t)np, sizeof *part_numel);
    for (int q = 0; q < tp; q++) {
        for (int i = 0; i < np; i++) {
            part[i] = realloc(part[i], numel[i] * sizeof(float));
            part_numel[i] = tp_part(part[i], full[i], &t.params[i], q, tp);
        }
        for (int s = 0; s < dp_shard; s++) {
            FsdpPlan p;
            assert_int_equal(
                fsdp_plan(&p, part_numel, unit, np, spec.n_layers + 1, dp_shard, s, &err), 0);
            float *shard = calloc(p.shard_numel + 1, sizeof(float));
            fsdp_shard_from_full(&p, shard, (const float *const *)part);
            CkptTensor *pieces = calloc((size_t)np, sizeof *pieces);
            int n = 0;
            for (int i = 0; i < np; i++) {
                size_t lo, hi, at;
                fsdp_param_shard(&p, i, &lo, &hi, &at);
                if (hi > lo)
                    pieces[n++] = (CkptTensor){names[i], 1, {(int64_t)(hi - lo)}, shard + at, NULL};
            }
            CkptState st = {.step = 3};
            char *dir = ckpt_dist_rank_dir(root, s * tp + q);
            assert_int_equal(ckpt_save(dir, &st, pieces, n, NULL, 0, 0, &err), 0);
            free(dir);
            free(pieces);
            free(shard);
            fsdp_plan_free(&p);
        }
    }
    for (int i = 0; i < np; i++)
        free(part[i]);
    free(part), free(part_numel);
    write_mesh_marker(root, dp_shard, tp, 3);
    /* The reference: the whole tensors through the writer, as a one-process export does. */
    char *ref = fs_join(root, "ref"), *got = fs_join(root, "got");
    assert_int_equal(fs_mkdirs(ref, &err), 0);
    assert_int_equal(fs_mkdirs(got, &err), 0);
    StWriter w;
    st_writer_init(&w);
    hf_keys_add_to_writer(&w, &t, (const float *const *)full, dtype);
    assert_int_equal(st_write_hf_shards(&w, ref, shard_bytes, &err), 0);
    st_writer_free(&w);
    char *cfg = fs_join(ref, "config.json");
    assert_int_equal(
        model_spec_write_hf_config(&spec, cfg, dtype == DT_F32 ? "float32" : "bfloat16", &err), 0);
    free(cfg);
    CkptDistReader rd;
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), 0);
    if (ckpt_dist_export_hf(got, &rd, &spec, NULL, dtype, shard_bytes, &err) != 0)
        fail_msg("%s", err.msg);
    int nfiles = assert_same_dir(ref, got);
    if (want_files > 0)
        assert_int_equal(nfiles, want_files);
    else
        assert_true(nfiles >= 4); /* config.json, the index and at least two shards */
    /* By path, as `qtitan export` does: the folder (its newest step) or a rank's step dir,
     * with the model from the folder's config.json. */
    Comm *c = comm_single_create();
    assert_int_equal(ckpt_dist_write_config(c, root, &spec, NULL, NULL, 0, &err), 0);
    comm_destroy(c);
    char *step_dir = fs_join(root, "rank-1/step-3/"), *by_path = fs_join(root, "by-path");
    int64_t step = 0;
    assert_true(ckpt_dist_is_sharded_path(root));
    assert_true(ckpt_dist_is_sharded_path(step_dir));
    assert_false(ckpt_dist_is_sharded_path(ref));
    for (int twice = 0; twice < 2; twice++) { /* the second replaces the first */
        if (ckpt_dist_export_path(twice ? step_dir : root, by_path, dtype, shard_bytes, NULL, &step,
                                  &err) != 0)
            fail_msg("%s", err.msg);
        assert_int_equal(step, 3);
        assert_int_equal(assert_same_dir(ref, by_path), nfiles);
    }
    /* The imported config's token ids survive into the export, as in one process's export
     * (they used to be dropped). */
    HfConfigExtra extra = {
        .n_bos = 1, .bos_token_id = {3}, .n_eos = 2, .eos_token_id = {5, 7}, .eos_is_list = 1};
    c = comm_single_create();
    assert_int_equal(ckpt_dist_write_config(c, root, &spec, &extra, NULL, 0, &err), 0);
    comm_destroy(c);
    if (ckpt_dist_export_path(root, by_path, dtype, shard_bytes, NULL, &step, &err) != 0)
        fail_msg("%s", err.msg);
    char *exported = fs_join(by_path, "config.json");
    HfConfigExtra back;
    ModelSpec back_spec;
    if (model_spec_from_hf_config_ex(&back_spec, &back, exported, &err) != 0)
        fail_msg("%s", err.msg);
    assert_int_equal(back.n_bos, 1);
    assert_int_equal(back.bos_token_id[0], 3);
    assert_int_equal(back.n_eos, 2);
    assert_int_equal(back.eos_is_list, 1);
    assert_int_equal(back.eos_token_id[0], 5);
    assert_int_equal(back.eos_token_id[1], 7);
    free(exported);
    /* The folder's tokenizer files go into the export; a later job's set replaces an earlier
     * one's (a file it lacks is removed); --tokenizer's folder wins over the folder's. */
    CkptFile tf[] = {{"job.toml", "[job]\n", 6},
                     {"tokenizer.json", "{\"a\": 1}", 8},
                     {"chat_template.jinja", "T", 1}};
    c = comm_single_create();
    assert_int_equal(ckpt_dist_write_config(c, root, &spec, &extra, tf, 3, &err), 0);
    assert_int_equal(ckpt_dist_export_path(root, by_path, dtype, shard_bytes, NULL, &step, &err),
                     0);
    char *got_tok = fs_join(by_path, "tokenizer.json"),
         *got_ct = fs_join(by_path, "chat_template.jinja");
    char *got_job = fs_join(by_path, "job.toml"), *text = NULL;
    size_t len = 0;
    assert_int_equal(fs_read_all(got_tok, &text, &len, &err), 0);
    assert_string_equal(text, "{\"a\": 1}");
    free(text);
    assert_true(fs_exists(got_ct));
    assert_false(fs_exists(got_job)); /* the job config is the checkpoint's, not the model's */
    assert_int_equal(ckpt_dist_write_config(c, root, &spec, &extra, tf, 2, &err), 0);
    comm_destroy(c);
    char *root_ct = fs_join(root, "chat_template.jinja"), *alt = fs_join(root, "alt-tok");
    assert_false(fs_exists(root_ct));
    assert_int_equal(fs_mkdirs(alt, &err), 0);
    char *alt_tok = fs_join(alt, "tokenizer.json");
    assert_int_equal(fs_write_atomic(alt_tok, "{}", 2, &err), 0);
    assert_int_equal(ckpt_dist_export_path(root, by_path, dtype, shard_bytes, alt, &step, &err), 0);
    assert_int_equal(fs_read_all(got_tok, &text, &len, &err), 0);
    assert_string_equal(text, "{}");
    free(text);
    assert_false(fs_exists(got_ct));
    assert_int_equal(fs_remove_tree(alt, &err), 0);
    free(got_tok), free(got_ct), free(got_job), free(root_ct), free(alt), free(alt_tok);
    char *other = fs_join(root, "rank-0/step-2");
    assert_int_equal(ckpt_dist_export_path(other, by_path, dtype, shard_bytes, NULL, &step, &err),
                     -1);
    assert_non_null(strstr(err.msg, "does not list step 2"));
    char *gone_dir = fs_join(root, "rank-0"); /* not a root: the marker is one level up */
    assert_int_equal(
        ckpt_dist_export_path(gone_dir, by_path, dtype, shard_bytes, NULL, &step, &err), -1);
    assert_non_null(strstr(err.msg, "is not a sharded checkpoint"));
    /* An output that is some other directory is left alone. */
    char *other_out = fs_join(root, "rank-1");
    assert_int_equal(ckpt_dist_export_path(root, other_out, dtype, shard_bytes, NULL, &step, &err),
                     -1);
    assert_non_null(strstr(err.msg, "which an export does not write"));
    free(other_out), free(gone_dir), free(other), free(step_dir), free(by_path);
    /* Every parameter whole, and a run from a third of the way in (across piece, row and
     * tensor-parallel block boundaries). */
    int big = 0;
    for (int i = 0; i < np; i++) {
        if (numel[i] > numel[big]) big = i;
        size_t cols = (size_t)t.params[i].shape[t.params[i].ndim - 1];
        float *back = calloc(numel[i], sizeof(float));
        if (ckpt_dist_reader_tensor(&rd, names[i], back, numel[i], cols, &err) != 0)
            fail_msg("%s", err.msg);
        assert_memory_equal(back, full[i], numel[i] * sizeof(float));
        size_t first = numel[i] / 3, n = numel[i] / 2;
        assert_int_equal(
            ckpt_dist_reader_range(&rd, names[i], numel[i], cols, first, n, back, &err), 0);
        assert_memory_equal(back, full[i] + first, n * sizeof(float));
        free(back);
    }
    if (tp > 1) { /* a row-parallel parameter whose rows do not split is refused */
        int wo = hf_keys_find_param(&t, "layers.0.attention.wo.weight");
        float one;
        assert_int_equal(ckpt_dist_reader_range(&rd, names[wo], numel[wo], 3, 0, 1, &one, &err),
                         -1);
        assert_non_null(strstr(err.msg, "does not split into 2 tensor-parallel parts"));
    }
    float run[40];
    size_t big_cols = (size_t)t.params[big].shape[t.params[big].ndim - 1];
    assert_int_equal(ckpt_dist_reader_range(&rd, names[big], numel[big], big_cols, numel[big] - 20,
                                            40, run, &err),
                     -1);
    ckpt_dist_reader_close(&rd);
    /* A missing piece fails the export with a sentence naming the parameter. */
    char *gone = fs_join(root, "rank-0/step-3/model.safetensors");
    assert_int_equal(unlink(gone), 0);
    CkptState st = {.step = 3};
    CkptTensor one = {names[0], 1, {1}, full[0], NULL};
    char *dir0 = ckpt_dist_rank_dir(root, 0);
    assert_int_equal(ckpt_save(dir0, &st, &one, 1, NULL, 0, 0, &err), 0);
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), 0);
    char *bad = fs_join(root, "bad");
    assert_int_equal(fs_mkdirs(bad, &err), 0);
    assert_int_equal(ckpt_dist_export_hf(bad, &rd, &spec, NULL, dtype, shard_bytes, &err), -1);
    assert_non_null(strstr(err.msg, "elements"));
    ckpt_dist_reader_close(&rd);
    free(dir0), free(gone), free(bad), free(ref), free(got);
    for (int i = 0; i < np; i++)
        free(full[i]);
    free(full), free(numel), free(unit), free(names);
    hf_keys_free(&t);
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(root);
}

/* A hostile latest.json whose mesh product wraps around 2^64 to its "ranks" is refused before
 * anything is sized from it (it once asked for gigabytes, and is signed overflow). */
static void test_hostile_mesh(void **state) {
    (void)state;
    char *root = tmp_root(), *path = fs_join(root, CKPT_DIST_MARKER);
    const char *text = "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": 4, \"mesh\": "
                       "[4611686018427387905, 4, 1], \"step\": 1, \"steps\": [1]}\n";
    Err err;
    assert_int_equal(fs_write_atomic(path, text, strlen(text), &err), 0);
    CkptDistReader r;
    assert_int_equal(ckpt_dist_reader_open(&r, root, &err), -1);
    assert_non_null(strstr(err.msg, "mesh must be 3 positive integers whose product is ranks"));
    /* The expert-parallel degree (a fourth entry; absent in older markers: 1) is one a job of
     * `ranks` processes can have. */
    const char *bad_ep[] = {"[1, 4, 1, 0]", "[1, 4, 1, 5]", "[1, 4, 1, 2, 1]", "[1, 4]"};
    for (size_t i = 0; i < sizeof bad_ep / sizeof bad_ep[0]; i++) {
        char t[256];
        int n = snprintf(t, sizeof t,
                         "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": 4, \"mesh\": "
                         "%s, \"step\": 1, \"steps\": [1]}\n",
                         bad_ep[i]);
        assert_int_equal(fs_write_atomic(path, t, (size_t)n, &err), 0);
        assert_int_equal(ckpt_dist_reader_open(&r, root, &err), -1);
        if (!strstr(err.msg, "an expert-parallel degree from 1 to ranks"))
            fail_msg("%s: %s", bad_ep[i], err.msg);
    }
    const char *ep2 = "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": 4, \"mesh\": "
                      "[1, 4, 1, 2], \"step\": 1, \"steps\": [1]}\n";
    assert_int_equal(fs_write_atomic(path, ep2, strlen(ep2), &err), 0);
    CkptDistFound f;
    assert_int_equal(ckpt_dist_locate(NULL, root, 1, &f, &err), 1);
    assert_true(f.mesh[1] == 4 && f.mesh[3] == 2);
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(path);
    free(root);
}

/* latest.json carries its own checksum: a damaged one (edited, truncated) is replaced by what
 * the step directories hold, the newest step complete on every rank of the mesh its layout
 * records; steps without such a layout cannot be recovered, and that is a sentence, not a
 * fresh start that would later prune them. */
static void test_marker_recovery(void **state) {
    (void)state;
    Comm *c = comm_single_create();
    float w[8] = {0}, m[8] = {0}, v[8] = {0};
    CkptTensor model = {"w", 1, {8}, w, NULL};
    CkptTensor optim[2] = {{"w.exp_avg", 1, {8}, m, NULL}, {"w.exp_avg_sq", 1, {8}, v, NULL}};
    ShardSlice slice;
    shard_slice_whole(&slice, 1, model.shape);
    Err err;
    CkptDistFound f;
    for (int layouts = 1; layouts >= 0; layouts--) {
        char *root = tmp_root(), *path = fs_join(root, CKPT_DIST_MARKER);
        for (int64_t s = 1; s <= 3; s++) {
            CkptState st = {.step = s, .optim_step = s};
            assert_int_equal(ckpt_dist_save(c, MESH1, root, &st, &model, layouts ? &slice : NULL, 1,
                                            optim, 2, 0, &err),
                             0);
        }
        char *text;
        size_t len;
        assert_int_equal(fs_read_all(path, &text, &len, &err), 0);
        assert_non_null(strstr(text, "\"" CKPT_SUM_KEY "\": \""));
        /* The newest step dropped from the list, as a hand edit would: checksum fails. */
        char *last = strstr(text, "3\n  ]");
        assert_non_null(last);
        last[-6] = ' ', last[0] = ' '; /* ",\n    3" -> " \n     " */
        assert_int_equal(fs_write_atomic(path, text, len, &err), 0);
        int found = ckpt_dist_locate(c, root, -1, &f, &err);
        if (layouts) {
            assert_int_equal(found, 1);
            assert_int_equal(f.step, 3);
            assert_int_equal(f.ranks, 1);
            assert_int_equal(f.mesh[1], 1);
            /* Truncated: the same. load_step finds an older step among those recovered. */
            assert_int_equal(fs_write_atomic(path, text, len / 2, &err), 0);
            assert_int_equal(ckpt_dist_locate(c, root, 2, &f, &err), 1);
            assert_int_equal(f.step, 2);
            /* The next save writes a good marker again, listing every recovered step. */
            CkptState st = {.step = 4, .optim_step = 4};
            assert_int_equal(
                ckpt_dist_save(c, MESH1, root, &st, &model, &slice, 1, optim, 2, 0, &err), 0);
            CkptDistReader r;
            assert_int_equal(ckpt_dist_reader_open_step(&r, root, 1, &err), 0);
            ckpt_dist_reader_close(&r);
            /* A missing marker beside the steps: recovered too, not a fresh start. */
            assert_int_equal(unlink(path), 0);
            assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), 1);
            assert_int_equal(f.step, 4);
            assert_true(ckpt_dist_is_sharded_path(root)); /* `qtitan export FOLDER` too */
        } else {
            assert_int_equal(found, -1);
            assert_non_null(strstr(err.msg, "(edited or corrupted); no step could be recovered"));
            assert_non_null(strstr(err.msg, "or remove it and the rank-N folders to start afresh"));
            assert_int_equal(unlink(path), 0);
            assert_int_equal(ckpt_dist_locate(c, root, -1, &f, &err), -1);
            assert_non_null(strstr(err.msg, "latest.json is missing; no step could be recovered"));
        }
        free(text);
        free(path);
        assert_int_equal(fs_remove_tree(root, &err), 0);
        free(root);
    }
    comm_destroy(c);
}

static void test_export_hf(void **state) {
    (void)state;
    export_round_trip("debugmodel", NULL, 2, 1, DT_F32, 5000000000u, 2);      /* tied, one file */
    export_round_trip("debugmodel_moe", NULL, 3, 1, DT_F32, 6000, 0);         /* shards + index */
    export_round_trip("debugmodel_moe", NULL, 2, 1, DT_BF16, 5000000000u, 2); /* converted */
}

/* Tensor-parallel pieces joined: TP 2 alone, FSDP 2 x TP 2 (untied, in shards, bf16) and
 * FSDP 3 x TP 2 (pieces cut inside rows). */
static void test_export_hf_tp(void **state) {
    (void)state;
    export_round_trip("debugmodel", NULL, 1, 2, DT_F32, 5000000000u, 2);
    export_round_trip("debugmodel", "false", 2, 2, DT_BF16, 6000, 0);
    export_round_trip("debugmodel", "false", 3, 2, DT_F32, 5000000000u, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_find_prune), cmocka_unit_test(test_reader),
        cmocka_unit_test(test_hostile_mesh),    cmocka_unit_test(test_marker_recovery),
        cmocka_unit_test(test_export_hf),       cmocka_unit_test(test_export_hf_tp),
    };
    return cmocka_run_group_tests(tests, 0, NULL);
}
