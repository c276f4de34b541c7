/* test_engine.c - what the engine promises beyond matching llama.cpp:
 * batch invariance, chunked prefill equal to one-shot prefill, all-or-nothing
 * KV allocation, clean errors for bad batches and bad model files, and
 * a coherent greedy chat answer from the default model (SmolLM2).
 */
#include <errno.h>
#include <math.h>

#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"
#include "testutil.h"
#include "tokenizer.h"

static struct engine *new_engine(const struct model *m, int64_t kv_tokens, uint32_t kv_type,
				 int32_t max_batch)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.kv_type = kv_type;
	ep.kv_tokens = kv_tokens;
	ep.max_seqs = 8;
	ep.max_batch = max_batch;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0)
		fprintf(stderr, "engine_new: %s\n", err);
	return e;
}

/* Logits after PROMPT fed in chunks of CHUNK rows. */
static int prefill(struct engine *e, int32_t seq, const int32_t *ids, int n, int chunk, float *logits)
{
	int32_t seqs[512];
	int r = 0;
	for (int i = 0; i < 512; i++)
		seqs[i] = seq;
	for (int i = 0; i < n && r >= 0; i += chunk) {
		struct engine_batch b = { n - i < chunk ? n - i : chunk, ids + i, seqs, NULL };
		r = engine_step(e, &b, logits);
	}
	return r;
}

static void test_chunked_prefill_and_batch_invariance(const struct model *m)
{
	const char *text = "Once upon a time there was a little girl who lived in a village near the forest.";
	int32_t ids[128], n_vocab = m->hp.n_vocab;
	int n = tokenizer_encode(m->tok, text, strlen(text), 1, 0, ids, 128);
	float *a = malloc((size_t)n_vocab * 2 * sizeof(float)), *b = a + n_vocab;
	float *two = malloc((size_t)n_vocab * 2 * sizeof(float));
	struct engine *e = new_engine(m, 1024, QT_F32, 64);
	int32_t s0, s1, s2;

	CHECK(e != NULL && n > 20);
	/* one step vs chunks of 1, 3 and 7 rows: bit-identical logits */
	CHECK(engine_seq_new(e, &s0) == 0);
	CHECK_INT_EQ(prefill(e, s0, ids, n, 64, a), 1);
	int chunks[] = { 1, 3, 7 };
	for (int c = 0; c < 3; c++) {
		CHECK(engine_seq_new(e, &s1) == 0);
		CHECK_INT_EQ(prefill(e, s1, ids, n, chunks[c], b), 1);
		CHECK(memcmp(a, b, (size_t)n_vocab * sizeof(float)) == 0);
		engine_seq_free(e, s1);
	}
	/* The same sequence decoded alongside another sequence's prefill in one
	 * step gives the same logits as when it runs alone. */
	CHECK(engine_seq_new(e, &s1) == 0);
	CHECK(engine_seq_new(e, &s2) == 0);
	CHECK_INT_EQ(prefill(e, s1, ids, n - 1, 64, b), 1);
	int32_t tok[9], seq[9];
	uint8_t want[9] = { 0 };
	tok[0] = ids[n - 1];
	seq[0] = s1;
	want[0] = 1;
	for (int i = 1; i < 9; i++) {
		tok[i] = ids[i + 3];
		seq[i] = s2;
	}
	want[8] = 1;
	struct engine_batch mixed = { 9, tok, seq, want };
	CHECK_INT_EQ(engine_step(e, &mixed, two), 2);
	CHECK(memcmp(a, two, (size_t)n_vocab * sizeof(float)) == 0);
	CHECK_INT_EQ(engine_seq_len(e, s1), n);
	CHECK_INT_EQ(engine_seq_len(e, s2), 8);
	engine_seq_free(e, s0);
	engine_seq_free(e, s1);
	engine_seq_free(e, s2);
	CHECK_INT_EQ(kv_pool_n_free(engine_kv_pool(e)), engine_kv_pool(e)->view.n_blocks);
	engine_free(e);
	free(a);
	free(two);
}

static void test_f16_kv_close_to_f32(const struct model *m)
{
	int32_t ids[64], n_vocab = m->hp.n_vocab, s;
	int n = tokenizer_encode(m->tok, "Once upon a time", 16, 1, 0, ids, 64);
	float *a = malloc((size_t)n_vocab * sizeof(float)), *b = malloc((size_t)n_vocab * sizeof(float));
	struct engine *e32 = new_engine(m, 64, QT_F32, 64), *e16 = new_engine(m, 64, QT_F16, 64);
	double worst = 0;

	CHECK(e32 && e16);
	CHECK(engine_seq_new(e32, &s) == 0 && prefill(e32, s, ids, n, 64, a) == 1);
	CHECK(engine_seq_new(e16, &s) == 0 && prefill(e16, s, ids, n, 64, b) == 1);
	for (int32_t i = 0; i < n_vocab; i++)
		worst = fmax(worst, fabs(a[i] - b[i]));
	printf("f16 vs f32 KV: max |logit diff| = %.3g\n", worst);
	CHECK(worst < 2e-2);
	engine_free(e32);
	engine_free(e16);
	free(a);
	free(b);
}

static void test_errors_change_nothing(const struct model *m)
{
	/* A pool of 2 blocks (32 tokens) and n_ctx 40. */
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];
	int32_t ids[48], seqs[48] = { 0 }, s;
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));

	engine_params_default(&ep);
	ep.kv_tokens = 32;
	ep.n_ctx = 40;
	ep.max_seqs = 2;
	ep.max_batch = 48;
	CHECK(engine_new(m, &ep, &e, err, sizeof err) == 0);
	for (int i = 0; i < 48; i++)
		ids[i] = 1 + i % 100;
	CHECK(engine_seq_new(e, &s) == 0);
	CHECK_INT_EQ(seqs[0], s);

	struct engine_batch too_many = { 33, ids, seqs, NULL };
	CHECK_INT_EQ(engine_step(e, &too_many, logits), -ENOSPC);
	CHECK_INT_EQ(engine_seq_len(e, s), 0);
	CHECK_INT_EQ(kv_pool_n_free(engine_kv_pool(e)), 2);

	int32_t bad_tok = m->hp.n_vocab;
	struct engine_batch bad = { 1, &bad_tok, seqs, NULL };
	CHECK_INT_EQ(engine_step(e, &bad, logits), -EINVAL);
	int32_t bad_seq = 1;
	struct engine_batch bad2 = { 1, ids, &bad_seq, NULL };
	CHECK_INT_EQ(engine_step(e, &bad2, logits), -EINVAL);

	struct engine_batch ok = { 32, ids, seqs, NULL };
	CHECK_INT_EQ(engine_step(e, &ok, logits), 1);
	CHECK_INT_EQ(engine_seq_len(e, s), 32);
	CHECK_INT_EQ(kv_pool_n_free(engine_kv_pool(e)), 0);
	struct engine_batch one = { 1, ids, seqs, NULL };
	CHECK_INT_EQ(engine_step(e, &one, logits), -ENOSPC);
	CHECK_INT_EQ(engine_seq_truncate(e, s, 10), 0);
	CHECK_INT_EQ(kv_pool_n_free(engine_kv_pool(e)), 1);
	engine_seq_free(e, s);
	CHECK_INT_EQ(kv_pool_n_free(engine_kv_pool(e)), 2);
	engine_free(e);

	/* n_ctx is enforced */
	ep.kv_tokens = 64;
	CHECK(engine_new(m, &ep, &e, err, sizeof err) == 0);
	CHECK(engine_seq_new(e, &s) == 0);
	struct engine_batch past = { 41, ids, seqs, NULL };
	CHECK_INT_EQ(engine_step(e, &past, logits), -E2BIG);
	CHECK_INT_EQ(engine_seq_len(e, s), 0);
	engine_free(e);
	free(logits);
}

static void test_bad_model_files(const char *good)
{
	char err[512], tmp[] = "/tmp/llmd-test-XXXXXX";
	struct model *m = NULL;
	FILE *in, *out;
	int fd;

	CHECK(model_load("/nonexistent/model.gguf", &m, err, sizeof err) < 0);
	CHECK(m == NULL);
	printf("missing file: %s\n", err);

	/* the same file cut in half: a clear error, not a crash */
	fd = mkstemp(tmp);
	CHECK(fd >= 0);
	in = fopen(good, "rb");
	out = fdopen(fd, "wb");
	fseek(in, 0, SEEK_END);
	long size = ftell(in);
	fseek(in, 0, SEEK_SET);
	char *buf = malloc((size_t)size);
	CHECK(fread(buf, 1, (size_t)size, in) == (size_t)size);
	fwrite(buf, 1, (size_t)size / 2, out);
	fclose(in);
	fclose(out);
	CHECK(model_load(tmp, &m, err, sizeof err) < 0);
	printf("truncated file: %s\n", err);
	CHECK(strstr(err, "past end of file") != NULL);
	unlink(tmp);
	free(buf);
}

/* The default model answers a simple question in coherent English. */
static void test_smollm2_chat(void)
{
	const char *path = test_smollm2_path();
	struct model *m = NULL;
	char err[512];

	if (!path) {
		printf("SmolLM2 not fetched: chat check skipped\n");
		return;
	}
	CHECK(model_load(path, &m, err, sizeof err) == 0);
	if (!m)
		return;
	CHECK(m->chat.kind == CHAT_TMPL_CHATML);
	struct chat_msg msg = { "user", "What is the capital of France?" };
	char *text = NULL, out[4096] = "";
	CHECK(chat_render(&m->chat, &msg, 1, 1, &text) > 0);
	int32_t ids[256], gen[24], s;
	int n = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, 256);
	struct engine *e = new_engine(m, 512, QT_F16, 256);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	CHECK(e && engine_seq_new(e, &s) == 0 && prefill(e, s, ids, n, 256, logits) == 1);
	size_t len = 0;
	for (int i = 0; i < 24; i++) {
		int32_t best = 0;
		for (int32_t v = 1; v < m->hp.n_vocab; v++)
			if (logits[v] > logits[best])
				best = v;
		gen[i] = best;
		len += (size_t)tokenizer_piece(m->tok, best, 0, out + len, sizeof out - len - 1);
		struct engine_batch b = { 1, &gen[i], &s, NULL };
		if (tokenizer_is_eog(m->tok, best) || engine_step(e, &b, logits) != 1)
			break;
	}
	out[len] = 0;
	printf("SmolLM2: %s\n", out);
	CHECK(strstr(out, "Paris") != NULL);
	free(text);
	free(logits);
	engine_free(e);
	model_free(m);
}

int main(void)
{
	const char *p = test_model_path("stories260K.gguf");
	const char *q = test_model_path("derived/TinyStories-656K-q4_0.gguf");
	struct model *m = NULL;
	char err[512];

	if (!p || !q) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	CHECK(model_load(p, &m, err, sizeof err) == 0);
	test_chunked_prefill_and_batch_invariance(m);
	test_f16_kv_close_to_f32(m);
	test_errors_change_nothing(m);
	model_free(m);
	/* quantized weights: the same promises */
	CHECK(model_load(q, &m, err, sizeof err) == 0);
	test_chunked_prefill_and_batch_invariance(m);
	model_free(m);
	test_bad_model_files(p);
	test_smollm2_chat();
	return test_result();
}
