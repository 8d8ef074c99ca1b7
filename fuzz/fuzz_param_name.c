/* libFuzzer target: arbitrary bytes as a parameter name read from a file (a checkpoint's
 * tensor names reach param_kind_of_name through export and the sharded reader). A name that
 * matches a row must be exactly the name that row gives its layer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/param_table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char name[PARAM_NAME_MAX + 8];
    if (size >= sizeof name) return 0;
    memcpy(name, data, size);
    name[size] = '\0';
    int layer = -2;
    const ParamKind *k = param_kind_of_name(name, &layer);
    if (!k) return 0;
    char again[PARAM_NAME_MAX];
    snprintf(again, sizeof again, k->name, layer);
    if (strcmp(again, name) != 0 || (layer < 0) != (strncmp(name, "layers.", 7) != 0)) abort();
    (void)tp_split_of(name);
    return 0;
}
