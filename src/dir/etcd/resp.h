/* An HTTP/1.1 response read from a buffer as it comes (etcd's gateway
 * answers: a body of Content-Length bytes, or chunked), within bounds: a
 * head line over 8 KiB is malformed, and a body over MW__ETCD_RESPONSE_MAX
 * is read past without being kept.  No I/O, no allocation of its own:
 * http.c feeds it, the fuzz target too.  Internal (mw__ names). */
#ifndef MW_DIR_ETCD_RESP_H
#define MW_DIR_ETCD_RESP_H

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

#define MW__ETCD_RESPONSE_MAX (4u << 20)   /* one response, or one watch message */

enum mw__resp_step {
    MW__RESP_MORE,                /* nothing to do until more bytes come */
    MW__RESP_DATA,                /* a streamed response: more body in @body */
    MW__RESP_DONE,                /* a response is complete (@body, or too_long) */
    MW__RESP_BAD,                 /* malformed: drop the connection */
};

struct mw__resp {
    int state, status;
    bool chunked;
    bool stream;                  /* hand the body out as it comes, no bound */
    bool too_long;                /* the complete response's body was not kept */
    size_t left;                  /* of the body or the chunk */
};

/* mw__resp_step() - read the next part of a response from @in: body bytes
 * go to @body (the caller empties it after DATA and after DONE). */
enum mw__resp_step mw__resp_step(struct mw__resp *r, struct evbuffer *in, struct evbuffer *body);

#endif
