/* Local NIC choice by the peer's subnet, and peer address parsing.
 *
 * Direct-connect meshes put every pair of nodes on its own subnet, one link
 * per NIC: the routing table alone then picks a working source only if it was
 * set up with care.  For each peer address we pick the local address whose
 * subnet contains it (longest prefix) and hand it to rdma_resolve_addr() as
 * the source; with no match the routing table decides.
 *
 * Pure logic apart from mw__nic_list() (verbs + getifaddrs), the kernel's
 * route in mw__nic_route_rdma() and name resolution in mw__parse_addr();
 * no context needed.  Internal (mw__ names).
 */
#ifndef MW_CM_NIC_H
#define MW_CM_NIC_H

#include <net/if.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct ifaddrs;

#define MW__NIC_DEVLEN 64 /* RDMA device name (IBV_SYSFS_NAME_MAX) */

/* Room for "[ffff:...:ffff%ifname]:65535" plus NUL. */
#define MW__ADDR_STRLEN 72

/* One local address on a netdev that carries an RDMA device. */
struct mw__nic {
    struct sockaddr_storage addr; /* AF_INET or AF_INET6, port 0; IPv6
                                     link-local has sin6_scope_id set */
    int prefix_len;               /* from the netmask: 0..32 or 0..128 */
    unsigned ifindex;
    char ifname[IF_NAMESIZE];     /* netdev name, without an alias label */
    char dev[MW__NIC_DEVLEN];     /* RDMA device name, e.g. "rxe0" */
};

/* A netdev known to carry an RDMA device, as verbs reports it: RoCE/iWARP
 * GID entries name their netdev by ifindex; IB GID entries name none, so an
 * IPoIB netdev is recognised by its hardware address, whose last 16 bytes
 * are the port GID.  ifindex == 0 means "match by gid". */
struct mw__nic_ndev {
    unsigned ifindex;
    uint8_t gid[16];
    char dev[MW__NIC_DEVLEN];
};

/**
 * mw__nic_list() - the IPv4/IPv6 addresses of netdevs carrying an RDMA device.
 * @out: receives a malloc'd array (NULL when empty); the caller mw__free()s it.
 * @n:   receives its length, possibly 0.
 *
 * Devices are rdma_cm's (rdma_get_devices: opened once a process), their
 * netdevs from ibv_query_gid_table() (no sysfs walk), addresses from
 * getifaddrs(): cheap enough to list again whenever an address changes.
 * IPv6 link-local addresses are listed too (rdma_cm can use them);
 * mw__nic_choose() matches them by scope id, not by prefix.  A device that
 * cannot be queried is skipped.  No RDMA support in the kernel is not an
 * error: *n == 0.
 * Return: 0 or a negative errno (-ENOMEM, getifaddrs' error).
 */
int mw__nic_list(struct mw__nic **out, size_t *n);

/*
 * mw__nic_list_ip() - the IPv4 addresses of this host's netdevs that are
 * up, for peers to reach it over TCP: loopback only when there is no
 * other (a remote peer told 127.0.0.1 would reach itself).  dev is "".
 * Return: as mw__nic_list().
 */
int mw__nic_list_ip(struct mw__nic **out, size_t *n);

/**
 * mw__nic_from_ifaddrs() - the part of mw__nic_list() after verbs: the
 * addresses in @ifa of the netdevs named by @nd.  Exposed for unit tests.
 * @ifa: a getifaddrs() list (AF_PACKET entries give ifindexes and IPoIB
 *       hardware addresses); not modified.
 * Return: as mw__nic_list().
 */
int mw__nic_from_ifaddrs(const struct ifaddrs *ifa, const struct mw__nic_ndev *nd,
                         size_t nnd, struct mw__nic **out, size_t *n);

/**
 * mw__nic_choose() - the local address to reach @peer from.
 * Same family only.  Longest matching prefix wins; on a tie, the lower index.
 * A /0 local prefix never matches (it carries no subnet information: leave it
 * to the routing table).  An IPv6 link-local peer matches only link-local
 * local addresses on the interface named by its scope id (every link has
 * fe80::/64, so the prefix says nothing); without a scope id, none.
 * Return: an index into @nics, or -1 when none matches (then let the routing
 * table decide).
 */
int mw__nic_choose(const struct mw__nic *nics, size_t n, const struct sockaddr *peer);

/**
 * mw__nic_route_rdma() - whether the routing table's way to @peer leaves
 * from one of @nics (RDMA-capable): where it does not, rdma_cm cannot
 * reach @peer, and may take its whole timeout to say so (a neighbour not
 * yet resolved).  A way out through loopback counts as RDMA: rdma_cm
 * takes any device for it.
 * @from: receives the source address the kernel picked.
 * Return: 1 or 0; a negative errno when the kernel has no route.
 */
int mw__nic_route_rdma(const struct mw__nic *nics, size_t n, const struct sockaddr *peer,
                       struct sockaddr_storage *from);

/**
 * mw__nic_order() - stable-sort one peer's addresses in place: those in a
 * local subnet first, longer matching prefix first; the rest after, in the
 * given order.  Insertion sort: meant for a handful of addresses.
 */
void mw__nic_order(const struct mw__nic *nics, size_t n,
                   struct sockaddr_storage *peers, size_t npeers);

/**
 * mw__parse_addr() - parse one peer address.
 * Accepted: "1.2.3.4", "1.2.3.4:7470", "::1" (bare IPv6: never a port),
 * "[::1]", "[fe80::1%eth0]:7470" (scope: interface name or number),
 * "host", "host:7470".  Ports are decimal 0..65535 (0 = "any", for listening);
 * @default_port applies when none is given.  No whitespace allowed.
 * Names go through getaddrinfo() synchronously, first result wins: names in
 * /etc/hosts are instant, DNS may block the caller (mw_connect looks names
 * up off the loop instead: mw__parse_addr_list_names()).  A name of only digits and dots must be a dotted quad
 * (getaddrinfo's "127.1" shorthand is refused as a likely typo).
 * Return: 0; -EINVAL for malformed input; -EHOSTUNREACH for a name that does
 * not resolve; -ENODEV for an unknown scope interface; -EAGAIN for a
 * temporary resolver failure; -ENOMEM.
 */
int mw__parse_addr(const char *s, uint16_t default_port, struct sockaddr_storage *out);

/**
 * mw__parse_addr_list() - parse "a,b,c" with mw__parse_addr() rules
 * (blanks around items are ignored; an empty item is -EINVAL; IPv6 with a
 * port must be bracketed).  An address without a port takes the port of
 * the next address written with one ("A,B:7480": both on 7480); with none
 * after it, @default_port.
 * @out: receives a malloc'd array the caller mw__free()s (NULL on error).
 * Return: 0 or mw__parse_addr()'s error for the first bad item.
 */
int mw__parse_addr_list(const char *s, uint16_t default_port,
                        struct sockaddr_storage **out, size_t *n);

/**
 * mw__parse_addr_list_names() - mw__parse_addr_list() without looking
 * names up: an item that is a host name is handed back in (*@names)[i]
 * (a copy; NULL for a literal), with its port in (*@out)[i] and family
 * AF_UNSPEC until mw__addr_set_numeric() fills it.  Free each name and
 * the array with mw__free().
 */
int mw__parse_addr_list_names(const char *s, uint16_t default_port,
                              struct sockaddr_storage **out, size_t *n, char ***names);

/* mw__addr_set_numeric() - @sa (a name's, from the above) at @numeric, a
 * literal address; its port kept.  Return: 0 or -EINVAL. */
int mw__addr_set_numeric(struct sockaddr_storage *sa, const char *numeric);

/**
 * mw__addr_list_port() - the one port every address of list @s is on, by
 * mw__parse_addr_list()'s rule, for an entry that must name a single port
 * (a communicator rank).  Names are not resolved.
 * @v6: set when an address is IPv6.
 * Return: 0, or -EINVAL when malformed or when two different ports appear.
 */
int mw__addr_list_port(const char *s, uint16_t default_port, uint16_t *port, bool *v6);

/**
 * mw__addr_str() - "1.2.3.4:7470", "[::1]:7470", "[fe80::1%eth0]:7470"
 * into @buf (MW__ADDR_STRLEN always suffices; truncated to @cap otherwise).
 * Return: @buf.  Unknown families print as "(family N)".
 */
const char *mw__addr_str(const struct sockaddr *sa, char *buf, size_t cap);

#endif
