/* Couplers inside sessions, through the public ABI, on the kgram target (k = 6, trained on
 * abi/specinfer.h):
 *  - drafter invariance: at a given seed the gumbel and minhash sessions produce the same text
 *    with every drafter (ngram, kgram k=2, kgram k=3, none), sampling at temperature 0.8;
 *  - tokens per round: an in-process drafter that proposes the target's own next token with
 *    probability alpha, independently per token (and a wrong one otherwise), gives
 *    (1 - alpha^(k+1)) / (1 - alpha) tokens per round in the session's statistics (within 4 sigma),
 *    and the text of plain decoding;
 *  - token trees: a drafter proposing two children per level gives the text of plain decoding
 *    (greedy, and gumbel at a fixed seed) with the accepted path kept through kv_keep.
 * Fixed seeds throughout. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/test_util.h"

#define CORPUS "abi/specinfer.h"

static specinfer_target *open_kgram_target(specinfer_registry *reg) {
  return open_kgram(reg, CORPUS, 6);
}

/* Runs one session; returns the generated tokens (caller frees) and fills *st. */
static int32_t *run(specinfer_target *t, specinfer_drafter *d, const specinfer_coupler *c,
                    const specinfer_session_params *p, const char *prompt, int n, size_t *n_out,
                    specinfer_session_stats *st) {
  specinfer_session *s = NULL;
  char *err = NULL;
  specinfer_status rc = specinfer_session_create(t, d, c, p, &s, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "session: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, strlen(prompt)), SPECINFER_OK);
  rc = specinfer_session_generate(s, n, NULL, NULL);
  if (rc != SPECINFER_OK) fprintf(stderr, "generate: %s\n", specinfer_session_errmsg(s));
  assert_int_equal(rc, SPECINFER_OK);
  const int32_t *toks = NULL;
  size_t n_all = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n_all), SPECINFER_OK);
  size_t n_prompt = strlen(prompt); /* kgram: one token per byte, no bos */
  assert_true(n_all >= n_prompt);
  *n_out = n_all - n_prompt;
  int32_t *copy = malloc((*n_out + 1) * sizeof(int32_t));
  memcpy(copy, toks + n_prompt, *n_out * sizeof(int32_t));
  if (st) {
    specinfer_session_stats_init(st);
    assert_int_equal(specinfer_session_get_stats(s, st), SPECINFER_OK);
  }
  specinfer_session_destroy(s);
  return copy;
}

/* ---------------------------------------------------------------------------------------------
 * Drafter invariance
 * ------------------------------------------------------------------------------------------- */

static void test_drafter_invariance(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram_target(reg);
  specinfer_drafter *drafters[4] = {NULL, NULL, NULL, NULL}; /* none first */
  drafters[1] = open_drafter(reg, t, "ngram", "n_max=3");
  drafters[2] = open_drafter(reg, t, "kgram", kgram_config(CORPUS, "k=2"));
  drafters[3] = open_drafter(reg, t, "kgram", kgram_config(CORPUS, "k=3"));
  const char *names[4] = {"none", "ngram", "kgram k=2", "kgram k=3"};
  const char *specs[] = {"gumbel", "minhash"};
  const char *prompts[] = {"SPECINFER_API specinfer_status specinfer_", "/* Creates a "};
  const uint64_t seeds[] = {1, 42, 0xdeadbeefULL};
  const int n = 200;
  for (size_t ci = 0; ci < 2; ++ci) {
    specinfer_coupler *c = NULL;
    assert_int_equal(specinfer_coupler_create(specs[ci], &c, NULL), SPECINFER_OK);
    for (size_t pi = 0; pi < 2; ++pi) {
      int32_t *first_seed_text = NULL;
      for (size_t si = 0; si < 3; ++si) {
        specinfer_session_params p;
        specinfer_session_params_init(&p);
        p.temperature = 0.8f;
        p.top_k = 50;
        p.seed = seeds[si];
        p.max_draft = 6;
        /* A fixed draft length: the adaptive one may (rightly) stop drafting when a kgram drafter
         * costs as much as the kgram target, and this test needs drafts to be verified. */
        p.adaptive_draft = 0;
        int32_t *ref = NULL;
        size_t n_ref = 0;
        for (int di = 0; di < 4; ++di) {
          specinfer_session_stats st;
          size_t n_got = 0;
          int32_t *got = run(t, drafters[di], c, &p, prompts[pi], n, &n_got, &st);
          assert_int_equal(st.n_generated, st.n_accepted + st.n_rounds);
          if (di == 0) {
            ref = got;
            n_ref = n_got;
            assert_int_equal(n_ref, n);
            continue;
          }
          printf(
              "  %-8s seed %-10llu prompt %zu drafter %-10s: %lld of %lld drafts kept, %.2f "
              "tokens/round\n",
              specs[ci], (unsigned long long)seeds[si], pi, names[di], (long long)st.n_accepted,
              (long long)st.n_drafted, st.mean_accepted);
          assert_true(st.n_accepted > 0); /* speculation happened: the comparison has teeth */
          assert_int_equal(n_got, n_ref);
          assert_memory_equal(got, ref, n_ref * sizeof(int32_t));
          free(got);
        }
        /* Another seed gives another text. */
        if (si == 0) {
          first_seed_text = ref;
        } else {
          assert_true(memcmp(first_seed_text, ref, n_ref * sizeof(int32_t)) != 0);
          free(ref);
        }
      }
      free(first_seed_text);
    }
    specinfer_coupler_destroy(c);
  }
  for (int di = 1; di < 4; ++di)
    assert_int_equal(specinfer_drafter_destroy(drafters[di]), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

/* ---------------------------------------------------------------------------------------------
 * Tokens per round with an i.i.d. synthetic drafter
 * ------------------------------------------------------------------------------------------- */

/* What the drafter knows: the whole plain-decoding sequence (prompt included), and alpha. */
static const int32_t *g_oracle;
static size_t g_oracle_len;
static double g_alpha;
static uint64_t g_rng;

static double next_uniform(void) {
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return ((double)(z >> 11) + 0.5) * 0x1.0p-53;
}

static void iid_destroy(void *self) {
  free(self);
}
static specinfer_status iid_begin(void *self, const int32_t *ctx, size_t n,
                                  specinfer_plugin_error *err) {
  (void)self;
  (void)ctx;
  (void)n;
  (void)err;
  return SPECINFER_OK;
}
/* Proposes, for each drafted position, the target's own token with probability alpha and a
 * different one otherwise, independently. A point-mass drafter: has_probs = 0. */
static specinfer_status iid_propose(void *self, const specinfer_draft_request *req,
                                    specinfer_draft *out, specinfer_plugin_error *err) {
  (void)self;
  (void)err;
  int32_t n = req->max_tokens < out->cap ? req->max_tokens : out->cap;
  for (int32_t i = 0; i < n; ++i) {
    size_t at = req->n_context + (size_t)i;
    int32_t right = at < g_oracle_len ? g_oracle[at] : 0;
    out->tokens[i] =
        next_uniform() < g_alpha ? right : (right + 1 + (int32_t)(next_uniform() * 254)) % 256;
    out->parents[i] = i - 1;
  }
  out->n_nodes = n;
  out->has_probs = 0;
  return SPECINFER_OK;
}
static specinfer_status iid_commit(void *self, const int32_t *t, size_t n,
                                   specinfer_plugin_error *err) {
  (void)self;
  (void)t;
  (void)n;
  (void)err;
  return SPECINFER_OK;
}
static const specinfer_drafter_vtable iid_vtable = {
    sizeof(specinfer_drafter_vtable), iid_destroy, iid_begin, iid_propose, iid_commit, NULL};
static specinfer_status iid_create(const specinfer_host *host, const char *config,
                                   const specinfer_model_info *ti,
                                   const specinfer_host_target *target, void **self,
                                   const specinfer_drafter_vtable **vt,
                                   specinfer_plugin_error *err) {
  (void)host;
  (void)config;
  (void)ti;
  (void)target;
  (void)err;
  *self = malloc(1);
  *vt = &iid_vtable;
  return SPECINFER_OK;
}
TEST_DRAFTER_PLUGIN(iid, "iid-test", "i.i.d. synthetic drafter", iid_create);

static void test_tokens_per_round_iid_drafter(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  assert_int_equal(specinfer_registry_register_plugin(reg, &iid_plugin, NULL), SPECINFER_OK);
  specinfer_target *t = open_kgram_target(reg);
  const char *prompt = "typedef struct specinfer_session_params {";
  const int n = 3000;

  /* The plain greedy text is the oracle. */
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  specinfer_session *s = NULL;
  assert_int_equal(specinfer_session_create(t, NULL, NULL, &p, &s, NULL), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, strlen(prompt)), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, n, NULL, NULL), SPECINFER_OK);
  const int32_t *toks = NULL;
  size_t n_all = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n_all), SPECINFER_OK);
  int32_t *oracle = malloc(n_all * sizeof(int32_t));
  memcpy(oracle, toks, n_all * sizeof(int32_t));
  specinfer_session_destroy(s);
  g_oracle = oracle;
  g_oracle_len = n_all;
  const size_t n_prompt = strlen(prompt);
  assert_int_equal(n_all, n_prompt + n);

  specinfer_drafter *d = open_drafter(reg, t, "iid-test", "");
  const double alphas[] = {0.3, 0.6, 0.85};
  const int ks[] = {6, 4, 2};
  for (int j = 0; j < 3; ++j) {
    g_alpha = alphas[j];
    g_rng = 1000 + (uint64_t)j;
    specinfer_session_params_init(&p);
    p.max_draft = ks[j];
    p.adaptive_draft = 0;
    specinfer_session_stats st;
    size_t n_got = 0;
    int32_t *got = run(t, d, NULL, &p, prompt, n, &n_got, &st);
    /* Exact: the plain greedy text. */
    assert_int_equal(n_got, n);
    assert_memory_equal(got, oracle + n_prompt, (size_t)n * sizeof(int32_t));
    free(got);
    /* Accounting. */
    assert_int_equal(st.n_generated, n);
    assert_int_equal(st.n_generated, st.n_accepted + st.n_rounds);
    assert_true(fabs(st.mean_accepted - (double)st.n_generated / (double)st.n_rounds) < 1e-9);
    assert_true(fabs(st.acceptance_rate - (double)st.n_accepted / (double)st.n_drafted) < 1e-9);
    /* Tokens per round: a round emits min(G, k) + 1, G ~ Geometric(alpha) (drafts kept before
     * the first miss); mean (1 - a^(k+1)) / (1 - a), variance from the same distribution. */
    const double a = alphas[j];
    const int k = ks[j];
    double mean = 0, m2 = 0;
    for (int acc = 0; acc <= k; ++acc) {
      double pr = acc < k ? pow(a, acc) * (1 - a) : pow(a, k);
      mean += pr * (acc + 1);
      m2 += pr * (acc + 1) * (acc + 1);
    }
    double closed = (1 - pow(a, k + 1)) / (1 - a);
    assert_true(fabs(mean - closed) < 1e-12);
    double sigma = sqrt((m2 - mean * mean) / (double)st.n_rounds);
    /* The last round may be cut short by max_tokens; allow its effect (at most k / rounds). */
    double tol = 4 * sigma + (double)k / (double)st.n_rounds;
    printf("  alpha %.2f k %d: %lld rounds, %.4f tokens/round, expected %.4f (tolerance %.4f)\n", a,
           k, (long long)st.n_rounds, st.mean_accepted, closed, tol);
    assert_true(fabs(st.mean_accepted - closed) <= tol);
  }
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  free(oracle);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

/* ---------------------------------------------------------------------------------------------
 * Token trees: a drafter that proposes two children per level
 * ------------------------------------------------------------------------------------------- */

/* Proposes a tree of depth max_tokens / 2 along the oracle: at each level a wrong token first,
 * then (with probability alpha) the oracle's token, else a second wrong one; the next level hangs
 * under the second child. The accepted path (nodes 1, 3, 5, ...) is never a prefix of the node
 * order, so the target keeps it with kv_keep. */
static specinfer_status tree_propose(void *self, const specinfer_draft_request *req,
                                     specinfer_draft *out, specinfer_plugin_error *err) {
  (void)self;
  (void)err;
  if (!req->allow_tree) return SPECINFER_ERR_PLUGIN;
  int32_t cap = req->max_tokens < out->cap ? req->max_tokens : out->cap;
  int32_t n = 0;
  for (int32_t depth = 0; n + 2 <= cap; ++depth) {
    size_t at = req->n_context + (size_t)depth;
    int32_t right = at < g_oracle_len ? g_oracle[at] : 0;
    int32_t parent = n == 0 ? -1 : n - 1;
    out->tokens[n] = (right + 1) % 256;
    out->parents[n++] = parent;
    out->tokens[n] = next_uniform() < g_alpha ? right : (right + 2) % 256;
    out->parents[n++] = parent;
  }
  out->n_nodes = n;
  out->has_probs = 0;
  return SPECINFER_OK;
}
static const specinfer_drafter_vtable tree_vtable = {
    sizeof(specinfer_drafter_vtable), iid_destroy, iid_begin, tree_propose, iid_commit, NULL};
static specinfer_status tree_create(const specinfer_host *host, const char *config,
                                    const specinfer_model_info *ti,
                                    const specinfer_host_target *target, void **self,
                                    const specinfer_drafter_vtable **vt,
                                    specinfer_plugin_error *err) {
  specinfer_status rc = iid_create(host, config, ti, target, self, vt, err);
  *vt = &tree_vtable;
  return rc;
}
TEST_DRAFTER_PLUGIN(tree, "tree-test", "two children per level", tree_create);

/* Greedy, and gumbel at a fixed seed while sampling: the session verifying trees gives the text
 * of plain decoding with the same settings, and keeps whole levels when the drafter is right. */
static void test_tree_drafts_equal_plain(void **state) {
  (void)state;
  specinfer_registry *reg = new_registry();
  assert_int_equal(specinfer_registry_register_plugin(reg, &tree_plugin, NULL), SPECINFER_OK);
  specinfer_target *t = open_kgram_target(reg);
  specinfer_coupler *gumbel = NULL;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, NULL), SPECINFER_OK);
  const char *prompt = "specinfer_status specinfer_session_";
  const size_t n_prompt = strlen(prompt);
  const int n = 600;
  specinfer_drafter *d = open_drafter(reg, t, "tree-test", "");
  for (int mode = 0; mode < 2; ++mode) {
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    p.seed = 7;
    p.temperature = mode == 0 ? 0.0f : 0.8f;
    const specinfer_coupler *c = mode == 0 ? NULL : gumbel;
    size_t n_plain = 0;
    int32_t *plain = run(t, NULL, c, &p, prompt, n, &n_plain, NULL);
    assert_int_equal(n_plain, n);
    int32_t *oracle = malloc((n_prompt + (size_t)n) * sizeof(int32_t));
    for (size_t i = 0; i < n_prompt; ++i) oracle[i] = (unsigned char)prompt[i];
    memcpy(oracle + n_prompt, plain, (size_t)n * sizeof(int32_t));
    g_oracle = oracle;
    g_oracle_len = n_prompt + (size_t)n;
    g_alpha = 0.8;
    g_rng = 77;

    p.max_draft = 6; /* three levels */
    p.adaptive_draft = 0;
    specinfer_session_stats st;
    size_t n_got = 0;
    int32_t *got = run(t, d, c, &p, prompt, n, &n_got, &st);
    assert_int_equal(n_got, n);
    assert_memory_equal(got, plain, (size_t)n * sizeof(int32_t));
    printf("  %s: %lld rounds, %.3f tokens/round, %lld nodes drafted, %lld accepted\n",
           mode == 0 ? "greedy" : "gumbel", (long long)st.n_rounds, st.mean_accepted,
           (long long)st.n_drafted, (long long)st.n_accepted);
    assert_int_equal(st.n_generated, st.n_accepted + st.n_rounds);
    /* At most one node per level is accepted, and whole levels are: with alpha 0.8 over three
     * levels, about 2.95 tokens per round (2 when a level holds no right token). */
    assert_true(st.n_accepted <= st.n_drafted / 2);
    assert_true(st.mean_accepted > 2.0);
    free(got);
    free(plain);
    free(oracle);
  }
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  specinfer_coupler_destroy(gumbel);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_drafter_invariance),
      cmocka_unit_test(test_tokens_per_round_iid_drafter),
      cmocka_unit_test(test_tree_drafts_equal_plain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
