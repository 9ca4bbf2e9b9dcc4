/* Where the store is and who we are there:
 * "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" (HOST may be "[IPv6]") or
 * "unix:[[USER]:PASSWORD@]PATH[?db=N]"; USER and PASSWORD percent-encoded
 * where they hold ':', '@', '/' or '%'. */
#include <errno.h>
#include <stdio.h>
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

static int hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* @len bytes at @s, percent-decoded into @out (@cap with its NUL). */
static int decode(const char *s, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < len ? hex(s[i + 1]) : -1, lo = i + 2 < len ? hex(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || !(c = hi * 16 + lo))
                return -EINVAL;   /* malformed, or a NUL */
            i += 2;
        }
        if (n + 1 >= cap)
            return -EINVAL;
        out[n++] = (char)c;
    }
    out[n] = 0;
    return 0;
}

/* "[USER]:PASSWORD@" at the start of @*s (up to @end), if there: into @a,
 * and *@s moves past it. */
static int parse_userinfo(const char **s, const char *end, struct mw__redis_addr *a)
{
    const char *at = NULL;
    for (const char *p = *s; p < end && *p != '/'; p++)
        if (*p == '@')
            at = p;               /* the last one: a password may hold '@' raw */
    if (!at)
        return 0;
    const char *colon = memchr(*s, ':', (size_t)(at - *s));
    if (!colon || decode(*s, (size_t)(colon - *s), a->user, sizeof a->user) ||
        decode(colon + 1, (size_t)(at - colon - 1), a->pass, sizeof a->pass) || !a->pass[0])
        return -EINVAL;
    *s = at + 1;
    return 0;
}

/* After "redis://". */
static int parse_redis(const char *s, struct mw__redis_addr *a)
{
    if (parse_userinfo(&s, s + strlen(s), a))
        return -EINVAL;
    const char *slash = strchr(s, '/');
    if (slash && parse_db(slash + 1, &a->db))
        return -EINVAL;
    return parse_host_port(s, slash ? (size_t)(slash - s) : strlen(s), a);
}

/* After "unix:". */
static int parse_unix(const char *s, struct mw__redis_addr *a)
{
    const char *q = strstr(s, "?db=");
    if (*s != '/' && parse_userinfo(&s, s + strlen(s), a))
        return -EINVAL;
    q = strstr(s, "?db=");
    size_t n = q ? (size_t)(q - s) : strlen(s);
    if (!n || n >= sizeof a->path || (q && parse_db(q + 4, &a->db)))
        return -EINVAL;
    memcpy(a->path, s, n);
    return 0;
}

int mw__redis_parse_url(const char *url, struct mw__redis_addr *a, const char **why)
{
    *why = "expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or "
           "unix:[[USER]:PASSWORD@]PATH[?db=N]";
    if (!url || strlen(url) >= URL_MAX)
        return -EINVAL;
    *a = (struct mw__redis_addr){.port = REDIS_PORT};
    if (!strncmp(url, "unix:", 5))
        return parse_unix(url + 5, a);
    if (strncmp(url, "redis://", 8))
        return -EINVAL;
    return parse_redis(url + 8, a);
}
