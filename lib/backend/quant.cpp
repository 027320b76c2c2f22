// Scalar definitions of the block formats: conversions, sizes, reference dequantizers, activation
// quantization. Written for clarity; these are the oracle the SIMD kernels are tested against.
#include "backend/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace specinfer {

float fp16_to_fp32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize the mantissa.
    int e = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++e;
    }
    mant &= 0x3FFu;
    bits = sign | (static_cast<uint32_t>(113 - e) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t fp32_to_fp16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) {  // inf or NaN (keep NaN quiet)
    return static_cast<uint16_t>(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // e in [102, 112] -> shift in [14, 24]
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1FFFu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

uint16_t fp32_to_bf16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

int64_t wtype_block_size(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
    case SPECINFER_WTYPE_F16:
    case SPECINFER_WTYPE_BF16:
      return 1;
    case SPECINFER_WTYPE_Q4_0:
    case SPECINFER_WTYPE_Q4_1:
    case SPECINFER_WTYPE_Q5_0:
    case SPECINFER_WTYPE_Q5_1:
    case SPECINFER_WTYPE_Q8_0:
    case SPECINFER_WTYPE_Q8_1:
      return kQK;
    case SPECINFER_WTYPE_Q2_K:
    case SPECINFER_WTYPE_Q3_K:
    case SPECINFER_WTYPE_Q4_K:
    case SPECINFER_WTYPE_Q5_K:
    case SPECINFER_WTYPE_Q6_K:
    case SPECINFER_WTYPE_Q8_K:
      return kQKK;
    default:
      return 0;
  }
}

size_t wtype_block_bytes(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      return 4;
    case SPECINFER_WTYPE_F16:
      return 2;
    case SPECINFER_WTYPE_BF16:
      return 2;
    case SPECINFER_WTYPE_Q4_0:
      return sizeof(BlockQ4_0);
    case SPECINFER_WTYPE_Q4_1:
      return sizeof(BlockQ4_1);
    case SPECINFER_WTYPE_Q5_0:
      return sizeof(BlockQ5_0);
    case SPECINFER_WTYPE_Q5_1:
      return sizeof(BlockQ5_1);
    case SPECINFER_WTYPE_Q8_0:
      return sizeof(BlockQ8_0);
    case SPECINFER_WTYPE_Q8_1:
      return sizeof(BlockQ8_1);
    case SPECINFER_WTYPE_Q2_K:
      return sizeof(BlockQ2_K);
    case SPECINFER_WTYPE_Q3_K:
      return sizeof(BlockQ3_K);
    case SPECINFER_WTYPE_Q4_K:
      return sizeof(BlockQ4_K);
    case SPECINFER_WTYPE_Q5_K:
      return sizeof(BlockQ5_K);
    case SPECINFER_WTYPE_Q6_K:
      return sizeof(BlockQ6_K);
    case SPECINFER_WTYPE_Q8_K:
      return sizeof(BlockQ8_K);
    default:
      return 0;
  }
}

size_t wtype_row_size(int32_t wtype, int64_t n_cols) noexcept {
  const int64_t bs = wtype_block_size(wtype);
  if (bs == 0 || n_cols <= 0 || n_cols % bs != 0) return 0;
  return static_cast<size_t>(n_cols / bs) * wtype_block_bytes(wtype);
}

const char *wtype_name(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      return "f32";
    case SPECINFER_WTYPE_F16:
      return "f16";
    case SPECINFER_WTYPE_BF16:
      return "bf16";
    case SPECINFER_WTYPE_Q4_0:
      return "q4_0";
    case SPECINFER_WTYPE_Q4_1:
      return "q4_1";
    case SPECINFER_WTYPE_Q5_0:
      return "q5_0";
    case SPECINFER_WTYPE_Q5_1:
      return "q5_1";
    case SPECINFER_WTYPE_Q8_0:
      return "q8_0";
    case SPECINFER_WTYPE_Q8_1:
      return "q8_1";
    case SPECINFER_WTYPE_Q2_K:
      return "q2_K";
    case SPECINFER_WTYPE_Q3_K:
      return "q3_K";
    case SPECINFER_WTYPE_Q4_K:
      return "q4_K";
    case SPECINFER_WTYPE_Q5_K:
      return "q5_K";
    case SPECINFER_WTYPE_Q6_K:
      return "q6_K";
    case SPECINFER_WTYPE_Q8_K:
      return "q8_K";
    default:
      return "unknown";
  }
}

void q3k_scales(const uint8_t *s, int8_t out[16]) noexcept {
  // Low 4 bits: bytes 0..7 (low nibble for groups 0..7, high nibble for 8..15); high 2 bits:
  // bytes 8..11, two bits per group at shift 2 * (group / 4).
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

namespace {

void deq_q4_0(const BlockQ4_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
      y[j + 16] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void deq_q4_1(const BlockQ4_1 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(b[i].qs[j] & 0x0F) + m;
      y[j + 16] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

uint32_t load_u32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

void deq_q5_0(const BlockQ5_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * static_cast<float>(lo - 16);
      y[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

void deq_q5_1(const BlockQ5_1 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * static_cast<float>(lo) + m;
      y[j + 16] = d * static_cast<float>(hi) + m;
    }
  }
}

void deq_q8_0(const BlockQ8_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void deq_q8_1(const BlockQ8_1 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

// Q2_K: each 128-value half uses 32 bytes of qs; the 2-bit field at shift 2*k of byte l holds
// value 32*k + l (l < 32) of that half. Group g (16 values) has scale byte scales[g].
void deq_q2_k(const BlockQ2_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int v = 0; v < kQKK; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      const int q = (b[i].qs[32 * half + l] >> (2 * k)) & 3;
      const uint8_t sc = b[i].scales[v / 16];
      y[v] = d * static_cast<float>(sc & 0x0F) * static_cast<float>(q) -
             dmin * static_cast<float>(sc >> 4);
    }
    y += kQKK;
  }
}

// Q3_K: low 2 bits as in Q2_K; the high bit of value v is bit (v / 32) of hmask[v % 32]; a clear
// high bit means q - 4.
void deq_q3_k(const BlockQ3_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int8_t sc[16];
    q3k_scales(b[i].scales, sc);
    for (int v = 0; v < kQKK; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      const int lo = (b[i].qs[32 * half + l] >> (2 * k)) & 3;
      const int hbit = (b[i].hmask[l] >> (v / 32)) & 1;
      y[v] = d * static_cast<float>(sc[v / 16]) * static_cast<float>(lo - (hbit ? 0 : 4));
    }
    y += kQKK;
  }
}

// Q4_K: each 64 values use 32 bytes: low nibbles are the first 32 (group 2p), high the next 32
// (group 2p+1).
void deq_q4_k(const BlockQ4_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int g = 0; g < 8; ++g) {
      uint8_t sc, m;
      kquant_scale_min(g, b[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const uint8_t *q = b[i].qs + 32 * (g / 2);
      for (int l = 0; l < 32; ++l) {
        const int v = (g % 2) ? (q[l] >> 4) : (q[l] & 0x0F);
        y[32 * g + l] = dl * static_cast<float>(v) - ml;
      }
    }
    y += kQKK;
  }
}

// Q5_K: as Q4_K plus the fifth bit of value v: bit g (= v / 32) of qh[v % 32].
void deq_q5_k(const BlockQ5_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int g = 0; g < 8; ++g) {
      uint8_t sc, m;
      kquant_scale_min(g, b[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const uint8_t *q = b[i].qs + 32 * (g / 2);
      for (int l = 0; l < 32; ++l) {
        int v = (g % 2) ? (q[l] >> 4) : (q[l] & 0x0F);
        v |= ((b[i].qh[l] >> g) & 1) << 4;
        y[32 * g + l] = dl * static_cast<float>(v) - ml;
      }
    }
    y += kQKK;
  }
}

// Q6_K: per 128-value half: ql 64 bytes, qh 32 bytes. Value 32*k + l (k < 4, l < 32) of the half
// takes its low 4 bits from ql[l + 32 * (k & 1)] (low nibble for k < 2, high for k >= 2) and its
// high 2 bits from qh[l] at shift 2*k.
void deq_q6_k(const BlockQ6_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int v = 0; v < kQKK; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      const uint8_t lb = b[i].ql[64 * half + l + 32 * (k & 1)];
      const int lo = k < 2 ? (lb & 0x0F) : (lb >> 4);
      const int hi = (b[i].qh[32 * half + l] >> (2 * k)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      y[v] = d * static_cast<float>(b[i].scales[v / 16]) * static_cast<float>(q);
    }
    y += kQKK;
  }
}

void deq_q8_k(const BlockQ8_K *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    for (int j = 0; j < kQKK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

}  // namespace

void dequantize_row_ref(int32_t wtype, const void *src, float *dst, int64_t n) {
  const int64_t bs = wtype_block_size(wtype);
  if (bs == 0) fail(SPECINFER_ERR_UNSUPPORTED, "dequantize: unknown weight type %d", wtype);
  if (n < 0 || n % bs != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "dequantize: %lld values is not a multiple of %lld (%s)",
         static_cast<long long>(n), static_cast<long long>(bs), wtype_name(wtype));
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "dequantize: NULL");
  const int64_t nb = n / bs;
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case SPECINFER_WTYPE_F16: {
      const auto *h = static_cast<const uint16_t *>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case SPECINFER_WTYPE_BF16: {
      const auto *h = static_cast<const uint16_t *>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case SPECINFER_WTYPE_Q4_0:
      return deq_q4_0(static_cast<const BlockQ4_0 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q4_1:
      return deq_q4_1(static_cast<const BlockQ4_1 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q5_0:
      return deq_q5_0(static_cast<const BlockQ5_0 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q5_1:
      return deq_q5_1(static_cast<const BlockQ5_1 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q8_0:
      return deq_q8_0(static_cast<const BlockQ8_0 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q8_1:
      return deq_q8_1(static_cast<const BlockQ8_1 *>(src), dst, nb);
    case SPECINFER_WTYPE_Q2_K:
      return deq_q2_k(static_cast<const BlockQ2_K *>(src), dst, nb);
    case SPECINFER_WTYPE_Q3_K:
      return deq_q3_k(static_cast<const BlockQ3_K *>(src), dst, nb);
    case SPECINFER_WTYPE_Q4_K:
      return deq_q4_k(static_cast<const BlockQ4_K *>(src), dst, nb);
    case SPECINFER_WTYPE_Q5_K:
      return deq_q5_k(static_cast<const BlockQ5_K *>(src), dst, nb);
    case SPECINFER_WTYPE_Q6_K:
      return deq_q6_k(static_cast<const BlockQ6_K *>(src), dst, nb);
    case SPECINFER_WTYPE_Q8_K:
      return deq_q8_k(static_cast<const BlockQ8_K *>(src), dst, nb);
    default:
      break;
  }
  fail(SPECINFER_ERR_UNSUPPORTED, "dequantize: unsupported weight type %d", wtype);
}

namespace {

// Q4_0 block: value = d * (q - 8), q in 0..15. Start from d = m / -8 (m: the value of largest
// magnitude, sign kept, so that it lands on the wider negative end of the grid), then refit twice:
// the least-squares scale for the current levels, sum x (q - 8) / sum (q - 8)^2, and new levels for
// it; keep the scale with the least squared error. (The start alone loads a draft faster, but the
// re-quantized Qwen2.5 0.5B then agrees less with the target: HumanEval acceptance 0.806 against
// 0.855 with the refits, the same as the file's Q5_0; a search over 11 scales per block gives
// 0.851 and loads far slower.) Returns false for inf or NaN.
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: round to nearest even, vectorizable

// Levels for scale d (1 / d = id) and their squared error; also the sums a least-squares refit
// needs.
float q4_0_levels(const float *x, float d, float id, float *q, float *sxq, float *sqq) {
  float err = 0.0f, a = 0.0f, b = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float v = (x[j] * id + kMagic) - kMagic + 8.0f;
    q[j] = v < 0.0f ? 0.0f : (v > 15.0f ? 15.0f : v);
    const float l = q[j] - 8.0f, e = x[j] - d * l;
    err += e * e;
    a += x[j] * l;
    b += l * l;
  }
  *sxq = a;
  *sqq = b;
  return err;
}

bool quantize_block_q4_0(const float *x, BlockQ4_0 *out) noexcept {
  float m = 0.0f, amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (!std::isfinite(x[j])) return false;
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  float q[kQK] = {};
  uint16_t best = 0;
  if (amax > 0.0f) {
    float best_err = std::numeric_limits<float>::infinity(), d_next = m / -8.0f;
    for (int iter = 0; iter < 3; ++iter) {
      const uint16_t dh = fp32_to_fp16(d_next);
      const float d = fp16_to_fp32(dh);
      if (!(d != 0.0f) || !std::isfinite(d)) break;
      float qc[kQK], sxq, sqq;
      const float err = q4_0_levels(x, d, 1.0f / d, qc, &sxq, &sqq);
      if (err < best_err) {
        best_err = err;
        best = dh;
        std::memcpy(q, qc, sizeof q);
      }
      if (!(sqq > 0.0f)) break;
      d_next = sxq / sqq;
    }
  }
  out->d = best;
  for (int j = 0; j < 16; ++j)
    out->qs[j] = static_cast<uint8_t>(static_cast<int>(q[j]) | (static_cast<int>(q[j + 16]) << 4));
  return true;
}

// quantize_block_q4_0 on kLanes consecutive blocks at once, every value finite: lane l does block
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
float &lane(Vec4 *v, int l) noexcept {
  return v[l / 4][l % 4];
}

// xt[j][h] = values j of blocks 4h..4h+3 (4 x 4 transposes of the blocks' rows).
void transpose_blocks(const float *x, Vec4 (*xt)[kVecs]) noexcept {
  for (int h = 0; h < kVecs; ++h)
    for (int j = 0; j < kQK; j += 4) {
      Vec4 r[4];
      for (int b = 0; b < 4; ++b) std::memcpy(&r[b], x + (4 * h + b) * kQK + j, sizeof(Vec4));
      const Vec4 t0 = __builtin_shuffle(r[0], r[1], Mask4{0, 4, 1, 5}),
                 t1 = __builtin_shuffle(r[0], r[1], Mask4{2, 6, 3, 7}),
                 t2 = __builtin_shuffle(r[2], r[3], Mask4{0, 4, 1, 5}),
                 t3 = __builtin_shuffle(r[2], r[3], Mask4{2, 6, 3, 7});
      xt[j][h] = __builtin_shuffle(t0, t2, Mask4{0, 1, 4, 5});
      xt[j + 1][h] = __builtin_shuffle(t0, t2, Mask4{2, 3, 6, 7});
      xt[j + 2][h] = __builtin_shuffle(t1, t3, Mask4{0, 1, 4, 5});
      xt[j + 3][h] = __builtin_shuffle(t1, t3, Mask4{2, 3, 6, 7});
    }
}

void quantize_blocks_q4_0(const float *x, BlockQ4_0 *out) noexcept {
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
  const Vec4 zero = splat(0.0f), fifteen = splat(15.0f), eight = splat(8.0f), magic = splat(kMagic);
  Vec4 q[kQK][kVecs], qc[kQK][kVecs];
  for (auto &row : q)
    for (Vec4 &v : row) v = zero;
  float best_err[kLanes], d_next[kLanes];
  uint16_t best[kLanes] = {}, dh[kLanes] = {};
  bool active[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    active[l] = amax[l] > 0.0f;
    best_err[l] = std::numeric_limits<float>::infinity();
    d_next[l] = m[l] / -8.0f;
  }
  for (int iter = 0; iter < 3; ++iter) {
    bool any = false;
    Vec4 d[kVecs], id[kVecs];
    for (int l = 0; l < kLanes; ++l) {
      float dl = 1.0f;  // a lane that is done computes on a harmless scale
      if (active[l]) {
        dh[l] = fp32_to_fp16(d_next[l]);
        dl = fp16_to_fp32(dh[l]);
        active[l] = dl != 0.0f && std::isfinite(dl);
        if (!active[l]) dl = 1.0f;
      }
      lane(d, l) = dl;
      lane(id, l) = 1.0f / dl;
      any = any || active[l];
    }
    if (!any) break;
    Vec4 err[kVecs], sxq[kVecs], sqq[kVecs];
    for (int h = 0; h < kVecs; ++h) err[h] = sxq[h] = sqq[h] = zero;
    for (int j = 0; j < kQK; ++j)
      for (int h = 0; h < kVecs; ++h) {
        const Vec4 x4 = xt[j][h], v = (x4 * id[h] + magic) - magic + eight;
        const Vec4 c = v > fifteen ? fifteen : v;
        qc[j][h] = v < zero ? zero : c;
        const Vec4 lv = qc[j][h] - eight, e = x4 - d[h] * lv;
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
    out[l].d = best[l];
    for (int j = 0; j < 16; ++j)
      out[l].qs[j] = static_cast<uint8_t>(static_cast<int>(lane(q[j], l)) |
                                          (static_cast<int>(lane(q[j + 16], l)) << 4));
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
  if (wtype != SPECINFER_WTYPE_Q4_0 && wtype != SPECINFER_WTYPE_Q8_0)
    fail(SPECINFER_ERR_UNSUPPORTED, "quantize: cannot quantize to %s (supported: q4_0, q8_0)",
         wtype_block_size(wtype) ? wtype_name(wtype) : "an unknown type");
  if (n < 0 || n % kQK != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: %lld values is not a multiple of 32 (%s)",
         static_cast<long long>(n), wtype_name(wtype));
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: NULL");
  int64_t b = 0;
  if (wtype == SPECINFER_WTYPE_Q4_0 && all_finite(src, n)) {
    auto *q = static_cast<BlockQ4_0 *>(dst);
    for (; b + kLanes <= n / kQK; b += kLanes) quantize_blocks_q4_0(src + b * kQK, q + b);
    if (b < n / kQK) {  // the last blocks among all-zero ones, which quantize to d = 0
      const int64_t rest = n / kQK - b;
      float tail[kLanes * kQK] = {};
      BlockQ4_0 tail_q[kLanes];
      std::memcpy(tail, src + b * kQK, sizeof(float) * size_t(rest * kQK));
      quantize_blocks_q4_0(tail, tail_q);
      std::memcpy(q + b, tail_q, sizeof(BlockQ4_0) * size_t(rest));
    }
    return;
  }
  for (; b < n / kQK; ++b) {
    const bool ok = wtype == SPECINFER_WTYPE_Q4_0
                        ? quantize_block_q4_0(src + b * kQK, static_cast<BlockQ4_0 *>(dst) + b)
                        : quantize_block_q8_0(src + b * kQK, static_cast<BlockQ8_0 *>(dst) + b);
    if (!ok)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "quantize: value %lld..%lld holds inf or NaN",
           static_cast<long long>(b * kQK), static_cast<long long>(b * kQK + kQK - 1));
  }
}

ActKind act_kind(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_Q4_0:
    case SPECINFER_WTYPE_Q4_1:
    case SPECINFER_WTYPE_Q5_0:
    case SPECINFER_WTYPE_Q5_1:
    case SPECINFER_WTYPE_Q8_0:
    case SPECINFER_WTYPE_Q8_1:
      return ActKind::q8;
    case SPECINFER_WTYPE_Q2_K:
    case SPECINFER_WTYPE_Q3_K:
    case SPECINFER_WTYPE_Q4_K:
    case SPECINFER_WTYPE_Q5_K:
    case SPECINFER_WTYPE_Q6_K:
    case SPECINFER_WTYPE_Q8_K:
      return ActKind::q8k;
    default:
      return ActKind::f32;
  }
}

namespace {
// Shared by both formats so that every instruction set sees identical int8 activations:
// d = amax / 127, q = round-to-nearest-even(x * (127 / amax)). A block holding inf or NaN gets
// d = NaN, so the outputs it touches are NaN (as a float product would be) instead of garbage.
inline float quantize_group(const float *x, int n, int8_t *q) noexcept {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
    finite &= x[j] - x[j] == 0.0f;  // false for inf and NaN
  }
  if (!finite) {
    std::memset(q, 0, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();  // a NaN / inf input poisons the block
  }
  if (!(amax > 0.0f)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float id = 127.0f / amax;
  // Round to nearest even by the 1.5 * 2^23 trick: exact for |v| <= 2^22 and identical to
  // nearbyint in the default rounding mode, but vectorizable and free of libm calls.
  constexpr float kMagic = 12582912.0f;
  for (int j = 0; j < n; ++j) {
    const float v = (x[j] * id + kMagic) - kMagic;
    q[j] = static_cast<int8_t>(static_cast<int>(v));
  }
  return amax / 127.0f;
}
}  // namespace

void quantize_act_q8(const float *x, ActQ8 *out, int64_t n) noexcept {
  for (int64_t b = 0; b < n / kQK; ++b) {
    out[b].d = quantize_group(x + b * kQK, kQK, out[b].qs);
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += out[b].qs[j];
    out[b].sum = s;
  }
}

void quantize_act_q8k(const float *x, ActQ8K *out, int64_t n) noexcept {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    out[b].d = quantize_group(x + b * kQKK, kQKK, out[b].qs);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += out[b].qs[16 * g + j];
      out[b].bsums[g] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace specinfer
