// AVX2 + FMA kernels. Compiled with -mavx2 -mfma; only called after a CPU check.
#include <immintrin.h>

#include <cstring>

#include "sketch/kernels.h"

namespace specinfer::sketch {

namespace {

// Lane r of the result is all-ones when bit r of `byte` is set (8 lanes, one byte).
inline __m256i bit_mask8(uint32_t byte) {
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_set1_epi32(static_cast<int>(byte));
  return _mm256_cmpeq_epi32(_mm256_and_si256(b, sel), sel);
}

// +v where the bit is set, -v where it is clear: flip the sign bit of the clear lanes.
inline __m256 apply_signs(__m256 v, uint32_t byte) {
  const __m256i set = bit_mask8(byte);
  const __m256i sign = _mm256_andnot_si256(set, _mm256_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm256_xor_ps(v, _mm256_castsi256_ps(sign));
}

inline double hsum(__m256d v) {
  const __m128d lo = _mm256_castpd256_pd128(v);
  const __m128d hi = _mm256_extractf128_pd(v, 1);
  const __m128d s = _mm_add_pd(lo, hi);
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

void axpy_avx2(float *y, const float *col, float a, size_t m) {
  const __m256 va = _mm256_set1_ps(a);
  size_t r = 0;
  for (; r + 16 <= m; r += 16) {
    __m256 y0 = _mm256_loadu_ps(y + r), y1 = _mm256_loadu_ps(y + r + 8);
    y0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(col + r), y0);
    y1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(col + r + 8), y1);
    _mm256_storeu_ps(y + r, y0);
    _mm256_storeu_ps(y + r + 8, y1);
  }
  for (; r + 8 <= m; r += 8)
    _mm256_storeu_ps(y + r, _mm256_fmadd_ps(va, _mm256_loadu_ps(col + r), _mm256_loadu_ps(y + r)));
  for (; r < m; ++r) y[r] += a * col[r];
}

void add_signed_avx2(float *y, const uint64_t *bits, float a, size_t m) {
  const __m256 va = _mm256_set1_ps(a);
  size_t r = 0;
  for (; r + 8 <= m; r += 8) {
    const uint32_t byte = static_cast<uint32_t>((bits[r >> 6] >> (r & 63)) & 0xff);
    _mm256_storeu_ps(y + r, _mm256_add_ps(_mm256_loadu_ps(y + r), apply_signs(va, byte)));
  }
  for (; r < m; ++r) y[r] += ((bits[r >> 6] >> (r & 63)) & 1) ? a : -a;
}

double dot_avx2(const unsigned char *x, const unsigned char *y, size_t m) {
  const float *xf = reinterpret_cast<const float *>(x);
  const float *yf = reinterpret_cast<const float *>(y);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  size_t r = 0;
  for (; r + 8 <= m; r += 8) {
    // Unaligned loads through the intrinsic are fine at any address.
    const __m256 vx = _mm256_loadu_ps(xf + r), vy = _mm256_loadu_ps(yf + r);
    acc0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vx)),
                           _mm256_cvtps_pd(_mm256_castps256_ps128(vy)), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vx, 1)),
                           _mm256_cvtps_pd(_mm256_extractf128_ps(vy, 1)), acc1);
  }
  double s = hsum(_mm256_add_pd(acc0, acc1));
  for (; r < m; ++r) {
    float a, b;
    std::memcpy(&a, x + 4 * r, 4);
    std::memcpy(&b, y + 4 * r, 4);
    s += static_cast<double>(a) * static_cast<double>(b);
  }
  return s;
}

double signed_sum_avx2(const unsigned char *q, const unsigned char *bits, size_t m) {
  const float *qf = reinterpret_cast<const float *>(q);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  size_t r = 0;
  for (; r + 8 <= m; r += 8) {
    const uint32_t byte = bits[r >> 3];  // r is a multiple of 8: one whole byte of signs
    const __m256 v = apply_signs(_mm256_loadu_ps(qf + r), byte);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  double s = hsum(_mm256_add_pd(acc0, acc1));
  for (; r < m; ++r) {
    float v;
    std::memcpy(&v, q + 4 * r, 4);
    s += ((bits[r >> 3] >> (r & 7)) & 1) ? static_cast<double>(v) : -static_cast<double>(v);
  }
  return s;
}

const Kernels kAvx2 = {"avx2", axpy_avx2, add_signed_avx2, dot_avx2, signed_sum_avx2};

}  // namespace

const Kernels &avx2_kernel_table() {
  return kAvx2;
}

}  // namespace specinfer::sketch
