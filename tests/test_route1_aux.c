/* Route 1 trains an HF MoE directory as transformers does: the router auxiliary loss only
 * when config.json sets output_router_logits (the published configs carry a coefficient with
 * the flag off), unless the job config asks for it. The config.json a run writes (checkpoints,
 * the HF export) keeps the imported router_aux_loss_coef and output_router_logits. A config
 * with attention_dropout > 0 is refused for training (qtitan has no dropout). */
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
#include "io/hf_config.h"
#include "train/train_job.h"

static char dir[64];

/* Writes DIR/config.json: the transformers-written MoE fixture with output_router_logits set
 * and attention_dropout (when >= 0), and DIR/job.toml naming DIR as the HF assets. */
static void write_job_dropout(int router_logits, double dropout) {
    Err err;
    char *src = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/hf_keys/moe.config.json");
    json_t *j = json_load_path(src, &err);
    assert_non_null(j);
    json_object_set_new(j, "output_router_logits", json_boolean(router_logits));
    if (dropout >= 0) json_object_set_new(j, "attention_dropout", json_real(dropout));
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

static void write_job(int router_logits) {
    write_job_dropout(router_logits, -1);
}

/* The spec and extra route 1 builds from DIR/job.toml and the config.json a run writes for
 * them: its output_router_logits and router_aux_loss_coef. */
static void written_config(int *router_logits, double *coef) {
    JobConfig cfg;
    ModelSpec spec;
    HfConfigExtra extra;
    Err err;
    char *job = fs_join(dir, "job.toml");
    assert_int_equal(config_load(&cfg, job, 0, NULL, &err), 0);
    assert_int_equal(train_job_spec(&cfg, &spec, &extra, &err), 0);
    size_t len;
    char *text = model_spec_hf_config_text(&spec, &extra, "float32", &len, &err);
    assert_non_null(text);
    json_t *j = json_load_mem(text, len, "written", &err);
    assert_non_null(j);
    assert_int_equal(json_opt_bool(j, "output_router_logits", router_logits, "written", &err), 0);
    assert_int_equal(json_req_num(j, "router_aux_loss_coef", coef, "written", &err), 0);
    json_decref(j);
    free(text);
    config_free(&cfg);
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

/* The written config.json is what transformers would train the same way: the fixture's
 * coefficient (0.001) and flag, also where route 1 trained without the auxiliary loss (an
 * export used to say 0.0 there, and false where the source said true). */
static void test_written_config_keeps_aux_settings(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qt_route1_XXXXXX");
    assert_non_null(mkdtemp(dir));
    int flag = -1;
    double coef = -1;
    write_job(0);
    written_config(&flag, &coef);
    assert_int_equal(flag, 0);
    assert_true(coef == 0.001);
    write_job(1);
    written_config(&flag, &coef);
    assert_int_equal(flag, 1);
    assert_true(coef == 0.001);
    Err err;
    assert_int_equal(fs_remove_tree(dir, &err), 0);
}

/* attention_dropout > 0 would train a different model than transformers does: refused with a
 * sentence naming it; 0 (the published configs) trains. */
static void test_attention_dropout_refused(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qt_route1_XXXXXX");
    assert_non_null(mkdtemp(dir));
    JobConfig cfg;
    ModelSpec spec;
    HfConfigExtra extra;
    Err err;
    char *job = fs_join(dir, "job.toml");
    write_job_dropout(0, 0.1);
    assert_int_equal(config_load(&cfg, job, 0, NULL, &err), 0);
    assert_int_not_equal(train_job_spec(&cfg, &spec, &extra, &err), 0);
    assert_non_null(strstr(err.msg, "attention_dropout 0.1 is not supported in training"));
    config_free(&cfg);
    write_job_dropout(0, 0.0);
    assert_int_equal(config_load(&cfg, job, 0, NULL, &err), 0);
    assert_int_equal(train_job_spec(&cfg, &spec, &extra, &err), 0);
    config_free(&cfg);
    free(job);
    assert_int_equal(fs_remove_tree(dir, &err), 0);
}

int main(void) {
    if (!getenv("QT_SOURCE_DIR")) return 77;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_aux_loss_follows_output_router_logits),
                                       cmocka_unit_test(test_written_config_keeps_aux_settings),
                                       cmocka_unit_test(test_attention_dropout_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
