/* Local NIC choice by subnet; peer address parsing and printing. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netpacket/packet.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm/nic.h"
#include "core/alloc.h"

/* IPoIB hardware address: 4 bytes of flags and QPN, then the port GID. */
#define IPOIB_HWADDR_LEN 20
#define IPOIB_GID_OFFSET 4

/* A DNS name is at most 253 characters; leave room for a trailing dot. */
#define HOST_MAX 255

/* ------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------ */

/* Room for one more element in a malloc'd array: the array, possibly moved,
 * or NULL when out of memory (the old one is then still valid).  Returns the
 * pointer rather than taking a void ** so no type punning is needed. */
static void *grow(void *arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return arr;
    size_t ncap = *cap ? *cap * 2 : 8;
    if (ncap > SIZE_MAX / elem)
        return NULL;
    void *p = mw__realloc(arr, ncap * elem);
    if (p)
        *cap = ncap;
    return p;
}

/* The address bytes of an AF_INET/AF_INET6 sockaddr and their bit count. */
static const uint8_t *addr_bytes(const struct sockaddr *sa, int *bits)
{
    if (sa->sa_family == AF_INET) {
        *bits = 32;
        return (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
    }
    if (sa->sa_family == AF_INET6) {
        *bits = 128;
        return (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    }
    *bits = 0;
    return NULL;
}

/* Whether the first @plen bits of @a and @b agree. */
static bool prefix_eq(const uint8_t *a, const uint8_t *b, int plen)
{
    int whole = plen / 8, rest = plen % 8;
    if (memcmp(a, b, (size_t)whole) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return ((a[whole] ^ b[whole]) & mask) == 0;
}

static bool is_v6_link_local(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* ------------------------------------------------------------------------
 * Which netdevs carry an RDMA device: from the GID tables, not sysfs
 * ------------------------------------------------------------------------ */

struct ndev_vec {
    struct mw__nic_ndev *v;
    size_t n, cap;
};

/* Many GID entries name the same netdev (one per address, per GID type):
 * keep each netdev (or IB GID) once. */
static int ndev_add(struct ndev_vec *nv, unsigned ifindex, const uint8_t *gid,
                    const char *dev)
{
    for (size_t i = 0; i < nv->n; i++) {
        if (nv->v[i].ifindex != ifindex)
            continue;
        if (ifindex != 0 || memcmp(nv->v[i].gid, gid, 16) == 0)
            return 0;
    }
    struct mw__nic_ndev *v = grow(nv->v, &nv->cap, nv->n, sizeof(*v));
    if (!v)
        return -ENOMEM;
    nv->v = v;
    struct mw__nic_ndev *d = &nv->v[nv->n++];
    memset(d, 0, sizeof(*d));
    d->ifindex = ifindex;
    memcpy(d->gid, gid, 16);
    snprintf(d->dev, sizeof(d->dev), "%s", dev);
    return 0;
}

/* RoCE and iWARP entries name their netdev; IB entries name none (IPoIB is
 * matched later by hardware address). */
static int ndev_add_entry(struct ndev_vec *nv, const struct ibv_gid_entry *e,
                          const char *dev)
{
    if (e->ndev_ifindex != 0)
        return ndev_add(nv, e->ndev_ifindex, e->gid.raw, dev);
    if (e->gid_type == IBV_GID_TYPE_IB)
        return ndev_add(nv, 0, e->gid.raw, dev);
    return 0;
}

/* ibv_query_gid_table() wants room for every port's table at once. */
static size_t gid_table_size(struct ibv_context *ctx)
{
    struct ibv_device_attr da;
    if (ibv_query_device(ctx, &da) != 0)
        return 0;
    size_t total = 0;
    for (unsigned p = 1; p <= da.phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        if (ibv_query_port(ctx, (uint8_t)p, &pa) == 0 && pa.gid_tbl_len > 0)
            total += (size_t)pa.gid_tbl_len;
    }
    return total;
}

/* A device we cannot query is skipped, not fatal: it may be going away;
 * the others still work. */
static int ndevs_of_device(struct ibv_context *ctx, struct ndev_vec *nv)
{
    int rc = 0;
    size_t max = gid_table_size(ctx);
    struct ibv_gid_entry *e = max ? mw__calloc(max, sizeof(*e)) : NULL;
    if (max && !e)
        return -ENOMEM;
    ssize_t got = max ? ibv_query_gid_table(ctx, e, max, 0) : 0;
    for (ssize_t i = 0; i < got && rc == 0; i++)
        rc = ndev_add_entry(nv, &e[i], ibv_get_device_name(ctx->device));
    mw__free(e);
    return rc;
}

/* The devices rdma_cm itself has open (it opens each once a process and
 * keeps it): listing them again after an address changed costs queries,
 * not device opens. */
static int ndevs_from_verbs(struct ndev_vec *nv)
{
    int num = 0;
    errno = 0;
    struct ibv_context **list = rdma_get_devices(&num);
    if (!list)   /* no RDMA support in the kernel, or no device: none */
        return errno == ENODEV || errno == ENOSYS || errno == ENOENT || !errno
                   ? 0 : -(errno ? errno : ENOMEM);
    int rc = 0;
    for (int i = 0; i < num && rc == 0; i++)
        rc = ndevs_of_device(list[i], nv);
    rdma_free_devices(list);
    return rc;
}

/* ------------------------------------------------------------------------
 * Addresses of those netdevs: getifaddrs
 * ------------------------------------------------------------------------ */

struct nic_vec {
    struct mw__nic *v;
    size_t n, cap;
};

static const struct sockaddr_ll *as_ll(const struct ifaddrs *a)
{
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_PACKET)
        return NULL;
    return (const struct sockaddr_ll *)a->ifa_addr;
}

/* An IPoIB netdev's RDMA device: the one whose IB GID ends its hardware
 * address.  glibc stores up to 24 address bytes although sockaddr_ll
 * declares 8: read them through a byte pointer. */
static const char *ipoib_dev(const struct sockaddr_ll *ll,
                             const struct mw__nic_ndev *nd, size_t nnd)
{
    if (ll->sll_hatype != ARPHRD_INFINIBAND || ll->sll_halen != IPOIB_HWADDR_LEN)
        return NULL;
    const uint8_t *gid = (const uint8_t *)ll + offsetof(struct sockaddr_ll, sll_addr) +
                         IPOIB_GID_OFFSET;
    for (size_t i = 0; i < nnd; i++)
        if (nd[i].ifindex == 0 && memcmp(nd[i].gid, gid, 16) == 0)
            return nd[i].dev;
    return NULL;
}

/* The RDMA device on netdev @ifindex, or NULL. */
static const char *rdma_dev_of(const struct ifaddrs *all, unsigned ifindex,
                               const struct mw__nic_ndev *nd, size_t nnd)
{
    for (size_t i = 0; i < nnd; i++)
        if (nd[i].ifindex != 0 && nd[i].ifindex == ifindex)
            return nd[i].dev;
    for (const struct ifaddrs *a = all; a; a = a->ifa_next) {
        const struct sockaddr_ll *ll = as_ll(a);
        if (ll && (unsigned)ll->sll_ifindex == ifindex)
            return ipoib_dev(ll, nd, nnd);
    }
    return NULL;
}

/* ifindex of netdev @name from the AF_PACKET entry getifaddrs lists for every
 * link (saves an ioctl per address); if_nametoindex() as a fallback. */
static unsigned ifindex_of(const struct ifaddrs *all, const char *name)
{
    for (const struct ifaddrs *a = all; a; a = a->ifa_next) {
        const struct sockaddr_ll *ll = as_ll(a);
        if (ll && a->ifa_name && strcmp(a->ifa_name, name) == 0)
            return (unsigned)ll->sll_ifindex;
    }
    return if_nametoindex(name);
}

/* Leading one bits of a netmask (a non-contiguous mask counts up to its
 * first zero).  No netmask: treat the address as a host route. */
static int prefix_of(const struct sockaddr *mask, int family)
{
    int bits = family == AF_INET ? 32 : 128, mbits;
    if (!mask || mask->sa_family != family)
        return bits;
    const uint8_t *m = addr_bytes(mask, &mbits);
    int n = 0;
    while (n < bits && (m[n / 8] & (0x80 >> (n % 8))))
        n++;
    return n;
}

static int nic_add(struct nic_vec *v, const struct ifaddrs *a, const char *ifname,
                   unsigned ifindex, const char *dev)
{
    struct mw__nic *arr = grow(v->v, &v->cap, v->n, sizeof(*arr));
    if (!arr)
        return -ENOMEM;
    v->v = arr;
    struct mw__nic *nic = &v->v[v->n++];
    memset(nic, 0, sizeof(*nic));
    int fam = a->ifa_addr->sa_family;
    memcpy(&nic->addr, a->ifa_addr,
           fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
    if (fam == AF_INET) {
        ((struct sockaddr_in *)&nic->addr)->sin_port = 0;
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&nic->addr;
        s6->sin6_port = 0;
        /* a link-local address means nothing without its interface */
        if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr) && s6->sin6_scope_id == 0)
            s6->sin6_scope_id = ifindex;
    }
    nic->prefix_len = prefix_of(a->ifa_netmask, fam);
    nic->ifindex = ifindex;
    snprintf(nic->ifname, sizeof(nic->ifname), "%s", ifname);
    snprintf(nic->dev, sizeof(nic->dev), "%s", dev);
    return 0;
}

/* The netdev getifaddrs entry @a is on, into @ifname: IPv4 alias labels
 * ("eth0:1") name it before the colon.  False for a name that cannot be. */
static bool netdev_of(const struct ifaddrs *a, char ifname[IF_NAMESIZE])
{
    size_t len = strcspn(a->ifa_name, ":");
    if (len == 0 || len >= IF_NAMESIZE)
        return false;
    memcpy(ifname, a->ifa_name, len);
    ifname[len] = '\0';
    return true;
}

/* One getifaddrs entry: added when it is an IP address on an RDMA netdev. */
static int consider(struct nic_vec *v, const struct ifaddrs *all, const struct ifaddrs *a,
                    const struct mw__nic_ndev *nd, size_t nnd)
{
    if (!a->ifa_addr || !a->ifa_name ||
        (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6))
        return 0;
    char ifname[IF_NAMESIZE];
    if (!netdev_of(a, ifname))
        return 0;
    unsigned ifindex = ifindex_of(all, ifname);
    const char *dev = ifindex ? rdma_dev_of(all, ifindex, nd, nnd) : NULL;
    return dev ? nic_add(v, a, ifname, ifindex, dev) : 0;
}

int mw__nic_from_ifaddrs(const struct ifaddrs *ifa, const struct mw__nic_ndev *nd,
                         size_t nnd, struct mw__nic **out, size_t *n)
{
    struct nic_vec v = {0};
    *out = NULL;
    *n = 0;
    for (const struct ifaddrs *a = ifa; a; a = a->ifa_next) {
        int rc = consider(&v, ifa, a, nd, nnd);
        if (rc) {
            mw__free(v.v);
            return rc;
        }
    }
    *out = v.v;
    *n = v.n;
    return 0;
}

int mw__nic_list(struct mw__nic **out, size_t *n)
{
    struct ndev_vec nv = {0};
    *out = NULL;
    *n = 0;
    int rc = ndevs_from_verbs(&nv);
    if (rc == 0 && nv.n > 0) {
        struct ifaddrs *ifa;
        if (getifaddrs(&ifa) != 0) {
            rc = -errno;
        } else {
            rc = mw__nic_from_ifaddrs(ifa, nv.v, nv.n, out, n);
            freeifaddrs(ifa);
        }
    }
    mw__free(nv.v);
    return rc;
}

/* One getifaddrs entry for mw__nic_list_ip(): an IPv4 address of a netdev
 * that is up, loopback or not as @loopback says. */
static int consider_ip(struct nic_vec *v, const struct ifaddrs *all, const struct ifaddrs *a,
                       bool loopback)
{
    if (!a->ifa_addr || !a->ifa_name || a->ifa_addr->sa_family != AF_INET ||
        !(a->ifa_flags & IFF_UP) || !(a->ifa_flags & IFF_LOOPBACK) != !loopback)
        return 0;
    char ifname[IF_NAMESIZE];
    if (!netdev_of(a, ifname))
        return 0;
    return nic_add(v, a, ifname, ifindex_of(all, ifname), "");
}

int mw__nic_list_ip(struct mw__nic **out, size_t *n)
{
    struct ifaddrs *ifa;
    *out = NULL;
    *n = 0;
    if (getifaddrs(&ifa) != 0)
        return -errno;
    struct nic_vec v = {0};
    int rc = 0;
    for (int loopback = 0; loopback < 2 && !rc && !v.n; loopback++)
        for (const struct ifaddrs *a = ifa; a && !rc; a = a->ifa_next)
            rc = consider_ip(&v, ifa, a, loopback);
    freeifaddrs(ifa);
    if (rc) {
        mw__free(v.v);
        return rc;
    }
    *out = v.v;
    *n = v.n;
    return 0;
}

/* ------------------------------------------------------------------------
 * Choice
 * ------------------------------------------------------------------------ */

/* The prefix length by which @nic's subnet contains @peer, or -1. */
static int match_len(const struct mw__nic *nic, const struct sockaddr *peer)
{
    const struct sockaddr *local = (const struct sockaddr *)&nic->addr;
    int bits;
    if (local->sa_family != peer->sa_family)
        return -1;
    if (is_v6_link_local(peer)) {
        uint32_t scope = ((const struct sockaddr_in6 *)peer)->sin6_scope_id;
        return is_v6_link_local(local) && scope != 0 && scope == nic->ifindex
                   ? nic->prefix_len
                   : -1;
    }
    const uint8_t *a = addr_bytes(local, &bits);
    const uint8_t *b = addr_bytes(peer, &bits);
    if (!a || nic->prefix_len <= 0 || nic->prefix_len > bits)
        return -1;
    return prefix_eq(a, b, nic->prefix_len) ? nic->prefix_len : -1;
}

/* Index and prefix length of the best match, -1/-1 when none. */
static int best_match(const struct mw__nic *nics, size_t n, const struct sockaddr *peer,
                      int *len)
{
    int best = -1;
    *len = -1;
    for (size_t i = 0; peer && i < n; i++) {
        int l = match_len(&nics[i], peer);
        if (l > *len) {
            *len = l;
            best = (int)i;
        }
    }
    return best;
}

int mw__nic_choose(const struct mw__nic *nics, size_t n, const struct sockaddr *peer)
{
    int len;
    return best_match(nics, n, peer, &len);
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr)[0] == 127;
    return sa->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
    int abits, bbits;
    const uint8_t *x = addr_bytes(a, &abits), *y = addr_bytes(b, &bbits);
    return x && a->sa_family == b->sa_family && !memcmp(x, y, (size_t)abits / 8);
}

int mw__nic_route_rdma(const struct mw__nic *nics, size_t n, const struct sockaddr *peer,
                       struct sockaddr_storage *from)
{
    struct sockaddr_storage to = {0};
    socklen_t len = peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    memcpy(&to, peer, len);
    ((struct sockaddr_in *)&to)->sin_port = htons(9);   /* a UDP connect sends nothing */
    int fd = socket(peer->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = 0;
    socklen_t flen = sizeof *from;
    if (fd < 0 || connect(fd, (struct sockaddr *)&to, len) < 0 ||
        getsockname(fd, (struct sockaddr *)from, &flen) < 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    if (rc < 0)
        return rc;
    ((struct sockaddr_in *)from)->sin_port = 0;  /* same offset in sockaddr_in6 */
    if (is_loopback((struct sockaddr *)from))   /* rdma_cm takes any device */
        return 1;
    for (size_t i = 0; i < n; i++)
        if (same_addr((const struct sockaddr *)&nics[i].addr, (struct sockaddr *)from))
            return 1;
    return 0;
}

void mw__nic_order(const struct mw__nic *nics, size_t n,
                   struct sockaddr_storage *peers, size_t npeers)
{
    for (size_t i = 1; i < npeers; i++) {
        struct sockaddr_storage cur = peers[i];
        int key, k;
        best_match(nics, n, (const struct sockaddr *)&cur, &key);
        size_t j = i;
        /* strictly greater: equal keys keep their order (stable) */
        while (j > 0) {
            best_match(nics, n, (const struct sockaddr *)&peers[j - 1], &k);
            if (k >= key)
                break;
            peers[j] = peers[j - 1];
            j--;
        }
        peers[j] = cur;
    }
}

/* ------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------ */

/* Decimal 0..65535 and nothing else (strtoul would take blanks and signs). */
static int parse_port(const char *s, size_t len, uint16_t *port)
{
    unsigned v = 0;
    if (len == 0 || len > 5)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > UINT16_MAX)
        return -EINVAL;
    *port = (uint16_t)v;
    return 0;
}

static void set_in(struct sockaddr_storage *out, const struct in_addr *a, uint16_t port)
{
    struct sockaddr_in *s4 = (struct sockaddr_in *)out;
    memset(out, 0, sizeof(*out));
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    s4->sin_addr = *a;
}

/* Scope after '%': an interface number or name. */
static int parse_scope(const char *s, uint32_t *scope)
{
    size_t len = strlen(s);
    if (len == 0 || len >= IF_NAMESIZE)
        return -EINVAL;
    if (strspn(s, "0123456789") == len) {
        /* at most 15 digits: strtoull cannot overflow */
        unsigned long long v = strtoull(s, NULL, 10);
        if (v > UINT32_MAX)
            return -EINVAL;
        *scope = (uint32_t)v;
        return 0;
    }
    *scope = if_nametoindex(s);
    return *scope ? 0 : -ENODEV;
}

/* An IPv6 literal with an optional "%scope"; @host is ours to modify. */
static int parse_ip6(char *host, uint16_t port, struct sockaddr_storage *out)
{
    struct sockaddr_in6 s6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    char *pct = strchr(host, '%');
    if (pct) {
        *pct = '\0';
        int rc = parse_scope(pct + 1, &s6.sin6_scope_id);
        if (rc)
            return rc;
    }
    if (inet_pton(AF_INET6, host, &s6.sin6_addr) != 1)
        return -EINVAL;
    memset(out, 0, sizeof(*out));
    memcpy(out, &s6, sizeof(s6));
    return 0;
}

/* Letters, digits, '-', '_' and dots between non-empty labels (one trailing
 * dot allowed).  Catches junk before it reaches the resolver, so that garbage
 * is -EINVAL and only a well-formed unknown name is -EHOSTUNREACH. */
static bool hostname_ok(const char *h)
{
    size_t label = 0;
    for (const char *p = h; *p; p++) {
        char c = *p;
        if (c == '.') {
            if (label == 0)
                return false;
            label = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                   (c >= '0' && c <= '9') || c == '-' || c == '_') {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return true;
}

static int gai_to_errno(int e)
{
    switch (e) {
    case EAI_AGAIN:
        return -EAGAIN;
    case EAI_MEMORY:
        return -ENOMEM;
    case EAI_SYSTEM:
        return errno ? -errno : -EIO;
    default: /* EAI_NONAME, EAI_NODATA, EAI_FAIL, ...: no such host */
        return -EHOSTUNREACH;
    }
}

static int resolve(const char *host, uint16_t port, struct sockaddr_storage *out)
{
    /* no AI_ADDRCONFIG: it hides "localhost" on hosts with only loopback */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e != 0)
        return gai_to_errno(e);
    int rc = -EHOSTUNREACH;
    for (const struct addrinfo *r = res; r; r = r->ai_next) {
        if (r->ai_family != AF_INET && r->ai_family != AF_INET6)
            continue;
        memset(out, 0, sizeof(*out));
        memcpy(out, r->ai_addr, r->ai_addrlen);
        if (r->ai_family == AF_INET)
            ((struct sockaddr_in *)out)->sin_port = htons(port);
        else
            ((struct sockaddr_in6 *)out)->sin6_port = htons(port);
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

/* A dotted quad, or a well-formed name for the resolver; with @name, a
 * name is not looked up but handed back (a copy) with its port in @out
 * (family AF_UNSPEC), for mw__addr_set_numeric(). */
static int parse_host(const char *host, uint16_t port, struct sockaddr_storage *out,
                      char **name)
{
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        set_in(out, &a4, port);
        return 0;
    }
    /* "1.2.3.256", "10.1": never a name, and getaddrinfo would accept the
     * inet_aton shorthand ("127.1" = 127.0.0.1), hiding a typo */
    if (strspn(host, "0123456789.") == strlen(host) || !hostname_ok(host))
        return -EINVAL;
    if (!name)
        return resolve(host, port, out);
    if (!(*name = mw__malloc(strlen(host) + 1)))
        return -ENOMEM;
    strcpy(*name, host);
    memset(out, 0, sizeof *out);
    ((struct sockaddr_in *)out)->sin_family = AF_UNSPEC;
    ((struct sockaddr_in *)out)->sin_port = htons(port);
    return 0;
}

int mw__addr_set_numeric(struct sockaddr_storage *sa, const char *numeric)
{
    uint16_t port = ntohs(((struct sockaddr_in *)sa)->sin_port);
    struct in_addr a4;
    if (inet_pton(AF_INET, numeric, &a4) == 1) {
        set_in(sa, &a4, port);
        return 0;
    }
    char v6[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if (strlen(numeric) >= sizeof v6)
        return -EINVAL;
    strcpy(v6, numeric);
    return parse_ip6(v6, port, sa);
}

/* Split "[v6]:port", "[v6]", "v6", "host:port", "host" into host and port. */
struct addr_parts {
    const char *host, *port;
    size_t hlen, plen;
    bool v6;
};

static int split_addr(const char *s, size_t len, struct addr_parts *p)
{
    memset(p, 0, sizeof(*p));
    p->host = s;
    p->hlen = len;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return -EINVAL;
        p->host = s + 1;
        p->hlen = (size_t)(close - s) - 1;
        p->v6 = true;
        size_t rest = len - p->hlen - 2;
        if (rest == 0)
            return 0;
        if (close[1] != ':')
            return -EINVAL; /* trailing junk after ']' */
        p->port = close + 2;
        p->plen = rest - 1;
        return 0;
    }
    const char *colon = memchr(s, ':', len);
    if (!colon)
        return 0;
    size_t after = len - (size_t)(colon - s) - 1;
    if (memchr(colon + 1, ':', after)) {
        p->v6 = true; /* several colons: a bare IPv6 address, never a port */
        return 0;
    }
    p->hlen = (size_t)(colon - s);
    p->port = colon + 1;
    p->plen = after;
    return 0;
}

/* The parts of one address and its port, if it names one (else 0 in
 * *@port and false in *@explicit); no name resolution. */
static int split_port(const char *s, size_t len, struct addr_parts *p, uint16_t *port,
                      bool *explicit)
{
    int rc = split_addr(s, len, p);
    if (rc)
        return rc;
    if (p->hlen == 0 || p->hlen > HOST_MAX)
        return -EINVAL;
    *port = 0;
    *explicit = p->port != NULL;
    return p->port ? parse_port(p->port, p->plen, port) : 0;
}

static int parse_span(const char *s, size_t len, uint16_t default_port,
                      struct sockaddr_storage *out, char **name)
{
    struct addr_parts p;
    char host[HOST_MAX + 1];
    uint16_t port;
    bool explicit;
    int rc = split_port(s, len, &p, &port, &explicit);
    if (rc)
        return rc;
    if (!explicit)
        port = default_port;
    memcpy(host, p.host, p.hlen);
    host[p.hlen] = '\0';
    return p.v6 ? parse_ip6(host, port, out) : parse_host(host, port, out, name);
}

int mw__parse_addr(const char *s, uint16_t default_port, struct sockaddr_storage *out)
{
    if (!s || !out)
        return -EINVAL;
    return parse_span(s, strlen(s), default_port, out, NULL);
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* The item of list @s at its start (blanks around it trimmed): its first
 * character and length; *@next is the item after it, NULL at the end. */
static const char *list_item(const char *s, size_t *len, const char **next)
{
    const char *end = s + strcspn(s, ",");
    const char *b = s, *e = end;
    while (b < e && is_blank(*b))
        b++;
    while (e > b && is_blank(e[-1]))
        e--;
    *len = (size_t)(e - b);
    *next = *end ? end + 1 : NULL;
    return b;
}

static size_t list_items(const char *s)
{
    size_t items = 1;
    for (const char *c = s; *c; c++)
        items += *c == ',';
    return items;
}

/* The port of each of the @n items of @s, by the list rule: its own, else
 * the next one written after it, else @default_port.  No resolution. */
static int list_ports(const char *s, size_t n, uint16_t default_port, uint16_t *ports, bool *v6)
{
    bool *explicit = mw__calloc(n, sizeof *explicit);
    if (!explicit)
        return -ENOMEM;
    int rc = 0;
    const char *item = s;
    *v6 = false;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t len;
        struct addr_parts p;
        const char *b = list_item(item, &len, &item);
        rc = split_port(b, len, &p, &ports[i], &explicit[i]);
        *v6 |= p.v6;
    }
    uint16_t next = default_port;
    for (size_t i = n; i-- > 0 && !rc;) {
        if (explicit[i])
            next = ports[i];
        else
            ports[i] = next;
    }
    mw__free(explicit);
    return rc;
}

static void names_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        mw__free(names[i]);
    mw__free(names);
}

/* mw__parse_addr_list(), names looked up now (@names NULL) or handed back. */
static int parse_list(const char *s, uint16_t default_port, struct sockaddr_storage **out,
                      size_t *n, char ***names)
{
    if (!out || !n)
        return -EINVAL;
    *out = NULL;
    *n = 0;
    if (!s)
        return -EINVAL;
    size_t items = list_items(s);
    struct sockaddr_storage *v = mw__calloc(items, sizeof(*v));
    uint16_t *ports = mw__calloc(items, sizeof(*ports));
    char **nv = names ? mw__calloc(items, sizeof *nv) : NULL;
    bool v6;
    int rc = v && ports && (nv || !names) ? list_ports(s, items, default_port, ports, &v6)
                                          : -ENOMEM;
    const char *item = s;
    for (size_t i = 0; i < items && !rc; i++) {
        size_t len;
        const char *b = list_item(item, &len, &item);
        rc = parse_span(b, len, ports[i], &v[i], nv ? &nv[i] : NULL);
    }
    mw__free(ports);
    if (rc) {
        mw__free(v);
        names_free(nv, items);
        return rc;
    }
    *out = v;
    *n = items;
    if (names)
        *names = nv;
    return 0;
}

int mw__parse_addr_list(const char *s, uint16_t default_port,
                        struct sockaddr_storage **out, size_t *n)
{
    return parse_list(s, default_port, out, n, NULL);
}

int mw__parse_addr_list_names(const char *s, uint16_t default_port,
                              struct sockaddr_storage **out, size_t *n, char ***names)
{
    return names ? parse_list(s, default_port, out, n, names) : -EINVAL;
}

int mw__addr_list_port(const char *s, uint16_t default_port, uint16_t *port, bool *v6)
{
    if (!s || !port || !v6)
        return -EINVAL;
    size_t items = list_items(s);
    uint16_t *ports = mw__calloc(items, sizeof(*ports));
    int rc = ports ? list_ports(s, items, default_port, ports, v6) : -ENOMEM;
    for (size_t i = 1; i < items && !rc; i++)
        if (ports[i] != ports[0])
            rc = -EINVAL;         /* two ports in one entry */
    if (!rc)
        *port = ports[0];
    mw__free(ports);
    return rc;
}

/* ------------------------------------------------------------------------
 * Printing
 * ------------------------------------------------------------------------ */

static void scope_str(uint32_t scope, char *buf, size_t cap)
{
    char name[IF_NAMESIZE];
    if (scope == 0)
        buf[0] = '\0';
    else if (if_indextoname(scope, name))
        snprintf(buf, cap, "%%%s", name);
    else
        snprintf(buf, cap, "%%%u", scope);
}

const char *mw__addr_str(const struct sockaddr *sa, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN], scope[IF_NAMESIZE + 12];
    if (!buf || cap == 0)
        return buf;
    if (!sa) {
        snprintf(buf, cap, "(none)");
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(buf, cap, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        scope_str(s6->sin6_scope_id, scope, sizeof(scope));
        snprintf(buf, cap, "[%s%s]:%u", ip, scope, (unsigned)ntohs(s6->sin6_port));
    } else {
        snprintf(buf, cap, "(family %d)", (int)sa->sa_family);
    }
    return buf;
}
