/* meshcat: command line parsing (see cli.h for the grammar). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef MW_VERSION
#define MW_VERSION "unknown"
#endif

#if defined(__GNUC__)
#define MC_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MC_PRINTF(f, a)
#endif

enum opt_id {
    O_LISTEN, O_TO, O_PORT, O_OUTPUT, O_FORCE, O_QUIET, O_VERBOSE, O_PROGRESS,
    O_TIMEOUT, O_CHUNK, O_WINDOW, O_ACK_TIMEOUT, O_DIR, O_NAME, O_HELP, O_VERSION,
};

enum opt_arg { ARG_NONE, ARG_REQUIRED, ARG_OPTIONAL };

struct opt_def {
    const char *name;
    char letter;        /* 0: long form only */
    enum opt_id id;
    enum opt_arg arg;
};

static const struct opt_def opt_defs[] = {
    {"listen", 'l', O_LISTEN, ARG_OPTIONAL},
    {"to", 0, O_TO, ARG_REQUIRED},
    {"port", 'p', O_PORT, ARG_REQUIRED},
    {"output", 'o', O_OUTPUT, ARG_REQUIRED},
    {"force", 'f', O_FORCE, ARG_NONE},
    {"quiet", 'q', O_QUIET, ARG_NONE},
    {"verbose", 'v', O_VERBOSE, ARG_NONE},
    {"progress", 'P', O_PROGRESS, ARG_NONE},
    {"timeout", 't', O_TIMEOUT, ARG_REQUIRED},
    {"chunk", 0, O_CHUNK, ARG_REQUIRED},
    {"window", 0, O_WINDOW, ARG_REQUIRED},
    {"ack-timeout", 0, O_ACK_TIMEOUT, ARG_REQUIRED},
    {"dir", 0, O_DIR, ARG_REQUIRED},
    {"name", 0, O_NAME, ARG_REQUIRED},
    {"help", 'h', O_HELP, ARG_NONE},
    {"version", 'V', O_VERSION, ARG_NONE},
};
#define NOPTS (sizeof opt_defs / sizeof opt_defs[0])

/* What the options said; operands are interpreted once all are seen, since
 * -p applies to addresses given before it too. */
struct state {
    int argc;
    char **argv;
    int i;              /* the element being looked at */
    int pstart;         /* operands seen so far: argv[pstart..i) */
    bool listen;
    const char *listen_spec;
    const char *to_lists[MC_MAX_TO];
    int nto_lists;
    bool operand_before_to;
    int port;
    bool quiet;
    int verbose;
    char *err;
    size_t errcap;
    struct mc_args *a;
};

MC_PRINTF(2, 3)
static enum mc_parse_result fail(struct state *s, const char *fmt, ...)
{
    va_list ap;

    if (s->err && s->errcap) {
        va_start(ap, fmt);
        vsnprintf(s->err, s->errcap, fmt, ap);
        va_end(ap);
    }
    return MC_PARSE_USAGE;
}

MC_PRINTF(3, 4)
static int reason(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (why && cap) {
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* ------------------------------------------------------------------------
 * Numbers and addresses
 * ------------------------------------------------------------------------ */

/* Plain decimal digits only: strtoul would also take a sign, spaces and
 * "0x", none of which belong in a port or a count.
 * Return: 0, -EINVAL (not a number) or -ERANGE (above @max). */
static int parse_dec(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    bool big = false;

    if (n == 0)
        return -EINVAL;
    for (size_t k = 0; k < n; k++) {
        unsigned d = (unsigned)(s[k] - '0');

        if (d > 9)
            return -EINVAL;
        if (big || v > (max - d) / 10)
            big = true;
        else
            v = v * 10 + d;
    }
    *out = v;
    return big ? -ERANGE : 0;
}

static int parse_port(const char *txt, int *port, char *why, size_t cap)
{
    uint64_t v = 0;
    int rc = parse_dec(txt, strlen(txt), 65535, &v);

    if (rc == -EINVAL)
        return reason(why, cap, "bad port '%s'", txt);
    if (rc || v == 0)
        return reason(why, cap, "port %s out of range (1..65535)", txt);
    *port = (int)v;
    return 0;
}

static int check_host(const char *host, size_t len, char *why, size_t cap)
{
    if (len >= MC_HOST_MAX)
        return reason(why, cap, "host name longer than %d bytes", MC_HOST_MAX - 1);
    for (size_t k = 0; k < len; k++) {
        unsigned char c = (unsigned char)host[k];

        if (c <= 0x20 || c == 0x7f)
            return reason(why, cap, "bad byte 0x%02x in host", c);
        if (c == '/' || c == '[' || c == ']' || c == ',')
            return reason(why, cap, "bad character '%c' in host", c);
    }
    return 0;
}

static int endpoint_parse(const char *spec, int dport, struct mc_endpoint *out, char *why,
                          size_t cap)
{
    const char *host = spec, *port = NULL;
    size_t hlen;
    int p = dport;

    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');

        if (!close)
            return reason(why, cap, "missing ']'");
        host = spec + 1;
        hlen = (size_t)(close - host);
        if (hlen == 0)
            return reason(why, cap, "empty address in []");
        if (close[1] == ':')
            port = close + 2;
        else if (close[1])
            return reason(why, cap, "unexpected text after ']'");
    } else {
        const char *colon = strchr(spec, ':');

        /* Two colons or more: a bare IPv6 address, which cannot carry a
         * port without brackets. */
        if (colon && !strchr(colon + 1, ':'))
            port = colon + 1;
        hlen = port ? (size_t)(colon - spec) : strlen(spec);
    }
    if (check_host(host, hlen, why, cap))
        return -EINVAL;
    if (port && parse_port(port, &p, why, cap))
        return -EINVAL;
    if (p < 1 || p > 65535)
        return reason(why, cap, "no port given");
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    out->port = p;
    return 0;
}

int mc_parse_endpoint(const char *spec, int default_port, struct mc_endpoint *out)
{
    if (!spec || !out)
        return -EINVAL;
    return endpoint_parse(spec, default_port, out, NULL, 0);
}

/* K and M are binary, as chunk sizes are; anything else is a typo. */
static int parse_size(const char *txt, uint64_t *out)
{
    size_t n = strspn(txt, "0123456789");
    const char *suf = txt + n;
    uint64_t mult, v;

    if (!*suf)
        mult = 1;
    else if (!strcmp(suf, "K") || !strcmp(suf, "k") || !strcmp(suf, "KiB"))
        mult = 1024;
    else if (!strcmp(suf, "M") || !strcmp(suf, "m") || !strcmp(suf, "MiB"))
        mult = (uint64_t)1 << 20;
    else
        return -EINVAL;
    int rc = parse_dec(txt, n, UINT32_MAX, &v);

    if (rc)
        return rc;
    *out = v * mult;
    return 0;
}

/* ------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------ */

static enum mc_parse_result opt_timeout(struct state *s, const char *val)
{
    char *end;
    double v = strtod(val, &end);

    if (end == val || *end || !isfinite(v) || !(v > 0))
        return fail(s, "bad timeout '%s' (seconds, > 0)", val);
    s->a->timeout_s = v;
    return MC_PARSE_OK;
}

static enum mc_parse_result opt_chunk(struct state *s, const char *val)
{
    uint64_t v = 0;
    int rc = parse_size(val, &v);

    if (rc == -EINVAL)
        return fail(s, "bad chunk size '%s' (bytes, or with a K or M suffix)", val);
    if (rc || v < MC_CHUNK_MIN || v > MC_CHUNK_MAX)
        return fail(s, "chunk size '%s' out of range (4K..64M)", val);
    s->a->chunk = (size_t)v;
    return MC_PARSE_OK;
}

static enum mc_parse_result opt_window(struct state *s, const char *val)
{
    uint64_t v = 0;
    int rc = parse_dec(val, strlen(val), MC_WINDOW_MAX, &v);

    if (rc == -EINVAL)
        return fail(s, "bad window '%s'", val);
    if (rc || v == 0)
        return fail(s, "window '%s' out of range (1..%u)", val, MC_WINDOW_MAX);
    s->a->window = (unsigned)v;
    return MC_PARSE_OK;
}

static enum mc_parse_result opt_ack_timeout(struct state *s, const char *val)
{
    char *end;
    double v = strtod(val, &end);

    if (end == val || *end || !isfinite(v) || v < 0 || v > 4e6)
        return fail(s, "bad ACK timeout '%s' (milliseconds, 0..4000000; 0: rdma_cm's)", val);
    s->a->ack_timeout_us = (int64_t)(v * 1000 + 0.5);
    if (v > 0 && s->a->ack_timeout_us == 0)
        s->a->ack_timeout_us = 1;
    return MC_PARSE_OK;
}

static enum mc_parse_result opt_to(struct state *s, const char *val)
{
    if (s->nto_lists == MC_MAX_TO)
        return fail(s, "too many receivers in --to (at most %d)", MC_MAX_TO);
    if (s->nto_lists == 0 && s->i > s->pstart)
        s->operand_before_to = true;
    s->to_lists[s->nto_lists++] = val;
    return MC_PARSE_OK;
}

static enum mc_parse_result apply_value(struct state *s, enum opt_id id, const char *val)
{
    char why[96];

    switch (id) {
    case O_TO:
        return opt_to(s, val);
    case O_PORT:
        if (parse_port(val, &s->port, why, sizeof why))
            return fail(s, "%s", why);
        return MC_PARSE_OK;
    case O_OUTPUT:
        if (!val[0])
            return fail(s, "empty path for -o/--output");
        s->a->output = val;
        return MC_PARSE_OK;
    case O_TIMEOUT:
        return opt_timeout(s, val);
    case O_CHUNK:
        return opt_chunk(s, val);
    case O_WINDOW:
        return opt_window(s, val);
    case O_ACK_TIMEOUT:
        return opt_ack_timeout(s, val);
    case O_DIR:
        if (!val[0])
            return fail(s, "empty URL for --dir");
        s->a->dir = val;
        return MC_PARSE_OK;
    case O_NAME:
        if (!val[0] || !strchr(val, '/'))
            return fail(s, "--name '%s': a directory name has a '/' (job/role/id)", val);
        s->a->name = val;
        return MC_PARSE_OK;
    default:
        return fail(s, "internal error: option %d given a value", (int)id);
    }
}

/* @val: -l's optional address, NULL for everything else. */
static enum mc_parse_result apply_flag(struct state *s, enum opt_id id, const char *val)
{
    switch (id) {
    case O_LISTEN:
        s->listen = true;
        s->listen_spec = val;
        return MC_PARSE_OK;
    case O_FORCE:
        s->a->force = true;
        return MC_PARSE_OK;
    case O_QUIET:
        s->quiet = true;
        return MC_PARSE_OK;
    case O_VERBOSE:
        s->verbose++;
        return MC_PARSE_OK;
    case O_PROGRESS:
        s->a->progress = true;
        return MC_PARSE_OK;
    case O_HELP:
        return MC_PARSE_HELP;
    case O_VERSION:
        return MC_PARSE_VERSION;
    default:
        return fail(s, "internal error: option %d needs a value", (int)id);
    }
}

static enum mc_parse_result apply(struct state *s, const struct opt_def *d, const char *val)
{
    if (d->arg != ARG_REQUIRED)
        return apply_flag(s, d->id, val);
    if (!val)   /* callers see to it; this keeps a new table entry safe */
        return fail(s, "option '--%s' needs a value", d->name);
    return apply_value(s, d->id, val);
}

/* -l's argument is optional and separate: the next element, unless it looks
 * like an option (or there is none). */
static bool next_is_operand(const struct state *s)
{
    return s->i + 1 < s->argc && s->argv[s->i + 1][0] != '-';
}

static enum mc_parse_result long_opt(struct state *s, int *used)
{
    const char *name = s->argv[s->i] + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const struct opt_def *d = NULL;
    const char *val = NULL;

    for (size_t k = 0; k < NOPTS; k++)
        if (strlen(opt_defs[k].name) == len && !strncmp(opt_defs[k].name, name, len))
            d = &opt_defs[k];
    if (!d)
        return fail(s, "unknown option '--%.*s'", (int)len, name);
    if (eq && d->arg == ARG_NONE)
        return fail(s, "option '--%s' takes no value", d->name);
    if (eq) {
        val = eq + 1;
    } else if (d->arg == ARG_REQUIRED) {
        if (s->i + 1 >= s->argc)
            return fail(s, "option '--%s' needs a value", d->name);
        val = s->argv[s->i + 1];
        *used = 2;
    } else if (d->arg == ARG_OPTIONAL && next_is_operand(s)) {
        val = s->argv[s->i + 1];
        *used = 2;
    }
    return apply(s, d, val);
}

static const struct opt_def *find_letter(char c)
{
    for (size_t k = 0; k < NOPTS; k++)
        if (opt_defs[k].letter && opt_defs[k].letter == c)
            return &opt_defs[k];
    return NULL;
}

/* A cluster like "-vvf" or "-p9000": a letter that takes a value ends it. */
static enum mc_parse_result short_opts(struct state *s, int *used)
{
    for (const char *p = s->argv[s->i] + 1; *p; p++) {
        const struct opt_def *d = find_letter(*p);
        const char *val = NULL;

        if (!d)
            return fail(s, "unknown option '-%c'", *p);
        if (d->arg == ARG_REQUIRED) {
            if (p[1]) {
                val = p + 1;
            } else if (s->i + 1 < s->argc) {
                val = s->argv[s->i + 1];
                *used = 2;
            } else {
                return fail(s, "option '-%c' needs a value", *p);
            }
            return apply(s, d, val);
        }
        if (d->arg == ARG_OPTIONAL && !p[1] && next_is_operand(s)) {
            val = s->argv[s->i + 1];
            *used = 2;
        }
        enum mc_parse_result r = apply(s, d, val);

        if (r != MC_PARSE_OK)
            return r;
    }
    return MC_PARSE_OK;
}

/* Move the @n elements at i in front of the operands seen so far, so the
 * operands stay one contiguous, ordered run (GNU getopt's permutation). */
static void take(struct state *s, int n)
{
    char *saved[2];

    memcpy(saved, s->argv + s->i, (size_t)n * sizeof *saved);
    memmove(s->argv + s->pstart + n, s->argv + s->pstart,
            (size_t)(s->i - s->pstart) * sizeof *s->argv);
    memcpy(s->argv + s->pstart, saved, (size_t)n * sizeof *saved);
    s->pstart += n;
    s->i += n;
}

static enum mc_parse_result scan(struct state *s)
{
    while (s->i < s->argc) {
        const char *arg = s->argv[s->i];
        int used = 1;
        enum mc_parse_result r;

        if (!strcmp(arg, "--")) {
            take(s, 1);
            return MC_PARSE_OK;     /* the rest are operands, already in place */
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            s->i++;                 /* an operand ("-" is one too) */
            continue;
        }
        r = arg[1] == '-' ? long_opt(s, &used) : short_opts(s, &used);
        if (r != MC_PARSE_OK)
            return r;
        take(s, used);
    }
    return MC_PARSE_OK;
}

/* ------------------------------------------------------------------------
 * Operands
 * ------------------------------------------------------------------------ */

/* @list: the --to list @spec came from, or NULL for the HOST operand. */
static enum mc_parse_result add_receiver(struct state *s, const char *spec, const char *list)
{
    struct mc_args *a = s->a;
    struct mc_endpoint ep = {.port = 0};
    char why[96];

    if (endpoint_parse(spec, s->port, &ep, why, sizeof why))
        return fail(s, "bad address '%s': %s", spec, why);
    if (!ep.host[0] && list)
        return fail(s, "empty host in --to list '%s'", list);
    if (!ep.host[0])
        return fail(s, "missing host in '%s'", spec);
    for (int k = 0; k < a->nto; k++)
        if (a->to[k].port == ep.port && !strcasecmp(a->to[k].host, ep.host))
            return fail(s, "duplicate receiver '%s' in --to", spec);
    if (a->nto == MC_MAX_TO)
        return fail(s, "too many receivers in --to (at most %d)", MC_MAX_TO);
    a->to[a->nto++] = ep;
    return MC_PARSE_OK;
}

static enum mc_parse_result add_to_list(struct state *s, const char *list)
{
    char spec[MC_HOST_MAX + 16];
    const char *p = list;

    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);

        if (n == 0)
            return fail(s, "empty host in --to list '%s'", list);
        if (n >= sizeof spec)
            return fail(s, "address too long in --to list: '%.40s...'", p);
        memcpy(spec, p, n);
        spec[n] = '\0';
        enum mc_parse_result r = add_receiver(s, spec, list);

        if (r != MC_PARSE_OK || !comma)
            return r;
        p = comma + 1;
    }
}

/* A HOST operand given along with --to: anything before --to, or a first
 * FILE that reads as HOST:PORT or [v6] (and is no path). */
static bool looks_like_host(const char *s)
{
    const char *colon = strchr(s, ':');

    if (strchr(s, '/'))
        return false;
    if (s[0] == '[')
        return true;
    return colon && colon == strrchr(s, ':') && colon[1] &&
           strspn(colon + 1, "0123456789") == strlen(colon + 1);
}

/* The receiver keeps only the last component, '\\' counting as a separator
 * too (names.c): two files with the same one would land on one name. */
static const char *base_of(const char *path)
{
    const char *b = path;

    for (; *path; path++)
        if (*path == '/' || *path == '\\')
            b = path + 1;
    return b;
}

static int cmp_base(const void *x, const void *y)
{
    return strcmp(base_of(*(char *const *)x), base_of(*(char *const *)y));
}

/* Sorting makes this n log n for a shell glob of thousands of files;
 * without memory for the copy, fall back to comparing every pair. */
static bool find_dup(char **files, int n, const char **x, const char **y)
{
    char **v = malloc((size_t)n * sizeof *v);
    bool found = false;

    if (v) {
        memcpy(v, files, (size_t)n * sizeof *v);
        qsort(v, (size_t)n, sizeof *v, cmp_base);
        for (int k = 1; k < n && !found; k++)
            if (!cmp_base(&v[k - 1], &v[k]))
                *x = v[k - 1], *y = v[k], found = true;
        free(v);
        return found;
    }
    for (int k = 0; k < n && !found; k++)
        for (int j = k + 1; j < n && !found; j++)
            if (!cmp_base(&files[k], &files[j]))
                *x = files[k], *y = files[j], found = true;
    return found;
}

static enum mc_parse_result set_files(struct state *s, char **files, int n)
{
    const char *x, *y;

    s->a->files = n ? files : NULL;
    s->a->nfiles = n;
    if (n > 1 && find_dup(files, n, &x, &y))
        return fail(s, "two files named '%s' ('%s' and '%s'): the receiver would keep one",
                    base_of(x), x, y);
    return MC_PARSE_OK;
}

static enum mc_parse_result finish_recv(struct state *s, char **ops, int nops)
{
    char why[96];
    const char *spec = s->listen_spec ? s->listen_spec : "";

    if (s->nto_lists)
        return fail(s, "-l and --to can't be used together");
    if (nops)
        return fail(s, "unexpected argument '%s': -l takes no HOST or FILE", ops[0]);
    if (endpoint_parse(spec, s->port, &s->a->listen, why, sizeof why))
        return fail(s, "bad listen address '%s': %s", spec, why);
    if (s->a->name && !s->a->dir)
        return fail(s, "--name needs --dir URL (the directory to publish in)");
    s->a->mode = MC_RECV;
    return MC_PARSE_OK;
}

static enum mc_parse_result finish_send(struct state *s, char **ops, int nops)
{
    enum mc_parse_result r = MC_PARSE_OK;

    if (s->a->output)
        return fail(s, "-o/--output is only for receiving (-l)");
    if (s->a->force)
        return fail(s, "-f/--force is only for receiving (-l)");
    s->a->mode = MC_SEND;
    if (s->a->name)
        return fail(s, "--name is for receiving (-l); to send to a name, give it as HOST");
    if (!s->nto_lists && strchr(ops[0], '/') && !looks_like_host(ops[0])) {
        if (!s->a->dir)
            return fail(s, "'%s' is a directory name: give --dir URL to look it up", ops[0]);
        s->a->name = ops[0];             /* a receiver found by name */
        s->a->nto = 1;
        return set_files(s, ops + 1, nops - 1);
    }
    if (!s->nto_lists) {
        r = add_receiver(s, ops[0], NULL);
        return r != MC_PARSE_OK ? r : set_files(s, ops + 1, nops - 1);
    }
    if (nops && (s->operand_before_to || looks_like_host(ops[0])))
        return fail(s, "both HOST '%s' and --to given (a file named so: write ./%s)", ops[0],
                    ops[0]);
    for (int k = 0; k < s->nto_lists && r == MC_PARSE_OK; k++)
        r = add_to_list(s, s->to_lists[k]);
    return r != MC_PARSE_OK ? r : set_files(s, ops, nops);
}

static void set_defaults(struct mc_args *a)
{
    memset(a, 0, sizeof *a);
    a->mode = MC_SEND;
    a->timeout_s = MC_DEFAULT_TIMEOUT_S;
    a->chunk = MC_DEFAULT_CHUNK;
    a->window = MC_DEFAULT_WINDOW;
    a->ack_timeout_us = -1;
}

enum mc_parse_result mc_parse_args(int argc, char **argv, struct mc_args *a, char *err,
                                   size_t errcap)
{
    struct state s = {
        .argc = argc, .argv = argv, .i = 1, .pstart = 1,
        .port = MC_DEFAULT_PORT, .err = err, .errcap = errcap, .a = a,
    };

    set_defaults(a);
    if (err && errcap)
        err[0] = '\0';
    if (argc < 1 || !argv)
        return fail(&s, "no arguments");
    enum mc_parse_result r = scan(&s);

    if (r == MC_PARSE_HELP || r == MC_PARSE_VERSION)
        set_defaults(a);
    if (r != MC_PARSE_OK)
        return r;
    if (s.quiet && s.verbose)
        return fail(&s, "-q and -v can't be used together");
    a->verbose = s.quiet ? -1 : s.verbose;

    char **ops = argv + s.pstart;
    int nops = argc - s.pstart;

    if (s.listen)
        return finish_recv(&s, ops, nops);
    if (!nops && !s.nto_lists)
        return fail(&s, "nothing to do: give -l to receive, or HOST or --to to send");
    return finish_send(&s, ops, nops);
}

/* ------------------------------------------------------------------------
 * Help
 * ------------------------------------------------------------------------ */

/* Line by line: ISO C only promises string literals of 4095 bytes. */
static const char *const usage_text[] = {
    "Usage:",
    "  meshcat -l [ADDR][:PORT] [-o PATH] [-f] [options]       receive",
    "  meshcat [options] HOST[:PORT] [FILE...]                 send",
    "  meshcat [options] --to HOST[:PORT],HOST[:PORT],... [FILE...]",
    "  meshcat --dir URL -l --name NAME / meshcat --dir URL NAME [FILE...]",
    "",
    "Copies files over RDMA, netcat-style.  With no FILE, the sender sends its",
    "standard input.  With --to, the same data goes to every receiver listed.",
    "IPv6 addresses take brackets when a port follows: [fe80::1]:7471.",
    "",
    "Modes:",
    "  -l, --listen [ADDR][:PORT]  receive; ADDR defaults to all local",
    "                          addresses, PORT to --port",
    "  HOST[:PORT]             send to one receiver",
    "      --to LIST           send to several receivers: comma-separated",
    "                          HOST[:PORT], at most 64, no duplicates (a FILE",
    "                          that looks like HOST:PORT must be written ./FILE)",
    "",
    "Options:",
    "  -p, --port PORT         port for addresses given without one",
    "                          (default 7471)",
    "  -o, --output PATH       receive: write to PATH, a file or a directory, or",
    "                          - for standard output (default: a stream from the",
    "                          sender's stdin goes to standard output, files to",
    "                          their sent names in the current directory)",
    "  -f, --force             receive: overwrite existing files (default: refuse)",
    "  -t, --timeout SECONDS   connect and peer timeout, decimals allowed",
    "                          (default 10)",
    "      --chunk SIZE        bytes per RDMA chunk; K and M suffixes mean",
    "                          KiB and MiB; 4K..64M (default 1M)",
    "      --window N          chunks in flight, 1..64 (default 8)",
    "      --dir URL           a meshwire directory (redis://HOST[:PORT],",
    "                          unix:PATH or etcd://HOST[:PORT]): with -l,",
    "                          --name NAME publishes the",
    "                          receiver there; sending, a HOST with a '/' is a",
    "                          name looked up there",
    "      --name NAME         receive: publish as NAME (job/role/id)",
    "      --ack-timeout MS    how long the NIC waits for an acknowledgement",
    "                          before resending, decimals allowed (default:",
    "                          meshwire's, 16.8, on soft-RoCE 134; 0: rdma_cm's,",
    "                          1000-2000 on RoCE)",
    "  -q, --quiet             no progress line, errors only",
    "  -P, --progress          show the progress line even when standard error",
    "                          is not a terminal (default: only on a terminal)",
    "  -v, --verbose           more detail; repeat for more (default: progress",
    "                          line and summary)",
    "  -h, --help              show this help and exit",
    "  -V, --version           show the version and exit",
    "  --                      end of options",
    "",
    "Exit status:",
    "  0  success",
    "  1  transfer failure",
    "  2  usage error",
    "",
    "Examples:",
    "  meshcat -l -o /data                      receive into /data on port 7471",
    "  meshcat node1 disk.img                   send disk.img to node1:7471",
    "  tar c dir | meshcat 10.0.0.2:9000        send a stream from stdin",
    "  meshcat --to node1,node2,[fe80::3]:9000 a.bin b.bin    fan-out to three",
    "  meshcat --dir redis://10.0.0.1 -l --name job/sink/0   receive, found by name",
    "  meshcat --dir redis://10.0.0.1 job/sink/0 a.bin       send to that name",
};

void mc_usage(FILE *f)
{
    for (size_t k = 0; k < sizeof usage_text / sizeof usage_text[0]; k++)
        fprintf(f, "%s\n", usage_text[k]);
}

void mc_version(FILE *f)
{
    fprintf(f, "meshcat %s\n", MW_VERSION);
}
