/* tokenizer.h - text <-> token ids from a GGUF vocabulary, as llama.cpp does it.
 *
 * Two models: "llama" (SentencePiece style: scores, byte fallback <0xXX>,
 * a space prepended, ' ' -> U+2581) and "gpt2" (byte-level BPE with ranked
 * merges after a pre-tokenizer regex chosen by tokenizer.ggml.pre; PCRE2).
 * Special tokens (CONTROL / USER_DEFINED types) are matched in the text when
 * asked.  Detokenization is incremental: a stream never emits half a UTF-8
 * character.  A struct tokenizer is immutable once built and may be used from
 * any thread; a struct detok is per sequence.
 */
#ifndef LLMD_TOKENIZER_H
#define LLMD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tokenizer;

/* GGUF token types */
enum tok_type {
	TOK_NORMAL = 1,
	TOK_UNKNOWN = 2,
	TOK_CONTROL = 3,
	TOK_USER_DEFINED = 4,
	TOK_UNUSED = 5,
	TOK_BYTE = 6,
};

/* Builds the tokenizer from the file's tokenizer.ggml.* keys.  Returns 0, or
 * a negative errno with a one-line message (unknown model or pre-tokenizer,
 * missing or inconsistent arrays).  The result copies what it needs: it does
 * not keep F. */
int tokenizer_from_gguf(const struct gguf_file *f, struct tokenizer **ret,
			char *err, size_t errlen);
void tokenizer_free(struct tokenizer *t); /* NULL-safe */

int tokenizer_n_vocab(const struct tokenizer *t);
/* "llama" or "gpt2" */
const char *tokenizer_model(const struct tokenizer *t);
/* Special ids, -1 when the vocabulary has none. */
int32_t tokenizer_bos(const struct tokenizer *t);
int32_t tokenizer_eos(const struct tokenizer *t);
/* 1 if ID ends generation: EOS, EOT, <|im_end|>, <|eot_id|>, <end_of_turn>... */
int tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* 1 if the model wants BOS prepended (tokenizer.ggml.add_bos_token, defaulting
 * as llama.cpp does: true for llama, false for gpt2). */
int tokenizer_add_bos(const struct tokenizer *t);
/* Id of a token whose text is exactly S, or -1. */
int32_t tokenizer_find(const struct tokenizer *t, const char *s);

/* Encodes LEN bytes of TEXT.  ADD_BOS prepends BOS (if the vocab has one);
 * PARSE_SPECIAL matches special-token texts such as "<|im_start|>" as single
 * tokens (otherwise they are plain text).  Writes at most CAP ids to OUT and
 * returns the total count (which may exceed CAP: call again with more room),
 * or a negative errno (-EINVAL for invalid UTF-8 is NOT an error: invalid
 * bytes go through byte fallback). */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     int add_bos, int parse_special, int32_t *out, int cap);

/* The raw bytes one token stands for (U+2581 -> ' ', <0x41> -> 'A', gpt2's
 * byte-level alphabet decoded; control tokens give their text only when
 * SPECIAL is 1, else nothing).  Returns the byte count; writes at most CAP. */
int tokenizer_piece(const struct tokenizer *t, int32_t id, int special,
		    char *buf, size_t cap);

/* Incremental detokenizer state: holds the bytes of an incomplete UTF-8
 * character between tokens. */
struct detok {
	uint8_t pending[8]; /* bytes of an unfinished character */
	int n_pending;      /* 0..7 */
};

/* Appends token ID's bytes to the state and writes to OUT only complete
 * UTF-8 characters (an invalid sequence is replaced by U+FFFD).  Returns the
 * number of bytes written; OUT must have room for CAP >= piece length + 8. */
int detok_push(const struct tokenizer *t, struct detok *d, int32_t id,
	       int special, char *out, size_t cap);
/* Emits whatever is pending (as U+FFFD for a truncated character). */
int detok_flush(struct detok *d, char *out, size_t cap);

#endif
