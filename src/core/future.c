/* Futures: a result completed on the loop, with callbacks that always run
 * later from a deferred task (never inside the call that registers them or
 * completes the future), chaining, joining, timeouts and cancellation.
 * Callers hold handles (core/handle.h); struct mw__future is the object. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"
#include "core/handle.h"

/* A registered callback (struct mw__cb, future.h) holds a reference on its
 * future until it has run, so every callback runs exactly once: when the
 * future completes, or at the context's teardown, which fails what is
 * still pending. */

struct mw__future {
    uint64_t h;                   /* the handle callers hold */
    mw_ctx_t *ctx;                /* NULL once detached at teardown */
    struct mw__list link;         /* in ctx->futures while attached */
    unsigned refs;
    int state;                    /* enum mw_future_state */
    int err;
    void *value;
    char *msg;                    /* malloc'd; NULL = use mw_strerror(err) */
    struct mw__cb *cb_head, **cb_tail;
    struct mw__task task;         /* runs the callbacks; holds a ref while queued */
    struct event *timer;
    unsigned timeout_ms;
    void (*cancel_fn)(mw_future_t *f, void *arg);
    void *cancel_arg;
    bool aborting;                /* cancelled or timed out: err and msg hold
                                     the failure; the operation completes it
                                     once it has let go of the caller's memory */
};

static void run_callbacks(struct mw__task *t);
static int abort_future(struct mw__future *f, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static mw_future_t *handle_of(const struct mw__future *f)
{
    return MW__HANDLE_PTR(mw_future_t, f->h);
}

/* The future behind @h for public call @fn, or NULL with *@err: -EINVAL
 * (NULL), -ESTALE (released), -EPERM (not its context's loop thread). */
static struct mw__future *future_of(const mw_future_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_FUTURE, fn, err);
}

/* ------------------------------------------------------------------------
 * Lifetime
 * ------------------------------------------------------------------------ */

mw_future_t *mw_future_new(mw_ctx_t *ctx)
{
    if (!ctx)
        return NULL;
    if (!mw__on_loop_thread(ctx)) {   /* every operation starts here */
        MW_LOG(ctx, MW_LOG_ERROR, "called from a thread that does not run the context's loop "
               "(use mw_ctx_post or mw_ctx_call)");
        errno = EPERM;
        return NULL;
    }
    struct mw__future *f = mw__calloc(1, sizeof *f);
    if (!f)
        return NULL;
    if (!(f->h = mw__handle_new(MW__H_FUTURE, f, mw__loop_thread(ctx)))) {
        mw__free(f);
        return NULL;
    }
    f->ctx = ctx;
    f->refs = 1;
    f->cb_tail = &f->cb_head;
    f->task.fn = run_callbacks;
    mw__list_add_tail(&ctx->futures, &f->link);
    ctx->stats.futures_created++;
    ctx->stats.futures_live++;
    /* Created by a callback during teardown: nothing would ever complete it
     * and the ctx is about to go, so it fails now, while callbacks can run. */
    if (ctx->closing)
        abort_future(f, -ECANCELED, "context closed");
    return handle_of(f);
}

static void future_ref(struct mw__future *f)
{
    f->refs++;
}

mw_future_t *mw_future_ref(mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f) {
        errno = -err;
        return NULL;
    }
    future_ref(f);
    return h;
}

static void drop_callbacks(struct mw__future *f)
{
    size_t n = 0;
    for (struct mw__cb *c = f->cb_head, *next; c; c = next) {
        next = c->next;
        if (c->heap)
            mw__free(c);
        n++;
    }
    f->cb_head = NULL;
    f->cb_tail = &f->cb_head;
    /* Callbacks hold references: only unrefs beyond those taken (a
     * caller's bug) free a future that still has some. */
    if (n && f->ctx)
        MW_LOG(f->ctx, MW_LOG_ERROR, "future freed by an unref it did not hold: %zu "
               "callbacks dropped", n);
}

static void future_unref(struct mw__future *f)
{
    if (--f->refs > 0)
        return;
    mw__handle_release(f->h);     /* from here on, a further unref is refused */
    drop_callbacks(f);
    if (f->ctx)
        mw__defer_cancel(f->ctx, &f->task);   /* queued: only after an unref too many */
    if (f->timer)
        event_free(f->timer);
    mw__free(f->msg);
    /* A detached future must not touch the ctx: it has been freed. */
    if (f->ctx) {
        mw__list_del(&f->link);
        f->ctx->stats.futures_live--;
    }
    mw__free(f);
}

int mw_future_unref(mw_future_t *h)
{
    int err;
    if (!h)
        return 0;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    future_unref(f);
    return 0;
}

/* ------------------------------------------------------------------------
 * Completion
 * ------------------------------------------------------------------------ */

static void schedule(struct mw__future *f)
{
    if (f->task.queued || !f->ctx)
        return;
    future_ref(f);
    mw__defer(f->ctx, &f->task);
}

/* Common tail of every completion: the deadline and the cancel hook no
 * longer apply, and callbacks already registered become due. */
static void finish(struct mw__future *f, int state)
{
    f->state = state;
    f->cancel_fn = NULL;
    f->cancel_arg = NULL;
    if (f->timer) {
        event_free(f->timer);
        f->timer = NULL;
    }
    if (f->cb_head)
        schedule(f);
}

int mw_future_resolve(mw_future_t *h, void *value)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    if (f->state != MW_FUTURE_PENDING)
        return -EALREADY;
    if (f->aborting) {            /* whatever the operation did: it was stopped */
        finish(f, MW_FUTURE_FAILED);
        return 0;
    }
    f->value = value;
    finish(f, MW_FUTURE_DONE);
    return 0;
}

static void record_failure(struct mw__future *f, int err, const char *fmt, va_list ap)
{
    f->err = err;
    /* On out of memory the message falls back to the errno's name rather
     * than a truncated or missing text. */
    if (!fmt)
        return;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n >= 0 && (f->msg = mw__malloc((size_t)n + 1)))
        vsnprintf(f->msg, (size_t)n + 1, fmt, again);
    va_end(again);
}

static int fail_v(struct mw__future *f, int err, const char *fmt, va_list ap)
{
    if (err >= 0)
        return -EINVAL;
    if (f->state != MW_FUTURE_PENDING)
        return -EALREADY;
    if (!f->aborting)             /* else the cancel or deadline is the reason */
        record_failure(f, err, fmt, ap);
    finish(f, MW_FUTURE_FAILED);
    return 0;
}

int mw_future_fail(mw_future_t *h, int err, const char *fmt, ...)
{
    int herr;
    struct mw__future *f = future_of(h, __func__, &herr);
    if (!f)
        return herr;
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_v(f, err, fmt, ap);
    va_end(ap);
    return rc;
}

/* Fail @f on behalf of someone other than its operation (cancel, timeout,
 * teardown).  Without a cancel hook it fails now.  With one, the failure
 * is recorded and the hook told: the operation stops and completes @f
 * (any completion then fails it with the recorded error) once it has let
 * go of everything the caller lent it. */
static int abort_future(struct mw__future *f, int err, const char *fmt, ...)
{
    if (f->state != MW_FUTURE_PENDING || f->aborting)
        return -EALREADY;
    void (*hook)(mw_future_t *, void *) = f->cancel_fn;
    void *hook_arg = f->cancel_arg;
    va_list ap;
    va_start(ap, fmt);
    record_failure(f, err, fmt, ap);
    va_end(ap);
    if (!hook) {
        finish(f, MW_FUTURE_FAILED);
        return 0;
    }
    f->aborting = true;
    f->cancel_fn = NULL;
    f->cancel_arg = NULL;
    hook(handle_of(f), hook_arg);
    return 0;
}

int mw_future_cancel(mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    if (f->state != MW_FUTURE_PENDING)
        return -EALREADY;
    /* The hook may drop the operation's reference, possibly the last. */
    future_ref(f);
    int rc = abort_future(f, -ECANCELED, "cancelled");
    future_unref(f);
    return rc;
}

void mw__future_on_cancel(mw_future_t *h, void (*fn)(mw_future_t *f, void *arg), void *arg)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    /* A complete future will never be cancelled: a hook would never run. */
    if (!f || f->state != MW_FUTURE_PENDING)
        return;
    f->cancel_fn = fn;
    f->cancel_arg = arg;
}

/* ------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------ */

int mw_future_state(const mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    return f ? f->state : err;
}

int mw_future_error(const mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    return f->state == MW_FUTURE_FAILED ? f->err : 0;
}

const char *mw_future_message(const mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return h ? mw_strerror(err) : "";
    if (f->state != MW_FUTURE_FAILED)
        return "";
    return f->msg ? f->msg : mw_strerror(f->err);
}

void *mw_future_value(const mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f) {
        errno = -err;
        return NULL;
    }
    return f->state == MW_FUTURE_DONE ? f->value : NULL;
}

/* ------------------------------------------------------------------------
 * Callbacks
 * ------------------------------------------------------------------------ */

static void run_callbacks(struct mw__task *t)
{
    struct mw__future *f = mw__container_of(t, struct mw__future, task);
    /* Detach the list first: callbacks registered from inside these ones
     * queue the task again and run on a later turn, after these. */
    struct mw__cb *c = f->cb_head;
    f->cb_head = NULL;
    f->cb_tail = &f->cb_head;
    while (c) {
        /* An embedded node may be freed or reused by its own callback. */
        struct mw__cb *next = c->next;
        bool heap = c->heap;
        c->fn(handle_of(f), c->arg);
        if (heap)
            mw__free(c);
        c = next;
        future_unref(f);          /* the reference that callback held */
    }
    future_unref(f); /* the reference schedule() took */
}

static void add_callback(struct mw__future *f, struct mw__cb *c)
{
    future_ref(f);                /* until the callback has run */
    c->next = NULL;
    *f->cb_tail = c;
    f->cb_tail = &c->next;
    if (f->state != MW_FUTURE_PENDING)
        schedule(f);
}

int mw_future_then(mw_future_t *h, mw_then_fn cb, void *arg)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    if (!cb)
        return -EINVAL;
    if (!f->ctx)
        return -ESHUTDOWN;
    struct mw__cb *c = mw__malloc(sizeof *c);
    if (!c)
        return -ENOMEM;
    *c = (struct mw__cb){.fn = cb, .arg = arg, .heap = true};
    add_callback(f, c);
    return 0;
}

int mw__future_then_in(mw_future_t *h, struct mw__cb *c, mw_then_fn cb, void *arg)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    if (!f->ctx)
        return -ESHUTDOWN;
    *c = (struct mw__cb){.fn = cb, .arg = arg};
    add_callback(f, c);
    return 0;
}

/* ------------------------------------------------------------------------
 * Chain: R = "f, then the future fn returns"
 * ------------------------------------------------------------------------ */

struct chain {
    struct mw__cb cb;             /* waits on f, then on g */
    mw_future_t *r;               /* the result; a reference */
    mw_future_t *g;               /* the second step once started; a reference */
    mw_chain_fn fn;
    void *arg;
};

static void chain_release(struct chain *c)
{
    mw_future_unref(c->g);
    mw_future_unref(c->r);
    mw__free(c);
}

/* R cancelled or timed out: stop the step the chain owns, and fail R once
 * that step has (it may hold the caller's memory); before the step started,
 * at once.  The caller's f is left alone; when it completes, the chain
 * just ends. */
static void chain_on_cancel(mw_future_t *r, void *arg)
{
    struct chain *c = arg;
    if (c->g)
        mw_future_cancel(c->g);   /* chain_on_second completes R */
    else
        mw_future_fail(r, -ECANCELED, "cancelled");   /* the recorded error wins */
}

static void chain_on_second(mw_future_t *g, void *arg)
{
    struct chain *c = arg;
    if (mw_future_state(g) == MW_FUTURE_DONE)
        mw_future_resolve(c->r, mw_future_value(g));
    else
        mw_future_fail(c->r, mw_future_error(g), "%s", mw_future_message(g));
    chain_release(c);
}

static void chain_wait_second(struct chain *c)
{
    int err;
    struct mw__future *g = future_of(c->g, "mw_future_chain step", &err);
    if (!g) {
        c->g = NULL;              /* refused: not a reference we can drop */
        mw_future_fail(c->r, err, "chain step returned an invalid future");
        chain_release(c);
    } else if (!g->ctx) {
        mw_future_fail(c->r, -ESHUTDOWN, "chain step returned a detached future");
        chain_release(c);
    } else {
        /* f's list let go of the node before this call: reuse it */
        c->cb.fn = chain_on_second;
        add_callback(g, &c->cb);
    }
}

static void chain_on_first(mw_future_t *f, void *arg)
{
    struct chain *c = arg;
    if (mw_future_state(c->r) != MW_FUTURE_PENDING) {
        chain_release(c); /* R was cancelled: don't start the next step */
    } else if (mw_future_state(f) == MW_FUTURE_FAILED) {
        mw_future_fail(c->r, mw_future_error(f), "%s", mw_future_message(f));
        chain_release(c);
    } else if (!(c->g = c->fn(f, c->arg))) {
        mw_future_fail(c->r, -ECANCELED, "chain step returned no future");
        chain_release(c);
    } else {
        chain_wait_second(c);
    }
}

mw_future_t *mw_future_chain(mw_future_t *h, mw_chain_fn fn, void *arg)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f || !fn || !f->ctx) {
        errno = !f ? -err : !fn ? EINVAL : ESHUTDOWN;
        return NULL;
    }
    struct chain *c = mw__calloc(1, sizeof *c);
    mw_future_t *r = mw_future_new(f->ctx);
    if (!c || !r) {
        mw__free(c);
        mw_future_unref(r);
        return NULL;
    }
    c->r = mw_future_ref(r);
    c->fn = fn;
    c->arg = arg;
    c->cb = (struct mw__cb){.fn = chain_on_first, .arg = c};
    mw__future_on_cancel(r, chain_on_cancel, c);
    add_callback(f, &c->cb);
    return r;
}

/* ------------------------------------------------------------------------
 * All: done when every member is, failed by the first failure
 * ------------------------------------------------------------------------ */

struct all_member {
    struct mw__cb cb;
    struct all *all;
    size_t index;
};

struct all {
    mw_future_t *r;               /* the result; a reference */
    size_t n;
    size_t left;                  /* members not yet done */
    size_t live;                  /* members whose callback has not run */
    struct all_member m[];
};

static void all_on_member(mw_future_t *f, void *arg)
{
    struct all_member *m = arg;
    struct all *a = m->all;
    if (mw_future_state(f) == MW_FUTURE_FAILED)
        /* 1-based, as a person counts; -EALREADY after the first failure */
        mw_future_fail(a->r, mw_future_error(f), "future %zu of %zu: %s",
                       m->index + 1, a->n, mw_future_message(f));
    else if (--a->left == 0)
        mw_future_resolve(a->r, NULL);
    if (--a->live == 0) {
        mw_future_unref(a->r);
        mw__free(a);
    }
}

/* Every member a live future of @ctx: else errno says why. */
static bool all_members_valid(mw_ctx_t *ctx, mw_future_t *const *fs, size_t n)
{
    int err;
    for (size_t i = 0; i < n; i++) {
        struct mw__future *f = future_of(fs[i], "mw_future_all", &err);
        if (!f || f->ctx != ctx) {
            errno = f ? EINVAL : -err;
            return false;
        }
    }
    return true;
}

mw_future_t *mw_future_all(mw_ctx_t *ctx, mw_future_t *const *fs, size_t n)
{
    if (!ctx || (n && !fs)) {
        errno = EINVAL;
        return NULL;
    }
    if (!all_members_valid(ctx, fs, n))
        return NULL;
    mw_future_t *r = mw_future_new(ctx);
    if (!r)
        return NULL;
    if (n == 0) {
        mw_future_resolve(r, NULL); /* callbacks still wait for the loop */
        return r;
    }
    struct all *a = mw__calloc(1, sizeof *a + n * sizeof a->m[0]);
    if (!a) {
        mw_future_unref(r);
        return NULL;
    }
    *a = (struct all){.r = mw_future_ref(r), .n = n, .left = n, .live = n};
    /* Everything is allocated: registering below cannot fail halfway. */
    for (size_t i = 0; i < n; i++) {
        struct all_member *m = &a->m[i];
        int err;
        struct mw__future *f = future_of(fs[i], __func__, &err); /* checked above */
        *m = (struct all_member){.all = a, .index = i};
        m->cb = (struct mw__cb){.fn = all_on_member, .arg = m};
        add_callback(f, &m->cb);
    }
    return r;
}

/* ------------------------------------------------------------------------
 * Timeouts
 * ------------------------------------------------------------------------ */

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct mw__future *f = arg;
    (void)fd;
    (void)what;
    /* Completing frees this timer (fine from its own callback); the cancel
     * hook may drop the operation's reference, possibly the last. */
    future_ref(f);
    abort_future(f, -ETIMEDOUT, "timed out after %u ms", f->timeout_ms);
    future_unref(f);
}

int mw_future_set_timeout(mw_future_t *h, unsigned ms)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    if (!f->ctx)
        return -ESHUTDOWN;
    if (f->state != MW_FUTURE_PENDING)
        return -EALREADY;
    if (!f->timer && !(f->timer = evtimer_new(f->ctx->base, on_timeout, f)))
        return -ENOMEM;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    if (mw__ev_add(f->ctx, f->timer, &tv) < 0)
        return -ENOMEM;
    f->timeout_ms = ms;
    return 0;
}

/* ------------------------------------------------------------------------
 * Waiting
 * ------------------------------------------------------------------------ */

int mw_wait(mw_future_t *h)
{
    int err;
    struct mw__future *f = future_of(h, __func__, &err);
    if (!f)
        return err;
    mw_ctx_t *ctx = f->ctx;
    if (!ctx)
        return -ESHUTDOWN;
    /* Running the loop from inside one of its callbacks would re-enter it. */
    if (ctx->in_callback > 0)
        return -EDEADLK;
    int rc = 0;
    future_ref(f);
    while (f->state == MW_FUTURE_PENDING) {
        int r = event_base_loop(ctx->base, EVLOOP_ONCE);
        if (r == 1 && f->state == MW_FUTURE_PENDING) {
            /* Nothing is registered that could ever complete it. */
            rc = -EDEADLK;
            break;
        }
        if (r < 0) {
            /* The base is already running: called from a caller's event. */
            rc = -EDEADLK;
            break;
        }
    }
    if (rc == 0 && f->state == MW_FUTURE_FAILED)
        rc = f->err;
    future_unref(f);
    return rc;
}

/* ------------------------------------------------------------------------
 * Teardown
 * ------------------------------------------------------------------------ */

void mw__future_fail_all(mw_ctx_t *ctx)
{
    /* Cancel hooks may free futures (an operation dropping its reference)
     * and so may unlink any entry: work from a private list, moving each
     * future back before touching it, so the walk never holds a pointer to
     * a freed node. */
    struct mw__list todo;
    mw__list_init(&todo);
    mw__list_move_all(&todo, &ctx->futures);
    while (!mw__list_empty(&todo)) {
        struct mw__future *f = mw__container_of(todo.next, struct mw__future, link);
        mw__list_del(&f->link);
        mw__list_add_tail(&ctx->futures, &f->link);
        if (f->state != MW_FUTURE_PENDING)
            continue;
        future_ref(f);
        abort_future(f, -ECANCELED, "context closed");
        /* A hook waiting for its operation: the layers above are gone
         * already, their queue pairs with them, so nothing will. */
        if (f->state == MW_FUTURE_PENDING)
            finish(f, MW_FUTURE_FAILED);
        future_unref(f);
    }
}

void mw__future_detach_all(mw_ctx_t *ctx)
{
    size_t n = 0;
    while (!mw__list_empty(&ctx->futures)) {
        struct mw__future *f = mw__container_of(ctx->futures.next, struct mw__future, link);
        mw__list_del(&f->link);
        /* Every future is complete by now (so it has no timer), but a timer
         * must never outlive the base it was made on. */
        if (f->timer) {
            event_free(f->timer);
            f->timer = NULL;
        }
        f->ctx = NULL;
        n++;
    }
    if (n)
        MW_LOG(ctx, MW_LOG_DEBUG, "%zu futures still referenced at teardown", n);
}
