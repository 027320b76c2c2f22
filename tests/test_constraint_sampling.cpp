// Sampled constrained output follows the masked target distribution (the llguidance plugin on a
// kgram byte model: cheap enough for thousands of samples). The regex [a-e][a-e] allows 25 texts;
// the probability of each is p(x1) p(x2 | x1), each factor the target's softmax at temperature 1
// renormalized over a..e (specinfer_target_eval's logits). Thousands of sessions, one seed each,
// sample those texts: plain decoding, rejection sampling with a kgram drafter whose own
// distribution differs from the target's (its proposals outside a..e pruned, the rest verified
// against the masked target), and the gumbel coupler with that drafter. Each passes a chi-square
// test at significance 0.001 (fixed seeds: the outcome is the same on every run), and fails the
// same test against the drafter's own distribution (the test tells the two apart). Skips without
// the plugin (no cargo new enough to build it).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "specinfer.h"

#include "support/cmocka_setup.h"
#include "support/test_util.h"

namespace {

constexpr const char *kCorpus = "abi/specinfer.h";
constexpr const char *kPrompt = "the ";
constexpr int kLetters = 5;  // a..e
constexpr int kSamples = 4000;

// The target's distribution over a..e after `text`, at temperature 1.
std::vector<double> masked_next(specinfer_target *t, const std::string &text) {
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(t, &info), SPECINFER_OK);
  std::vector<int32_t> ids(text.begin(), text.end());  // kgram's tokens are bytes
  std::vector<float> logits(static_cast<size_t>(info.vocab_size));
  specinfer_eval_params p;
  specinfer_eval_params_init(&p);
  p.tokens = ids.data();
  p.n_tokens = ids.size();
  p.n_logits = 1;
  p.logits = logits.data();
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_OK);
  std::vector<double> q(kLetters);
  double sum = 0;
  for (int i = 0; i < kLetters; ++i) sum += q[i] = std::exp(double(logits['a' + i]));
  for (double &x : q) x /= sum;
  return q;
}

// The probabilities of the 25 texts [a-e][a-e] after kPrompt.
std::vector<double> text_probs(specinfer_target *t) {
  std::vector<double> p(kLetters * kLetters);
  const std::vector<double> first = masked_next(t, kPrompt);
  for (int a = 0; a < kLetters; ++a) {
    const std::vector<double> second = masked_next(t, kPrompt + std::string(1, char('a' + a)));
    for (int b = 0; b < kLetters; ++b) p[a * kLetters + b] = first[a] * second[b];
  }
  return p;
}

// Pearson's chi-square of the counts against probabilities p over n samples, the cells expected
// fewer than 5 times pooled into one; *cells gets the number of cells.
double chi_square(const std::vector<int> &count, const std::vector<double> &p, int n, int *cells) {
  double chi2 = 0, pooled_o = 0, pooled_e = 0;
  *cells = 0;
  for (size_t k = 0; k < p.size(); ++k) {
    const double e = p[k] * n;
    if (e < 5) {
      pooled_o += count[k];
      pooled_e += e;
      continue;
    }
    chi2 += (count[k] - e) * (count[k] - e) / e;
    ++*cells;
  }
  if (pooled_e > 0) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++*cells;
  }
  return chi2;
}

// The chi-square quantile at 1 - 0.001 for df degrees of freedom (Wilson-Hilferty).
double chi2_critical(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct Config {
  const char *name;
  bool drafter;
  const char *coupler;  // nullptr: the session's default (rejection at temperature 1)
};

void test_sampled_constrained_text_follows_the_masked_target(void **) {
  specinfer_registry *reg = new_registry();
  specinfer_target *target = open_kgram(reg, kCorpus, 3);
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status rc = specinfer_constraint_open(reg, "llguidance", nullptr, target, "regex",
                                                        "[a-e][a-e]", &c, &err);
  if (rc == SPECINFER_ERR_NOT_FOUND) {
    std::printf("SKIP: the llguidance plugin is not built (%s)\n", err ? err : "?");
    specinfer_free(err);
    specinfer_target_destroy(target);
    specinfer_registry_destroy(reg);
    skip();
  }
  if (rc != SPECINFER_OK) std::fprintf(stderr, "constraint: %s\n", err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);

  // The 25 texts' probabilities under the target, and under the drafter's model (k=1): samples
  // that followed the drafts unverified would follow those.
  const std::vector<double> want = text_probs(target);
  specinfer_target *draft_model = open_kgram(reg, kCorpus, 1);
  const std::vector<double> drafts = text_probs(draft_model);
  specinfer_target_destroy(draft_model);

  // A drafter of another order (k=1): its q differs from the target's p.
  specinfer_drafter *drafter = nullptr;
  assert_int_equal(
      specinfer_drafter_open(reg, "kgram", kgram_config(kCorpus, "k=1"), target, &drafter, nullptr),
      SPECINFER_OK);
  for (const Config cfg : {Config{"plain", false, nullptr}, Config{"kgram drafter", true, nullptr},
                           Config{"kgram drafter, gumbel", true, "gumbel"}}) {
    specinfer_coupler *coupler = nullptr;
    if (cfg.coupler)
      assert_int_equal(specinfer_coupler_create(cfg.coupler, &coupler, nullptr), SPECINFER_OK);
    std::vector<int> count(want.size(), 0);
    int64_t drafted = 0;
    for (int i = 0; i < kSamples; ++i) {
      specinfer_session_params p;
      specinfer_session_params_init(&p);
      p.temperature = 1.0f;
      p.seed = static_cast<uint64_t>(i);
      p.adaptive_draft = 0;
      p.max_draft = 2;
      specinfer_session *s = nullptr;
      assert_int_equal(specinfer_session_create(target, cfg.drafter ? drafter : nullptr, coupler,
                                                &p, &s, nullptr),
                       SPECINFER_OK);
      assert_int_equal(specinfer_session_set_constraint(s, c), SPECINFER_OK);
      assert_int_equal(specinfer_session_feed_text(s, kPrompt, std::strlen(kPrompt)), SPECINFER_OK);
      assert_int_equal(specinfer_session_generate(s, 4, nullptr, nullptr), SPECINFER_OK);
      const int32_t *toks = nullptr;
      size_t n = 0;
      assert_int_equal(specinfer_session_tokens(s, &toks, &n), SPECINFER_OK);
      const size_t at = std::strlen(kPrompt);
      assert_true(n >= at + 2);
      const int a = toks[at] - 'a', b = toks[at + 1] - 'a';
      assert_true(a >= 0 && a < kLetters && b >= 0 && b < kLetters);
      count[static_cast<size_t>(a * kLetters + b)]++;
      specinfer_session_stats st;
      specinfer_session_stats_init(&st);
      assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
      drafted += st.n_drafted;
      specinfer_session_destroy(s);
    }
    specinfer_coupler_destroy(coupler);
    int cells = 0, q_cells = 0;
    const double chi2 = chi_square(count, want, kSamples, &cells);
    const double limit = chi2_critical(cells - 1);
    // The same counts against the drafter's distribution: the test tells the two apart.
    const double q_chi2 = chi_square(count, drafts, kSamples, &q_cells);
    std::printf(
        "%-22s chi-square %.1f over %d cells (limit %.1f at 0.001), %.0f against the "
        "drafter's distribution; %lld tokens drafted\n",
        cfg.name, chi2, cells, limit, q_chi2, static_cast<long long>(drafted));
    assert_true(cells >= 5);
    assert_true(chi2 < limit);
    assert_true(q_chi2 > chi2_critical(q_cells - 1));
    if (cfg.drafter) assert_true(drafted > kSamples / 4);  // drafts were verified, not skipped
  }
  specinfer_drafter_destroy(drafter);
  assert_int_equal(specinfer_constraint_destroy(c), SPECINFER_OK);
  specinfer_target_destroy(target);
  specinfer_registry_destroy(reg);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sampled_constrained_text_follows_the_masked_target)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
