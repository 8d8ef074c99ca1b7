/* Fuzzes the machine's peak record parser (core/peak_record.h): arbitrary bytes must parse
 * into a record that formats back to text parsing to the same record, or fail with a sentence
 * naming the file. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/peak_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PeakRecord r, back;
    Err err;
    err.msg[0] = 0;
    if (peak_record_parse((const char *)data, size, "fuzz.txt", &r, &err) != 0) {
        if (strncmp(err.msg, "fuzz.txt: line ", 15) != 0) abort();
        return 0;
    }
    if (!(r.tflops > 0) || r.runs < 1 || r.threads < 1 || r.processors < 1 || !r.cpu[0] ||
        !r.unit[0])
        abort();
    char buf[4 * PEAK_RECORD_TEXT];
    int n = peak_record_format(buf, sizeof buf, &r);
    if (n <= 0 || (size_t)n >= sizeof buf) abort();
    if (peak_record_parse(buf, (size_t)n, "fuzz.txt", &back, &err) != 0) abort();
    if (strcmp(back.cpu, r.cpu) || strcmp(back.unit, r.unit) || back.threads != r.threads ||
        back.processors != r.processors || back.runs != r.runs)
        abort();
    return 0;
}
