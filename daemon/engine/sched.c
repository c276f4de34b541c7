/* sched.c - the continuous-batching scheduler over the engine and its KV pool.
 *
 * It owns the requests (their tokens, block tables, samplers, detokenizer
 * and stop-string state), plans each step's batch under the token budget
 * and the step-time budget, admits, preempts and cancels, feeds the prefix
 * cache, times each step for the cost model, samples and emits events.  It
 * does not compute (engine.c) nor talk to clients (the daemon).
 * Engine thread only.  Live requests sit in one array scanned per step:
 * there are at most max_seqs + max_queue of them.
 */
#include "sched.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "engine.h"
#include "grammar.h"
#include "kv_pool.h"
#include "model.h"
#include "stopstr.h"
#include "tokenizer.h"

#define PIECE_MAX 512 /* bytes one token's text can release, with held-back bytes */
#define REFIT_EVERY 16 /* steps between cost-model fits (some microseconds each) when
                          the budget does not need a fresh one */
#define SPEC_MAX_MATCH 8 /* prompt lookup: the longest n-gram it matches */
#define SPEC_MAX_ROWS 64 /* proposed rows in one step, all sequences together */
#define SPEC_DECAY 0.9   /* per verification, the weight of what acceptance taught before */
#define SPEC_THRESH_COLD 0.3 /* the acceptance a proposed row of a lone decoding sequence
                                needs while the cost model cannot price it; with more,
                                nothing is proposed then (a batch may well be
                                compute-bound, and a draft's first proposals cost it the
                                prompts) */
#define SPEC_EXPLORE 3  /* steps of a few rows (2 to 1 + SCHED_SPEC_MAX_DRAFT) the cost
                           model must have measured to price a lone decode's proposals:
                           decode steps of one row alone cannot tell a row's cost from
                           the step's */
#define SPEC_ROW_PREMIUM 1.5 /* a proposed row's price over the model's row cost: its logits
                                (the vocabulary's projection, which prefill rows the
                                model learns from mostly skip) and the sampling */
#define SPEC_HORIZON 8  /* verifying steps over which a draft's catch-up on the tokens it
                           has not seen must pay for itself */
#define SPEC_PROBE_EVERY 16 /* tokens between tries of a draft whose rate does not pay */

enum seq_state {
	SEQ_WAITING = 0,  /* queued, never admitted or preempted */
	SEQ_RUNNING = 1,  /* holds blocks; prefilling or decoding */
};

struct seq {
	uint64_t id;            /* caller's id */
	uint32_t client;        /* fairness key */
	int32_t priority;
	uint64_t order;         /* submission order (FIFO tie-break) */
	uint64_t admit_order;   /* admission order; the newest is preempted first */
	enum seq_state state;
	int cancelled;          /* finish at the next step */
	int held;               /* sched_hold: no rows until released */
	int ignore_eos, logprobs;
	int32_t n_top_want;     /* alternatives to report a token */
	int32_t top_ids[SAMPLER_MAX_TOP], n_top; /* the last token's */
	float top_lps[SAMPLER_MAX_TOP];
	int32_t *tokens;        /* (cap) prompt then generated ids; owned */
	int32_t n_tokens;
	int32_t n_prompt;
	int32_t max_tokens;
	int32_t n_gen;
	int32_t n_computed;     /* leading tokens whose KV is in the blocks */
	int32_t *table;         /* (max_blocks) block ids; owned */
	int32_t n_blocks;       /* blocks held (one reference each) */
	uint64_t *hashes;       /* (max_blocks) chain hash of each full block of tokens */
	int32_t n_chain;        /* leading entries of hashes computed (tokens never change) */
	int32_t n_hashed;       /* leading blocks published or found (<= n_chain) */
	int32_t step_rows;      /* rows this step (planning only) */
	int preempted_now;      /* preempted while planning this step: not readmitted in it */
	int deferred_now;       /* its prefix is being computed by a running one: not admitted
	                           in this step */
	int32_t spec;           /* SCHED_SPEC_OFF, _NGRAM or _DRAFT */
	int32_t spec_max;       /* tokens it proposes a step at most */
	int32_t n_draft;        /* proposed this step, at tokens[n_tokens..] (planning) */
	int32_t spec_guess;     /* the proposer's next token when no row was worth it, or -1:
	                           judged against the drawn token all the same */
	double spec_ok, spec_all; /* decayed counts of proposals that stood, and judged */
	int32_t row0;           /* its first row in the step (planning) */
	int32_t *dtable;        /* (d_max_blocks) the draft's block ids, with a draft; owned */
	int32_t d_nblocks;      /* draft blocks held */
	int32_t d_computed;     /* leading tokens whose draft KV is in them */
	struct sampler *dsmp;   /* a drawing request's proposals are drawn with it, a copy of
	                           smp's state (the draft model); owned, or NULL */
	struct sampler *smp;    /* owned */
	struct grammar_state *gram; /* borrowed (sched_request.grammar), or NULL */
	uint32_t *mask;         /* ((n_vocab + 31) / 32) the grammar's allowed tokens; owned */
	struct stopstr *stop;   /* owned */
	struct detok dt;        /* incremental UTF-8 state */
	struct sched_usage usage;
	double t_submit, t_admit, t_first; /* monotonic seconds; 0 = not yet */
	int admitted_once;
};

struct sched {
	struct engine *e;            /* borrowed */
	const struct model *m;       /* borrowed */
	struct kv_pool *kv;          /* the engine's */
	struct sched_params p;
	sched_event_fn fn;
	void *ctx;
	int32_t bt;                  /* tokens per block */
	int32_t n_ctx;               /* positions per sequence */
	int32_t max_blocks;          /* table entries per sequence */
	struct seq **live;           /* (cap_live) every unfinished request */
	struct seq **run;            /* (cap_live) running ones, in run order (planning) */
	int32_t n_live, cap_live;
	uint64_t next_order, next_admit;
	struct sched_counters c;
	struct stepcost cost;        /* what steps cost, learned from the steps run */
	/* planning state of the step being planned */
	int timed;                   /* sequences decode: prefill is held to step_ms */
	int cut_now;                 /* the time budget held some prefill back */
	struct stepcost_step plan_work; /* what the rows so far compute (rows unused) */
	int32_t plan_prefill;        /* prefill rows so far */
	/* step scratch, (max_batched_tokens) each */
	int32_t *row_token, *row_pos;
	const int32_t **row_table;
	uint8_t *row_logits;
	struct seq **row_seq;
	float *logits;               /* (cap_logits, n_vocab) */
	int32_t cap_logits;          /* max_seqs; + SPEC_MAX_ROWS once a sequence proposes */
	/* the draft model (sched_set_draft), or NULL */
	struct engine *de;
	struct kv_pool *dkv;
	int32_t dbt, d_max_blocks;   /* its tokens per block; table entries per sequence */
	int32_t d_rows;              /* rows a draft step takes at most */
	int32_t *d_token, *d_pos;    /* (d_rows) a draft step's rows */
	const int32_t **d_table;
	uint8_t *d_flag;
	struct seq **d_row_seq;
	float *d_logits;             /* (max_seqs, n_vocab) */
	struct seq **d_seqs;         /* (max_seqs) sequences drafting this step (planning) */
	int32_t n_dseqs;
	struct stepcost dcost;       /* what the draft's steps cost, learned from them */
};

void sched_params_default(struct sched_params *p)
{
	p->max_seqs = 32;
	p->max_batched_tokens = 512;
	p->max_queue = 1024;
	p->prefix_cache = 1;
	p->step_ms = 0;
	p->spec_mode = SCHED_SPEC_OFF;
	p->spec_max_draft = 8;
	p->spec_min_match = 2;
}

int sched_new(struct engine *e, const struct model *m, const struct sched_params *p,
	      sched_event_fn fn, void *ctx, struct sched **ret, char *err, size_t errlen)
{
	struct sched *s;
	size_t T;

	if (p->max_seqs < 1 || p->max_batched_tokens < 1 || p->max_queue < 0 || !fn ||
	    p->max_batched_tokens > engine_max_batch(e) || p->step_ms < 0 ||
	    (p->spec_mode != SCHED_SPEC_OFF && p->spec_mode != SCHED_SPEC_NGRAM &&
	     p->spec_mode != SCHED_SPEC_DRAFT) ||
	    p->spec_max_draft < 1 || p->spec_max_draft > SCHED_SPEC_MAX_DRAFT || p->spec_min_match < 1) {
		snprintf(err, errlen, "invalid scheduler parameters (max_batched_tokens must be 1..%d, "
			 "step_ms >= 0, spec max_draft 1..%d, min_match >= 1)", engine_max_batch(e),
			 SCHED_SPEC_MAX_DRAFT);
		return -EINVAL;
	}
	s = calloc(1, sizeof *s);
	if (!s)
		goto nomem;
	s->e = e;
	s->m = m;
	s->kv = engine_kv_pool(e);
	s->p = *p;
	s->fn = fn;
	s->ctx = ctx;
	s->bt = s->kv->view.block_tokens;
	s->n_ctx = engine_n_ctx(e);
	s->max_blocks = (s->n_ctx + s->bt - 1) / s->bt;
	stepcost_init(&s->cost);
	stepcost_init(&s->dcost);
	s->cap_live = p->max_seqs + p->max_queue;
	s->live = calloc((size_t)s->cap_live, sizeof *s->live);
	s->run = calloc((size_t)s->cap_live, sizeof *s->run);
	T = (size_t)p->max_batched_tokens;
	s->row_token = malloc(T * sizeof *s->row_token);
	s->row_pos = malloc(T * sizeof *s->row_pos);
	s->row_table = malloc(T * sizeof *s->row_table);
	s->row_logits = malloc(T);
	s->row_seq = malloc(T * sizeof *s->row_seq);
	s->cap_logits = p->max_seqs;
	s->logits = malloc((size_t)s->cap_logits * m->hp.n_vocab * sizeof(float));
	if (!s->live || !s->run || !s->row_token || !s->row_pos || !s->row_table || !s->row_logits ||
	    !s->row_seq || !s->logits)
		goto nomem;
	*ret = s;
	return 0;
nomem:
	sched_free(s);
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

int sched_draft_check(const struct model *m, const struct model *dm, char *err, size_t errlen)
{
	int32_t nv = m->hp.n_vocab;
	char a[256], b[256];

	if (dm->hp.n_vocab != nv) {
		snprintf(err, errlen, "the draft model's vocabulary has %d tokens, the model's %d: a "
			 "draft must share the vocabulary", dm->hp.n_vocab, nv);
		return -EINVAL;
	}
	for (int32_t t = 0; t < nv; t++) {
		int la = tokenizer_piece(m->tok, t, 1, a, sizeof a);
		int lb = tokenizer_piece(dm->tok, t, 1, b, sizeof b);
		size_t n = la < 0 ? 0 : (size_t)la > sizeof a ? sizeof a : (size_t)la; /* what was written */
		if (la != lb || memcmp(a, b, n)) {
			snprintf(err, errlen, "the draft model's token %d is not the model's: a draft must "
				 "share the vocabulary, token for token", t);
			return -EINVAL;
		}
	}
	return 0;
}

int sched_set_draft(struct sched *s, struct engine *de, const struct model *dm, char *err,
		    size_t errlen)
{
	int32_t nv = s->m->hp.n_vocab, rows = engine_max_batch(de);
	int r;

	if (s->n_live || s->de) {
		snprintf(err, errlen, "a draft model is set before any request, once");
		return -EINVAL;
	}
	if ((r = sched_draft_check(s->m, dm, err, errlen)) < 0)
		return r;
	if (engine_n_ctx(de) < s->n_ctx) {
		snprintf(err, errlen, "the draft's context (%d tokens) is shorter than the model's (%d)",
			 engine_n_ctx(de), s->n_ctx);
		return -EINVAL;
	}
	s->d_token = malloc((size_t)rows * sizeof *s->d_token);
	s->d_pos = malloc((size_t)rows * sizeof *s->d_pos);
	s->d_table = malloc((size_t)rows * sizeof *s->d_table);
	s->d_flag = malloc((size_t)rows);
	s->d_row_seq = malloc((size_t)rows * sizeof *s->d_row_seq);
	s->d_logits = malloc((size_t)s->p.max_seqs * nv * sizeof *s->d_logits);
	s->d_seqs = malloc((size_t)s->p.max_seqs * sizeof *s->d_seqs);
	if (!s->d_token || !s->d_pos || !s->d_table || !s->d_flag || !s->d_row_seq || !s->d_logits ||
	    !s->d_seqs) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM; /* the buffers go with the scheduler */
	}
	s->de = de;
	s->dkv = engine_kv_pool(de);
	s->dbt = s->dkv->view.block_tokens;
	s->d_max_blocks = (s->n_ctx + s->dbt - 1) / s->dbt;
	s->d_rows = rows;
	return 0;
}

/* ---- requests ---- */

static void draft_release(struct sched *s, struct seq *q)
{
	while (q->d_nblocks > 0)
		kv_pool_unref(s->dkv, q->dtable[--q->d_nblocks]);
	q->d_computed = 0;
}

static void seq_release_blocks(struct sched *s, struct seq *q)
{
	draft_release(s, q);
	while (q->n_blocks > 0)
		kv_pool_unref(s->kv, q->table[--q->n_blocks]);
	q->n_computed = 0;
	q->n_hashed = 0;
}

static void seq_free(struct sched *s, struct seq *q)
{
	if (!q)
		return;
	seq_release_blocks(s, q);
	sampler_free(q->smp);
	sampler_free(q->dsmp);
	free(q->mask);
	stopstr_free(q->stop);
	free(q->tokens);
	free(q->table);
	free(q->hashes);
	free(q->dtable);
	free(q);
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	for (int32_t i = 0; i < s->n_live; i++)
		seq_free(s, s->live[i]);
	free(s->live);
	free(s->run);
	free(s->row_token);
	free(s->row_pos);
	free(s->row_table);
	free(s->row_logits);
	free(s->row_seq);
	free(s->logits);
	free(s->d_token);
	free(s->d_pos);
	free(s->d_table);
	free(s->d_flag);
	free(s->d_row_seq);
	free(s->d_logits);
	free(s->d_seqs);
	free(s);
}

static struct seq *find_live(const struct sched *s, uint64_t id)
{
	for (int32_t i = 0; i < s->n_live; i++)
		if (s->live[i]->id == id)
			return s->live[i];
	return NULL;
}

int sched_submit(struct sched *s, const struct sched_request *r)
{
	struct seq *q;
	int32_t waiting = 0, cap;
	int rc;

	if (!r->prompt || r->n_prompt < 1 || r->max_tokens < 1 || r->n_stops < 0 ||
	    r->top_logprobs < 0 || r->top_logprobs > SAMPLER_MAX_TOP || r->spec < SCHED_SPEC_DEFAULT ||
	    r->spec > SCHED_SPEC_DRAFT || r->spec_max_draft < 0 || r->spec_max_draft > SCHED_SPEC_MAX_DRAFT ||
	    (r->spec == SCHED_SPEC_DRAFT && !r->grammar && !s->de))
		return -EINVAL;
	for (int32_t i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] < 0 || r->prompt[i] >= s->m->hp.n_vocab)
			return -EINVAL;
	/* The prompt plus one generated token must fit a sequence and the
	 * whole pool, or it could wait forever. */
	if (r->n_prompt + 1 > s->n_ctx ||
	    (r->n_prompt + s->bt) / s->bt > s->kv->view.n_blocks)
		return -E2BIG;
	if (find_live(s, r->id))
		return -EEXIST;
	for (int32_t i = 0; i < s->n_live; i++)
		waiting += s->live[i]->state == SEQ_WAITING;
	if (waiting >= s->p.max_queue || s->n_live >= s->cap_live)
		return -EBUSY;

	q = calloc(1, sizeof *q);
	if (!q)
		return -ENOMEM;
	cap = r->n_prompt + r->max_tokens;
	if (cap > s->n_ctx)
		cap = s->n_ctx;
	q->tokens = malloc((size_t)cap * sizeof *q->tokens);
	q->table = malloc((size_t)s->max_blocks * sizeof *q->table);
	q->hashes = malloc((size_t)s->max_blocks * sizeof *q->hashes);
	if (s->de && !(q->dtable = malloc((size_t)s->d_max_blocks * sizeof *q->dtable))) {
		rc = -ENOMEM;
		goto fail;
	}
	if (!q->tokens || !q->table || !q->hashes) {
		rc = -ENOMEM;
		goto fail;
	}
	if (r->grammar) {
		q->gram = r->grammar;
		if (!(q->mask = malloc(((size_t)s->m->hp.n_vocab + 31) / 32 * sizeof *q->mask))) {
			rc = -ENOMEM;
			goto fail;
		}
	}
	if ((rc = sampler_new(&r->sampling, s->m->hp.n_vocab, &q->smp)) < 0 ||
	    (rc = stopstr_new(r->stops, r->n_stops, &q->stop)) < 0)
		goto fail;
	memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
	q->n_tokens = q->n_prompt = r->n_prompt;
	q->max_tokens = cap - r->n_prompt < r->max_tokens ? cap - r->n_prompt : r->max_tokens;
	q->id = r->id;
	q->client = r->client;
	q->priority = r->priority;
	q->ignore_eos = r->ignore_eos;
	q->logprobs = r->logprobs;
	q->n_top_want = r->top_logprobs;
	/* a default of draft on a scheduler without one (another model of the
	 * daemon's) is no speculation */
	q->spec = r->grammar ? SCHED_SPEC_OFF : r->spec ? r->spec : s->p.spec_mode;
	if (q->spec == SCHED_SPEC_DRAFT && !s->de)
		q->spec = SCHED_SPEC_OFF;
	q->spec_max = r->spec_max_draft ? r->spec_max_draft : s->p.spec_max_draft;
	q->spec_guess = -1;
	q->order = s->next_order++;
	q->state = SEQ_WAITING;
	q->t_submit = clock_s();
	q->usage.prompt_tokens = r->n_prompt;
	for (int32_t i = 0; i < r->n_prompt; i++)
		sampler_accept(q->smp, r->prompt[i]);
	s->live[s->n_live++] = q;
	return 0;
fail:
	seq_free(s, q);
	return rc;
}

int sched_cancel(struct sched *s, uint64_t id)
{
	struct seq *q = find_live(s, id);
	if (!q)
		return -ENOENT;
	q->cancelled = 1;
	return 0;
}

int sched_hold(struct sched *s, uint64_t id, int hold)
{
	struct seq *q = find_live(s, id);
	if (!q)
		return -ENOENT;
	q->held = hold != 0;
	return 0;
}

int32_t sched_live(const struct sched *s)
{
	return s->n_live;
}

int32_t sched_top_priority(const struct sched *s)
{
	int32_t top = INT32_MIN;
	for (int32_t i = 0; i < s->n_live; i++)
		if (!s->live[i]->held && !s->live[i]->cancelled && s->live[i]->priority > top)
			top = s->live[i]->priority;
	return top;
}

/* Removes Q from the live array, sends its FINISH event and frees it. */
static void seq_finish(struct sched *s, struct seq *q, enum sched_finish why, int error,
		       const char *message)
{
	struct sched_event ev = { .kind = SCHED_EV_FINISH, .id = q->id, .finish = why,
				  .error = error, .message = message };
	char tail[PIECE_MAX + STOPSTR_MAX_LEN];
	double t = clock_s();

	if (why == SCHED_FIN_LENGTH || why == SCHED_FIN_STOP) {
		/* Release what the stop matcher and the detokenizer held back. */
		size_t n = stopstr_flush(q->stop, tail, sizeof tail);
		n += (size_t)detok_flush(&q->dt, tail + n, sizeof tail - n);
		if (n) {
			struct sched_event te = { .kind = SCHED_EV_TOKEN, .id = q->id, .token = -1,
						  .text = tail, .text_len = n };
			s->fn(s->ctx, &te);
		}
	}
	q->usage.generated_tokens = q->n_gen;
	if (!q->admitted_once)
		q->usage.queue_s = t - q->t_submit;
	else if (!q->t_first)
		q->usage.prefill_s = t - q->t_admit;
	else
		q->usage.decode_s = t - q->t_first;
	ev.usage = q->usage;
	for (int32_t i = 0; i < s->n_live; i++)
		if (s->live[i] == q) {
			s->live[i] = s->live[--s->n_live];
			break;
		}
	s->c.finished++;
	s->fn(s->ctx, &ev);
	seq_free(s, q);
}

/* ---- blocks and the prefix cache ---- */

/* Blocks Q needs so that positions up to N_TOTAL - 1 have a block. */
static int32_t blocks_needed(const struct sched *s, const struct seq *q, int32_t n_total)
{
	int32_t want = (n_total + s->bt - 1) / s->bt;
	return want > q->n_blocks ? want - q->n_blocks : 0;
}

static int grow(struct sched *s, struct seq *q, int32_t n_total)
{
	int32_t need = blocks_needed(s, q, n_total);
	if (need > kv_pool_n_available(s->kv))
		return -ENOSPC;
	while (need-- > 0)
		q->table[q->n_blocks++] = kv_pool_alloc(s->kv);
	return 0;
}

/* The hash of Q's block I (hash of the block before it and its tokens),
 * computed once: the block must be full, (I + 1) * bt <= n_tokens. */
static uint64_t chain_hash(struct sched *s, struct seq *q, int32_t i)
{
	while (q->n_chain <= i) {
		int32_t k = q->n_chain;
		q->hashes[k] = kv_pool_hash(s->kv, k ? q->hashes[k - 1] : KV_HASH_ROOT,
					    q->tokens + (size_t)k * s->bt);
		q->n_chain++;
	}
	return q->hashes[i];
}

/* Publishes the blocks Q has filled completely. */
static void publish_full(struct sched *s, struct seq *q)
{
	if (!s->p.prefix_cache)
		return;
	while (q->n_hashed < q->n_blocks && (q->n_hashed + 1) * s->bt <= q->n_computed) {
		int32_t i = q->n_hashed;
		chain_hash(s, q, i);
		kv_pool_publish(s->kv, q->table[i], i ? q->hashes[i - 1] : KV_HASH_ROOT,
				q->tokens + (size_t)i * s->bt);
		q->n_hashed++;
	}
}

/* Takes the longest chain of cached blocks matching Q's tokens, keeping at
 * least one token to compute (its logits are needed).  Returns tokens hit. */
static int32_t attach_prefix(struct sched *s, struct seq *q)
{
	int32_t hit = 0;

	if (!s->p.prefix_cache)
		return 0;
	while ((q->n_blocks + 1) * s->bt <= q->n_tokens - 1) {
		int32_t i = q->n_blocks;
		chain_hash(s, q, i);
		int32_t b = kv_pool_lookup(s->kv, i ? q->hashes[i - 1] : KV_HASH_ROOT,
					   q->tokens + (size_t)i * s->bt);
		if (b < 0)
			break;
		q->table[q->n_blocks++] = b;
		q->n_hashed = q->n_blocks;
		hit += s->bt;
	}
	q->n_computed = hit;
	return hit;
}

/* Whether a running sequence is computing (in this step or a later one) a
 * block the waiting Q could otherwise only compute itself: the first block
 * that sequence has not published yet, when Q's chain of full prompt blocks
 * reaches it with the same hash.  Admitting Q now would compute the same
 * prefix twice; once it is published, Q takes it from the cache.  Held and
 * cancelled sequences make no progress and keep nobody waiting.  A false
 * match (a hash collision) only costs Q a step: hits are still checked
 * token by token. */
static int prefix_in_flight(struct sched *s, struct seq *q)
{
	if (!s->p.prefix_cache)
		return 0;
	for (int32_t i = 0; i < s->n_live; i++) {
		struct seq *r = s->live[i];
		int32_t j = r->n_hashed;
		if (r == q || r->state != SEQ_RUNNING || r->held || r->cancelled ||
		    (j + 1) * s->bt > r->n_tokens || (j + 1) * s->bt > q->n_tokens - 1)
			continue;
		if (chain_hash(s, q, j) == chain_hash(s, r, j))
			return 1;
	}
	return 0;
}

/* ---- planning ---- */

/* Run order: higher priority first, then earlier submission. */
static int before(const struct seq *a, const struct seq *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->order < b->order;
}

static int cmp_run_order(const void *pa, const void *pb)
{
	const struct seq *a = *(struct seq *const *)pa, *b = *(struct seq *const *)pb;
	return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* The running sequence to preempt: lowest priority, most recently admitted,
 * among those with no rows in this step yet. */
static struct seq *pick_victim(struct sched *s)
{
	struct seq *v = NULL;
	for (int32_t i = 0; i < s->n_live; i++) {
		struct seq *q = s->live[i];
		if (q->state != SEQ_RUNNING || q->step_rows || q->cancelled)
			continue;
		if (!v || q->priority < v->priority ||
		    (q->priority == v->priority && q->admit_order > v->admit_order))
			v = q;
	}
	return v;
}

static void preempt(struct sched *s, struct seq *q)
{
	seq_release_blocks(s, q);
	q->preempted_now = 1;
	q->state = SEQ_WAITING;
	q->usage.preemptions++;
	s->c.preemptions++;
}

static void add_rows(struct sched *s, struct seq *q, int32_t n, int32_t *T)
{
	for (int32_t k = 0; k < n; k++) {
		int32_t pos = q->n_computed + q->step_rows + k;
		s->row_token[*T] = q->tokens[pos];
		s->row_pos[*T] = pos;
		s->row_table[*T] = q->table;
		s->row_seq[*T] = q;
		s->row_logits[*T] = pos >= q->n_tokens - 1; /* the last token, and proposals */
		s->plan_work.attended += pos + 1;
		(*T)++;
	}
	q->step_rows += n;
	s->plan_work.context += q->n_computed + q->step_rows; /* once per sequence a step */
}

/* Among waiting requests: the highest priority; within it the client with
 * the fewest running sequences; within that the earliest submitted. */
static struct seq *pick_admission(struct sched *s)
{
	struct seq *best = NULL;
	int32_t best_running = 0;

	for (int32_t i = 0; i < s->n_live; i++) {
		struct seq *q = s->live[i];
		int32_t running = 0;
		if (q->state != SEQ_WAITING || q->cancelled || q->held || q->preempted_now ||
		    q->deferred_now)
			continue;
		for (int32_t j = 0; j < s->n_live; j++)
			running += s->live[j]->state == SEQ_RUNNING && s->live[j]->client == q->client;
		if (!best || q->priority > best->priority ||
		    (q->priority == best->priority &&
		     (running < best_running || (running == best_running && q->order < best->order)))) {
			best = q;
			best_running = running;
		}
	}
	return best;
}

/* Rows Q may take this step: at most N, as far as free blocks reach. */
static int32_t fit_blocks(struct sched *s, struct seq *q, int32_t n)
{
	int32_t reach = (q->n_blocks + kv_pool_n_available(s->kv)) * s->bt - q->n_computed;
	if (n > reach)
		n = reach;
	if (n > 0)
		grow(s, q, q->n_computed + n); /* cannot fail now */
	return n;
}

/* Prompt rows of Q, at most N, that the step-time budget lets into a step
 * of T rows so far.  All N unless sequences decode in this step; else the
 * most that keep the step's predicted time within step_ms, and never
 * beyond twice the biggest step the model has measured (it extrapolates no
 * further).  Whatever the prediction, and while the model has seen too few
 * steps to be trusted, the step's prefill rows make up at least one block
 * (or what is left of the prompt), so a long prompt never starves. */
static int32_t fit_time(struct sched *s, const struct seq *q, int32_t n, int32_t T)
{
	int32_t p0 = q->n_computed + q->step_rows, lo = 0, hi = n, least = s->bt - s->plan_prefill;
	double budget = s->p.step_ms * 1e-3;

	if (!s->timed || n <= 0)
		return n;
	if (stepcost_ready(&s->cost)) {
		int64_t trusted = s->cost.pinned ? INT32_MAX : 2 * (int64_t)s->cost.max_rows;
		if (hi > trusted - T)
			hi = trusted - T > 0 ? (int32_t)(trusted - T) : 0;
		while (lo < hi) { /* the largest fitting m: the cost grows with m */
			int32_t m = lo + (hi - lo + 1) / 2;
			struct stepcost_step st = {
				.rows = T + m,
				.attended = s->plan_work.attended + (int64_t)m * p0 + (int64_t)m * (m + 1) / 2,
				.context = s->plan_work.context + p0 + m,
			};
			if (stepcost_predict(&s->cost, &st) <= budget)
				lo = m;
			else
				hi = m - 1;
		}
	}
	if (lo < least)
		lo = least < n ? least : n;
	if (lo < n)
		s->cut_now = 1;
	return lo;
}

/* ---- speculation ---- */

/* Prompt lookup: finds the longest (then the latest) earlier occurrence of
 * the last tokens of TOK (N of them), SPEC_MAX_MATCH at most and MIN_MATCH
 * at least, and writes the up to LIMIT tokens that followed it to OUT (which
 * may be TOK + N).  Where they run into the end of TOK they go on with
 * themselves: a text repeating with period P proposes its next period.
 * Returns how many, 0 when nothing recurs. */
static int32_t ngram_lookup(const int32_t *tok, int32_t n, int32_t min_match, int32_t limit,
			    int32_t *out)
{
	int32_t best_len = 0, best_end = -1;

	if (n < min_match + 1 || limit < 1)
		return 0;
	for (int32_t j = n - 2; j >= 0 && best_len < SPEC_MAX_MATCH; j--) {
		int32_t len = 0;
		while (len < SPEC_MAX_MATCH && len <= j && tok[j - len] == tok[n - 1 - len])
			len++;
		if (len > best_len) {
			best_len = len;
			best_end = j;
		}
	}
	if (best_len < min_match)
		return 0;
	for (int32_t k = 0; k < limit; k++) {
		int32_t at = best_end + 1 + k;
		out[k] = at < n ? tok[at] : out[at - n];
	}
	return limit;
}

/* The acceptance rate Q has shown: the chance that a proposed token stands,
 * with a prior of one half. */
static double spec_rate(const struct seq *q)
{
	return (q->spec_ok + 1) / (q->spec_all + 2);
}

/* Learns from a verification (or a proposal judged without rows) where
 * ACCEPTED of PROPOSED tokens stood. */
static void spec_learn(struct seq *q, int32_t accepted, int32_t proposed)
{
	q->spec_ok = q->spec_ok * SPEC_DECAY + accepted;
	q->spec_all = q->spec_all * SPEC_DECAY + accepted + (accepted < proposed);
}

/* The cost model's time for a step of N_DEC decode rows reading CONTEXT
 * positions: what the step's tokens cost without proposals.  0 while the
 * model cannot tell. */
static double decode_step_s(const struct sched *s, int32_t n_dec, int64_t context)
{
	struct stepcost_step st = { .rows = n_dec, .attended = context, .context = context };
	return stepcost_ready(&s->cost) ? stepcost_predict(&s->cost, &st) : 0;
}

/* What a proposed row must be worth to be run, as a chance of standing:
 * the step's tokens per second (N_DEC tokens in T0 seconds, decode_step_s)
 * against the cost-model price of one more row at position POS, plus
 * EXTRA_S (a share of the draft's steps).  A row whose expected tokens over
 * its price fall short of what the step makes anyway lowers the
 * throughput.  A batch that is compute-bound sets the bar high; a lone
 * memory-bound decode, low.  Where the cost model cannot price a row yet
 * (cold; for a lone decode, also before SPEC_EXPLORE steps of a few rows)
 * a lone decode gets SPEC_THRESH_COLD, and a batch a bar no row clears. */
static double spec_threshold(const struct sched *s, double t0, int32_t n_dec, int32_t pos,
			     double extra_s)
{
	double row = s->cost.coef.row_s + s->cost.coef.pos_s * (pos + 1);

	if (t0 <= 0 || (n_dec == 1 && stepcost_seen(&s->cost, 2, 1 + SCHED_SPEC_MAX_DRAFT) <
					      SPEC_EXPLORE))
		return n_dec == 1 ? SPEC_THRESH_COLD : INFINITY;
	return (SPEC_ROW_PREMIUM * row + extra_s) * n_dec / t0;
}

/* How many of the (at most LIMIT) tokens Q could propose are worth a row:
 * those whose chance of standing, the rate to the power of their place,
 * clears THRESH. */
static int32_t spec_count(const struct seq *q, int32_t limit, double thresh)
{
	int32_t k = 0;
	double a = spec_rate(q), pa = 1;

	if (limit > q->spec_max)
		limit = q->spec_max;
	while (k < limit && (pa *= a) >= thresh)
		k++;
	return k;
}

/* Tokens decoding Q proposes this step by prompt lookup, written after its
 * tokens: as many as recur (at most LIMIT) and are worth a row at THRESH.
 * Sets Q's guess when none is. */
static int32_t spec_propose(struct sched *s, struct seq *q, int32_t limit, double thresh)
{
	int32_t n, k;

	q->spec_guess = -1;
	if (limit > q->spec_max)
		limit = q->spec_max;
	if (limit < 1 || (n = ngram_lookup(q->tokens, q->n_tokens, s->p.spec_min_match, limit,
					   q->tokens + q->n_tokens)) == 0)
		return 0;
	k = spec_count(q, n, thresh);
	if (k == 0)
		q->spec_guess = q->tokens[q->n_tokens];
	return k;
}

static int draft_grow(struct sched *s, struct seq *q, int32_t n);

/* Tokens decoding Q will have the draft propose this step (at most LIMIT),
 * priced against the step's tokens per second (N_DEC tokens in T0 seconds,
 * decode_step_s): as many as are worth a row and a draft row at the
 * threshold, where what they are expected to gain over SPEC_HORIZON steps
 * also pays for the draft's catch-up on the tokens Q generated since the
 * draft last ran on it (its prompt, once, is not priced: an investment).
 * And where a proposal sure to stand would pay so, one every
 * SPEC_PROBE_EVERY tokens all the same, so that a low rate is tried again.
 * None when the draft's pool cannot hold them.  Q joins the step's
 * drafting sequences (N_DDEC decoding ones may), its draft blocks taken
 * now.  Their places after Q's tokens hold Q's last token until the draft
 * runs: a valid id, so that a draft step that fails leaves rows that are
 * judged like any proposal. */
static int32_t draft_plan(struct sched *s, struct seq *q, int32_t limit, double t0, int32_t n_dec,
			  int32_t n_ddec)
{
	/* Until the draft's steps have been measured, its proposals are taken
	 * to cost nothing, so that they are run and measured, and its catching
	 * up as much as the model's rows. */
	static const struct stepcost_coef unknown;
	int measured = stepcost_ready(&s->dcost);
	const struct stepcost_coef *c = measured ? &s->dcost.coef : &unknown;
	const struct stepcost_coef *cc = measured ? &s->dcost.coef : &s->cost.coef;
	/* a proposal's draft row: the row, the positions it attends to and
	 * reads, and a share of the step */
	double thresh = spec_threshold(s, t0, n_dec, q->n_tokens,
				       c->row_s + (c->pos_s + c->ctx_s) * (q->n_tokens + 1) +
				       c->base_s / n_ddec);
	int32_t seen = q->d_computed > q->n_prompt ? q->d_computed : q->n_prompt;
	int32_t lag = q->n_tokens - seen - 2; /* a proposing step catches up on 1 or 2 */
	int32_t k = spec_count(q, limit, thresh);
	double catch_up = 0, gain = 0, a = spec_rate(q), pa = 1;

	if (lag > 0 && t0 > 0)
		catch_up = lag * (cc->row_s + cc->pos_s * q->n_tokens) * n_dec / t0;
	for (int32_t i = 0; i < k; i++)
		gain += (pa *= a) - thresh;
	if (gain * SPEC_HORIZON < catch_up)
		k = 0;
	if (k == 0 && limit >= 1 && q->spec_max >= 1 && q->n_gen % SPEC_PROBE_EVERY == 0 &&
	    (1 - thresh) * SPEC_HORIZON > catch_up)
		k = 1;
	if (k == 0)
		return 0;
	s->d_seqs[s->n_dseqs++] = q; /* before draft_grow: its own draft KV stays */
	if (draft_grow(s, q, q->n_tokens + k - 1) < 0) {
		s->n_dseqs--;
		return 0;
	}
	for (int32_t i = 0; i < k; i++)
		q->tokens[q->n_tokens + i] = q->tokens[q->n_tokens - 1];
	return k;
}

/* Makes room for the logits of proposed rows: 0, or -ENOMEM (no proposals
 * then). */
static int spec_room(struct sched *s)
{
	int32_t cap = s->p.max_seqs + SPEC_MAX_ROWS;
	float *nl;

	if (s->cap_logits >= cap)
		return 0;
	if (!(nl = realloc(s->logits, (size_t)cap * s->m->hp.n_vocab * sizeof *nl)))
		return -ENOMEM;
	s->logits = nl;
	s->cap_logits = cap;
	return 0;
}

/* Fills the step's rows; returns T. */
static int32_t plan(struct sched *s)
{
	int32_t T = 0, budget = s->p.max_batched_tokens, running = 0, n_run = 0;
	struct seq **run = s->run;

	s->timed = s->cut_now = 0;
	s->plan_work = (struct stepcost_step){ 0 };
	s->plan_prefill = 0;

	for (int32_t i = 0; i < s->n_live; i++) {
		s->live[i]->step_rows = 0;
		s->live[i]->preempted_now = 0;
		s->live[i]->deferred_now = 0;
		s->live[i]->n_draft = 0;
		if (s->live[i]->state == SEQ_RUNNING)
			run[n_run++] = s->live[i];
	}
	qsort(run, (size_t)n_run, sizeof *run, cmp_run_order);

	/* 1. one decode token per running sequence, preempting when blocks run
	 * out, and the tokens it proposes where they are worth their rows and
	 * free blocks, the budget and the logits' room allow */
	int32_t n_dec = 0, n_ddec = 0, spec_left = 0;
	int64_t dec_ctx = 0;
	double t_dec;
	s->n_dseqs = 0;
	for (int32_t i = 0; i < n_run; i++) {
		struct seq *q = run[i];
		if (q->held || q->n_tokens - q->n_computed != 1)
			continue;
		n_dec++;
		n_ddec += q->spec == SCHED_SPEC_DRAFT;
		dec_ctx += q->n_tokens;
		if (q->spec != SCHED_SPEC_OFF && !spec_left && spec_room(s) == 0)
			spec_left = SPEC_MAX_ROWS;
	}
	t_dec = spec_left ? decode_step_s(s, n_dec, dec_ctx) : 0;
	for (int32_t i = 0, dec_left = n_dec; i < n_run && budget > 0; i++) {
		struct seq *q = run[i];
		int32_t limit;
		if (q->state != SEQ_RUNNING || q->held || q->n_tokens - q->n_computed != 1)
			continue;
		dec_left--;
		while (grow(s, q, q->n_tokens) < 0) {
			struct seq *v = pick_victim(s);
			preempt(s, v && v != q ? v : q);
			if (!v || v == q)
				break;
		}
		if (q->state != SEQ_RUNNING)
			continue;
		if (q->spec != SCHED_SPEC_OFF) {
			/* room for what it proposes and the token after them: max_tokens,
			 * the context, the free blocks (never preempting for them), the
			 * step's rows (one kept for each decode after it) */
			limit = q->max_tokens - q->n_gen - 1;
			if (limit > s->n_ctx - q->n_tokens)
				limit = s->n_ctx - q->n_tokens;
			if (limit > (q->n_blocks + kv_pool_n_available(s->kv)) * s->bt - q->n_tokens)
				limit = (q->n_blocks + kv_pool_n_available(s->kv)) * s->bt - q->n_tokens;
			if (limit > budget - 1 - dec_left)
				limit = budget - 1 - dec_left;
			if (limit > spec_left)
				limit = spec_left;
			if (q->spec == SCHED_SPEC_NGRAM)
				q->n_draft = spec_propose(s, q, limit,
							  spec_threshold(s, t_dec, n_dec, q->n_tokens, 0));
			else
				q->n_draft = draft_plan(s, q, limit, t_dec, n_dec, n_ddec);
			grow(s, q, q->n_tokens + q->n_draft); /* cannot fail now */
			spec_left -= q->n_draft;
		}
		q->row0 = T;
		add_rows(s, q, 1 + q->n_draft, &T);
		s->c.decode_rows++;
		budget -= 1 + q->n_draft;
	}
	s->timed = s->p.step_ms > 0 && T > 0;
	/* 2. prompts already being prefilled continue, as far as blocks and
	 * the time budget allow */
	for (int32_t i = 0; i < n_run && budget > 0; i++) {
		struct seq *q = run[i];
		int32_t n;
		if (q->state != SEQ_RUNNING || q->held || q->step_rows || q->n_tokens - q->n_computed <= 1)
			continue;
		n = fit_time(s, q, q->n_tokens - q->n_computed < budget ? q->n_tokens - q->n_computed : budget, T);
		n = fit_blocks(s, q, n);
		if (n <= 0)
			continue;
		add_rows(s, q, n, &T);
		s->c.prefill_rows += (uint64_t)n;
		s->plan_prefill += n;
		budget -= n;
	}
	for (int32_t i = 0; i < s->n_live; i++)
		running += s->live[i]->state == SEQ_RUNNING;
	/* 3. admit waiting requests while budget, sequence slots and blocks last;
	 * one whose next prompt block a running sequence is computing waits a
	 * step and then finds it in the prefix cache */
	while (budget > 0 && running < s->p.max_seqs) {
		struct seq *q = pick_admission(s);
		int32_t n, hit;
		if (!q)
			break;
		if (prefix_in_flight(s, q)) {
			q->deferred_now = 1;
			s->c.prefix_waits++;
			continue;
		}
		hit = attach_prefix(s, q);
		n = q->n_tokens - q->n_computed;
		n = fit_time(s, q, n < budget ? n : budget, T);
		n = fit_blocks(s, q, n);
		if (n <= 0) {
			seq_release_blocks(s, q); /* wait for blocks or the next step */
			break;
		}
		q->state = SEQ_RUNNING;
		q->admit_order = s->next_admit++;
		if (!q->admitted_once) {
			q->admitted_once = 1;
			q->t_admit = clock_s();
			q->usage.queue_s = q->t_admit - q->t_submit;
			q->usage.cached_tokens = hit;
		}
		s->c.prefix_hit_tokens += (uint64_t)hit;
		running++;
		add_rows(s, q, n, &T);
		s->c.prefill_rows += (uint64_t)n;
		s->plan_prefill += n;
		budget -= n;
	}
	return T;
}

/* The tokens Q may still produce after the one being sampled: max_tokens,
 * the context and the pool's blocks bound it. */
static uint32_t tokens_after(const struct sched *s, const struct seq *q)
{
	int64_t left = (int64_t)q->max_tokens - q->n_gen;
	int64_t ctx = (int64_t)s->n_ctx - q->n_tokens;
	int64_t blocks = (int64_t)s->kv->view.n_blocks * s->bt - q->n_tokens;

	if (ctx < left)
		left = ctx;
	if (blocks < left)
		left = blocks;
	return left > 1 ? (uint32_t)(left - 1) : 0;
}

/* Accepts TOK, which Q's sampler drew under the grammar's mask, into Q's
 * grammar if the grammar can still end in the tokens left after it; else
 * draws again among the tokens that leave it room, so that a constrained
 * output ends complete whenever its budget holds the shortest completion
 * (a JSON string closes, objects get their required keys, just in time).
 * Where no token fits (the budget is short of the shortest completion from
 * the start) the first draw stands and the output is cut.  Returns the token
 * taken, *RC the grammar's verdict. */
static int32_t grammar_pick(struct sched *s, struct seq *q, const float *lg, int32_t tok,
			    float *lp, int *rc)
{
	uint32_t budget = tokens_after(s, q);
	int32_t again;
	int n;

	if ((*rc = grammar_state_accept_within(q->gram, tok, budget)) != -ERANGE)
		return tok;
	n = grammar_state_mask_within(q->gram, q->mask, budget);
	if (n > 0) {
		again = sampler_sample_masked(q->smp, lg, q->mask, q->logprobs ? lp : NULL,
					      q->n_top_want, q->top_ids, q->top_lps, &q->n_top);
		if (again < 0)
			return again;
		tok = again;
	}
	*rc = grammar_state_accept(q->gram, tok);
	return tok;
}

/* ---- the step ---- */

static void emit_token(struct sched *s, struct seq *q, int32_t tok, float logprob, int *ret_stop)
{
	char piece[PIECE_MAX], safe[PIECE_MAX + STOPSTR_MAX_LEN];
	size_t n_safe = 0;
	int n;

	n = detok_push(s->m->tok, &q->dt, tok, 0, piece, sizeof piece);
	*ret_stop = stopstr_feed(q->stop, piece, n > 0 ? (size_t)n : 0, safe, sizeof safe, &n_safe) == 1;
	struct sched_event ev = { .kind = SCHED_EV_TOKEN, .id = q->id, .token = tok,
				  .logprob = logprob, .text = safe, .text_len = n_safe, .n_top = q->n_top,
				  .top_ids = q->top_ids, .top_logprobs = q->top_lps };
	s->fn(s->ctx, &ev);
}

static void fail_all(struct sched *s, int err)
{
	while (s->n_live > 0)
		seq_finish(s, s->live[0], SCHED_FIN_ERROR, err, "the forward pass failed");
}

/* ---- the draft model ---- */

static int32_t argmax(const float *v, int32_t n)
{
	int32_t best = 0;
	for (int32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

/* Draft blocks for Q to hold positions below N: taken from the free ones,
 * else from sequences not drafting in this step (their draft KV is
 * recomputed when they draft again).  0 or -ENOSPC.  Planning. */
static int draft_grow(struct sched *s, struct seq *q, int32_t n)
{
	int32_t need = (n + s->dbt - 1) / s->dbt - q->d_nblocks;

	for (int32_t i = 0; i < s->n_live && need > kv_pool_n_available(s->dkv); i++) {
		struct seq *o = s->live[i];
		int drafting = 0;
		for (int32_t k = 0; k < s->n_dseqs && !drafting; k++)
			drafting = s->d_seqs[k] == o;
		if (!drafting)
			draft_release(s, o);
	}
	if (need > kv_pool_n_available(s->dkv))
		return -ENOSPC;
	while (need-- > 0)
		q->dtable[q->d_nblocks++] = kv_pool_alloc(s->dkv);
	return 0;
}

/* Runs the draft's rows so far (N of them) and takes the token of each
 * flagged one, the next proposal of its sequence: the greedy one, or for a
 * request that draws, a draw with the draft's copy of its sampler.  That copy
 * draws with the random numbers the request's own draws in the verifying
 * step will take (draft_run), so where the two models agree closely the two
 * draws agree too, and the proposal stands.  0 or the engine's negative
 * errno. */
static int draft_flush(struct sched *s, int32_t n)
{
	int32_t nv = s->m->hp.n_vocab, li = 0;
	struct engine_batch b = { n, s->d_token, s->d_pos, s->d_table, s->d_flag };
	struct stepcost_step st = { .rows = n };
	double t0 = clock_s();
	int r;

	if (n == 0)
		return 0;
	if ((r = engine_step(s->de, &b, s->d_logits)) < 0)
		return r;
	s->c.draft_steps++;
	s->c.draft_rows += (uint64_t)n;
	for (int32_t t = 0; t < n; t++) {
		struct seq *q = s->d_row_seq[t];
		const float *lg = s->d_logits + (size_t)li * nv;
		int32_t tok = -1;
		if (!s->d_flag[t])
			continue;
		li++;
		if (q->dsmp && (tok = sampler_sample(q->dsmp, lg, NULL)) >= 0)
			sampler_accept(q->dsmp, tok);
		q->tokens[s->d_pos[t] + 1] = tok >= 0 ? tok : argmax(lg, nv);
	}
	/* a sequence's rows are consecutive: its last one reads its context */
	for (int32_t t = 0; t < n; t++) {
		st.attended += s->d_pos[t] + 1;
		if (t == n - 1 || s->d_row_seq[t + 1] != s->d_row_seq[t])
			st.context += s->d_pos[t] + 1;
	}
	stepcost_add(&s->dcost, &st, clock_s() - t0);
	return 0;
}

/* Has the draft propose the tokens the step's drafting sequences planned
 * (draft_plan, which took their draft blocks): it catches up on each one's
 * tokens (its KV kept from the steps before, cut back to what the model
 * accepted), in steps of at most d_rows rows, which give each one's first
 * proposal; then one step per further proposal, all sequences together.
 * Each proposal is written after the sequence's tokens and into its row of
 * the model's step.  A failed draft step drops the draft KV of those
 * sequences and leaves their rows holding their last token, judged like
 * any proposal. */
static void draft_run(struct sched *s)
{
	int32_t n = 0, most = 0;

	for (int32_t k = 0; k < s->n_dseqs; k++) {
		struct seq *q = s->d_seqs[k];
		if (q->n_draft > most)
			most = q->n_draft;
		/* no copy to be had: greedy proposals, which are only worse ones */
		if (sampler_draws(q->smp) && (q->dsmp ? sampler_copy_state(q->dsmp, q->smp) :
					      sampler_dup(q->smp, &q->dsmp)) < 0) {
			sampler_free(q->dsmp);
			q->dsmp = NULL;
		}
		for (int32_t pos = q->d_computed; pos < q->n_tokens; pos++) {
			if (n == s->d_rows && draft_flush(s, n) < 0)
				goto fail;
			if (n == s->d_rows)
				n = 0;
			s->d_token[n] = q->tokens[pos];
			s->d_pos[n] = pos;
			s->d_table[n] = q->dtable;
			s->d_flag[n] = pos == q->n_tokens - 1;
			s->d_row_seq[n++] = q;
		}
	}
	if (draft_flush(s, n) < 0)
		goto fail;
	for (int32_t j = 1; j < most; j++) {
		n = 0;
		for (int32_t k = 0; k < s->n_dseqs; k++) {
			struct seq *q = s->d_seqs[k];
			if (q->n_draft <= j)
				continue;
			s->d_token[n] = q->tokens[q->n_tokens + j - 1];
			s->d_pos[n] = q->n_tokens + j - 1;
			s->d_table[n] = q->dtable;
			s->d_flag[n] = 1;
			s->d_row_seq[n++] = q;
		}
		if (draft_flush(s, n) < 0)
			goto fail;
	}
	stepcost_fit(&s->dcost);
	for (int32_t k = 0; k < s->n_dseqs; k++) {
		struct seq *q = s->d_seqs[k];
		q->d_computed = q->n_tokens + q->n_draft - 1;
		for (int32_t i = 0; i < q->n_draft; i++)
			s->row_token[q->row0 + 1 + i] = q->tokens[q->n_tokens + i];
	}
	return;
fail:
	/* what the draft's pool holds is unknown now: dropped */
	for (int32_t k = 0; k < s->n_dseqs; k++)
		draft_release(s, s->d_seqs[k]);
	s->n_dseqs = 0;
}

/* Draws Q's next token from its logits LG and takes it: the grammar, the
 * events, the stops.  Returns the token, or -1 when that finished Q (freed
 * then). */
static int32_t take_token(struct sched *s, struct seq *q, const float *lg)
{
	float lp = 0;
	int stop = 0, r = 0;
	int32_t tok;

	if (q->gram && (r = grammar_state_mask(q->gram, q->mask)) <= 0) {
		/* Past a matching limit, or (a bug) nothing allowed. */
		seq_finish(s, q, SCHED_FIN_ERROR, r < 0 ? r : -EINVAL,
			   r == -E2BIG ? "the output grew past the grammar's matching limits "
					 "(too ambiguous or nested too deeply)" :
			   r == -ENOMEM ? "out of memory" : "the grammar allows no token here");
		return -1;
	}
	tok = sampler_sample_masked(q->smp, lg, q->gram ? q->mask : NULL, q->logprobs ? &lp : NULL,
				    q->n_top_want, q->top_ids, q->top_lps, &q->n_top);
	if (tok >= 0 && q->gram)
		tok = grammar_pick(s, q, lg, tok, &lp, &r);
	if (tok < 0 || (q->gram && r < 0)) {
		seq_finish(s, q, SCHED_FIN_ERROR, tok < 0 ? tok : r,
			   tok < 0 ? "out of memory" : "the grammar refused the token it allowed");
		return -1;
	}
	sampler_accept(q->smp, tok);
	q->tokens[q->n_tokens++] = tok;
	q->n_gen++;
	s->c.generated_tokens++;
	if (!q->t_first) {
		q->t_first = clock_s();
		q->usage.prefill_s = q->t_first - q->t_admit;
	}
	/* A grammar allows an end-of-generation token only where it is
	 * complete, and then it ends the request even with ignore_eos. */
	if ((!q->ignore_eos || q->gram) && tokenizer_is_eog(s->m->tok, tok)) {
		struct sched_event ev = { .kind = SCHED_EV_TOKEN, .id = q->id, .token = tok,
					  .logprob = lp, .text = "", .text_len = 0, .n_top = q->n_top,
					  .top_ids = q->top_ids, .top_logprobs = q->top_lps };
		s->fn(s->ctx, &ev);
		seq_finish(s, q, SCHED_FIN_STOP, 0, NULL);
		return -1;
	}
	emit_token(s, q, tok, lp, &stop);
	if (stop || (q->gram && grammar_state_done(q->gram))) {
		seq_finish(s, q, SCHED_FIN_STOP, 0, NULL);
		return -1;
	}
	if (q->n_gen >= q->max_tokens || q->n_tokens >= s->n_ctx ||
	    (q->n_tokens + s->bt - 1) / s->bt > s->kv->view.n_blocks) {
		seq_finish(s, q, SCHED_FIN_LENGTH, 0,
			   q->gram && !grammar_state_can_end(q->gram) ?
			   "the output ended before the grammar was complete (max_tokens or "
			   "the context)" : NULL);
		return -1;
	}
	return tok;
}

int sched_step(struct sched *s)
{
	int32_t T, n_vocab = s->m->hp.n_vocab, li = 0, seqs = 0;
	int r;

	for (int32_t i = 0; i < s->n_live;) {
		struct seq *q = s->live[i];
		if (q->cancelled)
			seq_finish(s, q, SCHED_FIN_CANCELLED, 0, NULL);
		else
			i++;
	}
	T = plan(s);
	/* Running prefills can hold every block between them and all stall:
	 * free the newest lowest-priority one's blocks and plan again.  Held
	 * requests alone are no stall: they wait for their client. */
	int32_t unheld = 0;
	for (int32_t i = 0; i < s->n_live; i++)
		unheld += !s->live[i]->held;
	for (int32_t tries = 0; T == 0 && unheld && tries < s->n_live; tries++) {
		struct seq *v = pick_victim(s);
		if (!v)
			break;
		preempt(s, v);
		T = plan(s);
	}
	if (T == 0)
		return 0;

	if (s->n_dseqs)
		draft_run(s);
	struct engine_batch b = { T, s->row_token, s->row_pos, s->row_table, s->row_logits };
	s->plan_work.rows = T;
	double pred = stepcost_ready(&s->cost) ? stepcost_predict(&s->cost, &s->plan_work) : 0;
	double t0 = clock_s();
	r = engine_step(s->e, &b, s->logits);
	if (r < 0) {
		fail_all(s, r);
		return r;
	}
	double dt = clock_s() - t0;
	s->c.steps++;
	s->c.step_rows += (uint64_t)T;
	s->c.last_step_rows = T;
	s->c.last_step_s = dt;
	s->c.last_step_pred_s = pred;
	s->c.budget_cuts += (uint64_t)s->cut_now;
	s->c.budget_overruns += s->timed && dt * 1e3 > s->p.step_ms;
	/* The next plan needs a fresh fit under a budget that steps come near
	 * (an eighth of it) and while the model is young; steps far shorter
	 * (a GPU's) need none, and the fit would cost them a percent. */
	stepcost_add(&s->cost, &s->plan_work, dt);
	if (s->c.steps % REFIT_EVERY == 0 || s->cost.samples <= REFIT_EVERY ||
	    (s->p.step_ms > 0 && dt * 8e3 >= s->p.step_ms))
		stepcost_fit(&s->cost);

	/* Commit the computed positions (of a sequence that proposed, only its
	 * last token's until the proposals are judged), publish full blocks,
	 * then sample for every row that produced logits (in row order). */
	for (int32_t t = 0; t < T; t++) {
		struct seq *q = s->row_seq[t];
		if (t > 0 && s->row_seq[t - 1] == q)
			continue;
		seqs++;
		q->n_computed += q->step_rows - q->n_draft;
		publish_full(s, q);
	}
	s->c.last_step_seqs = seqs;
	for (int32_t t = 0; t < T; t++) {
		struct seq *q = s->row_seq[t];
		int32_t n_draft, base, guess, accepted = 0, draft[SCHED_SPEC_MAX_DRAFT];
		int32_t tok = 0;

		if (!s->row_logits[t])
			continue;
		/* rows t .. t + n_draft: the last token's logits, then each proposal's */
		n_draft = q->n_draft;
		base = q->n_tokens;
		guess = q->spec_guess;
		memcpy(draft, q->tokens + base, (size_t)n_draft * sizeof *draft);
		q->usage.spec_steps += n_draft > 0;
		q->usage.spec_proposed += n_draft;
		for (int32_t j = 0; j <= n_draft; j++) {
			tok = take_token(s, q, s->logits + (size_t)(li + j) * n_vocab);
			if (tok < 0 || j == n_draft || tok != draft[j])
				break;
			accepted++;
			q->usage.spec_accepted++; /* before a later token finishes it */
		}
		li += n_draft + 1;
		t += n_draft;
		s->c.spec_steps += n_draft > 0;
		s->c.spec_proposed += (uint64_t)n_draft;
		s->c.spec_accepted += (uint64_t)accepted;
		if (tok < 0)
			continue; /* finished, its blocks freed */
		if (n_draft) {
			/* The accepted proposals' KV stands; the rest is dropped with the
			 * blocks only they reached. */
			spec_learn(q, accepted, n_draft);
			q->n_computed = base + accepted;
			while (q->n_blocks > (q->n_tokens + s->bt - 1) / s->bt)
				kv_pool_unref(s->kv, q->table[--q->n_blocks]);
			if (q->d_computed > q->n_computed) /* the draft saw what was rejected */
				q->d_computed = q->n_computed;
			publish_full(s, q);
			q->n_draft = 0;
		} else if (guess >= 0) {
			spec_learn(q, tok == guess, 1);
		}
	}
	return T;
}

/* ---- introspection ---- */

void sched_counters(const struct sched *s, struct sched_counters *ret)
{
	*ret = s->c;
	ret->step_ms = s->p.step_ms;
	ret->cost_base_s = s->cost.coef.base_s;
	ret->cost_row_s = s->cost.coef.row_s;
	ret->cost_pos_s = s->cost.coef.pos_s;
	ret->cost_ctx_s = s->cost.coef.ctx_s;
	ret->cost_samples = s->cost.samples;
	ret->pool_blocks = s->kv->view.n_blocks;
	ret->block_tokens = s->bt;
	ret->used_blocks = s->kv->n_used;
	ret->cached_blocks = s->kv->n_cached;
	ret->prefix_lookups = s->kv->lookups;
	ret->draft_pool_blocks = s->dkv ? s->dkv->view.n_blocks : 0;
	ret->draft_used_blocks = s->dkv ? s->dkv->n_used : 0;
	ret->evictions = s->kv->evictions;
	ret->waiting = ret->running = 0;
	ret->wasted_slots = 0;
	for (int32_t i = 0; i < s->n_live; i++) {
		const struct seq *q = s->live[i];
		if (q->state == SEQ_RUNNING) {
			ret->running++;
			ret->wasted_slots += q->n_blocks * s->bt - q->n_computed;
		} else {
			ret->waiting++;
		}
	}
}

void sched_pin_cost(struct sched *s, const struct stepcost_coef *coef)
{
	stepcost_pin(&s->cost, coef);
}

void sched_pin_draft_cost(struct sched *s, const struct stepcost_coef *coef)
{
	stepcost_pin(&s->dcost, coef);
}

/* Q's info but its queue position (0 here). */
static void fill_info(const struct seq *q, struct sched_info *in)
{
	*in = (struct sched_info){ 0 };
	if (q->state == SEQ_RUNNING)
		in->state = q->n_computed < q->n_prompt ? SCHED_ST_PREFILL : SCHED_ST_DECODE;
	else
		in->state = q->admitted_once ? SCHED_ST_PREEMPTED : SCHED_ST_QUEUED;
	in->held = q->held;
	in->priority = q->priority;
	in->prompt_tokens = q->n_prompt;
	in->computed_tokens = q->n_computed;
	in->generated_tokens = q->n_gen;
	in->blocks = q->n_blocks;
}

int sched_info(const struct sched *s, uint64_t id, struct sched_info *ret)
{
	const struct seq *q = find_live(s, id);
	struct sched_info in;

	if (!q)
		return -ENOENT;
	fill_info(q, &in);
	if (q->state != SEQ_RUNNING) {
		in.queue_pos = 1;
		for (int32_t i = 0; i < s->n_live; i++) {
			const struct seq *o = s->live[i];
			in.queue_pos += o != q && o->state == SEQ_WAITING && !o->cancelled && before(o, q);
		}
	}
	*ret = in;
	return 0;
}

int sched_info_each(const struct sched *s, sched_info_fn fn, void *ctx)
{
	struct seq **wait = malloc((size_t)(s->n_live ? s->n_live : 1) * sizeof *wait);
	int32_t n_wait = 0, ahead = 0;
	struct sched_info in;

	if (!wait)
		return -ENOMEM;
	for (int32_t i = 0; i < s->n_live; i++) {
		const struct seq *q = s->live[i];
		if (q->state == SEQ_RUNNING) {
			fill_info(q, &in);
			fn(ctx, q->id, &in);
		} else {
			wait[n_wait++] = s->live[i];
		}
	}
	/* Waiting ones in admission order: each one's position counts the
	 * uncancelled ones before it, as sched_info's does. */
	qsort(wait, (size_t)n_wait, sizeof *wait, cmp_run_order);
	for (int32_t i = 0; i < n_wait; i++) {
		fill_info(wait[i], &in);
		in.queue_pos = ahead + 1;
		ahead += !wait[i]->cancelled;
		fn(ctx, wait[i]->id, &in);
	}
	free(wait);
	return 0;
}

/* The references the blocks of the model's pool (with DRAFT, the draft's)
 * count are the blocks the live requests' tables hold, and the pool's own
 * lists agree. */
static int check_refs(const struct sched *s, int draft, char *err, size_t errlen)
{
	const struct kv_pool *kv = draft ? s->dkv : s->kv;
	const char *what = draft ? "draft " : "";
	int32_t n = kv->view.n_blocks;
	uint32_t *owners = calloc((size_t)n, sizeof *owners);
	int r = 0;

	if (!owners) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int32_t i = 0; i < s->n_live && r == 0; i++) {
		const struct seq *q = s->live[i];
		const int32_t *table = draft ? q->dtable : q->table;
		for (int32_t k = 0; k < (draft ? q->d_nblocks : q->n_blocks) && r == 0; k++) {
			int32_t b = table[k];
			if (b < 0 || b >= n) {
				snprintf(err, errlen, "request %llu: %sblock id %d out of range",
					 (unsigned long long)q->id, what, b);
				r = -EUCLEAN;
			} else {
				owners[b]++;
			}
		}
	}
	for (int32_t b = 0; b < n && r == 0; b++)
		if (owners[b] != kv_pool_refs(kv, b)) {
			snprintf(err, errlen, "%sblock %d: %u references held by requests, pool counts %u",
				 what, b, owners[b], kv_pool_refs(kv, b));
			r = -EUCLEAN;
		}
	free(owners);
	return r == 0 ? kv_pool_check(kv, err, errlen) : r;
}

int sched_check(const struct sched *s, char *err, size_t errlen)
{
	int r = 0;

	for (int32_t i = 0; i < s->n_live && r == 0; i++) {
		const struct seq *q = s->live[i];
		if (q->state == SEQ_WAITING && (q->n_blocks || q->n_computed || q->d_nblocks)) {
			snprintf(err, errlen, "waiting request %llu holds %d blocks, %d of the draft's",
				 (unsigned long long)q->id, q->n_blocks, q->d_nblocks);
			r = -EUCLEAN;
		}
		if (q->n_computed > q->n_tokens || q->n_computed > q->n_blocks * s->bt ||
		    q->n_tokens > q->n_prompt + q->max_tokens) {
			snprintf(err, errlen, "request %llu: computed %d of %d tokens with %d blocks",
				 (unsigned long long)q->id, q->n_computed, q->n_tokens, q->n_blocks);
			r = -EUCLEAN;
		}
		if (q->n_hashed > q->n_chain || q->n_hashed > q->n_blocks ||
		    q->n_chain * s->bt > q->n_tokens) {
			snprintf(err, errlen, "request %llu: %d blocks published of %d held, %d hashed "
				 "for %d tokens", (unsigned long long)q->id, q->n_hashed, q->n_blocks,
				 q->n_chain, q->n_tokens);
			r = -EUCLEAN;
		}
		if (s->dkv && (q->d_computed > q->n_tokens || q->d_computed > q->d_nblocks * s->dbt)) {
			snprintf(err, errlen, "request %llu: draft KV of %d tokens in %d blocks, %d tokens",
				 (unsigned long long)q->id, q->d_computed, q->d_nblocks, q->n_tokens);
			r = -EUCLEAN;
		}
	}
	if (r == 0)
		r = check_refs(s, 0, err, errlen);
	if (r == 0 && s->dkv)
		r = check_refs(s, 1, err, errlen);
	return r;
}
