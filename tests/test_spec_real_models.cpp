// Speculative decoding end to end on the real GGUF models (scripts/fetch-models): Qwen2.5-Coder
// 1.5B as the target, 0.5B as the draft model. Skips (with a message) when the models are absent.
//  - greedy: the text of every drafter (draft-model, ngram, draft-model with prompt lookup, a
//    draft model reading an 8-token window) equals plain greedy decoding token for token, on
//    several prompts;
//  - gumbel at a fixed seed, temperatures 0.7 and 1.0: every drafter gives the text of plain
//    decoding with that seed and coupler;
//  - KV rollback: after a sampled session with many rejections, the target's logits for the next
//    token equal (within 1e-3) those of a fresh target fed the same text the way plain decoding
//    feeds it (prompt in one batch, then one token per pass);
//  - the draft model follows the accepted text: drafting for the 0.5B with the 0.5B itself is
//    accepted (almost) always;
//  - staged drafting (prompt-lookup tokens fed along, draft-model's stage option) drafts exactly
//    what the model drafts without it;
//  - drafts made for several drafters in one call (propose_many) are the drafts each makes
//    alone;
//  - the accepted length a drafter expects (specinfer_draft.expected_accepted) is reported in the
//    session's statistics beside what the target kept: by the draft model's greedy chains and
//    trees, not by its sampled chains nor by prompt lookup;
//  - draft-model trees (tree=1) stay within the node budget, fill it where nodes cost nothing,
//    hold siblings, shrink to nothing where no node can pay for its pass cost, and are chains
//    when the session verifies only chains;
//  - log-probabilities of the emitted tokens (specinfer_session_set_logprobs), with drafts,
//    greedy and sampled, equal the target's fed as plain decoding (within 1e-4).
// With SPECINFER_SANITIZED=1 (ASan/UBSan builds, ~10x slower) the 0.5B is both target and draft
// and fewer tokens are generated.
#include <setjmp.h>
#include <stdint.h>

#include <sys/stat.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "api/handles.h"
#include "specinfer.h"

#include "support/cmocka_setup.h"
#include "support/models.h"
#include "support/real_sessions.h"
#include "support/same_tokens.h"

namespace {

std::string g_target, g_draft;  // model paths
bool g_sanitized = false;
int g_tokens = 24;

const auto &kPrompts = kCodePrompts;

using Env = RealTarget;

int setup(void **state) {
  if (g_target.empty()) return 0;
  auto *e = new Env;
  if (!e->open(g_target)) return -1;
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

specinfer_drafter *open_drafter(Env *e, const std::string &spec) {
  size_t colon = spec.find(':');
  std::string plugin = spec.substr(0, colon),
              cfg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  specinfer_status rc =
      specinfer_drafter_open(e->reg, plugin.c_str(), cfg.c_str(), e->target, &d, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "drafter %s: %s\n", spec.c_str(), err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  return d;
}

// Generates n tokens; returns the whole sequence and fills *st.
std::vector<int32_t> run(Env *e, specinfer_drafter *d, const char *coupler, float temp,
                         uint64_t seed, const char *prompt, int n, specinfer_session_stats *st,
                         int max_draft = 8, bool adaptive = true) {
  specinfer_coupler *c = nullptr;
  if (coupler) assert_int_equal(specinfer_coupler_create(coupler, &c, nullptr), SPECINFER_OK);
  RunParams rp;
  rp.coupler = c;
  rp.temperature = temp;
  rp.seed = seed;
  rp.max_draft = max_draft;
  rp.adaptive = adaptive;
  std::vector<int32_t> out = run_session(e->target, d, prompt, n, rp, st);
  specinfer_coupler_destroy(c);
  return out;
}

std::vector<std::string> drafter_specs() {
  // (draft-model re-quantizes the draft to Q4_0 unless requant=none: both are covered.)
  return {"draft-model:path=" + g_draft + ",requant=none", "ngram",
          "draft-model:path=" + g_draft + ",lookup=1",
          "draft-model:path=" + g_draft + ",vocab_limit=32768,stage=0",
          // A window of 8 tokens: the draft's cache starts over several times per text.
          "draft-model:path=" + g_draft + ",window=8",
          // Token trees: the model's path with its runners-up as siblings, from the draft
          // re-quantized to 3 bits.
          "draft-model:path=" + g_draft + ",tree=1,p_min=0.2,requant=q3_0"};
}

// expect_same_tokens with the coupler and the drafter named.
void expect_same(const std::vector<int32_t> &want, const std::vector<int32_t> &got,
                 const char *what, const std::string &drafter, const char *prompt) {
  expect_same_tokens(want, got, std::string(what) + ": drafter " + drafter, prompt);
}

void skip_without_models(void **state) {
  if (!*state) {
    std::fprintf(stderr, "SKIP: real models not found in %s (run scripts/fetch-models)\n",
                 models_dir());
    skip();
  }
}

void test_greedy_equals_plain(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  size_t n_prompts = g_sanitized ? 1 : 3;
  std::vector<specinfer_drafter *> ds;
  for (const auto &spec : drafter_specs()) ds.push_back(open_drafter(e, spec));
  int64_t accepted_model = 0, accepted_window = 0;
  for (size_t pi = 0; pi < n_prompts; ++pi) {
    std::vector<int32_t> plain = run(e, nullptr, nullptr, 0, 0, kPrompts[pi], g_tokens, nullptr);
    for (size_t di = 0; di < ds.size(); ++di) {
      specinfer_session_stats st;
      std::vector<int32_t> spec = run(e, ds[di], nullptr, 0, 0, kPrompts[pi], g_tokens, &st);
      expect_same(plain, spec, "greedy", drafter_specs()[di], kPrompts[pi]);
      if (di == 0) accepted_model += st.n_accepted;
      if (di == ds.size() - 1) accepted_window += st.n_accepted;
    }
  }
  // The draft model is a real drafter, on a window too: the target keeps some of its tokens.
  assert_true(accepted_model > 0);
  assert_true(accepted_window > 0);
  for (auto *d : ds) assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

void test_gumbel_equals_plain(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  std::vector<specinfer_drafter *> ds;
  for (const auto &spec : drafter_specs()) ds.push_back(open_drafter(e, spec));
  const int n = g_sanitized ? g_tokens : 16;
  for (float temp : {0.7f, 1.0f}) {
    const uint64_t seed = 20240611;
    const char *prompt = kPrompts[g_sanitized ? 0 : 2];
    std::vector<int32_t> plain = run(e, nullptr, "gumbel", temp, seed, prompt, n, nullptr);
    for (size_t di = 0; di < ds.size(); ++di) {
      std::vector<int32_t> spec = run(e, ds[di], "gumbel", temp, seed, prompt, n, nullptr);
      expect_same(plain, spec, temp < 0.8f ? "gumbel T=0.7" : "gumbel T=1.0", drafter_specs()[di],
                  prompt);
    }
  }
  for (auto *d : ds) assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

void test_rollback_logits(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  // A confident-or-not draft model at fixed length, sampled with rejection coupling: many drafts
  // are partly refused, so the target's cache is cut back often.
  // (Sanitized runs draft with the target's own model, which is never refused: there the 1-gram
  // prompt lookup makes the bad drafts.)
  specinfer_drafter *d = open_drafter(
      e, g_sanitized ? std::string("ngram:n_min=1") : "draft-model:path=" + g_draft + ",p_min=0");
  specinfer_session_stats st;
  const char *prompt = kPrompts[g_sanitized ? 1 : 0];
  std::vector<int32_t> seq =
      run(e, d, "rejection", 1.0f, 7, prompt, g_sanitized ? 12 : g_tokens, &st, 6, false);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  std::fprintf(stderr, "rollback: %lld rounds, drafted %lld, accepted %lld\n",
               (long long)st.n_rounds, (long long)st.n_drafted, (long long)st.n_accepted);
  assert_true(st.n_drafted - st.n_accepted >= (g_sanitized ? 4 : 8));  // many refused draft tokens

  specinfer::TargetObject &t = *e->target;
  const int32_t V = t.info().vocab_size;
  const int32_t n = static_cast<int32_t>(seq.size());
  // The session's cache holds seq[0 .. n-1); score the last token on top of it.
  assert_int_equal(t.kv_size(), n - 1);
  std::vector<float> after(V), fresh(V);
  auto forward = [&](const int32_t *toks, int32_t m, int32_t pos0, float *logits) {
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) pos[static_cast<size_t>(i)] = pos0 + i;
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = m;
    b.tokens = toks;
    b.positions = pos.data();
    b.n_logits = logits ? 1 : 0;
    b.logits = logits;
    t.forward(b);
  };
  forward(&seq[static_cast<size_t>(n - 1)], 1, n - 1, after.data());

  // A fresh run on the same text, fed as plain decoding feeds it.
  t.kv_truncate(0);
  const int32_t n_prompt = static_cast<int32_t>(st.n_prompt_tokens);
  forward(seq.data(), n_prompt - 1, 0, nullptr);
  for (int32_t i = n_prompt - 1; i < n - 1; ++i)
    forward(&seq[static_cast<size_t>(i)], 1, i, nullptr);
  forward(&seq[static_cast<size_t>(n - 1)], 1, n - 1, fresh.data());
  double md = 0, scale = 0;
  for (int32_t v = 0; v < V; ++v) {
    md = std::max(md, static_cast<double>(std::fabs(after[static_cast<size_t>(v)] -
                                                    fresh[static_cast<size_t>(v)])));
    scale = std::max(scale, static_cast<double>(std::fabs(fresh[static_cast<size_t>(v)])));
  }
  std::fprintf(stderr, "rollback: max |logit difference| %.3g (largest logit %.3g)\n", md, scale);
  assert_true(md <= 1e-3);
  t.kv_truncate(0);
}

// The target's log-softmax after each of seq[from ..] (as the token before it), fed as plain
// decoding feeds it: the tokens before `from` in one pass, then one token per pass.
std::vector<std::vector<double>> plain_logprobs(specinfer::TargetObject &t,
                                                const std::vector<int32_t> &seq, size_t from) {
  const int32_t V = t.info().vocab_size;
  std::vector<std::vector<double>> rows;
  std::vector<float> logits(static_cast<size_t>(V));
  t.kv_truncate(0);
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    if (i + 1 < from) continue;  // part of the first pass
    const size_t first = i + 1 == from ? 0 : i;
    const int32_t m = static_cast<int32_t>(i + 1 - first);
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int32_t j = 0; j < m; ++j) pos[static_cast<size_t>(j)] = static_cast<int32_t>(first) + j;
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = m;
    b.tokens = &seq[first];
    b.positions = pos.data();
    b.n_logits = 1;
    b.logits = logits.data();
    t.forward(b);
    double most = logits[0], sum = 0;
    for (float x : logits) most = std::max(most, static_cast<double>(x));
    for (float x : logits) sum += std::exp(static_cast<double>(x) - most);
    std::vector<double> row(static_cast<size_t>(V));
    for (int32_t v = 0; v < V; ++v)
      row[static_cast<size_t>(v)] = logits[static_cast<size_t>(v)] - most - std::log(sum);
    rows.push_back(std::move(row));
  }
  t.kv_truncate(0);
  return rows;
}

// How far one log-probability entry (a token's, and its `top` alternatives') is from `row`, the
// target's log-softmax at that position fed as plain decoding. Asserts that the alternatives come
// most likely first and that no token outside them scores higher.
double entry_difference(const std::vector<double> &row, int32_t token, float logprob,
                        const int32_t *top_tokens, const float *top_logprobs, int top) {
  double worst = std::fabs(logprob - row[static_cast<size_t>(token)]);
  for (int j = 0; j < top; ++j) {
    worst = std::max(worst, std::fabs(top_logprobs[j] - row[static_cast<size_t>(top_tokens[j])]));
    if (j > 0) assert_true(top_logprobs[j] <= top_logprobs[j - 1]);
  }
  const double last = top_logprobs[top - 1];
  for (size_t v = 0; v < row.size(); ++v)
    if (row[v] > last + 1e-4)
      assert_true(std::find(top_tokens, top_tokens + top, static_cast<int32_t>(v)) !=
                  top_tokens + top);
  return worst;
}

// specinfer_session_set_logprobs: each emitted token's log-probability and its 5 most likely
// alternatives equal the target's log-softmax fed as plain decoding within 1e-4, with the draft
// model drafting (rows of batched verify passes), greedy and rejection-sampled.
void test_logprobs_equal_plain(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *d = open_drafter(e, "draft-model:path=" + g_draft);
  const char *prompt = kPrompts[0];
  const int top = 5;
  for (float temp : {0.0f, 1.0f}) {
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    p.temperature = temp;
    p.seed = 3;
    specinfer_session *s = nullptr;
    assert_int_equal(specinfer_session_create(e->target, d, nullptr, &p, &s, nullptr),
                     SPECINFER_OK);
    assert_int_equal(specinfer_session_set_logprobs(s, 21), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_set_logprobs(s, -2), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_set_logprobs(nullptr, 1), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_set_logprobs(s, top), SPECINFER_OK);
    assert_int_equal(specinfer_session_feed_text(s, prompt, std::strlen(prompt)), SPECINFER_OK);
    std::vector<int32_t> got, got_top;
    std::vector<float> got_lp, got_top_lp;
    int32_t room[32];
    while (got.size() < static_cast<size_t>(g_tokens)) {
      size_t n = 0, n_lp = 0;
      int32_t done = 0, top_n = -1;
      assert_int_equal(specinfer_session_step(s, room, 32, &n, &done), SPECINFER_OK);
      const int32_t *toks = nullptr, *tt = nullptr;
      const float *lp = nullptr, *tlp = nullptr;
      assert_int_equal(specinfer_session_step_logprobs(s, &toks, &lp, &tt, &tlp, &n_lp, &top_n),
                       SPECINFER_OK);
      assert_int_equal(n_lp, n);
      assert_int_equal(top_n, top);
      assert_memory_equal(toks, room, n * sizeof(int32_t));
      got.insert(got.end(), toks, toks + n);
      got_lp.insert(got_lp.end(), lp, lp + n);
      got_top.insert(got_top.end(), tt, tt + n * top);
      got_top_lp.insert(got_top_lp.end(), tlp, tlp + n * top);
      if (done) break;
    }
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
    const int32_t *all = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_tokens(s, &all, &len), SPECINFER_OK);
    std::vector<int32_t> seq(all, all + len);
    specinfer_session_destroy(s);
    const size_t n_prompt = static_cast<size_t>(st.n_prompt_tokens);
    assert_int_equal(len, n_prompt + got.size());
    assert_true(st.n_accepted > 0);  // some rows came from drafted positions
    const auto want = plain_logprobs(*e->target, seq, n_prompt);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, entry_difference(want[i], got[i], got_lp[i], &got_top[i * top],
                                               &got_top_lp[i * top], top));
      if (temp == 0.0f) assert_int_equal(got_top[i * top], got[i]);
    }
    std::fprintf(stderr,
                 "logprobs, temperature %.1f: %zu tokens, %lld accepted drafts, max "
                 "|difference| from plain %.3g\n",
                 temp, got.size(), (long long)st.n_accepted, worst);
    assert_true(worst <= 1e-4);
  }
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

// specinfer_session_set_prompt_logprobs: every token of a prompt of several chunks, from the
// second on, gets the target's log-softmax fed as plain decoding within 1e-4, and its top 3
// alternatives; the same through specinfer_session_step (whole-prompt catch-up, after a text whose
// cached prefix the prompt shares: scored again) and step_many (chunks of 24), with the draft
// model on the session.
void test_prompt_logprobs_equal_plain(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *d = open_drafter(e, "draft-model:path=" + g_draft);
  const int top = 3;
  std::string prompt;
  for (int i = 0; i < 3; ++i) prompt += kPrompts[i];
  for (int many = 0; many < 2; ++many) {
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    specinfer_session *s = nullptr;
    assert_int_equal(specinfer_session_create(e->target, d, nullptr, &p, &s, nullptr),
                     SPECINFER_OK);
    assert_int_equal(specinfer_session_set_prompt_logprobs(s, 21), SPECINFER_ERR_INVALID_ARGUMENT);
    assert_int_equal(specinfer_session_set_prompt_logprobs(nullptr, 1),
                     SPECINFER_ERR_INVALID_ARGUMENT);
    int32_t room[16];
    size_t n = 0;
    int32_t done = 0;
    // A text that the prompt continues: its cache is kept by the reset.
    assert_int_equal(specinfer_session_feed_text(s, kPrompts[0], std::strlen(kPrompts[0])),
                     SPECINFER_OK);
    assert_int_equal(specinfer_session_step(s, room, 16, &n, &done), SPECINFER_OK);
    assert_int_equal(specinfer_session_reset(s), SPECINFER_OK);
    assert_int_equal(specinfer_session_feed_text(s, prompt.data(), prompt.size()), SPECINFER_OK);
    assert_int_equal(specinfer_session_set_prompt_logprobs(s, top), SPECINFER_OK);
    if (many) {
      specinfer_step_params sp;
      specinfer_step_params_init(&sp);
      sp.prefill_chunk = 24;
      specinfer_step_result r{};
      r.struct_size = sizeof r;
      r.tokens = room;
      r.cap = 16;
      do {
        assert_int_equal(specinfer_session_step_many(&s, &r, 1, &sp), SPECINFER_OK);
        assert_int_equal(r.status, SPECINFER_OK);
      } while (r.n_tokens == 0);
    } else {
      assert_int_equal(specinfer_session_step(s, room, 16, &n, &done), SPECINFER_OK);
    }
    const int32_t *toks = nullptr, *tt = nullptr;
    const float *lp = nullptr, *tlp = nullptr;
    size_t n_lp = 0;
    int32_t top_n = -1;
    assert_int_equal(specinfer_session_prompt_logprobs(s, &toks, &lp, &tt, &tlp, &n_lp, &top_n),
                     SPECINFER_OK);
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
    const int32_t *all = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_tokens(s, &all, &len), SPECINFER_OK);
    const size_t n_prompt = static_cast<size_t>(st.n_prompt_tokens);
    assert_true(n_prompt > 64);
    assert_int_equal(n_lp, n_prompt - 1);
    assert_int_equal(top_n, top);
    const std::vector<int32_t> seq(all, all + n_prompt);
    assert_memory_equal(toks, seq.data() + 1, n_lp * sizeof(int32_t));
    const std::vector<int32_t> got_top(tt, tt + n_lp * top);
    const std::vector<float> got(lp, lp + n_lp), got_top_lp(tlp, tlp + n_lp * top);
    // After a reset the entries start over.
    assert_int_equal(specinfer_session_reset(s), SPECINFER_OK);
    assert_int_equal(
        specinfer_session_prompt_logprobs(s, nullptr, nullptr, nullptr, nullptr, &n_lp, nullptr),
        SPECINFER_OK);
    assert_int_equal(n_lp, 0);
    specinfer_session_destroy(s);
    const auto want = plain_logprobs(*e->target, seq, 1);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, entry_difference(want[i], seq[i + 1], got[i], &got_top[i * top],
                                               &got_top_lp[i * top], top));
    std::fprintf(stderr, "prompt logprobs (%s): %zu tokens, max |difference| from plain %.3g\n",
                 many ? "step_many, chunks of 24" : "step", got.size(), worst);
    assert_true(worst <= 1e-4);
  }
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

void test_draft_model_follows_text(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  if (g_target != g_draft) {
    // Same check, with the draft model as the target: open it as a second target.
    specinfer_target *small = nullptr;
    std::string cfg = "path=" + g_draft + ",n_ctx=1024";
    assert_int_equal(specinfer_target_open(e->reg, "gguf", cfg.c_str(), &small, nullptr),
                     SPECINFER_OK);
    Env e2{e->reg, small};
    specinfer_drafter *d = open_drafter(&e2, "draft-model:path=" + g_draft + ",p_min=0");
    specinfer_session_stats st;
    run(&e2, d, nullptr, 0, 0, kPrompts[1], g_tokens, &st, 6, false);
    std::fprintf(stderr, "self-draft: drafted %lld, accepted %lld\n", (long long)st.n_drafted,
                 (long long)st.n_accepted);
    assert_true(st.n_drafted >= g_tokens / 2);
    assert_true(st.n_accepted >= st.n_drafted * 95 / 100);
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
    assert_int_equal(specinfer_target_destroy(small), SPECINFER_OK);
    return;
  }
  specinfer_drafter *d = open_drafter(e, "draft-model:path=" + g_draft + ",p_min=0");
  specinfer_session_stats st;
  run(e, d, nullptr, 0, 0, kPrompts[1], g_tokens, &st, 6, false);
  std::fprintf(stderr, "self-draft: drafted %lld, accepted %lld\n", (long long)st.n_drafted,
               (long long)st.n_accepted);
  assert_true(st.n_drafted >= g_tokens / 2);
  assert_true(st.n_accepted >= st.n_drafted * 95 / 100);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

// Staged drafting (draft-model's stage option) changes what the draft costs, never what it drafts:
// with fixed-length drafts, the rounds, drafted and accepted counts are the same with and without
// it, on a prompt whose text prompt lookup predicts in part (a rename: the staged tokens are used
// and also refused), greedy and sampled.
void test_staged_drafts_unchanged(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *plain = open_drafter(e, "draft-model:path=" + g_draft + ",stage=0");
  specinfer_drafter *staged =
      open_drafter(e, "draft-model:path=" + g_draft + ",stage=4,stage_n_min=1");
  for (float temp : {0.0f, 1.0f}) {
    const char *coupler = temp > 0 ? "gumbel" : nullptr;
    specinfer_session_stats a, b;
    std::vector<int32_t> ta = run(e, plain, coupler, temp, 11, kPrompts[1], g_tokens, &a, 4, false);
    std::vector<int32_t> tb =
        run(e, staged, coupler, temp, 11, kPrompts[1], g_tokens, &b, 4, false);
    std::fprintf(
        stderr,
        "staged (T=%.1f): %lld rounds, drafted %lld, accepted %lld; unstaged: %lld, %lld, %lld\n",
        temp, (long long)b.n_rounds, (long long)b.n_drafted, (long long)b.n_accepted,
        (long long)a.n_rounds, (long long)a.n_drafted, (long long)a.n_accepted);
    assert_true(ta == tb);
    assert_int_equal(a.n_rounds, b.n_rounds);
    assert_int_equal(a.n_drafted, b.n_drafted);
    assert_int_equal(a.n_accepted, b.n_accepted);
  }
  assert_int_equal(specinfer_drafter_destroy(plain), SPECINFER_OK);
  assert_int_equal(specinfer_drafter_destroy(staged), SPECINFER_OK);
}

// The coupler's draft side, as a session hands it to a drafter.
struct SampleCtx {
  const specinfer::Coupler *coupler;
  uint64_t seed;
};
int32_t sample_draft(const void *ctx, const float *q, int32_t vocab, int64_t position) {
  const auto *c = static_cast<const SampleCtx *>(ctx);
  return c->coupler->draft_sample(vocab, q, c->seed, position);
}

// Drafts made for several drafters in one call (the draft-model plugin's propose_many: one pass
// of the draft model per draft depth for all of them) are the drafts each makes alone: the same
// nodes and, sampled, the same distributions, bit for bit. Three drafters draft together and
// three others alone, for three texts of different lengths over several rounds (each round keeps
// part of the draft and adds a token, so that caches are cut back and fed again), greedy and
// with the Gumbel coupler's draft side, with staging, with prompt lookup first, and unstaged (with
// SPECINFER_SANITIZED=1 staged and sampled only).
void test_batched_drafts_equal_lone(void **state) {
  skip_without_models(state);
  // A registry of its own, whose log shows whether the draft model's pass for all drafts failed
  // (then they would have drafted one after another): the draft model is its target too.
  struct Log {
    static void sink(void *user, specinfer_log_level level, const char *message) {
      if (level >= SPECINFER_LOG_WARN) static_cast<std::string *>(user)->append(message);
    }
  };
  std::string warnings;
  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = 2;
  rp.log = Log::sink;
  rp.log_user = &warnings;
  Env own;
  assert_int_equal(specinfer_registry_create(&rp, &own.reg, nullptr), SPECINFER_OK);
  const std::string target_cfg = "path=" + g_draft + ",n_ctx=1024";
  assert_int_equal(specinfer_target_open(own.reg, "gguf", target_cfg.c_str(), &own.target, nullptr),
                   SPECINFER_OK);
  Env *e = &own;
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  constexpr int kN = 3, kMost = 4;
  const int32_t vocab = e->target->info().vocab_size;
  std::vector<std::string> configs = {",stage=4,stage_n_min=1", ",lookup=1", ",stage=0"};
  if (g_sanitized) configs.resize(1);
  for (const std::string &cfg : configs) {
    for (const float temp : {0.8f, 0.0f}) {
      if (g_sanitized && temp == 0.0f) break;
      specinfer_drafter *together[kN], *alone[kN];
      std::vector<std::vector<int32_t>> text(kN);
      for (int i = 0; i < kN; ++i) {
        together[i] = open_drafter(e, "draft-model:path=" + g_draft + cfg);
        alone[i] = open_drafter(e, "draft-model:path=" + g_draft + cfg);
        text[static_cast<size_t>(i)] =
            e->target->tokenize(kPrompts[i], std::strlen(kPrompts[i]), true, true);
        together[i]->begin(text[static_cast<size_t>(i)].data(),
                           text[static_cast<size_t>(i)].size());
        alone[i]->begin(text[static_cast<size_t>(i)].data(), text[static_cast<size_t>(i)].size());
      }
      SampleCtx sctx{gumbel->impl.get(), 5};
      int drafted = 0;
      for (int round = 0; round < (g_sanitized ? 3 : 6); ++round) {
        // Buffers [drafter][side]: side 0 together, side 1 alone.
        std::vector<int32_t> tokens(kN * 2 * kMost), parents(kN * 2 * kMost);
        std::vector<float> probs(static_cast<size_t>(kN) * 2 * kMost * static_cast<size_t>(vocab));
        specinfer_draft_request reqs[kN];
        specinfer_draft outs[2][kN];
        for (int i = 0; i < kN; ++i) {
          const auto &t = text[static_cast<size_t>(i)];
          specinfer_draft_request &r = reqs[i];
          r = specinfer_draft_request{};
          r.struct_size = sizeof r;
          r.max_tokens = kMost;
          r.context = t.data();
          r.n_context = t.size();
          r.temperature = temp;
          r.seed = 5;
          r.sample = sample_draft;
          r.sample_ctx = &sctx;
          r.hidden_position = -1;
          for (int side = 0; side < 2; ++side) {
            const size_t at = static_cast<size_t>((i * 2 + side) * kMost);
            outs[side][i] = draft_into(tokens.data() + at, parents.data() + at, kMost, vocab,
                                       probs.data() + at * static_cast<size_t>(vocab));
          }
        }
        specinfer::DrafterObject *group[kN] = {together[0], together[1], together[2]};
        std::exception_ptr errors[kN];
        specinfer::DrafterObject::propose_many(group, reqs, outs[0], kN, errors);
        for (int i = 0; i < kN; ++i) {
          assert_true(errors[i] == nullptr);
          alone[i]->propose(reqs[i], outs[1][i]);
          const specinfer_draft &a = outs[0][i], &b = outs[1][i];
          assert_int_equal(a.n_nodes, b.n_nodes);
          assert_int_equal(a.has_probs, b.has_probs);
          for (int j = 0; j < a.n_nodes; ++j) {
            assert_int_equal(a.tokens[j], b.tokens[j]);
            assert_int_equal(a.parents[j], b.parents[j]);
            if (a.has_probs)
              assert_memory_equal(a.probs + static_cast<size_t>(j) * vocab,
                                  b.probs + static_cast<size_t>(j) * vocab, sizeof(float) * vocab);
          }
          drafted += a.n_nodes;
          // The text goes on with part of the draft and a token of the prompt.
          auto &t = text[static_cast<size_t>(i)];
          const int keep = a.n_nodes == 0 ? 0 : (round + i) % (a.n_nodes + 1);
          t.insert(t.end(), a.tokens, a.tokens + keep);
          t.push_back(t[static_cast<size_t>(round + i) % t.size()]);
        }
      }
      std::fprintf(stderr, "batched drafts (%s, T=%.1f): %d nodes, each as drafted alone\n",
                   cfg.c_str() + 1, temp, drafted);
      assert_true(drafted > 0);
      for (int i = 0; i < kN; ++i) {
        assert_int_equal(specinfer_drafter_destroy(together[i]), SPECINFER_OK);
        assert_int_equal(specinfer_drafter_destroy(alone[i]), SPECINFER_OK);
      }
    }
  }
  specinfer_coupler_destroy(gumbel);
  own.close();
  if (!warnings.empty()) std::fprintf(stderr, "%s\n", warnings.c_str());
  assert_true(warnings.empty());
}

// draft-model's trees (tree=1) against the pass costs a request carries: where nodes cost
// nothing the tree fills the budget (max_tokens, every size from 1 to 8) and holds siblings
// (distinct tokens under one parent); where a node costs 100 passes, no node pays (a node adds at
// most one expected token, and the round without it costs at most 3 passes: the draft's measured
// time is capped at 2); at a moderate cost the tree is no larger than with free nodes; with
// allow_tree = 0 it is a chain.
void test_draft_model_trees(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *d = open_drafter(e, "draft-model:path=" + g_draft + ",tree=1,p_min=0");
  const int32_t vocab = e->target->info().vocab_size;
  std::vector<int32_t> ctx = e->target->tokenize(kPrompts[2], std::strlen(kPrompts[2]), true, true);
  d->begin(ctx.data(), ctx.size());
  constexpr int32_t kMost = 8;
  std::vector<int32_t> tokens(kMost), parents(kMost);
  std::vector<float> cost(kMost + 1);
  auto draft = [&](int32_t max_tokens, float step, int32_t allow_tree) {
    for (int32_t i = 0; i <= kMost; ++i) cost[static_cast<size_t>(i)] = 1.0f + step * i;
    specinfer_draft_request r{};
    r.struct_size = sizeof r;
    r.max_tokens = max_tokens;
    r.allow_tree = allow_tree;
    r.context = ctx.data();
    r.n_context = ctx.size();
    r.hidden_position = -1;
    r.pass_cost = cost.data();
    r.n_pass_cost = max_tokens + 1;
    specinfer_draft o = draft_into(tokens.data(), parents.data(), kMost, vocab);
    d->propose(r, o);  // the host's checks: node count, tokens, parent links
    assert_int_equal(o.has_probs, 0);
    return o.n_nodes;
  };
  for (int32_t most = 1; most <= kMost; ++most) {
    const int32_t n = draft(most, 0.0f, 1);
    assert_int_equal(n, most);
    bool siblings = false;
    for (int32_t a = 0; a < n; ++a)
      for (int32_t b = a + 1; b < n; ++b)
        if (parents[static_cast<size_t>(a)] == parents[static_cast<size_t>(b)]) {
          siblings = true;
          assert_int_not_equal(tokens[static_cast<size_t>(a)], tokens[static_cast<size_t>(b)]);
        }
    // The model's path is 4 rows deep (max_draft), so 5 nodes or more need siblings.
    if (most > 4) assert_true(siblings);
  }
  const int32_t free_nodes = draft(kMost, 0.0f, 1);
  assert_int_equal(draft(kMost, 100.0f, 1), 0);
  const int32_t moderate = draft(kMost, 0.1f, 1);
  assert_true(moderate <= free_nodes);
  const int32_t chain = draft(kMost, 0.0f, 0);
  assert_int_equal(chain, 4);
  for (int32_t j = 0; j < chain; ++j) assert_int_equal(parents[static_cast<size_t>(j)], j - 1);
  std::fprintf(stderr, "draft-model trees: %d nodes free, %d at 0.1 pass per node, chain %d\n",
               free_nodes, moderate, chain);
  assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
}

// The accepted length each drafter expects per round, against what the target kept, in the
// session's statistics: every drafting round of the draft model's greedy chains and trees and of
// ngram carries an estimate (at most the nodes drafted); the draft model's sampled chains give
// none.
void test_expected_accepted(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  struct Case {
    std::string spec;
    float temp;
    bool estimates;
    // ngram drafts only where the text repeats itself: the short text of a sanitized run may
    // have no draft to estimate.
    bool may_draft_nothing;
  };
  const Case cases[] = {{"draft-model:path=" + g_draft, 0.0f, true, false},
                        {"draft-model:path=" + g_draft + ",tree=1", 0.0f, true, false},
                        {"draft-model:path=" + g_draft, 1.0f, false, false},
                        {"ngram", 0.0f, true, true}};
  for (const Case &c : cases) {
    specinfer_drafter *d = open_drafter(e, c.spec);
    specinfer_session_stats st;
    run(e, d, c.temp > 0 ? "rejection" : nullptr, c.temp, 9, kPrompts[0], g_tokens, &st);
    std::fprintf(
        stderr,
        "%s T=%.0f: %lld of %lld rounds estimated; expected %.2f accepted per round, "
        "kept %.2f\n",
        c.spec.c_str(), c.temp, (long long)st.n_estimated_rounds, (long long)st.n_rounds,
        st.n_estimated_rounds ? st.expected_accepted / st.n_estimated_rounds : 0.0,
        st.n_estimated_rounds ? st.estimated_rounds_accepted / st.n_estimated_rounds : 0.0);
    if (c.estimates && (st.n_drafted > 0 || !c.may_draft_nothing)) {
      assert_true(st.n_estimated_rounds > 0);
      assert_true(st.n_estimated_rounds <= st.n_rounds);
      assert_true(st.expected_accepted > 0);
      assert_true(st.expected_accepted <= static_cast<double>(st.n_drafted));
      assert_true(st.estimated_rounds_accepted <= static_cast<double>(st.n_accepted));
    } else if (!c.estimates) {
      assert_int_equal(st.n_estimated_rounds, 0);
      assert_true(st.expected_accepted == 0.0);
    }
    assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
  }
}

void test_bad_configs(void **state) {
  skip_without_models(state);
  auto *e = static_cast<Env *>(*state);
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  // Unknown key, missing file, and a model with another vocabulary (Gemma) when it is there.
  assert_int_equal(
      specinfer_drafter_open(e->reg, "draft-model", "path=x.gguf,bogus=1", e->target, &d, &err),
      SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  err = nullptr;
  assert_int_equal(
      specinfer_drafter_open(e->reg, "draft-model", "path=x.gguf,stage=17", e->target, &d, &err),
      SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  err = nullptr;
  assert_int_equal(
      specinfer_drafter_open(e->reg, "draft-model", "path=x.gguf,window=-1", e->target, &d, &err),
      SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  err = nullptr;
  for (const char *bad : {"path=x.gguf,tree=2", "path=x.gguf,tree=1,branch=9"}) {
    assert_int_equal(specinfer_drafter_open(e->reg, "draft-model", bad, e->target, &d, &err),
                     SPECINFER_ERR_CONFIG);
    specinfer_free(err);
    err = nullptr;
  }
  assert_int_equal(specinfer_drafter_open(e->reg, "draft-model", "path=x.gguf,stage_n_min=6",
                                          e->target, &d, &err),
                   SPECINFER_ERR_CONFIG);
  specinfer_free(err);
  err = nullptr;
  assert_int_not_equal(
      specinfer_drafter_open(e->reg, "draft-model", "path=/nonexistent.gguf", e->target, &d, &err),
      SPECINFER_OK);
  assert_non_null(err);
  specinfer_free(err);
  err = nullptr;
  std::string gemma = std::string(models_dir()) + "/gemma-3-270m.gguf";
  if (is_regular_file(gemma.c_str())) {
    std::string cfg = "path=" + gemma;
    assert_int_equal(
        specinfer_drafter_open(e->reg, "draft-model", cfg.c_str(), e->target, &d, &err),
        SPECINFER_ERR_UNSUPPORTED);
    assert_non_null(std::strstr(err, "vocabulary"));
    specinfer_free(err);
  }
}

}  // namespace

int main(void) {
  std::string dir = models_dir();
  g_sanitized = std::getenv("SPECINFER_SANITIZED") &&
                std::strcmp(std::getenv("SPECINFER_SANITIZED"), "1") == 0;
  std::string big = dir + "/qwen2.5-coder-1.5b.gguf", small = dir + "/qwen2.5-coder-0.5b.gguf";
  if (is_regular_file(small.c_str()) && (g_sanitized || is_regular_file(big.c_str()))) {
    g_draft = small;
    g_target = g_sanitized ? small : big;
    g_tokens = g_sanitized ? 8 : 24;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_equals_plain),
      cmocka_unit_test(test_gumbel_equals_plain),
      cmocka_unit_test(test_rollback_logits),
      cmocka_unit_test(test_logprobs_equal_plain),
      cmocka_unit_test(test_prompt_logprobs_equal_plain),
      cmocka_unit_test(test_draft_model_follows_text),
      cmocka_unit_test(test_staged_drafts_unchanged),
      cmocka_unit_test(test_batched_drafts_equal_lone),
      cmocka_unit_test(test_draft_model_trees),
      cmocka_unit_test(test_expected_accepted),
      cmocka_unit_test(test_bad_configs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
