/* llm_bench.c - llm-bench, the engine's benchmark and check tool.
 *
 * Loads a model in-process, runs one generation (or R of them) and reports
 * the prompt and generated token ids, the text and the prefill / decode
 * speeds, as text or one JSON object; --profile adds the time of each op.
 * --logits prints the full logit vector after the prompt instead, and
 * --bandwidth the memory read speed and the decode speed it bounds.  Only
 * --socket (bench_socket.c) talks to a daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench_socket.h"
#include "chat.h"
#include "clock.h"
#include "constrain.h"
#include "engine.h"
#include "model.h"
#include "quant.h"
#include "kv_pool.h"
#include "llm.h"
#include "sampler.h"
#include "sched.h"
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
	int parallel;               /* sequences run at once through the scheduler */
	int64_t kv_tokens;          /* KV pool size; 0 = enough for every sequence */
	int64_t kv_mib;             /* or in MiB */
	int no_prefix_cache;
	int no_graphs;
	int no_mmap;                /* read the model into memory (model.mmap = false) */
	int gemm_rows;
	int shared_prefix;          /* vary --parallel prompts at the end, not the start */
	int sequential;             /* submit the --parallel requests one after another */
	int profile;                /* time each op of the forward pass */
	int bandwidth;              /* measure memory read bandwidth instead */
	const char *socket;         /* through this llmd instead of in-process */
	const char *url;            /* or through this OpenAI-compatible API (llm_connect_url) */
	const char *unix_socket;    /* --url's connection goes to this Unix socket */
	const char *api_key;
	const char *model_name;     /* --model-name: which of the daemon's models (llm_set_model) */
	uint32_t kv_type;
	const char *backend;        /* "auto" (default), "cpu" or "cuda" */
	int32_t device;             /* CUDA device index */
	int32_t batch;
	int32_t step_ms;            /* the scheduler's step-time budget, ms; 0 = off */
	int32_t spec;               /* --speculative: SCHED_SPEC_OFF (default), _NGRAM or _DRAFT */
	const char *draft_model;    /* --draft-model: the draft's GGUF (with --speculative draft) */
	int32_t draft_max;          /* --draft-max: tokens proposed a step at most (0: 8) */
	int32_t draft_min_match;    /* --draft-min-match: the n-gram that must recur (0: 2) */
	struct sampler_params sp;
	const char *stops[STOPSTR_MAX];
	int n_stops;
	enum constrain_kind grammar_kind; /* --grammar, --json-schema, --json-object; 0: none */
	char *grammar_text;         /* the file's text; owned */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: llm-bench (--model PATH | --socket PATH) (--prompt TEXT | --prompt-file PATH) [options]\n"
		"  -m, --model PATH        GGUF model file\n"
		"  -p, --prompt TEXT       prompt text (special tokens such as <|im_start|> are parsed)\n"
		"  -f, --prompt-file PATH  read the prompt from a file ('-' = stdin)\n"
		"      --chat              wrap the prompt as a user message in the model's chat template\n"
		"  -s, --system TEXT       system message (with --chat)\n"
		"  -n, --n-predict N       tokens to generate (default 64)\n"
		"  -t, --threads T         CPU threads (default 2)\n"
		"      --backend B         compute backend: auto (default: a GPU when this build has\n"
		"                          nvcc's CUDA backend and a device, else the CPU), cpu or cuda\n"
		"      --device N          CUDA device index (default 0)\n"
		"      --no-mmap           read the model into memory rather than map it\n"
		"      --no-graphs         CUDA: launch every kernel rather than replay decode steps\n"
		"                          from CUDA graphs\n"
		"      --gemm-rows N       CUDA: matmuls of >= N rows run on cuBLAS in fp16 (fast\n"
		"                          prefill, not batch invariant; default 0: never)\n"
		"      --temp X            temperature (default 0: greedy)\n"
		"      --top-k N --top-p X --min-p X --repeat-penalty X\n"
		"      --presence-penalty X --frequency-penalty X\n"
		"      --seed N            sampling seed (default 0)\n"
		"      --stop TEXT         stop string (repeatable)\n"
		"      --ignore-eos        keep generating past end-of-generation tokens\n"
		"      --kv-type TYPE      KV cache element type: f16 (default), f32 or q8_0\n"
		"      --batch N           prompt rows per step (default 512)\n"
		"      --step-ms N         step-time budget while sequences decode, ms (default 0: off)\n"
		"      --speculative MODE  speculative decoding: off (default), ngram (prompt lookup:\n"
		"                          the sequence's last tokens recurring in its own text propose\n"
		"                          what followed them) or draft (--draft-model); the JSON\n"
		"                          reports the acceptance; with\n"
		"                          --socket or --url each request asks for it (default there:\n"
		"                          the daemon's spec.mode)\n"
		"      --draft-max K       tokens a sequence proposes a step at most (default 8; with\n"
		"                          --socket or --url each request asks for it)\n"
		"      --draft-min-match N the n-gram that must recur to propose (default 2)\n"
		"      --draft-model PATH  with --speculative draft: a small model of the same vocabulary\n"
		"                          whose tokens are proposed\n"
		"  -r, --repeat R          run R times, report medians (default 1)\n"
		"      --parallel N        run N sequences at once through the scheduler (prompts varied)\n"
		"      --kv-tokens N       KV pool size in tokens (default: enough for all sequences)\n"
		"      --kv-mib N          KV pool size in MiB instead\n"
		"      --no-prefix-cache   do not reuse cached KV blocks\n"
		"      --shared-prefix     vary --parallel prompts at their end, so they share the start\n"
		"                          (with --chat: the user message, after a shared system one)\n"
		"      --sequential        submit the --parallel requests one after another, each when\n"
		"                          the previous one has finished (the prefix cache carries over)\n"
		"      --logits            print the logits after the prompt and exit\n"
		"      --profile           time each op of the forward pass, per row, apart for\n"
		"                          one-row (decode) steps and bigger ones\n"
		"      --bandwidth         measure memory read bandwidth with --threads threads and,\n"
		"                          with --model, the bytes of weights a decode token reads\n"
		"                          and the decode speed they bound; generates nothing\n"
		"      --socket PATH       run the --parallel workload through a running llmd at PATH,\n"
		"                          one connection and thread per sequence (no --model needed)\n"
		"      --url URL           the same through an OpenAI-compatible API at URL (its base,\n"
		"                          e.g. http://127.0.0.1:8080/v1), streaming, through libllm\n"
		"      --unix-socket PATH  with --url: connect to this Unix socket (llmd's http.socket)\n"
		"      --api-key KEY       with --url: Authorization: Bearer KEY (default $LLM_API_KEY)\n"
		"      --model-name NAME   with --socket or --url: the daemon's model that answers\n"
		"                          (llmctl models; default: its default model; --url: the\n"
		"                          body's \"model\", default the first of GET /models)\n"
		"      --grammar FILE      constrain every sequence's output to this GBNF grammar\n"
		"      --json-schema FILE  ... to JSON valid under this JSON Schema\n"
		"      --json-object       ... to a JSON object\n"
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

/* ---- --profile ---- */

static void profile_add(struct engine_profile *sum, const struct engine_profile *p)
{
	for (int k = 0; k < 2; k++) {
		for (int op = 0; op < ENGINE_N_OPS; op++)
			sum->op_s[k][op] += p->op_s[k][op];
		sum->steps[k] += p->steps[k];
		sum->rows[k] += p->rows[k];
	}
}

/* {"decode": {...}, "batched": {...}}: each kind of step's count, rows and
 * microseconds per row of every op, all repetitions together. */
static json_object *profile_json(const struct engine_profile *p)
{
	static const char *const kind[2] = { "decode", "batched" };
	json_object *root = json_object_new_object();

	for (int k = 0; k < 2; k++) {
		json_object *one = json_object_new_object(), *us = json_object_new_object();
		double total = 0;
		json_object_object_add(one, "steps", json_object_new_int64((int64_t)p->steps[k]));
		json_object_object_add(one, "rows", json_object_new_int64((int64_t)p->rows[k]));
		for (int op = 0; op < ENGINE_N_OPS; op++) {
			double v = p->rows[k] ? 1e6 * p->op_s[k][op] / (double)p->rows[k] : 0;
			json_object_object_add(us, engine_op_name((enum engine_op)op), json_object_new_double(v));
			total += v;
		}
		json_object_object_add(one, "us_per_row", us);
		json_object_object_add(one, "total_us_per_row", json_object_new_double(total));
		json_object_object_add(root, kind[k], one);
	}
	return root;
}

static void profile_print(const struct engine_profile *p)
{
	static const char *const kind[2] = { "one-row (decode) steps", "steps of more rows" };

	for (int k = 0; k < 2; k++) {
		double total = 0;
		if (!p->rows[k])
			continue;
		for (int op = 0; op < ENGINE_N_OPS; op++)
			total += p->op_s[k][op];
		fprintf(stderr, "llm-bench: profile of %llu %s (%llu rows), microseconds per row:\n",
			(unsigned long long)p->steps[k], kind[k], (unsigned long long)p->rows[k]);
		for (int op = 0; op < ENGINE_N_OPS; op++)
			fprintf(stderr, "  %-10s %9.1f  %5.1f%%\n", engine_op_name((enum engine_op)op),
				1e6 * p->op_s[k][op] / (double)p->rows[k], total > 0 ? 100 * p->op_s[k][op] / total : 0);
		fprintf(stderr, "  %-10s %9.1f\n", "total", 1e6 * total / (double)p->rows[k]);
	}
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
	enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_RP, O_PP, O_FP, O_SEED, O_STOP, O_LOGITS,
	       O_JSON, O_CHAT, O_KV, O_BATCH, O_IGN, O_PAR, O_KVT, O_NOPC, O_SHP, O_KVM, O_SEQ, O_SOCK, O_BACKEND, O_NOGRAPH, O_GEMM,
	       O_DEVICE, O_PROF, O_BW, O_NOMMAP, O_STEPMS, O_URL, O_USOCK, O_KEY, O_GRAMMAR, O_SCHEMA,
	       O_JOBJ, O_MNAME, O_SPEC, O_DMAX, O_DMIN, O_DMODEL };
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
		{ "parallel", required_argument, 0, O_PAR }, { "kv-tokens", required_argument, 0, O_KVT },
		{ "no-prefix-cache", no_argument, 0, O_NOPC }, { "shared-prefix", no_argument, 0, O_SHP },
		{ "kv-mib", required_argument, 0, O_KVM }, { "sequential", no_argument, 0, O_SEQ },
		{ "socket", required_argument, 0, O_SOCK }, { "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE }, { "no-graphs", no_argument, 0, O_NOGRAPH },
		{ "gemm-rows", required_argument, 0, O_GEMM }, { "profile", no_argument, 0, O_PROF },
		{ "bandwidth", no_argument, 0, O_BW }, { "no-mmap", no_argument, 0, O_NOMMAP },
		{ "step-ms", required_argument, 0, O_STEPMS }, { "url", required_argument, 0, O_URL },
		{ "unix-socket", required_argument, 0, O_USOCK }, { "api-key", required_argument, 0, O_KEY },
		{ "grammar", required_argument, 0, O_GRAMMAR }, { "json-schema", required_argument, 0, O_SCHEMA },
		{ "json-object", no_argument, 0, O_JOBJ }, { "model-name", required_argument, 0, O_MNAME },
		{ "speculative", required_argument, 0, O_SPEC }, { "draft-max", required_argument, 0, O_DMAX },
		{ "draft-min-match", required_argument, 0, O_DMIN },
		{ "draft-model", required_argument, 0, O_DMODEL },
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
	o->parallel = 1;
	o->backend = "auto";
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
		case O_PROF: o->profile = 1; break;
		case O_BW: o->bandwidth = 1; break;
		case O_JSON: o->json = 1; break;
		case O_CHAT: o->chat = 1; break;
		case O_IGN: o->ignore_eos = 1; break;
		case O_BATCH: o->batch = atoi(optarg); break;
		case O_STEPMS: o->step_ms = atoi(optarg); break;
		case O_SPEC:
			if (!strcmp(optarg, "off"))
				o->spec = SCHED_SPEC_OFF;
			else if (!strcmp(optarg, "ngram"))
				o->spec = SCHED_SPEC_NGRAM;
			else if (!strcmp(optarg, "draft"))
				o->spec = SCHED_SPEC_DRAFT;
			else {
				fprintf(stderr, "llm-bench: --speculative must be off, ngram or draft\n");
				return -1;
			}
			break;
		case O_DMODEL: o->draft_model = optarg; break;
		case O_DMAX: o->draft_max = atoi(optarg); break;
		case O_DMIN: o->draft_min_match = atoi(optarg); break;
		case O_PAR: o->parallel = atoi(optarg); break;
		case O_KVT: o->kv_tokens = atoll(optarg); break;
		case O_NOPC: o->no_prefix_cache = 1; break;
		case O_NOGRAPH: o->no_graphs = 1; break;
		case O_GEMM: o->gemm_rows = atoi(optarg); break;
		case O_SHP: o->shared_prefix = 1; break;
		case O_KVM: o->kv_mib = atoll(optarg); break;
		case O_SEQ: o->sequential = 1; break;
		case O_SOCK: o->socket = optarg; break;
		case O_URL: o->url = optarg; break;
		case O_USOCK: o->unix_socket = optarg; break;
		case O_KEY: o->api_key = optarg; break;
		case O_MNAME:
			if (strlen(optarg) > 256) {
				fprintf(stderr, "llm-bench: --model-name: a model's name has at most 256 bytes\n");
				return -1;
			}
			o->model_name = optarg;
			break;
		case O_NOMMAP: o->no_mmap = 1; break;
		case O_GRAMMAR:
		case O_SCHEMA:
		case O_JOBJ:
			if (o->grammar_kind) {
				fprintf(stderr, "llm-bench: one of --grammar, --json-schema and --json-object\n");
				return -1;
			}
			o->grammar_kind = c == O_GRAMMAR ? CONSTRAIN_GBNF : c == O_SCHEMA ? CONSTRAIN_JSON_SCHEMA
										  : CONSTRAIN_JSON_OBJECT;
			if (c != O_JOBJ && !(o->grammar_text = read_file(optarg))) {
				fprintf(stderr, "llm-bench: cannot read %s: %s\n", optarg, strerror(errno));
				return -1;
			}
			break;
		case O_BACKEND:
			if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "llm-bench: --backend must be auto, cpu or cuda\n");
				return -1;
			}
			o->backend = optarg;
			break;
		case O_DEVICE: o->device = atoi(optarg); break;
		case O_KV:
			if (!strcmp(optarg, "f16"))
				o->kv_type = QT_F16;
			else if (!strcmp(optarg, "f32"))
				o->kv_type = QT_F32;
			else if (!strcmp(optarg, "q8_0"))
				o->kv_type = QT_Q8_0;
			else {
				fprintf(stderr, "llm-bench: --kv-type must be f16, f32 or q8_0\n");
				return -1;
			}
			break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (o->socket && o->url) {
		fprintf(stderr, "llm-bench: --socket or --url, not both\n");
		return -1;
	}
	if ((o->unix_socket || o->api_key) && !o->url) {
		fprintf(stderr, "llm-bench: --unix-socket and --api-key go with --url\n");
		return -1;
	}
	if (o->model_name && !o->socket && !o->url) {
		fprintf(stderr, "llm-bench: --model-name needs --socket or --url (in-process, --model "
			"names the file)\n");
		return -1;
	}
	if (o->draft_max < 0 || o->draft_max > SCHED_SPEC_MAX_DRAFT || o->draft_min_match < 0) {
		fprintf(stderr, "llm-bench: --draft-max must be 1..%d, --draft-min-match positive\n",
			SCHED_SPEC_MAX_DRAFT);
		return -1;
	}
	if ((o->socket || o->url) && (o->draft_min_match || o->draft_model)) {
		fprintf(stderr, "llm-bench: --draft-min-match and --draft-model run in-process (the "
			"daemon's [spec] section sets them for --socket and --url)\n");
		return -1;
	}
	if (!o->socket && !o->url && (o->spec == SCHED_SPEC_DRAFT) != !!o->draft_model) {
		fprintf(stderr, "llm-bench: --speculative draft and --draft-model go together\n");
		return -1;
	}
	if (o->url && !o->api_key)
		o->api_key = getenv("LLM_API_KEY");
	if (o->bandwidth && (o->socket || o->url)) {
		fprintf(stderr, "llm-bench: --bandwidth measures this machine, not through --socket or --url\n");
		return -1;
	}
	if (!o->bandwidth && ((!o->model && !o->socket && !o->url) || !o->prompt)) {
		usage(stderr);
		return -1;
	}
	if ((o->socket || o->url) && (o->sequential || o->logits || o->n_stops || o->profile || o->step_ms)) {
		fprintf(stderr, "llm-bench: --socket and --url do not go with --sequential, --logits, --stop, "
			"--profile or --step-ms (the daemon's sched.step_ms)\n");
		return -1;
	}
	if (o->n_predict < 1 || o->threads < 1 || o->repeat < 1 || o->batch < 1 || o->parallel < 1 ||
	    o->parallel > 1024 || o->kv_tokens < 0 || o->kv_mib < 0 || o->device < 0 ||
	    o->gemm_rows < 0 || o->step_ms < 0) {
		fprintf(stderr, "llm-bench: --n-predict, --threads, --repeat, --batch and --parallel "
			"must be positive\n");
		return -1;
	}
	return 0;
}

/* The prompt USER as the model sees it: raw, or rendered through the chat
 * template as the user message (after --system). */
static int build_prompt(const struct model *m, const struct bench_opts *o, const char *user,
			char **ret)
{
	struct chat_msg msgs[2];
	int n = 0;

	if (!o->chat) {
		*ret = strdup(user);
		return *ret ? 0 : -ENOMEM;
	}
	if (!m->chat.kind) {
		fprintf(stderr, "llm-bench: %s: the model's chat template is unknown or absent; "
			"use a raw prompt without --chat\n", m->path);
		return -ENOTSUP;
	}
	if (o->system)
		msgs[n++] = (struct chat_msg){ "system", o->system };
	msgs[n++] = (struct chat_msg){ "user", user };
	return chat_render(&m->chat, msgs, n, 1, ret) < 0 ? -EINVAL : 0;
}

/* One request's results, filled by the scheduler's events. */
struct bench_seq {
	int32_t *ids;          /* (n_ids) prompt; owned */
	int n_ids;
	int32_t *gen;          /* (n_predict) generated ids; owned */
	double *t_gen;         /* (n_predict) when each came; owned */
	int n_gen;
	char *text;            /* owned, NUL-terminated */
	size_t text_len, text_cap;
	double t_submit, t_first, t_last; /* monotonic seconds */
	enum sched_finish finish;
	int error;
	int done;
	struct sched_usage usage;  /* from the FINISH event */
};

struct bench_run {
	struct engine *e;       /* for its last error */
	struct constrain *cn;   /* with a grammar: its compiled form; NULL without */
	struct constrain_req **creq; /* (n) each sequence's grammar state, or NULL */
	struct bench_seq *seqs; /* (n) */
	int n;
	int finished;
	int oom;                /* a text buffer could not grow */
};

static void on_event(void *ctx, const struct sched_event *ev)
{
	struct bench_run *br = ctx;
	struct bench_seq *q = &br->seqs[ev->id];
	double t = clock_s();

	if (ev->kind == SCHED_EV_FINISH) {
		q->finish = ev->finish;
		q->error = ev->error;
		q->usage = ev->usage;
		q->done = 1;
		br->finished++;
		return;
	}
	if (ev->token >= 0) {
		q->t_gen[q->n_gen] = t;
		q->gen[q->n_gen++] = ev->token;
		if (!q->t_first)
			q->t_first = t;
		q->t_last = t;
	}
	if (q->text_len + ev->text_len + 1 > q->text_cap) {
		size_t cap = (q->text_cap + ev->text_len) * 2 + 64;
		char *nt = realloc(q->text, cap);
		if (!nt) {
			br->oom = 1;
			return;
		}
		q->text = nt;
		q->text_cap = cap;
	}
	memcpy(q->text + q->text_len, ev->text, ev->text_len);
	q->text_len += ev->text_len;
	q->text[q->text_len] = 0;
}

/* Tokens per second once every sequence has its first token (every
 * prompt is in): the steps after that only decode, unless a preempted
 * sequence recomputes.  llama.cpp's batched-bench times that phase apart
 * (its S_TG); aggregate_tok_s counts the whole run.  0 when no token came
 * after. */
static double decode_phase_tok_s(const struct bench_run *br)
{
	double t0 = 0, t1 = 0;
	int64_t n = 0;

	for (int k = 0; k < br->n; k++) {
		const struct bench_seq *q = &br->seqs[k];
		if (q->n_gen > 0 && q->t_first > t0)
			t0 = q->t_first;
		if (q->n_gen > 0 && q->t_last > t1)
			t1 = q->t_last;
	}
	for (int k = 0; k < br->n; k++)
		for (int i = 0; i < br->seqs[k].n_gen; i++)
			n += br->seqs[k].t_gen[i] > t0;
	return n > 0 && t1 > t0 ? (double)n / (t1 - t0) : 0;
}

static const char *finish_name(enum sched_finish f)
{
	switch (f) {
	case SCHED_FIN_STOP: return "stop";
	case SCHED_FIN_LENGTH: return "length";
	case SCHED_FIN_CANCELLED: return "cancelled";
	default: return "error";
	}
}

static int submit_one(struct sched *sc, const struct bench_opts *o, struct bench_run *br, int i)
{
	struct bench_seq *q = &br->seqs[i];
	struct sched_request req = {
		.id = (uint64_t)i, .client = 0, .priority = 0, .prompt = q->ids,
		.n_prompt = q->n_ids, .max_tokens = o->n_predict, .sampling = o->sp,
		.stops = o->stops, .n_stops = o->n_stops, .ignore_eos = o->ignore_eos,
	};
	char err[400];
	int r;

	if (br->cn) {
		constrain_req_free(br->creq[i]);
		br->creq[i] = NULL;
		r = constrain_start(br->cn, o->grammar_kind, 0, o->grammar_text,
				    o->grammar_text ? strlen(o->grammar_text) : 0, &br->creq[i], err, sizeof err);
		if (r < 0) {
			fprintf(stderr, "llm-bench: %s\n", err);
			return r;
		}
		req.grammar = constrain_req_state(br->creq[i]);
	}
	q->n_gen = 0;
	q->text_len = 0;
	q->t_first = q->t_last = 0;
	q->done = 0;
	q->t_submit = clock_s();
	if ((r = sched_submit(sc, &req)) < 0)
		fprintf(stderr, "llm-bench: request %d refused: %s\n", i,
			r == -E2BIG ? "the prompt does not fit the context or the KV pool" : strerror(-r));
	return r;
}

/* Steps the scheduler until UNTIL requests have finished. */
static int step_until(struct sched *sc, struct bench_run *br, int until)
{
	while (br->finished < until) {
		int r = sched_step(sc);
		if (r < 0) {
			const char *why = br->e ? engine_last_error(br->e) : "";
			fprintf(stderr, "llm-bench: step failed: %s\n", why && *why ? why : strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Submits every sequence at once (or, with --sequential, each after the
 * previous one finished) and steps the scheduler until all are done.
 * Returns the wall time in seconds, or a negative errno. */
static double run_all(struct sched *sc, const struct bench_opts *o, struct bench_run *br,
		      struct sched_counters *ret_counters)
{
	double t0 = clock_s();
	int r;

	br->finished = 0;
	for (int i = 0; i < br->n; i++) {
		if ((r = submit_one(sc, o, br, i)) < 0 ||
		    (o->sequential && (r = step_until(sc, br, i + 1)) < 0))
			return r;
	}
	if ((r = step_until(sc, br, br->n)) < 0)
		return r;
	sched_counters(sc, ret_counters);
	return br->oom ? -ENOMEM : clock_s() - t0;
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

/* --logits: the prompt through the bare engine, one sequence, in chunks. */
static int print_logits(struct engine *e, const struct model *m, const struct bench_opts *o,
			const int32_t *ids, int n_ids)
{
	struct kv_pool *kv = engine_kv_pool(e);
	int32_t bt = kv->view.block_tokens, n_blocks = (n_ids + bt - 1) / bt;
	int32_t *table = malloc((size_t)n_blocks * sizeof *table), *pos = malloc((size_t)o->batch * sizeof *pos);
	const int32_t **tabs = malloc((size_t)o->batch * sizeof *tabs);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	int r = -ENOMEM;

	if (!table || !pos || !tabs || !logits || n_blocks > kv_pool_n_available(kv))
		goto out;
	for (int32_t i = 0; i < n_blocks; i++)
		table[i] = kv_pool_alloc(kv);
	for (int i = 0; i < n_ids; i += o->batch) {
		int n = n_ids - i < o->batch ? n_ids - i : o->batch;
		for (int k = 0; k < n; k++) {
			pos[k] = i + k;
			tabs[k] = table;
		}
		struct engine_batch b = { n, ids + i, pos, tabs, NULL };
		if ((r = engine_step(e, &b, logits)) < 0)
			goto out;
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
	r = 0;
out:
	free(table);
	free(pos);
	free(tabs);
	free(logits);
	return r;
}

/* Tokenizes the prompt for sequence I: with --parallel each sequence's prompt
 * starts differently so they are not all one cached prefix, or, with
 * --shared-prefix, ends differently so they share it (a system prompt). */
static int tokenize_seq(const struct model *m, const struct bench_opts *o, const char *text, int i,
			struct bench_seq *q)
{
	char *varied = NULL;
	const char *t = text;
	int n;

	if (o->parallel > 1 && o->chat && o->shared_prefix) {
		/* the system message is the shared part; the user message varies */
		char *user = NULL;
		if (asprintf(&user, "%s (Request %d of %d.)", o->prompt, i + 1, o->parallel) < 0)
			return -ENOMEM;
		int r = build_prompt(m, o, user, &varied);
		free(user);
		if (r < 0)
			return r;
		t = varied;
	} else if (o->parallel > 1) {
		int r = o->shared_prefix ? asprintf(&varied, "%s (Request %d of %d.)", text, i + 1, o->parallel)
					 : asprintf(&varied, "Request %d of %d. %s", i + 1, o->parallel, text);
		if (r < 0)
			return -ENOMEM;
		t = varied;
	}
	n = tokenizer_encode(m->tok, t, strlen(t), tokenizer_add_bos(m->tok), 1, NULL, 0);
	q->ids = malloc(((size_t)n + 1) * sizeof *q->ids);
	q->gen = malloc(((size_t)o->n_predict + 1) * sizeof *q->gen);
	q->t_gen = malloc(((size_t)o->n_predict + 1) * sizeof *q->t_gen);
	if (n < 0 || !q->ids || !q->gen || !q->t_gen) {
		free(varied);
		return -ENOMEM;
	}
	q->n_ids = tokenizer_encode(m->tok, t, strlen(t), tokenizer_add_bos(m->tok), 1, q->ids, n);
	free(varied);
	return q->n_ids;
}

/* Submission to first token, seconds (of the last repetition). */
static double seq_ttft(const struct bench_seq *q)
{
	return (q->t_first ? q->t_first : q->t_last) - q->t_submit;
}

static double percentile(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	int k = (int)(p * (n - 1) + 0.5);
	return v[k];
}

/* ---- --socket: the same workload through the daemon ---- */

/* Sequence I's prompt text as in-process runs vary it (the chat template is
 * the daemon's to apply, so with --chat the user message varies). */
static char *socket_prompt(const struct bench_opts *o, int i)
{
	char *t = NULL;
	int r;
	if (o->parallel == 1)
		return strdup(o->prompt);
	r = o->shared_prefix ? asprintf(&t, "%s (Request %d of %d.)", o->prompt, i + 1, o->parallel)
			     : asprintf(&t, "Request %d of %d. %s", i + 1, o->parallel, o->prompt);
	return r < 0 ? NULL : t;
}

static int run_socket(const struct bench_opts *o)
{
	char url[1024] = "";

	/* libllm names llmd's HTTP socket unix:PATH */
	if (o->url)
		snprintf(url, sizeof url, o->unix_socket ? "unix:%s" : "%s",
			 o->unix_socket ? o->unix_socket : o->url);
	struct bench_socket_params p = {
		.socket = o->socket, .n = o->parallel, .system = o->system,
		.chat = o->chat || o->system, .max_tokens = o->n_predict,
		.temperature = o->sp.temperature, .top_k = o->sp.top_k, .top_p = o->sp.top_p,
		.min_p = o->sp.min_p, .seed = o->sp.seed, .ignore_eos = o->ignore_eos,
		.spec_flags = o->spec == SCHED_SPEC_NGRAM ? LLM_SPEC_NGRAM : o->spec == SCHED_SPEC_OFF ? LLM_SPEC_OFF :
			      o->spec == SCHED_SPEC_DRAFT ? LLM_SPEC_DRAFT : 0,
		.max_draft = o->draft_max,
		.url = o->url ? url : NULL, .api_key = o->api_key, .model_name = o->model_name,
		.grammar_kind = o->grammar_kind == CONSTRAIN_GBNF ? LLM_GRAMMAR_GBNF :
				o->grammar_kind == CONSTRAIN_JSON_SCHEMA ? LLM_GRAMMAR_JSON_SCHEMA :
				o->grammar_kind == CONSTRAIN_JSON_OBJECT ? LLM_GRAMMAR_JSON : 0,
		.grammar_text = o->grammar_text,
	};
	const char *where = o->url ? o->url : o->socket;
	char **prompts = calloc((size_t)o->parallel, sizeof *prompts);
	double *agg = calloc((size_t)o->repeat, sizeof *agg), *dc = calloc((size_t)o->repeat, sizeof *dc);
	double *ttft = calloc((size_t)o->parallel, sizeof *ttft);
	double p50 = 0, p95 = 0;
	struct bench_socket_result res = { 0 };
	char err[512];
	int rc = 1;

	if (!prompts || !agg || !dc || !ttft)
		goto out;
	for (int i = 0; i < o->parallel; i++)
		if (!(prompts[i] = socket_prompt(o, i)))
			goto out;
	p.prompts = (const char *const *)prompts;
	for (int r = 0; r < o->repeat; r++) {
		double dtime = 0;
		int64_t dsteps = 0;
		bench_socket_result_free(&res);
		if (bench_socket_run(&p, &res, err, sizeof err) < 0) {
			fprintf(stderr, "llm-bench: %s\n", err);
			goto out;
		}
		for (int k = 0; k < res.n; k++) {
			ttft[k] = res.seqs[k].ttft_s;
			if (res.seqs[k].n_gen > 1) {
				dsteps += res.seqs[k].n_gen - 1;
				dtime += res.seqs[k].decode_s;
			}
		}
		agg[r] = res.generated / res.wall_s;
		dc[r] = dtime > 0 ? dsteps / dtime : 0;
		p50 = percentile(ttft, res.n, 0.5) * 1e3;
		p95 = percentile(ttft, res.n, 0.95) * 1e3;
	}
	double agg_med = median(agg, o->repeat), dc_med = median(dc, o->repeat);
	if (o->json) {
		json_object *root = json_object_new_object(), *arr = json_object_new_array();
		json_object_object_add(root, o->url ? "url" : "socket", json_object_new_string(where));
		if (o->model_name)
			json_object_object_add(root, "model_name", json_object_new_string(o->model_name));
		json_object_object_add(root, "parallel", json_object_new_int(o->parallel));
		json_object_object_add(root, "repeat", json_object_new_int(o->repeat));
		json_object_object_add(root, "aggregate_tok_s", json_object_new_double(agg_med));
		json_object_object_add(root, "decode_tok_s", json_object_new_double(dc_med));
		json_object_object_add(root, "ttft_ms_p50", json_object_new_double(p50));
		json_object_object_add(root, "ttft_ms_p95", json_object_new_double(p95));
		/* the ids where the server gave them all (not every HTTP one does) */
		if (res.seqs[0].n_ids == res.seqs[0].n_gen)
			json_object_object_add(root, "generated_ids", ids_json(res.seqs[0].gen, res.seqs[0].n_ids));
		for (int k = 0; k < res.n; k++) {
			json_object *one = json_object_new_object();
			if (res.seqs[k].n_ids == res.seqs[k].n_gen)
				json_object_object_add(one, "generated_ids",
						       ids_json(res.seqs[k].gen, res.seqs[k].n_ids));
			json_object_object_add(one, "generated_tokens", json_object_new_int(res.seqs[k].n_gen));
			json_object_object_add(one, "prompt_tokens", json_object_new_int((int)res.seqs[k].prompt_tokens));
			json_object_object_add(one, "cached_tokens", json_object_new_int((int)res.seqs[k].cached_tokens));
			json_object_object_add(one, "queue_ms", json_object_new_double(res.seqs[k].queue_ms));
			json_object_object_add(one, "prefill_ms", json_object_new_double(res.seqs[k].prefill_ms));
			json_object_object_add(one, "ttft_ms", json_object_new_double(res.seqs[k].ttft_s * 1e3));
			json_object_array_add(arr, one);
		}
		json_object_object_add(root, "results", arr);
		puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(root);
	} else {
		fprintf(stderr, "llm-bench: through %s%s%s%s, %d clients: %.1f generated tok/s in aggregate, "
			"%.1f tok/s per sequence while decoding, time to first token p50 %.0f ms, "
			"p95 %.0f ms (median of %d)\n", where, o->model_name ? " (model " : "",
			o->model_name ? o->model_name : "", o->model_name ? ")" : "", o->parallel, agg_med,
			dc_med, p50, p95, o->repeat);
	}
	rc = 0;
out:
	bench_socket_result_free(&res);
	for (int i = 0; prompts && i < o->parallel; i++)
		free(prompts[i]);
	free(prompts);
	free(agg);
	free(dc);
	free(ttft);
	return rc;
}

/* ---- --bandwidth ---- */

#define BW_BYTES ((size_t)512 << 20) /* far past any last-level cache here */
#define BW_PASSES 5
#define BW_READS 4 /* of its slice per thread per pass */

struct bw_part {
	const uint64_t *p; /* (n) this thread's slice of the buffer */
	size_t n;      /* words */
	uint64_t sum;  /* keeps the loads */
};

#if defined(__x86_64__)
/* 128 bytes a step in four 32-byte loads: one thread then reads faster
 * than its share of DRAM gives (the portable loop's 16-byte loads did not) */
__attribute__((target("avx2"))) static uint64_t bw_sum_avx2(const uint64_t *p, size_t n)
{
	__m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;

	for (size_t i = 0; i + 16 <= n; i += 16) {
		s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
		s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 4)));
		s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 8)));
		s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 12)));
	}
	s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
	return (uint64_t)_mm256_extract_epi64(s0, 0) ^ (uint64_t)_mm256_extract_epi64(s0, 3);
}
#endif

/* Reads its slice BW_READS times. */
static void *bw_read(void *arg)
{
	struct bw_part *a = arg;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;

	for (int r = 0; r < BW_READS; r++) {
#if defined(__x86_64__)
		if (__builtin_cpu_supports("avx2")) {
			s0 ^= bw_sum_avx2(a->p, a->n);
			continue;
		}
#endif
		for (size_t i = 0; i + 4 <= a->n; i += 4) {
			s0 += a->p[i];
			s1 += a->p[i + 1];
			s2 += a->p[i + 2];
			s3 += a->p[i + 3];
		}
	}
	a->sum = s0 ^ s1 ^ s2 ^ s3;
	return NULL;
}

/* GB/s that THREADS threads read a 512 MiB buffer at, each its own slice
 * four times over: the median of five passes; negative when out of memory
 * or threads. */
static double read_bandwidth(int threads)
{
	uint64_t *buf = aligned_alloc(64, BW_BYTES); /* no load crosses a line */
	struct bw_part *parts = calloc((size_t)threads, sizeof *parts);
	pthread_t *th = calloc((size_t)threads, sizeof *th);
	double gbs[BW_PASSES], r = -1;
	size_t words = BW_BYTES / sizeof *buf, per = words / (size_t)threads / 16 * 16;

	if (!buf || !parts || !th)
		goto out;
	for (size_t i = 0; i < words; i++) /* every page touched, no zero-page tricks */
		buf[i] = i * 0x9e3779b97f4a7c15ull;
	for (int pass = 0; pass < BW_PASSES; pass++) {
		int started = 0;
		double t0 = clock_s();
		for (; started < threads; started++) {
			parts[started] = (struct bw_part){ buf + (size_t)started * per, per, 0 };
			if (pthread_create(&th[started], NULL, bw_read, &parts[started]) != 0)
				break;
		}
		for (int i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		if (started < threads)
			goto out;
		gbs[pass] = (double)per * sizeof *buf * threads * BW_READS / (clock_s() - t0) / 1e9;
	}
	r = median(gbs, BW_PASSES);
out:
	free(buf);
	free(parts);
	free(th);
	return r;
}

static int run_bandwidth(const struct bench_opts *o)
{
	struct model *m = NULL;
	char err[512];
	double gbs;

	if (o->model && model_load(o->model, &m, err, sizeof err) < 0) {
		fprintf(stderr, "llm-bench: cannot load model %s: %s\n", o->model, err);
		return 1;
	}
	gbs = read_bandwidth(o->threads);
	if (gbs < 0) {
		fprintf(stderr, "llm-bench: --bandwidth: out of memory or threads\n");
		model_free(m);
		return 1;
	}
	uint64_t wb = m ? model_decode_bytes(m) : 0;
	double bound = wb ? gbs * 1e9 / (double)wb : 0;
	if (o->json) {
		json_object *root = json_object_new_object();
		json_object_object_add(root, "threads", json_object_new_int(o->threads));
		json_object_object_add(root, "read_gb_s", json_object_new_double(gbs));
		if (m) {
			json_object_object_add(root, "model", json_object_new_string(m->name));
			json_object_object_add(root, "weight_bytes_per_token", json_object_new_int64((int64_t)wb));
			json_object_object_add(root, "decode_bound_tok_s", json_object_new_double(bound));
		}
		puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(root);
	} else {
		printf("llm-bench: memory read bandwidth, %d threads: %.1f GB/s (median of %d passes over %zu MiB)\n",
		       o->threads, gbs, BW_PASSES, BW_BYTES >> 20);
		if (m)
			printf("llm-bench: %s: a decode token reads %.1f MB of weights: at most %.0f tok/s\n", m->name,
			       (double)wb / 1e6, bound);
	}
	model_free(m);
	return 0;
}

int main(int argc, char **argv)
{
	struct bench_opts o = { 0 };
	struct model *m = NULL;
	struct engine *e = NULL, *de = NULL;
	struct model *dm = NULL;
	struct sched *sc = NULL;
	struct engine_params ep;
	struct sched_params sp;
	struct sched_counters cnt;
	struct bench_run br = { 0 };
	char err[512], *text = NULL;
	double *pf = NULL, *dc = NULL, *agg = NULL, *tg = NULL, *ttft = NULL, *later = NULL;
	double *first_ms = NULL, *later_p50 = NULL, *later_max = NULL;
	struct engine_profile prof = { 0 };
	int64_t kv_tokens = 0;
	int rc = 1, r;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	if (o.socket || o.url) {
		rc = run_socket(&o);
		free(o.prompt);
		return rc;
	}
	if (o.bandwidth) {
		rc = run_bandwidth(&o);
		free(o.prompt);
		return rc;
	}
	/* The backend first: a bad choice should not cost a model load. */
	struct engine_cuda_probe probe;
	int32_t backend;
	engine_cuda_probe(&probe);
	if (engine_choose_backend(o.backend, o.device, &probe, &backend, err, sizeof err) < 0) {
		fprintf(stderr, "llm-bench: --backend %s: %s\n", o.backend, err);
		goto out;
	}
	r = model_load_flags(o.model, o.no_mmap ? MODEL_LOAD_NO_MMAP : 0, &m, err, sizeof err);
	if (r < 0) {
		fprintf(stderr, "llm-bench: cannot load model %s: %s\n", o.model, err);
		return 1;
	}
	if (build_prompt(m, &o, o.prompt, &text) < 0)
		goto out;
	br.n = o.parallel;
	br.seqs = calloc((size_t)br.n, sizeof *br.seqs);
	if (!br.seqs)
		goto out;
	for (int i = 0; i < br.n; i++) {
		if ((r = tokenize_seq(m, &o, text, i, &br.seqs[i])) < 0)
			goto out;
		if (r == 0) {
			fprintf(stderr, "llm-bench: the prompt is empty and the model adds no BOS token\n");
			goto out;
		}
		kv_tokens += r + o.n_predict + 16;
	}

	engine_params_default(&ep);
	ep.n_threads = o.threads;
	ep.kv_type = o.kv_type;
	ep.backend = backend;
	ep.device = o.device;
	ep.graphs = !o.no_graphs;
	ep.gemm_rows = o.gemm_rows;
	ep.max_batch = o.batch;
	ep.kv_tokens = o.kv_tokens ? o.kv_tokens : o.kv_mib ? 0 : kv_tokens;
	ep.kv_mib = o.kv_mib;
	sched_params_default(&sp);
	sp.max_seqs = o.parallel;
	sp.max_batched_tokens = o.batch;
	sp.prefix_cache = !o.no_prefix_cache;
	sp.step_ms = o.step_ms;
	if (o.spec)
		sp.spec_mode = o.spec;
	if (o.draft_max)
		sp.spec_max_draft = o.draft_max;
	if (o.draft_min_match)
		sp.spec_min_match = o.draft_min_match;
	r = engine_new(m, &ep, &e, err, sizeof err);
	if (r < 0) {
		fprintf(stderr, "llm-bench: cannot start the engine: %s\n", err);
		goto out;
	}
	if (o.draft_model) {
		/* the draft: the same backend and pool size, the model's context,
		 * the model's CPU threads */
		struct engine_params dp = ep;
		dp.n_ctx = engine_n_ctx(e);
		dp.threads_of = e;
		if (model_load_flags(o.draft_model, o.no_mmap ? MODEL_LOAD_NO_MMAP : 0, &dm, err, sizeof err) < 0 ||
		    engine_new(dm, &dp, &de, err, sizeof err) < 0) {
			fprintf(stderr, "llm-bench: cannot start the draft model %s: %s\n", o.draft_model, err);
			goto out;
		}
	}
	if (o.logits) {
		r = print_logits(e, m, &o, br.seqs[0].ids, br.seqs[0].n_ids);
		if (r < 0)
			fprintf(stderr, "llm-bench: forward pass failed: %s\n", strerror(-r));
		rc = r < 0;
		goto out;
	}

	pf = calloc((size_t)o.repeat, sizeof *pf);
	dc = calloc((size_t)o.repeat, sizeof *dc);
	agg = calloc((size_t)o.repeat, sizeof *agg);
	tg = calloc((size_t)o.repeat, sizeof *tg);
	ttft = calloc((size_t)br.n, sizeof *ttft);
	later = calloc((size_t)br.n, sizeof *later);
	first_ms = calloc((size_t)o.repeat, sizeof *first_ms);
	later_p50 = calloc((size_t)o.repeat, sizeof *later_p50);
	later_max = calloc((size_t)o.repeat, sizeof *later_max);
	if (!pf || !dc || !agg || !tg || !ttft || !later || !first_ms || !later_p50 || !later_max)
		goto out;
	double ttft_p50 = 0, ttft_p95 = 0;
	for (int i = 0; i < o.repeat; i++) {
		/* A fresh engine and scheduler per repetition: a repetition must
		 * not find the previous one's prompt in the prefix cache. */
		if (i > 0) {
			sched_free(sc);
			sc = NULL;
			engine_write_device_profile(e, stderr);
			engine_free(e);
			e = NULL;
			ep.threads_of = de; /* the threads the draft kept */
			if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
				fprintf(stderr, "llm-bench: cannot restart the engine: %s\n", err);
				goto out;
			}
		}
		br.e = e;
		if (o.profile)
			engine_set_profile(e, 1);
		/* a grammar compiled afresh each repetition: its first masks
		 * (the per-position tables) are part of what is timed */
		if (o.grammar_kind) {
			for (int k = 0; br.creq && k < br.n; k++) {
				constrain_req_free(br.creq[k]);
				br.creq[k] = NULL;
			}
			constrain_free(br.cn);
			br.cn = NULL;
			if ((!br.creq && !(br.creq = calloc((size_t)br.n, sizeof *br.creq))) ||
			    constrain_new(m->tok, &br.cn) < 0) {
				fprintf(stderr, "llm-bench: out of memory\n");
				goto out;
			}
		}
		if (sched_new(e, m, &sp, on_event, &br, &sc, err, sizeof err) < 0) {
			fprintf(stderr, "llm-bench: cannot start the scheduler: %s\n", err);
			goto out;
		}
		if (de && sched_set_draft(sc, de, dm, err, sizeof err) < 0) {
			fprintf(stderr, "llm-bench: --draft-model %s: %s\n", o.draft_model, err);
			goto out;
		}
		double wall = run_all(sc, &o, &br, &cnt);
		if (o.profile) {
			struct engine_profile p;
			engine_get_profile(e, &p);
			profile_add(&prof, &p);
		}
		int64_t total = 0, dsteps = 0;
		double dtime = 0;
		if (wall < 0)
			goto out;
		for (int k = 0; k < br.n; k++) {
			struct bench_seq *q = &br.seqs[k];
			total += q->n_gen;
			ttft[k] = seq_ttft(q);
			if (q->n_gen > 1) {
				dsteps += q->n_gen - 1;
				dtime += q->t_last - q->t_first;
			}
		}
		pf[i] = br.seqs[0].n_ids / ttft[0];
		dc[i] = dtime > 0 ? dsteps / dtime : 0;
		agg[i] = total / wall;
		tg[i] = decode_phase_tok_s(&br);
		/* what a shared prefix saves: the first request's time to first
		 * token against the later ones' */
		first_ms[i] = ttft[0] * 1e3;
		for (int k = 1; k < br.n; k++)
			later[k - 1] = ttft[k] * 1e3;
		if (br.n > 1) {
			later_max[i] = percentile(later, br.n - 1, 1.0);
			later_p50[i] = percentile(later, br.n - 1, 0.5);
		}
		ttft_p50 = percentile(ttft, br.n, 0.5) * 1e3;
		ttft_p95 = percentile(ttft, br.n, 0.95) * 1e3;
	}
	double pf_med = median(pf, o.repeat), dc_med = median(dc, o.repeat), agg_med = median(agg, o.repeat);
	double tg_med = median(tg, o.repeat);
	struct bench_seq *q0 = &br.seqs[0];

	if (o.json) {
		json_object *root = json_object_new_object();
		json_object_object_add(root, "model", json_object_new_string(m->name));
		json_object_object_add(root, "backend", json_object_new_string(engine_backend_name(e)));
		json_object_object_add(root, "isa", json_object_new_string(quant_isa_name(quant_get_isa())));
		json_object_object_add(root, "threads", json_object_new_int(o.threads));
		json_object_object_add(root, "prompt_ids", ids_json(q0->ids, q0->n_ids));
		json_object_object_add(root, "generated_ids", ids_json(q0->gen, q0->n_gen));
		json_object_object_add(root, "text", json_object_new_string_len(q0->text ? q0->text : "", (int)q0->text_len));
		json_object_object_add(root, "finish_reason", json_object_new_string(finish_name(q0->finish)));
		json_object_object_add(root, "n_prompt", json_object_new_int(q0->n_ids));
		json_object_object_add(root, "n_generated", json_object_new_int(q0->n_gen));
		json_object_object_add(root, "repeat", json_object_new_int(o.repeat));
		json_object_object_add(root, "prefill_tok_s", json_object_new_double(pf_med));
		json_object_object_add(root, "decode_tok_s", json_object_new_double(dc_med));
		json_object_object_add(root, "ttft_ms", json_object_new_double(seq_ttft(q0) * 1e3));
		/* the --parallel figures, whatever N (one sequence: its own) */
		json_object_object_add(root, "parallel", json_object_new_int(o.parallel));
		json_object_object_add(root, "aggregate_tok_s", json_object_new_double(agg_med));
		json_object_object_add(root, "decode_phase_tok_s", json_object_new_double(tg_med));
		json_object_object_add(root, "ttft_ms_p50", json_object_new_double(ttft_p50));
		json_object_object_add(root, "ttft_ms_p95", json_object_new_double(ttft_p95));
		uint64_t g_rec, g_rep;
		engine_graph_stats(e, &g_rec, &g_rep);
		json_object_object_add(root, "graphs_recorded", json_object_new_int64((int64_t)g_rec));
		json_object_object_add(root, "graphs_replayed", json_object_new_int64((int64_t)g_rep));
		if (sp.spec_mode != SCHED_SPEC_OFF) {
			/* the last repetition's: steps that verified proposals, how many
			 * tokens each gained, the share of proposals that stood */
			json_object *sj = json_object_new_object();
			json_object_object_add(sj, "mode", json_object_new_string(
				sp.spec_mode == SCHED_SPEC_DRAFT ? "draft" : "ngram"));
			if (o.draft_model) {
				json_object_object_add(sj, "draft_model", json_object_new_string(dm->name));
				json_object_object_add(sj, "draft_steps", json_object_new_int64((int64_t)cnt.draft_steps));
				json_object_object_add(sj, "draft_rows", json_object_new_int64((int64_t)cnt.draft_rows));
			}
			json_object_object_add(sj, "max_draft", json_object_new_int(sp.spec_max_draft));
			json_object_object_add(sj, "min_match", json_object_new_int(sp.spec_min_match));
			json_object_object_add(sj, "decode_steps", json_object_new_int64((int64_t)cnt.decode_rows));
			json_object_object_add(sj, "verify_steps", json_object_new_int64((int64_t)cnt.spec_steps));
			json_object_object_add(sj, "proposed", json_object_new_int64((int64_t)cnt.spec_proposed));
			json_object_object_add(sj, "accepted", json_object_new_int64((int64_t)cnt.spec_accepted));
			json_object_object_add(sj, "accepted_per_step", json_object_new_double(
				cnt.spec_steps ? (double)cnt.spec_accepted / (double)cnt.spec_steps : 0));
			json_object_object_add(sj, "tokens_per_decode_step", json_object_new_double(
				cnt.decode_rows ? (double)(cnt.decode_rows + cnt.spec_accepted) / (double)cnt.decode_rows : 0));
			json_object_object_add(sj, "acceptance_rate", json_object_new_double(
				cnt.spec_proposed ? (double)cnt.spec_accepted / (double)cnt.spec_proposed : 0));
			json_object_object_add(root, "speculative", sj);
		}
		if (o.parallel > 1) {
			json_object *res = json_object_new_array_ext(br.n);
			json_object_object_add(root, "preemptions", json_object_new_int64((int64_t)cnt.preemptions));
			json_object_object_add(root, "prefix_hit_tokens", json_object_new_int64((int64_t)cnt.prefix_hit_tokens));
			json_object_object_add(root, "steps", json_object_new_int64((int64_t)cnt.steps));
			json_object_object_add(root, "prefill_rows", json_object_new_int64((int64_t)cnt.prefill_rows));
			json_object_object_add(root, "prefix_waits", json_object_new_int64((int64_t)cnt.prefix_waits));
			json_object_object_add(root, "sequential", json_object_new_boolean(o.sequential));
			json_object_object_add(root, "ttft_ms_first", json_object_new_double(median(first_ms, o.repeat)));
			json_object_object_add(root, "ttft_ms_later_p50", json_object_new_double(median(later_p50, o.repeat)));
			json_object_object_add(root, "ttft_ms_later_max", json_object_new_double(median(later_max, o.repeat)));
			for (int k = 0; k < br.n; k++) {
				json_object *one = json_object_new_object();
				json_object_object_add(one, "prompt_ids", ids_json(br.seqs[k].ids, br.seqs[k].n_ids));
				json_object_object_add(one, "generated_ids", ids_json(br.seqs[k].gen, br.seqs[k].n_gen));
				json_object_object_add(one, "cached_tokens", json_object_new_int(br.seqs[k].usage.cached_tokens));
				json_object_object_add(one, "queue_ms", json_object_new_double(br.seqs[k].usage.queue_s * 1e3));
				json_object_object_add(one, "prefill_ms", json_object_new_double(br.seqs[k].usage.prefill_s * 1e3));
				json_object_object_add(one, "ttft_ms", json_object_new_double(seq_ttft(&br.seqs[k]) * 1e3));
				json_object_array_add(res, one);
			}
			json_object_object_add(root, "results", res);
		}
		if (o.profile)
			json_object_object_add(root, "profile", profile_json(&prof));
		puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(root);
	} else {
		printf("%s\n", q0->text ? q0->text : "");
		fflush(stdout);
		fprintf(stderr, "\nllm-bench: %s, %d threads (%s): prompt %d tokens at %.1f tok/s, "
			"generated %d tokens at %.1f tok/s (median of %d)\n", m->name, o.threads,
			quant_isa_name(quant_get_isa()), q0->n_ids, pf_med, q0->n_gen, dc_med, o.repeat);
		if (o.parallel > 1) {
			fprintf(stderr, "llm-bench: %d sequences%s: %.1f generated tok/s in aggregate "
				"(%.1f once every prompt was in), time to first token p50 %.0f ms, p95 %.0f ms\n",
				o.parallel, o.sequential ? " one after another" : "", agg_med, tg_med, ttft_p50,
				ttft_p95);
			double f = median(first_ms, o.repeat), lp = median(later_p50, o.repeat);
			double lm = median(later_max, o.repeat);
			fprintf(stderr, "llm-bench: time to first token: first request %.1f ms, later ones "
				"p50 %.1f ms (%.1f%%), max %.1f ms (%.1f%%); %lld prompt tokens from the "
				"prefix cache, %lld prompt rows computed\n", f, lp, 100 * lp / f, lm,
				100 * lm / f, (long long)cnt.prefix_hit_tokens, (long long)cnt.prefill_rows);
		}
		if (sp.spec_mode != SCHED_SPEC_OFF)
			fprintf(stderr, "llm-bench: speculative (%s, last run): %llu of %llu proposed tokens "
				"stood (%.0f%%), %.2f tokens per decode step, %llu verifying steps\n",
				sp.spec_mode == SCHED_SPEC_DRAFT ? "draft" : "ngram",
				(unsigned long long)cnt.spec_accepted, (unsigned long long)cnt.spec_proposed,
				cnt.spec_proposed ? 100.0 * (double)cnt.spec_accepted / (double)cnt.spec_proposed : 0,
				cnt.decode_rows ? (double)(cnt.decode_rows + cnt.spec_accepted) / (double)cnt.decode_rows : 0,
				(unsigned long long)cnt.spec_steps);
		if (o.profile)
			profile_print(&prof);
	}
	rc = 0;
out:
	for (int i = 0; br.seqs && i < br.n; i++) {
		free(br.seqs[i].ids);
		free(br.seqs[i].gen);
		free(br.seqs[i].t_gen);
		free(br.seqs[i].text);
	}
	free(br.seqs);
	free(pf);
	free(dc);
	free(agg);
	free(tg);
	free(ttft);
	free(later);
	free(first_ms);
	free(later_p50);
	free(later_max);
	free(text);
	free(o.prompt);
	sched_free(sc);
	for (int i = 0; br.creq && i < br.n; i++)
		constrain_req_free(br.creq[i]);
	free(br.creq);
	constrain_free(br.cn);
	free(o.grammar_text);
	if (e)
		engine_write_device_profile(e, stderr);
	engine_free(e);
	engine_free(de);
	model_free(dm);
	model_free(m);
	return rc;
}
