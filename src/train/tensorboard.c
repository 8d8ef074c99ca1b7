/* TensorBoard event-file writer (tensorboard.h). CRC-32C is computed here: Debian packages no
 * C library for it (zlib has only CRC-32), and it is a 256-entry table. */
#include "train/tensorboard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "tb_event.pb-c.h"

struct TbWriter {
    FILE *f;
    char *path;
};

static uint32_t crc_table[256];

static void crc_init(void) {
    /* Castagnoli polynomial, reflected. */
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(const void *data, size_t n) {
    if (!crc_table[1]) crc_init();
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tb_masked_crc32c(const void *data, size_t n) {
    uint32_t c = tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

void tb_frame(uint8_t *out, const void *payload, size_t n) {
    put_le(out, n, 8);
    put_le(out + 8, tb_masked_crc32c(out, 8), 4);
    memcpy(out + 12, payload, n);
    put_le(out + 12 + n, tb_masked_crc32c(payload, n), 4);
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int write_event(TbWriter *w, const QtTb__Event *ev, Err *err) {
    size_t n = qt_tb__event__get_packed_size(ev);
    uint8_t *buf = xmalloc(n ? n : 1), *rec = xmalloc(n + 16);
    qt_tb__event__pack(ev, buf);
    tb_frame(rec, buf, n);
    int ok = fwrite(rec, 1, n + 16, w->f) == n + 16 && fflush(w->f) == 0;
    free(rec);
    free(buf);
    if (!ok) return err_sys(err, "cannot write TensorBoard events to %s", w->path);
    return 0;
}

int tb_open(TbWriter **out, const char *dir, Err *err) {
    *out = NULL;
    TRY(fs_mkdirs(dir, err));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    char name[400];
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s", (long long)time(NULL), host);
    TbWriter *w = xcalloc(1, sizeof *w);
    w->path = fs_join(dir, name);
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        err_sys(err, "cannot create TensorBoard event file %s", w->path);
        tb_close(w);
        return -1;
    }
    QtTb__Event ev = QT_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = QT_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if (write_event(w, &ev, err) != 0) {
        tb_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

int tb_write_scalars(TbWriter *w, int64_t step, const char *const *tags, const double *values,
                     int n, Err *err) {
    QtTb__Summary__Value *vals = xcalloc((size_t)(n ? n : 1), sizeof *vals);
    QtTb__Summary__Value **ptrs = xcalloc((size_t)(n ? n : 1), sizeof *ptrs);
    for (int i = 0; i < n; i++) {
        qt_tb__summary__value__init(&vals[i]);
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = QT_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = (float)values[i];
        ptrs[i] = &vals[i];
    }
    QtTb__Summary sum = QT_TB__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = ptrs;
    QtTb__Event ev = QT_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = QT_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = write_event(w, &ev, err);
    free(ptrs);
    free(vals);
    return rc;
}

const char *tb_path(const TbWriter *w) {
    return w->path;
}

void tb_close(TbWriter *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w->path);
    free(w);
}
