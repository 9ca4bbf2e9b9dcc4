/* A real etcd (Debian's etcd-server) for the directory's tests: started by
 * the test on loopback ports and a data directory of its own, restarted
 * with or without its data, and a blocking client of its JSON gateway to
 * look at or tamper with what it holds.  cmocka asserts. */
#ifndef MW_TEST_ETCD_UTIL_H
#define MW_TEST_ETCD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define ETCD_SERVER "/usr/bin/etcd"

struct etcd_fixture {
    char dir[64];             /* its data directory's parent */
    char url[64];             /* "etcd://127.0.0.1:PORT", for mw_dir_open */
    int port, peer_port;
    pid_t pid;
};

/* etcd_installed() - whether the server can be started (else: skip). */
bool etcd_installed(void);
/* etcd_fixture_up() - a fresh directory and ports, the server started. */
void etcd_fixture_up(struct etcd_fixture *f);
/* etcd_start() - (re)start it on the same ports; @empty: its data gone
 * first (a store that lost everything).  Answers before this returns. */
void etcd_start(struct etcd_fixture *f, bool empty);
/* etcd_stop() - send @sig and reap it. */
void etcd_stop(struct etcd_fixture *f, int sig);
/* etcd_fixture_down() - stopped (if running), all removed. */
void etcd_fixture_down(struct etcd_fixture *f);

/* etcd_post() - POST @body to @path; the response body in @out (@cap).
 * Return: the HTTP status, or -1 when the store did not answer. */
int etcd_post(const struct etcd_fixture *f, const char *path, const char *body, char *out,
              size_t cap);
/* etcd_flush() - every key deleted. */
void etcd_flush(const struct etcd_fixture *f);
/* etcd_exists() - whether @key is held. */
bool etcd_exists(const struct etcd_fixture *f, const char *key);
/* etcd_put() - @key = @val, with no lease (as a store writer could). */
void etcd_put(const struct etcd_fixture *f, const char *key, const char *val);

#endif
