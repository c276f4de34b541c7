/* test_cuda_device.c - the CUDA backend as nvcc builds it, on a real GPU.
 * Linked against libcudabackend_gpu.a in every build where configure found
 * the CUDA toolkit, so that CI (nvcc, no GPU) proves the GPU build compiles
 * and links.  It pins:
 *  - this binary's backend is nvcc's; when the runtime sees no device,
 *    backend auto chooses the CPU, and backend cuda and the engine on it
 *    are refused with the runtime's reason; the test then exits 77 (skip);
 *  - on a device, backend auto chooses CUDA device 0;
 *  - on a device: every golden case of ../shared/models/golden/
 *    greedy-llamacpp.json gives llama.cpp's ids up to its safe horizon
 *    (greedy, f32 KV), and the logits after each prompt are those of the
 *    CPU backend within a small tolerance (CUDA's expf and cuBLAS's
 *    summation order differ from the CPU's);
 *  - batch invariance: a request's tokens alone equal its tokens beside 3
 *    other sequences through the scheduler (on the q4_0 model, whose every
 *    matmul runs our kernels: cuBLAS's F32 GEMM may pick its algorithm by T);
 *  - graphs: decode steps replayed from CUDA graphs (their rows padded)
 *    give the logits of launched ones bit for bit (the q4_0 model again);
 *  - 12-row decode steps, whose matmuls run on the int8 tensor cores with
 *    2 tiles of 8 rows a pass, give each sequence the logits of its one-row
 *    steps (the dp4a kernels, the default for one row of Q4_0 and Q8_0;
 *    with LLMD_CUDA_MMA_MIN_T=1, the tensor cores' 1 tile) bit for bit;
 *    (--wide, K-quants: one row on the wide kernels, a warp a weight row);
 *  - gemm_rows: a prompt's matmuls through f16 tiles and cublasGemmEx stay
 *    near the CPU's logits and give its greedy tokens; so do F16 and BF16
 *    weights;
 *  - the KV pool: automatic, it takes kv_gpu_fraction of the memory free
 *    after the model; a model that cannot fit beside its pool is refused
 *    with the sizes named, and leaves no device memory behind.
 */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>

#include "backend.h"
#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"
#include "sched.h"
#include "testbatch.h"
#include "testseq.h"
#include "testutil.h"
#include "tokenizer.h"

#define MAX_TOKENS 1024

static struct engine *new_engine(const struct model *m, int32_t backend, int64_t n_tokens,
				 int32_t max_batch, int32_t n_ctx)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[512];

	engine_params_default(&ep);
	ep.backend = backend;
	ep.kv_type = QT_F32;
	ep.kv_tokens = n_tokens;
	if (max_batch)
		ep.max_batch = max_batch;
	ep.n_ctx = n_ctx;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "engine_new: %s\n", err);
		return NULL;
	}
	return e;
}

/* ---- without a device: what the choice says ---- */

static void check_choice_without_device(const struct engine_cuda_probe *pr)
{
	int32_t backend = -1;
	char msg[512];

	CHECK_INT_EQ(pr->n_devices, 0);
	CHECK(pr->why[0] != 0);
	CHECK_INT_EQ(engine_choose_backend("auto", 0, pr, &backend, msg, sizeof msg), 0);
	CHECK_INT_EQ(backend, ENGINE_BACKEND_CPU);
	CHECK(strstr(msg, "no usable CUDA device") != NULL);
	printf("auto without a device: %s\n", msg);
	CHECK_INT_EQ(engine_choose_backend("cuda", 0, pr, &backend, msg, sizeof msg), -ENODEV);
	CHECK(strstr(msg, pr->why) != NULL);
	printf("cuda without a device: refused: %s\n", msg);
}

/* ---- on a device: auto takes it, as llmd's device.backend = auto does ---- */

static void check_choice_with_device(const struct engine_cuda_probe *pr)
{
	int32_t backend = -1;
	char msg[512], want[64];

	CHECK_INT_EQ(engine_choose_backend("auto", 0, pr, &backend, msg, sizeof msg), 0);
	CHECK_INT_EQ(backend, ENGINE_BACKEND_CUDA);
	snprintf(want, sizeof want, "CUDA device 0 (of %d)", pr->n_devices);
	CHECK_STR_EQ(msg, want);
	printf("auto with a device: %s\n", msg);
	CHECK_INT_EQ(engine_choose_backend("auto", pr->n_devices, pr, &backend, msg, sizeof msg), -ENODEV);
	CHECK(strstr(msg, "does not exist") != NULL);
}

/* Without a device the backend itself refuses to start, saying why. */
static void check_engine_without_device(const char *model_path)
{
	struct engine_params ep;
	struct engine *e = NULL;
	struct model *m = NULL;
	char err[512];

	if (model_load(model_path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", model_path, err);
		test_failures++;
		return;
	}
	engine_params_default(&ep);
	ep.backend = ENGINE_BACKEND_CUDA;
	ep.kv_tokens = 64;
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), -ENODEV);
	CHECK(e == NULL && strstr(err, "no usable CUDA device") != NULL);
	printf("engine on cuda without a device: %s\n", err);
	model_free(m);
}

/* ---- golden cases, and logits against the CPU ---- */

/* The largest |a - b| over N logits, relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, int32_t n)
{
	double d = 0, big = 1e-6;
	for (int32_t i = 0; i < n; i++) {
		if (fabs(a[i] - b[i]) > d)
			d = fabs(a[i] - b[i]);
		if (fabs(b[i]) > big)
			big = fabs(b[i]);
	}
	return d / big;
}

/* The logits after PROMPT on engine E, into OUT (n_vocab). */
static int prompt_logits(struct engine *e, const int32_t *ids, int n, float *out)
{
	struct tseq sq = { .n_blocks = 0 };
	int r = tseq_feed(e, &sq, ids, n, n, out);
	tseq_free(e, &sq);
	return r;
}

static void check_case(json_object *c, const char *models_dir)
{
	const char *rel = json_object_get_string(json_object_object_get(c, "model"));
	const char *prompt = json_object_get_string(json_object_object_get(c, "prompt"));
	json_object *want_gen = json_object_object_get(c, "generated_ids");
	int horizon = json_object_get_int(json_object_object_get(c, "safe_horizon"));
	char path[4096], err[512];
	struct model *m = NULL;
	struct engine *e = NULL, *cpu = NULL;
	int32_t ids[MAX_TOKENS], gen[MAX_TOKENS];
	float *lg = NULL, *lc = NULL;
	double diff = -1;
	int n_ids, n = -1, ok = 1;

	snprintf(path, sizeof path, "%s/%s", models_dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
	n_ids = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids,
				 MAX_TOKENS);
	if (horizon > (int)json_object_array_length(want_gen))
		horizon = (int)json_object_array_length(want_gen);
	e = new_engine(m, ENGINE_BACKEND_CUDA, n_ids + horizon + 1, 0, 0);
	cpu = new_engine(m, ENGINE_BACKEND_CPU, n_ids + 1, 0, 0);
	lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
	lc = malloc((size_t)m->hp.n_vocab * sizeof(float));
	CHECK(e && cpu && lg && lc);
	if (!e || !cpu || !lg || !lc)
		goto out;
	CHECK_STR_EQ(engine_backend_name(e), "cuda");
	CHECK_INT_EQ(prompt_logits(e, ids, n_ids, lg), 1);
	CHECK_INT_EQ(prompt_logits(cpu, ids, n_ids, lc), 1);
	diff = rel_diff(lg, lc, m->hp.n_vocab);
	if (!(diff <= 1e-3)) {
		fprintf(stderr, "%s \"%s\": logits after the prompt differ from the CPU's by %g "
			"(relative)\n", rel, prompt, diff);
		test_failures++;
		ok = 0;
	}
	n = tseq_greedy(e, ids, n_ids, horizon, gen);
	CHECK_INT_EQ(n, horizon);
	for (int i = 0; i < n; i++) {
		int want = json_object_get_int(json_object_array_get_idx(want_gen, (size_t)i));
		if (gen[i] != want) {
			fprintf(stderr, "%s \"%s\" [cuda]: step %d of %d: got %d, llama.cpp %d\n", rel,
				prompt, i, horizon, gen[i], want);
			test_failures++;
			ok = 0;
			break;
		}
	}
out:
	printf("%-36s %-30.30s cuda %3d tokens, logits within %.1e of the CPU's: %s\n", rel, prompt,
	       n, diff, ok && n == horizon ? "ok" : "DIFFER");
	free(lg);
	free(lc);
	engine_free(e);
	engine_free(cpu);
	model_free(m);
}

/* ---- batch invariance through the scheduler (testbatch.h) ---- */

static struct engine *batch_engine(const struct model *m)
{
	return new_engine(m, ENGINE_BACKEND_CUDA, 4 * 128, 64, 256);
}

/* ---- the KV pool in device memory ---- */

static void test_kv_sizing(const struct model *m)
{
	struct engine_params ep;
	struct engine *e = NULL, *e2 = NULL;
	struct bk_device_info before, after;
	char err[512];
	size_t bb = kv_pool_block_bytes(QT_F16, 16, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim);

	/* automatic: a small share, so that the test leaves the device alone */
	engine_params_default(&ep);
	ep.backend = ENGINE_BACKEND_CUDA;
	ep.kv_tokens = 0;
	ep.kv_mib = 0;
	ep.kv_gpu_fraction = 0.02;
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), 0);
	if (!e) {
		fprintf(stderr, "automatic pool: %s\n", err);
		return;
	}
	engine_device_info(e, &after);
	/* the pool is 2% of what was free before it, within a block and the
	 * allocator's granularity (2 MiB pages) */
	uint64_t pool = (uint64_t)engine_kv_capacity(e) / 16 * bb;
	uint64_t free_before_pool = after.free_bytes + pool;
	CHECK(pool <= 0.02 * free_before_pool + 4.0 * (1 << 20));
	CHECK(pool + bb + 4.0 * (1 << 20) >= 0.02 * free_before_pool);
	printf("automatic KV pool: %llu MiB of %llu MiB free (%s, %llu MiB in all)\n",
	       (unsigned long long)(pool >> 20), (unsigned long long)(free_before_pool >> 20),
	       after.name, (unsigned long long)(after.total_bytes >> 20));

	/* a pool larger than the device is refused with the sizes named, and
	 * the half-built engine leaves nothing behind */
	engine_device_info(e, &before);
	ep.kv_tokens = (int64_t)((before.total_bytes / bb + 16) * 16);
	if (ep.kv_tokens < INT32_MAX) {
		CHECK_INT_EQ(engine_new(m, &ep, &e2, err, sizeof err), -ENOMEM);
		CHECK(strstr(err, "the model needs") && strstr(err, "MiB free"));
		printf("too large a pool: %s\n", err);
		engine_device_info(e, &after);
		CHECK(after.free_bytes + (4u << 20) >= before.free_bytes);
	}
	engine_free(e);
}

int main(int argc, char **argv)
{
	const char *golden = test_model_path("golden/greedy-llamacpp.json");
	const char *dir = getenv("LLMD_MODELS_DIR");
	struct engine_cuda_probe pr;
	struct model *m = NULL;
	json_object *root;
	char err[512], path[4096];
	int r;

	if ((r = twide_main(argc, argv, ENGINE_CUDA_DEVICE)) >= 0)
		return r;
	engine_cuda_probe(&pr);
	CHECK_INT_EQ(pr.kind, ENGINE_CUDA_DEVICE);
	if (pr.n_devices == 0) {
		check_choice_without_device(&pr);
		if (test_model_path("stories260K.gguf"))
			check_engine_without_device(test_model_path("stories260K.gguf"));
		if (test_failures)
			return test_result();
		printf("SKIP: the CUDA runtime sees no device: %s\n", pr.why);
		return TEST_SKIP;
	}
	check_choice_with_device(&pr);
	if (!golden) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	if (!dir)
		dir = "../shared/models";
	root = json_object_from_file(golden);
	CHECK(root && json_object_is_type(root, json_type_array));
	for (size_t i = 0; root && i < json_object_array_length(root); i++)
		check_case(json_object_array_get_idx(root, i), dir);
	tbatch_invariance(dir, "derived/TinyStories-656K-q4_0.gguf", batch_engine);
	tgraph_check(dir, "derived/TinyStories-656K-q4_0.gguf");
	json_object_put(root);
	twide_check(dir, "derived/TinyStories-656K-q4_0.gguf", ENGINE_BACKEND_CUDA, 12);
	twide_check(dir, "derived/TinyStories-656K-q8_0.gguf", ENGINE_BACKEND_CUDA, 12);
	setenv("LLMD_CUDA_MMA_MIN_T", "1", 1); /* one-row steps on the tensor cores */
	twide_check(dir, "derived/TinyStories-656K-q4_0.gguf", ENGINE_BACKEND_CUDA, 12);
	unsetenv("LLMD_CUDA_MMA_MIN_T"); /* the default again, from the next engine */
	/* launches in order, none overlapping its predecessor's tail (the
	 * default on sm_90 and later), recorded into graphs too: the same
	 * tokens */
	setenv("LLMD_CUDA_PDL", "0", 1);
	tgraph_check(dir, "derived/TinyStories-656K-q4_0.gguf");
	twide_check(dir, "derived/TinyStories-656K-q4_0.gguf", ENGINE_BACKEND_CUDA, 12);
	unsetenv("LLMD_CUDA_PDL");
	tgemm_check(dir, "derived/TinyStories-656K-q4_0.gguf", 0.5f);
	thalf_check(dir, QT_F16, 0.05f);
	thalf_check(dir, QT_BF16, 0.005f); /* 1e-4 on the emulator; the H200's tensor cores: 8.4e-4 */
	snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		return 1;
	}
	test_kv_sizing(m);
	model_free(m);
	return test_result();
}
