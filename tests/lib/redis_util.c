#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
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
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

pid_t redis_start(const char *sock, bool no_config)
{
    unlink(sock);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execl(REDIS_SERVER, REDIS_SERVER, "--port", "0", "--unixsocket", sock,
              "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--loglevel",
              "warning", no_config ? "--rename-command" : NULL, "CONFIG", "", (char *)NULL);
        _exit(127);
    }
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
