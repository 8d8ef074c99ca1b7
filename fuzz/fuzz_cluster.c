/* libFuzzer target: arbitrary bytes as `qtitan plan --cluster HOSTSxGPUS`. An accepted value
 * must be digits, 'x', digits, whose numbers are the two it gave, each within 1..65536; a
 * refused one must come with a sentence naming --cluster. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/steptime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char text[64];
    if (size >= sizeof text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    int hosts = 0, per_host = 0;
    Err err;
    if (steptime_parse_cluster(text, &hosts, &per_host, &err) != 0) {
        if (strncmp(err.msg, "--cluster ", 10) != 0) abort();
        return 0;
    }
    size_t a = strspn(text, "0123456789");
    if (a == 0 || text[a] != 'x') abort();
    size_t b = strspn(text + a + 1, "0123456789");
    if (b == 0 || text[a + 1 + b] != '\0') abort();
    if (hosts < 1 || hosts > 65536 || per_host < 1 || per_host > 65536 ||
        strtol(text, NULL, 10) != hosts || strtol(text + a + 1, NULL, 10) != per_host)
        abort();
    return 0;
}
