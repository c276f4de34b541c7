/* chat.h - chat templates: a list of messages -> the prompt text a model expects.
 *
 * The template is recognised from the GGUF's tokenizer.chat_template (a Jinja
 * source we do not execute) by its distinctive markers; each known family is
 * rendered by C code that reproduces its output.  Unknown templates give
 * -ENOTSUP, so callers can refuse chat mode and still allow raw completion.
 * Pure functions; any thread.
 */
#ifndef LLMD_CHAT_H
#define LLMD_CHAT_H

#include <stddef.h>

enum chat_tmpl {
	CHAT_TMPL_CHATML = 1,   /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
	CHAT_TMPL_LLAMA2 = 2,   /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
	CHAT_TMPL_LLAMA3 = 3,   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	CHAT_TMPL_MISTRAL = 4,  /* [INST] ... [/INST] without <<SYS>> */
	CHAT_TMPL_GEMMA = 5,    /* <start_of_turn>user\n...<end_of_turn>\n */
	CHAT_TMPL_ZEPHYR = 6,   /* <|user|>\n...</s>\n<|assistant|>\n */
};

struct chat_msg {
	const char *role;    /* "system", "user", "assistant" */
	const char *content; /* NUL-terminated UTF-8 */
};

struct chat_template {
	enum chat_tmpl kind;
	char *default_system; /* system message the template inserts when the
	                         conversation has none (SmolLM2 does), or NULL;
	                         owned */
};

/* Recognises SRC (NUL-terminated Jinja source; NULL = the file has none).
 * Returns 0 and fills *ret, -ENOTSUP for an unknown or absent template,
 * -ENOMEM. */
int chat_template_detect(const char *src, struct chat_template *ret);
/* Picks a template by name ("chatml", "llama2", "llama3", "mistral",
 * "gemma", "zephyr"); -ENOTSUP for any other. */
int chat_template_by_name(const char *name, struct chat_template *ret);
void chat_template_clear(struct chat_template *t); /* frees default_system */
const char *chat_template_name(enum chat_tmpl kind);

/* Renders N messages, ending with the assistant's turn opener when
 * ADD_ASSISTANT.  BOS is not written (the tokenizer adds it).  Returns the
 * length and a malloc'd NUL-terminated string in *ret, -EINVAL for an unknown
 * role or a malformed conversation (e.g. llama2 with two system messages),
 * -ENOMEM. */
int chat_render(const struct chat_template *t, const struct chat_msg *msgs, int n,
		int add_assistant, char **ret);

#endif
