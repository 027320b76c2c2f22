// The gguf forward on the real models (scripts/fetch-models) against llama.cpp's logits
// (tests/data/reference/logits_<model>.json, written by scripts/make-reference.py):
// The prompt goes through one batched forward, as a session's prefill does.
//  - every prompt position but the first: our argmax equals llama.cpp's top-1 on >= 99% of them,
//  counting
//    a position whose llama.cpp top-1/top-2 gap is below tie_gap() as agreeing when our argmax is
//    that runner-up (quantized dot products differ: llama.cpp quantizes activations to 8 bits);
//  - |our logit - llama.cpp's| over its top-10 ids: max and mean within per-model tolerances;
//  - the 32-token greedy continuation matches until a step whose llama.cpp top-2 gap <
//  tie_gap(name);
//  - the first 8 continuation tokens forwarded again as one batch (a verify pass) give the same
//    logits as one token at a time, up to the noise of 8-bit activation quantization: the
//    backend's matmul sums in an order that depends on the number of tokens, and a last-bit
//    change flips some activation roundings in later layers (the tiny-model tests check batched ==
//    sequential to 1e-3 where that does not happen). Same tolerances as against llama.cpp.
// Position 0 is left out: Qwen2.5's first token carries activations of several thousand, where
// llama.cpp's 8-bit activation quantization is far off (qwen2.5-coder-1.5b, "def": llama.cpp's
// logit for id 15 is 14.13, a double-precision forward over the same weights gives 3.22, and so
// does our float path for batches of >= 32 tokens). Later positions are not affected this much.
// A model or reference file that is absent skips (with a message) that model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "gguf/model.h"
#include "gguf/tokenizer.h"
#include "plugin/host.h"

#include <stdint.h>

#include "support/cmocka_setup.h"
#include "support/models.h"

using nlohmann::json;
using specinfer::gguf::File;
using specinfer::gguf::Model;
using specinfer::gguf::ModelOptions;

namespace {

// Logit gap under which llama.cpp's top-1 and top-2 count as tied: 0.3, and 0.5 for Gemma 3, whose
// logits differ from llama.cpp's by 0.32 on average (an open discrepancy, docs/MODELS.md), so that
// float-summation-order changes in our kernels flip its gaps of up to ~0.4.
double tie_gap(const char *name) {
  return std::strstr(name, "gemma") ? 0.5 : 0.3;
}
// Greedy continuations may part where llama.cpp's top-2 gap is below this: for Gemma 3 its max
// |logit difference| to llama.cpp (1.6), since any ulp change in our kernels (e.g. the attention
// summation order) moves its logits by that much somewhere in 32 steps; the others as tie_gap.
double greedy_tie_gap(const char *name) {
  return std::strstr(name, "gemma") ? 1.6 : tie_gap(name);
}
// Batch vs sequential: max |logit difference| (measured 0.7 on the Qwen models, 2.1 on Gemma).
constexpr double kBatchMaxAbs = 3.0;
constexpr double kMinAgree = 0.99;  // share of prompt positions whose top-1 agrees
// Max and mean |logit difference| over llama.cpp's top-10 ids, per model: measured max / mean
// 0.35 / 0.076 (1.5B), 1.38 / 0.076 (0.5B, AWQ-derived), 1.58 / 0.29 (Gemma 3 270M, whose logits
// run to ~30); the tolerances are about 1.5x the measurements. The 0.5B's max moved to 2.74 (mean
// 0.081) when the AVX2 activation quantization changed rounding: one outlier logit on the chat
// prompt, where both engines quantize activations to 8 bits differently; top-1 still agrees.
double max_abs_tolerance(const char *name) {
  if (std::strstr(name, "1.5b")) return 0.6;
  if (std::strstr(name, "0.5b")) return 3.5;
  return 2.5;
}
double mean_abs_tolerance(const char *name) {
  return std::strstr(name, "gemma") ? 0.45 : 0.12;
}

std::string data_dir() {
  const char *d = std::getenv("SPECINFER_TEST_DATA");
  return d ? d : "tests/data";
}

bool read_file(const std::string &path, std::string *out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

int argmax(const float *x, int n) {
  return int(std::max_element(x, x + n) - x);
}

// Whether file `path` can be opened; says why not (`what` names it) when it cannot.
bool present(const std::string &path, const char *what) {
  if (FILE *f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return true;
  }
  print_message("skipping: %s %s not found (run scripts/fetch-models)\n", what, path.c_str());
  return false;
}

// cmocka's skip() leaves the test by longjmp: no object with a destructor may be alive in the
// test's frames when it is called (their memory would leak under LeakSanitizer).
bool model_present(const char *name) {
  return present(std::string(models_dir()) + "/" + name + ".gguf", "model");
}

void check_model(const char *name) {
  if (!model_present(name) ||
      !present(data_dir() + "/reference/logits_" + name + ".json", "reference")) {
    skip();
    return;
  }
  const std::string path = std::string(models_dir()) + "/" + name + ".gguf";
  const std::string ref_path = data_dir() + "/reference/logits_" + name + ".json";
  std::string text;
  assert_true(read_file(ref_path, &text));
  json ref;
  try {
    ref = json::parse(text);
  } catch (const json::parse_error &e) {
    print_error("%s: %s\n", ref_path.c_str(), e.what());
    fail();
  }
  const double max_abs_tol = max_abs_tolerance(name);

  std::unique_ptr<File> file = File::open(path);
  Model model(*file, specinfer::default_host(), 512);
  const int V = model.hparams().n_vocab;
  assert_int_equal(V, ref.at("n_vocab").get<int>());

  int positions = 0, agree_raw = 0, agree = 0, greedy_checked = 0;
  double max_abs = 0, sum_abs = 0;
  long n_abs = 0;
  for (const json &pr : ref.at("prompts")) {
    const std::string &pname = pr.at("name").get_ref<const std::string &>();
    std::vector<int32_t> ids;
    for (const json &x : pr.at("ids")) ids.push_back(x.get<int32_t>());
    const int n = int(ids.size());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    model.kv_truncate(0);
    std::vector<float> lg(size_t(n) * size_t(V));
    model.forward(ids.data(), pos.data(), n, nullptr, n, lg.data(), nullptr);

    const json &rp = pr.at("positions");
    assert_int_equal(rp.size(), size_t(n));
    double pmax = 0;
    for (int p = 1; p < n; p++) {
      const float *row = lg.data() + size_t(p) * size_t(V);
      const json &top = rp[size_t(p)].at("top");
      int ours = argmax(row, V);
      int r1 = top[0][0].get<int>();
      double gap = top[0][1].get<double>() - top[1][1].get<double>();
      positions++;
      if (ours == r1) {
        agree_raw++;
        agree++;
      } else if (gap < tie_gap(name) && ours == top[1][0].get<int>()) {
        agree++;
      } else {
        print_message("  %s %s pos %d: ours %d (%.3f), llama.cpp %d (%.3f, gap %.3f)\n", name,
                      pname.c_str(), p, ours, double(row[ours]), r1, top[0][1].get<double>(), gap);
      }
      for (const json &e : top) {
        double d = std::fabs(double(row[e[0].get<int>()]) - e[1].get<double>());
        max_abs = std::max(max_abs, d);
        pmax = std::max(pmax, d);
        sum_abs += d;
        n_abs++;
      }
    }

    // Greedy continuation, one token per forward (as the reference did).
    const json &greedy = pr.at("greedy");
    const json &top2 = pr.at("greedy_top2");
    std::vector<float> last(lg.end() - V, lg.end());
    std::vector<int32_t> ours_seq;
    std::vector<float> seq_logits;  // logits after each generated token
    int matched = 0;
    bool diverged = false;
    for (size_t s = 0; s < greedy.size(); s++) {
      int tok = argmax(last.data(), V);
      int want = greedy[s].get<int>();
      if (!diverged && tok != want) {
        double gap = top2[s][0][1].get<double>() - top2[s][1][1].get<double>();
        if (gap >= greedy_tie_gap(name)) {
          print_error("%s %s: greedy step %zu: ours %d, llama.cpp %d (its top-2 gap %.3f)\n", name,
                      pname.c_str(), s, tok, want, gap);
          fail();
        }
        diverged = true;  // a near tie: the continuations may part here
      }
      if (!diverged) matched++;
      ours_seq.push_back(tok);
      int32_t p = model.kv_size();
      model.forward(&tok, &p, 1, nullptr, 1, last.data(), nullptr);
      seq_logits.insert(seq_logits.end(), last.begin(), last.end());
    }
    greedy_checked += matched;

    // The first 8 continuation tokens as one batch (as a verify pass would run them).
    const size_t nb = std::min<size_t>(8, ours_seq.size());
    model.kv_truncate(n);
    std::vector<int32_t> bpos(nb);
    std::iota(bpos.begin(), bpos.end(), n);
    std::vector<float> batched(nb * size_t(V));
    model.forward(ours_seq.data(), bpos.data(), int(nb), nullptr, int(nb), batched.data(), nullptr);
    double bdiff = 0;
    int bargmax_mismatch = 0;
    for (size_t s = 0; s < nb; s++) {
      const float *a = batched.data() + s * size_t(V), *b = seq_logits.data() + s * size_t(V);
      for (int v = 0; v < V; v++) bdiff = std::max(bdiff, double(std::fabs(a[v] - b[v])));
      int ia = argmax(a, V), ib = argmax(b, V);
      if (ia != ib && std::fabs(double(b[ia]) - double(b[ib])) >= tie_gap(name)) bargmax_mismatch++;
    }
    print_message(
        "  %s %-12s %3d positions, max |dlogit| %.3f; greedy matched %d/%zu%s; batch vs "
        "sequential max diff %.2g\n",
        name, pname.c_str(), n, pmax, matched, greedy.size(), diverged ? " (then a near tie)" : "",
        bdiff);
    assert_true(bdiff <= kBatchMaxAbs);
    assert_int_equal(bargmax_mismatch, 0);
  }
  double share = double(agree) / double(positions);
  double mean_abs = sum_abs / double(n_abs);
  print_message(
      "%s: top-1 agreement %d/%d raw (%.2f%%), %.2f%% counting near ties; |dlogit| over "
      "llama.cpp's top-10: max %.3f, mean %.4f; greedy tokens matched %d\n",
      name, agree_raw, positions, 100.0 * agree_raw / positions, 100.0 * share, max_abs, mean_abs,
      greedy_checked);
  assert_true(share >= kMinAgree);
  assert_true(max_abs <= max_abs_tol);
  assert_true(mean_abs <= mean_abs_tolerance(name));
}

// The path of a fetched model, or skip the test (with a message) when it is absent. Call it
// before any object with a destructor is alive in the test (see model_present).
std::string model_or_skip(const char *name) {
  if (!model_present(name)) skip();
  return std::string(models_dir()) + "/" + name + ".gguf";
}

void test_qwen_05b(void **) {
  check_model("qwen2.5-coder-0.5b");
}

// vocab_limit: the logits of the first ids are bit-identical to the full model's, and so are those
// of ids above the limit that were fed (from the batch that feeds them on) or added with
// add_output_ids; every other id is -inf. With requant the added rows are re-quantized like the
// rest of the output matrix (same logits as the re-quantized full model's, up to summation order).
void test_vocab_limit(void **) {
  const std::string path = model_or_skip("qwen2.5-coder-0.5b");
  std::unique_ptr<File> file = File::open(path);
  const int32_t limit = 32768;
  const int32_t fed = 54364, added = 100000;  // above the limit
  const int32_t ids[] = {750, 3974, fed, 1006, 7, 25, 262, 470};
  const int n = int(sizeof ids / sizeof ids[0]);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  for (int requant : {-1, int(SPECINFER_WTYPE_Q4_0)}) {
    ModelOptions full_opt, cut_opt;
    full_opt.requant = cut_opt.requant = requant;
    cut_opt.vocab_limit = limit;
    Model full(*file, specinfer::default_host(), 64, full_opt);
    Model cut(*file, specinfer::default_host(), 64, cut_opt);
    const int V = full.hparams().n_vocab;
    cut.add_output_ids(&added, 1);
    std::vector<float> a(size_t(n) * size_t(V)), b(a.size());
    full.forward(ids, pos.data(), n, nullptr, n, a.data(), nullptr);
    cut.forward(ids, pos.data(), n, nullptr, n, b.data(), nullptr);
    assert_int_equal(cut.extra_output_ids().size(), 2);
    for (int t = 0; t < n; t++) {
      const float *ra = a.data() + size_t(t) * size_t(V), *rb = b.data() + size_t(t) * size_t(V);
      assert_memory_equal(ra, rb, size_t(limit) * sizeof(float));
      for (int v = limit; v < V; v++) {
        if (v == fed || v == added) {
          if (requant < 0)
            assert_true(ra[v] == rb[v]);
          else
            assert_true(std::fabs(ra[v] - rb[v]) <= 1e-3f * (1.0f + std::fabs(ra[v])));
        } else {
          assert_true(std::isinf(rb[v]) && rb[v] < 0);
        }
      }
    }
  }
  Model cut(*file, specinfer::default_host(), 64, [] {
    ModelOptions o;
    o.vocab_limit = limit;
    return o;
  }());
  const int32_t bad = -3;
  bool bad_id = false;
  try {
    cut.add_output_ids(&bad, 1);
  } catch (const specinfer::gguf::Error &e) {
    bad_id = e.code() == SPECINFER_ERR_INVALID_ARGUMENT;
  }
  assert_true(bad_id);
  bool threw = false;
  try {
    ModelOptions opt;
    opt.vocab_limit = -1;
    Model m(*file, specinfer::default_host(), 64, opt);
  } catch (const specinfer::gguf::Error &e) {
    threw = e.code() == SPECINFER_ERR_CONFIG;
  }
  assert_true(threw);
}
// requant: the draft re-quantized to Q4_0 in memory (its Q5_0 and Q8_0 matrices) still predicts
// what the file's model predicts on >= 90% of the positions of real code (97% when written), and
// re-quantized to Q3_0 (every matrix, Q4_K included) on >= 80% (92% when written); requant to
// Q8_0 converts only wider matrices, so for this file (nothing wider than Q8_0) it changes no
// logit; an unsupported type is a CONFIG error.
void test_requant(void **) {
  const std::string path = model_or_skip("qwen2.5-coder-0.5b");
  std::unique_ptr<File> file = File::open(path);
  const specinfer_host *host = specinfer::default_host();
  Model full(*file, host, 128);
  ModelOptions o4, o3, o8;
  o4.requant = SPECINFER_WTYPE_Q4_0;
  o3.requant = SPECINFER_WTYPE_Q3_0;
  o8.requant = SPECINFER_WTYPE_Q8_0;
  Model m4(*file, host, 128, o4), m3(*file, host, 128, o3), m8(*file, host, 128, o8);
  // Token ids of a short Python function (any real text works; these are from the tokenizer).
  std::unique_ptr<specinfer::gguf::Tokenizer> tok = specinfer::gguf::Tokenizer::from_gguf(*file);
  const std::string text =
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
      "        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n"
      "    return b\n\n\ndef is_prime(k):\n    if k < 2:\n        return False\n";
  std::vector<int32_t> ids = tok->encode(text, false, true);
  const int n = int(ids.size());
  assert_true(n > 40);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  const int V = full.hparams().n_vocab;
  std::vector<float> a(size_t(n) * size_t(V)), b4(a.size()), b3(a.size()), b8(a.size());
  full.forward(ids.data(), pos.data(), n, nullptr, n, a.data(), nullptr);
  m4.forward(ids.data(), pos.data(), n, nullptr, n, b4.data(), nullptr);
  m3.forward(ids.data(), pos.data(), n, nullptr, n, b3.data(), nullptr);
  m8.forward(ids.data(), pos.data(), n, nullptr, n, b8.data(), nullptr);
  int agree4 = 0, agree3 = 0, agree8 = 0;
  double diff4 = 0.0, diff8 = 0.0;
  for (int t = 1; t < n; t++) {  // position 0 left out, as in check_model
    const float *ra = a.data() + size_t(t) * size_t(V);
    const float *r4 = b4.data() + size_t(t) * size_t(V), *r8 = b8.data() + size_t(t) * size_t(V);
    const int top = argmax(ra, V);
    agree4 += argmax(r4, V) == top;
    agree3 += argmax(b3.data() + size_t(t) * size_t(V), V) == top;
    agree8 += argmax(r8, V) == top;
    for (int v = 0; v < V; v++) {
      diff4 += std::fabs(double(r4[v]) - double(ra[v]));
      diff8 += std::fabs(double(r8[v]) - double(ra[v]));
    }
  }
  diff4 /= double(n - 1) * V;
  diff8 /= double(n - 1) * V;
  print_message(
      "requant 0.5B, %d positions: top-1 agreement with the file's weights q4_0 %d, q3_0 %d, "
      "q8_0 %d; mean |dlogit| q4_0 %.3f, q8_0 %.3f\n",
      n - 1, agree4, agree3, agree8, diff4, diff8);
  assert_true(agree4 >= (n - 1) * 9 / 10);
  assert_true(agree3 >= (n - 1) * 8 / 10);
  assert_true(diff4 > 0.0);  // the weights did change
  assert_memory_equal(a.data(), b8.data(), a.size() * sizeof(float));
  bool threw = false;
  try {
    ModelOptions bad;
    bad.requant = SPECINFER_WTYPE_Q4_K;
    Model m(*file, host, 64, bad);
  } catch (const specinfer::gguf::Error &e) {
    threw = e.code() == SPECINFER_ERR_CONFIG;
  }
  assert_true(threw);
}
void test_qwen_15b(void **) {
  check_model("qwen2.5-coder-1.5b");
}
void test_gemma_270m(void **) {
  check_model("gemma-3-270m");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qwen_05b), cmocka_unit_test(test_vocab_limit),
      cmocka_unit_test(test_requant),  cmocka_unit_test(test_gemma_270m),
      cmocka_unit_test(test_qwen_15b),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
