/* test_chat.c - pins chat templates: which family each real template source
 * is detected as (and which look-alikes are refused), the exact prompt each
 * family renders (llama.cpp's llama_chat_apply_template output), SmolLM2's
 * default system message, and the errors.
 */
#include <errno.h>

#include "chat.h"
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

int main(void)
{
	test_detect();
	test_by_name();
	test_render_families();
	test_render_trimming();
	test_smollm2_default_system();
	test_render_errors();
	return test_result();
}
