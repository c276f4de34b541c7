/* ring.c - the sealed shared-memory SPSC ring of ring.h: one producer (the
 * daemon's engine thread), one consumer (a client), variable-length records.
 *
 * It moves bytes and wake-up hints; what a record means is proto.h's
 * business, and signalling the other side (wake channel, PROTO_RING_WAKE) is the
 * caller's.  Each side trusts only its own index: everything it reads from
 * the mapping is checked before use.
 */
#include "ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"

/* The header page, as ring.h draws it.  Indices are accessed only through
 * __atomic builtins; the cache-line gaps keep the producer's and the
 * consumer's stores from sharing a line. */
struct ring_hdr {
	uint32_t magic;          /* RING_MAGIC; producer, before sharing */
	uint32_t version;        /* RING_VERSION; producer, before sharing */
	uint32_t capacity;       /* data bytes, a power of two; producer, before sharing */
	uint32_t reserved;       /* 0 */
	uint8_t gap0[48];
	uint32_t prod;           /* free-running byte index; producer writes (release) */
	uint32_t need_wake;      /* 1: a push found no room; producer writes */
	uint8_t gap1[56];
	uint32_t cons;           /* free-running byte index; consumer writes (release) */
};

_Static_assert(offsetof(struct ring_hdr, prod) == 64, "prod at offset 64");
_Static_assert(offsetof(struct ring_hdr, need_wake) == 68, "need_wake at offset 68");
_Static_assert(offsetof(struct ring_hdr, cons) == 128, "cons at offset 128");
_Static_assert(sizeof(struct ring_hdr) <= RING_HDR_SIZE, "header fits its page");

struct ring {
	int fd;                  /* the memfd; owned by the producer, -1 on the consumer side */
	bool producer;           /* which side this handle is */
	struct ring_hdr *hdr;    /* the mapping's first page */
	uint8_t *data;           /* (capacity) bytes after the header page */
	size_t map_len;          /* RING_HDR_SIZE + capacity */
	uint32_t capacity;       /* data bytes, a power of two */
	uint32_t mask;           /* capacity - 1 */

	/* Producer side; the shared prod and need_wake are never read back. */
	uint32_t prod;           /* the authoritative next write index */
	uint32_t cons_seen;      /* last validated cons; prod - cons_seen <= capacity */
	bool wake_set;           /* need_wake is 1 in the mapping (we stored it) */
	bool poisoned;           /* cons was impossible once: every push fails -EPROTO */

	/* Consumer side; the shared cons is never read back. */
	uint32_t cons;           /* the authoritative next read index */
	uint32_t prod_seen;      /* last validated prod; prod_seen - cons <= capacity */
	uint32_t peeked;         /* aligned bytes of the record ring_peek returned, 0 if none */
};

static uint64_t align8(uint64_t n)
{
	return (n + 7) & ~(uint64_t)7;
}

static bool capacity_ok(uint32_t capacity)
{
	return capacity >= RING_MIN_CAPACITY && capacity <= RING_MAX_CAPACITY &&
	       (capacity & (capacity - 1)) == 0;
}

/* Both sides map the whole file shared and writable: the consumer must
 * store cons, the producer everything else. */
static int map_ring(struct ring *r, int fd, uint32_t capacity)
{
	void *p;

	r->map_len = (size_t)RING_HDR_SIZE + capacity;
	p = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	r->hdr = p;
	r->data = (uint8_t *)p + RING_HDR_SIZE;
	r->capacity = capacity;
	r->mask = capacity - 1;
	return 0;
}

/* ---- producer ---- */

int ring_create(uint32_t capacity, struct ring **ret, char *err, size_t errlen)
{
	const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	struct ring *r;
	int rc;

	if (!capacity_ok(capacity)) {
		errbuf_set(err, errlen, "ring capacity %u is not a power of two in %u..%u", capacity,
			RING_MIN_CAPACITY, RING_MAX_CAPACITY);
		return -EINVAL;
	}
	r = calloc(1, sizeof *r);
	if (!r) {
		errbuf_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->producer = true;
	r->fd = memfd_create("llmd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->fd < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "ring memfd: %s", strerror(-rc));
		goto fail;
	}
	if (ftruncate(r->fd, (off_t)RING_HDR_SIZE + capacity) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "ring of %u bytes: ftruncate: %s", capacity, strerror(-rc));
		goto fail;
	}
	rc = map_ring(r, r->fd, capacity);
	if (rc < 0) {
		errbuf_set(err, errlen, "ring of %u bytes: mmap: %s", capacity, strerror(-rc));
		goto fail;
	}
	/* A fresh memfd reads as zeros: prod, need_wake and cons start at 0. */
	r->hdr->magic = RING_MAGIC;
	r->hdr->version = RING_VERSION;
	r->hdr->capacity = capacity;
	r->hdr->reserved = 0;
	if (fcntl(r->fd, F_ADD_SEALS, seals) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "ring memfd: sealing: %s", strerror(-rc));
		goto fail;
	}
	*ret = r;
	return 0;
fail:
	ring_free(r);
	return rc;
}

int ring_fd(const struct ring *r)
{
	return r->fd;
}

uint32_t ring_capacity(const struct ring *r)
{
	return r->capacity;
}

size_t ring_max_payload(const struct ring *r)
{
	return r->capacity / 4 - RING_REC_HDR;
}

/* Reads the consumer's index and checks it: an honest consumer only ever
 * lags prod by at most capacity bytes and moves in whole records (multiples
 * of 8).  Anything else poisons the ring for good.  Returns 0 or -EPROTO. */
static int load_cons(struct ring *r, int memorder)
{
	uint32_t cons = __atomic_load_n(&r->hdr->cons, memorder);

	if ((uint32_t)(r->prod - cons) > r->capacity || (cons & 7)) {
		r->poisoned = true;
		return -EPROTO;
	}
	r->cons_seen = cons;
	return 0;
}

/* Bytes a record of NEED (aligned) bytes takes at prod now, its pad
 * included, in *RET_TOTAL; the pad alone in *RET_PAD. */
static void place(const struct ring *r, uint32_t need, uint32_t *ret_total, uint32_t *ret_pad)
{
	uint32_t tail = r->capacity - (r->prod & r->mask);

	*ret_pad = need <= tail ? 0 : tail;
	*ret_total = *ret_pad + need;
}

static bool fits(const struct ring *r, uint32_t total)
{
	return total <= r->capacity - (uint32_t)(r->prod - r->cons_seen);
}

static void write_hdr(uint8_t *at, uint32_t len, uint16_t type)
{
	uint8_t h[RING_REC_HDR];
	uint16_t zero = 0;

	memcpy(h, &len, 4);
	memcpy(h + 4, &type, 2);
	memcpy(h + 6, &zero, 2);
	memcpy(at, h, sizeof h);
}

/* Lost wake-ups.  The producer returns -EAGAIN only after:
 *   P1 store need_wake = 1;  P2 load cons (still full)
 * and ring_consume does:
 *   C1 store cons;  C2 load need_wake
 * all four seq_cst (on x86 the stores are XCHGs, a full barrier each; a
 * store-release and a load-acquire would not do, as the load could be
 * satisfied before the store is visible).  Seq_cst operations have a single
 * total order consistent with program order.  A consume whose C1 comes
 * before P2 in it is seen by P2, so the space it freed was counted.  A
 * consume whose C1 comes after P2 has its C2 after P1 too, so C2 sees
 * need_wake == 1 (the producer clears it only on a later successful push,
 * when it no longer waits) and ring_consume returns 1.  So when the producer
 * gives up, every consume it did not see will report the wait.  (With
 * need_wake already 1 from an earlier failure, that failure's P1 serves.)
 *
 * And one more consume always comes: a push fails only while a real record
 * is unread, since an empty ring holds any record (pad < need <= capacity/4,
 * see ring_max_payload), and a ring holding only a pad is never full either
 * (the pad ends at offset 0, so capacity - pad >= 3/4 capacity bytes are
 * free and contiguous).  That is also why ring_peek may consume pads with a
 * plain release store, without looking at need_wake. */
int ring_push(struct ring *r, uint16_t type, const void *a, size_t alen, const void *b,
	      size_t blen)
{
	uint32_t need, total, pad, len;
	uint8_t *at;

	if (r->poisoned)
		return -EPROTO;
	if (type >= RING_REC_PAD || (alen && !a) || (blen && !b))
		return -EINVAL;
	if (alen > ring_max_payload(r) || blen > ring_max_payload(r) - alen)
		return -EMSGSIZE;
	len = RING_REC_HDR + (uint32_t)(alen + blen);
	need = (uint32_t)align8(len);
	place(r, need, &total, &pad);
	if (!fits(r, total)) {
		if (load_cons(r, __ATOMIC_ACQUIRE) < 0)
			return -EPROTO;
		if (!fits(r, total)) {
			if (!r->wake_set) {
				__atomic_store_n(&r->hdr->need_wake, 1, __ATOMIC_SEQ_CST);
				r->wake_set = true;
			}
			if (load_cons(r, __ATOMIC_SEQ_CST) < 0)
				return -EPROTO;
			if (!fits(r, total))
				return -EAGAIN;
		}
	}
	if (pad) {
		write_hdr(r->data + (r->prod & r->mask), pad, RING_REC_PAD);
		r->prod += pad;
	}
	at = r->data + (r->prod & r->mask);
	write_hdr(at, len, type);
	if (alen)
		memcpy(at + RING_REC_HDR, a, alen);
	if (blen)
		memcpy(at + RING_REC_HDR + alen, b, blen);
	r->prod += need;
	if (r->wake_set) {
		/* We are not waiting any more; a wake still in flight is harmless. */
		__atomic_store_n(&r->hdr->need_wake, 0, __ATOMIC_RELAXED);
		r->wake_set = false;
	}
	/* Publishes the pad, the record and need_wake's clearing at once. */
	__atomic_store_n(&r->hdr->prod, r->prod, __ATOMIC_RELEASE);
	return 0;
}

size_t ring_free_bytes(struct ring *r)
{
	if (r->poisoned || load_cons(r, __ATOMIC_ACQUIRE) < 0)
		return 0;
	return r->capacity - (uint32_t)(r->prod - r->cons_seen);
}

/* ---- consumer ---- */

/* Reads prod again when everything seen so far is consumed. */
static int load_prod(struct ring *r)
{
	uint32_t prod = __atomic_load_n(&r->hdr->prod, __ATOMIC_ACQUIRE);

	if ((uint32_t)(prod - r->cons) > r->capacity || (prod & 7))
		return -EBADMSG;
	r->prod_seen = prod;
	return 0;
}

int ring_attach(int fd, struct ring **ret, char *err, size_t errlen)
{
	const int need_seals = F_SEAL_SHRINK | F_SEAL_GROW;
	const struct ring_hdr *h;
	uint32_t capacity;
	struct stat st;
	struct ring *r;
	int seals, rc;

	/* Unsealed, the producer could shrink the file under us: SIGBUS. */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 && errno != EINVAL) {
		rc = -errno;
		errbuf_set(err, errlen, "ring fd: cannot read its seals: %s", strerror(-rc));
		return rc;
	}
	if (seals < 0 || (seals & need_seals) != need_seals) {
		errbuf_set(err, errlen, "ring fd is not sealed against shrinking and growing");
		return -EPERM;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		errbuf_set(err, errlen, "ring fd: fstat: %s", strerror(-rc));
		return rc;
	}
	capacity = st.st_size > RING_HDR_SIZE && st.st_size - RING_HDR_SIZE <= RING_MAX_CAPACITY
			   ? (uint32_t)(st.st_size - RING_HDR_SIZE) : 0;
	if (!S_ISREG(st.st_mode) || !capacity_ok(capacity)) {
		errbuf_set(err, errlen, "ring fd: %lld bytes is no ring's size", (long long)st.st_size);
		return -EINVAL;
	}
	r = calloc(1, sizeof *r);
	if (!r) {
		errbuf_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->fd = -1;
	rc = map_ring(r, fd, capacity);
	if (rc < 0) {
		errbuf_set(err, errlen, "ring of %u bytes: mmap: %s", capacity, strerror(-rc));
		goto fail;
	}
	h = r->hdr;
	rc = -EINVAL;
	if (h->magic != RING_MAGIC) {
		errbuf_set(err, errlen, "ring fd: bad magic 0x%08x", h->magic);
		goto fail;
	}
	if (h->version != RING_VERSION) {
		errbuf_set(err, errlen, "ring version %u, expected %u", h->version, RING_VERSION);
		rc = -EPROTONOSUPPORT;
		goto fail;
	}
	if (h->capacity != capacity) {
		errbuf_set(err, errlen, "ring capacity %u does not match its %lld-byte file",
			h->capacity, (long long)st.st_size);
		goto fail;
	}
	/* Start where the indices stand (a fresh ring: 0, 0), if believable. */
	r->cons = __atomic_load_n(&r->hdr->cons, __ATOMIC_ACQUIRE);
	r->prod_seen = r->cons;
	if ((r->cons & 7) || load_prod(r) < 0) {
		errbuf_set(err, errlen, "ring indices are inconsistent");
		rc = -EBADMSG;
		goto fail;
	}
	*ret = r;
	return 0;
fail:
	ring_free(r);
	return rc;
}

int ring_peek(struct ring *r, struct ring_rec *ret)
{
	for (;;) {
		uint32_t off, tail, len, avail;
		uint64_t need;
		uint16_t type;
		const uint8_t *at;

		if (r->prod_seen == r->cons && load_prod(r) < 0)
			return -EBADMSG;
		avail = r->prod_seen - r->cons;
		if (!avail)
			return 0;
		off = r->cons & r->mask;
		tail = r->capacity - off;
		at = r->data + off;
		/* One read of each header field: the producer may rewrite it. */
		len = __atomic_load_n((const uint32_t *)at, __ATOMIC_RELAXED);
		type = __atomic_load_n((const uint16_t *)(at + 4), __ATOMIC_RELAXED);
		need = align8(len);
		if (len < RING_REC_HDR || need > tail || need > avail)
			return -EBADMSG;
		if (type == RING_REC_PAD) {
			if (len != tail)
				return -EBADMSG;
			r->cons += tail;
			__atomic_store_n(&r->hdr->cons, r->cons, __ATOMIC_RELEASE);
			continue;
		}
		r->peeked = (uint32_t)need;
		ret->type = type;
		ret->payload = at + RING_REC_HDR;
		ret->len = len - RING_REC_HDR;
		return 1;
	}
}

int ring_consume(struct ring *r)
{
	if (!r->peeked)
		return 0;
	r->cons += r->peeked;
	r->peeked = 0;
	/* Seq_cst, against the producer's need_wake store: see ring_push. */
	__atomic_store_n(&r->hdr->cons, r->cons, __ATOMIC_SEQ_CST);
	return __atomic_load_n(&r->hdr->need_wake, __ATOMIC_SEQ_CST) != 0;
}

void ring_free(struct ring *r)
{
	if (!r)
		return;
	if (r->hdr)
		munmap(r->hdr, r->map_len);
	if (r->fd >= 0)
		close(r->fd);
	free(r);
}
