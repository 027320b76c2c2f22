// Adaptive draft length. Chooses k each round to maximise the expected tokens per unit of time,
//   E(k) = (1 - a^(k+1)) / ((1 - a) (k c + 1)),
// from the recent per-token acceptance a and the measured cost ratio c (one drafted token's time /
// one target pass's time). When no k > 0 beats plain decoding, drafting pauses for a while and then
// probes again.
#pragma once

#include <cstdint>

namespace specinfer {

class Lookahead {
 public:
  void configure(int32_t max_draft, bool adaptive);
  // k for the next round (0 = do not draft).
  int32_t next();
  // After a round: tokens drafted, accepted, and the time spent drafting / in the target pass.
  void observe(int32_t drafted, int32_t accepted, double draft_ms, double target_ms);
  void reset();

  double acceptance() const { return drafted_ > 0 ? accepted_ / drafted_ : prior_acceptance; }
  double cost_ratio() const { return target_ms_ > 0 ? draft_ms_per_token_ / target_ms_ : 0.0; }

  static constexpr double prior_acceptance = 0.6;
  static constexpr int32_t pause_rounds = 16;

 private:
  int32_t max_draft_ = 8;
  bool adaptive_ = true;
  double accepted_ = 0, drafted_ = 0;          // exponentially decayed counts
  double draft_ms_per_token_ = 0, target_ms_ = 0;  // moving averages
  int32_t paused_ = 0;
};

}  // namespace specinfer
