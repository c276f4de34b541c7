/* fuzz_gguf.c - libFuzzer target for the GGUF loader: opens the input as a
 * file in memory and, when it loads, walks everything it hands out.  Not a
 * test by itself: fuzz_replay_main.c runs it over the seed corpus in `make
 * check`, tests/fuzz/run-fuzz.sh runs it under libFuzzer.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks an invariant the loader promises; a failure is a finding. */
#define ASSERT(c) do { if (!(c)) abort(); } while (0)

static int inside(const struct gguf_file *f, const void *p, uint64_t n)
{
	const uint8_t *q = p;

	return q >= f->base && q <= f->base + f->size && n <= (uint64_t)(f->base + f->size - q);
}

/* Bytes of one value of each fixed-size type. */
static const uint8_t vsize[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

/* Reads every byte a kv points at, through the typed getters as well. */
static unsigned walk_kv(const struct gguf_file *f, const struct gguf_kv *kv)
{
	char key[128];
	const struct gguf_kv *arr;
	struct gguf_str str;
	unsigned sum = 0;
	uint32_t u32;
	int64_t i64;
	float x;
	int b;

	ASSERT(inside(f, kv->key.ptr, kv->key.len));
	if (kv->type == GGUF_T_ARRAY) {
		ASSERT(kv->arr_type <= GGUF_T_FLOAT64 && kv->arr_type != GGUF_T_ARRAY);
		if (kv->arr_type == GGUF_T_STRING) {
			for (uint64_t i = 0; i < kv->arr_n; i++) {
				ASSERT(inside(f, kv->strs[i].ptr, kv->strs[i].len));
				if (kv->strs[i].len)
					sum += (uint8_t)kv->strs[i].ptr[kv->strs[i].len - 1];
			}
		} else if (kv->arr_n) {
			ASSERT(inside(f, kv->data, kv->arr_n * vsize[kv->arr_type]));
			sum += ((const uint8_t *)kv->data)[0];
		}
	} else if (kv->type == GGUF_T_STRING) {
		ASSERT(inside(f, kv->strs[0].ptr, kv->strs[0].len));
	} else {
		ASSERT(inside(f, kv->data, 1));
	}

	/* Look it up by name when the name can be a C string. */
	if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, kv->key.len))
		return sum;
	memcpy(key, kv->key.ptr, kv->key.len);
	key[kv->key.len] = '\0';
	ASSERT(gguf_find_key(f, key) == kv - f->kv);
	sum += gguf_get_u32(f, key, &u32) == 0 ? u32 : 0;
	sum += gguf_get_i64(f, key, &i64) == 0 ? (unsigned)i64 : 0;
	sum += gguf_get_f32(f, key, &x) == 0 ? (x == x) : 0;
	sum += gguf_get_bool(f, key, &b) == 0 ? (unsigned)b : 0;
	sum += gguf_get_str(f, key, &str) == 0 ? (unsigned)str.len : 0;
	ASSERT(gguf_get_arr(f, key, -1, &arr) == (kv->type == GGUF_T_ARRAY ? 0 : -EINVAL));
	sum += gguf_vtype_name(kv->type)[0];
	return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f = NULL;
	volatile unsigned sink = 0;
	char err[160];

	err[0] = '\0';
	if (gguf_open_mem(data, size, &f, err, sizeof err) != 0) {
		/* Failure is fine; a failure without a one-line reason is not. */
		ASSERT(f == NULL && err[0] && !strchr(err, '\n'));
		return 0;
	}
	ASSERT(f->version == 2 || f->version == 3);
	ASSERT(f->alignment && !(f->alignment & (f->alignment - 1)));
	ASSERT(f->data_offset % f->alignment == 0);
	for (uint64_t i = 0; i < f->n_kv; i++)
		sink += walk_kv(f, &f->kv[i]);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		ASSERT(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && t->nbytes > 0);
		ASSERT(inside(f, t->data, t->nbytes));
		ASSERT(gguf_find_tensor(f, t->name) == t);
		sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
	}
	ASSERT(gguf_find_key(f, "") < 0 || f->kv[gguf_find_key(f, "")].key.len == 0);
	ASSERT(gguf_find_tensor(f, "") == NULL);
	(void)sink;
	gguf_close(f);
	return 0;
}
