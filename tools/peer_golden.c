/*
 * peer_golden.c - llama.cpp's greedy continuations and logits, as JSON: the
 * reference side of llmd's architecture tests (tests/data/arch-goldens.json)
 * and of its accuracy figures (tools/accuracy.py).  Built by
 * tools/peer-cpu-build against the vendored llama.cpp's libllama; not part
 * of llmd.
 *
 *   peer-golden -m MODEL.gguf [-p PROMPT | -P FILE | -i ID,ID,...]... [-n N]
 *               [--kv f32|f16] [-t THREADS] [-c N_CTX] [--stop-at-eog]
 *               [--logits FILE.npy] [--logits-steps K] [--model-name NAME]
 *
 * For each prompt (-p text; -P a file whose whole content is the prompt;
 * -i explicit token ids, no tokenization), in a fresh context: tokenize with
 * add_special = true and parse_special = true, decode the prompt as one batch,
 * then decode greedily N tokens (default 32) one at a time, taking the argmax
 * of the logits (the lowest id on an exact tie).  CPU only, flash attention
 * off, K and V cache f32 (default) or f16, 2 threads by default.  By default
 * the N tokens are generated whatever they are (end-of-generation tokens
 * included); --stop-at-eog stops after one.
 *
 * Prints a JSON array, one object per prompt: prompt, n_predict, prompt_ids,
 * generated_ids, margins (per step, the top-1 minus top-2 logit of the
 * logits that chose the token), safe_horizon (the first step whose margin is
 * below 0.01, else the number of steps), model, source; with --logits, also
 * logits_index (the first dimension of the file).
 *
 * --logits FILE.npy writes the full logits of the first K steps of every
 * prompt (K = --logits-steps, default 1: the step right after the prompt;
 * step s are the logits after prompt + s generated tokens) as one float32
 * .npy array of shape (n_prompts, K, n_vocab).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_PROMPTS 256

struct prompt {
	const char *text;   /* NULL for explicit ids */
	char *owned;
	llama_token *ids;
	int n_ids;
};

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("peer-golden: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static int quiet_log = 1;

static void log_cb(enum ggml_log_level level, const char *text, void *ud)
{
	(void)ud;
	if (!quiet_log || level >= GGML_LOG_LEVEL_WARN)
		fputs(text, stderr);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		die("%s: %s", path, strerror(errno));
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	size_t got;
	while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
		n += got;
		if (cap - n - 1 == 0)
			buf = realloc(buf, cap *= 2);
	}
	fclose(f);
	buf[n] = 0;
	return buf;
}

static void json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"': fputs("\\\"", o); break;
		case '\\': fputs("\\\\", o); break;
		case '\n': fputs("\\n", o); break;
		case '\r': fputs("\\r", o); break;
		case '\t': fputs("\\t", o); break;
		default:
			if (*p < 0x20)
				fprintf(o, "\\u%04x", *p);
			else
				fputc(*p, o);
		}
	}
	fputc('"', o);
}

static void json_ids(FILE *o, const llama_token *ids, int n)
{
	fputc('[', o);
	for (int i = 0; i < n; i++)
		fprintf(o, "%s%d", i ? ", " : "", ids[i]);
	fputc(']', o);
}

/* argmax (lowest id on a tie) and top-1 minus top-2 */
static llama_token greedy(const float *l, int n, double *margin)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	float second = -INFINITY;
	for (int i = 0; i < n; i++)
		if (i != best && l[i] > second)
			second = l[i];
	*margin = (double)l[best] - (double)second;
	return best;
}

static void npy_header(FILE *f, int a, int b, int c)
{
	char dict[128];
	int n = snprintf(dict, sizeof dict,
			 "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }", a, b, c);
	int total = 10 + n + 1;
	int pad = (64 - total % 64) % 64;
	unsigned short hlen = (unsigned short)(n + pad + 1);
	fwrite("\x93NUMPY\x01\x00", 1, 8, f);
	fputc(hlen & 0xff, f);
	fputc(hlen >> 8, f);
	fwrite(dict, 1, n, f);
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
}

static void usage(void)
{
	fputs("usage: peer-golden -m MODEL.gguf [-p PROMPT | -P FILE | -i ID,ID,...]... [-n N]\n"
	      "       [--kv f32|f16] [-t THREADS] [-c N_CTX] [--stop-at-eog] [--logits FILE.npy]\n"
	      "       [--logits-steps K] [--model-name NAME] [-v]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *model_name = NULL, *logits_path = NULL;
	const char *kv = "f32";
	int n_predict = 32, n_threads = 2, n_ctx = 0, stop_eog = 0, logits_steps = 1;
	struct prompt prompts[MAX_PROMPTS];
	int n_prompts = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (usage(), (char *)NULL))
		if (!strcmp(a, "-m"))
			model_path = NEXT();
		else if (!strcmp(a, "-p") || !strcmp(a, "-P") || !strcmp(a, "-i")) {
			if (n_prompts == MAX_PROMPTS)
				die("too many prompts");
			struct prompt *p = &prompts[n_prompts++];
			memset(p, 0, sizeof *p);
			const char *v = NEXT();
			if (a[1] == 'p')
				p->text = v;
			else if (a[1] == 'P')
				p->text = p->owned = read_file(v);
			else {
				p->ids = malloc(sizeof(llama_token) * (strlen(v) / 2 + 2));
				for (char *s = (char *)v, *end; *s; s = end) {
					long id = strtol(s, &end, 10);
					if (end == s)
						die("-i %s: not a list of ids", v);
					p->ids[p->n_ids++] = (llama_token)id;
					if (*end == ',')
						end++;
				}
			}
		} else if (!strcmp(a, "-n"))
			n_predict = atoi(NEXT());
		else if (!strcmp(a, "-t"))
			n_threads = atoi(NEXT());
		else if (!strcmp(a, "-c"))
			n_ctx = atoi(NEXT());
		else if (!strcmp(a, "--kv"))
			kv = NEXT();
		else if (!strcmp(a, "--stop-at-eog"))
			stop_eog = 1;
		else if (!strcmp(a, "--logits"))
			logits_path = NEXT();
		else if (!strcmp(a, "--logits-steps"))
			logits_steps = atoi(NEXT());
		else if (!strcmp(a, "--model-name"))
			model_name = NEXT();
		else if (!strcmp(a, "-v"))
			quiet_log = 0;
		else
			usage();
#undef NEXT
	}
	if (!model_path || !n_prompts)
		usage();
	if (strcmp(kv, "f32") && strcmp(kv, "f16"))
		die("--kv: f32 or f16");
	if (logits_steps < 1 || logits_steps > n_predict)
		die("--logits-steps: 1 to n_predict");
	if (!model_name) {
		model_name = strrchr(model_path, '/');
		model_name = model_name ? model_name + 1 : model_path;
	}

	llama_log_set(log_cb, NULL);
	llama_backend_init();

	struct llama_model_params mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	struct llama_model *model = llama_model_load_from_file(model_path, mp);
	if (!model)
		die("%s: llama.cpp could not load it", model_path);
	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	const int n_vocab = llama_vocab_n_tokens(vocab);

	FILE *lf = NULL;
	if (logits_path) {
		lf = fopen(logits_path, "wb");
		if (!lf)
			die("%s: %s", logits_path, strerror(errno));
		npy_header(lf, n_prompts, logits_steps, n_vocab);
	}

	printf("[\n");
	for (int pi = 0; pi < n_prompts; pi++) {
		struct prompt *p = &prompts[pi];
		if (p->text) {
			int len = (int)strlen(p->text);
			int cap = len + 8;
			p->ids = malloc(sizeof(llama_token) * cap);
			p->n_ids = llama_tokenize(vocab, p->text, len, p->ids, cap, true, true);
			if (p->n_ids < 0)
				die("prompt %d: tokenization failed (%d)", pi, p->n_ids);
		}
		if (p->n_ids == 0)
			die("prompt %d: no tokens", pi);

		struct llama_context_params cp = llama_context_default_params();
		int need = p->n_ids + n_predict + 1;
		cp.n_ctx = n_ctx ? (uint32_t)n_ctx : (uint32_t)((need + 255) / 256 * 256);
		cp.n_batch = cp.n_ubatch = (uint32_t)(p->n_ids > 512 ? p->n_ids : 512);
		cp.n_seq_max = 1;
		cp.n_threads = cp.n_threads_batch = n_threads;
		cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
		cp.type_k = cp.type_v = strcmp(kv, "f16") ? GGML_TYPE_F32 : GGML_TYPE_F16;
		cp.no_perf = true;
		struct llama_context *ctx = llama_init_from_model(model, cp);
		if (!ctx)
			die("prompt %d: no context", pi);

		llama_token *gen = malloc(sizeof(llama_token) * (n_predict + 1));
		double *margins = malloc(sizeof(double) * (n_predict + 1));
		int n_gen = 0;
		llama_token *cur = p->ids;
		int n_cur = p->n_ids;
		for (int step = 0; step < n_predict; step++) {
			if (llama_decode(ctx, llama_batch_get_one(cur, n_cur)))
				die("prompt %d: llama_decode failed at step %d", pi, step);
			const float *l = llama_get_logits_ith(ctx, -1);
			if (lf && step < logits_steps)
				fwrite(l, sizeof(float), (size_t)n_vocab, lf);
			gen[n_gen] = greedy(l, n_vocab, &margins[n_gen]);
			n_gen++;
			if (stop_eog && llama_vocab_is_eog(vocab, gen[n_gen - 1]))
				break;
			cur = &gen[n_gen - 1];
			n_cur = 1;
		}
		if (lf) /* rows after a stop: zero-filled */
			for (int s = n_gen; s < logits_steps; s++)
				for (int v = 0; v < n_vocab; v++)
					fwrite(&(float){0}, sizeof(float), 1, lf);

		int horizon = n_gen;
		for (int s = 0; s < n_gen; s++)
			if (margins[s] < 0.01) {
				horizon = s;
				break;
			}

		printf(" {\n  \"prompt\": ");
		if (p->text)
			json_str(stdout, p->text);
		else
			printf("null");
		printf(",\n  \"n_predict\": %d,\n  \"prompt_ids\": ", n_predict);
		json_ids(stdout, p->ids, p->n_ids);
		printf(",\n  \"generated_ids\": ");
		json_ids(stdout, gen, n_gen);
		printf(",\n  \"margins\": [");
		for (int s = 0; s < n_gen; s++)
			printf("%s%.6f", s ? ", " : "", margins[s]);
		printf("],\n  \"safe_horizon\": %d,\n  \"model\": ", horizon);
		json_str(stdout, model_name);
		printf(",\n  \"source\": \"llama.cpp (vendored in llama-cpp-python 0.3.36, CPU build), "
		       "greedy, %s KV, no flash attention, %d threads%s\"", kv, n_threads,
		       stop_eog ? "" : ", end-of-generation tokens not special");
		if (lf)
			printf(",\n  \"logits_index\": %d", pi);
		printf("\n }%s\n", pi + 1 < n_prompts ? "," : "");
		fflush(stdout);

		free(gen);
		free(margins);
		llama_free(ctx);
	}
	printf("]\n");
	if (lf && fclose(lf))
		die("%s: write error", logits_path);
	llama_model_free(model);
	llama_backend_free();
	return 0;
}
