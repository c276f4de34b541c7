/* log.h - llmd's log: one line to stderr per message, with a syslog
 * priority prefix ("<3>") where journald reads stderr, "llmd: " where a
 * person does.  Daemon code only: the libraries below (libipc, kernels, the
 * engine) never log; they return codes and fill error buffers.  Any thread.
 */
#ifndef LLMD_LOG_H
#define LLMD_LOG_H

/* Decides the prefix from the environment (JOURNAL_STREAM: journald reads
 * stderr).  Call once at start-up, before the threads. */
void log_init(void);

/* Logs one line at syslog priority PRIO (LOG_ERR, LOG_INFO, ...). */
void log_msg(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The prefix a line at PRIO carries ("<2>" or "llmd: "), for messages built
 * ahead of time, like one a signal handler writes. */
const char *log_prefix(int prio);

#endif
