// The shared machinery of the couplers: input checks, and one walk down a chain or tree that
// asks the concrete coupler, node by node, which child (if any) the target keeps.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "coupling/coupler.h"

namespace specinfer {

// One drafted child of a tree node.
struct DraftChild {
  int32_t node;    // node index in the tree (chain: the draft index)
  int32_t token;   // its token
  const float *q;  // the distribution it was drawn from; nullptr = point mass on `token`
};

// Scratch memory one verify call may use (only multi-child tree nodes need it).
struct StepScratch {
  std::vector<double> residual;
};

class StepCoupler : public Coupler {
 public:
  explicit StepCoupler(std::string name) : name_(std::move(name)) {}
  const std::string &name() const override { return name_; }

  // Checks q and samples it with the (seed, position, kDraft) uniform: the draft side of the
  // couplers that share no randomness with the drafter (rejection, lenient, typical).
  int32_t draft_sample(int32_t vocab, const float *q, uint64_t seed,
                       int64_t position) const override;

  VerifyResult verify(int32_t vocab, int32_t k, const float *p, const float *q,
                      const int32_t *draft, uint64_t seed, int64_t position) const override;
  VerifyResult verify_tree(int32_t vocab, int32_t n_nodes, const float *p, const float *q,
                           const int32_t *tokens, const int32_t *parents, uint64_t seed,
                           int64_t position, int32_t *path) const override;

 protected:
  // Decides at one node: the target's distribution there is `p` (already checked), the node's
  // token goes to sequence index `position`. Returns the index into `children` of the child the
  // target keeps, or -1 with *token set to the corrected token (or the bonus token when
  // `children` is empty).
  virtual int32_t step(int32_t vocab, const float *p, std::span<const DraftChild> children,
                       uint64_t seed, int64_t position, int32_t *token,
                       StepScratch &scratch) const = 0;
  // Whether rows must be probability distributions (false: greedy, which reads only the argmax).
  virtual bool needs_distributions() const { return true; }

 private:
  std::string name_;
};

// Input checks shared by the couplers; they throw Error(INVALID_ARGUMENT) naming the row/entry.
// A probability row: finite, >= 0, summing to 1 within kProbSumTolerance.
void check_prob_row(const float *row, int32_t vocab, const char *what, int64_t index);
// A score row (greedy): no NaN, not all -inf.
void check_score_row(const float *row, int32_t vocab, const char *what, int64_t index);
void check_vocab(int32_t vocab);
void check_token(int32_t token, int32_t vocab, const char *what, int64_t index);

// Factories of the concrete couplers (make_coupler parses the spec and calls these).
std::unique_ptr<Coupler> make_greedy_coupler();
std::unique_ptr<Coupler> make_rejection_coupler(double lenience);  // 1 = exact rejection
std::unique_ptr<Coupler> make_gumbel_coupler();
std::unique_ptr<Coupler> make_minhash_coupler();
std::unique_ptr<Coupler> make_typical_coupler(double eps, double delta);

// The coupled choices of the communication-free couplers, exposed for tests and benchmarks:
// the token chosen from weights w (w >= 0, not all 0) with the shared randomness of
// (seed, position). Gumbel: argmin over i of -ln(u_i) / w_i. MinHash: the first shared dart that
// lands under the graph of w.
int32_t gumbel_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position);
int32_t minhash_choice(const float *w, int32_t vocab, uint64_t seed, int64_t position);

}  // namespace specinfer
