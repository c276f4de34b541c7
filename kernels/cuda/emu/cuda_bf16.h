/* cuda_bf16.h - the emulator's stand-in for CUDA's bfloat16 header.
 *
 * __nv_bfloat16 and __nv_bfloat162 with round-to-nearest-even conversions
 * (NaN becomes the canonical 0x7fff, as CUDA's) and float-based arithmetic.
 * The bit helpers are C too.
 */
#ifndef LLMD_CUDA_EMU_BF16_H
#define LLMD_CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

/* float -> bfloat16 bits, round to nearest even. */
static inline unsigned short cuda_emu_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return 0x7fffu;
	x += 0x7fffu + ((x >> 16) & 1u);
	return (unsigned short)(x >> 16);
}

/* bfloat16 bits -> float, exact. */
static inline float cuda_emu_bf16_to_f32(unsigned short b)
{
	uint32_t x = (uint32_t)b << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

typedef struct __nv_bfloat16_raw { unsigned short x; } __nv_bfloat16_raw;
typedef struct __nv_bfloat162_raw { unsigned short x, y; } __nv_bfloat162_raw;

#ifndef __cplusplus
typedef struct __nv_bfloat16 { unsigned short __x; } __nv_bfloat16;
typedef struct __nv_bfloat162 { __nv_bfloat16 x, y; } __nv_bfloat162;
#else

struct alignas(2) __nv_bfloat16 {
	unsigned short __x; /* the high half of an IEEE binary32 */

	__nv_bfloat16() = default;
	constexpr __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
	__nv_bfloat16(float f) : __x(cuda_emu_f32_to_bf16(f)) {}
	__nv_bfloat16 &operator=(const __nv_bfloat16_raw &r) { __x = r.x; return *this; }
	operator __nv_bfloat16_raw() const { __nv_bfloat16_raw r; r.x = __x; return r; }
	operator float() const { return cuda_emu_bf16_to_f32(__x); }
};

struct alignas(4) __nv_bfloat162 {
	__nv_bfloat16 x, y;

	__nv_bfloat162() = default;
	__nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
};

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return cuda_emu_bf16_to_f32(b.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
	return __nv_bfloat162(__nv_bfloat16(lo), __nv_bfloat16(hi));
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 b)
{
	return make_float2(__bfloat162float(b.x), __bfloat162float(b.y));
}
static inline float __low2float(__nv_bfloat162 b) { return __bfloat162float(b.x); }
static inline float __high2float(__nv_bfloat162 b) { return __bfloat162float(b.y); }
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi)
{
	return __nv_bfloat162(lo, hi);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	return __nv_bfloat16(__nv_bfloat16_raw{u});
}
static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b)
{
	return __nv_bfloat16(__bfloat162float(a) + __bfloat162float(b));
}
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b)
{
	return __nv_bfloat16(__bfloat162float(a) - __bfloat162float(b));
}
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b)
{
	return __nv_bfloat16(__bfloat162float(a) * __bfloat162float(b));
}
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c)
{
	return __nv_bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
static inline __nv_bfloat16 operator+(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hadd(a, b); }
static inline __nv_bfloat16 operator-(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hsub(a, b); }
static inline __nv_bfloat16 operator*(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hmul(a, b); }
static inline bool operator==(const __nv_bfloat16 &a, const __nv_bfloat16 &b)
{
	return __bfloat162float(a) == __bfloat162float(b);
}
static inline bool operator<(const __nv_bfloat16 &a, const __nv_bfloat16 &b)
{
	return __bfloat162float(a) < __bfloat162float(b);
}

#endif /* __cplusplus */

#endif
