/* Route 1 trains an HF MoE directory as transformers does: the router auxiliary loss only
 * when config.json sets output_router_logits (the published configs carry a coefficient with
 * the flag off), unless the job config asks for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/fs.h"
#include "core/json.h"
#include "train/train_job.h"

static char dir[64];

/* Writes DIR/config.json: the transformers-written MoE fixture with output_router_logits set,
 * and DIR/job.toml naming DIR as the HF assets. */
static void write_job(int router_logits) {
    Err err;
    char *src = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/hf_keys/moe.config.json");
    json_t *j = json_load_path(src, &err);
    assert_non_null(j);
    json_object_set_new(j, "output_router_logits", json_boolean(router_logits));
    char *cfg = fs_join(dir, "config.json");
    assert_int_equal(json_dump_file(j, cfg, 0), 0);
    json_decref(j);
    char toml[512];
    snprintf(toml, sizeof toml, "[model]\nflavor = \"hf\"\nhf_assets_path = \"%s\"\n", dir);
    char *job = fs_join(dir, "job.toml");
    assert_int_equal(fs_write_atomic(job, toml, strlen(toml), &err), 0);
    free(src);
    free(cfg);
    free(job);
}

static double coef_of(int argc, char **argv) {
    JobConfig cfg;
    ModelSpec spec;
    HfConfigExtra extra;
    Err err;
    char *job = fs_join(dir, "job.toml");
    assert_int_equal(config_load(&cfg, job, argc, argv, &err), 0);
    assert_int_equal(train_job_spec(&cfg, &spec, &extra, &err), 0);
    config_free(&cfg);
    free(job);
    return spec.router_aux_loss_coef;
}

static void test_aux_loss_follows_output_router_logits(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qt_route1_XXXXXX");
    assert_non_null(mkdtemp(dir));
    write_job(0);
    assert_true(coef_of(0, NULL) == 0.0);
    char *on[] = {"--model.router_aux_loss_coef=0.01"};
    assert_true(coef_of(1, on) == 0.01);
    write_job(1);
    assert_true(coef_of(0, NULL) == 0.001); /* the fixture's coefficient */
    Err err;
    assert_int_equal(fs_remove_tree(dir, &err), 0);
}

int main(void) {
    if (!getenv("QT_SOURCE_DIR")) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aux_loss_follows_output_router_logits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
