// Tree-masked attention is bit for bit the attention of plain decoding: for every query of a
// random token tree over a cached prefix, the masked result equals a causal attention call (one
// query) over the keys and values it may see, gathered in order (the prefix, the query's
// ancestors, the query last) — the call plain decoding makes for that token once the path is in
// the cache. Speculative decoding with trees relies on it to give the exact text of plain
// decoding. Random shapes, trees and prefixes, on every instruction set this CPU has; also with
// masked cached positions (a sliding window).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "util/isa.h"

#include "support/backend_util.h"
#include "support/cmocka_setup.h"

using namespace specinfer;

namespace {

using specinfer_test::isas;
using specinfer_test::randn;

struct Shape {
  int n_head, n_head_kv, head_dim;
};

// One case: n_prefix cached positions, then a batch of n_q = n_nodes + 1 tokens: the last committed
// token, then the nodes of a random tree under it (each node's parent is an earlier one). window >
// 0 also hides cached positions more than `window` positions before the query (a query at batch
// index i sits at position n_prefix + depth(i)). Counts the queries compared and those that differ
// (the first difference of a case is printed).
void run_case(const Shape &s, int n_prefix, int n_nodes, int window, std::mt19937 &rng,
              const char *isa, int &n_queries, int &n_differ) {
  const int n_q = n_nodes + 1, n_kv = n_prefix + n_q;
  const int hd = s.head_dim, H = s.n_head, Hkv = s.n_head_kv;
  // Spread-out scores, so that softmax weights range over orders of magnitude.
  const float sd = 2.0f / std::sqrt(std::sqrt(static_cast<float>(hd)));
  const auto q = randn(static_cast<size_t>(n_q) * H * hd, rng, sd);
  const auto k = randn(static_cast<size_t>(n_kv) * Hkv * hd, rng, sd);
  const auto v = randn(static_cast<size_t>(n_kv) * Hkv * hd, rng, 1.0f);

  // Batch index b's parent in the batch (-1 for the root) and depth.
  std::vector<int> parent(static_cast<size_t>(n_q), -1), depth(static_cast<size_t>(n_q), 0);
  for (int b = 1; b < n_q; ++b) {
    std::uniform_int_distribution<int> pick(0, b - 1);
    parent[static_cast<size_t>(b)] = pick(rng);
    depth[static_cast<size_t>(b)] = depth[static_cast<size_t>(parent[static_cast<size_t>(b)])] + 1;
  }
  std::vector<uint8_t> mask(static_cast<size_t>(n_q) * n_kv, 0);
  for (int b = 0; b < n_q; ++b) {
    uint8_t *m = mask.data() + static_cast<size_t>(b) * n_kv;
    const int pos = n_prefix + depth[static_cast<size_t>(b)];
    for (int j = 0; j < n_prefix; ++j) m[j] = window <= 0 || pos - j < window;
    for (int a = b; a >= 0; a = parent[static_cast<size_t>(a)]) m[n_prefix + a] = 1;
  }

  std::vector<float> out(q.size(), NAN);
  specinfer_attention_args a{};
  a.struct_size = sizeof a;
  a.n_q = n_q;
  a.n_head = H;
  a.n_head_kv = Hkv;
  a.head_dim = hd;
  a.n_kv = n_kv;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.mask = mask.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.out = out.data();
  attention(a);

  // Each query alone, causal, over its visible keys gathered in order (it is the last of them).
  const size_t row = static_cast<size_t>(Hkv) * hd;
  std::vector<float> gk, gv, want(static_cast<size_t>(H) * hd);
  bool printed = false;
  for (int b = 0; b < n_q; ++b) {
    gk.clear();
    gv.clear();
    const uint8_t *m = mask.data() + static_cast<size_t>(b) * n_kv;
    for (int j = 0; j < n_kv; ++j) {
      if (!m[j]) continue;
      gk.insert(gk.end(), k.begin() + static_cast<ptrdiff_t>(j * row),
                k.begin() + static_cast<ptrdiff_t>((j + 1) * row));
      gv.insert(gv.end(), v.begin() + static_cast<ptrdiff_t>(j * row),
                v.begin() + static_cast<ptrdiff_t>((j + 1) * row));
    }
    specinfer_attention_args c = a;
    c.n_q = 1;
    c.n_kv = static_cast<int32_t>(gk.size() / row);
    c.q = q.data() + static_cast<size_t>(b) * H * hd;
    c.k = gk.data();
    c.v = gv.data();
    c.mask = nullptr;
    c.out = want.data();
    attention(c);
    const float *got = out.data() + static_cast<size_t>(b) * H * hd;
    ++n_queries;
    if (std::memcmp(got, want.data(), want.size() * sizeof(float)) == 0) continue;
    ++n_differ;
    if (!printed) {
      printed = true;
      size_t i = 0;
      while (got[i] == want[i]) ++i;
      print_error(
          "%s: heads %d/%d, head_dim %d, prefix %d, %d nodes, window %d: query %d (depth %d, "
          "%d keys visible): out[%zu] = %.9g, plain decoding %.9g\n",
          isa, H, Hkv, hd, n_prefix, n_nodes, window, b, depth[static_cast<size_t>(b)], c.n_kv, i,
          static_cast<double>(got[i]), static_cast<double>(want[i]));
    }
  }
}

void test_tree_equals_plain_decoding(void **) {
  const Isa prev = active_isa();
  // Qwen2.5 0.5B (14/2 heads of 64), 1.5B (12/2 of 128), multi-head, and a head_dim that is not a
  // multiple of 8 (the kernels' scalar tails).
  const Shape shapes[] = {{14, 2, 64}, {12, 2, 128}, {4, 4, 32}, {6, 2, 13}};
  int total_differ = 0;
  for (Isa isa : isas()) {
    set_active_isa(isa);
    std::mt19937 rng(2024);
    int queries = 0, differ = 0;
    for (const Shape &s : shapes) {
      for (int n_prefix : {0, 1, 7, 13, 64, 203}) {
        for (int n_nodes : {1, 2, 5, 8, 15, 24}) {
          run_case(s, n_prefix, n_nodes, 0, rng, isa_name(isa), queries, differ);
          if (n_prefix > 8) run_case(s, n_prefix, n_nodes, 9, rng, isa_name(isa), queries, differ);
        }
      }
    }
    std::printf("  %s: %d of %d tree queries differ from plain decoding\n", isa_name(isa), differ,
                queries);
    total_differ += differ;
  }
  set_active_isa(prev);
  assert_int_equal(total_differ, 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tree_equals_plain_decoding),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
