/* Communicators formed through the directory, built on its public calls:
 * publish this rank ("JOB/rank/R", tag "run=RUN nranks=N"), watch
 * "JOB/rank/", and once every rank of the run is there, mw_comm_create
 * with the addresses found.  Rank 0 draws the run; the others take it
 * from rank 0's entry, and start over when it changes.  A rank restarted
 * while rank 0 still shows the run it was in publishes run 0: rank 0 then
 * draws a new run, and everyone forms again. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/alloc.h"
#include "core/ctx.h"
#include "core/future.h"
#include "dir/dir.h"
#include "dir/entry.h"

#define JOB_MAX 120

struct slot {
    char *addrs;                     /* as published; NULL: not seen */
    uint64_t run, instance;
    int nranks;
};

struct dcomm {
    mw_directory_t *d;
    mw_ctx_t *ctx;
    mw_future_t *f;                  /* the caller's */
    char job[JOB_MAX + 1];
    char name[JOB_MAX + 32];         /* this rank's entry */
    char ident[JOB_MAX + 300];       /* opts->job and JOB; the run is added */
    int rank, nranks;
    mw_comm_opts_t opts;
    char *own;                       /* this rank's addresses, with its port */
    int port;
    mw_listener_t *hold;             /* keeps the port ours until the mesh listens */
    uint64_t run;                    /* 0 until rank 0's is known */
    uint64_t taken;                  /* a run this rank was in already (restarted) */
    bool asked;                      /* published run 0: asks rank 0 for a new run */
    bool synced;                     /* the watch read what the store held */
    int watch;
    struct slot *slots;
    mw_future_t *cf;                 /* mw_comm_create under way */
    mw_future_t *pub;                /* the latest publish (compared, never used) */
    struct event *deadline;
    uint64_t end_ms;
    bool restart;                    /* cf was cancelled to start over */
    bool done;
    int refs;                        /* until done, and one per callback to come */
};

static void dcomm_unref(struct dcomm *dc)
{
    if (--dc->refs)
        return;
    for (int i = 0; dc->slots && i < dc->nranks; i++)
        mw__free(dc->slots[i].addrs);
    mw__free(dc->slots);
    mw__free(dc->own);
    if (dc->deadline)
        event_free(dc->deadline);
    mw_future_unref(dc->f);
    mw__free(dc);
}

/* The end: @comm handed over, or the failure.  The watch goes now; the
 * rank's entry stays published. */
static void finish(struct dcomm *dc, mw_comm_t *comm, int err, const char *msg)
{
    if (dc->done)
        return;
    dc->done = true;
    event_del(dc->deadline);
    mw_listener_free(dc->hold);
    dc->hold = NULL;
    if (dc->watch > 0)
        mw_dir_unwatch(dc->d, dc->watch);
    if (err)                 /* a rank that gave up is no rank to wait for */
        mw_future_unref(mw_dir_unpublish(dc->d, dc->name));
    if (err)
        mw_future_fail(dc->f, err, "%s", msg);
    else if (mw_future_resolve(dc->f, comm) < 0)
        mw_comm_free(comm);
    if (dc->cf)              /* its callback still runs */
        mw_future_cancel(dc->cf);
    dcomm_unref(dc);
}

/* "ranks 2, 5 (1 of another run)" of those not ready. */
static void missing(const struct dcomm *dc, char *buf, size_t cap)
{
    size_t len = 0;
    int n = 0, other = 0;
    for (int r = 0; r < dc->nranks && len + 16 < cap; r++) {
        const struct slot *s = &dc->slots[r];
        if (s->addrs && s->run == dc->run && s->nranks == dc->nranks)
            continue;
        other += s->addrs != NULL;
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", n++ ? ", " : "", r);
    }
    if (other && len + 40 < cap)
        snprintf(buf + len, cap - len, " (%d of them published by another run)", other);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct dcomm *dc = arg;
    char who[512] = "", msg[768];
    missing(dc, who, sizeof who);
    snprintf(msg, sizeof msg, "directory communicator %s, rank %d of %d: not formed within "
             "%u ms; missing in the directory: ranks %s", dc->job, dc->rank, dc->nranks,
             dc->opts.timeout_ms, *who ? who : "none (the mesh did not connect)");
    finish(dc, NULL, -ETIMEDOUT, msg);
}

/* The caller cancelled, or set a deadline that passed. */
static void on_cancel(mw_future_t *f, void *arg)
{
    (void)f;
    finish(arg, NULL, -ECANCELED, "directory communicator: cancelled");
}

/* A publish replaced by a later one (rank 0's run changed before the store
 * held the first) fails "unpublished": only the latest one counts. */
static void on_published(mw_future_t *f, void *arg)
{
    struct dcomm *dc = arg;
    int err = mw_future_error(f);
    if (err && !dc->done && f == dc->pub) {
        char msg[512];
        snprintf(msg, sizeof msg, "directory communicator %s: %s", dc->job,
                 mw_future_message(f));
        finish(dc, NULL, err, msg);
    }
    dcomm_unref(dc);
}

/* Publish (again) this rank's entry with the run it belongs to. */
static void publish(struct dcomm *dc)
{
    char tag[64];
    snprintf(tag, sizeof tag, "run=%016" PRIx64 " nranks=%d", dc->run, dc->nranks);
    mw_dir_pub_t pub = {.addrs = dc->own, .tag = tag};
    mw_future_t *f = mw_dir_publish(dc->d, dc->name, &pub);
    dc->pub = f;
    if (f) {
        dc->refs++;
        mw_future_then(f, on_published, dc);
        mw_future_unref(f);
    }
}

static void refuse(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l, (void)arg;
    mw_conn_abort(c);             /* the rank dialling us retries */
}

/* Hold this rank's port (rdma_cm picks one the first time) with a listener
 * refusing everyone, so that no other listener or outgoing connection of
 * any process takes it while the ranks find each other: the communicator
 * listens there once they have.  Return: 0 or a negative errno. */
static int hold_port(struct dcomm *dc)
{
    char at[16];
    snprintf(at, sizeof at, "*:%d", dc->port);
    int rc = mw_listen(dc->ctx, at, &dc->opts.conn, refuse, NULL, &dc->hold);
    if (rc < 0)
        return rc;
    rc = mw_listener_port(dc->hold);
    if (rc > 0)
        dc->port = rc;
    return rc < 0 ? rc : 0;
}

static void try_form(struct dcomm *dc);

static void on_formed(mw_future_t *f, void *arg)
{
    struct dcomm *dc = arg;
    int err = mw_future_error(f);
    dc->cf = NULL;
    if (dc->done && !err)                /* ended meanwhile */
        mw_comm_free(mw_future_value(f));
    else if (!err)
        finish(dc, mw_future_value(f), 0, NULL);
    else if (dc->restart && !dc->done) {  /* a peer changed: start over */
        dc->restart = false;
        hold_port(dc);                   /* taken meanwhile: the creation says so */
        try_form(dc);
    } else
        finish(dc, NULL, err, mw_future_message(f));
    dcomm_unref(dc);
}

static void try_form(struct dcomm *dc)
{
    if (dc->cf || dc->done || !dc->run)
        return;
    for (int r = 0; r < dc->nranks; r++) {
        const struct slot *s = &dc->slots[r];
        if (!s->addrs || s->run != dc->run || s->nranks != dc->nranks)
            return;
    }
    const char **peers = mw__calloc(dc->nranks, sizeof *peers);
    if (!peers) {
        finish(dc, NULL, -ENOMEM, "directory communicator: out of memory");
        return;
    }
    for (int r = 0; r < dc->nranks; r++)
        peers[r] = dc->slots[r].addrs;
    char job_id[sizeof dc->ident + 20];       /* JOB and the run */
    snprintf(job_id, sizeof job_id, "%s#%016" PRIx64, dc->ident, dc->run);
    mw_comm_opts_t o = dc->opts;
    o.job = job_id;
    mw_listener_free(dc->hold);          /* the mesh listens there now, in this turn */
    dc->hold = NULL;
    uint64_t now = mw__now_ms();
    o.timeout_ms = now < dc->end_ms ? (unsigned)(dc->end_ms - now) : 1;
    dc->cf = mw_comm_create(dc->ctx, dc->rank, dc->nranks, peers, &o);
    mw__free(peers);
    if (!dc->cf) {
        finish(dc, NULL, -ENOMEM, "directory communicator: out of memory");
        return;
    }
    dc->refs++;
    mw_future_then(dc->cf, on_formed, dc);
    mw_future_unref(dc->cf);            /* the callback's reference keeps it */
}

/* "run=HEX nranks=N" */
static bool parse_tag(const char *tag, uint64_t *run, int *nranks)
{
    char hex[17];
    int n, end = 0;
    if (sscanf(tag, "run=%16[0-9a-f] nranks=%d%n", hex, &n, &end) != 2 || tag[end] ||
        strlen(hex) != 16)
        return false;
    *run = strtoull(hex, NULL, 16);      /* 0: a restarted rank asks for a new run */
    *nranks = n;
    return true;
}

/* Rank 0's run, new or again, unless this rank was in it already: a rank
 * restarted while the others still hold the communicator it left (their
 * entries still show its run) would join that broken communicator, at
 * their old ports.  It asks rank 0 for a new run instead (publishing run
 * 0), and waits for it.  Return: whether the run changed (published anew). */
static bool adopt_run(struct dcomm *dc)
{
    const struct slot *s0 = &dc->slots[0];
    if (dc->rank == 0 || !dc->synced || !s0->addrs || s0->run == dc->run)
        return false;
    if (s0->run == dc->taken) {
        if (!dc->asked) {
            dc->asked = true;
            publish(dc);                     /* dc->run is 0 still */
        }
        return false;
    }
    dc->run = s0->run;
    publish(dc);
    return true;
}

/* Rank 0: rank @r asks for a new run (it restarted while this one formed
 * the run it had been in): draw one.  Return: whether it did. */
static bool new_run_asked(struct dcomm *dc, int r, uint64_t run)
{
    if (dc->rank != 0 || r == 0 || run != 0)
        return false;
    MW_LOG(dc->ctx, MW_LOG_INFO, "directory communicator %s: rank %d restarted; a new run",
           dc->job, r);
    dc->run = mw__dir_random64();
    publish(dc);
    return true;
}

static void on_watch(mw_directory_t *d, int event, const mw_dir_entry_t *e, void *arg)
{
    (void)d;
    struct dcomm *dc = arg;
    if (dc->done)
        return;
    if (event == MW_DIR_SYNCED && !dc->synced) {
        dc->synced = true;
        adopt_run(dc);
        try_form(dc);
        return;
    }
    if (event != MW_DIR_JOINED && event != MW_DIR_LEFT)
        return;
    const char *tail = e->name + strlen(dc->job) + strlen("/rank/");
    char *end, canon[16];
    long r = strtol(tail, &end, 10);
    snprintf(canon, sizeof canon, "%ld", r);
    if (*end || r < 0 || r >= dc->nranks || strcmp(canon, tail))   /* "rank/03": not a rank */
        return;
    struct slot *s = &dc->slots[r];
    if (event == MW_DIR_LEFT) {
        mw__free(s->addrs);
        s->addrs = NULL;
        return;
    }
    uint64_t run;
    int n;
    if (!parse_tag(e->tag, &run, &n)) {
        MW_LOG(dc->ctx, MW_LOG_WARN, "directory communicator %s: skipping %s: tag \"%s\"",
                dc->job, e->name, e->tag);
        return;
    }
    char *a = mw__malloc(strlen(e->addrs) + 1);
    if (!a)
        return;
    strcpy(a, e->addrs);
    bool changed = s->addrs && (s->instance != e->instance || s->run != run);
    mw__free(s->addrs);
    *s = (struct slot){.addrs = a, .run = run, .instance = e->instance, .nranks = n};
    if (r == dc->rank && dc->rank != 0 && !dc->synced)
        dc->taken = run;                 /* not ours: this rank publishes after */
    if ((r == 0 && adopt_run(dc)) || new_run_asked(dc, (int)r, run))
        changed = true;
    MW_LOG(dc->ctx, MW_LOG_DEBUG, "directory communicator %s, rank %d: rank %ld at %s, run "
            "%016" PRIx64 "%s", dc->job, dc->rank, r, e->addrs, run,
            run == dc->run ? "" : " (another run: waited past)");
    if (changed && dc->cf && r != dc->rank) {
        dc->restart = true;
        mw_future_cancel(dc->cf);        /* on_formed starts over */
        return;
    }
    try_form(dc);
}

mw_future_t *mw_dir_comm_create(mw_directory_t *d, const char *job, int rank, int nranks,
                                const mw_comm_opts_t *opts)
{
    mw_ctx_t *ctx = mw__dir_ctx(d);
    mw_future_t *f = ctx ? mw_future_new(ctx) : NULL;
    if (!f)
        return NULL;
    char prefix[JOB_MAX + 8];
    if (!job || strlen(job) > JOB_MAX || !mw__dir_name_ok(job, false) || nranks < 1 ||
        nranks > 65536 || rank < 0 || rank >= nranks) {
        mw_future_fail(f, -EINVAL, "mw_dir_comm_create: bad job name (a directory name of "
                       "at most %d characters), rank or size", JOB_MAX);
        return f;
    }
    struct dcomm *dc = mw__calloc(1, sizeof *dc);
    if (!dc || !(dc->slots = mw__calloc(nranks, sizeof *dc->slots)) ||
        !(dc->deadline = evtimer_new(ctx->base, on_deadline, dc))) {
        if (dc)
            mw__free(dc->slots);
        mw__free(dc);
        mw_future_fail(f, -ENOMEM, "mw_dir_comm_create: out of memory");
        return f;
    }
    *dc = (struct dcomm){.d = d, .ctx = ctx, .f = mw_future_ref(f), .rank = rank, .refs = 1,
                         .nranks = nranks, .slots = dc->slots, .deadline = dc->deadline};
    if (opts)
        dc->opts = *opts;
    else
        mw_comm_opts_init(&dc->opts);
    strcpy(dc->job, job);
    snprintf(dc->name, sizeof dc->name, "%s/rank/%d", job, rank);
    snprintf(dc->ident, sizeof dc->ident, "%s/%s", dc->opts.job ? dc->opts.job : "", job);
    snprintf(prefix, sizeof prefix, "%s/rank/", job);
    int err = hold_port(dc);
    if (!err)
        dc->own = mw__dir_listen_addrs(ctx, "*", dc->port, &err);
    if (err < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "mw_dir_comm_create: no local address to listen on: %s",
                 mw_strerror(err));
        finish(dc, NULL, err, msg);
        return f;
    }
    mw__ev_add_ms(ctx, dc->deadline, dc->opts.timeout_ms);
    mw__future_on_cancel(f, on_cancel, dc);
    dc->end_ms = mw__now_ms() + dc->opts.timeout_ms;
    if (rank == 0) {
        dc->run = mw__dir_random64();
        publish(dc);
    }
    if ((dc->watch = mw_dir_watch(d, prefix, on_watch, dc)) < 0) {
        char msg[384];
        snprintf(msg, sizeof msg, "mw_dir_comm_create: cannot watch %s: %s", prefix,
                 dc->watch == -ENOTSUP
                     ? "the store sends no keyspace notifications (set its "
                       "notify-keyspace-events to include Kgx, or open the directory "
                       "with configure_store)"
                     : mw_strerror(dc->watch));
        finish(dc, NULL, dc->watch, msg);
    }
    return f;
}
