/* chat.h - chat templates: a list of messages -> the prompt text a model expects.
 *
 * The GGUF's tokenizer.chat_template is a Jinja source: chat_template_from_source
 * compiles it (jinja.h) and chat_render runs it, so each model gets its own
 * template's prompt.  Where the source does not compile, it is recognised by
 * its markers as one of six known families, each rendered by C code that
 * reproduces llama.cpp's output; chat_template_by_name picks a family by
 * name.  Unknown templates give -ENOTSUP, so callers can refuse chat mode
 * and still allow raw completion.  Pure functions; any thread (one template
 * may be rendered by several threads at once).
 */
#ifndef LLMD_CHAT_H
#define LLMD_CHAT_H

#include <stddef.h>

#include "toolcall.h"

struct jinja_template;
struct json_object;

/* Evaluation steps a Jinja template may take for one prompt (jinja.h's
 * max_steps): ~0.1 s; real templates take ~500 a message. */
#define CHAT_JINJA_MAX_STEPS 4000000u

enum chat_tmpl {
	CHAT_TMPL_CHATML = 1,   /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
	CHAT_TMPL_LLAMA2 = 2,   /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
	CHAT_TMPL_LLAMA3 = 3,   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	CHAT_TMPL_MISTRAL = 4,  /* [INST] ... [/INST] without <<SYS>> */
	CHAT_TMPL_GEMMA = 5,    /* <start_of_turn>user\n...<end_of_turn>\n */
	CHAT_TMPL_ZEPHYR = 6,   /* <|user|>\n...</s>\n<|assistant|>\n */
	CHAT_TMPL_JINJA = 7,    /* the model's own Jinja source, run by jinja.c */
};

struct chat_msg {
	const char *role;    /* "system", "user", "assistant" (a Jinja template
	                        may take others, "tool"...) */
	const char *content; /* NUL-terminated UTF-8 */
};

struct chat_template {
	enum chat_tmpl kind;  /* what chat_render runs: CHAT_TMPL_JINJA when
	                         jinja is set, else a family; 0 = none */
	char *default_system; /* system message the template inserts when the
	                         conversation has none (SmolLM2 does), or NULL;
	                         owned; families only */
	struct jinja_template *jinja; /* the compiled source, or NULL; owned */
	enum chat_tmpl family;        /* the family the source looks like, 0 if
	                                 none (what a failed compile fell back to) */
	char *bos, *eos;      /* bos_token and eos_token as the template sees
	                         them, or NULL (undefined there); owned */
	int strip_bos;        /* the tokenizer prepends BOS: chat_render removes
	                         one leading bos text from the Jinja output */
	enum toolcall_style tool_style; /* how the model writes tool calls: the
	                                   source's (toolcall_style_detect) when
	                                   it runs as Jinja, else
	                                   TOOLCALL_GENERIC; what chat_render_json
	                                   renders tools for and what
	                                   toolcall_grammar/_parse take */
};

/* Builds a template from SRC (NUL-terminated Jinja source; NULL = the file
 * has none), BOS and EOS the texts of the model's BOS and EOS tokens (NULL
 * when it has none), ADD_BOS 1 when the tokenizer prepends BOS to a prompt.
 * The source is compiled and run by jinja.c (kind CHAT_TMPL_JINJA); a source
 * that does not compile falls back to the family its markers name (kind
 * that family; ERR still says why the compile failed).  Returns 0 and fills
 * *RET (free with chat_template_clear), -ENOTSUP for an absent template or
 * one that neither compiles nor is recognised (ERR: the compile error),
 * -ENOMEM.  *RET is untouched on failure. */
int chat_template_from_source(const char *src, const char *bos, const char *eos, int add_bos,
			      struct chat_template *ret, char *err, size_t errlen);
/* Recognises SRC (NUL-terminated Jinja source; NULL = the file has none) as
 * one of the families, without compiling it.
 * Returns 0 and fills *ret, -ENOTSUP for an unknown or absent template,
 * -ENOMEM. */
int chat_template_detect(const char *src, struct chat_template *ret);
/* Picks a template by name ("chatml", "llama2", "llama3", "mistral",
 * "gemma", "zephyr"); -ENOTSUP for any other. */
int chat_template_by_name(const char *name, struct chat_template *ret);
/* Frees what T owns and zeroes it; NULL-safe. */
void chat_template_clear(struct chat_template *t);
/* "chatml", ... "zephyr", "jinja" for CHAT_TMPL_JINJA, else "unknown". */
const char *chat_template_name(enum chat_tmpl kind);

/* Renders N messages, ending with the assistant's turn opener when
 * ADD_ASSISTANT (Jinja's add_generation_prompt).  BOS is not written where
 * the tokenizer adds it: a Jinja template's output loses one leading
 * bos_token text when strip_bos is set.  Returns the length and a malloc'd
 * NUL-terminated string in *ret, -EINVAL for an unknown role or a malformed
 * conversation (e.g. llama2 with two system messages, or a Jinja template
 * that fails or calls raise_exception), -E2BIG when a Jinja template exceeds
 * jinja.h's default limits or CHAT_JINJA_MAX_STEPS, -ENOMEM. */
int chat_render(const struct chat_template *t, const struct chat_msg *msgs, int n,
		int add_assistant, char **ret);
/* chat_render, with why it failed in ERR ("line 3: raise_exception:
 * Conversation roles must alternate user/assistant/user/assistant/..."). */
int chat_render_err(const struct chat_template *t, const struct chat_msg *msgs, int n,
		    int add_assistant, char **ret, char *err, size_t errlen);

/* Renders an OpenAI-shaped conversation: MESSAGES an array of {"role",
 * "content" (a string, null, or an array of parts whose "text" ones are
 * joined by newlines), "tool_calls" ([{"id", "type", "function": {"name",
 * "arguments"}}], arguments a JSON string), "tool_call_id", "name"}, TOOLS
 * OpenAI's tools array (NULL or empty = none; pass none for tool_choice
 * "none"), ADD_ASSISTANT as for chat_render.
 * Where t->tool_style is not TOOLCALL_GENERIC, the template renders the
 * tools and calls itself: messages go to it shaped as Hugging Face's
 * templates expect (content a string, tool_calls only on messages that
 * have some, arguments an object where the string parses as JSON).
 * Otherwise (GENERIC, families) the tools are described in the system
 * message (toolcall_generic_system, after the conversation's own system
 * text, or as a new first one), assistant tool_calls become the JSON the
 * model is asked to write (toolcall_generic_calls), and where the template
 * refuses what that gives, it is rendered again with tool results as user
 * turns ("Tool result for call ID (NAME): ...") and turns of one role
 * merged, then also with system text folded into the user's turn.
 * Returns the length and a malloc'd NUL-terminated *RET, or chat_render's
 * errors: -EINVAL with why in ERR for a malformed message, tools or a
 * conversation the template refuses, -ENOTSUP, -E2BIG, -ENOMEM.  Any
 * thread; MESSAGES and TOOLS are only read (one thread at a time per JSON
 * document: json-c's reference counts). */
int chat_render_json(const struct chat_template *t, struct json_object *messages,
		     struct json_object *tools, int add_assistant, char **ret, char *err,
		     size_t errlen);

#endif
