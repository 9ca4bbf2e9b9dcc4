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

/* mw__list_move_all() - append every entry of @from to @to, in order;
 * @from is left empty. */
static inline void mw__list_move_all(struct mw__list *to, struct mw__list *from)
{
    if (mw__list_empty(from))
        return;
    from->next->prev = to->prev;
    to->prev->next = from->next;
    from->prev->next = to;
    to->prev = from->prev;
    mw__list_init(from);
}

/* The first entry of @head (a struct with a struct mw__list @member), or
 * NULL when it is empty. */
#define mw__list_first(head, type, member) \
    (mw__list_empty(head) ? NULL : mw__container_of((head)->next, type, member))

/* for each entry @pos of @head, in order.  The loop body may unlink @pos
 * (the next one is read before it runs), but no other entry. */
#define mw__list_for_each(pos, head, member)                                         \
    for (struct mw__list *pos##_at_ = (head)->next, *pos##_next_ = pos##_at_->next;   \
         pos##_at_ != (head) &&                                                     \
         ((pos) = mw__container_of(pos##_at_, __typeof__(*(pos)), member), true);   \
         pos##_at_ = pos##_next_, pos##_next_ = pos##_at_->next)

#endif
