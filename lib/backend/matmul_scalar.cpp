// Scalar row kernels for every weight type: the portable fallback and the numerical model the SIMD
// kernels follow (same integer products with the same int8 activations, then float scaling).
#include <cstring>
#include <type_traits>

#include "backend/matmul.h"

namespace specinfer {

namespace {

// ---- float weights --------------------------------------------------------------------------

template <int32_t W>
float load_w(const uint8_t *row, int64_t c) {
  return float_elem_with<W>(row, c, fp16_to_fp32);
}

template <int32_t W>
void rows_float(const MatmulArgs &a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t t = 0; t < a.n_tok; ++t) {
      const float *x = a.x + t * a.n_cols;
      float s = 0.0f;
      for (int64_t c = 0; c < a.n_cols; ++c) s += load_w<W>(row, c) * x[c];
      a.y[t * a.n_rows + r] = s;
    }
  }
}

// ---- 32-value blocks: value = d * q + m ---------------------------------------------------

struct Unpacked32 {
  int8_t q[32];
  float d, m;
};

uint32_t le32(const uint8_t *p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

template <int32_t W>
void unpack32(const uint8_t *blk, Unpacked32 &u) {
  if constexpr (W == SPECINFER_WTYPE_Q3_0) {
    const auto *b = reinterpret_cast<const BlockQ3_0 *>(blk);
    for (int j = 0; j < 32; ++j) u.q[j] = static_cast<int8_t>(q3_0_value(*b, j) - 4);
    u.d = fp16_to_fp32(b->d);
    u.m = 0.0f;
  } else if constexpr (W == SPECINFER_WTYPE_Q4_0 || W == SPECINFER_WTYPE_Q4_1) {
    using B = std::conditional_t<W == SPECINFER_WTYPE_Q4_0, BlockQ4_0, BlockQ4_1>;
    const B *b = reinterpret_cast<const B *>(blk);
    const int off = W == SPECINFER_WTYPE_Q4_0 ? 8 : 0;
    for (int j = 0; j < 16; ++j) {
      u.q[j] = static_cast<int8_t>((b->qs[j] & 0x0F) - off);
      u.q[j + 16] = static_cast<int8_t>((b->qs[j] >> 4) - off);
    }
    u.d = fp16_to_fp32(b->d);
    if constexpr (W == SPECINFER_WTYPE_Q4_1)
      u.m = fp16_to_fp32(b->m);
    else
      u.m = 0.0f;
  } else if constexpr (W == SPECINFER_WTYPE_Q5_0 || W == SPECINFER_WTYPE_Q5_1) {
    using B = std::conditional_t<W == SPECINFER_WTYPE_Q5_0, BlockQ5_0, BlockQ5_1>;
    const B *b = reinterpret_cast<const B *>(blk);
    const int off = W == SPECINFER_WTYPE_Q5_0 ? 16 : 0;
    const uint32_t qh = le32(b->qh);
    for (int j = 0; j < 16; ++j) {
      u.q[j] = static_cast<int8_t>(((b->qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - off);
      u.q[j + 16] = static_cast<int8_t>(((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off);
    }
    u.d = fp16_to_fp32(b->d);
    if constexpr (W == SPECINFER_WTYPE_Q5_1)
      u.m = fp16_to_fp32(b->m);
    else
      u.m = 0.0f;
  } else {
    using B = std::conditional_t<W == SPECINFER_WTYPE_Q8_0, BlockQ8_0, BlockQ8_1>;
    const B *b = reinterpret_cast<const B *>(blk);
    std::memcpy(u.q, b->qs, 32);
    u.d = fp16_to_fp32(b->d);
    u.m = 0.0f;
  }
}

template <int32_t W>
void rows_q32(const MatmulArgs &a, int64_t r0, int64_t r1) {
  const int64_t nb = a.n_cols / kQK;
  const size_t bb = wtype_block_bytes(W);
  const auto *xq = static_cast<const ActQ8 *>(a.xq);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    float acc[16] = {};
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += 16) {
      const int64_t nt = a.n_tok - t0 < 16 ? a.n_tok - t0 : 16;
      for (int64_t t = 0; t < nt; ++t) acc[t] = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        Unpacked32 u;
        unpack32<W>(row + static_cast<size_t>(i) * bb, u);
        for (int64_t t = 0; t < nt; ++t) {
          const ActQ8 &x = xq[(t0 + t) * a.xq_blocks + i];
          int32_t s = 0;
          for (int j = 0; j < 32; ++j) s += static_cast<int32_t>(u.q[j]) * x.qs[j];
          acc[t] += u.d * x.d * static_cast<float>(s) + u.m * x.d * static_cast<float>(x.sum);
        }
      }
      for (int64_t t = 0; t < nt; ++t) a.y[(t0 + t) * a.n_rows + r] = acc[t];
    }
  }
}

// ---- 256-value super-blocks: value = d * sc[g] * q - dmin * mn[g], 16 groups of 16 ----------

struct Unpacked256 {
  int8_t q[256];
  int16_t sc[16], mn[16];
  float d, dmin;
};

template <int32_t W>
void unpack256(const uint8_t *blk, Unpacked256 &u) {
  if constexpr (W == SPECINFER_WTYPE_Q4_K || W == SPECINFER_WTYPE_Q5_K) {
    using B = std::conditional_t<W == SPECINFER_WTYPE_Q4_K, BlockQ4_K, BlockQ5_K>;
    const B *b = reinterpret_cast<const B *>(blk);
    for (int g = 0; g < 8; ++g) {
      uint8_t sc, m;
      kquant_scale_min(g, b->scales, &sc, &m);
      u.sc[2 * g] = u.sc[2 * g + 1] = sc;
      u.mn[2 * g] = u.mn[2 * g + 1] = m;
      const uint8_t *q = b->qs + 32 * (g / 2);
      for (int l = 0; l < 32; ++l) {
        int v = (g % 2) ? (q[l] >> 4) : (q[l] & 0x0F);
        if constexpr (W == SPECINFER_WTYPE_Q5_K) v |= ((b->qh[l] >> g) & 1) << 4;
        u.q[32 * g + l] = static_cast<int8_t>(v);
      }
    }
    u.d = fp16_to_fp32(b->d);
    u.dmin = fp16_to_fp32(b->dmin);
  } else if constexpr (W == SPECINFER_WTYPE_Q6_K) {
    const auto *b = reinterpret_cast<const BlockQ6_K *>(blk);
    for (int v = 0; v < 256; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      const uint8_t lb = b->ql[64 * half + l + 32 * (k & 1)];
      const int lo = k < 2 ? (lb & 0x0F) : (lb >> 4);
      const int hi = (b->qh[32 * half + l] >> (2 * k)) & 3;
      u.q[v] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
    for (int g = 0; g < 16; ++g) {
      u.sc[g] = b->scales[g];
      u.mn[g] = 0;
    }
    u.d = fp16_to_fp32(b->d);
    u.dmin = 0.0f;
  } else if constexpr (W == SPECINFER_WTYPE_Q2_K) {
    const auto *b = reinterpret_cast<const BlockQ2_K *>(blk);
    for (int v = 0; v < 256; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      u.q[v] = static_cast<int8_t>((b->qs[32 * half + l] >> (2 * k)) & 3);
    }
    for (int g = 0; g < 16; ++g) {
      u.sc[g] = b->scales[g] & 0x0F;
      u.mn[g] = b->scales[g] >> 4;
    }
    u.d = fp16_to_fp32(b->d);
    u.dmin = fp16_to_fp32(b->dmin);
  } else if constexpr (W == SPECINFER_WTYPE_Q3_K) {
    const auto *b = reinterpret_cast<const BlockQ3_K *>(blk);
    for (int v = 0; v < 256; ++v) {
      const int half = v / 128, k = (v % 128) / 32, l = v % 32;
      const int lo = (b->qs[32 * half + l] >> (2 * k)) & 3;
      const int hbit = (b->hmask[l] >> (v / 32)) & 1;
      u.q[v] = static_cast<int8_t>(lo - (hbit ? 0 : 4));
    }
    int8_t sc[16];
    q3k_scales(b->scales, sc);
    for (int g = 0; g < 16; ++g) {
      u.sc[g] = sc[g];
      u.mn[g] = 0;
    }
    u.d = fp16_to_fp32(b->d);
    u.dmin = 0.0f;
  } else {
    const auto *b = reinterpret_cast<const BlockQ8_K *>(blk);
    std::memcpy(u.q, b->qs, 256);
    for (int g = 0; g < 16; ++g) {
      u.sc[g] = 1;
      u.mn[g] = 0;
    }
    u.d = b->d;
    u.dmin = 0.0f;
  }
}

template <int32_t W>
void rows_q256(const MatmulArgs &a, int64_t r0, int64_t r1) {
  const int64_t nb = a.n_cols / kQKK;
  const size_t bb = wtype_block_bytes(W);
  const auto *xq = static_cast<const ActQ8K *>(a.xq);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t *row = a.w + static_cast<size_t>(r) * a.row_bytes;
    float acc[16] = {};
    for (int64_t t0 = 0; t0 < a.n_tok; t0 += 16) {
      const int64_t nt = a.n_tok - t0 < 16 ? a.n_tok - t0 : 16;
      for (int64_t t = 0; t < nt; ++t) acc[t] = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        Unpacked256 u;
        unpack256<W>(row + static_cast<size_t>(i) * bb, u);
        for (int64_t t = 0; t < nt; ++t) {
          const ActQ8K &x = xq[(t0 + t) * a.xq_blocks + i];
          int32_t isum = 0, msum = 0;
          for (int g = 0; g < 16; ++g) {
            int32_t s = 0;
            for (int l = 0; l < 16; ++l)
              s += static_cast<int32_t>(u.q[16 * g + l]) * x.qs[16 * g + l];
            isum += u.sc[g] * s;
            msum += u.mn[g] * x.bsums[g];
          }
          acc[t] += u.d * x.d * static_cast<float>(isum) - u.dmin * x.d * static_cast<float>(msum);
        }
      }
      for (int64_t t = 0; t < nt; ++t) a.y[(t0 + t) * a.n_rows + r] = acc[t];
    }
  }
}

}  // namespace

MatmulRowsFn matmul_kernel_scalar(int32_t wtype) noexcept {
  switch (wtype) {
    case SPECINFER_WTYPE_F32:
      return rows_float<SPECINFER_WTYPE_F32>;
    case SPECINFER_WTYPE_F16:
      return rows_float<SPECINFER_WTYPE_F16>;
    case SPECINFER_WTYPE_BF16:
      return rows_float<SPECINFER_WTYPE_BF16>;
    case SPECINFER_WTYPE_Q4_0:
      return rows_q32<SPECINFER_WTYPE_Q4_0>;
    case SPECINFER_WTYPE_Q3_0:
      return rows_q32<SPECINFER_WTYPE_Q3_0>;
    case SPECINFER_WTYPE_Q4_1:
      return rows_q32<SPECINFER_WTYPE_Q4_1>;
    case SPECINFER_WTYPE_Q5_0:
      return rows_q32<SPECINFER_WTYPE_Q5_0>;
    case SPECINFER_WTYPE_Q5_1:
      return rows_q32<SPECINFER_WTYPE_Q5_1>;
    case SPECINFER_WTYPE_Q8_0:
      return rows_q32<SPECINFER_WTYPE_Q8_0>;
    case SPECINFER_WTYPE_Q8_1:
      return rows_q32<SPECINFER_WTYPE_Q8_1>;
    case SPECINFER_WTYPE_Q2_K:
      return rows_q256<SPECINFER_WTYPE_Q2_K>;
    case SPECINFER_WTYPE_Q3_K:
      return rows_q256<SPECINFER_WTYPE_Q3_K>;
    case SPECINFER_WTYPE_Q4_K:
      return rows_q256<SPECINFER_WTYPE_Q4_K>;
    case SPECINFER_WTYPE_Q5_K:
      return rows_q256<SPECINFER_WTYPE_Q5_K>;
    case SPECINFER_WTYPE_Q6_K:
      return rows_q256<SPECINFER_WTYPE_Q6_K>;
    case SPECINFER_WTYPE_Q8_K:
      return rows_q256<SPECINFER_WTYPE_Q8_K>;
    default:
      return nullptr;
  }
}

}  // namespace specinfer
