// Whole-model forward passes through the gguf plugin: the time of one batched forward of n tokens
// (the verification pass of speculative decoding scores n tokens at once and needs logits for all
// of them) after a fixed cached context, prefill of 512 tokens, and decode at a long context for
// each KV cache type (BM_LongContext), and sketched attention's agreement with exact attention
// and speed there (BM_SketchedQuality).
//
//   SPECINFER_PLUGIN_PATH=<build>/plugins SPECINFER_BENCH_MODEL=<file.gguf>
//     ./bench_forward --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// SPECINFER_BENCH_MODEL defaults to ~/.cache/specinfer/models/qwen2.5-coder-1.5b.gguf;
// SPECINFER_BENCH_THREADS (default 2) sets the registry's threads. Without the model file every
// benchmark is skipped.
#include <benchmark/benchmark.h>

#include <sys/stat.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "api/handles.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

namespace {

std::string model_path() {
  if (const char *p = std::getenv("SPECINFER_BENCH_MODEL")) return p;
  const char *home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/specinfer/models/qwen2.5-coder-1.5b.gguf";
}

int bench_threads() {
  const char *s = std::getenv("SPECINFER_BENCH_THREADS");
  const int n = s ? std::atoi(s) : 2;
  return n > 0 ? n : 2;
}

// A registry with the benchmarks' thread count, or nullptr and its error in *error.
specinfer_registry *open_registry(std::string *error) {
  specinfer_registry_params params;
  specinfer_registry_params_init(&params);
  params.n_threads = bench_threads();
  specinfer_registry *reg = nullptr;
  char *msg = nullptr;
  if (specinfer_registry_create(&params, &reg, &msg) != SPECINFER_OK) {
    *error = msg ? msg : "registry_create failed";
    specinfer_free(msg);
    return nullptr;
  }
  return reg;
}

// One registry and target for the whole run (opened on first use).
struct Model {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  specinfer_model_info info{};
  std::string error;

  Model() {
    const std::string path = model_path();
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      error = "no model file " + path + " (set SPECINFER_BENCH_MODEL)";
      return;
    }
    reg = open_registry(&error);
    if (reg == nullptr) return;
    char *msg = nullptr;
    // SPECINFER_BENCH_CONFIG: extra target config, e.g. "pack=0" to time the unpacked kernels.
    std::string config = "path=" + path;
    if (const char *extra = std::getenv("SPECINFER_BENCH_CONFIG"); extra && *extra)
      config += std::string(",") + extra;
    if (specinfer_target_open(reg, "gguf", config.c_str(), &target, &msg) != SPECINFER_OK) {
      error = msg ? msg : "target_open failed";
      specinfer_free(msg);
      target = nullptr;
      return;
    }
    specinfer_model_info_init(&info);
    specinfer_target_info(target, &info);
  }
  ~Model() {
    if (target) specinfer_target_destroy(target);
    if (reg) specinfer_registry_destroy(reg);
  }
};

Model &model() {
  static Model m;
  return m;
}

// Runs one forward of `n` tokens at positions pos0.. with logits for the last n_logits.
void forward(Model &m, int32_t pos0, int32_t n, int32_t n_logits, std::vector<float> &logits) {
  std::vector<int32_t> tokens(static_cast<size_t>(n)), positions(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] = (1000 + 37 * (pos0 + i)) % 30000;  // arbitrary ordinary tokens
    positions[static_cast<size_t>(i)] = pos0 + i;
  }
  logits.resize(static_cast<size_t>(n_logits) * static_cast<size_t>(m.info.vocab_size));
  specinfer_forward_batch b{};
  b.struct_size = sizeof b;
  b.n_tokens = n;
  b.tokens = tokens.data();
  b.positions = positions.data();
  b.n_logits = n_logits;
  b.logits = logits.data();
  static_cast<specinfer::TargetObject *>(m.target)->forward(b);
}

// The median of v (0 for none).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The median milliseconds of two passes, a() and b(), run one after the other every iteration so
// that both see the same memory bandwidth (on a shared machine it swings by half within minutes,
// more than the differences these benchmarks measure). reset() runs, untimed, before each.
template <class Reset, class A, class B>
std::pair<double, double> alternated_ms(benchmark::State &state, Reset &&reset, A &&a, B &&b) {
  std::vector<double> ms_a, ms_b;
  const auto time = [&](auto &&pass) {
    reset();
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    ms_a.push_back(time(a));
    ms_b.push_back(time(b));
  }
  return {median(ms_a), median(ms_b)};
}

// The target with ctx tokens in its cache, or NULL (the benchmark skipped) without the model.
specinfer::TargetObject *with_context(benchmark::State &state, Model &m, int32_t ctx,
                                      std::vector<float> &logits) {
  if (!m.target) {
    state.SkipWithError(m.error.c_str());
    return nullptr;
  }
  auto *t = static_cast<specinfer::TargetObject *>(m.target);
  t->kv_truncate(0);
  forward(m, 0, ctx, 1, logits);
  return t;
}

// n tokens after a cached context of 64, logits for all n (a verification pass).
void BM_Forward(benchmark::State &state) {
  Model &m = model();
  const int32_t ctx = 64, n = static_cast<int32_t>(state.range(0));
  std::vector<float> logits;
  specinfer::TargetObject *t = with_context(state, m, ctx, logits);
  if (!t) return;
  for (auto _ : state) {
    t->kv_truncate(ctx);
    forward(m, ctx, n, n, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
  state.SetLabel(m.info.name ? m.info.name : "");
}
BENCHMARK(BM_Forward)
    ->DenseRange(1, 8)
    ->Arg(16)
    ->ArgName("tok")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The verify curve as a ratio: one forward of n tokens and one of a single token, alternated
// (alternated_ms). Counters: median milliseconds of each and their ratio (the design target: at
// most 1.3 for 5 tokens).
void BM_VerifyRatio(benchmark::State &state) {
  Model &m = model();
  const int32_t ctx = 64, n = static_cast<int32_t>(state.range(0));
  std::vector<float> logits;
  specinfer::TargetObject *t = with_context(state, m, ctx, logits);
  if (!t) return;
  const auto pass = [&](int32_t k) {
    forward(m, ctx, k, k, logits);
    benchmark::DoNotOptimize(logits.data());
  };
  const auto [one, many] = alternated_ms(
      state, [&] { t->kv_truncate(ctx); }, [&] { pass(1); }, [&] { pass(n); });
  state.counters["one_ms"] = one;
  state.counters["n_ms"] = many;
  state.counters["ratio"] = many / one;
  state.SetLabel(m.info.name ? m.info.name : "");
}
BENCHMARK(BM_VerifyRatio)
    ->Arg(2)
    ->Arg(4)
    ->Arg(5)
    ->Arg(8)
    ->ArgName("tok")
    ->MinTime(3.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// What a pass's logit rows cost: n tokens after a cached context of 64, once with logits for all n
// (a verification pass) and once for the last alone (a prompt chunk), alternated every iteration
// (alternated_ms). Counters: median milliseconds of each and row_ms, the time of one more
// logit row ((all - one) / (n - 1)): the output matrix over the vocabulary, which the session's
// pass cost model (lib/session/pass_cost.h) adds per row.
void BM_LogitRows(benchmark::State &state) {
  Model &m = model();
  const int32_t ctx = 64, n = static_cast<int32_t>(state.range(0));
  std::vector<float> logits;
  specinfer::TargetObject *t = with_context(state, m, ctx, logits);
  if (!t) return;
  const auto pass = [&](int32_t rows) {
    forward(m, ctx, n, rows, logits);
    benchmark::DoNotOptimize(logits.data());
  };
  const auto [all, one] = alternated_ms(
      state, [&] { t->kv_truncate(ctx); }, [&] { pass(n); }, [&] { pass(1); });
  state.counters["all_ms"] = all;
  state.counters["one_ms"] = one;
  state.counters["row_ms"] = (all - one) / (n - 1);
  state.SetLabel(m.info.name ? m.info.name : "");
}
BENCHMARK(BM_LogitRows)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->ArgName("tok")
    ->MinTime(3.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A token tree against a chain of the same size: 8 tokens after a cached context of ctx, logits for
// all, once with a tree mask (the last token, then two children per level along one branch: parents
// -1, 0, 0, 2, 2, 4, 4, 6 in the batch, positions parent + 1) and once causal at consecutive
// positions, alternated (alternated_ms). Counters: median milliseconds of each and their ratio,
// the cost of verifying a tree rather than a chain.
void BM_VerifyTree(benchmark::State &state) {
  Model &m = model();
  const int32_t ctx = static_cast<int32_t>(state.range(0)), n = 8;
  std::vector<float> logits;
  specinfer::TargetObject *t = with_context(state, m, ctx, logits);
  if (!t) return;
  const int32_t parent[n] = {-1, 0, 0, 2, 2, 4, 4, 6};
  std::vector<int32_t> tokens(n), chain_pos(n), tree_pos(n);
  std::vector<uint8_t> mask(static_cast<size_t>(n) * n, 0);
  for (int32_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] = (1000 + 37 * (ctx + i)) % 30000;  // arbitrary ordinary tokens
    chain_pos[static_cast<size_t>(i)] = ctx + i;
    tree_pos[static_cast<size_t>(i)] =
        parent[i] < 0 ? ctx : tree_pos[static_cast<size_t>(parent[i])] + 1;
    for (int32_t j = i; j >= 0; j = parent[j]) mask[static_cast<size_t>(i) * n + j] = 1;
  }
  logits.resize(static_cast<size_t>(n) * static_cast<size_t>(m.info.vocab_size));
  const auto pass = [&](bool tree) {
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = n;
    b.tokens = tokens.data();
    b.positions = tree ? tree_pos.data() : chain_pos.data();
    b.tree_mask = tree ? mask.data() : nullptr;
    b.n_logits = n;
    b.logits = logits.data();
    t->forward(b);
    benchmark::DoNotOptimize(logits.data());
  };
  const auto [chain, tree] = alternated_ms(
      state, [&] { t->kv_truncate(ctx); }, [&] { pass(false); }, [&] { pass(true); });
  state.counters["chain_ms"] = chain;
  state.counters["tree_ms"] = tree;
  state.counters["ratio"] = tree / chain;
  state.SetLabel(m.info.name ? m.info.name : "");
}
BENCHMARK(BM_VerifyTree)
    ->Arg(64)
    ->Arg(1024)
    ->ArgName("ctx")
    ->MinTime(3.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Several sequences on one loaded model (shares of the benchmark's target), each with a cached
// context of 64 and `tok` new tokens (1: a decode step; 5: a verification pass), once as one
// forward_many and once as a forward per sequence, alternated (alternated_ms). Counters: median
// milliseconds of each and their ratio (one pass / separate passes): how much cheaper serving
// several users is when their steps share the weights' stream.
void BM_ForwardMany(benchmark::State &state) {
  Model &m = model();
  if (!m.target) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  const auto n_seq = static_cast<size_t>(state.range(0));
  const auto tok = static_cast<int32_t>(state.range(1));
  const int32_t ctx = 64;
  const auto vocab = static_cast<size_t>(m.info.vocab_size);
  std::vector<specinfer_target *> shares(n_seq, nullptr);
  std::vector<specinfer::TargetObject *> seqs(n_seq);
  for (size_t i = 0; i < n_seq; ++i) {
    if (specinfer_target_share(m.target, &shares[i], nullptr) != SPECINFER_OK) {
      state.SkipWithError("specinfer_target_share failed");
      for (specinfer_target *t : shares) specinfer_target_destroy(t);
      return;
    }
    seqs[i] = shares[i];
  }
  std::vector<int32_t> tokens(static_cast<size_t>(ctx)), pos(static_cast<size_t>(ctx + tok));
  for (int32_t i = 0; i < ctx + tok; ++i) pos[static_cast<size_t>(i)] = i;
  std::vector<std::vector<int32_t>> next(n_seq);
  std::vector<float> logits(n_seq * static_cast<size_t>(tok) * vocab);
  std::vector<specinfer_forward_batch> batches(n_seq);
  for (size_t i = 0; i < n_seq; ++i) {
    for (int32_t j = 0; j < ctx; ++j)
      tokens[static_cast<size_t>(j)] = static_cast<int32_t>((1000 + 37 * j + 101 * i) % 30000);
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = ctx;
    b.tokens = tokens.data();
    b.positions = pos.data();
    b.n_logits = 1;
    b.logits = logits.data();
    seqs[i]->forward(b);
    for (int32_t j = 0; j < tok; ++j)
      next[i].push_back(static_cast<int32_t>((2000 + 53 * j + 7 * i) % 30000));
    specinfer_forward_batch &v = batches[i];
    v = specinfer_forward_batch{};
    v.struct_size = sizeof v;
    v.n_tokens = tok;
    v.tokens = next[i].data();
    v.positions = pos.data() + ctx;
    v.n_logits = tok;
    v.logits = logits.data() + i * static_cast<size_t>(tok) * vocab;
  }
  const auto [together, apart] = alternated_ms(
      state,
      [&] {
        for (auto *t : seqs) t->kv_truncate(ctx);
      },
      [&] {
        specinfer::TargetObject::forward_many(seqs.data(), batches.data(),
                                              static_cast<int32_t>(n_seq));
        benchmark::DoNotOptimize(logits.data());
      },
      [&] {
        for (size_t i = 0; i < n_seq; ++i) seqs[i]->forward(batches[i]);
        benchmark::DoNotOptimize(logits.data());
      });
  state.counters["one_pass_ms"] = together;
  state.counters["separate_ms"] = apart;
  state.counters["ratio"] = together / apart;
  state.SetLabel(m.info.name ? m.info.name : "");
  for (specinfer_target *t : shares) specinfer_target_destroy(t);
}
BENCHMARK(BM_ForwardMany)
    ->ArgsProduct({{2, 4, 8}, {1}})
    ->ArgsProduct({{2, 4}, {5}})
    ->ArgNames({"seqs", "tok"})
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Prefill: 512 tokens from an empty cache, logits for the last one.
void BM_Prefill(benchmark::State &state) {
  Model &m = model();
  if (!m.target) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  auto *t = static_cast<specinfer::TargetObject *>(m.target);
  const int32_t n = static_cast<int32_t>(state.range(0));
  std::vector<float> logits;
  for (auto _ : state) {
    t->kv_truncate(0);
    forward(m, 0, n, 1, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n, benchmark::Counter::kIsRate);
  state.SetLabel(m.info.name ? m.info.name : "");
}
BENCHMARK(BM_Prefill)->Arg(512)->ArgName("tok")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// Decode at a long context against decode at a short one, for each KV cache type, in one run:
// per type a target (config + ",kv_type=T") whose cache holds SPECINFER_BENCH_DEPTH tokens
// (default 16000) of real text, and a target shared from it holding 64. Every round times one
// decode step of each at every type in turn (the bandwidth of a shared machine swings within
// minutes; interleaving lets every ratio see the same conditions). Counters per type: median
// milliseconds at depth and at 64, their ratio (the long context's fraction of short-context
// speed), the speed-up over f32 at depth, and prefill tokens/s of the long context (512-token
// batches). Environment:
//   SPECINFER_BENCH_DEPTH     context tokens (required: without it the benchmark is skipped)
//   SPECINFER_BENCH_TEXT      the text file they come from (default: the .py files of
//                             /usr/lib/python3.11 in name order, concatenated)
//   SPECINFER_BENCH_KV_TYPES  comma-separated (default "f32,f16,q8_0"); more target options may
//                             follow a type after '+' ("q8_0+kv_tiles=0": q8_0 keys in rows)
//   SPECINFER_BENCH_ROUNDS    rounds of timed steps (default 15)
// Run alone: --benchmark_filter=LongContext (prefilling 16k tokens takes minutes per type).
// A depth of 64 or less, or beyond the text, is an error.
std::string env_or(const char *name, const char *dflt) {
  const char *v = std::getenv(name);
  return v && *v ? v : dflt;
}

std::string context_text() {
  std::string file = env_or("SPECINFER_BENCH_TEXT", "");
  std::string text;
  std::vector<std::string> files;
  if (!file.empty()) {
    files.push_back(file);
  } else {
    // The standard library's own sources, in a fixed order.
    if (FILE *ls = popen("ls /usr/lib/python3.11/*.py 2>/dev/null", "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, ls)) {
        std::string f(line);
        while (!f.empty() && (f.back() == '\n' || f.back() == '\r')) f.pop_back();
        files.push_back(f);
      }
      pclose(ls);
    }
  }
  for (const std::string &f : files) {
    std::ifstream in(f, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (text.size() > 400000) break;  // ~100k tokens: more than any depth wanted here
  }
  return text;
}

// Feeds n tokens of text, from token `from` on, to a fresh target at positions 0 .. n - 1 in
// passes of 512; the last one's logits go to `logits` (vocabulary-sized). Returns the tokens per
// second.
double prefill_text(specinfer_target *tg, const std::vector<int32_t> &text, int32_t n,
                    float *logits, int32_t from = 0) {
  auto *t = static_cast<specinfer::TargetObject *>(tg);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int32_t p = 0; p < n; ++p) pos[static_cast<size_t>(p)] = p;
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t p = 0; p < n; p += 512) {
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = std::min(512, n - p);
    b.tokens = text.data() + from + p;
    b.positions = pos.data() + p;
    b.n_logits = p + b.n_tokens == n ? 1 : 0;
    b.logits = logits;
    t->forward(b);
  }
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The model file and SPECINFER_BENCH_DEPTH the long-context benchmarks need: false (and the
// benchmark skipped with a message) when either is missing.
bool long_context_ready(benchmark::State &state) {
  const std::string path = model_path();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    state.SkipWithError(("no model file " + path).c_str());
    return false;
  }
  if (env_or("SPECINFER_BENCH_DEPTH", "").empty()) {
    state.SkipWithError("set SPECINFER_BENCH_DEPTH (e.g. 16000) to run");
    return false;
  }
  return true;
}

void BM_LongContext(benchmark::State &state) {
  if (!long_context_ready(state)) return;
  const std::string path = model_path();
  const int32_t depth = std::atoi(env_or("SPECINFER_BENCH_DEPTH", "").c_str()), shallow = 64;
  if (depth <= shallow) {
    state.SkipWithError("SPECINFER_BENCH_DEPTH must be above 64");
    return;
  }
  const int rounds = std::max(1, std::atoi(env_or("SPECINFER_BENCH_ROUNDS", "15").c_str()));
  std::vector<std::string> types;
  {
    std::stringstream ss(env_or("SPECINFER_BENCH_KV_TYPES", "f32,f16,q8_0"));
    for (std::string t; std::getline(ss, t, ',');)
      if (!t.empty()) types.push_back(t);
  }
  std::string error;
  specinfer_registry *reg = open_registry(&error);
  if (reg == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  char *msg = nullptr;
  struct PerType {
    specinfer_target *deep = nullptr, *shallow = nullptr;
    double prefill_tps = 0;
    std::vector<double> deep_ms, shallow_ms;
  };
  std::vector<PerType> per(types.size());
  std::vector<int32_t> text;
  int32_t vocab = 0;
  std::string extra = env_or("SPECINFER_BENCH_CONFIG", "");
  for (size_t i = 0; i < types.size() && error.empty(); ++i) {
    // "q8_0+kv_tiles=0": a type and more target options, '+' between them.
    std::string opts = types[i];
    std::replace(opts.begin(), opts.end(), '+', ',');
    const std::string config = "path=" + path + ",n_ctx=" + std::to_string(depth + shallow) +
                               ",kv_type=" + opts + (extra.empty() ? "" : "," + extra);
    if (specinfer_target_open(reg, "gguf", config.c_str(), &per[i].deep, &msg) != SPECINFER_OK ||
        specinfer_target_share(per[i].deep, &per[i].shallow, &msg) != SPECINFER_OK) {
      error = msg ? msg : "target_open failed";
      specinfer_free(msg);
      break;
    }
    if (text.empty()) {
      specinfer_model_info info;
      specinfer_model_info_init(&info);
      specinfer_target_info(per[i].deep, &info);
      vocab = info.vocab_size;
      const std::string t = context_text();
      text = static_cast<specinfer::TargetObject *>(per[i].deep)
                 ->tokenize(t.c_str(), t.size(), false, false);
      if (static_cast<int32_t>(text.size()) < depth + 1) {
        error = "the text has " + std::to_string(text.size()) + " tokens, fewer than the depth";
        break;
      }
    }
    std::vector<float> logits(static_cast<size_t>(vocab));
    per[i].prefill_tps = prefill_text(per[i].deep, text, depth, logits.data());
    prefill_text(per[i].shallow, text, shallow, logits.data());
  }
  const auto step_ms = [&](specinfer_target *tg, int32_t at) {
    auto *t = static_cast<specinfer::TargetObject *>(tg);
    t->kv_truncate(at);
    std::vector<float> logits(static_cast<size_t>(vocab));
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = 1;
    b.tokens = text.data() + at;
    b.positions = &at;
    b.n_logits = 1;
    b.logits = logits.data();
    const auto t0 = std::chrono::steady_clock::now();
    t->forward(b);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    if (!error.empty()) break;
    for (int r = 0; r < rounds; ++r)
      for (PerType &p : per) {
        p.deep_ms.push_back(step_ms(p.deep, depth));
        p.shallow_ms.push_back(step_ms(p.shallow, shallow));
      }
  }
  if (error.empty()) {
    const double f32_ms = types[0] == "f32" ? median(per[0].deep_ms) : 0.0;
    for (size_t i = 0; i < types.size(); ++i) {
      const double d = median(per[i].deep_ms), sh = median(per[i].shallow_ms);
      state.counters[types[i] + "_deep_ms"] = d;
      state.counters[types[i] + "_short_ms"] = sh;
      state.counters[types[i] + "_of_short"] = sh / d;
      if (f32_ms > 0) state.counters[types[i] + "_vs_f32"] = f32_ms / d;
      state.counters[types[i] + "_prefill_tps"] = per[i].prefill_tps;
    }
    state.SetLabel("depth " + std::to_string(depth));
  }
  for (PerType &p : per) {
    if (p.shallow) specinfer_target_destroy(p.shallow);
    if (p.deep) specinfer_target_destroy(p.deep);
  }
  specinfer_registry_destroy(reg);
  if (!error.empty()) state.SkipWithError(error.c_str());
}
BENCHMARK(BM_LongContext)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Sketched attention against exact attention at a long context: targets of the same model and
// cache type, one exact and one per sketched config, prefill the same SPECINFER_BENCH_DEPTH
// tokens; then the exact one decodes SPECINFER_BENCH_GEN tokens (default 512) greedily and every
// target is fed each of them. Counters per sketched config i: how often its top-1 token is the
// exact one's (qjl<i>_top1_pct), the mean KL divergence of its next-token distribution from the
// exact one's (qjl<i>_kl), its median decode step against the exact one's (qjl<i>_ms, exact_ms)
// and its prefill speed.
// With a draft model, the quantity speculation's acceptance follows is measured on that same text:
// how often the draft model's top-1 token is each target's (draft_top1_pct for the exact target,
// qjl<i>_draft_top1_pct), and the paired difference of the two (qjl<i>_draft_diff_pct, the
// sketched config's agreement minus the exact one's, position by position) with its standard
// error (qjl<i>_draft_diff_se). The draft model reads the last SPECINFER_BENCH_DRAFT_WINDOW
// tokens (default 2048) as the draft-model drafter does by default, re-quantized to Q4_0 as there
// (its logits here cover the whole vocabulary).
//   SPECINFER_BENCH_KV_TYPES   the cache type (the first listed; default q8_0)
//   SPECINFER_BENCH_QJL        the sketched configs, separated by ';' (default "attn=qjl"); any
//                              target options compare too, e.g. "kv_type=f16" (a config's kv_type
//                              replaces the exact target's)
//   SPECINFER_BENCH_EXACT      the exact target's own options (default none), e.g. "kv_tiles=0"
//   SPECINFER_BENCH_DRAFT      a draft model's GGUF file (default none: no draft counters)
//   SPECINFER_BENCH_DRAFT_WINDOW  the draft model's window (default 2048)
// Run alone: --benchmark_filter=SketchedQuality (it prefills the depth once per target).
void BM_SketchedQuality(benchmark::State &state) {
  if (!long_context_ready(state)) return;
  const std::string path = model_path();
  const int32_t depth = std::atoi(env_or("SPECINFER_BENCH_DEPTH", "").c_str());
  const int32_t gen = std::max(1, std::atoi(env_or("SPECINFER_BENCH_GEN", "512").c_str()));
  if (depth < 1) {
    state.SkipWithError("SPECINFER_BENCH_DEPTH must be positive");
    return;
  }
  std::string type = env_or("SPECINFER_BENCH_KV_TYPES", "q8_0");
  type = type.substr(0, type.find(','));
  std::vector<std::string> configs = {""};
  {
    std::stringstream ss(env_or("SPECINFER_BENCH_QJL", "attn=qjl"));
    for (std::string c; std::getline(ss, c, ';');)
      if (!c.empty()) configs.push_back(c);
  }
  const size_t nt = configs.size();
  std::string error;
  specinfer_registry *reg = open_registry(&error);
  if (reg == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  char *msg = nullptr;
  const std::string base = "path=" + path + ",n_ctx=" + std::to_string(depth + gen + 8);
  std::vector<specinfer_target *> tg(nt, nullptr);
  for (size_t i = 0; i < nt && error.empty(); ++i) {
    const bool own_type = ("," + configs[i]).find(",kv_type=") != std::string::npos;
    const std::string own = i == 0 ? env_or("SPECINFER_BENCH_EXACT", "") : configs[i];
    const std::string config =
        base + (own_type ? "" : ",kv_type=" + type) + (own.empty() ? "" : "," + own);
    if (specinfer_target_open(reg, "gguf", config.c_str(), &tg[i], &msg) != SPECINFER_OK) {
      error = msg ? msg : "target_open failed";
      specinfer_free(msg);
    }
  }
  // The draft model, when given: the last `window` context tokens at positions from 0.
  const std::string draft_path = env_or("SPECINFER_BENCH_DRAFT", "");
  const int32_t window = std::clamp(
      std::atoi(env_or("SPECINFER_BENCH_DRAFT_WINDOW", "2048").c_str()), 1, std::max(1, depth));
  specinfer_target *draft = nullptr;
  if (error.empty() && !draft_path.empty()) {
    const std::string config =
        "path=" + draft_path + ",n_ctx=" + std::to_string(window + gen + 8) + ",requant=q4_0";
    if (specinfer_target_open(reg, "gguf", config.c_str(), &draft, &msg) != SPECINFER_OK) {
      error = msg ? msg : "target_open failed for the draft model";
      specinfer_free(msg);
    }
  }
  int32_t draft_vocab = 0;
  std::vector<float> draft_logits;
  // Per position: whether the draft's top-1 is target i's.
  std::vector<std::vector<int>> draft_hit(nt);
  std::vector<int32_t> text;
  int32_t vocab = 0;
  std::vector<double> prefill_tps(nt, 0.0), kl_sum(nt, 0.0);
  std::vector<std::vector<double>> step_ms(nt);
  std::vector<int> agree(nt, 0);
  if (error.empty()) {
    specinfer_model_info info;
    specinfer_model_info_init(&info);
    specinfer_target_info(tg[0], &info);
    vocab = info.vocab_size;
    const std::string t = context_text();
    text =
        static_cast<specinfer::TargetObject *>(tg[0])->tokenize(t.c_str(), t.size(), false, false);
    if (static_cast<int32_t>(text.size()) < depth)
      error = "the text has " + std::to_string(text.size()) + " tokens, fewer than the depth";
    if (draft) {
      specinfer_model_info dinfo;
      specinfer_model_info_init(&dinfo);
      specinfer_target_info(draft, &dinfo);
      draft_vocab = dinfo.vocab_size;
    }
  }
  std::vector<std::vector<float>> logits(nt);
  // Log-softmax of a logit row.
  const auto log_probs = [&](const std::vector<float> &x) {
    const double m = *std::max_element(x.begin(), x.end());
    double z = 0;
    for (const float v : x) z += std::exp(v - m);
    std::vector<double> lp(x.size());
    for (size_t v = 0; v < x.size(); ++v) lp[v] = x[v] - m - std::log(z);
    return lp;
  };
  for (auto _ : state) {
    if (!error.empty()) break;
    for (size_t i = 0; i < nt; ++i) {
      logits[i].assign(static_cast<size_t>(vocab), 0.0f);
      prefill_tps[i] = prefill_text(tg[i], text, depth, logits[i].data());
      std::fprintf(stderr, "prefilled %s: %.1f tokens/s\n", i == 0 ? "exact" : configs[i].c_str(),
                   prefill_tps[i]);
    }
    if (draft) {
      draft_logits.assign(static_cast<size_t>(draft_vocab), 0.0f);
      prefill_text(draft, text, window, draft_logits.data(), depth - window);
    }
    const auto argmax = [&](const std::vector<float> &x) {
      return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
    };
    // One token at `pos` through `t`, its next-token logits to `out`.
    const auto feed = [](specinfer_target *t, const int32_t &token, const int32_t &pos,
                         float *out) {
      specinfer_forward_batch fb{};
      fb.struct_size = sizeof fb;
      fb.n_tokens = 1;
      fb.tokens = &token;
      fb.positions = &pos;
      fb.n_logits = 1;
      fb.logits = out;
      static_cast<specinfer::TargetObject *>(t)->forward(fb);
    };
    std::vector<int32_t> top(nt);
    for (int32_t s = 0; s < gen; ++s) {
      for (size_t i = 0; i < nt; ++i) top[i] = argmax(logits[i]);
      const int32_t a = top[0];
      if (draft) {
        const int32_t d = argmax(draft_logits);
        for (size_t i = 0; i < nt; ++i) draft_hit[i].push_back(top[i] == d);
        feed(draft, a, window + s, draft_logits.data());
      }
      const std::vector<double> lp0 = log_probs(logits[0]);
      for (size_t i = 1; i < nt; ++i) {
        agree[i] += top[i] == a;
        const std::vector<double> lp = log_probs(logits[i]);
        double kl = 0;
        for (size_t v = 0; v < lp.size(); ++v) kl += std::exp(lp0[v]) * (lp0[v] - lp[v]);
        kl_sum[i] += kl;
      }
      for (size_t i = 0; i < nt; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        feed(tg[i], a, depth + s, logits[i].data());
        step_ms[i].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
  }
  if (error.empty()) {
    std::string label =
        "depth " + std::to_string(depth) + ", " + std::to_string(gen) + " tokens, " + type;
    for (size_t i = 0; i < nt; ++i) {
      std::sort(step_ms[i].begin(), step_ms[i].end());
      const double ms = step_ms[i][step_ms[i].size() / 2];
      const std::string k = i == 0 ? "exact" : "qjl" + std::to_string(i);
      state.counters[k + "_ms"] = ms;
      state.counters[k + "_prefill_tps"] = prefill_tps[i];
      if (i == 0) continue;
      if (draft) {
        // Paired per position: agreement with target i minus agreement with the exact target.
        double sum = 0, sum2 = 0;
        for (int32_t s = 0; s < gen; ++s) {
          const double d =
              draft_hit[i][static_cast<size_t>(s)] - draft_hit[0][static_cast<size_t>(s)];
          sum += d;
          sum2 += d * d;
        }
        const double mean = sum / gen;
        const double var = gen > 1 ? (sum2 - gen * mean * mean) / (gen - 1) : 0.0;
        const auto hits = [&](size_t j) {
          return std::accumulate(draft_hit[j].begin(), draft_hit[j].end(), 0);
        };
        if (i == 1) state.counters["draft_top1_pct"] = 100.0 * hits(0) / gen;
        state.counters[k + "_draft_top1_pct"] = 100.0 * hits(i) / gen;
        state.counters[k + "_draft_diff_pct"] = 100.0 * mean;
        state.counters[k + "_draft_diff_se"] = 100.0 * std::sqrt(std::max(0.0, var) / gen);
      }
      state.counters[k + "_top1_pct"] = 100.0 * agree[i] / gen;
      state.counters[k + "_kl"] = kl_sum[i] / gen;
      label += "; qjl" + std::to_string(i) + ": " + configs[i];
    }
    state.SetLabel(label);
  }
  for (specinfer_target *t : tg)
    if (t) specinfer_target_destroy(t);
  if (draft) specinfer_target_destroy(draft);
  specinfer_registry_destroy(reg);
  if (!error.empty()) state.SkipWithError(error.c_str());
}
BENCHMARK(BM_SketchedQuality)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
