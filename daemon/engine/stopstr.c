/* stopstr.c - finds stop strings in streamed text without ever emitting a
 * byte of one: the longest tail that could still grow into a stop string is
 * held back until the next piece decides it.
 * Byte-oriented: it neither knows nor repairs UTF-8 boundaries or tokens.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "stopstr.h"

struct stopstr {
	int n;                          /* stop strings, 0..STOPSTR_MAX */
	char *stops[STOPSTR_MAX];       /* owned copies, not NUL-terminated */
	size_t lens[STOPSTR_MAX];       /* bytes of each, 1..STOPSTR_MAX_LEN */
	char held[STOPSTR_MAX_LEN];     /* a proper prefix of some stop string */
	size_t n_held;                  /* bytes in held, < the longest stop */
	int matched;                    /* a stop string was seen: emit nothing more */
};

int stopstr_new(const char *const *stops, int n, struct stopstr **ret)
{
	if (!ret || n < 0 || n > STOPSTR_MAX || (n > 0 && !stops))
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (!stops[i])
			return -EINVAL;
		size_t len = strnlen(stops[i], STOPSTR_MAX_LEN + 1);
		if (len == 0 || len > STOPSTR_MAX_LEN)
			return -EINVAL;
	}
	struct stopstr *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		s->lens[i] = strlen(stops[i]);
		s->stops[i] = malloc(s->lens[i]);
		if (!s->stops[i]) {
			stopstr_free(s);
			return -ENOMEM;
		}
		memcpy(s->stops[i], stops[i], s->lens[i]);
		s->n = i + 1;
	}
	*ret = s;
	return 0;
}

void stopstr_free(struct stopstr *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n; i++)
		free(s->stops[i]);
	free(s);
}

/* Length of the longest suffix of BUF[0..len) that is a proper prefix of
 * some stop string: those bytes may still turn into a match. */
static size_t partial_tail(const struct stopstr *s, const char *buf, size_t len)
{
	size_t best = 0;
	for (int i = 0; i < s->n; i++) {
		size_t h = s->lens[i] - 1 < len ? s->lens[i] - 1 : len;
		for (; h > best; h--)
			if (buf[len - h] == s->stops[i][0] &&
			    memcmp(buf + len - h, s->stops[i], h) == 0)
				break;
		if (h > best)
			best = h;
	}
	return best;
}

int stopstr_feed(struct stopstr *s, const char *text, size_t len,
		 char *out, size_t cap, size_t *ret_out)
{
	if (!s || (!text && len) || !out || !ret_out)
		return -EINVAL;
	if (s->matched) {
		*ret_out = 0;
		return 1;
	}
	if (cap < s->n_held || cap - s->n_held < len)
		return -EINVAL;

	/* work on held + text, assembled in OUT itself */
	size_t n = s->n_held + len;
	memcpy(out, s->held, s->n_held);
	if (len)
		memcpy(out + s->n_held, text, len);

	/* the earliest match wins; a match cannot lie inside held alone, or
	 * the previous call would have found it */
	size_t first = n;
	for (int i = 0; i < s->n; i++) {
		const char *hit = memmem(out, n, s->stops[i], s->lens[i]);
		if (hit && (size_t)(hit - out) < first)
			first = (size_t)(hit - out);
	}
	if (first < n) {
		s->matched = 1;
		s->n_held = 0;
		*ret_out = first;
		return 1;
	}

	size_t keep = partial_tail(s, out, n);
	memcpy(s->held, out + n - keep, keep);
	s->n_held = keep;
	*ret_out = n - keep;
	return 0;
}

size_t stopstr_flush(struct stopstr *s, char *out, size_t cap)
{
	if (!s || !out)
		return 0;
	size_t n = s->n_held < cap ? s->n_held : cap;
	memcpy(out, s->held, n);
	s->n_held = 0;
	return n;
}
