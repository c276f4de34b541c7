/* jinja.h - a Jinja interpreter for the chat templates that model files carry.
 *
 * The subset that chat templates use, with the semantics of Python's jinja2
 * as Hugging Face's apply_chat_template configures it
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * {% generation %}, raise_exception(), strftime_now(), tojson as
 * json.dumps(ensure_ascii=False)): the same input gives the same bytes.
 * Templates come from model files, so nothing in them is trusted: every
 * render is bounded in steps, depth, output and memory, and any failure is
 * an error with the template's line number, never a crash.
 *
 * A compiled template is immutable: any number of threads may render it at
 * once.  Nothing here logs or keeps global state.
 */
#ifndef LLMD_JINJA_H
#define LLMD_JINJA_H

#include <stddef.h>
#include <stdint.h>

struct json_object;
struct jinja_template;

/* What one render may use; exceeding any is an error (-E2BIG), not a hang. */
struct jinja_limits {
	uint64_t max_steps;  /* evaluation steps: nodes, loop turns, elements a
	                        filter touches */
	uint32_t max_depth;  /* nested macro calls, caller() and captured blocks */
	size_t max_output;   /* bytes of the rendered text (and of any block
	                        captured into a variable) */
	size_t max_memory;   /* bytes of values made while rendering, the
	                        context's copy included */
	int64_t now;         /* strftime_now()'s clock in seconds since the
	                        epoch, local time; 0 = the current time */
};

#define JINJA_MAX_STEPS 20000000u          /* ~1 s of the worst templates */
#define JINJA_MAX_DEPTH 64u
#define JINJA_MAX_OUTPUT (16u << 20)       /* 16 MiB */
#define JINJA_MAX_MEMORY (256u << 20)      /* 256 MiB */

/* Fills *LIM with the defaults above.  Any thread. */
void jinja_limits_default(struct jinja_limits *lim);

/* Parses LEN bytes of SRC (UTF-8, need not be NUL-terminated) into *RET.
 * Returns 0, -EINVAL with "line N: what" in ERR for a syntax error or a
 * construct this interpreter lacks (an unknown filter or test outside an
 * {% if %}, {% include %}, recursive loops...), -E2BIG for a source nested
 * too deeply, -ENOMEM.  *RET is untouched on failure.  Any thread. */
int jinja_compile(const char *src, size_t len, struct jinja_template **ret, char *err,
		  size_t errlen);

/* Renders T with the variables of CTX (a JSON object: messages,
 * add_generation_prompt, bos_token, eos_token, tools...; NULL = none) into a
 * malloc'd NUL-terminated *RET of *RET_LEN bytes.  LIM NULL = the defaults.
 * Returns 0; -EINVAL with "line N: what" in ERR for a runtime error (an
 * undefined value used, a type error, "line N: raise_exception: MSG" when
 * the template raises); -E2BIG when a limit is hit; -ENOMEM.  The outputs
 * are untouched on failure.  CTX is only read.  Any thread, concurrently on
 * the same T. */
int jinja_render(const struct jinja_template *t, struct json_object *ctx,
		 const struct jinja_limits *lim, char **ret, size_t *ret_len, char *err,
		 size_t errlen);

/* NULL-safe. */
void jinja_free(struct jinja_template *t);

#endif
