// Helpers of the backend kernel tests (C++): the instruction sets this CPU runs, random inputs,
// KV rows in a storage type and their layouts (strided, key tiles).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/attention_args.h"
#include "backend/kernel_table.h"
#include "specinfer_plugin.h"
#include "support/cmocka_setup.h"
#include "util/isa.h"

namespace specinfer_test {

// Every instruction set of the backend this CPU can run, scalar first.
inline std::vector<specinfer::Isa> isas() {
  std::vector<specinfer::Isa> v;
  for (int i = 0; i <= 2; ++i)
    if (specinfer::isa_available(static_cast<specinfer::Isa>(i)))
      v.push_back(static_cast<specinfer::Isa>(i));
  return v;
}

// n normal values of standard deviation sd.
inline std::vector<float> randn(size_t n, std::mt19937 &rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto &x : v) x = nd(rng);
  return v;
}

// A KV tensor [n][n_head_kv][hd] in a storage type, and its values decoded back to floats.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> decoded;
};

inline Stored store(int32_t type, const std::vector<float> &x, int64_t hd) {
  const specinfer_kernels *k = specinfer::backend_kernel_table();
  const int64_t rows = static_cast<int64_t>(x.size()) / hd;
  const size_t rb = k->row_size(type, hd);
  Stored s;
  s.bytes.resize(rb * size_t(rows));
  s.decoded.resize(x.size());
  assert_int_equal(k->kv_store(type, x.data(), s.bytes.data(), int64_t(x.size())), SPECINFER_OK);
  for (int64_t r = 0; r < rows; ++r)
    assert_int_equal(
        k->dequantize_row(type, s.bytes.data() + size_t(r) * rb, s.decoded.data() + r * hd, hd),
        SPECINFER_OK);
  return s;
}

inline specinfer_attention_args typed_args(int n_q, int H, int Hkv, int hd, int n_kv,
                                           const float *q, int32_t type, const Stored &k,
                                           const Stored &v, float *out,
                                           const uint8_t *mask = nullptr) {
  specinfer_attention_args a = specinfer::attention_args(
      n_q, H, Hkv, hd, n_kv, q, reinterpret_cast<const float *>(k.bytes.data()),
      reinterpret_cast<const float *>(v.bytes.data()), out, mask);
  a.k_type = type;
  a.v_type = type;
  return a;
}

// Rows [n][Hkv] back to back, copied to position p, head h at p * pos + h * head (bytes) of a
// buffer of `size` bytes filled with 0x7f elsewhere (NaN-looking f32, huge f16 and scales: a read
// of a wrong byte would show).
inline std::vector<uint8_t> restride(const Stored &s, size_t row, int n, int Hkv, size_t pos,
                                     size_t head, size_t size) {
  std::vector<uint8_t> out(size, 0x7f);
  for (int p = 0; p < n; ++p)
    for (int h = 0; h < Hkv; ++h)
      std::memcpy(out.data() + size_t(p) * pos + size_t(h) * head,
                  s.bytes.data() + (size_t(p) * Hkv + size_t(h)) * row, row);
  return out;
}

// Q8_0 rows of kv head h, positions [0, n), put into key tiles head-major: cap positions (a
// multiple of the tile) per head, 0x7f elsewhere.
inline std::vector<uint8_t> tiled(const Stored &s, size_t row, int n, int Hkv, int hd, int cap) {
  std::vector<uint8_t> out(size_t(Hkv) * cap * row, 0x7f);
  for (int p = 0; p < n; ++p)
    for (int h = 0; h < Hkv; ++h)
      specinfer_key_tile_put(out.data() + size_t(h) * cap * row + size_t(p / 16 * 16) * row, p % 16,
                             s.bytes.data() + (size_t(p) * Hkv + size_t(h)) * row, hd);
  return out;
}

}  // namespace specinfer_test
