/* hello: the smallest meshwire program that moves data each way.
 *
 *   hello -l [ADDR][:PORT]   wait for one client, export 1 MiB to it, send
 *                            it the descriptor, and check what it wrote
 *   hello HOST[:PORT]        connect, write 1 MiB into the server's export
 *                            with one-sided RDMA, then say so in a message
 *
 * Default port 7470.  Blocking style: mw_wait() runs the loop until a
 * future completes (epoll_client.c does the same with callbacks on an
 * epoll loop).  The client's part is the README's first example, verbatim.
 * Build against an installed meshwire:
 *     cc hello.c $(pkg-config --cflags --libs meshwire) */
#include <errno.h>
#include <meshwire.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE (1 << 20)

/* Wait for @f and hand back its value; on failure say why and exit. */
static void *wait_value(mw_future_t *f, const char *what)
{
    int rc = f ? mw_wait(f) : -ENOMEM;
    if (rc < 0) {
        fprintf(stderr, "hello: %s: %s\n", what, f ? mw_future_message(f) : mw_strerror(rc));
        exit(1);
    }
    void *v = mw_future_value(f);
    mw_future_unref(f);
    return v;
}

static int client(const char *addr)
{
    /* README: begin */
    mw_ctx_t *ctx;
    if (mw_ctx_new(&ctx, NULL, NULL) < 0)          /* or join your event_base */
        return 1;
    mw_conn_t *c = wait_value(mw_connect(ctx, addr, NULL), "connect");   /* yours now */

    mw_msg_t *m = wait_value(mw_recv(c), "recv");  /* the server's export */
    mw_remote_t remote;
    if (m->len != sizeof remote) {
        fprintf(stderr, "hello: the server sent no descriptor\n");
        return 1;
    }
    memcpy(&remote, m->data, sizeof remote);
    mw_msg_free(m);

    char *buf = mw_alloc(ctx, SIZE);               /* registered with every device */
    memset(buf, 'x', SIZE);
    wait_value(mw_write(c, buf, SIZE, &remote, 0), "write");   /* bounds-checked */
    wait_value(mw_send(c, "done", 5), "send");     /* messages: any size, in order */
    wait_value(mw_conn_close(c), "close");         /* c is released */
    mw_free(ctx, buf);
    mw_ctx_free(ctx);
    /* README: end */
    printf("hello: wrote %d bytes into %s's memory\n", SIZE, addr);
    return 0;
}

/* The accept callback hands the connection to whoever waits on @arg. */
static void on_accept(mw_listener_t *l, mw_conn_t *c, void *arg)
{
    (void)l;
    if (mw_future_resolve(arg, c) < 0)
        mw_conn_abort(c);                          /* only one client */
}

static int server(const char *addr)
{
    mw_ctx_t *ctx;
    mw_listener_t *l;
    int rc = mw_ctx_new(&ctx, NULL, NULL);
    mw_future_t *accepted = rc < 0 ? NULL : mw_future_new(ctx);
    if (!accepted || (rc = mw_listen(ctx, addr, NULL, on_accept, accepted, &l)) < 0) {
        fprintf(stderr, "hello: listen on %s: %s\n", addr, mw_strerror(rc));
        return 1;
    }
    printf("hello: listening on port %d\n", mw_listener_port(l));
    fflush(stdout);
    mw_conn_t *c = wait_value(mw_future_ref(accepted), "accept");

    char *mem = mw_alloc(ctx, SIZE);
    memset(mem, 0, SIZE);
    mw_remote_t remote;
    if (!mem || (rc = mw_mem_export(c, mem, SIZE, &remote)) < 0) {
        fprintf(stderr, "hello: export: %s\n", mw_strerror(mem ? rc : -ENOMEM));
        return 1;
    }
    wait_value(mw_send(c, &remote, sizeof remote), "send the descriptor");
    mw_msg_t *m = wait_value(mw_recv(c), "recv");
    size_t good = 0;
    while (good < SIZE && mem[good] == 'x')
        good++;
    printf("hello: client said \"%.*s\"; %zu of %d bytes written\n", (int)m->len,
           (char *)m->data, good, SIZE);
    mw_msg_free(m);
    wait_value(mw_conn_close(c), "close");
    mw_free(ctx, mem);
    mw_future_unref(accepted);
    mw_listener_free(l);
    mw_ctx_free(ctx);
    return good == SIZE ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "-l"))
        return server(argv[2]);
    if (argc == 2 && strcmp(argv[1], "-h") && strcmp(argv[1], "--help"))
        return client(argv[1]);
    fprintf(stderr, "usage: hello -l [ADDR][:PORT]   (server)\n"
                    "       hello HOST[:PORT]        (client)\n");
    return 2;
}
