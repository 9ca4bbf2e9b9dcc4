/* Deterministic collective inputs and their reductions, shared by the rxe
 * and mesh collective tests. */
#ifndef MW_TEST_COLL_DATA_H
#define MW_TEST_COLL_DATA_H

#include <stddef.h>

#include "meshwire.h"

/* fill() - element i of rank r's input (salted per call site): small
 * integers, so every sum and product is exact in every type and the order of
 * reduction cannot matter. */
void fill(void *buf, mw_dtype_t dt, size_t n, int r, size_t salt);

/* reference() - the reduction of all ranks' fill() inputs, malloc'd. */
void *reference(mw_dtype_t dt, mw_op_t op, size_t n, int nranks, size_t salt);

#endif
