/* tokenizer.c - loads llama.cpp-compatible tokenizers from a GGUF vocabulary:
 * "llama" (SentencePiece scores, <0xXX> byte fallback) and "gpt2" (PCRE2
 * pre-tokenizer passes, byte-level alphabet, ranked merges).  Not here:
 * encoding (tokenizer_encode.c), decoding (tokenizer_decode.c), WordPiece,
 * Unigram or RWKV vocabularies, chat templates.
 */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "gguf.h"
#include "tokenizer_impl.h"

/* ---- the text map ---- */

static int map_rehash(struct tokenizer *t, uint32_t cap)
{
	struct text_slot *m = malloc((size_t)cap * sizeof *m);

	if (!m)
		return -ENOMEM;
	for (uint32_t i = 0; i < cap; i++)
		m[i].id = -1;
	for (uint32_t i = 0; i < t->map_cap; i++) {
		struct text_slot sl = t->map[i];
		if (sl.id < 0)
			continue;
		uint32_t j = sl.hash & (cap - 1);
		while (m[j].id >= 0)
			j = (j + 1) & (cap - 1);
		m[j] = sl;
	}
	free(t->map);
	t->map = m;
	t->map_cap = cap;
	return 0;
}

/* Appends text S[0..N) as id n_text; maps it unless the text is already
 * mapped (the first id wins).  Returns the new id or a negative errno. */
static int32_t text_add(struct tokenizer *t, const char *s, size_t n)
{
	int32_t id;
	int rc;

	if (n > UINT32_MAX - 1 || t->pool_len + n + 1 > UINT32_MAX ||
	    t->n_text == INT32_MAX)
		return -E2BIG;
	rc = grow(&t->pool, &t->pool_cap, t->pool_len + n + 1, 1);
	if (rc)
		return rc;
	if (t->n_text == t->text_cap) {
		size_t cap = t->text_cap ? 2 * (size_t)t->text_cap : 1024;
		uint32_t *off = realloc(t->text_off, cap * sizeof *off);
		if (off)
			t->text_off = off;
		uint32_t *ln = realloc(t->text_len, cap * sizeof *ln);
		if (ln)
			t->text_len = ln;
		if (!off || !ln)
			return -ENOMEM;
		t->text_cap = cap > INT32_MAX ? INT32_MAX : (int32_t)cap;
	}
	if ((uint64_t)(t->n_text + 1) * 2 > t->map_cap) {
		rc = map_rehash(t, t->map_cap ? t->map_cap * 2 : 1024);
		if (rc)
			return rc;
	}
	id = t->n_text++;
	memcpy(t->pool + t->pool_len, s, n);
	t->pool[t->pool_len + n] = '\0';
	t->text_off[id] = (uint32_t)t->pool_len;
	t->text_len[id] = (uint32_t)n;
	t->pool_len += n + 1;

	uint32_t h = hash_bytes(s, n), mask = t->map_cap - 1;
	for (uint32_t i = h & mask;; i = (i + 1) & mask) {
		struct text_slot *sl = &t->map[i];
		if (sl->id < 0) {
			sl->hash = h;
			sl->id = id;
			break;
		}
		if (sl->hash == h && t->text_len[sl->id] == n &&
		    memcmp(text_of(t, sl->id), s, n) == 0)
			break; /* duplicate text: keep the first id */
	}
	return id;
}

/* Id of S[0..N), adding it as a virtual text when absent. */
static int32_t text_intern(struct tokenizer *t, const char *s, size_t n)
{
	int32_t id = text_lookup(t, s, n);

	return id >= 0 ? id : text_add(t, s, n);
}

/* ---- the gpt2 byte alphabet ---- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map to U+0100.. in byte order. */
static void byte_alphabet(struct tokenizer *t)
{
	int n = 0;

	for (int i = 0; i < 324; i++)
		t->bdec[i] = -1;
	for (int b = 0; b < 256; b++) {
		int printable = (b >= 0x21 && b <= 0x7e) ||
				(b >= 0xa1 && b <= 0xac) || (b >= 0xae);
		int cp = printable ? b : 256 + n++;
		t->bdec[cp] = (int16_t)b;
		if (cp < 0x80) {
			t->benc[b][0] = (uint8_t)cp;
			t->benc_len[b] = 1;
		} else {
			t->benc[b][0] = (uint8_t)(0xc0 | cp >> 6);
			t->benc[b][1] = (uint8_t)(0x80 | (cp & 0x3f));
			t->benc_len[b] = 2;
		}
	}
}

/* ---- pre-tokenizers: llama.cpp's regex passes per tokenizer.ggml.pre ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_PUNCT "[\\p{P}\\$\\+<=>\\^~\\|]+"
#define RE_CJK_DS "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

static const char *const re_default[] = { RE_PUNCT, RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL };
static const char *const re_gpt2[] = { RE_GPT2, NULL };
static const char *const re_starcoder[] = { "\\p{N}", RE_GPT2, NULL };
static const char *const re_falcon[] = { RE_PUNCT, RE_GPT2, "[0-9][0-9][0-9]", NULL };
static const char *const re_llama3[] = { RE_LLAMA3, NULL };
static const char *const re_qwen2[] = { RE_QWEN2, NULL };
static const char *const re_qwen35[] = {
	RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL };
static const char *const re_deepseek_llm[] = {
	"[\\r\\n]",
	"\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
	"\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
	"\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
	"\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
	"\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
	"\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
	"\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"
	"\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"
	"\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
	"\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
	"\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
	"\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
	"\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
	"\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
	"\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
	"\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
	"\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
	"\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
	"\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
	"\\s+$",
	RE_CJK_DS,
	"\\p{N}+",
	NULL };
static const char *const re_deepseek_coder[] = {
	"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_DS, "\\p{N}", NULL };
static const char *const re_deepseek3[] = {
	"\\p{N}{1,3}",
	"[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL };
static const char *const re_poro[] = {
	" ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", NULL };
static const char *const re_tekken[] = {
	"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL };
static const char *const re_gpt4o[] = {
	"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL };
static const char *const re_seed_coder[] = {
	RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	NULL };
static const char *const re_bailingmoe[] = {
	"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
	NULL };

enum {
	PRE_IGNORE_MERGES = 1 << 0, /* whole-token pre-tokens skip merging */
	PRE_ADD_BOS = 1 << 1,       /* add_bos defaults to true */
	PRE_NO_BOS = 1 << 2,        /* BOS defaults to none */
};

struct pre_type {
	const char *name;           /* tokenizer.ggml.pre */
	const char *const *re;      /* passes, NULL-terminated */
	int flags;                  /* PRE_* */
};

static const struct pre_type pre_types[] = {
	{ "default", re_default, 0 },
	{ "gpt-2", re_gpt2, 0 }, { "phi-2", re_gpt2, 0 }, { "jina-es", re_gpt2, 0 },
	{ "jina-de", re_gpt2, 0 }, { "gigachat", re_gpt2, 0 },
	{ "jina-v2-es", re_gpt2, 0 }, { "jina-v2-de", re_gpt2, 0 },
	{ "jina-v1-en", re_gpt2, 0 }, { "jina-v2-code", re_gpt2, 0 },
	{ "roberta-bpe", re_gpt2, 0 }, { "a.x-4.0", re_gpt2, 0 },
	{ "mellum", re_gpt2, 0 }, { "modern-bert", re_gpt2, 0 },
	{ "exaone4", re_gpt2, 0 }, { "mpt", re_gpt2, 0 }, { "olmo", re_gpt2, 0 },
	{ "jais", re_gpt2, 0 }, { "trillion", re_gpt2, 0 },
	{ "granite-docling", re_gpt2, 0 },
	{ "llama3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "llama-v3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "llama-bpe", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "falcon3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "falcon-h1", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "pixtral", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "midm-2.0", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "lfm2", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "dbrx", re_llama3, 0 }, { "smaug-bpe", re_llama3, 0 },
	{ "glm4", re_llama3, PRE_NO_BOS }, { "chatglm-bpe", re_llama3, PRE_NO_BOS },
	{ "deepseek-llm", re_deepseek_llm, 0 },
	{ "deepseek-coder", re_deepseek_coder, 0 },
	{ "deepseek-v3", re_deepseek3, 0 },
	{ "falcon", re_falcon, 0 },
	{ "starcoder", re_starcoder, 0 }, { "refact", re_starcoder, 0 },
	{ "command-r", re_starcoder, 0 }, { "smollm", re_starcoder, 0 },
	{ "codeshell", re_starcoder, 0 }, { "exaone", re_starcoder, 0 },
	{ "minerva-7b", re_starcoder, 0 }, { "mellum2", re_starcoder, 0 },
	{ "qwen2", re_qwen2, 0 }, { "deepseek-r1-qwen", re_qwen2, 0 },
	{ "kormo", re_qwen2, 0 }, { "f2llmv2", re_qwen2, 0 },
	{ "megrez", re_qwen2, 0 }, { "stablelm2", re_qwen2, 0 },
	{ "hunyuan", re_qwen2, 0 }, { "solar-open", re_qwen2, 0 },
	{ "grok-2", re_qwen2, 0 },
	{ "qwen35", re_qwen35, 0 },
	{ "poro-chat", re_poro, 0 }, { "bloom", re_poro, 0 },
	{ "gpt3-finnish", re_poro, 0 },
	{ "tekken", re_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS },
	{ "gpt-4o", re_gpt4o, 0 }, { "llama4", re_gpt4o, 0 },
	{ "kanana2", re_gpt4o, 0 }, { "talkie", re_gpt4o, 0 },
	{ "seed-coder", re_seed_coder, 0 },
	{ "bailingmoe", re_bailingmoe, 0 }, { "bailingmoe2", re_bailingmoe, 0 },
	{ "llada-moe", re_bailingmoe, 0 },
};

/* ---- loading ---- */

/* Texts that end generation (llama.cpp's list); such tokens are also
 * treated as CONTROL whatever their GGUF type. */
static const char *const eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
	"<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
	"<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
	"<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
	"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[",
	NULL,
};
/* Texts that identify EOT when tokenizer.ggml.eot_token_id is absent. */
static const char *const eot_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
	"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
	"<end_of_utterance>", NULL,
};
static const char *const eom_texts[] = { "<|eom_id|>", NULL };
/* Fill-in-the-middle pad / repo / file separator: llama.cpp stops on them. */
static const char *const fim_pad_texts[] = {
	"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL };
static const char *const fim_rep_texts[] = {
	"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL };
static const char *const fim_sep_texts[] = { "<|file_sep|>", NULL };

static int32_t find_text_in(const struct tokenizer *t, const char *const *list)
{
	int32_t best = -1;

	for (; *list; list++) {
		int32_t id = text_lookup(t, *list, strlen(*list));
		if (id >= 0 && id < t->n_vocab && (best < 0 || id < best))
			best = id;
	}
	return best;
}

/* A special id from KEY: DEF when absent or out of range (llama.cpp). */
static int32_t key_id(const struct tokenizer *t, const struct gguf_file *f,
		      const char *key, int32_t def)
{
	uint32_t v;

	if (def >= t->n_vocab)
		def = -1;
	if (gguf_get_u32(f, key, &v) == 0 && v < (uint32_t)t->n_vocab)
		return (int32_t)v;
	return def;
}

static int find_bool(const struct gguf_file *f, const char *key, int def)
{
	int v;

	return gguf_get_bool(f, key, &v) == 0 ? !!v : def;
}

static int load_specials(struct tokenizer *t, const struct gguf_file *f,
			 char *err, size_t errlen)
{
	int32_t fim[3], id;
	int is_spm = t->model == MODEL_SPM;

	t->bos = key_id(t, f, "tokenizer.ggml.bos_token_id", is_spm ? 1 : t->bos);
	t->eos = key_id(t, f, "tokenizer.ggml.eos_token_id", is_spm ? 2 : -1);
	t->unk = key_id(t, f, "tokenizer.ggml.unknown_token_id", is_spm ? 0 : -1);
	t->eot = key_id(t, f, "tokenizer.ggml.eot_token_id", -1);
	t->eom = key_id(t, f, "tokenizer.ggml.eom_token_id", -1);
	fim[0] = key_id(t, f, "tokenizer.ggml.fim_pad_token_id", -1);
	fim[1] = key_id(t, f, "tokenizer.ggml.fim_rep_token_id", -1);
	fim[2] = key_id(t, f, "tokenizer.ggml.fim_sep_token_id", -1);

	t->add_bos = find_bool(f, "tokenizer.ggml.add_bos_token", t->add_bos);
	if (t->add_bos && t->bos < 0) {
		errbuf_set(err, errlen, "tokenizer.ggml.add_bos_token is true but there is no BOS token");
		return -EINVAL;
	}

	/* Auto-detection by text, as llama.cpp does it; the tokens found are
	 * made CONTROL so that they only match with parse_special. */
	if (t->eot < 0 && (t->eot = find_text_in(t, eot_texts)) >= 0)
		t->attr[t->eot] |= ATTR_CONTROL;
	if (t->eom < 0 && (t->eom = find_text_in(t, eom_texts)) >= 0)
		t->attr[t->eom] |= ATTR_CONTROL;
	if (fim[0] < 0 && (fim[0] = find_text_in(t, fim_pad_texts)) >= 0)
		t->attr[fim[0]] |= ATTR_CONTROL;
	if (fim[1] < 0 && (fim[1] = find_text_in(t, fim_rep_texts)) >= 0)
		t->attr[fim[1]] |= ATTR_CONTROL;
	if (fim[2] < 0 && (fim[2] = find_text_in(t, fim_sep_texts)) >= 0)
		t->attr[fim[2]] |= ATTR_CONTROL;

	for (int i = 0; i < 3; i++)
		if (fim[i] >= 0)
			t->attr[fim[i]] |= ATTR_EOG;
	for (const char *const *s = eog_texts; *s; s++) {
		id = text_lookup(t, *s, strlen(*s));
		if (id >= 0 && id < t->n_vocab)
			t->attr[id] |= ATTR_EOG | ATTR_CONTROL;
	}
	/* gpt-oss: these always render */
	static const char *const always[] = {
		"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL };
	for (const char *const *s = always; *s; s++) {
		id = text_lookup(t, *s, strlen(*s));
		if (id >= 0 && id < t->n_vocab)
			t->attr[id] = ATTR_USER_DEFINED | (t->attr[id] & ATTR_EOG);
	}
	if (t->eos >= 0)
		t->attr[t->eos] |= ATTR_EOG;
	if (t->eot >= 0)
		t->attr[t->eot] |= ATTR_EOG;
	if (t->eom >= 0)
		t->attr[t->eom] |= ATTR_EOG;

	/* o200k_harmony / solar-open: "<|end|>" ends a message, not generation */
	int32_t ret_id = text_lookup(t, "<|return|>", 10);
	int32_t call_id = text_lookup(t, "<|call|>", 8);
	int32_t calls_id = text_lookup(t, "<|calls|>", 9);
	int32_t flush_id = text_lookup(t, "<|flush|>", 9);
	int32_t end_id = text_lookup(t, "<|end|>", 7);
#define IS_EOG(x) ((x) >= 0 && (x) < t->n_vocab && (t->attr[x] & ATTR_EOG))
	int has_call = IS_EOG(call_id) || IS_EOG(calls_id);
	if (IS_EOG(end_id) && has_call && (IS_EOG(ret_id) || IS_EOG(flush_id)))
		t->attr[end_id] = ATTR_USER_DEFINED;
	/* gemma4 / paddleocr: "</s>" is not EOG next to "<|tool_response>" */
	int32_t tr_id = text_lookup(t, "<|tool_response>", 16);
	int32_t s_id = text_lookup(t, "</s>", 4);
	if (IS_EOG(tr_id) && IS_EOG(s_id))
		t->attr[s_id] = ATTR_NORMAL;
#undef IS_EOG
	return 0;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
	const struct tokenizer *t = arg;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	if (t->text_len[x] != t->text_len[y])
		return t->text_len[x] > t->text_len[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Decoded bytes of every token, the special form (llama.cpp's
 * token_to_piece cache). */
static int build_pieces(struct tokenizer *t)
{
	size_t total = 0, n = 0;

	for (int32_t id = 0; id < t->n_vocab; id++)
		total += t->text_len[id];
	if (total > UINT32_MAX - 1)
		return -E2BIG;
	t->piece_pool = malloc(total + 1);
	t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
	if (!t->piece_pool || !t->piece_off)
		return -ENOMEM;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		const uint8_t *s = (const uint8_t *)text_of(t, id);
		size_t len = t->text_len[id];
		uint8_t *o = (uint8_t *)t->piece_pool + n;
		int a = t->attr[id];

		t->piece_off[id] = (uint32_t)n;
		if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
			memcpy(o, s, len);
			n += len;
		} else if (a & ATTR_NORMAL) {
			for (size_t i = 0; i < len;) {
				if (t->model == MODEL_SPM) {
					if (i + 3 <= len && memcmp(s + i, SPM_SPACE, 3) == 0) {
						o[0] = ' ';
						o++, n++, i += 3;
					} else {
						*o++ = s[i++];
						n++;
					}
					continue;
				}
				/* gpt2: alphabet chars back to bytes; anything
				 * else passes through as its UTF-8 */
				size_t l = utf8_char_len(s + i, len - i);
				int cp = -1;
				if (l == 1)
					cp = s[i];
				else if (l == 2)
					cp = (s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
				if (cp >= 0 && cp < 324 && t->bdec[cp] >= 0) {
					*o++ = (uint8_t)t->bdec[cp];
					n++;
				} else {
					if (!l)
						l = 1;
					memcpy(o, s + i, l);
					o += l;
					n += l;
				}
				i += l;
			}
		} else if ((a & ATTR_BYTE) && len == 6 && memcmp(s, "<0x", 3) == 0 &&
			   s[5] == '>') {
			char hex[3] = { (char)s[3], (char)s[4], 0 };
			char *end;
			long v = strtol(hex, &end, 16);
			if (*end == '\0') {
				*o = (uint8_t)v;
				n++;
			}
		}
	}
	t->piece_off[t->n_vocab] = (uint32_t)n;
	return 0;
}

static int load_merges(struct tokenizer *t, const struct gguf_file *f,
		       char *err, size_t errlen)
{
	const struct gguf_kv *kv;
	char *buf = NULL;
	size_t buf_cap = 0;
	uint32_t cap = 1024;
	int rc;

	rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &kv);
	if (rc) {
		errbuf_set(err, errlen, "tokenizer.ggml.merges: %s",
			rc == -ENOENT ? "missing" : "not an array of strings");
		return rc == -ENOENT ? -EINVAL : rc;
	}
	if (kv->arr_n > INT32_MAX / 4) {
		errbuf_set(err, errlen, "tokenizer.ggml.merges: too many merges (%llu)",
			(unsigned long long)kv->arr_n);
		return -EINVAL;
	}
	while (cap < kv->arr_n * 2)
		cap *= 2;
	t->merges = malloc((size_t)cap * sizeof *t->merges);
	if (!t->merges)
		return -ENOMEM;
	t->merge_cap = cap;
	for (uint32_t i = 0; i < cap; i++)
		t->merges[i].key = UINT64_MAX;

	for (uint64_t i = 0; i < kv->arr_n; i++) {
		const char *s = kv->strs[i].ptr;
		size_t len = kv->strs[i].len;
		const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
		int32_t a, b, r;

		if (!sp)
			continue; /* llama.cpp maps it to ("", ""): never used */
		size_t la = (size_t)(sp - s), lb = len - la - 1;
		a = text_intern(t, s, la);
		b = a >= 0 ? text_intern(t, sp + 1, lb) : a;
		if (a < 0 || b < 0) {
			rc = a < 0 ? a : b;
			goto out;
		}
		if ((rc = grow(&buf, &buf_cap, la + lb, 1)))
			goto out;
		memcpy(buf, s, la);
		memcpy(buf + la, sp + 1, lb);
		r = text_intern(t, buf, la + lb);
		if (r < 0) {
			rc = r;
			goto out;
		}
		uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
		for (uint32_t j = hash_u64(key) & (cap - 1);; j = (j + 1) & (cap - 1)) {
			struct merge_slot *m = &t->merges[j];
			if (m->key == key)
				break; /* duplicate pair: the first rank wins */
			if (m->key == UINT64_MAX) {
				m->key = key;
				m->rank = (int32_t)i;
				m->res = r;
				break;
			}
		}
	}
	rc = 0;
out:
	free(buf);
	if (rc == -E2BIG)
		errbuf_set(err, errlen, "tokenizer.ggml.merges: texts too large");
	return rc;
}

static int load_regexes(struct tokenizer *t, const struct gguf_file *f,
			char *err, size_t errlen)
{
	struct gguf_str pre = { "default", 7 };
	const struct pre_type *p = NULL;

	/* llama.cpp falls back to "default" when the key is missing */
	if (gguf_find_key(f, "tokenizer.ggml.pre") >= 0 &&
	    gguf_get_str(f, "tokenizer.ggml.pre", &pre) != 0) {
		errbuf_set(err, errlen, "tokenizer.ggml.pre: not a string");
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof pre_types / sizeof pre_types[0]; i++)
		if (strlen(pre_types[i].name) == pre.len &&
		    memcmp(pre_types[i].name, pre.ptr, pre.len) == 0) {
			p = &pre_types[i];
			break;
		}
	if (!p) {
		errbuf_set(err, errlen, "unknown pre-tokenizer '%.*s'",
			(int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
		return -EINVAL;
	}
	t->ignore_merges = !!(p->flags & PRE_IGNORE_MERGES);
	t->add_bos = !!(p->flags & PRE_ADD_BOS);
	if (p->flags & PRE_NO_BOS)
		t->bos = -1;
	for (int i = 0; p->re[i]; i++) {
		int code;
		PCRE2_SIZE off;

		t->re[i] = pcre2_compile((PCRE2_SPTR)p->re[i], PCRE2_ZERO_TERMINATED,
					 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY,
					 &code, &off, NULL);
		if (!t->re[i]) {
			PCRE2_UCHAR msg[120];
			pcre2_get_error_message(code, msg, sizeof msg);
			errbuf_set(err, errlen, "pre-tokenizer '%s' regex %d: %s at offset %zu",
				p->name, i, (const char *)msg, (size_t)off);
			return -EINVAL;
		}
		t->n_re = i + 1;
		(void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); /* optional */
	}
	return 0;
}

int tokenizer_from_gguf(const struct gguf_file *f, struct tokenizer **ret,
			char *err, size_t errlen)
{
	struct tokenizer *t;
	const struct gguf_kv *toks, *scores = NULL, *types = NULL;
	struct gguf_str model;
	int rc;

	if (!f || !ret)
		return -EINVAL;
	if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 0) {
		errbuf_set(err, errlen, "tokenizer.ggml.model: missing or not a string");
		return -EINVAL;
	}
	t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	t->bos = t->eos = t->eot = t->eom = t->unk = -1;
	if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
		t->model = MODEL_SPM;
		t->add_bos = 1;
	} else if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
		t->model = MODEL_BPE;
	} else {
		errbuf_set(err, errlen, "unknown tokenizer model '%.*s'",
			(int)(model.len > 64 ? 64 : model.len), model.ptr);
		rc = -EINVAL;
		goto fail;
	}

	rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks);
	if (rc || toks->arr_n == 0 || toks->arr_n > INT32_MAX / 4) {
		errbuf_set(err, errlen, "tokenizer.ggml.tokens: %s",
			rc == -ENOENT ? "missing" : rc ? "not an array of strings" :
			toks->arr_n ? "too many tokens" : "empty");
		rc = -EINVAL;
		goto fail;
	}
	t->n_vocab = (int32_t)toks->arr_n;
	if (gguf_find_key(f, "tokenizer.ggml.scores") >= 0) {
		rc = gguf_get_arr(f, "tokenizer.ggml.scores", -1, &scores);
		if (rc || (scores->arr_type != GGUF_T_FLOAT32 &&
			   scores->arr_type != GGUF_T_INT32) ||
		    scores->arr_n < toks->arr_n) {
			errbuf_set(err, errlen, "tokenizer.ggml.scores: not a float32/int32 array of %d",
				t->n_vocab);
			rc = -EINVAL;
			goto fail;
		}
	}
	if (gguf_find_key(f, "tokenizer.ggml.token_type") >= 0) {
		rc = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32, &types);
		if (rc || types->arr_n < toks->arr_n) {
			errbuf_set(err, errlen, "tokenizer.ggml.token_type: not an int32 array of %d",
				t->n_vocab);
			rc = -EINVAL;
			goto fail;
		}
	}

	t->score = calloc((size_t)t->n_vocab, sizeof *t->score);
	t->attr = calloc((size_t)t->n_vocab, 1);
	if (!t->score || !t->attr) {
		rc = -ENOMEM;
		goto fail;
	}
	size_t total = 0;
	for (int32_t i = 0; i < t->n_vocab; i++)
		total += toks->strs[i].len + 1;
	if ((rc = grow(&t->pool, &t->pool_cap, total + 64, 1)))
		goto fail;
	uint32_t cap = 1024;
	while (cap < (uint64_t)t->n_vocab * 2 + 2)
		cap *= 2;
	if ((rc = map_rehash(t, cap)))
		goto fail;

	for (int32_t i = 0; i < t->n_vocab; i++) {
		const char *s = toks->strs[i].ptr;
		size_t len = toks->strs[i].len;
		char empty[32];

		if (len == 0) { /* as llama.cpp */
			len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%d]", i);
			s = empty;
		}
		rc = text_add(t, s, len);
		if (rc < 0) {
			errbuf_set(err, errlen, "tokenizer.ggml.tokens: texts too large");
			goto fail;
		}
		if (len > t->max_text_len)
			t->max_text_len = (uint32_t)len;
		if (scores && scores->arr_type == GGUF_T_FLOAT32) {
			memcpy(&t->score[i], (const char *)scores->data + 4 * (size_t)i, 4);
		} else if (scores) {
			int32_t v;
			memcpy(&v, (const char *)scores->data + 4 * (size_t)i, 4);
			t->score[i] = (float)v;
		}
		int32_t ty = TOK_NORMAL;
		if (types)
			memcpy(&ty, (const char *)types->data + 4 * (size_t)i, 4);
		switch (ty) {
		case TOK_NORMAL: t->attr[i] = ATTR_NORMAL; break;
		case TOK_UNKNOWN: t->attr[i] = ATTR_UNKNOWN; break;
		case TOK_CONTROL: t->attr[i] = ATTR_CONTROL; break;
		case TOK_USER_DEFINED: t->attr[i] = ATTR_USER_DEFINED; break;
		case TOK_UNUSED: t->attr[i] = ATTR_UNUSED; break;
		case TOK_BYTE: t->attr[i] = ATTR_BYTE; break;
		default: t->attr[i] = 0; break;
		}
	}

	if (t->model == MODEL_BPE) {
		byte_alphabet(t);
		if ((rc = load_regexes(t, f, err, errlen)))
			goto fail;
		if ((rc = load_merges(t, f, err, errlen)))
			goto fail;
	} else {
		t->add_space_prefix = find_bool(f, "tokenizer.ggml.add_space_prefix", 1);
	}
	if ((rc = load_specials(t, f, err, errlen)))
		goto fail;

	/* byte tables */
	for (int b = 0; b < 256; b++) {
		char c = (char)b, hex[7];
		if (t->model == MODEL_SPM) {
			snprintf(hex, sizeof hex, "<0x%02X>", b);
			int32_t id = text_lookup(t, hex, 6);
			if (id < 0)
				id = text_lookup(t, &c, 1);
			t->spm_byte[b] = id >= 0 ? id : t->unk;
		} else {
			t->bpe_sym[b] = text_lookup(t, (const char *)t->benc[b], t->benc_len[b]);
			int32_t id = text_lookup(t, &c, 1);
			t->bpe_single[b] = id < t->n_vocab ? id : -1;
		}
	}

	t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
	if (!t->special) {
		rc = -ENOMEM;
		goto fail;
	}
	for (int32_t i = 0; i < t->n_vocab; i++)
		if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
			t->special[t->n_special++] = i;
	qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

	if ((rc = build_pieces(t)))
		goto fail;
	*ret = t;
	return 0;
fail:
	if (rc == -ENOMEM)
		errbuf_set(err, errlen, "out of memory building the tokenizer");
	tokenizer_free(t);
	return rc < 0 ? rc : -EINVAL;
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	for (int i = 0; i < MAX_REGEX; i++)
		pcre2_code_free(t->re[i]);
	free(t->pool);
	free(t->text_off);
	free(t->text_len);
	free(t->map);
	free(t->score);
	free(t->attr);
	free(t->piece_pool);
	free(t->piece_off);
	free(t->merges);
	free(t->special);
	free(t);
}

/* ---- accessors ---- */

int tokenizer_n_vocab(const struct tokenizer *t)
{
	return t ? t->n_vocab : 0;
}

const char *tokenizer_model(const struct tokenizer *t)
{
	return t && t->model == MODEL_BPE ? "gpt2" : "llama";
}

int32_t tokenizer_bos(const struct tokenizer *t)
{
	return t ? t->bos : -1;
}

int32_t tokenizer_eos(const struct tokenizer *t)
{
	return t ? t->eos : -1;
}

int tokenizer_is_eog(const struct tokenizer *t, int32_t id)
{
	return t && id >= 0 && id < t->n_vocab && (t->attr[id] & ATTR_EOG);
}

int tokenizer_add_bos(const struct tokenizer *t)
{
	return t ? t->add_bos : 0;
}

int32_t tokenizer_find(const struct tokenizer *t, const char *s)
{
	int32_t id;

	if (!t || !s)
		return -1;
	id = text_lookup(t, s, strlen(s));
	return id < t->n_vocab ? id : -1;
}
