/* test_ring.c - the shared-memory ring keeps its promises:
 *  - records of every size come out exactly as pushed, in order, padding at
 *    the wrap included, and the indices agree with a model of the layout;
 *  - the consumer's free-running index wraps past 2^32;
 *  - the ring fills to the last byte, refuses one more, and takes it after
 *    one consume; payloads over capacity/4 - 8 get -EMSGSIZE;
 *  - a full ring sets need_wake and the next consume reports it;
 *  - an impossible consumer index poisons the producer for good;
 *  - the consumer refuses unsealed, mis-sized, foreign or malformed rings
 *    and malformed records;
 *  - two threads move 2 million records through 4 KiB, the producer
 *    sleeping on wake-ups only: none lost, reordered or damaged;
 *  - a forked consumer attaches to the fd and reads it all.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "ring.h"
#include "testutil.h"

/* A raw view of a ring's mapping, as a scribbling peer would have it. */
struct raw {
	uint8_t *base;      /* (RING_HDR_SIZE + capacity) */
	size_t len;
};

static struct raw raw_map(int fd)
{
	struct raw v = { NULL, 0 };
	struct stat st;

	if (fstat(fd, &st) == 0) {
		v.len = (size_t)st.st_size;
		v.base = mmap(NULL, v.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (v.base == MAP_FAILED)
			v.base = NULL;
	}
	return v;
}

static void raw_unmap(struct raw *v)
{
	if (v->base)
		munmap(v->base, v->len);
}

static uint32_t *raw_u32(const struct raw *v, size_t off)
{
	return (uint32_t *)(v->base + off);
}

#define RAW_PROD(v) (*raw_u32((v), 64))
#define RAW_WAKE(v) (*raw_u32((v), 68))
#define RAW_CONS(v) (*raw_u32((v), 128))

static struct ring *make_ring(uint32_t capacity)
{
	struct ring *r = NULL;
	char err[256];
	int rc = ring_create(capacity, &r, err, sizeof err);

	if (rc < 0) {
		fprintf(stderr, "ring_create(%u): %s\n", capacity, err);
		exit(1);
	}
	return r;
}

static struct ring *attach(struct ring *p)
{
	struct ring *c = NULL;
	char err[256];
	int rc = ring_attach(ring_fd(p), &c, err, sizeof err);

	if (rc < 0) {
		fprintf(stderr, "ring_attach: %s\n", err);
		exit(1);
	}
	return c;
}

static uint8_t pattern(uint32_t seq, size_t i)
{
	return (uint8_t)(seq * 131u + i * 7u + (i >> 8));
}

/* Pushes SEQ's record: LEN pattern bytes split between A and B. */
static int push_seq(struct ring *r, uint32_t seq, size_t len)
{
	static uint8_t buf[RING_MAX_CAPACITY / 4];
	size_t split = len ? (seq % (len + 1)) : 0;

	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(seq, i);
	return ring_push(r, (uint16_t)(seq % 0x7fff), buf, split, len - split ? buf + split : NULL,
			 len - split);
}

/* Checks the next record is SEQ's of LEN bytes and consumes it.  0 or -1. */
static int pop_seq(struct ring *c, uint32_t seq, size_t len, int *ret_wake)
{
	struct ring_rec rec;
	int rc = ring_peek(c, &rec), w;

	if (rc != 1) {
		fprintf(stderr, "record %u: ring_peek %d\n", seq, rc);
		return -1;
	}
	if (rec.type != seq % 0x7fff || rec.len != len) {
		fprintf(stderr, "record %u: type %u len %u, expected %u, %zu\n", seq, rec.type,
			rec.len, seq % 0x7fff, len);
		return -1;
	}
	for (size_t i = 0; i < len; i++)
		if (rec.payload[i] != pattern(seq, i)) {
			fprintf(stderr, "record %u: byte %zu differs\n", seq, i);
			return -1;
		}
	w = ring_consume(c);
	if (ret_wake)
		*ret_wake = w;
	return 0;
}

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* ---- single thread ---- */

static void test_create_and_attach(void)
{
	struct ring *p = make_ring(8192), *c = attach(p), *bad = (struct ring *)&bad;
	char err[256];
	int seals;

	CHECK_INT_EQ(ring_capacity(p), 8192);
	CHECK_INT_EQ(ring_capacity(c), 8192);
	CHECK_INT_EQ(ring_max_payload(p), 8192 / 4 - 8);
	CHECK_INT_EQ(ring_free_bytes(p), 8192);
	CHECK(fcntl(ring_fd(p), F_GETFD) & FD_CLOEXEC);
	seals = fcntl(ring_fd(p), F_GET_SEALS);
	CHECK((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
	      (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
	/* The client can neither resize the file nor add seals. */
	CHECK(ftruncate(ring_fd(p), 4096) < 0 && errno == EPERM);
	CHECK(fcntl(ring_fd(p), F_ADD_SEALS, F_SEAL_WRITE) < 0);
	CHECK_INT_EQ(ring_consume(c), 0); /* nothing peeked */
	{
		struct ring_rec rec;
		CHECK_INT_EQ(ring_peek(c, &rec), 0);
	}
	ring_free(c);
	ring_free(p);
	ring_free(NULL);

	for (uint32_t capacity = 0; capacity < 3 * RING_MIN_CAPACITY; capacity += 1024) {
		struct ring *r = bad;
		int want = capacity == 4096 || capacity == 8192 ? 0 : -EINVAL;
		CHECK_INT_EQ(ring_create(capacity, &r, err, sizeof err), want);
		if (want == 0)
			ring_free(r);
		else
			CHECK(r == bad); /* untouched on failure */
	}
	CHECK_INT_EQ(ring_create(RING_MAX_CAPACITY * 2, &p, err, sizeof err), -EINVAL);
	CHECK_INT_EQ(ring_create(RING_MAX_CAPACITY + 4096, &p, err, sizeof err), -EINVAL);
	CHECK_INT_EQ(ring_create(RING_MAX_CAPACITY, &p, err, sizeof err), 0);
	ring_free(p);
}

/* Random sizes, pushed until full, drained, repeated: content and order
 * hold, and the producer's index matches a model that pads at the wrap. */
static void test_round_trip(void)
{
	static const uint32_t caps[] = { 4096, 8192, 65536 };

	for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
		struct ring *p = make_ring(caps[k]), *c = attach(p);
		struct raw v = raw_map(ring_fd(p));
		uint32_t cap = caps[k], maxp = (uint32_t)ring_max_payload(p);
		uint32_t seed = 1 + (uint32_t)k, pushed = 0, popped = 0, model = 0, pads = 0;
		size_t lens[8192];

		for (int round = 0; round < 400; round++) {
			int rc;
			do {
				uint32_t len, need, tail;
				/* Mostly small, sometimes up to the maximum. */
				len = lcg(&seed) % 8 == 0 ? lcg(&seed) % (maxp + 1) : lcg(&seed) % 64;
				if (round % 50 == 0)
					len = maxp;
				rc = push_seq(p, pushed, len);
				if (rc == 0) {
					need = (8 + len + 7) & ~7u;
					tail = cap - (model & (cap - 1));
					if (need > tail) {
						model += tail;
						pads++;
					}
					model += need;
					lens[pushed % 8192] = len;
					pushed++;
				}
			} while (rc == 0);
			CHECK_INT_EQ(rc, -EAGAIN);
			CHECK_INT_EQ(RAW_PROD(&v), model);
			while (popped < pushed) {
				if (pop_seq(c, popped, lens[popped % 8192], NULL) < 0) {
					test_failures++;
					break;
				}
				popped++;
			}
			{
				struct ring_rec rec;
				CHECK_INT_EQ(ring_peek(c, &rec), 0);
			}
			CHECK_INT_EQ(RAW_CONS(&v), model);
			CHECK_INT_EQ(ring_free_bytes(p), cap);
		}
		CHECK(pads > 10);
		CHECK_INT_EQ(popped, pushed);
		raw_unmap(&v);
		ring_free(c);
		ring_free(p);
	}

	/* Interleaved one by one: every size from 0 to the maximum. */
	{
		struct ring *p = make_ring(4096), *c = attach(p);
		uint32_t maxp = (uint32_t)ring_max_payload(p);
		for (uint32_t len = 0; len <= maxp; len++) {
			CHECK_INT_EQ(push_seq(p, len, len), 0);
			if (pop_seq(c, len, len, NULL) < 0) {
				test_failures++;
				break;
			}
		}
		ring_free(c);
		ring_free(p);
	}
}

/* A peeked record stays put until consumed; a pad is skipped by peek. */
static void test_peek_is_idempotent(void)
{
	struct ring *p = make_ring(4096), *c = attach(p);
	struct raw v = raw_map(ring_fd(p));
	struct ring_rec a, b;

	/* 3 * 1024 + 1016 bytes leave an 8-byte tail. */
	for (uint32_t i = 0; i < 3; i++)
		CHECK_INT_EQ(push_seq(p, i, 1016), 0);
	CHECK_INT_EQ(push_seq(p, 3, 1008), 0);
	for (uint32_t i = 0; i < 4; i++)
		CHECK_INT_EQ(pop_seq(c, i, i < 3 ? 1016 : 1008, NULL), 0);
	CHECK_INT_EQ(push_seq(p, 4, 1016), 0);   /* pad of 8 bytes, then offset 0 */
	CHECK_INT_EQ(RAW_PROD(&v), 4096 + 1024);
	CHECK_INT_EQ(*raw_u32(&v, RING_HDR_SIZE + 4088), 8);
	CHECK_INT_EQ(*(uint16_t *)(v.base + RING_HDR_SIZE + 4092), RING_REC_PAD);
	CHECK_INT_EQ(ring_peek(c, &a), 1);
	CHECK_INT_EQ(RAW_CONS(&v), 4096);        /* the pad is consumed */
	CHECK_INT_EQ(ring_peek(c, &b), 1);
	CHECK(a.payload == b.payload && a.len == b.len && a.type == b.type);
	CHECK_INT_EQ(pop_seq(c, 4, 1016, NULL), 0);
	CHECK_INT_EQ(ring_peek(c, &a), 0);
	raw_unmap(&v);
	ring_free(c);
	ring_free(p);
}

static void test_capacity_boundary(void)
{
	struct ring *p = make_ring(4096), *c = attach(p);
	struct raw v = raw_map(ring_fd(p));
	size_t maxp = ring_max_payload(p);
	int wake = -1;

	/* Four largest records fill it to the byte. */
	for (uint32_t i = 0; i < 4; i++)
		CHECK_INT_EQ(push_seq(p, i, maxp), 0);
	CHECK_INT_EQ(ring_free_bytes(p), 0);
	CHECK_INT_EQ(push_seq(p, 4, 0), -EAGAIN);
	CHECK_INT_EQ(push_seq(p, 4, 0), -EAGAIN);
	CHECK_INT_EQ(pop_seq(c, 0, maxp, &wake), 0);
	CHECK_INT_EQ(wake, 1);
	CHECK_INT_EQ(ring_free_bytes(p), 1024);
	CHECK_INT_EQ(push_seq(p, 4, maxp), 0);
	CHECK_INT_EQ(ring_free_bytes(p), 0);
	for (uint32_t i = 1; i < 5; i++)
		CHECK_INT_EQ(pop_seq(c, i, maxp, NULL), 0);

	/* 512 empty records (8 bytes each) fill it too. */
	for (uint32_t i = 0; i < 512; i++)
		CHECK_INT_EQ(push_seq(p, 100 + i, 0), 0);
	CHECK_INT_EQ(push_seq(p, 612, 0), -EAGAIN);
	CHECK_INT_EQ(pop_seq(c, 100, 0, &wake), 0);
	CHECK_INT_EQ(wake, 1);
	CHECK_INT_EQ(push_seq(p, 612, 1), -EAGAIN); /* 16 bytes, 8 free */
	CHECK_INT_EQ(push_seq(p, 612, 0), 0);
	for (uint32_t i = 101; i <= 612; i++)
		CHECK_INT_EQ(pop_seq(c, i, 0, NULL), 0);
	raw_unmap(&v);
	ring_free(c);
	ring_free(p);
}

static void test_msgsize(void)
{
	struct ring *p = make_ring(4096), *c = attach(p);
	static uint8_t buf[4096];
	size_t maxp = ring_max_payload(p);

	CHECK_INT_EQ(ring_push(p, 1, buf, maxp + 1, NULL, 0), -EMSGSIZE);
	CHECK_INT_EQ(ring_push(p, 1, buf, maxp, buf, 1), -EMSGSIZE);
	CHECK_INT_EQ(ring_push(p, 1, buf, 1, buf, maxp), -EMSGSIZE);
	CHECK_INT_EQ(ring_push(p, 1, buf, SIZE_MAX, buf, 2), -EMSGSIZE);
	CHECK_INT_EQ(ring_push(p, 1, buf, 2, buf, SIZE_MAX), -EMSGSIZE);
	CHECK_INT_EQ(ring_push(p, RING_REC_PAD, buf, 1, NULL, 0), -EINVAL);
	CHECK_INT_EQ(ring_push(p, 1, buf, maxp - 10, buf, 10), 0);
	CHECK_INT_EQ(ring_push(p, 0, NULL, 0, NULL, 0), 0);
	CHECK_INT_EQ(ring_free_bytes(p), 4096 - 1024 - 8);
	ring_free(c);
	ring_free(p);
}

static void test_need_wake(void)
{
	struct ring *p = make_ring(4096), *c = attach(p);
	struct raw v = raw_map(ring_fd(p));
	int wake = -1;
	uint32_t n = 0;

	while (push_seq(p, n, 100) == 0)
		n++;
	CHECK_INT_EQ(n, 4096 / 112);
	CHECK_INT_EQ(RAW_WAKE(&v), 1);
	CHECK_INT_EQ(pop_seq(c, 0, 100, &wake), 0);
	CHECK_INT_EQ(wake, 1);
	CHECK_INT_EQ(RAW_WAKE(&v), 1);           /* the producer has not pushed yet */
	CHECK_INT_EQ(pop_seq(c, 1, 100, &wake), 0);
	CHECK_INT_EQ(wake, 1);
	CHECK_INT_EQ(push_seq(p, n++, 100), 0);
	CHECK_INT_EQ(RAW_WAKE(&v), 0);
	CHECK_INT_EQ(pop_seq(c, 2, 100, &wake), 0);
	CHECK_INT_EQ(wake, 0);
	raw_unmap(&v);
	ring_free(c);
	ring_free(p);
}

/* The consumer index is the client's to write; an impossible one ends the
 * producer's trust for good.  (The producer reads cons when its cached view
 * runs out of room, or in ring_free_bytes.) */
static void test_scribbled_cons(void)
{
	for (int k = 0; k < 4; k++) {
		struct ring *p = make_ring(4096);
		struct raw v = raw_map(ring_fd(p));
		uint32_t prod, good;
		int n = 0;

		while (push_seq(p, (uint32_t)n, 50) == 0)
			n++;
		prod = RAW_PROD(&v);
		good = RAW_CONS(&v);
		switch (k) {
		case 0: RAW_CONS(&v) = prod + 8; break;
		case 1: RAW_CONS(&v) = prod - 4096 - 8; break;
		case 2: RAW_CONS(&v) = good + 1; break;     /* not a record boundary */
		case 3: RAW_CONS(&v) = 0x80000000u; break;
		}
		CHECK_INT_EQ(push_seq(p, (uint32_t)n, 50), -EPROTO);
		CHECK_INT_EQ(ring_free_bytes(p), 0);
		RAW_CONS(&v) = prod;                         /* too late: sticky */
		CHECK_INT_EQ(push_seq(p, (uint32_t)n, 0), -EPROTO);
		CHECK_INT_EQ(push_seq(p, (uint32_t)n, 50), -EPROTO);
		CHECK_INT_EQ(ring_free_bytes(p), 0);
		raw_unmap(&v);
		ring_free(p);
	}
	/* ring_free_bytes notices it too, without a full ring. */
	{
		struct ring *p = make_ring(4096);
		struct raw v = raw_map(ring_fd(p));
		CHECK_INT_EQ(push_seq(p, 0, 50), 0);
		RAW_CONS(&v) = 128;                  /* ahead of prod (64) */
		CHECK_INT_EQ(ring_free_bytes(p), 0);
		CHECK_INT_EQ(push_seq(p, 1, 50), -EPROTO);
		raw_unmap(&v);
		ring_free(p);
	}
}

/* ---- the consumer's checks ---- */

/* A ring file made by hand: SIZE bytes, the given header, SEALS added. */
static int fake_ring(size_t size, uint32_t magic, uint32_t version, uint32_t capacity,
		     int seals)
{
	int fd = memfd_create("fake-ring", MFD_CLOEXEC | (seals >= 0 ? MFD_ALLOW_SEALING : 0));
	uint32_t h[4] = { magic, version, capacity, 0 };

	if (fd < 0 || ftruncate(fd, (off_t)size) < 0 || pwrite(fd, h, sizeof h, 0) != sizeof h) {
		perror("fake ring");
		exit(1);
	}
	if (seals > 0 && fcntl(fd, F_ADD_SEALS, seals) < 0) {
		perror("F_ADD_SEALS");
		exit(1);
	}
	return fd;
}

static void test_attach_refuses(void)
{
	const int sg = F_SEAL_SHRINK | F_SEAL_GROW;
	struct ring *c = NULL;
	char err[256];
	int fd;

	struct {
		const char *what;
		size_t size;
		uint32_t magic, version, capacity;
		int seals, want;
	} cases[] = {
		{ "good", 4096 + 4096, RING_MAGIC, RING_VERSION, 4096, sg, 0 },
		{ "good, sealed more", 4096 + 8192, RING_MAGIC, RING_VERSION, 8192,
		  sg | F_SEAL_SEAL, 0 },
		{ "unsealable memfd", 4096 + 4096, RING_MAGIC, RING_VERSION, 4096, -1, -EPERM },
		{ "unsealed", 4096 + 4096, RING_MAGIC, RING_VERSION, 4096, 0, -EPERM },
		{ "may grow", 4096 + 4096, RING_MAGIC, RING_VERSION, 4096, F_SEAL_SHRINK, -EPERM },
		{ "may shrink", 4096 + 4096, RING_MAGIC, RING_VERSION, 4096, F_SEAL_GROW, -EPERM },
		{ "size off by 8", 4096 + 4096 + 8, RING_MAGIC, RING_VERSION, 4096, sg, -EINVAL },
		{ "header only", 4096, RING_MAGIC, RING_VERSION, 4096, sg, -EINVAL },
		{ "capacity != size", 4096 + 4096, RING_MAGIC, RING_VERSION, 8192, sg, -EINVAL },
		{ "capacity 6144", 4096 + 6144, RING_MAGIC, RING_VERSION, 6144, sg, -EINVAL },
		{ "capacity 2048", 4096 + 2048, RING_MAGIC, RING_VERSION, 2048, sg, -EINVAL },
		{ "bad magic", 4096 + 4096, RING_MAGIC ^ 1, RING_VERSION, 4096, sg, -EINVAL },
		{ "version 2", 4096 + 4096, RING_MAGIC, RING_VERSION + 1, 4096, sg,
		  -EPROTONOSUPPORT },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int rc;
		c = NULL;
		fd = fake_ring(cases[i].size, cases[i].magic, cases[i].version, cases[i].capacity,
			       cases[i].seals);
		err[0] = 0;
		rc = ring_attach(fd, &c, err, sizeof err);
		if (rc != cases[i].want)
			fprintf(stderr, "attach %s: %d (%s), expected %d\n", cases[i].what, rc, err,
				cases[i].want);
		CHECK_INT_EQ(rc, cases[i].want);
		CHECK(rc == 0 ? c != NULL : c == NULL);
		CHECK(rc == 0 || err[0]);
		ring_free(c);
		close(fd);
	}

	/* Not a memfd at all. */
	{
		char path[] = "/tmp/test_ring.XXXXXX";
		fd = mkostemp(path, O_CLOEXEC);
		CHECK(fd >= 0 && ftruncate(fd, 8192) == 0);
		unlink(path);
		CHECK_INT_EQ(ring_attach(fd, &c, err, sizeof err), -EPERM);
		close(fd);
		CHECK_INT_EQ(ring_attach(-1, &c, err, sizeof err), -EBADF);
	}
}

/* A hand-made ring whose indices sit just below 2^32: records on both
 * sides of the wrap come out, padding skipped. */
static void test_consumer_index_wraps(void)
{
	int fd = fake_ring(4096 + 4096, RING_MAGIC, RING_VERSION, 4096, F_SEAL_SHRINK | F_SEAL_GROW);
	struct raw v = raw_map(fd);
	struct ring *c = NULL;
	struct ring_rec rec;
	char err[256];
	uint32_t start = 0xffffffe0u; /* offset 4064: 32 bytes to the end */
	uint8_t *d = v.base + RING_HDR_SIZE;

	RAW_CONS(&v) = start;
	/* A 16-byte record "abcdefgh", a 16-byte pad, then "xyz" at offset 0. */
	memcpy(d + 4064, &(uint32_t){ 16 }, 4);
	memcpy(d + 4068, &(uint16_t){ 7 }, 2);
	memcpy(d + 4072, "abcdefgh", 8);
	memcpy(d + 4080, &(uint32_t){ 16 }, 4);
	memcpy(d + 4084, &(uint16_t){ RING_REC_PAD }, 2);
	memcpy(d + 0, &(uint32_t){ 11 }, 4);
	memcpy(d + 4, &(uint16_t){ 9 }, 2);
	memcpy(d + 8, "xyz", 3);
	RAW_PROD(&v) = start + 32 + 16;
	CHECK_INT_EQ(ring_attach(fd, &c, err, sizeof err), 0);
	if (c) {
		CHECK_INT_EQ(ring_peek(c, &rec), 1);
		CHECK(rec.type == 7 && rec.len == 8 && memcmp(rec.payload, "abcdefgh", 8) == 0);
		CHECK_INT_EQ(ring_consume(c), 0);
		CHECK_INT_EQ(ring_peek(c, &rec), 1);
		CHECK(rec.type == 9 && rec.len == 3 && memcmp(rec.payload, "xyz", 3) == 0);
		CHECK_INT_EQ(ring_consume(c), 0);
		CHECK_INT_EQ(RAW_CONS(&v), 16);
		CHECK_INT_EQ(ring_peek(c, &rec), 0);
	}
	ring_free(c);
	raw_unmap(&v);
	close(fd);
}

/* What a broken (or hostile) producer may write: each gives -EBADMSG. */
static void test_consumer_validates(void)
{
	for (int k = 0; k < 8; k++) {
		struct ring *p = make_ring(4096), *c = attach(p);
		struct raw v = raw_map(ring_fd(p));
		struct ring_rec rec;
		uint8_t *d = v.base + RING_HDR_SIZE;

		CHECK_INT_EQ(push_seq(p, 0, 20), 0);     /* 32 bytes at offset 0 */
		switch (k) {
		case 0: RAW_PROD(&v) = 4096 + 8; break;  /* more than capacity ahead */
		case 1: RAW_PROD(&v) = 0xfffffff8u; break; /* behind cons */
		case 2: RAW_PROD(&v) = 28; break;        /* not a record boundary */
		case 3: memcpy(d, &(uint32_t){ 4 }, 4); break;        /* len < header */
		case 4: memcpy(d, &(uint32_t){ 40 }, 4); break;       /* past prod */
		case 5: memcpy(d, &(uint32_t){ 5000 }, 4); break;     /* past the end */
		case 6: memcpy(d, &(uint32_t){ 0xfffffffcu }, 4); break; /* align overflow */
		case 7: memcpy(d + 4, &(uint16_t){ RING_REC_PAD }, 2); break; /* short pad */
		}
		CHECK_INT_EQ(ring_peek(c, &rec), -EBADMSG);
		raw_unmap(&v);
		ring_free(c);
		ring_free(p);
	}
}

/* The producer's free-running index passes 2^32: 4 GiB through the ring. */
static void test_producer_index_wraps(void)
{
	struct ring *p = make_ring(1u << 20), *c = attach(p);
	struct raw v = raw_map(ring_fd(p));
	size_t maxp = ring_max_payload(p);
	uint8_t *buf = calloc(1, maxp);
	uint32_t seq = 0, last = 0, after = 0;
	int ok = 1, wrapped = 0;

	while (ok && after < 100) {
		struct ring_rec rec;
		size_t len = seq % 3 ? maxp : (seq * 37u) % 3000;
		buf[0] = (uint8_t)seq;
		if (len)
			buf[len - 1] = (uint8_t)(seq >> 8);
		ok &= ring_push(p, 1, buf, len, NULL, 0) == 0;
		ok &= ring_peek(c, &rec) == 1 && rec.len == len;
		if (ok && len)
			ok &= rec.payload[0] == (uint8_t)seq && rec.payload[len - 1] == (uint8_t)(seq >> 8);
		ring_consume(c);
		if (RAW_PROD(&v) < last)
			wrapped = 1;
		last = RAW_PROD(&v);
		after += wrapped;
		seq++;
	}
	CHECK(ok);
	CHECK(wrapped);
	CHECK_INT_EQ(RAW_PROD(&v), RAW_CONS(&v));
	CHECK_INT_EQ(ring_free_bytes(p), 1u << 20);
	free(buf);
	raw_unmap(&v);
	ring_free(c);
	ring_free(p);
}

/* ---- two threads ---- */

#define STRESS_RECORDS 2000000u

struct stress {
	struct ring *p, *c;
	int wake_fd;            /* eventfd: consumer -> producer, after ring_consume says 1 */
	unsigned long eagain;   /* producer's -EAGAIN count */
	unsigned long lost;     /* waits that timed out: a lost wake-up */
	unsigned long wakes;    /* wakes the consumer sent */
	int bad;                /* consumer saw a wrong record */
	int done;               /* set by the producer when it gives up */
};

static size_t stress_len(uint32_t seq)
{
	return (seq * 2654435761u >> 7) % 201;
}

static void *stress_producer(void *arg)
{
	struct stress *s = arg;

	for (uint32_t seq = 0; seq < STRESS_RECORDS && !__atomic_load_n(&s->bad, __ATOMIC_RELAXED);) {
		int rc = push_seq(s->p, seq, stress_len(seq));
		if (rc == 0) {
			seq++;
		} else if (rc == -EAGAIN) {
			/* Sleep until the consumer says so: a lost wake hangs here. */
			struct pollfd pfd = { .fd = s->wake_fd, .events = POLLIN };
			uint64_t x;
			s->eagain++;
			if (poll(&pfd, 1, 5000) == 0)
				s->lost++;
			else if (read(s->wake_fd, &x, sizeof x) != sizeof x)
				s->lost++;
		} else {
			fprintf(stderr, "stress push %u: %d\n", seq, rc);
			break;
		}
	}
	__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_two_threads(void)
{
	struct stress s = { 0 };
	pthread_t t;
	uint32_t seq = 0;
	uint64_t one = 1;

	s.p = make_ring(4096);
	s.c = attach(s.p);
	s.wake_fd = eventfd(0, EFD_CLOEXEC);
	CHECK(s.wake_fd >= 0);
	CHECK_INT_EQ(pthread_create(&t, NULL, stress_producer, &s), 0);
	while (seq < STRESS_RECORDS) {
		struct ring_rec rec;
		int rc = ring_peek(s.c, &rec), w;
		if (rc == 0) {
			if (__atomic_load_n(&s.done, __ATOMIC_ACQUIRE) && ring_peek(s.c, &rec) == 0)
				break;
			sched_yield();
			continue;
		}
		if (rc < 0 || rec.type != seq % 0x7fff || rec.len != stress_len(seq)) {
			fprintf(stderr, "stress record %u: rc %d type %u len %u\n", seq, rc,
				rc == 1 ? rec.type : 0, rc == 1 ? rec.len : 0);
			__atomic_store_n(&s.bad, 1, __ATOMIC_RELAXED);
			break;
		}
		for (size_t i = 0; i < rec.len; i++)
			if (rec.payload[i] != pattern(seq, i)) {
				fprintf(stderr, "stress record %u: byte %zu\n", seq, i);
				__atomic_store_n(&s.bad, 1, __ATOMIC_RELAXED);
				break;
			}
		if (s.bad)
			break;
		w = ring_consume(s.c);
		if (w == 1) {
			s.wakes++;
			CHECK(write(s.wake_fd, &one, sizeof one) == sizeof one);
		}
		seq++;
	}
	if (s.bad) /* let a waiting producer see it */
		CHECK(write(s.wake_fd, &one, sizeof one) == sizeof one);
	pthread_join(t, NULL);
	CHECK_INT_EQ(s.bad, 0);
	CHECK_INT_EQ(seq, STRESS_RECORDS);
	CHECK_INT_EQ(s.lost, 0);
	CHECK(s.eagain > 0);
	printf("two threads: %u records, %lu full-ring waits, %lu wakes sent, %lu lost\n", seq,
	       s.eagain, s.wakes, s.lost);
	close(s.wake_fd);
	ring_free(s.c);
	ring_free(s.p);
}

/* ---- two processes ---- */

#define FORK_RECORDS 100000u

static int child_consume(int fd, int wake_fd)
{
	struct ring *c = NULL;
	char err[256];
	uint32_t seq = 0;
	uint64_t one = 1;
	time_t deadline = time(NULL) + 60;

	if (ring_attach(fd, &c, err, sizeof err) < 0)
		return 2;
	while (seq < FORK_RECORDS) {
		struct ring_rec rec;
		int rc = ring_peek(c, &rec);
		if (rc == 0) {
			if (time(NULL) > deadline)
				return 3;
			sched_yield();
			continue;
		}
		if (rc != 1 || rec.type != seq % 0x7fff || rec.len != stress_len(seq))
			return 4;
		for (size_t i = 0; i < rec.len; i++)
			if (rec.payload[i] != pattern(seq, i))
				return 5;
		if (ring_consume(c) == 1 && write(wake_fd, &one, sizeof one) != sizeof one)
			return 6;
		seq++;
	}
	ring_free(c);
	return 0;
}

static void test_two_processes(void)
{
	struct ring *p = make_ring(4096);
	int wake_fd = eventfd(0, EFD_CLOEXEC), status = -1;
	unsigned long lost = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		_exit(child_consume(ring_fd(p), wake_fd));
	for (uint32_t seq = 0; seq < FORK_RECORDS;) {
		int rc = push_seq(p, seq, stress_len(seq));
		if (rc == 0) {
			seq++;
		} else if (rc == -EAGAIN) {
			struct pollfd pfd = { .fd = wake_fd, .events = POLLIN };
			uint64_t x;
			if (poll(&pfd, 1, 5000) != 1 || read(wake_fd, &x, sizeof x) != sizeof x) {
				lost++;
				if (waitpid(pid, &status, WNOHANG) == pid)
					break;
			}
		} else {
			CHECK_INT_EQ(rc, 0);
			break;
		}
	}
	if (status == -1)
		CHECK_INT_EQ(waitpid(pid, &status, 0), pid);
	CHECK(WIFEXITED(status));
	CHECK_INT_EQ(WEXITSTATUS(status), 0);
	CHECK_INT_EQ(lost, 0);
	close(wake_fd);
	ring_free(p);
}

int main(void)
{
	test_create_and_attach();
	test_round_trip();
	test_peek_is_idempotent();
	test_capacity_boundary();
	test_msgsize();
	test_need_wake();
	test_scribbled_cons();
	test_attach_refuses();
	test_consumer_index_wraps();
	test_consumer_validates();
	test_producer_index_wraps();
	test_two_threads();
	test_two_processes();
	return test_result();
}
