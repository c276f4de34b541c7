/* stepcost.h - how long a forward step will take, learned from the steps
 * that ran.
 *
 * The model: seconds = base + row * rows + pos * attended + ctx * context
 * (struct stepcost_step): a cost per step (reading the weights), per token
 * row (the matmuls), per position a row attends to (attention's
 * arithmetic), and per KV position a sequence reads from memory (once per
 * step, however many of its rows share it).  A decode row pays the last two
 * for each position, a prefill chunk's rows mostly the arithmetic: on the
 * CPU a decode row costs about 2.5 times as much per position.  It is
 * fitted to the most recent
 * measured steps of each size (STEPCOST_PER_BUCKET of them per power of two
 * of rows), so that a long run of decode steps does not push out what the
 * last prefill steps taught: the fit always sees a spread of sizes and the
 * terms stay apart.  Older steps weigh less (half every STEPCOST_HALF_LIFE
 * steps, down to a floor), so it follows a machine that slows down.  The
 * fit is least squares on the relative error (a 20 ms decode step counts
 * as much as a 2 s prefill step), with Huber
 * weights so that a step the OS delayed does not drag it, a small ridge
 * towards the previous fit for what the data cannot tell apart, and every
 * coefficient kept >= 0, so no prediction is negative.  The scheduler uses
 * it to size prefill chunks to a step-time budget.  The struct is plain
 * memory (no allocation); one owner, the engine thread.
 */
#ifndef LLMD_STEPCOST_H
#define LLMD_STEPCOST_H

#include <stdint.h>

#define STEPCOST_BUCKETS 17     /* steps of 1, 2-3, 4-7, ..., >= 65536 rows */
#define STEPCOST_PER_BUCKET 8   /* the most recent steps kept per bucket */
#define STEPCOST_MIN_SAMPLES 4  /* steps measured before predictions are trusted */
#define STEPCOST_HALF_LIFE 32   /* steps after which a step's weight in the fit halves */

/* What a step computes, as the model sees it. */
struct stepcost_step {
	int32_t rows;     /* token rows */
	int64_t attended; /* positions the rows attend to: the sum over rows of position + 1 */
	int64_t context;  /* KV positions read: the sum over the step's sequences of their
	                     last row's position + 1 (rows <= context <= attended) */
};

struct stepcost_coef {
	double base_s; /* seconds per step, whatever its rows */
	double row_s;  /* seconds per token row */
	double pos_s;  /* seconds per attended position */
	double ctx_s;  /* seconds per KV position read (context) */
};

struct stepcost_sample {
	double x[4];     /* 1, rows, attended, context */
	double secs;     /* measured seconds */
	uint64_t seq;    /* stepcost.samples when it was learned (its age) */
};

struct stepcost {
	struct stepcost_sample s[STEPCOST_BUCKETS][STEPCOST_PER_BUCKET]; /* rings of
	                                     measured steps, bucket = floor(log2(rows)) */
	int32_t fill[STEPCOST_BUCKETS];   /* entries filled per bucket */
	int32_t next[STEPCOST_BUCKETS];   /* the entry a bucket's next step replaces */
	int32_t n;                        /* entries filled in all */
	uint64_t samples;                 /* steps learned from, ever */
	int32_t max_rows;                 /* most rows of any step learned from */
	struct stepcost_coef coef;        /* the current fit (all >= 0) */
	int pinned;                       /* 1: coef was set by stepcost_pin; stepcost_fit
	                                     leaves it */
};

/* An empty model: predicts 0 until it has learned from a step. */
void stepcost_init(struct stepcost *c);

/* Keeps step ST, which took SECS seconds, to learn from at the next
 * stepcost_fit; O(1).  A sample that makes no sense (rows < 1, context
 * outside rows..attended, secs not a finite positive number) is refused
 * with -EINVAL; else 0. */
int stepcost_add(struct stepcost *c, const struct stepcost_step *st, double secs);

/* Refits the coefficients to the steps kept: O(steps kept), some
 * microseconds, so a caller that does not need fresh predictions every
 * step may call it less often.  Does nothing while pinned. */
void stepcost_fit(struct stepcost *c);

/* The predicted seconds of step ST: finite and >= 0 for any counts >= 0. */
double stepcost_predict(const struct stepcost *c, const struct stepcost_step *st);

/* Whether the fit has seen enough steps (STEPCOST_MIN_SAMPLES) to be
 * used, or is pinned. */
int stepcost_ready(const struct stepcost *c);

/* Steps kept of LO..HI rows, which tell what such a step costs beside the
 * others; INT32_MAX when pinned (it knows every size then).  O(steps
 * kept). */
int32_t stepcost_seen(const struct stepcost *c, int32_t lo, int32_t hi);

/* Fixes the model at COEF (negative or non-finite values taken as 0):
 * stepcost_fit leaves it alone; NULL refits from the steps kept and learns
 * again.  For tests and benchmarks that need predictions independent of
 * the machine's speed. */
void stepcost_pin(struct stepcost *c, const struct stepcost_coef *coef);

#endif
