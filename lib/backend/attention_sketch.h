// Sketched attention's selector: keys kept as 1-bit QJL sketches (the library's qjl sketcher,
// lib/sketch) beside the KV cache, and each query's estimate of q.k for every key it sees, from
// which the attention driver (attention.cpp) picks the keys to attend to exactly.
//
// A key's sketch is its norm (float32) and the signs of S k, S a fixed Gaussian matrix of `bits`
// rows (orthogonalized in blocks of head_dim rows). QJL's estimate of q.k is
// sqrt(pi/2) / bits * |k| * sum_r sign((S k)_r) (S q)_r; the selector ranks keys by
// |k| * sum_r sign_r (S q)_r, the same order. The sum runs over lookup tables: for every four
// coordinates, the 16 signed sums of (S q) over them, indexed by the key's four sign bits. Every
// instruction set adds the same table entries in the same order, so their scores are equal bit
// for bit and so are the keys they pick.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/isa.h"

namespace specinfer {

constexpr int32_t kSketchMinBits = 32, kSketchMaxBits = 1024;

// True for a sketch size the kernels take: a multiple of 32 in [32, 1024].
bool sketch_bits_valid(int32_t bits) noexcept;
// Bytes of one key's sketch: 4 + bits / 8.
inline size_t key_sketch_bytes(int32_t bits) {
  return 4 + static_cast<size_t>(bits) / 8;
}

// Writes the sketches of n_rows keys of hd floats (row i at k + i * hd) to dst, back to back.
// Throws specinfer::Error INVALID_ARGUMENT for NULL, bad sizes or bits, or inf / NaN.
void key_sketch(const float *k, int64_t n_rows, int64_t hd, int32_t bits, void *dst);

// The lookup tables of g query heads (q + h * hd): tables[(h * bits / 4 + n) * 16 + v] is
// sum_{b < 4} (bit b of v ? +1 : -1) * (S q_h)_{4n + b}. g * bits * 4 floats.
void sketch_query_tables(const float *q, int64_t g, int64_t hd, int32_t bits, float *tables);

// out[j] = norm_j * max_h sum_n tables[h][n][nibble n of key j's signs], for the n sketches at
// base + j * stride (stride * 16 must fit in int32).
using SketchScoreFn = void (*)(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                               size_t stride, int64_t n, float *out);
void sketch_scores_scalar(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                          size_t stride, int64_t n, float *out);
void sketch_scores_avx2(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                        size_t stride, int64_t n, float *out);
void sketch_scores_avx512(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                          size_t stride, int64_t n, float *out);
// The scorer of an instruction set.
SketchScoreFn sketch_scorer(Isa isa) noexcept;

}  // namespace specinfer
