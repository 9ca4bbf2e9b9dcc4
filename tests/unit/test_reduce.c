/* Reduction kernels and the f16/bf16 conversions, against references
 * written the obvious way: integers in 64-bit arithmetic, formats decoded
 * from their definition, rounding by searching for the nearest value. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "coll/reduce.h"

#define NPATTERNS 65536u

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static uint64_t rng_state;

/* splitmix64: seeded, so a failure reproduces. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t bits64(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double pow2(int e)
{
    double r = 1.0;
    for (; e > 0; e--)
        r *= 2.0;
    for (; e < 0; e++)
        r /= 2.0;
    return r;
}

static int is_float(mw_dtype_t dt)
{
    return dt == MW_F16 || dt == MW_BF16 || dt == MW_F32 || dt == MW_F64;
}

static int f16_is_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7c00u;
}

static int bf16_is_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7f80u;
}

/* ------------------------------------------------------------------------
 * Reference formats: values straight from the definitions, rounding by
 * bisection over the non-negative patterns, which increase with value.
 * ------------------------------------------------------------------------ */

struct fmt16 {
    double val[NPATTERNS];   /* value of each pattern (NaN for NaNs) */
    uint16_t inf;            /* +inf pattern */
    uint16_t qnan;           /* a positive quiet NaN */
    double top;              /* max finite + 1 ulp: where rounding hits inf */
};

static struct fmt16 ref_f16, ref_bf16;

/* 1 sign, @ebits exponent, @mbits significand bits, IEEE layout. */
static double decode(unsigned h, int ebits, int mbits)
{
    int emax = (1 << ebits) - 1, bias = (1 << (ebits - 1)) - 1;
    int e = (int)(h >> mbits) & emax;
    unsigned m = h & ((1u << mbits) - 1);
    double v;

    if (e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = m * pow2(1 - bias - mbits);
    else
        v = ((1u << mbits) + m) * pow2(e - bias - mbits);
    return (h & 0x8000u) ? -v : v;
}

static void fmt_init(struct fmt16 *f, int ebits, int mbits)
{
    for (unsigned h = 0; h < NPATTERNS; h++)
        f->val[h] = decode(h, ebits, mbits);
    f->inf = (uint16_t)(((1u << ebits) - 1) << mbits);
    f->qnan = (uint16_t)(f->inf | (1u << (mbits - 1)));
    f->top = 2 * f->val[f->inf - 1] - f->val[f->inf - 2];
}

/* The format's nearest value to @v, ties to the even pattern; beyond max
 * it rounds as if the exponent were unbounded, so from @top on it is inf. */
static uint16_t ref_encode(const struct fmt16 *f, double v)
{
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    unsigned lo = 0, hi = f->inf;

    if (isnan(v))
        return sign | f->qnan;
    if (sign)
        v = -v;
    if (v >= f->top)
        return sign | f->inf;
    while (hi - lo > 1) {    /* val(lo) <= v < val(hi), val(inf) = top */
        unsigned mid = (lo + hi) / 2;
        if (f->val[mid] <= v)
            lo = mid;
        else
            hi = mid;
    }
    double vhi = hi == f->inf ? f->top : f->val[hi];
    double half = (f->val[lo] + vhi) / 2;   /* exact: adjacent values */
    unsigned h = v < half ? lo : v > half ? hi : (lo & 1u) ? hi : lo;
    return (uint16_t)(sign | h);
}

static int fmt_setup(void **state)
{
    (void)state;
    fmt_init(&ref_f16, 5, 10);
    fmt_init(&ref_bf16, 8, 7);
    return 0;
}

/* ------------------------------------------------------------------------
 * Reference reduction, one element at a time
 * ------------------------------------------------------------------------ */

static float ref_opf(mw_op_t op, float a, float b)
{
    switch (op) {
    case MW_SUM: return a + b;
    case MW_PROD: return a * b;
    default: break;
    }
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == 0 && b == 0)   /* -0 < +0 */
        return (op == MW_MIN ? signbit(a) || signbit(b) : signbit(a) && signbit(b))
                   ? -0.0f : 0.0f;
    return (op == MW_MIN) == (a < b) ? a : b;
}

static double ref_opd(mw_op_t op, double a, double b)
{
    switch (op) {
    case MW_SUM: return a + b;
    case MW_PROD: return a * b;
    default: break;
    }
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == 0 && b == 0)
        return (op == MW_MIN ? signbit(a) || signbit(b) : signbit(a) && signbit(b))
                   ? -0.0 : 0.0;
    return (op == MW_MIN) == (a < b) ? a : b;
}

static int is_signed(mw_dtype_t dt)
{
    return dt <= MW_INT64;
}

/* The element at @p, sign-extended for signed types. */
static uint64_t load_int(mw_dtype_t dt, const void *p)
{
    int8_t i8; int16_t i16; int32_t i32; int64_t i64;
    uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64;

    switch (dt) {
    case MW_INT8: memcpy(&i8, p, 1); return (uint64_t)(int64_t)i8;
    case MW_INT16: memcpy(&i16, p, 2); return (uint64_t)(int64_t)i16;
    case MW_INT32: memcpy(&i32, p, 4); return (uint64_t)(int64_t)i32;
    case MW_INT64: memcpy(&i64, p, 8); return (uint64_t)i64;
    case MW_UINT8: memcpy(&u8, p, 1); return u8;
    case MW_UINT16: memcpy(&u16, p, 2); return u16;
    case MW_UINT32: memcpy(&u32, p, 4); return u32;
    default: memcpy(&u64, p, 8); return u64;
    }
}

/* The low bits of @v; wrap-around is the truncation. */
static void store_int(mw_dtype_t dt, void *p, uint64_t v)
{
    uint8_t u8 = (uint8_t)v;
    uint16_t u16 = (uint16_t)v;
    uint32_t u32 = (uint32_t)v;

    switch (mw_dtype_size(dt)) {
    case 1: memcpy(p, &u8, 1); break;
    case 2: memcpy(p, &u16, 2); break;
    case 4: memcpy(p, &u32, 4); break;
    default: memcpy(p, &v, 8); break;
    }
}

static void ref_int(mw_dtype_t dt, mw_op_t op, void *d, const void *s)
{
    uint64_t a = load_int(dt, d), b = load_int(dt, s);
    /* flipping the top bit orders sign-extended values as signed */
    uint64_t flip = is_signed(dt) ? UINT64_C(1) << 63 : 0;
    int a_less = (a ^ flip) < (b ^ flip);
    uint64_t r;

    switch (op) {
    case MW_SUM: r = a + b; break;
    case MW_PROD: r = a * b; break;
    case MW_MIN: r = a_less ? a : b; break;
    default: r = a_less ? b : a; break;
    }
    store_int(dt, d, r);
}

static void ref_16(const struct fmt16 *f, mw_op_t op, void *d, const void *s)
{
    uint16_t a, b;

    memcpy(&a, d, 2);
    memcpy(&b, s, 2);
    /* the spec: computed in f32 (the decoded values are exact in f32) */
    uint16_t r = ref_encode(f, ref_opf(op, (float)f->val[a], (float)f->val[b]));
    memcpy(d, &r, 2);
}

static void ref_elem(mw_dtype_t dt, mw_op_t op, void *d, const void *s)
{
    float af, bf;
    double ad, bd;

    switch (dt) {
    case MW_F16: ref_16(&ref_f16, op, d, s); break;
    case MW_BF16: ref_16(&ref_bf16, op, d, s); break;
    case MW_F32:
        memcpy(&af, d, 4), memcpy(&bf, s, 4);
        af = ref_opf(op, af, bf);
        memcpy(d, &af, 4);
        break;
    case MW_F64:
        memcpy(&ad, d, 8), memcpy(&bd, s, 8);
        ad = ref_opd(op, ad, bd);
        memcpy(d, &ad, 8);
        break;
    default: ref_int(dt, op, d, s); break;
    }
}

/* Is the element at @p a NaN; if so, is it quiet? */
static int elem_nan(mw_dtype_t dt, const void *p, int *quiet)
{
    uint16_t h;
    uint32_t u;
    uint64_t w;

    switch (dt) {
    case MW_F16:
        memcpy(&h, p, 2);
        *quiet = (h & 0x0200u) != 0;
        return f16_is_nan(h);
    case MW_BF16:
        memcpy(&h, p, 2);
        *quiet = (h & 0x0040u) != 0;
        return bf16_is_nan(h);
    case MW_F32:
        memcpy(&u, p, 4);
        *quiet = (u & 0x00400000u) != 0;
        return (u & 0x7fffffffu) > 0x7f800000u;
    case MW_F64:
        memcpy(&w, p, 8);
        *quiet = (w & UINT64_C(0x0008000000000000)) != 0;
        return (w & ~(UINT64_C(1) << 63)) > UINT64_C(0x7ff0000000000000);
    default:
        return 0;
    }
}

/* Bit-identical, except that a NaN only has to be a quiet NaN. */
static int elem_same(mw_dtype_t dt, const void *got, const void *want)
{
    int qg = 0, qw = 0;

    if (elem_nan(dt, want, &qw))
        return elem_nan(dt, got, &qg) && qg;
    return memcmp(got, want, mw_dtype_size(dt)) == 0;
}

/* mw__reduce(@dst, @src) must give what the reference gives, element by
 * element; @src must not change. */
static void check_reduce(mw_dtype_t dt, mw_op_t op, void *dst, const void *src, size_t n)
{
    size_t sz = mw_dtype_size(dt);
    unsigned char *want = malloc(n * sz + 1), *src_copy = malloc(n * sz + 1);

    assert_non_null(want);
    assert_non_null(src_copy);
    memcpy(want, dst, n * sz);
    memcpy(src_copy, src, n * sz);
    for (size_t i = 0; i < n; i++)
        ref_elem(dt, op, want + i * sz, (const unsigned char *)src + i * sz);

    assert_int_equal(mw__reduce(dst, src, n, dt, op), 0);
    for (size_t i = 0; i < n; i++) {
        if (!elem_same(dt, (unsigned char *)dst + i * sz, want + i * sz)) {
            print_error("%s %s: element %zu of %zu differs\n", mw_dtype_name(dt),
                        mw_op_name(op), i, n);
            fail();
        }
    }
    assert_memory_equal(src, src_copy, n * sz);
    free(want);
    free(src_copy);
}

/* ------------------------------------------------------------------------
 * Names, sizes, argument checks
 * ------------------------------------------------------------------------ */

static void names_and_sizes(void **state)
{
    static const char *const dnames[MW_DTYPE_COUNT] = {
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
        "uint64", "f16", "bf16", "f32", "f64",
    };
    static const size_t sizes[MW_DTYPE_COUNT] = {1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};
    static const char *const onames[MW_OP_COUNT] = {"sum", "prod", "min", "max"};

    (void)state;
    for (int dt = 0; dt < MW_DTYPE_COUNT; dt++) {
        assert_string_equal(mw_dtype_name((mw_dtype_t)dt), dnames[dt]);
        assert_int_equal(mw_dtype_size((mw_dtype_t)dt), sizes[dt]);
    }
    for (int op = 0; op < MW_OP_COUNT; op++)
        assert_string_equal(mw_op_name((mw_op_t)op), onames[op]);

    assert_int_equal(mw_dtype_size(MW_DTYPE_COUNT), 0);
    assert_int_equal(mw_dtype_size((mw_dtype_t)-1), 0);
    assert_int_equal(mw_dtype_size((mw_dtype_t)1000), 0);
    assert_string_equal(mw_dtype_name(MW_DTYPE_COUNT), "?");
    assert_string_equal(mw_dtype_name((mw_dtype_t)-1), "?");
    assert_string_equal(mw_op_name(MW_OP_COUNT), "?");
    assert_string_equal(mw_op_name((mw_op_t)-1), "?");
}

static void unknown_dtype_or_op_is_einval(void **state)
{
    uint64_t d = 0, s = 0;

    (void)state;
    assert_int_equal(mw__reduce(&d, &s, 1, MW_DTYPE_COUNT, MW_SUM), -EINVAL);
    assert_int_equal(mw__reduce(&d, &s, 1, (mw_dtype_t)-1, MW_SUM), -EINVAL);
    assert_int_equal(mw__reduce(&d, &s, 1, (mw_dtype_t)1000, MW_SUM), -EINVAL);
    assert_int_equal(mw__reduce(&d, &s, 1, MW_F32, MW_OP_COUNT), -EINVAL);
    assert_int_equal(mw__reduce(&d, &s, 1, MW_F32, (mw_op_t)-1), -EINVAL);
    /* checked before the count: a bad type is a bug even with nothing to do */
    assert_int_equal(mw__reduce(NULL, NULL, 0, MW_DTYPE_COUNT, MW_SUM), -EINVAL);
    assert_int_equal(mw__reduce(NULL, NULL, 0, MW_INT8, MW_OP_COUNT), -EINVAL);
    assert_int_equal(d, 0);
}

static void null_only_with_zero_count(void **state)
{
    uint64_t d = 0, s = 0;

    (void)state;
    for (int dt = 0; dt < MW_DTYPE_COUNT; dt++) {
        for (int op = 0; op < MW_OP_COUNT; op++) {
            assert_int_equal(mw__reduce(NULL, NULL, 0, (mw_dtype_t)dt, (mw_op_t)op), 0);
            assert_int_equal(mw__reduce(NULL, &s, 1, (mw_dtype_t)dt, (mw_op_t)op), -EINVAL);
            assert_int_equal(mw__reduce(&d, NULL, 1, (mw_dtype_t)dt, (mw_op_t)op), -EINVAL);
        }
    }
}

/* ------------------------------------------------------------------------
 * Random data against the reference
 * ------------------------------------------------------------------------ */

/* Half the floats are arbitrary bit patterns (NaNs, infinities, extremes);
 * the other half lie in [1/4, 8) so sums and products round rather than
 * one operand swamping the other. */
static void random_elem(mw_dtype_t dt, void *p)
{
    uint64_t r = rng(), sel = rng();
    uint16_t h;
    uint32_t u;

    if ((sel & 1) || !is_float(dt)) {
        memcpy(p, &r, mw_dtype_size(dt));
        return;
    }
    int e = (int)((sel >> 1) % 5) - 2;
    switch (dt) {
    case MW_F16:
        h = (uint16_t)((r & 0x83ffu) | (unsigned)(15 + e) << 10);
        memcpy(p, &h, 2);
        break;
    case MW_BF16:
        h = (uint16_t)((r & 0x807fu) | (unsigned)(127 + e) << 7);
        memcpy(p, &h, 2);
        break;
    case MW_F32:
        u = (uint32_t)(r & 0x807fffffu) | (uint32_t)(127 + e) << 23;
        memcpy(p, &u, 4);
        break;
    default:
        r = (r & UINT64_C(0x800fffffffffffff)) | (uint64_t)(1023 + e) << 52;
        memcpy(p, &r, 8);
        break;
    }
}

/* Counts around the kernels' 64-element blocks; offsets of one element put
 * the arrays off vector alignment while keeping natural alignment. */
static void check_random(mw_dtype_t dt)
{
    static const size_t counts[] = {0, 1, 7, 63, 64, 65, 4096 + 3};
    size_t sz = mw_dtype_size(dt);

    rng_state = 0x5eed0000u + (uint64_t)dt;
    for (int op = 0; op < MW_OP_COUNT; op++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            for (size_t off = 0; off < 2; off++) {
                size_t n = counts[c];
                /* exact sizes, so ASan/valgrind catch any overrun */
                unsigned char *d = malloc((n + off) * sz + 1);
                unsigned char *s = malloc((n + off) * sz + 1);
                assert_non_null(d);
                assert_non_null(s);
                for (size_t i = 0; i < n; i++) {
                    random_elem(dt, d + (off + i) * sz);
                    random_elem(dt, s + (off + i) * sz);
                }
                check_reduce(dt, (mw_op_t)op, d + off * sz, s + off * sz, n);
                free(d);
                free(s);
            }
        }
    }
}

#define RANDOM_TEST(name, dt)                                                   \
    static void random_##name(void **state)                                     \
    {                                                                           \
        (void)state;                                                            \
        check_random(dt);                                                       \
    }

RANDOM_TEST(int8, MW_INT8)
RANDOM_TEST(int16, MW_INT16)
RANDOM_TEST(int32, MW_INT32)
RANDOM_TEST(int64, MW_INT64)
RANDOM_TEST(uint8, MW_UINT8)
RANDOM_TEST(uint16, MW_UINT16)
RANDOM_TEST(uint32, MW_UINT32)
RANDOM_TEST(uint64, MW_UINT64)
RANDOM_TEST(f16, MW_F16)
RANDOM_TEST(bf16, MW_BF16)
RANDOM_TEST(f32, MW_F32)
RANDOM_TEST(f64, MW_F64)

/* ------------------------------------------------------------------------
 * Integers
 * ------------------------------------------------------------------------ */

static void integer_sum_prod_wrap(void **state)
{
    int8_t a8[] = {INT8_MAX, INT8_MIN, INT8_MIN, 16};
    int8_t b8[] = {1, -1, -1, 16};
    int16_t p16[] = {300, INT16_MIN};
    int16_t q16[] = {300, -1};
    uint16_t u16[] = {65535, 65535};     /* int promotion would overflow here */
    uint16_t v16[] = {65535, 1};
    int32_t a32[] = {INT32_MAX, INT32_MIN};
    int32_t b32[] = {1, -1};
    int64_t a64[] = {INT64_MAX, INT64_MIN};
    int64_t b64[] = {2, -1};
    uint64_t c64[] = {UINT64_MAX, UINT64_MAX};
    uint64_t d64[] = {1, UINT64_MAX};

    (void)state;
    assert_int_equal(mw__reduce(a8, b8, 2, MW_INT8, MW_SUM), 0);
    assert_int_equal(a8[0], INT8_MIN);
    assert_int_equal(a8[1], INT8_MAX);
    assert_int_equal(mw__reduce(a8 + 2, b8 + 2, 2, MW_INT8, MW_PROD), 0);
    assert_int_equal(a8[2], INT8_MIN);   /* -128 * -1 wraps to itself */
    assert_int_equal(a8[3], 0);          /* 256 */

    assert_int_equal(mw__reduce(p16, q16, 2, MW_INT16, MW_PROD), 0);
    assert_int_equal(p16[0], 90000 - 65536);
    assert_int_equal(p16[1], INT16_MIN);
    assert_int_equal(mw__reduce(u16, v16, 2, MW_UINT16, MW_PROD), 0);
    assert_int_equal(u16[0], 1);
    assert_int_equal(u16[1], 65535);

    assert_int_equal(mw__reduce(a32, b32, 2, MW_INT32, MW_SUM), 0);
    assert_int_equal(a32[0], INT32_MIN);
    assert_int_equal(a32[1], INT32_MAX);
    assert_int_equal(mw__reduce(a64, b64, 2, MW_INT64, MW_PROD), 0);
    assert_true(a64[0] == -2);        /* (2^63 - 1) * 2 */
    assert_true(a64[1] == INT64_MIN);
    assert_int_equal(mw__reduce(c64, d64, 2, MW_UINT64, MW_SUM), 0);
    assert_true(c64[0] == 0 && c64[1] == UINT64_MAX - 1);
    assert_int_equal(mw__reduce(c64, d64, 2, MW_UINT64, MW_PROD), 0);
    assert_true(c64[0] == 0 && c64[1] == (UINT64_MAX - 1) * UINT64_MAX);
}

static void integer_min_max_signedness(void **state)
{
    int8_t i8[] = {-1, 1}, j8[] = {1, -1};
    uint8_t u8[] = {255, 1}, v8[] = {1, 255};
    int64_t i64[] = {INT64_MIN, -1}, j64[] = {INT64_MAX, 0};
    uint64_t u64[] = {UINT64_MAX, 0}, v64[] = {1, UINT64_MAX};

    (void)state;
    assert_int_equal(mw__reduce(i8, j8, 2, MW_INT8, MW_MIN), 0);
    assert_true(i8[0] == -1 && i8[1] == -1);
    assert_int_equal(mw__reduce(u8, v8, 2, MW_UINT8, MW_MIN), 0);
    assert_true(u8[0] == 1 && u8[1] == 1);
    assert_int_equal(mw__reduce(i64, j64, 2, MW_INT64, MW_MAX), 0);
    assert_true(i64[0] == INT64_MAX && i64[1] == 0);
    assert_int_equal(mw__reduce(u64, v64, 2, MW_UINT64, MW_MAX), 0);
    assert_true(u64[0] == UINT64_MAX && u64[1] == UINT64_MAX);
}

/* ------------------------------------------------------------------------
 * f16 / bf16 conversions
 * ------------------------------------------------------------------------ */

/* Every pattern: to f32 is the exact value (NaN -> quiet NaN, same sign),
 * and back is the identity but for the quiet bit a signalling NaN gains. */
static void round_trip_every_pattern(const struct fmt16 *f, float (*to)(uint16_t),
                                     uint16_t (*from)(float), uint16_t quiet_bit)
{
    for (unsigned h = 0; h < NPATTERNS; h++) {
        float v = to((uint16_t)h);
        uint16_t back = from(v);
        if (isnan(f->val[h])) {
            assert_true(isnan(v));
            assert_true(bits32(v) & 0x00400000u);
            assert_int_equal(!!signbit(v), !!(h & 0x8000u));
            assert_int_equal(back, h | quiet_bit);
        } else {
            assert_true((double)v == f->val[h]);
            assert_int_equal(!!signbit(v), !!(h & 0x8000u));
            assert_int_equal(back, h);
        }
    }
}

static void f16_round_trip_every_pattern(void **state)
{
    (void)state;
    round_trip_every_pattern(&ref_f16, mw__f16_to_f32, mw__f32_to_f16, 0x0200u);
    assert_int_equal(mw__f32_to_f16(mw__f16_to_f32(0x7c01u)), 0x7e01u);
    assert_int_equal(mw__f32_to_f16(mw__f16_to_f32(0xfd55u)), 0xff55u);
}

static void bf16_round_trip_every_pattern(void **state)
{
    (void)state;
    round_trip_every_pattern(&ref_bf16, mw__bf16_to_f32, mw__f32_to_bf16, 0x0040u);
    /* bf16 -> f32 is the top half of the f32, exactly */
    for (unsigned h = 0; h < NPATTERNS; h++)
        if (!bf16_is_nan((uint16_t)h))
            assert_int_equal(bits32(mw__bf16_to_f32((uint16_t)h)), h << 16);
}

/* For every two adjacent non-negative values lo < hi of the format (inf
 * standing for max + 1 ulp): their midpoint goes to the even one, a float
 * just below it to lo, just above it to hi; the same negated. */
static void ties_to_even(const struct fmt16 *f, uint16_t (*from)(float))
{
    for (unsigned lo = 0; lo < f->inf; lo++) {
        unsigned hi = lo + 1;
        double vhi = hi == f->inf ? f->top : f->val[hi];
        float mid = (float)((f->val[lo] + vhi) / 2);
        uint32_t m = bits32(mid);
        unsigned even = (lo & 1u) ? hi : lo;

        assert_true((double)mid == (f->val[lo] + vhi) / 2);   /* exact */
        assert_int_equal(from(mid), even);
        assert_int_equal(from(from32(m - 1)), lo);
        assert_int_equal(from(from32(m + 1)), hi);
        assert_int_equal(from(-mid), even | 0x8000u);
        assert_int_equal(from(from32((m - 1) | 0x80000000u)), lo | 0x8000u);
        assert_int_equal(from(from32((m + 1) | 0x80000000u)), hi | 0x8000u);
    }
}

static void f16_ties_to_even(void **state)
{
    (void)state;
    ties_to_even(&ref_f16, mw__f32_to_f16);
}

static void bf16_ties_to_even(void **state)
{
    (void)state;
    ties_to_even(&ref_bf16, mw__f32_to_bf16);
}

/* f32 -> 16 bits for f32 patterns spread over the whole range (a stride
 * prime to every field) against the bisection reference. */
static void from_f32_sweep(const struct fmt16 *f, uint16_t (*from)(float))
{
    uint32_t x = 0;

    do {
        float v = from32(x);
        uint16_t got = from(v), want = ref_encode(f, v);
        if (isnan(v))
            assert_int_equal(got & (f->qnan | 0x8000u), want);
        else if (got != want) {
            print_error("f32 0x%08x: got 0x%04x want 0x%04x\n", x, got, want);
            fail();
        }
        x += 4099;
    } while (x >= 4099);
}

static void f16_from_f32_matches_reference(void **state)
{
    (void)state;
    from_f32_sweep(&ref_f16, mw__f32_to_f16);
}

static void bf16_from_f32_matches_reference(void **state)
{
    (void)state;
    from_f32_sweep(&ref_bf16, mw__f32_to_bf16);
}

static void f16_subnormals(void **state)
{
    /* d OP s = want, all f16 patterns */
    static const struct { uint16_t d, s, want; mw_op_t op; } cases[] = {
        {0x0001, 0x0001, 0x0002, MW_SUM},    /* 2^-24 + 2^-24 */
        {0x03ff, 0x0001, 0x0400, MW_SUM},    /* largest subnormal -> smallest normal */
        {0x0400, 0x8001, 0x03ff, MW_SUM},    /* and back down */
        {0x0400, 0x3800, 0x0200, MW_PROD},   /* 2^-14 * 0.5 = 2^-15 */
        {0x0001, 0x3800, 0x0000, MW_PROD},   /* 2^-25: tie, to even 0 */
        {0x0003, 0x3800, 0x0002, MW_PROD},   /* 1.5 * 2^-24: tie, to even 2 */
        {0x0005, 0x3800, 0x0002, MW_PROD},   /* 2.5 * 2^-24: tie, to even 2 */
        {0x8001, 0x3800, 0x8000, MW_PROD},   /* underflow keeps the sign */
        {0x0001, 0x0001, 0x0000, MW_PROD},   /* 2^-48 */
        {0x0001, 0x8001, 0x8001, MW_MIN},
        {0x03ff, 0x0400, 0x0400, MW_MAX},
    };

    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t d = cases[i].d;
        assert_int_equal(mw__reduce(&d, &cases[i].s, 1, MW_F16, cases[i].op), 0);
        assert_int_equal(d, cases[i].want);
    }
    assert_true(mw__f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(mw__f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(mw__f16_to_f32(0x8200) == -0x1p-15f);
    assert_int_equal(mw__f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(mw__f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(mw__f32_to_f16(0x1.000002p-25f), 0x0001);
    assert_int_equal(mw__f32_to_f16(1023.5f * 0x1p-24f), 0x0400);
    assert_int_equal(mw__f32_to_f16(FLT_TRUE_MIN), 0x0000);
    assert_int_equal(mw__f32_to_f16(-FLT_TRUE_MIN), 0x8000);
    assert_int_equal(mw__f32_to_f16(FLT_MIN), 0x0000);
}

static void ties_in_arithmetic(void **state)
{
    /* 1 + half an ulp of 1, from an even and from an odd significand */
    uint16_t h[] = {0x3c00, 0x3c01}, hs[] = {0x1000, 0x1000};
    uint16_t b[] = {0x3f80, 0x3f81}, bs[] = {0x3b80, 0x3b80};

    (void)state;
    assert_int_equal(mw__reduce(h, hs, 2, MW_F16, MW_SUM), 0);
    assert_int_equal(h[0], 0x3c00);
    assert_int_equal(h[1], 0x3c02);
    assert_int_equal(mw__reduce(b, bs, 2, MW_BF16, MW_SUM), 0);
    assert_int_equal(b[0], 0x3f80);
    assert_int_equal(b[1], 0x3f82);
}

static void overflow_to_inf(void **state)
{
    uint16_t h[] = {0x7bff, 0x7bff, 0x7bff, 0xfbff, 0x5c00};
    uint16_t hs[] = {0x7bff, 0x3c00, 0x4c00, 0xfbff, 0x5c00};
    uint16_t b[] = {0x7f7f, 0xff7f, 0x7f7f};
    uint16_t bs[] = {0x7f7f, 0xff7f, 0x4000};
    float f = FLT_MAX, fs = FLT_MAX;

    (void)state;
    assert_int_equal(mw__reduce(h, hs, 3, MW_F16, MW_SUM), 0);
    assert_int_equal(h[0], 0x7c00);    /* 65504 + 65504 */
    assert_int_equal(h[1], 0x7bff);    /* 65505 rounds down */
    assert_int_equal(h[2], 0x7c00);    /* 65520: tie, the even neighbour is inf */
    assert_int_equal(mw__reduce(h + 3, hs + 3, 1, MW_F16, MW_SUM), 0);
    assert_int_equal(h[3], 0xfc00);
    assert_int_equal(mw__reduce(h + 4, hs + 4, 1, MW_F16, MW_PROD), 0);
    assert_int_equal(h[4], 0x7c00);    /* 256^2 */

    assert_int_equal(mw__reduce(b, bs, 2, MW_BF16, MW_SUM), 0);
    assert_int_equal(b[0], 0x7f80);
    assert_int_equal(b[1], 0xff80);
    assert_int_equal(mw__reduce(b + 2, bs + 2, 1, MW_BF16, MW_PROD), 0);
    assert_int_equal(b[2], 0x7f80);

    assert_int_equal(mw__reduce(&f, &fs, 1, MW_F32, MW_SUM), 0);
    assert_true(isinf(f) && f > 0);

    assert_int_equal(mw__f32_to_f16(65519.996f), 0x7bff);
    assert_int_equal(mw__f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(mw__f32_to_f16(FLT_MAX), 0x7c00);
    assert_int_equal(mw__f32_to_f16(-FLT_MAX), 0xfc00);
    assert_int_equal(mw__f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(mw__f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(mw__f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(mw__f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(mw__f32_to_bf16(INFINITY), 0x7f80);
}

/* ------------------------------------------------------------------------
 * Special values: NaN, signed zeros, all pairs
 * ------------------------------------------------------------------------ */

#define NSPECIAL 14

/* Non-NaN specials then NaNs (quiet, signalling, negative), as patterns
 * of @dt. */
static void specials(mw_dtype_t dt, void *out)
{
    static const double v[] = {0.0, -0.0, 1.0, -1.0, 0.5, 3.0, INFINITY, -INFINITY};
    size_t sz = mw_dtype_size(dt);
    unsigned char *p = out;
    uint16_t h;
    uint32_t u;
    uint64_t w;

    for (size_t i = 0; i < 8; i++, p += sz) {
        switch (dt) {
        case MW_F16: h = mw__f32_to_f16((float)v[i]); memcpy(p, &h, 2); break;
        case MW_BF16: h = mw__f32_to_bf16((float)v[i]); memcpy(p, &h, 2); break;
        case MW_F32: u = bits32((float)v[i]); memcpy(p, &u, 4); break;
        default: w = bits64(v[i]); memcpy(p, &w, 8); break;
        }
    }
    /* largest finite, smallest subnormal, then NaNs: quiet, signalling,
     * negative quiet, negative signalling with a payload */
    static const uint16_t f16[] = {0x7bff, 0x0001, 0x7e00, 0x7c01, 0xfe00, 0xfd55};
    static const uint16_t b16[] = {0x7f7f, 0x0001, 0x7fc0, 0x7f81, 0xffc0, 0xff95};
    static const uint32_t f32[] = {0x7f7fffff, 0x00000001, 0x7fc00000, 0x7f800001,
                                   0xffc00000, 0xffa55555};
    static const uint64_t f64[] = {
        UINT64_C(0x7fefffffffffffff), 1, UINT64_C(0x7ff8000000000000),
        UINT64_C(0x7ff0000000000001), UINT64_C(0xfff8000000000000),
        UINT64_C(0xfff5555555555555),
    };
    const void *tail = dt == MW_F16 ? (const void *)f16 : dt == MW_BF16 ? (const void *)b16
                     : dt == MW_F32 ? (const void *)f32 : (const void *)f64;
    memcpy(p, tail, 6 * sz);
}

/* Every ordered pair of specials through every op, against the reference. */
static void special_pairs_match_reference(void **state)
{
    static const mw_dtype_t fdt[] = {MW_F16, MW_BF16, MW_F32, MW_F64};
    unsigned char sp[NSPECIAL * 8];
    unsigned char d[NSPECIAL * NSPECIAL * 8], s[NSPECIAL * NSPECIAL * 8];

    (void)state;
    for (size_t t = 0; t < 4; t++) {
        size_t sz = mw_dtype_size(fdt[t]);
        specials(fdt[t], sp);
        for (int op = 0; op < MW_OP_COUNT; op++) {
            for (size_t i = 0; i < NSPECIAL; i++) {
                for (size_t j = 0; j < NSPECIAL; j++) {
                    memcpy(d + (i * NSPECIAL + j) * sz, sp + i * sz, sz);
                    memcpy(s + (i * NSPECIAL + j) * sz, sp + j * sz, sz);
                }
            }
            check_reduce(fdt[t], (mw_op_t)op, d, s, NSPECIAL * NSPECIAL);
        }
    }
}

/* A NaN on either side, or both, gives a quiet NaN for every op and type,
 * min/max included (unlike fmin/fmax). */
static void nan_propagates_through_every_op(void **state)
{
    static const mw_dtype_t fdt[] = {MW_F16, MW_BF16, MW_F32, MW_F64};
    unsigned char sp[NSPECIAL * 8], d[8], s[8];

    (void)state;
    for (size_t t = 0; t < 4; t++) {
        size_t sz = mw_dtype_size(fdt[t]);
        specials(fdt[t], sp);
        for (int op = 0; op < MW_OP_COUNT; op++) {
            for (size_t nan = NSPECIAL - 4; nan < NSPECIAL; nan++) {
                for (size_t x = 0; x < NSPECIAL; x++) {
                    int q = 0;
                    memcpy(d, sp + nan * sz, sz);
                    memcpy(s, sp + x * sz, sz);
                    assert_int_equal(mw__reduce(d, s, 1, fdt[t], (mw_op_t)op), 0);
                    assert_true(elem_nan(fdt[t], d, &q) && q);
                    memcpy(d, sp + x * sz, sz);
                    memcpy(s, sp + nan * sz, sz);
                    assert_int_equal(mw__reduce(d, s, 1, fdt[t], (mw_op_t)op), 0);
                    assert_true(elem_nan(fdt[t], d, &q) && q);
                }
            }
        }
    }
}

/* f32/f64 min/max with a NaN where fmin/fmax would return the number. */
static void f32_f64_min_max_nan(void **state)
{
    float f[] = {NAN, 1.0f, NAN, -INFINITY}, fs[] = {1.0f, NAN, -INFINITY, NAN};
    double g[] = {NAN, 1.0, NAN, INFINITY}, gs[] = {1.0, NAN, INFINITY, NAN};

    (void)state;
    assert_int_equal(mw__reduce(f, fs, 2, MW_F32, MW_MIN), 0);
    assert_int_equal(mw__reduce(f + 2, fs + 2, 2, MW_F32, MW_MAX), 0);
    assert_int_equal(mw__reduce(g, gs, 2, MW_F64, MW_MAX), 0);
    assert_int_equal(mw__reduce(g + 2, gs + 2, 2, MW_F64, MW_MIN), 0);
    for (int i = 0; i < 4; i++) {
        assert_true(isnan(f[i]));
        assert_true(isnan(g[i]));
    }
}

/* min(-0, +0) = -0 and max(-0, +0) = +0 in both orders, for every
 * floating type: the result must not depend on which rank's value is dst. */
static void signed_zero_min_max(void **state)
{
    static const mw_dtype_t fdt[] = {MW_F16, MW_BF16, MW_F32, MW_F64};
    /* dst, src, min, max as signs of zero: 0 = +0, 1 = -0 */
    static const int cases[4][4] = {{0, 1, 1, 0}, {1, 0, 1, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}};
    unsigned char sp[NSPECIAL * 8], d[8], s[8];

    (void)state;
    for (size_t t = 0; t < 4; t++) {
        size_t sz = mw_dtype_size(fdt[t]);
        specials(fdt[t], sp);   /* sp[0] = +0, sp[1] = -0 */
        for (int c = 0; c < 4; c++) {
            for (int op = MW_MIN; op <= MW_MAX; op++) {
                memcpy(d, sp + (size_t)cases[c][0] * sz, sz);
                memcpy(s, sp + (size_t)cases[c][1] * sz, sz);
                assert_int_equal(mw__reduce(d, s, 1, fdt[t], (mw_op_t)op), 0);
                size_t want = (size_t)cases[c][op == MW_MIN ? 2 : 3];
                assert_memory_equal(d, sp + want * sz, sz);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_and_sizes),
        cmocka_unit_test(unknown_dtype_or_op_is_einval),
        cmocka_unit_test(null_only_with_zero_count),
        cmocka_unit_test(random_int8),
        cmocka_unit_test(random_int16),
        cmocka_unit_test(random_int32),
        cmocka_unit_test(random_int64),
        cmocka_unit_test(random_uint8),
        cmocka_unit_test(random_uint16),
        cmocka_unit_test(random_uint32),
        cmocka_unit_test(random_uint64),
        cmocka_unit_test(random_f16),
        cmocka_unit_test(random_bf16),
        cmocka_unit_test(random_f32),
        cmocka_unit_test(random_f64),
        cmocka_unit_test(integer_sum_prod_wrap),
        cmocka_unit_test(integer_min_max_signedness),
        cmocka_unit_test(f16_round_trip_every_pattern),
        cmocka_unit_test(bf16_round_trip_every_pattern),
        cmocka_unit_test(f16_ties_to_even),
        cmocka_unit_test(bf16_ties_to_even),
        cmocka_unit_test(f16_from_f32_matches_reference),
        cmocka_unit_test(bf16_from_f32_matches_reference),
        cmocka_unit_test(f16_subnormals),
        cmocka_unit_test(ties_in_arithmetic),
        cmocka_unit_test(overflow_to_inf),
        cmocka_unit_test(special_pairs_match_reference),
        cmocka_unit_test(nan_propagates_through_every_op),
        cmocka_unit_test(f32_f64_min_max_nan),
        cmocka_unit_test(signed_zero_min_max),
    };
    return cmocka_run_group_tests(tests, fmt_setup, NULL);
}
