#include "session/pass_cost.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <utility>

#include "api/handles.h"

namespace specinfer {

void PassCost::record(int32_t tokens, int32_t rows, double ms) {
  if (!(ms > 0) || tokens < 1 || tokens > kMaxTokens) return;
  std::lock_guard<std::mutex> lock(mu_);
  ms += row_ms_ * (tokens - std::clamp(rows, 0, tokens));  // as if every token had its row
  double &m = ms_[static_cast<size_t>(tokens)];
  m = m > 0 ? 0.8 * m + 0.2 * ms : ms;
}

double PassCost::row_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return row_ms_;
}

void PassCost::set_row_ms(double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  row_ms_ = ms > 0 ? ms : 0.0;
}

bool PassCost::claim_calibration() {
  std::lock_guard<std::mutex> lock(mu_);
  return !std::exchange(calibration_claimed_, true);
}

double PassCost::measured(int32_t n) const {
  if (n < 1 || n > kMaxTokens) return 0.0;
  std::lock_guard<std::mutex> lock(mu_);
  return ms_[static_cast<size_t>(n)];
}

double PassCost::ms(int32_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  return interpolate(ms_, n);
}

double PassCost::ms(int32_t n, int32_t rows) const {
  std::lock_guard<std::mutex> lock(mu_);
  const double all = interpolate(ms_, n);
  return std::max(0.0, all - row_ms_ * (std::max(n, 1) - std::clamp(rows, 0, std::max(n, 1))));
}

void PassCost::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ms_.fill(0);
  row_ms_ = 0;
  calibration_claimed_ = false;
}

double PassCost::interpolate(const std::array<double, kMaxTokens + 1> &t, int32_t n) {
  if (n < 1) n = 1;
  if (n <= kMaxTokens && t[static_cast<size_t>(n)] > 0) return t[static_cast<size_t>(n)];
  int32_t lo = 0, hi = 0, first = 0;
  for (int32_t m = std::min(n - 1, kMaxTokens); m >= 1; --m)
    if (t[static_cast<size_t>(m)] > 0) {
      lo = m;
      break;
    }
  for (int32_t m = n + 1; m <= kMaxTokens; ++m)
    if (t[static_cast<size_t>(m)] > 0) {
      hi = m;
      break;
    }
  for (int32_t m = 1; m <= kMaxTokens && !first; ++m)
    if (t[static_cast<size_t>(m)] > 0) first = m;
  if (!lo && !hi) return 0.0;
  if (!lo) return t[static_cast<size_t>(hi)];
  const double t_lo = t[static_cast<size_t>(lo)];
  if (hi) return t_lo + (t[static_cast<size_t>(hi)] - t_lo) * (n - lo) / double(hi - lo);
  const double slope = lo > first
                           ? std::max(0.0, (t_lo - t[static_cast<size_t>(first)]) / (lo - first))
                           : 0.05 * t_lo;
  return t_lo + slope * (n - lo);
}

std::vector<double> PassCost::monotone_table(int32_t n_max) const {
  std::array<double, kMaxTokens + 1> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = ms_;
  }
  // Pool adjacent violators over the recorded sizes, each weighing the same: a block's value is
  // its sizes' mean, and blocks merge while one is slower than the next.
  struct Block {
    double sum;
    int32_t count, last;
  };
  std::vector<Block> blocks;
  for (int32_t n = 1; n <= kMaxTokens; ++n) {
    if (!(t[static_cast<size_t>(n)] > 0)) continue;
    blocks.push_back({t[static_cast<size_t>(n)], 1, n});
    while (blocks.size() >= 2) {
      const Block &b = blocks.back(), &a = blocks[blocks.size() - 2];
      if (a.sum / a.count <= b.sum / b.count) break;
      const Block merged{a.sum + b.sum, a.count + b.count, b.last};
      blocks.pop_back();
      blocks.back() = merged;
    }
  }
  int32_t first = 1;
  for (const Block &b : blocks) {
    for (int32_t n = first; n <= b.last; ++n)
      if (t[static_cast<size_t>(n)] > 0) t[static_cast<size_t>(n)] = b.sum / b.count;
    first = b.last + 1;
  }
  std::vector<double> out(static_cast<size_t>(std::max(n_max, 0)) + 1);
  for (int32_t n = 0; n <= n_max; ++n) out[static_cast<size_t>(n)] = interpolate(t, n);
  return out;
}

void calibrate_pass_cost(TargetObject &model) {
  const std::shared_ptr<PassCost> cost = model.pass_cost();
  if (!cost || !model.can_share() || !cost->claim_calibration()) return;
  try {
    // Deleted as what share() made (lib/api/handles.h), since TargetObject has no virtual
    // destructor.
    std::unique_ptr<specinfer_target> probe(static_cast<specinfer_target *>(model.share()));
    const int32_t vocab = model.info().vocab_size;
    constexpr int32_t kWide = 8;
    if (vocab < 1 || model.info().n_ctx < kWide) return;
    std::vector<int32_t> tokens(kWide), positions(kWide);
    for (int32_t i = 0; i < kWide; ++i) {
      tokens[static_cast<size_t>(i)] = (1000 + 37 * i) % vocab;  // ordinary tokens of most models
      positions[static_cast<size_t>(i)] = i;
    }
    std::vector<float> logits(static_cast<size_t>(kWide) * static_cast<size_t>(vocab));
    // The time of a pass over n tokens from an empty cache, logits for the last `rows`.
    const auto time = [&](int32_t n, int32_t rows) {
      probe->kv_truncate(0);
      specinfer_forward_batch b{};
      b.struct_size = sizeof b;
      b.n_tokens = n;
      b.tokens = tokens.data();
      b.positions = positions.data();
      b.n_logits = rows;
      b.logits = logits.data();
      const auto t0 = std::chrono::steady_clock::now();
      probe->forward(b);
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    // A logit row is about a tenth of a token, within the noise of one pass on a shared machine:
    // the wide pass with and without its rows three times each, alternated, the median of each.
    // The first pass of a fresh instance also pays for its buffers: a one-token pass goes first.
    const double one = time(1, 1);
    std::array<double, 3> all{}, last{};
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = time(kWide, kWide);
      last[i] = time(kWide, 1);
    }
    std::sort(all.begin(), all.end());
    std::sort(last.begin(), last.end());
    const double four = time(4, 4), wide = all[1];
    // A row is a product with the output matrix, a part of a token's: at most half its time.
    const double per_token = std::max(0.0, (wide - one) / (kWide - 1));
    cost->set_row_ms(std::clamp((wide - last[1]) / (kWide - 1), 0.0, 0.5 * per_token));
    cost->record(1, 1, one);
    cost->record(4, 4, four);
    cost->record(kWide, kWide, wide);
  } catch (...) {
    // A model that cannot spare an instance or a pass learns its table from the passes run.
  }
}

}  // namespace specinfer
