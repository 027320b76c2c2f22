// Couplers: given the target's distributions p and the drafter's q (or point masses) for a chain
// of drafted tokens, decide how many drafted tokens to keep and which token comes next.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace specinfer {

struct VerifyResult {
  int32_t n_accepted = 0;  // drafted tokens kept (a prefix of the draft)
  int32_t token = -1;      // the corrected token (after a rejection) or the bonus token (all kept)
};

class Coupler {
 public:
  virtual ~Coupler() = default;
  // Canonical spec string, e.g. "lenient:0.5".
  virtual const std::string &name() const = 0;
  // True when the emitted text is distributed exactly as the target's.
  virtual bool exact() const = 0;
  // True when the coupler works on argmax alone (no distributions needed: greedy).
  virtual bool greedy() const { return false; }

  // Verifies a chain. p: (k + 1) rows of `vocab` probabilities (the target at each drafted position
  // and one past the end); q: k rows of the draft distributions, or nullptr for point masses on
  // draft[i]; draft: k token ids. `position` is the index in the whole sequence of draft[0]; with
  // `seed` it fixes all randomness, so that the same (seed, position) gives the same choice.
  // Throws specinfer::Error(INVALID_ARGUMENT) on bad input: a row with NaN/Inf or negative
  // entries or not summing to 1 within kProbSumTolerance, a token outside [0, vocab), a draft
  // token with q = 0. (The greedy coupler needs only the argmax, so it accepts unnormalized
  // scores such as logits; only NaN is refused there.)
  virtual VerifyResult verify(int32_t vocab, int32_t k, const float *p, const float *q,
                              const int32_t *draft, uint64_t seed, int64_t position) const = 0;

  // The draft side: how a drafter must draw a token from q at `position` so that the coupling
  // works (shared randomness for gumbel/minhash; plain sampling otherwise).
  virtual int32_t draft_sample(int32_t vocab, const float *q, uint64_t seed,
                               int64_t position) const = 0;

  // Verifies a token tree. Nodes are in topological order: parents[j] is in [-1, j), -1 meaning
  // the last committed token (the root). p: n_nodes + 1 rows, row 0 the target after the root and
  // row j + 1 the target after node j; q: n_nodes rows, row j the distribution node j's token was
  // drawn from, or nullptr for point masses (then siblings should be distinct tokens). Node j's
  // token sits at sequence index position + depth(j), depth 0 for the root's children. `path`
  // (room for n_nodes) receives the accepted nodes, root side first; n_accepted is their number
  // and token the corrected or bonus token after the last of them.
  // Greedy, gumbel and minhash walk down the tree following the target's own choice at each
  // node; rejection (and lenient) use SpecInfer's multi-step speculative sampling, which is exact
  // when the children of a node were drawn independently from their q rows. A chain
  // (parents[j] = j - 1) gives exactly what verify() gives.
  virtual VerifyResult verify_tree(int32_t vocab, int32_t n_nodes, const float *p, const float *q,
                                   const int32_t *tokens, const int32_t *parents, uint64_t seed,
                                   int64_t position, int32_t *path) const = 0;
};

// Tolerance on |sum - 1| for a row of probabilities handed to a coupler.
inline constexpr double kProbSumTolerance = 1e-3;

// Makes a coupler from a spec ("greedy", "rejection", "lenient:0.5", "gumbel", "minhash",
// "typical[:eps[:delta]]"). Throws specinfer::Error(SPECINFER_ERR_CONFIG) for an unknown spec.
std::unique_ptr<Coupler> make_coupler(const std::string &spec);

}  // namespace specinfer
