/* test_stopstr.c - pins the stop-string matcher: matches inside one piece and
 * across several, false starts, the earliest of several stops, multibyte
 * stops, flushing the held tail, bad configurations; and a randomized check
 * against a plain search of the whole text.
 */
#include <errno.h>
#include <stdint.h>

#include "proto.h"
#include "stopstr.h"
#include "testutil.h"

/* What one sequence printed so far. */
struct run {
	char text[4096]; /* everything emitted, NUL-terminated */
	size_t len;      /* bytes in text */
	int matched;     /* a feed returned 1 */
};

/* Feeds PIECE and appends what comes out; returns how many bytes came out. */
static size_t feed(struct stopstr *s, struct run *r, const char *piece, size_t len)
{
	char out[2048];
	size_t n = (size_t)-1;
	int rc = stopstr_feed(s, piece, len, out, len + STOPSTR_MAX_LEN, &n);
	CHECK(rc == 0 || rc == 1);
	if (rc < 0)
		return 0;
	CHECK(n <= len + STOPSTR_MAX_LEN);
	memcpy(r->text + r->len, out, n);
	r->len += n;
	r->text[r->len] = '\0';
	if (rc == 1)
		r->matched = 1;
	return n;
}

static size_t feed_str(struct stopstr *s, struct run *r, const char *piece)
{
	return feed(s, r, piece, strlen(piece));
}

static void flush(struct stopstr *s, struct run *r)
{
	char out[STOPSTR_MAX_LEN];
	size_t n = stopstr_flush(s, out, sizeof out);
	memcpy(r->text + r->len, out, n);
	r->len += n;
	r->text[r->len] = '\0';
}

static struct stopstr *make(const char *const *stops, int n)
{
	struct stopstr *s = NULL;
	CHECK_INT_EQ(stopstr_new(stops, n, &s), 0);
	return s;
}

static void test_match_inside_one_piece(void)
{
	const char *stops[] = { "STOP" };
	struct stopstr *s = make(stops, 1);
	struct run r = { 0 };
	CHECK_INT_EQ(feed_str(s, &r, "abcSTOPdef"), 3);
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "abc");
	/* after a match nothing more comes out */
	CHECK_INT_EQ(feed_str(s, &r, "more"), 0);
	flush(s, &r);
	CHECK_STR_EQ(r.text, "abc");
	stopstr_free(s);

	/* a stop string at the very start of the output */
	s = make(stops, 1);
	r = (struct run){ 0 };
	CHECK_INT_EQ(feed_str(s, &r, "STOP"), 0);
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "");
	stopstr_free(s);
}

static void test_match_across_three_pieces(void)
{
	const char *stops[] = { "world" };
	struct stopstr *s = make(stops, 1);
	struct run r = { 0 };
	CHECK_INT_EQ(feed_str(s, &r, "Hello wo"), 6); /* "wo" held back */
	CHECK(!r.matched);
	CHECK_INT_EQ(feed_str(s, &r, "rl"), 0);
	CHECK(!r.matched);
	CHECK_INT_EQ(feed_str(s, &r, "d! and more"), 0);
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "Hello ");
	stopstr_free(s);
}

static void test_false_partial_start(void)
{
	const char *stops[] = { "Hello" };
	struct stopstr *s = make(stops, 1);
	struct run r = { 0 };
	CHECK_INT_EQ(feed_str(s, &r, "Hel"), 0);
	CHECK_INT_EQ(feed_str(s, &r, "lx"), 5); /* "Hellx": released at once */
	CHECK(!r.matched);
	CHECK_STR_EQ(r.text, "Hellx");
	flush(s, &r);
	CHECK_STR_EQ(r.text, "Hellx");
	stopstr_free(s);

	/* a false start that overlaps the real one: "aa|a|b" against "aab" */
	const char *stops2[] = { "aab" };
	s = make(stops2, 1);
	r = (struct run){ 0 };
	CHECK_INT_EQ(feed_str(s, &r, "xaa"), 1);
	CHECK_INT_EQ(feed_str(s, &r, "a"), 1); /* the first 'a' cannot start it any more */
	CHECK_INT_EQ(feed_str(s, &r, "b"), 0);
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "xa");
	stopstr_free(s);
}

static void test_earliest_of_several_wins(void)
{
	const char *stops[] = { "END", "STOP" };
	struct stopstr *s = make(stops, 2);
	struct run r = { 0 };
	feed_str(s, &r, "x STOP y END");
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "x ");
	stopstr_free(s);

	/* the longer stop starts first, the shorter one ends first */
	const char *stops2[] = { "de", "bcdeX" };
	s = make(stops2, 2);
	r = (struct run){ 0 };
	CHECK_INT_EQ(feed_str(s, &r, "abcd"), 1); /* "bcd" may become "bcdeX" */
	feed_str(s, &r, "eX tail");
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "a");
	stopstr_free(s);

	/* ... and when the long one falls through, the short one still hits */
	s = make(stops2, 2);
	r = (struct run){ 0 };
	feed_str(s, &r, "abcd");
	feed_str(s, &r, "eY");
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "abc");
	stopstr_free(s);
}

static void test_utf8_stops(void)
{
	const char *stops[] = { "終わり", "\xF0\x9F\x9B\x91" /* U+1F6D1 */ };
	struct stopstr *s = make(stops, 2);
	struct run r = { 0 };
	const char *text = "これで終わりです";
	size_t len = strlen(text);
	for (size_t i = 0; i < len && !r.matched; i++) /* one byte at a time */
		feed(s, &r, text + i, 1);
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "これで");
	stopstr_free(s);

	/* a multibyte false start: the first 3 bytes of U+1F6D1, then U+1F6D2 */
	s = make(stops, 2);
	r = (struct run){ 0 };
	CHECK_INT_EQ(feed_str(s, &r, "go \xF0\x9F\x9B"), 3);
	CHECK_INT_EQ(feed_str(s, &r, "\x92!"), 5);
	CHECK(!r.matched);
	CHECK_STR_EQ(r.text, "go \xF0\x9F\x9B\x92!");
	feed_str(s, &r, " \xF0\x9F");
	feed_str(s, &r, "\x9B\x91 after");
	CHECK(r.matched);
	CHECK_STR_EQ(r.text, "go \xF0\x9F\x9B\x92! ");
	stopstr_free(s);
}

static void test_flush_returns_held_tail(void)
{
	const char *stops[] = { "Hello", "He said" };
	struct stopstr *s = make(stops, 2);
	struct run r = { 0 };
	CHECK_INT_EQ(feed_str(s, &r, "say He"), 4);
	CHECK_INT_EQ(feed_str(s, &r, "l"), 0);
	CHECK_STR_EQ(r.text, "say ");
	char out[STOPSTR_MAX_LEN];
	CHECK_INT_EQ(stopstr_flush(s, out, sizeof out), 3);
	CHECK(memcmp(out, "Hel", 3) == 0);
	CHECK_INT_EQ(stopstr_flush(s, out, sizeof out), 0); /* emptied */
	stopstr_free(s);

	/* no stop strings: everything passes at once */
	s = make(NULL, 0);
	r = (struct run){ 0 };
	CHECK_INT_EQ(feed_str(s, &r, "anything"), 8);
	CHECK_INT_EQ(feed(s, &r, "", 0), 0);
	CHECK_INT_EQ(stopstr_flush(s, out, sizeof out), 0);
	stopstr_free(s);
}

static void test_invalid(void)
{
	struct stopstr *s = (struct stopstr *)&s; /* must stay untouched */
	/* one over the limit, which is the protocol's */
	const char *over[STOPSTR_MAX + 1] = { "a", "b", "c", "d", "e", "f", "g", "h", "i",
					      "j", "k", "l", "m", "n", "o", "p", "q" };
	CHECK_INT_EQ(STOPSTR_MAX, PROTO_MAX_STOPS);
	CHECK_INT_EQ(stopstr_new(over, STOPSTR_MAX + 1, &s), -EINVAL);
	CHECK_INT_EQ(stopstr_new(over, -1, &s), -EINVAL);
	CHECK_INT_EQ(stopstr_new(NULL, 2, &s), -EINVAL);
	CHECK_INT_EQ(stopstr_new(over, 2, NULL), -EINVAL);
	const char *empty[] = { "ok", "" };
	CHECK_INT_EQ(stopstr_new(empty, 2, &s), -EINVAL);
	const char *null[] = { "ok", NULL };
	CHECK_INT_EQ(stopstr_new(null, 2, &s), -EINVAL);
	static char longest[STOPSTR_MAX_LEN + 2];
	memset(longest, 'x', STOPSTR_MAX_LEN + 1);
	const char *too_long[] = { longest };
	CHECK_INT_EQ(stopstr_new(too_long, 1, &s), -EINVAL);
	CHECK(s == (struct stopstr *)&s);

	longest[STOPSTR_MAX_LEN] = '\0'; /* exactly the limit is fine */
	s = NULL;
	CHECK_INT_EQ(stopstr_new(too_long, 1, &s), 0);
	stopstr_free(s);
	s = NULL;
	CHECK_INT_EQ(stopstr_new(over, STOPSTR_MAX, &s), 0);
	stopstr_free(s);

	/* an output buffer smaller than held + piece */
	const char *stops[] = { "abc" };
	s = make(stops, 1);
	char out[8];
	size_t n = 99;
	CHECK_INT_EQ(stopstr_feed(s, "xxab", 4, out, 8, &n), 0);
	CHECK_INT_EQ(n, 2);
	CHECK_INT_EQ(stopstr_feed(s, "zzzzzzz", 7, out, 8, &n), -EINVAL);
	CHECK_INT_EQ(stopstr_feed(NULL, "z", 1, out, 8, &n), -EINVAL);
	stopstr_free(s);
	stopstr_free(NULL);
}

/* Random texts over a tiny alphabet, cut into random pieces: what comes out
 * (plus the flush when nothing matched) is exactly the text up to the
 * earliest occurrence of any stop string, so no byte of a stop ever leaks. */
static void test_random_against_search(void)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
	const char *stops[] = { "abca", "cc", "bab", "aaaa" };
	for (int rep = 0; rep < 3000; rep++) {
		int nstops = 1 + (int)(NEXT() % 4);
		char text[200];
		size_t len = 1 + NEXT() % 120;
		for (size_t i = 0; i < len; i++)
			text[i] = "abc"[NEXT() % 3];
		text[len] = '\0';

		size_t first = len;
		for (int k = 0; k < nstops; k++) {
			const char *hit = strstr(text, stops[k]);
			if (hit && (size_t)(hit - text) < first)
				first = (size_t)(hit - text);
		}

		struct stopstr *s = make(stops, nstops);
		struct run r = { 0 };
		for (size_t pos = 0; pos < len && !r.matched;) {
			size_t piece = 1 + NEXT() % 6;
			if (piece > len - pos)
				piece = len - pos;
			feed(s, &r, text + pos, piece);
			CHECK(r.len <= first); /* never ahead of the stop */
			pos += piece;
		}
		if (!r.matched)
			flush(s, &r);
		CHECK_INT_EQ(r.matched, first < len);
		CHECK_INT_EQ(r.len, first);
		CHECK(memcmp(r.text, text, first) == 0);
		stopstr_free(s);
	}
#undef NEXT
}

int main(void)
{
	test_match_inside_one_piece();
	test_match_across_three_pieces();
	test_false_partial_start();
	test_earliest_of_several_wins();
	test_utf8_stops();
	test_flush_returns_held_tail();
	test_invalid();
	test_random_against_search();
	return test_result();
}
