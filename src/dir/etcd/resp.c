/* An HTTP/1.1 response read as it comes (resp.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "dir/etcd/resp.h"

#define HEAD_LINE_MAX 8192
#define BODY_MAX_DECLARED (1ull << 40)

enum { RS_STATUS, RS_HEADERS, RS_BODY, RS_CHUNK_SIZE, RS_CHUNK_DATA, RS_CHUNK_END, RS_TRAILER };

/* A line of the head (free() it), or NULL when none is complete yet (*@bad:
 * a line too long). */
static char *head_line(struct evbuffer *in, bool *bad)
{
    size_t n;
    char *line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
    *bad = (!line && evbuffer_get_length(in) > HEAD_LINE_MAX) || (line && n > HEAD_LINE_MAX);
    return line;
}

static bool header(struct mw__resp *r, const char *h)
{
    if (!strncasecmp(h, "Content-Length:", 15)) {
        char *end;
        const char *v = h + 15 + strspn(h + 15, " \t");
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || *end || n > BODY_MAX_DECLARED)
            return false;
        r->left = (size_t)n;
    } else if (!strncasecmp(h, "Transfer-Encoding:", 18)) {
        r->chunked = strstr(h + 18, "chunked") != NULL;
    }
    return true;
}

/* Move what came of the body from @in. */
static size_t take(struct mw__resp *r, struct evbuffer *in, struct evbuffer *body)
{
    size_t n = evbuffer_get_length(in);
    if (n > r->left)
        n = r->left;
    if (!r->stream && evbuffer_get_length(body) + n > MW__ETCD_RESPONSE_MAX) {
        r->too_long = true;            /* read past, never kept */
        evbuffer_drain(body, evbuffer_get_length(body));
    }
    if (r->too_long)
        evbuffer_drain(in, n);
    else
        evbuffer_remove_buffer(in, body, n);
    r->left -= n;
    return n;
}

/* A line-state's step: MORE without a line, BAD, or -1 to go on. */
static int line_step(struct mw__resp *r, char *line, bool bad)
{
    char *end;
    if (bad)
        return MW__RESP_BAD;
    if (!line)
        return MW__RESP_MORE;
    switch (r->state) {
    case RS_STATUS:
        if (sscanf(line, "HTTP/1.%*d %d", &r->status) != 1 || r->status < 100 ||
            r->status > 999)
            return MW__RESP_BAD;
        r->left = 0;
        r->chunked = r->too_long = false;
        r->state = RS_HEADERS;
        return -1;
    case RS_HEADERS:
        if (*line)
            return header(r, line) ? -1 : MW__RESP_BAD;
        r->state = r->chunked ? RS_CHUNK_SIZE : RS_BODY;
        return -1;
    case RS_CHUNK_SIZE:
        r->left = strtoul(line, &end, 16);
        if (end == line || (*end && *end != ';') || r->left > BODY_MAX_DECLARED)
            return MW__RESP_BAD;
        r->state = r->left ? RS_CHUNK_DATA : RS_TRAILER;
        return -1;
    case RS_CHUNK_END:
        if (*line)
            return MW__RESP_BAD;
        r->state = RS_CHUNK_SIZE;
        return -1;
    default:                           /* RS_TRAILER: up to an empty line */
        if (*line)
            return -1;
        r->state = RS_STATUS;
        return MW__RESP_DONE;
    }
}

enum mw__resp_step mw__resp_step(struct mw__resp *r, struct evbuffer *in, struct evbuffer *body)
{
    for (;;) {
        if (r->state == RS_BODY || r->state == RS_CHUNK_DATA) {
            size_t n = take(r, in, body);
            if (!r->left && r->state == RS_BODY) {
                r->state = RS_STATUS;
                return MW__RESP_DONE;
            }
            if (!r->left)
                r->state = RS_CHUNK_END;
            if (r->stream && n)
                return MW__RESP_DATA;
            if (r->left)
                return MW__RESP_MORE;
            continue;
        }
        bool bad;
        char *line = head_line(in, &bad);
        int rc = line_step(r, line, bad);
        free(line);                    /* evbuffer_readln's malloc */
        if (rc >= 0)
            return (enum mw__resp_step)rc;
    }
}
