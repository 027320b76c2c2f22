// Adaptive draft length. Chooses k each round to maximise the expected tokens per unit of time,
//   E(k) = (1 - a^(k+1)) / ((1 - a) (k c + r(k))),
// from the recent per-token acceptance a, the measured cost ratio c (one drafted token's time / one
// single-token target pass) and r(k), the measured time of a (k+1)-token target pass relative to a
// single-token pass (1 for a perfectly memory-bound target). When no k > 0 beats plain decoding
// (E = 1), drafting pauses for a while and then probes again.
#pragma once

#include <array>
#include <cstdint>

namespace specinfer {

class Lookahead {
 public:
  static constexpr int32_t kMaxBatch = 17;  // verify batches up to max_draft + 1 tokens

  void configure(int32_t max_draft, bool adaptive);
  // k for the next round (0 = do not draft).
  int32_t next();
  // After a round: tokens drafted, accepted, the time spent drafting and in the target pass, and
  // how many tokens that pass scored.
  void observe(int32_t drafted, int32_t accepted, double draft_ms, double target_ms, int32_t batch);
  void reset();

  double acceptance() const { return drafted_ > 0 ? accepted_ / drafted_ : prior_acceptance; }
  double cost_ratio() const;
  // r(k): time of a (k+1)-token pass relative to a one-token pass (measured, or interpolated).
  double batch_ratio(int32_t k) const;

  static constexpr double prior_acceptance = 0.6;
  static constexpr int32_t pause_rounds = 16;
  static constexpr int32_t kRefreshRounds = 64;  // rounds between plain rounds that re-measure

 private:
  int32_t max_draft_ = 8;
  bool adaptive_ = true;
  double accepted_ = 0, drafted_ = 0;   // exponentially decayed counts
  double draft_ms_per_token_ = 0;       // moving average
  std::array<double, kMaxBatch + 1> pass_ms_{};  // moving average of pass time by batch size
  int32_t paused_ = 0;
  int32_t since_plain_ = 0;
};

}  // namespace specinfer
