/* test_toolcall.c - pins tool calling (daemon/engine/toolcall.c) and
 * chat_render_json (chat.c): the style each real template of
 * tests/templates/ gets; a weather conversation with tools, calls and a
 * result rendered by the tool-aware templates byte for byte as Python's
 * jinja2 renders the Hugging Face-shaped conversation (through
 * tests/toolcall_jinja2.py); GENERIC's rendering for templates that know no
 * tools (SmolLM2, Gemma 2, the C families); the forced-call grammars of
 * each style take the calls the templates write and refuse a wrong name, a
 * missing required argument, a wrong type, a second call without
 * parallel; calls written by the templates parse back to the same name and
 * arguments; malformed, truncated and mutated outputs stay content.
 * Exits 77 when everything else passed but python3's jinja2 is missing.
 */
#include <errno.h>
#include <stdint.h>
#include <time.h>

#include <json-c/json.h>

#include "chat.h"
#include "grammar.h"
#include "testutil.h"
#include "toolcall.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static char err[1024];
static int jinja2_missing;

static const char tools_json[] =
	"[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"description\": \"Get the current weather in a city\", \"parameters\": "
	"{\"type\": \"object\", \"properties\": {"
	"\"city\": {\"type\": \"string\", \"description\": \"The city, e.g. Paris\"}, "
	"\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], "
	"\"description\": \"The unit\"}, "
	"\"days\": {\"type\": \"integer\", \"description\": \"How many days\"}}, "
	"\"required\": [\"city\"]}}}, "
	"{\"type\": \"function\", \"function\": {\"name\": \"get_time\", "
	"\"description\": \"The time in a time zone\", \"parameters\": "
	"{\"type\": \"object\", \"properties\": {\"tz\": {\"type\": \"string\", "
	"\"description\": \"IANA name\"}}, \"required\": [\"tz\"]}}}]";

/* The conversation as an OpenAI client sends it: content null beside
 * tool_calls, arguments a JSON string.  Ids are 9 characters, as Mistral's
 * template demands. */
static const char conv_openai[] =
	"[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}, "
	"{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"}, "
	"{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call00001\", "
	"\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"}}]}, "
	"{\"role\": \"tool\", \"tool_call_id\": \"call00001\", "
	"\"content\": \"{\\\"temperature\\\": 21.5, \\\"sky\\\": \\\"clear\\\"}\"}, "
	"{\"role\": \"assistant\", \"content\": \"It is 21.5 degrees and clear in Paris.\"}, "
	"{\"role\": \"user\", \"content\": \"And in Berlin?\"}]";

/* The same as Hugging Face's templates take it (what jinja2 renders). */
static const char conv_hf[] =
	"[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}, "
	"{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"}, "
	"{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call00001\", "
	"\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]}, "
	"{\"role\": \"tool\", \"content\": \"{\\\"temperature\\\": 21.5, \\\"sky\\\": \\\"clear\\\"}\", "
	"\"tool_call_id\": \"call00001\"}, "
	"{\"role\": \"assistant\", \"content\": \"It is 21.5 degrees and clear in Paris.\"}, "
	"{\"role\": \"user\", \"content\": \"And in Berlin?\"}]";

/* Two calls in one turn, two results. */
static const char par_openai[] =
	"[{\"role\": \"user\", \"content\": \"Weather and time in Paris?\"}, "
	"{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
	"{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}, "
	"{\"id\": \"call00002\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
	"\"arguments\": \"{\\\"tz\\\":\\\"Europe/Paris\\\"}\"}}]}, "
	"{\"role\": \"tool\", \"tool_call_id\": \"call00001\", \"content\": \"sunny\"}, "
	"{\"role\": \"tool\", \"tool_call_id\": \"call00002\", \"content\": \"12:00\"}]";

static const char par_hf[] =
	"[{\"role\": \"user\", \"content\": \"Weather and time in Paris?\"}, "
	"{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
	"{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": {\"city\": \"Paris\"}}}, "
	"{\"id\": \"call00002\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
	"\"arguments\": {\"tz\": \"Europe/Paris\"}}}]}, "
	"{\"role\": \"tool\", \"content\": \"sunny\", \"tool_call_id\": \"call00001\"}, "
	"{\"role\": \"tool\", \"content\": \"12:00\", \"tool_call_id\": \"call00002\"}]";

/* ---- helpers ---- */

static const char *srcdir(void)
{
	const char *s = getenv("LLMD_SRCDIR");
	return s ? s : ".";
}

static char *template_path(const char *name)
{
	static char path[4096];
	snprintf(path, sizeof path, "%s/tests/templates/%s", srcdir(), name);
	return path;
}

/* The template NAME's source (malloc'd), or NULL with a failure counted. */
static char *read_template(const char *name)
{
	FILE *f = fopen(template_path(name), "rb");
	char *buf = NULL;
	long n;

	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) ||
	    !(buf = malloc((size_t)n + 1)) || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "cannot read %s\n", template_path(name));
		test_failures++;
		free(buf);
		if (f)
			fclose(f);
		return NULL;
	}
	fclose(f);
	buf[n] = '\0';
	return buf;
}

static json_object *parse(const char *text)
{
	json_object *o = json_tokener_parse(text);
	if (!o) {
		fprintf(stderr, "test JSON does not parse: %.80s\n", text);
		test_failures++;
	}
	return o;
}

/* Python's jinja2 rendering of template NAME on CTX (malloc'd), or NULL:
 * *RC 0 rendered, 1 the template failed, 77 no jinja2, other: broken. */
static char *jinja2_render(const char *name, json_object *ctx, int *rc)
{
	char ctx_path[] = "/tmp/llmd-toolcall.XXXXXX", cmd[8192];
	int fd = mkostemp(ctx_path, O_CLOEXEC);
	const char *s = json_object_to_json_string_ext(ctx, JSON_C_TO_STRING_PLAIN |
						       JSON_C_TO_STRING_NOSLASHESCAPE);
	size_t cap = 1 << 16, n = 0, k;
	char *out = malloc(cap);

	*rc = -1;
	if (fd < 0 || !out || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) {
		if (fd >= 0)
			close(fd);
		free(out);
		return NULL;
	}
	close(fd);
	snprintf(cmd, sizeof cmd, "python3 '%s/tests/toolcall_jinja2.py' '%s' '%s' 2>/dev/null",
		 srcdir(), template_path(name), ctx_path);
	FILE *p = popen(cmd, "r");
	if (!p) {
		unlink(ctx_path);
		free(out);
		return NULL;
	}
	while ((k = fread(out + n, 1, cap - n - 1, p)) > 0) {
		n += k;
		if (cap - n < 4096) {
			char *q = realloc(out, cap * 2);
			if (!q)
				break;
			out = q;
			cap *= 2;
		}
	}
	out[n] = '\0';
	int st = pclose(p);
	unlink(ctx_path);
	*rc = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	if (*rc == 127) /* no python3 */
		*rc = 77;
	if (*rc != 0) {
		free(out);
		return NULL;
	}
	return out;
}

/* The context Hugging Face's apply_chat_template gives a template. */
static json_object *hf_context(const char *messages, const char *tools, int add_assistant)
{
	json_object *ctx = json_object_new_object();
	json_object_object_add(ctx, "messages", parse(messages));
	json_object_object_add(ctx, "tools", tools ? parse(tools) : NULL);
	json_object_object_add(ctx, "documents", NULL);
	json_object_object_add(ctx, "add_generation_prompt", json_object_new_boolean(add_assistant));
	json_object_object_add(ctx, "bos_token", json_object_new_string("<s>"));
	json_object_object_add(ctx, "eos_token", json_object_new_string("</s>"));
	return ctx;
}

/* A template from the folder, compiled, with <s> and </s> (no BOS added by
 * the tokenizer, so nothing is stripped). */
static int load(const char *name, struct chat_template *t)
{
	char *src = read_template(name);
	if (!src)
		return -1;
	int rc = chat_template_from_source(src, "<s>", "</s>", 0, t, err, sizeof err);
	free(src);
	if (rc < 0 || t->kind != CHAT_TMPL_JINJA) {
		fprintf(stderr, "%s: does not compile: %s\n", name, err);
		test_failures++;
		chat_template_clear(t);
		return -1;
	}
	return 0;
}

/* chat_render_json of MESSAGES (OpenAI's shape) and TOOLS: the text or
 * NULL; the return code in *RC. */
static char *render(const struct chat_template *t, const char *messages, const char *tools,
		    int add_assistant, int *rc)
{
	json_object *m = parse(messages), *tl = tools ? parse(tools) : NULL;
	char *out = NULL;
	*rc = chat_render_json(t, m, tl, add_assistant, &out, err, sizeof err);
	json_object_put(m);
	json_object_put(tl);
	return *rc >= 0 ? out : NULL;
}

/* The text of S between the last START and the first END after it
 * (malloc'd), or NULL. */
static char *span(const char *s, const char *start, const char *end)
{
	const char *a = NULL, *p, *b;
	for (p = strstr(s, start); p; p = strstr(p + 1, start))
		a = p;
	if (!a)
		return NULL;
	a += strlen(start);
	b = strstr(a, end);
	if (!b)
		return NULL;
	return strndup(a, (size_t)(b - a));
}

/* 1 if the grammar GBNF takes all of TEXT as a sentence, 0 if not, -1 when
 * it does not compile. */
static int grammar_takes(const char *gbnf, const char *text)
{
	static struct grammar_vocab *v;
	struct grammar *g;
	struct grammar_state *s;
	char gerr[256];

	if (!v) {
		const char *tok[] = { "a" };
		size_t len[] = { 1 };
		if (grammar_vocab_new(tok, len, 1, NULL, 0, &v))
			return -1;
	}
	if (grammar_parse(gbnf, strlen(gbnf), NULL, &g, gerr, sizeof gerr)) {
		fprintf(stderr, "grammar does not compile: %s\n%s\n", gerr, gbnf);
		return -1;
	}
	if (grammar_state_new(g, v, &s)) {
		grammar_free(g);
		return -1;
	}
	int ok = grammar_state_accept_bytes(s, text, strlen(text)) == 0 && grammar_state_can_end(s);
	grammar_state_free(s);
	grammar_free(g);
	return ok;
}

/* Parses TEXT in STYLE (TOOLS: JSON text or NULL); the result in *R. */
static int parse_calls(enum toolcall_style style, const char *text, const char *tools,
		       struct toolcall_result *r)
{
	json_object *tl = tools ? parse(tools) : NULL;
	memset(r, 0, sizeof *r);
	int rc = toolcall_parse(style, text, strlen(text), tl, r, err, sizeof err);
	json_object_put(tl);
	return rc;
}

/* TEXT holds exactly the calls NAMES[i](ARGS[i]) and CONTENT. */
static void check_calls(enum toolcall_style style, const char *text, int n,
			const char *const *names, const char *const *args, const char *content)
{
	struct toolcall_result r;
	int rc = parse_calls(style, text, NULL, &r);
	if (rc != n) {
		fprintf(stderr, "%s: %d calls in \"%s\", expected %d\n", toolcall_style_name(style),
			rc, text, n);
		test_failures++;
	}
	for (int i = 0; rc == n && i < n; i++) {
		CHECK_STR_EQ(r.calls[i].name, names[i]);
		CHECK_STR_EQ(r.calls[i].arguments, args[i]);
	}
	if (content && rc >= 0)
		CHECK_STR_EQ(r.content, content);
	if (rc >= 0)
		CHECK_INT_EQ(r.content_len, strlen(r.content));
	toolcall_result_clear(&r);
}

/* ---- styles ---- */

static void test_detect(void)
{
	static const struct { const char *file; enum toolcall_style style; } cases[] = {
		{ "Qwen-Qwen2.5-7B-Instruct.jinja", TOOLCALL_HERMES },
		{ "Qwen-Qwen3-0.6B.jinja", TOOLCALL_HERMES },
		{ "Qwen-QwQ-32B.jinja", TOOLCALL_HERMES },
		{ "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", TOOLCALL_HERMES },
		{ "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", TOOLCALL_HERMES },
		{ "ibm-granite-granite-4.0.jinja", TOOLCALL_HERMES },
		{ "meta-llama-Llama-3.1-8B-Instruct.jinja", TOOLCALL_LLAMA3 },
		{ "meta-llama-Llama-3.2-3B-Instruct.jinja", TOOLCALL_LLAMA3 },
		{ "meta-llama-Llama-3.3-70B-Instruct.jinja", TOOLCALL_LLAMA3 },
		{ "mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOLCALL_MISTRAL },
		/* no tools at all */
		{ "SmolLM2-135M-Instruct.jinja", TOOLCALL_GENERIC },
		{ "google-gemma-2-2b-it.jinja", TOOLCALL_GENERIC },
		{ "HuggingFaceTB-SmolLM3-3B.jinja", TOOLCALL_GENERIC }, /* Unsloth's, toolless */
		{ "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", TOOLCALL_GENERIC },
		{ "microsoft-Phi-3.5-mini-instruct.jinja", TOOLCALL_GENERIC },
		/* tools, in a syntax not ours */
		{ "Mistral-Small-3.2-24B-Instruct-2506.jinja", TOOLCALL_GENERIC }, /* [ARGS] */
		{ "unsloth-mistral-Devstral-Small-2507.jinja", TOOLCALL_GENERIC },
		{ "Qwen3-Coder.jinja", TOOLCALL_GENERIC },           /* <function=...> */
		{ "GLM-4.6.jinja", TOOLCALL_GENERIC },               /* <arg_key> */
		{ "meetkai-functionary-medium-v3.1.jinja", TOOLCALL_GENERIC },
		{ "meetkai-functionary-medium-v3.2.jinja", TOOLCALL_GENERIC },
		{ "fireworks-ai-llama-3-firefunction-v2.jinja", TOOLCALL_GENERIC },
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		char *src = read_template(cases[i].file);
		if (!src)
			continue;
		enum toolcall_style got = toolcall_style_detect(src);
		if (got != cases[i].style) {
			fprintf(stderr, "%s: style %s, expected %s\n", cases[i].file,
				toolcall_style_name(got), toolcall_style_name(cases[i].style));
			test_failures++;
		}
		/* the template object carries it when the source runs as Jinja */
		struct chat_template t = { 0 };
		if (chat_template_from_source(src, "<s>", "</s>", 0, &t, err, sizeof err) == 0 &&
		    t.kind == CHAT_TMPL_JINJA)
			CHECK_INT_EQ(t.tool_style, cases[i].style);
		chat_template_clear(&t);
		free(src);
	}
	CHECK_INT_EQ(toolcall_style_detect(NULL), TOOLCALL_GENERIC);
	CHECK_STR_EQ(toolcall_style_name(TOOLCALL_MISTRAL), "mistral");
	CHECK_STR_EQ(toolcall_style_name((enum toolcall_style)9), "unknown");

	/* a family (the source did not compile, or picked by name) is GENERIC */
	struct chat_template t = { .tool_style = TOOLCALL_HERMES };
	CHECK_INT_EQ(chat_template_by_name("chatml", &t), 0);
	CHECK_INT_EQ(t.tool_style, TOOLCALL_GENERIC);
	chat_template_clear(&t);
}

static void test_choice(void)
{
	static const struct { const char *json; int rc; enum toolcall_choice c; const char *name; } cases[] = {
		{ "\"auto\"", 0, TOOLCALL_AUTO, NULL },
		{ "\"none\"", 0, TOOLCALL_NONE, NULL },
		{ "\"required\"", 0, TOOLCALL_REQUIRED, NULL },
		{ "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}", 0, TOOLCALL_NAMED, "get_time" },
		{ "\"any\"", -EINVAL, 0, NULL },
		{ "{\"type\": \"function\"}", -EINVAL, 0, NULL },
		{ "{\"type\": \"tool\", \"function\": {\"name\": \"x\"}}", -EINVAL, 0, NULL },
		{ "42", -EINVAL, 0, NULL },
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		json_object *o = parse(cases[i].json);
		enum toolcall_choice c = (enum toolcall_choice)77;
		const char *name = "untouched";
		int rc = toolcall_choice_parse(o, &c, &name, err, sizeof err);
		CHECK_INT_EQ(rc, cases[i].rc);
		if (rc == 0) {
			CHECK_INT_EQ(c, cases[i].c);
			CHECK(cases[i].name ? name && strcmp(name, cases[i].name) == 0 : name == NULL);
		} else {
			CHECK_INT_EQ(c, 77);
			CHECK(strncmp(err, "tool_choice: ", 13) == 0);
		}
		json_object_put(o);
	}
	enum toolcall_choice c = TOOLCALL_NONE;
	const char *name = "x";
	CHECK_INT_EQ(toolcall_choice_parse(NULL, &c, &name, err, sizeof err), 0);
	CHECK(c == TOOLCALL_AUTO && name == NULL);
}

static void test_tools_check(void)
{
	static const struct { const char *json; int rc; const char *msg; } cases[] = {
		{ "[]", 0, "" },
		{ "{}", -EINVAL, "tools: not an array" },
		{ "[{\"type\": \"function\", \"function\": {\"name\": \"get weather\"}}]", -EINVAL,
		  "tools[0].function.name: \"get weather\" is not" },
		{ "[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, "
		  "{\"type\": \"function\", \"function\": {\"name\": \"a\"}}]", -EINVAL,
		  "tools[1].function.name: \"a\" is also tools[0]'s" },
		{ "[{\"type\": \"code\", \"function\": {\"name\": \"a\"}}]", -EINVAL, "tools[0].type" },
		{ "[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": 3}}]",
		  -EINVAL, "tools[0].function.parameters: not an object" },
		{ "[{\"type\": \"function\", \"function\": {}}]", -EINVAL, "tools[0].function.name" },
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		json_object *o = parse(cases[i].json);
		CHECK_INT_EQ(toolcall_tools_check(o, err, sizeof err), cases[i].rc);
		if (strncmp(err, cases[i].msg, strlen(cases[i].msg)) != 0) {
			fprintf(stderr, "tools %s: \"%s\", expected \"%s...\"\n", cases[i].json, err,
				cases[i].msg);
			test_failures++;
		}
		json_object_put(o);
	}
	/* too many */
	json_object *many = json_object_new_array();
	for (unsigned i = 0; i <= TOOLCALL_MAX_TOOLS; i++) {
		char buf[128];
		snprintf(buf, sizeof buf, "{\"type\": \"function\", \"function\": {\"name\": \"f%u\"}}", i);
		json_object_array_add(many, json_tokener_parse(buf));
	}
	CHECK_INT_EQ(toolcall_tools_check(many, err, sizeof err), -E2BIG);
	json_object_put(many);
}

/* ---- rendering ---- */

/* The tool-aware templates, rendered by chat_render_json from the OpenAI
 * shape, against jinja2 on the Hugging Face shape. */
static void test_render_vs_jinja2(void)
{
	static const struct { const char *file; int parallel_ok; } cases[] = {
		{ "Qwen-Qwen2.5-7B-Instruct.jinja", 1 },
		{ "Qwen-Qwen3-0.6B.jinja", 1 },
		{ "Qwen-QwQ-32B.jinja", 1 },
		{ "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", 1 },
		{ "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", 1 },
		{ "ibm-granite-granite-4.0.jinja", 1 },
		{ "meta-llama-Llama-3.1-8B-Instruct.jinja", 0 }, /* one call a turn */
		{ "meta-llama-Llama-3.2-3B-Instruct.jinja", 0 },
		{ "meta-llama-Llama-3.3-70B-Instruct.jinja", 0 },
		{ "mistralai-Mistral-Nemo-Instruct-2407.jinja", 1 },
	};
	static const struct { const char *openai, *hf; int add; } convs[] = {
		{ conv_openai, conv_hf, 1 },
		{ conv_openai, conv_hf, 0 },
		{ par_openai, par_hf, 1 },
	};
	int compared = 0;

	for (size_t i = 0; i < ARRAY_LEN(cases) && !jinja2_missing; i++) {
		struct chat_template t = { 0 };
		if (load(cases[i].file, &t) < 0)
			continue;
		for (size_t c = 0; c < ARRAY_LEN(convs); c++) {
			int rc, prc;
			char *ours = render(&t, convs[c].openai, tools_json, convs[c].add, &rc);
			json_object *ctx = hf_context(convs[c].hf, tools_json, convs[c].add);
			char *want = jinja2_render(cases[i].file, ctx, &prc);
			json_object_put(ctx);
			if (prc == 77) {
				jinja2_missing = 1;
				fprintf(stderr, "SKIP: no python3 jinja2: rendering not compared\n");
				free(ours);
				break;
			}
			int par = convs[c].openai == par_openai;
			if (par && !cases[i].parallel_ok) {
				/* both refuse, with the template's message */
				CHECK(prc == 1 && rc == -EINVAL);
				CHECK(strstr(err, "only supports single tool-calls") != NULL);
			} else if (prc != 0 || !want || !ours || strcmp(ours, want) != 0) {
				fprintf(stderr, "%s / conversation %zu: ours (%d, %s):\n%s\n--- jinja2 (%d):\n%s\n",
					cases[i].file, c, rc, err, ours ? ours : "", prc, want ? want : "");
				test_failures++;
			} else {
				compared++;
			}
			free(ours);
			free(want);
		}
		chat_template_clear(&t);
	}
	if (!jinja2_missing)
		fprintf(stderr, "%d tool conversations render as jinja2 renders them\n", compared);
}

/* Pins that do not need Python: what the OpenAI shape turns into. */
static void test_render_native(void)
{
	struct chat_template t = { 0 };
	int rc;
	char *out;

	if (load("Qwen-Qwen2.5-7B-Instruct.jinja", &t) == 0) {
		out = render(&t, conv_openai, tools_json, 1, &rc);
		CHECK(out && strstr(out, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
				    "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call><|im_end|>\n"));
		CHECK(out && strstr(out, "<|im_start|>user\n<tool_response>\n{\"temperature\": 21.5, "
				    "\"sky\": \"clear\"}\n</tool_response><|im_end|>\n"));
		CHECK(out && strstr(out, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""));
		free(out);
		/* no tools: the template's own system text, calls still rendered */
		out = render(&t, conv_openai, NULL, 1, &rc);
		CHECK(out && !strstr(out, "<tools>") && strstr(out, "<tool_call>"));
		free(out);
		out = render(&t, conv_openai, "[]", 1, &rc);
		CHECK(out && !strstr(out, "<tools>"));
		free(out);
		/* arguments that are not JSON reach the template as the string */
		out = render(&t, "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
			     "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
			     "\"arguments\": \"not json\"}}]}]", NULL, 0, &rc);
		CHECK(out && strstr(out, "\"arguments\": \"not json\"}"));
		free(out);
		/* content parts are joined */
		out = render(&t, "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
			     "{\"type\": \"text\", \"text\": \"b\"}]}]", NULL, 0, &rc);
		CHECK(out && strstr(out, "<|im_start|>user\na\nb<|im_end|>"));
		free(out);
		chat_template_clear(&t);
	}
	if (load("mistralai-Mistral-Nemo-Instruct-2407.jinja", &t) == 0) {
		out = render(&t, conv_openai, tools_json, 1, &rc);
		CHECK(out && strstr(out, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
				    "{\"city\": \"Paris\", \"days\": 2}, \"id\": \"call00001\"}]</s>"));
		CHECK(out && strstr(out, "[AVAILABLE_TOOLS]"));
		free(out);
		chat_template_clear(&t);
	}
}

/* Malformed conversations and tools: -EINVAL naming the place, *ret
 * untouched. */
static void test_render_errors(void)
{
	static const struct { const char *messages, *tools, *msg; } cases[] = {
		{ "{}", NULL, "messages: not an array" },
		{ "[{\"content\": \"x\"}]", NULL, "messages[0]: not an object with a string \"role\"" },
		{ "[3]", NULL, "messages[0]: not an object" },
		{ "[{\"role\": \"user\", \"content\": 3}]", NULL, "messages[0].content: not a string" },
		{ "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]", NULL,
		  "messages[0].content[0]: only" },
		{ "[{\"role\": \"assistant\", \"tool_calls\": 5}]", NULL, "messages[0].tool_calls: not an array" },
		{ "[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {}}]}]", NULL,
		  "messages[0].tool_calls[0].function.name" },
		{ "[{\"role\": \"user\", \"content\": \"x\"}]", "[{\"type\": \"function\"}]", "tools[0].function" },
	};
	const char *files[] = { "Qwen-Qwen2.5-7B-Instruct.jinja", "SmolLM2-135M-Instruct.jinja" };

	for (size_t f = 0; f < ARRAY_LEN(files); f++) {
		struct chat_template t = { 0 };
		if (load(files[f], &t) < 0)
			continue;
		for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
			json_object *m = parse(cases[i].messages);
			json_object *tl = cases[i].tools ? parse(cases[i].tools) : NULL;
			char *out = (char *)&t;
			int rc = chat_render_json(&t, m, tl, 1, &out, err, sizeof err);
			CHECK_INT_EQ(rc, -EINVAL);
			CHECK(out == (char *)&t);
			if (strncmp(err, cases[i].msg, strlen(cases[i].msg)) != 0) {
				fprintf(stderr, "%s / %s: \"%s\", expected \"%s...\"\n", files[f],
					cases[i].messages, err, cases[i].msg);
				test_failures++;
			}
			json_object_put(m);
			json_object_put(tl);
		}
		chat_template_clear(&t);
	}
}

/* Templates that know no tools: the tools described in the system text,
 * calls as GENERIC's JSON, results in a role the template takes. */
static void test_render_generic(void)
{
	struct chat_template t = { 0 };
	char *out, *sys = NULL;
	int rc;
	json_object *tools = parse(tools_json);

	CHECK_INT_EQ(toolcall_generic_system(tools, &sys, err, sizeof err), 0);
	CHECK(sys && strstr(sys, "{\"name\":\"get_weather\",\"description\":\"Get the current weather "
			    "in a city\",\"parameters\":{\"type\":\"object\""));
	CHECK(sys && strstr(sys, "{\"name\":\"get_time\""));
	CHECK(sys && strstr(sys, "{\"tool_calls\": [{\"name\": "));

	if (load("SmolLM2-135M-Instruct.jinja", &t) == 0) {
		CHECK_INT_EQ(t.tool_style, TOOLCALL_GENERIC);
		out = render(&t, conv_openai, tools_json, 1, &rc);
		CHECK(out != NULL);
		if (out && sys) {
			char *want_sys = malloc(strlen(sys) + 128);
			sprintf(want_sys, "<|im_start|>system\nYou are a helpful assistant.\n\n%s<|im_end|>\n", sys);
			CHECK(strncmp(out, want_sys, strlen(want_sys)) == 0);
			free(want_sys);
		}
		/* ChatML takes any role: the result stays a tool turn */
		CHECK(out && strstr(out, "<|im_start|>assistant\n{\"tool_calls\": [{\"name\": \"get_weather\", "
				    "\"arguments\": {\"city\":\"Paris\",\"days\":2}}]}<|im_end|>\n"
				    "<|im_start|>tool\n{\"temperature\": 21.5, \"sky\": \"clear\"}<|im_end|>\n"));
		CHECK(out && strstr(out, "<|im_start|>user\nAnd in Berlin?<|im_end|>\n<|im_start|>assistant\n"));
		free(out);
		/* no system message: ours becomes the first (instead of SmolLM's) */
		out = render(&t, "[{\"role\": \"user\", \"content\": \"hi\"}]", tools_json, 1, &rc);
		CHECK(out && strncmp(out, "<|im_start|>system\nYou can call the following tools", 51) == 0);
		CHECK(out && !strstr(out, "SmolLM"));
		free(out);
		/* without tools, chat_render_json is chat_render */
		const struct chat_msg plain[] = { { "system", "S" }, { "user", "U" } };
		char *a = NULL, *b = render(&t, "[{\"role\": \"system\", \"content\": \"S\"}, "
					    "{\"role\": \"user\", \"content\": \"U\"}]", NULL, 1, &rc);
		CHECK(chat_render(&t, plain, 2, 1, &a) > 0);
		CHECK(a && b && strcmp(a, b) == 0);
		free(a);
		free(b);
		chat_template_clear(&t);
	}

	/* Gemma 2 refuses the system role and demands alternation: tool results
	 * become user turns and the system text joins the first user turn */
	if (load("google-gemma-2-2b-it.jinja", &t) == 0) {
		out = render(&t, conv_openai, tools_json, 1, &rc);
		CHECK(rc > 0);
		CHECK(out && strncmp(out, "<s><start_of_turn>user\nYou are a helpful assistant.\n\nYou can call "
				     "the following tools", 80) == 0);
		CHECK(out && strstr(out, "What is the weather in Paris?<end_of_turn>\n<start_of_turn>model\n"
				    "{\"tool_calls\": [{\"name\": \"get_weather\""));
		CHECK(out && strstr(out, "<start_of_turn>user\nTool result for call call00001 (get_weather): "
				    "{\"temperature\": 21.5, \"sky\": \"clear\"}<end_of_turn>\n<start_of_turn>model\n"
				    "It is 21.5"));
		free(out);
		/* a conversation without tools is refused as before */
		out = render(&t, "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}]",
			     NULL, 1, &rc);
		CHECK_INT_EQ(rc, -EINVAL);
		CHECK(strstr(err, "System role not supported") != NULL);
		chat_template_clear(&t);
	}

	/* a C family refuses the tool role: results go to user turns, merged
	 * with a user turn that follows */
	CHECK_INT_EQ(chat_template_by_name("chatml", &t), 0);
	out = render(&t, par_openai, tools_json, 1, &rc);
	CHECK(out && strstr(out, "<|im_start|>user\nTool result for call call00001 (get_weather): sunny\n\n"
			    "Tool result for call call00002 (get_time): 12:00<|im_end|>\n<|im_start|>assistant\n"));
	CHECK(out && strstr(out, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": "
			    "{\"city\":\"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\":\"Europe/Paris\"}}]}"));
	free(out);
	chat_template_clear(&t);

	/* GENERIC's rendering of calls, with content and odd arguments */
	json_object *calls = parse("[{\"function\": {\"name\": \"f\", \"arguments\": \"not json\"}}, "
				   "{\"function\": {\"name\": \"g\", \"arguments\": {\"a\": [1, 2]}}}, "
				   "{\"function\": {\"name\": \"h\"}}]");
	char *s = NULL;
	CHECK_INT_EQ(toolcall_generic_calls(calls, "Let me see.", &s, err, sizeof err), 0);
	CHECK_STR_EQ(s, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": \"not json\"}, "
		     "{\"name\": \"g\", \"arguments\": {\"a\":[1,2]}}, {\"name\": \"h\", \"arguments\": {}}], "
		     "\"content\": \"Let me see.\"}");
	free(s);
	json_object_put(calls);
	free(sys);
	json_object_put(tools);
}

/* ---- grammars ---- */

static void test_grammar(void)
{
	static const struct {
		enum toolcall_style style;
		const char *good, *two, *wrong_name, *missing, *wrong_type;
	} cases[] = {
		{ TOOLCALL_HERMES,
		  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
		  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
		  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>",
		  "<tool_call>\n{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>",
		  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": \"two\"}}\n</tool_call>" },
		{ TOOLCALL_LLAMA3,
		  "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
		  NULL,
		  "{\"name\": \"get_wether\", \"parameters\": {\"city\": \"Paris\"}}",
		  "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \"celsius\"}}",
		  "{\"name\": \"get_weather\", \"parameters\": {\"city\": 7}}" },
		{ TOOLCALL_MISTRAL,
		  "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]",
		  "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefgh1\"}, "
		  "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}, \"id\": \"abcdefghi\"}]",
		  "[{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]",
		  "[{\"name\": \"get_weather\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
		  "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"kelvin\"}, \"id\": \"abcdefghi\"}]" },
		{ TOOLCALL_GENERIC,
		  "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":2}}]}",
		  "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}, "
		  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}",
		  "{\"tool_calls\": [{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}]}",
		  "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}]}",
		  "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": [\"Paris\"]}}]}" },
	};
	json_object *tools = parse(tools_json);

	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		enum toolcall_style st = cases[i].style;
		const char *sn = toolcall_style_name(st);
		for (int parallel = 0; parallel < 2; parallel++) {
			char *g = NULL;
			int rc = toolcall_grammar(st, tools, TOOLCALL_REQUIRED, NULL, parallel, &g, err, sizeof err);
			CHECK_INT_EQ(rc, 0);
			if (!g)
				continue;
			if (grammar_takes(g, cases[i].good) != 1) {
				fprintf(stderr, "%s grammar refuses %s\n%s\n", sn, cases[i].good, g);
				test_failures++;
			}
			CHECK_INT_EQ(grammar_takes(g, cases[i].wrong_name), 0);
			CHECK_INT_EQ(grammar_takes(g, cases[i].missing), 0);
			CHECK_INT_EQ(grammar_takes(g, cases[i].wrong_type), 0);
			CHECK_INT_EQ(grammar_takes(g, "Sure, let me check."), 0);
			CHECK_INT_EQ(grammar_takes(g, ""), 0);
			if (cases[i].two)
				CHECK_INT_EQ(grammar_takes(g, cases[i].two), parallel);
			/* what the grammar takes, the parser reads back */
			struct toolcall_result r;
			CHECK_INT_EQ(parse_calls(st, cases[i].good, tools_json, &r), 1);
			if (r.n_calls == 1)
				CHECK_STR_EQ(r.calls[0].name, "get_weather");
			toolcall_result_clear(&r);
			free(g);
		}
		/* named: that tool only */
		char *g = NULL;
		CHECK_INT_EQ(toolcall_grammar(st, tools, TOOLCALL_NAMED, "get_time", 1, &g, err, sizeof err), 0);
		if (g) {
			CHECK_INT_EQ(grammar_takes(g, cases[i].good), 0);
			CHECK(strstr(g, "get_weather") == NULL);
			free(g);
		}
		CHECK_INT_EQ(toolcall_grammar(st, tools, TOOLCALL_NAMED, "get_weather", 0, &g, err, sizeof err), 0);
		if (g) {
			CHECK_INT_EQ(grammar_takes(g, cases[i].good), 1);
			free(g);
		}
	}

	/* free text: no grammar */
	char *g = (char *)tools;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_HERMES, tools, TOOLCALL_AUTO, NULL, 1, &g, err, sizeof err), 0);
	CHECK(g == NULL);
	g = (char *)tools;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_HERMES, NULL, TOOLCALL_NONE, NULL, 1, &g, err, sizeof err), 0);
	CHECK(g == NULL);
	/* GENERIC with auto: the calls' object or a response, nothing else;
	 * the response parses back as content */
	g = NULL;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_GENERIC, tools, TOOLCALL_AUTO, NULL, 1, &g, err, sizeof err), 0);
	CHECK(g != NULL);
	if (g) {
		static const char *const resp = "{\"response\": \"It is \\\"sunny\\\"\\n\\u00e9 today.\"}";
		CHECK_INT_EQ(grammar_takes(g, resp), 1);
		CHECK_INT_EQ(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]}"), 1);
		CHECK_INT_EQ(grammar_takes(g, "It is sunny."), 0);
		CHECK_INT_EQ(grammar_takes(g, "{\"response\": \"raw\ncontrol\"}"), 0);
		CHECK_INT_EQ(grammar_takes(g, "{\"response\": 7}"), 0);
		struct toolcall_result r;
		CHECK_INT_EQ(toolcall_parse(TOOLCALL_GENERIC, resp, strlen(resp), tools, &r, err, sizeof err), 0);
		CHECK_STR_EQ(r.content, "It is \"sunny\"\n\u00e9 today.");
		toolcall_result_clear(&r);
		free(g);
	}

	/* refusals leave *ret alone */
	g = (char *)tools;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_HERMES, tools, TOOLCALL_NAMED, "nope", 0, &g, err, sizeof err), -EINVAL);
	CHECK(strstr(err, "\"nope\" is not among the tools") != NULL);
	json_object *empty = parse("[]");
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_HERMES, empty, TOOLCALL_REQUIRED, NULL, 0, &g, err, sizeof err), -EINVAL);
	json_object_put(empty);
	json_object *bad = parse("[{\"type\": \"function\", \"function\": {\"name\": \"ok\"}}, "
				 "{\"type\": \"function\", \"function\": {\"name\": \"bad_tool\", \"parameters\": "
				 "{\"type\": \"object\", \"properties\": {\"x\": {\"not\": {\"type\": \"string\"}}}}}}]");
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_GENERIC, bad, TOOLCALL_REQUIRED, NULL, 0, &g, err, sizeof err), -ENOTSUP);
	if (strncmp(err, "tool bad_tool: parameters: not at #/properties/x", 48) != 0) {
		fprintf(stderr, "schema refusal: \"%s\"\n", err);
		test_failures++;
	}
	/* ... but naming the good one compiles only that one */
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_GENERIC, bad, TOOLCALL_NAMED, "ok", 0, &g, err, sizeof err), 0);
	if (g != (char *)tools) {
		/* no parameters: a function of none, {} */
		CHECK_INT_EQ(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"ok\", \"arguments\": {}}]}"), 1);
		CHECK_INT_EQ(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"ok\", \"arguments\": {\"z\": [1]}}]}"), 0);
		free(g);
	}
	json_object_put(bad);

	/* strict or not, no other properties than the schema's */
	json_object *strict = parse("[{\"type\": \"function\", \"function\": {\"name\": \"s\", \"strict\": true, "
				    "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, "
				    "\"required\": [\"a\"]}}}]");
	g = NULL;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_MISTRAL, strict, TOOLCALL_REQUIRED, NULL, 0, &g, err, sizeof err), 0);
	if (g) {
		CHECK_INT_EQ(grammar_takes(g, "[{\"name\": \"s\", \"arguments\": {\"a\": 1}, \"id\": \"123456789\"}]"), 1);
		CHECK_INT_EQ(grammar_takes(g, "[{\"name\": \"s\", \"arguments\": {\"a\": 1, \"b\": 2}, \"id\": \"123456789\"}]"), 0);
		free(g);
	}
	json_object_put(strict);
	json_object *loose = parse("[{\"type\": \"function\", \"function\": {\"name\": \"s\", "
				   "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]");
	g = NULL;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_GENERIC, loose, TOOLCALL_REQUIRED, NULL, 0, &g, err, sizeof err), 0);
	if (g) {
		CHECK_INT_EQ(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"s\", \"arguments\": {\"a\": 1}}]}"), 1);
		CHECK_INT_EQ(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"s\", \"arguments\": {\"a\": 1, \"b\": 2}}]}"), 0);
		free(g);
	}
	json_object_put(loose);

	/* every tool of a full list compiles side by side: rules do not clash */
	json_object *many = json_object_new_array();
	for (unsigned i = 0; i < TOOLCALL_MAX_TOOLS; i++) {
		char buf[512];
		snprintf(buf, sizeof buf, "{\"type\": \"function\", \"function\": {\"name\": \"f%u\", "
			 "\"parameters\": {\"type\": \"object\", \"properties\": {\"root\": {\"type\": \"string\"}, "
			 "\"space\": {\"type\": \"integer\"}}, \"required\": [\"root\"]}}}", i);
		json_object_array_add(many, json_tokener_parse(buf));
	}
	g = NULL;
	CHECK_INT_EQ(toolcall_grammar(TOOLCALL_HERMES, many, TOOLCALL_REQUIRED, NULL, 1, &g, err, sizeof err), 0);
	if (g) {
		CHECK_INT_EQ(grammar_takes(g, "<tool_call>\n{\"name\": \"f127\", \"arguments\": {\"root\": \"x\", "
				 "\"space\": 3}}\n</tool_call>"), 1);
		CHECK_INT_EQ(grammar_takes(g, "<tool_call>\n{\"name\": \"f127\", \"arguments\": {\"space\": 3}}\n</tool_call>"), 0);
		free(g);
	}
	json_object_put(many);
	json_object_put(tools);
}

/* ---- parsing ---- */

/* Calls as each template writes them parse back to the same calls. */
static void test_parse_rendered(void)
{
	static const struct {
		const char *file, *start, *end;
		int parallel_ok;
	} cases[] = {
		{ "Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_start|>assistant", "<|im_end|>", 1 },
		{ "Qwen-Qwen3-0.6B.jinja", "<|im_start|>assistant", "<|im_end|>", 1 },
		{ "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "<|im_start|>assistant", "<|im_end|>", 1 },
		{ "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "<|im_start|>assistant", "<|im_end|>", 1 },
		{ "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", 0 },
		{ "meta-llama-Llama-3.2-3B-Instruct.jinja", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", 0 },
		{ "mistralai-Mistral-Nemo-Instruct-2407.jinja", "[/INST]", "</s>", 1 },
	};
	static const char one[] =
		"[{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": null, "
		"\"tool_calls\": [{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": "
		"\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"S\\u00e3o Paulo\\\", "
		"\\\"unit\\\": \\\"celsius\\\", \\\"days\\\": 2}\"}}]}]";
	static const char two[] =
		"[{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": null, "
		"\"tool_calls\": [{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": "
		"\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}, {\"id\": \"call00002\", "
		"\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"arguments\": "
		"\"{\\\"tz\\\": \\\"a\\\\\\\"b\\\"}\"}}]}]";
	const char *names1[] = { "get_weather" };
	const char *args1[] = { "{\"city\":\"São Paulo\",\"unit\":\"celsius\",\"days\":2}" };
	const char *names2[] = { "get_weather", "get_time" };
	const char *args2[] = { "{\"city\":\"Paris\"}", "{\"tz\":\"a\\\"b\"}" };
	json_object *tools = parse(tools_json);

	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		struct chat_template t = { 0 };
		if (load(cases[i].file, &t) < 0)
			continue;
		for (int n = 1; n <= 1 + cases[i].parallel_ok; n++) {
			int rc;
			char *out = render(&t, n == 1 ? one : two, tools_json, 0, &rc);
			char *call = out ? span(out, cases[i].start, cases[i].end) : NULL;
			if (!call) {
				fprintf(stderr, "%s: no assistant turn in the rendering (%d, %s):\n%s\n",
					cases[i].file, rc, err, out ? out : "");
				test_failures++;
				free(out);
				continue;
			}
			/* the GENERIC grammar aside, the forced grammar takes it */
			char *g = NULL;
			CHECK_INT_EQ(toolcall_grammar(t.tool_style, tools, TOOLCALL_REQUIRED, NULL, 1, &g, err,
						      sizeof err), 0);
			const char *body = call;
			while (*body == '\n')
				body++;
			if (strncmp(body, "[TOOL_CALLS]", 12) == 0) /* a control token */
				body += 12;
			if (g && strncmp(body, "<think>", 7) != 0 && grammar_takes(g, body) != 1) {
				fprintf(stderr, "%s: the grammar refuses the template's call:\n%s\n", cases[i].file, body);
				test_failures++;
			}
			free(g);
			check_calls(t.tool_style, call, n, n == 1 ? names1 : names2, n == 1 ? args1 : args2, NULL);
			free(call);
			free(out);
		}
		chat_template_clear(&t);
	}
	json_object_put(tools);
}

static void test_parse_cases(void)
{
	const char *w[] = { "get_weather", "get_time" };
	const char *a_paris[] = { "{\"city\":\"Paris\"}", "{\"tz\":\"UTC\"}" };

	/* no call: the text as it is, whatever the style */
	for (int st = TOOLCALL_GENERIC; st <= TOOLCALL_MISTRAL; st++) {
		check_calls(st, "  The weather is nice.\n", 0, NULL, NULL, "  The weather is nice.\n");
		check_calls(st, "", 0, NULL, NULL, "");
	}

	/* Hermes: content around blocks, an unclosed last block, several */
	check_calls(TOOLCALL_HERMES, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
		    "{\"city\": \"Paris\"}}\n</tool_call>", 1, w, a_paris, "Let me check.");
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"arguments\":{\"city\":\"Paris\"},\"name\":\"get_weather\"}",
		    1, w, a_paris, "");
	check_calls(TOOLCALL_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
		    "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n"
		    "</tool_call>\n", 2, w, a_paris, "");
	/* a broken block stays content, a good one beside it is still a call */
	check_calls(TOOLCALL_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
		    0, NULL, NULL, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>");
	check_calls(TOOLCALL_HERMES, "<tool_call>oops</tool_call> then <tool_call>{\"name\": \"get_weather\", "
		    "\"arguments\": {\"city\": \"Paris\"}}</tool_call>", 1, w, a_paris, "<tool_call>oops</tool_call> then");
	/* a block with text after its JSON and no closing tag is not a call */
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": {}} and more", 0, NULL, NULL,
		    "<tool_call>{\"name\": \"x\", \"arguments\": {}} and more");
	/* arguments: not an object, NaN, a string that is not JSON */
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>", 0, NULL, NULL, NULL);
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": NaN}}</tool_call>", 0, NULL, NULL, NULL);
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": \"{oops\"}</tool_call>", 0, NULL, NULL, NULL);
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"bad name\", \"arguments\": {}}</tool_call>", 0, NULL, NULL, NULL);
	/* no arguments: {} */
	const char *x[] = { "x" }, *empty[] = { "{}" };
	check_calls(TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\"}</tool_call>", 1, x, empty, "");

	/* names not among the tools stay content when the tools are given */
	struct toolcall_result r;
	static const char unknown[] = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
	CHECK_INT_EQ(parse_calls(TOOLCALL_HERMES, unknown, tools_json, &r), 0);
	CHECK_STR_EQ(r.content, unknown);
	toolcall_result_clear(&r);
	CHECK_INT_EQ(parse_calls(TOOLCALL_HERMES, unknown, NULL, &r), 1);
	toolcall_result_clear(&r);

	/* Llama 3: bare, after <|python_tag|>, several; text after a bare one
	 * makes it content */
	check_calls(TOOLCALL_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 1, w, a_paris, "");
	check_calls(TOOLCALL_LLAMA3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
		    1, w, a_paris, "");
	check_calls(TOOLCALL_LLAMA3, "I'll look.<|python_tag|>{\"name\": \"get_weather\", \"parameters\": "
		    "{\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}", 2, w, a_paris,
		    "I'll look.");
	check_calls(TOOLCALL_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}} is the JSON",
		    0, NULL, NULL, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}} is the JSON");
	check_calls(TOOLCALL_LLAMA3, "{\"answer\": 42}", 0, NULL, NULL, "{\"answer\": 42}");
	check_calls(TOOLCALL_LLAMA3, "<|python_tag|>brave_search.call(query=\"x\")", 0, NULL, NULL,
		    "<|python_tag|>brave_search.call(query=\"x\")");

	/* Mistral: with and without the control token's text */
	check_calls(TOOLCALL_MISTRAL, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
		    "\"id\": \"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]", 2, w, a_paris, "");
	check_calls(TOOLCALL_MISTRAL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", 1, w, a_paris, "");
	check_calls(TOOLCALL_MISTRAL, "[1, 2, 3]", 0, NULL, NULL, "[1, 2, 3]");
	check_calls(TOOLCALL_MISTRAL, "[TOOL_CALLS][{\"name\": 3}]", 0, NULL, NULL, "[TOOL_CALLS][{\"name\": 3}]");

	/* GENERIC: the whole output is the object */
	check_calls(TOOLCALL_GENERIC, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
		    "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]}", 2, w, a_paris, "");
	check_calls(TOOLCALL_GENERIC, "```json\n{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": "
		    "{\"city\": \"Paris\"}}}\n```\n", 1, w, a_paris, "");
	check_calls(TOOLCALL_GENERIC, "{\"response\": \"Hello!\"}", 0, NULL, NULL, "Hello!");
	check_calls(TOOLCALL_GENERIC, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}], "
		    "\"content\": \"Checking.\"}", 1, w, a_paris, "Checking.");
	check_calls(TOOLCALL_GENERIC, "{\"city\": \"Paris\"}", 0, NULL, NULL, "{\"city\": \"Paris\"}");
	check_calls(TOOLCALL_GENERIC, "{\"tool_calls\": []}", 0, NULL, NULL, "{\"tool_calls\": []}");
	check_calls(TOOLCALL_GENERIC, "Sure: {\"tool_calls\": [{\"name\": \"x\"}]}", 0, NULL, NULL, NULL);

	/* GENERIC's own rendering of calls reads back */
	json_object *calls = parse("[{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
				   "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}, {\"function\": {\"name\": \"get_time\", "
				   "\"arguments\": {\"tz\": \"UTC\"}}}]");
	char *s = NULL;
	CHECK_INT_EQ(toolcall_generic_calls(calls, NULL, &s, err, sizeof err), 0);
	if (s)
		check_calls(TOOLCALL_GENERIC, s, 2, w, a_paris, "");
	free(s);
	json_object_put(calls);

	/* too many calls: -E2BIG, *ret untouched */
	char *big = malloc(80 * (TOOLCALL_MAX_CALLS + 1) + 1);
	big[0] = '\0';
	for (unsigned i = 0; i <= TOOLCALL_MAX_CALLS; i++)
		strcat(big, "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>\n");
	memset(&r, 0x5a, sizeof r);
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, big, strlen(big), NULL, &r, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "more than 64 tool calls") != NULL);
	CHECK(r.n_calls == 0x5a5a5a5a);
	big[strlen(big) - strlen("<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>\n")] = '\0';
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, big, strlen(big), NULL, &r, err, sizeof err), 64);
	toolcall_result_clear(&r);
	free(big);
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, "x", (size_t)TOOLCALL_MAX_TEXT + 1, NULL, &r, err, sizeof err), -E2BIG);
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, NULL, 1, NULL, &r, err, sizeof err), -EINVAL);
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, "x", 1, NULL, NULL, err, sizeof err), -EINVAL);
	/* text need not be NUL-terminated: only LEN bytes are read */
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, "abc<tool_call>", 3, NULL, &r, err, sizeof err), 0);
	CHECK_STR_EQ(r.content, "abc");
	toolcall_result_clear(&r);
	toolcall_result_clear(NULL);
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

/* Every prefix and thousands of mutations of valid outputs: never a crash,
 * always a result, and when no call is found, the text kept whole. */
static void test_parse_hostile(void)
{
	static const char *const texts[] = {
		"Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"a\": null}]}}\n</tool_call>",
		"<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"f\", \"parameters\": {}}",
		"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]",
		"```json\n{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}\n```",
	};
	char buf[512];
	int runs = 0;

	for (size_t i = 0; i < ARRAY_LEN(texts); i++) {
		size_t len = strlen(texts[i]);
		for (int st = TOOLCALL_GENERIC; st <= TOOLCALL_MISTRAL; st++) {
			for (size_t k = 0; k <= len; k++) {
				struct toolcall_result r;
				int rc = toolcall_parse(st, texts[i], k, NULL, &r, err, sizeof err);
				runs++;
				if (rc < 0) {
					test_failures++;
					continue;
				}
				if (rc == 0 && (r.content_len != k || memcmp(r.content, texts[i], k) != 0)) {
					fprintf(stderr, "%s: prefix %zu of text %zu lost its content\n",
						toolcall_style_name(st), k, i);
					test_failures++;
				}
				for (int c = 0; c < r.n_calls; c++)
					CHECK(r.calls[c].name && r.calls[c].arguments && r.calls[c].arguments[0] == '{');
				toolcall_result_clear(&r);
			}
		}
		for (int m = 0; m < 3000; m++) {
			memcpy(buf, texts[i], len + 1);
			for (int e = 1 + (int)(rnd() % 4); e > 0; e--) {
				static const char bytes[] = "{}[]\":,\\ \n<>|/_TOOL0123nulltrue\xc3\xa9\x80";
				buf[rnd() % len] = bytes[rnd() % (sizeof bytes - 1)];
			}
			int st = (int)(rnd() % 4);
			struct toolcall_result r;
			int rc = toolcall_parse(st, buf, len, NULL, &r, err, sizeof err);
			runs++;
			if (rc < 0 || strlen(r.content) > r.content_len) {
				test_failures++;
				fprintf(stderr, "mutation of text %zu: %d\n", i, rc);
			}
			if (rc == 0 && memcmp(r.content, buf, len) != 0) {
				fprintf(stderr, "mutation of text %zu lost its content: %s\n", i, buf);
				test_failures++;
			}
			if (rc >= 0)
				toolcall_result_clear(&r);
		}
	}
	/* deep nesting is refused by the JSON reader, not the stack */
	char *deep = malloc(100020);
	strcpy(deep, "<tool_call>{\"name\": \"x\", \"arguments\": ");
	size_t n = strlen(deep);
	for (int i = 0; i < 50000; i++)
		deep[n++] = '[';
	deep[n] = '\0';
	struct toolcall_result r;
	CHECK_INT_EQ(toolcall_parse(TOOLCALL_HERMES, deep, n, NULL, &r, err, sizeof err), 0);
	toolcall_result_clear(&r);
	free(deep);
	fprintf(stderr, "%d hostile parses\n", runs);
}

static void test_stream_safe(void)
{
	static const struct { enum toolcall_style st; const char *text; size_t want; } cases[] = {
		{ TOOLCALL_HERMES, "Hello", 5 },
		{ TOOLCALL_HERMES, "Hello <tool", 6 },
		{ TOOLCALL_HERMES, "Hello <", 6 },
		{ TOOLCALL_HERMES, "Hello <b>", 9 },
		{ TOOLCALL_HERMES, "a<tool_call>{", 1 },
		{ TOOLCALL_HERMES, "", 0 },
		{ TOOLCALL_LLAMA3, "  {", 0 },
		{ TOOLCALL_LLAMA3, "  ", 0 },
		{ TOOLCALL_LLAMA3, "Hi", 2 },
		{ TOOLCALL_LLAMA3, "Hi <|py", 3 },
		{ TOOLCALL_LLAMA3, "Hi <|python_tag|>{", 3 },
		{ TOOLCALL_MISTRAL, "[", 0 },
		{ TOOLCALL_MISTRAL, "Ok [TOOL_", 3 },
		{ TOOLCALL_MISTRAL, "Ok [1]", 6 },
		{ TOOLCALL_GENERIC, "{", 0 },
		{ TOOLCALL_GENERIC, "``", 0 },
		{ TOOLCALL_GENERIC, "Hi {", 4 },
	};
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		size_t got = toolcall_stream_safe(cases[i].st, cases[i].text, strlen(cases[i].text));
		if (got != cases[i].want) {
			fprintf(stderr, "stream_safe %s \"%s\": %zu, expected %zu\n",
				toolcall_style_name(cases[i].st), cases[i].text, got, cases[i].want);
			test_failures++;
		}
	}
}

int main(void)
{
	setenv("TZ", "UTC", 1); /* strftime_now() as toolcall_jinja2.py sees it */
	tzset();
	test_detect();
	test_choice();
	test_tools_check();
	test_render_native();
	test_render_errors();
	test_render_generic();
	test_render_vs_jinja2();
	test_grammar();
	test_parse_rendered();
	test_parse_cases();
	test_parse_hostile();
	test_stream_safe();
	if (!test_failures && jinja2_missing)
		return TEST_SKIP;
	return test_result();
}
