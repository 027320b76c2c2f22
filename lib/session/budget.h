// The draft budget of a shared target pass: how many tokens each session of a group stepped
// together (Session::step_many) drafts this step.
//
// Every session offers a value curve: value(k), the tokens its round is expected to commit when it
// may draft k (1 + the chance that the first drafted token is accepted + that the first two are
// + ...), with nodes(k), the tokens the draft is expected to add to the pass, and draft_ms(k), the
// time drafting them takes. The pass also scores each session's last token and F tokens of prompt
// chunks. The rule picks k_i for every session to maximise the expected goodput of the step,
//
//   G = sum_i value_i(k_i) / (T(F + sum_i (1 + nodes_i(k_i))) + sum_i draft_ms_i(k_i)),
//
// with T the time of a pass by its token count (session/pass_cost.h). Sessions draft one after
// another before the pass, so their drafting times add up.
//
// Greedy by marginal value per marginal time: from every session at its least k, repeatedly take
// the step (one session, from k to any larger k') whose added value per added time is largest,
// and keep whichever of the plans passed on the way (the first one included) has the largest G.
// Because a drafted token is accepted only if the ones before it are, value_i grows by less with
// every k, so the best steps come first; looking at every k' rather than k + 1 alone carries the
// greedy over a pass time that jumps (one more token starting a new tile of the matmuls). The
// first plan (every session at its least: plain batching, when no session insists on a probe) is
// always a candidate, so the chosen plan's predicted goodput is never below it.
//
// A step that also scores prompt chunks takes long and commits few tokens, so that nearly any
// draft would raise its own goodput G; but the time a draft adds to it delays every later step
// as well, and is worth what a step without prompt chunks makes of it. So a move is taken only
// when its added value per added time beats the plain goodput of the step without its F tokens
// too (the same as plain goodput when F = 0, where every move that raises G beats it anyway): a
// draft model's catch-up on a fresh prompt is not bought in a prompt step just because that step
// is slow.
//
// The pass time T counts a logit row for every token; prompt chunks want fewer (their last token's
// alone), so a step with them takes S = fixed_saving_ms less than T says: the plan's pass time is
// T(tokens) - S, and the step without its prompt chunks T(tokens - F).
//
// A pure function of the curves, the pass time, F and S: tests/test_budget.cpp checks it on
// synthetic costs and acceptance curves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace specinfer {

// What one session offers a shared pass. The arrays have most + 1 entries, for k = 0 .. most.
struct DraftOffer {
  int32_t least = 0;                 // k at least this (a probe the session's lookahead insists on)
  int32_t most = 0;                  // k at most this (0: a plain round)
  const double *value = nullptr;     // expected tokens committed; value[0] = 1
  const double *nodes = nullptr;     // expected tokens the draft adds to the pass; nodes[0] = 0
  const double *draft_ms = nullptr;  // expected time drafting; draft_ms[0] = 0
};

// Time of a target pass over t tokens (t fractional: an expected count). Nondecreasing.
using PassTime = std::function<double(double)>;

struct DraftBudget {
  std::vector<int32_t> k;      // per offer, least .. most
  double value = 0;            // expected tokens committed by the step
  double pass_tokens = 0;      // expected tokens of the pass (F included)
  double fixed_tokens = 0;     // F
  double fixed_saving_ms = 0;  // S
  double pass_ms = 0;          // T(pass_tokens) - S
  double draft_ms = 0;         // expected drafting time of the step
  double goodput = 0;          // value / (pass_ms + draft_ms)
  double plain_goodput = 0;    // the same with every session at its least
};

// The pass time from a table of times by whole token counts (PassCost::monotone_table): linear
// between entries, past the last with the last step; 0 for an empty table.
PassTime interpolated_pass_time(std::vector<double> table);

// The plan of most expected goodput (see above) for the offers, F = fixed_tokens and
// S = fixed_saving_ms. With a pass time that is not positive (nothing measured yet) every session
// gets its least.
DraftBudget choose_drafts(const std::vector<DraftOffer> &offers, double fixed_tokens,
                          const PassTime &pass_ms, double fixed_saving_ms = 0);

// For a drafter that sizes its own token tree within the k_i it was given: out[n], n = 0 .. k_i,
// the cost of session i's round with n nodes, in the unit the drafter compares expected tokens
// with (specinfer_draft_request.pass_cost: 1 is its round without a draft). The time its nodes add
// to the pass is divided by the step's time per expected token without them (without its prompt
// chunks either, where that is less: as for the moves above), so that a node pays for the drafter
// where it raises the goodput of the whole step. A session alone (no other offer, F = 0) gets
// T(1 + n) / T(1).
void group_pass_cost(const DraftBudget &budget, const std::vector<DraftOffer> &offers, size_t i,
                     const PassTime &pass_ms, float *out);

}  // namespace specinfer
