#include <stdint.h>
#include <stdlib.h>

#include "coll/reduce.h"
#include "coll_data.h"

/* Element i of rank r's input: small integers, so every sum and product is
 * exact in every type and the order of reduction cannot matter. */
void fill(void *buf, mw_dtype_t dt, size_t n, int r, size_t salt)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)((r * 7 + (i + salt) * 3) % 5) - (dt >= MW_UINT8 && dt <= MW_UINT64 ? 0 : 2);
        uint8_t *p = (uint8_t *)buf + i * mw_dtype_size(dt);
        switch (dt) {
        case MW_INT8: case MW_UINT8: *(int8_t *)p = (int8_t)v; break;
        case MW_INT16: case MW_UINT16: *(int16_t *)p = (int16_t)v; break;
        case MW_INT32: case MW_UINT32: *(int32_t *)p = v; break;
        case MW_INT64: case MW_UINT64: *(int64_t *)p = v; break;
        case MW_F16: *(uint16_t *)p = mw__f32_to_f16((float)v); break;
        case MW_BF16: *(uint16_t *)p = mw__f32_to_bf16((float)v); break;
        case MW_F32: *(float *)p = (float)v; break;
        case MW_F64: *(double *)p = (double)v; break;
        default: break;
        }
    }
}

/* The reduction of all ranks' inputs, by the kernels (tested on their own). */
void *reference(mw_dtype_t dt, mw_op_t op, size_t n, int nranks, size_t salt)
{
    size_t es = mw_dtype_size(dt);
    uint8_t *acc = malloc(n * es + 1), *tmp = malloc(n * es + 1);
    fill(acc, dt, n, 0, salt);
    for (int r = 1; r < nranks; r++) {
        fill(tmp, dt, n, r, salt);
        mw__reduce(acc, tmp, n, dt, op);
    }
    free(tmp);
    return acc;
}

