// Scalar vector primitives (the reference) and the kernels built on the active primitives.
#include "backend/ops.h"

#include <cmath>
#include <limits>
#include <vector>

namespace specinfer {

namespace {

void scale_s(float *x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
float sumsq_s(const float *x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(s);
}
void mul_scaled_s(const float *x, const float *w, float s, float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s * (w ? w[i] : 1.0f);
}
float exp_sub_sum_s(float *x, float m, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return static_cast<float>(s);
}
void silu_mul_s(float *gate, const float *up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}
void add_s(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
}  // namespace

const VecOps &vec_ops_scalar() noexcept {
  static const VecOps ops = {scale_s, sumsq_s, mul_scaled_s, exp_sub_sum_s, silu_mul_s, add_s};
  return ops;
}

const VecOps &vec_ops(Isa isa) noexcept {
  return isa == Isa::scalar ? vec_ops_scalar()
         : isa == Isa::avx2 ? vec_ops_avx2()
                            : vec_ops_avx512();
}

void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) noexcept {
  if (n <= 0 || x == nullptr || y == nullptr) return;
  const VecOps &v = vec_ops(active_isa());
  const float ms = v.sumsq(x, n) / static_cast<float>(n);
  const float s = 1.0f / std::sqrt(ms + eps);
  v.mul_scaled(x, w, s, y, n);
}

namespace {

// Turns pair i of each head by the angle whose cosine and sine are c[i], s[i].
void rotate_pairs(float *x, int64_t n_heads, int64_t head_dim, int64_t half, const float *c,
                  const float *s, int32_t neox) noexcept {
  for (int64_t h = 0; h < n_heads; ++h) {
    float *xh = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + half : 2 * i + 1;
      const float a = xh[i0], b = xh[i1];
      xh[i0] = a * c[i] - b * s[i];
      xh[i1] = a * s[i] + b * c[i];
    }
  }
}

// Angles for every pair (in double for accuracy at large positions), then the rotation.
template <typename Theta>
void rope_with(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, float mscale,
               int32_t neox, Theta theta) noexcept {
  if (x == nullptr || n_heads <= 0 || head_dim <= 0 || n_rot <= 0) return;
  if (n_rot > head_dim) n_rot = head_dim;
  n_rot &= ~int64_t{1};
  const int64_t half = n_rot / 2;
  if (half == 0) return;
  float cs[512], sn[512];
  std::vector<float> big_c, big_s;
  float *c = cs, *s = sn;
  if (half > 512) {
    big_c.resize(static_cast<size_t>(half));
    big_s.resize(static_cast<size_t>(half));
    c = big_c.data();
    s = big_s.data();
  }
  for (int64_t i = 0; i < half; ++i) {
    const double t = theta(i, n_rot);
    c[i] = static_cast<float>(std::cos(t) * mscale);
    s[i] = static_cast<float>(std::sin(t) * mscale);
  }
  rotate_pairs(x, n_heads, head_dim, half, c, s, neox);
}

}  // namespace

void rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float freq_base,
          int32_t neox) noexcept {
  rope_with(x, n_heads, head_dim, n_rot, 1.0f, neox, [&](int64_t i, int64_t nr) {
    return static_cast<double>(pos) *
           std::pow(static_cast<double>(freq_base),
                    -2.0 * static_cast<double>(i) / static_cast<double>(nr));
  });
}

void rope_freqs(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
                const double *inv_freq, float mscale, int32_t neox) noexcept {
  if (inv_freq == nullptr) return;
  rope_with(x, n_heads, head_dim, n_rot, mscale, neox,
            [&](int64_t i, int64_t) { return static_cast<double>(pos) * inv_freq[i]; });
}

void softmax(float *x, int64_t n) noexcept {
  if (x == nullptr || n <= 0) return;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / static_cast<float>(n);
    return;
  }
  const VecOps &v = vec_ops(active_isa());
  const float sum = v.exp_sub_sum(x, m, n);
  v.scale(x, 1.0f / sum, n);
}

void silu_mul(float *gate, const float *up, int64_t n) noexcept {
  if (gate == nullptr || up == nullptr || n <= 0) return;
  vec_ops(active_isa()).silu_mul(gate, up, n);
}

void add(float *y, const float *x, int64_t n) noexcept {
  if (y == nullptr || x == nullptr || n <= 0) return;
  vec_ops(active_isa()).add(y, x, n);
}

}  // namespace specinfer
