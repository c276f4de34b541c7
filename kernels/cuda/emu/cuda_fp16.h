/* cuda_fp16.h - the emulator's stand-in for CUDA's half-precision header.
 *
 * __half and __half2 with the conversions and arithmetic our kernels use.
 * Conversions round to nearest even, bit-exact with the device (NaN becomes
 * CUDA's canonical 0x7fff); arithmetic goes through float and rounds once
 * more, which gives the correctly rounded half result for + - * / (float
 * has more than twice half's precision).  The bit helpers are C too.
 */
#ifndef LLMD_CUDA_EMU_FP16_H
#define LLMD_CUDA_EMU_FP16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

/* float -> half bits, round to nearest even. */
static inline unsigned short cuda_emu_f32_to_f16(float f)
{
	uint32_t x, ax, sign, h, rem, halfway;
	int shift;
	memcpy(&x, &f, 4);
	sign = (x >> 16) & 0x8000u;
	ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u)
		return 0x7fffu;
	if (ax >= 0x477ff000u) /* >= 65520: rounds to infinity */
		return (unsigned short)(sign | 0x7c00u);
	if (ax >= 0x38800000u) { /* >= 2^-14: a normal half */
		h = (ax >> 13) - (112u << 10);
		rem = ax & 0x1fffu;
		h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
		return (unsigned short)(sign | h);
	}
	if (ax <= 0x33000000u) /* <= 2^-25: rounds to zero */
		return (unsigned short)sign;
	shift = 126 - (int)(ax >> 23); /* 14..24 */
	ax = (ax & 0x7fffffu) | 0x800000u;
	h = ax >> shift;
	rem = ax & ((1u << shift) - 1);
	halfway = 1u << (shift - 1);
	h += rem > halfway || (rem == halfway && (h & 1u));
	return (unsigned short)(sign | h);
}

/* double -> half bits in one rounding (not through float). */
static inline unsigned short cuda_emu_f64_to_f16(double d)
{
	uint64_t x, ax, rem, halfway, h;
	uint32_t sign;
	int shift;
	memcpy(&x, &d, 8);
	sign = (uint32_t)(x >> 48) & 0x8000u;
	ax = x & 0x7fffffffffffffffull;
	if (ax > 0x7ff0000000000000ull)
		return 0x7fffu;
	if (ax >= 0x40effe0000000000ull) /* >= 65520 */
		return (unsigned short)(sign | 0x7c00u);
	if (ax >= 0x3f10000000000000ull) { /* >= 2^-14 */
		h = ((ax >> 52) - 1008) << 10 | ((ax >> 42) & 0x3ff);
		rem = ax & ((1ull << 42) - 1);
		halfway = 1ull << 41;
		h += rem > halfway || (rem == halfway && (h & 1u));
		return (unsigned short)(sign | h);
	}
	if (ax <= 0x3e60000000000000ull) /* <= 2^-25 */
		return (unsigned short)sign;
	shift = 1051 - (int)(ax >> 52); /* 43..53 */
	ax = (ax & ((1ull << 52) - 1)) | (1ull << 52);
	h = ax >> shift;
	rem = ax & ((1ull << shift) - 1);
	halfway = 1ull << (shift - 1);
	h += rem > halfway || (rem == halfway && (h & 1u));
	return (unsigned short)(sign | h);
}

/* half bits -> float, exact. */
static inline float cuda_emu_f16_to_f32(unsigned short h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
	float f;
	if (e == 0x1f)
		x = sign | 0x7f800000u | (m << 13);
	else if (e)
		x = sign | ((e + 112) << 23) | (m << 13);
	else if (!m)
		x = sign;
	else {
		e = 113;
		while (!(m & 0x400u)) {
			m <<= 1;
			e--;
		}
		x = sign | (e << 23) | ((m & 0x3ffu) << 13);
	}
	memcpy(&f, &x, 4);
	return f;
}

typedef struct __half_raw { unsigned short x; } __half_raw;
typedef struct __half2_raw { unsigned short x, y; } __half2_raw;

#ifndef __cplusplus
typedef struct __half { unsigned short __x; } __half;
typedef struct __half2 { __half x, y; } __half2;
#else

struct alignas(2) __half {
	unsigned short __x; /* IEEE binary16 bits */

	__half() = default;
	constexpr __half(const __half_raw &r) : __x(r.x) {}
	__half(float f) : __x(cuda_emu_f32_to_f16(f)) {}
	__half(double d) : __x(cuda_emu_f64_to_f16(d)) {}
	template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
	__half(T i) : __x(cuda_emu_f64_to_f16((double)i)) {}
	__half &operator=(const __half_raw &r) { __x = r.x; return *this; }
	operator __half_raw() const { __half_raw r; r.x = __x; return r; }
	operator float() const { return cuda_emu_f16_to_f32(__x); }
};

struct alignas(4) __half2 {
	__half x, y;

	__half2() = default;
	__half2(const __half &a, const __half &b) : x(a), y(b) {}
	__half2(const __half2_raw &r) : x(__half_raw{r.x}), y(__half_raw{r.y}) {}
	operator __half2_raw() const { __half2_raw r; r.x = x.__x; r.y = y.__x; return r; }
};

typedef __half half;
typedef __half2 half2;

/* ---- conversions ---- */
static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline __half __double2half(double d) { return __half(d); }
static inline float __half2float(__half h) { return cuda_emu_f16_to_f32(h.__x); }
static inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
static inline __half2 __floats2half2_rn(float lo, float hi) { return __half2(__half(lo), __half(hi)); }
static inline __half2 __float22half2_rn(float2 v) { return __half2(__half(v.x), __half(v.y)); }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
static inline __half2 __halves2half2(__half lo, __half hi) { return __half2(lo, hi); }
static inline __half2 __half2half2(__half h) { return __half2(h, h); }
static inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
static inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
static inline __half2 __lowhigh2highlow(__half2 h) { return __half2(h.y, h.x); }
static inline __half2 make_half2(__half x, __half y) { return __half2(x, y); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
static inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }
static inline __half __int2half_rn(int i) { return __half(i); }
static inline __half __uint2half_rn(unsigned i) { return __half(i); }
static inline int __half2int_rn(__half h) { return (int)nearbyintf(__half2float(h)); }
static inline int __half2int_rz(__half h) { return (int)__half2float(h); }

/* ---- arithmetic: computed in float (exact or innocuously rounded), rounded to half ---- */
static inline __half __hadd(__half a, __half b) { return __half(__half2float(a) + __half2float(b)); }
static inline __half __hsub(__half a, __half b) { return __half(__half2float(a) - __half2float(b)); }
static inline __half __hmul(__half a, __half b) { return __half(__half2float(a) * __half2float(b)); }
static inline __half __hdiv(__half a, __half b) { return __half(__half2float(a) / __half2float(b)); }
/* a * b is exact in double; the sum rounds twice only past double's range. */
static inline __half __hfma(__half a, __half b, __half c)
{
	return __half((double)__half2float(a) * __half2float(b) + __half2float(c));
}
static inline __half __hneg(__half a) { return __half(__half_raw{(unsigned short)(a.__x ^ 0x8000u)}); }
static inline __half __habs(__half a) { return __half(__half_raw{(unsigned short)(a.__x & 0x7fffu)}); }
static inline __half __hmax(__half a, __half b) { return __half(fmaxf(__half2float(a), __half2float(b))); }
static inline __half __hmin(__half a, __half b) { return __half(fminf(__half2float(a), __half2float(b))); }
static inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }
static inline bool __hne(__half a, __half b) { return __half2float(a) != __half2float(b); }
static inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
static inline bool __hle(__half a, __half b) { return __half2float(a) <= __half2float(b); }
static inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
static inline bool __hge(__half a, __half b) { return __half2float(a) >= __half2float(b); }
static inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
static inline int __hisinf(__half a)
{
	return (a.__x & 0x7fffu) == 0x7c00u ? (a.__x & 0x8000u ? -1 : 1) : 0;
}
static inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
static inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
static inline __half2 __h2div(__half2 a, __half2 b) { return __half2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c)
{
	return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
static inline __half2 __hneg2(__half2 a) { return __half2(__hneg(a.x), __hneg(a.y)); }
static inline __half2 __habs2(__half2 a) { return __half2(__habs(a.x), __habs(a.y)); }
static inline __half2 __hmax2(__half2 a, __half2 b) { return __half2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }
static inline __half2 __hmin2(__half2 a, __half2 b) { return __half2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }
static inline __half hexp(__half a) { return __half(expf(__half2float(a))); }
static inline __half hlog(__half a) { return __half(logf(__half2float(a))); }
static inline __half hsqrt(__half a) { return __half(sqrtf(__half2float(a))); }
static inline __half hrsqrt(__half a) { return __half(1.0f / sqrtf(__half2float(a))); }
static inline __half hrcp(__half a) { return __half(1.0f / __half2float(a)); }

static inline __half operator+(const __half &a, const __half &b) { return __hadd(a, b); }
static inline __half operator-(const __half &a, const __half &b) { return __hsub(a, b); }
static inline __half operator*(const __half &a, const __half &b) { return __hmul(a, b); }
static inline __half operator/(const __half &a, const __half &b) { return __hdiv(a, b); }
static inline __half &operator+=(__half &a, const __half &b) { return a = __hadd(a, b); }
static inline __half &operator-=(__half &a, const __half &b) { return a = __hsub(a, b); }
static inline __half &operator*=(__half &a, const __half &b) { return a = __hmul(a, b); }
static inline __half &operator/=(__half &a, const __half &b) { return a = __hdiv(a, b); }
static inline __half operator-(const __half &a) { return __hneg(a); }
static inline __half operator+(const __half &a) { return a; }
static inline bool operator==(const __half &a, const __half &b) { return __heq(a, b); }
static inline bool operator!=(const __half &a, const __half &b) { return __hne(a, b); }
static inline bool operator<(const __half &a, const __half &b) { return __hlt(a, b); }
static inline bool operator<=(const __half &a, const __half &b) { return __hle(a, b); }
static inline bool operator>(const __half &a, const __half &b) { return __hgt(a, b); }
static inline bool operator>=(const __half &a, const __half &b) { return __hge(a, b); }
static inline __half2 operator+(const __half2 &a, const __half2 &b) { return __hadd2(a, b); }
static inline __half2 operator-(const __half2 &a, const __half2 &b) { return __hsub2(a, b); }
static inline __half2 operator*(const __half2 &a, const __half2 &b) { return __hmul2(a, b); }
static inline __half2 operator/(const __half2 &a, const __half2 &b) { return __h2div(a, b); }
static inline __half2 &operator+=(__half2 &a, const __half2 &b) { return a = __hadd2(a, b); }
static inline __half2 &operator-=(__half2 &a, const __half2 &b) { return a = __hsub2(a, b); }
static inline __half2 &operator*=(__half2 &a, const __half2 &b) { return a = __hmul2(a, b); }
static inline __half2 operator-(const __half2 &a) { return __hneg2(a); }

#endif /* __cplusplus */

#endif
