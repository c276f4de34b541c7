/* stopstr.h - stop strings over a stream of generated text.
 *
 * The engine feeds each detokenized piece in; the matcher says how many bytes
 * may be emitted now, holds back a tail that could still be the start of a
 * stop string, and reports a match (the stop string itself is not emitted).
 * One per sequence; engine thread only.
 */
#ifndef LLMD_STOPSTR_H
#define LLMD_STOPSTR_H

#include <stddef.h>

#define STOPSTR_MAX 16       /* stop strings per request (the protocol's PROTO_MAX_STOPS) */
#define STOPSTR_MAX_LEN 256  /* bytes per stop string */

struct stopstr;

/* Copies the N strings (each 1..STOPSTR_MAX_LEN bytes).  -EINVAL if there are
 * too many or one is empty or too long, -ENOMEM. */
int stopstr_new(const char *const *stops, int n, struct stopstr **ret);
void stopstr_free(struct stopstr *s); /* NULL-safe */

/* Feeds LEN bytes.  Text that is now safe to emit is written to OUT (CAP must
 * be >= LEN + STOPSTR_MAX_LEN) and its length stored in *ret_out.  Returns 1
 * if a stop string matched (OUT then ends just before it, and everything
 * after is dropped), else 0. */
int stopstr_feed(struct stopstr *s, const char *text, size_t len,
		 char *out, size_t cap, size_t *ret_out);

/* At the end of generation: the held-back tail (never part of a match). */
size_t stopstr_flush(struct stopstr *s, char *out, size_t cap);

#endif
