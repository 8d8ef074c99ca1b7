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
    return arena_init_on(a, &device_cpu, name, bytes, err);
}

int arena_init_on(Arena *a, const Device *d, const char *name, size_t bytes, Err *err) {
    memset(a, 0, sizeof *a);
    a->name = name;
    size_t cap = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (cap == 0) cap = ARENA_ALIGN;
    a->base = d->alloc(cap);
    if (!a->base)
        return err_set(err, "cannot allocate %.3f GiB for the %s arena on %s", cap / 1073741824.0,
                       name, d->name);
    a->capacity = cap;
    a->device = d;
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
    if (a->base) a->device->release(a->base, a->capacity);
    memset(a, 0, sizeof *a);
}

int arena_check_headroom(const char *what, Err *err) {
    /* An inaccessible reservation counts against RLIMIT_AS like any mapping, and touches no
     * page. */
    void *p = mmap(NULL, ARENA_HEADROOM_BYTES, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return err_set(err,
                       "%s left less than %zu MiB of address space for threads and oneDNN under "
                       "the address-space limit (ulimit -v); raise the limit",
                       what, ARENA_HEADROOM_BYTES >> 20);
    munmap(p, ARENA_HEADROOM_BYTES);
    return 0;
}
