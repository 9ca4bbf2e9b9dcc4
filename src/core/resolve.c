/* Names looked up off the loop (resolve.h): one detached thread per
 * lookup, its answer handed back through an eventfd. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/resolve.h"
#include "core/thread.h"

int (*mw__getaddrinfo)(const char *, const char *, const struct addrinfo *,
                       struct addrinfo **) = getaddrinfo;

/* Threads still in getaddrinfo(), given up or not: a resolver that hangs
 * holds each for as long as it hangs, so no more are started beyond this. */
#define LOOKUPS_MAX 8

static atomic_int running;

struct mw__lookup {
    atomic_int refs;              /* the asker's, and the thread's while it runs */
    atomic_bool answered;         /* err, numeric and why are written */
    int efd;
    /* the asker's side, on the loop thread only */
    mw_ctx_t *ctx;
    struct event *ev;
    mw__lookup_fn done;
    void *arg;
    /* the answer */
    int err;
    char numeric[INET6_ADDRSTRLEN];
    char why[160];
    char host[];
};

int mw__lookups_running(void)
{
    return atomic_load(&running);
}

static void lookup_unref(struct mw__lookup *l)
{
    if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
        return;
    close(l->efd);
    mw__free(l);
}

static void answer(struct mw__lookup *l)
{
    atomic_store_explicit(&l->answered, true, memory_order_release);
    eventfd_write(l->efd, 1);
}

static bool is_literal(const char *host, char *numeric)
{
    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1)
        return false;
    snprintf(numeric, INET6_ADDRSTRLEN, "%s", host);
    return true;
}

static int gai_errno(int e)
{
    switch (e) {
    case EAI_NONAME:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
        return -ENOENT;
    case EAI_AGAIN:
        return -EAGAIN;
    case EAI_MEMORY:
        return -ENOMEM;
    default:
        return -EIO;
    }
}

/* The first IPv4 address, else the first one. */
static void pick(struct mw__lookup *l, const struct addrinfo *res)
{
    const struct addrinfo *a = res;
    for (const struct addrinfo *p = res; p; p = p->ai_next)
        if (p->ai_family == AF_INET) {
            a = p;
            break;
        }
    const void *in = a->ai_family == AF_INET
                         ? (const void *)&((const struct sockaddr_in *)a->ai_addr)->sin_addr
                         : (const void *)&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
    if (!inet_ntop(a->ai_family, in, l->numeric, sizeof l->numeric)) {
        l->err = -EAFNOSUPPORT;
        snprintf(l->why, sizeof l->why, "%.80s: an address of an unknown family", l->host);
    }
}

static void *lookup_run(void *arg)
{
    struct mw__lookup *l = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int e = mw__getaddrinfo(l->host, NULL, &hints, &res);
    if (e) {
        l->err = gai_errno(e);
        snprintf(l->why, sizeof l->why, "cannot resolve %.80s: %s", l->host,
                 e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
    } else if (!res) {
        l->err = -ENOENT;
        snprintf(l->why, sizeof l->why, "cannot resolve %.80s: no address", l->host);
    } else {
        pick(l, res);
    }
    if (res)
        freeaddrinfo(res);
    answer(l);
    lookup_unref(l);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

static int thread_start(struct mw__lookup *l)
{
    pthread_t t;
    if (atomic_fetch_add(&running, 1) >= LOOKUPS_MAX) {
        atomic_fetch_sub(&running, 1);
        return -EAGAIN;
    }
    atomic_fetch_add(&l->refs, 1);
    int rc = mw__thread_start(&t, true, lookup_run, l);
    if (rc) {
        atomic_fetch_sub(&l->refs, 1);
        atomic_fetch_sub(&running, 1);
    }
    return rc;
}

static void detach(struct mw__lookup *l)
{
    event_free(l->ev);
    mw__unwatch_fd(l->ctx, l->efd);
}

static void on_answer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__lookup *l = arg;
    eventfd_t n;
    eventfd_read(l->efd, &n);
    if (!atomic_load_explicit(&l->answered, memory_order_acquire))
        return;
    detach(l);
    l->done(l->arg, l->err, l->err ? NULL : l->numeric, l->why);
    lookup_unref(l);
}

int mw__lookup_start(mw_ctx_t *ctx, const char *host, mw__lookup_fn done, void *arg,
                     struct mw__lookup **out)
{
    struct mw__lookup *l = mw__calloc(1, sizeof *l + strlen(host) + 1);
    if (!l)
        return -ENOMEM;
    *l = (struct mw__lookup){.ctx = ctx, .done = done, .arg = arg, .efd = -1};
    atomic_init(&l->refs, 1);
    strcpy(l->host, host);
    int rc = -ENOMEM;
    if ((l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto fail;
    }
    if (!(l->ev = event_new(ctx->base, l->efd, EV_READ | EV_PERSIST, on_answer, l)))
        goto fail;
    if ((rc = mw__watch_fd(ctx, l->efd)) < 0) {
        event_free(l->ev);
        goto fail;
    }
    if (event_add(l->ev, NULL) < 0) {
        detach(l);
        rc = -ENOMEM;
        goto fail;
    }
    if (is_literal(host, l->numeric))
        answer(l);
    else if ((rc = thread_start(l)) < 0) {
        detach(l);
        goto fail;
    }
    *out = l;
    return 0;
fail:
    if (l->efd >= 0)
        close(l->efd);
    mw__free(l);
    return rc;
}

void mw__lookup_cancel(struct mw__lookup *l)
{
    if (!l)
        return;
    detach(l);
    lookup_unref(l);
}
