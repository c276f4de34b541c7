/* fuzz_replay_main.c - runs a libFuzzer target (LLVMFuzzerTestOneInput) over
 * files without libFuzzer: the seed corpus in `make check`, or crash inputs
 * when debugging.  Arguments are files or directories (not recursed); with
 * none it reads $LLMD_SRCDIR/tests/corpus/FUZZ_CORPUS (LLMD_SRCDIR defaults
 * to ".", FUZZ_CORPUS to gguf; a target's build sets it, e.g. -DFUZZ_CORPUS='"frame"').
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FUZZ_CORPUS
#define FUZZ_CORPUS "gguf"     /* the seed directory under tests/corpus */
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the target on one file; -1 when it cannot be read. */
static int run_file(const char *path)
{
	struct stat st;
	uint8_t *buf = NULL;
	size_t got = 0;
	ssize_t n;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0)
		goto fail;
	/* An exact-size copy, so that ASan catches reads past the end. */
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf)
		goto fail;
	while (got < (size_t)st.st_size) {
		n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			errno = n ? errno : EIO; /* shrank while we read */
			goto fail;
		}
		got += (size_t)n;
	}
	close(fd);
	LLVMFuzzerTestOneInput(buf, got);
	free(buf);
	return 0;
fail:
	fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno ? errno : EIO));
	if (fd >= 0)
		close(fd);
	free(buf);
	return -1;
}

/* Runs every regular file in PATH (or PATH itself); returns the count run or -1. */
static int run_path(const char *path)
{
	struct dirent *de;
	struct stat st;
	char sub[4096];
	int count = 0;
	DIR *d;

	if (stat(path, &st) != 0) {
		fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path) < 0 ? -1 : 1;
	d = opendir(path);
	if (!d) {
		fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
		if (stat(sub, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		if (run_file(sub) < 0) {
			closedir(d);
			return -1;
		}
		count++;
	}
	closedir(d);
	return count;
}

int main(int argc, char **argv)
{
	char def[4096];
	int i, n, total = 0;

	if (argc < 2) {
		const char *src = getenv("LLMD_SRCDIR");
		snprintf(def, sizeof def, "%s/tests/corpus/" FUZZ_CORPUS, src ? src : ".");
		n = run_path(def);
		if (n <= 0) {
			fprintf(stderr, "fuzz_replay: no inputs in %s\n", def);
			return 1;
		}
		total = n;
	}
	for (i = 1; i < argc; i++) {
		n = run_path(argv[i]);
		if (n < 0)
			return 1;
		total += n;
	}
	printf("fuzz_replay: ran %d input(s)\n", total);
	return 0;
}
