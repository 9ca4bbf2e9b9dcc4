#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "redis_util.h"

bool redis_installed(void)
{
    return access(REDIS_SERVER, X_OK) == 0;
}

static bool answers(const char *sock)
{
    redisContext *c = redisConnectUnix(sock);
    redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
    bool ok = r && (r->type == REDIS_REPLY_STATUS ||   /* or up, wanting a password */
                    (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOAUTH", 6)));
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

extern char **environ;

/* posix_spawn, not fork: no fork handlers run (under TSan jemalloc's take
 * more locks than its deadlock detector tracks), and the server's output
 * goes to /dev/null, so a test that dies never leaves it holding meson's
 * pipes. */
#define SETPRIV "/usr/bin/setpriv"

pid_t store_spawn(const char *path, char *const argv[])
{
    char *tied[64] = {SETPRIV, "--pdeathsig", "KILL", (char *)path};
    bool tie = access(SETPRIV, X_OK) == 0;
    size_t n = 4;
    for (size_t i = 1; argv[i] && n < sizeof tied / sizeof *tied - 1; i++)
        tied[n++] = argv[i];
    tied[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = tie ? posix_spawn(&pid, SETPRIV, &fa, NULL, tied, environ)
                 : posix_spawn(&pid, path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    return pid;
}

pid_t redis_start(const char *sock, bool no_config)
{
    return redis_start_auth(sock, no_config, NULL);
}

static pid_t start(const char *sock, int port, bool no_config, bool notify,
                   const char *password);

pid_t redis_start_auth(const char *sock, bool no_config, const char *password)
{
    return start(sock, 0, no_config, !no_config, password);
}

pid_t redis_start_tcp(const char *sock, int port)
{
    return start(sock, port, false, true, NULL);
}

pid_t redis_start_stock(const char *sock)
{
    return start(sock, 0, false, false, NULL);
}

int redis_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static pid_t start(const char *sock, int port, bool no_config, bool notify,
                   const char *password)
{
    unlink(sock);
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    char *argv[24] = {REDIS_SERVER, "--port", portstr, "--bind", "127.0.0.1",
                      "--unixsocket", (char *)sock,
                      "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                      "--loglevel", "warning"};
    int n = 15;
    if (password) {
        argv[n++] = "--requirepass";
        argv[n++] = (char *)password;
    }
    if (notify) {
        argv[n++] = "--notify-keyspace-events";
        argv[n++] = "Kgx";
    }
    if (no_config) {
        argv[n++] = "--rename-command";
        argv[n++] = "CONFIG";
        argv[n++] = "";
    }
    pid_t pid = store_spawn(REDIS_SERVER, argv);
    for (int i = 0; i < 250; i++) {
        if (answers(sock))
            return pid;
        usleep(20000);
    }
    fail_msg("redis-server did not start at %s", sock);
    return -1;
}

void redis_stop(pid_t pid, int sig)
{
    kill(pid, sig);
    waitpid(pid, NULL, 0);
}

bool redis_exists(const char *sock, const char *key)
{
    redisReply *r = redis_cmd(sock, true, "EXISTS %s", key);
    bool there = r->integer == 1;
    freeReplyObject(r);
    return there;
}

void redis_fixture_up(struct redis_fixture *f)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/mw-redis-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/redis.sock", f->dir);
    snprintf(f->url, sizeof f->url, "unix:%s", f->sock);
    f->pid = redis_start(f->sock, false);
}

void redis_fixture_down(struct redis_fixture *f)
{
    if (f->pid > 0)
        redis_stop(f->pid, SIGTERM);
    f->pid = 0;
    unlink(f->sock);
    rmdir(f->dir);
}

redisReply *redis_cmd(const char *sock, bool keep, const char *fmt, ...)
{
    redisContext *c = redisConnectUnix(sock);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    assert_non_null(r);
    assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
    if (!keep) {
        freeReplyObject(r);
        r = NULL;
    }
    return r;
}
