// Key sketches, query tables and the scalar scorer of sketched attention (see attention_sketch.h).
#include "backend/attention_sketch.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "sketch/sketcher.h"
#include "util/error.h"

namespace specinfer {

namespace {

// The projection every key and query sketch of a given (head_dim, bits) uses: one seed for all
// models, so a cache's sketches never depend on which sequence or thread wrote them. Scalar
// kernels: the same bits on every machine.
constexpr uint64_t kSketchSeed = 0x716a6c2d61747421ULL;

const sketch::Sketcher &projection(int64_t hd, int32_t bits) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, int32_t>, std::unique_ptr<sketch::Sketcher>> made;
  std::lock_guard<std::mutex> lock(mu);
  auto &s = made[{hd, bits}];
  if (!s) s = sketch::make_sketcher("qjl", hd, bits, kSketchSeed, "orthogonal=1");
  return *s;
}

void check_args(const float *x, int64_t n_rows, int64_t hd, int32_t bits, const void *dst,
                const char *what) {
  if (x == nullptr || dst == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: NULL input or output", what);
  if (n_rows <= 0 || hd <= 0 || hd > 4096)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: %lld rows of %lld values: sizes out of range", what,
         (long long)n_rows, (long long)hd);
  if (!sketch_bits_valid(bits))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: %d bits (expected a multiple of 32 in 32..1024)",
         what, bits);
  if (int64_t(hd) * bits > (int64_t{1} << 22))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: head_dim %lld x %d bits is too large", what,
         (long long)hd, bits);
}

}  // namespace

bool sketch_bits_valid(int32_t bits) noexcept {
  return bits >= kSketchMinBits && bits <= kSketchMaxBits && bits % 32 == 0;
}

void key_sketch(const float *k, int64_t n_rows, int64_t hd, int32_t bits, void *dst) {
  check_args(k, n_rows, hd, bits, dst, "key_sketch");
  const sketch::Sketcher &s = projection(hd, bits);
  const size_t row = key_sketch_bytes(bits);
  std::vector<unsigned char> sk;
  auto *out = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < n_rows; ++i) {
    s.sketch(k + i * hd, sketch::Role::key, sk);  // throws INVALID_ARGUMENT for inf / NaN
    // Payload: float64 norm, then the sign bits little-endian (bit r of byte r / 8).
    const unsigned char *p = sk.data() + sketch::kHeaderBytes;
    const auto norm = static_cast<float>(sketch::load_le<double>(p));
    if (!std::isfinite(norm))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "key_sketch: key %lld's norm overflows float",
           (long long)i);
    uint8_t *o = out + size_t(i) * row;
    std::memcpy(o, &norm, 4);
    std::memcpy(o + 4, p + 8, size_t(bits) / 8);
  }
}

void sketch_query_tables(const float *q, int64_t g, int64_t hd, int32_t bits, float *tables) {
  check_args(q, g, hd, bits, tables, "sketch_query_tables");
  const sketch::Sketcher &s = projection(hd, bits);
  std::vector<unsigned char> sk;
  const int32_t nibbles = bits / 4;
  for (int64_t h = 0; h < g; ++h) {
    s.sketch(q + h * hd, sketch::Role::query, sk);
    const unsigned char *p = sk.data() + sketch::kHeaderBytes;  // bits float32 values of S q
    for (int32_t n = 0; n < nibbles; ++n) {
      float y[4];
      std::memcpy(y, p + 16 * size_t(n), sizeof y);
      float *t = tables + (h * nibbles + n) * 16;
      for (int v = 0; v < 16; ++v) {
        float sum = 0.0f;
        for (int b = 0; b < 4; ++b) sum += (v >> b & 1) ? y[b] : -y[b];
        t[v] = sum;
      }
    }
  }
}

void sketch_scores_scalar(const float *tables, int64_t g, int32_t bits, const uint8_t *base,
                          size_t stride, int64_t n, float *out) {
  const int32_t nibbles = bits / 4;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t *row = base + size_t(j) * stride;
    float norm;
    std::memcpy(&norm, row, 4);
    float best = -INFINITY;
    for (int64_t h = 0; h < g; ++h) {
      const float *t = tables + h * nibbles * 16;
      float acc = 0.0f;
      for (int32_t i = 0; i < nibbles; ++i) {
        const int nib = (row[4 + i / 2] >> (4 * (i & 1))) & 15;
        acc += t[i * 16 + nib];
      }
      best = std::max(best, acc);
    }
    out[j] = norm * best;
  }
}

SketchScoreFn sketch_scorer(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512:
      return sketch_scores_avx512;
    case Isa::avx2:
      return sketch_scores_avx2;
    default:
      return sketch_scores_scalar;
  }
}

}  // namespace specinfer
