/* Unit tests for src/train/tensorboard (TensorBoard event files) against values computed
 * independently: CRC-32C check values (the standard "123456789" vector and RFC 3720's 32 zero
 * bytes), masked CRCs, a framed record and Event encodings produced by the tensorboard Python
 * package (masked_crc32c, event_pb2; the commands are in the comments); then a file written by
 * tb_open / tb_write_scalars read back record by record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "tb_event.pb-c.h"
#include "train/metrics.h"
#include "train/tensorboard.h"

static void test_crc32c(void **state) {
    (void)state;
    assert_int_equal(tb_crc32c("123456789", 9), 0xE3069283u);
    uint8_t zeros[32] = {0};
    assert_int_equal(tb_crc32c(zeros, 32), 0x8A9136AAu);
    /* tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"123456789") */
    assert_int_equal(tb_masked_crc32c("123456789", 9), 0xC78AB0E5u);
    /* masked_crc32c(struct.pack("<Q", 24)) */
    uint8_t len24[8] = {24, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(tb_masked_crc32c(len24, 8), 0x224B7FA3u);
}

static void test_frame(void **state) {
    (void)state;
    /* h = struct.pack("<Q", 6); h + pack("<I", masked_crc32c(h)) + b"qtitan" +
     * pack("<I", masked_crc32c(b"qtitan")) */
    static const uint8_t want[] = {0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                   0x73, 0x69, 0xd5, 0x37, 0x71, 0x74, 0x69, 0x74,
                                   0x61, 0x6e, 0x27, 0xcd, 0x97, 0x58};
    uint8_t rec[sizeof want];
    tb_frame(rec, "qtitan", 6);
    assert_memory_equal(rec, want, sizeof want);
}

/* The records of a file: payloads after checking each frame's CRCs. */
static int read_records(const char *path, uint8_t **payloads, size_t *lens, int cap) {
    char *data;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    int n = 0;
    for (size_t pos = 0; pos < len; n++) {
        assert_true(n < cap && pos + 16 <= len);
        uint64_t plen = 0;
        for (int i = 0; i < 8; i++)
            plen |= (uint64_t)(uint8_t)data[pos + i] << (8 * i);
        assert_true(pos + 16 + plen <= len);
        uint8_t *rec = malloc(plen + 16);
        tb_frame(rec, data + pos + 12, plen);
        assert_memory_equal(rec, data + pos, plen + 16); /* the CRCs as tb_frame makes them */
        payloads[n] = malloc(plen ? plen : 1);
        memcpy(payloads[n], data + pos + 12, plen);
        lens[n] = plen;
        free(rec);
        pos += 16 + plen;
    }
    free(data);
    return n;
}

static void test_event_file(void **state) {
    (void)state;
    char dir[] = "/tmp/qt_tb_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *sub = fs_join(dir, "tb/run");
    MetricsWriter w = {0};
    Err err;
    assert_int_equal(metrics_writer_open_tensorboard(&w, sub, &err), 0);
    char *path = strdup(tb_path(w.tb));
    MetricsExtra kv[] = {{"loss", 2.5}, {"grad_norm", 0.75}};
    assert_int_equal(metrics_log_scalars(&w, 3, kv, 2, &err), 0);
    metrics_writer_close(&w);

    uint8_t *p[4];
    size_t l[4];
    assert_int_equal(read_records(path, p, l, 4), 2);
    /* Each event, its wall time cleared, against event_pb2.Event(...).SerializeToString(). */
    static const uint8_t version[] = {0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e,
                                      0x45, 0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32};
    static const uint8_t scalars[] = {0x10, 0x03, 0x2a, 0x1f, 0x0a, 0x0b, 0x0a, 0x04, 0x6c,
                                      0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x20, 0x40, 0x0a,
                                      0x10, 0x0a, 0x09, 0x67, 0x72, 0x61, 0x64, 0x5f, 0x6e,
                                      0x6f, 0x72, 0x6d, 0x15, 0x00, 0x00, 0x40, 0x3f};
    const uint8_t *want[] = {version, scalars};
    size_t want_len[] = {sizeof version, sizeof scalars};
    for (int i = 0; i < 2; i++) {
        QtTb__Event *ev = qt_tb__event__unpack(NULL, l[i], p[i]);
        assert_non_null(ev);
        assert_true(ev->wall_time > 1.5e9); /* seconds since 1970: written now */
        ev->wall_time = 0;
        size_t n = qt_tb__event__get_packed_size(ev);
        uint8_t *buf = malloc(n);
        qt_tb__event__pack(ev, buf);
        assert_int_equal(n, want_len[i]);
        assert_memory_equal(buf, want[i], n);
        free(buf);
        qt_tb__event__free_unpacked(ev, NULL);
        free(p[i]);
    }
    /* torchtitan's file naming, which TensorBoard globs for. */
    assert_non_null(strstr(path, "/tb/run/events.out.tfevents."));
    free(path);
    free(sub);
    fs_remove_tree(dir, &err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_frame),
        cmocka_unit_test(test_event_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
