// Philox4x32-10 on eight counters at once (AVX2): the same values as philox4x32_10(), eight
// blocks per pass. _mm256_mul_epu32 multiplies the even 32-bit lanes into 64-bit products; the
// odd lanes are shifted down and multiplied separately, then low and high halves are re-blended.
#include <immintrin.h>

#include "sampling/rng_bulk.h"

namespace specinfer {

namespace {

inline void mulhilo(__m256i a, __m256i m, __m256i &hi, __m256i &lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

}  // namespace

void philox_blocks_avx2(uint32_t first_block, size_t n_blocks, uint32_t c1, uint32_t c2,
                        uint32_t c3, uint32_t k0, uint32_t k1, uint32_t *out) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  size_t done = 0;
  alignas(32) uint32_t w[4][8];
  for (; done + 8 <= n_blocks; done += 8) {
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first_block + done)), lane);
    __m256i x1 = _mm256_set1_epi32(static_cast<int>(c1));
    __m256i x2 = _mm256_set1_epi32(static_cast<int>(c2));
    __m256i x3 = _mm256_set1_epi32(static_cast<int>(c3));
    uint32_t a = k0, b = k1;
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo(x0, m0, hi0, lo0);
      mulhilo(x2, m1, hi1, lo1);
      x0 = _mm256_xor_si256(_mm256_xor_si256(hi1, x1), _mm256_set1_epi32(static_cast<int>(a)));
      x1 = lo1;
      x2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32(static_cast<int>(b)));
      x3 = lo0;
      a += 0x9E3779B9u;
      b += 0xBB67AE85u;
    }
    _mm256_store_si256(reinterpret_cast<__m256i *>(w[0]), x0);
    _mm256_store_si256(reinterpret_cast<__m256i *>(w[1]), x1);
    _mm256_store_si256(reinterpret_cast<__m256i *>(w[2]), x2);
    _mm256_store_si256(reinterpret_cast<__m256i *>(w[3]), x3);
    for (int j = 0; j < 8; ++j) {
      uint32_t *o = out + (done + static_cast<size_t>(j)) * 4;
      o[0] = w[0][j];
      o[1] = w[1][j];
      o[2] = w[2][j];
      o[3] = w[3][j];
    }
  }
  for (; done < n_blocks; ++done) {
    std::array<uint32_t, 4> r =
        philox4x32_10({first_block + static_cast<uint32_t>(done), c1, c2, c3}, {k0, k1});
    for (int j = 0; j < 4; ++j) out[done * 4 + static_cast<size_t>(j)] = r[static_cast<size_t>(j)];
  }
}

}  // namespace specinfer
