// AVX-512 intrinsics in software, so that tests can run the AVX-512 kernels on a CPU without
// AVX-512 (the development machine). SIMDe (libsimde-dev) implements the intrinsics on top of the
// instruction sets the compiler targets (AVX2 here) with the same integer and IEEE results; the
// few that SIMDe 0.7.4 lacks are defined below from their Intel definitions. Test-only: never
// built into the library.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

namespace specinfer_avx512_emulation {

// 16 int32 -> 16 float (round to nearest even, as vcvtdq2ps).
inline simde__m512 cvtepi32_ps(simde__m512i a) {
  simde__m512i_private ai = simde__m512i_to_private(a);
  simde__m512_private r;
  for (int i = 0; i < 16; ++i) r.f32[i] = static_cast<float>(ai.i32[i]);
  return simde__m512_from_private(r);
}

// 16 uint16 -> 16 int32 (zero extension, as vpmovzxwd).
inline simde__m512i cvtepu16_epi32(simde__m256i a) {
  simde__m256i_private ai = simde__m256i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = static_cast<int32_t>(ai.u16[i]);
  return simde__m512i_from_private(r);
}

// 16 uint8 -> 16 int32 (zero extension, as vpmovzxbd).
inline simde__m512i cvtepu8_epi32(simde__m128i a) {
  simde__m128i_private ai = simde__m128i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = static_cast<int32_t>(ai.u8[i]);
  return simde__m512i_from_private(r);
}

// 16 int8 -> 16 int32 (sign extension, as vpmovsxbd).
inline simde__m512i cvtepi8_epi32(simde__m128i a) {
  simde__m128i_private ai = simde__m128i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = static_cast<int32_t>(ai.i8[i]);
  return simde__m512i_from_private(r);
}

// 32 uint8 -> 32 int16 (zero extension, as vpmovzxbw).
inline simde__m512i cvtepu8_epi16(simde__m256i a) {
  simde__m256i_private ai = simde__m256i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 32; ++i) r.i16[i] = static_cast<int16_t>(ai.u8[i]);
  return simde__m512i_from_private(r);
}

// 16 fp16 -> 16 float (exact, as vcvtph2ps): two 8-wide conversions.
inline simde__m512 cvtph_ps(simde__m256i a) {
  simde__m256i_private ai = simde__m256i_to_private(a);
  simde__m512_private r;
  for (int h = 0; h < 2; ++h) {
    __m128i half;
    std::memcpy(&half, &ai.u16[8 * h], sizeof half);
    const __m256 f = _mm256_cvtph_ps(half);
    std::memcpy(&r.f32[8 * h], &f, sizeof f);
  }
  return simde__m512_from_private(r);
}

// The 8 floats of half imm (0 or 1), as vextractf32x8.
inline simde__m256 extractf32x8_ps(simde__m512 a, int imm) {
  simde__m512_private ai = simde__m512_to_private(a);
  simde__m256_private r;
  for (int i = 0; i < 8; ++i) r.f32[i] = ai.f32[8 * (imm & 1) + i];
  return simde__m256_from_private(r);
}

}  // namespace specinfer_avx512_emulation

// SIMDe 0.7.4 implements _mm512_madd_epi16 (simde_mm512_madd_epi16) but aliases the native
// name with the wrong parameter list.
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#undef _mm512_cvtepi32_ps
#undef _mm512_cvtepu16_epi32
#undef _mm512_cvtepu8_epi32
#undef _mm512_cvtepi8_epi32
#undef _mm512_cvtepu8_epi16
#undef _mm512_cvtph_ps
#undef _mm512_extractf32x8_ps
#define _mm512_cvtepi32_ps(a) specinfer_avx512_emulation::cvtepi32_ps(a)
#define _mm512_cvtepu16_epi32(a) specinfer_avx512_emulation::cvtepu16_epi32(a)
#define _mm512_cvtepu8_epi32(a) specinfer_avx512_emulation::cvtepu8_epi32(a)
#define _mm512_cvtepi8_epi32(a) specinfer_avx512_emulation::cvtepi8_epi32(a)
#define _mm512_cvtepu8_epi16(a) specinfer_avx512_emulation::cvtepu8_epi16(a)
#define _mm512_cvtph_ps(a) specinfer_avx512_emulation::cvtph_ps(a)
#define _mm512_extractf32x8_ps(a, imm) specinfer_avx512_emulation::extractf32x8_ps(a, imm)
