/* libFuzzer target: arbitrary bytes as a peft adapter_config.json. An accepted config gives an
 * r from 1 to INT32_MAX, a finite lora_alpha > 0 and use_rslora 0 or 1, and parsing is
 * deterministic (the same bytes read twice give the same config). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/lora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    LoraPeftConfig a, b;
    Err err;
    if (lora_peft_config_parse((const char *)data, size, "fuzz", &a, &err) != 0) return 0;
    if (a.r < 1 || a.r > INT32_MAX || !(a.alpha > 0) || !isfinite(a.alpha) ||
        (a.rslora != 0 && a.rslora != 1))
        abort();
    if (lora_peft_config_parse((const char *)data, size, "fuzz", &b, &err) != 0 || a.r != b.r ||
        a.alpha != b.alpha || a.rslora != b.rslora)
        abort();
    return 0;
}
