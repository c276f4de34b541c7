/* kv_pool.h - the paged KV-cache pool: fixed-size blocks of K and V for every
 * layer, preallocated once in one shared memfd mapping, handed out by a free
 * list and refcounted so sequences can share blocks.
 * Engine thread only.
 */
#ifndef LLMD_KV_POOL_H
#define LLMD_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define KV_BLOCK_TOKENS 16 /* default tokens per block */

struct kv_pool {
	struct bk_kv view;  /* what attention reads: base, type, block geometry */
	int memfd;          /* backing memfd (for a later fd-store hand-over); owned */
	size_t bytes;       /* size of the mapping */
	int32_t *free_ids;  /* (n_blocks) stack of free block ids */
	int32_t n_free;     /* entries on free_ids */
	uint32_t *refs;     /* (n_blocks) references per block; 0 = free */
};

/* Bytes one block takes for this geometry (K and V, all layers). */
size_t kv_pool_block_bytes(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim);

/* Creates a pool of N_BLOCKS blocks.  TYPE is QT_F32 or QT_F16.  Returns 0 or
 * -EINVAL / -ENOMEM (with a message in ERR). */
int kv_pool_new(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim,
		int32_t n_blocks, struct kv_pool **ret, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p); /* NULL-safe */

/* A free block with one reference, or -ENOSPC. */
int32_t kv_pool_alloc(struct kv_pool *p);
void kv_pool_ref(struct kv_pool *p, int32_t block);
/* Drops a reference; the block returns to the free list at zero. */
void kv_pool_unref(struct kv_pool *p, int32_t block);

static inline int32_t kv_pool_n_free(const struct kv_pool *p)
{
	return p->n_free;
}

#endif
