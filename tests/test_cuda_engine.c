/* test_cuda_engine.c - the whole engine on the emulated CUDA backend (the
 * real kernel source on the CPU emulator, --enable-cuda-emu):
 *  - every golden case of ../shared/models/golden/greedy-llamacpp.json
 *    (stories260K and TinyStories-656K f32/q4_0/q8_0) gives llama.cpp's ids
 *    up to its safe horizon, greedy with an f32 KV cache, as test_golden
 *    checks on the CPU backend;
 *  - batch invariance: a request's tokens alone equal its tokens beside 3
 *    other sequences through the scheduler;
 *  - decode steps replayed from CUDA graphs give launched steps' logits;
 *  - 12-row decode steps (matmuls on the tensor-core kernels, 2 tiles of 8
 *    rows a pass) give each sequence the logits of its one-row steps (on
 *    the dp4a kernels, the default for Q4_0 at one row), and of its
 *    one-row steps on the tensor cores (1 tile, LLMD_CUDA_MMA_MIN_T=1);
 *  - a decode step launches 10 kernels per layer and 4 more (the fused
 *    add + norm and rope + kv_store ops; every op before an integer
 *    matmul quantizes its input);
 *  - gemm_rows: a prompt's matmuls on f16 cuBLAS stay near the CPU's logits;
 *    F16 and BF16 weights (always cuBLAS) too;
 *  - the backend is named, and a bad device is refused with a message;
 *    auto never chooses the emulator, cuda does;
 *  - the backend reads no host weight after the upload: with the model's
 *    weights released and its file cut and overwritten, the same tokens;
 *  - the KV pool on the (64 MiB) emulated device: automatic, it is exactly
 *    kv_gpu_fraction of the memory free once every weight and step buffer
 *    is there; a model whose minimal pool does not fit, an explicit pool
 *    that does not fit and too small a share are refused with the sizes
 *    named, leaving no device memory behind.
 * Exits 77 (skip) in a build whose engine links no CUDA backend or nvcc's
 * (tests/test_cuda_device covers that one).
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>

#include "backend.h"
#ifdef LLMD_EMU_STATS
#include "cuda_emu.h"
#endif
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

static struct engine *new_engine(const struct model *m, int64_t n_tokens, int32_t max_batch,
				 int32_t n_ctx)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.backend = ENGINE_BACKEND_CUDA;
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

static void check_case(json_object *c, const char *models_dir)
{
	const char *rel = json_object_get_string(json_object_object_get(c, "model"));
	const char *prompt = json_object_get_string(json_object_object_get(c, "prompt"));
	json_object *want_gen = json_object_object_get(c, "generated_ids");
	int horizon = json_object_get_int(json_object_object_get(c, "safe_horizon"));
	char path[4096], err[512];
	struct model *m = NULL;
	struct engine *e;
	int32_t ids[MAX_TOKENS], gen[MAX_TOKENS];
	int n_ids, n, ok = 1;

	snprintf(path, sizeof path, "%s/%s", models_dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
	n_ids = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids, MAX_TOKENS);
	if (horizon > (int)json_object_array_length(want_gen))
		horizon = (int)json_object_array_length(want_gen);
	e = new_engine(m, n_ids + horizon + 1, 0, 0);
	CHECK(e != NULL);
	CHECK_STR_EQ(e ? engine_backend_name(e) : NULL, "cuda-emu");
	n = e ? tseq_greedy(e, ids, n_ids, horizon, gen) : -1;
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
	printf("%-36s %-34.34s cuda-emu %3d tokens %s\n", rel, prompt, n, ok && n == horizon ? "ok" : "DIFFER");
	engine_free(e);
	model_free(m);
}

/* ---- batch invariance through the scheduler (testbatch.h) ---- */

static struct engine *batch_engine(const struct model *m)
{
	return new_engine(m, 4 * 128, 64, 256);
}

/* ---- auto and cuda on the emulator ---- */

static void test_choice(void)
{
	struct engine_cuda_probe pr;
	int32_t backend = -1;
	char msg[512];

	engine_cuda_probe(&pr);
	CHECK_INT_EQ(pr.n_devices, 1);
	CHECK_INT_EQ(engine_choose_backend("auto", 0, &pr, &backend, msg, sizeof msg), 0);
	CHECK_INT_EQ(backend, ENGINE_BACKEND_CPU);
	CHECK(strstr(msg, "emulator") != NULL);
	CHECK_INT_EQ(engine_choose_backend("cuda", 0, &pr, &backend, msg, sizeof msg), 0);
	CHECK_INT_EQ(backend, ENGINE_BACKEND_CUDA);
	CHECK_INT_EQ(engine_choose_backend("cuda", 1, &pr, &backend, msg, sizeof msg), -ENODEV);
	CHECK(strstr(msg, "device 1") != NULL);
	printf("choice: auto is the CPU, cuda the emulator, cuda #1 refused: %s\n", msg);
}

/* ---- the KV pool in (emulated) device memory ---- */

static struct engine *sized_engine(const struct model *m, int64_t kv_tokens, int32_t max_batch,
				   double fraction, int *ret, char *err, size_t errlen)
{
	struct engine_params ep;
	struct engine *e = NULL;

	engine_params_default(&ep);
	ep.backend = ENGINE_BACKEND_CUDA;
	ep.kv_type = QT_F32;
	ep.kv_tokens = kv_tokens;
	ep.kv_mib = 0;
	ep.max_batch = max_batch;
	ep.kv_gpu_fraction = fraction;
	*ret = engine_new(m, &ep, &e, err, errlen);
	return e;
}

static void test_kv_sizing(const struct model *m)
{
	const struct model_hparams *hp = &m->hp;
	size_t bb = kv_pool_block_bytes(QT_F32, 16, hp->n_layer, hp->n_head_kv * hp->head_dim);
	uint64_t row = 2 * (uint64_t)hp->n_embd + 2 * (uint64_t)hp->n_head * hp->head_dim +
		       2 * (uint64_t)hp->n_head_kv * hp->head_dim + 2 * (uint64_t)hp->n_ff + hp->n_vocab;
	uint64_t model_bytes = m->weight_bytes + 512 * row * sizeof(float);
	struct bk_device_info dev, now;
	struct engine *e, *e2;
	char err[512];
	int r;

	/* automatic, half of what the model leaves: the emulator counts every
	 * byte, so the pool is exactly that many whole blocks */
	e = sized_engine(m, 0, 512, 0.5, &r, err, sizeof err);
	CHECK_INT_EQ(r, 0);
	if (!e) {
		fprintf(stderr, "automatic pool: %s\n", err);
		return;
	}
	engine_device_info(e, &dev);
	CHECK_INT_EQ(dev.total_bytes, 64u << 20);
	int64_t n_blocks = engine_kv_capacity(e) / 16;
	uint64_t used = dev.total_bytes - dev.free_bytes;
	/* weights and step buffers are all on the device before the pool, and
	 * so is the backend's own memory from its start (the 1 MiB cuBLAS
	 * workspace on the emulator) */
	uint64_t own = used - (uint64_t)n_blocks * bb - model_bytes;
	CHECK_INT_EQ(own, 1u << 20);
	CHECK_INT_EQ(n_blocks,
		     (int64_t)((uint64_t)(0.5 * (double)(dev.total_bytes - own - model_bytes)) / bb));
	printf("automatic KV pool: %lld blocks of %zu bytes = half of the %llu MiB the model "
	       "(%llu KiB) leaves\n", (long long)n_blocks, bb,
	       (unsigned long long)((dev.total_bytes - own - model_bytes) >> 20),
	       (unsigned long long)(model_bytes >> 10));

	/* with that engine holding half the device: too many rows for a minimal
	 * pool beside the model */
	e2 = sized_engine(m, 0, 8192, 0.9, &r, err, sizeof err);
	CHECK(e2 == NULL);
	CHECK_INT_EQ(r, -ENOMEM);
	CHECK(strstr(err, "the model needs") && strstr(err, "a minimal KV pool") &&
	      strstr(err, "8192 tokens") && strstr(err, "MiB free"));
	printf("model and minimal pool do not fit: %s\n", err);
	engine_device_info(e, &now);
	CHECK_INT_EQ(now.free_bytes, dev.free_bytes);
	/* an explicit pool larger than what is free */
	e2 = sized_engine(m, (int64_t)(dev.free_bytes / bb + 1) * 16, 512, 0.9, &r, err, sizeof err);
	CHECK(e2 == NULL);
	CHECK_INT_EQ(r, -ENOMEM);
	CHECK(strstr(err, "the KV pool") && strstr(err, "MiB free"));
	printf("explicit pool does not fit: %s\n", err);
	/* too small a share of what is left for a minimal pool */
	e2 = sized_engine(m, 0, 512, 0.001, &r, err, sizeof err);
	CHECK(e2 == NULL);
	CHECK_INT_EQ(r, -ENOMEM);
	CHECK(strstr(err, "share 0.001 ") && strstr(err, "less than a minimal KV pool"));
	printf("too small a share: %s\n", err);
	engine_device_info(e, &now);
	CHECK_INT_EQ(now.free_bytes, dev.free_bytes);
	/* and the automatic pool still runs */
	int32_t ids[8] = { 1, 403, 407, 261, 378 }, gen[8];
	CHECK_INT_EQ(tseq_greedy(e, ids, 5, 8, gen), 8);
	engine_free(e);
}

/* Kernels one decode step launches, uncaptured (graphs off, so every
 * launch runs and is counted), on a model whose weights all take Q8_0
 * activations, each quantized by the op before it: per layer 1 for q, k
 * and v (one grouped matmul), 1 rope + kv_store, 2 attention (splits,
 * reduction + quantization for o), 1 for o, 1 add + norm + quantization
 * for gate and up, 1 for gate and up, 1 swiglu + quantization for down, 1
 * for down, 1 add + the next layer's norm + its quantization (the last
 * layer's add alone); then embed, the first layer's norm + quantization,
 * the output norm + quantization, the output matmul: 10 per layer and 4. */
static void test_launches_per_step(const char *dir)
{
#ifdef LLMD_EMU_STATS
	static struct tseq s;
	static const int32_t prompt[4] = { 1, 20, 30, 40 };
	unsigned long long l0, l1, sw;
	struct model *m = tbatch_model(dir, "derived/TinyStories-656K-q4_0.gguf");
	struct engine *e = m ? tbatch_engine(m, ENGINE_BACKEND_CUDA, 0, 0) : NULL;

	if (e) {
		float *logits = malloc(sizeof(float) * (size_t)m->hp.n_vocab);
		CHECK_INT_EQ(tseq_feed(e, &s, prompt, 4, 4, logits), 1);
		cuda_emu_stats(&l0, &sw);
		CHECK_INT_EQ(tseq_feed(e, &s, prompt, 1, 1, logits), 1);
		cuda_emu_stats(&l1, &sw);
		printf("kernels per decode step: %llu (%d layers)\n", l1 - l0, (int)m->hp.n_layer);
		CHECK_INT_EQ((long long)(l1 - l0), 10LL * m->hp.n_layer + 4);
		tseq_free(e, &s);
		free(logits);
		engine_free(e);
	}
	model_free(m);
#else
	(void)dir;
#endif
}

/* ---- the host's weights released after the upload ---- */

/* The CUDA backend keeps a device copy of every weight and never reads the
 * host's again: the engine says so, the model's weights can then be
 * released, and with the model file cut and overwritten under it the
 * engine generates what an engine on the untouched file does. */
static void test_weights_released(const char *dir)
{
	int32_t ids[64], want[16], got[16];
	char src[4096], path[64], err[512];
	struct model *ref = NULL, *m = NULL;
	struct engine *e = NULL;
	const void *addr = NULL;
	int n_ids = 0, fd;

	snprintf(src, sizeof src, "%s/stories260K.gguf", dir);
	CHECK_INT_EQ(test_copy_to_tmp(src, path, sizeof path), 0);
	if (model_load(src, &ref, err, sizeof err) < 0 || model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		goto out;
	}
	n_ids = tokenizer_encode(ref->tok, "Once upon a time", 16, 1, 1, ids, 64);
	e = new_engine(ref, 128, 0, 0);
	CHECK(e && tseq_greedy(e, ids, n_ids, 16, want) == 16);
	engine_free(e);

	e = new_engine(m, 128, 0, 0);
	CHECK(e != NULL);
	if (!e)
		goto out;
	CHECK_INT_EQ(engine_reads_model_weights(e), 0);
	CHECK_INT_EQ(model_release_weights(m, err, sizeof err), 0);
	CHECK(model_file_mapping(m, &addr) < m->file_bytes);
	CHECK_INT_EQ(truncate(path, 0), 0);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	CHECK(fd >= 0 && write(fd, "GGUF and then nothing", 21) == 21);
	if (fd >= 0)
		close(fd);
	/* the tokenizer is the model's own copy, the weights the device's */
	CHECK_INT_EQ(tokenizer_encode(m->tok, "Once upon a time", 16, 1, 1, got, 64), n_ids);
	CHECK(tseq_greedy(e, ids, n_ids, 16, got) == 16 && memcmp(got, want, sizeof want) == 0);
	printf("weights released after the upload: the same 16 tokens with the file overwritten\n");
out:
	engine_free(e);
	model_free(m);
	model_free(ref);
	unlink(path);
}

int main(int argc, char **argv)
{
	const char *golden = test_model_path("golden/greedy-llamacpp.json");
	const char *dir = getenv("LLMD_MODELS_DIR");
	struct engine_params ep;
	struct engine *e = NULL;
	struct model *m = NULL;
	struct engine_cuda_probe pr;
	json_object *root;
	char err[512], path[4096];
	int r;

	/* a 64 MiB device, read at the emulator's first call (the sizing test
	 * counts on it; every model here fits it many times) */
	setenv("CUDA_EMU_MEM_MB", "64", 1);
	if ((r = twide_main(argc, argv, ENGINE_CUDA_EMULATED)) >= 0)
		return r;
	engine_cuda_probe(&pr);
	if (pr.kind != ENGINE_CUDA_EMULATED) {
		printf("SKIP: %s\n", pr.kind == ENGINE_CUDA_NONE ? pr.why :
		       "this build's engine links nvcc's CUDA backend (tests/test_cuda_device)");
		return TEST_SKIP;
	}
	if (!golden) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	if (!dir)
		dir = "../shared/models";
	snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		return 1;
	}
	engine_params_default(&ep);
	ep.backend = ENGINE_BACKEND_CUDA;
	ep.kv_tokens = 64;
	r = engine_new(m, &ep, &e, err, sizeof err);
	CHECK_INT_EQ(r, 0);
	engine_free(e);
	e = NULL;
	ep.device = 7; /* the emulator has one device */
	CHECK_INT_EQ(engine_new(m, &ep, &e, err, sizeof err), -ENODEV);
	CHECK(strstr(err, "device 7") != NULL);
	test_choice();
	test_kv_sizing(m);
	model_free(m);

	root = json_object_from_file(golden);
	CHECK(root && json_object_is_type(root, json_type_array));
	for (size_t i = 0; root && i < json_object_array_length(root); i++)
		check_case(json_object_array_get_idx(root, i), dir);
	tbatch_invariance(dir, "stories260K.gguf", batch_engine);
	json_object_put(root);
	tbatch_invariance(dir, "derived/TinyStories-656K-q4_0.gguf", batch_engine);
	test_launches_per_step(dir);
	test_weights_released(dir);
	tgraph_check(dir, "stories260K.gguf");
	tgraph_check(dir, "derived/TinyStories-656K-q4_0.gguf");
	twide_check(dir, "derived/TinyStories-656K-q4_0.gguf", ENGINE_BACKEND_CUDA, 12);
	/* the same with the one-row steps on the tensor cores: the engine
	 * reads the knob when it makes its backend */
	setenv("LLMD_CUDA_MMA_MIN_T", "1", 1);
	twide_check(dir, "derived/TinyStories-656K-q4_0.gguf", ENGINE_BACKEND_CUDA, 12);
	unsetenv("LLMD_CUDA_MMA_MIN_T"); /* the default again, from the next engine */
	tgemm_check(dir, "derived/TinyStories-656K-q4_0.gguf", 0.5f);
	tgemm_check(dir, "derived/TinyStories-656K-q8_0.gguf", 0.5f);
	thalf_check(dir, QT_F16, 0.05f);
	thalf_check(dir, QT_BF16, 1e-4f);
	return test_result();
}
