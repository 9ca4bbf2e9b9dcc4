/* The directory's store (dir/store.h) on etcd v3, inside: what the files
 * of this folder share.
 *
 *   open.c    the URL, open and close: the store's life, both links started
 *   http.c    a link: an HTTP/1.1 connection to etcd's JSON gateway (look
 *             up, connect, lose, retry), its requests in order, each with a
 *             deadline
 *   resp.c    a response read as it comes, within bounds (no I/O: fuzzed)
 *   ops.c     each operation: the gateway calls that make it
 *   events.c  the event link: a watch on the prefix, streamed
 *   json.c    JSON in (json-c) and out, base64
 *
 * An HTTP client of our own rather than libevent's evhttp: every
 * descriptor and timer goes through the context (mw_ctx_fd callers wake
 * for the store's traffic too, as with Redis), and a response is read only
 * up to a bound.
 *
 * Entries map onto etcd as they do onto Redis: an entry is a key with a
 * lease of its own (granted, kept alive by renewals, revoked by a delete:
 * a revoke removes the key only while it is still attached to that lease,
 * so never a later publisher's; the store remembers the leases of its own
 * puts, so that a delete is one call, sent even as the store closes).  Lists are ranges over the prefix, a page
 * at a time; watches are one etcd watch on the prefix, whose events carry
 * the values.  etcd's leases count in whole seconds, at least its minimum
 * (2 s by default): a lease_ms below that lasts that long there.  etcd has
 * no filter on a value's size: values (up to etcd's own 1.5 MiB limit) are
 * read and those over MW__STORE_VALUE_MAX dropped; a response over
 * MW__ETCD_RESPONSE_MAX is read past, never kept, and fails -EMSGSIZE (a
 * list then reads that page in smaller ones). */
#ifndef MW_DIR_ETCD_H
#define MW_DIR_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/list.h"
#include "dir/etcd/resp.h"
#include "dir/store.h"
#include "meshwire.h"

struct event;
struct evbuffer;
struct mw__lookup;
struct json_object;


/* open.c */
int mw__etcd_open(mw_ctx_t *ctx, const char *url, const char *prefix,
                  const struct mw__store_cfg *cfg, const struct mw__store_hooks *hooks,
                  struct mw__store **out, const char **why);

/* http.c: a request's answer: @err 0 and the response's JSON object (valid
 * during the call), or a negative errno and @why (-ETIMEDOUT: no answer by
 * its deadline; -ECANCELED: the store closed; -EIO: etcd answered an
 * error, @why says what; -EPROTO: an answer not understood; -EMSGSIZE:
 * over MW__ETCD_RESPONSE_MAX). */
typedef void (*mw__etcd_fn)(void *arg, int err, const char *why, struct json_object *res);

struct mw__etcd_link {
    struct mw__etcd *st;
    bool events;                  /* the watch's link */
    int fd;                       /* -1: none */
    bool connected, up;
    struct mw__lookup *lookup;
    struct event *rev, *wev;
    struct event *retry_ev;       /* reconnect, or give up a step at the timeout */
    unsigned retry_ms;
    struct evbuffer *out, *in;
    struct mw__resp resp;         /* the response being read (resp.h) */
    struct evbuffer *body;
    void (*ready)(struct mw__etcd_link *l);   /* connected: its own setup */
    /* the event link: the streamed body's bytes, as they come */
    void (*data)(struct mw__etcd_link *l, struct evbuffer *b);
};

struct mw__etcd {
    struct mw__store base;        /* first: what the directory holds */
    mw_ctx_t *ctx;
    char host[256];
    char hostport[300];           /* for the Host header */
    int port;
    unsigned timeout_ms;
    char *prefix;
    struct mw__store_hooks hooks;
    struct mw__etcd_link req, ev;
    struct mw__list waiting;      /* requests not answered, in order; the
                                     first is in flight while req is up */
    bool closing;
    struct mw__list leases;       /* ours: key -> lease, for one-call deletes */
    struct event *reap_ev;        /* closed: free it from the loop */
};

int mw__etcd_link_init(struct mw__etcd *st, struct mw__etcd_link *l, bool events,
                       void (*ready)(struct mw__etcd_link *l));
void mw__etcd_link_connect(struct mw__etcd_link *l);
void mw__etcd_link_close(struct mw__etcd_link *l);
/* mw__etcd_link_up() - @l's setup is done: it carries traffic. */
void mw__etcd_link_up(struct mw__etcd_link *l);
/* mw__etcd_link_drop() - a link that went wrong (@why): closed, retried. */
void mw__etcd_link_drop(struct mw__etcd_link *l, const char *why);
/* mw__etcd_send() - POST @path with @body on @l (its events link only). */
void mw__etcd_send(struct mw__etcd_link *l, const char *path, const char *body);

/* mw__etcd_request() - POST @body (JSON) to @path on the request link, now
 * or once it is up; @fn gets the answer once.  Return: 0 or -ENOMEM. */
int mw__etcd_request(struct mw__etcd *st, const char *path, const char *body, mw__etcd_fn fn,
                     void *arg);
/* mw__etcd_request_next() - the same, sent before anything that waits:
 * an operation's next step, so that its steps are not interleaved with
 * another's (a renewal between a put's grant and its put would find no
 * entry), as the one command of each operation is with Redis. */
int mw__etcd_request_next(struct mw__etcd *st, const char *path, const char *body,
                          mw__etcd_fn fn, void *arg);
/* mw__etcd_read() - the same for a read that changes nothing: a caller
 * asking what another asked, not yet sent, joins it and gets its answer
 * (made after both asked), so that many lookups of one name at once are
 * one request, not a queue longer than the timeout. */
int mw__etcd_read(struct mw__etcd *st, const char *path, const char *body, mw__etcd_fn fn,
                  void *arg);
/* The request link is up: what waits goes out.  (Its ready.) */
void mw__etcd_requests_ready(struct mw__etcd_link *l);
/* Closing: what waits fails -ECANCELED; with @keep_deletes and the link
 * up, lease revokes (and what is in flight) still go out, their answers
 * dropped (etcd drops a request whose connection closes).  Return: whether
 * any still goes. */
bool mw__etcd_requests_cancel(struct mw__etcd *st, bool keep_deletes);
/* Closing and nothing left to send: free the store from the loop. */
void mw__etcd_done_maybe(struct mw__etcd *st);

/* events.c: the event link's setup */
void mw__etcd_events_ready(struct mw__etcd_link *l);
void mw__etcd_events_data(struct mw__etcd_link *l, struct evbuffer *b);

/* ops.c */
extern const struct mw__store_ops mw__etcd_ops;
/* mw__etcd_reap_now() - free @st (closed; its reap_ev's callback). */
void mw__etcd_reap_now(struct mw__etcd *st);

/* json.c */
/* mw__b64_encode() - @len bytes at @in into @out (room for 4*ceil(len/3)+1). */
void mw__b64_encode(const void *in, size_t len, char *out);
/* mw__b64_decode() - @in (NUL-terminated) into @out (room for 3/4 of its
 * length).  Return: the bytes, or -1 when @in is not base64. */
long mw__b64_decode(const char *in, char *out);
/* mw__json_parse() - @len bytes of JSON (not NUL-terminated), or NULL. */
struct json_object *mw__json_parse(const char *text, size_t len);
/* mw__json_str() - the string member @name of @o, or NULL. */
const char *mw__json_str(struct json_object *o, const char *name);
/* mw__json_obj() - the member @name of @o, or NULL. */
struct json_object *mw__json_obj(struct json_object *o, const char *name);
/* mw__json_u64() - member @name as a number (the gateway writes 64-bit
 * numbers as strings); @def when absent. */
uint64_t mw__json_u64(struct json_object *o, const char *name, uint64_t def);
/* mw__json_bytes() - the base64 member @name decoded into a new string
 * (mw__free it), its length in *@len; NULL when absent, malformed, or
 * longer than @max (then *@len is what it would be). */
char *mw__json_bytes(struct json_object *o, const char *name, size_t max, size_t *len);

#endif
