// AVX2 + FMA + F16C attention kernels over f32, f16, q8_0 and q4_0 rows (head_dim a multiple of
// 32). Every row is decoded to floats 32 values at a time in registers and applied to up to eight
// query heads (scores) or six output heads (accumulate) while there, so that grouped-query
// attention reads each key and value once for its whole group.
// Everything is file-local and calls no shared inline function (see matmul_avx2.cpp).
#include <immintrin.h>

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

// Values 16 * half .. 16 * half + 15 of 32-value block b of a row, as two vectors.
template <int T>
inline void load16(const uint8_t *row, int64_t b, int half, __m256 x[2]) {
  if constexpr (T == kF32) {
    const float *f = reinterpret_cast<const float *>(row) + b * 32 + half * 16;
    x[0] = _mm256_loadu_ps(f);
    x[1] = _mm256_loadu_ps(f + 8);
  } else if constexpr (T == kF16) {
    const uint8_t *h = row + (b * 32 + half * 16) * 2;
    x[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
    x[1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + 16)));
  } else if constexpr (T == kQ8) {
    const uint8_t *blk = row + b * 34;
    const __m256 d = _mm256_set1_ps(half_at(blk));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2 + half * 16));
    x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), d);
  } else {  // Q4_0: byte i holds value i (low nibble) and i + 16 (high), each q - 8
    const uint8_t *blk = row + b * 18;
    const __m256 d = _mm256_set1_ps(half_at(blk));
    __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
    if (half) q = _mm_srli_epi16(q, 4);
    q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
    x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), d);
  }
}

// Lane h of the result = the sum of a[h]'s lanes.
inline __m256 reduce8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

template <int T, int G>
void scores_tg(const float *q, const uint8_t *const *rows, int64_t n, int64_t hd, float scale,
               float *s, int64_t s_stride, float *s_max) {
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row<T>(rows[j + kAhead], hd);
    __m256 acc[8];
    for (int h = 0; h < 8; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < hd / 32; ++b) {
      __m256 x[4];
      load16<T>(rows[j], b, 0, x);
      load16<T>(rows[j], b, 1, x + 2);
      for (int h = 0; h < G; ++h) {
        const float *qh = q + h * hd + b * 32;
        for (int i = 0; i < 4; ++i)
          acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * i), x[i], acc[h]);
      }
    }
    alignas(32) float r[8];
    const __m256 sc = _mm256_mul_ps(reduce8(acc), vs);
    mx = _mm256_max_ps(sc, mx);
    _mm256_store_ps(r, sc);
    for (int h = 0; h < G; ++h) s[h * s_stride + j] = r[h];
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, mx);
  for (int h = 0; h < G; ++h) s_max[h] = m[h];
}

// Rows already in L1 (decoded values) skip the prefetches (PF false).
template <int T, int G, bool PF = true>
void accumulate_tg(const float *p, int64_t p_stride, const uint8_t *const *rows, int64_t n,
                   int64_t hd, float *o) {
  for (int64_t b = 0; b < hd / 32; ++b)
    for (int half = 0; half < 2; ++half) {
      const int64_t col = b * 32 + half * 16;
      __m256 acc[G][2];
      for (int h = 0; h < G; ++h) {
        acc[h][0] = _mm256_loadu_ps(o + h * hd + col);
        acc[h][1] = _mm256_loadu_ps(o + h * hd + col + 8);
      }
      for (int64_t j = 0; j < n; ++j) {
        if (PF && b == 0 && half == 0 && j + kAhead < n) prefetch_row<T>(rows[j + kAhead], hd);
        __m256 x[2];
        load16<T>(rows[j], b, half, x);
        for (int h = 0; h < G; ++h) {
          const __m256 pj = _mm256_broadcast_ss(p + h * p_stride + j);
          acc[h][0] = _mm256_fmadd_ps(pj, x[0], acc[h][0]);
          acc[h][1] = _mm256_fmadd_ps(pj, x[1], acc[h][1]);
        }
      }
      for (int h = 0; h < G; ++h) {
        _mm256_storeu_ps(o + h * hd + col, acc[h][0]);
        _mm256_storeu_ps(o + h * hd + col + 8, acc[h][1]);
      }
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

// Keys per decoded chunk: 32 rows of 128 floats stay in L1.
constexpr int64_t kDecodeKeys = 32;

// The n rows' values as floats (load16's, so the products are the same bits), one row of hd after
// another in out, and out_rows pointing at them.
template <int T>
void decode_rows(const uint8_t *const *rows, int64_t n, int64_t hd, float *out,
                 const uint8_t **out_rows) {
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row<T>(rows[j + kAhead], hd);
    float *f = out + j * hd;
    for (int64_t b = 0; b < hd / 32; ++b)
      for (int half = 0; half < 2; ++half) {
        __m256 x[2];
        load16<T>(rows[j], b, half, x);
        _mm256_storeu_ps(f + b * 32 + half * 16, x[0]);
        _mm256_storeu_ps(f + b * 32 + half * 16 + 8, x[1]);
      }
    out_rows[j] = reinterpret_cast<const uint8_t *>(f);
  }
}

template <int T, bool PF = true>
void accumulate_t(const float *p, int64_t p_stride, int64_t g, const uint8_t *const *rows,
                  int64_t n, int64_t hd, float *o) {
  if constexpr (T != kF32) {
    // More heads than one pass takes (a verify pass's queries share each key): the values are
    // decoded once, a chunk of keys at a time, instead of once per group of heads. Each head's
    // sums run over the same products in the same order either way.
    if (g > 6) {
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
  // Six heads' accumulators (12 registers) plus a row's 16 values and a weight fill the 16.
  for (int64_t h0 = 0; h0 < g; h0 += 6) {
    const float *ph = p + h0 * p_stride;
    float *oh = o + h0 * hd;
    switch (g - h0 < 6 ? g - h0 : 6) {
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
      default:
        accumulate_tg<T, 6, PF>(ph, p_stride, rows, n, hd, oh);
        break;
    }
  }
}

void scores_a(int32_t type, const float *q, int64_t g, const uint8_t *const *rows, int64_t n,
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

void accumulate_a(int32_t type, const float *p, int64_t p_stride, int64_t g,
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

// Q8_0 key tiles: each 64-byte group holds four values of all 16 keys (unsigned, +128). Turned
// back to signed bytes, the query's signs move onto them so that vpmaddubsw multiplies |q| by
// them without saturating, and vpmaddwd adds each key's four products.
template <int G>
void scores_tile_g(const int8_t *qs, const float *qd, const uint8_t *tile, int64_t hd, float scale,
                   int l0, int l1, float *s, int64_t s_stride, float *s_max) {
  const int64_t nb = hd / 32;
  const __m256i flip = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
  __m256 f[G][2];
  for (int h = 0; h < G; ++h) f[h][0] = f[h][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *blk = tile + b * kKeyTileBlock;
    const __m256 dk0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk)));
    const __m256 dk1 =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 16)));
    __m256i acc[G][2];
    for (int h = 0; h < G; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_si256();
    for (int grp = 0; grp < 8; ++grp) {
      const uint8_t *kp = blk + 32 + 64 * grp;
      const __m256i k0 =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(kp)), flip);
      const __m256i k1 =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(kp + 32)), flip);
      for (int h = 0; h < G; ++h) {
        int32_t w;
        std::memcpy(&w, qs + h * hd + b * 32 + 4 * grp, 4);
        const __m256i qb = _mm256_set1_epi32(w), qa = _mm256_abs_epi8(qb);
        acc[h][0] = _mm256_add_epi32(
            acc[h][0], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k0, qb)), ones));
        acc[h][1] = _mm256_add_epi32(
            acc[h][1], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k1, qb)), ones));
      }
    }
    for (int h = 0; h < G; ++h) {
      const __m256 dq = _mm256_set1_ps(qd[h * nb + b]);
      f[h][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][0]), _mm256_mul_ps(dk0, dq), f[h][0]);
      f[h][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][1]), _mm256_mul_ps(dk1, dq), f[h][1]);
    }
  }
  const __m256 vs = _mm256_set1_ps(scale);
  alignas(32) float v[16];
  for (int h = 0; h < G; ++h) {
    _mm256_store_ps(v, _mm256_mul_ps(f[h][0], vs));
    _mm256_store_ps(v + 8, _mm256_mul_ps(f[h][1], vs));
    float mx = s_max[h];
    for (int l = l0; l < l1; ++l) {
      s[h * s_stride + (l - l0)] = v[l];
      mx = mx < v[l] ? v[l] : mx;
    }
    s_max[h] = mx;
  }
}

void scores_tile_a(const int8_t *qs, const float *qd, const int32_t * /*bias: keys made signed*/,
                   int64_t g, const uint8_t *tile, int64_t hd, float scale, int l0, int l1,
                   float *s, int64_t s_stride, float *s_max) {
  const int64_t nb = hd / 32;
  for (int64_t h0 = 0; h0 < g; h0 += 4) {
    const int8_t *q = qs + h0 * hd;
    const float *d = qd + h0 * nb;
    float *sh = s + h0 * s_stride, *mh = s_max + h0;
    switch (g - h0 < 4 ? g - h0 : 4) {
      case 1:
        scores_tile_g<1>(q, d, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 2:
        scores_tile_g<2>(q, d, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      case 3:
        scores_tile_g<3>(q, d, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
      default:
        scores_tile_g<4>(q, d, tile, hd, scale, l0, l1, sh, s_stride, mh);
        break;
    }
  }
}

}  // namespace

const AttnKernels &attn_kernels_avx2() noexcept {
  static const AttnKernels k = {scores_a, accumulate_a, scores_tile_a};
  return k;
}

}  // namespace specinfer
