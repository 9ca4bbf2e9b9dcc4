/* The same-host path of a connection (lqp.h says what it carries and how).
 *
 * Who is on this host: the handshake carries a host identity, a hash of
 * the boot id and of the network and pid namespaces and user this process
 * runs in; equal identities mean the peer's unix sockets (abstract names are
 * per network namespace) and its memory (cross-memory attach needs its pid
 * and the kernel's leave to trace it) may be within reach.  A process that
 * the kernel would not let attach (Yama's ptrace_scope without
 * CAP_SYS_PTRACE) has no identity and never offers.
 *
 * The rendezvous decides, before the connection is established, so that
 * whatever refuses it leaves the connection on the device:
 *   1. The connecting side offers only when the peer's address is one of
 *      this host's own: it listens on an abstract unix socket named by a
 *      random nonce, sent in its handshake (rdma_connect).
 *   2. The accepting side, when the identities match, connects to it before
 *      accepting and greets: a HELLO naming the nonce and where its own copy
 *      of the nonce lies.  The connecting side takes the greeting only from
 *      a process of its own user (SO_PEERCRED, checked as it is accepted:
 *      other users' connections are closed before they hold anything), opens
 *      a pidfd, reads the nonce out of the greeter's memory by cross-memory
 *      attach (a non-dumpable or confined process refuses that), and answers
 *      the same way; the accepting side checks the answer likewise.
 *   3. The accepting side accepts saying whether it took the channel; any
 *      failure, refusal or silence (within half the step timeout) means no,
 *      and both sides' receives go to the queue pair.
 * Each side copies with the pid the socket names, checked against the
 * pidfd before every copy (lqp.c), so a pid reused by another process is
 * never reached. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/lqp.h"
#include "core/alloc.h"
#include "mem/mem.h"

/* The setup of a connection's same-host channel (c->path.rv), gone once the
 * accepting side decided (passive) or the connection is established
 * (active). */
struct mw__rendezvous {
    struct mw__conn *c;
    uint64_t nonce;               /* names the socket; the word the peer reads */
    int lfd;                      /* connecting side: the socket it listens on */
    int fd;                       /* the channel, being greeted */
    pid_t pid;                    /* its peer (SO_PEERCRED) */
    struct event *lev, *ev;
    uint8_t buf[32];
    size_t got;
};

/* A random non-zero 64-bit value. */
static int random64(uint64_t *v)
{
    for (*v = 0; !*v;)
        if (getrandom(v, sizeof *v, 0) != sizeof *v && errno != EINTR)
            return -errno;
    return 0;
}

/* --- who is on this host --------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (const uint8_t *b = p; n--; b++)
        h = (h ^ *b) * 0x100000001b3ull;
    return h;
}

static uint64_t ns_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Whether the kernel lets this process attach to a peer of the same user. */
static bool may_attach(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = 0;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = 3;
        fclose(f);
    }
    if (scope == 0)
        return true;
    if (scope >= 3)
        return false;
    unsigned long long eff = 0;   /* else only with CAP_SYS_PTRACE (bit 19) */
    char line[128];
    if ((f = fopen("/proc/self/status", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "CapEff: %llx", &eff) == 1)
                break;
        fclose(f);
    }
    return eff >> 19 & 1;
}

static uint64_t identity(void)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return 0;
    bool ok = fgets(boot, sizeof boot, f) != NULL;
    fclose(f);
    uint64_t net = ns_inode("/proc/self/ns/net"), pid = ns_inode("/proc/self/ns/pid");
    uid_t uid = geteuid();
    if (!ok || !net || !pid || !may_attach())
        return 0;
    uint64_t h = fnv(0xcbf29ce484222325ull, boot, strlen(boot));
    h = fnv(h, &net, sizeof net);
    h = fnv(h, &pid, sizeof pid);
    h = fnv(h, &uid, sizeof uid);
    return h ? h : 1;
}

uint64_t mw__host_identity(void)
{
    static _Atomic uint64_t cached;   /* 1 bit set below: computed */
    uint64_t v = cached;
    if (!v) {
        v = identity() | (1ull << 63);   /* 0 stays "none" once masked */
        cached = v;
    }
    v &= ~(1ull << 63);
    return v;
}

/* --- the connection's side ------------------------------------------------- */

static void no_disconnect(struct mw__conn *c)
{
    mw__conn_fail(c, -ECONNRESET, "the peer closed the same-host channel and no disconnect "
                  "followed within %u ms", c->opts.keepalive_ms);
}

/* Whether @c was set up over TCP: no rdma_cm disconnect will come. */
static bool set_up_over_tcp(const struct mw__conn *c)
{
    return c->opts.transport == MW_TRANSPORT_TCP;
}

static void on_ended(void *arg, int err, const char *why)
{
    struct mw__conn *c = arg;
    /* The peer closed its end (it closed the connection, or its process
     * ended): what it sent before is taken.  Set up over TCP, that is the
     * disconnect: the connection ends a turn later, after the callbacks of
     * what it took, as TCP's does (one that ends while the setup is still
     * under way ends once established: mw__local_up).  Set up over rdma_cm,
     * its disconnect follows (the kernel sends it for a process that dies
     * too), and the connection ends by that, as on the device path, in the
     * same order; should it never come, keepalive_ms later the connection
     * fails anyway (no probe runs on this path to notice). */
    if (err == -ECONNRESET && set_up_over_tcp(c)) {
        if (mw__conn_usable(c) && mw__conn_disconnected_later(c) < 0)
            mw__conn_fail(c, -ENOMEM, "same-host channel: %s", why);
    } else if (err == -ECONNRESET && c->state == MW__CONN_ESTABLISHED) {
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: %s", c->stats.remote, why);
        mw__conn_arm_timer_ms(c, no_disconnect, c->opts.keepalive_ms);
    } else if (err != -ECONNRESET) {
        mw__conn_fail(c, err, "same-host channel: %s", why);
    }
}

static const struct mw__lqp_ops lqp_ops = {mw__conn_peer_access, on_ended};

static int new_lqp(struct mw__conn *c)
{
    int rc = mw__lqp_new(c->ctx, &lqp_ops, c, c->opts.timeout_ms, &c->path.lqp);
    if (rc == 0)
        mw__conn_set_transport(c, &mw__transport_local);
    return rc;
}

/* The channel was not taken: receives go to the device's queue pair, or
 * to the one the TCP socket will carry. */
static int back_to_the_device(struct mw__conn *c)
{
    mw__lqp_free(c->path.lqp);
    c->path.lqp = NULL;
    mw__conn_set_transport(c, &mw__transport_rdma);
    int rc = set_up_over_tcp(c) ? mw__tcp_path(c) : 0;
    return rc < 0 ? rc : mw__msg_repost_recvs(c);
}

/* Whether the address @c connects to is one of this host's: a socket
 * binds to it (any of 127/8 too, which no interface lists; a host that
 * allows binding to foreign addresses, ip_nonlocal_bind, offers in vain to
 * a remote peer, whose host identity then differs). */
static bool peer_is_here(struct mw__conn *c)
{
    struct sockaddr_storage a;
    if (c->id)
        memcpy(&a, rdma_get_peer_addr(c->id), sizeof a);
    else if (mw__tcp_peer_addr(c, &a) < 0)
        return false;
    if (a.ss_family != AF_INET && a.ss_family != AF_INET6)
        return false;
    ((struct sockaddr_in *)&a)->sin_port = 0;   /* same offset in sockaddr_in6 */
    int fd = socket(a.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = a.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                           : sizeof(struct sockaddr_in6);
    bool here = fd >= 0 && bind(fd, (struct sockaddr *)&a, len) == 0;
    if (fd >= 0)
        close(fd);
    return here;
}

static void socket_name(uint64_t nonce, struct sockaddr_un *a, socklen_t *len)
{
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "meshwire-%016llx",
                     (unsigned long long)nonce);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The process at the other end of @fd, when it is of this user and
 * visible in this pid namespace: its pid, else 0. */
static pid_t peer_of_this_user(int fd)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || cr.pid <= 0 ||
        cr.uid != geteuid())
        return 0;
    return cr.pid;
}

static bool exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

/* A pidfd for @pid whose process keeps @nonce at @addr, readable by
 * cross-memory attach (the kernel allows it both ways for the same pair:
 * PTRACE_MODE_ATTACH), else -1 with *@why. */
static int probe(pid_t pid, uint64_t addr, uint64_t nonce, const char **why)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        *why = "no pidfd for the peer's process";
        return -1;
    }
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, r = {(void *)(uintptr_t)addr, sizeof v};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    *why = n < 0 && errno == EPERM ? "the kernel refuses cross-memory attach to the peer "
                                     "(non-dumpable, or a security module)"
           : n != sizeof v || v != nonce ? "the peer's process does not hold the nonce"
           : exited(pidfd) ? "the peer's process ended" : NULL;
    if (*why) {
        close(pidfd);
        return -1;
    }
    return pidfd;
}

static int rv_new(struct mw__conn *c, uint64_t nonce)
{
    struct mw__rendezvous *rv = mw__calloc(1, sizeof *rv);
    if (!rv)
        return -ENOMEM;
    *rv = (struct mw__rendezvous){.c = c, .nonce = nonce, .lfd = -1, .fd = -1};
    c->path.rv = rv;
    return 0;
}

/* Stop watching descriptor *@fd (its event *@ev, if any) and close it. */
static void rv_close(struct mw__rendezvous *rv, int *fd, struct event **ev)
{
    if (*ev) {
        mw__unwatch_fd(rv->c->ctx, *fd);
        event_free(*ev);
        *ev = NULL;
    }
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void rv_close_channel(struct mw__rendezvous *rv)
{
    rv_close(rv, &rv->fd, &rv->ev);
    rv->got = 0;
}

static void rv_close_listener(struct mw__rendezvous *rv)
{
    rv_close(rv, &rv->lfd, &rv->lev);
}

/* The rendezvous ends (its sockets close; the channel, taken, is the
 * queue pair's now). */
static void local_drop(struct mw__conn *c)
{
    struct mw__rendezvous *rv = c->path.rv;
    if (!rv)
        return;
    rv_close_channel(rv);
    rv_close_listener(rv);
    mw__free(rv);
    c->path.rv = NULL;
}

/* Watch @fd for @fn, within @ms (0: no deadline). */
static int rv_watch(struct mw__rendezvous *rv, int fd, struct event **ev, event_callback_fn fn,
                    unsigned ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!(*ev = event_new(rv->c->ctx->base, fd, EV_READ | EV_PERSIST, fn, rv)))
        return -ENOMEM;
    int rc = mw__watch_fd(rv->c->ctx, fd);
    if (rc < 0) {
        event_free(*ev);
        *ev = NULL;
        return rc;
    }
    mw__ev_add(rv->c->ctx, *ev, ms ? &tv : NULL);
    return 0;
}

/* How long the accepting side waits for the channel before it accepts
 * without: well within the connecting side's step deadline. */
static unsigned rendezvous_ms(const struct mw__conn *c)
{
    return c->opts.timeout_ms / 2 ? c->opts.timeout_ms / 2 : 1;
}

/* Take channel @fd to @pid, checked: the queue pair carries it from now on
 * (after @first, if any). */
static int take_channel(struct mw__rendezvous *rv, int pidfd, const uint8_t *first)
{
    int fd = rv->fd;
    if (rv->ev) {
        mw__unwatch_fd(rv->c->ctx, fd);
        event_free(rv->ev);
        rv->ev = NULL;
    }
    rv->fd = -1;
    return mw__lqp_attach(rv->c->path.lqp, fd, rv->pid, pidfd, first);
}

/* --- the connecting side ----------------------------------------------------- */

/* The accepting side's greeting: checked, answered, and the channel taken;
 * anything else closes it (that side accepts without it then). */
static void on_greeting(evutil_socket_t fd, short what, void *arg)
{
    struct mw__rendezvous *rv = arg;
    struct mw__conn *c = rv->c;
    uint64_t nonce = 0, addr = 0;
    int rc = what & EV_TIMEOUT ? -ETIMEDOUT : mw__lqp_read_hello((int)fd, rv->buf, &rv->got,
                                                                  &nonce, &addr);
    if (rc == 0)
        return;                   /* more to come */
    const char *why = rc == -ETIMEDOUT ? "said nothing" : "sent no greeting";
    int pidfd = rc == 1 && nonce == rv->nonce ? probe(rv->pid, addr, nonce, &why) : -1;
    if (rc == 1 && nonce != rv->nonce)
        why = "named another connection";
    if (pidfd < 0) {
        MW_LOG(c->ctx, MW_LOG_INFO, "%s: same-host greeting from process %d refused (%s)",
               c->stats.remote, (int)rv->pid, why);
        rv_close_channel(rv);
        return;
    }
    uint8_t answer[32];
    mw__lqp_hello(rv->nonce, &rv->nonce, answer);
    rv_close_listener(rv);        /* one channel per connection */
    if ((rc = take_channel(rv, pidfd, answer)) < 0)
        MW_LOG(c->ctx, MW_LOG_WARN, "%s: cannot take the same-host channel: %s",
               c->stats.remote, mw_strerror(rc));
}

static void on_channel_accept(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    struct mw__rendezvous *rv = arg;
    int fd;
    while ((fd = accept4((int)lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        pid_t pid = peer_of_this_user(fd);
        if (!pid || rv->fd >= 0) {    /* another user's, or a second at once */
            MW_LOG(rv->c->ctx, MW_LOG_DEBUG, "%s: same-host socket: %s dropped", rv->c->stats.remote,
                   pid ? "a second greeter" : "a process of another user");
            close(fd);
            continue;
        }
        rv->fd = fd;
        rv->pid = pid;
        if (rv_watch(rv, fd, &rv->ev, on_greeting, rendezvous_ms(rv->c)) < 0)
            rv_close_channel(rv);
    }
}

int mw__local_offer(struct mw__conn *c)
{
    if (!c->local_ok || !mw__host_identity() || !peer_is_here(c))
        return 0;
    uint64_t nonce;
    int rc = random64(&nonce);
    if (rc == 0 && (rc = rv_new(c, nonce)) == 0) {
        struct mw__rendezvous *rv = c->path.rv;
        struct sockaddr_un a;
        socklen_t len;
        socket_name(nonce, &a, &len);
        rv->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (rv->lfd < 0 || bind(rv->lfd, (struct sockaddr *)&a, len) < 0 || listen(rv->lfd, 16) < 0)
            rc = -errno;
        else
            rc = rv_watch(rv, rv->lfd, &rv->lev, on_channel_accept, 0);
    }
    if (rc == 0)
        rc = new_lqp(c);
    if (rc < 0) {
        local_drop(c);
        if (rc == -ENOMEM)
            return rc;
        MW_LOG(c->ctx, MW_LOG_WARN, "same-host path unavailable (%s): over the device",
               mw_strerror(rc));
    }
    return 0;
}

int mw__local_established(struct mw__conn *c, char *why, size_t cap)
{
    if (c->path.tp != &mw__transport_local)
        return 0;
    bool taken = c->peer.flags & MW__HELLO_LOCAL, attached = mw__lqp_peer(c->path.lqp) != 0;
    local_drop(c);
    if (taken && !attached) {
        snprintf(why, cap, "the peer took a same-host channel that was never opened");
        return -EPROTO;
    }
    if (taken)
        return 0;
    MW_LOG(c->ctx, MW_LOG_INFO, "%s: the peer did not take the same-host channel: over the device",
           c->stats.remote);
    int rc = back_to_the_device(c);
    if (rc < 0)
        snprintf(why, cap, "reposting receives on the queue pair failed: %s", mw_strerror(rc));
    return rc;
}

/* --- the accepting side ------------------------------------------------------ */

int mw__local_take(struct mw__conn *c)
{
    uint64_t host = mw__host_identity();
    if (!c->local_ok || !(c->peer.flags & MW__HELLO_LOCAL) || !host ||
        c->peer.host != host || !c->peer.nonce)
        return 0;
    int rc = rv_new(c, c->peer.nonce);
    if (rc == 0 && (rc = new_lqp(c)) < 0)
        local_drop(c);
    return rc;
}

/* The rendezvous is over: the channel taken or not, the accept goes on. */
static void decided(struct mw__conn *c, const char *declined)
{
    int rc = 0;
    local_drop(c);
    if (declined) {
        MW_LOG(c->ctx, MW_LOG_INFO, "%s: same-host channel not taken (%s): over the device",
               c->stats.remote, declined);
        rc = back_to_the_device(c);
    }
    mw__accept_local_ready(c, rc);
}

static void on_answer(evutil_socket_t fd, short what, void *arg)
{
    struct mw__rendezvous *rv = arg;
    uint64_t nonce = 0, addr = 0;
    int rc = what & EV_TIMEOUT ? -ETIMEDOUT : mw__lqp_read_hello((int)fd, rv->buf, &rv->got,
                                                                  &nonce, &addr);
    if (rc == 0)
        return;
    const char *why = rc == -ETIMEDOUT ? "no answer in time" : "the peer closed the channel";
    int pidfd = rc == 1 && nonce == rv->nonce ? probe(rv->pid, addr, nonce, &why) : -1;
    if (rc == 1 && nonce != rv->nonce)
        why = "an answer naming another connection";
    if (pidfd >= 0 && (rc = take_channel(rv, pidfd, NULL)) < 0)
        why = mw_strerror(rc);
    decided(rv->c, pidfd >= 0 && rc >= 0 ? NULL : why);
}

int mw__local_rendezvous(struct mw__conn *c)
{
    struct mw__rendezvous *rv = c->path.rv;
    if (!rv)
        return 0;
    struct sockaddr_un a;
    socklen_t len;
    socket_name(rv->nonce, &a, &len);
    uint8_t hello[32];
    mw__lqp_hello(rv->nonce, &rv->nonce, hello);
    const char *why = NULL;
    rv->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (rv->fd < 0 || connect(rv->fd, (struct sockaddr *)&a, len) < 0)
        why = "cannot reach the peer's socket";
    else if (!(rv->pid = peer_of_this_user(rv->fd)))
        why = "the socket is another user's";
    else if (send(rv->fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof hello)
        why = "cannot greet the peer";
    else if (rv_watch(rv, rv->fd, &rv->ev, on_answer, rendezvous_ms(c)) < 0)
        why = "out of memory";
    if (!why)
        return 1;                 /* on_answer goes on */
    decided(c, why);
    return 1;
}

void mw__local_up(struct mw__conn *c)
{
    if (c->path.tp == &mw__transport_local && set_up_over_tcp(c) &&
        mw__lqp_ended(c->path.lqp) && mw__conn_disconnected_later(c) < 0)
        mw__conn_fail(c, -ENOMEM, "the same-host channel ended while setting up");
}

void mw__local_hello(const struct mw__conn *c, struct mw__hello *h)
{
    if (c->path.tp != &mw__transport_local)
        return;
    h->flags |= MW__HELLO_LOCAL;
    h->host = mw__host_identity();
    if (c->side == MW__SIDE_ACTIVE)
        h->nonce = c->path.rv ? c->path.rv->nonce : 0;
}

/* --- the same-host transport ------------------------------------------------- */

/* The device's completions (the setup's, a probe's) and the channel's. */
static void local_take_now(struct mw__conn *c)
{
    mw__transport_rdma.take_now(c);
    mw__lqp_path_take_now(c);
}

static void local_release(struct mw__conn *c)
{
    local_drop(c);
    mw__lqp_path_release(c);
}

/* Liveness is the peer process's (its pidfd) and the channel's end: a
 * probe would be answered only when the peer's loop runs (lqp.h). */
const struct mw__transport mw__transport_local = {
    .kind = MW_TRANSPORT_LOCAL,
    .via = ", data over the same-host path",
    .probes = false,
    .post_send = mw__lqp_path_post_send,
    .post_recv = mw__lqp_path_post_recv,
    .take_now = local_take_now,
    .stop = mw__lqp_path_stop,
    .peer_done = mw__lqp_path_peer_done,
    .quiescing = mw__lqp_path_quiescing,
    .settle = mw__lqp_path_settle,
    .release = local_release,
};
