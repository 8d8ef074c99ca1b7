/* libFuzzer target: arbitrary bytes as a model.safetensors.index.json beside two small shards
 * (a.safetensors holds "x" and "y", b.safetensors holds "z"). Opening must fail with a
 * sentence or give a set in which every weight_map name is found. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "io/safetensors.h"

static char dir[64], index_path[96];

static void write_shard(const char *name, const char *const *tensors, int n) {
    static const float data[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    StWriter w;
    st_writer_init(&w);
    for (int i = 0; i < n; i++)
        st_writer_add(&w, tensors[i], DT_F32, 1, shape, data);
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    Err err;
    if (st_write_finish(&w, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    st_writer_free(&w);
}

static void cleanup(void) {
    Err err;
    fs_remove_tree(dir, &err);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/fuzz_st_index_%d", (int)getpid());
    Err err;
    if (fs_mkdirs(dir, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    static const char *const a[] = {"x", "y"}, *const b[] = {"z"};
    write_shard("a.safetensors", a, 2);
    write_shard("b.safetensors", b, 1);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    FILE *f = fopen(index_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    StSet s;
    Err err;
    if (st_set_open(&s, index_path, &err) == 0) {
        json_t *root =
            json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
        const char *name;
        json_t *v;
        if (!root) abort();
        json_object_foreach(json_object_get(root, "weight_map"), name, v) {
            if (!st_set_find(&s, name)) abort();
        }
        json_decref(root);
        st_set_close(&s);
    } else if (!strstr(err.msg, "model.safetensors.index.json") && !strstr(err.msg, dir)) {
        abort(); /* the sentence names neither the index nor a shard */
    }
    return 0;
}
