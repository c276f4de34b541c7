/* chat.c - a conversation -> the prompt text: through the model's own Jinja
 * template (jinja.c runs it; here the messages become its context), or,
 * where the source does not compile, through the family its markers name,
 * rendered the way llama.cpp's llama_chat_apply_template does (plus
 * ChatML's built-in default system message).
 * Not the Jinja interpreter itself: that is jinja.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "chat.h"
#include "jinja.h"
#include "toolcall.h"

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static const struct {
	const char *name;    /* as chat_template_by_name takes it */
	enum chat_tmpl kind;
} chat_names[] = {
	{ "chatml", CHAT_TMPL_CHATML },
	{ "llama2", CHAT_TMPL_LLAMA2 },
	{ "llama3", CHAT_TMPL_LLAMA3 },
	{ "mistral", CHAT_TMPL_MISTRAL },
	{ "gemma", CHAT_TMPL_GEMMA },
	{ "zephyr", CHAT_TMPL_ZEPHYR },
};

#define N_CHAT_NAMES (sizeof chat_names / sizeof chat_names[0])

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

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* S without leading and trailing ASCII whitespace (llama.cpp's trim()). */
static void sb_put_trimmed(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	while (n && is_space(*s))
		s++, n--;
	while (n && is_space(s[n - 1]))
		n--;
	sb_put(b, s, n);
}

/* ---- recognising a template ---- */

static int has(const char *src, const char *marker)
{
	return strstr(src, marker) != NULL;
}

/* Decodes the Jinja string literal whose body starts at P and is closed by
 * QUOTE into a malloc'd *RET (NULL when the literal is unterminated).
 * Handles the escapes templates use (\n \t \r \\ \' \"); any other
 * backslash is kept as is.  Returns 0 or -ENOMEM. */
static int jinja_literal(const char *p, char quote, char **ret)
{
	const char *end = p;
	*ret = NULL;
	while (*end && *end != quote)
		end += end[0] == '\\' && end[1] ? 2 : 1;
	if (*end != quote)
		return 0;
	char *out = malloc((size_t)(end - p) + 1), *o = out;
	if (!out)
		return -ENOMEM;
	while (p < end) {
		if (*p != '\\') {
			*o++ = *p++;
			continue;
		}
		switch (p[1]) {
		case 'n': *o++ = '\n'; break;
		case 't': *o++ = '\t'; break;
		case 'r': *o++ = '\r'; break;
		case '\\': case '\'': case '"': *o++ = p[1]; break;
		default: *o++ = '\\'; *o++ = p[1]; break;
		}
		p += 2;
	}
	*o = '\0';
	*ret = out;
	return 0;
}

/* The system message a ChatML template writes when the conversation brings
 * none: a string literal that holds a whole system turn,
 * '<|im_start|>system\n...<|im_end|>', as SmolLM2's and Qwen2.5's do.  A
 * literal that ends right after the header (followed in the template by
 * + message['content']) is not one.  Sets *RET (NULL when there is none);
 * returns 0 or -ENOMEM. */
static int chatml_default_system(const char *src, char **ret)
{
	static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>";
	const size_t head_len = sizeof head - 1;
	*ret = NULL;
	for (const char *p = strstr(src, "<|im_start|>system"); p;
	     p = strstr(p + 1, "<|im_start|>system")) {
		if (p == src || (p[-1] != '\'' && p[-1] != '"'))
			continue; /* not the start of a literal */
		char *lit;
		if (jinja_literal(p, p[-1], &lit) < 0)
			return -ENOMEM;
		char *end = lit ? strstr(lit, tail) : NULL;
		if (end && strncmp(lit, head, head_len) == 0) {
			size_t n = (size_t)(end - lit) - head_len;
			memmove(lit, lit + head_len, n);
			lit[n] = '\0';
			*ret = lit;
			return 0;
		}
		free(lit);
	}
	return 0;
}

int chat_template_detect(const char *src, struct chat_template *ret)
{
	enum chat_tmpl kind;
	if (!ret)
		return -EINVAL;
	if (!src)
		return -ENOTSUP;

	/* The order follows llama.cpp's llm_chat_detect_template, so that a
	 * template carrying markers of two families lands where it does
	 * there.  Look-alikes we do not render are refused rather than
	 * rendered almost right. */
	if (has(src, "<|im_start|>")) {
		if (has(src, "<|im_sep|>") || has(src, "<end_of_utterance>"))
			return -ENOTSUP; /* Phi-4, SmolVLM */
		kind = CHAT_TMPL_CHATML;
	} else if (has(src, "[INST]")) {
		if (has(src, "[SYSTEM_PROMPT]") || has(src, "[AVAILABLE_TOOLS]") ||
		    has(src, "' [INST] ' + system_message"))
			return -ENOTSUP; /* Mistral v1 / v3 / v7: other spacing */
		kind = has(src, "<<SYS>>") ? CHAT_TMPL_LLAMA2 : CHAT_TMPL_MISTRAL;
	} else if (has(src, "<|user|>") && has(src, "<|assistant|>")) {
		if (has(src, "<|end|>") || has(src, "[gMASK]"))
			return -ENOTSUP; /* Phi-3, ChatGLM */
		kind = CHAT_TMPL_ZEPHYR;
	} else if (has(src, "<start_of_turn>")) {
		kind = CHAT_TMPL_GEMMA;
	} else if (has(src, "<|start_header_id|>")) {
		kind = CHAT_TMPL_LLAMA3;
	} else {
		return -ENOTSUP;
	}

	char *def = NULL;
	if (kind == CHAT_TMPL_CHATML) {
		int rc = chatml_default_system(src, &def);
		if (rc < 0)
			return rc;
	}
	memset(ret, 0, sizeof *ret);
	ret->kind = kind;
	ret->family = kind;
	ret->default_system = def;
	return 0;
}

static int dup_opt(const char *s, char **ret)
{
	*ret = NULL;
	if (s && !(*ret = strdup(s)))
		return -ENOMEM;
	return 0;
}

int chat_template_from_source(const char *src, const char *bos, const char *eos, int add_bos,
			      struct chat_template *ret, char *err, size_t errlen)
{
	struct chat_template t;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!ret)
		return -EINVAL;
	if (!src) {
		if (err && errlen)
			snprintf(err, errlen, "the model has no chat template");
		return -ENOTSUP;
	}
	/* the family too: what a failed compile falls back to, and a name */
	rc = chat_template_detect(src, &t);
	if (rc == -ENOTSUP)
		memset(&t, 0, sizeof t);
	else if (rc < 0)
		return rc;
	rc = jinja_compile(src, strlen(src), &t.jinja, err, errlen);
	if (rc == -ENOMEM) {
		chat_template_clear(&t);
		return rc;
	}
	if (rc < 0) { /* ERR keeps the compile error */
		if (!t.family)
			return -ENOTSUP;
		*ret = t;
		return 0;
	}
	free(t.default_system); /* the template writes its own */
	t.default_system = NULL;
	t.kind = CHAT_TMPL_JINJA;
	t.tool_style = toolcall_style_detect(src);
	t.strip_bos = add_bos && bos && *bos;
	if (dup_opt(bos, &t.bos) < 0 || dup_opt(eos, &t.eos) < 0) {
		chat_template_clear(&t);
		return -ENOMEM;
	}
	*ret = t;
	return 0;
}

int chat_template_by_name(const char *name, struct chat_template *ret)
{
	if (!ret)
		return -EINVAL;
	for (size_t i = 0; name && i < N_CHAT_NAMES; i++)
		if (strcmp(name, chat_names[i].name) == 0) {
			memset(ret, 0, sizeof *ret);
			ret->kind = chat_names[i].kind;
			ret->family = chat_names[i].kind;
			return 0;
		}
	return -ENOTSUP;
}

void chat_template_clear(struct chat_template *t)
{
	if (!t)
		return;
	free(t->default_system);
	jinja_free(t->jinja);
	free(t->bos);
	free(t->eos);
	memset(t, 0, sizeof *t);
}

static int kind_known(enum chat_tmpl kind)
{
	for (size_t i = 0; i < N_CHAT_NAMES; i++)
		if (chat_names[i].kind == kind)
			return 1;
	return 0;
}

const char *chat_template_name(enum chat_tmpl kind)
{
	if (kind == CHAT_TMPL_JINJA)
		return "jinja";
	for (size_t i = 0; i < N_CHAT_NAMES; i++)
		if (chat_names[i].kind == kind)
			return chat_names[i].name;
	return "unknown";
}

/* ---- rendering, one function per family ---- */

static void render_chatml(struct sbuf *b, const struct chat_template *t,
			  const struct chat_msg *msgs, const enum role *roles, int n,
			  int add_assistant)
{
	if (t->default_system && n > 0 && roles[0] != ROLE_SYSTEM) {
		sb_puts(b, "<|im_start|>system\n");
		sb_puts(b, t->default_system);
		sb_puts(b, "<|im_end|>\n");
	}
	for (int i = 0; i < n; i++) {
		sb_puts(b, "<|im_start|>");
		sb_puts(b, msgs[i].role);
		sb_puts(b, "\n");
		sb_puts(b, msgs[i].content);
		sb_puts(b, "<|im_end|>\n");
	}
	if (add_assistant)
		sb_puts(b, "<|im_start|>assistant\n");
}

/* Llama 2 with <<SYS>> (llama.cpp's "llama2-sys-strip", which is what it
 * picks for Meta's own template: contents trimmed) and Mistral's
 * [INST] format (llama.cpp's "llama2": a system message is prepended to the
 * first user turn, nothing trimmed).  The assistant's turn needs no opener:
 * the prompt already ends in "[/INST]". */
static void render_inst(struct sbuf *b, const struct chat_msg *msgs, const enum role *roles,
			int n, int llama2)
{
	int inside_turn = 1;
	sb_puts(b, "[INST] ");
	for (int i = 0; i < n; i++) {
		if (!inside_turn) {
			sb_puts(b, "[INST] ");
			inside_turn = 1;
		}
		if (roles[i] == ROLE_SYSTEM && llama2)
			sb_puts(b, "<<SYS>>\n");
		if (llama2)
			sb_put_trimmed(b, msgs[i].content);
		else
			sb_puts(b, msgs[i].content);
		if (roles[i] == ROLE_SYSTEM) {
			sb_puts(b, llama2 ? "\n<</SYS>>\n\n" : "\n");
		} else if (roles[i] == ROLE_USER) {
			sb_puts(b, " [/INST]");
		} else {
			sb_puts(b, "</s>");
			inside_turn = 0;
		}
	}
}

static void render_llama3(struct sbuf *b, const struct chat_msg *msgs, int n, int add_assistant)
{
	for (int i = 0; i < n; i++) {
		sb_puts(b, "<|start_header_id|>");
		sb_puts(b, msgs[i].role);
		sb_puts(b, "<|end_header_id|>\n\n");
		sb_put_trimmed(b, msgs[i].content);
		sb_puts(b, "<|eot_id|>");
	}
	if (add_assistant)
		sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma has no system role: system text (trimmed, concatenated) goes at the
 * top of the next user turn; "assistant" is called "model". */
static void render_gemma(struct sbuf *b, const struct chat_msg *msgs, const enum role *roles,
			 int n, int add_assistant)
{
	int pending = -1; /* first system message not yet written, or -1 */
	for (int i = 0; i < n; i++) {
		if (roles[i] == ROLE_SYSTEM) {
			if (pending < 0)
				pending = i;
			continue;
		}
		int model = roles[i] == ROLE_ASSISTANT;
		sb_puts(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
		if (pending >= 0 && !model) {
			size_t before = b->len;
			for (int j = pending; j < i; j++)
				if (roles[j] == ROLE_SYSTEM)
					sb_put_trimmed(b, msgs[j].content);
			if (b->len > before) /* llama.cpp skips an empty one */
				sb_puts(b, "\n\n");
			pending = -1;
		}
		sb_put_trimmed(b, msgs[i].content);
		sb_puts(b, "<end_of_turn>\n");
	}
	if (add_assistant)
		sb_puts(b, "<start_of_turn>model\n");
}

/* Zephyr ends every turn with the model's EOS; this is zephyr-7b-beta's,
 * "</s>" (llama.cpp writes "<|endoftext|>", StableLM 2 Zephyr's). */
static void render_zephyr(struct sbuf *b, const struct chat_msg *msgs, int n, int add_assistant)
{
	for (int i = 0; i < n; i++) {
		sb_puts(b, "<|");
		sb_puts(b, msgs[i].role);
		sb_puts(b, "|>\n");
		sb_puts(b, msgs[i].content);
		sb_puts(b, "</s>\n");
	}
	if (add_assistant)
		sb_puts(b, "<|assistant|>\n");
}

/* ---- rendering through the template's Jinja ---- */

/* The context the template sees: messages, add_generation_prompt,
 * bos_token and eos_token.  tools and documents are left undefined (not
 * None as Hugging Face passes them) while llmd has neither: templates that
 * iterate `tools` unguarded then still render. */
static json_object *jinja_context(const struct chat_template *t, const struct chat_msg *msgs, int n,
				  int add_assistant)
{
	json_object *ctx = json_object_new_object(), *list = json_object_new_array();
	if (!ctx || !list || json_object_object_add(ctx, "messages", list) < 0) {
		json_object_put(list);
		json_object_put(ctx);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		json_object *m = json_object_new_object(), *role, *content;
		if (!m || json_object_array_add(list, m) < 0) {
			json_object_put(m);
			goto fail;
		}
		role = json_object_new_string(msgs[i].role);
		if (!role || json_object_object_add(m, "role", role) < 0) {
			json_object_put(role);
			goto fail;
		}
		content = json_object_new_string_len(msgs[i].content, (int)strlen(msgs[i].content));
		if (!content || json_object_object_add(m, "content", content) < 0) {
			json_object_put(content);
			goto fail;
		}
	}
	struct { const char *key; json_object *v; } extra[] = {
		{ "add_generation_prompt", json_object_new_boolean(add_assistant != 0) },
		{ "bos_token", t->bos ? json_object_new_string(t->bos) : NULL },
		{ "eos_token", t->eos ? json_object_new_string(t->eos) : NULL },
	};
	int bad = 0;
	for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
		int wanted = i == 0 || (i == 1 ? t->bos != NULL : t->eos != NULL);
		if (wanted && (!extra[i].v || json_object_object_add(ctx, extra[i].key, extra[i].v) < 0)) {
			json_object_put(extra[i].v);
			bad = 1;
		}
	}
	if (bad)
		goto fail;
	return ctx;
fail:
	json_object_put(ctx);
	return NULL;
}

/* Runs T's Jinja on CTX; the text less a leading BOS where strip_bos. */
static int render_jinja_ctx(const struct chat_template *t, json_object *ctx, char **ret,
			    char *err, size_t errlen)
{
	/* the server renders on its event loop: a runaway template is cut
	 * after ~0.1 s (real ones take ~500 steps a message) */
	struct jinja_limits lim;
	jinja_limits_default(&lim);
	lim.max_steps = CHAT_JINJA_MAX_STEPS;
	char *out;
	size_t len;
	int rc = jinja_render(t->jinja, ctx, &lim, &out, &len, err, errlen);
	if (rc < 0)
		return rc == -ENOMEM || rc == -E2BIG ? rc : -EINVAL;
	size_t bos_len = t->strip_bos && t->bos ? strlen(t->bos) : 0;
	if (bos_len && len >= bos_len && memcmp(out, t->bos, bos_len) == 0) {
		memmove(out, out + bos_len, len - bos_len + 1);
		len -= bos_len;
	}
	if (len > INT_MAX) {
		free(out);
		return -EOVERFLOW;
	}
	*ret = out;
	return (int)len;
}

static int render_jinja(const struct chat_template *t, const struct chat_msg *msgs, int n,
			int add_assistant, char **ret, char *err, size_t errlen)
{
	for (int i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content || strlen(msgs[i].content) > INT_MAX)
			return -EINVAL;
	json_object *ctx = jinja_context(t, msgs, n, add_assistant);
	if (!ctx)
		return -ENOMEM;
	int rc = render_jinja_ctx(t, ctx, ret, err, errlen);
	json_object_put(ctx);
	return rc;
}

int chat_render(const struct chat_template *t, const struct chat_msg *msgs, int n,
		int add_assistant, char **ret)
{
	return chat_render_err(t, msgs, n, add_assistant, ret, NULL, 0);
}

int chat_render_err(const struct chat_template *t, const struct chat_msg *msgs, int n,
		    int add_assistant, char **ret, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!t || !ret || n < 0 || (n > 0 && !msgs))
		return -EINVAL;
	if (t->kind == CHAT_TMPL_JINJA && t->jinja)
		return render_jinja(t, msgs, n, add_assistant, ret, err, errlen);
	if (!kind_known(t->kind))
		return -ENOTSUP;

	enum role *roles = malloc(((size_t)n + 1) * sizeof *roles);
	if (!roles)
		return -ENOMEM;
	int rc = 0;
	for (int i = 0; i < n && rc == 0; i++) {
		const char *r = msgs[i].role;
		if (!r || !msgs[i].content)
			rc = -EINVAL;
		else if (strcmp(r, "system") == 0)
			roles[i] = ROLE_SYSTEM;
		else if (strcmp(r, "user") == 0)
			roles[i] = ROLE_USER;
		else if (strcmp(r, "assistant") == 0)
			roles[i] = ROLE_ASSISTANT;
		else
			rc = -EINVAL;
		/* [INST] formats fold the system text into the first turn:
		 * one system message, first, or the template would refuse */
		if (rc == 0 && i > 0 && roles[i] == ROLE_SYSTEM &&
		    (t->kind == CHAT_TMPL_LLAMA2 || t->kind == CHAT_TMPL_MISTRAL))
			rc = -EINVAL;
	}
	if (rc < 0) {
		free(roles);
		if (err && errlen)
			snprintf(err, errlen, "the %s template takes system, user and assistant messages, "
				 "and (llama2, mistral) one system message, first", chat_template_name(t->kind));
		return rc;
	}

	struct sbuf b = { 0 };
	sb_put(&b, "", 0); /* an empty conversation still gives a string */
	switch (t->kind) {
	case CHAT_TMPL_CHATML:
		render_chatml(&b, t, msgs, roles, n, add_assistant);
		break;
	case CHAT_TMPL_LLAMA2:
	case CHAT_TMPL_MISTRAL:
		render_inst(&b, msgs, roles, n, t->kind == CHAT_TMPL_LLAMA2);
		break;
	case CHAT_TMPL_LLAMA3:
		render_llama3(&b, msgs, n, add_assistant);
		break;
	case CHAT_TMPL_GEMMA:
		render_gemma(&b, msgs, roles, n, add_assistant);
		break;
	case CHAT_TMPL_ZEPHYR:
		render_zephyr(&b, msgs, n, add_assistant);
		break;
	case CHAT_TMPL_JINJA: /* without its compiled source: kind_known refused it */
		break;
	}
	free(roles);
	if (!b.err && b.len > INT_MAX)
		b.err = -EOVERFLOW;
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*ret = b.p;
	return (int)b.len;
}

/* ---- rendering an OpenAI-shaped conversation, tools included ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* O's string member KEY, or NULL. */
static const char *str_member(json_object *o, const char *key)
{
	json_object *v;
	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

static int role_is(json_object *m, const char *role)
{
	const char *r = str_member(m, "role");
	return r && strcmp(r, role) == 0;
}

/* The whole of S as one JSON value, or NULL. */
static json_object *parse_whole(const char *s, size_t len)
{
	struct json_tokener *tk = json_tokener_new_ex(TOOLCALL_JSON_DEPTH);
	json_object *o = NULL;
	size_t at = 0;

	if (!tk || len > INT_MAX)
		goto out;
	o = json_tokener_parse_ex(tk, s, (int)len);
	if (o && json_tokener_get_error(tk) == json_tokener_success)
		at = json_tokener_get_parse_end(tk);
	while (o && at < len && is_space(s[at]))
		at++;
	if (!o || at != len) {
		json_object_put(o);
		o = NULL;
	}
out:
	json_tokener_free(tk);
	return o;
}

/* messages[I]'s content as text, appended to B: a string, nothing for
 * null or absent, the "text" parts of an array joined by newlines. */
static int content_text(json_object *m, size_t i, struct sbuf *b, char *err, size_t errlen)
{
	json_object *c;

	if (!json_object_object_get_ex(m, "content", &c) || !c)
		return 0;
	if (json_object_is_type(c, json_type_string)) {
		sb_put(b, json_object_get_string(c), (size_t)json_object_get_string_len(c));
		return 0;
	}
	if (!json_object_is_type(c, json_type_array)) {
		set_err(err, errlen, "messages[%zu].content: not a string, null or an array of parts", i);
		return -EINVAL;
	}
	for (size_t k = 0; k < json_object_array_length(c); k++) {
		json_object *part = json_object_array_get_idx(c, k), *text;
		const char *type = str_member(part, "type");
		if (!type || strcmp(type, "text") != 0 || !json_object_object_get_ex(part, "text", &text) ||
		    !json_object_is_type(text, json_type_string)) {
			set_err(err, errlen, "messages[%zu].content[%zu]: only {\"type\": \"text\", "
				"\"text\": ...} parts are taken", i, k);
			return -EINVAL;
		}
		if (k)
			sb_puts(b, "\n");
		sb_put(b, json_object_get_string(text), (size_t)json_object_get_string_len(text));
	}
	return 0;
}

/* messages[I]'s tool_calls in *RET when it has some (1), 0 when it has
 * none (absent, null or empty), -EINVAL when they are not an array or too
 * many. */
static int tool_calls_of(json_object *m, size_t i, json_object **ret, char *err, size_t errlen)
{
	json_object *tc;

	if (!json_object_object_get_ex(m, "tool_calls", &tc) || !tc)
		return 0;
	if (!json_object_is_type(tc, json_type_array)) {
		set_err(err, errlen, "messages[%zu].tool_calls: not an array", i);
		return -EINVAL;
	}
	if (json_object_array_length(tc) > TOOLCALL_MAX_CALLS) {
		set_err(err, errlen, "messages[%zu].tool_calls: more than %u", i, TOOLCALL_MAX_CALLS);
		return -EINVAL;
	}
	*ret = tc;
	return json_object_array_length(tc) > 0;
}

/* Adds V (a new reference, NULL = out of memory) to O as KEY; 0 or
 * -ENOMEM (V freed). */
static int put_member(json_object *o, const char *key, json_object *v)
{
	if (!v || json_object_object_add(o, key, v) < 0) {
		json_object_put(v);
		return -ENOMEM;
	}
	return 0;
}

/* One tool call as Hugging Face's templates take it: {"id", "type",
 * "function": {"name", "arguments"}}, arguments an object (or whatever
 * JSON the string holds; the string itself when it holds none). */
static int hf_tool_call(json_object *call, size_t i, size_t k, json_object **ret, char *err,
			size_t errlen)
{
	json_object *fn = NULL, *args = NULL, *name;
	const char *id = str_member(call, "id");

	if (!json_object_object_get_ex(call, "function", &fn) ||
	    !json_object_object_get_ex(fn, "name", &name) ||
	    !json_object_is_type(name, json_type_string)) {
		set_err(err, errlen, "messages[%zu].tool_calls[%zu].function.name: not a string", i, k);
		return -EINVAL;
	}
	json_object_object_get_ex(fn, "arguments", &args);
	json_object *out = json_object_new_object(), *f = json_object_new_object(), *a;
	if (!out || !f) {
		json_object_put(out);
		json_object_put(f);
		return -ENOMEM;
	}
	if (json_object_is_type(args, json_type_string)) {
		a = parse_whole(json_object_get_string(args), (size_t)json_object_get_string_len(args));
		if (!a)
			a = json_object_get(args);
	} else {
		a = args ? json_object_get(args) : json_object_new_object();
	}
	int rc = put_member(f, "name", json_object_get(name));
	if (rc == 0)
		rc = put_member(f, "arguments", a);
	else
		json_object_put(a);
	if (id && rc == 0)
		rc = put_member(out, "id", json_object_new_string(id));
	if (rc == 0)
		rc = put_member(out, "type", json_object_new_string("function"));
	if (rc == 0)
		rc = put_member(out, "function", f);
	else
		json_object_put(f);
	if (rc < 0) {
		json_object_put(out);
		return rc;
	}
	*ret = out;
	return 0;
}

/* messages[I] as Hugging Face's templates take it: role, content a string,
 * tool_calls only when there are some, tool_call_id, name and
 * reasoning_content when they are strings. */
static int hf_message(json_object *m, size_t i, json_object **ret, char *err, size_t errlen)
{
	static const char *const copied[] = { "tool_call_id", "name", "reasoning_content" };
	struct sbuf text = { 0 };
	json_object *tc = NULL, *out = json_object_new_object();
	int rc;

	if (!out)
		return -ENOMEM;
	rc = put_member(out, "role", json_object_new_string(str_member(m, "role")));
	if (rc == 0)
		rc = content_text(m, i, &text, err, errlen);
	sb_put(&text, "", 0);
	if (rc == 0 && (rc = text.err) == 0)
		rc = put_member(out, "content", json_object_new_string_len(text.p, (int)text.len));
	free(text.p);
	for (size_t k = 0; rc == 0 && k < sizeof copied / sizeof copied[0]; k++) {
		const char *v = str_member(m, copied[k]);
		if (v)
			rc = put_member(out, copied[k], json_object_new_string(v));
	}
	if (rc == 0 && (rc = tool_calls_of(m, i, &tc, err, errlen)) == 1) {
		json_object *list = json_object_new_array();
		rc = put_member(out, "tool_calls", list);
		for (size_t k = 0; rc == 0 && k < json_object_array_length(tc); k++) {
			json_object *call;
			rc = hf_tool_call(json_object_array_get_idx(tc, k), i, k, &call, err, errlen);
			if (rc == 0 && json_object_array_add(list, call) < 0) {
				json_object_put(call);
				rc = -ENOMEM;
			}
		}
	}
	if (rc < 0) {
		json_object_put(out);
		return rc;
	}
	*ret = out;
	return 0;
}

/* The template renders tools and calls itself. */
static int render_native(const struct chat_template *t, json_object *messages, json_object *tools,
			 int add_assistant, char **ret, char *err, size_t errlen)
{
	json_object *ctx = jinja_context(t, NULL, 0, add_assistant), *list;
	int rc = 0;

	if (!ctx)
		return -ENOMEM;
	json_object_object_get_ex(ctx, "messages", &list);
	for (size_t i = 0; rc == 0 && i < json_object_array_length(messages); i++) {
		json_object *m;
		rc = hf_message(json_object_array_get_idx(messages, i), i, &m, err, errlen);
		if (rc == 0 && json_object_array_add(list, m) < 0) {
			json_object_put(m);
			rc = -ENOMEM;
		}
	}
	if (rc == 0 && tools && json_object_array_length(tools) > 0)
		rc = put_member(ctx, "tools", json_object_get(tools));
	if (rc == 0)
		rc = render_jinja_ctx(t, ctx, ret, err, errlen);
	json_object_put(ctx);
	return rc;
}

/* A conversation as plain messages, for templates that know no tools. */
struct plain {
	struct chat_msg *msgs; /* n of them; each content malloc'd (owned) */
	int n;
	int cap;               /* entries allocated */
};

static void plain_free(struct plain *p)
{
	for (int i = 0; i < p->n; i++)
		free((char *)p->msgs[i].content);
	free(p->msgs);
	memset(p, 0, sizeof *p);
}

/* Appends ROLE (a string that outlives P) with CONTENT (taken, NULL = out
 * of memory); with MERGE, into the last message when it has that role. */
static int plain_push(struct plain *p, const char *role, char *content, int merge)
{
	if (!content)
		return -ENOMEM;
	if (merge && p->n && strcmp(p->msgs[p->n - 1].role, role) == 0) {
		struct sbuf b = { 0 };
		sb_puts(&b, p->msgs[p->n - 1].content);
		sb_puts(&b, "\n\n");
		sb_puts(&b, content);
		free(content);
		if (b.err) {
			free(b.p);
			return b.err;
		}
		free((char *)p->msgs[p->n - 1].content);
		p->msgs[p->n - 1].content = b.p;
		return 0;
	}
	if (p->n == p->cap) {
		int cap = p->cap ? p->cap * 2 : 16;
		struct chat_msg *m = realloc(p->msgs, (size_t)cap * sizeof *m);
		if (!m) {
			free(content);
			return -ENOMEM;
		}
		p->msgs = m;
		p->cap = cap;
	}
	p->msgs[p->n].role = role;
	p->msgs[p->n].content = content;
	p->n++;
	return 0;
}

/* The name of the function that tool message I answers: its own "name",
 * else that of the earlier call with its tool_call_id, else "?". */
static const char *answered_name(json_object *messages, size_t i, const char *id)
{
	const char *name = str_member(json_object_array_get_idx(messages, i), "name");
	while (!name && id && i-- > 0) {
		json_object *tc, *fn;
		if (tool_calls_of(json_object_array_get_idx(messages, i), i, &tc, NULL, 0) != 1)
			continue;
		for (size_t k = 0; !name && k < json_object_array_length(tc); k++) {
			json_object *call = json_object_array_get_idx(tc, k);
			const char *cid = str_member(call, "id");
			if (cid && strcmp(cid, id) == 0 && json_object_object_get_ex(call, "function", &fn))
				name = str_member(fn, "name");
		}
	}
	return name ? name : "?";
}

/* How far the generic rendering bends the conversation to the template. */
enum bend {
	BEND_NONE,     /* tool results in the "tool" role, system kept */
	BEND_TOOL,     /* tool results as user turns; turns of one role merged */
	BEND_SYSTEM,   /* ... and system text folded into the user's turn */
};

/* MESSAGES as plain ones: SYS (GENERIC's system text, or NULL) added to the
 * system message, calls written as GENERIC's JSON, bent by BEND. */
static int plain_messages(json_object *messages, const char *sys, enum bend bend,
			  struct plain *p, char *err, size_t errlen)
{
	size_t n = json_object_array_length(messages);
	int merge = bend != BEND_NONE, rc = 0;
	const char *sys_role = bend == BEND_SYSTEM ? "user" : "system";

	if (sys && (n == 0 || !role_is(json_object_array_get_idx(messages, 0), "system")))
		rc = plain_push(p, sys_role, strdup(sys), merge);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		json_object *m = json_object_array_get_idx(messages, i), *tc;
		const char *role = str_member(m, "role");
		struct sbuf text = { 0 };
		sb_put(&text, "", 0);
		rc = content_text(m, i, &text, err, errlen);
		if (rc == 0 && i == 0 && sys && strcmp(role, "system") == 0) {
			sb_puts(&text, text.len ? "\n\n" : "");
			sb_puts(&text, sys);
		}
		if (rc == 0 && (rc = tool_calls_of(m, i, &tc, err, errlen)) == 1) {
			char *calls = NULL;
			char why[256];
			rc = text.err ? text.err : toolcall_generic_calls(tc, text.p, &calls, why, sizeof why);
			if (rc == -EINVAL || rc == -E2BIG)
				set_err(err, errlen, "messages[%zu].%s", i, why);
			free(text.p);
			size_t n_calls = calls ? strlen(calls) : 0;
			text = (struct sbuf){ .p = calls, .len = n_calls, .cap = calls ? n_calls + 1 : 0 };
		}
		if (rc == 0 && bend != BEND_NONE && strcmp(role, "tool") == 0) {
			const char *id = str_member(m, "tool_call_id");
			struct sbuf b = { 0 };
			sb_puts(&b, "Tool result");
			if (id) {
				sb_puts(&b, " for call ");
				sb_puts(&b, id);
			}
			sb_puts(&b, " (");
			sb_puts(&b, answered_name(messages, i, id));
			sb_puts(&b, "): ");
			sb_puts(&b, text.p ? text.p : "");
			free(text.p);
			text = b;
			role = "user";
		}
		if (strcmp(role, "system") == 0)
			role = sys_role;
		if (rc == 0)
			rc = text.err ? text.err : plain_push(p, role, text.p, merge);
		else
			free(text.p);
	}
	return rc;
}

/* 1 if the conversation carries anything about tools. */
static int has_tool_parts(json_object *messages, int has_tools)
{
	if (has_tools)
		return 1;
	for (size_t i = 0; i < json_object_array_length(messages); i++) {
		json_object *m = json_object_array_get_idx(messages, i), *tc;
		if (role_is(m, "tool") || tool_calls_of(m, i, &tc, NULL, 0) != 0)
			return 1;
	}
	return 0;
}

/* Templates that know no tools: the tools in the system text, calls as
 * GENERIC's JSON; bent further each time the template refuses. */
static int render_generic(const struct chat_template *t, json_object *messages, json_object *tools,
			  int add_assistant, char **ret, char *err, size_t errlen)
{
	int has_tools = tools && json_object_array_length(tools) > 0, rc = 0;
	char *sys = NULL;

	if (has_tools && (rc = toolcall_generic_system(tools, &sys, err, errlen)) < 0)
		return rc;
	/* a conversation without tools renders as chat_render_err does */
	enum bend last = has_tool_parts(messages, has_tools) ? BEND_SYSTEM : BEND_NONE;
	for (enum bend bend = BEND_NONE; bend <= last; bend++) {
		struct plain p = { 0 };
		rc = plain_messages(messages, sys, bend, &p, err, errlen);
		if (rc < 0) { /* a malformed message: bending won't cure it */
			plain_free(&p);
			break;
		}
		rc = chat_render_err(t, p.msgs, p.n, add_assistant, ret, err, errlen);
		plain_free(&p);
		if (rc != -EINVAL)
			break;
	}
	free(sys);
	return rc;
}

int chat_render_json(const struct chat_template *t, struct json_object *messages,
		     struct json_object *tools, int add_assistant, char **ret, char *err,
		     size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!t || !ret)
		return -EINVAL;
	if (!json_object_is_type(messages, json_type_array)) {
		set_err(err, errlen, "messages: not an array");
		return -EINVAL;
	}
	size_t n = json_object_array_length(messages);
	if (n > INT_MAX / 2) {
		set_err(err, errlen, "messages: too many");
		return -E2BIG;
	}
	for (size_t i = 0; i < n; i++) {
		json_object *m = json_object_array_get_idx(messages, i);
		if (!json_object_is_type(m, json_type_object) || !str_member(m, "role")) {
			set_err(err, errlen, "messages[%zu]: not an object with a string \"role\"", i);
			return -EINVAL;
		}
	}
	if (json_object_is_type(tools, json_type_null))
		tools = NULL;
	if (tools) {
		int rc = toolcall_tools_check(tools, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (t->kind == CHAT_TMPL_JINJA && t->jinja && t->tool_style != TOOLCALL_GENERIC)
		return render_native(t, messages, tools, add_assistant, ret, err, errlen);
	return render_generic(t, messages, tools, add_assistant, ret, err, errlen);
}
