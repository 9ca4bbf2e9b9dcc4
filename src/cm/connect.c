/* The active side: for each address the peer offers (best subnet match
 * first), resolve the address from the local NIC on the peer's subnet,
 * resolve the route, connect with our handshake, check the peer's; every
 * step under a deadline, every failure recorded before the next address. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "core/alloc.h"
#include "core/dev.h"
#include "core/future.h"
#include "core/resolve.h"

static void try_next(struct mw__conn *c);

/* Whether the "; "-separated list @tried holds @entry whole. */
static bool listed(const char *tried, const char *entry)
{
    size_t n = strlen(entry);
    for (const char *p = tried; (p = strstr(p, entry)); p++)
        if ((p == tried || p[-1] == ' ') && (p[n] == '\0' || p[n] == ';'))
            return true;
    return false;
}

/* Record why the peer address @addr failed, for the connect's failure. */
static void note_failure(struct mw__conn *c, const char *addr, int err, const char *one)
{
    struct mw__conn_setup *s = c->setup;
    /* Over TCP after RDMA, a socket that reached no listener says less than
     * RDMA's error (a timeout: something may listen there and be stuck; a
     * device out of resources), unless RDMA could not reach the peer. */
    bool kept = s->over_tcp && !mw__tcp_reached(c) && s->attempt_err != -EHOSTUNREACH;
    if (!kept && s->attempt_err != -ECONNREFUSED && (err != -EHOSTUNREACH || !s->attempt_err))
        s->attempt_err = err;
    char entry[MW__ADDR_STRLEN + 200];
    snprintf(entry, sizeof entry, "%s%s: %s", addr,
             c->opts.transport == MW_TRANSPORT_TCP ? " over TCP" : "", one);
    size_t used = strlen(s->tried);
    if (!listed(s->tried, entry))     /* an address tried again, failing alike: once */
        snprintf(s->tried + used, sizeof s->tried - used, "%s%s", used ? "; " : "", entry);
    MW_LOG(c->ctx, MW_LOG_INFO, "connect to %s: %s", addr, one);
}

/* Record why this address failed and go on to the next. */
void mw__connect_attempt_failed(struct mw__conn *c, int err, const char *fmt, const char *detail)
{
    struct mw__conn_setup *s = c->setup;
    char addr[MW__ADDR_STRLEN], one[192];
    mw__addr_str((struct sockaddr *)&s->peers[s->next_peer - 1], addr, sizeof addr);
    snprintf(one, sizeof one, fmt, detail);
    note_failure(c, addr, err, one);
    mw__conn_disarm_timer(c);
    mw__conn_drop_attempt(c);
    try_next(c);
}

static void on_step_timeout(struct mw__conn *c)
{
    if (c->state == MW__CONN_RESOLVING_ADDR || c->state == MW__CONN_RESOLVING_ROUTE)
        c->setup->rdma_slow = true;
    char what[64];
    snprintf(what, sizeof what, "%s", mw__conn_state_str(c->state));
    mw__connect_attempt_failed(c, -ETIMEDOUT, "timed out %s", what);
}

/* No RDMA device on the routing table's way to a peer (pick_source). */
#define NO_RDMA_WAY (-2)

/* The local address on @peer's subnet to resolve it from (its index), or
 * -1: the routing table decides, or NO_RDMA_WAY: the route leaves from
 * @src, on no RDMA device. */
static int pick_source(struct mw__conn *c, const struct sockaddr *peer, struct sockaddr_storage *src)
{
    struct mw__cm *cm = c->ctx->layers[MW__LAYER_CM].state;
    const struct mw__nic *nics;
    size_t n;
    mw__cm_nics(cm, &nics, &n);
    int i = mw__nic_choose(nics, n, peer);
    char p[MW__ADDR_STRLEN];
    if (i < 0) {
        if (mw__nic_route_rdma(nics, n, peer, src) == 0) {
            mw__cm_nics_changed(cm);  /* listed before a device came back? */
            mw__cm_nics(cm, &nics, &n);
            if (mw__nic_route_rdma(nics, n, peer, src) == 0)
                return NO_RDMA_WAY;
        }
        MW_LOG(c->ctx, MW_LOG_INFO, "peer %s: no local RDMA address on its subnet, "
               "the routing table decides", mw__addr_str(peer, p, sizeof p));
        return -1;
    }
    *src = nics[i].addr;
    ((struct sockaddr_in *)src)->sin_port = 0;   /* same offset in sockaddr_in6 */
    char a[MW__ADDR_STRLEN];
    MW_LOG(c->ctx, MW_LOG_INFO, "peer %s: from %s on %s (%s/%d)", mw__addr_str(peer, p, sizeof p),
           mw__addr_str((struct sockaddr *)src, a, sizeof a), nics[i].dev, nics[i].ifname,
           nics[i].prefix_len);
    return i;
}

/* Every address failed over RDMA, none refused by a meshwire peer, none
 * slow to resolve (a loaded host's neighbour resolution, which passes: a
 * connect retried then goes over RDMA): the peer may have no RDMA, or none
 * its way; over TCP, in the same order.  Names not found left no address
 * to try (their failures say why). */
static bool on_to_tcp(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    if (!s->tcp_after || s->heard_no || s->rdma_slow || !s->npeers)
        return false;
    s->tcp_after = false;
    s->over_tcp = true;
    s->next_peer = 0;
    c->opts.transport = MW_TRANSPORT_TCP;
    mw__conn_set_transport(c, &mw__transport_tcp);
    return true;
}

/* A peer whose RDMA listener was not up yet when rdma_cm asked, and whose
 * TCP one was when the TCP pass reached it (both start in mw_listen), is
 * an RDMA peer: it says so by refusing the TCP hello, and RDMA goes first
 * again.  Once: the next TCP hello does not ask, and is taken. */
bool mw__connect_rdma_again(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    if (!s->over_tcp || s->rdma_again)
        return false;
    char addr[MW__ADDR_STRLEN];
    MW_LOG(c->ctx, MW_LOG_INFO, "connect to %s: its listener was starting: over RDMA again",
           mw__addr_str((struct sockaddr *)&s->peers[s->next_peer - 1], addr, sizeof addr));
    mw__conn_disarm_timer(c);
    mw__conn_drop_attempt(c);
    s->rdma_again = true;
    s->over_tcp = false;
    s->tcp_after = true;
    s->next_peer = 0;
    c->opts.transport = MW_TRANSPORT_AUTO;
    mw__conn_set_transport(c, &mw__transport_rdma);
    try_next(c);
    return true;
}

static void try_next(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    if (s->next_peer >= s->npeers && !on_to_tcp(c)) {
        mw__conn_fail(c, s->attempt_err ? s->attempt_err : -EHOSTUNREACH, "cannot connect: %s",
                      s->tried);
        return;
    }
    struct mw__cm *cm = c->ctx->layers[MW__LAYER_CM].state;
    struct sockaddr *peer = (struct sockaddr *)&s->peers[s->next_peer++];
    if (c->opts.transport == MW_TRANSPORT_TCP) {
        mw__conn_set_state(c, MW__CONN_CONNECTING);
        mw__conn_arm_timer(c, on_step_timeout);
        int rc = mw__tcp_connect(c, peer);
        if (rc < 0)
            mw__connect_attempt_failed(c, rc == -ECONNREFUSED ? rc : -EHOSTUNREACH,
                                       "cannot connect: %s", mw_strerror(rc));
        return;
    }
    struct sockaddr_storage src;
    int pick = pick_source(c, peer, &src);
    if (pick == NO_RDMA_WAY) {
        char a[MW__ADDR_STRLEN];
        mw__addr_str((struct sockaddr *)&src, a, sizeof a);
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "no RDMA device on the way to it "
                                   "(the route leaves from %s)", a);
        return;
    }
    int have_src = pick >= 0;
    struct rdma_cm_id *id;
    if (rdma_create_id(cm->ch, &id, c, RDMA_PS_TCP) < 0) {
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "rdma_create_id: %s", mw_strerror(-errno));
        return;
    }
    mw__conn_take_id(c, id);
    mw__conn_set_state(c, MW__CONN_RESOLVING_ADDR);
    mw__conn_arm_timer(c, on_step_timeout);
    if (rdma_resolve_addr(c->id, have_src ? (struct sockaddr *)&src : NULL, peer,
                          (int)c->opts.timeout_ms) < 0)
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "cannot resolve: %s", mw_strerror(-errno));
}

void mw__connect_fail(struct mw__conn *c, int err, const char *why)
{
    mw_future_t *f = c->setup->connect_f;
    if (!f)
        return;
    c->setup->connect_f = NULL;
    mw_future_fail(f, err, "%s", why);
    mw_future_unref(f);
}

/* Every peer's address is known (names looked up, or given up): nearest
 * subnet first, try them in turn. */
static void peers_ready(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    size_t n = 0;
    for (size_t i = 0; i < s->npeers; i++)      /* names not found drop out */
        if (s->peers[i].ss_family != AF_UNSPEC)
            s->peers[n++] = s->peers[i];
    s->npeers = n;
    const struct mw__nic *nics;
    size_t nn;
    mw__cm_nics(c->ctx->layers[MW__LAYER_CM].state, &nics, &nn);
    mw__nic_order(nics, nn, s->peers, s->npeers);
    try_next(c);
}

static void on_name(void *arg, int err, const char *numeric, const char *why)
{
    struct mw__name_lookup *nl = arg;
    struct mw__conn *c = nl->c;
    struct mw__conn_setup *s = c->setup;
    nl->l = NULL;
    if (!s->connect_f)                  /* failed or cancelled meanwhile */
        return;
    if (!err && (err = mw__addr_set_numeric(&s->peers[nl->i], numeric)) < 0)
        why = "an address the resolver gave is malformed";
    if (err)
        note_failure(c, s->names[nl->i], err == -EAGAIN ? -EAGAIN : -EHOSTUNREACH, why);
    if (!--s->lookups_left) {
        mw__conn_disarm_timer(c);
        peers_ready(c);
    }
}

/* The connect's deadline came with names still being looked up: they are
 * given up (their threads end alone), and what was found is tried. */
static void on_names_timeout(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    for (size_t i = 0; i < s->nnames; i++) {
        if (!s->lookups[i].l)
            continue;
        mw__lookup_cancel(s->lookups[i].l);
        s->lookups[i].l = NULL;
        char one[64];
        snprintf(one, sizeof one, "not looked up within %u ms", c->opts.timeout_ms);
        note_failure(c, s->names[i], -ETIMEDOUT, one);
    }
    s->lookups_left = 0;
    peers_ready(c);
}

/* Host names among the peers are looked up off the loop (a resolver that
 * hangs must not stall every transfer on it), under the connect's step
 * deadline.  Return: 0 (lookups_left of them under way) or -ENOMEM. */
static int names_look_up(struct mw__conn *c)
{
    struct mw__conn_setup *s = c->setup;
    size_t n = 0;
    s->nnames = s->npeers;
    for (size_t i = 0; i < s->npeers; i++)
        n += s->names[i] != NULL;
    if (!n)
        return 0;
    if (!(s->lookups = mw__calloc(s->npeers, sizeof *s->lookups)))
        return -ENOMEM;
    for (size_t i = 0; i < s->npeers; i++) {
        if (!s->names[i])
            continue;
        s->lookups[i] = (struct mw__name_lookup){.c = c, .i = i};
        int rc = mw__lookup_start(c->ctx, s->names[i], on_name, &s->lookups[i],
                                  &s->lookups[i].l);
        if (rc < 0) {
            note_failure(c, s->names[i], rc == -EAGAIN ? -EAGAIN : -EHOSTUNREACH,
                         rc == -EAGAIN ? "too many host names being looked up"
                                       : "cannot start looking it up");
            continue;
        }
        s->lookups_left++;
    }
    if (s->lookups_left)
        mw__conn_arm_timer(c, on_names_timeout);
    return 0;
}

/* The connect was cancelled or timed out: the attempt stops, the half-made
 * connection (nobody's) goes with its rdma_cm id and port, and the future
 * fails now: a caller's connect lends no memory. */
static void connect_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    struct mw__conn *c = arg;
    mw__conn_disarm_timer(c);
    mw__conn_fail(c, -ECANCELED, "connect cancelled");   /* fails connect_f */
    mw__conn_drop_attempt(c);
    mw__conn_maybe_finish(c);
}

mw_future_t *mw_connect(mw_ctx_t *ctx, const char *addrs, const mw_conn_opts_t *opts)
{
    mw_future_t *f = ctx ? mw_future_new(ctx) : NULL;
    if (!f)
        return NULL;
    if (!addrs || !*addrs) {      /* before any RDMA resource is touched */
        mw_future_fail(f, -EINVAL, "connect: no address given");
        return f;
    }
    struct mw__conn *c;
    int rc = mw__conn_new(ctx, MW__SIDE_ACTIVE, opts, &c);
    if (rc < 0) {
        mw_future_fail(f, rc, "connect to %s: %s", addrs ? addrs : "(null)",
                       rc == -EINVAL ? "bad options" : mw_strerror(rc));
        return f;
    }
    struct mw__conn_setup *s = c->setup;
    rc = mw__parse_addr_list_names(addrs, (uint16_t)c->opts.default_port, &s->peers,
                                   &s->npeers, &s->names);
    if (rc < 0 || s->npeers == 0) {
        mw_future_fail(f, rc < 0 ? rc : -EINVAL, "connect: bad address list \"%s\"",
                       addrs ? addrs : "(null)");
        mw__conn_free(c);
        return f;
    }
    s->connect_f = mw_future_ref(f);
    s->tcp_after = c->opts.transport == MW_TRANSPORT_AUTO;   /* and RDMA is here */
    mw__future_on_cancel(f, connect_cancel, c);
    if ((rc = names_look_up(c)) < 0) {
        mw__conn_fail(c, rc, "connect to %s: cannot look names up: %s", addrs,
                      mw_strerror(rc));
        return f;
    }
    if (!s->lookups_left)
        peers_ready(c);
    return f;
}

static void on_route_resolved(struct mw__conn *c)
{
    char why[160];
    int rc = mw__conn_setup_qp(c, why, sizeof why);
    if (rc == -EINPROGRESS) {         /* local work, bounded: no step deadline */
        mw__conn_disarm_timer(c);
        return;
    }
    if (rc < 0) {
        mw__connect_attempt_failed(c, rc, "%s", why);
        return;
    }
    uint8_t pd[MW__HELLO_LEN];
    struct rdma_conn_param p;
    mw__conn_param(c, pd, &p);
    mw__conn_set_state(c, MW__CONN_CONNECTING);
    mw__conn_arm_timer(c, on_step_timeout);
    if (rdma_connect(c->id, &p) < 0)
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "rdma_connect: %s", mw_strerror(-errno));
}

void mw__connect_device_ready(struct mw__conn *c, int err)
{
    if (err)
        mw__connect_attempt_failed(c, err, "%s", c->path.dev->why[0] ? c->path.dev->why
                                                    : "the RDMA device could not register memory");
    else
        on_route_resolved(c);
}

void mw__connect_established(struct mw__conn *c, const void *pd, size_t len)
{
    const char *why = "";
    if (mw__conn_take_peer_hello(c, pd, len, &why) < 0) {
        mw__conn_fail(c, -EPROTO, "%s is not a meshwire peer: %s", c->stats.remote, why);
        return;
    }
    char buf[160];
    int rc = mw__local_established(c, buf, sizeof buf);
    if (rc < 0) {
        mw__conn_fail(c, rc, "%s", buf);
        return;
    }
    if (!c->id && (rc = mw__tcp_setup_done(c)) < 0) {   /* the path is decided */
        mw__conn_fail(c, rc, "cannot start the connection's queue pair: %s", mw_strerror(rc));
        return;
    }
    mw__conn_established(c);
    if (c->state != MW__CONN_ESTABLISHED)
        return;
    if (c->setup->over_tcp)
        MW_LOG(c->ctx, MW_LOG_WARN, "%s: over TCP, not reachable over RDMA (%s)",
               c->stats.remote, c->setup->tried);
    mw_future_t *f = c->setup->connect_f;
    c->setup->connect_f = NULL;
    mw__conn_hand_over(c);        /* the caller owns c from here */
    mw_future_resolve(f, mw__conn_handle(c));
    mw_future_unref(f);
}

/* A meshwire peer said no, with its reason (not rdma_cm for nobody). */
static bool refused_by_meshwire(const struct rdma_cm_event *ev)
{
    const char *pd = ev->param.conn.private_data;
    return pd && ev->param.conn.private_data_len > 4 && !memcmp(pd, MW__REJECT_TAG, 4);
}

static const char *reject_reason(struct rdma_cm_event *ev, char *buf, size_t cap)
{
    const char *pd = ev->param.conn.private_data;
    size_t n = ev->param.conn.private_data_len;
    if (refused_by_meshwire(ev)) {
        snprintf(buf, cap, "%.*s", (int)strnlen(pd + 4, n - 4), pd + 4);
        return buf;
    }
    /* Nothing listens on the port: rdma_cm answers with IB CM reason 28
     * ("consumer defined") over the wire, 8 ("invalid service ID") within a
     * node. */
    if (ev->status == 28 || ev->status == 8)
        snprintf(buf, cap, "connection refused (nothing listening?)");
    else
        snprintf(buf, cap, "rejected (IB CM reason %d)", ev->status);
    return buf;
}

void mw__connect_event(struct mw__conn *c, struct rdma_cm_event *ev)
{
    char buf[96];
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        mw__conn_set_state(c, MW__CONN_RESOLVING_ROUTE);
        mw__conn_arm_timer(c, on_step_timeout);
        if (rdma_resolve_route(c->id, (int)c->opts.timeout_ms) < 0)
            mw__connect_attempt_failed(c, -EHOSTUNREACH, "cannot resolve the route: %s", mw_strerror(-errno));
        return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        on_route_resolved(c);
        return;
    case RDMA_CM_EVENT_ESTABLISHED:
        mw__connect_established(c, ev->param.conn.private_data,
                                ev->param.conn.private_data_len);
        return;
    case RDMA_CM_EVENT_ADDR_ERROR:
        c->setup->rdma_slow |= ev->status == -ETIMEDOUT;
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "address resolution failed: %s", mw_strerror(ev->status));
        return;
    case RDMA_CM_EVENT_ROUTE_ERROR:
        c->setup->rdma_slow |= ev->status == -ETIMEDOUT;
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "route resolution failed: %s", mw_strerror(ev->status));
        return;
    case RDMA_CM_EVENT_UNREACHABLE:
        mw__connect_attempt_failed(c, -EHOSTUNREACH, "unreachable: %s", mw_strerror(ev->status));
        return;
    case RDMA_CM_EVENT_CONNECT_ERROR:
        mw__connect_attempt_failed(c, -ECONNRESET, "connect error: %s", mw_strerror(ev->status));
        return;
    case RDMA_CM_EVENT_REJECTED:
        c->setup->heard_no |= refused_by_meshwire(ev);
        c->setup->rdma_nobody |= !refused_by_meshwire(ev);
        mw__connect_attempt_failed(c, -ECONNREFUSED, "%s", reject_reason(ev, buf, sizeof buf));
        return;
    default:
        mw__conn_common_event(c, ev);
    }
}
