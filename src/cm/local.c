/* The same-host path of a connection (lqp.h says what it carries and how).
 *
 * Who is on this host: the handshake carries a host identity, a hash of
 * the boot id and of the network and pid namespaces and user this process
 * runs in; equal identities mean the peer's unix sockets (abstract names are
 * per network namespace) and its memory (cross-memory attach needs its pid
 * and the kernel's leave to trace it) are within reach.  A process that the
 * kernel would not let attach (Yama's ptrace_scope without CAP_SYS_PTRACE)
 * has no identity and never offers.
 *
 * The rendezvous: the connecting side offers only when the peer's address
 * is one of this host's own (so no remote connection waits on the answer);
 * the accepting side takes the offer when the identities match, and answers
 * with its context's socket (an abstract name from a random nonce) and a
 * random token for the connection.  Once established, the connecting side
 * connects to that socket and greets with the token; the accepting side
 * finds the connection by it.  Until then what either side posts waits in
 * its local queue pair. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "cm/cm.h"
#include "cm/lqp.h"
#include "cm/nic.h"
#include "core/alloc.h"

#define GREETING_TIMEOUT_MS 5000  /* a local process that connects and says nothing */
#define PENDING_MAX 64

struct mw__local {                /* the context's socket (in struct mw__cm) */
    int fd;
    uint64_t nonce;
    struct event *ev;
    struct mw__list pending;      /* struct greeting: accepted, not yet named */
    unsigned npending;
};

struct greeting {
    struct mw__list link;
    mw_ctx_t *ctx;
    int fd;
    struct event *ev;
    uint8_t buf[32];
    size_t got;
};

/* A random non-zero 64-bit value (a token, a socket's nonce). */
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

/* The connection's transport as asked: its option, unless MW_TRANSPORT
 * forces the device.  -EINVAL for a value neither knows. */
int mw__local_transport(mw_ctx_t *ctx, mw_conn_opts_t *o)
{
    const char *env = getenv("MW_TRANSPORT");
    if (o->transport != MW_TRANSPORT_AUTO && o->transport != MW_TRANSPORT_RDMA)
        return -EINVAL;
    if (!env || !*env || !strcmp(env, "auto"))
        return 0;
    if (!strcmp(env, "rdma")) {
        o->transport = MW_TRANSPORT_RDMA;
        return 0;
    }
    MW_LOG(ctx, MW_LOG_ERROR, "MW_TRANSPORT=%s: expected rdma or auto", env);
    return -EINVAL;
}

/* --- the connection's side ------------------------------------------------- */

static int on_access(void *arg, uint32_t rkey, uint64_t addr, uint64_t len)
{
    return mw__rdma_export_covers(arg, rkey, addr, len) ? 0 : -EACCES;
}

static void on_ended(void *arg, int err, const char *why)
{
    struct mw__conn *c = arg;
    /* The peer closed its end (it closed the connection, or its process
     * ended): what it sent before is taken.  Its rdma_cm disconnect follows
     * (the kernel sends it for a process that dies too), and the connection
     * ends by that, as on the device path, in the same order and with the
     * same grace for completions; the keepalive covers a peer whose
     * disconnect never comes. */
    if (err == -ECONNRESET)
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: %s", c->stats.remote, why);
    else
        mw__conn_fail(c, err, "same-host channel: %s", why);
}

static const struct mw__lqp_ops lqp_ops = {on_access, on_ended};

static int new_lqp(struct mw__conn *c)
{
    int rc = mw__lqp_new(c->ctx, &lqp_ops, c, &c->lqp);
    if (rc == 0)
        c->stats.transport = MW_TRANSPORT_LOCAL;
    return rc;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return b->sa_family == AF_INET6 &&
           !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

/* Whether the address @c connects to is one of this host's. */
static bool peer_is_here(struct mw__conn *c)
{
    struct mw__cm *cm = c->ctx->layers[MW__LAYER_CM].state;
    const struct mw__nic *nics;
    size_t n;
    mw__cm_nics(cm, &nics, &n);
    const struct sockaddr *peer = rdma_get_peer_addr(c->id);
    for (size_t i = 0; i < n; i++)
        if (same_ip(&nics[i].addr, peer))
            return true;
    return false;
}

int mw__local_offer(struct mw__conn *c)
{
    if (c->opts.transport == MW_TRANSPORT_RDMA || !mw__host_identity() || !peer_is_here(c))
        return 0;
    return new_lqp(c);
}

static int listen_here(mw_ctx_t *ctx, struct mw__cm *cm);

int mw__local_take(struct mw__conn *c)
{
    struct mw__cm *cm = c->ctx->layers[MW__LAYER_CM].state;
    uint64_t host = mw__host_identity();
    if (c->opts.transport == MW_TRANSPORT_RDMA || !(c->peer.flags & MW__HELLO_LOCAL) || !host ||
        c->peer.host != host)
        return 0;
    int rc = listen_here(c->ctx, cm);
    if (rc < 0) {                 /* the device path still works */
        MW_LOG(c->ctx, MW_LOG_WARN, "same-host path unavailable (%s): over the device",
               mw_strerror(rc));
        return 0;
    }
    if ((rc = random64(&c->local_token)) < 0)
        return rc;
    return new_lqp(c);
}

void mw__local_hello(const struct mw__conn *c, struct mw__hello *h)
{
    if (!c->lqp)
        return;
    struct mw__cm *cm = c->ctx->layers[MW__LAYER_CM].state;
    h->flags |= MW__HELLO_LOCAL;
    h->host = mw__host_identity();
    if (c->side == MW__SIDE_PASSIVE) {
        h->nonce = cm->local->nonce;
        h->token = c->local_token;
    }
}

static void socket_name(uint64_t nonce, struct sockaddr_un *a, socklen_t *len)
{
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "meshwire-%016llx",
                     (unsigned long long)nonce);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The connecting side, established: take the path the peer answered, or
 * give the receives kept for it to the queue pair. */
int mw__local_established(struct mw__conn *c, char *why, size_t cap)
{
    if (!c->lqp)
        return 0;
    if (!(c->peer.flags & MW__HELLO_LOCAL) || !c->peer.token) {
        mw__lqp_free(c->lqp);     /* declined: receives go to the device */
        c->lqp = NULL;
        c->stats.transport = MW_TRANSPORT_RDMA;
        int rc = mw__msg_repost_recvs(c);
        if (rc < 0)
            snprintf(why, cap, "reposting receives on the queue pair failed: %s", mw_strerror(rc));
        return rc;
    }
    struct sockaddr_un a;
    socklen_t len;
    socket_name(c->peer.nonce, &a, &len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -errno : connect(fd, (struct sockaddr *)&a, len) < 0 ? -errno : 0;
    if (rc == 0)
        return mw__lqp_attach(c->lqp, fd, c->peer.token, true) < 0
                   ? (snprintf(why, cap, "same-host channel: the peer's process is not "
                                         "visible here"), -ESRCH)
                   : 0;
    if (fd >= 0)
        close(fd);
    snprintf(why, cap, "same-host channel: cannot reach the peer's socket: %s", mw_strerror(rc));
    return rc;
}

/* --- the context's socket -------------------------------------------------- */

static void greeting_free(struct mw__cm *cm, struct greeting *g, bool close_fd)
{
    mw__list_del(&g->link);
    cm->local->npending--;
    mw__unwatch_fd(g->ctx, g->fd);
    event_free(g->ev);
    if (close_fd)
        close(g->fd);
    mw__free(g);
}

static struct mw__conn *conn_of_token(struct mw__cm *cm, uint64_t token)
{
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link) {
        if (c->lqp && c->local_token == token && !mw__lqp_peer(c->lqp) &&
            c->side == MW__SIDE_PASSIVE && c->state != MW__CONN_FREED)
            return c;
    }
    return NULL;
}

static void on_greeting(evutil_socket_t fd, short what, void *arg)
{
    struct greeting *g = arg;
    mw_ctx_t *ctx = g->ctx;
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    uint64_t token = 0;
    int rc = what & EV_TIMEOUT ? -ETIMEDOUT : mw__lqp_read_greeting(fd, g->buf, &g->got, &token);
    if (rc == 0)
        return;                   /* more to come */
    struct mw__conn *c = rc == 1 ? conn_of_token(cm, token) : NULL;
    if (!c) {
        MW_LOG(ctx, MW_LOG_INFO, "same-host socket: a local process %s: dropped",
               rc == 1 ? "named no connection of ours" : rc == -ETIMEDOUT ? "said nothing"
                                                                          : "sent no greeting");
        greeting_free(cm, g, true);
        return;
    }
    greeting_free(cm, g, false);
    if ((rc = mw__lqp_attach(c->lqp, (int)fd, token, false)) < 0)
        mw__conn_fail(c, rc, "same-host channel: cannot take the peer's socket: %s",
                      mw_strerror(rc));
}

static void on_local_accept(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    mw_ctx_t *ctx = arg;
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        struct greeting *g = cm->local->npending < PENDING_MAX ? mw__calloc(1, sizeof *g) : NULL;
        struct timeval tv = {GREETING_TIMEOUT_MS / 1000, 0};
        if (g)
            *g = (struct greeting){.ctx = ctx, .fd = fd};
        if (!g || !(g->ev = event_new(ctx->base, fd, EV_READ | EV_PERSIST, on_greeting, g)) ||
            mw__watch_fd(ctx, fd) < 0) {
            if (g && g->ev)
                event_free(g->ev);
            mw__free(g);
            close(fd);
            continue;
        }
        mw__list_add_tail(&cm->local->pending, &g->link);
        cm->local->npending++;
        mw__ev_add(ctx, g->ev, &tv);
    }
}

static int listen_here(mw_ctx_t *ctx, struct mw__cm *cm)
{
    if (cm->local)
        return 0;
    struct mw__local *l = mw__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    mw__list_init(&l->pending);
    struct sockaddr_un a;
    socklen_t len;
    int rc = random64(&l->nonce);
    if (rc < 0) {
        mw__free(l);
        return rc;
    }
    socket_name(l->nonce, &a, &len);
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&a, len) < 0 || listen(l->fd, 128) < 0)
        rc = -errno;
    else if (!(l->ev = event_new(ctx->base, l->fd, EV_READ | EV_PERSIST, on_local_accept, ctx)))
        rc = -ENOMEM;
    else if ((rc = mw__watch_fd(ctx, l->fd)) == 0)
        mw__ev_add(ctx, l->ev, NULL);
    if (rc < 0) {
        if (l->ev)
            event_free(l->ev);
        if (l->fd >= 0)
            close(l->fd);
        mw__free(l);
        return rc;
    }
    cm->local = l;
    return 0;
}

void mw__local_free(mw_ctx_t *ctx, struct mw__cm *cm)
{
    struct mw__local *l = cm->local;
    if (!l)
        return;
    while (!mw__list_empty(&l->pending))
        greeting_free(cm, mw__container_of(l->pending.next, struct greeting, link), true);
    mw__unwatch_fd(ctx, l->fd);
    event_free(l->ev);
    close(l->fd);
    mw__free(l);
    cm->local = NULL;
}
