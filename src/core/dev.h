/* Devices: one protection domain and one CQ (on the context's completion
 * channel) per RDMA device, opened lazily when a connection first binds to
 * the device. */
#ifndef MW_CORE_DEV_H
#define MW_CORE_DEV_H

#include <infiniband/verbs.h>

#include "core/ctx.h"

struct mw__cq;

struct mw__dev {
    mw_ctx_t *ctx;
    int index;                     /* 0.. in order of opening; keys are per index */
    struct ibv_context *verbs;     /* not owned (rdma_cm's, or the caller's) */
    struct ibv_pd *pd;
    struct mw__cq *cq;
    struct ibv_device_attr attr;
    char name[64];
    int cqe_size, cqe_used;        /* the CQ's entries, and those reserved */
    struct event *async_ev;        /* the device's asynchronous events */
    bool removed;                  /* hot-removed: verbs, pd, cq gone */
    bool broken;                   /* its CQ failed or it reported a fatal error */
    bool ready;                    /* opened, and every layer took it in
                                      (every region has its keys here) */
    bool remove_pending;           /* removed while opening or registering:
                                      finish after */
    char why[192];                 /* why opening it or registering memory
                                      with it failed, for the connections
                                      that waited on it */
    uint32_t post_ns_per_kib;      /* what a post costs per KiB here; 0: unknown */
    bool soft_roce;                /* rxe (its vendor id): see MW__RXE_READS */
};

/* RDMA reads in flight per queue pair on rxe.  With several, rxe 6.1's
 * requester now and then stops until something new is posted on the QP
 * (measured: 1,000 reads of 64 KiB, 16 in flight, moved 0.4-2.5 MiB/s in
 * 3 of 5 runs, the VM idle between keepalive probes; one in flight,
 * 46-53 MiB/s in every run, as fast as the good runs with 16). */
#define MW__RXE_READS 1
#define MW__RXE_VENDOR_ID 0xffffffu

/* mw__dev_post_chunk() - how much of a one-sided transfer to hand @dev in
 * one post: @max, or less where posting costs time per byte (rxe: the
 * send engine runs in the post), so that one post stays within half a
 * loop turn's posting budget; 64 KiB at least, and while the cost is
 * unknown.  mw__dev_post_cost() tells it what a post of @bytes took, for
 * posts large enough to be worth timing (mw__dev_post_timed). */
uint64_t mw__dev_post_chunk(const struct mw__dev *dev, uint64_t max);
bool mw__dev_post_timed(uint64_t bytes);
void mw__dev_post_cost(struct mw__dev *dev, uint64_t bytes, uint64_t ns);

/* mw__dev_get() - the device record for @verbs, opening it on first use:
 * its PD and CQ are made on the helper thread, then the layers take it in
 * (device_open: the memory layer registers all existing memory with the
 * new PD, off the loop when there is much).  The device comes back unready
 * (ready only if it failed at once: no helper, and the open failed there);
 * the layers' device_ready hook says when it is usable, or why not.  A
 * device that failed to open or to register keeps its slot, ready and pd
 * NULL, and the next call on it opens it anew there.
 * Return: 0 or a negative errno. */
int mw__dev_get(mw_ctx_t *ctx, struct ibv_context *verbs, struct mw__dev **devp);

/* mw__dev_ready() - @dev is taken in by every layer (@err 0), or the layer
 * registering memory with it could not (dev->why may say why; it is then
 * kept PD-less, as a failed open is, for the next mw__dev_get to open
 * anew), or it was removed meanwhile: @dev is ready, and the layers'
 * device_ready hooks are told. */
void mw__dev_ready(struct mw__dev *dev, int err);

/* mw__dev_count() / mw__dev_at() - the device records so far (opening,
 * open, failed or removed). */
int mw__dev_count(const mw_ctx_t *ctx);
struct mw__dev *mw__dev_at(const mw_ctx_t *ctx, int index);

/* mw__devs_free() - destroy CQs, PDs (after memory is deregistered). */
void mw__devs_free(mw_ctx_t *ctx);

/* mw__dev_remove() - the device was hot-removed: deregister memory from it
 * and release its CQ and PD (every QP on it must be destroyed already), so
 * the kernel can finish the removal.  The slot stays, empty: device
 * indexes (and the keys tables by index) keep their meaning. */
void mw__dev_remove(mw_ctx_t *ctx, struct mw__dev *dev);
/* mw__dev_find() - the record of verbs context @verbs (not removed), or
 * NULL. */
struct mw__dev *mw__dev_find(const mw_ctx_t *ctx, const struct ibv_context *verbs);

/* mw__dev_reserve_cqe() / mw__dev_release_cqe() - account for @n CQ entries
 * a new queue pair may produce, growing the device's CQ (up to the device's
 * max_cqe) so it can never overrun.  Return 0 or -ENOSPC / the resize error. */
int mw__dev_reserve_cqe(struct mw__dev *dev, int n);
void mw__dev_release_cqe(struct mw__dev *dev, int n);

#endif
