// Matmul: every instruction set this CPU supports, for every weight type, against a double
// precision reference built from the scalar reference dequantizer.
//
// The quantized kernels multiply int8-quantized activations, so their reference uses the same
// quantized activations (dequantized); the sgemm path uses the float activations. Tolerance:
// |y - ref| <= 2e-5 * sum_c |W[r][c] * X[t][c]| + 1e-6 (float summation order only). Random but
// valid blocks: random bytes with finite scales.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/kernel_table.h"
#include "backend/matmul.h"
#include "backend/quant.h"

#include "support/cmocka_setup.h"

using namespace specinfer;

namespace {

const int32_t kTypes[] = {
    SPECINFER_WTYPE_F32,  SPECINFER_WTYPE_F16,  SPECINFER_WTYPE_BF16, SPECINFER_WTYPE_Q4_0,
    SPECINFER_WTYPE_Q4_1, SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q5_1, SPECINFER_WTYPE_Q8_0,
    SPECINFER_WTYPE_Q8_1, SPECINFER_WTYPE_Q2_K, SPECINFER_WTYPE_Q3_K, SPECINFER_WTYPE_Q4_K,
    SPECINFER_WTYPE_Q5_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q8_K, SPECINFER_WTYPE_Q3_0};

void set16(uint8_t *p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// n_rows rows of n_cols random values of type wtype.
std::vector<uint8_t> random_weights(int32_t wtype, int64_t n_rows, int64_t n_cols,
                                    std::mt19937 &rng) {
  const size_t rs = wtype_row_size(wtype, n_cols);
  std::vector<uint8_t> w(rs * static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), scale(0.001f, 0.05f);
  const int64_t n = n_rows * n_cols;
  if (wtype == SPECINFER_WTYPE_F32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = u(rng);
      std::memcpy(w.data() + 4 * i, &v, 4);
    }
    return w;
  }
  if (wtype == SPECINFER_WTYPE_F16 || wtype == SPECINFER_WTYPE_BF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = u(rng);
      const uint16_t h = wtype == SPECINFER_WTYPE_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(w.data() + 2 * i, &h, 2);
    }
    return w;
  }
  for (auto &b : w) b = static_cast<uint8_t>(byte(rng));
  const size_t bb = wtype_block_bytes(wtype);
  for (size_t off = 0; off < w.size(); off += bb) {
    uint8_t *p = w.data() + off;
    switch (wtype) {
      case SPECINFER_WTYPE_Q4_0:
      case SPECINFER_WTYPE_Q5_0:
      case SPECINFER_WTYPE_Q8_0:
      case SPECINFER_WTYPE_Q3_0:
        set16(p, scale(rng));
        break;
      case SPECINFER_WTYPE_Q4_1:
      case SPECINFER_WTYPE_Q5_1:
      case SPECINFER_WTYPE_Q8_1:
        set16(p, scale(rng));
        set16(p + 2, u(rng) * 0.1f);
        break;
      case SPECINFER_WTYPE_Q2_K:
        set16(p + 80, scale(rng));
        set16(p + 82, scale(rng));
        break;
      case SPECINFER_WTYPE_Q3_K:
        set16(p + 108, scale(rng));
        break;
      case SPECINFER_WTYPE_Q4_K:
      case SPECINFER_WTYPE_Q5_K:
        set16(p, scale(rng) * 0.1f);
        set16(p + 2, scale(rng) * 0.1f);
        break;
      case SPECINFER_WTYPE_Q6_K:
        set16(p + 208, scale(rng) * 0.1f);
        break;
      case SPECINFER_WTYPE_Q8_K: {
        const float d = scale(rng);
        std::memcpy(p, &d, 4);
        break;
      }
      default:
        break;
    }
  }
  return w;
}

// The activations the quantized kernels actually multiply, as floats.
std::vector<float> kernel_view_of_x(int32_t wtype, const std::vector<float> &x, int64_t n_tok,
                                    int64_t n_cols) {
  std::vector<float> out(x.size());
  const ActKind kind = act_kind(wtype);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float *xt = x.data() + t * n_cols;
    float *ot = out.data() + t * n_cols;
    if (kind == ActKind::q8) {
      std::vector<ActQ8> q(static_cast<size_t>(n_cols / 32));
      quantize_act_q8(xt, q.data(), n_cols);
      for (int64_t c = 0; c < n_cols; ++c)
        ot[c] = q[static_cast<size_t>(c / 32)].d * q[static_cast<size_t>(c / 32)].qs[c % 32];
    } else if (kind == ActKind::q8k) {
      std::vector<ActQ8K> q(static_cast<size_t>(n_cols / 256));
      quantize_act_q8k(xt, q.data(), n_cols);
      for (int64_t c = 0; c < n_cols; ++c)
        ot[c] = q[static_cast<size_t>(c / 256)].d * q[static_cast<size_t>(c / 256)].qs[c % 256];
    } else {
      std::memcpy(ot, xt, static_cast<size_t>(n_cols) * sizeof(float));
    }
  }
  return out;
}

struct Case {
  int32_t wtype;
  int64_t n_rows, n_cols;
};

int64_t cols_for(int32_t wtype) {
  const int64_t bs = wtype_block_size(wtype);
  return bs == 256 ? 512 : bs == 32 ? 160 : 77;  // float types: odd count exercises the tails
}

// Compares y (n_tok x n_rows) with the double-precision reference; returns the number of
// mismatches (the first few printed). xv: the activations as the kernel multiplies them.
int compare(const char *what, int32_t wtype, int64_t n_rows, int64_t n_cols, int64_t n_tok,
            const std::vector<float> &wdeq, const std::vector<float> &xv,
            const std::vector<float> &y) {
  int bad = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t r = 0; r < n_rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t c = 0; c < n_cols; ++c) {
        const double p = static_cast<double>(wdeq[static_cast<size_t>(r * n_cols + c)]) *
                         xv[static_cast<size_t>(t * n_cols + c)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = y[static_cast<size_t>(t * n_rows + r)];
      if (!(std::fabs(got - ref) <= 2e-5 * mag + 1e-6)) {
        if (bad < 3)
          print_error("%s %s tok=%lld t=%lld r=%lld: got %.8g want %.8g (mag %.3g)\n",
                      wtype_name(wtype), what, static_cast<long long>(n_tok),
                      static_cast<long long>(t), static_cast<long long>(r), got, ref, mag);
        ++bad;
      }
    }
  }
  return bad;
}

// Checks one (type, isa, path, n_tok); returns the number of mismatches (printed).
int check(int32_t wtype, Isa isa, MatmulPath path, int64_t n_rows, int64_t n_cols, int64_t n_tok,
          const std::vector<uint8_t> &w, const std::vector<float> &wdeq,
          const std::vector<float> &x) {
  const bool blas =
      path == MatmulPath::blas ||
      (path == MatmulPath::automatic && n_tok >= kBlasMinTokens && wtype == SPECINFER_WTYPE_F32);
  const std::vector<float> xv = blas ? x : kernel_view_of_x(wtype, x, n_tok, n_cols);
  std::vector<float> y(static_cast<size_t>(n_tok * n_rows), NAN);
  matmul_with(isa, path, wtype, w.data(), n_rows, n_cols, x.data(), n_tok, y.data());
  char what[64];
  std::snprintf(what, sizeof what, "isa=%s path=%d", isa_name(isa), static_cast<int>(path));
  return compare(what, wtype, n_rows, n_cols, n_tok, wdeq, xv, y);
}

void test_all_types_all_isas(void **) {
  std::mt19937 rng(20241122);
  const int64_t n_rows = 37;
  const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33};
  int bad = 0;
  for (int32_t wtype : kTypes) {
    const int64_t n_cols = cols_for(wtype);
    const auto w = random_weights(wtype, n_rows, n_cols, rng);
    std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
    dequantize_row_ref(wtype, w.data(), wdeq.data(), n_rows * n_cols);
    for (float v : wdeq) assert_true(std::isfinite(v));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(33 * n_cols));
    for (auto &v : x) v = nd(rng);
    for (int isa_i = 0; isa_i <= 2; ++isa_i) {
      const Isa isa = static_cast<Isa>(isa_i);
      if (!isa_available(isa)) continue;
      for (int64_t nt : toks)
        bad += check(wtype, isa, MatmulPath::automatic, n_rows, n_cols, nt, w, wdeq, x);
      // The row kernels with many tokens (several tiles), and sgemm with few.
      bad += check(wtype, isa, MatmulPath::kernels, n_rows, n_cols, 33, w, wdeq, x);
      bad += check(wtype, isa, MatmulPath::blas, n_rows, n_cols, 3, w, wdeq, x);
    }
  }
  assert_int_equal(bad, 0);
}

// Bigger shapes so that the rows are split over several tasks.
void test_parallel_shapes(void **) {
  std::mt19937 rng(7);
  const int32_t types[] = {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q8_0,
                           SPECINFER_WTYPE_F16};
  int bad = 0;
  for (int32_t wtype : types) {
    const int64_t n_rows = 301, n_cols = 1024;
    const auto w = random_weights(wtype, n_rows, n_cols, rng);
    std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
    dequantize_row_ref(wtype, w.data(), wdeq.data(), n_rows * n_cols);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(5 * n_cols));
    for (auto &v : x) v = nd(rng);
    bad += check(wtype, active_isa(), MatmulPath::automatic, n_rows, n_cols, 5, w, wdeq, x);
  }
  assert_int_equal(bad, 0);
}

// The quantized kernels stay close to the exact product with the float activations too: the
// activation rounding error is at most half a step per value.
void test_activation_error_bound(void **) {
  std::mt19937 rng(99);
  const int64_t n_rows = 16, n_cols = 512;
  const auto w = random_weights(SPECINFER_WTYPE_Q4_K, n_rows, n_cols, rng);
  std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
  dequantize_row_ref(SPECINFER_WTYPE_Q4_K, w.data(), wdeq.data(), n_rows * n_cols);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_cols));
  for (auto &v : x) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(n_rows));
  matmul(SPECINFER_WTYPE_Q4_K, w.data(), n_rows, n_cols, x.data(), 1, y.data());
  float amax[2] = {0, 0};
  for (int64_t c = 0; c < n_cols; ++c)
    amax[c / 256] = std::fmax(amax[c / 256], std::fabs(x[static_cast<size_t>(c)]));
  for (int64_t r = 0; r < n_rows; ++r) {
    double ref = 0, bound = 1e-5;
    for (int64_t c = 0; c < n_cols; ++c) {
      const double wv = wdeq[static_cast<size_t>(r * n_cols + c)];
      ref += wv * x[static_cast<size_t>(c)];
      bound += std::fabs(wv) * amax[c / 256] / 254.0 * 1.001 +
               std::fabs(wv * x[static_cast<size_t>(c)]) * 2e-5;
    }
    assert_true(std::fabs(y[static_cast<size_t>(r)] - ref) <= bound);
  }
}

// Blocks at the extremes of their integer ranges times activations that all quantize to +-127:
// the SIMD kernels sum several byte products in int16 before widening, and these are the inputs
// closest to overflowing them (e.g. Q6_K: 2 * 2 * 63 * 127 = 32004 per lane). Every instruction set
// must match the reference.
void test_extreme_blocks(void **) {
  const int32_t types[] = {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q5_K, SPECINFER_WTYPE_Q6_K,
                           SPECINFER_WTYPE_Q4_0, SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q8_0,
                           SPECINFER_WTYPE_Q4_1, SPECINFER_WTYPE_Q5_1};
  const int64_t n_rows = 8, n_cols = 512;
  int bad = 0;
  for (int32_t wtype : types) {
    const size_t rs = wtype_row_size(wtype, n_cols), bb = wtype_block_bytes(wtype);
    std::vector<uint8_t> w(rs * n_rows);
    // Row r: bytes all 0xFF (largest values, largest scales), all 0x00 (smallest) or alternating.
    for (int64_t r = 0; r < n_rows; ++r)
      for (size_t i = 0; i < rs; ++i)
        w[static_cast<size_t>(r) * rs + i] = r % 3 == 0   ? 0xFF
                                             : r % 3 == 1 ? 0x00
                                                          : (i % 2 ? 0xFF : 0x00);
    for (size_t off = 0; off < w.size(); off += bb) {
      uint8_t *p = w.data() + off;
      switch (wtype) {
        case SPECINFER_WTYPE_Q4_K:
        case SPECINFER_WTYPE_Q5_K:
          set16(p, 0.01f);
          set16(p + 2, 0.02f);
          break;
        case SPECINFER_WTYPE_Q6_K:
          set16(p + 208, 0.01f);
          for (int g = 0; g < 16; ++g) p[192 + g] = static_cast<uint8_t>(g % 2 ? 127 : -128);
          break;
        case SPECINFER_WTYPE_Q4_1:
        case SPECINFER_WTYPE_Q5_1:
          set16(p, 0.01f);
          set16(p + 2, -0.05f);
          break;
        default:
          set16(p, 0.01f);
          break;
      }
    }
    std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
    dequantize_row_ref(wtype, w.data(), wdeq.data(), n_rows * n_cols);
    // Tokens: all +1, all -1, alternating signs, and a ramp.
    const int64_t n_tok = 4;
    std::vector<float> x(static_cast<size_t>(n_tok * n_cols));
    for (int64_t c = 0; c < n_cols; ++c) {
      x[static_cast<size_t>(c)] = 1.0f;
      x[static_cast<size_t>(n_cols + c)] = -1.0f;
      x[static_cast<size_t>(2 * n_cols + c)] = c % 2 ? -1.0f : 1.0f;
      x[static_cast<size_t>(3 * n_cols + c)] = static_cast<float>(c % 7) - 3.0f;
    }
    for (int isa_i = 0; isa_i <= 2; ++isa_i) {
      const Isa isa = static_cast<Isa>(isa_i);
      if (!isa_available(isa)) continue;
      for (int64_t nt = 1; nt <= n_tok; ++nt)
        bad += check(wtype, isa, MatmulPath::kernels, n_rows, n_cols, nt, w, wdeq, x);
    }
  }
  assert_int_equal(bad, 0);
}

// The activation reorderings the AVX2 kernels use are permutations of each 64-value chunk.
void test_activation_orders(void **) {
  ActQ8K a[2], b[2];
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 256; ++i) a[k].qs[i] = static_cast<int8_t>((i * 7 + k) & 0x7F);
  std::memcpy(b, a, sizeof a);
  act_pair_quarters(b, 2);
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 256; ++i) {
      const int q = (i % 64) / 16, src = i - i % 64 + (q == 1 ? 2 : q == 2 ? 1 : q) * 16 + i % 16;
      assert_int_equal(b[k].qs[i], a[k].qs[src]);
    }
  act_pair_quarters(b, 2);
  assert_memory_equal(a, b, sizeof a);
  act_pair_lanes16(b, 2);
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 256; c += 64) {
      int seen[64] = {};
      for (int i = 0; i < 64; ++i) {
        int found = -1;
        for (int j = 0; j < 64; ++j)
          if (a[k].qs[c + j] == b[k].qs[c + i] && !seen[j]) {
            found = j;
            break;
          }
        assert_true(found >= 0);
        seen[found] = 1;
      }
      // Lane 0 of the second half is value pair 1 of the first half (A[1]).
      assert_int_equal(b[k].qs[c + 32], a[k].qs[c + 2]);
      assert_int_equal(b[k].qs[c + 2], a[k].qs[c + 34]);
    }
}

#if defined(SPECINFER_AVX512_EMULATION)
}  // namespace
namespace specinfer {
MatmulRowsFn matmul_kernel_avx512_emulated(int32_t wtype) noexcept;  // tests/support
}
namespace {

// The emulated AVX-512 row kernel for wtype, run as the dispatcher runs a native one.
std::vector<float> run_emulated(MatmulRowsFn fn, int32_t wtype, const std::vector<uint8_t> &w,
                                int64_t n_rows, int64_t n_cols, const float *x, int64_t n_tok) {
  std::vector<float> y(static_cast<size_t>(n_tok * n_rows), NAN);
  matmul_rows_with(fn, Isa::avx512, wtype, w.data(), n_rows, n_cols, x, n_tok, y.data());
  return y;
}
#endif

// The AVX-512 kernels on this CPU even without AVX-512: compiled over software intrinsics
// (tests/support/avx512_emulation.h, SIMDe), against the same reference and tolerance as the
// native kernels, at the integer extremes, and batch-invariant (a token's result bit-identical
// alone and in any batch). Skipped when the build has no SIMDe or the CPU lacks AVX2 (the
// emulation runs on AVX2 code).
void test_avx512_emulated(void **) {
#if defined(SPECINFER_AVX512_EMULATION)
  if (!isa_available(Isa::avx2)) {
    skip();
    return;
  }
  std::mt19937 rng(512);
  const int64_t n_rows = 37;
  const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33};
  int bad = 0, covered = 0;
  for (int32_t wtype : kTypes) {
    const MatmulRowsFn fn = matmul_kernel_avx512_emulated(wtype);
    if (fn == nullptr) continue;
    ++covered;
    for (int64_t n_cols : {cols_for(wtype), 4 * cols_for(wtype)}) {
      auto w = random_weights(wtype, n_rows, n_cols, rng);
      // Rows at the integer extremes (Q8_0: -128, whose magnitude only fits unsigned; Q6_K: q = 63
      // and 0 with scales 127 and -128, the largest vpmaddubsw pair sums).
      const size_t rs = wtype_row_size(wtype, n_cols), bb = wtype_block_bytes(wtype);
      for (int64_t r = 0; r < 3; ++r)
        for (size_t off = static_cast<size_t>(r) * rs; off < static_cast<size_t>(r + 1) * rs;
             off += bb) {
          const int fill = r == 0 ? 0x80 : r == 1 ? 0xFF : 0x00;
          if (wtype_block_size(wtype) == 32) {
            std::memset(w.data() + off + 2, fill, bb - 2);
          } else if (wtype == SPECINFER_WTYPE_Q6_K) {
            std::memset(w.data() + off, r == 0 ? 0xFF : fill, 192);  // ql, qh
            for (int g = 0; g < 16; ++g)
              w[off + 192 + static_cast<size_t>(g)] = static_cast<uint8_t>(g % 2 ? 127 : -128);
          }
        }
      std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
      dequantize_row_ref(wtype, w.data(), wdeq.data(), n_rows * n_cols);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(33 * n_cols));
      for (auto &v : x) v = nd(rng);
      for (int64_t c = 0; c < n_cols; ++c)
        x[static_cast<size_t>(c)] = c % 2 ? -1.0f : 1.0f;  // all +-127
      for (int64_t nt : toks) {
        const std::vector<float> y = run_emulated(fn, wtype, w, n_rows, n_cols, x.data(), nt);
        bad += compare("avx512 (emulated)", wtype, n_rows, n_cols, nt, wdeq,
                       kernel_view_of_x(wtype, x, nt, n_cols), y);
        // Q6_K: the same int32 sums and float step as the AVX2 kernels, so the same bits.
        if (wtype == SPECINFER_WTYPE_Q6_K) {
          std::vector<float> y2(y.size());
          matmul_with(Isa::avx2, MatmulPath::kernels, wtype, w.data(), n_rows, n_cols, x.data(), nt,
                      y2.data());
          if (std::memcmp(y2.data(), y.data(), y.size() * sizeof(float)) != 0) {
            print_error("q6_K avx512 (emulated) differs from avx2 at %lld tokens\n",
                        static_cast<long long>(nt));
            ++bad;
          }
        }
        // Batch invariance: every token alone gives the same bits.
        for (int64_t t = 0; t < nt; ++t) {
          const std::vector<float> y1 =
              run_emulated(fn, wtype, w, n_rows, n_cols, x.data() + t * n_cols, 1);
          if (std::memcmp(y1.data(), y.data() + t * n_rows,
                          static_cast<size_t>(n_rows) * sizeof(float)) != 0) {
            if (bad < 3)
              print_error("%s avx512 (emulated): token %lld of %lld differs from the token alone\n",
                          wtype_name(wtype), static_cast<long long>(t), static_cast<long long>(nt));
            ++bad;
          }
        }
      }
    }
  }
  assert_true(covered >= 7);  // F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q6_K
  assert_int_equal(bad, 0);
#else
  skip();
#endif
}

void test_kernel_table_errors(void **) {
  const specinfer_kernels *k = backend_kernel_table();
  assert_non_null(k);
  assert_true(k->struct_size == sizeof(specinfer_kernels));
  float x[64] = {}, y[64] = {};
  uint8_t w[1024] = {};
  assert_int_equal(k->matmul(SPECINFER_WTYPE_Q4_K, w, 1, 100, x, 1, y),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul(4, w, 1, 32, x, 1, y), SPECINFER_ERR_UNSUPPORTED);
  assert_int_equal(k->matmul(SPECINFER_WTYPE_Q8_0, nullptr, 1, 32, x, 1, y),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul(SPECINFER_WTYPE_Q8_0, w, 0, 32, x, 1, y),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul(SPECINFER_WTYPE_Q8_0, w, 1, 32, x, -1, y),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul(SPECINFER_WTYPE_Q8_0, w, 1, 32, x, 1, y), SPECINFER_OK);
  assert_int_equal(k->dequantize_row(SPECINFER_WTYPE_Q8_0, w, y, 33),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->dequantize_row(SPECINFER_WTYPE_Q8_0, w, y, 32), SPECINFER_OK);
  assert_int_equal(k->row_size(SPECINFER_WTYPE_Q4_0, 64), 36);
  assert_int_equal(k->block_size(SPECINFER_WTYPE_Q6_K), 256);
  const char *isa = k->isa();
  assert_true(std::strcmp(isa, "scalar") == 0 || std::strcmp(isa, "avx2") == 0 ||
              std::strcmp(isa, "avx512") == 0);
  assert_int_equal(k->attention(nullptr), SPECINFER_ERR_INVALID_ARGUMENT);
}

void test_isa_override(void **) {
  const Isa prev = set_active_isa(Isa::scalar);
  assert_string_equal(backend_isa(), "scalar");
  set_active_isa(Isa::avx512);  // capped at what the CPU has
  assert_int_equal(static_cast<int>(active_isa()), static_cast<int>(cpu_isa()));
  set_active_isa(prev);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_types_all_isas),     cmocka_unit_test(test_parallel_shapes),
      cmocka_unit_test(test_activation_error_bound), cmocka_unit_test(test_extreme_blocks),
      cmocka_unit_test(test_activation_orders),      cmocka_unit_test(test_avx512_emulated),
      cmocka_unit_test(test_kernel_table_errors),    cmocka_unit_test(test_isa_override),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
