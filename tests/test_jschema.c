/* test_jschema.c - pins the JSON Schema -> GBNF converter
 * (daemon/engine/jschema.c): the exact rules of small schemas (order of
 * properties, integer and number ranges, patterns over JSON text, $ref
 * cycles as rule references), the refusals that name the keyword and its
 * place, the limits a client's schema runs into, and outputs left alone on
 * failure.  tests/jschema_check.py checks whole realistic schemas end to end
 * (random texts of the grammar validated by Python's jsonschema).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include <json-c/json.h>

#include "jschema.h"
#include "testutil.h"

static char err[512];

/* Converts the schema in TEXT; the grammar in *OUT (freed by the caller),
 * the message in err. */
static int conv(const char *text, unsigned flags, char **out)
{
	struct json_object *s = json_tokener_parse(text);

	*out = NULL;
	if (!s && strcmp(text, "null") != 0) {
		fprintf(stderr, "test schema is not JSON: %s\n", text);
		return -9999;
	}
	int rc = jschema_to_gbnf(s, flags, out, err, sizeof err);
	json_object_put(s);
	return rc;
}

/* The body of rule NAME in GBNF, or NULL (a static buffer). */
static const char *rule(const char *gbnf, const char *name)
{
	static char buf[8192];
	size_t n = strlen(name);

	for (const char *p = gbnf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, name, n) == 0 && strncmp(p + n, " ::= ", 5) == 0) {
			const char *b = p + n + 5, *e = strchr(b, '\n');
			size_t len = e ? (size_t)(e - b) : strlen(b);
			if (len >= sizeof buf)
				len = sizeof buf - 1;
			memcpy(buf, b, len);
			buf[len] = '\0';
			return buf;
		}
	}
	return NULL;
}

/* The root rule's body for schema TEXT ("" when it fails, the message then
 * printed). */
static const char *root_of(const char *text, unsigned flags)
{
	static char buf[8192];
	char *g;

	buf[0] = '\0';
	if (conv(text, flags, &g) < 0) {
		fprintf(stderr, "%s: %s\n", text, err);
		return buf;
	}
	const char *r = rule(g, "root");
	snprintf(buf, sizeof buf, "%s", r ? r : "(no root)");
	free(g);
	return buf;
}

#define CHECK_ROOT(schema, flags, want) CHECK_STR_EQ(root_of(schema, flags), want)

static int starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static const char *SPACE = "| \" \" | \"\\n\" [ \\t]{0,20}";

static void test_primitives(void)
{
	CHECK_ROOT("{\"type\": \"string\"}", 0, "string");
	CHECK_ROOT("{\"type\": \"integer\"}", 0, "integer");
	CHECK_ROOT("{\"type\": \"number\"}", 0, "number");
	CHECK_ROOT("{\"type\": \"boolean\"}", 0, "boolean");
	CHECK_ROOT("{\"type\": \"null\"}", 0, "null");
	CHECK_ROOT("{}", 0, "value");
	CHECK_ROOT("true", 0, "value");
	CHECK_ROOT("{\"type\": \"object\"}", 0, "object");
	CHECK_ROOT("{\"type\": \"array\"}", 0, "array");
	/* type arrays: each type its branch, "number" covering "integer" */
	CHECK_ROOT("{\"type\": [\"string\", \"null\"], \"maxLength\": 2}", 0, "root-string | null");
	CHECK_ROOT("{\"type\": [\"integer\", \"number\", \"boolean\"]}", 0, "number | boolean");
	/* annotations and unknown keywords change nothing */
	CHECK_ROOT("{\"type\": \"string\", \"title\": \"T\", \"description\": \"d\", \"default\": \"x\","
		   " \"examples\": [\"y\"], \"x-vendor\": {\"not\": 1}, \"$comment\": \"c\"}",
		   0, "string");

	char *g;
	CHECK_INT_EQ(conv("{\"type\": \"string\"}", 0, &g), 0);
	CHECK_STR_EQ(g, "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
			"([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"
			"root ::= string\n"
			"string ::= \"\\\"\" char* \"\\\"\"\n");
	free(g);
}

/* Required properties first in the schema's order, then the optional ones
 * in theirs, each optional one able to be left out (llama.cpp's shape). */
static void test_object_order(void)
{
	char *g;

	CHECK_INT_EQ(conv("{\"type\": \"object\", \"properties\": {\"b\": {\"type\": \"integer\"},"
			  " \"a\": {\"type\": \"boolean\"}, \"c\": {\"type\": \"null\"}},"
			  " \"required\": [\"a\"], \"additionalProperties\": false}", 0, &g), 0);
	CHECK_STR_EQ(g, "a-kv ::= \"\\\"a\\\"\" space \":\" space boolean\n"
			"b-kv ::= \"\\\"b\\\"\" space \":\" space integer\n"
			"boolean ::= \"true\" | \"false\"\n"
			"c-kv ::= \"\\\"c\\\"\" space \":\" space null\n"
			"c-rest ::= ( space \",\" space c-kv )?\n"
			"integer ::= \"-\"? integral-part\n"
			"integral-part ::= [0] | [1-9] [0-9]{0,15}\n"
			"null ::= \"null\"\n"
			"root ::= \"{\" space a-kv ( space \",\" space ( b-kv c-rest | c-kv ) )? space \"}\"\n"
			"space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
	free(g);

	/* nothing required: the whole list optional, no dangling space */
	CHECK_ROOT("{\"properties\": {\"x\": {\"type\": \"null\"}}, \"additionalProperties\": false}", 0,
		   "\"{\" space ( x-kv space )? \"}\"");
	/* a required name without a schema of its own is an additional
	 * property: any value (strict or not), additionalProperties' schema,
	 * or none at all */
	CHECK_INT_EQ(conv("{\"required\": [\"k\"]}", JSCHEMA_STRICT, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "\"{\" space k-kv space \"}\"");
	CHECK_STR_EQ(rule(g, "k-kv"), "\"\\\"k\\\"\" space \":\" space value");
	free(g);
	CHECK_INT_EQ(conv("{\"required\": [\"k\"], \"additionalProperties\": {\"type\": \"null\"}}", 0, &g), 0);
	CHECK_STR_EQ(rule(g, "k-kv"), "\"\\\"k\\\"\" space \":\" space null");
	free(g);
	CHECK_INT_EQ(conv("{\"required\": [\"k\"], \"additionalProperties\": false}", 0, &g), -EINVAL);
	CHECK_STR_EQ(err, "required at #: names \"k\", which additionalProperties false forbids");
	/* a property whose schema is false is left out */
	CHECK_ROOT("{\"properties\": {\"x\": false, \"y\": {\"type\": \"null\"}},"
		   " \"additionalProperties\": false}", 0, "\"{\" space ( y-kv space )? \"}\"");
	/* names are JSON-escaped in the literal, sanitized in rule names;
	 * reserved names get a "-" */
	CHECK_INT_EQ(conv("{\"properties\": {\"a b\\\"\\u00e9\": {\"type\": \"null\"},"
			  " \"string\": {\"type\": \"string\", \"maxLength\": 1}},"
			  " \"required\": [\"a b\\\"\\u00e9\", \"string\"], \"additionalProperties\": false}",
			  0, &g), 0);
	CHECK_STR_EQ(rule(g, "a-b--kv"), "\"\\\"a b\\\\\\\"\\xE9\\\"\" space \":\" space null");
	CHECK_STR_EQ(rule(g, "string-"), "\"\\\"\" char? \"\\\"\"");
	CHECK_STR_EQ(rule(g, "string-kv"), "\"\\\"string\\\"\" space \":\" space string-");
	free(g);
	CHECK_INT_EQ(conv("{\"type\": \"object\"}", 0, &g), 0);
	CHECK_STR_EQ(rule(g, "space"), SPACE);
	free(g);
}

/* additionalProperties: JSON Schema's default (any other key), false, a
 * schema; JSCHEMA_STRICT makes false the default. */
static void test_additional(void)
{
	const char *s = "{\"type\": \"object\", \"properties\": {\"ab\": {\"type\": \"null\"},"
			" \"a\": {\"type\": \"null\"}}, \"required\": [\"a\"]}";
	char *g;

	CHECK_INT_EQ(conv(s, 0, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "\"{\" space a-kv ( space \",\" space ( ab-kv additional-rest | "
				      "additional-kv ( space \",\" space additional-kv )* ) )? space \"}\"");
	/* other keys: none of the declared names, no escapes */
	CHECK_STR_EQ(rule(g, "additional-k"),
		     "\"\\\"\" ([a] ([b] kchar+ | [^\"\\\\\\x7F\\x00-\\x1Fb] kchar*) | "
		     "[^\"\\\\\\x7F\\x00-\\x1Fa] kchar*)? \"\\\"\"");
	CHECK_STR_EQ(rule(g, "additional-kv"), "additional-k space \":\" space value");
	free(g);
	CHECK_ROOT(s, JSCHEMA_STRICT, "\"{\" space a-kv ( space \",\" space ( ab-kv ) )? space \"}\"");
	/* explicit true wins over strict */
	CHECK_INT_EQ(conv("{\"properties\": {\"a\": {\"type\": \"null\"}}, \"additionalProperties\": "
			  "{\"type\": \"integer\", \"minimum\": 0, \"maximum\": 9}}", JSCHEMA_STRICT, &g), 0);
	CHECK_STR_EQ(rule(g, "additional-kv"), "additional-k space \":\" space additional-value");
	CHECK_STR_EQ(rule(g, "additional-value"), "[0-9]");
	free(g);
	/* no properties: any key */
	CHECK_INT_EQ(conv("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"boolean\"}}", 0,
			  &g), 0);
	CHECK_STR_EQ(rule(g, "additional-kv"), "string space \":\" space boolean");
	free(g);
	/* maxProperties that the declared properties meet: no others */
	CHECK_ROOT("{\"properties\": {\"a\": {\"type\": \"null\"}}, \"maxProperties\": 1}", 0,
		   "\"{\" space ( a-kv space )? \"}\"");
	/* {"type": "object"} under strict: only {} */
	CHECK_ROOT("{\"type\": \"object\"}", JSCHEMA_STRICT, "\"{\" space \"}\"");
}

/* Integer bounds become digit ranges, as llama.cpp writes them. */
static void test_integer_ranges(void)
{
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150}", 0,
		   "[0-9] | ([1-9] [0-9]) | \"1\" ([0-4] [0-9] | [5] (\"0\"))");
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": -5, \"exclusiveMaximum\": 30}", 0,
		   "[0-9] | ([1-2] [0-9]) | \"-\" ([1-5])");
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 7}", 0,
		   "[7-9] | [1-9] [0-9]{1,15}");
	CHECK_ROOT("{\"type\": \"integer\", \"maximum\": -10}", 0,
		   "\"-\" (([1-9] [0-9]) | [1-9] [0-9]{2,15})");
	CHECK_ROOT("{\"type\": \"integer\", \"exclusiveMinimum\": 10, \"exclusiveMaximum\": 20}", 0,
		   "\"1\" [1-9]");
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 123, \"maximum\": 456}", 0,
		   "([1] (([2] ([3-9]) | [3-9] [0-9])) | [2-3] [0-9]{2} | [4] (([0-4] [0-9] | [5] ([0-6]))))");
	/* fractional bounds round inwards; Draft 4's boolean exclusiveMinimum */
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 0.5, \"maximum\": 3.5}", 0, "[1-3]");
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 2, \"exclusiveMinimum\": true, \"maximum\": 4}",
		   0, "[3-4]");
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 5}", 0, "\"5\"");
	CHECK_ROOT("{\"type\": \"integer\", \"multipleOf\": 1}", 0, "integer");
	/* beyond +-10^18 on the permissive side: clamped */
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 999999999999999999, "
		   "\"maximum\": 9223372036854775807}", 0, "\"999999999999999999\" | \"1000000000000000000\"");
	char *g;
	CHECK_INT_EQ(conv("{\"type\": \"integer\", \"minimum\": 3, \"maximum\": 2}", 0, &g), -EINVAL);
	CHECK(strstr(err, "minimum at #: no integer") != NULL);
	CHECK_INT_EQ(conv("{\"type\": \"integer\", \"minimum\": 1e30}", 0, &g), -ENOTSUP);
	CHECK(strstr(err, "minimum at #:") != NULL);
}

/* Numbers with whole-number bounds: decimals without exponent, of at most
 * 15 significant digits where they have a fraction (so that the double
 * Python's jsonschema compares is on the right side of the bound too). */
static void test_number_ranges(void)
{
	CHECK_ROOT("{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", 0,
		   "(\"0\") (\".\" [0-9]{1,14})? | \"1\" (\".\" [0]{1,16})?");
	CHECK_ROOT("{\"type\": \"number\", \"minimum\": -2, \"exclusiveMaximum\": 3}", 0,
		   "([0-2]) (\".\" [0-9]{1,14})? | \"-\" (([0-1]) (\".\" [0-9]{1,14})? | "
		   "\"2\" (\".\" [0]{1,16})?)");
	CHECK_ROOT("{\"type\": \"number\", \"exclusiveMinimum\": 12, \"maximum\": 99}", 0,
		   "(([1] ([3-9]) | [2-8] [0-9] | [9] ([0-8]))) (\".\" [0-9]{1,13})? | "
		   "\"12.\" [0-9]{0,12} [1-9] [0]{0,15} | \"99\" (\".\" [0]{1,16})?");
	const char *r = root_of("{\"type\": \"number\", \"exclusiveMinimum\": 0}", 0);
	CHECK(starts_with(r, "([1-9]) (\".\" [0-9]{1,14})? | ([1-9] [0-9]) (\".\" [0-9]{1,13})? | "));
	CHECK(strstr(r, " | [1-9] [0-9]{14} | [1-9] [0-9]{15} | \"0.\" [0-9]{0,14} [1-9] [0]{0,15}") != NULL);
	r = root_of("{\"type\": \"number\", \"exclusiveMaximum\": 0}", 0);
	CHECK(starts_with(r, "\"-\" (([1-9]) (\".\" [0-9]{1,14})? | "));
	char *g;
	CHECK_INT_EQ(conv("{\"properties\": {\"p\": {\"type\": \"number\", \"maximum\": 0.5}}}", 0, &g),
		     -ENOTSUP);
	CHECK_STR_EQ(err, "maximum at #/properties/p: a bound of a number must be a whole number here "
			  "(only integers get fractional bounds)");
	CHECK_INT_EQ(conv("{\"type\": \"number\", \"exclusiveMinimum\": 1, \"exclusiveMaximum\": 1}", 0,
			  &g), -EINVAL);
	CHECK_INT_EQ(conv("{\"type\": \"number\", \"multipleOf\": 0.5}", 0, &g), -ENOTSUP);
	CHECK(strstr(err, "multipleOf at #:") != NULL);
}

static void test_strings(void)
{
	CHECK_ROOT("{\"type\": \"string\", \"minLength\": 1, \"maxLength\": 100}", 0,
		   "\"\\\"\" char{1,100} \"\\\"\"");
	CHECK_ROOT("{\"type\": \"string\", \"minLength\": 3}", 0, "\"\\\"\" char{3,} \"\\\"\"");
	CHECK_ROOT("{\"type\": \"string\", \"maxLength\": 0}", 0, "\"\\\"\" \"\\\"\"");
	CHECK_ROOT("{\"type\": \"string\", \"format\": \"date\"}", 0, "date-string");
	CHECK_ROOT("{\"type\": \"string\", \"format\": \"date-time\"}", 0, "date-time-string");
	CHECK_ROOT("{\"type\": \"string\", \"format\": \"uuid\"}", 0, "uuid-string");
	/* lengths that the format implies are fine, others refused */
	CHECK_ROOT("{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 10}", 0, "date-string");
	char *g;
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 9}", 0, &g),
		     -ENOTSUP);
	CHECK(strstr(err, "maxLength at #: cannot be enforced beside format") != NULL);
	/* formats we cannot write: an annotation, or refused when asked */
	CHECK_ROOT("{\"type\": \"string\", \"format\": \"uri\"}", 0, "string");
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"format\": \"uri\"}", JSCHEMA_FORMAT_ASSERT, &g),
		     -ENOTSUP);
	CHECK(strstr(err, "format at #: \"uri\" cannot be enforced") != NULL);
	/* maxLength beyond the limit is lowered, minLength refused */
	CHECK_ROOT("{\"type\": \"string\", \"maxLength\": 1000000}", 0, "\"\\\"\" char{0,2000} \"\\\"\"");
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"minLength\": 2001}", 0, &g), -E2BIG);
	CHECK_STR_EQ(err, "minLength at #: 2001 is more than the 2000 this grammar allows");
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"minLength\": 3, \"maxLength\": 2}", 0, &g), -EINVAL);
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"minLength\": -1}", 0, &g), -EINVAL);
}

/* Patterns: the content of the JSON string, JSON-escaped; floating where
 * not anchored (re.search). */
static void test_patterns(void)
{
	static const struct {
		const char *pattern; /* as JSON text */
		const char *want;    /* the root rule */
	} cases[] = {
		{ "^abc$", "\"\\\"\" (\"abc\") \"\\\"\"" },
		{ "abc", "\"\\\"\" (char* \"abc\" char*) \"\\\"\"" },
		{ "^ab", "\"\\\"\" (\"ab\" char*) \"\\\"\"" },
		{ "^[a-z]+\\\\d?$", "\"\\\"\" ([a-z]+ [0-9]?) \"\\\"\"" },
		{ "^(cat|dog)s?$|^bird$", "\"\\\"\" (((\"cat\" | \"dog\") \"s\"? | \"bird\")) \"\\\"\"" },
		/* a quote and a backslash of the pattern are escaped in JSON */
		{ "^a\\\"\\\\\\\\b$", "\"\\\"\" (\"a\\\\\\\"\\\\\\\\b\") \"\\\"\"" },
		{ "^x{2,3}y{4}z{1,}$", "\"\\\"\" (\"x\"{2,3} \"y\"{4} \"z\"+) \"\\\"\"" },
		/* lazy quantifiers match the same strings */
		{ "^a+?$", "\"\\\"\" (\"a\"+) \"\\\"\"" },
		/* a '{' that does not start a count is itself */
		{ "^a{b$", "\"\\\"\" (\"a{b\") \"\\\"\"" },
		{ "^$", "\"\\\"\" \"\\\"\"" },
		{ "^\\\\u00e9\\\\t$", "\"\\\"\" (\"\\xE9\\\\t\") \"\\\"\"" },
		/* negated classes exclude the quote and backslash raw, write them
		 * escaped where the class has them */
		{ "^[^a]$", "\"\\\"\" (([ !#-\\x5B\\x5D-`b-\\U0010FFFF] | \"\\\\\\\"\" | \"\\\\\\\\\" | "
			    "\"\\\\u00\" [01] [0-9a-fA-F])) \"\\\"\"" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char schema[512];
		snprintf(schema, sizeof schema, "{\"type\": \"string\", \"pattern\": \"%s\"}",
			 cases[i].pattern);
		const char *got = root_of(schema, 0);
		if (strcmp(got, cases[i].want) != 0) {
			fprintf(stderr, "pattern %s: got %s, want %s\n", cases[i].pattern, got,
				cases[i].want);
			test_failures++;
		}
	}
	/* a counted group is a rule of its own */
	char *g;
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"pattern\": \"^(ab|c){2,5}$\"}", 0, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "\"\\\"\" (root-1{2,5}) \"\\\"\"");
	CHECK_STR_EQ(rule(g, "root-1"), "(\"ab\" | \"c\")");
	free(g);
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"pattern\": \"^.$\"}", 0, &g), 0);
	CHECK_STR_EQ(rule(g, "dot"), "[^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfrt]");
	free(g);

	/* what a grammar cannot do, refused naming it */
	static const struct {
		const char *pattern;
		int rc;
		const char *msg; /* in err */
	} bad[] = {
		{ "^(a)\\\\1$", -ENOTSUP, "backreferences" },
		{ "^(?=a)a$", -ENOTSUP, "lookaround" },
		{ "^(?<!a)b$", -ENOTSUP, "lookaround" },
		{ "^(?i)a$", -ENOTSUP, "flags" },
		{ "\\\\bword\\\\b", -ENOTSUP, "word boundary" },
		{ "^a++$", -ENOTSUP, "possessive" },
		{ "a^b", -ENOTSUP, "anchor ^" },
		{ "^(a$)", -ENOTSUP, "anchor $" },
		{ "^(ab", -EINVAL, "missing )" },
		{ "^ab)$", -EINVAL, "unbalanced" },
		{ "^*a$", -EINVAL, "nothing to repeat" },
		{ "^a**$", -EINVAL, "multiple repeat" },
		{ "^[ab", -EINVAL, "unterminated character class" },
		{ "^[z-a]$", -EINVAL, "bad character range" },
		{ "^a{5,2}$", -EINVAL, "bad repeat range" },
		{ "^a{2001}$", -E2BIG, "more than the 2000" },
		{ "^((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))$", -E2BIG,
		  "groups nested deeper than 32" },
		{ "^\\\\q$", -EINVAL, "escape \\q" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char schema[512];
		snprintf(schema, sizeof schema,
			 "{\"properties\": {\"p\": {\"type\": \"string\", \"pattern\": \"%s\"}}}",
			 bad[i].pattern);
		int rc = conv(schema, 0, &g);
		if (rc != bad[i].rc || strncmp(err, "pattern at #/properties/p/pattern: ", 35) != 0 ||
		    !strstr(err, bad[i].msg)) {
			fprintf(stderr, "pattern %s: rc %d, err \"%s\"; want rc %d with \"%s\"\n",
				bad[i].pattern, rc, err, bad[i].rc, bad[i].msg);
			test_failures++;
		}
		if (rc == 0)
			free(g);
	}
	/* lengths must follow from the pattern */
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"pattern\": \"^[a-z]{2,4}$\", \"minLength\": 2,"
			  " \"maxLength\": 4}", 0, &g), 0);
	free(g);
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"pattern\": \"^[a-z]+$\", \"maxLength\": 4}", 0, &g),
		     -ENOTSUP);
	CHECK(strstr(err, "maxLength at #: cannot be enforced beside pattern") != NULL);
}

static void test_arrays(void)
{
	CHECK_ROOT("{\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"minItems\": 1,"
		   " \"maxItems\": 3}", 0,
		   "\"[\" space string ( space \",\" space string ){0,2} space \"]\"");
	CHECK_ROOT("{\"type\": \"array\", \"items\": {\"type\": \"null\"}}", 0,
		   "\"[\" space ( null ( space \",\" space null )* space )? \"]\"");
	CHECK_ROOT("{\"type\": \"array\", \"maxItems\": 0}", 0, "\"[\" space \"]\"");
	CHECK_ROOT("{\"type\": \"array\", \"items\": false}", 0, "\"[\" space \"]\"");
	/* prefixItems: the elements past minItems optional, then items */
	CHECK_ROOT("{\"prefixItems\": [{\"type\": \"null\"}, {\"type\": \"boolean\"}],"
		   " \"items\": {\"type\": \"integer\"}, \"minItems\": 1}", 0,
		   "\"[\" space null ( space \",\" space boolean ( space \",\" space integer )* )? "
		   "space \"]\"");
	CHECK_ROOT("{\"prefixItems\": [{\"type\": \"null\"}], \"items\": false}", 0,
		   "\"[\" space ( null space )? \"]\"");
	/* strict: no items after the tuple unless "items" says so */
	CHECK_ROOT("{\"prefixItems\": [{\"type\": \"null\"}], \"minItems\": 1}", JSCHEMA_STRICT,
		   "\"[\" space null space \"]\"");
	/* Draft 7's tuple form */
	CHECK_ROOT("{\"items\": [{\"type\": \"null\"}, {\"type\": \"null\"}], \"additionalItems\": false,"
		   " \"minItems\": 2}", 0, "\"[\" space null space \",\" space null space \"]\"");
	char *g;
	CHECK_INT_EQ(conv("{\"properties\": {\"tags\": {\"type\": \"array\", \"uniqueItems\": true}}}", 0,
			  &g), -ENOTSUP);
	CHECK_STR_EQ(err, "uniqueItems at #/properties/tags: cannot be enforced by a grammar over more "
			  "than one item");
	CHECK_ROOT("{\"type\": \"array\", \"uniqueItems\": true, \"maxItems\": 1}", 0,
		   "\"[\" space ( value space )? \"]\"");
	CHECK_INT_EQ(conv("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", 0, &g), -EINVAL);
	CHECK_INT_EQ(conv("{\"type\": \"array\", \"minItems\": 20000}", 0, &g), -E2BIG);
	CHECK_ROOT("{\"type\": \"array\", \"maxItems\": 123456}", 0,
		   "\"[\" space ( value ( space \",\" space value ){0,1999} space )? \"]\"");
}

static void test_enum_const(void)
{
	/* arrays and objects with the same whitespace as elsewhere */
	CHECK_ROOT("{\"enum\": [\"x\", 1, null, {\"a\": [true, 2.5]}, \"x\", [], {}]}", 0,
		   "\"\\\"x\\\"\" | \"1\" | \"null\" | \"{\" space \"\\\"a\\\"\" space \":\" space \"[\" space "
		   "\"true\" space \",\" space \"2.5\" space \"]\" space \"}\" | \"[\" space \"]\" | \"{\" space \"}\"");
	CHECK_ROOT("{\"const\": \"q\\\"\\n\"}", 0, "\"\\\"q\\\\\\\"\\\\n\\\"\"");
	/* values filtered by type and the bounds beside them */
	CHECK_ROOT("{\"type\": \"string\", \"enum\": [\"a\", \"bb\", 3], \"minLength\": 2}", 0,
		   "\"\\\"bb\\\"\"");
	CHECK_ROOT("{\"type\": \"integer\", \"enum\": [1, 2.0, 2.5, 7], \"maximum\": 5}", 0,
		   "\"1\" | \"2\"");
	char *g;
	CHECK_INT_EQ(conv("{\"type\": \"string\", \"enum\": [1]}", 0, &g), -EINVAL);
	CHECK(strstr(err, "enum at #: no value satisfies") != NULL);
	CHECK_INT_EQ(conv("{\"enum\": []}", 0, &g), -EINVAL);
	CHECK_INT_EQ(conv("{\"enum\": [\"a\"], \"pattern\": \"^a$\"}", 0, &g), -ENOTSUP);
	CHECK(strstr(err, "pattern at #: cannot be enforced beside enum") != NULL);
}

static void test_refs(void)
{
	char *g;

	/* a recursive $ref is a rule that names itself */
	CHECK_INT_EQ(conv("{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"next\":"
			  " {\"$ref\": \"#/$defs/n\"}}, \"additionalProperties\": false}},"
			  " \"$ref\": \"#/$defs/n\"}", 0, &g), 0);
	CHECK_STR_EQ(g, "ref-defs-n ::= \"{\" space ( ref-defs-n-next-kv space )? \"}\"\n"
			"ref-defs-n-next-kv ::= \"\\\"next\\\"\" space \":\" space ref-defs-n\n"
			"root ::= ref-defs-n\n"
			"space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n");
	free(g);
	/* to the root, and Draft 7's definitions */
	CHECK_INT_EQ(conv("{\"type\": \"array\", \"items\": {\"$ref\": \"#\"}, \"maxItems\": 2}", 0, &g),
		     0);
	CHECK_STR_EQ(rule(g, "ref"), "\"[\" space ( ref ( space \",\" space ref )? space )? \"]\"");
	CHECK_STR_EQ(rule(g, "root"), rule(g, "ref"));
	free(g);
	CHECK_INT_EQ(conv("{\"definitions\": {\"a~b/c\": {\"type\": \"null\"}},"
			  " \"$ref\": \"#/definitions/a~0b~1c\"}", 0, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "ref-definitions-a-0b-1c");
	CHECK_STR_EQ(rule(g, "ref-definitions-a-0b-1c"), "null");
	free(g);
	/* a cycle that consumes nothing would be a left-recursive grammar */
	CHECK_INT_EQ(conv("{\"$defs\": {\"a\": {\"anyOf\": [{\"$ref\": \"#/$defs/a\"}, {\"type\": \"null\"}]}},"
			  " \"$ref\": \"#/$defs/a\"}", 0, &g), -EINVAL);
	CHECK(strstr(err, "$ref at #/$defs/a/anyOf/0: #/$defs/a refers back to itself") != NULL);
	CHECK_INT_EQ(conv("{\"$ref\": \"#/$defs/missing\"}", 0, &g), -EINVAL);
	CHECK_STR_EQ(err, "$ref at #: cannot resolve #/$defs/missing");
	CHECK_INT_EQ(conv("{\"$ref\": \"https://example.com/s.json\"}", 0, &g), -ENOTSUP);
	CHECK_INT_EQ(conv("{\"$ref\": \"#anchor\"}", 0, &g), -ENOTSUP);
	/* $ref with assertions beside it: both hold (merged) */
	CHECK_ROOT("{\"$defs\": {\"i\": {\"type\": \"integer\", \"minimum\": 0}},"
		   " \"$ref\": \"#/$defs/i\", \"maximum\": 3, \"description\": \"d\"}", 0, "[0-3]");
}

static void test_combinators(void)
{
	char *g;

	CHECK_INT_EQ(conv("{\"anyOf\": [{\"type\": \"string\", \"maxLength\": 1}, {\"type\": \"null\"}]}",
			  0, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "alternative-0 | null");
	CHECK_STR_EQ(rule(g, "alternative-0"), "\"\\\"\" char? \"\\\"\"");
	free(g);
	/* keywords beside anyOf hold for every alternative */
	CHECK_ROOT("{\"type\": \"integer\", \"minimum\": 0, \"anyOf\": [{\"maximum\": 3},"
		   " {\"minimum\": 10, \"maximum\": 11}]}", 0, "alternative-0 | alternative-1");
	/* allOf: merged */
	CHECK_ROOT("{\"allOf\": [{\"type\": \"integer\", \"minimum\": 2}, {\"maximum\": 4},"
		   " {\"type\": [\"integer\", \"string\"]}]}", 0, "[2-4]");
	CHECK_ROOT("{\"allOf\": [{\"enum\": [1, 2, 3]}, {\"enum\": [3, 2, 9]}]}", 0, "\"2\" | \"3\"");
	CHECK_INT_EQ(conv("{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"null\"}}, \"required\": [\"a\"]},"
			  " {\"properties\": {\"b\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}]}",
			  JSCHEMA_STRICT, &g), 0);
	CHECK_STR_EQ(rule(g, "root"), "\"{\" space a-kv space \",\" space b-kv space \"}\"");
	free(g);
	/* a part's additionalProperties: false forbids what the others add */
	CHECK_INT_EQ(conv("{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"null\"}},"
			  " \"additionalProperties\": false}, {\"properties\": {\"b\": {\"type\": \"null\"}},"
			  " \"required\": [\"b\"]}]}", 0, &g), -EINVAL);
	CHECK_STR_EQ(err, "required at #/properties/b: names a property whose schema is false");
	CHECK_INT_EQ(conv("{\"allOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}", 0, &g),
		     -EINVAL);
	CHECK_INT_EQ(conv("{\"allOf\": [{\"pattern\": \"^a\"}, {\"pattern\": \"b$\"}]}", 0, &g), -ENOTSUP);
	CHECK(strstr(err, "allOf at #/allOf/1: pattern differs") != NULL);

	/* oneOf: only where no value can match two alternatives */
	CHECK_ROOT("{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}, {\"type\": \"null\"}]}", 0,
		   "string | integer | null");
	CHECK_ROOT("{\"oneOf\": [{\"const\": 1}, {\"enum\": [2, \"x\"]}, {\"type\": \"boolean\"}]}", 0,
		   "alternative-0 | alternative-1 | boolean");
	CHECK_INT_EQ(conv("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"const\": \"a\"}},"
			  " \"required\": [\"k\"]}, {\"type\": \"object\", \"properties\": {\"k\":"
			  " {\"enum\": [\"b\", \"c\"]}}, \"required\": [\"k\"]}]}", 0, &g), 0);
	free(g);
	CHECK_INT_EQ(conv("{\"properties\": {\"v\": {\"oneOf\": [{\"type\": \"number\"},"
			  " {\"type\": \"integer\"}]}}}", 0, &g), -ENOTSUP);
	CHECK(strstr(err, "oneOf at #/properties/v/oneOf: alternatives 0 and 1 may both match") != NULL);
	CHECK_INT_EQ(conv("{\"oneOf\": [{\"type\": \"object\"}, {\"required\": [\"a\"]}]}", 0, &g),
		     -ENOTSUP);
	CHECK_INT_EQ(conv("{\"anyOf\": []}", 0, &g), -EINVAL);
	CHECK_INT_EQ(conv("{\"anyOf\": [false]}", 0, &g), -EINVAL);
}

/* Keywords no grammar enforces: refused, named with their place. */
static void test_refused(void)
{
	static const struct {
		const char *schema;
		const char *msg; /* err starts so */
	} cases[] = {
		{ "{\"not\": {\"type\": \"null\"}}", "not at #: " },
		{ "{\"properties\": {\"a\": {\"if\": {}, \"then\": {}}}}", "if at #/properties/a: " },
		{ "{\"dependentSchemas\": {\"a\": {}}}", "dependentSchemas at #: " },
		{ "{\"dependentRequired\": {\"a\": [\"b\"]}}", "dependentRequired at #: " },
		{ "{\"dependencies\": {\"a\": [\"b\"]}}", "dependencies at #: " },
		{ "{\"patternProperties\": {\"^x\": {}}}", "patternProperties at #: " },
		{ "{\"propertyNames\": {\"maxLength\": 3}}", "propertyNames at #: " },
		{ "{\"type\": \"array\", \"contains\": {\"type\": \"null\"}}", "contains at #: " },
		{ "{\"unevaluatedProperties\": false}", "unevaluatedProperties at #: " },
		{ "{\"items\": {\"unevaluatedItems\": false}}", "unevaluatedItems at #/items: " },
		{ "{\"$dynamicRef\": \"#meta\"}", "$dynamicRef at #: " },
		{ "{\"minProperties\": 1}", "minProperties at #: " },
		{ "{\"properties\": {\"a\": {}, \"b\": {}}, \"maxProperties\": 1}", "maxProperties at #: " },
		{ "{\"$defs\": {\"x\": {\"not\": {}}}, \"properties\": {\"p\": {\"$ref\": \"#/$defs/x\"}}}",
		  "not at #/$defs/x: " },
		{ "{\"anyOf\": [{\"type\": \"null\"}], \"oneOf\": [{\"type\": \"null\"}]}", "oneOf at #: " },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *g = (char *)"untouched";
		int rc = conv(cases[i].schema, 0, &g);
		if (rc != -ENOTSUP || strncmp(err, cases[i].msg, strlen(cases[i].msg)) != 0) {
			fprintf(stderr, "%s: rc %d, err \"%s\"; want -ENOTSUP, \"%s...\"\n",
				cases[i].schema, rc, err, cases[i].msg);
			test_failures++;
		}
	}
	/* the same keywords in their no-op forms are fine */
	CHECK_ROOT("{\"type\": \"null\", \"patternProperties\": {}, \"propertyNames\": true,"
		   " \"unevaluatedItems\": true, \"uniqueItems\": false, \"then\": {}}", 0,
		   "null");
	/* malformed keywords */
	static const char *const malformed[] = {
		"{\"type\": \"float\"}", "{\"type\": []}", "{\"type\": 3}", "{\"properties\": []}",
		"{\"required\": \"a\"}", "{\"required\": [1]}", "{\"additionalProperties\": 1}",
		"{\"maxLength\": \"3\"}", "{\"minItems\": 1.5}", "{\"minimum\": \"0\"}",
		"{\"pattern\": 1}", "{\"format\": 1}", "{\"$ref\": 1}", "{\"allOf\": {}}", "3", "null",
		"\"s\"", "false", "{\"prefixItems\": {}}", "{\"items\": 1}",
	};
	for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
		char *g;
		int rc = conv(malformed[i], 0, &g);
		if (rc != -EINVAL) {
			fprintf(stderr, "%s: rc %d (%s), want -EINVAL\n", malformed[i], rc, err);
			test_failures++;
			if (rc == 0)
				free(g);
		}
	}
}

/* A client's schema cannot make the conversion run away. */
static void test_limits(void)
{
	char *g = (char *)"untouched", *big;
	size_t cap = 4 << 20, n = 0;

	/* nesting deeper than JSCHEMA_MAX_DEPTH (json-c's parser would stop
	 * at 32: built by hand) */
	struct json_object *s = json_object_new_object(), *inner = s;
	for (int i = 0; i < 100; i++) {
		struct json_object *o = json_object_new_object();
		json_object_object_add(inner, "items", o);
		inner = o;
	}
	CHECK_INT_EQ(jschema_to_gbnf(s, 0, &g, err, sizeof err), -E2BIG);
	CHECK(strstr(err, "nested deeper than 64") != NULL);
	CHECK_STR_EQ(g, "untouched");
	json_object_put(s);

	/* output: 3000 properties with 300-byte names */
	big = malloc(cap);
	n += (size_t)snprintf(big + n, cap - n, "{\"properties\": {");
	for (int i = 0; i < 3000; i++)
		n += (size_t)snprintf(big + n, cap - n, "%s\"p%d_%0290d\": {\"type\": \"null\"}",
				      i ? ", " : "", i, 0);
	snprintf(big + n, cap - n, "}}");
	CHECK_INT_EQ(conv(big, 0, &g), -E2BIG);
	CHECK(strstr(err, "would exceed 1048576 bytes") != NULL);
	free(big);

	/* work: allOf that doubles at each level */
	big = malloc(cap);
	n = (size_t)snprintf(big, cap, "{\"$defs\": {");
	for (int i = 0; i < 25; i++)
		n += (size_t)snprintf(big + n, cap - n,
				      "%s\"d%d\": {\"allOf\": [{\"$ref\": \"#/$defs/d%d\"}, {\"$ref\": "
				      "\"#/$defs/d%d\"}]}",
				      i ? ", " : "", i, i + 1, i + 1);
	snprintf(big + n, cap - n, ", \"d25\": {\"type\": \"null\"}}, \"$ref\": \"#/$defs/d0\"}");
	CHECK_INT_EQ(conv(big, 0, &g), -E2BIG);
	CHECK(strstr(err, "more than 200000 schema nodes") != NULL);
	free(big);

	/* shared $refs do not multiply: 25 levels of two uses each */
	big = malloc(cap);
	n = (size_t)snprintf(big, cap, "{\"$defs\": {");
	for (int i = 0; i < 25; i++)
		n += (size_t)snprintf(big + n, cap - n,
				      "%s\"d%d\": {\"type\": \"array\", \"prefixItems\": [{\"$ref\": "
				      "\"#/$defs/d%d\"}, {\"$ref\": \"#/$defs/d%d\"}], \"items\": false}",
				      i ? ", " : "", i, i + 1, i + 1);
	snprintf(big + n, cap - n, ", \"d25\": {\"type\": \"null\"}}, \"$ref\": \"#/$defs/d0\"}");
	CHECK_INT_EQ(conv(big, 0, &g), 0);
	CHECK(g && strlen(g) < 20000);
	free(g);
	free(big);

	/* a long name beside additional properties: the key rule's nesting
	 * is cut into rules */
	CHECK_INT_EQ(conv("{\"properties\": {\"abcdefghijklmnopqrstuvwxyzabcdefghijklmn\": {}}}", 0, &g), 0);
	CHECK(rule(g, "additional-k-1") != NULL && rule(g, "additional-k-2") != NULL);
	CHECK(starts_with(rule(g, "additional-k-1"), "[p] ([q] ("));
	free(g);
	/* a name too long for that */
	big = malloc(cap);
	snprintf(big, cap, "{\"properties\": {\"%0200d\": {}}}", 0);
	CHECK_INT_EQ(conv(big, 0, &g), -E2BIG);
	CHECK(strstr(err, "properties at #: a name longer than 128") != NULL);
	CHECK_INT_EQ(conv(big, JSCHEMA_STRICT, &g), 0);
	free(g);
	free(big);

	/* a NULL error buffer is fine */
	struct json_object *bad = json_tokener_parse("{\"not\": {}}");
	g = (char *)"untouched";
	CHECK_INT_EQ(jschema_to_gbnf(bad, 0, &g, NULL, 0), -ENOTSUP);
	CHECK_STR_EQ(g, "untouched");
	json_object_put(bad);
}

static void test_any_json(void)
{
	char *g = NULL;

	CHECK_INT_EQ(jschema_any_json_gbnf(&g), 0);
	CHECK_STR_EQ(rule(g, "root"), "object");
	CHECK_STR_EQ(rule(g, "object"), "\"{\" space ( string space \":\" space value ( space \",\" space "
					"string space \":\" space value )* space )? \"}\"");
	CHECK(rule(g, "value") && rule(g, "array") && rule(g, "number") && rule(g, "char"));
	free(g);
}

/* Several threads converting at once (each its own copy of a schema: no
 * state is shared): the same text. */
struct thread_arg {
	struct json_object *schema; /* this thread's copy */
	char *out;                  /* this thread's grammar */
	int rc;                     /* its result */
};

static void *convert_thread(void *p)
{
	struct thread_arg *a = p;
	char e[256];

	for (int i = 0; i < 20; i++) {
		free(a->out);
		a->out = NULL;
		a->rc = jschema_to_gbnf(a->schema, 0, &a->out, e, sizeof e);
		if (a->rc < 0)
			break;
	}
	return NULL;
}

static void test_threads(void)
{
	static const char text[] =
		"{\"$defs\": {\"n\": {\"properties\": {\"c\": {\"type\": \"array\", \"items\": "
		"{\"$ref\": \"#/$defs/n\"}}}}}, \"allOf\": [{\"$ref\": \"#/$defs/n\"}, {\"required\": "
		"[\"c\"]}], \"anyOf\": [{\"properties\": {\"x\": {\"const\": 1}}}, {\"maxProperties\": 1}]}";
	struct thread_arg a[4] = { { 0 } };
	pthread_t t[4];

	for (int i = 0; i < 4; i++) {
		a[i].schema = json_tokener_parse(text);
		pthread_create(&t[i], NULL, convert_thread, &a[i]);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++) {
		CHECK_INT_EQ(a[i].rc, 0);
		CHECK_STR_EQ(a[i].out, a[0].out);
	}
	for (int i = 0; i < 4; i++) {
		free(a[i].out);
		json_object_put(a[i].schema);
	}
}

int main(void)
{
	test_primitives();
	test_object_order();
	test_additional();
	test_integer_ranges();
	test_number_ranges();
	test_strings();
	test_patterns();
	test_arrays();
	test_enum_const();
	test_refs();
	test_combinators();
	test_refused();
	test_limits();
	test_any_json();
	test_threads();
	return test_result();
}
