// AVX-512 (VL + VNNI) kernels for packed weights (packed.h), on 256-bit registers. vpdpbusd adds
// the four byte products of each 32-bit lane straight into an int32 accumulator, where the AVX2
// kernels need vpmaddubsw, int16 adds and a vpmaddwd: in the q4k_x8 and q40_x4 layouts a 32-bit
// lane holds four values of one group, so the int32 sums are exactly the AVX2 kernels' (which never
// overflow their int16 stage), and the float steps after them compute the same values in the same
// order (the scale multiply is exact either way). In q6k_x16 a 32-bit lane spans two groups with
// different scales: there vpdpwssd fuses the AVX2 kernel's vpmaddwd by the scales and its vpaddd.
// The results are therefore bit-identical to the scalar and AVX2 kernels, for any number of tokens.
//
// The row kernels run four rows at a time on 512-bit registers (*_tile_pairs): two rows side by
// side in a register, the activations broadcast to both halves, each activation register used for
// two such pairs: fewer loads and float steps per row than a 256-bit kernel, which loads every
// activation again for every row (at 5 tokens and 8960 columns, 56 KB of activations, from L2).
// (Some cores, Zen 5 among them, issue 512-bit vpdpbusd twice per cycle, as 256-bit ones; others
// once.) for_row_ranges hands out whole groups of four rows; a range's last one to three rows run
// in pairs or alone (the 256-bit *_tile). Q4_K and Q6_K matrices with rows a multiple of 16 use
// q4k_r16 and q6k_r16 instead (*_r16_tile: a lane per row, sixteen rows per register).
//
// Tests run these kernels natively where the CPU has the extensions and, everywhere, compiled
// over software intrinsics (SIMDe, tests/support/avx512_emulation.h, under the names
// *_avx512_emulated) against the scalar kernels, bit for bit.
//
// As in matmul_avx2.cpp: everything in an anonymous namespace or a plain function, no inline
// function shared with other translation units.
//
// GCC 12's AVX-512 headers build some results on _mm512_undefined_*() (a self-initialized
// variable), and -Wall then reports them as uninitialized where they inline (GCC PR 105593,
// fixed in GCC 13): a false positive, silenced for this file before the headers are included.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(SPECINFER_AVX512_EMULATED)
#include "support/avx512_emulation.h"
#define q4k_x8_rows_avx512 q4k_x8_rows_avx512_emulated
#define q40_x4_rows_avx512 q40_x4_rows_avx512_emulated
#define q6k_x16_rows_avx512 q6k_x16_rows_avx512_emulated
#define q6k_x16_rows_avx512_split q6k_x16_rows_avx512_split_emulated
#define q4k_r16_rows_avx512 q4k_r16_rows_avx512_emulated
#define q32_r16_rows_avx512 q32_r16_rows_avx512_emulated
#define q6k_r16_rows_avx512 q6k_r16_rows_avx512_emulated
#else
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/packed.h"
#include "backend/simd_x86.h"

// Full unrolling of the q4k_r16 loops (the compiler left them rolled, with register copies between
// iterations). Not in the emulated build: over software intrinsics it only multiplies compile time
// (minutes under the sanitizers).
#if defined(SPECINFER_AVX512_EMULATED)
#define SPECINFER_UNROLL(n)
#else
#define SPECINFER_PRAGMA(x) _Pragma(#x)
#define SPECINFER_UNROLL(n) SPECINFER_PRAGMA(GCC unroll n)
#endif

namespace specinfer {

namespace {

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
        const __m256i lo = _mm256_and_si256(raw, m4),
                      hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
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
      const __m128i mhi =
          _mm_unpacklo_epi8(_mm_and_si128(w, m0f), _mm_and_si128(_mm_srli_epi16(w, 4), m0f));
      const __m128i mn =
          _mm_or_si128(_mm_and_si128(_mm_srli_epi16(e, 6), m03), _mm_slli_epi16(mhi, 2));
      const __m256 mv = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dmh)),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
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

// Prefetches [p, p + bytes), a line at a time, into L1 (prefetch_lines) or L2 (prefetch_lines_l2).
// The row-group kernels read their rows side by side, a pattern the hardware prefetchers do not
// follow (without prefetches, weights streamed from memory run 2-3x slower than from cache): each
// group fetches the rows of the group kAheadGroups after it into L1, spread over its own
// super-blocks (of 1, 2 and 4 groups ahead, 2 is best with two threads), and those of the group
// kFarGroups after it into L2. The L1 prefetches alone keep too few lines in flight: a core has few
// L1 miss buffers and memory latency is long, and prefetching further ahead into L1 does not help
// (4 and 8 groups or tiles); the far L2 prefetches are what lets a one-token pass come close to
// the memory's bandwidth.
// The last groups prefetch past the matrix: a prefetch never faults, and the address is formed as
// an integer so that no out-of-bounds pointer arises.
constexpr size_t kAheadGroups = 2, kFarGroups = 4;
inline void prefetch_lines(uintptr_t p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char *>(p + o), _MM_HINT_T0);
}
inline void prefetch_lines_l2(uintptr_t p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char *>(p + o), _MM_HINT_T1);
}

// Super-block i (block_bytes each) of the 2 * NP rows from row0 into blk, after prefetching the
// matching parts of the groups kAheadGroups (to L1) and, with far, kFarGroups (to L2) ahead.
// Only the first token tile prefetches far: the later ones find a task's rows in L2 (far
// prefetches from every tile slow a 512-token prefill down by about 4%).
template <int NP>
inline void group_blocks(const uint8_t *row0, size_t row_bytes, size_t block_bytes, int64_t i,
                         bool far, const uint8_t **blk) {
  const size_t chunk = 2 * NP * block_bytes, group = 2 * NP * row_bytes;
  const uintptr_t part = reinterpret_cast<uintptr_t>(row0) + static_cast<size_t>(i) * chunk;
  prefetch_lines(part + kAheadGroups * group, chunk);
  if (far) prefetch_lines_l2(part + kFarGroups * group, chunk);
  for (int h = 0; h < 2 * NP; ++h)
    blk[h] = row0 + static_cast<size_t>(h) * row_bytes + static_cast<size_t>(i) * block_bytes;
}

// The two 256-bit halves of a 512-bit register: one row each in the row-pair kernels below.
inline __m512i pair256(const void *lo, const void *hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(lo)), load256(hi), 1);
}
inline __m512 pair_ps(__m256 lo, __m256 hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
inline __m512i bcast256(const void *p) {
  return _mm512_broadcast_i64x4(load256(p));
}

// Stores the sums of the two halves as rows r and r + 1, each half added exactly as hsum does.
inline void store_pair(float *y, int64_t r, __m512 acc) {
  y[r] = hsum(_mm512_castps512_ps256(acc));
  y[r + 1] = hsum(_mm512_extractf32x8_ps(acc, 1));
}

// The NP x NT accumulators of a row group (pairs from row r) into y, token t at y + (t0 + t) *
// stride.
template <int NP, int NT>
inline void store_group(const __m512 (&acc)[NP][NT], float *y, int64_t stride, int64_t t0,
                        int64_t r) {
  for (int p = 0; p < NP; ++p)
    for (int t = 0; t < NT; ++t) store_pair(y + (t0 + t) * stride, r + 2 * p, acc[p][t]);
}

template <int NP, int NT>
inline void zero_group(__m512 (&acc)[NP][NT]) {
  for (int p = 0; p < NP; ++p)
    for (int t = 0; t < NT; ++t) acc[p][t] = _mm512_setzero_ps();
}

// q4k_x8 on 512-bit registers, 2 * NP rows from r: rows r + 2p and r + 2p + 1 side by side in
// register p (the even row in the low half), the activations broadcast to both halves; each
// broadcast activation register serves NP pairs (loads, not dot products, bound the 256-bit
// kernel: see the top of the file). Every lane does what q4k_x8_tile's does, in the
// same order, so the results are the same bits.
template <int NT, int NP>
void q4k_x8_tile_pairs(const PackedArgs &a, int64_t r, int64_t t0) {
  const ActQ8KP *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m128i m3f = _mm_set1_epi8(0x3F), m0f = _mm_set1_epi8(0x0F), m03 = _mm_set1_epi8(0x03);
  const uint8_t *row0 = a.w + static_cast<size_t>(r) * a.row_bytes;
  __m512 acc[NP][NT];
  zero_group(acc);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *blk[2 * NP];
    group_blocks<NP>(row0, a.row_bytes, sizeof(BlockQ4_K), i, t0 == 0, blk);
    __m512i s[NP][NT];
    for (int p = 0; p < NP; ++p)
      for (int t = 0; t < NT; ++t) s[p][t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i lo[NP], hi[NP];
      for (int p = 0; p < NP; ++p) {
        const __m512i raw = pair256(blk[2 * p] + 16 + 32 * c, blk[2 * p + 1] + 16 + 32 * c);
        lo[p] = _mm512_and_si512(raw, m4);
        hi[p] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t *xq = x[t * nb + i].qs + 64 * c;
        const __m512i xa = bcast256(xq), xb = bcast256(xq + 32);
        for (int p = 0; p < NP; ++p) {
          s[p][t] = _mm512_dpbusd_epi32(s[p][t], lo[p], xa);
          s[p][t] = _mm512_dpbusd_epi32(s[p][t], hi[p], xb);
        }
      }
    }
    __m512 scf2[NP], mv2[NP], dv2[NP];
    for (int p = 0; p < NP; ++p) {
      // Both rows' scales and mins at once (row 2p in the low bytes), decoded as in q4k_x8_tile.
      const uint8_t *b0 = blk[2 * p], *b1 = blk[2 * p + 1];
      const __m128i e =
          _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(b0 + 4)),
                             _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b1 + 4)));
      uint32_t eh0, eh1, dd0, dd1;
      std::memcpy(&eh0, b0 + 12, 4);
      std::memcpy(&eh1, b1 + 12, 4);
      std::memcpy(&dd0, b0, 4);  // d, dmin (fp16)
      std::memcpy(&dd1, b1, 4);
      scf2[p] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(e, m3f)));
      const __m128i w = _mm_unpacklo_epi32(_mm_cvtsi32_si128(static_cast<int>(eh0)),
                                           _mm_cvtsi32_si128(static_cast<int>(eh1)));
      const __m128i mhi =
          _mm_unpacklo_epi8(_mm_and_si128(w, m0f), _mm_and_si128(_mm_srli_epi16(w, 4), m0f));
      const __m128i mn =
          _mm_or_si128(_mm_and_si128(_mm_srli_epi16(e, 6), m03), _mm_slli_epi16(mhi, 2));
      // [d0, dmin0, d1, dmin1] as floats, spread to the halves.
      const __m128 dd = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128(static_cast<int>(dd0)),
                                                        _mm_cvtsi32_si128(static_cast<int>(dd1))));
      const __m512 ddz = _mm512_castps128_ps512(dd);
      dv2[p] = _mm512_permutexvar_ps(
          _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), ddz);
      const __m512 dm2 = _mm512_permutexvar_ps(
          _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), ddz);
      mv2[p] = _mm512_mul_ps(dm2, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
    }
    for (int t = 0; t < NT; ++t) {
      const ActQ8KP &xb = x[t * nb + i];
      const __m512 d = _mm512_set1_ps(xb.d), xs = _mm512_broadcast_f32x8(_mm256_load_ps(xb.xs));
      for (int p = 0; p < NP; ++p) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[p][t]), scf2[p]);
        acc[p][t] =
            _mm512_fmadd_ps(f, _mm512_mul_ps(dv2[p], d), _mm512_fnmadd_ps(mv2[p], xs, acc[p][t]));
      }
    }
  }
  store_group(acc, a.y, a.y_stride, t0, r);
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
      const __m256i n0 = _mm256_and_si256(raw0, m4),
                    n1 = _mm256_and_si256(_mm256_srli_epi16(raw0, 4), m4);
      const __m256i n2 = _mm256_and_si256(raw1, m4),
                    n3 = _mm256_and_si256(_mm256_srli_epi16(raw1, 4), m4);
      for (int t = 0; t < NT; ++t) {
        const ActQ8X4 &xb = x[t * nb + i];
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), n0, load256(xb.qs));
        s = _mm256_dpbusd_epi32(s, n1, load256(xb.qs + 32));
        s = _mm256_dpbusd_epi32(s, n2, load256(xb.qs + 64));
        s = _mm256_dpbusd_epi32(s, n3, load256(xb.qs + 96));
        const __m256i p =
            _mm256_sub_epi32(s, _mm256_load_si256(reinterpret_cast<const __m256i *>(xb.osum)));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_load_ps(xb.xd)),
                                 acc[t]);
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
      const __m256i sc =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 192)));
      const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
      __m256i ia[NT];
      for (int t = 0; t < NT; ++t)
        ia[t] = _mm256_madd_epi16(
            scn, _mm256_load_si256(reinterpret_cast<const __m256i *>(x[t * nb + i].bsums)));
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = load256(blk + 32 * c), hb = load256(blk + 128 + 32 * (c / 2));
        // High bits as in the AVX2 kernel.
        const __m256i h0 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 4) : hb;
        const __m256i h1 = (c % 2 == 0) ? _mm256_slli_epi16(hb, 2) : _mm256_srli_epi16(hb, 2);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(h0, m30));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                           _mm256_and_si256(h1, m30));
        for (int t = 0; t < NT; ++t) {
          const int8_t *xq = x[t * nb + i].qs + 64 * c;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(xq)),
                                             _mm256_maddubs_epi16(hi, load256(xq + 32)));
          ia[t] = _mm256_dpwssd_epi32(ia[t], p, sc);
        }
      }
      uint16_t dh;
      std::memcpy(&dh, blk + 208, 2);
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(dh));
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]),
                                 _mm256_mul_ps(dv, _mm256_broadcast_ss(&x[t * nb + i].d)), acc[t]);
    }
    for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = hsum(acc[t]);
  }
}

// q40_x4 on 512-bit registers, 2 * NP rows from r, paired as in q4k_x8_tile_pairs (same bits as
// q40_x4_tile).
template <int NT, int NP>
void q40_x4_tile_pairs(const PackedArgsX4 &a, int64_t r, int64_t t0) {
  constexpr size_t kSuper = 4 * sizeof(BlockQ4_0);
  const ActQ8X4 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const uint8_t *row0 = a.w + static_cast<size_t>(r) * a.row_bytes;
  __m512 acc[NP][NT];
  zero_group(acc);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *blk[2 * NP];
    group_blocks<NP>(row0, a.row_bytes, kSuper, i, t0 == 0, blk);
    __m512 dv[NP];
    __m512i n[NP][4];
    for (int p = 0; p < NP; ++p) {
      const uint8_t *sb0 = blk[2 * p], *sb1 = blk[2 * p + 1];
      const __m128i dh0 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sb0));
      const __m128i dh1 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sb1));
      dv[p] = pair_ps(_mm256_cvtph_ps(_mm_unpacklo_epi16(dh0, dh0)),
                      _mm256_cvtph_ps(_mm_unpacklo_epi16(dh1, dh1)));
      const __m512i raw0 = pair256(sb0 + 8, sb1 + 8), raw1 = pair256(sb0 + 40, sb1 + 40);
      n[p][0] = _mm512_and_si512(raw0, m4);
      n[p][1] = _mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4);
      n[p][2] = _mm512_and_si512(raw1, m4);
      n[p][3] = _mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4);
    }
    for (int t = 0; t < NT; ++t) {
      const ActQ8X4 &xb = x[t * nb + i];
      const __m512i x0 = bcast256(xb.qs), x1 = bcast256(xb.qs + 32), x2 = bcast256(xb.qs + 64),
                    x3 = bcast256(xb.qs + 96);
      const __m512i os = bcast256(xb.osum);
      const __m512 xd = _mm512_broadcast_f32x8(_mm256_load_ps(xb.xd));
      for (int p = 0; p < NP; ++p) {
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), n[p][0], x0);
        sum = _mm512_dpbusd_epi32(sum, n[p][1], x1);
        sum = _mm512_dpbusd_epi32(sum, n[p][2], x2);
        sum = _mm512_dpbusd_epi32(sum, n[p][3], x3);
        acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, os)),
                                    _mm512_mul_ps(dv[p], xd), acc[p][t]);
      }
    }
  }
  store_group(acc, a.y, a.y_stride, t0, r);
}

// q6k_x16 on 512-bit registers, 2 * NP rows from r, paired as in q4k_x8_tile_pairs: the six-bit
// values, the scales and the sums of rows r + 2p and r + 2p + 1 side by side, the activations
// broadcast. Every lane does what q6k_x16_tile's does, in the same order (same bits).
template <int NT, int NP>
void q6k_x16_tile_pairs(const PackedArgsQ6 &a, int64_t r, int64_t t0) {
  const ActQ8K16 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const uint8_t *row0 = a.w + static_cast<size_t>(r) * a.row_bytes;
  __m512 acc[NP][NT];
  zero_group(acc);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *blk[2 * NP];
    group_blocks<NP>(row0, a.row_bytes, sizeof(BlockQ6_K), i, t0 == 0, blk);
    __m512i sc[NP], ia[NP][NT];
    for (int p = 0; p < NP; ++p) {
      const __m256i sc8 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk[2 * p] + 192))),
          _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk[2 * p + 1] + 192)), 1);
      sc[p] = _mm512_cvtepi8_epi16(sc8);
      const __m512i scn = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(sc[p], 5));
      for (int t = 0; t < NT; ++t) ia[p][t] = _mm512_madd_epi16(scn, bcast256(x[t * nb + i].bsums));
    }
    for (int c = 0; c < 4; ++c) {
      __m512i lo[NP], hi[NP];
      for (int p = 0; p < NP; ++p) {
        const __m512i raw = pair256(blk[2 * p] + 32 * c, blk[2 * p + 1] + 32 * c);
        const __m512i hb =
            pair256(blk[2 * p] + 128 + 32 * (c / 2), blk[2 * p + 1] + 128 + 32 * (c / 2));
        const __m512i h0 = (c % 2 == 0) ? _mm512_slli_epi16(hb, 4) : hb;
        const __m512i h1 = (c % 2 == 0) ? _mm512_slli_epi16(hb, 2) : _mm512_srli_epi16(hb, 2);
        lo[p] = _mm512_or_si512(_mm512_and_si512(raw, m4), _mm512_and_si512(h0, m30));
        hi[p] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4),
                                _mm512_and_si512(h1, m30));
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t *xq = x[t * nb + i].qs + 64 * c;
        const __m512i xa = bcast256(xq), xb = bcast256(xq + 32);
        for (int p = 0; p < NP; ++p) {
          const __m512i prod =
              _mm512_add_epi16(_mm512_maddubs_epi16(lo[p], xa), _mm512_maddubs_epi16(hi[p], xb));
          ia[p][t] = _mm512_dpwssd_epi32(ia[p][t], prod, sc[p]);
        }
      }
    }
    __m512 dv[NP];
    for (int p = 0; p < NP; ++p) {
      uint16_t dh[2];
      std::memcpy(&dh[0], blk[2 * p] + 208, 2);
      std::memcpy(&dh[1], blk[2 * p + 1] + 208, 2);
      dv[p] = pair_ps(_mm256_set1_ps(_cvtsh_ss(dh[0])), _mm256_set1_ps(_cvtsh_ss(dh[1])));
    }
    for (int t = 0; t < NT; ++t) {
      const __m512 d = _mm512_set1_ps(x[t * nb + i].d);
      for (int p = 0; p < NP; ++p)
        acc[p][t] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[p][t]), _mm512_mul_ps(dv[p], d), acc[p][t]);
    }
  }
  store_group(acc, a.y, a.y_stride, t0, r);
}

constexpr size_t kAheadTiles = 2, kFarTiles = 4;  // as kAheadGroups and kFarGroups

// The sixteen-row kernels' prefetches for a tile of `bytes` (see q4k_r16_tile).
inline void prefetch_tiles_ahead(const uint8_t *tile, size_t bytes, bool far) {
  prefetch_lines(reinterpret_cast<uintptr_t>(tile) + kAheadTiles * bytes, bytes);
  if (far) prefetch_lines_l2(reinterpret_cast<uintptr_t>(tile) + kFarTiles * bytes, bytes);
}

// q4k_r16: the sixteen rows of group g (lane l = row 16g + l) for NT tokens from t0. Per
// super-block and group s: the sixteen rows' scales as floats, the four 64-byte registers of
// nibbles as eight of values; per token eight vpdpbusd, each with four activation bytes broadcast
// to all lanes, in two chains, and the exact group sum times the scale added to the token's
// super-block sum (one multiply-add). Per super-block and token: the mins, as int16 pairs, times
// the groups' activation sums (four vpdpwssd, exact), then (sum * d - mins * dmin) * xd added to
// the accumulator, as in q4k_r16_rows_scalar (same bits). Each tile prefetches the one
// kAheadTiles after it into L1 and, in the first token tile, the one kFarTiles after it into L2
// (a group's tiles are contiguous).
template <int NT>
void q4k_r16_tile(const PackedArgsR16 &a, int64_t g, int64_t t0) {
  const ActQ8KS *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m128i m3f = _mm_set1_epi8(0x3F), m0f = _mm_set1_epi8(0x0F), m03 = _mm_set1_epi8(0x03);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *tile = a.w + static_cast<size_t>(g * nb + i) * kR16Tile;
    prefetch_tiles_ahead(tile, kR16Tile, t0 == 0);
    __m512 scaled[NT];
    for (int t = 0; t < NT; ++t) scaled[t] = _mm512_setzero_ps();
    SPECINFER_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      const __m128i e =
          _mm_load_si128(reinterpret_cast<const __m128i *>(tile + kR16Scales + 16 * s));
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(e, m3f)));
      __m512i v[8];
      SPECINFER_UNROLL(4)
      for (int q = 0; q < 4; ++q) {
        const __m512i raw = _mm512_load_si512(tile + 256 * s + 64 * q);
        v[2 * q] = _mm512_and_si512(raw, m4);
        v[2 * q + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      }
      SPECINFER_UNROLL(8)
      for (int t = 0; t < NT; ++t) {
        const int8_t *xq = x[t * nb + i].qs + 32 * s;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        SPECINFER_UNROLL(4)
        for (int c = 0; c < 8; c += 2) {  // register c: columns 32s + 4c .. + 3
          int32_t x0, x1;
          std::memcpy(&x0, xq + 4 * c, 4);
          std::memcpy(&x1, xq + 4 * c + 4, 4);
          s0 = _mm512_dpbusd_epi32(s0, v[c], _mm512_set1_epi32(x0));
          s1 = _mm512_dpbusd_epi32(s1, v[c + 1], _mm512_set1_epi32(x1));
        }
        scaled[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), w, scaled[t]);
      }
    }
    // The mins of groups 2j and 2j + 1 as an int16 pair per lane (row): the low two bits from the
    // scale byte's top, the high four from a nibble of the min-high byte.
    const auto min6 = [&](int s, __m128i high) {
      const __m128i e =
          _mm_load_si128(reinterpret_cast<const __m128i *>(tile + kR16Scales + 16 * s));
      return _mm_or_si128(_mm_and_si128(_mm_srli_epi16(e, 6), m03),
                          _mm_slli_epi16(_mm_and_si128(high, m0f), 2));
    };
    __m512i mp[4];
    SPECINFER_UNROLL(4)
    for (int j = 0; j < 4; ++j) {
      const __m128i mh =
          _mm_load_si128(reinterpret_cast<const __m128i *>(tile + kR16MinHigh + 16 * j));
      const __m128i m0 = min6(2 * j, mh), m1 = min6(2 * j + 1, _mm_srli_epi16(mh, 4));
      mp[j] = _mm512_cvtepu8_epi16(
          _mm256_set_m128i(_mm_unpackhi_epi8(m0, m1), _mm_unpacklo_epi8(m0, m1)));
    }
    const __m512 dv =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(tile + kR16D)));
    const __m512 dmv =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(tile + kR16Dmin)));
    SPECINFER_UNROLL(8)
    for (int t = 0; t < NT; ++t) {
      const ActQ8KS &xb = x[t * nb + i];
      __m512i mins = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        int32_t pair;
        std::memcpy(&pair, xb.bsums + 2 * j, 4);
        mins = _mm512_dpwssd_epi32(mins, mp[j], _mm512_set1_epi32(pair));
      }
      const __m512 part =
          _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), dmv, _mm512_mul_ps(scaled[t], dv));
      acc[t] = _mm512_fmadd_ps(part, _mm512_set1_ps(xb.d), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * g, acc[t]);
}

// q6k_r16: the sixteen rows of group G (lane l = row 16G + l) for NT tokens from t0. Per
// super-block and 16-column group g: the sixteen rows' scales as floats, four registers of values
// (nibbles and high bit pairs joined); per token four vpdpbusd, each with four activation bytes
// broadcast to all lanes, in two chains, the first started from -32 times the token's group sum,
// and the exact sum times the scale added to the token's super-block sum. Per super-block and
// token: that sum times d, times xd, added to the accumulator, as in q6k_r16_rows_scalar (same
// bits). Prefetches as q4k_r16.
template <int NT>
void q6k_r16_tile(const PackedArgsQ6R16 &a, int64_t G, int64_t t0) {
  const ActQ8K *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *tile = a.w + static_cast<size_t>(G * nb + i) * kQ6R16Tile;
    prefetch_tiles_ahead(tile, kQ6R16Tile, t0 == 0);
    __m512 scaled[NT];
    for (int t = 0; t < NT; ++t) scaled[t] = _mm512_setzero_ps();
    SPECINFER_UNROLL(16)
    for (int g = 0; g < 16; ++g) {
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_load_si128(reinterpret_cast<const __m128i *>(tile + kQ6R16Scales + 16 * g))));
      const __m512i raw0 = _mm512_load_si512(tile + 128 * g),
                    raw1 = _mm512_load_si512(tile + 128 * g + 64),
                    hb = _mm512_load_si512(tile + kQ6R16High + 64 * g);
      // Value register k: its nibbles | (the high bit pairs shifted to bits 4-5) & 0x30, the OR
      // and the AND in one vpternlogd (0xF8: a | (b & c)).
      const auto join = [&](__m512i nib, __m512i high) {
        return _mm512_ternarylogic_epi32(_mm512_and_si512(nib, m4), high, m30, 0xF8);
      };
      const __m512i v0 = join(raw0, _mm512_slli_epi16(hb, 4)),
                    v1 = join(_mm512_srli_epi16(raw0, 4), _mm512_slli_epi16(hb, 2)),
                    v2 = join(raw1, hb),
                    v3 = join(_mm512_srli_epi16(raw1, 4), _mm512_srli_epi16(hb, 2));
      SPECINFER_UNROLL(8)
      for (int t = 0; t < NT; ++t) {
        const ActQ8K &xb = x[t * nb + i];
        const int8_t *xq = xb.qs + 16 * g;
        int32_t x0, x1, x2, x3;
        std::memcpy(&x0, xq, 4);
        std::memcpy(&x1, xq + 4, 4);
        std::memcpy(&x2, xq + 8, 4);
        std::memcpy(&x3, xq + 12, 4);
        __m512i s0 = _mm512_set1_epi32(-32 * xb.bsums[g]);
        __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v1, _mm512_set1_epi32(x1));
        s0 = _mm512_dpbusd_epi32(s0, v0, _mm512_set1_epi32(x0));
        s1 = _mm512_dpbusd_epi32(s1, v3, _mm512_set1_epi32(x3));
        s0 = _mm512_dpbusd_epi32(s0, v2, _mm512_set1_epi32(x2));
        scaled[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), w, scaled[t]);
      }
    }
    const __m512 dv =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(tile + kQ6R16D)));
    SPECINFER_UNROLL(8)
    for (int t = 0; t < NT; ++t)
      acc[t] =
          _mm512_fmadd_ps(_mm512_mul_ps(scaled[t], dv), _mm512_set1_ps(x[t * nb + i].d), acc[t]);
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * G, acc[t]);
}

// q32_r16 (W = Q4_0, Q5_0, Q8_0 or Q3_0): the sixteen rows of group g for NT tokens from t0. Per
// block: the eight registers of values (Q8_0: loaded; Q4_0, Q5_0: nibbles split, and for Q5_0 16
// added under a byte mask tested from the bit plane, vptestmb, which is cheaper here than the AVX2
// kernel's shift and AND; Q3_0: bit pairs split, 4 added under the mask), the sixteen d; per token
// eight vpdpbusd in two chains started from -offset * (sum of the token's values), then sum * (d *
// xd) added, as in q32_r16_rows_scalar (same bits). Prefetches as q4k_r16.
template <int32_t W, int NT>
void q32_r16_tile(const PackedArgsQ32 &a, int64_t g, int64_t t0) {
  constexpr size_t kTile = q32_r16_tile_bytes(W), kD = q32_r16_d_offset(W);
  constexpr int kOff = q32_r16_offset(W);
  const ActQ8 *x = a.x + t0 * a.n_blocks;
  const int64_t nb = a.n_blocks;
  const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t *tile = a.w + static_cast<size_t>(g * nb + i) * kTile;
    prefetch_tiles_ahead(tile, kTile, t0 == 0);
    const __m512 dv =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(tile + kD)));
    __m512i v[8];
    if constexpr (W == SPECINFER_WTYPE_Q8_0) {
      for (int c = 0; c < 8; ++c) v[c] = _mm512_loadu_si512(tile + 64 * c);
    } else if constexpr (W == SPECINFER_WTYPE_Q3_0) {  // bit pairs, 4 added under the third bit
      const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
      const __m512i plane = _mm512_loadu_si512(tile + 128);
      for (int h = 0; h < 2; ++h) {
        const __m512i raw = _mm512_loadu_si512(tile + 64 * h);
        for (int k = 0; k < 4; ++k) {
          const int c = 4 * h + k;
          const __m512i low = _mm512_and_si512(_mm512_srli_epi16(raw, 2 * k), m3);
          v[c] = _mm512_mask_add_epi8(
              low, _mm512_test_epi8_mask(plane, _mm512_set1_epi8(static_cast<char>(1 << c))), low,
              four);
        }
      }
    } else {
      for (int q = 0; q < 4; ++q) {
        const __m512i raw = _mm512_loadu_si512(tile + 64 * q);
        v[2 * q] = _mm512_and_si512(raw, m4);
        v[2 * q + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      }
      if constexpr (W == SPECINFER_WTYPE_Q5_0) {  // 16 added where bit c of the plane's byte is set
        const __m512i plane = _mm512_loadu_si512(tile + 256);
        for (int c = 0; c < 8; ++c)
          v[c] = _mm512_mask_add_epi8(
              v[c], _mm512_test_epi8_mask(plane, _mm512_set1_epi8(static_cast<char>(1 << c))), v[c],
              sixteen);
      }
    }
    for (int t = 0; t < NT; ++t) {
      const ActQ8 &xb = x[t * nb + i];
      __m512i s0 = _mm512_set1_epi32(-kOff * xb.sum), s1 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        int32_t x0, x1;
        std::memcpy(&x0, xb.qs + 4 * c, 4);
        std::memcpy(&x1, xb.qs + 4 * c + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, v[c], _mm512_set1_epi32(x0));
        s1 = _mm512_dpbusd_epi32(s1, v[c + 1], _mm512_set1_epi32(x1));
      }
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(dv, _mm512_set1_ps(xb.d)), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * g, acc[t]);
}

// Calls tile(std::integral_constant<int, nt>, t0) over the tokens in even tiles of at most kTile
// (7 tokens with kTile 5: 4 + 3, not 5 + 2; every pass re-reads the rows). Token tiles outer,
// rows inner, as in the AVX2 kernels. In the row-pair kernels five tokens for two row pairs (sums
// and accumulators) fill the 32 vector registers; tiles of 4 are slower at 5 tokens, and one pair
// with tiles of 8 is slower at 5 and no faster at 8. q4k_r16 holds 8 tokens.
template <int kTile, class Tile>
void token_tiles(int64_t n_tok, Tile &&tile) {
  static_assert(kTile >= 1 && kTile <= 8, "tiles of 1..8 tokens");
  for (int64_t t0 = 0; t0 < n_tok;) {
    const int64_t left = n_tok - t0, passes = (left + kTile - 1) / kTile;
    const int nt = static_cast<int>((left + passes - 1) / passes);
    switch (nt) {
      case 8:
        if constexpr (kTile >= 8) tile(std::integral_constant<int, 8>{}, t0);
        break;
      case 7:
        if constexpr (kTile >= 7) tile(std::integral_constant<int, 7>{}, t0);
        break;
      case 6:
        if constexpr (kTile >= 6) tile(std::integral_constant<int, 6>{}, t0);
        break;
      case 5:
        tile(std::integral_constant<int, 5>{}, t0);
        break;
      case 4:
        tile(std::integral_constant<int, 4>{}, t0);
        break;
      case 3:
        tile(std::integral_constant<int, 3>{}, t0);
        break;
      case 2:
        tile(std::integral_constant<int, 2>{}, t0);
        break;
      default:
        tile(std::integral_constant<int, 1>{}, t0);
        break;
    }
    t0 += nt;
  }
}

// Rows [r0, r1): groups of four, then a pair, as pairs(std::integral_constant<int, NP>, r) (NP
// row pairs from r); a last single row as single(r, r1) (the 256-bit kernel).
template <class Pairs, class Single>
void row_groups(int64_t r0, int64_t r1, Pairs &&pairs, Single &&single) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) pairs(std::integral_constant<int, 2>{}, r);
  for (; r + 2 <= r1; r += 2) pairs(std::integral_constant<int, 1>{}, r);
  if (r < r1) single(r, r1);
}

}  // namespace

void q4k_x8_rows_avx512(const PackedArgs &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<5>(a.n_tok, [&](auto nt, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    row_groups(
        r0, r1, [&](auto np, int64_t r) { q4k_x8_tile_pairs<NT, decltype(np)::value>(a, r, t0); },
        [&](int64_t r, int64_t end) { q4k_x8_tile<NT>(a, r, end, t0); });
  });
}

void q40_x4_rows_avx512(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<5>(a.n_tok, [&](auto nt, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    row_groups(
        r0, r1, [&](auto np, int64_t r) { q40_x4_tile_pairs<NT, decltype(np)::value>(a, r, t0); },
        [&](int64_t r, int64_t end) { q40_x4_tile<NT>(a, r, end, t0); });
  });
}

void q4k_r16_rows_avx512(const PackedArgsR16 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<8>(a.n_tok, [&](auto nt, int64_t t0) {
    for (int64_t g = r0 / 16; g < r1 / 16; ++g) q4k_r16_tile<decltype(nt)::value>(a, g, t0);
  });
}

void q6k_r16_rows_avx512(const PackedArgsQ6R16 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<8>(a.n_tok, [&](auto nt, int64_t t0) {
    for (int64_t g = r0 / 16; g < r1 / 16; ++g) q6k_r16_tile<decltype(nt)::value>(a, g, t0);
  });
}

void q32_r16_rows_avx512(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<8>(a.n_tok, [&](auto nt, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    for (int64_t g = r0 / 16; g < r1 / 16; ++g) {
      if (a.wtype == SPECINFER_WTYPE_Q8_0)
        q32_r16_tile<SPECINFER_WTYPE_Q8_0, NT>(a, g, t0);
      else if (a.wtype == SPECINFER_WTYPE_Q3_0)
        q32_r16_tile<SPECINFER_WTYPE_Q3_0, NT>(a, g, t0);
      else if (a.wtype == SPECINFER_WTYPE_Q5_0)
        q32_r16_tile<SPECINFER_WTYPE_Q5_0, NT>(a, g, t0);
      else
        q32_r16_tile<SPECINFER_WTYPE_Q4_0, NT>(a, g, t0);
    }
  });
}

void q6k_x16_rows_avx512(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept {
  token_tiles<5>(a.n_tok, [&](auto nt, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    row_groups(
        r0, r1, [&](auto np, int64_t r) { q6k_x16_tile_pairs<NT, decltype(np)::value>(a, r, t0); },
        [&](int64_t r, int64_t end) { q6k_x16_tile<NT>(a, r, end, t0); });
  });
}

// Where 512-bit operations run as two 256-bit halves (Zen 4) the row pairs' lane inserts and
// broadcasts cost more than the wider registers save in two cases, where the one-row 256-bit
// kernel runs on every row: one token (memory-bound), and up to 8 tokens on rows of at most 2048
// columns. (Only matrices whose rows are not a multiple of 16 take q6k_x16 on AVX-512.) Long rows
// with more tokens keep the pairs, which read each token's activations once for four rows. Zen 4,
// weights streamed from memory (bench_kernels BM_MatmulStream), microseconds one-row / pairs: 1536
// x 8960 one token 335 / 452, two tokens 594 / 455; 8960 x 1536 one token 320 / 397, five tokens
// 412-444 / 470-510. Same bits either way.
void q6k_x16_rows_avx512_split(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept {
  if (a.n_tok == 1 || (a.n_tok <= 8 && a.n_blocks * kQKK <= 2048)) {
    token_tiles<5>(a.n_tok,
                   [&](auto nt, int64_t t0) { q6k_x16_tile<decltype(nt)::value>(a, r0, r1, t0); });
    return;
  }
  q6k_x16_rows_avx512(a, r0, r1);
}

}  // namespace specinfer
