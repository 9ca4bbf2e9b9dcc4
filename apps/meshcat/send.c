/* The sending side: files (or stdin) read into registered buffers and
 * written chunk by chunk into the first receiver's ring, as many in flight
 * as the window allows; the pump runs on every kick (a credit, a completed
 * write, stdin readable), so the control flow only sleeps and checks. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "meshcat.h"
#include "names.h"

struct sender {
    struct mc_session s;
    struct mc_hop down;
    uint8_t *bufs;                /* window buffers of chunk bytes, registered */
    /* the file being sent */
    int fd;
    bool eof, sending, readable_wait;
    size_t fill;                  /* bytes read into the next chunk so far */
    uint64_t chunks, bytes;       /* of this file */
    struct mc_sum sum;
    int read_err;
    struct event *readable;
};

/* Read into the next chunk's buffer; true when it is ready to post (full,
 * or partial at EOF, or partial while a pipe has nothing more now). */
static bool fill_chunk(struct sender *x, uint8_t *buf)
{
    size_t chunk = x->s.a->chunk;
    while (x->fill < chunk) {
        ssize_t n = read(x->fd, buf + x->fill, chunk - x->fill);
        if (n > 0) {
            x->fill += (size_t)n;
        } else if (n == 0) {
            x->eof = true;
            break;
        } else if (errno == EAGAIN) {
            if (!x->fill) {
                x->readable_wait = true;
                event_add(x->readable, NULL);
            }
            return x->fill > 0;   /* send what an interactive stream gave */
        } else if (errno != EINTR) {
            x->read_err = -errno;
            x->eof = true;
            return false;
        }
    }
    return x->fill > 0;
}

static void pump(struct sender *x)
{
    struct mc_hop *h = &x->down;
    while (x->sending && !x->eof && !x->readable_wait && mc_hop_can_post(h)) {
        uint8_t *buf = x->bufs + (h->posted % h->window) * h->chunk;
        if (!fill_chunk(x, buf))
            continue;             /* EOF with nothing read, an error, or wait */
        mc_sum_update(&x->sum, buf, x->fill);
        if (mc_hop_post(h, buf, x->fill) < 0) {
            mc_hop_fail(h, -ENOMEM, "out of memory");
            return;
        }
        x->chunks++;
        x->bytes += x->fill;
        x->s.done += x->fill;
        x->fill = 0;
    }
}

static void react(void *arg)
{
    struct sender *x = arg;
    if (x->s.interrupted && !x->down.err)
        mc_hop_fail(&x->down, -EINTR, "interrupted");
    pump(x);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct sender *x = arg;
    x->readable_wait = false;
    mc_kick(&x->s.k);
}

/* Open FILE (or stdin for NULL); its name for the receiver and its size
 * (MC_SIZE_UNKNOWN for a stream). */
static int open_source(struct sender *x, const char *path, struct mc_msg *m)
{
    struct stat st;
    x->fd = path ? open(path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
    if (x->fd < 0 || fstat(x->fd, &st) < 0) {
        mc_say(&x->s, -1, "%s: %s", path, strerror(errno));
        return -errno;
    }
    if (S_ISDIR(st.st_mode)) {
        mc_say(&x->s, -1, "%s: is a directory (send its files, or tar it to stdin)", path);
        return -EISDIR;
    }
    *m = (struct mc_msg){.type = MC_FILE, .a = S_ISREG(st.st_mode) ? (uint64_t)st.st_size
                                                                    : MC_SIZE_UNKNOWN,
                         .b = st.st_mode & 0777};
    if (path) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", path);
        snprintf(m->text, sizeof m->text, "%s", basename(tmp));
    }
    if (!S_ISREG(st.st_mode))     /* a pipe or terminal: never block the loop */
        fcntl(x->fd, F_SETFL, fcntl(x->fd, F_GETFL) | O_NONBLOCK);
    x->readable = event_new(x->s.base, x->fd, EV_READ, on_readable, x);
    return x->readable ? 0 : -ENOMEM;
}

static void close_source(struct sender *x)
{
    if (x->readable)
        event_free(x->readable);
    x->readable = NULL;
    if (x->fd > STDIN_FILENO)
        close(x->fd);
    x->fd = -1;
}

static int fail_hop(struct sender *x)
{
    mc_say(&x->s, -1, "%s", x->down.why);
    return x->down.err;
}

/* One file: announce, stream, finish; 0 once every receiver verified it. */
static int send_one(struct sender *x, const char *path)
{
    struct mc_msg m;
    int rc = open_source(x, path, &m);
    if (rc)
        return rc;
    mc_send(x->down.c, &m);
    struct mc_msg r;
    if ((rc = mc_hop_next(&x->down, &r)))
        return fail_hop(x);
    if (r.type != MC_FILE_OK) {
        mc_hop_fail(&x->down, -EPROTO, "%s: sent %s, not FILE_OK", x->down.name,
                    mc_type_name(r.type));
        return fail_hop(x);
    }
    x->eof = x->readable_wait = false;
    x->chunks = x->bytes = 0;
    x->read_err = 0;
    mc_sum_init(&x->sum);
    x->sending = true;
    pump(x);
    while (!x->down.err && !(x->eof && x->down.written == x->down.posted))
        mc_sleep(&x->s.k);
    x->sending = false;
    close_source(x);
    m = (struct mc_msg){.type = MC_END, .a = x->chunks, .b = x->bytes};
    mc_sum_final(&x->sum, m.sum);
    if (x->down.err)
        return fail_hop(x);
    if (x->read_err) {
        mc_say(&x->s, -1, "%s: read failed: %s", path ? path : "stdin", strerror(-x->read_err));
        mc_send_simple(x->down.c, MC_ERROR, 0, 0, "the sender could not read its file");
        return x->read_err;
    }
    mc_send(x->down.c, &m);
    if ((rc = mc_hop_next(&x->down, &r)))
        return fail_hop(x);
    if (r.type != MC_DONE) {
        mc_hop_fail(&x->down, -EPROTO, "%s: sent %s, not DONE", x->down.name,
                    mc_type_name(r.type));
        return fail_hop(x);
    }
    char hex[2 * MC_SUM_LEN + 1];
    mc_sum_hex(m.sum, hex);
    mc_say(&x->s, 1, "%s: %llu bytes, checksum %s verified by %s", path ? path : "stdin",
           (unsigned long long)x->bytes, hex, r.text);
    return 0;
}

/* HELLO to the first receiver, naming the ones after it; READY back once
 * the whole chain is up. */
static int open_chain(struct sender *x)
{
    const struct mc_args *a = x->s.a;
    char first[300];
    if (a->name)
        snprintf(first, sizeof first, "%s", a->name);
    else
        snprintf(first, sizeof first, strchr(a->to[0].host, ':') ? "[%s]:%d" : "%s:%d",
                 a->to[0].host, a->to[0].port);
    mw_conn_opts_t o;
    mc_conn_opts(a, &o);
    if (mc_hop_connect(&x->down, &x->s.k, a->name ? x->s.dir : NULL, first, &o))
        return fail_hop(x);
    struct mc_msg m = {.type = MC_HELLO, .a = a->chunk, .b = a->window};
    for (int i = 1; i < a->nto; i++) {
        size_t len = strlen(m.text);
        snprintf(m.text + len, sizeof m.text - len, strchr(a->to[i].host, ':') ? "%s[%s]:%d"
                                                                              : "%s%s:%d",
                 i > 1 ? "," : "", a->to[i].host, a->to[i].port);
    }
    mc_send(x->down.c, &m);
    struct mc_msg r;
    if (mc_hop_next(&x->down, &r))
        return fail_hop(x);
    if (r.type != MC_READY || r.ring.len < (uint64_t)a->chunk * a->window) {
        mc_hop_fail(&x->down, -EPROTO, "%s: bad READY", first);
        return fail_hop(x);
    }
    x->down.ring = r.ring;
    x->down.chunk = a->chunk;
    x->down.window = a->window;
    mc_say(&x->s, 1, "connected: %s", r.text);
    return 0;
}

static uint64_t total_size(const struct mc_args *a)
{
    uint64_t t = 0;
    for (int i = 0; i < a->nfiles; i++) {
        struct stat st;
        if (stat(a->files[i], &st) < 0 || !S_ISREG(st.st_mode))
            return 0;
        t += (uint64_t)st.st_size;
    }
    return a->nfiles ? t : 0;
}

static void summary(struct sender *x)
{
    char line[600];
    mc_summary(&x->s, x->down.c, line, sizeof line);
    mc_say(&x->s, 0, "sent %s%s", line, x->s.a->nto > 1 ? " (first hop of the chain)" : "");
}

int mc_send_main(const struct mc_args *a)
{
    struct sender x = {.fd = -1};
    if (mc_session_init(&x.s, a, react, &x) < 0) {
        fprintf(stderr, "meshcat: cannot set up: %s\n", strerror(errno));
        mc_session_free(&x.s);
        return MC_EXIT_FAIL;
    }
    x.s.total = total_size(a);
    int rc = open_chain(&x);
    if (!rc && !(x.bufs = mw_alloc(x.s.ctx, a->chunk * a->window)))
        rc = -ENOMEM;
    for (int i = 0; !rc && i < (a->nfiles ? a->nfiles : 1); i++)
        rc = send_one(&x, a->nfiles ? a->files[i] : NULL);
    close_source(&x);
    mc_progress_done(&x.s);
    if (!rc) {
        mc_send_simple(x.down.c, MC_BYE, 0, 0, NULL);
        summary(&x);
    } else if (!x.down.err && x.down.c) {  /* our own failure: say so, then go */
        mc_send_simple(x.down.c, MC_ERROR, 0, 0, "the sender gave up (see its messages)");
    }
    mc_hop_close(&x.down);
    mw_free(x.s.ctx, x.bufs);
    mc_session_free(&x.s);
    return rc ? MC_EXIT_FAIL : MC_EXIT_OK;
}
