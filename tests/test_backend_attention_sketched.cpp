// Sketched attention (specinfer_attention_args.k_sketch, the kernel table's key_sketch), on every
// instruction set this CPU has:
//  - key_sketch writes the key's norm and sign bits whose QJL estimate of q.k is unbiased: over
//    400 random pairs (d 128, 256 bits) the mean error is within 4 standard errors of 0, and
//    k = q is estimated within 10% of |q|^2;
//  - every scorer gives the scalar scorer's scores bit for bit (so the same keys are picked);
//  - a query that sees no more than sink + select + window keys gets exact attention, bit for bit;
//  - beyond that, the result equals, bit for bit, exact attention over the keys the test picks
//    itself (first sink, last window, select largest scores, ties to the earlier key; with
//    n_rescore, the select of largest exact score among the n_rescore of largest estimate), also
//    with ties everywhere and with scores laid out to mislead the selection's sample, and a few
//    planted keys with large q.k are always among them;
//  - the same with Q8_0 keys in tiles, rescored by the tiles' own scores, against tiled exact
//    attention over the picked keys;
//  - a tree node's result equals, bit for bit, the causal call over the rows and sketches it sees
//    gathered in order (plain decoding of its path): speculation stays exact;
//  - each query of a causal batch (40 queries: more than a call reuses rescored picks' exact scores
//    for, so the batch takes the path that scores them again) equals, bit for bit, the call of that
//    query alone over its prefix (which reuses them), with and without rescoring;
//  - bad sizes and inputs are refused with a status.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "backend/attention.h"
#include "backend/attention_args.h"
#include "backend/attention_sketch.h"
#include "backend/kernel_table.h"
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

std::vector<uint8_t> sketches(const std::vector<float> &k, int64_t hd, int32_t bits) {
  const specinfer_kernels *kt = backend_kernel_table();
  const int64_t rows = int64_t(k.size()) / hd;
  std::vector<uint8_t> out(size_t(rows) * key_sketch_bytes(bits));
  assert_int_equal(kt->key_sketch(k.data(), rows, hd, bits, out.data()), SPECINFER_OK);
  return out;
}

void test_estimate(void **) {
  std::mt19937 rng(5);
  const int64_t hd = 128;
  const int32_t bits = 256;
  const int pairs = 400;
  const auto q = randn(size_t(pairs) * hd, rng), k = randn(size_t(pairs) * hd, rng);
  const auto ks = sketches(k, hd, bits);
  const size_t row = key_sketch_bytes(bits);
  std::vector<float> tables(size_t(bits) * 4);
  double sum_err = 0, sum_err2 = 0;
  for (int i = 0; i < pairs; ++i) {
    double exact = 0, n2 = 0;
    for (int64_t d = 0; d < hd; ++d) {
      exact += double(q[size_t(i * hd + d)]) * k[size_t(i * hd + d)];
      n2 += double(k[size_t(i * hd + d)]) * k[size_t(i * hd + d)];
    }
    float norm;
    std::memcpy(&norm, ks.data() + size_t(i) * row, 4);
    assert_true(std::fabs(norm - std::sqrt(n2)) <= 1e-4 * std::sqrt(n2));
    sketch_query_tables(q.data() + i * hd, 1, hd, bits, tables.data());
    float s;
    sketch_scores_scalar(tables.data(), 1, bits, ks.data() + size_t(i) * row, row, 1, &s);
    const double est = std::sqrt(M_PI / 2) / bits * s;
    sum_err += est - exact;
    sum_err2 += (est - exact) * (est - exact);
  }
  const double mean = sum_err / pairs, sd = std::sqrt(sum_err2 / pairs - mean * mean);
  print_message("qjl estimate over %d pairs: mean error %.4f, sd %.3f (|q||k| ~ %.0f)\n", pairs,
                mean, sd, double(hd));
  assert_true(std::fabs(mean) < 4 * sd / std::sqrt(double(pairs)));
  assert_true(sd < 0.15 * hd);  // QJL: sd ~ sqrt(pi/2 - 1) |q||k| / sqrt(bits)
  // A key equal to its query.
  const auto kq = sketches(std::vector<float>(q.begin(), q.begin() + hd), hd, bits);
  sketch_query_tables(q.data(), 1, hd, bits, tables.data());
  float s;
  sketch_scores_scalar(tables.data(), 1, bits, kq.data(), row, 1, &s);
  double n2 = 0;
  for (int64_t d = 0; d < hd; ++d) n2 += double(q[size_t(d)]) * q[size_t(d)];
  assert_true(std::fabs(std::sqrt(M_PI / 2) / bits * s - n2) < 0.1 * n2);
}

void test_scorers_agree(void **) {
  std::mt19937 rng(8);
  for (const int32_t bits : {32, 128, 384}) {
    for (const int64_t g : {1, 6, 7, 16, 17, 24, 40}) {
      const int64_t hd = 64, n = 333, hkv = 3;
      const auto k = randn(size_t(n * hkv * hd), rng), q = randn(size_t(g * hd), rng);
      const auto ks = sketches(k, hd, bits);
      std::vector<float> tables(size_t(g * bits * 4));
      sketch_query_tables(q.data(), g, hd, bits, tables.data());
      const size_t stride = key_sketch_bytes(bits) * hkv;
      std::vector<float> oracle(static_cast<size_t>(n));
      sketch_scores_scalar(tables.data(), g, bits, ks.data() + key_sketch_bytes(bits), stride, n,
                           oracle.data());
      for (const Isa isa : isas()) {
        std::vector<float> got(size_t(n), -1.0f);
        sketch_scorer(isa)(tables.data(), g, bits, ks.data() + key_sketch_bytes(bits), stride, n,
                           got.data());
        if (std::memcmp(got.data(), oracle.data(), got.size() * 4) != 0)
          print_error("%s: bits %d g %lld scores differ from the scalar scorer\n", isa_name(isa),
                      bits, (long long)g);
        assert_memory_equal(got.data(), oracle.data(), got.size() * 4);
      }
    }
  }
}

struct Shape {
  int H = 12, Hkv = 2, hd = 128;
  int32_t bits = 128, select = 40, window = 16, sink = 4;
  int32_t rescore = 0;  // n_rescore
};

specinfer_attention_args sketched_args(const Shape &s, int n_q, int n_kv, const float *q,
                                       const float *k, const float *v, const uint8_t *ks,
                                       float *out, const uint8_t *mask = nullptr) {
  specinfer_attention_args a = attention_args(n_q, s.H, s.Hkv, s.hd, n_kv, q, k, v, out, mask);
  a.k_type = a.v_type = SPECINFER_WTYPE_F32;
  a.k_sketch = ks;
  a.sketch_bits = s.bits;
  a.n_select = s.select;
  a.n_window = s.window;
  a.n_sink = s.sink;
  a.n_rescore = s.rescore;
  return a;
}

// A key's exact scores for the query heads of one kv head: exact(j, s) writes key j's g scores.
using ExactScores = std::function<void(int, float *)>;

// The exact scores of F32 keys in rows, by the active instruction set's kernel.
ExactScores row_scores(const Shape &s, const float *q, const float *k, int kvh) {
  return [&s, q, k, kvh](int j, float *sc) {
    const auto *row =
        reinterpret_cast<const uint8_t *>(k + (size_t(j) * s.Hkv + size_t(kvh)) * s.hd);
    float mx[64];
    attn_kernels(active_isa())
        .scores(SPECINFER_WTYPE_F32, q + kvh * (s.H / s.Hkv) * s.hd, s.H / s.Hkv, &row, 1, s.hd,
                1.0f / std::sqrt(float(s.hd)), sc, 1, mx);
  };
}

// The rows (positions) of kv head kvh that the query attends to, picked from the scalar scores
// (and with s.rescore, among the candidates they give, from their exact scores).
std::vector<int> pick(const Shape &s, const float *q, int kvh, int n_vis, const uint8_t *ks,
                      const ExactScores &exact) {
  const int total = s.sink + s.select + s.window, g = s.H / s.Hkv;
  std::vector<int> rows;
  if (n_vis <= total) {
    for (int j = 0; j < n_vis; ++j) rows.push_back(j);
    return rows;
  }
  std::vector<float> tables(size_t(g) * s.bits * 4);
  sketch_query_tables(q + kvh * g * s.hd, g, s.hd, s.bits, tables.data());
  const size_t row = key_sketch_bytes(s.bits);
  std::vector<std::pair<float, int>> cand;
  for (int j = s.sink; j < n_vis - s.window; ++j) {
    float sc;
    sketch_scores_scalar(tables.data(), g, s.bits, ks + (size_t(j) * s.Hkv + kvh) * row, row, 1,
                         &sc);
    cand.push_back({sc, j});
  }
  std::sort(cand.begin(), cand.end(), [](const auto &x, const auto &y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  if (s.rescore > s.select) {
    // Each candidate's largest exact score less its head's largest over the candidates.
    cand.resize(std::min(cand.size(), size_t(s.rescore)));
    std::vector<float> sc(cand.size() * size_t(g)), best(size_t(g), -INFINITY);
    for (size_t i = 0; i < cand.size(); ++i) {
      exact(cand[i].second, sc.data() + i * size_t(g));
      for (int h = 0; h < g; ++h)
        best[size_t(h)] = std::max(best[size_t(h)], sc[i * size_t(g) + size_t(h)]);
    }
    for (size_t i = 0; i < cand.size(); ++i) {
      float e = -INFINITY;
      for (int h = 0; h < g; ++h) e = std::max(e, sc[i * size_t(g) + size_t(h)] - best[size_t(h)]);
      cand[i].first = e;
    }
    std::sort(cand.begin(), cand.end(), [](const auto &x, const auto &y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
  }
  for (int j = 0; j < s.sink; ++j) rows.push_back(j);
  for (int i = 0; i < s.select; ++i) rows.push_back(cand[size_t(i)].second);
  for (int j = n_vis - s.window; j < n_vis; ++j) rows.push_back(j);
  std::sort(rows.begin(), rows.end());
  return rows;
}

void test_against_picked(void **) {
  std::mt19937 rng(21);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  Shape s;
  const int g = s.H / s.Hkv;
  // Rescored: 200 or 2000 candidates, and every key a candidate (the exact top keys). With 5000
  // keys the selection samples the scores; two more layouts test it there: every key one of seven
  // (ties everywhere), and large keys exactly where the sample looks, so that it misleads.
  struct Case {
    int n_kv;
    int layout;  // 0 random, 1 seven distinct keys, 2 large keys at the sample's stride
  };
  const Case cases[] = {{50, 0},   {60, 0},   {61, 0},   {700, 0},
                        {1500, 0}, {5000, 0}, {5000, 1}, {5000, 2}};
  for (const int32_t rescore : {0, 200, 2000, 1 << 20})
    for (const Case cs : cases) {
      const int n_kv = cs.n_kv;
      s.rescore = rescore;
      const size_t nk = size_t(n_kv) * s.Hkv * s.hd;
      auto q = randn(size_t(s.H) * s.hd, rng, 0.3f);
      auto k = randn(nk, rng), v = randn(nk, rng);
      const size_t pos_row = size_t(s.Hkv) * s.hd;
      if (cs.layout == 1)
        for (size_t j = 7; j < size_t(n_kv); ++j)
          std::copy_n(k.begin() + long((j % 7) * pos_row), pos_row, k.begin() + long(j * pos_row));
      const int n_scored = n_kv - s.sink - s.window, stride = n_scored / 1024;
      if (cs.layout == 2)  // distinct scores, so that the sample's threshold is too high
        for (int j = s.sink; j < n_kv - s.window; j += stride)
          for (int kvh = 0; kvh < s.Hkv; ++kvh)
            for (int d = 0; d < s.hd; ++d)
              k[size_t(j) * pos_row + size_t(kvh * s.hd + d)] =
                  (1.0f + float(j) / float(n_kv)) * q[size_t(kvh * g * s.hd + d)];
      // Planted keys: for kv head 0, positions close to 3 * query head 0 (a large q.k).
      const std::vector<int> planted = {7, n_kv / 3, n_kv / 2 + 1};
      if (n_kv > 100)
        for (const int p : planted)
          for (int d = 0; d < s.hd; ++d)
            k[(size_t(p) * s.Hkv) * s.hd + size_t(d)] = 3 * q[size_t(d)];
      const auto ks = sketches(k, s.hd, s.bits);
      std::vector<float> ref(q.size());
      auto exact_args =
          attention_args(1, s.H, s.Hkv, s.hd, n_kv, q.data(), k.data(), v.data(), ref.data());
      for (const Isa isa : isas()) {
        set_active_isa(isa);
        std::vector<float> out(q.size());
        const auto a =
            sketched_args(s, 1, n_kv, q.data(), k.data(), v.data(), ks.data(), out.data());
        assert_int_equal(kt->attention(&a), SPECINFER_OK);
        assert_int_equal(kt->attention(&exact_args), SPECINFER_OK);
        if (n_kv <= s.sink + s.select + s.window) {
          assert_memory_equal(out.data(), ref.data(), out.size() * 4);
          continue;
        }
        for (int kvh = 0; kvh < s.Hkv; ++kvh) {
          const auto rows =
              pick(s, q.data(), kvh, n_kv, ks.data(), row_scores(s, q.data(), k.data(), kvh));
          // (With seven distinct keys, rescoring finds as many keys as close to their head's
          // largest score as the planted ones, and ties go to the earlier keys.)
          if (kvh == 0 && n_kv > 100 && cs.layout != 1)
            for (const int p : planted)
              assert_true(std::find(rows.begin(), rows.end(), p) != rows.end());
          // Exact attention over the picked rows gathered, for this kv head's query heads.
          std::vector<float> gk, gv;
          for (const int r : rows) {
            const size_t at = (size_t(r) * s.Hkv + size_t(kvh)) * s.hd;
            gk.insert(gk.end(), k.begin() + long(at), k.begin() + long(at + s.hd));
            gv.insert(gv.end(), v.begin() + long(at), v.begin() + long(at + s.hd));
          }
          std::vector<float> got(size_t(g) * s.hd);
          const auto b =
              attention_args(1, g, 1, s.hd, int(rows.size()), q.data() + size_t(kvh) * g * s.hd,
                             gk.data(), gv.data(), got.data());
          assert_int_equal(kt->attention(&b), SPECINFER_OK);
          if (std::memcmp(got.data(), out.data() + size_t(kvh) * g * s.hd, got.size() * 4) != 0)
            print_error(
                "%s n_kv %d layout %d kv head %d rescore %d: not attention over the "
                "picked keys\n",
                isa_name(isa), n_kv, cs.layout, kvh, rescore);
          assert_memory_equal(got.data(), out.data() + size_t(kvh) * g * s.hd, got.size() * 4);
        }
      }
    }
  set_active_isa(prev);
}

// Sketched attention over Q8_0 keys in tiles (head-major, as the gguf plugin keeps them with
// kv_tiles=1), with and without rescoring: each kv head's result equals, bit for bit, tiled exact
// attention over the keys the test picks itself (a candidate's exact scores from scores_tile on
// its own lane), tiled again in order; the planted keys are among them.
void test_tiles_against_picked(void **) {
  std::mt19937 rng(23);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  Shape s;
  const int g = s.H / s.Hkv, n_kv = 1500, cap = 1504, hd = s.hd;
  const int32_t type = SPECINFER_WTYPE_Q8_0;
  const size_t nk = size_t(n_kv) * s.Hkv * hd;
  const auto q = randn(size_t(s.H) * hd, rng, 0.3f);
  auto k = randn(nk, rng);
  const auto v = randn(nk, rng);
  const std::vector<int> planted = {7, n_kv / 3, n_kv / 2 + 1};
  for (const int p : planted)
    for (int d = 0; d < hd; ++d) k[(size_t(p) * s.Hkv) * hd + size_t(d)] = 3 * q[size_t(d)];
  const Stored ks = store(type, k, hd), vs = store(type, v, hd);
  const size_t row = kt->row_size(type, hd);
  const auto kb = tiled(ks, row, n_kv, s.Hkv, hd, cap),
             vb = restride(vs, row, n_kv, s.Hkv, row, cap * row, s.Hkv * cap * row);
  const auto sk = sketches(k, hd, s.bits);
  const float scale = 1.0f / std::sqrt(float(hd));
  for (const int32_t rescore : {0, 200}) {
    s.rescore = rescore;
    for (const Isa isa : isas()) {
      set_active_isa(isa);
      std::vector<float> out(q.size());
      auto a = sketched_args(s, 1, n_kv, q.data(), reinterpret_cast<const float *>(kb.data()),
                             reinterpret_cast<const float *>(vb.data()), sk.data(), out.data());
      a.k_type = a.v_type = type;
      a.k_pos_stride = a.v_pos_stride = int64_t(row);
      a.k_head_stride = a.v_head_stride = int64_t(cap) * int64_t(row);
      a.k_tile = SPECINFER_KEY_TILE;
      assert_int_equal(kt->attention(&a), SPECINFER_OK);
      for (int kvh = 0; kvh < s.Hkv; ++kvh) {
        // The query rounded as tiles score it, and a key's scores from its own lane.
        std::vector<int8_t> qs(size_t(g) * hd);
        std::vector<float> qd(size_t(g) * hd / 32);
        std::vector<int32_t> qb(qd.size());
        for (int h = 0; h < g; ++h)
          quantize_query_q8(q.data() + size_t(kvh * g + h) * hd, hd, qs.data() + h * hd,
                            qd.data() + h * hd / 32, qb.data() + h * hd / 32);
        const ExactScores lane_scores = [&](int j, float *sc) {
          std::vector<float> mx(size_t(g), -INFINITY);
          const uint8_t *tile = kb.data() + size_t(kvh) * cap * row + size_t(j / 16 * 16) * row;
          attn_kernels(isa).scores_tile(qs.data(), qd.data(), qb.data(), g, tile, hd, scale, j % 16,
                                        j % 16 + 1, sc, 1, mx.data());
        };
        const auto rows = pick(s, q.data(), kvh, n_kv, sk.data(), lane_scores);
        if (kvh == 0)
          for (const int p : planted)
            assert_true(std::find(rows.begin(), rows.end(), p) != rows.end());
        // Tiled exact attention over the picked keys of this kv head, in order.
        Stored gk, gv;
        for (const int r : rows) {
          const size_t at = (size_t(r) * s.Hkv + size_t(kvh)) * row;
          gk.bytes.insert(gk.bytes.end(), ks.bytes.begin() + long(at),
                          ks.bytes.begin() + long(at + row));
          gv.bytes.insert(gv.bytes.end(), vs.bytes.begin() + long(at),
                          vs.bytes.begin() + long(at + row));
        }
        const int n = int(rows.size()), gcap = (n + 15) / 16 * 16;
        const auto gkb = tiled(gk, row, n, 1, hd, gcap);
        std::vector<float> got(size_t(g) * hd);
        auto b =
            typed_args(1, g, 1, hd, n, q.data() + size_t(kvh) * g * hd, type, gk, gv, got.data());
        b.k = reinterpret_cast<const float *>(gkb.data());
        b.k_pos_stride = b.v_pos_stride = int64_t(row);
        b.k_head_stride = b.v_head_stride = int64_t(gcap) * int64_t(row);
        b.k_tile = SPECINFER_KEY_TILE;
        assert_int_equal(kt->attention(&b), SPECINFER_OK);
        if (std::memcmp(got.data(), out.data() + size_t(kvh) * g * hd, got.size() * 4) != 0)
          print_error("%s kv head %d rescore %d: tiles, not attention over the picked keys\n",
                      isa_name(isa), kvh, rescore);
        assert_memory_equal(got.data(), out.data() + size_t(kvh) * g * hd, got.size() * 4);
      }
    }
  }
  set_active_isa(prev);
}

void test_tree_mask(void **) {
  std::mt19937 rng(12);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  Shape s;
  s.window = 3;  // smaller than the tree's depth: its nodes are scored and picked too
  for (const int32_t rescore : {0, 300}) {
    s.rescore = rescore;
    const int n_prefix = 900, n_q = 10, n_kv = n_prefix + n_q;
    const int parent[n_q] = {-1, 0, 0, 1, 1, 2, 3, 3, 6, 8};
    std::vector<uint8_t> mask(size_t(n_q) * n_kv, 0);
    for (int b = 0; b < n_q; ++b) {
      std::memset(mask.data() + size_t(b) * n_kv, 1, n_prefix);
      for (int a = b; a >= 0; a = parent[a]) mask[size_t(b) * n_kv + n_prefix + a] = 1;
    }
    const size_t nk = size_t(n_kv) * s.Hkv * s.hd;
    const auto q = randn(size_t(n_q) * s.H * s.hd, rng, 0.5f);
    const auto k = randn(nk, rng), v = randn(nk, rng);
    const auto ks = sketches(k, s.hd, s.bits);
    const size_t pos_f = size_t(s.Hkv) * s.hd, pos_s = key_sketch_bytes(s.bits) * s.Hkv;
    for (const Isa isa : isas()) {
      set_active_isa(isa);
      std::vector<float> tree(q.size());
      const auto a = sketched_args(s, n_q, n_kv, q.data(), k.data(), v.data(), ks.data(),
                                   tree.data(), mask.data());
      assert_int_equal(kt->attention(&a), SPECINFER_OK);
      for (int b = 0; b < n_q; ++b) {
        std::vector<float> gk, gv;
        std::vector<uint8_t> gs;
        for (int j = 0; j < n_kv; ++j)
          if (mask[size_t(b) * n_kv + j]) {
            gk.insert(gk.end(), k.begin() + long(j * pos_f), k.begin() + long((j + 1) * pos_f));
            gv.insert(gv.end(), v.begin() + long(j * pos_f), v.begin() + long((j + 1) * pos_f));
            gs.insert(gs.end(), ks.begin() + long(j * pos_s), ks.begin() + long((j + 1) * pos_s));
          }
        const int n_vis = int(gk.size() / pos_f);
        std::vector<float> one(size_t(s.H) * s.hd);
        const auto c = sketched_args(s, 1, n_vis, q.data() + size_t(b) * s.H * s.hd, gk.data(),
                                     gv.data(), gs.data(), one.data());
        assert_int_equal(kt->attention(&c), SPECINFER_OK);
        if (std::memcmp(one.data(), tree.data() + size_t(b) * s.H * s.hd, one.size() * 4) != 0)
          print_error("%s: tree node %d differs from its plain-decoding call\n", isa_name(isa), b);
        assert_memory_equal(one.data(), tree.data() + size_t(b) * s.H * s.hd, one.size() * 4);
      }
    }
  }
  set_active_isa(prev);
}

void test_batch_against_alone(void **) {
  std::mt19937 rng(33);
  const Isa prev = active_isa();
  const specinfer_kernels *kt = backend_kernel_table();
  Shape s;
  for (const int32_t rescore : {0, 300}) {
    s.rescore = rescore;
    const int n_prefix = 700, n_q = 40, n_kv = n_prefix + n_q;
    const size_t nk = size_t(n_kv) * s.Hkv * s.hd;
    const auto q = randn(size_t(n_q) * s.H * s.hd, rng, 0.5f);
    const auto k = randn(nk, rng), v = randn(nk, rng);
    const auto ks = sketches(k, s.hd, s.bits);
    for (const Isa isa : isas()) {
      set_active_isa(isa);
      std::vector<float> batch(q.size());
      const auto a =
          sketched_args(s, n_q, n_kv, q.data(), k.data(), v.data(), ks.data(), batch.data());
      assert_int_equal(kt->attention(&a), SPECINFER_OK);
      for (const int b : {0, 1, 17, n_q - 1}) {
        std::vector<float> one(size_t(s.H) * s.hd);
        const auto c = sketched_args(s, 1, n_prefix + b + 1, q.data() + size_t(b) * s.H * s.hd,
                                     k.data(), v.data(), ks.data(), one.data());
        assert_int_equal(kt->attention(&c), SPECINFER_OK);
        if (std::memcmp(one.data(), batch.data() + size_t(b) * s.H * s.hd, one.size() * 4) != 0)
          print_error("%s rescore %d: query %d of the batch differs from its call alone\n",
                      isa_name(isa), rescore, b);
        assert_memory_equal(one.data(), batch.data() + size_t(b) * s.H * s.hd, one.size() * 4);
      }
    }
  }
  set_active_isa(prev);
}

void test_errors(void **) {
  const specinfer_kernels *kt = backend_kernel_table();
  std::vector<float> buf(8192, 0.5f), out(4096);
  std::vector<uint8_t> ks(8192);
  assert_int_equal(kt->key_sketch(buf.data(), 4, 32, 100, ks.data()),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(kt->key_sketch(buf.data(), 4, 32, 2048, ks.data()),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(kt->key_sketch(nullptr, 4, 32, 64, ks.data()), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(kt->key_sketch(buf.data(), 0, 32, 64, ks.data()),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  buf[5] = INFINITY;
  assert_int_equal(kt->key_sketch(buf.data(), 4, 32, 64, ks.data()),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  buf[5] = 0.5f;
  assert_int_equal(kt->key_sketch(buf.data(), 4, 32, 64, ks.data()), SPECINFER_OK);
  Shape s;
  s.hd = 32;
  s.H = 2;
  s.Hkv = 1;
  s.bits = 64;
  auto a = sketched_args(s, 1, 4, buf.data(), buf.data(), buf.data(), ks.data(), out.data());
  assert_int_equal(kt->attention(&a), SPECINFER_OK);
  a.sketch_bits = 48;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.sketch_bits = 64;
  a.n_select = 0;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.n_select = 4;
  a.n_window = -1;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.n_window = 0;
  a.n_rescore = -1;
  assert_int_equal(kt->attention(&a), SPECINFER_ERR_INVALID_ARGUMENT);
  a.n_rescore = 8;
  assert_int_equal(kt->attention(&a), SPECINFER_OK);
  assert_true((kt->attention_features & SPECINFER_ATTN_RESCORE) != 0);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_estimate),       cmocka_unit_test(test_scorers_agree),
      cmocka_unit_test(test_against_picked), cmocka_unit_test(test_tiles_against_picked),
      cmocka_unit_test(test_tree_mask),      cmocka_unit_test(test_batch_against_alone),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
