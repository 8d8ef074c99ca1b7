/* Arena allocator: bump pointer over one aligned block. */
#include "core/arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ARENA_ALIGN 64

void arena_init_counting(Arena *a, const char *name) {
    memset(a, 0, sizeof *a);
    a->name = name;
}

int arena_init(Arena *a, const char *name, size_t bytes, Err *err) {
    memset(a, 0, sizeof *a);
    a->name = name;
    size_t cap = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (cap == 0) cap = ARENA_ALIGN;
    /* Anonymous pages arrive zeroed, so the block is never cleared again; touching one byte
     * of each page on every OpenMP thread makes the kernel fault them in and clear them in
     * parallel, before the first step (a single-threaded memset of a 0.6B model's arenas was
     * a third of its start-up). No MADV_HUGEPAGE: on a machine short of free memory the
     * kernel compacts memory for huge pages inside those faults, which made start-up slower
     * (bench/README.md, Start-up). */
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return err_set(err, "cannot allocate %.3f GiB for the %s arena", cap / 1073741824.0, name);
    a->base = p;
    a->capacity = cap;
    long page = sysconf(_SC_PAGESIZE);
    long npages = (long)((cap + (size_t)page - 1) / (size_t)page);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < npages; i++)
        a->base[(size_t)i * (size_t)page] = 0;
    return 0;
}

void *arena_alloc(Arena *a, size_t bytes) {
    size_t start = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    a->used = start + bytes;
    if (!a->base) return NULL;
    if (a->used > a->capacity) {
        fprintf(stderr, "internal error: arena %s overflow (%zu > %zu bytes)\n", a->name, a->used,
                a->capacity);
        abort();
    }
    return a->base + start;
}

float *arena_floats(Arena *a, size_t n) {
    return arena_alloc(a, n * sizeof(float));
}

void arena_reset(Arena *a) {
    a->used = 0;
}

void arena_free(Arena *a) {
    if (a->base) munmap(a->base, a->capacity);
    memset(a, 0, sizeof *a);
}
