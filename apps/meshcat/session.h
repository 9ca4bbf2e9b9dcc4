/* What the sender and the receiver share: the context on meshcat's own
 * event base, the waker, the progress line, messages to the user, and
 * SIGINT/SIGTERM turned into a failure the control flow sees. */
#ifndef MESHCAT_SESSION_H
#define MESHCAT_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include <xxhash.h>

#include "cli.h"
#include "hop.h"
#include "meshwire.h"
#include "progress.h"

struct event;

struct mc_session {
    const struct mc_args *a;
    mw_ctx_t *ctx;
    mw_directory_t *dir;          /* --dir: opened with the session */
    struct event_base *base;
    struct mc_waker k;
    struct event *tick, *sigint, *sigterm;
    int interrupted;              /* the signal that stops us, 0 if none */
    /* progress of the whole run */
    uint64_t done, total;         /* total 0: unknown */
    double t0;
    struct mc_rate rate;
    bool show;                    /* the progress line is on */
    bool shown;                   /* it is on screen now */
};

int mc_session_init(struct mc_session *s, const struct mc_args *a, void (*react)(void *),
                    void *arg);
void mc_session_free(struct mc_session *s);
/* mc_say() - a message to the user on stderr (clearing the progress line);
 * @level: -1 an error (always), 0 normal (not with -q), 1 verbose. */
void mc_say(struct mc_session *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mc_progress_done(struct mc_session *s);
/* mc_summary() - the run's one-line summary over connection @c: bytes,
 * seconds, MB/s, the local NIC and the peer. */
void mc_summary(struct mc_session *s, mw_conn_t *c, char *line, size_t cap);
double mc_now(void);
/* mc_conn_opts() - connection options from the command line (-t,
 * --ack-timeout), for both ends. */
void mc_conn_opts(const struct mc_args *a, mw_conn_opts_t *o);

/* The end-to-end checksum of a file: XXH3-128, which catches corruption at
 * memory speed (SHA-256 ran at a quarter of the link's rate on rxe and
 * guards against no attacker here: the connection is not authenticated). */
#define MC_SUM_LEN 16
struct mc_sum {
    XXH3_state_t *st;
};
int mc_sum_init(struct mc_sum *h);
void mc_sum_update(struct mc_sum *h, const void *p, size_t n);
void mc_sum_final(struct mc_sum *h, uint8_t out[MC_SUM_LEN]);
/* mc_sum_drop() - give up a checksum in progress (NULL-safe, repeatable). */
void mc_sum_drop(struct mc_sum *h);
void mc_sum_hex(const uint8_t d[MC_SUM_LEN], char out[2 * MC_SUM_LEN + 1]);

#endif
