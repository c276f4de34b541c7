/* test_model_file.c - the real llmd serving a model file that changes under
 * it (a copy of stories260K in a temporary directory).  It pins:
 *  - mapped (model.mmap on, the default), the file truncated or overwritten
 *    with a few other bytes (as `cp` over it does): the next request makes
 *    llmd exit with status 3, not die of SIGBUS, after a log line that
 *    names the file and says what to do;
 *  - with model.mmap = false, the same changes leave it serving: the next
 *    requests get the tokens they got before, and it stops with status 0;
 *  - on the (emulated) CUDA backend the host's weights are released once
 *    uploaded (llmd maps only the file's header pages then): mapped, the
 *    file may change and llmd keeps serving.
 * Exits 77 (skip) without ../shared/models.
 */
#include <config.h>

#include "daemonutil.h"
#include "llm.h"

#define N_GEN 12

static const char prompt[] = "Once upon a time";

/* Greedy N_GEN tokens of PROMPT from D into IDS: the count, or -1 when the
 * request failed (the connection dropped, an error record). */
static int generate(const struct tdaemon *d, int32_t ids[N_GEN])
{
	struct llm_request r;
	struct llm_event ev;
	struct llm *h = NULL;
	char err[256];
	uint64_t id;
	int n = 0, done = 0;

	if (llm_connect(d->sock, 0, &h, err, sizeof err) < 0)
		return -1;
	llm_request_init(&r);
	r.prompt = prompt;
	r.max_tokens = N_GEN;
	r.temperature = 0;
	if (llm_submit(h, &r, &id) < 0) {
		llm_close(h);
		return -1;
	}
	for (double t0 = clock_s(); !done && clock_s() - t0 < 60;) {
		int k = llm_next_event(h, &ev, 200);
		if (k < 0)
			break;
		if (k == 0 || ev.id != id)
			continue;
		if (ev.kind == LLM_EV_TOKEN && ev.token >= 0 && n < N_GEN)
			ids[n++] = ev.token;
		else if (ev.kind != LLM_EV_TOKEN)
			done = ev.finish == LLM_FINISH_ERROR ? -1 : 1;
	}
	llm_close(h);
	return done == 1 ? n : -1;
}

/* Bytes of PID's mappings of PATH (/proc/PID/maps), or -1. */
static long long mapped_bytes(pid_t pid, const char *path)
{
	char name[64], line[1024];
	long long sum = 0;
	FILE *f;

	snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
	if (!(f = fopen(name, "re")))
		return -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long long lo, hi;
		const char *p = strchr(line, '/');
		size_t n = strlen(path);
		if (p && !strncmp(p, path, n) && (p[n] == '\n' || p[n] == ' ') &&
		    sscanf(line, "%llx-%llx", &lo, &hi) == 2)
			sum += (long long)(hi - lo);
	}
	fclose(f);
	return sum;
}

/* The file changes under the model. */
enum change { CUT, OVERWRITE };

static void change_file(const char *path, enum change how)
{
	static const char junk[] = "GGUF\3\0\0\0 these are not the bytes you loaded\n";
	int fd;

	if (how == CUT) {
		CHECK_INT_EQ(truncate(path, 0), 0);
		return;
	}
	/* what cp does to an existing file: truncate, then write */
	fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write(fd, junk, sizeof junk - 1) == (ssize_t)(sizeof junk - 1));
	close(fd);
}

static const char *change_name(enum change how)
{
	return how == CUT ? "truncated" : "overwritten";
}

/* Mapped: a request after the change ends llmd with status 3 and the log
 * line; no core-dumping death by SIGBUS. */
static void test_mapped(const char *model, enum change how)
{
	struct tdaemon d;
	char copy[64], log[16384];
	int32_t ids[N_GEN];
	int st = 0, exited = 0;

	CHECK_INT_EQ(test_copy_to_tmp(model, copy, sizeof copy), 0);
	if (tdaemon_start(&d, copy, NULL) < 0) {
		test_failures++;
		unlink(copy);
		return;
	}
	CHECK_INT_EQ(generate(&d, ids), N_GEN);
	CHECK(mapped_bytes(d.pid, copy) >= test_file_size(copy)); /* the whole file */
	change_file(copy, how);
	CHECK_INT_EQ(generate(&d, ids), -1);
	for (double t0 = clock_s(); clock_s() - t0 < 30 && !exited; tsleep_ms(20))
		exited = waitpid(d.pid, &st, WNOHANG) == d.pid;
	CHECK(exited);
	if (!exited) {
		tdaemon_stop(&d);
		unlink(copy);
		return;
	}
	d.pid = 0;
	CHECK(WIFEXITED(st));
	CHECK(!WIFSIGNALED(st));
	CHECK_INT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 3);
	tdaemon_read_log(&d, log, sizeof log);
	const char *line = strstr(log, "the model file ");
	CHECK(line != NULL);
	CHECK(line && strstr(line, copy) && strstr(line, "changed on disk while llmd served it") &&
	      strstr(line, "model.mmap = false") && strstr(line, "rename"));
	if (test_failures)
		tdaemon_print_log(&d);
	tdaemon_stop(&d); /* only removes its directory now */
	unlink(copy);
	printf("mapped, file %s: llmd exits with status 3 and says why\n", change_name(how));
}

/* model.mmap = false: the changes change nothing. */
static void test_private(const char *model)
{
	const char *extra[] = { "--set", "model.mmap=false", NULL };
	int32_t before[N_GEN], after[N_GEN];
	struct tdaemon d;
	char copy[64];

	CHECK_INT_EQ(test_copy_to_tmp(model, copy, sizeof copy), 0);
	if (tdaemon_start(&d, copy, extra) < 0) {
		test_failures++;
		unlink(copy);
		return;
	}
	CHECK_INT_EQ(generate(&d, before), N_GEN);
	CHECK_INT_EQ(mapped_bytes(d.pid, copy), 0); /* read, not mapped */
	change_file(copy, CUT);
	CHECK_INT_EQ(generate(&d, after), N_GEN);
	CHECK(memcmp(before, after, sizeof before) == 0);
	change_file(copy, OVERWRITE);
	memset(after, 0, sizeof after);
	CHECK_INT_EQ(generate(&d, after), N_GEN);
	CHECK(memcmp(before, after, sizeof before) == 0);
	CHECK_INT_EQ(generate(&d, after), N_GEN); /* and again: it keeps serving */
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	unlink(copy);
	printf("model.mmap = false: the same tokens after the file was truncated and overwritten\n");
}

#ifdef HAVE_CUDA_EMU
/* The emulated CUDA backend, mapped: after the upload the host's weights
 * are released, so the file's changes are harmless. */
static void test_device_released(const char *model)
{
	const char *extra[] = { "--set", "device.backend=cuda", "--set", "kv.pool_tokens=1024", NULL };
	char *envp[96], copy[64], log[16384];
	int32_t before[N_GEN], after[N_GEN];
	struct tdaemon d;
	int n = 0;

	for (char **e = environ; *e && n < 90; e++)
		if (strncmp(*e, "CUDA_EMU_", 9))
			envp[n++] = *e;
	envp[n++] = "CUDA_EMU_QUIET=1";
	envp[n] = NULL;
	CHECK_INT_EQ(test_copy_to_tmp(model, copy, sizeof copy), 0);
	if (tdaemon_start_with(&d, NULL, copy, extra, envp, 1) < 0) {
		test_failures++;
		unlink(copy);
		return;
	}
	tdaemon_read_log(&d, log, sizeof log);
	CHECK(strstr(log, "the weights are in device memory: released the host's copy of ") != NULL);
	/* the file maps only the header's pages (stories260K's is 14176 bytes) */
	long long mapped = mapped_bytes(d.pid, copy);
	CHECK(mapped > 0 && mapped <= 16384);
	CHECK_INT_EQ(generate(&d, before), N_GEN);
	change_file(copy, CUT);
	CHECK_INT_EQ(generate(&d, after), N_GEN);
	CHECK(memcmp(before, after, sizeof before) == 0);
	change_file(copy, OVERWRITE);
	CHECK_INT_EQ(generate(&d, after), N_GEN);
	CHECK(memcmp(before, after, sizeof before) == 0);
	CHECK_INT_EQ(tdaemon_stop(&d), 0);
	unlink(copy);
	printf("cuda-emu, mapped: weights released after the upload, the file changed harmlessly\n");
}
#endif

int main(void)
{
	const char *model = test_model_path("stories260K.gguf");

	if (!model) {
		printf("SKIP: stories260K.gguf is absent\n");
		return TEST_SKIP;
	}
	signal(SIGPIPE, SIG_IGN);
	test_mapped(model, CUT);
	test_mapped(model, OVERWRITE);
	test_private(model);
#ifdef HAVE_CUDA_EMU
	test_device_released(model);
#endif
	return test_result();
}
