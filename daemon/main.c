/* main.c - llmd's entry point: options and config, loading the model,
 * starting the engine thread, the socket (systemd's or our own), sd_notify
 * (READY, STATUS, WATCHDOG, RELOADING, STOPPING), signals and the orderly
 * shutdown with a grace period.  The event loop itself is server.c's.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <syslog.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <config.h>

#include "admin.h"
#include "clock.h"
#include "conf.h"
#include "constrain.h"
#include "conn.h"
#include "engine.h"
#include "http.h"
#include "kv_pool.h"
#include "llmd.h"
#include "log.h"
#include "model.h"
#include "models.h"
#include "quant.h"
#include "sched.h"
#include "server.h"
#include "usock.h"
#include "worker.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: llmd [OPTIONS]\n"
		"The local LLM inference daemon: one model, a paged KV pool and a\n"
		"continuous-batching loop shared by every client of its Unix socket.\n\n"
		"  -c, --config PATH      config file (default " LLMD_DEFAULT_CONFIG " if it exists)\n"
		"  -m, --model PATH       GGUF model (model.path)\n"
		"  -S, --socket PATH      socket to bind when not socket-activated (server.socket)\n"
		"  -t, --threads N        CPU threads (device.threads; 0 = every core)\n"
		"      --kv-mib N         KV pool size in MiB (kv.pool_mb)\n"
		"      --kv-type T        f16, f32 or q8_0 (kv.type)\n"
		"      --set S.K=V        any config option, e.g. --set limits.max_tokens=512\n"
		"  -f, --foreground       stay in the foreground (llmd never forks; accepted for scripts)\n"
		"      --print-config     print the settings in force and exit\n"
		"  -h, --help             this help\n"
		"      --version          print the version\n\n"
		"Signals: SIGTERM/SIGINT stop (in-flight requests get server.grace_s seconds),\n"
		"SIGHUP reloads the config's limits.  See llmd(8) and llmd.conf(5).\n");
}

/* ---- signals and timers ---- */

static void begin_stop(struct llmd *d, const char *why)
{
	if (d->stopping)
		return;
	d->stopping = 1;
	d->draining = 1;
	d->t_stop = clock_s();
	sd_notify(0, "STOPPING=1\nSTATUS=stopping: finishing in-flight requests");
	log_msg(LOG_INFO, "%s: stopping, %lld requests in flight, grace %d s", why,
		 (long long)conn_live_total(d), d->cfg.grace_s);
	server_stop_listening(d);
	http_stop_listening(d);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct llmd *d = arg;
	(void)what;

	if (sig == SIGHUP) {
		char msg[512];
		char buf[128];
		snprintf(buf, sizeof buf, "RELOADING=1\nMONOTONIC_USEC=%llu",
			 (unsigned long long)clock_us());
		sd_notify(0, buf);
		if (admin_reload(d, msg, sizeof msg) < 0)
			log_msg(LOG_ERR, "reload failed, keeping the old settings: %s", msg);
		else
			log_msg(LOG_INFO, "reloaded: %s", msg);
		sd_notify(0, "READY=1");
		return;
	}
	begin_stop(d, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* Ten times a second: the watchdog, connection timeouts and the shutdown's
 * progress. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct llmd *d = arg;
	double t = clock_s();
	(void)fd;
	(void)what;

	/* Proof of life needs both threads: the engine thread beats at least
	 * once a second, even when idle. */
	if (d->watchdog_usec && t - d->t_watchdog >= d->watchdog_usec / 2e6 &&
	    t - worker_heartbeat(d->worker) < d->watchdog_usec / 1e6) {
		sd_notify(0, "WATCHDOG=1");
		d->t_watchdog = t;
	}
	server_tick(d, t);
	if (!d->stopping)
		models_tick(d, t);
	if (d->fatal && !d->stopping) {
		/* Nothing can run any more: what is in flight already has its
		 * error record; leave as soon as it is written. */
		begin_stop(d, "engine failure");
		sd_notify(0, "STATUS=the engine failed; exiting so that llmd is restarted");
		d->t_stop -= d->cfg.grace_s; /* no grace: nothing would finish */
	}
	if (!d->stopping)
		return;
	if (conn_live_total(d) == 0) {
		event_base_loopbreak(d->base);
		return;
	}
	if (!d->cancelled_all && t - d->t_stop >= d->cfg.grace_s) {
		log_msg(LOG_WARNING, "grace period over: cancelling %lld requests",
			 (long long)conn_live_total(d));
		worker_cancel_all(d->worker);
		d->cancelled_all = 1;
	}
	if (d->cancelled_all && t - d->t_stop >= d->cfg.grace_s + 5.0) {
		log_msg(LOG_WARNING, "requests still live 5 s after cancelling them: leaving anyway");
		event_base_loopbreak(d->base);
	}
}

/* ---- the model file changing underneath (SIGBUS) ----
 *
 * With model.mmap on, the weights are read from a mapping of the model file
 * for as long as llmd serves: a file truncated under it (`cp new.gguf
 * model.gguf` truncates first) makes the next read of a page past the new
 * end raise SIGBUS, in whichever thread reads it (the engine thread, a CPU
 * worker).  (A rewrite that does not shrink it goes unnoticed: the mapping
 * then reads the new bytes.)  This handler, process-wide, turns that into one log line naming
 * the file and an exit that systemd restarts (Restart=on-failure), instead
 * of a core dump with no word of why.  Any other SIGBUS keeps its default
 * action.  Only async-signal-safe calls: write(2), _exit, sigaction, raise.
 */

#define LLMD_EXIT_MODEL_CHANGED 3

static _Atomic uintptr_t sigbus_lo, sigbus_hi; /* the model file's mapping: [lo, hi) */
static char sigbus_msg[1536];                   /* the log line, written before the
                                                   range is set; read-only after */
static size_t sigbus_msg_len;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	struct sigaction dfl;
	(void)uctx;

	if (si->si_code > 0 && a >= atomic_load_explicit(&sigbus_lo, memory_order_relaxed) &&
	    a < atomic_load_explicit(&sigbus_hi, memory_order_relaxed)) {
		for (size_t off = 0; off < sigbus_msg_len;) {
			ssize_t n = write(STDERR_FILENO, sigbus_msg + off, sigbus_msg_len - off);
			if (n <= 0)
				break;
			off += (size_t)n;
		}
		_exit(LLMD_EXIT_MODEL_CHANGED);
	}
	/* Not ours: the default action, as if there were no handler (a fault
	 * repeats when the handler returns; a SIGBUS sent is raised again). */
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

/* Points the SIGBUS handler at M's file mapping (none when the file was
 * read into private memory), installing it the first time, and again
 * after the mapping shrank (model_release_weights).  Main thread, before
 * the engine thread starts: the CPU backend's workers and engine_new may
 * already read the mapping, so the handler is in place before either. */
static void sigbus_watch(const struct model *m)
{
	const void *addr = NULL;
	size_t n = model_file_mapping(m, &addr);
	int len;

	if (!sigbus_msg_len) {
		struct sigaction sa;

		len = snprintf(sigbus_msg, sizeof sigbus_msg,
			       "%sthe model file %s changed on disk while llmd served it (it was "
			       "truncated, as cp over it does; its mapping can no longer be read): exiting. "
			       "Replace model files atomically (write a new file, then rename it over "
			       "the old one) and restart llmd, or set model.mmap = false\n",
			       log_prefix(LOG_CRIT), m->path);
		sigbus_msg_len = len < 0 ? 0 : (size_t)len < sizeof sigbus_msg ? (size_t)len
										: sizeof sigbus_msg - 1;
		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = on_sigbus;
		sa.sa_flags = SA_SIGINFO;
		sigemptyset(&sa.sa_mask);
		sigaction(SIGBUS, &sa, NULL);
	}
	atomic_store(&sigbus_lo, n ? (uintptr_t)addr : 0);
	atomic_store(&sigbus_hi, n ? (uintptr_t)addr + n : 0);
}

/* ---- setup ---- */

static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* Gives the socket file PATH to GROUP ("" leaves it ours).  0 or -EPERM
 * with a message. */
static int give_group(const char *path, const char *group, char *err, size_t errlen)
{
	struct group gr, *res = NULL;
	char buf[4096];

	if (!group[0])
		return 0;
	if (getgrnam_r(group, &gr, buf, sizeof buf, &res) != 0 || !res ||
	    chown(path, (uid_t)-1, gr.gr_gid) < 0) {
		snprintf(err, errlen, "cannot give %s to group %s", path, group);
		return -EPERM;
	}
	return 0;
}

/* A socket systemd passed: listening, Unix, stream; made non-blocking. */
static int activated_fd(int fd, const char *name, char *err, size_t errlen)
{
	if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
		snprintf(err, errlen, "the socket systemd passed (%s) is not a listening Unix stream socket",
			 name);
		return -EINVAL;
	}
	if (evutil_make_socket_nonblocking(fd) < 0 || evutil_make_socket_closeonexec(fd) < 0) {
		snprintf(err, errlen, "cannot make the activated socket (%s) non-blocking", name);
		return -EIO;
	}
	return fd;
}

/* The listening sockets: systemd's (socket activation: the native one, and
 * the HTTP front's when its fd is named "http", FileDescriptorName=http) or
 * the ones we bind.  Returns the native fd, the HTTP front's in *HTTP_FD
 * (-1: none). */
static int open_sockets(struct llmd *d, int *http_fd, char *err, size_t errlen)
{
	char **names = NULL, http_path[108];
	int n = sd_listen_fds_with_names(1, &names), fd = -1, r = 0;

	*http_fd = -1;
	for (int i = 0; i < n && r >= 0; i++) {
		const char *name = names && names[i] ? names[i] : "unnamed";
		int is_http = !strcmp(name, "http");
		if ((is_http && *http_fd >= 0) || (!is_http && fd >= 0)) {
			snprintf(err, errlen, "systemd passed %d sockets; llmd takes one, and one named "
				 "\"http\" (FileDescriptorName=http) for the HTTP front", n);
			r = -EINVAL;
		} else if ((r = activated_fd(SD_LISTEN_FDS_START + i, name, err, errlen)) >= 0) {
			*(is_http ? http_fd : &fd) = r;
		}
	}
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	if (r < 0)
		return r;
	if (n > 0 && fd < 0) {
		snprintf(err, errlen, "systemd passed only the HTTP front's socket");
		return -EINVAL;
	}
	if (fd >= 0) {
		d->socket_activated = 1;
	} else {
		fd = usock_listen(d->cfg.socket_path, d->cfg.socket_mode, 512, err, errlen);
		if (fd < 0)
			return fd;
		snprintf(d->socket_path, sizeof d->socket_path, "%s", d->cfg.socket_path);
		if ((r = give_group(d->cfg.socket_path, d->cfg.socket_group, err, errlen)) < 0) {
			close(fd);
			unlink(d->cfg.socket_path);
			d->socket_path[0] = 0;
			return r;
		}
	}
	/* The HTTP front's, when systemd did not pass it: "auto" only where we
	 * bound the native one too. */
	http_socket_path(&d->cfg, http_path, sizeof http_path);
	if (*http_fd >= 0 || !http_path[0] || (d->socket_activated && !strcmp(d->cfg.http_socket, "auto")))
		return fd;
	*http_fd = usock_listen(http_path, d->cfg.socket_mode, 512, err, errlen);
	if (*http_fd < 0 || (r = give_group(http_path, d->cfg.socket_group, err, errlen)) < 0) {
		if (*http_fd >= 0) {
			close(*http_fd);
			unlink(http_path);
		}
		*http_fd = -1;
		if (!strcmp(d->cfg.http_socket, "auto")) {
			/* the default: the native socket serves on without it */
			log_msg(LOG_WARNING, "no HTTP front: %s: %s (set http.socket, or off)", http_path, err);
			return fd;
		}
		if (d->socket_path[0])
			unlink(d->socket_path);
		d->socket_path[0] = 0;
		close(fd);
		snprintf(err + strlen(err), errlen - strlen(err), " (http.socket)");
		return r < 0 ? r : -EADDRINUSE;
	}
	snprintf(d->http_socket_path, sizeof d->http_socket_path, "%s", http_path);
	return fd;
}

/* model.chat_template: the operator's Jinja file in place of the model's
 * own template (which must compile); without it, says what the model's
 * own template came to when that is not its Jinja source.  Returns 0 or a
 * negative errno with the reason in ERR. */
static int load_chat_template(struct llmd *d, char *err, size_t errlen)
{
	const char *path = d->cfg.chat_template;
	int r;

	if (!path[0]) {
		if (d->model->chat_note[0])
			log_msg(d->model->chat.kind ? LOG_WARNING : LOG_NOTICE, "%s: chat: %s", d->cfg.model_path,
				d->model->chat_note);
		return 0;
	}
	r = models_read_chat_template(d->model, path, err, errlen);
	if (r == 0)
		log_msg(LOG_INFO, "chat template from %s", path);
	return r;
}

static int engine_settings(const struct llmd *d, struct engine_params *ep, struct sched_params *sp,
			   char *err, size_t errlen)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	engine_params_default(ep);
	ep->n_threads = d->cfg.threads ? d->cfg.threads : (int32_t)(cores > 0 ? cores : 1);
	if (ep->n_threads > 256)
		ep->n_threads = 256; /* the worker pool's most */
	ep->kv_type = !strcmp(d->cfg.kv_type, "f32") ? QT_F32
		      : !strcmp(d->cfg.kv_type, "q8_0") ? QT_Q8_0 : QT_F16;
	ep->kv_block_tokens = d->cfg.block_tokens;
	ep->kv_tokens = d->cfg.pool_tokens;
	ep->kv_mib = d->cfg.pool_mb; /* both 0: automatic (engine_new) */
	ep->kv_gpu_fraction = d->cfg.gpu_mem_fraction;
	ep->n_ctx = d->cfg.n_ctx;
	ep->max_batch = d->cfg.max_batched_tokens;
	sched_params_default(sp);
	sp->max_seqs = d->cfg.max_seqs;
	sp->max_batched_tokens = d->cfg.max_batched_tokens;
	sp->max_queue = d->cfg.max_queue;
	sp->prefix_cache = d->cfg.prefix_cache;
	sp->step_ms = d->cfg.step_ms;
	sp->spec_mode = !strcmp(d->cfg.spec_mode, "ngram") ? SCHED_SPEC_NGRAM :
			!strcmp(d->cfg.spec_mode, "draft") ? SCHED_SPEC_DRAFT : SCHED_SPEC_OFF;
	sp->spec_max_draft = d->cfg.spec_max_draft;
	sp->spec_min_match = d->cfg.spec_min_match;
	/* auto is a GPU when this llmd links nvcc's CUDA backend and the CUDA
	 * runtime sees device.index; the emulated backend (--enable-cuda-emu)
	 * is for tests and runs only when named. */
	struct engine_cuda_probe probe;
	char why[512];
	int r;
	engine_cuda_probe(&probe);
	ep->device = d->cfg.device_index;
	ep->graphs = d->cfg.graphs;
	ep->gemm_rows = d->cfg.gemm_rows;
	/* llmd.conf's [cuda]; LLMD_CUDA_* variables, for experiments, over it */
	ep->cuda = d->cfg.cuda;
	cuda_tuning_from_env(&ep->cuda);
	r = engine_choose_backend(d->cfg.backend, ep->device, &probe, &ep->backend, why, sizeof why);
	if (r < 0) {
		snprintf(err, errlen, "device.backend = %s: %s", d->cfg.backend, why);
		return r;
	}
	log_msg(LOG_INFO, "device.backend = %s: %s", d->cfg.backend, why);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "model", required_argument, NULL, 'm' },
		{ "socket", required_argument, NULL, 'S' },
		{ "threads", required_argument, NULL, 't' },
		{ "kv-mib", required_argument, NULL, 1 },
		{ "kv-type", required_argument, NULL, 2 },
		{ "set", required_argument, NULL, 3 },
		{ "foreground", no_argument, NULL, 'f' },
		{ "print-config", no_argument, NULL, 4 },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 5 },
		{ NULL, 0, NULL, 0 },
	};
	static struct llmd D; /* the daemon's state (see llmd.h) */
	struct llmd *d = &D;
	struct engine_params ep;
	struct sched_params sp;
	char err[1024], buf[1400];
	const char *config = NULL;
	int print_config = 0, opt, fd, http_fd = -1, rc = 1;
	int sigs[4] = { SIGTERM, SIGINT, SIGHUP, SIGPIPE };

	log_init();
	d->listen_fd = -1;
	d->t_start = clock_s();
	d->overrides = calloc((size_t)argc + 1, sizeof *d->overrides);
	if (!d->overrides)
		return 1;
	/* Pass 1: the config file; pass 2 (below): overrides on top of it. */
	while ((opt = getopt_long(argc, argv, "c:m:S:t:fh", lopts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			config = optarg;
			break;
		case 'm': case 'S': case 't': case 1: case 2: case 3: case 'f':
			break;
		case 4:
			print_config = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 5:
			printf("llmd %s (wire protocol %d)\n", PACKAGE_VERSION, PROTO_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "llmd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	conf_default(&d->cfg);
	if (!config && access(LLMD_DEFAULT_CONFIG, F_OK) == 0)
		config = LLMD_DEFAULT_CONFIG;
	if (config) {
		if (conf_load(&d->cfg, config, err, sizeof err) < 0) {
			log_msg(LOG_ERR, "%s", err);
			return 2;
		}
		snprintf(d->config_path, sizeof d->config_path, "%s", config);
	}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "c:m:S:t:fh", lopts, NULL)) != -1) {
		const char *key = NULL;
		switch (opt) {
		case 'm': key = "model.path"; break;
		case 'S': key = "server.socket"; break;
		case 't': key = "device.threads"; break;
		case 1: key = "kv.pool_mb"; break;
		case 2: key = "kv.type"; break;
		case 3: key = ""; break;
		default: break;
		}
		if (!key)
			continue;
		if (*key)
			snprintf(buf, sizeof buf, "%s=%s", key, optarg);
		else
			snprintf(buf, sizeof buf, "%s", optarg);
		if (conf_set(&d->cfg, buf, err, sizeof err) < 0) {
			log_msg(LOG_ERR, "%s", err);
			return 2;
		}
		d->overrides[d->n_overrides++] = strdup(buf);
	}
	if (print_config) {
		conf_print(&d->cfg, stdout);
		return 0;
	}
	if (conf_check(&d->cfg, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "%s", err);
		return 2;
	}
	admin_resolve_group(d);
	raise_nofile();
	signal(SIGPIPE, SIG_IGN);

	/* Settings first: a bad one should not cost a model load. */
	if (engine_settings(d, &ep, &sp, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "%s", err);
		goto out;
	}
	/* The model and the engine thread. */
	sd_notifyf(0, "STATUS=loading model %s", d->cfg.model_path);
	log_msg(LOG_INFO, "loading %s", d->cfg.model_path);
	if (model_load_flags(d->cfg.model_path, d->cfg.model_mmap ? 0 : MODEL_LOAD_NO_MMAP,
			     &d->model, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "cannot load model %s: %s", d->cfg.model_path, err);
		sd_notifyf(0, "STATUS=cannot load the model: %s", err);
		goto out;
	}
	if (load_chat_template(d, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "model.chat_template %s: %s", d->cfg.chat_template, err);
		sd_notifyf(0, "STATUS=cannot use the chat template: %s", err);
		goto out;
	}
	sigbus_watch(d->model);
	if (constrain_new(d->model->tok, &d->constrain) < 0) {
		log_msg(LOG_ERR, "out of memory");
		goto out;
	}
	if (worker_new(d->model, &ep, &sp, &d->worker, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "cannot start the engine for %s: %s", d->cfg.model_path, err);
		goto out;
	}
	if (d->cfg.spec_draft_model[0]) {
		log_msg(LOG_INFO, "loading the draft model %s", d->cfg.spec_draft_model);
		if (model_load_flags(d->cfg.spec_draft_model, d->cfg.model_mmap ? 0 : MODEL_LOAD_NO_MMAP,
				     &d->draft_model, err, sizeof err) < 0 ||
		    worker_set_draft(d->worker, d->draft_model, &ep, err, sizeof err) < 0) {
			log_msg(LOG_ERR, "spec.draft_model %s: %s", d->cfg.spec_draft_model, err);
			sd_notifyf(0, "STATUS=cannot use the draft model: %s", err);
			goto out;
		}
	}
	/* Weights on a device: the host's bytes are not read again, so the
	 * file may change from now on (not yet a running engine thread). */
	if (!engine_reads_model_weights(worker_engine(d->worker))) {
		if (model_release_weights(d->model, err, sizeof err) < 0)
			log_msg(LOG_WARNING, "%s: %s", d->cfg.model_path, err);
		else
			log_msg(LOG_INFO, "the weights are in device memory: released the host's "
				 "copy of %s's tensor data", d->cfg.model_path);
		sigbus_watch(d->model);
	}
	d->models[0].model = d->model;
	d->models[0].constrain = d->constrain;
	d->models[0].draft = d->draft_model; /* borrowed: freed as d->draft_model */
	d->models[0].index = 0;
	if (d->cfg.model_name[0])
		snprintf(d->models[0].name, sizeof d->models[0].name, "%.64s", d->cfg.model_name);
	else
		conf_model_name_of(d->cfg.model_path, d->models[0].name, sizeof d->models[0].name);
	d->n_models = 1;
	d->ep = &ep;
	d->sp = &sp;
	d->backend = engine_backend_name(worker_engine(d->worker));
	d->n_threads = ep.n_threads;

	/* The event loop and the socket. */
	if (evthread_use_pthreads() < 0 || !(d->base = event_base_new())) {
		log_msg(LOG_ERR, "cannot create the event loop");
		goto out;
	}
	/* The other models: their files read, pinned ones loaded. */
	if (models_start(d, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "%s", err);
		sd_notifyf(0, "STATUS=%s", err);
		goto out;
	}
	fd = open_sockets(d, &http_fd, err, sizeof err);
	if (fd < 0) {
		log_msg(LOG_ERR, "cannot listen on %s: %s", d->cfg.socket_path, err);
		goto out;
	}
	if (server_start(d, fd) < 0 || worker_start(d->worker) < 0) {
		close(fd);
		if (http_fd >= 0)
			close(http_fd);
		log_msg(LOG_ERR, "cannot start serving: out of memory");
		goto out;
	}
	if ((http_fd >= 0 || d->cfg.http_listen[0]) && http_start(d, http_fd, err, sizeof err) < 0) {
		log_msg(LOG_ERR, "cannot start the HTTP front: %s", err);
		goto out;
	}
	for (int i = 0; i < 4; i++) {
		if (sigs[i] == SIGPIPE)
			continue;
		d->ev_sig[i] = evsignal_new(d->base, sigs[i], on_signal, d);
		if (!d->ev_sig[i] || event_add(d->ev_sig[i], NULL) < 0) {
			log_msg(LOG_ERR, "cannot watch signals");
			goto out;
		}
	}
	if (sd_watchdog_enabled(0, &d->watchdog_usec) <= 0)
		d->watchdog_usec = 0;
	d->ev_tick = event_new(d->base, -1, EV_PERSIST, on_tick, d);
	struct timeval tick = { 0, 100000 };
	if (!d->ev_tick || event_add(d->ev_tick, &tick) < 0)
		goto out;

	log_msg(LOG_INFO, "serving %s (%s, %d threads, KV %lld tokens in %llu MiB) on %s",
		 d->model->name, d->backend, d->n_threads,
		 (long long)engine_kv_capacity(worker_engine(d->worker)),
		 (unsigned long long)(engine_kv_pool(worker_engine(d->worker))->bytes >> 20),
		 d->socket_activated ? "the socket systemd passed" : d->cfg.socket_path);
	sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s", d->model->name,
		   d->socket_activated ? "the activated socket" : d->cfg.socket_path);
	event_base_dispatch(d->base);
	rc = d->fatal ? 1 : 0;
	log_msg(LOG_INFO, "stopped");
out:
	http_stop(d);
	server_stop_listening(d);
	server_close_all(d);
	models_stop(d);
	worker_free(d->worker);
	for (int i = 0; i < d->n_models; i++) /* after every request that used them */
		constrain_free(d->models[i].constrain);
	if (!d->n_models)
		constrain_free(d->constrain);
	for (int i = 0; i < 4; i++)
		if (d->ev_sig[i])
			event_free(d->ev_sig[i]);
	if (d->ev_tick)
		event_free(d->ev_tick);
	if (d->base)
		event_base_free(d->base);
	for (int i = 1; i < d->n_models; i++) {
		model_free(d->models[i].model);
		model_free(d->models[i].draft);
	}
	model_free(d->model);
	model_free(d->draft_model);
	for (int i = 0; i < d->n_overrides; i++)
		free(d->overrides[i]);
	free(d->overrides);
	return rc;
}
