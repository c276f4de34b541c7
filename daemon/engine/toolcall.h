/* toolcall.h - tool calling (OpenAI's tools / tool_calls) in the syntax of a
 * model's chat template: which syntax a template asks for, the grammar that
 * forces a call when tool_choice demands one, and the parse of a model's
 * output into content and calls.
 *
 * The styles, after llama.cpp's common/chat.cpp:
 *   HERMES   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>,
 *            one block a call (Qwen2.5, Qwen3, Hermes 2 Pro / 3, Granite 4)
 *   LLAMA3   {"name": "f", "parameters": {...}}, bare or after
 *            <|python_tag|>, one call a turn (Llama 3.1, 3.2, 3.3)
 *   MISTRAL  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
 *            (Mistral Nemo; not the [TOOL_CALLS]f[ARGS]{...} of v11
 *            templates, which get GENERIC)
 *   GENERIC  templates that know no tools, or tools in a syntax not above:
 *            chat.c describes the tools in the system message and asks for
 *            one JSON object, {"tool_calls": [{"name": "f", "arguments":
 *            {...}}]}, when the model calls tools.
 *
 * [TOOL_CALLS] and <|python_tag|> are control tokens, which a grammar
 * cannot make the model write: the grammars of MISTRAL and LLAMA3 start at
 * the JSON, and the parser takes a call with or without them (a
 * detokenizer may drop them).
 *
 * Call ids are not made here: the caller names each parsed call.  Nothing
 * here logs or keeps global state; any thread.  JSON arguments are only
 * read, but json-c's reference counts are not atomic in every build: one
 * thread at a time per JSON document.
 */
#ifndef LLMD_TOOLCALL_H
#define LLMD_TOOLCALL_H

#include <stddef.h>

struct json_object;

enum toolcall_style {
	TOOLCALL_GENERIC = 0, /* JSON object described in the system message */
	TOOLCALL_HERMES = 1,  /* <tool_call>...</tool_call> */
	TOOLCALL_LLAMA3 = 2,  /* {"name": ..., "parameters": ...} */
	TOOLCALL_MISTRAL = 3, /* [TOOL_CALLS][...] */
};

enum toolcall_choice {
	TOOLCALL_AUTO = 0,     /* the model decides: no grammar, parse after */
	TOOLCALL_NONE = 1,     /* no call: the caller passes no tools */
	TOOLCALL_REQUIRED = 2, /* at least one call, of any tool */
	TOOLCALL_NAMED = 3,    /* a call of one named tool */
};

/* What one request may bring or one output may hold.  Past any, the calls
 * below fail with -E2BIG naming the limit. */
#define TOOLCALL_MAX_TOOLS 128u          /* entries of a tools array */
#define TOOLCALL_MAX_CALLS 64u           /* calls in one output or one
                                            assistant message; a grammar
                                            with parallel calls allows as
                                            many */
#define TOOLCALL_MAX_NAME 64u            /* bytes of a function name
                                            (OpenAI's [A-Za-z0-9_-]{1,64},
                                            dots also allowed) */
#define TOOLCALL_MAX_TEXT (16u << 20)    /* bytes of output toolcall_parse
                                            takes */
#define TOOLCALL_JSON_DEPTH 64           /* nesting of JSON the parser
                                            reads */

/* The style a chat template's Jinja SRC (NUL-terminated; NULL = none)
 * writes tool calls in, by its markers; TOOLCALL_GENERIC for a template
 * that knows no tools or writes them in another syntax (Qwen3-Coder's
 * <function=...>, GLM's <arg_key>, Mistral v11's [ARGS]...).  Any thread. */
enum toolcall_style toolcall_style_detect(const char *src);

/* "generic", "hermes", "llama3", "mistral"; "unknown" for another value. */
const char *toolcall_style_name(enum toolcall_style style);

/* Reads a request's tool_choice (NULL = absent = "auto"): "auto", "none",
 * "required", or {"type": "function", "function": {"name": NAME}}.
 * Returns 0 with *RET_CHOICE and, for a named one, *RET_NAME (pointing
 * into TOOL_CHOICE; else NULL); -EINVAL with why in ERR.  Outputs are
 * untouched on failure. */
int toolcall_choice_parse(struct json_object *tool_choice, enum toolcall_choice *ret_choice,
			  const char **ret_name, char *err, size_t errlen);

/* Checks a request's tools (OpenAI's array of {"type": "function",
 * "function": {"name", "description"?, "parameters"?, "strict"?}}):
 * an array of at most TOOLCALL_MAX_TOOLS, each a function with a valid,
 * unique name and, when present, an object "parameters".  Returns 0;
 * -EINVAL ("tools[2].function.name: ...") or -E2BIG with why in ERR. */
int toolcall_tools_check(struct json_object *tools, char *err, size_t errlen);

/* The GBNF grammar (grammar.h's syntax, start rule "root") of an output
 * that is only tool calls in STYLE's syntax: for TOOLCALL_REQUIRED a call
 * of any of TOOLS, for TOOLCALL_NAMED one of the tool called NAME; with
 * PARALLEL, 1 to TOOLCALL_MAX_CALLS calls for
 * TOOLCALL_REQUIRED (a named function is called once) (LLAMA3 templates take one call
 * a turn: always one).  Each function's "parameters" is compiled by
 * jschema_to_gbnf (always JSCHEMA_STRICT: a call holds the function's
 * parameters and no others; an absent "parameters" is {}); their rules are renamed "tN-..." so that
 * they live side by side.  The calls are written as the template writes
 * them, so a constrained model writes what it was trained on (MISTRAL's
 * with the 9-character "id" Mistral's template gives each call, as
 * llama.cpp requires too).  The properties of the arguments come in
 * jschema's order (required ones first), not necessarily the schema's.
 * For TOOLCALL_AUTO with GENERIC (a template that knows no tools), the
 * answer its system text asks for: the calls' object, or {"response":
 * "..."} (llama.cpp's generic format; toolcall_parse makes it content).
 * Returns 0 and a malloc'd NUL-terminated *RET_GBNF, or 0 with *RET_GBNF
 * NULL for TOOLCALL_NONE and for TOOLCALL_AUTO in the other styles (free
 * text); -EINVAL for bad
 * tools (toolcall_tools_check), an unknown NAME or no tools; a function
 * whose schema does not compile gives jschema's error as
 * "tool get_weather: parameters: MESSAGE" (-ENOTSUP, -EINVAL or -E2BIG);
 * -ENOMEM.  *RET_GBNF is untouched on failure.  Any thread. */
int toolcall_grammar(enum toolcall_style style, struct json_object *tools,
		     enum toolcall_choice choice, const char *name, int parallel, char **ret_gbnf,
		     char *err, size_t errlen);

struct toolcall {
	char *name;      /* the function's name; malloc'd */
	char *arguments; /* a JSON object as compact text ({"city":"Paris"});
	                    malloc'd */
};

struct toolcall_result {
	char *content;          /* the output less its calls: malloc'd,
	                           NUL-terminated, "" when nothing is left; the
	                           text unchanged when it holds no call, else
	                           trimmed of the whitespace around the calls */
	size_t content_len;     /* bytes of content */
	struct toolcall *calls; /* n_calls of them in output order; malloc'd,
	                           NULL when none */
	int n_calls;
};

/* Splits LEN bytes of a model's output TEXT into content and the tool
 * calls written in STYLE's syntax.  Tolerant of whitespace and of a missing
 * closing tag at the end of the text; a call that does not parse as one
 * (bad JSON, no name, arguments not an object, a name not among TOOLS when
 * TOOLS is given; NULL = any name) is left in the content as the model
 * wrote it.  GENERIC takes {"tool_calls": [...]}, {"tool_call": {...}}
 * and {"response": "..."} (the content), optionally in a ``` fence.
 * Returns the number of calls and fills *RET (free with
 * toolcall_result_clear); -E2BIG past TOOLCALL_MAX_TEXT or
 * TOOLCALL_MAX_CALLS (ERR says which); -EINVAL for a NULL argument;
 * -ENOMEM.  *RET is untouched on failure.  Any thread. */
int toolcall_parse(enum toolcall_style style, const char *text, size_t len,
		   struct json_object *tools, struct toolcall_result *ret, char *err,
		   size_t errlen);

/* Frees what R owns and zeroes it; NULL-safe. */
void toolcall_result_clear(struct toolcall_result *r);

/* For streaming: how many leading bytes of the output so far (TEXT, LEN)
 * are content whatever comes next, i.e. where no call of STYLE can begin.
 * Text from there on may be a call (or the start of one) and is held back
 * until toolcall_parse sees the whole output.  Any thread. */
size_t toolcall_stream_safe(enum toolcall_style style, const char *text, size_t len);

/* GENERIC's system text: the functions of TOOLS (checked as by
 * toolcall_tools_check), one JSON object a line, and the answer's format.
 * Returns 0 and a malloc'd *RET; -EINVAL, -E2BIG (ERR: why), -ENOMEM. */
int toolcall_generic_system(struct json_object *tools, char **ret, char *err, size_t errlen);

/* An assistant message's TOOL_CALLS (OpenAI's [{"id", "type", "function":
 * {"name", "arguments"}}], arguments a JSON string or an object) as GENERIC
 * asks the model to write them: {"tool_calls": [{"name": "f",
 * "arguments": {...}}]}, with "content": CONTENT after them when CONTENT is
 * neither NULL nor empty.  Arguments that are not JSON are kept as a string.
 * Returns 0 and a malloc'd *RET; -EINVAL (ERR: why), -E2BIG past
 * TOOLCALL_MAX_CALLS, -ENOMEM. */
int toolcall_generic_calls(struct json_object *tool_calls, const char *content, char **ret,
			   char *err, size_t errlen);

#endif
