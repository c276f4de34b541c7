/* test_model.c - model_load's options and checks, beside test_engine's
 * forward passes:
 *  - a context_length too short to run one request (1: a prompt token and
 *    no room to generate) is refused at load with the key and value named,
 *    for llama and mistral files, mapped or not; 2 loads past it;
 *  - MODEL_LOAD_NO_MMAP gives the mapped load's model (hyperparameters,
 *    every weight's shape, type and bytes, norms, tokenizer), held in no
 *    file mapping, generating the same greedy tokens, and still after the
 *    file is truncated and then overwritten with other bytes;
 *  - the CPU backend reads the model's weights (engine_reads_model_weights);
 *  - model_release_weights shrinks the file mapping to the header's pages,
 *    and the tokenizer and metadata still work with the file cut there.
 * The last three need ../shared/models (skipped without it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "testseq.h"
#include "testutil.h"
#include "tokenizer.h"

/* ---- a file of hyperparameters only ---- */

static void put(FILE *f, const void *p, size_t n) { CHECK(fwrite(p, 1, n, f) == n); }
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }

static void put_str(FILE *f, const char *s)
{
	put_u64(f, strlen(s));
	put(f, s, strlen(s));
}

static void put_key_u32(FILE *f, const char *arch, const char *key, uint32_t v)
{
	char full[128];

	snprintf(full, sizeof full, "%s.%s", arch, key);
	put_str(f, full);
	put_u32(f, GGUF_T_UINT32);
	put_u32(f, v);
}

/* A GGUF v3 file at PATH with ARCH's required hyperparameters and
 * context_length N_CTX, and no tensors. */
static void write_hparams(const char *path, const char *arch, uint32_t n_ctx)
{
	FILE *f = fopen(path, "wb");

	CHECK(f != NULL);
	if (!f)
		return;
	put(f, "GGUF", 4);
	put_u32(f, 3);
	put_u64(f, 0); /* tensors */
	put_u64(f, 6); /* keys */
	put_str(f, "general.architecture");
	put_u32(f, GGUF_T_STRING);
	put_str(f, arch);
	put_key_u32(f, arch, "embedding_length", 64);
	put_key_u32(f, arch, "block_count", 1);
	put_key_u32(f, arch, "attention.head_count", 4);
	put_key_u32(f, arch, "feed_forward_length", 128);
	put_key_u32(f, arch, "context_length", n_ctx);
	CHECK(fclose(f) == 0);
}

/* Loads a file of ARCH with context_length N_CTX (FLAGS) and expects the
 * load to fail with WANT in its message. */
static void expect_load_error(const char *arch, uint32_t n_ctx, unsigned flags, const char *want)
{
	char path[] = "/tmp/test_model.XXXXXX", err[512] = "";
	struct model *m = NULL;
	int fd = mkostemp(path, O_CLOEXEC), r;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	close(fd);
	write_hparams(path, arch, n_ctx);
	r = model_load_flags(path, flags, &m, err, sizeof err);
	if (r != -EINVAL || m || !strstr(err, want)) {
		fprintf(stderr, "%s context_length %u: rc %d, \"%s\", expected -EINVAL and \"%s\"\n",
			arch, n_ctx, r, err, want);
		test_failures++;
	}
	model_free(m);
	unlink(path);
}

static void test_context_length(void)
{
	expect_load_error("llama", 1, 0, "key llama.context_length: 1 is too short: a sequence needs "
			  "at least 2 positions (a prompt token and a generated one)");
	expect_load_error("mistral", 1, 0, "key mistral.context_length: 1 is too short");
	expect_load_error("llama", 1, MODEL_LOAD_NO_MMAP, "key llama.context_length: 1 is too short");
	/* 2 is enough: the load goes on to the tensors (none here) */
	expect_load_error("llama", 2, 0, "tensor token_embd.weight: missing");
	expect_load_error("llama", 0, 0, "key llama.context_length: not a valid count");
	printf("context_length 1 refused at load, 2 accepted\n");
}

/* ---- files ---- */

/* Replaces PATH's bytes with a few others, in place (O_TRUNC, as cp does). */
static void overwrite(const char *path)
{
	static const char junk[] = "GGUF but not a model any more\n";
	int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write(fd, junk, sizeof junk - 1) == (ssize_t)(sizeof junk - 1));
	close(fd);
}

/* ---- MODEL_LOAD_NO_MMAP ---- */

static void check_same_weight(const struct model *a, const struct model *b,
			      const struct bk_weight *wa, const struct bk_weight *wb)
{
	CHECK(wa->type == wb->type && wa->n_in == wb->n_in && wa->n_out == wb->n_out &&
	      wa->row_bytes == wb->row_bytes);
	CHECK((const uint8_t *)wa->data - a->gguf->base == (const uint8_t *)wb->data - b->gguf->base);
	CHECK(memcmp(wa->data, wb->data, (size_t)wa->n_out * wa->row_bytes) == 0);
}

/* A and B are the same model. */
static void check_same_model(const struct model *a, const struct model *b)
{
	const struct model_hparams *hp = &a->hp;

	CHECK(memcmp(&a->hp, &b->hp, sizeof a->hp) == 0);
	CHECK_STR_EQ(a->name, b->name);
	CHECK_INT_EQ(a->file_bytes, b->file_bytes);
	CHECK_INT_EQ(a->weight_bytes, b->weight_bytes);
	CHECK_INT_EQ(a->file_type, b->file_type);
	CHECK_INT_EQ(a->chat.kind, b->chat.kind);
	CHECK_INT_EQ(tokenizer_n_vocab(a->tok), tokenizer_n_vocab(b->tok));
	CHECK(memcmp(a->norms, b->norms, (size_t)(2 * hp->n_layer + 1) * (size_t)hp->n_embd *
					     sizeof(float)) == 0);
	check_same_weight(a, b, &a->tok_embd, &b->tok_embd);
	check_same_weight(a, b, &a->output, &b->output);
	for (int32_t l = 0; l < hp->n_layer; l++) {
		const struct model_layer *x = &a->layers[l], *y = &b->layers[l];
		check_same_weight(a, b, &x->wq, &y->wq);
		check_same_weight(a, b, &x->wk, &y->wk);
		check_same_weight(a, b, &x->wv, &y->wv);
		check_same_weight(a, b, &x->wo, &y->wo);
		check_same_weight(a, b, &x->w_gate, &y->w_gate);
		check_same_weight(a, b, &x->w_up, &y->w_up);
		check_same_weight(a, b, &x->w_down, &y->w_down);
	}
}

#define N_GEN 16

/* M's greedy tokens after "Once upon a time" on the CPU backend, into GEN;
 * returns how many, or -1. */
static int greedy(const struct model *m, int32_t gen[N_GEN])
{
	static const char prompt[] = "Once upon a time";
	struct engine_params ep;
	struct engine *e = NULL;
	int32_t ids[64];
	char err[256];
	int n_ids, n;

	n_ids = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids, 64);
	engine_params_default(&ep);
	ep.kv_type = QT_F32;
	ep.kv_tokens = 256;
	ep.max_batch = 64;
	if (n_ids < 1 || engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "engine_new: %s\n", err);
		return -1;
	}
	CHECK_INT_EQ(engine_reads_model_weights(e), 1); /* the CPU embeds from the model's rows */
	n = tseq_greedy(e, ids, n_ids, N_GEN, gen);
	engine_free(e);
	return n;
}

static void test_no_mmap(const char *src)
{
	struct model *a = NULL, *b = NULL;
	int32_t gen_a[N_GEN], gen_b[N_GEN];
	const void *addr = NULL;
	char path[64], err[512] = "";
	size_t n;

	CHECK_INT_EQ(test_copy_to_tmp(src, path, sizeof path), 0);
	CHECK_INT_EQ(model_load_flags(path, 0x40, &a, err, sizeof err), -EINVAL);
	CHECK(a == NULL);
	CHECK_INT_EQ(model_load(path, &a, err, sizeof err), 0);
	CHECK_INT_EQ(model_load_flags(path, MODEL_LOAD_NO_MMAP, &b, err, sizeof err), 0);
	if (!a || !b) {
		fprintf(stderr, "%s: %s\n", path, err);
		goto out;
	}
	check_same_model(a, b);
	/* the mapped one is in the file's mapping, the copy in none */
	n = model_file_mapping(a, &addr);
	CHECK(n >= a->file_bytes && addr == a->gguf->base);
	CHECK((const uint8_t *)a->tok_embd.data >= (const uint8_t *)addr &&
	      (const uint8_t *)a->tok_embd.data < (const uint8_t *)addr + n);
	addr = NULL;
	CHECK_INT_EQ(model_file_mapping(b, &addr), 0);
	CHECK(addr == NULL);

	CHECK_INT_EQ(greedy(a, gen_a), N_GEN);
	CHECK_INT_EQ(greedy(b, gen_b), N_GEN);
	CHECK(memcmp(gen_a, gen_b, sizeof gen_a) == 0);
	/* The file cut, then other bytes in it: the mapped model would fault
	 * now (it goes first); the copy generates the same. */
	model_free(a);
	a = NULL;
	CHECK_INT_EQ(truncate(path, 0), 0);
	memset(gen_b, 0, sizeof gen_b);
	CHECK_INT_EQ(greedy(b, gen_b), N_GEN);
	CHECK(memcmp(gen_a, gen_b, sizeof gen_a) == 0);
	overwrite(path);
	memset(gen_b, 0, sizeof gen_b);
	CHECK_INT_EQ(greedy(b, gen_b), N_GEN);
	CHECK(memcmp(gen_a, gen_b, sizeof gen_a) == 0);
	printf("model.mmap = false: the same model and tokens, after the file was cut and "
	       "overwritten too\n");
out:
	model_free(a);
	model_free(b);
	unlink(path);
}

/* ---- model_release_weights ---- */

static void test_release(const char *src)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct model *m = NULL, *b = NULL;
	const void *addr = NULL;
	char path[64], err[512] = "";
	int32_t ids[64];
	size_t n;
	int n_ids;

	CHECK_INT_EQ(test_copy_to_tmp(src, path, sizeof path), 0);
	CHECK_INT_EQ(model_load(path, &m, err, sizeof err), 0);
	if (!m) {
		fprintf(stderr, "%s: %s\n", path, err);
		unlink(path);
		return;
	}
	CHECK_INT_EQ(model_release_weights(m, err, sizeof err), 0);
	n = model_file_mapping(m, &addr);
	CHECK(addr == m->gguf->base);
	CHECK_INT_EQ(n, (m->gguf->data_offset + page - 1) / page * page);
	CHECK(n < m->file_bytes);
	/* cut to what is still mapped: the tokenizer and metadata go on */
	CHECK_INT_EQ(truncate(path, (off_t)n), 0);
	n_ids = tokenizer_encode(m->tok, "Once upon a time", 16, 1, 1, ids, 64);
	CHECK(n_ids > 1 && ids[0] == 1);
	CHECK(gguf_find_tensor(m->gguf, "token_embd.weight") != NULL);
	CHECK_INT_EQ(m->hp.n_layer, 5);

	/* a private copy releases too (its memory goes back) */
	unlink(path);
	CHECK_INT_EQ(test_copy_to_tmp(src, path, sizeof path), 0);
	CHECK_INT_EQ(model_load_flags(path, MODEL_LOAD_NO_MMAP, &b, err, sizeof err), 0);
	CHECK(b && model_release_weights(b, err, sizeof err) == 0);
	CHECK(b && model_file_mapping(b, &addr) == 0);
	printf("model_release_weights: the file mapping shrinks to %zu bytes of header\n", n);
	model_free(m);
	model_free(b);
	unlink(path);
}

int main(void)
{
	const char *p = test_model_path("stories260K.gguf");
	char *src = p ? strdup(p) : NULL;

	test_context_length();
	if (!src) {
		printf("stories260K.gguf absent: its checks are skipped\n");
		return test_result();
	}
	test_no_mmap(src);
	test_release(src);
	free(src);
	return test_result();
}
