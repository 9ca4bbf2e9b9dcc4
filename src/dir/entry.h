/* A directory entry as stored (text, a field per line) and the region
 * table a serving peer sends first on each connection (binary, network
 * byte order).  Pure functions: encoders write what they are given,
 * decoders check every field and say why they refuse.  Internal. */
#ifndef MW_DIR_ENTRY_H
#define MW_DIR_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshwire.h"

#define MW__DIR_NAME_MAX 200
#define MW__DIR_VALUE_MAX 8192
#define MW__DIR_ADDRS_MAX 1024
#define MW__DIR_TAG_MAX 255
#define MW__DIR_REGION_NAME_MAX 63
#define MW__DIR_REGIONS_MAX 64

/* A decoded entry: one allocation, strings inside; free with mw__free
 * (or, where it is shared, when the last of @refs goes: decoding sets 1). */
struct mw__dir_entry {
    int refs;
    mw_dir_entry_t pub;
    mw_dir_region_info_t regions[MW__DIR_REGIONS_MAX];
    char text[];
};

/* mw__dir_name_ok() - @s is a valid name ("a/b/c"), or with @prefix a
 * valid beginning of one ("", "a/", "a/b", "a/b/"). */
bool mw__dir_name_ok(const char *s, bool prefix);
/* mw__dir_region_name_ok() - 1-63 of [A-Za-z0-9._-]. */
bool mw__dir_region_name_ok(const char *s);

/* mw__dir_entry_encode() - @e (name aside) as stored.
 * Return: the length, or -ENOSPC beyond @cap, -EINVAL for a field out of
 * its limits. */
int mw__dir_entry_encode(const mw_dir_entry_t *e, char *buf, size_t cap);
/* mw__dir_entry_decode() - the entry @name holding @val (@len bytes).
 * Return: 0 with *@out, -EPROTO with *@why, -ENOMEM. */
int mw__dir_entry_decode(const char *name, const char *val, size_t len,
                         struct mw__dir_entry **out, const char **why);

/* Region table: "MWDT", version 1, count, then per region: name length
 * (1 byte), name, addr (8), len (8), rkey (4). */
#define MW__DIR_TABLE_MAX (8 + MW__DIR_REGIONS_MAX * (1 + MW__DIR_REGION_NAME_MAX + 20))
int mw__dir_table_encode(const char *const *names, const mw_remote_t *r, size_t n,
                         uint8_t *buf, size_t cap);
/* Fills @names (pointers into @out_text, which holds at least @len bytes)
 * and @r, at most MW__DIR_REGIONS_MAX each. */
int mw__dir_table_decode(const uint8_t *buf, size_t len, char *out_text, const char **names,
                         mw_remote_t *r, size_t *n, const char **why);

#endif
