// The AVX2 scorer of sketched attention: eight keys at a time, each nibble of their signs looked
// up in its 16-entry table as two 8-entry permutes (vpermps) and a blend on the nibble's high bit;
// any number of query heads, eight at a time.
// Adds the same entries in the same order as sketch_scores_scalar, lane by lane, so the scores are
// equal bit for bit.
#include <immintrin.h>

#include <algorithm>

#include "backend/attention_sketch.h"

namespace specinfer {

namespace {

// The largest of g heads' sums (g <= kGroup; tables t, one head's every `per_head` floats) for the
// eight keys whose sign words gather from blk at offsets offs.
constexpr int64_t kGroup = 8;

__m256 best_of(const float *t, int64_t g, int64_t per_head, int32_t words, const uint8_t *blk,
               __m256i offs) {
  const __m256i low4 = _mm256_set1_epi32(15);
  __m256 acc[kGroup];
  for (int h = 0; h < kGroup; ++h) acc[h] = _mm256_setzero_ps();
  for (int32_t w = 0; w < words; ++w) {
    const __m256i word =
        _mm256_i32gather_epi32(reinterpret_cast<const int *>(blk + 4 + 4 * w), offs, 1);
    for (int i = 0; i < 8; ++i) {
      const __m256i nib = _mm256_and_si256(_mm256_srli_epi32(word, 4 * i), low4);
      const __m256 high = _mm256_castsi256_ps(_mm256_slli_epi32(nib, 28));  // bit 3 -> sign
      const int32_t at = (w * 8 + i) * 16;
      for (int64_t h = 0; h < g; ++h) {
        const float *th = t + h * per_head + at;
        const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(th), nib);
        const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(th + 8), nib);
        acc[h] = _mm256_add_ps(acc[h], _mm256_blendv_ps(lo, hi, high));
      }
    }
  }
  __m256 best = acc[0];
  for (int64_t h = 1; h < g; ++h) best = _mm256_max_ps(best, acc[h]);
  return best;
}

}  // namespace

void sketch_scores_avx2(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                        size_t stride, int64_t n, float *out) {
  const int32_t words = bits / 32;
  const int64_t per_head = int64_t(bits) / 4 * 16;
  const __m256i offs = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(int32_t(stride)));
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const uint8_t *blk = base + size_t(j) * stride;
    // The gathers wait on memory unless the rows are asked for ahead (64 keys).
    if (j + 72 <= n)
      for (size_t off = 0; off < 8 * stride; off += 64)
        _mm_prefetch(reinterpret_cast<const char *>(blk + 64 * stride + off), _MM_HINT_T0);
    // Heads in groups of up to eight (their sums in registers); the maximum of the groups' maxima.
    __m256 best = best_of(tables, std::min(g, kGroup), per_head, words, blk, offs);
    for (int64_t h0 = kGroup; h0 < g; h0 += kGroup)
      best = _mm256_max_ps(best, best_of(tables + h0 * per_head, std::min(g - h0, kGroup), per_head,
                                         words, blk, offs));
    const __m256 norm = _mm256_i32gather_ps(reinterpret_cast<const float *>(blk), offs, 1);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(norm, best));
  }
  if (j < n)
    sketch_scores_scalar(tables, g, bits, base + size_t(j) * stride, stride, n - j, out + j);
}

}  // namespace specinfer
