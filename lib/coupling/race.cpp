// "gumbel" and "minhash": couplings without communication (Daliri, Musco, Suresh 2025).
//
// Both parties (drafter with q, target with p) derive the same random numbers from
// (seed, position) and each picks a token from its own distribution with them; the picks agree
// with probability at least (1 - D) / (1 + D), D the total variation distance, and each pick is
// distributed exactly as its own distribution. The target's pick is the emitted token, whatever
// the draft was - so the text depends only on (seed, target), not on the drafter: plain decoding
// (k = 0) with the same seed produces the same text.
//
// Gumbel: shared uniforms u_i, pick argmin_i -ln(u_i) / w_i (an exponential race, equivalent to
// Gumbel-max). Weighted MinHash: shared darts (i, h) thrown in time order, uniform over token i
// and height h in [0, 1]; pick the token of the first dart with h < w_i. Per token the darts are
// a Poisson process in (time, height); see minhash_choice for how they are generated.
//
// The Gumbel scan skips, without a logarithm, every token that cannot beat the best so far,
// using -ln(u) >= 1 - u; the first candidate scanned is the heaviest token, which makes the
// bound bite.
#include <algorithm>
#include <cmath>
#include <limits>

#include "coupling/step_coupler.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace specinfer {

namespace {

// Index of the largest weight (lowest index on ties); -1 when none is positive.
int32_t heaviest(const float *w, int32_t vocab) {
  int32_t best = -1;
  float bw = 0;
  for (int32_t i = 0; i < vocab; ++i)
    if (w[i] > bw) {
      bw = w[i];
      best = i;
    }
  return best;
}

uint64_t join(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
}

// Calls fn(i, bits) for every token i with w[i] > 0, bits = rng.bits(i). Dense stretches of the
// vocabulary get their random values in bulk (vectorized); sparse ones (after top-k, top-p) one
// by one, so a distribution with 40 live tokens costs 40 draws, not a vocabulary's worth.
template <typename F>
void for_each_live(const float *w, int32_t vocab, const CounterRng &rng, F &&fn) {
  constexpr int32_t kChunk = 512;
  uint32_t words[2 * kChunk];
  for (int32_t base = 0; base < vocab; base += kChunk) {
    const int32_t n = std::min(kChunk, vocab - base);
    int32_t live = 0;
    for (int32_t j = 0; j < n; ++j) live += w[base + j] > 0;
    if (live == 0) continue;
    if (live >= kChunk / 8) {
      rng.blocks(static_cast<uint32_t>(base) >> 1, static_cast<size_t>(n + 1) / 2, words);
      for (int32_t j = 0; j < n; ++j)
        if (w[base + j] > 0) fn(base + j, join(words[2 * j], words[2 * j + 1]));
    } else {
      for (int32_t j = 0; j < n; ++j)
        if (w[base + j] > 0) fn(base + j, rng.bits(static_cast<uint64_t>(base + j)));
    }
  }
}

}  // namespace

int32_t gumbel_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position) {
  const int32_t start = heaviest(w, vocab);
  if (start < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gumbel: no positive weight");
  const CounterRng rng(seed, position, RngStream::kGumbel);
  int32_t best_i = start;
  double best = -std::log(rng.uniform(static_cast<uint64_t>(start))) / w[start];
  for_each_live(w, vocab, rng, [&](int32_t i, uint64_t bits) {
    const double wi = w[i];
    const double u = CounterRng::to_open_unit(bits);
    if (1.0 - u >= best * wi) return;  // -ln(u)/w >= (1 - u)/w >= best
    const double s = -std::log(u) / wi;
    if (s < best || (s == best && i < best_i)) {
      best = s;
      best_i = i;
    }
  });
  return best_i;
}

namespace {

// MinHash darts, per token, are a Poisson process of rate 1 on time [0, inf) x height [0, 1],
// generated one unit of time (a "chunk") at a time in a way that does not depend on the weight
// asked about, so that the drafter (q) and the target (p) read the same darts:
//  - stream S(c, 0), value i: the lowest height M = -ln(u) in chunk c of token i (M >= 1 means
//    the chunk holds no dart: probability e^-1);
//  - stream S(c, 255), value i: the time of that lowest dart within the chunk;
//  - stream S(c, 1 + m), block i: the m-th of the other darts of the chunk, in time order (gap
//    Exp(1 - M), height uniform in (M, 1]).
// The first dart under weight w is in the first chunk whose lowest dart is under w; scanning
// chunk 0 of every token, then chunk 1, ... stops at the first chunk where any token has one
// (1.6 chunks on average, since the weights sum to 1). Most tokens are dismissed by a single
// uniform without a logarithm, using -ln(u) >= 1 - u.
constexpr uint32_t kChunkStreams = 256;
constexpr uint32_t kMaxChunks = 1u << 20;  // e^-(2^20): never reached in practice

uint32_t dart_stream(uint32_t chunk, uint32_t j) {
  return static_cast<uint32_t>(RngStream::kMinHash) + chunk * kChunkStreams + j;
}

// Time within chunk c of token i's first dart under w, given the chunk's lowest height m < w.
double first_dart_in_chunk(uint64_t seed, int64_t position, uint32_t c, int32_t i, double m,
                           double w) {
  const double t_low = CounterRng(seed, position, dart_stream(c, kChunkStreams - 1))
                           .uniform(static_cast<uint64_t>(i));
  const double rate = 1.0 - m;  // the other darts: heights in (m, 1]
  double t = 0;
  if (rate > 0) {
    for (uint32_t j = 1; j + 1 < kChunkStreams; ++j) {
      std::array<uint32_t, 4> b =
          CounterRng(seed, position, dart_stream(c, j)).block(static_cast<uint32_t>(i));
      t += -std::log(CounterRng::to_open_unit(join(b[0], b[1]))) / rate;
      if (t >= t_low) break;
      if (m + CounterRng::to_open_unit(join(b[2], b[3])) * rate < w) return t;
    }
  }
  return t_low;
}

}  // namespace

int32_t minhash_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position) {
  if (heaviest(w, vocab) < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "minhash: no positive weight");
  for (uint32_t c = 0; c < kMaxChunks; ++c) {
    const CounterRng lowest(seed, position, dart_stream(c, 0));
    int32_t best_i = -1;
    double best = std::numeric_limits<double>::infinity();
    for_each_live(w, vocab, lowest, [&](int32_t i, uint64_t bits) {
      const double wi = w[i];
      const double u = CounterRng::to_open_unit(bits);
      if (1.0 - u >= wi) return;  // lowest height -ln(u) >= 1 - u >= w: no dart under w here
      const double m = -std::log(u);
      if (m >= wi) return;
      const double t = first_dart_in_chunk(seed, position, c, i, m, wi);
      if (t < best) {
        best = t;
        best_i = i;
      }
    });
    if (best_i >= 0) return best_i;
  }
  fail(SPECINFER_ERR_INTERNAL, "minhash: no dart landed in %u chunks", kMaxChunks);
}

namespace {

class RaceCoupler final : public StepCoupler {
 public:
  using Choice = int32_t (*)(const float *, int32_t, uint64_t, int64_t);
  RaceCoupler(std::string name, Choice choice) : StepCoupler(std::move(name)), choice_(choice) {}
  bool exact() const override { return true; }

  int32_t draft_sample(int32_t vocab, const float *q, uint64_t seed,
                       int64_t position) const override {
    check_vocab(vocab);
    check_prob_row(q, vocab, "q", 0);
    return choice_(q, vocab, seed, position);
  }

 protected:
  // Whatever the children, the target's own pick is what comes next: keep the child that holds
  // it, or emit it as the corrected / bonus token.
  int32_t step(int32_t vocab, const float *p, std::span<const DraftChild> children, uint64_t seed,
               int64_t position, int32_t *token, StepScratch &) const override {
    const int32_t pick = choice_(p, vocab, seed, position);
    for (size_t c = 0; c < children.size(); ++c)
      if (children[c].token == pick) return static_cast<int32_t>(c);
    *token = pick;
    return -1;
  }

 private:
  Choice choice_;
};

}  // namespace

std::unique_ptr<Coupler> make_gumbel_coupler() {
  return std::make_unique<RaceCoupler>("gumbel", &gumbel_choice);
}
std::unique_ptr<Coupler> make_minhash_coupler() {
  return std::make_unique<RaceCoupler>("minhash", &minhash_choice);
}

}  // namespace specinfer
