// The AVX-512 scorer of sketched attention: sixteen keys at a time, each nibble of their signs a
// 16-entry table lookup in one register (vpermps). Adds the same entries in the same order as
// sketch_scores_scalar, lane by lane, so the scores are equal bit for bit.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own "undefined" placeholder vectors
// (in the gather intrinsics): a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "backend/attention_sketch.h"

namespace specinfer {

void sketch_scores_avx512(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                          size_t stride, int64_t n, float *out) {
  const int32_t nibbles = bits / 4, words = bits / 32;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int32_t(stride)));
  const __m512i low4 = _mm512_set1_epi32(15);
  constexpr int kMaxHeads = 16;
  int64_t j = 0;
  for (; j + 16 <= n && g <= kMaxHeads; j += 16) {
    const uint8_t *blk = base + size_t(j) * stride;
    __m512 acc[kMaxHeads];
    for (int h = 0; h < kMaxHeads; ++h) acc[h] = _mm512_setzero_ps();
    for (int32_t w = 0; w < words; ++w) {
      const __m512i word = _mm512_i32gather_epi32(offs, blk + 4 + 4 * w, 1);
      for (int i = 0; i < 8; ++i) {
        const __m512i nib = _mm512_and_si512(_mm512_srli_epi32(word, 4 * i), low4);
        const int32_t at = (w * 8 + i) * 16;
        for (int64_t h = 0; h < g; ++h)
          acc[h] = _mm512_add_ps(
              acc[h], _mm512_permutexvar_ps(nib, _mm512_loadu_ps(tables + h * nibbles * 16 + at)));
      }
    }
    __m512 best = acc[0];
    for (int64_t h = 1; h < g; ++h) best = _mm512_max_ps(best, acc[h]);
    const __m512 norm = _mm512_i32gather_ps(offs, blk, 1);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(norm, best));
  }
  if (j < n)
    sketch_scores_scalar(tables, g, bits, base + size_t(j) * stride, stride, n - j, out + j);
}

}  // namespace specinfer
