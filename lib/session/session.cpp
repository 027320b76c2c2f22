#include "session/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "session/budget.h"
#include "session/pass_cost.h"
#include "util/error.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
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
  if (params_.context_shift != 0 && params_.context_shift != 1)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "context_shift must be 0 or 1, got %d",
         params_.context_shift);
  if (params_.n_keep < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_keep must be >= 0, got %d", params_.n_keep);
  sampling_.temperature = params_.temperature;
  sampling_.top_k = params_.top_k;
  sampling_.top_p = params_.top_p;
  sampling_.min_p = params_.min_p;
  check_sampling_params(sampling_);
  if (drafter_ && drafter_->target() != &target_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "the drafter was opened for another target");

  if (!coupler_) {
    owned_coupler_ = make_coupler(params_.temperature == 0.0f ? "greedy" : "rejection");
    coupler_ = owned_coupler_.get();
  }
  greedy_ = coupler_->greedy();
  vocab_ = target_.info().vocab_size;
  n_ctx_ = target_.info().n_ctx;
  hidden_size_ = drafter_ ? std::max(0, target_.info().hidden_size) : 0;
  if (!drafter_) params_.max_draft = 0;
  node_cap_ = params_.max_draft;
  lookahead_.configure(params_.max_draft, params_.adaptive_draft != 0);
  lookahead_.use_pass_cost(target_.pass_cost());

  size_t rows = static_cast<size_t>(params_.max_draft) + 1;
  logits_.assign_zero(rows * vocab_);
  if (!greedy_) probs_.assign_zero(rows * vocab_);
  if (drafter_) {
    draft_probs_.assign_zero(static_cast<size_t>(params_.max_draft) * vocab_);
    draft_tokens_.resize(params_.max_draft);
    draft_parents_.resize(params_.max_draft);
    accepted_path_.resize(params_.max_draft);
    hidden_.resize(static_cast<size_t>(hidden_size_));
    verify_hidden_.resize(rows * hidden_size_);
    pass_cost_.resize(rows);
  }
  // Claimed by exchange: of two threads creating sessions on one target at once, one gets it.
  if (target_.in_session.exchange(true))
    fail(SPECINFER_ERR_STATE, "the target is already used by a session");
  if (drafter_ && drafter_->in_session.exchange(true)) {
    target_.in_session = false;
    fail(SPECINFER_ERR_STATE, "the drafter is already used by a session");
  }
  target_.users++;
  try {
    // What an earlier session on this target left in its cache: the first round keeps the prefix
    // this session's text shares with it (trim_cache), as after a reset.
    kv_tokens_ = target_.take_cached();
    if (kv_tokens_.empty()) target_.kv_truncate(0);
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

Session::~Session() {
  release();
}

void Session::release() {
  target_.leave_cached(kv_tokens_);
  target_.in_session = false;
  target_.users--;
  if (drafter_) drafter_->in_session = false;
  if (constraint_) {
    try {
      constraint_->rollback(constraint_consumed_);
    } catch (...) {  // released all the same; its next user finds it where it stands
    }
    constraint_->in_session = false;
  }
}

bool Session::is_stop(int32_t token) const {
  const auto &info = target_.info();  // eog_tokens: sorted, eos and eot included
  return std::binary_search(info.eog_tokens, info.eog_tokens + info.n_eog_tokens, token);
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
  if (!params_.context_shift && tokens_.size() + n > static_cast<size_t>(n_ctx_))
    fail(SPECINFER_ERR_CONTEXT_FULL,
         "the prompt (%zu tokens) does not fit the context window of %d", tokens_.size() + n,
         n_ctx_);
  restart_constraint();
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  n_prompt_ += static_cast<int64_t>(n);
  stops_.clear();
  if (prompt_top_ >= 0 && !tokens_.empty()) prompt_want_ = tokens_.size() - 1;
  count_cached_ = true;
}

void Session::continue_from(Session &src, size_t n) {
  if (&src == this) fail(SPECINFER_ERR_INVALID_ARGUMENT, "a session cannot continue itself");
  if (!tokens_.empty()) fail(SPECINFER_ERR_STATE, "the session has a text already");
  if (n == 0 || n > src.tokens_.size())
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_tokens must be in [1, %zu], got %zu",
         src.tokens_.size(), n);
  if (target_.model_key().empty() || target_.model_key() != src.target_.model_key())
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "the session's target does not share the source session's loaded model "
         "(specinfer_target_share)");
  if (n > static_cast<size_t>(n_ctx_))
    fail(SPECINFER_ERR_CONTEXT_FULL, "the text (%zu tokens) does not fit the context window of %d",
         n, n_ctx_);
  const auto t0 = Clock::now();
  tokens_.assign(src.tokens_.begin(), src.tokens_.begin() + static_cast<std::ptrdiff_t>(n));
  n_prompt_ = static_cast<int64_t>(n);
  restart_prompt_logprobs();
  if (prompt_top_ >= 0) prompt_want_ = n - 1;
  count_cached_ = true;
  // Every token but the last, as far as src's cache holds them.
  size_t cached = 0;
  const size_t limit = std::min(
      {src.kv_tokens_.size(), n - 1, static_cast<size_t>(std::max(src.target_.kv_size(), 0))});
  while (cached < limit && src.kv_tokens_[cached] == tokens_[cached]) ++cached;
  if (cached > 0) {  // what this cache held before (a reset keeps it) goes
    kv_tokens_.clear();
    hidden_pos_ = -1;
  }
  if (cached > 0 && target_.kv_copy(src.target_, static_cast<int32_t>(cached))) {
    kv_tokens_.assign(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(cached));
    // The drafter's hidden state, when src's is of the last position copied (else the first
    // round scores that position again for it).
    if (hidden_size_ > 0 && src.hidden_size_ == hidden_size_ &&
        src.hidden_pos_ == static_cast<int64_t>(cached) - 1) {
      hidden_ = src.hidden_;
      hidden_pos_ = src.hidden_pos_;
    }
  }
  t_prefill_ += ms_since(t0);
}

// One round of speculative decoding: draft -> score -> couple -> commit.
void Session::round(int32_t max_emit, std::vector<int32_t> &out, bool &done) {
  emit_limit_ = max_emit;
  const specinfer_forward_batch &b = begin_round(max_emit, 0);
  plan_round(1, b.n_tokens, b.n_logits, nullptr);
  const auto t0 = Clock::now();
  target_.forward(b);
  end_round(ms_since(t0), b.n_tokens, 1, 0, draft_.ms, false, out, done);
}

void Session::plan_round(int32_t n_sessions, int32_t pass_tokens, int32_t pass_rows,
                         const DraftBudget *plan) {
  if (prefilling_) return;  // a prompt chunk is not a round
  round_info_.n_sessions = n_sessions;
  round_info_.predicted_pass_ms = target_.pass_cost()->ms(pass_tokens, pass_rows);
  // The plan's goodputs are in tokens per millisecond.
  round_info_.goodput = plan ? plan->goodput * 1000.0 : 0.0;
  round_info_.plain_goodput = plan ? plan->plain_goodput * 1000.0 : 0.0;
}

const specinfer_forward_batch &Session::begin_round(int32_t max_emit, int32_t prefill_chunk) {
  if (const specinfer_forward_batch *chunk = prepare_round(prefill_chunk)) return *chunk;
  return draft_round(draft_budget(max_emit), nullptr);
}

const specinfer_forward_batch *Session::prepare_round(int32_t prefill_chunk) {
  if (tokens_.empty()) fail(SPECINFER_ERR_STATE, "nothing to continue: feed a prompt first");
  while (tokens_.size() >= static_cast<size_t>(n_ctx_)) shift_context();
  prefilling_ = false;
  if (prefill_chunk > 0) {  // at most one chunk of the prompt, in the caller's pass
    const auto t0 = Clock::now();
    const size_t want = trim_cache();
    if (kv_tokens_.size() < want) {
      prefilling_ = true;
      t_prefill_ += ms_since(t0);
      return &prefill_batch(want, static_cast<size_t>(prefill_chunk));
    }
    t_prefill_ += ms_since(t0);
  } else {
    catch_up();
  }
  return nullptr;
}

const specinfer_forward_batch &Session::draft_round(int32_t k, const float *pass_cost) {
  if (k > 0) timed_tell_drafter();
  draft_ = propose(k, pass_cost);
  return score_batch(draft_);
}

// The drafter hears of the text when it is to draft (see tell_drafter): prompt processing, timed
// as prefill. The time of a begin() over a text long enough to time is the drafter's
// begin_ms_per_token.
void Session::timed_tell_drafter() {
  const bool begins = drafter_ && !drafter_begun_;
  const size_t n = tokens_.size();
  const auto t0 = Clock::now();
  tell_drafter();
  const double ms = ms_since(t0);
  t_prefill_ += ms;
  if (begins && n >= 16) {
    const double per_token = ms / static_cast<double>(n);
    double &m = drafter_->begin_ms_per_token;
    m = m > 0 ? 0.5 * m + 0.5 * per_token : per_token;
  }
}

// The tokens the drafter has not heard of (all of them before its begin): what it catches up on
// before its next draft, in begin() or, for a drafter that feeds the text it missed with its
// first forward (a draft model), inside the draft, at about the same cost per token.
size_t Session::drafter_missed() const {
  if (!drafter_) return 0;
  return drafter_begun_ ? tokens_.size() - drafter_known_ : tokens_.size();
}

void Session::end_round(double pass_ms, int32_t pass_tokens, int32_t pass_rounds,
                        int32_t pass_fixed, double pass_draft_ms, bool pass_recorded,
                        std::vector<int32_t> &out, bool &done) {
  done = false;
  round_text_.clear();
  round_logprobs_.tokens.clear();
  round_logprobs_.logprobs.clear();
  round_logprobs_.top_tokens.clear();
  round_logprobs_.top_logprobs.clear();
  if (prefilling_) {  // a chunk of the prompt: nothing to couple yet
    prefill_done(verify_batch_);
    t_prefill_ += pass_ms;
    return;
  }
  ++n_passes_;
  t_verify_ += pass_ms;
  const VerifyResult v = couple(draft_);
  const size_t emitted = commit(draft_, v, out, done);
  if (logprob_top_ >= 0) round_logprobs(out, emitted);

  // The drafter's nodes come first; the constraint's forced ones (a chain's end) after them.
  const int32_t drafted = draft_.n - draft_.forced;
  const int32_t accepted = std::min(v.n_accepted, drafted);
  ++n_rounds_;
  n_generated_ += static_cast<int64_t>(emitted);
  n_drafted_ += drafted;
  n_accepted_ += accepted;
  n_forced_drafted_ += draft_.forced;
  n_forced_accepted_ += v.n_accepted - accepted;
  if (drafted > 0 && draft_.expected >= 0) {
    ++n_estimated_;
    expected_sum_ += draft_.expected;
    estimated_accepted_ += accepted;
  }
  round_info_.expected_accepted = draft_.expected >= 0 ? draft_.expected : -1.0;
  round_info_.n_pass_tokens = pass_tokens;
  round_info_.draft_budget = draft_.requested;
  round_info_.n_drafted = drafted;
  round_info_.n_accepted = accepted;
  round_info_.draft_ms = draft_.ms;
  round_info_.pass_ms = pass_ms;
  lookahead_.shared_pass(pass_rounds, pass_fixed, pass_draft_ms - draft_.ms);
  if (drafter_)
    lookahead_.observe(draft_.requested, drafted, accepted, draft_.ms, pass_ms,
                       pass_recorded ? 0 : pass_tokens, !draft_.chain);
}

void Session::step_many(Session *const *sessions, size_t n, const int32_t *max_emits,
                        int32_t prefill_chunk, std::vector<int32_t> *outs, bool *dones,
                        std::exception_ptr *errors) {
  // Each session catches up or takes a prompt chunk; then, group by group, the sessions that
  // run a round draft and the group makes its pass.
  std::vector<const specinfer_forward_batch *> batches(n, nullptr);
  std::vector<bool> ready(n, false), grouped(n, false);
  std::vector<int32_t> emits(n, 1);
  std::vector<DraftBudget> budgets(n);  // each session's group's plan (a group of several)
  std::vector<Clock::time_point> begun(n);
  const auto failed = [&](size_t j) {
    errors[j] = std::current_exception();
    sessions[j]->t_total_ += ms_since(begun[j]);
  };
  for (size_t i = 0; i < n; ++i) {
    begun[i] = Clock::now();
    try {
      Session &s = *sessions[i];
      const auto most = static_cast<int32_t>(s.max_emit());  // with a constraint, its forced tokens
      emits[i] = max_emits ? std::clamp(max_emits[i], 1, most) : most;
      s.emit_limit_ = emits[i];  // the bound forced tokens stay within, as in round()
      batches[i] = s.prepare_round(prefill_chunk);
      ready[i] = true;
    } catch (...) {
      failed(i);
    }
  }
  // Sessions whose targets share a loaded model make one pass; any other target its own.
  for (size_t i = 0; i < n; ++i) {
    if (!ready[i] || grouped[i]) continue;
    std::vector<size_t> group{i};
    TargetObject &t = sessions[i]->target_;
    if (!t.model_key().empty())
      for (size_t j = i + 1; j < n; ++j)
        if (ready[j] && !grouped[j] && sessions[j]->target_.model_key() == t.model_key())
          group.push_back(j);
    for (size_t j : group) grouped[j] = true;
    // Drafts: a session alone chooses its own; a group's are chosen together (draft_group).
    if (group.size() == 1) {
      Session &s = *sessions[i];
      try {
        if (!batches[i]) batches[i] = &s.draft_round(s.draft_budget(emits[i]), nullptr);
      } catch (...) {
        failed(i);
        continue;
      }
    } else {
      draft_group(sessions, group, emits.data(), batches.data(), errors, begun.data(),
                  budgets.data());
      group.erase(std::remove_if(group.begin(), group.end(), [&](size_t j) { return !batches[j]; }),
                  group.end());
      if (group.empty()) continue;
    }
    pass_group(sessions, group, batches.data(), budgets.data(), outs, dones, errors, begun.data());
  }
}

// One pass for the group's batches (sessions[j] for j in group, each batch ready), then each
// session's round ends: its result in outs[j] and dones[j], or its error in errors[j].
void Session::pass_group(Session *const *sessions, const std::vector<size_t> &group,
                         const specinfer_forward_batch *const *batches, const DraftBudget *budgets,
                         std::vector<int32_t> *outs, bool *dones, std::exception_ptr *errors,
                         const Clock::time_point *begun) {
  const size_t i = group.front();
  const auto failed = [&](size_t j) {
    errors[j] = std::current_exception();
    sessions[j]->t_total_ += ms_since(begun[j]);
  };
  // The group's logit rows go to one arena, in the pass's row order, instead of each session's
  // own rows: a pass's rows are then resident once per thread, not once per session, and a
  // target can write them with one matrix product.
  size_t rows = 0;
  for (size_t j : group) rows += static_cast<size_t>(batches[j]->n_logits);
  static thread_local PageBuffer<float> arena;
  const size_t vocab = static_cast<size_t>(sessions[i]->vocab_);
  try {
    if (arena.size() < rows * vocab) arena.assign_zero(rows * vocab);
  } catch (...) {
    for (size_t j : group) failed(j);
    return;
  }
  std::vector<TargetObject *> targets;
  std::vector<specinfer_forward_batch> bs;
  int32_t pass_tokens = 0, pass_rows = 0, pass_rounds = 0, pass_fixed = 0;
  double pass_draft_ms = 0;
  size_t row = 0;
  for (size_t j : group) {
    specinfer_forward_batch &b = sessions[j]->verify_batch_;
    if (b.n_logits > 0) b.logits = arena.data() + row * vocab;
    row += static_cast<size_t>(b.n_logits);
    targets.push_back(&sessions[j]->target_);
    bs.push_back(*batches[j]);
    pass_tokens += batches[j]->n_tokens;
    pass_rows += batches[j]->n_logits;
    if (sessions[j]->prefilling_) {
      pass_fixed += batches[j]->n_tokens;
    } else {
      ++pass_rounds;
      pass_draft_ms += sessions[j]->draft_.ms;
    }
  }
  for (size_t j : group)
    sessions[j]->plan_round(pass_rounds, pass_tokens, pass_rows,
                            group.size() > 1 ? &budgets[j] : nullptr);
  const auto t0 = Clock::now();
  try {
    if (group.size() == 1)
      targets[0]->forward(bs[0]);
    else
      TargetObject::forward_many(targets.data(), bs.data(), static_cast<int32_t>(bs.size()));
  } catch (...) {
    for (size_t j : group) failed(j);
    return;
  }
  const double ms = ms_since(t0);
  // A shared pass is timed once for the model's table; a lone round's lookahead records its own.
  const bool shared = group.size() > 1;
  if (shared) sessions[group[0]]->target_.pass_cost()->record(pass_tokens, pass_rows, ms);
  for (size_t j : group) {
    Session &s = *sessions[j];
    try {
      s.end_round(ms, pass_tokens, pass_rounds, pass_fixed, pass_draft_ms, shared, outs[j],
                  dones[j]);
    } catch (...) {
      errors[j] = std::current_exception();
    }
    s.t_total_ += ms_since(begun[j]);
  }
}

// The drafts of a group that shares one pass, chosen together: every session that runs a round
// says what it may draft and what that is worth (Lookahead::wish), the budget rule
// (session/budget.h) picks each one's k for the most expected tokens per unit of time of the
// whole step, measured pass times of the model pricing the tokens, and each session drafts its k.
// A session whose drafter fails gets its error and no batch.
void Session::draft_group(Session *const *sessions, const std::vector<size_t> &group,
                          const int32_t *emits, const specinfer_forward_batch **batches,
                          std::exception_ptr *errors, const Clock::time_point *begun,
                          DraftBudget *plans) {
  std::vector<size_t> rounds;
  double fixed = 0, fixed_rows = 0;
  for (size_t j : group) {
    if (batches[j]) {  // a chunk of a prompt
      fixed += batches[j]->n_tokens;
      fixed_rows += batches[j]->n_logits;
    } else {
      rounds.push_back(j);
    }
  }
  // Each drafter plugin's begin time per token, as timed by any of its drafters in the group
  // (0: none has begun on a text long enough to time it yet).
  std::vector<std::pair<const specinfer_drafter_vtable *, double>> begin_cost;
  const auto cost_of = [&](const DrafterObject &d) -> double & {
    for (auto &[vt, ms] : begin_cost)
      if (vt == d.vtable()) return ms;
    return begin_cost.emplace_back(d.vtable(), 0.0).second;
  };
  for (size_t j : rounds)
    if (const DrafterObject *d = sessions[j]->drafter_)
      cost_of(*d) = std::max(cost_of(*d), d->begin_ms_per_token);
  std::vector<const specinfer_drafter_vtable *> timing;  // plugins whose begin one session times
  std::vector<Lookahead::Wish> wishes(rounds.size());
  std::vector<DraftOffer> offers(rounds.size());
  int32_t most_tokens = static_cast<int32_t>(fixed) + 1;
  bool any = false;
  for (size_t r = 0; r < rounds.size(); ++r) {
    Session &s = *sessions[rounds[r]];
    Lookahead::Wish &w = wishes[r];
    if (s.drafter_) {
      s.lookahead_.wish(s.draft_limit(emits[rounds[r]]), w);
      // A drafter that has to catch up on text it missed first (a fresh prompt, or the rounds of
      // a pause) charges that to this step's draft: it drafts only where the step pays for it.
      // While its plugin's cost is untimed, one session of the plugin at a time may draft (and
      // time it); the others take plain rounds meanwhile, without a pause.
      const double per_token = cost_of(*s.drafter_);
      const size_t missed = s.drafter_missed();
      if (!w.fixed && w.most > 0 && per_token == 0 && missed >= 16) {
        if (std::find(timing.begin(), timing.end(), s.drafter_->vtable()) != timing.end())
          w.most = 0;
        else
          timing.push_back(s.drafter_->vtable());
      }
      const double catch_up = w.fixed ? 0.0 : static_cast<double>(missed) * per_token;
      for (int32_t k = 1; k <= w.most; ++k) w.draft_ms[static_cast<size_t>(k)] += catch_up;
    } else {
      w.value[0] = 1.0;
    }
    offers[r] =
        DraftOffer{w.fixed ? w.most : 0, w.most, w.value.data(), w.nodes.data(), w.draft_ms.data()};
    most_tokens += 1 + w.most;
    any = any || w.most > 0;
  }
  // The model's pass times (calibrated the first time a group weighs drafts on it), made
  // monotone, as a function of the expected token count.
  TargetObject &model = sessions[group[0]]->target_;
  if (any) calibrate_pass_cost(model);
  const PassTime pass_time = interpolated_pass_time(
      any ? model.pass_cost()->monotone_table(most_tokens) : std::vector<double>{});
  DraftBudget budget;
  if (any)
    budget =
        choose_drafts(offers, fixed, pass_time, model.pass_cost()->row_ms() * (fixed - fixed_rows));
  else
    budget.k.assign(rounds.size(), 0);
  for (size_t j : group) {
    plans[j].goodput = budget.goodput;
    plans[j].plain_goodput = budget.plain_goodput;
  }
  std::vector<size_t> drafting;  // the sessions that draft this step, and their k
  std::vector<int32_t> ks;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const size_t j = rounds[r];
    Session &s = *sessions[j];
    const int32_t k = budget.k[r];
    s.draft_ = Draft{};
    try {
      if (s.drafter_) s.lookahead_.granted(wishes[r], k);
      if (k > 0) {
        // A drafter that sizes its own tree weighs its nodes against what they cost the step.
        group_pass_cost(budget, offers, r, pass_time, s.pass_cost_.data());
        s.timed_tell_drafter();
        drafting.push_back(j);
        ks.push_back(k);
      }
    } catch (...) {
      errors[j] = std::current_exception();
    }
  }
  propose_together(sessions, drafting, ks, errors);
  for (size_t j : rounds) {
    Session &s = *sessions[j];
    try {
      if (!errors[j]) batches[j] = &s.score_batch(s.draft_);
    } catch (...) {
      errors[j] = std::current_exception();
    }
    if (errors[j]) s.t_total_ += ms_since(begun[j]);
  }
}

// The drafts of the sessions members[i] drafting ks[i] nodes each: the drafters of one plugin
// that drafts for several at once (propose_many: a draft model runs one pass per draft depth for
// all of them) in one call, each other drafter on its own. Sets each session's draft_, or its
// error; a drafting time shared by one call is split evenly among its sessions.
void Session::propose_together(Session *const *sessions, const std::vector<size_t> &members,
                               const std::vector<int32_t> &ks, std::exception_ptr *errors) {
  std::vector<bool> taken(members.size(), false);
  for (size_t a = 0; a < members.size(); ++a) {
    if (taken[a]) continue;
    DrafterObject &first = *sessions[members[a]]->drafter_;
    std::vector<size_t> together{a};
    if (first.can_propose_many())
      for (size_t b = a + 1; b < members.size(); ++b)
        if (!taken[b] && sessions[members[b]]->drafter_->vtable() == first.vtable())
          together.push_back(b);
    for (size_t b : together) taken[b] = true;
    if (together.size() == 1) {
      Session &s = *sessions[members[a]];
      try {
        s.draft_ = s.propose(ks[a], s.pass_cost_.data());
      } catch (...) {
        errors[members[a]] = std::current_exception();
      }
      continue;
    }
    const size_t n = together.size();
    const auto t0 = Clock::now();
    std::vector<DrafterObject *> drafters(n);
    std::vector<specinfer_draft_request> reqs(n);
    std::vector<specinfer_draft> outs(n);
    std::vector<std::exception_ptr> errs(n);
    for (size_t t = 0; t < n; ++t) {
      Session &s = *sessions[members[together[t]]];
      s.draft_request(ks[together[t]], s.pass_cost_.data(), reqs[t], outs[t]);
      drafters[t] = s.drafter_;
    }
    try {
      DrafterObject::propose_many(drafters.data(), reqs.data(), outs.data(),
                                  static_cast<int32_t>(n), errs.data());
    } catch (...) {
      for (size_t t = 0; t < n; ++t) errs[t] = std::current_exception();
    }
    const double ms = ms_since(t0) / static_cast<double>(n);
    for (size_t t = 0; t < n; ++t) {
      const size_t i = together[t];
      Session &s = *sessions[members[i]];
      if (errs[t])
        errors[members[i]] = errs[t];
      else
        s.draft_ = s.drafted(ks[i], outs[t], ms);
    }
  }
}

void Session::timed_round(int32_t max_emit, std::vector<int32_t> &out, bool &done) {
  const auto t0 = Clock::now();
  try {
    round(max_emit, out, done);
  } catch (...) {
    t_total_ += ms_since(t0);
    throw;
  }
  t_total_ += ms_since(t0);
}

// A full context window: without context_shift the end of generation (CONTEXT_FULL); with it,
// the first n_keep tokens (and a leading bos) stay, the older half of the rest goes, and the next
// catch-up scores what stays after them again (trim_cache keeps the cache's common prefix). The
// drafter starts over from the kept text.
void Session::shift_context() {
  if (!params_.context_shift)
    fail(SPECINFER_ERR_CONTEXT_FULL, "the context window of %d tokens is full", n_ctx_);
  size_t keep = static_cast<size_t>(params_.n_keep);
  if (keep == 0 && tokens_.front() == target_.info().bos_token) keep = 1;
  const size_t discard = tokens_.size() > keep ? (tokens_.size() - keep) / 2 : 0;
  if (discard == 0)
    fail(SPECINFER_ERR_CONTEXT_FULL,
         "the context window of %d tokens is full and n_keep %d leaves nothing to drop", n_ctx_,
         params_.n_keep);
  const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(keep);
  tokens_.erase(first, first + static_cast<std::ptrdiff_t>(discard));
  drafter_begun_ = false;
  drafter_known_ = 0;
  restart_prompt_logprobs();
  ++n_shifts_;
}

// The KV cache holds every token but the last (which a round scores) once kv_tokens_ reaches
// the returned size. Trims the cache to the longest prefix it shares with the text first; the
// drafter gets the hidden state of the last cached position, so that position is recomputed when
// the one kept is of another text (a hidden state depends only on the tokens up to it).
size_t Session::trim_cache() {
  const size_t want = tokens_.size() - 1;
  size_t keep = 0;
  const size_t limit = std::min(kv_tokens_.size(), want);
  while (keep < limit && kv_tokens_[keep] == tokens_[keep]) ++keep;
  // The text's log-probabilities come from prefill rows: the positions still without one are
  // scored again.
  if (recording_prompt()) keep = std::min(keep, prompt_logprobs_.tokens.size());
  const bool hidden_stale =
      hidden_size_ > 0 && want > 0 &&
      (hidden_pos_ != static_cast<int64_t>(want) - 1 || static_cast<size_t>(hidden_pos_) >= keep);
  if (hidden_stale && keep == want) keep = want - 1;
  // A round that failed after its pass (out of memory while coupling or committing) leaves the
  // target holding positions that kv_tokens_ does not list: those are cut too.
  const auto cached = static_cast<size_t>(target_.kv_size());
  keep = std::min(keep, cached);
  if (keep < kv_tokens_.size() || keep < cached) {
    // A sliding-window cache may keep less; the prefill feeds the rest.
    kv_tokens_.resize(static_cast<size_t>(target_.kv_truncate(static_cast<int32_t>(keep))));
  }
  if (count_cached_) {  // the first trim after a feed: what the text found cached
    n_cached_ += static_cast<int64_t>(kv_tokens_.size());
    count_cached_ = false;
  }
  return want;
}

// The pass that scores the next at most `chunk` uncached tokens before `want`; the last chunk
// also asks for the hidden state of its last token. While the text's log-probabilities are
// recorded, every row, in chunks of at most kPromptLogprobChunk.
const specinfer_forward_batch &Session::prefill_batch(size_t want, size_t chunk) {
  const bool rows = recording_prompt();
  if (rows) chunk = std::min(chunk, kPromptLogprobChunk);
  const size_t start = kv_tokens_.size(), n = std::min(chunk, want - start);
  batch_tokens_.assign(tokens_.begin() + static_cast<std::ptrdiff_t>(start),
                       tokens_.begin() + static_cast<std::ptrdiff_t>(start + n));
  batch_pos_.resize(n);
  for (size_t i = 0; i < n; ++i) batch_pos_[i] = static_cast<int32_t>(start + i);
  specinfer_forward_batch &b = verify_batch_;
  b = specinfer_forward_batch{};
  b.struct_size = sizeof(b);
  b.n_tokens = static_cast<int32_t>(n);
  b.tokens = batch_tokens_.data();
  b.positions = batch_pos_.data();
  if (rows) {
    if (prompt_logits_.size() < n * vocab_)
      prompt_logits_.assign_zero(kPromptLogprobChunk * vocab_);
    b.n_logits = static_cast<int32_t>(n);
    b.logits = prompt_logits_.data();
    if (hidden_size_ > 0 && start + n == want) {
      prompt_hidden_.resize(n * static_cast<size_t>(hidden_size_));
      b.hidden = prompt_hidden_.data();
    }
  } else if (hidden_size_ > 0 && start + n == want) {
    b.n_logits = 1;
    b.logits = logits_.data();
    b.hidden = hidden_.data();
  }
  return b;
}

// After a prefill pass: the cache holds its tokens.
void Session::prefill_done(const specinfer_forward_batch &b) {
  ++n_passes_;
  const size_t start = kv_tokens_.size();
  kv_tokens_.insert(kv_tokens_.end(), b.tokens, b.tokens + b.n_tokens);
  if (b.hidden == prompt_hidden_.data() && b.hidden && b.n_logits > 0)  // every row's: the last
    std::copy_n(prompt_hidden_.data() + static_cast<size_t>(b.n_logits - 1) * hidden_size_,
                hidden_size_, hidden_.data());
  if (b.hidden) hidden_pos_ = static_cast<int64_t>(kv_tokens_.size()) - 1;
  if (recording_prompt() && b.n_logits == b.n_tokens) record_prompt_rows(b, start);
}

// The drafter hears of tokens fed since it last heard (the prompt, at first): before a round in
// which it drafts, and after one in which it drafted. A drafter that is not asked to draft (a
// plain round, or a draft the group's budget rule turned down) hears nothing, so that a drafter
// with a model of its own costs nothing while it rests: the text it missed comes in one batch
// when it drafts again.
void Session::tell_drafter() {
  if (!drafter_ || (drafter_begun_ && drafter_known_ >= tokens_.size())) return;
  if (!drafter_begun_) {
    drafter_->begin(tokens_.data(), tokens_.size());
  } else {
    try {
      drafter_->commit(tokens_.data() + drafter_known_, tokens_.size() - drafter_known_);
    } catch (...) {
      drafter_begun_ = false;  // it may have heard part: the next try starts it again
      throw;
    }
  }
  drafter_begun_ = true;
  drafter_known_ = tokens_.size();
}

// Brings the target's KV cache to every token but the last in passes of up to 512 tokens: prompt
// processing, timed as prefill.
void Session::catch_up() {
  const auto t0 = Clock::now();
  const size_t want = trim_cache();
  while (kv_tokens_.size() < want) {
    const specinfer_forward_batch &b = prefill_batch(want, 512);
    target_.forward(b);
    prefill_done(b);
  }
  t_prefill_ += ms_since(t0);
}

// The most nodes a round may draft: what may still be emitted and what still fits the context
// (the scored batch is the last token plus the draft).
int32_t Session::draft_limit(int32_t max_emit) const {
  const int32_t room = static_cast<int32_t>(n_ctx_ - static_cast<int64_t>(tokens_.size()));
  return std::min(max_emit - 1, room - 1);
}

// Nodes to ask the drafter for in a round of its own: the lookahead's choice, within the limit.
int32_t Session::draft_budget(int32_t max_emit) {
  if (!drafter_) return 0;
  return std::max(0, std::min(lookahead_.next(), draft_limit(max_emit)));
}

Session::Draft Session::propose(int32_t k, const float *pass_cost) {
  if (k == 0) return Draft{};
  const auto t0 = Clock::now();
  specinfer_draft_request req{};
  specinfer_draft out{};
  draft_request(k, pass_cost, req, out);
  drafter_->propose(req, out);  // checks node count, tokens and parent links
  return drafted(k, out, ms_since(t0));
}

// The request for a draft of k nodes and the session's buffers it goes to (the request refers to
// the session, which must outlive it).
void Session::draft_request(int32_t k, const float *pass_cost, specinfer_draft_request &req,
                            specinfer_draft &out) {
  sample_ctx_ = DraftSampleCtx{coupler_, params_.seed};
  req = specinfer_draft_request{};
  req.struct_size = sizeof(req);
  req.max_tokens = k;
  req.allow_tree = 1;
  req.context = tokens_.data();
  req.n_context = tokens_.size();
  req.temperature = params_.temperature;
  req.seed = params_.seed;
  req.sample = draft_sample_cb;
  req.sample_ctx = &sample_ctx_;
  if (hidden_size_ > 0 && hidden_pos_ == static_cast<int64_t>(tokens_.size()) - 2) {
    req.hidden = hidden_.data();
    req.hidden_size = hidden_size_;
    req.hidden_position = hidden_pos_;
  } else {
    req.hidden_position = -1;
  }
  if (!pass_cost) {
    for (int32_t i = 0; i <= k; ++i) pass_cost_[i] = static_cast<float>(lookahead_.batch_ratio(i));
    pass_cost = pass_cost_.data();
  }
  req.pass_cost = pass_cost;
  req.n_pass_cost = k + 1;
  out = specinfer_draft{};
  out.struct_size = sizeof(out);
  out.cap = k;
  out.vocab_size = vocab_;
  out.tokens = draft_tokens_.data();
  out.parents = draft_parents_.data();
  out.probs = draft_probs_.data();
  out.expected_accepted = -1;
}

// The round's draft from what the drafter wrote (already checked) in `ms` of drafting.
Session::Draft Session::drafted(int32_t k, const specinfer_draft &out, double ms) {
  Draft d;
  d.requested = k;
  d.n = out.n_nodes;
  d.has_probs = out.has_probs != 0;
  d.expected = out.expected_accepted;
  for (int32_t i = 0; i < d.n; ++i) d.chain = d.chain && draft_parents_[i] == i - 1;
  d.ms = ms;
  t_draft_ += d.ms;
  return d;
}

// The target pass over the last token and the draft's nodes; a node sits one position past its
// parent and, in a tree, sees only its ancestors. The batch refers to the session's buffers.
const specinfer_forward_batch &Session::score_batch(Draft &d) {
  constrain_draft(d);
  const int32_t n = d.n + 1;
  const int32_t pos0 = static_cast<int32_t>(tokens_.size()) - 1;
  batch_tokens_.resize(n);
  batch_pos_.resize(n);
  batch_tokens_[0] = tokens_.back();
  batch_pos_[0] = pos0;
  for (int32_t i = 0; i < d.n; ++i) {
    batch_tokens_[i + 1] = draft_tokens_[i];
    batch_pos_[i + 1] = batch_pos_[draft_parents_[i] + 1] + 1;
  }
  specinfer_forward_batch &b = verify_batch_;
  b = specinfer_forward_batch{};
  b.struct_size = sizeof(b);
  b.n_tokens = n;
  b.tokens = batch_tokens_.data();
  b.positions = batch_pos_.data();
  b.n_logits = n;
  b.logits = logits_.data();
  if (hidden_size_ > 0) b.hidden = verify_hidden_.data();
  if (!d.chain) {  // a chain keeps the causal mask: the same kernels as plain decoding
    tree_mask_.assign(static_cast<size_t>(n) * n, 0);
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = i; j >= 0; j = j == 0 ? -1 : draft_parents_[j - 1] + 1)
        tree_mask_[static_cast<size_t>(i) * n + j] = 1;
    b.tree_mask = tree_mask_.data();
  }
  return b;
}

// The coupler decides which nodes the target keeps: on raw scores for a coupler that reads only
// the argmax (greedy), on the sampler's distributions otherwise.
VerifyResult Session::couple(const Draft &d) {
  const auto t0 = Clock::now();
  const float *p = verify_batch_.logits;  // the session's rows, or step_many's arena
  const float *q = d.has_probs && !greedy_ ? draft_probs_.data() : nullptr;
  if (logprob_top_ >= 0) prepare_row_logprobs(d.n + 1);
  mask_rows(d);
  if (!greedy_) {
    for (int32_t i = 0; i <= d.n; ++i)
      logits_to_probs(verify_batch_.logits + static_cast<size_t>(i) * vocab_, vocab_, sampling_,
                      &probs_[static_cast<size_t>(i) * vocab_]);
    p = probs_.data();
  }
  const int64_t position = static_cast<int64_t>(tokens_.size());
  VerifyResult v =
      coupler_->verify_tree(vocab_, d.n, p, q, draft_tokens_.data(), draft_parents_.data(),
                            params_.seed, position, accepted_path_.data());
  if (v.n_accepted < 0 || v.n_accepted > d.n || v.token < 0 || v.token >= vocab_)
    fail(SPECINFER_ERR_INTERNAL, "coupler returned an invalid result (%d accepted, token %d)",
         v.n_accepted, v.token);
  t_sample_ += ms_since(t0);
  return v;
}

// Appends the accepted path and the coupler's token to the text, up to the first end-of-text
// token; the target's cache keeps what was scored on that path, once; a drafter that drafted
// this round hears of the new tokens now.
size_t Session::commit(const Draft &d, const VerifyResult &v, std::vector<int32_t> &out,
                       bool &done) {
  // All or nothing: the room every step below needs is taken first, and a step that fails (a
  // plugin's token_bytes or kv_keep, memory for the text) puts the text's state back as it was,
  // so that the session goes on from where it stood (the next round cuts what the target holds
  // beyond kv_tokens_).
  const size_t first = out.size();
  const size_t most = static_cast<size_t>(v.n_accepted) + 1;
  out.reserve(first + most);
  kv_tokens_.reserve(kv_tokens_.size() + most);
  tokens_.reserve(tokens_.size() + most);
  keep_idx_.reserve(most);
  std::string pending = utf8_pending_, held = stops_.held();
  const size_t text_before = round_text_.size();
  const int32_t base = static_cast<int32_t>(kv_tokens_.size());
  size_t emitted = 0;
  int32_t consumed = 0;  // tokens the constraint took this round
  try {
    for (int32_t i = 0; i < v.n_accepted; ++i) out.push_back(draft_tokens_[accepted_path_[i]]);
    out.push_back(v.token);
    // The constraint takes the tokens and cuts them where its grammar ends; the text ends there
    // too, or earlier at an end-of-generation token or a stop string.
    bool grammar_ended = false;
    if (constraint_) advance_constraint(out, first, consumed, grammar_ended);
    done = end_text_at_stop(out, first);
    emitted = out.size() - first;
    if (constraint_) constraint_cut(emitted, consumed, grammar_ended, done);
    // Cached: everything before the last token, the last token, then the accepted nodes that
    // are followed by another emitted token.
    const int32_t kept_nodes = static_cast<int32_t>(emitted) - 1;
    kv_tokens_.push_back(tokens_.back());
    for (int32_t i = 0; i < kept_nodes; ++i) kv_tokens_.push_back(draft_tokens_[accepted_path_[i]]);
    bool prefix = true;  // nodes 0 .. kept_nodes-1 in order: a truncation is enough
    for (int32_t i = 0; i < kept_nodes; ++i) prefix = prefix && accepted_path_[i] == i;
    if (prefix) {
      if (kept_nodes < d.n) {
        // A sliding-window cache may keep less; the next round feeds the rest.
        kv_tokens_.resize(
            static_cast<size_t>(target_.kv_truncate(static_cast<int32_t>(kv_tokens_.size()))));
      }
    } else {
      keep_idx_.resize(static_cast<size_t>(kept_nodes) + 1);
      keep_idx_[0] = 0;  // the last token
      for (int32_t i = 0; i < kept_nodes; ++i) keep_idx_[i + 1] = accepted_path_[i] + 1;
      target_.kv_keep(base, keep_idx_.data(), kept_nodes + 1);
    }
  } catch (...) {
    if (consumed > 0) {
      try {
        constraint_->rollback(consumed);
        constraint_consumed_ -= consumed;
      } catch (...) {  // the constraint failed too: its next call reports it
      }
    }
    out.resize(first);
    kv_tokens_.resize(static_cast<size_t>(base));
    utf8_pending_.swap(pending);
    stops_.restore(std::move(held));
    round_text_.resize(text_before);
    done = false;
    throw;
  }

  tokens_.insert(tokens_.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  if (hidden_size_ > 0) {  // the row whose logits chose the last emitted token
    const int32_t kept_nodes = static_cast<int32_t>(emitted) - 1;
    const int32_t row = kept_nodes == 0 ? 0 : accepted_path_[kept_nodes - 1] + 1;
    std::copy_n(verify_hidden_.begin() + static_cast<std::ptrdiff_t>(row) * hidden_size_,
                hidden_size_, hidden_.begin());
    hidden_pos_ = static_cast<int64_t>(tokens_.size()) - 2;
  }
  if (drafter_ && drafter_begun_ && d.requested > 0) {
    // The text is committed: a drafter that fails to hear of it starts again from the whole
    // text at its next draft (begin), where a failure is reported before anything changes.
    try {
      drafter_->commit(tokens_.data() + drafter_known_, tokens_.size() - drafter_known_);
      drafter_known_ = tokens_.size();
    } catch (...) {
      drafter_begun_ = false;
    }
  }
  return emitted;
}

// Turns the tokens out[first..] into round_text_ and cuts them after the token that ends the
// text: an end-of-generation token (no text of its own; what was held back for the stop strings
// is released) or the token that completes a stop string (its text ends before the stop string).
// What was drafted past that token is not emitted. Returns whether the text ended.
bool Session::end_text_at_stop(std::vector<int32_t> &out, size_t first) {
  for (size_t i = first; i < out.size(); ++i) {
    if (is_stop(out[i])) {
      out.resize(i + 1);
      stops_.flush(round_text_);
      return true;
    }
    utf8_pending_ += target_.token_bytes(out[i]);
    const size_t n = utf8_complete_prefix(utf8_pending_);
    if (n == 0) continue;
    const bool stopped = stops_.push(utf8_pending_.substr(0, n), round_text_);
    utf8_pending_.erase(0, n);
    if (stopped) {
      out.resize(i + 1);
      utf8_pending_.clear();
      return true;
    }
  }
  return false;
}

void Session::step(int32_t max_emit, std::vector<int32_t> &out, bool &done) {
  timed_round(std::clamp(max_emit, 1, node_cap_ + 1), out, done);
}

const std::string &Session::end_text() {
  end_text_.clear();
  stops_.flush(end_text_);
  return end_text_;
}

void Session::generate(int32_t max_tokens, specinfer_token_fn on_tokens, void *user) {
  if (max_tokens < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "max_tokens must be >= 0");
  if (tokens_.empty()) fail(SPECINFER_ERR_STATE, "nothing to continue: feed a prompt first");
  int32_t left = max_tokens;
  std::vector<int32_t> out;
  while (left > 0) {
    out.clear();
    bool done = false;
    timed_round(left, out, done);
    left -= static_cast<int32_t>(out.size());
    if (left <= 0 && !done) stops_.flush(round_text_);  // the text ends here
    if (on_tokens &&
        on_tokens(user, out.data(), out.size(), round_text_.data(), round_text_.size()) != 0)
      fail(SPECINFER_ERR_CANCELLED, "generation stopped by the callback");
    if (done) break;
  }
}

void Session::reset() {
  // The KV cache is kept: the next prompt reuses the prefix it shares with this text.
  restart_constraint();
  tokens_.clear();
  utf8_pending_.clear();
  stops_.clear();
  round_text_.clear();
  round_logprobs_ = RoundLogprobs{};
  restart_prompt_logprobs();
  drafter_begun_ = false;
  drafter_known_ = 0;
  lookahead_.reset();
  n_prompt_ = n_generated_ = n_rounds_ = n_passes_ = n_drafted_ = n_accepted_ = n_shifts_ = 0;
  n_forced_drafted_ = n_forced_accepted_ = n_cached_ = n_estimated_ = 0;
  expected_sum_ = estimated_accepted_ = 0;
  round_info_ = specinfer_round_info{};
  t_prefill_ = t_draft_ = t_verify_ = t_sample_ = t_total_ = t_constraint_ = 0;
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
  o.n_context_shifts = n_shifts_;
  o.n_forced_drafted = n_forced_drafted_;
  o.n_forced_accepted = n_forced_accepted_;
  o.t_constraint_ms = t_constraint_;
  o.n_cached_tokens = n_cached_;
  o.n_estimated_rounds = n_estimated_;
  o.expected_accepted = expected_sum_;
  o.estimated_rounds_accepted = estimated_accepted_;
  std::memcpy(&s, &o, std::min<size_t>(s.struct_size, sizeof(o)));
}

}  // namespace specinfer
