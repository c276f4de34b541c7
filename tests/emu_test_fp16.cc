/* emu_test_fp16.cc - the stand-in cuda_fp16.h and cuda_bf16.h convert
 * bit-exactly: round to nearest even against an oracle that searches the
 * representable values (and the CPU's F16C instruction where it exists),
 * exact widening, CUDA's canonical NaN, correctly rounded arithmetic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "emu_testutil.h"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t f16c_convert(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* The finite non-negative halves in increasing order (bits 0x0000..0x7bff). */
static std::vector<double> half_values;

/* The oracle: the nearest half to X (finite, not NaN), ties to the even
 * bit pattern, overflowing to infinity at 65520 as IEEE says. */
static uint16_t oracle_half(double x)
{
	uint16_t sign = std::signbit(x) ? 0x8000 : 0;
	double a = fabs(x);
	if (a >= 65520.0)
		return sign | 0x7c00;
	auto it = std::lower_bound(half_values.begin(), half_values.end(), a);
	size_t hi = (size_t)(it - half_values.begin());
	if (hi < half_values.size() && half_values[hi] == a)
		return sign | (uint16_t)hi;
	size_t lo = hi - 1;
	if (hi == half_values.size()) /* between 65504 and 65520 */
		return sign | (uint16_t)lo;
	double dl = a - half_values[lo], dh = half_values[hi] - a;
	size_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
	return sign | (uint16_t)pick;
}

static uint16_t oracle_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
	float flo, fhi;
	memcpy(&flo, &lo, 4);
	memcpy(&fhi, &hi, 4);
	/* Past the largest bfloat16 the next step up is 2^128, i.e. infinity. */
	double dhi = hi == 0x7f800000u ? ldexp(1.0, 128) : (double)fhi;
	double dl = (double)f - flo, dh = dhi - f;
	uint32_t pick = dl < dh ? lo : dh < dl ? hi : ((lo >> 16) % 2 == 0 ? lo : hi);
	return (uint16_t)(pick >> 16);
}

static float bits_float(uint32_t b)
{
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static void test_half_widen_all()
{
	int bad = 0;
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = cuda_emu_f16_to_f32((uint16_t)h);
		bool nan = (h & 0x7fff) > 0x7c00;
		if (nan) {
			bad += !isnan(f);
			bad += cuda_emu_f32_to_f16(f) != 0x7fff; /* CUDA's canonical NaN */
			continue;
		}
		bad += cuda_emu_f32_to_f16(f) != h;
		bad += cuda_emu_f64_to_f16(f) != h;
		if ((h & 0x7fff) < 0x7c00) /* matches the value list */
			bad += (double)fabsf(f) != half_values[h & 0x7fff];
	}
	CHECK_INT_EQ(bad, 0);
	CHECK(cuda_emu_f16_to_f32(0x3c00) == 1.0f);
	CHECK(cuda_emu_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
	CHECK(cuda_emu_f16_to_f32(0x7bff) == 65504.0f);
	CHECK(isinf(cuda_emu_f16_to_f32(0xfc00)) && cuda_emu_f16_to_f32(0xfc00) < 0);
}

static void test_half_narrow()
{
	bool f16c = false;
#if defined(__x86_64__)
	f16c = __builtin_cpu_supports("f16c");
#endif
	int bad = 0, bad_hw = 0;
	/* Every float near every half boundary and midpoint, then a sweep. */
	std::vector<float> xs;
	for (size_t i = 0; i + 1 < half_values.size(); i++) {
		float lo = (float)half_values[i], mid = (float)((half_values[i] + half_values[i + 1]) / 2);
		xs.push_back(lo);
		xs.push_back(mid);
		xs.push_back(nextafterf(mid, 0.0f));
		xs.push_back(nextafterf(mid, INFINITY));
	}
	for (float f : { 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e30f, ldexpf(1.0f, -25),
		nextafterf(ldexpf(1.0f, -25), 1.0f), ldexpf(1.0f, -26), 1e-30f, 0.0f })
		xs.push_back(f);
	for (uint32_t b = 0; b < 0x7f800000u; b += 0x3fd)
		xs.push_back(bits_float(b));
	for (float x : xs)
		for (float f : { x, -x }) {
			uint16_t got = cuda_emu_f32_to_f16(f), want = oracle_half(f);
			if (got != want && bad++ < 5)
				fprintf(stderr, "__float2half(%a) = 0x%04x, want 0x%04x\n", f, got, want);
			CHECK_INT_EQ(__float2half(f).__x, got);
#if defined(__x86_64__)
			if (f16c && f16c_convert(f) != got && bad_hw++ < 5)
				fprintf(stderr, "__float2half(%a) = 0x%04x, F16C says 0x%04x\n", f, got,
					f16c_convert(f));
#endif
		}
	CHECK_INT_EQ(bad, 0);
	CHECK_INT_EQ(bad_hw, 0);
	CHECK_INT_EQ(cuda_emu_f32_to_f16(NAN), 0x7fff);
	CHECK_INT_EQ(cuda_emu_f32_to_f16(-INFINITY), 0xfc00);
	CHECK_INT_EQ(cuda_emu_f32_to_f16(-0.0f), 0x8000);

	/* double -> half rounds once: a double just past a float-rounded midpoint. */
	int bad_d = 0;
	uint64_t r = 7;
	for (int i = 0; i < 200000; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		double d = ldexp((double)(r >> 11) / 9007199254740992.0 + 0.5, (int)(r % 44) - 27);
		bad_d += cuda_emu_f64_to_f16(d) != oracle_half(d);
	}
	double mid = (half_values[0x3c00] + half_values[0x3c01]) / 2; /* 1.0 + 2^-11 */
	bad_d += cuda_emu_f64_to_f16(mid + ldexp(1.0, -40)) != 0x3c01;
	bad_d += cuda_emu_f64_to_f16(mid) != 0x3c00;
	CHECK_INT_EQ(bad_d, 0);
}

static void test_bf16()
{
	int bad = 0;
	for (uint32_t b = 0; b < 0x7f800000u; b += 0x1ff) {
		float f = bits_float(b);
		bad += cuda_emu_f32_to_bf16(f) != oracle_bf16(f);
		bad += cuda_emu_f32_to_bf16(-f) != (oracle_bf16(f) | 0x8000);
	}
	for (uint32_t h = 0; h < 0x10000; h++) {
		if ((h & 0x7fff) > 0x7f80)
			continue;
		bad += cuda_emu_f32_to_bf16(cuda_emu_bf16_to_f32((uint16_t)h)) != h;
	}
	CHECK_INT_EQ(bad, 0);
	CHECK_INT_EQ(cuda_emu_f32_to_bf16(bits_float(0x3f808000u)), 0x3f80); /* tie: even */
	CHECK_INT_EQ(cuda_emu_f32_to_bf16(bits_float(0x3f818000u)), 0x3f82); /* tie: even */
	CHECK_INT_EQ(cuda_emu_f32_to_bf16(bits_float(0x7f7fffffu)), 0x7f80); /* overflows */
	CHECK_INT_EQ(cuda_emu_f32_to_bf16(NAN), 0x7fff);
	__nv_bfloat16 x = __float2bfloat16(1.5f);
	CHECK(__bfloat162float(x) == 1.5f);
	CHECK(__low2float(__floats2bfloat162_rn(2.0f, 3.0f)) == 2.0f);
	CHECK(__bfloat162float(__hmul(x, x)) == 2.25f);
}

/* + - * / of halves: the exact result rounded once. */
static void test_half_arith()
{
	int bad = 0;
	uint64_t r = 99;
	for (int i = 0; i < 200000; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		uint16_t ha = (uint16_t)(r >> 20), hb = (uint16_t)(r >> 40);
		if ((ha & 0x7c00) == 0x7c00 || (hb & 0x7c00) == 0x7c00)
			continue;
		__half a = __ushort_as_half(ha), b = __ushort_as_half(hb);
		double da = __half2float(a), db = __half2float(b);
		bad += __hadd(a, b).__x != cuda_emu_f64_to_f16(da + db);
		bad += __hsub(a, b).__x != cuda_emu_f64_to_f16(da - db);
		bad += __hmul(a, b).__x != cuda_emu_f64_to_f16(da * db);
		if (db != 0)
			bad += __hdiv(a, b).__x != cuda_emu_f64_to_f16(da / db);
		bad += (a + b).__x != __hadd(a, b).__x;
		bad += (a < b) != (da < db);
	}
	CHECK_INT_EQ(bad, 0);
	__half2 v = __floats2half2_rn(1.0f, -2.0f), w = __halves2half2(__float2half(0.5f), __float2half(4.0f));
	__half2 s = __hfma2(v, w, v);
	CHECK(__low2float(s) == 1.5f && __high2float(s) == -10.0f);
	CHECK(__hisnan(__hdiv(__float2half(0.0f), __float2half(0.0f))));
	CHECK_INT_EQ(__hisinf(__hmul(__float2half(60000.0f), __float2half(2.0f))), 1);
	CHECK(__half2float(__hmax(__float2half(1.0f), __float2half(NAN))) == 1.0f);
	__half h = 3; /* integer and double constructors round too */
	CHECK(__half2float(h) == 3.0f);
	CHECK(__half2float(__half(0.1)) == cuda_emu_f16_to_f32(cuda_emu_f64_to_f16(0.1)));
	float2 f2 = __half22float2(v);
	CHECK(f2.x == 1.0f && f2.y == -2.0f);
}

int main(void)
{
	/* Built from the definition of binary16, not from the code under test. */
	for (uint32_t h = 0; h < 0x7c00; h++)
		half_values.push_back(h < 0x400 ? ldexp((double)h, -24) :
			ldexp(1.0 + (h & 0x3ff) / 1024.0, (int)(h >> 10) - 15));
	test_half_widen_all();
	test_half_narrow();
	test_bf16();
	test_half_arith();
	return test_result();
}
