/* kv_pool.c - block allocator and prefix cache over one memfd-backed mapping.
 *
 * It hands out, shares and reclaims blocks and remembers which published
 * block holds which token prefix; what a block holds is written by the
 * backend's kv_store and read by its attention.  Which sequence owns which
 * blocks is the scheduler's business.
 */
#include "kv_pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "quant.h"

struct kv_block_meta {
	uint32_t refs;       /* sequences holding the block */
	uint8_t published;   /* 1 while in the hash table */
	uint64_t hash;       /* content hash when published */
	uint64_t parent;     /* parent block's hash when published */
	int32_t prev, next;  /* LRU links while cached (published, refs == 0) */
};

size_t kv_pool_block_bytes(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim)
{
	if ((type != QT_F32 && type != QT_F16 && type != QT_Q8_0) || block_tokens < 1 ||
	    n_layer < 1 || kv_dim < 1)
		return 0;
	/* 0 when a Q8_0 row is not whole 32-element blocks */
	return (size_t)2 * n_layer * block_tokens * qtype_row_bytes(type, kv_dim);
}

int kv_pool_new(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim,
		int32_t n_blocks, uint64_t salt, struct kv_pool **ret, char *err, size_t errlen)
{
	struct kv_pool *p;
	size_t bb;

	bb = kv_pool_block_bytes(type, block_tokens, n_layer, kv_dim);
	if (bb == 0 || block_tokens > 1024 || n_blocks < 1 || n_blocks > (1 << 28)) {
		if (type == QT_Q8_0 && kv_dim % QK)
			snprintf(err, errlen, "a q8_0 KV pool needs rows of whole %d-element blocks "
				 "(K/V rows here have %d elements)", QK, kv_dim);
		else
			snprintf(err, errlen, "invalid KV pool geometry");
		return -EINVAL;
	}
	p = calloc(1, sizeof *p);
	if (!p)
		goto nomem;
	p->memfd = -1;
	p->view.base = MAP_FAILED;
	p->bytes = bb * (size_t)n_blocks;
	p->salt = salt;
	p->memfd = memfd_create("llmd-kv-pool", MFD_CLOEXEC);
	if (p->memfd < 0 || ftruncate(p->memfd, (off_t)p->bytes) < 0) {
		snprintf(err, errlen, "KV pool of %zu MiB: memfd: %s", p->bytes >> 20, strerror(errno));
		kv_pool_free(p);
		return -ENOMEM;
	}
	p->view.base = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
	if (p->view.base == MAP_FAILED) {
		snprintf(err, errlen, "KV pool of %zu MiB: mmap: %s", p->bytes >> 20, strerror(errno));
		kv_pool_free(p);
		return -ENOMEM;
	}
	madvise(p->view.base, p->bytes, MADV_HUGEPAGE);
	p->view.type = type;
	p->view.n_blocks = n_blocks;
	p->view.block_tokens = block_tokens;
	p->view.n_layer = n_layer;
	p->view.kv_dim = kv_dim;
	p->view.row_bytes = qtype_row_bytes(type, kv_dim);
	p->view.block_bytes = bb;
	for (p->table_cap = 16; p->table_cap < 2u * (uint32_t)n_blocks; p->table_cap *= 2)
		;
	p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
	p->meta = calloc((size_t)n_blocks, sizeof *p->meta);
	p->tokens = malloc((size_t)n_blocks * block_tokens * sizeof *p->tokens);
	p->table = malloc(p->table_cap * sizeof *p->table);
	if (!p->free_ids || !p->meta || !p->tokens || !p->table)
		goto nomem;
	memset(p->table, 0xff, p->table_cap * sizeof *p->table);
	/* Low ids on top of the stack: few pages touched while lightly used. */
	for (int32_t i = 0; i < n_blocks; i++)
		p->free_ids[i] = n_blocks - 1 - i;
	p->n_free = n_blocks;
	p->lru_head = p->lru_tail = -1;
	*ret = p;
	return 0;
nomem:
	kv_pool_free(p);
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

void kv_pool_free(struct kv_pool *p)
{
	if (!p)
		return;
	if (p->view.base && p->view.base != MAP_FAILED)
		munmap(p->view.base, p->bytes);
	if (p->memfd >= 0)
		close(p->memfd);
	free(p->free_ids);
	free(p->meta);
	free(p->tokens);
	free(p->table);
	free(p);
}

/* ---- LRU of cached blocks ---- */

static void lru_remove(struct kv_pool *p, int32_t b)
{
	struct kv_block_meta *m = &p->meta[b];
	if (m->prev >= 0)
		p->meta[m->prev].next = m->next;
	else
		p->lru_head = m->next;
	if (m->next >= 0)
		p->meta[m->next].prev = m->prev;
	else
		p->lru_tail = m->prev;
	m->prev = m->next = -1;
	p->n_cached--;
}

static void lru_push(struct kv_pool *p, int32_t b)
{
	struct kv_block_meta *m = &p->meta[b];
	m->prev = p->lru_tail;
	m->next = -1;
	if (p->lru_tail >= 0)
		p->meta[p->lru_tail].next = b;
	else
		p->lru_head = b;
	p->lru_tail = b;
	p->n_cached++;
}

/* ---- hash table (open addressing, linear probing, backward-shift delete) ---- */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

uint64_t kv_pool_hash(const struct kv_pool *p, uint64_t parent, const int32_t *tokens)
{
	uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull) ^ mix64(p->salt + 0x632be59bd9b4e019ull);
	for (int32_t i = 0; i < p->view.block_tokens; i++)
		h = mix64(h ^ (uint32_t)tokens[i]) + 0x9e3779b97f4a7c15ull;
	return h ? h : 1; /* 0 is the root's */
}

static uint32_t slot_of(const struct kv_pool *p, uint64_t hash)
{
	return (uint32_t)hash & (p->table_cap - 1);
}

static void table_insert(struct kv_pool *p, int32_t b)
{
	uint32_t i = slot_of(p, p->meta[b].hash);
	while (p->table[i] >= 0)
		i = (i + 1) & (p->table_cap - 1);
	p->table[i] = b;
}

static void table_remove(struct kv_pool *p, int32_t b)
{
	uint32_t mask = p->table_cap - 1, i = slot_of(p, p->meta[b].hash), j;

	while (p->table[i] != b)
		i = (i + 1) & mask;
	/* Shift later entries of the probe run back so no lookup stops early. */
	for (j = (i + 1) & mask; p->table[j] >= 0; j = (j + 1) & mask) {
		uint32_t home = slot_of(p, p->meta[p->table[j]].hash);
		if (((j - home) & mask) >= ((j - i) & mask)) {
			p->table[i] = p->table[j];
			i = j;
		}
	}
	p->table[i] = -1;
}

static int32_t table_find(const struct kv_pool *p, uint64_t hash, uint64_t parent,
			  const int32_t *tokens)
{
	size_t bt = (size_t)p->view.block_tokens;
	for (uint32_t i = slot_of(p, hash); p->table[i] >= 0; i = (i + 1) & (p->table_cap - 1)) {
		int32_t b = p->table[i];
		const struct kv_block_meta *m = &p->meta[b];
		if (m->hash == hash && m->parent == parent &&
		    memcmp(p->tokens + (size_t)b * bt, tokens, bt * sizeof *tokens) == 0)
			return b;
	}
	return -1;
}

/* ---- blocks ---- */

int32_t kv_pool_alloc(struct kv_pool *p)
{
	int32_t b;

	if (p->n_free > 0) {
		b = p->free_ids[--p->n_free];
	} else if (p->lru_head >= 0) {
		b = p->lru_head;
		lru_remove(p, b);
		table_remove(p, b);
		p->meta[b].published = 0;
		p->evictions++;
	} else {
		return -ENOSPC;
	}
	p->meta[b].refs = 1;
	p->meta[b].prev = p->meta[b].next = -1;
	p->n_used++;
	return b;
}

void kv_pool_ref(struct kv_pool *p, int32_t block)
{
	struct kv_block_meta *m = &p->meta[block];
	if (m->refs++ == 0) {
		lru_remove(p, block); /* only published blocks rest at refs 0 */
		p->n_used++;
	}
}

void kv_pool_unref(struct kv_pool *p, int32_t block)
{
	struct kv_block_meta *m = &p->meta[block];
	if (m->refs == 0 || --m->refs > 0)
		return;
	p->n_used--;
	if (m->published)
		lru_push(p, block);
	else
		p->free_ids[p->n_free++] = block;
}

uint32_t kv_pool_refs(const struct kv_pool *p, int32_t block)
{
	return p->meta[block].refs;
}

int kv_pool_publish(struct kv_pool *p, int32_t block, uint64_t parent, const int32_t *tokens)
{
	struct kv_block_meta *m = &p->meta[block];
	uint64_t h = kv_pool_hash(p, parent, tokens);
	size_t bt = (size_t)p->view.block_tokens;

	if (m->published || m->refs == 0 || table_find(p, h, parent, tokens) >= 0)
		return 0;
	m->hash = h;
	m->parent = parent;
	m->published = 1;
	memcpy(p->tokens + (size_t)block * bt, tokens, bt * sizeof *tokens);
	table_insert(p, block);
	return 1;
}

int32_t kv_pool_lookup(struct kv_pool *p, uint64_t parent, const int32_t *tokens)
{
	int32_t b;

	p->lookups++;
	b = table_find(p, kv_pool_hash(p, parent, tokens), parent, tokens);
	if (b < 0)
		return -ENOENT;
	p->hits++;
	kv_pool_ref(p, b);
	return b;
}

int32_t kv_pool_n_available(const struct kv_pool *p)
{
	return p->n_free + p->n_cached;
}

int kv_pool_check(const struct kv_pool *p, char *err, size_t errlen)
{
	int32_t n = p->view.n_blocks, used = 0, cached = 0, in_table = 0, walked = 0;
	uint8_t *seen = calloc((size_t)n, 1);

#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); free(seen); return -EUCLEAN; } while (0)
	if (!seen)
		BAD("out of memory");
	for (int32_t i = 0; i < p->n_free; i++) {
		int32_t b = p->free_ids[i];
		if (b < 0 || b >= n || seen[b])
			BAD("free list entry %d: block %d repeated or out of range", i, b);
		seen[b] = 1;
		if (p->meta[b].refs || p->meta[b].published)
			BAD("block %d is on the free list but has %u refs / published %d", b,
			    p->meta[b].refs, p->meta[b].published);
	}
	for (int32_t b = p->lru_head, prev = -1; b >= 0; prev = b, b = p->meta[b].next) {
		if (++walked > n || seen[b] || p->meta[b].prev != prev)
			BAD("LRU list is corrupt at block %d", b);
		seen[b] = 2;
		if (p->meta[b].refs || !p->meta[b].published)
			BAD("cached block %d has %u refs / published %d", b, p->meta[b].refs,
			    p->meta[b].published);
	}
	for (int32_t b = 0; b < n; b++) {
		const struct kv_block_meta *m = &p->meta[b];
		if (m->refs)
			used++;
		if (!m->refs && m->published)
			cached++;
		if (!seen[b] && !m->refs)
			BAD("block %d is neither free, cached nor referenced (leaked)", b);
		if (m->published && table_find(p, m->hash, m->parent, p->tokens + (size_t)b * p->view.block_tokens) != b)
			BAD("published block %d is not found under its own hash", b);
	}
	for (uint32_t i = 0; i < p->table_cap; i++)
		if (p->table[i] >= 0) {
			in_table++;
			if (!p->meta[p->table[i]].published)
				BAD("hash slot %u holds unpublished block %d", i, p->table[i]);
		}
	if (used != p->n_used || cached != p->n_cached || walked != cached)
		BAD("counts: used %d (kept %d), cached %d (kept %d, listed %d)", used, p->n_used, cached,
		    p->n_cached, walked);
	for (int32_t b = 0; b < n; b++)
		in_table -= p->meta[b].published;
	if (in_table)
		BAD("hash table holds %d entries more than published blocks", in_table);
#undef BAD
	free(seen);
	return 0;
}
