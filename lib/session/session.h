// A session: the speculate -> verify -> commit loop over one target, an optional drafter and a
// coupler, with adaptive draft length, UTF-8-safe streaming and statistics. Sessions stepped
// together (step_many) share one target pass per loaded model, and their draft lengths are
// chosen together for the goodput of the whole step (session/budget.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "coupling/coupler.h"
#include "plugin/objects.h"
#include "sampling/sampler.h"
#include "session/budget.h"
#include "session/lookahead.h"
#include "session/stop_strings.h"
#include "specinfer.h"
#include "util/page_buffer.h"

namespace specinfer {

// Most tokens drafted per round. Verify batches (k + 1 tokens) stay below the backend's sgemm
// threshold, where every token's result is bitwise independent of the batch: that is what keeps
// greedy speculative output identical to plain greedy output.
constexpr int32_t kMaxDraft = 16;

// What a drafter's request hands the coupler's draft side (specinfer_draft_request.sample_ctx).
struct DraftSampleCtx {
  const Coupler *coupler = nullptr;
  uint64_t seed = 0;
};

class Session {
 public:
  // Borrows target and drafter (may be nullptr); `coupler` nullptr picks greedy / rejection.
  Session(TargetObject &target, DrafterObject *drafter, const Coupler *coupler,
          const specinfer_session_params &params);
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  // Feeding forgets text held back for the stop strings: what follows is prompt.
  void feed_text(const char *text, size_t len);
  void feed_tokens(const int32_t *tokens, size_t n);
  // Takes the first n tokens of src's text as this (empty) session's prompt, src being on a
  // target that shares this one's loaded model: the positions src's target has scored among them
  // are copied into this one's cache rather than scored again (when the target can copy them;
  // see specinfer_session_fork).
  void continue_from(Session &src, size_t n);
  // The strings that end the generated text (see StopStrings); replaces the previous ones.
  void set_stop_strings(std::vector<std::string> stops) { stops_.set(std::move(stops)); }
  // Constrains the text generated from the next round on (nullptr: none), claiming the
  // constraint; a constraint set before is taken back to its state when set and released. See
  // specinfer_session_set_constraint.
  void set_constraint(ConstraintObject *constraint);

  // One round emitting at most max_emit tokens (clamped to 1 .. max_draft + 1). Appends them to
  // `out`; sets done when the round ended the text (an end-of-generation token or a stop string).
  void step(int32_t max_emit, std::vector<int32_t> &out, bool &done);
  // One round of each of n distinct sessions, as step() would run it, with one target pass for
  // the sessions whose targets share a loaded model (TargetObject::forward_many). max_emits[i]
  // (nullptr: all max_draft + 1) bounds session i's tokens. Appends session i's tokens to outs[i],
  // sets dones[i]; a session that fails gets its error in errors[i] and the others go on.
  // prefill_chunk > 0: a session whose cache is behind its text scores at most that many of the
  // missing tokens in this pass instead of a round (and emits nothing), so that a long prompt does
  // not stall the others; 0: it catches up alone first, as step() does.
  // The draft lengths of sessions that share a pass are chosen together (draft_group): for the
  // most expected tokens per unit of time of the whole step. A session alone in its pass chooses
  // its own, as step() does.
  static void step_many(Session *const *sessions, size_t n, const int32_t *max_emits,
                        int32_t prefill_chunk, std::vector<int32_t> *outs, bool *dones,
                        std::exception_ptr *errors);
  // Rounds until max_tokens, the end of the text, or the callback asks to stop (throws
  // CANCELLED). The last callback's text includes what was held back for the stop strings.
  void generate(int32_t max_tokens, specinfer_token_fn on_tokens, void *user);
  void reset();

  void stats(specinfer_session_stats &out) const;
  // The last round's draft and pass (specinfer_session_round_info).
  const specinfer_round_info &round_info() const { return round_info_; }
  const std::vector<int32_t> &tokens() const { return tokens_; }
  // Most tokens one round can emit: the drafter's most plus one, or with a constraint, room for
  // the tokens it forces.
  size_t max_emit() const { return static_cast<size_t>(node_cap_) + 1; }

  // The text of the last round's tokens: whole UTF-8 characters, none of an end-of-generation
  // token, nothing that may begin a stop string (held back until it is known not to) and nothing
  // from a stop string on.
  const std::string &last_step_text() const { return round_text_; }
  // Ends the text where the caller ends it: returns what was held back for the stop strings.
  const std::string &end_text();
  // Log-probabilities of the emitted tokens with top_n alternatives each (-1: off); see
  // specinfer_session_set_logprobs. The last round's: one entry per emitted token.
  void set_logprobs(int32_t top_n);
  struct RoundLogprobs {
    int32_t top_n = 0;
    std::vector<int32_t> tokens, top_tokens;  // [n], [n][top_n]
    std::vector<float> logprobs, top_logprobs;
  };
  const RoundLogprobs &last_logprobs() const { return round_logprobs_; }
  // Log-probabilities of the text's own tokens as the steps score it (-1: off); see
  // specinfer_session_set_prompt_logprobs. Entry i is of the text's token i + 1.
  void set_prompt_logprobs(int32_t top_n);
  const RoundLogprobs &prompt_logprobs() const { return prompt_logprobs_; }

  std::string last_error;

 private:
  // What the drafter proposed this round: nodes in draft_tokens_/draft_parents_/draft_probs_.
  struct Draft {
    int32_t requested = 0;   // nodes asked for (the lookahead's k)
    int32_t n = 0;           // nodes proposed
    bool has_probs = false;  // q rows given (else point masses)
    bool chain = true;       // parents[i] == i - 1 for every node
    int32_t forced = 0;      // of the n nodes, the last ones a constraint forced (a chain's end)
    double ms = 0;           // time spent drafting
    double expected = -1;    // the drafter's expected accepted nodes (-1: no estimate)
  };

  // The round, in order: catch up, draft, score, couple, commit. begin_round does all before the
  // target pass (catch up, draft) and returns the pass's batch; end_round all after it, given the
  // pass's time, token count, rounds, prompt-chunk tokens and the rounds' drafting time (several
  // sessions' batches when step_many ran them as one), and whether the pass's time was recorded
  // in the model's table already (else the lookahead records it).
  // begin_round is prepare_round (catch up; with a prefill chunk, the chunk's batch when the cache
  // is behind, else nullptr) and then draft_round (k nodes drafted, their batch); between the two,
  // step_many chooses a group's k together (draft_group). pass_cost: what draft_round hands the
  // drafter as the request's pass_cost (nullptr: the lookahead's ratios).
  void round(int32_t max_emit, std::vector<int32_t> &out, bool &done);
  const specinfer_forward_batch &begin_round(int32_t max_emit, int32_t prefill_chunk);
  const specinfer_forward_batch *prepare_round(int32_t prefill_chunk);
  const specinfer_forward_batch &draft_round(int32_t k, const float *pass_cost);
  void end_round(double pass_ms, int32_t pass_tokens, int32_t pass_rounds, int32_t pass_fixed,
                 double pass_draft_ms, bool pass_recorded, std::vector<int32_t> &out, bool &done);
  static void pass_group(Session *const *sessions, const std::vector<size_t> &group,
                         const specinfer_forward_batch *const *batches, const DraftBudget *budgets,
                         std::vector<int32_t> *outs, bool *dones, std::exception_ptr *errors,
                         const std::chrono::steady_clock::time_point *begun);
  static void draft_group(Session *const *sessions, const std::vector<size_t> &group,
                          const int32_t *emits, const specinfer_forward_batch **batches,
                          std::exception_ptr *errors,
                          const std::chrono::steady_clock::time_point *begun, DraftBudget *plans);
  // Before a pass: the round's share of it for round_info_ (n_sessions rounds, pass_tokens
  // tokens of which pass_rows want logits, the step's plan when the rounds' drafts were chosen
  // together).
  void plan_round(int32_t n_sessions, int32_t pass_tokens, int32_t pass_rows,
                  const DraftBudget *plan);
  void timed_round(int32_t max_emit, std::vector<int32_t> &out, bool &done);
  void shift_context();
  void catch_up();
  size_t trim_cache();
  const specinfer_forward_batch &prefill_batch(size_t want, size_t chunk);
  void prefill_done(const specinfer_forward_batch &b);
  void tell_drafter();
  void timed_tell_drafter();
  size_t drafter_missed() const;
  int32_t draft_limit(int32_t max_emit) const;
  int32_t draft_budget(int32_t max_emit);
  Draft propose(int32_t k, const float *pass_cost);
  void draft_request(int32_t k, const float *pass_cost, specinfer_draft_request &req,
                     specinfer_draft &out);
  Draft drafted(int32_t k, const specinfer_draft &out, double ms);
  static void propose_together(Session *const *sessions, const std::vector<size_t> &members,
                               const std::vector<int32_t> &ks, std::exception_ptr *errors);
  const specinfer_forward_batch &score_batch(Draft &d);
  // With a constraint: drops the drafted nodes it rules out (and their subtrees), appends the
  // tokens it forces after a chain, and keeps each scored row's mask for couple().
  void constrain_draft(Draft &d);
  void constrain_to(int32_t node);
  void constraint_row(int32_t row);
  void mask_rows(const Draft &d);
  void advance_constraint(std::vector<int32_t> &out, size_t first, int32_t &consumed, bool &ended);
  void constraint_cut(size_t emitted, int32_t &consumed, bool ended, bool &done);
  void restart_constraint();
  void grow_rows(int32_t nodes);
  // With log-probabilities on: the round's rows made ready (read at once when a mask will change
  // them, else when an emitted token needs one); a row's log-sum-exp and top tokens; after the
  // commit, the emitted tokens' entries from their rows.
  void prepare_row_logprobs(int32_t rows);
  void score_row(int32_t row);
  void round_logprobs(const std::vector<int32_t> &out, size_t emitted);
  VerifyResult couple(const Draft &d);
  size_t commit(const Draft &d, const VerifyResult &v, std::vector<int32_t> &out, bool &done);

  bool end_text_at_stop(std::vector<int32_t> &out, size_t first);
  bool is_stop(int32_t token) const;
  void release();

  TargetObject &target_;
  DrafterObject *drafter_;
  const Coupler *coupler_;
  std::unique_ptr<Coupler> owned_coupler_;
  specinfer_session_params params_;
  SamplingParams sampling_;
  bool greedy_;       // the coupler reads only the argmax: it gets raw logits
  int32_t node_cap_;  // most nodes a round scores after the last token (the buffers' rows - 1)
  int32_t vocab_;
  int32_t n_ctx_;
  int32_t hidden_size_;  // 0 when the target reports none: no hidden state for the drafter

  std::vector<int32_t> tokens_;     // the whole sequence
  std::vector<int32_t> kv_tokens_;  // what the target's KV cache holds (a prefix of some text)
  size_t drafter_known_ = 0;        // tokens committed to the drafter
  bool drafter_begun_ = false;
  std::string utf8_pending_;  // bytes of an unfinished UTF-8 character
  StopStrings stops_;
  std::string round_text_;  // the text of the last round's tokens
  std::string end_text_;    // end_text's last result

  // Rows for the longest draft; a row's pages become resident when a draft first reaches it.
  PageBuffer<float> logits_;       // [k+1][vocab]: after the last token, then after each node
  PageBuffer<float> probs_;        // [k+1][vocab]: logits_ through the sampler
  PageBuffer<float> draft_probs_;  // [k][vocab]: q of each node (untouched by point masses)
  std::vector<int32_t> draft_tokens_, draft_parents_;  // [k]
  std::vector<int32_t> accepted_path_, keep_idx_;      // [k], [k+1]
  std::vector<int32_t> batch_tokens_, batch_pos_;
  std::vector<uint8_t> tree_mask_;  // [k+1][k+1], for a draft that is not a chain
  Draft draft_;                     // this round's draft (begin_round to end_round)
  bool prefilling_ = false;         // this round's pass is a chunk of the prompt
  specinfer_forward_batch verify_batch_{};
  // The target's last hidden state at sequence index hidden_pos_ (-1: none), handed to the
  // drafter; the verify pass writes one row per scored token into verify_hidden_.
  std::vector<float> hidden_, verify_hidden_;  // [hidden_size], [k+1][hidden_size]
  int64_t hidden_pos_ = -1;
  std::vector<float> pass_cost_;  // [k+1]: the cost of a pass over i+1 tokens (propose's request)
  DraftSampleCtx sample_ctx_;     // the request's sample_ctx

  // The constraint (nullptr: none): tokens consumed since it was set or the text was fed; the
  // nodes of the draft being constrained whose tokens it holds now (root side first); each
  // scored row's allowed tokens, [node_cap_ + 1][mask_words_], and whether the row has one (a
  // row after an end-of-generation node has none: nothing after it is kept).
  ConstraintObject *constraint_ = nullptr;
  int32_t constraint_consumed_ = 0;
  std::vector<int32_t> constraint_path_, constraint_anc_, forced_;
  std::vector<uint32_t> masks_;
  std::vector<uint8_t> row_masked_;
  int32_t mask_words_ = 0;
  // The round's bound on emitted tokens (round() and step_many set it), which forced tokens
  // stay within.
  int32_t emit_limit_ = 1;

  // Log-probabilities (-1: off): per scored row of the round, its log-sum-exp and its top
  // tokens with their logits ([rows][logprob_top_]); the last round's emitted tokens'.
  int32_t logprob_top_ = -1;
  std::vector<uint8_t> row_scored_;
  std::vector<double> row_lse_;
  std::vector<int32_t> row_top_tokens_;
  std::vector<float> row_top_logits_;
  RoundLogprobs round_logprobs_;
  // The text's own log-probabilities (-1: off): entries for its tokens 1 .. prompt_want_, taken
  // from the prefill passes' rows (all of a chunk's rows are asked for while some are missing);
  // the rows' and the last chunk's hidden states land in their own buffers.
  static constexpr size_t kPromptLogprobChunk = 64;
  int32_t prompt_top_ = -1;
  size_t prompt_want_ = 0;
  RoundLogprobs prompt_logprobs_;
  PageBuffer<float> prompt_logits_;   // [chunk][vocab]
  std::vector<float> prompt_hidden_;  // [chunk][hidden_size]
  bool recording_prompt() const {
    return prompt_top_ >= 0 && prompt_logprobs_.tokens.size() < prompt_want_;
  }
  void record_prompt_rows(const specinfer_forward_batch &b, size_t start);
  void restart_prompt_logprobs();

  Lookahead lookahead_;
  // The last round, as end_round saw it; the pass's prediction and the step's plan are set by
  // whoever runs the pass (round, step_many) before end_round.
  specinfer_round_info round_info_{};

  // statistics
  int64_t n_prompt_ = 0, n_generated_ = 0, n_rounds_ = 0, n_passes_ = 0, n_drafted_ = 0,
          n_accepted_ = 0, n_shifts_ = 0, n_forced_drafted_ = 0, n_forced_accepted_ = 0,
          n_estimated_ = 0, n_cached_ = 0;
  bool count_cached_ = false;  // a feed since the last trim: the next one counts n_cached_
  double t_prefill_ = 0, t_draft_ = 0, t_verify_ = 0, t_sample_ = 0, t_total_ = 0,
         t_constraint_ = 0;
  double expected_sum_ = 0, estimated_accepted_ = 0;  // over the n_estimated_ rounds
};

}  // namespace specinfer
