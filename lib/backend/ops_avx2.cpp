// AVX2 + FMA vector primitives. exp uses a range reduction to 2^n * e^r with a degree-6 polynomial
// for e^r (relative error about 2e-7); inputs below -87 give exactly 0.
// Everything is file-local and calls no shared inline function (see matmul_avx2.cpp).
#include <immintrin.h>

#include <algorithm>

#include <math.h>

#include "backend/ops.h"

namespace specinfer {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 exp8(__m256 x) {
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(zero_below, y);
}

float dot_a(const float *a, const float *b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_a(float a, const float *x, float *y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void scale_a(float *x, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] *= s;
}

float sumsq_a(const float *x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    s0 = _mm256_fmadd_ps(a, a, s0);
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

void mul_scaled_a(const float *x, const float *w, float s, float *y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  if (w != nullptr) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(
          y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; ++i) y[i] = x[i] * s * w[i];
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; ++i) y[i] = x[i] * s;
  }
}

float exp_sub_sum_a(float *x, float m, int64_t n) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum(acc);
  for (; i < n; ++i) {
    x[i] = ::expf(x[i] - m);
    s += x[i];
  }
  return s;
}

void silu_mul_a(float *gate, const float *up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + ::expf(-gate[i])) * up[i];
}

void add_a(float *y, const float *x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

// Four keys' scores at once: q is loaded once per 8 values for all four, two accumulators per key.
// The reduction order of a key's sum is the same in every slot (hadd tree, then the two 128-bit
// halves), so a key's score does not depend on which keys share its group (batch invariance).
inline void scores4(const float *q, const float *k0, const float *k1, const float *k2,
                    const float *k3, int64_t hd, float scale, float *out4) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(),
         b3 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) {
    const __m256 qa = _mm256_loadu_ps(q + d), qb = _mm256_loadu_ps(q + d + 8);
    a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + d), a3);
    b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + d + 8), b0);
    b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + d + 8), b1);
    b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + d + 8), b2);
    b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + d + 8), b3);
  }
  if (d < hd) {  // hd % 16 == 8
    const __m256 qa = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + d), a3);
  }
  a0 = _mm256_add_ps(a0, b0);
  a1 = _mm256_add_ps(a1, b1);
  a2 = _mm256_add_ps(a2, b2);
  a3 = _mm256_add_ps(a3, b3);
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(out4, _mm_mul_ps(r, _mm_set1_ps(scale)));
}

void scores_a(const float *q, int64_t q_stride, int64_t g, const float *k, int64_t stride,
              int64_t n, int64_t hd, float scale, float *out, int64_t out_stride) {
  if (hd % 8 != 0) {
    for (int64_t h = 0; h < g; ++h)
      for (int64_t j = 0; j < n; ++j)
        out[h * out_stride + j] = dot_a(q + h * q_stride, k + j * stride, hd) * scale;
    return;
  }
  // Four keys (a few KiB) stay in L1 while every head of the group scores them.
  for (int64_t j = 0; j < n; j += 4) {
    const float *kk[4];
    for (int i = 0; i < 4; ++i)
      kk[i] = k + std::min<int64_t>(j + i, n - 1) * stride;  // repeat the last
    for (int64_t h = 0; h < g; ++h) {
      float *o = out + h * out_stride + j;
      if (j + 4 <= n) {
        scores4(q + h * q_stride, kk[0], kk[1], kk[2], kk[3], hd, scale, o);
      } else {
        float tmp[4];
        scores4(q + h * q_stride, kk[0], kk[1], kk[2], kk[3], hd, scale, tmp);
        for (int64_t i = 0; j + i < n; ++i) o[i] = tmp[i];
      }
    }
  }
}

void weighted_sum_a(const float *p, int64_t p_stride, int64_t g, const float *v, int64_t stride,
                    int64_t n, int64_t hd, float *out, int64_t q_stride) {
  if (hd % 8 != 0) {
    for (int64_t h = 0; h < g; ++h) {
      float *o = out + h * q_stride;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0.0f;
      for (int64_t j = 0; j < n; ++j)
        if (p[h * p_stride + j] != 0.0f) axpy_a(p[h * p_stride + j], v + j * stride, o, hd);
    }
    return;
  }
  // Blocks of keys (their values stay in L1) for every head in turn; per head and 64 values eight
  // accumulators, keys in order: per value the same sums as the axpy sequence.
  constexpr int64_t kBlock = 32;
  for (int64_t h = 0; h < g; ++h)
    for (int64_t d = 0; d < hd; ++d) out[h * q_stride + d] = 0.0f;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t j1 = std::min(n, j0 + kBlock);
    for (int64_t h = 0; h < g; ++h) {
      const float *ph = p + h * p_stride;
      float *o = out + h * q_stride;
      int64_t d = 0;
      for (; d + 64 <= hd; d += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(o + d + 8 * i);
        for (int64_t j = j0; j < j1; ++j) {
          if (ph[j] == 0.0f) continue;
          const __m256 pj = _mm256_set1_ps(ph[j]);
          const float *vj = v + j * stride + d;
          for (int i = 0; i < 8; ++i)
            acc[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), acc[i]);
        }
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + d + 8 * i, acc[i]);
      }
      for (; d < hd; d += 8) {
        __m256 acc = _mm256_loadu_ps(o + d);
        for (int64_t j = j0; j < j1; ++j)
          if (ph[j] != 0.0f)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(ph[j]), _mm256_loadu_ps(v + j * stride + d), acc);
        _mm256_storeu_ps(o + d, acc);
      }
    }
  }
}

}  // namespace

const VecOps &vec_ops_avx2() noexcept {
  static const VecOps ops = {scale_a,    sumsq_a, mul_scaled_a, exp_sub_sum_a,
                             silu_mul_a, add_a,   scores_a,     weighted_sum_a};
  return ops;
}

}  // namespace specinfer
