/* libFuzzer target: the directory's decoders (src/dir/entry.c), which read
 * what a store holds (an entry anyone with write access to the store may
 * have put there) and what a serving peer sends first on a connection (its
 * region table).  Each accepted input must satisfy the decoder's promises,
 * and encoding what was decoded must decode to the same. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cm/nic.h"
#include "dir/entry.h"

/* entry.c's and nic.c's allocator (addresses are checked by nic.c's
 * list rule), without the rest of meshwire */
void *mw__malloc(size_t size) { return malloc(size); }
void *mw__calloc(size_t n, size_t size) { return calloc(n, size); }
void *mw__realloc(void *p, size_t size) { return realloc(p, size); }
void mw__free(void *p) { free(p); }

static void check_entry(const uint8_t *data, size_t len)
{
    struct mw__dir_entry *e;
    const char *why = "unset";
    if (mw__dir_entry_decode("job/role/0", (const char *)data, len, &e, &why) != 0) {
        assert(why && *why);
        return;
    }
    const mw_dir_entry_t *p = &e->pub;
    assert(p->addrs && *p->addrs && strlen(p->addrs) <= MW__DIR_ADDRS_MAX && !strchr(p->addrs, ' '));
    uint16_t port = 0;            /* one port, as mw_connect will read it */
    bool v6;
    assert(mw__addr_list_port(p->addrs, 0, &port, &v6) == 0 && port);
    assert(p->tag && strlen(p->tag) <= MW__DIR_TAG_MAX);
    assert(p->nregions <= MW__DIR_REGIONS_MAX);
    for (size_t i = 0; i < p->nregions; i++)
        assert(mw__dir_region_name_ok(p->regions[i].name));
    char buf[MW__DIR_VALUE_MAX + 1];
    int n = mw__dir_entry_encode(p, buf, sizeof buf);
    if (n > 0) {                  /* may not fit: fields at their limits */
        struct mw__dir_entry *e2;
        assert(mw__dir_entry_decode("job/role/0", buf, (size_t)n, &e2, &why) == 0);
        assert(!strcmp(e2->pub.addrs, p->addrs) && !strcmp(e2->pub.tag, p->tag));
        assert(e2->pub.instance == p->instance && e2->pub.nregions == p->nregions);
        free(e2);
    }
    free(e);
}

static void check_table(const uint8_t *data, size_t len)
{
    static char text[1 << 16];
    const char *names[MW__DIR_REGIONS_MAX], *why;
    mw_remote_t r[MW__DIR_REGIONS_MAX];
    size_t n;
    if (len > sizeof text || mw__dir_table_decode(data, len, text, names, r, &n, &why) != 0)
        return;
    assert(n <= MW__DIR_REGIONS_MAX);
    uint8_t again[MW__DIR_TABLE_MAX];
    int m = mw__dir_table_encode(names, r, n, again, sizeof again);
    assert(m == (int)len && !memcmp(again, data, len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len < 1)
        return 0;
    if (data[0] & 1)
        check_table(data + 1, len - 1);
    else
        check_entry(data + 1, len - 1);
    return 0;
}
