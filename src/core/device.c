/* The CPU device and the list of devices linked into the build. */
#include "core/device.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Anonymous pages arrive zeroed, so the block is never cleared again. Each OpenMP thread has
 * the kernel map and clear its share of the pages (MADV_POPULATE_WRITE: one call, no fault per
 * page; 0.12-0.13 s per GiB against 0.18 for a touch loop on 2 threads, bench_page_map and
 * "Start-up"), or, on a kernel without it, touches one byte of each page; either way before
 * the first step, in parallel (a single-threaded memset of a 0.6B model's arenas was a third
 * of its start-up). No MADV_HUGEPAGE: on a machine short of free memory the kernel compacts
 * memory for huge pages inside those faults, which made start-up slower. */
static void *cpu_alloc(size_t bytes) {
    size_t cap = bytes ? bytes : 1;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = (cap + page - 1) / page;
    char *base = p;
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
        size_t per = (npages + nt - 1) / nt, lo = me * per < npages ? me * per : npages;
        size_t hi = lo + per < npages ? lo + per : npages;
        if (lo < hi && madvise(base + lo * page, (hi - lo) * page, MADV_POPULATE_WRITE) != 0)
            for (size_t i = lo; i < hi; i++)
                base[i * page] = 0;
    }
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
