/* libFuzzer target: arbitrary bytes as a safetensors file (through a memfd, so st_open maps
 * it like a real file). Every accepted tensor is read in full, which checks that validated
 * offsets really stay inside the mapping. The file is then opened again as a set, its
 * F8_E4M3 weights are paired with their block scales (block rows and columns from the last
 * byte, which a valid file may carry after its data), and every tensor is read again, the
 * paired weights dequantized: the scales' checked shape must cover every block looked up. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    StFile f;
    Err err;
    if (st_open(&f, path, &err) == 0) {
        for (int i = 0; i < f.n; i++) {
            const StTensor *t = &f.tensors[i];
            if (st_find(&f, t->name) != t) abort();
            /* Bounded by the file size, since every byte belongs to at most one tensor,
             * except zero-byte tensors, which have no elements. */
            float *buf = malloc((size_t)t->numel * sizeof(float) + 1);
            st_to_f32(t, buf);
            free(buf);
        }
        st_close(&f);
        StSet set;
        if (st_set_open(&set, path, &err) == 0) {
            uint8_t last = size ? data[size - 1] : 0;
            int64_t block[2] = {1 + (last & 7), 1 + (last >> 3)};
            if (st_set_pair_fp8(&set, block, &err) >= 0)
                for (int i = 0; i < set.files[0].n; i++) {
                    const StTensor *t = &set.files[0].tensors[i];
                    float *buf = malloc((size_t)t->numel * sizeof(float) + 1);
                    st_to_f32(t, buf);
                    free(buf);
                }
            st_set_close(&set);
        }
    }
    close(fd);
    return 0;
}
