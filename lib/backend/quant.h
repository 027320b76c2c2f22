// Weight block formats (GGUF / ggml numbering and byte layouts), fp16 / bf16 conversion, row sizes,
// the scalar reference dequantizers (the test oracle for every SIMD kernel) and the int8
// activation formats the quantized matmul kernels multiply with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "specinfer_plugin.h"

namespace specinfer {

// ---- half precision -------------------------------------------------------------------------

// IEEE binary16 <-> binary32, exact for every value (subnormals, inf, NaN); fp32 -> fp16 rounds
// to nearest even.
float fp16_to_fp32(uint16_t h) noexcept;
uint16_t fp32_to_fp16(float f) noexcept;
// bfloat16 is the top half of a binary32; fp32 -> bf16 rounds to nearest even (NaN stays NaN).
inline float bf16_to_fp32(uint16_t h) noexcept {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t fp32_to_bf16(float f) noexcept;

// Element c of a float-weight row of type W (F32, F16 or BF16), an F16 value converted by `f16`:
// fp16_to_fp32 in the scalar kernels, the F16C instruction in the x86 ones, which pass a lambda
// of their own so that their instantiation has internal linkage (simd_x86.h).
template <int32_t W, class F16>
inline float float_elem_with(const uint8_t *row, int64_t c, const F16 &f16) {
  if constexpr (W == SPECINFER_WTYPE_F32) {
    float f;
    std::memcpy(&f, row + 4 * c, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    if constexpr (W == SPECINFER_WTYPE_F16) {
      return f16(h);
    } else {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}

// ---- block layouts --------------------------------------------------------------------------
// All blocks are byte-packed exactly as in GGUF files; fp16 fields are stored as raw uint16_t.

constexpr int kQK = 32;    // values per block of the "legacy" formats
constexpr int kQKK = 256;  // values per super-block of the k-quants

#pragma pack(push, 1)
struct BlockQ4_0 {  // value = d * (q - 8), q = nibble; qs[j] low nibble -> j, high -> j + 16
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ3_0 {  // value = d * (q - 4), q = (qs[j % 8] >> 2 (j / 8)) & 3 | bit j of qh << 2
  uint16_t d;
  uint8_t qs[8];
  uint8_t qh[4];
};
struct BlockQ4_1 {  // value = d * q + m
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {  // value = d * (q - 16), q = nibble | bit j of qh << 4 (j + 16: bit j + 16)
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {  // value = d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {  // value = d * q
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ8_1 {  // value = d * q; s = d * sum(q) (unused by dequantization)
  uint16_t d, s;
  int8_t qs[32];
};
struct BlockQ2_K {  // 16 groups of 16: value = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {  // 16 groups of 16: value = d * (sc6 - 32) * (q2 | hbit << 2) - 4)
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {  // 8 groups of 32: value = d * sc6 * q - dmin * m6
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {  // as Q4_K with a fifth bit from qh
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {  // 16 groups of 16: value = d * sc8 * (q6 - 32)
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {  // value = d * q (d is a float)
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36 &&
              sizeof(BlockQ3_0) == 14);

// Value j (0..31, unsigned: 0..7) of a Q3_0 block, and setting it in a block whose bits for j are
// clear.
inline int q3_0_value(const BlockQ3_0 &b, int j) noexcept {
  return ((b.qs[j % 8] >> (2 * (j / 8))) & 3) | ((b.qh[j / 8] >> (j % 8)) & 1) << 2;
}
inline void q3_0_set(BlockQ3_0 &b, int j, int q) noexcept {
  b.qs[j % 8] = static_cast<uint8_t>(b.qs[j % 8] | (q & 3) << (2 * (j / 8)));
  b.qh[j / 8] = static_cast<uint8_t>(b.qh[j / 8] | ((q >> 2) & 1) << (j % 8));
}
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// ---- type traits ----------------------------------------------------------------------------

// Values per block (1 for float types); 0 if the type is unknown.
int64_t wtype_block_size(int32_t wtype) noexcept;
// Bytes per block; 0 if unknown.
size_t wtype_block_bytes(int32_t wtype) noexcept;
// Bytes of one row of n_cols values; 0 if unknown type or n_cols not a positive multiple of the
// block size.
size_t wtype_row_size(int32_t wtype, int64_t n_cols) noexcept;
// "q4_K", "f16", ...; "unknown" otherwise.
const char *wtype_name(int32_t wtype) noexcept;

// The 6-bit scale and min of group j (0..7) of a Q4_K / Q5_K super-block's 12 scale bytes.
inline void kquant_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) noexcept {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}
// The 16 signed scales (-32..31) of a Q3_K super-block.
void q3k_scales(const uint8_t *s12, int8_t out[16]) noexcept;

// Scalar reference dequantization of n values (a multiple of the block size). Throws
// specinfer::Error(INVALID_ARGUMENT / UNSUPPORTED) on a bad count or type.
void dequantize_row_ref(int32_t wtype, const void *src, float *dst, int64_t n);

// Quantizes n floats (a multiple of 32) to Q4_0 or Q8_0 (weights: a cheaper copy of a draft
// model). Q4_0: d = m / -8 (m the block's value of largest magnitude), refitted twice by least
// squares, the best of the three kept; Q8_0: d = amax / 127. Throws
// specinfer::Error: UNSUPPORTED for any other type, INVALID_ARGUMENT for a bad count, NULL, or a
// block holding inf or NaN.
void quantize_row_ref(int32_t wtype, const float *src, void *dst, int64_t n);

// ---- int8 activation formats ----------------------------------------------------------------
// The quantized matmul kernels multiply weight blocks with activations quantized once per call to
// one of these (every instruction set uses the same scalar-defined quantization, so the kernels
// agree up to float summation order).

struct ActQ8 {  // 32 values: x ~= d * qs
  float d;
  int32_t sum;  // sum of qs
  int8_t qs[32];
};
struct ActQ8K {  // 256 values: x ~= d * qs
  float d;
  int16_t bsums[16];  // sums of qs over each group of 16
  int8_t qs[256];
};

// The activation format a weight type's quantized kernels need.
enum class ActKind { f32, q8, q8k };
ActKind act_kind(int32_t wtype) noexcept;

// Quantizes n floats (a multiple of 32 / 256).
void quantize_act_q8(const float *x, ActQ8 *out, int64_t n) noexcept;
void quantize_act_q8k(const float *x, ActQ8K *out, int64_t n) noexcept;

}  // namespace specinfer
