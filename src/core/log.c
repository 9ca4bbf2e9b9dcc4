/* Logging: a sink per context (stderr by default), threshold from MW_LOG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/ctx.h"

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int mw__log_level_from_env(int dflt)
{
    const char *v = getenv("MW_LOG");
    if (!v)
        return dflt;
    for (int i = 0; i <= MW_LOG_DEBUG; i++)
        if (!strcasecmp(v, level_names[i]))
            return i;
    return dflt;
}

void mw__vlog(const mw_ctx_t *ctx, int level, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (ctx && ctx->opts.log_fn) {
        ctx->opts.log_fn(level, msg, ctx->opts.log_arg);
        return;
    }
    if (level < 0 || level > MW_LOG_DEBUG)
        level = MW_LOG_ERROR;
    fprintf(stderr, "meshwire %s: %s\n", level_names[level], msg);
}

void mw__log(const mw_ctx_t *ctx, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mw__vlog(ctx, level, fmt, ap);
    va_end(ap);
}
