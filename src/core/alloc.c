/* One replaceable allocator (libuv's uv_replace_allocator, convention 8). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "meshwire.h"

static struct {
    mw_malloc_fn malloc;
    mw_realloc_fn realloc;
    mw_calloc_fn calloc;
    mw_free_fn free;
} allocator = {malloc, realloc, calloc, free};

/* Blocks held from the current allocator: it may be replaced only at 0. */
static atomic_long held;

int mw_replace_allocator(mw_malloc_fn m, mw_realloc_fn r, mw_calloc_fn c, mw_free_fn f)
{
    if (!m || !r || !c || !f)
        return -EINVAL;
    if (atomic_load(&held))
        return -EBUSY;
    allocator.malloc = m;
    allocator.realloc = r;
    allocator.calloc = c;
    allocator.free = f;
    return 0;
}

/* @p from the current allocator: counted as held, or ENOMEM. */
static void *held_or_enomem(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&held, 1, memory_order_relaxed);
    else
        errno = ENOMEM;
    return p;
}

void *mw__malloc(size_t size)
{
    return held_or_enomem(allocator.malloc(size ? size : 1));
}

void *mw__calloc(size_t n, size_t size)
{
    return held_or_enomem(allocator.calloc(n ? n : 1, size ? size : 1));
}

char *mw__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = mw__malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

void *mw__calloc_forever(size_t n, size_t size)
{
    void *p = allocator.calloc(n, size);
    if (!p)
        errno = ENOMEM;
    return p;
}

void *mw__realloc(void *p, size_t size)
{
    void *q = allocator.realloc(p, size ? size : 1);
    if (q && !p)
        atomic_fetch_add_explicit(&held, 1, memory_order_relaxed);
    else if (!q)
        errno = ENOMEM;
    return q;
}

void mw__free(void *p)
{
    if (!p)
        return;
    int saved = errno;
    allocator.free(p);
    atomic_fetch_sub_explicit(&held, 1, memory_order_relaxed);
    errno = saved;
}
