/* Reduction kernels.  One small loop per (dtype, op), stamped out by a
 * macro and picked from a table once per call, so nothing in a loop body
 * branches on the type or the operation. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "coll/reduce.h"

/* ------------------------------------------------------------------------
 * Names and sizes
 * ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtypes[MW_DTYPE_COUNT] = {
    [MW_INT8] = {"int8", 1},     [MW_INT16] = {"int16", 2},
    [MW_INT32] = {"int32", 4},   [MW_INT64] = {"int64", 8},
    [MW_UINT8] = {"uint8", 1},   [MW_UINT16] = {"uint16", 2},
    [MW_UINT32] = {"uint32", 4}, [MW_UINT64] = {"uint64", 8},
    [MW_F16] = {"f16", 2},       [MW_BF16] = {"bf16", 2},
    [MW_F32] = {"f32", 4},       [MW_F64] = {"f64", 8},
};

static const char *const op_names[MW_OP_COUNT] = {
    [MW_SUM] = "sum", [MW_PROD] = "prod", [MW_MIN] = "min", [MW_MAX] = "max",
};

/* Callers may pass any integer cast to the enum; going through size_t makes
 * a negative one huge instead of relying on the enum's signedness. */
static int dtype_ok(mw_dtype_t dt)
{
    return (size_t)dt < MW_DTYPE_COUNT;
}

static int op_ok(mw_op_t op)
{
    return (size_t)op < MW_OP_COUNT;
}

size_t mw_dtype_size(mw_dtype_t dt)
{
    return dtype_ok(dt) ? dtypes[dt].size : 0;
}

const char *mw_dtype_name(mw_dtype_t dt)
{
    return dtype_ok(dt) ? dtypes[dt].name : "?";
}

const char *mw_op_name(mw_op_t op)
{
    return op_ok(op) ? op_names[op] : "?";
}

/* ------------------------------------------------------------------------
 * Bit access.  memcpy is the defined way to reinterpret; gcc turns each one
 * into a register move (or nothing inside a vector loop).
 * ------------------------------------------------------------------------ */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint64_t f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline double f64_from(uint64_t u)
{
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------
 * binary16 and bfloat16.  Integer code (the one float multiply is exact
 * and stays in the normal range), so the result does not depend on the
 * caller's rounding mode or FTZ/DAZ flags.
 *
 * The f16 conversions compute every case and pick one with masks rather
 * than branching: gcc will not if-convert a branch holding a float
 * operation (it "could trap"), and a branch keeps the loop scalar.  With
 * masks the f16 loops vectorise wherever the ISA has per-lane variable
 * shifts (AVX2); bf16 needs none and vectorises everywhere.
 * ------------------------------------------------------------------------ */

#define F32_QUIET 0x00400000u   /* top significand bit: quiet NaN */

/* c ? x : y, branch-free. */
static inline uint32_t pick(int c, uint32_t x, uint32_t y)
{
    uint32_t m = 0u - (uint32_t)c;

    return (x & m) | (y & ~m);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7fffu;
    /* inf or NaN: widen the payload, quieten a NaN */
    uint32_t special = 0x7f800000u | (a << 13) | pick(a > 0x7c00u, F32_QUIET, 0);
    /* normal: rebias the exponent 15 -> 127 */
    uint32_t normal = (a << 13) + ((127u - 15u) << 23);
    /* subnormal or zero: a * 2^-24, exact in f32 (signed int -> float is
     * the conversion SSE has in vector form) */
    uint32_t small = f32_bits((float)(int32_t)a * 0x1p-24f);

    return f32_from(sign | pick(a >= 0x7c00u, special, pick(a >= 0x0400u, normal, small)));
}

/* Round @v's bits below @shift (1..31) to nearest, ties to even: adding
 * half-minus-one plus the kept part's low bit carries exactly when the rest
 * is above half, or is half and the kept part is odd. */
static inline uint32_t round_shift(uint32_t v, uint32_t shift)
{
    return (v + ((1u << (shift - 1)) - 1u) + ((v >> shift) & 1u)) >> shift;
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t e = a >> 23;
    /* NaN: keep the top payload bits, quiet */
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* [2^-14, 65520): normal; a carry out of the significand bumps the
     * exponent, which is the right answer */
    uint32_t normal = round_shift(a - ((127u - 15u) << 23), 13);
    /* below 2^-14: a subnormal count of 2^-24, from the significand with its
     * implicit bit.  The shift is clamped so that the lanes which discard
     * this value stay defined; 25 turns everything below 2^-25 into 0, and
     * 2^-25 itself ties to the even 0. */
    uint32_t shift = pick(e > 112, 14, pick(e < 101, 25, 126 - e));
    uint32_t sub = round_shift((a & 0x7fffffu) | 0x800000u, shift);
    /* 65520 is halfway between 65504 (odd significand) and 65536: inf */
    uint32_t h = pick(a > 0x7f800000u, nan,
                      pick(a >= 0x477ff000u, 0x7c00u,
                           pick(a >= 0x38800000u, normal, sub)));

    return (uint16_t)(sign | h);
}

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;

    if ((h & 0x7fffu) > 0x7f80u)
        x |= F32_QUIET;
    return f32_from(x);
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Same exponent range as f32: only the significand is rounded, and a
     * carry out of the largest finite value lands exactly on inf. */
    return (uint16_t)round_shift(x, 16);
}

float mw__f16_to_f32(uint16_t h)
{
    return f16_to_f32(h);
}

uint16_t mw__f32_to_f16(float f)
{
    return f32_to_f16(f);
}

float mw__bf16_to_f32(uint16_t h)
{
    return bf16_to_f32(h);
}

uint16_t mw__f32_to_bf16(float f)
{
    return f32_to_bf16(f);
}

/* ------------------------------------------------------------------------
 * Floating min/max, as IEEE 754-2019 minimum/maximum (C23 fminimum): a NaN
 * operand wins (dst's first) and comes back quiet, as arithmetic would
 * return it; and -0 < +0, so the result does not depend on operand order.
 * When a == b the two differ at most in the sign of a zero, so OR-ing in
 * a's bits gives -0 for min and AND-ing gives +0 for max.  Selects and bit
 * operations only, so the loops still vectorise.
 * ------------------------------------------------------------------------ */

#define F64_QUIET 0x0008000000000000u

static inline float minimum_f32(float a, float b)
{
    float r = (a < b || a != a) ? a : b;
    uint32_t u = f32_bits(r) | (a == b ? f32_bits(a) : 0);

    return f32_from(u | (r != r ? F32_QUIET : 0));
}

static inline float maximum_f32(float a, float b)
{
    float r = (a > b || a != a) ? a : b;
    uint32_t u = f32_bits(r) & (a == b ? f32_bits(a) : ~0u);

    return f32_from(u | (r != r ? F32_QUIET : 0));
}

static inline double minimum_f64(double a, double b)
{
    double r = (a < b || a != a) ? a : b;
    uint64_t u = f64_bits(r) | (a == b ? f64_bits(a) : 0);

    return f64_from(u | (r != r ? F64_QUIET : 0));
}

static inline double maximum_f64(double a, double b)
{
    double r = (a > b || a != a) ? a : b;
    uint64_t u = f64_bits(r) & (a == b ? f64_bits(a) : ~(uint64_t)0);

    return f64_from(u | (r != r ? F64_QUIET : 0));
}

/* ------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------ */

/* gcc -O2 (its "very cheap" vector cost model) vectorises only loops whose
 * trip count is a known multiple of the vector width: it adds neither a
 * scalar epilogue nor a run-time alias check.  So each kernel runs
 * fixed-length blocks on restrict pointers, then a scalar tail.  64
 * elements is a multiple of every lane count up to 64 x int8 (AVX-512). */
#define BLOCK 64

typedef void (*kernel_fn)(void *restrict dst, const void *restrict src, size_t n);

#define KERNEL(name, T, EXPR)                                                   \
    static inline T name##_op(T a, T b)                                         \
    {                                                                           \
        return (T)(EXPR);                                                       \
    }                                                                           \
    static inline void name##_block(T *restrict d, const T *restrict s)         \
    {                                                                           \
        for (size_t j = 0; j < BLOCK; j++)                                      \
            d[j] = name##_op(d[j], s[j]);                                       \
    }                                                                           \
    static void name(void *restrict dst, const void *restrict src, size_t n)    \
    {                                                                           \
        T *restrict d = dst;                                                    \
        const T *restrict s = src;                                              \
        size_t i = 0;                                                           \
        for (; n - i >= BLOCK; i += BLOCK)                                      \
            name##_block(d + i, s + i);                                         \
        for (; i < n; i++)                                                      \
            d[i] = name##_op(d[i], s[i]);                                       \
    }

/* Wrapping sum/prod in unsigned arithmetic: signed overflow would be UB.
 * The 1u * promotes uint8_t/uint16_t to unsigned int rather than int, where
 * 65535 * 65535 would overflow.  Signed types reuse these kernels: two's
 * complement wrap-around is the same bit pattern, and C11 6.5p7 allows
 * accessing an intN_t through its uintN_t. */
#define WRAP_KERNELS(sfx, T)                                                    \
    KERNEL(sum_##sfx, T, 1u * a + b)                                            \
    KERNEL(prod_##sfx, T, 1u * a * b)

#define ORDER_KERNELS(sfx, T)                                                   \
    KERNEL(min_##sfx, T, b < a ? b : a)                                         \
    KERNEL(max_##sfx, T, b > a ? b : a)

/* @F is the type the arithmetic runs in (f32 or f64); TO/FROM convert the
 * stored type @T to and from it. */
#define FLOAT_KERNELS(sfx, T, F, TO, FROM)                                      \
    KERNEL(sum_##sfx, T, FROM(TO(a) + TO(b)))                                   \
    KERNEL(prod_##sfx, T, FROM(TO(a) * TO(b)))                                  \
    KERNEL(min_##sfx, T, FROM(minimum_##F(TO(a), TO(b))))                       \
    KERNEL(max_##sfx, T, FROM(maximum_##F(TO(a), TO(b))))

#define SAME(x) (x)

WRAP_KERNELS(u8, uint8_t)
WRAP_KERNELS(u16, uint16_t)
WRAP_KERNELS(u32, uint32_t)
WRAP_KERNELS(u64, uint64_t)
ORDER_KERNELS(i8, int8_t)
ORDER_KERNELS(i16, int16_t)
ORDER_KERNELS(i32, int32_t)
ORDER_KERNELS(i64, int64_t)
ORDER_KERNELS(u8, uint8_t)
ORDER_KERNELS(u16, uint16_t)
ORDER_KERNELS(u32, uint32_t)
ORDER_KERNELS(u64, uint64_t)
FLOAT_KERNELS(f16, uint16_t, f32, f16_to_f32, f32_to_f16)
FLOAT_KERNELS(bf16, uint16_t, f32, bf16_to_f32, f32_to_bf16)
FLOAT_KERNELS(f32, float, f32, SAME, SAME)
FLOAT_KERNELS(f64, double, f64, SAME, SAME)

#define ROW(sfx_sum, sfx_ord)                                                   \
    {                                                                           \
        [MW_SUM] = sum_##sfx_sum, [MW_PROD] = prod_##sfx_sum,                   \
        [MW_MIN] = min_##sfx_ord, [MW_MAX] = max_##sfx_ord,                     \
    }

/* The (dtype, op) switch, as a table: looked up once per call. */
static const kernel_fn kernels[MW_DTYPE_COUNT][MW_OP_COUNT] = {
    [MW_INT8] = ROW(u8, i8),     [MW_INT16] = ROW(u16, i16),
    [MW_INT32] = ROW(u32, i32),  [MW_INT64] = ROW(u64, i64),
    [MW_UINT8] = ROW(u8, u8),    [MW_UINT16] = ROW(u16, u16),
    [MW_UINT32] = ROW(u32, u32), [MW_UINT64] = ROW(u64, u64),
    [MW_F16] = ROW(f16, f16),    [MW_BF16] = ROW(bf16, bf16),
    [MW_F32] = ROW(f32, f32),    [MW_F64] = ROW(f64, f64),
};

int mw__reduce(void *dst, const void *src, size_t count, mw_dtype_t dt, mw_op_t op)
{
    if (!dtype_ok(dt) || !op_ok(op))
        return -EINVAL;
    if (count == 0)
        return 0;
    if (!dst || !src)
        return -EINVAL;
    kernels[dt][op](dst, src, count);
    return 0;
}
