// AVX-512 (VL + VNNI) kernels for packed weights (packed.h), on 256-bit registers. vpdpbusd adds
// the four byte products of each 32-bit lane straight into an int32 accumulator, where the AVX2
// kernels need vpmaddubsw, int16 adds and a vpmaddwd: in the q4k_x8 and q40_x4 layouts a 32-bit
// lane holds four values of one group, so the int32 sums are exactly the AVX2 kernels' (which never
// overflow their int16 stage), and the float steps after them compute the same values in the same
// order (the scale multiply is exact either way). In q6k_x16 a 32-bit lane spans two groups with
// different scales: there vpdpwssd fuses the AVX2 kernel's vpmaddwd by the scales and its vpaddd.
// The results are therefore bit-identical to the scalar and AVX2 kernels, for any number of tokens.
//
// The development machine has no AVX-512: tests run these kernels natively on a CPU that has the
// extensions, and everywhere else compiled over software intrinsics (SIMDe, tests/support/
// avx512_emulation.h, under the names *_avx512_emulated) against the scalar kernels, bit for bit.
//
// As in matmul_avx2.cpp: everything in an anonymous namespace or a plain function, no inline
// function shared with other translation units.
#if defined(SPECINFER_AVX512_EMULATED)
#include "support/avx512_emulation.h"
#define q4k_x8_rows_avx512 q4k_x8_rows_avx512_emulated
#define q40_x4_rows_avx512 q40_x4_rows_avx512_emulated
#define q6k_x16_rows_avx512 q6k_x16_rows_avx512_emulated
#else
#include <immintrin.h>
#endif

#include <cstring>
#include <type_traits>

#include "backend/packed.h"

namespace specinfer {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

// q4k_x8: rows [r0, r1) for NT tokens from t0. Per super-block and token: eight vpdpbusd give the
// eight groups' exact sums (lane s = group s), one float multiply by the group scales (exact:
// |sum| <= 32 * 15 * 127 and scale <= 63 stay below 2^24), then the AVX2 kernel's two FMAs.
template <int NT>
void q4k_x8_tile(const PackedArgs &a, int64_t r0, int64_t r1, int64_t t0) {
  const ActQ8KP *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m128i m3f = _mm_set1_epi8(0x3F), m0f = _mm_set1_epi8(0x0F), m03 = _mm_set1_epi8(0x03);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ4_K);
      const uint8_t *qs = blk + 16;
      __m256i s[NT];
      for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = load256(qs + 32 * c);
        const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t * nb + i].qs + 64 * c;
          s[t] = _mm256_dpbusd_epi32(s[t], lo, load256(xq));
          s[t] = _mm256_dpbusd_epi32(s[t], hi, load256(xq + 32));
        }
      }
      uint16_t dh, dmh;
      std::memcpy(&dh, blk, 2);
      std::memcpy(&dmh, blk + 2, 2);
      // Scales and mins (x8_scale_min), decoded as in the AVX2 kernel.
      const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(blk + 4));
      uint32_t eh;
      std::memcpy(&eh, blk + 12, 4);
      const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(e, m3f)));
      const __m128i w = _mm_cvtsi32_si128(static_cast<int>(eh));
      const __m128i mhi = _mm_unpacklo_epi8(_mm_and_si128(w, m0f), _mm_and_si128(_mm_srli_epi16(w, 4), m0f));
      const __m128i mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(e, 6), m03), _mm_slli_epi16(mhi, 2));
      const __m256 mv = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dmh)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
      for (int t = 0; t < NT; ++t) {
        const ActQ8KP &xb = x[t * nb + i];
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s[t]), scf);
        const __m256 dx = _mm256_mul_ps(dv, _mm256_broadcast_ss(&xb.d));
        acc[t] = _mm256_fmadd_ps(f, dx, _mm256_fnmadd_ps(mv, _mm256_load_ps(xb.xs), acc[t]));
      }
    }
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q40_x4: rows [r0, r1) for NT tokens from t0. Per super-block and token four vpdpbusd give two
// int32 sums per group (lanes 2g, 2g + 1), then the offset and one float multiply-add, as in AVX2.
template <int NT>
void q40_x4_tile(const PackedArgsX4 &a, int64_t r0, int64_t r1, int64_t t0) {
  constexpr size_t kSuper = 4 * sizeof(BlockQ4_0);
  const ActQ8X4 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *sb = row + static_cast<size_t>(i) * kSuper;
      const __m128i dh = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sb));
      const __m256 dv = _mm256_cvtph_ps(_mm_unpacklo_epi16(dh, dh));  // d0 d0 d1 d1 ... d3 d3
      const __m256i raw0 = load256(sb + 8), raw1 = load256(sb + 40);
      const __m256i n0 = _mm256_and_si256(raw0, m4), n1 = _mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4);
      const __m256i n2 = _mm256_and_si256(raw1, m4), n3 = _mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4);
      for (int t = 0; t < NT; ++t) {
        const ActQ8X4 &xb = x[t * nb + i];
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), n0, load256(xb.qs));
        s = _mm256_dpbusd_epi32(s, n1, load256(xb.qs + 32));
        s = _mm256_dpbusd_epi32(s, n2, load256(xb.qs + 64));
        s = _mm256_dpbusd_epi32(s, n3, load256(xb.qs + 96));
        const __m256i p = _mm256_sub_epi32(s, _mm256_load_si256(reinterpret_cast<const __m256i *>(xb.osum)));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_load_ps(xb.xd)), acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q6k_x16: rows [r0, r1) for NT tokens from t0. Per 32-byte chunk and token two vpmaddubsw added
// in int16 (each int16 lane one group, as in AVX2), then vpdpwssd applies the sixteen scales and
// adds into the int32 sums in one instruction where AVX2 needs vpmaddwd + vpaddd. Same int32 sums,
// same float step.
template <int NT>
void q6k_x16_tile(const PackedArgsQ6 &a, int64_t r0, int64_t r1, int64_t t0) {
  const ActQ8K16 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t *blk = row + static_cast<size_t>(i) * sizeof(BlockQ6_K);
      const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 192)));
      const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
      __m256i ia[NT];
      for (int t = 0; t < NT; ++t)
        ia[t] = _mm256_madd_epi16(scn, _mm256_load_si256(reinterpret_cast<const __m256i *>(x[t * nb + i].bsums)));
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = load256(blk + 32 * c), hb = load256(blk + 128 + 32 * (c / 2));
        // High bits as in the AVX2 kernel.
        const __m256i h0 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 4) : hb;
        const __m256i h1 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(h0, m30));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), _mm256_and_si256(h1, m30));
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t * nb + i].qs + 64 * c;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)), _mm256_maddubs_epi16(hi, load256(xq + 32)));
          ia[t] = _mm256_dpwssd_epi32(ia[t], p, sc);
        }
      }
      uint16_t dh;
      std::memcpy(&dh, blk + 208, 2);
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(dv, _mm256_broadcast_ss(&x[t * nb + i].d)), acc[t]);
    }
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// Calls tile(std::integral_constant<int, nt>, t0) over the tokens in even tiles of at most 8
// (7 tokens: 4 + 3, not 6 + 1; every pass re-reads the rows). Token tiles outer, rows inner, as
// in the AVX2 kernels; 32 vector registers leave room for eight tokens' sums and accumulators.
template <class Tile>
void token_tiles(int64_t n_tok, Tile &&tile) {
  constexpr int64_t kTile = 8;
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t left = n_tok - t0, passes = (left + kTile - 1) / kTile;
    const int nt = static_cast<int>((left + passes - 1) / passes);
    switch (nt) {
      case 8: tile(std::integral_constant<int, 8>{}, t0); break;
      case 7: tile(std::integral_constant<int, 7>{}, t0); break;
      case 6: tile(std::integral_constant<int, 6>{}, t0); break;
      case 5: tile(std::integral_constant<int, 5>{}, t0); break;
      case 4: tile(std::integral_constant<int, 4>{}, t0); break;
      case 3: tile(std::integral_constant<int, 3>{}, t0); break;
      case 2: tile(std::integral_constant<int, 2>{}, t0); break;
      default: tile(std::integral_constant<int, 1>{}, t0); break;
    }
    t0 += nt;
  }
}

}  // namespace

void q4k_x8_rows_avx512(const PackedArgs &a, int64_t r0, int64_t r1) noexcept {
  token_tiles(a.n_tok, [&](auto nt, int64_t t0) { q4k_x8_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

void q40_x4_rows_avx512(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles(a.n_tok, [&](auto nt, int64_t t0) { q40_x4_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

void q6k_x16_rows_avx512(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles(a.n_tok, [&](auto nt, int64_t t0) { q6k_x16_tile<decltype(nt)::value>(a, r0, r1, t0); });
}

}  // namespace specinfer
