/* log.c - llmd's log lines on stderr (see log.h).  It is not a logging
 * framework: no levels to filter, no files; journald or the terminal
 * decides what to keep.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int log_prefixed; /* journald reads stderr: "<N>" priority prefixes */

void log_init(void)
{
	log_prefixed = getenv("JOURNAL_STREAM") != NULL;
}

const char *log_prefix(int prio)
{
	static const char *const pri[8] = { "<0>", "<1>", "<2>", "<3>", "<4>", "<5>", "<6>", "<7>" };
	return log_prefixed ? pri[prio & 7] : "llmd: ";
}

void log_msg(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s%s\n", log_prefix(prio), line);
}
