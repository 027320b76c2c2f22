// A session's constraint (specinfer_session_set_constraint): drafts pruned to what it allows,
// the tokens it forces drafted by the session, each scored row masked before coupling, and the
// committed tokens fed to it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "session/session.h"
#include "util/error.h"

namespace specinfer {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool allowed(const uint32_t *mask, int32_t token) {
  return (mask[token >> 5] >> (token & 31)) & 1u;
}

}  // namespace

void Session::set_constraint(ConstraintObject *constraint) {
  if (constraint == constraint_) return;
  if (constraint) {
    TargetObject *t = constraint->target();
    const bool same_model =
        t == &target_ || (!target_.model_key().empty() && t->model_key() == target_.model_key());
    if (!same_model)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "the constraint was opened for another model's vocabulary (open it for this session's "
           "target, or a target shared from it)");
    if (constraint->in_session.exchange(true))
      fail(SPECINFER_ERR_STATE, "the constraint is already used by a session");
    try {
      grow_rows(std::max(params_.max_draft, kMaxDraft));
      mask_words_ = (vocab_ + 31) / 32;
      masks_.assign(static_cast<size_t>(node_cap_ + 1) * mask_words_, 0u);
      row_masked_.assign(static_cast<size_t>(node_cap_) + 1, 0);
      forced_.resize(static_cast<size_t>(node_cap_));
      constraint_path_.reserve(static_cast<size_t>(node_cap_));
      constraint_anc_.reserve(static_cast<size_t>(node_cap_));
    } catch (...) {
      constraint->in_session = false;
      throw;
    }
  }
  if (constraint_) {
    ConstraintObject *old = constraint_;
    constraint_ = nullptr;
    old->in_session = false;
    old->rollback(constraint_consumed_);
  }
  constraint_ = constraint;
  constraint_consumed_ = 0;
}

// Room for rounds of `nodes` nodes after the last token (buffers only grow).
void Session::grow_rows(int32_t nodes) {
  if (nodes <= node_cap_) return;
  const size_t rows = static_cast<size_t>(nodes) + 1;
  PageBuffer<float> logits, probs, draft_probs;
  logits.assign_zero(rows * vocab_);
  if (!greedy_) probs.assign_zero(rows * vocab_);
  if (drafter_) draft_probs.assign_zero(static_cast<size_t>(nodes) * vocab_);
  draft_tokens_.resize(static_cast<size_t>(nodes));
  draft_parents_.resize(static_cast<size_t>(nodes));
  accepted_path_.resize(static_cast<size_t>(nodes));
  verify_hidden_.resize(rows * static_cast<size_t>(hidden_size_));
  logits_ = std::move(logits);
  if (!greedy_) probs_ = std::move(probs);
  if (drafter_) draft_probs_ = std::move(draft_probs);
  node_cap_ = nodes;
}

void Session::restart_constraint() {
  if (!constraint_ || constraint_consumed_ == 0) return;
  constraint_->rollback(constraint_consumed_);
  constraint_consumed_ = 0;
}

// Brings the constraint to the state after `node` of the draft (-1: the last committed token):
// back to the longest common prefix of constraint_path_ and the node's ancestry, then forward.
void Session::constrain_to(int32_t node) {
  int32_t depth = 0;
  for (int32_t j = node; j >= 0; j = draft_parents_[j]) ++depth;
  std::vector<int32_t> &anc = constraint_anc_;
  anc.resize(static_cast<size_t>(depth));
  for (int32_t j = node, i = depth - 1; j >= 0; j = draft_parents_[j], --i) anc[i] = j;
  size_t common = 0;
  while (common < constraint_path_.size() && common < anc.size() &&
         constraint_path_[common] == anc[common])
    ++common;
  const auto back = static_cast<int32_t>(constraint_path_.size() - common);
  if (back > 0) {
    constraint_->rollback(back);
    constraint_path_.resize(common);
  }
  for (size_t i = common; i < anc.size(); ++i) {
    if (!constraint_->consume(draft_tokens_[anc[i]]))
      fail(SPECINFER_ERR_PLUGIN, "the constraint refused token %d that it allowed before",
           draft_tokens_[anc[i]]);
    constraint_path_.push_back(anc[i]);
  }
}

// Computes the mask of scored row `row` (the constraint is in that row's state).
void Session::constraint_row(int32_t row) {
  uint32_t *mask = &masks_[static_cast<size_t>(row) * mask_words_];
  constraint_->mask(mask, mask_words_);
  // A mask that allows nothing would leave the coupler no token to choose (greedy would take an
  // arbitrary one, sampling would divide by zero).
  uint32_t any = 0;
  for (int32_t w = 0; w < mask_words_; ++w) any |= mask[w];
  if (any == 0)
    fail(SPECINFER_ERR_STATE,
         "the constraint allows no token here: its grammar cannot go on with this vocabulary");
  row_masked_[static_cast<size_t>(row)] = 1;
}

void Session::constrain_draft(Draft &d) {
  if (!constraint_) return;
  const auto t0 = Clock::now();
  std::fill(row_masked_.begin(), row_masked_.end(), 0);
  constraint_path_.clear();
  try {
    if (constraint_->state() & SPECINFER_CONSTRAINT_STOPPED)
      fail(SPECINFER_ERR_STATE,
           "the constraint's grammar has ended: feed more text, reset the session or clear the "
           "constraint to go on");
    constraint_row(0);
    // Nodes in order (parents first): a node stays when its parent did, its parent is neither an
    // end-of-generation token nor where the grammar ends (nothing after either is kept: such a
    // row has no mask) and its row allows its token. Kept
    // nodes move down to close the gaps; keep[j] is node j's new index (-1: dropped).
    std::vector<int32_t> keep(static_cast<size_t>(d.n), -1);
    const bool q_rows = d.has_probs && !greedy_;
    int32_t n = 0;
    for (int32_t j = 0; j < d.n; ++j) {
      const int32_t parent = draft_parents_[j] < 0 ? -1 : keep[draft_parents_[j]];
      if (draft_parents_[j] >= 0 && (parent < 0 || !row_masked_[parent + 1])) continue;
      const int32_t token = draft_tokens_[j];
      const uint32_t *mask = &masks_[static_cast<size_t>(parent + 1) * mask_words_];
      if (!allowed(mask, token)) continue;
      keep[j] = n;
      draft_tokens_[n] = token;
      draft_parents_[n] = parent;
      if (q_rows) {
        // The drafter's q given that its token is allowed: masked and renormalized, so that a
        // node drawn from q and kept is a draw from that q, which the coupler then sees.
        float *q = &draft_probs_[static_cast<size_t>(n) * vocab_];
        if (n != j)
          std::memmove(q, &draft_probs_[static_cast<size_t>(j) * vocab_], sizeof(float) * vocab_);
        double sum = 0;
        for (int32_t t = 0; t < vocab_; ++t) {
          if (!allowed(mask, t)) q[t] = 0.0f;
          sum += q[t];
        }
        const float scale = static_cast<float>(1.0 / sum);
        for (int32_t t = 0; t < vocab_; ++t) q[t] *= scale;
      }
      if (!is_stop(token)) {
        constrain_to(n);
        if (!(constraint_->state() & SPECINFER_CONSTRAINT_STOPPED)) constraint_row(n + 1);
      }
      ++n;
    }
    if (n != d.n) d.expected = -1;  // the drafter's estimate was for the nodes it gave
    d.n = n;
    d.chain = true;
    for (int32_t i = 0; i < d.n; ++i) d.chain = d.chain && draft_parents_[i] == i - 1;
    d.forced = 0;
    // After a chain (or nothing), the tokens the constraint forces from its end, as far as the
    // round may emit and the context holds.
    const int32_t room = static_cast<int32_t>(n_ctx_ - static_cast<int64_t>(tokens_.size())) - 1;
    const int32_t most = std::min({node_cap_, emit_limit_ - 1, room}) - d.n;
    emit_limit_ = 1;  // one round's bound: a round that does not set it forces nothing
    if (d.chain && most > 0 && row_masked_[d.n]) {
      constrain_to(d.n - 1);
      const int32_t nf = constraint_->forced(forced_.data(), most);
      for (int32_t i = 0; i < nf; ++i) {
        const int32_t token = forced_[i];
        if (!allowed(&masks_[static_cast<size_t>(d.n) * mask_words_], token)) break;
        draft_tokens_[d.n] = token;
        draft_parents_[d.n] = d.n - 1;
        if (d.has_probs) {  // a point mass: the session drafted it
          float *q = &draft_probs_[static_cast<size_t>(d.n) * vocab_];
          std::fill(q, q + vocab_, 0.0f);
          q[token] = 1.0f;
        }
        ++d.n;
        ++d.forced;
        if (is_stop(token)) break;
        if (!constraint_->consume(token)) break;
        constraint_path_.push_back(d.n - 1);
        if (constraint_->state() & SPECINFER_CONSTRAINT_STOPPED) break;
        constraint_row(d.n);
      }
    }
    constraint_->rollback(static_cast<int32_t>(constraint_path_.size()));
    constraint_path_.clear();
  } catch (...) {
    const auto held = static_cast<int32_t>(constraint_path_.size());
    constraint_path_.clear();
    try {
      constraint_->rollback(held);
    } catch (...) {
    }
    t_constraint_ += ms_since(t0);
    throw;
  }
  t_constraint_ += ms_since(t0);
}

// The target's scores of the tokens a row's mask rules out become -inf: the coupler sees the
// constrained distribution (greedy: its argmax; sampling: the masked, renormalized one).
void Session::mask_rows(const Draft &d) {
  if (!constraint_) return;
  const auto t0 = Clock::now();
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i <= d.n; ++i) {
    if (!row_masked_[static_cast<size_t>(i)]) continue;
    float *row = verify_batch_.logits + static_cast<size_t>(i) * vocab_;
    const uint32_t *mask = &masks_[static_cast<size_t>(i) * mask_words_];
    for (int32_t w = 0; w < mask_words_; ++w) {
      const uint32_t bits = mask[w];
      if (bits == 0xffffffffu) continue;
      const int32_t end = std::min(vocab_, (w + 1) * 32);
      for (int32_t t = w * 32; t < end; ++t)
        if (!((bits >> (t & 31)) & 1u)) row[t] = kOut;
    }
  }
  t_constraint_ += ms_since(t0);
}

// The constraint takes the round's tokens, out[first..], up to an end-of-generation token
// (which ends the text); where its grammar ends (STOPPED) the tokens after are cut and `ended`
// is set, as plain decoding, which would stop there, emits none of them. `consumed` counts the
// tokens taken, for commit to take back if it fails.
void Session::advance_constraint(std::vector<int32_t> &out, size_t first, int32_t &consumed,
                                 bool &ended) {
  const auto t0 = Clock::now();
  for (size_t i = first; i < out.size(); ++i) {
    if (is_stop(out[i])) break;
    if (!constraint_->consume(out[i]))
      fail(SPECINFER_ERR_INTERNAL, "the constraint refused token %d chosen from its own mask",
           out[i]);
    ++consumed;
    ++constraint_consumed_;
    if (constraint_->state() & SPECINFER_CONSTRAINT_STOPPED) {
      out.resize(i + 1);
      ended = true;
      break;
    }
  }
  t_constraint_ += ms_since(t0);
}

// After the stop strings had their say: the constraint gives back the tokens a stop string cut
// (it took the first `consumed` of the round's tokens, `emitted` of which stay), and a grammar
// that ended ends the text.
void Session::constraint_cut(size_t emitted, int32_t &consumed, bool ended, bool &done) {
  const auto kept = static_cast<int32_t>(std::min(emitted, static_cast<size_t>(consumed)));
  if (kept < consumed) {
    constraint_->rollback(consumed - kept);
    constraint_consumed_ -= consumed - kept;
    consumed = kept;
    return;  // the text ended at the stop string, before the grammar's end
  }
  if (ended && !done) {
    done = true;
    stops_.flush(round_text_);
  }
}

}  // namespace specinfer
