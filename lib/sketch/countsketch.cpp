// CountSketch / sparse JL: column j of S has s nonzeros +-1/sqrt(s), one in each of s blocks of
// rows (block b is rows [b*m/s, (b+1)*m/s)), at a hashed row with a hashed sign. Applying it costs
// O(s * nnz(a)); with s = 1 it is the classic CountSketch. Each block is an independent
// CountSketch, so <y_a, y_b> is unbiased with variance at most 2 ||a||^2 ||b||^2 / m.
//
// Payload: m float32.
#include <cmath>
#include <vector>

#include "sketch/hash.h"
#include "sketch/sketcher.h"
#include "util/error.h"

namespace specinfer::sketch {

namespace {

constexpr uint64_t kBucketStream = 0x43532d6275636b74ULL;

class CountSketch final : public Sketcher {
 public:
  CountSketch(uint32_t dim, uint32_t size, uint64_t seed, const Options &opt)
      : Sketcher(Kind::countsketch, dim, size, seed, opt), key_(stream_key(seed, kBucketStream)) {
    const uint32_t s = opt_.sparsity;
    for (uint32_t b = 0; b <= s; ++b)
      block_start_.push_back(static_cast<uint32_t>(static_cast<uint64_t>(b) * size / s));
    scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s)));
  }

  size_t bytes(Role, bool *exact) const override {
    if (exact) *exact = true;
    return kHeaderBytes + 4 * static_cast<size_t>(size_);
  }
  bool linear() const override { return true; }

 protected:
  void sketch_checked(const float *x, Role role, std::vector<unsigned char> &out) const override {
    std::vector<float> y(size_, 0.0f);
    const uint32_t s = opt_.sparsity;
    for (uint32_t j = 0; j < dim_; ++j) {
      const float a = x[j];
      if (a == 0.0f) continue;
      const float v = a * scale_;
      for (uint32_t b = 0; b < s; ++b) {
        const uint64_t h = hash_at(key_, static_cast<uint64_t>(j) * s + b);
        const uint32_t row = block_start_[b] + to_range(h, block_start_[b + 1] - block_start_[b]);
        y[row] += (h & 1) ? v : -v;
      }
    }
    for (float v : y)
      if (!std::isfinite(v))
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "the sketch overflowed float (vector too large)");
    unsigned char *p = begin_sketch(out, role, size_, 4 * static_cast<size_t>(size_));
    std::memcpy(p, y.data(), 4 * static_cast<size_t>(size_));
  }

  void validate(const View &v) const override {
    if (v.h.role != Role::key)
      fail(SPECINFER_ERR_FORMAT, "countsketch sketches have no query role");
    if (v.h.count != size_ || v.h.payload_bytes != 4 * static_cast<size_t>(size_))
      fail(SPECINFER_ERR_FORMAT, "countsketch payload of %u bytes, expected %zu", v.h.payload_bytes,
           4 * static_cast<size_t>(size_));
  }

  double estimate_views(const View &a, const View &b) const override {
    return k_->dot(a.payload, b.payload, size_);
  }

  void estimate_many_views(const View &q, const View *keys, size_t n, double *out) const override {
    for (size_t i = 0; i < n; ++i) out[i] = k_->dot(q.payload, keys[i].payload, size_);
  }

  double distance2_views(const View &a, const View &b) const override {
    double s = 0.0;
    for (uint32_t r = 0; r < size_; ++r) {
      const double d = static_cast<double>(load_le<float>(a.payload + 4 * r)) -
                       load_le<float>(b.payload + 4 * r);
      s += d * d;
    }
    return s;
  }

 private:
  uint64_t key_;
  float scale_;
  std::vector<uint32_t> block_start_;
};

}  // namespace

std::unique_ptr<Sketcher> make_countsketch(uint32_t dim, uint32_t size, uint64_t seed,
                                           const Options &opt) {
  return std::make_unique<CountSketch>(dim, size, seed, opt);
}

}  // namespace specinfer::sketch
