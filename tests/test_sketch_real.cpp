// The sketchers (lib/sketch) on real attention vectors: queries and keys captured with
// gguf::Model::set_qk_observer while a real model (scripts/fetch-models: qwen2.5-coder-0.5b,
// gemma-3-270m) reads a short fixed text. Each model that is absent is skipped with a message.
//
// Pairs: in layers first / middle / last, the query of the last position of one query head (head 0,
// then the last head, alternating, so both ends of the GQA grouping are used) against three keys of
// its kv head (h / (n_head / n_head_kv)): position 0 (the attention sink, with outlying
// coordinates), the key with the largest |<q,k>| and the key with the median |<q,k>|.
// For every pair and kind, kTrials independent sketches (seeds kSeed0 + t):
//  - the mean estimate is within 4 standard errors of <q,k> (unbiasedness);
//  - the variance: Gaussian JL (||a||^2||b||^2 + <a,b>^2)/m and ±1 JL (the same minus
//    2 sum a_i^2 b_i^2)/m and QJL ((pi/2)||a||^2||b||^2 - <a,b>^2)/m exactly (within 4 standard
//    errors of the sample variance, estimated from the fourth central moment); CountSketch (s = 1
//    and 4) <= 2||a||^2||b||^2/m, orthogonal QJL <= the QJL value, threshold and priority
//    <= (2/m) max(||a_I||^2||b||^2, ||a||^2||b_I||^2) (I the common support), each not exceeded by
//    more than 4 standard errors.
// Also checked: the observer is called once per layer and forward, and the captured vectors are
// finite and not all zero.
// With SPECINFER_SANITIZED=1 (ASan/UBSan builds, ~10x slower): one layer and fewer trials.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/model.h"
#include "gguf/tokenizer.h"
#include "plugin/host.h"
#include "sketch/sketcher.h"
#include "support/models.h"
#include "support/sample_stats.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

namespace gg = specinfer::gguf;
namespace sk = specinfer::sketch;

namespace {

constexpr uint64_t kSeed0 = 7000;
constexpr uint32_t kM = 32;
int g_trials = 1500;
bool g_sanitized = false;

const char kText[] =
    "Speculative decoding lets a small draft model propose several tokens that the large target\n"
    "model then verifies in one batched forward pass. When the draft agrees with the target, many\n"
    "tokens are accepted at the cost of a single pass; when it does not, the first rejected token "
    "is\n"
    "replaced by a sample from the corrected distribution, so the output is exactly what the "
    "target\n"
    "alone would have produced.\n\n"
    "def moving_average(xs, k):\n"
    "    out = []\n"
    "    total = sum(xs[:k])\n"
    "    out.append(total / k)\n"
    "    for i in range(k, len(xs)):\n"
    "        total += xs[i] - xs[i - k]\n"
    "        out.append(total / k)\n"
    "    return out\n";

struct Pair {
  std::string name;
  std::vector<float> k, q;  // a = key, b = query
};

double dot(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
double sum_sq_products(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * a[i] * b[i] * b[i];
  return s;
}
double norm2_on_support(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (b[i] != 0.0f) s += double(a[i]) * a[i];
  return s;
}

// Runs the model over kText and returns the pairs described at the top.
std::vector<Pair> capture_pairs(const std::string &path, int *d_out) {
  std::unique_ptr<gg::File> file = gg::File::open(path);
  std::unique_ptr<gg::Tokenizer> tok = gg::Tokenizer::from_gguf(*file);
  std::vector<int32_t> ids = tok->encode(kText, true, false);
  const int32_t n = int32_t(ids.size());
  assert_true(n >= 32);
  gg::Model model(*file, specinfer::default_host(), n);
  const gg::Hparams &hp = model.hparams();
  const int32_t hd = hp.head_dim, qw = hp.n_head * hd, kw = hp.n_head_kv * hd;
  assert_true(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0);
  *d_out = hd;

  std::vector<int32_t> layers = {0, hp.n_layer / 2, hp.n_layer - 1};
  if (g_sanitized) layers = {hp.n_layer / 2};
  std::vector<std::vector<float>> Q(layers.size()), K(layers.size());
  std::vector<int> calls(size_t(hp.n_layer), 0);
  bool finite = true, bad_call = false;  // no cmocka asserts (longjmp) inside the forward pass
  model.set_qk_observer([&](int32_t layer, const float *q, const float *k, int32_t cnt) {
    if (layer < 0 || layer >= hp.n_layer || cnt != n) {
      bad_call = true;
      return;
    }
    calls[size_t(layer)]++;
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i] == layer) {
        Q[i].assign(q, q + size_t(cnt) * qw);
        K[i].assign(k, k + size_t(cnt) * kw);
      }
  });
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  model.forward(ids.data(), pos.data(), n, nullptr, 0, nullptr, nullptr);
  assert_false(bad_call);
  for (int c : calls) assert_int_equal(c, 1);

  std::vector<Pair> pairs;
  for (size_t li = 0; li < layers.size(); ++li) {
    double qsum = 0, ksum = 0;
    for (float x : Q[li]) {
      finite = finite && std::isfinite(x);
      qsum += std::fabs(x);
    }
    for (float x : K[li]) {
      finite = finite && std::isfinite(x);
      ksum += std::fabs(x);
    }
    assert_true(finite);
    assert_true(qsum > 0 && ksum > 0);
    const int32_t h = li % 2 == 0 ? 0 : hp.n_head - 1;
    const int32_t g = h / (hp.n_head / hp.n_head_kv);
    const int32_t t = n - 1;
    const float *qv = Q[li].data() + size_t(t) * qw + size_t(h) * hd;
    std::vector<float> q(qv, qv + hd);
    auto key = [&](int32_t s) {
      const float *kv = K[li].data() + size_t(s) * kw + size_t(g) * hd;
      return std::vector<float>(kv, kv + hd);
    };
    // |<q, k_s>| over s = 1..t: the largest and the median.
    std::vector<std::pair<double, int32_t>> scores;
    for (int32_t s = 1; s <= t; ++s) scores.push_back({std::fabs(dot(q, key(s))), s});
    std::sort(scores.begin(), scores.end());
    const int32_t s_max = scores.back().second, s_med = scores[scores.size() / 2].second;
    char name[64];
    std::snprintf(name, sizeof name, "L%d h%d/kv%d k0", layers[li], h, g);
    pairs.push_back({name, key(0), q});
    std::snprintf(name, sizeof name, "L%d h%d/kv%d kmax", layers[li], h, g);
    pairs.push_back({name, key(s_max), q});
    std::snprintf(name, sizeof name, "L%d h%d/kv%d kmed", layers[li], h, g);
    pairs.push_back({name, key(s_med), q});
  }
  return pairs;
}

using test_stats::Stats;
using test_stats::stats_of;

Stats run_trials(const char *kind, const char *options, const Pair &p) {
  std::vector<double> est;
  std::vector<unsigned char> a, b;
  for (int t = 0; t < g_trials; ++t) {
    auto s = sk::make_sketcher(kind, int64_t(p.k.size()), kM, kSeed0 + uint64_t(t), options);
    s->sketch(p.k.data(), sk::Role::key, a);
    s->sketch(p.q.data(), sk::Role::query, b);
    est.push_back(s->estimate(a.data(), a.size(), b.data(), b.size()));
  }
  return stats_of(est);
}

int g_failures = 0;

void check(const std::string &what, const Pair &p, const Stats &st, double variance, bool exact) {
  const double ip = dot(p.k, p.q);
  const bool mean_ok = std::fabs(st.mean - ip) <= 4.0 * st.se_mean + 1e-9 * std::fabs(ip);
  const bool var_ok = exact ? std::fabs(st.var - variance) <= 4.0 * st.se_var
                            : st.var - 4.0 * st.se_var <= variance;
  print_message(
      "  %-22s %-20s <q,k> %10.3f mean %10.3f (se %8.3f)  var %11.3f %s %11.3f (se %9.3f)%s\n",
      what.c_str(), p.name.c_str(), ip, st.mean, st.se_mean, st.var, exact ? "~=" : "<=", variance,
      st.se_var, mean_ok && var_ok ? "" : "  FAIL");
  if (!mean_ok || !var_ok) g_failures++;
}

// Whether model `name` is fetched; says why not when it is not.
bool model_present(const char *name) {
  const std::string path = std::string(models_dir()) + "/" + name + ".gguf";
  if (FILE *f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return true;
  }
  print_message("skipping %s: %s not found (run scripts/fetch-models)\n", name, path.c_str());
  return false;
}

void check_model(const char *name) {
  // cmocka's skip() leaves by longjmp: nothing with a destructor may be alive here yet (it
  // would leak under LeakSanitizer).
  if (!model_present(name)) {
    skip();
    return;
  }
  const std::string path = std::string(models_dir()) + "/" + name + ".gguf";
  int d = 0;
  const std::vector<Pair> pairs = capture_pairs(path, &d);
  print_message("%s: head_dim %d, m = %u, %d trials, %zu pairs\n", name, d, kM, g_trials,
                pairs.size());
  g_failures = 0;
  for (const Pair &p : pairs) {
    const double ip = dot(p.k, p.q), na = dot(p.k, p.k), nb = dot(p.q, p.q);
    check("jl gaussian", p, run_trials("jl", "", p), (na * nb + ip * ip) / kM, true);
    check("jl sign", p, run_trials("jl", "dist=sign", p),
          (na * nb + ip * ip - 2 * sum_sq_products(p.k, p.q)) / kM, true);
    check("countsketch", p, run_trials("countsketch", "", p), 2 * na * nb / kM, false);
    check("countsketch s=4", p, run_trials("countsketch", "s=4", p), 2 * na * nb / kM, false);
    const double v_qjl = (M_PI / 2 * na * nb - ip * ip) / kM;
    check("qjl", p, run_trials("qjl", "", p), v_qjl, true);
    check("qjl orthogonal", p, run_trials("qjl", "orthogonal=1", p), v_qjl, false);
    const double v_samp =
        2.0 / kM * std::max(norm2_on_support(p.k, p.q) * nb, na * norm2_on_support(p.q, p.k));
    check("threshold", p, run_trials("threshold", "", p), v_samp, false);
    check("priority", p, run_trials("priority", "", p), v_samp, false);
  }
  assert_int_equal(g_failures, 0);
}

void test_qwen_05b(void **) {
  check_model("qwen2.5-coder-0.5b");
}
void test_gemma_270m(void **) {
  check_model("gemma-3-270m");
}

}  // namespace

int main(void) {
  const char *san = std::getenv("SPECINFER_SANITIZED");
  g_sanitized = san && std::strcmp(san, "1") == 0;
  if (g_sanitized) g_trials = 500;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qwen_05b),
      cmocka_unit_test(test_gemma_270m),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
