// The medusa drafter: tree construction (white-box, tree.h) and the plugin end to end on the real
// Qwen2.5-Coder 0.5B (skipped with a message when absent; SPECINFER_MODELS overrides the
// directory).
//  - Trees: topological order, distinct siblings, the node budget, values the products of the
//    estimates along each path, best-first optimality against brute force on a small universe,
//    the size chosen for the most tokens per unit of time, chains when trees are not allowed, and
//    the lookup chain merged into the head candidates.
//  - Plugin: heads files written here with save_heads (W = 0 and b = 0, where every head guesses
//    the target's own distribution at the hidden state's position, and small random heads, with
//    no, one and two token inputs). The
//    greedy text equals plain decoding token for token on several prompts, with and without
//    lookup=1; the session really verified trees (more than one node per round, rounds whose draft
//    is not a chain; counted by a wrapper drafter around the plugin's own factory); heads made for
//    another model, a missing or truncated file and an unknown config key are refused with a
//    status and a message. A static corpus holding the prompts' continuations (static=, with
//    lookup=1) keeps the text exact and gets more drafted tokens accepted.
// With SPECINFER_SANITIZED=1 (ASan/UBSan builds) fewer prompts and tokens.
#include <dlfcn.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "api/handles.h"
#include "heads.h"
#include "specinfer.h"
#include "specinfer_plugin.h"
#include "token_tree.h"

#include "support/cmocka_setup.h"
#include "support/models.h"
#include "support/real_sessions.h"
#include "support/resident.h"
#include "support/same_tokens.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Trees
// ---------------------------------------------------------------------------------------------

// Checks the structural promises of a tree and that each value is the product of the estimates
// along its path (recomputed from the spec).
void check_tree(const token_tree::TreeSpec &spec, const token_tree::Tree &t) {
  const size_t n = t.tokens.size();
  assert_int_equal(t.parents.size(), n);
  assert_int_equal(t.values.size(), n);
  assert_int_equal(t.origins.size(), n);
  assert_true(static_cast<int32_t>(n) <= spec.max_nodes);
  double sum = 0;
  for (size_t j = 0; j < n; ++j) {
    const int32_t p = t.parents[j];
    assert_true(p >= -1 && p < static_cast<int32_t>(j));
    const int32_t depth = p < 0 ? 1 : t.origins[static_cast<size_t>(p)].depth + 1;
    assert_int_equal(t.origins[j].depth, depth);
    if (!spec.allow_tree) assert_int_equal(p, static_cast<int32_t>(j) - 1);
    for (size_t i = 0; i < j; ++i)  // siblings are distinct tokens
      if (t.parents[i] == p) assert_int_not_equal(t.tokens[i], t.tokens[j]);
    // The estimate of this token at this depth: the largest of the head's (the first of
    // repeated candidates) and those of the chains whose path leads here.
    std::vector<int32_t> path;
    for (int32_t i = static_cast<int32_t>(j); i >= 0; i = t.parents[static_cast<size_t>(i)])
      path.insert(path.begin(), t.tokens[static_cast<size_t>(i)]);
    double est = 0;
    const size_t d = static_cast<size_t>(depth - 1);
    // With path_levels, a level's candidates hang only under the path of the levels' first ones.
    bool level_here = d < spec.levels.size();
    for (size_t i = 0; i < d && level_here && spec.path_levels; ++i)
      level_here = !spec.levels[i].empty() && path[i] == spec.levels[i][0].token;
    if (level_here)
      for (const auto &c : spec.levels[d])
        if (c.token == t.tokens[j]) {
          est = c.p;
          break;
        }
    int32_t first_chain = -1;
    for (size_t c = 0; c < spec.chains.size(); ++c) {
      const auto &ch = spec.chains[c];
      if (ch.size() < path.size()) continue;
      bool on = true;
      for (size_t i = 0; i < path.size() && on; ++i) on = ch[i].token == path[i];
      if (!on) continue;
      est = std::max<double>(est, ch[d].p);
      if (first_chain < 0) first_chain = static_cast<int32_t>(c);
    }
    assert_int_equal(t.origins[j].chain, first_chain);
    const double parent_value = p < 0 ? 1.0 : t.values[static_cast<size_t>(p)];
    assert_true(std::fabs(t.values[j] - parent_value * est) < 1e-6);
    if (j > 0) assert_true(t.values[j] <= t.values[j - 1] + 1e-7f);  // best-first order
    sum += t.values[j];
  }
  assert_true(std::fabs(t.expected_tokens - (1 + sum)) < 1e-5);
}

token_tree::TreeSpec random_spec(std::mt19937 &rng, int n_levels, int k, int n_chains) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> tok(0, 30);  // a small range: repeats happen
  token_tree::TreeSpec s;
  s.levels.resize(static_cast<size_t>(n_levels));
  for (auto &level : s.levels)
    for (int r = 0; r < k; ++r) level.push_back({tok(rng), u(rng)});
  // Chains of up to 8 tokens, some starting with a head's candidate valued 0 (as the drafter's
  // branches do) or sharing a prefix with an earlier chain.
  for (int c = 0; c < n_chains; ++c) {
    std::vector<token_tree::Candidate> ch;
    if (c > 0 && rng() % 2) {
      const size_t shared = std::min<size_t>(rng() % 3, s.chains[0].size());
      ch.assign(s.chains[0].begin(), s.chains[0].begin() + static_cast<ptrdiff_t>(shared));
    }
    if (ch.empty() && !s.levels.empty() && rng() % 2) ch.push_back({s.levels[0][0].token, 0.0f});
    const int len = 1 + static_cast<int>(rng() % 8);
    while (static_cast<int>(ch.size()) < len) ch.push_back({tok(rng), u(rng)});
    s.chains.push_back(ch);
  }
  return s;
}

void test_tree_structure(void **) {
  std::mt19937 rng(7);
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  for (int iter = 0; iter < 500; ++iter) {
    token_tree::TreeSpec s = random_spec(rng, 1 + iter % 5, 1 + iter % 7, iter % 6);
    s.max_nodes = 1 + iter % 20;
    s.allow_tree = iter % 4 != 0;
    std::vector<float> cost(static_cast<size_t>(s.max_nodes) + 1);
    for (size_t i = 0; i < cost.size(); ++i) cost[i] = 1.0f + 0.01f * (iter % 6) * i;
    if (iter % 3) {
      s.pass_cost = cost.data();
      s.n_pass_cost = static_cast<int32_t>(cost.size());
    }
    token_tree::build_tree(s, t, q);
    check_tree(s, t);
  }
}

// All nodes of the universe a spec describes (without lookup), by path: value and parent.
struct UNode {
  int32_t parent;
  double value;
};

void test_tree_best_first_is_optimal(void **) {
  // Two levels of three candidates: 3 + 9 nodes. For every size n, the best total value over all
  // subsets closed under parents must equal the tree's (flat pass cost: every n is kept).
  token_tree::TreeSpec s;
  s.levels = {{{10, 0.5f}, {11, 0.3f}, {12, 0.15f}}, {{20, 0.9f}, {21, 0.05f}, {22, 0.6f}}};
  std::vector<UNode> u;
  for (int a = 0; a < 3; ++a) u.push_back({-1, s.levels[0][static_cast<size_t>(a)].p});
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b)
      u.push_back(
          {a, s.levels[0][static_cast<size_t>(a)].p * s.levels[1][static_cast<size_t>(b)].p});
  std::vector<float> flat(20, 1.0f);
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  for (int n = 1; n <= 12; ++n) {
    double best = 0;
    for (uint32_t mask = 0; mask < (1u << 12); ++mask) {
      if (__builtin_popcount(mask) != n) continue;
      bool closed = true;
      double sum = 0;
      for (int i = 0; i < 12 && closed; ++i)
        if (mask >> i & 1) {
          if (u[static_cast<size_t>(i)].parent >= 0 &&
              !(mask >> u[static_cast<size_t>(i)].parent & 1))
            closed = false;
          sum += u[static_cast<size_t>(i)].value;
        }
      if (closed) best = std::max(best, sum);
    }
    s.max_nodes = n;
    s.pass_cost = flat.data();
    s.n_pass_cost = static_cast<int32_t>(flat.size());
    token_tree::build_tree(s, t, q);
    check_tree(s, t);
    assert_int_equal(t.tokens.size(), static_cast<size_t>(n));
    assert_true(std::fabs(t.expected_tokens - 1 - best) < 1e-6);
  }
  // The first nodes: 10 (0.5), 10->20 (0.45), 11 (0.3), 10->22 (0.3), 11->20 (0.27).
  s.max_nodes = 5;
  token_tree::build_tree(s, t, q);
  const std::vector<int32_t> tokens = {10, 20, 11, 22, 20}, parents = {-1, 0, -1, 0, 2};
  assert_true(t.tokens == tokens);
  assert_true(t.parents == parents);
}

void test_tree_size_follows_cost(void **) {
  token_tree::TreeSpec s;
  s.levels = {{{1, 0.8f}, {2, 0.1f}}, {{3, 0.7f}, {4, 0.1f}}, {{5, 0.6f}}};
  s.max_nodes = 16;
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  // Free passes: every node with a positive value is worth verifying.
  std::vector<float> flat(17, 1.0f);
  s.pass_cost = flat.data();
  s.n_pass_cost = 17;
  token_tree::build_tree(s, t, q);
  assert_int_equal(t.tokens.size(), 2u + 2u * 2u + 4u * 1u);  // the whole universe
  // A steep cost: the chosen size must give the best rate of all prefixes, and be small.
  std::vector<float> steep(17);
  for (size_t i = 0; i < steep.size(); ++i) steep[i] = 1.0f + 0.3f * i;
  s.pass_cost = steep.data();
  s.draft_cost = 0.1f;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  const double rate = t.expected_tokens / t.cost;
  assert_true(std::fabs(t.cost - (double(s.draft_cost) + steep[t.tokens.size()])) < 1e-6);
  s.max_nodes = 16;
  token_tree::Tree all;
  s.pass_cost = flat.data();
  token_tree::build_tree(s, all, q);  // the same order, all nodes
  double sum = 0;
  for (size_t n = 0; n <= all.values.size(); ++n) {
    if (n > 0) sum += all.values[n - 1];
    assert_true((1 + sum) / (double(s.draft_cost) + steep[n]) <= rate + 1e-9);
  }
  assert_true(t.tokens.size() >= 2 && t.tokens.size() <= 4);
  // Nothing worth a pass: no nodes.
  std::vector<float> huge(17, 1.0f);
  for (size_t i = 1; i < huge.size(); ++i) huge[i] = 10.0f;
  s.pass_cost = huge.data();
  token_tree::build_tree(s, t, q);
  assert_int_equal(t.tokens.size(), 0u);
  // Without measured costs the default gentle growth applies, and beyond the measured sizes
  // the last step continues.
  s.pass_cost = nullptr;
  s.n_pass_cost = 0;
  assert_true(std::fabs(token_tree::pass_cost(s, 4) - (1 + 4 * token_tree::kDefaultPassStep)) <
              1e-6);
  const float some[3] = {1.0f, 1.5f, 1.75f};
  s.pass_cost = some;
  s.n_pass_cost = 3;
  assert_true(std::fabs(token_tree::pass_cost(s, 5) - 2.5) < 1e-6);
}

// Heads that read the path: deeper levels only under the first candidates' path.
void test_tree_path_levels(void **) {
  token_tree::TreeSpec s;
  s.levels = {{{1, 0.6f}, {2, 0.5f}}, {{3, 0.9f}, {4, 0.8f}}, {{5, 0.9f}}};
  s.max_nodes = 16;
  s.pass_cost = nullptr;
  s.path_levels = true;
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  s.draft_cost = 0;
  // Free passes (a flat cost): every node that may be drafted is.
  const std::vector<float> flat(17, 1.0f);
  s.pass_cost = flat.data();
  s.n_pass_cost = 17;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  // 1 -> {3 -> 5, 4} and 2 alone: 2 gets no children, nor does 4.
  assert_int_equal(t.tokens.size(), 5);
  for (size_t j = 0; j < t.tokens.size(); ++j) {
    const int32_t p = t.parents[j];
    if (p >= 0) {
      const int32_t pt = t.tokens[static_cast<size_t>(p)];
      assert_true(pt == 1 || pt == 3);
    }
  }
  // Without path_levels the same spec hangs every level under every node.
  s.path_levels = false;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  assert_true(t.tokens.size() > 5);
  // Random specs, with chains: the structural checks hold.
  std::mt19937 rng(11);
  for (int it = 0; it < 200; ++it) {
    token_tree::TreeSpec r = random_spec(rng, 1 + static_cast<int>(rng() % 4), 1 + rng() % 4,
                                         static_cast<int>(rng() % 4));
    r.path_levels = true;
    r.max_nodes = 1 + static_cast<int32_t>(rng() % 16);
    token_tree::build_tree(r, t, q);
    check_tree(r, t);
  }
}

void test_tree_chain_mode(void **) {
  token_tree::TreeSpec s;
  s.levels = {{{1, 0.5f}, {2, 0.45f}}, {{3, 0.9f}, {4, 0.8f}}, {{5, 0.7f}}};
  s.max_nodes = 8;
  s.allow_tree = false;
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  const std::vector<int32_t> tokens = {1, 3, 5};
  assert_true(t.tokens == tokens);
}

void test_tree_merges_lookup(void **) {
  token_tree::TreeSpec s;
  s.levels = {{{1, 0.5f}, {2, 0.3f}}, {{3, 0.4f}, {4, 0.2f}}};
  // Lookup: 1 (agrees with the head), then 9 (new), then 7 (deeper than the heads).
  s.chains = {{{1, 0.7f}, {9, 0.8f}, {7, 0.9f}}};
  s.max_nodes = 64;
  std::vector<float> flat(65, 1.0f);
  s.pass_cost = flat.data();
  s.n_pass_cost = 65;
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  // Root children: 1 (one node for head and lookup, value 0.7) and 2.
  int n_root = 0, one = -1;
  for (size_t j = 0; j < t.tokens.size(); ++j)
    if (t.parents[j] == -1) {
      ++n_root;
      if (t.tokens[j] == 1) one = static_cast<int>(j);
    }
  assert_int_equal(n_root, 2);
  assert_int_equal(one, 0);
  assert_true(std::fabs(t.values[0] - 0.7f) < 1e-6);
  assert_true(t.origins[0].chain == 0 && t.origins[0].rank == 0);
  // Under 1: the heads' 3 and 4 and lookup's 9 (0.56); under 1 -> 9: 7 (0.504), and the heads
  // have no third level. Under 2: only 3 and 4 (the chain follows 1).
  std::set<int32_t> under_one, under_nine, under_two;
  for (size_t j = 0; j < t.tokens.size(); ++j) {
    const int32_t p = t.parents[j];
    if (p < 0) continue;
    const int32_t pt = t.tokens[static_cast<size_t>(p)];
    if (pt == 1) under_one.insert(t.tokens[j]);
    if (pt == 9) under_nine.insert(t.tokens[j]);
    if (pt == 2) under_two.insert(t.tokens[j]);
  }
  assert_true((under_one == std::set<int32_t>{3, 4, 9}));
  assert_true((under_nine == std::set<int32_t>{7}));
  assert_true((under_two == std::set<int32_t>{3, 4}));
  assert_int_equal(t.tokens.size(), 2u + 3u + 1u + 2u);
}

void test_tree_branch_chains(void **) {
  // Two chains after head candidates (valued 0 there: the head's estimate counts) and one that
  // shares their first token and parts ways after it.
  token_tree::TreeSpec s;
  s.levels = {{{1, 0.6f}, {2, 0.3f}}};
  s.chains = {{{1, 0.0f}, {5, 0.9f}, {6, 0.9f}},
              {{2, 0.0f}, {5, 0.5f}},
              {{1, 0.2f}, {5, 0.7f}, {8, 0.4f}},
              {{3, 0.0f}, {4, 0.9f}}};  // no head proposes 3: never drafted
  s.max_nodes = 64;
  std::vector<float> flat(65, 1.0f);
  s.pass_cost = flat.data();
  s.n_pass_cost = 65;
  token_tree::Tree t;
  std::vector<token_tree::TreeQueueEntry> q;
  token_tree::build_tree(s, t, q);
  check_tree(s, t);
  // 1 (0.6), 1->5 (0.54, chains 0 and 2), 1->5->6 (0.486), 1->5->8 (0.216), 2 (0.3),
  // 2->5 (0.15).
  const std::vector<int32_t> tokens = {1, 5, 6, 2, 8, 5}, parents = {-1, 0, 1, -1, 1, 3};
  assert_true(t.tokens == tokens);
  assert_true(t.parents == parents);
  assert_int_equal(t.origins[1].chain, 0);
  assert_int_equal(t.origins[4].chain, 2);
  assert_int_equal(t.origins[5].chain, 1);
}

// ---------------------------------------------------------------------------------------------
// The plugin on the real 0.5B
// ---------------------------------------------------------------------------------------------

std::string g_model, g_dir;  // model path, a scratch directory for heads files
bool g_sanitized = false;
int g_tokens = 32;

// The end-to-end prompts and one more whose function body the heads continue.
const char *const kPrompts[] = {
    kCodePrompts[0],
    kCodePrompts[1],
    kCodePrompts[2],
    "import numpy as np\n\ndef normalize(v):\n    \"\"\"Scale v to unit length.\"\"\"\n",
};

// The heads' truncated vocabulary: token ids below this.
constexpr int32_t kHeadsVocab = 16384;

// What the wrapper drafter saw of the medusa drafter's drafts.
struct Seen {
  int proposals = 0, with_hidden = 0, drafts = 0, trees = 0, invalid = 0;
  // Drafts whose last context token lies in the heads' vocabulary, and those whose first node
  // (the best candidate of head 0) is that token.
  int last_in_vocab = 0, first_is_last = 0;
  long nodes = 0;
} g_seen;

// The medusa plugin's own factory (the module the registry loads, opened here too).
const specinfer_drafter_factory *g_medusa = nullptr;

struct Wrapped {
  void *self;
  const specinfer_drafter_vtable *vt;
};

Wrapped *g_last_wrapped = nullptr;  // the drafter made last, for direct calls

void w_destroy(void *self) {
  auto *w = static_cast<Wrapped *>(self);
  w->vt->destroy(w->self);
  delete w;
}
specinfer_status w_begin(void *self, const int32_t *c, size_t n, specinfer_plugin_error *e) {
  auto *w = static_cast<Wrapped *>(self);
  return w->vt->begin(w->self, c, n, e);
}
specinfer_status w_commit(void *self, const int32_t *c, size_t n, specinfer_plugin_error *e) {
  auto *w = static_cast<Wrapped *>(self);
  return w->vt->commit(w->self, c, n, e);
}
specinfer_status w_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *e) {
  auto *w = static_cast<Wrapped *>(self);
  // Tree sizes follow the pass costs; the session's are measured times, which vary with the
  // machine's load (and ASan): a fixed, gently growing curve keeps the drafts the same every run.
  specinfer_draft_request fixed = *req;
  std::vector<float> cost(static_cast<size_t>(req->n_pass_cost));
  for (size_t i = 0; i < cost.size(); ++i) cost[i] = 1.0f + 0.03f * static_cast<float>(i);
  fixed.pass_cost = cost.data();
  const specinfer_status rc = w->vt->propose(w->self, &fixed, out, e);
  if (rc != SPECINFER_OK) return rc;
  ++g_seen.proposals;
  if (req->hidden) ++g_seen.with_hidden;
  const int32_t n = out->n_nodes;
  if (n < 0 || n > req->max_tokens || n > out->cap || out->has_probs != 0) ++g_seen.invalid;
  if (n <= 0) return rc;
  ++g_seen.drafts;
  g_seen.nodes += n;
  const int32_t last = req->context[req->n_context - 1];
  if (last < kHeadsVocab) {
    ++g_seen.last_in_vocab;
    if (out->tokens[0] == last) ++g_seen.first_is_last;
  }
  bool chain = true;
  for (int32_t j = 0; j < n; ++j) {
    const int32_t p = out->parents[j];
    if (p < -1 || p >= j || out->tokens[j] < 0 || out->tokens[j] >= out->vocab_size)
      ++g_seen.invalid;
    if (p != j - 1) chain = false;
    for (int32_t i = 0; i < j; ++i)
      if (out->parents[i] == p && out->tokens[i] == out->tokens[j]) ++g_seen.invalid;
  }
  if (!chain) ++g_seen.trees;
  return rc;
}
const specinfer_drafter_vtable kWrappedVt = {
    sizeof(specinfer_drafter_vtable), w_destroy, w_begin, w_propose, w_commit, nullptr};

specinfer_status w_create(const specinfer_host *host, const char *config,
                          const specinfer_model_info *info, const specinfer_host_target *target,
                          void **self, const specinfer_drafter_vtable **vt,
                          specinfer_plugin_error *err) {
  auto *w = new Wrapped{};
  const specinfer_status rc = g_medusa->create(host, config, info, target, &w->self, &w->vt, err);
  if (rc != SPECINFER_OK) {
    delete w;
    return rc;
  }
  *self = w;
  *vt = &kWrappedVt;
  g_last_wrapped = w;
  return SPECINFER_OK;
}
const specinfer_drafter_factory kWrappedFactory = {sizeof(specinfer_drafter_factory), w_create,
                                                   nullptr};
const void *w_get_factory(const char *id) {
  return id && !std::strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) ? &kWrappedFactory : nullptr;
}
const specinfer_plugin_descriptor kWrappedPlugin = {SPECINFER_PLUGIN_ABI_VERSION,
                                                    sizeof(specinfer_plugin_descriptor),
                                                    "medusa-counted",
                                                    "1",
                                                    "counts the medusa drafter's drafts",
                                                    nullptr,
                                                    nullptr,
                                                    w_get_factory};

struct Env {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  medusa::TargetIdentity id;
  int32_t hidden = 0;
  std::string zero, random, random_token, random_path, other;  // heads files
};

medusa::Heads make_heads(const Env &e, int32_t n_heads, float w_scale, uint32_t seed,
                         int32_t token_inputs = 0) {
  medusa::Heads h;
  h.target = e.id;
  h.n_heads = n_heads;
  h.hidden_size = e.hidden;
  h.token_inputs = token_inputs;
  for (int32_t t = 0; t < kHeadsVocab && t < e.id.vocab_size; ++t) h.vocab.push_back(t);
  const size_t H = static_cast<size_t>(e.hidden), K = static_cast<size_t>(n_heads);
  h.w.assign(K * H * static_cast<size_t>(h.input_size()), 0.0f);
  h.b.assign(K * H, 0.0f);
  if (w_scale > 0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, w_scale / std::sqrt(static_cast<float>(H)));
    for (float &x : h.w) x = nd(rng);
    for (float &x : h.b) x = 0.1f * nd(rng);
  }
  // Held-out accuracy by rank, high enough that trees of several nodes pay.
  h.accuracy.assign(K * medusa::kRanks, 0.0f);
  for (size_t k = 0; k < K; ++k)
    for (int r = 0; r < medusa::kRanks; ++r)
      h.accuracy[k * medusa::kRanks + static_cast<size_t>(r)] =
          0.8f * std::pow(0.5f, static_cast<float>(r)) * std::pow(0.9f, static_cast<float>(k));
  h.trained_tokens = 0;
  return h;
}

int setup(void **state) {
  if (g_model.empty()) return 0;
  const char *plugins = std::getenv("SPECINFER_PLUGIN_PATH");
  const std::string so = std::string(plugins ? plugins : ".") + "/specinfer-medusa.so";
  void *dl = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    std::fprintf(stderr, "cannot open %s: %s\n", so.c_str(), dlerror());
    return -1;
  }
  auto *desc =
      static_cast<const specinfer_plugin_descriptor *>(dlsym(dl, "specinfer_plugin_entry"));
  if (!desc) return -1;
  g_medusa = static_cast<const specinfer_drafter_factory *>(
      desc->get_factory(SPECINFER_DRAFTER_FACTORY_ID));
  if (!g_medusa) return -1;

  auto *e = new Env;
  RealTarget rt;
  if (!rt.open(g_model, &kWrappedPlugin)) return -1;
  e->reg = rt.reg;
  e->target = rt.target;
  const specinfer_model_info &info = e->target->info();
  e->hidden = info.hidden_size;
  specinfer_host_target ht{e->target->self(), e->target->vtable(), nullptr};
  e->id = medusa::identify_target(info, ht);
  char tmpl[] = "/tmp/specinfer-medusa-test-XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  g_dir = tmpl;
  e->zero = g_dir + "/zero.gguf";
  e->random = g_dir + "/random.gguf";
  e->other = g_dir + "/other.gguf";
  e->random_token = g_dir + "/random-token.gguf";
  // The zero heads read the token input too: W = 0 must still leave h alone.
  e->random_path = g_dir + "/random-path.gguf";
  medusa::save_heads(make_heads(*e, 3, 0.0f, 0, 1), e->zero);
  medusa::save_heads(make_heads(*e, 4, 0.5f, 1), e->random);
  medusa::save_heads(make_heads(*e, 2, 0.5f, 2, 1), e->random_token);
  medusa::save_heads(make_heads(*e, 3, 0.5f, 3, 2), e->random_path);
  medusa::Heads other = make_heads(*e, 2, 0.0f, 0);
  other.target.name = "some-other-model";
  other.target.fingerprint ^= 0x5a5a;
  medusa::save_heads(other, e->other);
  *state = e;
  return 0;
}

int teardown(void **state) {
  auto *e = static_cast<Env *>(*state);
  if (!e) return 0;
  specinfer_target_destroy(e->target);
  specinfer_registry_destroy(e->reg);
  for (const std::string &f :
       {e->zero, e->random, e->random_token, e->random_path, e->other, g_dir + "/truncated.gguf"})
    std::remove(f.c_str());
  rmdir(g_dir.c_str());
  delete e;
  return 0;
}

void skip_without_model(void **state) {
  if (!*state) {
    std::fprintf(stderr,
                 "SKIP: qwen2.5-coder-0.5b.gguf not found in %s (run scripts/fetch-models)\n",
                 models_dir());
    skip();
  }
}

specinfer_drafter *open_drafter(Env *e, const char *plugin, const std::string &cfg) {
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  const specinfer_status rc =
      specinfer_drafter_open(e->reg, plugin, cfg.c_str(), e->target, &d, &err);
  if (rc != SPECINFER_OK)
    std::fprintf(stderr, "drafter %s:%s: %s\n", plugin, cfg.c_str(), err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  return d;
}

std::vector<int32_t> run(Env *e, specinfer_drafter *d, const char *prompt, int n,
                         specinfer_session_stats *st, bool adaptive = true) {
  RunParams rp;
  rp.max_draft = 16;
  rp.adaptive = adaptive;
  return run_session(e->target, d, prompt, n, rp, st);
}

void test_greedy_equals_plain(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  // Fixed estimates (the file's accuracy, no adaptation) make trees certain to be drafted; the
  // defaults adapt them to what the target accepts.
  const std::vector<std::string> configs = {
      "path=" + e->zero + ",value=acc,adapt=0,draft_cost=0.02",
      "path=" + e->zero,
      "path=" + e->random + ",top_k=3,nodes=12",
      "path=" + e->zero + ",lookup=1",
      "path=" + e->random + ",lookup=1,value=acc,adapt=0,draft_cost=0.02",
      "path=" + e->random_token + ",value=acc,adapt=0,draft_cost=0.02",
      "path=" + e->random_path + ",value=acc,adapt=0,draft_cost=0.02"};
  const size_t n_prompts = g_sanitized ? 1 : sizeof kPrompts / sizeof *kPrompts;
  std::vector<std::vector<int32_t>> plain;
  for (size_t pi = 0; pi < n_prompts; ++pi)
    plain.push_back(run(e, nullptr, kPrompts[pi], g_tokens, nullptr));
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    if (g_sanitized && ci % 2) continue;
    specinfer_drafter *d = open_drafter(e, "medusa-counted", configs[ci]);
    g_seen = Seen{};
    int64_t rounds = 0, drafted = 0, accepted = 0;
    for (size_t pi = 0; pi < n_prompts; ++pi) {
      specinfer_session_stats st;
      const std::vector<int32_t> spec = run(e, d, kPrompts[pi], g_tokens, &st);
      expect_same_tokens(plain[pi], spec, "drafter " + configs[ci], kPrompts[pi]);
      rounds += st.n_rounds;
      drafted += st.n_drafted;
      accepted += st.n_accepted;
    }
    std::fprintf(stderr,
                 "%s: %lld rounds, %.2f nodes per round, %lld accepted; %d drafts (%d with a "
                 "hidden state), %d trees\n",
                 configs[ci].c_str(), (long long)rounds, double(drafted) / double(rounds),
                 (long long)accepted, g_seen.drafts, g_seen.with_hidden, g_seen.trees);
    assert_int_equal(g_seen.invalid, 0);
    assert_true(g_seen.proposals > 0);
    assert_true(g_seen.with_hidden > 0);
    if (ci == 0) {
      // W = 0, b = 0: every head is the target's own output layer at the hidden state's position,
      // whose best token is the last committed one (the whole path: matmuls, silu, top-k).
      std::fprintf(stderr, "first node = last token in %d of %d drafts\n", g_seen.first_is_last,
                   g_seen.last_in_vocab);
      assert_true(g_seen.last_in_vocab > 0);
      assert_true(g_seen.first_is_last * 10 >= g_seen.last_in_vocab * 9);
    }
    if (ci == 0 || ci >= 4) {  // fixed, generous estimates: real trees every round
      assert_true(drafted > rounds);
      assert_true(g_seen.trees > 0);
      assert_true(g_seen.trees * 2 >= g_seen.drafts);
    }
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  }
}

// Drafters of one heads file on targets sharing one model (a server's slots) share the prepared
// matrices: a second one allocates far less memory than one with another weight type (which
// prepares its own), and drafts the same text.
void test_drafters_share_heads(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_target *t2 = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_target_share(e->target, &t2, &err), SPECINFER_OK);
  const std::string cfg = "path=" + e->random;
  specinfer_drafter *a = open_drafter(e, "medusa", cfg);
  const long long one = allocated_bytes();
  specinfer_drafter *b = nullptr;
  assert_int_equal(specinfer_drafter_open(e->reg, "medusa", cfg.c_str(), t2, &b, &err),
                   SPECINFER_OK);
  const long long two = allocated_bytes();
  specinfer_drafter *c = nullptr;
  const std::string f16 = cfg + ",wtype=f16";
  assert_int_equal(specinfer_drafter_open(e->reg, "medusa", f16.c_str(), t2, &c, &err),
                   SPECINFER_OK);
  const long long three = allocated_bytes();
  std::fprintf(stderr, "allocated: %lld KiB, +%lld KiB for a second drafter, +%lld KiB for f16\n",
               one >> 10, (two - one) >> 10, (three - two) >> 10);
  // f16 heads: 4 x 896 x 896 and 16384 x 896 values, 2 bytes each (34 MiB). (Sanitizers' own
  // allocators are not counted by mallinfo2.)
  if (!g_sanitized) {
    assert_true(three - two > (16ll << 20));
    assert_true(two - one < (three - two) / 8);
  }
  assert_int_equal(specinfer_drafter_destroy(c), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(a), SPECINFER_OK);
  // The survivor keeps the shared matrices: its text is plain decoding's.
  RunParams rp;
  rp.max_draft = 16;
  const std::vector<int32_t> plain = run_session(t2, nullptr, kPrompts[0], g_tokens, rp, nullptr);
  const std::vector<int32_t> spec = run_session(t2, b, kPrompts[0], g_tokens, rp, nullptr);
  expect_same_tokens(plain, spec, "second drafter on shared heads", kPrompts[0]);
  assert_int_equal(specinfer_drafter_destroy(b), SPECINFER_OK);
  assert_int_equal(specinfer_target_destroy(t2), SPECINFER_OK);
}

void expect_refused(Env *e, const std::string &cfg, std::vector<specinfer_status> want,
                    const std::vector<std::string> &words) {
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  const specinfer_status rc =
      specinfer_drafter_open(e->reg, "medusa", cfg.c_str(), e->target, &d, &err);
  std::fprintf(stderr, "medusa:%s -> %s: %s\n", cfg.c_str(), specinfer_status_str(rc),
               err ? err : "(no message)");
  assert_true(std::find(want.begin(), want.end(), rc) != want.end());
  assert_null(d);
  assert_non_null(err);
  for (const std::string &w : words) assert_non_null(std::strstr(err, w.c_str()));
  specinfer_free(err);
}

// Requests from a host older than the hidden state (struct_size ending before it), or without
// one: no heads, so nothing, or only the lookup chain.
// A draft request over `ctx` with the hidden state `hidden` (hidden_size values) at the last
// position but one, as the session makes it.
specinfer_draft_request hidden_request(const std::vector<int32_t> &ctx,
                                       const std::vector<float> &hidden, int32_t hidden_size,
                                       int32_t max_tokens) {
  specinfer_draft_request req{};
  req.struct_size = sizeof req;
  req.max_tokens = max_tokens;
  req.allow_tree = 1;
  req.context = ctx.data();
  req.n_context = ctx.size();
  req.hidden = hidden.data();
  req.hidden_size = hidden_size;
  req.hidden_position = static_cast<int64_t>(ctx.size()) - 2;
  return req;
}

void test_requests_without_hidden(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  const int32_t vocab = e->target->info().vocab_size;
  // A context that repeats itself: prompt lookup has a continuation.
  std::vector<int32_t> ctx;
  for (int i = 0; i < 40; ++i) ctx.push_back(100 + i % 10);
  std::vector<float> hidden(static_cast<size_t>(e->hidden), 0.5f);
  std::vector<int32_t> tokens(16), parents(16);
  for (const char *cfg : {"", ",lookup=1"}) {
    specinfer_drafter *d = open_drafter(e, "medusa-counted", "path=" + e->zero + cfg);
    Wrapped *w = g_last_wrapped;
    specinfer_plugin_error err{};
    assert_int_equal(w->vt->begin(w->self, ctx.data(), ctx.size(), &err), SPECINFER_OK);
    for (int variant = 0; variant < 3; ++variant) {
      specinfer_draft_request req = hidden_request(ctx, hidden, e->hidden, 16);
      if (variant == 0) req.struct_size = offsetof(specinfer_draft_request, hidden);  // old host
      if (variant == 1) req.hidden = nullptr;                                         // none
      if (variant == 2) req.hidden_position = 3;  // not the last position: stale, ignored
      specinfer_draft out = draft_into(tokens.data(), parents.data(), 16, vocab);
      assert_int_equal(w->vt->propose(w->self, &req, &out, &err), SPECINFER_OK);
      if (*cfg == 0) {
        assert_int_equal(out.n_nodes, 0);
      } else {  // the lookup chain alone: 100 + (40 + i) % 10
        assert_true(out.n_nodes >= 1);
        for (int32_t j = 0; j < out.n_nodes; ++j) {
          assert_int_equal(parents[static_cast<size_t>(j)], j - 1);
          assert_int_equal(tokens[static_cast<size_t>(j)], 100 + j % 10);
        }
      }
    }
    // A hidden state of the wrong width is the host's error, refused with a message.
    specinfer_draft_request req = hidden_request(ctx, hidden, e->hidden / 2, 4);
    specinfer_draft out = draft_into(tokens.data(), parents.data(), 4, vocab);
    assert_int_equal(w->vt->propose(w->self, &req, &out, &err), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(err.message, "hidden"));
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  }
  // A one-token context cannot have a hidden state before its last token (position -1): the
  // path-reading heads, which read the token before the last, must not look before the context.
  {
    specinfer_drafter *d = open_drafter(e, "medusa-counted", "path=" + e->random_path);
    Wrapped *w = g_last_wrapped;
    specinfer_plugin_error err{};
    const std::vector<int32_t> one(1, 100);  // its own buffer, so ASan sees a read before it
    assert_int_equal(w->vt->begin(w->self, one.data(), one.size(), &err), SPECINFER_OK);
    specinfer_draft_request req = hidden_request(one, hidden, e->hidden, 4);  // position -1
    specinfer_draft out = draft_into(tokens.data(), parents.data(), 4, vocab);
    assert_int_equal(w->vt->propose(w->self, &req, &out, &err), SPECINFER_OK);
    assert_int_equal(out.n_nodes, 0);
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  }
}

// static=FILE (with lookup=1): a corpus holding the plain continuations of the prompts gives
// chains the target accepts where the context has none. Greedy text stays equal to plain decoding,
// and more drafted tokens are accepted than without the corpus. The draft length and the costs
// of drafting and of a pass's nodes are fixed: whether drafting pays on this machine's timings (a
// sanitizer build, a loaded machine) is not the question.
void test_static_corpus(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  const size_t n_prompts = g_sanitized ? 1 : sizeof kPrompts / sizeof *kPrompts;
  std::vector<std::vector<int32_t>> plain;
  std::string corpus;
  for (size_t pi = 0; pi < n_prompts; ++pi) {
    plain.push_back(run(e, nullptr, kPrompts[pi], g_tokens, nullptr));
    std::vector<char> text(plain.back().size() * 64 + 64);
    size_t n = 0;
    assert_int_equal(specinfer_target_detokenize(e->target, plain.back().data(),
                                                 plain.back().size(), text.data(), text.size(), &n),
                     SPECINFER_OK);
    corpus += std::string(kPrompts[pi]) + std::string(text.data(), n) + "\n\n";
  }
  corpus += corpus;  // the counts propose followers seen at least twice
  const std::string path = g_dir + "/corpus.txt";
  FILE *f = std::fopen(path.c_str(), "wb");
  assert_non_null(f);
  assert_int_equal(std::fwrite(corpus.data(), 1, corpus.size(), f), corpus.size());
  std::fclose(f);
  int64_t accepted[2] = {0, 0};
  for (int with = 0; with < 2; ++with) {
    const std::string cfg = "path=" + e->zero +
                            ",lookup=1,dynamic=0,draft_cost=0.02,node_cost=0.05" +
                            (with ? ",static=" + path : std::string());
    specinfer_drafter *d = open_drafter(e, "medusa", cfg);
    for (size_t pi = 0; pi < n_prompts; ++pi) {
      specinfer_session_stats st;
      expect_same_tokens(plain[pi], run(e, d, kPrompts[pi], g_tokens, &st, false), "drafter " + cfg,
                         kPrompts[pi]);
      accepted[with] += st.n_accepted;
    }
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  }
  std::fprintf(stderr, "accepted tokens: %lld without the corpus, %lld with it\n",
               (long long)accepted[0], (long long)accepted[1]);
  assert_true(accepted[1] > accepted[0]);
}

void test_refusals(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  const std::string name = e->target->info().name ? e->target->info().name : "";
  expect_refused(e, "path=" + e->other, {SPECINFER_ERR_CONFIG}, {"some-other-model", name});
  expect_refused(e, "path=" + g_dir + "/missing.gguf", {SPECINFER_ERR_IO, SPECINFER_ERR_NOT_FOUND},
                 {"missing.gguf"});
  // A truncated copy of a good file.
  const std::string cut = g_dir + "/truncated.gguf";
  {
    FILE *in = std::fopen(e->zero.c_str(), "rb");
    assert_non_null(in);
    std::vector<char> bytes(1 << 20);
    const size_t n = std::fread(bytes.data(), 1, bytes.size(), in);
    std::fclose(in);
    FILE *out = std::fopen(cut.c_str(), "wb");
    assert_non_null(out);
    assert_int_equal(std::fwrite(bytes.data(), 1, n / 2, out), n / 2);
    std::fclose(out);
  }
  expect_refused(e, "path=" + cut, {SPECINFER_ERR_FORMAT}, {"truncated.gguf"});
  expect_refused(e, "path=" + e->zero + ",colour=blue", {SPECINFER_ERR_CONFIG}, {"colour"});
  expect_refused(e, "nodes=4", {SPECINFER_ERR_CONFIG}, {"path"});
  expect_refused(e, "path=" + e->zero + ",value=best", {SPECINFER_ERR_CONFIG}, {"value"});
  expect_refused(e, "path=" + e->zero + ",heads=9", {SPECINFER_ERR_CONFIG}, {"heads"});
  expect_refused(e, "path=" + e->zero + ",static=" + e->zero, {SPECINFER_ERR_CONFIG}, {"lookup"});
  expect_refused(e, "path=" + e->zero + ",lookup=1,static=" + g_dir + "/no-corpus.txt",
                 {SPECINFER_ERR_CONFIG}, {"no-corpus.txt"});
}

}  // namespace

int main() {
  if (std::getenv("SPECINFER_SANITIZED")) {
    g_sanitized = true;
    g_tokens = 12;
  }
  const std::string m = std::string(models_dir()) + "/qwen2.5-coder-0.5b.gguf";
  if (is_regular_file(m.c_str())) g_model = m;
  const struct CMUnitTest tree_tests[] = {
      cmocka_unit_test(test_tree_structure),
      cmocka_unit_test(test_tree_best_first_is_optimal),
      cmocka_unit_test(test_tree_size_follows_cost),
      cmocka_unit_test(test_tree_path_levels),
      cmocka_unit_test(test_tree_chain_mode),
      cmocka_unit_test(test_tree_merges_lookup),
      cmocka_unit_test(test_tree_branch_chains),
  };
  const struct CMUnitTest model_tests[] = {
      cmocka_unit_test(test_greedy_equals_plain),
      cmocka_unit_test(test_requests_without_hidden),
      cmocka_unit_test(test_drafters_share_heads),
      cmocka_unit_test(test_static_corpus),
      cmocka_unit_test(test_refusals),
  };
  int failed = cmocka_run_group_tests_name("medusa trees", tree_tests, nullptr, nullptr);
  failed += cmocka_run_group_tests_name("medusa drafter", model_tests, setup, teardown);
  return failed;
}
