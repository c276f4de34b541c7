/* tokenizer_impl.h - what tokenizer.c (loading), tokenizer_encode.c and
 * tokenizer_decode.c share: the insides of struct tokenizer and the few
 * helpers all three use.  Not the engine's interface: that is tokenizer.h.
 */
#ifndef LLMD_TOKENIZER_IMPL_H
#define LLMD_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <errno.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* ---- types ---- */

/* Token attributes, as llama.cpp derives them from the GGUF token types. */
enum {
	ATTR_UNKNOWN = 1 << 0,
	ATTR_UNUSED = 1 << 1,
	ATTR_NORMAL = 1 << 2,
	ATTR_CONTROL = 1 << 3,
	ATTR_USER_DEFINED = 1 << 4,
	ATTR_BYTE = 1 << 5,
	ATTR_EOG = 1 << 6, /* ours: ends generation */
};

enum tok_model { MODEL_SPM, MODEL_BPE };

#define MAX_REGEX 6
#define UTF8_FFFD "\xef\xbf\xbd"
#define SPM_SPACE "\xe2\x96\x81" /* U+2581 */

/* One slot of the text -> id map (open addressing, linear probing). */
struct text_slot {
	uint32_t hash; /* of the text */
	int32_t id;    /* -1: empty */
};

/* One slot of the (left id, right id) -> merge map. */
struct merge_slot {
	uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
	int32_t rank; /* index in tokenizer.ggml.merges: lower merges first */
	int32_t res;  /* id of the merged text (maybe virtual) */
};

struct tokenizer {
	int model;                /* enum tok_model */
	int32_t n_vocab;          /* real tokens */

	/* Texts: ids 0..n_vocab-1 are tokens; ids n_vocab..n_text-1 are
	 * "virtual" texts, merge halves/results that are not tokens, so that
	 * every symbol BPE can ever form has an id. */
	char *pool;               /* (pool_len) every text, each NUL-terminated */
	size_t pool_len;          /* bytes used */
	size_t pool_cap;          /* bytes allocated */
	uint32_t *text_off;       /* (text_cap) offset of text id in pool */
	uint32_t *text_len;       /* (text_cap) bytes of text id */
	int32_t n_text;           /* real + virtual */
	int32_t text_cap;         /* entries allocated */
	struct text_slot *map;    /* (map_cap) text -> first id with it */
	uint32_t map_cap;         /* power of two, >= 2 * n_text */
	uint32_t max_text_len;    /* longest real token text, bytes */

	float *score;             /* (n_vocab) SPM merge priority */
	uint8_t *attr;            /* (n_vocab) ATTR_* bits */
	char *piece_pool;         /* decoded bytes of all tokens (special form) */
	uint32_t *piece_off;      /* (n_vocab + 1) offsets into piece_pool */

	struct merge_slot *merges; /* (merge_cap) BPE merges by id pair */
	uint32_t merge_cap;       /* power of two; 0 for SPM */

	pcre2_code *re[MAX_REGEX]; /* BPE pre-tokenizer passes, in order */
	int n_re;                 /* 0 for SPM */
	int ignore_merges;        /* BPE: a pre-token that is a token is kept whole */
	int add_space_prefix;     /* SPM: ' ' before text that starts or follows a special token */
	int add_bos;              /* tokenizer.ggml.add_bos_token or the model's default */

	int32_t bos, eos, eot, eom, unk; /* special ids, -1 = none */
	int32_t *special;         /* (n_special) CONTROL/USER_DEFINED/UNKNOWN ids,
	                             longest text first (ties: lower id) */
	int n_special;

	int32_t spm_byte[256];    /* SPM fallback id for a byte: <0xXX>, its
	                             1-byte text, else unk; -1 none */
	int32_t bpe_sym[256];     /* BPE id (maybe virtual) of a byte's alphabet
	                             char, -1 none */
	int32_t bpe_single[256];  /* BPE last resort: id of the 1-byte text, -1 none */
	uint8_t benc[256][2];     /* gpt2 byte -> UTF-8 of its alphabet char */
	uint8_t benc_len[256];    /* 1 or 2 */
	int16_t bdec[324];        /* alphabet code point -> byte, -1 none */
};

/* ---- helpers, static inline so that encoding's inner loops inline them ---- */

/* Grows *P (elements of SIZE bytes) to hold at least NEED. */
static inline int grow(void *pp, size_t *cap, size_t need, size_t size)
{
	void **p = pp;
	size_t n = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need) {
		if (n > SIZE_MAX / 2 / size)
			return -ENOMEM;
		n *= 2;
	}
	q = realloc(*p, n * size);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

static inline uint32_t hash_bytes(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 0x100000001b3ull;
	}
	return (uint32_t)(h ^ (h >> 32));
}

static inline uint32_t hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)x;
}

static inline const char *text_of(const struct tokenizer *t, int32_t id)
{
	return t->pool + t->text_off[id];
}

/* Id of the text S[0..N) (real or virtual), or -1. */
static inline int32_t text_lookup(const struct tokenizer *t, const char *s, size_t n)
{
	uint32_t h = hash_bytes(s, n);
	uint32_t mask = t->map_cap - 1;

	for (uint32_t i = h & mask;; i = (i + 1) & mask) {
		const struct text_slot *sl = &t->map[i];
		if (sl->id < 0)
			return -1;
		if (sl->hash == h && t->text_len[sl->id] == n &&
		    memcmp(text_of(t, sl->id), s, n) == 0)
			return sl->id;
	}
}

/* The merge of the pair (A, B), or NULL when there is none. */
static inline const struct merge_slot *merge_find(const struct tokenizer *t,
						  int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint32_t mask = t->merge_cap - 1;

	for (uint32_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
		const struct merge_slot *m = &t->merges[i];
		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
	}
}

#endif
