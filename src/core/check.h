/* Internal rules checked in code.  A broken one is a meshwire bug: debug
 * builds (NDEBUG unset, meson's default) stop at it; release builds log it
 * and go on (library code never aborts a release build, convention 9). */
#ifndef MW_CORE_CHECK_H
#define MW_CORE_CHECK_H

#include "core/ctx.h"

#ifdef NDEBUG
#define MW__CHECK(ctx, cond)                                                          \
    ((cond) ? (void)0                                                                 \
            : mw__log((ctx), MW_LOG_ERROR, "internal error: %s does not hold (%s:%d)", \
                      #cond, __FILE__, __LINE__))
#else
#include <assert.h>
#define MW__CHECK(ctx, cond) ((void)(ctx), assert(cond))
#endif

#endif
