/* test_tokenizer.c - tokenizer.c against llama.cpp's own prompt ids for the
 * llama-vocabulary test models, against SmolLM2 ids checked with an
 * independent HF-tokenizers oracle, and on small vocabularies built here in
 * memory (merge order, special tokens, EOG detection, load errors), plus
 * pieces and incremental detokenization.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "gguf.h"
#include "testutil.h"
#include "tokenizer.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define FFFD "\xef\xbf\xbd"

static int models_missing; /* model files absent: their checks skipped */
static int models_found;

/* ---- helpers ---- */

static int check_ids_(const char *file, int line, const char *what,
		      const int32_t *got, int n_got, const int32_t *exp, int n_exp)
{
	int same = n_got == n_exp;

	for (int i = 0; same && i < n_got; i++)
		same = got[i] == exp[i];
	if (same)
		return 1;
	fprintf(stderr, "%s:%d: %s: got %d ids [", file, line, what, n_got);
	for (int i = 0; i < n_got; i++)
		fprintf(stderr, "%s%d", i ? ", " : "", got[i]);
	fprintf(stderr, "], expected %d [", n_exp);
	for (int i = 0; i < n_exp; i++)
		fprintf(stderr, "%s%d", i ? ", " : "", exp[i]);
	fprintf(stderr, "]\n");
	test_failures++;
	return 0;
}
#define CHECK_IDS(what, got, n_got, exp, n_exp) \
	check_ids_(__FILE__, __LINE__, what, got, n_got, exp, n_exp)

static struct tokenizer *load_file(const char *path, struct gguf_file **ret_f)
{
	char err[256] = "";
	struct gguf_file *f;
	struct tokenizer *t;
	int rc;

	rc = gguf_open(path, &f, err, sizeof err);
	if (rc) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return NULL;
	}
	rc = tokenizer_from_gguf(f, &t, err, sizeof err);
	if (rc) {
		fprintf(stderr, "%s: tokenizer: %s (%d)\n", path, err, rc);
		test_failures++;
		gguf_close(f);
		return NULL;
	}
	*ret_f = f;
	return t;
}

/* Concatenated pieces of IDS through the incremental detokenizer; checks
 * that every push emits whole UTF-8 characters only. */
static size_t detok_all(const struct tokenizer *t, const int32_t *ids, int n,
			char *out, size_t cap)
{
	struct detok d = { .n_pending = 0 };
	size_t len = 0;
	char tmp[1024];

	for (int i = 0; i < n; i++) {
		int k = detok_push(t, &d, ids[i], 1, tmp, sizeof tmp);
		CHECK(k >= 0);
		if (k < 0)
			return 0;
		/* a push never ends inside a character */
		for (int j = 0; j < k;) {
			unsigned char c = (unsigned char)tmp[j];
			int l = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
			CHECK(c < 0x80 || c >= 0xc2);
			CHECK(j + l <= k);
			j += l;
		}
		if (len + (size_t)k <= cap)
			memcpy(out + len, tmp, (size_t)k);
		len += (size_t)k;
	}
	int k = detok_flush(&d, tmp, sizeof tmp);
	if (len + (size_t)k <= cap)
		memcpy(out + len, tmp, (size_t)k);
	return len + (size_t)k;
}

/* ---- a tiny GGUF writer for synthetic vocabularies ---- */

struct gw {
	uint8_t *p;    /* key-value section */
	size_t n;      /* bytes used */
	size_t cap;    /* bytes allocated */
	uint64_t n_kv; /* pairs written */
};

static void gw_put(struct gw *w, const void *src, size_t n)
{
	if (w->n + n > w->cap) {
		w->cap = (w->n + n) * 2 + 256;
		w->p = realloc(w->p, w->cap);
		if (!w->p)
			abort();
	}
	memcpy(w->p + w->n, src, n);
	w->n += n;
}

static void gw_u32(struct gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(struct gw *w, uint64_t v) { gw_put(w, &v, 8); }

static void gw_str(struct gw *w, const char *s)
{
	gw_u64(w, strlen(s));
	gw_put(w, s, strlen(s));
}

static void gw_key(struct gw *w, const char *key, uint32_t type)
{
	gw_str(w, key);
	gw_u32(w, type);
	w->n_kv++;
}

static void gw_kv_str(struct gw *w, const char *key, const char *v)
{
	gw_key(w, key, GGUF_T_STRING);
	gw_str(w, v);
}

static void gw_kv_u32(struct gw *w, const char *key, uint32_t v)
{
	gw_key(w, key, GGUF_T_UINT32);
	gw_u32(w, v);
}

static void gw_kv_bool(struct gw *w, const char *key, int v)
{
	uint8_t b = (uint8_t)v;

	gw_key(w, key, GGUF_T_BOOL);
	gw_put(w, &b, 1);
}

static void gw_kv_strs(struct gw *w, const char *key, const char *const *v, size_t n)
{
	gw_key(w, key, GGUF_T_ARRAY);
	gw_u32(w, GGUF_T_STRING);
	gw_u64(w, n);
	for (size_t i = 0; i < n; i++)
		gw_str(w, v[i]);
}

static void gw_kv_arr32(struct gw *w, const char *key, uint32_t type,
			const void *v, size_t n)
{
	gw_key(w, key, GGUF_T_ARRAY);
	gw_u32(w, type);
	gw_u64(w, n);
	gw_put(w, v, 4 * n);
}

/* The finished file: header plus key-value section, no tensors. */
static uint8_t *gw_finish(struct gw *w, size_t *ret_len)
{
	struct gw out = { 0 };

	gw_put(&out, "GGUF", 4);
	gw_u32(&out, 3);
	gw_u64(&out, 0);
	gw_u64(&out, w->n_kv);
	gw_put(&out, w->p, w->n);
	free(w->p);
	*ret_len = out.n;
	return out.p;
}

/* Builds a tokenizer from W; returns rc, the error text in ERR. */
static int gw_load(struct gw *w, struct tokenizer **ret, char *err, size_t errlen)
{
	size_t len;
	uint8_t *buf = gw_finish(w, &len);
	struct gguf_file *f;
	int rc;

	err[0] = '\0';
	rc = gguf_open_mem(buf, len, &f, err, errlen);
	if (rc) {
		fprintf(stderr, "synthetic gguf: %s\n", err);
		free(buf);
		return rc;
	}
	rc = tokenizer_from_gguf(f, ret, err, errlen);
	gguf_close(f); /* the tokenizer must not keep the file */
	memset(buf, 0xa5, len);
	free(buf);
	return rc;
}

/* GPT-2's printable-byte alphabet: the UTF-8 text of byte B's character. */
static void gpt2_char(int b, char out[3])
{
	int n = 0, cp = -1;

	for (int x = 0; x < 256 && cp < 0; x++) {
		int printable = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
		if (x == b)
			cp = printable ? x : 256 + n;
		else if (!printable)
			n++;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* A byte-level vocabulary: ids 0..255 are the bytes, then EXTRA with TYPES. */
static void gw_gpt2_vocab(struct gw *w, const char *pre, const char *const *extra,
			  const int32_t *extra_types, size_t n_extra,
			  const char *const *merges, size_t n_merges)
{
	static char chars[256][3];
	const char *toks[300];
	int32_t types[300];

	for (int b = 0; b < 256; b++) {
		gpt2_char(b, chars[b]);
		toks[b] = chars[b];
		types[b] = TOK_NORMAL;
	}
	for (size_t i = 0; i < n_extra; i++) {
		toks[256 + i] = extra[i];
		types[256 + i] = extra_types[i];
	}
	gw_kv_str(w, "tokenizer.ggml.model", "gpt2");
	if (pre)
		gw_kv_str(w, "tokenizer.ggml.pre", pre);
	gw_kv_strs(w, "tokenizer.ggml.tokens", toks, 256 + n_extra);
	gw_kv_arr32(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 256 + n_extra);
	if (merges)
		gw_kv_strs(w, "tokenizer.ggml.merges", merges, n_merges);
}

static int32_t enc(const struct tokenizer *t, const char *s, int bos, int special,
		   int32_t *out, int cap)
{
	return tokenizer_encode(t, s, strlen(s), bos, special, out, cap);
}

/* ---- synthetic vocabularies ---- */

static void test_load_errors(void)
{
	static const char *const toks[] = { "a", "b" };
	static const float scores[] = { 0.0f };
	struct tokenizer *t = NULL;
	char err[256];
	struct gw w;
	int rc;

	w = (struct gw){ 0 };
	gw_kv_str(&w, "tokenizer.ggml.model", "wordpiece");
	gw_kv_strs(&w, "tokenizer.ggml.tokens", toks, 2);
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "unknown tokenizer model 'wordpiece'");

	w = (struct gw){ 0 };
	gw_gpt2_vocab(&w, "nope-bpe", NULL, NULL, 0, NULL, 0);
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "unknown pre-tokenizer 'nope-bpe'");

	w = (struct gw){ 0 };
	gw_gpt2_vocab(&w, "gpt-2", NULL, NULL, 0, NULL, 0);
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "tokenizer.ggml.merges: missing");

	w = (struct gw){ 0 };
	gw_kv_str(&w, "tokenizer.ggml.model", "llama");
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "tokenizer.ggml.tokens: missing");

	w = (struct gw){ 0 };
	gw_kv_str(&w, "tokenizer.ggml.model", "llama");
	gw_kv_strs(&w, "tokenizer.ggml.tokens", toks, 2);
	gw_kv_arr32(&w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, 1);
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "tokenizer.ggml.scores: not a float32/int32 array of 2");

	/* add_bos without a BOS id in range */
	w = (struct gw){ 0 };
	gw_gpt2_vocab(&w, "gpt-2", NULL, NULL, 0, toks, 0);
	gw_kv_bool(&w, "tokenizer.ggml.add_bos_token", 1);
	rc = gw_load(&w, &t, err, sizeof err);
	CHECK_INT_EQ(rc, -EINVAL);
	CHECK_STR_EQ(err, "tokenizer.ggml.add_bos_token is true but there is no BOS token");

	tokenizer_free(NULL); /* NULL-safe */
}

/* Merges apply lowest rank first, whatever their position in the word. */
static void test_bpe_merge_rank(void)
{
	static const char *const extra[] = { "ab", "bc" };
	static const int32_t types[] = { TOK_NORMAL, TOK_NORMAL };
	static const char *const ab_first[] = { "a b", "b c" };
	static const char *const bc_first[] = { "b c", "a b" };
	struct tokenizer *t;
	char err[256];
	int32_t ids[8];
	struct gw w;
	int n;

	w = (struct gw){ 0 };
	gw_gpt2_vocab(&w, "gpt-2", extra, types, 2, ab_first, 2);
	if (gw_load(&w, &t, err, sizeof err) == 0) {
		n = enc(t, "abc", 0, 0, ids, 8);
		CHECK_IDS("ab before bc", ids, n, ((int32_t[]){ 256, 'c' }), 2);
		CHECK_STR_EQ(tokenizer_model(t), "gpt2");
		CHECK_INT_EQ(tokenizer_bos(t), -1);
		CHECK_INT_EQ(tokenizer_add_bos(t), 0);
		/* add_bos with no BOS adds nothing */
		n = enc(t, "abc", 1, 0, ids, 8);
		CHECK_INT_EQ(n, 2);
		tokenizer_free(t);
	} else {
		CHECK(!"load ab_first");
	}

	w = (struct gw){ 0 };
	gw_gpt2_vocab(&w, "gpt-2", extra, types, 2, bc_first, 2);
	if (gw_load(&w, &t, err, sizeof err) == 0) {
		n = enc(t, "abc", 0, 0, ids, 8);
		CHECK_IDS("bc before ab", ids, n, ((int32_t[]){ 'a', 257 }), 2);
		tokenizer_free(t);
	} else {
		CHECK(!"load bc_first");
	}
}

/* Special tokens: USER_DEFINED always split out, CONTROL only with
 * parse_special; longer special texts are cut out first (llama.cpp's order);
 * control-looking texts become EOG and CONTROL whatever their type. */
static void test_bpe_specials(void)
{
	static const char *const extra[] = { "<c>", "<u>", "<|im_end|>", "xy", "yz!" };
	static const int32_t types[] = { TOK_CONTROL, TOK_USER_DEFINED, TOK_NORMAL,
					 TOK_USER_DEFINED, TOK_USER_DEFINED };
	static const char *const merges[] = { "a b" };
	struct tokenizer *t;
	char err[256], buf[64];
	int32_t ids[16];
	struct gw w = { 0 };
	int n;

	gw_gpt2_vocab(&w, "gpt-2", extra, types, 5, merges, 1);
	gw_kv_u32(&w, "tokenizer.ggml.eos_token_id", 256);
	if (gw_load(&w, &t, err, sizeof err)) {
		fprintf(stderr, "specials vocab: %s\n", err);
		test_failures++;
		return;
	}
	n = enc(t, "a<c>b<u>", 0, 0, ids, 16);
	CHECK_IDS("user-defined only", ids, n,
		  ((int32_t[]){ 'a', '<', 'c', '>', 'b', 257 }), 6);
	n = enc(t, "a<c>b<u>", 0, 1, ids, 16);
	CHECK_IDS("control and user-defined", ids, n, ((int32_t[]){ 'a', 256, 'b', 257 }), 4);
	n = enc(t, "xyz!", 0, 0, ids, 16);
	CHECK_IDS("longest special first", ids, n, ((int32_t[]){ 'x', 260 }), 2);

	CHECK_INT_EQ(tokenizer_eos(t), 256);
	CHECK_INT_EQ(tokenizer_is_eog(t, 256), 1);
	CHECK_INT_EQ(tokenizer_is_eog(t, 258), 1); /* "<|im_end|>" by text */
	CHECK_INT_EQ(tokenizer_is_eog(t, 257), 0);
	CHECK_INT_EQ(tokenizer_is_eog(t, 'a'), 0);
	CHECK_INT_EQ(tokenizer_is_eog(t, -1), 0);
	CHECK_INT_EQ(tokenizer_is_eog(t, 100000), 0);
	/* ... and "<|im_end|>" became CONTROL: text only with special */
	CHECK_INT_EQ(tokenizer_piece(t, 258, 0, buf, sizeof buf), 0);
	CHECK_INT_EQ(tokenizer_piece(t, 258, 1, buf, sizeof buf), 10);
	n = enc(t, "<|im_end|>", 0, 0, ids, 16);
	CHECK(n > 1);
	n = enc(t, "<|im_end|>", 0, 1, ids, 16);
	CHECK_IDS("im_end special", ids, n, ((int32_t[]){ 258 }), 1);
	/* user-defined pieces are their text even without special */
	CHECK_INT_EQ(tokenizer_piece(t, 257, 0, buf, sizeof buf), 3);
	CHECK_INT_EQ(tokenizer_find(t, "<u>"), 257);
	CHECK_INT_EQ(tokenizer_find(t, "ab"), -1); /* a merge result, not a token */
	CHECK_INT_EQ(tokenizer_find(t, "nope"), -1);

	/* the merge "a b" has no token "ab": llama.cpp spells it byte by byte */
	n = enc(t, "ab", 0, 0, ids, 16);
	CHECK_IDS("merge without token", ids, n, ((int32_t[]){ 'a', 'b' }), 2);

	/* every byte has a piece; all 256 round-trip */
	for (int b = 0; b < 256; b++) {
		CHECK_INT_EQ(tokenizer_piece(t, b, 0, buf, sizeof buf), 1);
		CHECK_INT_EQ((unsigned char)buf[0], b);
	}
	tokenizer_free(t);
}

/* Every pre-tokenizer llama.cpp names and we support compiles and splits;
 * a missing tokenizer.ggml.pre means "default", as in llama.cpp. */
static void test_pre_types(void)
{
	static const char *const names[] = {
		NULL, "default", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
		"jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code", "roberta-bpe",
		"a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais",
		"trillion", "granite-docling", "llama3", "llama-v3", "llama-bpe",
		"falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
		"smaug-bpe", "glm4", "chatglm-bpe", "deepseek-llm", "deepseek-coder",
		"deepseek-v3", "falcon", "starcoder", "refact", "command-r", "smollm",
		"codeshell", "exaone", "minerva-7b", "mellum2", "qwen2",
		"deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
		"hunyuan", "solar-open", "grok-2", "qwen35", "poro-chat", "bloom",
		"gpt3-finnish", "tekken", "gpt-4o", "llama4", "kanana2", "talkie",
		"seed-coder", "bailingmoe", "bailingmoe2", "llada-moe",
	};
	static const char text[] = "Hello, World! I'm 12345 \xe4\xb8\xad\xe6\x96\x87 \xd0\xb4\xd0\xb0"
				   "\t\n\n  x\xf0\x9f\x98\x80 \xff";
	static const char *const no_merges[] = { "x y" };
	char err[256], out[256];
	int32_t ids[128];

	for (size_t i = 0; i < ARRAY_LEN(names); i++) {
		struct tokenizer *t;
		struct gw w = { 0 };
		int32_t bos_id = 65; /* 'A', for the pre-types that add BOS */

		gw_gpt2_vocab(&w, names[i], NULL, NULL, 0, no_merges, 1);
		gw_kv_u32(&w, "tokenizer.ggml.bos_token_id", (uint32_t)bos_id);
		if (gw_load(&w, &t, err, sizeof err)) {
			fprintf(stderr, "pre '%s': %s\n", names[i] ? names[i] : "(none)", err);
			test_failures++;
			continue;
		}
		/* byte-level with no merges: one token per byte, the invalid
		 * 0xff as U+FFFD's three */
		int n = enc(t, text, 0, 0, ids, 128);
		CHECK_INT_EQ(n, (int)sizeof text - 1 + 2);
		size_t dl = detok_all(t, ids, n > 128 ? 128 : n, out, sizeof out - 1);
		out[dl] = '\0';
		CHECK(dl == sizeof text - 1 + 2 && memcmp(out, text, sizeof text - 2) == 0);
		tokenizer_free(t);
	}
}

/* SentencePiece: the highest score merges first, ties go leftmost, no byte
 * tokens means <unk>, and add_space_prefix defaults to true. */
static void test_spm_scores(void)
{
	static const char *const toks[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81",
					    "a", "b", "ab", "ba" };
	static const int32_t types[] = { TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL,
					 TOK_NORMAL, TOK_NORMAL, TOK_NORMAL,
					 TOK_NORMAL, TOK_NORMAL };
	static const float tie[] = { 0, 0, 0, -3, -2, -2, -1, -1 };
	static const float ba_wins[] = { 0, 0, 0, -3, -2, -2, -1, -0.5f };
	const float *scores[] = { tie, ba_wins };
	struct tokenizer *t;
	char err[256], buf[16];
	int32_t ids[16];
	int n;

	for (int k = 0; k < 2; k++) {
		struct gw w = { 0 };
		gw_kv_str(&w, "tokenizer.ggml.model", "llama");
		gw_kv_strs(&w, "tokenizer.ggml.tokens", toks, 8);
		gw_kv_arr32(&w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores[k], 8);
		gw_kv_arr32(&w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 8);
		if (k == 0)
			gw_kv_bool(&w, "tokenizer.ggml.add_space_prefix", 0);
		if (gw_load(&w, &t, err, sizeof err)) {
			fprintf(stderr, "spm vocab: %s\n", err);
			test_failures++;
			continue;
		}
		CHECK_STR_EQ(tokenizer_model(t), "llama");
		CHECK_INT_EQ(tokenizer_bos(t), 1);
		CHECK_INT_EQ(tokenizer_eos(t), 2);
		CHECK_INT_EQ(tokenizer_add_bos(t), 1);
		CHECK_INT_EQ(tokenizer_is_eog(t, 2), 1);
		n = enc(t, "aba", 0, 0, ids, 16);
		if (k == 0) {
			CHECK_IDS("spm tie: leftmost", ids, n, ((int32_t[]){ 6, 4 }), 2);
			n = enc(t, "c", 1, 0, ids, 16);
			CHECK_IDS("spm unk", ids, n, ((int32_t[]){ 1, 0 }), 2);
			/* <unk> matches as text only with parse_special */
			n = enc(t, "<unk>", 0, 1, ids, 16);
			CHECK_IDS("spm <unk> special", ids, n, ((int32_t[]){ 0 }), 1);
			CHECK_INT_EQ(tokenizer_piece(t, 0, 0, buf, sizeof buf), 0);
			CHECK_INT_EQ(tokenizer_piece(t, 0, 1, buf, sizeof buf), 5);
		} else {
			/* the prefix space comes first, then "a" "ba" */
			CHECK_IDS("spm score wins", ids, n, ((int32_t[]){ 3, 4, 7 }), 3);
			/* a special token restarts the space prefix */
			n = enc(t, "a</s>a", 0, 1, ids, 16);
			CHECK_IDS("spm prefix after special", ids, n,
				  ((int32_t[]){ 3, 4, 2, 3, 4 }), 5);
			CHECK_INT_EQ(tokenizer_piece(t, 3, 0, buf, sizeof buf), 1);
			CHECK(buf[0] == ' ');
		}
		tokenizer_free(t);
	}
}

/* ---- the llama test models against llama.cpp ---- */

struct golden {
	const char *prompt;   /* encoded with BOS */
	int32_t ids[20];      /* llama.cpp's prompt_ids */
	int n;
};

/* golden/greedy-llamacpp.json prompt_ids (llama.cpp c392e509) */
static const struct golden tinystories_golden[] = {
	{ "Once upon a time", { 1, 80, 147, 201, 282, 57 }, 6 },
	{ "", { 1 }, 1 },
	{ "I believe the meaning of life is",
	  { 1, 80, 276, 164, 158, 745, 573, 452, 116, 149, 306, 158, 255, 80, 360 }, 15 },
	{ "Hello, world!", { 1, 80, 1443, 410, 555, 4 }, 6 },
	{ "Hello", { 1, 80, 1288, 67 }, 4 },
};
static const struct golden stories260k_golden[] = {
	{ "Once upon a time", { 1, 403, 407, 261, 378 }, 5 },
	{ "", { 1 }, 1 },
	{ "I believe the meaning of life is",
	  { 1, 359, 329, 421, 417, 411, 360, 265, 284, 411, 303, 299, 373, 397, 431,
	    411, 410, 293 }, 18 },
	{ "Hello, world!", { 1, 346, 306, 414, 432, 263, 304, 341, 443 }, 9 },
	{ "Hello", { 1, 346, 306, 414 }, 4 },
};

static void check_golden(const struct tokenizer *t, const char *name,
			 const struct golden *g, size_t n_g)
{
	int32_t ids[64];
	char what[128];

	for (size_t i = 0; i < n_g; i++) {
		int n = enc(t, g[i].prompt, tokenizer_add_bos(t), 0, ids, 64);
		snprintf(what, sizeof what, "%s \"%s\"", name, g[i].prompt);
		CHECK_IDS(what, ids, n, g[i].ids, g[i].n);
	}
}

static void test_tinystories(void)
{
	static const char *const files[] = {
		"derived/TinyStories-656K-f32.gguf", "derived/TinyStories-656K-q8_0.gguf",
		"derived/TinyStories-656K-q4_0.gguf" };
	/* llama.cpp snapshots of TinyStories-656K (kototama), no BOS */
	static const struct golden snap[] = {
		{ "Hello, world!", { 80, 1443, 410, 555, 4 }, 5 },
		{ "line one\nline two\nline three",
		  { 80, 158, 195, 80, 719, 3, 158, 195, 80, 865, 67, 3, 158, 195, 80, 1161, 57 }, 17 },
		{ "1, 2, 3, 4, 5", { 80, 12, 94, 13, 94, 14, 94, 15, 94, 16 }, 10 },
	};

	for (size_t k = 0; k < ARRAY_LEN(files); k++) {
		const char *path = test_model_path(files[k]);
		struct gguf_file *f;
		struct tokenizer *t;
		int32_t ids[64];
		char what[128];

		if (!path) {
			fprintf(stderr, "%s absent: skipping\n", files[k]);
			models_missing++;
			continue;
		}
		models_found++;
		if (!(t = load_file(path, &f)))
			continue;
		CHECK_INT_EQ(tokenizer_n_vocab(t), 2048);
		CHECK_INT_EQ(tokenizer_bos(t), 1);
		CHECK_INT_EQ(tokenizer_eos(t), 2);
		CHECK_INT_EQ(tokenizer_add_bos(t), 1);
		CHECK_INT_EQ(tokenizer_is_eog(t, 2), 1);
		CHECK_INT_EQ(tokenizer_is_eog(t, 1), 0);
		check_golden(t, files[k], tinystories_golden, ARRAY_LEN(tinystories_golden));
		for (size_t i = 0; i < ARRAY_LEN(snap); i++) {
			int n = enc(t, snap[i].prompt, 0, 0, ids, 64);
			snprintf(what, sizeof what, "%s snapshot %zu", files[k], i);
			CHECK_IDS(what, ids, n, snap[i].ids, snap[i].n);
		}
		/* no byte tokens: an unknown character is <unk> (id 0) per byte */
		int n = enc(t, "\xe4\xb8\xad", 0, 0, ids, 64);
		CHECK_IDS("656K unknown char", ids, n, ((int32_t[]){ 80, 0, 0, 0 }), 4);
		tokenizer_free(t);
		gguf_close(f);
	}
}

static void test_stories260k(void)
{
	const char *path = test_model_path("stories260K.gguf");
	struct gguf_file *f;
	struct tokenizer *t;
	int32_t ids[128];
	char buf[256], out[256];
	int n;

	if (!path) {
		fprintf(stderr, "stories260K.gguf absent: skipping\n");
		models_missing++;
		return;
	}
	models_found++;
	if (!(t = load_file(path, &f)))
		return;
	CHECK_INT_EQ(tokenizer_n_vocab(t), 512);
	check_golden(t, "stories260K", stories260k_golden, ARRAY_LEN(stories260k_golden));
	/* llama.cpp's server tests count these prompts' tokens with BOS */
	CHECK_INT_EQ(enc(t, "I believe the meaning of life is", 1, 0, ids, 128), 18);
	CHECK_INT_EQ(enc(t, "Write a joke about AI from a very long prompt which will not be truncated",
			 1, 0, ids, 128), 46);

	/* pieces: U+2581 -> ' ', <0xXX> -> the byte, control text only if special */
	int32_t a = tokenizer_find(t, "<0x41>");
	CHECK(a >= 0);
	CHECK_INT_EQ(tokenizer_piece(t, a, 0, buf, sizeof buf), 1);
	CHECK(buf[0] == 'A');
	CHECK_INT_EQ(tokenizer_piece(t, 1, 0, buf, sizeof buf), 0);
	CHECK_INT_EQ(tokenizer_piece(t, 1, 1, buf, sizeof buf), 3);
	CHECK(memcmp(buf, "<s>", 3) == 0);
	CHECK_INT_EQ(tokenizer_piece(t, -1, 1, buf, sizeof buf), 0);
	CHECK_INT_EQ(tokenizer_piece(t, 512, 1, buf, sizeof buf), 0);

	/* round trip, with byte fallback for CJK and an emoji */
	static const char *const texts[] = {
		"Hello, world!", "  two  spaces\tand a tab\n", "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
		"Gr\xc3\xbc\xc3\x9f" "e", };
	for (size_t i = 0; i < ARRAY_LEN(texts); i++) {
		n = enc(t, texts[i], 0, 0, ids, 128);
		size_t len = detok_all(t, ids, n, out, sizeof out - 1);
		out[len] = '\0';
		snprintf(buf, sizeof buf, " %s", texts[i]); /* the prefix space */
		CHECK_STR_EQ(out, buf);
	}
	/* invalid UTF-8 goes through byte fallback */
	n = enc(t, "a\xff", 0, 0, ids, 128);
	CHECK(n >= 2);
	CHECK_INT_EQ(ids[n - 1], tokenizer_find(t, "<0xFF>"));

	/* incremental detokenization over byte tokens */
	struct detok d = { .n_pending = 0 };
	int32_t f0 = tokenizer_find(t, "<0xF0>"), x9f = tokenizer_find(t, "<0x9F>");
	int32_t x98 = tokenizer_find(t, "<0x98>"), x80 = tokenizer_find(t, "<0x80>");
	int32_t e4 = tokenizer_find(t, "<0xE4>"), b8 = tokenizer_find(t, "<0xB8>");
	int32_t ed = tokenizer_find(t, "<0xED>"), a0 = tokenizer_find(t, "<0xA0>");
	int32_t c0 = tokenizer_find(t, "<0xC0>");
	CHECK_INT_EQ(detok_push(t, &d, f0, 0, out, sizeof out), 0);
	CHECK_INT_EQ(detok_push(t, &d, x9f, 0, out, sizeof out), 0);
	CHECK_INT_EQ(detok_push(t, &d, x98, 0, out, sizeof out), 0);
	CHECK_INT_EQ(detok_push(t, &d, x80, 0, out, sizeof out), 4);
	CHECK(memcmp(out, "\xf0\x9f\x98\x80", 4) == 0);
	CHECK_INT_EQ(d.n_pending, 0);
	/* an interrupted character is one U+FFFD, then what interrupted it */
	detok_push(t, &d, f0, 0, out, sizeof out);
	detok_push(t, &d, x9f, 0, out, sizeof out);
	n = detok_push(t, &d, a, 0, out, sizeof out);
	CHECK_INT_EQ(n, 4);
	CHECK(memcmp(out, FFFD "A", 4) == 0);
	/* a stray continuation byte */
	n = detok_push(t, &d, x80, 0, out, sizeof out);
	CHECK_INT_EQ(n, 3);
	CHECK(memcmp(out, FFFD, 3) == 0);
	/* a surrogate (ED A0 80) and an overlong (C0 80): one U+FFFD per byte */
	CHECK_INT_EQ(detok_push(t, &d, ed, 0, out, sizeof out), 0);
	n = detok_push(t, &d, a0, 0, out, sizeof out);
	n += detok_push(t, &d, x80, 0, out + n, sizeof out - (size_t)n);
	n += detok_push(t, &d, c0, 0, out + n, sizeof out - (size_t)n);
	n += detok_push(t, &d, x80, 0, out + n, sizeof out - (size_t)n);
	CHECK_INT_EQ(n, 15);
	CHECK(memcmp(out, FFFD FFFD FFFD FFFD FFFD, 15) == 0);
	/* a truncated character at the end flushes as U+FFFD */
	detok_push(t, &d, e4, 0, out, sizeof out);
	detok_push(t, &d, b8, 0, out, sizeof out);
	CHECK_INT_EQ(d.n_pending, 2);
	CHECK_INT_EQ(detok_flush(&d, out, sizeof out), 3);
	CHECK(memcmp(out, FFFD, 3) == 0);
	CHECK_INT_EQ(detok_flush(&d, out, sizeof out), 0);
	/* control tokens are silent unless special */
	CHECK_INT_EQ(detok_push(t, &d, 1, 0, out, sizeof out), 0);
	CHECK_INT_EQ(detok_push(t, &d, 1, 1, out, sizeof out), 3);
	/* a full output buffer drops whole characters, never overflows */
	detok_push(t, &d, f0, 0, out, sizeof out);
	detok_push(t, &d, x9f, 0, out, sizeof out);
	detok_push(t, &d, x98, 0, out, sizeof out);
	memset(out, 'z', 8);
	CHECK_INT_EQ(detok_push(t, &d, x80, 0, out, 3), 0);
	CHECK(out[0] == 'z');

	tokenizer_free(t);
	gguf_close(f);
}

/* ---- SmolLM2 (gpt2 / smollm) against the HF-tokenizers oracle ---- */

struct pinned {
	const char *text;
	int special;          /* parse_special */
	int32_t ids[32];
	int n;
};

/* Checked with HF tokenizers 0.23.3: models.BPE over the GGUF's tokens and
 * merges, pre-tokenizer Sequence[Digits(individual_digits), ByteLevel(
 * use_regex)] as in SmolLM2's tokenizer.json, its 17 control tokens added
 * as special tokens (parse_special = 1) or not (0). */
static const struct pinned smollm2_pins[] = {
	{ "Hello, world!", 0, { 19556, 28, 905, 17 }, 4 },
	{ "The quick brown fox jumps over the lazy dog.", 0,
	  { 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30 }, 10 },
	{ "  leading, trailing and   multiple spaces   ", 0,
	  { 216, 2899, 28, 35079, 284, 256, 2701, 5600, 333 }, 9 },
	{ "tabs\tand\t\tnewlines\n\n\n  x", 0,
	  { 100, 7366, 197, 397, 197, 197, 2241, 5110, 1116, 3805, 1792 }, 11 },
	{ "12345 3.14", 0, { 33, 34, 35, 36, 37, 216, 35, 30, 33, 36 }, 10 },
	{ "I'm don't we'll they've", 0, { 57, 5248, 1326, 982, 392, 3060, 502, 3543 }, 8 },
	{ "def f(x):\n    return x**2", 0,
	  { 1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34 }, 10 },
	{ "Grüße aus München, schöne Äpfel", 0,
	  { 27302, 7170, 34878, 85, 253, 376, 30919, 94, 7554, 28, 11659, 7466, 662,
	    5549, 222, 96, 34520 }, 17 },
	{ "你好，世界！这是一个测试。", 0,
	  { 18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 48287,
	    27830, 43340, 43222, 229, 16313, 239, 19076 }, 20 },
	{ "Привет, как дела?", 0,
	  { 155, 249, 46879, 16464, 32547, 28, 31338, 6511, 13760, 33427, 42292, 6511, 47 }, 13 },
	{ "مرحبا بالعالم", 0,
	  { 21706, 20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706 }, 10 },
	/* emoji, skin tone, and a ZWJ family sequence */
	{ "emoji \U0001F600\U0001F44D\U0001F3FD and "
	  "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466", 0,
	  { 391, 33777, 40303, 218, 10813, 235, 231, 10813, 233, 138, 284, 15107, 235,
	    118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813,
	    235, 116 }, 29 },
	{ "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", 1,
	  { 1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198 }, 11 },
	{ "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", 0,
	  { 44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 665, 44, 108, 306, 79,
	    486, 108, 46, 198, 44, 108, 306, 79, 3738, 108, 46, 520, 9531, 198 }, 29 },
	{ " ", 0, { 216 }, 1 },
};

static void test_smollm2(void)
{
	const char *path = test_smollm2_path();
	struct gguf_file *f;
	struct tokenizer *t;
	char err[256], out[4096], what[96];
	int32_t ids[4096];
	int n;

	if (!path) {
		fprintf(stderr, "SmolLM2 model absent (LLMD_SMOLLM2): skipping its checks\n");
		models_missing++;
		return;
	}
	models_found++;
	if (gguf_open(path, &f, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
	double t0 = clock_s() * 1e3;
	int rc = tokenizer_from_gguf(f, &t, err, sizeof err);
	double t1 = clock_s() * 1e3;
	if (rc) {
		fprintf(stderr, "%s: tokenizer: %s\n", path, err);
		test_failures++;
		gguf_close(f);
		return;
	}
	printf("SmolLM2 tokenizer load: %.2f ms\n", t1 - t0);
	gguf_close(f); /* the tokenizer keeps no pointer into the file */

	CHECK_STR_EQ(tokenizer_model(t), "gpt2");
	CHECK_INT_EQ(tokenizer_n_vocab(t), 49152);
	CHECK_INT_EQ(tokenizer_bos(t), 1);
	CHECK_INT_EQ(tokenizer_eos(t), 2);
	CHECK_INT_EQ(tokenizer_add_bos(t), 0);
	CHECK_INT_EQ(tokenizer_find(t, "<|im_start|>"), 1);
	CHECK_INT_EQ(tokenizer_find(t, "<|im_end|>"), 2);
	/* EOG as llama.cpp: eos, <|endoftext|>, <|im_end|>, and <reponame>
	 * (its FIM repo token) */
	CHECK_INT_EQ(tokenizer_is_eog(t, 0), 1);
	CHECK_INT_EQ(tokenizer_is_eog(t, 2), 1);
	CHECK_INT_EQ(tokenizer_is_eog(t, 4), 1);
	CHECK_INT_EQ(tokenizer_is_eog(t, 1), 0);
	CHECK_INT_EQ(tokenizer_is_eog(t, 3), 0);
	CHECK_INT_EQ(tokenizer_is_eog(t, 28), 0);

	for (size_t i = 0; i < ARRAY_LEN(smollm2_pins); i++) {
		const struct pinned *p = &smollm2_pins[i];
		size_t len = strlen(p->text);

		n = tokenizer_encode(t, p->text, len, tokenizer_add_bos(t), p->special, ids, 4096);
		snprintf(what, sizeof what, "SmolLM2 pin %zu (special %d)", i, p->special);
		CHECK_IDS(what, ids, n, p->ids, p->n);
		/* round trip through the incremental detokenizer */
		size_t dl = detok_all(t, ids, n, out, sizeof out - 1);
		out[dl] = '\0';
		CHECK_STR_EQ(out, p->text);
		/* a cap smaller than the result: full count, no overflow */
		int32_t small[4] = { -7, -7, -7, -7 };
		n = tokenizer_encode(t, p->text, len, 0, p->special, small, 3);
		CHECK_INT_EQ(n, p->n);
		CHECK_INT_EQ(small[3], -7);
		for (int j = 0; j < 3 && j < p->n; j++)
			CHECK_INT_EQ(small[j], p->ids[j]);
		CHECK_INT_EQ(tokenizer_encode(t, p->text, len, 0, p->special, NULL, 0), p->n);
	}
	/* BOS on request, empty text */
	CHECK_INT_EQ(tokenizer_encode(t, "", 0, 1, 0, ids, 4), 1);
	CHECK_INT_EQ(ids[0], 1);
	CHECK_INT_EQ(tokenizer_encode(t, NULL, 0, 0, 0, ids, 4), 0);
	CHECK_INT_EQ(tokenizer_encode(t, "x", 1, 0, 0, ids, -1), -EINVAL);

	/* control pieces only with special */
	CHECK_INT_EQ(tokenizer_piece(t, 1, 0, out, sizeof out), 0);
	CHECK_INT_EQ(tokenizer_piece(t, 1, 1, out, sizeof out), 12);
	CHECK(memcmp(out, "<|im_start|>", 12) == 0);
	/* a short buffer: full length returned, only CAP written */
	memset(out, 'z', 8);
	CHECK_INT_EQ(tokenizer_piece(t, 1, 1, out, 4), 12);
	CHECK(memcmp(out, "<|imzzzz", 8) == 0);

	/* an emoji split over single-byte tokens streams out whole */
	static const uint8_t bytes[] = { 0xf0, 0x9f, 0x98, 0x80 };
	struct detok d = { .n_pending = 0 };
	for (int i = 0; i < 4; i++) {
		char ch[3];
		gpt2_char(bytes[i], ch);
		int32_t id = tokenizer_find(t, ch);
		CHECK(id >= 0);
		CHECK_INT_EQ(tokenizer_piece(t, id, 0, out, sizeof out), 1);
		n = detok_push(t, &d, id, 0, out, sizeof out);
		CHECK_INT_EQ(n, i < 3 ? 0 : 4);
	}
	CHECK(memcmp(out, "\xf0\x9f\x98\x80", 4) == 0);

	/* invalid UTF-8: as llama.cpp, each byte of a bad sequence is encoded
	 * as U+FFFD (SmolLM2 has no token for the bytes 0xfe and 0xff) */
	static const char bad[] = "ab\xff\xfe" "cd \xe4\xb8 \xed\xa0\x80!";
	static const char bad_fixed[] =
		"ab" FFFD FFFD "cd " FFFD FFFD " " FFFD FFFD FFFD "!";
	int32_t fixed_ids[64];
	n = tokenizer_encode(t, bad, sizeof bad - 1, 0, 0, ids, 4096);
	CHECK_IDS("invalid UTF-8", ids, n, fixed_ids,
		  enc(t, bad_fixed, 0, 0, fixed_ids, 64));
	size_t dl = detok_all(t, ids, n, out, sizeof out - 1);
	out[dl] = '\0';
	CHECK_STR_EQ(out, bad_fixed);

	/* speed: ~10 KB of mixed text */
	static const char para[] =
		"The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock; "
		"\"quotes\", (parens) and code: for (i = 0; i < 10; i++) x += i*2;\n"
		"Gr\xc3\xbc\xc3\x9f" "e aus M\xc3\xbc" "nchen! \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82. "
		"\xe4\xb8\xad\xe6\x96\x87. \xf0\x9f\x98\x80\n\n";
	static char big[10 * 1024];
	size_t bl = 0;
	while (bl + sizeof para - 1 <= sizeof big) {
		memcpy(big + bl, para, sizeof para - 1);
		bl += sizeof para - 1;
	}
	double best = 1e9;
	for (int r = 0; r < 5; r++) {
		double a = clock_s() * 1e3;
		n = tokenizer_encode(t, big, bl, 0, 1, ids, 4096);
		double b = clock_s() * 1e3;
		if (b - a < best)
			best = b - a;
	}
	CHECK(n > 1000);
	printf("SmolLM2 encode of %zu bytes: %d tokens in %.3f ms\n", bl, n, best);
	tokenizer_free(t);
}

int main(void)
{
	test_load_errors();
	test_bpe_merge_rank();
	test_bpe_specials();
	test_pre_types();
	test_spm_scores();
	test_tinystories();
	test_stories260k();
	test_smollm2();
	if (!test_failures && !models_found && models_missing)
		return TEST_SKIP; /* only the synthetic checks ran */
	return test_result();
}
