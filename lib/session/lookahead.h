// Adaptive draft length. Chooses k each round to maximise the expected tokens per unit of time,
//   E(k) = (1 - a^(k+1)) / ((1 - a) (k c + r(k))),
// from the recent per-token acceptance a, the measured cost ratio c (one drafted token's time / one
// single-token target pass) and r(k), the measured time of a (k+1)-token target pass relative to a
// single-token pass (1 for a perfectly memory-bound target). When no k > 0 beats plain decoding
// (E = 1), drafting pauses for a while and then probes again.
//
// Acceptance is bursty (prompt lookup copies long runs, then misses at an edit), so the numerator
// is not taken from one rate a: the expected tokens per round are 1 + sum_{i<=k} S_i, with S_i the
// measured chance that the first i drafted tokens are all accepted (a per-position rejection
// hazard, estimated from recent rounds), kept separately after a round whose draft was accepted
// whole ("hot") and after any other round. With too few observations at a position, the hazard
// falls back to the one before it, then to the overall rate 1 - a.
//
// A costly drafter (c > 0.05) that often drafts fewer tokens than asked ends its drafts on its own
// evidence (a draft model's confidence): then k is max_draft, and drafting pauses when recent
// drafting rounds gave clearly fewer tokens per unit of time than plain decoding would (see
// kPauseMargin below); pauses double, up to kMaxPauseRounds, while the probes after them fail.
// Where every token of a verify pass costs clearly more (a measured r(1) above kSteepPass: a long
// context), k is instead the best k of the formula above, at least 1: the drafter's confidence
// does not weigh what a longer pass costs.
// The first draft asks for the most, so that such a drafter shows that it stops itself.
//
// A drafter that proposes token trees sizes them itself (it is handed the measured pass costs
// r(k)): per-position hazards describe chains, not trees, so after tree rounds k is max_draft and
// drafting pauses only on clear evidence, as for a self-limiting drafter.
//
// When sessions share target passes (Session::step_many), a pass's time is recorded by its total
// token count, and the costs assume that the other sessions of the last pass draft as this one
// does: with R rounds and F other tokens (prompt chunks) in it, r(k) = pass(F + R (k + 1)) /
// pass(F + R), and c counts the R drafts made before the pass. A draft that is nearly free while
// the shared pass is bound by reading the weights stops paying once R drafts make it bound by
// arithmetic, so drafts shrink as the batch grows.
//
// The pass times live in a PassCost (session/pass_cost.h): the lookahead's own, or the one its
// session's target shares with every session on the same loaded model.
//
// Stepped with other sessions under the group's budget rule (session/budget.h), a session does not
// choose k itself: wish() says what it may draft this round (0 in a pause or a refresh round) and
// what drafting is worth, as curves over k (expected tokens, expected tokens added to the pass,
// expected drafting time), and granted() hears the rule's answer. A wish the rule turns down
// starts a pause, as a round whose best k is 0 does for a session alone: no new evidence comes in
// while it does not draft, so the rule would only say no again. The first draft and the probe at
// the end of a pause are valued as if each token were accepted at kProbeAcceptance at least, so
// that the rule lets them draft only where a drafter that good would pay: where passes are bound
// by arithmetic and nothing but a near-perfect draft pays, no probe is run at all (a forced probe
// of 2 tokens every few steps would cost a batch of sessions about a tenth of its speed there).
// Only a fixed draft length (not adaptive) is drafted whatever the rule says. What the curves
// are:
//  - a chain drafter: expected tokens 1 + sum_{i<=k} d_i S_i, with S_i the per-position survival
//    above and d_i the share of recent rounds allowed an i-th token that drafted one (a drafter
//    ending its own drafts, or prompt lookup without a match, drafts less than allowed); the
//    tokens added are sum_{i<=k} d_i, the time one draft step per token drafted plus one for a
//    token declined (timed in rounds that follow a round that asked for a draft: the first
//    draft after plain rounds also catches a draft model up on the text it skipped);
//  - a tree drafter, whose nodes have no positions: from decayed realized rounds, A accepted
//    tokens per round with n nodes on average, the curve through (0, 1) and (n, 1 + A), straight
//    (a lower bound where the drafter fills a smaller budget with its best nodes first), and past
//    n each node worth a times the one before, a = A / (1 + A) (the per-token acceptance of a
//    chain that keeps A tokens on average), so that a budget that held the trees small can grow
//    again; a budget of k nodes is priced as k tokens and one round's drafting time.
//
// reset() starts a new text: acceptance is learned afresh, the measured costs are kept.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "session/pass_cost.h"

namespace specinfer {

class Lookahead {
 public:
  static constexpr int32_t kMaxBatch = 17;  // verify batches up to max_draft + 1 tokens
  static constexpr int32_t kMaxPass = PassCost::kMaxTokens;  // pass sizes timed

  Lookahead() : pass_(std::make_shared<PassCost>()) {}
  void configure(int32_t max_draft, bool adaptive);
  // The pass times to read and (observe) record: a session hands it its target's, shared by every
  // session on the loaded model. configure() and reset() keep them.
  void use_pass_cost(std::shared_ptr<PassCost> cost) { pass_ = std::move(cost); }
  PassCost &pass_cost() const { return *pass_; }
  // k for the next round (0 = do not draft).
  int32_t next();
  // After a round: tokens asked for, drafted, accepted, the time spent drafting and in the target
  // pass, and how many tokens that pass scored (0: the pass is recorded elsewhere, as step_many
  // does once for its group). c is the time of one draft step: a drafter that drafted fewer tokens
  // than asked spent one step on the token it declined.
  void observe(int32_t requested, int32_t drafted, int32_t accepted, double draft_ms,
               double target_ms, int32_t batch, bool tree = false);
  // Share of recent rounds (asking for 2 or more) in which the drafter drafted fewer than asked.
  double self_stop_rate() const;
  // Share of recent drafting rounds whose draft was a tree.
  double tree_rate() const { return drafts_ > 0 ? trees_ / drafts_ : 0.0; }
  // A new text: forgets the acceptance history and any pause, keeps the measured costs.
  void reset();

  // Per-token acceptance over recent rounds, all states together.
  double acceptance() const;
  // Expected tokens per round when drafting k, in the current state: 1 + sum_{i<=k} S_i.
  double expected_tokens(int32_t k) const;
  double cost_ratio() const;
  // The k in 1 .. max_draft of most expected tokens per unit of time at draft cost ratio c, or 0
  // when none beats plain decoding.
  int32_t best_draft(double c) const;
  // r(k): time of a pass in which every round drafts k relative to one in which none does
  // (measured, or interpolated), with the rounds and other tokens of the last shared pass.
  double batch_ratio(int32_t k) const;
  // The pass this session's last round shared: `rounds` rounds (this one included), `fixed`
  // tokens of prompt chunks, and the time the other rounds spent drafting before it (which this
  // round waited for). A session alone: (1, 0, 0), the default. Call before observe().
  void shared_pass(int32_t rounds, int32_t fixed, double others_draft_ms);
  // Time of a target pass over n tokens (measured, or interpolated; 0 with nothing measured).
  double pass_ms(int32_t n) const { return pass_->ms(n); }

  // What a session stepped with others offers the group's budget rule this round; the curves are
  // filled for k = 0 .. most.
  struct Wish {
    int32_t most = 0;    // the most it may draft (0: a plain round)
    bool fixed = false;  // a fixed draft length (not adaptive): `most` whatever the rule says
    bool probe = false;  // the first draft or a probe after a pause: valued optimistically
    std::array<double, kMaxBatch + 1> value{};     // expected tokens committed by the round
    std::array<double, kMaxBatch + 1> nodes{};     // expected tokens the draft adds to the pass
    std::array<double, kMaxBatch + 1> draft_ms{};  // expected time spent drafting
  };
  // This round's wish, at most `limit` tokens (what may still be emitted and what fits the
  // context). Counts the round, like next(): call once per round, then granted().
  void wish(int32_t limit, Wish &out);
  // The rule gave this round's wish k tokens.
  void granted(const Wish &wish, int32_t k);

  static constexpr double prior_acceptance = 0.6;
  static constexpr int32_t pause_rounds = 16;
  static constexpr int32_t kMaxPauseRounds = 64;
  // A self-limiting drafter pauses when its recent drafting rounds ran below kQuickPauseMargin of
  // plain decoding's speed over at least kQuickJudgeRounds rounds, or below kPauseMargin over at
  // least kJudgeRounds: a few rounds vary too much (accepted lengths, timings) to judge a small
  // gap.
  static constexpr double kQuickJudgeRounds = 4, kQuickPauseMargin = 0.6;
  static constexpr double kJudgeRounds = 16, kPauseMargin = 0.85;
  // A self-limiting chain drafter's drafts are capped by the rates when a two-token pass has
  // been measured at more than kSteepPass one-token passes.
  static constexpr double kSteepPass = 1.25;
  static constexpr int32_t kRefreshRounds = 64;  // rounds between plain rounds that re-measure
  // A probe in a group (wish) is valued as if each token were accepted with this chance at least.
  static constexpr double kProbeAcceptance = 0.8;

 private:
  // S_i, i = 1 .. k, in the current state (s[0] = 1).
  void survival(int32_t k, double *s) const;

  std::shared_ptr<PassCost> pass_;
  int32_t max_draft_ = 8;
  bool adaptive_ = true;
  double accepted_ = 0, drafted_ = 0;  // exponentially decayed counts
  // Per state [cold, hot] and draft position i (1-based): decayed counts of rounds whose first
  // i - 1 drafted tokens were accepted and that drafted an i-th, and of those that rejected it.
  std::array<std::array<double, kMaxBatch + 1>, 2> reached_{}, rejected_{};
  bool hot_ = false;                   // the last round's draft was accepted whole
  double asked_ = 0, self_stops_ = 0;  // decayed counts for self_stop_rate
  double drafts_ = 0, trees_ = 0;      // decayed counts for tree_rate
  // Decayed tokens and time (draft + target pass) of recent drafting rounds, and their number.
  double realized_tokens_ = 0, realized_ms_ = 0, realized_rounds_ = 0;
  double draft_ms_per_token_ = 0;  // moving average
  // The same from rounds that follow a drafting round (and the first one), for wish(): a draft
  // after plain rounds also brings a drafter with a model of its own up to the text it skipped,
  // which says nothing of what the next draft costs.
  double steady_draft_ms_ = 0;
  bool drafted_last_ = false;  // the last round asked the drafter for a draft
  // Decayed counts, per draft position i, of chain rounds allowed an i-th token and of those
  // that drafted one (d_i for wish()).
  std::array<double, kMaxBatch + 1> allowed_at_{}, drafted_at_{};
  // Decayed sums over drafting rounds of any shape: rounds, tokens accepted, nodes, drafting time.
  double round_count_ = 0, round_accepted_ = 0, round_nodes_ = 0, round_draft_ms_ = 0;
  // The last pass's rounds and other tokens (see shared_pass).
  int32_t rounds_ = 1, fixed_ = 0;
  double others_draft_ms_ = 0;
  int32_t paused_ = 0;
  int32_t pause_len_ = pause_rounds;  // the next pause of a self-limiting drafter
  int32_t since_plain_ = 0;
  bool seen_draft_ = false;  // a round has asked for a draft since configure()
};

}  // namespace specinfer
