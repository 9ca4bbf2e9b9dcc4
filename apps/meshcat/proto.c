/* meshcat's control messages: building, sending and checking them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

static void free_copy(mw_future_t *f, void *arg)
{
    (void)f;
    free(arg);
}

void mc_send(mw_conn_t *c, const struct mc_msg *m)
{
    struct mc_msg *copy = malloc(sizeof *copy);
    if (!copy) {
        mw_conn_abort(c);         /* a lost control message would hang the peer */
        return;
    }
    *copy = *m;
    copy->magic = MC_MAGIC;
    copy->version = MC_PROTO_VERSION;
    mw_future_t *f = mw_send(c, copy, sizeof *copy);
    if (!f || mw_future_then(f, free_copy, copy) < 0)
        free(copy);
    mw_future_unref(f);
}

void mc_send_simple(mw_conn_t *c, enum mc_type type, uint64_t a, uint64_t b, const char *text)
{
    struct mc_msg m = {.type = type, .a = a, .b = b};
    if (text)
        snprintf(m.text, sizeof m.text, "%s", text);
    mc_send(c, &m);
}

const struct mc_msg *mc_msg_check(const mw_msg_t *m, const char **why)
{
    const struct mc_msg *x = m->data;
    if (m->len != sizeof *x || x->magic != MC_MAGIC)
        *why = "not a meshcat peer (bad message)";
    else if (x->version != MC_PROTO_VERSION)
        *why = "peer speaks another meshcat protocol version";
    else if (x->type < MC_HELLO || x->type >= MC_TYPE_END)
        *why = "unknown message type";
    else if (!memchr(x->text, 0, sizeof x->text))
        *why = "unterminated text in message";
    else
        return x;
    return NULL;
}

const char *mc_type_name(int type)
{
    static const char *const names[] = {"?", "HELLO", "READY", "FILE", "FILE_OK", "END",
                                        "DONE", "CREDIT", "BYE", "ERROR"};
    return type > 0 && type < MC_TYPE_END ? names[type] : "?";
}
