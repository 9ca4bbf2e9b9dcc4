/* A hop: one meshcat connection, upstream or downstream, with a receive
 * always pending on it.  CREDIT messages are counted on arrival; other
 * messages queue until the transfer's control flow asks for them
 * (mc_hop_next).  Anything that happens on a hop -- a message, a credit, a
 * completed write, a failure -- kicks the transfer (a callback), whose
 * control flow sleeps in mw_wait until then: nothing polls. */
#ifndef MESHCAT_HOP_H
#define MESHCAT_HOP_H

#include <stdbool.h>
#include <stdint.h>

#include "meshwire.h"
#include "proto.h"

struct mc_qmsg;

/* Where a transfer's control flow sleeps: every event kicks it, after
 * @react (the transfer's reaction to failures, run on the loop) looked. */
struct mc_waker {
    mw_ctx_t *ctx;
    mw_future_t *w;               /* the sleeper's, while it sleeps */
    void (*react)(void *arg);
    void *arg;
};
void mc_kick(struct mc_waker *k);
/* mc_sleep() - run the loop until the next kick.  Not from callbacks. */
void mc_sleep(struct mc_waker *k);

struct mc_hop {
    mw_ctx_t *ctx;
    mw_conn_t *c;
    char name[300];               /* the peer as the user named it */
    mw_remote_t ring;             /* downstream: the receiver's ring */
    size_t chunk;
    unsigned window;
    uint64_t posted, written;     /* downstream: chunks written / completed */
    uint64_t credits;             /* downstream: slots the receiver freed */
    int err;                      /* the hop failed: a negative errno */
    char why[600];
    bool peer_error;              /* why came from the peer's ERROR */
    bool closed;                  /* the peer said BYE or closed cleanly */
    bool told;                    /* we sent the peer our ERROR: closing
                                     lets it arrive (an abort would drop it) */
    struct mc_qmsg *head, *tail;
    struct mc_waker *waker;       /* kicked when anything happens */
};

/* mc_hop_start() - adopt @c: the reader starts. */
void mc_hop_start(struct mc_hop *h, struct mc_waker *k, mw_conn_t *c, const char *name);
/* mc_hop_connect() - connect to @name ("host:port"), wait at most
 * @o->timeout_ms. */
int mc_hop_connect(struct mc_hop *h, struct mc_waker *k, mw_directory_t *dir,
                   const char *name, const mw_conn_opts_t *o);
/* mc_hop_give_up() - fail @h for @err, telling the peer @why (its ERROR)
 * first, unless @h failed already. */
void mc_hop_give_up(struct mc_hop *h, int err, const char *why);
/* mc_hop_next() - wait for the next queued message (not CREDIT); 0, or the
 * hop's error (a peer's ERROR included).  Runs the loop: not from callbacks. */
int mc_hop_next(struct mc_hop *h, struct mc_msg *out);
/* mc_hop_fail() - mark @h failed (first reason wins) and kick. */
void mc_hop_fail(struct mc_hop *h, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* mc_hop_can_post() - a ring slot is free downstream and so is the local
 * buffer of the chunk that used it last. */
bool mc_hop_can_post(const struct mc_hop *h);
/* mc_hop_post() - write @len bytes at @buf (registered) as the next chunk. */
int mc_hop_post(struct mc_hop *h, const void *buf, size_t len);
/* mc_hop_close() - graceful close (after BYE), or abort when it failed. */
void mc_hop_close(struct mc_hop *h);

#endif
