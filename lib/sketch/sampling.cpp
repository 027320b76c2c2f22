// Coordinated weighted sampling (Daliri, Freire, Musco, Santos, Zhang, VLDB 2024). Both kinds
// draw one shared uniform h(i) per index from (seed, i), so that the samples of two vectors made
// with the same seed overlap as much as their weights allow, and weight index i by a_i^2.
//
//   threshold: keep i when h(i) < p_i = min(1, m a_i^2 / ||a||^2); expected size <= m.
//              estimate sum over common i of a_i b_i / min(p_i(a), p_i(b)).
//   priority:  rank R_i = h(i) / a_i^2; keep the m smallest, tau = the (m+1)-th smallest rank
//              (infinity when a has at most m nonzeros); size exactly min(m, nnz(a)).
//              estimate sum over common i of a_i b_i / min(1, a_i^2 tau_a, b_i^2 tau_b).
//
// Payload: float64 (||a||^2 for threshold, tau for priority), count uint32 indices (increasing),
// count float32 values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sketch/hash.h"
#include "sketch/sketcher.h"
#include "util/error.h"

namespace specinfer::sketch {

namespace {

constexpr uint64_t kSampleStream = 0x53414d504c452d68ULL;

class Sampler final : public Sketcher {
 public:
  Sampler(Kind kind, uint32_t dim, uint32_t size, uint64_t seed, const Options &opt)
      : Sketcher(kind, dim, size, seed, opt), key_(stream_key(seed, kSampleStream)) {}

  size_t bytes(Role, bool *exact) const override {
    if (exact) *exact = false;
    const size_t most = kind_ == Kind::priority ? std::min(size_, dim_) : dim_;
    return kHeaderBytes + 8 + 8 * most;
  }

 protected:
  void sketch_checked(const float *x, Role role, std::vector<unsigned char> &out) const override {
    std::vector<uint32_t> idx;
    double scalar;
    if (kind_ == Kind::threshold) {
      double n2 = 0.0;
      for (uint32_t j = 0; j < dim_; ++j) n2 += static_cast<double>(x[j]) * x[j];
      scalar = n2;
      if (n2 > 0.0) {
        for (uint32_t j = 0; j < dim_; ++j) {
          if (x[j] == 0.0f) continue;
          if (to_unit(hash_at(key_, j)) < threshold_p(x[j], n2)) idx.push_back(j);
        }
      }
    } else {
      struct Ranked {
        double rank;
        uint32_t index;
        bool operator<(const Ranked &o) const {
          return rank < o.rank || (rank == o.rank && index < o.index);
        }
      };
      std::vector<Ranked> ranked;
      for (uint32_t j = 0; j < dim_; ++j) {
        if (x[j] == 0.0f) continue;
        const double w = static_cast<double>(x[j]) * x[j];
        ranked.push_back({to_unit_open0(hash_at(key_, j)) / w, j});
      }
      scalar = std::numeric_limits<double>::infinity();
      if (ranked.size() > size_) {
        std::nth_element(ranked.begin(), ranked.begin() + size_, ranked.end());
        scalar = ranked[size_].rank;
        ranked.resize(size_);
      }
      idx.reserve(ranked.size());
      for (const Ranked &r : ranked) idx.push_back(r.index);
      std::sort(idx.begin(), idx.end());
    }
    const auto count = static_cast<uint32_t>(idx.size());
    unsigned char *p = begin_sketch(out, role, count, 8 + 8 * static_cast<size_t>(count));
    store_le<double>(p, scalar);
    for (uint32_t i = 0; i < count; ++i) {
      store_le<uint32_t>(p + 8 + 4 * static_cast<size_t>(i), idx[i]);
      store_le<float>(p + 8 + 4 * static_cast<size_t>(count) + 4 * static_cast<size_t>(i),
                      x[idx[i]]);
    }
  }

  void validate(const View &v) const override {
    if (v.h.role != Role::key)
      fail(SPECINFER_ERR_FORMAT, "%s sketches have no query role", kind_name(kind_));
    const size_t count = v.h.count;
    if (count > dim_ || (kind_ == Kind::priority && count > size_))
      fail(SPECINFER_ERR_FORMAT, "%s sketch with %zu samples (d = %u, m = %u)", kind_name(kind_),
           count, dim_, size_);
    if (v.h.payload_bytes != 8 + 8 * count)
      fail(SPECINFER_ERR_FORMAT, "%s payload of %u bytes, expected %zu", kind_name(kind_),
           v.h.payload_bytes, 8 + 8 * count);
    const double scalar = load_le<double>(v.payload);
    if (kind_ == Kind::threshold) {
      if (!std::isfinite(scalar) || scalar < 0.0 || (count > 0 && scalar <= 0.0))
        fail(SPECINFER_ERR_FORMAT, "bad squared norm in a threshold sketch");
    } else {
      if (std::isnan(scalar) || scalar <= 0.0 || (std::isfinite(scalar) && count != size_))
        fail(SPECINFER_ERR_FORMAT, "bad threshold tau in a priority sketch");
    }
    const unsigned char *ix = v.payload + 8, *val = v.payload + 8 + 4 * count;
    uint32_t prev = 0;
    for (size_t i = 0; i < count; ++i) {
      const uint32_t j = load_le<uint32_t>(ix + 4 * i);
      if (j >= dim_ || (i > 0 && j <= prev))
        fail(SPECINFER_ERR_FORMAT, "%s sketch: sample indices out of range or out of order",
             kind_name(kind_));
      prev = j;
      const float a = load_le<float>(val + 4 * i);
      if (!std::isfinite(a) || a == 0.0f)
        fail(SPECINFER_ERR_FORMAT, "%s sketch: a sampled value is zero or not finite",
             kind_name(kind_));
    }
  }

  double estimate_views(const View &a, const View &b) const override {
    const size_t na = a.h.count, nb = b.h.count;
    const unsigned char *ia = a.payload + 8, *va = a.payload + 8 + 4 * na;
    const unsigned char *ib = b.payload + 8, *vb = b.payload + 8 + 4 * nb;
    const double sa = load_le<double>(a.payload), sb = load_le<double>(b.payload);
    double s = 0.0;
    size_t i = 0, j = 0;
    while (i < na && j < nb) {
      const uint32_t xi = load_le<uint32_t>(ia + 4 * i), xj = load_le<uint32_t>(ib + 4 * j);
      if (xi < xj) {
        ++i;
      } else if (xj < xi) {
        ++j;
      } else {
        const float x = load_le<float>(va + 4 * i), y = load_le<float>(vb + 4 * j);
        double p;
        if (kind_ == Kind::threshold) {
          p = std::min(threshold_p(x, sa), threshold_p(y, sb));
        } else {
          const double px = static_cast<double>(x) * x * sa, py = static_cast<double>(y) * y * sb;
          p = std::min(1.0, std::min(px, py));
        }
        s += static_cast<double>(x) * y / p;
        ++i;
        ++j;
      }
    }
    return s;
  }

 private:
  double threshold_p(float a, double n2) const {
    return std::min(1.0, static_cast<double>(size_) * (static_cast<double>(a) * a) / n2);
  }

  uint64_t key_;
};

}  // namespace

std::unique_ptr<Sketcher> make_sampler(Kind kind, uint32_t dim, uint32_t size, uint64_t seed,
                                       const Options &opt) {
  return std::make_unique<Sampler>(kind, dim, size, seed, opt);
}

}  // namespace specinfer::sketch
