/* jschema_gbnf.c - converts a JSON Schema file to GBNF through
 * daemon/engine/jschema.c: the driver tests/jschema_check.py runs ours with.
 *
 *     tests/jschema_gbnf [--strict] [--format-assert] SCHEMA.json
 *     tests/jschema_gbnf --any
 *
 * Prints the grammar on stdout and exits 0, or prints the error and its code
 * ("ENOTSUP: uniqueItems at #/properties/tags: ...") on stderr and exits 1
 * (2: bad usage, an unreadable file or one that is not JSON).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "jschema.h"

static const char *code_name(int rc)
{
	switch (rc) {
	case -ENOTSUP: return "ENOTSUP";
	case -EINVAL: return "EINVAL";
	case -E2BIG: return "E2BIG";
	case -ENOMEM: return "ENOMEM";
	default: return "E?";
	}
}

int main(int argc, char **argv)
{
	unsigned flags = 0;
	const char *path = NULL;
	char err[512], *gbnf = NULL;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--strict") == 0) {
			flags |= JSCHEMA_STRICT;
		} else if (strcmp(argv[i], "--format-assert") == 0) {
			flags |= JSCHEMA_FORMAT_ASSERT;
		} else if (strcmp(argv[i], "--any") == 0) {
			if (jschema_any_json_gbnf(&gbnf) < 0)
				return 1;
			fputs(gbnf, stdout);
			free(gbnf);
			return 0;
		} else if (!path && argv[i][0] != '-') {
			path = argv[i];
		} else {
			path = NULL;
			break;
		}
	}
	if (!path) {
		fprintf(stderr, "usage: jschema_gbnf [--strict] [--format-assert] SCHEMA.json | --any\n");
		return 2;
	}
	/* the whole file, NUL-terminated: json-c's reader wants a terminator
	 * after a bare literal ("true") */
	FILE *f = fopen(path, "rb");
	char *text = NULL;
	size_t len = 0, cap = 0, k;
	while (f) {
		if (cap - len < 4096) {
			char *p = realloc(text, cap + 65536);
			if (!p)
				break;
			text = p;
			cap += 65536;
		}
		k = fread(text + len, 1, cap - len - 1, f);
		len += k;
		if (!k)
			break;
	}
	if (f)
		fclose(f);
	if (!text) {
		fprintf(stderr, "jschema_gbnf: cannot read %s\n", path);
		return 2;
	}
	text[len] = '\0';
	enum json_tokener_error jerr;
	struct json_object *schema = json_tokener_parse_verbose(text, &jerr);
	free(text);
	if (jerr != json_tokener_success) {
		fprintf(stderr, "jschema_gbnf: %s: not JSON: %s\n", path, json_tokener_error_desc(jerr));
		return 2;
	}
	rc = jschema_to_gbnf(schema, flags, &gbnf, err, sizeof err);
	json_object_put(schema);
	if (rc < 0) {
		fprintf(stderr, "%s: %s\n", code_name(rc), err);
		return 1;
	}
	fputs(gbnf, stdout);
	free(gbnf);
	return 0;
}
