// The AVX-512 scorer of sketched attention: sixteen keys at a time, each nibble of their signs a
// 16-entry table lookup in one register (vpermps). Adds the same entries in the same order as
// sketch_scores_scalar, lane by lane, so the scores are equal bit for bit.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own "undefined" placeholder vectors
// (in the gather intrinsics): a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/attention_sketch.h"

namespace specinfer {

namespace {

// The largest of G heads' sums (tables t, one head's tables every `per_head` floats) for the
// sixteen keys whose sign words gather from blk at offsets offs.
template <int G>
inline __m512 best_of(const float *t, int64_t per_head, int32_t words, const uint8_t *blk,
                      __m512i offs) {
  __m512 acc[G];
  for (int h = 0; h < G; ++h) acc[h] = _mm512_setzero_ps();
  for (int32_t w = 0; w < words; ++w) {
    const __m512i word = _mm512_i32gather_epi32(offs, blk + 4 + 4 * w, 1);
    for (int i = 0; i < 8; ++i) {
      // vpermps reads only an index's low four bits: the nibble needs no mask.
      const __m512i nib = _mm512_srli_epi32(word, 4 * i);
      const float *at = t + (w * 8 + i) * 16;
      for (int h = 0; h < G; ++h)
        acc[h] =
            _mm512_add_ps(acc[h], _mm512_permutexvar_ps(nib, _mm512_loadu_ps(at + h * per_head)));
    }
  }
  __m512 best = acc[0];
  for (int h = 1; h < G; ++h) best = _mm512_max_ps(best, acc[h]);
  return best;
}

__m512 best_of_n(int64_t g, const float *t, int64_t per_head, int32_t words, const uint8_t *blk,
                 __m512i offs) {
  switch (g) {
    case 1:
      return best_of<1>(t, per_head, words, blk, offs);
    case 2:
      return best_of<2>(t, per_head, words, blk, offs);
    case 3:
      return best_of<3>(t, per_head, words, blk, offs);
    case 4:
      return best_of<4>(t, per_head, words, blk, offs);
    case 5:
      return best_of<5>(t, per_head, words, blk, offs);
    case 6:
      return best_of<6>(t, per_head, words, blk, offs);
    case 7:
      return best_of<7>(t, per_head, words, blk, offs);
    default:
      return best_of<8>(t, per_head, words, blk, offs);
  }
}

}  // namespace

void sketch_scores_avx512(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                          size_t stride, int64_t n, float *out) {
  const int32_t words = bits / 32;
  const int64_t per_head = int64_t(bits) / 4 * 16;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int32_t(stride)));
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const uint8_t *blk = base + size_t(j) * stride;
    // The gathers wait on memory unless the rows are asked for ahead (64 keys).
    if (j + 80 <= n)
      for (size_t off = 0; off < 16 * stride; off += 64)
        _mm_prefetch(reinterpret_cast<const char *>(blk + 64 * stride + off), _MM_HINT_T0);
    // Heads in groups of up to eight (their sums in registers); the maximum of the groups' maxima.
    __m512 best = best_of_n(std::min<int64_t>(g, 8), tables, per_head, words, blk, offs);
    for (int64_t h0 = 8; h0 < g; h0 += 8)
      best = _mm512_max_ps(best, best_of_n(std::min<int64_t>(g - h0, 8), tables + h0 * per_head,
                                           per_head, words, blk, offs));
    const __m512 norm = _mm512_i32gather_ps(offs, blk, 1);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(norm, best));
  }
  if (j < n)
    sketch_scores_scalar(tables, g, bits, base + size_t(j) * stride, stride, n - j, out + j);
}

}  // namespace specinfer
