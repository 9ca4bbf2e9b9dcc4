/* Intrusive doubly linked lists (circular, with a head node). */
#ifndef MW_CORE_LIST_H
#define MW_CORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct mw__list {
    struct mw__list *prev, *next;
};

#define mw__container_of(p, type, member) \
    ((type *)((char *)(p) - offsetof(type, member)))

static inline void mw__list_init(struct mw__list *h) { h->prev = h->next = h; }
static inline bool mw__list_empty(const struct mw__list *h) { return h->next == h; }

static inline void mw__list_add_tail(struct mw__list *h, struct mw__list *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}

static inline void mw__list_del(struct mw__list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

#endif
