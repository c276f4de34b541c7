/* toolcall.c - tool calls in the syntax a chat template asks for: style
 * detection, the grammar that forces a call, the parse of an output into
 * content and calls, GENERIC's system text.
 * Not the rendering of a conversation with tools (chat.c), nor ids, nor the
 * HTTP shapes around them (http.c).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "jschema.h"
#include "toolcall.h"

#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

static const char hermes_open[] = "<tool_call>", hermes_close[] = "</tool_call>";
static const char python_tag[] = "<|python_tag|>", mistral_tag[] = "[TOOL_CALLS]";

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* ---- output buffer ---- */

struct sbuf {
	char *p;    /* malloc'd, NUL-terminated when !err */
	size_t len; /* bytes used, without the NUL */
	size_t cap; /* bytes allocated */
	int err;    /* first failure (-ENOMEM); later puts are ignored */
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (b->cap - b->len <= n) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap - b->len <= n) {
			if (cap > SIZE_MAX / 2) {
				b->err = -ENOMEM;
				return;
			}
			cap *= 2;
		}
		char *p = realloc(b->p, cap);
		if (!p) {
			b->err = -ENOMEM;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_puts(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char buf[256];
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof buf) {
		if (!b->err)
			b->err = -EOVERFLOW; /* callers print names and numbers only */
		return;
	}
	sb_put(b, buf, (size_t)n);
}

/* Writes S as a JSON string literal. */
static void sb_put_json_string(struct sbuf *b, const char *s, size_t n)
{
	json_object *o = json_object_new_string_len(s, (int)n);
	if (!o) {
		b->err = b->err ? b->err : -ENOMEM;
		return;
	}
	sb_puts(b, json_object_to_json_string_ext(o, JSON_FLAGS));
	json_object_put(o);
}

/* Returns B's text (a string even when empty) and gives up ownership, or
 * NULL with B freed on failure. */
static char *sb_take(struct sbuf *b)
{
	sb_put(b, "", 0);
	if (b->err) {
		free(b->p);
		memset(b, 0, sizeof *b);
		return NULL;
	}
	char *p = b->p;
	memset(b, 0, sizeof *b);
	return p;
}

/* ---- small text helpers ---- */

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static size_t skip_space(const char *s, size_t len, size_t at)
{
	while (at < len && is_space(s[at]))
		at++;
	return at;
}

/* The first occurrence of the NUL-terminated NEEDLE in S[FROM, LEN), or
 * LEN when there is none (TEXT need not be NUL-terminated). */
static size_t find(const char *s, size_t len, size_t from, const char *needle)
{
	size_t n = strlen(needle);
	for (size_t i = from; i + n <= len; i++)
		if (s[i] == needle[0] && memcmp(s + i, needle, n) == 0)
			return i;
	return len;
}

static int has(const char *s, const char *marker)
{
	return strstr(s, marker) != NULL;
}

/* OpenAI's function names, [A-Za-z0-9_-]{1,64}, and dots. */
static int name_valid(const char *s, size_t n)
{
	if (n == 0 || n > TOOLCALL_MAX_NAME)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return 0;
	}
	return 1;
}

/* ---- detecting a template's style ---- */

enum toolcall_style toolcall_style_detect(const char *src)
{
	if (!src)
		return TOOLCALL_GENERIC;
	/* XML-argument dialects share the <tool_call> tag but not the JSON
	 * inside (Qwen3-Coder, Nemotron 3, GLM, Laguna): not ours */
	if (has(src, "<function=") || has(src, "<arg_key>") || has(src, "<parameter="))
		return TOOLCALL_GENERIC;
	if (has(src, hermes_open) && has(src, "\"name\": \""))
		return TOOLCALL_HERMES;
	if (has(src, mistral_tag))
		return has(src, "[ARGS]") ? TOOLCALL_GENERIC : TOOLCALL_MISTRAL;
	if (has(src, "<|start_header_id|>") && has(src, "tools") &&
	    has(src, "\"parameters\": ") && !has(src, "functools"))
		return TOOLCALL_LLAMA3;
	return TOOLCALL_GENERIC;
}

const char *toolcall_style_name(enum toolcall_style style)
{
	switch (style) {
	case TOOLCALL_GENERIC: return "generic";
	case TOOLCALL_HERMES: return "hermes";
	case TOOLCALL_LLAMA3: return "llama3";
	case TOOLCALL_MISTRAL: return "mistral";
	}
	return "unknown";
}

/* ---- a request's tools and tool_choice ---- */

int toolcall_choice_parse(struct json_object *tool_choice, enum toolcall_choice *ret_choice,
			  const char **ret_name, char *err, size_t errlen)
{
	static const struct { const char *s; enum toolcall_choice c; } words[] = {
		{ "auto", TOOLCALL_AUTO },
		{ "none", TOOLCALL_NONE },
		{ "required", TOOLCALL_REQUIRED },
	};
	json_object *type, *fn, *name;

	if (err && errlen)
		err[0] = '\0';
	if (!ret_choice || !ret_name)
		return -EINVAL;
	if (!tool_choice) {
		*ret_choice = TOOLCALL_AUTO;
		*ret_name = NULL;
		return 0;
	}
	if (json_object_is_type(tool_choice, json_type_string)) {
		const char *s = json_object_get_string(tool_choice);
		for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
			if (strcmp(s, words[i].s) == 0) {
				*ret_choice = words[i].c;
				*ret_name = NULL;
				return 0;
			}
		seterr(err, errlen, "tool_choice: expected \"auto\", \"none\", \"required\" or an object");
		return -EINVAL;
	}
	if (!json_object_is_type(tool_choice, json_type_object) ||
	    !json_object_object_get_ex(tool_choice, "type", &type) ||
	    !json_object_is_type(type, json_type_string) ||
	    strcmp(json_object_get_string(type), "function") != 0 ||
	    !json_object_object_get_ex(tool_choice, "function", &fn) ||
	    !json_object_object_get_ex(fn, "name", &name) ||
	    !json_object_is_type(name, json_type_string)) {
		seterr(err, errlen, "tool_choice: expected {\"type\": \"function\", \"function\": "
		       "{\"name\": ...}}");
		return -EINVAL;
	}
	*ret_choice = TOOLCALL_NAMED;
	*ret_name = json_object_get_string(name);
	return 0;
}

/* The "function" object of tools[I], or NULL with why in ERR. */
static json_object *tool_function(json_object *tools, size_t i, char *err, size_t errlen)
{
	json_object *tool = json_object_array_get_idx(tools, i), *type, *fn;

	if (!json_object_is_type(tool, json_type_object)) {
		seterr(err, errlen, "tools[%zu]: not an object", i);
		return NULL;
	}
	if (!json_object_object_get_ex(tool, "type", &type) ||
	    !json_object_is_type(type, json_type_string) ||
	    strcmp(json_object_get_string(type), "function") != 0) {
		seterr(err, errlen, "tools[%zu].type: expected \"function\"", i);
		return NULL;
	}
	if (!json_object_object_get_ex(tool, "function", &fn) ||
	    !json_object_is_type(fn, json_type_object)) {
		seterr(err, errlen, "tools[%zu].function: not an object", i);
		return NULL;
	}
	return fn;
}

/* A checked tool's function name. */
static const char *fn_name(json_object *fn)
{
	json_object *name;
	json_object_object_get_ex(fn, "name", &name);
	return json_object_get_string(name);
}

int toolcall_tools_check(struct json_object *tools, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!json_object_is_type(tools, json_type_array)) {
		seterr(err, errlen, "tools: not an array");
		return -EINVAL;
	}
	size_t n = json_object_array_length(tools);
	if (n > TOOLCALL_MAX_TOOLS) {
		seterr(err, errlen, "tools: %zu of them, more than the %u allowed", n,
		       TOOLCALL_MAX_TOOLS);
		return -E2BIG;
	}
	for (size_t i = 0; i < n; i++) {
		json_object *fn = tool_function(tools, i, err, errlen), *name, *params;
		if (!fn)
			return -EINVAL;
		if (!json_object_object_get_ex(fn, "name", &name) ||
		    !json_object_is_type(name, json_type_string)) {
			seterr(err, errlen, "tools[%zu].function.name: not a string", i);
			return -EINVAL;
		}
		const char *s = json_object_get_string(name);
		if (!name_valid(s, (size_t)json_object_get_string_len(name))) {
			seterr(err, errlen, "tools[%zu].function.name: \"%.80s\" is not 1 to %u of "
			       "A-Z a-z 0-9 _ - .", i, s, TOOLCALL_MAX_NAME);
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(fn_name(tool_function(tools, j, NULL, 0)), s) == 0) {
				seterr(err, errlen, "tools[%zu].function.name: \"%s\" is also tools[%zu]'s",
				       i, s, j);
				return -EINVAL;
			}
		if (json_object_object_get_ex(fn, "parameters", &params) &&
		    !json_object_is_type(params, json_type_object)) {
			seterr(err, errlen, "tools[%zu].function.parameters: not an object", i);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- the grammar of a forced call ---- */

static int is_word_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-';
}

/* Copies GBNF text with every rule name, defined or referenced, prefixed
 * by PREFIX: names are the words outside "literals", [classes], {counts}
 * and # comments (grammar.h's lexicon). */
static void put_prefixed(struct sbuf *b, const char *g, const char *prefix)
{
	const char *p = g;

	while (*p) {
		const char *q = p;
		char close = 0;
		if (*p == '"')
			close = '"';
		else if (*p == '[')
			close = ']';
		else if (*p == '{')
			close = '}';
		else if (*p == '#')
			close = '\n';
		if (close) {
			q++;
			while (*q && *q != close)
				q += q[0] == '\\' && q[1] && close != '\n' ? 2 : 1;
			if (*q)
				q++;
		} else if (is_word_char(*p)) {
			while (is_word_char(*q))
				q++;
			sb_puts(b, prefix);
		} else {
			q++;
		}
		sb_put(b, p, (size_t)(q - p));
		p = q;
	}
}

/* The literal that opens and the one that closes tool I's call in STYLE;
 * the arguments' rule goes between. */
static void put_call_rule(struct sbuf *b, enum toolcall_style style, size_t i, const char *name)
{
	const char *args_key = style == TOOLCALL_LLAMA3 ? "parameters" : "arguments";

	sb_printf(b, "tc-%zu ::= \"", i);
	if (style == TOOLCALL_HERMES)
		sb_puts(b, "<tool_call>\\n");
	sb_printf(b, "{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" t%zu-root \"", name, args_key, i);
	/* Mistral's template gives each call a 9-character id, which the
	 * model learned to write (llama.cpp's grammar requires it too) */
	if (style == TOOLCALL_MISTRAL)
		sb_puts(b, ", \\\"id\\\": \\\"\" [a-zA-Z0-9]{9} \"\\\"");
	sb_puts(b, "}");
	if (style == TOOLCALL_HERMES)
		sb_puts(b, "\\n</tool_call>");
	sb_puts(b, "\"\n");
}

/* The root rule: one call or, with PARALLEL, up to TOOLCALL_MAX_CALLS,
 * separated and wrapped as STYLE's template writes them. */
static void put_root_rule(struct sbuf *b, enum toolcall_style style, int parallel, const char *rule)
{
	const char *open = "", *sep = "\\n", *close = "";

	if (style == TOOLCALL_MISTRAL) {
		open = "\"[\" ";
		sep = ", ";
		close = " \"]\"";
	} else if (style == TOOLCALL_GENERIC) {
		open = "\"{\\\"tool_calls\\\": [\" ";
		sep = ", ";
		close = " \"]}\"";
	}
	if (style == TOOLCALL_LLAMA3)
		parallel = 0;
	sb_printf(b, "%s ::= %stc-call", rule, open);
	if (parallel)
		sb_printf(b, " (\"%s\" tc-call){0,%u}", sep, TOOLCALL_MAX_CALLS - 1);
	sb_printf(b, "%s\n", close);
}

/* Appends the renamed grammar of tool I's parameters.  0 or a negative
 * errno with "tool NAME: parameters: ..." in ERR. */
static int put_params(struct sbuf *b, json_object *fn, size_t i, char *err, size_t errlen)
{
	json_object *params = NULL, *any = NULL;
	/* Strict always: a call names the function's parameters and no others
	 * (without it a schema's open objects let a small model pile up keys
	 * of its own until max_tokens; "strict": true changes nothing more). */
	unsigned flags = JSCHEMA_STRICT;
	char jerr[512], prefix[32], *gbnf = NULL;

	if (!json_object_object_get_ex(fn, "parameters", &params)) {
		/* OpenAI: no parameters = a function of no arguments: {} */
		any = json_tokener_parse("{\"type\": \"object\"}");
		if (!any)
			return -ENOMEM;
		params = any;
	}
	jerr[0] = '\0';
	int rc = jschema_to_gbnf(params, flags, &gbnf, jerr, sizeof jerr);
	json_object_put(any);
	if (rc < 0) {
		if (rc != -ENOMEM)
			seterr(err, errlen, "tool %s: parameters: %s", fn_name(fn), jerr);
		return rc;
	}
	snprintf(prefix, sizeof prefix, "t%zu-", i);
	put_prefixed(b, gbnf, prefix);
	if (b->len && b->p[b->len - 1] != '\n')
		sb_puts(b, "\n");
	free(gbnf);
	return 0;
}

int toolcall_grammar(enum toolcall_style style, struct json_object *tools,
		     enum toolcall_choice choice, const char *name, int parallel, char **ret_gbnf,
		     char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!ret_gbnf || (unsigned)style > TOOLCALL_MISTRAL)
		return -EINVAL;
	if (choice == TOOLCALL_NONE || (choice == TOOLCALL_AUTO && style != TOOLCALL_GENERIC)) {
		*ret_gbnf = NULL;
		return 0;
	}
	if (choice != TOOLCALL_REQUIRED && choice != TOOLCALL_NAMED && choice != TOOLCALL_AUTO)
		return -EINVAL;
	int rc = toolcall_tools_check(tools, err, errlen);
	if (rc < 0)
		return rc;
	size_t n = json_object_array_length(tools);
	if (n == 0) {
		seterr(err, errlen, "tool_choice: %s, but there are no tools",
		       choice == TOOLCALL_NAMED ? "a named function" : "required");
		return -EINVAL;
	}
	size_t only = SIZE_MAX;
	if (choice == TOOLCALL_NAMED) {
		for (size_t i = 0; name && i < n && only == SIZE_MAX; i++)
			if (strcmp(fn_name(tool_function(tools, i, NULL, 0)), name) == 0)
				only = i;
		if (only == SIZE_MAX) {
			seterr(err, errlen, "tool_choice: function \"%.80s\" is not among the tools",
			       name ? name : "(null)");
			return -EINVAL;
		}
	}

	/* a named function is called once (OpenAI's forced call); several
	 * calls of it would only repeat it */
	if (choice == TOOLCALL_NAMED)
		parallel = 0;
	struct sbuf b = { 0 };
	if (choice == TOOLCALL_AUTO) {
		/* GENERIC's answer without a call, as its system text asks:
		 * {"response": "..."} (toolcall_parse makes it the content) */
		sb_puts(&b, "root ::= tc-calls | \"{\\\"response\\\": \" tc-string \"}\"\n"
			    "tc-string ::= \"\\\"\" ([^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" "
			    "([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))* \"\\\"\"\n");
		put_root_rule(&b, style, parallel, "tc-calls");
	} else {
		put_root_rule(&b, style, parallel, "root");
	}
	sb_puts(&b, "tc-call ::= ");
	for (size_t i = 0, first = 1; i < n; i++)
		if (only == SIZE_MAX || i == only) {
			sb_printf(&b, "%stc-%zu", first ? "" : " | ", i);
			first = 0;
		}
	sb_puts(&b, "\n");
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (only != SIZE_MAX && i != only)
			continue;
		json_object *fn = tool_function(tools, i, NULL, 0);
		put_call_rule(&b, style, i, fn_name(fn));
		rc = put_params(&b, fn, i, err, errlen);
	}
	char *out = sb_take(&b);
	if (rc < 0 || !out) {
		free(out);
		return rc < 0 ? rc : -ENOMEM;
	}
	*ret_gbnf = out;
	return 0;
}

/* ---- parsing an output ---- */

struct calls {
	struct toolcall *v; /* n of them, malloc'd */
	int n;
};

static void calls_free(struct calls *c)
{
	for (int i = 0; i < c->n; i++) {
		free(c->v[i].name);
		free(c->v[i].arguments);
	}
	free(c->v);
	memset(c, 0, sizeof *c);
}

/* Drops the calls past the first N. */
static void calls_truncate(struct calls *c, int n)
{
	while (c->n > n) {
		c->n--;
		free(c->v[c->n].name);
		free(c->v[c->n].arguments);
	}
}

/* Parses one JSON value at S[AT, LEN) after whitespace; the value (the
 * caller's reference) and where it ended in *RET_END, or NULL when no
 * whole value starts there. */
static json_object *json_at(const char *s, size_t len, size_t at, size_t *ret_end)
{
	at = skip_space(s, len, at);
	if (at >= len || (s[at] != '{' && s[at] != '['))
		return NULL;
	struct json_tokener *tk = json_tokener_new_ex(TOOLCALL_JSON_DEPTH);
	if (!tk)
		return NULL;
	size_t n = len - at;
	if (n > INT32_MAX)
		n = INT32_MAX;
	json_object *o = json_tokener_parse_ex(tk, s + at, (int)n);
	if (o && json_tokener_get_error(tk) == json_tokener_success)
		*ret_end = at + json_tokener_get_parse_end(tk);
	else {
		json_object_put(o);
		o = NULL;
	}
	json_tokener_free(tk);
	return o;
}

/* 1 if O holds only what JSON can write (json-c also reads NaN and
 * Infinity). */
static int json_finite(json_object *o, int depth)
{
	if (depth > TOOLCALL_JSON_DEPTH)
		return 0;
	switch (json_object_get_type(o)) {
	case json_type_double:
		return isfinite(json_object_get_double(o));
	case json_type_array:
		for (size_t i = 0; i < json_object_array_length(o); i++)
			if (!json_finite(json_object_array_get_idx(o, i), depth + 1))
				return 0;
		return 1;
	case json_type_object: {
		json_object_object_foreach(o, k, v) {
			(void)k;
			if (!json_finite(v, depth + 1))
				return 0;
		}
		return 1;
	}
	default:
		return 1;
	}
}

static int tools_have(json_object *tools, const char *name)
{
	size_t n = json_object_is_type(tools, json_type_array) ? json_object_array_length(tools) : 0;
	for (size_t i = 0; i < n; i++) {
		json_object *tool = json_object_array_get_idx(tools, i), *fn, *nm;
		if (json_object_object_get_ex(tool, "function", &fn) &&
		    json_object_object_get_ex(fn, "name", &nm) &&
		    json_object_is_type(nm, json_type_string) &&
		    strcmp(json_object_get_string(nm), name) == 0)
			return 1;
	}
	return 0;
}

/* Adds the call that O describes ({"name", ARGS_KEY or "arguments" or
 * "parameters"}, or OpenAI's {"function": {...}}) to C.  1 when O is one,
 * 0 when not, -ENOMEM, -E2BIG past TOOLCALL_MAX_CALLS. */
static int add_call(struct calls *c, json_object *o, json_object *tools)
{
	json_object *name, *args = NULL, *fn, *parsed = NULL;

	if (!json_object_is_type(o, json_type_object))
		return 0;
	if (!json_object_object_get_ex(o, "name", &name) &&
	    json_object_object_get_ex(o, "function", &fn) &&
	    json_object_is_type(fn, json_type_object))
		o = fn;
	if (!json_object_object_get_ex(o, "name", &name) ||
	    !json_object_is_type(name, json_type_string) ||
	    !name_valid(json_object_get_string(name), (size_t)json_object_get_string_len(name)) ||
	    (tools && !tools_have(tools, json_object_get_string(name))))
		return 0;
	if (!json_object_object_get_ex(o, "arguments", &args))
		json_object_object_get_ex(o, "parameters", &args);
	if (json_object_is_type(args, json_type_string)) {
		/* some models write the arguments as a JSON string */
		const char *s = json_object_get_string(args);
		size_t end, len = (size_t)json_object_get_string_len(args);
		parsed = json_at(s, len, 0, &end);
		if (!parsed || skip_space(s, len, end) != len) {
			json_object_put(parsed);
			return 0;
		}
		args = parsed;
	}
	if (args && (!json_object_is_type(args, json_type_object) || !json_finite(args, 0))) {
		json_object_put(parsed);
		return 0;
	}
	if (c->n >= (int)TOOLCALL_MAX_CALLS) {
		json_object_put(parsed);
		return -E2BIG;
	}
	struct toolcall *v = realloc(c->v, ((size_t)c->n + 1) * sizeof *v);
	if (!v) {
		json_object_put(parsed);
		return -ENOMEM;
	}
	c->v = v;
	v[c->n].name = strdup(json_object_get_string(name));
	v[c->n].arguments = strdup(args ? json_object_to_json_string_ext(args, JSON_FLAGS) : "{}");
	json_object_put(parsed);
	c->n++;
	if (!v[c->n - 1].name || !v[c->n - 1].arguments)
		return -ENOMEM;
	return 1;
}

/* Adds every element of the array A as a call: 1 when all are calls (and
 * there is at least one), else 0 with C as it was. */
static int add_call_array(struct calls *c, json_object *a, json_object *tools)
{
	int n0 = c->n;
	size_t n = json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		int rc = add_call(c, json_object_array_get_idx(a, i), tools);
		if (rc <= 0) {
			calls_truncate(c, n0);
			return rc;
		}
	}
	return 1;
}

/* Calls in a <tool_call> block each, as many blocks as there are. */
static int parse_hermes(const char *s, size_t len, json_object *tools, struct calls *c,
			struct sbuf *content)
{
	const size_t open_len = sizeof hermes_open - 1, close_len = sizeof hermes_close - 1;
	size_t pos = 0, at = find(s, len, 0, hermes_open);

	while (at < len) {
		size_t end, next = at + open_len;
		json_object *o = json_at(s, len, next, &end);
		int rc = 0;
		if (o) {
			end = skip_space(s, len, end);
			if (len - end >= close_len && memcmp(s + end, hermes_close, close_len) == 0)
				end += close_len;
			else if (end != len) /* an unclosed block only at the end */
				end = SIZE_MAX;
			if (end != SIZE_MAX)
				rc = add_call(c, o, tools);
			json_object_put(o);
		}
		if (rc < 0)
			return rc;
		if (rc == 1) {
			sb_put(content, s + pos, at - pos);
			pos = next = end;
		}
		at = find(s, len, next, hermes_open);
	}
	sb_put(content, s + pos, len - pos);
	return 0;
}

/* Calls after a MARKER (a control token's text), as JSON values that
 * READ turns into calls; or, with no marker, the whole text when it is
 * calls from its first character on. */
static int parse_marked(const char *s, size_t len, const char *marker, json_object *tools,
			int (*read)(const char *, size_t, size_t, json_object *, struct calls *,
				    size_t *),
			struct calls *c, struct sbuf *content)
{
	size_t pos = 0, at = find(s, len, 0, marker), mlen = strlen(marker), end;

	if (at == len) {
		int n0 = c->n, rc = read(s, len, 0, tools, c, &end);
		if (rc < 0)
			return rc;
		if (rc == 0 || skip_space(s, len, end) != len) {
			calls_truncate(c, n0); /* text that merely starts like a call */
			sb_put(content, s, len);
		}
		return 0;
	}
	while (at < len) {
		int rc = read(s, len, at + mlen, tools, c, &end);
		if (rc < 0)
			return rc;
		if (rc == 1) {
			sb_put(content, s + pos, at - pos);
			pos = end;
		}
		at = find(s, len, rc == 1 ? end : at + mlen, marker);
	}
	sb_put(content, s + pos, len - pos);
	return 0;
}

/* Llama 3: JSON objects, separated by whitespace or ';'.  1 and the end
 * of the last in *RET_END, or 0 when S[AT..] does not start with one. */
static int read_llama3(const char *s, size_t len, size_t at, json_object *tools, struct calls *c,
		       size_t *ret_end)
{
	int n0 = c->n, rc = 0;

	for (;;) {
		size_t end, next = at;
		if (c->n > n0) {
			next = skip_space(s, len, next);
			if (next < len && s[next] == ';')
				next++;
		}
		json_object *o = json_at(s, len, next, &end);
		if (!o)
			break;
		rc = add_call(c, o, tools);
		json_object_put(o);
		if (rc <= 0)
			break;
		at = end;
	}
	if (rc < 0)
		return rc;
	*ret_end = at;
	return c->n > n0;
}

/* Mistral: one JSON array of calls. */
static int read_mistral(const char *s, size_t len, size_t at, json_object *tools, struct calls *c,
			size_t *ret_end)
{
	size_t end;
	json_object *a = json_at(s, len, at, &end);
	int rc = a ? add_call_array(c, a, tools) : 0;
	json_object_put(a);
	if (rc == 1)
		*ret_end = end;
	return rc;
}

/* GENERIC: the whole output is one JSON object (perhaps in a ``` fence). */
static int parse_generic(const char *s, size_t len, json_object *tools, struct calls *c,
			 struct sbuf *content)
{
	size_t at = skip_space(s, len, 0), stop = len, end;
	json_object *o, *v, *said = NULL;
	int rc = 0;

	while (stop > at && is_space(s[stop - 1]))
		stop--;
	if (stop - at >= 6 && memcmp(s + at, "```", 3) == 0 && memcmp(s + stop - 3, "```", 3) == 0) {
		size_t nl = find(s, stop - 3, at, "\n");
		if (nl < stop - 3) {
			at = nl + 1;
			stop -= 3;
		}
	}
	o = json_at(s, stop, at, &end);
	if (o && end == stop && json_object_is_type(o, json_type_object)) {
		if (json_object_object_get_ex(o, "tool_calls", &v))
			rc = add_call_array(c, v, tools);
		else if (json_object_object_get_ex(o, "tool_call", &v))
			rc = add_call(c, v, tools);
		if (!json_object_object_get_ex(o, "response", &said))
			json_object_object_get_ex(o, "content", &said);
		if (rc == 0 && !json_object_object_get_ex(o, "response", NULL))
			said = NULL; /* some other JSON: the content as written */
		else if (rc == 1 && said && json_object_is_type(said, json_type_null))
			said = NULL;
	}
	if (rc >= 0 && (rc == 1 || said)) {
		if (json_object_is_type(said, json_type_string))
			sb_put(content, json_object_get_string(said),
			       (size_t)json_object_get_string_len(said));
		else if (said)
			sb_puts(content, json_object_to_json_string_ext(said, JSON_FLAGS));
	} else if (rc >= 0) {
		sb_put(content, s, len);
	}
	json_object_put(o);
	return rc < 0 ? rc : 0;
}

/* Trims ASCII whitespace around B's text. */
static void sb_trim(struct sbuf *b)
{
	size_t at = 0;
	if (b->err || !b->p)
		return;
	while (at < b->len && is_space(b->p[at]))
		at++;
	while (b->len > at && is_space(b->p[b->len - 1]))
		b->len--;
	memmove(b->p, b->p + at, b->len - at);
	b->len -= at;
	b->p[b->len] = '\0';
}

int toolcall_parse(enum toolcall_style style, const char *text, size_t len,
		   struct json_object *tools, struct toolcall_result *ret, char *err,
		   size_t errlen)
{
	struct calls c = { 0 };
	struct sbuf content = { 0 };
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!ret || (!text && len) || (unsigned)style > TOOLCALL_MISTRAL)
		return -EINVAL;
	if (len > TOOLCALL_MAX_TEXT) {
		seterr(err, errlen, "output of %zu bytes, more than the %u a tool call parse takes",
		       len, TOOLCALL_MAX_TEXT);
		return -E2BIG;
	}
	if (!text)
		text = "";
	switch (style) {
	case TOOLCALL_HERMES:
		rc = parse_hermes(text, len, tools, &c, &content);
		break;
	case TOOLCALL_LLAMA3:
		rc = parse_marked(text, len, python_tag, tools, read_llama3, &c, &content);
		break;
	case TOOLCALL_MISTRAL:
		rc = parse_marked(text, len, mistral_tag, tools, read_mistral, &c, &content);
		break;
	default:
		rc = parse_generic(text, len, tools, &c, &content);
		break;
	}
	if (rc == -E2BIG)
		seterr(err, errlen, "more than %u tool calls in one output", TOOLCALL_MAX_CALLS);
	if (rc == 0 && c.n > 0)
		sb_trim(&content);
	size_t content_len = content.len;
	char *s = sb_take(&content);
	if (rc == 0 && !s)
		rc = -ENOMEM;
	if (rc < 0) {
		free(s);
		calls_free(&c);
		return rc;
	}
	ret->content = s;
	ret->content_len = content_len;
	ret->calls = c.v;
	ret->n_calls = c.n;
	return c.n;
}

void toolcall_result_clear(struct toolcall_result *r)
{
	if (!r)
		return;
	struct calls c = { r->calls, r->n_calls };
	calls_free(&c);
	free(r->content);
	memset(r, 0, sizeof *r);
}

/* ---- streaming ---- */

/* Where MARKER first starts in S, or where a prefix of it runs to the end
 * of S: what may be shown before a call can begin. */
static size_t marker_safe(const char *s, size_t len, const char *marker)
{
	size_t at = find(s, len, 0, marker), n = strlen(marker);
	if (at < len)
		return at;
	for (size_t k = n - 1 < len ? n - 1 : len; k > 0; k--)
		if (memcmp(s + len - k, marker, k) == 0)
			return len - k;
	return len;
}

size_t toolcall_stream_safe(enum toolcall_style style, const char *text, size_t len)
{
	if (!text)
		return 0;
	size_t first = skip_space(text, len, 0);
	/* styles whose calls may be the whole output: the start decides */
	int whole = first == len || (style == TOOLCALL_LLAMA3 && text[first] == '{') ||
		    (style == TOOLCALL_MISTRAL && text[first] == '[') ||
		    (style == TOOLCALL_GENERIC && (text[first] == '{' || text[first] == '`'));
	if (whole && style != TOOLCALL_HERMES)
		return 0;
	switch (style) {
	case TOOLCALL_HERMES: return marker_safe(text, len, hermes_open);
	case TOOLCALL_LLAMA3: return marker_safe(text, len, python_tag);
	case TOOLCALL_MISTRAL: return marker_safe(text, len, mistral_tag);
	default: return len;
	}
}

/* ---- GENERIC's prompt ---- */

int toolcall_generic_system(struct json_object *tools, char **ret, char *err, size_t errlen)
{
	if (!ret)
		return -EINVAL;
	int rc = toolcall_tools_check(tools, err, errlen);
	if (rc < 0)
		return rc;
	struct sbuf b = { 0 };
	sb_puts(&b, "You can call the following tools, given as JSON, one a line:\n");
	for (size_t i = 0; i < json_object_array_length(tools); i++) {
		json_object *fn = tool_function(tools, i, NULL, 0), *o = json_object_new_object();
		static const char *const keys[] = { "name", "description", "parameters" };
		if (!o) {
			b.err = -ENOMEM;
			break;
		}
		for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
			json_object *v;
			if (json_object_object_get_ex(fn, keys[k], &v) &&
			    json_object_object_add(o, keys[k], json_object_get(v)) < 0) {
				json_object_put(v);
				b.err = -ENOMEM;
			}
		}
		sb_puts(&b, json_object_to_json_string_ext(o, JSON_FLAGS));
		sb_puts(&b, "\n");
		json_object_put(o);
	}
	sb_puts(&b, "\nTo call tools, reply with only this JSON object, one entry for each call, "
		"and nothing else:\n{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": "
		"{<the arguments, as the tool's parameters say>}}]}\n"
		"Otherwise, reply to the user as usual.");
	char *out = sb_take(&b);
	if (!out)
		return -ENOMEM;
	*ret = out;
	return 0;
}

int toolcall_generic_calls(struct json_object *tool_calls, const char *content, char **ret,
			   char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!ret)
		return -EINVAL;
	if (!json_object_is_type(tool_calls, json_type_array)) {
		seterr(err, errlen, "tool_calls: not an array");
		return -EINVAL;
	}
	size_t n = json_object_array_length(tool_calls);
	if (n > TOOLCALL_MAX_CALLS) {
		seterr(err, errlen, "tool_calls: %zu of them, more than the %u allowed", n,
		       TOOLCALL_MAX_CALLS);
		return -E2BIG;
	}
	struct sbuf b = { 0 };
	sb_puts(&b, "{\"tool_calls\": [");
	for (size_t i = 0; i < n; i++) {
		json_object *call = json_object_array_get_idx(tool_calls, i), *fn = call, *name, *args;
		if (json_object_is_type(call, json_type_object))
			json_object_object_get_ex(call, "function", &fn);
		if (!json_object_object_get_ex(fn, "name", &name) ||
		    !json_object_is_type(name, json_type_string)) {
			seterr(err, errlen, "tool_calls[%zu].function.name: not a string", i);
			free(b.p);
			return -EINVAL;
		}
		sb_puts(&b, i ? ", {\"name\": " : "{\"name\": ");
		sb_put_json_string(&b, json_object_get_string(name),
				   (size_t)json_object_get_string_len(name));
		sb_puts(&b, ", \"arguments\": ");
		if (!json_object_object_get_ex(fn, "arguments", &args) || !args) {
			sb_puts(&b, "{}");
		} else if (json_object_is_type(args, json_type_string)) {
			const char *s = json_object_get_string(args);
			size_t end, len = (size_t)json_object_get_string_len(args);
			json_object *o = json_at(s, len, 0, &end);
			if (o && skip_space(s, len, end) == len && json_finite(o, 0))
				sb_puts(&b, json_object_to_json_string_ext(o, JSON_FLAGS));
			else
				sb_put_json_string(&b, s, len);
			json_object_put(o);
		} else {
			sb_puts(&b, json_object_to_json_string_ext(args, JSON_FLAGS));
		}
		sb_puts(&b, "}");
	}
	sb_puts(&b, "]");
	if (content && *content) {
		sb_puts(&b, ", \"content\": ");
		sb_put_json_string(&b, content, strlen(content));
	}
	sb_puts(&b, "}");
	char *out = sb_take(&b);
	if (!out)
		return -ENOMEM;
	*ret = out;
	return 0;
}
