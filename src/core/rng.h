/* Deterministic random numbers (xoshiro256**) whose whole state is four integers, so a
 * checkpoint can store it and a resumed run continues the same stream. */
#ifndef QT_RNG_H
#define QT_RNG_H

#include <stdint.h>

typedef struct Rng {
    uint64_t s[4];
} Rng;

/* Seeds from (seed, stream): different streams of one seed are independent sequences. */
void rng_seed(Rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_u64(Rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float rng_uniform(Rng *r);
/* Uniform integer in [0, n). */
uint64_t rng_below(Rng *r, uint64_t n);
/* Standard normal (Box-Muller, one value per call). */
float rng_normal(Rng *r);
/* Fills x[0..n) with normal(0, std). */
void rng_fill_normal(Rng *r, float *x, long n, float std);

#endif
