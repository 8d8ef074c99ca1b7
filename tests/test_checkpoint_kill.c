/* Crash safety of checkpoints: a child process saves checkpoints in a loop and is SIGKILLed at
 * random moments, 30 times. After every kill the newest complete step must load, and its data
 * must be exactly what was saved at that step; leftovers are cleaned and the child resumes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "train/checkpoint.h"

enum { N = 64 * 1024, KILLS = 30 };

static float value_at(int64_t step, int tensor, long i) {
    return (float)((step * 7919 + tensor * 104729 + i) % 1000003) * 0.001f;
}

static void fill(float *const *bufs, int64_t step) {
    for (int t = 0; t < 3; t++)
        for (long i = 0; i < N; i++)
            bufs[t][i] = value_at(step, t, i);
}

static void describe(CkptTensor *model, CkptTensor *optim, float *const *bufs) {
    model[0] = (CkptTensor){"w", 2, {256, 256}, bufs[0], NULL};
    optim[0] = (CkptTensor){"w.exp_avg", 2, {256, 256}, bufs[1], NULL};
    optim[1] = (CkptTensor){"w.exp_avg_sq", 2, {256, 256}, bufs[2], NULL};
}

/* The child: saves steps first, first + 1, ... until killed. */
static void child_loop(const char *root, int64_t first) {
    float *bufs[3];
    for (int t = 0; t < 3; t++)
        bufs[t] = malloc(N * sizeof(float));
    CkptTensor model[1], optim[2];
    describe(model, optim, bufs);
    for (int64_t step = first;; step++) {
        fill(bufs, step);
        json_t *pos = json_pack("{s:I}", "row", (json_int_t)step);
        CkptState st = {.step = step,
                        .tokens_seen = step * 10,
                        .optim_step = step,
                        .data_position = pos,
                        .rng = {(uint64_t)step, 2, 3, 4}};
        Err err;
        if (ckpt_save(root, &st, model, 1, optim, 2, 3, &err) != 0) {
            fprintf(stderr, "child: %s\n", err.msg);
            _exit(2);
        }
        json_decref(pos);
    }
}

static void test_kill_during_save(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_ckpt_kill_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *root = fs_join(tmpl, "checkpoint");
    float *bufs[3];
    for (int t = 0; t < 3; t++)
        bufs[t] = malloc(N * sizeof(float));
    CkptTensor model[1], optim[2];
    describe(model, optim, bufs);
    Rng rng;
    rng_seed(&rng, (uint64_t)time(NULL), 0);
    int64_t next = 1, found_max = -1, loads = 0;
    for (int k = 0; k < KILLS; k++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) child_loop(root, next);
        /* 0 to 60 ms: from before the first save starts to several saves in. */
        struct timespec d = {0, (long)rng_below(&rng, 60000) * 1000L};
        nanosleep(&d, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); /* it was killed, it did not fail */
        Err err;
        assert_int_equal(ckpt_clean_stale(root, &err), 0);
        int64_t step;
        char *path;
        int rc = ckpt_find_latest(root, &step, &path, &err);
        assert_true(rc >= 0);
        if (rc == 0) {
            assert_int_equal(found_max, -1); /* once a step exists, one always stays */
            continue;
        }
        assert_true(step >= found_max);
        found_max = step;
        CkptState st;
        if (ckpt_load(path, &st, model, 1, optim, 2, &err) != 0) {
            fprintf(stderr, "kill %d: %s\n", k, err.msg);
            fail();
        }
        assert_int_equal(st.step, step);
        assert_int_equal(st.tokens_seen, step * 10);
        assert_int_equal(st.rng[0], (uint64_t)step);
        assert_int_equal(json_integer_value(json_object_get(st.data_position, "row")), step);
        json_decref(st.data_position);
        for (int t = 0; t < 3; t++)
            for (long i = 0; i < N; i++)
                if (bufs[t][i] != value_at(step, t, i)) {
                    fprintf(stderr, "kill %d: step %lld tensor %d element %ld differs\n", k,
                            (long long)step, t, i);
                    fail();
                }
        loads++;
        next = step + 1;
        free(path);
    }
    printf("%d kills, %lld verified loads, newest step %lld\n", KILLS, (long long)loads,
           (long long)found_max);
    assert_true(loads > 0);
    Err err;
    fs_remove_tree(tmpl, &err);
    for (int t = 0; t < 3; t++)
        free(bufs[t]);
    free(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_during_save)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
