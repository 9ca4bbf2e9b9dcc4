/* NIC choice by subnet, address parsing and printing (src/cm/nic.c).
 * No RDMA device needed: mw__nic_list() must merely behave on this host. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <netpacket/packet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cm/nic.h"
#include "core/alloc.h"

#define PORT 7470

/* An IP literal (no port, no brackets) as a sockaddr; aborts on typos. */
static struct sockaddr_storage ip(const char *s)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, s, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
    } else {
        assert_int_equal(inet_pton(AF_INET6, s, &s6->sin6_addr), 1);
        s6->sin6_family = AF_INET6;
    }
    return ss;
}

static const struct sockaddr *sa(const struct sockaddr_storage *ss)
{
    return (const struct sockaddr *)ss;
}

/* A local NIC "addr/prefix" on @ifindex. */
static struct mw__nic nic(const char *addr, int prefix, unsigned ifindex)
{
    struct mw__nic n;
    memset(&n, 0, sizeof(n));
    n.addr = ip(addr);
    n.prefix_len = prefix;
    n.ifindex = ifindex;
    snprintf(n.ifname, sizeof(n.ifname), "eth%u", ifindex);
    snprintf(n.dev, sizeof(n.dev), "rxe%u", ifindex);
    if (n.addr.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&n.addr)->sin6_scope_id =
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&n.addr)->sin6_addr) ? ifindex
                                                                                 : 0;
    return n;
}

static int choose(const struct mw__nic *nics, size_t n, const char *peer)
{
    struct sockaddr_storage p = ip(peer);
    return mw__nic_choose(nics, n, sa(&p));
}

/* ------------------------------------------------------------------------
 * mw__nic_choose
 * ------------------------------------------------------------------------ */

static void choose_longest_prefix_v4(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.0.1", 8, 2), nic("10.1.2.3", 24, 3)};
    assert_int_equal(choose(nics, 2, "10.1.2.9"), 1);
    assert_int_equal(choose(nics, 2, "10.9.9.9"), 0);
    assert_int_equal(choose(nics, 2, "192.0.2.1"), -1);
    /* the order of the list does not matter, only the prefix */
    const struct mw__nic rev[] = {nic("10.1.2.3", 24, 3), nic("10.0.0.1", 8, 2)};
    assert_int_equal(choose(rev, 2, "10.1.2.9"), 0);
    assert_int_equal(choose(rev, 2, "10.9.9.9"), 1);
}

static void choose_longest_prefix_v6(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("fd00:1:2::1", 48, 2), nic("fd00:1:2:3::1", 64, 3)};
    assert_int_equal(choose(nics, 2, "fd00:1:2:3::99"), 1);
    assert_int_equal(choose(nics, 2, "fd00:1:2:4::99"), 0);
    assert_int_equal(choose(nics, 2, "fd00:1:3::1"), -1);
    assert_int_equal(choose(nics, 2, "2001:db8::1"), -1);
}

/* Prefixes that end inside a byte. */
static void choose_odd_prefixes(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("172.16.0.1", 12, 2), nic("fd00::80", 121, 3)};
    assert_int_equal(choose(nics, 2, "172.31.255.254"), 0);
    assert_int_equal(choose(nics, 2, "172.32.0.1"), -1);
    assert_int_equal(choose(nics, 2, "fd00::ff"), 1);
    assert_int_equal(choose(nics, 2, "fd00::7f"), -1);
}

static void choose_family_mismatch(void **state)
{
    (void)state;
    const struct mw__nic v4[] = {nic("10.0.0.1", 8, 2)};
    const struct mw__nic v6[] = {nic("::", 1, 2)}; /* contains ::a00:9 */
    assert_int_equal(choose(v4, 1, "::ffff:10.0.0.9"), -1);
    assert_int_equal(choose(v4, 1, "::a00:9"), -1);
    assert_int_equal(choose(v6, 1, "10.0.0.9"), -1);
    assert_int_equal(choose(v6, 1, "::a00:9"), 0);
}

/* A /0 carries no subnet information: the routing table decides. */
static void choose_zero_prefix_never_matches(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.0.1", 0, 2), nic("::1", 0, 3)};
    assert_int_equal(choose(nics, 2, "10.0.0.2"), -1);
    assert_int_equal(choose(nics, 2, "192.0.2.1"), -1);
    assert_int_equal(choose(nics, 2, "2001:db8::1"), -1);
    const struct mw__nic more[] = {nic("10.0.0.1", 0, 2), nic("10.0.0.1", 16, 3)};
    assert_int_equal(choose(more, 2, "10.0.0.2"), 1);
}

static void choose_host_prefix(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("192.0.2.7", 32, 2), nic("2001:db8::7", 128, 3)};
    assert_int_equal(choose(nics, 2, "192.0.2.7"), 0);
    assert_int_equal(choose(nics, 2, "192.0.2.6"), -1);
    assert_int_equal(choose(nics, 2, "2001:db8::7"), 1);
    assert_int_equal(choose(nics, 2, "2001:db8::6"), -1);
    const struct mw__nic bad[] = {nic("192.0.2.7", 33, 2)}; /* nonsense prefix */
    assert_int_equal(choose(bad, 1, "192.0.2.7"), -1);
}

static void choose_tie_takes_first(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.0.1", 24, 2), nic("10.0.0.2", 24, 3)};
    assert_int_equal(choose(nics, 2, "10.0.0.9"), 0);
}

/* Every link has fe80::/64: only the scope id says which NIC. */
static void choose_link_local_by_scope(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("fe80::1", 64, 2), nic("fe80::2", 64, 3),
                                   nic("fd00::1", 64, 3)};
    struct sockaddr_storage p = ip("fe80::9");
    assert_int_equal(mw__nic_choose(nics, 3, sa(&p)), -1); /* no scope */
    ((struct sockaddr_in6 *)&p)->sin6_scope_id = 3;
    assert_int_equal(mw__nic_choose(nics, 3, sa(&p)), 1);
    ((struct sockaddr_in6 *)&p)->sin6_scope_id = 2;
    assert_int_equal(mw__nic_choose(nics, 3, sa(&p)), 0);
    ((struct sockaddr_in6 *)&p)->sin6_scope_id = 9;
    assert_int_equal(mw__nic_choose(nics, 3, sa(&p)), -1);
    /* a link-local local address never captures global peers */
    assert_int_equal(choose(nics, 2, "fd00::9"), -1);
}

static void choose_empty_and_null(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.0.1", 8, 2)};
    struct sockaddr_storage p = ip("10.0.0.2");
    assert_int_equal(mw__nic_choose(NULL, 0, sa(&p)), -1);
    assert_int_equal(mw__nic_choose(nics, 1, NULL), -1);
}

/* Four nodes fully connected, one /24 per link, one NIC per link (this is
 * node 1's view): each peer address maps to the NIC on its link. */
static void choose_direct_connect_mesh(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.12.1", 24, 4), nic("10.0.13.1", 24, 5),
                                   nic("10.0.14.1", 24, 6)};
    assert_int_equal(choose(nics, 3, "10.0.12.2"), 0);
    assert_int_equal(choose(nics, 3, "10.0.13.3"), 1);
    assert_int_equal(choose(nics, 3, "10.0.14.4"), 2);
    assert_int_equal(choose(nics, 3, "10.0.23.2"), -1); /* a link we are not on */
    assert_string_equal(nics[choose(nics, 3, "10.0.13.3")].dev, "rxe5");
}

/* ------------------------------------------------------------------------
 * mw__nic_order
 * ------------------------------------------------------------------------ */

static void order_matches_first_stable(void **state)
{
    (void)state;
    const struct mw__nic nics[] = {nic("10.0.0.1", 8, 2), nic("10.1.2.3", 24, 3)};
    const char *in[] = {"192.0.2.1", "10.5.5.5", "198.51.100.1", "10.1.2.9",
                        "10.6.6.6", "::1", "10.1.2.10"};
    const char *want[] = {"10.1.2.9", "10.1.2.10", "10.5.5.5", "10.6.6.6",
                          "192.0.2.1", "198.51.100.1", "::1"};
    enum { N = sizeof(in) / sizeof(in[0]) };
    struct sockaddr_storage peers[N];
    for (size_t i = 0; i < N; i++)
        peers[i] = ip(in[i]);
    mw__nic_order(nics, 2, peers, N);
    for (size_t i = 0; i < N; i++) {
        struct sockaddr_storage w = ip(want[i]);
        assert_memory_equal(&peers[i], &w, sizeof(w));
    }
}

static void order_without_matches_keeps_order(void **state)
{
    (void)state;
    struct sockaddr_storage peers[3] = {ip("192.0.2.3"), ip("192.0.2.1"), ip("192.0.2.2")};
    struct sockaddr_storage copy[3];
    memcpy(copy, peers, sizeof(peers));
    mw__nic_order(NULL, 0, peers, 3);
    assert_memory_equal(peers, copy, sizeof(peers));
    mw__nic_order(NULL, 0, peers, 0);
    mw__nic_order(NULL, 0, NULL, 0);
}

/* ------------------------------------------------------------------------
 * mw__parse_addr / mw__parse_addr_list
 * ------------------------------------------------------------------------ */

static void assert_v4(const struct sockaddr_storage *ss, const char *addr, uint16_t port)
{
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
    char buf[INET_ADDRSTRLEN];
    assert_int_equal(ss->ss_family, AF_INET);
    assert_string_equal(inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof(buf)), addr);
    assert_int_equal(ntohs(s4->sin_port), port);
}

static void assert_v6(const struct sockaddr_storage *ss, const char *addr, uint16_t port,
                      uint32_t scope)
{
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    char buf[INET6_ADDRSTRLEN];
    assert_int_equal(ss->ss_family, AF_INET6);
    assert_string_equal(inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof(buf)), addr);
    assert_int_equal(ntohs(s6->sin6_port), port);
    assert_int_equal(s6->sin6_scope_id, scope);
}

static void parse_ipv4(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    assert_int_equal(mw__parse_addr("1.2.3.4", PORT, &ss), 0);
    assert_v4(&ss, "1.2.3.4", PORT);
    assert_int_equal(mw__parse_addr("1.2.3.4:80", PORT, &ss), 0);
    assert_v4(&ss, "1.2.3.4", 80);
    assert_int_equal(mw__parse_addr("0.0.0.0:0", PORT, &ss), 0); /* listen: any */
    assert_v4(&ss, "0.0.0.0", 0);
    assert_int_equal(mw__parse_addr("255.255.255.255:65535", PORT, &ss), 0);
    assert_v4(&ss, "255.255.255.255", 65535);
    assert_int_equal(mw__parse_addr("10.0.0.1:007470", PORT, &ss), -EINVAL); /* > 5 digits */
    assert_int_equal(mw__parse_addr("10.0.0.1:07470", PORT, &ss), 0);
    assert_v4(&ss, "10.0.0.1", 7470);
}

static void parse_ipv6(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned lo = if_nametoindex("lo");
    assert_int_equal(mw__parse_addr("::1", PORT, &ss), 0);
    assert_v6(&ss, "::1", PORT, 0);
    assert_int_equal(mw__parse_addr("[::1]", PORT, &ss), 0);
    assert_v6(&ss, "::1", PORT, 0);
    assert_int_equal(mw__parse_addr("[::1]:80", PORT, &ss), 0);
    assert_v6(&ss, "::1", 80, 0);
    assert_int_equal(mw__parse_addr("2001:db8::1:80", PORT, &ss), 0); /* never a port */
    assert_v6(&ss, "2001:db8::1:80", PORT, 0);
    assert_int_equal(mw__parse_addr("[fe80::1%7]:7471", PORT, &ss), 0);
    assert_v6(&ss, "fe80::1", 7471, 7);
    assert_int_equal(mw__parse_addr("fe80::1%7", PORT, &ss), 0);
    assert_v6(&ss, "fe80::1", PORT, 7);
    if (lo) { /* an interface name every Linux host has */
        assert_int_equal(mw__parse_addr("[fe80::1%lo]:7470", 1, &ss), 0);
        assert_v6(&ss, "fe80::1", 7470, lo);
    }
    assert_int_equal(mw__parse_addr("[::ffff:1.2.3.4]:9", PORT, &ss), 0);
    assert_v6(&ss, "::ffff:1.2.3.4", 9, 0);
}

static void parse_names(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    assert_int_equal(mw__parse_addr("localhost", PORT, &ss), 0);
    assert_true(ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), PORT); /* same offset */
    assert_int_equal(mw__parse_addr("localhost:80", PORT, &ss), 0);
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 80);
}

/* ".invalid" never resolves (RFC 2606); without a reachable resolver the
 * answer is "try again" rather than "no such host". */
static void parse_unknown_name(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    int rc = mw__parse_addr("no-such-host.invalid:80", PORT, &ss);
    assert_true(rc == -EHOSTUNREACH || rc == -EAGAIN);
    rc = mw__parse_addr("no-such-host.invalid", PORT, &ss);
    assert_true(rc == -EHOSTUNREACH || rc == -EAGAIN);
}

static void parse_garbage(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", ":", "::::", "[", "]", "[]", "[]:80", "[::1", "::1]", "[::1]x", "[::1]:",
        "[::1]:x", "[::1]::80", "[1.2.3.4]:80", "[host]:80", "1.2.3.4:", "1.2.3.4:99999",
        "1.2.3.4:65536", "1.2.3.4:-1", "1.2.3.4:+80", "1.2.3.4:8 0", "1.2.3.4:80x",
        "1.2.3.4:0x50", " 1.2.3.4", "1.2.3.4 ", "1.2.3.256", "1.2.3", "127.1", "1234",
        "1.2.3.4.5", ":80", "host:", "ho st", "a..b", ".host", "host/x", "host_:80:1",
        "fe80::1%", "[fe80::1%]:80", "fe80::1%99999999999", "gggg::1", "1:2:3:4:5:6:7:8:9",
        "x:y", "[::1]]:80", "host,other", "1.2.3.4\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sockaddr_storage ss;
        int rc = mw__parse_addr(bad[i], PORT, &ss);
        if (rc != -EINVAL)
            fail_msg("\"%s\": %d, want -EINVAL", bad[i], rc);
    }
    char longname[300];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    struct sockaddr_storage ss;
    assert_int_equal(mw__parse_addr(longname, PORT, &ss), -EINVAL);
    assert_int_equal(mw__parse_addr(NULL, PORT, &ss), -EINVAL);
    assert_int_equal(mw__parse_addr("[fe80::1%nosuchif9]:80", PORT, &ss), -ENODEV);
}

static void parse_list(void **state)
{
    (void)state;
    struct sockaddr_storage *v = NULL;
    size_t n = 0;
    assert_int_equal(mw__parse_addr_list("10.0.12.2, [fd00::2]:81 ,::1,localhost:82,10.0.13.2:83",
                                         PORT, &v, &n), 0);
    assert_int_equal(n, 5);
    /* an address without a port takes the next one written after it */
    assert_v4(&v[0], "10.0.12.2", 81);
    assert_v6(&v[1], "fd00::2", 81, 0);
    assert_v6(&v[2], "::1", 82, 0);
    assert_int_equal(ntohs(((struct sockaddr_in *)&v[3])->sin_port), 82);
    assert_v4(&v[4], "10.0.13.2", 83);
    free(v);

    /* the README's two spellings of one rank's addresses are the same */
    static const char *const same[] = {"10.0.1.2:7480,10.0.2.2:7480", "10.0.1.2,10.0.2.2:7480",
                                       "10.0.1.2:7480, 10.0.2.2"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(mw__parse_addr_list(same[i], 7480, &v, &n), 0);
        assert_int_equal(n, 2);
        assert_v4(&v[0], "10.0.1.2", 7480);
        assert_v4(&v[1], "10.0.2.2", 7480);
        free(v);
    }
    /* after the last port written: the default */
    assert_int_equal(mw__parse_addr_list("1.2.3.4:9,1.2.3.5", PORT, &v, &n), 0);
    assert_v4(&v[0], "1.2.3.4", 9);
    assert_v4(&v[1], "1.2.3.5", PORT);
    free(v);

    assert_int_equal(mw__parse_addr_list("1.2.3.4", PORT, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_v4(&v[0], "1.2.3.4", PORT);
    free(v);
}

static void parse_list_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", ",", " ", "1.2.3.4,", ",1.2.3.4", "1.2.3.4,,1.2.3.5", "1.2.3.4;1.2.3.5",
        "1.2.3.4, 1.2.3.4:99999", "[::1,1.2.3.4", "1.2.3.4 1.2.3.5",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sockaddr_storage *v = (void *)1;
        size_t n = 42;
        int rc = mw__parse_addr_list(bad[i], PORT, &v, &n);
        if (rc != -EINVAL)
            fail_msg("\"%s\": %d, want -EINVAL", bad[i], rc);
        assert_null(v);
        assert_int_equal(n, 0);
    }
    struct sockaddr_storage *v;
    size_t n;
    assert_int_equal(mw__parse_addr_list("1.2.3.4,no-such-host.invalid", PORT, &v, &n) < 0, 1);
    assert_null(v);
    assert_int_equal(mw__parse_addr_list(NULL, PORT, &v, &n), -EINVAL);
}

/* mw_connect's parse: names handed back with their ports, not looked up;
 * then set from the literal a lookup found. */
static void addr_list_names_left_for_later(void **state)
{
    (void)state;
    struct sockaddr_storage *v;
    size_t n;
    char **names;
    assert_int_equal(mw__parse_addr_list_names("node1,10.0.2.2,no-such-host.invalid:7480",
                                               PORT, &v, &n, &names), 0);
    assert_int_equal(n, 3);
    assert_string_equal(names[0], "node1");
    assert_null(names[1]);
    assert_string_equal(names[2], "no-such-host.invalid");
    assert_int_equal(v[0].ss_family, AF_UNSPEC);
    assert_int_equal(v[1].ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&v[1])->sin_port), 7480);
    assert_int_equal(mw__addr_set_numeric(&v[0], "10.0.1.7"), 0);
    char s0[MW__ADDR_STRLEN];
    assert_string_equal(mw__addr_str((struct sockaddr *)&v[0], s0, sizeof s0), "10.0.1.7:7480");
    assert_int_equal(mw__addr_set_numeric(&v[2], "fe80::1"), 0);
    assert_int_equal(v[2].ss_family, AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&v[2])->sin6_port), 7480);
    assert_int_equal(mw__addr_set_numeric(&v[2], "junk"), -EINVAL);
    for (size_t i = 0; i < n; i++)
        mw__free(names[i]);
    mw__free(names);
    mw__free(v);
    /* malformed input is still refused at once */
    assert_int_equal(mw__parse_addr_list_names("node1,,x", PORT, &v, &n, &names), -EINVAL);
    assert_int_equal(mw__parse_addr_list_names("127.1", PORT, &v, &n, &names), -EINVAL);
}

/* One port per communicator entry: the port every address ends up on. */
static void entry_port(void **state)
{
    (void)state;
    static const struct {
        const char *entry;
        int port;                 /* -1: refused */
        bool v6;
    } cases[] = {
        {"10.0.1.2", PORT, false},
        {"10.0.1.2:7480", 7480, false},
        {"10.0.1.2,10.0.2.2:7480", 7480, false},
        {"10.0.1.2:7480,10.0.2.2:7480", 7480, false},
        {"node1, node1-b:9", 9, false},
        {"[fd00::1]:81,10.0.0.1", -1, true},      /* 81, then the default */
        {"[fd00::1],10.0.0.1:81", 81, true},
        {"::1", PORT, true},
        {"10.0.1.2:1,10.0.2.2:2", -1, false},
        {"10.0.1.2:7480,10.0.2.2", -1, false},     /* 7480, then the default */
        {"", -1, false},
        {"a,,b", -1, false},
        {"1.2.3.4:99999", -1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t port = 0;
        bool v6 = false;
        int rc = mw__addr_list_port(cases[i].entry, PORT, &port, &v6);
        if (cases[i].port < 0) {
            if (rc != -EINVAL)
                fail_msg("\"%s\": %d, want -EINVAL", cases[i].entry, rc);
            continue;
        }
        if (rc != 0 || port != cases[i].port || v6 != cases[i].v6)
            fail_msg("\"%s\": rc %d port %u v6 %d", cases[i].entry, rc, port, v6);
    }
}

/* ------------------------------------------------------------------------
 * mw__addr_str
 * ------------------------------------------------------------------------ */

/* print(parse(s)) == s, and parse(print(x)) == x */
static void round_trip(const char *s)
{
    struct sockaddr_storage a, b;
    char buf[MW__ADDR_STRLEN];
    assert_int_equal(mw__parse_addr(s, 1, &a), 0);
    assert_string_equal(mw__addr_str(sa(&a), buf, sizeof(buf)), s);
    assert_int_equal(mw__parse_addr(buf, 1, &b), 0);
    assert_memory_equal(&a, &b, sizeof(a));
}

static void addr_str_round_trips(void **state)
{
    (void)state;
    round_trip("1.2.3.4:7470");
    round_trip("0.0.0.0:0");
    round_trip("255.255.255.255:65535");
    round_trip("[::1]:7470");
    round_trip("[2001:db8::1:80]:80");
    round_trip("[fe80::1%4242]:7470"); /* no such interface: printed as a number */
    if (if_nametoindex("lo"))
        round_trip("[fe80::1%lo]:7470");
}

static void addr_str_edge_cases(void **state)
{
    (void)state;
    char buf[MW__ADDR_STRLEN], small[8];
    struct sockaddr_storage ss = ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
    ((struct sockaddr_in6 *)&ss)->sin6_port = htons(65535);
    ((struct sockaddr_in6 *)&ss)->sin6_scope_id = UINT32_MAX;
    mw__addr_str(sa(&ss), buf, sizeof(buf));
    assert_string_equal(buf, "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535");
    assert_string_equal(mw__addr_str(sa(&ss), small, sizeof(small)), "[ffff:f");
    assert_string_equal(mw__addr_str(NULL, buf, sizeof(buf)), "(none)");
    struct sockaddr un = {.sa_family = AF_UNIX};
    assert_string_equal(mw__addr_str(&un, buf, sizeof(buf)), "(family 1)");
    assert_null(mw__addr_str(sa(&ss), NULL, 0));
}

/* ------------------------------------------------------------------------
 * Listing: synthetic getifaddrs data, then this host
 * ------------------------------------------------------------------------ */

struct fake_if {
    struct ifaddrs ifa;
    struct sockaddr_storage addr, mask;
};

static void fake_link(struct fake_if *f, const char *name, int ifindex,
                      const uint8_t *ipoib_gid)
{
    struct sockaddr_ll *ll = (struct sockaddr_ll *)&f->addr;
    memset(f, 0, sizeof(*f));
    f->ifa.ifa_name = (char *)name;
    f->ifa.ifa_addr = (struct sockaddr *)&f->addr;
    ll->sll_family = AF_PACKET;
    ll->sll_ifindex = ifindex;
    ll->sll_hatype = ARPHRD_ETHER;
    ll->sll_halen = 6;
    if (ipoib_gid) { /* 20-byte hardware address: QPN, then the port GID */
        uint8_t *hw = (uint8_t *)ll + offsetof(struct sockaddr_ll, sll_addr);
        ll->sll_hatype = ARPHRD_INFINIBAND;
        ll->sll_halen = 20;
        memcpy(hw + 4, ipoib_gid, 16);
    }
}

/* An address entry; @mask NULL leaves the netmask out. */
static void fake_addr(struct fake_if *f, const char *name, const char *addr,
                      const char *mask)
{
    memset(f, 0, sizeof(*f));
    f->ifa.ifa_name = (char *)name;
    f->addr = ip(addr);
    f->ifa.ifa_addr = (struct sockaddr *)&f->addr;
    if (mask) {
        f->mask = ip(mask);
        f->ifa.ifa_netmask = (struct sockaddr *)&f->mask;
    }
}

static void chain(struct fake_if *f, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        f[i].ifa.ifa_next = &f[i + 1].ifa;
    f[n - 1].ifa.ifa_next = NULL;
}

static const uint8_t GID_IB0[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0x11, 0x22, 0x33};

static void list_from_ifaddrs(void **state)
{
    (void)state;
    struct fake_if f[12];
    uint8_t other_gid[16];
    memcpy(other_gid, GID_IB0, 16);
    other_gid[15] ^= 1;
    fake_link(&f[0], "lo", 1, NULL);
    fake_link(&f[1], "eth1", 5, NULL);
    fake_link(&f[2], "eth2", 6, NULL);
    fake_link(&f[3], "ib0", 7, GID_IB0);
    fake_link(&f[4], "ib1", 8, other_gid);
    fake_addr(&f[5], "lo", "127.0.0.1", "255.0.0.0");
    fake_addr(&f[6], "eth1", "10.0.12.1", "255.255.255.0");
    fake_addr(&f[7], "eth1:1", "10.9.0.1", "255.255.240.0");
    fake_addr(&f[8], "eth1", "fe80::1", "ffff:ffff:ffff:ffff::");
    fake_addr(&f[9], "eth2", "192.168.1.1", "255.255.255.0"); /* no RDMA device */
    fake_addr(&f[10], "ib0", "10.10.0.1", NULL);
    fake_addr(&f[11], "ib1", "10.11.0.1", "255.255.0.0"); /* GID unknown to verbs */
    chain(f, 12);

    struct mw__nic_ndev nd[2];
    memset(nd, 0, sizeof(nd));
    nd[0].ifindex = 5;
    snprintf(nd[0].dev, sizeof(nd[0].dev), "rxe0");
    nd[1].ifindex = 0; /* IB: matched by GID */
    memcpy(nd[1].gid, GID_IB0, 16);
    snprintf(nd[1].dev, sizeof(nd[1].dev), "mlx5_0");

    struct mw__nic *nics;
    size_t n;
    char buf[MW__ADDR_STRLEN];
    assert_int_equal(mw__nic_from_ifaddrs(&f[0].ifa, nd, 2, &nics, &n), 0);
    assert_int_equal(n, 4);
    const struct { const char *addr, *ifname, *dev; int prefix; unsigned ifindex; } want[] = {
        {"10.0.12.1:0", "eth1", "rxe0", 24, 5},
        {"10.9.0.1:0", "eth1", "rxe0", 20, 5},
        {"[fe80::1%5]:0", "eth1", "rxe0", 64, 5}, /* scope filled from ifindex */
        {"10.10.0.1:0", "ib0", "mlx5_0", 32, 7},  /* no netmask: a host */
    };
    for (size_t i = 0; i < n; i++) {
        const struct sockaddr *a = sa(&nics[i].addr);
        if (!(a->sa_family == AF_INET6 && if_indextoname(5, buf))) /* %5 may have a name */
            assert_string_equal(mw__addr_str(a, buf, sizeof(buf)), want[i].addr);
        assert_string_equal(nics[i].ifname, want[i].ifname);
        assert_string_equal(nics[i].dev, want[i].dev);
        assert_int_equal(nics[i].prefix_len, want[i].prefix);
        assert_int_equal(nics[i].ifindex, want[i].ifindex);
    }
    assert_int_equal(((struct sockaddr_in6 *)&nics[2].addr)->sin6_scope_id, 5);
    free(nics);

    assert_int_equal(mw__nic_from_ifaddrs(&f[0].ifa, NULL, 0, &nics, &n), 0);
    assert_int_equal(n, 0);
    assert_null(nics);
    assert_int_equal(mw__nic_from_ifaddrs(NULL, nd, 2, &nics, &n), 0);
    assert_int_equal(n, 0);
}

/* Whatever this host has (often nothing): a sane list, and n == 0 without
 * devices.  The same test passes on rxe and on hardware. */
static void list_this_host(void **state)
{
    (void)state;
    struct mw__nic *nics = (void *)1;
    size_t n = 42;
    char buf[MW__ADDR_STRLEN];
    assert_int_equal(mw__nic_list(&nics, &n), 0);
    assert_true(n == 0 || nics != NULL);
    for (size_t i = 0; i < n; i++) {
        int fam = nics[i].addr.ss_family;
        assert_true(fam == AF_INET || fam == AF_INET6);
        assert_in_range(nics[i].prefix_len, 0, fam == AF_INET ? 32 : 128);
        assert_true(nics[i].ifindex > 0);
        assert_true(nics[i].ifname[0] != '\0');
        assert_true(nics[i].dev[0] != '\0');
        print_message("nic %s/%d on %s (%s)\n", mw__addr_str(sa(&nics[i].addr), buf, sizeof(buf)),
                      nics[i].prefix_len, nics[i].ifname, nics[i].dev);
    }
    free(nics);
}

/* The kernel's way to a peer: through loopback counts as RDMA (rdma_cm
 * takes any device); elsewhere only when it leaves from an RDMA address. */
static void route_way_out_decides_rdma(void **state)
{
    (void)state;
    struct sockaddr_storage from, p = ip("127.0.0.1");
    assert_int_equal(mw__nic_route_rdma(NULL, 0, sa(&p), &from), 1);
    p = ip("192.0.2.1");          /* TEST-NET-1: routed by the default route, if any */
    int rc = mw__nic_route_rdma(NULL, 0, sa(&p), &from);
    if (rc < 0) {
        assert_true(rc == -ENETUNREACH || rc == -EHOSTUNREACH);
        return;                   /* no default route here */
    }
    assert_int_equal(rc, 0);      /* no RDMA address at all */
    struct mw__nic nics[2] = {nic("198.51.100.7", 24, 1), nic("198.51.100.8", 24, 2)};
    assert_int_equal(mw__nic_route_rdma(nics, 2, sa(&p), &from), 0);
    nics[1].addr = from;          /* the way out is an RDMA device's */
    assert_int_equal(mw__nic_route_rdma(nics, 2, sa(&p), &from), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(choose_longest_prefix_v4),
        cmocka_unit_test(choose_longest_prefix_v6),
        cmocka_unit_test(choose_odd_prefixes),
        cmocka_unit_test(choose_family_mismatch),
        cmocka_unit_test(choose_zero_prefix_never_matches),
        cmocka_unit_test(choose_host_prefix),
        cmocka_unit_test(choose_tie_takes_first),
        cmocka_unit_test(choose_link_local_by_scope),
        cmocka_unit_test(choose_empty_and_null),
        cmocka_unit_test(choose_direct_connect_mesh),
        cmocka_unit_test(order_matches_first_stable),
        cmocka_unit_test(order_without_matches_keeps_order),
        cmocka_unit_test(parse_ipv4),
        cmocka_unit_test(parse_ipv6),
        cmocka_unit_test(parse_names),
        cmocka_unit_test(parse_unknown_name),
        cmocka_unit_test(parse_garbage),
        cmocka_unit_test(parse_list),
        cmocka_unit_test(parse_list_errors),
        cmocka_unit_test(entry_port),
        cmocka_unit_test(addr_str_round_trips),
        cmocka_unit_test(addr_str_edge_cases),
        cmocka_unit_test(list_from_ifaddrs),
        cmocka_unit_test(addr_list_names_left_for_later),
        cmocka_unit_test(list_this_host),
        cmocka_unit_test(route_way_out_decides_rdma),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
