/* admin.c - the commands llmctl sends: status, stats, ps, models, load,
 * unload, cancel, drain, resume, reload.  Each is a row of one table with the permission it needs
 * and whether it reports the engine's state (read from the worker's last
 * published snapshot: no command ever waits for an engine step).  Answers
 * are JSON; llmctl renders tables and Prometheus text.
 */
#include "admin.h"

#include <errno.h>
#include <grp.h>
#include <json-c/json.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <config.h>

#include "clock.h"
#include "conn.h"
#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "models.h"
#include "worker.h"

/* Fills OUT; returns 0 or an enum proto_err code with a message in ERR. */
typedef int (*admin_fn)(struct llmd *d, struct conn *c, const char *arg,
			const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen);

struct admin_cmd {
	const char *name;
	int need_admin;      /* root, the daemon's user or admin_group only */
	int snapshot;        /* reports the engine's state (gets the last snapshot) */
	admin_fn fn;
};

/* ---- permissions ---- */

void admin_resolve_group(struct llmd *d)
{
	struct group gr, *res = NULL;
	char buf[4096];

	d->have_admin_gid = d->cfg.admin_group[0] &&
			    getgrnam_r(d->cfg.admin_group, &gr, buf, sizeof buf, &res) == 0 && res;
	if (d->have_admin_gid)
		d->admin_gid = gr.gr_gid;
}

int admin_allowed(const struct llmd *d, uid_t uid, gid_t gid)
{
	struct passwd pw, *res = NULL;
	char buf[4096];
	gid_t groups[256];
	int n = 256;

	if (uid == 0 || uid == geteuid())
		return 1;
	if (!d->have_admin_gid)
		return 0;
	if (gid == d->admin_gid)
		return 1;
	if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) != 0 || !res)
		return 0;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &n) < 0)
		return 0;
	for (int i = 0; i < n; i++)
		if (groups[i] == d->admin_gid)
			return 1;
	return 0;
}

/* ---- helpers ---- */

static void add_int(json_object *o, const char *k, int64_t v)
{
	json_object_object_add(o, k, json_object_new_int64(v));
}

static void add_dbl(json_object *o, const char *k, double v)
{
	json_object_object_add(o, k, json_object_new_double(v));
}

static void add_str(json_object *o, const char *k, const char *v)
{
	json_object_object_add(o, k, json_object_new_string(v));
}

static const char *state_name(const struct llmd *d)
{
	return d->stopping ? "stopping" : d->draining ? "draining" : "serving";
}

static double hit_rate(const struct sched_counters *c)
{
	double all = (double)c->prefix_hit_tokens + (double)c->prefill_rows;
	return all > 0 ? (double)c->prefix_hit_tokens / all : 0;
}

/* ---- commands ---- */

static int cmd_status(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	const struct engine *e = worker_engine(d->worker);
	const struct sched_counters *k = &sn->c;
	json_object *kv = json_object_new_object(), *pc = json_object_new_object(),
		    *q = json_object_new_object();

	add_str(out, "version", PACKAGE_VERSION);
	add_int(out, "pid", getpid());
	add_dbl(out, "uptime_s", clock_s() - d->t_start);
	add_str(out, "state", state_name(d));
	add_dbl(out, "engine_state_age_s", clock_s() - sn->t);
	add_str(out, "model", d->model->name);
	add_str(out, "model_path", d->model->path);
	add_str(out, "architecture", d->model->hp.arch);
	add_str(out, "backend", d->backend);
	add_int(out, "threads", d->n_threads);
	add_str(out, "chat_template", d->model->chat.kind ? chat_template_name(d->model->chat.kind) : "");
	/* what the Jinja template looks like, or what replaced a broken one */
	add_str(out, "chat_family", d->model->chat.kind == CHAT_TMPL_JINJA && d->model->chat.family ?
		chat_template_name(d->model->chat.family) : "");
	add_str(out, "chat_note", d->model->chat_note);
	add_int(out, "n_ctx", engine_n_ctx(e));
	add_int(out, "n_vocab", engine_n_vocab(e));
	add_int(out, "connections", d->n_conns);
	add_int(out, "requests_live", conn_live_total(d));
	add_int(out, "requests_total", (int64_t)d->requests_total);
	add_int(out, "generated_tokens", (int64_t)k->generated_tokens);
	add_dbl(out, "tok_s", sn->tok_s);
	add_str(kv, "type", d->cfg.kv_type);
	add_int(kv, "capacity_tokens", sn->kv_capacity_tokens);
	add_int(kv, "blocks", k->pool_blocks);
	add_int(kv, "block_tokens", k->block_tokens);
	add_int(kv, "used_blocks", k->used_blocks);
	add_int(kv, "cached_blocks", k->cached_blocks);
	add_int(kv, "free_blocks", k->pool_blocks - k->used_blocks - k->cached_blocks);
	add_dbl(kv, "used_pct", k->pool_blocks ? 100.0 * k->used_blocks / k->pool_blocks : 0);
	json_object_object_add(out, "kv", kv);
	json_object *dev = json_object_new_object();
	add_str(dev, "name", sn->device.name);
	add_int(dev, "index", sn->device.index);
	add_int(dev, "memory_total_bytes", (int64_t)sn->device.total_bytes);
	add_int(dev, "memory_free_bytes", (int64_t)sn->device.free_bytes);
	add_int(dev, "graphs_recorded", (int64_t)sn->graphs_recorded);
	add_int(dev, "graphs_replayed", (int64_t)sn->graphs_replayed);
	json_object_object_add(out, "device", dev);
	json_object_object_add(pc, "enabled", json_object_new_boolean(d->cfg.prefix_cache));
	add_int(pc, "lookups", (int64_t)k->prefix_lookups);
	add_int(pc, "hit_tokens", (int64_t)k->prefix_hit_tokens);
	add_dbl(pc, "hit_rate", hit_rate(k));
	json_object_object_add(out, "prefix_cache", pc);
	add_int(q, "waiting", k->waiting);
	add_int(q, "running", k->running);
	json_object_object_add(out, "queue", q);
	json_object *st = json_object_new_object();
	add_int(st, "budget_ms", k->step_ms);
	add_dbl(st, "last_ms", k->last_step_s * 1e3);
	add_dbl(st, "last_predicted_ms", k->last_step_pred_s * 1e3);
	add_int(st, "budget_cuts", (int64_t)k->budget_cuts);
	add_int(st, "budget_overruns", (int64_t)k->budget_overruns);
	json_object_object_add(out, "step", st);
	json_object *sp = json_object_new_object();
	add_str(sp, "mode", d->cfg.spec_mode);
	add_int(sp, "max_draft", d->cfg.spec_max_draft);
	add_str(sp, "draft_model", d->draft_model ? d->draft_model->name : "");
	add_int(sp, "proposed_tokens", (int64_t)k->spec_proposed);
	add_int(sp, "accepted_tokens", (int64_t)k->spec_accepted);
	add_dbl(sp, "acceptance_rate", k->spec_proposed ? (double)k->spec_accepted / (double)k->spec_proposed : 0);
	json_object_object_add(out, "speculative", sp);
	return 0;
}

/* The latency histograms' names, by enum worker_hist_kind. */
static const char *const hist_names[WORKER_HIST__N] = {
	"llmd_time_to_first_token_seconds",
	"llmd_time_per_output_token_seconds",
	"llmd_queue_wait_seconds",
};

/* stats' JSON in Prometheus text format: a gauge or counter (_total) a
 * number, errors_by_code as labels, the histograms with cumulative
 * buckets.  Malloc'd, NULL when out of memory. */
static char *prometheus_text(json_object *stats)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	json_object_object_foreach(stats, key, val) {
		size_t n = strlen(key);
		if (!strcmp(key, "errors_by_code")) {
			fprintf(f, "# TYPE llmd_errors_by_code_total counter\n");
			json_object_object_foreach(val, k2, v2)
				fprintf(f, "llmd_errors_by_code_total{code=\"%s\"} %lld\n", k2,
					(long long)json_object_get_int64(v2));
			continue;
		}
		if (!strcmp(key, "per_model")) {
			json_object_object_foreach(val, metric, by_model) {
				size_t m = strlen(metric);
				fprintf(f, "# TYPE %s %s\n", metric,
					m > 6 && !strcmp(metric + m - 6, "_total") ? "counter" : "gauge");
				json_object_object_foreach(by_model, name, v2)
					fprintf(f, "%s{model=\"%s\"} %lld\n", metric, name,
						(long long)json_object_get_int64(v2));
			}
			continue;
		}
		if (!strcmp(key, "histograms")) {
			json_object_object_foreach(val, name, h) {
				json_object *le, *counts, *sum, *count;
				uint64_t cum = 0;
				if (!json_object_object_get_ex(h, "le", &le) ||
				    !json_object_object_get_ex(h, "counts", &counts) ||
				    !json_object_object_get_ex(h, "sum", &sum) ||
				    !json_object_object_get_ex(h, "count", &count))
					continue;
				fprintf(f, "# TYPE %s histogram\n", name);
				for (size_t i = 0; i < json_object_array_length(le); i++) {
					cum += (uint64_t)json_object_get_int64(json_object_array_get_idx(counts, i));
					fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name,
						json_object_get_double(json_object_array_get_idx(le, i)),
						(unsigned long long)cum);
				}
				fprintf(f, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.9g\n%s_count %lld\n", name,
					(long long)json_object_get_int64(count), name, json_object_get_double(sum),
					name, (long long)json_object_get_int64(count));
			}
			continue;
		}
		fprintf(f, "# TYPE %s %s\n", key, n > 6 && !strcmp(key + n - 6, "_total") ? "counter" : "gauge");
		if (json_object_is_type(val, json_type_double))
			fprintf(f, "%s %.9g\n", key, json_object_get_double(val));
		else
			fprintf(f, "%s %lld\n", key, (long long)json_object_get_int64(val));
	}
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* The counters of every model's scheduler added up (the step timings and
 * costs stay the default model's). */
static void sum_counters(const struct worker_snapshot *sn, struct sched_counters *t)
{
	*t = sn->c;
	for (int i = 1; i < sn->n_models; i++) {
		const struct sched_counters *k = &sn->models[i].c;
		t->finished += k->finished;
		t->generated_tokens += k->generated_tokens;
		t->waiting += k->waiting;
		t->running += k->running;
		t->pool_blocks += k->pool_blocks;
		t->used_blocks += k->used_blocks;
		t->cached_blocks += k->cached_blocks;
		t->wasted_slots += k->wasted_slots;
		t->prefix_lookups += k->prefix_lookups;
		t->prefix_hit_tokens += k->prefix_hit_tokens;
		t->preemptions += k->preemptions;
		t->evictions += k->evictions;
		t->steps += k->steps;
		t->step_rows += k->step_rows;
		t->prefill_rows += k->prefill_rows;
		t->decode_rows += k->decode_rows;
		t->spec_steps += k->spec_steps;
		t->spec_proposed += k->spec_proposed;
		t->spec_accepted += k->spec_accepted;
		t->draft_steps += k->draft_steps;
		t->draft_rows += k->draft_rows;
	}
}

/* Each model's own counters, metric by metric: {metric: {name: value}}
 * (Prometheus: one series per model, labelled model="NAME"). */
static json_object *per_model(const struct llmd *d, const struct worker_snapshot *sn)
{
	static const char *const names[] = {
		"llmd_model_requests_total", "llmd_model_requests_finished_total",
		"llmd_model_generated_tokens_total", "llmd_model_queue_waiting", "llmd_model_queue_running",
		"llmd_model_kv_blocks", "llmd_model_kv_used_blocks", "llmd_model_kv_cached_blocks",
		"llmd_model_steps_total",
	};
	json_object *o = json_object_new_object();

	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
		json_object *by = json_object_new_object();
		for (int i = 0; i < d->n_models; i++) {
			const struct llmd_model *lm = &d->models[i];
			const struct sched_counters *c;
			int64_t v;
			if (lm->index >= sn->n_models)
				continue;
			c = &sn->models[lm->index].c;
			v = k == 0 ? (int64_t)lm->requests_total : k == 1 ? (int64_t)c->finished :
			    k == 2 ? (int64_t)c->generated_tokens : k == 3 ? c->waiting : k == 4 ? c->running :
			    k == 5 ? c->pool_blocks : k == 6 ? c->used_blocks : k == 7 ? c->cached_blocks :
			    (int64_t)c->steps;
			add_int(by, lm->name, v);
		}
		json_object_object_add(o, names[k], by);
	}
	return o;
}

static int cmd_stats(struct llmd *d, struct conn *c, const char *arg,
		     const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	struct sched_counters tot;
	const struct sched_counters *k = &tot;
	uint64_t refused = 0;
	json_object *by = json_object_new_object();

	sum_counters(sn, &tot);

	/* Names follow Prometheus conventions: _total for counters. */
	add_dbl(out, "llmd_uptime_seconds", clock_s() - d->t_start);
	add_int(out, "llmd_connections", d->n_conns);
	add_int(out, "llmd_connections_total", (int64_t)d->conns_total);
	add_int(out, "llmd_requests_live", conn_live_total(d));
	add_int(out, "llmd_requests_total", (int64_t)d->requests_total);
	add_int(out, "llmd_requests_finished_total", (int64_t)k->finished);
	for (int i = 1; i < PROTO_E__MAX; i++) {
		refused += d->refused[i];
		if (d->refused[i])
			add_int(by, proto_err_name((uint32_t)i), (int64_t)d->refused[i]);
	}
	add_int(out, "llmd_errors_sent_total", (int64_t)refused);
	add_int(out, "llmd_bad_frames_total", (int64_t)d->bad_frames);
	add_int(out, "llmd_generated_tokens_total", (int64_t)k->generated_tokens);
	add_int(out, "llmd_graph_steps_recorded_total", (int64_t)sn->graphs_recorded);
	add_int(out, "llmd_graph_steps_replayed_total", (int64_t)sn->graphs_replayed);
	add_dbl(out, "llmd_generated_tokens_per_second", sn->tok_s);
	add_int(out, "llmd_queue_waiting", k->waiting);
	add_int(out, "llmd_queue_running", k->running);
	int64_t cap = 0;
	for (int i = 0; i < sn->n_models; i++)
		cap += sn->models[i].kv_capacity_tokens;
	add_int(out, "llmd_kv_capacity_tokens", sn->n_models ? cap : sn->kv_capacity_tokens);
	add_int(out, "llmd_kv_blocks", k->pool_blocks);
	add_int(out, "llmd_kv_block_tokens", k->block_tokens);
	add_int(out, "llmd_kv_used_blocks", k->used_blocks);
	add_int(out, "llmd_kv_cached_blocks", k->cached_blocks);
	add_int(out, "llmd_kv_wasted_slots", k->wasted_slots);
	add_int(out, "llmd_prefix_lookups_total", (int64_t)k->prefix_lookups);
	add_int(out, "llmd_prefix_hit_tokens_total", (int64_t)k->prefix_hit_tokens);
	add_int(out, "llmd_preemptions_total", (int64_t)k->preemptions);
	add_int(out, "llmd_evictions_total", (int64_t)k->evictions);
	add_int(out, "llmd_steps_total", (int64_t)k->steps);
	add_int(out, "llmd_step_rows_total", (int64_t)k->step_rows);
	add_int(out, "llmd_prefill_rows_total", (int64_t)k->prefill_rows);
	add_int(out, "llmd_decode_rows_total", (int64_t)k->decode_rows);
	add_int(out, "llmd_spec_verify_steps_total", (int64_t)k->spec_steps);
	add_int(out, "llmd_spec_proposed_tokens_total", (int64_t)k->spec_proposed);
	add_int(out, "llmd_spec_accepted_tokens_total", (int64_t)k->spec_accepted);
	add_int(out, "llmd_spec_draft_steps_total", (int64_t)k->draft_steps);
	add_int(out, "llmd_spec_draft_rows_total", (int64_t)k->draft_rows);
	add_int(out, "llmd_last_step_rows", k->last_step_rows);
	add_int(out, "llmd_last_step_seqs", k->last_step_seqs);
	add_dbl(out, "llmd_last_step_seconds", k->last_step_s);
	add_dbl(out, "llmd_last_step_predicted_seconds", k->last_step_pred_s);
	add_dbl(out, "llmd_step_budget_seconds", k->step_ms / 1e3);
	add_int(out, "llmd_step_budget_cuts_total", (int64_t)k->budget_cuts);
	add_int(out, "llmd_step_budget_overruns_total", (int64_t)k->budget_overruns);
	add_int(out, "llmd_step_cost_samples_total", (int64_t)k->cost_samples);
	add_dbl(out, "llmd_step_cost_base_seconds", k->cost_base_s);
	add_dbl(out, "llmd_step_cost_row_seconds", k->cost_row_s);
	add_dbl(out, "llmd_step_cost_position_seconds", k->cost_pos_s);
	add_dbl(out, "llmd_step_cost_context_seconds", k->cost_ctx_s);
	json_object_object_add(out, "errors_by_code", by);
	json_object_object_add(out, "per_model", per_model(d, sn));
	json_object *hs = json_object_new_object();
	for (int i = 0; i < WORKER_HIST__N; i++) {
		json_object *h = json_object_new_object(), *le = json_object_new_array(),
			    *counts = json_object_new_array();
		for (int b = 0; b < WORKER_HIST_BUCKETS; b++) {
			json_object_array_add(le, json_object_new_double(worker_hist_le[b]));
			json_object_array_add(counts, json_object_new_int64((int64_t)sn->hist[i].counts[b]));
		}
		json_object_object_add(h, "le", le);
		json_object_object_add(h, "counts", counts);
		json_object_object_add(h, "sum", json_object_new_double(sn->hist[i].sum));
		json_object_object_add(h, "count", json_object_new_int64((int64_t)sn->hist[i].count));
		json_object_object_add(hs, hist_names[i], h);
	}
	json_object_object_add(out, "histograms", hs);
	/* stats prometheus: the same as one text, for llmctl and GET /metrics */
	if (!strcmp(arg, "prometheus")) {
		char *text = prometheus_text(out);
		if (!text) {
			snprintf(err, errlen, "out of memory");
			return PROTO_E_INTERNAL;
		}
		json_object *wrap = json_object_new_string(text);
		free(text);
		json_object_object_foreach(out, key, val) {
			(void)val;
			json_object_object_del(out, key);
		}
		json_object_object_add(out, "prometheus", wrap);
	} else if (arg[0]) {
		snprintf(err, errlen, "stats takes no argument but prometheus, not '%s'", arg);
		return PROTO_E_INVAL;
	}
	return 0;
}

static const char *req_state(enum sched_state s)
{
	switch (s) {
	case SCHED_ST_QUEUED:
		return "queued";
	case SCHED_ST_PREEMPTED:
		return "preempted";
	case SCHED_ST_PREFILL:
		return "prefill";
	case SCHED_ST_DECODE:
		return "decode";
	}
	return "?";
}

static int cmd_ps(struct llmd *d, struct conn *c, const char *arg, const struct worker_snapshot *sn,
		  json_object *out, char *err, size_t errlen)
{
	json_object *arr = json_object_new_array();

	for (int32_t i = 0; i < sn->n_reqs; i++) {
		const struct worker_snap_req *r = &sn->reqs[i];
		struct conn *o = conn_lookup(d, r->conn_id);
		json_object *j;
		if (!o || (!c->is_admin && o->uid != c->uid))
			continue; /* gone, or someone else's */
		j = json_object_new_object();
		add_int(j, "id", (int64_t)r->gid);
		add_str(j, "model", r->model >= 0 && r->model < d->n_models ? d->models[r->model].name : "");
		add_int(j, "client_request", (int64_t)r->client_id);
		add_int(j, "conn", r->conn_id);
		add_int(j, "pid", o->pid);
		add_int(j, "uid", o->uid);
		add_str(j, "command", o->comm);
		add_str(j, "state", r->loading ? "loading" : req_state(r->info.state));
		json_object_object_add(j, "ring_full", json_object_new_boolean(r->ring_full));
		add_int(j, "queue_pos", r->info.queue_pos);
		add_int(j, "priority", r->info.priority);
		add_int(j, "prompt_tokens", r->info.prompt_tokens);
		add_int(j, "computed_tokens", r->info.computed_tokens);
		add_int(j, "generated_tokens", r->info.generated_tokens);
		add_int(j, "kv_blocks", r->info.blocks);
		add_dbl(j, "age_s", r->age_s + (clock_s() - sn->t));
		json_object_array_add(arr, j);
	}
	json_object_object_add(out, "requests", arr);
	return 0;
}

/* The models served: name, state, what they hold.  All are loaded at start
 * today, so "ready" (or "failed" once an engine failed for good). */
static int cmd_models(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	json_object *arr = json_object_new_array();

	(void)c;
	(void)arg;
	(void)err;
	(void)errlen;
	add_str(out, "default", d->n_models ? d->models[0].name : "");
	add_dbl(out, "budget_mib", (double)d->budget_bytes / (1 << 20));
	add_dbl(out, "in_use_mib", (double)models_bytes_in_use(d) / (1 << 20));
	for (int i = 0; i < d->n_models; i++) {
		const struct llmd_model *lm = &d->models[i];
		const struct worker_snap_model *sm = lm->index < sn->n_models ? &sn->models[lm->index] : NULL;
		int dead = sm && sm->loaded && sm->dead;
		json_object *j = json_object_new_object();
		add_str(j, "name", lm->name);
		add_str(j, "path", lm->model->path);
		add_str(j, "gguf_name", lm->model->name);
		if (lm->draft) /* its weights and KV count in weights_mib and kv_mib */
			add_str(j, "draft_model", lm->draft->path);
		add_str(j, "state", dead ? "failed" : models_state_name(lm->state));
		if (dead)
			add_str(j, "error", "its engine failed; restart llmd");
		else if (lm->error[0])
			add_str(j, "error", lm->error);
		add_str(j, "arch", lm->model->hp.arch);
		add_str(j, "backend", d->backend);
		json_object_object_add(j, "default", json_object_new_boolean(i == 0));
		json_object_object_add(j, "pinned", json_object_new_boolean(lm->pinned));
		add_int(j, "keep_alive_s", lm->keep_alive_s);
		add_int(j, "n_ctx", lm->n_ctx);
		add_dbl(j, "weights_mib", (double)lm->weight_bytes / (1 << 20));
		add_dbl(j, "kv_mib", (double)lm->kv_bytes / (1 << 20));
		add_int(j, "kv_capacity_tokens", sm && sm->loaded ? sm->kv_capacity_tokens : 0);
		add_int(j, "live", sm ? sm->live : 0);
		add_int(j, "waiting_for_load", sm ? sm->pending : 0);
		add_int(j, "requests_total", (int64_t)lm->requests_total);
		add_int(j, "generated_tokens", sm && sm->loaded ? (int64_t)sm->c.generated_tokens : 0);
		add_int(j, "loads", (int64_t)lm->loads);
		add_dbl(j, "load_s", lm->load_s);
		add_dbl(j, "idle_s", sm && sm->live ? 0 : clock_s() - lm->t_used);
		json_object_array_add(arr, j);
	}
	json_object_object_add(out, "models", arr);
	return 0;
}

/* llmctl load NAME / unload NAME: loading does not wait (llmctl models
 * shows the state). */
static int cmd_load_unload(struct llmd *d, const char *arg, int load, json_object *out, char *err,
			   size_t errlen)
{
	struct llmd_model *lm = llmd_model_find(d, arg, strlen(arg));
	char msg[400] = "";
	uint32_t code;

	if (!arg[0]) {
		snprintf(err, errlen, "%s needs a model's name", load ? "load" : "unload");
		return PROTO_E_INVAL;
	}
	if (!lm) {
		snprintf(err, errlen, "no model named '%.64s' (llmctl models lists them)", arg);
		return PROTO_E_NOMODEL;
	}
	code = load ? models_want(d, lm, msg, sizeof msg) : models_unload(d, lm, msg, sizeof msg);
	if (code) {
		snprintf(err, errlen, "%s", msg);
		return (int)code;
	}
	add_str(out, "name", lm->name);
	add_str(out, "state", models_state_name(lm->state));
	if (msg[0])
		add_str(out, "note", msg);
	return 0;
}

static int cmd_load(struct llmd *d, struct conn *c, const char *arg,
		    const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	(void)c;
	(void)sn;
	return cmd_load_unload(d, arg, 1, out, err, errlen);
}

static int cmd_unload(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	(void)c;
	(void)sn;
	return cmd_load_unload(d, arg, 0, out, err, errlen);
}

static int cmd_cancel(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	unsigned long long id;
	size_t n = strspn(arg, "0123456789");
	struct conn *o;
	int32_t i;

	/* Digits only: strtoull would take "-1" as 2^64 - 1, and " 7" as 7. */
	errno = 0;
	id = n ? strtoull(arg, NULL, 10) : 0;
	if (!n || arg[n] || errno || id == 0) {
		snprintf(err, errlen, "cancel needs a request id, a number from llmctl ps, not '%s'", arg);
		return PROTO_E_INVAL;
	}
	if (!(o = conn_find_gid(d, id, &i))) {
		snprintf(err, errlen, "no live request %llu", id);
		return PROTO_E_NOTFOUND;
	}
	if (!c->is_admin && o->uid != c->uid) {
		snprintf(err, errlen, "request %llu belongs to uid %u", id, (unsigned)o->uid);
		return PROTO_E_PERM;
	}
	conn_cancel(d, o, i);
	add_int(out, "cancelled", (int64_t)id);
	return 0;
}

static int cmd_drain(struct llmd *d, struct conn *c, const char *arg,
		     const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	d->draining = 1;
	add_str(out, "state", state_name(d));
	add_int(out, "requests_live", conn_live_total(d));
	return 0;
}

static int cmd_resume(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	if (d->stopping) {
		snprintf(err, errlen, "llmd is shutting down");
		return PROTO_E_DRAINING;
	}
	d->draining = 0;
	add_str(out, "state", state_name(d));
	return 0;
}

static int cmd_reload(struct llmd *d, struct conn *c, const char *arg,
		      const struct worker_snapshot *sn, json_object *out, char *err, size_t errlen)
{
	char msg[512];
	if (admin_reload(d, msg, sizeof msg) < 0) {
		snprintf(err, errlen, "%s", msg);
		return PROTO_E_INVAL;
	}
	add_str(out, "reloaded", d->config_path[0] ? d->config_path : "(no config file)");
	add_str(out, "note", msg);
	return 0;
}

static const struct admin_cmd cmds[] = {
	{ "status", 0, 1, cmd_status },
	{ "stats", 0, 1, cmd_stats },
	{ "ps", 0, 1, cmd_ps },           /* non-admins see their own requests */
	{ "models", 0, 1, cmd_models },
	{ "load", 1, 0, cmd_load },
	{ "unload", 1, 0, cmd_unload },
	{ "cancel", 0, 0, cmd_cancel },   /* non-admins may cancel their own */
	{ "drain", 1, 0, cmd_drain },
	{ "resume", 1, 0, cmd_resume },
	{ "reload", 1, 0, cmd_reload },
};

/* ---- dispatch ---- */

/* The reply: CODE and a copy of BODY in *RET_BODY (NULL when out of memory). */
static uint32_t reply(uint32_t code, const char *body, char **ret_body)
{
	*ret_body = strdup(body);
	return code;
}

static uint32_t run(struct llmd *d, struct conn *c, const struct admin_cmd *cmd, const char *arg,
		    const struct worker_snapshot *sn, char **ret_body)
{
	json_object *out = json_object_new_object();
	char err[512] = "";
	int code = cmd->fn(d, c, arg, sn, out, err, sizeof err);
	uint32_t r;

	if (code)
		r = reply((uint32_t)code, err, ret_body);
	else
		r = reply(0, json_object_to_json_string_ext(out, JSON_C_TO_STRING_PLAIN), ret_body);
	json_object_put(out);
	return r;
}

/* A command name is lowercase letters and '_'; an argument has no NUL
 * (either would be cut short as a C string and run something else). */
static int admin_text_ok(const struct proto_admin *a)
{
	for (uint32_t i = 0; i < a->command.len; i++) {
		char ch = a->command.p[i];
		if (!((ch >= 'a' && ch <= 'z') || ch == '_'))
			return 0;
	}
	return a->command.len > 0 && !memchr(a->arg.p, 0, a->arg.len);
}

uint32_t admin_run(struct llmd *d, struct conn *c, const struct proto_admin *a, char **ret_body)
{
	const struct admin_cmd *cmd = NULL;
	struct worker_snapshot *sn = NULL;
	uint32_t code;
	char name[PROTO_MAX_ADMIN_CMD + 1], arg[PROTO_MAX_ADMIN_ARG + 1];

	if (!admin_text_ok(a)) {
		return reply(PROTO_E_INVAL,
			     "an admin command is lowercase letters and '_', and its argument has no NUL byte",
			     ret_body);
	}
	snprintf(name, sizeof name, "%.*s", (int)a->command.len, a->command.p);
	snprintf(arg, sizeof arg, "%.*s", (int)a->arg.len, a->arg.p);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		if (!strcmp(cmds[i].name, name))
			cmd = &cmds[i];
	if (!cmd) {
		char msg[128];
		snprintf(msg, sizeof msg, "unknown command '%s'", name);
		return reply(PROTO_E_NOTFOUND, msg, ret_body);
	}
	if (cmd->need_admin && !c->is_admin) {
		char msg[160];
		snprintf(msg, sizeof msg, "'%s' needs root or membership of group '%s'", name,
			 d->cfg.admin_group);
		d->refused[PROTO_E_PERM]++;
		return reply(PROTO_E_PERM, msg, ret_body);
	}
	if (cmd->snapshot && !(sn = worker_snapshot_get(d->worker))) {
		return reply(PROTO_E_INTERNAL, "out of memory", ret_body);
	}
	code = run(d, c, cmd, arg, sn, ret_body);
	worker_snapshot_put(sn);
	return code;
}

/* ---- reload ---- */

int admin_reload(struct llmd *d, char *msg, size_t msglen)
{
	struct llmd_conf n;
	char err[512];
	int r;

	conf_default(&n);
	if (d->config_path[0] && (r = conf_load(&n, d->config_path, err, sizeof err)) < 0) {
		snprintf(msg, msglen, "%s", err);
		return r;
	}
	for (int i = 0; i < d->n_overrides; i++)
		if ((r = conf_set(&n, d->overrides[i], err, sizeof err)) < 0) {
			snprintf(msg, msglen, "%s", err);
			return r;
		}
	if ((r = conf_check(&n, err, sizeof err)) < 0) {
		snprintf(msg, msglen, "%s", err);
		return r;
	}
	/* What needs a restart keeps its running value; say which. */
	char restart[256] = "";
#define KEEP(field, name)                                                                     \
	do {                                                                                  \
		if (memcmp(&n.field, &d->cfg.field, sizeof n.field)) {                        \
			size_t l = strlen(restart);                                           \
			snprintf(restart + l, sizeof restart - l, "%s%s", l ? ", " : "", name); \
			memcpy(&n.field, &d->cfg.field, sizeof n.field);                      \
		}                                                                             \
	} while (0)
	KEEP(model_path, "model.path");
	KEEP(model_mmap, "model.mmap");
	KEEP(socket_path, "server.socket");
	KEEP(socket_mode, "server.socket_mode");
	KEEP(socket_group, "server.socket_group");
	KEEP(http_socket, "http.socket");
	KEEP(http_listen, "http.listen");
	KEEP(http_keys_file, "http.keys_file");
	KEEP(http_max_body_kib, "http.max_body_kib");
	KEEP(http_timeout_s, "http.timeout_s");
	KEEP(backend, "device.backend");
	KEEP(device_index, "device.index");
	KEEP(threads, "device.threads");
	KEEP(graphs, "device.graphs");
	KEEP(gemm_rows, "device.gemm_rows");
	KEEP(pool_mb, "kv.pool_mb");
	KEEP(pool_tokens, "kv.pool_tokens");
	KEEP(gpu_mem_fraction, "kv.gpu_mem_fraction");
	KEEP(block_tokens, "kv.block_tokens");
	KEEP(kv_type, "kv.type");
	KEEP(n_ctx, "kv.n_ctx");
	KEEP(max_seqs, "sched.max_seqs");
	KEEP(max_batched_tokens, "sched.max_batched_tokens");
	KEEP(max_queue, "sched.max_queue");
	KEEP(prefix_cache, "sched.prefix_cache");
	KEEP(step_ms, "sched.step_ms");
	KEEP(spec_mode, "spec.mode");
	KEEP(spec_max_draft, "spec.max_draft");
	KEEP(spec_min_match, "spec.min_match");
	KEEP(max_connections, "limits.max_connections");
	KEEP(admin_connections, "limits.admin_connections");
#undef KEEP
	d->cfg = n;
	admin_resolve_group(d);
	/* Who is an admin may have changed with admin_group: ask again for
	 * every open connection. */
	for (uint32_t i = 0; d->conns && i < d->max_conn_slots; i++)
		if (d->conns[i])
			d->conns[i]->is_admin = admin_allowed(d, d->conns[i]->uid, d->conns[i]->gid);
	if (restart[0])
		snprintf(msg, msglen, "limits applied; these changes need a restart: %s", restart);
	else
		snprintf(msg, msglen, "limits applied");
	return 0;
}
