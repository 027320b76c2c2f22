// Element-wise kernels and the attention entry point: rmsnorm, rope, softmax, attention, silu_mul,
// add. Each
// dispatches once per call to the active instruction set (isa.h); the scalar versions are the
// reference.
#pragma once

#include <cstdint>

#include "specinfer_plugin.h"
#include "util/isa.h"

namespace specinfer {

// Vector primitives of one instruction set.
struct VecOps {
  void (*scale)(float *x, float s, int64_t n);                                       // x *= s
  float (*sumsq)(const float *x, int64_t n);                                         // sum x^2
  void (*mul_scaled)(const float *x, const float *w, float s, float *y, int64_t n);  // y = x*w*s
  float (*exp_sub_sum)(float *x, float m, int64_t n);  // x = exp(x - m), returns the sum
  void (*silu_mul)(float *gate, const float *up, int64_t n);
  void (*add)(float *y, const float *x, int64_t n);
};

const VecOps &vec_ops_scalar() noexcept;
const VecOps &vec_ops_avx2() noexcept;
// The AVX2 table with a sixteen-lane exp_sub_sum (same bits: ops_avx512.cpp); the other kernels
// are memory-light and keep eight lanes.
const VecOps &vec_ops_avx512() noexcept;
// The table of `isa`.
const VecOps &vec_ops(Isa isa) noexcept;

// y = x / sqrt(mean(x^2) + eps) * w; w may be NULL (no scale); y may equal x. n <= 0: nothing.
void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) noexcept;
// Rotary embedding in place on x[n_heads][head_dim], the first n_rot dims of each head, angle
// pos * freq_base^(-2i / n_rot) for pair i. neox: pairs (i, i + n_rot/2); else (2i, 2i+1).
// n_rot is rounded down to even and capped at head_dim; bad sizes do nothing.
void rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos, float freq_base,
          int32_t neox) noexcept;
// The same with a frequency per pair (scaled RoPE: linear, YaRN, per-pair factors): pair i turns
// by pos * inv_freq[i] (inv_freq holds n_rot / 2 values), and both rotated values are multiplied
// by mscale. Bad sizes or NULL do nothing.
void rope_freqs(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
                const double *inv_freq, float mscale, int32_t neox) noexcept;
// In-place softmax; if every value is -inf the result is uniform. n <= 0: nothing.
void softmax(float *x, int64_t n) noexcept;
// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float *gate, const float *up, int64_t n) noexcept;
// y[i] += x[i].
void add(float *y, const float *x, int64_t n) noexcept;
// Grouped-query scaled dot-product attention (see specinfer_attention_args) over a KV cache of any
// type kv_store writes, in backend/attention.cpp: a streaming softmax over blocks of keys, parallel
// on oneTBB over (query, kv head) and, for batches of up to 32 queries, over chunks of the keys.
// A query that may attend no position gets a zero output. A query's result is bit for bit that of
// a causal call for it alone over the keys it may attend, gathered in order: a batch, or a token
// tree under a mask, computes each token as plain decoding does. Throws specinfer::Error
// (INVALID_ARGUMENT on bad arguments, UNSUPPORTED for a KV type it does not read).
void attention(const specinfer_attention_args &args);

}  // namespace specinfer
