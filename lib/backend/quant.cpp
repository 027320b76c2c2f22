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
    case SPECINFER_WTYPE_Q3_0:
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
    case SPECINFER_WTYPE_Q3_0:
      return sizeof(BlockQ3_0);
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
    case SPECINFER_WTYPE_Q3_0:
      return "q3_0";
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

void deq_q3_0(const BlockQ3_0 *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(q3_0_value(b[i], j) - 4);
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
    case SPECINFER_WTYPE_Q3_0:
      return deq_q3_0(static_cast<const BlockQ3_0 *>(src), dst, nb);
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

ActKind act_kind(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_Q3_0:
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
