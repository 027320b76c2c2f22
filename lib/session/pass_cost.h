// The measured time of a target pass by the number of tokens it scores, one table per loaded
// model: every target shared from one loaded model holds the same PassCost
// (TargetObject::pass_cost), so every session on that model, alone or stepped with others
// (Session::step_many), learns from every pass any of them runs, and a new session starts with
// what earlier ones measured.
//
// Keyed by the total token count, not by how many sequences the tokens belong to: the matmuls,
// which stream the weights, are the same for n tokens of one sequence or of n sequences, and
// attention over a short context is a small part of a pass. What does differ is the logit rows: a
// round wants logits for every token it scores, a prompt chunk for its last alone, and each row is
// a product with the output matrix over the whole vocabulary (1.4 ms of a 15 ms token on the 1.5B,
// Zen 3: bench_forward's BM_LogitRows). So the table holds the time of a pass whose every token
// has its row, a pass with fewer rows is recorded as what it would have taken with all of them,
// and a prediction takes off the rows a pass will not want, at row_ms() each.
//
// The table starts from a calibration (calibrate_pass_cost(), a few passes on a spare instance
// of the model the first time a group of sessions weighs drafts on it: the time of 1, 4 and 8
// tokens and of a logit row, 0.8 s for the 1.5B on Zen 3) and is corrected online by every pass
// run. Each size keeps a moving average of its recent passes (a machine shared with other work
// times the same pass differently from one minute to the next); sizes not run yet are
// interpolated.
//
// Thread-safe: sessions on different threads share a model's table.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace specinfer {

class TargetObject;

class PassCost {
 public:
  static constexpr int32_t kMaxTokens = 256;  // sizes recorded; larger passes are not

  // A pass over `tokens` tokens, with logits for `rows` of them, took `ms`.
  void record(int32_t tokens, int32_t rows, double ms);
  void record(int32_t tokens, double ms) { record(tokens, tokens, ms); }
  // The time of one logit row (0 until calibrated or set).
  double row_ms() const;
  void set_row_ms(double ms);
  // True for the one caller that is to calibrate the table (see above); false for every later one.
  bool claim_calibration();
  // Time of a pass over n tokens with logits for all of them: the moving average of that size, else
  // interpolated linearly between the nearest recorded sizes; past the largest, extrapolated with
  // the slope from the smallest recorded size (5% of a pass per token when only one size is known,
  // so that drafting gets tried); below the smallest, its time. 0 with nothing recorded.
  double ms(int32_t n) const;
  // Time of a pass over n tokens with logits for `rows` of them: ms(n) less the rows it does not
  // want.
  double ms(int32_t n, int32_t rows) const;
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
  double row_ms_ = 0;
  bool calibration_claimed_ = false;
};

// Calibrates the model's table (model.pass_cost(), see above) once per loaded model: the first
// call claims it, later ones return at once. Runs its passes on an instance shared from `model`,
// so no session's cache changes; a model that cannot share, or a pass that fails, leaves the
// table to the passes run.
void calibrate_pass_cost(TargetObject &model);

}  // namespace specinfer
