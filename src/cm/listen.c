/* The passive side: a listener checks each connect request's handshake,
 * rejects (with a reason, counted) whatever is not a meshwire peer of our
 * version, and hands established connections to its callback. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "core/alloc.h"
#include "core/dev.h"
#include "core/handle.h"

/* "", "*", ":PORT", "*:PORT" listen on every address; else an address. */
static int parse_listen_addr(const char *s, uint16_t port, struct sockaddr_storage *sa)
{
    if (!s || !*s || !strcmp(s, "*") || *s == ':' || !strncmp(s, "*:", 2)) {
        const char *p = !s ? NULL : *s == ':' ? s + 1 : !strncmp(s, "*:", 2) ? s + 2 : NULL;
        if (p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (!*p || *end || v < 0 || v > 65535)
                return -EINVAL;
            port = (uint16_t)v;
        }
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        memset(sa, 0, sizeof *sa);
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        return 0;
    }
    return mw__parse_addr(s, port, sa);
}

static int listen_rdma(struct mw__listener *l, struct mw__cm *cm, const struct sockaddr_storage *sa)
{
    if (rdma_create_id(cm->ch, &l->id, l, RDMA_PS_TCP) == 0 &&
        rdma_bind_addr(l->id, (struct sockaddr *)sa) == 0 && rdma_listen(l->id, 128) == 0)
        return 0;
    int rc = errno ? -errno : -EIO;
    if (l->id)
        rdma_destroy_id(l->id);
    l->id = NULL;
    return rc;
}

/* Ports a listener on port 0 tries for one both rdma_cm and TCP have free
 * (their port spaces are apart: a TCP socket may hold rdma_cm's pick). */
#define BOTH_FREE_TRIES 8

/* In auto, a listener takes RDMA peers over rdma_cm and the others over
 * TCP, on the same port number.  Either alone will do, said in the log:
 * the address may be on no RDMA device, or the TCP port taken. */
static int listen_both(struct mw__listener *l, struct mw__cm *cm, const struct sockaddr_storage *sa)
{
    struct sockaddr_storage at = *sa;
    uint16_t *port = &((struct sockaddr_in *)&at)->sin_port;   /* same offset in sockaddr_in6 */
    bool any_port = *port == 0;
    int rdma = listen_rdma(l, cm, sa), tcp = 0;
    for (int i = 1; rdma == 0; i++) {
        *port = rdma_get_src_port(l->id);
        tcp = mw__tcp_listen(l, &at);
        if (tcp != -EADDRINUSE || !any_port || i == BOTH_FREE_TRIES)
            break;
        rdma_destroy_id(l->id);       /* another pick for both */
        l->id = NULL;
        rdma = listen_rdma(l, cm, sa);
    }
    if (rdma < 0 && (tcp = mw__tcp_listen(l, sa)) < 0)
        return rdma;
    char a[64];
    if (rdma < 0 || tcp < 0)
        MW_LOG(l->ctx, MW_LOG_WARN, "listening on %s over %s only (%s cannot listen there: %s)",
               mw__addr_str((struct sockaddr *)sa, a, sizeof a), rdma < 0 ? "TCP" : "RDMA",
               rdma < 0 ? "rdma_cm" : "TCP", mw_strerror(rdma < 0 ? rdma : tcp));
    return 0;
}

int mw_listen(mw_ctx_t *ctx, const char *addr, const mw_conn_opts_t *opts, mw_accept_fn cb,
              void *arg, mw_listener_t **lp)
{
    if (!ctx || !cb || !lp)
        return -EINVAL;
    mw_conn_opts_t o;
    if (opts)
        o = *opts;
    else
        mw_conn_opts_init(&o);
    int rc = mw__conn_opts_check(&o);
    if (rc < 0 || (rc = mw__transport_asked(ctx, &o)) < 0)
        return rc;
    struct sockaddr_storage sa;
    rc = parse_listen_addr(addr, (uint16_t)o.default_port, &sa);
    if (rc < 0)
        return rc;
    struct mw__cm *cm = mw__cm_get(ctx, &rc);
    bool local_ok = o.transport == MW_TRANSPORT_AUTO;   /* before auto becomes TCP */
    if (!cm || (rc = mw__cm_transport(cm, &o)) < 0)
        return rc;
    struct mw__listener *l = mw__calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    *l = (struct mw__listener){.kind = MW__CM_LISTENER, .ctx = ctx, .fd = -1, .opts = o,
                               .local_ok = local_ok, .cb = cb, .arg = arg};
    if (!(l->h = mw__handle_new(MW__H_LISTENER, l, mw__loop_thread(ctx)))) {
        mw__free(l);
        return -ENOMEM;
    }
    rc = o.transport == MW_TRANSPORT_TCP ? mw__tcp_listen(l, &sa)
       : o.transport == MW_TRANSPORT_RDMA ? listen_rdma(l, cm, &sa) : listen_both(l, cm, &sa);
    if (rc < 0) {
        char a[64];
        MW_LOG(ctx, MW_LOG_ERROR, "cannot listen on %s%s: %s",
               mw__addr_str((struct sockaddr *)&sa, a, sizeof a),
               o.transport == MW_TRANSPORT_TCP ? " (TCP)" : "", mw_strerror(rc));
        mw__handle_release(l->h);
        mw__free(l);
        return rc;
    }
    mw__list_add_tail(&cm->listeners, &l->link);
    *lp = MW__HANDLE_PTR(mw_listener_t, l->h);
    return 0;
}

struct mw__listener *mw__listener_of(const mw_listener_t *h, const char *fn, int *err)
{
    return mw__handle_get(MW__HANDLE(h), MW__H_LISTENER, fn, err);
}

int mw_listener_port(const mw_listener_t *h)
{
    int err;
    struct mw__listener *l = mw__listener_of(h, __func__, &err);
    if (!l)
        return err;
    if (l->fd >= 0)
        return mw__tcp_port(l);
    return l->id ? ntohs(rdma_get_src_port(l->id)) : -ENODEV;   /* its device went */
}

int mw_listener_stats(const mw_listener_t *h, mw_listener_stats_t *out)
{
    int err;
    struct mw__listener *l = mw__listener_of(h, __func__, &err);
    if (out)
        *out = l ? l->stats : (mw_listener_stats_t){0};
    if (!l)
        return err;
    return out ? 0 : -EINVAL;
}

void mw__listener_free(struct mw__listener *l)
{
    struct mw__cm *cm = l->ctx->layers[MW__LAYER_CM].state;
    /* connections still being accepted lose their listener: they are
     * aborted when their setup finishes */
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link) {
        if (c->setup && c->setup->listener == l)
            c->setup->listener = NULL;
        if (c->counted_by == l)
            c->counted_by = NULL;
    }
    mw__list_del(&l->link);
    if (l->id)
        rdma_destroy_id(l->id);
    mw__tcp_unlisten(l);
    mw__handle_release(l->h);
    mw__free(l);
}

int mw_listener_free(mw_listener_t *h)
{
    int err;
    if (!h)
        return 0;
    struct mw__listener *l = mw__listener_of(h, __func__, &err);
    if (!l)
        return err;
    mw__listener_free(l);
    return 0;
}

static void send_reject(mw_ctx_t *ctx, struct rdma_cm_id *id, const char *why)
{
    char pd[56];
    int n = snprintf(pd, sizeof pd, MW__REJECT_TAG "%s", why);
    if (n >= (int)sizeof pd)
        n = sizeof pd - 1;
    rdma_reject(id, pd, (uint8_t)(n + 1));
    char a[64];
    MW_LOG(ctx, MW_LOG_WARN, "rejected a connection from %s: %s",
           mw__addr_str(rdma_get_peer_addr(id), a, sizeof a), why);
}

/* Refuse the request behind @c, on its transport, saying @why. */
static void reject(struct mw__conn *c, const char *why)
{
    if (c->id) {
        send_reject(c->ctx, c->id, why);
        return;
    }
    mw__tcp_reject(c, why);
    MW_LOG(c->ctx, MW_LOG_WARN, "rejected a connection from %s: %s", c->stats.remote, why);
}

/* The listener @c came through, while there is one to count its end. */
static struct mw__listener *listener_of(const struct mw__conn *c)
{
    return c->setup ? c->setup->listener : NULL;
}

static void on_accept_timeout(struct mw__conn *c)
{
    if (listener_of(c))
        listener_of(c)->stats.failed++;
    mw__conn_fail(c, -ETIMEDOUT, "accepting timed out after %u ms", c->opts.timeout_ms);
}

/* Refuse the request behind @c, counted; @c goes once drained. */
static void refuse(struct mw__conn *c, int rc, const char *why)
{
    struct mw__listener *l = listener_of(c);
    if (l && rc == -EPROTO)
        l->stats.rejected++;
    else if (l)
        l->stats.failed++;
    reject(c, why);
    mw__conn_drop_attempt(c);          /* the id goes after this event's ack */
    mw__conn_refused(c, rc);
}

void mw__accept_refuse(struct mw__conn *c, int err, const char *why)
{
    refuse(c, err, why);
}

static void accepted(struct mw__conn *c);

/* The answer, once the queue pair and the same-host channel are decided. */
static int accept_now(struct mw__conn *c, const char **why)
{
    if (!c->id) {                 /* over TCP: established once answered */
        *why = "cannot answer the handshake";
        int rc = mw__tcp_accept(c);
        if (rc == 0)
            accepted(c);
        return rc;
    }
    uint8_t pd[MW__HELLO_LEN];
    struct rdma_conn_param p;
    mw__conn_param(c, pd, &p);
    *why = "rdma_accept failed";
    if (rdma_accept(c->id, &p) < 0)
        return -errno;
    c->setup->accept_sent = true;
    mw__conn_arm_timer(c, on_accept_timeout);
    return 0;
}

/* The queue pair, then the same-host channel, then the answer; 0, or an
 * error with *@why. */
static int answer(struct mw__conn *c, const char **why, char *buf, size_t cap)
{
    int rc;
    *why = buf;
    if ((rc = mw__conn_setup_qp(c, buf, cap)) < 0)
        return rc == -EINPROGRESS ? 0 : rc;   /* mw__accept_device_ready goes on */
    if (mw__local_rendezvous(c))
        return 0;                 /* mw__accept_local_ready goes on */
    return accept_now(c, why);
}

void mw__accept_local_ready(struct mw__conn *c, int err)
{
    const char *why = "reposting the receives on the queue pair failed";
    int rc = err ? err : accept_now(c, &why);
    if (rc < 0)
        refuse(c, rc, why);
}

void mw__accept_device_ready(struct mw__conn *c, int err)
{
    char reason[160];
    const char *why = c->path.dev && c->path.dev->why[0] ? c->path.dev->why
                                                         : "the RDMA device is not usable";
    int rc = err ? err : answer(c, &why, reason, sizeof reason);
    if (rc < 0)
        refuse(c, rc, why);
}

/* Connections of @l being set up: each holds a queue pair and its receive
 * slots until established, failed or timed out (timeout_ms).  At
 * max_accepting a new request is refused at once, which costs next to
 * nothing: a flood of requests that never complete (half-open) holds a
 * bounded amount, and is turned away cheaply.  At max_conns the same goes
 * for connections that do complete and stay: what a stranger can make the
 * listener hold (queue pairs, slots, exports) is bounded either way. */
static bool room_for_one_more(const struct mw__listener *l)
{
    if (l->opts.max_conns && l->live >= l->opts.max_conns)
        return false;
    struct mw__cm *cm = l->ctx->layers[MW__LAYER_CM].state;
    unsigned n = 0;
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link)
        n += listener_of(c) == l && !c->err;
    return n < l->opts.max_accepting;
}

static void on_connect_request(struct mw__listener *l, struct rdma_cm_event *ev)
{
    if (!room_for_one_more(l)) {
        l->stats.rejected++;      /* not logged: a flood would flood the log */
        rdma_reject(ev->id, MW__REJECT_TAG "busy", sizeof MW__REJECT_TAG "busy");
        mw__cm_destroy_id_later(l->ctx, ev->id);
        return;
    }
    struct mw__conn *c;
    const char *why = "out of memory";
    int rc = mw__conn_new(l->ctx, MW__SIDE_PASSIVE, &l->opts, &c);
    if (rc < 0) {
        l->stats.failed++;
        send_reject(l->ctx, ev->id, why);
        mw__cm_destroy_id_later(l->ctx, ev->id);
        return;
    }
    mw__conn_take_id(c, ev->id);
    c->setup->listener = l;
    c->counted_by = l;
    l->live++;
    c->setup->peer_rd_depth = ev->param.conn.initiator_depth;
    c->setup->peer_rd_resources = ev->param.conn.responder_resources;
    char reason[160];
    if ((rc = mw__conn_take_peer_hello(c, ev->param.conn.private_data,
                                       ev->param.conn.private_data_len, &why)) < 0 ||
        (rc = answer(c, &why, reason, sizeof reason)) < 0)
        refuse(c, rc, why);
}

void mw__listener_incoming_tcp(struct mw__listener *l, int fd)
{
    if (!room_for_one_more(l)) {
        l->stats.rejected++;      /* not logged: a flood would flood the log */
        mw__tcp_refuse_fd(fd, "busy");
        close(fd);
        return;
    }
    struct mw__conn *c;
    mw_conn_opts_t o = l->opts;
    o.transport = MW_TRANSPORT_TCP;   /* an auto listener's TCP side */
    int rc = mw__conn_new(l->ctx, MW__SIDE_PASSIVE, &o, &c);
    if (rc < 0) {
        l->stats.failed++;
        mw__tcp_refuse_fd(fd, "out of memory");
        close(fd);
        return;
    }
    c->local_ok = l->local_ok;
    c->setup->listener = l;
    c->counted_by = l;
    l->live++;
    if ((rc = mw__tcp_accepting(c, fd)) < 0) {
        refuse(c, rc, "out of memory");
        return;
    }
    mw__conn_arm_timer(c, on_accept_timeout);    /* for the peer's handshake */
}

/* A TCP hello from a connector whose RDMA attempt here found nothing
 * listening, to a listener that listens over RDMA too (it was starting):
 * sent back to RDMA, uncounted (a redirect, not a refusal). */
static bool redirect_to_rdma(struct mw__conn *c)
{
    struct mw__listener *l = listener_of(c);
    if (!(c->peer.flags & MW__HELLO_RDMA_MISSED) || !l->id)
        return false;
    MW_LOG(c->ctx, MW_LOG_INFO, "%s: came over TCP, found nothing listening over RDMA: "
           "sent back to RDMA", c->stats.remote);
    mw__tcp_reject(c, MW__REFUSE_RDMA_NOW);
    mw__conn_drop_attempt(c);
    mw__conn_refused(c, -ECONNREFUSED);
    return true;
}

void mw__accept_hello(struct mw__conn *c, const void *pd, size_t len)
{
    const char *why = "";
    char reason[160];
    int rc = listener_of(c) ? mw__conn_take_peer_hello(c, pd, len, &why) : -ECONNABORTED;
    if (!listener_of(c))
        why = "no longer listening";
    if (rc == 0 && redirect_to_rdma(c))
        return;
    if (rc < 0 || (rc = answer(c, &why, reason, sizeof reason)) < 0)
        refuse(c, rc, why);
}

void mw__listener_refuse_orphan(mw_ctx_t *ctx, struct rdma_cm_id *id)
{
    send_reject(ctx, id, "no longer listening");
    mw__cm_destroy_id_later(ctx, id);
}

void mw__listener_event(struct mw__listener *l, struct rdma_cm_event *ev)
{
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
        on_connect_request(l, ev);
}

void mw__accepted_event(struct mw__conn *c, struct rdma_cm_event *ev)
{
    struct mw__listener *l = listener_of(c);
    /* The peer connected, sent and left before our ESTABLISHED came (its
     * RTU late or lost, its DREQ first: rdma_cm then reports only the
     * disconnect).  It was connected, and what it sent is in the queue pair
     * our accept made ready: established, then disconnected, as when the
     * events come in order (the disconnect a turn later, after what is in
     * the completion queue). */
    if (ev->event == RDMA_CM_EVENT_DISCONNECTED && l && c->setup->accept_sent) {
        MW_LOG(c->ctx, MW_LOG_DEBUG, "%s: left before its connection was established here: "
               "established, then disconnected", c->stats.remote);
        accepted(c);
        if (c->state == MW__CONN_ESTABLISHED && mw__conn_disconnected_later(c) < 0)
            mw__conn_on_disconnected(c);
        return;
    }
    if (ev->event != RDMA_CM_EVENT_ESTABLISHED || !l) {
        if (l)
            l->stats.failed++;
        mw__conn_fail(c, -ECONNABORTED, "accept failed: %s", rdma_event_str(ev->event));
        return;
    }
    accepted(c);
}

/* @c is established on its listener's side: the callback has it. */
static void accepted(struct mw__conn *c)
{
    struct mw__listener *l = listener_of(c);
    if (!l) {                     /* freed while this one was set up */
        mw__conn_fail(c, -ECONNABORTED, "accept failed: no longer listening");
        return;
    }
    mw__conn_established(c);
    if (c->state != MW__CONN_ESTABLISHED) {
        l->stats.failed++;
        return;
    }
    mw__conn_hand_over(c);        /* the listener's part ends */
    l->stats.accepted++;
    MW__CALL_OUT(c->ctx,
                 l->cb(MW__HANDLE_PTR(mw_listener_t, l->h), mw__conn_handle(c), l->arg));
}
