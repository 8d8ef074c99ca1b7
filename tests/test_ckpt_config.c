/* The job config a checkpoint saves key by key (train/ckpt_config.h): which keys a resume
 * reports as a mesh change, which it warns about, which it leaves out; the config's round trip
 * through train_state.json, and a hostile "config" member there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "train/checkpoint.h"
#include "train/ckpt_config.h"

/* The keys of the default config with each "section.key=value" of sets applied. */
static json_t *keys_with(const char *const *sets, int n) {
    JobConfig c;
    Err err = {{0}};
    config_init(&c);
    for (int i = 0; i < n; i++) {
        char *k = xstrdup(sets[i]), *eq = strchr(k, '=');
        *eq = '\0';
        assert_int_equal(config_apply_override(&c, k, eq + 1, "test", &err), 0);
        free(k);
    }
    json_t *keys = ckpt_config_keys(&c);
    config_free(&c);
    assert_non_null(keys);
    return keys;
}

static void test_keys(void **state) {
    (void)state;
    const char *sets[] = {"parallelism.data_parallel_shard_degree=4", "training.steps=7"};
    json_t *k = keys_with(sets, 2);
    assert_string_equal(
        json_string_value(json_object_get(k, "parallelism.data_parallel_shard_degree")), "4");
    assert_string_equal(json_string_value(json_object_get(k, "training.steps")), "7");
    assert_non_null(json_object_get(k, "job.dump_folder"));
    json_decref(k);
}

static void test_changes(void **state) {
    (void)state;
    const char *a_sets[] = {"parallelism.data_parallel_shard_degree=4", "training.steps=4",
                            "job.dump_folder=/a", "checkpoint.load_step=2"};
    const char *b_sets[] = {"parallelism.data_parallel_shard_degree=2",
                            "parallelism.expert_parallel_degree=2", "training.steps=6",
                            "job.dump_folder=/b", "checkpoint.exclude_from_loading=optimizer"};
    json_t *a = keys_with(a_sets, 4), *b = keys_with(b_sets, 5);
    char *mesh = ckpt_config_changes(a, b, 1), *other = ckpt_config_changes(a, b, 0);
    assert_string_equal(mesh, "parallelism.data_parallel_shard_degree = 4 (now 2), "
                              "parallelism.expert_parallel_degree = 1 (now 2)");
    /* dump_folder, load_step and exclude_from_loading steer the resume: never reported */
    assert_string_equal(other, "training.steps = 4 (now 6)");
    free(mesh);
    free(other);
    /* The same config, and one that only moved its folder: nothing to say. */
    const char *c_sets[] = {"parallelism.data_parallel_shard_degree=4", "training.steps=4"};
    json_t *c = keys_with(c_sets, 2);
    assert_null(ckpt_config_changes(a, a, 1));
    assert_null(ckpt_config_changes(a, a, 0));
    assert_null(ckpt_config_changes(a, c, 0));
    /* A key only one side has (a checkpoint from a version with other keys). */
    json_object_del(c, "training.steps");
    json_object_set_new(c, "training.old_key", json_string("1"));
    other = ckpt_config_changes(a, c, 0);
    assert_string_equal(other,
                        "training.old_key = (not set) (now 1), training.steps = 4 (now (not set))");
    free(other);
    other = ckpt_config_changes(c, a, 0);
    assert_string_equal(other,
                        "training.steps = (not set) (now 4), training.old_key = 1 (now (not set))");
    free(other);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

static char *make_dir(void) {
    char tmpl[] = "/tmp/qt_ckcfg_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return xstrdup(tmpl);
}

static void test_round_trip(void **state) {
    (void)state;
    char *root = make_dir();
    const char *sets[] = {"training.steps=3"};
    json_t *keys = keys_with(sets, 1);
    float w[4] = {1, 2, 3, 4};
    CkptTensor model = {"norm.weight", 1, {4}, w, NULL};
    CkptState st = {.step = 1, .config_hash = 7, .config = keys};
    Err err = {{0}};
    assert_int_equal(ckpt_save(root, &st, &model, 1, NULL, 0, 0, &err), 0);
    char *dir = fs_join(root, "step-1");
    CkptState back;
    assert_int_equal(ckpt_read_state(dir, &back, &err), 0);
    assert_non_null(back.config);
    assert_true(json_equal(back.config, keys));
    ckpt_state_release(&back);
    assert_null(back.config);
    /* Saved without it (a checkpoint from before): loads with config NULL. */
    st.config = NULL;
    assert_int_equal(ckpt_save(root, &st, &model, 1, NULL, 0, 0, &err), 0);
    assert_int_equal(ckpt_read_state(dir, &back, &err), 0);
    assert_null(back.config);
    ckpt_state_release(&back);
    json_decref(keys);
    free(dir);
    fs_remove_tree(root, &err);
    free(root);
}

/* Writes a train_state.json with member `config` set to cfg (JSON text) and a valid checksum,
 * so that only the config member is wrong. */
static void write_state(const char *dir, const char *cfg) {
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"qtitan-checkpoint\", \"version\": %d, \"step\": 1, "
                     "\"tokens_seen\": 0, \"optim_step\": 0, \"rng\": [\"1\", \"2\", \"3\", "
                     "\"4\"], \"config_hash\": \"0000000000000007\", \"config\": %s, "
                     "\"state_checksum\": \"0000000000000000\"}\n",
                     CKPT_FORMAT_VERSION, cfg);
    char sum[17];
    snprintf(sum, sizeof sum, "%016" PRIx64, ckpt_checksum(text, (size_t)n));
    memcpy(strstr(text, "\"state_checksum\": \"") + 19, sum, 16);
    char *path = fs_join(dir, CKPT_STATE_FILE);
    Err err;
    assert_int_equal(fs_write_atomic(path, text, (size_t)n, &err), 0);
    free(path);
}

static void test_hostile(void **state) {
    (void)state;
    char *dir = make_dir();
    CkptState st;
    Err err = {{0}};
    write_state(dir, "{\"training.steps\": \"3\"}");
    assert_int_equal(ckpt_read_state(dir, &st, &err), 0); /* the forged file itself is fine */
    assert_string_equal(json_string_value(json_object_get(st.config, "training.steps")), "3");
    ckpt_state_release(&st);
    write_state(dir, "[1, 2]");
    assert_int_equal(ckpt_read_state(dir, &st, &err), -1);
    assert_non_null(strstr(err.msg, "train_state.json: config must be an object"));
    write_state(dir, "{\"training.steps\": 3}");
    assert_int_equal(ckpt_read_state(dir, &st, &err), -1);
    assert_non_null(strstr(err.msg, "config key \"training.steps\" must have a string value"));
    fs_remove_tree(dir, &err);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_changes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
