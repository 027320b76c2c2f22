// Dense random projections: jl (Gaussian or +-1, scaled 1/sqrt(m)) and qjl (Gaussian; keys keep
// only the signs of S a and ||a||, queries keep S q).
//
// Entry S[r][j] is a counter-based hash of (seed, j, r). Small matrices are materialized column by
// column at creation; large ones are generated column by column while sketching. Both paths use
// the same numbers and the same kernels, so a sketch does not depend on which one ran.
//
// Payloads: jl and qjl queries: m float32. qjl keys: float64 ||a||, then ceil(m/64) uint64 words
// of sign bits (bit r set when (S a)_r >= 0).
#include <cmath>
#include <vector>

#include "sketch/hash.h"
#include "sketch/sketcher.h"
#include "util/error.h"

namespace specinfer::sketch {

namespace {

constexpr uint64_t kGaussStream = 0x4a4c2d6761757373ULL;
constexpr uint64_t kSignStream = 0x4a4c2d7369676e73ULL;
// Materialize S when it has at most this many entries.
constexpr uint64_t kMaterializeGaussian = uint64_t{1} << 22;
constexpr uint64_t kMaterializeSign = uint64_t{1} << 24;
constexpr double kSqrtHalfPi = 1.2533141373155002512;

class Projection final : public Sketcher {
 public:
  Projection(Kind kind, uint32_t dim, uint32_t size, uint64_t seed, const Options &opt)
      : Sketcher(kind, dim, size, seed, opt), words_((size + 63) / 64) {
    const uint64_t entries = static_cast<uint64_t>(dim) * size;
    if (opt_.sign) {
      key_ = stream_key(seed, kSignStream);
      if (entries <= kMaterializeSign) {
        bits_.resize(static_cast<size_t>(dim) * words_);
        for (uint32_t j = 0; j < dim; ++j)
          sign_column(j, bits_.data() + static_cast<size_t>(j) * words_);
      }
    } else {
      key_ = stream_key(seed, kGaussStream);
      if (opt_.orthogonal && entries > kMaterializeGaussian)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "orthogonal=1 needs d*m <= %llu (got %u*%u)",
             static_cast<unsigned long long>(kMaterializeGaussian), dim, size);
      if (entries <= kMaterializeGaussian) {
        gauss_.resize(static_cast<size_t>(entries));
        for (uint32_t j = 0; j < dim; ++j)
          gauss_column(j, gauss_.data() + static_cast<size_t>(j) * size);
        if (opt_.orthogonal) orthogonalize();
      }
    }
  }

  size_t bytes(Role role, bool *exact) const override {
    if (exact) *exact = true;
    if (kind_ == Kind::qjl && role == Role::key) return kHeaderBytes + 8 + 8 * words_;
    return kHeaderBytes + 4 * static_cast<size_t>(size_);
  }
  bool linear() const override { return true; }

 protected:
  void sketch_checked(const float *x, Role role, std::vector<unsigned char> &out) const override {
    std::vector<float> y(size_, 0.0f);
    project(x, y.data());
    if (kind_ == Kind::jl) {
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(size_)));
      for (float &v : y) v *= scale;
    }
    for (float v : y)
      if (!std::isfinite(v))
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "the projection overflowed float (vector too large)");
    if (kind_ == Kind::qjl && role == Role::key) {
      double n2 = 0.0;
      for (uint32_t j = 0; j < dim_; ++j) n2 += static_cast<double>(x[j]) * x[j];
      unsigned char *p = begin_sketch(out, role, size_, 8 + 8 * words_);
      store_le<double>(p, std::sqrt(n2));
      for (uint32_t r = 0; r < size_; ++r)
        if (y[r] >= 0.0f) p[8 + (r >> 3)] |= static_cast<unsigned char>(1u << (r & 7));
      return;
    }
    unsigned char *p = begin_sketch(out, role, size_, 4 * static_cast<size_t>(size_));
    std::memcpy(p, y.data(), 4 * static_cast<size_t>(size_));
  }

  void validate(const View &v) const override {
    if (v.h.count != size_)
      fail(SPECINFER_ERR_FORMAT, "sketch count %u, expected m = %u", v.h.count, size_);
    if (kind_ == Kind::jl && v.h.role != Role::key)
      fail(SPECINFER_ERR_FORMAT, "jl sketches have no query role");
    bool exact;
    if (v.h.payload_bytes + kHeaderBytes != bytes(v.h.role, &exact))
      fail(SPECINFER_ERR_FORMAT, "sketch payload of %u bytes, expected %zu", v.h.payload_bytes,
           bytes(v.h.role, &exact) - kHeaderBytes);
    if (kind_ == Kind::qjl && v.h.role == Role::key) {
      const double norm = load_le<double>(v.payload);
      if (!std::isfinite(norm) || norm < 0.0)
        fail(SPECINFER_ERR_FORMAT, "bad norm in a qjl key sketch");
    }
  }

  double estimate_views(const View &a, const View &b) const override {
    if (kind_ == Kind::jl) return k_->dot(a.payload, b.payload, size_);
    if (a.h.role == Role::query && b.h.role == Role::query)
      return k_->dot(a.payload, b.payload, size_) / size_;
    if (a.h.role == Role::key && b.h.role == Role::key)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "qjl estimates need a query sketch (SPECINFER_SKETCH_QUERY) on one side; both are keys");
    const View &key = a.h.role == Role::key ? a : b;
    const View &query = a.h.role == Role::key ? b : a;
    return qjl_estimate(query.payload, key.payload);
  }

  void estimate_many_views(const View &q, const View *keys, size_t n, double *out) const override {
    if (kind_ == Kind::jl) {
      for (size_t i = 0; i < n; ++i) out[i] = k_->dot(q.payload, keys[i].payload, size_);
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      if (q.h.role == Role::query && keys[i].h.role == Role::key)
        out[i] = qjl_estimate(q.payload, keys[i].payload);
      else
        out[i] = estimate_views(q, keys[i]);
    }
  }

  double distance2_views(const View &a, const View &b) const override {
    if (a.h.role != Role::key || b.h.role != Role::key) {
      if (!(kind_ == Kind::qjl && a.h.role == Role::query && b.h.role == Role::query))
        fail(SPECINFER_ERR_UNSUPPORTED, "qjl estimates distances between two query sketches only");
    } else if (kind_ == Kind::qjl) {
      fail(SPECINFER_ERR_UNSUPPORTED, "qjl estimates distances between two query sketches only");
    }
    double s = 0.0;
    for (uint32_t r = 0; r < size_; ++r) {
      const double d = static_cast<double>(load_le<float>(a.payload + 4 * r)) -
                       load_le<float>(b.payload + 4 * r);
      s += d * d;
    }
    return kind_ == Kind::qjl ? s / size_ : s;
  }

 private:
  double qjl_estimate(const unsigned char *query, const unsigned char *key) const {
    const double norm = load_le<double>(key);
    return kSqrtHalfPi / size_ * norm * k_->signed_sum(query, key + 8, size_);
  }

  // Column j of the Gaussian S (m entries): pair p of the column from counter j * ceil(m/2) + p.
  void gauss_column(uint32_t j, float *col) const {
    const uint64_t pairs = (size_ + 1) / 2;
    for (uint64_t p = 0; p < pairs; ++p) {
      double z0, z1;
      normal_pair(key_, static_cast<uint64_t>(j) * pairs + p, &z0, &z1);
      col[2 * p] = static_cast<float>(z0);
      if (2 * p + 1 < size_) col[2 * p + 1] = static_cast<float>(z1);
    }
  }

  // Column j of the sign matrix as bits (bit set = +1).
  void sign_column(uint32_t j, uint64_t *bits) const {
    for (uint32_t w = 0; w < words_; ++w)
      bits[w] = hash_at(key_, static_cast<uint64_t>(j) * words_ + w);
  }

  // y = S x (unscaled), skipping zero entries of x.
  void project(const float *x, float *y) const {
    std::vector<float> col;
    std::vector<uint64_t> bits;
    for (uint32_t j = 0; j < dim_; ++j) {
      const float a = x[j];
      if (a == 0.0f) continue;
      if (opt_.sign) {
        const uint64_t *b;
        if (!bits_.empty()) {
          b = bits_.data() + static_cast<size_t>(j) * words_;
        } else {
          bits.resize(words_);
          sign_column(j, bits.data());
          b = bits.data();
        }
        k_->add_signed(y, b, a, size_);
      } else {
        const float *c;
        if (!gauss_.empty()) {
          c = gauss_.data() + static_cast<size_t>(j) * size_;
        } else {
          col.resize(size_);
          gauss_column(j, col.data());
          c = col.data();
        }
        k_->axpy(y, c, a, size_);
      }
    }
  }

  // Orthogonalizes the rows of S in blocks of at most d rows (modified Gram-Schmidt), then gives
  // each row back the length it had: a Gaussian row's length is independent of its direction, so
  // every row is still N(0, I) on its own and the estimator stays unbiased.
  void orthogonalize() {
    const size_t d = dim_, m = size_;
    std::vector<double> rows(m * d);
    for (size_t j = 0; j < d; ++j)
      for (size_t r = 0; r < m; ++r) rows[r * d + j] = gauss_[j * m + r];
    std::vector<double> length(m);
    for (size_t r = 0; r < m; ++r) {
      double *v = &rows[r * d];
      double n2 = 0.0;
      for (size_t j = 0; j < d; ++j) n2 += v[j] * v[j];
      length[r] = std::sqrt(n2);
      const size_t block_start = (r / d) * d;
      for (size_t p = block_start; p < r; ++p) {
        const double *e = &rows[p * d];
        double c = 0.0;
        for (size_t j = 0; j < d; ++j) c += v[j] * e[j];
        for (size_t j = 0; j < d; ++j) v[j] -= c * e[j];
      }
      double rn = 0.0;
      for (size_t j = 0; j < d; ++j) rn += v[j] * v[j];
      rn = std::sqrt(rn);
      if (rn < 1e-12 * (length[r] + 1e-300)) {  // degenerate (probability zero): keep the row
        for (size_t j = 0; j < d; ++j) v[j] = gauss_[j * m + r] / (length[r] > 0 ? length[r] : 1.0);
      } else {
        for (size_t j = 0; j < d; ++j) v[j] /= rn;
      }
    }
    for (size_t j = 0; j < d; ++j)
      for (size_t r = 0; r < m; ++r)
        gauss_[j * m + r] = static_cast<float>(rows[r * d + j] * length[r]);
  }

  uint32_t words_;
  uint64_t key_ = 0;
  std::vector<float> gauss_;    // column-major m x d, when materialized
  std::vector<uint64_t> bits_;  // d columns of ceil(m/64) words, when materialized
};

}  // namespace

std::unique_ptr<Sketcher> make_projection(Kind kind, uint32_t dim, uint32_t size, uint64_t seed,
                                          const Options &opt) {
  return std::make_unique<Projection>(kind, dim, size, seed, opt);
}

}  // namespace specinfer::sketch
