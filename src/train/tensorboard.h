/* TensorBoard event files: records of (length, masked CRC-32C of the length, a protobuf Event,
 * masked CRC-32C of the Event), the Events encoded with protobuf-c from tb_event.proto. The
 * first event names the file version; each later one holds the scalars of one step. */
#ifndef QT_TENSORBOARD_H
#define QT_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct TbWriter TbWriter;

/* Creates dir (and its parents) and dir/events.out.tfevents.<unix seconds>.<host>, and writes
 * the file-version event. */
int tb_open(TbWriter **out, const char *dir, Err *err);
/* One event at step with n scalars tags[i] = values[i] (stored as float, as TensorBoard's
 * simple_value is); flushed, so a crash loses at most this event. */
int tb_write_scalars(TbWriter *w, int64_t step, const char *const *tags, const double *values,
                     int n, Err *err);
void tb_close(TbWriter *w);
/* The file written, for messages and tests. */
const char *tb_path(const TbWriter *w);

/* CRC-32C (Castagnoli) of data, and the masked form the record format stores:
 * ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_masked_crc32c(const void *data, size_t n);
/* Frames n bytes of payload as one record into out (n + 16 bytes): u64 length, u32 masked CRC of
 * those 8 bytes, the payload, u32 masked CRC of the payload, all little-endian. */
void tb_frame(uint8_t *out, const void *payload, size_t n);

#endif
