/* The allocator of meshwire's own bookkeeping (not the registered memory of
 * mw_alloc): the C library's, or what mw_replace_allocator() named.  Every
 * allocation in src/ goes through these, so a test can fail any one of them. */
#ifndef MW_CORE_ALLOC_H
#define MW_CORE_ALLOC_H

#include <stddef.h>

void *mw__malloc(size_t size);
void *mw__calloc(size_t n, size_t size);
void *mw__realloc(void *p, size_t size);
/* A copy of @s (mw__free it), or NULL. */
char *mw__strdup(const char *s);
/* A block kept for the life of the process (never freed): it does not
 * count as held, so the allocator stays replaceable. */
void *mw__calloc_forever(size_t n, size_t size);
/* Keeps errno: error paths free before they return what failed. */
void mw__free(void *p);

#endif
