/* The connections layer, internal side: the per-context rdma_cm event
 * channel, listeners, and connections with their state machine.  Only
 * src/cm includes rdma_cma.h. */
#ifndef MW_CM_CM_H
#define MW_CM_CM_H

#include <stdbool.h>
#include <sys/socket.h>

#include <rdma/rdma_cma.h>

#include "core/ctx.h"
#include "core/list.h"
#include "cm/flow.h"
#include "cm/transport.h"
#include "cm/wire.h"

struct mw__dev;
struct mw__op;

/* What an rdma_cm id's context points at: dispatch by kind. */
enum mw__cm_kind { MW__CM_LISTENER = 1, MW__CM_CONN, MW__CM_SENTINEL };

struct mw__nic;
struct mw__lqp;
struct mw__sentinel;
struct mw__rendezvous;

struct mw__cm {
    mw_ctx_t *ctx;
    struct rdma_event_channel *ch;    /* NULL until RDMA is needed (mw__cm_rdma) */
    int no_rdma;                  /* why it could not be opened, last time */
    struct event *ev;
    struct mw__nic *nics;         /* local RDMA addresses, cached */
    size_t nnics;
    bool nics_valid;              /* dropped on ADDR_CHANGE / DEVICE_REMOVAL */
    struct mw__nic *ips;          /* this host's IP addresses, for TCP */
    size_t nips;
    struct mw__list conns;        /* every connection not yet freed */
    struct mw__list listeners;
    struct event *sync_ev;        /* after a device removal: librdmacm syncs */
    struct event *resume_ev;      /* connections a ready device lets go on */
    int sync_left;
    struct mw__sentinel *sentinels;   /* an id bound to each device (sentinel.c) */
};

enum mw__conn_state {
    MW__CONN_RESOLVING_ADDR,
    MW__CONN_RESOLVING_ROUTE,
    MW__CONN_CONNECTING,
    MW__CONN_ACCEPTING,
    MW__CONN_ESTABLISHED,
    MW__CONN_CLOSING,             /* graceful: draining pending work */
    MW__CONN_DISCONNECTING,       /* rdma_disconnect done, flushing */
    MW__CONN_BROKEN,              /* failed / peer gone: waiting to drain */
    MW__CONN_FREED,
};
const char *mw__conn_state_str(enum mw__conn_state s);

/* Which end made the connection, fixed at creation. */
enum mw__conn_side { MW__SIDE_ACTIVE, MW__SIDE_PASSIVE };

/* Who holds the connection's handle.  A connection is freed once nobody
 * does (PENDING or RELEASED) and it is drained (mw__conn_drained). */
enum mw__conn_owner {
    MW__OWNER_PENDING,            /* not handed over yet: connect future or
                                     accept callback still to come */
    MW__OWNER_CALLER,             /* the caller holds the handle */
    MW__OWNER_RELEASED,           /* closed or aborted: the handle is stale */
};

struct mw__listener {
    enum mw__cm_kind kind;        /* first: rdma_cm id context */
    uint64_t h;                   /* the handle the caller holds */
    mw_ctx_t *ctx;
    struct rdma_cm_id *id;        /* listening over rdma_cm, or NULL */
    int fd;                       /* listening over TCP, or -1 (tcp.c) */
    struct event *ev;
    mw_conn_opts_t opts;
    bool local_ok;                /* its connections may take the same-host
                                     path (auto was asked for) */
    mw_accept_fn cb;
    void *arg;
    mw_listener_stats_t stats;
    unsigned live;                /* connections accepted, not yet freed */
    struct mw__list link;
};

/* One operation in a connection's issue order: a message, a one-sided
 * transfer, or a write with immediate.  The queue posts them strictly in
 * that order (an operation's first work request only after the one
 * before it has posted its last), and RC executes them in posting order, so
 * a message sent after a write arrives after the write's data. */
enum mw__xfer_kind { MW__XFER_SEND, MW__XFER_RDMA };

struct mw__xfer {
    struct mw__list link;         /* in c->xfers.queue */
    struct mw__conn *c;
    enum mw__xfer_kind kind;
    mw_future_t *f;               /* NULL once completed (early, by a cancel) */
    unsigned out;                 /* work requests posted, not completed */
    bool all_posted;              /* nothing more will be posted */
    int err;                      /* why it failed (0: it has not) */
};

/* A send in progress: fragments go out as credits allow. */
struct mw__send {
    struct mw__xfer x;            /* first */
    const uint8_t *buf;           /* the caller's, until all is copied */
    size_t len, sent;             /* bytes handed to fragments so far */
    uint64_t msg_id;
    bool discard;                 /* cancelled half way: tell the peer to
                                     drop what it has of it */
};

/* One contiguous piece of a one-sided transfer, keys resolved: a batch
 * entry, or all of an mw_write/mw_read. */
struct mw__seg {
    uint8_t *local;
    uint64_t remote, len;
    uint32_t lkey, rkey;
};

struct mw_batch;

/* A one-sided transfer in progress: its segments go out in chunks (a
 * segment is split where longer than a chunk), several to a chain of
 * work requests, only a chain's last signalled.  Each request carries its
 * sequence number (mod 256) as its wr_id's position, so a completion
 * accounts for every request up to it (rdma.c). */
struct mw__rdma {
    struct mw__xfer x;            /* first; x.out counts work requests */
    struct mw__op *op;
    enum ibv_wr_opcode opcode;    /* RDMA_WRITE or RDMA_READ */
    bool with_imm;
    uint32_t imm;
    struct mw__seg one;           /* mw_write/mw_read: the only segment */
    const struct mw__seg *segs;   /* &one, or the batch's */
    size_t nsegs;
    struct mw_batch *batch;       /* held until the transfer goes, or NULL */
    size_t seg;                   /* posting: the segment, */
    uint64_t seg_off;             /* and how far into it */
    uint8_t seq_posted, seq_acked;/* requests posted / accounted for, mod 256 */
    uint32_t *ends;               /* batches: entries complete once request
                                     seq (mod 256) completes */
    size_t *done_out;             /* the caller's: entries complete, or NULL */
};

struct mw__recv_slot {
    struct mw__op *op;
    uint8_t *buf;
    bool posted;
    bool with_imm;                /* what arrived in it: a write with immediate */
    uint32_t len, imm;            /* (imm in host order) or a fragment of len */
};

struct mw__msgq {                 /* a received message waiting for mw_recv */
    struct mw__list link;
    mw_msg_t msg;
};

struct mw__waiter {               /* an mw_recv waiting for a message */
    struct mw__list link;
    mw_future_t *f;
    struct mw__conn *c;
};

/* What carries a connection's work: the device and the queue pair's
 * protection domain (conn.c sets them up), the transport posts go to
 * (transport.h) with its part, and the count of what is in flight on it
 * (transport.c alone changes that). */
struct mw__path {
    struct mw__dev *dev;
    struct mw__pd *pd;            /* its own: its keys work on no other QP */
    int cqe_reserved;             /* CQ entries reserved on dev */
    const struct mw__transport *tp;
    struct mw__lqp *lqp;          /* mw__transport_local's queue pair */
    struct mw__rendezvous *rv;    /* its channel's setup (local.c) */
    unsigned wr_out;              /* work requests posted, not completed */
    unsigned recv_out;            /* ... of which receives */
    bool stopped;                 /* rdma_disconnect done and the transport
                                     stopped: what is posted comes back as
                                     flushes (conn.c's disconnect) */
};

/* Two-sided messages (msg.c receives, send.c sends): registered slots and
 * the messages in and out of them. */
struct mw__msgs {
    unsigned max_frag;            /* payload bytes per fragment */
    uint8_t *recv_mem, *send_mem; /* registered */
    struct mw__recv_slot *slots;  /* opts.credits receive slots */
    unsigned *free_send;          /* stack of free send slot indexes */
    unsigned nfree_send, nsend;
    unsigned *early;              /* slots filled before we were established, */
    unsigned nearly;              /* in arrival order: taken once we are */
    struct mw__task early_task;
    uint64_t next_msg_id;
    struct mw__list recv_waiters; /* struct mw__waiter, in order */
    struct mw__list inbox;        /* struct mw__msgq not yet asked for */
    unsigned inbox_len;
    struct { uint8_t *buf; uint64_t id, total, got; bool active; } rx;
};

/* The operations in issue order (queue.c) and the one-sided chunks of
 * them in flight (rdma.c). */
struct mw__xfers {
    struct mw__list queue;        /* struct mw__xfer, in issue order */
    struct event *pump_ev;        /* zero timer: post more next turn */
    unsigned rdma_out;            /* chunks in flight */
    unsigned reads_out;           /* of which RDMA READs */
    unsigned max_reads;           /* the QP's reads in flight (max_rd_atomic) */
    uint64_t max_msg;             /* the port's max message size */
};

/* Whether the peer still answers (keepalive.c). */
struct mw__keepalive {
    struct event *probe_ev;       /* armed while anything waits */
    struct mw__op *probe_op;      /* the probe in flight, if any */
    uint64_t peer_heard, heard_at_probe;   /* receives and completions: the
                                             peer answered */
};

/* What only the setup of a connection needs: made with it, freed when it is
 * handed over (connect.c and listen.c use it; conn.c owns its life). */
struct mw__lookup;

/* A peer's host name being looked up (core/resolve.h) for a connect. */
struct mw__name_lookup {
    struct mw__conn *c;
    struct mw__lookup *l;         /* NULL once answered or given up */
    size_t i;                     /* its place in the setup's peers */
};

struct mw__conn_setup {
    /* active side: the addresses to try, and the connect future */
    mw_future_t *connect_f;
    struct sockaddr_storage *peers;
    size_t npeers, next_peer;
    char tried[384];              /* reasons per address, for the failure */
    int attempt_err;              /* the error to report when all failed:
                                     a refusal wins, then a timeout */
    char **names;                 /* host names among the peers, being looked
                                     up off the loop (NULL: literal) */
    size_t nnames;                /* entries of names and lookups (the peers
                                     before those not found dropped out) */
    struct mw__name_lookup *lookups;
    size_t lookups_left;
    bool tcp_after;               /* auto with RDMA here: when every address
                                     failed over RDMA, each is tried over TCP */
    bool over_tcp;                /* ... and that pass is on */
    bool heard_no;                /* a meshwire peer refused over RDMA: TCP
                                     would be refused alike */
    bool rdma_slow;               /* an address timed out resolving over
                                     RDMA: that may pass, so no TCP */
    bool rdma_nobody;             /* rdma_cm found nothing listening at an
                                     address: its TCP hello says so */
    bool rdma_again;              /* a listener reached over TCP said it
                                     listens over RDMA now: tried again */

    /* passive side: the listener it came through */
    struct mw__listener *listener;
    uint8_t peer_rd_depth;        /* the RDMA reads the peer asked to have
                                     outstanding, and will serve */
    uint8_t peer_rd_resources;

    bool accept_sent;             /* rdma_accept went out: the queue pair
                                     takes what the peer sends */
    bool dev_wait;                /* paused: the device opens, registers memory */
    struct mw__tcp_setup *tcp;    /* a TCP connection's socket, until its
                                     queue pair takes it (tcp.c) */
};

/* A connection: a small base (identity, state, error, stats) and its parts,
 * each changed by the files named at its type: the setup's (while set up),
 * the path that carries its work, the credits, messages, operations and
 * the keepalive. */
struct mw__conn {
    enum mw__cm_kind kind;        /* first: rdma_cm id context */
    uint64_t h;                   /* the caller's handle; 0 once released */
    mw_ctx_t *ctx;
    struct mw__list link;         /* in cm->conns */
    enum mw__conn_side side;
    enum mw__conn_owner owner;
    struct mw__listener *counted_by;  /* accepted: its listener's live count */
    enum mw__conn_state state;    /* change through mw__conn_set_state */
    int err;                      /* why it broke (0 while healthy) */
    char why[160];
    bool peer_left;               /* its disconnect came while our sends were
                                     out: waiting for their completions.  Not
                                     a state: an ESTABLISHED connection and a
                                     CLOSING one (closed in the grace) both
                                     wait so, and behave as they otherwise do */
    mw_conn_opts_t opts;
    bool local_ok;                /* the same-host path may carry it: its
                                     transport was left to meshwire (auto),
                                     whether set up over rdma_cm or TCP */
    struct mw__hello peer;        /* the peer's handshake */
    struct rdma_cm_id *id;
    struct {                      /* the current step's deadline */
        struct event *ev;
        void (*fn)(struct mw__conn *c);
    } deadline;
    mw_future_t *close_f;
    struct mw__task finish_task;  /* frees the conn from the loop */
    struct {                      /* mw_conn_on_imm's */
        mw_imm_fn fn;
        void *arg;
    } on_imm;
    mw_conn_stats_t stats;

    struct mw__conn_setup *setup; /* until handed over, then NULL */
    struct mw__path path;         /* what carries its work */
    struct mw__flow flow;         /* credits: flow.c alone writes them */
    struct mw__msgs msgs;
    struct mw__xfers xfers;
    struct mw__keepalive keepalive;
    struct mw__conn_export *exports; /* standing or withdrawn, mw_mem_export */
};

/* Whether @c is still being set up (before ESTABLISHED). */
static inline bool mw__conn_setting_up(const struct mw__conn *c)
{
    return c->state == MW__CONN_RESOLVING_ADDR || c->state == MW__CONN_RESOLVING_ROUTE ||
           c->state == MW__CONN_CONNECTING || c->state == MW__CONN_ACCEPTING;
}

/* Whether work may be posted on @c (established, or closing gracefully). */
static inline bool mw__conn_usable(const struct mw__conn *c)
{
    return c->state == MW__CONN_ESTABLISHED || c->state == MW__CONN_CLOSING;
}

/* Everything posted on @c came back (or can no longer): no completion will
 * ever name it again once its queue pair is gone. */
static inline bool mw__conn_drained(const struct mw__conn *c)
{
    return c->path.wr_out == 0 &&
           (c->path.stopped || (!(c->id && c->id->qp) && !c->path.lqp));
}

void mw__conn_peer_left_settle(struct mw__conn *c);

/* local.c: the same-host path, on a connection set up over rdma_cm or
 * over TCP (where the transport was left to meshwire: c->local_ok).  The
 * connecting side
 * offers it (mw__local_offer, before its receives are posted: they go to
 * the local queue pair) and, once the peer answered, keeps or gives up the
 * channel as it said (mw__local_established); the accepting side
 * takes an offer (mw__local_take, once the peer's hello is in) and, before
 * accepting, sets the channel up (mw__local_rendezvous: 1 when it runs,
 * calling mw__accept_local_ready() once decided, 0 when there is nothing to
 * do).  mw__local_hello() puts the offer or answer in a handshake;
 * mw__local_up() runs once the connection is established.  0 or
 * -errno (with @why).  The channel's transport is mw__transport_local. */
uint64_t mw__host_identity(void);
int mw__local_offer(struct mw__conn *c);
int mw__local_take(struct mw__conn *c);
int mw__local_rendezvous(struct mw__conn *c);
void mw__local_hello(const struct mw__conn *c, struct mw__hello *h);
int mw__local_established(struct mw__conn *c, char *why, size_t cap);
void mw__local_up(struct mw__conn *c);

/* tcp.c: connections over TCP.  mw__tcp_connect() starts connecting to
 * @peer (then mw__conn_setup_qp, the handshake, mw__connect_established);
 * mw__tcp_accepting() takes an accepted socket @fd and reads the peer's
 * handshake (then mw__accept_hello); mw__tcp_accept() answers it and
 * starts the queue pair (or closes the socket, where the same-host channel
 * was taken); mw__tcp_reject() and mw__tcp_refuse_fd() answer
 * no, with @why.  mw__tcp_path() is mw__conn_setup_qp's part for TCP (the
 * socket's queue pair); mw__tcp_peer_addr() the address connected to;
 * mw__tcp_setup_done() ends the connecting side's setup once the peer's
 * answer was taken (as mw__tcp_accept does the accepting side's);
 * mw__tcp_setup_drop() closes a socket still being set up (and
 * mw__tcp_reached() says whether it connected to a listener).  Listeners:
 * mw__tcp_listen() on @sa (l->fd, l->ev), mw__tcp_port(), mw__tcp_unlisten().
 * 0 or -errno. */
int mw__tcp_connect(struct mw__conn *c, const struct sockaddr *peer);
int mw__tcp_accepting(struct mw__conn *c, int fd);
int mw__tcp_accept(struct mw__conn *c);
void mw__tcp_reject(struct mw__conn *c, const char *why);
void mw__tcp_refuse_fd(int fd, const char *why);
int mw__tcp_path(struct mw__conn *c);
int mw__tcp_peer_addr(const struct mw__conn *c, struct sockaddr_storage *a);
int mw__tcp_setup_done(struct mw__conn *c);
void mw__tcp_setup_drop(struct mw__conn *c);
bool mw__tcp_reached(const struct mw__conn *c);
int mw__tcp_listen(struct mw__listener *l, const struct sockaddr_storage *sa);
int mw__tcp_port(const struct mw__listener *l);
void mw__tcp_unlisten(struct mw__listener *l);

/* cm.c: the layer, made at its first use; NULL with *@err (-ENOMEM). */
struct mw__cm *mw__cm_get(mw_ctx_t *ctx, int *err);
/* mw__cm_rdma() - open rdma_cm's event channel, unless open: 0, or the
 * reason this host has no RDMA (-ENODEV...), logged once. */
int mw__cm_rdma(struct mw__cm *cm);
/* mw__cm_transport() - the transport a connection with options @o takes,
 * set in o->transport (asked: MW__transport_asked): TCP as asked, or in
 * auto where this host has no RDMA; RDMA otherwise, with rdma_cm opened.
 * 0, or -errno when RDMA was asked for and cannot be had. */
int mw__cm_transport(struct mw__cm *cm, mw_conn_opts_t *o);
/* mw__cm_nics() - the local RDMA-backed addresses (listing them opens every
 * device, so the list is kept until an address or device changes). */
void mw__cm_nics(struct mw__cm *cm, const struct mw__nic **nics, size_t *n);
void mw__cm_nics_changed(struct mw__cm *cm);

/* conn.c */
/* mw__conn_of() / mw__listener_of() - the object behind a caller's handle,
 * for public call @fn, or NULL with *@err: -EINVAL (NULL, another kind),
 * -ESTALE (closed, aborted or freed), -EPERM (off the loop thread). */
struct mw__conn *mw__conn_of(const mw_conn_t *h, const char *fn, int *err);
/* mw__conn_future() - the start of every public operation on a connection:
 * the connection behind @h (in *@cp) and a new future for the operation,
 * or NULL with errno set (a stale handle, out of memory). */
mw_future_t *mw__conn_future(mw_conn_t *h, const char *fn, struct mw__conn **cp);
struct mw__listener *mw__listener_of(const mw_listener_t *h, const char *fn, int *err);
mw_conn_t *mw__conn_handle(const struct mw__conn *c);
/* listen.c: stop listening and free (teardown, mw_listener_free) */
void mw__listener_free(struct mw__listener *l);
int mw__conn_new(mw_ctx_t *ctx, enum mw__conn_side side, const mw_conn_opts_t *opts,
                 struct mw__conn **cp);
/* mw__conn_opts_check() - 0 when every field of @o is in its documented
 * range, else -EINVAL. */
int mw__conn_opts_check(const mw_conn_opts_t *o);
/* mw__conn_set_state() - move @c to @s; a move the life cycle does not
 * allow is an internal error (an assert in debug builds, a log line else). */
void mw__conn_set_state(struct mw__conn *c, enum mw__conn_state s);
/* metrics.c: the connections' families of mw_ctx_metrics (a layer hook). */
struct mw__metrics;
void mw__cm_metrics(mw_ctx_t *ctx, void *state, struct mw__metrics *m);
/* mw__conn_hand_over() - the caller holds @c from now on. */
void mw__conn_hand_over(struct mw__conn *c);
/* device, QP, buffers, receives; on failure @why says what ran out.
 * -EINPROGRESS: the device is still opening or registering memory
 * (c->setup->dev_wait set): the side's device_ready continues the setup. */
int mw__conn_setup_qp(struct mw__conn *c, char *why, size_t cap);
/* @dev, opening, is ready (or failed): @c goes on if it waited. */
void mw__conn_device_ready(struct mw__conn *c, struct mw__dev *dev, int err);
void mw__connect_device_ready(struct mw__conn *c, int err);   /* connect.c */
void mw__accept_device_ready(struct mw__conn *c, int err);    /* listen.c */
void mw__accept_local_ready(struct mw__conn *c, int err);     /* listen.c */
/* connect.c: the connect's future fails with @err and @why (if it waits). */
void mw__connect_fail(struct mw__conn *c, int err, const char *why);
/* connect.c: the current address failed (@err, @fmt with @detail), the
 * next one is tried; the peer accepted with handshake @pd of @len bytes. */
void mw__connect_attempt_failed(struct mw__conn *c, int err, const char *fmt, const char *detail);
void mw__connect_established(struct mw__conn *c, const void *pd, size_t len);
/* connect.c: the listener reached over TCP refused with MW__REFUSE_RDMA_NOW:
 * every address over RDMA again, once; false when that was done (the
 * refusal then fails the address). */
bool mw__connect_rdma_again(struct mw__conn *c);
/* listen.c: a TCP connection @fd came to @l; its handshake @pd came in; it
 * is refused with @err and @why. */
void mw__listener_incoming_tcp(struct mw__listener *l, int fd);
void mw__accept_hello(struct mw__conn *c, const void *pd, size_t len);
void mw__accept_refuse(struct mw__conn *c, int err, const char *why);
/* conn.c: our handshake into @pd: its length. */
int mw__conn_hello(const struct mw__conn *c, uint8_t pd[MW__HELLO_LEN]);
/* conn.c: the local key @c posts [addr, addr+len) under: its domain's on a
 * device, 0 without one (the range need only be registered memory).  0,
 * -EFAULT (not registered), or mw__mem_keys' errors. */
int mw__conn_lkey(const struct mw__conn *c, const void *addr, size_t len, uint32_t *lkey);
void mw__conn_param(const struct mw__conn *c, uint8_t pd[MW__HELLO_LEN],
                    struct rdma_conn_param *p);
int mw__conn_take_peer_hello(struct mw__conn *c, const void *pd, size_t len, const char **why);
void mw__conn_established(struct mw__conn *c);
void mw__conn_fail(struct mw__conn *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mw__conn_on_disconnected(struct mw__conn *c);
/* mw__conn_disconnected_later() - a disconnect that the channel's end
 * stands for (set up over TCP: no rdma_cm event will come), taken a turn
 * later, after the callbacks of what was read before it; -ENOMEM. */
int mw__conn_disconnected_later(struct mw__conn *c);
void mw__conn_free(struct mw__conn *c);
void mw__conn_arm_timer(struct mw__conn *c, void (*fn)(struct mw__conn *c));
/* mw__conn_arm_timer_ms() - as mw__conn_arm_timer, in @ms; -ENOMEM. */
int mw__conn_arm_timer_ms(struct mw__conn *c, void (*fn)(struct mw__conn *c), unsigned ms);
void mw__conn_disarm_timer(struct mw__conn *c);
void mw__conn_maybe_finish(struct mw__conn *c);
void mw__conn_drop_attempt(struct mw__conn *c);    /* active: forget a failed try */
/* @c's rdma_cm id is @id from now on (its events name @c). */
void mw__conn_take_id(struct mw__conn *c, struct rdma_cm_id *id);
/* The setup was refused with @err (the peer told): @c goes once drained. */
void mw__conn_refused(struct mw__conn *c, int err);
/* rdma.c: the registrations of mw_mem_export go with the QP */
void mw__rdma_drop_exports(struct mw__conn *c);
/* mw__rdma_export_covers() - whether an export of @c standing under @rkey
 * covers [addr, addr+len): the same-host path's key check. */
bool mw__rdma_export_covers(const struct mw__conn *c, uint32_t rkey, uint64_t addr, uint64_t len);
/* mw__conn_peer_access() - the lqp's access check for connection @c (an
 * export of it covers the range, memory unmapped meanwhile taken first):
 * 0 or -EACCES. */
int mw__conn_peer_access(void *c, uint32_t rkey, uint64_t addr, uint64_t len);
void mw__conn_common_event(struct mw__conn *c, struct rdma_cm_event *ev);
void mw__cm_destroy_id_later(mw_ctx_t *ctx, struct rdma_cm_id *id);

/* sentinel.c: an id bound to each device of @nics that has none yet, so
 * that the context hears of the device's removal; dropped (destroyed
 * later) for @verbs' device, or for every device with NULL. */
void mw__sentinels_refresh(mw_ctx_t *ctx, struct mw__cm *cm, const struct mw__nic *nics,
                           size_t n);
void mw__sentinels_drop(mw_ctx_t *ctx, struct mw__cm *cm, const struct ibv_context *verbs);

/* connect.c / listen.c: rdma_cm events for each kind (a connection's
 * while it is set up; after that mw__conn_common_event's) */
void mw__connect_event(struct mw__conn *c, struct rdma_cm_event *ev);
void mw__listener_event(struct mw__listener *l, struct rdma_cm_event *ev);
/* mw__listener_refuse_orphan() - a connect request whose listener is gone
 * (device removed, listener freed): rejected, its id destroyed later. */
void mw__listener_refuse_orphan(mw_ctx_t *ctx, struct rdma_cm_id *id);
void mw__accepted_event(struct mw__conn *c, struct rdma_cm_event *ev);

/* queue.c: the operations of a connection, in issue order */
void mw__queue_add(struct mw__conn *c, struct mw__xfer *x, enum mw__xfer_kind kind,
                   mw_future_t *f);
void mw__conn_pump(struct mw__conn *c);            /* post what the queue's head allows */
/* mw__xfer_completed() - @n of @x's work requests completed (@err: how):
 * its future completes, and @x goes, once nothing more will be posted and
 * none is out. */
void mw__xfer_completed(struct mw__conn *c, struct mw__xfer *x, unsigned n, int err);
/* mw__xfer_complete_early() - complete @x's future now (x->err says how):
 * the caller's memory is no longer needed.  @x goes too when it is done. */
void mw__xfer_complete_early(struct mw__conn *c, struct mw__xfer *x);
/* Stop an operation where it is (cancelled, or no credits for too long):
 * send.c for messages, rdma.c for one-sided transfers, which complete
 * only once what they posted is back (the device reads and writes the
 * caller's memory until then). */
void mw__send_give_up(struct mw__conn *c, struct mw__send *s, int err);
void mw__rdma_give_up(struct mw__conn *c, struct mw__rdma *r, int err);
/* mw__queue_fail_all() - the connection failed: nothing more is posted,
 * every operation fails with @err once its work requests are back. */
void mw__queue_fail_all(struct mw__conn *c, int err, const char *why);
void mw__queue_drop_all(struct mw__conn *c);       /* at free: the QP is gone */
bool mw__queue_busy(const struct mw__conn *c);

/* rdma.c: one-sided transfers.  mw__rdma_new() makes a record for @c
 * (NULL: out of memory); the starter sets its segments (r->one, or a
 * batch's) and mw__rdma_queue() queues it for @f.  mw__rdma_free() releases
 * it once it left the queue.  mw__rdma_refusal() is why @c takes no
 * operation now (0 if it does, with *@why set otherwise). */
struct mw__rdma *mw__rdma_new(struct mw__conn *c, enum ibv_wr_opcode opcode, bool with_imm,
                              uint32_t imm);
void mw__rdma_queue(struct mw__conn *c, struct mw__rdma *r, mw_future_t *f);
void mw__rdma_free(struct mw__conn *c, struct mw__rdma *r);
int mw__rdma_refusal(const struct mw__conn *c, const char **why);
/* batch.c: a transfer is done with its batch */
void mw__batch_put(struct mw_batch *b);

/* send.c / rdma.c: each kind's posting, a budget of doorbells (calls of
 * ibv_post_send) at a time; they return the doorbells rung and set x.all_posted when
 * done.  Posting stops when the loop turn's work budget is spent
 * (mw__turn_may: rxe runs its send engine inside ibv_post_send), setting
 * @deferred; @no_credit is set when the operation waits for the peer's
 * credits. */
int mw__send_pump(struct mw__conn *c, struct mw__send *s, int budget, bool *deferred,
                  bool *no_credit);
int mw__rdma_pump(struct mw__conn *c, struct mw__rdma *r, int budget, bool *deferred,
                  bool *no_credit);
int mw__msg_return_credits(struct mw__conn *c);    /* a credit-only fragment */
/* The send slots, once the peer's slot count and size are known. */
int mw__send_slots_new(struct mw__conn *c);
void mw__send_slots_free(struct mw__conn *c);
void mw__recv_fail_all(struct mw__conn *c, int err, const char *why);
int mw__msg_post_recvs(struct mw__conn *c);
/* mw__msg_repost_recvs() - the receives kept for a same-host path the
 * peer declined, posted on the queue pair. */
int mw__msg_repost_recvs(struct mw__conn *c);
void mw__msg_free_buffers(struct mw__conn *c);
/* Established: take what arrived before (on the next loop turn, so an
 * accepted connection is handed over first). */
void mw__msg_established(struct mw__conn *c);
/* Take them now: the connection is about to fail (the peer left right
 * after establishment), and what it sent before still counts. */
void mw__msg_take_early(struct mw__conn *c);
/* keepalive.c: while anything waits on the peer, probe it when it is
 * silent; fail a send that waits for credits too long. */
void mw__keepalive_arm(struct mw__conn *c);
/* The peer answered: a receive or a completion of ours came. */
void mw__keepalive_heard(struct mw__conn *c);
/* The probe's record is gone with the queue pair's (nothing comes back). */
void mw__keepalive_drop(struct mw__conn *c);

#endif
