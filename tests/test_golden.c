/* test_golden.c - the engine against llama.cpp's own output on real models.
 *
 * For every case of ../shared/models/golden/greedy-llamacpp.json: the prompt
 * tokenizes to exactly llama.cpp's ids, and greedy decoding with an f32 KV
 * cache gives exactly llama.cpp's ids up to the case's safe horizon (the
 * first near-tie step).  Full logits after "Once upon a time" match the
 * float64 reference within 1e-4 for the F32 files.  Every case runs on the
 * portable C kernels and on the best SIMD path of this CPU.
 */
#include <json-c/json.h>
#include <math.h>

#include "engine.h"
#include "model.h"
#include "quant.h"
#include "testseq.h"
#include "testutil.h"
#include "tokenizer.h"

#define MAX_TOKENS 1024

static struct engine *new_engine(const struct model *m, int32_t n_tokens)
{
	struct engine_params ep;
	struct engine *e = NULL;
	char err[256];

	engine_params_default(&ep);
	ep.kv_type = QT_F32;
	ep.kv_tokens = n_tokens;
	if (engine_new(m, &ep, &e, err, sizeof err) < 0) {
		fprintf(stderr, "engine_new: %s\n", err);
		return NULL;
	}
	return e;
}

static void check_case(json_object *c, const char *models_dir)
{
	const char *rel = json_object_get_string(json_object_object_get(c, "model"));
	const char *prompt = json_object_get_string(json_object_object_get(c, "prompt"));
	json_object *want_prompt = json_object_object_get(c, "prompt_ids");
	json_object *want_gen = json_object_object_get(c, "generated_ids");
	int horizon = json_object_get_int(json_object_object_get(c, "safe_horizon"));
	char path[4096], err[512];
	struct model *m = NULL;
	struct engine *e = NULL;
	int32_t ids[MAX_TOKENS], gen[MAX_TOKENS];
	int n_ids, n_want = (int)json_object_array_length(want_prompt);

	snprintf(path, sizeof path, "%s/%s", models_dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
	n_ids = tokenizer_encode(m->tok, prompt, strlen(prompt), tokenizer_add_bos(m->tok), 1, ids, MAX_TOKENS);
	CHECK_INT_EQ(n_ids, n_want);
	for (int i = 0; i < n_ids && i < n_want; i++)
		if (ids[i] != json_object_get_int(json_object_array_get_idx(want_prompt, (size_t)i))) {
			fprintf(stderr, "%s \"%s\": prompt id %d differs\n", rel, prompt, i);
			test_failures++;
			break;
		}
	if (horizon > (int)json_object_array_length(want_gen))
		horizon = (int)json_object_array_length(want_gen);

	for (int isa = 0; isa < 2; isa++) {
		enum quant_isa used = quant_set_isa(isa == 0 ? QUANT_ISA_SCALAR : quant_isa_best());
		e = new_engine(m, n_ids + horizon + 1);
		int n = e ? tseq_greedy(e, ids, n_ids, horizon, gen) : -1;
		CHECK_INT_EQ(n, horizon);
		for (int i = 0; i < n; i++) {
			int want = json_object_get_int(json_object_array_get_idx(want_gen, (size_t)i));
			if (gen[i] != want) {
				fprintf(stderr, "%s \"%s\" [%s]: step %d of %d: got %d, llama.cpp %d\n", rel, prompt,
					quant_isa_name(used), i, horizon, gen[i], want);
				test_failures++;
				break;
			}
		}
		printf("%-36s %-34.34s %-10s %d tokens compared\n", rel, prompt, quant_isa_name(used), n);
		engine_free(e);
	}
	model_free(m);
}

/* Logits after "Once upon a time" against the float64 reference dump. */
static void check_logits(const char *models_dir, const char *rel, const char *ref)
{
	char path[4096], err[512];
	struct model *m = NULL;
	struct engine *e;
	struct tseq sq = { .n_blocks = 0 };
	int32_t ids[64];
	double worst = 0;
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", models_dir, rel);
	if (model_load(path, &m, err, sizeof err) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		test_failures++;
		return;
	}
	int n = tokenizer_encode(m->tok, "Once upon a time", 16, 1, 0, ids, 64);
	float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
	e = new_engine(m, 64);
	CHECK(e != NULL);
	CHECK_INT_EQ(tseq_feed(e, &sq, ids, n, n, logits), 1);
	snprintf(path, sizeof path, "%s/golden/%s", models_dir, ref);
	f = fopen(path, "r");
	CHECK(f != NULL);
	for (int32_t i = 0; f && i < m->hp.n_vocab; i++) {
		double want;
		if (fscanf(f, "%lf", &want) != 1) {
			fprintf(stderr, "%s: short file\n", path);
			test_failures++;
			break;
		}
		if (fabs(want - logits[i]) > worst)
			worst = fabs(want - logits[i]);
	}
	if (f)
		fclose(f);
	printf("%s: max |logit - reference| = %.3g\n", rel, worst);
	CHECK(worst < 1e-4);
	free(logits);
	engine_free(e);
	model_free(m);
}

int main(void)
{
	const char *golden = test_model_path("golden/greedy-llamacpp.json");
	const char *dir = getenv("LLMD_MODELS_DIR");
	json_object *root;

	if (!golden) {
		printf("SKIP: ../shared/models is absent\n");
		return TEST_SKIP;
	}
	if (!dir)
		dir = "../shared/models";
	root = json_object_from_file(golden);
	CHECK(root && json_object_is_type(root, json_type_array));
	for (size_t i = 0; root && i < json_object_array_length(root); i++)
		check_case(json_object_array_get_idx(root, i), dir);
	json_object_put(root);
	quant_set_isa(quant_isa_best());
	check_logits(dir, "stories260K.gguf", "stories260K.logits.once_upon_a_time.txt");
	check_logits(dir, "derived/TinyStories-656K-f32.gguf", "TinyStories-656K-f32.logits.once_upon_a_time.txt");
	return test_result();
}
