/* cuda_weights.c - the CUDA backend's device copies of the model: weights
 * and norm vectors found by their host pointer (an open-addressing map that
 * uploads at the first use), and the KV pool's mirror.  Step buffers and
 * activations live in cuda_backend.c.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_private.h"
#include "quant.h"

static size_t cb_hash(const void *p, size_t cap)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
	return (size_t)(h >> 17) & (cap - 1);
}

/* The device copy of host buffer HOST (BYTES), uploaded at the first call:
 * weights live as long as the model, which outlives the engine. */
int cb_device_copy(struct cuda_backend *cb, const void *host, size_t bytes, void **ret)
{
	struct cb_map_entry *e;

	if (cb->map_cap) {
		for (size_t i = cb_hash(host, cb->map_cap);; i = (i + 1) & (cb->map_cap - 1)) {
			e = &cb->map[i];
			if (!e->host)
				break;
			if (e->host == host) {
				if (e->bytes < bytes) {
					snprintf(cb->last_err, sizeof cb->last_err,
						 "a host buffer uploaded with %zu bytes is now used with %zu",
						 e->bytes, bytes);
					return -EINVAL;
				}
				*ret = e->dev;
				return 0;
			}
		}
	}
	if (2 * (cb->map_n + 1) > cb->map_cap) {
		size_t cap = cb->map_cap ? 2 * cb->map_cap : 64;
		struct cb_map_entry *m = calloc(cap, sizeof *m);
		if (!m) {
			snprintf(cb->last_err, sizeof cb->last_err, "out of memory");
			return -ENOMEM;
		}
		for (size_t j = 0; j < cb->map_cap; j++) {
			if (!cb->map[j].host)
				continue;
			size_t i = cb_hash(cb->map[j].host, cap);
			while (m[i].host)
				i = (i + 1) & (cap - 1);
			m[i] = cb->map[j];
		}
		free(cb->map);
		cb->map = m;
		cb->map_cap = cap;
	}
	if (cb->capturing) {
		snprintf(cb->last_err, sizeof cb->last_err,
			 "internal error: a weight (%zu bytes) uploaded while a CUDA graph is being "
			 "recorded", bytes);
		return -EIO;
	}
	size_t i = cb_hash(host, cb->map_cap);
	while (cb->map[i].host)
		i = (i + 1) & (cb->map_cap - 1);
	e = &cb->map[i];
	void *dev = NULL;
	CB_CUDA(cb, cudaMalloc(&dev, bytes));
	/* on the stream: the kernels that read it come after it in order */
	cudaError_t ce = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cb->stream);
	if (ce != cudaSuccess) {
		cudaFree(dev);
		return cb_fail_cuda(cb, "cudaMemcpy(weights)", ce);
	}
	e->host = host;
	e->dev = dev;
	e->bytes = bytes;
	cb->map_n++;
	*ret = dev;
	return 0;
}

/* *DW = *W with its data on the device. */
int cb_weight(struct cuda_backend *cb, const struct bk_weight *w, struct bk_weight *dw)
{
	void *dev;
	int r = cb_device_copy(cb, w->data, (size_t)w->n_out * w->row_bytes, &dev);
	if (r < 0)
		return r;
	*dw = *w;
	dw->data = dev;
	size_t mm = cuda_matmul_scratch_bytes(dw, 1);
	if (w->type != QT_F32 && mm > cb->mm_row_bytes)
		cb->mm_row_bytes = mm;
	if ((w->type == QT_F16 || w->type == QT_BF16) && (size_t)w->n_in * 2 > cb->half_row_bytes)
		cb->half_row_bytes = (size_t)w->n_in * 2;
	return 0;
}

/* *DKV = *KV with base on the device mirror, allocated at the first call. */
int cb_kv(struct cuda_backend *cb, const struct bk_kv *kv, struct bk_kv *dkv)
{
	size_t bytes = (size_t)kv->n_blocks * kv->block_bytes;

	if (cb->kv_dev && (cb->kv_host != kv->base || cb->kv_bytes != bytes)) {
		snprintf(cb->last_err, sizeof cb->last_err,
			 "one CUDA backend serves one KV pool (mirror of %zu bytes exists)", cb->kv_bytes);
		return -EINVAL;
	}
	if (!cb->kv_dev) {
		CB_CUDA(cb, cudaMalloc(&cb->kv_dev, bytes));
		cb->kv_host = kv->base;
		cb->kv_bytes = bytes;
		cb->kv_view = *kv;
		cb->kv_view.base = cb->kv_dev;
	}
	*dkv = *kv;
	dkv->base = cb->kv_dev;
	return 0;
}

/* 1: the ops read the device copy from now on, and find it by W's host
 * pointer alone (cb_device_copy reads the host bytes only at a weight's
 * first upload).  The copy is waited for, so that the caller may release
 * the host's bytes as soon as this returns (a pageable cudaMemcpyAsync may
 * still be reading them, and the emulator's runs when the stream does). */
int cb_load_weight(struct backend *be, const struct bk_weight *w)
{
	struct cuda_backend *cb = cbk(be);
	struct bk_weight dw;
	int r = cb_weight(cb, w, &dw);

	if (r < 0)
		return r;
	CB_CUDA(cb, cudaStreamSynchronize(cb->stream));
	return 1;
}

int cb_kv_attach(struct backend *be, const struct bk_kv *kv)
{
	struct bk_kv dkv;

	return cb_kv(cbk(be), kv, &dkv);
}
