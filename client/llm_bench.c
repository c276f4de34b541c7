/* llm_bench.c - llm-bench, the engine's benchmark and check tool.
 *
 * Loads a model in-process, runs one generation (or R of them) and reports
 * the prompt and generated token ids, the text and the prefill / decode
 * speeds, as text or one JSON object.  --logits prints the full logit vector
 * after the prompt instead.  It talks to no daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "engine.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"
#include "stopstr.h"
#include "tokenizer.h"

struct bench_opts {
	const char *model;
	char *prompt;               /* owned */
	const char *system;         /* with --chat */
	int chat;                   /* render the prompt as a user message */
	int n_predict;
	int threads;
	int repeat;
	int json;
	int logits;
	int ignore_eos;
	uint32_t kv_type;
	int32_t batch;
	struct sampler_params sp;
	const char *stops[STOPSTR_MAX];
	int n_stops;
};

struct run_result {
	int32_t *gen;          /* generated ids; owned */
	int n_gen;
	char *text;            /* owned */
	size_t text_len;
	double prefill_s;      /* wall time of the prompt steps */
	double decode_s;       /* wall time of the later steps */
	int decode_steps;
	const char *finish;    /* "stop" or "length" */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: llm-bench --model PATH (--prompt TEXT | --prompt-file PATH) [options]\n"
		"  -m, --model PATH        GGUF model file\n"
		"  -p, --prompt TEXT       prompt text (special tokens such as <|im_start|> are parsed)\n"
		"  -f, --prompt-file PATH  read the prompt from a file ('-' = stdin)\n"
		"      --chat              wrap the prompt as a user message in the model's chat template\n"
		"  -s, --system TEXT       system message (with --chat)\n"
		"  -n, --n-predict N       tokens to generate (default 64)\n"
		"  -t, --threads T         CPU threads (default 2)\n"
		"      --temp X            temperature (default 0: greedy)\n"
		"      --top-k N --top-p X --min-p X --repeat-penalty X\n"
		"      --presence-penalty X --frequency-penalty X\n"
		"      --seed N            sampling seed (default 0)\n"
		"      --stop TEXT         stop string (repeatable)\n"
		"      --ignore-eos        keep generating past end-of-generation tokens\n"
		"      --kv-type f16|f32   KV cache element type (default f16)\n"
		"      --batch N           prompt rows per step (default 512)\n"
		"  -r, --repeat R          run R times, report medians (default 1)\n"
		"      --logits            print the logits after the prompt and exit\n"
		"      --json              one JSON object on stdout\n");
}

static char *read_file(const char *path)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	char *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f)
		return NULL;
	do {
		if (cap - len < 4096) {
			char *nb = realloc(buf, cap = cap * 2 + 8192);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
		}
		n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
	} while (n > 0);
	if (buf)
		buf[len] = 0;
	if (f != stdin)
		fclose(f);
	return buf;
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
	enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_RP, O_PP, O_FP, O_SEED, O_STOP, O_LOGITS,
	       O_JSON, O_CHAT, O_KV, O_BATCH, O_IGN };
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
		{ "prompt-file", required_argument, 0, 'f' }, { "system", required_argument, 0, 's' },
		{ "n-predict", required_argument, 0, 'n' }, { "threads", required_argument, 0, 't' },
		{ "repeat", required_argument, 0, 'r' }, { "temp", required_argument, 0, O_TEMP },
		{ "top-k", required_argument, 0, O_TOPK }, { "top-p", required_argument, 0, O_TOPP },
		{ "min-p", required_argument, 0, O_MINP }, { "repeat-penalty", required_argument, 0, O_RP },
		{ "presence-penalty", required_argument, 0, O_PP },
		{ "frequency-penalty", required_argument, 0, O_FP },
		{ "seed", required_argument, 0, O_SEED }, { "stop", required_argument, 0, O_STOP },
		{ "logits", no_argument, 0, O_LOGITS }, { "json", no_argument, 0, O_JSON },
		{ "chat", no_argument, 0, O_CHAT }, { "kv-type", required_argument, 0, O_KV },
		{ "batch", required_argument, 0, O_BATCH }, { "ignore-eos", no_argument, 0, O_IGN },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	int c;

	sampler_params_default(&o->sp);
	o->sp.temperature = 0;
	o->n_predict = 64;
	o->threads = 2;
	o->repeat = 1;
	o->kv_type = QT_F16;
	o->batch = 512;
	while ((c = getopt_long(argc, argv, "m:p:f:s:n:t:r:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': free(o->prompt); o->prompt = strdup(optarg); break;
		case 'f':
			free(o->prompt);
			o->prompt = read_file(optarg);
			if (!o->prompt) {
				fprintf(stderr, "llm-bench: cannot read prompt file %s: %s\n", optarg, strerror(errno));
				return -1;
			}
			break;
		case 's': o->system = optarg; break;
		case 'n': o->n_predict = atoi(optarg); break;
		case 't': o->threads = atoi(optarg); break;
		case 'r': o->repeat = atoi(optarg); break;
		case O_TEMP: o->sp.temperature = strtof(optarg, NULL); break;
		case O_TOPK: o->sp.top_k = atoi(optarg); break;
		case O_TOPP: o->sp.top_p = strtof(optarg, NULL); break;
		case O_MINP: o->sp.min_p = strtof(optarg, NULL); break;
		case O_RP: o->sp.repeat_penalty = strtof(optarg, NULL); break;
		case O_PP: o->sp.presence_penalty = strtof(optarg, NULL); break;
		case O_FP: o->sp.frequency_penalty = strtof(optarg, NULL); break;
		case O_SEED: o->sp.seed = strtoull(optarg, NULL, 0); break;
		case O_STOP:
			if (o->n_stops == STOPSTR_MAX) {
				fprintf(stderr, "llm-bench: at most %d --stop strings\n", STOPSTR_MAX);
				return -1;
			}
			o->stops[o->n_stops++] = optarg;
			break;
		case O_LOGITS: o->logits = 1; break;
		case O_JSON: o->json = 1; break;
		case O_CHAT: o->chat = 1; break;
		case O_IGN: o->ignore_eos = 1; break;
		case O_BATCH: o->batch = atoi(optarg); break;
		case O_KV:
			if (!strcmp(optarg, "f16"))
				o->kv_type = QT_F16;
			else if (!strcmp(optarg, "f32"))
				o->kv_type = QT_F32;
			else {
				fprintf(stderr, "llm-bench: --kv-type must be f16 or f32\n");
				return -1;
			}
			break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (!o->model || !o->prompt) {
		usage(stderr);
		return -1;
	}
	if (o->n_predict < 0 || o->threads < 1 || o->repeat < 1 || o->batch < 1) {
		fprintf(stderr, "llm-bench: --n-predict, --threads, --repeat and --batch must be positive\n");
		return -1;
	}
	return 0;
}

/* The prompt as the model sees it: raw, or rendered through the chat template. */
static int build_prompt(const struct model *m, const struct bench_opts *o, char **ret)
{
	struct chat_msg msgs[2];
	int n = 0;

	if (!o->chat) {
		*ret = strdup(o->prompt);
		return *ret ? 0 : -ENOMEM;
	}
	if (!m->chat.kind) {
		fprintf(stderr, "llm-bench: %s: the model's chat template is unknown or absent; "
			"use a raw prompt without --chat\n", m->path);
		return -ENOTSUP;
	}
	if (o->system)
		msgs[n++] = (struct chat_msg){ "system", o->system };
	msgs[n++] = (struct chat_msg){ "user", o->prompt };
	return chat_render(&m->chat, msgs, n, 1, ret) < 0 ? -EINVAL : 0;
}

/* Feeds the prompt in chunks of --batch rows; the last chunk returns the logits. */
static int prefill(struct engine *e, int32_t seq, const int32_t *ids, int n, int batch,
		   float *logits)
{
	int32_t *seqs = malloc((size_t)batch * sizeof *seqs);
	int r = 0;

	if (!seqs)
		return -ENOMEM;
	for (int i = 0; i < batch; i++)
		seqs[i] = seq;
	for (int i = 0; i < n && r >= 0; i += batch) {
		struct engine_batch b = { n - i < batch ? n - i : batch, ids + i, seqs, NULL };
		r = engine_step(e, &b, logits);
	}
	free(seqs);
	return r < 0 ? r : 0;
}

static int run_once(struct engine *e, const struct model *m, const struct bench_opts *o,
		    const int32_t *ids, int n_ids, struct run_result *res)
{
	int32_t n_vocab = m->hp.n_vocab, seq = -1, tok;
	float *logits = malloc((size_t)n_vocab * sizeof(float));
	struct sampler *smp = NULL;
	struct stopstr *stop = NULL;
	struct detok dt = { { 0 }, 0 };
	size_t text_cap = 4096;
	char piece[512], safe[512 + STOPSTR_MAX_LEN];
	double t0, t1;
	int r;

	memset(res, 0, sizeof *res);
	res->gen = malloc(((size_t)o->n_predict + 1) * sizeof(int32_t));
	res->text = malloc(text_cap);
	res->finish = "length";
	if (!logits || !res->gen || !res->text) {
		r = -ENOMEM;
		goto out;
	}
	res->text[0] = 0;
	if ((r = sampler_new(&o->sp, n_vocab, &smp)) < 0 ||
	    (r = stopstr_new(o->stops, o->n_stops, &stop)) < 0 ||
	    (r = engine_seq_new(e, &seq)) < 0)
		goto out;
	for (int i = 0; i < n_ids; i++)
		sampler_accept(smp, ids[i]);

	t0 = now_s();
	if ((r = prefill(e, seq, ids, n_ids, o->batch, logits)) < 0)
		goto out;
	t1 = now_s();
	res->prefill_s = t1 - t0;
	for (int i = 0; i < o->n_predict; i++) {
		size_t n_safe;
		int n, hit;

		tok = sampler_sample(smp, logits, NULL);
		sampler_accept(smp, tok);
		res->gen[res->n_gen++] = tok;
		if (!o->ignore_eos && tokenizer_is_eog(m->tok, tok)) {
			res->finish = "stop";
			break;
		}
		n = detok_push(m->tok, &dt, tok, 0, piece, sizeof piece);
		hit = stopstr_feed(stop, piece, (size_t)n, safe, sizeof safe, &n_safe);
		if (res->text_len + n_safe + 1 > text_cap) {
			char *nt = realloc(res->text, text_cap = (text_cap + n_safe) * 2);
			if (!nt) {
				r = -ENOMEM;
				goto out;
			}
			res->text = nt;
		}
		memcpy(res->text + res->text_len, safe, n_safe);
		res->text_len += n_safe;
		res->text[res->text_len] = 0;
		if (hit) {
			res->finish = "stop";
			break;
		}
		if (i + 1 == o->n_predict)
			break;
		struct engine_batch b = { 1, &tok, &seq, NULL };
		if ((r = engine_step(e, &b, logits)) < 0)
			goto out;
		res->decode_steps++;
	}
	res->decode_s = now_s() - t1;
	{
		size_t n = stopstr_flush(stop, safe, sizeof safe);
		n += (size_t)detok_flush(&dt, safe + n, sizeof safe - n);
		char *nt = realloc(res->text, res->text_len + n + 1);
		if (nt) {
			res->text = nt;
			memcpy(res->text + res->text_len, safe, n);
			res->text_len += n;
			res->text[res->text_len] = 0;
		}
	}
	r = 0;
out:
	if (seq >= 0)
		engine_seq_free(e, seq);
	sampler_free(smp);
	stopstr_free(stop);
	free(logits);
	return r;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static json_object *ids_json(const int32_t *ids, int n)
{
	json_object *a = json_object_new_array_ext(n);
	for (int i = 0; i < n; i++)
		json_object_array_add(a, json_object_new_int(ids[i]));
	return a;
}

static int print_logits(struct engine *e, const struct model *m, const struct bench_opts *o,
			const int32_t *ids, int n_ids)
{
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	int32_t seq;
	int r;

	if (!logits)
		return -ENOMEM;
	if ((r = engine_seq_new(e, &seq)) < 0 || (r = prefill(e, seq, ids, n_ids, o->batch, logits)) < 0) {
		free(logits);
		return r;
	}
	if (o->json) {
		json_object *root = json_object_new_object(), *a = json_object_new_array_ext(m->hp.n_vocab);
		json_object_object_add(root, "prompt_ids", ids_json(ids, n_ids));
		for (int32_t i = 0; i < m->hp.n_vocab; i++)
			json_object_array_add(a, json_object_new_double(logits[i]));
		json_object_object_add(root, "logits", a);
		puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN));
		json_object_put(root);
	} else {
		for (int32_t i = 0; i < m->hp.n_vocab; i++)
			printf("%.9g\n", logits[i]);
	}
	engine_seq_free(e, seq);
	free(logits);
	return 0;
}

int main(int argc, char **argv)
{
	struct bench_opts o = { 0 };
	struct model *m = NULL;
	struct engine *e = NULL;
	struct engine_params ep;
	struct run_result res = { 0 };
	char err[512], *text = NULL;
	int32_t *ids = NULL;
	double *pf, *dc;
	int n_ids, rc = 1, r;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	r = model_load(o.model, &m, err, sizeof err);
	if (r < 0) {
		fprintf(stderr, "llm-bench: cannot load model %s: %s\n", o.model, err);
		return 1;
	}
	if (build_prompt(m, &o, &text) < 0)
		goto out;
	n_ids = tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, NULL, 0);
	ids = malloc(((size_t)n_ids + 1) * sizeof *ids);
	if (n_ids < 0 || !ids)
		goto out;
	tokenizer_encode(m->tok, text, strlen(text), tokenizer_add_bos(m->tok), 1, ids, n_ids);
	if (n_ids == 0) {
		fprintf(stderr, "llm-bench: the prompt is empty and the model adds no BOS token\n");
		goto out;
	}

	engine_params_default(&ep);
	ep.n_threads = o.threads;
	ep.kv_type = o.kv_type;
	ep.max_seqs = 1;
	ep.max_batch = o.batch;
	ep.kv_tokens = n_ids + o.n_predict + 16;
	ep.n_ctx = (int32_t)ep.kv_tokens;
	r = engine_new(m, &ep, &e, err, sizeof err);
	if (r < 0) {
		fprintf(stderr, "llm-bench: cannot start the engine: %s\n", err);
		goto out;
	}
	if (o.logits) {
		r = print_logits(e, m, &o, ids, n_ids);
		if (r < 0)
			fprintf(stderr, "llm-bench: forward pass failed: %s\n", strerror(-r));
		rc = r < 0;
		goto out;
	}

	pf = calloc((size_t)o.repeat, sizeof *pf);
	dc = calloc((size_t)o.repeat, sizeof *dc);
	for (int i = 0; i < o.repeat && pf && dc; i++) {
		if (i) {
			free(res.gen);
			free(res.text);
		}
		r = run_once(e, m, &o, ids, n_ids, &res);
		if (r < 0) {
			fprintf(stderr, "llm-bench: generation failed: %s\n", strerror(-r));
			free(pf);
			free(dc);
			goto out;
		}
		pf[i] = n_ids / res.prefill_s;
		dc[i] = res.decode_steps ? res.decode_steps / res.decode_s : 0;
	}
	if (!pf || !dc)
		goto out;
	double pf_med = median(pf, o.repeat), dc_med = median(dc, o.repeat);
	free(pf);
	free(dc);

	if (o.json) {
		json_object *root = json_object_new_object();
		json_object_object_add(root, "model", json_object_new_string(m->name));
		json_object_object_add(root, "backend", json_object_new_string(engine_backend_name(e)));
		json_object_object_add(root, "isa", json_object_new_string(quant_isa_name(quant_get_isa())));
		json_object_object_add(root, "threads", json_object_new_int(o.threads));
		json_object_object_add(root, "prompt_ids", ids_json(ids, n_ids));
		json_object_object_add(root, "generated_ids", ids_json(res.gen, res.n_gen));
		json_object_object_add(root, "text", json_object_new_string_len(res.text, (int)res.text_len));
		json_object_object_add(root, "finish_reason", json_object_new_string(res.finish));
		json_object_object_add(root, "n_prompt", json_object_new_int(n_ids));
		json_object_object_add(root, "n_generated", json_object_new_int(res.n_gen));
		json_object_object_add(root, "repeat", json_object_new_int(o.repeat));
		json_object_object_add(root, "prefill_tok_s", json_object_new_double(pf_med));
		json_object_object_add(root, "decode_tok_s", json_object_new_double(dc_med));
		json_object_object_add(root, "ttft_ms", json_object_new_double(res.prefill_s * 1e3));
		puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(root);
	} else {
		printf("%s\n", res.text);
		fprintf(stderr, "\nllm-bench: %s, %d threads (%s): prompt %d tokens at %.1f tok/s, "
			"generated %d tokens at %.1f tok/s (median of %d)\n", m->name, o.threads,
			quant_isa_name(quant_get_isa()), n_ids, pf_med, res.n_gen, dc_med, o.repeat);
	}
	rc = 0;
out:
	free(res.gen);
	free(res.text);
	free(ids);
	free(text);
	free(o.prompt);
	engine_free(e);
	model_free(m);
	return rc;
}
