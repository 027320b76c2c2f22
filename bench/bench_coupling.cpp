// Cost of the sampling and coupling work per sequence position, for vocabularies of 32k (Llama 2),
// 152k (Qwen2) and 262k (Gemma 3). It must stay far below one target forward pass.
//
//   BM_LogitsToProbs/<vocab>/<filters>   logits -> distribution (0: temperature only;
//                                        1: + top-k 40, top-p 0.95, min-p 0.05)
//   BM_Verify/<coupler>/<vocab>/<k>      verify a chain of k drafts (k = 0: plain decoding of one
//                                        token); items = k + 1 positions, so items/s is positions/s
//   BM_DraftSample/<coupler>/<vocab>     the draft side, one token
// Distributions are softmax(logits) at temperature 1 of logits with a realistic spread (normal,
// sd 3), every token with nonzero probability - the costly case for the couplers.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "coupling/coupler.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

namespace {

using namespace specinfer;

const char *const kCouplers[] = {"greedy", "rejection", "lenient:0.5",
                                 "gumbel", "minhash",   "typical"};

std::vector<float> make_logits(int32_t vocab, uint64_t seed) {
  std::vector<float> l(static_cast<size_t>(vocab));
  CounterRng rng(seed, 0, 1000);
  for (int32_t i = 0; i < vocab; ++i) {
    double u1 = rng.uniform(2 * static_cast<uint64_t>(i)),
           u2 = rng.uniform(2 * static_cast<uint64_t>(i) + 1);
    l[i] =
        static_cast<float>(3.0 * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return l;
}

std::vector<float> make_probs(int32_t vocab, uint64_t seed) {
  auto l = make_logits(vocab, seed);
  std::vector<float> p(l.size());
  SamplingParams sp;
  sp.temperature = 1;
  logits_to_probs(l.data(), vocab, sp, p.data());
  return p;
}

void BM_LogitsToProbs(benchmark::State &state) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  auto l = make_logits(vocab, 1);
  std::vector<float> p(l.size());
  SamplingParams sp;
  sp.temperature = 0.8f;
  if (state.range(1)) sp.top_k = 40, sp.top_p = 0.95f, sp.min_p = 0.05f;
  for (auto _ : state) {
    logits_to_probs(l.data(), vocab, sp, p.data());
    benchmark::DoNotOptimize(p.data());
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Verify(benchmark::State &state, const char *spec) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  const int32_t k = static_cast<int32_t>(state.range(1));
  auto coupler = make_coupler(spec);
  // Target rows and draft rows: different (independent logits blended in), so drafts are
  // sometimes refused.
  std::vector<float> p, q;
  auto pr = make_probs(vocab, 2), qr = make_probs(vocab, 3);
  std::vector<float> mix(pr.size());
  for (size_t i = 0; i < pr.size(); ++i) mix[i] = 0.7f * pr[i] + 0.3f * qr[i];
  for (int32_t r = 0; r <= k; ++r) p.insert(p.end(), pr.begin(), pr.end());
  for (int32_t r = 0; r < k; ++r) q.insert(q.end(), mix.begin(), mix.end());
  std::vector<int32_t> draft(static_cast<size_t>(k));
  int64_t position = 0, accepted = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int32_t r = 0; r < k; ++r)
      draft[r] = coupler->draft_sample(vocab, mix.data(), 7, position + r);
    state.ResumeTiming();
    VerifyResult v =
        coupler->verify(vocab, k, p.data(), k ? q.data() : nullptr, draft.data(), 7, position);
    benchmark::DoNotOptimize(v);
    accepted += v.n_accepted;
    position += k + 1;
  }
  state.SetItemsProcessed(state.iterations() * (k + 1));
  if (k)
    state.counters["accepted_per_round"] =
        static_cast<double>(accepted) / static_cast<double>(state.iterations());
}

void BM_DraftSample(benchmark::State &state, const char *spec) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  auto coupler = make_coupler(spec);
  auto q = make_probs(vocab, 3);
  int64_t position = 0;
  for (auto _ : state)
    benchmark::DoNotOptimize(coupler->draft_sample(vocab, q.data(), 7, position++));
  state.SetItemsProcessed(state.iterations());
}

// Raw generator throughput: uniforms per second (two per Philox block).
void BM_Uniforms(benchmark::State &state) {
  std::vector<double> out(4096);
  CounterRng rng(1, 2, RngStream::kGumbel);
  uint64_t first = 0;
  for (auto _ : state) {
    rng.uniforms(first, out.size(), out.data());
    benchmark::DoNotOptimize(out.data());
    first += out.size();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_Uniforms);

const int64_t kVocabs[] = {32000, 152064, 262144};

int register_all() {
  for (int64_t v : kVocabs)
    for (int64_t f : {0, 1})
      benchmark::RegisterBenchmark("BM_LogitsToProbs", BM_LogitsToProbs)
          ->Args({v, f})
          ->Unit(benchmark::kMicrosecond);
  for (const char *spec : kCouplers) {
    for (int64_t v : kVocabs)
      for (int64_t k : {0, 4})
        benchmark::RegisterBenchmark((std::string("BM_Verify/") + spec).c_str(), BM_Verify, spec)
            ->Args({v, k})
            ->Unit(benchmark::kMicrosecond);
    for (int64_t v : kVocabs)
      benchmark::RegisterBenchmark((std::string("BM_DraftSample/") + spec).c_str(), BM_DraftSample,
                                   spec)
          ->Arg(v)
          ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
