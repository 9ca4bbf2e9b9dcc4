/* What the sender and the receiver share: the context on meshcat's own
 * event base, the waker, the progress line, messages to the user, and
 * SIGINT/SIGTERM turned into a failure the control flow sees. */
#ifndef MESHCAT_SESSION_H
#define MESHCAT_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "cli.h"
#include "hop.h"
#include "meshwire.h"
#include "progress.h"

struct event;

struct mc_session {
    const struct mc_args *a;
    mw_ctx_t *ctx;
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
double mc_now(void);

/* SHA-256 of a stream, through OpenSSL. */
struct mc_sha {
    EVP_MD_CTX *md;
};
int mc_sha_init(struct mc_sha *h);
void mc_sha_update(struct mc_sha *h, const void *p, size_t n);
void mc_sha_final(struct mc_sha *h, uint8_t out[32]);
void mc_sha_hex(const uint8_t d[32], char out[65]);

#endif
