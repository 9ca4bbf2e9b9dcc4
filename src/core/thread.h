/* meshwire's own threads: the helper (worker.h), name lookups (resolve.h)
 * and the userfaultfd monitor (mem/uffd.h). */
#ifndef MW_CORE_THREAD_H
#define MW_CORE_THREAD_H

#include <pthread.h>
#include <stdbool.h>

/* mw__thread_start() - run @fn(@arg) on a new thread, detached or not.
 * Every signal is blocked on it: signals stay the application's.  Its
 * stack is small (these threads only make verbs, libc and name-service
 * calls): glibc's 8 MiB default lets the kernel back the stack's top with
 * a 2 MiB huge page, cleared in the thread that creates it -- the loop's
 * -- 10-15 ms of CPU in the rxe VM.
 * Return: 0 or a negative errno. */
int mw__thread_start(pthread_t *t, bool detached, void *(*fn)(void *), void *arg);

#endif
