/* test_chat.c - pins chat templates: which family each real template source
 * is detected as (and which look-alikes are refused), the exact prompt each
 * family renders (llama.cpp's llama_chat_apply_template output), SmolLM2's
 * default system message, and the errors; then the templates' own Jinja
 * through chat_render: the same prompt as the family for the real sources
 * of SmolLM2 (its GGUF's), Qwen, Llama 3, Gemma and Zephyr, BOS removed
 * where the tokenizer adds it, raise_exception's message, and the fallback
 * to the family when a source does not compile.
 */
#include <errno.h>

#include "chat.h"
#include "gguf.h"
#include "testutil.h"

/* ---- template sources, as found in GGUF tokenizer.chat_template ---- */

/* HuggingFaceTB/SmolLM2-135M-Instruct, byte for byte */
static const char smollm2_src[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
	"{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
	"Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
	"message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
	"{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* teknium/OpenHermes-2.5-Mistral-7B: plain ChatML, no default system */
static const char chatml_src[] =
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
	"message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
	"{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Qwen2.5-Instruct, shortened: the default is in the second literal, after a
 * system header literal that is not one, and in double quotes with escapes */
static const char qwen_src[] =
	"{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
	"{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
	"{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
	"messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
	"{{- \"<|im_start|>system\\nYou are Qwen, \\\"created\\\" by Alibaba Cloud.\\tYou are "
	"a helpful assistant.<|im_end|>\\n\" }}{%- endif %}{%- endif %}"
	"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
	"message.content + '<|im_end|>' + '\\n' }}{%- endfor %}"
	"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* meta-llama/Llama-2-7b-chat-hf */
static const char llama2_src[] =
	"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
	"{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = "
	"messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
	"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('"
	"Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
	"{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
	"system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
	"message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
	"'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
	"{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* mistralai/Mistral-7B-Instruct-v0.2 */
static const char mistral_src[] =
	"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
	"(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
	"user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
	"{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
	"'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
	"user and assistant roles are supported!') }}{% endif %}{% endfor %}";

/* meta-llama/Meta-Llama-3-8B-Instruct */
static const char llama3_src[] =
	"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
	"'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
	"| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
	"{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
	"'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* google/gemma-7b-it */
static const char gemma_src[] =
	"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
	"not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
	"'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
	"alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
	"'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
	"{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
	"'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
	"{{'<start_of_turn>model\\n'}}{% endif %}";

/* HuggingFaceH4/zephyr-7b-beta */
static const char zephyr_src[] =
	"{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
	"message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
	"{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
	"'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
	"{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
	"{% endfor %}";

/* look-alikes that render differently: refused */
static const char phi3_src[] = /* microsoft/Phi-3-mini-4k-instruct */
	"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
	"{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + "
	"'\\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + "
	"'\\n'}}{% endif %}{% endfor %}";
static const char phi4_src[] =
	"{% for message in messages %}{% if (message['role'] == 'system') %}"
	"{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}"
	"{% endfor %}";
static const char mistral_v7_src[] =
	"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
	"{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}"
	"{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% endif %}"
	"{% endfor %}";
static const char vicuna_src[] =
	"{%- for message in messages %}{%- if message['role'] == 'user' -%}"
	"{{-'USER: ' + message['content'] + '\\n'-}}{%- else -%}"
	"{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}{%- endif -%}{%- endfor -%}";

/* ---- helpers ---- */

/* system + user + assistant + user, as in llama.cpp's test-chat-template */
static const struct chat_msg conv[] = {
	{ "system", "You are a helpful assistant" },
	{ "user", "Hello" },
	{ "assistant", "Hi there" },
	{ "user", "Who are you" },
};

/* Renders MSGS with T and compares with WANT; checks the returned length. */
static void check_render(const struct chat_template *t, const struct chat_msg *msgs, int n,
			 int add_assistant, const char *want)
{
	char *got = NULL;
	int rc = chat_render(t, msgs, n, add_assistant, &got);
	CHECK_INT_EQ(rc, (int)strlen(want));
	CHECK_STR_EQ(got, want);
	free(got);
}

static void check_detect(const char *src, enum chat_tmpl kind, const char *def)
{
	struct chat_template t = { 0 };
	CHECK_INT_EQ(chat_template_detect(src, &t), 0);
	CHECK_INT_EQ(t.kind, kind);
	if (def)
		CHECK_STR_EQ(t.default_system, def);
	else
		CHECK(t.default_system == NULL);
	chat_template_clear(&t);
	CHECK(t.default_system == NULL);
}

/* ---- tests ---- */

static void test_detect(void)
{
	check_detect(smollm2_src, CHAT_TMPL_CHATML,
		     "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
	check_detect(chatml_src, CHAT_TMPL_CHATML, NULL);
	check_detect(qwen_src, CHAT_TMPL_CHATML,
		     "You are Qwen, \"created\" by Alibaba Cloud.\tYou are a helpful assistant.");
	check_detect(llama2_src, CHAT_TMPL_LLAMA2, NULL);
	check_detect(mistral_src, CHAT_TMPL_MISTRAL, NULL);
	check_detect(llama3_src, CHAT_TMPL_LLAMA3, NULL);
	check_detect(gemma_src, CHAT_TMPL_GEMMA, NULL);
	check_detect(zephyr_src, CHAT_TMPL_ZEPHYR, NULL);

	struct chat_template t = { .kind = CHAT_TMPL_GEMMA, .default_system = NULL };
	CHECK_INT_EQ(chat_template_detect(phi3_src, &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect(phi4_src, &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect(mistral_v7_src, &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect(vicuna_src, &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect("", &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect("hello {{ messages }}", &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_detect(NULL, &t), -ENOTSUP);
	CHECK_INT_EQ(t.kind, CHAT_TMPL_GEMMA); /* untouched on failure */
	CHECK_INT_EQ(chat_template_detect(chatml_src, NULL), -EINVAL);

	/* an unterminated literal is not a default system message */
	check_detect("{{ '<|im_start|>system\\nOops<|im_end|>", CHAT_TMPL_CHATML, NULL);
}

static void test_by_name(void)
{
	static const char *const names[] = { "chatml", "llama2", "llama3",
					     "mistral", "gemma", "zephyr" };
	static const enum chat_tmpl kinds[] = { CHAT_TMPL_CHATML, CHAT_TMPL_LLAMA2,
						CHAT_TMPL_LLAMA3, CHAT_TMPL_MISTRAL,
						CHAT_TMPL_GEMMA, CHAT_TMPL_ZEPHYR };
	for (int i = 0; i < 6; i++) {
		struct chat_template t = { 0 };
		CHECK_INT_EQ(chat_template_by_name(names[i], &t), 0);
		CHECK_INT_EQ(t.kind, kinds[i]);
		CHECK(t.default_system == NULL);
		CHECK_STR_EQ(chat_template_name(kinds[i]), names[i]);
	}
	struct chat_template t = { 0 };
	CHECK_INT_EQ(chat_template_by_name("vicuna", &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_by_name("ChatML", &t), -ENOTSUP);
	CHECK_INT_EQ(chat_template_by_name(NULL, &t), -ENOTSUP);
	CHECK_STR_EQ(chat_template_name((enum chat_tmpl)99), "unknown");
	chat_template_clear(NULL);
}

/* The expected prompts are llama.cpp's for the same conversation. */
static void test_render_families(void)
{
	struct chat_template t = { 0 };

	t.kind = CHAT_TMPL_CHATML;
	check_render(&t, conv, 4, 1,
		     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
		     "<|im_start|>user\nHello<|im_end|>\n"
		     "<|im_start|>assistant\nHi there<|im_end|>\n"
		     "<|im_start|>user\nWho are you<|im_end|>\n"
		     "<|im_start|>assistant\n");
	check_render(&t, conv, 4, 0,
		     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
		     "<|im_start|>user\nHello<|im_end|>\n"
		     "<|im_start|>assistant\nHi there<|im_end|>\n"
		     "<|im_start|>user\nWho are you<|im_end|>\n");

	t.kind = CHAT_TMPL_LLAMA2;
	check_render(&t, conv, 4, 1,
		     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\n"
		     "Hello [/INST]Hi there</s>[INST] Who are you [/INST]");

	t.kind = CHAT_TMPL_MISTRAL;
	check_render(&t, conv, 4, 1,
		     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>"
		     "[INST] Who are you [/INST]");
	check_render(&t, conv + 1, 3, 1, "[INST] Hello [/INST]Hi there</s>[INST] Who are you [/INST]");

	t.kind = CHAT_TMPL_LLAMA3;
	check_render(&t, conv, 4, 1,
		     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
		     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
		     "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
		     "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
		     "<|start_header_id|>assistant<|end_header_id|>\n\n");

	t.kind = CHAT_TMPL_GEMMA;
	check_render(&t, conv, 4, 1,
		     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
		     "<start_of_turn>model\nHi there<end_of_turn>\n"
		     "<start_of_turn>user\nWho are you<end_of_turn>\n"
		     "<start_of_turn>model\n");

	t.kind = CHAT_TMPL_ZEPHYR;
	check_render(&t, conv, 4, 1,
		     "<|system|>\nYou are a helpful assistant</s>\n"
		     "<|user|>\nHello</s>\n"
		     "<|assistant|>\nHi there</s>\n"
		     "<|user|>\nWho are you</s>\n"
		     "<|assistant|>\n");
}

/* Which families trim message text, as llama.cpp does. */
static void test_render_trimming(void)
{
	const struct chat_msg padded[] = {
		{ "user", " Hello\n" },
		{ "assistant", "   I am an assistant   " },
		{ "user", "Again" },
	};
	struct chat_template t = { 0 };
	t.kind = CHAT_TMPL_CHATML;
	check_render(&t, padded, 3, 1,
		     "<|im_start|>user\n Hello\n<|im_end|>\n"
		     "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
		     "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");
	t.kind = CHAT_TMPL_LLAMA2;
	check_render(&t, padded, 3, 1,
		     "[INST] Hello [/INST]I am an assistant</s>[INST] Again [/INST]");
	t.kind = CHAT_TMPL_MISTRAL;
	check_render(&t, padded, 3, 1,
		     "[INST]  Hello\n [/INST]   I am an assistant   </s>[INST] Again [/INST]");
	t.kind = CHAT_TMPL_LLAMA3;
	check_render(&t, padded, 3, 0,
		     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
		     "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
		     "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>");
	t.kind = CHAT_TMPL_GEMMA;
	check_render(&t, padded, 3, 0,
		     "<start_of_turn>user\nHello<end_of_turn>\n"
		     "<start_of_turn>model\nI am an assistant<end_of_turn>\n"
		     "<start_of_turn>user\nAgain<end_of_turn>\n");
	t.kind = CHAT_TMPL_ZEPHYR;
	check_render(&t, padded, 1, 0, "<|user|>\n Hello\n</s>\n");
}

static void test_smollm2_default_system(void)
{
	struct chat_template t = { 0 };
	CHECK_INT_EQ(chat_template_detect(smollm2_src, &t), 0);

	const struct chat_msg without[] = { { "user", "What is 2+2?" } };
	check_render(&t, without, 1, 1,
		     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
		     "Hugging Face<|im_end|>\n"
		     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
		     "<|im_start|>assistant\n");

	const struct chat_msg with[] = {
		{ "system", "You are a pirate." },
		{ "user", "What is 2+2?" },
	};
	check_render(&t, with, 2, 1,
		     "<|im_start|>system\nYou are a pirate.<|im_end|>\n"
		     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
		     "<|im_start|>assistant\n");

	/* the template inserts it at loop.first: not into an empty conversation */
	check_render(&t, NULL, 0, 1, "<|im_start|>assistant\n");
	chat_template_clear(&t);
}

static void test_render_errors(void)
{
	struct chat_template t = { .kind = CHAT_TMPL_CHATML };
	char *out = (char *)&t; /* must stay untouched */
	const struct chat_msg tool[] = { { "user", "hi" }, { "tool", "42" } };
	CHECK_INT_EQ(chat_render(&t, tool, 2, 1, &out), -EINVAL);
	const struct chat_msg upper[] = { { "User", "hi" } };
	CHECK_INT_EQ(chat_render(&t, upper, 1, 1, &out), -EINVAL);
	const struct chat_msg null_content[] = { { "user", NULL } };
	CHECK_INT_EQ(chat_render(&t, null_content, 1, 1, &out), -EINVAL);
	const struct chat_msg null_role[] = { { NULL, "hi" } };
	CHECK_INT_EQ(chat_render(&t, null_role, 1, 1, &out), -EINVAL);
	CHECK_INT_EQ(chat_render(&t, conv, -1, 1, &out), -EINVAL);
	CHECK_INT_EQ(chat_render(&t, NULL, 2, 1, &out), -EINVAL);
	CHECK_INT_EQ(chat_render(NULL, conv, 4, 1, &out), -EINVAL);
	CHECK_INT_EQ(chat_render(&t, conv, 4, 1, NULL), -EINVAL);
	CHECK(out == (char *)&t);

	/* [INST] formats take one system message, and only first */
	const struct chat_msg two_sys[] = {
		{ "system", "a" }, { "system", "b" }, { "user", "hi" },
	};
	const struct chat_msg late_sys[] = {
		{ "user", "hi" }, { "assistant", "yo" }, { "system", "b" }, { "user", "hi" },
	};
	t.kind = CHAT_TMPL_LLAMA2;
	CHECK_INT_EQ(chat_render(&t, two_sys, 3, 1, &out), -EINVAL);
	CHECK_INT_EQ(chat_render(&t, late_sys, 4, 1, &out), -EINVAL);
	t.kind = CHAT_TMPL_MISTRAL;
	CHECK_INT_EQ(chat_render(&t, two_sys, 3, 1, &out), -EINVAL);
	CHECK(out == (char *)&t);

	/* other families take them anywhere */
	t.kind = CHAT_TMPL_GEMMA;
	check_render(&t, late_sys, 4, 1,
		     "<start_of_turn>user\nhi<end_of_turn>\n"
		     "<start_of_turn>model\nyo<end_of_turn>\n"
		     "<start_of_turn>user\nb\n\nhi<end_of_turn>\n"
		     "<start_of_turn>model\n");

	t.kind = (enum chat_tmpl)0;
	CHECK_INT_EQ(chat_render(&t, conv, 4, 1, &out), -ENOTSUP);
}

/* ---- the template's own Jinja ---- */

/* Renders MSGS through SRC's family and through SRC itself (compiled):
 * both must give the same prompt. */
static void check_same(const char *src, const char *bos, const char *eos, int add_bos,
		       const struct chat_msg *msgs, int n, int add_assistant)
{
	struct chat_template fam = { 0 }, jin = { 0 };
	char err[256], *a = NULL, *b = NULL;
	CHECK_INT_EQ(chat_template_detect(src, &fam), 0);
	CHECK_INT_EQ(chat_template_from_source(src, bos, eos, add_bos, &jin, err, sizeof err), 0);
	CHECK_STR_EQ(err, "");
	CHECK_INT_EQ(jin.kind, CHAT_TMPL_JINJA);
	CHECK_INT_EQ(jin.family, fam.kind);
	CHECK(jin.default_system == NULL);
	int ra = chat_render(&fam, msgs, n, add_assistant, &a);
	int rb = chat_render_err(&jin, msgs, n, add_assistant, &b, err, sizeof err);
	CHECK(ra > 0);
	CHECK_INT_EQ(rb, ra);
	CHECK_STR_EQ(b, a);
	if (rb < 0)
		fprintf(stderr, "  (%s: %s)\n", chat_template_name(fam.kind), err);
	free(a);
	free(b);
	chat_template_clear(&fam);
	chat_template_clear(&jin);
	CHECK(jin.jinja == NULL && jin.bos == NULL && jin.kind == 0);
}

static const struct chat_msg odd_conv[] = {
	{ "user", " Hello\n" },
	{ "assistant", "   I am an assistant   " },
	{ "user", "Again {{ not jinja }} 'q' \"dq\" \u00e9" },
};

static void test_jinja_matches_families(void)
{
	const struct chat_msg one[] = { { "user", "What is 2+2?" } };
	const char *chatml[] = { smollm2_src, chatml_src, qwen_src };
	for (int i = 0; i < 3; i++)
		for (int add = 0; add < 2; add++) {
			/* (the shortened Qwen source above writes a system message
			 * twice, as its family would not: the real one is in
			 * tests/templates/) */
			if (chatml[i] != qwen_src)
				check_same(chatml[i], "<|im_start|>", "<|im_end|>", 0, conv, 4, add);
			check_same(chatml[i], "<|im_start|>", "<|im_end|>", 0, conv + 1, 3, add);
			check_same(chatml[i], "<|im_start|>", "<|im_end|>", 0, one, 1, add);
			check_same(chatml[i], "<|im_start|>", "<|im_end|>", 0, odd_conv, 3, add);
		}
	/* Llama 3 and Gemma write bos_token first: the tokenizer adds it */
	for (int add = 0; add < 2; add++) {
		check_same(llama3_src, "<|begin_of_text|>", "<|eot_id|>", 1, conv, 4, add);
		check_same(llama3_src, "<|begin_of_text|>", "<|eot_id|>", 1, odd_conv, 3, add);
		check_same(gemma_src, "<bos>", "<eos>", 1, conv + 1, 3, add);
		check_same(gemma_src, "<bos>", "<eos>", 1, odd_conv, 3, add);
		check_same(zephyr_src, "<s>", "</s>", 1, conv, 4, add);
	}
}

/* The SmolLM2 GGUF's own template (its string literals hold real newlines,
 * unlike the source above) renders as the chatml family did. */
static void test_smollm2_gguf_template(void)
{
	const char *path = test_smollm2_path();
	if (!path) {
		fprintf(stderr, "skipping the SmolLM2 GGUF's template: no model (make fetch-model)\n");
		return;
	}
	struct gguf_file *f;
	struct gguf_str s;
	char err[256];
	CHECK_INT_EQ(gguf_open(path, &f, err, sizeof err), 0);
	CHECK_INT_EQ(gguf_get_str(f, "tokenizer.chat_template", &s), 0);
	char *src = strndup(s.ptr, s.len);
	gguf_close(f);
	const struct chat_msg one[] = { { "user", "What is 2+2?" } };
	for (int add = 0; add < 2; add++) {
		check_same(src, "<|im_start|>", "<|im_end|>", 0, conv, 4, add);
		check_same(src, "<|im_start|>", "<|im_end|>", 0, conv + 1, 3, add);
		check_same(src, "<|im_start|>", "<|im_end|>", 0, one, 1, add);
	}
	struct chat_template t = { 0 };
	CHECK_INT_EQ(chat_template_from_source(src, "<|im_start|>", "<|im_end|>", 0, &t, err, sizeof err), 0);
	check_render(&t, one, 1, 1,
		     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
		     "Hugging Face<|im_end|>\n"
		     "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
		     "<|im_start|>assistant\n");
	CHECK_STR_EQ(chat_template_name(t.kind), "jinja");
	chat_template_clear(&t);
	free(src);
}

/* Gemma 2's template from tests/templates/ (Gemma 3's GGUF here carries
 * none): the gemma family's prompt, and its refusal of a system message. */
static void test_gemma2_file(void)
{
	char path[4096], err[256], *out = NULL;
	const char *srcdir = getenv("LLMD_SRCDIR");
	snprintf(path, sizeof path, "%s/tests/templates/google-gemma-2-2b-it.jinja", srcdir ? srcdir : ".");
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "skipping %s: absent\n", path);
		return;
	}
	char src[8192];
	size_t n = fread(src, 1, sizeof src - 1, f);
	fclose(f);
	src[n] = '\0';
	for (int add = 0; add < 2; add++) {
		check_same(src, "<bos>", "<eos>", 1, conv + 1, 3, add);
		check_same(src, "<bos>", "<eos>", 1, odd_conv, 3, add);
	}
	struct chat_template t = { 0 };
	CHECK_INT_EQ(chat_template_from_source(src, "<bos>", "<eos>", 1, &t, err, sizeof err), 0);
	CHECK_INT_EQ(chat_render_err(&t, conv, 4, 1, &out, err, sizeof err), -EINVAL);
	CHECK(out == NULL);
	CHECK(strstr(err, "raise_exception: System role not supported") != NULL);
	CHECK(strncmp(err, "line ", 5) == 0);
	/* chat_render is chat_render_err without the message */
	CHECK_INT_EQ(chat_render(&t, conv, 4, 1, &out), -EINVAL);
	chat_template_clear(&t);
}

static void test_jinja_bos_and_roles(void)
{
	struct chat_template t = { 0 };
	char err[256];
	const struct chat_msg tool[] = { { "user", "hi" }, { "tool", "42" } };
	static const char bos2[] = "{{ bos_token }}{{ bos_token }}x{{ eos_token }}";
	static const char roles[] =
		"{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
		"{% if add_generation_prompt %}>{% endif %}";

	CHECK_INT_EQ(chat_template_from_source(bos2, "<s>", "</s>", 1, &t, err, sizeof err), 0);
	check_render(&t, NULL, 0, 0, "<s>x</s>"); /* one BOS removed, only one */
	chat_template_clear(&t);
	CHECK_INT_EQ(chat_template_from_source(bos2, "<s>", "</s>", 0, &t, err, sizeof err), 0);
	check_render(&t, NULL, 0, 0, "<s><s>x</s>"); /* no BOS added: none removed */
	chat_template_clear(&t);
	CHECK_INT_EQ(chat_template_from_source(bos2, NULL, NULL, 1, &t, err, sizeof err), 0);
	check_render(&t, NULL, 0, 0, "x"); /* no BOS text: undefined, prints nothing */
	chat_template_clear(&t);

	/* a Jinja template decides which roles it takes */
	CHECK_INT_EQ(chat_template_from_source(roles, NULL, NULL, 0, &t, err, sizeof err), 0);
	CHECK_INT_EQ(t.family, 0);
	check_render(&t, tool, 2, 1, "[user:hi][tool:42]>");
	check_render(&t, tool, 1, 0, "[user:hi]");
	char *out = (char *)&t;
	const struct chat_msg null_content[] = { { "user", NULL } };
	CHECK_INT_EQ(chat_render(&t, null_content, 1, 1, &out), -EINVAL);
	CHECK(out == (char *)&t);
	chat_template_clear(&t);
}

static void test_jinja_fallback(void)
{
	struct chat_template t = { .kind = CHAT_TMPL_GEMMA };
	char err[256];
	/* does not compile, but is ChatML by its markers: the family renders it */
	static const char broken_chatml[] =
		"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
		"message['content'] + '<|im_end|>' + '\n'}}{% endfor %{% if add_generation_prompt %}"
		"{{ '<|im_start|>assistant\n' }}{% endif";
	CHECK_INT_EQ(chat_template_from_source(broken_chatml, "<s>", "</s>", 0, &t, err, sizeof err), 0);
	CHECK_INT_EQ(t.kind, CHAT_TMPL_CHATML);
	CHECK_INT_EQ(t.family, CHAT_TMPL_CHATML);
	CHECK(t.jinja == NULL);
	if (strncmp(err, "line ", 5) != 0) {
		fprintf(stderr, "the compile error is \"%s\"\n", err);
		test_failures++;
	}
	CHECK_STR_EQ(chat_template_name(t.kind), "chatml");
	check_render(&t, conv + 1, 1, 1, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
	chat_template_clear(&t);

	/* neither compiles nor is known: refused, with the compile error */
	t.kind = CHAT_TMPL_GEMMA;
	CHECK_INT_EQ(chat_template_from_source("{% for x in %}", NULL, NULL, 0, &t, err, sizeof err), -ENOTSUP);
	CHECK(strstr(err, "line 1:") != NULL);
	CHECK_INT_EQ(t.kind, CHAT_TMPL_GEMMA); /* untouched on failure */
	CHECK_INT_EQ(chat_template_from_source(NULL, NULL, NULL, 0, &t, err, sizeof err), -ENOTSUP);
	CHECK_INT_EQ(chat_template_from_source(chatml_src, NULL, NULL, 0, NULL, err, sizeof err), -EINVAL);
	CHECK_STR_EQ(chat_template_name(CHAT_TMPL_JINJA), "jinja");

	/* a template that compiles but errors when run is still Jinja: its
	 * error reaches the caller */
	CHECK_INT_EQ(chat_template_from_source("<|im_start|>{{ x.y }}", NULL, NULL, 0, &t, err, sizeof err), 0);
	CHECK_INT_EQ(t.kind, CHAT_TMPL_JINJA);
	CHECK_INT_EQ(t.family, CHAT_TMPL_CHATML);
	char *out = NULL;
	CHECK_INT_EQ(chat_render_err(&t, conv, 4, 1, &out, err, sizeof err), -EINVAL);
	CHECK_STR_EQ(err, "line 1: 'x' is undefined");
	chat_template_clear(&t);
}

int main(void)
{
	test_detect();
	test_by_name();
	test_render_families();
	test_render_trimming();
	test_smollm2_default_system();
	test_render_errors();
	test_jinja_matches_families();
	test_smollm2_gguf_template();
	test_gemma2_file();
	test_jinja_bos_and_roles();
	test_jinja_fallback();
	return test_result();
}
