/* Communicators from what launchers put in the environment: the rank and
 * world size under the names torchrun, Open MPI, MPICH/Hydra and Slurm use
 * (or meshwire's own), and the peers from a hostfile or MW_PEERS.  Several
 * ranks on one host get consecutive ports, so "node1 node1 node2 node2" (or
 * "node1 slots=2" per line, as in MPI hostfiles) just works. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/launch.h"
#include "core/alloc.h"

#define MAX_RANKS 65536
#define MAX_SLOTS 1024
#define MAX_HOSTFILE (16u << 20)

static int fail(char *why, size_t cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *why, size_t cap, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return err;
}

void mw__peer_list_free(char **peers, int n)
{
    for (int i = 0; i < n && peers; i++)
        mw__free(peers[i]);
    mw__free(peers);
}

/* Does @entry end in ":PORT"?  ("[v6]:p", "v4:p", "name:p"; a bare v6
 * address has several colons and no port.) */
static bool has_port(const char *entry)
{
    const char *last = strrchr(entry, ',');
    const char *tail = last ? last + 1 : entry;
    const char *colon = strrchr(tail, ':');
    if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
        return false;
    const char *bracket = strrchr(tail, ']');
    return bracket ? colon == bracket + 1 : strchr(tail, ':') == colon;
}

struct list {
    char **v;
    int n, cap;
    unsigned base_port;
};

/* The port of an entry without one: the base, plus one for each earlier
 * entry naming the same addresses (ranks sharing a host). */
static int add(struct list *l, const char *entry, size_t len)
{
    if (l->n >= MAX_RANKS)
        return -E2BIG;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **v = mw__realloc(l->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    char *e = mw__malloc(len + 8);
    if (!e)
        return -ENOMEM;
    memcpy(e, entry, len);
    e[len] = 0;
    if (!has_port(e)) {
        unsigned same = 0;
        for (int i = 0; i < l->n; i++)
            same += !strncmp(l->v[i], e, len) && l->v[i][len] == ':';
        if (l->base_port + same > 65535) {
            mw__free(e);
            return -ERANGE;
        }
        snprintf(e + len, 8, ":%u", l->base_port + same);
    }
    l->v[l->n++] = e;
    return 0;
}

/* "slots=N" after an entry: N ranks there in all. */
static int parse_slots(const char *tok, size_t len, long *slots)
{
    char buf[32];
    if (len <= 6 || len >= sizeof buf || strncmp(tok, "slots=", 6))
        return -EINVAL;
    memcpy(buf, tok + 6, len - 6);
    buf[len - 6] = 0;
    char *end;
    *slots = strtol(buf, &end, 10);
    return *end || *slots < 1 || *slots > MAX_SLOTS ? -EINVAL : 0;
}

int mw__peer_list_parse(const char *text, unsigned base_port, char ***peers, int *n, char *why,
                        size_t cap)
{
    struct list l = {.base_port = base_port};
    const char *p = text;
    int line = 1, rc = 0;
    const char *last = NULL;      /* the previous entry, for slots= */
    size_t last_len = 0;
    while (*p && !rc) {
        if (*p == '#') {          /* a comment runs to the end of its line */
            p += strcspn(p, "\n");
            continue;
        }
        if (strchr(" \t\r\n;", *p)) {
            line += *p++ == '\n';
            continue;
        }
        size_t len = strcspn(p, " \t\r\n;#");
        long slots;
        if (!strncmp(p, "slots=", 6)) {
            if (!last || parse_slots(p, len, &slots)) {
                rc = fail(why, cap, -EINVAL, "line %d: '%.*s' must follow an address and be "
                          "slots=1..%d", line, (int)len, p, MAX_SLOTS);
                break;
            }
            for (long s = 1; s < slots && !rc; s++)
                rc = add(&l, last, last_len);
        } else {
            rc = add(&l, p, len);
            last = p;
            last_len = len;
        }
        if (rc == -ERANGE)
            rc = fail(why, cap, rc, "line %d: too many ranks on '%.*s' for ports from %u",
                      line, (int)len, p, base_port);
        else if (rc == -E2BIG)
            rc = fail(why, cap, rc, "more than %d ranks", MAX_RANKS);
        else if (rc)
            rc = fail(why, cap, rc, "no memory");
        p += len;
    }
    if (!rc && l.n == 0)
        rc = fail(why, cap, -EINVAL, "no peers listed");
    if (rc) {
        mw__peer_list_free(l.v, l.n);
        return rc;
    }
    *peers = l.v;
    *n = l.n;
    return 0;
}

/* The first of @names set in the environment, its name in *@which. */
static const char *first_env(const char *const *names, const char **which)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static int env_int(const char *const *names, int *out, const char **which, char *why, size_t cap)
{
    const char *v = first_env(names, which);
    if (!v)
        return 1;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > MAX_RANKS)
        return fail(why, cap, -EINVAL, "%s='%s' is not a rank number", *which, v);
    *out = (int)x;
    return 0;
}

static char *read_file(const char *path, char *why, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fail(why, cap, -errno, "cannot open MW_HOSTFILE %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = mw__malloc(MAX_HOSTFILE + 1);
    size_t len = text ? fread(text, 1, MAX_HOSTFILE + 1, f) : 0;
    bool bad = !text || ferror(f) || len > MAX_HOSTFILE;
    fclose(f);
    if (bad) {
        fail(why, cap, -EINVAL, "cannot read MW_HOSTFILE %s (or larger than %u bytes)", path,
             MAX_HOSTFILE);
        mw__free(text);
        return NULL;
    }
    text[len] = 0;
    return text;
}

static const char *const RANK_VARS[] = {"MW_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                        "SLURM_PROCID", NULL};
static const char *const SIZE_VARS[] = {"MW_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                        "PMI_SIZE", "SLURM_NTASKS", NULL};

int mw__launch_from_env(unsigned default_port, struct mw__launch *out, char *why, size_t cap)
{
    *out = (struct mw__launch){0};
    const char *rank_var = NULL, *size_var = NULL;
    int rc = env_int(RANK_VARS, &out->rank, &rank_var, why, cap);
    if (rc > 0)
        return fail(why, cap, -EINVAL, "no rank: set MW_RANK (or RANK, OMPI_COMM_WORLD_RANK, "
                    "PMI_RANK, SLURM_PROCID)");
    if (rc < 0)
        return rc;
    int size = -1;
    if ((rc = env_int(SIZE_VARS, &size, &size_var, why, cap)) < 0)
        return rc;
    unsigned base = default_port;
    const char *port = getenv("MW_PORT");
    if (port && *port) {
        char *end;
        long x = strtol(port, &end, 10);
        if (*end || x < 1 || x > 65535)
            return fail(why, cap, -EINVAL, "MW_PORT='%s' is not a port", port);
        base = (unsigned)x;
    }
    const char *hostfile = getenv("MW_HOSTFILE"), *list = getenv("MW_PEERS");
    char *text = NULL;
    if (hostfile && *hostfile) {
        if (!(text = read_file(hostfile, why, cap)))
            return -EINVAL;
        list = text;
    } else if (!list || !*list) {
        return fail(why, cap, -EINVAL, "no peers: set MW_HOSTFILE (a file, one rank per line) "
                    "or MW_PEERS (addresses separated by spaces)");
    }
    char sub[160];
    rc = mw__peer_list_parse(list, base, &out->peers, &out->nranks, sub, sizeof sub);
    mw__free(text);
    if (rc)
        return fail(why, cap, rc, "%s: %s", hostfile && *hostfile ? hostfile : "MW_PEERS", sub);
    if (size >= 0 && size != out->nranks)
        rc = fail(why, cap, -EINVAL, "%s=%d but the peer list has %d ranks", size_var, size,
                  out->nranks);
    else if (out->rank >= out->nranks)
        rc = fail(why, cap, -EINVAL, "%s=%d but there are only %d ranks", rank_var, out->rank,
                  out->nranks);
    if (rc) {
        mw__peer_list_free(out->peers, out->nranks);
        out->peers = NULL;
    }
    return rc;
}

mw_future_t *mw_comm_create_env(mw_ctx_t *ctx, const mw_comm_opts_t *opts)
{
    mw_comm_opts_t o;
    if (!opts) {
        mw_comm_opts_init(&o);
        opts = &o;
    }
    struct mw__launch l;
    char why[256];
    int rc = mw__launch_from_env(opts->conn.default_port, &l, why, sizeof why);
    if (rc) {
        mw_future_t *f = ctx ? mw_future_new(ctx) : NULL;
        if (f)
            mw_future_fail(f, rc, "%s", why);
        return f;
    }
    mw_future_t *f = mw_comm_create(ctx, l.rank, l.nranks, (const char *const *)l.peers, opts);
    mw__peer_list_free(l.peers, l.nranks);
    return f;
}
