// The measured time of a target pass by the number of tokens it scores, one table per loaded
// model: every target shared from one loaded model holds the same PassCost
// (TargetObject::pass_cost), so every session on that model, alone or stepped with others
// (Session::step_many), learns from every pass any of them runs, and a new session starts with
// what earlier ones measured.
//
// Keyed by the total token count only, not by how many sequences the tokens belong to: the
// matmuls, which stream the weights, are the same for n tokens of one sequence or of n sequences,
// and attention over a short context is a small part of a pass. Each size keeps a moving average
// of its recent passes (a machine shared with other work times the same pass differently from
// one minute to the next); sizes not run yet are interpolated.
//
// Thread-safe: sessions on different threads share a model's table.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace specinfer {

class PassCost {
 public:
  static constexpr int32_t kMaxTokens = 256;  // sizes recorded; larger passes are not

  // A pass over `tokens` tokens took `ms`.
  void record(int32_t tokens, double ms);
  // Time of a pass over n tokens: the moving average of that size, else interpolated linearly
  // between the nearest recorded sizes; past the largest, extrapolated with the slope from the
  // smallest recorded size (5% of a pass per token when only one size is known, so that drafting
  // gets tried); below the smallest, its time. 0 with nothing recorded.
  double ms(int32_t n) const;
  // The moving average at exactly n tokens, 0 when that size has not been recorded.
  double measured(int32_t n) const;
  // ms(n) for n = 0 .. n_max (entry 0 is a one-token pass) from recorded sizes made monotone
  // first (pool-adjacent-violators: a size timed slower than a larger one is averaged with it),
  // so that a larger pass never costs less. All zero with nothing recorded.
  std::vector<double> monotone_table(int32_t n_max) const;
  void clear();

 private:
  static double interpolate(const std::array<double, kMaxTokens + 1> &t, int32_t n);
  mutable std::mutex mu_;
  std::array<double, kMaxTokens + 1> ms_{};
};

}  // namespace specinfer
