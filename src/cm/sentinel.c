/* One rdma_cm id bound to an address of each RDMA device, for one purpose:
 * the kernel tells ids bound to a device when it is being removed
 * (DEVICE_REMOVAL), and only those.  A process whose only use of a device
 * is a listener on every address ("*": the kernel's own per-device ids
 * hear nothing) and memory registered there would otherwise never learn
 * it, and the removal would wait for it for as long as it lives.  A
 * device without an IP address gets none. */
#include <errno.h>
#include <string.h>

#include <rdma/rdma_cma.h>

#include "cm/cm.h"
#include "cm/nic.h"
#include "core/alloc.h"

struct mw__sentinel {
    enum mw__cm_kind kind;        /* first: rdma_cm id context */
    struct rdma_cm_id *id;
    char dev[MW__NIC_DEVLEN];
    struct mw__sentinel *next;
};

static bool has_sentinel(const struct mw__cm *cm, const char *dev)
{
    for (const struct mw__sentinel *s = cm->sentinels; s; s = s->next)
        if (!strcmp(s->dev, dev))
            return true;
    return false;
}

/* An IPv4 address of @dev, else any of its addresses, or NULL. */
static const struct mw__nic *address_of(const struct mw__nic *nics, size_t n, const char *dev)
{
    const struct mw__nic *any = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(nics[i].dev, dev))
            continue;
        if (nics[i].addr.ss_family == AF_INET)
            return &nics[i];
        any = any ? any : &nics[i];
    }
    return any;
}

static void sentinel_add(mw_ctx_t *ctx, struct mw__cm *cm, const struct mw__nic *nic)
{
    struct mw__sentinel *s = mw__calloc(1, sizeof *s);
    if (!s)
        return;
    s->kind = MW__CM_SENTINEL;
    strcpy(s->dev, nic->dev);
    struct sockaddr_storage sa = nic->addr;   /* port 0: any */
    if (rdma_create_id(cm->ch, &s->id, s, RDMA_PS_UDP) < 0 ||
        rdma_bind_addr(s->id, (struct sockaddr *)&sa) < 0) {
        char a[MW__ADDR_STRLEN];
        MW_LOG(ctx, MW_LOG_DEBUG, "cannot watch RDMA device %s through %s: %s", nic->dev,
               mw__addr_str((struct sockaddr *)&sa, a, sizeof a), strerror(errno));
        if (s->id)
            rdma_destroy_id(s->id);
        mw__free(s);
        return;
    }
    s->next = cm->sentinels;
    cm->sentinels = s;
}

void mw__sentinels_refresh(mw_ctx_t *ctx, struct mw__cm *cm, const struct mw__nic *nics,
                           size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (has_sentinel(cm, nics[i].dev))
            continue;
        const struct mw__nic *nic = address_of(nics, n, nics[i].dev);
        if (nic)
            sentinel_add(ctx, cm, nic);
    }
}

void mw__sentinels_drop(mw_ctx_t *ctx, struct mw__cm *cm, const struct ibv_context *verbs)
{
    for (struct mw__sentinel **p = &cm->sentinels; *p;) {
        struct mw__sentinel *s = *p;
        if (verbs && s->id->verbs != verbs) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        s->id->context = NULL;
        mw__cm_destroy_id_later(ctx, s->id);   /* not from inside its event */
        mw__free(s);
    }
}
