/* test_conf.c - llmd.conf's options and their messages:
 *  - defaults pass conf_check, and --print-config lists every option;
 *  - a value outside a list names the values allowed;
 *  - a misspelt option (or one in the wrong section) names the option meant;
 *  - requests_per_connection over requests_per_uid says which one to change;
 *  - the hardening limits (admin_connections, output_kib, the timeouts)
 *    parse with their ranges;
 *  - [models] NAME = PATH adds, replaces and drops models, NAME.pinned and
 *    NAME.keep_alive_s set theirs, and bad names, an eighth model and the
 *    default model's name are refused; [memory] parses;
 *  - [spec] parses with its choices and ranges.
 */
#include <errno.h>

#include "conf.h"
#include "testutil.h"

static void expect_error(const char *assignment, const char *says)
{
	struct llmd_conf c;
	char err[512] = "";

	conf_default(&c);
	CHECK(conf_set(&c, assignment, err, sizeof err) < 0);
	if (!strstr(err, says))
		fprintf(stderr, "%s: '%s' does not say '%s'\n", assignment, err, says);
	CHECK(strstr(err, says) != NULL);
}

int main(void)
{
	struct llmd_conf c;
	char err[512] = "";

	conf_default(&c);
	CHECK(conf_set(&c, "model.path=/x.gguf", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), 0);

	expect_error("kv.type=q4_0", "'q4_0' is not one of f16, f32, q8_0");
	expect_error("device.backend=gpu", "is not one of auto, cpu, cuda");
	expect_error("kv.blok_tokens=32", "unknown option kv.blok_tokens (did you mean kv.block_tokens?)");
	expect_error("server.max_tokens=9", "(did you mean limits.max_tokens?)");
	expect_error("limits.idle_timeout=5", "(did you mean limits.idle_timeout_s?)");
	expect_error("zzz.qqqqqqqq=1", "unknown option zzz.qqqqqqqq (llmd --print-config lists them all)");
	expect_error("limits.output_kib=8", "not an integer in 16..65536");
	expect_error("limits.admin_connections=-1", "not an integer in 0..1024");
	/* [spec] */
	expect_error("spec.mode=eagle", "'eagle' is not one of off, ngram, draft");
	expect_error("spec.max_draft=17", "not an integer in 1..16");
	expect_error("spec.min_match=0", "not an integer in 1..64");
	conf_default(&c);
	CHECK(!strcmp(c.spec_mode, "off") && c.spec_max_draft == 8 && c.spec_min_match == 2);
	CHECK(conf_set(&c, "spec.mode=ngram", err, sizeof err) == 0 && !strcmp(c.spec_mode, "ngram"));
	CHECK(conf_set(&c, "spec.max_draft=4", err, sizeof err) == 0 && c.spec_max_draft == 4);
	CHECK(conf_set(&c, "model.path=/x.gguf", err, sizeof err) == 0);
	CHECK(conf_set(&c, "spec.mode=draft", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), -EINVAL);
	CHECK(strstr(err, "spec.mode = draft needs spec.draft_model") != NULL);
	CHECK(conf_set(&c, "spec.draft_model=/d.gguf", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), 0);

	conf_default(&c);
	CHECK(conf_set(&c, "model.path=/x.gguf", err, sizeof err) == 0);
	CHECK(conf_set(&c, "limits.requests_per_uid=1", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), -EINVAL);
	CHECK(strstr(err, "lower limits.requests_per_connection to at most 1, or raise "
			  "limits.requests_per_uid") != NULL);

	conf_default(&c);
	CHECK_INT_EQ(c.admin_connections, 16);
	CHECK_INT_EQ(c.output_kib, 256);
	CHECK_INT_EQ(c.hello_timeout_s, 10);
	CHECK_INT_EQ(c.frame_timeout_s, 10);
	CHECK_INT_EQ(c.idle_timeout_s, 0);
	CHECK(conf_set(&c, "limits.idle_timeout_s=600", err, sizeof err) == 0);
	CHECK_INT_EQ(c.idle_timeout_s, 600);

	/* [models] */
	conf_default(&c);
	CHECK(conf_set(&c, "model.path=/m/chat.gguf", err, sizeof err) == 0);
	CHECK(conf_set(&c, "models.coder=/m/coder.gguf", err, sizeof err) == 0);
	CHECK(conf_set(&c, "models.small:1b=/m/a.gguf", err, sizeof err) == 0);
	CHECK(conf_set(&c, "models.small:1b=/m/b.gguf", err, sizeof err) == 0); /* replaced */
	CHECK_INT_EQ(c.n_models, 2);
	CHECK(!strcmp(c.models[1].path, "/m/b.gguf"));
	/* NAME.pinned and NAME.keep_alive_s, the name's own dots kept */
	CHECK(conf_set(&c, "models.small:1b.pinned=yes", err, sizeof err) == 0);
	CHECK(conf_set(&c, "models.coder.keep_alive_s=-1", err, sizeof err) == 0);
	CHECK(c.models[1].pinned == 1 && c.models[0].keep_alive_s == -1 && c.models[1].keep_alive_s == -2);
	CHECK(conf_set(&c, "models.v1.5.pinned=1", err, sizeof err) < 0);
	CHECK(strstr(err, "no model v1.5 = PATH before it") != NULL);
	/* NAME.n_ctx, .pool_tokens, .chat_template: -1 / "" until set */
	CHECK(c.models[0].n_ctx == -1 && c.models[0].pool_tokens == -1 && !c.models[0].chat_template[0]);
	CHECK(conf_set(&c, "models.coder.n_ctx=2048", err, sizeof err) == 0 && c.models[0].n_ctx == 2048);
	CHECK(conf_set(&c, "models.coder.pool_tokens=4096", err, sizeof err) == 0 &&
	      c.models[0].pool_tokens == 4096);
	CHECK(conf_set(&c, "models.coder.chat_template=/t.jinja", err, sizeof err) == 0 &&
	      !strcmp(c.models[0].chat_template, "/t.jinja"));
	/* .draft_model: its own, and enough for spec.mode = draft */
	CHECK(!c.models[0].draft_model[0]);
	CHECK(conf_set(&c, "spec.mode=draft", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), -EINVAL);
	CHECK(strstr(err, "or a models.NAME.draft_model") != NULL);
	CHECK(conf_set(&c, "models.coder.draft_model=/d.gguf", err, sizeof err) == 0 &&
	      !strcmp(c.models[0].draft_model, "/d.gguf") && !strcmp(c.models[0].chat_template, "/t.jinja"));
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), 0);
	CHECK(conf_set(&c, "spec.mode=off", err, sizeof err) == 0);
	CHECK(conf_set(&c, "models.coder.n_ctx=-3", err, sizeof err) < 0);
	CHECK(strstr(err, "not an integer in 0..") != NULL);
	CHECK(conf_set(&c, "models.coder.keep_alive_s=soon", err, sizeof err) < 0);
	CHECK(strstr(err, "not an integer in -1..") != NULL);
	CHECK(conf_set(&c, "memory.budget_mb=4096", err, sizeof err) == 0 && c.budget_mb == 4096);
	CHECK(conf_set(&c, "memory.keep_alive_s=-1", err, sizeof err) == 0 && c.keep_alive_s == -1);
	CHECK(conf_set(&c, "models.coder=", err, sizeof err) == 0);             /* dropped */
	CHECK_INT_EQ(c.n_models, 1);
	CHECK(!strcmp(c.models[0].name, "small:1b"));
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), 0);
	CHECK(conf_set(&c, "models.chat=/m/other.gguf", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), -EINVAL);                 /* the default's name */
	CHECK(strstr(err, "models.chat: that is the default model's name") != NULL);
	CHECK(conf_set(&c, "model.name=main", err, sizeof err) == 0);
	CHECK_INT_EQ(conf_check(&c, err, sizeof err), 0);
	for (int i = 0; i < LLMD_MAX_MODELS - 3; i++) {
		char a[64];
		snprintf(a, sizeof a, "models.m%d=/m/%d.gguf", i, i);
		CHECK(conf_set(&c, a, err, sizeof err) == 0);
	}
	CHECK_INT_EQ(c.n_models, LLMD_MAX_MODELS - 1);
	expect_error("models.a/b=/m/x.gguf", "a model's name is 1..64 letters");
	CHECK(conf_set(&c, "models.one_too_many=/m/x.gguf", err, sizeof err) < 0);
	CHECK(strstr(err, "at most 8 models") != NULL);
	{
		char name[LLMD_MODEL_NAME_MAX + 1];
		conf_model_name_of("/var/lib/x/SmolLM2-135M-Instruct.Q4_1.gguf", name, sizeof name);
		CHECK(!strcmp(name, "SmolLM2-135M-Instruct.Q4_1"));
		conf_model_name_of("/x/my model (v2).gguf", name, sizeof name);
		CHECK(!strcmp(name, "my_model__v2_"));
		CHECK(conf_model_name_ok(name));
	}
	printf("conf: messages name the allowed values, the option meant and the setting to change\n");
	return test_result();
}
