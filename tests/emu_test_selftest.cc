/* emu_test_selftest.cc - kernels/cuda/emu_selftest.cu, compiled here as C++
 * against the emulator, gives the right answers in every thread order.
 * (Built a second time with the ucontext fibers as test_emu_ucontext.)
 */
#include "emu_selftest.cu"

#include <math.h>

#include <vector>

#include "emu_testutil.h"

static uint64_t rng = 42;
static uint32_t next_u32()
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 32);
}

static void test_block_sum()
{
	const int nb = 5;
	std::vector<float> x(nb * 256);
	for (float &v : x)
		v = (float)(next_u32() % 1000) / 8.0f; /* exact sums in float */
	dbuf<float> dx(x.size()), out(nb);
	dx.put(x);
	for_each_order([&](const char *) {
		CHECK_INT_EQ(emu_selftest_block_sum(dx.d, nb, out.d, 0), 0);
		std::vector<float> h = out.get();
		for (int b = 0; b < nb; b++) {
			double want = 0;
			for (int i = 0; i < 256; i++)
				want += x[b * 256 + i];
			CHECK(h[b] == (float)want);
		}
	});
	CHECK_INT_EQ(emu_selftest_block_sum(dx.d, 0, out.d, 0), -EINVAL);
}

static void test_warp_sum()
{
	const int nw = 13; /* the last block holds one warp of four */
	std::vector<float> x(nw * 32);
	for (float &v : x)
		v = (float)(int)(next_u32() % 2001 - 1000) / 4.0f;
	dbuf<float> dx(x.size()), out(nw);
	dx.put(x);
	for_each_order([&](const char *) {
		CHECK_INT_EQ(emu_selftest_warp_sum(dx.d, nw, out.d, 0), 0);
		std::vector<float> h = out.get();
		for (int w = 0; w < nw; w++) {
			double want = 0;
			for (int i = 0; i < 32; i++)
				want += x[w * 32 + i];
			CHECK(h[w] == (float)want);
		}
	});
}

static void test_dot_i8()
{
	const int n = 4 * 300;
	std::vector<int8_t> a(n), b(n);
	int want = 0;
	for (int i = 0; i < n; i++) {
		a[i] = (int8_t)next_u32();
		b[i] = (int8_t)next_u32();
		want += a[i] * b[i];
	}
	dbuf<int8_t> da(n), db(n);
	dbuf<int> out(1);
	da.put(a);
	db.put(b);
	for_each_order([&](const char *) {
		CHECK_INT_EQ(emu_selftest_dot_i8(da.d, db.d, n, out.d, 0), 0);
		CHECK_INT_EQ(out.get()[0], want);
	});
	CHECK_INT_EQ(emu_selftest_dot_i8(da.d, db.d, 6, out.d, 0), -EINVAL);
}

static void test_histogram()
{
	const int n = 5000;
	std::vector<uint8_t> x(n);
	std::vector<unsigned> want(256, 0);
	for (int i = 0; i < n; i++) {
		x[i] = (uint8_t)(next_u32() % 37 * 7);
		want[x[i]]++;
	}
	dbuf<uint8_t> dx(n);
	dx.put(x);
	for_each_order([&](const char *) {
		dbuf<unsigned> hist(256);
		CHECK_INT_EQ(emu_selftest_histogram(dx.d, n, hist.d, 0), 0);
		CHECK(hist.get() == want);
	});
}

static void test_reverse_rows()
{
	const int rows = 3, ns[] = { 1, 31, 200, 1024 };
	for (int n : ns) {
		std::vector<float> x(rows * n);
		for (int i = 0; i < rows * n; i++)
			x[i] = (float)i;
		dbuf<float> dx(x.size()), out(x.size());
		dx.put(x);
		for_each_order([&](const char *) {
			CHECK_INT_EQ(emu_selftest_reverse_rows(dx.d, rows, n, out.d, 0), 0);
			std::vector<float> h = out.get();
			int bad = 0;
			for (int r = 0; r < rows; r++)
				for (int i = 0; i < n; i++)
					bad += h[r * n + i] != x[r * n + n - 1 - i];
			CHECK_INT_EQ(bad, 0);
		});
	}
	CHECK_INT_EQ(emu_selftest_reverse_rows(NULL, 1, 2000, NULL, 0), -EINVAL);
}

int main(void)
{
	test_block_sum();
	test_warp_sum();
	test_dot_i8();
	test_histogram();
	test_reverse_rows();
	CHECK_INT_EQ(cuda_emu_check_leaks(), 0);
	return test_result();
}
