/* tokenizer_decode.c - token ids back to bytes: one token's piece, and the
 * incremental detokenizer that never emits half a UTF-8 character.  Not
 * here: the pieces themselves, decoded once at load (tokenizer.c).
 */
#include "tokenizer.h"

#include <errno.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- pieces and incremental detokenization ---- */

static size_t piece_get(const struct tokenizer *t, int32_t id, int special,
			const char **ret)
{
	if (!t || id < 0 || id >= t->n_vocab)
		return 0;
	if (!special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)))
		return 0;
	*ret = t->piece_pool + t->piece_off[id];
	return t->piece_off[id + 1] - t->piece_off[id];
}

int tokenizer_piece(const struct tokenizer *t, int32_t id, int special,
		    char *buf, size_t cap)
{
	const char *p = NULL;
	size_t n = piece_get(t, id, special, &p);

	if (n && buf)
		memcpy(buf, p, n < cap ? n : cap);
	return (int)n;
}

struct sink {
	char *out;    /* caller's buffer */
	size_t cap;   /* its room */
	size_t n;     /* bytes written */
};

/* Whole characters only: one that does not fit is dropped. */
static void sink_put(struct sink *k, const uint8_t *p, size_t n)
{
	if (k->n + n > k->cap)
		return;
	memcpy(k->out + k->n, p, n);
	k->n += n;
}

int detok_push(const struct tokenizer *t, struct detok *d, int32_t id,
	       int special, char *out, size_t cap)
{
	const char *piece = NULL;
	size_t np, n, i = 0;
	struct sink k = { out, out ? cap : 0, 0 };
	uint8_t pend[4];

	if (!d)
		return -EINVAL;
	if (d->n_pending < 0 || d->n_pending > 3)
		d->n_pending = 0;
	np = (size_t)d->n_pending;
	memcpy(pend, d->pending, np);
	n = np + piece_get(t, id, special, &piece);
#define AT(j) ((j) < np ? pend[j] : (uint8_t)piece[(j) - np])
	while (i < n) {
		uint8_t c = AT(i), lo, hi, ch[4];
		int need;
		size_t j;

		if (c < 0x80) {
			sink_put(&k, &c, 1);
			i++;
			continue;
		}
		need = utf8_lead(c, &lo, &hi);
		if (!need) {
			sink_put(&k, (const uint8_t *)UTF8_FFFD, 3);
			i++;
			continue;
		}
		ch[0] = c;
		for (j = 1; j <= (size_t)need; j++) {
			if (i + j >= n) { /* incomplete: keep for the next token */
				d->n_pending = (int)(n - i);
				for (size_t q = 0; q < n - i; q++)
					d->pending[q] = AT(i + q);
				return (int)k.n;
			}
			uint8_t cc = AT(i + j);
			if (cc < (j == 1 ? lo : 0x80) || cc > (j == 1 ? hi : 0xbf))
				break;
			ch[j] = cc;
		}
		if (j > (size_t)need) {
			sink_put(&k, ch, j);
		} else { /* maximal invalid subpart -> one U+FFFD */
			sink_put(&k, (const uint8_t *)UTF8_FFFD, 3);
		}
		i += j;
	}
#undef AT
	d->n_pending = 0;
	return (int)k.n;
}

int detok_flush(struct detok *d, char *out, size_t cap)
{
	int had;

	if (!d)
		return -EINVAL;
	had = d->n_pending > 0;
	d->n_pending = 0;
	if (!had || !out || cap < 3)
		return 0;
	memcpy(out, UTF8_FFFD, 3);
	return 3;
}
