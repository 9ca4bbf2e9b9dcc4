/* Big-endian stores and loads by shifts: independent of host byte order and
 * of the buffer's alignment.  Every format meshwire puts on a wire or in a
 * store (the handshake, fragment headers, the same-host channel's records,
 * the directory's region tables) is written field by field with these.
 * Internal (mw__ names); nothing but <stdint.h>. */
#ifndef MW_CORE_BYTES_H
#define MW_CORE_BYTES_H

#include <stdint.h>

static inline void mw__put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void mw__put32(uint8_t *p, uint32_t v)
{
    mw__put16(p, (uint16_t)(v >> 16));
    mw__put16(p + 2, (uint16_t)v);
}

static inline void mw__put64(uint8_t *p, uint64_t v)
{
    mw__put32(p, (uint32_t)(v >> 32));
    mw__put32(p + 4, (uint32_t)v);
}

static inline uint16_t mw__get16(const uint8_t *p)
{
    return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static inline uint32_t mw__get32(const uint8_t *p)
{
    return (uint32_t)mw__get16(p) << 16 | mw__get16(p + 2);
}

static inline uint64_t mw__get64(const uint8_t *p)
{
    return (uint64_t)mw__get32(p) << 32 | mw__get32(p + 4);
}

#endif
