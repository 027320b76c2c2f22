#include "session/lookahead.h"

#include <algorithm>
#include <cmath>

namespace specinfer {

void Lookahead::configure(int32_t max_draft, bool adaptive) {
  max_draft_ = std::clamp<int32_t>(max_draft, 0, kMaxBatch - 1);
  adaptive_ = adaptive;
  reset();
}

void Lookahead::reset() {
  accepted_ = drafted_ = 0;
  draft_ms_per_token_ = 0;
  pass_ms_.fill(0);
  paused_ = 0;
  since_plain_ = 0;
}

double Lookahead::cost_ratio() const {
  double one = pass_ms_[1];
  return one > 0 ? draft_ms_per_token_ / one : 0.0;
}

double Lookahead::batch_ratio(int32_t k) const {
  const int32_t n = k + 1;
  const double one = pass_ms_[1];
  if (one <= 0 || n <= 1) return 1.0;
  if (pass_ms_[n] > 0) return std::max(1.0, pass_ms_[n] / one);
  // Unmeasured: interpolate linearly between the nearest measured sizes; past the largest,
  // extrapolate with its slope. With nothing measured beyond one token, assume a mildly
  // growing cost so that drafting gets tried.
  int32_t lo = 1, hi = 0;
  for (int32_t m = n - 1; m >= 1; --m)
    if (pass_ms_[m] > 0) {
      lo = m;
      break;
    }
  for (int32_t m = n + 1; m <= kMaxBatch; ++m)
    if (pass_ms_[m] > 0) {
      hi = m;
      break;
    }
  double r_lo = pass_ms_[lo] / one;
  if (hi) {
    double r_hi = pass_ms_[hi] / one;
    return std::max(1.0, r_lo + (r_hi - r_lo) * (n - lo) / double(hi - lo));
  }
  double slope = lo > 1 ? std::max(0.0, (r_lo - 1.0) / (lo - 1)) : 0.05;
  return std::max(1.0, r_lo + slope * (n - lo));
}

int32_t Lookahead::next() {
  if (max_draft_ == 0) return 0;
  if (!adaptive_) return max_draft_;
  // The cost model needs the time of a plain one-token pass: measure it in the first round and
  // refresh it now and then (a plain round costs at most the tokens a draft would have added).
  if (pass_ms_[1] <= 0 || ++since_plain_ >= kRefreshRounds) {
    since_plain_ = 0;
    return 0;
  }
  if (paused_ > 0) {
    --paused_;
    return paused_ == 0 ? std::min<int32_t>(2, max_draft_) : 0;  // probe when the pause ends
  }
  double a = std::clamp(acceptance(), 0.0, 0.999);
  double c = cost_ratio();
  int32_t best_k = 0;
  double best = 1.0;  // plain decoding: one token per single-token pass
  for (int32_t k = 1; k <= max_draft_; ++k) {
    double e = (1.0 - std::pow(a, k + 1)) / ((1.0 - a) * (k * c + batch_ratio(k)));
    if (e > best * 1.0001) {
      best = e;
      best_k = k;
    }
  }
  if (best_k == 0) paused_ = pause_rounds;
  return best_k;
}

void Lookahead::observe(int32_t drafted, int32_t accepted, double draft_ms, double target_ms,
                        int32_t batch) {
  const double decay = 0.9;
  if (drafted > 0) {
    // Each drafted token up to and including the first rejection is one trial of acceptance.
    int32_t trials = accepted + (accepted < drafted ? 1 : 0);
    accepted_ = accepted_ * decay + accepted;
    drafted_ = drafted_ * decay + trials;
    double per_token = draft_ms / drafted;
    draft_ms_per_token_ = draft_ms_per_token_ > 0 ? 0.8 * draft_ms_per_token_ + 0.2 * per_token : per_token;
  }
  if (target_ms > 0 && batch >= 1 && batch <= kMaxBatch) {
    double &m = pass_ms_[static_cast<size_t>(batch)];
    m = m > 0 ? 0.8 * m + 0.2 * target_ms : target_ms;
  }
}

}  // namespace specinfer
