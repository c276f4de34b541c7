/* emu.cc - the CUDA emulator's scheduler: a grid's blocks run one after
 * another on the launching thread, each CUDA thread of a block a fiber.
 *
 * Fibers switch only at barriers, warp collectives and exit; the scheduler
 * then picks the next runnable one in the configured order.  A barrier is
 * released when every live thread of the block waits at it (at one call
 * site), a collective when every lane of its mask that has not exited has
 * arrived (a shuffle: every lane of its mask), with all lanes' results
 * computed at that moment.  No runnable fiber while some have not exited is
 * a deadlock: the state of every warp is printed and the process aborts.
 * Not parallel, not fast: exact, and loud about misuse.
 *
 * Under TSan, fibers do not synchronize with each other by switching; only
 * barriers (__syncthreads, __syncwarp) release and acquire, on an object
 * per barrier instance, so a missing barrier between a write and another
 * thread's read is reported as a race.  The scheduler's own bookkeeping,
 * which every fiber of a block writes, is not instrumented (FIBER_SIDE).
 */
#include "emu_impl.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>

#include "emu_fiber.h"

#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

__thread const cuda_emu::thread_view *cuda_emu_self;
extern const int warpSize = 32;

namespace cuda_emu {
namespace {

/* ---- TSan hooks ---- */
#ifdef EMU_TSAN
/* Code that runs on fibers and keeps the scheduler's books: every fiber of
 * a block writes them with no happens-before between fibers by design, so
 * TSan must not see those accesses (it still sees the kernels'). */
#define FIBER_SIDE __attribute__((no_sanitize("thread")))
static void tsan_release(void *a) { __tsan_release(a); }
static void tsan_acquire(void *a) { __tsan_acquire(a); }
#else
#define FIBER_SIDE
static void tsan_release(void *) {}
static void tsan_acquire(void *) {}
#endif

/* ---- state ---- */
enum lane_state { LANE_RUNNABLE, LANE_RUNNING, LANE_WAITING, LANE_EXITED };

/* One barrier or collective instance that lanes are waiting at; recycled
 * by the last lane that reads its result. */
struct rendezvous {
	bool barrier;      /* __syncthreads*, else a warp collective */
	int kind;          /* enum bar_kind or enum coll_kind */
	int warp;          /* collectives: the warp */
	unsigned mask;     /* collectives: the lanes taking part */
	unsigned arrived;  /* collectives: the lanes there so far */
	int n_arrived;     /* barriers: threads there so far */
	int width;         /* shuffles: segment width */
	int size;          /* bytes of the exchanged value */
	int refs;          /* lanes still to read their result */
	char *sync;        /* TSan: this instance's sync object (see rdv_new) */
	rendezvous *next;  /* on the free list */
};

/* One CUDA thread. */
struct lane {
	struct emu_fiber fiber;      /* its stack and context; kept across launches */
	thread_view view;            /* what threadIdx and friends read */
	int tid;                     /* linear thread index in the block */
	int state;                   /* enum lane_state */
	/* what it waits at (state LANE_WAITING), and the result it gets */
	rendezvous *rdv;
	int kind;
	unsigned mask;
	unsigned long long value;
	int arg;
	const char *file;
	int line;
	unsigned long long result;
	char parked;                 /* TSan: released at each park, acquired only after a fault */
};

#define MAX_THREADS 1024

/* The emulator's one executor; used under api_lock() by one host thread at
 * a time, and by that thread's fibers. */
struct sched {
	lane *lanes[MAX_THREADS];           /* made on demand, kept for good */
	int n_lanes;
	struct emu_fiber *host;             /* the launching thread's context (host_ctx) */
	lane *cur;                          /* the running lane; NULL in the host */
	/* the block being run */
	const launch_rec *launch;
	uint3 block_idx;
	int n_threads;                      /* in the block */
	int live;                           /* not exited */
	rendezvous *bar;                    /* the pending __syncthreads, if any */
	rendezvous *pending[MAX_THREADS];   /* pending warp collectives (one per lane at most) */
	int n_pending;
	uint64_t runnable[MAX_THREADS / 64]; /* bitmap by tid */
	int n_runnable;
	int cursor;                         /* round-robin position */
	bool faulted;                       /* a __trap() ended the launch */
	void *dyn;                          /* this launch's dynamic shared memory */
	size_t dyn_size;                    /* bytes */
	uint64_t rng;                       /* random order's generator state */
	/* TSan sync objects: block start (host -> fibers), block end (fibers -> host) */
	char block_start, block_end;
	unsigned long long n_launches, n_switches;
};
static sched S;

/* Each launching thread's own context, made once: fibers read it while
 * switching back, so it must not be rewritten under them. */
static __thread struct emu_fiber host_ctx;
static __thread bool host_ctx_ready;

/* Under TSan each barrier instance needs a sync object of its own, or a
 * lane would acquire an older instance's clock.  TSan makes a sync object
 * (and records a stack) the first time it sees an address, which is slow,
 * so instances take the bytes of a ring in turn; an address comes back
 * after SYNC_RING instances, when the barrier that used it is long ordered
 * before anything still running. */
#define SYNC_RING 4096
#ifdef EMU_TSAN
static char sync_ring[SYNC_RING];
static unsigned sync_next;
#endif
static rendezvous *free_rdv;

FIBER_SIDE static rendezvous *rdv_new()
{
	rendezvous *r = free_rdv;
	if (r)
		free_rdv = r->next;
	else
		r = new rendezvous();
	/* field by field: an intercepted memset would be seen by TSan */
	r->barrier = false;
	r->kind = r->warp = r->width = r->size = r->refs = r->n_arrived = 0;
	r->mask = r->arrived = 0;
	r->next = NULL;
#ifdef EMU_TSAN
	r->sync = &sync_ring[sync_next++ % SYNC_RING];
#else
	r->sync = NULL;
#endif
	return r;
}

FIBER_SIDE static void rdv_free(rendezvous *r)
{
	if (!r)
		return;
	r->next = free_rdv;
	free_rdv = r;
}

static uint64_t rng_next()
{
	if (!S.rng) /* the first random pick: from the settings' seed */
		S.rng = config().seed ? config().seed : 0x9e3779b97f4a7c15ull;
	/* xorshift64* */
	S.rng ^= S.rng >> 12;
	S.rng ^= S.rng << 25;
	S.rng ^= S.rng >> 27;
	return S.rng * 0x2545f4914f6cdd1dull;
}

static const char *coll_name(int kind)
{
	static const char *const names[COLL_N_KINDS] = {
		"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
		"__ballot_sync", "__any_sync", "__all_sync", "__syncwarp",
		"__match_any_sync", "__match_all_sync",
		"__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_min_sync",
		"__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
	};
	return kind >= 0 && kind < COLL_N_KINDS ? names[kind] : "?";
}

static const char *bar_name(int kind)
{
	switch (kind) {
	case BAR_COUNT: return "__syncthreads_count";
	case BAR_AND: return "__syncthreads_and";
	case BAR_OR: return "__syncthreads_or";
	default: return "__syncthreads";
	}
}

static bool is_shfl(int kind) { return kind <= COLL_SHFL_XOR; }

static const char *order_name(enum cuda_emu_order o)
{
	return o == CUDA_EMU_ORDER_REVERSE ? "reverse" : o == CUDA_EMU_ORDER_RANDOM ? "random" : "forward";
}

/* ---- the runnable set ---- */
FIBER_SIDE static void make_runnable(lane *l)
{
	l->state = LANE_RUNNABLE;
	S.runnable[l->tid >> 6] |= 1ull << (l->tid & 63);
	S.n_runnable++;
}

/* Lanes of WARP that exist in the block and have not exited. */
FIBER_SIDE static unsigned live_lanes(int warp)
{
	unsigned m = 0;
	for (int i = 0; i < 32 && warp * 32 + i < S.n_threads; i++)
		if (S.lanes[warp * 32 + i]->state != LANE_EXITED)
			m |= 1u << i;
	return m;
}

/* The lanes a collective still waits for.  CUDA asks every non-exited lane
 * of the mask to take part; a shuffle also reads the lanes it names, so
 * there an exited (or missing) lane is waited for forever: a deadlock the
 * report shows, instead of a garbage value. */
FIBER_SIDE static unsigned missing_lanes(const rendezvous *r)
{
	unsigned need = is_shfl(r->kind) ? r->mask : r->mask & live_lanes(r->warp);
	return need & ~r->arrived;
}

/* The first runnable tid at or after FROM, wrapping; -1 when none. */
static int next_runnable(int from)
{
	int words = (S.n_threads + 63) / 64;
	for (int k = 0; k <= words; k++) {
		int w = (from / 64 + k) % words;
		uint64_t bits = S.runnable[w];
		if (k == 0)
			bits &= ~0ull << (from % 64);
		if (bits)
			return w * 64 + __builtin_ctzll(bits);
	}
	return -1;
}

/* The last runnable tid at or before FROM, wrapping; -1 when none. */
static int prev_runnable(int from)
{
	int words = (S.n_threads + 63) / 64;
	for (int k = 0; k <= words; k++) {
		int w = ((from / 64 - k) % words + words) % words;
		uint64_t bits = S.runnable[w];
		if (k == 0 && from % 64 != 63)
			bits &= (1ull << (from % 64 + 1)) - 1;
		if (bits)
			return w * 64 + 63 - __builtin_clzll(bits);
	}
	return -1;
}

static int pick()
{
	if (S.n_runnable == 0)
		return -1;
	int t;
	switch (config().order) {
	case CUDA_EMU_ORDER_REVERSE:
		t = prev_runnable(S.cursor);
		S.cursor = t > 0 ? t - 1 : S.n_threads - 1;
		break;
	case CUDA_EMU_ORDER_RANDOM: {
		int k = (int)(rng_next() % (uint64_t)S.n_runnable);
		t = -1;
		for (int w = 0; t < 0; w++) {
			int c = __builtin_popcountll(S.runnable[w]);
			if (k >= c) {
				k -= c;
				continue;
			}
			uint64_t bits = S.runnable[w];
			while (k--)
				bits &= bits - 1;
			t = w * 64 + __builtin_ctzll(bits);
		}
		break;
	}
	default:
		t = next_runnable(S.cursor);
		S.cursor = t + 1 < S.n_threads ? t + 1 : 0;
		break;
	}
	S.runnable[t >> 6] &= ~(1ull << (t & 63));
	S.n_runnable--;
	return t;
}

/* ---- reports ---- */
static std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string strf(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	return buf;
}

static std::string lanes_str(unsigned m)
{
	std::string s;
	for (int i = 0; i < 32;) {
		if (!(m & (1u << i))) {
			i++;
			continue;
		}
		int j = i;
		while (j + 1 < 32 && (m & (1u << (j + 1))))
			j++;
		s += s.empty() ? "" : ",";
		s += i == j ? strf("%d", i) : strf("%d-%d", i, j);
		i = j + 1;
	}
	return s;
}

/* One line's worth of what lane TID is doing. */
FIBER_SIDE static std::string lane_state_str(int tid)
{
	if (tid >= S.n_threads)
		return strf("do not exist (the block has %d threads)", S.n_threads);
	const lane *l = S.lanes[tid];
	switch (l->state) {
	case LANE_EXITED: return "exited";
	case LANE_RUNNABLE: return "runnable";
	case LANE_RUNNING: return "running";
	default: break;
	}
	const rendezvous *r = l->rdv;
	if (r->barrier)
		return strf("wait at %s (%s:%d)", bar_name(l->kind), l->file, l->line);
	std::string s = strf("wait at %s mask 0x%08x (%s:%d)", coll_name(l->kind), l->mask, l->file,
		l->line);
	unsigned missing = missing_lanes(r);
	if (missing)
		s += ", which lacks lane" + std::string(__builtin_popcount(missing) > 1 ? "s " : " ") +
			lanes_str(missing);
	return s;
}

/* Every warp's lanes, grouped where consecutive lanes do the same. */
FIBER_SIDE static void dump_block()
{
	const launch_rec *L = S.launch;
	unsigned long long seed;
	enum cuda_emu_order o = cuda_emu_get_order(&seed);
	fprintf(stderr, "cuda-emu:   kernel %s launched at %s:%d, grid (%u,%u,%u), block (%u,%u,%u),"
		" %zu bytes of dynamic shared memory\n", L->name, L->file, L->line, L->grid.x,
		L->grid.y, L->grid.z, L->block.x, L->block.y, L->block.z, L->smem);
	fprintf(stderr, "cuda-emu:   in block (%u,%u,%u); thread order %s", S.block_idx.x,
		S.block_idx.y, S.block_idx.z, order_name(o));
	if (o == CUDA_EMU_ORDER_RANDOM)
		fprintf(stderr, ":%llu", seed);
	fprintf(stderr, "\n");
	int n_warps = (S.n_threads + 31) / 32;
	for (int w = 0; w < n_warps; w++) {
		for (int i = 0; i < 32;) {
			std::string what = lane_state_str(w * 32 + i);
			int j = i;
			while (j + 1 < 32 && lane_state_str(w * 32 + j + 1) == what)
				j++;
			std::string who = i == j ? strf("lane %d", i) : strf("lanes %d-%d", i, j);
			if (w * 32 + i < S.n_threads) {
				const uint3 a = S.lanes[w * 32 + i]->view.thread_idx;
				const uint3 b = S.lanes[w * 32 + (j < S.n_threads - w * 32 ? j :
					S.n_threads - w * 32 - 1)]->view.thread_idx;
				who += i == j ? strf(" (thread %u,%u,%u)", a.x, a.y, a.z) :
					strf(" (threads %u,%u,%u..%u,%u,%u)", a.x, a.y, a.z, b.x, b.y, b.z);
			}
			fprintf(stderr, "cuda-emu:   %s %s: %s\n", i == 0 ? strf("warp %d", w).c_str() :
				std::string(strf("warp %d", w).size(), ' ').c_str(), who.c_str(), what.c_str());
			i = j + 1;
		}
	}
}

/* A kernel bug the emulator can see: report it with the block's state and
 * abort (a test expecting it runs the kernel in a child process). */
[[noreturn]] static void kernel_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
FIBER_SIDE static void kernel_fatal(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "cuda-emu: %s\n", buf);
	if (S.launch)
		dump_block();
	fflush(stderr);
	abort();
}

FIBER_SIDE static lane *self(const char *what, const char *file, int line)
{
	if (!S.cur || !in_kernel()) {
		fprintf(stderr, "cuda-emu: %s called outside a kernel at %s:%d\n", what, file, line);
		abort();
	}
	return S.cur;
}

/* ---- barriers and collectives ---- */
FIBER_SIDE static void wait_on(lane *l, rendezvous *r, int kind, unsigned mask, unsigned long long value,
	int arg, const char *file, int line)
{
	l->state = LANE_WAITING;
	l->rdv = r;
	l->kind = kind;
	l->mask = mask;
	l->value = value;
	l->arg = arg;
	l->file = file;
	l->line = line;
	r->refs++;
}

/* Parks the calling lane until its rendezvous releases it; returns its
 * result.  SYNC: the rendezvous orders memory (barriers, __syncwarp). */
FIBER_SIDE static unsigned long long wait_result(lane *l, rendezvous *r, bool sync)
{
	struct emu_fiber *host = S.host;
	tsan_release(&l->parked);
	emu_fiber_switch(&l->fiber, host);
	if (sync)
		tsan_acquire(r->sync);
	unsigned long long res = l->result;
	l->rdv = NULL;
	if (--r->refs == 0)
		rdv_free(r);
	return res;
}

FIBER_SIDE static void complete_barrier()
{
	rendezvous *r = S.bar;
	const lane *first = NULL;
	int count = 0;
	for (int t = 0; t < S.n_threads; t++) {
		const lane *l = S.lanes[t];
		if (l->state != LANE_WAITING || l->rdv != r)
			continue;
		count += l->value != 0;
		if (!first)
			first = l;
		else if (l->line != first->line || strcmp(l->file, first->file) != 0)
			kernel_fatal("deadlock: the block's threads wait at different barriers "
				"(%s at %s:%d and %s at %s:%d); a barrier in divergent code never completes",
				bar_name(first->kind), first->file, first->line, bar_name(l->kind), l->file,
				l->line);
	}
	int n = r->n_arrived;
	unsigned long long res = r->kind == BAR_COUNT ? (unsigned long long)count :
		r->kind == BAR_AND ? count == n : r->kind == BAR_OR ? count > 0 : 0;
	for (int t = 0; t < S.n_threads; t++) {
		lane *l = S.lanes[t];
		if (l->state == LANE_WAITING && l->rdv == r) {
			l->result = res;
			make_runnable(l);
		}
	}
	S.bar = NULL;
}

/* The lane a shuffle of lane LID reads, per PTX shfl.sync (segment of WIDTH
 * lanes, B the lane/delta/mask operand); LID itself when out of range. */
FIBER_SIDE static int shfl_source(int kind, int lid, int b, int width)
{
	int seg = 32 - width;                 /* c[12:8]: the segment bits */
	int bval = b & 31;
	int min_lane = lid & seg;
	int max_lane = min_lane | (31 & ~seg); /* c[4:0] = 31 for idx/down/bfly */
	int j;
	bool ok;
	switch (kind) {
	case COLL_SHFL_UP:
		j = lid - bval;
		ok = j >= min_lane;           /* up: c[4:0] = 0, so maxLane is the segment start */
		break;
	case COLL_SHFL_DOWN:
		j = lid + bval;
		ok = j <= max_lane;
		break;
	case COLL_SHFL_XOR:
		j = lid ^ bval;
		ok = j <= max_lane;
		break;
	default:
		j = min_lane | (bval & ~seg);
		ok = j <= max_lane;
		break;
	}
	return ok ? j : lid;
}

FIBER_SIDE static void complete_collective(rendezvous *r)
{
	lane *const *w = &S.lanes[r->warp * 32];
	unsigned m = r->arrived; /* the mask, less lanes that exited */
	unsigned long long size_mask = r->size >= 8 ? ~0ull : (1ull << (8 * r->size)) - 1;
	unsigned ballot = 0;
	unsigned long long radd = 0, rand_ = ~0ull, ror = 0, rxor = 0;
	unsigned long long rminu = ~0ull, rmaxu = 0;
	long long rmini = INT64_MAX, rmaxi = INT64_MIN;
	bool all_equal = true;
	for (int i = 0; i < 32; i++) {
		if (!(m & (1u << i)))
			continue;
		unsigned long long v = w[i]->value;
		ballot |= (unsigned)(v != 0) << i;
		radd += v;
		rand_ &= v;
		ror |= v;
		rxor ^= v;
		rminu = v < rminu ? v : rminu;
		rmaxu = v > rmaxu ? v : rmaxu;
		long long sv = (int)(unsigned)v;
		rmini = sv < rmini ? sv : rmini;
		rmaxi = sv > rmaxi ? sv : rmaxi;
		all_equal = all_equal && v == w[__builtin_ctz(m)]->value;
	}
	for (int i = 0; i < 32; i++) {
		if (!(m & (1u << i)))
			continue;
		lane *l = w[i];
		unsigned long long res = 0;
		switch (r->kind) {
		case COLL_SHFL_IDX:
		case COLL_SHFL_UP:
		case COLL_SHFL_DOWN:
		case COLL_SHFL_XOR: {
			int j = shfl_source(r->kind, i, l->arg, r->width);
			/* Reading a lane outside the mask is undefined: all-ones bits
			 * (NaN, -1), so that a result used anyway shows. */
			res = (m & (1u << j)) ? w[j]->value : size_mask;
			break;
		}
		case COLL_BALLOT: res = ballot; break;
		case COLL_ANY: res = ballot != 0; break;
		case COLL_ALL: res = ballot == m; break;
		case COLL_SYNCWARP: res = 0; break;
		case COLL_MATCH_ANY:
			for (int j = 0; j < 32; j++)
				if ((m & (1u << j)) && w[j]->value == l->value)
					res |= 1ull << j;
			break;
		case COLL_MATCH_ALL: res = all_equal ? (1ull << 32) | m : 0; break;
		case COLL_REDUCE_ADD: res = (unsigned)radd; break;
		case COLL_REDUCE_MIN_U: res = rminu; break;
		case COLL_REDUCE_MAX_U: res = rmaxu; break;
		case COLL_REDUCE_MIN_I: res = (unsigned)(int)rmini; break;
		case COLL_REDUCE_MAX_I: res = (unsigned)(int)rmaxi; break;
		case COLL_REDUCE_AND: res = (unsigned)rand_; break;
		case COLL_REDUCE_OR: res = (unsigned)ror; break;
		case COLL_REDUCE_XOR: res = (unsigned)rxor; break;
		}
		l->result = res;
		make_runnable(l);
	}
	for (int k = 0; k < S.n_pending; k++)
		if (S.pending[k] == r) {
			S.pending[k] = S.pending[--S.n_pending];
			break;
		}
}

/* A thread finished: a barrier, or a collective of its warp other than a
 * shuffle, may now have every lane it waits for. */
FIBER_SIDE static void lane_exited(lane *l)
{
	l->state = LANE_EXITED;
	S.live--;
	if (S.bar && S.bar->n_arrived == S.live)
		complete_barrier();
	for (int k = 0; k < S.n_pending; k++) {
		rendezvous *r = S.pending[k];
		if (r->warp == l->tid / 32 && r->arrived && !missing_lanes(r)) {
			complete_collective(r); /* removes it from pending */
			k = -1;
		}
	}
}

FIBER_SIDE static void lane_main()
{
	emu_fiber_entered();
	tsan_acquire(&S.block_start); /* first: the call below reads host memory */
	lane *l = S.cur;
	const kernel_call *call = S.launch->call.get();
	call->run();
	lane_exited(l);
	tsan_release(&S.block_end);
	emu_fiber_exit(&l->fiber, S.host);
}

/* ---- running a grid ---- */
static bool segv_handler_installed;

static void on_segv(int sig, siginfo_t *si, void *)
{
	if (emu_fiber_is_guard(si->si_addr)) {
		static const char msg[] = "cuda-emu: stack overflow in a CUDA thread "
			"(raise CUDA_EMU_STACK_KB)\n";
		ssize_t r = write(2, msg, sizeof msg - 1);
		(void)r;
	}
	signal(sig, SIG_DFL); /* the fault repeats and kills the process */
}

/* Says so when a fiber overflows its stack, unless a sanitizer (or the
 * program) already handles SIGSEGV. */
static void install_segv_handler()
{
	static __thread bool altstack_done;
	if (!altstack_done) {
		stack_t ss;
		if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_DISABLE)) {
			ss.ss_size = 64 * 1024;
			ss.ss_sp = malloc(ss.ss_size);
			ss.ss_flags = 0;
			if (ss.ss_sp && sigaltstack(&ss, NULL) != 0)
				free(ss.ss_sp);
		}
		altstack_done = true;
	}
	if (segv_handler_installed)
		return;
	segv_handler_installed = true;
	struct sigaction old;
	if (sigaction(SIGSEGV, NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
		(old.sa_flags & SA_SIGINFO))
		return;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigaction(SIGSEGV, &sa, NULL);
}

static bool ensure_lanes(int n)
{
	while (S.n_lanes < n) {
		lane *l = new lane();
		if (emu_fiber_init(&l->fiber, config().stack_bytes) != 0) {
			emu_fiber_destroy(&l->fiber);
			delete l;
			return false;
		}
		l->tid = S.n_lanes;
#ifdef EMU_TSAN
		char name[64];
		snprintf(name, sizeof name, "CUDA thread (linear index %d)", l->tid);
		__tsan_set_fiber_name(l->fiber.tsan_fiber, name);
#endif
		S.lanes[S.n_lanes++] = l;
	}
	return true;
}

static void drop_pending()
{
	rdv_free(S.bar);
	S.bar = NULL;
	for (int k = 0; k < S.n_pending; k++)
		rdv_free(S.pending[k]);
	S.n_pending = 0;
}

static void run_block(const launch_rec &L, uint3 bidx)
{
	dim3 bd = L.block;
	S.block_idx = bidx;
	S.live = S.n_threads;
	S.n_runnable = 0;
	memset(S.runnable, 0, sizeof S.runnable);
	S.cursor = config().order == CUDA_EMU_ORDER_REVERSE ? S.n_threads - 1 : 0;
	for (int t = 0; t < S.n_threads; t++) {
		lane *l = S.lanes[t];
		l->view.thread_idx = make_uint3(t % bd.x, t / bd.x % bd.y, t / (bd.x * bd.y));
		l->view.block_idx = bidx;
		l->view.block_dim = L.block;
		l->view.grid_dim = L.grid;
		l->rdv = NULL;
		emu_fiber_start(&l->fiber, lane_main);
		make_runnable(l);
	}
	if (S.dyn_size)
		memset(S.dyn, 0xff, S.dyn_size); /* what a block finds there: NaNs */
	tsan_release(&S.block_start);
	while (S.live > 0) {
		int t = pick();
		if (t < 0)
			kernel_fatal("deadlock: no thread of the block can run and %d have not exited",
				S.live);
		lane *l = S.lanes[t];
		l->state = LANE_RUNNING;
		S.cur = l;
		__atomic_store_n(&cuda_emu_self, &l->view, __ATOMIC_RELAXED);
		S.n_switches++;
		emu_fiber_switch(S.host, &l->fiber);
		__atomic_store_n(&cuda_emu_self, (const thread_view *)NULL, __ATOMIC_RELAXED);
		S.cur = NULL;
		if (S.faulted) {
			/* The lanes left parked never exit: take what they did from
			 * where they parked (under TSan; nothing otherwise). */
			for (int k = 0; k < S.n_threads; k++)
				if (S.lanes[k]->state != LANE_EXITED) {
					S.lanes[k]->fiber.dirty = 1;
					tsan_acquire(&S.lanes[k]->parked);
				}
			drop_pending();
			break;
		}
	}
	tsan_acquire(&S.block_end);
}

} // namespace

bool in_kernel()
{
	return __atomic_load_n(&cuda_emu_self, __ATOMIC_RELAXED) != NULL;
}

cudaError_t run_launch(const launch_rec &L)
{
	int n = (int)(L.block.x * L.block.y * L.block.z);
	if (!ensure_lanes(n)) {
		diag("kernel %s launched at %s:%d: cannot map stacks for %d threads", L.name, L.file,
			L.line, n);
		return cudaErrorLaunchOutOfResources;
	}
	void *dyn = malloc(L.smem); /* exact size, none included: ASan sees overruns */
	if (!dyn && L.smem)
		return cudaErrorLaunchOutOfResources;
	install_segv_handler();
	S.n_launches++;
	S.launch = &L;
	S.n_threads = n;
	S.faulted = false;
	S.dyn = dyn;
	S.dyn_size = L.smem;
	if (!host_ctx_ready) {
		emu_fiber_init_host(&host_ctx);
		host_ctx_ready = true;
	}
	S.host = &host_ctx;
	for (unsigned z = 0; z < L.grid.z && !S.faulted; z++)
		for (unsigned y = 0; y < L.grid.y && !S.faulted; y++)
			for (unsigned x = 0; x < L.grid.x && !S.faulted; x++)
				run_block(L, make_uint3(x, y, z));
	free(S.dyn);
	S.dyn = NULL;
	S.dyn_size = 0;
	S.launch = NULL;
	return S.faulted ? cudaErrorLaunchFailure : cudaSuccess;
}

/* ---- what kernels call (cuda_emu_device.h) ---- */
FIBER_SIDE int block_barrier(int kind, int pred, const char *file, int line)
{
	lane *l = self(bar_name(kind), file, line);
	rendezvous *r = S.bar;
	if (!r) {
		r = rdv_new();
		r->barrier = true;
		r->kind = kind;
		S.bar = r;
	}
	wait_on(l, r, kind, 0, pred != 0, 0, file, line);
	r->n_arrived++;
	tsan_release(r->sync);
	if (r->n_arrived == S.live)
		complete_barrier();
	return (int)wait_result(l, r, true);
}

FIBER_SIDE unsigned long long warp_collective(int kind, unsigned mask, unsigned long long value, int size,
	int arg, int width, const char *file, int line)
{
	lane *l = self(coll_name(kind), file, line);
	rendezvous *r = NULL;
	{
		int lid = l->tid & 31, warp = l->tid >> 5;
		if (!(mask & (1u << lid)))
			kernel_fatal("%s at %s:%d in thread (%u,%u,%u): mask 0x%08x does not include "
				"the calling lane %d", coll_name(kind), file, line, l->view.thread_idx.x,
				l->view.thread_idx.y, l->view.thread_idx.z, mask, lid);
		if (is_shfl(kind) && (width < 1 || width > 32 || (width & (width - 1))))
			kernel_fatal("%s at %s:%d: width %d is not a power of two from 1 to 32",
				coll_name(kind), file, line, width);
		if (!is_shfl(kind))
			width = 0;
		for (int k = 0; k < S.n_pending; k++)
			if (S.pending[k]->warp == warp && S.pending[k]->mask == mask)
				r = S.pending[k];
		if (!r) {
			r = rdv_new();
			r->kind = kind;
			r->warp = warp;
			r->mask = mask;
			r->width = width;
			r->size = size;
			S.pending[S.n_pending++] = r;
		} else if (r->kind != kind || r->width != width || r->size != size) {
			const lane *o = S.lanes[warp * 32 + __builtin_ctz(r->arrived)];
			kernel_fatal("lanes of one mask 0x%08x disagree: lane %d calls %s (width %d, %d "
				"bytes) at %s:%d while lane %d waits at %s (width %d, %d bytes) at %s:%d",
				mask, lid, coll_name(kind), width, size, file, line, o->tid & 31,
				coll_name(r->kind), r->width, r->size, o->file, o->line);
		}
		wait_on(l, r, kind, mask, value, arg, file, line);
		r->arrived |= 1u << lid;
	}
	if (kind == COLL_SYNCWARP)
		tsan_release(r->sync);
	if (!missing_lanes(r))
		complete_collective(r);
	return wait_result(l, r, kind == COLL_SYNCWARP);
}

FIBER_SIDE unsigned active_mask()
{
	return live_lanes(self("__activemask", "?", 0)->tid / 32);
}

FIBER_SIDE void trap(const char *file, int line)
{
	lane *l = self("__trap", file, line);
	const uint3 t = l->view.thread_idx;
	diag("__trap() at %s:%d in kernel %s (launched at %s:%d), block (%u,%u,%u), thread "
		"(%u,%u,%u): the launch fails with cudaErrorLaunchFailure", file, line,
		S.launch->name, S.launch->file, S.launch->line, S.block_idx.x, S.block_idx.y,
		S.block_idx.z, t.x, t.y, t.z);
	S.faulted = true;
	tsan_release(&S.block_end);
	emu_fiber_switch(&l->fiber, S.host);
	abort(); /* never resumed */
}

FIBER_SIDE void *dyn_shared()
{
	self("DYN_SHARED", "?", 0);
	return S.dyn;
}

long long clock_ticks()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}


} // namespace cuda_emu

using namespace cuda_emu;

extern "C" void cuda_emu_set_order(enum cuda_emu_order order, unsigned long long seed)
{
	std::lock_guard<std::mutex> g(api_lock());
	config().order = order;
	config().seed = seed;
	S.rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

extern "C" void cuda_emu_plant_fault(unsigned long long n)
{
	std::lock_guard<std::mutex> g(api_lock());
	config().fault_at = n;
}

extern "C" enum cuda_emu_order cuda_emu_get_order(unsigned long long *ret_seed)
{
	if (ret_seed)
		*ret_seed = config().seed;
	return config().order;
}

extern "C" void cuda_emu_stats(unsigned long long *ret_launches, unsigned long long *ret_switches)
{
	if (ret_launches)
		*ret_launches = S.n_launches;
	if (ret_switches)
		*ret_switches = S.n_switches;
}
