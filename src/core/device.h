/* The device a block of memory lives on, as the rest of the program sees it: how to allocate
 * and free there and how host-side code (checkpoint, export, metrics, clipping) reads it.
 * Arenas carry one (core/arena.h), op implementations name one (ops/op.h, OpHeader.device) and
 * the kernel registry picks implementations by it (kernels/registry.h). The CPU is the only
 * device of this build; a backend adds its own `const Device` in its own files
 * (docs/architecture.md, "The device seam"). */
#ifndef QT_DEVICE_H
#define QT_DEVICE_H

#include <stddef.h>

typedef struct Device {
    const char *name; /* "cpu": the name OpHeader.device and training.device use */
    /* bytes zeroed, 64-byte aligned; NULL when the device is out of memory */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p, size_t bytes); /* bytes as given to alloc */
    /* Copies bytes between host memory and this device's memory. */
    void (*to_host)(void *dst_host, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *src_host, size_t bytes);
    int host_visible; /* 1: its memory is host memory, readable in place (the CPU) */
} Device;

extern const Device device_cpu;

/* The device named name among those linked into this build, or NULL. */
const Device *device_find(const char *name);

/* The one copy-out path: bytes at src (memory of device d) readable on the host. On a
 * host-visible device (the CPU) that is src itself, no copy; otherwise the bytes are copied
 * into staging (bytes long, host memory) and staging is returned. */
const void *device_host_view(const Device *d, void *staging, const void *src, size_t bytes);

#endif
