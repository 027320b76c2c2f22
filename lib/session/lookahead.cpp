#include "session/lookahead.h"

#include <algorithm>
#include <cmath>

namespace specinfer {

void Lookahead::configure(int32_t max_draft, bool adaptive) {
  max_draft_ = std::max<int32_t>(0, max_draft);
  adaptive_ = adaptive;
  reset();
}

void Lookahead::reset() {
  accepted_ = drafted_ = 0;
  draft_ms_per_token_ = target_ms_ = 0;
  paused_ = 0;
}

int32_t Lookahead::next() {
  if (max_draft_ == 0) return 0;
  if (!adaptive_) return max_draft_;
  if (paused_ > 0) {
    --paused_;
    return paused_ == 0 ? std::min<int32_t>(2, max_draft_) : 0;  // probe when the pause ends
  }
  double a = std::clamp(acceptance(), 0.0, 0.999);
  double c = cost_ratio();
  int32_t best_k = 0;
  double best = 1.0;  // plain decoding: one token per target pass
  for (int32_t k = 1; k <= max_draft_; ++k) {
    double e = (1.0 - std::pow(a, k + 1)) / ((1.0 - a) * (k * c + 1.0));
    if (e > best * 1.0001) {
      best = e;
      best_k = k;
    }
  }
  if (best_k == 0) paused_ = pause_rounds;
  return best_k;
}

void Lookahead::observe(int32_t drafted, int32_t accepted, double draft_ms, double target_ms) {
  const double decay = 0.9;
  if (drafted > 0) {
    // Each drafted token up to and including the first rejection is one trial of acceptance.
    int32_t trials = accepted + (accepted < drafted ? 1 : 0);
    accepted_ = accepted_ * decay + accepted;
    drafted_ = drafted_ * decay + trials;
    double per_token = draft_ms / drafted;
    draft_ms_per_token_ = draft_ms_per_token_ > 0 ? 0.8 * draft_ms_per_token_ + 0.2 * per_token : per_token;
  }
  if (target_ms > 0) target_ms_ = target_ms_ > 0 ? 0.8 * target_ms_ + 0.2 * target_ms : target_ms;
}

}  // namespace specinfer
