// Packed weights (lib/backend/packed.h): the repackings are lossless, packed matmuls match a
// double-precision reference on every instruction set the CPU has (and AVX-512 in emulation when
// built with SIMDe), the scalar and SIMD kernels agree bit for bit, a token's result does not
// depend on the batch it is in, and the kernel-table entries reject bad input. Reference tolerance
// as in test_backend_matmul.cpp: |y - ref| <= 2e-5 * sum_c |W[r][c] * X[t][c]| + 1e-6.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tbb/parallel_for.h>

#include "backend/kernel_table.h"
#include "backend/matmul.h"
#include "backend/packed.h"
#include "backend/quant.h"

#include "support/cmocka_setup.h"

#if defined(SPECINFER_AVX512_EMULATION)
namespace specinfer {  // tests/support/avx512_emulated_packed.cpp
void q4k_x8_rows_avx512_emulated(const PackedArgs &a, int64_t r0, int64_t r1) noexcept;
void q40_x4_rows_avx512_emulated(const PackedArgsX4 &a, int64_t r0, int64_t r1) noexcept;
void q6k_x16_rows_avx512_emulated(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
void q6k_x16_rows_avx512_split_emulated(const PackedArgsQ6 &a, int64_t r0, int64_t r1) noexcept;
void q4k_r16_rows_avx512_emulated(const PackedArgsR16 &a, int64_t r0, int64_t r1) noexcept;
void q32_r16_rows_avx512_emulated(const PackedArgsQ32 &a, int64_t r0, int64_t r1) noexcept;
void q6k_r16_rows_avx512_emulated(const PackedArgsQ6R16 &a, int64_t r0, int64_t r1) noexcept;
}  // namespace specinfer
#endif

using namespace specinfer;

namespace {

// The SIMD kernel sets to check against the scalar one: those of every instruction set above
// scalar that this CPU has (AVX-512 with both Q6_K row kernels, whichever this CPU picks), and the
// AVX-512 kernels over software intrinsics when the build has them (SIMDe; they run on AVX2 code).
struct Variant {
  std::string name;
  PackedKernels k;
};
std::vector<Variant> simd_variants() {
  std::vector<Variant> v;
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (isa_available(isa)) v.push_back({isa_name(isa), packed_kernels(isa)});
  if (isa_available(Isa::avx512)) {
    PackedKernels k = packed_kernels(Isa::avx512);
    const bool split = k.q6k_x16 == q6k_x16_rows_avx512_split;
    k.q6k_x16 = split ? q6k_x16_rows_avx512 : q6k_x16_rows_avx512_split;
    v.push_back({split ? "avx512 (Q6_K row pairs)" : "avx512 (Q6_K split)", k});
  }
#if defined(SPECINFER_AVX512_EMULATION)
  if (isa_available(Isa::avx2)) {
    PackedKernels k;
    k.q4k_x8 = q4k_x8_rows_avx512_emulated;
    k.q40_x4 = q40_x4_rows_avx512_emulated;
    k.q6k_x16 = q6k_x16_rows_avx512_emulated;
    k.q4k_r16 = q4k_r16_rows_avx512_emulated;
    k.q32_r16 = q32_r16_rows_avx512_emulated;
    k.q6k_r16 = q6k_r16_rows_avx512_emulated;
    k.simd_prep = true;
    v.push_back({"avx512 (emulated)", k});
    k.q6k_x16 = q6k_x16_rows_avx512_split_emulated;
    v.push_back({"avx512 (emulated, Q6_K split)", k});
  }
#endif
  return v;
}

void set16(uint8_t *p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random Q4_K rows with finite scales; `extreme` rows are all 0xFF nibbles and scales (the
// largest int16 lane sums the packed kernel forms: 16 * 15 * 127).
std::vector<uint8_t> q4k_weights(int64_t n_rows, int64_t n_cols, std::mt19937 &rng, bool extreme) {
  const size_t rs = wtype_row_size(SPECINFER_WTYPE_Q4_K, n_cols);
  std::vector<uint8_t> w(rs * static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0001f, 0.005f);
  for (auto &b : w) b = extreme ? 0xFF : static_cast<uint8_t>(byte(rng));
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ4_K)) {
    set16(w.data() + off, scale(rng));
    set16(w.data() + off + 2, scale(rng));
  }
  return w;
}

// Random Q4_0 rows; `extreme`: all nibbles 15 (the largest int16 lane sums of q40_x4: 4 * 2 * 15 *
// 127).
std::vector<uint8_t> q40_weights(int64_t n_rows, int64_t n_cols, std::mt19937 &rng, bool extreme) {
  const size_t rs = wtype_row_size(SPECINFER_WTYPE_Q4_0, n_cols);
  std::vector<uint8_t> w(rs * static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0001f, 0.005f);
  for (auto &b : w) b = extreme ? 0xFF : static_cast<uint8_t>(byte(rng));
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ4_0)) set16(w.data() + off, scale(rng));
  return w;
}

// Random Q6_K rows; `extreme`: every value 63 and every scale -128 (the largest int16 lane sums of
// q6k_x16: 2 * 2 * 63 * 128, and the largest scale magnitude).
std::vector<uint8_t> q6k_weights(int64_t n_rows, int64_t n_cols, std::mt19937 &rng, bool extreme) {
  const size_t rs = wtype_row_size(SPECINFER_WTYPE_Q6_K, n_cols);
  std::vector<uint8_t> w(rs * static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.00001f, 0.0005f);
  for (auto &b : w) b = extreme ? 0xFF : static_cast<uint8_t>(byte(rng));
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ6_K)) {
    if (extreme) std::memset(w.data() + off + 192, 0x80, 16);
    set16(w.data() + off + 208, scale(rng));
  }
  return w;
}

// Random Q5_0, Q3_0 or Q8_0 rows; `extreme`: every Q5_0 value 31 and Q3_0 value 7 (all bits set),
// every Q8_0 value -128 (the largest sums after the q32_r16 offsets).
std::vector<uint8_t> q32_weights(int32_t wtype, int64_t n_rows, int64_t n_cols, std::mt19937 &rng,
                                 bool extreme) {
  const size_t rs = wtype_row_size(wtype, n_cols), bb = wtype_row_size(wtype, 32);
  std::vector<uint8_t> w(rs * static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0001f, 0.005f);
  for (auto &b : w)
    b = extreme ? (wtype == SPECINFER_WTYPE_Q8_0 ? 0x80 : 0xFF) : static_cast<uint8_t>(byte(rng));
  for (size_t off = 0; off < w.size(); off += bb) set16(w.data() + off, scale(rng));
  return w;
}

bool kquant(int32_t wtype) {
  return wtype == SPECINFER_WTYPE_Q4_K || wtype == SPECINFER_WTYPE_Q6_K;
}

std::vector<uint8_t> weights(int32_t wtype, int64_t n_rows, int64_t n_cols, std::mt19937 &rng,
                             bool extreme) {
  if (wtype == SPECINFER_WTYPE_Q4_K) return q4k_weights(n_rows, n_cols, rng, extreme);
  if (wtype == SPECINFER_WTYPE_Q6_K) return q6k_weights(n_rows, n_cols, rng, extreme);
  if (wtype == SPECINFER_WTYPE_Q5_0 || wtype == SPECINFER_WTYPE_Q8_0 ||
      wtype == SPECINFER_WTYPE_Q3_0)
    return q32_weights(wtype, n_rows, n_cols, rng, extreme);
  return q40_weights(n_rows, n_cols, rng, extreme);
}

std::vector<float> activations(int64_t n_tok, int64_t n_cols, std::mt19937 &rng, bool extreme) {
  std::vector<float> x(static_cast<size_t>(n_tok * n_cols));
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < x.size(); ++i) x[i] = extreme ? (i % 3 == 0 ? -2.0f : 2.0f) : nd(rng);
  return x;
}

// Mismatches of y against the double-precision product of the dequantized weights and the int8
// activations the kernels multiply.
// (Q4_K and Q6_K multiply ActQ8K activations, one scale per 256 values; Q4_0, Q5_0 and Q8_0
// ActQ8, one per 32.)
int check_against_reference(int32_t wtype, const std::vector<uint8_t> &w, int64_t n_rows,
                            int64_t n_cols, const std::vector<float> &x, int64_t n_tok,
                            const std::vector<float> &y, const char *what) {
  std::vector<float> wdeq(static_cast<size_t>(n_rows * n_cols));
  dequantize_row_ref(wtype, w.data(), wdeq.data(), n_rows * n_cols);
  int bad = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    std::vector<double> xv(static_cast<size_t>(n_cols));
    if (kquant(wtype)) {
      std::vector<ActQ8K> q(static_cast<size_t>(n_cols / 256));
      quantize_act_q8k(x.data() + t * n_cols, q.data(), n_cols);
      for (int64_t c = 0; c < n_cols; ++c)
        xv[static_cast<size_t>(c)] = static_cast<double>(q[static_cast<size_t>(c / 256)].d) *
                                     q[static_cast<size_t>(c / 256)].qs[c % 256];
    } else {
      std::vector<ActQ8> q(static_cast<size_t>(n_cols / 32));
      quantize_act_q8(x.data() + t * n_cols, q.data(), n_cols);
      for (int64_t c = 0; c < n_cols; ++c)
        xv[static_cast<size_t>(c)] = static_cast<double>(q[static_cast<size_t>(c / 32)].d) *
                                     q[static_cast<size_t>(c / 32)].qs[c % 32];
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t c = 0; c < n_cols; ++c) {
        const double p = static_cast<double>(wdeq[static_cast<size_t>(r * n_cols + c)]) *
                         xv[static_cast<size_t>(c)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = y[static_cast<size_t>(t * n_rows + r)];
      if (!(std::fabs(got - ref) <= 2e-5 * mag + 1e-6)) {
        if (bad < 3)
          print_error("%s tok=%lld t=%lld r=%lld: got %.8g want %.8g (mag %.3g)\n", what,
                      static_cast<long long>(n_tok), static_cast<long long>(t),
                      static_cast<long long>(r), got, ref, mag);
        ++bad;
      }
    }
  }
  return bad;
}

void test_repack_is_lossless(void **) {
  std::mt19937 rng(7);
  const std::vector<uint8_t> w = q4k_weights(3, 1024, rng, false);
  std::vector<uint8_t> packed(w.size()), back(w.size());
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ4_K)) {
    pack_block_q4k_x8(w.data() + off, packed.data() + off);
    unpack_block_q4k_x8(packed.data() + off, back.data() + off);
  }
  assert_memory_equal(back.data(), w.data(), w.size());
  assert_memory_not_equal(packed.data(), w.data(), w.size());  // it does reorder
  const std::vector<uint8_t> w0 = q40_weights(3, 256, rng, false);
  std::vector<uint8_t> packed0(w0.size()), back0(w0.size());
  for (size_t off = 0; off < w0.size(); off += 4 * sizeof(BlockQ4_0)) {
    pack_q40_x4(w0.data() + off, packed0.data() + off);
    unpack_q40_x4(packed0.data() + off, back0.data() + off);
  }
  assert_memory_equal(back0.data(), w0.data(), w0.size());
  assert_memory_not_equal(packed0.data(), w0.data(), w0.size());
  const std::vector<uint8_t> w6 = q6k_weights(3, 512, rng, false);
  std::vector<uint8_t> packed6(w6.size()), back6(w6.size());
  for (size_t off = 0; off < w6.size(); off += sizeof(BlockQ6_K)) {
    pack_block_q6k_x16(w6.data() + off, packed6.data() + off);
    unpack_block_q6k_x16(packed6.data() + off, back6.data() + off);
  }
  assert_memory_equal(back6.data(), w6.data(), w6.size());
  assert_memory_not_equal(packed6.data(), w6.data(), w6.size());
  // q4k_r16: tiles of sixteen rows (two row groups, two super-blocks).
  const size_t rb = wtype_row_size(SPECINFER_WTYPE_Q4_K, 512);
  const std::vector<uint8_t> w16 = q4k_weights(32, 512, rng, false);
  std::vector<uint8_t> tiles(w16.size()), back16(w16.size());
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t i = 0; i < 2; ++i) {
      uint8_t *tile = tiles.data() + static_cast<size_t>(2 * g + i) * 16 * sizeof(BlockQ4_K);
      pack_tile_q4k_r16(w16.data() + static_cast<size_t>(16 * g) * rb, rb, i, tile);
      unpack_tile_q4k_r16(tile, back16.data() + static_cast<size_t>(16 * g) * rb, rb, i);
    }
  assert_memory_equal(back16.data(), w16.data(), w16.size());
  assert_memory_not_equal(tiles.data(), w16.data(), w16.size());
  // q6k_r16: the same, with the padding after each tile's d left zero.
  const size_t rb6 = wtype_row_size(SPECINFER_WTYPE_Q6_K, 512);
  const std::vector<uint8_t> w616 = q6k_weights(32, 512, rng, false);
  std::vector<uint8_t> tiles6(4 * kQ6R16Tile, 0xAB), back616(w616.size());
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t i = 0; i < 2; ++i) {
      uint8_t *tile = tiles6.data() + static_cast<size_t>(2 * g + i) * kQ6R16Tile;
      pack_tile_q6k_r16(w616.data() + static_cast<size_t>(16 * g) * rb6, rb6, i, tile);
      unpack_tile_q6k_r16(tile, back616.data() + static_cast<size_t>(16 * g) * rb6, rb6, i);
      for (size_t b = kQ6R16D + 32; b < kQ6R16Tile; ++b) assert_int_equal(tile[b], 0);
    }
  assert_memory_equal(back616.data(), w616.data(), w616.size());
  // q32_r16: tiles of sixteen rows of 32-value blocks (two row groups, three blocks).
  for (int32_t wtype :
       {SPECINFER_WTYPE_Q4_0, SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q8_0, SPECINFER_WTYPE_Q3_0}) {
    const size_t rb32 = wtype_row_size(wtype, 96), tb = q32_r16_tile_bytes(wtype);
    const std::vector<uint8_t> w32 = wtype == SPECINFER_WTYPE_Q4_0
                                         ? q40_weights(32, 96, rng, false)
                                         : q32_weights(wtype, 32, 96, rng, false);
    assert_int_equal(tb, 16 * wtype_row_size(wtype, 32));
    std::vector<uint8_t> t32(w32.size()), back32(w32.size());
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t i = 0; i < 3; ++i) {
        uint8_t *tile = t32.data() + static_cast<size_t>(3 * g + i) * tb;
        pack_tile_q32_r16(wtype, w32.data() + static_cast<size_t>(16 * g) * rb32, rb32, i, tile);
        unpack_tile_q32_r16(wtype, tile, back32.data() + static_cast<size_t>(16 * g) * rb32, rb32,
                            i);
      }
    assert_memory_equal(back32.data(), w32.data(), w32.size());
    assert_memory_not_equal(t32.data(), w32.data(), w32.size());
  }
  // The activation permutation: scalar and AVX2 give the same bytes.
  if (isa_available(Isa::avx2)) {
    const std::vector<float> x = activations(1, 1024, rng, false);
    std::vector<ActQ8K> q(4);
    quantize_act_q8k(x.data(), q.data(), 1024);
    std::vector<ActQ8KP> a(4), b(4);
    act_to_q8kp(q.data(), a.data(), 4);
    act_to_q8kp_avx2(q.data(), b.data(), 4);
    for (int i = 0; i < 4; ++i) {
      assert_memory_equal(a[i].qs, b[i].qs, 256);
      assert_memory_equal(a[i].xs, b[i].xs, sizeof a[i].xs);
    }
  }
}

void test_packed_matches_reference(void **) {
  std::mt19937 rng(20261122);
  int bad = 0;
  struct Case {
    int32_t wtype;
    PackLayout layout;
    std::vector<int64_t> cols;
    int64_t n_rows;
    Isa pack_isa;  // whose layout
  };
  // 8960 columns: a token tile's activations then exceed L1. 39 rows: the row-pair kernels' nine
  // groups of four rows, a pair and a single row; 48: three groups of the sixteen-row layouts.
  const Case cases[] = {
      {SPECINFER_WTYPE_Q4_K, PackLayout::q4k_x8, {256, 1536, 8960}, 39, Isa::avx2},
      {SPECINFER_WTYPE_Q4_K, PackLayout::q4k_r16, {256, 1536, 8960}, 48, Isa::avx512},
      {SPECINFER_WTYPE_Q6_K, PackLayout::q6k_x16, {256, 1536, 8960}, 39, Isa::avx512},
      {SPECINFER_WTYPE_Q6_K, PackLayout::q6k_r16, {256, 1536, 8960}, 48, Isa::avx512},
      {SPECINFER_WTYPE_Q4_0, PackLayout::q40_x4, {128, 896}, 39, Isa::avx512},
      {SPECINFER_WTYPE_Q4_0, PackLayout::q32_r16, {32, 160}, 48, Isa::avx512},
      {SPECINFER_WTYPE_Q5_0, PackLayout::q32_r16, {32, 896, 4864}, 48, Isa::avx512},
      {SPECINFER_WTYPE_Q5_0, PackLayout::q32_r16, {896}, 32, Isa::avx2},
      {SPECINFER_WTYPE_Q3_0, PackLayout::q32_r16, {32, 896, 4864}, 48, Isa::avx512},
      {SPECINFER_WTYPE_Q3_0, PackLayout::q32_r16, {896}, 32, Isa::avx2},
      {SPECINFER_WTYPE_Q8_0, PackLayout::q32_r16, {32, 896}, 48, Isa::avx512}};
  for (const Case &cs : cases)
    for (bool extreme : {false, true}) {
      for (int64_t n_cols : cs.cols) {
        const int64_t n_rows = cs.n_rows;
        const std::vector<uint8_t> w = weights(cs.wtype, n_rows, n_cols, rng, extreme);
        auto pw = pack_weight_for(cs.pack_isa, cs.wtype, w.data(), n_rows, n_cols);
        assert_int_equal(static_cast<int>(pw->layout), static_cast<int>(cs.layout));
        for (int64_t n_tok : {1, 2, 3, 5, 6, 7, 8, 13}) {
          const std::vector<float> x = activations(n_tok, n_cols, rng, extreme);
          std::vector<float> y_scalar(static_cast<size_t>(n_tok * n_rows), NAN);
          matmul_packed_with(Isa::scalar, *pw, x.data(), n_tok, y_scalar.data());
          bad += check_against_reference(cs.wtype, w, n_rows, n_cols, x, n_tok, y_scalar, "scalar");
          for (const Variant &v : simd_variants()) {
            std::vector<float> y(static_cast<size_t>(n_tok * n_rows), NAN);
            matmul_packed_kernels(v.k, *pw, x.data(), n_tok, y.data());
            bad +=
                check_against_reference(cs.wtype, w, n_rows, n_cols, x, n_tok, y, v.name.c_str());
            // Same integer sums and the same float steps: bit for bit.
            assert_memory_equal(y.data(), y_scalar.data(), y.size() * sizeof(float));
          }
        }
      }
    }
  assert_int_equal(bad, 0);
}

// A token's result is the same whatever batch it is in (speculative output == plain output).
void test_packed_batch_invariance(void **) {
  std::mt19937 rng(99);
  const int64_t n_rows = 304, n_cols = 1024;
  // 11 tokens run in tiles of 5 or fewer, 6 and 8 in one tile of up to 8 (Q6_K, Q4_K r16).
  for (int64_t n_tok : {11, 6, 8})
    for (int32_t wtype : {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q4_0,
                          SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q8_0, SPECINFER_WTYPE_Q3_0})
      for (Isa pack_isa :
           {Isa::avx2, Isa::avx512}) {  // Q4_K, Q6_K: x8/x16 and r16; Q8_0: plain and q32_r16
        if (pack_layout(wtype, n_rows, n_cols, pack_isa) == PackLayout::plain) continue;
        const std::vector<uint8_t> w = weights(wtype, n_rows, n_cols, rng, false);
        auto pw = pack_weight_for(pack_isa, wtype, w.data(), n_rows, n_cols);
        assert_int_not_equal(static_cast<int>(pw->layout), static_cast<int>(PackLayout::plain));
        const std::vector<float> x = activations(n_tok, n_cols, rng, false);
        std::vector<Variant> vs = simd_variants();
        vs.push_back({"scalar", packed_kernels(Isa::scalar)});
        for (const Variant &v : vs) {
          std::vector<float> all(static_cast<size_t>(n_tok * n_rows));
          matmul_packed_kernels(v.k, *pw, x.data(), n_tok, all.data());
          for (int64_t t = 0; t < n_tok; ++t) {
            std::vector<float> one(static_cast<size_t>(n_rows));
            matmul_packed_kernels(v.k, *pw, x.data() + t * n_cols, 1, one.data());
            assert_memory_equal(one.data(), all.data() + t * n_rows, one.size() * sizeof(float));
          }
        }
      }
}

// Matmuls called from parallel work (a caller's threads each running a model, or one waiting in
// its matmul and picking up another's): each call's activation buffers stay its own.
void test_packed_nested_calls(void **) {
  std::mt19937 rng(17);
  const int64_t n_rows = 512, n_cols = 1536, n_tok = 5, n_calls = 16;
  for (int32_t wtype :
       {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q4_0, SPECINFER_WTYPE_Q5_0}) {
    const std::vector<uint8_t> w = weights(wtype, n_rows, n_cols, rng, false);
    auto pw = pack_weight(wtype, w.data(), n_rows, n_cols);
    std::vector<std::vector<float>> xs, want(n_calls), got(n_calls);
    for (int64_t c = 0; c < n_calls; ++c) {
      xs.push_back(activations(n_tok, n_cols, rng, false));
      want[c].resize(static_cast<size_t>(n_tok * n_rows));
      matmul_packed(*pw, xs[c].data(), n_tok, want[c].data());
      got[c].assign(want[c].size(), NAN);
    }
    tbb::parallel_for(int64_t{0}, n_calls,
                      [&](int64_t c) { matmul_packed(*pw, xs[c].data(), n_tok, got[c].data()); });
    for (int64_t c = 0; c < n_calls; ++c)
      assert_memory_equal(got[c].data(), want[c].data(), want[c].size() * sizeof(float));
  }
}

// A matmul started on a thread that is inside another (here: from the outer one's row kernel)
// gets its own activation buffers: the outer result stays right.
struct Nested {
  const PackedWeight *pw = nullptr;
  const float *x = nullptr;
  float *y = nullptr;
  int64_t n_tok = 0;
};
Nested g_nested;
void nested_rows(const PackedArgs &a, int64_t r0, int64_t r1) noexcept {
  if (g_nested.pw)
    matmul_packed_with(Isa::scalar, *g_nested.pw, g_nested.x, g_nested.n_tok, g_nested.y);
  q4k_x8_rows_scalar(a, r0, r1);
}

void test_packed_call_inside_call(void **) {
  std::mt19937 rng(23);
  const int64_t n_rows = 8, n_cols = 1536, n_tok = 3;
  const std::vector<uint8_t> w = weights(SPECINFER_WTYPE_Q4_K, n_rows, n_cols, rng, false);
  auto pw = pack_weight_for(Isa::avx2, SPECINFER_WTYPE_Q4_K, w.data(), n_rows, n_cols);
  const std::vector<float> x = activations(n_tok, n_cols, rng, false),
                           x2 = activations(n_tok, n_cols, rng, false);
  std::vector<float> want(static_cast<size_t>(n_tok * n_rows)), want2(want.size()),
      got(want.size()), got2(want.size());
  matmul_packed_with(Isa::scalar, *pw, x.data(), n_tok, want.data());
  matmul_packed_with(Isa::scalar, *pw, x2.data(), n_tok, want2.data());
  PackedKernels k = packed_kernels(Isa::scalar);
  k.q4k_x8 = nested_rows;
  g_nested = {pw.get(), x2.data(), got2.data(), n_tok};
  matmul_packed_kernels(k, *pw, x.data(), n_tok, got.data());  // 8 rows: one range, this thread
  g_nested = {};
  assert_memory_equal(got.data(), want.data(), want.size() * sizeof(float));
  assert_memory_equal(got2.data(), want2.data(), want2.size() * sizeof(float));
}

// Types without a packed layout run the plain kernels on the caller's weights: same bits.
void test_plain_layout(void **) {
  std::mt19937 rng(5);
  const int64_t n_rows = 20, n_cols = 512, n_tok = 3;
  std::vector<uint8_t> w(wtype_row_size(SPECINFER_WTYPE_Q8_0, n_cols) * n_rows);
  for (auto &b : w) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ8_0)) set16(w.data() + off, 0.01f);
  auto pw = pack_weight(SPECINFER_WTYPE_Q8_0, w.data(), n_rows, n_cols);
  assert_int_equal(static_cast<int>(pw->layout), static_cast<int>(PackLayout::plain));
  assert_ptr_equal(pw->data, w.data());
  const std::vector<float> x = activations(n_tok, n_cols, rng, false);
  std::vector<float> a(static_cast<size_t>(n_tok * n_rows)), b(a.size());
  matmul_packed(*pw, x.data(), n_tok, a.data());
  matmul(SPECINFER_WTYPE_Q8_0, w.data(), n_rows, n_cols, x.data(), n_tok, b.data());
  assert_memory_equal(a.data(), b.data(), a.size() * sizeof(float));
  // 20 rows (not whole groups of sixteen): Q8_0 above stays plain, and Q4_0 too unless its columns
  // are a multiple of 128 (q40_x4).
  const std::vector<uint8_t> w0 = q40_weights(n_rows, 96, rng, false);
  auto pw0 = pack_weight(SPECINFER_WTYPE_Q4_0, w0.data(), n_rows, 96);
  assert_int_equal(static_cast<int>(pw0->layout), static_cast<int>(PackLayout::plain));
  assert_ptr_equal(pw0->data, w0.data());
}

void test_kernel_table_packed(void **) {
  const specinfer_kernels *k = backend_kernel_table();
  assert_true(k->struct_size >= offsetof(specinfer_kernels, free_packed) + sizeof(k->free_packed));
  std::vector<uint8_t> w(wtype_row_size(SPECINFER_WTYPE_Q4_K, 256) * 2);
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ4_K)) set16(w.data() + off, 0.01f);
  specinfer_packed_weight *pw = nullptr;
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_K, w.data(), 2, 256, nullptr),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_K, nullptr, 2, 256, &pw),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_null(pw);
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_K, w.data(), 2, 100, &pw),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_K, w.data(), 0, 256, &pw),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->pack_weight(4, w.data(), 2, 256, &pw), SPECINFER_ERR_UNSUPPORTED);
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_K, w.data(), 2, 256, &pw), SPECINFER_OK);
  assert_non_null(pw);
  float x[256] = {}, y[2] = {1.0f, 1.0f};
  assert_int_equal(k->matmul_packed(nullptr, x, 1, y), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul_packed(pw, nullptr, 1, y), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul_packed(pw, x, 0, y), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(k->matmul_packed(pw, x, 1, y), SPECINFER_OK);
  assert_true(y[0] == 0.0f && y[1] == 0.0f);
  // A reordered layout owns a copy of the weights; the plain layout refers to the caller's.
  assert_true(k->struct_size >=
              offsetof(specinfer_kernels, packed_bytes) + sizeof(k->packed_bytes));
  const PackLayout layout = reinterpret_cast<const PackedWeight *>(pw)->layout;
  assert_int_equal(k->packed_bytes(pw), layout == PackLayout::plain ? 0 : w.size());
  assert_int_equal(k->packed_bytes(nullptr), 0);
  k->free_packed(pw);
  k->free_packed(nullptr);
  std::vector<uint8_t> w0(wtype_row_size(SPECINFER_WTYPE_Q4_0, 96) * 2);
  specinfer_packed_weight *plain = nullptr;
  assert_int_equal(k->pack_weight(SPECINFER_WTYPE_Q4_0, w0.data(), 2, 96, &plain), SPECINFER_OK);
  assert_int_equal(k->packed_bytes(plain), 0);
  k->free_packed(plain);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repack_is_lossless),
      cmocka_unit_test(test_packed_matches_reference),
      cmocka_unit_test(test_packed_batch_invariance),
      cmocka_unit_test(test_packed_nested_calls),
      cmocka_unit_test(test_packed_call_inside_call),
      cmocka_unit_test(test_plain_layout),
      cmocka_unit_test(test_kernel_table_packed),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
