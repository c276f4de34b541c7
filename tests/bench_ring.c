/* bench_ring.c - the ring's throughput with a null generator: one thread
 * pushes token-sized records (a PROTO_REC_TOKEN payload: 24 fixed bytes and
 * 4 bytes of text), another peeks, reads and consumes them.  Both sides
 * busy-wait (sched_yield) on a full or empty ring.  A benchmark, not a test:
 * it fails only when a record comes out wrong.
 *
 *   bench_ring [--records N] [--capacity BYTES] [--repeat R] [--json]
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "ring.h"

#define TOKEN_FIXED 24      /* PROTO_TOKEN_FIXED */
#define TOKEN_TEXT 4        /* bytes of text in a typical token */
#define REC_TOKEN 1         /* PROTO_REC_TOKEN */

struct run {
	struct ring *p, *c;
	uint64_t records;       /* to move */
	uint64_t full_waits;    /* producer's -EAGAIN count */
	int failed;             /* a push failed otherwise */
};

/* The TOKEN payload by hand, little-endian: u64 id, i32 token, f32
 * logprob, u32 text_len, u32 reserved, then the text. */
static void token_payload(uint8_t *b, uint64_t id, int32_t token)
{
	uint32_t text_len = TOKEN_TEXT, zero = 0;
	float logprob = 0;

	memcpy(b, &id, 8);
	memcpy(b + 8, &token, 4);
	memcpy(b + 12, &logprob, 4);
	memcpy(b + 16, &text_len, 4);
	memcpy(b + 20, &zero, 4);
	memcpy(b + 24, " the", TOKEN_TEXT);
}

static void *producer(void *arg)
{
	struct run *r = arg;
	uint8_t b[TOKEN_FIXED + TOKEN_TEXT];

	for (uint64_t i = 0; i < r->records;) {
		int rc;

		token_payload(b, 42, (int32_t)i);
		rc = ring_push(r->p, REC_TOKEN, b, sizeof b, NULL, 0);
		if (rc == 0) {
			i++;
		} else if (rc == -EAGAIN) {
			r->full_waits++;
			sched_yield();
		} else {
			fprintf(stderr, "bench_ring: push: %s\n", strerror(-rc));
			__atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
			break;
		}
	}
	return NULL;
}

/* Runs once: seconds taken, or a negative number on failure. */
static double run_once(uint32_t capacity, uint64_t records, uint64_t *ret_full_waits)
{
	struct run r = { .records = records };
	char err[256];
	pthread_t t;
	double t0, t1;
	uint64_t got = 0;
	int bad = 0;

	if (ring_create(capacity, &r.p, err, sizeof err) < 0 ||
	    ring_attach(ring_fd(r.p), &r.c, err, sizeof err) < 0) {
		fprintf(stderr, "bench_ring: %s\n", err);
		ring_free(r.p);
		return -1;
	}
	t0 = clock_s();
	if (pthread_create(&t, NULL, producer, &r) != 0) {
		fprintf(stderr, "bench_ring: pthread_create failed\n");
		ring_free(r.c);
		ring_free(r.p);
		return -1;
	}
	while (got < records && !bad) {
		struct ring_rec rec;
		int32_t token;
		int rc = ring_peek(r.c, &rec);

		if (rc == 0) {
			if (__atomic_load_n(&r.failed, __ATOMIC_RELAXED))
				break;
			sched_yield();
			continue;
		}
		if (rc < 0 || rec.type != REC_TOKEN || rec.len != TOKEN_FIXED + TOKEN_TEXT) {
			bad = 1;
			break;
		}
		memcpy(&token, rec.payload + 8, 4);
		if ((uint32_t)token != (uint32_t)got || memcmp(rec.payload + 24, " the", 4) != 0)
			bad = 1;
		ring_consume(r.c);
		got++;
	}
	t1 = clock_s();
	pthread_join(t, NULL);
	*ret_full_waits = r.full_waits;
	ring_free(r.c);
	ring_free(r.p);
	if (bad || r.failed || got != records) {
		fprintf(stderr, "bench_ring: record %llu came out wrong\n", (unsigned long long)got);
		return -1;
	}
	return t1 - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: bench_ring [--records N] [--capacity BYTES] [--repeat R] [--json]\n"
		   "  --records N       records per run (default 20000000)\n"
		   "  --capacity BYTES  ring data bytes, a power of two (default 65536)\n"
		   "  --repeat R        runs; each is reported, then the median (default 1)\n"
		   "  --json            one JSON object on stdout\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "records", required_argument, NULL, 'n' },
		{ "capacity", required_argument, NULL, 'c' },
		{ "repeat", required_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	/* Bytes each record takes in the ring: header, payload, alignment. */
	const double rec_bytes = (RING_REC_HDR + TOKEN_FIXED + TOKEN_TEXT + 7) & ~7;
	uint64_t records = 20000000, waits;
	unsigned long capacity = 65536, repeat = 1;
	double *rates, median;
	int json = 0, o;
	char *end;

	while ((o = getopt_long(argc, argv, "n:c:r:jh", opts, NULL)) != -1) {
		switch (o) {
		case 'n':
			records = strtoull(optarg, &end, 10);
			if (*end || !records) {
				fprintf(stderr, "bench_ring: --records: not a positive count: %s\n", optarg);
				return 2;
			}
			break;
		case 'c':
			capacity = strtoul(optarg, &end, 0);
			if (*end || capacity < RING_MIN_CAPACITY || capacity > RING_MAX_CAPACITY ||
			    (capacity & (capacity - 1))) {
				fprintf(stderr, "bench_ring: --capacity: not a power of two in %u..%u: %s\n",
					RING_MIN_CAPACITY, RING_MAX_CAPACITY, optarg);
				return 2;
			}
			break;
		case 'r':
			repeat = strtoul(optarg, &end, 10);
			if (*end || !repeat || repeat > 1000) {
				fprintf(stderr, "bench_ring: --repeat: not in 1..1000: %s\n", optarg);
				return 2;
			}
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	rates = calloc(repeat, sizeof *rates);
	if (!rates)
		return 1;
	if (json)
		printf("{\"records\":%llu,\"capacity\":%lu,\"record_bytes\":%.0f,\"runs\":[",
		       (unsigned long long)records, capacity, rec_bytes);
	for (unsigned long i = 0; i < repeat; i++) {
		double s = run_once((uint32_t)capacity, records, &waits);

		if (s < 0)
			return 1;
		rates[i] = (double)records / s;
		if (json)
			printf("%s{\"seconds\":%.6f,\"records_per_s\":%.0f,\"mb_per_s\":%.1f,"
			       "\"full_waits\":%llu}", i ? "," : "", s, rates[i],
			       rates[i] * rec_bytes / 1e6, (unsigned long long)waits);
		else
			printf("run %lu: %llu records in %.3f s: %.2f M records/s, %.1f MB/s "
			       "(%.0f ring bytes each), %llu full-ring waits\n", i + 1,
			       (unsigned long long)records, s, rates[i] / 1e6,
			       rates[i] * rec_bytes / 1e6, rec_bytes, (unsigned long long)waits);
		fflush(stdout);
	}
	qsort(rates, repeat, sizeof *rates, cmp_double);
	median = repeat % 2 ? rates[repeat / 2] : (rates[repeat / 2 - 1] + rates[repeat / 2]) / 2;
	if (json)
		printf("],\"median_records_per_s\":%.0f,\"median_mb_per_s\":%.1f}\n", median,
		       median * rec_bytes / 1e6);
	else
		printf("median of %lu: %.2f M records/s, %.1f MB/s\n", repeat, median / 1e6,
		       median * rec_bytes / 1e6);
	free(rates);
	return 0;
}
