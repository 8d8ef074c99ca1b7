/* Ways of mapping fresh anonymous memory before its first use, timed on all OpenMP threads:
 * one touched byte per page (a fault per page; cpu_alloc's fallback), MAP_POPULATE (the kernel,
 * one thread), and device_cpu.alloc itself (core/device.c: MADV_POPULATE_WRITE on each thread's
 * share). Rounds alternate the ways; prints seconds per GiB of each round.
 * Usage: bench_page_map [GiB (4)] [rounds (3)] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/device.h"

enum { TOUCH, MAP_POP, DEVICE, NWAYS };
static const char *const NAMES[NWAYS] = {"touch one byte a page", "MAP_POPULATE",
                                         "device_cpu.alloc"};

/* Maps bytes by way w; returns the block or NULL. */
static char *map(int w, size_t bytes) {
    if (w == DEVICE) return device_cpu.alloc(bytes);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (w == MAP_POP ? MAP_POPULATE : 0);
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = bytes / page;
    if (w == TOUCH) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < npages; i++)
            p[i * page] = 0;
    }
    return p;
}

int main(int argc, char **argv) {
    double gib = argc > 1 ? atof(argv[1]) : 4;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (!(gib > 0) || rounds < 1) {
        fprintf(stderr, "usage: bench_page_map [GiB > 0] [rounds >= 1]\n");
        return 2;
    }
    size_t bytes = (size_t)(gib * 1073741824.0) / 4096 * 4096;
    printf("%.2f GiB, %d thread(s); seconds per GiB, one column per round\n", gib,
           omp_get_max_threads());
    double t[NWAYS][64];
    if (rounds > 64) rounds = 64;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < NWAYS; k++) {
            int w = r % 2 ? NWAYS - 1 - k : k; /* alternate the order */
            double t0 = omp_get_wtime();
            char *p = map(w, bytes);
            t[w][r] = p ? (omp_get_wtime() - t0) / gib : -1;
            if (p) munmap(p, bytes);
        }
    for (int w = 0; w < NWAYS; w++) {
        printf("%-32s", NAMES[w]);
        for (int r = 0; r < rounds; r++)
            printf(" %6.3f", t[w][r]);
        printf("\n");
    }
    return 0;
}
