/* kv_pool.h - the paged KV-cache pool and its prefix cache.
 *
 * Fixed-size blocks of K and V for every layer, preallocated once in one
 * shared memfd mapping, handed out from a free list and refcounted so
 * sequences can share them.  A full block can be published under a content
 * hash (its parent block's hash, its token ids and a salt naming the model
 * and KV format); a later sequence whose prompt has the same prefix finds
 * the chain of blocks and reuses them without copying.  Published blocks
 * that nobody references stay cached until the pool needs them, evicted
 * least recently used.  Engine thread only.
 */
#ifndef LLMD_KV_POOL_H
#define LLMD_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define KV_BLOCK_TOKENS 16 /* default tokens per block */
#define KV_HASH_ROOT 0     /* parent hash of a sequence's first block */

struct kv_block_meta;

struct kv_pool {
	struct bk_kv view;   /* what attention reads: base, type, block geometry */
	int memfd;           /* backing memfd (for a later fd-store hand-over); owned */
	size_t bytes;        /* size of the mapping */
	uint64_t salt;       /* mixed into every hash: model and KV format */
	int32_t *free_ids;   /* (n_blocks) stack of never-published free blocks */
	int32_t n_free;      /* entries on free_ids */
	struct kv_block_meta *meta; /* (n_blocks) refcount, hash, LRU links */
	int32_t *tokens;     /* (n_blocks, block_tokens) token ids of published blocks */
	int32_t *table;      /* (table_cap) hash table of published blocks, -1 = empty */
	uint32_t table_cap;  /* power of two, >= 2 * n_blocks */
	int32_t lru_head;    /* least recently released cached block, or -1 */
	int32_t lru_tail;    /* most recently released, or -1 */
	int32_t n_used;      /* blocks with refs > 0 */
	int32_t n_cached;    /* published blocks with refs == 0 (evictable) */
	uint64_t lookups;    /* kv_pool_lookup calls */
	uint64_t hits;       /* ... that found a block */
	uint64_t evictions;  /* cached blocks reclaimed by kv_pool_alloc */
};

/* Bytes one block takes for this geometry (K and V, all layers): per token
 * and layer, 2 rows of kv_dim elements, 4 bytes each for QT_F32, 2 for
 * QT_F16, and 34 per 32 for QT_Q8_0.  0 when TYPE cannot hold the geometry
 * (an unknown type, or Q8_0 with kv_dim not a multiple of 32). */
size_t kv_pool_block_bytes(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim);

/* Creates a pool of N_BLOCKS blocks.  TYPE is QT_F32, QT_F16 or QT_Q8_0
 * (kv_dim a multiple of 32).  SALT names what makes two pools' contents
 * incomparable (model file, KV type).  Returns 0 or -EINVAL / -ENOMEM (with
 * a message in ERR). */
int kv_pool_new(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim,
		int32_t n_blocks, uint64_t salt, struct kv_pool **ret, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p); /* NULL-safe */

/* A block with one reference: a free one, else the least recently used
 * cached block (unpublished first).  -ENOSPC when every block is in use. */
int32_t kv_pool_alloc(struct kv_pool *p);
void kv_pool_ref(struct kv_pool *p, int32_t block);
/* Drops a reference.  At zero a published block becomes cached (evictable),
 * any other block free. */
void kv_pool_unref(struct kv_pool *p, int32_t block);
/* References held on BLOCK. */
uint32_t kv_pool_refs(const struct kv_pool *p, int32_t block);

/* The hash a full block of TOKENS (block_tokens ids) gets after PARENT. */
uint64_t kv_pool_hash(const struct kv_pool *p, uint64_t parent, const int32_t *tokens);

/* Publishes the full block BLOCK, holding TOKENS after PARENT, under HASH =
 * kv_pool_hash(p, parent, tokens).  If another block already holds that
 * content, nothing changes and 0 is returned; 1 when published. */
int kv_pool_publish(struct kv_pool *p, int32_t block, uint64_t parent, const int32_t *tokens);

/* The published block holding TOKENS after PARENT (contents compared, not
 * just the hash), with a new reference taken; or -ENOENT. */
int32_t kv_pool_lookup(struct kv_pool *p, uint64_t parent, const int32_t *tokens);

/* Blocks kv_pool_alloc can still hand out (free + cached). */
int32_t kv_pool_n_available(const struct kv_pool *p);

/* Checks every invariant (refcounts, free list, LRU list, hash table, counts):
 * 0, or -EUCLEAN with a description in ERR.  For tests; O(n_blocks). */
int kv_pool_check(const struct kv_pool *p, char *err, size_t errlen);

#endif
