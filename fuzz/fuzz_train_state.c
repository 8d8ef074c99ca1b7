/* Fuzzes the checkpoint's train_state.json reader and verifier: any bytes in that file must
 * give a clean error (or success), never a crash. The tensor files are fixed small files. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "train/checkpoint.h"

static char dir[64];

static void setup(void) {
    Err err;
    strcpy(dir, "/tmp/qt_fuzz_state_XXXXXX");
    if (!mkdtemp(dir)) abort();
    char *p = fs_join(dir, "model.safetensors");
    fs_write_atomic(p, "0123456789", 10, &err);
    free(p);
    p = fs_join(dir, "optim.safetensors");
    fs_write_atomic(p, "", 0, &err);
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) setup();
    char *path = fs_join(dir, "train_state.json");
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, size, f);
        fclose(f);
    }
    free(path);
    Err err;
    ckpt_verify(dir, 1, &err);
    CkptState st;
    if (ckpt_read_state(dir, &st, &err) == 0) ckpt_state_release(&st);
    return 0;
}
