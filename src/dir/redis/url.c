/* Where the store is: "redis://HOST[:PORT][/DB]" (HOST may be "[IPv6]")
 * or "unix:PATH[?db=N]". */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dir/redis/redis.h"

#define URL_MAX 512
#define REDIS_PORT 6379

static int parse_db(const char *s, int *db)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v > 1000000)
        return -EINVAL;
    *db = (int)v;
    return 0;
}

/* @len bytes at @s: a decimal port 1..65535. */
static int parse_port(const char *s, size_t len, int *port)
{
    char buf[8] = {0};
    char *end;
    if (!len || len >= sizeof buf)
        return -EINVAL;
    memcpy(buf, s, len);
    long v = strtol(buf, &end, 10);
    if (*end || v < 1 || v > 65535)
        return -EINVAL;
    *port = (int)v;
    return 0;
}

/* @len bytes at @h: HOST, HOST:PORT, [V6] or [V6]:PORT. */
static int parse_host_port(const char *h, size_t len, struct mw__redis_addr *a)
{
    const char *end = h + len, *colon = NULL;
    if (*h == '[') {
        const char *rb = memchr(h, ']', len);
        if (!rb)
            return -EINVAL;
        colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
        if (rb + 1 != end && !colon)
            return -EINVAL;
        h++;
        len = (size_t)(rb - h);
    } else if ((colon = memchr(h, ':', len))) {
        len = (size_t)(colon - h);
    }
    if (colon && parse_port(colon + 1, (size_t)(end - colon - 1), &a->port))
        return -EINVAL;
    if (!len || len >= sizeof a->host)
        return -EINVAL;
    memcpy(a->host, h, len);
    return 0;
}

/* After "redis://". */
static int parse_redis(const char *s, struct mw__redis_addr *a)
{
    const char *slash = strchr(s, '/');
    if (slash && parse_db(slash + 1, &a->db))
        return -EINVAL;
    return parse_host_port(s, slash ? (size_t)(slash - s) : strlen(s), a);
}

/* After "unix:". */
static int parse_unix(const char *s, struct mw__redis_addr *a)
{
    const char *q = strstr(s, "?db=");
    size_t n = q ? (size_t)(q - s) : strlen(s);
    if (!n || n >= sizeof a->path || (q && parse_db(q + 4, &a->db)))
        return -EINVAL;
    memcpy(a->path, s, n);
    return 0;
}

int mw__redis_parse_url(const char *url, struct mw__redis_addr *a, const char **why)
{
    *why = "expected redis://HOST[:PORT][/DB] or unix:PATH[?db=N]";
    if (!url || strlen(url) >= URL_MAX)
        return -EINVAL;
    *a = (struct mw__redis_addr){.port = REDIS_PORT};
    if (!strncmp(url, "unix:", 5))
        return parse_unix(url + 5, a);
    if (strncmp(url, "redis://", 8))
        return -EINVAL;
    return parse_redis(url + 8, a);
}
