// rmsnorm, rope, softmax, silu_mul, add and attention on every instruction set this CPU has,
// against naive double-precision implementations written here. Tolerances: 1e-5 relative (+1e-6
// absolute) for the element-wise kernels (the AVX2 exp has ~2e-7 relative error), 1e-4 for
// attention.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/attention_args.h"
#include "backend/kernel_table.h"
#include "backend/ops.h"
#include "util/error.h"
#include "util/isa.h"

#include "support/backend_util.h"
#include "support/cmocka_setup.h"

using namespace specinfer;

namespace {

using specinfer_test::isas;
using specinfer_test::randn;

bool close(double got, double want, double rel, double abs_tol) {
  return std::fabs(got - want) <= rel * std::fabs(want) + abs_tol;
}

void test_rmsnorm(void **) {
  std::mt19937 rng(1);
  const Isa prev = active_isa();
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (int64_t n : {1, 7, 64, 1539}) {
      auto x = randn(static_cast<size_t>(n), rng), w = randn(static_cast<size_t>(n), rng);
      double ss = 0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
      std::vector<float> y(x.size());
      rmsnorm(x.data(), w.data(), n, 1e-6f, y.data());
      for (int64_t i = 0; i < n; ++i)
        assert_true(close(y[static_cast<size_t>(i)],
                          x[static_cast<size_t>(i)] * s * w[static_cast<size_t>(i)], 1e-5, 1e-6));
      // In place, without weights.
      auto z = x;
      rmsnorm(z.data(), nullptr, n, 1e-6f, z.data());
      for (int64_t i = 0; i < n; ++i)
        assert_true(close(z[static_cast<size_t>(i)], x[static_cast<size_t>(i)] * s, 1e-5, 1e-6));
    }
  }
  set_active_isa(prev);
}

void test_rope(void **) {
  std::mt19937 rng(2);
  const int64_t heads = 3, hd = 64;
  for (int neox = 0; neox <= 1; ++neox) {
    for (int64_t n_rot : {64, 32}) {
      for (int64_t pos : {0, 1, 17, 4000}) {
        auto x = randn(static_cast<size_t>(heads * hd), rng);
        auto y = x;
        rope(y.data(), heads, hd, n_rot, pos, 10000.0f, neox);
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < n_rot / 2; ++i) {
            const double theta =
                static_cast<double>(pos) *
                std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
            const int64_t i0 = h * hd + (neox ? i : 2 * i),
                          i1 = h * hd + (neox ? i + n_rot / 2 : 2 * i + 1);
            const double a = x[static_cast<size_t>(i0)], b = x[static_cast<size_t>(i1)];
            assert_true(close(y[static_cast<size_t>(i0)], a * std::cos(theta) - b * std::sin(theta),
                              1e-5, 1e-5));
            assert_true(close(y[static_cast<size_t>(i1)], a * std::sin(theta) + b * std::cos(theta),
                              1e-5, 1e-5));
          }
          // Dimensions past n_rot are untouched.
          for (int64_t d = n_rot; d < hd; ++d)
            assert_true(y[static_cast<size_t>(h * hd + d)] == x[static_cast<size_t>(h * hd + d)]);
        }
      }
    }
  }
}

// rope_freqs with the plain frequencies is rope bit for bit; its scale multiplies the rotated pairs
// only; a NULL table does nothing.
void test_rope_freqs(void **) {
  std::mt19937 rng(12);
  const int64_t heads = 2, hd = 64;
  for (int neox = 0; neox <= 1; ++neox)
    for (int64_t n_rot : {64, 32}) {
      std::vector<double> f(static_cast<size_t>(n_rot / 2));
      for (int64_t i = 0; i < n_rot / 2; ++i)
        f[static_cast<size_t>(i)] =
            std::pow(1e6, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
      for (int64_t pos : {0, 3, 30000}) {
        const auto x = randn(static_cast<size_t>(heads * hd), rng);
        auto a = x, b = x, c = x, d = x;
        rope(a.data(), heads, hd, n_rot, pos, 1e6f, neox);
        rope_freqs(b.data(), heads, hd, n_rot, pos, f.data(), 1.0f, neox);
        assert_memory_equal(a.data(), b.data(), a.size() * sizeof(float));
        rope_freqs(c.data(), heads, hd, n_rot, pos, f.data(), 1.5f, neox);
        for (size_t j = 0; j < c.size(); ++j) {
          const bool rotated = static_cast<int64_t>(j) % hd < n_rot;
          assert_true(close(c[j], rotated ? 1.5 * a[j] : a[j], 1e-6, 1e-6));
        }
        rope_freqs(d.data(), heads, hd, n_rot, pos, nullptr, 1.0f, neox);
        assert_memory_equal(d.data(), x.data(), x.size() * sizeof(float));
      }
    }
}

void test_softmax(void **) {
  std::mt19937 rng(3);
  const Isa prev = active_isa();
  for (Isa isa : isas()) {
    set_active_isa(isa);
    for (int64_t n : {1, 5, 8, 100, 1001}) {
      auto x = randn(static_cast<size_t>(n), rng, 5.0f);
      if (n > 3) x[2] = -INFINITY;
      if (n > 4) x[3] = 80.0f;  // large logits stay finite
      double m = -INFINITY;
      for (float v : x) m = std::fmax(m, v);
      double sum = 0;
      for (float v : x) sum += std::exp(v - m);
      auto y = x;
      softmax(y.data(), n);
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(x[static_cast<size_t>(i)] - m) / sum;
        assert_true(close(y[static_cast<size_t>(i)], want, 1e-5, 1e-7));
        total += y[static_cast<size_t>(i)];
      }
      assert_true(std::fabs(total - 1.0) < 1e-5);
      if (n > 3) assert_true(y[2] == 0.0f);
    }
    std::vector<float> all(4, -INFINITY);
    softmax(all.data(), 4);
    for (float v : all) assert_true(v == 0.25f);
  }
  set_active_isa(prev);
}

// The AVX-512 exp_sub_sum runs the AVX2 one's steps on sixteen lanes: the same values and sum, bit
// for bit, at every length (whole and half vectors, scalar tails) and at the clamps.
void test_exp_sub_sum_lanes(void **) {
  if (!isa_available(Isa::avx512)) {
    print_message("no AVX-512 on this CPU: skipped\n");
    return;
  }
  std::mt19937 rng(11);
  for (int64_t n = 0; n <= 70; ++n) {
    auto x = randn(static_cast<size_t>(n), rng, 20.0f);
    if (n > 5) x[5] = -INFINITY;
    if (n > 9) x[9] = 300.0f;    // clamped at 88
    if (n > 12) x[12] = -87.5f;  // below -87: exactly 0
    auto a = x, b = x;
    const float sa = vec_ops_avx2().exp_sub_sum(a.data(), 1.5f, n);
    const float sb = vec_ops_avx512().exp_sub_sum(b.data(), 1.5f, n);
    assert_memory_equal(&sa, &sb, sizeof sa);
    if (n > 0) assert_memory_equal(a.data(), b.data(), a.size() * sizeof(float));
  }
}

void test_silu_mul_add(void **) {
  std::mt19937 rng(4);
  const Isa prev = active_isa();
  for (Isa isa : isas()) {
    set_active_isa(isa);
    auto g = randn(1003, rng, 4.0f), u = randn(1003, rng);
    g[0] = -100.0f;
    g[1] = 100.0f;
    auto y = g;
    silu_mul(y.data(), u.data(), 1003);
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      assert_true(close(y[i], want, 1e-5, 1e-6));
    }
    auto a = g;
    add(a.data(), u.data(), 1003);
    for (size_t i = 0; i < g.size(); ++i) assert_true(a[i] == g[i] + u[i]);
  }
  set_active_isa(prev);
}

// Naive attention in double. mask: [n_q][n_kv] or empty for causal.
std::vector<double> naive_attention(const specinfer_attention_args &a) {
  const int64_t hd = a.head_dim, group = a.n_head / a.n_head_kv;
  std::vector<double> out(static_cast<size_t>(a.n_q * a.n_head * hd), 0.0);
  for (int64_t i = 0; i < a.n_q; ++i) {
    for (int64_t h = 0; h < a.n_head; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> s(static_cast<size_t>(a.n_kv));
      double m = -INFINITY;
      for (int64_t j = 0; j < a.n_kv; ++j) {
        const bool ok = a.mask ? a.mask[i * a.n_kv + j] != 0 : j <= a.n_kv - a.n_q + i;
        if (!ok) {
          s[static_cast<size_t>(j)] = -INFINITY;
          continue;
        }
        double d = 0;
        for (int64_t c = 0; c < hd; ++c)
          d += static_cast<double>(a.q[(i * a.n_head + h) * hd + c]) *
               a.k[(j * a.n_head_kv + kvh) * hd + c];
        s[static_cast<size_t>(j)] = d * a.scale;
        m = std::fmax(m, s[static_cast<size_t>(j)]);
      }
      if (m == -INFINITY) continue;
      double sum = 0;
      for (auto &v : s) {
        v = std::exp(v - m);
        sum += v;
      }
      for (int64_t j = 0; j < a.n_kv; ++j)
        for (int64_t c = 0; c < hd; ++c)
          out[static_cast<size_t>((i * a.n_head + h) * hd + c)] +=
              s[static_cast<size_t>(j)] / sum * a.v[(j * a.n_head_kv + kvh) * hd + c];
    }
  }
  return out;
}

void run_attention_case(int n_q, int n_head, int n_head_kv, int hd, int n_kv, bool explicit_mask,
                        std::mt19937 &rng) {
  auto q = randn(static_cast<size_t>(n_q * n_head * hd), rng),
       k = randn(static_cast<size_t>(n_kv * n_head_kv * hd), rng),
       v = randn(static_cast<size_t>(n_kv * n_head_kv * hd), rng);
  std::vector<uint8_t> mask;
  if (explicit_mask) {
    std::bernoulli_distribution b(0.6);
    mask.resize(static_cast<size_t>(n_q * n_kv));
    for (auto &m : mask) m = b(rng) ? 1 : 0;
    for (int j = 0; j < n_kv; ++j)
      mask[static_cast<size_t>(j)] = 0;  // query 0 sees nothing: zero output
  }
  std::vector<float> out(q.size(), NAN);
  const specinfer_attention_args a =
      attention_args(n_q, n_head, n_head_kv, hd, n_kv, q.data(), k.data(), v.data(), out.data(),
                     explicit_mask ? mask.data() : nullptr);
  const auto want = naive_attention(a);
  assert_int_equal(backend_kernel_table()->attention(&a), SPECINFER_OK);
  for (size_t i = 0; i < out.size(); ++i) {
    if (!close(out[i], want[i], 1e-4, 1e-5)) {
      print_error("attention n_q=%d heads=%d/%d hd=%d n_kv=%d mask=%d: out[%zu] = %g, want %g\n",
                  n_q, n_head, n_head_kv, hd, n_kv, explicit_mask, i, static_cast<double>(out[i]),
                  want[i]);
      fail();
    }
  }
}

void test_attention(void **) {
  std::mt19937 rng(5);
  const Isa prev = active_isa();
  for (Isa isa : isas()) {
    set_active_isa(isa);
    run_attention_case(1, 2, 2, 8, 1, false, rng);       // single position
    run_attention_case(5, 4, 2, 64, 20, false, rng);     // GQA, causal with a cached prefix
    run_attention_case(5, 6, 1, 13, 5, false, rng);      // multi-query, odd head_dim
    run_attention_case(7, 4, 4, 32, 30, true, rng);      // explicit (tree-like) mask
    run_attention_case(3, 12, 2, 128, 300, false, rng);  // Qwen-like head shape
  }
  set_active_isa(prev);
}

void test_attention_errors(void **) {
  float buf[64] = {};
  // 3 query heads over 2 key/value heads: 3 % 2 != 0.
  specinfer_attention_args a = attention_args(2, 3, 2, 4, 2, buf, buf, buf, buf);
  const specinfer_kernels *k = backend_kernel_table();
  assert_int_equal(k->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.n_head_kv = 1;
  a.n_kv = 1;  // causal needs n_kv >= n_q
  assert_int_equal(k->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.n_kv = 2;
  a.q = nullptr;
  assert_int_equal(k->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.q = buf;
  a.struct_size = 4;
  assert_int_equal(k->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.struct_size = sizeof a;
  assert_int_equal(k->attention(&a), SPECINFER_OK);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm),          cmocka_unit_test(test_rope),
      cmocka_unit_test(test_rope_freqs),       cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_silu_mul_add),     cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_errors), cmocka_unit_test(test_exp_sub_sum_lanes),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
