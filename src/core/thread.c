#include <errno.h>
#include <signal.h>

#include "core/thread.h"

/* Below 2 MiB, no huge page fits in the mapping; ample for what runs here. */
#define STACK_BYTES (1u << 20)

int mw__thread_start(pthread_t *t, bool detached, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    sigset_t all, old;
    if (pthread_attr_init(&attr))
        return -ENOMEM;
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    if (detached)
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = -pthread_create(t, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return rc;
}
