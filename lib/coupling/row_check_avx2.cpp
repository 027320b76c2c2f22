// The probability-row check, eight floats at a time (AVX2): all entries finite and >= 0 (NaN
// fails both comparisons), and their sum accumulated in double.
#include <immintrin.h>

#include <cfloat>

#include "coupling/row_check.h"

namespace specinfer {

bool prob_row_stats_avx2(const float *row, int32_t n, double *sum) {
  const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(FLT_MAX);
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(row + i);
    ok = _mm256_and_ps(
        ok, _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GE_OQ), _mm256_cmp_ps(x, big, _CMP_LE_OQ)));
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, _mm256_add_pd(s0, s1));
  double total = (parts[0] + parts[1]) + (parts[2] + parts[3]);
  bool good = _mm256_movemask_ps(ok) == 0xFF;
  for (; i < n; ++i) {
    const float x = row[i];
    good = good && x >= 0.0f && x <= FLT_MAX;
    total += x;
  }
  *sum = total;
  return good;
}

}  // namespace specinfer
