/* byname: a peer found through a directory, its memory read by RDMA.
 *
 *   byname serve URL NAME    publish NAME (listening on every address, a
 *                            free port) sharing 1 MiB as region "kv";
 *                            serve one reader, then leave
 *   byname fetch URL NAME    look NAME up, connect, read "kv", check it
 *
 * URL: "redis://HOST[:PORT]" or "unix:PATH" (a Redis).  The fetching side
 * knows only the name: the address comes from the store, the key to the
 * region from the peer itself.  Fetching is the README's example, verbatim. */
#include <errno.h>
#include <meshwire.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (1u << 20)

static int wait_for(mw_future_t *f, const char *what, void **value)
{
    int rc = f ? mw_wait(f) : -ENOMEM;
    if (rc < 0)
        fprintf(stderr, "byname: %s: %s\n", what, f ? mw_future_message(f) : mw_strerror(rc));
    else if (value)
        *value = mw_future_value(f);
    mw_future_unref(f);
    return rc;
}

/* The reader's connection completes the future the server waits on. */
static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    if (mw_future_resolve(arg, c) < 0)      /* one reader only */
        mw_conn_abort(c);
}

static int serve(mw_ctx_t *ctx, mw_directory_t *dir, const char *name, uint8_t *pages)
{
    for (size_t i = 0; i < LEN; i++)
        pages[i] = (uint8_t)(i % 251);
    mw_future_t *accepted = mw_future_new(ctx);
    mw_dir_share_t kv = {"kv", pages, LEN};                  /* memory from mw_alloc */
    mw_dir_pub_t pub = {.listen = "*:0", .on_accept = on_accept, .arg = accepted,
                        .shares = &kv, .nshares = 1};
    if (wait_for(mw_dir_publish(dir, name, &pub), "publish", NULL) < 0)
        return 1;
    printf("byname: %s published\n", name);
    fflush(stdout);
    mw_conn_t *reader;
    mw_msg_t *done;                           /* the reader read, then said "done" */
    if (wait_for(accepted, "accept", (void **)&reader) < 0 ||
        wait_for(mw_recv(reader), "the reader's word", (void **)&done) < 0)
        return 1;
    mw_msg_free(done);
    wait_for(mw_dir_unpublish(dir, name), "unpublish", NULL);
    return wait_for(mw_conn_close(reader), "close", NULL) < 0;
}

static int fetch(mw_ctx_t *ctx, mw_directory_t *dir, const char *name, uint8_t *buf)
{
    /* README: begin */
    mw_dir_peer_t *peer;        /* the connection, and the regions its peer shares */
    if (wait_for(mw_dir_connect(dir, name, NULL), "connect", (void **)&peer) < 0)
        return 1;
    const mw_remote_t *kv = mw_dir_peer_region(peer, "kv");
    int rc = kv ? wait_for(mw_read(peer->conn, buf, LEN, kv, 0), "read", NULL) : -ENOENT;
    /* README: end */
    int wrong = 0;
    for (size_t i = 0; i < LEN && rc == 0; i++)
        wrong += buf[i] != (uint8_t)(i % 251);
    printf("byname: read %u bytes of %s's \"kv\": %s\n", LEN, name,
           rc ? "failed" : wrong ? "WRONG DATA" : "correct");
    if (wait_for(mw_send(peer->conn, "done", 4), "send", NULL) < 0)
        rc = -1;
    wait_for(mw_conn_close(peer->conn), "close", NULL);
    mw_dir_peer_free(peer);
    (void)ctx;
    return rc || wrong;
}

int main(int argc, char **argv)
{
    mw_ctx_t *ctx;
    bool serving = argc == 4 && !strcmp(argv[1], "serve");
    if (argc != 4 || (!serving && strcmp(argv[1], "fetch")) || mw_ctx_new(&ctx, NULL, NULL) < 0) {
        fprintf(stderr, "usage: byname serve|fetch URL NAME\n");
        return 2;
    }
    uint8_t *mem = mw_alloc(ctx, LEN);
    mw_directory_t *dir;
    int rc = 1;
    if (wait_for(mw_dir_open(ctx, argv[2], NULL), "directory", (void **)&dir) == 0) {
        rc = serving ? serve(ctx, dir, argv[3], mem) : fetch(ctx, dir, argv[3], mem);
        mw_dir_free(dir);
    }
    mw_free(ctx, mem);
    mw_ctx_free(ctx);
    return rc;
}
