/* models.c - loading models on demand, unloading idle ones, one memory
 * budget for them all (models.h says what each call does).
 *
 * A model is loaded by a thread of its own (the engine and its KV pool can
 * take seconds to make, and the event loop must not wait), which hands its
 * result back with event_active; the event loop then installs it in the
 * worker, where the requests that came meanwhile waited.  Unloading is the
 * worker's to do (it frees the engine when nothing runs on it) and comes
 * back as a note.  The budget counts a loaded model's weights and KV pool
 * (the pool's real size once loaded, the one expected before).
 */
#include "models.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "clock.h"
#include "constrain.h"
#include "engine.h"
#include "kv_pool.h"
#include "log.h"
#include "model.h"
#include "proto.h"
#include "sched.h"
#include "worker.h"

#define MIB (1024.0 * 1024.0)

const char *models_state_name(enum llmd_model_state s)
{
	switch (s) {
	case LLMD_MODEL_UNLOADED:
		return "unloaded";
	case LLMD_MODEL_LOADING:
		return "loading";
	case LLMD_MODEL_READY:
		return "ready";
	case LLMD_MODEL_UNLOADING:
		return "unloading";
	case LLMD_MODEL_FAILED:
		return "failed";
	}
	return "?";
}

struct llmd_model *llmd_model_find(struct llmd *d, const char *name, size_t len)
{
	if (!name || !len)
		return d->n_models > 0 ? &d->models[0] : NULL;
	for (int i = 0; i < d->n_models; i++)
		if (strlen(d->models[i].name) == len && !memcmp(d->models[i].name, name, len))
			return &d->models[i];
	return NULL;
}

static uint64_t model_bytes(const struct llmd_model *lm)
{
	return lm->weight_bytes + lm->kv_bytes;
}

uint64_t models_bytes_in_use(const struct llmd *d)
{
	uint64_t n = 0;

	for (int i = 0; i < d->n_models; i++)
		if (d->models[i].state == LLMD_MODEL_LOADING || d->models[i].state == LLMD_MODEL_READY ||
		    d->models[i].state == LLMD_MODEL_UNLOADING)
			n += model_bytes(&d->models[i]);
	return n;
}

/* Requests LM has in the worker (running, queued or waiting for it to be
 * loaded), as of the last snapshot. */
static int32_t live_of(struct llmd *d, const struct llmd_model *lm)
{
	struct worker_snapshot *sn = worker_snapshot_get(d->worker);
	int32_t n = sn && lm->index < sn->n_models ? sn->models[lm->index].live : 0;

	worker_snapshot_put(sn);
	return n;
}

/* ---- loading ---- */

struct load_job {
	struct llmd *d;
	struct llmd_model *lm;
};

/* Templates are text a person wrote: a megabyte is far past any real one. */
#define CHAT_TEMPLATE_MAX_BYTES (1 << 20)

int models_read_chat_template(struct model *m, const char *path, char *err, size_t errlen)
{
	char *src = NULL;
	size_t len = 0;
	FILE *f;
	int r;

	if (!(f = fopen(path, "re"))) {
		r = -errno;
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	src = malloc(CHAT_TEMPLATE_MAX_BYTES + 1);
	if (src)
		len = fread(src, 1, CHAT_TEMPLATE_MAX_BYTES + 1, f);
	r = !src ? -ENOMEM : ferror(f) ? -EIO : len > CHAT_TEMPLATE_MAX_BYTES ? -EFBIG : 0;
	fclose(f);
	if (r < 0)
		snprintf(err, errlen, "%s", r == -EFBIG ? "larger than 1 MiB" : strerror(-r));
	else
		r = model_set_chat_template(m, src, len, err, errlen);
	free(src);
	return r;
}

/* The engine settings of LM: the daemon's, with its own context and KV
 * pool where [models] sets them. */
static struct engine_params params_of(const struct llmd *d, const struct llmd_model *lm)
{
	struct engine_params ep = *d->ep;
	if (lm->conf_n_ctx >= 0)
		ep.n_ctx = lm->conf_n_ctx;
	if (lm->conf_pool_tokens >= 0) {
		ep.kv_tokens = lm->conf_pool_tokens;
		ep.kv_mib = 0;
	}
	return ep;
}

/* Gives prepared model WM its draft model LM->draft.  0, or a negative
 * errno with a message that names the setting; WM is discarded then. */
static int set_draft(struct llmd_model *lm, const struct engine_params *ep, struct wmodel *wm, char *err,
		     size_t errlen)
{
	char why[160];
	int r = worker_model_set_draft(wm, lm->draft, ep, why, sizeof why);

	if (r < 0) {
		worker_model_discard(wm);
		snprintf(err, errlen, "models.%s.draft_model: %s", lm->name, why);
	}
	return r;
}

/* What LM's engines' KV pools take: the model's and its draft's. */
static uint64_t kv_bytes_of(const struct wmodel *wm)
{
	const struct engine *de = worker_model_draft_engine(wm);

	return engine_kv_pool(worker_model_engine(wm))->bytes + (de ? engine_kv_pool(de)->bytes : 0);
}

static void *loader_main(void *arg)
{
	struct load_job *j = arg;
	struct llmd_model *lm = j->lm;
	struct engine_params ep = params_of(j->d, lm);

	lm->load_rc = worker_model_prepare(lm->model, &ep, j->d->sp, &lm->prepared, lm->load_err,
					   sizeof lm->load_err);
	if (lm->load_rc == 0 && lm->draft &&
	    (lm->load_rc = set_draft(lm, &ep, lm->prepared, lm->load_err, sizeof lm->load_err)) < 0)
		lm->prepared = NULL; /* discarded */
	event_active(lm->ev_loaded, EV_READ, 0); /* on_loaded, on the event loop */
	return NULL;
}

static void on_loaded(evutil_socket_t fd, short what, void *arg)
{
	struct load_job *j = arg;
	struct llmd *d = j->d;
	struct llmd_model *lm = j->lm;
	char msg[400];
	(void)fd;
	(void)what;

	pthread_join(lm->loader, NULL);
	lm->load_s = clock_s() - lm->t_load_start;
	if (lm->load_rc == 0) {
		lm->kv_bytes = kv_bytes_of(lm->prepared);
		lm->n_ctx = engine_n_ctx(worker_model_engine(lm->prepared));
		if (worker_model_install(d->worker, lm->index, lm->prepared) == 0) {
			lm->prepared = NULL;
			lm->state = LLMD_MODEL_READY;
			lm->t_ready = lm->t_used = clock_s();
			lm->loads++;
			lm->error[0] = 0;
			log_msg(LOG_INFO, "model %s loaded in %.2f s (weights %.1f MiB, KV %.1f MiB; %.1f of "
				"%.1f MiB in use)", lm->name, lm->load_s, lm->weight_bytes / MIB,
				lm->kv_bytes / MIB, models_bytes_in_use(d) / MIB, d->budget_bytes / MIB);
			return;
		}
		lm->prepared = NULL; /* the worker freed it */
		snprintf(lm->load_err, sizeof lm->load_err, "out of memory");
	}
	lm->state = LLMD_MODEL_FAILED;
	snprintf(lm->error, sizeof lm->error, "%s", lm->load_err);
	snprintf(msg, sizeof msg, "model %s cannot be loaded: %s", lm->name, lm->load_err);
	log_msg(LOG_ERR, "%s", msg);
	worker_model_fail(d->worker, lm->index, msg);
}

/* Starts LM's load on a thread of its own.  0 or an enum proto_err with MSG. */
static uint32_t start_load(struct llmd *d, struct llmd_model *lm, char *msg, size_t msglen)
{
	int r;

	lm->state = LLMD_MODEL_LOADING;
	lm->t_load_start = clock_s();
	lm->prepared = NULL;
	lm->load_err[0] = 0;
	log_msg(LOG_INFO, "loading model %s (%s)", lm->name, lm->model->path);
	if ((r = pthread_create(&lm->loader, NULL, loader_main, event_get_callback_arg(lm->ev_loaded)))) {
		lm->state = LLMD_MODEL_FAILED;
		snprintf(lm->error, sizeof lm->error, "cannot start a loader thread: %s", strerror(r));
		snprintf(msg, msglen, "model %s: %s", lm->name, lm->error);
		return PROTO_E_INTERNAL;
	}
	return 0;
}

/* ---- the budget ---- */

/* Posts LM's unload (it is READY and idle as far as the event loop knows). */
static void unload(struct llmd *d, struct llmd_model *lm, const char *why)
{
	if (worker_model_remove(d->worker, lm->index) < 0)
		return;
	lm->state = LLMD_MODEL_UNLOADING;
	log_msg(LOG_INFO, "unloading model %s (%s)", lm->name, why);
}

/* Unloads idle models, least recently used first, until NEED more bytes
 * fit the budget.  0, or PROTO_E_LIMIT with the numbers in MSG. */
static uint32_t make_room(struct llmd *d, const struct llmd_model *want, char *msg, size_t msglen)
{
	uint64_t need = model_bytes(want), in_use = models_bytes_in_use(d);
	struct worker_snapshot *sn = worker_snapshot_get(d->worker);

	while (in_use + need > d->budget_bytes) {
		struct llmd_model *lru = NULL;
		for (int i = 1; i < d->n_models; i++) {
			struct llmd_model *lm = &d->models[i];
			int32_t live = sn && lm->index < sn->n_models ? sn->models[lm->index].live : 1;
			if (lm == want || lm->state != LLMD_MODEL_READY || lm->pinned || live > 0)
				continue;
			if (!lru || lm->t_used < lru->t_used)
				lru = lm;
		}
		if (!lru)
			break;
		unload(d, lru, "to make room");
		in_use -= model_bytes(lru); /* freed by the engine thread in a moment */
	}
	worker_snapshot_put(sn);
	if (in_use + need <= d->budget_bytes)
		return 0;
	snprintf(msg, msglen, "model %s needs %.0f MiB (weights %.0f, KV %.0f) but %.0f of the %.0f MiB "
		 "of memory.budget_mb are held by models that are pinned or serving requests",
		 want->name, need / MIB, want->weight_bytes / MIB, want->kv_bytes / MIB, in_use / MIB,
		 d->budget_bytes / MIB);
	return PROTO_E_LIMIT;
}

uint32_t models_want(struct llmd *d, struct llmd_model *lm, char *msg, size_t msglen)
{
	uint32_t code;

	lm->t_used = clock_s();
	switch (lm->state) {
	case LLMD_MODEL_READY:
	case LLMD_MODEL_LOADING:
		return 0;
	case LLMD_MODEL_UNLOADING:
		lm->reload = 1; /* models_unloaded loads it again */
		return 0;
	case LLMD_MODEL_UNLOADED:
	case LLMD_MODEL_FAILED:
		break;
	}
	if ((code = make_room(d, lm, msg, msglen)))
		return code;
	return start_load(d, lm, msg, msglen);
}

uint32_t models_unload(struct llmd *d, struct llmd_model *lm, char *msg, size_t msglen)
{
	if (lm->index == 0 || lm->pinned) {
		snprintf(msg, msglen, "model %s stays loaded (%s)", lm->name,
			 lm->index == 0 ? "the default model" : "pinned: models.NAME.pinned");
		return PROTO_E_INVAL;
	}
	if (lm->state != LLMD_MODEL_READY) {
		snprintf(msg, msglen, "model %s is %s", lm->name, models_state_name(lm->state));
		return 0;
	}
	if (live_of(d, lm) > 0) {
		/* unloaded by models_tick once its requests end */
		lm->keep_alive_s = 0;
		snprintf(msg, msglen, "model %s is unloaded when its requests end", lm->name);
		return 0;
	}
	unload(d, lm, "llmctl unload");
	snprintf(msg, msglen, "model %s is unloading", lm->name);
	return 0;
}

void models_unloaded(struct llmd *d, int index, int error)
{
	struct llmd_model *lm;
	char msg[400];

	if (index <= 0 || index >= d->n_models)
		return;
	lm = &d->models[index];
	if (error) { /* a request came first */
		lm->state = LLMD_MODEL_READY;
		lm->reload = 0;
		return;
	}
	lm->state = LLMD_MODEL_UNLOADED;
	log_msg(LOG_INFO, "model %s unloaded (%.1f of %.1f MiB in use)", lm->name,
		models_bytes_in_use(d) / MIB, d->budget_bytes / MIB);
	if (lm->reload) {
		lm->reload = 0;
		if (models_want(d, lm, msg, sizeof msg))
			worker_model_fail(d->worker, lm->index, msg);
	}
}

void models_tick(struct llmd *d, double now)
{
	struct worker_snapshot *sn = worker_snapshot_get(d->worker);

	if (!sn)
		return;
	for (int i = 1; i < d->n_models; i++) {
		struct llmd_model *lm = &d->models[i];
		if (lm->state != LLMD_MODEL_READY)
			continue;
		/* a snapshot taken before the last request was posted says idle:
		 * t_used (set when it was posted) keeps it */
		if (lm->index < sn->n_models && sn->models[lm->index].live > 0) {
			lm->t_used = now;
			continue;
		}
		if (!lm->pinned && lm->keep_alive_s >= 0 && now - lm->t_used >= lm->keep_alive_s)
			unload(d, lm, lm->keep_alive_s ? "idle past its keep-alive" : "its requests ended");
	}
	worker_snapshot_put(sn);
}

/* ---- start and stop ---- */

/* MemAvailable of /proc/meminfo, bytes; 0 when unknown. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

int models_start(struct llmd *d, char *err, size_t errlen)
{
	struct llmd_model *def = &d->models[0];
	const struct engine *e0 = worker_engine(d->worker);
	struct bk_device_info dev;
	struct wmodel *wm;
	int r, loaded = 1;

	def->state = LLMD_MODEL_READY;
	def->pinned = 1;
	def->keep_alive_s = -1;
	def->n_ctx = engine_n_ctx(e0);
	def->n_vocab = engine_n_vocab(e0);
	def->weight_bytes = def->model->weight_bytes;
	def->kv_bytes = engine_kv_pool(e0)->bytes;
	if (worker_draft_engine(d->worker)) { /* its draft model counts as its own */
		def->weight_bytes += def->draft->weight_bytes;
		def->kv_bytes += engine_kv_pool(worker_draft_engine(d->worker))->bytes;
	}
	def->t_ready = def->t_used = clock_s();
	def->loads = 1;
	/* the budget: as set, or what is free now (three quarters of it) and
	 * what the default model holds already */
	engine_device_info(e0, &dev);
	if (d->cfg.budget_mb)
		d->budget_bytes = (uint64_t)d->cfg.budget_mb << 20;
	else
		d->budget_bytes = (strcmp(d->backend, "cpu") && dev.free_bytes ? dev.free_bytes : mem_available())
				  / 4 * 3 + model_bytes(def);
	for (int32_t i = 0; i < d->cfg.n_models; i++) {
		const struct llmd_conf_model *cm = &d->cfg.models[i];
		struct llmd_model *lm = &d->models[d->n_models];
		struct load_job *job;

		if ((r = model_load_flags(cm->path, d->cfg.model_mmap ? 0 : MODEL_LOAD_NO_MMAP, &lm->model,
					  err, errlen)) < 0) {
			char why[256];
			snprintf(why, sizeof why, "%s", err);
			snprintf(err, errlen, "cannot read model %s (models.%s): %s", cm->path, cm->name, why);
			return r;
		}
		snprintf(lm->name, sizeof lm->name, "%s", cm->name);
		lm->index = d->n_models++; /* freed at exit from here on */
		lm->pinned = cm->pinned;
		lm->conf_n_ctx = cm->n_ctx;
		lm->conf_pool_tokens = cm->pool_tokens;
		if (cm->chat_template[0] &&
		    (r = models_read_chat_template(lm->model, cm->chat_template, err, errlen)) < 0) {
			char why[256];
			snprintf(why, sizeof why, "%s", err);
			snprintf(err, errlen, "models.%s.chat_template %s: %s", cm->name, cm->chat_template, why);
			return r;
		}
		if (cm->draft_model[0]) {
			char why[256];
			if ((r = model_load_flags(cm->draft_model, d->cfg.model_mmap ? 0 : MODEL_LOAD_NO_MMAP,
						  &lm->draft, why, sizeof why)) < 0 ||
			    (r = sched_draft_check(lm->model, lm->draft, why, sizeof why)) < 0) {
				snprintf(err, errlen, "models.%s.draft_model %s: %s", cm->name, cm->draft_model,
					 why);
				return r;
			}
		}
		lm->keep_alive_s = cm->keep_alive_s == -2 ? d->cfg.keep_alive_s : cm->keep_alive_s;
		lm->n_ctx = lm->conf_n_ctx > 0 ? lm->conf_n_ctx : d->ep->n_ctx ? d->ep->n_ctx :
			    lm->model->hp.n_ctx_train;
		lm->n_vocab = lm->model->hp.n_vocab;
		lm->weight_bytes = lm->model->weight_bytes + (lm->draft ? lm->draft->weight_bytes : 0);
		/* expected (a draft's pool as large, until the real ones are known) */
		lm->kv_bytes = (d->cfg.pool_mb ? (uint64_t)d->cfg.pool_mb << 20 : def->kv_bytes) * (lm->draft ? 2 : 1);
		if (lm->model->chat_note[0])
			log_msg(lm->model->chat.kind ? LOG_WARNING : LOG_NOTICE, "%s: chat: %s", cm->path,
				lm->model->chat_note);
		if (constrain_new(lm->model->tok, &lm->constrain) < 0 || !(job = calloc(1, sizeof *job))) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		job->d = d;
		job->lm = lm;
		if (!(lm->ev_loaded = event_new(d->base, -1, 0, on_loaded, job))) {
			free(job);
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		if (!lm->pinned)
			continue; /* loaded when a request comes */
		struct engine_params ep = params_of(d, lm);
		if ((r = worker_model_prepare(lm->model, &ep, d->sp, &wm, err, errlen)) < 0) {
			char why[256];
			snprintf(why, sizeof why, "%s", err);
			snprintf(err, errlen, "cannot load model %s (models.%s): %s", cm->path, cm->name, why);
			return r;
		}
		if (lm->draft && (r = set_draft(lm, &ep, wm, err, errlen)) < 0)
			return r;
		lm->kv_bytes = kv_bytes_of(wm);
		lm->n_ctx = engine_n_ctx(worker_model_engine(wm));
		if ((r = worker_model_install(d->worker, lm->index, wm)) < 0) {
			snprintf(err, errlen, "out of memory");
			return r;
		}
		lm->state = LLMD_MODEL_READY;
		lm->loads = 1;
		lm->t_ready = lm->t_used = clock_s();
		loaded++;
	}
	if (models_bytes_in_use(d) > d->budget_bytes) {
		snprintf(err, errlen, "the default and pinned models need %.0f MiB, over the %.0f MiB of "
			 "memory.budget_mb", models_bytes_in_use(d) / MIB, d->budget_bytes / MIB);
		return -ENOSPC;
	}
	log_msg(LOG_INFO, "models: %d, %d loaded; memory budget %.0f MiB, %.0f in use", d->n_models,
		loaded, d->budget_bytes / MIB, models_bytes_in_use(d) / MIB);
	return 0;
}

void models_stop(struct llmd *d)
{
	for (int i = 1; i < d->n_models; i++) {
		struct llmd_model *lm = &d->models[i];
		if (lm->state == LLMD_MODEL_LOADING) {
			pthread_join(lm->loader, NULL);
			worker_model_discard(lm->prepared);
			lm->prepared = NULL;
			lm->state = LLMD_MODEL_UNLOADED;
		}
		if (lm->ev_loaded) {
			free(event_get_callback_arg(lm->ev_loaded));
			event_free(lm->ev_loaded);
			lm->ev_loaded = NULL;
		}
	}
}
