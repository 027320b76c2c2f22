// Sample statistics for the statistical tests (header-only, C++): mean, unbiased variance, and
// the standard errors of both.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace test_stats {

struct Stats {
  double mean = 0, var = 0, se_mean = 0, se_var = 0;
};

inline Stats stats_of(const std::vector<double> &x) {
  Stats s;
  const double n = static_cast<double>(x.size());
  for (double v : x) s.mean += v;
  s.mean /= n;
  double m2 = 0, m4 = 0;
  for (double v : x) {
    const double d = (v - s.mean) * (v - s.mean);
    m2 += d;
    m4 += d * d;
  }
  s.var = m2 / (n - 1);
  m4 /= n;
  s.se_mean = std::sqrt(s.var / n);
  s.se_var = std::sqrt(std::max(0.0, m4 - (m2 / n) * (m2 / n)) / n);
  return s;
}

}  // namespace test_stats
