// "greedy": keep drafted tokens while they are the target's argmax. Exact for greedy decoding
// (temperature 0); needs no randomness and reads only the argmax, so rows may be raw logits.
#include "coupling/step_coupler.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace specinfer {

namespace {

class GreedyCoupler final : public StepCoupler {
 public:
  GreedyCoupler() : StepCoupler("greedy") {}
  bool exact() const override { return true; }
  bool greedy() const override { return true; }

  int32_t draft_sample(int32_t vocab, const float *q, uint64_t, int64_t) const override {
    check_vocab(vocab);
    check_score_row(q, vocab, "q", 0);
    return argmax(q, vocab);
  }

 protected:
  bool needs_distributions() const override { return false; }
  int32_t step(int32_t vocab, const float *p, std::span<const DraftChild> children, uint64_t,
               int64_t, int32_t *token, StepScratch &) const override {
    int32_t best = argmax(p, vocab);
    for (size_t c = 0; c < children.size(); ++c)
      if (children[c].token == best) return static_cast<int32_t>(c);
    *token = best;
    return -1;
  }
};

}  // namespace

std::unique_ptr<Coupler> make_greedy_coupler() {
  return std::make_unique<GreedyCoupler>();
}

}  // namespace specinfer
