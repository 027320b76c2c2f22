// AVX-512 attention kernels over f32, f16, q8_0 and q4_0 rows (head_dim a multiple of 32): as the
// AVX2 ones (attention_avx2.cpp) with 16 lanes, each 32-value block of a row decoded once into two
// registers and applied to up to eight query heads.
// Everything is file-local and calls no shared inline function (see matmul_avx2.cpp).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own "undefined" placeholder vectors
// (in the conversion intrinsics): a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/attention.h"
#include "specinfer_plugin.h"

namespace specinfer {

namespace {

constexpr int kF32 = SPECINFER_WTYPE_F32, kF16 = SPECINFER_WTYPE_F16, kQ8 = SPECINFER_WTYPE_Q8_0,
              kQ4 = SPECINFER_WTYPE_Q4_0;

inline float half_at(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Rows may come from scattered addresses (a tree's gathered keys, or a cache whose positions
// hold every kv head's row side by side), where the hardware prefetchers alone leave the loads
// waiting on memory, so each kernel asks for the row kAhead keys ahead.
constexpr int64_t kAhead = 6;

template <int T>
inline void prefetch_row(const uint8_t *row, int64_t hd) {
  const int64_t bytes = T == kF32   ? hd * 4
                        : T == kF16 ? hd * 2
                        : T == kQ8  ? hd / 32 * 34
                                    : hd / 32 * 18;
  for (int64_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char *>(row + off), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char *>(row + bytes - 1), _MM_HINT_T0);
}

// The 32 values of block b of a row, as two vectors.
template <int T>
inline void load32(const uint8_t *row, int64_t b, __m512 x[2]) {
  if constexpr (T == kF32) {
    const float *f = reinterpret_cast<const float *>(row) + b * 32;
    x[0] = _mm512_loadu_ps(f);
    x[1] = _mm512_loadu_ps(f + 16);
  } else if constexpr (T == kF16) {
    const uint8_t *h = row + b * 64;
    x[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h)));
    x[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + 32)));
  } else if constexpr (T == kQ8) {
    const uint8_t *blk = row + b * 34;
    const __m512 d = _mm512_set1_ps(half_at(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 18));
    x[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    x[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
  } else {  // Q4_0: byte i holds value i (low nibble) and i + 16 (high), each q - 8
    const uint8_t *blk = row + b * 18;
    const __m512 d = _mm512_set1_ps(half_at(blk));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m), eight);
    x[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
    x[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
  }
}

// Lane h of the result = the sum of a[h]'s lanes.
inline __m256 reduce8(const __m512 a[8]) {
  __m256 v[8];
  for (int h = 0; h < 8; ++h)
    v[h] = _mm256_add_ps(_mm512_castps512_ps256(a[h]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[h]), 1)));
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of K keys (rows r[0..K)) for G heads: each query load serves all K keys. A key's sums
// are the same whatever K is.
template <int T, int G, int K>
inline void score_keys(const float *q, const uint8_t *const *r, int64_t hd, __m256 out[K]) {
  __m512 acc[K][8];
  for (int i = 0; i < K; ++i)
    for (int h = 0; h < 8; ++h) acc[i][h] = _mm512_setzero_ps();
  for (int64_t b = 0; b < hd / 32; ++b) {
    __m512 x[K][2];
    for (int i = 0; i < K; ++i) load32<T>(r[i], b, x[i]);
    for (int h = 0; h < G; ++h) {
      const __m512 q0 = _mm512_loadu_ps(q + h * hd + b * 32),
                   q1 = _mm512_loadu_ps(q + h * hd + b * 32 + 16);
      for (int i = 0; i < K; ++i) {
        acc[i][h] = _mm512_fmadd_ps(q0, x[i][0], acc[i][h]);
        acc[i][h] = _mm512_fmadd_ps(q1, x[i][1], acc[i][h]);
      }
    }
  }
  for (int i = 0; i < K; ++i) out[i] = reduce8(acc[i]);
}

template <int T, int G>
void scores_tg(const float *q, const uint8_t *const *rows, int64_t n, int64_t hd, float scale,
               float *s, int64_t s_stride, float *s_max) {
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  alignas(32) float r[2][8];
  for (int64_t j = 0; j < n; j += 2) {
    for (int64_t a = j + kAhead; a < j + kAhead + 2 && a < n; ++a) prefetch_row<T>(rows[a], hd);
    __m256 sc[2];
    const int k = j + 2 <= n ? 2 : 1;
    if (k == 2)
      score_keys<T, G, 2>(q, rows + j, hd, sc);
    else
      score_keys<T, G, 1>(q, rows + j, hd, sc);
    for (int i = 0; i < k; ++i) {
      sc[i] = _mm256_mul_ps(sc[i], vs);
      mx = _mm256_max_ps(sc[i], mx);
      _mm256_store_ps(r[i], sc[i]);
      for (int h = 0; h < G; ++h) s[h * s_stride + j + i] = r[i][h];
    }
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, mx);
  for (int h = 0; h < G; ++h) s_max[h] = m[h];
}

// NB blocks of 32 columns per pass over the keys: each weight broadcast serves 2 * NB registers.
// Rows already in L1 (decoded values) skip the prefetches (PF false).
template <int T, int G, int NB, bool PF>
void accumulate_tgb(const float *p, int64_t p_stride, const uint8_t *const *rows, int64_t n,
                    int64_t hd, float *o) {
  for (int64_t b = 0; b < hd / 32; b += NB) {
    __m512 acc[G][2 * NB];
    for (int h = 0; h < G; ++h)
      for (int i = 0; i < 2 * NB; ++i) acc[h][i] = _mm512_loadu_ps(o + h * hd + b * 32 + 16 * i);
    for (int64_t j = 0; j < n; ++j) {
      if (PF && b == 0 && j + kAhead < n) prefetch_row<T>(rows[j + kAhead], hd);
      __m512 x[2 * NB];
      for (int i = 0; i < NB; ++i) load32<T>(rows[j], b + i, x + 2 * i);
      for (int h = 0; h < G; ++h) {
        const __m512 pj = _mm512_set1_ps(p[h * p_stride + j]);
        for (int i = 0; i < 2 * NB; ++i) acc[h][i] = _mm512_fmadd_ps(pj, x[i], acc[h][i]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int i = 0; i < 2 * NB; ++i) _mm512_storeu_ps(o + h * hd + b * 32 + 16 * i, acc[h][i]);
  }
}

template <int T, int G, bool PF = true>
void accumulate_tg(const float *p, int64_t p_stride, const uint8_t *const *rows, int64_t n,
                   int64_t hd, float *o) {
  // Up to six heads take 64 columns a pass (24 accumulators); more heads take 32.
  if (G <= 6 && hd % 64 == 0)
    accumulate_tgb<T, G, 2, PF>(p, p_stride, rows, n, hd, o);
  else
    accumulate_tgb<T, G, 1, PF>(p, p_stride, rows, n, hd, o);
}

// Keys per decoded chunk: 32 rows of 128 floats stay in L1.
constexpr int64_t kDecodeKeys = 32;

// The n rows' values as floats (load32's, so the products are the same bits), one row of hd after
// another in out, and out_rows pointing at them.
template <int T>
void decode_rows(const uint8_t *const *rows, int64_t n, int64_t hd, float *out,
                 const uint8_t **out_rows) {
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row<T>(rows[j + kAhead], hd);
    float *f = out + j * hd;
    for (int64_t b = 0; b < hd / 32; ++b) {
      __m512 x[2];
      load32<T>(rows[j], b, x);
      _mm512_storeu_ps(f + b * 32, x[0]);
      _mm512_storeu_ps(f + b * 32 + 16, x[1]);
    }
    out_rows[j] = reinterpret_cast<const uint8_t *>(f);
  }
}

template <int T>
void scores_t(const float *q, int64_t g, const uint8_t *const *rows, int64_t n, int64_t hd,
              float scale, float *s, int64_t s_stride, float *s_max) {
  for (int64_t h0 = 0; h0 < g; h0 += 8) {
    const float *qh = q + h0 * hd;
    float *sh = s + h0 * s_stride;
    switch (g - h0 < 8 ? g - h0 : 8) {
      case 1:
        scores_tg<T, 1>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 2:
        scores_tg<T, 2>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 3:
        scores_tg<T, 3>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 4:
        scores_tg<T, 4>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 5:
        scores_tg<T, 5>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 6:
        scores_tg<T, 6>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      case 7:
        scores_tg<T, 7>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
      default:
        scores_tg<T, 8>(qh, rows, n, hd, scale, sh, s_stride, s_max + h0);
        break;
    }
  }
}

template <int T, bool PF = true>
void accumulate_t(const float *p, int64_t p_stride, int64_t g, const uint8_t *const *rows,
                  int64_t n, int64_t hd, float *o) {
  if constexpr (T != kF32) {
    // More heads than one pass takes (a verify pass's queries share each key): the values are
    // decoded once, a chunk of keys at a time, instead of once per group of heads. Each head's
    // sums run over the same products in the same order either way.
    if (g > 8) {
      thread_local std::vector<float> buf;
      buf.resize(size_t(kDecodeKeys * hd));
      const uint8_t *f[kDecodeKeys];
      for (int64_t j0 = 0; j0 < n; j0 += kDecodeKeys) {
        const int64_t m = n - j0 < kDecodeKeys ? n - j0 : kDecodeKeys;
        decode_rows<T>(rows + j0, m, hd, buf.data(), f);
        accumulate_t<kF32, false>(p + j0, p_stride, g, f, m, hd, o);
      }
      return;
    }
  }
  // Eight heads' accumulators (16 registers) plus a block's 32 values and the weights.
  for (int64_t h0 = 0; h0 < g; h0 += 8) {
    const float *ph = p + h0 * p_stride;
    float *oh = o + h0 * hd;
    switch (g - h0 < 8 ? g - h0 : 8) {
      case 1:
        accumulate_tg<T, 1, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 2:
        accumulate_tg<T, 2, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 3:
        accumulate_tg<T, 3, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 4:
        accumulate_tg<T, 4, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 5:
        accumulate_tg<T, 5, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 6:
        accumulate_tg<T, 6, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      case 7:
        accumulate_tg<T, 7, PF>(ph, p_stride, rows, n, hd, oh);
        break;
      default:
        accumulate_tg<T, 8, PF>(ph, p_stride, rows, n, hd, oh);
        break;
    }
  }
}

void scores_x(int32_t type, const float *q, int64_t g, const uint8_t *const *rows, int64_t n,
              int64_t hd, float scale, float *s, int64_t s_stride, float *s_max) {
  switch (type) {
    case kF32:
      return scores_t<kF32>(q, g, rows, n, hd, scale, s, s_stride, s_max);
    case kF16:
      return scores_t<kF16>(q, g, rows, n, hd, scale, s, s_stride, s_max);
    case kQ8:
      return scores_t<kQ8>(q, g, rows, n, hd, scale, s, s_stride, s_max);
    default:
      return scores_t<kQ4>(q, g, rows, n, hd, scale, s, s_stride, s_max);
  }
}

void accumulate_x(int32_t type, const float *p, int64_t p_stride, int64_t g,
                  const uint8_t *const *rows, int64_t n, int64_t hd, float *o) {
  switch (type) {
    case kF32:
      return accumulate_t<kF32>(p, p_stride, g, rows, n, hd, o);
    case kF16:
      return accumulate_t<kF16>(p, p_stride, g, rows, n, hd, o);
    case kQ8:
      return accumulate_t<kQ8>(p, p_stride, g, rows, n, hd, o);
    default:
      return accumulate_t<kQ4>(p, p_stride, g, rows, n, hd, o);
  }
}

// Q8_0 key tiles: each 64-byte group holds four values of all 16 keys, so one vpdpbusd per query
// row adds those products to the 16 keys' integer sums at once (keys unsigned, +128; the row's
// bias takes the 128s back out).
template <int G>
void scores_tile_g(const int8_t *qs, const float *qd, const int32_t *bias, const uint8_t *tile,
                   int64_t hd, float scale, int l0, int l1, float *s, int64_t s_stride,
                   float *s_max) {
  const int64_t nb = hd / 32;
  __m512 f[G];
  for (int h = 0; h < G; ++h) f[h] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *blk = tile + b * kKeyTileBlock;
    const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk)));
    __m512i acc[G];
    for (int h = 0; h < G; ++h) acc[h] = _mm512_set1_epi32(bias[h * nb + b]);
    for (int grp = 0; grp < 8; ++grp) {
      const __m512i kx = _mm512_loadu_si512(blk + 32 + 64 * grp);
      for (int h = 0; h < G; ++h) {
        int32_t w;
        std::memcpy(&w, qs + h * hd + b * 32 + 4 * grp, 4);
        acc[h] = _mm512_dpbusd_epi32(acc[h], kx, _mm512_set1_epi32(w));
      }
    }
    for (int h = 0; h < G; ++h)
      f[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h]),
                             _mm512_mul_ps(dk, _mm512_set1_ps(qd[h * nb + b])), f[h]);
  }
  const __m512 vs = _mm512_set1_ps(scale);
  const auto m = __mmask16(((1u << l1) - 1u) & ~((1u << l0) - 1u));
  for (int h = 0; h < G; ++h) {
    const __m512 v = _mm512_mul_ps(f[h], vs);
    float *out = s + h * s_stride;
    if (l0 == 0)
      _mm512_mask_storeu_ps(out, m, v);
    else
      _mm512_mask_storeu_ps(out, __mmask16((1u << (l1 - l0)) - 1u), _mm512_maskz_compress_ps(m, v));
    s_max[h] = std::max(s_max[h], _mm512_mask_reduce_max_ps(m, v));
  }
}

void scores_tile_x(const int8_t *qs, const float *qd, const int32_t *bias, int64_t g,
                   const uint8_t *tile, int64_t hd, float scale, int l0, int l1, float *s,
                   int64_t s_stride, float *s_max) {
  const int64_t nb = hd / 32;
  for (int64_t h0 = 0; h0 < g; h0 += 8) {
    const int8_t *q = qs + h0 * hd;
    const float *d = qd + h0 * nb;
    const int32_t *bi = bias + h0 * nb;
    float *sh = s + h0 * s_stride, *mh = s_max + h0;
    switch (g - h0 < 8 ? g - h0 : 8) {
      case 1:
        scores_tile_g<1>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 2:
        scores_tile_g<2>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 3:
        scores_tile_g<3>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 4:
        scores_tile_g<4>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 5:
        scores_tile_g<5>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 6:
        scores_tile_g<6>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 7:
        scores_tile_g<7>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      default:
        scores_tile_g<8>(q, d, bi, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
    }
  }
}

}  // namespace

const AttnKernels &attn_kernels_avx512() noexcept {
  static const AttnKernels k = {scores_x, accumulate_x, scores_tile_x};
  return k;
}

}  // namespace specinfer
