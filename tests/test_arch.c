/* test_arch.c - the architectures beyond Llama against llama.cpp's output.
 *
 * Gemma 3 270M Q4_K_M (fetched by `make fetch-models`; skipped when
 * absent): the prompt tokenizes to llama.cpp's ids, and greedy decoding
 * gives llama.cpp's ids for as long as llama.cpp's own top-2 margin stays
 * at least GEMMA_MARGIN at every step so far (quantized activations move
 * logits by up to about one between engines: a closer call may go either
 * way).  Prompts run past its 512-position sliding window in a second pass
 * with a small window (the file's own is 512): chunked prefill, decode and
 * several sequences in one step give the same logits bit for bit.
 */
#include <json-c/json.h>
#include <math.h>

#include <config.h>

#include "engine.h"
#include "model.h"
#include "quant.h"
#include "testseq.h"
#include "testutil.h"
#include "tokenizer.h"

#define MAX_TOKENS 1024
#define GEMMA_MARGIN 0.5

/* The backend new_engine makes engines on: the CPU, or (check_synth's
 * second pass, in a build with the emulated CUDA backend) CUDA. */
static int32_t engine_backend = ENGINE_BACKEND_CPU;
/* The context new_engine gives its engines; 0: the model's. */
static int32_t case_n_ctx;

static struct engine *new_engine(const struct model *m, uint32_t kv_type, int32_t n_tokens)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.backend = engine_backend;
	ep.n_ctx = case_n_ctx;
	ep.kv_type = kv_type;
	ep.kv_tokens = n_tokens;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "engine_new: %s\n", err);
		return NULL;
	}
	return e;
}

/* One case of a llama.cpp golden file on E's model M: prompt ids exactly,
 * then the generated ids while every margin so far is at least MIN_MARGIN. */
static void check_golden_case(struct engine *e, struct model *m, json_object *c, double min_margin)
{
	const char *prompt = json_object_get_string(json_object_object_get(c, "prompt"));
	json_object *want_prompt = json_object_object_get(c, "prompt_ids");
	json_object *want_gen = json_object_object_get(c, "generated_ids");
	json_object *margins = json_object_object_get(c, "margins");
	int32_t ids[MAX_TOKENS], gen[MAX_TOKENS];
	int n_want = (int)json_object_array_length(want_prompt), horizon = 0, n_gen, same = 0;
	int n_ids = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids, MAX_TOKENS);

	CHECK_INT_EQ(n_ids, n_want);
	for (int i = 0; i < n_ids && i < n_want; i++)
		if (ids[i] != json_object_get_int(json_object_array_get_idx(want_prompt, (size_t)i))) {
			fprintf(stderr, "\"%s\": prompt id %d: got %d, llama.cpp %d\n", prompt, i, ids[i],
				json_object_get_int(json_object_array_get_idx(want_prompt, (size_t)i)));
			test_failures++;
			return;
		}
	n_gen = (int)json_object_array_length(want_gen);
	while (horizon < n_gen && json_object_get_double(json_object_array_get_idx(margins, (size_t)horizon)) >= min_margin)
		horizon++;
	int n = tseq_greedy(e, ids, n_ids, n_gen, gen);
	CHECK_INT_EQ(n, n_gen);
	while (same < n && gen[same] == json_object_get_int(json_object_array_get_idx(want_gen, (size_t)same)))
		same++;
	if (same < horizon) {
		fprintf(stderr, "\"%s\" [%s]: step %d: got %d, llama.cpp %d (its margin %.3f)\n", prompt,
			quant_isa_name(quant_get_isa()), same, gen[same],
			json_object_get_int(json_object_array_get_idx(want_gen, (size_t)same)),
			json_object_get_double(json_object_array_get_idx(margins, (size_t)same)));
		test_failures++;
	}
	printf("%-34.34s %-10s ids equal for %d of %d steps (required: %d)\n", prompt,
	       quant_isa_name(quant_get_isa()), same, n_gen, horizon);
}

/* Logits of LEN positions of IDS fed in chunks of CHUNK rows (the last row
 * of each chunk) and one row at a time must agree bit for bit, and two
 * sequences in one step must each give what they give alone: with M's
 * sliding window shrunk to WINDOW, so that every path crosses it. */
static void check_window_invariance(struct model *m, int32_t window)
{
	const int32_t n = 120, V = m->hp.n_vocab;
	int32_t ids[120];
	float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
	int32_t saved[256];
	struct tseq s1 = { .n_blocks = 0 }, s2 = { .n_blocks = 0 };

	CHECK(m->hp.n_layer <= 256);
	for (int32_t l = 0; l < m->hp.n_layer; l++) {
		saved[l] = m->layers[l].window;
		if (saved[l] && window)
			m->layers[l].window = window;
	}
	for (int32_t i = 0; i < n; i++)
		ids[i] = 100 + (i * 7919) % 5000;
	/* the best SIMD path: test_cpu_backend compares the portable one with it */
	for (int isa = 1; isa < 2; isa++) {
		quant_set_isa(isa == 0 ? QUANT_ISA_SCALAR : quant_isa_best());
		struct engine *e = new_engine(m, QT_F16, 3 * n + 64);
		CHECK(e != NULL);
		if (!e)
			break;
		/* prefill in chunks of 48, then the last row alone */
		s1 = (struct tseq){ .n_blocks = 0 };
		s2 = (struct tseq){ .n_blocks = 0 };
		CHECK(tseq_feed(e, &s1, ids, n - 1, 48, a) > 0);
		CHECK(tseq_feed(e, &s1, ids + n - 1, 1, 1, a) > 0);
		/* one row at a time */
		CHECK(tseq_feed(e, &s2, ids, n, 1, b) > 0);
		CHECK(memcmp(a, b, (size_t)V * sizeof(float)) == 0);
		/* both sequences' next token in one step: each as alone */
		float *two = malloc(2 * (size_t)V * sizeof(float));
		int32_t next[2] = { 7, 7 }, pos[2] = { s1.len, s2.len };
		CHECK(tseq_reserve(e, &s1, 1) == 0 && tseq_reserve(e, &s2, 1) == 0);
		const int32_t *tab[2] = { s1.table, s2.table };
		uint8_t want[2] = { 1, 1 };
		struct engine_batch bt = { 2, next, pos, tab, want };
		CHECK_INT_EQ(engine_step(e, &bt, two), 2);
		s1.len++;
		struct tseq s3 = { .n_blocks = 0 };
		CHECK(tseq_feed(e, &s3, ids, n, 64, a) > 0);
		CHECK(tseq_feed(e, &s3, next, 1, 1, a) > 0);
		CHECK(memcmp(a, two, (size_t)V * sizeof(float)) == 0);
		CHECK(memcmp(a, two + V, (size_t)V * sizeof(float)) == 0);
		tseq_free(e, &s1);
		tseq_free(e, &s2);
		tseq_free(e, &s3);
		CHECK_INT_EQ(kv_pool_n_available(engine_kv_pool(e)), engine_kv_capacity(e) / engine_kv_pool(e)->view.block_tokens);
		printf("%s, sliding window %d, %s: chunked, one-by-one and batched agree\n", m->hp.arch,
		       window ? window : m->hp.n_swa, quant_isa_name(quant_get_isa()));
		free(two);
		engine_free(e);
	}
	for (int32_t l = 0; l < m->hp.n_layer; l++)
		m->layers[l].window = saved[l];
	free(a);
	free(b);
}

static int check_gemma3(void)
{
	const char *path = getenv("LLMD_GEMMA3");
	const char *golden = test_model_path("golden/gemma-3-270m-q4_k_m.greedy-llamacpp.json");
	struct model *m = NULL;
	json_object *root;
	char err[512];

	if (!path || access(path, R_OK) != 0 || !golden) {
		printf("gemma 3: left out (no model file or golden; make fetch-models)\n");
		return 0;
	}
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return 1;
	}
	CHECK_INT_EQ(m->hp.arch_id, MODEL_ARCH_GEMMA3);
	CHECK_INT_EQ(m->hp.n_swa, 512);
	CHECK_INT_EQ(m->layers[0].window, 512);
	CHECK_INT_EQ(m->layers[5].window, 0);
	root = json_object_from_file(golden);
	CHECK(root && json_object_is_type(root, json_type_array));
	/* the portable kernels on the first case (a 262144-row output matrix
	 * makes them slow), the best SIMD path on all */
	for (int isa = 0; root && isa < 2; isa++) {
		quant_set_isa(isa == 0 ? QUANT_ISA_SCALAR : quant_isa_best());
		struct engine *e = new_engine(m, QT_F16, MAX_TOKENS);
		CHECK(e != NULL);
		for (size_t i = 0; e && i < (isa ? json_object_array_length(root) : 1); i++)
			check_golden_case(e, m, json_object_array_get_idx(root, i), GEMMA_MARGIN);
		engine_free(e);
	}
	json_object_put(root);
	check_window_invariance(m, 37);
	model_free(m);
	return 1;
}

/* ---- the synthetic models of tests/data/arch-goldens.json ---- */

/* Every case whose model tests/test_arch.sh made in LLMD_SYNTH_DIR: prompt
 * ids exactly, greedy ids (f32 KV) up to the case's safe horizon (its first
 * llama.cpp margin below 0.01; an F16 file's, below F16_MARGIN: llama.cpp
 * rounds the activations of F16 matmuls to f16, llmd keeps them f32), on
 * the portable kernels (first prompt) and the best SIMD path (all), then
 * chunked, one-by-one and batched logits agree bit for bit.  Returns the
 * models checked. */
#define F16_MARGIN 0.15
static int check_synth(void)
{
	const char *dir = getenv("LLMD_SYNTH_DIR"), *src = getenv("LLMD_SRCDIR");
	char path[4096], err[512];
	json_object *root;
	int n_models = 0;

	if (!dir)
		return 0;
	snprintf(path, sizeof path, "%s/tests/data/arch-goldens.json", src ? src : ".");
	root = json_object_from_file(path);
	CHECK(root != NULL);
	json_object *cases = root ? json_object_object_get(root, "cases") : NULL;
	for (size_t i = 0; cases && i < json_object_array_length(cases); i++) {
		json_object *c = json_object_array_get_idx(cases, i), *results = json_object_object_get(c, "results");
		const char *name = json_object_get_string(json_object_object_get(c, "name"));
		const char *file = json_object_get_string(
			json_object_array_get_idx(json_object_object_get(c, "gguf_synth"), 2));
		const int f16 = strcmp(json_object_get_string(json_object_object_get(c, "recipe")), "f16") == 0;
		/* llama.cpp's context where the case names one (Phi-3's factors hang on it) */
		json_object *nctx = json_object_object_get(c, "n_ctx");
		case_n_ctx = nctx ? json_object_get_int(nctx) : 0;
		struct model *m = NULL;

		snprintf(path, sizeof path, "%s/%s", dir, file);
		if (access(path, R_OK) != 0) {
			printf("%s: no model file, left out\n", name);
			continue;
		}
		if (model_load(path, &m, err, sizeof err) < 0) {
			fprintf(stderr, "%s: %s\n", path, err);
			test_failures++;
			continue;
		}
		n_models++;
		printf("%s (%s):\n", name, m->hp.arch);
		for (int isa = 0; isa < 2; isa++) {
			quant_set_isa(isa == 0 ? QUANT_ISA_SCALAR : quant_isa_best());
			struct engine *e = new_engine(m, QT_F32, MAX_TOKENS);
			CHECK(e != NULL);
			for (size_t k = 0; e && k < (isa ? json_object_array_length(results) : 1); k++) {
				json_object *r = json_object_array_get_idx(results, k);
				check_golden_case(e, m, r, f16 ? F16_MARGIN : 0.01);
			}
			engine_free(e);
		}
		check_window_invariance(m, m->hp.n_swa ? 5 : 0);
#ifdef HAVE_CUDA_EMU
		/* the CUDA kernels' source on the emulator: the first prompt */
		engine_backend = ENGINE_BACKEND_CUDA;
		struct engine *ce = new_engine(m, QT_F32, MAX_TOKENS);
		CHECK(ce != NULL);
		if (ce) {
			printf("  on %s: ", engine_backend_name(ce));
			check_golden_case(ce, m, json_object_array_get_idx(results, 0), f16 ? F16_MARGIN : 0.01);
		}
		engine_free(ce);
		engine_backend = ENGINE_BACKEND_CPU;
#endif
		model_free(m);
		case_n_ctx = 0;
	}
	json_object_put(root);
	return n_models;
}

int main(void)
{
#ifdef HAVE_CUDA_EMU
	setenv("CUDA_EMU_MEM_MB", "2048", 0); /* Gemma's 262144-wide logits: 512 MiB of step buffers */
#endif
	int gemma = check_gemma3();
	int synth = check_synth();

	if (!gemma && !synth) {
		printf("SKIP: neither Gemma 3 nor a synthetic model is here (make fetch-models; tests/test_arch.sh)\n");
		return TEST_SKIP;
	}
	return test_result();
}
