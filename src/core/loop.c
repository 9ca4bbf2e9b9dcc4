/* The loop seen from outside: one file descriptor for loops that are not
 * libevent (mw_ctx_fd + mw_ctx_progress), and hand-offs from other threads
 * (mw_ctx_post, mw_ctx_call).
 *
 * The descriptor is an epoll set of meshwire's own: every descriptor the
 * context watches (completion channels, the rdma_cm channel, the hand-off
 * eventfd) plus a timerfd set to the earliest deadline of libevent's timers
 * (see "deadlines": libevent's heap is the only one). */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"

struct post {
    struct post *next;
    mw_task_fn fn;
    void *arg;
};

struct mw__loop {
    /* the descriptor of mw_ctx_fd, once asked for */
    int epfd, tfd;
    int *fds;
    size_t nfds, capfds;
    uint64_t next;                /* <= libevent's deadlines (see deadlines) */
    bool soon;                    /* a zero timer since the last turn began */
    bool turning;                 /* inside mw_ctx_progress: it re-arms */
    /* hand-offs from other threads */
    pthread_mutex_t lock;
    struct post *head, **tail;
    int efd;
    struct event *post_ev;
    pthread_t owner;              /* the thread that runs the loop */
};

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

uint64_t mw__now_ms(void)
{
    return now_ns() / 1000000u;
}

uint64_t mw__now_ns(void)
{
    return now_ns();
}

/* --- the work budget of a loop turn -------------------------------------- */

/* libevent caches the time once per turn, after polling: a new cached time
 * is a new turn, whose budget starts at its first piece of work.  Outside
 * the loop the time is read afresh on every call, so a caller posting from
 * its own code is not held back (its pump is bounded per call anyway). */
bool mw__turn_may(mw_ctx_t *ctx)
{
    struct timeval tv;
    uint64_t now = clock_ns(CLOCK_MONOTONIC_COARSE);
    if (event_base_gettimeofday_cached(ctx->base, &tv) < 0)
        return true;
    if (tv.tv_sec != ctx->turn.tv_sec || tv.tv_usec != ctx->turn.tv_usec) {
        ctx->turn = tv;
        ctx->turn_t0 = now;
    }
    return now - ctx->turn_t0 < MW__TURN_NS;
}

/* --- deadlines ------------------------------------------------------------ */

/* One timer heap, libevent's.  libevent 2.1 tells no one its next deadline,
 * so the descriptor's timerfd is armed from `next`, a lower bound of every
 * deadline in that heap: an add lowers it to the deadline libevent stored,
 * and once a turn has begun past it (libevent ran or someone deleted that
 * timer) it is read again from libevent's events.  Nothing is mirrored, so
 * a deleted timer costs at most one wake-up, re-arming costs libevent's
 * O(log n) and a compare, idle arms nothing, and a timer that came due
 * inside a long turn is still in libevent's heap for the next read.  The
 * read walks the base's events (O(n)), once per deadline that passes.
 * A zero timeout ("next turn") only asks for the next turn, as
 * event_active() does: it does not touch `next`.  (libuv's way, a heap of
 * loop.c's and one libevent timer, would need every event_del and
 * event_free of a timer to go through loop.c.) */
#define NO_DEADLINE UINT64_MAX

/* The deadline libevent keeps in @ev (event_struct.h: its clock, the
 * coarse one, with a common timeout's tag in the high microsecond bits). */
static uint64_t deadline_of(const struct event *ev)
{
    if (!(ev->ev_evcallback.evcb_flags & EVLIST_TIMEOUT))
        return NO_DEADLINE;
    return (uint64_t)ev->ev_timeout.tv_sec * 1000000000u +
           (uint64_t)(ev->ev_timeout.tv_usec & 0xfffff) * 1000u;
}

static int earliest_of(const struct event_base *base, const struct event *ev, void *arg)
{
    (void)base;
    uint64_t *min = arg, at = deadline_of(ev);
    if (at < *min)
        *min = at;
    return 0;
}

static uint64_t earliest_deadline(mw_ctx_t *ctx)
{
    uint64_t min = NO_DEADLINE;
    event_base_foreach_event(ctx->base, earliest_of, &min);
    return min;
}

/* libevent's timers go by CLOCK_MONOTONIC_COARSE, which ticks every 4 ms
 * on a 250 Hz kernel and so trails CLOCK_MONOTONIC (the timerfd's) by up
 * to a tick: a deadline is signalled a tick and a millisecond later, so
 * that libevent finds its timer due when the descriptor wakes the caller
 * (else the caller would spin on the descriptor until the tick). */
static uint64_t coarse_slack_ns(void)
{
    static _Atomic uint64_t slack;
    if (!slack) {
        struct timespec r;
        uint64_t tick = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0
                            ? (uint64_t)r.tv_sec * 1000000000u + (uint64_t)r.tv_nsec
                            : 0;
        slack = (tick < 10000000u ? tick : 10000000u) + 1000000u;
    }
    return slack;
}

/* A deadline that passed while libevent's coarse clock still had it ahead
 * (it lags more than the slack when a tick comes late, under load) is
 * signalled again in a millisecond, not at once: the caller would spin on
 * the descriptor until the clock catches up (seen: 459 wake-ups in 3 ms). */
#define COARSE_RETRY_NS 1000000u

static void arm_timerfd(struct mw__loop *l, uint64_t at_ns)
{
    struct itimerspec its = {0};
    if (at_ns > 1) {
        uint64_t now = now_ns();
        at_ns += coarse_slack_ns();
        if (at_ns <= now)
            at_ns = now + COARSE_RETRY_NS;
    }
    if (at_ns) {
        its.it_value.tv_sec = (time_t)(at_ns / 1000000000u);
        its.it_value.tv_nsec = (long)(at_ns % 1000000000u);
    }
    timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* @at: a deadline libevent keeps, or 1 for its next turn */
static void note_deadline(struct mw__loop *l, uint64_t at)
{
    if (at == 1)
        l->soon = true;
    else if (at < l->next)
        l->next = at;
    else
        return;
    if (l->epfd >= 0 && !l->turning)   /* else mw_ctx_fd / progress arms it */
        arm_timerfd(l, at);
}

int mw__ev_add(mw_ctx_t *ctx, struct event *ev, const struct timeval *tv)
{
    if (event_add(ev, tv) < 0)
        return -EIO;
    if (tv && ctx->loop && ctx->own_base)   /* a base of its own: mw_ctx_fd may cover it */
        note_deadline(ctx->loop, tv->tv_sec || tv->tv_usec ? deadline_of(ev) : 1);
    return 0;
}

bool mw__on_loop_thread(const mw_ctx_t *ctx)
{
    return !ctx->loop || pthread_equal(pthread_self(), ctx->loop->owner);
}

uint64_t mw__loop_thread(const mw_ctx_t *ctx)
{
    return ctx->loop ? (uint64_t)ctx->loop->owner : 0;
}

void mw__loop_kick(mw_ctx_t *ctx)
{
    struct mw__loop *l = ctx->loop;
    if (l && l->epfd >= 0 && !l->turning)
        arm_timerfd(l, 1);        /* an event was made active: run it soon */
}

/* --- watched descriptors -------------------------------------------------- */

static int epoll_add(struct mw__loop *l, int fd)
{
    struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    return epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &e) < 0 ? -errno : 0;
}

int mw__watch_fd(mw_ctx_t *ctx, int fd)
{
    struct mw__loop *l = ctx->loop;
    if (l->nfds == l->capfds) {
        size_t cap = l->capfds ? 2 * l->capfds : 8;
        int *v = mw__realloc(l->fds, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        l->fds = v;
        l->capfds = cap;
    }
    l->fds[l->nfds++] = fd;
    return l->epfd >= 0 ? epoll_add(l, fd) : 0;
}

void mw__unwatch_fd(mw_ctx_t *ctx, int fd)
{
    struct mw__loop *l = ctx->loop;
    for (size_t i = 0; l && i < l->nfds; i++) {
        if (l->fds[i] != fd)
            continue;
        l->fds[i] = l->fds[--l->nfds];
        if (l->epfd >= 0)
            epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
        return;
    }
}

void mw__watch_fd_out(mw_ctx_t *ctx, int fd, bool out)
{
    struct mw__loop *l = ctx->loop;
    struct epoll_event e = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.fd = fd};
    if (l && l->epfd >= 0)
        epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &e);
}

int mw_ctx_fd(mw_ctx_t *ctx)
{
    if (!ctx || !ctx->own_base)
        return -EINVAL;           /* on the caller's libevent base: use that */
    if (event_get_struct_event_size() != sizeof(struct event))
        return -ENOTSUP;          /* not the libevent deadline_of() reads */
    struct mw__loop *l = ctx->loop;
    if (l->epfd >= 0)
        return l->epfd;
    int rc;
    if ((l->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (l->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto fail;
    }
    if ((rc = epoll_add(l, l->tfd)) < 0)
        goto fail;
    for (size_t i = 0; i < l->nfds; i++)
        if ((rc = epoll_add(l, l->fds[i])) < 0)
            goto fail;
    arm_timerfd(l, 1);            /* one progress at once: whatever is due already */
    return l->epfd;
fail:
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->tfd >= 0)
        close(l->tfd);
    l->epfd = l->tfd = -1;
    return rc;
}

/* One libevent turn at a time (NONBLOCK alone keeps turning while anything
 * is active: a peer that keeps sending would hold the caller here).  Events
 * that callbacks activate run on the next turn, so turn until nothing is
 * active -- bounded in turns and in time (a turn's work budget), so that
 * progress cannot keep the caller's loop waiting; what is left re-arms the
 * descriptor. */
static int run_turns(mw_ctx_t *ctx)
{
    uint64_t t0 = now_ns();
    for (int turn = 0; turn < 8; turn++) {
        ctx->loop->soon = false;
        if (event_base_loop(ctx->base, EVLOOP_NONBLOCK | EVLOOP_ONCE) < 0)
            return -EIO;
        if (!event_base_get_num_events(ctx->base, EVENT_BASE_COUNT_ACTIVE) ||
            now_ns() - t0 >= MW__TURN_NS)
            break;
    }
    return 0;
}

/* @began: libevent's clock before the first turn.  That turn ran every
 * timer due by then, so a `next` not after it was run or deleted: read
 * the earliest again. */
static void rearm(mw_ctx_t *ctx, uint64_t began)
{
    struct mw__loop *l = ctx->loop;
    if (l->next <= began)
        l->next = earliest_deadline(ctx);
    if (l->soon || event_base_get_num_events(ctx->base, EVENT_BASE_COUNT_ACTIVE))
        arm_timerfd(l, 1);        /* work left: readable again at once */
    else
        arm_timerfd(l, l->next == NO_DEADLINE ? 0 : l->next);
}

int mw_ctx_progress(mw_ctx_t *ctx)
{
    if (!ctx || !ctx->own_base)
        return -EINVAL;
    if (ctx->in_callback)
        return -EDEADLK;
    struct mw__loop *l = ctx->loop;
    uint64_t expirations;
    if (l->tfd >= 0 && read(l->tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
        return -errno;
    uint64_t began = clock_ns(CLOCK_MONOTONIC_COARSE);
    l->turning = true;
    int rc = run_turns(ctx);
    l->turning = false;
    if (rc == 0 && l->epfd >= 0)
        rearm(ctx, began);
    return rc;
}

/* --- hand-offs from other threads ------------------------------------------ */

static void on_posted(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    mw_ctx_t *ctx = arg;
    struct mw__loop *l = ctx->loop;
    uint64_t n;
    if (read(fd, &n, sizeof n) < 0 && errno != EAGAIN)
        return;
    pthread_mutex_lock(&l->lock);
    struct post *p = l->head;
    l->head = NULL;
    l->tail = &l->head;
    pthread_mutex_unlock(&l->lock);
    while (p) {
        struct post *next = p->next;
        MW__CALL_OUT(ctx, p->fn(ctx, p->arg));
        mw__free(p);
        p = next;
    }
}

int mw_ctx_post(mw_ctx_t *ctx, mw_task_fn fn, void *arg)
{
    if (!ctx || !fn)
        return -EINVAL;
    if (!ctx->loop->post_ev)
        return -ENOTSUP;
    struct post *p = mw__malloc(sizeof *p);
    if (!p)
        return -ENOMEM;
    *p = (struct post){.fn = fn, .arg = arg};
    struct mw__loop *l = ctx->loop;
    pthread_mutex_lock(&l->lock);
    *l->tail = p;
    l->tail = &p->next;
    pthread_mutex_unlock(&l->lock);
    uint64_t one = 1;
    return write(l->efd, &one, sizeof one) < 0 ? -errno : 0;
}

struct call {
    mw_start_fn fn;
    void *arg;
    sem_t done;
    int err;
    void *value;
};

static void on_call_done(mw_future_t *f, void *arg)
{
    struct call *c = arg;
    c->err = mw_future_error(f);
    c->value = c->err ? NULL : mw_future_value(f);
    sem_post(&c->done);
}

static void start_call(mw_ctx_t *ctx, void *arg)
{
    struct call *c = arg;
    mw_future_t *f = c->fn(ctx, c->arg);
    if (!f || mw_future_then(f, on_call_done, c) < 0) {
        c->err = -ENOMEM;
        sem_post(&c->done);
    }
    mw_future_unref(f);
}

int mw_ctx_call(mw_ctx_t *ctx, mw_start_fn fn, void *arg, void **value)
{
    if (!ctx || !fn)
        return -EINVAL;
    if (!ctx->loop->post_ev)
        return -ENOTSUP;
    if (pthread_equal(pthread_self(), ctx->loop->owner))
        return -EDEADLK;          /* nobody would run the loop */
    struct call c = {.fn = fn, .arg = arg};
    if (sem_init(&c.done, 0, 0) < 0)
        return -errno;
    int rc = mw_ctx_post(ctx, start_call, &c);
    if (rc == 0) {
        while (sem_wait(&c.done) < 0 && errno == EINTR)
            ;
        rc = c.err;
        if (value)
            *value = c.value;
    }
    sem_destroy(&c.done);
    return rc;
}

/* --- life ------------------------------------------------------------------ */

int mw__loop_new(mw_ctx_t *ctx)
{
    struct mw__loop *l = mw__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    ctx->loop = l;
    l->epfd = l->tfd = -1;
    l->next = NO_DEADLINE;
    l->tail = &l->head;
    l->owner = pthread_self();
    pthread_mutex_init(&l->lock, NULL);
    l->efd = -1;
    if (!ctx->opts.threads)
        return 0;
    if ((l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        return -errno;
    l->post_ev = event_new(ctx->base, l->efd, EV_READ | EV_PERSIST, on_posted, ctx);
    if (!l->post_ev || event_add(l->post_ev, NULL) < 0)
        return -ENOMEM;
    return mw__watch_fd(ctx, l->efd);
}

void mw__loop_free(mw_ctx_t *ctx)
{
    struct mw__loop *l = ctx->loop;
    if (!l)
        return;
    if (l->post_ev)
        event_free(l->post_ev);
    while (l->head) {             /* posted too late: they never ran */
        struct post *p = l->head;
        l->head = p->next;
        mw__free(p);
    }
    if (l->efd >= 0)
        close(l->efd);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->tfd >= 0)
        close(l->tfd);
    pthread_mutex_destroy(&l->lock);
    mw__free(l->fds);
    mw__free(l);
    ctx->loop = NULL;
}
