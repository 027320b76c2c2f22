#include "coupling/step_coupler.h"

#include <cmath>
#include <limits>

#include "coupling/row_check.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "util/error.h"
#include "util/isa.h"

namespace specinfer {

void check_vocab(int32_t vocab) {
  if (vocab <= 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: vocab must be > 0 (got %d)", vocab);
}

void check_token(int32_t token, int32_t vocab, const char *what, int64_t index) {
  if (token < 0 || token >= vocab)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s %lld is token %d, outside [0, %d)", what,
         static_cast<long long>(index), token, vocab);
}

void check_prob_row(const float *row, int32_t vocab, const char *what, int64_t index) {
  if (!row)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld is NULL", what,
         static_cast<long long>(index));
  double sum = 0;
  // Fast path: one vectorized pass; the slow loop below runs only to name a bad entry.
  if (active_isa() != Isa::scalar && prob_row_stats_avx2(row, vocab, &sum)) {
    if (std::fabs(sum - 1.0) > kProbSumTolerance)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "coupler: %s row %lld sums to %.9g, not 1 (tolerance %g)", what,
           static_cast<long long>(index), sum, kProbSumTolerance);
    return;
  }
  sum = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    float x = row[i];
    if (!std::isfinite(x))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld entry %d is %s", what,
           static_cast<long long>(index), i, std::isnan(x) ? "NaN" : "infinite");
    if (x < 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld entry %d is negative (%g)", what,
           static_cast<long long>(index), i, static_cast<double>(x));
    sum += x;
  }
  if (std::fabs(sum - 1.0) > kProbSumTolerance)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld sums to %.9g, not 1 (tolerance %g)",
         what, static_cast<long long>(index), sum, kProbSumTolerance);
}

void check_score_row(const float *row, int32_t vocab, const char *what, int64_t index) {
  if (!row)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld is NULL", what,
         static_cast<long long>(index));
  // One branch-free pass (it vectorizes); the loop that names the bad entry runs only on failure.
  int nan = 0, any = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = row[i];
    nan |= x != x;
    any |= x > -std::numeric_limits<float>::infinity();
  }
  if (nan)
    for (int32_t i = 0; i < vocab; ++i)
      if (std::isnan(row[i]))
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld entry %d is NaN", what,
             static_cast<long long>(index), i);
  if (!any)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: %s row %lld has no finite entry", what,
         static_cast<long long>(index));
}

int32_t StepCoupler::draft_sample(int32_t vocab, const float *q, uint64_t seed,
                                  int64_t position) const {
  check_vocab(vocab);
  check_prob_row(q, vocab, "q", 0);
  return sample_index(q, vocab, CounterRng(seed, position, RngStream::kDraft).uniform(0));
}

VerifyResult StepCoupler::verify(int32_t vocab, int32_t k, const float *p, const float *q,
                                 const int32_t *draft, uint64_t seed, int64_t position) const {
  if (k < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: draft length k must be >= 0 (got %d)", k);
  if (k > 0 && !draft) fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: NULL draft with k = %d", k);
  std::vector<int32_t> parents(static_cast<size_t>(k)), path(static_cast<size_t>(k));
  for (int32_t j = 0; j < k; ++j) parents[static_cast<size_t>(j)] = j - 1;
  return verify_tree(vocab, k, p, q, draft, parents.data(), seed, position, path.data());
}

VerifyResult StepCoupler::verify_tree(int32_t vocab, int32_t n_nodes, const float *p,
                                      const float *q, const int32_t *tokens, const int32_t *parents,
                                      uint64_t seed, int64_t position, int32_t *path) const {
  check_vocab(vocab);
  if (n_nodes < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: node count must be >= 0 (got %d)", n_nodes);
  if (!p) fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: NULL p");
  if (n_nodes > 0 && (!tokens || !parents || !path))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: NULL tokens, parents or path with %d nodes",
         n_nodes);
  if (position < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler: position must be >= 0 (got %lld)",
         static_cast<long long>(position));
  const size_t V = static_cast<size_t>(vocab);
  // Check everything first, so that bad input fails the same way whatever the random outcome.
  for (int32_t j = 0; j < n_nodes; ++j) {
    check_token(tokens[j], vocab, "node", j);
    if (parents[j] < -1 || parents[j] >= j)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "coupler: node %d has parent %d; parents must precede their children (-1 = root)", j,
           parents[j]);
  }
  for (int32_t r = 0; r <= n_nodes; ++r) {
    if (needs_distributions())
      check_prob_row(p + static_cast<size_t>(r) * V, vocab, "p", r);
    else
      check_score_row(p + static_cast<size_t>(r) * V, vocab, "p", r);
  }
  if (q) {
    for (int32_t j = 0; j < n_nodes; ++j) {
      const float *row = q + static_cast<size_t>(j) * V;
      if (needs_distributions())
        check_prob_row(row, vocab, "q", j);
      else
        check_score_row(row, vocab, "q", j);
      if (needs_distributions() && row[tokens[j]] <= 0)
        fail(SPECINFER_ERR_INVALID_ARGUMENT,
             "coupler: node %d has token %d, which its q row gives probability 0", j, tokens[j]);
    }
  }

  VerifyResult out;
  StepScratch scratch;
  std::vector<DraftChild> children;
  int32_t node = -1;  // the root
  int32_t first = 0;  // children of `node` have indices > node
  for (int64_t depth = 0;; ++depth) {
    children.clear();
    for (int32_t j = first; j < n_nodes; ++j)
      if (parents[j] == node)
        children.push_back({j, tokens[j], q ? q + static_cast<size_t>(j) * V : nullptr});
    const float *prow = p + static_cast<size_t>(node + 1) * V;
    int32_t token = -1;
    int32_t c = step(vocab, prow, children, seed, position + depth, &token, scratch);
    if (c < 0) {
      if (token < 0 || token >= vocab)
        fail(SPECINFER_ERR_INTERNAL, "coupler %s chose token %d outside the vocabulary",
             name().c_str(), token);
      out.token = token;
      return out;
    }
    node = children[static_cast<size_t>(c)].node;
    path[out.n_accepted++] = node;
    first = node + 1;
  }
}

}  // namespace specinfer
