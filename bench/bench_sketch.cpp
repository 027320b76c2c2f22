// Sketcher throughput: sketching one vector and estimating one query against 1024 stored keys
// (the attention use), for d = 64, 128, 4096, per kind and per SIMD variant.
//   bench_sketch --benchmark_filter='jl/.*avx2'
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "sketch/kernels.h"
#include "sketch/sketcher.h"

namespace sk = specinfer::sketch;

namespace {

constexpr int kKeys = 1024;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(n);
  for (float &v : x) v = g(rng);
  return x;
}

// m = d / 4 (at least 16): the compression an attention sketch would use.
int64_t size_for(int64_t d) {
  return std::max<int64_t>(16, d / 4);
}

std::string options(const char *kind, const char *simd) {
  std::string o = std::string("simd=") + simd;
  if (std::string(kind) == "jl-sign") o += ",dist=sign";
  return o;
}
const char *kind_of(const char *kind) {
  return std::string(kind) == "jl-sign" ? "jl" : kind;
}

void BM_sketch(benchmark::State &state, const char *kind, const char *simd) {
  const int64_t d = state.range(0);
  if (std::string(simd) == "avx2" && !sk::avx2_kernels()) {
    state.SkipWithError("no AVX2");
    return;
  }
  auto s = sk::make_sketcher(kind_of(kind), d, size_for(d), 1, options(kind, simd));
  const auto x = random_vector(static_cast<size_t>(d), 2);
  std::vector<unsigned char> out;
  for (auto _ : state) {
    s->sketch(x.data(), sk::Role::key, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * d * 4);
  state.counters["m"] = static_cast<double>(size_for(d));
  state.counters["sketch_bytes"] = static_cast<double>(out.size());
}

void BM_estimate_many(benchmark::State &state, const char *kind, const char *simd) {
  const int64_t d = state.range(0);
  if (std::string(simd) == "avx2" && !sk::avx2_kernels()) {
    state.SkipWithError("no AVX2");
    return;
  }
  auto s = sk::make_sketcher(kind_of(kind), d, size_for(d), 1, options(kind, simd));
  const auto rows = random_vector(static_cast<size_t>(d) * kKeys, 3);
  std::vector<unsigned char> keys;
  std::vector<size_t> offsets;
  s->sketch_rows(rows.data(), kKeys, static_cast<size_t>(d), sk::Role::key, keys, offsets);
  const auto q = random_vector(static_cast<size_t>(d), 4);
  std::vector<unsigned char> qs;
  s->sketch(q.data(), std::string(kind) == "qjl" ? sk::Role::query : sk::Role::key, qs);
  std::vector<double> scores(kKeys);
  for (auto _ : state) {
    s->estimate_many(qs.data(), qs.size(), keys.data(), offsets.data(), kKeys, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * kKeys);  // items = keys scored
}

void BM_sketch_rows(benchmark::State &state, const char *kind) {
  const int64_t d = state.range(0);
  auto s = sk::make_sketcher(kind_of(kind), d, size_for(d), 1, options(kind, "auto"));
  const auto rows = random_vector(static_cast<size_t>(d) * kKeys, 3);
  std::vector<unsigned char> keys;
  std::vector<size_t> offsets;
  for (auto _ : state) {
    s->sketch_rows(rows.data(), kKeys, static_cast<size_t>(d), sk::Role::key, keys, offsets);
    benchmark::DoNotOptimize(keys.data());
  }
  state.SetItemsProcessed(state.iterations() * kKeys);  // items = rows sketched
}

#define SKETCH_BENCH(kind)                                                                    \
  BENCHMARK_CAPTURE(BM_sketch, kind##_scalar, #kind, "scalar")->Arg(64)->Arg(128)->Arg(4096); \
  BENCHMARK_CAPTURE(BM_sketch, kind##_avx2, #kind, "avx2")->Arg(64)->Arg(128)->Arg(4096);     \
  BENCHMARK_CAPTURE(BM_estimate_many, kind##_scalar, #kind, "scalar")                         \
      ->Arg(64)                                                                               \
      ->Arg(128)                                                                              \
      ->Arg(4096);                                                                            \
  BENCHMARK_CAPTURE(BM_estimate_many, kind##_avx2, #kind, "avx2")->Arg(64)->Arg(128)->Arg(4096);

SKETCH_BENCH(jl)
SKETCH_BENCH(countsketch)
SKETCH_BENCH(qjl)
SKETCH_BENCH(threshold)
SKETCH_BENCH(priority)
BENCHMARK_CAPTURE(BM_sketch, jl_sign_scalar, "jl-sign", "scalar")->Arg(64)->Arg(128)->Arg(4096);
BENCHMARK_CAPTURE(BM_sketch, jl_sign_avx2, "jl-sign", "avx2")->Arg(64)->Arg(128)->Arg(4096);
BENCHMARK_CAPTURE(BM_sketch_rows, jl, "jl")->Arg(128)->Arg(4096)->UseRealTime();
BENCHMARK_CAPTURE(BM_sketch_rows, priority, "priority")->Arg(128)->Arg(4096)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
