/* What a list (mw__store_scan) gathers page after page, the same for every
 * backend: key/value copies, bounded by MW__STORE_SCAN_MAX entries and
 * 64 MiB, answered through the scan's callback at the end.  Internal. */
#ifndef MW_DIR_GATHER_H
#define MW_DIR_GATHER_H

#include <stddef.h>

#include "dir/store.h"

struct mw__gather {
    size_t n, cap, bytes;
    char **keys, **vals;
    size_t *lens;
};

/* mw__gather_take() - keep @k (@klen bytes) and @v (@vlen), allocated with
 * mw__malloc and NUL-terminated, taken over (freed on error too).
 * Return: 0, -E2BIG (past the bounds) or -ENOMEM. */
int mw__gather_take(struct mw__gather *g, char *k, size_t klen, char *v, size_t vlen);
/* Why mw__gather_take() failed @err, for the answer. */
const char *mw__gather_why(int err);
/* mw__gather_answer() - @fn gets what was gathered (@err 0) or the failure;
 * then all is freed. */
void mw__gather_answer(struct mw__gather *g, mw__store_scan_fn fn, void *arg, int err,
                       const char *why);

#endif
