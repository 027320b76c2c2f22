#include "session/pass_cost.h"

#include <algorithm>

namespace specinfer {

void PassCost::record(int32_t tokens, double ms) {
  if (!(ms > 0) || tokens < 1 || tokens > kMaxTokens) return;
  std::lock_guard<std::mutex> lock(mu_);
  double &m = ms_[static_cast<size_t>(tokens)];
  m = m > 0 ? 0.8 * m + 0.2 * ms : ms;
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

void PassCost::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ms_.fill(0);
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

}  // namespace specinfer
