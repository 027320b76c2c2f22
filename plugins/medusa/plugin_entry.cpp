// The medusa plugin: a drafter built from Medusa heads (heads.h) on the target's last hidden state,
// which the session hands over with every draft request; it never runs the target.
//
//  - Create: loads the heads file, refuses one trained for another target (CONFIG, naming both),
//    fetches the target's output rows U for the heads' truncated vocabulary, and prepares the
//    heads' matrices for the host's kernels: the K matrices W_k stacked into one (K x hidden) x
//    hidden matrix (every head reads the same h, so one matmul computes them all) and U, both
//    Q8_0 by default. A round reads each once, so drafting is memory-bound and the compact type is
//    what makes it cheap (wtype=f16 / f32 for comparison). Drafters of one heads file, weight
//    type and heads count on one target model (the same output rows) share these matrices.
//  - Propose: y_k = h + silu(W_k x + b_k), logits_k = U y_k, x as heads.h says: heads with no or
//    one token input read the same x (one matmul over the K heads); heads with two read the path
//    they extend, so head k runs after head k - 1 on the path of the first candidates, stopping
//    once that path's estimate is too small to reach a tree, and the tree hangs level k's
//    candidates under that path only (TreeSpec::path_levels). From each head's top_k
//    candidates, a sparse token tree (tree.h): best-first by the estimated probability that a
//    path is accepted, its size chosen for the most expected tokens per unit of time against the
//    session's measured pass costs. Point masses (has_probs = 0),
//    so any coupler stays exact.
//  - Value of a candidate (value=...): `acc`, the heads file's held-out accuracy by rank (the
//    share of positions, with the parent path on the target's greedy path, where head k's rank-r
//    candidate was the target's token: the conditional probability a tree needs); `prob`, the
//    head's own softmax probability; `mix` (default), their geometric mean, which keeps the
//    per-rank calibration of acc and the per-round confidence of prob. With adapt=1 (default) the
//    estimates are rescaled online, per depth and bin of the head's probability, by what the
//    target accepted of such nodes in recent rounds (the file's accuracy is measured on its own
//    held-out text, which may be unlike the session's).
//  - lookup=1: prompt lookup (the ngram plugin's context index) proposes a chain continuing the
//    context, and one continuing the context followed by each of head 0's best lookup_branches
//    candidates; they are merged into the same tree (following head candidates where the tokens
//    agree). Where the context has no match, n-gram counts over the drafter's earlier sequences
//    (dynamic=1, as the ngram plugin's dynamic cache) continue a chain, and where they have none
//    either, a static corpus (static=FILE, common/corpus.h). Each chain token is valued by the
//    recent acceptance of tokens from the same source (a match of that many tokens, the counts,
//    the corpus) and place (first of its chain, or a continuation): longer matches are right
//    more often.
//  - Without a hidden state (an older host, or a round that has none) it proposes only the lookup
//    chain, or nothing.
//
// config: path=<heads file> (required), nodes=<1..64> (16: most nodes per tree; the session's
// max_draft caps it too), top_k=<1..16> (4: candidates per head), heads=<1..K> (all: heads used),
// value=acc|prob|mix (mix), adapt=0|1 (1), wtype=q8_0|f16|f32 (q8_0), lookup=0|1 (0),
// lookup_n_min=<1..16> (2), lookup_n_max=<1..16> (8), lookup_max=<1..64> (16: chain length),
// lookup_branches=<0..31> (4), dynamic=0|1 (1), static=<text file> (none; with lookup=1),
// draft_cost=<0..2> (measured: the drafter's time per round in one-token passes of the target; a
// value replaces the measurement), node_cost=<0..2> (measured: a value c makes a pass over n nodes
// cost 1 + c n one-token passes, for studying tree sizes).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "../common/corpus.h"
#include "../common/drafter_plugin.h"
#include "../common/ngram_index.h"
#include "../common/plugin_config.h"
#include "../common/plugin_error.h"
#include "../common/shared_cache.h"
#include "../common/token_tree.h"
#include "../common/tree_draft.h"
#include "f16.h"
#include "heads.h"
#include "specinfer_plugin.h"
#include "train.h"

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;
using specinfer_plugin::fail;
using specinfer_plugin::Failure;
using specinfer_plugin::guarded;
using specinfer_plugin::SharedCache;

namespace {

enum class Value { acc, prob, mix };

// Memory from the host's aligned allocator.
struct HostBuffer {
  const specinfer_host *host = nullptr;
  void *ptr = nullptr;
  HostBuffer() = default;
  HostBuffer(const HostBuffer &) = delete;
  HostBuffer &operator=(const HostBuffer &) = delete;
  ~HostBuffer() {
    if (ptr) host->free(ptr);
  }
  void allocate(const specinfer_host *h, size_t bytes) {
    host = h;
    ptr = h->alloc(bytes ? bytes : 1, 64);
    if (!ptr) throw std::bad_alloc();
  }
  uint8_t *bytes() const { return static_cast<uint8_t *>(ptr); }
  void release() {
    if (ptr) host->free(ptr);
    ptr = nullptr;
  }
};

template <typename T>
constexpr bool covers(uint32_t struct_size, size_t offset) {
  return struct_size >= offset + sizeof(T);
}

// A matrix of n_rows x n_cols in the chosen type, ready for the host's matmul (packed when the
// host packs).
class Matrix {
 public:
  ~Matrix() {
    if (packed_) kernels_->free_packed(packed_);
  }

  // Takes the rows through `row(i, float *dst)`, converting each to wtype.
  template <typename RowFn>
  void build(const specinfer_host *host, int32_t wtype, int64_t n_rows, int64_t n_cols,
             RowFn &&row) {
    kernels_ = host->kernels;
    wtype_ = wtype;
    rows_ = n_rows;
    cols_ = n_cols;
    const size_t rb = kernels_->row_size(wtype, n_cols);
    if (rb == 0)
      fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the host cannot store %lld-value rows",
           static_cast<long long>(n_cols));
    data_.allocate(host, rb * static_cast<size_t>(n_rows));
    std::vector<float> tmp(static_cast<size_t>(n_cols));
    for (int64_t i = 0; i < n_rows; ++i) {
      row(i, tmp.data());
      uint8_t *dst = data_.bytes() + rb * static_cast<size_t>(i);
      if (wtype == SPECINFER_WTYPE_F32) {
        std::memcpy(dst, tmp.data(), rb);
      } else if (wtype == SPECINFER_WTYPE_F16) {
        auto *h = reinterpret_cast<uint16_t *>(dst);
        for (int64_t c = 0; c < n_cols; ++c) h[c] = medusa::f32_to_f16(tmp[static_cast<size_t>(c)]);
      } else {
        const specinfer_status rc = kernels_->quantize_row(wtype, tmp.data(), dst, n_cols);
        if (rc != SPECINFER_OK)
          fail(rc, "medusa: quantizing a weight row failed (status %d)", static_cast<int>(rc));
      }
    }
    if (covers<void *>(kernels_->struct_size, offsetof(specinfer_kernels, free_packed)) &&
        kernels_->pack_weight && kernels_->matmul_packed && kernels_->free_packed) {
      const specinfer_status rc = kernels_->pack_weight(wtype, data_.ptr, n_rows, n_cols, &packed_);
      if (rc != SPECINFER_OK) packed_ = nullptr;  // the plain kernels still work
    }
    // A packed copy replaces the rows: keep one of the two.
    if (packed_ &&
        covers<void *>(kernels_->struct_size, offsetof(specinfer_kernels, packed_bytes)) &&
        kernels_->packed_bytes && kernels_->packed_bytes(packed_) > 0)
      data_.release();
  }

  // y[t][r] for t < n_tok.
  void apply(const float *x, int64_t n_tok, float *y) const {
    const specinfer_status rc =
        packed_ ? kernels_->matmul_packed(packed_, x, n_tok, y)
                : kernels_->matmul(wtype_, data_.ptr, rows_, cols_, x, n_tok, y);
    if (rc != SPECINFER_OK)
      fail(rc, "medusa: the host's matmul failed (status %d)", static_cast<int>(rc));
  }

 private:
  const specinfer_kernels *kernels_ = nullptr;
  int32_t wtype_ = 0;
  int64_t rows_ = 0, cols_ = 0;
  HostBuffer data_;
  specinfer_packed_weight *packed_ = nullptr;
};

// The heads' matrices, prepared for the host's kernels. Immutable once built: drafters of one
// heads file on one target model (every slot of a server, say) share one copy (prepared_cache).
struct Prepared {
  Matrix w;                                     // [K * H][D] (token_inputs < 2)
  std::vector<std::unique_ptr<Matrix>> head_w;  // K x [H][D] (token_inputs = 2: one at a time)
  Matrix u;                                     // [V][H]
};

// Prepared matrices by what determines them: the host, the heads file (path, size, time), the
// weight type, the heads used and the target's fingerprint (its output rows).
SharedCache<Prepared> &prepared_cache() {
  // Destroyed when the plugin is unloaded, which the registry allows only once no drafter of it is
  // open; the cache holds weak references, so a drafter alive at process exit is unaffected.
  static SharedCache<Prepared> cache;
  return cache;
}

// A decayed rate: hits / trials over recent rounds, pulled toward a prior while little is seen.
struct Rate {
  double hits = 0, trials = 0;
  void add(bool hit) {
    hits += hit ? 1.0 : 0.0;
    trials += 1.0;
  }
  void decay(double f) {
    hits *= f;
    trials *= f;
  }
  double get(double prior, double weight) const {
    return (hits + prior * weight) / (trials + weight);
  }
};

constexpr int32_t kMaxDepth = 64;  // deepest node (heads or lookup chain)
// Cells of the chain tokens' acceptance rates: by where the token came from (a match of k tokens
// in the context, k = 1..16, the n-gram counts of earlier sequences, or the static corpus) and
// whether it is the first lookup token of its chain (its parent a committed token or a head's
// candidate).
constexpr int32_t kSources = 19, kFromCounts = 17, kFromStatic = 18;
int32_t chain_cell(int32_t source, bool first) {
  return source * 2 + (first ? 0 : 1);
}
// Per round: what was seen about the last 50 rounds ago counts half as much as what is seen
// now. Decaying every cell each round (not only those observed) lets a cell whose estimates fell
// so low that its nodes are no longer drafted drift back to its prior, and be tried again.
constexpr double kDecay = 0.986;
constexpr double kPriorWeight = 8;
// The n-gram counts over earlier sequences: patterns of at least this many tokens, followers seen
// at least this often (as the ngram plugin's dynamic cache).
constexpr int kCountsNMin = 2;
constexpr uint32_t kCountsMinCount = 2;
// Cells of the online rescaling: bins of a head's own probability for its candidate.
constexpr int32_t kBins = 8;
constexpr float kBinEdges[kBins] = {0.0f, 0.03f, 0.07f, 0.15f, 0.3f, 0.5f, 0.7f, 0.9f};
constexpr double kScalePrior = 2.0;  // expected hits of pseudo-observations
// Heads that read the path stop going deeper once the path's estimate falls below this: a node
// that unlikely never pays for its place in a tree.
constexpr float kPathFloor = 0.02f;

struct Drafter {
  const specinfer_host *host = nullptr;
  medusa::Heads heads;
  specinfer_host_target target{};      // the session's, for the token input's output rows
  int32_t H = 0, D = 0, K = 0, V = 0;  // hidden size, head input, heads used, vocabulary
  std::shared_ptr<const Prepared> prep;
  int32_t max_nodes = 16, top_k = 4;
  Value value = Value::mix;
  bool adapt = true;
  bool lookup = false;
  int32_t lookup_n_min = 2, lookup_n_max = 8, lookup_max = 16;
  int32_t lookup_branches = 4;  // head 0's candidates whose lookup continuation joins the tree

  // Scratch.
  std::vector<float> x, z, y, logits;  // [D], [K*H], [K][H], [K][V]
  std::vector<int32_t> top;            // [top_k]
  token_tree::TreeSpec spec;
  token_tree::Tree tree;
  std::vector<token_tree::TreeQueueEntry> queue;
  specinfer_ngram::ContextIndex index;
  std::vector<int32_t> tail;

  // Learning from what the target accepted: the previous tree and the context it was made for.
  token_tree::Tree pending;
  std::vector<float> pending_est;     // the heads' estimate of each node (before adaptation)
  std::vector<int32_t> pending_cell;  // its cell (below), -1 for lookup-only nodes
  size_t pending_n = 0;
  int32_t pending_last = -1;
  // Per cell (depth, bin of the head's probability): how many of the nodes tried there (their
  // parent accepted) the target accepted, in expectation (the sum of their estimates) and in
  // fact. The ratio rescales the estimates of that cell.
  std::vector<double> cell_expected, cell_hits;
  // Per candidate of spec.levels: its estimate before the rescaling, and its cell.
  std::vector<std::vector<float>> level_est;
  std::vector<std::vector<int32_t>> level_cell;
  // Per cell (chain_cell): chain tokens accepted given parent accepted.
  std::vector<Rate> chain_rate;
  // The cell of each token of spec.chains (-1: a head's candidate), and of the pending tree's.
  std::vector<std::vector<int32_t>> chain_cells, pending_cells;
  // N-gram counts over the earlier sequences (dynamic=1), consulted where the context has no
  // match.
  bool use_counts = true;
  specinfer_ngram::CountTable counts;
  // static=: a corpus, consulted where neither the context nor the counts know a continuation.
  std::shared_ptr<const specinfer_ngram::CorpusIndex> corpus;

  // Draft cost in one-token passes: the drafter's own time against the round's.
  token_tree::DraftClock clock;
  double fixed_draft_cost = -1;  // config draft_cost: >= 0 replaces the measurement
  double node_cost = -1;         // config node_cost: >= 0 replaces the session's pass costs
  std::vector<float> fixed_pass_cost;

  explicit Drafter(const specinfer_host *h) : host(h) {}

  static int32_t prob_bin(float p) {
    int32_t b = 0;
    while (b + 1 < kBins && p >= kBinEdges[b + 1]) ++b;
    return b;
  }

  float cell_scale(int32_t cell) const {
    if (!adapt || cell < 0) return 1.0f;
    const double e = cell_expected[static_cast<size_t>(cell)],
                 a = cell_hits[static_cast<size_t>(cell)];
    // The prior: pseudo-observations in which the estimates were right.
    const double s = (a + kScalePrior) / (e + kScalePrior);
    return static_cast<float>(std::clamp(s, 0.2, 5.0));
  }

  // Compares the previous tree with the tokens committed after it.
  void learn(const int32_t *ctx, size_t n) {
    if (pending.tokens.empty() || n <= pending_n || ctx[pending_n - 1] != pending_last) {
      pending.tokens.clear();
      return;
    }
    for (double &x : cell_expected) x *= kDecay;
    for (double &x : cell_hits) x *= kDecay;
    for (Rate &r : chain_rate) r.decay(kDecay);
    const int32_t *got = ctx + pending_n;
    const size_t m = n - pending_n;
    int32_t cur = -1;
    for (size_t depth = 0; depth < m; ++depth) {
      int32_t next = -1;
      for (size_t j = 0; j < pending.tokens.size(); ++j) {
        if (pending.parents[j] != cur) continue;
        const bool hit = pending.tokens[j] == got[depth];
        if (hit) next = static_cast<int32_t>(j);
        const token_tree::NodeOrigin &o = pending.origins[j];
        const int32_t c = pending_cell[j];
        if (c >= 0) {
          cell_expected[static_cast<size_t>(c)] =
              cell_expected[static_cast<size_t>(c)] + pending_est[j];
          cell_hits[static_cast<size_t>(c)] = cell_hits[static_cast<size_t>(c)] + (hit ? 1.0 : 0.0);
        }
        // A chain's own estimates (a branch's first token is the head's candidate).
        if (o.chain >= 0) {
          const std::vector<int32_t> &cells = pending_cells[static_cast<size_t>(o.chain)];
          const int32_t c = cells[static_cast<size_t>(o.depth - 1)];
          if (c >= 0) chain_rate[static_cast<size_t>(c)].add(hit);
        }
      }
      if (next < 0) break;
      cur = next;
    }
    pending.tokens.clear();
  }

  // The head's estimate for a candidate of rank r with softmax probability prob at depth d.
  float estimate(int32_t depth, int32_t rank, float prob) const {
    const float acc = rank < medusa::kRanks
                          ? heads.accuracy[static_cast<size_t>(depth - 1) * medusa::kRanks + rank]
                          : 0.0f;
    switch (value) {
      case Value::acc:
        return acc;
      case Value::prob:
        return prob;
      case Value::mix:
        break;
    }
    return std::sqrt(acc * prob);
  }

  // dst = e(token), the token input (heads.h).
  void token_input(int32_t token, float *dst) const {
    specinfer_plugin_error e{};
    const specinfer_status rc = target.vtable->output_rows(target.self, &token, 1, dst, &e);
    if (rc != SPECINFER_OK)
      throw Failure(rc, std::string("medusa: the target's output_rows failed: ") + e.message);
    medusa::token_row(dst, H);
  }

  // y_k = h + silu(z_k + b_k) for head k.
  void residual(const float *h, int32_t k) {
    const float *zk = z.data() + static_cast<size_t>(k) * H;
    const float *bk = heads.b.data() + static_cast<size_t>(k) * H;
    float *yk = y.data() + static_cast<size_t>(k) * H;
    for (int32_t i = 0; i < H; ++i) {
      const float a = zk[i] + bk[i];
      yk[i] = h[i] + a / (1.0f + std::exp(-a));
    }
  }

  // spec.levels[k] from head k's logits: its top_k candidates (in rank order) with their
  // estimates. Returns the first candidate's estimate (0 when there is none).
  float fill_level(int32_t k, int32_t vocab_size) {
    float *row = logits.data() + static_cast<size_t>(k) * V;
    host->kernels->softmax(row, V);
    // top_k by a small insertion sort: almost every value fails the first comparison.
    int32_t n = 0;
    for (int32_t i = 0; i < V; ++i) {
      if (n == top_k && row[i] <= row[top[static_cast<size_t>(n - 1)]]) continue;
      int32_t j = n < top_k ? n++ : n - 1;
      while (j > 0 && row[top[static_cast<size_t>(j - 1)]] < row[i]) {
        top[static_cast<size_t>(j)] = top[static_cast<size_t>(j - 1)];
        --j;
      }
      top[static_cast<size_t>(j)] = i;
    }
    std::vector<token_tree::Candidate> &level = spec.levels[static_cast<size_t>(k)];
    std::vector<float> &est = level_est[static_cast<size_t>(k)];
    std::vector<int32_t> &cell = level_cell[static_cast<size_t>(k)];
    level.clear();
    est.clear();
    cell.clear();
    for (int32_t r = 0; r < n; ++r) {
      const int32_t i = top[static_cast<size_t>(r)];
      const int32_t tok = heads.vocab[static_cast<size_t>(i)];
      if (tok >= vocab_size) continue;
      const float e = estimate(k + 1, r, row[i]);
      const int32_t c = k * kBins + prob_bin(row[i]);
      level.push_back({tok, e * cell_scale(c)});
      est.push_back(e);
      cell.push_back(c);
    }
    return level.empty() ? 0.0f : level[0].p;
  }

  // Fills spec.levels from the hidden state h at the context's last token but one (whose logits
  // chose the last, ctx[n - 1]; n >= 2).
  void run_heads(const float *h, const int32_t *ctx, size_t n, int32_t vocab_size) {
    std::copy(h, h + H, x.data());
    spec.levels.resize(static_cast<size_t>(K));
    spec.path_levels = heads.token_inputs == 2;
    if (heads.token_inputs < 2) {
      // Every head reads the same x: one matmul for all of them.
      if (heads.token_inputs == 1) token_input(ctx[n - 1], x.data() + H);
      prep->w.apply(x.data(), 1, z.data());
      for (int32_t k = 0; k < K; ++k) residual(h, k);
      prep->u.apply(y.data(), K, logits.data());
      for (int32_t k = 0; k < K; ++k) fill_level(k, vocab_size);
      return;
    }
    // Heads that read the path: head k extends the path of the levels' first candidates, so they
    // run one after another, until that path is too unlikely to reach the tree.
    // x = [h, e(prev), e(cur)]; each step's e(cur) becomes the next one's e(prev).
    float *e_prev = x.data() + H, *e_cur = x.data() + 2 * static_cast<size_t>(H);
    token_input(ctx[n - 2], e_prev);
    token_input(ctx[n - 1], e_cur);
    float path = 1.0f;
    for (int32_t k = 0; k < K; ++k) {
      if (k > 0) {
        std::copy(e_cur, e_cur + H, e_prev);
        token_input(spec.levels[static_cast<size_t>(k - 1)][0].token, e_cur);
      }
      prep->head_w[static_cast<size_t>(k)]->apply(x.data(), 1,
                                                  z.data() + static_cast<size_t>(k) * H);
      residual(h, k);
      prep->u.apply(y.data() + static_cast<size_t>(k) * H, 1,
                    logits.data() + static_cast<size_t>(k) * V);
      path *= fill_level(k, vocab_size);
      if (spec.levels[static_cast<size_t>(k)].empty() || path < kPathFloor) {
        for (int32_t j = k + 1; j < K; ++j) spec.levels[static_cast<size_t>(j)].clear();
        break;
      }
    }
  }

  // The token prompt lookup predicts after `t` (the end of the context, then drafted tokens) and
  // its source (a match length, kFromCounts or kFromStatic); -1 when there is none.
  int32_t lookup_next(const std::vector<int32_t> &t, int32_t &source) const {
    const int avail = static_cast<int>(t.size());
    for (int k = std::min(lookup_n_max, avail); k >= lookup_n_min; --k) {
      const ptrdiff_t p = index.find(t.data() + t.size() - k, k);
      if (p >= 0) {
        source = k;
        return index.tokens()[static_cast<size_t>(p)];
      }
    }
    using specinfer_ngram::longest_follower;
    const int32_t *end = t.data() + t.size();
    if (use_counts && !counts.empty()) {
      const int32_t tok =
          longest_follower(counts, end, avail, kCountsNMin, lookup_n_max, kCountsMinCount, 0.5);
      if (tok >= 0) {
        source = kFromCounts;
        return tok;
      }
    }
    if (corpus) {
      const int32_t tok =
          longest_follower(*corpus, end, avail, kCountsNMin, lookup_n_max, kCountsMinCount, 0.5);
      if (tok >= 0) {
        source = kFromStatic;
        return tok;
      }
    }
    return -1;
  }

  // Extends `chain` (whose tokens follow the context, the last of them also at the end of `t`)
  // with lookup's continuation up to `want` tokens, each valued by the recent acceptance of its
  // cell.
  void continue_chain(std::vector<int32_t> &t, int32_t want, int32_t vocab_size,
                      std::vector<token_tree::Candidate> &chain, std::vector<int32_t> &cells) {
    bool first = true;
    while (static_cast<int32_t>(chain.size()) < want) {
      int32_t source = 0;
      const int32_t tok = lookup_next(t, source);
      if (tok < 0 || tok >= vocab_size) break;
      const int32_t cell = chain_cell(source, first);
      // Before any evidence: the first token of a chain is right about half the time, a
      // continuation (its parent was right) more often.
      const double prior = first ? 0.5 : 0.8;
      chain.push_back({tok, static_cast<float>(
                                chain_rate[static_cast<size_t>(cell)].get(prior, kPriorWeight))});
      cells.push_back(cell);
      t.push_back(tok);
      first = false;
    }
  }

  // Fills spec.chains: prompt lookup's continuation of the context, and (branches) of the
  // context followed by each of head 0's best candidates.
  void run_lookup(const int32_t *ctx, size_t n, int32_t want, int32_t vocab_size) {
    index.sync(ctx, n);
    const size_t keep = std::min<size_t>(n, static_cast<size_t>(lookup_n_max));
    spec.chains.clear();
    chain_cells.clear();
    tail.assign(ctx + n - keep, ctx + n);
    std::vector<token_tree::Candidate> chain;
    std::vector<int32_t> cells;
    continue_chain(tail, want, vocab_size, chain, cells);
    if (!chain.empty()) {
      spec.chains.push_back(chain);
      chain_cells.push_back(cells);
    }
    if (spec.levels.empty()) return;
    const std::vector<token_tree::Candidate> &first = spec.levels[0];
    for (size_t r = 0; r < first.size() && static_cast<int32_t>(r) < lookup_branches; ++r) {
      tail.assign(ctx + n - keep, ctx + n);
      tail.push_back(first[r].token);
      chain.assign(1, {first[r].token, 0.0f});  // valued as the head's candidate
      cells.assign(1, -1);
      continue_chain(tail, want, vocab_size, chain, cells);
      if (chain.size() < 2) continue;
      spec.chains.push_back(chain);
      chain_cells.push_back(cells);
    }
  }

  void propose(const specinfer_draft_request &req, specinfer_draft &out) {
    clock.start();
    out.n_nodes = 0;
    out.has_probs = 0;
    if (req.n_context == 0) return;
    learn(req.context, req.n_context);

    const int32_t want = std::min({req.max_tokens, out.cap, max_nodes});
    if (want <= 0 || out.vocab_size <= 0) return;
    const uint32_t size = req.struct_size;
    const bool has_hidden =
        covers<int64_t>(size, offsetof(specinfer_draft_request, hidden_position)) &&
        req.hidden != nullptr && req.n_context >= 2 &&
        req.hidden_position == static_cast<int64_t>(req.n_context) - 2;
    if (has_hidden && req.hidden_size != H)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "medusa: the request's hidden state has %d values, the heads read %d", req.hidden_size,
           H);
    spec.levels.clear();
    spec.chains.clear();
    if (has_hidden) run_heads(req.hidden, req.context, req.n_context, out.vocab_size);
    if (lookup) run_lookup(req.context, req.n_context, std::min(want, lookup_max), out.vocab_size);
    if (spec.levels.empty() && spec.chains.empty()) return;

    spec.max_nodes = want;
    spec.allow_tree = req.allow_tree != 0;
    token_tree::take_pass_cost(req, spec);
    if (node_cost >= 0) {  // the configured cost per node instead of the session's
      fixed_pass_cost.resize(static_cast<size_t>(want) + 1);
      for (int32_t i = 0; i <= want; ++i)
        fixed_pass_cost[static_cast<size_t>(i)] = 1.0f + static_cast<float>(node_cost) * i;
      spec.pass_cost = fixed_pass_cost.data();
      spec.n_pass_cost = want + 1;
    }
    spec.draft_cost = fixed_draft_cost >= 0 ? static_cast<float>(fixed_draft_cost) : clock.cost();
    token_tree::build_tree(spec, tree, queue);

    const int32_t n = static_cast<int32_t>(tree.tokens.size());
    token_tree::write_draft(tree, out);

    // What to learn from once the target has spoken: each head node's estimate before the
    // adaptive scale (the scale is what is being learned).
    pending = tree;
    pending_cells = chain_cells;
    pending_est.assign(static_cast<size_t>(n), 0.0f);
    pending_cell.assign(static_cast<size_t>(n), -1);
    for (int32_t j = 0; j < n; ++j) {
      const token_tree::NodeOrigin &o = tree.origins[static_cast<size_t>(j)];
      if (o.rank < 0) continue;
      const size_t d = static_cast<size_t>(o.depth - 1), r = static_cast<size_t>(o.rank);
      pending_est[static_cast<size_t>(j)] = level_est[d][r];
      pending_cell[static_cast<size_t>(j)] = level_cell[d][r];
    }
    pending_n = req.n_context;
    pending_last = req.context[req.n_context - 1];

    clock.drafted(n > 0 ? token_tree::pass_cost(spec, n) : 0.0, has_hidden);
  }
};

void d_destroy(void *self) {
  delete static_cast<Drafter *>(self);
}

void check_tokens(const int32_t *t, size_t n) {
  if (!t && n) fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: NULL tokens");
  for (size_t i = 0; i < n; ++i)
    if (t[i] < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: negative token id %d", t[i]);
}

specinfer_status d_begin(void *self, const int32_t *context, size_t n,
                         specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "medusa", [&] {
    check_tokens(context, n);
    d->pending.tokens.clear();
    d->clock.forget();
    if (d->lookup) {
      // The sequence that ends here feeds the counts.
      const std::vector<int32_t> &prev = d->index.tokens();
      if (d->use_counts && prev.size() > 1)
        d->counts.add(prev.data(), prev.size(), kCountsNMin, d->lookup_n_max);
      d->index.clear();
      d->index.append(context, n);
    }
  });
}

specinfer_status d_commit(void *self, const int32_t *tokens, size_t n,
                          specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "medusa", [&] {
    check_tokens(tokens, n);
    if (d->lookup) d->index.append(tokens, n);
  });
}

specinfer_status d_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "medusa", [&] {
    if (!req || !out || (!req->context && req->n_context) || !out->tokens || !out->parents)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: malformed draft request");
    d->propose(*req, *out);
  });
}

const specinfer_drafter_vtable kVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, nullptr};

// Fetches U, the target's output rows for the heads' vocabulary, a chunk at a time.
void load_output_rows(Drafter &d, Prepared &p, const specinfer_host_target &target, int32_t wtype) {
  const int32_t chunk = 256;
  std::vector<float> rows;
  int32_t first = -1;  // the chunk in `rows`
  p.u.build(d.host, wtype, d.V, d.H, [&](int64_t i, float *dst) {
    const int32_t c = static_cast<int32_t>(i / chunk) * chunk;
    if (c != first) {
      const int32_t n = std::min(chunk, d.V - c);
      rows.resize(static_cast<size_t>(n) * d.H);
      specinfer_plugin_error e{};
      const specinfer_status rc =
          target.vtable->output_rows(target.self, d.heads.vocab.data() + c, n, rows.data(), &e);
      if (rc != SPECINFER_OK)
        throw Failure(rc, std::string("medusa: the target's output_rows failed: ") + e.message);
      first = c;
    }
    std::memcpy(dst, rows.data() + static_cast<size_t>(i - first) * d.H,
                sizeof(float) * static_cast<size_t>(d.H));
  });
}

// The drafter's options from its config; returns the weight type of the prepared matrices.
int32_t read_options(Drafter &d, const Config &cfg) {
  d.max_nodes = static_cast<int32_t>(cfg.get_int("nodes", 16, 1, 64));
  d.top_k = static_cast<int32_t>(cfg.get_int("top_k", 4, 1, 16));
  d.value = cfg.get_choice<Value>(
      "value", Value::mix, {{"acc", Value::acc}, {"prob", Value::prob}, {"mix", Value::mix}});
  d.adapt = cfg.get_int("adapt", 1, 0, 1) != 0;
  const int32_t wtype = cfg.get_choice<int32_t>(
      "wtype", SPECINFER_WTYPE_Q8_0,
      {{"q8_0", SPECINFER_WTYPE_Q8_0}, {"f16", SPECINFER_WTYPE_F16}, {"f32", SPECINFER_WTYPE_F32}});
  d.lookup = cfg.get_int("lookup", 0, 0, 1) != 0;
  d.lookup_n_min = static_cast<int32_t>(cfg.get_int("lookup_n_min", 2, 1, 16));
  d.lookup_n_max = static_cast<int32_t>(cfg.get_int("lookup_n_max", 8, 1, 16));
  d.lookup_max = static_cast<int32_t>(cfg.get_int("lookup_max", 16, 1, kMaxDepth));
  d.use_counts = cfg.get_int("dynamic", 1, 0, 1) != 0;
  d.lookup_branches =
      static_cast<int32_t>(cfg.get_int("lookup_branches", 4, 0, token_tree::kMaxChains - 1));
  if (d.lookup_n_min > d.lookup_n_max)
    throw ConfigError("medusa: lookup_n_min must not exceed lookup_n_max");
  d.fixed_draft_cost = cfg.get_float("draft_cost", -1.0, -1.0, 2.0);
  d.node_cost = cfg.get_float("node_cost", -1.0, -1.0, 2.0);
  return wtype;
}

// What the heads need of the host (kernels) and of the session's target (its output rows).
void check_host(const specinfer_host *host, const specinfer_model_info *target_info,
                const specinfer_host_target *target, int32_t wtype) {
  const specinfer_kernels *k = host->kernels;
  if (!k || !covers<void *>(k->struct_size, offsetof(specinfer_kernels, isa)) || !k->matmul ||
      !k->softmax || !k->row_size)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the host has no matmul or softmax kernels");
  if (wtype == SPECINFER_WTYPE_Q8_0 &&
      !(covers<void *>(k->struct_size, offsetof(specinfer_kernels, quantize_row)) &&
        k->quantize_row))
    fail(SPECINFER_ERR_UNSUPPORTED,
         "medusa: the host cannot quantize to Q8_0 (an older host): use wtype=f16");
  if (!target_info || !target || !target->vtable)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the heads need the session's target");
  const specinfer_target_vtable *tv = target->vtable;
  if (!covers<void *>(tv->struct_size, offsetof(specinfer_target_vtable, output_rows)) ||
      !tv->output_rows)
    fail(SPECINFER_ERR_UNSUPPORTED,
         "medusa: the target (%s) cannot hand out its output rows (output_rows), which Medusa "
         "heads need",
         target_info->name ? target_info->name : "?");
}

specinfer_status drafter_create(const specinfer_host *host, const char *config,
                                const specinfer_model_info *target_info,
                                const specinfer_host_target *target, void **self,
                                const specinfer_drafter_vtable **vtable,
                                specinfer_plugin_error *err) {
  return guarded(err, "medusa", [&] {
    if (!host || !self || !vtable) fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: NULL argument");
    Config cfg(config, {"path", "nodes", "top_k", "heads", "value", "adapt", "wtype", "lookup",
                        "lookup_n_min", "lookup_n_max", "lookup_max", "lookup_branches", "dynamic",
                        "draft_cost", "node_cost", "static"});
    if (!cfg.has("path") || cfg.get("path", "").empty())
      throw ConfigError("medusa: path=<heads file> is required");
    const std::string path = cfg.get("path", "");
    auto d = std::make_unique<Drafter>(host);
    const int32_t wtype = read_options(*d, cfg);
    check_host(host, target_info, target, wtype);

    d->heads = medusa::load_heads(path);
    const medusa::TargetIdentity identity = medusa::identify_target(*target_info, *target);
    medusa::check_identity(d->heads, identity, path);
    d->target = *target;
    d->H = d->heads.hidden_size;
    d->D = d->heads.input_size();
    d->K = static_cast<int32_t>(cfg.get_int("heads", d->heads.n_heads, 1, d->heads.n_heads));
    d->V = d->heads.n_vocab();
    if (d->H % 32 != 0 && wtype == SPECINFER_WTYPE_Q8_0)
      fail(SPECINFER_ERR_UNSUPPORTED,
           "medusa: hidden size %d is not a multiple of 32, which Q8_0 needs: use wtype=f16", d->H);
    // Without a measured accuracy (an untrained or unevaluated file), the heads' own
    // probabilities are the only estimate.
    bool evaluated = false;
    for (float a : d->heads.accuracy) evaluated = evaluated || a > 0.0f;
    if (!evaluated) d->value = Value::prob;

    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      fail(SPECINFER_ERR_IO, "medusa: cannot stat '%s'", path.c_str());
    const std::string key = std::to_string(reinterpret_cast<uintptr_t>(host)) + '|' + path + '|' +
                            std::to_string(st.st_size) + '|' + std::to_string(st.st_mtim.tv_sec) +
                            '.' + std::to_string(st.st_mtim.tv_nsec) + '|' + std::to_string(wtype) +
                            '|' + std::to_string(d->K) + '|' + std::to_string(identity.fingerprint);
    d->prep = prepared_cache().get(key, [&] {
      auto prep = std::make_shared<Prepared>();
      auto rows_from = [&](int64_t first) {
        return [&, first](int64_t i, float *dst) {
          std::memcpy(dst, d->heads.w.data() + static_cast<size_t>(first + i) * d->D,
                      sizeof(float) * static_cast<size_t>(d->D));
        };
      };
      if (d->heads.token_inputs < 2) {
        prep->w.build(host, wtype, static_cast<int64_t>(d->K) * d->H, d->D, rows_from(0));
      } else {
        for (int32_t k = 0; k < d->K; ++k) {
          prep->head_w.push_back(std::make_unique<Matrix>());
          prep->head_w.back()->build(host, wtype, d->H, d->D,
                                     rows_from(static_cast<int64_t>(k) * d->H));
        }
      }
      load_output_rows(*d, *prep, *target, wtype);
      return prep;
    });
    // The float weights are in the prepared matrices.
    d->heads.w.clear();
    d->heads.w.shrink_to_fit();

    d->x.resize(static_cast<size_t>(d->D));
    d->z.resize(static_cast<size_t>(d->K) * d->H);
    d->y.resize(static_cast<size_t>(d->K) * d->H);
    d->logits.resize(static_cast<size_t>(d->K) * d->V);
    d->top.resize(static_cast<size_t>(d->top_k));
    d->cell_expected.assign(static_cast<size_t>(d->K) * kBins, 0.0);
    d->cell_hits.assign(static_cast<size_t>(d->K) * kBins, 0.0);
    d->level_est.resize(static_cast<size_t>(d->K));
    d->level_cell.resize(static_cast<size_t>(d->K));
    d->chain_rate.assign(static_cast<size_t>(chain_cell(kSources, true)), Rate{});
    d->index.configure(d->lookup_n_max);
    if (cfg.has("static")) {
      if (!d->lookup) throw ConfigError("medusa: static=... is a source of lookup=1");
      d->corpus = specinfer_ngram::shared_corpus(cfg.get("static", ""), target_info, target,
                                                 d->lookup_n_max + 1, "medusa");
    }
    *self = d.release();
    *vtable = &kVtable;
  });
}

constexpr specinfer_drafter_factory kFactory = [] {
  specinfer_drafter_factory f = specinfer_plugin::drafter_factory(drafter_create);
  f.train = medusa_train;  // train.h: heads learned from the target's own predictions
  return f;
}();

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry =
    specinfer_plugin::drafter_plugin_descriptor<kFactory>(
        "medusa", "1.0",
        "Medusa heads on the target's hidden state, drafting a sparse token tree; optional prompt "
        "lookup merged in");
