/* Arena: one block sized before the first step; tensors are carved from it and never freed
 * one by one. A "counting" arena (arena_init_counting) records sizes without memory, so the
 * same layout code runs twice: once to size, once to place. The block lives on a device
 * (core/device.h), which host-side readers read through (device_host_view). */
#ifndef QT_ARENA_H
#define QT_ARENA_H

#include <stddef.h>

#include "core/device.h"
#include "core/err.h"

typedef struct Arena {
    char *base;      /* NULL while counting */
    size_t capacity; /* bytes available (0 while counting) */
    size_t used;     /* bytes handed out, alignment included */
    const char *name;
    const Device *device; /* where base lives (NULL while counting) */
} Arena;

void arena_init_counting(Arena *a, const char *name);
/* Allocates `bytes` zeroed bytes on the CPU, page aligned, with every page already mapped
 * (touched on all OpenMP threads: core/device.c). */
int arena_init(Arena *a, const char *name, size_t bytes, Err *err);
/* The same on device d. */
int arena_init_on(Arena *a, const Device *d, const char *name, size_t bytes, Err *err);
/* 64-byte aligned block of n bytes; NULL while counting. Exceeding capacity is a
 * programming error (the sizing pass disagreed with the placing pass) and aborts. */
void *arena_alloc(Arena *a, size_t bytes);
float *arena_floats(Arena *a, size_t n);
void arena_reset(Arena *a);
void arena_free(Arena *a);

/* Address space a process needs beyond its arenas: OpenMP's thread stacks, malloc's per-thread
 * arenas (up to 128 MiB reserved while one is made), oneDNN's kernels and buffers: eval of a
 * 25M-parameter model aborted inside oneDNN with 128 MiB free and ran with ~140 MiB. */
#define ARENA_HEADROOM_BYTES ((size_t)192 << 20)
/* After a model's arenas exist: -1 with a sentence naming what was allocated (what) when less
 * than ARENA_HEADROOM_BYTES of address space is left under an address-space limit (ulimit -v):
 * oneDNN allocates inside its own threads and aborts, rather than returning an error, when it
 * cannot. Free of cost without a limit. */
int arena_check_headroom(const char *what, Err *err);

#endif
