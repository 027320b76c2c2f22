// White-box tests of the sketchers (lib/sketch): unbiasedness and variance against the known
// results, sizes, determinism across runs, thread counts and SIMD variants.
//
// Statistics: every check compares N = kTrials independent sketches (seeds kSeed0 + t). A mean is
// accepted within 4 standard errors of <a, b>; an exact variance within 4 standard errors of the
// sample variance (estimated from the fourth central moment); a variance bound must not be
// exceeded by more than 4 standard errors. Seeds are fixed, so the outcome is reproducible.
#include <tbb/task_arena.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "sketch/format.h"
#include "sketch/kernels.h"
#include "sketch/sketcher.h"
#include "specinfer.h"
#include "support/sample_stats.h"
#include "util/error.h"
#include "util/isa.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

namespace sk = specinfer::sketch;

namespace {

constexpr int kTrials = 1500;
constexpr uint64_t kSeed0 = 1000;
constexpr uint32_t kDim = 256;
constexpr uint32_t kM = 32;
// FNV-1a of pinned sketches (test_golden_bytes).
#define GOLDEN_CS 0xa6b8976fb9729f5eULL
#define GOLDEN_CS4 0x1a91851600b52ab5ULL
#define GOLDEN_TS 0xd55e278ac2b57f4cULL
#define GOLDEN_PS 0xc6c584f6e7cb2717ULL
#define GOLDEN_JLS 0x95cd3be192eb58f2ULL

struct Pair {
  const char *name;
  std::vector<float> a, b;
};

double dot(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}
double norm2(const std::vector<float> &a) {
  return dot(a, a);
}
double sum_sq_products(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * a[i] * b[i] * b[i];
  return s;
}
// ||a restricted to the support of b||^2.
double norm2_on_support(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (b[i] != 0.0f) s += static_cast<double>(a[i]) * a[i];
  return s;
}

// Dense correlated pair, a sparse pair with half its support shared and a few outliers, and a
// low-overlap pair (4 of 40 nonzeros shared).
std::vector<Pair> make_pairs() {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<Pair> pairs;
  Pair dense{"dense", std::vector<float>(kDim), std::vector<float>(kDim)};
  for (uint32_t i = 0; i < kDim; ++i) {
    dense.a[i] = g(rng);
    dense.b[i] = 0.6f * dense.a[i] + 0.8f * g(rng);
  }
  pairs.push_back(dense);
  Pair sparse{"sparse", std::vector<float>(kDim), std::vector<float>(kDim)};
  for (uint32_t i = 0; i < 40; ++i) sparse.a[i] = g(rng);
  for (uint32_t i = 20; i < 60; ++i) sparse.b[i] = g(rng) + 0.5f * sparse.a[i];
  sparse.a[25] = 6.0f;
  sparse.b[25] = 5.0f;
  sparse.b[50] = -7.0f;
  pairs.push_back(sparse);
  Pair low{"low-overlap", std::vector<float>(kDim), std::vector<float>(kDim)};
  for (uint32_t i = 0; i < 40; ++i) low.a[3 * i] = g(rng);
  for (uint32_t i = 0; i < 40; ++i) low.b[3 * i + (i < 4 ? 0 : 1)] = g(rng) + 1.0f;
  pairs.push_back(low);
  return pairs;
}

using test_stats::Stats;
using test_stats::stats_of;

std::vector<unsigned char> sketch_of(const sk::Sketcher &s, const std::vector<float> &x,
                                     sk::Role role = sk::Role::key) {
  std::vector<unsigned char> out;
  s.sketch(x.data(), role, out);
  return out;
}

// Estimates <a, b> over kTrials seeds.
std::vector<double> trials(const char *kind, const char *options, const Pair &p, uint32_t m = kM,
                           bool qjl = false) {
  std::vector<double> est;
  for (int t = 0; t < kTrials; ++t) {
    auto s = sk::make_sketcher(kind, kDim, m, kSeed0 + t, options);
    const auto sa = sketch_of(*s, p.a);
    const auto sb = sketch_of(*s, p.b, qjl ? sk::Role::query : sk::Role::key);
    est.push_back(s->estimate(sa.data(), sa.size(), sb.data(), sb.size()));
  }
  return est;
}

void expect_unbiased(const char *what, const Pair &p, const Stats &st) {
  const double ip = dot(p.a, p.b);
  std::printf("  %-28s %-12s <a,b> %9.4f  mean %9.4f  se %7.4f  var %9.4f\n", what, p.name, ip,
              st.mean, st.se_mean, st.var);
  if (std::fabs(st.mean - ip) > 4.0 * st.se_mean + 1e-9) {
    std::printf("FAIL %s %s: mean %g is more than 4 se (%g) from %g\n", what, p.name, st.mean,
                st.se_mean, ip);
    fail();
  }
}

void expect_variance(const char *what, const Pair &p, const Stats &st, double expected) {
  std::printf("  %-28s %-12s variance %9.4f  expected %9.4f  se %7.4f\n", what, p.name, st.var,
              expected, st.se_var);
  if (std::fabs(st.var - expected) > 4.0 * st.se_var) {
    std::printf("FAIL %s %s: variance %g, expected %g (se %g)\n", what, p.name, st.var, expected,
                st.se_var);
    fail();
  }
}

void expect_variance_at_most(const char *what, const Pair &p, const Stats &st, double bound) {
  std::printf("  %-28s %-12s variance %9.4f  bound    %9.4f  se %7.4f\n", what, p.name, st.var,
              bound, st.se_var);
  if (st.var - 4.0 * st.se_var > bound) {
    std::printf("FAIL %s %s: variance %g exceeds the bound %g (se %g)\n", what, p.name, st.var,
                bound, st.se_var);
    fail();
  }
}

void test_jl_gaussian(void **) {
  for (const Pair &p : make_pairs()) {
    const Stats st = stats_of(trials("jl", "", p));
    expect_unbiased("jl gaussian", p, st);
    const double ip = dot(p.a, p.b);
    expect_variance("jl gaussian", p, st, (norm2(p.a) * norm2(p.b) + ip * ip) / kM);
  }
}

void test_jl_sign(void **) {
  for (const Pair &p : make_pairs()) {
    const Stats st = stats_of(trials("jl", "dist=sign", p));
    expect_unbiased("jl sign", p, st);
    const double ip = dot(p.a, p.b);
    expect_variance("jl sign", p, st,
                    (norm2(p.a) * norm2(p.b) + ip * ip - 2 * sum_sq_products(p.a, p.b)) / kM);
  }
}

void test_countsketch(void **) {
  for (const char *opt : {"", "s=4"}) {
    for (const Pair &p : make_pairs()) {
      const Stats st = stats_of(trials("countsketch", opt, p));
      const std::string what = std::string("countsketch ") + opt;
      expect_unbiased(what.c_str(), p, st);
      expect_variance_at_most(what.c_str(), p, st, 2 * norm2(p.a) * norm2(p.b) / kM);
    }
  }
}

void test_qjl(void **) {
  for (const char *opt : {"", "orthogonal=1"}) {
    for (const Pair &p : make_pairs()) {
      const Stats st = stats_of(trials("qjl", opt, p, kM, true));
      const std::string what = std::string("qjl ") + opt;
      expect_unbiased(what.c_str(), p, st);
      const double ip = dot(p.a, p.b);
      const double v = (M_PI / 2 * norm2(p.a) * norm2(p.b) - ip * ip) / kM;
      // Independent rows: exactly this variance. Orthogonal rows: at most this.
      if (opt[0] == '\0')
        expect_variance(what.c_str(), p, st, v);
      else
        expect_variance_at_most(what.c_str(), p, st, v);
    }
  }
}

void test_samplers(void **) {
  for (const char *kind : {"threshold", "priority"}) {
    for (const Pair &p : make_pairs()) {
      const Stats st = stats_of(trials(kind, "", p));
      expect_unbiased(kind, p, st);
      const double bound = 2.0 / kM *
                           std::max(norm2_on_support(p.a, p.b) * norm2(p.b),
                                    norm2(p.a) * norm2_on_support(p.b, p.a));
      expect_variance_at_most(kind, p, st, bound);
    }
  }
}

void test_distance(void **) {
  for (const char *kind : {"jl", "countsketch"}) {
    const Pair p = make_pairs()[1];
    std::vector<double> est;
    double truth = 0;
    for (uint32_t i = 0; i < kDim; ++i)
      truth += (static_cast<double>(p.a[i]) - p.b[i]) * (p.a[i] - p.b[i]);
    for (int t = 0; t < kTrials; ++t) {
      auto s = sk::make_sketcher(kind, kDim, kM, kSeed0 + t, "");
      const auto sa = sketch_of(*s, p.a), sb = sketch_of(*s, p.b);
      est.push_back(s->distance2(sa.data(), sa.size(), sb.data(), sb.size()));
    }
    const Stats st = stats_of(est);
    std::printf("  distance2 %-12s truth %9.4f mean %9.4f se %7.4f\n", kind, truth, st.mean,
                st.se_mean);
    assert_true(std::fabs(st.mean - truth) <= 4 * st.se_mean);
  }
}

// Threshold: expected size sum_i min(1, m a_i^2/||a||^2) <= m. Priority: exactly min(m, nnz).
// Projections: exactly the promised bytes.
void test_sizes(void **) {
  const Pair p = make_pairs()[0];
  std::vector<double> counts;
  double expected = 0;
  for (float v : p.a) expected += std::min(1.0, kM * static_cast<double>(v) * v / norm2(p.a));
  for (int t = 0; t < kTrials; ++t) {
    auto s = sk::make_sketcher("threshold", kDim, kM, kSeed0 + t, "");
    const auto sa = sketch_of(*s, p.a);
    const sk::View v = s->check(sa.data(), sa.size());
    counts.push_back(v.h.count);
    bool exact = true;
    assert_true(sa.size() <= s->bytes(sk::Role::key, &exact));
    assert_false(exact);
  }
  const Stats st = stats_of(counts);
  std::printf("  threshold size: mean %.3f expected %.3f (m = %u)\n", st.mean, expected, kM);
  assert_true(expected <= kM + 1e-9);
  assert_true(std::fabs(st.mean - expected) <= 4 * st.se_mean);

  for (const Pair &q : make_pairs()) {
    size_t nnz = 0;
    for (float v : q.a) nnz += v != 0.0f;
    for (uint32_t m : {8u, 32u, 100u}) {
      auto s = sk::make_sketcher("priority", kDim, m, 7, "");
      const auto sa = sketch_of(*s, q.a);
      assert_int_equal(s->check(sa.data(), sa.size()).h.count, std::min<size_t>(m, nnz));
      assert_int_equal(sa.size(), sk::kHeaderBytes + 8 + 8 * std::min<size_t>(m, nnz));
    }
  }
  for (const char *kind : {"jl", "countsketch", "qjl"}) {
    auto s = sk::make_sketcher(kind, kDim, 100, 7, "");
    for (sk::Role role : {sk::Role::key, sk::Role::query}) {
      bool exact = false;
      const size_t promised = s->bytes(role, &exact);
      assert_true(exact);
      assert_int_equal(sketch_of(*s, p.a, role).size(), promised);
    }
  }
  auto q = sk::make_sketcher("qjl", kDim, 100, 7, "");
  bool exact;
  assert_int_equal(q->bytes(sk::Role::key, &exact),
                   sk::kHeaderBytes + 8 + 8 * 2);  // 100 bits -> 2 words
}

// Same seed, fresh sketchers, any thread count: identical bytes.
void test_determinism(void **) {
  const auto pairs = make_pairs();
  const size_t n_rows = 64;
  std::vector<float> rows(n_rows * kDim);
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  for (float &v : rows) v = g(rng);
  for (size_t j = 0; j < kDim; ++j) rows[3 * kDim + j] = pairs[1].a[j];  // a sparse row
  for (const char *kind : {"jl", "countsketch", "qjl", "threshold", "priority"}) {
    auto s1 = sk::make_sketcher(kind, kDim, kM, 99, "");
    auto s2 = sk::make_sketcher(kind, kDim, kM, 99, "");
    for (const Pair &p : pairs) assert_true(sketch_of(*s1, p.a) == sketch_of(*s2, p.a));
    std::vector<unsigned char> one, two, serial;
    std::vector<size_t> off1, off2;
    tbb::task_arena(1).execute(
        [&] { s1->sketch_rows(rows.data(), n_rows, kDim, sk::Role::key, one, off1); });
    tbb::task_arena(2).execute(
        [&] { s2->sketch_rows(rows.data(), n_rows, kDim, sk::Role::key, two, off2); });
    for (size_t i = 0; i < n_rows; ++i) {
      std::vector<float> r(rows.begin() + i * kDim, rows.begin() + (i + 1) * kDim);
      const auto b = sketch_of(*s1, r);
      serial.insert(serial.end(), b.begin(), b.end());
    }
    assert_true(one == two);
    assert_true(one == serial);
    assert_true(off1 == off2);
    // A different seed gives different bytes, and they are refused by the first sketcher.
    auto s3 = sk::make_sketcher(kind, kDim, kM, 100, "");
    const auto other = sketch_of(*s3, pairs[0].a), mine = sketch_of(*s1, pairs[0].a);
    assert_false(other == mine);
    try {
      s1->estimate(other.data(), other.size(), mine.data(), mine.size());
      fail_msg("%s: a sketch of another seed was accepted", kind);
    } catch (const specinfer::Error &e) {
      assert_int_equal(e.code(), SPECINFER_ERR_INVALID_ARGUMENT);
    }
  }
}

// The scalar and AVX2 kernels agree (on this machine both run), and estimate_many equals
// one estimate per key.
void test_simd_variants(void **) {
  if (!sk::avx2_kernels()) {
    std::printf("  no AVX2 on this CPU: only the scalar kernels are tested\n");
  }
  // Kernel level, odd lengths and misaligned inputs included.
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  for (size_t m : {1u, 7u, 8u, 31u, 64u, 100u, 257u}) {
    std::vector<float> col(m), y1(m), y2(m);
    std::vector<uint64_t> bits((m + 63) / 64);
    for (auto &w : bits) w = (static_cast<uint64_t>(rng()) << 32) | rng();
    for (size_t r = 0; r < m; ++r) {
      col[r] = g(rng);
      y1[r] = y2[r] = g(rng);
    }
    std::vector<unsigned char> buf(4 * m + 1), q(4 * m + 3), bb(8 * bits.size() + 5);
    std::memcpy(buf.data() + 1, col.data(), 4 * m);
    std::memcpy(q.data() + 3, y1.data(), 4 * m);
    std::memcpy(bb.data() + 5, bits.data(), 8 * bits.size());
    const sk::Kernels &sc = sk::scalar_kernels();
    const double d0 = sc.dot(buf.data() + 1, q.data() + 3, m);
    const double s0 = sc.signed_sum(q.data() + 3, bb.data() + 5, m);
    if (const sk::Kernels *av = sk::avx2_kernels()) {
      const double d1 = av->dot(buf.data() + 1, q.data() + 3, m);
      const double s1 = av->signed_sum(q.data() + 3, bb.data() + 5, m);
      assert_true(std::fabs(d0 - d1) <= 1e-12 * (1 + std::fabs(d0)) * m);
      assert_true(std::fabs(s0 - s1) <= 1e-12 * (1 + std::fabs(s0)) * m);
      sc.axpy(y1.data(), col.data(), 0.75f, m);
      av->axpy(y2.data(), col.data(), 0.75f, m);
      for (size_t r = 0; r < m; ++r)
        assert_true(std::fabs(y1[r] - y2[r]) <= 1e-6f * (1 + std::fabs(y1[r])));
      sc.add_signed(y1.data(), bits.data(), -1.5f, m);
      av->add_signed(y2.data(), bits.data(), -1.5f, m);
      for (size_t r = 0; r < m; ++r)
        assert_true(std::fabs(y1[r] - y2[r]) <= 1e-6f * (1 + std::fabs(y1[r])));
    }
  }
  // Sketcher level: sketches of both variants are interchangeable and agree.
  const auto pairs = make_pairs();
  for (const char *kind : {"jl", "countsketch", "qjl"}) {
    for (const char *dist : {"", "dist=sign"}) {
      if (dist[0] && std::strcmp(kind, "jl") != 0) continue;
      auto s = sk::make_sketcher(kind, kDim, 100, 11, std::string("simd=scalar,") + dist);
      assert_string_equal(s->kernels().name, "scalar");
      std::unique_ptr<sk::Sketcher> v;
      if (sk::avx2_kernels()) {
        v = sk::make_sketcher(kind, kDim, 100, 11, std::string("simd=avx2,") + dist);
        assert_string_equal(v->kernels().name, "avx2");
      } else {
        v = sk::make_sketcher(kind, kDim, 100, 11, std::string("simd=scalar,") + dist);
      }
      std::vector<unsigned char> keys;
      std::vector<size_t> offsets{0};
      for (const Pair &p : pairs) {
        for (const auto *x : {&p.a, &p.b}) {
          const auto k = sketch_of(*v, *x);
          keys.insert(keys.end(), k.begin(), k.end());
          offsets.push_back(keys.size());
        }
      }
      const sk::Role qrole = std::strcmp(kind, "qjl") == 0 ? sk::Role::query : sk::Role::key;
      const auto qs = sketch_of(*s, pairs[0].a, qrole), qv = sketch_of(*v, pairs[0].a, qrole);
      const size_t n = offsets.size() - 1;
      std::vector<double> e_s(n), e_v(n);
      s->estimate_many(qs.data(), qs.size(), keys.data(), offsets.data(), n, e_s.data());
      v->estimate_many(qv.data(), qv.size(), keys.data(), offsets.data(), n, e_v.data());
      for (size_t i = 0; i < n; ++i) {
        const double one = v->estimate(qv.data(), qv.size(), keys.data() + offsets[i],
                                       offsets[i + 1] - offsets[i]);
        assert_true(one == e_v[i]);
        assert_true(std::fabs(e_s[i] - e_v[i]) <= 1e-4 * (1 + std::fabs(e_s[i])));
      }
    }
  }
}

// Large d*m: the projection is generated column by column instead of materialized; it must still
// be unbiased and the sketch of a vector with one nonzero is that column.
// simd=auto follows the library's one instruction-set choice (util/isa.h, which SPECINFER_ISA
// caps), as the model kernels do; an explicit simd=avx2 asks the CPU only.
void test_auto_follows_isa(void **) {
  const specinfer::Isa before = specinfer::set_active_isa(specinfer::Isa::scalar);
  auto capped = sk::make_sketcher("jl", kDim, 16, 1, "simd=auto");
  assert_string_equal(capped->kernels().name, "scalar");
  specinfer::set_active_isa(specinfer::Isa::avx512);
  auto best = sk::make_sketcher("jl", kDim, 16, 1, "");
  assert_string_equal(best->kernels().name, sk::avx2_kernels() ? "avx2" : "scalar");
  if (sk::avx2_kernels()) {
    specinfer::set_active_isa(specinfer::Isa::scalar);
    auto asked = sk::make_sketcher("jl", kDim, 16, 1, "simd=avx2");
    assert_string_equal(asked->kernels().name, "avx2");
  }
  specinfer::set_active_isa(before);
}

void test_lazy_projection(void **) {
  const uint32_t d = 300000, m = 16;  // d*m > 2^22: not materialized
  std::vector<float> a(d, 0.0f), b(d, 0.0f);
  for (uint32_t i = 0; i < 200; ++i) {
    a[i * 1000] = 1.0f + (i % 7);
    b[i * 1000 + (i % 2) * 500] = 2.0f - (i % 5);
  }
  const double ip = dot(a, b);
  std::vector<double> est;
  for (int t = 0; t < 300; ++t) {
    auto s = sk::make_sketcher("jl", d, m, kSeed0 + t, "");
    const auto sa = sketch_of(*s, a), sb = sketch_of(*s, b);
    est.push_back(s->estimate(sa.data(), sa.size(), sb.data(), sb.size()));
  }
  const Stats st = stats_of(est);
  std::printf("  lazy jl: <a,b> %.3f mean %.3f se %.3f\n", ip, st.mean, st.se_mean);
  assert_true(std::fabs(st.mean - ip) <= 4 * st.se_mean);
}

void expect_error(specinfer_status want, const std::function<void()> &fn) {
  try {
    fn();
  } catch (const specinfer::Error &e) {
    if (e.code() != want) fail_msg("status %d (%s), expected %d", e.code(), e.what(), want);
    assert_true(std::strlen(e.what()) > 0);
    return;
  }
  fail_msg("no error, expected status %d", want);
}

void test_bad_input(void **) {
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT, [] { sk::make_sketcher("jl", 16, 0, 1, ""); });
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT, [] { sk::make_sketcher("jl", 0, 4, 1, ""); });
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
               [] { sk::make_sketcher("jl", 16, sk::kMaxSize + 1, 1, ""); });
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
               [] { sk::make_sketcher("jl", sk::kMaxDim + 1, 4, 1, ""); });
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
               [] { sk::make_sketcher("qjl", 100000, 1000, 1, "orthogonal=1"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("minhash", 16, 4, 1, ""); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("jl", 16, 4, 1, "dist=cauchy"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("jl", 16, 4, 1, "s=2"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("countsketch", 16, 4, 1, "s=5"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("countsketch", 16, 4, 1, "s=x"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("priority", 16, 4, 1, "simd"); });
  expect_error(SPECINFER_ERR_CONFIG, [] { sk::make_sketcher("priority", 16, 4, 1, "simd=neon"); });

  for (const char *kind : {"jl", "countsketch", "qjl", "threshold", "priority"}) {
    auto s = sk::make_sketcher(kind, 16, 4, 1, "");
    std::vector<float> x(16, 1.0f);
    std::vector<unsigned char> out;
    x[5] = NAN;
    expect_error(SPECINFER_ERR_INVALID_ARGUMENT, [&] { s->sketch(x.data(), sk::Role::key, out); });
    x[5] = INFINITY;
    expect_error(SPECINFER_ERR_INVALID_ARGUMENT, [&] { s->sketch(x.data(), sk::Role::key, out); });
    x[5] = 2.0f;
    s->sketch(x.data(), sk::Role::key, out);
    // Truncated, padded, garbage, foreign kind.
    expect_error(SPECINFER_ERR_FORMAT,
                 [&] { s->estimate(out.data(), out.size() - 1, out.data(), out.size()); });
    std::vector<unsigned char> padded = out;
    padded.push_back(0);
    expect_error(SPECINFER_ERR_FORMAT,
                 [&] { s->estimate(padded.data(), padded.size(), out.data(), out.size()); });
    std::vector<unsigned char> junk(out.size(), 0xab);
    expect_error(SPECINFER_ERR_FORMAT,
                 [&] { s->estimate(junk.data(), junk.size(), out.data(), out.size()); });
    expect_error(SPECINFER_ERR_FORMAT,
                 [&] { s->estimate(out.data(), 10, out.data(), out.size()); });
    std::vector<unsigned char> bad_version = out;
    bad_version[4] = 99;
    expect_error(SPECINFER_ERR_FORMAT, [&] {
      s->estimate(bad_version.data(), bad_version.size(), out.data(), out.size());
    });
    expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
                 [&] { s->estimate(nullptr, 0, out.data(), out.size()); });
    auto other = sk::make_sketcher(std::strcmp(kind, "jl") ? "jl" : "priority", 16, 4, 1, "");
    std::vector<unsigned char> foreign;
    other->sketch(x.data(), sk::Role::key, foreign);
    expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
                 [&] { s->estimate(foreign.data(), foreign.size(), out.data(), out.size()); });
    auto wider = sk::make_sketcher(kind, 17, 4, 1, "");
    std::vector<float> x17(17, 1.0f);
    std::vector<unsigned char> w;
    wider->sketch(x17.data(), sk::Role::key, w);
    expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
                 [&] { s->estimate(w.data(), w.size(), out.data(), out.size()); });
  }
  // Sampler payload corruption: indices out of order, out of range.
  auto s = sk::make_sketcher("priority", 16, 4, 1, "");
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i + 1);
  std::vector<unsigned char> out;
  s->sketch(x.data(), sk::Role::key, out);
  std::vector<unsigned char> swapped = out;
  std::memcpy(swapped.data() + sk::kHeaderBytes + 8, out.data() + sk::kHeaderBytes + 12, 4);
  std::memcpy(swapped.data() + sk::kHeaderBytes + 12, out.data() + sk::kHeaderBytes + 8, 4);
  expect_error(SPECINFER_ERR_FORMAT,
               [&] { s->estimate(swapped.data(), swapped.size(), out.data(), out.size()); });
  std::vector<unsigned char> far = out;
  sk::store_le<uint32_t>(far.data() + sk::kHeaderBytes + 8 + 12, 1000);
  expect_error(SPECINFER_ERR_FORMAT,
               [&] { s->estimate(far.data(), far.size(), out.data(), out.size()); });
  // qjl: two keys are refused; distances of samplers are unsupported.
  auto q = sk::make_sketcher("qjl", 16, 4, 1, "");
  std::vector<unsigned char> k1;
  q->sketch(x.data(), sk::Role::key, k1);
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT,
               [&] { q->estimate(k1.data(), k1.size(), k1.data(), k1.size()); });
  expect_error(SPECINFER_ERR_UNSUPPORTED,
               [&] { q->distance2(k1.data(), k1.size(), k1.data(), k1.size()); });
  expect_error(SPECINFER_ERR_UNSUPPORTED,
               [&] { s->distance2(out.data(), out.size(), out.data(), out.size()); });
  // Huge values: the projection overflows float -> an error, not Inf in a sketch.
  auto j = sk::make_sketcher("jl", 16, 4, 1, "");
  std::vector<float> big(16, 3e38f);
  expect_error(SPECINFER_ERR_INVALID_ARGUMENT, [&] { j->sketch(big.data(), sk::Role::key, out); });
  // A bad row in sketch_rows: the message names it.
  std::vector<float> rows(16 * 8, 1.0f);
  rows[16 * 5 + 2] = NAN;
  std::vector<size_t> offs;
  try {
    j->sketch_rows(rows.data(), 8, 16, sk::Role::key, out, offs);
    fail_msg("NaN row accepted");
  } catch (const specinfer::Error &e) {
    assert_non_null(std::strstr(e.what(), "row 5"));
  }
}

// The zero vector sketches and estimates to 0 everywhere.
void test_zero_vector(void **) {
  std::vector<float> z(kDim, 0.0f), a = make_pairs()[0].a;
  for (const char *kind : {"jl", "countsketch", "qjl", "threshold", "priority"}) {
    auto s = sk::make_sketcher(kind, kDim, kM, 3, "");
    const bool qjl = std::strcmp(kind, "qjl") == 0;
    const auto sz = sketch_of(*s, z), sa = sketch_of(*s, a, qjl ? sk::Role::query : sk::Role::key);
    assert_true(s->estimate(sz.data(), sz.size(), sa.data(), sa.size()) == 0.0);
  }
}

// Pinned bytes: the sketches of a fixed vector under a fixed seed must never change between runs,
// builds or versions of the format (FNV-1a of the bytes). Kinds whose bytes involve no kernel
// rounding differences are pinned on every variant; jl +-1 adds the same floats in the same order
// in both variants.
uint64_t fnv1a(const std::vector<unsigned char> &b) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

void test_golden_bytes(void **) {
  std::vector<float> x(kDim);
  for (uint32_t i = 0; i < kDim; ++i)
    x[i] = (i % 3 == 0) ? 0.0f : static_cast<float>((i * 37 % 101) - 50) / 8.0f;
  struct Case {
    const char *kind, *options;
    uint64_t want;
  };
  const Case cases[] = {
      {"countsketch", "", GOLDEN_CS},
      {"countsketch", "s=4", GOLDEN_CS4},
      {"threshold", "", GOLDEN_TS},
      {"priority", "", GOLDEN_PS},
      {"jl", "dist=sign,simd=scalar", GOLDEN_JLS},
      {"jl", "dist=sign", GOLDEN_JLS},
  };
  bool changed = false;
  for (const Case &c : cases) {
    auto s = sk::make_sketcher(c.kind, kDim, kM, 12345, c.options);
    const uint64_t got = fnv1a(sketch_of(*s, x));
    std::printf("  golden %-12s %-22s 0x%016llx\n", c.kind, c.options,
                static_cast<unsigned long long>(got));
    if (got != c.want) {
      std::printf("FAIL %s %s: the bytes changed\n", c.kind, c.options);
      changed = true;
    }
  }
  assert_false(changed);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_input),       cmocka_unit_test(test_zero_vector),
      cmocka_unit_test(test_sizes),           cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_simd_variants),   cmocka_unit_test(test_auto_follows_isa),
      cmocka_unit_test(test_jl_gaussian),     cmocka_unit_test(test_jl_sign),
      cmocka_unit_test(test_countsketch),     cmocka_unit_test(test_qjl),
      cmocka_unit_test(test_samplers),        cmocka_unit_test(test_distance),
      cmocka_unit_test(test_lazy_projection), cmocka_unit_test(test_golden_bytes),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
