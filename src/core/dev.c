/* Devices, opened lazily: a protection domain and a CQ each. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/cq.h"
#include "core/dev.h"
#include "core/worker.h"

#define DEFAULT_CQ_DEPTH 4096

struct mw__devs {
    struct mw__dev **v;
    int n;
};

int mw__dev_count(const mw_ctx_t *ctx)
{
    return ctx->devs ? ctx->devs->n : 0;
}

struct mw__dev *mw__dev_at(const mw_ctx_t *ctx, int index)
{
    return index >= 0 && index < mw__dev_count(ctx) ? ctx->devs->v[index] : NULL;
}

#define MIN_POST_CHUNK (64u << 10)

uint64_t mw__dev_post_chunk(const struct mw__dev *dev, uint64_t max)
{
    uint64_t chunk = MIN_POST_CHUNK;
    if (dev->post_ns_per_kib)
        chunk = (uint64_t)MW__TURN_NS / 2 / dev->post_ns_per_kib * 1024;
    chunk = chunk < MIN_POST_CHUNK ? MIN_POST_CHUNK : chunk & ~(uint64_t)4095;
    return chunk < max ? chunk : max;
}

bool mw__dev_post_timed(uint64_t bytes)
{
    return bytes >= MIN_POST_CHUNK / 4;  /* below, a post's time is the call's */
}

void mw__dev_post_cost(struct mw__dev *dev, uint64_t bytes, uint64_t ns)
{
    if (!mw__dev_post_timed(bytes))
        return;
    uint64_t per_kib = ns * 1024 / bytes;
    per_kib = per_kib ? (per_kib > UINT32_MAX ? UINT32_MAX : per_kib) : 1;
    /* a moving average: one slow post (a preemption) moves it a quarter */
    dev->post_ns_per_kib = dev->post_ns_per_kib
                               ? (uint32_t)((3 * (uint64_t)dev->post_ns_per_kib + per_kib) / 4)
                               : (uint32_t)per_kib;
}

static void dev_release(struct mw__dev *dev)
{
    if (dev->async_ev) {
        mw__unwatch_fd(dev->ctx, event_get_fd(dev->async_ev));
        event_free(dev->async_ev);
        dev->async_ev = NULL;
    }
    mw__cq_close(dev->cq);
    dev->cq = NULL;
    if (dev->pd)
        ibv_dealloc_pd(dev->pd);
    dev->pd = NULL;
}

static void dev_close(struct mw__dev *dev)
{
    dev_release(dev);
    mw__free(dev);
}

struct mw__dev *mw__dev_find(const mw_ctx_t *ctx, const struct ibv_context *verbs)
{
    for (int i = 0; verbs && i < mw__dev_count(ctx); i++)
        if (ctx->devs->v[i]->verbs == verbs)
            return ctx->devs->v[i];
    return NULL;
}

/* The layers below slot @below let go of @dev, highest first. */
static void close_in_layers(mw_ctx_t *ctx, struct mw__dev *dev, int below)
{
    for (int i = below; i-- > 0;)
        if (ctx->layers[i].device_close)
            ctx->layers[i].device_close(ctx, ctx->layers[i].state, dev);
}

/* Every layer takes the new device in, lowest slot first (ctx.h, device_open):
 * 0, 1 (one finishes later: mw__dev_ready follows) or a negative errno. */
static int open_in_layers(mw_ctx_t *ctx, struct mw__dev *dev)
{
    int pending = 0;
    for (int i = 0; i < MW__LAYERS; i++) {
        struct mw__layer *l = &ctx->layers[i];
        int rc = l->device_open ? l->device_open(ctx, l->state, dev) : 0;
        if (rc < 0) {
            close_in_layers(ctx, dev, i);
            return rc;
        }
        pending |= rc;
    }
    return pending;
}

/* Release what meshwire held on @dev; its slot stays, empty. */
static void dev_drop(mw_ctx_t *ctx, struct mw__dev *dev)
{
    mw__worker_flush(ctx);            /* no job may still use its PD */
    close_in_layers(ctx, dev, MW__LAYERS);   /* MRs before the PD */
    dev_release(dev);
    dev->verbs = NULL;                /* a re-added device gets a new slot */
    dev->removed = true;
}

void mw__dev_remove(mw_ctx_t *ctx, struct mw__dev *dev)
{
    if (!dev || dev->removed)
        return;
    if (!dev->ready) {
        /* The helper still opens it or registers on its PD: let it finish
         * now, while rdma_cm's verbs context still exists (the ids go
         * next); its done() sees remove_pending and drops the device. */
        dev->remove_pending = true;
        mw__worker_flush(ctx);
        return;
    }
    MW_LOG(ctx, MW_LOG_WARN, "RDMA device %s removed: releasing what meshwire held on it",
           dev->name);
    dev_drop(ctx, dev);
}

/* Tell the layers above: they fail what uses the device. */
static void notify_layers(struct mw__dev *dev, const struct ibv_async_event *ev, const char *why)
{
    mw_ctx_t *ctx = dev->ctx;
    for (int i = 0; i < MW__LAYERS; i++)
        if (ctx->layers[i].device_event)
            ctx->layers[i].device_event(ctx, ctx->layers[i].state, dev, ev, why);
}

/* The CQ's broken_fn: nothing completes on this device any more. */
static void cq_broken(void *arg, int err)
{
    struct mw__dev *dev = arg;
    char why[96];
    snprintf(why, sizeof why, "its completion queue failed (%s)", mw_strerror(err));
    dev->broken = true;
    notify_layers(dev, NULL, why);
}

static bool event_is_fatal(enum ibv_event_type t)
{
    return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR ||
           t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_CQ_ERR || t == IBV_EVENT_PORT_ERR ||
           t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_SRQ_ERR;
}

/* The device's asynchronous events.  Each is acked before anything acts on
 * it (destroying a queue pair waits for the acks of its events); its
 * object pointers are then only compared, never followed: another context
 * sharing this device (rdma_cm opens each device once a process) may read
 * events of its own objects here, and those are only logged -- their
 * failures also show as completion errors there. */
static void on_async(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct mw__dev *dev = arg;
    struct ibv_async_event got;
    while (dev->verbs && ibv_get_async_event(dev->verbs, &got) == 0) {
        struct ibv_async_event ev = got;
        ibv_ack_async_event(&got);
        const char *name = ibv_event_type_str(ev.event_type);
        MW_LOG(dev->ctx, event_is_fatal(ev.event_type) ? MW_LOG_WARN : MW_LOG_INFO,
               "RDMA device %s: %s", dev->name, name);
        if (ev.event_type == IBV_EVENT_CQ_ERR && dev->cq && ev.element.cq == dev->cq->cq) {
            mw__cq_fail(dev->cq, "the device reported", -EIO);
        } else if (ev.event_type == IBV_EVENT_DEVICE_FATAL) {
            dev->broken = true;
            notify_layers(dev, NULL, "it reported a fatal error");
        } else {
            notify_layers(dev, &ev, name);
        }
    }
}

static int watch_async(mw_ctx_t *ctx, struct mw__dev *dev)
{
    int fd = dev->verbs->async_fd, fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    dev->async_ev = event_new(ctx->base, fd, EV_READ | EV_PERSIST, on_async, dev);
    if (!dev->async_ev || event_add(dev->async_ev, NULL) < 0)
        return -ENOMEM;
    return mw__watch_fd(ctx, fd);
}

static void notify_ready(struct mw__dev *dev, int err)
{
    mw_ctx_t *ctx = dev->ctx;
    for (int i = 0; i < MW__LAYERS; i++)
        if (ctx->layers[i].device_ready)
            ctx->layers[i].device_ready(ctx, ctx->layers[i].state, dev, err);
}

/* Opening a device, in two halves.  The verbs calls -- its attributes, a
 * protection domain, a CQ and its channel: 15-20 ms of CPU on soft-RoCE --
 * run on the helper thread into the job, never into the device, which
 * waits unready meanwhile (its connections too).  The loop then takes the
 * results in, watches the CQ and the device's events, and hands the device
 * to the layers (ctx.h, device_open). */
struct open_job {
    struct mw__job job;
    struct mw__dev *dev;             /* the helper reads only its verbs */
    int depth;                       /* asked for; the device may allow less */
    int err;
    const char *what;                /* the call that failed */
    struct ibv_device_attr attr;
    struct ibv_pd *pd;
    struct mw__cq *cq;               /* zeroed; made on the helper */
};

static void open_work(struct mw__job *j)
{
    struct open_job *o = (struct open_job *)j;
    struct ibv_context *verbs = o->dev->verbs;
    o->what = "query";
    if ((o->err = -ibv_query_device(verbs, &o->attr)) < 0)
        return;
    o->what = "allocate a protection domain on";
    if (!(o->pd = ibv_alloc_pd(verbs))) {
        o->err = errno ? -errno : -ENOMEM;
        return;
    }
    o->what = "create a completion queue on";
    o->err = mw__cq_create(o->cq, verbs, o->depth < o->attr.max_cqe ? o->depth : o->attr.max_cqe);
}

/* On the loop: what the helper made becomes the device's, watched. */
static int open_take(struct open_job *o)
{
    struct mw__dev *dev = o->dev;
    dev->attr = o->attr;
    dev->soft_roce = dev->attr.vendor_id == MW__RXE_VENDOR_ID;
    dev->pd = o->pd;
    dev->cq = o->cq;
    o->cq = NULL;
    if (o->err < 0 || dev->remove_pending)   /* then only released */
        return o->err;
    int rc = mw__cq_watch(dev->ctx, dev->cq);
    if (rc < 0)
        return rc;
    dev->cq->broken_fn = cq_broken;
    dev->cq->broken_arg = dev;
    dev->cqe_size = ((struct ibv_cq *)dev->cq->cq)->cqe;
    return watch_async(dev->ctx, dev);
}

/* @dev could not be opened, or a layer could not take it in (those that
 * took it let go first): what was made goes, the connections waiting are
 * told why, and the record stays -- ready, PD-less (open_failed) -- for
 * the next mw__dev_get on it to open it anew in place. */
static void failed(struct mw__dev *dev, int err)
{
    MW_LOG(dev->ctx, MW_LOG_ERROR, "%s: connections through it fail",
           dev->why[0] ? dev->why : mw_strerror(err));
    dev_release(dev);
    if (dev->remove_pending) {        /* and its verbs context goes too */
        dev->verbs = NULL;
        dev->removed = true;
    }
    dev->ready = true;
    notify_ready(dev, err);
}

static bool open_failed(const struct mw__dev *dev)
{
    return dev->ready && !dev->pd;
}

static void opened(struct mw__job *j)
{
    struct open_job *o = (struct open_job *)j;
    struct mw__dev *dev = o->dev;
    mw_ctx_t *ctx = dev->ctx;
    int rc = open_take(o);
    if (rc < 0)
        snprintf(dev->why, sizeof dev->why, "cannot %s RDMA device %s: %s",
                 o->err < 0 ? o->what : "watch", dev->name, mw_strerror(rc));
    mw__free(o);
    if (ctx->closing)                 /* nobody waits; mw__devs_free releases it */
        return;
    if (rc == 0 && dev->remove_pending) {
        mw__dev_ready(dev, 0);        /* which drops it */
        return;
    }
    if (rc == 0) {
        ctx->stats.devices++;
        MW_LOG(ctx, MW_LOG_INFO, "opened RDMA device %s (max_qp %d, max_cqe %d, "
               "max_mr_size %llu)", dev->name, dev->attr.max_qp, dev->attr.max_cqe,
               (unsigned long long)dev->attr.max_mr_size);
        /* The layers take it in before anyone can post on it: the memory
         * layer registers what exists with it now, or, when there is much,
         * on the helper thread (mw__dev_ready follows). */
        if ((rc = open_in_layers(ctx, dev)) >= 0) {
            if (rc == 0)
                mw__dev_ready(dev, 0);
            return;
        }
        snprintf(dev->why, sizeof dev->why, "cannot take RDMA device %s in: %s", dev->name,
                 mw_strerror(rc));
    }
    failed(dev, rc);
}

void mw__dev_ready(struct mw__dev *dev, int err)
{
    mw_ctx_t *ctx = dev->ctx;
    if (err) {                        /* a layer could not take it in */
        mw__worker_flush(ctx);        /* no job may still use its PD */
        close_in_layers(ctx, dev, MW__LAYERS);   /* MRs before the PD */
        failed(dev, err);
        return;
    }
    dev->ready = true;
    if (dev->remove_pending) {
        MW_LOG(ctx, MW_LOG_INFO, "RDMA device %s: removed while opening", dev->name);
        mw__dev_remove(ctx, dev);
        err = -ENODEV;
    } else {
        MW_LOG(ctx, MW_LOG_INFO, "RDMA device %s: memory registered, ready", dev->name);
    }
    notify_ready(dev, err);
}

/* Open @dev (new, or one whose last open failed) on the helper thread. */
static int open_start(mw_ctx_t *ctx, struct mw__dev *dev)
{
    struct open_job *o = mw__calloc(1, sizeof *o);
    struct mw__cq *cq = mw__calloc(1, sizeof *cq);
    if (!o || !cq) {
        mw__free(o), mw__free(cq);
        snprintf(dev->why, sizeof dev->why, "no memory to open RDMA device %s", dev->name);
        dev->ready = true;            /* PD-less: the next mw__dev_get tries again */
        return -ENOMEM;
    }
    dev->ready = false;
    dev->why[0] = '\0';
    *o = (struct open_job){.job = {.work = open_work, .done = opened}, .dev = dev, .cq = cq,
                           .depth = ctx->opts.cq_depth ? (int)ctx->opts.cq_depth
                                                       : DEFAULT_CQ_DEPTH};
    if (mw__worker_submit(ctx, &o->job) < 0) {   /* no helper: here, then */
        open_work(&o->job);
        opened(&o->job);
    }
    return 0;
}

int mw__dev_get(mw_ctx_t *ctx, struct ibv_context *verbs, struct mw__dev **devp)
{
    if (!ctx || !verbs || !devp)
        return -EINVAL;
    struct mw__dev *dev = mw__dev_find(ctx, verbs);
    if (dev && !open_failed(dev)) {
        *devp = dev;
        return 0;
    }
    if (!dev) {
        if (!ctx->devs && !(ctx->devs = mw__calloc(1, sizeof *ctx->devs)))
            return -ENOMEM;
        struct mw__devs *d = ctx->devs;
        struct mw__dev **v = mw__realloc(d->v, (d->n + 1) * sizeof *v);
        if (!v)
            return -ENOMEM;
        d->v = v;
        if (!(dev = mw__calloc(1, sizeof *dev)))
            return -ENOMEM;
        *dev = (struct mw__dev){.ctx = ctx, .index = d->n, .verbs = verbs};
        snprintf(dev->name, sizeof dev->name, "%s", ibv_get_device_name(verbs->device));
        d->v[d->n++] = dev;
    }
    int rc = open_start(ctx, dev);
    if (rc == 0)
        *devp = dev;
    return rc;
}

void mw__devs_free(mw_ctx_t *ctx)
{
    struct mw__devs *d = ctx->devs;
    if (!d)
        return;
    for (int i = d->n; i-- > 0;)
        dev_close(d->v[i]);
    mw__free(d->v);
    mw__free(d);
    ctx->devs = NULL;
}

int mw__dev_reserve_cqe(struct mw__dev *dev, int n)
{
    int need = dev->cqe_used + n;
    if (need > dev->cqe_size) {
        if (need > dev->attr.max_cqe)
            return -ENOSPC;
        int want = dev->cqe_size * 2 > need ? dev->cqe_size * 2 : need;
        if (want > dev->attr.max_cqe)
            want = dev->attr.max_cqe;
        struct ibv_cq *cq = dev->cq->cq;
        int rc = ibv_resize_cq(cq, want);
        if (rc)
            return -rc;
        dev->cqe_size = cq->cqe;
    }
    dev->cqe_used = need;
    return 0;
}

void mw__dev_release_cqe(struct mw__dev *dev, int n)
{
    dev->cqe_used -= n;
}
