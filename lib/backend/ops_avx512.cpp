// AVX-512 exp(x - m) and its sum, for the attention's streaming softmax and the logits' softmax:
// the AVX2 kernel's steps (ops_avx2.cpp: the same range reduction, polynomial and clamps, each an
// IEEE operation per lane) on sixteen lanes, so every value is the same bits; the sum adds each
// eight-value half in the AVX2 kernel's order, so it is too.
// Everything is file-local (see matmul_avx2.cpp).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own "undefined" placeholder vectors
// (in the conversion intrinsics): a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <math.h>

#include "backend/ops.h"
#include "backend/simd_x86.h"

namespace specinfer {

namespace {

inline __m512 exp16(__m512 x) {
  const __mmask16 zero_below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero_below), y);
}

float exp_sub_sum_x(float *x, float m, int64_t n) {
  const __m512 vm = _mm512_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  if (i + 8 <= n) {  // eight more, as one AVX2 step
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(0xFF, x + i), vm));
    _mm512_mask_storeu_ps(x + i, 0xFF, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    i += 8;
  }
  float s = hsum(acc);
  for (; i < n; ++i) {
    x[i] = ::expf(x[i] - m);
    s += x[i];
  }
  return s;
}

}  // namespace

const VecOps &vec_ops_avx512() noexcept {
  static const VecOps ops = [] {
    VecOps o = vec_ops_avx2();
    o.exp_sub_sum = exp_sub_sum_x;
    return o;
  }();
  return ops;
}

}  // namespace specinfer
