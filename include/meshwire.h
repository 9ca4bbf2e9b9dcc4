/*
 * meshwire: an event-driven, asynchronous RDMA transport.
 *
 * Every function returns 0 or a negative errno unless its comment says
 * otherwise; mw_strerror() names the error.  Unless stated, functions are to
 * be called from the thread that runs the context's event loop.
 */
#ifndef MESHWIRE_H
#define MESHWIRE_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MW_BUILDING)
#define MW_EXTERN __attribute__((visibility("default")))
#else
#define MW_EXTERN
#endif

/**
 * mw_version() - the library version, "MAJOR.MINOR.PATCH".
 * Thread-safe; the string is static.
 */
MW_EXTERN const char *mw_version(void);

/**
 * mw_strerror() - describe an error returned by meshwire.
 * @err: a negative errno (a positive one is accepted too).
 * Return: a static string. Thread-safe.
 */
MW_EXTERN const char *mw_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* MESHWIRE_H */
