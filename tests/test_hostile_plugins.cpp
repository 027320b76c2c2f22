// Plugins that break the plugin ABI's rules, registered in-process through the public ABI: each
// misbehaviour must reach the application as a clear status and a message naming the problem,
// never a crash, a hang or wrong text. After the failing call the same session goes on (the
// plugin behaves again) and its whole text equals that of plain decoding with the same settings
// (greedy, and Gumbel-coupled sampling, which is drafter-invariant at a fixed seed).
//  - drafters: tokens outside the vocabulary, more nodes than the room given, a negative count,
//    forward / self / below -1 parent links, q rows with NaN, +inf, negative or unnormalized
//    probabilities or none on the node's token, an expected accepted length that is NaN or more
//    than the nodes, an error with no message or with a message that
//    fills the buffer without a NUL, an unknown status, exceptions thrown from propose and begin;
//  - targets (a kgram target wrapped by a plugin that corrupts what it returns): NaN / +inf
//    logits and rows of only -inf (a -inf here and there is allowed: kgram's unseen bytes), a
//    KV cache whose size disagrees with what was fed, an error with no message or unterminated,
//    an unknown status, an exception, model info with a bad vocabulary size or special token,
//    share() giving back the instance itself or none, and forward_many with a NaN in one
//    sequence's logits (every session of the pass fails, then all go on with the right text);
//  - drafting for several drafters at once (propose_many): an unknown status for one drafter
//    (that session alone fails), an exception out of the call (every session of it fails).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/test_util.h"

namespace {

constexpr const char *kCorpus = "abi/specinfer.h";
constexpr const char *kPrompt = "SPECINFER_API specinfer_status specinfer_";
constexpr int kTokens = 48;

// ---------------------------------------------------------------------------------------------
// A drafter that behaves, except at one propose call (g_bad_call) where it does g_dmode.
// ---------------------------------------------------------------------------------------------

enum class D {
  good,
  oov,
  negative_token,
  too_many,
  negative_count,
  forward_parent,
  self_parent,
  parent_below,
  nan_q,
  inf_q,
  negative_q,
  unnormalized_q,
  zero_q,
  nan_expected,
  big_expected,
  no_message,
  unterminated,
  unknown_status,
  throws,
  throws_int,
  throws_in_begin,
};

D g_dmode = D::good;
int g_propose_calls = 0;
constexpr int kBadCall = 2;  // rounds 0 and 1 behave: the failure comes mid-generation

specinfer_status d_begin(void *, const int32_t *, size_t, specinfer_plugin_error *) {
  if (g_dmode == D::throws_in_begin && g_propose_calls == 0) {
    g_propose_calls = 1;  // throw once
    throw std::runtime_error("begin went wrong");
  }
  return SPECINFER_OK;
}

// A chain of up to 3 nodes drawn through the session's sampler from a uniform q.
specinfer_status d_propose(void *, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  const D m = g_propose_calls++ == kBadCall ? g_dmode : D::good;
  const int32_t vocab = out->vocab_size;
  const int32_t n = std::min(std::min(req->max_tokens, out->cap), 3);
  for (int32_t i = 0; i < n; ++i) {
    float *q = out->probs + static_cast<size_t>(i) * vocab;
    for (int32_t j = 0; j < vocab; ++j) q[j] = 1.0f / static_cast<float>(vocab);
    out->tokens[i] =
        req->sample(req->sample_ctx, q, vocab, static_cast<int64_t>(req->n_context) + i);
    out->parents[i] = i - 1;
  }
  out->n_nodes = n;
  out->has_probs = 1;
  float *q0 = out->probs;
  switch (m) {
    case D::good:
    case D::throws_in_begin:
      break;
    case D::oov:
      out->tokens[n - 1] = vocab;
      break;
    case D::negative_token:
      out->tokens[0] = -5;
      break;
    case D::too_many:
      out->n_nodes = out->cap + 1;
      break;
    case D::negative_count:
      out->n_nodes = -1;
      break;
    case D::forward_parent:
      out->parents[0] = 1;
      break;
    case D::self_parent:
      out->parents[1] = 1;
      break;
    case D::parent_below:
      out->parents[1] = -2;
      break;
    case D::nan_q:
      q0[7] = NAN;
      break;
    case D::nan_expected:
      out->expected_accepted = NAN;
      break;
    case D::big_expected:
      out->expected_accepted = n + 0.5;
      break;
    case D::inf_q:
      q0[7] = INFINITY;
      break;
    case D::negative_q:
      q0[7] = -0.25f;
      q0[8] += 0.25f + 1.0f / static_cast<float>(vocab);
      break;
    case D::unnormalized_q:
      for (int32_t j = 0; j < vocab; ++j) q0[j] *= 2.0f;
      break;
    case D::zero_q: {
      const int32_t t = out->tokens[0], other = (t + 1) % vocab;
      q0[other] += q0[t];
      q0[t] = 0.0f;
      break;
    }
    case D::no_message:
      return SPECINFER_ERR_IO;
    case D::unterminated:
      std::memset(err->message, 'x', sizeof err->message);
      return SPECINFER_ERR_FORMAT;
    case D::unknown_status:
      return static_cast<specinfer_status>(1234);
    case D::throws:
      throw std::runtime_error("propose went wrong");
    case D::throws_int:
      throw 42;
  }
  return SPECINFER_OK;
}

specinfer_status d_commit(void *, const int32_t *, size_t, specinfer_plugin_error *) {
  return SPECINFER_OK;
}

void d_destroy(void *) {}

const specinfer_drafter_vtable kHostileDrafterVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, nullptr};

// The same drafter drafting for several at once (propose_many, config "many"): each draft as
// propose makes it, except at one call (g_bad_many) where it does g_mmode.
enum class M { good, unknown_status, throws };
M g_mmode = M::good;
int g_many_calls = 0, g_bad_many = 2;

specinfer_status d_propose_many(void *const *selves, const specinfer_draft_request *reqs,
                                specinfer_draft *outs, int32_t n, specinfer_status *status,
                                specinfer_plugin_error *errs) {
  const M m = g_many_calls++ == g_bad_many ? g_mmode : M::good;
  if (m == M::throws) throw std::runtime_error("propose_many went wrong");
  specinfer_status rc = SPECINFER_OK;
  for (int32_t i = 0; i < n; ++i) {
    const specinfer_status st = d_propose(selves[i], &reqs[i], &outs[i], &errs[i]);
    if (m == M::unknown_status && i == n - 1) {  // the last drafter's draft goes wrong
      std::snprintf(errs[i].message, sizeof errs[i].message, "its own words");
      const int unknown = -7;  // stored as an int: no value of the enum, never loaded as one
      std::memcpy(&status[i], &unknown, sizeof unknown);
      rc = SPECINFER_ERR_PLUGIN;
      continue;
    }
    status[i] = st;
    if (st != SPECINFER_OK) rc = SPECINFER_ERR_PLUGIN;
  }
  return rc;
}

const specinfer_drafter_vtable kHostileManyVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, d_propose_many};

int g_drafter_self;

specinfer_status d_create(const specinfer_host *, const char *config, const specinfer_model_info *,
                          const specinfer_host_target *, void **self,
                          const specinfer_drafter_vtable **vt, specinfer_plugin_error *) {
  *self = &g_drafter_self;
  *vt = std::strcmp(config, "many") == 0 ? &kHostileManyVtable : &kHostileDrafterVtable;
  return SPECINFER_OK;
}

// ---------------------------------------------------------------------------------------------
// A target: kgram (opened through the host) wrapped, corrupting what it returns at one forward
// call (g_bad_forward, counted over all instances) as g_tmode says, or its info as g_imode says.
// ---------------------------------------------------------------------------------------------

enum class T {
  good,
  nan_logit,
  inf_logit,
  all_neg_inf,
  kv_lies,
  no_message,
  unterminated,
  unknown_status,
  throws,
  share_self,
  share_none,
};
enum class I { good, vocab_zero, vocab_huge, eos_outside, hidden_negative };

T g_tmode = T::good;
I g_imode = I::good;
int g_forwards = 0;
int g_bad_forward = 3;  // the prompt's pass and two rounds behave
bool g_kv_lying = false;

struct Wrapped {
  const specinfer_host *host;
  specinfer_host_target inner;
  bool from_host;  // opened through host->open_target (else a share of one)
};

Wrapped *W(void *self) {
  return static_cast<Wrapped *>(self);
}

void t_destroy(void *self) {
  Wrapped *w = W(self);
  if (w->from_host)
    w->host->close_target(w->host, &w->inner);
  else
    w->inner.vtable->destroy(w->inner.self);
  delete w;
}

specinfer_status t_info(void *self, specinfer_model_info *info) {
  Wrapped *w = W(self);
  specinfer_status rc = w->inner.vtable->info(w->inner.self, info);
  switch (g_imode) {
    case I::good:
      break;
    case I::vocab_zero:
      info->vocab_size = 0;
      break;
    case I::vocab_huge:
      info->vocab_size = 1 << 30;
      break;
    case I::eos_outside:
      info->eos_token = info->vocab_size;
      break;
    case I::hidden_negative:
      info->hidden_size = -4;
      break;
  }
  return rc;
}

specinfer_status t_tokenize(void *self, const char *text, size_t len, int32_t add_special,
                            int32_t parse_special, int32_t *tokens, size_t cap, size_t *n_tokens,
                            specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  return w->inner.vtable->tokenize(w->inner.self, text, len, add_special, parse_special, tokens,
                                   cap, n_tokens, err);
}

specinfer_status t_token_bytes(void *self, int32_t token, char *buf, size_t cap, size_t *n,
                               specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  return w->inner.vtable->token_bytes(w->inner.self, token, buf, cap, n, err);
}

// What the target does to a pass's results at the bad call; a status to return.
specinfer_status corrupt(const specinfer_forward_batch *b, int32_t vocab,
                         specinfer_plugin_error *err) {
  if (g_forwards++ != g_bad_forward) return SPECINFER_OK;
  float *last =
      b->n_logits > 0 ? b->logits + static_cast<size_t>(b->n_logits - 1) * vocab : nullptr;
  switch (g_tmode) {
    case T::nan_logit:
      if (last) last[17] = NAN;
      break;
    case T::inf_logit:
      if (last) last[17] = INFINITY;
      break;
    case T::all_neg_inf:
      if (last)
        for (int32_t j = 0; j < vocab; ++j) last[j] = -INFINITY;
      break;
    case T::kv_lies:
      g_kv_lying = true;
      break;
    case T::no_message:
      return SPECINFER_ERR_IO;
    case T::unterminated:
      std::memset(err->message, 'y', sizeof err->message);
      return SPECINFER_ERR_FORMAT;
    case T::unknown_status:
      return static_cast<specinfer_status>(-3);
    case T::throws:
      throw std::runtime_error("forward went wrong");
    default:
      break;
  }
  return SPECINFER_OK;
}

int32_t vocab_of(const Wrapped *w) {
  specinfer_model_info info{};
  info.struct_size = sizeof info;
  w->inner.vtable->info(w->inner.self, &info);
  return info.vocab_size;
}

specinfer_status t_forward(void *self, const specinfer_forward_batch *b,
                           specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  specinfer_status rc = w->inner.vtable->forward(w->inner.self, b, err);
  if (rc != SPECINFER_OK) return rc;
  return corrupt(b, vocab_of(w), err);
}

int32_t t_kv_size(void *self) {
  Wrapped *w = W(self);
  const int32_t n = w->inner.vtable->kv_size(w->inner.self);
  return g_kv_lying ? n + 1 : n;
}

specinfer_status t_kv_truncate(void *self, int32_t n_keep, specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  g_kv_lying = false;  // a lie told once: the cut-back after the failed pass tells the truth
  return w->inner.vtable->kv_truncate(w->inner.self, n_keep, err);
}

specinfer_status t_kv_keep(void *self, int32_t base, const int32_t *idx, int32_t n,
                           specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  return w->inner.vtable->kv_keep(w->inner.self, base, idx, n, err);
}

specinfer_status t_share(void *self, void **out, specinfer_plugin_error *err) {
  Wrapped *w = W(self);
  if (g_tmode == T::share_self) {
    *out = self;
    return SPECINFER_OK;
  }
  if (g_tmode == T::share_none) {
    *out = nullptr;
    return SPECINFER_OK;
  }
  void *other = nullptr;
  specinfer_status rc = w->inner.vtable->share(w->inner.self, &other, err);
  if (rc != SPECINFER_OK) return rc;
  *out = new Wrapped{w->host, {other, w->inner.vtable, nullptr}, false};
  return SPECINFER_OK;
}

specinfer_status t_forward_many(void *const *selves, const specinfer_forward_batch *batches,
                                int32_t n, specinfer_plugin_error *err) {
  std::vector<void *> inner(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) inner[static_cast<size_t>(i)] = W(selves[i])->inner.self;
  const Wrapped *w0 = W(selves[0]);
  specinfer_status rc = w0->inner.vtable->forward_many(inner.data(), batches, n, err);
  if (rc != SPECINFER_OK) return rc;
  return corrupt(&batches[n - 1], vocab_of(w0), err);  // one sequence of the pass goes wrong
}

const specinfer_target_vtable kHostileTargetVtable = {
    sizeof(specinfer_target_vtable),
    t_destroy,
    t_info,
    t_tokenize,
    t_token_bytes,
    t_forward,
    t_kv_size,
    t_kv_truncate,
    t_kv_keep,
    nullptr,  // output_rows
    t_share,
    t_forward_many,
    nullptr,  // kv_copy
};

specinfer_status t_create(const specinfer_host *host, const char *config, void **self,
                          const specinfer_target_vtable **vt, specinfer_plugin_error *err) {
  auto *w = new Wrapped{host, {}, true};
  specinfer_status rc = host->open_target(host, "kgram", config, &w->inner, err);
  if (rc != SPECINFER_OK) {
    delete w;
    return rc;
  }
  *self = w;
  *vt = &kHostileTargetVtable;
  return SPECINFER_OK;
}

const specinfer_drafter_factory kDrafterFactory = {sizeof(specinfer_drafter_factory), d_create,
                                                   nullptr};
const specinfer_target_factory kTargetFactory = {sizeof(specinfer_target_factory), t_create};

const void *get_factory(const char *id) {
  if (std::strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) == 0) return &kDrafterFactory;
  if (std::strcmp(id, SPECINFER_TARGET_FACTORY_ID) == 0) return &kTargetFactory;
  return nullptr;
}

const specinfer_plugin_descriptor kHostilePlugin = {SPECINFER_PLUGIN_ABI_VERSION,
                                                    sizeof(specinfer_plugin_descriptor),
                                                    "hostile",
                                                    "1",
                                                    "plugins that break the rules, for tests",
                                                    nullptr,
                                                    nullptr,
                                                    get_factory};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

struct Env {
  specinfer_registry *reg = nullptr;
  specinfer_target *plain = nullptr;  // kgram itself: the reference texts
  specinfer_coupler *gumbel = nullptr;

  Env() {
    reg = new_registry();
    assert_int_equal(specinfer_registry_register_plugin(reg, &kHostilePlugin, nullptr),
                     SPECINFER_OK);
    plain = open_kgram(reg, kCorpus, 6);
    assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  }
  ~Env() {
    specinfer_coupler_destroy(gumbel);
    assert_int_equal(specinfer_target_destroy(plain), SPECINFER_OK);
    assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
  }
};

std::string target_config() {
  return kgram_config(kCorpus, "k=6");
}

specinfer_session_params params_for(bool sampled) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 4;
  p.adaptive_draft = 0;
  if (sampled) {
    p.temperature = 0.8f;
    p.seed = 7;
  }
  return p;
}

std::vector<int32_t> tokens_of(specinfer_session *s) {
  const int32_t *t = nullptr;
  size_t n = 0;
  assert_int_equal(specinfer_session_tokens(s, &t, &n), SPECINFER_OK);
  return std::vector<int32_t>(t, t + n);
}

std::vector<int32_t> reference(Env &env, bool sampled) {
  const specinfer_session_params p = params_for(sampled);
  specinfer_session *s = nullptr;
  assert_int_equal(
      specinfer_session_create(env.plain, nullptr, sampled ? env.gumbel : nullptr, &p, &s, nullptr),
      SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, kPrompt, std::strlen(kPrompt)), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, kTokens, nullptr, nullptr), SPECINFER_OK);
  std::vector<int32_t> out = tokens_of(s);
  specinfer_session_destroy(s);
  return out;
}

void expect_prefix(const std::vector<int32_t> &got, const std::vector<int32_t> &ref,
                   const char *what) {
  bool ok = got.size() <= ref.size() && std::equal(got.begin(), got.end(), ref.begin());
  if (!ok) std::fprintf(stderr, "%s: the text differs from plain decoding\n", what);
  assert_true(ok);
}

// Generates kTokens with session `s`: the first call must fail with `status` and a message
// holding `needle` (being it, when `exact`), and not emit wrong tokens; calls after it must
// finish the text of `ref`.
void expect_failure_then_recovery(specinfer_session *s, const std::vector<int32_t> &ref,
                                  specinfer_status status, const char *needle, const char *what,
                                  bool exact = false) {
  const specinfer_status rc = specinfer_session_generate(s, kTokens, nullptr, nullptr);
  const std::string msg = specinfer_session_errmsg(s);
  if (exact) assert_true(msg == needle);  // an unterminated message: all of it, not a byte more
  if (rc != status || msg.find(needle) == std::string::npos)
    std::fprintf(stderr, "%s: got %s \"%s\", wanted %s with \"%s\"\n", what,
                 specinfer_status_str(rc), msg.c_str(), specinfer_status_str(status), needle);
  assert_int_equal(rc, status);
  assert_non_null(std::strstr(msg.c_str(), needle));
  expect_prefix(tokens_of(s), ref, what);
  // The plugin behaves from here on: the session goes on to the text of plain decoding.
  for (int guard = 0; guard < 4 && tokens_of(s).size() < ref.size(); ++guard) {
    const int32_t left = static_cast<int32_t>(ref.size() - tokens_of(s).size());
    const specinfer_status again = specinfer_session_generate(s, left, nullptr, nullptr);
    if (again != SPECINFER_OK)
      std::fprintf(stderr, "%s: after the failure: %s\n", what, specinfer_session_errmsg(s));
    assert_int_equal(again, SPECINFER_OK);
  }
  const std::vector<int32_t> got = tokens_of(s);
  assert_int_equal(got.size(), ref.size());
  expect_prefix(got, ref, what);
}

struct DrafterCase {
  D mode;
  specinfer_status status;
  const char *needle;
  const char *name;
};

void test_hostile_drafters(void **) {
  Env env;
  const std::string unterminated = "drafter propose: " + std::string(512, 'x');
  const DrafterCase cases[] = {
      {D::good, SPECINFER_OK, "", "good"},
      {D::oov, SPECINFER_ERR_PLUGIN, "outside the vocabulary", "token = vocab"},
      {D::negative_token, SPECINFER_ERR_PLUGIN, "token -5 outside the vocabulary", "token -5"},
      {D::too_many, SPECINFER_ERR_PLUGIN, "proposed 5 nodes with room for 4", "n_nodes > cap"},
      {D::negative_count, SPECINFER_ERR_PLUGIN, "proposed -1 nodes", "n_nodes < 0"},
      {D::forward_parent, SPECINFER_ERR_PLUGIN, "node 0 has parent 1", "forward parent"},
      {D::self_parent, SPECINFER_ERR_PLUGIN, "node 1 has parent 1", "cycle"},
      {D::parent_below, SPECINFER_ERR_PLUGIN, "node 1 has parent -2", "parent -2"},
      {D::nan_q, SPECINFER_ERR_PLUGIN, "q[7] is NaN", "NaN q"},
      {D::inf_q, SPECINFER_ERR_PLUGIN, "sum to inf", "+inf q"},
      {D::negative_q, SPECINFER_ERR_PLUGIN, "q[7] is negative", "negative q"},
      {D::unnormalized_q, SPECINFER_ERR_PLUGIN, "sum to 2, not 1", "q sums to 2"},
      {D::zero_q, SPECINFER_ERR_PLUGIN, "has probability 0 in its own q", "q(token) = 0"},
      {D::nan_expected, SPECINFER_ERR_PLUGIN, "drafter expects nan of its 3 nodes", "expected NaN"},
      {D::big_expected, SPECINFER_ERR_PLUGIN, "drafter expects 3.5 of its 3 nodes",
       "expected > nodes"},
      {D::no_message, SPECINFER_ERR_IO,
       "drafter propose: the plugin failed with SPECINFER_ERR_IO and no message", "no message"},
      {D::unterminated, SPECINFER_ERR_FORMAT, unterminated.c_str(), "unterminated message"},
      {D::unknown_status, SPECINFER_ERR_PLUGIN,
       "drafter propose: the plugin returned unknown status 1234", "unknown status"},
      {D::throws, SPECINFER_ERR_PLUGIN, "drafter propose: the plugin threw (propose went wrong)",
       "throws"},
      {D::throws_int, SPECINFER_ERR_PLUGIN,
       "drafter propose: the plugin threw (an exception of unknown type)", "throws an int"},
      {D::throws_in_begin, SPECINFER_ERR_PLUGIN,
       "drafter begin: the plugin threw (begin went wrong)", "begin throws"},
  };
  for (bool sampled : {false, true}) {
    const std::vector<int32_t> ref = reference(env, sampled);
    assert_int_equal(ref.size(), std::strlen(kPrompt) + kTokens);
    const specinfer_session_params p = params_for(sampled);
    for (const DrafterCase &c : cases) {
      specinfer_drafter *d = open_drafter(env.reg, env.plain, "hostile", "");
      specinfer_session *s = nullptr;
      assert_int_equal(
          specinfer_session_create(env.plain, d, sampled ? env.gumbel : nullptr, &p, &s, nullptr),
          SPECINFER_OK);
      assert_int_equal(specinfer_session_feed_text(s, kPrompt, std::strlen(kPrompt)), SPECINFER_OK);
      g_dmode = c.mode;
      g_propose_calls = 0;
      const std::string what = std::string(c.name) + (sampled ? " (gumbel, T=0.8)" : " (greedy)");
      if (c.mode == D::good) {
        assert_int_equal(specinfer_session_generate(s, kTokens, nullptr, nullptr), SPECINFER_OK);
        assert_true(tokens_of(s) == ref);
      } else {
        expect_failure_then_recovery(s, ref, c.status, c.needle, what.c_str(),
                                     c.mode == D::unterminated);
      }
      g_dmode = D::good;
      specinfer_session_destroy(s);
      assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
    }
  }
}

struct TargetCase {
  T mode;
  specinfer_status status;
  const char *needle;
  const char *name;
};

specinfer_target *open_hostile_target(Env &env) {
  specinfer_target *t = nullptr;
  char *err = nullptr;
  const specinfer_status rc =
      specinfer_target_open(env.reg, "hostile", target_config().c_str(), &t, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "hostile target: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  specinfer_free(err);
  return t;
}

void test_hostile_targets(void **) {
  Env env;
  const std::string unterminated = "forward: " + std::string(512, 'y');
  const TargetCase cases[] = {
      {T::good, SPECINFER_OK, "", "good"},
      {T::nan_logit, SPECINFER_ERR_PLUGIN, "forward: the target returned a NaN logit (row", "NaN"},
      {T::inf_logit, SPECINFER_ERR_PLUGIN, "forward: the target returned a +inf logit (row",
       "+inf"},
      {T::all_neg_inf, SPECINFER_ERR_PLUGIN, "a row of logits that are all -inf", "all -inf"},
      {T::kv_lies, SPECINFER_ERR_PLUGIN, "forward: the target's cache holds", "kv_size lies"},
      {T::no_message, SPECINFER_ERR_IO,
       "forward: the plugin failed with SPECINFER_ERR_IO and no message", "no message"},
      {T::unterminated, SPECINFER_ERR_FORMAT, unterminated.c_str(), "unterminated message"},
      {T::unknown_status, SPECINFER_ERR_PLUGIN, "forward: the plugin returned unknown status -3",
       "unknown status"},
      {T::throws, SPECINFER_ERR_PLUGIN, "forward: the plugin threw (forward went wrong)", "throws"},
  };
  for (bool sampled : {false, true}) {
    const std::vector<int32_t> ref = reference(env, sampled);
    const specinfer_session_params p = params_for(sampled);
    for (const TargetCase &c : cases) {
      for (bool drafting : {false, true}) {
        specinfer_target *t = open_hostile_target(env);
        specinfer_drafter *d = drafting ? open_drafter(env.reg, t, "ngram", "n_max=3") : nullptr;
        specinfer_session *s = nullptr;
        assert_int_equal(
            specinfer_session_create(t, d, sampled ? env.gumbel : nullptr, &p, &s, nullptr),
            SPECINFER_OK);
        assert_int_equal(specinfer_session_feed_text(s, kPrompt, std::strlen(kPrompt)),
                         SPECINFER_OK);
        g_tmode = c.mode;
        g_forwards = 0;
        const std::string what = std::string(c.name) +
                                 (sampled ? " (gumbel, T=0.8)" : " (greedy)") +
                                 (drafting ? ", ngram drafter" : "");
        if (c.mode == T::good) {
          assert_int_equal(specinfer_session_generate(s, kTokens, nullptr, nullptr), SPECINFER_OK);
          assert_true(tokens_of(s) == ref);
        } else {
          expect_failure_then_recovery(s, ref, c.status, c.needle, what.c_str(),
                                       c.mode == T::unterminated);
        }
        g_tmode = T::good;
        g_kv_lying = false;
        specinfer_session_destroy(s);
        assert_int_equal(specinfer_drafter_destroy(d), SPECINFER_OK);
        assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
      }
    }
  }
}

void test_hostile_target_info(void **) {
  Env env;
  const struct {
    I mode;
    const char *needle;
  } cases[] = {
      {I::vocab_zero, "(vocabulary size: vocab 0,"},
      {I::vocab_huge, "(vocabulary size: vocab 1073741824,"},
      {I::eos_outside, "(eos token: vocab 256,"},
      {I::hidden_negative, "(hidden size: vocab 256,"},
  };
  for (const auto &c : cases) {
    g_imode = c.mode;
    specinfer_target *t = nullptr;
    char *err = nullptr;
    assert_int_equal(specinfer_target_open(env.reg, "hostile", target_config().c_str(), &t, &err),
                     SPECINFER_ERR_PLUGIN);
    assert_null(t);
    assert_non_null(err);
    if (!std::strstr(err, c.needle)) std::fprintf(stderr, "info: \"%s\"\n", err);
    assert_non_null(std::strstr(err, "target plugin gave no valid model info"));
    assert_non_null(std::strstr(err, c.needle));
    specinfer_free(err);
  }
  g_imode = I::good;
}

void test_hostile_share(void **) {
  Env env;
  specinfer_target *t = open_hostile_target(env);
  const struct {
    T mode;
    const char *needle;
  } cases[] = {{T::share_self, "share: the plugin returned the instance it was asked to share"},
               {T::share_none, "share: the plugin returned no instance"}};
  for (const auto &c : cases) {
    g_tmode = c.mode;
    specinfer_target *other = nullptr;
    char *err = nullptr;
    assert_int_equal(specinfer_target_share(t, &other, &err), SPECINFER_ERR_PLUGIN);
    assert_null(other);
    assert_non_null(err);
    assert_non_null(std::strstr(err, c.needle));
    specinfer_free(err);
  }
  g_tmode = T::good;
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
}

// Two sessions on shared hostile targets stepped together (one forward_many per round); a NaN in
// the second sequence's logits fails the pass for both, and both then finish with the right text.
void test_hostile_forward_many(void **) {
  Env env;
  for (bool sampled : {false, true}) {
    const std::vector<int32_t> ref = reference(env, sampled);
    const specinfer_session_params p = params_for(sampled);
    specinfer_target *t[2] = {open_hostile_target(env), nullptr};
    assert_int_equal(specinfer_target_share(t[0], &t[1], nullptr), SPECINFER_OK);
    specinfer_session *s[2] = {nullptr, nullptr};
    for (int i = 0; i < 2; ++i) {
      assert_int_equal(specinfer_session_create(t[i], nullptr, sampled ? env.gumbel : nullptr, &p,
                                                &s[i], nullptr),
                       SPECINFER_OK);
      assert_int_equal(specinfer_session_feed_text(s[i], kPrompt, std::strlen(kPrompt)),
                       SPECINFER_OK);
    }
    g_tmode = T::nan_logit;
    g_forwards = 0;
    g_bad_forward = 2;
    int failed_calls = 0;
    int32_t buf[2][8];
    for (int call = 0; call < 4 * kTokens && tokens_of(s[0]).size() < ref.size(); ++call) {
      specinfer_step_result r[2]{};
      for (int i = 0; i < 2; ++i) {
        r[i].struct_size = sizeof r[i];
        r[i].tokens = buf[i];
        r[i].cap = 8;
      }
      const specinfer_status rc = specinfer_session_step_many(s, r, 2, nullptr);
      if (rc != SPECINFER_OK) {
        ++failed_calls;
        for (int i = 0; i < 2; ++i) {
          assert_int_equal(r[i].status, SPECINFER_ERR_PLUGIN);
          assert_non_null(std::strstr(specinfer_session_errmsg(s[i]),
                                      "forward_many: the target returned a NaN logit"));
        }
      }
      for (int i = 0; i < 2; ++i) expect_prefix(tokens_of(s[i]), ref, "forward_many");
    }
    g_tmode = T::good;
    g_bad_forward = 3;
    assert_int_equal(failed_calls, 1);
    for (int i = 0; i < 2; ++i) {
      std::vector<int32_t> got = tokens_of(s[i]);
      assert_true(got.size() >= ref.size());
      got.resize(ref.size());  // a last round may emit past the end
      expect_prefix(got, ref, "forward_many");
      specinfer_session_destroy(s[i]);
    }
    assert_int_equal(specinfer_target_destroy(t[0]), SPECINFER_OK);
    assert_int_equal(specinfer_target_destroy(t[1]), SPECINFER_OK);
  }
}

// Two sessions on shares of one target with drafters of one plugin, stepped together: their
// drafts come from one propose_many call. An unknown status for one drafter fails that session
// alone, its value and the plugin's message named; an exception out of the call fails both. Then
// both finish with the text of plain decoding.
void test_hostile_propose_many(void **) {
  Env env;
  struct {
    M mode;
    const char *needle[2];
  } cases[] = {
      {M::unknown_status,
       {nullptr, "drafter propose: the plugin returned unknown status -7: its own words"}},
      {M::throws,
       {"drafter propose_many: the plugin threw (propose_many went wrong)",
        "drafter propose_many: the plugin threw (propose_many went wrong)"}},
  };
  for (bool sampled : {false, true}) {
    const std::vector<int32_t> ref = reference(env, sampled);
    const specinfer_session_params p = params_for(sampled);
    for (const auto &c : cases) {
      specinfer_target *t[2] = {nullptr, nullptr};
      specinfer_drafter *d[2] = {nullptr, nullptr};
      specinfer_session *s[2] = {nullptr, nullptr};
      for (int i = 0; i < 2; ++i) {
        assert_int_equal(specinfer_target_share(env.plain, &t[i], nullptr), SPECINFER_OK);
        d[i] = open_drafter(env.reg, t[i], "hostile", "many");
        assert_int_equal(specinfer_session_create(t[i], d[i], sampled ? env.gumbel : nullptr, &p,
                                                  &s[i], nullptr),
                         SPECINFER_OK);
        assert_int_equal(specinfer_session_feed_text(s[i], kPrompt, std::strlen(kPrompt)),
                         SPECINFER_OK);
      }
      g_mmode = c.mode;
      g_many_calls = 0;
      int failed_calls = 0;
      int32_t buf[2][8];
      for (int call = 0; call < 4 * kTokens; ++call) {
        if (tokens_of(s[0]).size() >= ref.size() && tokens_of(s[1]).size() >= ref.size()) break;
        specinfer_step_result r[2]{};
        for (int i = 0; i < 2; ++i) {
          r[i].struct_size = sizeof r[i];
          r[i].tokens = buf[i];
          r[i].cap = 8;
        }
        if (specinfer_session_step_many(s, r, 2, nullptr) != SPECINFER_OK) {
          ++failed_calls;
          for (int i = 0; i < 2; ++i) {
            if (!c.needle[i]) {
              assert_int_equal(r[i].status, SPECINFER_OK);
              continue;
            }
            const char *msg = specinfer_session_errmsg(s[i]);
            if (r[i].status != SPECINFER_ERR_PLUGIN || !std::strstr(msg, c.needle[i]))
              std::fprintf(stderr, "session %d: %s \"%s\", wanted \"%s\"\n", i,
                           specinfer_status_str(r[i].status), msg, c.needle[i]);
            assert_int_equal(r[i].status, SPECINFER_ERR_PLUGIN);
            assert_non_null(std::strstr(msg, c.needle[i]));
          }
        }
        for (int i = 0; i < 2; ++i) {
          std::vector<int32_t> got = tokens_of(s[i]);
          got.resize(std::min(got.size(), ref.size()));  // a last round may emit past the end
          expect_prefix(got, ref, "propose_many");
        }
      }
      g_mmode = M::good;
      assert_true(g_many_calls > g_bad_many);  // the drafts were made together
      assert_int_equal(failed_calls, 1);
      for (int i = 0; i < 2; ++i) {
        assert_true(tokens_of(s[i]).size() >= ref.size());
        specinfer_session_destroy(s[i]);
        assert_int_equal(specinfer_drafter_destroy(d[i]), SPECINFER_OK);
        assert_int_equal(specinfer_target_destroy(t[i]), SPECINFER_OK);
      }
    }
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile_drafters),     cmocka_unit_test(test_hostile_targets),
      cmocka_unit_test(test_hostile_target_info),  cmocka_unit_test(test_hostile_share),
      cmocka_unit_test(test_hostile_forward_many), cmocka_unit_test(test_hostile_propose_many)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
