/* Every recipe in configs/ is a job the trainer would accept: it loads (unknown keys, types and
 * ranges), its model spec builds and validates for native flavors, and the cross-key checks
 * the trainer runs before allocating (seq_len within the model's positions, batch
 * divisibility, warmup within the run, HF export and load switches) pass. Also pins the
 * route-1 / route-2 recipes to what they promise (flavor "hf" loading HF weights, the 4B
 * flavor with a global batch of 64). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "train/train_job.h"

static void load(JobConfig *c, const char *path) {
    Err err = {{0}};
    if (config_load(c, path, 0, NULL, &err) != 0) fail_msg("%s: %s", path, err.msg);
}

static void test_every_recipe_passes_the_trainer_checks(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char pattern[1024];
    snprintf(pattern, sizeof pattern, "%s/configs/*.toml", src);
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= 5);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        JobConfig c;
        load(&c, g.gl_pathv[i]);
        Err err = {{0}};
        ModelSpec spec;
        HfConfigExtra extra;
        int hf = strcmp(c.model.flavor, "hf") == 0;
        /* Route 1 reads its architecture from a downloaded directory that CI does not have. */
        if (!hf && train_job_spec(&c, &spec, &extra, &err) != 0)
            fail_msg("%s: %s", g.gl_pathv[i], err.msg);
        if (train_job_check(&c, hf ? NULL : &spec, &err) != 0)
            fail_msg("%s: %s", g.gl_pathv[i], err.msg);
        printf("%-28s ok (%s)\n", strrchr(g.gl_pathv[i], '/') + 1, c.model.flavor);
        config_free(&c);
    }
    globfree(&g);
}

static void test_route_recipes(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[1024];
    JobConfig c;
    snprintf(path, sizeof path, "%s/configs/qwen3_4b_finetune.toml", src);
    load(&c, path);
    assert_string_equal(c.model.flavor, "hf");
    assert_string_equal(c.model.hf_assets_path, "./assets/hf/Qwen3-4B-Instruct-2507");
    assert_string_equal(c.checkpoint.initial_load_path, c.model.hf_assets_path);
    assert_true(c.checkpoint.initial_load_in_hf && c.checkpoint.last_save_in_hf);
    assert_string_equal(c.training.dataset, "c4_test");
    assert_int_equal(c.training.steps, 10);
    assert_int_equal(c.training.local_batch_size, 1);
    assert_int_equal(c.parallelism.data_parallel_shard_degree, -1);
    config_free(&c);

    snprintf(path, sizeof path, "%s/configs/qwen3_4b_native.toml", src);
    load(&c, path);
    assert_string_equal(c.model.flavor, "4B");
    assert_int_equal(c.training.global_batch_size, 64);
    ModelSpec s;
    HfConfigExtra extra;
    Err err;
    assert_int_equal(train_job_spec(&c, &s, &extra, &err), 0);
    assert_int_equal(s.dim, 2560);
    assert_int_equal(s.n_layers, 36);
    config_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_recipe_passes_the_trainer_checks),
        cmocka_unit_test(test_route_recipes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
