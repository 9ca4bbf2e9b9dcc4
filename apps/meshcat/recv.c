/* The receiving side, and the relay of a fan-out chain.  One sender per run,
 * as with netcat.  Chunks land in our registered ring; on every kick each
 * arrived chunk is written to the output and hashed, and on a relay also
 * written on from the same slot into the next receiver's ring; a slot is
 * credited back to the sender once both are done with it.  A file is
 * written to a hidden temporary of its own and renamed only after its
 * checksum matched the sender's (and the rest of the chain's did too). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshcat.h"
#include "names.h"

#define RING_MAX (1ull << 30)     /* chunk * window a sender may ask for */

struct receiver {
    struct mc_session s;
    struct mc_hop up, down;       /* down.c is NULL unless relaying */
    mw_listener_t *listener;
    mw_conn_t *accepted;
    uint8_t *ring;
    size_t chunk;
    unsigned window;
    uint32_t *lens;               /* of arrived chunks, by slot */
    uint64_t arrived, head, freed;    /* chunks: landed / consumed / credited */
    /* the file being received */
    bool receiving;
    int fd;                       /* output; -1 none */
    bool to_stdout;
    char final[PATH_MAX];         /* the name the user sees */
    int dirfd;                    /* final's directory; -1 none */
    char base[MC_NAME_MAX + 1];   /* final's name in dirfd */
    char part[MC_NAME_MAX + 1];   /* the temporary in dirfd; "" none */
    uint64_t file_first, bytes;   /* its first chunk; its bytes so far */
    struct mc_sum sum;
    int write_err;
    int files_out;                /* files written this run (for -o FILE) */
    bool said;                    /* the failure was reported to the user */
};

static bool relaying(const struct receiver *x)
{
    return x->down.c != NULL;
}

/* Write what arrived, pass it on, credit what is done with. */
static void consume(struct receiver *x)
{
    while (x->receiving && !x->write_err && x->head < x->arrived) {
        if (relaying(x) && !mc_hop_can_post(&x->down))
            break;
        uint64_t slot = x->head % x->window;
        const uint8_t *p = x->ring + slot * x->chunk;
        size_t len = x->lens[slot];
        for (size_t off = 0; off < len;) {
            ssize_t n = write(x->fd, p + off, len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                x->write_err = n < 0 ? -errno : -EIO;
                return;
            }
            off += (size_t)n;
        }
        mc_sum_update(&x->sum, p, len);
        if (relaying(x) && mc_hop_post(&x->down, p, len) < 0) {
            mc_hop_fail(&x->down, -ENOMEM, "out of memory");
            return;
        }
        x->bytes += len;
        x->s.done += len;
        x->head++;
    }
    /* a slot is free once written out and, on a relay, read by the device */
    uint64_t done = relaying(x) ? x->down.written : x->head;
    if (done > x->freed && !x->up.err) {
        mc_send_simple(x->up.c, MC_CREDIT, done - x->freed, 0, NULL);
        x->freed = done;
    }
}

static void react(void *arg)
{
    struct receiver *x = arg;
    char why[700];
    if (x->s.interrupted) {
        snprintf(why, sizeof why, "receiver interrupted (signal %d)", x->s.interrupted);
        mc_hop_give_up(&x->up, -EINTR, why);
    }
    if (relaying(x) && x->down.err && !x->up.err)
        mc_hop_give_up(&x->up, x->down.err, x->down.why);  /* the chain is broken downstream */
    if (x->write_err && !x->up.err) {
        snprintf(why, sizeof why, "%.400s: cannot write: %s", x->to_stdout ? "stdout" : x->final,
                 strerror(-x->write_err));
        mc_hop_give_up(&x->up, x->write_err, why);
    }
    if (!x->up.err)
        consume(x);
}

static void on_imm(mw_conn_t *c, uint32_t imm, void *arg)
{
    (void)c;
    struct receiver *x = arg;
    if (!x->receiving || x->arrived - x->freed >= x->window || imm > x->chunk) {
        mc_hop_give_up(&x->up, -EPROTO, "the sender wrote outside the protocol");
        return;
    }
    x->lens[x->arrived++ % x->window] = imm;
    mc_kick(&x->s.k);
}

static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct receiver *x = arg;
    if (x->accepted) {
        mw_conn_abort(c);         /* one sender per run */
        return;
    }
    x->accepted = c;
    mc_kick(&x->s.k);
}

/* --- where a file goes ---------------------------------------------------- */

static int choose_output(struct receiver *x, const struct mc_msg *m, char *err, size_t cap)
{
    const char *o = x->s.a->output;
    bool stream = m->text[0] == 0;
    x->to_stdout = (o && !strcmp(o, "-")) || (!o && stream);
    if (x->to_stdout)
        return 0;
    char name[MC_NAME_MAX + 1];
    if (stream) {
        snprintf(name, sizeof name, "stdin");
    } else if (mc_safe_name(m->text, name, sizeof name)) {
        snprintf(err, cap, "refused the file name '%.200s'", m->text);
        return -EINVAL;
    }
    struct stat st;
    if (o && stat(o, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(x->final, sizeof x->final, "%s/%s", o, name);
    } else if (o) {
        if (x->files_out) {
            snprintf(err, cap, "several files need -o DIR, and %.200s is not a directory", o);
            return -ENOTDIR;
        }
        snprintf(x->final, sizeof x->final, "%s", o);
    } else {
        snprintf(x->final, sizeof x->final, "%s", name);
    }
    return 0;
}

/* Open x->final's directory; x->base is its name there. */
static int open_dir(struct receiver *x, char *err, size_t cap)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", x->final);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    if (!*base || strlen(base) > MC_NAME_MAX) {
        snprintf(err, cap, "%.400s: %s", x->final, *base ? "name too long" : "no file name");
        return *base ? -ENAMETOOLONG : -EINVAL;
    }
    snprintf(x->base, sizeof x->base, "%s", base);
    if (slash)
        slash[1] = 0;
    else
        snprintf(dir, sizeof dir, ".");
    x->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (x->dirfd < 0) {
        int rc = -errno;
        snprintf(err, cap, "%.400s: %s", dir, strerror(errno));
        return rc;
    }
    return 0;
}

static int open_output(struct receiver *x, const struct mc_msg *m, char *err, size_t cap)
{
    int rc = choose_output(x, m, err, cap);
    if (rc || x->to_stdout) {
        x->fd = rc ? -1 : STDOUT_FILENO;
        return rc;
    }
    if ((rc = open_dir(x, err, cap)))
        return rc;
    /* early, to spare a transfer bound to fail; publish() is what makes sure */
    struct stat st;
    if (!x->s.a->force && fstatat(x->dirfd, x->base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        snprintf(err, cap, "%.400s exists (the receiver may pass -f to overwrite)", x->final);
        return -EEXIST;
    }
    mode_t mode = m->b & 0777 ? (mode_t)(m->b & 0777) : 0644;
    x->fd = mc_part_open(x->dirfd, x->base, mode, x->part, sizeof x->part);
    if (x->fd < 0) {
        rc = x->fd;
        x->fd = -1;
        snprintf(err, cap, "%.400s: cannot create a temporary file beside it: %s", x->final,
                 strerror(-rc));
    }
    return rc;
}

/* Close the output; a temporary is removed. */
static void discard_output(struct receiver *x)
{
    if (x->fd >= 0 && !x->to_stdout)
        close(x->fd);
    if (x->part[0])
        unlinkat(x->dirfd, x->part, 0);
    if (x->dirfd >= 0)
        close(x->dirfd);
    x->fd = x->dirfd = -1;
    x->part[0] = 0;
}

/* Verified: make it visible under its final name (never over an existing
 * file unless -f, even one that appeared since open_output() looked). */
static int publish(struct receiver *x, char *err, size_t cap)
{
    if (x->to_stdout) {
        x->fd = -1;
        return 0;
    }
    int rc = mc_part_publish(x->dirfd, x->fd, x->part, x->base, x->s.a->force);
    x->fd = -1;
    x->part[0] = 0;               /* gone: renamed, or removed on failure */
    discard_output(x);
    if (rc == -EEXIST && !x->s.a->force)
        snprintf(err, cap,
                 "%.400s exists (it appeared during the transfer; the receiver may pass -f to "
                 "overwrite)", x->final);
    else if (rc)
        snprintf(err, cap, "%.400s: %s", x->final, strerror(-rc));
    return rc;
}

/* --- one file ------------------------------------------------------------- */

/* Forward @m down the chain and wait for the reply of type @want. */
static int ask_down(struct receiver *x, const struct mc_msg *m, enum mc_type want)
{
    if (!relaying(x))
        return 0;
    mc_send(x->down.c, m);
    struct mc_msg r;
    int rc = mc_hop_next(&x->down, &r);
    if (!rc && r.type != want)
        mc_hop_fail(&x->down, rc = -EPROTO, "%s: sent %s, not %s", x->down.name,
                    mc_type_name(r.type), mc_type_name(want));
    return rc;
}

static int fail_file(struct receiver *x, int err, const char *why)
{
    discard_output(x);
    mc_sum_drop(&x->sum);
    x->receiving = false;
    mc_hop_give_up(&x->up, err, why);
    mc_say(&x->s, -1, "%s", why);
    x->said = true;
    return err;
}

static int receive_file(struct receiver *x, const struct mc_msg *fm)
{
    char err[700];
    int rc = open_output(x, fm, err, sizeof err);
    if (rc)
        return fail_file(x, rc, err);
    if ((rc = ask_down(x, fm, MC_FILE_OK)))
        return fail_file(x, rc, x->down.why);
    x->file_first = x->head;
    x->bytes = 0;
    x->write_err = 0;
    mc_sum_init(&x->sum);
    x->receiving = true;
    if (fm->a != MC_SIZE_UNKNOWN)
        x->s.total += fm->a;
    mc_send_simple(x->up.c, MC_FILE_OK, 0, 0, NULL);
    struct mc_msg end;
    if ((rc = mc_hop_next(&x->up, &end)))
        return fail_file(x, rc, x->up.why);
    if (end.type != MC_END)
        return fail_file(x, -EPROTO, "the sender broke the protocol (no END)");
    while (!x->up.err && x->head < x->file_first + end.a)
        mc_sleep(&x->s.k);
    while (!x->up.err && relaying(x) && x->down.written < x->down.posted)
        mc_sleep(&x->s.k);
    x->receiving = false;
    uint8_t sum[MC_SUM_LEN];
    mc_sum_final(&x->sum, sum);
    if (x->up.err)
        return fail_file(x, x->up.err, x->up.why);
    const char *name = x->to_stdout ? "stdout" : x->final;
    if (x->bytes != end.b || memcmp(sum, end.sum, MC_SUM_LEN)) {
        snprintf(err, sizeof err, "%.400s: checksum mismatch (%llu of %llu bytes): data corrupted",
                 name, (unsigned long long)x->bytes, (unsigned long long)end.b);
        return fail_file(x, -EBADMSG, err);
    }
    if ((rc = ask_down(x, &end, MC_DONE)))
        return fail_file(x, rc, x->down.why);
    if ((rc = publish(x, err, sizeof err)))
        return fail_file(x, rc, err);
    x->files_out++;
    char hex[65], who[400];
    mc_sum_hex(sum, hex);
    mw_conn_stats_t st;
    mw_conn_stats(x->up.c, &st);
    snprintf(who, sizeof who, "%s (%s)%s", st.local, st.device, relaying(x) ? " and on" : "");
    mc_send_simple(x->up.c, MC_DONE, 0, 0, who);
    mc_say(&x->s, 1, "%s: %llu bytes, checksum %s verified", name, (unsigned long long)x->bytes,
           hex);
    return 0;
}

/* --- the session ---------------------------------------------------------- */

/* Listen on @addr and publish it under --name (a sender connecting by
 * name takes the directory's region table first: meshcat shares none). */
static int publish_name(struct receiver *x, const char *addr, const mw_conn_opts_t *o)
{
    mw_dir_pub_t pub = {.listen = addr, .conn = o, .on_accept = on_accept, .arg = x,
                        .tag = "meshcat"};
    mw_future_t *f = mw_dir_publish(x->s.dir, x->s.a->name, &pub);
    int rc = f ? mw_wait(f) : -ENOMEM;
    if (rc)
        mc_say(&x->s, -1, "publishing %s: %s", x->s.a->name, f ? mw_future_message(f) : "");
    mw_future_unref(f);
    return rc;
}

static int accept_one(struct receiver *x)
{
    const struct mc_args *a = x->s.a;
    char addr[300];
    snprintf(addr, sizeof addr, strchr(a->listen.host, ':') ? "[%s]:%d" : "%s:%d",
             a->listen.host[0] ? a->listen.host : "*", a->listen.port);
    mw_conn_opts_t o;
    mc_conn_opts(a, &o);
    int rc = a->name ? publish_name(x, addr, &o)
                     : mw_listen(x->s.ctx, addr, &o, on_accept, x, &x->listener);
    if (rc) {
        mc_say(&x->s, -1, "cannot listen on %s: %s", addr, mw_strerror(rc));
        return rc;
    }
    mc_say(&x->s, 1, "listening on %s%s%s", addr, a->name ? " as " : "", a->name ? a->name : "");
    while (!x->accepted && !x->s.interrupted)
        mc_sleep(&x->s.k);
    if (a->name)
        mw_future_unref(mw_dir_unpublish(x->s.dir, a->name));   /* one sender: done */
    mw_listener_free(x->listener);
    x->listener = NULL;
    if (!x->accepted)
        return -EINTR;
    mw_conn_stats_t st;
    mw_conn_stats(x->accepted, &st);
    mc_hop_start(&x->up, &x->s.k, x->accepted, st.remote);
    return 0;
}

/* Connect to the next receiver of the chain, if any; READY from it. */
static int open_down(struct receiver *x, const char *hops)
{
    if (!*hops)
        return 0;
    char next[300];
    snprintf(next, sizeof next, "%.*s", (int)strcspn(hops, ","), hops);
    const char *rest = hops + strcspn(hops, ",");
    rest += *rest == ',';
    mw_conn_opts_t o;
    mc_conn_opts(x->s.a, &o);
    if (mc_hop_connect(&x->down, &x->s.k, NULL, next, &o))
        return -ECONNREFUSED;
    struct mc_msg m = {.type = MC_HELLO, .a = x->chunk, .b = x->window}, r;
    snprintf(m.text, sizeof m.text, "%s", rest);
    mc_send(x->down.c, &m);
    if (mc_hop_next(&x->down, &r))
        return x->down.err;
    if (r.type != MC_READY || r.ring.len < (uint64_t)x->chunk * x->window) {
        mc_hop_fail(&x->down, -EPROTO, "%s: bad READY", next);
        return -EPROTO;
    }
    x->down.ring = r.ring;
    x->down.chunk = x->chunk;
    x->down.window = x->window;
    return 0;
}

static int handshake(struct receiver *x)
{
    struct mc_msg m;
    int rc = mc_hop_next(&x->up, &m);
    if (rc)
        return rc;
    if (m.type != MC_HELLO || m.a < 1 || m.b < 1 || m.b > MC_WINDOW_MAX || m.a > MC_CHUNK_MAX ||
        m.a * m.b > RING_MAX) {
        mc_hop_give_up(&x->up, -EPROTO, "bad HELLO");
        return -EPROTO;
    }
    x->chunk = m.a;
    x->window = (unsigned)m.b;
    if ((rc = open_down(x, m.text))) {
        mc_hop_give_up(&x->up, rc, x->down.why);
        return rc;
    }
    x->ring = mw_alloc(x->s.ctx, x->chunk * x->window);
    x->lens = calloc(x->window, sizeof *x->lens);
    struct mc_msg r = {.type = MC_READY};
    if (!x->ring || !x->lens || mw_mem_export(x->up.c, x->ring, x->chunk * x->window, &r.ring)) {
        mc_hop_give_up(&x->up, -ENOMEM, "the receiver is out of memory");
        return -ENOMEM;
    }
    mw_conn_stats_t st;
    mw_conn_stats(x->up.c, &st);
    snprintf(r.text, sizeof r.text, "%s (%s)", st.local, st.device);
    mw_conn_on_imm(x->up.c, on_imm, x);
    mc_send(x->up.c, &r);
    return 0;
}

static void summary(struct receiver *x)
{
    char line[600];
    mc_summary(&x->s, x->up.c, line, sizeof line);
    mc_say(&x->s, 0, "received %d file%s, %s", x->files_out, x->files_out == 1 ? "" : "s", line);
}

int mc_recv_main(const struct mc_args *a)
{
    struct receiver x = {.fd = -1, .dirfd = -1};
    if (mc_session_init(&x.s, a, react, &x) < 0) {
        fprintf(stderr, "meshcat: cannot set up: %s\n", strerror(errno));
        mc_session_free(&x.s);
        return MC_EXIT_FAIL;
    }
    int rc = accept_one(&x);
    if (!rc && !(rc = handshake(&x))) {
        x.s.t0 = mc_now();
        mc_rate_init(&x.s.rate, x.s.t0);
    }
    struct mc_msg m;
    while (!rc && !(rc = mc_hop_next(&x.up, &m)) && m.type != MC_BYE) {
        if (m.type != MC_FILE) {
            mc_hop_give_up(&x.up, -EPROTO, "the sender broke the protocol");
            rc = -EPROTO;
        } else {
            rc = receive_file(&x, &m);
        }
    }
    mc_progress_done(&x.s);
    if (!rc) {
        if (relaying(&x))
            mc_send_simple(x.down.c, MC_BYE, 0, 0, NULL);
        summary(&x);
    } else if (!x.said && x.up.err) {
        mc_say(&x.s, -1, "%s%s", x.up.peer_error ? "transfer failed: " : "", x.up.why);
    }
    discard_output(&x);
    mw_conn_on_imm(x.up.c, NULL, NULL);
    mc_hop_close(&x.down);
    mc_hop_close(&x.up);
    mw_free(x.s.ctx, x.ring);
    free(x.lens);
    mc_session_free(&x.s);
    return rc ? MC_EXIT_FAIL : MC_EXIT_OK;
}
