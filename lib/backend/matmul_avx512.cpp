// AVX-512 (F, BW, VL, DQ, VNNI) row kernels: float weights (F32 / F16 / BF16) with 16-wide FMA,
// the 32-value signed formats (Q8_0, Q4_0, Q5_0) with VNNI vpdpbusd, two blocks per register, and
// Q6_K with vpdpwssd (its scaled products and their sum in one instruction). The other k-quants
// keep the AVX2 kernels (Q4_K runs packed, packed_avx512.cpp). Same structure and numerics as
// matmul_avx2.cpp.
//
// Tests run these kernels natively on a CPU that has the extensions, and everywhere compiled over
// software intrinsics (SIMDe, tests/support/avx512_emulation.h, as
// matmul_kernel_avx512_emulated) against the same references.
//
// Everything is in an anonymous namespace and calls no shared inline function (see the AVX2 file).
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" placeholder vectors
// (_mm512_undefined_*, used by the cast/extract intrinsics): a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(SPECINFER_AVX512_EMULATED)
#include "support/avx512_emulation.h"
#define matmul_kernel_avx512 matmul_kernel_avx512_emulated
#else
#include <immintrin.h>
#endif

#include <cstring>

#include "backend/matmul.h"
#include "backend/simd_x86.h"

namespace specinfer {

namespace {

constexpr int kTile = 4;

inline float hsum512(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

template <class K>
void rows_tiled(const MatmulArgs &a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t t0 = 0; t0 < a.n_tok;) {
      const int64_t left = a.n_tok - t0;
      float out[kTile];
      int nt;
      if (left >= 4) {
        K::template run<4>(a, row, t0, out);
        nt = 4;
      } else if (left == 3) {
        K::template run<3>(a, row, t0, out);
        nt = 3;
      } else if (left == 2) {
        K::template run<2>(a, row, t0, out);
        nt = 2;
      } else {
        K::template run<1>(a, row, t0, out);
        nt = 1;
      }
      for (int t = 0; t < nt; ++t) a.y[(t0 + t) * a.n_rows + r] = out[t];
      t0 += nt;
    }
  }
}

template <int32_t W>
struct KFloat {
  static __m512 load16(const uint8_t *row, int64_t c) {
    if constexpr (W == SPECINFER_WTYPE_F32) {
      return _mm512_loadu_ps(reinterpret_cast<const float *>(row) + c);
    } else if constexpr (W == SPECINFER_WTYPE_F16) {
      return _mm512_cvtph_ps(load256(row + 2 * c));
    } else {
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(row + 2 * c)), 16));
    }
  }
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t n = a.n_cols;
    const float *x[NT];
    __m512 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = a.x + (t0 + t) * n;
      acc0[t] = _mm512_setzero_ps();
      acc1[t] = _mm512_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
      const __m512 w0 = load16(row, c), w1 = load16(row, c + 16);
      for (int t = 0; t < NT; ++t) {
        acc0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + c), acc0[t]);
        acc1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[t] + c + 16), acc1[t]);
      }
    }
    for (; c + 16 <= n; c += 16) {
      const __m512 w0 = load16(row, c);
      for (int t = 0; t < NT; ++t)
        acc0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + c), acc0[t]);
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum512(_mm512_add_ps(acc0[t], acc1[t]));
    for (; c < n; ++c) {
      const float w = float_elem<W>(row, c);
      for (int t = 0; t < NT; ++t) out[t] += w * x[t][c];
    }
  }
};

// Signed 32-value blocks: 32 values in -128..127 and the block scale.
template <int32_t W>
inline __m256i unpack_signed(const uint8_t *blk, float &d) {
  uint16_t dh;
  std::memcpy(&dh, blk, 2);
  d = h2f(dh);
  if constexpr (W == SPECINFER_WTYPE_Q8_0) {
    return load256(blk + 2);
  } else if constexpr (W == SPECINFER_WTYPE_Q4_0) {
    return _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8));
  } else {  // Q5_0: d, qh[4], qs[16]
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(blk + 6), hi), _mm256_set1_epi8(16));
  }
}

template <int32_t W>
struct KQ32Vnni {
  static constexpr size_t kBytes = W == SPECINFER_WTYPE_Q8_0   ? sizeof(BlockQ8_0)
                                   : W == SPECINFER_WTYPE_Q4_0 ? sizeof(BlockQ4_0)
                                                               : sizeof(BlockQ5_0);
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t nb = a.n_cols / kQK;
    const ActQ8 *x[NT];
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = static_cast<const ActQ8 *>(a.xq) + (t0 + t) * a.xq_blocks;
      acc[t] = _mm512_setzero_ps();
    }
    const __m512i zero = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
      float d0, d1;
      const __m256i q0 = unpack_signed<W>(row + static_cast<size_t>(i) * kBytes, d0);
      const __m256i q1 = unpack_signed<W>(row + static_cast<size_t>(i + 1) * kBytes, d1);
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
      const __m512i aq = _mm512_abs_epi8(q);  // -128 stays 0x80 = 128 unsigned
      const __mmask64 neg = _mm512_movepi8_mask(q);
      for (int t = 0; t < NT; ++t) {
        const ActQ8 &xa = x[t][i], &xb = x[t][i + 1];
        __m512i xv = _mm512_inserti64x4(_mm512_castsi256_si512(load256(xa.qs)), load256(xb.qs), 1);
        xv = _mm512_mask_sub_epi8(xv, neg, zero, xv);
        const __m512i p = _mm512_dpbusd_epi32(zero, aq, xv);
        const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0 * xa.d)),
                                            _mm256_set1_ps(d1 * xb.d), 1);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum512(acc[t]);
    if (i < nb) {
      float d0;
      const __m256i q = unpack_signed<W>(row + static_cast<size_t>(i) * kBytes, d0);
      const __m256i aq = _mm256_abs_epi8(q);
      for (int t = 0; t < NT; ++t) {
        const ActQ8 &xa = x[t][i];
        const __m256i xv = _mm256_sign_epi8(load256(xa.qs), q);
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, xv);
        out[t] += hsum(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d0 * xa.d)));
      }
    }
  }
};

// Q6_K: 16 groups of 16 with signed 8-bit scales, values q - 32 with q in 0..63. As the AVX2
// kernel, with vpdpwssd fusing each vpmaddwd by the group scales with the int32 add: per 32
// values and token one vpmaddubsw and one vpdpwssd. The token's sum starts at the -32 offset,
// -32 * sum_g sc[g] * bsums[g] (|-32 sc| <= 4096 fits int16). Same int32 sums and float step as
// the AVX2 kernels, so the same bits for any number of tokens.
struct KQ6KVnni {
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t nb = a.n_cols / kQKK;
    const ActQ8K *x[NT];
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = static_cast<const ActQ8K *>(a.xq) + (t0 + t) * a.xq_blocks;
      acc[t] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    // Byte shuffles broadcasting int16 element 2k to the low lane and 2k+1 to the high lane.
    const __m256i shuf[4] = {
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                         3, 2, 3, 2, 3, 2, 3),
        _mm256_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6,
                         7, 6, 7, 6, 7, 6, 7),
        _mm256_setr_epi8(8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10,
                         11, 10, 11, 10, 11, 10, 11, 10, 11),
        _mm256_setr_epi8(12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14,
                         15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15)};
    for (int64_t i = 0; i < nb; ++i) {
      const auto *b =
          reinterpret_cast<const BlockQ6_K *>(row + static_cast<size_t>(i) * sizeof(BlockQ6_K));
      uint16_t dh;
      std::memcpy(&dh, &b->d, 2);
      const float d = h2f(dh);
      const __m256i scn = _mm256_sub_epi16(
          _mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(load128(b->scales)), 5));
      __m256i ia[NT];
      for (int t = 0; t < NT; ++t) ia[t] = _mm256_madd_epi16(scn, load256(x[t][i].bsums));
      for (int h = 0; h < 2; ++h) {
        // Scales of groups 8h..8h+7 as int16 in both 128-bit lanes.
        const __m256i sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(
            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b->scales + 8 * h))));
        const __m256i raw0 = load256(b->ql + 64 * h);
        const __m256i raw1 = load256(b->ql + 64 * h + 32);
        const __m256i hb = load256(b->qh + 32 * h);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(raw0, m4),
                               _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(raw1, m4),
                               _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4),
                               _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        for (int k = 0; k < 4; ++k) {
          // Low lane: group 8h+2k, high lane: group 8h+2k+1.
          const __m256i sc = _mm256_shuffle_epi8(sch, shuf[k]);
          for (int t = 0; t < NT; ++t) {
            const int8_t *xq = x[t][i].qs + 128 * h + 32 * k;
            ia[t] = _mm256_dpwssd_epi32(ia[t], _mm256_maddubs_epi16(q[k], load256(xq)), sc);
          }
        }
      }
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(d * x[t][i].d), acc[t]);
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
  }
};

}  // namespace

MatmulRowsFn matmul_kernel_avx512(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      return rows_tiled<KFloat<SPECINFER_WTYPE_F32>>;
    case SPECINFER_WTYPE_F16:
      return rows_tiled<KFloat<SPECINFER_WTYPE_F16>>;
    case SPECINFER_WTYPE_BF16:
      return rows_tiled<KFloat<SPECINFER_WTYPE_BF16>>;
    case SPECINFER_WTYPE_Q8_0:
      return rows_tiled<KQ32Vnni<SPECINFER_WTYPE_Q8_0>>;
    case SPECINFER_WTYPE_Q4_0:
      return rows_tiled<KQ32Vnni<SPECINFER_WTYPE_Q4_0>>;
    case SPECINFER_WTYPE_Q5_0:
      return rows_tiled<KQ32Vnni<SPECINFER_WTYPE_Q5_0>>;
    case SPECINFER_WTYPE_Q6_K:
      return rows_tiled<KQ6KVnni>;
    default:
      return nullptr;  // the AVX2 kernels (Q4_K runs packed: packed_avx512.cpp)
  }
}

}  // namespace specinfer
