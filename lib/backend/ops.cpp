// Scalar vector primitives (the reference) and the kernels built on the active primitives.
#include "backend/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "util/error.h"

namespace specinfer {

namespace {

float dot_s(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}
void axpy_s(float a, const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
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
void scores_s(const float *q, int64_t q_stride, int64_t g, const float *k, int64_t stride,
              int64_t n, int64_t hd, float scale, float *out, int64_t out_stride) {
  for (int64_t h = 0; h < g; ++h)
    for (int64_t j = 0; j < n; ++j)
      out[h * out_stride + j] = dot_s(q + h * q_stride, k + j * stride, hd) * scale;
}
void weighted_sum_s(const float *p, int64_t p_stride, int64_t g, const float *v, int64_t stride,
                    int64_t n, int64_t hd, float *out, int64_t q_stride) {
  for (int64_t h = 0; h < g; ++h) {
    float *o = out + h * q_stride;
    const float *ph = p + h * p_stride;
    for (int64_t d = 0; d < hd; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      if (ph[j] != 0.0f) axpy_s(ph[j], v + j * stride, o, hd);
  }
}

}  // namespace

const VecOps &vec_ops_scalar() noexcept {
  static const VecOps ops = {scale_s,    sumsq_s, mul_scaled_s, exp_sub_sum_s,
                             silu_mul_s, add_s,   scores_s,     weighted_sum_s};
  return ops;
}

const VecOps &vec_ops(Isa isa) noexcept {
  return isa == Isa::scalar ? vec_ops_scalar() : vec_ops_avx2();
}

void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) noexcept {
  if (n <= 0 || x == nullptr || y == nullptr) return;
  const VecOps &v = vec_ops(active_isa());
  const float ms = v.sumsq(x, n) / static_cast<float>(n);
  const float s = 1.0f / std::sqrt(ms + eps);
  v.mul_scaled(x, w, s, y, n);
}

void rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float freq_base,
          int32_t neox) noexcept {
  if (x == nullptr || n_heads <= 0 || head_dim <= 0 || n_rot <= 0) return;
  if (n_rot > head_dim) n_rot = head_dim;
  n_rot &= ~int64_t{1};
  const int64_t half = n_rot / 2;
  if (half == 0) return;
  // Angles once for all heads, in double for accuracy at large positions.
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
    const double theta = static_cast<double>(pos) *
                         std::pow(static_cast<double>(freq_base),
                                  -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    c[i] = static_cast<float>(std::cos(theta));
    s[i] = static_cast<float>(std::sin(theta));
  }
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

void attention(const specinfer_attention_args &a) {
  if (a.struct_size < sizeof(specinfer_attention_args))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: struct_size %u too small", a.struct_size);
  if (a.n_q <= 0 || a.n_head <= 0 || a.n_head_kv <= 0 || a.head_dim <= 0 || a.n_kv <= 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: sizes must be positive");
  if (a.n_head % a.n_head_kv != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: %d heads not a multiple of %d kv heads",
         a.n_head, a.n_head_kv);
  if (a.mask == nullptr && a.n_kv < a.n_q)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: causal mask needs n_kv (%d) >= n_q (%d)",
         a.n_kv, a.n_q);
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: NULL q, k, v or out");
  if (!std::isfinite(a.scale)) fail(SPECINFER_ERR_INVALID_ARGUMENT, "attention: scale not finite");

  const VecOps &v = vec_ops(active_isa());
  const int64_t hd = a.head_dim, n_kv = a.n_kv, group = a.n_head / a.n_head_kv;
  // One item = one query and one kv head with its group of query heads: the group shares every
  // key and value row it loads.
  const int64_t items = static_cast<int64_t>(a.n_q) * a.n_head_kv;
  // Work per item is about 4 * group * n_kv * head_dim flops; keep tasks above ~64k flops.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, group * n_kv * hd));
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, items, grain), [&](const tbb::blocked_range<int64_t> &r) {
        std::vector<float> scores(static_cast<size_t>(group * n_kv));
        for (int64_t it = r.begin(); it < r.end(); ++it) {
          const int64_t qi = it / a.n_head_kv, kvh = it % a.n_head_kv;
          const float *q = a.q + (qi * a.n_head + kvh * group) * hd;
          float *out = a.out + (qi * a.n_head + kvh * group) * hd;
          // Causal: only the visible prefix takes part, so a query's result does not depend on how
          // many queries share the batch (bit for bit; speculative decoding relies on it). With a
          // mask: keys up to the last visible one, of which the first `lead` are all visible (a
          // tree's cached prefix).
          const uint8_t *mq = a.mask ? a.mask + qi * n_kv : nullptr;
          int64_t n_vis = n_kv - a.n_q + qi + 1, lead = n_vis;
          if (mq) {
            n_vis = n_kv;
            while (n_vis > 0 && mq[n_vis - 1] == 0) --n_vis;
            const void *hole = std::memchr(mq, 0, static_cast<size_t>(n_vis));
            lead = hole ? static_cast<const uint8_t *>(hole) - mq : n_vis;
          }
          const float *kh = a.k + kvh * hd, *vh = a.v + kvh * hd;
          const int64_t stride = static_cast<int64_t>(a.n_head_kv) * hd;
          if (n_vis > 0)
            v.scores(q, hd, group, kh, stride, n_vis, hd, a.scale, scores.data(), n_kv);
          for (int64_t h = 0; h < group; ++h) {
            float *sc = scores.data() + h * n_kv;
            // A masked query's visible scores are moved, in key order, to the front of its row, so
            // max and exp_sub_sum see exactly the contiguous scores plain decoding sees for the
            // same keys (a tree path: the prefix, the ancestors, the query): the same vector lanes,
            // the same summation order, bit for bit. They go back to their slots afterwards.
            int64_t n_soft = lead;
            for (int64_t j = lead; j < n_vis; ++j)
              if (mq[j] != 0) sc[n_soft++] = sc[j];
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < n_soft; ++j) m = sc[j] > m ? sc[j] : m;
            if (m == -std::numeric_limits<float>::infinity()) {  // nothing visible (or NaN): zeros
              for (int64_t j = 0; j < n_vis; ++j) sc[j] = 0.0f;
              continue;
            }
            const float inv = 1.0f / v.exp_sub_sum(sc, m, n_soft);
            for (int64_t j = 0; j < n_soft; ++j) sc[j] *= inv;
            // Back to the key slots, from the end (t <= j), 0 where masked.
            for (int64_t j = n_vis - 1, t = n_soft - 1; j >= lead; --j)
              sc[j] = mq[j] != 0 ? sc[t--] : 0.0f;
          }
          v.weighted_sum(scores.data(), n_kv, group, vh, stride, n_vis, hd, out, hd);
        }
      });
}

}  // namespace specinfer
