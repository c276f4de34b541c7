/* utf8.h - the one strict UTF-8 validator (and encoder) of llmd: overlong forms,
 * surrogates and code points above U+10FFFF are invalid, as in the Unicode
 * standard's table 3-7.  Also the line-safe writer of JSON text.
 * Header-only, below everything, so that libllm, the server and the
 * tokenizer agree on what valid text is.  Any thread.
 */
#ifndef LLMD_UTF8_H
#define LLMD_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The number of continuation bytes lead byte C needs (1 to 3), with the
 * allowed range of the first one in *LO..*HI; 0 for a byte that cannot
 * begin a sequence (ASCII included: it needs none). */
static inline int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
	*lo = 0x80;
	*hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf)
		return 1;
	if (c >= 0xe0 && c <= 0xef) {
		if (c == 0xe0)
			*lo = 0xa0;
		else if (c == 0xed)
			*hi = 0x9f;
		return 2;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (c == 0xf0)
			*lo = 0x90;
		else if (c == 0xf4)
			*hi = 0x8f;
		return 3;
	}
	return 0;
}

/* The length of the valid character at S[0..N) (N >= 1), or 0 when S
 * starts with an invalid or truncated sequence. */
static inline size_t utf8_char_len(const uint8_t *s, size_t n)
{
	uint8_t lo, hi;
	int need;

	if (s[0] < 0x80)
		return 1;
	need = utf8_lead(s[0], &lo, &hi);
	if (!need || (size_t)need >= n)
		return 0;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (int j = 2; j <= need; j++)
		if ((s[j] & 0xc0) != 0x80)
			return 0;
	return (size_t)need + 1;
}

/* The byte offset of the first invalid or truncated sequence in S[0..N),
 * or N when all of it is valid UTF-8. */
static inline size_t utf8_check(const void *s, size_t n)
{
	const uint8_t *p = s;
	size_t i = 0;

	while (i < n) {
		size_t l = p[i] < 0x80 ? 1 : utf8_char_len(p + i, n - i);
		if (!l)
			return i;
		i += l;
	}
	return n;
}

/* Whether S[0..N) is all valid UTF-8. */
static inline int utf8_valid(const void *s, size_t n)
{
	return utf8_check(s, n) == n;
}

/* Writes code point CP (< 0x110000) to O as 1 to 4 bytes; returns how many. */
static inline size_t utf8_encode(void *o, uint32_t cp)
{
	uint8_t *b = o;

	if (cp < 0x80) {
		b[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		b[0] = (uint8_t)(0xc0 | cp >> 6);
		b[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		b[0] = (uint8_t)(0xe0 | cp >> 12);
		b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
		b[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	b[0] = (uint8_t)(0xf0 | cp >> 18);
	b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
	b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
	b[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

/* Writes JSON text S through PUT with U+0085, U+2028 and U+2029 as \u
 * escapes.  JSON allows them raw inside strings, but readers that split lines
 * on more than \n and \r (Python's str.splitlines, httpx's iter_lines) would
 * cut an NDJSON line or a server-sent event in two there, in the middle of a
 * string.  Outside its strings JSON text is ASCII, so every one is in a
 * string, where the escape means the same character. */
static inline void utf8_json_put(const char *s, void (*put)(void *ctx, const void *p, size_t n), void *ctx)
{
	const char *run = s;

	for (const uint8_t *p = (const uint8_t *)s; *p; p++) {
		const char *esc;
		size_t len;

		if (p[0] == 0xc2 && p[1] == 0x85) {
			esc = "\\u0085";
			len = 2;
		} else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
			esc = p[2] == 0xa8 ? "\\u2028" : "\\u2029";
			len = 3;
		} else {
			continue;
		}
		put(ctx, run, (size_t)((const char *)p - run));
		put(ctx, esc, 6);
		p += len - 1;
		run = (const char *)p + 1;
	}
	put(ctx, run, strlen(run));
}

#endif
