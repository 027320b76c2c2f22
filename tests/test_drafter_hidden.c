/*
 * What the session hands a drafter beyond the context, and training through the public ABI:
 *  - on the real 0.5B model (skipped with a message when absent): every draft request carries the
 *    target's last hidden state at hidden_position = n_context - 2, equal (within float tolerance)
 *    to the hidden state a fresh target computes for that prefix; output_rows · hidden gives the
 *    fresh target's logits; pass_cost has max_tokens + 1 entries starting at 1; the text equals
 *    plain decoding;
 *  - specinfer_drafter_train refuses bad arguments, a drafter with nothing to train, and a target
 *    that a session uses.
 */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "support/models.h"
#include "support/test_util.h"

/* ---- a drafter that checks the hidden state against its own copy of the target ---- */

typedef struct {
  const specinfer_host *host;
  specinfer_host_target fresh; /* a second instance of the target model */
  int32_t vocab, hidden_size;
  float *logits, *hidden, *row;
  int32_t *ctx;
  size_t ctx_cap;
} probe;

/* What the probes saw, for the test to check. */
static struct {
  int proposals, with_hidden, bad_position, bad_cost;
  double max_hidden_diff, max_logit_diff;
} seen;

static void probe_destroy(void *self) {
  probe *p = self;
  if (!p) return;
  if (p->fresh.vtable) p->host->close_target(p->host, &p->fresh);
  free(p->logits);
  free(p->hidden);
  free(p->row);
  free(p->ctx);
  free(p);
}

static specinfer_status probe_begin(void *self, const int32_t *c, size_t n,
                                    specinfer_plugin_error *err) {
  (void)self, (void)c, (void)n, (void)err;
  return SPECINFER_OK;
}

static specinfer_status probe_commit(void *self, const int32_t *t, size_t n,
                                     specinfer_plugin_error *err) {
  (void)self, (void)t, (void)n, (void)err;
  return SPECINFER_OK;
}

/* Runs the fresh target over the whole context: the row of position n - 2 is compared with the
 * request's hidden state, the row of n - 1 gives the one drafted token (its argmax). */
static specinfer_status probe_propose(void *self, const specinfer_draft_request *req,
                                      specinfer_draft *out, specinfer_plugin_error *err) {
  probe *p = self;
  const specinfer_target_vtable *vt = p->fresh.vtable;
  seen.proposals++;
  out->n_nodes = 0;
  out->has_probs = 0;
  if (req->struct_size < sizeof(specinfer_draft_request) || req->n_context < 2) return SPECINFER_OK;
  if (req->n_pass_cost != req->max_tokens + 1 || !req->pass_cost || req->pass_cost[0] != 1.0f)
    seen.bad_cost++;
  if (!req->hidden) return SPECINFER_OK;
  seen.with_hidden++;
  if (req->hidden_position != (int64_t)req->n_context - 2 || req->hidden_size != p->hidden_size)
    seen.bad_position++;

  const int32_t n = (int32_t)req->n_context;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  for (int32_t i = 0; i < n; ++i) pos[i] = i;
  specinfer_status rc = vt->kv_truncate(p->fresh.self, 0, err);
  specinfer_forward_batch b = {.struct_size = sizeof(b),
                               .n_tokens = n,
                               .tokens = req->context,
                               .positions = pos,
                               .n_logits = 2,
                               .logits = p->logits,
                               .hidden = p->hidden};
  if (rc == SPECINFER_OK) rc = vt->forward(p->fresh.self, &b, err);
  free(pos);
  if (rc != SPECINFER_OK) return rc;
  const int32_t E = p->hidden_size;
  for (int32_t i = 0; i < E; ++i) {
    double d = fabs((double)req->hidden[i] - p->hidden[i]);
    if (d > seen.max_hidden_diff) seen.max_hidden_diff = d;
  }
  /* The committed token's logit from output_rows · hidden, against the fresh target's. */
  const int32_t tok = req->context[n - 1];
  rc = vt->output_rows(p->fresh.self, &tok, 1, p->row, err);
  if (rc != SPECINFER_OK) return rc;
  double dot = 0;
  for (int32_t i = 0; i < E; ++i) dot += (double)p->row[i] * p->hidden[i];
  /* Relative: the target's matmul rounds the hidden state to 8-bit blocks first. */
  double d = fabs(dot - p->logits[tok]) / (1.0 + fabs(p->logits[tok]));
  if (d > seen.max_logit_diff) seen.max_logit_diff = d;

  const float *next = p->logits + p->vocab;
  int32_t best = 0;
  for (int32_t v = 1; v < p->vocab; ++v)
    if (next[v] > next[best]) best = v;
  out->tokens[0] = best;
  out->parents[0] = -1;
  out->n_nodes = 1;
  return SPECINFER_OK;
}

static const specinfer_drafter_vtable probe_vtable = {sizeof(specinfer_drafter_vtable),
                                                      probe_destroy,
                                                      probe_begin,
                                                      probe_propose,
                                                      probe_commit,
                                                      NULL};

static specinfer_status probe_create(const specinfer_host *host, const char *config,
                                     const specinfer_model_info *info,
                                     const specinfer_host_target *target, void **self,
                                     const specinfer_drafter_vtable **vt,
                                     specinfer_plugin_error *err) {
  (void)target;
  probe *p = calloc(1, sizeof(probe));
  p->host = host;
  p->vocab = info->vocab_size;
  p->hidden_size = info->hidden_size;
  specinfer_status rc = host->open_target(host, "gguf", config, &p->fresh, err);
  if (rc != SPECINFER_OK) {
    free(p);
    return rc;
  }
  p->logits = malloc(sizeof(float) * 2 * (size_t)p->vocab);
  p->hidden = malloc(sizeof(float) * 2 * (size_t)p->hidden_size);
  p->row = malloc(sizeof(float) * (size_t)p->hidden_size);
  *self = p;
  *vt = &probe_vtable;
  return SPECINFER_OK;
}

TEST_DRAFTER_PLUGIN(probe, "hidden-probe", "checks the hidden state it is handed", probe_create);

static char g_model[4096];

static int have_model(void) {
  return model_path("qwen2.5-coder-0.5b.gguf", g_model, sizeof g_model);
}

/* Generates n tokens greedily; returns the number of tokens in the session, copied to out. With
 * prompt_logprobs the prompt's tokens' log-probabilities are on (every prompt row is read, the
 * hidden state comes from a buffer of all the last chunk's rows): they are checked to be there. */
static size_t generate(specinfer_target *t, specinfer_drafter *d, const char *prompt, int n,
                       int32_t *out, size_t cap, int prompt_logprobs) {
  specinfer_session_params sp;
  specinfer_session_params_init(&sp);
  sp.max_draft = 1;
  sp.adaptive_draft = 0; /* a draft every round: every request is checked */
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(t, d, NULL, &sp, &s, NULL), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, strlen(prompt)), SPECINFER_OK);
  if (prompt_logprobs) assert_int_equal(specinfer_session_set_prompt_logprobs(s, 1), SPECINFER_OK);
  specinfer_status rc = specinfer_session_generate(s, n, NULL, NULL);
  if (rc != SPECINFER_OK) fprintf(stderr, "generate: %s\n", specinfer_session_errmsg(s));
  assert_int_equal(rc, SPECINFER_OK);
  const int32_t *toks = NULL;
  size_t len = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &len), SPECINFER_OK);
  if (prompt_logprobs) {
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
    size_t n_lp = 0;
    assert_int_equal(specinfer_session_prompt_logprobs(s, NULL, NULL, NULL, NULL, &n_lp, NULL),
                     SPECINFER_OK);
    assert_int_equal(n_lp, (size_t)st.n_prompt_tokens - 1);
  }
  assert_true(len <= cap);
  memcpy(out, toks, len * sizeof(int32_t));
  specinfer_session_destroy(s);
  return len;
}

static void test_hidden_state_in_requests(void **state) {
  (void)state;
  if (!have_model()) {
    fprintf(stderr, "SKIP: %s not found (run scripts/fetch-models)\n", g_model);
    skip();
  }
  const int n = getenv("SPECINFER_SANITIZED") ? 6 : 16;
  specinfer_registry *reg = new_registry();
  assert_int_equal(specinfer_registry_register_plugin(reg, &probe_plugin, NULL), SPECINFER_OK);
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "path=%s,n_ctx=512", g_model);
  specinfer_target *t = NULL;
  assert_int_equal(specinfer_target_open(reg, "gguf", cfg, &t, NULL), SPECINFER_OK);
  specinfer_drafter *d = open_drafter(reg, t, "hidden-probe", cfg);

  static const char *prompts[] = {"def fibonacci(n):\n", "import os\n\nfor name in"};
  for (size_t pi = 0; pi < 4; ++pi) {
    int32_t plain[1024], spec[1024];
    const int prompt_logprobs = pi >= 2;
    size_t n_plain = generate(t, NULL, prompts[pi % 2], n, plain, 1024, 0);
    memset(&seen, 0, sizeof seen);
    size_t n_spec = generate(t, d, prompts[pi % 2], n, spec, 1024, prompt_logprobs);
    fprintf(stderr,
            "prompt %zu%s: %d proposals, %d with a hidden state; max |hidden - fresh| %.2e, "
            "max |row . hidden - logit| / (1 + |logit|) %.2e\n",
            pi % 2, prompt_logprobs ? " (prompt logprobs on)" : "", seen.proposals,
            seen.with_hidden, seen.max_hidden_diff, seen.max_logit_diff);
    assert_true(seen.proposals > 0);
    assert_int_equal(seen.with_hidden, seen.proposals);
    assert_int_equal(seen.bad_position, 0);
    assert_int_equal(seen.bad_cost, 0);
    /* The session computes the prefix incrementally, the probe in one batch: rounding may differ.
     */
    assert_true(seen.max_hidden_diff < 2e-2);
    assert_true(seen.max_logit_diff < 5e-3);
    assert_int_equal(n_spec, n_plain);
    assert_memory_equal(spec, plain, n_plain * sizeof(int32_t));
  }
  specinfer_drafter_destroy(d);
  specinfer_target_destroy(t);
  specinfer_registry_destroy(reg);
}

static void test_train_refusals(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, "abi/specinfer.h", 4);
  specinfer_train_params tp;
  specinfer_train_params_init(&tp);
  tp.out_path = "/tmp/specinfer-never-written.gguf";
  char *err = NULL;

  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, NULL, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(err);
  specinfer_free(err);
  err = NULL;
  assert_int_equal(specinfer_drafter_train(NULL, "kgram", t, &tp, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);

  specinfer_train_params small = tp;
  small.struct_size = 4;
  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, &small, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_train_params no_out = tp;
  no_out.out_path = "";
  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, &no_out, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_train_params null_file = tp;
  const char *files[] = {NULL};
  null_file.corpus = files;
  null_file.n_corpus = 1;
  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, &null_file, NULL),
                   SPECINFER_ERR_INVALID_ARGUMENT);

  /* kgram drafts from counts: nothing to train. */
  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, &tp, &err), SPECINFER_ERR_UNSUPPORTED);
  assert_non_null(strstr(err, "nothing to train"));
  specinfer_free(err);
  err = NULL;
  assert_int_equal(specinfer_drafter_train(reg, "no-such-plugin", t, &tp, NULL),
                   SPECINFER_ERR_NOT_FOUND);

  /* A target in a session is not the trainer's to run. */
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, NULL, &s, NULL), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_train(reg, "kgram", t, &tp, &err), SPECINFER_ERR_STATE);
  assert_non_null(strstr(err, "session"));
  specinfer_free(err);
  specinfer_session_destroy(s);

  specinfer_target_destroy(t);
  specinfer_registry_destroy(reg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hidden_state_in_requests),
      cmocka_unit_test(test_train_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
