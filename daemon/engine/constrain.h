/* constrain.h - structured output for one model: what a request's grammar,
 * JSON Schema or "any JSON object" compiles to, and each request's position
 * in it.
 *
 * A struct constrain holds the model's vocabulary as grammar.h's token trie
 * (built once, at the first constrained request) and a small cache of
 * compiled grammars keyed by their source, so that a client sending the same
 * schema again pays neither the compile nor the first masks' tables: every
 * request's state is a clone of the cached prototype and shares its masks.
 *
 * Threads: constrain_new, constrain_start and constrain_free run on one
 * thread (the daemon's event loop); a struct constrain_req is then handed to
 * the engine thread, which advances its state and frees it.  A cached
 * grammar lives as long as the cache or any request holds it.
 */
#ifndef LLMD_CONSTRAIN_H
#define LLMD_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct grammar_state;
struct constrain;
struct constrain_req;

enum constrain_kind {
	CONSTRAIN_GBNF = 1,        /* GBNF text, start rule "root" */
	CONSTRAIN_JSON_SCHEMA = 2, /* a JSON Schema document */
	CONSTRAIN_JSON_OBJECT = 3, /* any JSON object; no source */
};

#define CONSTRAIN_STRICT 1u        /* JSON_SCHEMA: OpenAI's strict mode
                                      (jschema.h's JSCHEMA_STRICT) */
#define CONSTRAIN_CACHE 16         /* compiled grammars kept for reuse */
#define CONSTRAIN_JSON_DEPTH 64    /* nesting of a schema document's JSON */

/* A cache for the model whose tokenizer is T (it must outlive the cache).
 * 0 or -ENOMEM. */
int constrain_new(const struct tokenizer *t, struct constrain **ret);
/* NULL-safe; requests still live keep what they use. */
void constrain_free(struct constrain *c);

/* A request's state at the start of the grammar that KIND, FLAGS and the
 * LEN bytes of SRC make (compiled, or taken from the cache).  Returns 0 and
 * *RET; -EINVAL with what and where in ERR ("grammar: line 3, column 7:
 * ...", "json_schema: uniqueItems at #/properties/tags: ...", "json_schema:
 * not JSON at byte 12: ...") for a source that does not compile, -ENOTSUP
 * for a schema keyword the grammar cannot enforce (ERR names it), -E2BIG
 * past a grammar or schema limit, -ENOMEM. */
int constrain_start(struct constrain *c, enum constrain_kind kind, unsigned flags, const char *src,
		    size_t len, struct constrain_req **ret, char *err, size_t errlen);

/* The request's grammar position: the engine thread masks and advances it. */
struct grammar_state *constrain_req_state(struct constrain_req *r);

/* NULL-safe; any thread (the last holder of a grammar evicted from the
 * cache frees it). */
void constrain_req_free(struct constrain_req *r);

/* Grammars compiled and grammars served from the cache, so far. */
void constrain_stats(const struct constrain *c, uint64_t *ret_compiled, uint64_t *ret_reused);

#endif
