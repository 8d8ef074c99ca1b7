/* The job config of a checkpoint, key by key, and the keys a resume changed
 * (train/ckpt_config.h). */
#include "train/ckpt_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

json_t *ckpt_config_keys(const JobConfig *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    config_dump(cfg, f);
    fclose(f);
    json_t *keys = json_object();
    char section[64] = "", name[192];
    int overrides = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *eq = strstr(line, " = ");
        if (strcmp(line, "[[override]]") == 0) {
            snprintf(section, sizeof section, "override[%d]", ++overrides);
        } else if (line[0] == '[') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
        } else if (line[0] != '#' && eq) {
            snprintf(name, sizeof name, "%s.%.*s", section, (int)(eq - line), line);
            json_object_set_new(keys, name, json_string(eq + 3));
        }
    }
    free(text);
    return keys;
}

/* Keys that say how to resume or where the files are, not what the run computes. */
static int steers_resume(const char *key) {
    static const char *const KEYS[] = {"checkpoint.load_step", "checkpoint.exclude_from_loading",
                                       "job.dump_folder", "checkpoint.folder"};
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (strcmp(key, KEYS[i]) == 0) return 1;
    return 0;
}

static void add_change(FILE *f, int *n, const char *key, const json_t *was, const json_t *is) {
    const char *a = json_string_value(was), *b = json_string_value(is);
    if (a && b && strcmp(a, b) == 0) return;
    fprintf(f, "%s%s = %s (now %s)", (*n)++ ? ", " : "", key, a ? a : "(not set)",
            b ? b : "(not set)");
}

char *ckpt_config_changes(json_t *saved, json_t *now, int mesh) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    int n = 0;
    const char *key;
    json_t *v;
    /* Every key of now in its order (the dump's: section by section), then those only saved. */
    json_object_foreach(now, key, v) {
        int is_mesh = strncmp(key, "parallelism.", 12) == 0;
        if (is_mesh == mesh && !steers_resume(key))
            add_change(f, &n, key, json_object_get(saved, key), v);
    }
    json_object_foreach(saved, key, v) {
        int is_mesh = strncmp(key, "parallelism.", 12) == 0;
        if (is_mesh == mesh && !steers_resume(key) && !json_object_get(now, key))
            add_change(f, &n, key, v, NULL);
    }
    fclose(f);
    if (n > 0) return text;
    free(text);
    return NULL;
}
