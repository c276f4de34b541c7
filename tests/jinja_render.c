/* jinja_render.c - renders a Jinja template with a JSON context through
 * daemon/engine/jinja.c: the driver tests/jinja_compare.py runs ours with.
 *
 *     tests/jinja_render [--now EPOCH] TEMPLATE.jinja CONTEXT.json
 *
 * Prints the rendered text on stdout and exits 0, or prints the error
 * ("line N: ...") on stderr and exits 1 (2: bad usage or unreadable files).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "jinja.h"

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0;
	if (!f)
		return NULL;
	for (;;) {
		if (cap - n < 4096) {
			char *p = realloc(buf, cap ? cap * 2 : 65536);
			if (!p)
				break;
			buf = p;
			cap = cap ? cap * 2 : 65536;
		}
		size_t k = fread(buf + n, 1, cap - n - 1, f);
		n += k;
		if (k == 0)
			break;
	}
	fclose(f);
	if (buf)
		buf[n] = '\0';
	*len = n;
	return buf;
}

int main(int argc, char **argv)
{
	struct jinja_limits lim;
	struct jinja_template *t = NULL;
	char err[512];
	int i = 1;

	jinja_limits_default(&lim);
	if (argc > 2 && strcmp(argv[1], "--now") == 0) {
		lim.now = strtoll(argv[2], NULL, 10);
		i = 3;
	}
	if (argc - i != 2) {
		fprintf(stderr, "usage: jinja_render [--now EPOCH] TEMPLATE CONTEXT.json\n");
		return 2;
	}
	size_t len, clen;
	char *src = slurp(argv[i], &len), *ctx_src = slurp(argv[i + 1], &clen);
	if (!src || !ctx_src) {
		fprintf(stderr, "jinja_render: cannot read %s\n", !src ? argv[i] : argv[i + 1]);
		return 2;
	}
	json_object *ctx = json_tokener_parse(ctx_src);
	if (!ctx) {
		fprintf(stderr, "jinja_render: %s: not JSON\n", argv[i + 1]);
		return 2;
	}
	int rc = jinja_compile(src, len, &t, err, sizeof err);
	if (rc == 0) {
		char *out;
		size_t out_len;
		rc = jinja_render(t, ctx, &lim, &out, &out_len, err, sizeof err);
		if (rc == 0) {
			fwrite(out, 1, out_len, stdout);
			free(out);
		}
	}
	if (rc < 0)
		fprintf(stderr, "%s\n", err);
	jinja_free(t);
	json_object_put(ctx);
	free(src);
	free(ctx_src);
	return rc < 0 ? 1 : 0;
}
