// White-box tests of the gguf transformer forward on tiny random models: logits against a naive
// double-precision reference (F32, F16 and Q8_0 weights; Qwen2 and Llama layouts), batched ==
// token-by-token, truncate + re-forward == fresh, tree mask == separate chains, kv_keep, and
// errors on bad input.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data/gguf/tiny_model.h"
#include "gguf/gguf_file.h"
#include "gguf/model.h"
#include "plugin/host.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

using namespace gguf_test;
using specinfer::gguf::Error;
using specinfer::gguf::File;
using specinfer::gguf::Model;

namespace {

struct Loaded {
  TinyConfig cfg;
  TinyWeights w;
  std::unique_ptr<File> file;
  std::unique_ptr<Model> model;
};

// The cache in f32 unless told otherwise: the references are f32 arithmetic (the other cache types
// are checked against f32 in test_gguf_kv_types).
std::unique_ptr<Loaded> load(const TinyConfig &c, int32_t kv_type = SPECINFER_WTYPE_F32) {
  auto L = std::make_unique<Loaded>();
  L->cfg = c;
  std::vector<uint8_t> bytes = make_tiny_model(c, &L->w);
  L->file = File::from_memory(bytes.data(), bytes.size());
  specinfer::gguf::ModelOptions opt;
  opt.kv_type = kv_type;
  L->model = std::make_unique<Model>(*L->file, specinfer::default_host(), 0, opt);
  return L;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t &x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

std::vector<int32_t> iota_pos(int n, int start = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) p[size_t(i)] = start + i;
  return p;
}

double max_abs(const std::vector<float> &a, const std::vector<float> &b) {
  assert_int_equal(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Model logits for all n tokens in one batch vs the reference; returns the max abs difference
// relative to max(1, max |reference logit|).
double compare_with_reference(const TinyConfig &c, int n, double *abs_err = nullptr,
                              int first_pos = 0) {
  auto L = load(c);
  std::vector<int32_t> toks = random_tokens(n, c.n_vocab, c.seed + 100),
                       pos = iota_pos(n, first_pos);
  std::vector<float> logits(size_t(n) * size_t(c.n_vocab)), hidden(size_t(n) * size_t(c.n_embd));
  L->model->forward(toks.data(), pos.data(), n, nullptr, n, logits.data(), hidden.data());
  std::vector<double> ref, ref_h;
  reference_forward(c, L->w, toks, pos, causal_mask(n), &ref, &ref_h);
  double m = 0, scale = 1, mh = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    m = std::max(m, std::fabs(double(logits[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  for (size_t i = 0; i < ref_h.size(); i++)
    mh = std::max(mh, std::fabs(double(hidden[i]) - ref_h[i]));
  // The hidden state is the input of the output matrix; its error bounds the logits' error.
  if (abs_err) *abs_err = m;
  print_message(
      "  %s wtype=%u tied=%d n=%d: max |logit - ref| = %.3g (max |ref| %.3g), hidden %.3g\n",
      c.arch.c_str(), c.wtype, int(c.tied), n, m, scale, mh);
  return m / scale;
}

// Tolerances (relative to max(1, max |ref logit|)): F32 weights differ from the double reference
// only by float rounding (1e-4); F16 kernels may round activations to fp16 (5e-3); Q8_0 kernels
// quantize activations to int8 blocks like llama.cpp, and the error compounds over the
// layers of a random model (measured 2.8e-2 worst; tolerance 8e-2 - a wrong layout gives O(1)).
void test_reference_f32(void **) {
  TinyConfig c;
  assert_true(compare_with_reference(c, 12) < 1e-4);
  c.arch = "llama";
  c.seed = 2;
  assert_true(compare_with_reference(c, 12) < 1e-4);
  c.tied = true;
  c.n_head_kv = 4;  // plain multi-head attention
  assert_true(compare_with_reference(c, 5) < 1e-4);
}

// Qwen3 (q/k norms) and Gemma 3 (over 12 tokens: the window matters).
void test_reference_qwen3_gemma3(void **) {
  TinyConfig c;
  c.arch = "qwen3";
  assert_true(compare_with_reference(c, 9) < 1e-4);
  assert_true(compare_with_reference(tiny_gemma3(), 12) < 1e-4);
}

void test_reference_f16(void **) {
  TinyConfig c;
  c.wtype = 1;
  c.tied = true;
  assert_true(compare_with_reference(c, 10) < 5e-3);
}

void test_reference_q8_0(void **) {
  TinyConfig c;
  c.wtype = 8;
  c.seed = 3;
  assert_true(compare_with_reference(c, 10) < 8e-2);
  c.arch = "llama";
  assert_true(compare_with_reference(c, 10) < 8e-2);
}

// n tokens in one forward == the same tokens one forward at a time.
// Scaled RoPE against the reference's own formulas, at positions far past the tiny model's
// trained context (where scaling matters): linear, YaRN (its ramp inside the head's pairs),
// Llama 3's per-pair factors (rope_freqs.weight), and Gemma 3, whose sliding-window layers stay
// unscaled.
void test_rope_scaling(void **) {
  TinyConfig lin;
  lin.rope_scaling = "linear";
  lin.rope_factor = 4.0f;
  assert_true(compare_with_reference(lin, 10, nullptr, 900) < 1e-4);
  TinyConfig yarn = lin;
  yarn.rope_scaling = "yarn";
  yarn.rope_orig_ctx = 4096;  // with head_dim 16 and base 1e4: a ramp from pair 2 to pair 6
  assert_true(compare_with_reference(yarn, 10, nullptr, 900) < 1e-4);
  TinyConfig l3;
  l3.arch = "llama";
  for (int i = 0; i < l3.head_dim() / 2; i++) l3.rope_freq_factors.push_back(1.0f + float(i % 5));
  assert_true(compare_with_reference(l3, 10, nullptr, 900) < 1e-4);
  TinyConfig g = tiny_gemma3();
  g.rope_scaling = "yarn";
  g.rope_factor = 8.0f;
  g.rope_orig_ctx = 512;
  assert_true(compare_with_reference(g, 12, nullptr, 700) < 1e-4);

  // Independently of any formula: linear scaling by 2 at positions 0, 2, 4, ... is the unscaled
  // model at 0, 1, 2, ...
  TinyConfig two;
  two.rope_scaling = "linear";
  two.rope_factor = 2.0f;
  auto A = load(two), B = load(TinyConfig{});
  const int n = 9;
  const std::vector<int32_t> toks = random_tokens(n, two.n_vocab, 7);
  std::vector<int32_t> even;
  for (int i = 0; i < n; i++) even.push_back(2 * i);
  const std::vector<int32_t> pos = iota_pos(n);
  std::vector<float> la(size_t(n) * size_t(two.n_vocab)), lb(la.size());
  A->model->forward(toks.data(), even.data(), n, nullptr, n, la.data(), nullptr);
  B->model->forward(toks.data(), pos.data(), n, nullptr, n, lb.data(), nullptr);
  print_message("  linear x2 at even positions vs unscaled: max abs diff %.3g\n", max_abs(la, lb));
  assert_true(max_abs(la, lb) < 1e-4);
}

void test_batched_equals_single(void **) {
  for (uint32_t wt : {0u, 8u, 100u}) {
    TinyConfig c;
    c.wtype = wt == 100 ? 0 : wt;
    if (wt == 100) {  // Gemma 3 with a sliding window smaller than the sequence
      c.arch = "gemma3";
      c.swa = 3;
      c.tied = true;
    }
    auto A = load(c), B = load(c);
    const int n = 9;
    std::vector<int32_t> toks = random_tokens(n, c.n_vocab, 7), pos = iota_pos(n);
    std::vector<float> batched(size_t(n) * size_t(c.n_vocab)), single(batched.size());
    A->model->forward(toks.data(), pos.data(), n, nullptr, n, batched.data(), nullptr);
    for (int i = 0; i < n; i++)
      B->model->forward(&toks[size_t(i)], &pos[size_t(i)], 1, nullptr, 1,
                        single.data() + size_t(i) * size_t(c.n_vocab), nullptr);
    assert_int_equal(A->model->kv_size(), n);
    assert_int_equal(B->model->kv_size(), n);
    double d = max_abs(batched, single);
    print_message("  wtype=%u batched vs single: max abs diff %.3g\n", wt, d);
    assert_true(d < 1e-3);
    // n_logits < n gives the last rows.
    auto C = load(c);
    std::vector<float> last(size_t(3) * size_t(c.n_vocab));
    C->model->forward(toks.data(), pos.data(), n, nullptr, 3, last.data(), nullptr);
    std::vector<float> tail(batched.end() - long(last.size()), batched.end());
    assert_true(max_abs(last, tail) < 1e-3);
  }
}

// Truncating the cache and forwarding different tokens gives what a fresh model gives.
void test_truncate_refeed(void **) {
  TinyConfig c;
  auto A = load(c), B = load(c);
  const int n = 8;
  std::vector<int32_t> toks = random_tokens(n, c.n_vocab, 11), pos = iota_pos(n);
  std::vector<float> lg(size_t(n) * size_t(c.n_vocab));
  A->model->forward(toks.data(), pos.data(), n, nullptr, n, lg.data(), nullptr);
  A->model->kv_truncate(5);
  assert_int_equal(A->model->kv_size(), 5);
  A->model->kv_truncate(100);  // no-op
  assert_int_equal(A->model->kv_size(), 5);
  std::vector<int32_t> alt = {3, 4, 5};
  std::vector<float> la(size_t(3) * size_t(c.n_vocab)), lb(la.size());
  A->model->forward(alt.data(), pos.data() + 5, 3, nullptr, 3, la.data(), nullptr);
  std::vector<int32_t> fresh(toks.begin(), toks.begin() + 5);
  fresh.insert(fresh.end(), alt.begin(), alt.end());
  B->model->forward(fresh.data(), pos.data(), n, nullptr, 3, lb.data(), nullptr);
  double d = max_abs(la, lb);
  print_message("  truncate + refeed vs fresh: %.3g\n", d);
  assert_true(d < 1e-3);
  // And the refed logits must differ from the original continuation's (the test can fail).
  std::vector<float> orig(lg.end() - long(la.size()), lg.end());
  assert_true(max_abs(la, orig) > 1e-2);
}

// By default a sequence's context is the model's trained one and its cache is f16; loading makes
// none of the cache resident.
void test_defaults(void **) {
  TinyConfig c;
  c.n_ctx = 32768;
  auto A = load(c, -1);
  assert_int_equal(A->model->n_ctx(), 32768);
  assert_int_equal(A->model->weights()->kv_type, SPECINFER_WTYPE_F16);
  assert_int_equal(A->model->kv_resident_bytes(), 0);
  std::vector<float> lg(size_t(c.n_vocab));
  const std::vector<int32_t> toks = random_tokens(8, c.n_vocab, 1), pos = iota_pos(8);
  A->model->forward(toks.data(), pos.data(), 8, nullptr, 1, lg.data(), nullptr);
  // The library's attention reads row strides, so the cache is head-major: every kv head's rows
  // of a layer's keys (and values) are a region of their own.
  assert_true(A->model->weights()->kv_head_major);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  assert_int_equal(A->model->kv_resident_bytes(), size_t(c.n_layer) * 2 * c.n_head_kv * page);
}

// A host whose attention reads no row strides (a kernel table that ends before
// attention_features) gets a cache by position instead of head-major. The two layouts hold the
// same rows, so every logit is the same bits through prefill, a tree, kv_keep, a cut and a refeed.
void test_cache_layouts(void **) {
  TinyConfig c;
  c.n_embd = 128;  // head_dim 32: whole q8_0 blocks
  specinfer_kernels kernels = *specinfer::default_host()->kernels;
  kernels.struct_size = offsetof(specinfer_kernels, attention_features);
  specinfer_host old_host = *specinfer::default_host();
  old_host.kernels = &kernels;
  for (const int32_t kv_type : {SPECINFER_WTYPE_F32, SPECINFER_WTYPE_Q8_0}) {
    TinyWeights w;
    std::vector<uint8_t> bytes = make_tiny_model(c, &w);
    auto file = File::from_memory(bytes.data(), bytes.size());
    specinfer::gguf::ModelOptions opt;
    opt.kv_type = kv_type;
    opt.kv_tiles = false;  // keys in rows too (test_key_tiles covers tiles)
    Model a(*file, specinfer::default_host(), 0, opt), b(*file, &old_host, 0, opt);
    assert_true(a.weights()->kv_head_major);
    assert_false(b.weights()->kv_head_major);
    const int V = c.n_vocab, np = 40, nt = 5;
    const std::vector<int32_t> prefix = random_tokens(np, V, 5), ppos = iota_pos(np);
    const std::vector<int32_t> tt = {3, 4, 5, 6, 7}, parent = {-1, 0, 0, 1, 3};
    std::vector<uint8_t> mask(size_t(nt) * nt, 0);
    std::vector<int32_t> tpos(nt);
    for (int i = 0; i < nt; i++) {
      for (int j = i; j >= 0; j = parent[size_t(j)]) mask[size_t(i) * nt + size_t(j)] = 1;
      tpos[size_t(i)] = parent[size_t(i)] < 0 ? np : tpos[size_t(parent[size_t(i)])] + 1;
    }
    const int32_t keep[] = {0, 1, 3};
    std::vector<float> la(size_t(nt) * V), lb(la.size());
    auto same = [&](int rows) {
      return std::memcmp(la.data(), lb.data(), size_t(rows) * V * 4) == 0;
    };
    a.forward(prefix.data(), ppos.data(), np, nullptr, 1, la.data(), nullptr);
    b.forward(prefix.data(), ppos.data(), np, nullptr, 1, lb.data(), nullptr);
    assert_true(same(1));
    a.forward(tt.data(), tpos.data(), nt, mask.data(), nt, la.data(), nullptr);
    b.forward(tt.data(), tpos.data(), nt, mask.data(), nt, lb.data(), nullptr);
    assert_true(same(nt));
    a.kv_keep(np, keep, 3);
    b.kv_keep(np, keep, 3);
    const int32_t next = 9, next_pos = np + 3;
    a.forward(&next, &next_pos, 1, nullptr, 1, la.data(), nullptr);
    b.forward(&next, &next_pos, 1, nullptr, 1, lb.data(), nullptr);
    assert_true(same(1));
    a.kv_truncate(20);
    b.kv_truncate(20);
    const std::vector<int32_t> more = random_tokens(nt, V, 6), mpos = iota_pos(nt, 20);
    a.forward(more.data(), mpos.data(), nt, nullptr, nt, la.data(), nullptr);
    b.forward(more.data(), mpos.data(), nt, nullptr, nt, lb.data(), nullptr);
    assert_true(same(nt));
  }
}

// The KV cache reserves the whole context but is resident only where positions were written, and
// a cut far back hands the pages back.
void test_kv_cache_resident_as_used(void **) {
  TinyConfig c;
  c.n_ctx = 4096;
  auto A = load(c);
  Model &m = *A->model;
  assert_int_equal(m.n_ctx(), 4096);
  assert_int_equal(m.kv_resident_bytes(), 0);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  // Head-major: a region per layer, keys and values, and kv head.
  const size_t row = size_t(c.n_embd / c.n_head) * sizeof(float);
  const size_t regions = size_t(c.n_layer) * 2 * size_t(c.n_head_kv);
  auto pages_for = [&](size_t positions) { return (positions * row + page - 1) / page * page; };
  std::vector<float> lg(size_t(c.n_vocab));
  for (int n : {100, 1900}) {
    std::vector<int32_t> toks = random_tokens(n, c.n_vocab, uint32_t(n)),
                         pos = iota_pos(n, m.kv_size());
    m.forward(toks.data(), pos.data(), n, nullptr, 1, lg.data(), nullptr);
    const size_t want = regions * pages_for(size_t(m.kv_size()));
    print_message("  %d positions: %zu bytes resident, %zu expected, %zu for the whole context\n",
                  m.kv_size(), m.kv_resident_bytes(), want, regions * pages_for(4096));
    assert_int_equal(m.kv_resident_bytes(), want);
  }
  m.kv_truncate(1990);  // a draft's worth: pages kept
  assert_int_equal(m.kv_resident_bytes(), regions * pages_for(2000));
  m.kv_truncate(10);  // a new prompt: pages handed back
  assert_true(m.kv_resident_bytes() <= regions * pages_for(10) + regions * page);
  std::vector<int32_t> toks = random_tokens(5, c.n_vocab, 3), pos = iota_pos(5, 10);
  m.forward(toks.data(), pos.data(), 5, nullptr, 1, lg.data(), nullptr);
  assert_int_equal(m.kv_size(), 15);
}

// A packed output matrix's file pages were handed back when it was packed; output_rows reads rows
// from the file and hands those pages back again, so a drafter reading many rows (Medusa) leaves
// no second copy of the matrix resident.
void test_output_rows_leave_no_file_pages(void **) {
  TinyConfig c;
  c.wtype = 8;       // Q8_0: packed where the AVX-512 kernels run
  c.n_vocab = 4096;  // an output matrix of 4096 rows x 68 bytes: 68 pages
  c.tied = false;
  TinyWeights w;
  const std::vector<uint8_t> bytes = make_tiny_model(c, &w);
  char path[] = "/tmp/specinfer-output-rows-XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  close(fd);
  auto file = File::open(path);
  Model m(*file, specinfer::default_host(), 0);
  const specinfer::gguf::Weight &out = m.weights()->output;
  if (!out.packed) {
    print_message("  skipped: the output matrix is not packed on this machine\n");
  } else {
    // Pages of the file mapped into this process (smaps' Rss of its mapping; mincore would tell
    // the page cache's, not the process's).
    auto resident_pages = [&] {
      FILE *f = std::fopen("/proc/self/smaps", "r");
      assert_non_null(f);
      char line[4096];
      bool ours = false;
      size_t kib = 0;
      while (std::fgets(line, sizeof line, f)) {
        if (std::strchr(line, '-') && std::strstr(line, " ") && line[0] != ' ' &&
            std::strchr("0123456789abcdef", line[0]) && std::strstr(line, ":") &&
            !std::strstr(line, "kB"))
          ours = std::strstr(line, path) != nullptr;
        else if (ours && std::strncmp(line, "Rss:", 4) == 0)
          kib += size_t(std::atol(line + 4));
      }
      std::fclose(f);
      return kib * 1024 / size_t(sysconf(_SC_PAGESIZE));
    };
    const size_t after_load = resident_pages();
    std::vector<int32_t> ids(size_t(c.n_vocab));
    for (int32_t i = 0; i < c.n_vocab; i++) ids[size_t(i)] = i;
    std::vector<float> rows(ids.size() * size_t(c.n_embd));
    m.output_rows(ids.data(), c.n_vocab, rows.data());
    const size_t after_rows = resident_pages();
    print_message(
        "  output matrix: %zu file pages resident after loading, %zu after reading every "
        "row\n",
        after_load, after_rows);
    // Reading every row faults the matrix's 68 pages in; they go back (but for the two it shares
    // with its neighbours, and now and then a page the fault brings in around them: the bound
    // leaves room for a few, far below the 68 kept without the release).
    assert_true(after_rows <= after_load + 8);
    // The rows are the matrix's, dequantized.
    assert_true(std::fabs(rows[size_t(7) * size_t(c.n_embd) + 3]) > 0);
  }
  file.reset();
  unlink(path);
}

// A token tree after a prefix: each node's logits equal those of a chain forward of its path.
//          prefix ... -> a(0) -> b(1) -> c(3)
//                          \ -> d(2) -> e(4)
//                                  \ -> f(5)
void test_tree_mask(void **) {
  TinyConfig c;
  c.arch = "qwen2";
  auto T = load(c);
  const int np = 6, V = c.n_vocab;
  std::vector<int32_t> prefix = random_tokens(np, V, 21), ppos = iota_pos(np);
  T->model->forward(prefix.data(), ppos.data(), np, nullptr, 0, nullptr, nullptr);
  const int nt = 6;
  std::vector<int32_t> tt = {10, 11, 12, 13, 14, 15};
  std::vector<int32_t> parent = {-1, 0, 0, 1, 2, 2};
  std::vector<int32_t> depth(nt);
  std::vector<uint8_t> mask(size_t(nt) * size_t(nt), 0);
  for (int i = 0; i < nt; i++) {
    depth[size_t(i)] = parent[size_t(i)] < 0 ? 0 : depth[size_t(parent[size_t(i)])] + 1;
    for (int j = i; j >= 0; j = parent[size_t(j)]) mask[size_t(i) * nt + size_t(j)] = 1;
  }
  std::vector<int32_t> tpos(nt);
  for (int i = 0; i < nt; i++) tpos[size_t(i)] = np + depth[size_t(i)];
  std::vector<float> tl(size_t(nt) * size_t(V));
  T->model->forward(tt.data(), tpos.data(), nt, mask.data(), nt, tl.data(), nullptr);
  assert_int_equal(T->model->kv_size(), np + nt);

  double worst = 0;
  for (int i = 0; i < nt; i++) {
    std::vector<int32_t> path;
    for (int j = i; j >= 0; j = parent[size_t(j)]) path.insert(path.begin(), tt[size_t(j)]);
    std::vector<int32_t> seq = prefix;
    seq.insert(seq.end(), path.begin(), path.end());
    auto C = load(c);
    std::vector<int32_t> pos = iota_pos(int(seq.size()));
    std::vector<float> cl(static_cast<size_t>(V));
    C->model->forward(seq.data(), pos.data(), int(seq.size()), nullptr, 1, cl.data(), nullptr);
    std::vector<float> node(tl.begin() + long(i) * V, tl.begin() + long(i + 1) * V);
    worst = std::max(worst, max_abs(node, cl));
  }
  print_message("  tree vs chains: max abs diff %.3g\n", worst);
  assert_true(worst < 1e-3);

  // Accept the path a -> d -> f (nodes 0, 2, 5): kv_keep, then the next token's logits equal a
  // fresh chain's.
  const int32_t keep[] = {0, 2, 5};
  T->model->kv_keep(np, keep, 3);
  assert_int_equal(T->model->kv_size(), np + 3);
  int32_t next = 7, next_pos = np + 3;
  std::vector<float> kl(static_cast<size_t>(V)), fl(static_cast<size_t>(V));
  T->model->forward(&next, &next_pos, 1, nullptr, 1, kl.data(), nullptr);
  std::vector<int32_t> seq = prefix;
  for (int32_t k : keep) seq.push_back(tt[size_t(k)]);
  seq.push_back(next);
  auto F = load(c);
  std::vector<int32_t> pos = iota_pos(int(seq.size()));
  F->model->forward(seq.data(), pos.data(), int(seq.size()), nullptr, 1, fl.data(), nullptr);
  double d = max_abs(kl, fl);
  print_message("  kv_keep then forward vs fresh chain: %.3g\n", d);
  assert_true(d < 1e-3);
}

template <typename Fn>
void expect_throw(Fn &&fn, specinfer_status code, const char *needle) {
  try {
    fn();
  } catch (const Error &e) {
    if (e.code() != code || (needle && !std::strstr(e.what(), needle))) {
      print_error("got code %d '%s', expected %d '%s'\n", int(e.code()), e.what(), int(code),
                  needle ? needle : "");
      fail();
    }
    return;
  }
  print_error("no exception (expected '%s')\n", needle ? needle : "");
  fail();
}

void test_bad_input(void **) {
  TinyConfig c;
  c.n_ctx = 16;
  auto L = load(c);
  Model &m = *L->model;
  assert_int_equal(m.n_ctx(), 16);
  std::vector<float> lg(size_t(c.n_vocab) * 20);
  int32_t bad = c.n_vocab, neg = -1, p0 = 0;
  expect_throw([&] { m.forward(&bad, &p0, 1, nullptr, 1, lg.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, "vocabulary");
  expect_throw([&] { m.forward(&p0, &neg, 1, nullptr, 1, lg.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, "negative");
  expect_throw([&] { m.forward(&p0, &p0, 1, nullptr, 2, lg.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, "n_logits");
  expect_throw([&] { m.forward(&p0, &p0, 0, nullptr, 0, lg.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, nullptr);
  uint8_t zero_mask = 0;
  expect_throw([&] { m.forward(&p0, &p0, 1, &zero_mask, 1, lg.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, "itself");
  assert_int_equal(m.kv_size(), 0);
  std::vector<int32_t> toks = random_tokens(17, c.n_vocab, 5), pos = iota_pos(17);
  expect_throw([&] { m.forward(toks.data(), pos.data(), 17, nullptr, 1, lg.data(), nullptr); },
               SPECINFER_ERR_CONTEXT_FULL, "context");
  m.forward(toks.data(), pos.data(), 16, nullptr, 1, lg.data(), nullptr);
  assert_int_equal(m.kv_size(), 16);
  expect_throw([&] { m.forward(toks.data(), pos.data(), 1, nullptr, 1, lg.data(), nullptr); },
               SPECINFER_ERR_CONTEXT_FULL, nullptr);
  const int32_t dec[] = {2, 1}, oob[] = {0, 9};
  expect_throw([&] { m.kv_keep(10, dec, 2); }, SPECINFER_ERR_INVALID_ARGUMENT, "increasing");
  expect_throw([&] { m.kv_keep(10, oob, 2); }, SPECINFER_ERR_INVALID_ARGUMENT, "out of range");
  expect_throw([&] { m.kv_keep(17, oob, 0); }, SPECINFER_ERR_INVALID_ARGUMENT, nullptr);
  expect_throw([&] { m.kv_truncate(-1); }, SPECINFER_ERR_INVALID_ARGUMENT, nullptr);
  assert_int_equal(m.kv_size(), 16);
  m.kv_keep(10, nullptr, 0);
  assert_int_equal(m.kv_size(), 10);
}

// A q8_0 cache keeps its keys in tiles of 16 positions (specinfer_attention_args.k_tile) on a host
// that reads them: logits stay within twice the distance of keys in rows (kv_tiles=0) from f32,
// and within the tiled cache a tree node's logits equal the chain's through its path, bit for bit,
// as do the logits after kv_keep (keys moved between tiles) and after a cut and a refeed.
void test_key_tiles(void **) {
  TinyConfig c;
  c.n_embd = 128;  // head_dim 32: whole q8_0 blocks
  c.wtype = 8;     // Q8_0: logits independent of how passes split the text
  TinyWeights w;
  std::vector<uint8_t> bytes = make_tiny_model(c, &w);
  auto file = File::from_memory(bytes.data(), bytes.size());
  specinfer::gguf::ModelOptions opt, rows_opt;
  opt.kv_type = rows_opt.kv_type = SPECINFER_WTYPE_Q8_0;
  rows_opt.kv_tiles = false;
  Model t(*file, specinfer::default_host(), 0, opt),
      r(*file, specinfer::default_host(), 0, rows_opt);
  assert_true(t.weights()->kv_tiles);
  assert_false(r.weights()->kv_tiles);
  const int V = c.n_vocab, np = 45, nt = 5;
  const std::vector<int32_t> prefix = random_tokens(np, V, 8), ppos = iota_pos(np);
  const std::vector<int32_t> tt = {3, 4, 5, 6, 7}, parent = {-1, 0, 0, 1, 3};
  std::vector<uint8_t> mask(size_t(nt) * nt, 0);
  std::vector<int32_t> tpos(nt);
  for (int i = 0; i < nt; i++) {
    for (int j = i; j >= 0; j = parent[size_t(j)]) mask[size_t(i) * nt + size_t(j)] = 1;
    tpos[size_t(i)] = parent[size_t(i)] < 0 ? np : tpos[size_t(parent[size_t(i)])] + 1;
  }
  std::vector<float> lt(size_t(nt) * V), lr(lt.size());
  t.forward(prefix.data(), ppos.data(), np, nullptr, 1, lt.data(), nullptr);
  r.forward(prefix.data(), ppos.data(), np, nullptr, 1, lr.data(), nullptr);
  t.forward(tt.data(), tpos.data(), nt, mask.data(), nt, lt.data(), nullptr);
  r.forward(tt.data(), tpos.data(), nt, mask.data(), nt, lr.data(), nullptr);
  // The query's 8-bit rounding adds about as much as the keys' own (q8_0 rows against f32).
  specinfer::gguf::ModelOptions f32_opt;
  f32_opt.kv_type = SPECINFER_WTYPE_F32;
  Model x(*file, specinfer::default_host(), 0, f32_opt);
  std::vector<float> lx(lt.size());
  x.forward(prefix.data(), ppos.data(), np, nullptr, 1, lx.data(), nullptr);
  x.forward(tt.data(), tpos.data(), nt, mask.data(), nt, lx.data(), nullptr);
  print_message("  max abs logit diff from f32: tiles %.3g, rows %.3g\n", max_abs(lt, lx),
                max_abs(lr, lx));
  assert_true(max_abs(lt, lx) < 2 * max_abs(lr, lx));
  // Each node against a fresh tiled cache fed the prefix and then its path as a chain.
  for (int i = 0; i < nt; i++) {
    std::vector<int32_t> path, pos;
    for (int j = i; j >= 0; j = parent[size_t(j)]) path.insert(path.begin(), tt[size_t(j)]);
    pos = iota_pos(int(path.size()), np);
    Model f(*file, specinfer::default_host(), 0, opt);
    std::vector<float> fl(path.size() * size_t(V));
    f.forward(prefix.data(), ppos.data(), np, nullptr, 1, fl.data(), nullptr);
    f.forward(path.data(), pos.data(), int(path.size()), nullptr, int(path.size()), fl.data(),
              nullptr);
    assert_memory_equal(fl.data() + (path.size() - 1) * size_t(V), lt.data() + size_t(i) * V,
                        size_t(V) * sizeof(float));
  }
  // Keep the path 0 -> 1 -> 3 (slots 45, 46, 48: one key moves within a tile) and go on.
  const int32_t keep[] = {0, 1, 3}, next = 9, next_pos = np + 3;
  t.kv_keep(np, keep, 3);
  std::vector<float> kl(static_cast<size_t>(V)), fl(size_t(V) * 4);
  t.forward(&next, &next_pos, 1, nullptr, 1, kl.data(), nullptr);
  Model f(*file, specinfer::default_host(), 0, opt);
  const std::vector<int32_t> chain = {3, 4, 6, next}, cpos = iota_pos(4, np);
  f.forward(prefix.data(), ppos.data(), np, nullptr, 1, fl.data(), nullptr);
  f.forward(chain.data(), cpos.data(), 4, nullptr, 1, fl.data(), nullptr);
  assert_memory_equal(kl.data(), fl.data(), size_t(V) * sizeof(float));
  // A cut inside a tile, a refeed, and the same text fed to a fresh cache in the same passes.
  t.kv_truncate(20);
  Model g(*file, specinfer::default_host(), 0, opt);
  g.forward(prefix.data(), ppos.data(), 20, nullptr, 1, fl.data(), nullptr);
  const std::vector<int32_t> more = random_tokens(30, V, 6), mpos = iota_pos(30, 20);
  std::vector<float> a30(size_t(30) * V), b30(a30.size());
  t.forward(more.data(), mpos.data(), 30, nullptr, 30, a30.data(), nullptr);
  g.forward(more.data(), mpos.data(), 30, nullptr, 30, b30.data(), nullptr);
  assert_memory_equal(a30.data(), b30.data(), a30.size() * sizeof(float));
}

// Sliding-window layers hand back the keys no query can see any more: the logits stay those of a
// cache that keeps everything (swa_full), bit for bit, the resident cache stays near a window per
// sliding-window layer, a cut within Model::kSwaRollback positions of the latest pass keeps what it
// asks and one further back keeps nothing, a pass that would need handed-back keys is refused,
// and a host without SPECINFER_HOST_SHORT_TRUNCATE gets the whole cache.
void test_sliding_window_release(void **) {
  TinyConfig c = tiny_gemma3();
  c.n_embd = 256;  // head_dim 64: a row of f32 keys is 256 bytes
  c.wtype = 8;     // Q8_0: logits independent of how passes split the text (F32 uses OpenBLAS)
  c.swa = 64;
  c.n_ctx = 4096;
  TinyWeights w;
  std::vector<uint8_t> bytes = make_tiny_model(c, &w);
  auto file = File::from_memory(bytes.data(), bytes.size());
  specinfer::gguf::ModelOptions opt, full_opt;
  opt.kv_type = full_opt.kv_type = SPECINFER_WTYPE_F32;
  full_opt.swa_full = true;
  Model a(*file, specinfer::default_host(), 0, opt),
      b(*file, specinfer::default_host(), 0, full_opt);
  assert_true(a.weights()->swa_release);
  assert_false(b.weights()->swa_release);
  specinfer_host old_host = *specinfer::default_host();
  old_host.struct_size = offsetof(specinfer_host, features);
  assert_false(Model(*file, &old_host, 0, opt).weights()->swa_release);

  // Passes of 200: each hands back the keys no query at kSwaRollback before it can see (200 rows
  // of 256 bytes are past the 32 KiB step).
  const int V = c.n_vocab, chunk = 200, n = 1600, R = Model::kSwaRollback;
  const std::vector<int32_t> toks = random_tokens(n, V, 7);
  std::vector<float> la(size_t(chunk) * V), lb(la.size());
  auto feed = [&](Model &m, int from, int count, float *out) {
    const std::vector<int32_t> pos = iota_pos(count, from);
    m.forward(toks.data() + from, pos.data(), count, nullptr, count, out, nullptr);
  };
  auto same = [&](int rows) {
    return std::memcmp(la.data(), lb.data(), size_t(rows) * V * sizeof(float)) == 0;
  };
  for (int at = 0; at < n; at += chunk) {
    feed(a, at, chunk, la.data());
    feed(b, at, chunk, lb.data());
    assert_true(same(chunk));
  }
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), row = 64 * sizeof(float);
  auto pages_for = [&](size_t positions) { return (positions * row + page - 1) / page * page; };
  // One global layer of six (keys and values) holds every position; the windowed ones at most
  // window + rollback + a pass, and a page more.
  const size_t whole = 2 * pages_for(n), window = 2 * (pages_for(size_t(c.swa + R + chunk)) + page);
  print_message("  resident after %d positions: %zu bytes (swa_full: %zu; bound %zu)\n", n,
                a.kv_resident_bytes(), b.kv_resident_bytes(), whole + 5 * window);
  assert_int_equal(b.kv_resident_bytes(), 6 * whole);
  assert_true(a.kv_resident_bytes() <= whole + 5 * window);

  // A rewind to kSwaRollback before the latest pass's first position keeps what it asks and gives
  // the same logits.
  const int back = n - chunk - R;
  a.kv_truncate(back);
  b.kv_truncate(back);
  assert_int_equal(a.kv_size(), back);
  feed(a, back, 50, la.data());
  feed(b, back, 50, lb.data());
  assert_true(same(50));
  // A pass at a position that would see handed-back keys is refused; nothing changes.
  const int32_t tok = 1, early = back - 1;
  expect_throw([&] { a.forward(&tok, &early, 1, nullptr, 1, la.data(), nullptr); },
               SPECINFER_ERR_INVALID_ARGUMENT, "swa_full");
  assert_int_equal(a.kv_size(), back + 50);
  // One position further back keeps nothing; the text fed again gives the full cache's logits.
  a.kv_truncate(back - 1);
  b.kv_truncate(back - 1);
  assert_int_equal(a.kv_size(), 0);
  assert_int_equal(b.kv_size(), back - 1);
  std::vector<float> scratch(size_t(back - 1) * V);
  const std::vector<int32_t> pos = iota_pos(back - 1);
  a.forward(toks.data(), pos.data(), back - 1, nullptr, 1, scratch.data(), nullptr);
  feed(a, back - 1, chunk, la.data());
  feed(b, back - 1, chunk, lb.data());
  assert_true(same(chunk));

  // Keys in q8_0 tiles hand back whole tiles only, with the same logits as swa_full.
  opt.kv_type = full_opt.kv_type = SPECINFER_WTYPE_Q8_0;
  Model ta(*file, specinfer::default_host(), 0, opt),
      tb(*file, specinfer::default_host(), 0, full_opt);
  assert_true(ta.weights()->kv_tiles && ta.weights()->swa_release);
  for (int at = 0; at < n; at += chunk) {
    feed(ta, at, chunk, la.data());
    feed(tb, at, chunk, lb.data());
    assert_true(same(chunk));
  }
  print_message("  q8_0 tiles: resident %zu bytes (swa_full: %zu)\n", ta.kv_resident_bytes(),
                tb.kv_resident_bytes());
  assert_true(ta.kv_resident_bytes() < tb.kv_resident_bytes());
  ta.kv_truncate(back);
  tb.kv_truncate(back);
  assert_int_equal(ta.kv_size(), back);
  feed(ta, back, chunk, la.data());
  feed(tb, back, chunk, lb.data());
  assert_true(same(chunk));
}

// Files that are valid GGUF but not a usable model.
void test_bad_models(void **) {
  const specinfer_host *host = specinfer::default_host();
  auto try_model = [&](Writer &w, specinfer_status code, const char *needle) {
    std::vector<uint8_t> b = w.build();
    auto f = File::from_memory(b.data(), b.size());
    expect_throw([&] { Model m(*f, host, 0); }, code, needle);
  };
  TinyConfig c;
  Writer w;
  make_tiny_model(c, nullptr, &w);
  {
    Writer x = w;
    x.kv_str("general.architecture", "mamba");  // duplicate key: refused by the reader
    std::vector<uint8_t> b = x.build();
    bool threw = false;
    try {
      File::from_memory(b.data(), b.size());
    } catch (const Error &) {
      threw = true;
    }
    assert_true(threw);
  }
  {
    c.arch = "gpt-neox";
    Writer x;
    make_tiny_model(c, nullptr, &x);
    try_model(x, SPECINFER_ERR_UNSUPPORTED, "gpt-neox");
    c.arch = "qwen2";
  }
  {  // a missing tensor and a misshapen one
    Writer x;
    x.kv_str("general.architecture", "qwen2");
    x.kv_u32("qwen2.embedding_length", 64);
    x.kv_u32("qwen2.block_count", 1);
    x.kv_u32("qwen2.feed_forward_length", 64);
    x.kv_u32("qwen2.attention.head_count", 4);
    Writer y = x;
    try_model(x, SPECINFER_ERR_FORMAT, "token_embd.weight");
    std::vector<float> e(64 * 10, 0.0f), n(64, 1.0f);
    y.tensor_f32("token_embd.weight", {64, 10}, e);
    y.tensor_f32("output_norm.weight", {64}, n);
    y.tensor_f32("blk.0.attn_norm.weight", {64}, n);
    y.tensor_f32("blk.0.ffn_norm.weight", {64}, n);
    y.tensor_f32("blk.0.attn_q.weight", {64, 10}, e);
    try_model(y, SPECINFER_ERR_FORMAT, "blk.0.attn_q.weight");
    Writer z = x;
    z.kv_u32("qwen2.attention.head_count_kv", 3);
    try_model(z, SPECINFER_ERR_FORMAT, "head_count_kv");
  }
  {  // RoPE scaling the plugin does not know, or out of range
    TinyConfig r;
    r.rope_scaling = "longrope";
    r.rope_factor = 4.0f;
    Writer x;
    make_tiny_model(r, nullptr, &x);
    try_model(x, SPECINFER_ERR_UNSUPPORTED, "longrope");
    r.rope_scaling = "linear";
    r.rope_factor = 0.5f;
    Writer y;
    make_tiny_model(r, nullptr, &y);
    try_model(y, SPECINFER_ERR_FORMAT, "factor 0.5");
    TinyConfig f;
    f.rope_freq_factors = {1.0f, 2.0f};  // not one per pair
    Writer z;
    make_tiny_model(f, nullptr, &z);
    try_model(z, SPECINFER_ERR_FORMAT, "rope_freqs.weight");
    f.rope_freq_factors.assign(size_t(f.head_dim() / 2), 1.0f);
    f.rope_freq_factors[3] = -1.0f;
    Writer u;
    make_tiny_model(f, nullptr, &u);
    try_model(u, SPECINFER_ERR_FORMAT, "positive");
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_f32),
      cmocka_unit_test(test_reference_f16),
      cmocka_unit_test(test_reference_q8_0),
      cmocka_unit_test(test_reference_qwen3_gemma3),
      cmocka_unit_test(test_rope_scaling),
      cmocka_unit_test(test_batched_equals_single),
      cmocka_unit_test(test_truncate_refeed),
      cmocka_unit_test(test_tree_mask),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_cache_layouts),
      cmocka_unit_test(test_kv_cache_resident_as_used),
      cmocka_unit_test(test_key_tiles),
      cmocka_unit_test(test_sliding_window_release),
      cmocka_unit_test(test_output_rows_leave_no_file_pages),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_bad_models),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
