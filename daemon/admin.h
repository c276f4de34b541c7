/* admin.h - admin commands (llmctl): a table of { name, handler }, with the
 * permission each needs, answered as JSON documents at once.  Commands that
 * report the engine's state read the worker's last published snapshot, so
 * no answer waits for an engine step.  Event-loop thread.
 */
#ifndef LLMD_ADMIN_H
#define LLMD_ADMIN_H

#include <stddef.h>

#include "llmd.h"
#include "proto.h"

struct conn;

/* Runs the command in A for C at once and returns its ADMIN_REPLY's code (0,
 * or an enum proto_err), with the body in *RET_BODY: the JSON answer, or
 * the error's text; malloc'd, NULL when out of memory.  The server sends
 * it: calls go one way, server -> admin. */
uint32_t admin_run(struct llmd *d, struct conn *c, const struct proto_admin *a, char **ret_body);

/* Re-reads the config file (and the command-line overrides) and applies
 * what can change while running: limits, the admin group, the grace period.
 * Settings that need a restart are named in MSG.  0 or a negative errno
 * (the old settings stay) with the reason in MSG. */
int admin_reload(struct llmd *d, char *msg, size_t msglen);

/* Looks up cfg.admin_group's gid (no such group: only root and llmd's own
 * user are admins). */
void admin_resolve_group(struct llmd *d);

/* Whether UID/GID (and the user's groups) may run admin commands. */
int admin_allowed(const struct llmd *d, uid_t uid, gid_t gid);

#endif
