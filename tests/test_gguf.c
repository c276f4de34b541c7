/* test_gguf.c - the GGUF loader: real model files load with the metadata and
 * tensor placement the model README documents, a small file built here loads
 * as v2 and v3, and each kind of corruption fails with its own message; a
 * file read into private memory (GGUF_OPEN_NO_MMAP) is the mapped one byte
 * for byte and outlives the file's truncation; gguf_release_data leaves the
 * metadata readable and the file free to shrink.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "testutil.h"

/* ---- a tiny GGUF writer ---- */

struct buf {
	uint8_t *p; /* bytes written */
	size_t n;   /* bytes used */
	size_t cap; /* bytes allocated */
};

static void put(struct buf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}

static void put_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }

static void put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void put_key(struct buf *b, const char *key, uint32_t type)
{
	put_str(b, key);
	put_u32(b, type);
}

static void patch_u32(struct buf *b, size_t off, uint32_t v) { memcpy(b->p + off, &v, 4); }
static void patch_u64(struct buf *b, size_t off, uint64_t v) { memcpy(b->p + off, &v, 8); }

#define SMALL_N_KV 18
#define SMALL_N_T 4

/* The small test file and where its interesting fields lie. */
struct small {
	struct buf b;
	uint32_t align;               /* general.alignment written */
	size_t off_version;           /* byte offsets into b.p */
	size_t off_n_tensors, off_n_kv;
	size_t off_key0_len;          /* length of the first key */
	size_t off_arch_len;          /* length of the general.architecture value */
	size_t off_align_type, off_align_val;
	size_t off_u8_type;           /* type of test.u8 */
	size_t off_i8_name;           /* bytes of the key "test.i8" */
	size_t off_tok_n;             /* element count of tokenizer.ggml.tokens */
	size_t off_au8_type, off_au8_n; /* element type / count of test.arr_u8 */
	size_t off_af32_n;            /* element count of test.arr_f32 */
	size_t off_t_name[SMALL_N_T]; /* name length of each tensor info */
	size_t off_t_ndims[SMALL_N_T];
	size_t off_t_ne[SMALL_N_T];   /* ne[0]; ne[d] is 8 * d further */
	size_t off_t_type[SMALL_N_T];
	size_t off_t_off[SMALL_N_T];
	uint64_t t_off[SMALL_N_T];    /* offsets written */
	size_t data_offset;           /* where the data section starts */
};

static const char *const small_names[SMALL_N_T] = { "tok.weight", "out.weight", "blk.0.k4", "norm" };
static const uint32_t small_types[SMALL_N_T] = { 0 /* F32 */, 8 /* Q8_0 */, 12 /* Q4_K */, 1 /* F16 */ };
static const uint32_t small_ndims[SMALL_N_T] = { 2, 2, 4, 1 };
static const uint64_t small_ne[SMALL_N_T][4] = { { 8, 2, 1, 1 }, { 64, 2, 1, 1 }, { 256, 1, 1, 2 }, { 3, 1, 1, 1 } };
static const uint64_t small_nbytes[SMALL_N_T] = { 64, 2 * 2 * 34, 2 * 144, 6 };

static uint64_t pad(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Builds a valid file whose last tensor ends exactly at end of file, so that
 * every truncation must fail. */
static void small_build(struct small *s, uint32_t version, uint32_t align)
{
	static const char *const toks[] = { "<unk>", "<s>", "\xc3\xa9", "" };
	struct buf *b = &s->b;
	uint64_t off = 0;
	float f;
	double d;
	int i;

	memset(s, 0, sizeof *s);
	s->align = align;
	put(b, "GGUF", 4);
	s->off_version = b->n;
	put_u32(b, version);
	s->off_n_tensors = b->n;
	put_u64(b, SMALL_N_T);
	s->off_n_kv = b->n;
	put_u64(b, SMALL_N_KV);

	s->off_key0_len = b->n;
	put_key(b, "general.architecture", GGUF_T_STRING);
	s->off_arch_len = b->n;
	put_str(b, "llama");
	put_str(b, "general.alignment");
	s->off_align_type = b->n;
	put_u32(b, GGUF_T_UINT32);
	s->off_align_val = b->n;
	put_u32(b, align);
	put_str(b, "test.u8");
	s->off_u8_type = b->n;
	put_u32(b, GGUF_T_UINT8);
	put_u8(b, 200);
	s->off_i8_name = b->n + 8;
	put_key(b, "test.i8", GGUF_T_INT8);
	put_u8(b, (uint8_t)-5);
	put_key(b, "test.u16", GGUF_T_UINT16);
	put(b, &(uint16_t){ 65535 }, 2);
	put_key(b, "test.i16", GGUF_T_INT16);
	put(b, &(int16_t){ -300 }, 2);
	put_key(b, "test.u32", GGUF_T_UINT32);
	put_u32(b, 4000000000u);
	put_key(b, "test.i32", GGUF_T_INT32);
	put_u32(b, (uint32_t)-7);
	put_key(b, "test.f32", GGUF_T_FLOAT32);
	f = 1.5f;
	put(b, &f, 4);
	put_key(b, "test.bool", GGUF_T_BOOL);
	put_u8(b, 1);
	put_key(b, "test.u64", GGUF_T_UINT64);
	put_u64(b, 1ull << 40);
	put_key(b, "test.i64", GGUF_T_INT64);
	put_u64(b, (uint64_t)-(1ll << 40));
	put_key(b, "test.f64", GGUF_T_FLOAT64);
	d = 0.25;
	put(b, &d, 8);
	put_key(b, "test.f64big", GGUF_T_FLOAT64);
	d = 1e300;
	put(b, &d, 8);
	put_key(b, "tokenizer.ggml.tokens", GGUF_T_ARRAY);
	put_u32(b, GGUF_T_STRING);
	s->off_tok_n = b->n;
	put_u64(b, 4);
	for (i = 0; i < 4; i++)
		put_str(b, toks[i]);
	put_key(b, "test.arr_u8", GGUF_T_ARRAY);
	s->off_au8_type = b->n;
	put_u32(b, GGUF_T_UINT8);
	s->off_au8_n = b->n;
	put_u64(b, 3);
	put(b, "\x01\x02\x03", 3);
	put_key(b, "test.arr_f32", GGUF_T_ARRAY);
	put_u32(b, GGUF_T_FLOAT32);
	s->off_af32_n = b->n;
	put_u64(b, 2);
	put(b, (float[]){ 0.5f, -1.0f }, 8);
	put_key(b, "test.empty", GGUF_T_ARRAY);
	put_u32(b, GGUF_T_INT32);
	put_u64(b, 0);

	for (i = 0; i < SMALL_N_T; i++) {
		s->off_t_name[i] = b->n;
		put_str(b, small_names[i]);
		s->off_t_ndims[i] = b->n;
		put_u32(b, small_ndims[i]);
		s->off_t_ne[i] = b->n;
		for (uint32_t dd = 0; dd < small_ndims[i]; dd++)
			put_u64(b, small_ne[i][dd]);
		s->off_t_type[i] = b->n;
		put_u32(b, small_types[i]);
		s->off_t_off[i] = b->n;
		s->t_off[i] = off;
		put_u64(b, off);
		off = pad(off + small_nbytes[i], align);
	}
	while (b->n % align)
		put_u8(b, 0);
	s->data_offset = b->n;
	for (i = 0; i < SMALL_N_T; i++) {
		while (b->n < s->data_offset + s->t_off[i])
			put_u8(b, 0);
		for (uint64_t k = 0; k < small_nbytes[i]; k++)
			put_u8(b, (uint8_t)(i * 31 + k));
	}
}

/* ---- the small file loads and its getters convert as documented ---- */

static void test_small_loads(uint32_t version, uint32_t align)
{
	struct gguf_file *f = NULL;
	const struct gguf_kv *kv;
	struct gguf_str str;
	struct small s;
	char err[256] = "";
	uint32_t u32;
	int64_t i64;
	float x;
	int b, i;

	small_build(&s, version, align);
	CHECK_INT_EQ(gguf_open_mem(s.b.p, s.b.n, &f, err, sizeof err), 0);
	if (!f) {
		fprintf(stderr, "small v%u: %s\n", version, err);
		free(s.b.p);
		return;
	}
	CHECK_INT_EQ(f->version, version);
	CHECK_INT_EQ(f->alignment, align);
	CHECK_INT_EQ(f->n_kv, SMALL_N_KV);
	CHECK_INT_EQ(f->n_tensors, SMALL_N_T);
	CHECK_INT_EQ(f->data_offset, s.data_offset);
	CHECK(f->base == s.b.p && f->size == s.b.n && f->backing == GGUF_BACKING_CALLER &&
	      f->map_bytes == 0 && f->file_bytes == 0);
	CHECK_INT_EQ(gguf_release_data(f), -EINVAL); /* the caller's buffer: left alone */

	CHECK_INT_EQ(gguf_get_u32(f, "test.u8", &u32), 0);
	CHECK_INT_EQ(u32, 200);
	CHECK_INT_EQ(gguf_get_u32(f, "test.u16", &u32), 0);
	CHECK_INT_EQ(u32, 65535);
	CHECK_INT_EQ(gguf_get_u32(f, "test.u32", &u32), 0);
	CHECK_INT_EQ(u32, 4000000000u);
	u32 = 12345;
	CHECK_INT_EQ(gguf_get_u32(f, "test.i8", &u32), -EINVAL);    /* negative */
	CHECK_INT_EQ(gguf_get_u32(f, "test.u64", &u32), -EINVAL);   /* too big */
	CHECK_INT_EQ(gguf_get_u32(f, "test.f32", &u32), -EINVAL);   /* not an integer */
	CHECK_INT_EQ(gguf_get_u32(f, "test.bool", &u32), -EINVAL);
	CHECK_INT_EQ(gguf_get_u32(f, "no.such.key", &u32), -ENOENT);
	CHECK_INT_EQ(u32, 12345);                                   /* untouched */
	CHECK_INT_EQ(gguf_get_i64(f, "test.i8", &i64), 0);
	CHECK_INT_EQ(i64, -5);
	CHECK_INT_EQ(gguf_get_i64(f, "test.i16", &i64), 0);
	CHECK_INT_EQ(i64, -300);
	CHECK_INT_EQ(gguf_get_i64(f, "test.i32", &i64), 0);
	CHECK_INT_EQ(i64, -7);
	CHECK_INT_EQ(gguf_get_i64(f, "test.i64", &i64), 0);
	CHECK_INT_EQ(i64, -(1ll << 40));
	CHECK_INT_EQ(gguf_get_i64(f, "test.u64", &i64), 0);
	CHECK_INT_EQ(i64, 1ll << 40);
	CHECK_INT_EQ(gguf_get_i64(f, "test.u32", &i64), 0);
	CHECK_INT_EQ(i64, 4000000000ll);
	CHECK_INT_EQ(gguf_get_i64(f, "general.architecture", &i64), -EINVAL);
	CHECK_INT_EQ(gguf_get_f32(f, "test.f32", &x), 0);
	CHECK(x == 1.5f);
	CHECK_INT_EQ(gguf_get_f32(f, "test.f64", &x), 0);
	CHECK(x == 0.25f);
	CHECK_INT_EQ(gguf_get_f32(f, "test.f64big", &x), -EINVAL);
	CHECK_INT_EQ(gguf_get_f32(f, "test.u8", &x), -EINVAL);
	CHECK_INT_EQ(gguf_get_bool(f, "test.bool", &b), 0);
	CHECK_INT_EQ(b, 1);
	CHECK_INT_EQ(gguf_get_bool(f, "test.u8", &b), -EINVAL);
	CHECK_INT_EQ(gguf_get_str(f, "general.architecture", &str), 0);
	CHECK(str.len == 5 && memcmp(str.ptr, "llama", 5) == 0);
	CHECK_INT_EQ(gguf_get_str(f, "test.u8", &str), -EINVAL);
	CHECK_INT_EQ(gguf_get_str(f, "test", &str), -ENOENT);  /* a prefix is not a key */

	kv = NULL;
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &kv), 0);
	if (kv) {
		CHECK_INT_EQ(kv->arr_n, 4);
		CHECK(kv->strs[1].len == 3 && memcmp(kv->strs[1].ptr, "<s>", 3) == 0);
		CHECK(kv->strs[2].len == 2 && memcmp(kv->strs[2].ptr, "\xc3\xa9", 2) == 0);
		CHECK_INT_EQ(kv->strs[3].len, 0);
	}
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_INT32, &kv), -EINVAL);
	CHECK_INT_EQ(gguf_get_arr(f, "test.u8", -1, &kv), -EINVAL);
	CHECK_INT_EQ(gguf_get_arr(f, "test.arr_u8", -1, &kv), 0);
	CHECK(kv->arr_type == GGUF_T_UINT8 && kv->arr_n == 3 && memcmp(kv->data, "\1\2\3", 3) == 0);
	CHECK_INT_EQ(gguf_get_arr(f, "test.arr_f32", GGUF_T_FLOAT32, &kv), 0);
	memcpy(&x, (const char *)kv->data + 4, 4);
	CHECK(x == -1.0f);
	CHECK_INT_EQ(gguf_get_arr(f, "test.empty", GGUF_T_INT32, &kv), 0);
	CHECK_INT_EQ(kv->arr_n, 0);

	for (i = 0; i < SMALL_N_T; i++) {
		const struct gguf_tensor *t = gguf_find_tensor(f, small_names[i]);
		CHECK(t != NULL);
		if (!t)
			continue;
		CHECK_INT_EQ(t->type, small_types[i]);
		CHECK_INT_EQ(t->n_dims, small_ndims[i]);
		for (int d = 0; d < GGUF_MAX_DIMS; d++)
			CHECK_INT_EQ(t->ne[d], small_ne[i][d]);
		CHECK_INT_EQ(t->offset, s.t_off[i]);
		CHECK_INT_EQ(t->nbytes, small_nbytes[i]);
		CHECK(t->data == f->base + f->data_offset + t->offset);
		CHECK_INT_EQ(((const uint8_t *)t->data)[1], (uint8_t)(i * 31 + 1));
	}
	CHECK(gguf_find_tensor(f, "tok") == NULL);
	CHECK(gguf_find_tensor(f, NULL) == NULL);
	CHECK_INT_EQ(gguf_find_key(f, NULL), -1);
	CHECK_INT_EQ(gguf_find_key(NULL, "test.u8"), -1);
	CHECK_STR_EQ(gguf_vtype_name(GGUF_T_STRING), "string");
	CHECK_STR_EQ(gguf_vtype_name(13), "?");
	gguf_close(f);
	free(s.b.p);
}

/* ---- each corruption fails with its own message ---- */

/* Opens N bytes of P from an exact-size copy (so ASan sees any over-read)
 * and checks for -EINVAL and a one-line message containing WANT. */
static void expect_fail_at(int line, const uint8_t *p, size_t n, const char *want)
{
	struct gguf_file *f = (struct gguf_file *)&f; /* must stay untouched */
	uint8_t *copy = malloc(n ? n : 1);
	char err[256] = "";
	int rc;

	memcpy(copy, p, n);
	rc = gguf_open_mem(copy, n, &f, err, sizeof err);
	if (rc != -EINVAL || !strstr(err, want) || strchr(err, '\n') ||
	    f != (struct gguf_file *)&f) {
		fprintf(stderr, "test_gguf.c:%d: rc %d, error \"%s\", expected -EINVAL and \"%s\"\n",
			line, rc, err, want);
		test_failures++;
		if (rc == 0 && f != (struct gguf_file *)&f)
			gguf_close(f);
	}
	free(copy);
}
#define expect_fail(p, n, want) expect_fail_at(__LINE__, p, n, want)

/* Builds a fresh small file, lets PATCH change it, and expects WANT. */
#define corrupt(patch, want) do { \
	struct small c_; \
	small_build(&c_, 3, 32); \
	{ struct small *s = &c_; patch; } \
	expect_fail_at(__LINE__, c_.b.p, c_.b.n, want); \
	free(c_.b.p); \
} while (0)

static void test_corruptions(void)
{
	corrupt(s->b.p[0] = 'X', "not a GGUF file (bad magic)");
	corrupt(patch_u32(&s->b, s->off_version, 1), "GGUF version 1 is not supported");
	corrupt(patch_u32(&s->b, s->off_version, 4), "GGUF version 4 is not supported");
	corrupt(patch_u32(&s->b, s->off_version, 0x03000000), "big-endian GGUF files are not supported");
	expect_fail((const uint8_t *)"GG", 2, "not a GGUF file (too short)");
	expect_fail((const uint8_t *)"GGUF\3\0\0\0\1\0", 10, "truncated GGUF header");

	/* huge lengths and counts */
	corrupt(patch_u64(&s->b, s->off_key0_len, UINT64_MAX), "key #0: name runs past end of file");
	corrupt(patch_u64(&s->b, s->off_arch_len, 1ull << 62),
		"key general.architecture: string value runs past end of file");
	corrupt(patch_u64(&s->b, s->off_n_kv, UINT64_MAX),
		"header claims 18446744073709551615 metadata keys, more than the file can hold");
	corrupt(patch_u64(&s->b, s->off_n_tensors, 1ull << 40),
		"header claims 1099511627776 tensors, more than the file can hold");
	corrupt(patch_u64(&s->b, s->off_n_tensors, SMALL_N_T + 1), "tensor #4: "); /* data read as an info */
	corrupt(patch_u64(&s->b, s->off_n_kv, SMALL_N_KV + 1), ""); /* a tensor info read as a key */
	corrupt(patch_u64(&s->b, s->off_tok_n, 49152),
		"key tokenizer.ggml.tokens: array of 49152 strings runs past end of file");
	corrupt(patch_u64(&s->b, s->off_tok_n, UINT64_MAX),
		"key tokenizer.ggml.tokens: array of 18446744073709551615 strings runs past end of file");
	corrupt(patch_u64(&s->b, s->off_au8_n, UINT64_MAX),
		"key test.arr_u8: array of 18446744073709551615 uint8s runs past end of file");
	corrupt(patch_u64(&s->b, s->off_af32_n, 1ull << 62), /* 2^62 * 4 wraps to 0 */
		"key test.arr_f32: array of 4611686018427387904 float32s runs past end of file");

	/* types */
	corrupt(patch_u32(&s->b, s->off_u8_type, 13), "key test.u8: unknown value type 13");
	corrupt(patch_u32(&s->b, s->off_au8_type, GGUF_T_ARRAY),
		"key test.arr_u8: arrays of arrays are not supported");
	corrupt(patch_u32(&s->b, s->off_au8_type, 99), "key test.arr_u8: unknown array element type 99");
	corrupt(memcpy(s->b.p + s->off_i8_name, "test.u8", 7), "duplicate key test.u8");

	/* alignment */
	corrupt(patch_u32(&s->b, s->off_align_val, 0),
		"key general.alignment: 0 is not a nonzero power of two");
	corrupt(patch_u32(&s->b, s->off_align_val, 48),
		"key general.alignment: 48 is not a nonzero power of two");
	corrupt(patch_u32(&s->b, s->off_align_type, GGUF_T_FLOAT32),
		"key general.alignment: not an unsigned 32-bit integer");
	corrupt(patch_u64(&s->b, s->off_t_off[1], s->t_off[1] + 4),
		"tensor out.weight: offset 68 is not a multiple of the alignment 32");

	/* tensor infos */
	corrupt(patch_u32(&s->b, s->off_t_ndims[0], 0), "tensor tok.weight: n_dims 0 is not in 1..4");
	corrupt(patch_u32(&s->b, s->off_t_ndims[0], 5), "tensor tok.weight: n_dims 5 is not in 1..4");
	corrupt(patch_u64(&s->b, s->off_t_ne[0] + 8, 0), "tensor tok.weight: ne[1] is 0");
	corrupt(patch_u64(&s->b, s->off_t_ne[0], 1ull << 63), "tensor tok.weight: element count overflows");
	corrupt((patch_u64(&s->b, s->off_t_ne[0], 1ull << 62), patch_u64(&s->b, s->off_t_ne[0] + 8, 4)),
		"tensor tok.weight: element count overflows");
	corrupt(patch_u64(&s->b, s->off_t_ne[0], 1ull << 61), "tensor tok.weight: size overflows");
	corrupt(patch_u32(&s->b, s->off_t_type[0], 4), "tensor tok.weight: unknown type id 4");
	corrupt(patch_u32(&s->b, s->off_t_type[0], 1000), "tensor tok.weight: unknown type id 1000");
	corrupt(patch_u64(&s->b, s->off_t_ne[1], 33),
		"tensor out.weight: ne[0] = 33 is not a multiple of the Q8_0 block size 32");
	corrupt(memcpy(s->b.p + s->off_t_name[1] + 8, "tok.weight", 10), "duplicate tensor name tok.weight");
	corrupt(s->b.p[s->off_t_name[0] + 8 + 3] = 0, "tensor #0: name contains a NUL byte");
	corrupt(patch_u64(&s->b, s->off_t_name[0], 0), "tensor #0: empty name");
	corrupt(patch_u64(&s->b, s->off_t_name[0], 2000), "tensor #0: name of 2000 bytes is too long");
	corrupt((s->b.p[s->off_t_name[0] + 8 + 3] = '\n', patch_u32(&s->b, s->off_t_type[0], 4)),
		"tensor tok?weight: unknown type id 4");

	/* data placement */
	corrupt(s->b.n--, "tensor norm: data runs past end of file");
	corrupt(patch_u64(&s->b, s->off_t_off[3], s->t_off[3] + 32), "tensor norm: data runs past end of file");
	corrupt(patch_u64(&s->b, s->off_t_off[3], 0xffffffffffffffe0ull), "tensor norm: data runs past end of file");
}

/* Every prefix of a valid file fails cleanly, and no single-byte change
 * crashes (under ASan/valgrind) or yields anything but 0 or -EINVAL. */
static void test_truncations_and_flips(void)
{
	struct small s;
	size_t n, i;
	int bad = 0;

	small_build(&s, 3, 32);
	for (n = 0; n < s.b.n; n++)
		expect_fail(s.b.p, n, "");
	for (i = 0; i < s.data_offset; i++) {
		static const uint8_t vals[] = { 0x00, 0x01, 0x09, 0x80, 0xff };
		for (size_t v = 0; v < sizeof vals; v++) {
			struct gguf_file *f = NULL;
			uint8_t *copy = malloc(s.b.n);
			char err[128] = "";
			int rc;

			memcpy(copy, s.b.p, s.b.n);
			copy[i] = vals[v];
			rc = gguf_open_mem(copy, s.b.n, &f, err, sizeof err);
			if ((rc != 0 && rc != -EINVAL) || (rc && (!err[0] || strchr(err, '\n'))))
				bad++;
			gguf_close(f);
			free(copy);
		}
	}
	CHECK_INT_EQ(bad, 0);
	free(s.b.p);
}

/* ---- gguf_open on paths ---- */

static void test_open_paths(void)
{
	char path[] = "/tmp/test_gguf.XXXXXX";
	struct gguf_file *f = NULL;
	char err[256] = "";
	struct small s;
	int fd;

	CHECK_INT_EQ(gguf_open("/nonexistent/x.gguf", &f, err, sizeof err), -ENOENT);
	CHECK(strstr(err, "No such file") != NULL);
	CHECK_INT_EQ(gguf_open("/tmp", &f, err, sizeof err), -EISDIR);
	CHECK_INT_EQ(gguf_open("/dev/null", &f, err, sizeof err), -EINVAL);
	CHECK(strstr(err, "not a regular file") != NULL);
	CHECK(f == NULL);

	fd = mkostemp(path, O_CLOEXEC);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK_INT_EQ(gguf_open(path, &f, err, sizeof err), -EINVAL); /* empty */
	CHECK(strstr(err, "too short") != NULL);
	small_build(&s, 2, 64);
	CHECK_INT_EQ(write(fd, s.b.p, s.b.n), (long long)s.b.n);
	close(fd);
	CHECK_INT_EQ(gguf_open(path, &f, NULL, 0), 0);
	if (f) {
		const struct gguf_tensor *t = gguf_find_tensor(f, "norm");
		CHECK(f->backing == GGUF_BACKING_MAP && f->version == 2 && f->alignment == 64 && t);
		CHECK(f->map_bytes >= f->size && f->file_bytes == f->map_bytes);
		CHECK(t && memcmp(t->data, s.b.p + s.data_offset + s.t_off[3], 6) == 0);
		CHECK_INT_EQ((uintptr_t)t->data % 64, 0);
	}
	gguf_close(f);
	gguf_close(NULL);
	unlink(path);
	free(s.b.p);
}

/* ---- gguf_open_flags(GGUF_OPEN_NO_MMAP): a private copy ---- */

/* A and B hold the same file: keys, tensors and every byte. */
static void check_same_file(const struct gguf_file *a, const struct gguf_file *b)
{
	CHECK(a->size == b->size && memcmp(a->base, b->base, a->size) == 0);
	CHECK_INT_EQ(a->version, b->version);
	CHECK_INT_EQ(a->alignment, b->alignment);
	CHECK_INT_EQ(a->data_offset, b->data_offset);
	CHECK_INT_EQ(a->n_kv, b->n_kv);
	CHECK_INT_EQ(a->n_tensors, b->n_tensors);
	for (uint64_t i = 0; i < a->n_kv && i < b->n_kv; i++) {
		const struct gguf_kv *x = &a->kv[i], *y = &b->kv[i];
		CHECK(x->key.len == y->key.len && memcmp(x->key.ptr, y->key.ptr, x->key.len) == 0);
		CHECK(x->type == y->type && x->arr_type == y->arr_type && x->arr_n == y->arr_n);
		CHECK((const uint8_t *)x->data - a->base == (const uint8_t *)y->data - b->base);
	}
	for (uint64_t i = 0; i < a->n_tensors && i < b->n_tensors; i++) {
		const struct gguf_tensor *x = &a->tensors[i], *y = &b->tensors[i];
		CHECK_STR_EQ(x->name, y->name);
		CHECK(x->type == y->type && x->n_dims == y->n_dims && x->offset == y->offset &&
		      x->nbytes == y->nbytes && memcmp(x->ne, y->ne, sizeof x->ne) == 0);
		CHECK((const uint8_t *)x->data - a->base == (const uint8_t *)y->data - b->base);
		CHECK(memcmp(x->data, y->data, x->nbytes) == 0);
	}
}

/* The small file, then stories260K when present: the private copy is the
 * mapped file key for key and byte for byte, read-only, and stays whole
 * when the file is truncated under it. */
static void test_no_mmap(void)
{
	const char *real = test_model_path("stories260K.gguf");
	struct gguf_file *a = NULL, *b = NULL;
	char path[64], err[256] = "";
	struct small s;
	int fd;

	snprintf(path, sizeof path, "/tmp/test_gguf.XXXXXX");
	fd = mkostemp(path, O_CLOEXEC);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	small_build(&s, 3, 32);
	CHECK_INT_EQ(write(fd, s.b.p, s.b.n), (long long)s.b.n);
	close(fd);
	CHECK_INT_EQ(gguf_open_flags(path, GGUF_OPEN_NO_MMAP, &b, err, sizeof err), 0);
	CHECK_INT_EQ(gguf_open_flags(path, 0, &a, err, sizeof err), 0);
	CHECK_INT_EQ(gguf_open_flags(path, 0x80, &a, err, sizeof err), -EINVAL);
	if (a && b) {
		CHECK(b->backing == GGUF_BACKING_COPY && b->map_bytes >= b->size && b->file_bytes == 0);
		check_same_file(a, b);
	}
	gguf_close(a);
	gguf_close(b);
	a = b = NULL;
	unlink(path);
	free(s.b.p);

	if (!real) {
		fprintf(stderr, "stories260K.gguf absent: skipping its private copy\n");
		return;
	}
	CHECK_INT_EQ(test_copy_to_tmp(real, path, sizeof path), 0);
	CHECK_INT_EQ(gguf_open(path, &a, err, sizeof err), 0);
	CHECK_INT_EQ(gguf_open_flags(path, GGUF_OPEN_NO_MMAP, &b, err, sizeof err), 0);
	if (a && b) {
		check_same_file(a, b);
		/* the mapping is left before the file is cut: it would fault */
		gguf_close(a);
		a = NULL;
		CHECK_INT_EQ(truncate(path, 0), 0);
		const struct gguf_tensor *t = gguf_find_tensor(b, "blk.4.ffn_norm.weight");
		CHECK(t && (const uint8_t *)t->data + t->nbytes == b->base + b->size);
		uint8_t sum = 0; /* the last page, past the file's new end: still there */
		for (uint64_t i = 0; t && i < t->nbytes; i++)
			sum ^= ((const uint8_t *)t->data)[i];
		(void)sum;
		CHECK_INT_EQ(test_file_size(path), 0);
	}
	gguf_close(a);
	gguf_close(b);
	unlink(path);
}

/* gguf_release_data on a mapped stories260K: the file then backs only the
 * header's pages, the metadata still reads, and the file may be cut. */
static void test_release_data(void)
{
	const char *real = test_model_path("stories260K.gguf");
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct gguf_file *f = NULL;
	const struct gguf_kv *kv = NULL;
	struct gguf_str str;
	char path[64], err[256] = "";

	if (!real) {
		fprintf(stderr, "stories260K.gguf absent: skipping gguf_release_data\n");
		return;
	}
	CHECK_INT_EQ(test_copy_to_tmp(real, path, sizeof path), 0);
	CHECK_INT_EQ(gguf_open(path, &f, err, sizeof err), 0);
	if (f) {
		CHECK_INT_EQ(f->file_bytes, (f->size + page - 1) / page * page);
		CHECK_INT_EQ(gguf_release_data(f), 0);
		CHECK_INT_EQ(f->file_bytes, (f->data_offset + page - 1) / page * page);
		CHECK_INT_EQ(gguf_release_data(f), 0); /* again: nothing more */
		CHECK_INT_EQ(truncate(path, (off_t)f->file_bytes), 0);
		CHECK(gguf_get_str(f, "general.architecture", &str) == 0 && str.len == 5 &&
		      memcmp(str.ptr, "llama", 5) == 0);
		CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &kv), 0);
		CHECK(kv && kv->arr_n == 512 && kv->strs[511].len > 0);
		CHECK(gguf_find_tensor(f, "blk.4.ffn_norm.weight") != NULL);
	}
	gguf_close(f);
	unlink(path);
}

/* ---- real model files ---- */

static int str_is(struct gguf_str s, const char *want)
{
	return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static struct gguf_file *open_real(const char *path)
{
	struct gguf_file *f = NULL;
	char err[256] = "";

	if (gguf_open(path, &f, err, sizeof err) != 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return NULL;
	}
	return f;
}

/* Values from ../shared/models/README.md. */
static int test_stories260k(void)
{
	const char *path = test_model_path("stories260K.gguf");
	const struct gguf_tensor *t;
	const struct gguf_kv *kv = NULL;
	struct gguf_file *f;
	struct gguf_str str;
	uint32_t u32 = 0;
	int64_t i64 = 0;
	float eps = 0;

	if (!path) {
		fprintf(stderr, "stories260K.gguf absent: skipping its checks\n");
		return 0;
	}
	f = open_real(path);
	if (!f)
		return 1;
	CHECK_INT_EQ(f->version, 3);
	CHECK_INT_EQ(f->n_tensors, 48);
	CHECK_INT_EQ(f->n_kv, 19);
	CHECK_INT_EQ(f->alignment, 32);
	CHECK_INT_EQ(f->data_offset, 14176);
	CHECK_INT_EQ(f->size, 1185376);
	CHECK(gguf_get_str(f, "general.architecture", &str) == 0 && str_is(str, "llama"));
	CHECK_INT_EQ(gguf_get_u32(f, "llama.embedding_length", &u32), 0);
	CHECK_INT_EQ(u32, 64);
	CHECK_INT_EQ(gguf_get_u32(f, "llama.block_count", &u32), 0);
	CHECK_INT_EQ(u32, 5);
	CHECK_INT_EQ(gguf_get_u32(f, "tokenizer.ggml.padding_token_id", &u32), 0);
	CHECK_INT_EQ(u32, 4294967295u);
	CHECK_INT_EQ(gguf_get_i64(f, "tokenizer.ggml.padding_token_id", &i64), 0);
	CHECK_INT_EQ(i64, 4294967295ll);
	CHECK(gguf_find_key(f, "tokenizer.ggml.seperator_token_id") >= 0);
	CHECK_INT_EQ(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
	CHECK(eps > 0.99e-5f && eps < 1.01e-5f);
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &kv), 0);
	if (kv) {
		CHECK_INT_EQ(kv->arr_n, 512);
		CHECK(str_is(kv->strs[1], "<s>"));
		CHECK(str_is(kv->strs[2], "</s>"));
	}
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_FLOAT32, &kv), 0);
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32, &kv), 0);
	CHECK_INT_EQ(kv->arr_n, 512);

	t = gguf_find_tensor(f, "blk.3.attn_q.weight");
	CHECK(t != NULL);
	if (t) {
		CHECK_INT_EQ(t->type, 0);
		CHECK_INT_EQ(t->n_dims, 2);
		CHECK(t->ne[0] == 64 && t->ne[1] == 64 && t->ne[2] == 1 && t->ne[3] == 1);
		CHECK_INT_EQ(t->offset, 821856 - 14176);
		CHECK_INT_EQ(t->nbytes, 16384);
		CHECK(t->data == f->base + 821856);
	}
	t = gguf_find_tensor(f, "blk.4.ffn_norm.weight");
	CHECK(t && t->n_dims == 1 && t->ne[0] == 64 &&
	      (const uint8_t *)t->data + t->nbytes == f->base + f->size);
	gguf_close(f);
	return 0;
}

static void test_derived(void)
{
	static const struct { const char *name; uint32_t type; uint64_t data_offset; } files[] = {
		{ "derived/TinyStories-656K-f32.gguf", 0, 50272 },
		{ "derived/TinyStories-656K-q8_0.gguf", 8, 50336 },
		{ "derived/TinyStories-656K-q4_0.gguf", 2, 50336 },
	};

	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		const char *path = test_model_path(files[i].name);
		const struct gguf_tensor *t;
		struct gguf_file *f;

		if (!path) {
			fprintf(stderr, "%s absent: skipping\n", files[i].name);
			continue;
		}
		f = open_real(path);
		if (!f)
			continue;
		CHECK_INT_EQ(f->n_tensors, 20);
		CHECK_INT_EQ(f->data_offset, files[i].data_offset);
		t = gguf_find_tensor(f, "token_embd.weight");
		CHECK(t && t->type == files[i].type && t->ne[0] == 128 && t->ne[1] == 2048);
		t = gguf_find_tensor(f, "output_norm.weight");
		CHECK(t && t->type == 0);
		gguf_close(f);
	}
}

static void test_smollm2(void)
{
	const char *path = test_smollm2_path();
	const struct gguf_tensor *t;
	const struct gguf_kv *kv = NULL;
	struct gguf_file *f;

	if (!path) {
		fprintf(stderr, "SmolLM2 model absent (LLMD_SMOLLM2): skipping its checks\n");
		return;
	}
	f = open_real(path);
	if (!f)
		return;
	CHECK_INT_EQ(f->n_tensors, 272);
	t = gguf_find_tensor(f, "token_embd.weight");
	CHECK(t && t->type == 8 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &kv), 0);
	CHECK(kv && kv->arr_n == 48900);
	CHECK_INT_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &kv), 0);
	CHECK(kv && kv->arr_n == 49152);
	gguf_close(f);
}

int main(void)
{
	test_small_loads(3, 32);
	test_small_loads(2, 32);
	test_small_loads(3, 64);
	test_small_loads(2, 8);
	test_corruptions();
	test_truncations_and_flips();
	test_open_paths();
	test_no_mmap();
	test_release_data();
	test_stories260k();
	test_derived();
	test_smollm2();
	return test_result();
}
