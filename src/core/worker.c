/* The helper thread: a queue in, a queue out, an eventfd back to the loop. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/thread.h"
#include "core/worker.h"

struct mw__worker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t idle;                 /* signalled when todo empties */
    bool busy;                           /* a job is running (under lock) */
    struct mw__job *todo, **todo_tail;   /* under lock */
    struct mw__job *done, **done_tail;   /* under lock */
    bool stop;                           /* under lock */
    int efd;                             /* done jobs waiting: readable */
    struct event *ev;
};

static void push(struct mw__job ***tail, struct mw__job *j)
{
    j->next = NULL;
    **tail = j;
    *tail = &j->next;
}

static struct mw__job *take_all(struct mw__job **head, struct mw__job ***tail)
{
    struct mw__job *j = *head;
    *head = NULL;
    *tail = head;
    return j;
}

static void *run(void *arg)
{
    struct mw__worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->todo && !w->stop)
            pthread_cond_wait(&w->wake, &w->lock);
        struct mw__job *j = w->todo;
        if (!j)
            break;                       /* stopping, and nothing left */
        w->todo = j->next;
        if (!w->todo)
            w->todo_tail = &w->todo;
        w->busy = true;
        pthread_mutex_unlock(&w->lock);
        j->work(j);
        pthread_mutex_lock(&w->lock);
        w->busy = false;
        if (!w->todo)
            pthread_cond_broadcast(&w->idle);
        push(&w->done_tail, j);
        uint64_t one = 1;
        (void)!write(w->efd, &one, sizeof one);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static void run_done(struct mw__worker *w)
{
    uint64_t n;
    (void)!read(w->efd, &n, sizeof n);
    pthread_mutex_lock(&w->lock);
    struct mw__job *j = take_all(&w->done, &w->done_tail);
    pthread_mutex_unlock(&w->lock);
    while (j) {
        struct mw__job *next = j->next;
        j->done(j);
        j = next;
    }
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    run_done(arg);
}

static int worker_start(mw_ctx_t *ctx)
{
    struct mw__worker *w = mw__calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->todo_tail = &w->todo;
    w->done_tail = &w->done;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->idle, NULL);
    int rc = -ENOMEM;
    if ((w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = -errno;
        goto fail;
    }
    if (!(w->ev = event_new(ctx->base, w->efd, EV_READ | EV_PERSIST, on_done, w)) ||
        event_add(w->ev, NULL) < 0 || (rc = mw__watch_fd(ctx, w->efd)) < 0)
        goto fail;
    if ((rc = mw__thread_start(&w->thread, false, run, w)) < 0) {
        mw__unwatch_fd(ctx, w->efd);
        goto fail;
    }
    ctx->worker = w;
    return 0;
fail:
    if (w->ev)
        event_free(w->ev);
    if (w->efd >= 0)
        close(w->efd);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->idle);
    pthread_mutex_destroy(&w->lock);
    mw__free(w);
    return rc;
}

int mw__worker_submit(mw_ctx_t *ctx, struct mw__job *j)
{
    int rc = ctx->worker ? 0 : worker_start(ctx);
    if (rc < 0)
        return rc;
    struct mw__worker *w = ctx->worker;
    pthread_mutex_lock(&w->lock);
    push(&w->todo_tail, j);
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

void mw__worker_flush(mw_ctx_t *ctx)
{
    struct mw__worker *w = ctx->worker;
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    while (w->todo || w->busy)
        pthread_cond_wait(&w->idle, &w->lock);
    pthread_mutex_unlock(&w->lock);
    run_done(w);
}

void mw__worker_free(mw_ctx_t *ctx)
{
    struct mw__worker *w = ctx->worker;
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    run_done(w);                         /* every job is done by now */
    mw__unwatch_fd(ctx, w->efd);
    event_free(w->ev);
    close(w->efd);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->idle);
    pthread_mutex_destroy(&w->lock);
    mw__free(w);
    ctx->worker = NULL;
}
