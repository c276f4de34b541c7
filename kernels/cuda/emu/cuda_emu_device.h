/* cuda_emu_device.h - what a kernel's source sees when the emulator compiles
 * it as C++: qualifiers, built-in variables, barriers, warp collectives,
 * atomics, intrinsics and the launch.  Included by the stand-in
 * cuda_runtime.h; not meant to be included on its own.
 *
 * Each CUDA thread is a fiber; a block's fibers run on one OS thread and
 * switch only inside barriers and warp collectives, so a kernel never sees
 * real parallelism, only every interleaving the thread order allows.
 * Intrinsics take the call site as hidden default arguments, which the
 * deadlock report prints.  __CUDA_ARCH__ stays undefined: code with an
 * architecture-specific branch takes its portable one here.
 */
#ifndef LLMD_CUDA_EMU_DEVICE_H
#define LLMD_CUDA_EMU_DEVICE_H

#ifndef __cplusplus
#error "cuda_emu_device.h is C++ only"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define CUDA_EMU 1

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __grid_constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Blocks run one after another on the launching thread, so a block's
 * __shared__ variables can be plain statics: one instance, reused by each
 * block in turn, and under ASan every array has redzones of its own.  The
 * cost: `static __shared__` does not compile, and a block must not expect
 * zeroed shared memory (it never can on a GPU either). */
#define __shared__ static
/* (__noinline__ is left alone: libstdc++ spells GCC's attribute that way.) */

/* ---- built-in variables, read through the running fiber ---- */
namespace cuda_emu {
/* What one CUDA thread reads as threadIdx and friends: set up by the
 * scheduler before its block starts, constant while the block runs. */
struct thread_view {
	uint3 thread_idx;
	uint3 block_idx;
	dim3 block_dim;
	dim3 grid_dim;
};
} // namespace cuda_emu

/* The running fiber's view; NULL outside kernels.  Read with a relaxed
 * atomic load so that TSan sees no race on it (it is a plain load). */
extern __thread const cuda_emu::thread_view *cuda_emu_self;
static inline const cuda_emu::thread_view *cuda_emu_view()
{
	return __atomic_load_n(&cuda_emu_self, __ATOMIC_RELAXED);
}
#define threadIdx (cuda_emu_view()->thread_idx)
#define blockIdx (cuda_emu_view()->block_idx)
#define blockDim (cuda_emu_view()->block_dim)
#define gridDim (cuda_emu_view()->grid_dim)
/* Not a constant expression, as on the device. */
extern const int warpSize;

/* ---- the scheduler's entry points (emu.cc) ---- */
namespace cuda_emu {
enum coll_kind {
	COLL_SHFL_IDX,
	COLL_SHFL_UP,
	COLL_SHFL_DOWN,
	COLL_SHFL_XOR,
	COLL_BALLOT,
	COLL_ANY,
	COLL_ALL,
	COLL_SYNCWARP,
	COLL_MATCH_ANY,
	COLL_MATCH_ALL,
	COLL_REDUCE_ADD,
	COLL_REDUCE_MIN_U,
	COLL_REDUCE_MAX_U,
	COLL_REDUCE_MIN_I,
	COLL_REDUCE_MAX_I,
	COLL_REDUCE_AND,
	COLL_REDUCE_OR,
	COLL_REDUCE_XOR,
	COLL_N_KINDS,
};
enum bar_kind { BAR_SYNC, BAR_COUNT, BAR_AND, BAR_OR };

/* Blocks the calling lane until every lane of MASK in its warp that has not
 * exited has arrived at the same collective (for a shuffle, every lane of
 * MASK: one that exited is a deadlock), then returns this lane's result,
 * computed for all lanes at once when the last one arrives.  VALUE holds
 * SIZE bytes. */
unsigned long long warp_collective(int kind, unsigned mask, unsigned long long value,
	int size, int arg, int width, const char *file, int line);
/* Blocks until every live thread of the block has arrived; returns the
 * count/and/or of PRED over them for the BAR_COUNT/AND/OR kinds. */
int block_barrier(int kind, int pred, const char *file, int line);
/* Lanes of the caller's warp that have not exited. */
unsigned active_mask();
/* Ends the launch with cudaErrorLaunchFailure (sticky). */
[[noreturn]] void trap(const char *file, int line);
/* Whether [P, P + N) lies inside one live cudaMalloc allocation
 * (cuda_emu_is_device_range, without the API lock the launch holds). */
bool device_range(const void *p, size_t n);
/* This launch's dynamic shared memory: exactly the bytes it asked for. */
void *dyn_shared();
long long clock_ticks();

template <typename T>
static inline T shfl(int kind, unsigned mask, T var, int arg, int width, const char *file, int line)
{
	static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
		"warp shuffles move values of at most 8 bytes");
	unsigned long long bits = 0;
	memcpy(&bits, &var, sizeof var);
	bits = warp_collective(kind, mask, bits, (int)sizeof var, arg, width, file, line);
	T r = var;
	memcpy(&r, &bits, sizeof r);
	return r;
}
} // namespace cuda_emu

/* ---- barriers ---- */
static inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cuda_emu::block_barrier(cuda_emu::BAR_SYNC, 1, file, line);
}
static inline int __syncthreads_count(int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return cuda_emu::block_barrier(cuda_emu::BAR_COUNT, pred, file, line);
}
static inline int __syncthreads_and(int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return cuda_emu::block_barrier(cuda_emu::BAR_AND, pred, file, line);
}
static inline int __syncthreads_or(int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return cuda_emu::block_barrier(cuda_emu::BAR_OR, pred, file, line);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	cuda_emu::warp_collective(cuda_emu::COLL_SYNCWARP, mask, 0, 0, 0, 0, file, line);
}
/* Fences order nothing more here: a block's threads never run at once,
 * nor do two blocks (the scheduler orders them for TSan).  TSan has no
 * fences of its own: under it a fence releases and then acquires one
 * process-wide sync object, so that what a thread did before its fence
 * happens before what any thread does after a later fence.  That is the
 * handoff a fence makes on a GPU together with the flag or counter it
 * publishes (the last warp or block to arrive reading what the others
 * wrote); a fence without such a flag would go unreported. */
#ifdef __SANITIZE_THREAD__
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
inline char cuda_emu_fence_sync;
#define EMU_FENCE()                                    \
	do {                                           \
		__asm__ __volatile__("" ::: "memory"); \
		__tsan_release(&cuda_emu_fence_sync);  \
		__tsan_acquire(&cuda_emu_fence_sync);  \
	} while (0)
#else
#define EMU_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#endif
static inline void __threadfence_block() { EMU_FENCE(); }
static inline void __threadfence() { EMU_FENCE(); }
static inline void __threadfence_system() { EMU_FENCE(); }

/* ---- warp collectives (CUDA's semantics, PTX shfl.sync's lane rules) ---- */
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize,
	const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	return cuda_emu::shfl(cuda_emu::COLL_SHFL_IDX, mask, var, srcLane, width, file, line);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
	const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	return cuda_emu::shfl(cuda_emu::COLL_SHFL_UP, mask, var, (int)delta, width, file, line);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,
	const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	return cuda_emu::shfl(cuda_emu::COLL_SHFL_DOWN, mask, var, (int)delta, width, file, line);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
	const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	return cuda_emu::shfl(cuda_emu::COLL_SHFL_XOR, mask, var, laneMask, width, file, line);
}
static inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return (unsigned)cuda_emu::warp_collective(cuda_emu::COLL_BALLOT, mask, pred != 0, 4, 0, 0,
		file, line);
}
static inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return (int)cuda_emu::warp_collective(cuda_emu::COLL_ANY, mask, pred != 0, 4, 0, 0, file, line);
}
static inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	return (int)cuda_emu::warp_collective(cuda_emu::COLL_ALL, mask, pred != 0, 4, 0, 0, file, line);
}
template <typename T>
static inline unsigned __match_any_sync(unsigned mask, T value, const char *file = __builtin_FILE(),
	int line = __builtin_LINE())
{
	static_assert(std::is_integral<T>::value || std::is_floating_point<T>::value, "match value");
	unsigned long long bits = 0;
	memcpy(&bits, &value, sizeof value);
	return (unsigned)cuda_emu::warp_collective(cuda_emu::COLL_MATCH_ANY, mask, bits,
		(int)sizeof value, 0, 0, file, line);
}
template <typename T>
static inline unsigned __match_all_sync(unsigned mask, T value, int *pred,
	const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	static_assert(std::is_integral<T>::value || std::is_floating_point<T>::value, "match value");
	unsigned long long bits = 0;
	memcpy(&bits, &value, sizeof value);
	unsigned long long r = cuda_emu::warp_collective(cuda_emu::COLL_MATCH_ALL, mask, bits,
		(int)sizeof value, 0, 0, file, line);
	*pred = (int)(r >> 32);
	return (unsigned)r;
}
#define CUDA_EMU_REDUCE(name, T, kind) \
	static inline T name(unsigned mask, T value, const char *file = __builtin_FILE(), \
		int line = __builtin_LINE()) \
	{ \
		return (T)cuda_emu::warp_collective(cuda_emu::kind, mask, (unsigned)value, 4, 0, 0, \
			file, line); \
	}
CUDA_EMU_REDUCE(__reduce_add_sync, unsigned, COLL_REDUCE_ADD)
CUDA_EMU_REDUCE(__reduce_add_sync, int, COLL_REDUCE_ADD)
CUDA_EMU_REDUCE(__reduce_min_sync, unsigned, COLL_REDUCE_MIN_U)
CUDA_EMU_REDUCE(__reduce_min_sync, int, COLL_REDUCE_MIN_I)
CUDA_EMU_REDUCE(__reduce_max_sync, unsigned, COLL_REDUCE_MAX_U)
CUDA_EMU_REDUCE(__reduce_max_sync, int, COLL_REDUCE_MAX_I)
CUDA_EMU_REDUCE(__reduce_and_sync, unsigned, COLL_REDUCE_AND)
CUDA_EMU_REDUCE(__reduce_or_sync, unsigned, COLL_REDUCE_OR)
CUDA_EMU_REDUCE(__reduce_xor_sync, unsigned, COLL_REDUCE_XOR)
#undef CUDA_EMU_REDUCE
/* The lanes of the warp that have not exited: the emulator has no notion of
 * convergence, so do not use it to pick a collective's mask. */
static inline unsigned __activemask() { return cuda_emu::active_mask(); }

/* ---- atomics: relaxed, as CUDA's; real atomics so that TSan accepts them ---- */
#define CUDA_EMU_ATOMIC_INT(T) \
	static inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); } \
	static inline T atomicCAS(T *a, T expected, T desired) \
	{ \
		__atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, \
			__ATOMIC_RELAXED); \
		return expected; \
	} \
	static inline T atomicMax(T *a, T v) \
	{ \
		T old = __atomic_load_n(a, __ATOMIC_RELAXED); \
		while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, \
			__ATOMIC_RELAXED)) {} \
		return old; \
	} \
	static inline T atomicMin(T *a, T v) \
	{ \
		T old = __atomic_load_n(a, __ATOMIC_RELAXED); \
		while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, \
			__ATOMIC_RELAXED)) {} \
		return old; \
	}
CUDA_EMU_ATOMIC_INT(int)
CUDA_EMU_ATOMIC_INT(unsigned int)
CUDA_EMU_ATOMIC_INT(unsigned long long)
#undef CUDA_EMU_ATOMIC_INT
static inline long long atomicMax(long long *a, long long v)
{
	long long old = __atomic_load_n(a, __ATOMIC_RELAXED);
	while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,
		__ATOMIC_RELAXED)) {}
	return old;
}
static inline long long atomicMin(long long *a, long long v)
{
	long long old = __atomic_load_n(a, __ATOMIC_RELAXED);
	while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,
		__ATOMIC_RELAXED)) {}
	return old;
}
static inline unsigned short atomicCAS(unsigned short *a, unsigned short expected,
	unsigned short desired)
{
	__atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
	return expected;
}
/* ((old >= limit) ? 0 : old + 1), and its decrementing twin. */
static inline unsigned atomicInc(unsigned *a, unsigned limit)
{
	unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(a, &old, old >= limit ? 0 : old + 1, true,
		__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
	return old;
}
static inline unsigned atomicDec(unsigned *a, unsigned limit)
{
	unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(a, &old, (old == 0 || old > limit) ? limit : old - 1, true,
		__ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
	return old;
}
#define CUDA_EMU_ATOMIC_FP(T, op, expr) \
	static inline T op(T *a, T v) \
	{ \
		T old, nv; \
		__atomic_load(a, &old, __ATOMIC_RELAXED); \
		do { \
			nv = (expr); \
		} while (!__atomic_compare_exchange(a, &old, &nv, true, __ATOMIC_RELAXED, \
			__ATOMIC_RELAXED)); \
		return old; \
	}
CUDA_EMU_ATOMIC_FP(float, atomicAdd, old + v)
CUDA_EMU_ATOMIC_FP(double, atomicAdd, old + v)
CUDA_EMU_ATOMIC_FP(float, atomicMax, fmaxf(old, v))
CUDA_EMU_ATOMIC_FP(float, atomicMin, fminf(old, v))
#undef CUDA_EMU_ATOMIC_FP
static inline float atomicExch(float *a, float v)
{
	float old;
	__atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
	return old;
}

/* ---- integer intrinsics ---- */
/* Four signed (or unsigned) byte products summed into C. */
static inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 32; i += 8)
		c += (int)(int8_t)(a >> i) * (int)(int8_t)(b >> i);
	return c;
}
static inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
	for (int i = 0; i < 32; i += 8)
		c += ((a >> i) & 0xffu) * ((b >> i) & 0xffu);
	return c;
}
static inline int __dp4a(char4 a, char4 b, int c)
{
	return c + a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
/* Two 16-bit products of A's halves with B's low (or high) two bytes. */
static inline int __dp2a_lo(int a, int b, int c)
{
	return c + (int)(int16_t)a * (int)(int8_t)b + (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 8);
}
static inline int __dp2a_hi(int a, int b, int c)
{
	return c + (int)(int16_t)a * (int)(int8_t)(b >> 16) +
		(int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 24);
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
	unsigned r = 0;
	for (int i = 0; i < 32; i++)
		r |= ((x >> i) & 1u) << (31 - i);
	return r;
}
static inline unsigned long long __brevll(unsigned long long x)
{
	return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
/* Byte I of the result is byte (S >> 4*I) & 7 of the 8-byte value {Y, X}. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	unsigned long long v = ((unsigned long long)y << 32) | x;
	unsigned r = 0;
	for (int i = 0; i < 4; i++)
		r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
	return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b)
{
	return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
	return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b)
{
	return (long long)(((__int128)a * b) >> 64);
}
/* The low 32 bits of the product of A's and B's low 24 bits, signed. */
static inline int __mul24(int a, int b)
{
	long long x = (int32_t)((uint32_t)a << 8) >> 8, y = (int32_t)((uint32_t)b << 8) >> 8;
	return (int)(uint32_t)(x * y);
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift)
{
	unsigned long long v = ((unsigned long long)hi << 32) | lo;
	return (unsigned)((v << (shift & 31)) >> 32);
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift)
{
	unsigned long long v = ((unsigned long long)hi << 32) | lo;
	return (unsigned)(v >> (shift & 31));
}
#define CUDA_EMU_MINMAX(R, A, B) \
	static inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; } \
	static inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }
CUDA_EMU_MINMAX(int, int, int)
CUDA_EMU_MINMAX(unsigned, unsigned, unsigned)
CUDA_EMU_MINMAX(unsigned, int, unsigned)
CUDA_EMU_MINMAX(unsigned, unsigned, int)
CUDA_EMU_MINMAX(long, long, long)
CUDA_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
CUDA_EMU_MINMAX(unsigned long, long, unsigned long)
CUDA_EMU_MINMAX(unsigned long, unsigned long, long)
CUDA_EMU_MINMAX(long long, long long, long long)
CUDA_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUDA_EMU_MINMAX(unsigned long long, long long, unsigned long long)
CUDA_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef CUDA_EMU_MINMAX
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin(a, b); }
static inline double max(double a, float b) { return fmax(a, b); }
static inline double min(double a, float b) { return fmin(a, b); }

/* ---- float intrinsics: the fast ones are the accurate ones here ---- */
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
/* glibc declares these (unexported) in <math.h>: same names, C linkage. */
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned x) { return (float)x; }

/* ---- memory-access hints, misc ---- */
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline T __ldca(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldlu(const T *p) { return *p; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline void __stwt(T *p, T v) { *p = v; }
static inline void __trap(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cuda_emu::trap(file, line);
}
static inline void __brkpt(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cuda_emu::trap(file, line);
}
static inline void __nanosleep(unsigned ns) { (void)ns; }
static inline long long clock64() { return cuda_emu::clock_ticks(); }

/* ---- the launch: LAUNCH in cuda_compat.h expands to cuda_emu::launch ---- */
namespace cuda_emu {
/* One launch's kernel and arguments, copied at the launch (a captured graph
 * keeps it); run() is one CUDA thread's call on its own copy of them. */
struct kernel_call {
	virtual ~kernel_call() = default;
	virtual void run() const = 0;
};
template <typename... P>
struct kernel_call_of final : kernel_call {
	void (*kernel)(P...);
	std::tuple<typename std::decay<P>::type...> args;
	template <typename... A>
	explicit kernel_call_of(void (*k)(P...), A &&...a) : kernel(k), args(std::forward<A>(a)...) {}
	void run() const override { std::apply(kernel, args); }
};
/* Checks the configuration, then runs the grid now or records it in the
 * stream's capture; errors go to cudaGetLastError, as a launch's do. */
void submit(std::shared_ptr<const kernel_call> call, const void *kernel, const char *name,
	const char *file, int line, dim3 grid, dim3 block, size_t smem, cudaStream_t stream);
template <typename... P, typename... A>
static inline void launch(const char *name, const char *file, int line, void (*kernel)(P...),
	dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args)
{
	static_assert(sizeof...(P) == sizeof...(A), "LAUNCH: wrong number of kernel arguments");
	submit(std::make_shared<kernel_call_of<P...>>(kernel, std::forward<A>(args)...),
		(const void *)kernel, name, file, line, grid, block, smem, stream);
}
} // namespace cuda_emu

namespace cuda_emu {
/* cudaMemcpyToSymbol/FromSymbol on a __constant__ or __device__ variable of
 * SYMBOL_SIZE bytes (a plain global here). */
cudaError_t copy_symbol(void *symbol, size_t symbol_size, void *host, size_t count, size_t offset,
	int kind, bool to_symbol);
} // namespace cuda_emu

template <typename T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count,
	size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyHostToDevice)
{
	return cuda_emu::copy_symbol((void *)&symbol, sizeof symbol, (void *)src, count, offset, kind,
		true);
}
template <typename T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count,
	size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost)
{
	return cuda_emu::copy_symbol((void *)&symbol, sizeof symbol, dst, count, offset, kind, false);
}

template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*entry)(P...), enum cudaFuncAttribute attr,
	int value)
{
	return cudaFuncSetAttribute((const void *)entry, attr, value);
}

#endif
