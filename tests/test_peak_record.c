/* Unit tests for the machine's peak record (core/peak_record.h): the text round-trips; the
 * update keeps the larger of the record and the measurement and counts the runs; a record of
 * another machine, a malformed one or an unreadable one is replaced; the file name follows the
 * identity; malformed texts fail with one sentence naming the file, the line and what was
 * expected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/peak_record.h"

static PeakRecord machine(void) {
    PeakRecord r;
    memset(&r, 0, sizeof r);
    snprintf(r.cpu, sizeof r.cpu, "Test CPU (R) 9000");
    r.processors = 4;
    snprintf(r.unit, sizeof r.unit, "amx bf16");
    r.threads = 2;
    return r;
}

static char *tmp_dir(void) {
    char tmpl[] = "/tmp/qt_peak_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static PeakRecord read_record(const char *path) {
    char *text;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(path, &text, &len, &err), 0);
    PeakRecord r;
    assert_int_equal(peak_record_parse(text, len, path, &r, &err), 0);
    free(text);
    return r;
}

static void test_round_trip(void **state) {
    (void)state;
    PeakRecord r = machine(), back;
    r.tflops = 4.585;
    r.runs = 7;
    char buf[512];
    int n = peak_record_format(buf, sizeof buf, &r);
    Err err;
    assert_int_equal(peak_record_parse(buf, (size_t)n, "r.txt", &back, &err), 0);
    assert_string_equal(back.cpu, r.cpu);
    assert_string_equal(back.unit, r.unit);
    assert_int_equal(back.processors, 4);
    assert_int_equal(back.threads, 2);
    assert_int_equal(back.runs, 7);
    assert_true(back.tflops == 4.585);
    /* lines in another order, no final newline */
    const char *other = "qtitan peak record 1\nruns 3\ntflops 0.5\nthreads 1\nunit fp32 fma\n"
                        "processors 1\ncpu x";
    assert_int_equal(peak_record_parse(other, strlen(other), "r.txt", &back, &err), 0);
    assert_int_equal(back.runs, 3);
    assert_string_equal(back.unit, "fp32 fma");
    assert_string_equal(back.cpu, "x");
}

static void test_update(void **state) {
    (void)state;
    char *dir = tmp_dir(), *sub = fs_join(dir, "a/b");
    PeakRecord self = machine();
    char *path = peak_record_path(sub, &self);
    long runs = 0;
    /* no record yet: this run's measurement, and the folder made */
    assert_true(peak_record_update(path, &self, 2.0, &runs) == 2.0);
    assert_int_equal(runs, 1);
    /* a slower run reads the best so far; a faster one raises it */
    assert_true(peak_record_update(path, &self, 1.0, &runs) == 2.0);
    assert_int_equal(runs, 2);
    assert_true(peak_record_update(path, &self, 4.5, &runs) == 4.5);
    assert_int_equal(runs, 3);
    PeakRecord r = read_record(path);
    assert_true(r.tflops == 4.5);
    assert_int_equal(r.runs, 3);
    assert_string_equal(r.cpu, self.cpu);
    /* a record naming another machine (edited by hand, say) is replaced */
    PeakRecord other = self;
    other.threads = 16;
    other.tflops = 100.0;
    other.runs = 9;
    char buf[512];
    int n = peak_record_format(buf, sizeof buf, &other);
    assert_true(n > 0);
    write_file(path, buf);
    assert_true(peak_record_update(path, &self, 3.0, &runs) == 3.0);
    assert_int_equal(runs, 1);
    assert_int_equal(read_record(path).threads, 2);
    /* so is a malformed one */
    write_file(path, "qtitan peak record 1\ntflops lots\n");
    assert_true(peak_record_update(path, &self, 3.5, &runs) == 3.5);
    assert_int_equal(runs, 1);
    assert_true(read_record(path).tflops == 3.5);
    /* a record that cannot be written (its folder is a file) leaves the measurement */
    char *blocked = fs_join(dir, "file");
    write_file(blocked, "x");
    char *inside = fs_join(blocked, "peak.txt");
    assert_true(peak_record_update(inside, &self, 1.25, &runs) == 1.25);
    assert_int_equal(runs, 1);
    Err err;
    assert_int_equal(fs_remove_tree(dir, &err), 0);
    free(inside), free(blocked), free(path), free(sub), free(dir);
}

static void test_path(void **state) {
    (void)state;
    PeakRecord r = machine();
    char *p = peak_record_path("/c", &r);
    assert_string_equal(p, "/c/peak-amx_bf16-2t-Test_CPU__R__9000-4p.txt");
    free(p);
    r.threads = 1; /* every part of the identity is in the name */
    p = peak_record_path("/c", &r);
    assert_string_equal(p, "/c/peak-amx_bf16-1t-Test_CPU__R__9000-4p.txt");
    free(p);
    PeakRecord here;
    peak_record_this_machine(&here, "fp32 fma", 3);
    assert_true(here.cpu[0] != 0);
    assert_true(here.processors >= 1);
    assert_int_equal(here.threads, 3);
    assert_string_equal(here.unit, "fp32 fma");
}

static void fails(const char *text, const char *msg) {
    PeakRecord r;
    Err err;
    assert_int_not_equal(peak_record_parse(text, strlen(text), "p.txt", &r, &err), 0);
    assert_string_equal(err.msg, msg);
}

#define FULL_TAIL "processors 2\nunit amx bf16\nthreads 2\ntflops 4.5\nruns 3\n"

static void test_malformed(void **state) {
    (void)state;
    fails("", "p.txt: line 1: expected \"qtitan peak record 1\", found an empty file");
    fails("qtitan peak record 2\n", "p.txt: line 1: expected \"qtitan peak record 1\"");
    fails("qtitan peak record 1\ncpu x\n",
          "p.txt: line 3: expected a line \"processors\" (a processor count from 1)");
    fails("qtitan peak record 1\ncpu x\ncolour blue\n",
          "p.txt: line 3: expected one of cpu, processors, unit, threads, tflops, runs followed "
          "by a space and its value");
    fails("qtitan peak record 1\ncpu x\ncpu y\n", "p.txt: line 3: cpu given twice");
    fails("qtitan peak record 1\ncpu \n" FULL_TAIL,
          "p.txt: line 2: cpu: expected the CPU's model name");
    fails("qtitan peak record 1\ncpu x\nprocessors 0\n",
          "p.txt: line 3: processors: expected a processor count from 1");
    fails("qtitan peak record 1\ncpu x\nthreads -2\n",
          "p.txt: line 3: threads: expected a thread count from 1");
    fails("qtitan peak record 1\ncpu x\nthreads 2x\n",
          "p.txt: line 3: threads: expected a thread count from 1");
    fails("qtitan peak record 1\ntflops 0\n",
          "p.txt: line 2: tflops: expected a finite TFLOP/s above 0");
    fails("qtitan peak record 1\ntflops nan\n",
          "p.txt: line 2: tflops: expected a finite TFLOP/s above 0");
    fails("qtitan peak record 1\ntflops 1e999\n",
          "p.txt: line 2: tflops: expected a finite TFLOP/s above 0");
    fails("qtitan peak record 1\ntflops 2.5 \n",
          "p.txt: line 2: tflops: expected a finite TFLOP/s above 0");
    fails("qtitan peak record 1\nruns 0\n", "p.txt: line 2: runs: expected a run count from 1");
    char nul[] = "qtitan peak record 1\ncpu a\0b\n";
    PeakRecord r;
    Err err;
    assert_int_not_equal(peak_record_parse(nul, sizeof nul - 1, "p.txt", &r, &err), 0);
    assert_string_equal(err.msg, "p.txt: line 2: expected text, found a NUL byte");
    /* the whole record is required */
    fails("qtitan peak record 1\ncpu x\n" FULL_TAIL "\n",
          "p.txt: line 8: expected one of cpu, processors, unit, threads, tflops, runs followed "
          "by a space and its value");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_update),
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
