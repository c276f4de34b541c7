/* http.h - the OpenAI-compatible HTTP front (libevent's evhttp) on the
 * daemon's event loop: POST /v1/chat/completions and /v1/completions (JSON
 * or server-sent events), GET /v1/models, /health and /metrics, POST
 * /tokenize and /detokenize.  Each generating request is a connection of
 * its own in the daemon's table (struct conn with http set), with an
 * in-process ring the engine thread writes as it writes a libllm client's,
 * so the limits, priorities, scheduling and accounting are the native
 * protocol's: requests are checked and posted by server_make_request and
 * server_post_request.  Event-loop thread.
 */
#ifndef LLMD_HTTP_H
#define LLMD_HTTP_H

#include <stddef.h>

#include "llmd.h"

/* Starts serving on the Unix socket FD (listening, non-blocking; -1 for
 * none; llmd keeps its path in d->http_socket_path to unlink), which it
 * owns from now on, even on failure, and on TCP where [http] listen asks
 * (with the keys of [http] keys_file).  0 or a negative errno with a
 * message; http_stop cleans up either way. */
int http_start(struct llmd *d, int fd, char *err, size_t errlen);

/* Stops taking connections (the socket file is removed); requests in
 * flight go on.  Safe when http_start never ran. */
void http_stop_listening(struct llmd *d);

/* Stops listening (the socket file is removed) and ends every HTTP request:
 * their engine requests are cancelled, their clients disconnected.  Safe
 * when http_start never ran. */
void http_stop(struct llmd *d);

/* The Unix socket path [http] socket asks for: "" for none ("off" or ""),
 * "auto" for the native socket's path with "-http" before its ".sock"
 * (/run/llmd/llmd-http.sock), else the path given.  Writes at most LEN. */
void http_socket_path(const struct llmd_conf *cfg, char *out, size_t len);

#endif
