// AVX2 activation quantization: bit-identical to quantize_act_q8 / quantize_act_q8k in quant.cpp
// (same amax, same 127 / amax, the same separately rounded multiply, add and subtract of the
// 1.5 * 2^23 rounding constant, same NaN / zero handling), only vectorized.
//
// Anonymous namespace and no shared inline functions, as in matmul_avx2.cpp.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "backend/matmul.h"

namespace specinfer {

namespace {

// Quantizes n (a multiple of 32) floats to q; returns d (see quant.cpp's quantize_group).
float quantize_group_avx2(const float *x, int n, int8_t *q) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();  // lanes where x - x != 0 (inf, NaN)
  for (int j = 0; j < n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  if (_mm256_movemask_ps(bad) != 0) {
    std::memset(q, 0, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float am = _mm_cvtss_f32(m);
  if (!(am > 0.0f)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const __m256 id = _mm256_set1_ps(127.0f / am);
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int j = 0; j < n; j += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), id);
      // Keeps GCC from contracting the multiply and the add into one FMA (-ffp-contract=fast is
      // its default and applies to intrinsics): the scalar code rounds the product first.
      __asm__("" : "+x"(p));
      v[k] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(p, magic), magic));
    }
    // packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order.
    const __m256i w =
        _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + j), _mm256_permutevar8x32_epi32(w, order));
  }
  return am / 127.0f;
}

// Sums of consecutive groups of 16 int8 values (n_groups of them) as int32.
inline void group16_sums(const int8_t *q, int n_groups, int32_t *out) {
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int g = 0; g < n_groups; g += 2) {
    // |sum| over 16 values <= 2032: vpmaddubsw with 1 (unsigned) x q (signed) is exact.
    const __m256i s = _mm256_madd_epi16(
        _mm256_maddubs_epi16(ones8,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + 16 * g))),
        ones16);
    // s: 8 int32, lanes 0..3 from group g, 4..7 from group g + 1.
    __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
    lo = _mm_hadd_epi32(lo, hi);  // g: 0+1, 2+3 | g+1: 0+1, 2+3
    lo = _mm_hadd_epi32(lo, lo);  // g, g+1, g, g+1
    out[g] = _mm_cvtsi128_si32(lo);
    out[g + 1] = _mm_extract_epi32(lo, 1);
  }
}

}  // namespace

void quantize_act_q8_avx2(const float *x, ActQ8 *out, int64_t n) noexcept {
  for (int64_t b = 0; b < n / kQK; ++b) {
    out[b].d = quantize_group_avx2(x + b * kQK, kQK, out[b].qs);
    int32_t s[2];
    group16_sums(out[b].qs, 2, s);
    out[b].sum = s[0] + s[1];
  }
}

void quantize_act_q8k_avx2(const float *x, ActQ8K *out, int64_t n) noexcept {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    out[b].d = quantize_group_avx2(x + b * kQKK, kQKK, out[b].qs);
    int32_t s[16];
    group16_sums(out[b].qs, 16, s);
    for (int g = 0; g < 16; ++g) out[b].bsums[g] = static_cast<int16_t>(s[g]);
  }
}

}  // namespace specinfer
