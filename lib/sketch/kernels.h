// The inner loops of the sketchers, in a scalar reference version and an AVX2 version chosen at
// run time. The scalar version is the test oracle for the others.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specinfer::sketch {

enum class Simd : uint8_t { scalar = 0, avx2 = 1 };

struct Kernels {
  const char *name;
  // y[r] += a * col[r] for r < m (fused multiply-add where the ISA has it).
  void (*axpy)(float *y, const float *col, float a, size_t m);
  // y[r] += (bit r of bits) ? a : -a for r < m. bits holds ceil(m / 64) words.
  void (*add_signed)(float *y, const uint64_t *bits, float a, size_t m);
  // sum_r x[r] * y[r] accumulated in double. x and y are little-endian float32 arrays at any
  // alignment (they usually point into serialized sketches).
  double (*dot)(const unsigned char *x, const unsigned char *y, size_t m);
  // sum_r (bit r of bits) ? q[r] : -q[r] accumulated in double; q float32, bits little-endian
  // 64-bit words, both at any alignment.
  double (*signed_sum)(const unsigned char *q, const unsigned char *bits, size_t m);
};

// The scalar kernels (always available).
const Kernels &scalar_kernels();
// The AVX2+FMA kernels, or nullptr when this CPU lacks them (util/isa.h's avx2 set).
const Kernels *avx2_kernels();
// The variant "simd=auto" picks: the one of the library's active instruction set (util/isa.h:
// the CPU's best, capped by SPECINFER_ISA), so that the sketchers and the backend's kernels
// follow one choice.
Simd best_simd();
// The kernels of a variant; throws SPECINFER_ERR_UNSUPPORTED when the CPU cannot run it.
const Kernels &kernels_for(Simd simd);

}  // namespace specinfer::sketch
