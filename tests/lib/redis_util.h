/* A real redis-server (Debian's) for the directory's tests, started by the
 * test on a unix socket of its own (and a TCP port, when asked), and a synchronous client to look at
 * or tamper with what the store holds.  cmocka asserts. */
#ifndef MW_TEST_REDIS_UTIL_H
#define MW_TEST_REDIS_UTIL_H

#include <stdbool.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#define REDIS_SERVER "/usr/bin/redis-server"

/* redis_installed() - whether the server can be started (else: skip). */
bool redis_installed(void);
/* redis_start() - a server on @sock (nothing saved, no TCP), answering
 * PING before this returns, with the keyspace notifications watches need
 * (as the store's owner sets them up for meshwire); @no_config: without
 * them, and CONFIG renamed away, as managed stores do.  Fails the test
 * after 5 s. */
pid_t redis_start(const char *sock, bool no_config);
/* redis_start_auth() - the same, with the default user's @password (NULL:
 * none). */
pid_t redis_start_auth(const char *sock, bool no_config, const char *password);
/* redis_start_stock() - a server as Debian's package starts it: CONFIG
 * allowed, keyspace notifications off. */
pid_t redis_start_stock(const char *sock);
/* redis_start_tcp() - a server on @sock and on 127.0.0.1:@port too. */
pid_t redis_start_tcp(const char *sock, int port);
/* redis_free_port() - a TCP port of 127.0.0.1 free right now. */
int redis_free_port(void);
/* store_spawn() - start @path with @argv (argv[0] is @path), its output to
 * /dev/null, killed when the test process dies however it dies (meson's
 * timeout too: setpriv --pdeathsig, util-linux's).  Return its pid. */
pid_t store_spawn(const char *path, char *const argv[]);
/* redis_stop() - send @sig and reap it. */
void redis_stop(pid_t pid, int sig);
/* A test's own store: a fresh directory under /tmp holding its socket. */
struct redis_fixture {
    char dir[64];
    char sock[128];
    char url[160];            /* "unix:SOCK", for mw_dir_open */
    pid_t pid;
};
/* redis_fixture_up() - the directory made, the server started on it. */
void redis_fixture_up(struct redis_fixture *f);
/* redis_fixture_down() - the server stopped (if running), all removed. */
void redis_fixture_down(struct redis_fixture *f);

/* redis_cmd() - run a command on @sock; fails the test on an error reply.
 * Return: the reply (freeReplyObject it), or NULL if @keep is false. */
redisReply *redis_cmd(const char *sock, bool keep, const char *fmt, ...);

/* redis_exists() - whether @key is in the store at @sock. */
bool redis_exists(const char *sock, const char *key);

#endif
