/* jschema.c - a JSON Schema (json-c) -> GBNF text that accepts only JSON the
 * schema accepts (jschema.h lists what is enforced, ignored and refused).
 * Not the grammar engine that parses the text and masks tokens with it: this
 * only writes text.  The shape of the rules follows llama.cpp's
 * json-schema-to-grammar; the code is ours.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "jschema.h"

#define UNBOUNDED SIZE_MAX   /* a length or count without an upper bound */
#define MAX_NAME 120         /* bytes of a rule name (longer ones are cut) */
#define MAX_KEY 128          /* code points of a property name that additional
                                properties' keys must avoid (nesting depth of
                                the key rule) */
#define MAX_ENUM 10000u      /* values of one enum */
#define MAX_GROUPS 32u       /* nested groups of a pattern (the rules around
                                them add a few: grammar parsers bound nesting
                                at 64) */
#define INT_LIMIT 1000000000000000000LL  /* integer bounds beyond +-10^18 are
                                            clamped where that is sound */

/* ---- text buffers ---- */

struct sbuf {
	char *p;    /* malloc'd, NUL-terminated while !err */
	size_t len; /* bytes used, without the NUL */
	size_t cap; /* bytes allocated */
	int err;    /* first failure (-ENOMEM, -E2BIG); later puts are ignored */
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->err || n == 0)
		return;
	if (b->len + n >= JSCHEMA_MAX_GBNF) {
		b->err = -E2BIG;
		return;
	}
	if (!b->p || b->cap - b->len <= n) {
		size_t cap = b->cap ? b->cap : 64;
		while (cap - b->len <= n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->err = -ENOMEM;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_puts(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static void sb_putc(struct sbuf *b, char ch)
{
	sb_put(b, &ch, 1);
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0) {
		if (!b->err)
			b->err = -EINVAL;
		return;
	}
	if ((size_t)n < sizeof tmp) {
		sb_put(b, tmp, (size_t)n);
		return;
	}
	char *big = malloc((size_t)n + 1);
	if (!big) {
		if (!b->err)
			b->err = -ENOMEM;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	sb_put(b, big, (size_t)n);
	free(big);
}

static void sb_free(struct sbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof *b);
}

/* ---- the conversion's state ---- */

struct rule {
	char *name; /* malloc'd, [a-zA-Z0-9-]+ */
	char *body; /* malloc'd alternatives; NULL while a $ref's body is built */
};

struct ref_entry {
	char *ref;        /* malloc'd "$ref" value */
	const char *rule; /* its rule's name (owned by conv.rules) */
	int level;        /* conv.level when its body began; INT_MIN once built */
};

struct conv {
	struct json_object *root; /* the whole document, for $ref */
	unsigned flags;           /* JSCHEMA_* */
	struct rule *rules;       /* (n_rules) in creation order */
	size_t n_rules;           /* rules made */
	size_t cap_rules;         /* rules allocated */
	uint32_t *hash;           /* (hash_cap) rule index + 1 by name; 0 = free */
	size_t hash_cap;          /* a power of two, > 2 * n_rules */
	struct ref_entry *refs;   /* (n_refs) every $ref met, built or in progress */
	size_t n_refs;            /* refs met */
	size_t cap_refs;          /* refs allocated */
	size_t out_bytes;         /* bytes of the grammar text so far */
	unsigned depth;           /* schema_body()s and merges nested now */
	unsigned long work;       /* nodes visited, merged or compared so far */
	int level;                /* objects and arrays entered on the current
	                             path: each consumes a "{" or "[" first */
	char path[512];           /* JSON pointer of the node being converted */
	size_t path_len;          /* strlen(path) */
	char *err;                /* the caller's message buffer (may be NULL) */
	size_t errlen;            /* its size */
	int rc;                   /* first failure; 0 while none */
};

/* Records the first failure: "KEYWORD at PATH: why".  Returns CODE. */
static int fail(struct conv *c, int code, const char *kw, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(struct conv *c, int code, const char *kw, const char *fmt, ...)
{
	va_list ap;

	if (c->rc)
		return c->rc;
	c->rc = code;
	if (!c->err || !c->errlen)
		return code;
	int n = snprintf(c->err, c->errlen, "%s at %s: ", kw, c->path_len ? c->path : "#");
	if (n >= 0 && (size_t)n < c->errlen) {
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* Takes the failure of a buffer (out of memory, too long) as the conversion's. */
static int sb_check(struct conv *c, struct sbuf *b)
{
	if (b->err == -E2BIG)
		return fail(c, -E2BIG, "schema", "the grammar would exceed %u bytes",
			    JSCHEMA_MAX_GBNF);
	if (b->err)
		return fail(c, b->err, "schema", "out of memory");
	return c->rc;
}

/* Appends "/SEG" (escaped as a JSON pointer) to the path; returns the old
 * length for path_pop. */
static size_t path_push(struct conv *c, const char *seg)
{
	size_t old = c->path_len;
	char *p = c->path;
	size_t n = c->path_len, cap = sizeof c->path - 4;

	if (n == 0)
		p[n++] = '#';
	if (n < cap)
		p[n++] = '/';
	for (; *seg && n < cap; seg++) {
		if (*seg == '~' || *seg == '/') {
			p[n++] = '~';
			if (n < cap)
				p[n++] = *seg == '~' ? '0' : '1';
		} else {
			p[n++] = *seg;
		}
	}
	if (*seg)
		memcpy(p + n, "...", 3), n += 3;
	p[n] = '\0';
	c->path_len = n;
	return old;
}

static size_t path_push_idx(struct conv *c, size_t i)
{
	char tmp[24];

	snprintf(tmp, sizeof tmp, "%zu", i);
	return path_push(c, tmp);
}

static void path_pop(struct conv *c, size_t old)
{
	c->path_len = old;
	c->path[old] = '\0';
}

/* Counts one unit of work and one level of nesting; 0 or the failure. */
static int enter(struct conv *c)
{
	if (c->rc)
		return c->rc;
	if (++c->work > JSCHEMA_MAX_WORK)
		return fail(c, -E2BIG, "schema", "more than %u schema nodes to convert",
			    JSCHEMA_MAX_WORK);
	if (c->depth >= JSCHEMA_MAX_DEPTH)
		return fail(c, -E2BIG, "schema", "nested deeper than %u (schemas, $ref, allOf)",
			    JSCHEMA_MAX_DEPTH);
	c->depth++;
	return 0;
}

static void leave(struct conv *c)
{
	c->depth--;
}

/* ---- GBNF escapes ---- */

/* Decodes the UTF-8 code point at *S (< END) and advances; -1 when invalid. */
static long utf8_next(const unsigned char **s, const unsigned char *end)
{
	const unsigned char *p = *s;
	unsigned n;
	long cp;

	if (p[0] < 0x80) {
		*s = p + 1;
		return p[0];
	}
	if ((p[0] & 0xE0) == 0xC0)
		n = 1, cp = p[0] & 0x1F;
	else if ((p[0] & 0xF0) == 0xE0)
		n = 2, cp = p[0] & 0x0F;
	else if ((p[0] & 0xF8) == 0xF0)
		n = 3, cp = p[0] & 0x07;
	else
		return -1;
	if ((size_t)(end - p) <= n)
		return -1;
	for (unsigned i = 1; i <= n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return -1;
		cp = cp << 6 | (p[i] & 0x3F);
	}
	static const long min_cp[4] = { 0, 0x80, 0x800, 0x10000 };
	if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return -1;
	*s = p + n + 1;
	return cp;
}

static void put_hex_cp(struct sbuf *b, long cp)
{
	if (cp <= 0xFF)
		sb_printf(b, "\\x%02X", (unsigned)cp);
	else if (cp <= 0xFFFF)
		sb_printf(b, "\\u%04X", (unsigned)cp);
	else
		sb_printf(b, "\\U%08X", (unsigned)cp);
}

/* One code point inside a GBNF "literal". */
static void put_lit_cp(struct sbuf *b, long cp)
{
	if (cp == '"' || cp == '\\') {
		sb_putc(b, '\\');
		sb_putc(b, (char)cp);
	} else if (cp >= 0x20 && cp < 0x7F) {
		sb_putc(b, (char)cp);
	} else {
		put_hex_cp(b, cp);
	}
}

/* One code point inside a GBNF [class]. */
static void put_cls_cp(struct sbuf *b, long cp)
{
	if (cp >= 0x20 && cp < 0x7F && !strchr("[]\\-^\"", (int)cp))
		sb_putc(b, (char)cp);
	else
		put_hex_cp(b, cp);
}

/* The bytes S[0..N) (UTF-8) as a GBNF literal; -EINVAL when not UTF-8. */
static int put_literal(struct sbuf *b, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n;

	sb_putc(b, '"');
	while (p < end) {
		long cp = utf8_next(&p, end);
		if (cp < 0)
			return -EINVAL;
		put_lit_cp(b, cp);
	}
	sb_putc(b, '"');
	return 0;
}

/* ---- JSON values: text, equality, type ---- */

static void json_put_string(struct sbuf *b, const char *s, size_t n)
{
	sb_putc(b, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		switch (ch) {
		case '"': sb_puts(b, "\\\""); break;
		case '\\': sb_puts(b, "\\\\"); break;
		case '\b': sb_puts(b, "\\b"); break;
		case '\f': sb_puts(b, "\\f"); break;
		case '\n': sb_puts(b, "\\n"); break;
		case '\r': sb_puts(b, "\\r"); break;
		case '\t': sb_puts(b, "\\t"); break;
		default:
			if (ch < 0x20)
				sb_printf(b, "\\u%04x", ch);
			else
				sb_putc(b, (char)ch);
		}
	}
	sb_putc(b, '"');
}

/* V as compact JSON text (ours, not json-c's: that one writes into V). */
static int json_put(struct sbuf *b, struct json_object *v, unsigned depth)
{
	if (depth > JSCHEMA_MAX_DEPTH)
		return -E2BIG;
	switch (json_object_get_type(v)) {
	case json_type_null:
		sb_puts(b, "null");
		break;
	case json_type_boolean:
		sb_puts(b, json_object_get_boolean(v) ? "true" : "false");
		break;
	case json_type_int: {
		int64_t i = json_object_get_int64(v);
		if (i == INT64_MAX)
			sb_printf(b, "%llu", (unsigned long long)json_object_get_uint64(v));
		else
			sb_printf(b, "%lld", (long long)i);
		break;
	}
	case json_type_double: {
		double d = json_object_get_double(v);
		char tmp[40];
		if (!isfinite(d))
			return -EINVAL;
		for (int prec = 1; prec <= 17; prec++) {
			snprintf(tmp, sizeof tmp, "%.*g", prec, d);
			if (strtod(tmp, NULL) == d)
				break;
		}
		sb_puts(b, tmp);
		break;
	}
	case json_type_string:
		json_put_string(b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
		break;
	case json_type_array: {
		size_t n = json_object_array_length(v);
		sb_putc(b, '[');
		for (size_t i = 0; i < n; i++) {
			if (i)
				sb_putc(b, ',');
			int rc = json_put(b, json_object_array_get_idx(v, i), depth + 1);
			if (rc < 0)
				return rc;
		}
		sb_putc(b, ']');
		break;
	}
	case json_type_object: {
		int first = 1;
		sb_putc(b, '{');
		json_object_object_foreach(v, k, val) {
			if (!first)
				sb_putc(b, ',');
			first = 0;
			json_put_string(b, k, strlen(k));
			sb_putc(b, ':');
			int rc = json_put(b, val, depth + 1);
			if (rc < 0)
				return rc;
		}
		sb_putc(b, '}');
		break;
	}
	}
	return 0;
}

static int is_number(struct json_object *v)
{
	return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

/* JSON equality as JSON Schema's enum and const see it: 1 == 1.0, true != 1. */
static int json_equal(struct json_object *a, struct json_object *b, unsigned depth)
{
	if (depth > JSCHEMA_MAX_DEPTH)
		return 0;
	if (is_number(a) && is_number(b)) {
		if (json_object_is_type(a, json_type_int) && json_object_is_type(b, json_type_int))
			return json_object_get_int64(a) == json_object_get_int64(b);
		return json_object_get_double(a) == json_object_get_double(b);
	}
	enum json_type t = json_object_get_type(a);
	if (t != json_object_get_type(b))
		return 0;
	switch (t) {
	case json_type_null:
		return 1;
	case json_type_boolean:
		return !json_object_get_boolean(a) == !json_object_get_boolean(b);
	case json_type_string:
		return json_object_get_string_len(a) == json_object_get_string_len(b) &&
		       memcmp(json_object_get_string(a), json_object_get_string(b),
			      (size_t)json_object_get_string_len(a)) == 0;
	case json_type_array: {
		size_t n = json_object_array_length(a);
		if (n != json_object_array_length(b))
			return 0;
		for (size_t i = 0; i < n; i++)
			if (!json_equal(json_object_array_get_idx(a, i),
					json_object_array_get_idx(b, i), depth + 1))
				return 0;
		return 1;
	}
	case json_type_object: {
		if (json_object_object_length(a) != json_object_object_length(b))
			return 0;
		json_object_object_foreach(a, k, va) {
			struct json_object *vb;
			if (!json_object_object_get_ex(b, k, &vb) || !json_equal(va, vb, depth + 1))
				return 0;
		}
		return 1;
	}
	default:
		return 0;
	}
}

/* JSON types as a mask; a number with an integral value is an integer, as
 * JSON Schema has it. */
#define T_NULL 0x01u
#define T_BOOL 0x02u
#define T_INT 0x04u
#define T_FRAC 0x08u /* numbers that are not integers */
#define T_STR 0x10u
#define T_ARR 0x20u
#define T_OBJ 0x40u
#define T_NUM (T_INT | T_FRAC)
#define T_ALL 0x7Fu

static unsigned value_type(struct json_object *v)
{
	switch (json_object_get_type(v)) {
	case json_type_null: return T_NULL;
	case json_type_boolean: return T_BOOL;
	case json_type_int: return T_INT;
	case json_type_double: {
		double d = json_object_get_double(v);
		return isfinite(d) && d == floor(d) ? T_INT : T_FRAC;
	}
	case json_type_string: return T_STR;
	case json_type_array: return T_ARR;
	case json_type_object: return T_OBJ;
	}
	return 0;
}

static const struct {
	const char *name; /* as "type" spells it */
	unsigned mask;    /* T_* */
} type_names[] = {
	{ "null", T_NULL }, { "boolean", T_BOOL }, { "integer", T_INT }, { "number", T_NUM },
	{ "string", T_STR }, { "array", T_ARR }, { "object", T_OBJ },
};

#define N_TYPE_NAMES (sizeof type_names / sizeof type_names[0])

/* ---- keywords ---- */

static struct json_object *kw(struct json_object *s, const char *k)
{
	struct json_object *v;

	return json_object_is_type(s, json_type_object) && json_object_object_get_ex(s, k, &v) ?
		       v : NULL;
}

static int has(struct json_object *s, const char *k)
{
	struct json_object *v;

	return json_object_is_type(s, json_type_object) && json_object_object_get_ex(s, k, &v);
}

/* Keywords that constrain a value (handled or refused); any other is an
 * annotation or unknown, which JSON Schema ignores and so do we. */
static const char *const assertion_kws[] = {
	"type", "enum", "const", "properties", "required", "additionalProperties",
	"patternProperties", "propertyNames", "minProperties", "maxProperties",
	"dependentRequired", "dependentSchemas", "dependencies", "items", "prefixItems",
	"additionalItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
	"maxContains", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
	"exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "anyOf", "oneOf", "not",
	"if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef", "unevaluatedProperties",
	"unevaluatedItems",
};

static int is_assertion(const char *k)
{
	for (size_t i = 0; i < sizeof assertion_kws / sizeof assertion_kws[0]; i++)
		if (strcmp(k, assertion_kws[i]) == 0)
			return 1;
	return 0;
}

/* Whether S has an assertion keyword other than EXCEPT1 and EXCEPT2. */
static int has_other_assertions(struct json_object *s, const char *except1, const char *except2)
{
	json_object_object_foreach(s, k, v) {
		(void)v;
		if (is_assertion(k) && strcmp(k, except1) != 0 && (!except2 || strcmp(k, except2) != 0))
			return 1;
	}
	return 0;
}

static int is_true(struct json_object *v)
{
	return json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);
}

static int is_false(struct json_object *v)
{
	return json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v);
}

/* Fails on the keywords of S that no grammar of ours enforces. */
static int check_refused(struct conv *c, struct json_object *s)
{
	static const char why_general[] = "cannot be enforced by a grammar";

	json_object_object_foreach(s, k, v) {
		if (strcmp(k, "not") == 0 || strcmp(k, "$dynamicRef") == 0 ||
		    strcmp(k, "$recursiveRef") == 0)
			return fail(c, -ENOTSUP, k, "%s", why_general);
		if (strcmp(k, "if") == 0 && (has(s, "then") || has(s, "else")))
			return fail(c, -ENOTSUP, k, "conditionals (if/then/else) %s", why_general);
		if ((strcmp(k, "dependentSchemas") == 0 || strcmp(k, "dependentRequired") == 0 ||
		     strcmp(k, "dependencies") == 0 || strcmp(k, "patternProperties") == 0) &&
		    !(json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0))
			return fail(c, -ENOTSUP, k, "%s", why_general);
		if ((strcmp(k, "propertyNames") == 0 || strcmp(k, "contains") == 0 ||
		     strcmp(k, "unevaluatedProperties") == 0 || strcmp(k, "unevaluatedItems") == 0) &&
		    !is_true(v))
			return fail(c, -ENOTSUP, k, "%s", why_general);
	}
	return 0;
}

/* A count keyword (minLength...): 0 when absent (*RET untouched), 1 when
 * read, or the failure. */
static int get_count(struct conv *c, struct json_object *s, const char *k, size_t *ret)
{
	struct json_object *v = kw(s, k);

	if (!v)
		return 0;
	if (json_object_is_type(v, json_type_int) && json_object_get_int64(v) >= 0) {
		int64_t i = json_object_get_int64(v);
		*ret = (uint64_t)i > SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)i;
		return 1;
	}
	if (json_object_is_type(v, json_type_double)) {
		double d = json_object_get_double(v);
		if (d >= 0 && d == floor(d)) {
			*ret = d > 1e15 ? (size_t)1e15 : (size_t)d;
			return 1;
		}
	}
	return fail(c, -EINVAL, k, "must be a non-negative integer");
}

/* ---- rules ---- */

static uint32_t name_hash(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static struct rule *rule_find(struct conv *c, const char *name)
{
	if (!c->hash_cap)
		return NULL;
	for (size_t i = name_hash(name) & (c->hash_cap - 1);; i = (i + 1) & (c->hash_cap - 1)) {
		uint32_t r = c->hash[i];
		if (!r)
			return NULL;
		if (strcmp(c->rules[r - 1].name, name) == 0)
			return &c->rules[r - 1];
	}
}

/* Adds NAME (taken) with BODY (taken, may be NULL); the name must be new. */
static const char *rule_insert(struct conv *c, char *name, char *body)
{
	if (c->n_rules == c->cap_rules) {
		size_t cap = c->cap_rules ? c->cap_rules * 2 : 64;
		struct rule *r = realloc(c->rules, cap * sizeof *r);
		if (!r)
			goto nomem;
		c->rules = r;
		c->cap_rules = cap;
	}
	if (2 * (c->n_rules + 1) >= c->hash_cap) {
		size_t cap = c->hash_cap ? c->hash_cap * 2 : 256;
		uint32_t *h = calloc(cap, sizeof *h);
		if (!h)
			goto nomem;
		for (size_t i = 0; i < c->n_rules; i++) {
			size_t j = name_hash(c->rules[i].name) & (cap - 1);
			while (h[j])
				j = (j + 1) & (cap - 1);
			h[j] = (uint32_t)(i + 1);
		}
		free(c->hash);
		c->hash = h;
		c->hash_cap = cap;
	}
	size_t j = name_hash(name) & (c->hash_cap - 1);
	while (c->hash[j])
		j = (j + 1) & (c->hash_cap - 1);
	c->rules[c->n_rules] = (struct rule){ .name = name, .body = body };
	c->hash[j] = (uint32_t)(++c->n_rules);
	c->out_bytes += strlen(name) + (body ? strlen(body) : 0) + 6;
	if (c->out_bytes > JSCHEMA_MAX_GBNF) {
		fail(c, -E2BIG, "schema", "the grammar would exceed %u bytes", JSCHEMA_MAX_GBNF);
		return NULL;
	}
	return name;
nomem:
	free(name);
	free(body);
	fail(c, -ENOMEM, "schema", "out of memory");
	return NULL;
}

/* ---- primitives: the shared rules ---- */

static const struct prim {
	const char *name;    /* rule name, reserved: no schema rule takes it */
	const char *body;    /* GBNF */
	const char *deps[6]; /* rules the body names */
} prims[] = {
	{ "space", "| \" \" | \"\\n\" [ \\t]{0,20}", { NULL } },
	{ "boolean", "\"true\" | \"false\"", { NULL } },
	{ "null", "\"null\"", { NULL } },
	{ "integral-part", "[0] | [1-9] [0-9]{0,15}", { NULL } },
	{ "decimal-part", "[0-9]{1,16}", { NULL } },
	{ "integer", "\"-\"? integral-part", { "integral-part" } },
	{ "number", "\"-\"? integral-part (\".\" decimal-part)? ([eE] [-+]? [0-9]{1,3})?",
	  { "integral-part", "decimal-part" } },
	/* One character of a JSON string, as itself or escaped; \u escapes of
	 * surrogates are left out, so that each `char` is one code point
	 * (minLength counts them). */
	{ "char",
	  "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | "
	  "[dD] [0-7] [0-9a-fA-F]{2}))",
	  { NULL } },
	{ "string", "\"\\\"\" char* \"\\\"\"", { "char" } },
	/* A character of the key of an additional property: no escapes, so that
	 * the key rule can tell it from the declared names. */
	{ "kchar", "[^\"\\\\\\x7F\\x00-\\x1F]", { NULL } },
	/* A pattern's ".": a JSON string's character other than a newline. */
	{ "dot", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfrt]", { NULL } },
	{ "value", "object | array | string | number | boolean | null",
	  { "object", "array", "string", "number", "boolean", "null" } },
	{ "object",
	  "\"{\" space ( string space \":\" space value ( space \",\" space string space \":\" "
	  "space value )* space )? \"}\"",
	  { "space", "string", "value" } },
	{ "array", "\"[\" space ( value ( space \",\" space value )* space )? \"]\"",
	  { "space", "value" } },
	/* Formats: only dates that exist (February has 28 days), year 0001 on. */
	{ "date",
	  "([1-9] [0-9]{3} | \"0\" ([1-9] [0-9]{2} | \"0\" ([1-9] [0-9] | \"0\" [1-9]))) \"-\" "
	  "((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
	  "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
	  "\"02\" \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))",
	  { NULL } },
	{ "time",
	  "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{3})? "
	  "(\"Z\" | [+\\x2D] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])",
	  { NULL } },
	{ "date-time", "date \"T\" time", { "date", "time" } },
	{ "uuid",
	  "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
	  "[0-9a-fA-F]{12}",
	  { NULL } },
	{ "ipv4-octet", "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]",
	  { NULL } },
	{ "ipv4", "ipv4-octet \".\" ipv4-octet \".\" ipv4-octet \".\" ipv4-octet", { "ipv4-octet" } },
	{ "email",
	  "[a-zA-Z0-9_+\\x2D]+ (\".\" [a-zA-Z0-9_+\\x2D]+)* \"@\" [a-zA-Z0-9\\x2D]+ (\".\" [a-zA-Z0-9\\x2D]+)* "
	  "\".\" [a-zA-Z]{2,24}",
	  { NULL } },
	{ "date-string", "\"\\\"\" date \"\\\"\"", { "date" } },
	{ "time-string", "\"\\\"\" time \"\\\"\"", { "time" } },
	{ "date-time-string", "\"\\\"\" date-time \"\\\"\"", { "date-time" } },
	{ "uuid-string", "\"\\\"\" uuid \"\\\"\"", { "uuid" } },
	{ "ipv4-string", "\"\\\"\" ipv4 \"\\\"\"", { "ipv4" } },
	{ "email-string", "\"\\\"\" email \"\\\"\"", { "email" } },
};

#define N_PRIMS (sizeof prims / sizeof prims[0])

/* The string formats we enforce: the primitive of the quoted string, and the
 * code points its content may have. */
static const struct {
	const char *format; /* "format" value */
	const char *rule;   /* primitive of the whole JSON string */
	size_t min_len;     /* code points, at least */
	size_t max_len;     /* at most (UNBOUNDED) */
} formats[] = {
	{ "date", "date-string", 10, 10 },
	{ "time", "time-string", 9, 18 },
	{ "date-time", "date-time-string", 20, 29 },
	{ "uuid", "uuid-string", 36, 36 },
	{ "ipv4", "ipv4-string", 7, 15 },
	{ "email", "email-string", 6, UNBOUNDED },
};

static int is_reserved(const char *name)
{
	if (strcmp(name, "root") == 0)
		return 1;
	for (size_t i = 0; i < N_PRIMS; i++)
		if (strcmp(prims[i].name, name) == 0)
			return 1;
	return 0;
}

/* Adds the primitive NAME and those it names; returns its name or NULL. */
static const char *prim(struct conv *c, const char *name)
{
	const struct prim *p = NULL;

	if (c->rc)
		return NULL;
	struct rule *r = rule_find(c, name);
	if (r)
		return r->name;
	for (size_t i = 0; i < N_PRIMS && !p; i++)
		if (strcmp(prims[i].name, name) == 0)
			p = &prims[i];
	if (!p) {
		fail(c, -EINVAL, "schema", "internal: no primitive %s", name);
		return NULL;
	}
	char *n = strdup(p->name), *b = strdup(p->body);
	if (!n || !b) {
		free(n);
		free(b);
		fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	const char *ret = rule_insert(c, n, b);
	for (size_t i = 0; ret && i < 6 && p->deps[i]; i++)
		if (!prim(c, p->deps[i]))
			return NULL;
	return ret;
}

/* NAME as a rule name: runs of other characters than [a-zA-Z0-9-] become
 * "-", at most MAX_NAME bytes, "root" for the empty name, a reserved name
 * gets a "-". */
static void sanitize(const char *name, char *out)
{
	size_t n = 0;
	int dash = 0;

	for (const char *p = name; *p && n < MAX_NAME; p++) {
		char ch = *p;
		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		    ch == '-') {
			out[n++] = ch;
			dash = 0;
		} else if (!dash) {
			out[n++] = '-';
			dash = 1;
		}
	}
	out[n] = '\0';
	if (!*name)
		strcpy(out, "root");
	else if (n == 0)
		strcpy(out, "r");
	else if (is_reserved(out))
		strcat(out, "-");
}

/* Finds a name for NAME: itself, else NAME0, NAME1... skipping those taken by
 * another body (and reserved ones).  With BODY, a rule that already has this
 * very body under one of those names is returned as *EXISTING. */
static int pick_name(struct conv *c, const char *name, const char *body, char *out,
		     struct rule **existing)
{
	char base[MAX_NAME + 2];

	sanitize(name, base);
	*existing = NULL;
	strcpy(out, base);
	for (unsigned i = 0;; i++) {
		struct rule *r = rule_find(c, out);
		if (!r && (i == 0 || !is_reserved(out)))
			return 0;
		if (r && body && r->body && strcmp(r->body, body) == 0) {
			*existing = r;
			return 0;
		}
		if (i > 100000)
			return fail(c, -E2BIG, "schema", "too many rules named %s", base);
		snprintf(out, MAX_NAME + 16, "%s%u", base, i);
	}
}

/* Adds NAME ::= BODY (BODY taken); a rule of the same name and body is
 * shared.  Returns the rule's name, or NULL on failure. */
static const char *add_rule(struct conv *c, const char *name, char *body)
{
	char final[MAX_NAME + 16];
	struct rule *existing;

	if (c->rc || !body) {
		free(body);
		if (!c->rc)
			fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	if (pick_name(c, name, body, final, &existing) < 0) {
		free(body);
		return NULL;
	}
	if (existing) {
		free(body);
		return existing->name;
	}
	char *n = strdup(final);
	if (!n) {
		free(body);
		fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	return rule_insert(c, n, body);
}

/* Adds NAME with no body yet (a $ref's, filled in by set_body). */
static const char *reserve_rule(struct conv *c, const char *name)
{
	char final[MAX_NAME + 16];
	struct rule *existing;

	if (pick_name(c, name, NULL, final, &existing) < 0)
		return NULL;
	char *n = strdup(final);
	if (!n) {
		fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	return rule_insert(c, n, NULL);
}

static int is_ident(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
		      *s == '-'))
			return 0;
	return 1;
}

/* The malloc'd text of B for a rule body, or NULL with the failure set. */
static char *sb_body(struct conv *c, struct sbuf *b)
{
	if (sb_check(c, b) < 0) {
		sb_free(b);
		return NULL;
	}
	if (!b->p) {
		b->p = strdup("");
		if (!b->p)
			fail(c, -ENOMEM, "schema", "out of memory");
	}
	char *p = b->p;
	memset(b, 0, sizeof *b);
	return p;
}

/* "NAME-SUFFIX", or SUFFIX for the root's empty NAME, into OUT (cut). */
static void sub_name(char *out, size_t cap, const char *name, const char *suffix)
{
	size_t n = 0;

	for (const char *p = name; *p && n + 1 < cap; p++)
		out[n++] = *p;
	if (*name && n + 1 < cap)
		out[n++] = '-';
	for (const char *p = suffix; *p && n + 1 < cap; p++)
		out[n++] = *p;
	out[n] = '\0';
}

#define NAME_CAP (MAX_NAME + 64)

static char *schema_body(struct conv *c, struct json_object *s, const char *name);

/* The rule for schema S named after NAME: a new rule, or the one its body
 * already names (a primitive, a $ref).  NULL on failure. */
static const char *visit(struct conv *c, struct json_object *s, const char *name)
{
	char *body = schema_body(c, s, name);

	if (!body)
		return NULL;
	if (is_ident(body)) {
		struct rule *r = rule_find(c, body);
		if (!r)
			fail(c, -EINVAL, "schema", "internal: no rule %s", body);
		free(body);
		return r ? r->name : NULL;
	}
	return add_rule(c, name, body);
}

/* ---- repetition ---- */

/* The GBNF suffix that repeats the item before it MIN..MAX times (MAX
 * UNBOUNDED); "" for once. */
static void put_repeat(struct sbuf *b, size_t min, size_t max)
{
	if (max == UNBOUNDED) {
		if (min == 0)
			sb_putc(b, '*');
		else if (min == 1)
			sb_putc(b, '+');
		else
			sb_printf(b, "{%zu,}", min);
	} else if (min == 0 && max == 1) {
		sb_putc(b, '?');
	} else if (min == max) {
		if (min != 1)
			sb_printf(b, "{%zu}", min);
	} else {
		sb_printf(b, "{%zu,%zu}", min, max);
	}
}

/* Applies JSCHEMA_MAX_REPEAT to a count read from KW: a maximum is lowered,
 * a minimum above it refused. */
static int clamp_counts(struct conv *c, const char *kw_min, size_t *min, size_t *max)
{
	if (*min > JSCHEMA_MAX_REPEAT)
		return fail(c, -E2BIG, kw_min, "%zu is more than the %u this grammar allows", *min,
			    JSCHEMA_MAX_REPEAT);
	if (*max != UNBOUNDED && *max > JSCHEMA_MAX_REPEAT)
		*max = JSCHEMA_MAX_REPEAT;
	return 0;
}

/* ---- integers: decimal ranges ---- */

/* Same-length digit strings F <= T: every number in [F, T] with exactly
 * that many digits (leading zeros as they come). */
static void digits_range(struct sbuf *b, const char *f, const char *t)
{
	size_t k = strlen(f), i = 0;

	while (i < k && f[i] == t[i])
		i++;
	if (i > 0) {
		sb_putc(b, '"');
		sb_put(b, f, i);
		sb_putc(b, '"');
	}
	if (i == k)
		return;
	if (i > 0)
		sb_putc(b, ' ');
	size_t r = k - i - 1;
	if (r == 0) {
		sb_printf(b, "[%c-%c]", f[i], t[i]);
		return;
	}
	char zeros[24], nines[24];
	memset(zeros, '0', r);
	memset(nines, '9', r);
	zeros[r] = nines[r] = '\0';
	const char *fs = f + i + 1, *ts = t + i + 1;
	int from_all = strcmp(fs, zeros) == 0, to_all = strcmp(ts, nines) == 0;
	char lo = from_all ? f[i] : (char)(f[i] + 1), hi = to_all ? t[i] : (char)(t[i] - 1);
	int n = 0;

	sb_putc(b, '(');
	if (!from_all) {
		sb_printf(b, "[%c] (", f[i]);
		digits_range(b, fs, nines);
		sb_putc(b, ')');
		n++;
	}
	if (lo <= hi) {
		if (n++)
			sb_puts(b, " | ");
		if (lo == hi)
			sb_printf(b, "[%c]", lo);
		else
			sb_printf(b, "[%c-%c]", lo, hi);
		sb_puts(b, " [0-9]");
		put_repeat(b, r, r);
	}
	if (!to_all) {
		if (n++)
			sb_puts(b, " | ");
		sb_printf(b, "[%c] (", t[i]);
		digits_range(b, zeros, ts);
		sb_putc(b, ')');
	}
	sb_putc(b, ')');
}

static int n_digits(long long v)
{
	int n = 1;

	while (v >= 10)
		v /= 10, n++;
	return n;
}

static long long pow10ll(int n)
{
	long long p = 1;

	while (n-- > 0)
		p *= 10;
	return p;
}

/* Non-negative integers in [A, B] (B < 0: no bound; then at most 16 digits,
 * or A's) written without leading zeros, as alternatives.  A <= B.  FRAC:
 * each may have a fraction, of as many digits as keep the whole number to
 * 15 significant ones (so that its double is on the same side of every
 * integer bound as the decimal itself: Python's jsonschema compares floats). */
static void mag_range(struct sbuf *b, long long a, long long bmax, int frac)
{
	int da = n_digits(a), db = bmax < 0 ? (da > 16 ? da : 16) : n_digits(bmax);
	int n = 0;

	for (int d = da; d <= db; d++) {
		long long lo = d == 1 ? 0 : pow10ll(d - 1), hi = d >= 19 ? LLONG_MAX : pow10ll(d) - 1;
		if (d == da)
			lo = a;
		if (bmax >= 0 && d == db)
			hi = bmax;
		if (lo > hi)
			continue;
		if (n++)
			sb_puts(b, " | ");
		if (bmax < 0 && d > da && !frac) {
			/* every longer length at once */
			sb_printf(b, "[1-9] [0-9]{%d,%d}", d - 1, db - 1);
			break;
		}
		if (frac && 15 - d >= 1)
			sb_putc(b, '(');
		if (bmax < 0 && d > da) {
			sb_puts(b, "[1-9] [0-9]");
			put_repeat(b, (size_t)d - 1, (size_t)d - 1);
		} else {
			char fs[24], ts[24];
			snprintf(fs, sizeof fs, "%lld", lo);
			snprintf(ts, sizeof ts, "%lld", hi);
			digits_range(b, fs, ts);
		}
		if (frac && 15 - d >= 1)
			sb_printf(b, ") (\".\" [0-9]{1,%d})?", 15 - d);
	}
}

/* ---- numbers: bounds ---- */

struct bound {
	int set;       /* 0: no bound on this side */
	int excl;      /* the bound itself is excluded */
	long long v;   /* the bound, |v| <= INT_LIMIT */
};

/* Reads the bounds of S on numbers: LO/HI, integral, tightest of minimum,
 * exclusiveMinimum (Draft 4's boolean form too), maximum, exclusiveMaximum.
 * INTEGER: fractional bounds round inwards (the integers they admit); else
 * they are refused. */
static int read_bounds(struct conv *c, struct json_object *s, int integer, struct bound *lo,
		       struct bound *hi)
{
	static const char *const keys[4] = { "minimum", "exclusiveMinimum", "maximum",
					     "exclusiveMaximum" };
	int d4_excl_min = is_true(kw(s, "exclusiveMinimum")),
	    d4_excl_max = is_true(kw(s, "exclusiveMaximum"));

	memset(lo, 0, sizeof *lo);
	memset(hi, 0, sizeof *hi);
	for (int i = 0; i < 4; i++) {
		struct json_object *v = kw(s, keys[i]);
		int upper = i >= 2, excl = (i & 1) || (i == 0 && d4_excl_min) ||
					   (i == 2 && d4_excl_max);
		if (!v || json_object_is_type(v, json_type_boolean))
			continue;
		if (!is_number(v))
			return fail(c, -EINVAL, keys[i], "must be a number");
		double d;
		long long iv;
		if (json_object_is_type(v, json_type_int)) {
			int64_t x = json_object_get_int64(v);
			d = (double)x;
			iv = x > INT_LIMIT ? INT_LIMIT + 1 : x < -INT_LIMIT ? -INT_LIMIT - 1 : x;
		} else {
			d = json_object_get_double(v);
			if (!isfinite(d))
				return fail(c, -EINVAL, keys[i], "must be finite");
			double r = integer ? (upper ? floor(d) : ceil(d)) : d;
			if (r != floor(r))
				return fail(c, -ENOTSUP, keys[i],
					    "a bound of a number must be a whole number here "
					    "(only integers get fractional bounds)");
			if (integer && r != d)
				excl = 0; /* rounded inwards: the new bound is admitted */
			iv = r > (double)INT_LIMIT ? INT_LIMIT + 1 :
			     r < -(double)INT_LIMIT ? -INT_LIMIT - 1 : (long long)r;
		}
		/* beyond +-10^18: the permissive side is clamped (fewer values,
		 * all valid), the restrictive one refused */
		if ((!upper && iv > INT_LIMIT) || (upper && iv < -INT_LIMIT))
			return fail(c, -ENOTSUP, keys[i], "%g is beyond the +-10^18 this grammar writes",
				    d);
		if (iv > INT_LIMIT)
			iv = INT_LIMIT, excl = 0;
		if (iv < -INT_LIMIT)
			iv = -INT_LIMIT, excl = 0;
		struct bound *bd = upper ? hi : lo;
		int tighter = !bd->set || (upper ? (iv < bd->v || (iv == bd->v && excl)) :
						   (iv > bd->v || (iv == bd->v && excl)));
		if (tighter)
			*bd = (struct bound){ .set = 1, .excl = excl, .v = iv };
	}
	if (integer) {
		/* integers: exclusive bounds become inclusive ones */
		if (lo->set && lo->excl)
			lo->v++, lo->excl = 0;
		if (hi->set && hi->excl)
			hi->v--, hi->excl = 0;
	}
	return 0;
}

/* Integers in [LO, HI] as alternatives; 0, or -EDOM when there are none. */
static int int_range(struct sbuf *b, const struct bound *lo, const struct bound *hi)
{
	int n = 0;

	if (lo->set && hi->set && lo->v > hi->v)
		return -EDOM;
	/* v >= 0 */
	if (!hi->set || hi->v >= 0) {
		mag_range(b, lo->set && lo->v > 0 ? lo->v : 0, hi->set ? hi->v : -1, 0);
		n++;
	}
	/* v < 0: "-" then its magnitude */
	if (!lo->set || lo->v < 0) {
		long long mlo = hi->set && hi->v < 0 ? -hi->v : 1;
		if (n++)
			sb_puts(b, " | ");
		sb_puts(b, "\"-\" (");
		mag_range(b, mlo, lo->set ? -lo->v : -1, 0);
		sb_putc(b, ')');
	}
	return 0;
}

/* Decimals x >= 0 without exponent with A < x (AEXCL) or A <= x, and x < B
 * (BEXCL) or x <= B (B < 0: no bound), as alternatives; the count written. */
static int decimal_side(struct sbuf *b, long long a, int aexcl, long long bv, int bexcl)
{
	int n = 0;
	long long first = aexcl ? a + 1 : a; /* int parts with any fraction */

	/* integer part in [first, B-1], any fraction */
	if (bv < 0 || first <= bv - 1) {
		mag_range(b, first, bv < 0 ? -1 : bv - 1, 1);
		n++;
	}
	/* A itself, with a fraction that is not zero (in its 15 significant
	 * digits; zeros may follow) */
	int room = 15 - (a ? n_digits(a) : 0);
	if (aexcl && (bv < 0 || a < bv) && room >= 1) {
		if (n++)
			sb_puts(b, " | ");
		sb_printf(b, "\"%lld.\" ", a);
		if (room > 1)
			sb_printf(b, "[0-9]{0,%d} ", room - 1);
		sb_puts(b, "[1-9] [0]{0,15}");
	}
	/* B itself, with zeros after the point at most */
	if (bv >= 0 && !bexcl && (bv > a || (bv == a && !aexcl))) {
		if (n++)
			sb_puts(b, " | ");
		sb_printf(b, "\"%lld\" (\".\" [0]{1,16})?", bv);
	}
	return n;
}

/* Numbers in the bounds, without exponent, as alternatives; -EDOM when none. */
static int number_range(struct sbuf *b, const struct bound *lo, const struct bound *hi)
{
	int n = 0;

	/* v >= 0, written as x = v */
	if (!hi->set || hi->v > 0 || (hi->v == 0 && !hi->excl)) {
		long long a = 0;
		int aexcl = 0;
		if (lo->set && lo->v >= 0)
			a = lo->v, aexcl = lo->excl;
		n += decimal_side(b, a, aexcl, hi->set ? hi->v : -1, hi->set && hi->excl);
	}
	/* v <= 0, written as "-" x with x = -v */
	if (!lo->set || lo->v < 0) {
		long long a = 0, bv = lo->set ? -lo->v : -1;
		int aexcl = 0, bexcl = lo->set && lo->excl;
		if (hi->set && hi->v < 0)
			a = -hi->v, aexcl = hi->excl;
		else if (hi->set && hi->v == 0 && hi->excl)
			aexcl = 1;
		struct sbuf side = { 0 };
		int k = decimal_side(&side, a, aexcl, bv, bexcl);
		if (k) {
			if (n++)
				sb_puts(b, " | ");
			sb_puts(b, "\"-\" (");
			sb_put(b, side.p, side.len);
			sb_putc(b, ')');
		}
		if (side.err && !b->err)
			b->err = side.err;
		sb_free(&side);
	}
	return n ? 0 : -EDOM;
}

/* The rule body of integers (INTEGER) or numbers of S's bounds. */
static char *numeric_body(struct conv *c, struct json_object *s, int integer)
{
	struct bound lo, hi;
	struct json_object *mo = kw(s, "multipleOf");

	if (mo) {
		if (!is_number(mo) || json_object_get_double(mo) <= 0) {
			fail(c, -EINVAL, "multipleOf", "must be a number above 0");
			return NULL;
		}
		if (!integer || json_object_get_double(mo) != 1.0) {
			fail(c, -ENOTSUP, "multipleOf", "only multipleOf 1 on integers is enforced");
			return NULL;
		}
	}
	if (read_bounds(c, s, integer, &lo, &hi) < 0)
		return NULL;
	if (!lo.set && !hi.set) {
		const char *p = prim(c, integer ? "integer" : "number");
		return p ? strdup(p) : NULL;
	}
	struct sbuf b = { 0 };
	if ((integer ? int_range(&b, &lo, &hi) : number_range(&b, &lo, &hi)) == -EDOM) {
		sb_free(&b);
		fail(c, -EINVAL, lo.set ? "minimum" : "maximum", "no %s is within the bounds",
		     integer ? "integer" : "number");
		return NULL;
	}
	return sb_body(c, &b);
}

/* ---- patterns: Python re's regular subset -> GBNF over JSON text ---- */

/* A set of code points: sorted, disjoint, non-adjacent ranges. */
struct cset {
	long (*r)[2];   /* (n, 2) inclusive ranges, malloc'd */
	size_t n;       /* ranges */
	size_t cap;     /* allocated */
	int err;        /* -ENOMEM once an add failed */
};

static void cset_add(struct cset *s, long lo, long hi)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 8;
		long (*r)[2] = realloc(s->r, cap * sizeof *r);
		if (!r) {
			s->err = -ENOMEM;
			return;
		}
		s->r = r;
		s->cap = cap;
	}
	s->r[s->n][0] = lo;
	s->r[s->n][1] = hi;
	s->n++;
}

static int range_cmp(const void *a, const void *b)
{
	const long *x = a, *y = b;

	return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void cset_norm(struct cset *s)
{
	size_t m = 0;

	if (!s->n)
		return;
	qsort(s->r, s->n, sizeof *s->r, range_cmp);
	for (size_t i = 1; i < s->n; i++) {
		if (s->r[i][0] <= s->r[m][1] + 1) {
			if (s->r[i][1] > s->r[m][1])
				s->r[m][1] = s->r[i][1];
		} else {
			m++;
			s->r[m][0] = s->r[i][0];
			s->r[m][1] = s->r[i][1];
		}
	}
	s->n = m + 1;
}

/* S := [0, TOP] minus S (S normalized). */
static void cset_complement(struct cset *s, long top)
{
	struct cset o = { 0 };
	long next = 0;

	for (size_t i = 0; i < s->n && s->r[i][0] <= top; i++) {
		if (s->r[i][0] > next)
			cset_add(&o, next, s->r[i][0] - 1);
		next = s->r[i][1] + 1;
	}
	if (next <= top)
		cset_add(&o, next, top);
	if (s->err && !o.err)
		o.err = s->err;
	free(s->r);
	*s = o;
}

static int cset_has(const struct cset *s, long cp)
{
	for (size_t i = 0; i < s->n; i++)
		if (cp >= s->r[i][0] && cp <= s->r[i][1])
			return 1;
	return 0;
}

/* The ASCII parts of \d \w \s (Python's Unicode classes agree with these on
 * ASCII; outside it we write none of their members, so negations stay sound
 * when taken within ASCII). */
static void cset_add_class(struct cset *s, char cls)
{
	struct cset t = { 0 };
	char lower = (char)(cls | 0x20);

	if (lower == 'd') {
		cset_add(&t, '0', '9');
	} else if (lower == 'w') {
		cset_add(&t, '0', '9');
		cset_add(&t, 'A', 'Z');
		cset_add(&t, '_', '_');
		cset_add(&t, 'a', 'z');
	} else {
		cset_add(&t, 0x09, 0x0D);
		cset_add(&t, 0x1C, 0x20);
	}
	if (cls != lower) {
		cset_norm(&t);
		cset_complement(&t, 0x7F);
	}
	for (size_t i = 0; i < t.n; i++)
		cset_add(s, t.r[i][0], t.r[i][1]);
	if (t.err)
		s->err = t.err;
	free(t.r);
}

struct rx {
	struct conv *c;               /* for rules and failures */
	const unsigned char *start;   /* the pattern */
	const unsigned char *p;       /* next pattern byte */
	const unsigned char *end;     /* end of the pattern */
	const char *name;             /* the string's rule name: sub-rules NAME-1... */
	unsigned nsub;                /* sub-rules made so far */
	unsigned depth;               /* groups open */
};

/* A translated piece of pattern. */
enum { RX_EMPTY, RX_LIT, RX_ATOM, RX_QUANT, RX_SEQ };

struct rxf {
	struct sbuf t; /* RX_LIT: inside of a GBNF literal; else GBNF */
	int kind;      /* RX_*: EMPTY matches "", ATOM is one GBNF primary (a
	                  quantifier may follow), QUANT one with a quantifier,
	                  SEQ several */
	size_t min;    /* code points it matches at least */
	size_t max;    /* at most, UNBOUNDED */
};

static size_t sat_add(size_t a, size_t b)
{
	return a == UNBOUNDED || b == UNBOUNDED || a > UNBOUNDED - b ? UNBOUNDED : a + b;
}

static size_t sat_mul(size_t a, size_t b)
{
	if (a == 0 || b == 0)
		return 0;
	return a == UNBOUNDED || b == UNBOUNDED || a > UNBOUNDED / b ? UNBOUNDED : a * b;
}

static int rx_fail(struct rx *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rx_fail(struct rx *x, int code, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return fail(x->c, code, "pattern", "%s (at offset %zu)", msg, (size_t)(x->p - x->start));
}

/* The code point CP as the inside of a GBNF literal of JSON string text. */
static void put_json_cp(struct sbuf *b, long cp)
{
	static const char named[] = { '\b', 'b', '\f', 'f', '\n', 'n', '\r', 'r', '\t', 't' };

	if (cp == '"') {
		sb_puts(b, "\\\\\\\"");
		return;
	}
	if (cp == '\\') {
		sb_puts(b, "\\\\\\\\");
		return;
	}
	if (cp < 0x20) {
		for (size_t i = 0; i < sizeof named; i += 2)
			if (cp == named[i]) {
				sb_puts(b, "\\\\");
				sb_putc(b, named[i + 1]);
				return;
			}
		sb_printf(b, "\\\\u%04x", (unsigned)cp);
		return;
	}
	put_lit_cp(b, cp);
}

/* The set S as one GBNF primary matching the JSON text of each member: raw
 * where JSON allows, escaped for " and \, the named escapes of tab, newline
 * and carriage return, all other control characters only when S has them
 * all.  -ENOTSUP when that leaves nothing. */
static int put_cset(struct rx *x, struct rxf *f, struct cset *s)
{
	struct sbuf alts = { 0 };
	struct cset raw = { 0 };
	int n = 0;

	for (size_t i = 0; i < s->n; i++)
		cset_add(&raw, s->r[i][0], s->r[i][1]);
	/* raw = S minus controls, '"', '\' */
	cset_norm(&raw);
	{
		struct cset bad = { 0 };
		cset_add(&bad, 0, 0x1F);
		cset_add(&bad, '"', '"');
		cset_add(&bad, '\\', '\\');
		cset_complement(&bad, 0x10FFFF); /* allowed */
		struct cset both = { 0 };
		for (size_t i = 0, j = 0; i < raw.n && j < bad.n;) {
			long lo = raw.r[i][0] > bad.r[j][0] ? raw.r[i][0] : bad.r[j][0];
			long hi = raw.r[i][1] < bad.r[j][1] ? raw.r[i][1] : bad.r[j][1];
			if (lo <= hi)
				cset_add(&both, lo, hi);
			if (raw.r[i][1] < bad.r[j][1])
				i++;
			else
				j++;
		}
		if (bad.err || raw.err)
			both.err = -ENOMEM;
		free(bad.r);
		free(raw.r);
		raw = both;
	}
	if (raw.n) {
		/* the shorter of [...] and [^...] */
		struct cset neg = { 0 };
		for (size_t i = 0; i < raw.n; i++)
			cset_add(&neg, raw.r[i][0], raw.r[i][1]);
		cset_complement(&neg, 0x10FFFF);
		int use_neg = neg.n < raw.n;
		struct cset *w = use_neg ? &neg : &raw;
		sb_puts(&alts, use_neg ? "[^" : "[");
		for (size_t i = 0; i < w->n; i++) {
			put_cls_cp(&alts, w->r[i][0]);
			if (w->r[i][1] > w->r[i][0]) {
				if (w->r[i][1] > w->r[i][0] + 1)
					sb_putc(&alts, '-');
				put_cls_cp(&alts, w->r[i][1]);
			}
		}
		sb_putc(&alts, ']');
		n++;
		if (neg.err)
			raw.err = neg.err;
		free(neg.r);
	}
	if (cset_has(s, '"'))
		sb_puts(&alts, n++ ? " | \"\\\\\\\"\"" : "\"\\\\\\\"\"");
	if (cset_has(s, '\\'))
		sb_puts(&alts, n++ ? " | \"\\\\\\\\\"" : "\"\\\\\\\\\"");
	int all_ctl = 1;
	for (long cp = 0; cp < 0x20 && all_ctl; cp++)
		all_ctl = cset_has(s, cp);
	if (all_ctl) {
		sb_puts(&alts, n++ ? " | " : "");
		sb_puts(&alts, "\"\\\\u00\" [01] [0-9a-fA-F]");
	} else {
		static const char ctl[] = { '\t', 't', '\n', 'n', '\r', 'r' };
		for (size_t i = 0; i < sizeof ctl; i += 2)
			if (cset_has(s, ctl[i])) {
				sb_puts(&alts, n++ ? " | " : "");
				sb_printf(&alts, "\"\\\\%c\"", ctl[i + 1]);
			}
	}
	int err = raw.err || s->err ? -ENOMEM : 0;
	free(raw.r);
	if (err) {
		sb_free(&alts);
		return fail(x->c, -ENOMEM, "pattern", "out of memory");
	}
	if (!n) {
		sb_free(&alts);
		return fail(x->c, -ENOTSUP, "pattern",
			    "a character class of control characters only is not supported");
	}
	f->kind = RX_ATOM;
	f->min = f->max = 1;
	if (n > 1) {
		sb_putc(&f->t, '(');
		sb_put(&f->t, alts.p, alts.len);
		sb_putc(&f->t, ')');
	} else {
		sb_put(&f->t, alts.p, alts.len);
	}
	if (alts.err)
		f->t.err = alts.err;
	sb_free(&alts);
	return 0;
}

static int hexval(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* An escape after the backslash at x->p: a character (returned, >= 0), a
 * class (-2, *CLS = d w s D W S), or a failure (< -2 never; the failure is
 * recorded and -1 returned).  IN_CLASS: \b is a backspace. */
static long rx_escape(struct rx *x, int in_class, char *cls)
{
	if (x->p >= x->end)
		return rx_fail(x, -EINVAL, "a trailing backslash"), -1;
	unsigned char ch = *x->p++;
	switch (ch) {
	case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
		*cls = (char)ch;
		return -2;
	case 'n': return '\n';
	case 't': return '\t';
	case 'r': return '\r';
	case 'f': return '\f';
	case 'v': return '\v';
	case 'a': return '\a';
	case 'b':
		if (in_class)
			return '\b';
		rx_fail(x, -ENOTSUP, "the word boundary \\b is a lookaround and is not supported");
		return -1;
	case 'B': case 'A': case 'Z': case 'z': case 'G':
		rx_fail(x, -ENOTSUP, "the assertion \\%c is not supported here", ch);
		return -1;
	case '0': {
		long v = 0;
		for (int i = 0; i < 2 && x->p < x->end && *x->p >= '0' && *x->p <= '7'; i++)
			v = v * 8 + (*x->p++ - '0');
		return v;
	}
	case 'x': case 'u': case 'U': {
		int n = ch == 'x' ? 2 : ch == 'u' ? 4 : 8;
		long v = 0;
		for (int i = 0; i < n; i++) {
			int h = x->p < x->end ? hexval(*x->p) : -1;
			if (h < 0) {
				rx_fail(x, -EINVAL, "a bad \\%c escape", ch);
				return -1;
			}
			v = v * 16 + h;
			x->p++;
		}
		if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
			rx_fail(x, -EINVAL, "\\%c escape out of range", ch);
			return -1;
		}
		return v;
	}
	default:
		if (ch >= '1' && ch <= '9') {
			rx_fail(x, -ENOTSUP, "backreferences (\\%c) are not regular and not supported", ch);
			return -1;
		}
		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
			rx_fail(x, ch == 'N' || ch == 'p' || ch == 'P' || ch == 'k' ? -ENOTSUP : -EINVAL,
				"the escape \\%c is not supported", ch);
			return -1;
		}
		if (ch >= 0x80) {
			/* an escaped non-ASCII character is itself */
			x->p--;
			long cp = utf8_next(&x->p, x->end);
			if (cp < 0)
				rx_fail(x, -EINVAL, "not UTF-8");
			return cp;
		}
		return ch;
	}
}

/* [...] at x->p (after the '['). */
static int rx_class(struct rx *x, struct rxf *f)
{
	struct cset s = { 0 };
	int neg = 0, shorthand = 0, first = 1;

	if (x->p < x->end && *x->p == '^')
		neg = 1, x->p++;
	for (;;) {
		if (x->p >= x->end) {
			free(s.r);
			return rx_fail(x, -EINVAL, "an unterminated character class");
		}
		if (*x->p == ']' && !first) {
			x->p++;
			break;
		}
		first = 0;
		long lo, hi;
		char cls = 0;
		if (*x->p == '\\') {
			x->p++;
			lo = rx_escape(x, 1, &cls);
		} else {
			lo = utf8_next(&x->p, x->end);
			if (lo < 0)
				rx_fail(x, -EINVAL, "not UTF-8");
		}
		if (lo == -1) {
			free(s.r);
			return x->c->rc;
		}
		if (lo == -2) {
			cset_add_class(&s, cls);
			shorthand = 1;
			continue;
		}
		hi = lo;
		if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
			x->p++;
			if (*x->p == '\\') {
				x->p++;
				hi = rx_escape(x, 1, &cls);
				if (hi == -2) {
					free(s.r);
					return rx_fail(x, -EINVAL, "a bad character range");
				}
			} else {
				hi = utf8_next(&x->p, x->end);
				if (hi < 0)
					rx_fail(x, -EINVAL, "not UTF-8");
			}
			if (hi == -1) {
				free(s.r);
				return x->c->rc;
			}
			if (hi < lo) {
				free(s.r);
				return rx_fail(x, -EINVAL, "a bad character range");
			}
		}
		cset_add(&s, lo, hi);
	}
	cset_norm(&s);
	if (neg)
		cset_complement(&s, shorthand ? 0x7F : 0x10FFFF);
	int rc = put_cset(x, f, &s);
	free(s.r);
	return rc;
}

static int rx_alt(struct rx *x, int top, struct rxf *out);

/* A quantifier at x->p: 1 with *MIN, *MAX read, 0 when there is none (a '{'
 * that does not start one is a literal, as in Python). */
static int rx_quant(struct rx *x, size_t *min, size_t *max)
{
	if (x->p >= x->end)
		return 0;
	switch (*x->p) {
	case '*': x->p++; *min = 0; *max = UNBOUNDED; return 1;
	case '+': x->p++; *min = 1; *max = UNBOUNDED; return 1;
	case '?': x->p++; *min = 0; *max = 1; return 1;
	case '{': break;
	default: return 0;
	}
	const unsigned char *q = x->p + 1;
	size_t a = 0, b = 0;
	int da = 0, db = 0, comma = 0;
	while (q < x->end && *q >= '0' && *q <= '9' && da < 9)
		a = a * 10 + (size_t)(*q++ - '0'), da++;
	if (q < x->end && *q == ',') {
		comma = 1;
		q++;
		while (q < x->end && *q >= '0' && *q <= '9' && db < 9)
			b = b * 10 + (size_t)(*q++ - '0'), db++;
	}
	if (q >= x->end || *q != '}' || (!da && !db))
		return 0;
	x->p = q + 1;
	*min = a;
	*max = !comma ? a : db ? b : UNBOUNDED;
	return 1;
}

/* Applies {MIN,MAX} to F in place. */
static int rx_repeat(struct rx *x, struct rxf *f, size_t min, size_t max)
{
	if (max != UNBOUNDED && min > max)
		return rx_fail(x, -EINVAL, "a bad repeat range {%zu,%zu}", min, max);
	if (min > JSCHEMA_MAX_REPEAT)
		return rx_fail(x, -E2BIG, "a repeat of %zu is more than the %u this grammar allows", min,
			       JSCHEMA_MAX_REPEAT);
	if (max != UNBOUNDED && max > JSCHEMA_MAX_REPEAT)
		max = JSCHEMA_MAX_REPEAT;
	if (f->kind == RX_EMPTY)
		return 0;
	if (max == 0) {
		/* {0}: nothing */
		sb_free(&f->t);
		f->kind = RX_EMPTY;
		f->min = f->max = 0;
		return 0;
	}
	struct sbuf t = { 0 };
	int counted = min > 1 || (max != UNBOUNDED && max > 1);
	if (f->kind == RX_LIT) {
		/* one character of the pattern, maybe several of JSON text */
		int one = f->t.len == 1;
		sb_puts(&t, one ? "\"" : "(\"");
		sb_put(&t, f->t.p, f->t.len);
		sb_puts(&t, one ? "\"" : "\")");
	} else if (f->kind == RX_ATOM && (f->t.p[0] == '[' || is_ident(f->t.p) || !counted)) {
		sb_put(&t, f->t.p, f->t.len);
	} else if (!counted) {
		sb_putc(&t, '(');
		sb_put(&t, f->t.p, f->t.len);
		sb_putc(&t, ')');
	} else {
		/* a counted group gets its own rule, so that the grammar's
		 * parser does not copy it out MIN..MAX times */
		char nm[NAME_CAP];
		snprintf(nm, sizeof nm, "%s-%u", x->name, ++x->nsub);
		char *body = sb_body(x->c, &f->t);
		const char *r = add_rule(x->c, nm, body);
		if (!r)
			return x->c->rc;
		sb_puts(&t, r);
	}
	put_repeat(&t, min, max);
	sb_free(&f->t);
	f->t = t;
	f->kind = RX_QUANT;
	f->min = sat_mul(f->min, min);
	f->max = max == UNBOUNDED && f->max ? UNBOUNDED : sat_mul(f->max, max);
	return sb_check(x->c, &f->t);
}

/* One atom at x->p. */
static int rx_atom(struct rx *x, struct rxf *f)
{
	unsigned char ch = *x->p;

	memset(f, 0, sizeof *f);
	switch (ch) {
	case '(': {
		x->p++;
		if (x->p < x->end && *x->p == '?') {
			if (x->end - x->p >= 2 && x->p[1] == ':') {
				x->p += 2;
			} else if (x->end - x->p >= 3 && (x->p[1] == 'P' || x->p[1] == '<') &&
				   (x->p[1] == 'P' ? x->p[2] == '<' : x->p[2] != '=' && x->p[2] != '!')) {
				/* a named group: a group */
				const unsigned char *q = memchr(x->p, '>', (size_t)(x->end - x->p));
				if (!q)
					return rx_fail(x, -EINVAL, "an unterminated group name");
				x->p = q + 1;
			} else {
				return rx_fail(x, -ENOTSUP,
					       "(?%c...: lookaround, flags, conditionals and "
					       "backreferences are not supported",
					       x->p + 1 < x->end ? x->p[1] : '?');
			}
		}
		if (++x->depth > MAX_GROUPS)
			return rx_fail(x, -E2BIG, "groups nested deeper than %u", MAX_GROUPS);
		struct rxf in;
		int rc = rx_alt(x, 0, &in);
		x->depth--;
		if (rc < 0) {
			sb_free(&in.t);
			return rc;
		}
		if (x->p >= x->end || *x->p != ')') {
			sb_free(&in.t);
			return rx_fail(x, -EINVAL, "missing )");
		}
		x->p++;
		f->min = in.min;
		f->max = in.max;
		if (in.kind == RX_EMPTY) {
			f->kind = RX_EMPTY;
			sb_free(&in.t);
			return 0;
		}
		f->kind = RX_ATOM;
		if (in.kind == RX_ATOM) {
			f->t = in.t;
			return sb_check(x->c, &f->t);
		}
		sb_putc(&f->t, '(');
		sb_put(&f->t, in.t.p, in.t.len);
		sb_putc(&f->t, ')');
		sb_free(&in.t);
		return sb_check(x->c, &f->t);
	}
	case '[':
		x->p++;
		return rx_class(x, f);
	case '.': {
		x->p++;
		const char *d = prim(x->c, "dot");
		if (!d)
			return x->c->rc;
		sb_puts(&f->t, d);
		f->kind = RX_ATOM;
		f->min = f->max = 1;
		return sb_check(x->c, &f->t);
	}
	case '^': case '$':
		return rx_fail(x, -ENOTSUP, "the anchor %c is supported only at the ends of the pattern",
			       ch);
	case '*': case '+': case '?':
		return rx_fail(x, -EINVAL, "nothing to repeat");
	case '\\': {
		char cls = 0;
		x->p++;
		long cp = rx_escape(x, 0, &cls);
		if (cp == -1)
			return x->c->rc;
		if (cp == -2) {
			struct cset s = { 0 };
			cset_add_class(&s, cls);
			cset_norm(&s);
			int rc = put_cset(x, f, &s);
			free(s.r);
			return rc;
		}
		put_json_cp(&f->t, cp);
		f->kind = RX_LIT;
		f->min = f->max = 1;
		return sb_check(x->c, &f->t);
	}
	default: {
		if (ch == '{') {
			size_t a, b;
			const unsigned char *save = x->p;
			if (rx_quant(x, &a, &b)) {
				x->p = save;
				return rx_fail(x, -EINVAL, "nothing to repeat");
			}
		}
		long cp = utf8_next(&x->p, x->end);
		if (cp < 0)
			return rx_fail(x, -EINVAL, "not UTF-8");
		put_json_cp(&f->t, cp);
		f->kind = RX_LIT;
		f->min = f->max = 1;
		return sb_check(x->c, &f->t);
	}
	}
}

/* Appends the pending literal LIT to SEQ as one quoted item. */
static void seq_flush(struct sbuf *seq, struct sbuf *lit, int *items, int *last_kind)
{
	if (!lit->len)
		return;
	if (seq->len)
		sb_putc(seq, ' ');
	sb_putc(seq, '"');
	sb_put(seq, lit->p, lit->len);
	sb_putc(seq, '"');
	lit->len = 0;
	(*items)++;
	*last_kind = RX_ATOM;
	if (seq->err == 0 && lit->err)
		seq->err = lit->err;
}

/* Whether x->p is at an end anchor ($ or \Z) that ends a top-level
 * alternative; its length in bytes, or 0. */
static int rx_end_anchor(const struct rx *x)
{
	const unsigned char *p = x->p;
	int n = 0;

	if (*p == '$')
		n = 1;
	else if (x->end - p >= 2 && p[0] == '\\' && p[1] == 'Z')
		n = 2;
	if (n && (p + n == x->end || p[n] == '|'))
		return n;
	return 0;
}

/* A sequence up to '|', ')' or the end.  TOP: the pattern's own level,
 * where ^ and $ (and \A, \Z) may stand at either end; without them the
 * match floats, as re.search's does: any text before or after. */
static int rx_seq(struct rx *x, int top, struct rxf *out)
{
	struct sbuf seq = { 0 }, lit = { 0 };
	int items = 0, last_kind = RX_EMPTY, start = !top, end = !top, rc = 0;

	memset(out, 0, sizeof *out);
	if (top && x->p < x->end && *x->p == '^')
		x->p++, start = 1;
	else if (top && x->end - x->p >= 2 && x->p[0] == '\\' && x->p[1] == 'A')
		x->p += 2, start = 1;
	while (x->p < x->end && *x->p != '|' && *x->p != ')') {
		int an = top ? rx_end_anchor(x) : 0;
		if (an) {
			x->p += an;
			end = 1;
			break;
		}
		struct rxf f;
		rc = rx_atom(x, &f);
		if (rc < 0) {
			sb_free(&f.t);
			break;
		}
		size_t qmin, qmax;
		if (rx_quant(x, &qmin, &qmax)) {
			if (x->p < x->end && *x->p == '?') {
				x->p++; /* lazy: the same language */
			} else if (x->p < x->end && *x->p == '+') {
				sb_free(&f.t);
				rc = rx_fail(x, -ENOTSUP, "possessive quantifiers are not supported");
				break;
			}
			size_t a, b;
			const unsigned char *save = x->p;
			if (rx_quant(x, &a, &b)) {
				x->p = save;
				sb_free(&f.t);
				rc = rx_fail(x, -EINVAL, "multiple repeat");
				break;
			}
			rc = rx_repeat(x, &f, qmin, qmax);
			if (rc < 0) {
				sb_free(&f.t);
				break;
			}
		}
		out->min = sat_add(out->min, f.min);
		out->max = sat_add(out->max, f.max);
		if (f.kind == RX_LIT) {
			sb_put(&lit, f.t.p, f.t.len);
		} else if (f.kind != RX_EMPTY) {
			seq_flush(&seq, &lit, &items, &last_kind);
			if (seq.len)
				sb_putc(&seq, ' ');
			sb_put(&seq, f.t.p, f.t.len);
			items++;
			last_kind = f.kind;
		}
		sb_free(&f.t);
	}
	seq_flush(&seq, &lit, &items, &last_kind);
	sb_free(&lit);
	if (rc < 0) {
		sb_free(&seq);
		return rc;
	}
	if (!start || !end) {
		if (!prim(x->c, "char")) {
			sb_free(&seq);
			return x->c->rc;
		}
		struct sbuf w = { 0 };
		if (!seq.len) {
			sb_puts(&w, "char*");
		} else {
			if (!start)
				sb_puts(&w, "char* ");
			sb_put(&w, seq.p, seq.len);
			if (!end)
				sb_puts(&w, " char*");
		}
		items = 2;
		out->max = UNBOUNDED;
		sb_free(&seq);
		seq = w;
	}
	out->t = seq;
	out->kind = items == 0 ? RX_EMPTY : items == 1 ? last_kind : RX_SEQ;
	return sb_check(x->c, &out->t);
}

/* Alternatives up to ')' or the end. */
static int rx_alt(struct rx *x, int top, struct rxf *out)
{
	struct sbuf t = { 0 };
	int n = 0, any_empty = 0, rc = 0, kind = RX_EMPTY;
	size_t min = UNBOUNDED, max = 0;

	memset(out, 0, sizeof *out);
	for (;;) {
		struct rxf f;
		rc = rx_seq(x, top, &f);
		if (rc < 0) {
			sb_free(&f.t);
			break;
		}
		if (f.min < min)
			min = f.min;
		if (f.max > max)
			max = f.max;
		if (f.kind == RX_EMPTY) {
			any_empty = 1;
		} else {
			if (n++)
				sb_puts(&t, " | ");
			sb_put(&t, f.t.p, f.t.len);
			kind = f.kind;
		}
		sb_free(&f.t);
		if (x->p >= x->end || *x->p != '|')
			break;
		x->p++;
	}
	if (rc < 0) {
		sb_free(&t);
		return rc;
	}
	out->min = any_empty ? 0 : min;
	out->max = max;
	if (n == 0) {
		sb_free(&t);
		out->kind = RX_EMPTY;
		return 0;
	}
	if (n == 1 && !any_empty) {
		out->t = t;
		out->kind = kind;
		return sb_check(x->c, &out->t);
	}
	sb_putc(&out->t, '(');
	sb_put(&out->t, t.p, t.len);
	sb_putc(&out->t, ')');
	if (any_empty)
		sb_putc(&out->t, '?');
	if (t.err)
		out->t.err = t.err;
	sb_free(&t);
	out->kind = any_empty ? RX_QUANT : RX_ATOM;
	return sb_check(x->c, &out->t);
}

/* The body of a JSON string whose content matches PATTERN (re.search), and
 * the code points it may have. */
static char *pattern_body(struct conv *c, const char *pattern, size_t len, const char *name,
			  size_t *min_len, size_t *max_len)
{
	struct rx x = { .c = c, .start = (const unsigned char *)pattern,
			.p = (const unsigned char *)pattern,
			.end = (const unsigned char *)pattern + len, .name = name };
	struct rxf f;

	if (rx_alt(&x, 1, &f) < 0) {
		sb_free(&f.t);
		return NULL;
	}
	if (x.p < x.end) {
		sb_free(&f.t);
		rx_fail(&x, -EINVAL, "unbalanced parenthesis");
		return NULL;
	}
	struct sbuf b = { 0 };
	sb_puts(&b, "\"\\\"\" ");
	if (f.kind == RX_LIT) {
		sb_putc(&b, '"');
		sb_put(&b, f.t.p, f.t.len);
		sb_putc(&b, '"');
	} else if (f.kind != RX_EMPTY) {
		sb_putc(&b, '(');
		sb_put(&b, f.t.p, f.t.len);
		sb_putc(&b, ')');
	}
	sb_puts(&b, f.kind == RX_EMPTY ? "\"\\\"\"" : " \"\\\"\"");
	if (f.t.err && !b.err)
		b.err = f.t.err;
	sb_free(&f.t);
	*min_len = f.min;
	*max_len = f.max;
	return sb_body(c, &b);
}

/* ---- strings ---- */

static char *string_body(struct conv *c, struct json_object *s, const char *name)
{
	size_t min = 0, max = UNBOUNDED;
	int has_min, has_max;
	struct json_object *fmt = kw(s, "format"), *pat = kw(s, "pattern");
	const char *rule = NULL;
	size_t lo = 0, hi = UNBOUNDED;
	char *body = NULL;

	if ((has_min = get_count(c, s, "minLength", &min)) < 0 ||
	    (has_max = get_count(c, s, "maxLength", &max)) < 0)
		return NULL;
	if (has_max && min > max) {
		fail(c, -EINVAL, "minLength", "is above maxLength: no string satisfies both");
		return NULL;
	}
	if (fmt && !json_object_is_type(fmt, json_type_string)) {
		fail(c, -EINVAL, "format", "must be a string");
		return NULL;
	}
	if (fmt) {
		for (size_t i = 0; i < sizeof formats / sizeof formats[0] && !rule; i++)
			if (strcmp(formats[i].format, json_object_get_string(fmt)) == 0) {
				rule = formats[i].rule;
				lo = formats[i].min_len;
				hi = formats[i].max_len;
			}
		if (!rule && (c->flags & JSCHEMA_FORMAT_ASSERT)) {
			fail(c, -ENOTSUP, "format", "\"%s\" cannot be enforced (date, time, date-time, "
			     "uuid, ipv4 and email can)", json_object_get_string(fmt));
			return NULL;
		}
	}
	if (pat) {
		if (!json_object_is_type(pat, json_type_string)) {
			fail(c, -EINVAL, "pattern", "must be a string");
			return NULL;
		}
		if (rule) {
			fail(c, -ENOTSUP, "pattern", "cannot be enforced beside format \"%s\"",
			     json_object_get_string(fmt));
			return NULL;
		}
		char nm[NAME_CAP];
		snprintf(nm, sizeof nm, "%s", *name ? name : "root");
		size_t pp = path_push(c, "pattern");
		body = pattern_body(c, json_object_get_string(pat),
				    (size_t)json_object_get_string_len(pat), nm, &lo, &hi);
		path_pop(c, pp);
		if (!body)
			return NULL;
	} else if (rule) {
		if (!prim(c, rule))
			return NULL;
		body = strdup(rule);
		if (!body) {
			fail(c, -ENOMEM, "schema", "out of memory");
			return NULL;
		}
	}
	if (body) {
		/* the lengths must follow from the pattern or format alone */
		if ((has_min && lo < min) || (has_max && (hi == UNBOUNDED || hi > max))) {
			free(body);
			fail(c, -ENOTSUP, has_min && lo < min ? "minLength" : "maxLength",
			     "cannot be enforced beside %s: its strings may be %s", pat ? "pattern" : "format",
			     has_min && lo < min ? "shorter" : "longer");
			return NULL;
		}
		return body;
	}
	if (!has_min && !has_max) {
		const char *p = prim(c, "string");
		return p ? strdup(p) : NULL;
	}
	if (clamp_counts(c, "minLength", &min, &max) < 0 || !prim(c, "char"))
		return NULL;
	struct sbuf b = { 0 };
	sb_puts(&b, "\"\\\"\" ");
	if (max != 0) {
		sb_puts(&b, "char");
		put_repeat(&b, min, max);
		sb_putc(&b, ' ');
	}
	sb_puts(&b, "\"\\\"\"");
	return sb_body(c, &b);
}

/* ---- enum and const ---- */

static size_t utf8_len(const char *s, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xC0) != 0x80;
	return k;
}

/* Whether V, a member of S's enum or its const, satisfies S's other
 * keywords that a value can be checked against here; -ENOTSUP (recorded)
 * for a keyword beside enum/const that cannot be checked. */
static int enum_value_ok(struct conv *c, struct json_object *s, struct json_object *v,
			 unsigned mask)
{
	static const char *const unchecked[] = { "pattern", "properties", "required",
		"additionalProperties", "items", "prefixItems", "additionalItems", "minItems",
		"maxItems", "minProperties", "maxProperties", "multipleOf" };

	for (size_t i = 0; i < sizeof unchecked / sizeof unchecked[0]; i++)
		if (has(s, unchecked[i]))
			return fail(c, -ENOTSUP, unchecked[i], "cannot be enforced beside enum or const");
	if (has(s, "format")) {
		for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
			if (strcmp(formats[i].format, json_object_get_string(kw(s, "format"))) == 0)
				return fail(c, -ENOTSUP, "format", "cannot be enforced beside enum or const");
	}
	unsigned t = value_type(v);
	if (!(t & mask))
		return 0;
	if (t == T_STR) {
		size_t min = 0, max = UNBOUNDED;
		if (get_count(c, s, "minLength", &min) < 0 || get_count(c, s, "maxLength", &max) < 0)
			return c->rc;
		size_t n = utf8_len(json_object_get_string(v), (size_t)json_object_get_string_len(v));
		return n >= min && (max == UNBOUNDED || n <= max);
	}
	if (t & T_NUM) {
		double d = json_object_get_double(v);
		static const char *const keys[4] = { "minimum", "exclusiveMinimum", "maximum",
						     "exclusiveMaximum" };
		for (int i = 0; i < 4; i++) {
			struct json_object *b = kw(s, keys[i]);
			if (!b || !is_number(b))
				continue;
			double x = json_object_get_double(b);
			int excl = i & 1;
			if (!excl && is_true(kw(s, keys[i + 1])))
				excl = 1; /* Draft 4 */
			if (i < 2 ? (excl ? !(d > x) : !(d >= x)) : (excl ? !(d < x) : !(d <= x)))
				return 0;
		}
	}
	return 1;
}

/* V as GBNF: its JSON text, with `space` between the tokens of arrays and
 * objects as everywhere else.  0, 1 when it used `space`, or -E2BIG (too
 * deep), -EINVAL (not UTF-8). */
static int put_value(struct sbuf *b, struct json_object *v, unsigned depth)
{
	int rc, first = 1;

	if (depth > JSCHEMA_MAX_DEPTH)
		return -E2BIG;
	if (json_object_is_type(v, json_type_array)) {
		sb_puts(b, "\"[\" space ");
		for (size_t i = 0; i < json_object_array_length(v); i++) {
			if (i)
				sb_puts(b, " space \",\" space ");
			if ((rc = put_value(b, json_object_array_get_idx(v, i), depth + 1)) < 0)
				return rc;
			sb_puts(b, i + 1 == json_object_array_length(v) ? " space " : "");
		}
		sb_puts(b, "\"]\"");
		return 1;
	}
	if (json_object_is_type(v, json_type_object)) {
		sb_puts(b, "\"{\" space ");
		json_object_object_foreach(v, k, val) {
			struct sbuf key = { 0 };
			if (!first)
				sb_puts(b, " space \",\" space ");
			first = 0;
			json_put_string(&key, k, strlen(k));
			rc = key.err ? key.err : put_literal(b, key.p, key.len);
			sb_free(&key);
			if (rc < 0)
				return rc == -ENOMEM ? -ENOMEM : -EINVAL;
			sb_puts(b, " space \":\" space ");
			if ((rc = put_value(b, val, depth + 1)) < 0)
				return rc;
		}
		sb_puts(b, first ? "\"}\"" : " space \"}\"");
		return 1;
	}
	struct sbuf text = { 0 };
	rc = json_put(&text, v, depth);
	if (rc == 0)
		rc = text.err ? text.err : put_literal(b, text.p, text.len);
	sb_free(&text);
	return rc < 0 ? rc : 0;
}

static char *enum_body(struct conv *c, struct json_object *s, unsigned mask)
{
	/* (json-c's null is NULL: "const": null is there all the same) */
	struct json_object *cst = kw(s, "const"), *en = kw(s, "enum");
	int hc = has(s, "const");
	struct sbuf b = { 0 };
	int n = 0;

	if (has(s, "enum") && (!json_object_is_type(en, json_type_array) ||
			       !json_object_array_length(en))) {
		fail(c, -EINVAL, "enum", "must be a non-empty array");
		return NULL;
	}
	size_t count = hc ? 1 : json_object_array_length(en);
	if (count > MAX_ENUM) {
		fail(c, -E2BIG, "enum", "more than %u values", MAX_ENUM);
		return NULL;
	}
	for (size_t i = 0; i < count; i++) {
		struct json_object *v = hc ? cst : json_object_array_get_idx(en, i);
		if (hc && en) {
			int found = 0;
			for (size_t j = 0; j < json_object_array_length(en) && !found; j++)
				found = json_equal(v, json_object_array_get_idx(en, j), 0);
			if (!found)
				continue;
		}
		int ok = enum_value_ok(c, s, v, mask);
		if (ok < 0) {
			sb_free(&b);
			return NULL;
		}
		int dup = 0;
		for (size_t j = 0; j < i && !dup && !hc; j++)
			dup = json_equal(v, json_object_array_get_idx(en, j), 0);
		if (!ok || dup)
			continue;
		if (n++)
			sb_puts(&b, " | ");
		int rc = put_value(&b, v, 0);
		if (rc == 1 && !prim(c, "space")) {
			sb_free(&b);
			return NULL;
		}
		if (rc < 0) {
			sb_free(&b);
			fail(c, rc == -E2BIG ? -E2BIG : -EINVAL, hc ? "const" : "enum",
			     rc == -E2BIG ? "a value nested too deeply" : "a value that is not UTF-8");
			return NULL;
		}
	}
	if (!n) {
		sb_free(&b);
		fail(c, -EINVAL, hc ? "const" : "enum", "no value satisfies the schema's other keywords");
		return NULL;
	}
	return sb_body(c, &b);
}

/* ---- $ref ---- */

/* The node a local reference names, or NULL. */
static struct json_object *resolve_pointer(struct conv *c, const char *ref)
{
	struct json_object *node = c->root;
	const char *p = ref + 1;

	if (*p && *p != '/')
		return NULL;
	while (*p == '/') {
		char seg[256];
		size_t n = 0;
		p++;
		while (*p && *p != '/') {
			char ch = *p++;
			if (ch == '~' && (*p == '0' || *p == '1'))
				ch = *p++ == '0' ? '~' : '/';
			else if (ch == '%' && hexval(p[0]) >= 0 && hexval(p[1]) >= 0)
				ch = (char)(hexval(p[0]) * 16 + hexval(p[1])), p += 2;
			if (n + 1 >= sizeof seg)
				return NULL;
			seg[n++] = ch;
		}
		seg[n] = '\0';
		if (json_object_is_type(node, json_type_object)) {
			if (!json_object_object_get_ex(node, seg, &node))
				return NULL;
		} else if (json_object_is_type(node, json_type_array)) {
			char *e;
			unsigned long i = strtoul(seg, &e, 10);
			if (!n || *e || i >= json_object_array_length(node))
				return NULL;
			node = json_object_array_get_idx(node, i);
		} else {
			return NULL;
		}
	}
	return node;
}

/* Checks REF's shape and resolves it; NULL with the failure recorded. */
static struct json_object *ref_target(struct conv *c, struct json_object *refv)
{
	if (!json_object_is_type(refv, json_type_string)) {
		fail(c, -EINVAL, "$ref", "must be a string");
		return NULL;
	}
	const char *ref = json_object_get_string(refv);
	if (ref[0] != '#') {
		fail(c, -ENOTSUP, "$ref", "%s: only references inside the document (#/...) are supported",
		     ref);
		return NULL;
	}
	struct json_object *t = resolve_pointer(c, ref);
	if (!t)
		fail(c, ref[1] && ref[1] != '/' ? -ENOTSUP : -EINVAL, "$ref", "cannot resolve %s", ref);
	return t;
}

/* The name of the rule of $ref REFV (as a malloc'd body). */
static char *ref_body(struct conv *c, struct json_object *refv)
{
	struct json_object *target = ref_target(c, refv);
	const char *ref = json_object_get_string(refv);

	if (!target)
		return NULL;
	for (size_t i = 0; i < c->n_refs; i++) {
		struct ref_entry *e = &c->refs[i];
		if (strcmp(e->ref, ref) != 0)
			continue;
		if (e->level == c->level) {
			fail(c, -EINVAL, "$ref", "%s refers back to itself through no object or array "
			     "(a left-recursive grammar)", ref);
			return NULL;
		}
		char *r = strdup(e->rule);
		if (!r)
			fail(c, -ENOMEM, "schema", "out of memory");
		return r;
	}
	char nm[NAME_CAP];
	snprintf(nm, sizeof nm, "ref%s", ref + 1);
	const char *rule = reserve_rule(c, nm);
	if (!rule)
		return NULL;
	if (c->n_refs == c->cap_refs) {
		size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
		struct ref_entry *e = realloc(c->refs, cap * sizeof *e);
		if (!e) {
			fail(c, -ENOMEM, "schema", "out of memory");
			return NULL;
		}
		c->refs = e;
		c->cap_refs = cap;
	}
	char *dup = strdup(ref);
	if (!dup) {
		fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	size_t idx = c->n_refs++;
	c->refs[idx] = (struct ref_entry){ .ref = dup, .rule = rule, .level = c->level };

	/* errors inside name the target's own place */
	char saved[sizeof c->path];
	size_t saved_len = c->path_len;
	memcpy(saved, c->path, saved_len + 1);
	snprintf(c->path, sizeof c->path, "%s", ref);
	c->path_len = strlen(c->path);
	char *body = schema_body(c, target, rule);
	memcpy(c->path, saved, saved_len + 1);
	c->path_len = saved_len;
	c->refs[idx].level = INT_MIN;
	if (!body)
		return NULL;
	struct rule *r = rule_find(c, rule);
	c->out_bytes += strlen(body);
	r->body = body;
	if (c->out_bytes > JSCHEMA_MAX_GBNF) {
		fail(c, -E2BIG, "schema", "the grammar would exceed %u bytes", JSCHEMA_MAX_GBNF);
		return NULL;
	}
	char *ret = strdup(rule);
	if (!ret)
		fail(c, -ENOMEM, "schema", "out of memory");
	return ret;
}

/* ---- allOf: schemas merged into one ---- */

static unsigned type_mask(struct conv *c, struct json_object *t);

/* What merging needs to remember of each part (for the properties one part
 * declares and another's additionalProperties constrains). */
struct merge {
	struct json_object *out;  /* the merged schema (owned) */
	struct json_object *objs; /* array of parts with additionalProperties
	                             other than true: their {properties,
	                             additionalProperties} */
	int n_tuple;              /* parts with prefixItems or an items array */
	int n_items;              /* parts with items, prefixItems or
	                             additionalItems */
};

static struct json_object *new_allof(struct json_object *a, struct json_object *b)
{
	struct json_object *o = json_object_new_object(), *arr = json_object_new_array();

	if (!o || !arr) {
		json_object_put(o);
		json_object_put(arr);
		return NULL;
	}
	json_object_array_add(arr, json_object_get(a));
	json_object_array_add(arr, json_object_get(b));
	json_object_object_add(o, "allOf", arr);
	return o;
}

static int set_key(struct conv *c, struct json_object *o, const char *k, struct json_object *v)
{
	if (!v || json_object_object_add(o, k, v) < 0) {
		json_object_put(v);
		return fail(c, -ENOMEM, "schema", "out of memory");
	}
	return 0;
}

/* O[K] = a reference to V (which may be JSON null: json-c's NULL). */
static int add_ref(struct conv *c, struct json_object *o, const char *k, struct json_object *v)
{
	if (json_object_object_add(o, k, json_object_get(v)) < 0) {
		json_object_put(v);
		return fail(c, -ENOMEM, "schema", "out of memory");
	}
	return 0;
}

/* Combines keyword K = V of one part into M->out. */
static int merge_kw(struct conv *c, struct merge *m, const char *k, struct json_object *v)
{
	struct json_object *old = kw(m->out, k);

	if (!has(m->out, k))
		return add_ref(c, m->out, k, v);
	if (strcmp(k, "type") == 0) {
		unsigned a = type_mask(c, old), b = type_mask(c, v), both = a & b;
		if (c->rc)
			return c->rc;
		if (!both)
			return fail(c, -EINVAL, "allOf", "the parts' types have nothing in common");
		struct json_object *arr = json_object_new_array();
		for (size_t i = 0; arr && i < N_TYPE_NAMES; i++)
			if ((both & type_names[i].mask) == type_names[i].mask &&
			    !(type_names[i].mask == T_INT && (both & T_FRAC)))
				json_object_array_add(arr, json_object_new_string(type_names[i].name));
		return set_key(c, m->out, k, arr);
	}
	if (strcmp(k, "properties") == 0 && json_object_is_type(old, json_type_object) &&
	    json_object_is_type(v, json_type_object)) {
		struct json_object *p = json_object_new_object();
		if (!p)
			return fail(c, -ENOMEM, "schema", "out of memory");
		json_object_object_foreach(old, pk, pv)
			json_object_object_add(p, pk, json_object_get(pv));
		json_object_object_foreach(v, qk, qv) {
			struct json_object *prev = kw(p, qk);
			json_object_object_add(p, qk, prev ? new_allof(prev, qv) : json_object_get(qv));
		}
		return set_key(c, m->out, k, p);
	}
	if (strcmp(k, "required") == 0 && json_object_is_type(old, json_type_array) &&
	    json_object_is_type(v, json_type_array)) {
		struct json_object *r = json_object_new_array();
		for (size_t i = 0; r && i < json_object_array_length(old); i++)
			json_object_array_add(r, json_object_get(json_object_array_get_idx(old, i)));
		for (size_t i = 0; r && i < json_object_array_length(v); i++) {
			struct json_object *x = json_object_array_get_idx(v, i);
			int dup = 0;
			for (size_t j = 0; j < json_object_array_length(old) && !dup; j++)
				dup = json_equal(x, json_object_array_get_idx(old, j), 0);
			if (!dup)
				json_object_array_add(r, json_object_get(x));
		}
		return set_key(c, m->out, k, r);
	}
	if (strcmp(k, "additionalProperties") == 0 || strcmp(k, "items") == 0 ||
	    strcmp(k, "additionalItems") == 0) {
		if (json_object_is_type(old, json_type_array) || json_object_is_type(v, json_type_array))
			return fail(c, -ENOTSUP, "allOf", "tuples (items arrays) in several parts cannot be merged");
		if (is_false(old) || is_true(v))
			return 0;
		if (is_false(v) || is_true(old))
			return add_ref(c, m->out, k, v);
		return set_key(c, m->out, k, new_allof(old, v));
	}
	static const char *const maxes[] = { "minItems", "minLength", "minProperties", "minimum",
					     "exclusiveMinimum" };
	static const char *const mins[] = { "maxItems", "maxLength", "maxProperties", "maximum",
					    "exclusiveMaximum" };
	for (int up = 0; up < 2; up++)
		for (size_t i = 0; i < 5; i++) {
			if (strcmp(k, up ? mins[i] : maxes[i]) != 0)
				continue;
			if (!is_number(old) || !is_number(v)) {
				if (json_equal(old, v, 0))
					return 0;
				return fail(c, -ENOTSUP, "allOf", "%s differs between the parts", k);
			}
			double a = json_object_get_double(old), b = json_object_get_double(v);
			if (up ? b < a : b > a)
				return add_ref(c, m->out, k, v);
			return 0;
		}
	if (strcmp(k, "enum") == 0 && json_object_is_type(old, json_type_array) &&
	    json_object_is_type(v, json_type_array)) {
		struct json_object *r = json_object_new_array();
		for (size_t i = 0; r && i < json_object_array_length(old); i++) {
			struct json_object *x = json_object_array_get_idx(old, i);
			int in = 0;
			for (size_t j = 0; j < json_object_array_length(v) && !in; j++)
				in = json_equal(x, json_object_array_get_idx(v, j), 0);
			if (in)
				json_object_array_add(r, json_object_get(x));
		}
		if (r && !json_object_array_length(r)) {
			json_object_put(r);
			return fail(c, -EINVAL, "allOf", "the parts' enums have no value in common");
		}
		return set_key(c, m->out, k, r);
	}
	if (json_equal(old, v, 0))
		return 0;
	if (strcmp(k, "const") == 0)
		return fail(c, -EINVAL, "allOf", "the parts' consts differ: no value satisfies both");
	return fail(c, -ENOTSUP, "allOf", "%s differs between the parts and cannot be merged", k);
}

/* Merges part S (and its allOf, $ref) into M. */
static int merge_part(struct conv *c, struct merge *m, struct json_object *s)
{
	int rc = 0;

	if (is_true(s))
		return 0;
	if (is_false(s))
		return fail(c, -EINVAL, "allOf", "a part is false: no value is valid");
	if (!json_object_is_type(s, json_type_object))
		return fail(c, -EINVAL, "allOf", "a schema must be an object or a boolean");
	if ((rc = enter(c)) < 0)
		return rc;
	if ((rc = check_refused(c, s)) < 0)
		goto out;
	struct json_object *addl = kw(s, "additionalProperties");
	if (addl && !is_true(addl)) {
		struct json_object *o = json_object_new_object();
		if (!o) {
			rc = fail(c, -ENOMEM, "schema", "out of memory");
			goto out;
		}
		struct json_object *props = kw(s, "properties");
		json_object_object_add(o, "properties",
				       props ? json_object_get(props) : json_object_new_object());
		json_object_object_add(o, "additionalProperties", json_object_get(addl));
		json_object_array_add(m->objs, o);
	}
	if (has(s, "prefixItems") || json_object_is_type(kw(s, "items"), json_type_array))
		m->n_tuple++;
	if (has(s, "prefixItems") || has(s, "items") || has(s, "additionalItems"))
		m->n_items++;
	json_object_object_foreach(s, k, v) {
		if (strcmp(k, "allOf") == 0) {
			if (!json_object_is_type(v, json_type_array) || !json_object_array_length(v)) {
				rc = fail(c, -EINVAL, "allOf", "must be a non-empty array");
				goto out;
			}
			for (size_t i = 0; i < json_object_array_length(v); i++) {
				size_t pp = path_push(c, "allOf");
				path_push_idx(c, i);
				rc = merge_part(c, m, json_object_array_get_idx(v, i));
				path_pop(c, pp);
				if (rc < 0)
					goto out;
			}
		} else if (strcmp(k, "$ref") == 0) {
			struct json_object *t = ref_target(c, v);
			if (!t) {
				rc = c->rc;
				goto out;
			}
			if ((rc = merge_part(c, m, t)) < 0)
				goto out;
		} else if (is_assertion(k)) {
			if ((rc = merge_kw(c, m, k, v)) < 0)
				goto out;
		}
	}
out:
	leave(c);
	return rc < 0 ? rc : c->rc;
}

/* S with its allOf (and $ref) merged into one schema without them: a new
 * object the caller puts, or NULL with the failure recorded. */
static struct json_object *merge_allof(struct conv *c, struct json_object *s)
{
	struct merge m = { .out = json_object_new_object(), .objs = json_object_new_array() };

	if (!m.out || !m.objs) {
		fail(c, -ENOMEM, "schema", "out of memory");
		goto fail;
	}
	if (merge_part(c, &m, s) < 0)
		goto fail;
	if (m.n_tuple && m.n_items > 1) {
		fail(c, -ENOTSUP, "allOf", "a tuple (prefixItems) cannot be merged with other items");
		goto fail;
	}
	/* A property one part declares must also satisfy the
	 * additionalProperties of each part that does not declare it. */
	if (json_object_array_length(m.objs)) {
		struct json_object *props = kw(m.out, "properties"), *req = kw(m.out, "required");
		struct json_object *np = json_object_new_object();
		if (!np) {
			fail(c, -ENOMEM, "schema", "out of memory");
			goto fail;
		}
		if (json_object_is_type(props, json_type_object)) {
			json_object_object_foreach(props, pk, pv)
				json_object_object_add(np, pk, json_object_get(pv));
		}
		for (size_t i = 0; json_object_is_type(req, json_type_array) &&
				   i < json_object_array_length(req); i++) {
			const char *r = json_object_get_string(json_object_array_get_idx(req, i));
			if (r && !has(np, r))
				json_object_object_add(np, r, json_object_new_boolean(1));
		}
		struct json_object *np2 = json_object_new_object();
		if (!np2) {
			json_object_put(np);
			fail(c, -ENOMEM, "schema", "out of memory");
			goto fail;
		}
		json_object_object_foreach(np, nk, nv) {
			struct json_object *cur = json_object_get(nv);
			for (size_t i = 0; cur && i < json_object_array_length(m.objs); i++) {
				struct json_object *o = json_object_array_get_idx(m.objs, i);
				if (has(kw(o, "properties"), nk))
					continue;
				struct json_object *a = kw(o, "additionalProperties"), *x;
				x = is_false(a) ? json_object_new_boolean(0) : new_allof(cur, a);
				json_object_put(cur);
				cur = x;
			}
			json_object_object_add(np2, nk, cur);
		}
		json_object_put(np);
		json_object_object_add(m.out, "properties", np2);
	}
	json_object_put(m.objs);
	return m.out;
fail:
	json_object_put(m.out);
	json_object_put(m.objs);
	return NULL;
}

/* ---- anyOf, oneOf ---- */

/* What a oneOf alternative may be: enough to prove two never overlap. */
struct sig {
	unsigned gen;                /* T_* of the values we may write for it */
	unsigned valid;              /* T_* of the values it may accept */
	struct json_object *values;  /* its const (a one-value array made here,
	                                owned) or enum (borrowed), or NULL */
	int own_values;              /* values is ours to put */
	struct json_object *props;   /* its properties, or NULL */
	struct json_object *required; /* its required, or NULL */
};

static unsigned type_mask(struct conv *c, struct json_object *t)
{
	unsigned m = 0;

	if (json_object_is_type(t, json_type_string)) {
		for (size_t i = 0; i < N_TYPE_NAMES; i++)
			if (strcmp(type_names[i].name, json_object_get_string(t)) == 0)
				return type_names[i].mask;
		fail(c, -EINVAL, "type", "unknown type \"%s\"", json_object_get_string(t));
		return 0;
	}
	if (json_object_is_type(t, json_type_array) && json_object_array_length(t)) {
		for (size_t i = 0; i < json_object_array_length(t); i++) {
			struct json_object *e = json_object_array_get_idx(t, i);
			if (!json_object_is_type(e, json_type_string)) {
				fail(c, -EINVAL, "type", "must be a type name or an array of them");
				return 0;
			}
			m |= type_mask(c, e);
		}
		return m;
	}
	fail(c, -EINVAL, "type", "must be a type name or a non-empty array of them");
	return 0;
}

/* The types the keywords of S imply when it has no "type": what we write
 * for it (JSON Schema lets it be anything; we write one of these). */
static unsigned inferred_types(struct json_object *s)
{
	static const struct {
		const char *kw;
		unsigned mask;
	} fam[] = {
		{ "properties", T_OBJ }, { "required", T_OBJ }, { "additionalProperties", T_OBJ },
		{ "minProperties", T_OBJ }, { "maxProperties", T_OBJ },
		{ "items", T_ARR }, { "prefixItems", T_ARR }, { "additionalItems", T_ARR },
		{ "minItems", T_ARR }, { "maxItems", T_ARR }, { "uniqueItems", T_ARR },
		{ "minLength", T_STR }, { "maxLength", T_STR }, { "pattern", T_STR },
		{ "format", T_STR },
		{ "minimum", T_NUM }, { "maximum", T_NUM }, { "exclusiveMinimum", T_NUM },
		{ "exclusiveMaximum", T_NUM }, { "multipleOf", T_NUM },
	};
	unsigned m = 0;

	for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
		if (has(s, fam[i].kw))
			m |= fam[i].mask;
	return m ? m : T_ALL;
}

static void sig_of(struct conv *c, struct json_object *s, struct sig *g, unsigned depth)
{
	memset(g, 0, sizeof *g);
	g->gen = g->valid = T_ALL;
	if (is_false(s)) {
		g->gen = g->valid = 0;
		return;
	}
	if (!json_object_is_type(s, json_type_object) || depth > JSCHEMA_MAX_DEPTH ||
	    ++c->work > JSCHEMA_MAX_WORK)
		return;
	struct json_object *ref = kw(s, "$ref");
	if (ref && !has_other_assertions(s, "$ref", NULL)) {
		struct json_object *t = json_object_is_type(ref, json_type_string) &&
						json_object_get_string(ref)[0] == '#' ?
					resolve_pointer(c, json_object_get_string(ref)) : NULL;
		if (t)
			sig_of(c, t, g, depth + 1);
		return;
	}
	if (ref)
		return; /* merged with its siblings: taken as anything */
	unsigned tm = has(s, "type") ? type_mask(c, kw(s, "type")) : T_ALL;
	if (c->rc)
		return;
	struct json_object *cst = kw(s, "const"), *en = kw(s, "enum");
	if (has(s, "const") || json_object_is_type(en, json_type_array)) {
		unsigned m = 0;
		if (has(s, "const")) {
			g->values = json_object_new_array();
			if (g->values) {
				json_object_array_add(g->values, json_object_get(cst));
				g->own_values = 1;
			}
		} else {
			g->values = en;
		}
		for (size_t i = 0; g->values && i < json_object_array_length(g->values); i++)
			m |= value_type(json_object_array_get_idx(g->values, i));
		g->gen = g->valid = m & tm;
		return;
	}
	unsigned alts = T_ALL;
	if (has(s, "anyOf") || has(s, "oneOf")) {
		struct json_object *a = kw(s, has(s, "anyOf") ? "anyOf" : "oneOf");
		alts = 0;
		for (size_t i = 0; json_object_is_type(a, json_type_array) &&
				   i < json_object_array_length(a); i++) {
			struct sig sub;
			sig_of(c, json_object_array_get_idx(a, i), &sub, depth + 1);
			alts |= sub.valid;
			if (sub.own_values)
				json_object_put(sub.values);
		}
	}
	if (has(s, "allOf")) {
		struct json_object *a = kw(s, "allOf");
		for (size_t i = 0; json_object_is_type(a, json_type_array) &&
				   i < json_object_array_length(a); i++) {
			struct sig sub;
			sig_of(c, json_object_array_get_idx(a, i), &sub, depth + 1);
			alts &= sub.valid;
			if (sub.own_values)
				json_object_put(sub.values);
		}
	}
	g->valid = tm & alts;
	g->gen = g->valid & (has(s, "type") ? T_ALL : inferred_types(s));
	if (json_object_is_type(kw(s, "properties"), json_type_object))
		g->props = kw(s, "properties");
	if (json_object_is_type(kw(s, "required"), json_type_array))
		g->required = kw(s, "required");
}

static int values_meet(struct json_object *a, struct json_object *b)
{
	if ((double)json_object_array_length(a) * (double)json_object_array_length(b) > 1e6)
		return 1; /* too many to compare: taken as meeting */
	for (size_t i = 0; i < json_object_array_length(a); i++)
		for (size_t j = 0; j < json_object_array_length(b); j++)
			if (json_equal(json_object_array_get_idx(a, i), json_object_array_get_idx(b, j), 0))
				return 1;
	return 0;
}

/* A property schema's const or enum values (following one $ref), or NULL;
 * *OWN when the array was made here. */
static struct json_object *prop_values(struct conv *c, struct json_object *ps, int *own)
{
	*own = 0;
	struct json_object *ref = kw(ps, "$ref");
	if (ref && json_object_is_type(ref, json_type_string) &&
	    json_object_get_string(ref)[0] == '#')
		ps = resolve_pointer(c, json_object_get_string(ref));
	struct json_object *cst = kw(ps, "const"), *en = kw(ps, "enum");
	if (has(ps, "const")) {
		struct json_object *a = json_object_new_array();
		if (a) {
			json_object_array_add(a, json_object_get(cst));
			*own = 1;
		}
		return a;
	}
	return json_object_is_type(en, json_type_array) ? en : NULL;
}

/* Whether no value we write for A can validate against B. */
static int never_matches(struct conv *c, const struct sig *a, const struct sig *b)
{
	unsigned ov = a->gen & b->valid;

	if (!ov)
		return 1;
	if (a->values) {
		for (size_t i = 0; i < json_object_array_length(a->values); i++) {
			struct json_object *v = json_object_array_get_idx(a->values, i);
			if (!(value_type(v) & b->valid))
				continue;
			if (!b->values)
				return 0;
			struct json_object *one = json_object_new_array();
			if (!one)
				return 0;
			json_object_array_add(one, json_object_get(v));
			int meet = values_meet(one, b->values);
			json_object_put(one);
			if (meet)
				return 0;
		}
		return 1;
	}
	if (b->values) {
		/* B accepts only its values: A must be unable to write them;
		 * not provable here unless the types keep them apart */
		int any = 0;
		for (size_t i = 0; i < json_object_array_length(b->values); i++)
			any |= !!(value_type(json_object_array_get_idx(b->values, i)) & a->gen);
		if (!any)
			return 1;
	}
	if (ov != T_OBJ || !a->required || !a->props || !b->props)
		return 0;
	/* a discriminator: a property A requires, with values B's schema of
	 * that property never accepts */
	for (size_t i = 0; i < json_object_array_length(a->required); i++) {
		const char *p = json_object_get_string(json_object_array_get_idx(a->required, i));
		struct json_object *pa = p ? kw(a->props, p) : NULL, *pb = p ? kw(b->props, p) : NULL;
		if (!pa || !pb)
			continue;
		int own_a, own_b;
		struct json_object *va = prop_values(c, pa, &own_a), *vb = prop_values(c, pb, &own_b);
		int apart = va && vb && !values_meet(va, vb);
		if (own_a)
			json_object_put(va);
		if (own_b)
			json_object_put(vb);
		if (apart)
			return 1;
	}
	return 0;
}

/* Fails unless the alternatives of oneOf ALTS never overlap (then writing
 * one of them gives a value that matches exactly one). */
static int check_disjoint(struct conv *c, struct json_object *alts, int with_siblings)
{
	size_t n = json_object_array_length(alts);
	struct sig *g = calloc(n, sizeof *g);
	int rc = 0;

	if (!g)
		return fail(c, -ENOMEM, "schema", "out of memory");
	for (size_t i = 0; i < n; i++) {
		sig_of(c, json_object_array_get_idx(alts, i), &g[i], 0);
		if (with_siblings)
			g[i].gen = g[i].valid;
	}
	for (size_t i = 0; i < n && !rc && !c->rc; i++)
		for (size_t j = 0; j < n && !rc; j++) {
			if (i == j || !g[i].gen || !g[j].valid)
				continue;
			if (++c->work > JSCHEMA_MAX_WORK) {
				rc = fail(c, -E2BIG, "oneOf", "too many alternatives to compare");
				break;
			}
			if (!never_matches(c, &g[i], &g[j]))
				rc = fail(c, -ENOTSUP, "oneOf",
					  "alternatives %zu and %zu may both match one value, which oneOf "
					  "rejects; the grammar cannot exclude it (anyOf can be enforced)",
					  i, j);
		}
	for (size_t i = 0; i < n; i++)
		if (g[i].own_values)
			json_object_put(g[i].values);
	free(g);
	return rc < 0 ? rc : c->rc;
}

static char *alternatives_body(struct conv *c, struct json_object *s, const char *name)
{
	const char *key = has(s, "anyOf") ? "anyOf" : "oneOf";
	struct json_object *alts = kw(s, key), *sib = NULL;
	struct sbuf b = { 0 };
	int n = 0;

	if (has(s, "anyOf") && has(s, "oneOf")) {
		fail(c, -ENOTSUP, "oneOf", "cannot be enforced beside anyOf");
		return NULL;
	}
	if (!json_object_is_type(alts, json_type_array) || !json_object_array_length(alts)) {
		fail(c, -EINVAL, key, "must be a non-empty array");
		return NULL;
	}
	if (has_other_assertions(s, key, NULL)) {
		/* the other keywords hold for each alternative */
		sib = json_object_new_object();
		if (!sib) {
			fail(c, -ENOMEM, "schema", "out of memory");
			return NULL;
		}
		json_object_object_foreach(s, k, v)
			if (strcmp(k, key) != 0)
				json_object_object_add(sib, k, json_object_get(v));
	}
	size_t pp = path_push(c, key);
	if (strcmp(key, "oneOf") == 0 && check_disjoint(c, alts, sib != NULL) < 0)
		goto fail;
	for (size_t i = 0; i < json_object_array_length(alts); i++) {
		struct json_object *alt = json_object_array_get_idx(alts, i);
		if (is_false(alt))
			continue;
		char nm[NAME_CAP], idx[24];
		snprintf(idx, sizeof idx, "%zu", i);
		if (*name)
			sub_name(nm, sizeof nm, name, idx);
		else
			snprintf(nm, sizeof nm, "alternative-%zu", i);
		size_t pi = path_push_idx(c, i);
		struct json_object *eff = sib ? new_allof(sib, alt) : json_object_get(alt);
		const char *r = eff ? visit(c, eff, nm) : NULL;
		json_object_put(eff);
		path_pop(c, pi);
		if (!r) {
			if (!c->rc)
				fail(c, -ENOMEM, "schema", "out of memory");
			goto fail;
		}
		if (n++)
			sb_puts(&b, " | ");
		sb_puts(&b, r);
	}
	path_pop(c, pp);
	json_object_put(sib);
	if (!n) {
		sb_free(&b);
		fail(c, -EINVAL, key, "every alternative is false: no value is valid");
		return NULL;
	}
	return sb_body(c, &b);
fail:
	path_pop(c, pp);
	json_object_put(sib);
	sb_free(&b);
	return NULL;
}

/* ---- objects ---- */

struct prop {
	const char *key;         /* property name (borrowed from the schema) */
	struct json_object *s;   /* its schema, NULL: any value */
	int required;            /* listed in "required" */
	const char *kv;          /* its key-value rule */
};

/* The key rule of an additional property: any string without escapes that
 * is none of the NAMES (a trie written out: at each character, the next of
 * some name, or any other and then anything, or the end where no name ends).
 */
struct trie {
	long cp;      /* code point leading here */
	int child;    /* first child, -1 none */
	int next;     /* next sibling, -1 none */
	int terminal; /* a name ends here */
};

/* The alternatives at NODE.  Past TRIE_NEST levels of parentheses the rest
 * becomes a rule of its own (NAME-1, NAME-2...): grammar parsers bound
 * nesting. */
#define TRIE_NEST 16

static void trie_put(struct conv *c, struct sbuf *b, const struct trie *t, int node,
		     const char *name, unsigned *nsub, int depth)
{
	int n = 0;

	for (int ch = t[node].child; ch >= 0; ch = t[ch].next) {
		if (n++)
			sb_puts(b, " | ");
		sb_putc(b, '[');
		put_cls_cp(b, t[ch].cp);
		sb_putc(b, ']');
		if (t[ch].child < 0) {
			sb_puts(b, " kchar+");
		} else if (depth + 1 < TRIE_NEST) {
			sb_puts(b, " (");
			trie_put(c, b, t, ch, name, nsub, depth + 1);
			sb_puts(b, t[ch].terminal ? ")" : ")?");
		} else {
			struct sbuf sub = { 0 };
			char nm[NAME_CAP];
			snprintf(nm, sizeof nm, "%s-%u", name, ++*nsub);
			trie_put(c, &sub, t, ch, name, nsub, 0);
			const char *r = add_rule(c, nm, sb_body(c, &sub));
			sb_printf(b, " %s%s", r ? r : "", t[ch].terminal ? "" : "?");
		}
	}
	if (n)
		sb_puts(b, " | ");
	sb_puts(b, "[^\"\\\\\\x7F\\x00-\\x1F");
	for (int ch = t[node].child; ch >= 0; ch = t[ch].next)
		put_cls_cp(b, t[ch].cp);
	sb_puts(b, "] kchar*");
}

/* Adds KEY to the trie T (room for every character), NT nodes so far. */
static int trie_insert(struct conv *c, struct trie *t, size_t *nt, const char *key)
{
	const unsigned char *p = (const unsigned char *)key, *end = p + strlen(key);
	int node = 0, len = 0;

	for (const unsigned char *q = p; q < end;) {
		long cp = utf8_next(&q, end);
		if (cp < 0x20 || cp == '"' || cp == '\\' || cp == 0x7F)
			return 0; /* no key we write can be it */
	}
	while (p < end) {
		long cp = utf8_next(&p, end);
		if (++len > MAX_KEY)
			return fail(c, -E2BIG, "properties",
				    "a name longer than %d characters beside additionalProperties", MAX_KEY);
		int ch = t[node].child, last = -1;
		while (ch >= 0 && t[ch].cp != cp)
			last = ch, ch = t[ch].next;
		if (ch < 0) {
			ch = (int)(*nt)++;
			t[ch] = (struct trie){ .cp = cp, .child = -1, .next = -1 };
			if (last < 0)
				t[node].child = ch;
			else
				t[last].next = ch;
		}
		node = ch;
	}
	t[node].terminal = 1;
	return 0;
}

static char *not_names_body(struct conv *c, const struct prop *props, size_t n,
			    struct json_object *excluded, const char *name)
{
	unsigned nsub = 0;
	size_t nt = 1, cap = 1;

	for (size_t i = 0; i < n; i++)
		cap += strlen(props[i].key);
	json_object_object_foreach(excluded, ek, ev) {
		(void)ev;
		cap += strlen(ek);
	}
	struct trie *t = calloc(cap, sizeof *t);
	if (!t) {
		fail(c, -ENOMEM, "schema", "out of memory");
		return NULL;
	}
	t[0] = (struct trie){ .cp = 0, .child = -1, .next = -1 };
	for (size_t i = 0; i < n; i++)
		if (trie_insert(c, t, &nt, props[i].key) < 0)
			goto fail;
	json_object_object_foreach(excluded, xk, xv) {
		(void)xv;
		if (trie_insert(c, t, &nt, xk) < 0)
			goto fail;
	}
	struct sbuf b = { 0 };
	sb_puts(&b, "\"\\\"\" (");
	trie_put(c, &b, t, 0, name, &nsub, 1);
	sb_puts(&b, t[0].terminal ? ") \"\\\"\"" : ")? \"\\\"\"");
	free(t);
	return sb_body(c, &b);
fail:
	free(t);
	return NULL;
}

static char *object_body(struct conv *c, struct json_object *s, const char *name)
{
	struct json_object *props = kw(s, "properties"), *req = kw(s, "required"),
			   *addl = kw(s, "additionalProperties"), *excluded = NULL;
	struct prop *pr = NULL;
	size_t n = 0, nreq = 0, nmin = 0, nmax = UNBOUNDED;
	int allow_addl, has_min, has_max;
	char nm[NAME_CAP];
	struct sbuf b = { 0 };
	const char *akv = NULL;

	if (props && !json_object_is_type(props, json_type_object)) {
		fail(c, -EINVAL, "properties", "must be an object");
		return NULL;
	}
	if (req && !json_object_is_type(req, json_type_array)) {
		fail(c, -EINVAL, "required", "must be an array of strings");
		return NULL;
	}
	if (addl && !json_object_is_type(addl, json_type_boolean) &&
	    !json_object_is_type(addl, json_type_object)) {
		fail(c, -EINVAL, "additionalProperties", "must be a boolean or a schema");
		return NULL;
	}
	for (size_t i = 0; req && i < json_object_array_length(req); i++)
		if (!json_object_is_type(json_object_array_get_idx(req, i), json_type_string)) {
			fail(c, -EINVAL, "required", "must be an array of strings");
			return NULL;
		}
	allow_addl = addl ? !is_false(addl) : !(c->flags & JSCHEMA_STRICT);
	if ((has_min = get_count(c, s, "minProperties", &nmin)) < 0 ||
	    (has_max = get_count(c, s, "maxProperties", &nmax)) < 0)
		return NULL;

	size_t cap = (props ? (size_t)json_object_object_length(props) : 0) +
		     (req ? json_object_array_length(req) : 0) + 1;
	pr = calloc(cap, sizeof *pr);
	excluded = json_object_new_object();
	if (!pr || !excluded) {
		fail(c, -ENOMEM, "schema", "out of memory");
		goto fail;
	}
	/* required first, in the schema's order; then the optional ones */
	for (int pass = 0; pass < 2; pass++) {
		json_object_object_foreach(props ? props : excluded, k, v) {
			int r = 0;
			for (size_t i = 0; req && i < json_object_array_length(req) && !r; i++)
				r = strcmp(json_object_get_string(json_object_array_get_idx(req, i)), k) == 0;
			if (r != (pass == 0))
				continue;
			if (is_false(v)) {
				if (r) {
					size_t pp = path_push(c, "properties");
					path_push(c, k);
					fail(c, -EINVAL, "required", "names a property whose schema is false");
					path_pop(c, pp);
					goto fail;
				}
				json_object_object_add(excluded, k, NULL);
				continue;
			}
			pr[n++] = (struct prop){ .key = k, .s = v, .required = r };
		}
		if (pass == 1)
			break;
		/* required names without a schema of their own: additional
		 * properties, as additionalProperties has them (absent: any
		 * value, even where JSCHEMA_STRICT writes no others) */
		for (size_t i = 0; req && i < json_object_array_length(req); i++) {
			const char *rk = json_object_get_string(json_object_array_get_idx(req, i));
			int dup = has(props, rk);
			for (size_t j = 0; j < n && !dup; j++)
				dup = strcmp(pr[j].key, rk) == 0;
			if (dup)
				continue;
			if (is_false(addl)) {
				fail(c, -EINVAL, "required", "names \"%s\", which additionalProperties false "
				     "forbids", rk);
				goto fail;
			}
			pr[n++] = (struct prop){ .key = rk, .s = is_true(addl) ? NULL : addl, .required = 1 };
		}
		nreq = n;
	}
	if (has_min && nmin > nreq) {
		fail(c, -ENOTSUP, "minProperties",
		     "%zu is more than the %zu required properties: cannot be enforced", nmin, nreq);
		goto fail;
	}
	if (has_max) {
		allow_addl = 0; /* fewer objects, all still valid */
		if (nmax < n) {
			fail(c, -ENOTSUP, "maxProperties",
			     "%zu is less than the %zu properties declared: cannot be enforced", nmax, n);
			goto fail;
		}
	}

	/* the case of llama.cpp's: {"type": "object"} alone, any object */
	if (n == 0 && allow_addl && (!addl || is_true(addl)) && !json_object_object_length(excluded)) {
		json_object_put(excluded);
		free(pr);
		const char *p = prim(c, "object");
		return p ? strdup(p) : NULL;
	}

	c->level++;
	if (!prim(c, "space"))
		goto fail_level;
	for (size_t i = 0; i < n; i++) {
		size_t pp = path_push(c, "properties");
		path_push(c, pr[i].key);
		sub_name(nm, sizeof nm, name, pr[i].key);
		const char *val = pr[i].s ? visit(c, pr[i].s, nm) : prim(c, "value");
		path_pop(c, pp);
		if (!val)
			goto fail_level;
		struct sbuf kv = { 0 }, key = { 0 };
		json_put_string(&key, pr[i].key, strlen(pr[i].key));
		if (key.err || put_literal(&kv, key.p, key.len) < 0) {
			sb_free(&key);
			sb_free(&kv);
			fail(c, -EINVAL, "properties", "a name that is not UTF-8");
			goto fail_level;
		}
		sb_free(&key);
		sb_printf(&kv, " space \":\" space ");
		sb_puts(&kv, val);
		char knm[NAME_CAP];
		sub_name(knm, sizeof knm, nm, "kv");
		pr[i].kv = add_rule(c, knm, sb_body(c, &kv));
		if (!pr[i].kv)
			goto fail_level;
	}
	if (allow_addl) {
		const char *val, *key;
		sub_name(nm, sizeof nm, name, "additional");
		char vnm[NAME_CAP];
		sub_name(vnm, sizeof vnm, nm, "value");
		size_t pp = path_push(c, "additionalProperties");
		val = !addl || is_true(addl) ? prim(c, "value") : visit(c, addl, vnm);
		path_pop(c, pp);
		if (!val)
			goto fail_level;
		if (n == 0 && !json_object_object_length(excluded)) {
			key = prim(c, "string");
		} else {
			char knm[NAME_CAP];
			sub_name(knm, sizeof knm, nm, "k");
			if (!prim(c, "kchar"))
				goto fail_level;
			key = add_rule(c, knm, not_names_body(c, pr, n, excluded, knm));
		}
		if (!key)
			goto fail_level;
		struct sbuf kv = { 0 };
		sb_puts(&kv, key);
		sb_puts(&kv, " space \":\" space ");
		sb_puts(&kv, val);
		char knm[NAME_CAP];
		sub_name(knm, sizeof knm, nm, "kv");
		akv = add_rule(c, knm, sb_body(c, &kv));
		if (!akv)
			goto fail_level;
	}
	c->level--;

	/* "{" required... (optional...)? "}" */
	size_t nopt = n - nreq + (akv ? 1 : 0);
	const char **rest = calloc(nopt + 1, sizeof *rest); /* rest[j]: after optional j-1 */
	if (!rest) {
		fail(c, -ENOMEM, "schema", "out of memory");
		goto fail;
	}
	for (size_t j = nopt; j-- > 1;) {
		/* rest[j] = (, opt_j)? rest[j+1]  -- or (, additional)* for the last */
		int is_addl = akv && j == nopt - 1;
		const char *kvj = is_addl ? akv : pr[nreq + j].kv;
		struct sbuf r = { 0 };
		sb_printf(&r, "( space \",\" space %s )%c", kvj, is_addl ? '*' : '?');
		if (rest[j + 1]) {
			sb_putc(&r, ' ');
			sb_puts(&r, rest[j + 1]);
		}
		char rnm[NAME_CAP], base[NAME_CAP];
		sub_name(base, sizeof base, name, is_addl ? "additional" : pr[nreq + j].key);
		sub_name(rnm, sizeof rnm, base, "rest");
		rest[j] = add_rule(c, rnm, sb_body(c, &r));
		if (!rest[j]) {
			free(rest);
			goto fail;
		}
	}
	sb_puts(&b, "\"{\" space ");
	for (size_t i = 0; i < nreq; i++) {
		if (i)
			sb_puts(&b, " space \",\" space ");
		sb_puts(&b, pr[i].kv);
	}
	if (nopt) {
		/* the group keeps the last space off the last alternative alone */
		sb_puts(&b, nreq ? " ( space \",\" space ( " : nopt > 1 ? "( ( " : "( ");
		for (size_t j = 0; j < nopt; j++) {
			int is_addl = akv && j == nopt - 1;
			if (j)
				sb_puts(&b, " | ");
			sb_puts(&b, is_addl ? akv : pr[nreq + j].kv);
			if (is_addl) {
				sb_printf(&b, " ( space \",\" space %s )*", akv);
			} else if (rest[j + 1]) {
				sb_putc(&b, ' ');
				sb_puts(&b, rest[j + 1]);
			}
		}
		sb_puts(&b, nreq ? " ) )? space \"}\"" : nopt > 1 ? " ) space )? \"}\"" : " space )? \"}\"");
	} else {
		sb_puts(&b, nreq ? " space \"}\"" : "\"}\"");
	}
	free(rest);
	free(pr);
	json_object_put(excluded);
	return sb_body(c, &b);

fail_level:
	c->level--;
fail:
	sb_free(&b);
	free(pr);
	json_object_put(excluded);
	return NULL;
}

/* ---- arrays ---- */

static char *array_body(struct conv *c, struct json_object *s, const char *name)
{
	struct json_object *items = kw(s, "items"), *prefix = kw(s, "prefixItems"), *tuple = NULL,
			   *rest = NULL;
	size_t min = 0, max = UNBOUNDED, k = 0;
	int has_max, rest_ok;
	const char **elems = NULL;
	const char *item = NULL;
	struct sbuf b = { 0 }, tail = { 0 };
	const char *rest_kw = "items";

	if (prefix && !json_object_is_type(prefix, json_type_array)) {
		fail(c, -EINVAL, "prefixItems", "must be an array of schemas");
		return NULL;
	}
	if (prefix) {
		tuple = prefix;
		rest = items;
	} else if (json_object_is_type(items, json_type_array)) {
		tuple = items; /* Draft 4-2019: items as a tuple */
		rest = kw(s, "additionalItems");
		rest_kw = "additionalItems";
	} else {
		rest = items;
	}
	if (rest && !json_object_is_type(rest, json_type_boolean) &&
	    !json_object_is_type(rest, json_type_object)) {
		fail(c, -EINVAL, rest_kw, "must be a schema");
		return NULL;
	}
	if (get_count(c, s, "minItems", &min) < 0 || (has_max = get_count(c, s, "maxItems", &max)) < 0)
		return NULL;
	k = tuple ? json_object_array_length(tuple) : 0;
	rest_ok = rest ? !is_false(rest) : !(tuple && (c->flags & JSCHEMA_STRICT));
	for (size_t i = 0; i < k; i++)
		if (is_false(json_object_array_get_idx(tuple, i))) {
			k = i; /* nothing can stand at i: the array ends before */
			rest_ok = 0;
			break;
		}
	if (!rest_ok && max > k)
		max = k;
	if (max != UNBOUNDED && min > max) {
		fail(c, -EINVAL, "minItems", "no array of the schema's items has %zu items", min);
		return NULL;
	}
	if (is_true(kw(s, "uniqueItems")) && max > 1) {
		fail(c, -ENOTSUP, "uniqueItems", "cannot be enforced by a grammar over more than one item");
		return NULL;
	}
	if (clamp_counts(c, "minItems", &min, &max) < 0)
		return NULL;
	if (k > max)
		k = max;
	if (max == 0) {
		char *e = strdup("\"[\" space \"]\"");
		if (!e || !prim(c, "space"))
			fail(c, -ENOMEM, "schema", "out of memory");
		return c->rc ? (free(e), NULL) : e;
	}
	/* {"type": "array"} alone: llama.cpp's shared rule */
	if (!k && min == 0 && max == UNBOUNDED && (!rest || is_true(rest))) {
		const char *p = prim(c, "array");
		return p ? strdup(p) : NULL;
	}
	c->level++;
	if (!prim(c, "space"))
		goto fail;
	elems = calloc(k + 1, sizeof *elems);
	if (!elems) {
		fail(c, -ENOMEM, "schema", "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < k; i++) {
		char nm[NAME_CAP], suf[32];
		snprintf(suf, sizeof suf, "tuple-%zu", i);
		sub_name(nm, sizeof nm, name, suf);
		size_t pp = path_push(c, prefix ? "prefixItems" : "items");
		path_push_idx(c, i);
		elems[i] = visit(c, json_object_array_get_idx(tuple, i), nm);
		path_pop(c, pp);
		if (!elems[i])
			goto fail;
	}
	if (max > k) {
		char nm[NAME_CAP];
		sub_name(nm, sizeof nm, name, "item");
		size_t pp = path_push(c, rest_kw);
		item = rest && !is_true(rest) ? visit(c, rest, nm) : prim(c, "value");
		path_pop(c, pp);
		if (!item)
			goto fail;
	}
	c->level--;

	/* the items after the tuple: (, item){a,b} */
	if (item) {
		size_t a = min > k ? min - k : 0, bmax = max == UNBOUNDED ? UNBOUNDED : max - k;
		if (k == 0) {
			/* item (, item){a-1,b-1}, optional as a whole when a == 0 */
			sb_puts(&tail, item);
			if (bmax != 1) {
				sb_printf(&tail, " ( space \",\" space %s )", item);
				put_repeat(&tail, a ? a - 1 : 0, bmax == UNBOUNDED ? UNBOUNDED : bmax - 1);
			}
		} else {
			sb_printf(&tail, "( space \",\" space %s )", item);
			put_repeat(&tail, a, bmax);
		}
	}
	sb_puts(&b, "\"[\" space ");
	if (k == 0) {
		if (min == 0)
			sb_puts(&b, "( ");
		sb_put(&b, tail.p ? tail.p : "", tail.len);
		sb_puts(&b, min == 0 ? " space )? \"]\"" : " space \"]\"");
	} else {
		/* e0 (, e1 (, e2 ... tail)?)?: the elements past minItems optional */
		for (size_t i = 0; i < k; i++) {
			if (i) {
				sb_puts(&b, " ");
				if (i >= min)
					sb_puts(&b, "( ");
				sb_puts(&b, "space \",\" space ");
			}
			sb_puts(&b, elems[i]);
		}
		if (tail.len) {
			sb_putc(&b, ' ');
			sb_put(&b, tail.p, tail.len);
		}
		for (size_t i = k; i-- > 1;)
			if (i >= min)
				sb_puts(&b, " )?");
		if (min == 0) {
			/* the first element too */
			struct sbuf w = { 0 };
			sb_puts(&w, "\"[\" space ( ");
			sb_put(&w, b.p + strlen("\"[\" space "), b.len - strlen("\"[\" space "));
			sb_puts(&w, " space )? \"]\"");
			if (b.err)
				w.err = b.err;
			sb_free(&b);
			b = w;
		} else {
			sb_puts(&b, " space \"]\"");
		}
	}
	if (tail.err && !b.err)
		b.err = tail.err;
	sb_free(&tail);
	free(elems);
	return sb_body(c, &b);
fail:
	c->level--;
	free(elems);
	sb_free(&b);
	sb_free(&tail);
	return NULL;
}

/* ---- a schema ---- */

static char *family_body(struct conv *c, struct json_object *s, unsigned fam, const char *name)
{
	const char *p;

	switch (fam) {
	case T_NULL:
		p = prim(c, "null");
		return p ? strdup(p) : NULL;
	case T_BOOL:
		p = prim(c, "boolean");
		return p ? strdup(p) : NULL;
	case T_INT:
		return numeric_body(c, s, 1);
	case T_NUM:
		return numeric_body(c, s, 0);
	case T_STR:
		return string_body(c, s, name);
	case T_ARR:
		return array_body(c, s, name);
	case T_OBJ:
		return object_body(c, s, name);
	}
	fail(c, -EINVAL, "type", "internal: no family %u", fam);
	return NULL;
}

static char *typed_body(struct conv *c, struct json_object *s, const char *name)
{
	struct json_object *t = kw(s, "type");
	unsigned mask = t ? type_mask(c, t) : T_ALL;
	static const unsigned order[] = { T_OBJ, T_ARR, T_STR, T_NUM, T_INT, T_BOOL, T_NULL };
	unsigned fams[7];
	size_t nf = 0;

	if (c->rc)
		return NULL;
	if (has(s, "const") || has(s, "enum"))
		return enum_body(c, s, mask);
	if (!t) {
		mask = inferred_types(s);
		if (mask == T_ALL) {
			const char *p = prim(c, "value");
			return p ? strdup(p) : NULL;
		}
	}
	if (t && json_object_is_type(t, json_type_array)) {
		/* the order of "type" */
		for (size_t i = 0; i < json_object_array_length(t); i++) {
			unsigned m = type_mask(c, json_object_array_get_idx(t, i));
			unsigned f = m == T_NUM ? T_NUM : m;
			int dup = 0;
			for (size_t j = 0; j < nf && !dup; j++)
				dup = fams[j] == f || (f == T_INT && fams[j] == T_NUM);
			if (!dup && nf < 7)
				fams[nf++] = f;
		}
		/* number covers integer */
		for (size_t j = 0; j < nf; j++)
			if (fams[j] == T_INT && (mask & T_FRAC)) {
				memmove(fams + j, fams + j + 1, (nf - j - 1) * sizeof *fams);
				nf--;
				break;
			}
		if (c->rc)
			return NULL;
	} else {
		for (size_t i = 0; i < 7; i++) {
			unsigned f = order[i];
			if ((mask & f) == f && !(f == T_INT && (mask & T_FRAC)))
				fams[nf++] = f;
		}
	}
	if (nf == 1)
		return family_body(c, s, fams[0], name);
	struct sbuf b = { 0 };
	for (size_t i = 0; i < nf; i++) {
		char nm[NAME_CAP];
		const char *tn = fams[i] == T_OBJ ? "object" : fams[i] == T_ARR ? "array" :
				 fams[i] == T_STR ? "string" : fams[i] == T_NUM ? "number" :
				 fams[i] == T_INT ? "integer" : fams[i] == T_BOOL ? "boolean" : "null";
		sub_name(nm, sizeof nm, *name ? name : "root", tn);
		char *body = family_body(c, s, fams[i], nm);
		const char *r;
		if (!body) {
			sb_free(&b);
			return NULL;
		}
		if (is_ident(body)) {
			struct rule *rr = rule_find(c, body);
			free(body);
			r = rr ? rr->name : NULL;
		} else {
			r = add_rule(c, nm, body);
		}
		if (!r) {
			sb_free(&b);
			if (!c->rc)
				fail(c, -EINVAL, "type", "internal: lost rule");
			return NULL;
		}
		if (i)
			sb_puts(&b, " | ");
		sb_puts(&b, r);
	}
	return sb_body(c, &b);
}

/* The body of the rule for schema S (NAME: its rule's name, the prefix of
 * its sub-rules'), or NULL with the failure recorded. */
static char *schema_body(struct conv *c, struct json_object *s, const char *name)
{
	char *body = NULL;

	if (enter(c) < 0)
		return NULL;
	if (is_true(s)) {
		const char *p = prim(c, "value");
		body = p ? strdup(p) : NULL;
		goto out;
	}
	if (is_false(s)) {
		fail(c, -EINVAL, "schema", "false: no value is valid here");
		goto out;
	}
	if (!json_object_is_type(s, json_type_object)) {
		fail(c, -EINVAL, "schema", "must be an object or a boolean");
		goto out;
	}
	if (check_refused(c, s) < 0)
		goto out;
	if (has(s, "$ref") && !has_other_assertions(s, "$ref", NULL)) {
		body = ref_body(c, kw(s, "$ref"));
		goto out;
	}
	if (has(s, "allOf") && !has_other_assertions(s, "allOf", NULL) &&
	    json_object_is_type(kw(s, "allOf"), json_type_array) &&
	    json_object_array_length(kw(s, "allOf")) == 1) {
		/* allOf of one, the way pydantic wraps a $ref: that schema */
		size_t pp = path_push(c, "allOf");
		path_push_idx(c, 0);
		body = schema_body(c, json_object_array_get_idx(kw(s, "allOf"), 0), name);
		path_pop(c, pp);
		goto out;
	}
	if (has(s, "$ref") || has(s, "allOf")) {
		struct json_object *m = merge_allof(c, s);
		if (m)
			body = schema_body(c, m, name);
		json_object_put(m);
		goto out;
	}
	if (has(s, "anyOf") || has(s, "oneOf")) {
		body = alternatives_body(c, s, name);
		goto out;
	}
	body = typed_body(c, s, name);
out:
	leave(c);
	if (!body && !c->rc)
		fail(c, -ENOMEM, "schema", "out of memory");
	return body;
}

/* ---- output ---- */

static int rule_cmp(const void *a, const void *b)
{
	const struct rule *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static void conv_free(struct conv *c)
{
	for (size_t i = 0; i < c->n_rules; i++) {
		free(c->rules[i].name);
		free(c->rules[i].body);
	}
	for (size_t i = 0; i < c->n_refs; i++)
		free(c->refs[i].ref);
	free(c->rules);
	free(c->hash);
	free(c->refs);
}

/* Every rule, sorted by name, one a line. */
static int conv_write(struct conv *c, char **ret)
{
	struct sbuf b = { 0 };

	qsort(c->rules, c->n_rules, sizeof *c->rules, rule_cmp);
	free(c->hash); /* indexes are stale now */
	c->hash = NULL;
	c->hash_cap = 0;
	for (size_t i = 0; i < c->n_rules; i++) {
		sb_puts(&b, c->rules[i].name);
		sb_puts(&b, " ::= ");
		sb_puts(&b, c->rules[i].body ? c->rules[i].body : "");
		sb_putc(&b, '\n');
	}
	if (sb_check(c, &b) < 0) {
		sb_free(&b);
		return c->rc;
	}
	*ret = b.p;
	return 0;
}

int jschema_to_gbnf(struct json_object *schema, unsigned flags, char **ret_gbnf, char *err,
		    size_t errlen)
{
	struct conv c = { .root = schema, .flags = flags, .err = err, .errlen = errlen };
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!schema) {
		/* json-c's null: not a schema */
		fail(&c, -EINVAL, "schema", "must be an object or a boolean");
		goto out;
	}
	const char *top = visit(&c, schema, "");
	if (!top)
		goto out;
	if (strcmp(top, "root") != 0) {
		char *body = strdup(top);
		if (!add_rule(&c, "", body))
			goto out;
	}
	conv_write(&c, ret_gbnf);
out:
	rc = c.rc;
	conv_free(&c);
	return rc;
}

int jschema_any_json_gbnf(char **ret_gbnf)
{
	struct conv c = { 0 };
	int rc;

	if (prim(&c, "object")) {
		char *body = strdup("object");
		if (add_rule(&c, "", body))
			conv_write(&c, ret_gbnf);
	}
	rc = c.rc;
	conv_free(&c);
	return rc;
}
