/* conf.c - llmd.conf and its overrides: one table names every option,
 * its section, its type, its range and where it lives in struct
 * llmd_conf.  Parsing only; nothing here acts on a setting.
 */
#include "conf.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sched.h" /* SCHED_SPEC_MAX_DRAFT */

enum opt_type { OPT_STR, OPT_INT, OPT_I64, OPT_MODE, OPT_BOOL, OPT_FRAC /* double in (0, 1] */ };

struct opt {
	const char *section;
	const char *key;
	enum opt_type type;
	size_t off;              /* offset in struct llmd_conf */
	size_t size;             /* OPT_STR: buffer size */
	int64_t min, max;        /* OPT_INT / OPT_I64 range */
	const char *const *choices; /* OPT_STR: allowed values, or NULL */
};

static const char *const backends[] = { "auto", "cpu", "cuda", NULL };
static const char *const kv_types[] = { "f16", "f32", "q8_0", NULL };
static const char *const spec_modes[] = { "off", "ngram", "draft", NULL };

#define F(field) offsetof(struct llmd_conf, field), sizeof(((struct llmd_conf *)0)->field)
static const struct opt opts[] = {
	{ "model", "path", OPT_STR, F(model_path), 0, 0, NULL },
	{ "model", "mmap", OPT_BOOL, F(model_mmap), 0, 1, NULL },
	{ "model", "chat_template", OPT_STR, F(chat_template), 0, 0, NULL },
	{ "model", "name", OPT_STR, F(model_name), 0, 0, NULL },
	{ "server", "socket", OPT_STR, F(socket_path), 0, 0, NULL },
	{ "server", "socket_mode", OPT_MODE, F(socket_mode), 0, 07777, NULL },
	{ "server", "socket_group", OPT_STR, F(socket_group), 0, 0, NULL },
	{ "server", "admin_group", OPT_STR, F(admin_group), 0, 0, NULL },
	{ "server", "grace_s", OPT_INT, F(grace_s), 0, 3600, NULL },
	{ "http", "socket", OPT_STR, F(http_socket), 0, 0, NULL },
	{ "http", "listen", OPT_STR, F(http_listen), 0, 0, NULL },
	{ "http", "keys_file", OPT_STR, F(http_keys_file), 0, 0, NULL },
	{ "http", "max_body_kib", OPT_INT, F(http_max_body_kib), 1, 1 << 20, NULL },
	{ "http", "timeout_s", OPT_INT, F(http_timeout_s), 1, 86400, NULL },
	{ "device", "backend", OPT_STR, F(backend), 0, 0, backends },
	{ "device", "index", OPT_INT, F(device_index), 0, 255, NULL },
	{ "device", "threads", OPT_INT, F(threads), 0, 256, NULL },
	{ "device", "graphs", OPT_BOOL, F(graphs), 0, 1, NULL },
	{ "device", "gemm_rows", OPT_INT, F(gemm_rows), 0, 65536, NULL },
	{ "cuda", "mma_min_t", OPT_INT, F(cuda.mma_min_t), 0, 65536, NULL },
	{ "cuda", "mm_split", OPT_INT, F(cuda.mm_split), 1, 16, NULL },
	{ "cuda", "mm_warps", OPT_INT, F(cuda.mm_warps), 0, 1 << 24, NULL },
	{ "cuda", "mm_wide", OPT_INT, F(cuda.mm_wide), 0, 8, NULL },
	{ "cuda", "mm_mixed", OPT_BOOL, F(cuda.mm_mixed), 0, 1, NULL },
	{ "cuda", "pdl", OPT_BOOL, F(cuda.pdl), 0, 1, NULL },
	{ "cuda", "attn_split", OPT_INT, F(cuda.attn_split), 1, 65536, NULL },
	{ "kv", "pool_mb", OPT_I64, F(pool_mb), 0, 1 << 24, NULL },
	{ "kv", "pool_tokens", OPT_I64, F(pool_tokens), 0, INT32_MAX, NULL },
	{ "kv", "gpu_mem_fraction", OPT_FRAC, F(gpu_mem_fraction), 0, 0, NULL },
	{ "kv", "block_tokens", OPT_INT, F(block_tokens), 1, 1024, NULL },
	{ "kv", "type", OPT_STR, F(kv_type), 0, 0, kv_types },
	{ "kv", "n_ctx", OPT_INT, F(n_ctx), 0, 1 << 20, NULL },
	{ "sched", "max_seqs", OPT_INT, F(max_seqs), 1, 4096, NULL },
	{ "sched", "max_batched_tokens", OPT_INT, F(max_batched_tokens), 1, 65536, NULL },
	{ "sched", "max_queue", OPT_INT, F(max_queue), 1, 1 << 20, NULL },
	{ "sched", "prefix_cache", OPT_BOOL, F(prefix_cache), 0, 1, NULL },
	{ "sched", "step_ms", OPT_INT, F(step_ms), 0, 60000, NULL },
	{ "spec", "mode", OPT_STR, F(spec_mode), 0, 0, spec_modes },
	{ "spec", "max_draft", OPT_INT, F(spec_max_draft), 1, SCHED_SPEC_MAX_DRAFT, NULL },
	{ "spec", "min_match", OPT_INT, F(spec_min_match), 1, 64, NULL },
	{ "spec", "draft_model", OPT_STR, F(spec_draft_model), 0, 0, NULL },
	{ "limits", "max_connections", OPT_INT, F(max_connections), 1, 65535, NULL },
	{ "limits", "connections_per_uid", OPT_INT, F(connections_per_uid), 1, 65535, NULL },
	{ "limits", "requests_per_connection", OPT_INT, F(requests_per_connection), 1, 65536, NULL },
	{ "limits", "requests_per_uid", OPT_INT, F(requests_per_uid), 1, 1 << 20, NULL },
	{ "limits", "prompt_bytes", OPT_INT, F(prompt_bytes), 1, 1 << 20, NULL },
	{ "limits", "prompt_tokens", OPT_INT, F(prompt_tokens), 0, 1 << 20, NULL },
	{ "limits", "max_tokens", OPT_INT, F(max_tokens), 1, 1 << 20, NULL },
	{ "limits", "max_priority", OPT_INT, F(max_priority), 0, 1000000, NULL },
	{ "limits", "ring_kib", OPT_INT, F(ring_kib), 4, 65536, NULL },
	{ "limits", "ring_max_kib", OPT_INT, F(ring_max_kib), 4, 65536, NULL },
	{ "limits", "admin_connections", OPT_INT, F(admin_connections), 0, 1024, NULL },
	{ "limits", "output_kib", OPT_INT, F(output_kib), 16, 65536, NULL },
	{ "limits", "hello_timeout_s", OPT_INT, F(hello_timeout_s), 0, 86400, NULL },
	{ "limits", "frame_timeout_s", OPT_INT, F(frame_timeout_s), 0, 86400, NULL },
	{ "limits", "idle_timeout_s", OPT_INT, F(idle_timeout_s), 0, 1 << 30, NULL },
	{ "memory", "budget_mb", OPT_I64, F(budget_mb), 0, 1 << 30, NULL },
	{ "memory", "keep_alive_s", OPT_INT, F(keep_alive_s), -1, 1 << 30, NULL },
};
#undef F
#define N_OPTS (sizeof opts / sizeof opts[0])

void conf_default(struct llmd_conf *c)
{
	memset(c, 0, sizeof *c);
	c->model_mmap = 1;
	c->keep_alive_s = 300; /* Ollama's five minutes */
	strcpy(c->socket_path, LLMD_DEFAULT_SOCKET);
	c->socket_mode = 0660;
	strcpy(c->admin_group, "llm-admin");
	c->grace_s = 10;
	strcpy(c->http_socket, "auto");
	c->http_max_body_kib = 4096;
	c->http_timeout_s = 30;
	strcpy(c->backend, "auto");
	c->graphs = 1;
	cuda_tuning_defaults(&c->cuda);
	c->pool_mb = 0;
	c->gpu_mem_fraction = 0.9;
	c->block_tokens = 16;
	strcpy(c->kv_type, "f16");
	c->max_seqs = 32;
	c->max_batched_tokens = 512;
	c->max_queue = 1024;
	c->prefix_cache = 1;
	c->step_ms = 200;
	strcpy(c->spec_mode, "off");
	c->spec_max_draft = 8;
	c->spec_min_match = 2;
	c->max_connections = 1024;
	c->connections_per_uid = 256;
	c->requests_per_connection = 64;
	c->requests_per_uid = 256;
	c->prompt_bytes = 256 * 1024;
	c->max_tokens = 4096;
	c->max_priority = 10;
	c->ring_kib = 256;
	c->ring_max_kib = 4096;
	c->admin_connections = 16;
	c->output_kib = 256;
	c->hello_timeout_s = 10;
	c->frame_timeout_s = 10;
	c->idle_timeout_s = 0;
}

static int parse_int(const char *v, int64_t *ret, int base)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(v, &end, base);
	if (errno || end == v || *end)
		return -EINVAL;
	*ret = x;
	return 0;
}

/* Edits (insert, delete, substitute) between A and B, at most 9. */
static int distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int row[64];

	if (la >= 64 || lb >= 64)
		return 9;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int diag = row[0];
		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[lb] < 9 ? row[lb] : 9;
}

/* The option SECTION.KEY most likely meant (at most three edits away), or
 * NULL. */
static const struct opt *nearest(const char *section, const char *key)
{
	char want[128], name[128];
	const struct opt *best = NULL;
	int best_d = 4;

	snprintf(want, sizeof want, "%s.%s", section, key);
	for (size_t i = 0; i < N_OPTS; i++) {
		int d;
		snprintf(name, sizeof name, "%s.%s", opts[i].section, opts[i].key);
		/* the right key in another section counts as one edit */
		d = !strcmp(opts[i].key, key) ? 1 : distance(want, name);
		if (d < best_d) {
			best = &opts[i];
			best_d = d;
		}
	}
	return best;
}

int conf_model_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n < 1 || n > LLMD_MODEL_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)name[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '.' || ch == '_' || ch == '-' || ch == ':'))
			return 0;
	}
	return 1;
}

void conf_model_name_of(const char *path, char *out, size_t cap)
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".gguf"))
		n -= 5;
	if (n > LLMD_MODEL_NAME_MAX)
		n = LLMD_MODEL_NAME_MAX;
	if (n >= cap)
		n = cap - 1;
	for (size_t i = 0; i < n; i++) {
		char one[2] = { base[i], 0 };
		out[i] = conf_model_name_ok(one) ? base[i] : '_';
	}
	out[n] = 0;
	if (!n)
		snprintf(out, cap, "model");
}

/* The settings a model of [models] takes: NAME.SETTING. */
static const char *const model_settings[] = { "pinned", "keep_alive_s", "n_ctx", "pool_tokens",
					      "chat_template", "draft_model", NULL };

/* [models] NAME.SETTING = VALUE, for a model named before. */
static int apply_model_setting(struct llmd_conf *c, const char *key, const char *value, char *err,
			       size_t errlen)
{
	const char *dot = strrchr(key, '.');
	size_t n = (size_t)(dot - key);
	int64_t x;
	int32_t i;

	for (i = 0; i < c->n_models; i++)
		if (strlen(c->models[i].name) == n && !memcmp(c->models[i].name, key, n))
			break;
	if (i == c->n_models) {
		snprintf(err, errlen, "models.%s: no model %.*s = PATH before it", key, (int)n, key);
		return -EINVAL;
	}
	if (!strcmp(dot + 1, "pinned")) {
		if (!strcmp(value, "1") || !strcasecmp(value, "yes") || !strcasecmp(value, "true") ||
		    !strcasecmp(value, "on"))
			c->models[i].pinned = 1;
		else if (!strcmp(value, "0") || !strcasecmp(value, "no") || !strcasecmp(value, "false") ||
			 !strcasecmp(value, "off"))
			c->models[i].pinned = 0;
		else {
			snprintf(err, errlen, "models.%s: '%s' is not a boolean", key, value);
			return -EINVAL;
		}
		return 0;
	}
	if (!strcmp(dot + 1, "keep_alive_s")) {
		if (parse_int(value, &x, 10) < 0 || x < -1 || x > 1 << 30) {
			snprintf(err, errlen, "models.%s: '%s' is not an integer in -1..%d", key, value, 1 << 30);
			return -EINVAL;
		}
		c->models[i].keep_alive_s = (int32_t)x;
		return 0;
	}
	if (!strcmp(dot + 1, "n_ctx")) {
		if (parse_int(value, &x, 10) < 0 || x < 0 || x > 1 << 20) {
			snprintf(err, errlen, "models.%s: '%s' is not an integer in 0..%d", key, value, 1 << 20);
			return -EINVAL;
		}
		c->models[i].n_ctx = (int32_t)x;
		return 0;
	}
	if (!strcmp(dot + 1, "pool_tokens")) {
		if (parse_int(value, &x, 10) < 0 || x < 0 || x > INT32_MAX) {
			snprintf(err, errlen, "models.%s: '%s' is not an integer in 0..%d", key, value, INT32_MAX);
			return -EINVAL;
		}
		c->models[i].pool_tokens = x;
		return 0;
	}
	if (!strcmp(dot + 1, "chat_template") || !strcmp(dot + 1, "draft_model")) {
		char *to = !strcmp(dot + 1, "chat_template") ? c->models[i].chat_template :
			   c->models[i].draft_model;
		if (strlen(value) >= sizeof c->models[i].chat_template) {
			snprintf(err, errlen, "models.%s: path longer than %zu bytes", key,
				 sizeof c->models[i].chat_template - 1);
			return -EINVAL;
		}
		snprintf(to, sizeof c->models[i].chat_template, "%s", value);
		return 0;
	}
	snprintf(err, errlen, "unknown option models.%s (a model takes NAME.pinned, NAME.keep_alive_s, "
		 "NAME.n_ctx, NAME.pool_tokens, NAME.chat_template and NAME.draft_model)", key);
	return -ENOENT;
}

/* [models] NAME = PATH: adds, replaces (the same name) or, with an empty
 * PATH, removes a model. */
static int apply_model(struct llmd_conf *c, const char *name, const char *path, char *err,
		       size_t errlen)
{
	const char *dot = strrchr(name, '.'); /* a name may have dots of its own */
	int32_t i;

	for (int k = 0; dot && model_settings[k]; k++)
		if (!strcmp(dot + 1, model_settings[k]))
			return apply_model_setting(c, name, path, err, errlen);
	if (!conf_model_name_ok(name)) {
		snprintf(err, errlen, "models.%s: a model's name is 1..%d letters, digits and . _ - :",
			 name, LLMD_MODEL_NAME_MAX);
		return -EINVAL;
	}
	if (strlen(path) >= sizeof c->models[0].path) {
		snprintf(err, errlen, "models.%s: path longer than %zu bytes", name,
			 sizeof c->models[0].path - 1);
		return -EINVAL;
	}
	for (i = 0; i < c->n_models && strcmp(c->models[i].name, name); i++)
		;
	if (!path[0]) {
		if (i < c->n_models) {
			memmove(&c->models[i], &c->models[i + 1],
				(size_t)(c->n_models - i - 1) * sizeof c->models[0]);
			c->n_models--;
		}
		return 0;
	}
	if (i == c->n_models) {
		if (c->n_models >= LLMD_MAX_MODELS - 1) {
			snprintf(err, errlen, "models.%s: llmd serves at most %d models (model.path and %d "
				 "more)", name, LLMD_MAX_MODELS, LLMD_MAX_MODELS - 1);
			return -EINVAL;
		}
		c->n_models++;
	}
	if (strcmp(c->models[i].name, name)) { /* a new one */
		c->models[i].pinned = 0;
		c->models[i].keep_alive_s = -2;
		c->models[i].n_ctx = -1;
		c->models[i].pool_tokens = -1;
		c->models[i].chat_template[0] = 0;
		c->models[i].draft_model[0] = 0;
	}
	snprintf(c->models[i].name, sizeof c->models[i].name, "%s", name);
	snprintf(c->models[i].path, sizeof c->models[i].path, "%s", path);
	return 0;
}

int conf_apply(struct llmd_conf *c, const char *section, const char *key, const char *value,
		 char *err, size_t errlen)
{
	const struct opt *o = NULL;
	char *field;
	int64_t x = 0;

	if (!strcmp(section, "models"))
		return apply_model(c, key, value, err, errlen);

	for (size_t i = 0; i < N_OPTS; i++)
		if (!strcmp(opts[i].section, section) && !strcmp(opts[i].key, key))
			o = &opts[i];
	if (!o) {
		const struct opt *n = nearest(section, key);
		if (n)
			snprintf(err, errlen, "unknown option %s.%s (did you mean %s.%s?)", section, key,
				 n->section, n->key);
		else
			snprintf(err, errlen, "unknown option %s.%s (llmd --print-config lists them all)",
				 section, key);
		return -ENOENT;
	}
	field = (char *)c + o->off;
	switch (o->type) {
	case OPT_STR:
		if (strlen(value) >= o->size) {
			snprintf(err, errlen, "%s.%s: value longer than %zu bytes", section, key, o->size - 1);
			return -EINVAL;
		}
		if (o->choices) {
			int ok = 0;
			for (const char *const *ch = o->choices; *ch; ch++)
				ok |= !strcmp(*ch, value);
			if (!ok) {
				char list[128] = "";
				for (const char *const *ch = o->choices; *ch; ch++) {
					size_t l = strlen(list);
					snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", *ch);
				}
				snprintf(err, errlen, "%s.%s: '%s' is not one of %s", section, key, value,
					 list);
				return -EINVAL;
			}
		}
		strcpy(field, value);
		return 0;
	case OPT_BOOL:
		if (!strcmp(value, "1") || !strcasecmp(value, "yes") || !strcasecmp(value, "true") ||
		    !strcasecmp(value, "on"))
			x = 1;
		else if (!strcmp(value, "0") || !strcasecmp(value, "no") ||
			 !strcasecmp(value, "false") || !strcasecmp(value, "off"))
			x = 0;
		else {
			snprintf(err, errlen, "%s.%s: '%s' is not a boolean", section, key, value);
			return -EINVAL;
		}
		*(int32_t *)field = (int32_t)x;
		return 0;
	case OPT_FRAC: {
		char *end;
		double f;
		errno = 0;
		f = strtod(value, &end);
		if (errno || end == value || *end || !(f > 0 && f <= 1)) {
			snprintf(err, errlen, "%s.%s: '%s' is not a fraction in (0, 1]", section, key, value);
			return -EINVAL;
		}
		*(double *)field = f;
		return 0;
	}
	case OPT_MODE:
	case OPT_INT:
	case OPT_I64:
		if (parse_int(value, &x, o->type == OPT_MODE ? 8 : 10) < 0 || x < o->min || x > o->max) {
			snprintf(err, errlen, "%s.%s: '%s' is not %s in %lld..%lld", section, key, value,
				 o->type == OPT_MODE ? "an octal mode" : "an integer", (long long)o->min,
				 (long long)o->max);
			return -EINVAL;
		}
		if (o->type == OPT_I64)
			*(int64_t *)field = x;
		else if (o->type == OPT_MODE)
			*(mode_t *)field = (mode_t)x;
		else
			*(int32_t *)field = (int32_t)x;
		return 0;
	}
	return -EINVAL;
}

struct load_ctx {
	struct llmd_conf *c;
	const char *path;
	char msg[256];           /* the first bad option */
	int rc;
};

/* inih reports the line of the first handler failure as its return value. */
static int on_ini(void *user, const char *section, const char *key, const char *value)
{
	struct load_ctx *l = user;

	if (l->rc)
		return 1;
	if (conf_apply(l->c, section, key, value, l->msg, sizeof l->msg) < 0) {
		l->rc = -EINVAL;
		return 0;
	}
	return 1;
}

int conf_load(struct llmd_conf *c, const char *path, char *err, size_t errlen)
{
	struct load_ctx l = { .c = c, .path = path };
	FILE *f = fopen(path, "re");
	int r;

	if (!f) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	r = ini_parse_file(f, on_ini, &l);
	fclose(f);
	if (l.rc) {
		snprintf(err, errlen, "%s:%d: %s", path, r, l.msg);
		return l.rc;
	}
	if (r != 0) {
		snprintf(err, errlen, "%s:%d: syntax error", path, r);
		return -EINVAL;
	}
	return 0;
}

int conf_set(struct llmd_conf *c, const char *assignment, char *err, size_t errlen)
{
	char section[32], key[64];
	const char *dot = strchr(assignment, '.'), *eq = strchr(assignment, '=');

	if (!dot || !eq || dot > eq || dot - assignment >= (ptrdiff_t)sizeof section ||
	    eq - dot - 1 >= (ptrdiff_t)sizeof key || dot == assignment || eq == dot + 1) {
		snprintf(err, errlen, "'%s' is not SECTION.KEY=VALUE", assignment);
		return -EINVAL;
	}
	memcpy(section, assignment, (size_t)(dot - assignment));
	section[dot - assignment] = 0;
	memcpy(key, dot + 1, (size_t)(eq - dot - 1));
	key[eq - dot - 1] = 0;
	return conf_apply(c, section, key, eq + 1, err, errlen) < 0 ? -EINVAL : 0;
}

int conf_check(const struct llmd_conf *c, char *err, size_t errlen)
{
	if (!c->model_path[0]) {
		snprintf(err, errlen, "no model: set model.path in the config or pass --model PATH");
		return -EINVAL;
	}
	if (!c->socket_path[0]) {
		snprintf(err, errlen, "server.socket is empty");
		return -EINVAL;
	}
	int drafts = c->spec_draft_model[0] != 0;
	for (int32_t i = 0; i < c->n_models; i++)
		drafts += c->models[i].draft_model[0] != 0;
	if (!strcmp(c->spec_mode, "draft") && !drafts) {
		snprintf(err, errlen, "spec.mode = draft needs spec.draft_model, a small GGUF model of "
			 "the default model's vocabulary (or a models.NAME.draft_model)");
		return -EINVAL;
	}
	if (c->model_name[0] && !conf_model_name_ok(c->model_name)) {
		snprintf(err, errlen, "model.name '%s': a model's name is 1..%d letters, digits and "
			 ". _ - :", c->model_name, LLMD_MODEL_NAME_MAX);
		return -EINVAL;
	}
	{
		char def[LLMD_MODEL_NAME_MAX + 1];
		if (c->model_name[0])
			snprintf(def, sizeof def, "%s", c->model_name);
		else
			conf_model_name_of(c->model_path, def, sizeof def);
		for (int32_t i = 0; i < c->n_models; i++)
			if (!strcmp(c->models[i].name, def)) {
				snprintf(err, errlen, "models.%s: that is the default model's name (model.path's; "
					 "set model.name to tell them apart)", def);
				return -EINVAL;
			}
	}
	if (c->ring_kib > c->ring_max_kib) {
		snprintf(err, errlen, "limits.ring_kib (%d) is over limits.ring_max_kib (%d)", c->ring_kib,
			 c->ring_max_kib);
		return -EINVAL;
	}
	if ((c->ring_kib & (c->ring_kib - 1)) || (c->ring_max_kib & (c->ring_max_kib - 1))) {
		snprintf(err, errlen, "limits.ring_kib and limits.ring_max_kib must be powers of two");
		return -EINVAL;
	}
	if (c->requests_per_connection > c->requests_per_uid) {
		snprintf(err, errlen, "limits.requests_per_connection (%d) is over limits.requests_per_uid "
			 "(%d): lower limits.requests_per_connection to at most %d, or raise "
			 "limits.requests_per_uid", c->requests_per_connection, c->requests_per_uid,
			 c->requests_per_uid);
		return -EINVAL;
	}
	return 0;
}

void conf_print(const struct llmd_conf *c, FILE *out)
{
	for (int32_t i = 0; i < c->n_models; i++) {
		fprintf(out, "models.%s = %s\n", c->models[i].name, c->models[i].path);
		fprintf(out, "models.%s.pinned = %d\n", c->models[i].name, c->models[i].pinned);
		if (c->models[i].keep_alive_s != -2)
			fprintf(out, "models.%s.keep_alive_s = %d\n", c->models[i].name,
				c->models[i].keep_alive_s);
		if (c->models[i].n_ctx >= 0)
			fprintf(out, "models.%s.n_ctx = %d\n", c->models[i].name, c->models[i].n_ctx);
		if (c->models[i].pool_tokens >= 0)
			fprintf(out, "models.%s.pool_tokens = %lld\n", c->models[i].name,
				(long long)c->models[i].pool_tokens);
		if (c->models[i].chat_template[0])
			fprintf(out, "models.%s.chat_template = %s\n", c->models[i].name,
				c->models[i].chat_template);
		if (c->models[i].draft_model[0])
			fprintf(out, "models.%s.draft_model = %s\n", c->models[i].name,
				c->models[i].draft_model);
	}
	for (size_t i = 0; i < N_OPTS; i++) {
		const struct opt *o = &opts[i];
		const char *field = (const char *)c + o->off;
		fprintf(out, "%s.%s = ", o->section, o->key);
		switch (o->type) {
		case OPT_STR:
			fprintf(out, "%s\n", field);
			break;
		case OPT_MODE:
			fprintf(out, "%04o\n", (unsigned)*(const mode_t *)field);
			break;
		case OPT_I64:
			fprintf(out, "%lld\n", (long long)*(const int64_t *)field);
			break;
		case OPT_INT:
		case OPT_BOOL:
			fprintf(out, "%d\n", *(const int32_t *)field);
			break;
		case OPT_FRAC:
			fprintf(out, "%g\n", *(const double *)field);
			break;
		}
	}
}
