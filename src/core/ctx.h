/* The context: the loop it runs on, deferred work, logs and counters.
 * Internal to the library (mw__ names). */
#ifndef MW_CORE_CTX_H
#define MW_CORE_CTX_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

#include "meshwire.h"
#include "core/list.h"

struct event;
struct mw__devs;
struct mw__ops;
struct mw__loop;
struct mw__worker;

/* A unit of work to run from the loop (never inside the call that queues
 * it).  Embedded in the object it belongs to; queued at most once. */
struct mw__task {
    void (*fn)(struct mw__task *t);
    struct mw__task *next;
    uint64_t pass;                /* the run of the queue it belongs to */
    bool queued;
};

struct mw__dev;
struct ibv_async_event;
struct mw__metrics;

/* Layers above core keep their per-context state here, in a slot of their
 * own (the lowest layer has the lowest slot), and are torn down first,
 * highest slot first: a layer goes before the ones it is built on.  Core
 * calls them only through these hooks: it knows no layer by name.
 * Numbered here, all in one place, so that the order is seen whole. */
enum mw__layer_slot {
    MW__LAYER_MEM,                /* registered memory (src/mem) */
    MW__LAYER_CM,                 /* connections (cm.c) */
    MW__LAYER_COLL,               /* communicators not yet freed, so that
                                     the context's teardown frees them too */
    MW__LAYER_DIR,                /* directories (dir.c) */
    MW__LAYERS
};

struct mw__layer {
    void *state;
    void (*teardown)(mw_ctx_t *ctx, void *state);
    /* A device reported trouble: an asynchronous event @ev (a queue pair's
     * fatal error, a port gone down...), or, with @ev NULL, a failure that
     * leaves the device unusable for what uses it (its completion queue
     * broke); @why describes it.  Optional. */
    void (*device_event)(mw_ctx_t *ctx, void *state, struct mw__dev *dev,
                         const struct ibv_async_event *ev, const char *why);
    /* A device opened (off the loop, with its memory registered) became
     * usable (@err 0) or could not be.  Optional. */
    void (*device_ready)(mw_ctx_t *ctx, void *state, struct mw__dev *dev, int err);
    /* A device was opened: take it in before anything can use it (the
     * memory layer registers what exists with it).  Return 0, 1 when that
     * finishes later -- mw__dev_ready() then follows; at most one layer may
     * answer so (today only the memory layer takes devices in) -- or a
     * negative errno, leaving nothing of the layer's on the device (the
     * layers asked before it, lowest slot first, are told device_close).
     * Optional. */
    int (*device_open)(mw_ctx_t *ctx, void *state, struct mw__dev *dev);
    /* The device is going away (removed, or unusable): drop what the layer
     * holds on it, before its protection domain goes.  Optional. */
    void (*device_close)(mw_ctx_t *ctx, void *state, struct mw__dev *dev);
    /* Late in mw_ctx_free(), once pending work has failed, its callbacks
     * ran and the helper thread stopped, before the devices close: the
     * layer lets go of what it holds on them (registrations), highest slot
     * first.  Optional. */
    void (*release)(mw_ctx_t *ctx, void *state);
    /* mw_ctx_metrics(): write the layer's families (core/metrics.h).
     * Optional. */
    void (*metrics)(mw_ctx_t *ctx, void *state, struct mw__metrics *m);
};

struct mw_ctx {
    struct event_base *base;
    bool own_base;
    mw_ctx_opts_t opts;
    mw_ctx_stats_t stats;

    /* deferred tasks, run FIFO by one libevent event made active on demand */
    struct event *defer_ev;
    struct mw__task *defer_head, **defer_tail;
    uint64_t defer_pass;          /* tasks queued now run in this pass */
    struct timeval turn;          /* the loop turn turn_t0 belongs to (loop.c) */
    uint64_t turn_t0;             /* when meshwire first worked in that turn */
    int in_callback;              /* > 0 while running tasks: mw_wait refuses */
    int in_handler;               /* > 0 while a caller's function runs that
                                     no task runs (MW__CALL_OUT) */

    struct mw__list futures;      /* every live future (pending ones fail at free) */
    struct mw__devs *devs;        /* opened devices: PD + CQ each */
    struct mw__ops *ops;          /* operation records: wr_id -> op */
    struct mw__layer layers[MW__LAYERS];
    struct mw__loop *loop;        /* mw_ctx_fd's epoll set, hand-offs (loop.c) */
    struct mw__worker *worker;    /* the helper thread, once used (worker.c) */
    bool closing;
};

/* loop.c: every descriptor the context watches and every timer it adds go
 * through these, so that mw_ctx_fd() can stand for the whole loop. */
int mw__ev_add(mw_ctx_t *ctx, struct event *ev, const struct timeval *tv);
/* mw__ev_add_ms() - mw__ev_add() with a timeout of @ms milliseconds. */
static inline int mw__ev_add_ms(mw_ctx_t *ctx, struct event *ev, unsigned ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return mw__ev_add(ctx, ev, &tv);
}
int mw__watch_fd(mw_ctx_t *ctx, int fd);
void mw__unwatch_fd(mw_ctx_t *ctx, int fd);
/* mw__watch_fd_out() - whether mw_ctx_fd() also wakes when watched @fd
 * can be written (a socket whose output waits for room). */
void mw__watch_fd_out(mw_ctx_t *ctx, int fd, bool out);
/* mw__on_loop_thread() - is the caller the context's loop thread? */
bool mw__on_loop_thread(const mw_ctx_t *ctx);
/* mw__loop_thread() - that thread as handles record their owner. */
uint64_t mw__loop_thread(const mw_ctx_t *ctx);
/* mw__loop_kick() - after event_active() from outside the loop. */
void mw__loop_kick(mw_ctx_t *ctx);
int mw__loop_new(mw_ctx_t *ctx);
void mw__loop_free(mw_ctx_t *ctx);

/* mw__ctx_new() - core's part of mw_ctx_new(): the loop, the task queue
 * and the operation records, on @base or a base of its own.  The memory
 * layer's mw_ctx_new() (mem/layer.c) makes the context through this and puts
 * itself on it.  Return 0 with *@ctxp set, or a negative errno. */
int mw__ctx_new(mw_ctx_t **ctxp, struct event_base *base, const mw_ctx_opts_t *opts);

/* mw__now_ms() / mw__now_ns() - CLOCK_MONOTONIC. */
uint64_t mw__now_ms(void);
uint64_t mw__now_ns(void);

/* The work budget of a loop turn.  Under soft-RoCE a post runs rxe's send
 * engine inside ibv_post_send (about 30 ms per MiB in a VM), and reducing
 * a received chunk, or what a completion sets off, costs milliseconds: work
 * that one turn does is time the loop runs nothing else.  Code that works
 * in loops (posting, draining a CQ, reducing) asks mw__turn_may() before
 * each piece; a turn works for about MW__TURN_NS from its first piece, and
 * what is left waits for a later turn (each such loop arranges to be called
 * again).  On hardware these pieces cost microseconds and the budget
 * rarely binds.
 * The budget goes by CLOCK_MONOTONIC_COARSE: read from memory the kernel
 * updates every tick, never from the hardware clock, so asking is free even
 * where CLOCK_MONOTONIC is a system call and a clock device read (a VM on
 * HPET: 0.74 us a reading, six per message before).  A turn then ends
 * MW__TURN_NS after the tick before its first piece: within one tick (1-4
 * ms) of the budget either way. */
#define MW__TURN_NS 4000000u
bool mw__turn_may(mw_ctx_t *ctx);

/* A zero timeout: "on the next loop turn, after I/O". */
extern const struct timeval mw__zero_tv;

/* MW__CALL_OUT() - call a caller's function that the loop runs outside
 * the task queue (an accept, immediate or posted function): @call runs
 * with ctx->in_handler raised, so that mw_ctx_free() from inside it is
 * refused, as from a task. */
#define MW__CALL_OUT(ctx, call)                                   \
    do {                                                          \
        mw_ctx_t *call_out_ctx_ = (ctx);                          \
        call_out_ctx_->in_handler++;                              \
        call;                                                     \
        call_out_ctx_->in_handler--;                              \
    } while (0)

/* mw__defer() - run t->fn(t) from the loop, after what is already queued. */
void mw__defer(mw_ctx_t *ctx, struct mw__task *t);

/* mw__defer_cancel() - unqueue @t (its owner is going away). */
void mw__defer_cancel(mw_ctx_t *ctx, struct mw__task *t);

/* mw__run_deferred() - run every queued task now (the loop does this; the
 * context's teardown too). */
void mw__run_deferred(mw_ctx_t *ctx);

/* Logging: MW_LOG(ctx, MW_LOG_WARN, "fmt", ...). */
void mw__log(const mw_ctx_t *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mw__vlog(const mw_ctx_t *ctx, int level, const char *fmt, va_list ap);
#define MW_LOG(ctx, level, ...)                                   \
    do {                                                          \
        if ((level) <= (ctx)->opts.log_level)                     \
            mw__log((ctx), (level), __VA_ARGS__);                 \
    } while (0)

/* mw__log_level_from_env() - MW_LOG's level, or @dflt when unset/unknown. */
int mw__log_level_from_env(int dflt);

#endif
