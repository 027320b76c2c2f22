// Log-probabilities of a session's emitted tokens (specinfer_session_set_logprobs): each scored
// row's log-sum-exp and most likely tokens are taken from the target's raw logits before any mask
// touches them, and after the commit every emitted token reads its entry from the row that scored
// it (row 0 for the first token, the row after accepted node i for the token after it).
#include <algorithm>
#include <cmath>

#include "session/session.h"
#include "util/error.h"

namespace specinfer {

void Session::set_logprobs(int32_t top_n) {
  if (top_n < -1 || top_n > SPECINFER_MAX_TOP_LOGPROBS)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "top_n must be in [-1, %d], got %d",
         SPECINFER_MAX_TOP_LOGPROBS, top_n);
  logprob_top_ = top_n;
  round_logprobs_ = RoundLogprobs{};
}

void Session::prepare_row_logprobs(int32_t rows) {
  const size_t top = static_cast<size_t>(logprob_top_);
  row_scored_.assign(static_cast<size_t>(rows), 0);
  row_lse_.resize(static_cast<size_t>(rows));
  row_top_tokens_.resize(static_cast<size_t>(rows) * top);
  row_top_logits_.resize(static_cast<size_t>(rows) * top);
  // A constraint masks the rows in place before the coupler runs: every row is read before that,
  // since which rows emit is not known yet. Without one, only the emitting rows are read, later.
  if (constraint_)
    for (int32_t r = 0; r < rows; ++r) score_row(r);
}

namespace {

// A row of raw scores: its log-sum-exp, and its `top` most likely tokens with their scores, most
// likely first (ties: the lower id, which comes first and is not displaced by an equal score).
double row_stats(const float *x, int32_t vocab, size_t top, int32_t *ids, float *vals) {
  float most = x[0];
  for (int32_t t = 1; t < vocab; ++t) most = std::max(most, x[t]);
  double sum = 0;
  for (int32_t t = 0; t < vocab; ++t) sum += std::exp(x[t] - most);
  // A running insertion into a sorted list of `top`.
  size_t have = 0;
  for (int32_t t = 0; t < vocab && top > 0; ++t) {
    if (have == top && !(x[t] > vals[top - 1])) continue;
    size_t j = have < top ? have++ : top - 1;
    while (j > 0 && x[t] > vals[j - 1]) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
      --j;
    }
    vals[j] = x[t];
    ids[j] = t;
  }
  return static_cast<double>(most) + std::log(sum);
}

}  // namespace

void Session::score_row(int32_t r) {
  const size_t top = static_cast<size_t>(logprob_top_);
  // (Pointers from data(): with top 0 the vectors are empty.)
  row_lse_[r] = row_stats(verify_batch_.logits + static_cast<size_t>(r) * vocab_, vocab_, top,
                          row_top_tokens_.data() + static_cast<size_t>(r) * top,
                          row_top_logits_.data() + static_cast<size_t>(r) * top);
  row_scored_[r] = 1;
}

void Session::set_prompt_logprobs(int32_t top_n) {
  if (top_n < -1 || top_n > SPECINFER_MAX_TOP_LOGPROBS)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "top_n must be in [-1, %d], got %d",
         SPECINFER_MAX_TOP_LOGPROBS, top_n);
  prompt_top_ = top_n;
  restart_prompt_logprobs();
  if (top_n >= 0 && !tokens_.empty()) prompt_want_ = tokens_.size() - 1;
}

void Session::restart_prompt_logprobs() {
  prompt_logprobs_ = RoundLogprobs{};
  prompt_logprobs_.top_n = std::max(prompt_top_, 0);
  prompt_want_ = 0;
}

// After a prefill pass that asked for all its rows: row r (the text's position start + r) gives
// the entry of the token after it, while entries are wanted and follow on from the last.
void Session::record_prompt_rows(const specinfer_forward_batch &b, size_t start) {
  RoundLogprobs &lp = prompt_logprobs_;
  const size_t top = static_cast<size_t>(lp.top_n);
  for (int32_t r = 0; r < b.n_tokens && r < b.n_logits; ++r) {
    const size_t pos = start + static_cast<size_t>(r);
    if (pos != lp.tokens.size() || pos >= prompt_want_) continue;
    const float *x = b.logits + static_cast<size_t>(r) * vocab_;
    const int32_t token = tokens_[pos + 1];
    lp.top_tokens.resize((pos + 1) * top);
    lp.top_logprobs.resize((pos + 1) * top);
    const double lse = row_stats(x, vocab_, top, lp.top_tokens.data() + pos * top,
                                 lp.top_logprobs.data() + pos * top);
    for (size_t j = 0; j < top; ++j)
      lp.top_logprobs[pos * top + j] =
          static_cast<float>(static_cast<double>(lp.top_logprobs[pos * top + j]) - lse);
    lp.tokens.push_back(token);
    lp.logprobs.push_back(static_cast<float>(static_cast<double>(x[token]) - lse));
  }
}

void Session::round_logprobs(const std::vector<int32_t> &out, size_t emitted) {
  RoundLogprobs &lp = round_logprobs_;
  const size_t top = static_cast<size_t>(logprob_top_);
  lp.top_n = logprob_top_;
  lp.tokens.assign(out.end() - static_cast<std::ptrdiff_t>(emitted), out.end());
  lp.logprobs.resize(emitted);
  lp.top_tokens.resize(emitted * top);
  lp.top_logprobs.resize(emitted * top);
  for (size_t i = 0; i < emitted; ++i) {
    const size_t row = i == 0 ? 0 : static_cast<size_t>(accepted_path_[i - 1]) + 1;
    if (!row_scored_[row]) score_row(static_cast<int32_t>(row));
    // The emitted token is one the mask allowed: its logit is still the target's raw score.
    const float x = verify_batch_.logits[row * static_cast<size_t>(vocab_) + lp.tokens[i]];
    lp.logprobs[i] = static_cast<float>(static_cast<double>(x) - row_lse_[row]);
    for (size_t j = 0; j < top; ++j) {
      lp.top_tokens[i * top + j] = row_top_tokens_[row * top + j];
      lp.top_logprobs[i * top + j] =
          static_cast<float>(static_cast<double>(row_top_logits_[row * top + j]) - row_lse_[row]);
    }
  }
}

}  // namespace specinfer
