/* grammar.h - GBNF grammars for constrained decoding: which tokens may come
 * next so that the output matches the grammar.
 *
 * The grammar language is llama.cpp's GBNF (its grammars/README.md): rules
 * `name ::= ...`, alternatives `|`, grouping, "literals" with \n \t \r \\ \"
 * \xHH \uHHHH \UHHHHHHHH escapes, [character classes], [^negated], `.`,
 * `* + ?`, `{m}` `{m,}` `{m,n}`, # comments.  Terminals are Unicode code
 * points; tokens are byte strings, and a token may end inside a UTF-8
 * character that the next token completes (as llama.cpp allows).  Not
 * supported: token terminals `<...>` / `!<...>` and left recursion (both are
 * refused with an error).
 *
 * Three objects, three lifetimes:
 *   struct grammar        a compiled grammar: immutable, any thread;
 *   struct grammar_vocab  a vocabulary's token bytes in a trie: immutable,
 *                         any thread, shared by every grammar;
 *   struct grammar_state  one sequence's position in the grammar.  It holds a
 *                         cache of token masks that its clones share, so a
 *                         daemon keeps one fresh state per (grammar, vocab)
 *                         and clones it for each request.
 * A state is used by one thread at a time; states that share a cache (clones)
 * may be used from different threads at once (the cache has its own lock).
 * The grammar and the vocabulary must outlive every state made from them.
 *
 * Everything a client controls is bounded: grammar size, nesting, repetition
 * counts, the stacks a state may hold and the cache's memory.  Exceeding a
 * limit is an error (-E2BIG), never a hang or a crash.  Nothing here logs.
 */
#ifndef LLMD_GRAMMAR_H
#define LLMD_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

struct grammar;
struct grammar_vocab;
struct grammar_state;

/* Limits of a compile (grammar_parse returns -E2BIG past any). */
#define GRAMMAR_MAX_TEXT (4u << 20)      /* bytes of GBNF text */
#define GRAMMAR_MAX_RULES 65536u         /* rules, the ones that groups and
                                            repetitions make included */
#define GRAMMAR_MAX_ELEMS (1u << 20)     /* compiled elements (about one per
                                            character of literals, after
                                            repetitions are expanded) */
#define GRAMMAR_MAX_NESTING 64u          /* nested parentheses */
#define GRAMMAR_MAX_REPEAT 2000u         /* m and n of {m,n} (llama.cpp's) */

/* Limits of matching (grammar_state_* return -E2BIG past any). */
#define GRAMMAR_MAX_STACKS 1024u         /* live parse stacks of one state
                                            (ambiguity) */
#define GRAMMAR_MAX_DEPTH 4096u          /* elements on one stack (nesting of
                                            the text being matched) */
#define GRAMMAR_MAX_EXPAND 65536u        /* rule expansions to find what may
                                            follow one character */
#define GRAMMAR_MAX_WORK (16u << 20)     /* stack nodes one mask or accept may
                                            create */
#define GRAMMAR_CACHE_BYTES (64u << 20)  /* token masks cached per state and
                                            its clones; past it the cache is
                                            emptied and refilled */
#define GRAMMAR_MAX_TOKEN_BYTES 65535u   /* bytes of one token */

/* ---- grammars ---- */

/* Compiles LEN bytes of GBNF text (UTF-8; need not be NUL-terminated) whose
 * start symbol is the rule ROOT_RULE (NULL = "root").  Returns 0 and the
 * grammar in *RET, or -EINVAL with "line L, column C: what" in ERR for a
 * syntax error, an undefined rule, a missing root, left recursion or a token
 * terminal; -E2BIG (same message form) past a GRAMMAR_MAX_* limit; -ENOMEM.
 * Columns count characters from 1.  *RET is untouched on failure.  Any
 * thread. */
int grammar_parse(const char *gbnf, size_t len, const char *root_rule,
		  struct grammar **ret, char *err, size_t errlen);

/* NULL-safe. */
void grammar_free(struct grammar *g);

/* Rules after compiling (the named ones and those that groups and
 * repetitions made), and compiled elements: for tests and limits. */
uint32_t grammar_n_rules(const struct grammar *g);
uint32_t grammar_n_elems(const struct grammar *g);

/* ---- vocabularies ---- */

/* Builds the token trie of a vocabulary of N_VOCAB tokens: token i is the
 * TOKEN_LENS[i] bytes at TOKEN_BYTES[i] (the decoded piece: raw bytes, not
 * the GGUF text), copied.  EOG_IDS (N_EOG of them) end generation: they are
 * allowed exactly when the grammar may end.  Every other token with no bytes
 * (control and special tokens) or with a NUL byte is never allowed.  Returns
 * 0, -EINVAL for a bad argument (an EOG id out of range), -E2BIG for a token
 * longer than GRAMMAR_MAX_TOKEN_BYTES, -ENOMEM.  Any thread. */
int grammar_vocab_new(const char *const *token_bytes, const size_t *token_lens,
		      int32_t n_vocab, const int32_t *eog_ids, int n_eog,
		      struct grammar_vocab **ret);

/* NULL-safe. */
void grammar_vocab_free(struct grammar_vocab *v);

int32_t grammar_vocab_n(const struct grammar_vocab *v);
/* Words of a mask: (n_vocab + 31) / 32. */
size_t grammar_vocab_mask_words(const struct grammar_vocab *v);

/* ---- matching ---- */

/* A new state at the start of G's root rule, for tokens of V, with a new
 * empty mask cache.  0, -E2BIG (the root's first characters exceed a
 * matching limit), -ENOMEM.  Any thread. */
int grammar_state_new(const struct grammar *g, const struct grammar_vocab *v,
		      struct grammar_state **ret);

/* A copy of S at the same position that shares S's mask cache: for each
 * request from a daemon's per-grammar prototype, or to try tokens ahead
 * (speculative decoding) and roll back by freeing the copy.  0 or -ENOMEM.
 * The thread that owns S. */
int grammar_state_clone(const struct grammar_state *s, struct grammar_state **ret);

/* NULL-safe; the cache goes with the last state that shares it. */
void grammar_state_free(struct grammar_state *s);

/* Writes to ALLOWED (grammar_vocab_mask_words() words; bit t%32 of word t/32
 * is token t) which tokens may come next: a token is allowed iff
 * grammar_state_accept would take it.  EOG tokens are allowed iff the grammar
 * may end here; tokens with no bytes never are.  Returns the number of
 * allowed tokens (0 after an accepted EOG), -E2BIG past a matching limit
 * (ALLOWED is then all zero), -ENOMEM.  The first masks of a grammar build
 * per-position tables (milliseconds); later ones mostly copy a cached mask.
 * The thread that owns S. */
int grammar_state_mask(struct grammar_state *s, uint32_t *allowed);

/* Advances S past TOKEN.  0; -EINVAL if TOKEN is not allowed here (S is then
 * unchanged); -E2BIG past a matching limit (S unchanged); -ENOMEM.
 * Accepting an EOG token ends the state: nothing is allowed after it.  The
 * thread that owns S. */
int grammar_state_accept(struct grammar_state *s, int32_t token);

/* Advances S past LEN bytes of text, as if a token held them (text forced
 * into the output, a test's input).  Same returns as grammar_state_accept. */
int grammar_state_accept_bytes(struct grammar_state *s, const void *bytes, size_t len);

/* ---- ending in time ----
 *
 * A sequence has a budget of tokens (max_tokens, the context).  The grammar
 * knows the shortest text that completes what was accepted so far; where
 * every byte of it is a token of the vocabulary (byte-level BPE, byte
 * fallback) that text takes at most one token per byte, and an EOG token
 * after it unless nothing else may follow.  A sampler that keeps this need
 * within the tokens left always finishes the sentence in time: */

#define GRAMMAR_COST_INF UINT32_MAX

/* Bytes of the shortest text that makes the text so far a complete
 * sentence: 0 if it is one, GRAMMAR_COST_INF if no text does. */
uint32_t grammar_state_end_cost(const struct grammar_state *s);

/* grammar_state_accept, but only if after TOKEN the grammar needs at most
 * BUDGET more tokens to end (UINT32_MAX: no limit): else -ERANGE, S
 * unchanged.  An allowed EOG token always fits. */
int grammar_state_accept_within(struct grammar_state *s, int32_t token, uint32_t budget);

/* Clears from ALLOWED (a mask of grammar_state_mask) the tokens after which
 * the grammar would need more than BUDGET tokens to end.  Returns the tokens
 * left, or -E2BIG / -ENOMEM.  It tries every token of ALLOWED (about 0.2 µs
 * each): for the few steps near the end where a sampled token did not fit.
 * The thread that owns S. */
int grammar_state_mask_within(struct grammar_state *s, uint32_t *allowed, uint32_t budget);

/* 1 if the text so far is a complete sentence of the grammar (an EOG token
 * would be allowed), else 0. */
int grammar_state_can_end(const struct grammar_state *s);

/* 1 if the text is complete and nothing but EOG may follow (or EOG was
 * accepted): the caller may stop generating. */
int grammar_state_done(const struct grammar_state *s);

/* Counters of a state's shared cache, for benchmarks and tests. */
struct grammar_stats {
	uint64_t masks;        /* grammar_state_mask calls */
	uint64_t mask_hits;    /* ... answered by a cached mask */
	uint64_t tables;       /* per-position tables built (trie walks) */
	uint64_t deepened;     /* ... of them too context-dependent: the position
	                          was cut one named rule lower */
	uint64_t ctx_checks;   /* tokens checked against the stack below their
	                          table's position */
	uint64_t flushes;      /* times the cache passed GRAMMAR_CACHE_BYTES */
	size_t cache_bytes;    /* bytes the cache holds now */
};

void grammar_state_stats(const struct grammar_state *s, struct grammar_stats *ret);

#endif
