/* gguf.h - read-only, bounds-checked access to a GGUF (v2/v3) model file.
 *
 * The file is mmap'd once (or, with GGUF_OPEN_NO_MMAP, read once into
 * private memory); every count, string length, offset, alignment, tensor
 * type and shape is checked at open time, so nothing handed out here can
 * point outside the file's bytes.  Strings returned are NOT NUL-terminated
 * unless said otherwise: they point into those bytes and carry a length.
 * No logging, no exit: errors are a negative errno plus a one-line message
 * written to the caller's buffer, e.g.
 *   "tensor blk.3.attn_q.weight: data runs past end of file".
 * A struct gguf_file is immutable after open (but for gguf_release_data)
 * and may be read from any thread.
 */
#ifndef LLMD_GGUF_H
#define LLMD_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4

/* Metadata value types, numbered as in the GGUF specification. */
enum gguf_vtype {
	GGUF_T_UINT8 = 0,
	GGUF_T_INT8 = 1,
	GGUF_T_UINT16 = 2,
	GGUF_T_INT16 = 3,
	GGUF_T_UINT32 = 4,
	GGUF_T_INT32 = 5,
	GGUF_T_FLOAT32 = 6,
	GGUF_T_BOOL = 7,
	GGUF_T_STRING = 8,
	GGUF_T_ARRAY = 9,
	GGUF_T_UINT64 = 10,
	GGUF_T_INT64 = 11,
	GGUF_T_FLOAT64 = 12,
};

struct gguf_str {
	const char *ptr; /* into the file's bytes; not NUL-terminated */
	uint64_t len;    /* bytes */
};

struct gguf_kv {
	struct gguf_str key;
	uint32_t type;      /* enum gguf_vtype */
	uint32_t arr_type;  /* element type when type == GGUF_T_ARRAY */
	uint64_t arr_n;     /* element count when type == GGUF_T_ARRAY */
	const void *data;   /* scalar value / first array element, in the file's
	                       bytes (unaligned: read with memcpy) */
	struct gguf_str *strs; /* (arr_n) when arr_type == GGUF_T_STRING, or for a
	                          GGUF_T_STRING scalar one entry; owned by the file */
};

struct gguf_tensor {
	char *name;                 /* NUL-terminated copy; owned by the file */
	uint32_t n_dims;            /* 1..GGUF_MAX_DIMS */
	uint64_t ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] is the contiguous (input)
	                               dimension; unused dims are 1 */
	uint32_t type;              /* ggml type id (see kernels/quant.h) */
	uint64_t offset;            /* from the start of the data section */
	const void *data;           /* into the file's bytes, aligned to the file's alignment */
	uint64_t nbytes;            /* checked: fits inside the file */
};

/* Where a struct gguf_file's bytes live. */
enum gguf_backing {
	GGUF_BACKING_CALLER = 0,    /* the caller's buffer (gguf_open_mem) */
	GGUF_BACKING_MAP = 1,       /* a read-only mapping of the file (gguf_open): a
	                               page is read from the file when first touched
	                               (and again after the kernel drops it), so a
	                               file rewritten in place shows through, and
	                               touching a page past a truncated end raises
	                               SIGBUS */
	GGUF_BACKING_COPY = 2,      /* anonymous memory the file was read into
	                               (GGUF_OPEN_NO_MMAP): the file may then change */
};

struct gguf_file {
	uint32_t version;           /* 2 or 3 */
	uint32_t alignment;         /* general.alignment or 32 */
	uint64_t n_kv;
	struct gguf_kv *kv;         /* (n_kv) */
	uint64_t n_tensors;
	struct gguf_tensor *tensors; /* (n_tensors) */
	uint64_t data_offset;       /* file offset of the tensor data section */
	const uint8_t *base;        /* the file's bytes: see backing */
	size_t size;                /* bytes of the file */
	uint32_t backing;           /* enum gguf_backing */
	size_t map_bytes;           /* bytes of the mapping at base that gguf_close
	                               unmaps (size rounded up to whole pages); 0 for
	                               the caller's buffer */
	size_t file_bytes;          /* the leading bytes of that mapping which the file
	                               backs: map_bytes for GGUF_BACKING_MAP until
	                               gguf_release_data, else 0 */
};

/* gguf_open_flags: read the whole file into private anonymous memory
 * (pread, then made read-only) instead of mapping it, so that the file may
 * be rewritten or truncated while the result is in use. */
#define GGUF_OPEN_NO_MMAP 1u

/* Opens and validates PATH.  Returns 0 and sets *ret, or a negative errno
 * (-ENOENT, -EINVAL for a malformed file, -ENOMEM, ...) with a one-line
 * message in err (which may be NULL).  Any thread. */
int gguf_open(const char *path, struct gguf_file **ret, char *err, size_t errlen);

/* gguf_open with FLAGS (GGUF_OPEN_*; 0 is gguf_open).  With
 * GGUF_OPEN_NO_MMAP the result is the same file, key for key and byte for
 * byte, in memory of its own; a file that shrinks while it is read is -EIO. */
int gguf_open_flags(const char *path, unsigned flags, struct gguf_file **ret,
		    char *err, size_t errlen);

/* The same over a caller-owned buffer, which must outlive the result (used by
 * the fuzzer and by tests that build files in memory). */
int gguf_open_mem(const void *buf, size_t len, struct gguf_file **ret,
		  char *err, size_t errlen);

/* NULL-safe. */
void gguf_close(struct gguf_file *f);

/* For a caller whose every reader of tensor data has its own copy now (a
 * GPU backend once the weights are uploaded): the whole pages of the tensor
 * data section become inaccessible anonymous memory, giving back what they
 * held; in a mapping the file no longer backs them, so it may then change or
 * shrink under them harmlessly (file_bytes shrinks to the header's pages).
 * Metadata (keys, tensor infos) and the page the header shares with the
 * first tensor stay readable; tensor data pointers stay valid as identities,
 * but reading through them faults (SIGSEGV).  Returns 0 (also when there is
 * no whole page to release, or it was released already), -EINVAL for a
 * caller's buffer (left alone), or a negative errno from mmap.  Not while
 * any thread reads tensor data. */
int gguf_release_data(struct gguf_file *f);

/* Index of KEY (NUL-terminated) or -1. */
int64_t gguf_find_key(const struct gguf_file *f, const char *key);

/* Typed getters: 0 on success, -ENOENT if absent, -EINVAL if the stored type
 * cannot represent the value (an integer getter accepts any integer type whose
 * value fits; gguf_get_f32 accepts FLOAT32 and FLOAT64).  *ret untouched on
 * failure. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *ret);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret);

/* Array access: *ret is the kv, which must be an array (of ELEM_TYPE unless
 * ELEM_TYPE is -1).  -ENOENT / -EINVAL as above. */
int gguf_get_arr(const struct gguf_file *f, const char *key, int elem_type,
		 const struct gguf_kv **ret);

/* Tensor by name or NULL. */
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* ggml's name of a tensor type id ("Q4_K"), "unknown" for ids it lacks. */
const char *gguf_type_name(uint32_t type);

/* Name of a value type, "?" when out of range. */
const char *gguf_vtype_name(uint32_t t);

#endif
