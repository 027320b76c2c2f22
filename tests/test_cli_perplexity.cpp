// Tests of `specinfer perplexity` and of specinfer_target_eval, the public call it scores with.
// The perplexity the command prints is recomputed here from logits taken through the public ABI
// with the chunk rules written out independently (chunks of ctx tokens from an empty cache, bos
// first when the model adds one, positions ctx/2 .. ctx-2 scoring the token after them): on a
// kgram target always, on Gemma 3 270M (or the Qwen2.5-Coder 0.5B) when present, whose value must
// also be a sane perplexity for English text. A run's saved log-probabilities compared with
// themselves give zero KL divergence and top-1 agreement up to the file's 16-bit resolution.
// Usage errors exit 2 naming the option; a missing text or base file exits 1 naming the file.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "specinfer.h"
#include "support/cli_run.h"
#include "support/cmocka_setup.h"
#include "support/models.h"

namespace {

std::string g_dir;

using Result = CliResult;

// Runs `specinfer args...` with stdout and stderr caught.
Result run(const std::vector<std::string> &args) {
  return run_cli(SPECINFER_CLI, g_dir, args);
}

void expect(const std::vector<std::string> &args, int status, const std::string &text) {
  const Result r = run(args);
  if (r.status != status || r.err.find(text) == std::string::npos) {
    std::string cmd;
    for (const std::string &a : args) cmd += " " + a;
    print_error("specinfer%s: exit %d (want %d), want \"%s\" in stderr\nstdout:\n%s\nstderr:\n%s\n",
                cmd.c_str(), r.status, status, text.c_str(), r.out.c_str(), r.err.c_str());
    fail();
  }
}

// "Final estimate: PPL = X +/- Y" -> X; NaN when absent.
double printed_ppl(const std::string &out) {
  const std::string key = "Final estimate: PPL = ";
  const size_t at = out.find(key);
  return at == std::string::npos ? NAN : std::strtod(out.c_str() + at + key.size(), nullptr);
}

// A "Name : value" line's value; NaN when absent.
double printed_value(const std::string &out, const std::string &name) {
  const size_t at = out.find(name);
  if (at == std::string::npos) return NAN;
  const size_t colon = out.find(':', at);
  return std::strtod(out.c_str() + colon + 1, nullptr);
}

std::string text_path() {
  return g_dir + "/text.txt";
}

// Perplexity by the chunk rules, from one pass per chunk that returns every position's logits.
double recompute(const std::string &plugin, const std::string &config, int32_t ctx,
                 int32_t max_chunks) {
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  specinfer_target *t = nullptr;
  assert_int_equal(specinfer_target_open(reg, plugin.c_str(), config.c_str(), &t, nullptr),
                   SPECINFER_OK);
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  assert_int_equal(specinfer_target_info(t, &info), SPECINFER_OK);
  const std::string text = read_all(text_path());
  std::vector<int32_t> ids(text.size() + 8);
  size_t n = 0;
  assert_int_equal(
      specinfer_target_tokenize(t, text.data(), text.size(), 1, 0, ids.data(), ids.size(), &n),
      SPECINFER_OK);
  const int32_t chunks = std::min<int32_t>(int32_t(n / size_t(ctx)), max_chunks);
  assert_true(chunks >= 1);
  const size_t v = size_t(info.vocab_size);
  std::vector<float> logits(size_t(ctx) * v);
  double nll = 0;
  int64_t count = 0;
  for (int32_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> chunk(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    if (info.add_bos) chunk[0] = info.bos_token;
    specinfer_eval_params p;
    specinfer_eval_params_init(&p);
    p.tokens = chunk.data();
    p.n_tokens = chunk.size();
    p.n_logits = ctx;
    p.logits = logits.data();
    int32_t cached = -1;
    assert_int_equal(specinfer_target_eval(t, &p, &cached), SPECINFER_OK);
    assert_int_equal(cached, ctx);
    for (int32_t pos = ctx / 2; pos + 1 < ctx; ++pos) {
      const float *row = logits.data() + size_t(pos) * v;
      double mx = row[0], sum = 0;
      for (size_t i = 1; i < v; ++i) mx = std::max(mx, double(row[i]));
      for (size_t i = 0; i < v; ++i) sum += std::exp(double(row[i]) - mx);
      nll += mx + std::log(sum) - row[chunk[size_t(pos) + 1]];
      ++count;
    }
  }
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
  return std::exp(nll / double(count));
}

std::string kgram_config() {
  return "path=" + text_path() + ",k=3";
}

int setup(void **) {
  char tmpl[] = "/tmp/specinfer-test-ppl-XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  g_dir = tmpl;
  // English prose with enough variety that a language model neither memorizes nor is lost.
  std::string text;
  const char *const sentences[] = {
      "The river rose through the night, and by morning the low fields were under water. ",
      "Farmers moved their cattle to the hills while the children watched from the bridge. ",
      "A speculative decoder drafts a few tokens cheaply and lets the large model check them. ",
      "When the draft is right, several tokens are accepted for the price of a single pass. ",
      "The library opened at nine, and the first visitors asked for maps of the old town. ",
      "She wrote the numbers in a notebook, checked them twice, and sent the report at noon. ",
      "Rain fell on the roofs of the station as the last train left for the coast. ",
      "Each chapter begins with a question and ends with an answer the reader did not expect. "};
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 8; ++j) text += sentences[(i * 3 + j) % 8];
  std::ofstream(text_path(), std::ios::binary) << text;
  return 0;
}

int teardown(void **) {
  return std::system(("rm -rf " + quote(g_dir)).c_str()) == 0 ? 0 : -1;
}

void test_usage_errors(void **) {
  const std::string t = "kgram:" + kgram_config();
  const std::string f = text_path();
  expect({"perplexity", "--file", f}, 2, "--target is required");
  expect({"perplexity", "--target", t}, 2, "--file is required");
  expect({"perplexity", "--target", t, "--file", f, "--ctx", "4"}, 2, "--ctx");
  expect({"perplexity", "--target", t, "--file", f, "--batch", "-1"}, 2, "--batch");
  expect({"perplexity", "--target", t, "--file", f, "--chunks", "x"}, 2, "--chunks");
  expect({"perplexity", "--target", t, "--kl-divergence"}, 2, "--kl-divergence-base");
  expect(
      {"perplexity", "--target", t, "--kl-divergence", "--kl-divergence-base", "b", "--ctx", "64"},
      2, "--ctx");
  expect({"perplexity", "--target", t, "--file", f, "--frobnicate"}, 2, "--frobnicate");
  // Files that are not there, or not right, are named.
  expect({"perplexity", "--target", t, "--file", g_dir + "/absent.txt"}, 1,
         "cannot read " + g_dir + "/absent.txt");
  expect({"perplexity", "--target", t, "--kl-divergence", "--kl-divergence-base",
          g_dir + "/absent.kld"},
         1, "cannot read " + g_dir + "/absent.kld");
  expect({"perplexity", "--target", t, "--kl-divergence", "--kl-divergence-base", f}, 1,
         "is not a log-probability file");
  // Too short a text for the context says how many tokens it needs.
  expect({"perplexity", "--target", t, "--file", f, "--ctx", "8000"}, 1, "needs at least 16000");
  expect({"perplexity", "--target", t, "--file", f, "--ctx", "9000"}, 1,
         "exceeds the model's 8192");
}

// The command's value, passes of any size, the recomputation, and the KL self-comparison.
// Top-1 agreement with the saved copy of the same run is not quite 100%: the file keeps 16-bit
// log-probabilities (steps of 16/65535 nats), so a runner-up within half a step of the top ties it
// there and the tie goes to the lower id; count-based k-gram rows have such near-ties often.
void check_target(const std::string &plugin, const std::string &config, const char *ctx,
                  int32_t chunks, double lo, double hi, double min_same_top) {
  const std::string spec = plugin + ":" + config;
  const std::string n = std::to_string(chunks);
  const Result whole =
      run({"perplexity", "--target", spec, "-f", text_path(), "--ctx", ctx, "--chunks", n});
  if (whole.status != 0) print_error("%s\n%s\n", whole.out.c_str(), whole.err.c_str());
  assert_int_equal(whole.status, 0);
  const double ppl = printed_ppl(whole.out);
  print_message("%s: perplexity %.4f\n", spec.c_str(), ppl);
  assert_true(std::isfinite(ppl));
  assert_true(ppl > lo && ppl < hi);
  assert_true(whole.err.find("chunks [") != std::string::npos);  // the progress bar
  assert_true(whole.out.find(" +/- ") != std::string::npos);

  const double again = recompute(plugin, config, std::atoi(ctx), chunks);
  print_message("  recomputed through specinfer_target_eval: %.4f\n", again);
  assert_true(std::fabs(ppl - again) <= 1e-4 * again + 1e-4);

  // Passes of 7 tokens: the cache carries each chunk over many calls, the value stays.
  const Result split = run({"perplexity", "--target", spec, "-f", text_path(), "--ctx", ctx,
                            "--chunks", n, "--batch", "7"});
  assert_int_equal(split.status, 0);
  assert_true(std::fabs(printed_ppl(split.out) - ppl) <= 1e-3 * ppl);

  // Saved, then compared with itself: no divergence, the same top token everywhere.
  const std::string base = g_dir + "/base.kld";
  const Result saved = run({"perplexity", "--target", spec, "-f", text_path(), "--ctx", ctx,
                            "--chunks", n, "--kl-divergence-base", base});
  assert_int_equal(saved.status, 0);
  assert_true(std::fabs(printed_ppl(saved.out) - ppl) <= 1e-6 * ppl);
  const Result kl = run({"perplexity", "--target", spec, "-f", text_path(), "--kl-divergence-base",
                         base, "--kl-divergence"});
  if (kl.status != 0) print_error("%s\n%s\n", kl.out.c_str(), kl.err.c_str());
  assert_int_equal(kl.status, 0);
  assert_true(kl.out.find("equal ours") != std::string::npos);
  assert_true(std::fabs(printed_value(kl.out, "Mean KLD")) < 1e-3);
  assert_true(printed_value(kl.out, "Same top p") >= min_same_top);
  // The base's perplexity comes from 16-bit log-probabilities: close to ours, not equal.
  assert_true(std::fabs(printed_value(kl.out, "Mean PPL(base)") / ppl - 1) < 1e-3);
  std::remove(base.c_str());
}

void test_kgram(void **) {
  // A k-gram model trained on the text itself: far better than chance (256 bytes), not perfect.
  check_target("kgram", kgram_config(), "64", 8, 1.0, 20.0, 95.0);
}

void test_real_model(void **) {
  char path[4096];
  if (!model_path("gemma-3-270m.gguf", path, sizeof path) &&
      !model_path("qwen2.5-coder-0.5b.gguf", path, sizeof path)) {
    print_message("no gemma-3-270m.gguf or qwen2.5-coder-0.5b.gguf in %s: skipped\n", models_dir());
    skip();
  }
  // Plain English: a small model sits well below 100 and, with half a chunk of context on
  // repeated sentences, above 1.
  check_target("gguf", std::string("path=") + path, "128", 4, 1.0, 100.0, 99.0);
}

// specinfer_target_eval's attention observer and the model info's chat template through the
// library: the gguf plugin reports every layer of every pass (shapes and positions as given),
// the kgram plugin, which has no attention, never calls it.
struct Seen {
  int calls = 0, bad = 0, last_layer = -1, n_layer = 0;
};

void count_view(void *ctx, const specinfer_qk_view *v) {
  auto &s = *static_cast<Seen *>(ctx);
  ++s.calls;
  s.n_layer = v->n_layer;
  if (v->layer != (s.last_layer + 1) % v->n_layer || v->n_tokens != 5 ||
      (v->first_pos != 0 && v->first_pos != 5) || v->q == nullptr || v->k == nullptr ||
      v->head_dim <= 0 || v->n_head % v->n_head_kv != 0)
    ++s.bad;
  s.last_layer = v->layer;
}

void observe_through(const std::string &plugin, const std::string &config, Seen *seen,
                     specinfer_model_info *info) {
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  specinfer_target *t = nullptr;
  assert_int_equal(specinfer_target_open(reg, plugin.c_str(), config.c_str(), &t, nullptr),
                   SPECINFER_OK);
  specinfer_model_info_init(info);
  assert_int_equal(specinfer_target_info(t, info), SPECINFER_OK);
  const std::string chat = info->chat_template ? info->chat_template : "";
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  for (int past : {0, 5}) {
    specinfer_eval_params p;
    specinfer_eval_params_init(&p);
    p.tokens = ids.data() + past;
    p.n_tokens = 5;
    p.n_past = past;
    p.qk_observer = count_view;
    p.qk_ctx = seen;
    assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_OK);
  }
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
  info->chat_template = chat.empty() ? nullptr : "";  // only whether there was one survives
}

void test_eval_observer(void **) {
  Seen kg;
  specinfer_model_info info;
  observe_through("kgram", kgram_config(), &kg, &info);
  assert_int_equal(kg.calls, 0);
  assert_null(info.chat_template);
  char path[4096];
  if (!model_path("qwen2.5-coder-0.5b.gguf", path, sizeof path)) {
    print_message("no qwen2.5-coder-0.5b.gguf in %s: the gguf part skipped\n", models_dir());
    return;
  }
  Seen gg;
  observe_through("gguf", std::string("path=") + path, &gg, &info);
  assert_int_equal(gg.n_layer, 24);
  assert_int_equal(gg.calls, 2 * 24);
  assert_int_equal(gg.bad, 0);
  assert_non_null(info.chat_template);  // Qwen2.5's GGUF carries its chat template
}

void test_eval_errors(void **) {
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  specinfer_target *t = nullptr;
  assert_int_equal(specinfer_target_open(reg, "kgram", kgram_config().c_str(), &t, nullptr),
                   SPECINFER_OK);
  const int32_t ids[4] = {'a', 'b', 'c', 'd'};
  float logits[2 * 256];
  specinfer_eval_params p;
  specinfer_eval_params_init(&p);
  p.tokens = ids;
  p.n_tokens = 4;
  p.n_logits = 2;
  p.logits = logits;
  int32_t cached = -1;
  assert_int_equal(specinfer_target_eval(t, &p, &cached), SPECINFER_OK);
  assert_int_equal(cached, 4);
  // A query: params NULL reports the cache.
  cached = -1;
  assert_int_equal(specinfer_target_eval(t, nullptr, &cached), SPECINFER_OK);
  assert_int_equal(cached, 4);
  // n_past beyond the cache, n_logits beyond the tokens, NULL logits, an id outside the vocabulary.
  p.n_past = 5;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_true(std::string(specinfer_target_errmsg(t)).find("n_past") != std::string::npos);
  p.n_past = 2;
  p.n_logits = 5;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  p.n_logits = 1;
  p.logits = nullptr;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  p.logits = logits;
  const int32_t bad[1] = {1 << 20};
  p.tokens = bad;
  p.n_tokens = 1;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  p.struct_size = 0;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_target_eval(nullptr, &p, nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
  // Failed calls leave the cache alone.
  assert_int_equal(specinfer_target_eval(t, nullptr, &cached), SPECINFER_OK);
  assert_int_equal(cached, 4);
  // Rescoring from n_past 2 gives the logits of the first scoring's position 3.
  specinfer_eval_params_init(&p);
  p.tokens = ids + 2;
  p.n_tokens = 2;
  p.n_past = 2;
  p.n_logits = 1;
  float again[256];
  p.logits = again;
  assert_int_equal(specinfer_target_eval(t, &p, &cached), SPECINFER_OK);
  assert_int_equal(cached, 4);
  for (int i = 0; i < 256; ++i) assert_true(std::fabs(again[i] - logits[256 + i]) < 1e-5f);
  // The context window bounds a pass.
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  specinfer_target_info(t, &info);
  std::vector<int32_t> many(size_t(info.n_ctx) + 1, 'a');
  specinfer_eval_params_init(&p);
  p.tokens = many.data();
  p.n_tokens = many.size();
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_CONTEXT_FULL);
  // While a session holds the target, eval is refused; after it, the session starts afresh.
  specinfer_session *s = nullptr;
  assert_int_equal(specinfer_session_create(t, nullptr, nullptr, nullptr, &s, nullptr),
                   SPECINFER_OK);
  specinfer_eval_params_init(&p);
  p.tokens = ids;
  p.n_tokens = 1;
  assert_int_equal(specinfer_target_eval(t, &p, nullptr), SPECINFER_ERR_STATE);
  specinfer_session_destroy(s);
  assert_int_equal(specinfer_target_eval(t, &p, &cached), SPECINFER_OK);
  assert_int_equal(cached, 1);
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_usage_errors),  cmocka_unit_test(test_eval_errors),
      cmocka_unit_test(test_eval_observer), cmocka_unit_test(test_kgram),
      cmocka_unit_test(test_real_model),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
