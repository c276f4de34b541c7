/* errbuf.h - fill a caller's error buffer (which may be NULL) printf-style.
 * For libipc and the engine, which never log: their callers decide. */
#ifndef LLMD_ERRBUF_H
#define LLMD_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void errbuf_setv(char *err, size_t errlen, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));
static inline void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline int errbuf_fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* errbuf_set with the arguments as a va_list (for a caller's own wrapper). */
static inline void errbuf_setv(char *err, size_t errlen, const char *fmt, va_list ap)
{
	if (!err || !errlen)
		return;
	vsnprintf(err, errlen, fmt, ap);
}

static inline void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* errbuf_set, then returns CODE: `return errbuf_fail(err, errlen, -EINVAL, ...);` */
static inline int errbuf_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	errbuf_setv(err, errlen, fmt, ap);
	va_end(ap);
	return code;
}

#endif
