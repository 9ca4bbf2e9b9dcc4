/* Handles: what a caller holds for a future, connection, listener,
 * communicator or registration (mw_reg) is not the object's address but
 * (generation << 32 | slot) of one process-wide table.  A slot's
 * generation moves on when its object goes, and a slot whose generation
 * would wrap is retired instead of reused, so a handle once released
 * matches nothing ever again: a double unref, a use after close or free,
 * or a handle of another kind is refused with an error (-ESTALE, -EINVAL)
 * instead of touching freed or reused memory.
 *
 * A slot also records the thread its object belongs to (its context's loop
 * thread): a lookup from any other thread is refused (-EPERM) from the slot
 * alone, before the object is touched.  The table takes a lock only to hand
 * out and release slots; lookups are lock-free (a generation read before
 * and after, seqlock style), so even a misused handle reads defined
 * memory. */
#ifndef MW_CORE_HANDLE_H
#define MW_CORE_HANDLE_H

#include <stdint.h>

enum mw__handle_kind {
    MW__H_FUTURE = 1,
    MW__H_CONN,
    MW__H_LISTENER,
    MW__H_COMM,
    MW__H_MR,
    MW__H_DIR,
};

/* mw__thread_self() - the calling thread, as slots record owners. */
uint64_t mw__thread_self(void);

/* mw__handle_new() - a handle standing for @obj, to be used only from
 * thread @owner (a mw__thread_self() value; 0: any thread), or 0 when out
 * of memory (or out of slots: 2^28 live handles). */
uint64_t mw__handle_new(enum mw__handle_kind kind, void *obj, uint64_t owner);

/* mw__handle_release() - @h stops matching at once; its slot may be reused
 * under a later generation.  Releasing what does not match does nothing. */
void mw__handle_release(uint64_t h);

/* mw__handle_get() - the object behind @h, or NULL with *@err set: -EINVAL
 * for 0 or a live handle of another kind, -ESTALE for a handle that is not
 * live (released, or never made), -EPERM from a thread other than its
 * owner.  Unless @h is 0, the refusal is logged as an error naming @fn (the
 * public call). */
void *mw__handle_get(uint64_t h, enum mw__handle_kind kind, const char *fn, int *err);

/* Counters for tests: handles live now; slots retired for good. */
uint64_t mw__handles_live(void);
uint64_t mw__handles_retired(void);

/* Public handle types are pointers to structs never defined: converting
 * both ways here keeps the casts in one place. */
#define MW__HANDLE(p) ((uint64_t)(uintptr_t)(p))
#define MW__HANDLE_PTR(type, h) ((type *)(uintptr_t)(h))

#endif
