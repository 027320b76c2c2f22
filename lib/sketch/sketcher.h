// Inner-product sketchers: compress a vector of dimension d into m << d numbers so that <a, b>
// is estimated, unbiased and with known variance, from the two sketches alone.
//
// Kinds (see abi/specinfer.h for the user's view):
//   jl           y = S a / sqrt(m), S dense Gaussian or +-1;          estimate <y_a, y_b>
//   countsketch  one +-1 per column (or s per column, 1/sqrt(s));      estimate <y_a, y_b>
//   qjl          key: sign(S a) and ||a||; query: S q;                estimate sqrt(pi/2)/m ||a||
//   <S q, sign(S a)> threshold    keep i when h(i) < min(1, m a_i^2/||a||^2);          sum over
//   common i of a_i b_i / min(p_a, p_b) priority     keep the m smallest h(i)/a_i^2, tau the
//   (m+1)-th;    sum over common i of a_i b_i / min(1, a_i^2 tau_a, b_i^2 tau_b)
// h, S and the buckets are counter-based hashes of (seed, index): a sketch depends only on the
// vector, the seed and the options, never on threads or call order.
//
// A Sketcher is immutable after construction and may be used from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sketch/format.h"
#include "sketch/kernels.h"

namespace specinfer::sketch {

// Limits on what a sketcher accepts (beyond them: SPECINFER_ERR_INVALID_ARGUMENT).
constexpr int64_t kMaxDim = int64_t{1} << 28;
constexpr int64_t kMaxSize = int64_t{1} << 24;

struct Options {
  bool sign = false;         // jl: +-1 entries instead of Gaussian ("dist=sign")
  uint32_t sparsity = 1;     // countsketch: nonzeros per column ("s=")
  bool orthogonal = false;   // qjl: orthogonalized rows ("orthogonal=1")
  Simd simd = Simd::scalar;  // kernels ("simd=auto|avx2|scalar"); never changes the format
};

class Sketcher {
 public:
  virtual ~Sketcher() = default;

  Kind kind() const { return kind_; }
  uint32_t dim() const { return dim_; }
  uint32_t size() const { return size_; }
  uint64_t seed() const { return seed_; }
  uint64_t config() const { return config_; }
  const Options &options() const { return opt_; }
  const Kernels &kernels() const { return *k_; }

  // Bytes of one sketch of the given role: exact when *exact is set, else an upper bound.
  virtual size_t bytes(Role role, bool *exact) const = 0;
  // True when sketches of this kind are linear maps (so distances can be estimated).
  virtual bool linear() const { return false; }

  // Sketches x (dim() floats, all finite) into `out` (resized to the sketch's length).
  // Throws INVALID_ARGUMENT for NaN/Inf. Non-qjl kinds ignore the role (always key).
  void sketch(const float *x, Role role, std::vector<unsigned char> &out) const;
  // Sketches n rows (row i at rows + i * stride) in parallel; out holds them back to back and
  // offsets (n + 1 entries) where each starts. Identical bytes to n calls of sketch().
  void sketch_rows(const float *rows, size_t n, size_t stride, Role role,
                   std::vector<unsigned char> &out, std::vector<size_t> &offsets) const;

  // Parses a sketch and checks that it was made by a sketcher with this configuration.
  View check(const void *bytes, size_t len) const;

  // Estimates <a, b> from two sketches.
  double estimate(const void *a, size_t a_len, const void *b, size_t b_len) const;
  // Estimates <q, k_i> for n stored sketches: key i is keys[offsets[i], offsets[i+1]).
  void estimate_many(const void *query, size_t query_len, const unsigned char *keys,
                     const size_t *offsets, size_t n, double *out) const;
  // Estimates ||a - b||^2 (linear kinds only; UNSUPPORTED otherwise).
  double distance2(const void *a, size_t a_len, const void *b, size_t b_len) const;

 protected:
  Sketcher(Kind kind, uint32_t dim, uint32_t size, uint64_t seed, const Options &opt);

  // Kind-specific parts. Inputs were checked for finiteness and, for views, by check().
  virtual void sketch_checked(const float *x, Role role, std::vector<unsigned char> &out) const = 0;
  virtual void validate(const View &v) const = 0;
  virtual double estimate_views(const View &a, const View &b) const = 0;
  virtual void estimate_many_views(const View &q, const View *keys, size_t n, double *out) const;
  virtual double distance2_views(const View &a, const View &b) const;

  // Starts a sketch of `payload` bytes in `out` and returns where the payload goes.
  unsigned char *begin_sketch(std::vector<unsigned char> &out, Role role, uint32_t count,
                              size_t payload) const;

  Kind kind_;
  uint32_t dim_, size_;
  uint64_t seed_, config_;
  Options opt_;
  const Kernels *k_;
};

// Makes a sketcher. kind: "jl", "countsketch", "qjl", "threshold", "priority"; options a
// "key=value,..." string or empty. Throws INVALID_ARGUMENT (sizes), CONFIG (kind, options).
std::unique_ptr<Sketcher> make_sketcher(const std::string &kind, int64_t dim, int64_t size,
                                        uint64_t seed, const std::string &options);

// Factories of the kinds (in their own files).
std::unique_ptr<Sketcher> make_projection(Kind kind, uint32_t dim, uint32_t size, uint64_t seed,
                                          const Options &opt);
std::unique_ptr<Sketcher> make_countsketch(uint32_t dim, uint32_t size, uint64_t seed,
                                           const Options &opt);
std::unique_ptr<Sketcher> make_sampler(Kind kind, uint32_t dim, uint32_t size, uint64_t seed,
                                       const Options &opt);

}  // namespace specinfer::sketch
