/* Element-wise reduction kernels for the collectives: dst[i] = dst[i] OP src[i],
 * plus the binary16 / bfloat16 conversions they use.  Pure functions of
 * their arguments: no context, no allocation, thread-safe.
 *
 * Floating semantics (all four floating types, f16/bf16 computed in f32):
 *  - sum/prod follow IEEE 754 in the current rounding mode (round to nearest
 *    even by default); f16/bf16 results are then rounded to nearest even.
 *    Because f32 carries more than 2p+2 bits of an f16 (p = 11) or bf16
 *    (p = 8) significand, that double rounding equals one correct rounding.
 *  - min/max return a NaN when either operand is a NaN (dst's if both are);
 *    unlike C fmin/fmax, which return the number.
 *  - min/max order -0 below +0: min(-0, +0) = -0 and max(-0, +0) = +0 in
 *    either argument order (IEEE 754-2019 minimum/maximum), so the result
 *    does not depend on the order in which ranks combine their values.
 *  - every NaN produced is quiet; NaN payloads are otherwise unspecified. */
#ifndef MW_COLL_REDUCE_H
#define MW_COLL_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "meshwire.h"

/*
 * mw__reduce() - dst[i] = dst[i] @op src[i] for i in [0, @count).
 * @dst, @src: arrays of @count elements of @dt.  Both must be naturally
 *   aligned for @dt (callers pass registered, page-aligned buffers plus whole
 *   element offsets) and must not overlap, not even dst == src: the kernels
 *   are compiled with restrict so they vectorise.  Either may be NULL when
 *   @count is 0.  @src is only read; neither is retained.
 * Return: 0, or -EINVAL for an unknown @dt or @op, or a NULL pointer with a
 *   non-zero @count.
 */
int mw__reduce(void *dst, const void *src, size_t count, mw_dtype_t dt, mw_op_t op);

/*
 * Conversions, exact and independent of the floating-point environment
 * (integer code; the one float multiply is exact):
 *  - to f32: exact for every value; a signalling NaN comes back quiet with
 *    the rest of its payload kept.
 *  - from f32: round to nearest, ties to even; overflow gives +/-inf,
 *    underflow gives f16 subnormals or a signed zero; a NaN stays a quiet
 *    NaN of the same sign keeping the top payload bits that fit.
 * So f16 -> f32 -> f16 (and bf16 likewise) is the identity on every bit
 * pattern except signalling NaNs, which come back with the quiet bit set
 * (0x0200 for f16, 0x0040 for bf16).
 */
float mw__f16_to_f32(uint16_t h);
uint16_t mw__f32_to_f16(float f);
float mw__bf16_to_f32(uint16_t h);
uint16_t mw__f32_to_bf16(float f);

#endif
