// Builds the arguments of one attention call (specinfer_attention_args) from its shape and
// buffers, for callers that hold q, k, v and out as contiguous arrays: the kernel tests and the
// benchmarks.
#pragma once

#include <cmath>
#include <cstdint>

#include "specinfer_plugin.h"

namespace specinfer {

// q and out are [n_q][n_head][head_dim], k and v [n_kv][n_head_kv][head_dim]; the scale is
// 1/sqrt(head_dim); mask NULL means causal (see specinfer_attention_args).
inline specinfer_attention_args attention_args(int32_t n_q, int32_t n_head, int32_t n_head_kv,
                                               int32_t head_dim, int32_t n_kv, const float *q,
                                               const float *k, const float *v, float *out,
                                               const uint8_t *mask = nullptr) {
  specinfer_attention_args a{};
  a.struct_size = sizeof a;
  a.n_q = n_q;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.n_kv = n_kv;
  a.q = q;
  a.k = k;
  a.v = v;
  a.mask = mask;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.out = out;
  return a;
}

}  // namespace specinfer
