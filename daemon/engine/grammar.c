/* grammar.c - GBNF grammars compiled to rules of elements, matched by sets
 * of parse stacks over code points, and token masks computed by walking a
 * trie of the vocabulary's bytes (grammar.h says what is supported).
 * Not a sampler: it says which tokens may come next and nothing about their
 * probabilities; not a JSON-schema converter.
 *
 * How a mask stays cheap.  A state is a set of stacks of grammar positions
 * (llama.cpp's model).  For each stack we cut off its top: the positions
 * inside the innermost named rule (with the groups and repetitions that rule
 * made).  Which tokens that top accepts without finishing the rule depends on
 * the top alone, so a table per top (built once by one walk of the token trie,
 * pruning whole subtrees) holds them; the few tokens that finish the rule and
 * go on are listed with the byte where they leave it, and checked against the
 * rest of the stack at mask time.  A top whose list is long is cut lower
 * instead (two named rules, three...).  Positions deep inside a long bounded
 * repetition share one table (no token reaches its end).  Masks of whole
 * states are cached too: most steps find theirs and copy it.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "grammar.h"
#include "utf8.h"

#define CP_MAX 0x10ffffu

/* A table whose top finishes its rule in more than this many tokens that
 * then go on is cut one named rule lower: checking a token below the cut
 * costs about one cached transition per byte, a table cut lower costs a
 * walk of the trie per context it appears in. */
#define CTX_MAX(n_vocab) (1024u + (uint32_t)(n_vocab) / 64u)

/* ---- compiled grammars ---- */

enum gtype {
	GE_END = 0, /* end of a rule's last alternative */
	GE_ALT = 1, /* end of an alternative, another follows */
	GE_REF = 2, /* arg: rule id */
	GE_CHAR = 3, /* arg: class id; one code point of the class */
};

struct gelem {
	uint32_t type; /* enum gtype */
	uint32_t arg;  /* rule id (GE_REF) or class id (GE_CHAR) */
};

/* A set of code points: sorted, disjoint, non-adjacent ranges. */
struct gclass {
	uint32_t ascii[4]; /* bit c: code point c < 128 is in the class */
	uint32_t off;      /* first range in grammar.ranges, as (lo, hi) pairs */
	uint32_t n;        /* ranges */
};

struct grule {
	uint32_t alt_off;     /* first entry in grammar.alts */
	uint32_t n_alts;      /* alternatives, >= 1 */
	uint32_t chain_k;     /* k if this is S'(k) of a bounded repetition's
	                         chain S'(k) ::= S S'(k-1) | (see repeat()), else 0 */
	uint32_t chain_first; /* rule id of that chain's S'(1); S'(k) is
	                         chain_first + k - 1 */
};

struct grammar {
	struct gelem *elems;    /* (n_elems) every rule's alternatives, each
	                           ending in GE_ALT or GE_END */
	uint8_t *named;         /* (n_elems) 1 if the element's rule is a named
	                           one, 0 if a group or repetition made it */
	uint32_t *elem_rule;    /* (n_elems) the rule each element belongs to */
	uint32_t n_elems;
	struct gclass *classes; /* (n_classes) */
	uint32_t n_classes;
	uint32_t *ranges;       /* (2 * n_ranges) lo, hi code points */
	uint32_t n_ranges;
	struct grule *rules;    /* (n_rules) */
	uint32_t n_rules;
	uint32_t *alts;         /* (n_alts) element index of each alternative's
	                           first element (its GE_ALT/GE_END if empty) */
	uint32_t n_alts;
	uint32_t root;          /* start rule */
};

static inline int is_end(const struct grammar *g, uint32_t pos)
{
	return g->elems[pos].type <= GE_ALT;
}

static inline int class_has(const struct grammar *g, uint32_t cls, uint32_t cp)
{
	const struct gclass *c = &g->classes[cls];
	const uint32_t *r = g->ranges + 2 * (size_t)c->off;
	uint32_t lo = 0, hi = c->n;

	if (cp < 128)
		return (c->ascii[cp >> 5] >> (cp & 31)) & 1;
	while (lo < hi) { /* first range whose end is >= cp */
		uint32_t mid = (lo + hi) / 2;
		if (r[2 * mid + 1] < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < c->n && r[2 * lo] <= cp;
}

/* 1 if some code point in [A, B] is in the class. */
static int class_overlaps(const struct grammar *g, uint32_t cls, uint32_t a, uint32_t b)
{
	const struct gclass *c = &g->classes[cls];
	const uint32_t *r = g->ranges + 2 * (size_t)c->off;

	for (uint32_t i = 0; i < c->n; i++)
		if (r[2 * i + 1] >= a)
			return r[2 * i] <= b;
	return 0;
}

uint32_t grammar_n_rules(const struct grammar *g)
{
	return g->n_rules;
}

uint32_t grammar_n_elems(const struct grammar *g)
{
	return g->n_elems;
}

void grammar_free(struct grammar *g)
{
	if (!g)
		return;
	free(g->elems);
	free(g->named);
	free(g->elem_rule);
	free(g->classes);
	free(g->ranges);
	free(g->rules);
	free(g->alts);
	free(g);
}

/* ---- small helpers ---- */

/* Grows *P (of *CAP elements of ELSZ bytes) to hold NEED. */
static int grow_impl(void **p, size_t *cap, size_t need, size_t elsz)
{
	size_t n = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	q = realloc(*p, n * elsz);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}
#define GROW(arr, cap, need) grow_impl((void **)&(arr), &(cap), (need), sizeof *(arr))

static inline uint64_t mix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static uint64_t hash_words(const uint32_t *w, size_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ n;

	for (size_t i = 0; i < n; i++)
		h = (h ^ w[i]) * 0x100000001b3ull + (h >> 29);
	return mix64(h);
}

/* ---- the parser: GBNF text to rules ---- */

struct pbuf {
	struct gelem *e; /* elements so far */
	size_t n, cap;
};

struct prule {
	struct pbuf body;   /* the rule's alternatives */
	uint32_t owner;     /* the named rule this one belongs to (itself if named) */
	uint8_t named;      /* defined by `name ::=` (or referenced as a name) */
	uint8_t defined;    /* a definition was seen */
	size_t name_off;    /* into parser.names */
	size_t name_len;
	size_t first_ref;   /* text offset of the first reference; SIZE_MAX = none */
	uint32_t chain_k;   /* as grule.chain_k */
	uint32_t chain_first; /* as grule.chain_first */
	size_t def_at;      /* text offset of the (last) definition */
};

struct parser {
	const char *src;     /* the GBNF text (not NUL-terminated) */
	size_t len;          /* its bytes */
	size_t pos;          /* next byte to read */
	struct prule *rules; /* (n_rules) */
	size_t n_rules, cap_rules;
	char *names;         /* rule names, back to back */
	size_t n_names, cap_names;
	uint32_t *htab;      /* (cap_htab) named rule id + 1, 0 = free slot */
	size_t cap_htab;
	struct gclass *classes;
	size_t n_classes, cap_classes;
	uint32_t *ranges;    /* (lo, hi) pairs of every class */
	size_t n_ranges, cap_ranges;
	uint32_t *tmp;       /* scratch: a class's ranges being read */
	size_t n_tmp, cap_tmp;
	struct gelem *rep;   /* scratch: the item a repetition copies */
	size_t cap_rep;
	uint32_t ascii_class[128]; /* class id + 1 of each single ASCII char */
	uint32_t any_class;  /* class id + 1 of `.` */
	size_t n_elems;      /* elements emitted, for the limit */
	uint32_t nesting;    /* open parentheses */
	char *err;           /* the caller's error buffer */
	size_t errlen;
	int code;            /* the error's errno */
	jmp_buf fail;        /* where a parse error goes */
};

static void perr(struct parser *p, size_t at, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5), noreturn));

static void perr(struct parser *p, size_t at, int code, const char *fmt, ...)
{
	unsigned line = 1, col = 1;
	char msg[200];
	va_list ap;

	for (size_t i = 0; i < at && i < p->len; i++) {
		if (p->src[i] == '\n') {
			line++;
			col = 1;
		} else if (((uint8_t)p->src[i] & 0xc0) != 0x80) {
			col++;
		}
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	errbuf_set(p->err, p->errlen, "line %u, column %u: %s", line, col, msg);
	p->code = code;
	longjmp(p->fail, 1);
}

static void pnomem(struct parser *p)
{
	perr(p, p->pos, -ENOMEM, "out of memory");
}

static inline int peek(const struct parser *p, size_t k)
{
	return p->pos + k < p->len ? (uint8_t)p->src[p->pos + k] : -1;
}

static void parse_space(struct parser *p, int newline_ok)
{
	while (p->pos < p->len) {
		char c = p->src[p->pos];
		if (c == '#') {
			while (p->pos < p->len && p->src[p->pos] != '\r' && p->src[p->pos] != '\n')
				p->pos++;
		} else if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
			p->pos++;
		} else {
			break;
		}
	}
}

static inline int is_word_char(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-';
}

static uint32_t new_rule(struct parser *p, uint32_t owner, int named)
{
	struct prule *r;

	if (p->n_rules >= GRAMMAR_MAX_RULES)
		perr(p, p->pos, -E2BIG, "more than %u rules (with those that groups and "
		     "repetitions make)", GRAMMAR_MAX_RULES);
	if (GROW(p->rules, p->cap_rules, p->n_rules + 1))
		pnomem(p);
	r = &p->rules[p->n_rules];
	memset(r, 0, sizeof *r);
	r->owner = named ? (uint32_t)p->n_rules : owner;
	r->named = (uint8_t)named;
	r->first_ref = SIZE_MAX;
	return (uint32_t)p->n_rules++;
}

static uint64_t name_hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return mix64(h);
}

/* The id of the named rule NAME (LEN bytes), made on first sight. */
static uint32_t symbol(struct parser *p, const char *name, size_t len)
{
	size_t mask, i;
	uint32_t id;

	if (p->cap_htab < 2 * (p->n_rules + 1)) { /* rehash, load <= 1/2 */
		size_t cap = p->cap_htab ? 2 * p->cap_htab : 64;
		uint32_t *t;
		while (cap < 2 * (p->n_rules + 1))
			cap *= 2;
		t = calloc(cap, sizeof *t);
		if (!t)
			pnomem(p);
		for (size_t k = 0; k < p->cap_htab; k++) {
			uint32_t v = p->htab[k];
			const struct prule *r;
			if (!v)
				continue;
			r = &p->rules[v - 1];
			i = name_hash(p->names + r->name_off, r->name_len) & (cap - 1);
			while (t[i])
				i = (i + 1) & (cap - 1);
			t[i] = v;
		}
		free(p->htab);
		p->htab = t;
		p->cap_htab = cap;
	}
	mask = p->cap_htab - 1;
	for (i = name_hash(name, len) & mask; p->htab[i]; i = (i + 1) & mask) {
		const struct prule *r = &p->rules[p->htab[i] - 1];
		if (r->name_len == len && !memcmp(p->names + r->name_off, name, len))
			return p->htab[i] - 1;
	}
	id = new_rule(p, 0, 1);
	if (GROW(p->names, p->cap_names, p->n_names + len))
		pnomem(p);
	memcpy(p->names + p->n_names, name, len);
	p->rules[id].name_off = p->n_names;
	p->rules[id].name_len = len;
	p->n_names += len;
	p->htab[i] = id + 1;
	return id;
}

static void emit(struct parser *p, uint32_t rule, uint32_t type, uint32_t arg)
{
	struct pbuf *b = &p->rules[rule].body;

	if (++p->n_elems > GRAMMAR_MAX_ELEMS)
		perr(p, p->pos, -E2BIG, "grammar expands to more than %u elements",
		     GRAMMAR_MAX_ELEMS);
	if (GROW(b->e, b->cap, b->n + 1))
		pnomem(p);
	b->e[b->n].type = type;
	b->e[b->n].arg = arg;
	b->n++;
}

/* A class of the ranges in p->tmp (pairs), complemented if NEG. */
static uint32_t make_class(struct parser *p, int neg)
{
	size_t n = p->n_tmp / 2, m = 0, first;
	uint32_t *t = p->tmp;
	struct gclass *c;

	for (size_t i = 1; i < n; i++) { /* insertion sort by lo: classes are short */
		uint32_t lo = t[2 * i], hi = t[2 * i + 1];
		size_t j = i;
		while (j > 0 && t[2 * (j - 1)] > lo) {
			t[2 * j] = t[2 * (j - 1)];
			t[2 * j + 1] = t[2 * (j - 1) + 1];
			j--;
		}
		t[2 * j] = lo;
		t[2 * j + 1] = hi;
	}
	for (size_t i = 0; i < n; i++) { /* merge overlapping and adjacent */
		if (m && t[2 * i] <= t[2 * (m - 1) + 1] + 1) {
			if (t[2 * i + 1] > t[2 * (m - 1) + 1])
				t[2 * (m - 1) + 1] = t[2 * i + 1];
		} else {
			t[2 * m] = t[2 * i];
			t[2 * m + 1] = t[2 * i + 1];
			m++;
		}
	}
	if (GROW(p->ranges, p->cap_ranges, 2 * (p->n_ranges + m + 1)) ||
	    GROW(p->classes, p->cap_classes, p->n_classes + 1))
		pnomem(p);
	first = p->n_ranges;
	if (!neg) {
		memcpy(p->ranges + 2 * first, t, 2 * m * sizeof *t);
		p->n_ranges += m;
	} else {
		uint32_t next = 0;
		for (size_t i = 0; i < m; i++) {
			if (t[2 * i] > next) {
				p->ranges[2 * p->n_ranges] = next;
				p->ranges[2 * p->n_ranges + 1] = t[2 * i] - 1;
				p->n_ranges++;
			}
			next = t[2 * i + 1] + 1;
		}
		if (next <= CP_MAX) {
			p->ranges[2 * p->n_ranges] = next;
			p->ranges[2 * p->n_ranges + 1] = CP_MAX;
			p->n_ranges++;
		}
	}
	c = &p->classes[p->n_classes];
	memset(c, 0, sizeof *c);
	c->off = (uint32_t)first;
	c->n = (uint32_t)(p->n_ranges - first);
	for (size_t i = first; i < p->n_ranges; i++)
		for (uint32_t cp = p->ranges[2 * i]; cp <= p->ranges[2 * i + 1] && cp < 128; cp++)
			c->ascii[cp >> 5] |= 1u << (cp & 31);
	return (uint32_t)p->n_classes++;
}

static uint32_t single_class(struct parser *p, uint32_t cp)
{
	uint32_t id;

	if (cp < 128 && p->ascii_class[cp])
		return p->ascii_class[cp] - 1;
	if (GROW(p->tmp, p->cap_tmp, 2))
		pnomem(p);
	p->tmp[0] = p->tmp[1] = cp;
	p->n_tmp = 2;
	id = make_class(p, 0);
	if (cp < 128)
		p->ascii_class[cp] = id + 1;
	return id;
}

static uint32_t parse_hex(struct parser *p, int digits)
{
	uint32_t v = 0;
	size_t at = p->pos - 2;

	for (int i = 0; i < digits; i++) {
		int c = peek(p, 0);
		if (c >= '0' && c <= '9')
			v = v * 16 + (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v * 16 + (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v = v * 16 + (uint32_t)(c - 'A' + 10);
		else
			perr(p, p->pos, -EINVAL, "expecting %d hex digits after '\\%c'", digits,
			     p->src[at + 1]);
		p->pos++;
	}
	if (v > CP_MAX)
		perr(p, at, -EINVAL, "code point U+%X is past U+10FFFF", v);
	return v;
}

/* One character of a literal or a class: an escape or a UTF-8 character. */
static uint32_t parse_char(struct parser *p)
{
	const uint8_t *s = (const uint8_t *)p->src + p->pos;
	uint32_t cp;
	size_t n;

	if (p->pos >= p->len)
		perr(p, p->pos, -EINVAL, "unexpected end of grammar");
	if (s[0] == '\\') {
		int c = peek(p, 1);
		p->pos += 2;
		switch (c) {
		case 'x': return parse_hex(p, 2);
		case 'u': return parse_hex(p, 4);
		case 'U': return parse_hex(p, 8);
		case 't': return '\t';
		case 'r': return '\r';
		case 'n': return '\n';
		case '\\': case '"': case '[': case ']': case '-':
			return (uint32_t)c;
		default:
			if (c < 0)
				perr(p, p->pos - 2, -EINVAL, "unexpected end of grammar after '\\'");
			perr(p, p->pos - 2, -EINVAL, "unknown escape '\\%c'", c);
		}
	}
	n = utf8_char_len(s, p->len - p->pos); /* the text was checked: n >= 1 */
	cp = s[0];
	if (n > 1) {
		cp &= 0x3fu >> (n - 1);
		for (size_t i = 1; i < n; i++)
			cp = (cp << 6) | (s[i] & 0x3f);
	}
	p->pos += n;
	return cp;
}

static uint32_t parse_count(struct parser *p)
{
	size_t at = p->pos;
	uint64_t v = 0;
	int c;

	if ((c = peek(p, 0)) < '0' || c > '9')
		perr(p, p->pos, -EINVAL, "expecting a number");
	while ((c = peek(p, 0)) >= '0' && c <= '9') {
		if (v <= GRAMMAR_MAX_REPEAT)
			v = v * 10 + (uint64_t)(c - '0');
		p->pos++;
	}
	if (v > GRAMMAR_MAX_REPEAT)
		perr(p, at, -E2BIG, "repetition count %.*s is over the limit %u",
		     (int)(p->pos - at > 20 ? 20 : p->pos - at), p->src + at, GRAMMAR_MAX_REPEAT);
	return (uint32_t)v;
}

#define REP_INF UINT32_MAX

/* Rewrites the item at body[START..] of RULE as repeated MIN..MAX times
 * (MAX REP_INF: unbounded), as llama.cpp does:
 *   S{m,n} -> S (m times) S'(n-m), S'(k) ::= S S'(k-1) | , S'(1) ::= S |
 *   S{m,}  -> S (m times) S',      S'    ::= S S' |                      */
static void repeat(struct parser *p, uint32_t rule, size_t start, uint32_t min, uint32_t max,
		   size_t at)
{
	size_t n_item = p->rules[rule].body.n - start, n_opt;
	uint32_t last = 0;

	if (n_item == 0)
		perr(p, at, -EINVAL, "expecting an item before '%c'", p->src[at]);
	if (max != REP_INF && min > max)
		perr(p, at, -EINVAL, "repetition {%u,%u}: minimum over maximum", min, max);
	if (GROW(p->rep, p->cap_rep, n_item))
		pnomem(p);
	memcpy(p->rep, p->rules[rule].body.e + start, n_item * sizeof *p->rep);
	if (min == 0)
		p->rules[rule].body.n = start;
	for (uint32_t i = 1; i < min; i++)
		for (size_t k = 0; k < n_item; k++)
			emit(p, rule, p->rep[k].type, p->rep[k].arg);
	n_opt = max == REP_INF ? 1 : max - min;
	for (size_t i = 0; i < n_opt; i++) {
		uint32_t rec = new_rule(p, p->rules[rule].owner, 0);
		if (max != REP_INF) { /* S'(i + 1): its ids are consecutive */
			p->rules[rec].chain_k = (uint32_t)i + 1;
			p->rules[rec].chain_first = rec - (uint32_t)i;
		}
		for (size_t k = 0; k < n_item; k++)
			emit(p, rec, p->rep[k].type, p->rep[k].arg);
		if (max == REP_INF)
			emit(p, rec, GE_REF, rec);
		else if (i > 0)
			emit(p, rec, GE_REF, last);
		emit(p, rec, GE_ALT, 0);
		emit(p, rec, GE_END, 0);
		last = rec;
	}
	if (n_opt > 0)
		emit(p, rule, GE_REF, last);
}

static void parse_alternates(struct parser *p, uint32_t rule, int nested);

static void parse_sequence(struct parser *p, uint32_t rule, int nested)
{
	size_t last = p->rules[rule].body.n; /* where the last item starts */

	while (p->pos < p->len) {
		int c = peek(p, 0);
		size_t at = p->pos;

		if (c == '"') {
			p->pos++;
			last = p->rules[rule].body.n;
			while (peek(p, 0) != '"') {
				if (p->pos >= p->len)
					perr(p, at, -EINVAL, "unterminated string literal");
				emit(p, rule, GE_CHAR, single_class(p, parse_char(p)));
			}
			p->pos++;
			parse_space(p, nested);
		} else if (c == '[') {
			int neg = 0;
			p->pos++;
			if (peek(p, 0) == '^') {
				neg = 1;
				p->pos++;
			}
			p->n_tmp = 0;
			while (peek(p, 0) != ']') {
				size_t cat = p->pos;
				uint32_t lo, hi;
				if (p->pos >= p->len)
					perr(p, at, -EINVAL, "unterminated character class");
				lo = hi = parse_char(p);
				if (peek(p, 0) == '-' && peek(p, 1) != ']' && peek(p, 1) >= 0) {
					p->pos++;
					hi = parse_char(p);
					if (hi < lo)
						perr(p, cat, -EINVAL, "character range %.*s is backwards",
						     (int)(p->pos - cat), p->src + cat);
				}
				if (GROW(p->tmp, p->cap_tmp, p->n_tmp + 2))
					pnomem(p);
				p->tmp[p->n_tmp++] = lo;
				p->tmp[p->n_tmp++] = hi;
			}
			if (!p->n_tmp)
				perr(p, at, -EINVAL, "empty character class");
			p->pos++;
			last = p->rules[rule].body.n;
			emit(p, rule, GE_CHAR, make_class(p, neg));
			parse_space(p, nested);
		} else if (c == '<' || c == '!') {
			perr(p, at, -EINVAL, "token terminals (<...>, !<...>) are not supported");
		} else if (is_word_char(c)) {
			uint32_t id;
			while (is_word_char(peek(p, 0)))
				p->pos++;
			id = symbol(p, p->src + at, p->pos - at);
			if (p->rules[id].first_ref == SIZE_MAX)
				p->rules[id].first_ref = at;
			last = p->rules[rule].body.n;
			emit(p, rule, GE_REF, id);
			parse_space(p, nested);
		} else if (c == '(') {
			uint32_t sub;
			if (p->nesting >= GRAMMAR_MAX_NESTING)
				perr(p, at, -E2BIG, "parentheses nested deeper than %u",
				     GRAMMAR_MAX_NESTING);
			p->pos++;
			parse_space(p, 1);
			sub = new_rule(p, p->rules[rule].owner, 0);
			p->nesting++;
			parse_alternates(p, sub, 1);
			p->nesting--;
			if (peek(p, 0) != ')')
				perr(p, p->pos, -EINVAL, "expecting ')' to close the '(' at %s",
				     p->pos >= p->len ? "end of grammar" : "this point");
			p->pos++;
			last = p->rules[rule].body.n;
			emit(p, rule, GE_REF, sub);
			parse_space(p, nested);
		} else if (c == '.') {
			if (!p->any_class) {
				if (GROW(p->tmp, p->cap_tmp, 2))
					pnomem(p);
				p->tmp[0] = 0;
				p->tmp[1] = CP_MAX;
				p->n_tmp = 2;
				p->any_class = make_class(p, 0) + 1;
			}
			p->pos++;
			last = p->rules[rule].body.n;
			emit(p, rule, GE_CHAR, p->any_class - 1);
			parse_space(p, nested);
		} else if (c == '*' || c == '+' || c == '?') {
			p->pos++;
			parse_space(p, nested);
			repeat(p, rule, last, c == '+', c == '?' ? 1 : REP_INF, at);
		} else if (c == '{') {
			uint32_t min, max;
			p->pos++;
			parse_space(p, nested);
			min = parse_count(p);
			parse_space(p, nested);
			if (peek(p, 0) == '}') {
				max = min;
			} else if (peek(p, 0) == ',') {
				p->pos++;
				parse_space(p, nested);
				max = REP_INF;
				if (peek(p, 0) >= '0' && peek(p, 0) <= '9') {
					max = parse_count(p);
					parse_space(p, nested);
				}
				if (peek(p, 0) != '}')
					perr(p, p->pos, -EINVAL, "expecting '}'");
			} else {
				perr(p, p->pos, -EINVAL, "expecting ',' or '}'");
			}
			p->pos++;
			parse_space(p, nested);
			repeat(p, rule, last, min, max, at);
		} else {
			break;
		}
	}
}

static void parse_alternates(struct parser *p, uint32_t rule, int nested)
{
	p->rules[rule].body.n = 0;
	parse_sequence(p, rule, nested);
	while (peek(p, 0) == '|') {
		emit(p, rule, GE_ALT, 0);
		p->pos++;
		parse_space(p, 1);
		parse_sequence(p, rule, nested);
	}
	emit(p, rule, GE_END, 0);
}

static void parse_rule(struct parser *p)
{
	size_t at = p->pos;
	uint32_t id;

	if (!is_word_char(peek(p, 0)))
		perr(p, at, -EINVAL, "expecting a rule name");
	while (is_word_char(peek(p, 0)))
		p->pos++;
	id = symbol(p, p->src + at, p->pos - at);
	parse_space(p, 0);
	if (peek(p, 0) != ':' || peek(p, 1) != ':' || peek(p, 2) != '=')
		perr(p, p->pos, -EINVAL, "expecting '::=' after rule name '%.*s'",
		     (int)(p->rules[id].name_len > 60 ? 60 : p->rules[id].name_len), p->src + at);
	p->pos += 3;
	parse_space(p, 1);
	/* a second definition replaces the first, as in llama.cpp */
	p->rules[id].defined = 1;
	p->rules[id].def_at = at;
	parse_alternates(p, id, 0);
	if (peek(p, 0) == '\r')
		p->pos += peek(p, 1) == '\n' ? 2 : 1;
	else if (peek(p, 0) == '\n')
		p->pos++;
	else if (p->pos < p->len)
		perr(p, p->pos, -EINVAL, "expecting newline or end of rule, got '%c'",
		     p->src[p->pos]);
	parse_space(p, 1);
}

/* ---- compiling: rules to one element array, left recursion refused ---- */

static void rule_name(const struct parser *p, uint32_t r, char *buf, size_t cap)
{
	const struct prule *o = &p->rules[p->rules[r].owner];
	int n = o->name_len > 60 ? 60 : (int)o->name_len;

	snprintf(buf, cap, p->rules[r].named ? "'%.*s'" : "a group or repetition in '%.*s'", n,
		 p->names + o->name_off);
}

/* Nullable rules (those that may match nothing), by a worklist over the
 * alternatives' counts of not-yet-nullable elements: linear in the grammar. */
static void find_nullable(struct parser *p, const struct grammar *g, uint8_t *nullable)
{
	uint32_t n_alts = g->n_alts, *pending = NULL, *alt_rule = NULL, *ref_start = NULL;
	uint32_t *refs = NULL, *work = NULL, n_work = 0;

	pending = calloc(n_alts + 1, sizeof *pending);
	alt_rule = calloc(n_alts + 1, sizeof *alt_rule);
	ref_start = calloc(g->n_rules + 2, sizeof *ref_start);
	work = calloc(g->n_rules + 1, sizeof *work);
	if (!pending || !alt_rule || !ref_start || !work)
		goto nomem;
	/* pending[a]: elements of alternative a that are not (yet) nullable;
	 * UINT32_MAX when it has a character (never nullable) */
	for (uint32_t r = 0; r < g->n_rules; r++) {
		for (uint32_t k = 0; k < g->rules[r].n_alts; k++) {
			uint32_t a = g->rules[r].alt_off + k;
			alt_rule[a] = r;
			for (uint32_t e = g->alts[a]; !is_end(g, e); e++) {
				if (g->elems[e].type == GE_CHAR) {
					pending[a] = UINT32_MAX;
					break;
				}
				pending[a]++;
			}
			if (pending[a] == UINT32_MAX)
				continue;
			for (uint32_t e = g->alts[a]; !is_end(g, e); e++)
				ref_start[g->elems[e].arg + 1]++;
		}
	}
	for (uint32_t r = 0; r < g->n_rules; r++)
		ref_start[r + 1] += ref_start[r];
	refs = malloc((ref_start[g->n_rules] + 1) * sizeof *refs);
	if (!refs)
		goto nomem;
	{
		uint32_t *fill = calloc(g->n_rules + 1, sizeof *fill);
		if (!fill)
			goto nomem;
		for (uint32_t a = 0; a < n_alts; a++) {
			if (pending[a] == UINT32_MAX)
				continue;
			for (uint32_t e = g->alts[a]; !is_end(g, e); e++) {
				uint32_t t = g->elems[e].arg;
				refs[ref_start[t] + fill[t]++] = a;
			}
		}
		free(fill);
	}
	for (uint32_t a = 0; a < n_alts; a++) {
		uint32_t r = alt_rule[a];
		if (pending[a] == 0 && !nullable[r]) {
			nullable[r] = 1;
			work[n_work++] = r;
		}
	}
	while (n_work) {
		uint32_t t = work[--n_work];
		for (uint32_t i = ref_start[t]; i < ref_start[t + 1]; i++) {
			uint32_t a = refs[i], r = alt_rule[a];
			if (--pending[a] == 0 && !nullable[r]) {
				nullable[r] = 1;
				work[n_work++] = r;
			}
		}
	}
	free(pending);
	free(alt_rule);
	free(ref_start);
	free(refs);
	free(work);
	return;
nomem:
	free(pending);
	free(alt_rule);
	free(ref_start);
	free(refs);
	free(work);
	pnomem(p);
}

/* Refuses a rule that can reach itself without reading a character: the
 * matcher would expand it forever. */
static void check_left_recursion(struct parser *p, const struct grammar *g)
{
	uint8_t *nullable = calloc(g->n_rules, 1), *color = calloc(g->n_rules, 1);
	uint32_t *estart = calloc(g->n_rules + 1, sizeof *estart), *edges = NULL;
	uint32_t *stk = NULL, *it = NULL, n_edges = 0;

	if (!nullable || !color || !estart)
		goto nomem;
	find_nullable(p, g, nullable);
	/* edges r -> t: t is called at r's left edge (after nullable calls only) */
	for (int pass = 0; pass < 2; pass++) {
		n_edges = 0;
		for (uint32_t r = 0; r < g->n_rules; r++) {
			if (pass)
				estart[r] = n_edges;
			for (uint32_t k = 0; k < g->rules[r].n_alts; k++) {
				for (uint32_t e = g->alts[g->rules[r].alt_off + k]; !is_end(g, e); e++) {
					if (g->elems[e].type != GE_REF)
						break;
					if (pass)
						edges[n_edges] = g->elems[e].arg;
					n_edges++;
					if (!nullable[g->elems[e].arg])
						break;
				}
			}
		}
		if (!pass) {
			edges = malloc((n_edges + 1) * sizeof *edges);
			if (!edges)
				goto nomem;
		}
	}
	estart[g->n_rules] = n_edges;
	stk = malloc((g->n_rules + 1) * sizeof *stk);
	it = malloc((g->n_rules + 1) * sizeof *it);
	if (!stk || !it)
		goto nomem;
	/* iterative DFS: color 1 = on the path, 2 = done */
	for (uint32_t s = 0; s < g->n_rules; s++) {
		uint32_t sp = 0;
		if (color[s])
			continue;
		stk[sp] = s;
		it[sp++] = estart[s];
		color[s] = 1;
		while (sp) {
			uint32_t r = stk[sp - 1];
			if (it[sp - 1] < estart[r + 1]) {
				uint32_t t = edges[it[sp - 1]++];
				if (color[t] == 1) {
					char name[160];
					size_t at = p->rules[p->rules[t].owner].def_at;
					rule_name(p, t, name, sizeof name);
					free(nullable);
					free(color);
					free(estart);
					free(edges);
					free(stk);
					free(it);
					perr(p, at, -EINVAL, "left recursion: %s can reach itself without "
					     "reading a character (not supported)", name);
				}
				if (!color[t]) {
					color[t] = 1;
					stk[sp] = t;
					it[sp++] = estart[t];
				}
			} else {
				color[r] = 2;
				sp--;
			}
		}
	}
	free(nullable);
	free(color);
	free(estart);
	free(edges);
	free(stk);
	free(it);
	return;
nomem:
	free(nullable);
	free(color);
	free(estart);
	free(edges);
	free(stk);
	free(it);
	pnomem(p);
}

/* The parsed rules as one struct grammar (into *G, owned by the caller even
 * when this fails). */
static void link_grammar(struct parser *p, struct grammar *g, uint32_t root)
{
	uint32_t *start = NULL, total = 0, n_alts = 0;

	for (size_t r = 0; r < p->n_rules; r++) {
		total += (uint32_t)p->rules[r].body.n;
		for (size_t i = 0; i < p->rules[r].body.n; i++)
			n_alts += p->rules[r].body.e[i].type <= GE_ALT;
	}
	g->elems = malloc((total + 1) * sizeof *g->elems);
	g->named = malloc(total + 1);
	g->elem_rule = malloc((total + 1) * sizeof *g->elem_rule);
	g->rules = calloc(p->n_rules + 1, sizeof *g->rules);
	g->alts = malloc((n_alts + 1) * sizeof *g->alts);
	start = malloc((p->n_rules + 1) * sizeof *start);
	g->classes = malloc((p->n_classes + 1) * sizeof *g->classes);
	g->ranges = malloc((2 * p->n_ranges + 2) * sizeof *g->ranges);
	if (!g->elems || !g->named || !g->elem_rule || !g->rules || !g->alts || !start ||
	    !g->classes || !g->ranges) {
		free(start);
		pnomem(p);
	}
	memcpy(g->classes, p->classes, p->n_classes * sizeof *g->classes);
	memcpy(g->ranges, p->ranges, 2 * p->n_ranges * sizeof *g->ranges);
	g->n_classes = (uint32_t)p->n_classes;
	g->n_ranges = (uint32_t)p->n_ranges;
	total = 0;
	for (size_t r = 0; r < p->n_rules; r++) {
		start[r] = total;
		total += (uint32_t)p->rules[r].body.n;
	}
	g->n_elems = total;
	g->n_rules = (uint32_t)p->n_rules;
	n_alts = 0;
	for (size_t r = 0; r < p->n_rules; r++) {
		const struct pbuf *b = &p->rules[r].body;
		uint32_t base = start[r];
		g->rules[r].alt_off = n_alts;
		g->rules[r].chain_k = p->rules[r].chain_k;
		g->rules[r].chain_first = p->rules[r].chain_first;
		g->alts[n_alts++] = base;
		for (size_t i = 0; i < b->n; i++) {
			struct gelem e = b->e[i];
			if (e.type == GE_ALT && i + 1 < b->n)
				g->alts[n_alts++] = base + (uint32_t)i + 1;
			g->elems[base + i] = e;
			g->named[base + i] = p->rules[r].named;
			g->elem_rule[base + i] = (uint32_t)r;
		}
		g->rules[r].n_alts = n_alts - g->rules[r].alt_off;
	}
	g->n_alts = n_alts;
	g->root = root;
	free(start);
}

static void parser_free(struct parser *p)
{
	for (size_t r = 0; r < p->n_rules; r++)
		free(p->rules[r].body.e);
	free(p->rules);
	free(p->names);
	free(p->htab);
	free(p->classes);
	free(p->ranges);
	free(p->tmp);
	free(p->rep);
}

/* Everything a compile does that may fail with perr(). */
static void parse_all(struct parser *p, struct grammar *g, const char *root)
{
	const void *nul = memchr(p->src, 0, p->len);
	size_t bad = utf8_check(p->src, p->len), first = SIZE_MAX;
	uint32_t undef = 0, root_id = UINT32_MAX;

	if (nul)
		perr(p, (size_t)((const char *)nul - p->src), -EINVAL, "NUL byte in grammar");
	if (bad != p->len)
		perr(p, bad, -EINVAL, "invalid UTF-8");
	parse_space(p, 1);
	while (p->pos < p->len)
		parse_rule(p);
	for (size_t r = 0; r < p->n_rules; r++) {
		const struct prule *pr = &p->rules[r];
		if (pr->named && !pr->defined && pr->first_ref < first) {
			first = pr->first_ref;
			undef = (uint32_t)r;
		}
		if (pr->named && pr->defined && pr->name_len == strlen(root) &&
		    !memcmp(p->names + pr->name_off, root, pr->name_len))
			root_id = (uint32_t)r;
	}
	if (first != SIZE_MAX)
		perr(p, first, -EINVAL, "undefined rule '%.*s'",
		     (int)(p->rules[undef].name_len > 60 ? 60 : p->rules[undef].name_len),
		     p->names + p->rules[undef].name_off);
	if (root_id == UINT32_MAX) {
		errbuf_set(p->err, p->errlen, "no rule named '%.60s' (the start rule)", root);
		p->code = -EINVAL;
		longjmp(p->fail, 1);
	}
	link_grammar(p, g, root_id);
	check_left_recursion(p, g);
}

static int parse_guarded(struct parser *p, struct grammar *g, const char *root)
{
	if (setjmp(p->fail))
		return p->code;
	parse_all(p, g, root);
	return 0;
}

int grammar_parse(const char *gbnf, size_t len, const char *root_rule,
		  struct grammar **ret, char *err, size_t errlen)
{
	struct parser *p;
	struct grammar *g;
	int rc;

	if (!gbnf && len)
		return errbuf_fail(err, errlen, -EINVAL, "no grammar text");
	if (len > GRAMMAR_MAX_TEXT)
		return errbuf_fail(err, errlen, -E2BIG, "grammar of %zu bytes is over the limit "
				   "of %u", len, GRAMMAR_MAX_TEXT);
	p = calloc(1, sizeof *p);
	g = calloc(1, sizeof *g);
	if (!p || !g) {
		free(p);
		free(g);
		return errbuf_fail(err, errlen, -ENOMEM, "out of memory");
	}
	p->src = gbnf ? gbnf : "";
	p->len = len;
	p->err = err;
	p->errlen = errlen;
	rc = parse_guarded(p, g, root_rule ? root_rule : "root");
	parser_free(p);
	free(p);
	if (rc) {
		grammar_free(g);
		return rc;
	}
	*ret = g;
	return 0;
}

/* ---- vocabularies: the token trie ---- */

/* A trie node, in depth-first order: the subtree of node i is i..next-1. */
struct tnode {
	uint32_t next;   /* first node after this one's subtree */
	uint32_t tok_lo; /* first entry of vocab.sorted in the subtree: those
	                    ending here are tok_lo..tok_mid-1 */
	uint32_t tok_mid;
	uint32_t tok_hi; /* end of the subtree's entries */
	uint16_t depth;  /* bytes from the root: this node's byte is the
	                    depth-th of its tokens */
	uint8_t byte;    /* the byte that leads here */
};

struct grammar_vocab {
	int32_t n_vocab;      /* tokens */
	size_t n_words;       /* (n_vocab + 31) / 32 */
	uint8_t *bytes;       /* every token's bytes, back to back */
	uint64_t *off;        /* (n_vocab + 1) token t is bytes[off[t]..off[t+1]) */
	uint32_t *sorted;     /* (n_sorted) ids of the tokens in the trie, by bytes */
	uint32_t n_sorted;
	struct tnode *nodes;  /* (n_nodes) */
	uint32_t n_nodes;
	uint32_t max_len;     /* bytes of the longest token in the trie */
	uint32_t *usable;     /* (n_words) bit t: token t is in the trie */
	uint32_t *eog;        /* (n_words) bit t: token t ends generation */
	int32_t *eog_ids;     /* (n_eog) */
	int n_eog;
};

static int cmp_tokens(const void *a, const void *b, void *ctx)
{
	const struct grammar_vocab *v = ctx;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
	int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);

	if (c)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
	if (!v)
		return;
	free(v->bytes);
	free(v->off);
	free(v->sorted);
	free(v->nodes);
	free(v->usable);
	free(v->eog);
	free(v->eog_ids);
	free(v);
}

int32_t grammar_vocab_n(const struct grammar_vocab *v)
{
	return v->n_vocab;
}

size_t grammar_vocab_mask_words(const struct grammar_vocab *v)
{
	return v->n_words;
}

int grammar_vocab_new(const char *const *token_bytes, const size_t *token_lens,
		      int32_t n_vocab, const int32_t *eog_ids, int n_eog,
		      struct grammar_vocab **ret)
{
	struct grammar_vocab *v;
	uint32_t *path = NULL;
	uint64_t total = 0;
	size_t cap_nodes = 0;
	int rc = -ENOMEM;

	if (n_vocab < 0 || n_eog < 0 || (n_vocab && (!token_bytes || !token_lens)) ||
	    (n_eog && !eog_ids))
		return -EINVAL;
	for (int i = 0; i < n_eog; i++)
		if (eog_ids[i] < 0 || eog_ids[i] >= n_vocab)
			return -EINVAL;
	for (int32_t t = 0; t < n_vocab; t++) {
		if (token_lens[t] > GRAMMAR_MAX_TOKEN_BYTES)
			return -E2BIG;
		if (token_lens[t] && !token_bytes[t])
			return -EINVAL;
		total += token_lens[t];
	}
	v = calloc(1, sizeof *v);
	if (!v)
		return -ENOMEM;
	v->n_vocab = n_vocab;
	v->n_words = ((size_t)n_vocab + 31) / 32;
	v->bytes = malloc(total + 1);
	v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
	v->sorted = malloc(((size_t)n_vocab + 1) * sizeof *v->sorted);
	v->usable = calloc(v->n_words + 1, sizeof *v->usable);
	v->eog = calloc(v->n_words + 1, sizeof *v->eog);
	v->eog_ids = malloc(((size_t)n_eog + 1) * sizeof *v->eog_ids);
	if (!v->bytes || !v->off || !v->sorted || !v->usable || !v->eog || !v->eog_ids)
		goto fail;
	for (int i = 0; i < n_eog; i++) {
		v->eog[eog_ids[i] >> 5] |= 1u << (eog_ids[i] & 31);
		v->eog_ids[i] = eog_ids[i];
	}
	v->n_eog = n_eog;
	total = 0;
	for (int32_t t = 0; t < n_vocab; t++) {
		size_t n = token_lens[t];
		v->off[t] = total;
		if (n)
			memcpy(v->bytes + total, token_bytes[t], n);
		total += n;
		/* never in the trie: no bytes (control tokens), a NUL byte (as in
		 * llama.cpp, whose pieces are C strings), end of generation */
		if (!n || memchr(token_bytes[t], 0, n) || ((v->eog[t >> 5] >> (t & 31)) & 1))
			continue;
		v->usable[t >> 5] |= 1u << (t & 31);
		v->sorted[v->n_sorted++] = (uint32_t)t;
		if (n > v->max_len)
			v->max_len = (uint32_t)n;
	}
	v->off[n_vocab] = total;
	qsort_r(v->sorted, v->n_sorted, sizeof *v->sorted, cmp_tokens, v);

	/* the trie in depth-first order, from the sorted tokens: each token adds
	 * nodes past its common prefix with the one before */
	path = malloc(((size_t)v->max_len + 1) * sizeof *path);
	if (!path)
		goto fail;
	{
		uint32_t open = 0; /* depth of the current path */
		const uint8_t *prev = NULL;
		size_t prev_len = 0;
		for (uint32_t k = 0; k < v->n_sorted; k++) {
			uint32_t t = v->sorted[k];
			const uint8_t *b = v->bytes + v->off[t];
			size_t len = v->off[t + 1] - v->off[t], lcp = 0;
			while (prev && lcp < len && lcp < prev_len && b[lcp] == prev[lcp])
				lcp++;
			for (; open > lcp; open--) {
				v->nodes[path[open]].next = v->n_nodes;
				v->nodes[path[open]].tok_hi = k;
			}
			for (size_t d = lcp + 1; d <= len; d++) {
				struct tnode *nd;
				if (GROW(v->nodes, cap_nodes, (size_t)v->n_nodes + 1))
					goto fail;
				nd = &v->nodes[v->n_nodes];
				nd->byte = b[d - 1];
				nd->depth = (uint16_t)d;
				nd->tok_lo = nd->tok_mid = k;
				path[d] = v->n_nodes++;
			}
			open = (uint32_t)len;
			v->nodes[path[len]].tok_mid = k + 1;
			prev = b;
			prev_len = len;
		}
		for (; open > 0; open--) {
			v->nodes[path[open]].next = v->n_nodes;
			v->nodes[path[open]].tok_hi = v->n_sorted;
		}
	}
	free(path);
	*ret = v;
	return 0;
fail:
	free(path);
	grammar_vocab_free(v);
	return rc;
}

static inline int vocab_has(const uint32_t *bits, int32_t t)
{
	return (bits[t >> 5] >> (t & 31)) & 1;
}

/* ---- the walker: interned stacks, sets of stacks and their transitions ---- */

/* A stack is a node: its top element and the node below.  Two nodes end
 * stacks: WN_EMPTY, the real bottom (an empty stack = the grammar is
 * complete), and WN_CUT, the cut of a table's top (what lies below is not
 * known: a stack that reaches it has finished the top's rules). */
#define WN_EMPTY 0u
#define WN_CUT 1u

struct wnode {
	uint32_t elem;   /* grammar element on top */
	uint32_t parent; /* node below */
	uint32_t depth;  /* elements down to the bottom marker */
	uint32_t adv;    /* 1 + offset in walker.adv of this node's closure, 0 = none yet */
};

#define WS_EMPTY 1u /* the set holds the empty stack */
#define WS_CUT 2u   /* the set holds the cut */

struct wset {
	uint32_t off;     /* first node id in walker.set_pool */
	uint32_t n;       /* node ids, ascending */
	uint32_t flags;   /* WS_* */
	uint32_t n_local; /* nodes other than WN_EMPTY and WN_CUT */
	uint32_t ascii;   /* 1 + offset in walker.ascii_pool of its 128 transitions, 0 = none */
};

/* A character being read: the bytes so far of an unfinished UTF-8 one. */
struct upart {
	uint32_t val; /* its bits so far */
	uint8_t n;    /* continuation bytes still to come; 0 = none pending */
	uint8_t lo;   /* allowed range of the next byte */
	uint8_t hi;
};

/* A trie walk's state after a node's byte. */
struct lvl {
	int32_t set;        /* set id after the complete characters */
	struct upart part;  /* the character being read */
};

struct tkey {
	uint64_t key; /* 1 + (set << 21 | code point) */
	int32_t val;  /* the set after it */
};

struct walker {
	const struct grammar *g;
	struct wnode *nodes;     /* (n_nodes) nodes 0 and 1 are WN_EMPTY and WN_CUT */
	size_t n_nodes, cap_nodes;
	uint32_t *node_tab;      /* (cap_node_tab) node id + 1; open addressing */
	size_t cap_node_tab;
	uint32_t *adv;           /* closures: a count then the node ids */
	size_t n_adv, cap_adv;
	struct wset *sets;       /* (n_sets) set 0 is the empty set: dead */
	size_t n_sets, cap_sets;
	uint32_t *set_pool;      /* the sets' node ids */
	size_t n_set_pool, cap_set_pool;
	uint32_t *set_tab;       /* (cap_set_tab) set id + 1 */
	size_t cap_set_tab;
	int32_t *ascii_pool;     /* 128 transitions per set, -1 = not computed */
	size_t n_ascii_pool, cap_ascii_pool;
	struct tkey *trans_tab;  /* (cap_trans_tab) non-ASCII transitions */
	size_t n_trans, cap_trans_tab;
	uint32_t *seen;          /* (cap_marks) generation stamps by node id */
	uint32_t *mark;          /* (cap_marks) another, for building sets */
	size_t cap_marks;
	uint32_t seen_gen, mark_gen;
	uint32_t *todo;          /* scratch: advance's work list */
	size_t n_todo, cap_todo;
	uint32_t *lst;           /* scratch: advance's result */
	size_t n_lst, cap_lst;
	uint32_t *lst2;          /* scratch: a set being built */
	size_t n_lst2, cap_lst2;
	struct lvl *lv;          /* (cap_lv) the trie walk's states by depth */
	size_t cap_lv;
	uint64_t work;           /* nodes made since the last reset */
};

#define WALKER_KEEP (1u << 16) /* tables bigger than this are freed on reset */

static void walker_release(struct walker *w)
{
	free(w->nodes);
	free(w->node_tab);
	free(w->adv);
	free(w->sets);
	free(w->set_pool);
	free(w->set_tab);
	free(w->ascii_pool);
	free(w->trans_tab);
	free(w->seen);
	free(w->mark);
	free(w->todo);
	free(w->lst);
	free(w->lst2);
	free(w->lv);
}

static void walker_free(struct walker *w)
{
	if (!w)
		return;
	walker_release(w);
	free(w);
}

static int w_intern_set(struct walker *w, uint32_t *ids, size_t n, int32_t *ret);
static int ensure_marks(struct walker *w);

/* Forgets every node and set (ids restart), keeping small tables. */
static int walker_reset(struct walker *w)
{
	int32_t dead;

	if (w->cap_node_tab > 2 * WALKER_KEEP || w->cap_set_tab > 2 * WALKER_KEEP ||
	    w->cap_trans_tab > 2 * WALKER_KEEP || w->cap_ascii_pool > 128 * WALKER_KEEP) {
		const struct grammar *g = w->g;
		struct lvl *lv = w->lv;
		size_t cap_lv = w->cap_lv;
		w->lv = NULL;
		walker_release(w);
		memset(w, 0, sizeof *w);
		w->g = g;
		w->lv = lv;
		w->cap_lv = cap_lv;
	}
	if (GROW(w->nodes, w->cap_nodes, 2) || ensure_marks(w))
		return -ENOMEM;
	memset(w->nodes, 0, 2 * sizeof *w->nodes);
	w->n_nodes = 2;
	w->work = 0;
	if (w->node_tab)
		memset(w->node_tab, 0, w->cap_node_tab * sizeof *w->node_tab);
	if (w->set_tab)
		memset(w->set_tab, 0, w->cap_set_tab * sizeof *w->set_tab);
	if (w->trans_tab)
		memset(w->trans_tab, 0, w->cap_trans_tab * sizeof *w->trans_tab);
	w->n_trans = 0;
	w->n_adv = 0;
	w->n_sets = 0;
	w->n_set_pool = 0;
	w->n_ascii_pool = 0;
	return w_intern_set(w, NULL, 0, &dead); /* set 0: dead */
}

/* The mark arrays as long as the node array. */
static int ensure_marks(struct walker *w)
{
	uint32_t *m;

	if (w->cap_marks >= w->cap_nodes)
		return 0;
	m = realloc(w->seen, w->cap_nodes * sizeof *m);
	if (!m)
		return -ENOMEM;
	w->seen = m;
	m = realloc(w->mark, w->cap_nodes * sizeof *m);
	if (!m)
		return -ENOMEM;
	w->mark = m;
	memset(w->seen + w->cap_marks, 0, (w->cap_nodes - w->cap_marks) * sizeof *m);
	memset(w->mark + w->cap_marks, 0, (w->cap_nodes - w->cap_marks) * sizeof *m);
	w->cap_marks = w->cap_nodes;
	return 0;
}

static inline uint64_t node_hash(uint32_t elem, uint32_t parent)
{
	return mix64(((uint64_t)elem << 32) | parent);
}

/* The node of ELEM on top of PARENT: its id, or a negative errno. */
static int64_t w_node(struct walker *w, uint32_t parent, uint32_t elem)
{
	size_t mask, i;
	uint32_t id;

	if (2 * (w->n_nodes + 1) > w->cap_node_tab) {
		size_t cap = w->cap_node_tab ? 2 * w->cap_node_tab : 256;
		uint32_t *t = calloc(cap, sizeof *t);
		if (!t)
			return -ENOMEM;
		for (size_t k = 0; k < w->cap_node_tab; k++) {
			uint32_t v = w->node_tab[k];
			if (!v)
				continue;
			i = node_hash(w->nodes[v - 1].elem, w->nodes[v - 1].parent) & (cap - 1);
			while (t[i])
				i = (i + 1) & (cap - 1);
			t[i] = v;
		}
		free(w->node_tab);
		w->node_tab = t;
		w->cap_node_tab = cap;
	}
	mask = w->cap_node_tab - 1;
	for (i = node_hash(elem, parent) & mask; w->node_tab[i]; i = (i + 1) & mask) {
		const struct wnode *nd = &w->nodes[w->node_tab[i] - 1];
		if (nd->elem == elem && nd->parent == parent)
			return w->node_tab[i] - 1;
	}
	if (w->nodes[parent].depth >= GRAMMAR_MAX_DEPTH || ++w->work > GRAMMAR_MAX_WORK)
		return -E2BIG;
	if (GROW(w->nodes, w->cap_nodes, w->n_nodes + 1) || ensure_marks(w))
		return -ENOMEM;
	id = (uint32_t)w->n_nodes++;
	w->nodes[id].elem = elem;
	w->nodes[id].parent = parent;
	w->nodes[id].depth = w->nodes[parent].depth + 1;
	w->nodes[id].adv = 0;
	w->node_tab[i] = id + 1;
	return id;
}

static inline void bump(uint32_t *gen, uint32_t *marks, size_t cap)
{
	if (++*gen == 0) {
		memset(marks, 0, cap * sizeof *marks);
		*gen = 1;
	}
}

/* The stacks whose top is a character (or that are empty or cut) that stack
 * S expands to, through the rules on its top: llama.cpp's advance_stack.
 * Their list lands at w->adv + *RET_OFF (a count, then node ids). */
static int w_advance(struct walker *w, uint32_t s, size_t *ret_off)
{
	const struct grammar *g = w->g;
	uint32_t steps = 0;
	size_t off;

	if (w->nodes[s].adv) {
		*ret_off = w->nodes[s].adv - 1;
		return 0;
	}
	bump(&w->seen_gen, w->seen, w->cap_marks);
	w->n_todo = 0;
	w->n_lst = 0;
	if (GROW(w->todo, w->cap_todo, 1))
		return -ENOMEM;
	w->todo[w->n_todo++] = s;
	while (w->n_todo) {
		uint32_t n = w->todo[--w->n_todo], parent, next;
		struct gelem ge;
		int64_t base;

		if (w->seen[n] == w->seen_gen)
			continue;
		w->seen[n] = w->seen_gen;
		ge = g->elems[w->nodes[n].elem];
		if (n <= WN_CUT || ge.type == GE_CHAR) {
			if (GROW(w->lst, w->cap_lst, w->n_lst + 1))
				return -ENOMEM;
			w->lst[w->n_lst++] = n;
			continue;
		}
		if (w->nodes[n].adv) { /* expanded before: take its closure */
			size_t c = w->nodes[n].adv - 1;
			for (uint32_t k = 1; k <= w->adv[c]; k++) {
				uint32_t m = w->adv[c + k];
				if (w->seen[m] == w->seen_gen)
					continue;
				w->seen[m] = w->seen_gen;
				if (GROW(w->lst, w->cap_lst, w->n_lst + 1))
					return -ENOMEM;
				w->lst[w->n_lst++] = m;
			}
			continue;
		}
		if (++steps > GRAMMAR_MAX_EXPAND)
			return -E2BIG;
		parent = w->nodes[n].parent;
		next = w->nodes[n].elem + 1;
		base = is_end(g, next) ? (int64_t)parent : w_node(w, parent, next);
		if (base < 0)
			return (int)base;
		for (uint32_t k = 0; k < g->rules[ge.arg].n_alts; k++) {
			uint32_t a = g->alts[g->rules[ge.arg].alt_off + k];
			int64_t s2 = is_end(g, a) ? base : w_node(w, (uint32_t)base, a);
			if (s2 < 0)
				return (int)s2;
			if (GROW(w->todo, w->cap_todo, w->n_todo + 1))
				return -ENOMEM;
			w->todo[w->n_todo++] = (uint32_t)s2;
		}
	}
	if (w->n_lst > GRAMMAR_MAX_STACKS)
		return -E2BIG;
	if (GROW(w->adv, w->cap_adv, w->n_adv + w->n_lst + 1))
		return -ENOMEM;
	off = w->n_adv;
	w->adv[off] = (uint32_t)w->n_lst;
	memcpy(w->adv + off + 1, w->lst, w->n_lst * sizeof *w->lst);
	w->n_adv += w->n_lst + 1;
	w->nodes[s].adv = (uint32_t)off + 1;
	*ret_off = off;
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The id of the set of the N node ids at IDS (sorted here, no duplicates). */
static int w_intern_set(struct walker *w, uint32_t *ids, size_t n, int32_t *ret)
{
	size_t mask, i;
	uint64_t h;
	struct wset *st;

	if (n > 1) {
		if (n <= 16) {
			for (size_t a = 1; a < n; a++) {
				uint32_t x = ids[a];
				size_t b = a;
				for (; b > 0 && ids[b - 1] > x; b--)
					ids[b] = ids[b - 1];
				ids[b] = x;
			}
		} else {
			qsort(ids, n, sizeof *ids, cmp_u32);
		}
	}
	if (2 * (w->n_sets + 1) > w->cap_set_tab) {
		size_t cap = w->cap_set_tab ? 2 * w->cap_set_tab : 256;
		uint32_t *t = calloc(cap, sizeof *t);
		if (!t)
			return -ENOMEM;
		for (size_t k = 0; k < w->cap_set_tab; k++) {
			uint32_t v = w->set_tab[k];
			const struct wset *o;
			if (!v)
				continue;
			o = &w->sets[v - 1];
			i = hash_words(w->set_pool + o->off, o->n) & (cap - 1);
			while (t[i])
				i = (i + 1) & (cap - 1);
			t[i] = v;
		}
		free(w->set_tab);
		w->set_tab = t;
		w->cap_set_tab = cap;
	}
	h = hash_words(ids, n);
	mask = w->cap_set_tab - 1;
	for (i = h & mask; w->set_tab[i]; i = (i + 1) & mask) {
		const struct wset *o = &w->sets[w->set_tab[i] - 1];
		if (o->n == n && (!n || !memcmp(w->set_pool + o->off, ids, n * sizeof *ids))) {
			*ret = (int32_t)(w->set_tab[i] - 1);
			return 0;
		}
	}
	if (w->n_set_pool + n > GRAMMAR_MAX_WORK)
		return -E2BIG;
	if (GROW(w->sets, w->cap_sets, w->n_sets + 1) ||
	    GROW(w->set_pool, w->cap_set_pool, w->n_set_pool + n + 1))
		return -ENOMEM;
	st = &w->sets[w->n_sets];
	st->off = (uint32_t)w->n_set_pool;
	st->n = (uint32_t)n;
	st->flags = 0;
	st->n_local = 0;
	st->ascii = 0;
	for (size_t k = 0; k < n; k++) {
		if (ids[k] == WN_EMPTY)
			st->flags |= WS_EMPTY;
		else if (ids[k] == WN_CUT)
			st->flags |= WS_CUT;
		else
			st->n_local++;
	}
	if (n)
		memcpy(w->set_pool + w->n_set_pool, ids, n * sizeof *ids);
	w->n_set_pool += n;
	w->set_tab[i] = (uint32_t)w->n_sets + 1;
	*ret = (int32_t)w->n_sets++;
	return 0;
}

/* The set after SET reads code point CP: its id (0 = none survives), or a
 * negative errno. */
static int32_t w_trans_slow(struct walker *w, int32_t set, uint32_t cp)
{
	const struct grammar *g = w->g;
	int32_t out;
	int rc;

	bump(&w->mark_gen, w->mark, w->cap_marks);
	w->n_lst2 = 0;
	for (uint32_t k = 0; k < w->sets[set].n; k++) {
		uint32_t n = w->set_pool[w->sets[set].off + k], e, parent;
		int64_t s;
		size_t off;

		if (n <= WN_CUT)
			continue;
		e = w->nodes[n].elem;
		if (!class_has(g, g->elems[e].arg, cp))
			continue;
		parent = w->nodes[n].parent;
		s = is_end(g, e + 1) ? (int64_t)parent : w_node(w, parent, e + 1);
		if (s < 0)
			return (int32_t)s;
		if ((rc = w_advance(w, (uint32_t)s, &off)) < 0)
			return rc;
		for (uint32_t j = 1; j <= w->adv[off]; j++) {
			uint32_t m = w->adv[off + j];
			if (w->mark[m] == w->mark_gen)
				continue;
			w->mark[m] = w->mark_gen;
			if (GROW(w->lst2, w->cap_lst2, w->n_lst2 + 1))
				return -ENOMEM;
			w->lst2[w->n_lst2++] = m;
		}
	}
	if (w->n_lst2 > GRAMMAR_MAX_STACKS)
		return -E2BIG;
	if ((rc = w_intern_set(w, w->lst2, w->n_lst2, &out)) < 0)
		return rc;
	return out;
}

static int32_t w_trans(struct walker *w, int32_t set, uint32_t cp)
{
	int32_t r;

	if (cp < 128) {
		uint32_t a = w->sets[set].ascii;
		if (a && w->ascii_pool[a - 1 + cp] >= 0)
			return w->ascii_pool[a - 1 + cp];
		r = w_trans_slow(w, set, cp);
		if (r < 0)
			return r;
		if (!w->sets[set].ascii) {
			if (GROW(w->ascii_pool, w->cap_ascii_pool, w->n_ascii_pool + 128))
				return -ENOMEM;
			for (int k = 0; k < 128; k++)
				w->ascii_pool[w->n_ascii_pool + k] = -1;
			w->sets[set].ascii = (uint32_t)w->n_ascii_pool + 1;
			w->n_ascii_pool += 128;
		}
		w->ascii_pool[w->sets[set].ascii - 1 + cp] = r;
		return r;
	}
	{
		uint64_t key = (((uint64_t)set << 21) | cp) + 1;
		size_t mask, i;
		if (w->cap_trans_tab) {
			mask = w->cap_trans_tab - 1;
			for (i = mix64(key) & mask; w->trans_tab[i].key; i = (i + 1) & mask)
				if (w->trans_tab[i].key == key)
					return w->trans_tab[i].val;
		}
		r = w_trans_slow(w, set, cp);
		if (r < 0)
			return r;
		if (2 * (w->n_trans + 1) > w->cap_trans_tab) {
			size_t cap = w->cap_trans_tab ? 2 * w->cap_trans_tab : 256;
			struct tkey *t = calloc(cap, sizeof *t);
			if (!t)
				return -ENOMEM;
			for (size_t k = 0; k < w->cap_trans_tab; k++) {
				if (!w->trans_tab[k].key)
					continue;
				i = mix64(w->trans_tab[k].key) & (cap - 1);
				while (t[i].key)
					i = (i + 1) & (cap - 1);
				t[i] = w->trans_tab[k];
			}
			free(w->trans_tab);
			w->trans_tab = t;
			w->cap_trans_tab = cap;
		}
		mask = w->cap_trans_tab - 1;
		for (i = mix64(key) & mask; w->trans_tab[i].key; i = (i + 1) & mask)
			;
		w->trans_tab[i].key = key;
		w->trans_tab[i].val = r;
		w->n_trans++;
		return r;
	}
}

/* 1 if some stack of SET can take a character that P's bytes begin. */
static int w_partial_ok(const struct walker *w, int32_t set, const struct upart *p)
{
	const struct grammar *g = w->g;
	uint32_t a = (p->val << 6) | (p->lo & 0x3fu), b = (p->val << 6) | (p->hi & 0x3fu);

	for (int k = 1; k < p->n; k++) {
		a <<= 6;
		b = (b << 6) | 0x3f;
	}
	for (uint32_t k = 0; k < w->sets[set].n; k++) {
		uint32_t n = w->set_pool[w->sets[set].off + k];
		if (n > WN_CUT && class_overlaps(g, g->elems[w->nodes[n].elem].arg, a, b))
			return 1;
	}
	return 0;
}

/* Reads byte B after state *FROM into *TO: 1 if a code point completed (in
 * *CP), 0 if one is still pending, -1 if the byte cannot come here. */
static inline int utf8_step(const struct upart *from, uint8_t b, struct upart *to, uint32_t *cp)
{
	if (from->n == 0) {
		uint8_t lo, hi;
		int need;
		if (b < 0x80) {
			*cp = b;
			to->n = 0;
			return 1;
		}
		need = utf8_lead(b, &lo, &hi);
		if (!need)
			return -1;
		to->val = b & (0x3fu >> need);
		to->n = (uint8_t)need;
		to->lo = lo;
		to->hi = hi;
		return 0;
	}
	if (b < from->lo || b > from->hi)
		return -1;
	if (from->n == 1) {
		*cp = (from->val << 6) | (b & 0x3fu);
		to->n = 0;
		return 1;
	}
	to->val = (from->val << 6) | (b & 0x3fu);
	to->n = (uint8_t)(from->n - 1);
	to->lo = 0x80;
	to->hi = 0xbf;
	return 0;
}

/* Steps SET through LEN bytes at S with *P pending before them.  Returns the
 * set after (0 when no stack can take them, including a last unfinished
 * character that no stack could take), *P updated; or a negative errno. */
static int32_t w_run(struct walker *w, int32_t set, struct upart *p, const uint8_t *s, size_t len)
{
	struct upart cur = *p;

	for (size_t i = 0; i < len; i++) {
		uint32_t cp = 0;
		int r = utf8_step(&cur, s[i], &cur, &cp);
		if (r < 0)
			return 0;
		if (r == 1) {
			set = w_trans(w, set, cp);
			if (set <= 0)
				return set;
		} else if (!w_partial_ok(w, set, &cur)) {
			return 0;
		}
	}
	*p = cur;
	return set;
}

/* The node of the stack ELEMS[0..N) (bottom first) on BOTTOM. */
static int64_t w_stack(struct walker *w, uint32_t bottom, const uint32_t *elems, size_t n)
{
	int64_t node = bottom;

	for (size_t i = 0; i < n && node >= 0; i++)
		node = w_node(w, (uint32_t)node, elems[i]);
	return node;
}

/* ---- the trie walk: which tokens a set of stacks takes ---- */

struct gctx {
	uint32_t tok; /* token id */
	uint32_t off; /* its bytes from here on are read by the stack below the cut */
};

struct ctxbuf {
	struct gctx *e; /* (n) */
	size_t n, cap;
};

#define WALK_DEEPEN 1

/* Walks V's trie from set START with P0 pending: sets in ACC the tokens some
 * stack takes whole, and lists in CTX (when the set holds cut stacks) the
 * tokens that reach the cut with bytes left.  Returns 0, WALK_DEEPEN when the
 * list passes CTX_MAX, or a negative errno. */
static int walk_trie(struct walker *w, const struct grammar_vocab *v, int32_t start,
		     struct upart p0, uint32_t *acc, struct ctxbuf *ctx)
{
	const struct tnode *nodes = v->nodes;
	const uint32_t *sorted = v->sorted;
	struct lvl *lv;
	uint32_t i = 0;

	if (GROW(w->lv, w->cap_lv, (size_t)v->max_len + 1))
		return -ENOMEM;
	lv = w->lv;
	lv[0].set = start;
	lv[0].part = p0;
	while (i < v->n_nodes) {
		const struct tnode *nd = &nodes[i];
		const struct lvl *pl = &lv[nd->depth - 1];
		struct lvl *cl = &lv[nd->depth];
		uint32_t cp = 0;
		int r = utf8_step(&pl->part, nd->byte, &cl->part, &cp);

		if (r < 0)
			goto dead;
		if (r == 0) {
			cl->set = pl->set;
			if (!w_partial_ok(w, cl->set, &cl->part))
				goto dead;
		} else {
			int32_t s = w_trans(w, pl->set, cp);
			if (s < 0)
				return s;
			if (s == 0)
				goto dead;
			cl->set = s;
		}
		for (uint32_t k = nd->tok_lo; k < nd->tok_mid; k++)
			acc[sorted[k] >> 5] |= 1u << (sorted[k] & 31);
		if (r == 1) {
			const struct wset *st = &w->sets[cl->set];
			if ((st->flags & WS_CUT) && nd->tok_mid < nd->tok_hi) {
				if (ctx->n + (nd->tok_hi - nd->tok_mid) > CTX_MAX(v->n_vocab))
					return WALK_DEEPEN;
				if (GROW(ctx->e, ctx->cap, ctx->n + (nd->tok_hi - nd->tok_mid)))
					return -ENOMEM;
				for (uint32_t k = nd->tok_mid; k < nd->tok_hi; k++) {
					ctx->e[ctx->n].tok = sorted[k];
					ctx->e[ctx->n].off = nd->depth;
					ctx->n++;
				}
			}
			if (!st->n_local)
				goto dead; /* nothing here reads further */
		}
		i++;
		continue;
dead:
		i = nd->next;
	}
	return 0;
}

/* ---- the cache a state shares with its clones ---- */

enum { KEY_TABLE = 1, KEY_MASK = 2 };

/* A cached table (KEY_TABLE) or mask (KEY_MASK); one allocation. */
struct centry {
	uint64_t hash;     /* of key */
	uint32_t key_n;    /* words of key */
	uint32_t *key;     /* (key_n) KEY_*, then the position (see state_mask) */
	uint32_t *bits;    /* (n_words) the mask, or the tokens a table's top
	                      takes whole; NULL for a table cut lower */
	int32_t count;     /* allowed tokens of a mask */
	uint32_t w_lo;     /* bits' words w_lo..w_hi-1 hold every set bit */
	uint32_t w_hi;
	uint32_t n_ctx;    /* tokens that leave a table's top, to check below */
	struct gctx *ctx;  /* (n_ctx) */
	size_t bytes;      /* the allocation's size */
};

struct gshared {
	const struct grammar *g;     /* not owned */
	const struct grammar_vocab *v; /* not owned */
	atomic_uint refs;            /* states that share this */
	pthread_mutex_t lock;        /* guards everything below */
	struct centry **slots;       /* (cap) open addressing, NULL = free */
	size_t cap, n;
	size_t bytes;                /* entries' bytes */
	struct grammar_stats st;     /* counters */
	uint32_t *tsuf;              /* (g->n_elems) tokens of V from each element
	                                to its alternative's end (token_costs) */
};

static void cache_flush(struct gshared *sh)
{
	for (size_t i = 0; i < sh->cap; i++) {
		free(sh->slots[i]);
		sh->slots[i] = NULL;
	}
	sh->n = 0;
	sh->bytes = 0;
}

static struct centry *cache_find(struct gshared *sh, const uint32_t *key, uint32_t n, uint64_t h)
{
	size_t mask, i;

	if (!sh->cap)
		return NULL;
	mask = sh->cap - 1;
	for (i = h & mask; sh->slots[i]; i = (i + 1) & mask) {
		const struct centry *e = sh->slots[i];
		if (e->hash == h && e->key_n == n && !memcmp(e->key, key, n * sizeof *key))
			return sh->slots[i];
	}
	return NULL;
}

/* Puts E in the cache (which then owns it) and returns the entry for its key:
 * E, or one another state put first (E is then freed).  With the lock held. */
static struct centry *cache_put(struct gshared *sh, struct centry *e)
{
	struct centry *old = cache_find(sh, e->key, e->key_n, e->hash);
	size_t mask, i;

	if (old) {
		free(e);
		return old;
	}
	if (sh->bytes + e->bytes > GRAMMAR_CACHE_BYTES) {
		cache_flush(sh);
		sh->st.flushes++;
	}
	if (2 * (sh->n + 1) > sh->cap) {
		size_t cap = sh->cap ? 2 * sh->cap : 64;
		struct centry **t = calloc(cap, sizeof *t);
		if (!t) { /* keep working without caching this one */
			cache_flush(sh);
			if (!sh->cap) {
				free(e);
				return NULL;
			}
		} else {
			for (size_t k = 0; k < sh->cap; k++) {
				if (!sh->slots[k])
					continue;
				i = sh->slots[k]->hash & (cap - 1);
				while (t[i])
					i = (i + 1) & (cap - 1);
				t[i] = sh->slots[k];
			}
			free(sh->slots);
			sh->slots = t;
			sh->cap = cap;
		}
	}
	mask = sh->cap - 1;
	for (i = e->hash & mask; sh->slots[i]; i = (i + 1) & mask)
		;
	sh->slots[i] = e;
	sh->n++;
	sh->bytes += e->bytes;
	return e;
}

static struct centry *centry_new(const uint32_t *key, uint32_t key_n, size_t n_words,
				 int with_bits, size_t n_ctx)
{
	size_t bytes = sizeof(struct centry) + key_n * sizeof(uint32_t) +
		       (with_bits ? n_words * sizeof(uint32_t) : 0) + n_ctx * sizeof(struct gctx);
	struct centry *e = calloc(1, bytes + sizeof(struct gctx));
	uint8_t *p;

	if (!e)
		return NULL;
	p = (uint8_t *)(e + 1);
	e->ctx = (struct gctx *)p;  /* gctx first: the strictest alignment */
	p += n_ctx * sizeof(struct gctx);
	e->key = (uint32_t *)p;
	memcpy(e->key, key, key_n * sizeof *key);
	p += key_n * sizeof(uint32_t);
	e->bits = with_bits ? (uint32_t *)p : NULL;
	e->key_n = key_n;
	e->hash = hash_words(key, key_n);
	e->n_ctx = (uint32_t)n_ctx;
	e->bytes = bytes;
	return e;
}

/* ---- the end in tokens ---- */

#define COST_INF (UINT32_MAX / 4)

static inline uint32_t cost_add(uint32_t a, uint32_t b)
{
	return a >= COST_INF || b >= COST_INF || a + b >= COST_INF ? COST_INF : a + b;
}

/* A min-heap of (cost << 32 | alternative). */
static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
	size_t i = (*n)++;

	while (i > 0 && h[(i - 1) / 2] > v) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
	uint64_t top = h[0], v = h[--*n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && h[c + 1] < h[c])
			c++;
		if (h[c] >= v)
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = v;
	return top;
}

/* RMIN[r]: the least cost of a text of rule r (COST_INF: it derives none),
 * where an alternative costs BASE[a] (its characters) plus its rules' costs.
 * Knuth's generalization of Dijkstra's algorithm: a rule's cost is final
 * when it is the least of those not yet final; an alternative's is known
 * once every rule it names is final.  0 or -ENOMEM. */
static int shortest_rules(const struct grammar *g, const uint32_t *base, uint32_t *rmin)
{
	uint32_t na = g->n_alts, nr = g->n_rules, n_refs = 0;
	uint32_t *sum = malloc((na + 1) * sizeof *sum), *pending = calloc(na + 1, sizeof *pending);
	uint32_t *occ_off = calloc(nr + 2, sizeof *occ_off), *occ = NULL;
	uint64_t *heap = malloc((na + 1) * sizeof *heap);
	size_t n_heap = 0;
	int rc = -ENOMEM;

	if (!sum || !pending || !occ_off || !heap)
		goto out;
	for (uint32_t a = 0; a < na; a++) {
		sum[a] = base[a];
		for (uint32_t i = g->alts[a]; !is_end(g, i); i++)
			if (g->elems[i].type == GE_REF) {
				pending[a]++;
				occ_off[g->elems[i].arg + 2]++;
				n_refs++;
			}
	}
	for (uint32_t r = 0; r < nr; r++) {
		occ_off[r + 2] += occ_off[r + 1];
		rmin[r] = COST_INF;
	}
	if (!(occ = malloc((n_refs + 1) * sizeof *occ)))
		goto out;
	for (uint32_t a = 0; a < na; a++) {
		for (uint32_t i = g->alts[a]; !is_end(g, i); i++)
			if (g->elems[i].type == GE_REF)
				occ[occ_off[g->elems[i].arg + 1]++] = a;
		if (!pending[a] && sum[a] < COST_INF)
			heap_push(heap, &n_heap, (uint64_t)sum[a] << 32 | a);
	}
	/* occ_off[r] .. occ_off[r + 1] are now rule r's occurrences */
	while (n_heap) {
		uint64_t v = heap_pop(heap, &n_heap);
		uint32_t r = g->elem_rule[g->alts[(uint32_t)v]];
		if (rmin[r] < COST_INF)
			continue;
		rmin[r] = (uint32_t)(v >> 32);
		for (uint32_t k = occ_off[r]; k < occ_off[r + 1]; k++) {
			uint32_t a = occ[k];
			sum[a] = cost_add(sum[a], rmin[r]);
			if (--pending[a] == 0 && sum[a] < COST_INF)
				heap_push(heap, &n_heap, (uint64_t)sum[a] << 32 | a);
		}
	}
	rc = 0;
out:
	free(sum);
	free(pending);
	free(occ_off);
	free(occ);
	free(heap);
	return rc;
}

/* The code point of class CLS that shortest texts use: a printable ASCII one
 * where there is one (tokens never hold NUL), else the first. */
static uint32_t class_text_cp(const struct grammar *g, uint32_t cls)
{
	const struct gclass *c = &g->classes[cls];
	const uint32_t *r = g->ranges + 2 * (size_t)c->off;

	for (uint32_t cp = 0x20; cp < 0x80; cp++)
		if ((c->ascii[cp >> 5] >> (cp & 31)) & 1)
			return cp;
	for (uint32_t cp = 0; cp < 0x20; cp++)
		if ((c->ascii[cp >> 5] >> (cp & 31)) & 1)
			return cp;
	for (uint32_t i = 0; i < c->n; i++)
		if (r[2 * i + 1] >= 0x80)
			return r[2 * i] < 0x80 ? 0x80 : r[2 * i];
	return 0;
}

/* BEST[p] for p < LEN: the fewest tokens of V that spell TEXT[p..LEN), or
 * LEN - p (a byte a token) where none do; BEST[LEN] = 0. */
static void spell(const struct grammar_vocab *v, const uint8_t *text, size_t len, uint32_t *best)
{
	best[len] = 0;
	for (size_t p = len; p-- > 0;) {
		uint32_t i = 0, end = v->n_nodes, b = COST_INF;
		for (size_t d = 0; p + d < len; d++) {
			while (i < end && v->nodes[i].byte != text[p + d])
				i = v->nodes[i].next;
			if (i >= end)
				break;
			if (v->nodes[i].tok_mid > v->nodes[i].tok_lo && best[p + d + 1] + 1 < b)
				b = best[p + d + 1] + 1;
			end = v->nodes[i].next;
			i++;
		}
		best[p] = b < COST_INF ? b : (uint32_t)(len - p);
	}
}

/* SH->tsuf: for each element, the tokens of the vocabulary that take its
 * alternative from it to its end along the shortest texts.  Each run of
 * characters is spelt as the fewest tokens (a token never crosses into or out
 * of a rule), each rule costs its cheapest alternative.  So a stack's cost is
 * a way to end that exists (the sum over its elements), and the first token
 * of that way leaves a stack that costs one token less: a sampler that keeps
 * the cost within the tokens left always has a token to go on with. */
static int token_costs(struct gshared *sh)
{
	const struct grammar *g = sh->g;
	uint32_t *base = calloc(g->n_alts + 1, sizeof *base);
	uint32_t *rmin = malloc((g->n_rules + 1) * sizeof *rmin);
	uint32_t *run = malloc((g->n_elems + 1) * sizeof *run), *best = NULL, *eoff = NULL;
	uint8_t *text = NULL;
	size_t cap_best = 0, cap_eoff = 0, cap_text = 0;
	int rc = -ENOMEM;

	sh->tsuf = malloc((g->n_elems + 1) * sizeof *sh->tsuf);
	if (!base || !rmin || !run || !sh->tsuf)
		goto out;
	/* run[i]: the tokens from character i to the end of its run */
	for (uint32_t a = 0; a < g->n_alts; a++) {
		uint32_t i = g->alts[a];
		while (!is_end(g, i)) {
			uint32_t j = i;
			size_t n = 0;
			if (g->elems[i].type != GE_CHAR) {
				i++;
				continue;
			}
			while (g->elems[j].type == GE_CHAR)
				j++;
			if (GROW(text, cap_text, 4 * (size_t)(j - i) + 1) ||
			    GROW(eoff, cap_eoff, (size_t)(j - i) + 1) ||
			    GROW(best, cap_best, 4 * (size_t)(j - i) + 1))
				goto out;
			for (uint32_t k = i; k < j; k++) {
				eoff[k - i] = (uint32_t)n;
				n += utf8_encode(text + n, class_text_cp(g, g->elems[k].arg));
			}
			spell(sh->v, text, n, best);
			for (uint32_t k = i; k < j; k++)
				run[k] = best[eoff[k - i]];
			base[a] = cost_add(base[a], run[i]);
			i = j;
		}
	}
	if ((rc = shortest_rules(g, base, rmin)) < 0)
		goto out;
	for (uint32_t i = g->n_elems, run_end = 0; i-- > 0;) {
		const struct gelem *e = &g->elems[i];
		if (is_end(g, i)) {
			sh->tsuf[i] = 0;
			run_end = i;
		} else if (e->type == GE_REF) {
			sh->tsuf[i] = cost_add(rmin[e->arg], sh->tsuf[i + 1]);
			run_end = i;
		} else {
			sh->tsuf[i] = cost_add(run[i], sh->tsuf[run_end]);
		}
	}
	rc = 0;
out:
	if (rc < 0) {
		free(sh->tsuf);
		sh->tsuf = NULL;
	}
	free(base);
	free(rmin);
	free(run);
	free(best);
	free(eoff);
	free(text);
	return rc;
}

static void shared_unref(struct gshared *sh)
{
	if (!sh || atomic_fetch_sub(&sh->refs, 1) != 1)
		return;
	cache_flush(sh);
	free(sh->slots);
	free(sh->tsuf);
	pthread_mutex_destroy(&sh->lock);
	free(sh);
}

/* ---- states ---- */

struct grammar_state {
	struct gshared *sh;      /* the cache, shared with clones; counted */
	uint32_t *elems;         /* the stacks' elements, bottom first, back to back */
	size_t n_elems, cap_elems;
	uint32_t *offs;          /* (n_stacks + 1) stack i is elems[offs[i]..offs[i+1]);
	                            sorted by length, then elements */
	size_t n_stacks, cap_offs;
	struct upart part;       /* a character the tokens so far left unfinished */
	int ended;               /* an EOG token was accepted */
	struct walker *w;        /* scratch for trie walks (grows big), made on first
	                            use; not shared */
	struct walker *wa;       /* scratch for accepts and checks below a cut
	                            (stays small, cheap to reset) */
	uint32_t *key;           /* scratch: a cache key */
	size_t cap_key;
	struct ctxbuf ctx;       /* scratch: a table's tokens to check below */
};

/* A reset walker in *SLOT, made on first use. */
static int state_walker(struct grammar_state *s, struct walker **slot)
{
	if (!*slot) {
		*slot = calloc(1, sizeof **slot);
		if (!*slot)
			return -ENOMEM;
		(*slot)->g = s->sh->g;
	}
	return walker_reset(*slot);
}

/* The state's stacks as nodes of walker W (just reset) and their set. */
static int state_load(struct grammar_state *s, struct walker *w, int32_t *ret)
{

	w->n_lst2 = 0;
	for (size_t i = 0; i < s->n_stacks; i++) {
		int64_t n = w_stack(w, WN_EMPTY, s->elems + s->offs[i], s->offs[i + 1] - s->offs[i]);
		if (n < 0)
			return (int)n;
		if (GROW(w->lst2, w->cap_lst2, w->n_lst2 + 1))
			return -ENOMEM;
		w->lst2[w->n_lst2++] = (uint32_t)n;
	}
	return w_intern_set(w, w->lst2, w->n_lst2, ret);
}

struct stack_sort {
	const uint32_t *elems; /* the stacks' elements */
	const uint32_t *offs;  /* their bounds */
};

static int cmp_stacks(const void *a, const void *b, void *arg)
{
	const struct stack_sort *ss = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	uint32_t lx = ss->offs[x + 1] - ss->offs[x], ly = ss->offs[y + 1] - ss->offs[y];

	if (lx != ly)
		return lx < ly ? -1 : 1;
	for (uint32_t i = 0; i < lx; i++) {
		uint32_t ex = ss->elems[ss->offs[x] + i], ey = ss->elems[ss->offs[y] + i];
		if (ex != ey)
			return ex < ey ? -1 : 1;
	}
	return 0;
}

/* Replaces the state's stacks with those of W's set SET, in canonical order. */
static int state_store(struct grammar_state *s, const struct walker *w, int32_t set)
{
	const struct wset *st = &w->sets[set];
	uint32_t *elems = NULL, *offs = NULL, *order = NULL, *out = NULL, *ooffs = NULL;
	size_t total = 0;
	struct stack_sort ss;

	for (uint32_t k = 0; k < st->n; k++)
		total += w->nodes[w->set_pool[st->off + k]].depth;
	elems = malloc((total + 1) * sizeof *elems);
	offs = malloc((st->n + 1) * sizeof *offs);
	order = malloc((st->n + 1) * sizeof *order);
	out = malloc((total + 1) * sizeof *out);
	ooffs = malloc((st->n + 1) * sizeof *ooffs);
	if (!elems || !offs || !order || !out || !ooffs)
		goto nomem;
	total = 0;
	for (uint32_t k = 0; k < st->n; k++) {
		uint32_t n = w->set_pool[st->off + k], d = w->nodes[n].depth;
		offs[k] = (uint32_t)total;
		for (uint32_t j = d; j > 0; j--, n = w->nodes[n].parent)
			elems[total + j - 1] = w->nodes[n].elem;
		total += d;
		order[k] = k;
	}
	offs[st->n] = (uint32_t)total;
	ss.elems = elems;
	ss.offs = offs;
	qsort_r(order, st->n, sizeof *order, cmp_stacks, &ss);
	total = 0;
	for (uint32_t k = 0; k < st->n; k++) {
		uint32_t a = offs[order[k]], b = offs[order[k] + 1];
		ooffs[k] = (uint32_t)total;
		memcpy(out + total, elems + a, (b - a) * sizeof *out);
		total += b - a;
	}
	ooffs[st->n] = (uint32_t)total;
	free(elems);
	free(offs);
	free(order);
	free(s->elems);
	free(s->offs);
	s->elems = out;
	s->n_elems = total;
	s->cap_elems = total + 1;
	s->offs = ooffs;
	s->n_stacks = st->n;
	s->cap_offs = st->n + 1;
	return 0;
nomem:
	free(elems);
	free(offs);
	free(order);
	free(out);
	free(ooffs);
	return -ENOMEM;
}

static struct grammar_state *state_alloc(void)
{
	return calloc(1, sizeof(struct grammar_state));
}

void grammar_state_free(struct grammar_state *s)
{
	if (!s)
		return;
	shared_unref(s->sh);
	free(s->elems);
	free(s->offs);
	walker_free(s->w);
	walker_free(s->wa);
	free(s->key);
	free(s->ctx.e);
	free(s);
}

int grammar_state_new(const struct grammar *g, const struct grammar_vocab *v,
		      struct grammar_state **ret)
{
	struct grammar_state *s = state_alloc();
	struct gshared *sh = calloc(1, sizeof *sh);
	struct walker *w;
	int32_t set;
	int rc = -ENOMEM;

	if (!s || !sh) {
		free(s);
		free(sh);
		return -ENOMEM;
	}
	sh->g = g;
	sh->v = v;
	if (token_costs(sh) < 0) {
		free(sh);
		free(s);
		return -ENOMEM;
	}
	atomic_init(&sh->refs, 1);
	if (pthread_mutex_init(&sh->lock, NULL)) {
		free(sh->tsuf);
		free(sh);
		free(s);
		return -ENOMEM;
	}
	s->sh = sh;
	if ((rc = state_walker(s, &s->wa)) < 0)
		goto fail;
	w = s->wa;
	/* the root's alternatives, advanced to their first characters */
	w->n_lst2 = 0;
	for (uint32_t k = 0; k < g->rules[g->root].n_alts; k++) {
		uint32_t a = g->alts[g->rules[g->root].alt_off + k];
		int64_t n = is_end(g, a) ? (int64_t)WN_EMPTY : w_node(w, WN_EMPTY, a);
		size_t off;
		if (n < 0) {
			rc = (int)n;
			goto fail;
		}
		if ((rc = w_advance(w, (uint32_t)n, &off)) < 0)
			goto fail;
		for (uint32_t j = 1; j <= w->adv[off]; j++) {
			uint32_t m = w->adv[off + j], dup = 0;
			for (size_t q = 0; q < w->n_lst2; q++)
				dup |= w->lst2[q] == m;
			if (dup)
				continue;
			if (GROW(w->lst2, w->cap_lst2, w->n_lst2 + 1))
				goto fail;
			w->lst2[w->n_lst2++] = m;
		}
	}
	rc = -E2BIG;
	if (w->n_lst2 > GRAMMAR_MAX_STACKS)
		goto fail;
	if ((rc = w_intern_set(w, w->lst2, w->n_lst2, &set)) < 0 ||
	    (rc = state_store(s, w, set)) < 0)
		goto fail;
	*ret = s;
	return 0;
fail:
	grammar_state_free(s);
	return rc;
}

int grammar_state_clone(const struct grammar_state *s, struct grammar_state **ret)
{
	struct grammar_state *c = state_alloc();

	if (!c)
		return -ENOMEM;
	c->elems = malloc((s->n_elems + 1) * sizeof *c->elems);
	c->offs = malloc((s->n_stacks + 1) * sizeof *c->offs);
	if (!c->elems || !c->offs) {
		free(c->elems);
		free(c->offs);
		free(c);
		return -ENOMEM;
	}
	memcpy(c->elems, s->elems, s->n_elems * sizeof *c->elems);
	memcpy(c->offs, s->offs, (s->n_stacks + 1) * sizeof *c->offs);
	c->n_elems = s->n_elems;
	c->cap_elems = s->n_elems + 1;
	c->n_stacks = s->n_stacks;
	c->cap_offs = s->n_stacks + 1;
	c->part = s->part;
	c->ended = s->ended;
	c->sh = s->sh;
	atomic_fetch_add(&s->sh->refs, 1);
	*ret = c;
	return 0;
}

int grammar_state_can_end(const struct grammar_state *s)
{
	if (s->ended)
		return 0;
	/* stacks are sorted by length: an empty one comes first */
	return s->part.n == 0 && s->n_stacks > 0 && s->offs[1] == 0;
}

int grammar_state_done(const struct grammar_state *s)
{
	return s->ended || (grammar_state_can_end(s) && s->n_stacks == 1);
}

void grammar_state_stats(const struct grammar_state *s, struct grammar_stats *ret)
{
	pthread_mutex_lock(&s->sh->lock);
	*ret = s->sh->st;
	ret->cache_bytes = s->sh->bytes;
	pthread_mutex_unlock(&s->sh->lock);
}

/* What the end costs from each element, in tokens. */
static inline const uint32_t *cost_table(const struct gshared *sh)
{
	return sh->tsuf;
}

/* Tokens the shortest completion of the stack ELEMS[0..N) needs with *PART
 * pending (the top is a character: its class's text, or the rest of the
 * pending one, a byte a token). */
static uint32_t stack_cost(const uint32_t *cost, const uint32_t *elems, size_t n,
			   const struct upart *part)
{
	uint32_t c = 0;

	if (!n)
		return part->n ? COST_INF : 0;
	for (size_t i = 0; i + 1 < n; i++)
		c = cost_add(c, cost[elems[i]]);
	return cost_add(c, part->n ? cost_add(part->n, cost[elems[n - 1] + 1]) : cost[elems[n - 1]]);
}

/* Tokens the walker's SET (with *PART pending) needs at most to end: its
 * shortest completion, and an EOG token unless the set is done (the empty
 * stack alone). */
static uint32_t set_need(const struct walker *w, const uint32_t *cost, int32_t set,
			 const struct upart *part)
{
	const struct wset *st = &w->sets[set];
	uint32_t best = COST_INF;
	int other = 0;

	for (uint32_t k = 0; k < st->n; k++) {
		uint32_t n = w->set_pool[st->off + k], c, e;
		if (n == WN_EMPTY) {
			if (!part->n)
				best = 0;
			continue;
		}
		other = 1;
		if (n == WN_CUT)
			continue;
		e = w->nodes[n].elem;
		c = part->n ? cost_add(part->n, cost[e + 1]) : cost[e];
		for (uint32_t m = w->nodes[n].parent; m > WN_CUT && c < best; m = w->nodes[m].parent)
			c = cost_add(c, cost[w->nodes[m].elem]);
		if (c < best)
			best = c;
	}
	return best == 0 && !other ? 0 : cost_add(best, 1);
}

static inline int fits(uint32_t need, uint32_t budget)
{
	return need < COST_INF && need <= budget;
}

uint32_t grammar_state_end_cost(const struct grammar_state *s)
{
	const uint32_t *cost = cost_table(s->sh);
	uint32_t best = COST_INF;

	if (s->ended)
		return 0;
	for (size_t i = 0; i < s->n_stacks && best; i++) {
		uint32_t c = stack_cost(cost, s->elems + s->offs[i], s->offs[i + 1] - s->offs[i],
					&s->part);
		if (c < best)
			best = c;
	}
	return best >= COST_INF ? GRAMMAR_COST_INF : best;
}

/* Advances S past LEN bytes if then it needs at most BUDGET tokens to end
 * (UINT32_MAX: whatever it needs). */
static int state_run(struct grammar_state *s, const void *bytes, size_t len, uint32_t budget)
{
	struct upart p = s->part;
	int32_t set;
	int rc;

	if (s->ended)
		return -EINVAL;
	if (!len)
		return 0;
	if ((rc = state_walker(s, &s->wa)) < 0 || (rc = state_load(s, s->wa, &set)) < 0)
		return rc;
	set = w_run(s->wa, set, &p, bytes, len);
	if (set < 0)
		return set;
	if (set == 0)
		return -EINVAL;
	if (budget != UINT32_MAX && !fits(set_need(s->wa, cost_table(s->sh), set, &p), budget))
		return -ERANGE;
	if ((rc = state_store(s, s->wa, set)) < 0)
		return rc;
	s->part = p;
	return 0;
}

int grammar_state_accept_bytes(struct grammar_state *s, const void *bytes, size_t len)
{
	return state_run(s, bytes, len, UINT32_MAX);
}

int grammar_state_accept_within(struct grammar_state *s, int32_t token, uint32_t budget)
{
	const struct grammar_vocab *v = s->sh->v;

	if (s->ended || token < 0 || token >= v->n_vocab)
		return -EINVAL;
	if (vocab_has(v->eog, token)) {
		if (!grammar_state_can_end(s))
			return -EINVAL;
		s->ended = 1;
		return 0;
	}
	if (!vocab_has(v->usable, token))
		return -EINVAL;
	return state_run(s, v->bytes + v->off[token], v->off[token + 1] - v->off[token], budget);
}

int grammar_state_accept(struct grammar_state *s, int32_t token)
{
	return grammar_state_accept_within(s, token, UINT32_MAX);
}

int grammar_state_mask_within(struct grammar_state *s, uint32_t *allowed, uint32_t budget)
{
	const struct grammar_vocab *v = s->sh->v;
	size_t words = grammar_vocab_mask_words(v);
	int32_t set0;
	int rc, n = 0, can_end = grammar_state_can_end(s);

	if (s->ended) {
		memset(allowed, 0, words * sizeof *allowed);
		return 0;
	}
	if ((rc = state_walker(s, &s->wa)) < 0 || (rc = state_load(s, s->wa, &set0)) < 0)
		return rc;
	for (size_t wd = 0; wd < words; wd++) {
		uint32_t bits = allowed[wd];
		while (bits) {
			int b = __builtin_ctz(bits);
			int32_t t = (int32_t)(wd * 32 + (size_t)b), set;
			struct upart p = s->part;
			int keep = 0;
			bits &= bits - 1;
			if (t >= v->n_vocab) {
				keep = 0;
			} else if (vocab_has(v->eog, t)) {
				keep = can_end;
			} else if (vocab_has(v->usable, t)) {
				const uint8_t *tb = (const uint8_t *)v->bytes + v->off[t];
				size_t len = v->off[t + 1] - v->off[t];
				set = w_run(s->wa, set0, &p, tb, len);
				if (set == -E2BIG) { /* the walker filled up: start it afresh */
					p = s->part;
					if ((rc = walker_reset(s->wa)) < 0 ||
					    (rc = state_load(s, s->wa, &set0)) < 0)
						return rc;
					set = w_run(s->wa, set0, &p, tb, len);
				}
				if (set < 0)
					return set;
				keep = set > 0 && fits(set_need(s->wa, cost_table(s->sh), set, &p), budget);
			}
			if (keep)
				n++;
			else
				allowed[wd] &= ~(1u << b);
		}
	}
	return n;
}

static int key_room(struct grammar_state *s, size_t n)
{
	return GROW(s->key, s->cap_key, n);
}

static int popcount_words(const uint32_t *w, size_t n)
{
	uint64_t c = 0;

	for (size_t i = 0; i < n; i += 2) {
		uint64_t x = w[i];
		if (i + 1 < n)
			x |= (uint64_t)w[i + 1] << 32;
		x = x - ((x >> 1) & 0x5555555555555555ull);
		x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
		x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
		c += (x * 0x0101010101010101ull) >> 56;
	}
	return (int)c;
}

/* The element that stands for POS in a table's key.  A token reads at most
 * max_len code points, so every S'(k) of a bounded repetition's chain with k
 * past that takes the same tokens, and leaves the same tokens to the stack
 * below: positions in them share the table of S'(max_len). */
static uint32_t canonical_elem(const struct grammar *g, const struct grammar_vocab *v,
			       uint32_t pos)
{
	const struct grule *r = &g->rules[g->elem_rule[pos]];
	uint32_t l = v->max_len < 2 ? 2 : v->max_len, to;

	if (r->chain_k <= l)
		return pos;
	to = r->chain_first + l - 1;
	return g->alts[g->rules[to].alt_off] + (pos - g->alts[r->alt_off]);
}

/* The table of stack I's top cut below its D-th named rule from the top, ORed
 * into OUT, with its tokens that leave the top copied to s->ctx.  *RET_CUT:
 * the elements below the cut; *RET_DEEPEN: 1 if the table says cut lower. */
static int stack_table(struct grammar_state *s, size_t i, uint32_t d, uint32_t *out,
		       size_t *ret_cut, int *ret_deepen)
{
	struct gshared *sh = s->sh;
	const struct grammar *g = sh->g;
	const struct grammar_vocab *v = sh->v;
	const uint32_t *st = s->elems + s->offs[i];
	size_t len = s->offs[i + 1] - s->offs[i], cut = 0, n_key;
	uint32_t seen = 0;
	struct centry *e;
	uint64_t h;
	int rc, full;

	for (size_t k = len; k-- > 0;) {
		if (g->named[st[k]] && ++seen == d) {
			cut = k;
			break;
		}
	}
	full = cut == 0;
	n_key = 2 + (len - cut);
	if ((rc = key_room(s, n_key)) < 0)
		return rc;
	s->key[0] = KEY_TABLE;
	s->key[1] = (uint32_t)full;
	for (size_t k = cut; k < len; k++)
		s->key[2 + k - cut] = canonical_elem(g, v, st[k]);
	h = hash_words(s->key, n_key);
	*ret_cut = cut;
	s->ctx.n = 0;

	pthread_mutex_lock(&sh->lock);
	e = cache_find(sh, s->key, (uint32_t)n_key, h);
	if (!e) {
		int32_t set;
		int64_t top;
		int deep = 0;

		pthread_mutex_unlock(&sh->lock);
		if ((rc = state_walker(s, &s->w)) < 0)
			return rc;
		top = w_stack(s->w, full ? WN_EMPTY : WN_CUT, s->key + 2, len - cut);
		if (top < 0)
			return (int)top;
		{
			uint32_t one = (uint32_t)top;
			if ((rc = w_intern_set(s->w, &one, 1, &set)) < 0)
				return rc;
		}
		{
			uint32_t *acc = calloc(v->n_words + 1, sizeof *acc);
			struct upart none = { 0, 0, 0, 0 };
			if (!acc)
				return -ENOMEM;
			rc = walk_trie(s->w, v, set, none, acc, &s->ctx);
			if (rc < 0) {
				free(acc);
				return rc;
			}
			deep = rc == WALK_DEEPEN;
			if (deep) {
				s->ctx.n = 0;
				e = centry_new(s->key, (uint32_t)n_key, v->n_words, 0, 0);
			} else {
				size_t m = 0;
				for (size_t k = 0; k < s->ctx.n; k++) /* those taken whole need no check */
					if (!vocab_has(acc, (int32_t)s->ctx.e[k].tok))
						s->ctx.e[m++] = s->ctx.e[k];
				s->ctx.n = m;
				e = centry_new(s->key, (uint32_t)n_key, v->n_words, 1, m);
				if (e) {
					memcpy(e->bits, acc, v->n_words * sizeof *acc);
					if (m)
						memcpy(e->ctx, s->ctx.e, m * sizeof *s->ctx.e);
				}
			}
			free(acc);
			if (!e)
				return -ENOMEM;
		}
		if (e->bits) {
			e->w_lo = (uint32_t)v->n_words;
			for (size_t k = 0; k < v->n_words; k++) {
				if (!e->bits[k])
					continue;
				if (e->w_lo == v->n_words)
					e->w_lo = (uint32_t)k;
				e->w_hi = (uint32_t)k + 1;
			}
		}
		pthread_mutex_lock(&sh->lock);
		sh->st.tables++;
		sh->st.deepened += deep;
		e = cache_put(sh, e);
		if (!e) {
			pthread_mutex_unlock(&sh->lock);
			return -ENOMEM;
		}
	}
	*ret_deepen = e->bits == NULL;
	if (e->bits) {
		for (size_t k = e->w_lo; k < e->w_hi; k++)
			out[k] |= e->bits[k];
		if (GROW(s->ctx.e, s->ctx.cap, e->n_ctx + 1)) {
			pthread_mutex_unlock(&sh->lock);
			return -ENOMEM;
		}
		memcpy(s->ctx.e, e->ctx, e->n_ctx * sizeof *e->ctx);
		s->ctx.n = e->n_ctx;
	}
	pthread_mutex_unlock(&sh->lock);
	return 0;
}

/* Checks the tokens in s->ctx, which left the top of stack I at their offset,
 * against the CUT elements below it: sets in OUT those it takes. */
static int check_below(struct grammar_state *s, size_t i, size_t cut, uint32_t *out)
{
	const struct grammar_vocab *v = s->sh->v;
	struct walker *w;
	int64_t below;
	int32_t set;
	size_t off;
	int rc;

	if ((rc = state_walker(s, &s->wa)) < 0)
		return rc;
	w = s->wa;
	below = w_stack(w, WN_EMPTY, s->elems + s->offs[i], cut);
	if (below < 0)
		return (int)below;
	if ((rc = w_advance(w, (uint32_t)below, &off)) < 0)
		return rc;
	w->n_lst2 = 0;
	if (GROW(w->lst2, w->cap_lst2, w->adv[off] + 1))
		return -ENOMEM;
	memcpy(w->lst2, w->adv + off + 1, w->adv[off] * sizeof *w->lst2);
	if ((rc = w_intern_set(w, w->lst2, w->adv[off], &set)) < 0)
		return rc;
	for (size_t k = 0; k < s->ctx.n; k++) {
		uint32_t t = s->ctx.e[k].tok;
		struct upart p = { 0, 0, 0, 0 };
		int32_t r;
		if (vocab_has(out, (int32_t)t))
			continue;
		r = w_run(w, set, &p, v->bytes + v->off[t] + s->ctx.e[k].off,
			  v->off[t + 1] - v->off[t] - s->ctx.e[k].off);
		if (r < 0)
			return r;
		if (r > 0)
			out[t >> 5] |= 1u << (t & 31);
	}
	return (int)s->ctx.n;
}

/* The whole state as a cache key in s->key (N words): KEY_MASK, the pending
 * character, then each stack's length and elements. */
static int mask_key(struct grammar_state *s, size_t n)
{
	size_t k = 4;

	if (key_room(s, n))
		return -ENOMEM;
	s->key[0] = KEY_MASK;
	s->key[1] = s->part.val;
	s->key[2] = s->part.n | (uint32_t)s->part.lo << 8 | (uint32_t)s->part.hi << 16;
	s->key[3] = (uint32_t)s->n_stacks;
	for (size_t i = 0; i < s->n_stacks; i++) {
		uint32_t len = s->offs[i + 1] - s->offs[i];
		s->key[k++] = len;
		memcpy(s->key + k, s->elems + s->offs[i], len * sizeof *s->elems);
		k += len;
	}
	return 0;
}

static int state_mask(struct grammar_state *s, uint32_t *out)
{
	struct gshared *sh = s->sh;
	const struct grammar_vocab *v = sh->v;
	size_t n_key = 4 + s->n_stacks + s->n_elems;
	struct centry *e;
	uint64_t h, n_ctx = 0;
	int rc, can_end = 0, count;

	if (s->ended) {
		memset(out, 0, v->n_words * sizeof *out);
		return 0;
	}
	if ((rc = mask_key(s, n_key)) < 0)
		return rc;
	h = hash_words(s->key, n_key);
	pthread_mutex_lock(&sh->lock);
	sh->st.masks++;
	e = cache_find(sh, s->key, (uint32_t)n_key, h);
	if (e) {
		sh->st.mask_hits++;
		memcpy(out, e->bits, v->n_words * sizeof *out);
		count = e->count;
		pthread_mutex_unlock(&sh->lock);
		return count;
	}
	pthread_mutex_unlock(&sh->lock);

	memset(out, 0, v->n_words * sizeof *out);
	if (s->part.n) {
		/* inside a character: walk the trie from the whole state */
		int32_t set;
		if ((rc = state_walker(s, &s->w)) < 0 || (rc = state_load(s, s->w, &set)) < 0)
			return rc;
		rc = walk_trie(s->w, v, set, s->part, out, &s->ctx);
		if (rc < 0)
			return rc;
	} else {
		for (size_t i = 0; i < s->n_stacks; i++) {
			size_t cut = 0;
			int deepen = 1;
			if (s->offs[i + 1] == s->offs[i]) {
				can_end = 1;
				continue;
			}
			for (uint32_t d = 1; deepen; d++)
				if ((rc = stack_table(s, i, d, out, &cut, &deepen)) < 0)
					return rc;
			if (s->ctx.n && cut) {
				if ((rc = check_below(s, i, cut, out)) < 0)
					return rc;
				n_ctx += (uint64_t)rc;
			}
		}
		if (can_end)
			for (int k = 0; k < v->n_eog; k++)
				out[v->eog_ids[k] >> 5] |= 1u << (v->eog_ids[k] & 31);
	}
	count = popcount_words(out, v->n_words);
	/* the key was overwritten by the tables' keys: make it again */
	if ((rc = mask_key(s, n_key)) < 0)
		return rc;
	e = centry_new(s->key, (uint32_t)n_key, v->n_words, 1, 0);
	if (e) {
		memcpy(e->bits, out, v->n_words * sizeof *out);
		e->count = count;
	}
	pthread_mutex_lock(&sh->lock);
	sh->st.ctx_checks += n_ctx;
	if (e)
		cache_put(sh, e);
	pthread_mutex_unlock(&sh->lock);
	return count;
}

int grammar_state_mask(struct grammar_state *s, uint32_t *allowed)
{
	int rc = state_mask(s, allowed);

	if (rc < 0)
		memset(allowed, 0, s->sh->v->n_words * sizeof *allowed);
	return rc;
}
