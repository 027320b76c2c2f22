// The attention kernel over compact KV caches (f16, q8_0, q4_0, written by kv_store) and its
// streaming, split-K scheme, on every instruction set this CPU has:
//  - each type's result equals exact attention (in double) over the values the cache holds
//    (decoded), within 2e-5 of the output scale: the kernels read the compact form correctly;
//  - against the f32 cache the result stays within the type's rounding: f16 1e-3, q8_0 2e-2,
//    q4_0 0.15 (maximum absolute difference; values are N(0, 1), so outputs are O(1));
//  - every SIMD set agrees with the scalar oracle within 2e-5;
//  - a query's result is bit for bit the same alone (keys split over tasks) and in batches of 5,
//    13 and 40 (tiles of queries sharing key blocks; keys in chunks split or run in turn), over
//    many chunks of keys;
//  - under a tree mask over a long cached prefix a node's result equals, bit for bit, a causal
//    call over the rows it sees gathered in order (the plain-decoding call), for every type;
//  - the same rows laid out head-major (a region per kv head, room for more positions than the
//    call reads) or with padding between positions, given by the row strides, give the same bits
//    as rows back to back, causal and under a tree mask;
//  - keys in Q8_0 tiles of 16 positions (test_key_tiles says what holds there);
//  - bad types, head sizes and strides are refused with a status.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/attention.h"
#include "backend/attention_args.h"
#include "backend/kernel_table.h"
#include "backend/quant.h"
#include "util/isa.h"

#include "support/backend_util.h"
#include "support/cmocka_setup.h"

using namespace specinfer;

namespace {

using specinfer_test::isas;
using specinfer_test::randn;
using specinfer_test::restride;
using specinfer_test::store;
using specinfer_test::Stored;
using specinfer_test::tiled;
using specinfer_test::typed_args;

const int32_t kTypes[] = {SPECINFER_WTYPE_F32, SPECINFER_WTYPE_F16, SPECINFER_WTYPE_Q8_0,
                          SPECINFER_WTYPE_Q4_0};

// Exact attention in double over float k and v (mask NULL = causal).
std::vector<double> exact(int n_q, int H, int Hkv, int hd, int n_kv, const float *q, const float *k,
                          const float *v, const uint8_t *mask, float scale) {
  std::vector<double> out(size_t(n_q) * H * hd, 0.0);
  const int g = H / Hkv;
  for (int i = 0; i < n_q; ++i)
    for (int h = 0; h < H; ++h) {
      const int kvh = h / g;
      std::vector<double> s(size_t(n_kv), -INFINITY);
      double m = -INFINITY;
      for (int j = 0; j < n_kv; ++j) {
        const bool vis = mask ? mask[size_t(i) * n_kv + j] != 0 : j <= n_kv - n_q + i;
        if (!vis) continue;
        double d = 0;
        for (int t = 0; t < hd; ++t)
          d += double(q[(size_t(i) * H + h) * hd + t]) * k[(size_t(j) * Hkv + kvh) * hd + t];
        s[size_t(j)] = d * scale;
        m = std::max(m, s[size_t(j)]);
      }
      double l = 0;
      for (int j = 0; j < n_kv; ++j)
        if (s[size_t(j)] > -INFINITY) {
          const double p = std::exp(s[size_t(j)] - m);
          l += p;
          for (int t = 0; t < hd; ++t)
            out[(size_t(i) * H + h) * hd + t] += p * v[(size_t(j) * Hkv + kvh) * hd + t];
        }
      for (int t = 0; t < hd; ++t) out[(size_t(i) * H + h) * hd + t] /= l;
    }
  return out;
}

double max_diff(const std::vector<float> &a, const std::vector<double> &b) {
  double md = 0;
  for (size_t i = 0; i < a.size(); ++i) md = std::max(md, std::fabs(double(a[i]) - b[i]));
  return md;
}

void test_types_against_exact(void **) {
  std::mt19937 rng(29);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  struct Case {
    int n_q, H, Hkv, hd, n_kv;
  } cases[] = {
      {1, 12, 2, 128, 1500},  // Qwen2.5 1.5B decode: three chunks split over tasks
      {5, 14, 2, 64, 700},    // Qwen2.5 0.5B verify batch (seven heads a group)
      {40, 4, 1, 256, 600},   // Gemma 3 270m, a prefill-sized batch (chunks in turn)
      {3, 16, 2, 32, 70},     // eight heads a group, a partial block
  };
  const double tol_f32[] = {0.0, 1e-3, 2e-2, 0.15};
  for (const Case &c : cases) {
    const size_t nk = size_t(c.n_kv) * c.Hkv * c.hd;
    const auto q = randn(size_t(c.n_q) * c.H * c.hd, rng, 1.0f / std::sqrt(std::sqrt(float(c.hd))));
    const auto k = randn(nk, rng, 1.0f), v = randn(nk, rng, 1.0f);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const auto want_f32 =
        exact(c.n_q, c.H, c.Hkv, c.hd, c.n_kv, q.data(), k.data(), v.data(), nullptr, scale);
    for (size_t ti = 0; ti < 4; ++ti) {
      const int32_t type = kTypes[ti];
      const Stored ks = store(type, k, c.hd), vs = store(type, v, c.hd);
      const auto want = exact(c.n_q, c.H, c.Hkv, c.hd, c.n_kv, q.data(), ks.decoded.data(),
                              vs.decoded.data(), nullptr, scale);
      std::vector<float> oracle;
      for (const Isa isa : isas()) {
        set_active_isa(isa);
        std::vector<float> out(q.size(), NAN);
        const auto a =
            typed_args(c.n_q, c.H, c.Hkv, c.hd, c.n_kv, q.data(), type, ks, vs, out.data());
        assert_int_equal(kt->attention(&a), SPECINFER_OK);
        const double md = max_diff(out, want), md32 = max_diff(out, want_f32);
        double md_oracle = 0;
        if (isa == Isa::scalar) oracle = out;
        for (size_t i = 0; i < out.size(); ++i)
          md_oracle = std::max(md_oracle, std::fabs(double(out[i]) - oracle[i]));
        if (md > 2e-5 || md32 > tol_f32[ti] + 2e-5 || md_oracle > 2e-5)
          print_error(
              "%s %s n_q=%d H=%d/%d hd=%d n_kv=%d: %.3g from exact over the cache, %.3g "
              "from f32, %.3g from scalar\n",
              isa_name(isa), wtype_name(type), c.n_q, c.H, c.Hkv, c.hd, c.n_kv, md, md32,
              md_oracle);
        assert_true(md <= 2e-5);
        assert_true(md32 <= tol_f32[ti] + 2e-5);
        assert_true(md_oracle <= 2e-5);
      }
    }
  }
  set_active_isa(prev);
}

// Query i of a batch (5 and 13: chunks split over tasks; 40: chunks run in turn in one task;
// queries share key blocks in tiles of 8) against the same query alone over the same keys (chunks
// split over tasks): the same bits.
void test_split_invariance(void **) {
  std::mt19937 rng(7);
  const Isa prev = active_isa();
  const int H = 12, Hkv = 2, hd = 128, n_kv = 2100;
  const size_t nk = size_t(n_kv) * Hkv * hd;
  const auto q = randn(size_t(40) * H * hd, rng, 0.5f);
  const auto k = randn(nk, rng, 1.0f), v = randn(nk, rng, 1.0f);
  for (const Isa isa : isas()) {
    set_active_isa(isa);
    for (const int32_t type : kTypes) {
      const Stored ks = store(type, k, hd), vs = store(type, v, hd);
      for (const int n_q : {5, 13, 40}) {
        std::vector<float> batch(size_t(n_q) * H * hd);
        const auto a = typed_args(n_q, H, Hkv, hd, n_kv, q.data(), type, ks, vs, batch.data());
        assert_int_equal(backend_kernel_table()->attention(&a), SPECINFER_OK);
        for (int i = 0; i < n_q; ++i) {
          if (n_q == 40 && i != 0 && i != 7 && i != 8 && i != 17 && i != 39) continue;
          // Alone: causal over the keys query i sees (n_kv - n_q + i + 1 of them).
          std::vector<float> one(size_t(H) * hd);
          const auto b = typed_args(1, H, Hkv, hd, n_kv - n_q + i + 1,
                                    q.data() + size_t(i) * H * hd, type, ks, vs, one.data());
          assert_int_equal(backend_kernel_table()->attention(&b), SPECINFER_OK);
          if (std::memcmp(one.data(), batch.data() + size_t(i) * H * hd, one.size() * 4) != 0)
            print_error("%s %s: query %d differs alone and in a batch of %d\n", isa_name(isa),
                        wtype_name(type), i, n_q);
          assert_memory_equal(one.data(), batch.data() + size_t(i) * H * hd, one.size() * 4);
        }
      }
    }
  }
  set_active_isa(prev);
}

// The attention mask of a tree of n_q nodes (parent[i] < i, -1 for the root) after n_prefix cached
// positions: each node sees the prefix, its ancestors and itself.
std::vector<uint8_t> tree_mask(const int *parent, int n_q, int n_prefix) {
  const int n_kv = n_prefix + n_q;
  std::vector<uint8_t> mask(size_t(n_q) * n_kv, 0);
  for (int b = 0; b < n_q; ++b) {
    std::memset(mask.data() + size_t(b) * n_kv, 1, n_prefix);
    for (int a = b; a >= 0; a = parent[a]) mask[size_t(b) * n_kv + n_prefix + a] = 1;
  }
  return mask;
}

// A tree of 9 nodes under 1100 cached positions: each node equals the causal call over its
// gathered rows (prefix, ancestors, itself), bit for bit.
void test_tree_mask_compact(void **) {
  std::mt19937 rng(11);
  const Isa prev = active_isa();
  const int H = 14, Hkv = 2, hd = 64, n_prefix = 1100, n_q = 10, n_kv = n_prefix + n_q;
  const int parent[n_q] = {-1, 0, 0, 1, 1, 2, 3, 3, 6, 8};
  const std::vector<uint8_t> mask = tree_mask(parent, n_q, n_prefix);
  const size_t nk = size_t(n_kv) * Hkv * hd;
  const auto q = randn(size_t(n_q) * H * hd, rng, 0.5f);
  const auto k = randn(nk, rng, 1.0f), v = randn(nk, rng, 1.0f);
  const specinfer_kernels *kt = backend_kernel_table();
  for (const Isa isa : isas()) {
    set_active_isa(isa);
    for (const int32_t type : kTypes) {
      const Stored ks = store(type, k, hd), vs = store(type, v, hd);
      std::vector<float> tree(q.size());
      const auto a =
          typed_args(n_q, H, Hkv, hd, n_kv, q.data(), type, ks, vs, tree.data(), mask.data());
      assert_int_equal(kt->attention(&a), SPECINFER_OK);
      const size_t pos_bytes = kt->row_size(type, hd) * Hkv;
      for (int b = 0; b < n_q; ++b) {
        Stored gk, gv;  // the rows node b sees, in order
        for (int j = 0; j < n_kv; ++j)
          if (mask[size_t(b) * n_kv + j]) {
            gk.bytes.insert(gk.bytes.end(), ks.bytes.begin() + long(j * pos_bytes),
                            ks.bytes.begin() + long((j + 1) * pos_bytes));
            gv.bytes.insert(gv.bytes.end(), vs.bytes.begin() + long(j * pos_bytes),
                            vs.bytes.begin() + long((j + 1) * pos_bytes));
          }
        const int n_vis = int(gk.bytes.size() / pos_bytes);
        std::vector<float> one(size_t(H) * hd);
        const auto c = typed_args(1, H, Hkv, hd, n_vis, q.data() + size_t(b) * H * hd, type, gk, gv,
                                  one.data());
        assert_int_equal(kt->attention(&c), SPECINFER_OK);
        if (std::memcmp(one.data(), tree.data() + size_t(b) * H * hd, one.size() * 4) != 0)
          print_error("%s %s: tree node %d differs from its plain-decoding call\n", isa_name(isa),
                      wtype_name(type), b);
        assert_memory_equal(one.data(), tree.data() + size_t(b) * H * hd, one.size() * 4);
      }
    }
  }
  set_active_isa(prev);
}

void test_strided_layouts(void **) {
  std::mt19937 rng(13);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  const int H = 12, Hkv = 2, hd = 128, n_prefix = 1200, n_q = 6, n_kv = n_prefix + n_q, cap = 1500;
  const int parent[n_q] = {-1, 0, 0, 1, 2, 4};
  const std::vector<uint8_t> mask = tree_mask(parent, n_q, n_prefix);
  const size_t nk = size_t(n_kv) * Hkv * hd;
  const auto q = randn(size_t(n_q) * H * hd, rng, 0.5f);
  const auto k = randn(nk, rng, 1.0f), v = randn(nk, rng, 1.0f);
  for (const Isa isa : isas()) {
    set_active_isa(isa);
    for (const int32_t type : kTypes) {
      const Stored ks = store(type, k, hd), vs = store(type, v, hd);
      const size_t row = kt->row_size(type, hd);
      struct Layout {
        const char *name;
        size_t pos, head, size;
      } layouts[] = {
          {"head-major", row, cap * row, Hkv * cap * row},
          {"padded positions", Hkv * row + 40, row, n_kv * (Hkv * row + 40)},
      };
      const uint8_t *masks[] = {nullptr, mask.data()};  // causal, then the tree
      for (const uint8_t *m : masks) {
        std::vector<float> ref(q.size()), got(q.size());
        const auto a = typed_args(n_q, H, Hkv, hd, n_kv, q.data(), type, ks, vs, ref.data(), m);
        assert_int_equal(kt->attention(&a), SPECINFER_OK);
        for (const Layout &l : layouts) {
          const auto kb = restride(ks, row, n_kv, Hkv, l.pos, l.head, l.size),
                     vb = restride(vs, row, n_kv, Hkv, l.pos, l.head, l.size);
          specinfer_attention_args b = a;
          b.k = reinterpret_cast<const float *>(kb.data());
          b.v = reinterpret_cast<const float *>(vb.data());
          b.k_pos_stride = b.v_pos_stride = int64_t(l.pos);
          b.k_head_stride = b.v_head_stride = int64_t(l.head);
          b.out = got.data();
          assert_int_equal(kt->attention(&b), SPECINFER_OK);
          if (std::memcmp(ref.data(), got.data(), ref.size() * 4) != 0)
            print_error("%s %s %s%s: strided rows differ from rows back to back\n", isa_name(isa),
                        wtype_name(type), l.name, m ? " (tree)" : "");
          assert_memory_equal(ref.data(), got.data(), ref.size() * 4);
        }
      }
    }
  }
  set_active_isa(prev);
}

// The query as key tiles score it: each 32 values rounded by quantize_query_q8, decoded.
std::vector<float> rounded_query(const std::vector<float> &q, int hd) {
  std::vector<float> out(q.size());
  std::vector<int8_t> qs(static_cast<size_t>(hd));
  std::vector<float> d(size_t(hd / 32));
  std::vector<int32_t> bias(size_t(hd / 32));
  for (size_t r = 0; r < q.size() / size_t(hd); ++r) {
    quantize_query_q8(q.data() + r * size_t(hd), hd, qs.data(), d.data(), bias.data());
    for (int i = 0; i < hd; ++i)
      out[r * size_t(hd) + size_t(i)] = float(qs[size_t(i)]) * d[size_t(i / 32)];
  }
  return out;
}

// Keys in Q8_0 tiles of 16 positions (k_tile), head-major, with a partial last tile, causal and
// under a tree mask (whose listed keys are gathered from their tiles):
//  - the result equals exact attention (in double) with the query rounded as the tiles score it
//    over the cache's decoded values, within 2e-5;
//  - it stays within 2e-3 of the q8_0 rows' result (the query's 8-bit rounding);
//  - every SIMD set agrees with the scalar oracle within 2e-5, and their scores kernels give the
//    same bits (integer products, one order of float steps);
//  - a tree node equals the causal call over the keys it sees, re-tiled in order, bit for bit;
//  - a query's result is the same bits alone and in a batch.
void test_key_tiles(void **) {
  std::mt19937 rng(17);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  assert_true((kt->attention_features & SPECINFER_ATTN_KEY_TILES) != 0);
  const int H = 12, Hkv = 2, hd = 128, n_prefix = 1195, n_q = 6, n_kv = n_prefix + n_q, cap = 1216;
  const int parent[n_q] = {-1, 0, 0, 1, 2, 4};
  const std::vector<uint8_t> mask = tree_mask(parent, n_q, n_prefix);
  const size_t nk = size_t(n_kv) * Hkv * hd;
  const auto q = randn(size_t(n_q) * H * hd, rng, 0.5f);
  const auto k = randn(nk, rng, 1.0f), v = randn(nk, rng, 1.0f);
  const float scale = 1.0f / std::sqrt(float(hd));
  const int32_t type = SPECINFER_WTYPE_Q8_0;
  const Stored ks = store(type, k, hd), vs = store(type, v, hd);
  const size_t row = kt->row_size(type, hd);
  const auto kb = tiled(ks, row, n_kv, Hkv, hd, cap),
             vb = restride(vs, row, n_kv, Hkv, row, cap * row, Hkv * cap * row);
  const auto qr = rounded_query(q, hd);
  const uint8_t *masks[] = {nullptr, mask.data()};
  std::vector<float> first[2];
  for (const Isa isa : isas()) {
    set_active_isa(isa);
    for (int mi = 0; mi < 2; ++mi) {
      const uint8_t *m = masks[mi];
      std::vector<float> rows_out(q.size()), out(q.size(), NAN);
      const auto a = typed_args(n_q, H, Hkv, hd, n_kv, q.data(), type, ks, vs, rows_out.data(), m);
      assert_int_equal(kt->attention(&a), SPECINFER_OK);
      specinfer_attention_args b = a;
      b.k = reinterpret_cast<const float *>(kb.data());
      b.v = reinterpret_cast<const float *>(vb.data());
      b.k_pos_stride = b.v_pos_stride = int64_t(row);
      b.k_head_stride = b.v_head_stride = int64_t(cap * row);
      b.k_tile = SPECINFER_KEY_TILE;
      b.out = out.data();
      assert_int_equal(kt->attention(&b), SPECINFER_OK);
      const auto want =
          exact(n_q, H, Hkv, hd, n_kv, qr.data(), ks.decoded.data(), vs.decoded.data(), m, scale);
      double from_rows = 0;
      for (size_t i = 0; i < out.size(); ++i)
        from_rows = std::max(from_rows, std::fabs(double(out[i]) - rows_out[i]));
      const double md = max_diff(out, want);
      print_message("  %s%s: %.3g from exact with the rounded query, %.3g from q8_0 rows\n",
                    isa_name(isa), m ? " (tree)" : "", md, from_rows);
      assert_true(md <= 2e-5);
      assert_true(from_rows <= 2e-3);
      if (first[mi].empty()) first[mi] = out;  // the scalar oracle
      double md_oracle = 0;
      for (size_t i = 0; i < out.size(); ++i)
        md_oracle = std::max(md_oracle, std::fabs(double(out[i]) - first[mi][i]));
      assert_true(md_oracle <= 2e-5);
      for (int t = 0; t < n_q; ++t) {
        // The keys query t sees, in order, tiled from position 0 and attended causally.
        Stored gk, gv;
        for (int j = 0; j < n_kv; ++j)
          if (m ? m[size_t(t) * n_kv + j] != 0 : j <= n_prefix + t) {
            gk.bytes.insert(gk.bytes.end(), ks.bytes.begin() + long(j * Hkv * row),
                            ks.bytes.begin() + long((j + 1) * Hkv * row));
            gv.bytes.insert(gv.bytes.end(), vs.bytes.begin() + long(j * Hkv * row),
                            vs.bytes.begin() + long((j + 1) * Hkv * row));
          }
        const int n_vis = int(gk.bytes.size() / (Hkv * row));
        const auto gkb = tiled(gk, row, n_vis, Hkv, hd, cap);
        const auto gvb = restride(gv, row, n_vis, Hkv, row, cap * row, Hkv * cap * row);
        std::vector<float> one(size_t(H) * hd);
        specinfer_attention_args c = typed_args(1, H, Hkv, hd, n_vis, q.data() + size_t(t) * H * hd,
                                                type, gk, gv, one.data());
        c.k = reinterpret_cast<const float *>(gkb.data());
        c.v = reinterpret_cast<const float *>(gvb.data());
        c.k_pos_stride = c.v_pos_stride = int64_t(row);
        c.k_head_stride = c.v_head_stride = int64_t(cap * row);
        c.k_tile = SPECINFER_KEY_TILE;
        assert_int_equal(kt->attention(&c), SPECINFER_OK);
        if (std::memcmp(one.data(), out.data() + size_t(t) * H * hd, one.size() * 4) != 0)
          print_error("%s%s: query %d differs from its call over the keys it sees\n", isa_name(isa),
                      m ? " (tree)" : "", t);
        assert_memory_equal(one.data(), out.data() + size_t(t) * H * hd, one.size() * 4);
      }
    }
  }
  // The scores kernels of every set: the same bits, for whole and partial tiles.
  {
    const auto qrows = std::vector<float>(q.begin(), q.begin() + H * hd);
    std::vector<int8_t> qs(static_cast<size_t>(H * hd));
    std::vector<float> d(static_cast<size_t>(H * hd / 32));
    std::vector<int32_t> bias(d.size());
    for (int h = 0; h < H; ++h)
      quantize_query_q8(qrows.data() + h * hd, hd, qs.data() + h * hd, d.data() + h * hd / 32,
                        bias.data() + h * hd / 32);
    const int lanes[][2] = {{0, 16}, {3, 11}, {5, 16}, {0, 1}};
    for (const auto &l : lanes) {
      std::vector<float> ref;
      for (const Isa isa : isas()) {
        std::vector<float> sc(size_t(H) * 16, NAN), mx(size_t(H), -INFINITY);
        attn_kernels(isa).scores_tile(qs.data(), d.data(), bias.data(), H, kb.data() + 64 * row, hd,
                                      scale, l[0], l[1], sc.data(), 16, mx.data());
        for (int h = 0; h < H; ++h) {
          float want = -INFINITY;
          for (int j = 0; j < l[1] - l[0]; ++j) want = std::max(want, sc[size_t(h * 16 + j)]);
          assert_true(mx[size_t(h)] == want);
          for (int j = l[1] - l[0]; j < 16; ++j) assert_true(std::isnan(sc[size_t(h * 16 + j)]));
        }
        if (ref.empty()) ref = sc;
        if (std::memcmp(ref.data(), sc.data(), sc.size() * 4) != 0)
          print_error("%s: tile scores differ from scalar's, lanes [%d, %d)\n", isa_name(isa), l[0],
                      l[1]);
        assert_memory_equal(ref.data(), sc.data(), sc.size() * 4);
      }
    }
  }
  // Refused: a type other than Q8_0, a tile size other than 16, positions not one row apart.
  std::vector<float> out(q.size());
  specinfer_attention_args b =
      typed_args(n_q, H, Hkv, hd, n_kv, q.data(), type, ks, vs, out.data());
  b.k = reinterpret_cast<const float *>(kb.data());
  b.v = reinterpret_cast<const float *>(vb.data());
  b.k_pos_stride = b.v_pos_stride = int64_t(row);
  b.k_head_stride = b.v_head_stride = int64_t(cap * row);
  b.k_tile = 8;
  assert_int_equal(kt->attention(&b), SPECINFER_ERR_INVALID_ARGUMENT);
  b.k_tile = SPECINFER_KEY_TILE;
  b.k_head_stride = int64_t(n_kv) * int64_t(row);  // the last tile of head 0 reaches head 1
  assert_int_equal(kt->attention(&b), SPECINFER_ERR_INVALID_ARGUMENT);
  b.k_head_stride = int64_t(cap * row);
  b.k_type = SPECINFER_WTYPE_F16;
  assert_int_equal(kt->attention(&b), SPECINFER_ERR_INVALID_ARGUMENT);
  b.k_type = type;
  b.k_pos_stride = int64_t(Hkv * row);
  b.k_head_stride = int64_t(row);
  assert_int_equal(kt->attention(&b), SPECINFER_ERR_INVALID_ARGUMENT);
  set_active_isa(prev);
}

void test_errors(void **) {
  const specinfer_kernels *kt = backend_kernel_table();
  std::vector<float> buf(4096, 0.5f), out(4096);
  std::vector<uint8_t> bytes(8192);
  specinfer_attention_args a =
      attention_args(1, 2, 1, 32, 4, buf.data(), buf.data(), buf.data(), out.data());
  a.k_type = SPECINFER_WTYPE_Q5_0;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_UNSUPPORTED);
  a.k_type = SPECINFER_WTYPE_F32;
  a.v_type = 77;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_UNSUPPORTED);
  // q8_0 rows need head_dim a multiple of 32.
  a = attention_args(1, 2, 1, 48, 4, buf.data(), buf.data(), buf.data(), out.data());
  a.k_type = a.v_type = SPECINFER_WTYPE_Q8_0;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  // An f16 cache works with any head_dim (the scalar kernels take the odd sizes).
  a.k_type = a.v_type = SPECINFER_WTYPE_F16;
  assert_int_equal(kt->attention(&a), SPECINFER_OK);

  // Strides: each at least a row, and rows apart (f32 rows of 32 values are 128 bytes; 4
  // positions, 2 kv heads).
  a = attention_args(1, 2, 2, 32, 4, buf.data(), buf.data(), buf.data(), out.data());
  const struct {
    int64_t kp, kh, vp, vh;
    specinfer_status want;
  } strides[] = {
      {128, 512, 128, 512, SPECINFER_OK},                     // head-major
      {256, 128, 256, 128, SPECINFER_OK},                     // the default, spelled out
      {128, 384, 128, 512, SPECINFER_ERR_INVALID_ARGUMENT},   // head 0's 4 rows reach head 1's
      {200, 128, 256, 128, SPECINFER_ERR_INVALID_ARGUMENT},   // position rows overlap
      {64, 512, 128, 512, SPECINFER_ERR_INVALID_ARGUMENT},    // less than a row
      {-128, 512, 128, 512, SPECINFER_ERR_INVALID_ARGUMENT},  // negative
      {128, 512, 0, 0, SPECINFER_ERR_INVALID_ARGUMENT},       // v's left at 0 with k's set
  };
  for (const auto &t : strides) {
    a.k_pos_stride = t.kp;
    a.k_head_stride = t.kh;
    a.v_pos_stride = t.vp;
    a.v_head_stride = t.vh;
    assert_int_equal(kt->attention(&a), t.want);
  }

  assert_int_equal(kt->kv_store(SPECINFER_WTYPE_Q4_K, buf.data(), bytes.data(), 256),
                   SPECINFER_ERR_UNSUPPORTED);
  assert_int_equal(kt->kv_store(SPECINFER_WTYPE_Q8_0, buf.data(), bytes.data(), 48),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(kt->kv_store(SPECINFER_WTYPE_F16, nullptr, bytes.data(), 32),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  buf[3] = NAN;
  assert_int_equal(kt->kv_store(SPECINFER_WTYPE_Q8_0, buf.data(), bytes.data(), 32),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(kt->kv_store(SPECINFER_WTYPE_F16, buf.data(), bytes.data(), 32), SPECINFER_OK);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_types_against_exact), cmocka_unit_test(test_split_invariance),
      cmocka_unit_test(test_tree_mask_compact),   cmocka_unit_test(test_strided_layouts),
      cmocka_unit_test(test_key_tiles),           cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
