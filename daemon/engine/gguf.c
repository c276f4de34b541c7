/* gguf.c - opens a GGUF v2/v3 file (mapped, or read into private memory)
 * and checks every byte of its header, so that nothing in struct gguf_file
 * can point outside the file's bytes.  It does not interpret metadata
 * (model.c, tokenizer.c do) nor touch tensor data (the kernels do); it knows
 * ggml type ids only to size and place tensors.
 */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "gguf.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "values are handed out in file (little-endian) order: little-endian hosts only"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_NAME_MAX 1024   /* bytes of a tensor name; ggml itself allows 63 */
#define GGUF_SHOWN_MAX 64    /* bytes of a name quoted in an error message */
#define KV_MIN_BYTES 13      /* key length 8 + type 4 + smallest value 1 */
#define TENSOR_MIN_BYTES 33  /* name length 8 + 1 + n_dims 4 + ne 8 + type 4 + offset 8 */

/* ---- ggml tensor types ---- */

struct type_info {
	const char *name; /* ggml's name; NULL for unused or removed ids */
	uint32_t blck;    /* elements per block */
	uint32_t bytes;   /* bytes per block */
};

/* Ids 4, 5 (Q4_2, Q4_3), 31-33 and 36-38 (repacked variants) were removed
 * from ggml and are rejected, as llama.cpp does. */
static const struct type_info type_table[] = {
	[0] = { "F32", 1, 4 },          [1] = { "F16", 1, 2 },
	[2] = { "Q4_0", 32, 18 },       [3] = { "Q4_1", 32, 20 },
	[6] = { "Q5_0", 32, 22 },       [7] = { "Q5_1", 32, 24 },
	[8] = { "Q8_0", 32, 34 },       [9] = { "Q8_1", 32, 36 },
	[10] = { "Q2_K", 256, 84 },     [11] = { "Q3_K", 256, 110 },
	[12] = { "Q4_K", 256, 144 },    [13] = { "Q5_K", 256, 176 },
	[14] = { "Q6_K", 256, 210 },    [15] = { "Q8_K", 256, 292 },
	[16] = { "IQ2_XXS", 256, 66 },  [17] = { "IQ2_XS", 256, 74 },
	[18] = { "IQ3_XXS", 256, 98 },  [19] = { "IQ1_S", 256, 50 },
	[20] = { "IQ4_NL", 32, 18 },    [21] = { "IQ3_S", 256, 110 },
	[22] = { "IQ2_S", 256, 82 },    [23] = { "IQ4_XS", 256, 136 },
	[24] = { "I8", 1, 1 },          [25] = { "I16", 1, 2 },
	[26] = { "I32", 1, 4 },         [27] = { "I64", 1, 8 },
	[28] = { "F64", 1, 8 },         [29] = { "IQ1_M", 256, 56 },
	[30] = { "BF16", 1, 2 },
	[34] = { "TQ1_0", 256, 54 },    [35] = { "TQ2_0", 256, 66 },
	[39] = { "MXFP4", 32, 17 },
};

static const struct type_info *type_get(uint32_t id)
{
	if (id >= sizeof type_table / sizeof type_table[0] || !type_table[id].name)
		return NULL;
	return &type_table[id];
}

const char *gguf_type_name(uint32_t type)
{
	const struct type_info *ti = type_get(type);
	return ti ? ti->name : "unknown";
}

/* ---- metadata value types ---- */

static const char *const vtype_names[] = {
	"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
	"bool", "string", "array", "uint64", "int64", "float64",
};

/* Bytes of one value; 0 for the variable-sized string and array. */
static const uint8_t vtype_size[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

const char *gguf_vtype_name(uint32_t t)
{
	return t <= GGUF_T_FLOAT64 ? vtype_names[t] : "?";
}

/* ---- the parser: a cursor over the bytes, and the caller's error buffer ---- */

struct parser {
	const uint8_t *p;   /* next unread byte */
	const uint8_t *end; /* one past the last byte of the file */
	char *err;          /* caller's message buffer, or NULL */
	size_t errlen;      /* bytes of err */
};

static size_t left(const struct parser *ps)
{
	return (size_t)(ps->end - ps->p);
}

static int rd(struct parser *ps, void *dst, size_t n)
{
	if (left(ps) < n)
		return -1;
	memcpy(dst, ps->p, n);
	ps->p += n;
	return 0;
}

static int rd_u32(struct parser *ps, uint32_t *v) { return rd(ps, v, sizeof *v); }
static int rd_u64(struct parser *ps, uint64_t *v) { return rd(ps, v, sizeof *v); }

static int rd_str(struct parser *ps, struct gguf_str *s)
{
	uint64_t n;

	if (rd_u64(ps, &n) || n > left(ps))
		return -1;
	s->ptr = (const char *)ps->p;
	s->len = n;
	ps->p += n;
	return 0;
}

/* Copies a name from the file for a message: at most GGUF_SHOWN_MAX bytes,
 * anything unprintable as '?', so that the message stays one line. */
static void show(char dst[GGUF_SHOWN_MAX + 4], const void *name, uint64_t len)
{
	const unsigned char *s = name;
	size_t n = 0;

	for (; n < len && n < GGUF_SHOWN_MAX; n++)
		dst[n] = s[n] >= 0x20 && s[n] < 0x7f ? (char)s[n] : '?';
	strcpy(dst + n, len > GGUF_SHOWN_MAX ? "..." : "");
}

/* Writes "WHAT NAME: message" (or just the message when WHAT is NULL) and
 * returns -EINVAL. */
static int failv(struct parser *ps, const char *what, const void *name, uint64_t len,
		 const char *fmt, va_list ap)
{
	char shown[GGUF_SHOWN_MAX + 4], msg[256];

	if (!ps->err || !ps->errlen)
		return -EINVAL;
	errbuf_setv(msg, sizeof msg, fmt, ap);
	if (what) {
		show(shown, name, len);
		errbuf_set(ps->err, ps->errlen, "%s %s: %s", what, shown, msg);
	} else {
		errbuf_set(ps->err, ps->errlen, "%s", msg);
	}
	return -EINVAL;
}

__attribute__((format(printf, 2, 3)))
static int fail(struct parser *ps, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = failv(ps, NULL, NULL, 0, fmt, ap);
	va_end(ap);
	return rc;
}

__attribute__((format(printf, 3, 4)))
static int fail_key(struct parser *ps, const struct gguf_str *key, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = failv(ps, "key", key->ptr, key->len, fmt, ap);
	va_end(ap);
	return rc;
}

__attribute__((format(printf, 3, 4)))
static int fail_tensor(struct parser *ps, const struct gguf_tensor *t, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = failv(ps, "tensor", t->name, strlen(t->name), fmt, ap);
	va_end(ap);
	return rc;
}

static int fail_nomem(struct parser *ps)
{
	errbuf_set(ps->err, ps->errlen, "out of memory");
	return -ENOMEM;
}

/* ---- metadata ---- */

/* Arrays of arrays are rejected, as llama.cpp does: no model uses them and
 * struct gguf_kv could not index their variable-sized elements. */
static int parse_array(struct parser *ps, struct gguf_kv *kv)
{
	uint64_t i;

	if (rd_u32(ps, &kv->arr_type) || rd_u64(ps, &kv->arr_n))
		return fail_key(ps, &kv->key, "array header runs past end of file");
	if (kv->arr_type == GGUF_T_ARRAY)
		return fail_key(ps, &kv->key, "arrays of arrays are not supported");
	if (kv->arr_type > GGUF_T_FLOAT64)
		return fail_key(ps, &kv->key, "unknown array element type %u", kv->arr_type);
	kv->data = ps->p;
	if (kv->arr_type != GGUF_T_STRING) {
		size_t size = vtype_size[kv->arr_type];
		if (kv->arr_n > left(ps) / size)
			goto past_end;
		ps->p += kv->arr_n * size;
		return 0;
	}
	/* Each string takes at least its 8-byte length: bounds the allocation. */
	if (kv->arr_n > left(ps) / 8)
		goto past_end;
	if (kv->arr_n == 0)
		return 0;
	kv->strs = malloc(kv->arr_n * sizeof *kv->strs);
	if (!kv->strs)
		return fail_nomem(ps);
	for (i = 0; i < kv->arr_n; i++)
		if (rd_str(ps, &kv->strs[i]))
			goto past_end;
	return 0;
past_end:
	return fail_key(ps, &kv->key, "array of %llu %ss runs past end of file",
			(unsigned long long)kv->arr_n, vtype_names[kv->arr_type]);
}

/* KV->data points at the serialized value: for strings at the 8-byte length;
 * use KV->strs for their bytes. */
static int parse_kv(struct parser *ps, struct gguf_kv *kv, uint64_t i)
{
	struct gguf_str s;

	if (rd_str(ps, &kv->key))
		return fail(ps, "key #%llu: name runs past end of file", (unsigned long long)i);
	if (rd_u32(ps, &kv->type))
		return fail_key(ps, &kv->key, "type runs past end of file");
	if (kv->type > GGUF_T_FLOAT64)
		return fail_key(ps, &kv->key, "unknown value type %u", kv->type);
	if (kv->type == GGUF_T_ARRAY)
		return parse_array(ps, kv);
	kv->data = ps->p;
	if (kv->type == GGUF_T_STRING) {
		if (rd_str(ps, &s))
			return fail_key(ps, &kv->key, "string value runs past end of file");
		kv->strs = malloc(sizeof *kv->strs);
		if (!kv->strs)
			return fail_nomem(ps);
		*kv->strs = s;
		return 0;
	}
	if (left(ps) < vtype_size[kv->type])
		return fail_key(ps, &kv->key, "%s value runs past end of file",
				vtype_names[kv->type]);
	ps->p += vtype_size[kv->type];
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	const struct gguf_str *x = a, *y = b;
	int c = memcmp(x->ptr, y->ptr, x->len < y->len ? x->len : y->len);

	return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Sorts NAMES (a scratch copy) and reports the first name found twice. */
static int check_unique(struct parser *ps, struct gguf_str *names, uint64_t n,
			const char *what)
{
	char shown[GGUF_SHOWN_MAX + 4];
	uint64_t i;

	qsort(names, n, sizeof *names, cmp_str);
	for (i = 1; i < n; i++) {
		if (cmp_str(&names[i - 1], &names[i]) == 0) {
			show(shown, names[i].ptr, names[i].len);
			return fail(ps, "duplicate %s %s", what, shown);
		}
	}
	return 0;
}

static int check_unique_keys(struct parser *ps, const struct gguf_file *f)
{
	struct gguf_str *names;
	uint64_t i;
	int rc;

	if (f->n_kv < 2)
		return 0;
	names = malloc(f->n_kv * sizeof *names);
	if (!names)
		return fail_nomem(ps);
	for (i = 0; i < f->n_kv; i++)
		names[i] = f->kv[i].key;
	rc = check_unique(ps, names, f->n_kv, "key");
	free(names);
	return rc;
}

static int check_unique_tensors(struct parser *ps, const struct gguf_file *f)
{
	struct gguf_str *names;
	uint64_t i;
	int rc;

	if (f->n_tensors < 2)
		return 0;
	names = malloc(f->n_tensors * sizeof *names);
	if (!names)
		return fail_nomem(ps);
	for (i = 0; i < f->n_tensors; i++)
		names[i] = (struct gguf_str){ f->tensors[i].name, strlen(f->tensors[i].name) };
	rc = check_unique(ps, names, f->n_tensors, "tensor name");
	free(names);
	return rc;
}

/* general.alignment may be of any integer type whose value fits in 32 bits
 * (writers use UINT32; llama.cpp insists on it). */
static int read_alignment(struct parser *ps, struct gguf_file *f)
{
	uint32_t a = GGUF_DEFAULT_ALIGNMENT;

	if (gguf_get_u32(f, "general.alignment", &a) == -EINVAL)
		return fail(ps, "key general.alignment: not an unsigned 32-bit integer");
	if (a == 0 || (a & (a - 1)) != 0)
		return fail(ps, "key general.alignment: %u is not a nonzero power of two", a);
	f->alignment = a;
	return 0;
}

/* ---- tensor infos ---- */

/* Reads one tensor info and checks what does not depend on the data section's
 * position: name, shape, type, size and offset alignment. */
static int parse_tensor(struct parser *ps, const struct gguf_file *f,
			struct gguf_tensor *t, uint64_t i)
{
	const struct type_info *ti;
	struct gguf_str name;
	uint64_t nel = 1;
	uint32_t d;

	if (rd_u64(ps, &name.len))
		return fail(ps, "tensor #%llu: name runs past end of file", (unsigned long long)i);
	if (name.len == 0)
		return fail(ps, "tensor #%llu: empty name", (unsigned long long)i);
	if (name.len > GGUF_NAME_MAX)
		return fail(ps, "tensor #%llu: name of %llu bytes is too long (max %d)",
			    (unsigned long long)i, (unsigned long long)name.len, GGUF_NAME_MAX);
	if (name.len > left(ps))
		return fail(ps, "tensor #%llu: name runs past end of file", (unsigned long long)i);
	name.ptr = (const char *)ps->p;
	ps->p += name.len;
	if (memchr(name.ptr, 0, name.len))
		return fail(ps, "tensor #%llu: name contains a NUL byte", (unsigned long long)i);
	t->name = malloc(name.len + 1);
	if (!t->name)
		return fail_nomem(ps);
	memcpy(t->name, name.ptr, name.len);
	t->name[name.len] = '\0';

	if (rd_u32(ps, &t->n_dims))
		return fail_tensor(ps, t, "info runs past end of file");
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
		return fail_tensor(ps, t, "n_dims %u is not in 1..%d", t->n_dims, GGUF_MAX_DIMS);
	for (d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (d = 0; d < t->n_dims; d++) {
		if (rd_u64(ps, &t->ne[d]))
			return fail_tensor(ps, t, "info runs past end of file");
		if (t->ne[d] == 0)
			return fail_tensor(ps, t, "ne[%u] is 0", d);
		if (t->ne[d] > INT64_MAX || __builtin_mul_overflow(nel, t->ne[d], &nel) ||
		    nel > INT64_MAX)
			return fail_tensor(ps, t, "element count overflows");
	}
	if (rd_u32(ps, &t->type) || rd_u64(ps, &t->offset))
		return fail_tensor(ps, t, "info runs past end of file");

	ti = type_get(t->type);
	if (!ti)
		return fail_tensor(ps, t, "unknown type id %u", t->type);
	if (t->ne[0] % ti->blck)
		return fail_tensor(ps, t, "ne[0] = %llu is not a multiple of the %s block size %u",
				   (unsigned long long)t->ne[0], ti->name, ti->blck);
	if (__builtin_mul_overflow(nel / ti->blck, (uint64_t)ti->bytes, &t->nbytes))
		return fail_tensor(ps, t, "size overflows");
	if (t->offset % f->alignment)
		return fail_tensor(ps, t, "offset %llu is not a multiple of the alignment %u",
				   (unsigned long long)t->offset, f->alignment);
	return 0;
}

static int place_tensor(struct parser *ps, const struct gguf_file *f, struct gguf_tensor *t)
{
	uint64_t room = f->size > f->data_offset ? f->size - f->data_offset : 0;

	if (t->offset > room || t->nbytes > room - t->offset)
		return fail_tensor(ps, t, "data runs past end of file");
	t->data = f->base + f->data_offset + t->offset;
	return 0;
}

/* ---- the whole file ---- */

static int parse(struct parser *ps, struct gguf_file *f)
{
	uint64_t i, n_kv, n_tensors, pos;
	int rc;

	if (left(ps) < 4)
		return fail(ps, "not a GGUF file (too short)");
	if (memcmp(ps->p, "GGUF", 4) != 0)
		return fail(ps, "not a GGUF file (bad magic)");
	ps->p += 4;
	if (rd_u32(ps, &f->version))
		return fail(ps, "truncated GGUF header");
	if (f->version != 2 && f->version != 3) {
		uint32_t swapped = __builtin_bswap32(f->version);
		if (swapped >= 1 && swapped <= 3)
			return fail(ps, "big-endian GGUF files are not supported");
		return fail(ps, "GGUF version %u is not supported", f->version);
	}
	if (rd_u64(ps, &n_tensors) || rd_u64(ps, &n_kv))
		return fail(ps, "truncated GGUF header");

	if (n_kv > left(ps) / KV_MIN_BYTES)
		return fail(ps, "header claims %llu metadata keys, more than the file can hold",
			    (unsigned long long)n_kv);
	if (n_kv) {
		f->kv = calloc(n_kv, sizeof *f->kv);
		if (!f->kv)
			return fail_nomem(ps);
	}
	f->n_kv = n_kv;
	for (i = 0; i < n_kv; i++)
		if ((rc = parse_kv(ps, &f->kv[i], i)) < 0)
			return rc;
	if ((rc = check_unique_keys(ps, f)) < 0 || (rc = read_alignment(ps, f)) < 0)
		return rc;

	if (n_tensors > left(ps) / TENSOR_MIN_BYTES)
		return fail(ps, "header claims %llu tensors, more than the file can hold",
			    (unsigned long long)n_tensors);
	if (n_tensors) {
		f->tensors = calloc(n_tensors, sizeof *f->tensors);
		if (!f->tensors)
			return fail_nomem(ps);
	}
	f->n_tensors = n_tensors;
	for (i = 0; i < n_tensors; i++)
		if ((rc = parse_tensor(ps, f, &f->tensors[i], i)) < 0)
			return rc;
	if ((rc = check_unique_tensors(ps, f)) < 0)
		return rc;

	/* The data section starts at the next multiple of the alignment; a file
	 * without tensors may end before it. */
	pos = (uint64_t)(ps->p - f->base);
	f->data_offset = (pos + f->alignment - 1) / f->alignment * f->alignment;
	for (i = 0; i < n_tensors; i++)
		if ((rc = place_tensor(ps, f, &f->tensors[i])) < 0)
			return rc;
	return 0;
}

/* Takes BUF (unmapping its MAP_BYTES on failure when not 0). */
static int open_common(const void *buf, size_t len, uint32_t backing, size_t map_bytes,
		       struct gguf_file **ret, char *err, size_t errlen)
{
	struct parser ps = { .p = buf, .end = (const uint8_t *)buf + len,
			     .err = err, .errlen = errlen };
	struct gguf_file *f;
	int rc;

	f = calloc(1, sizeof *f);
	if (!f) {
		if (map_bytes)
			munmap((void *)buf, map_bytes);
		return fail_nomem(&ps);
	}
	f->base = buf;
	f->size = len;
	f->backing = backing;
	f->map_bytes = map_bytes;
	f->file_bytes = backing == GGUF_BACKING_MAP ? map_bytes : 0;
	rc = parse(&ps, f);
	if (rc < 0) {
		gguf_close(f);
		return rc;
	}
	*ret = f;
	return 0;
}

int gguf_open_mem(const void *buf, size_t len, struct gguf_file **ret,
		  char *err, size_t errlen)
{
	if (!buf) {
		if (len) {
			errbuf_set(err, errlen, "NULL buffer");
			return -EINVAL;
		}
		buf = "";
	}
	return open_common(buf, len, GGUF_BACKING_CALLER, 0, ret, err, errlen);
}

/* Message "WHAT: strerror(errno)" (glibc's and musl's %m is thread-safe). */
static int sys_fail(char *err, size_t errlen, const char *what)
{
	int e = errno;

	errbuf_set(err, errlen, "%s: %m", what);
	return -e;
}

static size_t page_bytes(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (size_t)p : 4096;
}

/* SIZE bytes of FD into fresh anonymous memory of MAP_BYTES, made
 * read-only; *RET is the memory, to be munmap'd. */
static int read_private(int fd, size_t size, size_t map_bytes, void **ret, char *err,
			size_t errlen)
{
	const size_t chunk = (size_t)1 << 30; /* under Linux's 2 GiB cap per read */
	uint8_t *p;
	size_t off = 0;
	int rc;

	p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		errbuf_set(err, errlen, "cannot allocate %zu bytes to read the file into: %m",
			   size);
		return -ENOMEM;
	}
	while (off < size) {
		ssize_t n = pread(fd, p + off, size - off < chunk ? size - off : chunk, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sys_fail(err, errlen, "read");
			goto fail;
		}
		if (n == 0) {
			rc = -EIO;
			errbuf_set(err, errlen, "read: the file shrank from %zu to %zu bytes "
				   "while it was read", size, off);
			goto fail;
		}
		off += (size_t)n;
	}
	/* Immutable from now on, as a mapping of the file would be. */
	if (mprotect(p, map_bytes, PROT_READ) != 0) {
		rc = sys_fail(err, errlen, "mprotect");
		goto fail;
	}
	*ret = p;
	return 0;
fail:
	munmap(p, map_bytes);
	return rc;
}

int gguf_open(const char *path, struct gguf_file **ret, char *err, size_t errlen)
{
	return gguf_open_flags(path, 0, ret, err, errlen);
}

int gguf_open_flags(const char *path, unsigned flags, struct gguf_file **ret,
		    char *err, size_t errlen)
{
	const size_t page = page_bytes();
	struct stat st;
	size_t size, map_bytes;
	void *map = NULL;
	int fd, rc;

	if (flags & ~GGUF_OPEN_NO_MMAP) {
		errbuf_set(err, errlen, "unknown open flags %#x", flags);
		return -EINVAL;
	}
	/* O_NONBLOCK: a FIFO given by mistake must not hang the daemon. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return sys_fail(err, errlen, "open");
	if (fstat(fd, &st) != 0) {
		rc = sys_fail(err, errlen, "fstat");
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		errno = EISDIR;
		rc = sys_fail(err, errlen, "open");
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		errbuf_set(err, errlen, "not a regular file");
		goto fail;
	}
	if (st.st_size < 4) {
		/* mmap cannot map 0 bytes; the parser words the error. */
		close(fd);
		return gguf_open_mem("", 0, ret, err, errlen);
	}
	if ((uint64_t)st.st_size > SIZE_MAX - page) {
		errno = EFBIG;
		rc = sys_fail(err, errlen, "mmap");
		goto fail;
	}
	size = (size_t)st.st_size;
	map_bytes = (size + page - 1) / page * page;
	if (flags & GGUF_OPEN_NO_MMAP) {
		if ((rc = read_private(fd, size, map_bytes, &map, err, errlen)) < 0)
			goto fail;
		close(fd);
		return open_common(map, size, GGUF_BACKING_COPY, map_bytes, ret, err, errlen);
	}
	map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = sys_fail(err, errlen, "mmap");
		goto fail;
	}
	close(fd);
	return open_common(map, size, GGUF_BACKING_MAP, map_bytes, ret, err, errlen);
fail:
	close(fd);
	return rc;
}

void gguf_close(struct gguf_file *f)
{
	uint64_t i;

	if (!f)
		return;
	for (i = 0; f->kv && i < f->n_kv; i++)
		free(f->kv[i].strs);
	free(f->kv);
	for (i = 0; f->tensors && i < f->n_tensors; i++)
		free(f->tensors[i].name);
	free(f->tensors);
	if (f->map_bytes)
		munmap((void *)f->base, f->map_bytes);
	free(f);
}

int gguf_release_data(struct gguf_file *f)
{
	const size_t page = page_bytes();
	size_t lo;

	if (!f->map_bytes)
		return -EINVAL;
	/* From the first whole page of tensor data to the mapping's end; a
	 * file without tensors may say its data starts past its end. */
	if (f->data_offset > f->map_bytes - 1)
		return 0;
	lo = ((size_t)f->data_offset + page - 1) / page * page;
	if (lo >= f->map_bytes)
		return 0;
	/* MAP_FIXED replaces those pages in one step and keeps the addresses
	 * reserved (the mapping stays one range for gguf_close, and no other
	 * allocation can land where the weights' pointers point). */
	if (mmap((void *)(f->base + lo), f->map_bytes - lo, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
		return -errno;
	if (f->file_bytes > lo)
		f->file_bytes = lo;
	return 0;
}

/* ---- lookups ---- */

int64_t gguf_find_key(const struct gguf_file *f, const char *key)
{
	size_t n;
	uint64_t i;

	if (!f || !key)
		return -1;
	n = strlen(key);
	for (i = 0; i < f->n_kv; i++)
		if (f->kv[i].key.len == n && memcmp(f->kv[i].key.ptr, key, n) == 0)
			return (int64_t)i;
	return -1;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	uint64_t i;

	if (!f || !name)
		return NULL;
	for (i = 0; i < f->n_tensors; i++)
		if (strcmp(f->tensors[i].name, name) == 0)
			return &f->tensors[i];
	return NULL;
}

static const struct gguf_kv *kv_get(const struct gguf_file *f, const char *key)
{
	int64_t i = gguf_find_key(f, key);

	return i < 0 ? NULL : &f->kv[i];
}

/* Reads an integer value: *neg = 1 and the value in *s when it is negative,
 * else *neg = 0 and the value in *u.  -EINVAL for a non-integer type. */
static int kv_int(const struct gguf_kv *kv, int *neg, int64_t *s, uint64_t *u)
{
	int64_t sv = 0;
	uint64_t uv = 0;

	switch (kv->type) {
	case GGUF_T_UINT8: { uint8_t v; memcpy(&v, kv->data, sizeof v); uv = v; break; }
	case GGUF_T_UINT16: { uint16_t v; memcpy(&v, kv->data, sizeof v); uv = v; break; }
	case GGUF_T_UINT32: { uint32_t v; memcpy(&v, kv->data, sizeof v); uv = v; break; }
	case GGUF_T_UINT64: { memcpy(&uv, kv->data, sizeof uv); break; }
	case GGUF_T_INT8: { int8_t v; memcpy(&v, kv->data, sizeof v); sv = v; break; }
	case GGUF_T_INT16: { int16_t v; memcpy(&v, kv->data, sizeof v); sv = v; break; }
	case GGUF_T_INT32: { int32_t v; memcpy(&v, kv->data, sizeof v); sv = v; break; }
	case GGUF_T_INT64: { memcpy(&sv, kv->data, sizeof sv); break; }
	default:
		return -EINVAL;
	}
	*neg = sv < 0;
	*s = sv;
	*u = sv > 0 ? (uint64_t)sv : uv;
	return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	int64_t s;
	uint64_t u;
	int neg;

	if (!kv)
		return -ENOENT;
	if (kv_int(kv, &neg, &s, &u) || neg || u > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)u;
	return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	int64_t s;
	uint64_t u;
	int neg;

	if (!kv)
		return -ENOENT;
	if (kv_int(kv, &neg, &s, &u) || (!neg && u > INT64_MAX))
		return -EINVAL;
	*ret = neg ? s : (int64_t)u;
	return 0;
}

/* A finite FLOAT64 beyond float's range is -EINVAL; infinities and NaN pass. */
int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	double d;
	float x;

	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_T_FLOAT32) {
		memcpy(&x, kv->data, sizeof x);
	} else if (kv->type == GGUF_T_FLOAT64) {
		memcpy(&d, kv->data, sizeof d);
		if (d > FLT_MAX && !isinf(d))
			return -EINVAL;
		if (d < -FLT_MAX && !isinf(d))
			return -EINVAL;
		x = (float)d;
	} else {
		return -EINVAL;
	}
	*ret = x;
	return 0;
}

/* Only BOOL; any nonzero byte is true (llama.cpp does not check either). */
int gguf_get_bool(const struct gguf_file *f, const char *key, int *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);
	uint8_t b;

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_T_BOOL)
		return -EINVAL;
	memcpy(&b, kv->data, 1);
	*ret = b != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret)
{
	const struct gguf_kv *kv = kv_get(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_T_STRING)
		return -EINVAL;
	*ret = kv->strs[0];
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, int elem_type,
		 const struct gguf_kv **ret)
{
	const struct gguf_kv *kv = kv_get(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_T_ARRAY || (elem_type != -1 && (uint32_t)elem_type != kv->arr_type))
		return -EINVAL;
	*ret = kv;
	return 0;
}
