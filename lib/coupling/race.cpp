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
// a Poisson process in (time, height), generated lazily by record lows: the next dart below the
// current lowest height h comes after Exp(h) time and lands uniformly under h.
//
// Both scans skip, without a logarithm, every token that cannot beat the best so far, using
// -ln(u) >= 1 - u; the first candidate scanned is the heaviest token, which makes the bound bite.
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

uint64_t join(uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32); }

}  // namespace

int32_t gumbel_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position) {
  const int32_t start = heaviest(w, vocab);
  if (start < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gumbel: no positive weight");
  const CounterRng rng(seed, position, RngStream::kGumbel);
  int32_t best_i = start;
  double best = -std::log(rng.uniform(static_cast<uint64_t>(start))) / w[start];
  uint32_t cached = UINT32_MAX;
  std::array<uint32_t, 4> blk{};
  for (int32_t i = 0; i < vocab; ++i) {
    const double wi = w[i];
    if (!(wi > 0)) continue;
    const uint32_t b = static_cast<uint32_t>(i) >> 1;
    if (b != cached) {
      blk = rng.block(b);
      cached = b;
    }
    const double u = CounterRng::to_open_unit(i & 1 ? join(blk[2], blk[3]) : join(blk[0], blk[1]));
    if (1.0 - u >= best * wi) continue;  // -ln(u)/w >= (1 - u)/w >= best
    const double s = -std::log(u) / wi;
    if (s < best || (s == best && i < best_i)) {
      best = s;
      best_i = i;
    }
  }
  return best_i;
}

namespace {

// Steps of the record-low chain per token; reaching it is astronomically unlikely (the height
// shrinks by a uniform factor per step), and a token that does is treated as never arriving.
constexpr uint32_t kMaxMinHashSteps = 4096;

// Arrival time of the first dart under weight `w` for token i, or +inf if it is not before `limit`.
double minhash_arrival(uint64_t seed, int64_t position, int32_t i, double w, double limit) {
  double t = 0, h = 1;
  for (uint32_t step = 0; step < kMaxMinHashSteps; ++step) {
    const CounterRng rng(seed, position, static_cast<uint32_t>(RngStream::kMinHash) + step);
    std::array<uint32_t, 4> b = rng.block(static_cast<uint32_t>(i));
    const double u_time = CounterRng::to_open_unit(join(b[0], b[1]));
    const double u_height = CounterRng::to_open_unit(join(b[2], b[3]));
    if (t + (1.0 - u_time) / h >= limit) return std::numeric_limits<double>::infinity();
    t += -std::log(u_time) / h;
    if (t >= limit) return std::numeric_limits<double>::infinity();
    h *= u_height;
    if (h < w) return t;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

int32_t minhash_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position) {
  const int32_t start = heaviest(w, vocab);
  if (start < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "minhash: no positive weight");
  const double inf = std::numeric_limits<double>::infinity();
  int32_t best_i = start;
  double best = minhash_arrival(seed, position, start, w[start], inf);
  for (int32_t i = 0; i < vocab; ++i) {
    if (!(w[i] > 0) || i == start) continue;
    const double t = minhash_arrival(seed, position, i, w[i], best);
    if (t < best || (t == best && i < best_i)) {
      best = t;
      best_i = i;
    }
  }
  return best_i;
}

namespace {

class RaceCoupler final : public StepCoupler {
 public:
  using Choice = int32_t (*)(const float *, int32_t, uint64_t, int64_t);
  RaceCoupler(std::string name, Choice choice) : StepCoupler(std::move(name)), choice_(choice) {}
  bool exact() const override { return true; }

  int32_t draft_sample(int32_t vocab, const float *q, uint64_t seed, int64_t position) const override {
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
