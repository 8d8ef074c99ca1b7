/* Unit tests for src/core/progress: the shown amount, percent, rate and time left against
 * values worked out by hand, and the plain periodic lines when stderr is not a terminal
 * (QT_PROGRESS_SECONDS=0: a line per update). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/progress.h"

static void test_format(void **state) {
    (void)state;
    Progress p;
    progress_start(&p, "tokenizing x", 45.6e6, "MB", 1e6);
    char buf[128];
    /* 12.3 MB in 4 s: 3.075 MB/s; 33.3 MB left: 10.8 s. */
    progress_format(buf, sizeof buf, &p, 12.3e6, p.t0 + 4.0);
    assert_string_equal(buf, " 27%  12.3/45.6 MB  3.1 MB/s  eta 0m11s");
    /* Unknown total: amount and rate only. */
    p.total = 0;
    progress_format(buf, sizeof buf, &p, 2e6, p.t0 + 1.0);
    assert_string_equal(buf, "2.0 MB  2.0 MB/s");
}

static void test_plain_lines(void **state) {
    (void)state;
    char path[] = "/tmp/qt_progress_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(2);
    dup2(fd, 2); /* a file, not a terminal */
    setenv("QT_PROGRESS_SECONDS", "0", 1);
    Progress p;
    progress_start(&p, "loading m", 4, "tensors", 1);
    progress_add(&p, 1);
    progress_add(&p, 3);
    progress_finish(&p);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    unsetenv("QT_PROGRESS_SECONDS");
    FILE *f = fopen(path, "r");
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        assert_non_null(strstr(line, "loading m: "));
        assert_null(strchr(line, '\r'));
    }
    fclose(f);
    unlink(path);
    assert_int_equal(n, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_plain_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
