#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "etcd_util.h"
#include "redis_util.h"

extern char **environ;

bool etcd_installed(void)
{
    return access(ETCD_SERVER, X_OK) == 0;
}

static void b64(const char *in, char *out)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in), i = 0;
    const unsigned char *p = (const unsigned char *)in;
    for (; i + 2 < n; i += 3, out += 4) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        out[0] = t[v >> 18], out[1] = t[v >> 12 & 63], out[2] = t[v >> 6 & 63], out[3] = t[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0);
        out[0] = t[v >> 18], out[1] = t[v >> 12 & 63];
        out[2] = i + 1 < n ? t[v >> 6 & 63] : '=', out[3] = '=';
        out += 4;
    }
    *out = 0;
}

int etcd_post(const struct etcd_fixture *f, const char *path, const char *body, char *out,
              size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    char head[512];
    int hl = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
                      "close\r\nContent-Length: %zu\r\n\r\n", path, strlen(body));
    if (write(fd, head, (size_t)hl) != hl ||
        write(fd, body, strlen(body)) != (ssize_t)strlen(body)) {
        close(fd);
        return -1;
    }
    static char resp[1 << 20];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof resp - 1 && (r = read(fd, resp + got, sizeof resp - 1 - got)) > 0)
        got += (size_t)r;
    close(fd);
    resp[got] = 0;
    int status = -1;
    if (sscanf(resp, "HTTP/1.1 %d", &status) != 1)
        return -1;
    const char *b = strstr(resp, "\r\n\r\n");
    if (out && cap)
        snprintf(out, cap, "%s", b ? b + 4 : "");
    return status;
}

void etcd_start(struct etcd_fixture *f, bool empty)
{
    char data[128], client[64], peer[64], cluster[80];
    snprintf(data, sizeof data, "%s/data", f->dir);
    if (empty) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", data);
        assert_int_equal(system(cmd), 0);
    }
    snprintf(client, sizeof client, "http://127.0.0.1:%d", f->port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", f->peer_port);
    snprintf(cluster, sizeof cluster, "t=%s", peer);
    char *argv[] = {ETCD_SERVER, "--name", "t", "--data-dir", data,
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", cluster, "--logger", "zap", "--log-level", "error",
                    NULL};
    f->pid = store_spawn(ETCD_SERVER, argv);
    /* up to 30 s: under ASan in a VM whose host's CPUs are shared it took
     * over 10 (the test command's parallel layout) */
    for (int i = 0; i < 1500; i++) {
        if (etcd_post(f, "/v3/maintenance/status", "{}", NULL, 0) == 200)
            return;
        usleep(20000);
    }
    fail_msg("etcd did not start on port %d", f->port);
}

void etcd_stop(struct etcd_fixture *f, int sig)
{
    if (f->pid <= 0)
        return;
    kill(f->pid, sig);
    waitpid(f->pid, NULL, 0);
    f->pid = 0;
}

void etcd_fixture_up(struct etcd_fixture *f)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/mw-etcd-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->port = redis_free_port();
    do
        f->peer_port = redis_free_port();
    while (f->peer_port == f->port);
    snprintf(f->url, sizeof f->url, "etcd://127.0.0.1:%d", f->port);
    etcd_start(f, true);
}

void etcd_fixture_down(struct etcd_fixture *f)
{
    etcd_stop(f, SIGTERM);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->dir);
}

void etcd_flush(const struct etcd_fixture *f)
{
    assert_int_equal(etcd_post(f, "/v3/kv/deleterange", "{\"key\":\"AA==\",\"range_end\":\"AA==\"}",
                               NULL, 0), 200);
}

bool etcd_exists(const struct etcd_fixture *f, const char *key)
{
    char k[1024], b[1200], out[4096];
    assert_true(strlen(key) < 700);
    b64(key, k);
    snprintf(b, sizeof b, "{\"key\":\"%s\",\"count_only\":true}", k);
    assert_int_equal(etcd_post(f, "/v3/kv/range", b, out, sizeof out), 200);
    return strstr(out, "\"count\":\"1\"") != NULL;
}

void etcd_put(const struct etcd_fixture *f, const char *key, const char *val)
{
    size_t n = strlen(val), kn = strlen(key);
    char *v = malloc(n / 3 * 4 + 8), *k = malloc(kn / 3 * 4 + 8);
    char *b = malloc(n / 3 * 4 + kn / 3 * 4 + 64);
    b64(key, k);
    b64(val, v);
    sprintf(b, "{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
    assert_int_equal(etcd_post(f, "/v3/kv/put", b, NULL, 0), 200);
    free(k);
    free(v);
    free(b);
}
