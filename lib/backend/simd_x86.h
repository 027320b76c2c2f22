// Small helpers of the x86 kernel files (the *_avx2.cpp and *_avx512.cpp files of lib/backend):
// horizontal sums, unaligned loads, fp16 conversion and the unpacking steps every 32-value block
// format shares, and the scalar tail of the float-weight kernels.
//
// Include it after <immintrin.h> (or tests/support/avx512_emulation.h) in files compiled with at
// least AVX2, FMA and F16C. Everything is in an anonymous namespace: each kernel file is compiled
// with its own instruction-set flags, and an inline function with external linkage could have one
// file's copy (AVX-512 code, say) picked by the linker for another file's calls, on a CPU that
// cannot run it.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/quant.h"
#include "specinfer_plugin.h"

namespace specinfer {
namespace {

// The sum of the eight lanes.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float h2f(uint16_t h) {
  return _cvtsh_ss(h);
}

inline __m256i load256(const void *p) {
  return _mm256_loadu_si256(static_cast<const __m256i *>(p));
}
inline __m128i load128(const void *p) {
  return _mm_loadu_si128(static_cast<const __m128i *>(p));
}

inline uint32_t le32(const uint8_t *p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Byte j of the result is 0xFF where bit j of `bits` is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                          0x0202020202020202LL, 0x0303030303030303LL);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFELL));
  return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1LL));
}

// 32 nibbles of qs[16]: low nibbles are values 0..15, high nibbles 16..31.
inline __m256i nibbles32(const uint8_t *qs) {
  const __m128i raw = load128(qs);
  const __m256i both = _mm256_setr_m128i(raw, _mm_srli_epi16(raw, 4));
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Element c of a float-weight row of type W (F32, F16 or BF16).
template <int32_t W>
inline float float_elem(const uint8_t *row, int64_t c) {
  return float_elem_with<W>(row, c, [](uint16_t h) { return h2f(h); });
}

}  // namespace
}  // namespace specinfer
