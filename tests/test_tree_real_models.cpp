// Token-tree verification on a real model (Qwen2.5-Coder 0.5B, scripts/fetch-models; skips with a
// message when it is absent; SPECINFER_MODELS names another models directory):
//  - a drafter registered in-process knows the text of plain decoding and proposes trees of two or
//    three children per level, the right token at varying sibling positions (so the accepted path
//    is seldom a prefix of the node order and the target keeps it with kv_keep), now and then a
//    level without it; greedy, the session's text equals plain decoding token for token on several
//    prompts, and so does the same drafter proposing chains; gumbel at a fixed seed and
//    temperature 0.8 equals plain sampling with that seed and coupler;
//  - kv_keep against a fresh forward: prefill, two tree passes each followed by kv_keep of a path
//    that is not a prefix of the node order, then the next token: its logits, and the tree passes'
//    logits along the kept paths, equal bit for bit those of plain decoding of the same text
//    (prompt in one batch, then one token per pass). Tree attention computes each node as plain
//    decoding does (lib/backend/attention.cpp), so no tolerance is needed.
// With SPECINFER_SANITIZED=1 (ASan/UBSan builds, ~10x slower) one prompt and fewer tokens.
#include <sys/stat.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../common/splitmix64.h"
#include "api/handles.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/models.h"
#include "support/real_sessions.h"
#include "support/same_tokens.h"
#include "support/test_util.h"

namespace {

std::string g_model;  // path of the 0.5B, empty when absent
bool g_sanitized = false;
int g_tokens = 48;

const char *kPrompts[] = {
    "def fib(n):\n",
    "<|im_start|>user\nWrite a Python function that reverses a "
    "string.<|im_end|>\n<|im_start|>assistant\n",
    "// Binary search in a sorted array of ints; returns the index or -1.\nint bsearch(",
};

/* ---------------------------------------------------------------------------------------------
 * The oracle drafter: proposes trees (or chains) along a known text
 * ------------------------------------------------------------------------------------------- */

// The text the drafter follows (prompt and continuation) and what it saw, shared with the test.
struct Oracle {
  std::vector<int32_t> text;
  bool diverged = false;  // the session's context left the text (a test failure)
  // This round's node index of the right token at each level, -1 if none.
  std::vector<int32_t> right_node;
  bool pending = false;  // a proposal awaits its commit
  // Proposals, those committed, and those whose kept path is not a prefix of the nodes.
  int64_t proposed = 0, committed = 0, moved = 0;
};
Oracle g_oracle;

uint64_t mix(uint64_t x) {  // a fixed, well-spread choice per (round, level)
  return specinfer::splitmix64(x);
}

struct OracleDrafter {
  bool chain = false;
};

void od_destroy(void *self) {
  delete static_cast<OracleDrafter *>(self);
}

specinfer_status od_begin(void *, const int32_t *, size_t, specinfer_plugin_error *) {
  g_oracle.pending = false;
  return SPECINFER_OK;
}

// Tree: per level two or three children of the previous level's right child (the root first),
// the right token at a sibling position chosen from (context length, level), wrong tokens around
// it; one level in eight has no right token. Chain: the right tokens, one level in eight wrong.
specinfer_status od_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                            specinfer_plugin_error *) {
  const bool chain = static_cast<OracleDrafter *>(self)->chain;
  const auto &text = g_oracle.text;
  if (req->n_context > text.size() ||
      !std::equal(req->context, req->context + req->n_context, text.begin()))
    g_oracle.diverged = true;
  const int32_t cap = std::min(req->max_tokens, out->cap), V = out->vocab_size;
  g_oracle.right_node.clear();
  int32_t n = 0, parent = -1;
  for (int32_t level = 0;; ++level) {
    const uint64_t h = mix(req->n_context * 64 + static_cast<uint64_t>(level));
    const int32_t width = chain ? 1 : 2 + static_cast<int32_t>(h & 1);
    if (n + width > cap) break;
    const size_t at = req->n_context + static_cast<size_t>(level);
    const int32_t right = at < text.size() ? text[at] : 0;
    const bool has_right = (h >> 8) % 8 != 0;
    const int32_t r = static_cast<int32_t>((h >> 16) % static_cast<uint64_t>(width));
    int32_t right_idx = -1;
    for (int32_t s = 0; s < width; ++s) {
      out->parents[n] = parent;
      if (s == r && has_right) {
        out->tokens[n] = right;
        right_idx = n;
      } else {
        out->tokens[n] = (right + 1 + s * 1009) % V;
      }
      ++n;
    }
    g_oracle.right_node.push_back(right_idx);
    if (right_idx < 0) break;  // nothing below a level the target refuses
    parent = right_idx;
  }
  out->n_nodes = n;
  out->has_probs = 0;
  g_oracle.pending = true;
  ++g_oracle.proposed;
  return SPECINFER_OK;
}

// After a proposal: tokens = the accepted nodes and the target's token.
specinfer_status od_commit(void *, const int32_t *, size_t n, specinfer_plugin_error *) {
  if (!g_oracle.pending) return SPECINFER_OK;
  g_oracle.pending = false;
  ++g_oracle.committed;
  const size_t accepted = n - 1;
  for (size_t d = 0; d < accepted && d < g_oracle.right_node.size(); ++d) {
    if (g_oracle.right_node[d] != static_cast<int32_t>(d)) {
      ++g_oracle.moved;
      break;
    }
  }
  return SPECINFER_OK;
}

const specinfer_drafter_vtable od_vtable = {
    sizeof(specinfer_drafter_vtable), od_destroy, od_begin, od_propose, od_commit, nullptr};

specinfer_status od_create(const specinfer_host *, const char *config, const specinfer_model_info *,
                           const specinfer_host_target *, void **self,
                           const specinfer_drafter_vtable **vt, specinfer_plugin_error *err) {
  const std::string cfg = config ? config : "";
  if (cfg != "" && cfg != "chain") {
    if (err) std::snprintf(err->message, sizeof err->message, "unknown config '%s'", cfg.c_str());
    return SPECINFER_ERR_CONFIG;
  }
  auto *d = new OracleDrafter;
  d->chain = cfg == "chain";
  *self = d;
  *vt = &od_vtable;
  return SPECINFER_OK;
}

TEST_DRAFTER_PLUGIN(oracle, "oracle-tree", "trees along a known text", od_create);

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */

using Env = RealTarget;

int setup(void **state) {
  if (g_model.empty()) return 0;
  auto *e = new Env;
  if (!e->open(g_model, &oracle_plugin)) return -1;
  *state = e;
  return 0;
}

int teardown(void **state) {
  auto *e = static_cast<Env *>(*state);
  if (!e) return 0;
  e->close();
  delete e;
  return 0;
}

void skip_without_model(void **state) {
  if (!*state) {
    std::fprintf(stderr, "SKIP: %s/qwen2.5-coder-0.5b.gguf not found (run scripts/fetch-models)\n",
                 models_dir());
    skip();
  }
}

// Generates n tokens; returns the whole sequence and fills *st.
std::vector<int32_t> run(Env *e, specinfer_drafter *d, const specinfer_coupler *c, float temp,
                         uint64_t seed, const char *prompt, int n, specinfer_session_stats *st) {
  RunParams rp;
  rp.coupler = c;
  rp.temperature = temp;
  rp.seed = seed;
  rp.adaptive = false;
  return run_session(e->target, d, prompt, n, rp, st);
}

// Runs the oracle drafter (tree or chain) along `plain` and checks the text and the rounds.
void check_oracle_run(Env *e, specinfer_drafter *d, const specinfer_coupler *c, float temp,
                      uint64_t seed, const char *prompt, const std::vector<int32_t> &plain,
                      const char *what, bool tree) {
  g_oracle = Oracle{};
  g_oracle.text = plain;
  specinfer_session_stats st;
  std::vector<int32_t> got = run(e, d, c, temp, seed, prompt, g_tokens, &st);
  std::fprintf(stderr,
               "%s: %lld rounds, %lld nodes drafted, %lld accepted, %lld rounds kept a path that "
               "is not a prefix of the nodes\n",
               what, (long long)st.n_rounds, (long long)st.n_drafted, (long long)st.n_accepted,
               (long long)g_oracle.moved);
  expect_same_tokens(plain, got, what, prompt);
  assert_false(g_oracle.diverged);
  // Every round but one allowed to emit a single token (no draft) proposed, and committed.
  assert_int_equal(g_oracle.committed, g_oracle.proposed);
  assert_true(g_oracle.proposed >= st.n_rounds - 1);
  assert_true(st.n_accepted > 0);
  assert_true(st.n_drafted > st.n_rounds);  // more than one node per round
  if (tree) {
    assert_true(st.n_accepted < st.n_drafted / 2);  // siblings were drafted and refused
    assert_true(g_oracle.moved > 0);                // kv_keep moved cache rows
  }
}

void test_tree_greedy_equals_plain(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *tree = open_drafter(e->reg, e->target, "oracle-tree", "");
  specinfer_drafter *chain = open_drafter(e->reg, e->target, "oracle-tree", "chain");
  const size_t n_prompts = g_sanitized ? 1 : sizeof kPrompts / sizeof kPrompts[0];
  for (size_t pi = 0; pi < n_prompts; ++pi) {
    const std::vector<int32_t> plain =
        run(e, nullptr, nullptr, 0, 0, kPrompts[pi], g_tokens, nullptr);
    check_oracle_run(e, tree, nullptr, 0, 0, kPrompts[pi], plain, "greedy, trees", true);
    check_oracle_run(e, chain, nullptr, 0, 0, kPrompts[pi], plain, "greedy, chains", false);
  }
  assert_int_equal(specinfer_drafter_destroy(tree), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(chain), SPECINFER_OK);
}

void test_tree_gumbel_equals_plain(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  specinfer_drafter *tree = open_drafter(e->reg, e->target, "oracle-tree", "");
  const uint64_t seed = 20240611;
  const char *prompt = kPrompts[g_sanitized ? 0 : 1];
  const std::vector<int32_t> plain = run(e, nullptr, gumbel, 0.8f, seed, prompt, g_tokens, nullptr);
  check_oracle_run(e, tree, gumbel, 0.8f, seed, prompt, plain, "gumbel T=0.8, trees", true);
  assert_int_equal(specinfer_drafter_destroy(tree), SPECINFER_OK);
  specinfer_coupler_destroy(gumbel);
}

/* ---------------------------------------------------------------------------------------------
 * kv_keep against a fresh forward
 * ------------------------------------------------------------------------------------------- */

struct Forwarder {
  specinfer::TargetObject &t;
  int32_t vocab;
  // One pass: tokens at positions, optional tree mask, logits for all of them (or none).
  void operator()(const int32_t *toks, const int32_t *pos, int32_t n, const uint8_t *mask,
                  std::vector<float> *logits) {
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = n;
    b.tokens = toks;
    b.positions = pos;
    b.tree_mask = mask;
    if (logits) {
      logits->assign(static_cast<size_t>(n) * static_cast<size_t>(vocab), 0.0f);
      b.n_logits = n;
      b.logits = logits->data();
    }
    t.forward(b);
  }
};

double max_diff(const float *a, const float *b, int32_t n) {
  double md = 0;
  for (int32_t i = 0; i < n; ++i) md = std::max(md, static_cast<double>(std::fabs(a[i] - b[i])));
  return md;
}

void test_kv_keep_equals_fresh_forward(void **state) {
  skip_without_model(state);
  auto *e = static_cast<Env *>(*state);
  // The text: a prompt and its greedy continuation.
  const char *prompt = kPrompts[0];
  specinfer_session_stats st;
  const std::vector<int32_t> text = run(e, nullptr, nullptr, 0, 0, prompt, 12, &st);
  specinfer::TargetObject &t = *e->target;
  const int32_t V = t.info().vocab_size;
  Forwarder fwd{t, V};
  const auto n_prompt = static_cast<int32_t>(st.n_prompt_tokens);
  assert_true(n_prompt >= 2 && n_prompt + 8 <= static_cast<int32_t>(text.size()));

  // Two rounds, each: the last committed token, then levels of three children with the text's
  // token in the middle (levels 1 and 2) or last (level 3), the next level under it; the target
  // keeps the last token and the three right nodes.
  //   batch: 0 root | 1 2 3 (parent 0) | 4 5 6 (parent 2) | 7 8 9 (parent 5); right: 2, 5, 9
  const int32_t n_batch = 10, parent[n_batch] = {-1, 0, 0, 0, 2, 2, 2, 5, 5, 5};
  const int32_t keep[4] = {0, 2, 5, 9}, n_keep = 4;
  std::vector<uint8_t> mask(static_cast<size_t>(n_batch) * n_batch, 0);
  std::vector<int32_t> depth(n_batch, 0);
  for (int32_t i = 0; i < n_batch; ++i) {
    depth[static_cast<size_t>(i)] = parent[i] < 0 ? 0 : depth[static_cast<size_t>(parent[i])] + 1;
    for (int32_t j = i; j >= 0; j = parent[j]) mask[static_cast<size_t>(i) * n_batch + j] = 1;
  }

  t.kv_truncate(0);
  std::vector<int32_t> pos(static_cast<size_t>(n_prompt));
  for (int32_t i = 0; i < n_prompt; ++i) pos[static_cast<size_t>(i)] = i;
  fwd(text.data(), pos.data(), n_prompt - 1, nullptr, nullptr);  // prefill: all but the last
  int32_t base = n_prompt - 1;  // cached positions; text[base] is the last committed token
  std::vector<float> tree_logits[2];
  for (int round = 0; round < 2; ++round) {
    std::vector<int32_t> toks(n_batch), bpos(n_batch);
    for (int32_t i = 0; i < n_batch; ++i) {
      const int32_t d = depth[static_cast<size_t>(i)];
      const int32_t right = text[static_cast<size_t>(base + d)];
      const bool is_right = std::find(keep, keep + n_keep, i) != keep + n_keep;
      toks[static_cast<size_t>(i)] = is_right ? right : (right + 1 + 1009 * i) % V;
      bpos[static_cast<size_t>(i)] = base + d;
    }
    fwd(toks.data(), bpos.data(), n_batch, mask.data(), &tree_logits[round]);
    t.kv_keep(base, keep, n_keep);
    base += n_keep;
    assert_int_equal(t.kv_size(), base);
  }
  // The next token on top of the kept paths.
  std::vector<float> after;
  fwd(&text[static_cast<size_t>(base)], &base, 1, nullptr, &after);

  // Plain decoding of the same text: the prompt but its last token in one batch, then one token
  // per pass.
  t.kv_truncate(0);
  fwd(text.data(), pos.data(), n_prompt - 1, nullptr, nullptr);
  double md_keep = 0, md_tree = 0;
  std::vector<float> plain;
  for (int32_t p = n_prompt - 1; p <= base; ++p) {
    fwd(&text[static_cast<size_t>(p)], &p, 1, nullptr, &plain);
    if (p == base) {
      md_keep = max_diff(after.data(), plain.data(), V);
    } else {  // the tree pass's logits of the kept node at this position
      const int32_t round = (p - (n_prompt - 1)) / n_keep, k = (p - (n_prompt - 1)) % n_keep;
      const float *row = tree_logits[round].data() + static_cast<size_t>(keep[k]) * V;
      md_tree = std::max(md_tree, max_diff(row, plain.data(), V));
    }
  }
  t.kv_truncate(0);
  std::fprintf(stderr,
               "kv_keep: max |logit difference| %.3g after two kept tree paths, %.3g along the "
               "paths in the tree passes (against plain decoding)\n",
               md_keep, md_tree);
  assert_true(md_keep == 0.0);
  assert_true(md_tree == 0.0);
}

}  // namespace

int main(void) {
  g_sanitized = std::getenv("SPECINFER_SANITIZED") &&
                std::strcmp(std::getenv("SPECINFER_SANITIZED"), "1") == 0;
  const std::string small = std::string(models_dir()) + "/qwen2.5-coder-0.5b.gguf";
  if (is_regular_file(small.c_str())) g_model = small;
  g_tokens = g_sanitized ? 16 : 48;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tree_greedy_equals_plain),
      cmocka_unit_test(test_tree_gumbel_equals_plain),
      cmocka_unit_test(test_kv_keep_equals_fresh_forward),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
