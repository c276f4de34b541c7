/* tokenizer_encode.c - text to token ids: special tokens cut out first, then
 * SentencePiece merges by score ("llama") or the pre-tokenizer regex passes
 * and ranked byte-level BPE merges ("gpt2").  Not here: building the
 * vocabulary (tokenizer.c), ids back to text (tokenizer_decode.c).
 */
#include "tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- UTF-8 ---- */

/* llama.cpp's character length from the lead byte's high nibble: no
 * validation, so symbols of invalid text are still contiguous spans. */
static size_t utf8_len_lead(uint8_t c)
{
	static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1,
					 1, 1, 1, 1, 2, 2, 3, 4 };
	return len[c >> 4];
}

/* ---- encoding: shared machinery ---- */

struct emitter {
	int32_t *out; /* caller's buffer */
	int cap;      /* its room */
	int n;        /* ids produced, may exceed cap */
};

static inline void emit(struct emitter *em, int32_t id)
{
	if (em->n < em->cap)
		em->out[em->n] = id;
	if (em->n < INT_MAX)
		em->n++;
}

/* A symbol of a merge session: a span of the text being merged. */
struct symbol {
	int32_t prev, next; /* neighbours in the chain, -1 at the ends */
	uint32_t start;     /* byte offset of the span */
	uint32_t n;         /* bytes; 0 once merged into its left neighbour */
	int32_t id;         /* text id of the span, -1 if it has none */
};

/* A candidate merge of two adjacent symbols. */
struct bigram {
	double prio;        /* higher first: SPM score, BPE -rank */
	int32_t left;       /* symbol indices */
	int32_t right;
	int32_t a, b;       /* SPM: a = merged bytes; BPE: expected ids */
	int32_t res;        /* id of the merged text */
};

struct span {
	uint32_t start, len; /* bytes */
};

/* A piece of the input after special-token matching. */
struct frag {
	int32_t id;          /* special token, or -1 for raw text */
	uint32_t start, len; /* raw text bytes */
};

/* Per-call buffers (a tokenizer is shared between threads); each *_cap
 * counts the elements allocated. */
struct scratch {
	struct symbol *sym;    /* (sym_cap) the merge session's symbols */
	size_t sym_cap;
	struct bigram *heap;   /* (heap_cap) candidate merges, a binary heap */
	size_t heap_n;         /* candidates queued */
	size_t heap_cap;
	struct span *pc[2];    /* pre-token spans, double-buffered */
	size_t pc_cap[2];
	struct frag *fr[2];    /* fragments, double-buffered */
	size_t fr_cap[2];
	char *buf;             /* escaped (SPM) or sanitized (BPE) text */
	size_t buf_cap;
	char *wbuf;            /* a byte-encoded pre-token (ignore_merges) */
	size_t wbuf_cap;
	pcre2_match_data *md;  /* one ovector pair, for every regex */
};

static void scratch_free(struct scratch *s)
{
	free(s->sym);
	free(s->heap);
	free(s->pc[0]);
	free(s->pc[1]);
	free(s->fr[0]);
	free(s->fr[1]);
	free(s->buf);
	free(s->wbuf);
	pcre2_match_data_free(s->md);
}

static inline int bigram_before(const struct bigram *x, const struct bigram *y)
{
	return x->prio > y->prio || (x->prio == y->prio && x->left < y->left);
}

static int heap_push(struct scratch *s, const struct bigram *bg)
{
	size_t i;

	if (grow(&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap))
		return -ENOMEM;
	i = s->heap_n++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bigram_before(bg, &s->heap[p]))
			break;
		s->heap[i] = s->heap[p];
		i = p;
	}
	s->heap[i] = *bg;
	return 0;
}

static void heap_pop(struct scratch *s, struct bigram *ret)
{
	struct bigram last;
	size_t i = 0, n;

	*ret = s->heap[0];
	last = s->heap[--s->heap_n];
	n = s->heap_n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && bigram_before(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!bigram_before(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (n)
		s->heap[i] = last;
}

/* Splits TEXT around special-token texts the way llama.cpp's
 * tokenizer_st_partition does: each special token in turn (longest first)
 * is cut out of every raw fragment that contains it.  CONTROL and UNKNOWN
 * tokens only match with PARSE_SPECIAL; USER_DEFINED ones always do. */
static int partition(const struct tokenizer *t, struct scratch *s,
		     const char *text, size_t len, int parse_special, size_t *ret_n)
{
	size_t n = 1;
	int cur = 0;

	if (grow(&s->fr[0], &s->fr_cap[0], 1, sizeof(struct frag)))
		return -ENOMEM;
	s->fr[0][0] = (struct frag){ -1, 0, (uint32_t)len };
	for (int k = 0; k < t->n_special; k++) {
		int32_t id = t->special[k];
		const char *st = text_of(t, id);
		size_t sl = t->text_len[id];
		size_t m = 0;
		int hit = 0;

		if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)))
			continue;
		if (sl > len)
			continue;
		for (size_t i = 0; i < n && !hit; i++) {
			const struct frag *fr = &s->fr[cur][i];
			hit = fr->id < 0 && memmem(text + fr->start, fr->len, st, sl);
		}
		if (!hit)
			continue;
		for (size_t i = 0; i < n; i++) {
			struct frag fr = s->fr[cur][i];
			uint32_t off = fr.start, end = fr.start + fr.len;

			/* each fragment yields at most 2 * matches + 1 */
			if (grow(&s->fr[!cur], &s->fr_cap[!cur], m + 1 + 2 * (fr.len / sl + 1),
				 sizeof(struct frag)))
				return -ENOMEM;
			if (fr.id >= 0) {
				s->fr[!cur][m++] = fr;
				continue;
			}
			while (off < end) {
				const char *p = memmem(text + off, end - off, st, sl);
				if (!p)
					break;
				uint32_t at = (uint32_t)(p - text);
				if (at > off)
					s->fr[!cur][m++] = (struct frag){ -1, off, at - off };
				s->fr[!cur][m++] = (struct frag){ id, 0, 0 };
				off = at + (uint32_t)sl;
			}
			if (off < end)
				s->fr[!cur][m++] = (struct frag){ -1, off, end - off };
		}
		cur = !cur;
		n = m;
	}
	if (cur) { /* leave the result in fr[0] */
		struct frag *tmp = s->fr[0];
		size_t tc = s->fr_cap[0];
		s->fr[0] = s->fr[1];
		s->fr_cap[0] = s->fr_cap[1];
		s->fr[1] = tmp;
		s->fr_cap[1] = tc;
	}
	*ret_n = n;
	return 0;
}

/* ---- encoding: llama (SentencePiece) ---- */

static int spm_try(const struct tokenizer *t, struct scratch *s, int32_t l, int32_t r)
{
	struct bigram bg;
	size_t n;
	int32_t id;

	if (l < 0 || r < 0)
		return 0;
	n = (size_t)s->sym[l].n + s->sym[r].n;
	if (n > t->max_text_len)
		return 0;
	id = text_lookup(t, s->buf + s->sym[l].start, n);
	if (id < 0 || id >= t->n_vocab)
		return 0;
	bg = (struct bigram){ .prio = t->score[id], .left = l, .right = r,
			      .a = (int32_t)n, .res = id };
	return heap_push(s, &bg);
}

static int spm_encode(const struct tokenizer *t, struct scratch *s,
		      const char *text, size_t len, int prefix, struct emitter *em)
{
	size_t n = 0, ns = 0;
	struct bigram bg;

	if (grow(&s->buf, &s->buf_cap, 3 * len + 3, 1))
		return -ENOMEM;
	if (prefix) {
		memcpy(s->buf, SPM_SPACE, 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(s->buf + n, SPM_SPACE, 3);
			n += 3;
		} else {
			s->buf[n++] = text[i];
		}
	}
	if (n == 0)
		return 0;
	if (grow(&s->sym, &s->sym_cap, n, sizeof *s->sym))
		return -ENOMEM;
	for (size_t off = 0; off < n; ns++) {
		size_t l = utf8_len_lead((uint8_t)s->buf[off]);
		if (l > n - off)
			l = n - off;
		s->sym[ns] = (struct symbol){ (int32_t)ns - 1, -1, (uint32_t)off,
					      (uint32_t)l, -1 };
		off += l;
		if (off < n)
			s->sym[ns].next = (int32_t)ns + 1;
	}
	s->heap_n = 0;
	for (size_t i = 1; i < ns; i++)
		if (spm_try(t, s, (int32_t)i - 1, (int32_t)i))
			return -ENOMEM;
	while (s->heap_n) {
		heap_pop(s, &bg);
		struct symbol *L = &s->sym[bg.left], *R = &s->sym[bg.right];
		if (L->n == 0 || R->n == 0 || L->n + R->n != (uint32_t)bg.a)
			continue;
		L->n += R->n;
		L->id = bg.res;
		R->n = 0;
		L->next = R->next;
		if (R->next >= 0)
			s->sym[R->next].prev = bg.left;
		if (spm_try(t, s, L->prev, bg.left) || spm_try(t, s, bg.left, L->next))
			return -ENOMEM;
	}
	for (int32_t i = 0; i != -1; i = s->sym[i].next) {
		const struct symbol *sy = &s->sym[i];
		int32_t id = sy->id;

		if (id < 0)
			id = text_lookup(t, s->buf + sy->start, sy->n);
		if (id >= 0 && id < t->n_vocab) {
			emit(em, id);
			continue;
		}
		for (uint32_t j = 0; j < sy->n; j++) { /* byte fallback */
			int32_t b = t->spm_byte[(uint8_t)s->buf[sy->start + j]];
			if (b >= 0)
				emit(em, b);
		}
	}
	return 0;
}

/* ---- encoding: gpt2 (byte-level BPE) ---- */

/* Applies the pre-tokenizer passes to SUBJ (valid UTF-8): each pass splits
 * every piece of the previous one into its matches and the gaps between
 * them, matching inside the piece only (as llama.cpp's regex iterators do).
 * The spans end up in s->pc[0]. */
static int pre_split(const struct tokenizer *t, struct scratch *s,
		     const char *subj, size_t slen, size_t *ret_n)
{
	size_t n = 1;
	int cur = 0;

	if (grow(&s->pc[0], &s->pc_cap[0], 1, sizeof(struct span)))
		return -ENOMEM;
	s->pc[0][0] = (struct span){ 0, (uint32_t)slen };
	for (int r = 0; r < t->n_re; r++) {
		size_t m = 0;

		for (size_t i = 0; i < n; i++) {
			struct span p = s->pc[cur][i];
			const char *base = subj + p.start;
			PCRE2_SIZE off = 0, gap = 0;

			while (off < p.len) {
				int rc = pcre2_match(t->re[r], (PCRE2_SPTR)base, p.len, off,
						     PCRE2_NO_UTF_CHECK, s->md, NULL);
				if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking */
					rc = pcre2_match(t->re[r], (PCRE2_SPTR)base, p.len, off,
							 PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, NULL);
				if (rc == PCRE2_ERROR_NOMATCH)
					break;
				if (rc < 0)
					return rc == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -E2BIG;
				PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
				PCRE2_SIZE ms = ov[0], me = ov[1];
				if (me <= ms) { /* empty match: step one character */
					if (ms >= p.len)
						break;
					off = ms + utf8_len_lead((uint8_t)base[ms]);
					continue;
				}
				if (grow(&s->pc[!cur], &s->pc_cap[!cur], m + 2, sizeof(struct span)))
					return -ENOMEM;
				if (ms > gap)
					s->pc[!cur][m++] = (struct span){ p.start + (uint32_t)gap,
									  (uint32_t)(ms - gap) };
				s->pc[!cur][m++] = (struct span){ p.start + (uint32_t)ms,
								  (uint32_t)(me - ms) };
				gap = off = me;
			}
			if (gap < p.len) {
				if (grow(&s->pc[!cur], &s->pc_cap[!cur], m + 1, sizeof(struct span)))
					return -ENOMEM;
				s->pc[!cur][m++] = (struct span){ p.start + (uint32_t)gap,
								  p.len - (uint32_t)gap };
			}
		}
		cur = !cur;
		n = m;
	}
	if (cur) {
		struct span *tmp = s->pc[0];
		size_t tc = s->pc_cap[0];
		s->pc[0] = s->pc[1];
		s->pc_cap[0] = s->pc_cap[1];
		s->pc[1] = tmp;
		s->pc_cap[1] = tc;
	}
	*ret_n = n;
	return 0;
}

static int bpe_try(const struct tokenizer *t, struct scratch *s, int32_t l, int32_t r)
{
	const struct merge_slot *m;
	struct bigram bg;
	int32_t a, b;

	if (l < 0 || r < 0)
		return 0;
	a = s->sym[l].id;
	b = s->sym[r].id;
	if (a < 0 || b < 0 || !(m = merge_find(t, a, b)))
		return 0;
	bg = (struct bigram){ .prio = -(double)m->rank, .left = l, .right = r,
			      .a = a, .b = b, .res = m->res };
	return heap_push(s, &bg);
}

/* Encodes the bytes W[0..N) of one pre-token. */
static int bpe_word(const struct tokenizer *t, struct scratch *s,
		    const uint8_t *w, size_t n, struct emitter *em)
{
	struct bigram bg;

	if (n == 0)
		return 0;
	if (t->ignore_merges) {
		size_t k = 0;
		if (grow(&s->wbuf, &s->wbuf_cap, 2 * n, 1))
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			for (int j = 0; j < t->benc_len[w[i]]; j++)
				s->wbuf[k++] = (char)t->benc[w[i]][j];
		int32_t id = text_lookup(t, s->wbuf, k);
		if (id >= 0 && id < t->n_vocab) {
			emit(em, id);
			return 0;
		}
	}
	if (grow(&s->sym, &s->sym_cap, n, sizeof *s->sym))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		s->sym[i] = (struct symbol){ (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1,
					     (uint32_t)i, 1, t->bpe_sym[w[i]] };
	s->heap_n = 0;
	for (size_t i = 1; i < n; i++)
		if (bpe_try(t, s, (int32_t)i - 1, (int32_t)i))
			return -ENOMEM;
	while (s->heap_n) {
		heap_pop(s, &bg);
		struct symbol *L = &s->sym[bg.left], *R = &s->sym[bg.right];
		if (L->n == 0 || R->n == 0 || L->id != bg.a || R->id != bg.b ||
		    L->next != bg.right)
			continue;
		L->n += R->n;
		L->id = bg.res;
		R->n = 0;
		L->next = R->next;
		if (R->next >= 0)
			s->sym[R->next].prev = bg.left;
		if (bpe_try(t, s, L->prev, bg.left) || bpe_try(t, s, bg.left, L->next))
			return -ENOMEM;
	}
	for (int32_t i = 0; i != -1; i = s->sym[i].next) {
		const struct symbol *sy = &s->sym[i];
		if (sy->id >= 0 && sy->id < t->n_vocab) {
			emit(em, sy->id);
			continue;
		}
		/* llama.cpp: each byte of the encoded text as a 1-byte token */
		for (uint32_t j = 0; j < sy->n; j++) {
			uint8_t b = w[sy->start + j];
			for (int k = 0; k < t->benc_len[b]; k++) {
				int32_t id = t->bpe_single[t->benc[b][k]];
				if (id >= 0)
					emit(em, id);
			}
		}
	}
	return 0;
}

static int bpe_encode(const struct tokenizer *t, struct scratch *s,
		      const char *text, size_t len, struct emitter *em)
{
	const uint8_t *u = (const uint8_t *)text;
	size_t np;
	int rc;

	/* As llama.cpp: each byte of an invalid sequence becomes U+FFFD (a
	 * byte-level vocabulary may lack the bytes valid text never has). */
	if (!utf8_valid(u, len)) {
		size_t n = 0;
		if (grow(&s->buf, &s->buf_cap, 3 * len, 1))
			return -ENOMEM;
		for (size_t i = 0; i < len;) {
			size_t l = u[i] < 0x80 ? 1 : utf8_char_len(u + i, len - i);
			if (l) {
				memcpy(s->buf + n, u + i, l);
				n += l;
				i += l;
			} else {
				memcpy(s->buf + n, UTF8_FFFD, 3);
				n += 3;
				i++;
			}
		}
		u = (const uint8_t *)s->buf;
		len = n;
	}
	if ((rc = pre_split(t, s, (const char *)u, len, &np)))
		return rc;
	for (size_t i = 0; i < np; i++)
		if ((rc = bpe_word(t, s, u + s->pc[0][i].start, s->pc[0][i].len, em)))
			return rc;
	return 0;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     int add_bos, int parse_special, int32_t *out, int cap)
{
	struct emitter em = { out, cap, 0 };
	struct scratch s = { 0 };
	size_t nf = 0;
	int rc = 0, prev_special = 1;

	if (!t || (!text && len) || cap < 0 || (cap && !out))
		return -EINVAL;
	if (len > INT_MAX / 4)
		return -E2BIG;
	if (add_bos && t->bos >= 0)
		emit(&em, t->bos);
	if (len == 0)
		return em.n;
	if (t->model == MODEL_BPE) {
		s.md = pcre2_match_data_create(1, NULL);
		if (!s.md)
			return -ENOMEM;
	}
	if ((rc = partition(t, &s, text, len, parse_special, &nf)))
		goto out;
	for (size_t i = 0; i < nf && !rc; i++) {
		struct frag fr = s.fr[0][i];
		if (fr.id >= 0) {
			emit(&em, fr.id);
			prev_special = 1;
		} else if (t->model == MODEL_SPM) {
			rc = spm_encode(t, &s, text + fr.start, fr.len,
					t->add_space_prefix && prev_special, &em);
			prev_special = 0;
		} else {
			rc = bpe_encode(t, &s, text + fr.start, fr.len, &em);
		}
	}
out:
	scratch_free(&s);
	return rc ? rc : em.n;
}
