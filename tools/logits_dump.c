/* logits_dump.c - llmd's logits on given token sequences, for
 * tools/accuracy.py: the engine's side of an accuracy comparison with a
 * float64 reference (tools/ref_f64.py) or another engine.
 *
 *   tools/logits-dump MODEL GOLDEN.json STEPS OUT.npy [f32|f16|q8_0] [cpu|cuda]
 *
 * GOLDEN is a JSON array of cases with "prompt_ids" and "generated_ids"
 * (peer-golden's output, llmd's goldens).  For each case, step s < STEPS is
 * the position after its prompt and its first s generated ids, fed to the
 * engine teacher-forced (the same tokens the reference saw); OUT gets the
 * logits as a float32 .npy of shape (cases, STEPS, n_vocab).  The KV cache
 * type defaults to f16, the backend to the CPU.  Not a test: a measuring
 * tool, built with the tree (make tools/logits-dump).
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_pool.h"
#include "model.h"
#include "quant.h"

#define MAX_IDS 4096

/* A .npy v1.0 header for a little-endian float32 array of SHAPE[3]. */
static int npy_header(FILE *f, const long shape[3])
{
	char dict[128];
	int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld, %ld), }",
			 shape[0], shape[1], shape[2]);
	int total = 10 + n + 1, pad = (64 - total % 64) % 64;
	unsigned char pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0 };
	unsigned hl = (unsigned)(n + pad + 1);

	pre[8] = (unsigned char)(hl & 0xff);
	pre[9] = (unsigned char)(hl >> 8);
	if (fwrite(pre, 1, 10, f) != 10 || fwrite(dict, 1, (size_t)n, f) != (size_t)n)
		return -EIO;
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
	return ferror(f) ? -EIO : 0;
}

int main(int argc, char **argv)
{
	struct engine_params ep;
	struct model *m = NULL;
	struct engine *e = NULL;
	char err[512];
	int32_t ids[MAX_IDS], pos[MAX_IDS];
	const int32_t *tab[MAX_IDS];
	int32_t table[MAX_IDS];
	uint8_t want[MAX_IDS];

	if (argc < 5 || argc > 7) {
		fprintf(stderr, "usage: logits-dump MODEL GOLDEN.json STEPS OUT.npy [f32|f16|q8_0] [cpu|cuda]\n");
		return 2;
	}
	const int steps = atoi(argv[3]);
	const char *kv = argc > 5 ? argv[5] : "f16", *bk = argc > 6 ? argv[6] : "cpu";
	json_object *root = json_object_from_file(argv[2]);
	if (!root || !json_object_is_type(root, json_type_array) || steps < 1) {
		fprintf(stderr, "logits-dump: %s: not a JSON array of cases (or STEPS < 1)\n", argv[2]);
		return 2;
	}
	if (model_load(argv[1], &m, err, sizeof err) < 0) {
		fprintf(stderr, "logits-dump: %s: %s\n", argv[1], err);
		return 1;
	}
	engine_params_default(&ep);
	ep.kv_type = strcmp(kv, "f32") == 0 ? QT_F32 : strcmp(kv, "q8_0") == 0 ? QT_Q8_0 : QT_F16;
	ep.backend = strcmp(bk, "cuda") == 0 ? ENGINE_BACKEND_CUDA : ENGINE_BACKEND_CPU;
	ep.kv_tokens = MAX_IDS;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "logits-dump: engine: %s\n", err);
		return 1;
	}
	const long n_cases = (long)json_object_array_length(root), V = m->hp.n_vocab;
	float *logits = malloc((size_t)steps * (size_t)V * sizeof(float));
	FILE *out = fopen(argv[4], "wb");
	const long shape[3] = { n_cases, steps, V };
	if (!logits || !out || npy_header(out, shape) < 0) {
		fprintf(stderr, "logits-dump: %s: %s\n", argv[4], strerror(errno));
		return 1;
	}
	struct kv_pool *pool = engine_kv_pool(e);
	const int32_t bt = pool->view.block_tokens;
	for (long c = 0; c < n_cases; c++) {
		json_object *cs = json_object_array_get_idx(root, (size_t)c);
		json_object *p = json_object_object_get(cs, "prompt_ids"), *g = json_object_object_get(cs, "generated_ids");
		int np = (int)json_object_array_length(p), n = np;
		for (int i = 0; i < np && i < MAX_IDS; i++)
			ids[i] = json_object_get_int(json_object_array_get_idx(p, (size_t)i));
		for (int s = 0; s + 1 < steps && n < MAX_IDS && s < (int)json_object_array_length(g); s++)
			ids[n++] = json_object_get_int(json_object_array_get_idx(g, (size_t)s));
		if (np < 1 || n > MAX_IDS || n - np + 1 < steps) {
			fprintf(stderr, "logits-dump: case %ld: too few generated ids for %d steps\n", c, steps);
			return 1;
		}
		/* one step, rows np-1 .. n-1 want logits (a prefill's arithmetic
		 * per row is its own: the same as decoding them one by one) */
		int32_t nb = (n + bt - 1) / bt;
		for (int32_t b = 0; b < nb; b++)
			table[b] = kv_pool_alloc(pool);
		for (int i = 0; i < n; i++) {
			pos[i] = i;
			tab[i] = table;
			want[i] = i >= np - 1;
		}
		struct engine_batch batch = { n, ids, pos, tab, want };
		int r = engine_step(e, &batch, logits);
		if (r != steps) {
			fprintf(stderr, "logits-dump: case %ld: engine_step: %d\n", c, r);
			return 1;
		}
		for (int32_t b = 0; b < nb; b++)
			kv_pool_unref(pool, table[b]);
		if (fwrite(logits, sizeof(float), (size_t)steps * (size_t)V, out) != (size_t)steps * (size_t)V) {
			fprintf(stderr, "logits-dump: %s: %s\n", argv[4], strerror(errno));
			return 1;
		}
	}
	if (fclose(out) != 0)
		return 1;
	free(logits);
	engine_free(e);
	model_free(m);
	json_object_put(root);
	return 0;
}
