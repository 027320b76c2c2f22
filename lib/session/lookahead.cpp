#include "session/lookahead.h"

#include <algorithm>
#include <cmath>

namespace specinfer {

void Lookahead::configure(int32_t max_draft, bool adaptive) {
  max_draft_ = std::clamp<int32_t>(max_draft, 0, kMaxBatch - 1);
  adaptive_ = adaptive;
  asked_ = self_stops_ = 0;
  drafts_ = trees_ = 0;
  draft_ms_per_token_ = steady_draft_ms_ = 0;
  drafted_last_ = false;
  allowed_at_.fill(0);
  drafted_at_.fill(0);
  since_plain_ = 0;
  seen_draft_ = false;
  reset();
}

void Lookahead::reset() {
  // A new text: what was learned about its acceptance goes, the costs and the drafter's habit of
  // ending its own drafts stay (same models, same machine).
  accepted_ = drafted_ = 0;
  for (auto &a : reached_) a.fill(0);
  for (auto &a : rejected_) a.fill(0);
  hot_ = false;
  realized_tokens_ = realized_ms_ = realized_rounds_ = 0;
  round_count_ = round_accepted_ = round_nodes_ = round_draft_ms_ = 0;
  paused_ = 0;
  pause_len_ = pause_rounds;
}

double Lookahead::acceptance() const {
  // Two pseudo-trials at the prior rate: one early rejection does not read as "never accepted".
  return (accepted_ + 2.0 * prior_acceptance) / (drafted_ + 2.0);
}

void Lookahead::survival(int32_t k, double *s) const {
  const int st = hot_ ? 1 : 0;
  double hazard = 1.0 - std::clamp(acceptance(), 0.0, 0.999);
  s[0] = 1.0;
  for (int32_t i = 1; i <= k && i <= kMaxBatch; ++i) {
    if (reached_[st][i] >= 2.0) hazard = std::clamp(rejected_[st][i] / reached_[st][i], 0.001, 1.0);
    s[i] = s[i - 1] * (1.0 - hazard);
  }
}

double Lookahead::expected_tokens(int32_t k) const {
  k = std::clamp<int32_t>(k, 0, kMaxBatch);
  std::array<double, kMaxBatch + 1> s;
  survival(k, s.data());
  double sum = 0.0;
  for (int32_t i = 0; i <= k; ++i) sum += s[i];
  return sum;
}

double Lookahead::cost_ratio() const {
  // Every session of a shared pass drafts before it, one after another.
  const double one = pass_ms(fixed_ + rounds_);
  return one > 0 ? rounds_ * draft_ms_per_token_ / one : 0.0;
}

double Lookahead::batch_ratio(int32_t k) const {
  const double one = pass_ms(fixed_ + rounds_);
  if (one <= 0 || k <= 0) return 1.0;
  return std::max(1.0, pass_ms(fixed_ + rounds_ * (k + 1)) / one);
}

void Lookahead::shared_pass(int32_t rounds, int32_t fixed, double others_draft_ms) {
  rounds_ = std::clamp<int32_t>(rounds, 1, kMaxPass);
  fixed_ = std::clamp<int32_t>(fixed, 0, kMaxPass);
  others_draft_ms_ = std::max(0.0, others_draft_ms);
}

int32_t Lookahead::next() {
  if (max_draft_ == 0) return 0;
  if (!adaptive_) return max_draft_;
  // The cost model needs the time of a plain one-token pass: measure it in the first round and
  // refresh it now and then (a plain round costs at most the tokens a draft would have added).
  if (pass_ms(fixed_ + rounds_) <= 0 || ++since_plain_ >= kRefreshRounds) {
    since_plain_ = 0;
    return 0;
  }
  // The first draft asks for the most: it measures the drafter's cost and shows whether it ends
  // its drafts itself (asked for fewer tokens than it would draft, a draft model never shows it).
  if (!seen_draft_) return max_draft_;
  const double c = cost_ratio();
  // A drafter that costs real time and often ends its drafts itself (a draft model stopping when
  // not confident) knows better than the rates below where each draft should end: ask it for the
  // most, and decide only whether drafting pays, from what recent rounds gave (tokens per unit of
  // time against plain decoding's one token per single-token pass). Replaying a HumanEval trace
  // of the 0.5B draft, its confidence stop with its cap of 4 beat any k chosen from the rates.
  const bool trees = tree_rate() > 0.5;
  const bool self_limiting = (c > 0.05 && self_stop_rate() > 0.2) || trees;
  if (paused_ > 0) {
    --paused_;
    if (paused_ > 0) return 0;
    return self_limiting ? max_draft_ : std::min<int32_t>(2, max_draft_);  // probe
  }
  if (self_limiting) {
    // Pause only on clear evidence: timings on a shared machine vary from round to round, and a
    // pause in a stretch where drafting pays costs far more than drafting on in one where it
    // barely does not. Pauses double while probes keep failing.
    const double ratio =
        realized_tokens_ * pass_ms(fixed_ + rounds_) / std::max(realized_ms_, 1e-9);  // vs plain
    const bool clear = (realized_rounds_ >= kQuickJudgeRounds && ratio < kQuickPauseMargin) ||
                       (realized_rounds_ >= kJudgeRounds && ratio < kPauseMargin);
    if (!clear) {
      if (realized_rounds_ >= 2 * kJudgeRounds) pause_len_ = pause_rounds;  // a probe that paid
      // A tree drafter sizes its trees itself. A chain drafter ends its drafts where it is unsure,
      // but does not know what a longer verify pass costs: where one more token makes the pass
      // clearly dearer (kSteepPass; a long context, whose attention runs once per token), its
      // drafts stop where the rates say a longer one stops paying.
      const double one = pass_->measured(std::min(fixed_ + rounds_, kMaxPass)),
                   two = pass_->measured(std::min(fixed_ + 2 * rounds_, kMaxPass));
      if (trees || one <= 0 || two < kSteepPass * one) return max_draft_;
      return std::max<int32_t>(1, best_draft(c));
    }
    paused_ = pause_len_;
    pause_len_ = std::min(2 * pause_len_, kMaxPauseRounds);
    realized_tokens_ = realized_ms_ = realized_rounds_ = 0;  // judge afresh after the pause
    return 0;
  }
  const int32_t best_k = best_draft(c);
  // Pause: long when drafting costs real time (a draft model), short when drafts are nearly free
  // (prompt lookup), whose next match may come a few tokens later.
  if (best_k == 0) paused_ = c > 0.05 ? pause_rounds : pause_rounds / 4;
  return best_k;
}

void Lookahead::wish(int32_t limit, Wish &w) {
  w.most = 0;
  w.fixed = w.probe = false;
  w.value.fill(0);
  w.nodes.fill(0);
  w.draft_ms.fill(0);
  w.value[0] = 1.0;
  // The round's state, as next() keeps it: refresh rounds, the first draft, pauses and probes.
  const bool trees = tree_rate() > 0.5;
  int32_t most = 0;
  bool fixed = false, probe = false;
  if (max_draft_ == 0) {
    most = 0;
  } else if (!adaptive_) {
    most = max_draft_;  // a fixed draft length: the caller's choice
    fixed = true;
  } else if (pass_ms(fixed_ + rounds_) <= 0 || ++since_plain_ >= kRefreshRounds) {
    since_plain_ = 0;
  } else if (!seen_draft_ || (trees && round_count_ < 0.5)) {
    most = max_draft_;
    probe = true;
  } else if (paused_ > 0) {
    if (--paused_ == 0) {
      const bool self_limiting = (cost_ratio() > 0.05 && self_stop_rate() > 0.2) || trees;
      most = self_limiting ? max_draft_ : std::min<int32_t>(2, max_draft_);
      probe = true;
    }
  } else {
    most = max_draft_;
  }
  w.most = std::clamp<int32_t>(most, 0, std::max<int32_t>(limit, 0));
  w.fixed = fixed && w.most > 0;
  w.probe = probe && w.most > 0;
  if (w.most == 0) return;

  if (trees && !w.probe) {
    // Decayed realized rounds: A tokens accepted from n nodes on average (see the header).
    const double a_tokens = round_accepted_ / round_count_,
                 n_nodes = std::max(1.0, round_nodes_ / round_count_),
                 ms = round_draft_ms_ / round_count_, a = a_tokens / (1.0 + a_tokens);
    double step = a_tokens / n_nodes;
    for (int32_t k = 1; k <= w.most; ++k) {
      if (k > n_nodes) step *= a;
      // The node that straddles n is worth the straight part up to n, the rest beyond it.
      const double straight = std::clamp(n_nodes - (k - 1), 0.0, 1.0);
      w.value[k] = w.value[k - 1] + (straight * a_tokens / n_nodes + (1.0 - straight) * step);
      w.nodes[k] = k;
      w.draft_ms[k] = ms;
    }
    return;
  }
  std::array<double, kMaxBatch + 1> s;
  survival(w.most, s.data());
  double optimistic = 1.0;
  for (int32_t k = 1; k <= w.most; ++k) {
    // A probe is valued as if its tokens were accepted at kProbeAcceptance at least.
    optimistic *= kProbeAcceptance;
    if (w.probe) s[k] = std::max(s[k], optimistic);
    // One pseudo-round that drafts: a position never allowed yet is assumed drafted.
    const double d = (drafted_at_[k] + 1.0) / (allowed_at_[k] + 1.0);
    w.value[k] = w.value[k - 1] + d * s[k];
    w.nodes[k] = w.nodes[k - 1] + d;
    w.draft_ms[k] = steady_draft_ms_ * (w.nodes[k] + 1.0 - d);
  }
}

void Lookahead::granted(const Wish &w, int32_t k) {
  if (w.fixed || w.most == 0) return;
  if (k > 0) {
    pause_len_ = pause_rounds;  // drafting pays again: the next pause starts short
    return;
  }
  // Turned down (a probe too): pause as a session alone does when no k pays, long for a costly
  // drafter (and longer while it keeps being turned down), short for a nearly free one.
  if (cost_ratio() > 0.05) {
    paused_ = pause_len_;
    pause_len_ = std::min(2 * pause_len_, kMaxPauseRounds);
  } else {
    paused_ = pause_rounds / 4;
  }
}

int32_t Lookahead::best_draft(double c) const {
  int32_t best_k = 0;
  double best = 1.0;  // plain decoding: one token per single-token pass
  for (int32_t k = 1; k <= max_draft_; ++k) {
    const double e = expected_tokens(k) / (k * c + batch_ratio(k));
    if (e > best * 1.0001) {
      best = e;
      best_k = k;
    }
  }
  return best_k;
}

double Lookahead::self_stop_rate() const {
  return asked_ > 0 ? self_stops_ / asked_ : 0.0;
}

void Lookahead::observe(int32_t requested, int32_t drafted, int32_t accepted, double draft_ms,
                        double target_ms, int32_t batch, bool tree) {
  const double decay = 0.9;
  if (drafted > 0) {
    drafts_ = drafts_ * decay + 1.0;
    trees_ = trees_ * decay + (tree ? 1.0 : 0.0);
  }
  if (requested >= 2) {
    asked_ = asked_ * decay + 1.0;
    self_stops_ = self_stops_ * decay + (drafted < requested ? 1.0 : 0.0);
  }
  if (requested > 0) {
    seen_draft_ = true;
    realized_tokens_ = realized_tokens_ * decay + (accepted + 1);
    realized_ms_ = realized_ms_ * decay + draft_ms + others_draft_ms_ + target_ms;
    realized_rounds_ += 1;
  }
  if (drafted > 0 && !tree) {
    // Each drafted token up to and including the first rejection is one trial of acceptance.
    int32_t trials = accepted + (accepted < drafted ? 1 : 0);
    accepted_ = accepted_ * decay + accepted;
    drafted_ = drafted_ * decay + trials;
    const int s = hot_ ? 1 : 0;
    for (int32_t i = 1; i <= kMaxBatch; ++i) {
      reached_[s][i] *= decay;
      rejected_[s][i] *= decay;
    }
    for (int32_t i = 1; i <= std::min(drafted, accepted + 1) && i <= kMaxBatch; ++i) {
      reached_[s][i] += 1.0;
      if (i == accepted + 1) rejected_[s][i] += 1.0;
    }
    hot_ = accepted == drafted;
    // One draft step per drafted token, and one more for a token the drafter declined.
    double per_token = draft_ms / (drafted + (drafted < requested ? 1 : 0));
    draft_ms_per_token_ =
        draft_ms_per_token_ > 0 ? 0.8 * draft_ms_per_token_ + 0.2 * per_token : per_token;
    if (steady_draft_ms_ == 0)
      steady_draft_ms_ = per_token;
    else if (drafted_last_)
      steady_draft_ms_ = 0.8 * steady_draft_ms_ + 0.2 * per_token;
  }
  if (requested > 0) {
    round_count_ = round_count_ * decay + 1.0;
    round_accepted_ = round_accepted_ * decay + accepted;
    round_nodes_ = round_nodes_ * decay + drafted;
    round_draft_ms_ = round_draft_ms_ * decay + draft_ms;
    if (!tree)
      for (int32_t i = 1; i <= kMaxBatch; ++i) {
        allowed_at_[i] = allowed_at_[i] * decay + (i <= requested ? 1.0 : 0.0);
        drafted_at_[i] = drafted_at_[i] * decay + (i <= drafted ? 1.0 : 0.0);
      }
  }
  if (batch >= 1) pass_->record(batch, target_ms);
  drafted_last_ = requested > 0;
}

}  // namespace specinfer
