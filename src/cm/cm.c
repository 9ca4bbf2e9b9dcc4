/* The per-context rdma_cm event channel: one fd in the reactor, each event
 * dispatched to the listener or connection its id belongs to. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>

#include <event2/event.h>

#include "cm/addrs.h"
#include "cm/cm.h"
#include "cm/nic.h"
#include "core/alloc.h"
#include "core/dev.h"

/* A device was hot-removed: the kernel finishes only once every resource on
 * it is released.  Every connection on it fails (-ENODEV) and loses its QP
 * now, every listener on it stops, their ids go later (not from inside an
 * event handler), and the device's memory registrations, CQ and PD go
 * before any id does, while the verbs context still exists.  Other devices
 * and the context go on. */
static void device_removed(mw_ctx_t *ctx, struct ibv_context *verbs)
{
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    if (!verbs)
        return;
    struct mw__dev *dev = mw__dev_find(ctx, verbs);
    const char *name = dev ? dev->name : ibv_get_device_name(verbs->device);
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link) {
        if (!c->id || c->id->verbs != verbs)
            continue;
        mw__conn_fail(c, -ENODEV, "RDMA device %s removed", name);
        mw__conn_drop_attempt(c);
        mw__conn_maybe_finish(c);
    }
    struct mw__listener *l;
    mw__list_for_each(l, &cm->listeners, link) {
        if (!l->id || l->id->verbs != verbs)
            continue;
        MW_LOG(ctx, MW_LOG_ERROR, "a listener lost its RDMA device %s: it accepts %s", name,
               l->fd >= 0 ? "over TCP only" : "no more");
        l->id->context = NULL;
        mw__cm_destroy_id_later(ctx, l->id);
        l->id = NULL;
    }
    mw__sentinels_drop(ctx, cm, verbs);
    mw__dev_remove(ctx, dev);
    /* librdmacm closes its own context of a removed device only when it
     * next syncs its device list, once no id uses it: the ids go a turn
     * later, so sync a few times from then on (the kernel's removal waits
     * for that close) */
    cm->sync_left = 10;
    if (cm->sync_ev)
        mw__ev_add(ctx, cm->sync_ev, &mw__zero_tv);
}

static void on_sync(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    mw_ctx_t *ctx = arg;
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    struct ibv_context **list = rdma_get_devices(NULL);
    if (list)
        rdma_free_devices(list);
    if (--cm->sync_left > 0) {
        struct timeval tv = {0, 300 * 1000};
        mw__ev_add(ctx, cm->sync_ev, &tv);
    }
}

static void dispatch(mw_ctx_t *ctx, struct rdma_cm_event *ev)
{
    enum mw__cm_kind *kind = ev->id->context;
    MW_LOG(ctx, MW_LOG_DEBUG, "rdma_cm: %s (status %d)", rdma_event_str(ev->event), ev->status);
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        /* The new id carries the listener's context until we adopt it.  A
         * listener that lost its device, or was freed, with requests still
         * queued behind that has none: those are refused. */
        struct mw__listener *l = ev->listen_id->context;
        if (l)
            mw__listener_event(l, ev);
        else
            mw__listener_refuse_orphan(ctx, ev->id);
        return;
    }
    if (ev->event == RDMA_CM_EVENT_ADDR_CHANGE || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
        mw__cm_nics_changed(ctx->layers[MW__LAYER_CM].state);
    if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        device_removed(ctx, ev->id->verbs);    /* every id on it, at once */
        return;
    }
    if (!kind || *kind == MW__CM_SENTINEL)
        return;
    if (*kind == MW__CM_LISTENER) {
        mw__listener_event((struct mw__listener *)kind, ev);
        return;
    }
    struct mw__conn *c = (struct mw__conn *)kind;
    /* Past its setup, a connection takes its id's events the same on both
     * sides; a setup event that comes late (REJECTED on a connect that had
     * failed when its peer died) must not start it over. */
    if (!mw__conn_setting_up(c))
        mw__conn_common_event(c, ev);
    else if (c->side == MW__SIDE_PASSIVE)
        mw__accepted_event(c, ev);
    else
        mw__connect_event(c, ev);
}

static void on_cm_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mw_ctx_t *ctx = arg;
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    struct rdma_cm_event *ev;
    /* One event per wake-up, as for completions: setting up a connection
     * (queue pair, receive slots) costs milliseconds on soft-RoCE, and a
     * burst of events handled at once would hold the loop for all of them.
     * The descriptor is level-triggered: the next event wakes us again.
     * Handlers get the event before it is acked; none of them destroys an
     * id (that would wait for this very ack): teardown is deferred. */
    if (cm && rdma_get_cm_event(cm->ch, &ev) == 0) {
        dispatch(ctx, ev);
        rdma_ack_cm_event(ev);
    }
}

/* A device's trouble, for the connections on it.  With no event the
 * device is unusable (its CQ failed, or a fatal error): nothing completes
 * there any more, so each connection fails and loses its queue pair at
 * once.  A queue pair's own fatal event fails its connection; a port going
 * down fails the connections through that port. */
static void cm_device_event(mw_ctx_t *ctx, void *state, struct mw__dev *dev,
                            const struct ibv_async_event *ev, const char *why)
{
    (void)ctx;
    struct mw__cm *cm = state;
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link) {
        if (c->path.dev != dev || !c->id || !c->id->qp)
            continue;
        if (!ev) {
            mw__conn_fail(c, -EIO, "RDMA device %s: %s", dev->name, why);
            mw__conn_drop_attempt(c);
            mw__conn_maybe_finish(c);
        } else if ((ev->event_type == IBV_EVENT_QP_FATAL || ev->event_type == IBV_EVENT_QP_REQ_ERR ||
                    ev->event_type == IBV_EVENT_QP_ACCESS_ERR ||
                    ev->event_type == IBV_EVENT_PATH_MIG_ERR) &&
                   ev->element.qp == c->id->qp) {
            mw__conn_fail(c, -EIO, "RDMA device %s reported %s on its queue pair", dev->name, why);
        } else if (ev->event_type == IBV_EVENT_PORT_ERR && ev->element.port_num == c->id->port_num) {
            mw__conn_fail(c, -ENETDOWN, "port %d of RDMA device %s went down",
                          ev->element.port_num, dev->name);
        }
    }
}

/* Connections set up after their device got ready, one per turn: each
 * costs a queue pair and its receive slots, registered in its own domain
 * (4-5 ms of CPU on soft-RoCE), and a device that opened or registered a
 * large memory off the loop may have dozens waiting -- a stranger's
 * connection requests too. */
#define RESUMED_PER_TURN 1

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    mw_ctx_t *ctx = arg;
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    int n = 0;
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link) {
        if (!c->setup || !c->setup->dev_wait || !c->path.dev || !c->path.dev->ready)
            continue;
        if (n++ == RESUMED_PER_TURN) {
            mw__ev_add(ctx, cm->resume_ev, &mw__zero_tv);   /* the rest next turn */
            return;
        }
        mw__conn_device_ready(c, c->path.dev, 0);
    }
}

/* A device that was registering memory is usable (or failed): the
 * connections waiting for it go on (failed at once). */
static void cm_device_ready(mw_ctx_t *ctx, void *state, struct mw__dev *dev, int err)
{
    struct mw__cm *cm = state;
    if (!err && cm->resume_ev) {
        mw__ev_add(ctx, cm->resume_ev, &mw__zero_tv);
        return;
    }
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link)
        mw__conn_device_ready(c, dev, err);
}

static void cm_teardown(mw_ctx_t *ctx, void *state)
{
    struct mw__cm *cm = state;
    struct mw__conn *c;
    mw__list_for_each(c, &cm->conns, link)
        mw__conn_fail(c, -ECANCELED, "context closed");
    /* A same-host peer executes our requests from its loop: what it may
     * still touch is handed back only once it stopped (lqp.h), so wait for
     * that here, for all of them at once, within the longest bound, and
     * let the flushes reach their operations. */
    uint64_t until = 0;
    mw__list_for_each(c, &cm->conns, link) {
        if (c->path.tp->quiescing(c) && mw__now_ms() + c->opts.timeout_ms > until)
            until = mw__now_ms() + c->opts.timeout_ms;
    }
    mw__list_for_each(c, &cm->conns, link) {
        if (c->path.tp->quiescing(c))
            c->path.tp->settle(c, until);
    }
    while (ctx->defer_head)
        mw__run_deferred(ctx);
    while (!mw__list_empty(&cm->conns))
        mw__conn_free(mw__container_of(cm->conns.next, struct mw__conn, link));
    while (!mw__list_empty(&cm->listeners))
        mw__listener_free(mw__container_of(cm->listeners.next, struct mw__listener, link));
    mw__sentinels_drop(ctx, cm, NULL);
    while (ctx->defer_head)           /* ids waiting to be destroyed, first */
        mw__run_deferred(ctx);
    if (cm->ch) {
        mw__unwatch_fd(ctx, cm->ch->fd);
        event_free(cm->ev);
        rdma_destroy_event_channel(cm->ch);
    }
    if (cm->sync_ev)
        event_free(cm->sync_ev);
    if (cm->resume_ev)
        event_free(cm->resume_ev);
    mw__free(cm->nics);
    mw__free(cm->ips);
    mw__free(cm);
    ctx->layers[MW__LAYER_CM] = (struct mw__layer){0};
}

struct mw__cm *mw__cm_get(mw_ctx_t *ctx, int *err)
{
    struct mw__cm *cm = ctx->layers[MW__LAYER_CM].state;
    if (cm)
        return cm;
    *err = -ENOMEM;
    if (!(cm = mw__calloc(1, sizeof *cm)))
        return NULL;
    cm->ctx = ctx;
    mw__list_init(&cm->conns);
    mw__list_init(&cm->listeners);
    cm->sync_ev = evtimer_new(ctx->base, on_sync, ctx);   /* NULL: no sync, no harm */
    cm->resume_ev = evtimer_new(ctx->base, on_resume, ctx);   /* NULL: all at once */
    ctx->layers[MW__LAYER_CM] =
        (struct mw__layer){.state = cm, .teardown = cm_teardown,
                           .device_event = cm_device_event, .device_ready = cm_device_ready,
                           .metrics = mw__cm_metrics};
    return cm;
}

/* rdma_cm's event channel, opened at the first need of it; failing, the
 * reason is logged once (an RDMA-less host is told once, not per
 * connection). */
int mw__cm_rdma(struct mw__cm *cm)
{
    if (cm->ch)
        return 0;
    mw_ctx_t *ctx = cm->ctx;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) {
        int err = errno ? -errno : -ENODEV;
        if (!cm->no_rdma)
            MW_LOG(ctx, MW_LOG_INFO, "no RDMA on this host: cannot open rdma_cm (%s; is "
                   "rdma_ucm loaded?)", mw_strerror(err));
        cm->no_rdma = err;
        return err;
    }
    int fl = fcntl(ch->fd, F_GETFL);
    fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
    cm->ev = event_new(ctx->base, ch->fd, EV_READ | EV_PERSIST, on_cm_readable, ctx);
    if (!cm->ev || event_add(cm->ev, NULL) < 0 || mw__watch_fd(ctx, ch->fd) < 0) {
        if (cm->ev)
            event_free(cm->ev);
        cm->ev = NULL;
        rdma_destroy_event_channel(ch);
        return -ENOMEM;
    }
    cm->ch = ch;
    cm->no_rdma = 0;
    const struct mw__nic *nics;
    size_t n;
    mw__cm_nics(cm, &nics, &n);       /* and a sentinel on each device */
    return 0;
}

int mw__cm_transport(struct mw__cm *cm, mw_conn_opts_t *o)
{
    if (o->transport == MW_TRANSPORT_TCP)
        return 0;
    int rc = mw__cm_rdma(cm);
    if (rc < 0 && o->transport == MW_TRANSPORT_AUTO) {
        o->transport = MW_TRANSPORT_TCP;
        return 0;
    }
    if (rc < 0)
        MW_LOG(cm->ctx, MW_LOG_ERROR, "cannot open rdma_cm (%s): is rdma_ucm loaded? (RDMA "
               "was asked for: MW_TRANSPORT or the connection's transport option)",
               mw_strerror(rc));
    return rc;
}

struct doomed_id {
    struct mw__task task;
    struct rdma_cm_id *id;
};

static void destroy_id_task(struct mw__task *t)
{
    struct doomed_id *d = (struct doomed_id *)t;
    rdma_destroy_id(d->id);
    mw__free(d);
}

/* rdma_destroy_id() waits until every event of the id is acked, so inside
 * an event handler it would wait for itself: destroy from the loop later. */
void mw__cm_destroy_id_later(mw_ctx_t *ctx, struct rdma_cm_id *id)
{
    struct doomed_id *d = mw__calloc(1, sizeof *d);
    if (!d) {
        MW_LOG(ctx, MW_LOG_ERROR, "no memory: leaking an rdma_cm id");
        return;
    }
    d->task.fn = destroy_id_task;
    d->id = id;
    mw__defer(ctx, &d->task);
}

void mw__cm_nics(struct mw__cm *cm, const struct mw__nic **nics, size_t *n)
{
    if (!cm->ch && mw__cm_rdma(cm) < 0) {
        *nics = NULL;             /* no RDMA here: no RDMA addresses */
        *n = 0;
        return;
    }
    if (!cm->nics_valid) {
        mw__free(cm->nics);
        cm->nics = NULL;
        cm->nnics = 0;
        cm->nics_valid = mw__nic_list(&cm->nics, &cm->nnics) == 0;
        mw__sentinels_refresh(cm->ctx, cm, cm->nics, cm->nnics);
    }
    *nics = cm->nics;
    *n = cm->nnics;
}

int mw__cm_local_addrs(mw_ctx_t *ctx, const struct mw__nic **nics, size_t *n)
{
    int err = 0;
    struct mw__cm *cm = mw__cm_get(ctx, &err);
    mw_conn_opts_t o;
    mw_conn_opts_init(&o);
    if (!cm || (err = mw__transport_asked(ctx, &o)) < 0 || (err = mw__cm_transport(cm, &o)) < 0)
        return err;
    if (o.transport != MW_TRANSPORT_TCP) {
        mw__cm_nics(cm, nics, n);
        return 0;
    }
    mw__free(cm->ips);                /* as the host has them now */
    cm->ips = NULL;
    cm->nips = 0;
    if ((err = mw__nic_list_ip(&cm->ips, &cm->nips)) < 0)
        return err;
    *nics = cm->ips;
    *n = cm->nips;
    return 0;
}

void mw__cm_nics_changed(struct mw__cm *cm)
{
    cm->nics_valid = false;
}
