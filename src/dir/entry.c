/* Directory entries and region tables: encoding and strict decoding. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/bytes.h"
#include "cm/nic.h"
#include "dir/entry.h"

#define ENTRY_MAGIC "mw-dir 1"

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

bool mw__dir_name_ok(const char *s, bool prefix)
{
    if (!s)
        return false;
    size_t n = strlen(s);
    if (n > MW__DIR_NAME_MAX || (!prefix && !n))
        return false;
    size_t seg = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '/') {
            if (!seg)
                return false;
            seg = 0;
        } else if (!name_char(s[i])) {
            return false;
        } else {
            seg++;
        }
    }
    return seg || prefix;     /* a name ends in a segment; a prefix may end in '/' */
}

bool mw__dir_region_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (!n || n > MW__DIR_REGION_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i]))
            return false;
    return true;
}

static bool printable(const char *s, size_t max)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return false;
    return n <= max;
}

/* Addresses a reader can connect to: printable, no blanks, and one port
 * (not 0) that every address is on, by mw_connect's list rule ("A,B:P").
 * Checked at both ends: a malformed entry fails its publisher, and one
 * written to the store by anybody else fails lookup, list and watch, not a
 * later connect. */
static bool addrs_ok(const char *s)
{
    uint16_t port = 0;
    bool v6;
    return s && *s && printable(s, MW__DIR_ADDRS_MAX) && !strchr(s, ' ') &&
           mw__addr_list_port(s, 0, &port, &v6) == 0 && port != 0;
}

int mw__dir_entry_encode(const mw_dir_entry_t *e, char *buf, size_t cap)
{
    const char *tag = e->tag ? e->tag : "";
    if (!addrs_ok(e->addrs) || !printable(tag, MW__DIR_TAG_MAX) ||
        e->nregions > MW__DIR_REGIONS_MAX)
        return -EINVAL;
    int len = snprintf(buf, cap, ENTRY_MAGIC "\naddrs %s\ninstance %016" PRIx64 "\n", e->addrs,
                       e->instance);
    for (size_t i = 0; len >= 0 && (size_t)len < cap && i < e->nregions; i++) {
        if (!mw__dir_region_name_ok(e->regions[i].name))
            return -EINVAL;
        len += snprintf(buf + len, cap - len, "region %s %" PRIu64 "\n", e->regions[i].name,
                        e->regions[i].len);
    }
    if (len >= 0 && (size_t)len < cap && e->serves)
        len += snprintf(buf + len, cap - len, "serves 1\n");
    if (len >= 0 && (size_t)len < cap && *tag)
        len += snprintf(buf + len, cap - len, "tag %s\n", tag);
    return len < 0 || (size_t)len >= cap || len > MW__DIR_VALUE_MAX ? -ENOSPC : len;
}

enum { SEEN_INSTANCE = 1, SEEN_TAG = 2, SEEN_SERVES = 4 };

/* One "key value" line of @t (NUL-terminated lines, split in place);
 * @seen: the single-valued fields met so far, none of them twice. */
static int field(struct mw__dir_entry *d, char *line, unsigned *seen, const char **why)
{
    char *sp = strchr(line, ' ');
    if (!sp) {
        *why = "a line without a value";
        return -EPROTO;
    }
    *sp = 0;
    char *v = sp + 1, *end;
    mw_dir_entry_t *e = &d->pub;
    if (!strcmp(line, "addrs") && !e->addrs && addrs_ok(v)) {
        e->addrs = v;
    } else if (!strcmp(line, "instance") && !(*seen & SEEN_INSTANCE) && strlen(v) == 16 &&
               strspn(v, "0123456789abcdef") == 16) {
        e->instance = strtoull(v, NULL, 16);
        *seen |= SEEN_INSTANCE;
    } else if (!strcmp(line, "tag") && !(*seen & SEEN_TAG) && strlen(v) <= MW__DIR_TAG_MAX) {
        e->tag = v;
        *seen |= SEEN_TAG;
    } else if (!strcmp(line, "serves") && !(*seen & SEEN_SERVES) && !strcmp(v, "1")) {
        e->serves = 1;
        *seen |= SEEN_SERVES;
    } else if (!strcmp(line, "region") && e->nregions < MW__DIR_REGIONS_MAX) {
        char *sp2 = strchr(v, ' ');
        if (!sp2)
            return *why = "a region without a size", -EPROTO;
        *sp2 = 0;
        errno = 0;
        unsigned long long n = strtoull(sp2 + 1, &end, 10);
        if (!mw__dir_region_name_ok(v) || *end || errno || !sp2[1] || sp2[1] == '-')
            return *why = "a malformed region", -EPROTO;
        d->regions[e->nregions++] = (mw_dir_region_info_t){v, n};
    } else {
        *why = "an unknown, repeated or malformed field";
        return -EPROTO;
    }
    return 0;
}

int mw__dir_entry_decode(const char *name, const char *val, size_t len,
                         struct mw__dir_entry **out, const char **why)
{
    *why = NULL;
    if (len > MW__DIR_VALUE_MAX)
        return *why = "entry too large", -EPROTO;
    if (memchr(val, 0, len))
        return *why = "a NUL byte in the entry", -EPROTO;
    size_t nl = strlen(name);
    struct mw__dir_entry *d = mw__calloc(1, sizeof *d + nl + 1 + len + 1);
    if (!d)
        return -ENOMEM;
    char *nm = d->text, *t = d->text + nl + 1;
    memcpy(nm, name, nl + 1);
    memcpy(t, val, len);
    d->refs = 1;
    d->pub.name = nm;
    d->pub.regions = d->regions;
    d->pub.tag = "";
    size_t ml = strlen(ENTRY_MAGIC);
    int rc = 0;
    if (len <= ml || memcmp(t, ENTRY_MAGIC "\n", ml + 1)) {
        *why = "not a meshwire entry (or of another version)";
        rc = -EPROTO;
    }
    unsigned seen = 0;
    for (char *line = t + ml + 1; !rc && *line;) {
        char *nl2 = strchr(line, '\n');
        if (!nl2) {
            *why = "an unterminated line";
            rc = -EPROTO;
            break;
        }
        *nl2 = 0;
        for (char *c = line; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
                rc = -EPROTO, *why = "a control character in the entry";
        if (!rc)
            rc = field(d, line, &seen, why);
        line = nl2 + 1;
    }
    if (!rc && (!d->pub.addrs || !(seen & SEEN_INSTANCE))) {
        *why = "an entry without addrs or instance";
        rc = -EPROTO;
    }
    if (rc) {
        mw__free(d);
        return rc;
    }
    *out = d;
    return 0;
}

int mw__dir_table_encode(const char *const *names, const mw_remote_t *r, size_t n,
                         uint8_t *buf, size_t cap)
{
    if (n > MW__DIR_REGIONS_MAX || cap < 8)
        return -EINVAL;
    memcpy(buf, "MWDT", 4);
    buf[4] = 1;
    buf[5] = (uint8_t)n;
    buf[6] = buf[7] = 0;
    size_t off = 8;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(names[i]);
        if (nl > MW__DIR_REGION_NAME_MAX || off + 1 + nl + 20 > cap)
            return -ENOSPC;
        buf[off++] = (uint8_t)nl;
        memcpy(buf + off, names[i], nl);
        off += nl;
        mw__put64(buf + off, r[i].addr);
        mw__put64(buf + off + 8, r[i].len);
        mw__put32(buf + off + 16, r[i].rkey);
        off += 20;
    }
    return (int)off;
}

int mw__dir_table_decode(const uint8_t *buf, size_t len, char *text, const char **names,
                         mw_remote_t *r, size_t *n, const char **why)
{
    *why = "not a region table";
    if (len < 8 || memcmp(buf, "MWDT", 4) || buf[4] != 1 || buf[6] || buf[7])
        return -EPROTO;
    size_t cnt = buf[5], off = 8;
    if (cnt > MW__DIR_REGIONS_MAX)
        return *why = "too many regions", -EPROTO;
    for (size_t i = 0; i < cnt; i++) {
        size_t nl = off < len ? buf[off] : 0;
        if (off >= len || off + 1 + nl + 20 > len)
            return *why = "a truncated region table", -EPROTO;
        memcpy(text, buf + off + 1, nl);
        text[nl] = 0;
        if (strlen(text) != nl || !mw__dir_region_name_ok(text))
            return *why = "a malformed region name", -EPROTO;
        names[i] = text;
        text += nl + 1;
        off += 1 + nl;
        r[i] = (mw_remote_t){mw__get64(buf + off), mw__get64(buf + off + 8),
                             mw__get32(buf + off + 16)};
        off += 20;
    }
    if (off != len)
        return *why = "bytes after the region table", -EPROTO;
    *n = cnt;
    *why = NULL;
    return 0;
}
