/*
 * meshwire: an event-driven, asynchronous RDMA transport.
 *
 * Every function returns 0 or a negative errno unless its comment says
 * otherwise; mw_strerror() names the error.  Unless stated, functions are to
 * be called from the thread that runs the context's event loop.
 *
 * Errors at once or through the future.  A function that returns a future
 * returns NULL (errno set) only when it cannot make one: out of memory, a
 * NULL context, or a refused handle (below).  Every other error, bad
 * arguments included (-EINVAL, -ERANGE, -EFAULT...), fails the future it
 * returns, with a message saying what was wrong: handle it where you handle
 * the operation's own failures.  Such a future is failed already when the
 * call returns; its callbacks still run from the loop.
 *
 * Arguments.  Strings, arrays and option structs passed in are read during
 * the call and copied where kept (address lists, peer lists, opts); the
 * caller may free or reuse them when it returns.  Data buffers are the
 * exception: each operation says how long it uses them.
 *
 * Handles.  Futures, connections, listeners, communicators and
 * registrations (mw_reg) are handles, not addresses.  Once released (a
 * future's last unref, mw_conn_close or mw_conn_abort, mw_listener_free,
 * mw_comm_free, mw_dereg, or the context's teardown for what it owns) a
 * handle is refused by every call with -ESTALE (functions returning a
 * pointer: NULL with errno ESTALE) and an error in the log, even after its
 * memory has been reused: a handle value is never issued twice.  A handle of another kind gets -EINVAL; a call from a
 * thread other than the loop's gets -EPERM.  The context itself is a plain
 * pointer: mw_ctx_free() it once.
 */
#ifndef MESHWIRE_H
#define MESHWIRE_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MW_BUILDING)
#define MW_EXTERN __attribute__((visibility("default")))
#else
#define MW_EXTERN
#endif

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

/* ------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------ */

/** Log levels; MW_LOG=error|warn|info|debug in the environment sets the
 *  default threshold (warn when unset). */
enum mw_log_level { MW_LOG_ERROR = 0, MW_LOG_WARN, MW_LOG_INFO, MW_LOG_DEBUG };

/** A log sink: @msg has no trailing newline; called on the loop thread. */
typedef void (*mw_log_fn)(int level, const char *msg, void *arg);

/* ------------------------------------------------------------------------
 * Context: one per event loop; everything hangs off it
 * ------------------------------------------------------------------------ */

typedef struct mw_ctx mw_ctx_t;
typedef struct mw_future mw_future_t;

/** Options for mw_ctx_new(); start from mw_ctx_opts_init(). */
typedef struct mw_ctx_opts {
    int log_level;            /**< threshold; default from MW_LOG, else warn */
    mw_log_fn log_fn;         /**< sink; NULL = stderr */
    void *log_arg;
    unsigned cq_depth;        /**< CQ entries per device; 0 = min(4096, device max) */
    unsigned max_wc_per_turn; /**< completions handled per loop turn before
                                   yielding to other events; 0 = 1024 */
    int threads;              /**< non-zero: accept mw_ctx_post/mw_ctx_call
                                   from other threads (adds a persistent
                                   event, so a libevent loop never runs out
                                   of events); default 0 */
} mw_ctx_opts_t;

/** mw_ctx_opts_init() - fill @opts with the defaults. */
MW_EXTERN void mw_ctx_opts_init(mw_ctx_opts_t *opts);

/**
 * mw_ctx_new() - create a context.
 * @ctxp: receives the context.
 * @base: the caller's libevent base, which the context joins (it adds its
 *        events there and never runs or breaks that loop by itself); NULL to
 *        have the context create and own one.
 * @opts: options, or NULL for the defaults; copied.
 * Return: 0 or a negative errno.  The caller owns the context: mw_ctx_free().
 */
MW_EXTERN int mw_ctx_new(mw_ctx_t **ctxp, struct event_base *base,
                         const mw_ctx_opts_t *opts);

/**
 * mw_ctx_free() - release everything the context created, in order.
 * Futures still pending fail with -ECANCELED and their callbacks run before
 * this returns; futures the caller still holds stay valid until unreferenced.
 * Memory from mw_alloc() must have been freed.  Communicators, connections,
 * listeners and registrations still held are released (a communicator
 * still forming fails -ECANCELED): their handles turn stale.  A caller's
 * base is not freed.  A same-host peer that still holds requests of ours
 * (see "The same-host path" at mw_conn_opts_t) is told to stop, and this
 * waits for its word -- blocking, at most the largest timeout_ms of those
 * connections -- so that no memory is handed back while the peer could
 * still copy into it; past that, those operations fail -EBUSY.
 * From inside one of the context's callbacks -- a future's callback or
 * chain step, an accept, immediate, posted or directory-watch function,
 * whichever loop runs it (mw_ctx_progress, mw_wait, a caller's base) -- it
 * is refused: the loop that called out goes on using the context when the
 * callback returns.  Nothing is freed and an error is logged; free the
 * context once the callback has returned (from your own code, or an event
 * of your own).  (A log sink must not free its context either.)
 * Return: 0 (also for NULL), or -EDEADLK when refused.
 */
MW_EXTERN int mw_ctx_free(mw_ctx_t *ctx);

/** mw_ctx_base() - the event base the context runs on (not owned). */
MW_EXTERN struct event_base *mw_ctx_base(mw_ctx_t *ctx);

/** Counters of a context (monotonic since mw_ctx_new()). */
typedef struct mw_ctx_stats {
    uint64_t events;          /**< completion-channel wake-ups handled */
    uint64_t polls;           /**< ibv_poll_cq calls */
    uint64_t completions;     /**< work completions reaped */
    uint64_t completion_errors; /**< of which failed: a status other than
                                   success or flush (the device, the peer or
                                   the link reported an error) */
    uint64_t stray_completions; /**< of which for an operation already
                                   released, dropped: mostly flushes of a
                                   queue pair torn down (below) */
    uint64_t registrations;   /**< ibv_reg_mr calls */
    uint64_t deregistrations; /**< ibv_dereg_mr calls */
    uint64_t reg_cache_hits;  /**< mw_reg() served by an existing registration */
    uint64_t futures_created;
    uint64_t futures_live;    /**< allocated and not yet released */
    uint64_t protocol_errors; /**< connections failed for what a peer sent
                                   (malformed fragments, credits never given) */
    uint64_t devices;         /**< devices opened (a protection domain each,
                                   and one per connection on them) */
    uint64_t flushes;         /**< completions that are flushes: work posted
                                   on a queue pair that then closed or failed,
                                   returned unexecuted.  Expected, not errors:
                                   every close flushes the receives it had
                                   posted, and so does every connect attempt
                                   a peer refuses (a communicator's ranks
                                   retry while the others start). */
    uint64_t local_connections; /**< connections established on the
                                   same-host path (mw_conn_opts_t.transport) */
} mw_ctx_stats_t;

/** mw_ctx_stats() - copy the context's counters into @out. */
MW_EXTERN void mw_ctx_stats(const mw_ctx_t *ctx, mw_ctx_stats_t *out);

/** mw_ctx_metrics() - the context's counters, those of its established
 *  connections (labelled local, remote, device, path) and of its
 *  communicators (labelled comm_job: the job as hashed, hex; rank), in Prometheus's
 *  text exposition format (0.0.4): counters end in _total, every family
 *  has its HELP and TYPE.  Written into @buf, at most @cap bytes,
 *  NUL-terminated when @cap > 0 (a text cut short ends mid-line: call
 *  again with room for it all).  A scrape handler's call, from the loop's
 *  thread.  Return: the whole text's length (as snprintf), -EINVAL (NULL
 *  @ctx, or NULL @buf with @cap). */
MW_EXTERN long mw_ctx_metrics(mw_ctx_t *ctx, char *buf, size_t cap);

/*
 * Loops other than libevent (epoll, libuv, glib, asyncio...).  A context
 * that owns its base (created with base NULL) offers one descriptor that
 * stands for all of its work:
 *
 *     int fd = mw_ctx_fd(ctx);              // add to your loop, for reading
 *     ...whenever fd is readable:
 *     mw_ctx_progress(ctx);                 // runs what is due, never blocks
 *
 * The descriptor is readable exactly when mw_ctx_progress() has something
 * to do: a completion or a connection event arrived, a deadline passed (of
 * any timer, whenever it was set; signalled once libevent's coarse clock
 * has passed it too: up to a tick, 4 ms at 250 Hz, plus 1 ms late),
 * another thread handed work over, or
 * callbacks became due -- also those made due by your own calls outside
 * meshwire's callbacks (mw_future_then() on a future already complete, a
 * failed operation's future), so nothing needs a progress call "just in
 * case".  It is level-triggered: one call may leave work for the next turn
 * (it bounds what it runs, so it cannot starve your loop), and then the
 * descriptor stays readable.  The bound is time: posting, draining
 * completions and reducing stop after about 4 ms of work a turn, large
 * registrations run on a helper thread, one connection event is handled a
 * turn; on soft-RoCE in a 2-vCPU VM single calls stay around 5-30 ms (the
 * README's "Loop stalls" has the figures).  When it is not readable, meshwire has
 * nothing to do until something arrives: sleep.  (On a caller's libevent
 * base, run that base instead: mw_ctx_fd() returns -EINVAL there.)
 */
/** mw_ctx_fd() - the descriptor (owned by the context; do not close it), or
 *  a negative errno.  It may be asked for at any time; the same one is
 *  returned every time. */
MW_EXTERN int mw_ctx_fd(mw_ctx_t *ctx);
/** mw_ctx_progress() - do the work that is due without blocking: 0, or
 *  -EINVAL (not an own base), -EDEADLK (from inside a callback). */
MW_EXTERN int mw_ctx_progress(mw_ctx_t *ctx);

/*
 * Threads.  A context and everything made from it belong to the thread that
 * created it and runs its loop (the loop thread).  From any other thread
 * only these are safe (besides the functions documented "Thread-safe"):
 * they hand work to the loop thread through an eventfd, waking it.  An
 * operation started from another thread is refused: every function that
 * returns a future returns NULL (errno EPERM) and logs an error.
 * Join the threads that use them before mw_ctx_free().
 *
 * fork().  A process may fork (a worker pool, system()) while transfers
 * run: on kernels that copy pinned pages into the child at fork (Linux
 * 5.x and later; Debian 12's 6.1) the parent's registered memory stays the
 * memory the device uses, and a child sees a copy it may use for anything
 * but meshwire (a child cannot use its parent's contexts).  On older
 * kernels the first mw_ctx_new() turns on libibverbs' fork support, and
 * registered memory (mw_alloc, mw_reg) is then absent in children.
 */
/** A function to run on the loop thread. */
typedef void (*mw_task_fn)(mw_ctx_t *ctx, void *arg);
/** mw_ctx_post() - run @fn(@ctx, @arg) on the loop thread soon, in the order
 *  posted.  Thread-safe.  Return: 0, -EINVAL, -ENOMEM, or -ENOTSUP when the
 *  context was not created with opts.threads. */
MW_EXTERN int mw_ctx_post(mw_ctx_t *ctx, mw_task_fn fn, void *arg);
/** Starts an operation on the loop thread and returns its future (the
 *  reference passes to meshwire), or NULL when out of memory. */
typedef mw_future_t *(*mw_start_fn)(mw_ctx_t *ctx, void *arg);
/**
 * mw_ctx_call() - run @fn on the loop thread and wait, on this thread, until
 * the future it returns completes.  Thread-safe, but never on the loop
 * thread itself (-EDEADLK: nobody would run the loop).
 * @value: receives the future's value when done (may be NULL).
 * Return: 0 when the future was done, else its error.
 */
MW_EXTERN int mw_ctx_call(mw_ctx_t *ctx, mw_start_fn fn, void *arg, void **value);

/* ------------------------------------------------------------------------
 * Futures: the result of one operation, completed on the loop
 * ------------------------------------------------------------------------
 * A future is pending, then done (with a value) or failed (with a negative
 * errno and a message).  It is reference counted: whoever receives one from
 * a function owns one reference and drops it with mw_future_unref().
 * Callbacks never run inside the call that registers them, nor inside the
 * call that completes the future: always later, from the context's loop, in
 * the order they became due.  Futures belong to the loop thread.
 *
 * A registered callback holds a reference on its future until it has run,
 * and runs exactly once: when the future completes or, for a future nobody
 * is left to complete, at mw_ctx_free() (failed -ECANCELED).  So a
 * caller that only wants the callback lets go at once:
 *
 *     mw_future_t *f = mw_send(c, buf, n);
 *     mw_future_then(f, on_sent, arg);
 *     mw_future_unref(f);          // on_sent still runs, f lives until then
 *
 * A callback may unref the future it is given when it holds a reference to
 * drop (one its registrant handed over): the future stays valid until the
 * callback returns.
 */

enum mw_future_state { MW_FUTURE_PENDING = 0, MW_FUTURE_DONE, MW_FUTURE_FAILED };

/** Called once @f is done or failed. @f is borrowed for the call. */
typedef void (*mw_then_fn)(mw_future_t *f, void *arg);

/** Called once @f is done; returns the next future (its reference passes to
 *  the chain) or NULL to fail the chain with -ECANCELED. @f is borrowed. */
typedef mw_future_t *(*mw_chain_fn)(mw_future_t *f, void *arg);

/** mw_future_new() - a pending future that the caller completes
 *  (mw_future_resolve/mw_future_fail).  NULL when out of memory (or off
 *  the loop thread, errno EPERM: see "Threads"). */
MW_EXTERN mw_future_t *mw_future_new(mw_ctx_t *ctx);

/** mw_future_ref() / mw_future_unref() - take / drop a reference; the last
 *  unref frees it.  Unref of NULL does nothing (0).  Unref of a future
 *  already freed returns -ESTALE (a double unref is refused).  One unref too
 *  many while others still hold references frees it early: meshwire cannot
 *  tell whose reference it was, so the other holders' later calls (the
 *  operation's completion among them) get -ESTALE.  ref returns @f, or NULL
 *  (errno) for a handle it refuses. */
MW_EXTERN mw_future_t *mw_future_ref(mw_future_t *f);
MW_EXTERN int mw_future_unref(mw_future_t *f);

/** mw_future_resolve() - complete @f with @value (not owned by the future).
 *  Return: 0, or -EALREADY when @f was already complete. */
MW_EXTERN int mw_future_resolve(mw_future_t *f, void *value);

/** mw_future_fail() - fail @f with @err (negative errno) and a printf-style
 *  message.  Return: 0, -EINVAL for err >= 0, -EALREADY if complete. */
MW_EXTERN int mw_future_fail(mw_future_t *f, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** State, error (0 unless failed), message ("" unless failed), value.  On a
 *  refused handle: state and error return the refusal (-ESTALE...), the
 *  message describes it, value is NULL with errno set. */
MW_EXTERN int mw_future_state(const mw_future_t *f);
MW_EXTERN int mw_future_error(const mw_future_t *f);
MW_EXTERN const char *mw_future_message(const mw_future_t *f);
MW_EXTERN void *mw_future_value(const mw_future_t *f);

/** mw_future_then() - call @cb(f, arg) from the loop once @f completes
 *  (soon, if it already has).  Return: 0, -ENOMEM, or -ESHUTDOWN when the
 *  context is gone. */
MW_EXTERN int mw_future_then(mw_future_t *f, mw_then_fn cb, void *arg);

/** mw_future_chain() - a future for "@f, then the future @fn returns".
 *  If @f fails, @fn is not called and the result fails the same way.  The
 *  chain takes its own reference on @f: the caller's stays the caller's.
 *  Cancelling the result cancels the step @fn returned, if it started;
 *  @f itself is left alone.
 *  Return: the new future (caller owns it), or NULL when out of memory. */
MW_EXTERN mw_future_t *mw_future_chain(mw_future_t *f, mw_chain_fn fn, void *arg);

/** mw_future_all() - done when all @n futures are done (value NULL); fails as
 *  soon as one fails, with its error.  @fs stay the caller's.  n == 0 gives
 *  a future done at once.  NULL when out of memory or @fs is NULL with n > 0. */
MW_EXTERN mw_future_t *mw_future_all(mw_ctx_t *ctx, mw_future_t *const *fs, size_t n);

/*
 * Deadlines and cancels stop the operation.  When a future's deadline
 * passes, or it is cancelled, the operation behind it stops, and the
 * future fails (-ETIMEDOUT, -ECANCELED) once the library and the device
 * are done with everything the caller lent the operation: from the moment
 * it fails, the caller's buffers are the caller's again (free them, reuse
 * them).  For most operations that moment is at once; for a one-sided
 * transfer or a collective with work on the wire, it is when that work
 * comes back (microseconds to milliseconds; at most the connection's
 * retry time when the peer is gone; on the same-host path, when the peer's
 * loop answers: abort the connection to bound that, see mw_conn_opts_t).
 * Each operation says what stopping means for it:
 *   mw_recv        leaves the queue of receives: the next message goes to
 *                  the next receive, none is lost.
 *   mw_send        nothing of it sent: it never will be.  Part of it sent:
 *                  the rest is not, and the peer drops what it has of it
 *                  (never delivered half).  All of it handed to the device:
 *                  it may still arrive.  Its buffer is free at once.
 *   mw_write/mw_read/mw_write_imm
 *                  no further piece is posted (nor the immediate); the
 *                  pieces posted complete first.  Bytes may have landed.
 *   mw_connect     the attempt is torn down: no connection comes of it.
 *   mw_conn_close  the close goes on; nobody waits for it any more.
 *   mw_comm_create the communicator is torn down, its port freed.
 *   collectives    the communicator breaks, for every rank (they cannot
 *                  keep the same sequence without this rank's part): every
 *                  collective on it fails, here and on the other ranks.
 * A future nobody made an operation for (mw_future_new) fails at once.
 */

/** mw_future_set_timeout() - stop the operation behind @f if it is still
 *  pending after @ms milliseconds; @f fails -ETIMEDOUT (see above for
 *  when).  A later call replaces the deadline.
 *  Return: 0, -EALREADY when complete (or stopping already), -ESHUTDOWN,
 *  -ENOMEM. */
MW_EXTERN int mw_future_set_timeout(mw_future_t *f, unsigned ms);

/** mw_future_cancel() - stop the operation behind @f; @f fails -ECANCELED
 *  (see above for when: it may still be pending when this returns).
 *  Return: 0, or -EALREADY when complete or stopping already. */
MW_EXTERN int mw_future_cancel(mw_future_t *f);

/** mw_wait() - run the context's loop until @f completes, sleeping in the
 *  loop (never spinning).  Return: 0 if done, else the future's error;
 *  -EDEADLK when called from inside a meshwire callback. */
MW_EXTERN int mw_wait(mw_future_t *f);

/* ------------------------------------------------------------------------
 * Memory registered for RDMA
 * ------------------------------------------------------------------------ */

/** mw_alloc() - @size bytes registered with every device the context uses
 *  (and with devices it opens later); page aligned when size >= 4096.
 *  Each connection registers the memory it posts from once more, in its
 *  own protection domain, at its first use there (see mw_reg).
 *  Return: the memory, or NULL (errno set) for size 0 or out of memory. */
MW_EXTERN void *mw_alloc(mw_ctx_t *ctx, size_t size);

/** mw_free() - release memory from mw_alloc(); NULL does nothing.  Every
 *  export over it (mw_mem_export) is withdrawn first: a peer's key never
 *  reaches memory handed out again. */
MW_EXTERN void mw_free(mw_ctx_t *ctx, void *p);

typedef struct mw_mr mw_mr_t;

/**
 * mw_reg() - register caller memory [addr, addr+len) with every device the
 * context uses (local access; mw_mem_export grants a peer remote access).
 * A registration that already covers the range is reused (reference
 * counted); overlapping ranges are merged into one registration.  The
 * memory stays the caller's: call mw_dereg() before freeing or unmapping
 * it.  Registering pins every page: about a second per GiB on soft-RoCE,
 * in this call (collectives register large buffers off the loop).  A
 * connection that posts from the range registers it again in its own
 * protection domain, once, at that first post (the pages are pinned
 * already, so that costs less than this call); those registrations go with
 * the connection or the memory, and each counts against RLIMIT_MEMLOCK.
 * Return: 0 or -EINVAL (NULL, len 0, overflow), -ENOMEM, or the device's error.
 */
MW_EXTERN int mw_reg(mw_ctx_t *ctx, void *addr, size_t len, mw_mr_t **mrp);

/** mw_dereg() - drop a registration from mw_reg().  The last one over a
 *  range withdraws every export over it (mw_mem_export), as the caller may
 *  free that memory next.  Where the kernel can say
 *  when memory goes (userfaultfd, as Linux offers even to unprivileged
 *  processes for this use), the registration is kept after its last
 *  mw_dereg -- the pages stay pinned -- so that registering the same memory
 *  again (a collective on the same buffer, say) is free; it goes as soon
 *  as that memory is unmapped, trimmed (madvise) or moved, before any new
 *  memory at the same address can be served by it, and when kept ones pass
 *  MW_REG_CACHE_MB (default 1024), oldest first.  Without userfaultfd the
 *  last mw_dereg deregisters at once.
 *  Return: 0, -ESTALE when already dropped, -EINVAL for NULL or another
 *  context's registration. */
MW_EXTERN int mw_dereg(mw_ctx_t *ctx, mw_mr_t *mr);

/* ------------------------------------------------------------------------
 * Connections: reliable-connected queue pairs set up through rdma_cm
 * ------------------------------------------------------------------------
 * A connection is a handle the caller owns once it has it (from the future
 * of mw_connect(), or the accept callback) until mw_conn_close() or
 * mw_conn_abort(); after either, every call on it is refused (-ESTALE).
 * Every operation on it returns a future (NULL, errno set, for a refused
 * handle).
 *
 * Order.  Operations on one connection -- messages, one-sided writes and
 * reads, writes with immediate -- are carried out in the order they were
 * issued: each is handed to the device only after the one before it was,
 * and the reliable connection executes them in that order at the peer.
 * So a message sent after a write arrives after the write's data is in
 * place (write, then notify: no need to wait for the write's future in
 * between), and a write with immediate is delivered after everything
 * issued before it.  Futures complete as their work completes, which may
 * be in another order (a read's data comes back after a later write is
 * acknowledged, say).
 *
 * Failure.  A connection fails -- every pending operation with it -- when
 * the peer disconnects, when it stops answering while anything waits on it
 * (keepalive_ms), when the device reports its queue pair broken or its
 * port down, or when the device goes away; the future's message says
 * which.  A peer that goes silent (its host or link gone) is noticed when
 * the device's resends of work in flight run out, after about (retry_count
 * + 1) x ack_timeout_us (135 ms with the defaults on RDMA hardware), and
 * in any case while anything waits on it within 2 x keepalive_ms (a probe
 * unanswered: on soft-RoCE, whose resends at the default never run out,
 * that is what notices).  Lost and reordered packets are resent by the
 * device and cost time, never data.  A peer that is alive but does not
 * run its loop (a model load, a long forward pass) is never declared dead
 * for it: over RDMA its device answers the probes, and on the same-host
 * path its liveness is its process's (see there).  What waits on such a
 * peer waits: a receive, a read on the same-host path; the one limit is
 * send_timeout_ms (default 60 s), after which an operation that waits for
 * the peer's credits fails -ETIMEDOUT -- raise it for peers that stay
 * outside their loop longer.
 *
 * For each peer address the local address whose subnet contains
 * it (longest prefix) is chosen as the source, so in a direct-connect mesh each peer is reached
 * through the NIC on the link to it; with no match the routing table
 * decides.  Connections belong to the context's loop thread.
 */

typedef struct mw_conn mw_conn_t;
typedef struct mw_listener mw_listener_t;

#define MW_DEFAULT_PORT 7470

/** mw_conn_opts_t.ack_timeout_us: leave the ACK timeout to rdma_cm. */
#define MW_ACK_TIMEOUT_PATH UINT_MAX

/** Connection options; start from mw_conn_opts_init(). */
/** The path a connection's data takes. */
typedef enum mw_transport {
    MW_TRANSPORT_AUTO = 0,    /**< option: the same-host path when the peer
                                   is a process of this host (on a host
                                   without RDMA too), else RDMA; TCP where
                                   this host has no RDMA */
    MW_TRANSPORT_RDMA = 1,    /**< the RDMA device, whoever the peer is */
    MW_TRANSPORT_LOCAL = 2,   /**< (stats only) the same-host path */
    MW_TRANSPORT_TCP = 3,     /**< a TCP socket, no RDMA device involved */
} mw_transport_t;

typedef struct mw_conn_opts {
    unsigned timeout_ms;      /**< each setup step and the close; on the
                                   same-host path also how long a failing
                                   connection waits for the peer to stop
                                   (see there); default 5000 */
    unsigned credits;         /**< receive slots: messages (and writes with
                                   immediate) the peer may have in flight to us;
                                   default 16, 2..4096 */
    unsigned slot_size;       /**< bytes per receive slot (larger messages are
                                   split); default 64 KiB, 256..16 MiB */
    unsigned max_rdma_inflight; /**< RDMA work requests (chunks, batch
                                   entries) in flight per connection;
                                   default 16 */
    unsigned chunk_size;      /**< one-sided transfers are split into chunks of
                                   at most this (and the port's max message
                                   size); default 1 MiB.  Where posting is
                                   slow (soft-RoCE runs its send engine in
                                   ibv_post_send) chunks are smaller: sized
                                   to post in about 2 ms, as measured on the
                                   device, at least 64 KiB */
    unsigned default_port;    /**< port when an address names none; default 7470 */
    unsigned keepalive_ms;    /**< while anything waits on the peer (a
                                   receive, an operation queued or in flight)
                                   and the peer is silent this long, probe it
                                   (a zero-length RDMA write) so a vanished
                                   peer fails them: one unanswered for
                                   keepalive_ms more fails the connection;
                                   default 0 = timeout_ms.  On the same-host
                                   path no probe: the peer's process exiting
                                   (a pidfd) or its end of the channel
                                   closing fails the connection at once */
    unsigned send_timeout_ms; /**< an operation that waits this long for the
                                   peer's credits (the peer is alive but does
                                   not read its messages) fails -ETIMEDOUT,
                                   within keepalive_ms more; default 60000,
                                   UINT_MAX: wait for ever */
    uint64_t max_msg_size;    /**< the largest message the peer may send here
                                   (announced in the handshake): a larger one
                                   fails the connection -EMSGSIZE; mw_send of
                                   more than the peer's own limit fails
                                   -EMSGSIZE at once.  Default 256 MiB,
                                   1..2^40 */
    uint64_t max_inbox_bytes; /**< bytes of received messages kept for
                                   mw_recv (not yet asked for); beyond, no
                                   receive slot is given back and the peer
                                   waits, as with credits.  What a
                                   connection holds is at most this, plus
                                   what credits already allowed in
                                   (credits x slot_size), plus one message
                                   being received.  Default 1 GiB, >= 1 */
    unsigned ack_timeout_us;  /**< how long the device waits for the peer's
                                   acknowledgement before it resends (RC's
                                   local ACK timeout), rounded up to the
                                   device's steps, 4.096 us x 2^n.  A lost
                                   packet that nothing follows (the end of
                                   a burst, or the peer's NAK lost) costs
                                   this much before the resend; a loss
                                   within a burst is resent as soon as the
                                   peer's NAK comes back (on soft-RoCE, a
                                   loss or reordering during a resend waits
                                   for the timer).  Too short for
                                   the round trip under load and packets
                                   are sent twice.  Default 0: 16.8 ms on
                                   RDMA hardware (data-centre round trips
                                   are microseconds), 134 ms on soft-RoCE
                                   (the peer's CPU acknowledges, late when
                                   busy: rxe resends cost it more work and
                                   can fail writes).  MW_ACK_TIMEOUT_PATH:
                                   what rdma_cm derives from the path, on
                                   RoCE 1-2 s */
    unsigned retry_count;     /**< resends of an unacknowledged packet
                                   before the connection fails, 0..7; a peer
                                   that vanishes while work is in flight is
                                   noticed after about (retry_count + 1) x
                                   ack_timeout_us.  Soft-RoCE reads 7 as
                                   "for ever" and counts resends per work
                                   request (lower values fail large
                                   transfers on a lossy link): there the
                                   keepalive notices a vanished peer.  The
                                   connecting side's value applies to both
                                   ends (rdma_cm carries it in the
                                   request).  Default 7 */
    unsigned rnr_retry;       /**< resends when the peer has no receive
                                   posted, 0..6 (7, for ever, is refused:
                                   a peer that stops posting would hang the
                                   sender).  Credits make this rare; each
                                   wait is the peer's RNR timer (rdma_cm's
                                   default, 0.01-655 ms).  Default 6 */
    unsigned max_accepting;   /**< listeners: connections being set up at
                                   once (each holds a queue pair and its
                                   slots until established, failed or
                                   timeout_ms); a request beyond is refused
                                   at once ("busy": the client may retry)
                                   and counted as rejected.  Default 64,
                                   1..65536 */
    unsigned max_conns;       /**< listeners: connections accepted and not
                                   yet freed (those being set up
                                   included); a request beyond is refused
                                   at once ("busy") and counted as
                                   rejected: what whoever can reach the
                                   listener can make it hold.  0 (the
                                   default): no limit; up to 65536 */
    mw_transport_t transport; /**< MW_TRANSPORT_AUTO (default),
                                   MW_TRANSPORT_RDMA or MW_TRANSPORT_TCP;
                                   the environment's MW_TRANSPORT=rdma or
                                   =tcp forces that for every connection
                                   (MW_TRANSPORT=auto: as the option says;
                                   another value fails mw_connect and
                                   mw_listen -EINVAL).
                                   Both ends must allow the same-host path
                                   for a connection to take it.

                                   TCP: where this host has no RDMA
                                   (rdma_cm cannot be opened; logged once)
                                   auto means TCP, and so does
                                   MW_TRANSPORT_TCP anywhere; RDMA asked
                                   for fails there, -ENODEV.  Where there
                                   is RDMA, auto listens on both, RDMA
                                   peers over rdma_cm and the others over
                                   TCP on the same port number (on one
                                   alone where the other cannot listen,
                                   logged), and connects over RDMA to each
                                   address in turn, then, when all failed,
                                   none by a timeout resolving it (that
                                   passes: a retry goes over RDMA), and no
                                   meshwire peer refused, over TCP to
                                   each, logging once that it did and
                                   why: a peer with no RDMA, none its way,
                                   or a device here that cannot serve
                                   (memlock, completion queues full) does
                                   not stop it.  A listener started while
                                   a connect was under way (nothing over
                                   RDMA yet, TCP by the time it came)
                                   sends it back to RDMA, once: a peer
                                   that listens over RDMA is connected
                                   over RDMA.  MW_TRANSPORT_RDMA and _TCP
                                   listen and connect over that one only.
                                   mw_conn_stats() says which a connection
                                   took.  The connection is set up
                                   over the socket (the same handshake,
                                   limits and refusals as over rdma_cm),
                                   which then carries everything, payloads
                                   included, and the peer's loop executes
                                   one-sided requests against its exports,
                                   as on the same-host path below: order,
                                   flow control, deadlines, cancels and
                                   -EACCES are kept, and nothing of this
                                   process's memory is ever in the peer's
                                   reach but through its requests, so a
                                   failure flushes at once.  Requests that
                                   reached the peer before the failure are
                                   still executed there, as a device
                                   executes what reached it before a
                                   disconnect.  Nothing is pinned
                                   (RLIMIT_MEMLOCK does not matter).  The
                                   kernel answers for a peer outside its
                                   loop; a peer host gone silent (nothing
                                   acknowledged) is cut within about twice
                                   keepalive_ms, idle or not.  A TCP peer is
                                   authenticated no better than an rdma_cm
                                   one: whoever reaches the port may
                                   connect (max_accepting, max_conns bound
                                   what it holds), and an export's key is
                                   a random 32-bit number.

                                   The same-host path: when both processes
                                   run on one host -- the same boot, network
                                   and pid namespaces, and user, and the
                                   kernel allows cross-memory attach (Yama's
                                   ptrace_scope 0, or CAP_SYS_PTRACE) -- and
                                   the peer's address is one of this host's,
                                   the connection is made over rdma_cm as
                                   ever (its queue pair stays: exports
                                   register on it, its events fail it) --
                                   or over TCP where auto means TCP (the
                                   socket closes once the channel is
                                   taken: the channel's end is then the
                                   connection's) -- but
                                   its data goes through a unix socket
                                   between the two: messages and payloads up
                                   to 4 KiB in the socket, larger ones moved
                                   once by cross-memory attach (the side
                                   that owns the target memory copies, after
                                   checking the key and bounds against its
                                   exports as a device would).  Everything
                                   above keeps its promises: order, flow
                                   control, deadlines, cancels, a failed
                                   access failing -EACCES.

                                   The channel is set up before the
                                   connection is established, and whatever
                                   refuses it leaves the connection on the
                                   device (or the TCP socket), working: a
                                   peer of another user
                                   (never offered: its host identity
                                   differs), a process that refuses
                                   cross-memory copies (non-dumpable, as
                                   setcap makes one, or confined by a
                                   security module: both ends read a word of
                                   the other's memory first), a peer's loop
                                   that does not answer within timeout_ms /
                                   2.  Only a process of this user reaches
                                   the socket (its credentials are checked
                                   as it connects); copies go to the process
                                   the socket names, checked against a pidfd
                                   before each one (never a reused pid).
                                   mw_conn_stats() says which path a
                                   connection took.

                                   The peer's process executes one-sided
                                   work, from its loop, where a NIC would:
                                   it moves while the target runs its loop,
                                   and a cancelled transfer's pieces come
                                   back when the peer's loop answers them.
                                   When a connection fails (mw_conn_abort,
                                   an error, a close that timed out) it
                                   tells the peer to stop, and the peer
                                   executes nothing more of its requests
                                   that copy from or to this process's
                                   memory once it sees that (it checks
                                   before every copy; what came before
                                   whole in the socket -- a message or a
                                   payload up to 4 KiB, a reason sent
                                   right before an abort -- it executes
                                   up to the first such copy, as a device
                                   executes what reached it); the
                                   operations whose
                                   requests the peer had not answered fail
                                   only once the peer said so, from its
                                   loop, or its process ended: then, as on
                                   a device, nobody touches their memory
                                   any more.  A peer that is alive and
                                   outside its loop for timeout_ms after
                                   that makes them fail -EBUSY: it has been
                                   told, and may still finish the one copy
                                   it had begun when it stopped running;
                                   treat that memory as lent until its
                                   process ends.  A peer process that dies
                                   fails its connections at once (its
                                   pidfd, its end of the socket), never for
                                   being busy: no keepalive probe runs on
                                   this path.  An export whose memory was
                                   unmapped (and mapped again) takes no
                                   write on this path, as a device's old
                                   pages would take it unseen: the access
                                   is refused, -EACCES. */
} mw_conn_opts_t;

/** mw_conn_opts_init() - fill @opts with the defaults. */
MW_EXTERN void mw_conn_opts_init(mw_conn_opts_t *opts);

/** Called on the loop for each accepted connection; the caller owns @c. */
typedef void (*mw_accept_fn)(mw_listener_t *l, mw_conn_t *c, void *arg);

/**
 * mw_listen() - accept connections on "[ADDR][:PORT]" (ADDR may be IPv4,
 * [IPv6], a name, or empty/"*" for any; port 0 picks a free one).
 * @opts: for accepted connections; NULL for the defaults.
 * Peers whose handshake is missing, malformed, foreign or of another
 * version are rejected with a reason and counted; the listener goes on.
 * Return: 0 or a negative errno; *lp owned by the caller (mw_listener_free).
 */
MW_EXTERN int mw_listen(mw_ctx_t *ctx, const char *addr, const mw_conn_opts_t *opts,
                        mw_accept_fn cb, void *arg, mw_listener_t **lp);

/** mw_listener_port() - the port listened on (useful after port 0). */
MW_EXTERN int mw_listener_port(const mw_listener_t *l);

/** Counters of a listener. */
typedef struct mw_listener_stats {
    uint64_t accepted;        /**< connections established and handed over */
    uint64_t rejected;        /**< handshakes refused (any reason, also
                                   max_accepting reached) */
    uint64_t failed;          /**< accepted handshakes whose setup then failed */
} mw_listener_stats_t;
MW_EXTERN int mw_listener_stats(const mw_listener_t *l, mw_listener_stats_t *out);

/** mw_listener_free() - stop listening; connections already handed over
 *  stay.  Return: 0 (also for NULL), or -ESTALE when already freed. */
MW_EXTERN int mw_listener_free(mw_listener_t *l);

/**
 * mw_connect() - connect to a peer offering one or more addresses
 * ("HOST[:PORT][,HOST[:PORT]...]"), tried in order of subnet match.  An
 * address without a port takes the port of the next address written with
 * one, so "10.0.1.2,10.0.2.2:7480" and "10.0.1.2:7480,10.0.2.2:7480" are
 * the same; with none after it, opts->default_port.  A host name is looked
 * up on a thread of its own (a resolver that hangs never stalls the loop),
 * given up at opts->timeout_ms; the addresses found are then tried.
 * Return: a future whose value is the mw_conn_t * (the caller owns it once
 * the future is done); it fails with the reasons of every address tried:
 * -ECONNREFUSED when a peer refused (nothing listening there), else
 * -ETIMEDOUT when a step timed out, else what ran out locally (-ENOSPC: the
 * device's completion queue is at max_cqe; -ENOMEM: registrable memory,
 * RLIMIT_MEMLOCK; the device's error, e.g. -EAGAIN from the rdma cgroup,
 * for a queue pair), else -EHOSTUNREACH.
 * NULL only when out of memory.
 */
MW_EXTERN mw_future_t *mw_connect(mw_ctx_t *ctx, const char *addrs, const mw_conn_opts_t *opts);

/** A received message: @data holds @len bytes, copied out of the receive
 *  slot.  It is the caller's: valid until mw_msg_free(), also after its
 *  connection (or its context) is gone, and it holds no credit (the slot
 *  went back to the peer when it was copied).  Only messages not yet asked
 *  for with mw_recv() hold credits.  mw_msg_free() only frees memory:
 *  thread-safe, from any thread. */
typedef struct mw_msg {
    void *data;
    size_t len;
} mw_msg_t;
MW_EXTERN void mw_msg_free(mw_msg_t *m);

/** mw_send() - send @len bytes (0 allowed) as one message.  @buf stays the
 *  caller's and must not change or be freed until the future completes (it
 *  is copied into registered slots as credits allow).  Messages arrive in
 *  order.  Immediate errors (in the future): -EINVAL for a NULL @buf with
 *  @len > 0, the connection's error once it failed, -ESHUTDOWN once it is
 *  closing. */
MW_EXTERN mw_future_t *mw_send(mw_conn_t *c, const void *buf, size_t len);

/** mw_recv() - the next message: a future whose value is an mw_msg_t * the
 *  caller frees.  Messages not yet asked for are kept, up to the credits;
 *  beyond that the sender waits (flow control).  Fails with the
 *  connection's error once it failed, -ESHUTDOWN once it is closed. */
MW_EXTERN mw_future_t *mw_recv(mw_conn_t *c);

/** A piece of memory the peer may access: pass it to the peer (in a
 *  message); it is meaningful only on the connection it was exported for. */
typedef struct mw_remote {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
} mw_remote_t;

/** mw_mem_export() - let @c's peer read and write [addr, addr+len), memory
 *  from mw_alloc() or mw_reg(), and describe it in @out for the peer.  It
 *  registers exactly that range for remote access (other registrations are
 *  local-only), so whatever a peer sends it reaches nothing else.  The
 *  export stands until mw_mem_unexport(), until its memory is released
 *  (mw_free, the last mw_dereg over it, the memory unmapped), or until the
 *  connection is freed; after that the peer's accesses fail (-EACCES there,
 *  and its connection breaks).  The key works on @c only: every connection
 *  has a protection domain of its own, so a peer on another connection
 *  that learns or guesses it (of this context or another) is refused.
 *  Return: 0, -EINVAL (NULL, len 0), -EFAULT (not registered memory),
 *  -ENOTCONN (no device yet), or the device's error. */
MW_EXTERN int mw_mem_export(mw_conn_t *c, void *addr, size_t len, mw_remote_t *out);

/** mw_mem_unexport() - withdraw the export @r of @c (as mw_mem_export
 *  filled it): from this call on, the peer's accesses with it fail.  An
 *  access of the peer already under way completes or fails first.
 *  Return: 0, -EINVAL (NULL), -ENOENT (not an export of @c, or withdrawn
 *  by this call before), or the refusal of @c. */
MW_EXTERN int mw_mem_unexport(mw_conn_t *c, const mw_remote_t *r);

/** mw_write() / mw_read() - one-sided RDMA of @len bytes between local
 *  registered memory and @r at @offset.  Bounds are checked against @r
 *  before anything is posted; large transfers are split and pipelined.
 *  @local must not change (write) or be read (read) until the future
 *  completes.  Immediate errors (in the future): -EINVAL (NULL @r or
 *  @local, @len 0 except for mw_write_imm), -ERANGE ([offset, offset+len) not inside @r), -EFAULT
 *  (@local not from mw_alloc or mw_reg), the connection's error once it
 *  failed, -ESHUTDOWN once it is closing.  Later: the device's (-EACCES
 *  when the peer's key or bounds refuse the access). */
MW_EXTERN mw_future_t *mw_write(mw_conn_t *c, const void *local, size_t len,
                                const mw_remote_t *r, uint64_t offset);
MW_EXTERN mw_future_t *mw_read(mw_conn_t *c, void *local, size_t len,
                               const mw_remote_t *r, uint64_t offset);

/** mw_write_imm() - mw_write(), then @imm delivered to the peer's
 *  mw_conn_on_imm() callback once all the data is in place. */
MW_EXTERN mw_future_t *mw_write_imm(mw_conn_t *c, const void *local, size_t len,
                                    const mw_remote_t *r, uint64_t offset, uint32_t imm);

/*
 * Batches: many one-sided transfers as one operation.  A batch is a list
 * of entries (local memory, a remote region, an offset, a length), all
 * writes or all reads, prepared once on a connection -- every entry's
 * bounds and local key checked, nothing posted -- and posted as often as
 * wanted, each time with one future.  Posting hands the device chains of
 * work requests (one doorbell per chain, a completion only at its end), in
 * the connection's issue order like any operation: a message sent after
 * mw_batch_post arrives after all of the batch's data.  A batch may be
 * posted again before an earlier post completed; the posts are carried out
 * one after the other.
 */
typedef struct mw_batch mw_batch_t;

/** Which way a batch moves bytes. */
typedef enum mw_dir { MW_DIR_WRITE = 0, MW_DIR_READ } mw_dir_t;

/** One entry of a batch: @len bytes between @local (memory from mw_alloc
 *  or mw_reg) and remotes[@remote] at @offset. */
typedef struct mw_batch_entry {
    void *local;
    uint64_t len;
    uint64_t offset;
    uint32_t remote;
} mw_batch_entry_t;

/** mw_batch_new() - prepare @n entries (1..MW_BATCH_MAX) on @c, reading
 *  the peer's regions from @remotes (copied: the array may go).  Every
 *  entry is checked before this returns: on an error, *@bad (if not NULL)
 *  names the entry refused.  The local memory must stay registered while
 *  the batch is used: each post checks, cheaply, whether registered memory
 *  went away since the keys were looked up, and looks them up again if so
 *  (a post whose memory is gone fails -EFAULT, the connection unharmed).
 *  Return: 0 with *@out set (the caller's: mw_batch_free), -EINVAL (NULL,
 *  n out of range, an entry of length 0 or naming no remote), -ERANGE (an
 *  entry outside its remote), -EFAULT (an entry's local memory not
 *  registered, or not in one registration), -ENOMEM, or the refusal of @c
 *  (-ESTALE...; -ENOTCONN before it is established). */
#define MW_BATCH_MAX (1u << 24)
MW_EXTERN int mw_batch_new(mw_conn_t *c, mw_dir_t dir, const mw_remote_t *remotes,
                           size_t nremotes, const mw_batch_entry_t *entries, size_t n,
                           mw_batch_t **out, size_t *bad);

/** mw_batch_new_strided() - a batch of @count entries of @len bytes for a
 *  paged layout: entry i is local + i * @local_stride and @r at @offset +
 *  i * @remote_stride.  Same checks and return as mw_batch_new (-ERANGE
 *  also when the strides overflow). */
MW_EXTERN int mw_batch_new_strided(mw_conn_t *c, mw_dir_t dir, void *local,
                                   uint64_t local_stride, const mw_remote_t *r, uint64_t offset,
                                   uint64_t remote_stride, size_t count, uint64_t len,
                                   mw_batch_t **out, size_t *bad);

/** mw_batch_post() - carry out every entry of @b, in order.  The local
 *  memory is lent as with mw_write/mw_read until the future completes.
 *  @done (may be NULL): when the future completes, the number of entries
 *  known complete -- on success all; on failure or cancel entries
 *  [0, *done) completed, later ones did not (though bytes of them may have
 *  landed).  Errors as mw_write's, and -EFAULT when memory of an entry is
 *  no longer registered. */
MW_EXTERN mw_future_t *mw_batch_post(mw_batch_t *b, size_t *done);

/** mw_batch_post_imm() - mw_batch_post() of a write batch, then @imm
 *  delivered to the peer's mw_conn_on_imm() callback once all of its data
 *  is in place (the immediate rides on the last entry).  A read batch
 *  fails -EINVAL. */
MW_EXTERN mw_future_t *mw_batch_post_imm(mw_batch_t *b, uint32_t imm, size_t *done);

/** mw_batch_free() - drop @b; posts under way finish first.  NULL does
 *  nothing.  A batch may outlive its connection and context (posting on it
 *  is then refused, -ESTALE). */
MW_EXTERN void mw_batch_free(mw_batch_t *b);

/*
 * Rails: one peer's memory reached over several connections at once, one
 * per NIC pair (hosts that share several subnets: connect to each of the
 * peer's addresses, and meshwire picks the local NIC on each subnet).  A
 * rail group spreads transfers over its rails in slices, each to the rail
 * with the fewest bytes outstanding.  A rail that fails (its connection
 * broke: link down, QP error, peer gone) is taken out, and the slices it
 * did not complete are posted again on the others: the transfer completes
 * with every byte right while any rail works.  Rails may be of different
 * transports (an RDMA rail and a TCP rail to the same peer: connect with
 * opts.transport each).  A rail that stops making progress while another
 * moves -- slices out on it, none done for the group's stall time (10 s;
 * mw_rails_set_stall) while the others completed 8 or more: RC resending
 * and resending on a lossy link -- is stalled: the group fails its connection
 * (-ETIMEDOUT, "stalled"; close it and replace the rail when the link is
 * back), which brings its slices back at once to go on the others (over
 * TCP, requests that were already in the peer's socket are still executed
 * when its loop runs: the same bytes the others wrote).  The stall time
 * is how long a healthy rail may sit idle: under load an RDMA rail on
 * soft-RoCE has sat out RC resends of 0.6 s while TCP moved, and a stall
 * time under that judges it.  Rails all slow alike mean a slow peer: none
 * is judged, and a transfer left with one rail to a peer outside its loop
 * waits for it, as a connection would.  A rail given a new
 * connection (mw_rails_replace) is probed (a 1-byte read) before it is
 * used again.  The group posts on the connections but does not own them:
 * keep them open while it uses them (one closed counts as a failed rail).
 * Slices of one transfer, and transfers, complete in no particular order
 * across rails; carry a notification over a connection after the future.
 */
typedef struct mw_rails mw_rails_t;
#define MW_RAILS_MAX 8

/** Rail states. */
enum mw_rail_state { MW_RAIL_PROBING = 0, MW_RAIL_UP, MW_RAIL_DOWN };

/** mw_rails_new() - an empty group on @ctx; @slice_bytes: bytes per
 *  slice (0: 1 MiB).  Return 0 or -EINVAL, -ENOMEM; *@out is the caller's
 *  (mw_rails_free, before the context). */
MW_EXTERN int mw_rails_new(mw_ctx_t *ctx, size_t slice_bytes, mw_rails_t **out);

/** mw_rails_add() - a rail: connection @c and @r, the peer's region as
 *  exported on @c.  Every rail names the same region (address and length;
 *  the key is the connection's own).  The rail is probed, then used.
 *  Return: the rail's index, or -EINVAL (NULL, another region, @c already
 *  a rail), -ENOSPC (MW_RAILS_MAX rails), -ENOMEM, or the refusal of @c. */
MW_EXTERN int mw_rails_add(mw_rails_t *g, mw_conn_t *c, const mw_remote_t *r);

/** mw_rails_replace() - give rail @rail a new connection @c (and the region
 *  as exported on it), typically after it went down; it is probed, then
 *  used again.  Slices still out on the old connection finish there first.
 *  Return: 0, -EINVAL, -ENOENT (no such rail), or the refusal of @c. */
MW_EXTERN int mw_rails_replace(mw_rails_t *g, int rail, mw_conn_t *c, const mw_remote_t *r);

/** mw_rails_write() / mw_rails_read() - @len bytes between @local
 *  (registered memory) and the region at @offset, over the rails.  The
 *  future completes once every slice did, on some rail; it fails when no
 *  rail is left, with the last rail's error, or at once for bad arguments
 *  (-EINVAL, -ERANGE outside the region, -EFAULT not registered).
 *  Cancel and deadline stop it as mw_write's (slices out complete first). */
MW_EXTERN mw_future_t *mw_rails_write(mw_rails_t *g, const void *local, size_t len,
                                      uint64_t offset);
MW_EXTERN mw_future_t *mw_rails_read(mw_rails_t *g, void *local, size_t len, uint64_t offset);

/** mw_rails_post() - a batch over the rails: @n entries (their .remote
 *  must be 0: the group's region), sliced and spread like a transfer. */
MW_EXTERN mw_future_t *mw_rails_post(mw_rails_t *g, mw_dir_t dir,
                                     const mw_batch_entry_t *entries, size_t n);

/** What a rail is and has done. */
typedef struct mw_rail_stats {
    int state;                /**< enum mw_rail_state */
    char device[64];          /**< the local RDMA device of its connection */
    uint64_t bytes;           /**< moved by slices that completed on it */
    uint64_t slices;          /**< slices completed on it */
    uint64_t failures;        /**< times it was taken out */
    uint64_t reposted;        /**< its slices posted again on other rails */
    char why[160];            /**< why it was last taken out */
} mw_rail_stats_t;

/** mw_rails_stats() - rail @rail of @g; an idle rail whose connection
 *  broke is taken out here, so the state is current.  Return: 0, -EINVAL,
 *  -ENOENT. */
MW_EXTERN int mw_rails_stats(mw_rails_t *g, int rail, mw_rail_stats_t *out);
/** mw_rails_set_stall() - the time a rail may complete no slice while the
 *  others complete 8 before it is judged stalled (above); 0: never.
 *  The default, 10 s, outlasts RC's own recoveries on a loaded soft-RoCE
 *  host (rails idle for 2.5-4 s were seen); a few slices' time on your
 *  links fails over sooner.  Return: 0 or -EINVAL. */
MW_EXTERN int mw_rails_set_stall(mw_rails_t *g, unsigned ms);
/** mw_rails_count() - the rails of @g (their indexes are 0..count-1). */
MW_EXTERN int mw_rails_count(const mw_rails_t *g);

/** mw_rails_free() - drop the group: its transfers are cancelled (and
 *  their futures fail once their slices are back); the connections stay
 *  the caller's.  NULL does nothing. */
MW_EXTERN void mw_rails_free(mw_rails_t *g);

/** Called on the loop for each write-with-immediate that lands. */
typedef void (*mw_imm_fn)(mw_conn_t *c, uint32_t imm, void *arg);
MW_EXTERN int mw_conn_on_imm(mw_conn_t *c, mw_imm_fn fn, void *arg);

/** mw_conn_close() - graceful: no new operations; those pending finish,
 *  then the connection is torn down and freed.  The future is done when it
 *  is gone (or fails with what went wrong).  @c is released at once: later
 *  calls on it are refused, and no immediate is delivered for it again.
 *  NULL (errno) for a refused handle, closed twice included. */
MW_EXTERN mw_future_t *mw_conn_close(mw_conn_t *c);

/** mw_conn_abort() - abortive: pending operations fail with -ECONNABORTED,
 *  the connection is torn down and freed; @c is released at once.  On the
 *  same-host path the one-sided operations fail once the peer stopped
 *  executing them (or -EBUSY, after timeout_ms: see mw_conn_opts_t).
 *  Return: 0, or the refusal of @c (-ESTALE when already closed). */
MW_EXTERN int mw_conn_abort(mw_conn_t *c);

/** What a connection is and has done. */
typedef struct mw_conn_stats {
    char local[80];           /**< local address:port */
    char remote[80];          /**< peer address:port */
    char device[64];          /**< the local RDMA device carrying it (over
                                   TCP: the network interface) */
    uint64_t msgs_sent, msgs_received, bytes_sent, bytes_received;
    uint64_t writes, reads, imms_received, rdma_bytes;
    uint64_t credit_waits;    /**< times a send waited for the peer's credits */
    uint64_t inbox_bytes;     /**< received messages not yet asked for */
    uint64_t peer_max_msg;    /**< the largest message the peer accepts */
    uint64_t ack_timeout_us;  /**< what the queue pair runs (queried from the
                                   device): the ACK timeout, 0 = none */
    unsigned retry_count, rnr_retry;   /**< and its retry counts */
    mw_transport_t transport; /**< MW_TRANSPORT_RDMA, MW_TRANSPORT_LOCAL
                                   (the same-host path: see mw_conn_opts_t)
                                   or MW_TRANSPORT_TCP */
} mw_conn_stats_t;
MW_EXTERN int mw_conn_stats(const mw_conn_t *c, mw_conn_stats_t *out);

/* ------------------------------------------------------------------------
 * Collectives over a communicator
 * ------------------------------------------------------------------------ */

/** Element types of collectives. */
typedef enum mw_dtype {
    MW_INT8 = 0, MW_INT16, MW_INT32, MW_INT64,
    MW_UINT8, MW_UINT16, MW_UINT32, MW_UINT64,
    MW_F16,                   /**< IEEE 754 binary16 */
    MW_BF16,                  /**< bfloat16 */
    MW_F32, MW_F64,
    MW_DTYPE_COUNT
} mw_dtype_t;

/** Reduction operations.  Integer sum/prod wrap (two's complement); for
 *  floating types min/max return NaN when either operand is NaN; f16/bf16
 *  are computed in f32 and rounded to nearest even. */
typedef enum mw_op { MW_SUM = 0, MW_PROD, MW_MIN, MW_MAX, MW_OP_COUNT } mw_op_t;

/** mw_dtype_size() - bytes per element, 0 for an unknown type. Thread-safe. */
MW_EXTERN size_t mw_dtype_size(mw_dtype_t dt);
/** mw_dtype_name() / mw_op_name() - "f32", "sum"...; "?" if unknown. */
MW_EXTERN const char *mw_dtype_name(mw_dtype_t dt);
MW_EXTERN const char *mw_op_name(mw_op_t op);


typedef struct mw_comm mw_comm_t;

/** Communicator options; start from mw_comm_opts_init(). */
typedef struct mw_comm_opts {
    unsigned timeout_ms;      /**< creation deadline, peers included (they may
                                   start later); default 60000 */
    unsigned slot_size;       /**< bytes per scratch slot a peer writes into;
                                   default 1 MiB; a multiple of 4 KiB,
                                   4 KiB..256 MiB */
    unsigned slots;           /**< scratch slots per peer (chunks in flight);
                                   default 4, 1..1024 */
    mw_conn_opts_t conn;      /**< for the connections to the peers;
                                   mw_comm_opts_init gives
                                   mw_conn_opts_init's but slot_size 4096
                                   (only hellos travel as messages) */
    const char *job;          /**< the job's identity, read during the call;
                                   NULL: MW_JOB, else the launcher's job id
                                   (SLURM_JOB_ID and SLURM_STEP_ID,
                                   TORCHELASTIC_RUN_ID, PMIX_NAMESPACE,
                                   OMPI_MCA_ess_base_jobid), else none.
                                   Every rank must agree: a process of
                                   another job reaching a rank's port (a
                                   stale rank of an earlier run still
                                   retrying) is refused, not taken for a
                                   rank.  Default NULL */
} mw_comm_opts_t;

/** mw_comm_opts_init() - fill @opts with the defaults. */
MW_EXTERN void mw_comm_opts_init(mw_comm_opts_t *opts);

/**
 * mw_comm_create() - join a communicator of @nranks ranks as @rank.
 * @peers: nranks entries, read during the call; entry i is how to reach
 *         rank i: "ADDR[,ADDR...][:PORT]", every address of rank i (IPv4,
 *         [IPv6] or a name) and one port for all of them, written once at
 *         the end or after each address alike ("10.0.1.2,10.0.2.2:7480" =
 *         "10.0.1.2:7480,10.0.2.2:7480"); without one,
 *         opts->conn.default_port.  An entry naming two different ports is
 *         refused (-EINVAL).  Each rank connects to rank i through the
 *         address of entry i on a subnet it shares (the others after it);
 *         rank @rank listens on every local address at its entry's port.
 * A rank connects only to the peers its collectives need, when they first
 * need them: at creation its two ring neighbours (rank-1 and rank+1, modulo
 * nranks), whose setup is checked against its own; later the peers of each
 * collective's algorithm (a ring allreduce: none more; recursive doubling,
 * barrier, broadcast: about log2 nranks; alltoall, gather, scatter: all).
 * Of each pair the higher rank connects, over RC connections made through
 * rdma_cm (no other channel); the two then exchange the registered scratch
 * regions they write into (opts->slots * opts->slot_size bytes per
 * connected peer).  mw_comm_stats() counts them.
 * Ranks may start in any order within opts->timeout_ms; refused attempts
 * while a peer starts are retried (they show in mw_ctx_stats as flushes),
 * and so are connections dropped before the peer's hello (a process of
 * another job still at that port: the deadline's message says so).  Every
 * rank must run the same meshwire: a rank of a release whose collectives
 * use another wire format is refused like a rank of another job.
 * Later connections are retried as long (from when a collective first
 * needs the peer); a peer not reached by then is lost to the collectives
 * that need it, which fail -ECONNABORTED naming it.
 * Return: a future whose value is the mw_comm_t * (the caller's, close with
 * mw_comm_close or free with mw_comm_free); NULL only when out of memory.
 * It fails with -EINVAL for a bad rank, count, entry or option (the message
 * names it), -ETIMEDOUT naming the ring neighbours still missing at the
 * deadline (failed connects are retried until then), or -EPROTO when a
 * neighbour disagrees (another rank count or scratch geometry); a rank
 * further away that disagrees breaks the communicator for every rank
 * (-ECONNABORTED) as soon as its neighbours find it.
 */
MW_EXTERN mw_future_t *mw_comm_create(mw_ctx_t *ctx, int rank, int nranks,
                                      const char *const *peers, const mw_comm_opts_t *opts);

/**
 * mw_comm_create_env() - mw_comm_create() with the rank and peers a launcher
 * put in the environment:
 *   rank:  MW_RANK, else RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI),
 *          PMI_RANK (MPICH/Hydra), SLURM_PROCID (Slurm);
 *   peers: MW_HOSTFILE, a file with one entry per rank and line, or else
 *          MW_PEERS, the entries separated by spaces or ';'.  An entry is
 *          as for mw_comm_create ("ADDR[,ADDR...][:PORT]"); "slots=N" after
 *          one makes it N ranks; '#' starts a comment.  An entry without a
 *          port gets MW_PORT (default opts->conn.default_port) plus the
 *          number of earlier entries written the same way (the same text:
 *          "node1" and its address count apart), so ranks sharing a host
 *          get consecutive ports;
 *   size:  the number of entries, checked against MW_WORLD_SIZE, else
 *          WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS when set.
 * Return: as mw_comm_create; a missing or malformed variable fails the
 * future with -EINVAL and a message naming it.
 */
MW_EXTERN mw_future_t *mw_comm_create_env(mw_ctx_t *ctx, const mw_comm_opts_t *opts);

/**
 * mw_comm_close() - leave the communicator together with the others: the
 * collective counterpart of mw_comm_free, called by every rank after its
 * last collective (NCCL's finalize).  The collectives already issued run to
 * their end; then this rank says goodbye to each peer it is connected to
 * and waits for theirs, so no rank leaves while another still writes to it
 * or waits for its last writes to complete: no rank's collective breaks
 * because another left cleanly.  A peer whose connection is lost counts as
 * gone.  Collectives issued after the call fail -ESTALE.  Any rank's
 * collective that still needs a rank that closed fails -ECONNABORTED (the
 * ranks disagreed on what to run).
 * Return: a future resolved once this rank left (NULL with errno EINVAL or
 * ESTALE for a bad handle, ENOMEM); from then on the handle is released,
 * as by mw_comm_free.  It fails -EALREADY when a close is already under
 * way.  It waits for peers as long as they take: cancelling it (or its
 * deadline) leaves at once, as mw_comm_free does.  On a broken
 * communicator it resolves at once.
 */
MW_EXTERN mw_future_t *mw_comm_close(mw_comm_t *comm);

/**
 * mw_comm_shrink() - the communicator of @comm's ranks without @exclude,
 * made from it after ranks were lost (NCCL's ncclCommShrink, MPI's
 * MPI_Comm_shrink): no new bootstrap, no addresses from the application.
 * Every survivor calls it with the same @nexclude ranks (in any order);
 * the survivors keep their order, renumbered from 0 (rank r becomes r
 * minus the excluded ranks below it), and each listens at its old entry's
 * port.  @comm is released by the call (its pending collectives fail
 * -ECANCELED), broken or not.  Ranks that disagree on the list form
 * nothing together: each is refused as a rank of another job, and the
 * creation fails -ETIMEDOUT naming who is missing.
 * @opts: NULL for @comm's (the timeout, scratch geometry, connection
 *        options); opts->job is ignored (the job is @comm's, with the list).
 * Return: as mw_comm_create (the new mw_comm_t * is the caller's); NULL
 * with errno EINVAL or ESTALE for a bad handle, ENOMEM.  It fails -EINVAL
 * for a bad list (a rank out of range or twice, this rank, every other
 * rank), with @comm left as it was.
 */
MW_EXTERN mw_future_t *mw_comm_shrink(mw_comm_t *comm, const int *exclude, int nexclude,
                                      const mw_comm_opts_t *opts);

/** mw_comm_free() - leave at once: this rank's pending collectives fail
 *  -ECANCELED; peers still running a collective that needs this rank fail
 *  it, with a message naming this rank, and their communicator breaks.
 *  Use it to abandon a communicator; mw_comm_close() leaves cleanly.
 *  Return: 0 (also for NULL), or -ESTALE when already freed or closed. */
MW_EXTERN int mw_comm_free(mw_comm_t *comm);
MW_EXTERN int mw_comm_rank(const mw_comm_t *comm);
MW_EXTERN int mw_comm_size(const mw_comm_t *comm);

/** What a communicator holds, for mw_comm_stats(). */
typedef struct mw_comm_stats {
    uint32_t connections;     /**< peers connected (their hello exchanged) */
    uint64_t scratch_bytes;   /**< registered scratch held for them */
    uint64_t collectives;     /**< collectives completed */
    uint64_t collective_failures; /**< collectives that failed */
} mw_comm_stats_t;

/** mw_comm_stats() - fill @st; 0, or -EINVAL / -ESTALE / -EPERM (off the
 *  loop thread) as the handle calls. */
MW_EXTERN int mw_comm_stats(const mw_comm_t *comm, mw_comm_stats_t *st);

/*
 * Collectives.  Each returns a future, done when this rank's part is
 * complete and its output holds the result.
 *
 * Buffers, in elements of @dt, on a communicator of N ranks:
 *
 *   collective      in                          out
 *   broadcast       buf: count, the input at the root, the output elsewhere
 *   reduce          count                       count at the root only
 *   allreduce       count                       count
 *   reduce_scatter  count: the whole vector     this rank's block of it:
 *                                               mw_block_of(count, N, rank)
 *   allgather       count                       N * count; block b (at
 *                                               b * count) is rank b's in
 *   gather          count                       N * count at the root only,
 *                                               laid out as allgather's
 *   scatter         N * count at the root only; count: block `rank` of the
 *                   block b goes to rank b      root's in
 *   alltoall        N * count; block b goes to  N * count; block b came
 *                   rank b                      from rank b
 *
 * A buffer marked "at the root only" may be NULL elsewhere and is never
 * touched there; no rank reads or writes beyond the sizes above.  With
 * count 0 a collective completes in its turn without touching any buffer
 * (all may be NULL).
 *
 * Overlap.  Input and output may overlap in any way, in every collective:
 * the result is as if the whole input had been read first.  In place is
 * the same pointer for both (the input read from its start; for
 * reduce_scatter the block lands at the start), or, for allgather and
 * gather, the input already at its own block of the output (out +
 * rank * count, as MPI_IN_PLACE has it).  Where the schedule would
 * overwrite input it still has to read (alltoall; allreduce forced to
 * "direct" on 3 ranks or more) meshwire first copies the input aside.
 *
 * Buffers stay the caller's; they need not be registered (they are,
 * through mw_reg's cache, while the collective runs: free for memory from
 * mw_alloc, a registration per call for other memory, so use mw_alloc for
 * buffers used often) and must not change until the future completes.
 *
 * Several collectives may be in flight on one communicator; they run in
 * the order issued, and every rank must issue the same sequence (a rank
 * that calls a different collective, count, type or op is detected, and the
 * collective fails on the ranks that notice).  A collective that fails on
 * one rank before it starts (a bad argument, no memory, a buffer that
 * cannot be registered), or that is cancelled or times out, breaks the
 * communicator for every rank, with a message naming that rank: the
 * others would wait for its part for ever, or run one step out of line.
 * Allreduce's algorithm is fixed when the communicator is created
 * (MW_ALLREDUCE_ALGO=ring|rd|direct is read then, and ranks that differ
 * fail the creation).
 *
 * Errors, all through the future: -EINVAL (unknown type or op, a root
 * outside the communicator, a buffer this rank needs given as NULL, a
 * byte size that overflows), -ENOMEM or the device's error when the
 * buffers cannot be registered, -EPROTO when ranks disagree on the
 * collective, the communicator's error once it broke (a rank lost: every
 * later collective fails the same way), -ECANCELED after mw_comm_free().
 *
 * Results.  Every rank that holds a result holds the same bits: each
 * element is combined in one order all ranks agree on (f16 and bf16 in
 * f32, rounded once per combination).  That order is not a loop over
 * ranks, so floating results may differ in the last bits from a sequential
 * reduction.  The exception is allreduce forced to "direct"
 * (MW_ALLREDUCE_ALGO=direct), where each rank sums in its own order.
 */

/** mw_block_of() - where block @rank of @count elements split over
 *  @nranks lies: the first count % nranks blocks have one element more,
 *  blocks are contiguous and in rank order.  reduce_scatter gives rank r
 *  block r.  Thread-safe.
 *  Return: 0 with *@off and *@len in elements, or -EINVAL (nranks < 1,
 *  rank outside 0..nranks-1, NULL @off or @len). */
MW_EXTERN int mw_block_of(size_t count, int nranks, int rank, size_t *off, size_t *len);

MW_EXTERN mw_future_t *mw_barrier(mw_comm_t *comm);
MW_EXTERN mw_future_t *mw_broadcast(mw_comm_t *comm, void *buf, size_t count, mw_dtype_t dt,
                                    int root);
MW_EXTERN mw_future_t *mw_reduce(mw_comm_t *comm, const void *in, void *out, size_t count,
                                 mw_dtype_t dt, mw_op_t op, int root);
MW_EXTERN mw_future_t *mw_allreduce(mw_comm_t *comm, const void *in, void *out, size_t count,
                                    mw_dtype_t dt, mw_op_t op);
/** @count: elements per rank; @out holds nranks * count, @in count. */
MW_EXTERN mw_future_t *mw_allgather(mw_comm_t *comm, const void *in, void *out, size_t count,
                                    mw_dtype_t dt);
/** @count: total elements of @in; rank r's @out gets block r (mw_block_of). */
MW_EXTERN mw_future_t *mw_reduce_scatter(mw_comm_t *comm, const void *in, void *out,
                                         size_t count, mw_dtype_t dt, mw_op_t op);
/** @count: elements per rank. */
MW_EXTERN mw_future_t *mw_gather(mw_comm_t *comm, const void *in, void *out, size_t count,
                                 mw_dtype_t dt, int root);
MW_EXTERN mw_future_t *mw_scatter(mw_comm_t *comm, const void *in, void *out, size_t count,
                                  mw_dtype_t dt, int root);
/** @count: elements sent to each rank (in and out hold nranks * count). */
MW_EXTERN mw_future_t *mw_alltoall(mw_comm_t *comm, const void *in, void *out, size_t count,
                                   mw_dtype_t dt);

/* ------------------------------------------------------------------------
 * Directory: finding peers at run time through a store the cluster runs
 * ------------------------------------------------------------------------
 * A directory is a client of a key-value store -- Redis, through hiredis's
 * asynchronous client on the context's own loop -- where processes
 * publish themselves under names ("job/role/id") and others look them up,
 * list a role, and are called when peers join or leave: no host file, no
 * address handed around by hand.
 *
 * An entry holds its publisher's addresses (as mw_connect takes them), a
 * random instance number (a new process publishing the same name is a new
 * instance), a free-form tag, and the names and sizes of regions it
 * shares.  It lives in the store under "PREFIX:NAME" with a lease
 * (opts.lease_ms) the directory renews every third of it: a process that
 * dies leaves its entry for at most one lease; mw_dir_unpublish() and
 * mw_dir_free() remove it at once.  Names are 1-200 characters of
 * [A-Za-z0-9._-] in segments separated by '/', no segment empty.
 *
 * The store going away (restarting, unreachable) costs no connection and
 * no transfer: meshwire uses it only to find peers.  Requests made
 * meanwhile wait until it is back or until opts.timeout_ms (then fail
 * -ETIMEDOUT); it is retried every 0.1-2 s; once back, every entry this
 * directory publishes is put again (a store that restarted empty has them
 * again within that pause) and watches read the store again: a peer that
 * joined meanwhile is reported then, one whose entry did not come back
 * within a lease (plus 2 s, a publisher's slowest retry) is reported gone.
 *
 * What a store can make meshwire do: entries are parsed strictly (at most
 * 8 KiB, every field checked); a malformed one is skipped by lists and
 * watches (logged) and fails a lookup -EPROTO.  The store is trusted to
 * say where peers are -- whoever can write it can point you elsewhere --
 * but not with memory: a region table comes from the peer itself.
 *
 * Other stores: the directory asks its store for put with a lease, renew,
 * delete, get, get every key under a prefix, and events (set, gone) for
 * the keys under the prefix, plus word when the link goes down and comes
 * back.  etcd has each of these (leases with keep-alive, range requests,
 * watches on a prefix); a backend for it would implement src/dir/store.h.
 *
 * Calls that return a future return NULL only when out of memory, or
 * with errno set when the directory handle is not live (freed: ESTALE).
 *
 * Redis needs keyspace notifications for watches (and so for
 * mw_dir_comm_create): notify-keyspace-events including "Kgx", set by
 * the store's owner (redis.conf, or redis-server --notify-keyspace-events
 * Kgx).  The directory turns them on itself (CONFIG SET) only when
 * opened with configure_store; otherwise, or where CONFIG is refused,
 * watches fail -ENOTSUP and an error line names the setting (publish,
 * lookup and list still work).
 */
typedef struct mw_directory mw_directory_t;

typedef struct mw_dir_opts {
    const char *prefix;       /**< keys are "PREFIX:NAME"; default "mw" */
    unsigned lease_ms;        /**< an entry outlives its silent publisher by
                                   at most this; renewed every third of it.
                                   Default 10000, 300..86400000 */
    unsigned timeout_ms;      /**< a request's deadline, and each step of
                                   reaching the store (looking its name up,
                                   connecting, its first answer): one that
                                   takes longer is given up and tried again
                                   later; default 5000 */
    unsigned configure_store; /**< 1: turn the store's keyspace
                                   notifications on when watches need them
                                   and they are off (CONFIG SET; a store
                                   shared with others is reconfigured for
                                   all); default 0: watches fail -ENOTSUP */
} mw_dir_opts_t;

/** mw_dir_opts_init() - fill @opts with the defaults. */
MW_EXTERN void mw_dir_opts_init(mw_dir_opts_t *opts);

/**
 * mw_dir_open() - a directory on the store at @url:
 * "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" (port 6379 by default) or
 * "unix:[[USER]:PASSWORD@]PATH[?db=N]" for Redis, or "etcd://HOST[:PORT]"
 * (port 2379 by default) for etcd v3, through its JSON gateway; NULL:
 * MW_DIRECTORY from the environment.  With a password every connection to
 * Redis starts with its AUTH (USER empty: the default user); percent-encode
 * ':', '/' and '%' in USER and PASSWORD.  Messages and logs show the URL
 * with the password as "***".  On etcd, an entry's lease counts whole
 * seconds, at least etcd's minimum TTL (2 s by default), and etcd's own
 * authentication is not supported.
 * Return: a future whose value is the mw_directory_t * (the caller's, free with
 * mw_dir_free), done once the store answered; -EINVAL for a malformed URL
 * or option, -EACCES when the store wants a password or refused the one
 * given (at once, with its reply), -ETIMEDOUT when the store was not
 * reached within opts->timeout_ms.  NULL only when out of memory.
 */
MW_EXTERN mw_future_t *mw_dir_open(mw_ctx_t *ctx, const char *url, const mw_dir_opts_t *opts);

/** mw_dir_free() - remove this directory's entries from the store (sent,
 *  not waited for: a store away keeps them for a lease), stop its watches
 *  and listeners (connections already handed over stay); its pending
 *  futures fail -ECANCELED.  Return: 0 (also for NULL), -ESTALE. */
MW_EXTERN int mw_dir_free(mw_directory_t *d);

/** A region an entry shares: its name and size (the key to reach it comes
 *  over the connection, from the peer: see mw_dir_connect). */
typedef struct mw_dir_region_info {
    const char *name;
    uint64_t len;
} mw_dir_region_info_t;

/** An entry as read from the store; valid as long as what holds it. */
typedef struct mw_dir_entry {
    const char *name;
    const char *addrs;        /**< "ADDR[,ADDR...]:PORT", for mw_connect */
    const char *tag;          /**< the publisher's, "" when none */
    uint64_t instance;        /**< random, per publication */
    int serves;               /**< connections to it start with its region
                                   table (published with a listener) */
    size_t nregions;
    const mw_dir_region_info_t *regions;
} mw_dir_entry_t;

/** Memory to share with every peer that connects by name: memory from
 *  mw_alloc() or mw_reg(), exported on each accepted connection. */
typedef struct mw_dir_share {
    const char *name;         /**< 1-63 characters of [A-Za-z0-9._-] */
    void *addr;
    size_t len;
} mw_dir_share_t;

/** What to publish; zero it, then set what applies. */
typedef struct mw_dir_pub {
    const char *listen;       /**< listen here ("[ADDR][:PORT]", as
                                   mw_listen; "" or "*:0": every address, a
                                   free port) and publish the addresses
                                   listened on; NULL: publish @addrs only */
    const char *addrs;        /**< with @listen NULL: the addresses to
                                   publish, as mw_connect takes them */
    const mw_conn_opts_t *conn; /**< for accepted connections; NULL: defaults */
    mw_accept_fn on_accept;   /**< with @listen: each accepted connection,
                                   once the shares are exported on it and
                                   its table sent (the caller owns it) */
    void *arg;
    const char *tag;          /**< free text for readers, at most 255
                                   printable characters; NULL: "" */
    const mw_dir_share_t *shares; /**< with @listen: regions exported on
                                   every accepted connection, named */
    size_t nshares;           /**< at most 64 */
    unsigned max_conns;       /**< with @listen: connections held at once
                                   (accepted, not yet freed); beyond,
                                   requests are refused "busy".  Each holds
                                   its own export of every share, so the
                                   memory a stranger can pin is at most
                                   max_conns x the shares' sizes.  0: the
                                   conn options' max_conns, else 64 */
} mw_dir_pub_t;

/**
 * mw_dir_publish() - publish @name as @pub says, under a lease renewed
 * until mw_dir_unpublish() or mw_dir_free().  Publishing a name again
 * replaces the entry (a new instance).  When another process publishes the
 * same name, the last to publish holds it: this one's renewals and its
 * unpublish leave the other's entry alone, and its own is put back once
 * the other's is gone (within about a lease of that publisher's death; a
 * warning says so when it happens).  With a listener, every accepted
 * connection first gets the shares exported on it and a region table sent
 * as its first message (the connecting side's mw_dir_connect takes it;
 * plain mw_connect callers receive it as a first message: use
 * mw_dir_connect).
 * Return: a future done once the store holds the entry; -EINVAL (a bad
 * name, share or option, named in the message), mw_listen's errors,
 * -ETIMEDOUT.  The entry stays published (and is retried) after a
 * timeout, until unpublished.  NULL only when out of memory.
 */
MW_EXTERN mw_future_t *mw_dir_publish(mw_directory_t *d, const char *name, const mw_dir_pub_t *pub);

/** mw_dir_unpublish() - remove @name: its renewal stops and its listener
 *  closes at once (connections already handed over stay); a publish
 *  still under way fails -ECANCELED.  Return: a future done once the
 *  store removed the entry (from then on no lookup finds it); -ENOENT
 *  (not published here), -EINVAL, -ETIMEDOUT (the store away: the entry
 *  then expires within a lease).  NULL (errno) for a handle not live. */
MW_EXTERN mw_future_t *mw_dir_unpublish(mw_directory_t *d, const char *name);

/** Entries found: @n of them in @e, sorted by name; free with
 *  mw_dir_list_free(). */
typedef struct mw_dir_list {
    size_t n;
    mw_dir_entry_t *e;
} mw_dir_list_t;
MW_EXTERN void mw_dir_list_free(mw_dir_list_t *l);

/** mw_dir_lookup() - the entry of @name: a future whose value is an
 *  mw_dir_list_t * of one entry (the caller frees it); fails -ENOENT
 *  (absent), -EPROTO (malformed in the store, or a key of another type
 *  there), -ETIMEDOUT, -EINVAL, -EIO (the store refused the request; the
 *  future's message is its reply). */
MW_EXTERN mw_future_t *mw_dir_lookup(mw_directory_t *d, const char *name);

/** mw_dir_list() - every well-formed entry whose name starts with @prefix
 *  ("prefill/" for a role; "" for all): a future whose value is an
 *  mw_dir_list_t * (possibly empty), read 128 entries per request (each
 *  page consistent; an entry changed meanwhile is listed once); -E2BIG
 *  past 100,000 entries or 64 MiB. */
MW_EXTERN mw_future_t *mw_dir_list(mw_directory_t *d, const char *prefix);

enum mw_dir_event {
    MW_DIR_JOINED = 1,        /**< an entry appeared or changed: @e */
    MW_DIR_LEFT,              /**< an entry is gone (removed, lease expired,
                                   or not back within a lease and 2 s
                                   after the store returned): @e holds its
                                   last value */
    MW_DIR_SYNCED,            /**< everything present was reported (after
                                   the watch began, and again each time the
                                   store came back); @e NULL */
    MW_DIR_LOST,              /**< the store is away: nothing is heard until
                                   the next SYNCED; @e NULL */
};

typedef void (*mw_dir_watch_fn)(mw_directory_t *d, int event, const mw_dir_entry_t *e, void *arg);

/**
 * mw_dir_watch() - call @fn for every entry under @prefix present now
 * (JOINED each, then SYNCED) and then for every change, as the store
 * reports it (keyspace notifications, no polling), in order, from the
 * loop (never inside another meshwire call: @fn may unwatch, or free the
 * directory); an entry's lease renewals are not changes.
 * Return: a watch id >= 1 for mw_dir_unwatch(), or -EINVAL, -ENOMEM,
 * -ENOTSUP (the store sends no notifications; also reported later, by a
 * log line, when a store that restarted refuses them).
 */
MW_EXTERN int mw_dir_watch(mw_directory_t *d, const char *prefix, mw_dir_watch_fn fn, void *arg);
/** mw_dir_unwatch() - @fn is not called again.  Return: 0, -ENOENT. */
MW_EXTERN int mw_dir_unwatch(mw_directory_t *d, int id);

/** A connection made by name, with the regions its peer shares. */
typedef struct mw_dir_peer {
    mw_conn_t *conn;          /**< the caller's: mw_conn_close() */
    size_t nregions;
    const char *const *names; /**< region i's name */
    const mw_remote_t *regions; /**< region i, for mw_read/mw_write on @conn */
} mw_dir_peer_t;

/** mw_dir_peer_region() - the region named @name, or NULL. */
MW_EXTERN const mw_remote_t *mw_dir_peer_region(const mw_dir_peer_t *p, const char *name);
/** mw_dir_peer_free() - free @p, not its connection. */
MW_EXTERN void mw_dir_peer_free(mw_dir_peer_t *p);

/**
 * mw_dir_connect() - connect to the process published as @name: look it
 * up, mw_connect() to its addresses with @opts, and, when it serves
 * regions, take its region table (the first message, within
 * opts->timeout_ms).  So a decode worker reaches "prefill/3" knowing only
 * the name.
 * Return: a future whose value is an mw_dir_peer_t * (the caller frees it
 * with mw_dir_peer_free, and its connection with mw_conn_close); fails with
 * mw_dir_lookup's and mw_connect's errors, or -EPROTO for a malformed
 * table.  NULL only when out of memory.
 */
MW_EXTERN mw_future_t *mw_dir_connect(mw_directory_t *d, const char *name, const mw_conn_opts_t *opts);

/**
 * mw_dir_comm_create() - mw_comm_create() with the ranks found through the
 * directory: this rank publishes "@job/rank/@rank" with its addresses and
 * a free port, waits until all @nranks ranks of the same run are
 * published, and connects the mesh as mw_comm_create does.
 *
 * A run: rank 0 draws a random run number and publishes it; the other
 * ranks take the one of the rank 0 they find and publish with it, and
 * form a communicator only from entries of that run, whose ranks check it
 * again in the mesh's handshake (the communicator's job identity is @job
 * and the run, with @opts->job when set).  So a stale entry
 * of an earlier run (a process killed, its lease not yet expired; or one
 * still alive) never joins: it is waited past until its rank publishes
 * anew.  A rank 0 that appears with a new run (it restarted) makes the
 * others start over with it.
 *
 * Return: as mw_comm_create: a future whose value is the mw_comm_t *;
 * -ETIMEDOUT at @opts->timeout_ms naming the ranks not found (or found
 * only from another run), -EINVAL for bad arguments, -ECANCELED when
 * cancelled (mw_future_cancel, or a deadline set on the future: the rank
 * stops at once).  Formed, the rank's entry stays published until
 * mw_dir_free() (or mw_dir_unpublish() of its name): peers watching
 * "@job/rank/" see a rank that dies leave.  A creation that fails or is
 * cancelled removes it.
 */
MW_EXTERN mw_future_t *mw_dir_comm_create(mw_directory_t *d, const char *job, int rank, int nranks,
                                          const mw_comm_opts_t *opts);

/** The allocator meshwire takes its own bookkeeping from (connections,
 *  futures, messages handed to you...), the C library's by default. */
typedef void *(*mw_malloc_fn)(size_t size);
typedef void *(*mw_realloc_fn)(void *ptr, size_t size);
typedef void *(*mw_calloc_fn)(size_t count, size_t size);
typedef void (*mw_free_fn)(void *ptr);

/**
 * mw_replace_allocator() - allocate meshwire's bookkeeping with these (to
 * count it, or to fail the Nth allocation in a test).  Not the memory of
 * mw_alloc (registered memory has its own arena), nor what libevent,
 * libibverbs and librdmacm allocate.  meshwire never asks for 0 bytes.
 * Return: 0, -EINVAL (one is NULL), or -EBUSY while meshwire holds memory
 * from the current allocator: call it before anything else, or once every
 * context, future and message is released.
 */
MW_EXTERN int mw_replace_allocator(mw_malloc_fn m, mw_realloc_fn r, mw_calloc_fn c,
                                   mw_free_fn f);

/**
 * mw_version() - the library version, "MAJOR.MINOR.PATCH".
 * Thread-safe; the string is static.
 */
MW_EXTERN const char *mw_version(void);

/**
 * mw_strerror() - describe an error returned by meshwire.
 * @err: a negative errno (a positive one is accepted too).
 * Return: a static string. Thread-safe.
 */
MW_EXTERN const char *mw_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* MESHWIRE_H */
