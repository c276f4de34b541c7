/* model.h - a Llama-family model loaded from GGUF: hyperparameters, weights
 * (left in the file mapping, or in a private copy of the file, in their
 * quantized form), tokenizer and chat template.  Immutable after model_load
 * (but for model_release_weights); any thread may read it.
 */
#ifndef LLMD_MODEL_H
#define LLMD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "chat.h"

struct gguf_file;
struct tokenizer;

/* The graphs llmd runs (GGUF general.architecture). */
enum model_arch {
	MODEL_ARCH_LLAMA = 0,  /* "llama", "mistral": the Llama graph */
	MODEL_ARCH_QWEN2 = 1,  /* the Llama graph with q, k and v biases */
	MODEL_ARCH_QWEN3 = 2,  /* the Llama graph with per-head q and k RMSNorm */
	MODEL_ARCH_PHI3 = 3,   /* fused qkv and gate-up projections */
	MODEL_ARCH_GEMMA3 = 4, /* scaled embeddings, q/k norms, pre- and post-norms,
	                          GeGLU, interleaved sliding-window layers */
};

struct model_hparams {
	char arch[32];          /* general.architecture: "llama" */
	enum model_arch arch_id;
	int32_t n_vocab;        /* rows of token_embd */
	int32_t n_embd;         /* d: residual width */
	int32_t n_layer;
	int32_t n_head;
	int32_t n_head_kv;
	int32_t head_dim;       /* key_length, else n_embd / n_head */
	int32_t n_ff;           /* FFN hidden width */
	int32_t n_ctx_train;    /* context length the model was trained for;
	                           at least MODEL_MIN_CTX */
	int32_t n_rot;          /* rotated dims per head */
	float rope_base;        /* rope.freq_base, default 10000 */
	float rope_base_swa;    /* the sliding-window layers' base (Gemma 3: 10000) */
	struct bk_rope rope;    /* the global layers' RoPE angles: n_rot, style, base,
	                           scaling (linear, YaRN) and frequency factors */
	const float *rope_factors_long; /* (n_rot / 2) Phi-3's factors for contexts past
	                           n_ctx_orig (rope.freq_factors then holds the short
	                           ones), or NULL */
	int32_t n_ctx_orig;     /* rope.scaling.original_context_length, else n_ctx_train */
	float rms_eps;
	enum bk_rope_style rope_style;
	enum bk_act act;        /* the FFN's gated activation */
	float embd_scale;       /* token embeddings times this (Gemma: sqrt(n_embd)); 1 */
	float attn_scale;       /* the q.k scale: 1/sqrt(head_dim) but for Gemma 3 27B */
	int32_t n_swa;          /* sliding window in positions; 0: none */
};

struct model_layer {
	const float *attn_norm;    /* (n_embd) */
	struct bk_weight wq;       /* (n_embd -> n_head*head_dim) */
	struct bk_weight wk;       /* (n_embd -> n_head_kv*head_dim) */
	struct bk_weight wv;       /* (n_embd -> n_head_kv*head_dim) */
	struct bk_weight wo;       /* (n_head*head_dim -> n_embd) */
	const float *bq, *bk, *bv; /* (n_head*head_dim), (kv dim) x 2: biases, or NULL */
	const float *q_norm;       /* (head_dim) per-head RMSNorm of q, or NULL */
	const float *k_norm;       /* (head_dim) the same for k, or NULL */
	const float *attn_post_norm; /* (n_embd) RMSNorm of the attention's output
	                              before the residual add, or NULL */
	const float *ffn_norm;     /* (n_embd) */
	struct bk_weight w_gate;   /* (n_embd -> n_ff) */
	struct bk_weight w_up;     /* (n_embd -> n_ff) */
	struct bk_weight w_down;   /* (n_ff -> n_embd) */
	const float *ffn_post_norm; /* (n_embd) the same after the FFN, or NULL */
	int32_t window;            /* sliding window of this layer; 0: global */
	struct bk_rope rope;       /* this layer's RoPE angles: hp.rope, or on a
	                              sliding-window layer its own base unscaled */
};

struct model {
	struct model_hparams hp;
	char name[128];               /* general.name, or the file's base name */
	char path[1024];              /* as given to model_load */
	uint64_t file_bytes;          /* size of the GGUF file */
	uint64_t weight_bytes;        /* bytes of all weight tensors */
	uint32_t file_type;           /* general.file_type (ggml ftype), or ~0 */
	struct gguf_file *gguf;       /* the file's bytes the weights point into
	                                 (mapped, or a private copy); owned */
	struct tokenizer *tok;        /* owned */
	struct chat_template chat;    /* kind 0 when the model has none llmd runs */
	char chat_note[320];          /* why the file's template is not what
	                                 chat runs (absent, does not compile), or "" */
	struct bk_weight tok_embd;    /* (n_embd, n_vocab) */
	const float *output_norm;     /* (n_embd) */
	struct bk_weight output;      /* (n_embd -> n_vocab); token_embd when tied */
	struct model_layer *layers;   /* (n_layer) */
	float *norms;                 /* owned f32 copies of all norm and bias
	                                 vectors, (norms_used) floats */
	size_t norms_used;
};

/* The fewest positions a sequence can run in: one prompt token and one
 * generated token (the scheduler admits a prompt only with room for one
 * more).  A model whose context_length is shorter is refused at load. */
#define MODEL_MIN_CTX 2

/* model_load_flags: read the file into private memory instead of mapping
 * it (model.mmap = false): the file may then be replaced or truncated under
 * a running daemon, at the price of the weights' size in anonymous memory
 * that the kernel cannot drop and read back. */
#define MODEL_LOAD_NO_MMAP 1u

/* Loads PATH.  Returns 0, or a negative errno with a one-line reason in ERR
 * (unsupported architecture or weight type, missing tensor, shape mismatch,
 * a hyperparameter out of range, corrupt file).  Any thread. */
int model_load(const char *path, struct model **ret, char *err, size_t errlen);
/* model_load with FLAGS (MODEL_LOAD_*; 0 is model_load). */
int model_load_flags(const char *path, unsigned flags, struct model **ret, char *err,
		     size_t errlen);
void model_free(struct model *m); /* NULL-safe */

/* Replaces M's chat template with the Jinja source SRC (LEN bytes: the
 * operator's [model] chat_template file), which must compile.  Returns 0,
 * or -EINVAL with "line N: what" in ERR, -ENOMEM.  Before any other thread
 * reads M. */
int model_set_chat_template(struct model *m, const char *src, size_t len, char *err, size_t errlen);

/* The part of M's memory that a mapping of the model file backs, where a
 * read after the file was truncated under it raises SIGBUS: sets *RET_ADDR
 * and returns its bytes; 0 (and *RET_ADDR untouched) when none (the file
 * was read into private memory).  Shrinks to the header's pages after
 * model_release_weights.  What a SIGBUS handler compares the faulting
 * address with.  Any thread. */
size_t model_file_mapping(const struct model *m, const void **ret_addr);

/* For a caller whose every engine on M made its own copy of every weight
 * (engine_reads_model_weights() == 0: a GPU backend once they are
 * uploaded): the weights' bytes are given back and made inaccessible, so
 * that a mapped file may then be replaced or truncated harmlessly.  The
 * weights' data pointers stay as identities (the backend's keys), but
 * nothing may read through them again, nor may an engine that reads them
 * be made on M; the hyperparameters, tokenizer and chat template are not
 * affected.  Returns 0 or a negative errno with a message in ERR.  Not
 * while another thread reads M's weights (before the engine thread starts). */
int model_release_weights(struct model *m, char *err, size_t errlen);
/* Bytes of weights one decode token reads whole: every layer's projections
 * and the output matrix (the embedding's one row and the norms, a few KiB,
 * left out).  What decode speed is measured against: bandwidth / this. */
uint64_t model_decode_bytes(const struct model *m);
/* W's bytes in the file mapping are not needed in memory now (a backend
 * keeps its own copy): the pages wholly inside them leave the resident
 * set, and come back from the file if touched.  A W outside the part of
 * the mapping the file backs (a private copy of the file, a caller's own
 * buffer) is left alone. */
void model_drop_weight(const struct model *m, const struct bk_weight *w);

#endif
