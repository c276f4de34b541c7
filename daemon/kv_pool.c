/* kv_pool.c - block allocator over one memfd-backed shared mapping.
 *
 * It only hands out and reclaims blocks; what a block holds is written by
 * the backend's kv_store and read by its attention.  The prefix cache and
 * eviction build on the refcounts kept here.
 */
#include "kv_pool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "quant.h"

size_t kv_pool_block_bytes(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim)
{
	size_t esize = type == QT_F16 ? 2 : 4;
	return (size_t)2 * n_layer * block_tokens * kv_dim * esize;
}

int kv_pool_new(uint32_t type, int32_t block_tokens, int32_t n_layer, int32_t kv_dim,
		int32_t n_blocks, struct kv_pool **ret, char *err, size_t errlen)
{
	struct kv_pool *p;
	size_t bb;

	if ((type != QT_F32 && type != QT_F16) || block_tokens < 1 || block_tokens > 1024 ||
	    n_layer < 1 || kv_dim < 1 || n_blocks < 1) {
		snprintf(err, errlen, "invalid KV pool geometry");
		return -EINVAL;
	}
	bb = kv_pool_block_bytes(type, block_tokens, n_layer, kv_dim);
	p = calloc(1, sizeof *p);
	if (!p)
		goto nomem;
	p->memfd = -1;
	p->view.base = MAP_FAILED;
	p->bytes = bb * (size_t)n_blocks;
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
	p->view.block_bytes = bb;
	p->free_ids = malloc((size_t)n_blocks * sizeof *p->free_ids);
	p->refs = calloc((size_t)n_blocks, sizeof *p->refs);
	if (!p->free_ids || !p->refs)
		goto nomem;
	/* Low ids on top of the stack: touched pages stay few when idle. */
	for (int32_t i = 0; i < n_blocks; i++)
		p->free_ids[i] = n_blocks - 1 - i;
	p->n_free = n_blocks;
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
	free(p->refs);
	free(p);
}

int32_t kv_pool_alloc(struct kv_pool *p)
{
	int32_t b;

	if (p->n_free == 0)
		return -ENOSPC;
	b = p->free_ids[--p->n_free];
	p->refs[b] = 1;
	return b;
}

void kv_pool_ref(struct kv_pool *p, int32_t block)
{
	p->refs[block]++;
}

void kv_pool_unref(struct kv_pool *p, int32_t block)
{
	if (p->refs[block] && --p->refs[block] == 0)
		p->free_ids[p->n_free++] = block;
}
