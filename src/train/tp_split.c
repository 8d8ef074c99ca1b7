/* The tensor-parallel split of each Qwen3 parameter, by name. */
#include "train/tp_split.h"

#include <string.h>

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

TpSplit tp_split_of(const char *name) {
    static const char *const rows[] = {".wq.weight", ".wk.weight", ".wv.weight", ".w1.weight",
                                       ".w3.weight"};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        if (ends_with(name, rows[k])) return TP_ROWS;
    if (ends_with(name, ".wo.weight") || ends_with(name, ".w2.weight")) return TP_COLS;
    return TP_REPLICATED;
}
