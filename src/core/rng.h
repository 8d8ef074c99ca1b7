/* Deterministic random numbers. A stream (xoshiro256**) whose whole state is four integers, so
 * a checkpoint can store it and a resumed run continues the same stream; and a counter-based
 * generator for filling parameters, whose every value is a function of (seed, stream, index)
 * alone, so a fill splits over threads and gives the same bits for any thread count. */
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

/* Output `counter` of a SplitMix64 generator seeded by a hash of (seed, stream). */
uint64_t rng_counter_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Fills x[0..n) with normal(0, std) on every OpenMP thread. x[2k] and x[2k+1] are the
 * Box-Muller pair of h = rng_counter_u64(seed, stream, k): radius sqrt(-2 ln u), u =
 * ((h >> 40) + 1) / 2^24 in (0, 1], angle 2 pi (h mod 2^24) / 2^24 (x[2k] the cosine). */
void rng_fill_normal_counter(uint64_t seed, uint64_t stream, float *x, long n, float std);
/* x[0..n) = elements [lo, lo + n) of what rng_fill_normal_counter writes (lo even): a large
 * tensor drawn a piece at a time. */
void rng_fill_normal_counter_at(uint64_t seed, uint64_t stream, float *x, long lo, long n,
                                float std);

#endif
