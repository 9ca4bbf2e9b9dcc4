/* A cancel storm: thousands of operations of every point-to-point kind
 * (receives, sends of one to many fragments, writes, reads, writes with
 * immediate, connects), up to 32 in flight, each cancelled at once, given a
 * random deadline of a few milliseconds, or left alone, while the peer --
 * another process -- keeps sending numbered messages and checks every byte
 * of what it gets.
 *
 * What must hold: no message is lost or duplicated (the receives that
 * succeed see the peer's numbers one after another, and a drain at the end
 * gets the rest); nothing arrives damaged or half; every send that
 * succeeded arrived; the caller's memory is free the moment a future fails
 * (a send's buffer is poisoned and freed then, so a late read shows as a
 * damaged message or, in the ASan run, as a use after free; a failed read's
 * buffer is watched for a late write from the device); nothing is left
 * over (futures, operation records, connections, handles).
 * MW_STORM_OPS sets the count (default 10,000). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "meshwire.h"
#include "cm/cm.h"
#include "core/handle.h"
#include "core/op.h"
#include "rxe_util.h"

extern char **environ;
static const char *addrs[2];
static char self_path[4096];

#define PEER_MSGS 2000            /* the peer's numbered messages */
#define MAX_SEND (200u << 10)     /* up to 4 fragments at the default slot size */
#define MAX_RDMA (64u << 10)
#define EXPORT (1u << 20)
#define INFLIGHT 32
#define POISON 0xdd
#define WATCHED 0x77

/* ------------------------------------------------------------------------
 * Messages that check themselves: id, length, then a pattern of both
 * ------------------------------------------------------------------------ */

static uint8_t pattern_byte(uint32_t id, size_t i)
{
    return (uint8_t)(id * 131u + i * 7u + (i >> 8));
}

static uint8_t *make_msg(uint32_t id, size_t len)
{
    uint8_t *b = malloc(len);
    uint32_t l32 = (uint32_t)len;
    memcpy(b, &id, 4);
    memcpy(b + 4, &l32, 4);
    for (size_t i = 8; i < len; i++)
        b[i] = pattern_byte(id, i);
    return b;
}

/* The id of an intact message, or -1. */
static int64_t check_msg(const mw_msg_t *m)
{
    uint32_t id, l32;
    if (m->len < 8)
        return -1;
    memcpy(&id, m->data, 4);
    memcpy(&l32, (uint8_t *)m->data + 4, 4);
    if (l32 != m->len)
        return -1;
    for (size_t i = 8; i < m->len; i++)
        if (((uint8_t *)m->data)[i] != pattern_byte(id, i))
            return -1;
    return id;
}

/* ------------------------------------------------------------------------
 * The peer process
 * ------------------------------------------------------------------------ */

struct report {                   /* the peer's answer to "FIN" */
    uint32_t corrupt, imms, nids;
    uint8_t got[];                /* [id]: how many times it arrived */
};

struct peer {
    mw_ctx_t *ctx;
    mw_conn_t *c;
    mw_future_t *accepted, *done;
    uint32_t sent, inflight, corrupt, imms;
    uint8_t got[1u << 16];
    uint32_t max_id;
    bool fin, reported;
};

struct out {                      /* a message of the peer's in flight */
    struct peer *p;
    uint8_t *buf;
};

static void peer_pump(struct peer *p);

static void peer_check_done(struct peer *p)
{
    if (p->reported && p->sent == PEER_MSGS && !p->inflight)
        mw_future_resolve(p->done, NULL);
}

static void peer_sent(mw_future_t *f, void *arg)
{
    struct out *o = arg;
    struct peer *p = o->p;
    if (mw_future_error(f))
        fprintf(stderr, "peer: a send failed: %s\n", mw_future_message(f));
    free(o->buf);
    free(o);
    p->inflight--;
    peer_pump(p);
    peer_check_done(p);
}

static void peer_send(struct peer *p, uint8_t *buf, size_t len)
{
    struct out *o = malloc(sizeof *o);
    *o = (struct out){p, buf};
    p->inflight++;
    mw_future_t *f = mw_send(p->c, buf, len);
    mw_future_then(f, peer_sent, o);
    mw_future_unref(f);
}

static void peer_pump(struct peer *p)
{
    while (p->sent < PEER_MSGS && p->inflight < 8) {
        uint32_t id = p->sent++;
        size_t len = 8 + (id * 2654435761u) % (MAX_SEND / 4);
        peer_send(p, make_msg(id, len), len);
    }
}

static void peer_report(struct peer *p)
{
    uint32_t n = p->max_id + 1;
    struct report *r = calloc(1, sizeof *r + n);
    *r = (struct report){.corrupt = p->corrupt, .imms = p->imms, .nids = n};
    memcpy(r->got, p->got, n);
    peer_send(p, (uint8_t *)r, sizeof *r + n);
    p->reported = true;
}

static void peer_got(mw_future_t *f, void *arg);

static void peer_recv(struct peer *p)
{
    mw_future_t *f = mw_recv(p->c);
    mw_future_then(f, peer_got, p);
    mw_future_unref(f);
}

static void peer_got(mw_future_t *f, void *arg)
{
    struct peer *p = arg;
    if (mw_future_state(f) != MW_FUTURE_DONE)
        return;                       /* the test closed the connection */
    mw_msg_t *m = mw_future_value(f);
    if (m->len == 4 && !memcmp(m->data, "FIN", 4)) {
        peer_report(p);
    } else {
        int64_t id = check_msg(m);
        if (id < 0 || id >= (int64_t)sizeof p->got) {
            p->corrupt++;
        } else {
            p->got[id]++;
            if ((uint32_t)id > p->max_id)
                p->max_id = (uint32_t)id;
        }
    }
    mw_msg_free(m);
    peer_recv(p);
}

static void peer_on_imm(mw_conn_t *c, uint32_t imm, void *arg)
{
    (void)c, (void)imm;
    ((struct peer *)arg)->imms++;
}

/* The first connection is the storm's; later ones (its connects) go. */
static void peer_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    struct peer *p = arg;
    if (p->c) {
        mw_conn_abort(c);
        return;
    }
    p->c = c;
    mw_future_resolve(p->accepted, NULL);
}

static int peer_main(const char *port)
{
    struct peer *p = calloc(1, sizeof *p);
    if (mw_ctx_new(&p->ctx, NULL, NULL))
        return 2;
    char la[80];
    snprintf(la, sizeof la, "%s:%s", addrs[1], port);
    mw_listener_t *l;
    p->accepted = mw_future_new(p->ctx);
    p->done = mw_future_new(p->ctx);
    if (mw_listen(p->ctx, la, NULL, peer_accept, p, &l))
        return 3;
    mw_wait(p->accepted);
    uint8_t *mem = mw_alloc(p->ctx, EXPORT);
    mw_remote_t r;
    if (mw_mem_export(p->c, mem, EXPORT, &r))
        return 4;
    mw_conn_on_imm(p->c, peer_on_imm, p);
    mw_future_t *d = mw_send(p->c, &r, sizeof r);   /* first: where to write */
    mw_wait(d);
    mw_future_unref(d);
    peer_recv(p);
    peer_pump(p);
    mw_future_set_timeout(p->done, 600000);
    int rc = mw_wait(p->done);
    /* the test closes when it has checked everything */
    mw_future_t *end = mw_recv(p->c);
    mw_future_set_timeout(end, 60000);
    mw_wait(end);
    mw_future_unref(end);
    mw_future_unref(mw_conn_close(p->c));
    mw_listener_free(l);
    mw_free(p->ctx, mem);
    mw_future_unref(p->accepted);
    mw_future_unref(p->done);
    mw_ctx_free(p->ctx);
    fprintf(stderr, "peer: sent %u, corrupt %u, imms %u\n", p->sent, p->corrupt, p->imms);
    free(p);
    return rc ? 5 : 0;
}

/* ------------------------------------------------------------------------
 * The storm
 * ------------------------------------------------------------------------ */

enum kind { RECV, SEND, WRITE, READ, WRITE_IMM, CONNECT, KINDS };
static const char *const kind_name[KINDS] = {"recv", "send", "write", "read", "write_imm",
                                             "connect"};

struct watched {                  /* a failed read's buffer: nothing may write it now */
    uint8_t *buf;
    size_t len;
};

struct storm {
    mw_ctx_t *ctx;
    mw_conn_t *c;
    mw_remote_t r;
    char target[96];
    unsigned total, issued, finished, inflight;
    uint32_t next_seq;            /* the peer's next message number */
    uint32_t send_id;
    uint8_t *sent_ok;             /* [id]: that send succeeded */
    unsigned ok[KINDS], failed[KINDS], bad;
    struct watched *watch;
    size_t nwatch;
    mw_future_t *all;
};

struct op {
    struct storm *st;
    enum kind kind;
    uint8_t *buf;
    size_t len;
    uint32_t id;
};

static void storm_issue(struct storm *st);

static void take_peer_msg(struct storm *st, mw_msg_t *m)
{
    int64_t seq = check_msg(m);
    if (seq != st->next_seq) {
        /* the first few only: what follows a loss is all off by one, and
         * the test log keeps only its last lines */
        if (st->bad < 3)
            fprintf(stderr, "storm: message %lld received, %u expected (after %u operations "
                    "finished)\n", (long long)seq, st->next_seq, st->finished);
        st->bad++;
    }
    st->next_seq++;
    mw_msg_free(m);
}

static void op_done(mw_future_t *f, void *arg)
{
    struct op *o = arg;
    struct storm *st = o->st;
    bool ok = mw_future_state(f) == MW_FUTURE_DONE;
    ok ? st->ok[o->kind]++ : st->failed[o->kind]++;
    switch (o->kind) {
    case RECV:
        if (ok)
            take_peer_msg(st, mw_future_value(f));
        break;
    case SEND:
        if (ok)
            st->sent_ok[o->id] = 1;
        memset(o->buf, POISON, o->len);       /* the caller's again: reused, freed */
        free(o->buf);
        break;
    case READ:
        if (!ok) {                            /* the device must be done with it */
            memset(o->buf, WATCHED, o->len);
            st->watch[st->nwatch++] = (struct watched){o->buf, o->len};
            break;
        }
        /* fall through */
    case WRITE:
    case WRITE_IMM:
        mw_free(st->ctx, o->buf);
        break;
    case CONNECT:
        if (ok)
            mw_conn_abort(mw_future_value(f));
        break;
    default:
        break;
    }
    free(o);
    st->inflight--;
    st->finished++;
    if (st->issued < st->total)
        storm_issue(st);
    else if (!st->inflight)
        mw_future_resolve(st->all, NULL);
}

static mw_future_t *start(struct storm *st, struct op *o)
{
    size_t off = (size_t)rand() % EXPORT;
    o->len = 1 + (size_t)rand() % MAX_RDMA;
    if (o->len > EXPORT - off)
        o->len = EXPORT - off;
    switch (o->kind) {
    case RECV:
        return mw_recv(st->c);
    case SEND:
        o->id = st->send_id++;
        o->len = 8 + (size_t)rand() % MAX_SEND;
        o->buf = make_msg(o->id, o->len);
        return mw_send(st->c, o->buf, o->len);
    case WRITE:
    case WRITE_IMM:
        o->buf = mw_alloc(st->ctx, o->len);
        memset(o->buf, 1, o->len);
        return o->kind == WRITE ? mw_write(st->c, o->buf, o->len, &st->r, off)
                                : mw_write_imm(st->c, o->buf, o->len, &st->r, off, o->len);
    case READ:
        o->buf = mw_alloc(st->ctx, o->len);
        return mw_read(st->c, o->buf, o->len, &st->r, off);
    default:
        return mw_connect(st->ctx, st->target, NULL);
    }
}

static void storm_issue(struct storm *st)
{
    struct op *o = calloc(1, sizeof *o);
    o->st = st;
    o->kind = (enum kind)(rand() % KINDS);
    mw_future_t *f = start(st, o);
    assert_non_null(f);
    st->issued++;
    st->inflight++;
    switch (rand() % 3) {              /* at once, at a deadline, or never */
    case 0:
        mw_future_cancel(f);
        break;
    case 1:
        mw_future_set_timeout(f, (unsigned)(rand() % 4));
        break;
    default:
        break;
    }
    assert_int_equal(mw_future_then(f, op_done, o), 0);
    mw_future_unref(f);
}

static void check_report(struct storm *st, const mw_msg_t *m)
{
    const struct report *rep = m->data;
    assert_true(m->len >= sizeof *rep && m->len == sizeof *rep + rep->nids);
    unsigned lost = 0, twice = 0, stray = 0;
    for (uint32_t id = 0; id < st->send_id; id++) {
        uint8_t got = id < rep->nids ? rep->got[id] : 0;
        lost += st->sent_ok[id] && got == 0;
        twice += got > 1;
    }
    for (uint32_t id = st->send_id; id < rep->nids; id++)
        stray += rep->got[id] != 0;
    printf("peer: %u damaged, %u succeeded sends lost, %u twice, %u never sent; %u "
           "immediates for %u writes with immediate done\n", rep->corrupt, lost, twice, stray,
           rep->imms, st->ok[WRITE_IMM]);
    assert_int_equal(rep->corrupt, 0);
    assert_int_equal(lost, 0);
    assert_int_equal(twice, 0);
    assert_int_equal(stray, 0);
    assert_true(rep->imms >= st->ok[WRITE_IMM]);
}

static void storm(void **state)
{
    (void)state;
    int port = rxe_fixed_port((unsigned)getpid(), 1);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t pid;
    char *argv[] = {self_path, "peer", ps, NULL};
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);

    struct storm st = {.total = 10000};
    const char *env = getenv("MW_STORM_OPS");
    if (env)
        st.total = (unsigned)atoi(env);
    srand(12345);
    st.sent_ok = calloc(st.total, 1);
    st.watch = calloc(st.total, sizeof *st.watch);
    assert_int_equal(mw_ctx_new(&st.ctx, NULL, NULL), 0);
    uint64_t handles = mw__handles_live();
    snprintf(st.target, sizeof st.target, "%s:%d", addrs[1], port);
    mw_future_t *cf = NULL;
    for (int i = 0; i < 100; i++) {           /* until the peer listens */
        cf = mw_connect(st.ctx, st.target, NULL);
        if (mw_wait(cf) == 0)
            break;
        mw_future_unref(cf);
        cf = NULL;
        loop_for(st.ctx, 100);
    }
    assert_non_null(cf);
    st.c = mw_future_value(cf);
    mw_future_unref(cf);
    mw_msg_t *m = rxe_recv(st.c, 30000);
    assert_int_equal(m->len, sizeof st.r);
    memcpy(&st.r, m->data, sizeof st.r);
    mw_msg_free(m);

    double t0 = now_s();
    st.all = mw_future_new(st.ctx);
    for (unsigned i = 0; i < INFLIGHT && st.issued < st.total; i++)
        storm_issue(&st);
    mw_future_set_timeout(st.all, 600000);
    assert_int_equal(mw_wait(st.all), 0);
    mw_future_unref(st.all);
    double took = now_s() - t0;
    printf("%u operations in %.1f s:", st.total, took);
    for (int k = 0; k < KINDS; k++)
        printf(" %s %u ok / %u failed;", kind_name[k], st.ok[k], st.failed[k]);
    printf("\n");

    /* the rest of the peer's messages, in order, none missing */
    while (st.next_seq < PEER_MSGS)
        take_peer_msg(&st, rxe_recv(st.c, 30000));
    assert_int_equal(st.bad, 0);
    assert_true(st.ok[RECV] > 0 && st.failed[RECV] > 0);   /* both happened */

    /* what the peer saw of ours */
    mw_future_t *fin = mw_send(st.c, "FIN", 4);
    assert_int_equal(mw_wait(fin), 0);
    mw_future_unref(fin);
    m = rxe_recv(st.c, 30000);
    check_report(&st, m);
    mw_msg_free(m);

    /* failed reads' buffers: nothing wrote there after the failure */
    loop_for(st.ctx, 50);
    size_t late = 0;
    for (size_t i = 0; i < st.nwatch; i++) {
        for (size_t j = 0; j < st.watch[i].len; j++)
            late += st.watch[i].buf[j] != WATCHED;
        mw_free(st.ctx, st.watch[i].buf);
    }
    printf("%zu failed reads watched: %zu bytes written after their failure\n", st.nwatch, late);
    assert_int_equal(late, 0);

    /* nothing left over */
    rxe_close_conn(st.c);
    loop_for(st.ctx, 100);
    mw_ctx_stats_t s;
    mw_ctx_stats(st.ctx, &s);
    assert_int_equal(s.futures_live, 0);
    assert_int_equal(mw__ops_live(st.ctx), 0);
    assert_int_equal(rxe_conns_left(st.ctx), 0);
    assert_int_equal(mw__handles_live(), handles);
    mw_ctx_free(st.ctx);
    free(st.sent_ok);
    free(st.watch);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rxe_require(2, addrs);
    if (readlink("/proc/self/exe", self_path, sizeof self_path - 1) < 0)
        return 1;
    if (argc == 3 && !strcmp(argv[1], "peer"))
        return peer_main(argv[2]);
    const struct CMUnitTest tests[] = {cmocka_unit_test(storm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
