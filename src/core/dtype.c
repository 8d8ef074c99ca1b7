/* dtype names, sizes and fp32 <-> bf16/f16 conversion. */
#include "core/dtype.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static const char *const NAMES[DT_COUNT] = {"F32", "BF16", "F16", "I32", "I64", "U8", "F8_E4M3"};
static const size_t SIZES[DT_COUNT] = {4, 2, 2, 4, 8, 1, 1};

const char *dtype_name(DType t) {
    return (unsigned)t < DT_COUNT ? NAMES[t] : "?";
}

int dtype_parse(const char *s, DType *out) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(s, NAMES[i]) == 0) {
            *out = (DType)i;
            return 0;
        }
    return -1;
}

size_t dtype_size(DType t) {
    return (unsigned)t < DT_COUNT ? SIZES[t] : 0;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0) {
        float mag = ldexpf((float)man, -24);
        return sign ? -mag : mag;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (man << 13);
    else
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t f32_to_f16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    uint32_t sign = (v.u >> 16) & 0x8000u;
    uint32_t absu = v.u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (absu < 0x38800000u) {                                   /* subnormal or zero */
        float a = fabsf(f) * 16777216.0f;                       /* 2^24 */
        uint32_t m = (uint32_t)lrintf(a);
        return (uint16_t)(sign | m);
    }
    uint32_t exp = (absu >> 23) - 112, man = absu & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* Loading a model converts every weight through here, chunk by chunk on all threads. A
 * value is a NaN or an infinity exactly when its exponent bits are all ones, so the loaders'
 * finiteness check is an integer test on the source in the same pass. Returns 1 when one of
 * [lo, hi) is not finite. */
static float f8_table[256];
static pthread_once_t f8_once = PTHREAD_ONCE_INIT;

static void f8_fill(void) {
    for (int b = 0; b < 256; b++)
        f8_table[b] = f8e4m3_to_f32((uint8_t)b);
}

const float *f8e4m3_table(void) {
    pthread_once(&f8_once, f8_fill);
    return f8_table;
}

static int convert_chunk(void *dst, DType to, const void *src, DType from, size_t lo, size_t hi) {
    const uint8_t *s8 = src;
    const uint16_t *s16 = src;
    const uint32_t *s32 = src;
    float *d32 = dst;
    uint16_t *d16 = dst;
    unsigned bad = 0;
    if (from == DT_BF16 && to == DT_F32) {
#pragma omp simd reduction(| : bad)
        for (size_t i = lo; i < hi; i++) {
            d32[i] = bf16_to_f32(s16[i]);
            bad |= (s16[i] & 0x7f80u) == 0x7f80u;
        }
    } else if (from == DT_BF16) {
#pragma omp simd reduction(| : bad)
        for (size_t i = lo; i < hi; i++) {
            d16[i] = s16[i];
            bad |= (s16[i] & 0x7f80u) == 0x7f80u;
        }
    } else if (from == DT_F32) {
#pragma omp simd reduction(| : bad)
        for (size_t i = lo; i < hi; i++) {
            union {
                uint32_t u;
                float f;
            } v = {.u = s32[i]};
            if (to == DT_F32)
                d32[i] = v.f;
            else
                d16[i] = f32_to_bf16(v.f);
            bad |= (v.u & 0x7f800000u) == 0x7f800000u;
        }
    } else if (from == DT_F8_E4M3) {
        const float *tab = f8e4m3_table();
        for (size_t i = lo; i < hi; i++) {
            float f = tab[s8[i]];
            if (to == DT_F32)
                d32[i] = f;
            else
                d16[i] = f32_to_bf16(f);
            bad |= (s8[i] & 0x7fu) == 0x7fu;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            float f = f16_to_f32(s16[i]);
            if (to == DT_F32)
                d32[i] = f;
            else
                d16[i] = f32_to_bf16(f);
            bad |= (s16[i] & 0x7c00u) == 0x7c00u;
        }
    }
    return bad != 0;
}

static int nonfinite_at(const void *src, DType from, size_t i) {
    if (from == DT_F8_E4M3) return (((const uint8_t *)src)[i] & 0x7fu) == 0x7fu;
    if (from == DT_F32) return (((const uint32_t *)src)[i] & 0x7f800000u) == 0x7f800000u;
    uint16_t e = from == DT_BF16 ? 0x7f80u : 0x7c00u;
    return (((const uint16_t *)src)[i] & e) == e;
}

#define CONVERT_CHUNK 65536

int64_t dtype_convert(void *dst, DType to, const void *src, DType from, size_t n) {
    if (from != DT_F32 && from != DT_BF16 && from != DT_F16 && from != DT_F8_E4M3) {
        memset(dst, 0, n * dtype_size(to));
        return -1;
    }
    size_t chunks = (n + CONVERT_CHUNK - 1) / CONVERT_CHUNK;
    int64_t first = INT64_MAX;
    /* Dynamic: on a loaded machine a thread that loses its core leaves its chunks to the
     * others, instead of the others spinning at the barrier until it returns. */
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t lo = c * CONVERT_CHUNK, hi = n - lo < CONVERT_CHUNK ? n : lo + CONVERT_CHUNK;
        if (convert_chunk(dst, to, src, from, lo, hi) && (int64_t)lo < first)
            for (size_t i = lo; i < hi; i++)
                if (nonfinite_at(src, from, i)) {
                    first = (int64_t)i;
                    break;
                }
    }
    return first == INT64_MAX ? -1 : first;
}

int64_t dtype_to_f32(float *dst, const void *src, DType from, size_t n) {
    return dtype_convert(dst, DT_F32, src, from, n);
}

void dtype_from_f32(void *dst, const float *src, DType to, size_t n) {
    uint16_t *d16 = dst;
    switch (to) {
    case DT_F32:
        memcpy(dst, src, n * 4);
        break;
    case DT_BF16:
        for (size_t i = 0; i < n; i++)
            d16[i] = f32_to_bf16(src[i]);
        break;
    case DT_F16:
        for (size_t i = 0; i < n; i++)
            d16[i] = f32_to_f16(src[i]);
        break;
    default:
        break;
    }
}
