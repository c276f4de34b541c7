/* test_kv_pool.c - the block allocator and prefix cache: block sizes per
 * KV type, references, publishing and exact-content lookups, LRU eviction
 * order, and every invariant after each of thousands of random operations. */
#include <errno.h>

#include "kv_pool.h"
#include "quant.h"
#include "testutil.h"

#define BT 4

static struct kv_pool *new_pool(int32_t n_blocks, uint64_t salt)
{
	struct kv_pool *p = NULL;
	char err[256];
	if (kv_pool_new(QT_F16, BT, 2, 8, n_blocks, salt, &p, err, sizeof err) < 0)
		fprintf(stderr, "kv_pool_new: %s\n", err);
	return p;
}

static void check_ok(const struct kv_pool *p)
{
	char err[256];
	if (kv_pool_check(p, err, sizeof err) < 0) {
		fprintf(stderr, "invariant: %s\n", err);
		test_failures++;
	}
}

static void test_alloc_and_release(void)
{
	struct kv_pool *p = new_pool(3, 1);
	int32_t a = kv_pool_alloc(p), b = kv_pool_alloc(p), c = kv_pool_alloc(p);

	CHECK(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
	CHECK_INT_EQ(kv_pool_alloc(p), -ENOSPC);
	CHECK_INT_EQ(kv_pool_n_available(p), 0);
	kv_pool_ref(p, b);
	kv_pool_unref(p, b);
	CHECK_INT_EQ(kv_pool_n_available(p), 0);
	kv_pool_unref(p, b);
	CHECK_INT_EQ(kv_pool_n_available(p), 1);
	CHECK_INT_EQ(kv_pool_alloc(p), b);
	check_ok(p);
	CHECK((size_t)p->view.block_bytes == kv_pool_block_bytes(QT_F16, BT, 2, 8));
	CHECK(p->view.block_bytes == 2 * 2 * BT * 8 * 2);
	kv_pool_free(p);
	kv_pool_free(NULL);
}

/* Bytes per block for each KV type: f32 4 and f16 2 bytes a value, q8_0
 * 34 bytes per 32 values (an f16 scale and 32 int8), rows of whole blocks. */
static void test_block_bytes(void)
{
	struct kv_pool *p = NULL;
	char err[256] = "";

	/* SmolLM2-135M: 30 layers, 3 KV heads of 64 */
	CHECK_INT_EQ(kv_pool_block_bytes(QT_F32, 16, 30, 192), 2 * 30 * 16 * 192 * 4);
	CHECK_INT_EQ(kv_pool_block_bytes(QT_F16, 16, 30, 192), 2 * 30 * 16 * 192 * 2);
	CHECK_INT_EQ(kv_pool_block_bytes(QT_Q8_0, 16, 30, 192), 2 * 30 * 16 * 6 * 34);
	CHECK_INT_EQ(kv_pool_block_bytes(QT_Q8_0, 16, 30, 192) * 64, kv_pool_block_bytes(QT_F16, 16, 30, 192) * 34);
	CHECK_INT_EQ(kv_pool_block_bytes(QT_Q8_0, 16, 30, 48), 0); /* not whole blocks */
	CHECK_INT_EQ(kv_pool_block_bytes(QT_Q4_0, 16, 30, 192), 0); /* not a KV type */
	CHECK(kv_pool_new(QT_Q8_0, BT, 2, 64, 5, 1, &p, err, sizeof err) == 0);
	if (p) {
		CHECK_INT_EQ(p->view.row_bytes, 2 * 34);
		CHECK_INT_EQ(p->view.block_bytes, 2 * 2 * BT * 2 * 34);
		CHECK_INT_EQ(p->bytes, 5 * p->view.block_bytes);
		kv_pool_free(p);
	}
	p = NULL;
	CHECK_INT_EQ(kv_pool_new(QT_Q8_0, BT, 2, 40, 5, 1, &p, err, sizeof err), -EINVAL);
	CHECK(p == NULL && strstr(err, "q8_0"));
	CHECK_INT_EQ(kv_pool_new(QT_Q4_0, BT, 2, 64, 5, 1, &p, err, sizeof err), -EINVAL);
}

static void test_publish_lookup_exact(void)
{
	struct kv_pool *p = new_pool(4, 7), *other = new_pool(4, 8);
	int32_t t1[BT] = { 1, 2, 3, 4 }, t2[BT] = { 1, 2, 3, 5 };
	int32_t a = kv_pool_alloc(p);
	uint64_t h1 = kv_pool_hash(p, KV_HASH_ROOT, t1);

	CHECK(h1 != kv_pool_hash(p, KV_HASH_ROOT, t2));
	CHECK(h1 != kv_pool_hash(p, h1, t1));
	CHECK(h1 != kv_pool_hash(other, KV_HASH_ROOT, t1)); /* the salt separates models */
	CHECK_INT_EQ(kv_pool_publish(p, a, KV_HASH_ROOT, t1), 1);
	CHECK_INT_EQ(kv_pool_publish(p, a, KV_HASH_ROOT, t1), 0);
	/* a second block with the same content is not published twice */
	int32_t dup = kv_pool_alloc(p);
	CHECK_INT_EQ(kv_pool_publish(p, dup, KV_HASH_ROOT, t1), 0);
	kv_pool_unref(p, dup);
	/* found while referenced, and after release (cached) */
	CHECK_INT_EQ(kv_pool_lookup(p, KV_HASH_ROOT, t1), a);
	CHECK_INT_EQ(kv_pool_refs(p, a), 2);
	kv_pool_unref(p, a);
	kv_pool_unref(p, a);
	CHECK_INT_EQ(p->n_cached, 1);
	CHECK_INT_EQ(kv_pool_lookup(p, KV_HASH_ROOT, t1), a);
	CHECK_INT_EQ(p->n_cached, 0);
	/* never a foreign hit: other tokens, other parent */
	CHECK_INT_EQ(kv_pool_lookup(p, KV_HASH_ROOT, t2), -ENOENT);
	CHECK_INT_EQ(kv_pool_lookup(p, h1, t1), -ENOENT);
	CHECK_INT_EQ(p->hits, 2);
	CHECK_INT_EQ(p->lookups, 4);
	check_ok(p);
	kv_pool_free(p);
	kv_pool_free(other);
}

static void test_lru_eviction(void)
{
	struct kv_pool *p = new_pool(3, 1);
	int32_t tok[3][BT] = { { 1 }, { 2 }, { 3 } }, blk[3];

	for (int i = 0; i < 3; i++) {
		blk[i] = kv_pool_alloc(p);
		kv_pool_publish(p, blk[i], KV_HASH_ROOT, tok[i]);
	}
	/* released in the order 1, 0, 2: evicted in that order */
	kv_pool_unref(p, blk[1]);
	kv_pool_unref(p, blk[0]);
	kv_pool_unref(p, blk[2]);
	CHECK_INT_EQ(kv_pool_n_available(p), 3);
	/* touching block 1 again makes it the most recently used */
	CHECK_INT_EQ(kv_pool_lookup(p, KV_HASH_ROOT, tok[1]), blk[1]);
	kv_pool_unref(p, blk[1]);
	CHECK_INT_EQ(kv_pool_alloc(p), blk[0]);
	CHECK_INT_EQ(kv_pool_lookup(p, KV_HASH_ROOT, tok[0]), -ENOENT);
	CHECK_INT_EQ(kv_pool_alloc(p), blk[2]);
	CHECK_INT_EQ(kv_pool_alloc(p), blk[1]);
	CHECK_INT_EQ(p->evictions, 3);
	check_ok(p);
	kv_pool_free(p);
}

/* Random alloc / ref / unref / publish / lookup, invariants after each. */
static void test_random_ops(void)
{
	enum { N = 24, OPS = 20000 };
	struct kv_pool *p = new_pool(N, 3);
	int32_t held[4 * N], n_held = 0;
	unsigned seed = 12345;

	for (int op = 0; op < OPS && !test_failures; op++) {
		int k = rand_r(&seed) % 5;
		int32_t tok[BT] = { rand_r(&seed) % 6, rand_r(&seed) % 2, 0, 0 };
		if (k == 0 && n_held < 4 * N) {
			int32_t b = kv_pool_alloc(p);
			if (b >= 0)
				held[n_held++] = b;
			else
				CHECK_INT_EQ(kv_pool_n_available(p), 0);
		} else if (k == 1 && n_held > 0 && n_held < 4 * N) {
			int32_t b = held[rand_r(&seed) % n_held];
			kv_pool_ref(p, b);
			held[n_held++] = b;
		} else if (k == 2 && n_held > 0) {
			int i = rand_r(&seed) % n_held;
			kv_pool_unref(p, held[i]);
			held[i] = held[--n_held];
		} else if (k == 3 && n_held > 0) {
			kv_pool_publish(p, held[rand_r(&seed) % n_held], tok[1], tok);
		} else if (k == 4 && n_held < 4 * N) {
			int32_t b = kv_pool_lookup(p, tok[1], tok);
			if (b >= 0)
				held[n_held++] = b;
		}
		check_ok(p);
	}
	while (n_held > 0)
		kv_pool_unref(p, held[--n_held]);
	CHECK_INT_EQ(p->n_used, 0);
	CHECK_INT_EQ(kv_pool_n_available(p), N);
	check_ok(p);
	kv_pool_free(p);
}

int main(void)
{
	test_alloc_and_release();
	test_block_bytes();
	test_publish_lookup_exact();
	test_lru_eviction();
	test_random_ops();
	return test_result();
}
