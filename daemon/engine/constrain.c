/* constrain.c - a model's vocabulary trie and a cache of compiled grammars
 * for structured output.  The grammar engine is grammar.c, the schema
 * conversion jschema.c; this file only decides what to compile and keeps it.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "constrain.h"
#include "grammar.h"
#include "jschema.h"
#include "tokenizer.h"

/* One compiled grammar: the cache holds a reference, and so does every
 * request started from it. */
struct centry {
	atomic_int refs;             /* the cache's one, plus one per request */
	enum constrain_kind kind;
	unsigned flags;
	char *src;                   /* (len) the source it was compiled from; owned */
	size_t len;
	uint64_t hash;               /* of kind, flags and src */
	struct grammar *g;           /* owned */
	struct grammar_state *proto; /* the start state whose mask cache requests share */
	uint64_t last_use;           /* the cache's clock when last started */
};

struct constrain {
	const struct tokenizer *tok;
	struct grammar_vocab *vocab;     /* built at the first start; NULL before */
	struct centry *slot[CONSTRAIN_CACHE]; /* NULL or an entry */
	uint64_t clock;                  /* ticks once per start */
	uint64_t compiled, reused;
};

struct constrain_req {
	struct centry *e;            /* a reference */
	struct grammar_state *state; /* owned: a clone of e->proto */
};

static void centry_unref(struct centry *e)
{
	if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	grammar_state_free(e->proto);
	grammar_free(e->g);
	free(e->src);
	free(e);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

int constrain_new(const struct tokenizer *t, struct constrain **ret)
{
	struct constrain *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->tok = t;
	*ret = c;
	return 0;
}

void constrain_free(struct constrain *c)
{
	if (!c)
		return;
	for (int i = 0; i < CONSTRAIN_CACHE; i++)
		centry_unref(c->slot[i]);
	/* Requests still live hold their grammar, not the vocabulary: the
	 * daemon frees this only after the engine thread has stopped. */
	grammar_vocab_free(c->vocab);
	free(c);
}

void constrain_stats(const struct constrain *c, uint64_t *ret_compiled, uint64_t *ret_reused)
{
	*ret_compiled = c->compiled;
	*ret_reused = c->reused;
}

/* The vocabulary trie: each token's raw bytes, the end-of-generation ids. */
static int build_vocab(struct constrain *c)
{
	int32_t n = tokenizer_n_vocab(c->tok), n_eog = 0;
	char **bytes = calloc((size_t)n, sizeof *bytes);
	size_t *lens = calloc((size_t)n, sizeof *lens);
	int32_t *eog = calloc((size_t)n, sizeof *eog);
	char buf[1024];
	int rc = -ENOMEM;

	if (!bytes || !lens || !eog)
		goto out;
	for (int32_t i = 0; i < n; i++) {
		int k = tokenizer_piece(c->tok, i, 0, buf, sizeof buf);
		if (k < 0 || k > (int)sizeof buf)
			k = 0; /* a token longer than any text piece: never allowed */
		if (!(bytes[i] = malloc((size_t)k + 1)))
			goto out;
		memcpy(bytes[i], buf, (size_t)k);
		lens[i] = (size_t)k;
		if (tokenizer_is_eog(c->tok, i))
			eog[n_eog++] = i;
	}
	rc = grammar_vocab_new((const char *const *)bytes, lens, n, eog, n_eog, &c->vocab);
out:
	for (int32_t i = 0; bytes && i < n; i++)
		free(bytes[i]);
	free(bytes);
	free(lens);
	free(eog);
	return rc;
}

/* GBNF text for KIND from SRC: a copy, a schema's conversion, or the JSON
 * object grammar.  Errors are prefixed with what was being compiled. */
static int to_gbnf(enum constrain_kind kind, unsigned flags, const char *src, size_t len,
		   char **ret, char *err, size_t errlen)
{
	char msg[400] = "";
	int rc;

	switch (kind) {
	case CONSTRAIN_GBNF:
		if (!(*ret = malloc(len + 1)))
			return -ENOMEM;
		memcpy(*ret, src, len);
		(*ret)[len] = 0;
		return 0;
	case CONSTRAIN_JSON_OBJECT:
		return jschema_any_json_gbnf(ret);
	case CONSTRAIN_JSON_SCHEMA:
		break;
	default:
		snprintf(err, errlen, "unknown grammar kind %d", (int)kind);
		return -EINVAL;
	}
	if (len > INT32_MAX) {
		snprintf(err, errlen, "json_schema: too long");
		return -E2BIG;
	}
	struct json_tokener *tk = json_tokener_new_ex(CONSTRAIN_JSON_DEPTH);
	if (!tk)
		return -ENOMEM;
	struct json_object *schema = json_tokener_parse_ex(tk, src, (int)len);
	enum json_tokener_error jerr = json_tokener_get_error(tk);
	size_t end = json_tokener_get_parse_end(tk);
	json_tokener_free(tk);
	if (jerr != json_tokener_success || end != len) {
		/* trailing bytes after a whole document are an error too */
		if (jerr == json_tokener_success)
			while (end < len && strchr(" \t\r\n", src[end]))
				end++;
		if (jerr != json_tokener_success || end != len) {
			json_object_put(schema);
			snprintf(err, errlen, "json_schema: not JSON at byte %zu: %s", end,
				 jerr == json_tokener_success ? "text after the document" :
				 jerr == json_tokener_continue ? "the text ends early" :
				 json_tokener_error_desc(jerr));
			return -EINVAL;
		}
	}
	rc = jschema_to_gbnf(schema, flags & CONSTRAIN_STRICT ? JSCHEMA_STRICT : 0, ret, msg,
			     sizeof msg);
	json_object_put(schema);
	if (rc < 0 && rc != -ENOMEM)
		snprintf(err, errlen, "json_schema: %s", msg);
	return rc;
}

/* A new cache entry compiled from the source, with one reference (the
 * caller's). */
static int compile(struct constrain *c, enum constrain_kind kind, unsigned flags, const char *src,
		   size_t len, uint64_t hash, struct centry **ret, char *err, size_t errlen)
{
	char msg[400] = "";
	char *gbnf = NULL;
	struct centry *e = calloc(1, sizeof *e);
	int rc = -ENOMEM;

	if (!e || !(e->src = malloc(len + 1)))
		goto fail;
	memcpy(e->src, src, len);
	e->len = len;
	e->kind = kind;
	e->flags = flags;
	e->hash = hash;
	atomic_init(&e->refs, 1);
	if ((rc = to_gbnf(kind, flags, src, len, &gbnf, err, errlen)) < 0)
		goto fail;
	rc = grammar_parse(gbnf, strlen(gbnf), NULL, &e->g, msg, sizeof msg);
	if (rc < 0) {
		if (rc != -ENOMEM)
			snprintf(err, errlen, "%s: %s",
				 kind == CONSTRAIN_GBNF ? "grammar" : "the schema's grammar", msg);
		goto fail;
	}
	if ((rc = grammar_state_new(e->g, c->vocab, &e->proto)) < 0) {
		if (rc == -E2BIG)
			snprintf(err, errlen, "grammar: its start is over a matching limit "
					      "(too ambiguous)");
		goto fail;
	}
	free(gbnf);
	c->compiled++;
	*ret = e;
	return 0;
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	free(gbnf);
	centry_unref(e);
	return rc;
}

int constrain_start(struct constrain *c, enum constrain_kind kind, unsigned flags, const char *src,
		    size_t len, struct constrain_req **ret, char *err, size_t errlen)
{
	struct constrain_req *r = NULL;
	struct centry *e = NULL;
	int rc, victim = 0;

	if (kind == CONSTRAIN_JSON_OBJECT) {
		src = "";
		len = 0;
	}
	if (!src && len) {
		snprintf(err, errlen, "no grammar text");
		return -EINVAL;
	}
	if (kind == CONSTRAIN_GBNF && len > GRAMMAR_MAX_TEXT) {
		snprintf(err, errlen, "grammar: %zu bytes, over the limit of %u", len, GRAMMAR_MAX_TEXT);
		return -E2BIG;
	}
	if (!c->vocab && (rc = build_vocab(c)) < 0) {
		snprintf(err, errlen, rc == -ENOMEM ? "out of memory" :
				      "the model's vocabulary cannot serve grammars");
		return rc;
	}
	uint64_t h = fnv1a(0xcbf29ce484222325ull, &kind, sizeof kind);
	h = fnv1a(h, &flags, sizeof flags);
	h = fnv1a(h, src, len);
	c->clock++;
	for (int i = 0; i < CONSTRAIN_CACHE; i++) {
		struct centry *x = c->slot[i];
		if (!x) {
			victim = i;
			continue;
		}
		if (x->hash == h && x->kind == kind && x->flags == flags && x->len == len &&
		    !memcmp(x->src, src, len)) {
			e = x;
			break;
		}
		if (c->slot[victim] && x->last_use < c->slot[victim]->last_use)
			victim = i;
	}
	if (e) {
		atomic_fetch_add(&e->refs, 1);
		c->reused++;
	} else {
		if ((rc = compile(c, kind, flags, src, len, h, &e, err, errlen)) < 0)
			return rc;
		centry_unref(c->slot[victim]); /* requests using it keep it */
		c->slot[victim] = e;
		atomic_fetch_add(&e->refs, 1); /* the cache's */
	}
	e->last_use = c->clock;
	if (!(r = calloc(1, sizeof *r)) || grammar_state_clone(e->proto, &r->state) < 0) {
		free(r);
		centry_unref(e);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->e = e;
	*ret = r;
	return 0;
}

struct grammar_state *constrain_req_state(struct constrain_req *r)
{
	return r->state;
}

void constrain_req_free(struct constrain_req *r)
{
	if (!r)
		return;
	grammar_state_free(r->state);
	centry_unref(r->e);
	free(r);
}
