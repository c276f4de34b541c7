/* model.c - binds a GGUF file onto the Llama-family graph the engine runs.
 *
 * It checks that every tensor the graph needs is present with the right
 * shape and a supported type, reads the hyperparameters, and builds the
 * tokenizer and chat template.  It does not run anything: engine.c does.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errbuf.h"
#include "gguf.h"
#include "quant.h"
#include "tokenizer.h"

/* "<arch>.<key>" as u32 / f32; absent keys keep *ret (the default). */
static int arch_u32(const struct model *m, const char *key, int32_t *ret, int required,
		    char *err, size_t errlen)
{
	char full[128];
	uint32_t v;
	int r;

	snprintf(full, sizeof full, "%s.%s", m->hp.arch, key);
	r = gguf_get_u32(m->gguf, full, &v);
	if (r == -ENOENT && !required)
		return 0;
	if (r < 0 || v == 0 || v > (1u << 24))
		return errbuf_fail(err, errlen, -EINVAL, "key %s: %s", full,
				r == -ENOENT ? "missing" : "not a valid count");
	*ret = (int32_t)v;
	return 0;
}

static int arch_f32(const struct model *m, const char *key, float *ret, char *err, size_t errlen)
{
	char full[128];
	float v;
	int r;

	snprintf(full, sizeof full, "%s.%s", m->hp.arch, key);
	r = gguf_get_f32(m->gguf, full, &v);
	if (r == -ENOENT)
		return 0;
	if (r < 0 || !(v > 0) || v > 1e12f)
		return errbuf_fail(err, errlen, -EINVAL, "key %s: not a valid positive number", full);
	*ret = v;
	return 0;
}

/* Binds a 2-D weight NAME with ne = [n_in, n_out]; OPTIONAL ones may be absent
 * (returns 1 then). */
static int bind_weight(struct model *m, const char *name, int64_t n_in, int64_t n_out,
		       struct bk_weight *w, int optional, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
	const struct qtype_info *qi;

	if (!t) {
		if (optional)
			return 1;
		return errbuf_fail(err, errlen, -EINVAL, "tensor %s: missing", name);
	}
	qi = qtype_get(t->type);
	if (!qi || !qi->weight_ok)
		return errbuf_fail(err, errlen, -ENOTSUP,
				"tensor %s: weight type %s (ggml type %u) is not supported "
				"(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)", name,
				gguf_type_name(t->type), t->type);
	if (t->ne[0] != (uint64_t)n_in || t->ne[1] != (uint64_t)n_out || t->ne[2] != 1 || t->ne[3] != 1)
		return errbuf_fail(err, errlen, -EINVAL,
				"tensor %s: shape [%llu, %llu, %llu, %llu], expected [%lld, %lld]", name,
				(unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
				(long long)n_in, (long long)n_out);
	w->type = t->type;
	w->n_in = n_in;
	w->n_out = n_out;
	w->data = t->data;
	w->row_bytes = qtype_row_bytes(t->type, n_in);
	m->weight_bytes += t->nbytes;
	return 0;
}

/* Copies the 1-D norm vector NAME (F32/F16/BF16) into DST (n floats). */
static int bind_norm(struct model *m, const char *name, int64_t n, float *dst,
		     char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);

	if (!t)
		return errbuf_fail(err, errlen, -EINVAL, "tensor %s: missing", name);
	if (t->type != QT_F32 && t->type != QT_F16 && t->type != QT_BF16)
		return errbuf_fail(err, errlen, -ENOTSUP, "tensor %s: norm weights must be F32, F16 or BF16",
				name);
	if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
		return errbuf_fail(err, errlen, -EINVAL, "tensor %s: shape [%llu, %llu], expected [%lld]",
				name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				(long long)n);
	quant_dequantize_row(t->type, t->data, dst, n);
	m->weight_bytes += t->nbytes;
	return 0;
}

/* ---- architectures ---- */

struct arch_info {
	const char *name;             /* general.architecture */
	enum model_arch id;
	enum bk_rope_style rope_style;
};

static const struct arch_info arches[] = {
	{ "llama", MODEL_ARCH_LLAMA, BK_ROPE_NORMAL },
	/* Mistral-style files use the llama graph under their own prefix. */
	{ "mistral", MODEL_ARCH_LLAMA, BK_ROPE_NORMAL },
	{ "qwen2", MODEL_ARCH_QWEN2, BK_ROPE_NEOX },
	{ "qwen3", MODEL_ARCH_QWEN3, BK_ROPE_NEOX },
	{ "phi3", MODEL_ARCH_PHI3, BK_ROPE_NEOX },
	{ "gemma3", MODEL_ARCH_GEMMA3, BK_ROPE_NEOX },
};
#define ARCH_NAMES "llama, mistral, qwen2, qwen3, phi3, gemma3"

static const struct arch_info *arch_find(const char *name)
{
	for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++)
		if (strcmp(arches[i].name, name) == 0)
			return &arches[i];
	return NULL;
}

/* The sliding window (Gemma 3): attention.sliding_window positions on the
 * layers attention.sliding_window_pattern marks (an array of booleans, or
 * N: all but every Nth layer, default 6), with the local RoPE base
 * rope.freq_base_swa (default 10000).  Other architectures: none (llama.cpp
 * runs Phi-3's window as global attention too). */
static int load_swa(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	char key[128];
	int r;

	hp->n_swa = 0;
	if (hp->arch_id != MODEL_ARCH_GEMMA3)
		return 0;
	snprintf(key, sizeof key, "%s.attention.sliding_window", hp->arch);
	if (gguf_find_key(m->gguf, key) < 0)
		return 0;
	if ((r = arch_u32(m, "attention.sliding_window", &hp->n_swa, 1, err, errlen)) < 0)
		return r;
	hp->rope_base_swa = 10000.0f;
	return arch_f32(m, "rope.freq_base_swa", &hp->rope_base_swa, err, errlen);
}

/* RoPE scaling, as llama.cpp reads it: rope.scaling.type (absent: linear)
 * with rope.scaling.factor (or the old rope.scale_linear; absent or 0:
 * none), YaRN's extrapolation ramp between the pairs that turn
 * original_context_length / (2 pi) times at beta_fast 32 and beta_slow 1,
 * its magnitude 1 + 0.1 ln(factor) (with yarn_log_multiplier, the ratio
 * of two such), times rope.scaling.attn_factor; the frequency factors are
 * bound with the weights.  Fills hp->rope but for them. */
static int load_rope_scaling(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	struct bk_rope *rp = &hp->rope;
	char key[128];
	struct gguf_str st = { "linear", 6 };
	float factor = 0, attn = 1.0f, log_mul = 0;
	int32_t n_orig = hp->n_ctx_train;
	int r;

	*rp = bk_rope_plain(hp->n_rot, hp->rope_style, hp->rope_base);
	snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
	if (gguf_find_key(m->gguf, key) >= 0 && gguf_get_str(m->gguf, key, &st) < 0)
		return errbuf_fail(err, errlen, -EINVAL, "key %s: not a string", key);
	snprintf(key, sizeof key, "%s.rope.scaling.factor", hp->arch);
	if ((r = arch_f32(m, "rope.scaling.factor", &factor, err, errlen)) < 0 ||
	    (gguf_find_key(m->gguf, key) < 0 && (r = arch_f32(m, "rope.scale_linear", &factor, err, errlen)) < 0) ||
	    (r = arch_f32(m, "rope.scaling.attn_factor", &attn, err, errlen)) < 0 ||
	    (r = arch_u32(m, "rope.scaling.original_context_length", &n_orig, 0, err, errlen)) < 0)
		return r;
	snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", hp->arch);
	if (gguf_find_key(m->gguf, key) >= 0 && gguf_get_f32(m->gguf, key, &log_mul) < 0)
		return errbuf_fail(err, errlen, -EINVAL, "key %s: not a number", key);
	rp->mscale = attn;
	hp->n_ctx_orig = n_orig;
#define IS(lit) (st.len == sizeof lit - 1 && memcmp(st.ptr, lit, st.len) == 0)
	if (IS("none"))
		return 0;
	if (!IS("linear") && !IS("yarn"))
		return errbuf_fail(err, errlen, -ENOTSUP, "key %s.rope.scaling.type: \"%.*s\" is not supported "
				"(supported: none, linear, yarn)", hp->arch, (int)(st.len < 32 ? st.len : 32), st.ptr);
	if (factor > 0)
		rp->freq_scale = 1.0f / factor;
	if (IS("yarn") && factor > 1.0f) {
		/* llama.cpp's context: get_mscale(f, 1) (over get_mscale(f,
		 * log_mul)), with ggml's own 1 + 0.1 ln f cancelled, times
		 * attn_factor; then ggml's rope_yarn multiplies that back */
		float ms = 0.1f * logf(factor) + 1.0f;
		if (log_mul != 0)
			ms = ms / (0.1f * log_mul * logf(factor) + 1.0f);
		ms *= 1.0f / (1.0f + 0.1f * logf(factor));
		ms *= attn;
		rp->ext_factor = 1.0f;
		rp->mscale = ms * (1.0f + 0.1f * logf(1.0f / rp->freq_scale));
		/* ggml_rope_yarn_corr_dims with beta_fast 32, beta_slow 1 */
		const float nd = (float)hp->n_rot, lb = 2 * logf(hp->rope_base);
		float lo = floorf(nd * logf((float)n_orig / (32.0f * 2 * (float)M_PI)) / lb);
		float hi = ceilf(nd * logf((float)n_orig / (1.0f * 2 * (float)M_PI)) / lb);
		rp->corr_dims[0] = lo > 0 ? lo : 0;
		rp->corr_dims[1] = hi < nd - 1 ? hi : nd - 1;
	}
#undef IS
	return 0;
}

/* Whether layer IL of M is a sliding-window layer. */
static int layer_is_swa(const struct model *m, int32_t il, char *err, size_t errlen)
{
	char key[128];
	uint32_t n = 6;
	int r;

	if (!m->hp.n_swa)
		return 0;
	snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->hp.arch);
	if (gguf_find_key(m->gguf, key) < 0)
		return il % 6 < 5;
	r = gguf_get_u32(m->gguf, key, &n);
	if (r == 0)
		return n == 0 || (uint32_t)il % n < n - 1;
	const struct gguf_kv *kv;
	if (gguf_get_arr(m->gguf, key, GGUF_T_BOOL, &kv) < 0 || kv->arr_n != (uint64_t)m->hp.n_layer)
		return errbuf_fail(err, errlen, -EINVAL, "key %s: not a count or an array of %d booleans", key,
				m->hp.n_layer);
	return ((const uint8_t *)kv->data)[il] != 0;
}

static int load_hparams(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	struct gguf_str s;
	const struct gguf_tensor *emb;
	int32_t key_len = 0;
	float softcap = 0;
	int r;

	if (gguf_get_str(m->gguf, "general.architecture", &s) < 0)
		return errbuf_fail(err, errlen, -EINVAL, "key general.architecture: missing");
	if (s.len >= sizeof hp->arch)
		s.len = sizeof hp->arch - 1;
	memcpy(hp->arch, s.ptr, s.len);
	hp->arch[s.len] = 0;
	const struct arch_info *ai = arch_find(hp->arch);
	if (!ai)
		return errbuf_fail(err, errlen, -ENOTSUP,
				"architecture \"%s\" is not supported (supported: %s)", hp->arch, ARCH_NAMES);
	hp->arch_id = ai->id;

	if ((r = arch_u32(m, "embedding_length", &hp->n_embd, 1, err, errlen)) < 0 ||
	    (r = arch_u32(m, "block_count", &hp->n_layer, 1, err, errlen)) < 0 ||
	    (r = arch_u32(m, "attention.head_count", &hp->n_head, 1, err, errlen)) < 0 ||
	    (r = arch_u32(m, "feed_forward_length", &hp->n_ff, 1, err, errlen)) < 0)
		return r;
	hp->n_head_kv = hp->n_head;
	hp->n_ctx_train = 2048;
	hp->rope_base = 10000.0f;
	hp->rms_eps = 1e-5f;
	if ((r = arch_u32(m, "attention.head_count_kv", &hp->n_head_kv, 0, err, errlen)) < 0 ||
	    (r = arch_u32(m, "context_length", &hp->n_ctx_train, 0, err, errlen)) < 0 ||
	    (r = arch_u32(m, "attention.key_length", &key_len, 0, err, errlen)) < 0 ||
	    (r = arch_f32(m, "rope.freq_base", &hp->rope_base, err, errlen)) < 0 ||
	    (r = arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, errlen)) < 0)
		return r;
	/* Loaded, such a model would refuse every prompt. */
	if (hp->n_ctx_train < MODEL_MIN_CTX)
		return errbuf_fail(err, errlen, -EINVAL,
				"key %s.context_length: %d is too short: a sequence needs at least %d "
				"positions (a prompt token and a generated one)",
				hp->arch, hp->n_ctx_train, MODEL_MIN_CTX);
	if (hp->n_head % hp->n_head_kv)
		return errbuf_fail(err, errlen, -EINVAL, "head_count %d is not a multiple of head_count_kv %d",
				hp->n_head, hp->n_head_kv);
	hp->head_dim = key_len ? key_len : hp->n_embd / hp->n_head;
	if (!key_len && hp->n_embd % hp->n_head)
		return errbuf_fail(err, errlen, -EINVAL, "embedding_length %d is not a multiple of head_count %d",
				hp->n_embd, hp->n_head);
	if (hp->head_dim > 256 || hp->n_head / hp->n_head_kv > 16)
		return errbuf_fail(err, errlen, -ENOTSUP, "head_dim %d or GQA group %d is too large",
				hp->head_dim, hp->n_head / hp->n_head_kv);
	hp->n_rot = hp->head_dim;
	if ((r = arch_u32(m, "rope.dimension_count", &hp->n_rot, 0, err, errlen)) < 0)
		return r;
	if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
		return errbuf_fail(err, errlen, -EINVAL, "rope.dimension_count %d does not fit head_dim %d",
				hp->n_rot, hp->head_dim);
	hp->rope_style = ai->rope_style;
	if ((r = load_rope_scaling(m, err, errlen)) < 0)
		return r;
	hp->rope_base_swa = hp->rope_base;
	hp->act = BK_ACT_SILU;
	hp->embd_scale = 1.0f;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	if ((r = load_swa(m, err, errlen)) < 0)
		return r;
	if (hp->arch_id == MODEL_ARCH_GEMMA3) {
		hp->act = BK_ACT_GELU;
		hp->embd_scale = sqrtf((float)hp->n_embd);
		/* as llama.cpp (after gemma_pytorch): the 27B model (62 layers)
		 * scales by its d / n_head, the others by head_dim */
		if (hp->n_layer == 62)
			hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
		if ((r = arch_f32(m, "final_logit_softcapping", &softcap, err, errlen)) < 0)
			return r;
		if (softcap != 0)
			return errbuf_fail(err, errlen, -ENOTSUP, "key %s.final_logit_softcapping: not supported",
					hp->arch);
	}

	emb = gguf_find_tensor(m->gguf, "token_embd.weight");
	if (!emb)
		return errbuf_fail(err, errlen, -EINVAL, "tensor token_embd.weight: missing");
	if (emb->ne[1] < 1 || emb->ne[1] > (1u << 24))
		return errbuf_fail(err, errlen, -EINVAL, "tensor token_embd.weight: bad vocabulary size");
	hp->n_vocab = (int32_t)emb->ne[1];
	return 0;
}

/* Room for N floats of M's norm and bias vectors. */
static float *vec_alloc(struct model *m, int64_t n, size_t cap)
{
	float *p = m->norms + m->norms_used;

	if (m->norms_used + (size_t)n > cap)
		return NULL; /* cannot happen: load_weights counted them */
	m->norms_used += (size_t)n;
	return p;
}

/* Binds the 1-D vector NAME of N elements (a norm or a bias) into M's own
 * f32 copy at *RET; an OPTIONAL one may be absent (*RET NULL, returns 0). */
static int bind_vec(struct model *m, const char *name, int64_t n, int optional, const float **ret,
		    size_t cap, char *err, size_t errlen)
{
	float *dst;
	int r;

	*ret = NULL;
	if (optional && !gguf_find_tensor(m->gguf, name))
		return 0;
	if (!(dst = vec_alloc(m, n, cap)))
		return errbuf_fail(err, errlen, -EINVAL, "tensor %s: too many vectors", name);
	if ((r = bind_norm(m, name, n, dst, err, errlen)) < 0)
		return r;
	*ret = dst;
	return 0;
}

/* Rows [ROW0, ROW0 + N_OUT) of FUSED as a weight of their own: a view into
 * its data (Phi-3's fused qkv and gate-up; rows are whole in the file). */
static struct bk_weight weight_rows(const struct bk_weight *fused, int64_t row0, int64_t n_out)
{
	struct bk_weight w = *fused;

	w.data = (const char *)fused->data + (size_t)row0 * fused->row_bytes;
	w.n_out = n_out;
	return w;
}

static int load_weights(struct model *m, char *err, size_t errlen)
{
	struct model_hparams *hp = &m->hp;
	int64_t d = hp->n_embd, dq = (int64_t)hp->n_head * hp->head_dim;
	int64_t dkv = (int64_t)hp->n_head_kv * hp->head_dim;
	const int gemma = hp->arch_id == MODEL_ARCH_GEMMA3, phi3 = hp->arch_id == MODEL_ARCH_PHI3;
	const int qk_norm = gemma || hp->arch_id == MODEL_ARCH_QWEN3;
	/* every vector a layer may have: 4 norms of d, 2 of head_dim, 3 biases */
	const size_t cap = (size_t)d + (size_t)hp->n_rot +
			   (size_t)hp->n_layer * (size_t)(4 * d + 2 * hp->head_dim + dq + 2 * dkv);
	char name[96];
	int r;

	m->norms = calloc(cap, sizeof(float));
	m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
	if (!m->norms || !m->layers)
		return errbuf_fail(err, errlen, -ENOMEM, "out of memory");

	if ((r = bind_weight(m, "token_embd.weight", d, hp->n_vocab, &m->tok_embd, 0, err, errlen)) < 0)
		return r;
	if ((r = bind_vec(m, "output_norm.weight", d, 0, &m->output_norm, cap, err, errlen)) < 0)
		return r;
	if ((r = bind_vec(m, "rope_freqs.weight", hp->n_rot / 2, 1, &hp->rope.freq_factors, cap, err,
			  errlen)) < 0)
		return r;
	/* Phi-3 128k: short factors (as rope.freq_factors) and long ones, the
	 * engine choosing by its context (engine_new) */
	if (phi3 && gguf_find_tensor(m->gguf, "rope_factors_long.weight")) {
		if (hp->rope.freq_factors)
			return errbuf_fail(err, errlen, -EINVAL, "tensors rope_freqs and rope_factors_long: "
					"one kind of RoPE factors only");
		if ((r = bind_vec(m, "rope_factors_short.weight", hp->n_rot / 2, 0, &hp->rope.freq_factors, cap,
				  err, errlen)) < 0 ||
		    (r = bind_vec(m, "rope_factors_long.weight", hp->n_rot / 2, 0, &hp->rope_factors_long, cap,
				  err, errlen)) < 0)
			return r;
	}
	r = bind_weight(m, "output.weight", d, hp->n_vocab, &m->output, 1, err, errlen);
	if (r < 0)
		return r;
	if (r == 1) /* tied embeddings */
		m->output = m->tok_embd;

	for (int32_t i = 0; i < hp->n_layer; i++) {
		struct model_layer *L = &m->layers[i];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, i), name)
#define W(field, suffix, n_in, n_out) \
	if ((r = bind_weight(m, NAME(suffix ".weight"), n_in, n_out, &L->field, 0, err, errlen)) < 0) \
		return r;
#define V(field, suffix, n, optional) \
	if ((r = bind_vec(m, NAME(suffix), n, optional, &L->field, cap, err, errlen)) < 0) \
		return r;
		V(attn_norm, "attn_norm.weight", d, 0)
		V(ffn_norm, "ffn_norm.weight", d, 0)
		if (phi3 && !gguf_find_tensor(m->gguf, NAME("attn_q.weight"))) {
			struct bk_weight qkv;
			W(wq, "attn_qkv", d, dq + 2 * dkv)
			qkv = L->wq;
			L->wq = weight_rows(&qkv, 0, dq);
			L->wk = weight_rows(&qkv, dq, dkv);
			L->wv = weight_rows(&qkv, dq + dkv, dkv);
		} else {
			W(wq, "attn_q", d, dq)
			W(wk, "attn_k", d, dkv)
			W(wv, "attn_v", d, dkv)
		}
		W(wo, "attn_output", dq, d)
		if (hp->arch_id == MODEL_ARCH_QWEN2) {
			V(bq, "attn_q.bias", dq, 0)
			V(bk, "attn_k.bias", dkv, 0)
			V(bv, "attn_v.bias", dkv, 0)
		}
		if (qk_norm) {
			V(q_norm, "attn_q_norm.weight", hp->head_dim, 0)
			V(k_norm, "attn_k_norm.weight", hp->head_dim, 0)
		}
		if (gemma) {
			V(attn_post_norm, "post_attention_norm.weight", d, 0)
			V(ffn_post_norm, "post_ffw_norm.weight", d, 0)
		}
		if (phi3) { /* gate rows first, then up: llama.cpp's swiglu halves */
			struct bk_weight gu;
			W(w_up, "ffn_up", d, 2 * (int64_t)hp->n_ff)
			gu = L->w_up;
			L->w_gate = weight_rows(&gu, 0, hp->n_ff);
			L->w_up = weight_rows(&gu, hp->n_ff, hp->n_ff);
		} else {
			W(w_gate, "ffn_gate", d, hp->n_ff)
			W(w_up, "ffn_up", d, hp->n_ff)
		}
		W(w_down, "ffn_down", hp->n_ff, d)
#undef V
#undef W
#undef NAME
		if ((r = layer_is_swa(m, i, err, errlen)) < 0)
			return r;
		L->window = r ? hp->n_swa : 0;
		/* a sliding-window layer: its own base, never scaled (llama.cpp's
		 * rope_freq_scale_train_swa is 1) */
		L->rope = r ? bk_rope_plain(hp->n_rot, hp->rope_style, hp->rope_base_swa) : hp->rope;
	}
	return 0;
}

/* The text of token ID (BOS, EOS) into BUF (CAP bytes), or NULL when the
 * vocabulary has none. */
static const char *token_text(const struct model *m, int32_t id, char *buf, size_t cap)
{
	int n;

	if (id < 0)
		return NULL;
	n = tokenizer_piece(m->tok, id, 1, buf, cap - 1);
	if (n < 0)
		return NULL;
	buf[(size_t)n < cap - 1 ? (size_t)n : cap - 1] = 0;
	return buf;
}

/* Builds M's chat template from SRC (NUL-terminated; NULL: none), with its
 * BOS and EOS texts.  Where SRC is absent, a Gemma 3 file (the 270M one
 * carries none) gets the gemma family.  A source that does not compile, or
 * none that any family fits, leaves a note in m->chat_note. */
static int set_chat(struct model *m, const char *src)
{
	char bos[64], eos[64], err[256] = "";
	struct chat_template t;
	int r;

	if (!src && m->hp.arch_id == MODEL_ARCH_GEMMA3) {
		if ((r = chat_template_by_name("gemma", &t)) < 0)
			return r;
		snprintf(m->chat_note, sizeof m->chat_note, "no chat template in the file: the gemma family");
	} else {
		r = chat_template_from_source(src, token_text(m, tokenizer_bos(m->tok), bos, sizeof bos),
					      token_text(m, tokenizer_eos(m->tok), eos, sizeof eos),
					      tokenizer_add_bos(m->tok), &t, err, sizeof err);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			snprintf(m->chat_note, sizeof m->chat_note, "%s", src ? err : "no chat template in the file");
			memset(&t, 0, sizeof t);
		} else if (err[0]) {
			snprintf(m->chat_note, sizeof m->chat_note, "the template does not compile (%s): "
				 "the %s family instead", err, chat_template_name(t.family));
		} else {
			m->chat_note[0] = 0;
		}
	}
	chat_template_clear(&m->chat);
	m->chat = t;
	return 0;
}

static int load_chat(struct model *m)
{
	struct gguf_str s;
	char *src;
	int r;

	if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s) < 0)
		return set_chat(m, NULL);
	src = strndup(s.ptr, s.len);
	if (!src)
		return -ENOMEM;
	r = set_chat(m, src);
	free(src);
	return r;
}

int model_set_chat_template(struct model *m, const char *src, size_t len, char *err, size_t errlen)
{
	char bos[64], eos[64];
	struct chat_template t;
	char *s = strndup(src, len);
	int r;

	if (!s)
		return errbuf_fail(err, errlen, -ENOMEM, "out of memory");
	if (strlen(s) != len) {
		free(s);
		return errbuf_fail(err, errlen, -EINVAL, "the template holds a NUL byte");
	}
	/* the file's template must compile: no family fallback for a file
	 * the operator chose */
	r = chat_template_from_source(s, token_text(m, tokenizer_bos(m->tok), bos, sizeof bos),
				      token_text(m, tokenizer_eos(m->tok), eos, sizeof eos), tokenizer_add_bos(m->tok),
				      &t, err, errlen);
	free(s);
	if (r < 0)
		return r == -ENOTSUP ? -EINVAL : r;
	if (t.kind != CHAT_TMPL_JINJA) {
		chat_template_clear(&t);
		return -EINVAL; /* ERR holds the compile error */
	}
	chat_template_clear(&m->chat);
	m->chat = t;
	m->chat_note[0] = 0;
	return 0;
}

int model_load(const char *path, struct model **ret, char *err, size_t errlen)
{
	return model_load_flags(path, 0, ret, err, errlen);
}

int model_load_flags(const char *path, unsigned flags, struct model **ret, char *err,
		     size_t errlen)
{
	struct model *m;
	struct gguf_str s;
	uint32_t ft;
	int r;

	if (flags & ~MODEL_LOAD_NO_MMAP)
		return errbuf_fail(err, errlen, -EINVAL, "unknown load flags %#x", flags);
	if (!(m = calloc(1, sizeof *m)))
		return errbuf_fail(err, errlen, -ENOMEM, "out of memory");
	snprintf(m->path, sizeof m->path, "%s", path);
	r = gguf_open_flags(path, flags & MODEL_LOAD_NO_MMAP ? GGUF_OPEN_NO_MMAP : 0, &m->gguf,
			    err, errlen);
	if (r < 0)
		goto fail;
	m->file_bytes = m->gguf->size;
	m->file_type = gguf_get_u32(m->gguf, "general.file_type", &ft) == 0 ? ft : ~0u;
	if (gguf_get_str(m->gguf, "general.name", &s) == 0 && s.len < sizeof m->name) {
		memcpy(m->name, s.ptr, s.len);
	} else {
		const char *base = strrchr(path, '/');
		snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
	}
	if ((r = load_hparams(m, err, errlen)) < 0 || (r = load_weights(m, err, errlen)) < 0)
		goto fail;
	r = tokenizer_from_gguf(m->gguf, &m->tok, err, errlen);
	if (r < 0)
		goto fail;
	if (tokenizer_n_vocab(m->tok) != m->hp.n_vocab) {
		r = errbuf_fail(err, errlen, -EINVAL, "vocabulary has %d tokens but token_embd.weight has %d rows",
				tokenizer_n_vocab(m->tok), m->hp.n_vocab);
		goto fail;
	}
	r = load_chat(m);
	if (r < 0) {
		errbuf_fail(err, errlen, r, "chat template: %s", strerror(-r));
		goto fail;
	}
	*ret = m;
	return 0;
fail:
	model_free(m);
	return r;
}

/* Only where the file backs the pages: in anonymous memory (a private
 * copy, released pages) MADV_DONTNEED would zero them. */
void model_drop_weight(const struct model *m, const struct bk_weight *w)
{
	const struct gguf_file *g = m->gguf;
	const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)w->data, hi = lo + (uintptr_t)w->n_out * w->row_bytes;

	if (!g || lo < (uintptr_t)g->base || hi > (uintptr_t)g->base + g->file_bytes)
		return;
	lo = (lo + page - 1) & ~(page - 1);
	hi &= ~(page - 1);
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure changes nothing */
}

size_t model_file_mapping(const struct model *m, const void **ret_addr)
{
	if (!m->gguf || !m->gguf->file_bytes)
		return 0;
	*ret_addr = m->gguf->base;
	return m->gguf->file_bytes;
}

int model_release_weights(struct model *m, char *err, size_t errlen)
{
	int r = gguf_release_data(m->gguf);

	if (r < 0)
		return errbuf_fail(err, errlen, r, "cannot release the weights' memory: %s", strerror(-r));
	return 0;
}

uint64_t model_decode_bytes(const struct model *m)
{
	uint64_t b = (uint64_t)m->output.row_bytes * (uint64_t)m->output.n_out;

	for (int32_t l = 0; l < m->hp.n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const struct bk_weight *w[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
		for (int k = 0; k < 7; k++)
			b += (uint64_t)w[k]->row_bytes * (uint64_t)w[k]->n_out;
	}
	return b;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	tokenizer_free(m->tok);
	chat_template_clear(&m->chat);
	free(m->layers);
	free(m->norms);
	gguf_close(m->gguf);
	free(m);
}
