// Exactness of speculative decoding rests on one property of the matmul kernels: a token's output
// must not depend on which other tokens share the call. Verifying k+1 tokens in one pass must give
// bit for bit the logits that k+1 single-token passes give, or greedy speculative output could
// differ from plain greedy output at a near tie. This test checks that property through the
// kernel table for every weight type and every instruction set the CPU has; for quantized weights
// at any batch size (prefill included), for float weights below the sgemm threshold (sessions draft
// at most 16 tokens, so verify batches are <= 17).

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/kernel_table.h"
#include "util/isa.h"

#include "support/cmocka_setup.h"

namespace {

struct Layout {
  int32_t wtype;
  int block_bytes;
  std::vector<int> fp16_offsets;  // where a block keeps its fp16 scales
  bool all_fp16 = false;
  bool bf16 = false;
};

const Layout kLayouts[] = {
    {SPECINFER_WTYPE_F32, 4, {}},
    {SPECINFER_WTYPE_F16, 2, {}, true},
    {SPECINFER_WTYPE_BF16, 2, {}, false, true},
    {SPECINFER_WTYPE_Q4_0, 18, {0}},
    {SPECINFER_WTYPE_Q4_1, 20, {0, 2}},
    {SPECINFER_WTYPE_Q5_0, 22, {0}},
    {SPECINFER_WTYPE_Q5_1, 24, {0, 2}},
    {SPECINFER_WTYPE_Q8_0, 34, {0}},
    {SPECINFER_WTYPE_Q4_K, 144, {0, 2}},
    {SPECINFER_WTYPE_Q5_K, 176, {0, 2}},
    {SPECINFER_WTYPE_Q6_K, 210, {208}},
};

uint16_t small_half(std::mt19937 &rng) {
  // Positive halves between about 2^-9 and 2^-6: finite scales of realistic size.
  return static_cast<uint16_t>(0x1800 + rng() % 0x0C00);
}

std::vector<uint8_t> weights(const Layout &l, int64_t rows, int64_t cols, std::mt19937 &rng) {
  const specinfer_kernels *k = specinfer::backend_kernel_table();
  size_t row = k->row_size(l.wtype, cols);
  std::vector<uint8_t> w(row * rows);
  for (auto &b : w) b = static_cast<uint8_t>(rng());
  if (l.wtype == SPECINFER_WTYPE_F32) {
    std::uniform_real_distribution<float> u(-1, 1);
    for (size_t i = 0; i < w.size() / 4; ++i) {
      float v = u(rng);
      std::memcpy(&w[i * 4], &v, 4);
    }
  } else if (l.all_fp16 || l.bf16) {
    for (size_t i = 0; i < w.size() / 2; ++i) {
      uint16_t h = l.bf16
                       ? static_cast<uint16_t>(0x3C00 + rng() % 0x0400 - 0x0200 + (rng() & 0x8000))
                       : static_cast<uint16_t>(small_half(rng) + 0x1000 + (rng() & 0x8000));
      std::memcpy(&w[i * 2], &h, 2);
    }
  } else {
    for (size_t b = 0; b < w.size() / l.block_bytes; ++b)
      for (int off : l.fp16_offsets) {
        uint16_t h = small_half(rng);
        std::memcpy(&w[b * l.block_bytes + off], &h, 2);
      }
  }
  return w;
}

void test_token_outputs_do_not_depend_on_batch(void **) {
  const specinfer_kernels *k = specinfer::backend_kernel_table();
  std::mt19937 rng(1234);
  std::normal_distribution<float> gauss(0, 1);
  const int64_t rows = 67;
  int failures = 0;
  for (specinfer::Isa isa :
       {specinfer::Isa::scalar, specinfer::Isa::avx2, specinfer::Isa::avx512}) {
    if (!specinfer::isa_available(isa)) continue;
    specinfer::Isa prev = specinfer::set_active_isa(isa);
    for (const Layout &l : kLayouts)
      for (int64_t cols : {int64_t{512}, int64_t{1536}}) {
        assert_int_equal(k->row_size(l.wtype, cols),
                         static_cast<size_t>(cols / k->block_size(l.wtype) * l.block_bytes));
        std::vector<uint8_t> w = weights(l, rows, cols, rng);
        for (int64_t n_tok : {2, 3, 5, 8, 9, 13, 17, 40}) {
          // F32 weights go to sgemm from 32 tokens on (prefill); quantized weights never do.
          if (n_tok >= 32 && l.wtype == SPECINFER_WTYPE_F32) continue;
          std::vector<float> x(static_cast<size_t>(n_tok * cols));
          for (auto &v : x) v = gauss(rng);
          std::vector<float> batched(static_cast<size_t>(n_tok * rows));
          assert_int_equal(
              k->matmul(l.wtype, w.data(), rows, cols, x.data(), n_tok, batched.data()),
              SPECINFER_OK);
          for (int64_t t = 0; t < n_tok; ++t) {
            std::vector<float> single(static_cast<size_t>(rows));
            assert_int_equal(
                k->matmul(l.wtype, w.data(), rows, cols, x.data() + t * cols, 1, single.data()),
                SPECINFER_OK);
            if (std::memcmp(single.data(), batched.data() + t * rows, rows * sizeof(float)) != 0) {
              std::fprintf(stderr,
                           "%s: type %d, token %lld of %lld differs from a single-token call\n",
                           specinfer::isa_name(isa), l.wtype, static_cast<long long>(t),
                           static_cast<long long>(n_tok));
              ++failures;
              break;
            }
          }
        }
      }
    specinfer::set_active_isa(prev);
  }
  assert_int_equal(failures, 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_token_outputs_do_not_depend_on_batch)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
