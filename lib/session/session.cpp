#include "session/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int32_t argmax(const float *x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// Length of the prefix of `s` that ends on a whole UTF-8 character. A lead byte whose sequence is
// not complete yet is held back; bytes that can never start a character are passed through.
size_t utf8_complete_prefix(const std::string &s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = (c & 0x80) == 0      ? 1
                  : (c & 0xE0) == 0xC0 ? 2
                  : (c & 0xF0) == 0xE0 ? 3
                  : (c & 0xF8) == 0xF0 ? 4
                                       : 1;
    return back < need ? n - back : n;
  }
  return n;
}

struct DraftSampleCtx {
  const Coupler *coupler;
  uint64_t seed;
};

int32_t draft_sample_cb(const void *ctx, const float *q, int32_t vocab, int64_t position) {
  auto *c = static_cast<const DraftSampleCtx *>(ctx);
  try {
    return c->coupler->draft_sample(vocab, q, c->seed, position);
  } catch (...) {
    return -1;  // the drafter sees an invalid token and the session reports it
  }
}

}  // namespace

Session::Session(TargetObject &target, DrafterObject *drafter, const Coupler *coupler,
                 const specinfer_session_params &params)
    : target_(target), drafter_(drafter), coupler_(coupler), params_(params) {
  if (params_.max_draft < 0 || params_.max_draft > kMaxDraft)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "max_draft must be in [0, %d], got %d", kMaxDraft,
         params_.max_draft);
  if (!(params_.temperature >= 0.0f) || !std::isfinite(params_.temperature))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "temperature must be a finite number >= 0");
  if (params_.top_k < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "top_k must be >= 0");
  if (!(params_.top_p > 0.0f && params_.top_p <= 1.0f))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1]");
  if (!(params_.min_p >= 0.0f && params_.min_p < 1.0f))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1)");
  if (drafter_ && drafter_->target() != &target_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "the drafter was opened for another target");
  if (target_.in_session) fail(SPECINFER_ERR_STATE, "the target is already used by a session");
  if (drafter_ && drafter_->in_session)
    fail(SPECINFER_ERR_STATE, "the drafter is already used by a session");

  sampling_.temperature = params_.temperature;
  sampling_.top_k = params_.top_k;
  sampling_.top_p = params_.top_p;
  sampling_.min_p = params_.min_p;
  greedy_ = params_.temperature == 0.0f;
  if (!coupler_) {
    owned_coupler_ = make_coupler(greedy_ ? "greedy" : "rejection");
    coupler_ = owned_coupler_.get();
  }
  if (coupler_->greedy()) greedy_ = true;  // the greedy coupler decides on argmax alone
  vocab_ = target_.info().vocab_size;
  n_ctx_ = target_.info().n_ctx;
  if (!drafter_) params_.max_draft = 0;
  lookahead_.configure(params_.max_draft, params_.adaptive_draft != 0);

  size_t rows = static_cast<size_t>(params_.max_draft) + 1;
  logits_.resize(rows * vocab_);
  if (!greedy_) probs_.resize(rows * vocab_);
  if (drafter_) {
    draft_probs_.resize(static_cast<size_t>(params_.max_draft) * vocab_);
    draft_tokens_.resize(params_.max_draft);
    draft_parents_.resize(params_.max_draft);
  }
  target_.kv_truncate(0);
  target_.in_session = true;
  target_.users++;
  if (drafter_) drafter_->in_session = true;
}

Session::~Session() {
  release();
}

void Session::release() {
  target_.in_session = false;
  target_.users--;
  if (drafter_) drafter_->in_session = false;
}

bool Session::is_stop(int32_t token) const {
  const auto &info = target_.info();
  return token >= 0 && (token == info.eos_token || token == info.eot_token);
}

void Session::feed_text(const char *text, size_t len) {
  if (!text && len) fail(SPECINFER_ERR_INVALID_ARGUMENT, "text is NULL");
  bool add_special = tokens_.empty();
  std::vector<int32_t> ids = target_.tokenize(text ? text : "", len, add_special, true);
  // add_special may also append eos (for models that ask for it); a prompt must not end generation.
  while (!ids.empty() && is_stop(ids.back()) && add_special && len > 0 &&
         target_.info().eos_token == ids.back())
    ids.pop_back();
  feed_tokens(ids.data(), ids.size());
}

void Session::feed_tokens(const int32_t *tokens, size_t n) {
  if (!tokens && n) fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokens is NULL");
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "token %d at index %zu is outside the vocabulary (size %d)", tokens[i], i, vocab_);
  if (tokens_.size() + n > static_cast<size_t>(n_ctx_))
    fail(SPECINFER_ERR_CONTEXT_FULL,
         "the prompt (%zu tokens) does not fit the context window of %d", tokens_.size() + n,
         n_ctx_);
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  n_prompt_ += static_cast<int64_t>(n);
}

// Brings the target's KV cache to tokens_[0 .. size-1) (everything but the last token, which the
// next round scores). Keeps the longest prefix of what the cache already holds.
void Session::prefill() {
  size_t want = tokens_.size() - 1;
  size_t keep = 0;
  size_t limit = std::min(kv_tokens_.size(), want);
  while (keep < limit && kv_tokens_[keep] == tokens_[keep]) ++keep;
  if (keep < kv_tokens_.size()) {
    target_.kv_truncate(static_cast<int32_t>(keep));
    kv_tokens_.resize(keep);
  }
  if (keep == want) return;
  auto t0 = Clock::now();
  const size_t chunk = 512;
  for (size_t start = keep; start < want; start += chunk) {
    size_t n = std::min(chunk, want - start);
    batch_tokens_.assign(tokens_.begin() + start, tokens_.begin() + start + n);
    batch_pos_.resize(n);
    for (size_t i = 0; i < n; ++i) batch_pos_[i] = static_cast<int32_t>(start + i);
    specinfer_forward_batch b{};
    b.struct_size = sizeof(b);
    b.n_tokens = static_cast<int32_t>(n);
    b.tokens = batch_tokens_.data();
    b.positions = batch_pos_.data();
    b.n_logits = 0;
    target_.forward(b);
    ++n_passes_;
    kv_tokens_.insert(kv_tokens_.end(), batch_tokens_.begin(), batch_tokens_.end());
  }
  t_prefill_ += ms_since(t0);
}

void Session::sync_drafter() {
  if (!drafter_) return;
  if (!drafter_begun_) {
    drafter_->begin(tokens_.data(), tokens_.size());
    drafter_begun_ = true;
    drafter_known_ = tokens_.size();
  } else if (drafter_known_ < tokens_.size()) {
    drafter_->commit(tokens_.data() + drafter_known_, tokens_.size() - drafter_known_);
    drafter_known_ = tokens_.size();
  }
}

void Session::round(int32_t max_emit, std::vector<int32_t> &out, bool &done) {
  done = false;
  if (tokens_.empty()) fail(SPECINFER_ERR_STATE, "nothing to continue: feed a prompt first");
  if (tokens_.size() >= static_cast<size_t>(n_ctx_))
    fail(SPECINFER_ERR_CONTEXT_FULL, "the context window of %d tokens is full", n_ctx_);
  prefill();

  const int64_t base = static_cast<int64_t>(tokens_.size());  // sequence index of the next token
  int32_t room = static_cast<int32_t>(n_ctx_ - base);         // tokens that still fit
  int32_t k = drafter_ ? lookahead_.next() : 0;
  k = std::min({k, max_emit - 1, room - 1});
  if (k < 0) k = 0;

  // 1. Draft.
  int32_t n_draft = 0;
  bool draft_has_probs = false;
  double draft_ms = 0;
  if (drafter_) {
    if (!drafter_begun_) {
      // begin() is the drafter's prompt processing (a draft model prefills the prompt): counted
      // with the prefill, not as the cost of this round's draft.
      auto tb = Clock::now();
      sync_drafter();
      t_prefill_ += ms_since(tb);
    }
    auto t0 = Clock::now();
    sync_drafter();
    if (k > 0) {
      DraftSampleCtx sctx{coupler_, params_.seed};
      specinfer_draft_request req{};
      req.struct_size = sizeof(req);
      req.max_tokens = k;
      req.allow_tree = 0;
      req.context = tokens_.data();
      req.n_context = tokens_.size();
      req.temperature = params_.temperature;
      req.seed = params_.seed;
      req.sample = draft_sample_cb;
      req.sample_ctx = &sctx;
      specinfer_draft d{};
      d.struct_size = sizeof(d);
      d.cap = k;
      d.vocab_size = vocab_;
      d.tokens = draft_tokens_.data();
      d.parents = draft_parents_.data();
      d.probs = draft_probs_.data();
      drafter_->propose(req, d);
      for (int32_t i = 0; i < d.n_nodes; ++i)
        if (d.parents[i] != i - 1)
          fail(SPECINFER_ERR_PLUGIN, "the drafter proposed a tree; this session verifies chains");
      n_draft = d.n_nodes;
      draft_has_probs = d.has_probs != 0;
    }
    draft_ms = ms_since(t0);
    t_draft_ += draft_ms;
  }

  // 2. Score the last token and the draft in one pass.
  auto t1 = Clock::now();
  const int32_t n_batch = n_draft + 1;
  batch_tokens_.resize(n_batch);
  batch_pos_.resize(n_batch);
  batch_tokens_[0] = tokens_.back();
  for (int32_t i = 0; i < n_draft; ++i) batch_tokens_[i + 1] = draft_tokens_[i];
  for (int32_t i = 0; i < n_batch; ++i) batch_pos_[i] = static_cast<int32_t>(base - 1 + i);
  specinfer_forward_batch b{};
  b.struct_size = sizeof(b);
  b.n_tokens = n_batch;
  b.tokens = batch_tokens_.data();
  b.positions = batch_pos_.data();
  b.n_logits = n_batch;
  b.logits = logits_.data();
  target_.forward(b);
  ++n_passes_;
  double target_ms = ms_since(t1);
  t_verify_ += target_ms;

  // 3. Couple.
  auto t2 = Clock::now();
  VerifyResult v;
  if (greedy_) {
    int32_t acc = 0;
    while (acc < n_draft &&
           argmax(&logits_[static_cast<size_t>(acc) * vocab_], vocab_) == draft_tokens_[acc])
      ++acc;
    v.n_accepted = acc;
    v.token = argmax(&logits_[static_cast<size_t>(acc) * vocab_], vocab_);
  } else {
    for (int32_t i = 0; i < n_batch; ++i)
      logits_to_probs(&logits_[static_cast<size_t>(i) * vocab_], vocab_, sampling_,
                      &probs_[static_cast<size_t>(i) * vocab_]);
    v = coupler_->verify(vocab_, n_draft, probs_.data(),
                         draft_has_probs ? draft_probs_.data() : nullptr, draft_tokens_.data(),
                         params_.seed, base);
  }
  if (v.n_accepted < 0 || v.n_accepted > n_draft || v.token < 0 || v.token >= vocab_)
    fail(SPECINFER_ERR_INTERNAL, "coupler returned an invalid result (%d accepted, token %d)",
         v.n_accepted, v.token);
  t_sample_ += ms_since(t2);

  // 4. Commit: the cache keeps the last token and the accepted draft.
  kv_tokens_.push_back(tokens_.back());
  for (int32_t i = 0; i < v.n_accepted; ++i) kv_tokens_.push_back(draft_tokens_[i]);
  if (n_draft > v.n_accepted) target_.kv_truncate(static_cast<int32_t>(kv_tokens_.size()));

  size_t first_new = out.size();
  for (int32_t i = 0; i < v.n_accepted; ++i) out.push_back(draft_tokens_[i]);
  out.push_back(v.token);
  // Stop at the first eos/eot; what a drafter proposed past it is not emitted.
  for (size_t i = first_new; i < out.size(); ++i) {
    if (is_stop(out[i])) {
      out.resize(i + 1);
      done = true;
      break;
    }
  }
  size_t emitted = out.size() - first_new;
  tokens_.insert(tokens_.end(), out.begin() + static_cast<std::ptrdiff_t>(first_new), out.end());
  if (kv_tokens_.size() > tokens_.size() - 1) {  // stopped early inside the accepted draft
    kv_tokens_.resize(tokens_.size() - 1);
    target_.kv_truncate(static_cast<int32_t>(kv_tokens_.size()));
  }

  ++n_rounds_;
  n_generated_ += static_cast<int64_t>(emitted);
  n_drafted_ += n_draft;
  n_accepted_ += v.n_accepted;
  if (drafter_) lookahead_.observe(k, n_draft, v.n_accepted, draft_ms, target_ms, n_batch);
}

void Session::step(std::vector<int32_t> &out, bool &done) {
  auto t0 = Clock::now();
  try {
    round(params_.max_draft + 1, out, done);
  } catch (...) {
    t_total_ += ms_since(t0);
    throw;
  }
  t_total_ += ms_since(t0);
}

std::string Session::take_text(const std::vector<int32_t> &toks) {
  for (int32_t t : toks) {
    if (is_stop(t)) continue;  // end markers are not text
    utf8_pending_ += target_.token_bytes(t);
  }
  size_t n = utf8_complete_prefix(utf8_pending_);
  std::string text = utf8_pending_.substr(0, n);
  utf8_pending_.erase(0, n);
  return text;
}

void Session::generate(int32_t max_tokens, specinfer_token_fn on_tokens, void *user) {
  if (max_tokens < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "max_tokens must be >= 0");
  if (tokens_.empty()) fail(SPECINFER_ERR_STATE, "nothing to continue: feed a prompt first");
  int32_t left = max_tokens;
  std::vector<int32_t> out;
  while (left > 0) {
    out.clear();
    bool done = false;
    auto t0 = Clock::now();
    try {
      round(left, out, done);
    } catch (...) {
      t_total_ += ms_since(t0);
      throw;
    }
    t_total_ += ms_since(t0);
    left -= static_cast<int32_t>(out.size());
    if (on_tokens) {
      std::string text = take_text(out);
      if (on_tokens(user, out.data(), out.size(), text.data(), text.size()) != 0)
        fail(SPECINFER_ERR_CANCELLED, "generation stopped by the callback");
    }
    if (done) break;
  }
}

void Session::reset() {
  // The KV cache is kept: the next prompt reuses the prefix it shares with this text.
  tokens_.clear();
  utf8_pending_.clear();
  drafter_begun_ = false;
  drafter_known_ = 0;
  lookahead_.reset();
  n_prompt_ = n_generated_ = n_rounds_ = n_passes_ = n_drafted_ = n_accepted_ = 0;
  t_prefill_ = t_draft_ = t_verify_ = t_sample_ = t_total_ = 0;
}

void Session::stats(specinfer_session_stats &s) const {
  specinfer_session_stats o{};
  o.struct_size = s.struct_size;
  o.n_prompt_tokens = n_prompt_;
  o.n_generated = n_generated_;
  o.n_rounds = n_rounds_;
  o.n_target_passes = n_passes_;
  o.n_drafted = n_drafted_;
  o.n_accepted = n_accepted_;
  o.acceptance_rate = n_drafted_ ? static_cast<double>(n_accepted_) / n_drafted_ : 0.0;
  o.mean_accepted = n_rounds_ ? static_cast<double>(n_generated_) / n_rounds_ : 0.0;
  o.t_prefill_ms = t_prefill_;
  o.t_draft_ms = t_draft_;
  o.t_verify_ms = t_verify_;
  o.t_sample_ms = t_sample_;
  o.t_total_ms = t_total_;
  double gen_ms = t_total_ - t_prefill_;
  o.tokens_per_second = gen_ms > 0 ? n_generated_ * 1000.0 / gen_ms : 0.0;
  std::memcpy(&s, &o, std::min<size_t>(s.struct_size, sizeof(o)));
}

}  // namespace specinfer
