/* testutil.h - the few helpers every test program shares.
 *
 * Tests are plain programs run by automake's harness: exit 0 = pass,
 * 77 = skip (a model file or a CPU feature is missing), anything else = fail.
 */
#ifndef LLMD_TESTUTIL_H
#define LLMD_TESTUTIL_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int test_failures;

#define CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		test_failures++; \
	} \
} while (0)

#define CHECK_INT_EQ(a, b) do { \
	long long _a = (long long)(a), _b = (long long)(b); \
	if (_a != _b) { \
		fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", \
			__FILE__, __LINE__, #a, _a, #b, _b); \
		test_failures++; \
	} \
} while (0)

#define CHECK_STR_EQ(a, b) do { \
	const char *_a = (a), *_b = (b); \
	if (!_a || !_b || strcmp(_a, _b) != 0) { \
		fprintf(stderr, "%s:%d: %s == \"%s\", expected \"%s\"\n", \
			__FILE__, __LINE__, #a, _a ? _a : "(null)", _b ? _b : "(null)"); \
		test_failures++; \
	} \
} while (0)

/* Ends main(): 0 when every CHECK held. */
static inline int test_result(void)
{
	if (test_failures)
		fprintf(stderr, "%d check(s) failed\n", test_failures);
	return test_failures ? 1 : 0;
}

/* Path of a file under ../shared/models (LLMD_MODELS_DIR), or NULL when it is
 * absent; the caller then skips.  Returns a static buffer. */
static inline const char *test_model_path(const char *rel)
{
	static char buf[4096];
	const char *dir = getenv("LLMD_MODELS_DIR");
	if (!dir)
		dir = "../shared/models";
	snprintf(buf, sizeof buf, "%s/%s", dir, rel);
	return access(buf, R_OK) == 0 ? buf : NULL;
}

/* The default SmolLM2 model fetched by `make fetch-model`, or NULL. */
static inline const char *test_smollm2_path(void)
{
	const char *p = getenv("LLMD_SMOLLM2");
	if (!p)
		p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	return access(p, R_OK) == 0 ? p : NULL;
}

/* PATH's size in bytes, or -1. */
static inline long long test_file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* Copies SRC to a new file /tmp/llmd-test.XXXXXX, whose path goes to DST
 * (CAP bytes, at least 32): for tests that change a model file under its
 * reader.  0 or -1; the caller unlinks DST. */
static inline int test_copy_to_tmp(const char *src, char *dst, size_t cap)
{
	char buf[65536];
	FILE *in = fopen(src, "rb");
	int fd, ok = in != NULL;
	size_t n;

	snprintf(dst, cap, "/tmp/llmd-test.XXXXXX");
	fd = mkostemp(dst, O_CLOEXEC);
	if (fd < 0) {
		if (in)
			fclose(in);
		return -1;
	}
	while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
		ok = write(fd, buf, n) == (ssize_t)n;
	if (in)
		fclose(in);
	return close(fd) == 0 && ok ? 0 : -1;
}

#define TEST_SKIP 77

#endif
