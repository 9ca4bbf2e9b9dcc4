/* What a list gathers (gather.h). */
#include <errno.h>

#include "core/alloc.h"
#include "dir/gather.h"

#define GATHER_BYTES_MAX (64u << 20)   /* of keys and values */

static int grow(struct mw__gather *g)
{
    size_t cap = g->cap ? 2 * g->cap : 128;
    char **keys = mw__realloc(g->keys, cap * sizeof *keys);
    if (keys)
        g->keys = keys;
    char **vals = mw__realloc(g->vals, cap * sizeof *vals);
    if (vals)
        g->vals = vals;
    size_t *lens = mw__realloc(g->lens, cap * sizeof *lens);
    if (lens)
        g->lens = lens;
    if (!keys || !vals || !lens)
        return -ENOMEM;
    g->cap = cap;
    return 0;
}

int mw__gather_take(struct mw__gather *g, char *k, size_t klen, char *v, size_t vlen)
{
    int rc = !k || !v ? -ENOMEM
             : g->n == MW__STORE_SCAN_MAX || g->bytes + klen + vlen > GATHER_BYTES_MAX ? -E2BIG
             : g->n == g->cap ? grow(g) : 0;
    if (rc) {
        mw__free(k);
        mw__free(v);
        return rc;
    }
    g->keys[g->n] = k;
    g->vals[g->n] = v;
    g->lens[g->n++] = vlen;
    g->bytes += klen + vlen;
    return 0;
}

const char *mw__gather_why(int err)
{
    return err == -E2BIG ? "over 100,000 entries, or 64 MiB, under the prefix" : "out of memory";
}

void mw__gather_answer(struct mw__gather *g, mw__store_scan_fn fn, void *arg, int err,
                       const char *why)
{
    fn(arg, err, why, err ? 0 : g->n, (const char *const *)g->keys,
       (const char *const *)g->vals, g->lens);
    for (size_t i = 0; i < g->n; i++) {
        mw__free(g->keys[i]);
        mw__free(g->vals[i]);
    }
    mw__free(g->keys);
    mw__free(g->vals);
    mw__free(g->lens);
    *g = (struct mw__gather){0};
}
