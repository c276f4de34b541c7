/* jschema.h - a JSON Schema -> a GBNF grammar (llama.cpp's syntax) whose
 * every sentence is a JSON text that the schema accepts.
 *
 * Sound first: whatever the grammar lets a model write must validate against
 * the schema; where a keyword asks for something a context-free grammar of
 * this shape cannot enforce, the conversion fails (-ENOTSUP) naming the
 * keyword and where it is ("uniqueItems at #/properties/tags: ..."), rather
 * than letting invalid output through.  The grammar may accept fewer texts
 * than the schema, never more: the properties of an object in one order
 * (required ones first), numbers of at most 16 digits, bounded ones without
 * exponent and with at most 15 significant digits when they have a
 * fraction, one spelling of each character of an enum, a const or a
 * pattern (raw UTF-8 or JSON's short escapes), no escapes in the keys of
 * additional properties, only tab, newline and carriage return of the
 * control characters a pattern's class allows unless it allows them all,
 * ASCII members only of \d \w \s and of a class negating one of them.
 *
 * The rules are shaped like llama.cpp's json-schema-to-grammar: one rule per
 * schema node named after its path ("address-city-kv"), shared primitives
 * ("string", "integer", "value", "space"...), required properties in the
 * schema's order then the optional ones in theirs, whitespace between tokens
 * through the bounded rule `space ::= | " " | "\n" [ \t]{0,20}`, none before
 * or after the root value.  The text is ASCII, one rule a line, sorted by
 * name; its start rule is "root".
 *
 * Keywords:
 *   enforced  type (a name or an array), enum, const, properties, required,
 *             additionalProperties (false, true, a schema), minProperties /
 *             maxProperties where the properties already imply them, items,
 *             prefixItems, additionalItems, minItems, maxItems, minLength,
 *             maxLength, pattern (Python re's regular subset: literals,
 *             classes, \d \w \s, groups, |, ? * + {m,n}, ^ $ at either end),
 *             format date, time, date-time, uuid, ipv4, email, minimum,
 *             maximum, exclusiveMinimum, exclusiveMaximum (integers: any
 *             bound; numbers: whole-number bounds), anyOf, oneOf (whose
 *             alternatives provably never overlap: by type, by value, or by
 *             a required const/enum property), allOf (merged), $ref to a
 *             local JSON pointer ("#/$defs/x", "#/definitions/x", "#"),
 *             recursive ones included, and multipleOf 1 on integers.
 *   ignored   annotations (title, description, default, examples, $schema,
 *             $id, $comment, deprecated, readOnly, writeOnly, content*...),
 *             unknown keywords (JSON Schema ignores them too), and a format
 *             not listed above unless JSCHEMA_FORMAT_ASSERT.
 *   refused   not, if/then/else, dependentSchemas, dependentRequired,
 *             dependencies, patternProperties, propertyNames, contains
 *             (and so minContains, maxContains), uniqueItems (true, over
 *             more than one item), unevaluatedProperties, unevaluatedItems
 *             (other than true), $dynamicRef,
 *             $recursiveRef, multipleOf (other than 1 on integers),
 *             non-whole bounds on numbers, lookaround and backreferences in
 *             patterns, oneOf whose alternatives may overlap, non-local $ref.
 *
 * Nothing here logs or keeps global state: any thread may convert.  The
 * schema is only read, but the conversion takes json-c references on parts
 * of it, and json-c's reference counts are atomic only in some builds: one
 * conversion at a time per schema document.
 */
#ifndef LLMD_JSCHEMA_H
#define LLMD_JSCHEMA_H

#include <stddef.h>

struct json_object;

/* Flags of jschema_to_gbnf. */
#define JSCHEMA_STRICT 0x1u        /* OpenAI's strict mode: an object without
                                      "additionalProperties" allows none, an
                                      array with prefixItems and no "items"
                                      ends after them (without it, JSON
                                      Schema's defaults: any extra) */
#define JSCHEMA_FORMAT_ASSERT 0x2u /* refuse a "format" the grammar cannot
                                      enforce (without it, such a format is
                                      the annotation JSON Schema 2020-12
                                      makes it by default) */

/* What one conversion may use: the schema comes from a client.  Past any, the
 * conversion fails with -E2BIG naming the limit. */
#define JSCHEMA_MAX_DEPTH 64u          /* nested schemas, $ref hops, allOf
                                          merges, pattern groups */
#define JSCHEMA_MAX_GBNF (1u << 20)    /* bytes of grammar text */
#define JSCHEMA_MAX_WORK 200000u       /* schema nodes visited, merged or
                                          compared, all together */
#define JSCHEMA_MAX_REPEAT 2000u       /* a count: minLength, minItems and
                                          {m} above it are refused; maxLength,
                                          maxItems and {,n} above it are
                                          lowered to it (fewer texts, all
                                          still valid).  llama.cpp's (and
                                          grammar.h's) bound on {m,n} */

/* Converts SCHEMA (a JSON Schema document: an object or a boolean) into a
 * malloc'd, NUL-terminated GBNF grammar in *RET_GBNF whose root rule accepts
 * only JSON texts valid under SCHEMA.  FLAGS: JSCHEMA_*.  Returns 0;
 * -ENOTSUP with "KEYWORD at #/json/pointer: why" in ERR for a keyword the
 * grammar cannot enforce; -EINVAL with the same shape for a malformed schema
 * (a keyword of the wrong type, an unresolvable $ref, an invalid pattern) or
 * one that no value satisfies; -E2BIG when a JSCHEMA_MAX_* limit is hit;
 * -ENOMEM.  *RET_GBNF is untouched on failure.  Any thread, one at a time on
 * a given SCHEMA. */
int jschema_to_gbnf(struct json_object *schema, unsigned flags, char **ret_gbnf, char *err,
		    size_t errlen);

/* The grammar of response_format {"type": "json_object"}: any JSON object
 * (16-digit numbers, the same whitespace rule), as a malloc'd string in
 * *RET_GBNF.  Returns 0 or -ENOMEM (*RET_GBNF untouched).  Any thread. */
int jschema_any_json_gbnf(char **ret_gbnf);

#endif
