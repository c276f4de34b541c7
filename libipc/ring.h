/* ring.h - the shared-memory ring that carries token records from the
 * daemon's engine thread (the only producer) to one client (the only
 * consumer).
 *
 * The daemon creates a memfd of RING_HDR_SIZE + capacity bytes, seals it
 * against shrinking and growing (so neither side can make the other fault),
 * and passes it to the client.  Layout:
 *
 *   page 0, the header:
 *     off 0    u32 magic (RING_MAGIC), u32 version (RING_VERSION),
 *              u32 capacity (data bytes, a power of two), u32 reserved
 *              -- written by the daemon before the fd is passed, never after
 *     off 64   u32 prod        free-running byte index of the next write;
 *              u32 need_wake   1: the producer found the ring full and waits
 *              -- written by the producer only (release), read by the consumer
 *     off 128  u32 cons        free-running byte index of the next read
 *              -- written by the consumer only (release), read by the producer
 *   page 1 on: CAPACITY data bytes.
 *
 * Indices run freely modulo 2^32; the offset of index I is I & (capacity-1).
 * Records start 8-byte aligned: u32 len (header plus payload bytes), u16
 * type, u16 reserved, then the payload; the next record starts at the next
 * multiple of 8.  A record
 * never wraps: when the tail of the data area is too short, the producer
 * fills it with a RING_REC_PAD record and starts at offset 0.
 *
 * Wake-ups: after a step that wrote records the daemon signals the client's
 * wake channel (usock_wake) once.  When a record does not fit, ring_push sets need_wake; the
 * consumer, after advancing cons, sees it and sends a PROTO_RING_WAKE frame
 * on the socket.  The producer never trusts cons: a value that is not within
 * CAPACITY bytes behind prod makes every later push fail with -EPROTO.
 */
#ifndef LLMD_RING_H
#define LLMD_RING_H

#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x474e524cu   /* "LRNG" */
#define RING_VERSION 1
#define RING_HDR_SIZE 4096
#define RING_MIN_CAPACITY 4096u
#define RING_MAX_CAPACITY (64u << 20)
#define RING_REC_HDR 8
#define RING_REC_PAD 0xffff      /* padding to the end of the data area */

struct ring;

/* Producer (daemon) side. */

/* Creates a sealed memfd ring of CAPACITY data bytes (a power of two within
 * RING_MIN_CAPACITY..RING_MAX_CAPACITY) and maps it.  0 or a negative errno
 * with a message.  Any thread; afterwards the producer calls belong to one
 * thread. */
int ring_create(uint32_t capacity, struct ring **ret, char *err, size_t errlen);

/* The memfd to pass to the client (owned by the ring; dup it to keep it). */
int ring_fd(const struct ring *r);

uint32_t ring_capacity(const struct ring *r);

/* Largest payload a single record may carry: capacity/4 - RING_REC_HDR, so a
 * record always fits once the consumer has caught up. */
size_t ring_max_payload(const struct ring *r);

/* Appends one record of type TYPE (< RING_REC_PAD) whose payload is A
 * (ALEN bytes) followed by B (BLEN bytes; may be NULL/0) and publishes it.
 * Returns 0; -EAGAIN when there is no room now (need_wake is set); -EMSGSIZE
 * when the payload exceeds ring_max_payload; -EPROTO when the consumer index
 * is impossible (the client scribbled on it; sticky).  Producer thread. */
int ring_push(struct ring *r, uint16_t type, const void *a, size_t alen, const void *b,
	      size_t blen);

/* Free bytes as the producer sees them now (0 after -EPROTO).  Producer thread. */
size_t ring_free_bytes(struct ring *r);

/* Consumer (client) side. */

/* Maps the ring in FD (which the caller keeps owning): checks the seals,
 * the size, the magic, the version and the capacity.  0 or a negative errno
 * with a message. */
int ring_attach(int fd, struct ring **ret, char *err, size_t errlen);

struct ring_rec {
	uint16_t type;           /* the producer's type (never RING_REC_PAD) */
	const uint8_t *payload;  /* (len) inside the mapping; valid until ring_consume */
	uint32_t len;            /* payload bytes, exactly as pushed */
};

/* Looks at the next record without consuming it, skipping padding.
 * Returns 1 and fills RET; 0 when the ring is empty; -EBADMSG when the
 * producer wrote a malformed record.  Consumer thread. */
int ring_peek(struct ring *r, struct ring_rec *ret);

/* Consumes the record ring_peek returned.  Returns 1 when the producer is
 * waiting for space (send PROTO_RING_WAKE), else 0.  Consumer thread. */
int ring_consume(struct ring *r);

/* Both sides: unmaps (and, for the producer, closes the memfd).  NULL-safe. */
void ring_free(struct ring *r);

#endif
