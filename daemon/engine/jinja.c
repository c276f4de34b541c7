/* jinja.c - a lexer, a parser to a tree and a tree-walking evaluator for
 * the Jinja that chat templates are written in (jinja.h says whose
 * semantics it copies).
 * Not a general Jinja: no inheritance, include, import, autoescape or
 * recursive loops.  Errors unwind with longjmp to jinja_compile or
 * jinja_render: everything either allocates lives in one arena freed at
 * once, so an error anywhere leaks nothing.
 */
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wctype.h>

#include <json-c/json.h>

#include "jinja.h"
#include "utf8.h"

#define PARSE_MAX_DEPTH 96     /* nesting of expressions and blocks */
#define RANGE_MAX 100000       /* jinja2's MAX_RANGE */

/* ---- arena: every allocation of a compile or a render ---- */

struct ablock {
	struct ablock *next; /* older blocks */
	size_t cap;          /* bytes of data[] */
	size_t used;         /* bytes of data[] handed out */
	max_align_t data[];
};

struct arena {
	struct ablock *head; /* the block allocations come from; owned chain */
	size_t total;        /* bytes malloc'd for blocks */
	size_t limit;        /* most bytes total may reach; 0 = no limit */
};

#define ABLOCK_SIZE ((size_t)64 << 10)

/* N bytes aligned for any type, or NULL (out of memory or over the limit). */
static void *arena_alloc(struct arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (n == 0)
		n = 16;
	struct ablock *h = a->head;
	if (h && h->cap - h->used >= n) {
		void *p = (char *)h->data + h->used;
		h->used += n;
		return p;
	}
	size_t cap = n > ABLOCK_SIZE / 4 ? n : ABLOCK_SIZE;
	if (cap > SIZE_MAX - sizeof(struct ablock) - a->total)
		return NULL;
	if (a->limit && a->total + cap + sizeof(struct ablock) > a->limit)
		return NULL;
	struct ablock *b = malloc(sizeof(struct ablock) + cap);
	if (!b)
		return NULL;
	a->total += cap + sizeof(struct ablock);
	b->cap = cap;
	b->used = n;
	if (h && cap == n) { /* a big one: keep the head for small ones */
		b->next = h->next;
		h->next = b;
	} else {
		b->next = h;
		a->head = b;
	}
	return b->data;
}

static void arena_free(struct arena *a)
{
	struct ablock *b = a->head;
	while (b) {
		struct ablock *older = b->next;
		free(b);
		b = older;
	}
	a->head = NULL;
	a->total = 0;
}

/* ---- values ---- */

enum vtype {
	V_UNDEF, /* jinja2's Undefined; u.s names what was missing (safe: u.s
	            is instead the whole message) */
	V_NONE,
	V_BOOL,  /* u.i 0 or 1 */
	V_INT,   /* u.i */
	V_FLOAT, /* u.f */
	V_STR,   /* u.s: UTF-8 bytes, not NUL-terminated */
	V_LIST,  /* u.l: a list, a tuple or a generator */
	V_DICT,  /* u.d: insertion-ordered */
	V_NS,    /* u.d: namespace(), whose attributes {% set %} may change */
	V_FUNC,  /* u.fn: a callable */
	V_LOOP,  /* u.lp: a for loop's `loop` */
};

struct sstr {
	const char *p; /* bytes; arena, template or context memory */
	size_t n;      /* byte count */
};

struct val {
	enum vtype t;
	int safe;          /* V_STR: jinja2's Markup (|safe, |e): what is
	                      added to it with + gets HTML-escaped */
	union {
		int64_t i;
		double f;
		struct sstr s;
		struct list *l;
		struct dict *d;
		struct func *fn;
		struct loop *lp;
	} u;
};

enum { LK_LIST, LK_TUPLE, LK_GEN };

struct list {
	struct val *v; /* (cap) items, n used */
	size_t n, cap;
	int kind;      /* LK_*: a generator is what map/select give: no len() */
};

struct dict {
	struct val *k, *v; /* (cap) keys and values, n used, in insertion order */
	size_t n, cap;
};

enum fkind {
	FN_BUILTIN, /* id: BI_* */
	FN_METHOD,  /* id: M_*, of self */
	FN_MACRO,   /* node: the {% macro %}, scope: where it was defined */
	FN_CALLER,  /* node: the {% call %} block, scope: where it stands */
	FN_UNSAFE,  /* a method the sandbox forbids: calling it fails */
};

struct func {
	enum fkind kind;
	int id;                 /* BI_* or M_* */
	struct val self;        /* FN_METHOD's object */
	const struct node *node;
	struct scope *scope;
	struct sstr name;       /* for messages */
};

struct loop {
	struct list *items; /* what is iterated (after the loop's if) */
	size_t index0;      /* the current turn */
	int depth0;         /* 0 for the outermost loop */
	struct val last_changed; /* loop.changed()'s memory; V_UNDEF at first */
};

static const struct val v_undef = { .t = V_UNDEF };
static const struct val v_none = { .t = V_NONE };

static struct val v_bool(int b)
{
	struct val v = { .t = V_BOOL };
	v.u.i = b != 0;
	return v;
}

static struct val v_int(int64_t i)
{
	struct val v = { .t = V_INT };
	v.u.i = i;
	return v;
}

static struct val v_float(double f)
{
	struct val v = { .t = V_FLOAT };
	v.u.f = f;
	return v;
}

static struct val v_str(const char *p, size_t n)
{
	struct val v = { .t = V_STR };
	v.u.s.p = p;
	v.u.s.n = n;
	return v;
}

static struct val v_cstr(const char *p)
{
	return v_str(p, strlen(p));
}

static struct val v_undef_named(struct sstr name)
{
	struct val v = { .t = V_UNDEF };
	v.u.s = name;
	return v;
}

static int seq_eq(struct sstr a, const char *b)
{
	size_t n = strlen(b);
	return a.n == n && memcmp(a.p, b, n) == 0;
}

/* ---- UTF-8 and Python's character classes ---- */

/* Decodes the character at S[I] (N bytes in all): its code point, and its
 * length in *LEN.  A malformed byte stands for itself, one byte long. */
static uint32_t utf8_get(const char *s, size_t n, size_t i, size_t *len)
{
	const unsigned char *u = (const unsigned char *)s + i;
	size_t left = n - i;
	*len = 1;
	if (u[0] < 0x80)
		return u[0];
	int k = u[0] >= 0xf0 && u[0] < 0xf8 ? 4 : u[0] >= 0xe0 ? 3 : u[0] >= 0xc2 && u[0] < 0xe0 ? 2 : 0;
	if (!k || (size_t)k > left)
		return u[0];
	uint32_t c = u[0] & (0x7f >> k);
	for (int j = 1; j < k; j++) {
		if ((u[j] & 0xc0) != 0x80)
			return u[0];
		c = c << 6 | (u[j] & 0x3f);
	}
	if ((k == 3 && c < 0x800) || (k == 4 && (c < 0x10000 || c > 0x10ffff)))
		return u[0];
	*len = (size_t)k;
	return c;
}

/* Python's str.isspace() (and re's \s). */
static int py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Bytes of the whitespace character that starts at S[I], or 0. */
static size_t space_at(const char *s, size_t n, size_t i)
{
	size_t len;
	uint32_t c = utf8_get(s, n, i, &len);
	return py_space(c) ? len : 0;
}

/* Bytes of the whitespace character that ends right before S[I], or 0. */
static size_t space_before(const char *s, size_t i)
{
	for (size_t k = 1; k <= 3 && k <= i; k++) {
		size_t len;
		if (((unsigned char)s[i - k] & 0xc0) == 0x80 && k < 3)
			continue;
		uint32_t c = utf8_get(s, i, i - k, &len);
		if (len == k)
			return py_space(c) ? k : 0;
	}
	return 0;
}

/* Python's str.isprintable() for one character (near enough: the
 * unassigned code points are not known). */
static int py_printable(uint32_t c)
{
	if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad)
		return 0;
	if (c < 0x300)
		return 1;
	return !(c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
		 (c >= 0x205f && c <= 0x2064) || (c >= 0x2066 && c <= 0x206f) || c == 0x3000 ||
		 (c >= 0xd800 && c <= 0xf8ff) || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) ||
		 c >= 0xf0000 || (c >= 0x600 && c <= 0x605) || c == 0x61c || c == 0x6dd ||
		 c == 0x70f || c == 0x180e || (c >= 0xe0000 && c <= 0xe007f));
}

/* ---- the tree ---- */

enum nkind {
	/* expressions */
	N_CONST,   /* v */
	N_NAME,    /* v: the name */
	N_LIST,    /* kids; flag: a tuple */
	N_DICT,    /* kids: key, value, key, value... */
	N_ATTR,    /* a.v */
	N_ITEM,    /* a[b] */
	N_SLICE,   /* a[b:c:d], each of b c d may be NULL */
	N_CALL,    /* a(kids, names[i]=kids2[i]) */
	N_FILTER,  /* a | id(kids, names=kids2); a NULL in a filter block */
	N_TEST,    /* a is [not] id(kids); flag: not */
	N_NEG, N_POS, N_NOT,     /* op a */
	N_BINOP,   /* a op b: + - * / // % ** */
	N_CONCAT,  /* kids joined with ~ */
	N_AND, N_OR,
	N_COMPARE, /* a, then kids[i] compared with ops[i] */
	N_COND,    /* b if a else c (c may be NULL) */
	/* statements */
	N_TEXT,    /* v */
	N_OUTPUT,  /* {{ a }} */
	N_IF,      /* if a: kids, else kids2 (an elif is an N_IF alone in kids2) */
	N_FOR,     /* for names in a if b: kids, else kids2; flag: names is a
	              tuple; op: the body defines a macro or call block */
	N_SET,     /* names = a; b: the namespace (N_NAME) for ns.attr; flag: tuple */
	N_SETBLOCK,/* names[0] = the body kids, through filters a (N_FILTER chain or NULL) */
	N_MACRO,   /* v: name, names: params, kids2: defaults (NULL each if none), kids: body */
	N_CALLBLOCK, /* a: the call, names/kids2: caller's params and defaults, kids: body */
	N_FILTERBLOCK, /* a: N_FILTER chain whose innermost operand is the body kids */
	N_WITH,    /* names = kids2, then kids */
	N_BREAK, N_CONTINUE,
	N_GENERATION, /* kids */
};

enum {
	OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
	OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
};

struct node {
	enum nkind kind;
	int op;                 /* OP_* of N_BINOP */
	int flag;               /* see enum nkind */
	int id;                 /* filter / test id; -1 unknown (fails when run) */
	int line;               /* in the template, from 1 */
	struct node *a, *b, *c, *d;
	struct node **kids;     /* (nkids) */
	struct node **kids2;    /* (nkids2) */
	int nkids, nkids2;
	struct sstr *names;     /* (nnames) */
	int nnames;
	int *ops;               /* N_COMPARE: (nkids) OP_* */
	struct val v;
};

struct jinja_template {
	struct arena ar;        /* every node and string below */
	struct node **body;     /* (nbody) top-level statements */
	int nbody;
};

/* ---- lexer ---- */

enum ttype { T_EOF, T_DATA, T_BBEGIN, T_BEND, T_VBEGIN, T_VEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };

enum { TOP_FLOORDIV = 256, TOP_POW, TOP_EQ, TOP_NE, TOP_GE, TOP_LE };

struct token {
	enum ttype t;
	int op;          /* T_OP: the character, or TOP_* */
	int line;
	struct sstr s;   /* T_DATA, T_NAME: source bytes; T_STR: the decoded value */
	int64_t i;       /* T_INT */
	double f;        /* T_FLOAT */
};

struct parser {
	struct arena *ar;
	jmp_buf jb;
	char *err;
	size_t errlen;
	int code;            /* the error longjmp returns with */
	const char *src;     /* the source, newlines normalized (arena) */
	size_t len;
	size_t pos;          /* lexer: next byte */
	int line;            /* lexer: line of src[pos] */
	struct token *tok;   /* (ntok) */
	size_t ntok, cap;
	size_t at;           /* parser: current token */
	int depth;           /* nesting now */
	int soft;            /* inside an {% if %} or an inline if of this frame */
	int loops;           /* for loops around, in this frame */
};

static void perr(struct parser *ps, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4), noreturn));

static void perr(struct parser *ps, int line, const char *fmt, ...)
{
	if (ps->err && ps->errlen) {
		int k = snprintf(ps->err, ps->errlen, "line %d: ", line);
		if (k >= 0 && (size_t)k < ps->errlen) {
			va_list ap;
			va_start(ap, fmt);
			vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
			va_end(ap);
		}
	}
	ps->code = -EINVAL;
	longjmp(ps->jb, 1);
}

static void *palloc(struct parser *ps, size_t n)
{
	void *p = arena_alloc(ps->ar, n);
	if (!p) {
		if (ps->err && ps->errlen)
			snprintf(ps->err, ps->errlen, "out of memory");
		ps->code = -ENOMEM;
		longjmp(ps->jb, 1);
	}
	return p;
}

static void lex_push(struct parser *ps, struct token t)
{
	if (ps->ntok == ps->cap) {
		size_t cap = ps->cap ? ps->cap * 2 : 256;
		struct token *n = palloc(ps, cap * sizeof *n);
		if (ps->ntok)
			memcpy(n, ps->tok, ps->ntok * sizeof *n);
		ps->tok = n;
		ps->cap = cap;
	}
	ps->tok[ps->ntok++] = t;
}

static void lex_data(struct parser *ps, const char *p, size_t n, int line)
{
	if (n == 0)
		return;
	struct token t = { .t = T_DATA, .line = line };
	t.s.p = p;
	t.s.n = n;
	lex_push(ps, t);
}

/* Moves the lexer to POS, counting lines. */
static void lex_to(struct parser *ps, size_t pos)
{
	for (size_t i = ps->pos; i < pos; i++)
		ps->line += ps->src[i] == '\n';
	ps->pos = pos;
}

static size_t skip_space(const char *s, size_t n, size_t i)
{
	size_t k;
	while (i < n && (k = space_at(s, n, i)))
		i += k;
	return i;
}

/* The text before a tag: SIGN '-' strips all whitespace before it;
 * otherwise, for a block or a comment, lstrip_blocks strips the spaces
 * between the line's start and the tag. */
static size_t lex_strip(const char *text, size_t n, int sign, int is_var, int line_starting)
{
	if (sign == '-') {
		size_t k;
		while (n && (k = space_before(text, n)))
			n -= k;
		return n;
	}
	if (sign == '+' || is_var)
		return n;
	size_t l = n;
	while (l && text[l - 1] != '\n')
		l--;
	if (l == 0 && !line_starting)
		return n;
	if (l == n)
		return n;
	for (size_t i = l; i < n;) {
		size_t k = space_at(text, n, i);
		if (!k)
			return n;
		i += k;
	}
	return l;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* A string literal's body P..P+N with Python's escapes decoded. */
static struct sstr lex_unescape(struct parser *ps, const char *p, size_t n, int line)
{
	char *o = palloc(ps, n + 1), *start = o;
	for (size_t i = 0; i < n;) {
		if (p[i] != '\\' || i + 1 >= n) {
			*o++ = p[i++];
			continue;
		}
		char c = p[i + 1];
		i += 2;
		switch (c) {
		case '\n': break;
		case '\\': *o++ = '\\'; break;
		case '\'': *o++ = '\''; break;
		case '"': *o++ = '"'; break;
		case 'a': *o++ = '\a'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'v': *o++ = '\v'; break;
		case 'x': case 'u': case 'U': {
			int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
			uint32_t cp = 0;
			for (int k = 0; k < digits; k++) {
				int h = i < n ? hexval((unsigned char)p[i]) : -1;
				if (h < 0)
					perr(ps, line, "truncated \\%c escape in a string", c);
				cp = cp << 4 | (uint32_t)h;
				i++;
			}
			if (cp > 0x10ffff)
				perr(ps, line, "illegal Unicode character in a string");
			/* a \u escape takes as many bytes as its UTF-8 */
			o += utf8_encode(o, cp);
			break;
		}
		default:
			if (c >= '0' && c <= '7') {
				uint32_t cp = (uint32_t)(c - '0');
				for (int k = 0; k < 2 && i < n && p[i] >= '0' && p[i] <= '7'; k++)
					cp = cp * 8 + (uint32_t)(p[i++] - '0');
				o += utf8_encode(o, cp);
			} else if (c == 'N') {
				perr(ps, line, "unsupported \\N{...} escape in a string");
			} else {
				*o++ = '\\';
				*o++ = c;
			}
		}
	}
	struct sstr s = { start, (size_t)(o - start) };
	return s;
}

static int is_name_start(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

static int is_name_char(unsigned char c)
{
	return is_name_start(c) || (c >= '0' && c <= '9');
}

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Digits with single underscores between them from S[I]; the end. */
static size_t lex_digits(const char *s, size_t n, size_t i, int (*ok)(int))
{
	if (i >= n || !ok((unsigned char)s[i]))
		return i;
	i++;
	while (i < n) {
		if (ok((unsigned char)s[i]))
			i++;
		else if (s[i] == '_' && i + 1 < n && ok((unsigned char)s[i + 1]))
			i += 2;
		else
			break;
	}
	return i;
}

static int ok_dec(int c) { return c >= '0' && c <= '9'; }
static int ok_hex(int c) { return hexval(c) >= 0; }
static int ok_oct(int c) { return c >= '0' && c <= '7'; }
static int ok_bin(int c) { return c == '0' || c == '1'; }

/* A number at ps->pos. */
static void lex_number(struct parser *ps)
{
	const char *s = ps->src;
	size_t n = ps->len, i = ps->pos, end;
	int after_dot = i > 0 && s[i - 1] == '.';
	struct token t = { .t = T_INT, .line = ps->line };
	char buf[128];
	size_t k = 0;

	if (s[i] == '0' && i + 2 < n && strchr("xXoObB", s[i + 1])) {
		int base = (s[i + 1] | 0x20) == 'x' ? 16 : (s[i + 1] | 0x20) == 'o' ? 8 : 2;
		int (*ok)(int) = base == 16 ? ok_hex : base == 8 ? ok_oct : ok_bin;
		size_t j = i + 2;
		if (j < n && s[j] == '_')
			j++;
		end = lex_digits(s, n, j, ok);
		if (end == j)
			perr(ps, ps->line, "invalid number literal");
		uint64_t v = 0;
		for (size_t q = j; q < end; q++) {
			if (s[q] == '_')
				continue;
			if (v > (UINT64_MAX >> 4) / 1)
				perr(ps, ps->line, "integer literal too large");
			v = v * (uint64_t)base + (uint64_t)hexval((unsigned char)s[q]);
			if (v > INT64_MAX)
				perr(ps, ps->line, "integer literal too large");
		}
		t.i = (int64_t)v;
		lex_push(ps, t);
		lex_to(ps, end);
		return;
	}
	end = lex_digits(s, n, i, ok_dec);
	int is_float = 0;
	if (!after_dot) {
		size_t e = end;
		if (e + 1 < n && s[e] == '.' && is_digit(s[e + 1])) {
			e = lex_digits(s, n, e + 1, ok_dec);
			is_float = 1;
		}
		if (e < n && (s[e] | 0x20) == 'e') {
			size_t x = e + 1;
			if (x < n && (s[x] == '+' || s[x] == '-'))
				x++;
			size_t xe = lex_digits(s, n, x, ok_dec);
			if (xe > x) {
				e = xe;
				is_float = 1;
			}
		}
		if (is_float)
			end = e;
	}
	for (size_t q = i; q < end; q++) {
		if (s[q] == '_')
			continue;
		if (k + 1 >= sizeof buf)
			perr(ps, ps->line, "number literal too long");
		buf[k++] = s[q];
	}
	buf[k] = '\0';
	if (is_float) {
		t.t = T_FLOAT;
		t.f = strtod(buf, NULL);
	} else {
		if (k > 1 && buf[0] == '0') {
			for (size_t q = 0; q < k; q++)
				if (buf[q] != '0')
					perr(ps, ps->line, "leading zeros in an integer literal");
		}
		errno = 0;
		long long v = strtoll(buf, NULL, 10);
		if (errno == ERANGE)
			perr(ps, ps->line, "integer literal too large");
		t.i = v;
	}
	lex_push(ps, t);
	lex_to(ps, end);
}

/* The inside of a {% %} (BLOCK) or {{ }} tag, from ps->pos to its end;
 * returns 1 when the end consumed a newline (lstrip_blocks' "line
 * starting" for what follows). */
static int lex_tag(struct parser *ps, int block)
{
	const char *s = ps->src;
	size_t n = ps->len;
	char stack[PARSE_MAX_DEPTH];
	int depth = 0;

	for (;;) {
		size_t i = ps->pos;
		if (depth == 0 && i < n) {
			size_t end = 0;
			int is_end = 0;
			if (block) {
				if (s[i] == '+' && i + 2 < n + 0 && s[i + 1] == '%' && s[i + 2] == '}') {
					end = i + 3;
					is_end = 1;
				} else if (s[i] == '-' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
					end = skip_space(s, n, i + 3);
					is_end = 1;
				} else if (s[i] == '%' && i + 1 < n && s[i + 1] == '}') {
					end = i + 2;
					if (end < n && s[end] == '\n')
						end++;
					is_end = 1;
				}
			} else {
				if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}') {
					end = skip_space(s, n, i + 3);
					is_end = 1;
				} else if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
					end = i + 2;
					is_end = 1;
				}
			}
			if (is_end) {
				struct token t = { .t = block ? T_BEND : T_VEND, .line = ps->line };
				lex_push(ps, t);
				lex_to(ps, end);
				return s[end - 1] == '\n';
			}
		}
		if (i >= n)
			perr(ps, ps->line, "unexpected end of template: a %s is not closed",
			     block ? "{% tag %}" : "{{ tag }}");
		size_t k = space_at(s, n, i);
		if (k) {
			lex_to(ps, i + k);
			continue;
		}
		unsigned char c = (unsigned char)s[i];
		if (is_digit((char)c)) {
			lex_number(ps);
			continue;
		}
		if (is_name_start(c)) {
			size_t j = i;
			while (j < n && is_name_char((unsigned char)s[j]))
				j++;
			struct token t = { .t = T_NAME, .line = ps->line };
			t.s.p = s + i;
			t.s.n = j - i;
			lex_push(ps, t);
			lex_to(ps, j);
			continue;
		}
		if (c == '\'' || c == '"') {
			size_t j = i + 1;
			while (j < n && s[j] != (char)c)
				j += s[j] == '\\' && j + 1 < n ? 2 : 1;
			if (j >= n)
				perr(ps, ps->line, "unterminated string literal");
			struct token t = { .t = T_STR, .line = ps->line };
			t.s = lex_unescape(ps, s + i + 1, j - i - 1, ps->line);
			lex_push(ps, t);
			lex_to(ps, j + 1);
			continue;
		}
		static const struct { const char *s; int op; } two[] = {
			{ "//", TOP_FLOORDIV }, { "**", TOP_POW }, { "==", TOP_EQ },
			{ "!=", TOP_NE }, { ">=", TOP_GE }, { "<=", TOP_LE },
		};
		struct token t = { .t = T_OP, .line = ps->line };
		size_t len = 0;
		for (size_t q = 0; q < sizeof two / sizeof two[0]; q++)
			if (i + 1 < n && s[i] == two[q].s[0] && s[i + 1] == two[q].s[1]) {
				t.op = two[q].op;
				len = 2;
				break;
			}
		if (!len) {
			if (!c || !strchr("+-/*%~[](){}><=.:|,;", c))
				perr(ps, ps->line, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
			t.op = c;
			len = 1;
			if (c == '(' || c == '[' || c == '{') {
				if (depth == (int)sizeof stack)
					perr(ps, ps->line, "brackets nested too deeply");
				stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
			} else if (c == ')' || c == ']' || c == '}') {
				if (!depth)
					perr(ps, ps->line, "unexpected '%c'", c);
				if (stack[depth - 1] != (char)c)
					perr(ps, ps->line, "unexpected '%c', expected '%c'", c, stack[depth - 1]);
				depth--;
			}
		}
		lex_push(ps, t);
		lex_to(ps, i + len);
	}
}

/* `{%(-|+|)\s*WORD\s*(-%}\s*|+%}|%}\n?)` at S[I] (PLUS_END: whether the
 * +%} form counts): the end of the match, or 0. */
static size_t match_word_tag(const char *s, size_t n, size_t i, const char *word, int trim, int *sign)
{
	size_t w = strlen(word);
	if (i + 2 > n || s[i] != '{' || s[i + 1] != '%')
		return 0;
	i += 2;
	*sign = 0;
	if (i < n && (s[i] == '-' || s[i] == '+'))
		*sign = s[i++];
	i = skip_space(s, n, i);
	if (i + w > n || memcmp(s + i, word, w) != 0)
		return 0;
	i = skip_space(s, n, i + w);
	if (trim && i + 3 <= n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}')
		return i + 3;
	if (i + 3 <= n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}')
		return skip_space(s, n, i + 3);
	if (i + 2 <= n && s[i] == '%' && s[i + 1] == '}') {
		i += 2;
		if (trim && i < n && s[i] == '\n')
			i++;
		return i;
	}
	return 0;
}

/* Splits the (normalized) source into tokens, whitespace control applied
 * as jinja2's lexer does with trim_blocks and lstrip_blocks. */
static void lex(struct parser *ps)
{
	const char *s = ps->src;
	size_t n = ps->len;
	int line_starting = 1;

	while (ps->pos < n) {
		size_t i = ps->pos, tag = i;
		int kind = 0;
		for (;;) {
			const char *b = memchr(s + tag, '{', n - tag);
			if (!b || (size_t)(b - s) + 1 >= n) {
				tag = n;
				break;
			}
			tag = (size_t)(b - s);
			if (s[tag + 1] == '%' || s[tag + 1] == '{' || s[tag + 1] == '#') {
				kind = s[tag + 1];
				break;
			}
			tag++;
		}
		if (tag >= n) {
			lex_data(ps, s + i, n - i, ps->line);
			lex_to(ps, n);
			break;
		}
		int raw_sign = 0;
		size_t raw_end = kind == '%' ? match_word_tag(s, n, tag, "raw", 0, &raw_sign) : 0;
		int sign = 0;
		size_t after = tag + 2;
		if (raw_end) {
			sign = raw_sign;
		} else if (after < n && (s[after] == '-' || s[after] == '+')) {
			sign = s[after];
			after++;
		}
		size_t keep = lex_strip(s + i, tag - i, sign, kind == '{', line_starting);
		lex_data(ps, s + i, keep, ps->line);
		lex_to(ps, after);
		line_starting = 0;
		if (raw_end) {
			/* the raw text, up to {% endraw %} */
			lex_to(ps, raw_end);
			line_starting = s[raw_end - 1] == '\n';
			size_t j = raw_end, end = 0;
			int esign = 0;
			for (; j + 1 < n; j++)
				if (s[j] == '{' && s[j + 1] == '%' &&
				    (end = match_word_tag(s, n, j, "endraw", 1, &esign)))
					break;
			if (!end)
				perr(ps, ps->line, "missing end of raw directive");
			keep = lex_strip(s + raw_end, j - raw_end, esign, 0, line_starting);
			lex_data(ps, s + raw_end, keep, ps->line);
			lex_to(ps, end);
			line_starting = s[end - 1] == '\n';
			continue;
		}
		if (kind == '#') {
			size_t j = after;
			for (; j + 1 < n; j++)
				if (s[j] == '#' && s[j + 1] == '}')
					break;
			if (j + 1 >= n)
				perr(ps, ps->line, "missing end of comment tag");
			size_t end = j + 2;
			if (j > after && s[j - 1] == '-')
				end = skip_space(s, n, end);
			else if (!(j > after && s[j - 1] == '+') && end < n && s[end] == '\n')
				end++;
			lex_to(ps, end);
			line_starting = s[end - 1] == '\n';
			continue;
		}
		struct token t = { .t = kind == '%' ? T_BBEGIN : T_VBEGIN, .line = ps->line };
		lex_push(ps, t);
		line_starting = lex_tag(ps, kind == '%');
	}
	struct token eof = { .t = T_EOF, .line = ps->line };
	lex_push(ps, eof);
}

/* ---- filters, tests and globals by name ---- */

enum filter_id {
	F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT,
	F_E, F_ESCAPE, F_FIRST, F_FLOAT, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN,
	F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR,
	F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING,
	F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
	F_N
};

static const char *const filter_names[F_N] = {
	"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort",
	"e", "escape", "first", "float", "format", "indent", "int", "items", "join",
	"last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
	"replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
	"sum", "title", "tojson", "trim", "unique", "upper", "wordcount",
};

enum test_id {
	TS_BOOLEAN, TS_CALLABLE, TS_DEFINED, TS_DIVISIBLEBY, TS_EQ, TS_EQUALTO, TS_ESCAPED, TS_EVEN,
	TS_FALSE, TS_FILTER, TS_FLOAT, TS_GE, TS_GT, TS_GREATERTHAN, TS_IN, TS_INTEGER, TS_ITERABLE,
	TS_LE, TS_LESSTHAN, TS_LOWER, TS_LT, TS_MAPPING, TS_NE, TS_NONE, TS_NUMBER, TS_ODD, TS_SAMEAS,
	TS_SEQUENCE, TS_STRING, TS_TEST, TS_TRUE, TS_UNDEFINED, TS_UPPER, TS_SYM_EQ, TS_SYM_NE,
	TS_SYM_LT, TS_SYM_LE, TS_SYM_GT, TS_SYM_GE,
	TS_N
};

static const char *const test_names[TS_N] = {
	"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
	"false", "filter", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable",
	"le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
	"sequence", "string", "test", "true", "undefined", "upper", "==", "!=",
	"<", "<=", ">", ">=",
};

enum builtin_id { BI_RANGE, BI_DICT, BI_NAMESPACE, BI_RAISE, BI_STRFTIME };

static const char *const builtin_names[] = {
	"range", "dict", "namespace", "raise_exception", "strftime_now",
};

static int find_name(const char *const *names, int n, struct sstr s)
{
	for (int i = 0; i < n; i++)
		if (names[i] && seq_eq(s, names[i]))
			return i;
	return -1;
}

/* ---- parser ---- */

static struct token *cur(struct parser *ps)
{
	return &ps->tok[ps->at];
}

static struct token *peek(struct parser *ps, size_t k)
{
	size_t i = ps->at + k;
	return &ps->tok[i < ps->ntok ? i : ps->ntok - 1];
}

static struct token *next(struct parser *ps)
{
	struct token *t = &ps->tok[ps->at];
	if (ps->at + 1 < ps->ntok)
		ps->at++;
	return t;
}

static int is_op(const struct token *t, int op)
{
	return t->t == T_OP && t->op == op;
}

static int is_name(const struct token *t, const char *name)
{
	return t->t == T_NAME && seq_eq(t->s, name);
}

static const char *tok_desc(const struct token *t, char *buf, size_t n)
{
	switch (t->t) {
	case T_EOF: return "end of template";
	case T_DATA: return "template data";
	case T_BBEGIN: return "'{%'";
	case T_BEND: return "end of statement block";
	case T_VBEGIN: return "'{{'";
	case T_VEND: return "end of print statement";
	case T_NAME:
		snprintf(buf, n, "'%.*s'", t->s.n > 40 ? 40 : (int)t->s.n, t->s.p);
		return buf;
	case T_STR: return "string";
	case T_INT: return "integer";
	case T_FLOAT: return "float";
	case T_OP:
		if (t->op < 256)
			snprintf(buf, n, "'%c'", t->op);
		else
			snprintf(buf, n, "'%s'", (const char *[]){ "//", "**", "==", "!=", ">=", "<=" }[t->op - 256]);
		return buf;
	}
	return "?";
}

static void expect_op(struct parser *ps, int op)
{
	struct token *t = cur(ps);
	if (!is_op(t, op)) {
		char buf[64];
		perr(ps, t->line, "expected '%c', got %s", op, tok_desc(t, buf, sizeof buf));
	}
	next(ps);
}

static struct sstr expect_name(struct parser *ps)
{
	struct token *t = cur(ps);
	if (t->t != T_NAME) {
		char buf[64];
		perr(ps, t->line, "expected a name, got %s", tok_desc(t, buf, sizeof buf));
	}
	next(ps);
	return t->s;
}

static void expect_bend(struct parser *ps)
{
	struct token *t = cur(ps);
	if (t->t != T_BEND) {
		char buf[64];
		perr(ps, t->line, "expected end of statement block, got %s", tok_desc(t, buf, sizeof buf));
	}
	next(ps);
}

static struct node *mknode(struct parser *ps, enum nkind kind, int line)
{
	struct node *n = palloc(ps, sizeof *n);
	memset(n, 0, sizeof *n);
	n->kind = kind;
	n->line = line;
	n->id = -1;
	return n;
}

/* A growing array of node pointers (and names). */
struct nvec {
	struct node **v;
	struct sstr *s;
	int *ops;
	int n, cap;
};

static void nvec_push(struct parser *ps, struct nvec *a, struct node *n, struct sstr s, int op)
{
	if (a->n == a->cap) {
		int cap = a->cap ? a->cap * 2 : 4;
		if (cap > 1 << 24)
			perr(ps, n ? n->line : 0, "too many items");
		struct node **v = palloc(ps, (size_t)cap * sizeof *v);
		struct sstr *ss = palloc(ps, (size_t)cap * sizeof *ss);
		int *ops = palloc(ps, (size_t)cap * sizeof *ops);
		if (a->n) {
			memcpy(v, a->v, (size_t)a->n * sizeof *v);
			memcpy(ss, a->s, (size_t)a->n * sizeof *ss);
			memcpy(ops, a->ops, (size_t)a->n * sizeof *ops);
		}
		a->v = v;
		a->s = ss;
		a->ops = ops;
		a->cap = cap;
	}
	a->v[a->n] = n;
	a->s[a->n] = s;
	a->ops[a->n] = op;
	a->n++;
}

static void enter(struct parser *ps)
{
	if (++ps->depth > PARSE_MAX_DEPTH) {
		if (ps->err && ps->errlen)
			snprintf(ps->err, ps->errlen, "line %d: template nested too deeply (more than %d levels)",
				 cur(ps)->line, PARSE_MAX_DEPTH);
		ps->code = -E2BIG;
		longjmp(ps->jb, 1);
	}
}

static struct node *parse_expr(struct parser *ps, int condexpr);
static struct node *parse_unary(struct parser *ps, int with_filter);
static struct node *parse_primary(struct parser *ps);
static struct node *parse_postfix(struct parser *ps, struct node *n);

/* Is the current token the end of a tuple? */
static int tuple_end(struct parser *ps, const char *extra)
{
	struct token *t = cur(ps);
	if (t->t == T_VEND || t->t == T_BEND || t->t == T_EOF || is_op(t, ')'))
		return 1;
	return extra && is_name(t, extra);
}

/* jinja2's parse_tuple: a single expression, or a tuple of them. */
static struct node *parse_tuple(struct parser *ps, int simplified, int condexpr, const char *extra,
				int parens)
{
	int line = cur(ps)->line, is_tuple = 0;
	struct nvec items = { 0 };
	struct sstr none = { 0 };
	for (;;) {
		if (items.n)
			expect_op(ps, ',');
		if (tuple_end(ps, extra))
			break;
		struct node *e = simplified ? parse_postfix(ps, parse_primary(ps)) : parse_expr(ps, condexpr);
		nvec_push(ps, &items, e, none, 0);
		if (is_op(cur(ps), ','))
			is_tuple = 1;
		else
			break;
	}
	if (!is_tuple) {
		if (items.n)
			return items.v[0];
		if (!parens) {
			char buf[64];
			perr(ps, cur(ps)->line, "expected an expression, got %s", tok_desc(cur(ps), buf, sizeof buf));
		}
	}
	struct node *n = mknode(ps, N_LIST, line);
	n->flag = 1;
	n->kids = items.v;
	n->nkids = items.n;
	return n;
}

/* (args, name=value...) after the '(' */
static void parse_call_args(struct parser *ps, struct node *n)
{
	struct nvec args = { 0 }, kw = { 0 };
	struct sstr none = { 0 };
	expect_op(ps, '(');
	for (;;) {
		if (args.n || kw.n) {
			if (is_op(cur(ps), ')'))
				break;
			expect_op(ps, ',');
		}
		if (is_op(cur(ps), ')'))
			break;
		if (is_op(cur(ps), '*') || (cur(ps)->t == T_OP && cur(ps)->op == TOP_POW))
			perr(ps, cur(ps)->line, "unsupported: *args and **kwargs in a call");
		if (cur(ps)->t == T_NAME && is_op(peek(ps, 1), '=')) {
			struct sstr name = next(ps)->s;
			next(ps);
			nvec_push(ps, &kw, parse_expr(ps, 1), name, 0);
		} else {
			if (kw.n)
				perr(ps, cur(ps)->line, "positional argument after a keyword argument");
			nvec_push(ps, &args, parse_expr(ps, 1), none, 0);
		}
	}
	expect_op(ps, ')');
	n->kids = args.v;
	n->nkids = args.n;
	n->kids2 = kw.v;
	n->names = kw.s;
	n->nkids2 = kw.n;
}

/* A filter or test name, dotted names joined. */
static struct sstr parse_dotted(struct parser *ps)
{
	struct sstr s = expect_name(ps);
	while (is_op(cur(ps), '.') && peek(ps, 1)->t == T_NAME) {
		next(ps);
		struct sstr more = next(ps)->s;
		char *p = palloc(ps, s.n + more.n + 2);
		memcpy(p, s.p, s.n);
		p[s.n] = '.';
		memcpy(p + s.n + 1, more.p, more.n);
		s.p = p;
		s.n += more.n + 1;
	}
	return s;
}

static struct node *parse_filter(struct parser *ps, struct node *operand)
{
	int line = cur(ps)->line;
	struct sstr name = parse_dotted(ps);
	struct node *n = mknode(ps, N_FILTER, line);
	n->a = operand;
	n->v = v_str(name.p, name.n);
	n->id = find_name(filter_names, F_N, name);
	if (n->id < 0 && !ps->soft)
		perr(ps, line, "unsupported filter '%.*s'", (int)name.n, name.p);
	if (is_op(cur(ps), '('))
		parse_call_args(ps, n);
	return n;
}

static struct node *parse_test(struct parser *ps, struct node *operand)
{
	int line = cur(ps)->line;
	struct node *n = mknode(ps, N_TEST, line);
	n->a = operand;
	if (is_name(cur(ps), "not")) {
		next(ps);
		n->flag = 1;
	}
	struct sstr name = parse_dotted(ps);
	n->v = v_str(name.p, name.n);
	n->id = find_name(test_names, TS_N, name);
	if (n->id < 0 && !ps->soft)
		perr(ps, line, "unsupported test '%.*s'", (int)name.n, name.p);
	struct token *t = cur(ps);
	if (is_op(t, '(')) {
		parse_call_args(ps, n);
	} else if ((t->t == T_NAME || t->t == T_STR || t->t == T_INT || t->t == T_FLOAT ||
		    is_op(t, '(') || is_op(t, '[') || is_op(t, '{')) &&
		   !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
		if (is_name(t, "is"))
			perr(ps, t->line, "you cannot chain multiple tests with is");
		struct node **arg = palloc(ps, sizeof *arg);
		arg[0] = parse_postfix(ps, parse_primary(ps));
		n->kids = arg;
		n->nkids = 1;
	}
	return n;
}

static struct node *parse_subscript(struct parser *ps, struct node *obj)
{
	struct token *t = next(ps);
	if (is_op(t, '.')) {
		struct token *a = next(ps);
		char buf[64];
		if (a->t == T_NAME) {
			struct node *n = mknode(ps, N_ATTR, t->line);
			n->a = obj;
			n->v = v_str(a->s.p, a->s.n);
			return n;
		}
		if (a->t != T_INT)
			perr(ps, a->line, "expected a name or a number after '.', got %s", tok_desc(a, buf, sizeof buf));
		struct node *n = mknode(ps, N_ITEM, t->line);
		n->a = obj;
		n->b = mknode(ps, N_CONST, t->line);
		n->b->v = v_int(a->i);
		return n;
	}
	/* '[' */
	struct nvec idx = { 0 };
	struct sstr none = { 0 };
	int line = t->line;
	while (!is_op(cur(ps), ']')) {
		if (idx.n)
			expect_op(ps, ',');
		struct node *e;
		/* a slice: [start]:[stop][:[step]] */
		struct node *start = NULL;
		if (!is_op(cur(ps), ':')) {
			start = parse_expr(ps, 1);
			if (!is_op(cur(ps), ':')) {
				nvec_push(ps, &idx, start, none, 0);
				continue;
			}
		}
		next(ps); /* ':' */
		e = mknode(ps, N_SLICE, line);
		e->b = start;
		if (!is_op(cur(ps), ']') && !is_op(cur(ps), ',') && !is_op(cur(ps), ':'))
			e->c = parse_expr(ps, 1);
		if (is_op(cur(ps), ':')) {
			next(ps);
			if (!is_op(cur(ps), ']') && !is_op(cur(ps), ','))
				e->d = parse_expr(ps, 1);
		}
		nvec_push(ps, &idx, e, none, 0);
	}
	expect_op(ps, ']');
	if (idx.n == 0)
		perr(ps, line, "expected an index in '[]'");
	struct node *key;
	if (idx.n == 1) {
		key = idx.v[0];
	} else {
		key = mknode(ps, N_LIST, line);
		key->flag = 1;
		key->kids = idx.v;
		key->nkids = idx.n;
	}
	if (key->kind == N_SLICE) {
		key->a = obj;
		return key;
	}
	for (int i = 0; i < idx.n; i++)
		if (idx.v[i]->kind == N_SLICE)
			perr(ps, line, "unsupported: a slice in a tuple index");
	struct node *n = mknode(ps, N_ITEM, line);
	n->a = obj;
	n->b = key;
	return n;
}

static struct node *parse_postfix(struct parser *ps, struct node *n)
{
	for (;;) {
		struct token *t = cur(ps);
		if (is_op(t, '.') || is_op(t, '[')) {
			n = parse_subscript(ps, n);
		} else if (is_op(t, '(')) {
			struct node *c = mknode(ps, N_CALL, t->line);
			c->a = n;
			parse_call_args(ps, c);
			n = c;
		} else {
			return n;
		}
	}
}

static struct node *parse_filter_expr(struct parser *ps, struct node *n)
{
	for (;;) {
		struct token *t = cur(ps);
		if (is_op(t, '|')) {
			next(ps);
			n = parse_filter(ps, n);
		} else if (is_name(t, "is")) {
			next(ps);
			n = parse_test(ps, n);
		} else if (is_op(t, '(')) {
			struct node *c = mknode(ps, N_CALL, t->line);
			c->a = n;
			parse_call_args(ps, c);
			n = c;
		} else {
			return n;
		}
	}
}

static struct node *parse_primary(struct parser *ps)
{
	struct token *t = cur(ps);
	struct node *n;
	char buf[64];
	struct sstr none = { 0 };

	enter(ps);
	switch (t->t) {
	case T_NAME:
		next(ps);
		n = mknode(ps, N_CONST, t->line);
		if (seq_eq(t->s, "true") || seq_eq(t->s, "True"))
			n->v = v_bool(1);
		else if (seq_eq(t->s, "false") || seq_eq(t->s, "False"))
			n->v = v_bool(0);
		else if (seq_eq(t->s, "none") || seq_eq(t->s, "None"))
			n->v = v_none;
		else {
			n->kind = N_NAME;
			n->v = v_str(t->s.p, t->s.n);
		}
		break;
	case T_STR: {
		next(ps);
		struct sstr s = t->s;
		while (cur(ps)->t == T_STR) { /* "a" "b" is "ab" */
			struct sstr more = next(ps)->s;
			char *p = palloc(ps, s.n + more.n + 1);
			memcpy(p, s.p, s.n);
			memcpy(p + s.n, more.p, more.n);
			s.p = p;
			s.n += more.n;
		}
		n = mknode(ps, N_CONST, t->line);
		n->v = v_str(s.p, s.n);
		break;
	}
	case T_INT:
		next(ps);
		n = mknode(ps, N_CONST, t->line);
		n->v = v_int(t->i);
		break;
	case T_FLOAT:
		next(ps);
		n = mknode(ps, N_CONST, t->line);
		n->v = v_float(t->f);
		break;
	case T_OP:
		if (t->op == '(') {
			next(ps);
			n = parse_tuple(ps, 0, 1, NULL, 1);
			expect_op(ps, ')');
			break;
		}
		if (t->op == '[') {
			struct nvec items = { 0 };
			next(ps);
			while (!is_op(cur(ps), ']')) {
				if (items.n)
					expect_op(ps, ',');
				if (is_op(cur(ps), ']'))
					break;
				nvec_push(ps, &items, parse_expr(ps, 1), none, 0);
			}
			expect_op(ps, ']');
			n = mknode(ps, N_LIST, t->line);
			n->kids = items.v;
			n->nkids = items.n;
			break;
		}
		if (t->op == '{') {
			struct nvec items = { 0 };
			next(ps);
			while (!is_op(cur(ps), '}')) {
				if (items.n)
					expect_op(ps, ',');
				if (is_op(cur(ps), '}'))
					break;
				nvec_push(ps, &items, parse_expr(ps, 1), none, 0);
				expect_op(ps, ':');
				nvec_push(ps, &items, parse_expr(ps, 1), none, 0);
			}
			expect_op(ps, '}');
			n = mknode(ps, N_DICT, t->line);
			n->kids = items.v;
			n->nkids = items.n;
			break;
		}
		/* fall through */
	default:
		perr(ps, t->line, "unexpected %s", tok_desc(t, buf, sizeof buf));
	}
	ps->depth--;
	return n;
}

static struct node *parse_unary(struct parser *ps, int with_filter)
{
	struct token *t = cur(ps);
	struct node *n;
	enter(ps);
	if (is_op(t, '-') || is_op(t, '+')) {
		next(ps);
		n = mknode(ps, is_op(t, '-') ? N_NEG : N_POS, t->line);
		n->a = parse_unary(ps, 0);
	} else {
		n = parse_primary(ps);
	}
	n = parse_postfix(ps, n);
	if (with_filter)
		n = parse_filter_expr(ps, n);
	ps->depth--;
	return n;
}

static struct node *binop(struct parser *ps, int op, struct node *a, struct node *b, int line)
{
	struct node *n = mknode(ps, N_BINOP, line);
	n->op = op;
	n->a = a;
	n->b = b;
	return n;
}

static struct node *parse_pow(struct parser *ps)
{
	struct node *n = parse_unary(ps, 1);
	while (cur(ps)->t == T_OP && cur(ps)->op == TOP_POW) {
		int line = next(ps)->line;
		n = binop(ps, OP_POW, n, parse_unary(ps, 1), line);
	}
	return n;
}

static struct node *parse_math2(struct parser *ps)
{
	struct node *n = parse_pow(ps);
	for (;;) {
		struct token *t = cur(ps);
		int op = is_op(t, '*') ? OP_MUL : is_op(t, '/') ? OP_DIV : is_op(t, '%') ? OP_MOD :
			 (t->t == T_OP && t->op == TOP_FLOORDIV) ? OP_FLOORDIV : 0;
		if (!op)
			return n;
		next(ps);
		n = binop(ps, op, n, parse_pow(ps), t->line);
	}
}

static struct node *parse_concat(struct parser *ps)
{
	struct node *n = parse_math2(ps);
	if (!is_op(cur(ps), '~'))
		return n;
	struct nvec items = { 0 };
	struct sstr none = { 0 };
	struct node *c = mknode(ps, N_CONCAT, cur(ps)->line);
	nvec_push(ps, &items, n, none, 0);
	while (is_op(cur(ps), '~')) {
		next(ps);
		nvec_push(ps, &items, parse_math2(ps), none, 0);
	}
	c->kids = items.v;
	c->nkids = items.n;
	return c;
}

static struct node *parse_math1(struct parser *ps)
{
	struct node *n = parse_concat(ps);
	for (;;) {
		struct token *t = cur(ps);
		int op = is_op(t, '+') ? OP_ADD : is_op(t, '-') ? OP_SUB : 0;
		if (!op)
			return n;
		next(ps);
		n = binop(ps, op, n, parse_concat(ps), t->line);
	}
}

static struct node *parse_compare(struct parser *ps)
{
	int line = cur(ps)->line;
	struct node *n = parse_math1(ps);
	struct nvec ops = { 0 };
	struct sstr none = { 0 };
	for (;;) {
		struct token *t = cur(ps);
		int op = 0;
		if (t->t == T_OP) {
			switch (t->op) {
			case TOP_EQ: op = OP_EQ; break;
			case TOP_NE: op = OP_NE; break;
			case TOP_GE: op = OP_GE; break;
			case TOP_LE: op = OP_LE; break;
			case '<': op = OP_LT; break;
			case '>': op = OP_GT; break;
			}
			if (op)
				next(ps);
		} else if (is_name(t, "in")) {
			next(ps);
			op = OP_IN;
		} else if (is_name(t, "not") && is_name(peek(ps, 1), "in")) {
			next(ps);
			next(ps);
			op = OP_NOTIN;
		}
		if (!op)
			break;
		nvec_push(ps, &ops, parse_math1(ps), none, op);
	}
	if (!ops.n)
		return n;
	struct node *c = mknode(ps, N_COMPARE, line);
	c->a = n;
	c->kids = ops.v;
	c->ops = ops.ops;
	c->nkids = ops.n;
	return c;
}

static struct node *parse_not(struct parser *ps)
{
	if (is_name(cur(ps), "not")) {
		struct node *n = mknode(ps, N_NOT, next(ps)->line);
		enter(ps);
		n->a = parse_not(ps);
		ps->depth--;
		return n;
	}
	return parse_compare(ps);
}

static struct node *parse_and(struct parser *ps)
{
	struct node *n = parse_not(ps);
	while (is_name(cur(ps), "and")) {
		struct node *a = mknode(ps, N_AND, next(ps)->line);
		a->a = n;
		a->b = parse_not(ps);
		n = a;
	}
	return n;
}

static struct node *parse_or(struct parser *ps)
{
	struct node *n = parse_and(ps);
	while (is_name(cur(ps), "or")) {
		struct node *o = mknode(ps, N_OR, next(ps)->line);
		o->a = n;
		o->b = parse_and(ps);
		n = o;
	}
	return n;
}

static struct node *parse_expr(struct parser *ps, int condexpr)
{
	enter(ps);
	struct node *n = parse_or(ps);
	if (condexpr) {
		while (is_name(cur(ps), "if")) {
			struct node *c = mknode(ps, N_COND, next(ps)->line);
			int soft = ps->soft;
			ps->soft = 1; /* like jinja2, unknown filters fail only when run */
			c->b = n;
			c->a = parse_or(ps);
			if (is_name(cur(ps), "else")) {
				next(ps);
				c->c = parse_expr(ps, 1);
			}
			ps->soft = soft;
			n = c;
		}
	}
	ps->depth--;
	return n;
}

/* ---- statements ---- */

static void parse_body(struct parser *ps, const char *const *ends, struct nvec *out);

/* A for loop's or a set's target: a name, or names with commas. */
static int parse_targets(struct parser *ps, const char *extra, struct sstr **names, int *n)
{
	int line = cur(ps)->line;
	struct node *t = parse_tuple(ps, 1, 0, extra, 0);
	if (t->kind == N_NAME) {
		*names = palloc(ps, sizeof **names);
		(*names)[0] = t->v.u.s;
		*n = 1;
		return 0;
	}
	if (t->kind != N_LIST || !t->flag)
		perr(ps, line, "cannot assign to this expression");
	*names = palloc(ps, ((size_t)t->nkids + 1) * sizeof **names);
	for (int i = 0; i < t->nkids; i++) {
		if (t->kids[i]->kind != N_NAME)
			perr(ps, line, "cannot assign to this expression");
		(*names)[i] = t->kids[i]->v.u.s;
	}
	*n = t->nkids;
	return 1;
}

static void check_assign_name(struct parser *ps, int line, struct sstr name)
{
	static const char *const reserved[] = { "true", "false", "none", "True", "False", "None" };
	for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
		if (seq_eq(name, reserved[i]))
			perr(ps, line, "cannot assign to '%.*s'", (int)name.n, name.p);
}

static struct node *parse_if(struct parser *ps, int line)
{
	static const char *const ends[] = { "elif", "else", "endif", NULL };
	struct node *n = mknode(ps, N_IF, line);
	int soft = ps->soft;
	ps->soft = 1;
	n->a = parse_tuple(ps, 0, 0, NULL, 0);
	expect_bend(ps);
	struct nvec body = { 0 };
	parse_body(ps, ends, &body);
	n->kids = body.v;
	n->nkids = body.n;
	struct token *t = next(ps); /* the end tag's name */
	if (is_name(t, "elif")) {
		struct node *e = parse_if(ps, t->line);
		n->kids2 = palloc(ps, sizeof *n->kids2);
		n->kids2[0] = e;
		n->nkids2 = 1;
		ps->soft = soft;
		return n; /* the nested one read the endif */
	}
	if (is_name(t, "else")) {
		static const char *const ends2[] = { "endif", NULL };
		struct nvec els = { 0 };
		expect_bend(ps);
		parse_body(ps, ends2, &els);
		next(ps);
		n->kids2 = els.v;
		n->nkids2 = els.n;
	}
	expect_bend(ps);
	ps->soft = soft;
	return n;
}

/* Does BODY hold a macro or a call block (which keep the scope they stand
 * in)?  A loop without one reuses one scope for all its turns. */
static int defines_closure(struct node *const *body, int n)
{
	for (int i = 0; i < n; i++) {
		const struct node *s = body[i];
		if (s->kind == N_MACRO || s->kind == N_CALLBLOCK)
			return 1;
		if (s->kind == N_IF || s->kind == N_FOR || s->kind == N_WITH || s->kind == N_SETBLOCK ||
		    s->kind == N_FILTERBLOCK || s->kind == N_GENERATION) {
			if (defines_closure(s->kids, s->nkids))
				return 1;
			if ((s->kind == N_IF || s->kind == N_FOR) && defines_closure(s->kids2, s->nkids2))
				return 1;
		}
	}
	return 0;
}

static struct node *parse_for(struct parser *ps, int line)
{
	static const char *const ends[] = { "endfor", "else", NULL };
	struct node *n = mknode(ps, N_FOR, line);
	n->flag = parse_targets(ps, "in", &n->names, &n->nnames);
	for (int i = 0; i < n->nnames; i++)
		check_assign_name(ps, line, n->names[i]);
	if (!is_name(cur(ps), "in"))
		perr(ps, cur(ps)->line, "expected 'in' in a for loop");
	next(ps);
	n->a = parse_tuple(ps, 0, 0, "recursive", 0);
	int soft = ps->soft, loops = ps->loops;
	ps->soft = 0;
	if (is_name(cur(ps), "if")) {
		next(ps);
		n->b = parse_expr(ps, 1);
	}
	if (is_name(cur(ps), "recursive"))
		perr(ps, cur(ps)->line, "unsupported: recursive loops");
	expect_bend(ps);
	struct nvec body = { 0 };
	ps->loops = 1;
	parse_body(ps, ends, &body);
	ps->loops = loops;
	ps->soft = soft;
	n->kids = body.v;
	n->nkids = body.n;
	n->op = defines_closure(n->kids, n->nkids);
	if (is_name(next(ps), "else")) {
		static const char *const ends2[] = { "endfor", NULL };
		struct nvec els = { 0 };
		expect_bend(ps);
		parse_body(ps, ends2, &els);
		next(ps);
		n->kids2 = els.v;
		n->nkids2 = els.n;
	}
	expect_bend(ps);
	return n;
}

static struct node *parse_set(struct parser *ps, int line)
{
	struct node *n;
	if (cur(ps)->t == T_NAME && is_op(peek(ps, 1), '.') && peek(ps, 2)->t == T_NAME &&
	    is_op(peek(ps, 3), '=')) {
		/* ns.attr = value */
		n = mknode(ps, N_SET, line);
		n->b = mknode(ps, N_NAME, line);
		n->b->v = v_str(cur(ps)->s.p, cur(ps)->s.n);
		next(ps);
		next(ps);
		n->names = palloc(ps, sizeof *n->names);
		n->names[0] = next(ps)->s;
		n->nnames = 1;
		next(ps);
		n->a = parse_tuple(ps, 0, 1, NULL, 0);
		expect_bend(ps);
		return n;
	}
	struct sstr *names;
	int nnames, tuple = parse_targets(ps, NULL, &names, &nnames);
	for (int i = 0; i < nnames; i++)
		check_assign_name(ps, line, names[i]);
	if (is_op(cur(ps), '=')) {
		next(ps);
		n = mknode(ps, N_SET, line);
		n->flag = tuple;
		n->names = names;
		n->nnames = nnames;
		n->a = parse_tuple(ps, 0, 1, NULL, 0);
		expect_bend(ps);
		return n;
	}
	if (tuple)
		perr(ps, line, "a block {%% set %%} takes one name");
	/* {% set x %}...{% endset %}, maybe through filters */
	static const char *const ends[] = { "endset", NULL };
	n = mknode(ps, N_SETBLOCK, line);
	n->names = names;
	n->nnames = 1;
	while (is_op(cur(ps), '|')) {
		next(ps);
		n->a = parse_filter(ps, n->a);
	}
	expect_bend(ps);
	struct nvec body = { 0 };
	parse_body(ps, ends, &body);
	next(ps);
	expect_bend(ps);
	n->kids = body.v;
	n->nkids = body.n;
	return n;
}

/* (a, b=default, ...) of a macro or a call block */
static void parse_signature(struct parser *ps, struct node *n)
{
	struct nvec params = { 0 };
	expect_op(ps, '(');
	while (!is_op(cur(ps), ')')) {
		if (params.n)
			expect_op(ps, ',');
		struct sstr name = expect_name(ps);
		check_assign_name(ps, cur(ps)->line, name);
		struct node *def = NULL;
		if (is_op(cur(ps), '=')) {
			next(ps);
			def = parse_expr(ps, 1);
		} else {
			for (int i = 0; i < params.n; i++)
				if (params.v[i])
					perr(ps, cur(ps)->line, "a parameter without a default after one with");
		}
		nvec_push(ps, &params, def, name, 0);
	}
	expect_op(ps, ')');
	n->names = params.s;
	n->kids2 = params.v;
	n->nnames = n->nkids2 = params.n;
}

/* The body of a macro or a call block: its own frame. */
static void parse_frame_body(struct parser *ps, const char *end, struct node *n)
{
	const char *ends[] = { end, NULL };
	int soft = ps->soft, loops = ps->loops;
	struct nvec body = { 0 };
	ps->soft = 0;
	ps->loops = 0;
	parse_body(ps, ends, &body);
	ps->soft = soft;
	ps->loops = loops;
	next(ps);
	expect_bend(ps);
	n->kids = body.v;
	n->nkids = body.n;
}

static struct node *parse_macro(struct parser *ps, int line)
{
	struct node *n = mknode(ps, N_MACRO, line);
	struct sstr name = expect_name(ps);
	n->v = v_str(name.p, name.n);
	parse_signature(ps, n);
	expect_bend(ps);
	parse_frame_body(ps, "endmacro", n);
	return n;
}

static struct node *parse_callblock(struct parser *ps, int line)
{
	struct node *n = mknode(ps, N_CALLBLOCK, line);
	n->v = v_str("caller", 6);
	if (is_op(cur(ps), '('))
		parse_signature(ps, n);
	n->a = parse_expr(ps, 1);
	if (n->a->kind != N_CALL)
		perr(ps, line, "expected a call in {%% call %%}");
	expect_bend(ps);
	parse_frame_body(ps, "endcall", n);
	return n;
}

static struct node *parse_filterblock(struct parser *ps, int line)
{
	static const char *const ends[] = { "endfilter", NULL };
	struct node *n = mknode(ps, N_FILTERBLOCK, line);
	struct node *chain = NULL;
	do {
		chain = parse_filter(ps, chain);
	} while (is_op(cur(ps), '|') && next(ps));
	n->a = chain;
	expect_bend(ps);
	struct nvec body = { 0 };
	parse_body(ps, ends, &body);
	next(ps);
	expect_bend(ps);
	n->kids = body.v;
	n->nkids = body.n;
	return n;
}

static struct node *parse_with(struct parser *ps, int line)
{
	static const char *const ends[] = { "endwith", NULL };
	struct node *n = mknode(ps, N_WITH, line);
	struct nvec assigns = { 0 };
	while (cur(ps)->t != T_BEND) {
		if (assigns.n)
			expect_op(ps, ',');
		struct sstr name = expect_name(ps);
		check_assign_name(ps, line, name);
		expect_op(ps, '=');
		nvec_push(ps, &assigns, parse_expr(ps, 1), name, 0);
	}
	next(ps);
	n->names = assigns.s;
	n->kids2 = assigns.v;
	n->nnames = n->nkids2 = assigns.n;
	struct nvec body = { 0 };
	parse_body(ps, ends, &body);
	next(ps);
	expect_bend(ps);
	n->kids = body.v;
	n->nkids = body.n;
	return n;
}

static struct node *parse_statement(struct parser *ps)
{
	struct token *t = next(ps); /* the tag's name */
	if (t->t != T_NAME) {
		char buf[64];
		perr(ps, t->line, "expected a tag name, got %s", tok_desc(t, buf, sizeof buf));
	}
	if (is_name(t, "if"))
		return parse_if(ps, t->line);
	if (is_name(t, "for"))
		return parse_for(ps, t->line);
	if (is_name(t, "set"))
		return parse_set(ps, t->line);
	if (is_name(t, "macro"))
		return parse_macro(ps, t->line);
	if (is_name(t, "call"))
		return parse_callblock(ps, t->line);
	if (is_name(t, "filter"))
		return parse_filterblock(ps, t->line);
	if (is_name(t, "with"))
		return parse_with(ps, t->line);
	if (is_name(t, "break") || is_name(t, "continue")) {
		if (!ps->loops)
			perr(ps, t->line, "'%.*s' outside a for loop", (int)t->s.n, t->s.p);
		expect_bend(ps);
		return mknode(ps, is_name(t, "break") ? N_BREAK : N_CONTINUE, t->line);
	}
	if (is_name(t, "generation")) {
		static const char *const ends[] = { "endgeneration", NULL };
		struct node *n = mknode(ps, N_GENERATION, t->line);
		struct nvec body = { 0 };
		expect_bend(ps);
		parse_body(ps, ends, &body);
		next(ps);
		expect_bend(ps);
		n->kids = body.v;
		n->nkids = body.n;
		return n;
	}
	if (t->s.n > 3 && memcmp(t->s.p, "end", 3) == 0)
		perr(ps, t->line, "unexpected '%.*s'", (int)t->s.n, t->s.p);
	perr(ps, t->line, "unsupported tag '%.*s'", t->s.n > 40 ? 40 : (int)t->s.n, t->s.p);
}

/* Statements up to one of the block tags ENDS (NULL-terminated; NULL: the
 * end of the template); leaves the parser on that tag's name. */
static void parse_body(struct parser *ps, const char *const *ends, struct nvec *out)
{
	struct sstr none = { 0 };
	enter(ps);
	for (;;) {
		struct token *t = cur(ps);
		struct node *n;
		if (t->t == T_EOF) {
			if (ends) {
				char want[128] = "";
				for (int i = 0; ends[i]; i++)
					snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'",
						 i ? " or " : "", ends[i]);
				perr(ps, t->line, "unexpected end of template: expected %s", want);
			}
			break;
		}
		if (t->t == T_DATA) {
			next(ps);
			n = mknode(ps, N_TEXT, t->line);
			n->v = v_str(t->s.p, t->s.n);
		} else if (t->t == T_VBEGIN) {
			next(ps);
			n = mknode(ps, N_OUTPUT, t->line);
			n->a = parse_tuple(ps, 0, 1, NULL, 0);
			if (cur(ps)->t != T_VEND) {
				char buf[64];
				perr(ps, cur(ps)->line, "expected end of print statement, got %s",
				     tok_desc(cur(ps), buf, sizeof buf));
			}
			next(ps);
		} else if (t->t == T_BBEGIN) {
			struct token *name = peek(ps, 1);
			int end = 0;
			for (int i = 0; ends && ends[i]; i++)
				if (is_name(name, ends[i]))
					end = 1;
			if (end) {
				next(ps);
				break;
			}
			next(ps);
			n = parse_statement(ps);
		} else {
			char buf[64];
			perr(ps, t->line, "unexpected %s", tok_desc(t, buf, sizeof buf));
		}
		nvec_push(ps, out, n, none, 0);
	}
	ps->depth--;
}

static void normalize_source(struct parser *ps, const char *src, size_t len)
{
	char *o = palloc(ps, len + 1);
	size_t k = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			o[k++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			o[k++] = src[i];
		}
	}
	if (k && o[k - 1] == '\n') /* keep_trailing_newline=False */
		k--;
	o[k] = '\0';
	ps->src = o;
	ps->len = k;
}

void jinja_limits_default(struct jinja_limits *lim)
{
	lim->max_steps = JINJA_MAX_STEPS;
	lim->max_depth = JINJA_MAX_DEPTH;
	lim->max_output = JINJA_MAX_OUTPUT;
	lim->max_memory = JINJA_MAX_MEMORY;
	lim->now = 0;
}

int jinja_compile(const char *src, size_t len, struct jinja_template **ret, char *err, size_t errlen)
{
	if (!ret || (!src && len))
		return -EINVAL;
	if (err && errlen)
		err[0] = '\0';
	struct jinja_template *t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	/* the parser's scratch (tokens) shares the template's arena */
	struct parser *ps = calloc(1, sizeof *ps);
	if (!ps) {
		free(t);
		return -ENOMEM;
	}
	ps->ar = &t->ar;
	ps->err = err;
	ps->errlen = errlen;
	ps->line = 1;
	if (setjmp(ps->jb)) {
		int code = ps->code;
		free(ps);
		jinja_free(t);
		return code;
	}
	normalize_source(ps, src ? src : "", len);
	lex(ps);
	struct nvec body = { 0 };
	parse_body(ps, NULL, &body);
	t->body = body.v;
	t->nbody = body.n;
	free(ps);
	*ret = t;
	return 0;
}

void jinja_free(struct jinja_template *t)
{
	if (!t)
		return;
	arena_free(&t->ar);
	free(t);
}

/* ---- the runtime ---- */

struct scope {
	struct scope *parent; /* the enclosing scope, NULL for the template's */
	struct dict vars;     /* names set here */
};

struct sbuf {
	char *p;              /* arena; not NUL-terminated */
	size_t n, cap;
};

struct rt {
	struct arena ar;          /* every value of this render */
	jmp_buf jb;
	char *err;
	size_t errlen;
	int code;                 /* what jinja_render returns after a longjmp */
	struct jinja_limits lim;
	uint64_t steps;           /* taken so far */
	uint32_t depth;           /* macro calls and captures open now */
	struct sbuf *out;         /* where text goes now */
	struct dict *globals;     /* the context's variables */
	locale_t loc;             /* C.UTF-8 for case mapping; made when first needed */
	int loc_tried;
	int line;                 /* of the node being run, for messages */
};

/* "line N: " and the message into the caller's buffer. */
static void rt_message(struct rt *rt, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void rt_message(struct rt *rt, const char *fmt, va_list ap)
{
	if (rt->err && rt->errlen) {
		int k = snprintf(rt->err, rt->errlen, "line %d: ", rt->line);
		if (k >= 0 && (size_t)k < rt->errlen)
			vsnprintf(rt->err + k, rt->errlen - (size_t)k, fmt, ap);
	}
}

/* A runtime error: unwinds to jinja_render, which returns -EINVAL. */
static void rerr(struct rt *rt, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void rerr(struct rt *rt, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	rt_message(rt, fmt, ap);
	va_end(ap);
	rt->code = -EINVAL;
	longjmp(rt->jb, 1);
}

/* A limit hit: unwinds to jinja_render, which returns -E2BIG. */
static void rlimit(struct rt *rt, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void rlimit(struct rt *rt, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	rt_message(rt, fmt, ap);
	va_end(ap);
	rt->code = -E2BIG;
	longjmp(rt->jb, 1);
}

static void *ralloc(struct rt *rt, size_t n)
{
	void *p = arena_alloc(&rt->ar, n);
	if (!p) {
		if (rt->ar.limit && (n >= rt->ar.limit || rt->ar.total + n + ABLOCK_SIZE > rt->ar.limit))
			rlimit(rt, "the template needs more than %zu bytes of memory", rt->lim.max_memory);
		if (rt->err && rt->errlen)
			snprintf(rt->err, rt->errlen, "out of memory");
		rt->code = -ENOMEM;
		longjmp(rt->jb, 1);
	}
	return p;
}

static void step(struct rt *rt, uint64_t k)
{
	rt->steps += k;
	if (rt->steps > rt->lim.max_steps)
		rlimit(rt, "the template takes more than %llu steps", (unsigned long long)rt->lim.max_steps);
}

static void sb_grow(struct rt *rt, struct sbuf *b, size_t more)
{
	if (more > SIZE_MAX / 2 - b->n)
		rlimit(rt, "a string grows too large");
	size_t cap = b->cap ? b->cap : 64;
	while (cap - b->n < more)
		cap *= 2;
	char *p = ralloc(rt, cap);
	if (b->n)
		memcpy(p, b->p, b->n);
	b->p = p;
	b->cap = cap;
}

static void sb_put(struct rt *rt, struct sbuf *b, const char *s, size_t n)
{
	if (b->cap - b->n < n)
		sb_grow(rt, b, n);
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void sb_putc(struct rt *rt, struct sbuf *b, char c)
{
	sb_put(rt, b, &c, 1);
}

static void sb_puts(struct rt *rt, struct sbuf *b, const char *s)
{
	sb_put(rt, b, s, strlen(s));
}

static void sb_printf(struct rt *rt, struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sb_printf(struct rt *rt, struct sbuf *b, const char *fmt, ...)
{
	char buf[128];
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (k > 0)
		sb_put(rt, b, buf, (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1);
}

static struct val sb_val(struct sbuf *b)
{
	return v_str(b->p ? b->p : "", b->n);
}

/* Text to the output (or to the block being captured). */
static void emit(struct rt *rt, const char *s, size_t n)
{
	if (n > rt->lim.max_output || rt->out->n > rt->lim.max_output - n)
		rlimit(rt, "the output is longer than %zu bytes", rt->lim.max_output);
	sb_put(rt, rt->out, s, n);
}

static struct val str_dup(struct rt *rt, const char *s, size_t n)
{
	char *p = ralloc(rt, n ? n : 1);
	if (n)
		memcpy(p, s, n);
	return v_str(p, n);
}

static struct list *list_new(struct rt *rt, size_t cap, int kind)
{
	struct list *l = ralloc(rt, sizeof *l);
	l->n = 0;
	l->cap = cap;
	l->kind = kind;
	l->v = cap ? ralloc(rt, cap * sizeof *l->v) : NULL;
	return l;
}

static void list_push(struct rt *rt, struct list *l, struct val v)
{
	if (l->n == l->cap) {
		if (l->cap > SIZE_MAX / 2 / sizeof *l->v)
			rlimit(rt, "a list grows too large");
		size_t cap = l->cap ? l->cap * 2 : 4;
		struct val *nv = ralloc(rt, cap * sizeof *nv);
		if (l->n)
			memcpy(nv, l->v, l->n * sizeof *nv);
		l->v = nv;
		l->cap = cap;
	}
	l->v[l->n++] = v;
}

static struct val v_list(struct list *l)
{
	struct val v = { .t = V_LIST };
	v.u.l = l;
	return v;
}

static struct val v_dict(struct dict *d, enum vtype t)
{
	struct val v = { .t = t };
	v.u.d = d;
	return v;
}

static struct dict *dict_new(struct rt *rt)
{
	struct dict *d = ralloc(rt, sizeof *d);
	memset(d, 0, sizeof *d);
	return d;
}

static int val_eq(const struct val *a, const struct val *b);

static long dict_find(const struct dict *d, const struct val *key)
{
	if (key->t == V_STR) {
		for (size_t i = 0; i < d->n; i++)
			if (d->k[i].t == V_STR && d->k[i].u.s.n == key->u.s.n &&
			    memcmp(d->k[i].u.s.p, key->u.s.p, key->u.s.n) == 0)
				return (long)i;
		return -1;
	}
	for (size_t i = 0; i < d->n; i++)
		if (val_eq(&d->k[i], key))
			return (long)i;
	return -1;
}

static long dict_find_s(const struct dict *d, const char *p, size_t n)
{
	struct val k = v_str(p, n);
	return dict_find(d, &k);
}

static void dict_set(struct rt *rt, struct dict *d, struct val key, struct val v)
{
	long i = dict_find(d, &key);
	if (i >= 0) {
		d->v[i] = v;
		return;
	}
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 4;
		struct val *nk = ralloc(rt, cap * sizeof *nk), *nv = ralloc(rt, cap * sizeof *nv);
		if (d->n) {
			memcpy(nk, d->k, d->n * sizeof *nk);
			memcpy(nv, d->v, d->n * sizeof *nv);
		}
		d->k = nk;
		d->v = nv;
		d->cap = cap;
	}
	d->k[d->n] = key;
	d->v[d->n] = v;
	d->n++;
}

static struct func *func_new(struct rt *rt, enum fkind kind, int id)
{
	struct func *f = ralloc(rt, sizeof *f);
	memset(f, 0, sizeof *f);
	f->kind = kind;
	f->id = id;
	return f;
}

static struct val v_func(struct func *f)
{
	struct val v = { .t = V_FUNC };
	v.u.fn = f;
	return v;
}

static const char *type_name(const struct val *v)
{
	switch (v->t) {
	case V_UNDEF: return "Undefined";
	case V_NONE: return "NoneType";
	case V_BOOL: return "bool";
	case V_INT: return "int";
	case V_FLOAT: return "float";
	case V_STR: return "str";
	case V_LIST: return v->u.l->kind == LK_TUPLE ? "tuple" : v->u.l->kind == LK_GEN ? "generator" : "list";
	case V_DICT: return "dict";
	case V_NS: return "Namespace";
	case V_FUNC: return "function";
	case V_LOOP: return "LoopContext";
	}
	return "object";
}

static void undefined_error(struct rt *rt, const struct val *v) __attribute__((noreturn));
static void undefined_error(struct rt *rt, const struct val *v)
{
	if (v->safe)
		rerr(rt, "%.*s", (int)v->u.s.n, v->u.s.p);
	if (v->u.s.n)
		rerr(rt, "'%.*s' is undefined", v->u.s.n > 80 ? 80 : (int)v->u.s.n, v->u.s.p);
	rerr(rt, "undefined value used");
}

static int truthy(const struct val *v)
{
	switch (v->t) {
	case V_UNDEF: case V_NONE: return 0;
	case V_BOOL: case V_INT: return v->u.i != 0;
	case V_FLOAT: return v->u.f != 0;
	case V_STR: return v->u.s.n != 0;
	case V_LIST: return v->u.l->kind == LK_GEN || v->u.l->n != 0;
	case V_DICT: return v->u.d->n != 0;
	default: return 1;
	}
}

static int is_num(const struct val *v)
{
	return v->t == V_BOOL || v->t == V_INT || v->t == V_FLOAT;
}

static double num_f(const struct val *v)
{
	return v->t == V_FLOAT ? v->u.f : (double)v->u.i;
}

/* ---- strings by code point, as Python indexes them ---- */

static int is_ascii(struct sstr s)
{
	for (size_t i = 0; i < s.n; i++)
		if ((unsigned char)s.p[i] >= 0x80)
			return 0;
	return 1;
}

static size_t cp_count(struct sstr s)
{
	size_t n = 0, len;
	for (size_t i = 0; i < s.n; i += len) {
		utf8_get(s.p, s.n, i, &len);
		n++;
	}
	return n;
}

/* Byte offsets of each character of S and of its end: (count + 1). */
static size_t *cp_offsets(struct rt *rt, struct sstr s, size_t *count)
{
	size_t n = cp_count(s), k = 0, len;
	size_t *off = ralloc(rt, (n + 1) * sizeof *off);
	for (size_t i = 0; i < s.n; i += len) {
		off[k++] = i;
		utf8_get(s.p, s.n, i, &len);
	}
	off[k] = s.n;
	*count = n;
	return off;
}

/* ---- Python's str() and repr() ---- */

/* repr(float), the shortest text that reads back as F. */
static void put_float(struct rt *rt, struct sbuf *b, double f, int json)
{
	char buf[64], digits[32], out[64];
	if (isnan(f)) {
		sb_puts(rt, b, json ? "NaN" : "nan");
		return;
	}
	if (isinf(f)) {
		sb_puts(rt, b, f < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
		return;
	}
	int prec;
	for (prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
		if (strtod(buf, NULL) == f)
			break;
	}
	/* buf: [-]d[.ddd]e[+-]XX */
	const char *p = buf;
	int neg = *p == '-', nd = 0;
	if (neg)
		p++;
	for (; *p && *p != 'e'; p++)
		if (*p != '.')
			digits[nd++] = *p;
	int exp = atoi(p + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	digits[nd] = '\0';
	size_t k = 0;
	if (neg)
		out[k++] = '-';
	if (exp >= -4 && exp < 16) {
		if (exp >= 0) {
			for (int i = 0; i <= exp; i++)
				out[k++] = i < nd ? digits[i] : '0';
			out[k++] = '.';
			if (nd > exp + 1)
				for (int i = exp + 1; i < nd; i++)
					out[k++] = digits[i];
			else
				out[k++] = '0';
		} else {
			out[k++] = '0';
			out[k++] = '.';
			for (int i = 0; i < -exp - 1; i++)
				out[k++] = '0';
			for (int i = 0; i < nd; i++)
				out[k++] = digits[i];
		}
		out[k] = '\0';
	} else {
		out[k++] = digits[0];
		if (nd > 1) {
			out[k++] = '.';
			for (int i = 1; i < nd; i++)
				out[k++] = digits[i];
		}
		snprintf(out + k, sizeof out - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
	sb_puts(rt, b, out);
}

static void put_repr(struct rt *rt, struct sbuf *b, const struct val *v, int depth);

static void put_str_repr(struct rt *rt, struct sbuf *b, struct sstr s)
{
	int sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
	char q = sq && !dq ? '"' : '\'';
	sb_putc(rt, b, q);
	size_t len;
	for (size_t i = 0; i < s.n; i += len) {
		uint32_t c = utf8_get(s.p, s.n, i, &len);
		if (c == (uint32_t)q || c == '\\') {
			sb_putc(rt, b, '\\');
			sb_putc(rt, b, (char)c);
		} else if (c == '\n') {
			sb_puts(rt, b, "\\n");
		} else if (c == '\r') {
			sb_puts(rt, b, "\\r");
		} else if (c == '\t') {
			sb_puts(rt, b, "\\t");
		} else if (len == 1 && c >= 0x80) {
			sb_printf(rt, b, "\\udc%02x", c); /* surrogateescape's view */
		} else if (!py_printable(c)) {
			if (c < 0x100)
				sb_printf(rt, b, "\\x%02x", c);
			else if (c < 0x10000)
				sb_printf(rt, b, "\\u%04x", c);
			else
				sb_printf(rt, b, "\\U%08x", c);
		} else {
			sb_put(rt, b, s.p + i, len);
		}
	}
	sb_putc(rt, b, q);
}

/* str(V) into B */
static void put_str(struct rt *rt, struct sbuf *b, const struct val *v, int depth)
{
	switch (v->t) {
	case V_UNDEF: return;
	case V_STR: sb_put(rt, b, v->u.s.p, v->u.s.n); return;
	default: put_repr(rt, b, v, depth);
	}
}

static void put_repr(struct rt *rt, struct sbuf *b, const struct val *v, int depth)
{
	if (depth > 200)
		rlimit(rt, "a value nested too deeply to print");
	switch (v->t) {
	case V_UNDEF: return;
	case V_NONE: sb_puts(rt, b, "None"); return;
	case V_BOOL: sb_puts(rt, b, v->u.i ? "True" : "False"); return;
	case V_INT: sb_printf(rt, b, "%lld", (long long)v->u.i); return;
	case V_FLOAT: put_float(rt, b, v->u.f, 0); return;
	case V_STR: put_str_repr(rt, b, v->u.s); return;
	case V_LIST: {
		const struct list *l = v->u.l;
		if (l->kind == LK_GEN)
			rerr(rt, "cannot print a generator (add |list)");
		sb_putc(rt, b, l->kind == LK_TUPLE ? '(' : '[');
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				sb_puts(rt, b, ", ");
			step(rt, 1);
			put_repr(rt, b, &l->v[i], depth + 1);
		}
		if (l->kind == LK_TUPLE && l->n == 1)
			sb_putc(rt, b, ',');
		sb_putc(rt, b, l->kind == LK_TUPLE ? ')' : ']');
		return;
	}
	case V_DICT: case V_NS: {
		const struct dict *d = v->u.d;
		if (v->t == V_NS)
			sb_puts(rt, b, "<Namespace ");
		sb_putc(rt, b, '{');
		for (size_t i = 0; i < d->n; i++) {
			if (i)
				sb_puts(rt, b, ", ");
			step(rt, 1);
			put_repr(rt, b, &d->k[i], depth + 1);
			sb_puts(rt, b, ": ");
			put_repr(rt, b, &d->v[i], depth + 1);
		}
		sb_putc(rt, b, '}');
		if (v->t == V_NS)
			sb_putc(rt, b, '>');
		return;
	}
	case V_FUNC:
		sb_printf(rt, b, "<function %.*s>", (int)v->u.fn->name.n, v->u.fn->name.p ? v->u.fn->name.p : "");
		return;
	case V_LOOP:
		sb_printf(rt, b, "<LoopContext %zu/%zu>", v->u.lp->index0 + 1, v->u.lp->items->n);
		return;
	}
}

static struct sstr to_str(struct rt *rt, const struct val *v)
{
	if (v->t == V_STR)
		return v->u.s;
	if (v->t == V_UNDEF) {
		struct sstr e = { "", 0 };
		return e;
	}
	struct sbuf b = { 0 };
	put_str(rt, &b, v, 0);
	struct sstr s = { b.p ? b.p : "", b.n };
	return s;
}

/* ---- equality and order, as Python's ---- */

static int val_eq(const struct val *a, const struct val *b)
{
	if (is_num(a) && is_num(b)) {
		if (a->t != V_FLOAT && b->t != V_FLOAT)
			return a->u.i == b->u.i;
		return num_f(a) == num_f(b);
	}
	if (a->t != b->t)
		return 0;
	switch (a->t) {
	case V_UNDEF: case V_NONE: return 1;
	case V_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
	case V_LIST: {
		const struct list *x = a->u.l, *y = b->u.l;
		if (x == y)
			return 1;
		if (x->kind != y->kind || x->kind == LK_GEN || x->n != y->n)
			return 0;
		for (size_t i = 0; i < x->n; i++)
			if (!val_eq(&x->v[i], &y->v[i]))
				return 0;
		return 1;
	}
	case V_DICT: {
		const struct dict *x = a->u.d, *y = b->u.d;
		if (x == y)
			return 1;
		if (x->n != y->n)
			return 0;
		for (size_t i = 0; i < x->n; i++) {
			long j = dict_find(y, &x->k[i]);
			if (j < 0 || !val_eq(&x->v[i], &y->v[j]))
				return 0;
		}
		return 1;
	}
	case V_NS: return a->u.d == b->u.d;
	case V_FUNC: return a->u.fn == b->u.fn;
	case V_LOOP: return a->u.lp == b->u.lp;
	default: return 0;
	}
}

/* <0, 0, >0 as A < B, ==, >; a TypeError where Python has one. */
static int val_cmp(struct rt *rt, const struct val *a, const struct val *b)
{
	if (a->t == V_UNDEF || b->t == V_UNDEF)
		undefined_error(rt, a->t == V_UNDEF ? a : b);
	if (is_num(a) && is_num(b)) {
		if (a->t != V_FLOAT && b->t != V_FLOAT)
			return (a->u.i > b->u.i) - (a->u.i < b->u.i);
		double x = num_f(a), y = num_f(b);
		return (x > y) - (x < y);
	}
	if (a->t == V_STR && b->t == V_STR) {
		size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
		int c = n ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
		if (c)
			return c;
		return (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
	}
	if (a->t == V_LIST && b->t == V_LIST && a->u.l->kind == b->u.l->kind && a->u.l->kind != LK_GEN) {
		const struct list *x = a->u.l, *y = b->u.l;
		for (size_t i = 0; i < x->n && i < y->n; i++) {
			if (val_eq(&x->v[i], &y->v[i]))
				continue;
			return val_cmp(rt, &x->v[i], &y->v[i]);
		}
		return (x->n > y->n) - (x->n < y->n);
	}
	rerr(rt, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

/* ---- methods of str, dict, list and loop ---- */

enum method_id {
	M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH,
	M_REPLACE, M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_FIND, M_RFIND,
	M_INDEX, M_RINDEX, M_COUNT, M_FORMAT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM,
	M_ISSPACE, M_ISUPPER, M_ISLOWER, M_PARTITION, M_RPARTITION, M_LJUST, M_RJUST,
	M_CENTER, M_ZFILL, M_STR_N,
	M_ITEMS = M_STR_N, M_KEYS, M_VALUES, M_GET, M_COPY,
	M_CYCLE, M_CHANGED,
};

static const char *const str_methods[M_STR_N] = {
	"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
	"replace", "upper", "lower", "title", "capitalize", "swapcase", "find", "rfind",
	"index", "rindex", "count", "format", "join", "isdigit", "isalpha", "isalnum",
	"isspace", "isupper", "islower", "partition", "rpartition", "ljust", "rjust",
	"center", "zfill",
};

static const char *const dict_methods[] = { "items", "keys", "values", "get", "copy" };
static const char *const dict_unsafe[] = { "pop", "popitem", "setdefault", "update", "clear",
					   "fromkeys" };
static const char *const list_unsafe[] = { "append", "extend", "insert", "pop", "remove",
					   "reverse", "sort", "clear" };

static struct val method(struct rt *rt, struct val self, int id, struct sstr name)
{
	struct func *f = func_new(rt, FN_METHOD, id);
	f->self = self;
	f->name = name;
	return v_func(f);
}

static struct val unsafe(struct rt *rt, struct sstr name, const struct val *self)
{
	struct func *f = func_new(rt, FN_UNSAFE, 0);
	f->self = *self;
	f->name = name;
	return v_func(f);
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* obj.NAME as jinja2's sandboxed getattr sees it: an attribute (a method,
 * a namespace's or a loop's field) first; for dicts then the item. */
static struct val get_item(struct rt *rt, struct val obj, struct val key, int fallback);

static struct val loop_attr(struct rt *rt, struct loop *lp, struct sstr name, int *found)
{
	size_t n = lp->items->n, i = lp->index0;
	*found = 1;
	if (seq_eq(name, "index"))
		return v_int((int64_t)i + 1);
	if (seq_eq(name, "index0"))
		return v_int((int64_t)i);
	if (seq_eq(name, "revindex"))
		return v_int((int64_t)(n - i));
	if (seq_eq(name, "revindex0"))
		return v_int((int64_t)(n - i - 1));
	if (seq_eq(name, "first"))
		return v_bool(i == 0);
	if (seq_eq(name, "last"))
		return v_bool(i + 1 == n);
	if (seq_eq(name, "length"))
		return v_int((int64_t)n);
	if (seq_eq(name, "depth"))
		return v_int(lp->depth0 + 1);
	if (seq_eq(name, "depth0"))
		return v_int(lp->depth0);
	if (seq_eq(name, "previtem"))
		return i > 0 ? lp->items->v[i - 1] : v_undef_named(name);
	if (seq_eq(name, "nextitem"))
		return i + 1 < n ? lp->items->v[i + 1] : v_undef_named(name);
	struct val self = { .t = V_LOOP };
	self.u.lp = lp;
	if (seq_eq(name, "cycle"))
		return method(rt, self, M_CYCLE, name);
	if (seq_eq(name, "changed"))
		return method(rt, self, M_CHANGED, name);
	*found = 0;
	return v_undef_named(name);
}

static struct val get_attr(struct rt *rt, struct val obj, struct sstr name, int fallback)
{
	int i, found;
	switch (obj.t) {
	case V_UNDEF:
		undefined_error(rt, &obj);
	case V_STR:
		if ((i = find_name(str_methods, M_STR_N, name)) >= 0)
			return method(rt, obj, i, name);
		break;
	case V_DICT:
		if ((i = find_name(dict_methods, N_OF(dict_methods), name)) >= 0)
			return method(rt, obj, M_ITEMS + i, name);
		if (find_name(dict_unsafe, N_OF(dict_unsafe), name) >= 0)
			return unsafe(rt, name, &obj);
		if (fallback)
			return get_item(rt, obj, v_str(name.p, name.n), 0);
		break;
	case V_NS: {
		long k = dict_find_s(obj.u.d, name.p, name.n);
		if (k >= 0)
			return obj.u.d->v[k];
		break;
	}
	case V_LIST:
		if (obj.u.l->kind == LK_GEN)
			break;
		if (seq_eq(name, "index"))
			return method(rt, obj, M_INDEX, name);
		if (seq_eq(name, "count"))
			return method(rt, obj, M_COUNT, name);
		if (seq_eq(name, "copy") && obj.u.l->kind == LK_LIST)
			return method(rt, obj, M_COPY, name);
		if (obj.u.l->kind == LK_LIST && find_name(list_unsafe, N_OF(list_unsafe), name) >= 0)
			return unsafe(rt, name, &obj);
		break;
	case V_LOOP: {
		struct val v = loop_attr(rt, obj.u.lp, name, &found);
		if (found)
			return v;
		break;
	}
	default:
		break;
	}
	return v_undef_named(name);
}

static int64_t as_index(const struct val *v, int *ok)
{
	*ok = v->t == V_INT || v->t == V_BOOL;
	return *ok ? v->u.i : 0;
}

/* obj[KEY]; with FALLBACK, a string KEY that is no item is tried as an
 * attribute, as jinja2's getitem does. */
static struct val get_item(struct rt *rt, struct val obj, struct val key, int fallback)
{
	int ok;
	int64_t i;
	struct sstr none = { 0 };
	if (key.t == V_UNDEF && obj.t != V_UNDEF)
		undefined_error(rt, &key);
	switch (obj.t) {
	case V_UNDEF:
		undefined_error(rt, &obj);
	case V_DICT: {
		long k = dict_find(obj.u.d, &key);
		if (k >= 0)
			return obj.u.d->v[k];
		break;
	}
	case V_LIST:
		if (obj.u.l->kind == LK_GEN)
			break;
		i = as_index(&key, &ok);
		if (ok) {
			int64_t n = (int64_t)obj.u.l->n;
			if (i < 0)
				i += n;
			if (i >= 0 && i < n)
				return obj.u.l->v[i];
			struct sbuf msg = { 0 };
			sb_printf(rt, &msg, "%s object has no element %lld", type_name(&obj), (long long)key.u.i);
			struct val u = v_undef_named(sb_val(&msg).u.s);
			u.safe = 1;
			return u;
		}
		break;
	case V_STR:
		i = as_index(&key, &ok);
		if (ok) {
			if (is_ascii(obj.u.s)) {
				int64_t n = (int64_t)obj.u.s.n;
				if (i < 0)
					i += n;
				if (i >= 0 && i < n)
					return v_str(obj.u.s.p + i, 1);
			} else {
				size_t n;
				size_t *off = cp_offsets(rt, obj.u.s, &n);
				if (i < 0)
					i += (int64_t)n;
				if (i >= 0 && i < (int64_t)n)
					return v_str(obj.u.s.p + off[i], off[i + 1] - off[i]);
			}
			return v_undef_named(none);
		}
		break;
	default:
		break;
	}
	if (fallback && key.t == V_STR)
		return get_attr(rt, obj, key.u.s, 0);
	return v_undef_named(key.t == V_STR ? key.u.s : none);
}

/* Python's slice.indices(): START, STOP, STEP (each maybe absent) on a
 * sequence of N items; the indices picked go to OUT, their count is
 * returned. */
static size_t slice_indices(struct rt *rt, int64_t n, const struct val *vs, const struct val *ve,
			    const struct val *vstep, int64_t **out)
{
	int ok;
	int64_t st = 1, start, stop;
	if (vstep && vstep->t != V_NONE) {
		st = as_index(vstep, &ok);
		if (!ok)
			rerr(rt, "slice indices must be integers or None");
		if (st == 0)
			rerr(rt, "slice step cannot be zero");
	}
	if (st < -INT64_MAX)
		st = -INT64_MAX;
	if (!vs || vs->t == V_NONE) {
		start = st < 0 ? n - 1 : 0;
	} else {
		start = as_index(vs, &ok);
		if (!ok)
			rerr(rt, "slice indices must be integers or None");
		if (start < 0) {
			start = start < -n ? (st < 0 ? -1 : 0) : start + n;
		} else if (start >= n) {
			start = st < 0 ? n - 1 : n;
		}
	}
	if (!ve || ve->t == V_NONE) {
		stop = st < 0 ? -1 : n;
	} else {
		stop = as_index(ve, &ok);
		if (!ok)
			rerr(rt, "slice indices must be integers or None");
		if (stop < 0) {
			stop = stop < -n ? (st < 0 ? -1 : 0) : stop + n;
		} else if (stop >= n) {
			stop = st < 0 ? n - 1 : n;
		}
	}
	size_t count = 0;
	if (st > 0 && start < stop)
		count = (size_t)((stop - start - 1) / st + 1);
	else if (st < 0 && start > stop)
		count = (size_t)((start - stop - 1) / -st + 1);
	step(rt, count);
	*out = ralloc(rt, (count ? count : 1) * sizeof **out);
	for (size_t k = 0; k < count; k++)
		(*out)[k] = start + (int64_t)k * st;
	return count;
}

static struct val slice(struct rt *rt, struct val obj, const struct val *a, const struct val *b,
			const struct val *c)
{
	int64_t *idx;
	size_t k;
	if (obj.t == V_UNDEF)
		undefined_error(rt, &obj);
	if (obj.t == V_LIST && obj.u.l->kind != LK_GEN) {
		size_t count = slice_indices(rt, (int64_t)obj.u.l->n, a, b, c, &idx);
		struct list *l = list_new(rt, count, obj.u.l->kind);
		for (k = 0; k < count; k++)
			l->v[k] = obj.u.l->v[idx[k]];
		l->n = count;
		return v_list(l);
	}
	if (obj.t == V_STR) {
		size_t n;
		size_t *off = cp_offsets(rt, obj.u.s, &n);
		size_t count = slice_indices(rt, (int64_t)n, a, b, c, &idx);
		if (count && (!c || c->t == V_NONE || (c->t == V_INT && c->u.i == 1)))
			return v_str(obj.u.s.p + off[idx[0]], off[idx[count - 1] + 1] - off[idx[0]]);
		struct sbuf sb = { 0 };
		for (k = 0; k < count; k++)
			sb_put(rt, &sb, obj.u.s.p + off[idx[k]], off[idx[k] + 1] - off[idx[k]]);
		return sb_val(&sb);
	}
	struct sstr none = { 0 };
	return v_undef_named(none); /* jinja2: a failed getitem is undefined */
}

/* The items of a for loop over V (a dict gives its keys, a string its
 * characters); a TypeError for what Python cannot iterate. */
static struct list *iterate(struct rt *rt, struct val v)
{
	switch (v.t) {
	case V_UNDEF:
		return list_new(rt, 0, LK_LIST);
	case V_LIST:
		return v.u.l;
	case V_DICT: {
		struct list *l = list_new(rt, v.u.d->n, LK_LIST);
		memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
		l->n = v.u.d->n;
		return l;
	}
	case V_STR: {
		size_t n, len;
		n = cp_count(v.u.s);
		struct list *l = list_new(rt, n, LK_LIST);
		for (size_t i = 0; i < v.u.s.n; i += len) {
			utf8_get(v.u.s.p, v.u.s.n, i, &len);
			l->v[l->n++] = v_str(v.u.s.p + i, len);
		}
		return l;
	}
	default:
		rerr(rt, "'%s' object is not iterable", type_name(&v));
	}
}

static int64_t py_len(struct rt *rt, const struct val *v)
{
	switch (v->t) {
	case V_UNDEF: return 0;
	case V_STR: return (int64_t)cp_count(v->u.s);
	case V_LIST:
		if (v->u.l->kind == LK_GEN)
			break;
		return (int64_t)v->u.l->n;
	case V_DICT: return (int64_t)v->u.d->n;
	default: break;
	}
	rerr(rt, "object of type '%s' has no len()", type_name(v));
}

static int contains(struct rt *rt, const struct val *needle, const struct val *hay)
{
	switch (hay->t) {
	case V_UNDEF:
		return 0;
	case V_STR:
		if (needle->t != V_STR)
			rerr(rt, "'in <string>' requires string as left operand, not %s", type_name(needle));
		return needle->u.s.n == 0 || memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
	case V_LIST:
		step(rt, hay->u.l->n);
		for (size_t i = 0; i < hay->u.l->n; i++)
			if (val_eq(needle, &hay->u.l->v[i]))
				return 1;
		return 0;
	case V_DICT:
		step(rt, hay->u.d->n / 8);
		return dict_find(hay->u.d, needle) >= 0;
	default:
		rerr(rt, "argument of type '%s' is not iterable", type_name(hay));
	}
}

/* ---- arithmetic ---- */

static struct val concat_lists(struct rt *rt, const struct list *a, const struct list *b)
{
	if (a->n > SIZE_MAX / 4 - b->n)
		rlimit(rt, "a list grows too large");
	struct list *l = list_new(rt, a->n + b->n, a->kind);
	if (a->n)
		memcpy(l->v, a->v, a->n * sizeof *l->v);
	if (b->n)
		memcpy(l->v + a->n, b->v, b->n * sizeof *l->v);
	l->n = a->n + b->n;
	step(rt, l->n / 16);
	return v_list(l);
}

static struct val repeat(struct rt *rt, const struct val *seq, int64_t times)
{
	if (times < 0)
		times = 0;
	if (seq->t == V_STR) {
		if (seq->u.s.n && (uint64_t)times > rt->lim.max_memory / seq->u.s.n)
			rlimit(rt, "the template needs more than %zu bytes of memory", rt->lim.max_memory);
		struct sbuf b = { 0 };
		for (int64_t i = 0; i < times; i++)
			sb_put(rt, &b, seq->u.s.p, seq->u.s.n);
		step(rt, (uint64_t)times / 16);
		return sb_val(&b);
	}
	const struct list *s = seq->u.l;
	if (s->n && (uint64_t)times > rt->lim.max_memory / (s->n * sizeof(struct val)))
		rlimit(rt, "the template needs more than %zu bytes of memory", rt->lim.max_memory);
	struct list *l = list_new(rt, s->n * (size_t)times, s->kind);
	for (int64_t i = 0; i < times; i++)
		for (size_t k = 0; k < s->n; k++)
			l->v[l->n++] = s->v[k];
	step(rt, l->n / 16);
	return v_list(l);
}

static struct val percent_format(struct rt *rt, struct sstr fmt, struct val args);
static struct val html_escape(struct rt *rt, struct sstr s);

static struct val binop_val(struct rt *rt, int op, struct val a, struct val b)
{
	static const char *const sym[] = { "", "+", "-", "*", "/", "//", "%", "**" };
	if (a.t == V_UNDEF)
		undefined_error(rt, &a);
	if (b.t == V_UNDEF)
		undefined_error(rt, &b);
	if (is_num(&a) && is_num(&b)) {
		if (a.t != V_FLOAT && b.t != V_FLOAT) {
			int64_t x = a.u.i, y = b.u.i, r;
			switch (op) {
			case OP_ADD:
				if (__builtin_add_overflow(x, y, &r))
					rerr(rt, "integer overflow");
				return v_int(r);
			case OP_SUB:
				if (__builtin_sub_overflow(x, y, &r))
					rerr(rt, "integer overflow");
				return v_int(r);
			case OP_MUL:
				if (__builtin_mul_overflow(x, y, &r))
					rerr(rt, "integer overflow");
				return v_int(r);
			case OP_DIV:
				if (y == 0)
					rerr(rt, "division by zero");
				return v_float((double)x / (double)y);
			case OP_FLOORDIV: case OP_MOD: {
				if (y == 0)
					rerr(rt, "integer division or modulo by zero");
				if (x == INT64_MIN && y == -1) {
					if (op == OP_MOD)
						return v_int(0);
					rerr(rt, "integer overflow");
				}
				int64_t q = x / y, m = x % y;
				if (m && ((m < 0) != (y < 0))) {
					q--;
					m += y;
				}
				return v_int(op == OP_MOD ? m : q);
			}
			case OP_POW:
				if (y < 0)
					return v_float(pow((double)x, (double)y));
				r = 1;
				for (int64_t base = x, e = y; e; e >>= 1) {
					if ((e & 1) && __builtin_mul_overflow(r, base, &r))
						rerr(rt, "integer overflow");
					if ((e >> 1) && __builtin_mul_overflow(base, base, &base))
						rerr(rt, "integer overflow");
				}
				return v_int(r);
			}
		}
		double x = num_f(&a), y = num_f(&b);
		switch (op) {
		case OP_ADD: return v_float(x + y);
		case OP_SUB: return v_float(x - y);
		case OP_MUL: return v_float(x * y);
		case OP_DIV:
			if (y == 0)
				rerr(rt, "float division by zero");
			return v_float(x / y);
		case OP_FLOORDIV:
			if (y == 0)
				rerr(rt, "float floor division by zero");
			return v_float(floor(x / y));
		case OP_MOD: {
			if (y == 0)
				rerr(rt, "float modulo");
			double m = fmod(x, y);
			if (m != 0 && ((m < 0) != (y < 0)))
				m += y;
			return v_float(m);
		}
		case OP_POW:
			if (x == 0 && y < 0)
				rerr(rt, "0.0 cannot be raised to a negative power");
			return v_float(pow(x, y));
		}
	}
	if (op == OP_ADD && a.t == V_STR && b.t == V_STR && a.safe != b.safe) {
		/* Markup + str: the str is escaped, the sum is Markup */
		struct val r = binop_val(rt, OP_ADD, a.safe ? a : html_escape(rt, a.u.s), b.safe ? b : html_escape(rt, b.u.s));
		r.safe = 1;
		return r;
	}
	if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
		if (a.u.s.n > rt->lim.max_memory || b.u.s.n > rt->lim.max_memory - a.u.s.n)
			rlimit(rt, "the template needs more than %zu bytes of memory", rt->lim.max_memory);
		char *p = ralloc(rt, a.u.s.n + b.u.s.n + 1);
		memcpy(p, a.u.s.p, a.u.s.n);
		memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
		step(rt, (a.u.s.n + b.u.s.n) / 256);
		struct val r = v_str(p, a.u.s.n + b.u.s.n);
		r.safe = a.safe;
		return r;
	}
	if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.u.l->kind == b.u.l->kind &&
	    a.u.l->kind != LK_GEN)
		return concat_lists(rt, a.u.l, b.u.l);
	if (op == OP_MUL) {
		if ((a.t == V_STR || (a.t == V_LIST && a.u.l->kind != LK_GEN)) && (b.t == V_INT || b.t == V_BOOL))
			return repeat(rt, &a, b.u.i);
		if ((b.t == V_STR || (b.t == V_LIST && b.u.l->kind != LK_GEN)) && (a.t == V_INT || a.t == V_BOOL))
			return repeat(rt, &b, a.u.i);
	}
	if (op == OP_MOD && a.t == V_STR)
		return percent_format(rt, a.u.s, b);
	rerr(rt, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(&a), type_name(&b));
}

/* ---- string functions ---- */

static locale_t rt_locale(struct rt *rt)
{
	if (!rt->loc_tried) {
		rt->loc_tried = 1;
		rt->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
	}
	return rt->loc;
}

enum { CASE_UPPER, CASE_LOWER, CASE_SWAP };

static uint32_t map_case(struct rt *rt, uint32_t c, int how)
{
	if (c < 0x80) {
		int up = c >= 'a' && c <= 'z', low = c >= 'A' && c <= 'Z';
		if ((how == CASE_UPPER || how == CASE_SWAP) && up)
			return c - 32;
		if ((how == CASE_LOWER || how == CASE_SWAP) && low)
			return c + 32;
		return c;
	}
	locale_t loc = rt_locale(rt);
	if (!loc || c > 0x10ffff)
		return c;
	wint_t w = (wint_t)c;
	if (how == CASE_UPPER)
		return (uint32_t)towupper_l(w, loc);
	if (how == CASE_LOWER)
		return (uint32_t)towlower_l(w, loc);
	if (iswupper_l(w, loc))
		return (uint32_t)towlower_l(w, loc);
	return (uint32_t)towupper_l(w, loc);
}

static int is_cased(struct rt *rt, uint32_t c)
{
	if (c < 0x80)
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
	locale_t loc = rt_locale(rt);
	return loc && (iswupper_l((wint_t)c, loc) || iswlower_l((wint_t)c, loc));
}

static int is_alpha_cp(struct rt *rt, uint32_t c)
{
	if (c < 0x80)
		return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
	locale_t loc = rt_locale(rt);
	return loc && iswalpha_l((wint_t)c, loc);
}

static int is_digit_cp(uint32_t c)
{
	return c >= '0' && c <= '9';
}

/* S with each character put through map_case(HOW); with TITLE, Python's
 * str.title() (upper after an uncased character, lower after a cased). */
static struct val str_case(struct rt *rt, struct sstr s, int how, int title)
{
	struct sbuf b = { 0 };
	size_t len;
	int prev_cased = 0;
	char tmp[4];
	step(rt, s.n / 64);
	for (size_t i = 0; i < s.n; i += len) {
		uint32_t c = utf8_get(s.p, s.n, i, &len);
		if (len == 1 && c >= 0x80) {
			sb_put(rt, &b, s.p + i, 1);
			continue;
		}
		uint32_t m = title ? map_case(rt, c, prev_cased ? CASE_LOWER : CASE_UPPER) : map_case(rt, c, how);
		if (title)
			prev_cased = is_cased(rt, c);
		sb_put(rt, &b, tmp, utf8_encode(tmp, m));
	}
	return sb_val(&b);
}

/* first character upper, the rest lower (str.capitalize) */
static struct val str_capitalize(struct rt *rt, struct sstr s)
{
	if (!s.n)
		return v_str("", 0);
	size_t len;
	utf8_get(s.p, s.n, 0, &len);
	struct sstr head = { s.p, len }, tail = { s.p + len, s.n - len };
	struct val h = str_case(rt, head, CASE_UPPER, 0), t = str_case(rt, tail, CASE_LOWER, 0);
	return binop_val(rt, OP_ADD, h, t);
}

/* Is character C in the set CHARS (NULL: Python's whitespace)? */
static int in_chars(uint32_t c, const struct sstr *chars)
{
	if (!chars)
		return py_space(c);
	size_t len;
	for (size_t i = 0; i < chars->n; i += len)
		if (utf8_get(chars->p, chars->n, i, &len) == c)
			return 1;
	return 0;
}

static struct sstr str_strip(struct sstr s, const struct sstr *chars, int left, int right)
{
	size_t len;
	if (left) {
		while (s.n) {
			uint32_t c = utf8_get(s.p, s.n, 0, &len);
			if (!in_chars(c, chars))
				break;
			s.p += len;
			s.n -= len;
		}
	}
	if (right) {
		while (s.n) {
			size_t k = 1;
			while (k < s.n && k < 4 && ((unsigned char)s.p[s.n - k] & 0xc0) == 0x80)
				k++;
			uint32_t c = utf8_get(s.p, s.n, s.n - k, &len);
			if (len != k) {
				k = 1;
				c = (unsigned char)s.p[s.n - 1];
			}
			if (!in_chars(c, chars))
				break;
			s.n -= k;
		}
	}
	return s;
}

static const char *find_bytes(struct sstr hay, struct sstr needle, size_t from)
{
	if (from > hay.n)
		return NULL;
	if (!needle.n)
		return hay.p + from;
	return memmem(hay.p + from, hay.n - from, needle.p, needle.n);
}

static const char *rfind_bytes(struct sstr hay, struct sstr needle)
{
	if (needle.n > hay.n)
		return NULL;
	for (size_t i = hay.n - needle.n + 1; i-- > 0;)
		if (memcmp(hay.p + i, needle.p, needle.n) == 0)
			return hay.p + i;
	return NULL;
}

/* str.split / rsplit: SEP NULL splits at runs of whitespace. */
static struct val str_split(struct rt *rt, struct sstr s, const struct sstr *sep, int64_t maxsplit, int from_right)
{
	struct list *l = list_new(rt, 0, LK_LIST);
	step(rt, s.n / 64);
	if (sep && !sep->n)
		rerr(rt, "empty separator");
	if (!from_right) {
		size_t i = 0;
		if (!sep) {
			for (;;) {
				size_t k;
				while (i < s.n && (k = space_at(s.p, s.n, i)))
					i += k;
				if (i >= s.n)
					break;
				if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
					struct sstr rest = str_strip((struct sstr){ s.p + i, s.n - i }, NULL, 0, 1);
					list_push(rt, l, v_str(rest.p, rest.n));
					break;
				}
				size_t j = i;
				while (j < s.n && !space_at(s.p, s.n, j))
					j++;
				list_push(rt, l, v_str(s.p + i, j - i));
				i = j;
			}
			return v_list(l);
		}
		for (;;) {
			const char *hit = maxsplit >= 0 && (int64_t)l->n == maxsplit ? NULL : find_bytes(s, *sep, i);
			if (!hit) {
				list_push(rt, l, v_str(s.p + i, s.n - i));
				return v_list(l);
			}
			list_push(rt, l, v_str(s.p + i, (size_t)(hit - s.p) - i));
			i = (size_t)(hit - s.p) + sep->n;
		}
	}
	/* from the right: collect reversed, then flip */
	size_t end = s.n;
	if (!sep) {
		for (;;) {
			size_t k;
			while (end && (k = space_before(s.p, end)))
				end -= k;
			if (!end)
				break;
			if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
				struct sstr rest = str_strip((struct sstr){ s.p, end }, NULL, 1, 0);
				list_push(rt, l, v_str(rest.p, rest.n));
				break;
			}
			size_t j = end;
			while (j && !space_before(s.p, j))
				j--;
			list_push(rt, l, v_str(s.p + j, end - j));
			end = j;
		}
	} else {
		for (;;) {
			struct sstr head = { s.p, end };
			const char *hit = maxsplit >= 0 && (int64_t)l->n == maxsplit ? NULL : rfind_bytes(head, *sep);
			if (!hit) {
				list_push(rt, l, v_str(s.p, end));
				break;
			}
			size_t at = (size_t)(hit - s.p);
			list_push(rt, l, v_str(s.p + at + sep->n, end - at - sep->n));
			end = at;
		}
	}
	for (size_t i = 0; i < l->n / 2; i++) {
		struct val t = l->v[i];
		l->v[i] = l->v[l->n - 1 - i];
		l->v[l->n - 1 - i] = t;
	}
	return v_list(l);
}

/* Length of the line break at S[I] (\r\n is one), 0 if none. */
static size_t line_break_at(struct sstr s, size_t i)
{
	size_t len;
	uint32_t c = utf8_get(s.p, s.n, i, &len);
	if (c == '\r' && i + 1 < s.n && s.p[i + 1] == '\n')
		return 2;
	if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
	    c == 0x85 || c == 0x2028 || c == 0x2029)
		return len;
	return 0;
}

static struct val str_splitlines(struct rt *rt, struct sstr s, int keepends)
{
	struct list *l = list_new(rt, 0, LK_LIST);
	size_t start = 0, i = 0, len;
	step(rt, s.n / 64);
	while (i < s.n) {
		size_t k = line_break_at(s, i);
		if (!k) {
			utf8_get(s.p, s.n, i, &len);
			i += len;
			continue;
		}
		list_push(rt, l, v_str(s.p + start, (keepends ? i + k : i) - start));
		i += k;
		start = i;
	}
	if (start < s.n)
		list_push(rt, l, v_str(s.p + start, s.n - start));
	return v_list(l);
}

static struct val str_replace(struct rt *rt, struct sstr s, struct sstr old, struct sstr new_, int64_t count)
{
	struct sbuf b = { 0 };
	size_t i = 0, len;
	int64_t done = 0;
	step(rt, s.n / 64);
	if (!old.n) {
		for (;;) {
			if (count >= 0 && done >= count) {
				sb_put(rt, &b, s.p + i, s.n - i);
				break;
			}
			sb_put(rt, &b, new_.p, new_.n);
			done++;
			if (i >= s.n)
				break;
			utf8_get(s.p, s.n, i, &len);
			sb_put(rt, &b, s.p + i, len);
			i += len;
		}
		return sb_val(&b);
	}
	for (;;) {
		const char *hit = count >= 0 && done >= count ? NULL : find_bytes(s, old, i);
		if (!hit) {
			sb_put(rt, &b, s.p + i, s.n - i);
			break;
		}
		sb_put(rt, &b, s.p + i, (size_t)(hit - s.p) - i);
		sb_put(rt, &b, new_.p, new_.n);
		i = (size_t)(hit - s.p) + old.n;
		done++;
	}
	return sb_val(&b);
}

/* code points in S before byte OFF */
static int64_t cp_index(struct sstr s, size_t off)
{
	struct sstr head = { s.p, off };
	return (int64_t)cp_count(head);
}

/* ---- printf-style % and str.format ---- */

static struct val percent_format(struct rt *rt, struct sstr fmt, struct val args)
{
	struct sbuf b = { 0 };
	const struct val *argv = &args;
	size_t argc = 1, used = 0;
	if (args.t == V_LIST && args.u.l->kind == LK_TUPLE) {
		argv = args.u.l->v;
		argc = args.u.l->n;
	}
	for (size_t i = 0; i < fmt.n; i++) {
		if (fmt.p[i] != '%') {
			sb_putc(rt, &b, fmt.p[i]);
			continue;
		}
		char spec[32];
		size_t k = 0;
		spec[k++] = '%';
		i++;
		while (i < fmt.n && strchr("-+ #0", fmt.p[i]) && k < 8)
			spec[k++] = fmt.p[i++];
		while (i < fmt.n && is_digit(fmt.p[i]) && k < 16)
			spec[k++] = fmt.p[i++];
		if (i < fmt.n && fmt.p[i] == '.') {
			spec[k++] = fmt.p[i++];
			while (i < fmt.n && is_digit(fmt.p[i]) && k < 24)
				spec[k++] = fmt.p[i++];
		}
		if (i >= fmt.n)
			rerr(rt, "incomplete format");
		char conv = fmt.p[i];
		if (conv == '%') {
			sb_putc(rt, &b, '%');
			continue;
		}
		if (used >= argc)
			rerr(rt, "not enough arguments for format string");
		const struct val *a = &argv[used++];
		char out[512];
		if (conv == 's' || conv == 'r') {
			struct sbuf t = { 0 };
			if (conv == 's')
				put_str(rt, &t, a, 0);
			else
				put_repr(rt, &t, a, 0);
			spec[k++] = '.';
			spec[k++] = '*';
			spec[k++] = 's';
			spec[k] = '\0';
			if (k == 4) { /* no width: copy as is */
				sb_put(rt, &b, t.p, t.n);
				continue;
			}
			if (t.n > 256)
				rerr(rt, "unsupported: a width on a long %%s");
			snprintf(out, sizeof out, spec, (int)t.n, t.p ? t.p : "");
		} else if (strchr("dixXo", conv)) {
			if (!is_num(a))
				rerr(rt, "%%%c format: a number is required, not %s", conv, type_name(a));
			int64_t v = a->t == V_FLOAT ? (int64_t)a->u.f : a->u.i;
			spec[k++] = 'l';
			spec[k++] = 'l';
			spec[k++] = conv == 'i' ? 'd' : conv;
			spec[k] = '\0';
			snprintf(out, sizeof out, spec, (long long)v);
		} else if (strchr("feEgG", conv)) {
			if (!is_num(a))
				rerr(rt, "must be real number, not %s", type_name(a));
			spec[k++] = conv;
			spec[k] = '\0';
			snprintf(out, sizeof out, spec, num_f(a));
		} else {
			rerr(rt, "unsupported format character '%c'", conv);
		}
		sb_puts(rt, &b, out);
	}
	if (used < argc && !(argc == 1 && args.t != V_LIST))
		rerr(rt, "not all arguments converted during string formatting");
	return sb_val(&b);
}

static struct val str_format(struct rt *rt, struct sstr fmt, const struct val *argv, int argc,
			     const struct sstr *kwn, const struct val *kwv, int nkw)
{
	struct sbuf b = { 0 };
	int auto_idx = 0, manual = 0;
	for (size_t i = 0; i < fmt.n; i++) {
		char c = fmt.p[i];
		if (c == '}') {
			if (i + 1 < fmt.n && fmt.p[i + 1] == '}') {
				sb_putc(rt, &b, '}');
				i++;
				continue;
			}
			rerr(rt, "single '}' encountered in format string");
		}
		if (c != '{') {
			sb_putc(rt, &b, c);
			continue;
		}
		if (i + 1 < fmt.n && fmt.p[i + 1] == '{') {
			sb_putc(rt, &b, '{');
			i++;
			continue;
		}
		size_t j = i + 1;
		while (j < fmt.n && fmt.p[j] != '}' && fmt.p[j] != '!' && fmt.p[j] != ':')
			j++;
		struct sstr field = { fmt.p + i + 1, j - i - 1 };
		char conv = 0;
		if (j < fmt.n && fmt.p[j] == '!' && j + 1 < fmt.n) {
			conv = fmt.p[j + 1];
			j += 2;
		}
		if (j < fmt.n && fmt.p[j] == ':')
			rerr(rt, "unsupported: a format spec in str.format");
		if (j >= fmt.n || fmt.p[j] != '}')
			rerr(rt, "expected '}' before end of string");
		const struct val *a = NULL;
		if (!field.n) {
			if (manual)
				rerr(rt, "cannot switch from manual field specification to automatic field numbering");
			auto_idx++;
			if (auto_idx > argc)
				rerr(rt, "Replacement index %d out of range for positional args tuple", auto_idx - 1);
			a = &argv[auto_idx - 1];
		} else if (is_digit(field.p[0])) {
			int64_t k = 0;
			for (size_t q = 0; q < field.n; q++) {
				if (!is_digit(field.p[q]) || k > 1000000)
					rerr(rt, "unsupported format field");
				k = k * 10 + (field.p[q] - '0');
			}
			if (auto_idx)
				rerr(rt, "cannot switch from automatic field numbering to manual field specification");
			manual = 1;
			if (k >= argc)
				rerr(rt, "Replacement index %lld out of range for positional args tuple", (long long)k);
			a = &argv[k];
		} else {
			for (int q = 0; q < nkw; q++)
				if (kwn[q].n == field.n && memcmp(kwn[q].p, field.p, field.n) == 0)
					a = &kwv[q];
			if (!a)
				rerr(rt, "format: no argument '%.*s'", (int)(field.n > 40 ? 40 : field.n), field.p);
		}
		if (conv == 'r')
			put_repr(rt, &b, a, 0);
		else
			put_str(rt, &b, a, 0);
		i = j;
	}
	return sb_val(&b);
}

/* ---- tojson: Python's json.dumps ---- */

struct json_opts {
	int ensure_ascii;
	int indent;             /* -1: none */
	struct sstr indent_str; /* when indent is a string (indent == -2) */
	struct sstr item_sep, key_sep;
	int sort_keys;
};

static void json_str(struct rt *rt, struct sbuf *b, struct sstr s, int ensure_ascii)
{
	size_t len;
	sb_putc(rt, b, '"');
	for (size_t i = 0; i < s.n; i += len) {
		uint32_t c = utf8_get(s.p, s.n, i, &len);
		switch (c) {
		case '"': sb_puts(rt, b, "\\\""); continue;
		case '\\': sb_puts(rt, b, "\\\\"); continue;
		case '\n': sb_puts(rt, b, "\\n"); continue;
		case '\r': sb_puts(rt, b, "\\r"); continue;
		case '\t': sb_puts(rt, b, "\\t"); continue;
		case '\b': sb_puts(rt, b, "\\b"); continue;
		case '\f': sb_puts(rt, b, "\\f"); continue;
		}
		if (c < 0x20 || (len == 1 && c >= 0x80)) {
			sb_printf(rt, b, "\\u%04x", c < 0x80 ? c : 0xdc00 + c);
		} else if (ensure_ascii && c >= 0x80) {
			if (c >= 0x10000) {
				uint32_t v = c - 0x10000;
				sb_printf(rt, b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
			} else {
				sb_printf(rt, b, "\\u%04x", c);
			}
		} else {
			sb_put(rt, b, s.p + i, len);
		}
	}
	sb_putc(rt, b, '"');
}

static void json_newline(struct rt *rt, struct sbuf *b, const struct json_opts *o, int level)
{
	sb_putc(rt, b, '\n');
	for (int i = 0; i < level; i++) {
		if (o->indent == -2)
			sb_put(rt, b, o->indent_str.p, o->indent_str.n);
		else
			for (int k = 0; k < o->indent; k++)
				sb_putc(rt, b, ' ');
	}
	step(rt, (uint64_t)level / 8);
}

static void sort_idx(struct rt *rt, size_t *idx, size_t n, const struct val *keys, int reverse);

static void json_dump(struct rt *rt, struct sbuf *b, const struct val *v, const struct json_opts *o, int level)
{
	if (level > 200)
		rlimit(rt, "a value nested too deeply for tojson");
	step(rt, 1);
	switch (v->t) {
	case V_NONE: sb_puts(rt, b, "null"); return;
	case V_BOOL: sb_puts(rt, b, v->u.i ? "true" : "false"); return;
	case V_INT: sb_printf(rt, b, "%lld", (long long)v->u.i); return;
	case V_FLOAT: put_float(rt, b, v->u.f, 1); return;
	case V_STR: json_str(rt, b, v->u.s, o->ensure_ascii); return;
	case V_LIST: {
		const struct list *l = v->u.l;
		if (l->kind == LK_GEN)
			rerr(rt, "Object of type generator is not JSON serializable");
		if (!l->n) {
			sb_puts(rt, b, "[]");
			return;
		}
		sb_putc(rt, b, '[');
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				sb_put(rt, b, o->item_sep.p, o->item_sep.n);
			if (o->indent != -1)
				json_newline(rt, b, o, level + 1);
			json_dump(rt, b, &l->v[i], o, level + 1);
		}
		if (o->indent != -1)
			json_newline(rt, b, o, level);
		sb_putc(rt, b, ']');
		return;
	}
	case V_DICT: {
		const struct dict *d = v->u.d;
		if (!d->n) {
			sb_puts(rt, b, "{}");
			return;
		}
		size_t *order = ralloc(rt, d->n * sizeof *order);
		for (size_t i = 0; i < d->n; i++)
			order[i] = i;
		if (o->sort_keys)
			sort_idx(rt, order, d->n, d->k, 0);
		sb_putc(rt, b, '{');
		for (size_t q = 0; q < d->n; q++) {
			size_t i = order[q];
			if (q)
				sb_put(rt, b, o->item_sep.p, o->item_sep.n);
			if (o->indent != -1)
				json_newline(rt, b, o, level + 1);
			const struct val *k = &d->k[i];
			if (k->t == V_STR) {
				json_str(rt, b, k->u.s, o->ensure_ascii);
			} else if (k->t == V_INT || k->t == V_FLOAT || k->t == V_BOOL || k->t == V_NONE) {
				struct sbuf t = { 0 };
				json_dump(rt, &t, k, o, level + 1);
				json_str(rt, b, sb_val(&t).u.s, o->ensure_ascii);
			} else {
				rerr(rt, "keys must be str, int, float, bool or None, not %s", type_name(k));
			}
			sb_put(rt, b, o->key_sep.p, o->key_sep.n);
			json_dump(rt, b, &d->v[i], o, level + 1);
		}
		if (o->indent != -1)
			json_newline(rt, b, o, level);
		sb_putc(rt, b, '}');
		return;
	}
	default:
		rerr(rt, "Object of type %s is not JSON serializable", type_name(v));
	}
}

/* ---- sorting (stable, Python's order) ---- */

static void sort_idx(struct rt *rt, size_t *idx, size_t n, const struct val *keys, int reverse)
{
	if (n < 2)
		return;
	size_t *tmp = ralloc(rt, n * sizeof *tmp);
	for (size_t width = 1; width < n; width *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * width) {
			size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
			size_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi) {
				int c = val_cmp(rt, &keys[idx[j]], &keys[idx[i]]);
				if (reverse)
					c = -c;
				tmp[k++] = c < 0 ? idx[j++] : idx[i++];
			}
			while (i < mid)
				tmp[k++] = idx[i++];
			while (j < hi)
				tmp[k++] = idx[j++];
		}
		memcpy(idx, tmp, n * sizeof *idx);
		step(rt, n / 4 + 1);
	}
}

/* ---- scopes ---- */

static struct scope *scope_new(struct rt *rt, struct scope *parent)
{
	struct scope *s = ralloc(rt, sizeof *s);
	memset(s, 0, sizeof *s);
	s->parent = parent;
	return s;
}

static void scope_set(struct rt *rt, struct scope *sc, struct sstr name, struct val v)
{
	dict_set(rt, &sc->vars, v_str(name.p, name.n), v);
}

static struct val lookup(struct rt *rt, struct scope *sc, struct sstr name)
{
	for (; sc; sc = sc->parent) {
		long i = dict_find_s(&sc->vars, name.p, name.n);
		if (i >= 0)
			return sc->vars.v[i];
	}
	long i = dict_find_s(rt->globals, name.p, name.n);
	if (i >= 0)
		return rt->globals->v[i];
	int b = find_name(builtin_names, N_OF(builtin_names), name);
	if (b >= 0) {
		struct func *f = func_new(rt, FN_BUILTIN, b);
		f->name = name;
		return v_func(f);
	}
	return v_undef_named(name);
}

/* ---- arguments ---- */

struct args {
	const struct val *pos;    /* (npos) positional */
	int npos;
	const struct sstr *kwn;   /* (nkw) keyword names */
	const struct val *kwv;    /* (nkw) their values */
	int nkw;
};

/* Binds A to the parameters NAMES of WHAT: SLOT[i] gets what was passed
 * (else keeps its default).  Returns a bitmask of the parameters given. */
static unsigned bind(struct rt *rt, const char *what, const struct args *a, const char *const *names,
		     int n, struct val *slot)
{
	unsigned given = 0;
	if (a->npos > n)
		rerr(rt, "%s takes at most %d argument(s), %d given", what, n, a->npos);
	for (int i = 0; i < a->npos; i++) {
		slot[i] = a->pos[i];
		given |= 1u << i;
	}
	for (int k = 0; k < a->nkw; k++) {
		int i = find_name(names, n, a->kwn[k]);
		if (i < 0)
			rerr(rt, "%s got an unexpected keyword argument '%.*s'", what,
			     (int)(a->kwn[k].n > 40 ? 40 : a->kwn[k].n), a->kwn[k].p);
		if (given & (1u << i))
			rerr(rt, "%s got multiple values for argument '%s'", what, names[i]);
		slot[i] = a->kwv[k];
		given |= 1u << i;
	}
	return given;
}

static struct sstr want_str(struct rt *rt, const struct val *v, const char *what)
{
	if (v->t != V_STR)
		rerr(rt, "%s must be a string, not %s", what, type_name(v));
	return v->u.s;
}

static int64_t want_int(struct rt *rt, const struct val *v, const char *what)
{
	if (v->t != V_INT && v->t != V_BOOL)
		rerr(rt, "%s must be an integer, not %s", what, type_name(v));
	return v->u.i;
}

static struct val eval(struct rt *rt, struct scope *sc, const struct node *n);
static int exec_body(struct rt *rt, struct scope *sc, struct node *const *body, int n);
static struct val call_value(struct rt *rt, struct val fn, const struct args *a, struct val caller);
static struct val do_filter(struct rt *rt, int id, struct sstr name, struct val x, const struct args *a);
static int do_test(struct rt *rt, int id, struct sstr name, struct val x, const struct args *a);

static void eval_args(struct rt *rt, struct scope *sc, const struct node *n, struct args *a)
{
	struct val *pos = n->nkids ? ralloc(rt, (size_t)n->nkids * sizeof *pos) : NULL;
	struct val *kwv = n->nkids2 ? ralloc(rt, (size_t)n->nkids2 * sizeof *kwv) : NULL;
	for (int i = 0; i < n->nkids; i++)
		pos[i] = eval(rt, sc, n->kids[i]);
	for (int i = 0; i < n->nkids2; i++)
		kwv[i] = eval(rt, sc, n->kids2[i]);
	a->pos = pos;
	a->npos = n->nkids;
	a->kwn = n->names;
	a->kwv = kwv;
	a->nkw = n->nkids2;
}

/* ---- blocks captured into a value ---- */

static struct val capture(struct rt *rt, struct scope *sc, struct node *const *body, int n)
{
	struct sbuf buf = { 0 }, *saved = rt->out;
	if (++rt->depth > rt->lim.max_depth)
		rlimit(rt, "macros and blocks nested more than %u deep", rt->lim.max_depth);
	rt->out = &buf;
	exec_body(rt, sc, body, n);
	rt->out = saved;
	rt->depth--;
	return sb_val(&buf);
}

static struct val call_macro(struct rt *rt, const struct func *f, const struct args *a, struct val caller)
{
	const struct node *m = f->node;
	int line = rt->line;
	if (a->npos > m->nnames)
		rerr(rt, "macro '%.*s' takes not more than %d argument(s)", (int)m->v.u.s.n, m->v.u.s.p,
		     m->nnames);
	for (int k = 0; k < a->nkw; k++) {
		int found = 0;
		for (int i = 0; i < m->nnames && !found; i++)
			if (m->names[i].n == a->kwn[k].n && memcmp(m->names[i].p, a->kwn[k].p, a->kwn[k].n) == 0) {
				if (i < a->npos)
					rerr(rt, "macro '%.*s' got multiple values for argument '%.*s'",
					     (int)m->v.u.s.n, m->v.u.s.p, (int)a->kwn[k].n, a->kwn[k].p);
				found = 1;
			}
		if (!found)
			rerr(rt, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->v.u.s.n, m->v.u.s.p,
			     (int)(a->kwn[k].n > 40 ? 40 : a->kwn[k].n), a->kwn[k].p);
	}
	struct scope *sc = scope_new(rt, f->scope);
	for (int i = 0; i < m->nnames; i++) {
		struct val v = v_undef_named(m->names[i]);
		int set = 0;
		if (i < a->npos) {
			v = a->pos[i];
			set = 1;
		}
		for (int k = 0; k < a->nkw && !set; k++)
			if (m->names[i].n == a->kwn[k].n && memcmp(m->names[i].p, a->kwn[k].p, a->kwn[k].n) == 0) {
				v = a->kwv[k];
				set = 1;
			}
		if (!set && m->kids2[i])
			v = eval(rt, sc, m->kids2[i]);
		scope_set(rt, sc, m->names[i], v);
	}
	if (caller.t == V_FUNC) {
		struct sstr name = { "caller", 6 };
		scope_set(rt, sc, name, caller);
	}
	struct val r = capture(rt, sc, m->kids, m->nkids);
	rt->line = line;
	return r;
}

/* ---- calls ---- */

static struct val builtin_range(struct rt *rt, const struct args *a)
{
	int64_t start = 0, stop, st = 1;
	if (a->nkw)
		rerr(rt, "range() takes no keyword arguments");
	if (a->npos < 1 || a->npos > 3)
		rerr(rt, "range expected 1 to 3 arguments, got %d", a->npos);
	if (a->npos == 1) {
		stop = want_int(rt, &a->pos[0], "range()'s argument");
	} else {
		start = want_int(rt, &a->pos[0], "range()'s argument");
		stop = want_int(rt, &a->pos[1], "range()'s argument");
		if (a->npos == 3)
			st = want_int(rt, &a->pos[2], "range()'s argument");
	}
	if (st == 0)
		rerr(rt, "range() arg 3 must not be zero");
	int64_t count = 0;
	if (st > 0 && start < stop)
		count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)st + 1);
	else if (st < 0 && start > stop)
		count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-(st + 1) + 1) + 1);
	if (count > RANGE_MAX || count < 0)
		rerr(rt, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", RANGE_MAX);
	step(rt, (uint64_t)count);
	struct list *l = list_new(rt, (size_t)count, LK_LIST);
	for (int64_t i = 0; i < count; i++)
		l->v[l->n++] = v_int(start + i * st);
	return v_list(l);
}

static struct val builtin_dict(struct rt *rt, const struct args *a, enum vtype t)
{
	struct dict *d = dict_new(rt);
	if (a->npos > 1)
		rerr(rt, "%s expected at most 1 argument, got %d", t == V_NS ? "namespace" : "dict", a->npos);
	if (a->npos == 1) {
		const struct val *src = &a->pos[0];
		if (src->t == V_DICT || src->t == V_NS) {
			for (size_t i = 0; i < src->u.d->n; i++)
				dict_set(rt, d, src->u.d->k[i], src->u.d->v[i]);
		} else {
			struct list *l = iterate(rt, *src);
			for (size_t i = 0; i < l->n; i++) {
				struct list *pair = iterate(rt, l->v[i]);
				if (pair->n != 2)
					rerr(rt, "dictionary update sequence element #%zu has length %zu; 2 is required",
					     i, pair->n);
				dict_set(rt, d, pair->v[0], pair->v[1]);
			}
		}
	}
	for (int k = 0; k < a->nkw; k++)
		dict_set(rt, d, v_str(a->kwn[k].p, a->kwn[k].n), a->kwv[k]);
	return v_dict(d, t);
}

static struct val builtin_strftime(struct rt *rt, const struct args *a)
{
	static const char *const names[] = { "format" };
	struct val slot[1] = { v_undef };
	bind(rt, "strftime_now()", a, names, 1, slot);
	struct sstr fmt = want_str(rt, &slot[0], "strftime_now()'s format");
	char f[256], out[1024];
	if (fmt.n >= sizeof f)
		rerr(rt, "strftime_now(): format too long");
	memcpy(f, fmt.p, fmt.n);
	f[fmt.n] = '\0';
	time_t now = rt->lim.now ? (time_t)rt->lim.now : time(NULL);
	struct tm tm;
	if (!localtime_r(&now, &tm))
		rerr(rt, "strftime_now(): no local time");
	size_t k = fmt.n ? strftime(out, sizeof out, f, &tm) : 0;
	if (fmt.n && !k)
		out[0] = '\0';
	return str_dup(rt, out, k);
}

static struct val call_method(struct rt *rt, const struct func *f, const struct args *a);

static struct val call_value(struct rt *rt, struct val fn, const struct args *a, struct val caller)
{
	if (fn.t == V_UNDEF)
		undefined_error(rt, &fn);
	if (fn.t != V_FUNC)
		rerr(rt, "'%s' object is not callable", type_name(&fn));
	struct func *f = fn.u.fn;
	switch (f->kind) {
	case FN_BUILTIN:
		switch (f->id) {
		case BI_RANGE: return builtin_range(rt, a);
		case BI_DICT: return builtin_dict(rt, a, V_DICT);
		case BI_NAMESPACE: return builtin_dict(rt, a, V_NS);
		case BI_RAISE: {
			struct sstr msg = a->npos ? to_str(rt, &a->pos[0]) : (struct sstr){ "", 0 };
			rerr(rt, "raise_exception: %.*s", (int)(msg.n > 4000 ? 4000 : msg.n), msg.p);
		}
		case BI_STRFTIME: return builtin_strftime(rt, a);
		}
		break;
	case FN_METHOD:
		return call_method(rt, f, a);
	case FN_MACRO:
		return call_macro(rt, f, a, caller);
	case FN_CALLER: {
		/* the {% call %} block's body, with its own parameters */
		struct func m = *f;
		return call_macro(rt, &m, a, v_undef);
	}
	case FN_UNSAFE:
		rerr(rt, "access to attribute '%.*s' of '%s' object is unsafe.", (int)f->name.n, f->name.p,
		     type_name(&f->self));
	}
	rerr(rt, "object is not callable");
}

/* ---- the methods ---- */

static struct val call_method(struct rt *rt, const struct func *f, const struct args *a)
{
	struct val self = f->self, slot[4] = { v_undef, v_undef, v_undef, v_undef };
	struct sstr s = self.u.s;
	unsigned given;
	char what[64];
	snprintf(what, sizeof what, "%s.%.*s()", type_name(&self), (int)(f->name.n > 20 ? 20 : f->name.n),
		 f->name.p);
	if (f->id == M_FORMAT)
		return str_format(rt, s, a->pos, a->npos, a->kwn, a->kwv, a->nkw);
	switch (f->id) {
	case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
		static const char *const names[] = { "chars" };
		given = bind(rt, what, a, names, 1, slot);
		struct sstr chars = { 0 };
		int have = given && slot[0].t != V_NONE;
		if (have)
			chars = want_str(rt, &slot[0], "strip()'s argument");
		struct sstr r = str_strip(s, have ? &chars : NULL, f->id != M_RSTRIP, f->id != M_LSTRIP);
		return v_str(r.p, r.n);
	}
	case M_SPLIT: case M_RSPLIT: {
		static const char *const names[] = { "sep", "maxsplit" };
		slot[1] = v_int(-1);
		bind(rt, what, a, names, 2, slot);
		struct sstr sep = { 0 };
		int have = slot[0].t != V_UNDEF && slot[0].t != V_NONE;
		if (have)
			sep = want_str(rt, &slot[0], "split()'s separator");
		return str_split(rt, s, have ? &sep : NULL, want_int(rt, &slot[1], "maxsplit"), f->id == M_RSPLIT);
	}
	case M_SPLITLINES: {
		static const char *const names[] = { "keepends" };
		slot[0] = v_bool(0);
		bind(rt, what, a, names, 1, slot);
		return str_splitlines(rt, s, truthy(&slot[0]));
	}
	case M_STARTSWITH: case M_ENDSWITH: {
		static const char *const names[] = { "prefix", "start", "end" };
		given = bind(rt, what, a, names, 3, slot);
		if (given & 6)
			rerr(rt, "unsupported: %s with start or end", what);
		struct val *pre = &slot[0];
		const struct val *opts = pre;
		size_t nopts = 1;
		if (pre->t == V_LIST && pre->u.l->kind == LK_TUPLE) {
			opts = pre->u.l->v;
			nopts = pre->u.l->n;
		}
		for (size_t i = 0; i < nopts; i++) {
			struct sstr p = want_str(rt, &opts[i], "startswith()'s argument");
			if (p.n <= s.n && memcmp(f->id == M_STARTSWITH ? s.p : s.p + s.n - p.n, p.p, p.n) == 0)
				return v_bool(1);
		}
		return v_bool(0);
	}
	case M_REPLACE: {
		static const char *const names[] = { "old", "new", "count" };
		slot[2] = v_int(-1);
		bind(rt, what, a, names, 3, slot);
		return str_replace(rt, s, want_str(rt, &slot[0], "replace()'s argument"),
				   want_str(rt, &slot[1], "replace()'s argument"), want_int(rt, &slot[2], "count"));
	}
	case M_UPPER: case M_LOWER: case M_SWAPCASE: case M_TITLE: case M_CAPITALIZE:
		bind(rt, what, a, NULL, 0, slot);
		if (f->id == M_CAPITALIZE)
			return str_capitalize(rt, s);
		return str_case(rt, s, f->id == M_UPPER ? CASE_UPPER : f->id == M_LOWER ? CASE_LOWER : CASE_SWAP,
				f->id == M_TITLE);
	case M_FIND: case M_RFIND: case M_INDEX: case M_RINDEX: case M_COUNT: {
		static const char *const names[] = { "sub", "start", "end" };
		given = bind(rt, what, a, names, 3, slot);
		if (given & 6)
			rerr(rt, "unsupported: %s with start or end", what);
		if (self.t == V_LIST) {
			const struct list *l = self.u.l;
			int64_t count = 0;
			step(rt, l->n);
			for (size_t i = 0; i < l->n; i++)
				if (val_eq(&l->v[i], &slot[0])) {
					if (f->id == M_INDEX)
						return v_int((int64_t)i);
					count++;
				}
			if (f->id == M_INDEX)
				rerr(rt, "list.index(x): x not in list");
			return v_int(count);
		}
		struct sstr sub = want_str(rt, &slot[0], "the substring");
		if (f->id == M_COUNT) {
			if (!sub.n)
				return v_int((int64_t)cp_count(s) + 1);
			int64_t count = 0;
			for (const char *h = find_bytes(s, sub, 0); h; h = find_bytes(s, sub, (size_t)(h - s.p) + sub.n))
				count++;
			return v_int(count);
		}
		const char *hit = f->id == M_FIND || f->id == M_INDEX ? find_bytes(s, sub, 0) : rfind_bytes(s, sub);
		if (!hit) {
			if (f->id == M_INDEX || f->id == M_RINDEX)
				rerr(rt, "substring not found");
			return v_int(-1);
		}
		return v_int(cp_index(s, (size_t)(hit - s.p)));
	}
	case M_JOIN: {
		static const char *const names[] = { "iterable" };
		bind(rt, what, a, names, 1, slot);
		struct list *l = iterate(rt, slot[0]);
		struct sbuf b = { 0 };
		step(rt, l->n);
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				sb_put(rt, &b, s.p, s.n);
			struct sstr item = want_str(rt, &l->v[i], "str.join()'s items");
			sb_put(rt, &b, item.p, item.n);
		}
		return sb_val(&b);
	}
	case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISUPPER: case M_ISLOWER: {
		bind(rt, what, a, NULL, 0, slot);
		size_t len;
		int cased = 0;
		if (!s.n)
			return v_bool(0);
		for (size_t i = 0; i < s.n; i += len) {
			uint32_t c = utf8_get(s.p, s.n, i, &len);
			int ok;
			switch (f->id) {
			case M_ISDIGIT: ok = is_digit_cp(c); break;
			case M_ISALPHA: ok = is_alpha_cp(rt, c); break;
			case M_ISALNUM: ok = is_digit_cp(c) || is_alpha_cp(rt, c); break;
			case M_ISSPACE: ok = py_space(c); break;
			default:
				ok = !is_cased(rt, c) || map_case(rt, c, f->id == M_ISUPPER ? CASE_UPPER : CASE_LOWER) == c;
				cased |= is_cased(rt, c);
			}
			if (!ok)
				return v_bool(0);
		}
		return v_bool(f->id == M_ISUPPER || f->id == M_ISLOWER ? cased : 1);
	}
	case M_PARTITION: case M_RPARTITION: {
		static const char *const names[] = { "sep" };
		bind(rt, what, a, names, 1, slot);
		struct sstr sep = want_str(rt, &slot[0], "the separator");
		if (!sep.n)
			rerr(rt, "empty separator");
		const char *hit = f->id == M_PARTITION ? find_bytes(s, sep, 0) : rfind_bytes(s, sep);
		struct list *l = list_new(rt, 3, LK_TUPLE);
		l->n = 3;
		if (!hit) {
			l->v[0] = f->id == M_PARTITION ? self : v_str("", 0);
			l->v[1] = v_str("", 0);
			l->v[2] = f->id == M_PARTITION ? v_str("", 0) : self;
		} else {
			size_t at = (size_t)(hit - s.p);
			l->v[0] = v_str(s.p, at);
			l->v[1] = v_str(s.p + at, sep.n);
			l->v[2] = v_str(s.p + at + sep.n, s.n - at - sep.n);
		}
		return v_list(l);
	}
	case M_LJUST: case M_RJUST: case M_CENTER: case M_ZFILL: {
		static const char *const names[] = { "width", "fillchar" };
		slot[1] = v_str(" ", 1);
		bind(rt, what, a, names, f->id == M_ZFILL ? 1 : 2, slot);
		int64_t width = want_int(rt, &slot[0], "width"), have = (int64_t)cp_count(s);
		struct sstr fill = want_str(rt, &slot[1], "the fill character");
		if (cp_count(fill) != 1)
			rerr(rt, "The fill character must be exactly one character long");
		if (width > (int64_t)(rt->lim.max_output))
			rlimit(rt, "a string grows too large");
		if (width <= have)
			return self;
		int64_t pad = width - have, left = 0;
		if (f->id == M_RJUST)
			left = pad;
		else if (f->id == M_CENTER)
			left = pad / 2 + (pad & width & 1);
		struct sbuf b = { 0 };
		if (f->id == M_ZFILL) {
			size_t sign = s.n && (s.p[0] == '-' || s.p[0] == '+');
			sb_put(rt, &b, s.p, sign);
			for (int64_t i = 0; i < pad; i++)
				sb_putc(rt, &b, '0');
			sb_put(rt, &b, s.p + sign, s.n - sign);
			return sb_val(&b);
		}
		for (int64_t i = 0; i < left; i++)
			sb_put(rt, &b, fill.p, fill.n);
		sb_put(rt, &b, s.p, s.n);
		for (int64_t i = left; i < pad; i++)
			sb_put(rt, &b, fill.p, fill.n);
		return sb_val(&b);
	}
	case M_ITEMS: case M_KEYS: case M_VALUES: case M_COPY: {
		bind(rt, what, a, NULL, 0, slot);
		if (self.t == V_LIST) {
			struct list *l = list_new(rt, self.u.l->n, LK_LIST);
			memcpy(l->v, self.u.l->v, self.u.l->n * sizeof *l->v);
			l->n = self.u.l->n;
			return v_list(l);
		}
		const struct dict *d = self.u.d;
		if (f->id == M_COPY) {
			struct dict *c = dict_new(rt);
			for (size_t i = 0; i < d->n; i++)
				dict_set(rt, c, d->k[i], d->v[i]);
			return v_dict(c, V_DICT);
		}
		struct list *l = list_new(rt, d->n, LK_LIST);
		step(rt, d->n / 4);
		for (size_t i = 0; i < d->n; i++) {
			if (f->id == M_ITEMS) {
				struct list *pair = list_new(rt, 2, LK_TUPLE);
				pair->v[0] = d->k[i];
				pair->v[1] = d->v[i];
				pair->n = 2;
				l->v[i] = v_list(pair);
			} else {
				l->v[i] = f->id == M_KEYS ? d->k[i] : d->v[i];
			}
		}
		l->n = d->n;
		return v_list(l);
	}
	case M_GET: {
		static const char *const names[] = { "key", "default" };
		slot[1] = v_none;
		bind(rt, what, a, names, 2, slot);
		if (a->npos < 1)
			rerr(rt, "get expected at least 1 argument, got 0");
		long i = dict_find(self.u.d, &slot[0]);
		return i >= 0 ? self.u.d->v[i] : slot[1];
	}
	case M_CYCLE: {
		if (a->npos == 0)
			rerr(rt, "no items for cycling given");
		return a->pos[self.u.lp->index0 % (size_t)a->npos];
	}
	case M_CHANGED: {
		struct list *l = list_new(rt, (size_t)a->npos, LK_LIST);
		for (int i = 0; i < a->npos; i++)
			l->v[l->n++] = a->pos[i];
		struct val now = v_list(l);
		if (self.u.lp->last_changed.t != V_UNDEF && val_eq(&now, &self.u.lp->last_changed))
			return v_bool(0);
		self.u.lp->last_changed = now;
		return v_bool(1);
	}
	}
	rerr(rt, "unsupported method %s", what);
}

/* ---- filters ---- */

/* ITEM's attribute PATH as jinja2's make_attrgetter reads it: dotted,
 * integer parts as indices. */
static struct val attr_path(struct rt *rt, struct val item, struct val path)
{
	if (path.t != V_STR)
		return get_item(rt, item, path, 1);
	struct sstr p = path.u.s;
	size_t i = 0;
	for (;;) {
		size_t j = i;
		while (j < p.n && p.p[j] != '.')
			j++;
		struct val key = v_str(p.p + i, j - i);
		int digits = j > i;
		for (size_t k = i; k < j; k++)
			digits &= is_digit(p.p[k]);
		if (digits && j - i < 18) {
			int64_t v = 0;
			for (size_t k = i; k < j; k++)
				v = v * 10 + (p.p[k] - '0');
			key = v_int(v);
		}
		item = get_item(rt, item, key, 1);
		if (j >= p.n)
			return item;
		i = j + 1;
	}
}

/* Python's int() of a string; 0 when it is not one. */
static int parse_py_int(struct sstr s, int base, int64_t *out)
{
	s = str_strip(s, NULL, 1, 1);
	size_t i = 0;
	int neg = 0;
	if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
		neg = s.p[i++] == '-';
	if (base == 16 && i + 1 < s.n && s.p[i] == '0' && (s.p[i + 1] | 0x20) == 'x')
		i += 2;
	if (base == 8 && i + 1 < s.n && s.p[i] == '0' && (s.p[i + 1] | 0x20) == 'o')
		i += 2;
	if (base == 2 && i + 1 < s.n && s.p[i] == '0' && (s.p[i + 1] | 0x20) == 'b')
		i += 2;
	if (i >= s.n)
		return 0;
	uint64_t v = 0;
	int prev_us = 1;
	for (; i < s.n; i++) {
		if (s.p[i] == '_') {
			if (prev_us)
				return 0;
			prev_us = 1;
			continue;
		}
		int d = hexval((unsigned char)s.p[i]);
		if (d < 0 || d >= base)
			return 0;
		if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
			return 0;
		v = v * (uint64_t)base + (uint64_t)d;
		prev_us = 0;
	}
	if (prev_us || v > (uint64_t)INT64_MAX + (uint64_t)neg)
		return 0;
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 1;
}

/* Python's float() of a string. */
static int parse_py_float(struct sstr s, double *out)
{
	char buf[128];
	s = str_strip(s, NULL, 1, 1);
	if (!s.n || s.n >= sizeof buf)
		return 0;
	size_t k = 0;
	for (size_t i = 0; i < s.n; i++) {
		char c = s.p[i];
		if (c == '_') {
			if (!i || i + 1 >= s.n || !is_digit(s.p[i - 1]) || !is_digit(s.p[i + 1]))
				return 0;
			continue;
		}
		if (!(is_digit(c) || strchr("+-.eEinfatyINFATY", c)))
			return 0;
		buf[k++] = c;
	}
	buf[k] = '\0';
	char *end;
	double v = strtod(buf, &end);
	if (*end || end == buf)
		return 0;
	const char *p = buf + (buf[0] == '+' || buf[0] == '-');
	if ((p[0] | 0x20) == 'i' && strcasecmp(p, "inf") && strcasecmp(p, "infinity"))
		return 0;
	if ((p[0] | 0x20) == 'n' && strcasecmp(p, "nan"))
		return 0;
	*out = v;
	return 1;
}

static struct list *list_of(struct rt *rt, struct val v)
{
	struct list *src = iterate(rt, v);
	struct list *l = list_new(rt, src->n, LK_LIST);
	if (src->n)
		memcpy(l->v, src->v, src->n * sizeof *l->v);
	l->n = src->n;
	return l;
}

/* The sort key of V: lowered when not CASE_SENSITIVE. */
static struct val sort_key(struct rt *rt, struct val v, int case_sensitive)
{
	if (!case_sensitive && v.t == V_STR)
		return str_case(rt, v.u.s, CASE_LOWER, 0);
	return v;
}

static struct val html_escape(struct rt *rt, struct sstr s)
{
	struct sbuf b = { 0 };
	for (size_t i = 0; i < s.n; i++) {
		switch (s.p[i]) {
		case '&': sb_puts(rt, &b, "&amp;"); break;
		case '<': sb_puts(rt, &b, "&lt;"); break;
		case '>': sb_puts(rt, &b, "&gt;"); break;
		case '"': sb_puts(rt, &b, "&#34;"); break;
		case '\'': sb_puts(rt, &b, "&#39;"); break;
		default: sb_putc(rt, &b, s.p[i]);
		}
	}
	struct val v = sb_val(&b);
	v.safe = 1;
	return v;
}

/* select / reject / selectattr / rejectattr: A's items for which the test
 * (or truth) holds, or does not. */
static struct val select_items(struct rt *rt, struct val x, const struct args *a, int by_attr, int keep)
{
	struct list *src = truthy(&x) ? iterate(rt, x) : list_new(rt, 0, LK_LIST);
	struct list *out = list_new(rt, 0, LK_GEN);
	int first = by_attr ? 1 : 0;
	struct val attr = v_undef;
	if (by_attr) {
		if (a->npos < 1)
			rerr(rt, "selectattr/rejectattr need an attribute");
		attr = a->pos[0];
	}
	int test = -1;
	struct sstr tname = { 0 };
	if (a->npos > first) {
		tname = want_str(rt, &a->pos[first], "the test's name");
		test = find_name(test_names, TS_N, tname);
		if (test < 0)
			rerr(rt, "No test named '%.*s'", (int)(tname.n > 40 ? 40 : tname.n), tname.p);
	}
	struct args targs = { 0 };
	if (a->npos > first + 1) {
		targs.pos = a->pos + first + 1;
		targs.npos = a->npos - first - 1;
	}
	targs.kwn = a->kwn;
	targs.kwv = a->kwv;
	targs.nkw = a->nkw;
	step(rt, src->n);
	for (size_t i = 0; i < src->n; i++) {
		struct val v = by_attr ? attr_path(rt, src->v[i], attr) : src->v[i];
		int ok = test >= 0 ? do_test(rt, test, tname, v, &targs) : truthy(&v);
		if (ok == keep)
			list_push(rt, out, src->v[i]);
	}
	return v_list(out);
}

static struct val do_map(struct rt *rt, struct val x, const struct args *a)
{
	struct list *src = truthy(&x) ? iterate(rt, x) : list_new(rt, 0, LK_LIST);
	struct list *out = list_new(rt, src->n, LK_GEN);
	struct val attr = v_undef, def = v_undef;
	int by_attr = 0;
	for (int k = 0; k < a->nkw; k++) {
		if (seq_eq(a->kwn[k], "attribute")) {
			attr = a->kwv[k];
			by_attr = 1;
		} else if (seq_eq(a->kwn[k], "default")) {
			def = a->kwv[k];
		} else if (!a->npos) {
			rerr(rt, "map got an unexpected keyword argument '%.*s'", (int)a->kwn[k].n, a->kwn[k].p);
		}
	}
	step(rt, src->n);
	if (by_attr) {
		if (a->npos)
			rerr(rt, "map: a filter name and attribute= together");
		for (size_t i = 0; i < src->n; i++) {
			struct val v = attr_path(rt, src->v[i], attr);
			out->v[out->n++] = v.t == V_UNDEF && def.t != V_UNDEF ? def : v;
		}
		return v_list(out);
	}
	if (a->npos < 1)
		rerr(rt, "map requires a filter argument");
	struct sstr fname = want_str(rt, &a->pos[0], "the filter's name");
	int id = find_name(filter_names, F_N, fname);
	if (id < 0)
		rerr(rt, "No filter named '%.*s'", (int)(fname.n > 40 ? 40 : fname.n), fname.p);
	struct args fa = { a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw };
	for (size_t i = 0; i < src->n; i++)
		out->v[out->n++] = do_filter(rt, id, fname, src->v[i], &fa);
	return v_list(out);
}

static struct val do_filter(struct rt *rt, int id, struct sstr name, struct val x, const struct args *a)
{
	struct val slot[5] = { v_undef, v_undef, v_undef, v_undef, v_undef };
	char what[48];
	snprintf(what, sizeof what, "filter '%.*s'", (int)(name.n > 30 ? 30 : name.n), name.p);
	if (id < 0)
		rerr(rt, "No filter named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
	switch ((enum filter_id)id) {
	case F_ABS:
		bind(rt, what, a, NULL, 0, slot);
		if (x.t == V_INT || x.t == V_BOOL) {
			if (x.u.i == INT64_MIN)
				rerr(rt, "integer overflow");
			return v_int(x.u.i < 0 ? -x.u.i : x.u.i);
		}
		if (x.t == V_FLOAT)
			return v_float(fabs(x.u.f));
		rerr(rt, "bad operand type for abs(): '%s'", type_name(&x));
	case F_ATTR: {
		static const char *const names[] = { "name" };
		bind(rt, what, a, names, 1, slot);
		if (x.t == V_UNDEF)
			undefined_error(rt, &x);
		return get_attr(rt, x, want_str(rt, &slot[0], "attr's name"), 0);
	}
	case F_BATCH: {
		static const char *const names[] = { "linecount", "fill_with" };
		slot[1] = v_none;
		unsigned given = bind(rt, what, a, names, 2, slot);
		int64_t per = want_int(rt, &slot[0], "batch's linecount");
		if (per <= 0)
			rerr(rt, "batch's linecount must be positive");
		struct list *src = iterate(rt, x), *out = list_new(rt, 0, LK_GEN), *row = NULL;
		for (size_t i = 0; i < src->n; i++) {
			if (!row || (int64_t)row->n == per) {
				row = list_new(rt, 0, LK_LIST);
				list_push(rt, out, v_list(row));
			}
			list_push(rt, row, src->v[i]);
		}
		if (row && (given & 2))
			while ((int64_t)row->n < per)
				list_push(rt, row, slot[1]);
		return v_list(out);
	}
	case F_CAPITALIZE:
		bind(rt, what, a, NULL, 0, slot);
		return str_capitalize(rt, to_str(rt, &x));
	case F_CENTER: {
		static const char *const names[] = { "width" };
		slot[0] = v_int(80);
		bind(rt, what, a, names, 1, slot);
		struct func f = { .kind = FN_METHOD, .id = M_CENTER, .self = v_str(to_str(rt, &x).p, to_str(rt, &x).n) };
		f.name = name;
		struct args ca = { slot, 1, NULL, NULL, 0 };
		return call_method(rt, &f, &ca);
	}
	case F_COUNT: case F_LENGTH:
		bind(rt, what, a, NULL, 0, slot);
		return v_int(py_len(rt, &x));
	case F_D: case F_DEFAULT: {
		static const char *const names[] = { "default_value", "boolean" };
		slot[0] = v_str("", 0);
		slot[1] = v_bool(0);
		bind(rt, what, a, names, 2, slot);
		if (x.t == V_UNDEF || (truthy(&slot[1]) && !truthy(&x)))
			return slot[0];
		return x;
	}
	case F_DICTSORT: {
		static const char *const names[] = { "case_sensitive", "by", "reverse" };
		slot[0] = v_bool(0);
		slot[1] = v_str("key", 3);
		slot[2] = v_bool(0);
		bind(rt, what, a, names, 3, slot);
		if (x.t == V_UNDEF)
			undefined_error(rt, &x);
		if (x.t != V_DICT)
			rerr(rt, "dictsort: '%s' object has no attribute 'items'", type_name(&x));
		struct sstr by = want_str(rt, &slot[1], "dictsort's by");
		int pos = seq_eq(by, "key") ? 0 : seq_eq(by, "value") ? 1 : -1;
		if (pos < 0)
			rerr(rt, "You can only sort by either \"key\" or \"value\"");
		const struct dict *d = x.u.d;
		struct val *keys = ralloc(rt, (d->n + 1) * sizeof *keys);
		size_t *idx = ralloc(rt, (d->n + 1) * sizeof *idx);
		for (size_t i = 0; i < d->n; i++) {
			keys[i] = sort_key(rt, pos ? d->v[i] : d->k[i], truthy(&slot[0]));
			idx[i] = i;
		}
		sort_idx(rt, idx, d->n, keys, truthy(&slot[2]));
		struct list *out = list_new(rt, d->n, LK_LIST);
		for (size_t i = 0; i < d->n; i++) {
			struct list *pair = list_new(rt, 2, LK_TUPLE);
			pair->v[0] = d->k[idx[i]];
			pair->v[1] = d->v[idx[i]];
			pair->n = 2;
			out->v[out->n++] = v_list(pair);
		}
		return v_list(out);
	}
	case F_E: case F_ESCAPE:
		bind(rt, what, a, NULL, 0, slot);
		if (x.t == V_STR && x.safe)
			return x;
		return html_escape(rt, to_str(rt, &x));
	case F_FIRST: case F_LAST: {
		bind(rt, what, a, NULL, 0, slot);
		if (id == F_LAST && x.t == V_LIST && x.u.l->kind == LK_GEN)
			rerr(rt, "'generator' object is not reversible");
		struct list *l = iterate(rt, x);
		struct sstr none = { 0 };
		if (!l->n)
			return v_undef_named(none);
		return id == F_FIRST ? l->v[0] : l->v[l->n - 1];
	}
	case F_FLOAT: {
		static const char *const names[] = { "default" };
		slot[0] = v_float(0);
		bind(rt, what, a, names, 1, slot);
		double f;
		if (is_num(&x))
			return v_float(num_f(&x));
		if (x.t == V_STR && parse_py_float(x.u.s, &f))
			return v_float(f);
		return slot[0];
	}
	case F_FORMAT: {
		struct list *l = list_new(rt, (size_t)a->npos, LK_TUPLE);
		if (a->nkw && a->npos)
			rerr(rt, "can't handle positional and keyword arguments at the same time");
		if (a->nkw)
			rerr(rt, "unsupported: format with keyword arguments");
		for (int i = 0; i < a->npos; i++)
			l->v[l->n++] = a->pos[i];
		return percent_format(rt, to_str(rt, &x), v_list(l));
	}
	case F_INDENT: {
		static const char *const names[] = { "width", "first", "blank" };
		slot[0] = v_int(4);
		slot[1] = v_bool(0);
		slot[2] = v_bool(0);
		bind(rt, what, a, names, 3, slot);
		struct sbuf ind = { 0 };
		if (slot[0].t == V_STR) {
			sb_put(rt, &ind, slot[0].u.s.p, slot[0].u.s.n);
		} else {
			int64_t w = want_int(rt, &slot[0], "indent's width");
			if (w > 4096)
				rlimit(rt, "indent width %lld is too large", (long long)w);
			for (int64_t i = 0; i < w; i++)
				sb_putc(rt, &ind, ' ');
		}
		struct sstr s = to_str(rt, &x);
		struct sbuf tmp = { 0 };
		sb_put(rt, &tmp, s.p, s.n);
		sb_putc(rt, &tmp, '\n');
		struct val lines_v = str_splitlines(rt, sb_val(&tmp).u.s, 0);
		struct list *lines = lines_v.u.l;
		struct sbuf b = { 0 };
		if (truthy(&slot[1]))
			sb_put(rt, &b, ind.p, ind.n);
		for (size_t i = 0; i < lines->n; i++) {
			struct sstr line = lines->v[i].u.s;
			if (i) {
				sb_putc(rt, &b, '\n');
				if (line.n || truthy(&slot[2]))
					sb_put(rt, &b, ind.p, ind.n);
			}
			sb_put(rt, &b, line.p, line.n);
		}
		return sb_val(&b);
	}
	case F_INT: {
		static const char *const names[] = { "default", "base" };
		slot[0] = v_int(0);
		slot[1] = v_int(10);
		bind(rt, what, a, names, 2, slot);
		int64_t base = want_int(rt, &slot[1], "int's base"), v;
		double f;
		if (x.t == V_INT || x.t == V_BOOL)
			return v_int(x.u.i);
		if (x.t == V_FLOAT) {
			if (!isfinite(x.u.f) || fabs(x.u.f) >= 9.2e18)
				return slot[0];
			return v_int((int64_t)x.u.f);
		}
		if (x.t == V_STR) {
			if (base >= 2 && base <= 16 && parse_py_int(x.u.s, (int)base, &v))
				return v_int(v);
			if (parse_py_float(x.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18)
				return v_int((int64_t)f);
		}
		return slot[0];
	}
	case F_ITEMS: {
		bind(rt, what, a, NULL, 0, slot);
		if (x.t == V_UNDEF)
			return v_list(list_new(rt, 0, LK_GEN));
		if (x.t != V_DICT)
			rerr(rt, "Can only get item pairs from a mapping.");
		struct func f = { .kind = FN_METHOD, .id = M_ITEMS, .self = x };
		struct args none = { 0 };
		struct val r = call_method(rt, &f, &none);
		r.u.l->kind = LK_GEN;
		return r;
	}
	case F_JOIN: {
		static const char *const names[] = { "d", "attribute" };
		slot[0] = v_str("", 0);
		slot[1] = v_none;
		bind(rt, what, a, names, 2, slot);
		struct list *l = iterate(rt, x);
		struct sstr sep = to_str(rt, &slot[0]);
		struct sbuf b = { 0 };
		step(rt, l->n);
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				sb_put(rt, &b, sep.p, sep.n);
			struct val item = slot[1].t != V_NONE ? attr_path(rt, l->v[i], slot[1]) : l->v[i];
			put_str(rt, &b, &item, 0);
		}
		return sb_val(&b);
	}
	case F_LIST:
		bind(rt, what, a, NULL, 0, slot);
		return v_list(list_of(rt, x));
	case F_LOWER: case F_UPPER: {
		bind(rt, what, a, NULL, 0, slot);
		struct val r = str_case(rt, to_str(rt, &x), id == F_LOWER ? CASE_LOWER : CASE_UPPER, 0);
		r.safe = x.t == V_STR && x.safe;
		return r;
	}
	case F_MAP:
		return do_map(rt, x, a);
	case F_MAX: case F_MIN: {
		static const char *const names[] = { "case_sensitive", "attribute" };
		slot[0] = v_bool(0);
		slot[1] = v_none;
		bind(rt, what, a, names, 2, slot);
		struct list *l = iterate(rt, x);
		struct sstr none = { 0 };
		if (!l->n)
			return v_undef_named(none);
		size_t best = 0;
		struct val bk = sort_key(rt, slot[1].t != V_NONE ? attr_path(rt, l->v[0], slot[1]) : l->v[0],
					 truthy(&slot[0]));
		for (size_t i = 1; i < l->n; i++) {
			struct val k = sort_key(rt, slot[1].t != V_NONE ? attr_path(rt, l->v[i], slot[1]) : l->v[i],
						truthy(&slot[0]));
			int c = val_cmp(rt, &k, &bk);
			if (id == F_MAX ? c > 0 : c < 0) {
				best = i;
				bk = k;
			}
		}
		return l->v[best];
	}
	case F_REJECT: case F_SELECT:
		return select_items(rt, x, a, 0, id == F_SELECT);
	case F_REJECTATTR: case F_SELECTATTR:
		return select_items(rt, x, a, 1, id == F_SELECTATTR);
	case F_REPLACE: {
		static const char *const names[] = { "old", "new", "count" };
		slot[2] = v_none;
		bind(rt, what, a, names, 3, slot);
		int64_t count = slot[2].t == V_NONE ? -1 : want_int(rt, &slot[2], "replace's count");
		return str_replace(rt, to_str(rt, &x), to_str(rt, &slot[0]), to_str(rt, &slot[1]), count);
	}
	case F_REVERSE: {
		bind(rt, what, a, NULL, 0, slot);
		if (x.t == V_STR) {
			struct val step_v = v_int(-1);
			return slice(rt, x, NULL, NULL, &step_v);
		}
		struct list *l = iterate(rt, x), *out = list_new(rt, l->n, LK_GEN);
		for (size_t i = l->n; i-- > 0;)
			out->v[out->n++] = l->v[i];
		return v_list(out);
	}
	case F_ROUND: {
		static const char *const names[] = { "precision", "method" };
		slot[0] = v_int(0);
		slot[1] = v_str("common", 6);
		bind(rt, what, a, names, 2, slot);
		int64_t prec = want_int(rt, &slot[0], "round's precision");
		struct sstr how = want_str(rt, &slot[1], "round's method");
		if (!is_num(&x))
			rerr(rt, "type %s doesn't define __round__ method", type_name(&x));
		double v = num_f(&x);
		if (prec < -300 || prec > 300)
			return v_float(v);
		if (seq_eq(how, "common")) {
			if (prec == 0)
				return v_float(nearbyint(v));
			if (prec > 0) {
				char buf[400];
				snprintf(buf, sizeof buf, "%.*f", (int)prec, v);
				return v_float(strtod(buf, NULL));
			}
			double p = pow(10, (double)-prec);
			return v_float(nearbyint(v / p) * p);
		}
		if (!seq_eq(how, "ceil") && !seq_eq(how, "floor"))
			rerr(rt, "method must be common, ceil or floor");
		double p = pow(10, (double)prec);
		return v_float((seq_eq(how, "ceil") ? ceil(v * p) : floor(v * p)) / p);
	}
	case F_SAFE: {
		bind(rt, what, a, NULL, 0, slot);
		struct val r = x.t == V_STR ? x : v_str(to_str(rt, &x).p, to_str(rt, &x).n);
		r.safe = 1;
		return r;
	}
	case F_SORT: case F_UNIQUE: {
		static const char *const sort_names[] = { "reverse", "case_sensitive", "attribute" };
		static const char *const uniq_names[] = { "case_sensitive", "attribute" };
		int is_sort = id == F_SORT;
		struct val rev = v_bool(0), cs = v_bool(0), attr = v_none;
		if (is_sort) {
			slot[0] = rev; slot[1] = cs; slot[2] = attr;
			bind(rt, what, a, sort_names, 3, slot);
			rev = slot[0]; cs = slot[1]; attr = slot[2];
		} else {
			slot[0] = cs; slot[1] = attr;
			bind(rt, what, a, uniq_names, 2, slot);
			cs = slot[0]; attr = slot[1];
		}
		struct list *l = iterate(rt, x);
		struct val *keys = ralloc(rt, (l->n + 1) * sizeof *keys);
		for (size_t i = 0; i < l->n; i++)
			keys[i] = sort_key(rt, attr.t != V_NONE ? attr_path(rt, l->v[i], attr) : l->v[i], truthy(&cs));
		if (!is_sort) {
			struct list *out = list_new(rt, 0, LK_GEN);
			step(rt, l->n * l->n / 16 + 1);
			for (size_t i = 0; i < l->n; i++) {
				int seen = 0;
				for (size_t j = 0; j < i && !seen; j++)
					seen = val_eq(&keys[j], &keys[i]);
				if (keys[i].t == V_DICT || (keys[i].t == V_LIST && keys[i].u.l->kind == LK_LIST))
					rerr(rt, "unhashable type: '%s'", type_name(&keys[i]));
				if (!seen)
					list_push(rt, out, l->v[i]);
			}
			return v_list(out);
		}
		size_t *idx = ralloc(rt, (l->n + 1) * sizeof *idx);
		for (size_t i = 0; i < l->n; i++)
			idx[i] = i;
		sort_idx(rt, idx, l->n, keys, truthy(&rev));
		struct list *out = list_new(rt, l->n, LK_LIST);
		for (size_t i = 0; i < l->n; i++)
			out->v[out->n++] = l->v[idx[i]];
		return v_list(out);
	}
	case F_STRING:
		bind(rt, what, a, NULL, 0, slot);
		return x.t == V_STR ? x : v_str(to_str(rt, &x).p, to_str(rt, &x).n);
	case F_SUM: {
		static const char *const names[] = { "attribute", "start" };
		slot[0] = v_none;
		slot[1] = v_int(0);
		bind(rt, what, a, names, 2, slot);
		struct list *l = iterate(rt, x);
		struct val acc = slot[1];
		for (size_t i = 0; i < l->n; i++)
			acc = binop_val(rt, OP_ADD, acc, slot[0].t != V_NONE ? attr_path(rt, l->v[i], slot[0]) : l->v[i]);
		return acc;
	}
	case F_TITLE: {
		bind(rt, what, a, NULL, 0, slot);
		/* jinja2: words start after runs of [-\s({\[<] */
		struct sstr s = to_str(rt, &x);
		struct sbuf b = { 0 };
		size_t i = 0, len;
		while (i < s.n) {
			size_t j = i;
			int sep = 0;
			for (;;) {
				if (j >= s.n)
					break;
				uint32_t c = utf8_get(s.p, s.n, j, &len);
				int is_sep = py_space(c) || (c < 0x80 && strchr("-({[<", (int)c));
				if (j == i)
					sep = is_sep;
				else if (is_sep != sep)
					break;
				j += len;
			}
			struct sstr item = { s.p + i, j - i };
			if (sep) {
				sb_put(rt, &b, item.p, item.n);
			} else if (item.n) { /* item[0].upper() + item[1:].lower() */
				struct val v = str_capitalize(rt, item);
				sb_put(rt, &b, v.u.s.p, v.u.s.n);
			}
			i = j;
		}
		return sb_val(&b);
	}
	case F_TOJSON: {
		/* Hugging Face's: json.dumps(x, ensure_ascii, indent, separators, sort_keys) */
		static const char *const names[] = { "ensure_ascii", "indent", "separators", "sort_keys" };
		slot[0] = v_bool(0);
		slot[1] = v_none;
		slot[2] = v_none;
		slot[3] = v_bool(0);
		bind(rt, what, a, names, 4, slot);
		struct json_opts o = { .ensure_ascii = truthy(&slot[0]), .indent = -1, .sort_keys = truthy(&slot[3]) };
		if (slot[1].t == V_STR) {
			o.indent = -2;
			o.indent_str = slot[1].u.s;
		} else if (slot[1].t != V_NONE) {
			int64_t w = want_int(rt, &slot[1], "tojson's indent");
			o.indent = w < 0 ? 0 : w > 4096 ? 4096 : (int)w;
		}
		o.item_sep = o.indent == -1 ? (struct sstr){ ", ", 2 } : (struct sstr){ ",", 1 };
		o.key_sep = (struct sstr){ ": ", 2 };
		if (slot[2].t != V_NONE) {
			struct list *l = iterate(rt, slot[2]);
			if (l->n != 2)
				rerr(rt, "tojson's separators must be a pair");
			o.item_sep = want_str(rt, &l->v[0], "a separator");
			o.key_sep = want_str(rt, &l->v[1], "a separator");
		}
		struct sbuf b = { 0 };
		json_dump(rt, &b, &x, &o, 0);
		return sb_val(&b);
	}
	case F_TRIM: {
		static const char *const names[] = { "chars" };
		slot[0] = v_none;
		bind(rt, what, a, names, 1, slot);
		struct sstr chars = { 0 };
		int have = slot[0].t != V_NONE;
		if (have)
			chars = to_str(rt, &slot[0]);
		struct sstr r = str_strip(to_str(rt, &x), have ? &chars : NULL, 1, 1);
		struct val v = v_str(r.p, r.n);
		v.safe = x.t == V_STR && x.safe;
		return v;
	}
	case F_WORDCOUNT: {
		bind(rt, what, a, NULL, 0, slot);
		struct sstr s = to_str(rt, &x);
		size_t len;
		int64_t count = 0, in_word = 0;
		for (size_t i = 0; i < s.n; i += len) {
			uint32_t c = utf8_get(s.p, s.n, i, &len);
			int w = c == '_' || is_digit_cp(c) || is_alpha_cp(rt, c);
			if (w && !in_word)
				count++;
			in_word = w;
		}
		return v_int(count);
	}
	case F_N:
		break;
	}
	rerr(rt, "No filter named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
}

/* ---- tests ---- */

static int do_test(struct rt *rt, int id, struct sstr name, struct val x, const struct args *a)
{
	struct val slot[1] = { v_undef };
	char what[48];
	snprintf(what, sizeof what, "test '%.*s'", (int)(name.n > 30 ? 30 : name.n), name.p);
	if (id < 0)
		rerr(rt, "No test named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
	static const char *const one[] = { "other" };
	switch ((enum test_id)id) {
	case TS_BOOLEAN: bind(rt, what, a, NULL, 0, slot); return x.t == V_BOOL;
	case TS_CALLABLE: bind(rt, what, a, NULL, 0, slot); return x.t == V_FUNC;
	case TS_DEFINED: bind(rt, what, a, NULL, 0, slot); return x.t != V_UNDEF;
	case TS_UNDEFINED: bind(rt, what, a, NULL, 0, slot); return x.t == V_UNDEF;
	case TS_DIVISIBLEBY: {
		bind(rt, what, a, one, 1, slot);
		struct val m = binop_val(rt, OP_MOD, x, slot[0]);
		return !truthy(&m);
	}
	case TS_EQ: case TS_EQUALTO: case TS_SYM_EQ:
		bind(rt, what, a, one, 1, slot);
		return val_eq(&x, &slot[0]);
	case TS_NE: case TS_SYM_NE:
		bind(rt, what, a, one, 1, slot);
		return !val_eq(&x, &slot[0]);
	case TS_ESCAPED: bind(rt, what, a, NULL, 0, slot); return 0;
	case TS_EVEN: case TS_ODD: {
		bind(rt, what, a, NULL, 0, slot);
		struct val two = v_int(2), m = binop_val(rt, OP_MOD, x, two);
		return id == TS_EVEN ? !truthy(&m) : (m.t == V_FLOAT ? m.u.f == 1 : m.u.i == 1);
	}
	case TS_FALSE: bind(rt, what, a, NULL, 0, slot); return x.t == V_BOOL && !x.u.i;
	case TS_TRUE: bind(rt, what, a, NULL, 0, slot); return x.t == V_BOOL && x.u.i;
	case TS_FILTER: case TS_TEST: {
		bind(rt, what, a, NULL, 0, slot);
		if (x.t != V_STR)
			return 0;
		return id == TS_FILTER ? find_name(filter_names, F_N, x.u.s) >= 0 : find_name(test_names, TS_N, x.u.s) >= 0;
	}
	case TS_FLOAT: bind(rt, what, a, NULL, 0, slot); return x.t == V_FLOAT;
	case TS_INTEGER: bind(rt, what, a, NULL, 0, slot); return x.t == V_INT;
	case TS_NUMBER: bind(rt, what, a, NULL, 0, slot); return is_num(&x);
	case TS_GE: case TS_GT: case TS_GREATERTHAN: case TS_LE: case TS_LT: case TS_LESSTHAN:
	case TS_SYM_LT: case TS_SYM_LE: case TS_SYM_GT: case TS_SYM_GE: {
		bind(rt, what, a, one, 1, slot);
		int c = val_cmp(rt, &x, &slot[0]);
		switch (id) {
		case TS_GE: case TS_SYM_GE: return c >= 0;
		case TS_GT: case TS_GREATERTHAN: case TS_SYM_GT: return c > 0;
		case TS_LE: case TS_SYM_LE: return c <= 0;
		default: return c < 0;
		}
	}
	case TS_IN: {
		static const char *const names[] = { "seq" };
		bind(rt, what, a, names, 1, slot);
		return contains(rt, &x, &slot[0]);
	}
	case TS_ITERABLE:
		bind(rt, what, a, NULL, 0, slot);
		return x.t == V_UNDEF || x.t == V_STR || x.t == V_LIST || x.t == V_DICT;
	case TS_SEQUENCE:
		bind(rt, what, a, NULL, 0, slot);
		return x.t == V_UNDEF || x.t == V_STR || (x.t == V_LIST && x.u.l->kind != LK_GEN) || x.t == V_DICT;
	case TS_LOWER: case TS_UPPER: {
		bind(rt, what, a, NULL, 0, slot);
		struct sstr s = to_str(rt, &x);
		struct val v = v_str(s.p, s.n);
		struct func f = { .kind = FN_METHOD, .id = id == TS_LOWER ? M_ISLOWER : M_ISUPPER, .self = v };
		struct args none = { 0 };
		struct val r = call_method(rt, &f, &none);
		return (int)r.u.i;
	}
	case TS_MAPPING: bind(rt, what, a, NULL, 0, slot); return x.t == V_DICT;
	case TS_NONE: bind(rt, what, a, NULL, 0, slot); return x.t == V_NONE;
	case TS_SAMEAS: {
		bind(rt, what, a, one, 1, slot);
		struct val *o = &slot[0];
		if (x.t != o->t)
			return 0;
		switch (x.t) {
		case V_UNDEF: return 0;
		case V_NONE: return 1;
		case V_BOOL: case V_INT: return x.u.i == o->u.i && (x.t == V_BOOL || (x.u.i >= -5 && x.u.i <= 256));
		case V_STR: return x.u.s.p == o->u.s.p && x.u.s.n == o->u.s.n;
		case V_LIST: return x.u.l == o->u.l;
		case V_DICT: case V_NS: return x.u.d == o->u.d;
		default: return val_eq(&x, o);
		}
	}
	case TS_STRING: bind(rt, what, a, NULL, 0, slot); return x.t == V_STR;
	case TS_N: break;
	}
	rerr(rt, "No test named '%.*s'", (int)(name.n > 40 ? 40 : name.n), name.p);
}

/* ---- expressions ---- */

static struct val eval_compare(struct rt *rt, struct scope *sc, const struct node *n)
{
	struct val left = eval(rt, sc, n->a);
	for (int i = 0; i < n->nkids; i++) {
		struct val right = eval(rt, sc, n->kids[i]);
		int ok;
		switch (n->ops[i]) {
		case OP_EQ: ok = val_eq(&left, &right); break;
		case OP_NE: ok = !val_eq(&left, &right); break;
		case OP_LT: ok = val_cmp(rt, &left, &right) < 0; break;
		case OP_LE: ok = val_cmp(rt, &left, &right) <= 0; break;
		case OP_GT: ok = val_cmp(rt, &left, &right) > 0; break;
		case OP_GE: ok = val_cmp(rt, &left, &right) >= 0; break;
		case OP_IN: ok = contains(rt, &left, &right); break;
		default: ok = !contains(rt, &left, &right); break;
		}
		if (!ok)
			return v_bool(0);
		left = right;
	}
	return v_bool(1);
}

static struct val eval(struct rt *rt, struct scope *sc, const struct node *n)
{
	struct val a, b;
	step(rt, 1);
	rt->line = n->line;
	switch (n->kind) {
	case N_CONST:
		return n->v;
	case N_NAME:
		return lookup(rt, sc, n->v.u.s);
	case N_LIST: {
		struct list *l = list_new(rt, (size_t)n->nkids, n->flag ? LK_TUPLE : LK_LIST);
		for (int i = 0; i < n->nkids; i++)
			l->v[l->n++] = eval(rt, sc, n->kids[i]);
		return v_list(l);
	}
	case N_DICT: {
		struct dict *d = dict_new(rt);
		for (int i = 0; i + 1 < n->nkids; i += 2) {
			struct val k = eval(rt, sc, n->kids[i]);
			if (k.t == V_LIST && k.u.l->kind == LK_LIST)
				rerr(rt, "unhashable type: 'list'");
			if (k.t == V_DICT || k.t == V_NS)
				rerr(rt, "unhashable type: 'dict'");
			dict_set(rt, d, k, eval(rt, sc, n->kids[i + 1]));
		}
		return v_dict(d, V_DICT);
	}
	case N_ATTR:
		a = eval(rt, sc, n->a);
		rt->line = n->line;
		return get_attr(rt, a, n->v.u.s, 1);
	case N_ITEM:
		a = eval(rt, sc, n->a);
		b = eval(rt, sc, n->b);
		rt->line = n->line;
		return get_item(rt, a, b, 1);
	case N_SLICE: {
		struct val s[3];
		const struct node *parts[3] = { n->b, n->c, n->d };
		a = eval(rt, sc, n->a);
		for (int i = 0; i < 3; i++)
			s[i] = parts[i] ? eval(rt, sc, parts[i]) : v_none;
		rt->line = n->line;
		return slice(rt, a, &s[0], &s[1], &s[2]);
	}
	case N_CALL: {
		struct args args;
		a = eval(rt, sc, n->a);
		eval_args(rt, sc, n, &args);
		rt->line = n->line;
		return call_value(rt, a, &args, v_undef);
	}
	case N_FILTER: {
		struct args args;
		a = eval(rt, sc, n->a);
		eval_args(rt, sc, n, &args);
		rt->line = n->line;
		return do_filter(rt, n->id, n->v.u.s, a, &args);
	}
	case N_TEST: {
		struct args args;
		a = eval(rt, sc, n->a);
		eval_args(rt, sc, n, &args);
		rt->line = n->line;
		return v_bool(do_test(rt, n->id, n->v.u.s, a, &args) != n->flag);
	}
	case N_NEG: case N_POS:
		a = eval(rt, sc, n->a);
		rt->line = n->line;
		if (a.t == V_UNDEF)
			undefined_error(rt, &a);
		if (a.t == V_FLOAT)
			return v_float(n->kind == N_NEG ? -a.u.f : a.u.f);
		if (a.t == V_INT || a.t == V_BOOL) {
			if (n->kind == N_POS)
				return v_int(a.u.i);
			if (a.u.i == INT64_MIN)
				rerr(rt, "integer overflow");
			return v_int(-a.u.i);
		}
		rerr(rt, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', type_name(&a));
	case N_NOT:
		a = eval(rt, sc, n->a);
		return v_bool(!truthy(&a));
	case N_BINOP:
		a = eval(rt, sc, n->a);
		b = eval(rt, sc, n->b);
		rt->line = n->line;
		return binop_val(rt, n->op, a, b);
	case N_CONCAT: {
		struct sbuf buf = { 0 };
		for (int i = 0; i < n->nkids; i++) {
			a = eval(rt, sc, n->kids[i]);
			put_str(rt, &buf, &a, 0);
		}
		return sb_val(&buf);
	}
	case N_AND:
		a = eval(rt, sc, n->a);
		return truthy(&a) ? eval(rt, sc, n->b) : a;
	case N_OR:
		a = eval(rt, sc, n->a);
		return truthy(&a) ? a : eval(rt, sc, n->b);
	case N_COMPARE:
		return eval_compare(rt, sc, n);
	case N_COND:
		a = eval(rt, sc, n->a);
		if (truthy(&a))
			return eval(rt, sc, n->b);
		if (n->c)
			return eval(rt, sc, n->c);
		return v_undef;
	default:
		rerr(rt, "internal error: statement in an expression");
	}
}

/* ---- statements ---- */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

/* Binds NAMES (one, or several to unpack from V when TUPLE) in SC. */
static void assign(struct rt *rt, struct scope *sc, const struct sstr *names, int n, int tuple, struct val v)
{
	if (!tuple) {
		scope_set(rt, sc, names[0], v);
		return;
	}
	struct list *l = iterate(rt, v);
	if (l->n != (size_t)n)
		rerr(rt, l->n > (size_t)n ? "too many values to unpack (expected %d)"
					  : "not enough values to unpack (expected %d, got fewer)", n);
	for (int i = 0; i < n; i++)
		scope_set(rt, sc, names[i], l->v[i]);
}

static int exec_for(struct rt *rt, struct scope *sc, const struct node *n)
{
	struct val it = eval(rt, sc, n->a);
	rt->line = n->line;
	struct list *items = iterate(rt, it);
	if (n->b) { /* for x in y if cond: the loop sees only those that pass */
		struct list *kept = list_new(rt, 0, LK_LIST);
		for (size_t i = 0; i < items->n; i++) {
			struct scope *fs = scope_new(rt, sc);
			assign(rt, fs, n->names, n->nnames, n->flag, items->v[i]);
			struct val ok = eval(rt, fs, n->b);
			if (truthy(&ok))
				list_push(rt, kept, items->v[i]);
		}
		items = kept;
	}
	if (!items->n)
		return exec_body(rt, sc, n->kids2, n->nkids2);
	struct loop *lp = ralloc(rt, sizeof *lp);
	memset(lp, 0, sizeof *lp);
	lp->items = items;
	struct val loopv = { .t = V_LOOP };
	loopv.u.lp = lp;
	struct sstr loop_name = { "loop", 4 };
	struct scope *it_sc = NULL;
	for (size_t i = 0; i < items->n; i++) {
		step(rt, 1);
		lp->index0 = i;
		if (it_sc && !n->op) /* nothing kept the last turn's scope: reuse it */
			it_sc->vars.n = 0;
		else
			it_sc = scope_new(rt, sc);
		scope_set(rt, it_sc, loop_name, loopv);
		rt->line = n->line;
		assign(rt, it_sc, n->names, n->nnames, n->flag, items->v[i]);
		if (exec_body(rt, it_sc, n->kids, n->nkids) == FLOW_BREAK)
			break;
	}
	return FLOW_NEXT;
}

/* A filter chain whose innermost operand (NULL in the tree) is X. */
static struct val apply_chain(struct rt *rt, struct scope *sc, const struct node *f, struct val x)
{
	if (!f)
		return x;
	struct val in = apply_chain(rt, sc, f->a, x);
	struct args args;
	eval_args(rt, sc, f, &args);
	rt->line = f->line;
	return do_filter(rt, f->id, f->v.u.s, in, &args);
}

static int exec_stmt(struct rt *rt, struct scope *sc, const struct node *n)
{
	struct val v;
	step(rt, 1);
	rt->line = n->line;
	switch (n->kind) {
	case N_TEXT:
		emit(rt, n->v.u.s.p, n->v.u.s.n);
		return FLOW_NEXT;
	case N_OUTPUT: {
		v = eval(rt, sc, n->a);
		rt->line = n->line;
		if (v.t == V_STR) {
			emit(rt, v.u.s.p, v.u.s.n);
		} else {
			struct sstr s = to_str(rt, &v);
			emit(rt, s.p, s.n);
		}
		return FLOW_NEXT;
	}
	case N_IF:
		v = eval(rt, sc, n->a);
		if (truthy(&v))
			return exec_body(rt, sc, n->kids, n->nkids);
		return exec_body(rt, sc, n->kids2, n->nkids2);
	case N_FOR:
		return exec_for(rt, sc, n);
	case N_SET:
		v = eval(rt, sc, n->a);
		rt->line = n->line;
		if (n->b) {
			struct val ns = lookup(rt, sc, n->b->v.u.s);
			if (ns.t != V_NS)
				rerr(rt, "can not assign attribute on non-namespace object");
			dict_set(rt, ns.u.d, v_str(n->names[0].p, n->names[0].n), v);
		} else {
			assign(rt, sc, n->names, n->nnames, n->flag, v);
		}
		return FLOW_NEXT;
	case N_SETBLOCK:
		v = capture(rt, sc, n->kids, n->nkids);
		v = apply_chain(rt, sc, n->a, v);
		scope_set(rt, sc, n->names[0], v);
		return FLOW_NEXT;
	case N_MACRO: {
		struct func *f = func_new(rt, FN_MACRO, 0);
		f->node = n;
		f->scope = sc;
		f->name = n->v.u.s;
		scope_set(rt, sc, n->v.u.s, v_func(f));
		return FLOW_NEXT;
	}
	case N_CALLBLOCK: {
		struct func *f = func_new(rt, FN_CALLER, 0);
		struct args args;
		f->node = n;
		f->scope = sc;
		f->name = n->v.u.s;
		struct val callee = eval(rt, sc, n->a->a);
		eval_args(rt, sc, n->a, &args);
		rt->line = n->line;
		if (callee.t != V_FUNC || callee.u.fn->kind != FN_MACRO)
			rerr(rt, "{%% call %%} needs a macro");
		v = call_macro(rt, callee.u.fn, &args, v_func(f));
		emit(rt, v.u.s.p, v.u.s.n);
		return FLOW_NEXT;
	}
	case N_FILTERBLOCK:
		v = capture(rt, sc, n->kids, n->nkids);
		v = apply_chain(rt, sc, n->a, v);
		{
			struct sstr s = to_str(rt, &v);
			emit(rt, s.p, s.n);
		}
		return FLOW_NEXT;
	case N_WITH: {
		struct scope *ws = scope_new(rt, sc);
		for (int i = 0; i < n->nnames; i++)
			scope_set(rt, ws, n->names[i], eval(rt, sc, n->kids2[i]));
		return exec_body(rt, ws, n->kids, n->nkids);
	}
	case N_BREAK:
		return FLOW_BREAK;
	case N_CONTINUE:
		return FLOW_CONTINUE;
	case N_GENERATION:
		return exec_body(rt, sc, n->kids, n->nkids);
	default:
		rerr(rt, "internal error: expression as a statement");
	}
}

static int exec_body(struct rt *rt, struct scope *sc, struct node *const *body, int n)
{
	for (int i = 0; i < n; i++) {
		int r = exec_stmt(rt, sc, body[i]);
		if (r != FLOW_NEXT)
			return r;
	}
	return FLOW_NEXT;
}

/* ---- the context ---- */

static struct val from_json(struct rt *rt, struct json_object *j, int depth)
{
	if (depth > 200)
		rlimit(rt, "the context is nested too deeply");
	step(rt, 1);
	switch (json_object_get_type(j)) {
	case json_type_null:
		return v_none;
	case json_type_boolean:
		return v_bool(json_object_get_boolean(j));
	case json_type_double:
		return v_float(json_object_get_double(j));
	case json_type_int:
		return v_int(json_object_get_int64(j));
	case json_type_string:
		return v_str(json_object_get_string(j), (size_t)json_object_get_string_len(j));
	case json_type_array: {
		size_t n = json_object_array_length(j);
		struct list *l = list_new(rt, n, LK_LIST);
		for (size_t i = 0; i < n; i++)
			l->v[l->n++] = from_json(rt, json_object_array_get_idx(j, i), depth + 1);
		return v_list(l);
	}
	case json_type_object: {
		struct dict *d = dict_new(rt);
		struct json_object_iterator it = json_object_iter_begin(j), end = json_object_iter_end(j);
		for (; !json_object_iter_equal(&it, &end); json_object_iter_next(&it))
			dict_set(rt, d, v_cstr(json_object_iter_peek_name(&it)),
				 from_json(rt, json_object_iter_peek_value(&it), depth + 1));
		return v_dict(d, V_DICT);
	}
	}
	return v_none;
}

int jinja_render(const struct jinja_template *t, struct json_object *ctx, const struct jinja_limits *lim,
		 char **ret, size_t *ret_len, char *err, size_t errlen)
{
	if (!t || !ret || !ret_len)
		return -EINVAL;
	if (err && errlen)
		err[0] = '\0';
	if (ctx && !json_object_is_type(ctx, json_type_object)) {
		if (err && errlen)
			snprintf(err, errlen, "the context is not a JSON object");
		return -EINVAL;
	}
	struct rt *rt = calloc(1, sizeof *rt);
	if (!rt)
		return -ENOMEM;
	if (lim)
		rt->lim = *lim;
	else
		jinja_limits_default(&rt->lim);
	rt->ar.limit = rt->lim.max_memory;
	rt->err = err;
	rt->errlen = errlen;
	rt->line = 1;
	int code = 0;
	if (setjmp(rt->jb)) {
		code = rt->code;
		goto done;
	}
	struct val g = ctx ? from_json(rt, ctx, 0) : v_dict(dict_new(rt), V_DICT);
	rt->globals = g.u.d;
	struct sbuf out = { 0 };
	rt->out = &out;
	struct scope *root = scope_new(rt, NULL);
	exec_body(rt, root, t->body, t->nbody);
	char *res = malloc(out.n + 1);
	if (!res) {
		code = -ENOMEM;
		goto done;
	}
	if (out.n)
		memcpy(res, out.p, out.n);
	res[out.n] = '\0';
	*ret = res;
	*ret_len = out.n;
done:
	if (rt->loc)
		freelocale(rt->loc);
	arena_free(&rt->ar);
	free(rt);
	return code;
}
