// AVX2 kernels for packed weights (packed.h). Bit-identical to the scalar ones in packed.cpp.
//
// As in matmul_avx2.cpp: everything in an anonymous namespace or a plain function, no inline
// function shared with other translation units.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backend/packed.h"
#include "backend/simd_x86.h"

namespace specinfer {

namespace {

// Tokens per pass over a row. 8 beats 5 at 8 and 16 tokens (one pass instead of two) and ties at
// 5 even though NT = 8 spills a few sums.
constexpr int kTile = 8;

// The n_blocks super-blocks of one row for NT tokens (x[t * n_blocks + i]) into acc. Per
// super-block the nibbles are unpacked one 32-byte chunk (two registers) at a time and applied to
// every token before the next chunk: the live registers are NT int16 sums, NT float accumulators
// and the chunk (no spills up to NT = 5).
template <int NT>
__attribute__((always_inline)) inline void q4k_x8_blocks(const uint8_t *row, const ActQ8KP *x,
                                                         int64_t n_blocks, __m256 *acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ4_K);
    const uint8_t *qs = blk + 16;
    __m256i s[NT];
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = load256(qs + 32 * c);
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      // An empty asm that "reads" the sums so far: the compiler cannot hoist the next chunk's
      // products above them, which it otherwise does and then spills them all to the stack
      // (with GCC 12 that costs about a sixth more cycles per block and token).
      if (c > 0)
        for (int t = 0; t < NT; ++t) __asm__("" : "+x"(lo), "+x"(hi) : "x"(s[t]));
      for (int t = 0; t < NT; ++t) {
        const int8_t *xq = x[t * n_blocks + i].qs + 64 * c;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)),
                                           _mm256_maddubs_epi16(hi, load256(xq + 32)));
        s[t] = c == 0 ? p : _mm256_add_epi16(s[t], p);
      }
    }
    uint16_t dh, dmh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&dmh, blk + 2, 2);
    // Scales and mins (x8_scale_min): bytes 0..7 give the scales (low 6 bits) and the mins' low
    // 2 bits; bytes 8..11 the mins' high 4 bits, two per byte.
    const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(blk + 4));
    uint32_t eh;
    std::memcpy(&eh, blk + 12, 4);
    const __m128i m3f = _mm_set1_epi8(0x3F), m0f = _mm_set1_epi8(0x0F), m03 = _mm_set1_epi8(0x03);
    const __m128i scb = _mm_and_si128(e, m3f);
    const __m256i scv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(scb, scb));  // s0 s0 s1 s1 ... s7 s7
    const __m128i w = _mm_cvtsi32_si128(static_cast<int>(eh));
    const __m128i mhi =
        _mm_unpacklo_epi8(_mm_and_si128(w, m0f), _mm_and_si128(_mm_srli_epi16(w, 4), m0f));
    const __m128i mn =
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(e, 6), m03), _mm_slli_epi16(mhi, 2));
    const __m256 mv =
        _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dmh)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
    for (int t = 0; t < NT; ++t) {
      const ActQ8KP &xb = x[t * n_blocks + i];
      const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[t], scv));
      const __m256 dx = _mm256_mul_ps(dv, _mm256_broadcast_ss(&xb.d));
      acc[t] = _mm256_fmadd_ps(f, dx, _mm256_fnmadd_ps(mv, _mm256_load_ps(xb.xs), acc[t]));
    }
  }
}

// Rows [r0, r1) for NT tokens from t0, each row in one pass. For 8960-column rows a tile of
// activations (5 tokens: 35 x 5 x 320 bytes = 56 KB) does not fit L1 and comes from L2. Doing
// such rows in column chunks instead (rows in groups, accumulators parked between chunks) would
// keep the activations in L1 but breaks the weights' sequential stream, which costs more than the
// L2 reads when the weights come from memory (bench_kernels BM_MatmulStream;
// docs/benchmarks/what-does-not-pay.md); in cache whole rows are as fast or faster too.
template <int NT>
__attribute__((noinline)) void q4k_x8_tile(const PackedArgs &a, int64_t r0, int64_t r1,
                                           int64_t t0) {
  const ActQ8KP *x = a.x + t0 * a.n_blocks;
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    q4k_x8_blocks<NT>(a.w + static_cast<size_t>(r) * a.row_bytes, x, a.n_blocks, acc);
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q40_x4: rows [r0, r1) for NT tokens from t0. Per super-block the two 32-byte chunks unpack into
// four nibble registers, which every token then uses: four vpmaddubsw added in int16, one
// vpmaddwd, the offset, one float multiply-add.
template <int NT>
void q40_x4_tile(const PackedArgsX4 &a, int64_t r0, int64_t r1, int64_t t0) {
  constexpr size_t kSuper = 4 * sizeof(BlockQ4_0);
  const ActQ8X4 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *sb = row + static_cast<size_t>(i) * kSuper;
      const __m128i dh = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sb));
      const __m256 dv = _mm256_cvtph_ps(_mm_unpacklo_epi16(dh, dh));  // d0 d0 d1 d1 ... d3 d3
      const __m256i raw0 = load256(sb + 8), raw1 = load256(sb + 40);
      const __m256i n0 = _mm256_and_si256(raw0, m4),
                    n1 = _mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4);
      const __m256i n2 = _mm256_and_si256(raw1, m4),
                    n3 = _mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4);
      for (int t = 0; t < NT; ++t) {
        const ActQ8X4 &xb = x[t * nb + i];
        const __m256i s =
            _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(n0, load256(xb.qs)),
                                              _mm256_maddubs_epi16(n1, load256(xb.qs + 32))),
                             _mm256_add_epi16(_mm256_maddubs_epi16(n2, load256(xb.qs + 64)),
                                              _mm256_maddubs_epi16(n3, load256(xb.qs + 96))));
        const __m256i p =
            _mm256_sub_epi32(_mm256_madd_epi16(s, ones),
                             _mm256_load_si256(reinterpret_cast<const __m256i *>(xb.osum)));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_load_ps(xb.xd)),
                                 acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q6k_x16: the n_blocks super-blocks of one row for NT tokens into acc. Per super-block: the
// sixteen scales as int16 (one conversion), the -32 offset from the group sums (one vpmaddwd per
// token), then per 32-byte chunk two registers of 6-bit values, each applied to every token: two
// vpmaddubsw added in int16, one vpmaddwd by the scales, added in int32. Int32 lane l sums groups
// 2l and 2l + 1; one float multiply-add per super-block and token.
template <int NT>
__attribute__((always_inline)) inline void q6k_x16_blocks(const uint8_t *row, const ActQ8K16 *x,
                                                          int64_t n_blocks, __m256 *acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ6_K);
    const __m256i sc =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 192)));
    const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
    __m256i ia[NT];
    for (int t = 0; t < NT; ++t)
      ia[t] = _mm256_madd_epi16(
          scn, _mm256_load_si256(reinterpret_cast<const __m256i *>(x[t * n_blocks + i].bsums)));
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = load256(blk + 32 * c), hb = load256(blk + 128 + 32 * (c / 2));
      // Registers 2c and 2c + 1 (k % 4 = 2(c % 2) and that + 1): their high bits are bit pairs
      // k % 4 of the bytes of qh chunk c / 2, moved to bits 4..5.
      const __m256i h0 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 4) : hb;
      const __m256i h1 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
      __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(h0, m30));
      __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                   _mm256_and_si256(h1, m30));
      // As in q4k_x8_blocks: keep the compiler from hoisting the next chunk above these sums.
      if (c > 0)
        for (int t = 0; t < NT; ++t) __asm__("" : "+x"(lo), "+x"(hi) : "x"(ia[t]));
      for (int t = 0; t < NT; ++t) {
        const int8_t *xq = x[t * n_blocks + i].qs + 64 * c;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)),
                                           _mm256_maddubs_epi16(hi, load256(xq + 32)));
        ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(p, sc));
      }
    }
    uint16_t dh;
    std::memcpy(&dh, blk + 208, 2);
    const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
    for (int t = 0; t < NT; ++t)
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]),
                          _mm256_mul_ps(dv, _mm256_broadcast_ss(&x[t * n_blocks + i].d)), acc[t]);
  }
}

template <int NT>
__attribute__((noinline)) void q6k_x16_tile(const PackedArgsQ6 &a, int64_t r0, int64_t r1,
                                            int64_t t0) {
  const ActQ8K16 *x = a.x + t0 * a.n_blocks;
  for (int64_t r = r0; r < r1; ++r) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    q6k_x16_blocks<NT>(a.w + static_cast<size_t>(r) * a.row_bytes, x, a.n_blocks, acc);
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q32_r16 (W = Q4_0, Q5_0 or Q3_0): rows 16g + 8h .. + 7 (half h of the tiles' 64-byte lines)
// for NT tokens from t0. Per block: eight registers of values (nibbles split, Q5_0's fifth bits
// shifted into place from the bit plane; Q3_0's bit pairs split and its third bits shifted in), the
// eight rows' d; per token the vpmaddubsw products of registers 0-3 and of 4-7 added in int16, one
// vpmaddwd each to int32, the offset's start, then sum * (d * xd) added, as in q32_r16_rows_scalar
// (same bits).
template <int32_t W, int NT>
void q32_r16_half(const PackedArgsQ32 &a, int64_t g, int h, int64_t t0) {
  constexpr size_t kTile = q32_r16_tile_bytes(W), kD = q32_r16_d_offset(W);
  constexpr int kOff = q32_r16_offset(W);
  const ActQ8 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16),
                ones = _mm256_set1_epi16(1);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *whole = a.w + static_cast<size_t>(g * nb + i) * kTile, *tile = whole + 32 * h;
    const __m256 dv =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(whole + kD + 16 * h)));
    __m256i v[8];
    if constexpr (W == SPECINFER_WTYPE_Q3_0) {  // bit pairs, the third bits shifted into bit 2
      const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
      const __m256i plane = load256(tile + 128);
      for (int hq = 0; hq < 2; ++hq) {
        const __m256i raw = load256(tile + 64 * hq);
        for (int k = 0; k < 4; ++k) {
          const int c = 4 * hq + k;
          const __m256i third = c < 2    ? _mm256_slli_epi16(plane, 2 - c)
                                : c == 2 ? plane
                                         : _mm256_srli_epi16(plane, c - 2);
          v[c] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 2 * k), m3),
                                 _mm256_and_si256(third, four));
        }
      }
    } else {
      for (int q = 0; q < 4; ++q) {
        const __m256i raw = load256(tile + 64 * q);
        v[2 * q] = _mm256_and_si256(raw, m4);
        v[2 * q + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      }
    }
    if constexpr (W == SPECINFER_WTYPE_Q5_0) {
      const __m256i plane = load256(tile + 256);
      v[0] = _mm256_or_si256(v[0], _mm256_and_si256(_mm256_slli_epi16(plane, 4), sixteen));
      v[1] = _mm256_or_si256(v[1], _mm256_and_si256(_mm256_slli_epi16(plane, 3), sixteen));
      v[2] = _mm256_or_si256(v[2], _mm256_and_si256(_mm256_slli_epi16(plane, 2), sixteen));
      v[3] = _mm256_or_si256(v[3], _mm256_and_si256(_mm256_slli_epi16(plane, 1), sixteen));
      v[4] = _mm256_or_si256(v[4], _mm256_and_si256(plane, sixteen));
      v[5] = _mm256_or_si256(v[5], _mm256_and_si256(_mm256_srli_epi16(plane, 1), sixteen));
      v[6] = _mm256_or_si256(v[6], _mm256_and_si256(_mm256_srli_epi16(plane, 2), sixteen));
      v[7] = _mm256_or_si256(v[7], _mm256_and_si256(_mm256_srli_epi16(plane, 3), sixteen));
    }
    for (int t = 0; t < NT; ++t) {
      const ActQ8 &xb = x[t * nb + i];
      __m256i p[2];
      for (int k = 0; k < 2; ++k) {
        __m256i s16 = _mm256_setzero_si256();
        for (int c = 4 * k; c < 4 * k + 4; ++c) {
          int32_t xc;
          std::memcpy(&xc, xb.qs + 4 * c, 4);
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v[c], _mm256_set1_epi32(xc)));
        }
        p[k] = _mm256_madd_epi16(s16, ones);
      }
      const __m256i sum =
          _mm256_add_epi32(_mm256_set1_epi32(-kOff * xb.sum), _mm256_add_epi32(p[0], p[1]));
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dv, _mm256_set1_ps(xb.d)), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t)
    _mm256_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * g + 8 * h, acc[t]);
}

// Calls tile(std::integral_constant<int, nt>, t0) over the tokens in even tiles of at most
// kMax (7 tokens with kMax 8: 4 + 3, not 6 + 1; every pass re-unpacks the rows). Token tiles
// outer, rows inner: the task's rows (a few KiB) stay in cache while each tile's activations are
// read once per task instead of once per row (prefill of hundreds of tokens).
template <int kMax, class Tile>
void token_tiles(int64_t n_tok, Tile &&tile) {
  static_assert(kMax >= 1 && kMax <= 8, "tiles of 1..8 tokens");
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t left = n_tok - t0, passes = (left + kMax - 1) / kMax;
    const int nt = static_cast<int>((left + passes - 1) / passes);
    switch (nt) {
      case 8:
        if constexpr (kMax >= 8) tile(std::integral_constant<int, 8>{}, t0);
        break;
      case 7:
        if constexpr (kMax >= 7) tile(std::integral_constant<int, 7>{}, t0);
        break;
      case 6:
        if constexpr (kMax >= 6) tile(std::integral_constant<int, 6>{}, t0);
        break;
      case 5:
        if constexpr (kMax >= 5) tile(std::integral_constant<int, 5>{}, t0);
        break;
      case 4:
        if constexpr (kMax >= 4) tile(std::integral_constant<int, 4>{}, t0);
        break;
      case 3:
        if constexpr (kMax >= 3) tile(std::integral_constant<int, 3>{}, t0);
        break;
      case 2:
        if constexpr (kMax >= 2) tile(std::integral_constant<int, 2>{}, t0);
        break;
      default:
        tile(std::integral_constant<int, 1>{}, t0);
        break;
    }
    t0 += nt;
  }
}

}  // namespace

void q6k_x16_rows_avx2(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept {
  // At most 6 tokens a pass: a tile of 8 spills, and two tiles of 4 run faster than one of 8
  // (bench_kernels BM_MatmulPacked, Q6_K in L2).
  token_tiles<6>(a.n_tok,
                 [&](auto nt, int64_t t0) { q6k_x16_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

void q40_x4_rows_avx2(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept {
  // 4 nibble registers, the scales, 6 sums and temporaries: no spills up to 6.
  token_tiles<6>(a.n_tok,
                 [&](auto nt, int64_t t0) { q40_x4_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

void q4k_x8_rows_avx2(const PackedArgs &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<kTile>(a.n_tok,
                     [&](auto nt, int64_t t0) { q4k_x8_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

void q32_r16_rows_avx2(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept {
  if (a.wtype == SPECINFER_WTYPE_Q8_0) {
    q32_r16_rows_scalar(a, r0, r1);
    return;
  }
  // 8 value registers, the sums and temporaries: tiles of at most 4 tokens.
  token_tiles<4>(a.n_tok, [&](auto nt, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    for (int64_t g = r0 / 16; g < r1 / 16; ++g)
      for (int h = 0; h < 2; ++h) {
        if (a.wtype == SPECINFER_WTYPE_Q5_0)
          q32_r16_half<SPECINFER_WTYPE_Q5_0, NT>(a, g, h, t0);
        else if (a.wtype == SPECINFER_WTYPE_Q3_0)
          q32_r16_half<SPECINFER_WTYPE_Q3_0, NT>(a, g, h, t0);
        else
          q32_r16_half<SPECINFER_WTYPE_Q4_0, NT>(a, g, h, t0);
      }
  });
}

void act_to_q8kp_avx2(const ActQ8K *a, ActQ8KP *out, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b) {
    // An 8 x 8 transpose of 32-bit words: row s = group s's values (8 words of 4), column k.
    __m256i r[8];
    for (int s = 0; s < 8; ++s) r[s] = load256(a[b].qs + 32 * s);
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    auto *o = reinterpret_cast<__m256i *>(out[b].qs);
    _mm256_store_si256(o + 0, _mm256_permute2x128_si256(u0, u4, 0x20));
    _mm256_store_si256(o + 1, _mm256_permute2x128_si256(u1, u5, 0x20));
    _mm256_store_si256(o + 2, _mm256_permute2x128_si256(u2, u6, 0x20));
    _mm256_store_si256(o + 3, _mm256_permute2x128_si256(u3, u7, 0x20));
    _mm256_store_si256(o + 4, _mm256_permute2x128_si256(u0, u4, 0x31));
    _mm256_store_si256(o + 5, _mm256_permute2x128_si256(u1, u5, 0x31));
    _mm256_store_si256(o + 6, _mm256_permute2x128_si256(u2, u6, 0x31));
    _mm256_store_si256(o + 7, _mm256_permute2x128_si256(u3, u7, 0x31));
    for (int s = 0; s < 8; ++s)
      out[b].xs[s] = a[b].d * static_cast<float>(a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
    out[b].d = a[b].d;
  }
}

}  // namespace specinfer
