// Block formats: handcrafted blocks per type checked against values worked out by hand from the
// documented formulas; fp16 / bf16 conversion; activation quantization bounds; sizes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/matmul.h"
#include "backend/quant.h"
#include "util/error.h"

#include "support/cmocka_setup.h"

using namespace specinfer;

namespace {

std::vector<float> deq(int32_t wtype, const void *blk, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row_ref(wtype, blk, y.data(), n);
  // The fast entry point must agree exactly.
  std::vector<float> y2(static_cast<size_t>(n));
  dequantize_row(wtype, blk, y2.data(), n);
  for (int64_t i = 0; i < n; ++i)
    assert_true(y[static_cast<size_t>(i)] == y2[static_cast<size_t>(i)]);
  return y;
}

void expect(const std::vector<float> &y, size_t i, float want) {
  if (y[i] != want) {
    print_error("value %zu: got %.9g, want %.9g\n", i, static_cast<double>(y[i]),
                static_cast<double>(want));
    fail();
  }
}

void test_sizes(void **) {
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q4_K, 1536), 6 * 144);
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q6_K, 8960), 35 * 210);
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q8_0, 640), 20 * 34);
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_F16, 7), 14);
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q4_K, 640), 0);  // not a multiple of 256
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q4_0, 0), 0);
  assert_int_equal(wtype_row_size(4, 32), 0);  // unused type number
  assert_int_equal(wtype_block_size(SPECINFER_WTYPE_Q5_0), 32);
  assert_int_equal(wtype_row_size(SPECINFER_WTYPE_Q3_0, 896), 28 * 14);
  assert_int_equal(wtype_block_size(SPECINFER_WTYPE_Q3_K), 256);
  assert_int_equal(wtype_block_size(SPECINFER_WTYPE_BF16), 1);
  assert_int_equal(wtype_block_size(99), 0);
}

void test_fp16(void **) {
  assert_true(fp16_to_fp32(0x3C00) == 1.0f);
  assert_true(fp16_to_fp32(0xC000) == -2.0f);
  assert_true(fp16_to_fp32(0x7BFF) == 65504.0f);
  assert_true(fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));
  assert_true(fp16_to_fp32(0x0400) == std::ldexp(1.0f, -14));
  assert_true(fp16_to_fp32(0x3555) == 0.333251953125f);
  assert_true(std::isinf(fp16_to_fp32(0xFC00)) && fp16_to_fp32(0xFC00) < 0);
  assert_true(std::isnan(fp16_to_fp32(0x7E00)));
  assert_int_equal(fp32_to_fp16(1.0f), 0x3C00);
  assert_int_equal(fp32_to_fp16(65520.0f), 0x7C00);  // rounds up to inf
  assert_int_equal(fp32_to_fp16(65519.0f), 0x7BFF);
  assert_int_equal(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  assert_int_equal(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  assert_int_equal(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  assert_int_equal(fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie to even (up)
  // Every finite half survives a round trip.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7C00u) == 0x7C00u) continue;
    const uint16_t back = fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h)));
    if (back != h) {
      print_error("half 0x%04x came back as 0x%04x\n", h, back);
      fail();
    }
  }
  assert_true(bf16_to_fp32(0x3F80) == 1.0f);
  assert_true(bf16_to_fp32(0xC040) == -3.0f);
  assert_int_equal(fp32_to_bf16(1.0f), 0x3F80);
  assert_int_equal(fp32_to_bf16(1.00390625f), 0x3F80);  // exactly half an ulp: to even
}

void test_q4_0_q4_1(void **) {
  BlockQ4_0 b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  auto y = deq(SPECINFER_WTYPE_Q4_0, &b, 32);
  expect(y, 0, -4.0f);   // 0.5 * (0 - 8)
  expect(y, 15, 3.5f);   // 0.5 * (15 - 8)
  expect(y, 16, 3.5f);   // high nibble of qs[0] = 15
  expect(y, 31, -4.0f);  // high nibble of qs[15] = 0
  BlockQ4_1 c{};
  c.d = 0x3400;  // 0.25
  c.m = 0xBC00;  // -1
  std::memcpy(c.qs, b.qs, 16);
  y = deq(SPECINFER_WTYPE_Q4_1, &c, 32);
  expect(y, 0, -1.0f);
  expect(y, 15, 2.75f);  // 0.25 * 15 - 1
  expect(y, 16, 2.75f);
  expect(y, 17, 2.5f);  // 0.25 * 14 - 1
}

void test_q5(void **) {
  BlockQ5_0 b{};
  b.d = 0x3C00;              // 1
  b.qh[0] = b.qh[1] = 0xFF;  // fifth bit set for values 0..15
  b.qs[0] = 0x3F;            // value 0: nibble 15, value 16: nibble 3
  auto y = deq(SPECINFER_WTYPE_Q5_0, &b, 32);
  expect(y, 0, 15.0f);    // (15 | 16) - 16
  expect(y, 1, 0.0f);     // (0 | 16) - 16
  expect(y, 16, -13.0f);  // 3 - 16
  expect(y, 17, -16.0f);
  BlockQ5_1 c{};
  c.d = 0x3800;  // 0.5
  c.m = 0x3C00;  // 1
  std::memcpy(c.qh, b.qh, 4);
  std::memcpy(c.qs, b.qs, 16);
  c.qh[3] = 0x80;  // value 31 gets the fifth bit
  y = deq(SPECINFER_WTYPE_Q5_1, &c, 32);
  expect(y, 0, 16.5f);  // 0.5 * 31 + 1
  expect(y, 1, 9.0f);   // 0.5 * 16 + 1
  expect(y, 16, 2.5f);  // 0.5 * 3 + 1
  expect(y, 17, 1.0f);
  expect(y, 31, 9.0f);  // 0.5 * 16 + 1
}

// Q3_0 (specinfer's own): value j's low two bits at bits 2 (j / 8) of qs[j % 8], its third bit at
// bit j of qh, value = d * (q - 4).
void test_q3_0(void **) {
  BlockQ3_0 b{};
  b.d = 0x3800;    // 0.5
  b.qs[0] = 0x1B;  // values 0, 8, 16, 24: low bits 3, 2, 1, 0
  b.qs[7] = 0xC0;  // value 31: low bits 3
  b.qh[0] = 0x01;  // value 0: third bit
  b.qh[3] = 0x80;  // value 31: third bit
  auto y = deq(SPECINFER_WTYPE_Q3_0, &b, 32);
  expect(y, 0, 1.5f);    // 0.5 * (7 - 4)
  expect(y, 8, -1.0f);   // 0.5 * (2 - 4)
  expect(y, 16, -1.5f);  // 0.5 * (1 - 4)
  expect(y, 24, -2.0f);  // 0.5 * (0 - 4)
  expect(y, 31, 1.5f);
  expect(y, 1, -2.0f);
}

void test_q8(void **) {
  BlockQ8_0 b{};
  b.d = 0x4000;  // 2
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  auto y = deq(SPECINFER_WTYPE_Q8_0, &b, 32);
  expect(y, 0, -32.0f);
  expect(y, 31, 30.0f);
  BlockQ8_K k{};
  k.d = 0.25f;
  for (int j = 0; j < 256; ++j) k.qs[j] = static_cast<int8_t>(j - 128);
  y = deq(SPECINFER_WTYPE_Q8_K, &k, 256);
  expect(y, 0, -32.0f);
  expect(y, 255, 31.75f);
}

void test_q2_k(void **) {
  BlockQ2_K b{};
  b.d = 0x3C00;                                             // 1
  b.dmin = 0x3800;                                          // 0.5
  for (int g = 0; g < 16; ++g) b.scales[g] = 3 | (2 << 4);  // scale 3, min 2
  b.scales[15] = 5 | (1 << 4);
  for (int i = 0; i < 64; ++i) b.qs[i] = 0xE4;  // 2-bit fields 0,1,2,3 at shifts 0,2,4,6
  auto y = deq(SPECINFER_WTYPE_Q2_K, &b, 256);
  // value v: field k = (v % 128) / 32 -> q = k; y = 3 q - 0.5 * 2
  expect(y, 0, -1.0f);
  expect(y, 32, 2.0f);
  expect(y, 64, 5.0f);
  expect(y, 96, 8.0f);
  expect(y, 128, -1.0f);
  expect(y, 255, 14.5f);  // group 15: 5 * 3 - 0.5 * 1
}

void test_q3_k(void **) {
  BlockQ3_K b{};
  b.d = 0x3C00;
  std::memset(b.hmask, 0xFF, 32);
  b.hmask[0] = 0xFE;  // value 0 (bit 0 of hmask[0]) has its high bit clear: q - 4
  std::memset(b.qs, 0xE4, 64);
  // Every group's 6-bit scale 33 (= +1): low nibbles 1, high 2-bit fields 2.
  std::memset(b.scales, 0x11, 8);
  std::memset(b.scales + 8, 0xAA, 4);
  // Group 15: scale 6 - 32 = -26 -> low nibble 6 (high nibble of byte 7), high bits 0 (bits 6-7
  // of byte 11).
  b.scales[7] = 0x61;
  b.scales[11] = 0x2A;
  auto y = deq(SPECINFER_WTYPE_Q3_K, &b, 256);
  expect(y, 0, -4.0f);  // 1 * (0 - 4)
  expect(y, 1, 0.0f);
  expect(y, 32, 1.0f);
  expect(y, 96, 3.0f);
  expect(y, 160, 1.0f);    // second half, field 1
  expect(y, 255, -78.0f);  // -26 * 3
}

void test_q4_k_q5_k(void **) {
  BlockQ4_K b{};
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  // scale of group g = g + 1, min = 2 g (all below 16 except group 7 below)
  const uint8_t sc[8] = {1, 2, 3, 4, 5, 6, 7, 45};
  const uint8_t mn[8] = {0, 2, 4, 6, 8, 10, 12, 50};
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = sc[j];
    b.scales[j + 4] = mn[j];
  }
  for (int j = 4; j < 8; ++j) {
    b.scales[j + 4] = static_cast<uint8_t>((sc[j] & 15) | ((mn[j] & 15) << 4));
    b.scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    b.scales[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
  }
  std::memset(b.qs, 0x21, 128);  // even groups q = 1, odd groups q = 2
  auto y = deq(SPECINFER_WTYPE_Q4_K, &b, 256);
  const float want4[8] = {1, 3, 1, 5, 1, 7, 1, 65};  // sc * q - 0.5 * mn
  for (int g = 0; g < 8; ++g) expect(y, static_cast<size_t>(32 * g + 5), want4[g]);
  BlockQ5_K c{};
  c.d = b.d;
  c.dmin = b.dmin;
  std::memcpy(c.scales, b.scales, 12);
  std::memcpy(c.qs, b.qs, 128);
  c.qh[0] = 0x01;  // value 0 (group 0) gets +16
  c.qh[3] = 0x80;  // value 32*7+3 (group 7) gets +16
  y = deq(SPECINFER_WTYPE_Q5_K, &c, 256);
  expect(y, 0, 17.0f);  // 1 * (1 + 16) - 0
  expect(y, 1, 1.0f);
  expect(y, 227, 785.0f);  // 45 * (2 + 16) - 25
  expect(y, 228, 65.0f);
}

void test_q6_k(void **) {
  BlockQ6_K b{};
  b.d = 0x3800;  // 0.5
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g - 8);
  b.ql[0] = 0x0F;
  b.qh[0] = 0x03;
  auto y = deq(SPECINFER_WTYPE_Q6_K, &b, 256);
  expect(y, 0, -124.0f);    // q = 15 | 3 << 4 = 63 -> 31; 0.5 * -8 * 31
  expect(y, 1, 128.0f);     // q = 0 -> -32; 0.5 * -8 * -32
  expect(y, 32, 96.0f);     // group 2: 0.5 * -6 * -32
  expect(y, 64, 64.0f);     // group 4
  expect(y, 255, -112.0f);  // group 15: 0.5 * 7 * -32
}

void test_float_types(void **) {
  const uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x3555};
  auto y = deq(SPECINFER_WTYPE_F16, h, 4);
  expect(y, 0, 1.0f);
  expect(y, 1, -2.0f);
  expect(y, 2, 65504.0f);
  expect(y, 3, 0.333251953125f);
  const uint16_t b[2] = {0x3F80, 0xC040};
  y = deq(SPECINFER_WTYPE_BF16, b, 2);
  expect(y, 0, 1.0f);
  expect(y, 1, -3.0f);
}

void test_dequant_errors(void **) {
  float out[64];
  BlockQ4_0 b{};
  try {
    dequantize_row_ref(SPECINFER_WTYPE_Q4_0, &b, out, 31);
    fail();
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_INVALID_ARGUMENT);
  }
  try {
    dequantize_row_ref(5, &b, out, 32);
    fail();
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_UNSUPPORTED);
  }
}

// Weight quantization (requant of a draft model): Q4_0 reproduces a block already on a Q4_0 grid
// exactly and never does worse (squared error) than its starting rule d = m / -8 (computed here
// independently); Q8_0 is within half a step; bad input gets a status.
void test_quantize_rows(void **) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> nib(0, 15);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (int rep = 0; rep < 200; ++rep) {
    BlockQ4_0 src{};
    src.d = fp32_to_fp16(0.001f + 0.0001f * static_cast<float>(rep));
    for (int j = 0; j < 16; ++j) src.qs[j] = static_cast<uint8_t>(nib(rng) | (nib(rng) << 4));
    src.qs[rep % 16] &= 0xF0;  // one value at q = 0: the block's value of largest magnitude, -8 d
    const std::vector<float> x = deq(SPECINFER_WTYPE_Q4_0, &src, 32);
    BlockQ4_0 back{};
    quantize_row_ref(SPECINFER_WTYPE_Q4_0, x.data(), &back, 32);
    const std::vector<float> y = deq(SPECINFER_WTYPE_Q4_0, &back, 32);
    for (size_t j = 0; j < 32; ++j) expect(y, j, x[j]);
  }
  // Q3_0 blocks come back as they were, the same way (one value at q = 0: -4 d).
  std::uniform_int_distribution<int> byte(0, 255);
  for (int rep = 0; rep < 200; ++rep) {
    BlockQ3_0 src{};
    src.d = fp32_to_fp16(0.001f + 0.0001f * static_cast<float>(rep));
    for (uint8_t &v : src.qs) v = static_cast<uint8_t>(byte(rng));
    for (uint8_t &v : src.qh) v = static_cast<uint8_t>(byte(rng));
    const int j0 = rep % 32;
    src.qs[j0 % 8] = static_cast<uint8_t>(src.qs[j0 % 8] & ~(3 << (2 * (j0 / 8))));
    src.qh[j0 / 8] = static_cast<uint8_t>(src.qh[j0 / 8] & ~(1 << (j0 % 8)));
    const std::vector<float> x = deq(SPECINFER_WTYPE_Q3_0, &src, 32);
    BlockQ3_0 back{};
    quantize_row_ref(SPECINFER_WTYPE_Q3_0, x.data(), &back, 32);
    const std::vector<float> y = deq(SPECINFER_WTYPE_Q3_0, &back, 32);
    for (size_t j = 0; j < 32; ++j) expect(y, j, x[j]);
  }
  int refit_better = 0;
  for (int rep = 0; rep < 200; ++rep) {
    float x[64];
    for (float &v : x) v = nd(rng) * (rep % 7 == 0 ? 50.0f : 1.0f);
    BlockQ4_0 q[2];
    BlockQ8_0 q8[2];
    quantize_row_ref(SPECINFER_WTYPE_Q4_0, x, q, 64);
    quantize_row_ref(SPECINFER_WTYPE_Q8_0, x, q8, 64);
    const std::vector<float> y = deq(SPECINFER_WTYPE_Q4_0, q, 64),
                             y8 = deq(SPECINFER_WTYPE_Q8_0, q8, 64);
    for (int b = 0; b < 2; ++b) {
      float m = 0.0f, amax = 0.0f;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[32 * b + j]) > amax) {
          amax = std::fabs(x[32 * b + j]);
          m = x[32 * b + j];
        }
      const float d = fp16_to_fp32(fp32_to_fp16(m / -8.0f));
      double plain = 0.0, ours = 0.0;
      for (int j = 0; j < 32; ++j) {
        const float v = x[32 * b + j];
        const float qv = std::min(15.0f, std::max(0.0f, std::nearbyint(v / d) + 8.0f));
        plain += static_cast<double>(v - d * (qv - 8.0f)) * (v - d * (qv - 8.0f));
        const double e = v - y[static_cast<size_t>(32 * b + j)];
        ours += e * e;
      }
      assert_true(ours <= plain * (1.0 + 1e-4));
      refit_better += ours < plain * (1.0 - 1e-3);
      const float d8 = fp16_to_fp32(q8[b].d);
      assert_true(std::fabs(d8 - amax / 127.0f) <= amax / 127.0f * 1e-3f);
      for (int j = 0; j < 32; ++j)
        assert_true(std::fabs(x[32 * b + j] - y8[static_cast<size_t>(32 * b + j)]) <=
                    0.5f * d8 * (1.0f + 1e-3f) + 1e-7f);
    }
  }
  assert_true(refit_better > 100);  // the refit does improve on most blocks (of 400)
  int refit_better3 = 0;
  for (int rep = 0; rep < 200; ++rep) {
    float x[32];
    for (float &v : x) v = nd(rng) * (rep % 7 == 0 ? 50.0f : 1.0f);
    BlockQ3_0 q{};
    quantize_row_ref(SPECINFER_WTYPE_Q3_0, x, &q, 32);
    const std::vector<float> y = deq(SPECINFER_WTYPE_Q3_0, &q, 32);
    float m = 0.0f, amax = 0.0f;
    for (float v : x)
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        m = v;
      }
    const float d = fp16_to_fp32(fp32_to_fp16(m / -4.0f));
    double plain = 0.0, ours = 0.0;
    for (int j = 0; j < 32; ++j) {
      const float qv = std::min(7.0f, std::max(0.0f, std::nearbyint(x[j] / d) + 4.0f));
      plain += static_cast<double>(x[j] - d * (qv - 4.0f)) * (x[j] - d * (qv - 4.0f));
      const double e = x[j] - y[static_cast<size_t>(j)];
      ours += e * e;
    }
    assert_true(ours <= plain * (1.0 + 1e-4));
    refit_better3 += ours < plain * (1.0 - 1e-3);
  }
  assert_true(refit_better3 > 50);  // of 200
  float bad[32] = {};
  BlockQ4_0 out{};
  const auto code = [&](int32_t wtype, const float *src, int64_t n) {
    try {
      quantize_row_ref(wtype, src, &out, n);
    } catch (const Error &e) {
      return e.code();
    }
    return SPECINFER_OK;
  };
  assert_int_equal(code(SPECINFER_WTYPE_Q4_0, bad, 32), SPECINFER_OK);  // all zeros: d = 0
  assert_int_equal(out.d, 0);
  assert_int_equal(code(SPECINFER_WTYPE_Q4_0, bad, 31), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(code(SPECINFER_WTYPE_Q4_0, nullptr, 32), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(code(SPECINFER_WTYPE_Q4_K, bad, 256), SPECINFER_ERR_UNSUPPORTED);
  assert_int_equal(code(999, bad, 32), SPECINFER_ERR_UNSUPPORTED);
  bad[7] = std::numeric_limits<float>::quiet_NaN();
  assert_int_equal(code(SPECINFER_WTYPE_Q8_0, bad, 32), SPECINFER_ERR_INVALID_ARGUMENT);
  bad[7] = std::numeric_limits<float>::infinity();
  assert_int_equal(code(SPECINFER_WTYPE_Q4_0, bad, 32), SPECINFER_ERR_INVALID_ARGUMENT);
}

// A row of Q4_0 or Q3_0 blocks is quantized eight blocks at a time (their sums vectorized across
// blocks): byte for byte what the blocks give one at a time, on ordinary, all-zero, tiny (the scale
// rounds to zero in fp16), huge (it overflows fp16) and single-spike blocks; a row with a NaN in
// its tenth block is refused, naming that block.
void test_quantize_groups_equal_blocks(void **) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n_blocks = 8 * 40 + 5;  // whole groups and a tail
  std::vector<float> x(size_t(n_blocks) * 32);
  for (int b = 0; b < n_blocks; ++b) {
    const float scale[] = {0.02f, 0.0f, 1e-9f, 1e6f, 3.0f, 0.5f};
    const float s = scale[(b * 7) % 6];
    for (int j = 0; j < 32; ++j) x[size_t(b * 32 + j)] = nd(rng) * s;
    if (b % 11 == 3) x[size_t(b * 32 + b % 32)] = -40.0f;  // one spike
  }
  for (int32_t wtype : {SPECINFER_WTYPE_Q4_0, SPECINFER_WTYPE_Q3_0}) {
    const size_t bb = wtype_row_size(wtype, 32);
    std::vector<uint8_t> rows(bb * size_t(n_blocks)), blocks(rows.size());
    quantize_row_ref(wtype, x.data(), rows.data(), int64_t(x.size()));
    for (int b = 0; b < n_blocks; ++b)
      quantize_row_ref(wtype, &x[size_t(b) * 32], &blocks[size_t(b) * bb], 32);
    assert_memory_equal(rows.data(), blocks.data(), rows.size());
  }
  std::vector<BlockQ4_0> whole(static_cast<size_t>(n_blocks));
  x[9 * 32 + 4] = std::numeric_limits<float>::quiet_NaN();
  try {
    quantize_row_ref(SPECINFER_WTYPE_Q4_0, x.data(), whole.data(), int64_t(x.size()));
    fail_msg("a NaN was quantized");
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(e.what(), "value 288..319"));
  }
}

// The int8 activations: within half a step of the input, and the block sums match.
void test_act_quant(void **) {
  std::vector<float> x(512);
  uint32_t s = 12345;
  for (auto &v : x) {
    s = s * 1664525u + 1013904223u;
    v = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 6.0f;
  }
  x[7] = 0.0f;
  std::vector<ActQ8> a(16);
  quantize_act_q8(x.data(), a.data(), 512);
  for (int b = 0; b < 16; ++b) {
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(32 * b + j)]));
      sum += a[static_cast<size_t>(b)].qs[j];
    }
    assert_int_equal(sum, a[static_cast<size_t>(b)].sum);
    for (int j = 0; j < 32; ++j) {
      const float back = a[static_cast<size_t>(b)].d * a[static_cast<size_t>(b)].qs[j];
      assert_true(std::fabs(back - x[static_cast<size_t>(32 * b + j)]) <=
                  amax / 254.0f * 1.0001f + 1e-7f);
    }
  }
  std::vector<ActQ8K> k(2);
  quantize_act_q8k(x.data(), k.data(), 512);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int j = 0; j < 256; ++j)
      amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(256 * b + j)]));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += k[static_cast<size_t>(b)].qs[16 * g + j];
      assert_int_equal(sum, k[static_cast<size_t>(b)].bsums[g]);
    }
    for (int j = 0; j < 256; ++j) {
      const float back = k[static_cast<size_t>(b)].d * k[static_cast<size_t>(b)].qs[j];
      assert_true(std::fabs(back - x[static_cast<size_t>(256 * b + j)]) <=
                  amax / 254.0f * 1.0001f + 1e-7f);
    }
  }
}

// The AVX2 activation quantizers produce exactly the bytes of the scalar ones: random values over
// many magnitudes, ties at .5 steps, an all-zero block, and blocks with inf / NaN.
void test_act_quant_avx2(void **) {
  if (!isa_available(Isa::avx2)) {
    skip();
    return;
  }
  const int64_t n = 256 * 12;
  std::vector<float> x(static_cast<size_t>(n));
  uint32_t s = 12345;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return s;
  };
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(next() >> 8) / 16777216.0f - 0.5f;
    x[static_cast<size_t>(i)] = std::ldexp(u, static_cast<int>(next() % 40) - 20);
  }
  for (int64_t i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0.0f;  // zero block
  for (int64_t i = 512; i < 768; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>(i % 255 - 127);  // exact steps
  for (int64_t i = 768; i < 1024; ++i)
    x[static_cast<size_t>(i)] = (static_cast<float>(i % 64) - 32.0f) * 0.5f;  // ties
  x[1100] = INFINITY;
  x[1400] = NAN;
  x[2000] = -0.0f;
  std::vector<ActQ8> a(static_cast<size_t>(n / 32)), b(a.size());
  quantize_act_q8(x.data(), a.data(), n);
  quantize_act_q8_avx2(x.data(), b.data(), n);
  for (size_t i = 0; i < a.size(); ++i) {
    assert_memory_equal(a[i].qs, b[i].qs, 32);
    assert_int_equal(a[i].sum, b[i].sum);
    assert_memory_equal(&a[i].d, &b[i].d, sizeof(float));  // NaN bit patterns included
  }
  std::vector<ActQ8K> c(static_cast<size_t>(n / 256)), e(c.size());
  quantize_act_q8k(x.data(), c.data(), n);
  quantize_act_q8k_avx2(x.data(), e.data(), n);
  for (size_t i = 0; i < c.size(); ++i) {
    assert_memory_equal(c[i].qs, e[i].qs, 256);
    assert_memory_equal(c[i].bsums, e[i].bsums, sizeof c[i].bsums);
    assert_memory_equal(&c[i].d, &e[i].d, sizeof(float));
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),         cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_q4_0_q4_1),     cmocka_unit_test(test_q5),
      cmocka_unit_test(test_q3_0),          cmocka_unit_test(test_q8),
      cmocka_unit_test(test_q2_k),          cmocka_unit_test(test_q3_k),
      cmocka_unit_test(test_q4_k_q5_k),     cmocka_unit_test(test_q6_k),
      cmocka_unit_test(test_float_types),   cmocka_unit_test(test_dequant_errors),
      cmocka_unit_test(test_act_quant),     cmocka_unit_test(test_act_quant_avx2),
      cmocka_unit_test(test_quantize_rows), cmocka_unit_test(test_quantize_groups_equal_blocks),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
