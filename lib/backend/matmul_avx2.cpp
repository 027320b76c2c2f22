// AVX2 (+FMA, F16C) row kernels. Each weight row is unpacked block by block and applied to a tile
// of up to kTile tokens while it is in registers / L1, so a call streams the weights once however
// many tokens it scores. Quantized types: unsigned-by-signed byte products (vpmaddubsw) with the
// int8 activations, scaled by the per-group integer scales (vpmaddwd), one float conversion per
// block (32-value formats) or super-block (k-quants).
//
// Everything here is in an anonymous namespace and calls no inline function shared with other
// translation units: an out-of-line copy compiled with AVX2 flags must never be picked by the
// linker for code that runs on a CPU without AVX2.
#include <immintrin.h>

#include <cstring>

#include "backend/matmul.h"
#include "backend/simd_x86.h"

namespace specinfer {

namespace {

constexpr int kTile = 8;  // tokens per pass over a row

// Runs K::run<NT> over the rows, NT = the tokens left (at most kTile) per pass.
template <class K>
void rows_tiled(const MatmulArgs &a, int64_t r0, int64_t r1) {
  // Token tiles outer, rows inner: the task's rows stay in cache while each tile's activations are
  // read once per task rather than once per row (prefill).
  for (int64_t t0 = 0; t0 < a.n_tok;) {
    const int64_t left = a.n_tok - t0;
    const int nt = left >= kTile ? kTile : static_cast<int>(left);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
      float out[kTile];
      switch (nt) {
        case 8:
          K::template run<8>(a, row, t0, out);
          break;
        case 7:
          K::template run<7>(a, row, t0, out);
          break;
        case 6:
          K::template run<6>(a, row, t0, out);
          break;
        case 5:
          K::template run<5>(a, row, t0, out);
          break;
        case 4:
          K::template run<4>(a, row, t0, out);
          break;
        case 3:
          K::template run<3>(a, row, t0, out);
          break;
        case 2:
          K::template run<2>(a, row, t0, out);
          break;
        default:
          K::template run<1>(a, row, t0, out);
          break;
      }
      for (int t = 0; t < nt; ++t) a.y[(t0 + t) * a.n_rows + r] = out[t];
    }
    t0 += nt;
  }
}

// ---- float weights --------------------------------------------------------------------------

template <int32_t W>
struct KFloat {
  static __m256 load8(const uint8_t *row, int64_t c) {
    if constexpr (W == SPECINFER_WTYPE_F32) {
      return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + c);
    } else if constexpr (W == SPECINFER_WTYPE_F16) {
      return _mm256_cvtph_ps(load128(row + 2 * c));
    } else {
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(row + 2 * c)), 16));
    }
  }
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t n = a.n_cols;
    const float *x[NT];
    __m256 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = a.x + (t0 + t) * n;
      acc0[t] = _mm256_setzero_ps();
      acc1[t] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
      const __m256 w0 = load8(row, c), w1 = load8(row, c + 8);
      // The same accumulation order whatever NT: a token's result must not depend on the batch
      // it is computed in (speculative output == plain output; tests/test_batch_invariance.cpp).
      for (int t = 0; t < NT; ++t) {
        acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + c), acc0[t]);
        acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + c + 8), acc1[t]);
      }
    }
    for (; c + 8 <= n; c += 8) {
      const __m256 w0 = load8(row, c);
      for (int t = 0; t < NT; ++t)
        acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + c), acc0[t]);
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc0[t], acc1[t]));
    for (; c < n; ++c) {
      const float w = float_elem<W>(row, c);
      for (int t = 0; t < NT; ++t) out[t] += w * x[t][c];
    }
  }
};

// ---- 32-value blocks ------------------------------------------------------------------------

// Unpacks one block: `q` are the 32 integer values, signed for Q8_0 / Q8_1, unsigned for the
// others (Q4_0 and Q5_0 without their offset, which comes off the integer sum; the _1 formats
// carry a min m).
template <int32_t W>
struct Block32 {
  static constexpr bool kSigned = W == SPECINFER_WTYPE_Q8_0 || W == SPECINFER_WTYPE_Q8_1;
  // Unsigned values whose offset is subtracted from the exact integer sum (offset * sum of x):
  // vpmaddubsw takes them as they are, without the two vpsignb per block and token.
  static constexpr int kOffset = W == SPECINFER_WTYPE_Q5_0 ? 16 : W == SPECINFER_WTYPE_Q4_0 ? 8 : 0;
  static constexpr bool kMin = W == SPECINFER_WTYPE_Q4_1 || W == SPECINFER_WTYPE_Q5_1;
  static void unpack(const uint8_t *blk, __m256i &q, float &d, float &m) {
    if constexpr (W == SPECINFER_WTYPE_Q4_0) {
      // Unsigned 0..15; the -8 offset is applied to the integer sum (kOffset).
      const auto *b = reinterpret_cast<const BlockQ4_0 *>(blk);
      q = nibbles32(b->qs);
      d = h2f(b->d);
      m = 0.0f;
    } else if constexpr (W == SPECINFER_WTYPE_Q4_1) {
      const auto *b = reinterpret_cast<const BlockQ4_1 *>(blk);
      q = nibbles32(b->qs);
      d = h2f(b->d);
      m = h2f(b->m);
    } else if constexpr (W == SPECINFER_WTYPE_Q5_0) {
      // Unsigned 0..31; the -16 offset is applied to the integer sum (kOffset).
      const auto *b = reinterpret_cast<const BlockQ5_0 *>(blk);
      const __m256i hi = _mm256_and_si256(bits_to_bytes(le32(b->qh)), _mm256_set1_epi8(0x10));
      q = _mm256_or_si256(nibbles32(b->qs), hi);
      d = h2f(b->d);
      m = 0.0f;
    } else if constexpr (W == SPECINFER_WTYPE_Q5_1) {
      const auto *b = reinterpret_cast<const BlockQ5_1 *>(blk);
      const __m256i hi = _mm256_and_si256(bits_to_bytes(le32(b->qh)), _mm256_set1_epi8(0x10));
      q = _mm256_or_si256(nibbles32(b->qs), hi);
      d = h2f(b->d);
      m = h2f(b->m);
    } else if constexpr (W == SPECINFER_WTYPE_Q8_0) {
      const auto *b = reinterpret_cast<const BlockQ8_0 *>(blk);
      q = load256(b->qs);
      d = h2f(b->d);
      m = 0.0f;
    } else {
      const auto *b = reinterpret_cast<const BlockQ8_1 *>(blk);
      q = load256(b->qs);
      d = h2f(b->d);
      m = 0.0f;
    }
  }
};

template <int32_t W>
struct KQ32 {
  using B = Block32<W>;
  static constexpr size_t kBB = W == SPECINFER_WTYPE_Q4_0   ? sizeof(BlockQ4_0)
                                : W == SPECINFER_WTYPE_Q4_1 ? sizeof(BlockQ4_1)
                                : W == SPECINFER_WTYPE_Q5_0 ? sizeof(BlockQ5_0)
                                : W == SPECINFER_WTYPE_Q5_1 ? sizeof(BlockQ5_1)
                                : W == SPECINFER_WTYPE_Q8_0 ? sizeof(BlockQ8_0)
                                                            : sizeof(BlockQ8_1);
  // One block into acc[t] for every token.
  template <int NT>
  static inline void block(const uint8_t *blk, const ActQ8 *const *x, int64_t i, __m256 *acc,
                           float *accm) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i q;
    float d, m;
    B::unpack(blk, q, d, m);
    const __m256 dv = _mm256_set1_ps(d);
    if constexpr (B::kSigned) {
      const __m256i aq = _mm256_sign_epi8(q, q);  // |q|, as unsigned bytes
      for (int t = 0; t < NT; ++t) {
        const ActQ8 &xb = x[t][i];
        const __m256i sx = _mm256_sign_epi8(load256(xb.qs), q);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sx), ones);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                 _mm256_mul_ps(dv, _mm256_broadcast_ss(&xb.d)), acc[t]);
      }
    } else if constexpr (B::kOffset != 0) {
      for (int t = 0; t < NT; ++t) {
        const ActQ8 &xb = x[t][i];
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load256(xb.qs)), ones);
        p = _mm256_sub_epi32(p, _mm256_zextsi128_si256(_mm_cvtsi32_si128(B::kOffset * xb.sum)));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                 _mm256_mul_ps(dv, _mm256_broadcast_ss(&xb.d)), acc[t]);
      }
    } else {
      for (int t = 0; t < NT; ++t) {
        const ActQ8 &xb = x[t][i];
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load256(xb.qs)), ones);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                 _mm256_mul_ps(dv, _mm256_broadcast_ss(&xb.d)), acc[t]);
        accm[t] += m * xb.d * static_cast<float>(xb.sum);
      }
    }
  }
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t nb = a.n_cols / kQK;
    const ActQ8 *x[NT];
    // Two accumulator sets (even / odd blocks): the float accumulation chain otherwise limits
    // few-token passes to one block per FMA latency. The same for every NT: a token's result must
    // not depend on its batch (tests/test_batch_invariance.cpp).
    constexpr int kSets = 2;
    __m256 acc[kSets][NT];
    float accm[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = static_cast<const ActQ8 *>(a.xq) + (t0 + t) * a.xq_blocks;
      for (int k = 0; k < kSets; ++k) acc[k][t] = _mm256_setzero_ps();
      accm[t] = 0.0f;
    }
    int64_t i = 0;
    for (; i + kSets <= nb; i += kSets) {
      _mm_prefetch(reinterpret_cast<const char *>(row + static_cast<size_t>(i + 8) * kBB),
                   _MM_HINT_T0);
      for (int k = 0; k < kSets; ++k)
        block<NT>(row + static_cast<size_t>(i + k) * kBB, x, i + k, acc[k], accm);
    }
    for (; i < nb; ++i) block<NT>(row + static_cast<size_t>(i) * kBB, x, i, acc[0], accm);
    for (int t = 0; t < NT; ++t) {
      __m256 s = acc[0][t];
      if constexpr (kSets == 2) s = _mm256_add_ps(s, acc[1][t]);
      out[t] = hsum(s) + accm[t];
    }
  }
};

// ---- k-quants -------------------------------------------------------------------------------

// Q4_K and Q5_K: 8 groups of 32 with 6-bit scale and min.
template <bool kFive>
struct KQ45K {
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t nb = a.n_cols / kQKK;
    constexpr size_t bb = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    const ActQ8K *x[NT];
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = static_cast<const ActQ8K *>(a.xq) + (t0 + t) * a.xq_blocks;
      acc[t] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *blk = row + static_cast<size_t>(i) * bb;
      uint16_t dh, dmh;
      std::memcpy(&dh, blk, 2);
      std::memcpy(&dmh, blk + 2, 2);
      const uint8_t *scales = blk + 4;
      const uint8_t *qh = kFive ? blk + 16 : nullptr;
      const uint8_t *qs = kFive ? blk + 48 : blk + 16;
      const float d = h2f(dh), dmin = h2f(dmh);
      // The eight 6-bit scales and mins, four bytes at a time.
      uint32_t a0, a1, a2;
      std::memcpy(&a0, scales, 4);
      std::memcpy(&a1, scales + 4, 4);
      std::memcpy(&a2, scales + 8, 4);
      const uint32_t sc_lo = a0 & 0x3F3F3F3Fu, mn_lo = a1 & 0x3F3F3F3Fu;
      const uint32_t sc_hi = (a2 & 0x0F0F0F0Fu) | (((a0 >> 6) & 0x03030303u) << 4);
      const uint32_t mn_hi = ((a2 >> 4) & 0x0F0F0F0Fu) | (((a1 >> 6) & 0x03030303u) << 4);
      const __m128i sc16 =
          _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo)));
      const __m128i mins =
          _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(mn_hi), static_cast<int>(mn_lo)));
      alignas(16) int16_t sc[8];
      _mm_store_si128(reinterpret_cast<__m128i *>(sc), sc16);
      __m256i ia[NT];
      for (int t = 0; t < NT; ++t) ia[t] = _mm256_setzero_si256();
      __m256i hb = kFive ? load256(qh) : _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int p = 0; p < 4; ++p) {
        const __m256i raw = load256(qs + 32 * p);
        __m256i lo = _mm256_and_si256(raw, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if constexpr (kFive) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(1)), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(2)), 3));
          hb = _mm256_srli_epi16(hb, 2);
        }
        const __m256i slo = _mm256_set1_epi16(sc[2 * p]);
        const __m256i shi = _mm256_set1_epi16(sc[2 * p + 1]);
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t][i].qs + 64 * p;
          const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(xq)), slo);
          const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(xq + 32)), shi);
          ia[t] = _mm256_add_epi32(ia[t], _mm256_add_epi32(plo, phi));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const ActQ8K &xb = x[t][i];
        const __m128i bs = _mm_hadd_epi16(load128(xb.bsums), load128(xb.bsums + 8));
        const __m128i mp = _mm_madd_epi16(mins, bs);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(d * xb.d), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(mp)),
                                  _mm256_set1_ps(dmin * xb.d), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
  }
};

// Q4_K with the activations in "paired" order (see matmul.h, act_pair_quarters): in each 64-value
// chunk the 16-byte quarters 1 and 2 are swapped, so that one register holds values 0..15 of both
// sub-blocks 2p (low lane) and 2p+1 (high lane) and the next one values 16..31 of both. The two
// registers' byte products then have the same scale per lane, so they are summed in int16 (at most
// 2 * 2 * 15 * 127 = 7620 per lane) before the single vpmaddwd by the scales: three
// multiply-port instructions per 64 weights per token instead of four.
struct KQ4KPaired {
  template <int NT>
  static void run(const MatmulArgs &a, const uint8_t *row, int64_t t0, float *out) {
    const int64_t nb = a.n_cols / kQKK;
    const ActQ8K *x[NT];
    const float *xs[NT];  // per block: d, then the 8 sub-block sums scaled by d (a.xaux)
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) {
      x[t] = static_cast<const ActQ8K *>(a.xq) + (t0 + t) * a.xq_blocks;
      xs[t] = a.xaux + (t0 + t) * a.xq_blocks * 8;
      acc[t] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    // vpshufb controls: int16 scale 2p in the low lane, 2p+1 in the high lane (local constants:
    // no AVX code may run at static initialization).
    const __m256i kSel[4] = {
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                         3, 2, 3, 2, 3, 2, 3),
        _mm256_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6,
                         7, 6, 7, 6, 7, 6, 7),
        _mm256_setr_epi8(8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10,
                         11, 10, 11, 10, 11, 10, 11, 10, 11),
        _mm256_setr_epi8(12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14,
                         15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15)};
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ4_K);
      uint16_t dh, dmh;
      std::memcpy(&dh, blk, 2);
      std::memcpy(&dmh, blk + 2, 2);
      const uint8_t *qs = blk + 16;
      uint32_t a0, a1, a2;
      std::memcpy(&a0, blk + 4, 4);
      std::memcpy(&a1, blk + 8, 4);
      std::memcpy(&a2, blk + 12, 4);
      const uint32_t sc_lo = a0 & 0x3F3F3F3Fu, mn_lo = a1 & 0x3F3F3F3Fu;
      const uint32_t sc_hi = (a2 & 0x0F0F0F0Fu) | (((a0 >> 6) & 0x03030303u) << 4);
      const uint32_t mn_hi = ((a2 >> 4) & 0x0F0F0F0Fu) | (((a1 >> 6) & 0x03030303u) << 4);
      const __m256i scb = _mm256_broadcastsi128_si256(
          _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo))));
      __m256i ia[NT];
      {
        const __m256i raw = load256(qs);
        const __m256i lo = _mm256_and_si256(raw, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        const __m256i w1 = _mm256_permute2x128_si256(lo, hi, 0x20);  // values 0..15 of 0 | 1
        const __m256i w2 = _mm256_permute2x128_si256(lo, hi, 0x31);  // values 16..31
        const __m256i s = _mm256_shuffle_epi8(scb, kSel[0]);
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t][i].qs;
          ia[t] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w1, load256(xq)),
                                                     _mm256_maddubs_epi16(w2, load256(xq + 32))),
                                    s);
        }
      }
#pragma GCC unroll 1
      for (int p = 1; p < 4; ++p) {
        const __m256i raw = load256(qs + 32 * p);
        const __m256i lo = _mm256_and_si256(raw, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        const __m256i w1 = _mm256_permute2x128_si256(lo, hi, 0x20);
        const __m256i w2 = _mm256_permute2x128_si256(lo, hi, 0x31);
        const __m256i s = _mm256_shuffle_epi8(scb, kSel[p]);
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t][i].qs + 64 * p;
          const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w1, load256(xq)),
                                               _mm256_maddubs_epi16(w2, load256(xq + 32)));
          ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, s));
        }
      }
      // acc += d * xd * ia - dmin * sum_j m_j * (xd * bsum_j).
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
      const __m256 mv =
          _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dmh)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(
                            0, 0, static_cast<int>(mn_hi), static_cast<int>(mn_lo)))));
      for (int t = 0; t < NT; ++t) {
        const __m256 dx = _mm256_mul_ps(dv, _mm256_broadcast_ss(&x[t][i].d));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), dx, acc[t]);
        acc[t] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(xs[t] + 8 * i), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
  }
};

// Q6_K: 16 groups of 16 with signed 8-bit scales, values q - 32 with q in 0..63.
//
// A token's sum starts at the -32 offset, -32 * sum_g sc[g] * bsums[g]: one vpmaddwd of its
// bsums with these scales times -32 (|-32 sc| <= 4096 fits in int16, the pair sums in int32).
inline __m256i q6k_scales_neg32(const void *scales) {
  const __m256i sc32 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(load128(scales)), 5);
  return _mm256_sub_epi16(_mm256_setzero_si256(), sc32);
}

struct KQ6K {
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
    // Byte shuffles broadcasting int16 element 2k to the low lane and 2k+1 to the high lane
    // (local, not global: no AVX code may run at static initialization).
    const __m256i kQ6Shuf[4] = {
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
      const __m256i scn = q6k_scales_neg32(b->scales);
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
          const __m256i s = _mm256_shuffle_epi8(sch, kQ6Shuf[k]);
          for (int t = 0; t < NT; ++t) {
            const int8_t *xq = x[t][i].qs + 128 * h + 32 * k;
            ia[t] = _mm256_add_epi32(ia[t],
                                     _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], load256(xq)), s));
          }
        }
      }
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(d * x[t][i].d), acc[t]);
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
  }
};

// Q6_K with the activations in "lane-paired" order (act_pair_lanes16): for the registers q0, q1
// of 32 values each (groups g, g+1 | g+2, g+3 in the low | high lanes), w1 takes the even int16
// lanes of q0 and the odd ones of q1, w2 the rest, swapped into the same lane classes. Per lane the
// two registers' byte products then share one scale and are summed in int16 (at most
// 2 * 2 * 63 * 127 = 32004 per lane) before the single vpmaddwd by the scales.
struct KQ6KPaired {
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
    const __m256i swap16 = _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2,
                                            3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    // Scales of groups (0, 2 | 1, 3) and (4, 6 | 5, 7) of an 8-group half, from its 8 int16s.
    const __m256i selA = _mm256_setr_epi8(0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6,
                                          7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7);
    const __m256i selB =
        _mm256_setr_epi8(8, 9, 12, 13, 8, 9, 12, 13, 8, 9, 12, 13, 8, 9, 12, 13, 10, 11, 14, 15, 10,
                         11, 14, 15, 10, 11, 14, 15, 10, 11, 14, 15);
    for (int64_t i = 0; i < nb; ++i) {
      const auto *b =
          reinterpret_cast<const BlockQ6_K *>(row + static_cast<size_t>(i) * sizeof(BlockQ6_K));
      uint16_t dh;
      std::memcpy(&dh, &b->d, 2);
      const __m256i scn = q6k_scales_neg32(b->scales);
      __m256i ia[NT];
      for (int t = 0; t < NT; ++t) ia[t] = _mm256_madd_epi16(scn, load256(x[t][i].bsums));
#pragma GCC unroll 1
      for (int h = 0; h < 2; ++h) {
        const __m256i sch = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(
            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b->scales + 8 * h))));
        const __m256i raw0 = load256(b->ql + 64 * h);
        const __m256i raw1 = load256(b->ql + 64 * h + 32);
        const __m256i hb = load256(b->qh + 32 * h);
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(raw0, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(raw1, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4),
                                           _mm256_and_si256(hb, m30));
        const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        const __m256i wa1 = _mm256_blend_epi16(q0, q1, 0xAA);
        const __m256i wa2 = _mm256_shuffle_epi8(_mm256_blend_epi16(q1, q0, 0xAA), swap16);
        const __m256i wb1 = _mm256_blend_epi16(q2, q3, 0xAA);
        const __m256i wb2 = _mm256_shuffle_epi8(_mm256_blend_epi16(q3, q2, 0xAA), swap16);
        const __m256i sa = _mm256_shuffle_epi8(sch, selA);
        const __m256i sb = _mm256_shuffle_epi8(sch, selB);
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t][i].qs + 128 * h;
          const __m256i pa = _mm256_add_epi16(_mm256_maddubs_epi16(wa1, load256(xq)),
                                              _mm256_maddubs_epi16(wa2, load256(xq + 32)));
          const __m256i pb = _mm256_add_epi16(_mm256_maddubs_epi16(wb1, load256(xq + 64)),
                                              _mm256_maddubs_epi16(wb2, load256(xq + 96)));
          ia[t] = _mm256_add_epi32(
              ia[t], _mm256_add_epi32(_mm256_madd_epi16(pa, sa), _mm256_madd_epi16(pb, sb)));
        }
      }
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]),
                                 _mm256_mul_ps(dv, _mm256_broadcast_ss(&x[t][i].d)), acc[t]);
    }
    for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
  }
};

// Q6_K: one token takes the plain kernel (no register pairing to pay for), more take the paired
// one. Both compute the same exact int32 sums and the same float steps after them, so a token's
// result is bit-identical either way (batch invariance).
void rows_q6k(const MatmulArgs &a, int64_t r0, int64_t r1) {
  if (a.n_tok == 1)
    rows_tiled<KQ6K>(a, r0, r1);
  else
    rows_tiled<KQ6KPaired>(a, r0, r1);
}

}  // namespace

MatmulRowsFn matmul_kernel_avx2(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      return rows_tiled<KFloat<SPECINFER_WTYPE_F32>>;
    case SPECINFER_WTYPE_F16:
      return rows_tiled<KFloat<SPECINFER_WTYPE_F16>>;
    case SPECINFER_WTYPE_BF16:
      return rows_tiled<KFloat<SPECINFER_WTYPE_BF16>>;
    case SPECINFER_WTYPE_Q4_0:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q4_0>>;
    case SPECINFER_WTYPE_Q4_1:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q4_1>>;
    case SPECINFER_WTYPE_Q5_0:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q5_0>>;
    case SPECINFER_WTYPE_Q5_1:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q5_1>>;
    case SPECINFER_WTYPE_Q8_0:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q8_0>>;
    case SPECINFER_WTYPE_Q8_1:
      return rows_tiled<KQ32<SPECINFER_WTYPE_Q8_1>>;
    case SPECINFER_WTYPE_Q4_K:
      return rows_tiled<KQ4KPaired>;
    case SPECINFER_WTYPE_Q5_K:
      return rows_tiled<KQ45K<true>>;
    case SPECINFER_WTYPE_Q6_K:
      return rows_q6k;
    default:
      return nullptr;  // Q2_K, Q3_K, Q8_K: the scalar kernels
  }
}

ActPrep matmul_avx2_act_prep(int32_t wtype, int64_t n_tok) noexcept {
  if (wtype == SPECINFER_WTYPE_Q4_K) return ActPrep::quarters_subsums;
  if (wtype == SPECINFER_WTYPE_Q6_K && n_tok > 1) return ActPrep::lanes16;
  return ActPrep::none;
}

}  // namespace specinfer
