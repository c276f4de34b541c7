/* test_grammar.c - pins grammar.c: GBNF errors and where they point; every
 * llama.cpp example grammar (tests/grammars/) compiles; the language each
 * construct matches (repetitions, classes, escapes, comments, ambiguity,
 * UTF-8 split across tokens); json, arithmetic and list take valid text and
 * refuse invalid text at the right character; every mask agrees with brute
 * force (a token is allowed iff a clone of the state accepts it) on a small
 * vocabulary built here and on SmolLM2's and Gemma 3's real ones; EOG is
 * allowed exactly when the grammar may end; uniform random sampling under the
 * mask always yields text the grammar accepts, and json.gbnf's parses as JSON
 * (json-c); hostile grammars and inputs hit limits, not crashes.
 *
 * It also prints how long a mask takes for json.gbnf on the real vocabularies
 * (median and p95 per token after the first): printed, never asserted.
 * The parts that need the GGUF models skip when the files are absent.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "clock.h"
#include "gguf.h"
#include "grammar.h"
#include "testutil.h"
#include "tokenizer.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

static char *read_file(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = 0;
		*ret_len = (size_t)n;
	}
	return buf;
}

/* tests/grammars/NAME, compiled; NULL (a failed check) if it does not. */
static struct grammar *load_grammar(const char *name)
{
	const char *dir = getenv("LLMD_SRCDIR");
	char path[4096], err[256] = "";
	struct grammar *g = NULL;
	size_t len;
	char *text;
	int rc;

	snprintf(path, sizeof path, "%s/tests/grammars/%s", dir ? dir : ".", name);
	text = read_file(path, &len);
	if (!text) {
		fprintf(stderr, "cannot read %s\n", path);
		test_failures++;
		return NULL;
	}
	rc = grammar_parse(text, len, NULL, &g, err, sizeof err);
	if (rc) {
		fprintf(stderr, "%s: %s\n", name, err);
		test_failures++;
	}
	free(text);
	return rc ? NULL : g;
}

static struct grammar *compile(const char *text)
{
	char err[256] = "";
	struct grammar *g = NULL;

	if (grammar_parse(text, strlen(text), NULL, &g, err, sizeof err)) {
		fprintf(stderr, "cannot compile %s: %s\n", text, err);
		test_failures++;
		return NULL;
	}
	return g;
}

static inline int bit(const uint32_t *m, int32_t t)
{
	return (m[t >> 5] >> (t & 31)) & 1;
}

/* A vocabulary held by the test: the bytes of each token. */
struct tvocab {
	int32_t n;             /* tokens */
	char **bytes;          /* (n) */
	size_t *lens;          /* (n) */
	int32_t eog[8];        /* end-of-generation ids */
	int n_eog;
	struct grammar_vocab *gv;
};

static void tvocab_free(struct tvocab *tv)
{
	if (!tv)
		return;
	for (int32_t i = 0; i < tv->n; i++)
		free(tv->bytes[i]);
	free(tv->bytes);
	free(tv->lens);
	grammar_vocab_free(tv->gv);
	free(tv);
}

static int tvocab_build(struct tvocab *tv)
{
	int rc = grammar_vocab_new((const char *const *)tv->bytes, tv->lens, tv->n, tv->eog,
				   tv->n_eog, &tv->gv);
	CHECK_INT_EQ(rc, 0);
	return rc;
}

/* The first token whose bytes are exactly S, or -1. */
static int32_t tvocab_find(const struct tvocab *tv, const char *s, size_t n)
{
	for (int32_t i = 0; i < tv->n; i++)
		if (tv->lens[i] == n && !memcmp(tv->bytes[i], s, n))
			return i;
	return -1;
}

/* The small vocabulary: printable ASCII, some words and JSON pieces, UTF-8
 * characters whole and split, invalid bytes, a NUL token, control tokens
 * with no bytes, two EOG tokens. */
static struct tvocab *synth_vocab(void)
{
	static const char *const words[] = {
		"{\"", "\":", "\",", "\"}", "}\n", "[1", "true", "false", "null", "  ", "\n  ",
		"ab", "abc", "12", "3.", "e+", "\\u00", "\\n", "- ", "x\n", "+1", "(a", ")=",
		" =", "= ", "1\n", "\": \"", "\"]", "[]", "{}", "0.5", "-1", "1e9", "\\\"",
		"é", "\xc3", "\xa9", "\xe3\x81", "\x93", "\xe3", "\x81\x93", "こ", "ん",
		"\xf0\x9f\x98\x80", "\xf0\x9f", "\x98\x80", "\xf0\x9f\x98", "\x80",
		"\xc0\x80", "\xff", "\xe2\x80\xa8", "\xc2\x85", "a\xc3", "\xa9z",
		"Nf3", "O-O", "1. ", "e4", " e5", "xd5", "int ", "main", "(){", "return 0;}",
		"void", "\r\n",
	};
	struct tvocab *tv = calloc(1, sizeof *tv);
	int32_t n = 0, cap = 256;

	tv->bytes = calloc((size_t)cap, sizeof *tv->bytes);
	tv->lens = calloc((size_t)cap, sizeof *tv->lens);
	/* 0..2: control tokens (no bytes), 3: a NUL inside */
	for (int i = 0; i < 3; i++) {
		tv->bytes[n] = calloc(1, 1);
		tv->lens[n++] = 0;
	}
	tv->bytes[n] = malloc(3);
	memcpy(tv->bytes[n], "a\0b", 3);
	tv->lens[n++] = 3;
	for (int c = 0x20; c < 0x7f; c++) {
		tv->bytes[n] = malloc(1);
		tv->bytes[n][0] = (char)c;
		tv->lens[n++] = 1;
	}
	for (const char *c = "\n\t\r"; *c; c++) {
		tv->bytes[n] = malloc(1);
		tv->bytes[n][0] = *c;
		tv->lens[n++] = 1;
	}
	for (size_t i = 0; i < ARRAY_LEN(words); i++) {
		tv->lens[n] = strlen(words[i]);
		tv->bytes[n] = malloc(tv->lens[n] + 1);
		memcpy(tv->bytes[n], words[i], tv->lens[n] + 1);
		n++;
	}
	/* a duplicate of "a" (SentencePiece has byte tokens beside letters) */
	tv->bytes[n] = strdup("a");
	tv->lens[n++] = 1;
	/* two EOG tokens with no bytes */
	for (int i = 0; i < 2; i++) {
		tv->bytes[n] = calloc(1, 1);
		tv->lens[n] = 0;
		tv->eog[tv->n_eog++] = n++;
	}
	tv->n = n;
	if (tvocab_build(tv)) {
		tvocab_free(tv);
		return NULL;
	}
	return tv;
}

/* The vocabulary of the GGUF at PATH, pieces as raw bytes; EOG as the
 * tokenizer says.  *RET_T: its tokenizer (for encoding), or NULL. */
static struct tvocab *gguf_vocab(const char *path, struct tokenizer **ret_t)
{
	char err[256] = "";
	struct gguf_file *f = NULL;
	struct tokenizer *t = NULL;
	struct tvocab *tv;
	char buf[1024];

	if (gguf_open(path, &f, err, sizeof err) || tokenizer_from_gguf(f, &t, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		gguf_close(f);
		return NULL;
	}
	gguf_close(f);
	tv = calloc(1, sizeof *tv);
	tv->n = tokenizer_n_vocab(t);
	tv->bytes = calloc((size_t)tv->n, sizeof *tv->bytes);
	tv->lens = calloc((size_t)tv->n, sizeof *tv->lens);
	for (int32_t i = 0; i < tv->n; i++) {
		int n = tokenizer_piece(t, i, 0, buf, sizeof buf);
		if (n < 0 || n > (int)sizeof buf)
			n = 0;
		tv->bytes[i] = malloc((size_t)n + 1);
		memcpy(tv->bytes[i], buf, (size_t)n);
		tv->lens[i] = (size_t)n;
		if (tokenizer_is_eog(t, i) && tv->n_eog < (int)ARRAY_LEN(tv->eog))
			tv->eog[tv->n_eog++] = i;
	}
	if (tvocab_build(tv)) {
		tvocab_free(tv);
		tokenizer_free(t);
		return NULL;
	}
	*ret_t = t;
	return tv;
}

static int is_eog(const struct tvocab *tv, int32_t t)
{
	for (int i = 0; i < tv->n_eog; i++)
		if (tv->eog[i] == t)
			return 1;
	return 0;
}

/* The mask of S against brute force over the whole vocabulary: token t is
 * allowed iff a clone of S accepts it; EOG iff S can end; tokens with no
 * bytes never.  Returns the number of allowed tokens, -1 on a mismatch. */
static int check_mask(struct grammar_state *s, const struct tvocab *tv, const char *where)
{
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m = malloc(words * sizeof *m);
	int n = grammar_state_mask(s, m), bad = 0, count = 0;

	if (n < 0) {
		fprintf(stderr, "%s: mask failed: %d\n", where, n);
		test_failures++;
		free(m);
		return -1;
	}
	for (int32_t t = 0; t < tv->n; t++) {
		struct grammar_state *c;
		int ok;
		if (grammar_state_clone(s, &c)) {
			test_failures++;
			break;
		}
		ok = grammar_state_accept(c, t) == 0;
		grammar_state_free(c);
		if (ok != bit(m, t)) {
			if (bad++ < 5)
				fprintf(stderr, "%s: token %d (\"%.*s\"): mask %d, accept %d\n", where,
					t, (int)tv->lens[t], tv->bytes[t], bit(m, t), ok);
		}
		if (is_eog(tv, t) && bit(m, t) != grammar_state_can_end(s)) {
			fprintf(stderr, "%s: EOG %d: mask %d, can_end %d\n", where, t, bit(m, t),
				grammar_state_can_end(s));
			bad++;
		}
		if (!tv->lens[t] && !is_eog(tv, t) && bit(m, t)) {
			fprintf(stderr, "%s: token %d with no bytes allowed\n", where, t);
			bad++;
		}
		count += bit(m, t);
	}
	for (size_t k = (size_t)tv->n; k < words * 32; k++)
		if (bit(m, (int32_t)k))
			bad++;
	if (count != n) {
		fprintf(stderr, "%s: mask returned %d, has %d bits\n", where, n, count);
		bad++;
	}
	free(m);
	if (bad) {
		test_failures++;
		return -1;
	}
	return n;
}

/* Feeds TEXT byte by byte to a fresh state of G: the byte offset of the
 * first byte refused, or -1 if all were taken; *RET_END: the state could
 * end after the last. */
static long feed(const struct grammar *g, const struct grammar_vocab *v, const char *text,
		 size_t len, int *ret_end)
{
	struct grammar_state *s;
	long at = -1;

	if (grammar_state_new(g, v, &s)) {
		test_failures++;
		return -2;
	}
	for (size_t i = 0; i < len; i++) {
		if (grammar_state_accept_bytes(s, text + i, 1)) {
			at = (long)i;
			break;
		}
	}
	if (ret_end)
		*ret_end = at < 0 && grammar_state_can_end(s);
	grammar_state_free(s);
	return at;
}

/* TEXT is a complete sentence of G. */
static int accepts(const struct grammar *g, const struct grammar_vocab *v, const char *text)
{
	int end = 0;

	return feed(g, v, text, strlen(text), &end) == -1 && end;
}

#define CHECK_ACCEPTS(g, v, text) do { \
	if (!accepts(g, v, text)) { \
		fprintf(stderr, "%s:%d: \"%s\" not accepted\n", __FILE__, __LINE__, text); \
		test_failures++; \
	} \
} while (0)

/* TEXT is refused at byte AT (-1: all taken but the state cannot end). */
#define CHECK_REFUSES_AT(g, v, text, at) do { \
	int _end = 0; \
	long _got = feed(g, v, text, strlen(text), &_end); \
	if (_got != (at) || (_got == -1 && _end)) { \
		fprintf(stderr, "%s:%d: \"%s\" refused at %ld (end %d), expected %ld\n", \
			__FILE__, __LINE__, text, _got, _end, (long)(at)); \
		test_failures++; \
	} \
} while (0)

/* ---- parse errors ---- */

struct bad_grammar {
	const char *text;  /* GBNF */
	int rc;            /* expected return */
	const char *err;   /* expected start of the message */
};

static void test_errors(void)
{
	static const struct bad_grammar cases[] = {
		{ "root ::= foo", -EINVAL, "line 1, column 10: undefined rule 'foo'" },
		{ "root ::= \"a\"\nx ::= \"b\" y\n", -EINVAL, "line 2, column 11: undefined rule 'y'" },
		{ "root ::= \"abc", -EINVAL, "line 1, column 10: unterminated string literal" },
		{ "root ::= [a-z", -EINVAL, "line 1, column 10: unterminated character class" },
		{ "root := \"a\"", -EINVAL, "line 1, column 6: expecting '::=' after rule name 'root'" },
		{ "root ::= (\"a\"", -EINVAL, "line 1, column 14: expecting ')'" },
		{ "root ::= \"a\" )", -EINVAL, "line 1, column 14: expecting newline or end of rule" },
		{ "root ::= \"\\q\"", -EINVAL, "line 1, column 11: unknown escape '\\q'" },
		{ "root ::= \"\\x4\"", -EINVAL, "line 1, column 14: expecting 2 hex digits" },
		{ "root ::= \"\\U00110000\"", -EINVAL, "line 1, column 11: code point U+110000" },
		{ "root ::= * \"a\"", -EINVAL, "line 1, column 10: expecting an item before '*'" },
		{ "root ::= \"a\" | +", -EINVAL, "line 1, column 16: expecting an item before '+'" },
		{ "root ::= \"a\"{3,2}", -EINVAL, "line 1, column 13: repetition {3,2}" },
		{ "root ::= \"a\"{x}", -EINVAL, "line 1, column 14: expecting a number" },
		{ "root ::= \"a\"{2;3}", -EINVAL, "line 1, column 15: expecting ',' or '}'" },
		{ "root ::= \"a\"{2,3", -EINVAL, "line 1, column 17: expecting '}'" },
		{ "root ::= \"a\"{2001}", -E2BIG, "line 1, column 14: repetition count 2001" },
		{ "root ::= \"a\"{1,99999999999999999999999}", -E2BIG, "line 1, column 16: repetition" },
		{ "root ::= <think> \"a\"", -EINVAL, "line 1, column 10: token terminals" },
		{ "root ::= !<[12]>", -EINVAL, "line 1, column 10: token terminals" },
		{ "root ::= [z-a]", -EINVAL, "line 1, column 11: character range z-a is backwards" },
		{ "root ::= []", -EINVAL, "line 1, column 10: empty character class" },
		{ "root ::= \"a\"\n  | \"b\"\n", -EINVAL, "line 2, column 3: expecting a rule name" },
		{ "root ::= \"a\"\n\n# comment\nx ::= (\n  \"b\" |\n  \"c\" ]\n)\n", -EINVAL,
		  "line 6, column 7: expecting ')'" },
		{ "root ::= \"é\" \"\\u00e9\" foo", -EINVAL, "line 1, column 23: undefined rule 'foo'" },
		{ "root ::= a\na ::= root \"x\" | \"y\"\n", -EINVAL,
		  "line 1, column 1: left recursion: 'root' can reach itself" },
		{ "root ::= \"x\" a\na ::= b? c a \"z\" | \"y\"\nb ::= \"b\"\nc ::= \"\" | \"c\"\n",
		  -EINVAL, "line 2, column 1: left recursion: 'a'" },
		{ "root ::= \"x\" (a)*\na ::= \"\"\n", -EINVAL,
		  "line 1, column 1: left recursion: a group or repetition in 'root'" },
		{ "x ::= \"a\"\n", -EINVAL, "no rule named 'root'" },
		{ "", -EINVAL, "no rule named 'root'" },
		{ "root ::= \"a\xff\"", -EINVAL, "line 1, column 12: invalid UTF-8" },
	};
	char err[256];

	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		struct grammar *g = NULL;
		int rc;
		strcpy(err, "(none)");
		rc = grammar_parse(cases[i].text, strlen(cases[i].text), NULL, &g, err, sizeof err);
		if (rc != cases[i].rc || strncmp(err, cases[i].err, strlen(cases[i].err))) {
			fprintf(stderr, "case %zu \"%s\": %d \"%s\", expected %d \"%s...\"\n", i,
				cases[i].text, rc, err, cases[i].rc, cases[i].err);
			test_failures++;
		}
		CHECK(g == NULL);
		grammar_free(g);
	}
	/* a NUL byte in the text; another root name */
	{
		struct grammar *g = NULL;
		CHECK_INT_EQ(grammar_parse("root ::= \"a\0\"", 13, NULL, &g, err, sizeof err), -EINVAL);
		CHECK(strstr(err, "line 1, column 12: NUL byte") == err);
		CHECK_INT_EQ(grammar_parse("x ::= \"a\"", 9, "y", &g, err, sizeof err), -EINVAL);
		CHECK_STR_EQ(err, "no rule named 'y' (the start rule)");
		CHECK_INT_EQ(grammar_parse("x ::= \"a\"", 9, "x", &g, err, sizeof err), 0);
		grammar_free(g);
	}
}

/* ---- the example grammars and the language of each construct ---- */

static void test_examples_parse(void)
{
	static const char *const names[] = {
		"json.gbnf", "json_arr.gbnf", "arithmetic.gbnf", "list.gbnf", "c.gbnf",
		"chess.gbnf", "english.gbnf", "japanese.gbnf",
	};

	for (size_t i = 0; i < ARRAY_LEN(names); i++) {
		struct grammar *g = load_grammar(names[i]);
		CHECK(g != NULL);
		if (g)
			printf("%-16s %5u rules %6u elements\n", names[i], grammar_n_rules(g),
			       grammar_n_elems(g));
		grammar_free(g);
	}
}

static void test_language(const struct tvocab *tv)
{
	const struct grammar_vocab *v = tv->gv;
	struct grammar *g;

	/* repetitions */
	g = compile("root ::= \"a\"{2,4} \"b\"? [0-9]* \"c\"+ \"d\"{3} \"e\"{2,}\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "aacddd" "ee");
		CHECK_ACCEPTS(g, v, "aaaab123cccdddeeeee");
		CHECK_REFUSES_AT(g, v, "acddd", 1);      /* one a */
		CHECK_REFUSES_AT(g, v, "aaaaa", 4);      /* five a */
		CHECK_REFUSES_AT(g, v, "aacdddd", 6);    /* four d */
		CHECK_REFUSES_AT(g, v, "aacddde", -1);   /* one e: not complete */
		grammar_free(g);
	}
	g = compile("root ::= (\"ab\" | \"c\"){0,2} \"x\"\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "x");
		CHECK_ACCEPTS(g, v, "abcx");
		CHECK_ACCEPTS(g, v, "ccx");
		CHECK_REFUSES_AT(g, v, "abcab", 3);
		grammar_free(g);
	}
	/* repetition of a repetition, and llama.cpp's rewrite of {m} then ? */
	g = compile("root ::= \"a\"*? \"b\"\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "b");
		CHECK_ACCEPTS(g, v, "aaab");
		grammar_free(g);
	}
	/* escapes, classes, any character, comments, rules over several lines */
	g = compile("# a comment\n"
		    "root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\" [\\]\\-\\\\a-c]+ . tail # end\n"
		    "tail ::= (\n"
		    "    [^a-z\\n] |   # not a lowercase letter\n"
		    "    \"é\"\n"
		    "  ) \"!\" |\n"
		    "  \"?\"\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "Aé😀\t\"\\]-\\ab\n?");
		CHECK_ACCEPTS(g, v, "Aé😀\t\"\\c😀Z!");
		CHECK_ACCEPTS(g, v, "Aé😀\t\"\\a.é!");
		CHECK_REFUSES_AT(g, v, "Aé😀\t\"\\d", 10);
		CHECK_REFUSES_AT(g, v, "Aé😀\t\"\\aazz!", 13);
		grammar_free(g);
	}
	/* ambiguity: several parses alive at once */
	g = compile("root ::= x \"b\" | \"a\" y\nx ::= \"a\" | \"ab\"\ny ::= \"bb\" | \"b\"\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "ab");
		CHECK_ACCEPTS(g, v, "abb");
		CHECK_REFUSES_AT(g, v, "abbb", 3);
		grammar_free(g);
	}
	/* a later definition replaces an earlier one, as in llama.cpp */
	g = compile("root ::= x\nx ::= \"1\"\nx ::= \"2\"\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "2");
		CHECK_REFUSES_AT(g, v, "1", 0);
		grammar_free(g);
	}
	/* UTF-8: code points, split across inputs, invalid sequences */
	g = load_grammar("japanese.gbnf");
	if (g) {
		int end = 0;
		CHECK_ACCEPTS(g, v, "こんにちは 世界");
		CHECK_REFUSES_AT(g, v, "こんab", 6);
		CHECK_REFUSES_AT(g, v, "\xe3\x41", 1);     /* a lead byte, then ASCII */
		CHECK_REFUSES_AT(g, v, "\xc0\x80", 0);     /* overlong */
		CHECK_REFUSES_AT(g, v, "é", 0);            /* a character outside the classes */
		CHECK_INT_EQ(feed(g, v, "\xe3\x81", 2, &end), -1);
		CHECK(!end);                               /* inside a character: cannot end */
		grammar_free(g);
	}
	g = compile("root ::= .+\n");
	if (g) {
		CHECK_ACCEPTS(g, v, "\n\t😀\xf4\x8f\xbf\xbf");
		CHECK_REFUSES_AT(g, v, "a\xed\xa0\x80", 2); /* a surrogate */
		CHECK_REFUSES_AT(g, v, "\xf4\x90\x80\x80", 1); /* past U+10FFFF */
		CHECK_REFUSES_AT(g, v, "\x80", 0);
		grammar_free(g);
	}
	/* done: complete and nothing may follow */
	g = compile("root ::= \"ab\" \"c\"?\n");
	if (g) {
		struct grammar_state *s;
		CHECK_INT_EQ(grammar_state_new(g, v, &s), 0);
		CHECK(!grammar_state_can_end(s) && !grammar_state_done(s));
		CHECK_INT_EQ(grammar_state_accept_bytes(s, "ab", 2), 0);
		CHECK(grammar_state_can_end(s) && !grammar_state_done(s));
		CHECK_INT_EQ(grammar_state_accept_bytes(s, "c", 1), 0);
		CHECK(grammar_state_can_end(s) && grammar_state_done(s));
		CHECK_INT_EQ(grammar_state_accept_bytes(s, "c", 1), -EINVAL);
		CHECK_INT_EQ(grammar_state_accept(s, tv->eog[0]), 0);
		CHECK(grammar_state_done(s) && !grammar_state_can_end(s));
		CHECK_INT_EQ(grammar_state_accept(s, tv->eog[0]), -EINVAL);
		grammar_state_free(s);
		grammar_free(g);
	}
}

/* json, arithmetic and list: valid text taken, invalid text refused at the
 * character where it goes wrong. */
static void test_examples_match(const struct tvocab *tv)
{
	const struct grammar_vocab *v = tv->gv;
	struct grammar *g;

	if ((g = load_grammar("json.gbnf"))) {
		CHECK_ACCEPTS(g, v, "{}");
		CHECK_ACCEPTS(g, v, "{\"a\": 1}");
		CHECK_ACCEPTS(g, v, "{\"a\":[1, -2.5e+3, \"x\\n\\u00e9\", true, false, null, {}],\n"
			      "  \"b\": {\"c\": \"é😀\"}} ");
		CHECK_ACCEPTS(g, v, "{\"n\": 0, \"m\": 1234567890123456}");
		CHECK_REFUSES_AT(g, v, "{\"a\": tru}", 9);
		CHECK_REFUSES_AT(g, v, "[1]", 0);              /* root is an object */
		CHECK_REFUSES_AT(g, v, "{\"a\": 01}", 7);      /* no leading zero */
		CHECK_REFUSES_AT(g, v, "{\"a\": \"x\ty\"}", 8); /* a raw tab in a string */
		CHECK_REFUSES_AT(g, v, "{\"a\": \"\\x\"}", 8); /* unknown escape */
		CHECK_REFUSES_AT(g, v, "{\"a\" 1}", 5);
		CHECK_REFUSES_AT(g, v, "{\"a\": 1,}", 8);
		CHECK_REFUSES_AT(g, v, "{\"a\": 1", -1);       /* incomplete */
		CHECK_REFUSES_AT(g, v, "{}}", 2);
		grammar_free(g);
	}
	if ((g = load_grammar("arithmetic.gbnf"))) {
		CHECK_ACCEPTS(g, v, "1+2=3\n");
		CHECK_ACCEPTS(g, v, "(x1 +y_2) *3 = z\nfoo/2=bar\n");
		CHECK_REFUSES_AT(g, v, "1+=3\n", 2);
		CHECK_REFUSES_AT(g, v, "1+2=3", -1);
		CHECK_REFUSES_AT(g, v, "Ab=1\n", 0);
		CHECK_REFUSES_AT(g, v, "(1=2\n", 2);
		grammar_free(g);
	}
	if ((g = load_grammar("list.gbnf"))) {
		CHECK_ACCEPTS(g, v, "- a\n- bé 😀\n");
		CHECK_REFUSES_AT(g, v, "- a\n-b\n", 5);
		CHECK_REFUSES_AT(g, v, "- \n", 2);
		CHECK_REFUSES_AT(g, v, "- a\r\n", 3);
		CHECK_REFUSES_AT(g, v, "- a\xe2\x80\xa8", 5); /* U+2028 is excluded */
		CHECK_REFUSES_AT(g, v, "- a\xc2\x85", 4);     /* so is U+0085 */
		grammar_free(g);
	}
	if ((g = load_grammar("chess.gbnf"))) {
		CHECK_ACCEPTS(g, v, "1. e4 e5\n2. Nf3 Nc6\n3. O-O Qxd8+\n");
		CHECK_REFUSES_AT(g, v, "1. e9", 4);
		grammar_free(g);
	}
	if ((g = load_grammar("c.gbnf"))) {
		CHECK_ACCEPTS(g, v, "int main(){return 0;}");
		CHECK_ACCEPTS(g, v, "int f(int x){while(x<10){x = x+1;}return x;}");
		grammar_free(g);
	}
}

/* ---- masks against brute force, random sampling ---- */

/* A walk: tokens picked uniformly among the allowed ones, every mask checked
 * against brute force (CHECK_EVERY: each step; else a few), then (CLOSER)
 * tokens picked to finish soon.  Returns the text made (malloc'd) and in
 * *RET_ENDED whether an EOG was accepted. */
struct walk_opts {
	int steps;              /* uniform picks before closing */
	int max_steps;          /* all picks */
	int brute_every;        /* check a mask every this many steps (0 = never) */
	const int32_t *closer;  /* preferred tokens when closing, in order */
	int n_closer;
	int eog_pct;            /* % chance of EOG when it is allowed, uniform phase */
};

static char *walk(const struct grammar *g, const struct tvocab *tv, const struct walk_opts *o,
		  const char *name, int *ret_ended, size_t *ret_len)
{
	size_t words = grammar_vocab_mask_words(tv->gv), len = 0, cap = 256;
	uint32_t *m = malloc(words * sizeof *m);
	int32_t *allowed = malloc((size_t)tv->n * sizeof *allowed);
	char *text = malloc(cap), where[128];
	struct grammar_state *s;
	int ended = 0;

	if (grammar_state_new(g, tv->gv, &s)) {
		test_failures++;
		free(m);
		free(allowed);
		free(text);
		return NULL;
	}
	for (int step = 0; step < o->max_steps && !ended; step++) {
		int n, k = 0;
		int32_t pick = -1;
		if (o->brute_every && step % o->brute_every == 0) {
			snprintf(where, sizeof where, "%s step %d", name, step);
			if (check_mask(s, tv, where) < 0)
				break;
		}
		n = grammar_state_mask(s, m);
		if (n <= 0) {
			fprintf(stderr, "%s step %d: %d tokens allowed\n", name, step, n);
			test_failures++;
			break;
		}
		for (int32_t t = 0; t < tv->n; t++)
			if (bit(m, t) && !is_eog(tv, t))
				allowed[k++] = t;
		CHECK_INT_EQ(k + (grammar_state_can_end(s) ? tv->n_eog : 0), n);
		if (step < o->steps) {
			/* uniform among the allowed tokens but EOG, which comes with
			 * its own odds */
			if (grammar_state_can_end(s) && (!k || (int)(rnd() % 100) < o->eog_pct))
				pick = tv->eog[0];
			else
				pick = allowed[rnd() % (uint32_t)k];
		} else {
			if (grammar_state_can_end(s))
				pick = tv->eog[0];
			for (int c = 0; pick < 0 && c < o->n_closer; c++)
				if (o->closer[c] >= 0 && bit(m, o->closer[c]))
					pick = o->closer[c];
			if (pick < 0 && k)
				pick = allowed[rnd() % (uint32_t)k];
			if (pick < 0)
				break;
		}
		if (grammar_state_accept(s, pick)) {
			fprintf(stderr, "%s step %d: allowed token %d refused\n", name, step, pick);
			test_failures++;
			break;
		}
		if (is_eog(tv, pick)) {
			ended = 1;
			CHECK(grammar_state_done(s));
			break;
		}
		if (len + tv->lens[pick] + 1 > cap) {
			cap = 2 * (len + tv->lens[pick] + 1);
			text = realloc(text, cap);
		}
		memcpy(text + len, tv->bytes[pick], tv->lens[pick]);
		len += tv->lens[pick];
	}
	text[len] = 0;
	grammar_state_free(s);
	free(m);
	free(allowed);
	*ret_ended = ended;
	*ret_len = len;
	return text;
}

/* TEXT is valid JSON (json-c), trailing whitespace aside. */
static int is_json(const char *text, size_t len)
{
	struct json_tokener *tok = json_tokener_new_ex(4096);
	struct json_object *o = json_tokener_parse_ex(tok, text, (int)len);
	size_t end = json_tokener_get_parse_end(tok);
	int ok = o != NULL && json_tokener_get_error(tok) == json_tokener_success;

	while (ok && end < len && strchr(" \t\n\r", text[end]))
		end++;
	ok = ok && end == len;
	json_object_put(o);
	json_tokener_free(tok);
	return ok;
}

/* The closing tokens for json.gbnf: a quote first (closes a string, starts an
 * empty one), then brackets, a colon, a digit. */
static int closers_json(const struct tvocab *tv, int32_t *out)
{
	static const char *const s[] = { "\"", "}", "]", ":", "0", "e", "l", "u", "s" };
	int n = 0;

	for (size_t i = 0; i < ARRAY_LEN(s); i++)
		out[n++] = tvocab_find(tv, s[i], strlen(s[i]));
	return n;
}

static void sample_json(const struct grammar *g, const struct tvocab *tv, const char *name,
			int walks, int steps, int brute_every)
{
	int32_t closer[16];
	struct walk_opts o = { steps, 4000, brute_every, closer, 0, 0 };
	int ended_all = 1;

	o.n_closer = closers_json(tv, closer);
	for (int i = 0; i < walks; i++) {
		int ended = 0;
		size_t len = 0;
		char where[64];
		char *text;
		snprintf(where, sizeof where, "%s walk %d", name, i);
		text = walk(g, tv, &o, where, &ended, &len);
		if (!text)
			continue;
		ended_all &= ended;
		if (ended && (!accepts(g, tv->gv, text) || !is_json(text, len))) {
			fprintf(stderr, "%s: sampled text is not valid: %s\n", where, text);
			test_failures++;
		}
		if (i == 0)
			printf("%s: %.160s%s\n", where, text, len > 160 ? "..." : "");
		free(text);
	}
	CHECK(ended_all);
}

static void test_masks_synth(const struct tvocab *tv)
{
	static const char *const names[] = {
		"json.gbnf", "json_arr.gbnf", "arithmetic.gbnf", "list.gbnf", "c.gbnf",
		"chess.gbnf", "english.gbnf", "japanese.gbnf",
	};

	for (size_t i = 0; i < ARRAY_LEN(names); i++) {
		struct grammar *g = load_grammar(names[i]);
		int32_t closer[16];
		struct walk_opts o = { 60, 400, 1, closer, 0, 20 };
		if (!g)
			continue;
		if (!strcmp(names[i], "json.gbnf") || !strcmp(names[i], "json_arr.gbnf"))
			o.n_closer = closers_json(tv, closer);
		for (int w = 0; w < 6; w++) {
			int ended = 0;
			size_t len = 0;
			char where[64];
			char *text;
			snprintf(where, sizeof where, "synth %s walk %d", names[i], w);
			text = walk(g, tv, &o, where, &ended, &len);
			if (!text)
				continue;
			/* whatever was sampled is a prefix the grammar takes, and
			 * complete when EOG was picked */
			{
				int end = 0;
				long at = feed(g, tv->gv, text, len, &end);
				if (at != -1 || (ended && !end)) {
					fprintf(stderr, "%s: sampled \"%s\" refused at %ld\n", where, text, at);
					test_failures++;
				}
			}
			if (ended && !strcmp(names[i], "json.gbnf") && !is_json(text, len)) {
				fprintf(stderr, "%s: not JSON: %s\n", where, text);
				test_failures++;
			}
			free(text);
		}
		grammar_free(g);
	}
	/* the small grammars of test_language, too */
	{
		static const char *const small[] = {
			"root ::= x \"b\" | \"a\" y\nx ::= \"a\" | \"ab\"\ny ::= \"bb\" | \"b\"\n",
			"root ::= (\"ab\" | \"c\"){0,2} \"x\"\n",
			"root ::= [^a]* \"a\"\n",
			"root ::= . .? \"z\"\n",
			"root ::= \"é\"+ | \"\\u00e9z\" | [\\u3000-\\u30ff]{1,3}\n",
		};
		for (size_t i = 0; i < ARRAY_LEN(small); i++) {
			struct grammar *g = compile(small[i]);
			struct walk_opts o = { 20, 40, 1, NULL, 0, 30 };
			if (!g)
				continue;
			for (int w = 0; w < 10; w++) {
				int ended = 0;
				size_t len = 0;
				char *text = walk(g, tv, &o, small[i], &ended, &len);
				if (text && ended && !accepts(g, tv->gv, text)) {
					fprintf(stderr, "small %zu: \"%s\" not accepted\n", i, text);
					test_failures++;
				}
				free(text);
			}
			grammar_free(g);
		}
	}
	/* random JSON documents */
	{
		struct grammar *g = load_grammar("json.gbnf");
		if (g) {
			sample_json(g, tv, "synth json", 30, 80, 7);
			grammar_free(g);
		}
	}
}

/* A clone moves on its own and shares the cache. */
static void test_clone(const struct tvocab *tv)
{
	struct grammar *g = load_grammar("json.gbnf");
	struct grammar_state *a, *b;
	struct grammar_stats st0, st1;
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m0 = calloc(words, sizeof *m0), *m1 = calloc(words, sizeof *m1);
	int n0;

	if (!g)
		return;
	CHECK_INT_EQ(grammar_state_new(g, tv->gv, &a), 0);
	CHECK_INT_EQ(grammar_state_accept_bytes(a, "{\"k\": ", 6), 0);
	n0 = grammar_state_mask(a, m0);
	CHECK(n0 > 0);
	CHECK_INT_EQ(grammar_state_clone(a, &b), 0);
	CHECK_INT_EQ(grammar_state_accept_bytes(b, "[1, 2", 5), 0);
	CHECK_INT_EQ(grammar_state_accept_bytes(a, "[1, 2", 4), 0);   /* a moves apart */
	CHECK_INT_EQ(grammar_state_accept_bytes(a, "x", 1), -EINVAL); /* refused: unchanged */
	CHECK_INT_EQ(grammar_state_accept_bytes(a, "2", 1), 0);
	grammar_state_stats(b, &st0);
	CHECK_INT_EQ(grammar_state_mask(b, m1) > 0, 1);
	grammar_state_stats(a, &st1);
	CHECK_INT_EQ(st1.masks, st0.masks + 1);
	/* a fresh clone at a's old place: its mask comes from the shared cache */
	{
		struct grammar_state *c;
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &c), 0);
		grammar_state_free(c);
	}
	grammar_state_free(a);
	CHECK_INT_EQ(grammar_state_mask(b, m1) > 0, 1); /* the cache outlives a */
	grammar_state_stats(b, &st1);
	CHECK(st1.mask_hits > st0.mask_hits);
	grammar_state_free(b);
	free(m0);
	free(m1);
	grammar_free(g);
}

/* Tokens that cannot be taken at all: no bytes, a NUL, out of range. */
static void test_odd_tokens(const struct tvocab *tv)
{
	struct grammar *g = compile("root ::= .*\n");
	struct grammar_state *s;
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m = calloc(words, sizeof *m);

	if (!g)
		return;
	CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
	CHECK(grammar_state_mask(s, m) > 0);
	for (int32_t t = 0; t < 4; t++) {
		CHECK(!bit(m, t));
		CHECK_INT_EQ(grammar_state_accept(s, t), -EINVAL);
	}
	CHECK_INT_EQ(grammar_state_accept(s, -1), -EINVAL);
	CHECK_INT_EQ(grammar_state_accept(s, tv->n), -EINVAL);
	CHECK(bit(m, tv->eog[0]) && bit(m, tv->eog[1]));
	/* after a lone lead byte only what continues it, and no EOG */
	CHECK_INT_EQ(grammar_state_accept(s, tvocab_find(tv, "\xf0\x9f", 2)), 0);
	CHECK(check_mask(s, tv, ".* after F0 9F") > 0);
	CHECK(!grammar_state_can_end(s));
	CHECK_INT_EQ(grammar_state_mask(s, m) > 0, 1);
	CHECK(!bit(m, tv->eog[0]));
	CHECK(bit(m, tvocab_find(tv, "\x98\x80", 2)) && bit(m, tvocab_find(tv, "\x80", 1)));
	CHECK(!bit(m, tvocab_find(tv, "a", 1)));
	grammar_state_free(s);
	free(m);
	grammar_free(g);
	/* bad vocabularies */
	{
		const char *b[2] = { "a", "b" };
		size_t l[2] = { 1, 1 };
		int32_t eog = 2;
		struct grammar_vocab *v = NULL;
		CHECK_INT_EQ(grammar_vocab_new(b, l, 2, &eog, 1, &v), -EINVAL);
		l[1] = GRAMMAR_MAX_TOKEN_BYTES + 1;
		CHECK_INT_EQ(grammar_vocab_new(b, l, 2, NULL, 0, &v), -E2BIG);
		CHECK(v == NULL);
	}
}

/* Long bounded repetitions: positions further from the end than a token can
 * reach share one table; masks agree with brute force all the way down,
 * through the positions near the end that have their own. */
static void test_long_repetition(const struct tvocab *tv)
{
	static const struct {
		const char *gbnf;   /* the grammar */
		const char *pick[3]; /* tokens to pick while allowed, in order */
		uint64_t max_tables; /* tables that 100 such picks may build */
	} cases[] = {
		{ "root ::= (\"ab\" | [c-e]){0,300} \"!\"\n", { "ab", "c", NULL }, 5 },
		{ "root ::= .{0,200} \"!\"\n", { "return 0;}", "abc", "a" }, 5 },
		/* three copies of the item, each with its inner chain's ends */
		{ "root ::= (\"x\" [a-c]{1,40}){3,50}\n", { "x", "abc", "a" }, 60 },
	};

	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		struct grammar *g = compile(cases[i].gbnf);
		int32_t closer[3];
		struct walk_opts o = { 0, 600, 1, closer, 0, 0 };
		struct grammar_state *s;
		struct grammar_stats st;
		int ended = 0;
		size_t len = 0;
		char *text;
		if (!g)
			continue;
		for (int k = 0; k < 3 && cases[i].pick[k]; k++)
			closer[o.n_closer++] = tvocab_find(tv, cases[i].pick[k],
							   strlen(cases[i].pick[k]));
		text = walk(g, tv, &o, cases[i].gbnf, &ended, &len);
		CHECK(ended);
		if (text && !accepts(g, tv->gv, text)) {
			fprintf(stderr, "%s: \"%s\" not accepted\n", cases[i].gbnf, text);
			test_failures++;
		}
		free(text);
		/* a fresh state's tables: the far positions share one */
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
		for (int k = 0; k < 100; k++) {
			uint32_t m[64];
			int32_t pick = -1;
			CHECK(grammar_vocab_mask_words(tv->gv) <= 64);
			CHECK(grammar_state_mask(s, m) > 0);
			for (int c = o.n_closer; c-- > 0;)
				if (bit(m, closer[c]))
					pick = closer[c];
			if (pick < 0)
				break;
			CHECK_INT_EQ(grammar_state_accept(s, pick), 0);
		}
		grammar_state_stats(s, &st);
		CHECK(st.tables <= cases[i].max_tables);
		grammar_state_free(s);
		grammar_free(g);
	}
}

/* A position whose tokens mostly leave its rule at once: its table is cut
 * lower, and the masks still agree with brute force. */
static void test_deepen(void)
{
	struct tvocab *tv = calloc(1, sizeof *tv);
	struct grammar *g;
	int32_t n = 0;

	tv->bytes = calloc(20000, sizeof *tv->bytes);
	tv->lens = calloc(20000, sizeof *tv->lens);
	for (int c = 0x20; c < 0x7f; c++) {
		tv->bytes[n] = malloc(2);
		tv->bytes[n][0] = (char)c;
		tv->lens[n++] = 1;
	}
	/* " aaa" ... " zzz": more tokens leave `sp` after its space than a
	 * table lists (CTX_MAX) */
	for (int a = 'a'; a <= 'z'; a++) {
		for (int b = 'a'; b <= 'z'; b++) {
			for (int c = 'a'; c <= 'z'; c++) {
				tv->bytes[n] = malloc(5);
				snprintf(tv->bytes[n], 5, " %c%c%c", a, b, c);
				tv->lens[n++] = 4;
			}
		}
	}
	tv->bytes[n] = strdup("\n");
	tv->lens[n++] = 1;
	tv->bytes[n] = calloc(1, 1);
	tv->eog[tv->n_eog++] = n++;
	tv->n = n;
	if (tvocab_build(tv)) {
		tvocab_free(tv);
		return;
	}
	g = compile("root ::= word+ \"\\n\"\nword ::= sp [a-z]+\nsp ::= \" \"\n");
	if (g) {
		struct grammar_state *s;
		struct grammar_stats st;
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
		CHECK_INT_EQ(check_mask(s, tv, "deepen: start"), 26 * 26 * 26 + 1);
		grammar_state_stats(s, &st);
		CHECK(st.deepened > 0);
		CHECK_INT_EQ(grammar_state_accept_bytes(s, " ab", 3), 0);
		CHECK_INT_EQ(check_mask(s, tv, "deepen: after a word"), 26 * 26 * 26 + 1 + 26 + 1);
		CHECK_INT_EQ(grammar_state_accept_bytes(s, " cd\n", 4), 0);
		CHECK_INT_EQ(check_mask(s, tv, "deepen: end"), 1);
		grammar_state_free(s);
		grammar_free(g);
	}
	tvocab_free(tv);
}

/* Clones of one prototype on several threads share its cache. */
struct thread_arg {
	const struct grammar *g;     /* json.gbnf */
	const struct tvocab *tv;     /* the small vocabulary */
	struct grammar_state *proto; /* shared */
	uint64_t seed;               /* the thread's random numbers */
	int bad;                     /* walks that went wrong */
};

static void *sample_thread(void *p)
{
	struct thread_arg *a = p;
	size_t words = grammar_vocab_mask_words(a->tv->gv);
	uint32_t *m = malloc(words * sizeof *m);
	uint64_t x = a->seed;

	for (int w = 0; w < 20; w++) {
		struct grammar_state *s;
		char text[4096];
		size_t len = 0;
		int ended = 0;
		if (grammar_state_clone(a->proto, &s)) {
			a->bad++;
			break;
		}
		for (int step = 0; step < 200 && !ended; step++) {
			int32_t pick = -1, k = 0;
			if (grammar_state_mask(s, m) <= 0) {
				a->bad++;
				break;
			}
			if (grammar_state_can_end(s) && (step > 40 || x % 4 == 0)) {
				pick = a->tv->eog[0];
			} else {
				int32_t want;
				for (int32_t t = 0; t < a->tv->n; t++)
					k += bit(m, t) && !is_eog(a->tv, t);
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				want = k ? (int32_t)((x >> 11) % (uint64_t)k) : 0;
				for (int32_t t = 0; t < a->tv->n && pick < 0; t++)
					if (bit(m, t) && !is_eog(a->tv, t) && want-- == 0)
						pick = t;
				if (pick < 0)
					pick = a->tv->eog[0];
			}
			if (grammar_state_accept(s, pick)) {
				a->bad++;
				break;
			}
			if (is_eog(a->tv, pick)) {
				ended = 1;
			} else if (len + a->tv->lens[pick] < sizeof text) {
				memcpy(text + len, a->tv->bytes[pick], a->tv->lens[pick]);
				len += a->tv->lens[pick];
			}
		}
		if (ended && !is_json(text, len))
			a->bad++;
		grammar_state_free(s);
	}
	free(m);
	return NULL;
}

static void test_threads(const struct tvocab *tv)
{
	struct grammar *g = load_grammar("json.gbnf");
	struct thread_arg args[4];
	pthread_t th[4];
	struct grammar_state *proto;

	if (!g)
		return;
	CHECK_INT_EQ(grammar_state_new(g, tv->gv, &proto), 0);
	for (int i = 0; i < 4; i++) {
		args[i].g = g;
		args[i].tv = tv;
		args[i].proto = proto;
		args[i].seed = 0x1234567ull * (uint64_t)(i + 1);
		args[i].bad = 0;
		CHECK_INT_EQ(pthread_create(&th[i], NULL, sample_thread, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK_INT_EQ(args[i].bad, 0);
	}
	grammar_state_free(proto);
	grammar_free(g);
}

/* ---- hostile grammars and inputs ---- */

static void test_hostile(const struct tvocab *tv)
{
	char err[256];
	struct grammar *g = NULL;
	struct grammar_state *s;
	size_t n;
	char *text;
	int64_t t0;

	/* parentheses nested 100000 deep: refused at the limit, no deep recursion */
	n = 100000;
	text = malloc(2 * n + 32);
	strcpy(text, "root ::= ");
	memset(text + 9, '(', n);
	memset(text + 9 + n, ')', n);
	text[9 + 2 * n] = 0;
	CHECK_INT_EQ(grammar_parse(text, strlen(text), NULL, &g, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "nested deeper than") != NULL);
	free(text);
	/* a literal repeated past the element limit */
	text = malloc(4096);
	strcpy(text, "root ::= \"");
	memset(text + 10, 'x', 1000);
	strcpy(text + 1010, "\"{2000}\n");
	CHECK_INT_EQ(grammar_parse(text, strlen(text), NULL, &g, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "elements") != NULL);
	free(text);
	/* nested repetitions multiply: x{2000} inside y{2000} */
	{
		const char *t = "root ::= ((\"ab\"{0,2000}){2000}){2000}\n";
		int64_t ta = clock_ns();
		int rc = grammar_parse(t, strlen(t), NULL, &g, err, sizeof err);
		CHECK(rc == 0 || rc == -E2BIG);
		CHECK(clock_ns() - ta < 5000000000ll);
		grammar_free(g);
		g = NULL;
	}
	/* more rules than the limit */
	n = 70000;
	text = malloc(n * 6 + 32);
	strcpy(text, "root ::= ");
	for (size_t i = 0; i < n; i++)
		memcpy(text + 9 + 5 * i, "(\"a\")", 5);
	text[9 + 5 * n] = 0;
	CHECK_INT_EQ(grammar_parse(text, strlen(text), NULL, &g, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "rules") != NULL);
	free(text);
	/* a grammar over the text limit */
	CHECK_INT_EQ(grammar_parse("x", (size_t)GRAMMAR_MAX_TEXT + 1, NULL, &g, err, sizeof err),
		     -E2BIG);

	/* exponential ambiguity: after n a's, 2^n different stacks */
	g = compile("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"\n");
	if (g) {
		int rc = 0, i;
		size_t words = grammar_vocab_mask_words(tv->gv);
		uint32_t *m = calloc(words, sizeof *m);
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
		for (i = 0; i < 40 && rc == 0; i++) {
			rc = grammar_state_mask(s, m);
			if (rc >= 0)
				rc = grammar_state_accept_bytes(s, "a", 1);
		}
		CHECK_INT_EQ(rc, -E2BIG);
		CHECK(i <= 12);
		grammar_state_free(s);
		free(m);
		grammar_free(g);
	}
	/* input nested past the stack depth limit */
	g = compile("root ::= \"(\" root \")\" | \"x\"\n");
	if (g) {
		int rc = 0, i;
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
		for (i = 0; i < 10000 && rc == 0; i++)
			rc = grammar_state_accept_bytes(s, "(", 1);
		CHECK_INT_EQ(rc, -E2BIG);
		CHECK(i > 1000);
		grammar_state_free(s);
		grammar_free(g);
	}
	/* a root whose first characters are more stacks than the limit */
	{
		size_t cap = 1500 * 48 + 64, k;
		text = malloc(cap);
		k = (size_t)snprintf(text, cap, "root ::= a0");
		for (int i = 1; i < 1500; i++)
			k += (size_t)snprintf(text + k, cap - k, " | a%d", i);
		k += (size_t)snprintf(text + k, cap - k, "\n");
		for (int i = 0; i < 1500; i++)
			k += (size_t)snprintf(text + k, cap - k, "a%d ::= \"%c\" b%d\nb%d ::= \"z\"\n",
					      i, 'a' + i % 26, i, i);
		g = NULL;
		CHECK_INT_EQ(grammar_parse(text, k, NULL, &g, err, sizeof err), 0);
		if (g) {
			s = NULL;
			CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), -E2BIG);
			CHECK(s == NULL);
			grammar_free(g);
		}
		free(text);
	}
	/* a large optional repetition of anything: bounded time per token */
	g = compile("root ::= .{0,2000} \"!\"\n");
	if (g) {
		size_t words = grammar_vocab_mask_words(tv->gv);
		uint32_t *m = calloc(words, sizeof *m);
		int rc = 0;
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
		t0 = clock_ns();
		for (int i = 0; i < 300 && rc >= 0; i++) {
			rc = grammar_state_mask(s, m);
			if (rc > 0)
				rc = grammar_state_accept_bytes(s, "ab", 2);
		}
		CHECK(rc >= 0);
		printf("hostile .{0,2000}: 300 tokens in %.1f ms\n", (clock_ns() - t0) / 1e6);
		grammar_state_free(s);
		free(m);
		grammar_free(g);
	}
}

/* ---- real vocabularies: brute force on a few states, sampling, timing ---- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static void report(const char *what, int64_t *ns, int n, const struct grammar_state *s)
{
	struct grammar_stats st;
	int64_t total = 0;

	if (n <= 1) {
		printf("%s: no samples\n", what);
		return;
	}
	for (int i = 0; i < n; i++)
		total += ns[i];
	grammar_state_stats(s, &st);
	/* the first mask (a fresh cache) is left out */
	qsort(ns + 1, (size_t)n - 1, sizeof *ns, cmp_i64);
	printf("%s: %d masks after the first: median %.1f us, p95 %.1f us, max %.1f us; "
	       "first %.1f us, all %.1f ms; cache %llu/%llu hits, %llu tables (%llu cut lower), "
	       "%llu tokens checked below, %.1f MiB\n", what, n - 1, ns[1 + (n - 1) / 2] / 1e3,
	       ns[1 + (size_t)((n - 1) * 0.95)] / 1e3, ns[n - 1] / 1e3, ns[0] / 1e3,
	       total / 1e6, (unsigned long long)st.mask_hits, (unsigned long long)st.masks,
	       (unsigned long long)st.tables, (unsigned long long)st.deepened,
	       (unsigned long long)st.ctx_checks, st.cache_bytes / 1048576.0);
}

static const char json_doc[] =
	"{\"name\": \"llmd\", \"version\": 3, \"tags\": [\"inference\", \"daemon\", \"gbnf\"],\n"
	" \"config\": {\"threads\": 8, \"ratio\": 0.75, \"enabled\": true, \"path\": null,\n"
	"  \"models\": [{\"id\": \"smollm2-135m\", \"size\": 135000000, \"quant\": \"Q4_1\"},\n"
	"   {\"id\": \"gemma-3-270m\", \"size\": 270000000, \"quant\": \"Q4_K_M\"}]},\n"
	" \"description\": \"A local LLM inference daemon: \\\"fast\\\", small \\u00e9t\\u00e9 "
	"and caf\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001F600.\",\n"
	" \"matrix\": [[1, 2, 3], [4, 5, 6], [-7.5, 8e12, 9.25E-3]],\n"
	" \"users\": [{\"name\": \"alice\", \"age\": 31, \"admin\": false},\n"
	"  {\"name\": \"bob\", \"age\": 27, \"admin\": true, \"email\": \"bob@example.com\"}]}";

/* Walks the tokens of json_doc (encoded by T) under json.gbnf: each token
 * must be allowed; times each mask. */
static void doc_walk(const struct grammar *g, const struct tvocab *tv, struct tokenizer *t,
		     const char *name, struct grammar_state *proto, int brute_steps)
{
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m = malloc(words * sizeof *m);
	int32_t ids[4096];
	int n = tokenizer_encode(t, json_doc, strlen(json_doc), 0, 0, ids, 4096), start = 0;
	int64_t *ns = malloc(((size_t)n + 1) * sizeof *ns);
	int64_t *acc_ns = malloc(((size_t)n + 1) * sizeof *acc_ns);
	struct grammar_state *s;
	char where[96];
	int k = 0, ka = 0;

	/* a SentencePiece encoder may put a space first: start after it */
	while (start < n && tv->lens[ids[start]] && tv->bytes[ids[start]][0] != '{')
		start++;
	if (start > 0)
		printf("%s: %d leading token(s) skipped\n", name, start);
	if (proto)
		CHECK_INT_EQ(grammar_state_clone(proto, &s), 0);
	else
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
	for (int i = start; i < n; i++) {
		int64_t t0 = clock_ns();
		int c = grammar_state_mask(s, m);
		ns[k++] = clock_ns() - t0;
		if (c <= 0 || !bit(m, ids[i])) {
			fprintf(stderr, "%s: token %d (%d \"%.*s\") not allowed\n", name, i, ids[i],
				(int)tv->lens[ids[i]], tv->bytes[ids[i]]);
			test_failures++;
			break;
		}
		if (i - start < brute_steps || (brute_steps && i % 40 == 0)) {
			snprintf(where, sizeof where, "%s token %d", name, i);
			check_mask(s, tv, where);
		}
		t0 = clock_ns();
		CHECK_INT_EQ(grammar_state_accept(s, ids[i]), 0);
		acc_ns[ka++] = clock_ns() - t0;
	}
	CHECK(grammar_state_can_end(s));
	{
		char what[160];
		snprintf(what, sizeof what, "%s, %d tokens", name, n - start);
		report(what, ns, k, s);
		qsort(acc_ns, (size_t)ka, sizeof *acc_ns, cmp_i64);
		if (ka)
			printf("%s: accept median %.1f us, p95 %.1f us\n", name,
			       acc_ns[ka / 2] / 1e3, acc_ns[(size_t)(ka * 0.95)] / 1e3);
	}
	grammar_state_free(s);
	free(acc_ns);
	free(ns);
	free(m);
}

/* Uniform sampling under the mask on a real vocabulary, timed. */
static void sample_walk_timed(const struct grammar *g, const struct tvocab *tv,
			      const char *name, int walks, int steps)
{
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m = malloc(words * sizeof *m);
	int32_t *allowed = malloc((size_t)tv->n * sizeof *allowed), closer[16];
	int64_t *ns = malloc((size_t)walks * 4001 * sizeof *ns);
	int n_closer = closers_json(tv, closer), k = 0, ended_all = 1;
	struct grammar_state *proto;
	size_t longest = 0;

	CHECK_INT_EQ(grammar_state_new(g, tv->gv, &proto), 0);
	for (int w = 0; w < walks; w++) {
		struct grammar_state *s;
		size_t len = 0, cap = 1024;
		char *text = malloc(cap);
		int ended = 0;
		CHECK_INT_EQ(grammar_state_clone(proto, &s), 0);
		for (int step = 0; step < 4000 && !ended; step++) {
			int64_t t0 = clock_ns();
			int c = grammar_state_mask(s, m), a = 0;
			int32_t pick = -1;
			ns[k++] = clock_ns() - t0;
			if (c <= 0) {
				fprintf(stderr, "%s walk %d step %d: %d allowed\n", name, w, step, c);
				test_failures++;
				break;
			}
			if (step >= steps) {
				if (grammar_state_can_end(s))
					pick = tv->eog[0];
				for (int q = 0; pick < 0 && q < n_closer; q++)
					if (closer[q] >= 0 && bit(m, closer[q]))
						pick = closer[q];
			}
			if (pick < 0) {
				for (int32_t t = 0; t < tv->n; t++)
					if (bit(m, t) && !is_eog(tv, t))
						allowed[a++] = t;
				pick = a ? allowed[rnd() % (uint32_t)a] : tv->eog[0];
			}
			if (grammar_state_accept(s, pick)) {
				fprintf(stderr, "%s: allowed %d refused\n", name, pick);
				test_failures++;
				break;
			}
			if (is_eog(tv, pick)) {
				ended = 1;
				break;
			}
			if (len + tv->lens[pick] + 1 > cap) {
				cap = 2 * (len + tv->lens[pick] + 1);
				text = realloc(text, cap);
			}
			memcpy(text + len, tv->bytes[pick], tv->lens[pick]);
			len += tv->lens[pick];
		}
		text[len] = 0;
		ended_all &= ended;
		if (ended && (!accepts(g, tv->gv, text) || !is_json(text, len))) {
			fprintf(stderr, "%s walk %d: not valid JSON: %s\n", name, w, text);
			test_failures++;
		}
		if (len > longest) {
			longest = len;
			printf("%s sample %d: %.300s%s\n", name, w, text, len > 300 ? "..." : "");
		}
		free(text);
		grammar_state_free(s);
	}
	CHECK(ended_all);
	{
		char what[160];
		snprintf(what, sizeof what, "%s random, %d walks, %zu bytes at most", name, walks,
			 longest);
		report(what, ns, k, proto);
	}
	grammar_state_free(proto);
	free(ns);
	free(allowed);
	free(m);
}

/* ---- ending in time ---- */

/* A walk that draws uniformly among the allowed tokens under a budget of
 * tokens: a token after which the grammar could not end in the tokens left
 * is refused (grammar_state_accept_within), and a draw among those that can
 * (grammar_state_mask_within) follows, as the scheduler does.  Starting with
 * EXTRA tokens more than the shortest completion needs, every walk must end
 * complete within its budget: 1 if it did. */
static int budget_walk(const struct grammar *g, const struct tvocab *tv, const char *name,
		       uint32_t extra, char *text, size_t cap)
{
	size_t words = grammar_vocab_mask_words(tv->gv), len = 0;
	uint32_t *m = malloc(words * sizeof *m);
	int32_t *allowed = malloc((size_t)tv->n * sizeof *allowed);
	struct grammar_state *s;
	uint32_t left;
	int ok = 0;

	if (grammar_state_new(g, tv->gv, &s)) {
		test_failures++;
		goto out;
	}
	left = grammar_state_end_cost(s) + 1 + extra;
	while (left > 0) {
		int n = grammar_state_mask(s, m), k = 0, r;
		int32_t pick;
		if (n <= 0)
			break;
		for (int32_t t = 0; t < tv->n; t++)
			if (bit(m, t) && (!is_eog(tv, t) || rnd() % 8 == 0))
				allowed[k++] = t;
		if (!k)
			break;
		pick = allowed[rnd() % (uint32_t)k];
		r = grammar_state_accept_within(s, pick, left - 1);
		if (r == -ERANGE) {
			n = grammar_state_mask_within(s, m, left - 1);
			if (n <= 0) {
				fprintf(stderr, "%s: no token fits %u tokens left after %zu bytes: %.*s\n",
					name, left, len, (int)len, text);
				test_failures++;
				break;
			}
			for (int32_t t = k = 0; t < tv->n; t++)
				if (bit(m, t))
					allowed[k++] = t;
			CHECK_INT_EQ(k, n);
			pick = allowed[rnd() % (uint32_t)k];
			r = grammar_state_accept_within(s, pick, left - 1);
		}
		if (r) {
			fprintf(stderr, "%s: token %d refused (%d)\n", name, pick, r);
			test_failures++;
			break;
		}
		left--;
		if (is_eog(tv, pick) || grammar_state_done(s)) {
			ok = 1;
			break;
		}
		if (len + tv->lens[pick] < cap) {
			memcpy(text + len, tv->bytes[pick], tv->lens[pick]);
			len += tv->lens[pick];
		}
	}
	text[len < cap ? len : cap - 1] = 0;
	if (!ok) {
		fprintf(stderr, "%s: the walk did not end in its budget: %s\n", name, text);
		test_failures++;
	}
	grammar_state_free(s);
out:
	free(m);
	free(allowed);
	return ok;
}

static void test_end_in_time(const struct tvocab *tv)
{
	static char text[1 << 16];
	size_t words = grammar_vocab_mask_words(tv->gv);
	uint32_t *m = calloc(words, sizeof *m);
	int32_t a = tvocab_find(tv, "a", 1), abc = tvocab_find(tv, "abc", 3);
	int32_t t12 = tvocab_find(tv, "12", 2), one = tvocab_find(tv, "1", 1);
	struct grammar_state *s;
	struct grammar *g;

	/* a run of characters costs the fewest tokens that spell it */
	g = compile("root ::= \"abc\" \"12\"");
	if (g && !grammar_state_new(g, tv->gv, &s)) {
		CHECK_INT_EQ(grammar_state_end_cost(s), 2);            /* "abc" "12" */
		/* after "a": b c "12" and the EOG token */
		CHECK_INT_EQ(grammar_state_accept_within(s, a, 3), -ERANGE);
		CHECK_INT_EQ(grammar_state_end_cost(s), 2);            /* unchanged */
		CHECK_INT_EQ(grammar_state_accept_within(s, abc, 1), -ERANGE);
		CHECK_INT_EQ(grammar_state_accept_within(s, abc, 2), 0);
		CHECK_INT_EQ(grammar_state_end_cost(s), 1);
		CHECK_INT_EQ(grammar_state_mask(s, m), 2);             /* "1" and "12" */
		/* with no token after this one, only "12" (done: no EOG needed) */
		CHECK_INT_EQ(grammar_state_mask_within(s, m, 0), 1);
		CHECK(bit(m, t12) && !bit(m, one));
		CHECK_INT_EQ(grammar_state_accept_within(s, t12, 0), 0);
		CHECK(grammar_state_done(s));
		CHECK_INT_EQ(grammar_state_end_cost(s), 0);
		grammar_state_free(s);
	}
	grammar_free(g);
	/* a rule costs its cheapest alternative; repetitions may be empty */
	g = compile("root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= \"null\" | [0-9]+ | \"{}\"");
	if (g && !grammar_state_new(g, tv->gv, &s)) {
		CHECK_INT_EQ(grammar_state_end_cost(s), 3);            /* [ 0 ] */
		CHECK_INT_EQ(grammar_state_accept_bytes(s, "[nu", 3), 0);
		CHECK_INT_EQ(grammar_state_end_cost(s), 3);            /* l l ] */
		grammar_state_free(s);
	}
	grammar_free(g);
	/* a grammar that never ends fits no budget; an EOG token always fits */
	g = compile("root ::= \"a\" root");
	if (g && !grammar_state_new(g, tv->gv, &s)) {
		CHECK_INT_EQ(grammar_state_end_cost(s), GRAMMAR_COST_INF);
		CHECK_INT_EQ(grammar_state_accept_within(s, a, 1u << 30), -ERANGE);
		CHECK_INT_EQ(grammar_state_accept_within(s, a, UINT32_MAX), 0);
		grammar_state_free(s);
	}
	grammar_free(g);
	g = compile("root ::= \"a\" [b]?");
	if (g && !grammar_state_new(g, tv->gv, &s)) {
		CHECK_INT_EQ(grammar_state_accept_within(s, a, 1), 0); /* EOG after */
		CHECK_INT_EQ(grammar_state_accept_within(s, tv->eog[0], 0), 0);
		grammar_state_free(s);
	}
	grammar_free(g);
	free(m);
	/* random walks of the JSON grammar under tight budgets end complete */
	g = load_grammar("json.gbnf");
	if (g) {
		int ok = 0;
		for (int w = 0; w < 40; w++) {
			char name[64];
			snprintf(name, sizeof name, "synth json budget walk %d", w);
			if (budget_walk(g, tv, name, (uint32_t)(w % 10) * 4, text, sizeof text) &&
			    !is_json(text, strlen(text))) {
				fprintf(stderr, "%s: not JSON: %s\n", name, text);
				test_failures++;
			} else {
				ok++;
			}
		}
		printf("end in time: %d/40 synth json walks complete within their budgets\n", ok);
		grammar_free(g);
	}
}

static void test_real_vocab(const char *label, const char *env, const char *dflt,
			    int brute_steps)
{
	const char *path = getenv(env);
	struct tokenizer *t = NULL;
	struct tvocab *tv;
	struct grammar *g;
	int64_t t0;

	if (!path)
		path = dflt;
	if (access(path, R_OK) != 0) {
		printf("%s: left out (no %s; make fetch-models)\n", label, path);
		return;
	}
	t0 = clock_ns();
	tv = gguf_vocab(path, &t);
	if (!tv)
		return;
	printf("%s: %d tokens, trie built in %.1f ms\n", label, tv->n, (clock_ns() - t0) / 1e6);
	g = load_grammar("json.gbnf");
	if (g) {
		struct grammar_state *proto;
		char name[64];
		/* brute force at the first tokens of the document, then every 40th */
		snprintf(name, sizeof name, "%s json doc (cold)", label);
		doc_walk(g, tv, t, name, NULL, brute_steps);
		/* the same document again from a prototype's clone: warm cache */
		CHECK_INT_EQ(grammar_state_new(g, tv->gv, &proto), 0);
		snprintf(name, sizeof name, "%s json doc (first pass)", label);
		doc_walk(g, tv, t, name, proto, 0);
		snprintf(name, sizeof name, "%s json doc (warm clone)", label);
		doc_walk(g, tv, t, name, proto, 0);
		grammar_state_free(proto);
		/* inside a split character, and at a number */
		{
			struct grammar_state *s;
			CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
			CHECK_INT_EQ(grammar_state_accept_bytes(s, "{\"a\": \"x\xe6\x97", 10), 0);
			check_mask(s, tv, "inside a character");
			grammar_state_free(s);
			CHECK_INT_EQ(grammar_state_new(g, tv->gv, &s), 0);
			CHECK_INT_EQ(grammar_state_accept_bytes(s, "{\"a\": [12", 9), 0);
			check_mask(s, tv, "in a number");
			grammar_state_free(s);
		}
		snprintf(name, sizeof name, "%s json", label);
		sample_walk_timed(g, tv, name, 20, 60);
		/* under budgets, with the mask of the tokens that fit */
		{
			static char text[1 << 16];
			int ok = 0;
			t0 = clock_ns();
			for (int w = 0; w < 4; w++) {
				snprintf(name, sizeof name, "%s json budget walk %d", label, w);
				ok += budget_walk(g, tv, name, 8 + 8 * (uint32_t)w, text, sizeof text) &&
				      is_json(text, strlen(text));
			}
			CHECK_INT_EQ(ok, 4);
			printf("%s json: %d/4 budget walks complete and JSON (%.0f ms)\n", label, ok,
			       (clock_ns() - t0) / 1e6);
		}
		grammar_free(g);
	}
	/* arithmetic and list: sampled text is accepted */
	{
		static const char *const names[] = { "arithmetic.gbnf", "list.gbnf" };
		for (size_t i = 0; i < ARRAY_LEN(names); i++) {
			struct walk_opts o = { 40, 40, 0, NULL, 0, 20 };
			g = load_grammar(names[i]);
			if (!g)
				continue;
			for (int w = 0; w < 4; w++) {
				int ended = 0, end = 0;
				size_t len = 0;
				char *text = walk(g, tv, &o, names[i], &ended, &len);
				if (text && (feed(g, tv->gv, text, len, &end) != -1 || (ended && !end))) {
					fprintf(stderr, "%s %s: sampled text refused: %s\n", label,
						names[i], text);
					test_failures++;
				}
				free(text);
			}
			grammar_free(g);
		}
	}
	tvocab_free(tv);
	tokenizer_free(t);
}

int main(void)
{
	struct tvocab *tv = synth_vocab();

	setvbuf(stdout, NULL, _IOLBF, 0);
	test_errors();
	test_examples_parse();
	if (tv) {
		test_language(tv);
		test_examples_match(tv);
		test_clone(tv);
		test_odd_tokens(tv);
		test_masks_synth(tv);
		test_threads(tv);
		test_long_repetition(tv);
		test_hostile(tv);
		test_end_in_time(tv);
	}
	tvocab_free(tv);
	test_deepen();
	if (!getenv("LLMD_GRAMMAR_SYNTH_ONLY")) {
		test_real_vocab("SmolLM2", "LLMD_SMOLLM2", "models/SmolLM2-135M-Instruct.Q4_1.gguf", 4);
		test_real_vocab("Gemma 3", "LLMD_GEMMA3", "models/gemma-3-270m-q4_k_m.gguf", 2);
	}
	return test_result();
}
