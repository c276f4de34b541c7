/* llm_client.c - llm-client, the shell-pipeline client of llmd: a prompt from
 * the arguments or standard input, the generated text streamed to standard
 * output as it comes (or token ids, or one JSON object per event), one
 * request per input line with --each-line.  Everything goes through libllm;
 * this file only parses options, orders output and handles signals.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm.h"

/* Exit statuses, as llm-client(1) documents them. */
enum {
	EXIT_OK = 0,
	EXIT_REQUEST = 1,       /* the daemon refused or failed a request */
	EXIT_USAGE = 2,
	EXIT_CONNECT = 3,       /* cannot connect, or the connection was lost */
	EXIT_INTERRUPTED = 130,
};

#define MAX_STOPS 16            /* libllm checks the real limit; this bounds the array */
#define CANCEL_GRACE_MS 2000    /* after SIGINT, how long to wait for the DONE events */
#define DEFAULT_WINDOW 64       /* requests in flight when the daemon names no limit */

struct opts {
	const char *socket;         /* NULL: libllm's default ($LLMD_SOCKET, then /run/llmd) */
	const char *system;         /* system message; implies chat */
	bool chat;                  /* the prompt is a chat's user message */
	bool json;                  /* one JSON object per event */
	bool ids;                   /* token ids instead of text */
	bool each_line;             /* one request per input line */
	struct llm_request req;     /* sampling and limits; prompt/messages set per job */
	const char *stops[MAX_STOPS];
};

/* A growable byte buffer. */
struct buf {
	char *p;                    /* (cap) bytes, len used */
	size_t len, cap;
};

enum job_state { JOB_WAITING, JOB_LIVE, JOB_DONE };

/* One request: the whole prompt, or one input line with --each-line. */
struct job {
	char *prompt;               /* owned */
	size_t line;                /* 1-based input line; 0 without --each-line */
	uint64_t id;                /* libllm's id once submitted */
	enum job_state state;
	struct buf held;            /* output held back until the jobs before it are printed */
	size_t n_ids;               /* ids written so far (--ids: the separator) */
	char last;                  /* last byte of text written, 0 if none */
};

struct run {
	struct opts *o;
	struct llm *h;
	struct job *jobs;           /* (n_jobs) in input order */
	size_t n_jobs;
	size_t head;                /* first job whose output is not all printed */
	size_t next_submit;         /* first JOB_WAITING job */
	size_t n_live;
	size_t window;              /* requests in flight at most */
	bool failed;                /* a request ended with an error */
	bool tty;                   /* stdout is a terminal */
};

static volatile sig_atomic_t got_signal;
static int sig_pipe[2] = { -1, -1 };

/* ---- small helpers ---- */

static void die_oom(void)
{
	fputs("llm-client: out of memory\n", stderr);
	exit(EXIT_REQUEST);
}

static void buf_add(struct buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->p, cap);

		if (!p)
			die_oom();
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_signal(int sig)
{
	int saved = errno;
	char c = (char)sig;

	got_signal = sig;
	if (write(sig_pipe[1], &c, 1) < 0) {
		/* full pipe: a wake-up is pending anyway */
	}
	errno = saved;
}

/* SIGINT and SIGTERM, without SA_RESTART, through a self-pipe. */
static int setup_signals(void)
{
	struct sigaction sa;

	if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	return 0;
}

/* The short name of a daemon error code (libllm(3)). */
static const char *err_name(int code)
{
	static const char *const names[] = {
		"ok", "badframe", "version", "state", "inval", "limit", "toobig", "busy",
		"draining", "duplicate", "notfound", "perm", "notemplate", "internal", "ring",
	};

	return code >= 0 && (size_t)code < sizeof names / sizeof *names ? names[code] : "unknown";
}

static const char *finish_name(enum llm_finish f)
{
	switch (f) {
	case LLM_FINISH_STOP: return "stop";
	case LLM_FINISH_LENGTH: return "length";
	case LLM_FINISH_CANCELLED: return "cancelled";
	case LLM_FINISH_ERROR: return "error";
	}
	return "unknown";
}

/* ---- options ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: llm-client [OPTIONS] [PROMPT...]\n"
		"Sends PROMPT (the arguments joined with spaces, else all of standard input)\n"
		"to llmd and streams the generated text to standard output.\n"
		"\n"
		"      --socket PATH       daemon socket (default $LLMD_SOCKET, then " LLM_DEFAULT_SOCKET ")\n"
		"  -s, --system TEXT       system message (implies --chat)\n"
		"      --chat              send the prompt as the user message of a chat\n"
		"  -n, --max-tokens N      tokens to generate at most (default 256)\n"
		"      --temp X            temperature (default 0.8; 0 = greedy)\n"
		"      --top-p X           nucleus sampling (default 0.95; 1 = off)\n"
		"      --top-k N           top-k sampling (default 40; 0 = off)\n"
		"      --min-p X           min-p sampling (default 0.05; 0 = off)\n"
		"      --repeat-penalty X  repetition penalty (default 1 = off)\n"
		"      --seed N            sampling seed (default: the daemon picks one)\n"
		"      --stop S            stop string, not part of the output (repeatable, up to %d;\n"
		"                          \\n \\t \\r \\\\ are understood)\n"
		"      --ignore-eos        keep generating past end-of-generation tokens\n"
		"      --priority N        higher runs first (default 0)\n"
		"      --json              one JSON object per event, one per line\n"
		"      --logprobs          include each token's log-probability (implies --json)\n"
		"      --ids               print the generated token ids instead of the text\n"
		"      --each-line         every line of standard input is its own request;\n"
		"                          outputs come in input order, one line each\n"
		"  -h, --help              this text\n"
		"      --version           the version\n"
		"\n"
		"Exit status: 0 success, 1 the daemon refused or failed a request,\n"
		"2 usage error, 3 cannot connect or the connection was lost, 130 interrupted.\n",
		MAX_STOPS);
}

static bool parse_long(const char *s, long min, long max, long *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return false;
	*ret = v;
	return true;
}

static bool parse_float(const char *s, float *ret)
{
	char *end;
	float v;

	errno = 0;
	v = strtof(s, &end);
	if (errno || end == s || *end || !isfinite(v))
		return false;
	*ret = v;
	return true;
}

static bool parse_u64(const char *s, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	errno = 0;
	if (*s == '-')
		return false;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end)
		return false;
	*ret = v;
	return true;
}

/* Replaces \n, \t, \r and \\ in S, in place (a stop string is hard to type
 * otherwise); other backslashes stay as they are. */
static char *unescape(char *s)
{
	char *w = s;

	for (const char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] && strchr("ntr\\", r[1])) {
			r++;
			*w++ = *r == 'n' ? '\n' : *r == 't' ? '\t' : *r == 'r' ? '\r' : '\\';
		} else {
			*w++ = *r;
		}
	}
	*w = 0;
	return s;
}

static void bad_arg(const char *opt, const char *val, const char *what)
{
	fprintf(stderr, "llm-client: %s %s: %s\n", opt, val, what);
	exit(EXIT_USAGE);
}

/* Parses the options; returns the index of the first prompt argument. */
static int parse_args(int argc, char **argv, struct opts *o)
{
	enum { O_SOCKET = 256, O_CHAT, O_TEMP, O_TOPP, O_TOPK, O_MINP, O_RP, O_SEED, O_STOP,
	       O_PRIO, O_JSON, O_LOGPROBS, O_IDS, O_EACH, O_VERSION, O_IGNEOS };
	static const struct option lo[] = {
		{ "socket", required_argument, 0, O_SOCKET },
		{ "system", required_argument, 0, 's' },
		{ "chat", no_argument, 0, O_CHAT },
		{ "max-tokens", required_argument, 0, 'n' },
		{ "temp", required_argument, 0, O_TEMP },
		{ "top-p", required_argument, 0, O_TOPP },
		{ "top-k", required_argument, 0, O_TOPK },
		{ "min-p", required_argument, 0, O_MINP },
		{ "repeat-penalty", required_argument, 0, O_RP },
		{ "seed", required_argument, 0, O_SEED },
		{ "stop", required_argument, 0, O_STOP },
		{ "ignore-eos", no_argument, 0, O_IGNEOS },
		{ "priority", required_argument, 0, O_PRIO },
		{ "json", no_argument, 0, O_JSON },
		{ "logprobs", no_argument, 0, O_LOGPROBS },
		{ "ids", no_argument, 0, O_IDS },
		{ "each-line", no_argument, 0, O_EACH },
		{ "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	struct llm_request *r = &o->req;
	long v;
	int c;

	llm_request_init(r);
	r->stops = o->stops;
	/* '+': options end at the first prompt word, so a prompt may hold "-x". */
	while ((c = getopt_long(argc, argv, "+s:n:h", lo, NULL)) != -1) {
		switch (c) {
		case O_SOCKET: o->socket = optarg; break;
		case 's': o->system = optarg; o->chat = true; break;
		case O_CHAT: o->chat = true; break;
		case 'n':
			if (!parse_long(optarg, 1, INT32_MAX, &v))
				bad_arg("--max-tokens", optarg, "not a whole number >= 1");
			r->max_tokens = (int32_t)v;
			break;
		case O_TEMP:
			if (!parse_float(optarg, &r->temperature) || r->temperature < 0)
				bad_arg("--temp", optarg, "not a number >= 0");
			break;
		case O_TOPP:
			if (!parse_float(optarg, &r->top_p) || r->top_p <= 0 || r->top_p > 1)
				bad_arg("--top-p", optarg, "not a number in (0, 1]");
			break;
		case O_TOPK:
			if (!parse_long(optarg, INT32_MIN, INT32_MAX, &v))
				bad_arg("--top-k", optarg, "not a whole number");
			r->top_k = (int32_t)v;
			break;
		case O_MINP:
			if (!parse_float(optarg, &r->min_p) || r->min_p < 0 || r->min_p > 1)
				bad_arg("--min-p", optarg, "not a number in [0, 1]");
			break;
		case O_RP:
			if (!parse_float(optarg, &r->repeat_penalty) || r->repeat_penalty <= 0)
				bad_arg("--repeat-penalty", optarg, "not a number > 0");
			break;
		case O_SEED:
			if (!parse_u64(optarg, &r->seed))
				bad_arg("--seed", optarg, "not a whole number >= 0");
			r->has_seed = 1;
			break;
		case O_STOP:
			if (r->n_stops == MAX_STOPS) {
				fprintf(stderr, "llm-client: at most %d --stop strings\n", MAX_STOPS);
				exit(EXIT_USAGE);
			}
			if (!*optarg)
				bad_arg("--stop", "\"\"", "a stop string cannot be empty");
			o->stops[r->n_stops++] = unescape(optarg);
			break;
		case O_IGNEOS: r->flags |= LLM_IGNORE_EOS; break;
		case O_PRIO:
			if (!parse_long(optarg, INT32_MIN, INT32_MAX, &v))
				bad_arg("--priority", optarg, "not a whole number");
			r->priority = (int32_t)v;
			break;
		case O_JSON: o->json = true; break;
		case O_LOGPROBS: r->flags |= LLM_LOGPROBS; o->json = true; break;
		case O_IDS: o->ids = true; break;
		case O_EACH: o->each_line = true; break;
		case 'h': usage(stdout); exit(EXIT_OK);
		case O_VERSION: printf("llm-client (llmd) %s\n", PACKAGE_VERSION); exit(EXIT_OK);
		default: usage(stderr); exit(EXIT_USAGE);
		}
	}
	if (o->json && o->ids) {
		fputs("llm-client: --ids and --json (or --logprobs) do not go together\n", stderr);
		exit(EXIT_USAGE);
	}
	if (o->each_line && optind < argc) {
		fputs("llm-client: --each-line reads its prompts from standard input, not the arguments\n",
		      stderr);
		exit(EXIT_USAGE);
	}
	return optind;
}

/* ---- input ---- */

/* All of standard input, NUL-terminated; NULL on a read error. */
static char *read_stdin(size_t *ret_len)
{
	struct buf b = { 0 };
	char chunk[65536];
	size_t n;

	buf_add(&b, "", 0);
	while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0)
		buf_add(&b, chunk, n);
	if (ferror(stdin)) {
		free(b.p);
		return NULL;
	}
	*ret_len = b.len;
	return b.p;
}

static void add_job(struct run *rn, char *prompt, size_t line)
{
	struct job *j = realloc(rn->jobs, (rn->n_jobs + 1) * sizeof *j);

	if (!j)
		die_oom();
	rn->jobs = j;
	j = &rn->jobs[rn->n_jobs++];
	memset(j, 0, sizeof *j);
	j->prompt = prompt;
	j->line = line;
}

/* One job per line of TEXT (the newline, and a CR before it, removed). */
static void split_lines(struct run *rn, const char *text, size_t len)
{
	size_t line = 0;

	for (size_t off = 0; off < len;) {
		const char *nl = memchr(text + off, '\n', len - off);
		size_t end = nl ? (size_t)(nl - text) : len, n = end - off;
		char *p;

		if (n && text[off + n - 1] == '\r')
			n--;
		p = strndup(text + off, n);
		if (!p)
			die_oom();
		add_job(rn, p, ++line);
		off = end + 1;
	}
}

/* ---- output ---- */

/* Writes S for job J: straight to stdout when every job before it is
 * printed, else held back. */
static void out(struct run *rn, struct job *j, const char *s, size_t n)
{
	if (j == &rn->jobs[rn->head])
		fwrite(s, 1, n, stdout);
	else
		buf_add(&j->held, s, n);
}

/* Prints held output of the jobs that are now at the head. */
static void advance_head(struct run *rn)
{
	while (rn->head < rn->n_jobs) {
		struct job *j = &rn->jobs[rn->head];

		if (j->held.len) {
			fwrite(j->held.p, 1, j->held.len, stdout);
			j->held.len = 0;
		}
		if (j->state != JOB_DONE)
			break;
		rn->head++;
	}
}

static void json_print(struct json_object *o)
{
	fputs(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
					     JSON_C_TO_STRING_NOSLASHESCAPE), stdout);
	fputc('\n', stdout);
	json_object_put(o);
}

static struct json_object *json_event(const char *kind, struct job *j, uint64_t id)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "event", json_object_new_string(kind));
	json_object_object_add(o, "id", json_object_new_int64((int64_t)id));
	if (j->line)
		json_object_object_add(o, "line", json_object_new_int64((int64_t)j->line));
	return o;
}

static void report_error(struct run *rn, struct job *j, const char *msg, int code)
{
	char where[32] = "";

	if (rn->o->each_line)
		snprintf(where, sizeof where, "line %zu: ", j->line);
	if (code)
		fprintf(stderr, "llm-client: %s%s (%s)\n", where, msg, err_name(code));
	else
		fprintf(stderr, "llm-client: %s%s\n", where, msg);
}

/* A job's output is complete: its line ends. */
static void finish_job(struct run *rn, struct job *j)
{
	bool newline;

	if (rn->o->json)
		newline = false;
	else if (rn->o->each_line || rn->o->ids)
		newline = true;
	else
		newline = rn->tty && j->last && j->last != '\n';
	if (newline)
		out(rn, j, "\n", 1);
	j->state = JOB_DONE;
	advance_head(rn);
}

static void on_token(struct run *rn, struct job *j, const struct llm_event *ev)
{
	if (rn->o->json) {
		struct json_object *o = json_event("token", j, ev->id);

		json_object_object_add(o, "token", json_object_new_int(ev->token));
		json_object_object_add(o, "text", json_object_new_string_len(ev->text,
									      (int)ev->text_len));
		json_object_object_add(o, "logprob", json_object_new_double(ev->logprob));
		json_print(o);
	} else if (rn->o->ids) {
		char num[24];
		int n;

		if (ev->token < 0)
			return;         /* text released at the end, no token */
		n = snprintf(num, sizeof num, "%s%d", j->n_ids ? " " : "", ev->token);
		out(rn, j, num, (size_t)n);
		j->n_ids++;
	} else if (ev->text_len) {
		out(rn, j, ev->text, ev->text_len);
		j->last = ev->text[ev->text_len - 1];
	}
}

static void on_done(struct run *rn, struct job *j, const struct llm_event *ev)
{
	if (rn->o->json) {
		struct json_object *o = json_event("done", j, ev->id), *u;

		json_object_object_add(o, "finish", json_object_new_string(finish_name(ev->finish)));
		if (ev->finish == LLM_FINISH_ERROR) {
			json_object_object_add(o, "error", json_object_new_int(ev->error_code));
			json_object_object_add(o, "error_name",
					       json_object_new_string(err_name(ev->error_code)));
			json_object_object_add(o, "message", json_object_new_string(ev->message));
		}
		u = json_object_new_object();
		json_object_object_add(u, "prompt_tokens", json_object_new_int64(ev->prompt_tokens));
		json_object_object_add(u, "cached_tokens", json_object_new_int64(ev->cached_tokens));
		json_object_object_add(u, "generated_tokens",
				       json_object_new_int64(ev->generated_tokens));
		json_object_object_add(u, "preemptions", json_object_new_int64(ev->preemptions));
		json_object_object_add(u, "queue_ms", json_object_new_double(ev->queue_ms));
		json_object_object_add(u, "prefill_ms", json_object_new_double(ev->prefill_ms));
		json_object_object_add(u, "decode_ms", json_object_new_double(ev->decode_ms));
		json_object_object_add(o, "usage", u);
		json_print(o);
	}
	rn->n_live--;
	finish_job(rn, j);
	if (ev->finish == LLM_FINISH_ERROR) {
		rn->failed = true;
		fflush(stdout);
		report_error(rn, j, ev->message[0] ? ev->message : "the request failed",
			     ev->error_code);
	}
}

static struct job *job_of(struct run *rn, uint64_t id)
{
	/* Ids are handed out in submission order, which is input order. */
	for (size_t i = rn->head; i < rn->next_submit; i++)
		if (rn->jobs[i].state == JOB_LIVE && rn->jobs[i].id == id)
			return &rn->jobs[i];
	return NULL;
}

/* ---- the request loop ---- */

/* Submits waiting jobs while there is room.  0, or -EPIPE when the
 * connection is gone. */
static int submit_more(struct run *rn)
{
	struct opts *o = rn->o;

	while (rn->next_submit < rn->n_jobs && rn->n_live < rn->window) {
		struct job *j = &rn->jobs[rn->next_submit];
		struct llm_message msgs[2];
		struct llm_request r = o->req;
		int n = 0, rc;

		if (o->each_line && !*j->prompt) {
			/* An empty line is no request: its output line stays empty. */
			rn->next_submit++;
			finish_job(rn, j);
			continue;
		}
		if (o->chat) {
			if (o->system)
				msgs[n++] = (struct llm_message){ LLM_ROLE_SYSTEM, o->system };
			msgs[n++] = (struct llm_message){ LLM_ROLE_USER, j->prompt };
			r.messages = msgs;
			r.n_messages = n;
		} else {
			r.prompt = j->prompt;
		}
		rc = llm_submit(rn->h, &r, &j->id);
		if (rc == -ENOBUFS)
			break;          /* more when one finishes */
		if (rc == -EPIPE)
			return rc;
		rn->next_submit++;
		if (rc < 0) {
			rn->failed = true;
			report_error(rn, j, llm_errmsg(rn->h), 0);
			finish_job(rn, j);
			continue;
		}
		j->state = JOB_LIVE;
		rn->n_live++;
	}
	return 0;
}

static void cancel_all(struct run *rn)
{
	for (size_t i = rn->head; i < rn->next_submit; i++)
		if (rn->jobs[i].state == JOB_LIVE)
			llm_cancel(rn->h, rn->jobs[i].id);
}

/* On the way out early: a terminal gets its cursor back at the start of a line. */
static void end_partial_line(struct run *rn)
{
	const struct job *j = rn->head < rn->n_jobs ? &rn->jobs[rn->head] : NULL;

	if (rn->tty && !rn->o->json && j && (j->last || j->n_ids) && j->last != '\n')
		fputc('\n', stdout);
	fflush(stdout);
}

/* Runs every job.  Returns the exit status. */
static int run_jobs(struct run *rn)
{
	int64_t deadline = 0;
	bool cancelling = false;

	for (;;) {
		struct pollfd p[2];
		struct llm_event ev;
		int rc, wait = -1;

		if (!cancelling && submit_more(rn) < 0)
			goto lost;
		if (rn->n_live == 0 && (cancelling || rn->next_submit == rn->n_jobs))
			break;
		if (cancelling) {
			int64_t left = deadline - now_ms();

			if (left <= 0)
				break;
			wait = (int)left;
		}
		p[0] = (struct pollfd){ .fd = llm_fd(rn->h), .events = POLLIN };
		p[1] = (struct pollfd){ .fd = sig_pipe[0], .events = POLLIN };
		if (poll(p, 2, wait) < 0 && errno != EINTR) {
			fprintf(stderr, "llm-client: poll: %s\n", strerror(errno));
			return EXIT_CONNECT;
		}
		if (got_signal) {
			char c[16];

			while (read(sig_pipe[0], c, sizeof c) > 0)
				;
			if (cancelling)
				break;  /* a second signal: stop waiting */
			got_signal = 0;
			cancelling = true;
			deadline = now_ms() + CANCEL_GRACE_MS;
			cancel_all(rn);
		}
		while ((rc = llm_next_event(rn->h, &ev, 0)) != 0) {
			struct job *j;

			if (rc == -EINTR)
				continue;
			if (rc < 0)
				goto lost;
			j = job_of(rn, ev.id);
			if (!j)
				continue;
			if (ev.kind == LLM_EV_TOKEN)
				on_token(rn, j, &ev);
			else
				on_done(rn, j, &ev);
			fflush(stdout);
		}
	}
	if (cancelling) {
		end_partial_line(rn);
		return EXIT_INTERRUPTED;
	}
	fflush(stdout);
	return rn->failed ? EXIT_REQUEST : EXIT_OK;
lost:
	end_partial_line(rn);
	fprintf(stderr, "llm-client: connection to the daemon lost: %s\n", llm_errmsg(rn->h));
	return EXIT_CONNECT;
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct run rn = { 0 };
	struct llm_info info;
	char err[1024];
	int first, rc;

	first = parse_args(argc, argv, &o);
	rn.o = &o;
	rn.tty = isatty(STDOUT_FILENO);
	if (setup_signals() < 0) {
		fprintf(stderr, "llm-client: pipe: %s\n", strerror(errno));
		return EXIT_REQUEST;
	}

	if (first < argc) {
		struct buf b = { 0 };

		for (int i = first; i < argc; i++) {
			if (i > first)
				buf_add(&b, " ", 1);
			buf_add(&b, argv[i], strlen(argv[i]));
		}
		add_job(&rn, b.p, 0);
	} else {
		size_t len = 0;
		char *text = read_stdin(&len);

		if (got_signal)
			return EXIT_INTERRUPTED;
		if (!text) {
			fprintf(stderr, "llm-client: cannot read standard input: %s\n",
				strerror(errno));
			return EXIT_USAGE;
		}
		if (o.each_line) {
			split_lines(&rn, text, len);
			free(text);
		} else {
			add_job(&rn, text, 0);
		}
	}
	/* An empty prompt given explicitly as an argument ('') is a story from
	 * nothing (BOS alone); empty standard input is more likely a mistake. */
	if (!o.each_line && first >= argc && !*rn.jobs[0].prompt) {
		fputs("llm-client: the prompt is empty (give it as arguments or on standard input)\n",
		      stderr);
		return EXIT_USAGE;
	}
	if (rn.n_jobs == 0)
		return EXIT_OK;         /* --each-line with no input */

	rc = llm_connect(o.socket, 0, &rn.h, err, sizeof err);
	if (rc == -EINTR)
		return EXIT_INTERRUPTED;
	if (rc < 0) {
		fprintf(stderr, "llm-client: %s%s\n", err,
			rc == -ENOENT || rc == -ECONNREFUSED ? " (is llmd running?)" : "");
		return EXIT_CONNECT;
	}
	llm_get_info(rn.h, &info);
	rn.window = info.max_inflight ? info.max_inflight : DEFAULT_WINDOW;
	/* Timings in ms and float log-probabilities: 9 digits, not 17 of noise. */
	json_c_set_serialization_double_format("%.9g", JSON_C_OPTION_GLOBAL);

	rc = run_jobs(&rn);

	llm_close(rn.h);
	for (size_t i = 0; i < rn.n_jobs; i++) {
		free(rn.jobs[i].prompt);
		free(rn.jobs[i].held.p);
	}
	free(rn.jobs);
	return rc;
}
