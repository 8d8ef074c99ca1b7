/* Element types of stored tensors and conversions between them. Compute is fp32 (and bf16 in
 * GEMMs); files may hold F32, BF16 or F16, and F8_E4M3 for block-quantized weights (read with
 * their scales, io/safetensors' st_set_pair_fp8). */
#ifndef QT_DTYPE_H
#define QT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum DType {
    DT_F32 = 0,
    DT_BF16,
    DT_F16,
    DT_I32,
    DT_I64,
    DT_U8,
    DT_F8_E4M3,
    DT_COUNT
} DType;

/* "F32", "BF16", ... as written in safetensors headers. */
const char *dtype_name(DType t);
/* Parses a safetensors dtype name; returns -1 when unknown. */
int dtype_parse(const char *s, DType *out);
size_t dtype_size(DType t);

/* bf16 from fp32 with round-to-nearest-even (NaN stays NaN), as torch does. */
static inline uint16_t f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
static inline float bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
/* fp8 E4M3 as OCP's "E4M3FN" and torch.float8_e4m3fn define it: bias 7, subnormals, no
 * infinities, 0x7f and 0xff NaN, largest finite 448. */
static inline float f8e4m3_to_f32(uint8_t b) {
    union {
        uint32_t u;
        float f;
    } v;
    uint32_t sign = (uint32_t)(b >> 7) << 31, exp = (b >> 3) & 0xfu, man = b & 7u;
    if ((b & 0x7fu) == 0x7fu) {
        v.u = sign | 0x7fc00000u;
    } else if (exp == 0) {
        v.f = (float)man * 0x1p-9f; /* subnormal: man / 8 * 2^-6 */
        v.u |= sign;
    } else {
        v.u = sign | ((exp + 120u) << 23) | (man << 20);
    }
    return v.f;
}

/* f8e4m3_to_f32 of every code, a table built once (thread-safe): what the converters read. */
const float *f8e4m3_table(void);

/* Converts n elements of type from (F32, BF16, F16 or F8_E4M3, unscaled) at src into type to (F32,
 * or BF16 rounded as f32_to_bf16 rounds, a BF16 source copied as it is) at dst, on all threads for
 * large n. Returns the index of the first NaN or infinity in src, or -1 when all n values are
 * finite: the test reads the source's exponent bits in the same pass, so a loader's check costs
 * no second pass. Other source types give zeros (and -1). */
int64_t dtype_convert(void *dst, DType to, const void *src, DType from, size_t n);
/* dtype_convert into fp32. */
int64_t dtype_to_f32(float *dst, const void *src, DType from, size_t n);
/* Converts n fp32 elements into type `to` (F32/BF16/F16). */
void dtype_from_f32(void *dst, const float *src, DType to, size_t n);

#endif
