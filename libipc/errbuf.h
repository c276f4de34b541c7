/* errbuf.h - private to libipc: fill a caller's error buffer (which may be
 * NULL) printf-style.  libipc never logs; its callers decide. */
#ifndef LLMD_ERRBUF_H
#define LLMD_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static inline void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

#endif
