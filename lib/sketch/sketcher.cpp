// The parts common to every sketcher: options, input checks, parallel rows, sketch validation.
#include "sketch/sketcher.h"

#include <tbb/parallel_for.h>

#include <cmath>
#include <cstdlib>
#include <optional>

#include "sketch/hash.h"
#include "util/error.h"

namespace specinfer::sketch {

namespace {

uint64_t config_hash(Kind kind, uint32_t dim, uint32_t size, uint64_t seed, const Options &o) {
  uint64_t h = mix64(seed ^ 0x736b657463686572ULL);
  h = mix64(h ^ (static_cast<uint64_t>(kind) << 56) ^ (static_cast<uint64_t>(dim) << 24) ^ size);
  h = mix64(h ^ (static_cast<uint64_t>(o.sign) | static_cast<uint64_t>(o.orthogonal) << 1 |
                 static_cast<uint64_t>(o.sparsity) << 8));
  return h;
}

std::string trim(const std::string &s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

Options parse_options(Kind kind, uint32_t size, const std::string &text) {
  Options o;
  o.simd = best_simd();
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = trim(text.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) {
      if (comma == text.size()) break;
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      fail(SPECINFER_ERR_CONFIG, "option '%s' is not key=value", item.c_str());
    const std::string key = trim(item.substr(0, eq)), val = trim(item.substr(eq + 1));
    if (key == "simd") {
      if (val == "auto")
        o.simd = best_simd();
      else if (val == "scalar")
        o.simd = Simd::scalar;
      else if (val == "avx2") {
        if (!avx2_kernels()) fail(SPECINFER_ERR_UNSUPPORTED, "simd=avx2: this CPU has no AVX2/FMA");
        o.simd = Simd::avx2;
      } else
        fail(SPECINFER_ERR_CONFIG, "simd=%s: expected auto, avx2 or scalar", val.c_str());
    } else if (key == "dist" && kind == Kind::jl) {
      if (val == "gaussian")
        o.sign = false;
      else if (val == "sign")
        o.sign = true;
      else
        fail(SPECINFER_ERR_CONFIG, "dist=%s: expected gaussian or sign", val.c_str());
    } else if (key == "s" && kind == Kind::countsketch) {
      char *end = nullptr;
      const long v = std::strtol(val.c_str(), &end, 10);
      if (val.empty() || *end || v < 1 || v > static_cast<long>(size) || v > 256)
        fail(SPECINFER_ERR_CONFIG, "s=%s: expected an integer in [1, min(m, 256)] (m = %u)",
             val.c_str(), size);
      o.sparsity = static_cast<uint32_t>(v);
    } else if (key == "orthogonal" && kind == Kind::qjl) {
      if (val == "1" || val == "true")
        o.orthogonal = true;
      else if (val == "0" || val == "false")
        o.orthogonal = false;
      else
        fail(SPECINFER_ERR_CONFIG, "orthogonal=%s: expected 0 or 1", val.c_str());
    } else {
      fail(SPECINFER_ERR_CONFIG, "unknown option '%s' for a %s sketcher", key.c_str(),
           kind_name(kind));
    }
    if (comma == text.size()) break;
  }
  return o;
}

void check_finite(const float *x, uint32_t dim) {
  for (uint32_t j = 0; j < dim; ++j)
    if (!std::isfinite(x[j]))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "element %u of the vector is %s", j,
           std::isnan(x[j]) ? "NaN" : "infinite");
}

}  // namespace

Sketcher::Sketcher(Kind kind, uint32_t dim, uint32_t size, uint64_t seed, const Options &opt)
    : kind_(kind),
      dim_(dim),
      size_(size),
      seed_(seed),
      config_(config_hash(kind, dim, size, seed, opt)),
      opt_(opt),
      k_(&kernels_for(opt.simd)) {}

unsigned char *Sketcher::begin_sketch(std::vector<unsigned char> &out, Role role, uint32_t count,
                                      size_t payload) const {
  if (payload > 0x7fffffffu) fail(SPECINFER_ERR_INVALID_ARGUMENT, "sketch too large");
  out.assign(kHeaderBytes + payload, 0);
  Header h;
  h.kind = kind_;
  h.role = role;
  h.dim = dim_;
  h.size = size_;
  h.config = config_;
  h.count = count;
  h.payload_bytes = static_cast<uint32_t>(payload);
  write_header(out.data(), h);
  return out.data() + kHeaderBytes;
}

void Sketcher::sketch(const float *x, Role role, std::vector<unsigned char> &out) const {
  if (!x) fail(SPECINFER_ERR_INVALID_ARGUMENT, "vector is NULL");
  check_finite(x, dim_);
  sketch_checked(x, kind_ == Kind::qjl ? role : Role::key, out);
}

void Sketcher::sketch_rows(const float *rows, size_t n, size_t stride, Role role,
                           std::vector<unsigned char> &out, std::vector<size_t> &offsets) const {
  if (n > 0 && !rows) fail(SPECINFER_ERR_INVALID_ARGUMENT, "rows are NULL");
  if (n > 1 && stride < dim_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "row stride %zu is less than the dimension %u", stride,
         dim_);
  std::vector<std::vector<unsigned char>> parts(n);
  std::vector<std::optional<Error>> errors(n);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n), [&](const tbb::blocked_range<size_t> &r) {
    for (size_t i = r.begin(); i != r.end(); ++i) {
      try {
        sketch(rows + i * stride, role, parts[i]);
      } catch (const Error &e) {
        errors[i].emplace(e);
      }
    }
  });
  // Report the first bad row, whichever thread met it.
  for (size_t i = 0; i < n; ++i)
    if (errors[i]) fail(errors[i]->code(), "row %zu: %s", i, errors[i]->what());
  offsets.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + parts[i].size();
  out.resize(offsets[n]);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n), [&](const tbb::blocked_range<size_t> &r) {
    for (size_t i = r.begin(); i != r.end(); ++i)
      std::copy(parts[i].begin(), parts[i].end(), out.begin() + static_cast<ptrdiff_t>(offsets[i]));
  });
}

View Sketcher::check(const void *bytes, size_t len) const {
  View v = parse_sketch(bytes, len);
  if (v.h.kind != kind_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "a %s sketch given to a %s sketcher", kind_name(v.h.kind),
         kind_name(kind_));
  if (v.h.dim != dim_ || v.h.size != size_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sketch of d=%u, m=%u given to a sketcher of d=%u, m=%u",
         v.h.dim, v.h.size, dim_, size_);
  if (v.h.config != config_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "sketch made with another seed or other options than this sketcher's");
  validate(v);
  return v;
}

double Sketcher::estimate(const void *a, size_t a_len, const void *b, size_t b_len) const {
  return estimate_views(check(a, a_len), check(b, b_len));
}

void Sketcher::estimate_many(const void *query, size_t query_len, const unsigned char *keys,
                             const size_t *offsets, size_t n, double *out) const {
  const View q = check(query, query_len);
  if (n == 0) return;
  if (!keys || !offsets || !out)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "keys, offsets or scores are NULL");
  std::vector<View> views(n);
  for (size_t i = 0; i < n; ++i) {
    if (offsets[i + 1] < offsets[i])
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "offsets must not decrease (key %zu)", i);
    try {
      views[i] = check(keys + offsets[i], offsets[i + 1] - offsets[i]);
    } catch (const Error &e) {
      fail(e.code(), "key %zu: %s", i, e.what());
    }
  }
  estimate_many_views(q, views.data(), n, out);
}

void Sketcher::estimate_many_views(const View &q, const View *keys, size_t n, double *out) const {
  for (size_t i = 0; i < n; ++i) out[i] = estimate_views(q, keys[i]);
}

double Sketcher::distance2(const void *a, size_t a_len, const void *b, size_t b_len) const {
  return distance2_views(check(a, a_len), check(b, b_len));
}

double Sketcher::distance2_views(const View &, const View &) const {
  fail(SPECINFER_ERR_UNSUPPORTED, "%s sketches do not estimate distances (not a linear sketch)",
       kind_name(kind_));
}

std::unique_ptr<Sketcher> make_sketcher(const std::string &kind_text, int64_t dim, int64_t size,
                                        uint64_t seed, const std::string &options) {
  Kind kind;
  if (kind_text == "jl")
    kind = Kind::jl;
  else if (kind_text == "countsketch")
    kind = Kind::countsketch;
  else if (kind_text == "qjl")
    kind = Kind::qjl;
  else if (kind_text == "threshold")
    kind = Kind::threshold;
  else if (kind_text == "priority")
    kind = Kind::priority;
  else
    fail(SPECINFER_ERR_CONFIG,
         "unknown sketch kind '%s' (expected jl, countsketch, qjl, threshold or priority)",
         kind_text.c_str());
  if (dim < 1 || dim > kMaxDim)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "dimension %lld outside [1, %lld]",
         static_cast<long long>(dim), static_cast<long long>(kMaxDim));
  if (size < 1 || size > kMaxSize)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sketch size %lld outside [1, %lld]",
         static_cast<long long>(size), static_cast<long long>(kMaxSize));
  const auto d = static_cast<uint32_t>(dim), m = static_cast<uint32_t>(size);
  const Options opt = parse_options(kind, m, options);
  switch (kind) {
    case Kind::jl:
    case Kind::qjl:
      return make_projection(kind, d, m, seed, opt);
    case Kind::countsketch:
      return make_countsketch(d, m, seed, opt);
    case Kind::threshold:
    case Kind::priority:
      return make_sampler(kind, d, m, seed, opt);
  }
  fail(SPECINFER_ERR_INTERNAL, "unreachable sketch kind");
}

}  // namespace specinfer::sketch
