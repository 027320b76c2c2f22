// Quantization of float rows to Q4_0, Q3_0 and Q8_0 (quantize_row_ref): a draft model's weights
// re-quantized at load, and the KV cache's q4_0 / q8_0 rows. A file of its own because it is one
// of the weight-streaming kernels (lib/CMakeLists.txt): unchecked in the library under the
// sanitizers, checked in its own test.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/quant.h"
#include "util/error.h"

namespace specinfer {

namespace {

// Q4_0 block: value = d * (q - 8), q in 0..15 (Q3_0: d * (q - 4), q in 0..7; kHalf = 8 or 4
// below). Start from d = m / -kHalf (m: the value of largest magnitude, sign kept, so that it lands
// on the wider negative end of the grid), then refit twice: the least-squares scale for the current
// levels, sum x (q - kHalf) / sum (q - kHalf)^2, and new levels for it; keep the scale with the
// least squared error. (The start alone loads a draft faster, but the re-quantized Qwen2.5 0.5B
// then agrees less with the target: HumanEval acceptance 0.806 against 0.855 with the refits, the
// same as the file's Q5_0; a search over 11 scales per block gives 0.851 and loads far slower.)
// Returns false for inf or NaN.
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: round to nearest even, vectorizable

// Levels for scale d (1 / d = id) and their squared error; also the sums a least-squares refit
// needs.
template <int kHalf>
float block_levels(const float *x, float d, float id, float *q, float *sxq, float *sqq) {
  constexpr float kTop = 2 * kHalf - 1;
  float err = 0.0f, a = 0.0f, b = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float v = (x[j] * id + kMagic) - kMagic + kHalf;
    q[j] = v < 0.0f ? 0.0f : (v > kTop ? kTop : v);
    const float l = q[j] - kHalf, e = x[j] - d * l;
    err += e * e;
    a += x[j] * l;
    b += l * l;
  }
  *sxq = a;
  *sqq = b;
  return err;
}

// The 32 levels (0 .. 2 kHalf - 1, as floats) and the fp16 scale of one block; false for inf or
// NaN.
template <int kHalf>
bool quantize_block_levels(const float *x, uint16_t *d_out, float *q) noexcept {
  float m = 0.0f, amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (!std::isfinite(x[j])) return false;
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  for (int j = 0; j < kQK; ++j) q[j] = 0.0f;
  uint16_t best = 0;
  if (amax > 0.0f) {
    float best_err = std::numeric_limits<float>::infinity(), d_next = m / -float(kHalf);
    for (int iter = 0; iter < 3; ++iter) {
      const uint16_t dh = fp32_to_fp16(d_next);
      const float d = fp16_to_fp32(dh);
      if (!(d != 0.0f) || !std::isfinite(d)) break;
      float qc[kQK], sxq, sqq;
      const float err = block_levels<kHalf>(x, d, 1.0f / d, qc, &sxq, &sqq);
      if (err < best_err) {
        best_err = err;
        best = dh;
        std::memcpy(q, qc, sizeof qc);
      }
      if (!(sqq > 0.0f)) break;
      d_next = sxq / sqq;
    }
  }
  *d_out = best;
  return true;
}

// A block's levels (floats 0..15, 0..7) in the file layouts.
void store_block(const float *q, uint16_t d, BlockQ4_0 *out) noexcept {
  out->d = d;
  for (int j = 0; j < 16; ++j)
    out->qs[j] = static_cast<uint8_t>(static_cast<int>(q[j]) | (static_cast<int>(q[j + 16]) << 4));
}
void store_block(const float *q, uint16_t d, BlockQ3_0 *out) noexcept {
  out->d = d;
  std::memset(out->qs, 0, sizeof out->qs);
  std::memset(out->qh, 0, sizeof out->qh);
  for (int j = 0; j < kQK; ++j) q3_0_set(*out, j, static_cast<int>(q[j]));
}

// quantize_block_levels on kLanes consecutive blocks at once, every value finite: lane l does block
// l's arithmetic in the same order as the one-block function (its sums stay sequential over the
// block's 32 values), so the results are identical, while the lanes' independent sums run as
// vectors (GCC's vector extension: element-wise IEEE arithmetic, SSE2 on any x86-64). A draft
// model's weights re-quantize several times faster than block by block.
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));
constexpr int kVecs = 2, kLanes = 4 * kVecs;

typedef int32_t Mask4 __attribute__((vector_size(4 * sizeof(int32_t))));

Vec4 splat(float v) noexcept {
  return Vec4{v, v, v, v};
}
float lane(const Vec4 *v, int l) noexcept {
  return v[l / 4][l % 4];
}
void set_lane(Vec4 *v, int l, float x) noexcept {
  v[l / 4][l % 4] = x;
}

// xt[j][h] = values j of blocks 4h..4h+3 (4 x 4 transposes of the blocks' rows).
void transpose_blocks(const float *x, Vec4 (*xt)[kVecs]) noexcept {
  for (int h = 0; h < kVecs; ++h)
    for (int j = 0; j < kQK; j += 4) {
      Vec4 r[4];
      for (int b = 0; b < 4; ++b) std::memcpy(&r[b], x + (4 * h + b) * kQK + j, sizeof(Vec4));
      const Vec4 t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5),
                 t1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7),
                 t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5),
                 t3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
      xt[j][h] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
      xt[j + 1][h] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
      xt[j + 2][h] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
      xt[j + 3][h] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
    }
}

template <int kHalf, class Block>
void quantize_blocks(const float *x, Block *out) noexcept {
  Vec4 xt[kQK][kVecs];  // lane l of xt[j]: value j of block l
  transpose_blocks(x, xt);
  // The value of largest magnitude, sign kept (the first of equals, as the one-block function).
  Vec4 mv[kVecs], av[kVecs];
  for (int h = 0; h < kVecs; ++h) {
    mv[h] = av[h] = splat(0.0f);
    for (int j = 0; j < kQK; ++j) {
      const Vec4 a = reinterpret_cast<Vec4>(reinterpret_cast<Mask4>(xt[j][h]) & 0x7fffffff);
      const Mask4 gt = a > av[h];
      mv[h] = gt ? xt[j][h] : mv[h];
      av[h] = gt ? a : av[h];
    }
  }
  float m[kLanes], amax[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    m[l] = lane(mv, l);
    amax[l] = lane(av, l);
  }
  const Vec4 zero = splat(0.0f), top = splat(2 * kHalf - 1), half = splat(kHalf),
             magic = splat(kMagic);
  Vec4 q[kQK][kVecs], qc[kQK][kVecs];
  for (auto &row : q)
    for (Vec4 &v : row) v = zero;
  float best_err[kLanes], d_next[kLanes];
  uint16_t best[kLanes] = {}, dh[kLanes] = {};
  bool active[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    active[l] = amax[l] > 0.0f;
    best_err[l] = std::numeric_limits<float>::infinity();
    d_next[l] = m[l] / -float(kHalf);
  }
  for (int iter = 0; iter < 3; ++iter) {
    bool any = false;
    Vec4 d[kVecs] = {}, id[kVecs] = {};
    for (int l = 0; l < kLanes; ++l) {
      float dl = 1.0f;  // a lane that is done computes on a harmless scale
      if (active[l]) {
        dh[l] = fp32_to_fp16(d_next[l]);
        dl = fp16_to_fp32(dh[l]);
        active[l] = dl != 0.0f && std::isfinite(dl);
        if (!active[l]) dl = 1.0f;
      }
      set_lane(d, l, dl);
      set_lane(id, l, 1.0f / dl);
      any = any || active[l];
    }
    if (!any) break;
    Vec4 err[kVecs], sxq[kVecs], sqq[kVecs];
    for (int h = 0; h < kVecs; ++h) err[h] = sxq[h] = sqq[h] = zero;
    for (int j = 0; j < kQK; ++j)
      for (int h = 0; h < kVecs; ++h) {
        const Vec4 x4 = xt[j][h], v = (x4 * id[h] + magic) - magic + half;
        const Vec4 c = v > top ? top : v;
        qc[j][h] = v < zero ? zero : c;
        const Vec4 lv = qc[j][h] - half, e = x4 - d[h] * lv;
        err[h] += e * e;
        sxq[h] += x4 * lv;
        sqq[h] += lv * lv;
      }
    Mask4 take[kVecs];
    for (int l = 0; l < kLanes; ++l) {
      const bool t = active[l] && lane(err, l) < best_err[l];
      take[l / 4][l % 4] = t ? -1 : 0;
      if (t) {
        best_err[l] = lane(err, l);
        best[l] = dh[l];
      }
      active[l] = active[l] && lane(sqq, l) > 0.0f;
      if (active[l]) d_next[l] = lane(sxq, l) / lane(sqq, l);
    }
    for (int j = 0; j < kQK; ++j)
      for (int h = 0; h < kVecs; ++h) q[j][h] = take[h] != 0 ? qc[j][h] : q[j][h];
  }
  for (int l = 0; l < kLanes; ++l) {
    float ql[kQK];
    for (int j = 0; j < kQK; ++j) ql[j] = lane(q[j], l);
    store_block(ql, best[l], out + l);
  }
}

// Blocks [b, n / 32) of a row of finite values, kLanes at a time (quantize_blocks) and the last
// ones among all-zero blocks, which quantize to d = 0.
template <int kHalf, class Block>
void quantize_finite(const float *src, Block *q, int64_t n) noexcept {
  int64_t b = 0;
  for (; b + kLanes <= n / kQK; b += kLanes) quantize_blocks<kHalf>(src + b * kQK, q + b);
  if (b < n / kQK) {
    const int64_t rest = n / kQK - b;
    float tail[kLanes * kQK] = {};
    Block tail_q[kLanes];
    std::memcpy(tail, src + b * kQK, sizeof(float) * size_t(rest * kQK));
    quantize_blocks<kHalf>(tail, tail_q);
    std::memcpy(q + b, tail_q, sizeof(Block) * size_t(rest));
  }
}

bool all_finite(const float *x, int64_t n) noexcept {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

// Q8_0 block: value = d * q, d = amax / 127, q = round(x / d).
bool quantize_block_q8_0(const float *x, BlockQ8_0 *out) noexcept {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (!std::isfinite(x[j])) return false;
    amax = std::max(amax, std::fabs(x[j]));
  }
  const uint16_t dh = fp32_to_fp16(amax / 127.0f);
  const float d = fp16_to_fp32(dh);
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  out->d = dh;
  for (int j = 0; j < kQK; ++j) {
    const float v = std::nearbyint(x[j] * id);
    out->qs[j] = static_cast<int8_t>(v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v));
  }
  return true;
}

}  // namespace

void quantize_row_ref(int32_t wtype, const float *src, void *dst, int64_t n) {
  if (wtype != SPECINFER_WTYPE_Q4_0 && wtype != SPECINFER_WTYPE_Q3_0 &&
      wtype != SPECINFER_WTYPE_Q8_0)
    fail(SPECINFER_ERR_UNSUPPORTED, "quantize: cannot quantize to %s (supported: q4_0, q3_0, q8_0)",
         wtype_block_size(wtype) ? wtype_name(wtype) : "an unknown type");
  if (n < 0 || n % kQK != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: %lld values is not a multiple of 32 (%s)",
         static_cast<long long>(n), wtype_name(wtype));
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: NULL");
  if (wtype != SPECINFER_WTYPE_Q8_0 && all_finite(src, n)) {
    if (wtype == SPECINFER_WTYPE_Q4_0)
      quantize_finite<8>(src, static_cast<BlockQ4_0 *>(dst), n);
    else
      quantize_finite<4>(src, static_cast<BlockQ3_0 *>(dst), n);
    return;
  }
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float *x = src + b * kQK;
    bool ok = true;
    float q[kQK];
    uint16_t d = 0;
    if (wtype == SPECINFER_WTYPE_Q8_0) {
      ok = quantize_block_q8_0(x, static_cast<BlockQ8_0 *>(dst) + b);
    } else if (wtype == SPECINFER_WTYPE_Q4_0) {
      ok = quantize_block_levels<8>(x, &d, q);
      if (ok) store_block(q, d, static_cast<BlockQ4_0 *>(dst) + b);
    } else {
      ok = quantize_block_levels<4>(x, &d, q);
      if (ok) store_block(q, d, static_cast<BlockQ3_0 *>(dst) + b);
    }
    if (!ok)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: value %lld..%lld holds inf or NaN",
           static_cast<long long>(b * kQK), static_cast<long long>(b * kQK + kQK - 1));
  }
}

}  // namespace specinfer
