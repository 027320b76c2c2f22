// "typical[:EPS[:DELTA]]": Medusa's typical acceptance (Cai et al. 2024). A drafted token x is
// kept when p(x) > min(EPS, DELTA * exp(-H(p))), H the entropy of p in nats; defaults EPS = 0.09,
// DELTA = 0.3 (DELTA = sqrt(EPS), as Medusa does). Deterministic given p; the corrected and bonus
// tokens are drawn from p with the (seed, position) uniform of plain decoding. Lossy: the text is
// not distributed as the target's (it favours typical drafted tokens); exact() is false.
// On a tree the first child (in node order) that passes is followed.
#include <cmath>

#include "coupling/step_coupler.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace specinfer {

namespace {

class TypicalCoupler final : public StepCoupler {
 public:
  TypicalCoupler(double eps, double delta)
      : StepCoupler(format("typical:%g:%g", eps, delta)), eps_(eps), delta_(delta) {}
  bool exact() const override { return false; }

 protected:
  int32_t step(int32_t vocab, const float *p, std::span<const DraftChild> children, uint64_t seed,
               int64_t position, int32_t *token, StepScratch &) const override {
    double threshold = -1;  // computed only when some child is not above eps already
    for (size_t c = 0; c < children.size(); ++c) {
      const double px = p[children[c].token];
      if (px > eps_) return static_cast<int32_t>(c);
      if (threshold < 0) {
        double h = 0;
        for (int32_t i = 0; i < vocab; ++i)
          if (p[i] > 0) h -= static_cast<double>(p[i]) * std::log(static_cast<double>(p[i]));
        threshold = std::min(eps_, delta_ * std::exp(-h));
      }
      if (px > threshold) return static_cast<int32_t>(c);
    }
    *token = sample_index(p, vocab, CounterRng(seed, position, RngStream::kSample).uniform(0));
    return -1;
  }

 private:
  double eps_, delta_;
};

}  // namespace

std::unique_ptr<Coupler> make_typical_coupler(double eps, double delta) {
  if (!(eps > 0 && eps <= 1))
    fail(SPECINFER_ERR_CONFIG, "coupler: typical eps must be in (0, 1] (got %g)", eps);
  if (!(delta > 0 && std::isfinite(delta)))
    fail(SPECINFER_ERR_CONFIG, "coupler: typical delta must be finite and > 0 (got %g)", delta);
  return std::make_unique<TypicalCoupler>(eps, delta);
}

}  // namespace specinfer
