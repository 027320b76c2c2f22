// "rejection" and "lenient:L": modified rejection sampling (Leviathan et al. 2023; Chen et al.
// 2023), and on trees SpecInfer's multi-step speculative sampling (Miao et al. 2023).
//
// At a node with target distribution p and children x_1..x_m drawn independently from q_1..q_m,
// child j is tested against the current residual r (r = p at first): it is kept with probability
// min(1, r(x_j) / (L q_j(x_j))); if not, r becomes norm(max(0, r - q_j)) and the next child is
// tested. When every child is refused the next token is drawn from r. With L = 1 the emitted token
// is distributed exactly as p; for one child the acceptance probability is sum_x min(p, q).
// A point-mass child (q = NULL) is a q with all its mass on its token: kept with probability
// r(x)/L (capped at 1), after which r loses x.
//
// Lenience L < 1 (Leviathan et al., appendix "lenience") keeps more drafted tokens, with
// acceptance sum_x min(p/L, q) for one child, at the price of exactness: tokens that q favours
// are over-represented. The residual after a refusal is still norm(max(0, r - q)) - the tokens
// the accepted mass under-covers. Lossy: exact() is false unless L = 1.
//
// Randomness at sequence position t: the j-th child's acceptance uniform is (seed, t, kAccept, j),
// the residual draw (seed, t, kResidual, 0) and the bonus or k = 0 draw (seed, t, kSample, 0), the
// same uniform plain decoding at t uses. The drafter draws with (seed, t, kDraft, 0).
#include <cmath>

#include "coupling/step_coupler.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace specinfer {

namespace {

// Samples from norm(max(0, p - q)) (q NULL: p without `token`) without materializing it.
// Returns -1 when that residual has no mass (p <= q up to rounding).
int32_t sample_residual(const float *p, const float *q, int32_t token, int32_t vocab, double u) {
  double total = 0;
  if (q) {
    for (int32_t i = 0; i < vocab; ++i) total += std::max(0.0f, p[i] - q[i]);
  } else {
    for (int32_t i = 0; i < vocab; ++i) total += i == token ? 0.0f : p[i];
  }
  if (!(total > 1e-9)) return -1;
  double target = u * total, acc = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    float r = q ? std::max(0.0f, p[i] - q[i]) : (i == token ? 0.0f : p[i]);
    if (r <= 0) continue;
    acc += r;
    last = i;
    if (acc > target) break;
  }
  return last;
}

int32_t sample_row(const double *r, int32_t vocab, double total, double u) {
  double target = u * total, acc = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (r[i] <= 0) continue;
    acc += r[i];
    last = i;
    if (acc > target) break;
  }
  return last;
}

class RejectionCoupler final : public StepCoupler {
 public:
  explicit RejectionCoupler(double lenience)
      : StepCoupler(lenience == 1.0 ? std::string("rejection") : format("lenient:%g", lenience)),
        lenience_(lenience) {}
  bool exact() const override { return lenience_ == 1.0; }

 protected:
  int32_t step(int32_t vocab, const float *p, std::span<const DraftChild> children, uint64_t seed,
               int64_t position, int32_t *token, StepScratch &scratch) const override {
    const double sample_u = CounterRng(seed, position, RngStream::kSample).uniform(0);
    if (children.empty()) {
      *token = sample_index(p, vocab, sample_u);
      return -1;
    }
    const CounterRng accept(seed, position, RngStream::kAccept);
    const double residual_u = CounterRng(seed, position, RngStream::kResidual).uniform(0);
    if (children.size() == 1) {  // a chain: no need to materialize the residual
      const DraftChild &c = children[0];
      double qx = c.q ? c.q[c.token] : 1.0;
      if (accept.uniform(0) * lenience_ * qx < p[c.token]) return 0;
      *token = sample_residual(p, c.q, c.token, vocab, residual_u);
      if (*token < 0) *token = sample_index(p, vocab, residual_u);  // p == q up to rounding
      return -1;
    }
    std::vector<double> &r = scratch.residual;
    r.assign(p, p + vocab);
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) total += r[i];
    for (size_t j = 0; j < children.size(); ++j) {
      const DraftChild &c = children[j];
      double qx = c.q ? c.q[c.token] : 1.0;
      double rx = r[c.token] / total;
      if (accept.uniform(j) * lenience_ * qx < rx) return static_cast<int32_t>(j);
      // Refused: r <- max(0, r/total - q), unless that leaves nothing (equal up to rounding).
      double new_total = 0;
      if (c.q) {
        for (int32_t i = 0; i < vocab; ++i) new_total += std::max(0.0, r[i] / total - c.q[i]);
      } else {
        new_total = 1.0 - rx;
      }
      if (!(new_total > 1e-9)) continue;
      if (c.q) {
        for (int32_t i = 0; i < vocab; ++i) r[i] = std::max(0.0, r[i] / total - c.q[i]);
      } else {
        for (int32_t i = 0; i < vocab; ++i) r[i] /= total;
        r[c.token] = 0;
      }
      total = new_total;
    }
    *token = sample_row(r.data(), vocab, total, residual_u);
    return -1;
  }

 private:
  double lenience_;
};

}  // namespace

std::unique_ptr<Coupler> make_rejection_coupler(double lenience) {
  if (!(lenience > 0 && lenience <= 1))
    fail(SPECINFER_ERR_CONFIG, "coupler: lenience must be in (0, 1] (got %g)", lenience);
  return std::make_unique<RejectionCoupler>(lenience);
}

}  // namespace specinfer
