/* Connections without RDMA: set up over a TCP socket, which then carries
 * the connection's queue pair as a stream channel (lqp.h: every payload in
 * the stream, one-sided requests executed by the target's loop against its
 * exports).  Everything above the transport table is the code the device
 * path runs.
 *
 * The setup is rdma_cm's, over the socket: the connecting side connects
 * (nonblocking, under the step deadline) and sends its handshake as a
 * record -- 4 bytes of length, big-endian, then the same hello rdma_cm's
 * private data carries (wire.h); the accepting side reads it under its
 * deadline and answers with a record: its own hello (accepted), or
 * MW__REJECT_TAG and a reason (refused; it closes then).  Each side reads
 * exactly a record and nothing after it: what follows is the queue pair's,
 * which takes the socket at once.  A listener holds a socket being set up
 * under the same max_accepting and max_conns as an rdma_cm request.
 *
 * Liveness is the kernel's: it answers for a peer whose loop sleeps, and a
 * peer host that goes silent is cut by TCP's user timeout and keepalive
 * (keepalive_ms), as a closed socket is by its end. */
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/lqp.h"
#include "cm/nic.h"
#include "core/alloc.h"

/* A handshake record's body, at most: a hello, or a reason. */
#define RECORD_MAX 192u
/* Connections a listener takes from the kernel per loop turn. */
#define ACCEPTS_PER_TURN 16

/* A connection's socket while it is set up (c->setup->tcp). */
struct mw__tcp_setup {
    struct mw__conn *c;
    int fd;
    struct event *ev;
    void (*step)(struct mw__conn *c);   /* the socket is ready for it */
    uint8_t buf[4 + RECORD_MAX];
    size_t got;
    bool reached;                 /* connected: something listens there */
};

/* --- the socket ------------------------------------------------------------ */

/* Small records go out at once; an idle connection's silent peer host is
 * cut by the kernel's keepalive within about twice @keepalive_ms.  (Not
 * TCP_USER_TIMEOUT: it also cuts a peer whose window stays shut, i.e. a
 * live process outside its loop -- seen after 7 s of a 15 s stop.  While
 * data waits, silent_ms watches the acknowledgements instead.) */
static void tune(int fd, unsigned keepalive_ms)
{
    int one = 1, secs = (int)((keepalive_ms + 999) / 1000), cnt = 2;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof secs);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof secs);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* A record out, whole: the socket is fresh, its buffer takes it. */
static int write_record(int fd, const void *body, size_t len)
{
    uint8_t b[4 + RECORD_MAX];
    if (len > RECORD_MAX)
        return -EINVAL;
    b[0] = (uint8_t)(len >> 24), b[1] = (uint8_t)(len >> 16);
    b[2] = (uint8_t)(len >> 8), b[3] = (uint8_t)len;
    memcpy(b + 4, body, len);
    ssize_t n;
    while ((n = send(fd, b, 4 + len, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    return n == (ssize_t)(4 + len) ? 0 : n < 0 ? -errno : -EAGAIN;
}

/* Read at most the rest of one record: 1 once whole (*@body, *@len), 0
 * while not, -ECONNRESET (the peer closed), -EPROTO (longer than a
 * record can be), or the socket's error. */
static int read_record(struct mw__tcp_setup *t, const uint8_t **body, size_t *len)
{
    for (;;) {
        size_t n = t->got < 4 ? 0
                              : (size_t)t->buf[0] << 24 | (size_t)t->buf[1] << 16 |
                                    (size_t)t->buf[2] << 8 | t->buf[3];
        if (n > RECORD_MAX)
            return -EPROTO;
        size_t want = t->got < 4 ? 4 - t->got : 4 + n - t->got;
        if (t->got >= 4 && !want) {
            *body = t->buf + 4;
            *len = n;
            return 1;
        }
        ssize_t r = read(t->fd, t->buf + t->got, want);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        t->got += (size_t)r;
    }
}

static void on_socket(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__tcp_setup *t = arg;
    t->step(t->c);
}

/* Wait for @fd to be ready for @what, then run @step (mw_ctx_fd() wakes
 * for it too). */
static int await(struct mw__tcp_setup *t, short what, void (*step)(struct mw__conn *c))
{
    if (t->ev)
        event_free(t->ev);
    t->step = step;
    if (!(t->ev = event_new(t->c->ctx->base, t->fd, what | EV_PERSIST, on_socket, t)))
        return -ENOMEM;
    event_add(t->ev, NULL);
    mw__watch_fd_out(t->c->ctx, t->fd, what & EV_WRITE);
    return 0;
}

/* The network interface holding local address @a, into @name ("" if none
 * does): what mw_conn_stats() says carries a TCP connection. */
static void interface_of(const struct sockaddr *a, char *name, size_t cap)
{
    struct ifaddrs *ifa;
    name[0] = '\0';
    if (getifaddrs(&ifa) < 0)
        return;
    for (const struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        const struct sockaddr *x = i->ifa_addr;
        if (!x || x->sa_family != a->sa_family || !i->ifa_name)
            continue;
        bool same = a->sa_family == AF_INET
                        ? ((const struct sockaddr_in *)x)->sin_addr.s_addr ==
                              ((const struct sockaddr_in *)a)->sin_addr.s_addr
                        : !memcmp(&((const struct sockaddr_in6 *)x)->sin6_addr,
                                  &((const struct sockaddr_in6 *)a)->sin6_addr,
                                  sizeof(struct in6_addr));
        if (same) {
            snprintf(name, cap, "%.*s", (int)strcspn(i->ifa_name, ":"), i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifa);
}

/* @c's addresses and interface, as its socket @fd has them. */
static void names(struct mw__conn *c, int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        mw__addr_str((struct sockaddr *)&a, c->stats.local, sizeof c->stats.local);
        interface_of((struct sockaddr *)&a, c->stats.device, sizeof c->stats.device);
    }
    len = sizeof a;
    if (getpeername(fd, (struct sockaddr *)&a, &len) == 0)
        mw__addr_str((struct sockaddr *)&a, c->stats.remote, sizeof c->stats.remote);
}

/* @c sets up over @fd (taken, closed on failure too): 0 or -ENOMEM. */
static int setup_new(struct mw__conn *c, int fd)
{
    struct mw__tcp_setup *t = mw__calloc(1, sizeof *t);
    if (!t || mw__watch_fd(c->ctx, fd) < 0) {
        mw__free(t);
        close(fd);
        return -ENOMEM;
    }
    *t = (struct mw__tcp_setup){.c = c, .fd = fd};
    c->setup->tcp = t;
    tune(fd, c->opts.keepalive_ms);
    names(c, fd);
    return 0;
}

bool mw__tcp_reached(const struct mw__conn *c)
{
    return c->setup && c->setup->tcp && c->setup->tcp->reached;
}

void mw__tcp_setup_drop(struct mw__conn *c)
{
    struct mw__tcp_setup *t = c->setup ? c->setup->tcp : NULL;
    if (!t)
        return;
    if (t->ev)
        event_free(t->ev);
    if (t->fd >= 0) {
        mw__unwatch_fd(c->ctx, t->fd);
        close(t->fd);
    }
    mw__free(t);
    c->setup->tcp = NULL;
}

int mw__tcp_peer_addr(const struct mw__conn *c, struct sockaddr_storage *a)
{
    socklen_t len = sizeof *a;
    const struct mw__tcp_setup *t = c->setup ? c->setup->tcp : NULL;
    if (!t || t->fd < 0)
        return -ENOTCONN;
    return getpeername(t->fd, (struct sockaddr *)a, &len) < 0 ? -errno : 0;
}

/* The setup is over: the socket goes to the queue pair (which watches it
 * itself), or closes where the same-host channel carries the connection
 * (whose end is then the disconnect: local.c). */
int mw__tcp_setup_done(struct mw__conn *c)
{
    struct mw__tcp_setup *t = c->setup->tcp;
    int fd = t->fd;
    if (c->path.tp != &mw__transport_tcp) {
        mw__tcp_setup_drop(c);
        return 0;
    }
    mw__unwatch_fd(c->ctx, fd);
    t->fd = -1;
    mw__tcp_setup_drop(c);
    return mw__lqp_attach_stream(c->path.lqp, fd, NULL);
}

/* --- the transport ------------------------------------------------------------ */

/* The peer closed (or its host cut us).  What it sent before has been
 * taken, and the callbacks that takes are queued: the connection ends a
 * turn later, after them, as a device's disconnect event comes after its
 * completions -- a message sent just before closing (a communicator's
 * abort with its reason) is read before the end is. */
static void on_ended(void *arg, int err, const char *why)
{
    struct mw__conn *c = arg;
    if (err == -ECONNRESET && mw__conn_usable(c) && mw__conn_disconnected_later(c) == 0)
        return;
    mw__conn_fail(c, err, "TCP: %s", why);
}

static const struct mw__lqp_ops lqp_ops = {mw__conn_peer_access, on_ended};

int mw__tcp_path(struct mw__conn *c)
{
    int rc = mw__lqp_new(c->ctx, &lqp_ops, c, c->opts.timeout_ms, &c->path.lqp);
    if (rc == 0)
        mw__conn_set_transport(c, &mw__transport_tcp);
    return rc;
}

/* The kernel's word on the peer's host: ms since it last acknowledged
 * anything (data, a window or keepalive probe), once a retransmission
 * timed out or a window probe went unanswered since; else 0.  (Data
 * merely unacknowledged says nothing: after a quiet while, the last
 * acknowledgement is old when new data has just left.) */
static unsigned tcp_silent_ms(const struct mw__conn *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int fd = c->path.lqp ? mw__lqp_fd(c->path.lqp) : -1;
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
        return 0;
    return ti.tcpi_retransmits || ti.tcpi_probes ? ti.tcpi_last_ack_recv : 0;
}

const struct mw__transport mw__transport_tcp = {
    .kind = MW_TRANSPORT_TCP,
    .via = " over TCP",
    .probes = false,
    .reads = MW__LQP_READS,
    .silent_ms = tcp_silent_ms,
    .post_send = mw__lqp_path_post_send,
    .post_recv = mw__lqp_path_post_recv,
    .take_now = mw__lqp_path_take_now,
    .stop = mw__lqp_path_stop,
    .peer_done = mw__lqp_path_peer_done,
    .quiescing = mw__lqp_path_quiescing,
    .settle = mw__lqp_path_settle,
    .release = mw__lqp_path_release,
};

/* --- the connecting side ------------------------------------------------------ */

static void on_answer(struct mw__conn *c)
{
    const uint8_t *body;
    size_t len;
    int rc = read_record(c->setup->tcp, &body, &len);
    if (rc == 0)
        return;
    if (rc < 0) {
        mw__connect_attempt_failed(c, rc == -EPROTO ? -EPROTO : -ECONNRESET,
                                   "no answer to the handshake: %s", mw_strerror(rc));
        return;
    }
    if (len > 4 && !memcmp(body, MW__REJECT_TAG, 4)) {
        char reason[RECORD_MAX];
        snprintf(reason, sizeof reason, "%.*s", (int)strnlen((const char *)body + 4, len - 4),
                 body + 4);
        if (strcmp(reason, MW__REFUSE_RDMA_NOW) || !mw__connect_rdma_again(c))
            mw__connect_attempt_failed(c, -ECONNREFUSED, "%s", reason);
        return;
    }
    uint8_t hello[RECORD_MAX];   /* all of it: the record goes with the setup */
    memcpy(hello, body, len);
    mw__connect_established(c, hello, len);   /* then mw__tcp_setup_done */
}

static void on_connected(struct mw__conn *c)
{
    struct mw__tcp_setup *t = c->setup->tcp;
    int err = 0;
    socklen_t elen = sizeof err;
    if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
        err = errno;
    if (err) {
        mw__connect_attempt_failed(c, err == ECONNREFUSED ? -ECONNREFUSED : -EHOSTUNREACH,
                                   "%s", mw_strerror(-err));
        return;
    }
    t->reached = true;
    names(c, t->fd);              /* connected: the local address is known now */
    char why[160];
    int rc = mw__conn_setup_qp(c, why, sizeof why);
    uint8_t hello[MW__HELLO_LEN];
    if (rc == 0) {
        snprintf(why, sizeof why, "cannot send the handshake");
        rc = write_record(t->fd, hello, (size_t)mw__conn_hello(c, hello));
    }
    if (rc == 0) {
        snprintf(why, sizeof why, "no memory");
        rc = await(t, EV_READ, on_answer);
    }
    if (rc < 0)
        mw__connect_attempt_failed(c, rc, "%s", why);
}

int mw__tcp_connect(struct mw__conn *c, const struct sockaddr *peer)
{
    int fd = socket(peer->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    socklen_t len = peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    if (connect(fd, peer, len) < 0 && errno != EINPROGRESS) {
        int err = -errno;
        close(fd);
        return err;
    }
    int rc = setup_new(c, fd);
    if (rc == 0)
        rc = await(c->setup->tcp, EV_WRITE, on_connected);
    return rc;
}

/* --- the accepting side ------------------------------------------------------- */

static void on_hello(struct mw__conn *c)
{
    const uint8_t *body;
    size_t len;
    int rc = read_record(c->setup->tcp, &body, &len);
    if (rc == 0)
        return;
    if (rc < 0) {
        mw__accept_refuse(c, rc == -EPROTO ? -EPROTO : -ECONNABORTED,
                          rc == -EPROTO ? "not a meshwire handshake" : "closed in the handshake");
        return;
    }
    event_del(c->setup->tcp->ev);     /* nothing more is read here */
    mw__accept_hello(c, body, len);
}

int mw__tcp_accepting(struct mw__conn *c, int fd)
{
    int rc = setup_new(c, fd);
    return rc < 0 ? rc : await(c->setup->tcp, EV_READ, on_hello);
}

int mw__tcp_accept(struct mw__conn *c)
{
    uint8_t hello[MW__HELLO_LEN];
    int rc = write_record(c->setup->tcp->fd, hello, (size_t)mw__conn_hello(c, hello));
    if (rc == 0)
        rc = mw__tcp_setup_done(c);
    return rc;
}

void mw__tcp_reject(struct mw__conn *c, const char *why)
{
    struct mw__tcp_setup *t = c->setup ? c->setup->tcp : NULL;
    if (t)
        mw__tcp_refuse_fd(t->fd, why);
}

void mw__tcp_refuse_fd(int fd, const char *why)
{
    char b[RECORD_MAX];
    int n = snprintf(b, sizeof b, MW__REJECT_TAG "%s", why);
    if (n >= (int)sizeof b)
        n = sizeof b - 1;
    write_record(fd, b, (size_t)n + 1);   /* best effort: the peer may be gone */
}

/* --- listening ------------------------------------------------------------------ */

static void on_acceptable(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct mw__listener *l = arg;
    for (int i = 0; i < ACCEPTS_PER_TURN; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                MW_LOG(l->ctx, MW_LOG_WARN, "TCP listener: accept: %s", mw_strerror(-errno));
            return;
        }
        mw__listener_incoming_tcp(l, fd);
    }
}

int mw__tcp_listen(struct mw__listener *l, const struct sockaddr_storage *sa)
{
    int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    socklen_t len = sa->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                               : sizeof(struct sockaddr_in);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)sa, len) < 0 || listen(fd, 128) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    if (mw__watch_fd(l->ctx, fd) < 0) {
        close(fd);
        return -ENOMEM;
    }
    l->fd = fd;
    if (!(l->ev = event_new(l->ctx->base, fd, EV_READ | EV_PERSIST, on_acceptable, l))) {
        mw__tcp_unlisten(l);
        return -ENOMEM;
    }
    event_add(l->ev, NULL);
    return 0;
}

int mw__tcp_port(const struct mw__listener *l)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(l->fd, (struct sockaddr *)&a, &len) < 0)
        return -errno;
    return ntohs(((struct sockaddr_in *)&a)->sin_port);   /* same offset in sockaddr_in6 */
}

void mw__tcp_unlisten(struct mw__listener *l)
{
    if (l->ev)
        event_free(l->ev);
    l->ev = NULL;
    if (l->fd >= 0) {
        mw__unwatch_fd(l->ctx, l->fd);
        close(l->fd);
    }
    l->fd = -1;
}
