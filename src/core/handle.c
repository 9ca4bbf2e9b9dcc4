/* The process-wide handle table: slots in chunks that never move or go
 * away, found through a fixed directory, so a lookup needs no lock. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/handle.h"

#define CHUNK_BITS 12
#define CHUNK (1u << CHUNK_BITS)
#define MAX_CHUNKS (1u << 16)
#define NONE UINT32_MAX

/* The last generation a slot may carry; then it is retired.  A unit test
 * builds this file with a small value to reach retirement quickly. */
#ifndef MW__HANDLE_GEN_MAX
#define MW__HANDLE_GEN_MAX UINT32_MAX
#endif
_Static_assert(MW__HANDLE_GEN_MAX & 1, "the last generation must be a live (odd) one");
_Static_assert(sizeof(void *) == 8, "handles are 64-bit values in pointers");

struct hslot {
    _Atomic uint32_t gen;         /* odd while live, even while free */
    _Atomic uint32_t kind;
    _Atomic(void *) obj;
    _Atomic uint64_t owner;       /* the only thread that may use it; 0: any */
    uint32_t next_free;           /* under the lock */
};
_Static_assert(sizeof(pthread_t) <= sizeof(uint64_t), "a thread fits a slot's owner");

static _Atomic(struct hslot *) dir[MAX_CHUNKS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t nchunks, free_head = NONE;
static uint64_t live, retired;

static const char *const kind_names[] = {
    [MW__H_FUTURE] = "future",
    [MW__H_CONN] = "connection",
    [MW__H_LISTENER] = "listener",
    [MW__H_COMM] = "communicator",
    [MW__H_MR] = "registration",
    [MW__H_DIR] = "directory",
};

static struct hslot *slot_at(uint32_t idx)
{
    if (idx >> CHUNK_BITS >= MAX_CHUNKS)
        return NULL;
    struct hslot *c = atomic_load_explicit(&dir[idx >> CHUNK_BITS], memory_order_acquire);
    return c ? &c[idx & (CHUNK - 1)] : NULL;
}

/* Under the lock.  Chunks are never freed: a handle must stay readable
 * for as long as someone may hold it, which is for ever. */
static bool grow(void)
{
    if (nchunks >= MAX_CHUNKS)
        return false;
    struct hslot *c = mw__calloc_forever(CHUNK, sizeof *c);
    if (!c)
        return false;
    uint32_t base = nchunks * CHUNK;
    for (uint32_t i = CHUNK; i-- > 0;) {  /* lowest index handed out first */
        c[i].next_free = free_head;
        free_head = base + i;
    }
    atomic_store_explicit(&dir[nchunks++], c, memory_order_release);
    return true;
}

uint64_t mw__thread_self(void)
{
    return (uint64_t)pthread_self();
}

uint64_t mw__handle_new(enum mw__handle_kind kind, void *obj, uint64_t owner)
{
    pthread_mutex_lock(&lock);
    if (free_head == NONE && !grow()) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    uint32_t idx = free_head;
    struct hslot *s = slot_at(idx);
    free_head = s->next_free;
    /* Release stores: a reader that sees one of these new values also sees
     * the generation the last release left (see read_slot).  No fences:
     * the thread sanitizer does not model them. */
    atomic_store_explicit(&s->kind, kind, memory_order_release);
    atomic_store_explicit(&s->obj, obj, memory_order_release);
    atomic_store_explicit(&s->owner, owner, memory_order_release);
    /* even -> odd: live; publishes kind and obj to lock-free readers */
    uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->gen, gen, memory_order_release);
    live++;
    pthread_mutex_unlock(&lock);
    return (uint64_t)gen << 32 | idx;
}

void mw__handle_release(uint64_t h)
{
    uint32_t idx = (uint32_t)h, gen = (uint32_t)(h >> 32);
    pthread_mutex_lock(&lock);
    struct hslot *s = slot_at(idx);
    if (!s || !(gen & 1) || atomic_load_explicit(&s->gen, memory_order_relaxed) != gen) {
        pthread_mutex_unlock(&lock);
        return;
    }
    atomic_store_explicit(&s->obj, NULL, memory_order_relaxed);
    live--;
    if (gen >= MW__HANDLE_GEN_MAX) {
        /* One more use would wrap the generation and let an old handle
         * match again: the slot is never handed out again (0 is even and
         * below every live generation). */
        atomic_store_explicit(&s->gen, 0, memory_order_release);
        retired++;
    } else {
        atomic_store_explicit(&s->gen, gen + 1, memory_order_release);
        s->next_free = free_head;
        free_head = idx;
    }
    pthread_mutex_unlock(&lock);
}

/* The slot's contents as of generation @gen, or false when it does not
 * hold that generation for the whole read (released or reused meanwhile,
 * which only a thread other than the owner can see). */
static bool read_slot(struct hslot *s, uint32_t gen, uint32_t *kind, void **obj,
                      uint64_t *owner)
{
    if (atomic_load_explicit(&s->gen, memory_order_acquire) != gen)
        return false;
    *kind = atomic_load_explicit(&s->kind, memory_order_acquire);
    *obj = atomic_load_explicit(&s->obj, memory_order_acquire);
    *owner = atomic_load_explicit(&s->owner, memory_order_acquire);
    return atomic_load_explicit(&s->gen, memory_order_relaxed) == gen && *obj;
}

void *mw__handle_get(uint64_t h, enum mw__handle_kind kind, const char *fn, int *err)
{
    if (!h) {
        *err = -EINVAL;
        return NULL;
    }
    uint32_t idx = (uint32_t)h, gen = (uint32_t)(h >> 32), k;
    uint64_t owner;
    void *obj;
    struct hslot *s = slot_at(idx);
    if (!s || !(gen & 1) || !read_slot(s, gen, &k, &obj, &owner)) {
        *err = -ESTALE;
        mw__log(NULL, MW_LOG_ERROR, "%s: not a live %s (released already, or never one): "
                "handle %#llx", fn, kind_names[kind], (unsigned long long)h);
        return NULL;
    }
    if (k != kind) {
        *err = -EINVAL;
        mw__log(NULL, MW_LOG_ERROR, "%s: handle %#llx is a %s, not a %s", fn,
                (unsigned long long)h, kind_names[k], kind_names[kind]);
        return NULL;
    }
    if (owner && owner != mw__thread_self()) {
        *err = -EPERM;
        mw__log(NULL, MW_LOG_ERROR, "%s: called from a thread that does not run the %s's "
                "loop (use mw_ctx_post or mw_ctx_call)", fn, kind_names[kind]);
        return NULL;
    }
    return obj;
}

uint64_t mw__handles_live(void)
{
    pthread_mutex_lock(&lock);
    uint64_t n = live;
    pthread_mutex_unlock(&lock);
    return n;
}

uint64_t mw__handles_retired(void)
{
    pthread_mutex_lock(&lock);
    uint64_t n = retired;
    pthread_mutex_unlock(&lock);
    return n;
}
