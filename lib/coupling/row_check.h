// Fast path of the probability-row check (see check_prob_row in step_coupler.h).
#pragma once

#include <cstdint>

namespace specinfer {

// True if every entry of row[0..n) is finite and >= 0; *sum receives their sum either way.
bool prob_row_stats_avx2(const float *row, int32_t n, double *sum);

}  // namespace specinfer
