/* xoshiro256** seeded through splitmix64, and SplitMix64 in counter mode. */
#include "core/rng.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float rng_uniform(Rng *r) {
    return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

uint64_t rng_below(Rng *r, uint64_t n) {
    /* Rejection keeps the result unbiased for any n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = rng_u64(r);
    while (x >= limit);
    return x % n;
}

float rng_normal(Rng *r) {
    double u1 = ((rng_u64(r) >> 11) + 1) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void rng_fill_normal(Rng *r, float *x, long n, float std) {
    for (long i = 0; i < n; i++)
        x[i] = std * rng_normal(r);
}

/* SplitMix64's output function on its own, for counter mode. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t counter_key(uint64_t seed, uint64_t stream) {
    return mix64(seed ^ mix64(stream * 0xd1342543de82ef95ull + 0x9e3779b97f4a7c15ull));
}

static inline uint64_t counter_at(uint64_t key, uint64_t counter) {
    return mix64(key + (counter + 1) * 0x9e3779b97f4a7c15ull);
}

uint64_t rng_counter_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return counter_at(counter_key(seed, stream), counter);
}

/* The pair from one 64-bit value, in float arithmetic of our own instead of libm's log and
 * cos: the loop vectorises, and its vector body and scalar remainder compute each element by
 * the same IEEE operations, so the bits do not depend on where a thread's share starts.
 * Both approximations are within 2e-7 of the exact function (test_core checks the pair). */
__attribute__((always_inline)) static inline void normal_pair(uint64_t h, float *z0, float *z1) {
    /* ln u: u = 2^e m with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m-1)/(m+1). */
    float u = (float)((h >> 40) + 1) * (1.0f / 16777216.0f);
    uint32_t bits;
    memcpy(&bits, &u, sizeof bits);
    int e = (int)(bits >> 23) - 127;
    bits = (bits & 0x007fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &bits, sizeof m);
    int big = m > 1.41421356f;
    m = big ? 0.5f * m : m;
    e += big;
    float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    float lnm =
        2.0f * s * (1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9)))));
    float lnu = (float)e * 0.693147182f + lnm;
    float r = sqrtf(-2.0f * lnu);
    /* Angle 2 pi j / 2^24 = q pi/2 + x, q the nearest quadrant, |x| <= pi/4; exact in
     * integers up to the scaling of x. */
    int32_t j = (int32_t)(h & 0xffffff);
    int32_t q = (j + (1 << 21)) >> 22;
    float x = (float)(j - (q << 22)) * (6.28318531f / 16777216.0f), x2 = x * x;
    float sn =
        x *
        (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 * (1.0f / 362880)))));
    float cs =
        1.0f +
        x2 * (-1.0f / 2 +
              x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 + x2 * (-1.0f / 3628800)))));
    int odd = q & 1;
    float c = odd ? sn : cs, sv = odd ? cs : sn;
    /* For q = 1, 2, 3: cos(q pi/2 + x) is -sin x, -cos x, sin x; sin(q pi/2 + x) is cos x,
     * -sin x, -cos x. */
    c = (((q + 1) >> 1) & 1) ? -c : c;
    sv = ((q >> 1) & 1) ? -sv : sv;
    *z0 = r * c;
    *z1 = r * sv;
}

void rng_fill_normal_counter(uint64_t seed, uint64_t stream, float *x, long n, float std) {
    rng_fill_normal_counter_at(seed, stream, x, 0, n, std);
}

void rng_fill_normal_counter_at(uint64_t seed, uint64_t stream, float *x, long lo, long n,
                                float std) {
    uint64_t key = counter_key(seed, stream), k0 = (uint64_t)lo / 2;
    long pairs = n / 2;
#pragma omp parallel for simd schedule(simd : static)
    for (long k = 0; k < pairs; k++) {
        float z0, z1;
        normal_pair(counter_at(key, k0 + (uint64_t)k), &z0, &z1);
        x[2 * k] = std * z0;
        x[2 * k + 1] = std * z1;
    }
    if (n % 2) {
        float z0, z1;
        normal_pair(counter_at(key, k0 + (uint64_t)pairs), &z0, &z1);
        x[n - 1] = std * z0;
    }
}
