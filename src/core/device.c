/* The CPU device and the list of devices linked into the build. */
#include "core/device.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Anonymous pages arrive zeroed, so the block is never cleared again; touching one byte of
 * each page on every OpenMP thread makes the kernel fault them in and clear them in parallel,
 * before the first step (a single-threaded memset of a 0.6B model's arenas was a third of its
 * start-up). No MADV_HUGEPAGE: on a machine short of free memory the kernel compacts memory
 * for huge pages inside those faults, which made start-up slower (bench/README.md, Start-up). */
static void *cpu_alloc(size_t bytes) {
    size_t cap = bytes ? bytes : 1;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    long npages = (long)((cap + (size_t)page - 1) / (size_t)page);
    char *base = p;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < npages; i++)
        base[(size_t)i * (size_t)page] = 0;
    return p;
}

static void cpu_release(void *p, size_t bytes) {
    munmap(p, bytes ? bytes : 1);
}

static void cpu_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

const Device device_cpu = {"cpu", cpu_alloc, cpu_release, cpu_copy, cpu_copy, 1};

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
