/* Knowing when user memory goes away, so a registration kept for it is
 * never handed out again for other pages at the same address.
 *
 * userfaultfd delivers an event when a range registered with it is unmapped
 * (munmap, brk shrinking, mw__free of a large block), zapped (madvise
 * DONTNEED/REMOVE: glibc trims freed heap this way) or moved (mremap).
 * Ranges are registered in write-protect mode and never write-protected,
 * so no page fault is ever delivered: only those events.  The kernel holds
 * the unmapping thread until the event is read; a helper thread reads them
 * (sleeping in poll otherwise) and records the ranges; it never allocates
 * or frees memory, which could unmap a watched range and wait for itself.
 * It counts first
 * and reads after, so by the time munmap returns the count has moved: a
 * lookup that finds the count unchanged (one atomic load, no system call)
 * may trust what it found; else it takes the ranges (mw__uffd_take) and
 * drops what they cover. */
#ifndef MW_MEM_UFFD_H
#define MW_MEM_UFFD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mw__uffd;

struct mw__gone {                 /* [start, end) unmapped, zapped or moved */
    uintptr_t start, end;
};

/* mw__uffd_new() - the monitor, or a negative errno when userfaultfd is not
 * available to this process (then nothing can be kept beyond its use).
 * @wake_fd: written to (an eventfd) when ranges are waiting. */
int mw__uffd_new(struct mw__uffd **up, int wake_fd);
void mw__uffd_free(struct mw__uffd *u);

/* mw__uffd_watch() - report when any page of [start, end) goes.  Fails
 * (negative errno) for memory userfaultfd cannot watch (file mappings):
 * then do not keep a registration of it. */
int mw__uffd_watch(struct mw__uffd *u, uintptr_t start, uintptr_t end);
void mw__uffd_unwatch(struct mw__uffd *u, uintptr_t start, uintptr_t end);

/* mw__uffd_changed() - whether ranges went since mw__uffd_take() last
 * returned; lock-free, for the post path. */
bool mw__uffd_changed(const struct mw__uffd *u);

/* mw__uffd_take() - the ranges gone since the last call, events still
 * queued in the kernel included, into @out; returns how many.  Nothing is
 * allocated with the monitor's lock held (see uffd.c). */
#define MW__UFFD_TAKE_MAX 64
size_t mw__uffd_take(struct mw__uffd *u, struct mw__gone out[MW__UFFD_TAKE_MAX]);

#endif
