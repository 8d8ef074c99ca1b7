/* Fuzz target for the TOML parser and the job config built on it: any bytes must give either a
 * document or an error sentence, never a crash, leak or hang. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/toml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Err err;
    TomlValue *root = NULL;
    if (toml_parse(&root, (const char *)data, size, "fuzz.toml", &err) == 0) toml_free(root);

    JobConfig cfg;
    config_init(&cfg);
    if (config_apply_toml(&cfg, (const char *)data, size, "fuzz.toml", &err) == 0) {
        char buf[64];
        config_ac_text(config_ac(&cfg), buf, sizeof buf); /* selective_ac_option read as given */
    }
    config_free(&cfg);

    /* The same bytes as one command-line value (up to the first NUL). */
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    TomlValue *v = NULL;
    if (toml_parse_value(&v, text, "fuzz", &err) == 0) toml_free(v);
    config_init(&cfg);
    config_apply_override(&cfg, "model.n_layers", text, "fuzz", &err);
    config_apply_override(&cfg, "training.dataset", text, "fuzz", &err);
    config_apply_override(&cfg, "activation_checkpoint.mode", "selective", "fuzz", &err);
    if (config_apply_override(&cfg, "activation_checkpoint.selective_ac_option", text, "fuzz",
                              &err) == 0) {
        char buf[64], flags[160];
        AcMode m = config_ac(&cfg);
        config_ac_text(m, buf, sizeof buf);
        config_ac_flags(m, flags, sizeof flags);
    }
    config_free(&cfg);
    free(text);
    return 0;
}
