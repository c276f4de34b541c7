/* test_daemon.c - the real llmd on a temporary socket, driven by llm-client,
 * llmctl, libllm and raw hostile frames.  It pins:
 *  - `llm-client --ids --temp 0` through the daemon gives llama.cpp's golden
 *    tokens (every case of greedy-llamacpp.json, four models); a text answer
 *    ends with a newline in a pipe too, and -N prints the bytes alone;
 *  - 32 concurrent clients with different prompts get what they get alone;
 *  - a client killed mid-stream, CANCEL and `llmctl cancel` remove the
 *    request from `llmctl ps` and return the pool's used blocks to zero;
 *  - a client that stops reading with a tiny ring gets every token in order
 *    later, and another client finishes meanwhile;
 *  - hostile input (random, truncated and oversize frames, a bad version,
 *    frames before HELLO, a scribbled ring index, 1000 connections at once,
 *    prompts and max_tokens over the limits) gets its error or its
 *    connection closed, and the daemon keeps serving;
 *  - admin commands are refused for a non-admin uid (when run as root);
 *  - `llm-bench --socket` generates through the daemon exactly what
 *    `llm-bench --model` generates in-process;
 *  - the device: backend auto never runs the emulator, and a backend that
 *    cannot run (no CUDA backend, no such device, the model and a minimal KV
 *    pool over the device's free memory) stops llmd at start-up with a log
 *    line naming why and the sizes; on the emulated device the automatic
 *    KV pool takes kv.gpu_mem_fraction of what the model leaves;
 *  - on the (emulated) CUDA backend, a device failure mid-step ends the
 *    running request with an error record and llmd exits non-zero, so
 *    systemd restarts it.
 */
#include <config.h>
#include <grp.h>
#include <json-c/json.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

#include "clientutil.h"
#include "ring.h"

static const char *models_dir;

/* ---- golden tokens through llm-client ---- */

static void test_golden_via_client(void)
{
	char path[4096], bin[1024], nbuf[16], out[8192];
	json_object *root;

	snprintf(path, sizeof path, "%s/golden/greedy-llamacpp.json", models_dir);
	root = json_object_from_file(path);
	if (!root) {
		printf("golden: %s absent, skipped\n", path);
		return;
	}
	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());
	const char *models[] = { "stories260K.gguf", "derived/TinyStories-656K-f32.gguf",
				 "derived/TinyStories-656K-q8_0.gguf", "derived/TinyStories-656K-q4_0.gguf" };
	for (int mi = 0; mi < 4; mi++) {
		struct tdaemon d;
		int cases = 0, tokens = 0;
		snprintf(path, sizeof path, "%s/%s", models_dir, models[mi]);
		if (access(path, R_OK) != 0)
			continue;
		if (tdaemon_start(&d, path, NULL) < 0) {
			test_failures++;
			continue;
		}
		for (size_t i = 0; i < json_object_array_length(root); i++) {
			json_object *c = json_object_array_get_idx(root, i);
			json_object *want = json_object_object_get(c, "generated_ids");
			int horizon = json_object_get_int(json_object_object_get(c, "safe_horizon"));
			const char *prompt = json_object_get_string(json_object_object_get(c, "prompt"));
			char *p = out;
			int k = 0, bad = 0;

			if (strcmp(json_object_get_string(json_object_object_get(c, "model")), models[mi]))
				continue;
			if (horizon > (int)json_object_array_length(want))
				horizon = (int)json_object_array_length(want);
			snprintf(nbuf, sizeof nbuf, "%d", horizon);
			const char *argv[] = { bin, "--socket", d.sock, "--ids", "--temp", "0", "-n", nbuf,
					       prompt, NULL };
			CHECK_INT_EQ(trun(argv, NULL, out, sizeof out), 0);
			for (; k < horizon; k++) {
				char *end;
				long v = strtol(p, &end, 10);
				if (end == p)
					break;
				p = end;
				if (v != json_object_get_int(json_object_array_get_idx(want, (size_t)k)) && !bad) {
					fprintf(stderr, "%s \"%s\": token %d is %ld, llama.cpp %d\n", models[mi],
						prompt, k, v,
						json_object_get_int(json_object_array_get_idx(want, (size_t)k)));
					bad = 1;
				}
			}
			if (k != horizon)
				fprintf(stderr, "%s \"%s\": %d ids, wanted %d: '%s'\n", models[mi], prompt, k,
					horizon, out);
			CHECK(!bad && k == horizon);
			cases++;
			tokens += k;
		}
		printf("golden via llm-client: %-36s %d cases, %d tokens identical\n", models[mi], cases,
		       tokens);
		CHECK_INT_EQ(tdaemon_stop(&d), 0);
	}
	json_object_put(root);
}

/* ---- 32 concurrent clients ---- */

#define N_CONC 32
static const char *const names[] = { "Lily", "Tom", "Sam", "Sue", "Ben", "Max", "Mia", "Tim" };
static const char *const starts[] = { "Once upon a time there was a girl named",
				      "One day a boy named", "The little dog saw",
				      "There was a big red ball and" };

struct conc {
	const struct tdaemon *d;
	int i;
	struct gen alone, crowd;
	int ok;
};

static void conc_prompt(int i, char *buf, size_t len)
{
	snprintf(buf, len, "%s %s", starts[i % 4], names[(i / 4) % 8]);
}

static void *conc_thread(void *arg)
{
	struct conc *c = arg;
	char prompt[128];
	struct llm *h = client(c->d, 0);
	conc_prompt(c->i, prompt, sizeof prompt);
	/* Odd ones sample with a seed: seeded sampling must not depend on the crowd either. */
	c->ok = h && generate(h, prompt, 40 + c->i % 7, c->i % 2 ? 0.8f : 0.0f, 1000 + (uint64_t)c->i,
			      &c->crowd) == 0;
	llm_close(h);
	return NULL;
}

static void test_concurrent(const struct tdaemon *d)
{
	static struct conc cs[N_CONC];
	pthread_t th[N_CONC];
	struct llm *h = client(d, 0);
	char prompt[128];
	int same = 0;

	for (int i = 0; i < N_CONC && h; i++) {
		cs[i].d = d;
		cs[i].i = i;
		conc_prompt(i, prompt, sizeof prompt);
		CHECK(generate(h, prompt, 40 + i % 7, i % 2 ? 0.8f : 0.0f, 1000 + (uint64_t)i,
			       &cs[i].alone) == 0);
	}
	llm_close(h);
	for (int i = 0; i < N_CONC; i++)
		pthread_create(&th[i], NULL, conc_thread, &cs[i]);
	for (int i = 0; i < N_CONC; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < N_CONC; i++) {
		CHECK(cs[i].ok);
		if (cs[i].alone.n == cs[i].crowd.n && cs[i].alone.n > 0 &&
		    !memcmp(cs[i].alone.ids, cs[i].crowd.ids, sizeof(int32_t) * (size_t)cs[i].alone.n) &&
		    !strcmp(cs[i].alone.text, cs[i].crowd.text))
			same++;
		else
			fprintf(stderr, "client %d: %d tokens alone, %d in the crowd, different\n", i,
				cs[i].alone.n, cs[i].crowd.n);
	}
	printf("concurrency: %d/%d clients got exactly their tokens from running alone\n", same, N_CONC);
	CHECK_INT_EQ(same, N_CONC);
	CHECK(wait_idle(d));
}

/* ---- a client killed mid-stream, CANCEL, llmctl cancel ----
 *
 * Each request here must still be live when the test acts on it.  At
 * n_ctx 512 a 4000-token request ends by itself within a fraction of a
 * second, sooner than a loaded machine forks llmctl, so its client has the
 * smallest ring and stops reading: the request parks on the full ring and
 * waits there for the kill or the cancel. */

static void test_vanishing_client(const struct tdaemon *d)
{
	int pfd[2];
	pid_t pid;
	char c;

	CHECK(pipe(pfd) == 0);
	pid = fork();
	if (pid == 0) {
		struct llm *h = client(d, RING_MIN_CAPACITY);
		struct llm_request r;
		struct llm_event ev;
		uint64_t id;
		int got = 0;
		llm_request_init(&r);
		r.prompt = "Once upon a time";
		r.max_tokens = 4000;
		r.flags = LLM_IGNORE_EOS;
		if (!h || llm_submit(h, &r, &id) < 0)
			_exit(1);
		while (got < 5 && llm_next_event(h, &ev, 5000) == 1)
			got += ev.kind == LLM_EV_TOKEN;
		(void)!write(pfd[1], "x", 1);
		for (;;)
			pause(); /* killed here, mid-stream */
	}
	close(pfd[1]);
	CHECK(read(pfd[0], &c, 1) == 1);
	close(pfd[0]);
	{
		struct llm *h = client(d, 0);
		json_object *ps = h ? admin_json(h, "ps", NULL) : NULL, *arr = NULL;
		CHECK(ps && json_object_object_get_ex(ps, "requests", &arr) &&
		      json_object_array_length(arr) == 1);
		json_object_put(ps);
		llm_close(h);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	CHECK(wait_idle(d));
	printf("vanishing client: its request left ps and its blocks returned\n");

	/* CANCEL from the client itself */
	struct llm *h = client(d, RING_MIN_CAPACITY);
	struct llm_request r;
	struct gen g = { .n = 0 };
	uint64_t id;
	struct llm_event ev;
	llm_request_init(&r);
	r.prompt = "Once upon a time";
	r.max_tokens = 4000;
	r.flags = LLM_IGNORE_EOS;
	CHECK(h && llm_submit(h, &r, &id) == 0);
	for (int got = 0; h && got < 3 && llm_next_event(h, &ev, 5000) == 1;)
		got += ev.kind == LLM_EV_TOKEN;
	CHECK_INT_EQ(llm_cancel(h, id), 0);
	CHECK_INT_EQ(wait_done(h, id, &g, 10000), 1);
	CHECK_INT_EQ(g.finish, LLM_FINISH_CANCELLED);
	CHECK(wait_idle(d));

	/* llmctl cancel ID, from another process */
	char bin[1024], idbuf[32], out[1024];
	json_object *ps, *arr = NULL;
	CHECK(llm_submit(h, &r, &id) == 0);
	for (int got = 0; got < 3 && llm_next_event(h, &ev, 5000) == 1;)
		got += ev.kind == LLM_EV_TOKEN;
	ps = admin_json(h, "ps", NULL);
	CHECK(ps && json_object_object_get_ex(ps, "requests", &arr) && json_object_array_length(arr) == 1);
	snprintf(idbuf, sizeof idbuf, "%lld",
		 arr ? (long long)jint(json_object_array_get_idx(arr, 0), "id", NULL) : 0LL);
	json_object_put(ps);
	snprintf(bin, sizeof bin, "%s/llmctl", tbuilddir());
	const char *argv[] = { bin, "--socket", d->sock, "cancel", idbuf, NULL };
	CHECK_INT_EQ(trun(argv, NULL, out, sizeof out), 0);
	memset(&g, 0, sizeof g);
	CHECK_INT_EQ(wait_done(h, id, &g, 10000), 1);
	CHECK_INT_EQ(g.finish, LLM_FINISH_CANCELLED);
	const char *argv2[] = { bin, "--socket", d->sock, "cancel", "999999", NULL };
	CHECK_INT_EQ(trun(argv2, NULL, out, sizeof out), 1); /* no such request */
	llm_close(h);
	CHECK(wait_idle(d));
	printf("cancel: CANCEL and llmctl cancel end the request; blocks returned\n");
}

/* ---- a slow reader with a tiny ring ---- */

static void test_slow_reader(const struct tdaemon *d)
{
	struct llm *slow = client(d, 4096), *fast = client(d, 0);
	struct llm_request r;
	struct gen ref, g, other;
	uint64_t id, oid;
	json_object *ps, *arr = NULL;
	int saw_full = 0;

	CHECK(slow && fast);
	if (!slow || !fast)
		return;
	/* What it gets when it reads promptly. */
	llm_request_init(&r);
	r.prompt = "The little dog saw";
	r.max_tokens = 300;
	r.temperature = 0;
	r.flags = LLM_IGNORE_EOS;
	CHECK(llm_submit(fast, &r, &id) == 0);
	memset(&ref, 0, sizeof ref);
	CHECK_INT_EQ(wait_done(fast, id, &ref, 60000), 1);

	CHECK(llm_submit(slow, &r, &id) == 0);
	/* Meanwhile another client runs a whole request. */
	struct llm_request o;
	llm_request_init(&o);
	o.prompt = "Once upon a time";
	o.max_tokens = 100;
	o.temperature = 0;
	o.flags = LLM_IGNORE_EOS;
	double t0 = clock_s();
	CHECK(llm_submit(fast, &o, &oid) == 0);
	memset(&other, 0, sizeof other);
	CHECK_INT_EQ(wait_done(fast, oid, &other, 60000), 1);
	double t_other = clock_s() - t0;
	CHECK_INT_EQ(other.n, 100);
	/* The slow one, unread, must be waiting on its full ring by now. */
	for (double t1 = clock_s(); clock_s() - t1 < 10 && !saw_full; tsleep_ms(50)) {
		ps = admin_json(fast, "ps", NULL);
		if (ps && json_object_object_get_ex(ps, "requests", &arr))
			for (size_t i = 0; i < json_object_array_length(arr); i++) {
				json_object *q = json_object_array_get_idx(arr, i), *f = NULL;
				if (json_object_object_get_ex(q, "ring_full", &f) && json_object_get_boolean(f))
					saw_full = 1;
			}
		json_object_put(ps);
	}
	CHECK(saw_full);
	tsleep_ms(1000);
	memset(&g, 0, sizeof g);
	CHECK_INT_EQ(wait_done(slow, id, &g, 60000), 1);
	CHECK_INT_EQ(g.n, ref.n);
	CHECK(g.n == ref.n && !memcmp(g.ids, ref.ids, sizeof(int32_t) * (size_t)g.n) &&
	      !strcmp(g.text, ref.text));
	printf("slow reader: a 4 KiB ring left unread; 100 tokens of another client took %.2f s "
	       "meanwhile; all %d tokens arrived in order afterwards\n", t_other, g.n);
	llm_close(slow);
	llm_close(fast);
	CHECK(wait_idle(d));
}

/* ---- llm-client's last line ---- */

/* An answer ends with a newline, in a pipe too; -N prints the bytes alone. */
static void test_client_newline(const struct tdaemon *d)
{
	static char plain[4096], exact[4096];
	char bin[1024];

	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());
	const char *a[] = { bin, "--socket", d->sock, "-n", "6", "--temp", "0", "Once upon a time",
			    NULL };
	const char *b[] = { bin, "--socket", d->sock, "-N", "-n", "6", "--temp", "0",
			    "Once upon a time", NULL };
	CHECK_INT_EQ(trun(a, NULL, plain, sizeof plain), 0);
	CHECK_INT_EQ(trun(b, NULL, exact, sizeof exact), 0);
	size_t n = strlen(exact);
	CHECK(n > 0 && strlen(plain) > 0);
	CHECK(plain[strlen(plain) - 1] == '\n');
	if (n && exact[n - 1] == '\n') {
		CHECK_STR_EQ(plain, exact);
	} else {
		CHECK_INT_EQ(strlen(plain), n + 1);
		CHECK(strncmp(plain, exact, n) == 0);
	}
	printf("llm-client: the answer '%s' ends with a newline in a pipe; -N adds none\n", exact);
}

/* ---- llm-client --each-line ---- */

/* What --each-line makes of an answer: newlines around it dropped, those
 * inside written as \n, backslashes doubled. */
static void fold(const char *a, char *out, size_t cap)
{
	size_t n = strlen(a), o = 0;

	while (n && a[n - 1] == '\n')
		n--;
	while (n && *a == '\n')
		a++, n--;
	for (size_t i = 0; i < n && o + 3 < cap; i++) {
		if (a[i] == '\n' || a[i] == '\\' || a[i] == '\r') {
			out[o++] = '\\';
			out[o++] = a[i] == '\n' ? 'n' : a[i] == '\r' ? 'r' : '\\';
		} else {
			out[o++] = a[i];
		}
	}
	out[o] = 0;
}

/* The answer to QUESTION alone (-N: its bytes), as a chat or not. */
static void answer_alone(const char *sock, const char *question, int chat, char *out, size_t cap)
{
	char bin[1024];
	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());
	const char *as_chat[] = { bin, "--socket", sock, "-N", "-n", "12", "--temp", "0", "--chat",
				  question, NULL };
	const char *as_text[] = { bin, "--socket", sock, "-N", "-n", "12", "--temp", "0", question,
				  NULL };
	CHECK_INT_EQ(trun(chat ? as_chat : as_text, NULL, out, cap), 0);
}

/* --each-line: one output line per input line, each the answer its line
 * gets alone (a chat where the model has a template), folded; --raw keeps
 * the answers' own newlines, --no-chat sends completions. */
static void test_each_line(const char *sock, int has_template)
{
	static char out[8192], want[8192], one[2048], folded[2048];
	static const char *const qs[] = { "What is 2+2?", "Name a color.", "", "Once upon a time" };
	const char *input = "What is 2+2?\nName a color.\n\nOnce upon a time\n";
	char bin[1024];

	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());
	const char *plain[] = { bin, "--socket", sock, "--each-line", "-n", "12", "--temp", "0", NULL };
	const char *raw[] = { bin, "--socket", sock, "--each-line", "--raw", "-n", "12", "--temp", "0",
			      NULL };
	const char *nochat[] = { bin, "--socket", sock, "--each-line", "--no-chat", "-n", "12",
				 "--temp", "0", NULL };
	struct { const char *const *argv; int chat, folded; } runs[] = {
		{ plain, has_template, 1 }, { raw, has_template, 0 }, { nochat, 0, 1 },
	};
	for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
		want[0] = 0;
		for (size_t q = 0; q < sizeof qs / sizeof qs[0]; q++) {
			one[0] = 0;
			if (*qs[q])
				answer_alone(sock, qs[q], runs[r].chat, one, sizeof one);
			if (runs[r].folded) {
				fold(one, folded, sizeof folded);
				strcat(want, folded);
			} else {
				strcat(want, one);
			}
			strcat(want, "\n");
		}
		CHECK_INT_EQ(trun(runs[r].argv, input, out, sizeof out), 0);
		CHECK_STR_EQ(out, want);
	}
	/* folded, it is one line per input line */
	CHECK_INT_EQ(trun(plain, input, out, sizeof out), 0);
	int lines = 0;
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	CHECK_INT_EQ(lines, 4);
	printf("llm-client --each-line (%s): one line per input line, each the answer it gets "
	       "alone; --raw and --no-chat too\n", has_template ? "chat template" : "no template");
}

/* ---- model.chat_template ---- */

/* Writes TEXT to DIR/NAME; returns the path in a static buffer of its own
 * per call site's BUF. */
static const char *write_file(const char *dir, const char *name, const char *text, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", dir, name);
	FILE *f = fopen(buf, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
	return buf;
}

/* An operator's template replaces the model's: a chat renders through it
 * (its answer is the completion of the text it renders, special tokens
 * parsed), raise_exception's message reaches the client, and a template
 * that does not compile stops llmd at start with the line. */
static void test_chat_template_file(const char *model)
{
	static char out[4096], want[4096], log[16384];
	char dir[] = "/tmp/llmd-tmpl.XXXXXX", good[256], raising[256], broken[256], bin[1024], opt[300];
	struct tdaemon d;

	CHECK(mkdtemp(dir) != NULL);
	write_file(dir, "good.jinja",
		   "{% for m in messages %}<|im_start|>{{ m.role | upper }}\n{{ m.content }}<|im_end|>\n"
		   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
		   good, sizeof good);
	write_file(dir, "raising.jinja",
		   "{% if messages | length > 1 %}{{ raise_exception('one message at a time') }}{% endif %}"
		   "{{ messages[0].content }}", raising, sizeof raising);
	write_file(dir, "broken.jinja", "{{ messages }}\n{% for m in messages %}{{ m.content }\n", broken,
		   sizeof broken);
	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());

	snprintf(opt, sizeof opt, "model.chat_template=%s", good);
	const char *with_good[] = { "--set", "kv.pool_tokens=4096", "--set", opt, NULL };
	if (tdaemon_start(&d, model, with_good) == 0) {
		const char *chat[] = { bin, "--socket", d.sock, "-N", "-n", "10", "--temp", "0", "--chat",
				       "Name a color.", NULL };
		const char *text[] = { bin, "--socket", d.sock, "-N", "-n", "10", "--temp", "0",
				       "<|im_start|>USER\nName a color.<|im_end|>\n<|im_start|>assistant\n", NULL };
		CHECK_INT_EQ(trun(chat, NULL, out, sizeof out), 0);
		CHECK_INT_EQ(trun(text, NULL, want, sizeof want), 0);
		CHECK(out[0] != 0);
		CHECK_STR_EQ(out, want);
		CHECK(strstr(tdaemon_read_log(&d, log, sizeof log), "chat template from") != NULL);
		CHECK_INT_EQ(tdaemon_stop(&d), 0);
	} else {
		test_failures++;
	}

	snprintf(opt, sizeof opt, "model.chat_template=%s", raising);
	const char *with_raising[] = { "--set", "kv.pool_tokens=4096", "--set", opt, NULL };
	if (tdaemon_start(&d, model, with_raising) == 0) {
		char cmd[2048];
		snprintf(cmd, sizeof cmd, "%s --socket %s -n 4 --temp 0 -s 'Be brief.' 'Hi' 2>&1", bin, d.sock);
		const char *sh[] = { "/bin/sh", "-c", cmd, NULL };
		CHECK(trun(sh, NULL, out, sizeof out) != 0);
		CHECK(strstr(out, "raise_exception: one message at a time") != NULL);
		const char *one[] = { bin, "--socket", d.sock, "-n", "4", "--temp", "0", "--chat", "Hi", NULL };
		CHECK_INT_EQ(trun(one, NULL, out, sizeof out), 0); /* one message renders */
		CHECK_INT_EQ(tdaemon_stop(&d), 0);
	} else {
		test_failures++;
	}

	snprintf(opt, sizeof opt, "model.chat_template=%s", broken);
	const char *with_broken[] = { "--set", opt, NULL };
	if (tdaemon_start_with(&d, NULL, model, with_broken, NULL, 0) == 0) {
		int st = 0;
		CHECK(waitpid(d.pid, &st, 0) == d.pid && WIFEXITED(st) && WEXITSTATUS(st) != 0);
		d.pid = 0;
		tdaemon_read_log(&d, log, sizeof log);
		CHECK(strstr(log, "model.chat_template") != NULL && strstr(log, "line 2") != NULL);
		tdaemon_stop(&d);
	} else {
		test_failures++;
	}
	unlink(good);
	unlink(raising);
	unlink(broken);
	rmdir(dir);
	printf("model.chat_template: renders the chat, raise_exception reaches the client, a broken "
	       "template stops llmd naming its line\n");
}

/* ---- llmctl top on a terminal ---- */

/* Reads what the pty's master FD gives for up to MS milliseconds, or until
 * UNTIL appears COUNT times, appending to BUF (CAP bytes, NUL-terminated). */
static size_t pty_read(int fd, char *buf, size_t have, size_t cap, const char *until, int count,
		       int ms)
{
	for (double t0 = clock_s(); clock_s() - t0 < ms / 1000.0 && have + 1 < cap;) {
		struct pollfd p = { fd, POLLIN, 0 };
		int seen = 0;
		for (const char *q = buf; (q = strstr(q, until)); q++)
			seen++;
		if (seen >= count)
			break;
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = read(fd, buf + have, cap - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
	}
	return have;
}

/* The widest line of the frame that starts at the last screen clear in BUF,
 * in characters; *RET_CUT: how many lines end in an ellipsis. */
static int widest_line(const char *buf, int *ret_cut)
{
	const char *f = buf, *q;
	int widest = 0, w = 0;

	while ((q = strstr(f, "\033[2J")))
		f = q + 4;
	*ret_cut = 0;
	for (q = f; *q; q++) {
		if (*q == '\r' || *q == '\n') {
			w = 0;
			continue;
		}
		if (!strncmp(q, "\u2026", 3) && (q[3] == '\r' || q[3] == '\n'))
			(*ret_cut)++;
		w += ((unsigned char)*q & 0xc0) != 0x80;
		if (w > widest)
			widest = w;
	}
	return widest;
}

/* llmctl top fits the terminal's width, cutting long lines with an
 * ellipsis, and redraws at once at the new width when the terminal is
 * resized (SIGWINCH). */
static void test_top_width(const struct tdaemon *d)
{
	static char out[65536];
	struct winsize ws = { .ws_row = 40, .ws_col = 50 };
	char bin[1024];
	int master, slave, st, cut = 0;
	size_t have;
	double t0;
	pid_t pid;

	snprintf(bin, sizeof bin, "%s/llmctl", tbuilddir());
	master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	CHECK(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0);
	if (master < 0)
		return;
	slave = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
	CHECK(slave >= 0 && ioctl(slave, TIOCSWINSZ, &ws) == 0);
	pid = fork();
	if (pid == 0) {
		dup2(slave, 1);
		execl(bin, bin, "--socket", d->sock, "top", "-i", "30", "-n", "2", (char *)NULL);
		_exit(127);
	}
	have = pty_read(master, out, 0, sizeof out, "(no requests)", 1, 10000);
	CHECK(strstr(out, "kv pool") != NULL);
	CHECK_INT_EQ(widest_line(out, &cut), 50);
	CHECK(cut >= 2); /* the model's line and kv pool's at least */
	/* resized to 70 columns: the second frame comes now, not in 30 s */
	ws.ws_col = 70;
	CHECK(ioctl(slave, TIOCSWINSZ, &ws) == 0);
	t0 = clock_s();
	kill(pid, SIGWINCH);
	have = pty_read(master, out, have, sizeof out, "(no requests)", 2, 10000);
	CHECK(clock_s() - t0 < 10);
	CHECK_INT_EQ(widest_line(out, &cut), 70);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(slave);
	close(master);
	printf("llmctl top: lines cut to 50 columns with an ellipsis; redrawn at 70 on SIGWINCH\n");
}

/* ---- hostile input ---- */

static void test_hostile(const struct tdaemon *d)
{
	int fd, closed, code;
	uint8_t buf[4096];
	uint32_t seed = 12345;

	/* random bytes */
	for (int round = 0; round < 20; round++) {
		size_t n = 8 + (size_t)(seed % 4000);
		fd = raw_connect(d);
		for (size_t i = 0; i < n; i++) {
			seed = seed * 1103515245u + 12345u;
			buf[i] = (uint8_t)(seed >> 16);
		}
		send_all(fd, buf, n);
		read_error(fd, &closed);
		CHECK(closed);
		close(fd);
	}
	still_serving(d, "random frames");

	/* a truncated frame, then the client goes */
	fd = raw_connect(d);
	hello(fd, PROTO_VERSION, 4096);
	memset(buf, 0, sizeof buf);
	buf[0] = 100; /* 100-byte payload */
	buf[4] = PROTO_SUBMIT;
	send_all(fd, buf, 18);
	close(fd);
	still_serving(d, "a truncated frame");

	/* an oversize length */
	fd = raw_connect(d);
	hello(fd, PROTO_VERSION, 4096);
	memset(buf, 0, 8);
	buf[2] = 0x20; /* 2 MiB */
	buf[4] = PROTO_SUBMIT;
	send_all(fd, buf, 8);
	code = read_error(fd, &closed);
	CHECK_INT_EQ(code, PROTO_E_BADFRAME);
	CHECK(closed);
	close(fd);

	/* a bad version */
	fd = raw_connect(d);
	hello(fd, 99, 0);
	code = read_error(fd, &closed);
	CHECK_INT_EQ(code, PROTO_E_VERSION);
	CHECK(closed);
	close(fd);

	/* SUBMIT before HELLO */
	{
		uint8_t f[256];
		struct proto_submit s = { .id = 1, .max_tokens = 4, .top_p = 1, .repeat_penalty = 1,
					  .prompt = { "Hi", 2 } };
		ssize_t n = proto_encode_submit(f, sizeof f, &s);
		fd = raw_connect(d);
		send_all(fd, f, (size_t)n);
		code = read_error(fd, &closed);
		CHECK_INT_EQ(code, PROTO_E_STATE);
		CHECK(closed);
		close(fd);
	}
	still_serving(d, "bad headers, versions and states");

	/* a scribbled consumer index */
	{
		int fds[USOCK_MAX_FDS], nfds = 0;
		uint8_t f[512];
		ssize_t n;
		fd = raw_connect(d);
		hello(fd, PROTO_VERSION, 4096);
		n = usock_recv(fd, f, sizeof f, fds, USOCK_MAX_FDS, &nfds);
		CHECK(n > 0 && nfds == 2);
		if (nfds == 2) {
			uint8_t *map = mmap(NULL, RING_HDR_SIZE + 4096, PROT_READ | PROT_WRITE, MAP_SHARED,
					    fds[0], 0);
			CHECK(map != MAP_FAILED);
			struct proto_submit s = { .id = 7, .max_tokens = 200, .top_p = 1, .repeat_penalty = 1,
						  .flags = PROTO_SUBMIT_IGNORE_EOS, .prompt = { "Hello", 5 } };
			n = proto_encode_submit(f, sizeof f, &s);
			if (map != MAP_FAILED) {
				/* cons ahead of anything the producer wrote */
				__atomic_store_n((uint32_t *)(map + 128), 0x7fff0000u, __ATOMIC_RELEASE);
				send_all(fd, f, (size_t)n);
				code = read_error(fd, &closed);
				CHECK_INT_EQ(code, PROTO_E_RING);
				CHECK(closed);
				munmap(map, RING_HDR_SIZE + 4096);
			}
			close(fds[0]);
			close(fds[1]);
		}
		close(fd);
		CHECK(wait_idle(d));
	}
	still_serving(d, "a scribbled ring index");

	/* 1000 connections at once, each saying HELLO */
	{
		static int cfds[1000];
		struct rlimit rl;
		int welcomed = 0, refused = 0, n_open = 0, want = 1000;
		getrlimit(RLIMIT_NOFILE, &rl);
		if (rl.rlim_cur < 4000 && rl.rlim_max >= 4000) {
			rl.rlim_cur = 4000;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		/* The daemon holds three fds per client (socket, ring, wake channel)
		 * under the same hard limit; a machine that allows fewer gets
		 * fewer connections, and says so. */
		if (rl.rlim_max < 3200) {
			want = (int)(rl.rlim_max - 200) / 3;
			printf("1000 connections: the open-file limit is %llu: trying %d\n",
			       (unsigned long long)rl.rlim_max, want);
		}
		for (int i = want; i < 1000; i++)
			cfds[i] = -1;
		for (int i = 0; i < want; i++) {
			cfds[i] = raw_connect(d);
			if (cfds[i] >= 0) {
				hello(cfds[i], PROTO_VERSION, 4096);
				n_open++;
			}
		}
		for (int i = 0; i < 1000; i++) {
			uint8_t f[512];
			int fds[USOCK_MAX_FDS], nfds = 0;
			ssize_t n;
			struct pollfd p = { cfds[i], POLLIN, 0 };
			if (cfds[i] < 0)
				continue;
			if (poll(&p, 1, 5000) <= 0)
				continue;
			n = usock_recv(cfds[i], f, sizeof f, fds, USOCK_MAX_FDS, &nfds);
			for (int k = 0; k < nfds; k++)
				close(fds[k]);
			if (n > 0 && nfds == 2)
				welcomed++;
			else if (n > 4 && f[4] == PROTO_ERROR)
				refused++;
		}
		printf("%d connections at once: %d opened, %d welcomed, %d refused with an error\n", want,
		       n_open, welcomed, refused);
		CHECK_INT_EQ(n_open, want);
		CHECK_INT_EQ(welcomed, want); /* limits.connections_per_uid=2000 here */
		still_serving(d, "1000 connections");
		for (int i = 0; i < 1000; i++)
			if (cfds[i] >= 0)
				close(cfds[i]);
	}
	still_serving(d, "1000 connections closed");
	printf("hostile input: every bad frame got its error or its connection closed\n");
}

/* Limits, on a daemon started with small ones. */
static void test_limits(const char *model)
{
	const char *extra[] = { "--set", "limits.prompt_bytes=1000", "--set", "limits.prompt_tokens=64",
				"--set", "limits.max_tokens=400", "--set",
				"limits.requests_per_connection=2", "--set",
				"limits.connections_per_uid=3", NULL };
	struct tdaemon d;
	struct llm *h;
	struct llm_request r;
	struct gen g;
	uint64_t id[4];
	char big[2048];

	if (tdaemon_start(&d, model, extra) < 0) {
		test_failures++;
		return;
	}
	h = client(&d, 0);
	llm_request_init(&r);
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = 0;
	r.prompt = big; /* 2047 bytes > 1000 */
	r.max_tokens = 4;
	int s = llm_submit(h, &r, &id[0]);
	if (s == 0) { /* refused by the daemon, not by libllm */
		memset(&g, 0, sizeof g);
		CHECK_INT_EQ(wait_done(h, id[0], &g, 5000), 1);
		CHECK_INT_EQ(g.finish, LLM_FINISH_ERROR);
		CHECK_INT_EQ(g.error_code, PROTO_E_TOOBIG);
	} else {
		CHECK_INT_EQ(s, -EINVAL); /* libllm knows the limit from WELCOME */
	}
	big[600] = 0; /* 600 bytes of "aaaa": more than 64 tokens */
	for (int i = 0; i < 600; i += 2)
		big[i] = ' ';
	CHECK_INT_EQ(llm_submit(h, &r, &id[0]), 0);
	memset(&g, 0, sizeof g);
	CHECK_INT_EQ(wait_done(h, id[0], &g, 5000), 1);
	CHECK_INT_EQ(g.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(g.error_code, PROTO_E_TOOBIG);
	r.prompt = "Hello";
	r.max_tokens = 401;
	s = llm_submit(h, &r, &id[0]);
	if (s == 0) {
		memset(&g, 0, sizeof g);
		CHECK_INT_EQ(wait_done(h, id[0], &g, 5000), 1);
		CHECK_INT_EQ(g.error_code, PROTO_E_LIMIT);
	} else {
		CHECK_INT_EQ(s, -EINVAL);
	}
	llm_close(h);
	/* Requests in flight per connection: the third is refused (by libllm
	 * or the daemon); a raw client gets the daemon's LIMIT error.  The
	 * first two must still be in flight when the third comes: the daemon
	 * rightly admits it once one has ended, and 50 tokens of this model
	 * take about 3 ms.  So they ask for more tokens than the client's
	 * 4 KiB ring holds (a record is at least 32 bytes), and the client
	 * never reads it: they wait on the full ring until it hangs up. */
	{
		int fd = raw_connect(&d), closed, fds[USOCK_MAX_FDS], nfds = 0;
		uint8_t f[512];
		hello(fd, PROTO_VERSION, 4096);
		CHECK(usock_recv(fd, f, sizeof f, fds, USOCK_MAX_FDS, &nfds) > 0 && nfds == 2);
		for (int k = 0; k < nfds; k++)
			close(fds[k]);
		uint8_t three[3 * 512];
		size_t len = 0;
		for (uint64_t i = 1; i <= 3; i++) {
			struct proto_submit sub = { .id = i, .max_tokens = 400, .top_p = 1, .repeat_penalty = 1,
						    .flags = PROTO_SUBMIT_IGNORE_EOS, .prompt = { "Hello", 5 } };
			ssize_t n = proto_encode_submit(three + len, sizeof three - len, &sub);
			CHECK(n > 0);
			len += n > 0 ? (size_t)n : 0;
		}
		send_all(fd, three, len);
		CHECK_INT_EQ(read_error(fd, &closed), PROTO_E_LIMIT);
		CHECK(!closed);
		close(fd);
	}
	/* Connections per uid: three open, the fourth is told why and closed. */
	{
		int fds[4], closed;
		for (int i = 0; i < 3; i++) {
			fds[i] = raw_connect(&d);
			hello(fds[i], PROTO_VERSION, 4096);
		}
		tsleep_ms(200);
		fds[3] = raw_connect(&d);
		CHECK_INT_EQ(read_error(fds[3], &closed), PROTO_E_LIMIT);
		CHECK(closed);
		for (int i = 0; i < 4; i++)
			close(fds[i]);
	}
	CHECK(wait_idle(&d));
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	printf("limits: connections per uid, prompt bytes, prompt tokens, max_tokens and requests in flight refused with codes\n");
}

/* Admin commands from an unprivileged uid. */
/* A request at PRIORITY ends with exactly NOTICE as its DONE's message
 * (a prefix of it when NOTICE is not empty). */
static int priority_notice(struct llm *h, int priority, const char *notice)
{
	struct llm_request r;
	struct gen g;
	uint64_t id;

	memset(&g, 0, sizeof g);
	llm_request_init(&r);
	r.prompt = "Once upon a time";
	r.max_tokens = 2;
	r.priority = priority;
	if (llm_submit(h, &r, &id) < 0 || wait_done(h, id, &g, 30000) != 1 ||
	    g.finish == LLM_FINISH_ERROR)
		return 0;
	return *notice ? strncmp(g.message, notice, strlen(notice)) == 0 : g.message[0] == 0;
}

/* llm-client --priority 50 prints the daemon's notice on stderr, the
 * answer still on stdout. */
static int client_prints_note(const struct tdaemon *d)
{
	char bin[1024], err[1024] = "";
	int p[2], st;
	ssize_t n, got = 0;
	pid_t pid;

	snprintf(bin, sizeof bin, "%s/llm-client", tbuilddir());
	if (pipe(p) < 0)
		return 0;
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		dup2(p[1], 2);
		execl(bin, bin, "--socket", d->sock, "-n", "2", "--priority", "50", "Hello",
		      (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	while ((n = read(p[0], err + got, sizeof err - 1 - (size_t)got)) > 0)
		got += n;
	close(p[0]);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
	       strstr(err, "llm-client: note: priority 50 was clamped to 10") != NULL;
}

static void test_non_admin(const char *model)
{
	const char *extra[] = { "--set", "server.socket_mode=0666", NULL };
	struct tdaemon d;
	pid_t pid;
	int st;

	if (geteuid() != 0) {
		printf("non-admin: not root, skipped\n");
		return;
	}
	if (tdaemon_start(&d, model, extra) < 0) {
		test_failures++;
		return;
	}
	pid = fork();
	if (pid == 0) {
		struct llm *h;
		char *body = NULL;
		int bad = 0;
		if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		if (!(h = client(&d, 4096)))
			_exit(11);
		bad |= llm_admin(h, "drain", NULL, &body) != -EPERM;
		bad |= (llm_admin(h, "reload", NULL, &body) != -EPERM) << 1;
		if (llm_admin(h, "status", NULL, &body) == 0)
			free(body);
		else
			bad |= 4;
		/* a priority over limits.max_priority (10) is clamped, and said so */
		bad |= !priority_notice(h, 50, "priority 50 was clamped to 10 (limits.max_priority") << 3;
		bad |= !priority_notice(h, 10, "") << 4;
		llm_close(h);
		bad |= !client_prints_note(&d) << 5;
		_exit(bad);
	}
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st));
	CHECK_INT_EQ(WEXITSTATUS(st), 0);
	/* root may */
	struct llm *h = client(&d, 4096);
	char *body = NULL;
	json_object *js = admin_json(h, "status", NULL), *dev = NULL, *name = NULL;
	CHECK(js && json_object_object_get_ex(js, "device", &dev) &&
	      json_object_object_get_ex(dev, "name", &name));
	CHECK_STR_EQ(name ? json_object_get_string(name) : NULL, "cpu"); /* status names the device */
	json_object_put(js);
	CHECK_INT_EQ(llm_admin(h, "drain", NULL, &body), 0);
	free(body);
	body = NULL;
	CHECK_INT_EQ(llm_admin(h, "resume", NULL, &body), 0);
	free(body);
	CHECK(priority_notice(h, 50, "")); /* admins are not clamped */
	llm_close(h);
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	printf("admin: drain and reload refused for uid 65534, allowed for root; its priority 50 "
	       "clamped to 10 with a notice, root's not\n");
}

/* llm-bench's --socket workload gives the in-process tokens. */
static void test_bench_socket(const struct tdaemon *d, const char *model)
{
	static char a[65536], b[65536];
	char bin[1024];
	json_object *ja, *jb, *ra = NULL, *rb = NULL;

	snprintf(bin, sizeof bin, "%s/llm-bench", tbuilddir());
	const char *in[] = { bin, "--model", model, "--kv-type", "f32", "-p", "Once upon a time",
			     "-n", "24", "--parallel", "6", "--json", NULL };
	const char *via[] = { bin, "--socket", d->sock, "-p", "Once upon a time", "-n", "24",
			      "--parallel", "6", "--json", NULL };
	CHECK_INT_EQ(trun(in, NULL, a, sizeof a), 0);
	CHECK_INT_EQ(trun(via, NULL, b, sizeof b), 0);
	ja = json_tokener_parse(a);
	jb = json_tokener_parse(b);
	CHECK(ja && jb && json_object_object_get_ex(ja, "results", &ra) &&
	      json_object_object_get_ex(jb, "results", &rb));
	CHECK(ra && rb && json_object_array_length(ra) == 6 && json_object_array_length(rb) == 6);
	for (size_t i = 0; ra && rb && i < 6; i++) {
		json_object *ga = json_object_object_get(json_object_array_get_idx(ra, i), "generated_ids");
		json_object *gb = json_object_object_get(json_object_array_get_idx(rb, i), "generated_ids");
		CHECK_STR_EQ(json_object_to_json_string(gb), json_object_to_json_string(ga));
	}
	CHECK(jb && json_object_object_get(jb, "aggregate_tok_s"));
	/* in-process: the decode phase (after every first token) has tokens */
	json_object *tg = ja ? json_object_object_get(ja, "decode_phase_tok_s") : NULL;
	CHECK(tg && json_object_get_double(tg) > 0);
	json_object_put(ja);
	json_object_put(jb);
	/* one sequence still reports the --parallel figures (its own) */
	const char *one[] = { bin, "--model", model, "-p", "Once upon a time", "-n", "8", "--parallel", "1",
			      "--json", NULL };
	CHECK_INT_EQ(trun(one, NULL, a, sizeof a), 0);
	ja = json_tokener_parse(a);
	CHECK(ja && json_object_object_get(ja, "aggregate_tok_s") && json_object_object_get(ja, "ttft_ms_p50") &&
	      json_object_object_get(ja, "ttft_ms_p95"));
	/* one sequence's decode phase is its decode */
	json_object *dp = ja ? json_object_object_get(ja, "decode_phase_tok_s") : NULL;
	json_object *dt = ja ? json_object_object_get(ja, "decode_tok_s") : NULL;
	CHECK(dp && dt && json_object_get_double(dp) > 0 && json_object_get_double(dp) == json_object_get_double(dt));
	json_object_put(ja);
	printf("llm-bench --socket: 6 sequences through the daemon equal the in-process ones\n");
}

/* ---- the device ---- */

#ifdef HAVE_CUDA_EMU
/* ENVIRON without any CUDA_EMU_* setting, plus the NULL-terminated ADD. */
static char **emu_env(const char *const *add)
{
	static char *envp[96];
	int n = 0;

	for (char **e = environ; *e && n < 80; e++)
		if (strncmp(*e, "CUDA_EMU_", 9))
			envp[n++] = *e;
	envp[n++] = "CUDA_EMU_QUIET=1";
	for (; add && *add && n < 95; add++)
		envp[n++] = (char *)*add;
	envp[n] = NULL;
	return envp;
}
#endif

/* llmd with EXTRA and ENVP must stop at start-up, before it listens, with
 * status 1 and SAYS in its log. */
static void expect_startup_failure(const char *what, const char *model, const char *const *extra,
				   char *const *envp, const char *says)
{
	char log[8192];
	struct tdaemon d;
	int st = 0, exited = 0;

	if (tdaemon_start_with(&d, NULL, model, extra, envp, 0) < 0) {
		test_failures++;
		return;
	}
	for (double t0 = clock_s(); clock_s() - t0 < 60 && !exited; tsleep_ms(20))
		exited = waitpid(d.pid, &st, WNOHANG) == d.pid;
	CHECK(exited && WIFEXITED(st) && WEXITSTATUS(st) == 1);
	if (exited)
		d.pid = 0;
	tdaemon_read_log(&d, log, sizeof log);
	if (!strstr(log, says)) {
		fprintf(stderr, "%s: the log lacks \"%s\":\n%s\n", what, says, log);
		test_failures++;
	} else {
		const char *line = strstr(log, "llmd: cannot start the engine");
		if (!line)
			line = strstr(log, "llmd: device.backend");
		printf("%s: llmd stopped at start-up: %.*s\n", what,
		       line ? (int)strcspn(line, "\n") : 0, line ? line : "");
	}
	tdaemon_stop(&d);
}

/* The status of a running llmd as JSON (NULL on failure). */
static json_object *status_of(const struct tdaemon *d)
{
	struct llm *h = client(d, 4096);
	json_object *j = h ? admin_json(h, "status", NULL) : NULL;
	llm_close(h);
	return j;
}

static const char *jstr(json_object *j, const char *a, const char *b)
{
	json_object *o = NULL;
	if (!json_object_object_get_ex(j, a, &o))
		return NULL;
	if (b && !json_object_object_get_ex(o, b, &o))
		return NULL;
	return json_object_get_string(o);
}

/* kv.gpu_mem_fraction is a fraction in (0, 1]; kv.pool_mb 0 (automatic)
 * is the default. */
static void test_device_options(const char *model)
{
	char bin[1024], out[16384];

	snprintf(bin, sizeof bin, "%s/llmd", tbuilddir());
	const char *show[] = { bin, "--model", model, "--set", "kv.gpu_mem_fraction=0.25",
			       "--print-config", NULL };
	CHECK_INT_EQ(trun(show, NULL, out, sizeof out), 0);
	CHECK(strstr(out, "kv.gpu_mem_fraction = 0.25\n") && strstr(out, "kv.pool_mb = 0\n"));
	const char *bad[] = { bin, "--model", model, "--set", "kv.gpu_mem_fraction=1.5",
			      "--print-config", NULL };
	CHECK_INT_EQ(trun(bad, NULL, out, sizeof out), 2);
	const char *zero[] = { bin, "--model", model, "--set", "kv.gpu_mem_fraction=0",
			       "--print-config", NULL };
	CHECK_INT_EQ(trun(zero, NULL, out, sizeof out), 2);
	printf("options: kv.gpu_mem_fraction in (0, 1], kv.pool_mb automatic by default\n");
}

/* What device.backend chooses at start-up, and what it refuses. */
static void test_device_choice(const char *model)
{
	const char *cuda[] = { "--set", "device.backend=cuda", NULL };
	const char *autob[] = { "--set", "device.backend=auto", NULL };
	struct tdaemon d;
	/* auto runs on the CPU when this build's CUDA backend is the emulator,
	 * when there is none, and on a machine without a GPU */
	int auto_is_cpu = 1;
#if defined(HAVE_CUDA) && !defined(HAVE_CUDA_EMU)
	auto_is_cpu = access("/dev/nvidia0", F_OK) != 0;
#endif
	if (!auto_is_cpu) {
		printf("device.backend = auto: this machine has a GPU, skipped\n");
	} else if (tdaemon_start(&d, model, autob) < 0) {
		test_failures++;
	} else {
		json_object *j = status_of(&d);
		char log[8192];
		CHECK_STR_EQ(j ? jstr(j, "backend", NULL) : NULL, "cpu");
		json_object_put(j);
		tdaemon_read_log(&d, log, sizeof log);
		CHECK(strstr(log, "device.backend = auto: the CPU (") != NULL);
		CHECK_INT_EQ(tdaemon_stop(&d), 0);
		printf("device.backend = auto: the CPU\n");
	}
#ifdef HAVE_CUDA_EMU
	const char *cuda3[] = { "--set", "device.backend=cuda", "--set", "device.index=3", NULL };
	expect_startup_failure("device.index = 3", model, cuda3, emu_env(NULL),
			       "CUDA device 3 does not exist");
#elif !defined(HAVE_CUDA)
	expect_startup_failure("device.backend = cuda", model, cuda, NULL, "has no CUDA backend");
#else
	/* nvcc's backend: refused where the runtime sees no device */
	if (access("/dev/nvidia0", F_OK) != 0)
		expect_startup_failure("device.backend = cuda", model, cuda, NULL,
				       "no usable CUDA device");
#endif
	(void)cuda;
}

#ifdef HAVE_CUDA_EMU
/* The emulated device's memory sizes the pool, or stops llmd. */
static void test_device_memory(const char *model)
{
	const char *cuda[] = { "--set", "device.backend=cuda", NULL };
	const char *mem2[] = { "CUDA_EMU_MEM_MB=2", NULL };
	const char *mem64[] = { "CUDA_EMU_MEM_MB=64", NULL };
	const char *half[] = { "--set", "device.backend=cuda", "--set", "kv.gpu_mem_fraction=0.5",
			       NULL };
	struct tdaemon d;

	/* 2 MiB: the model (weights and step buffers for 512 rows) does not fit */
	expect_startup_failure("model over device memory", model, cuda, emu_env(mem2),
			       "a minimal KV pool");
	/* 64 MiB, half of what the model leaves for the pool */
	if (tdaemon_start_with(&d, NULL, model, half, emu_env(mem64), 1) < 0) {
		test_failures++;
		return;
	}
	json_object *j = status_of(&d);
	char log[8192];
	long long tokens = -1, mib = -1;
	int64_t total = j ? jint(j, "device", "memory_total_bytes") : -1;
	int64_t free_b = j ? jint(j, "device", "memory_free_bytes") : -1;
	CHECK_STR_EQ(j ? jstr(j, "backend", NULL) : NULL, "cuda-emu");
	CHECK_INT_EQ(total, 64 << 20);
	/* the pool took half: about as much is left free (model < 8 MiB) */
	CHECK(free_b > 0.40 * (64 << 20) && free_b < 0.50 * (64 << 20));
	tdaemon_read_log(&d, log, sizeof log);
	const char *line = strstr(log, "KV ");
	CHECK(line && sscanf(line, "KV %lld tokens in %lld MiB", &tokens, &mib) == 2);
	CHECK(llabs(mib - (free_b >> 20)) <= 1);
	CHECK_INT_EQ(tokens, j ? jint(j, "kv", "capacity_tokens") : -2);
	json_object_put(j);
	/* and it serves */
	struct llm *h = client(&d, 0);
	struct gen g;
	CHECK(h && generate(h, "Hello", 8, 0, 1, &g) == 0);
	CHECK(g.n > 0 && g.finish != LLM_FINISH_ERROR);
	llm_close(h);
	/* its decode steps were recorded once and replayed (device.graphs) */
	j = status_of(&d);
	int64_t rec = j ? jint(j, "device", "graphs_recorded") : -1;
	int64_t rep = j ? jint(j, "device", "graphs_replayed") : -1;
	json_object_put(j);
	CHECK(rec >= 1 && rep >= 1 && rec + rep <= g.n);
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	printf("kv.gpu_mem_fraction = 0.5 of a 64 MiB device: %lld tokens in %lld MiB, %lld MiB "
	       "left free; %lld decode steps recorded as graphs, %lld replayed\n", tokens, mib,
	       (long long)(free_b >> 20), (long long)rec, (long long)rep);
}

/* A device that fails mid-step: the emulator's planted fault fails the
 * first kernel of the first step. */
static void test_device_failure(const char *model)
{
	const char *extra[] = { "--set", "device.backend=cuda", "--set", "kv.pool_tokens=4096", NULL };
	const char *fault[] = { "CUDA_EMU_FAULT_LAUNCH=1", NULL };
	int st = 0;
	struct tdaemon d;
	struct llm *h;
	struct gen g;

	if (tdaemon_start_with(&d, NULL, model, extra, emu_env(fault), 1) < 0) {
		test_failures++;
		return;
	}
	h = client(&d, 0);
	CHECK(h && generate(h, "Hello", 8, 0, 1, &g) == 0);
	CHECK_INT_EQ(g.finish, LLM_FINISH_ERROR);
	CHECK_INT_EQ(g.error_code, PROTO_E_INTERNAL);
	llm_close(h);
	int exited = 0;
	for (double t0 = clock_s(); clock_s() - t0 < 20 && !exited; tsleep_ms(20))
		exited = waitpid(d.pid, &st, WNOHANG) == d.pid;
	CHECK(exited && WIFEXITED(st) && WEXITSTATUS(st) == 1);
	if (exited)
		d.pid = 0;
	else
		tdaemon_print_log(&d);
	tdaemon_stop(&d);
	printf("device failure: the request ended with an error, llmd exited with status 1\n");
}
#endif

int main(void)
{
	char model[4096];
	struct tdaemon d;

	models_dir = getenv("LLMD_MODELS_DIR") ? getenv("LLMD_MODELS_DIR") : "../shared/models";
	snprintf(model, sizeof model, "%s/stories260K.gguf", models_dir);
	if (access(model, R_OK) != 0) {
		printf("SKIP: %s is absent\n", model);
		return TEST_SKIP;
	}
	signal(SIGPIPE, SIG_IGN);
	test_golden_via_client();
	const char *extra[] = { "--set", "kv.n_ctx=512", "--set", "kv.pool_tokens=16384", "--set",
				"limits.connections_per_uid=2000", "--set", "limits.max_connections=2000",
				NULL };
	if (tdaemon_start(&d, model, extra) < 0)
		return 1;
	test_concurrent(&d);
	test_client_newline(&d);
	test_each_line(d.sock, 0);
	test_top_width(&d);
	test_bench_socket(&d, model);
	test_vanishing_client(&d);
	test_slow_reader(&d);
	test_hostile(&d);
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	if (access(test_smollm2_path(), R_OK) == 0) {
		const char *smol[] = { "--set", "kv.pool_tokens=4096", NULL };
		if (tdaemon_start(&d, test_smollm2_path(), smol) == 0) {
			test_each_line(d.sock, 1);
			CHECK_INT_EQ(tdaemon_stop(&d), 0);
		} else {
			test_failures++;
		}
		test_chat_template_file(test_smollm2_path());
	} else {
		printf("llm-client --each-line with a chat template: no SmolLM2, skipped\n");
	}
	test_limits(model);
	test_non_admin(model);
	test_device_options(model);
	test_device_choice(model);
#ifdef HAVE_CUDA_EMU
	test_device_memory(model);
	test_device_failure(model);
#else
	printf("device memory and failure: this build's CUDA backend is not the emulator, skipped\n");
#endif
	return test_result();
}
