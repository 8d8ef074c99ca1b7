/* The CPU device and the list of devices linked into the build. */
#include "core/device.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes) {
    size_t cap = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, cap ? cap : 64);
    if (p) memset(p, 0, cap ? cap : 64);
    return p;
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

const Device device_cpu = {"cpu", cpu_alloc, free, cpu_copy, cpu_copy, 1};

/* A backend's device, defined in that backend's own files when they are built (e.g.
 * src/cuda/device_cuda.c); weak, so a build without them links and the pointer is NULL. */
extern const Device device_cuda __attribute__((weak));

const Device *device_find(const char *name) {
    const Device *all[] = {&device_cpu, &device_cuda};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] && strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

const void *device_host_view(const Device *d, void *staging, const void *src, size_t bytes) {
    if (d->host_visible) return src;
    d->to_host(staging, src, bytes);
    return staging;
}
