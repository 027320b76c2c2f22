// Attention over a KV cache stored as f32, f16, q8_0 or q4_0 rows, or keys in Q8_0 tiles of 16
// positions: the kernels of each instruction set that read one storage type directly, and the
// conversion that writes it (kv_store).
//
// The driver (attention.cpp, reached through ops.h's attention()) runs a streaming softmax over
// blocks of kAttnBlock keys, and splits a query's keys into chunks of kAttnChunk whose partial
// results merge in key order: decode and short verify batches then parallelize over the sequence
// too, not only over the few key/value heads. The chunks and blocks are fixed by the number of
// keys a query sees, never by the batch or the thread count, so a query's result is the same bits
// whatever shares its call.
#pragma once

#include <cstdint>

#include "util/isa.h"

namespace specinfer {

constexpr int64_t kAttnBlock = 64;      // keys per streaming-softmax step
constexpr int64_t kAttnChunk = 512;     // keys per split-K partial (a multiple of kAttnBlock)
constexpr int64_t kKeyTileBlock = 544;  // bytes of a key tile's block: 16 scales, 16 x 32 values

// One instruction set's kernels over rows of a KV storage type (SPECINFER_WTYPE_F32, _F16, _Q8_0,
// _Q4_0), each row the head_dim values of one key or value head (row_size(type, hd) bytes). The
// SIMD sets need hd % 32 == 0 (the driver uses the scalar set otherwise); rows[j] is the j-th key
// in order, anywhere in memory, so that a tree's gathered keys take the path of contiguous ones.
struct AttnKernels {
  // s[h * s_stride + j] = dot(q + h * hd, row j) * scale, for h < g, j < n, and s_max[h] = the
  // largest of head h's n scores. A key's score never depends on n, g or the other rows.
  void (*scores)(int32_t type, const float *q, int64_t g, const uint8_t *const *rows, int64_t n,
                 int64_t hd, float scale, float *s, int64_t s_stride, float *s_max);
  // o[h * hd + d] += sum_j p[h * p_stride + j] * row_j[d], keys in order, for h < g.
  void (*accumulate)(int32_t type, const float *p, int64_t p_stride, int64_t g,
                     const uint8_t *const *rows, int64_t n, int64_t hd, float *o);
  // Scores of lanes [l0, l1) of one Q8_0 key tile (specinfer_key_tile_put's layout) for g query
  // rows rounded by quantize_query_q8 (row h: qs + h * hd, d and bias + h * hd / 32):
  // s[h * s_stride + l - l0] = score * scale, s_max[h] = the larger of itself and those scores.
  // A score is sum over blocks b in order of float(isum_b) * (d_key_b * d_query_b), each step one
  // fused multiply-add, isum_b the exact integer dot product: every set gives the same bits.
  void (*scores_tile)(const int8_t *qs, const float *d, const int32_t *bias, int64_t g,
                      const uint8_t *tile, int64_t hd, float scale, int l0, int l1, float *s,
                      int64_t s_stride, float *s_max);
};

// Rounds one query row of hd values (a multiple of 32) for key tiles: per block of 32, d = amax /
// 127 and qs = x / d rounded to nearest even; bias = -128 * the block's sum of qs (the tile stores
// key values plus 128).
void quantize_query_q8(const float *x, int64_t hd, int8_t *qs, float *d, int32_t *bias) noexcept;

const AttnKernels &attn_kernels_scalar() noexcept;  // the reference
const AttnKernels &attn_kernels_avx2() noexcept;
const AttnKernels &attn_kernels_avx512() noexcept;
const AttnKernels &attn_kernels(Isa isa) noexcept;

// True for the storage types attention reads: F32, F16, Q8_0, Q4_0.
bool kv_type_supported(int32_t type) noexcept;

// Writes n floats as row_size(type, n) bytes of a KV storage type: F32 copies, F16 rounds to
// nearest even, Q8_0 and Q4_0 quantize as quantize_row_ref. Throws specinfer::Error:
// UNSUPPORTED for another type, INVALID_ARGUMENT for a bad n, NULL, or inf / NaN in a block type.
void kv_store(int32_t type, const float *src, void *dst, int64_t n);

}  // namespace specinfer
