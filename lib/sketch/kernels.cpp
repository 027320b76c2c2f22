// Scalar reference kernels and the run-time dispatch.
#include "sketch/kernels.h"

#include <cstring>

#include "util/error.h"
#include "util/isa.h"

namespace specinfer::sketch {

// Implemented in kernels_avx2.cpp (compiled with -mavx2 -mfma).
const Kernels &avx2_kernel_table();

namespace {

inline float load_f32(const unsigned char *p, size_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

inline uint64_t load_u64(const unsigned char *p, size_t i) {
  uint64_t v;
  std::memcpy(&v, p + 8 * i, 8);
  return v;
}

void axpy_scalar(float *y, const float *col, float a, size_t m) {
  for (size_t r = 0; r < m; ++r) y[r] += a * col[r];
}

void add_signed_scalar(float *y, const uint64_t *bits, float a, size_t m) {
  for (size_t r = 0; r < m; ++r) y[r] += ((bits[r >> 6] >> (r & 63)) & 1) ? a : -a;
}

double dot_scalar(const unsigned char *x, const unsigned char *y, size_t m) {
  double s = 0.0;
  for (size_t r = 0; r < m; ++r)
    s += static_cast<double>(load_f32(x, r)) * static_cast<double>(load_f32(y, r));
  return s;
}

double signed_sum_scalar(const unsigned char *q, const unsigned char *bits, size_t m) {
  double s = 0.0;
  for (size_t r = 0; r < m; ++r) {
    const double v = load_f32(q, r);
    s += ((load_u64(bits, r >> 6) >> (r & 63)) & 1) ? v : -v;
  }
  return s;
}

const Kernels kScalar = {"scalar", axpy_scalar, add_signed_scalar, dot_scalar, signed_sum_scalar};

}  // namespace

const Kernels &scalar_kernels() {
  return kScalar;
}

const Kernels *avx2_kernels() {
  return isa_available(Isa::avx2) ? &avx2_kernel_table() : nullptr;
}

Simd best_simd() {
  return active_isa() >= Isa::avx2 ? Simd::avx2 : Simd::scalar;
}

const Kernels &kernels_for(Simd simd) {
  if (simd == Simd::scalar) return kScalar;
  const Kernels *k = avx2_kernels();
  if (!k) fail(SPECINFER_ERR_UNSUPPORTED, "this CPU has no AVX2/FMA; use simd=scalar");
  return *k;
}

}  // namespace specinfer::sketch
