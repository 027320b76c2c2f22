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
  // Throws specinfer::Error on bad input.
  virtual VerifyResult verify(int32_t vocab, int32_t k, const float *p, const float *q,
                              const int32_t *draft, uint64_t seed, int64_t position) const = 0;

  // The draft side: how a drafter must draw a token from q at `position` so that the coupling
  // works (shared randomness for gumbel/minhash; plain sampling otherwise).
  virtual int32_t draft_sample(int32_t vocab, const float *q, uint64_t seed,
                               int64_t position) const = 0;
};

// Makes a coupler from a spec ("greedy", "rejection", "lenient:0.5", "gumbel", "minhash",
// "typical[:eps[:delta]]"). Throws specinfer::Error(SPECINFER_ERR_CONFIG) for an unknown spec.
std::unique_ptr<Coupler> make_coupler(const std::string &spec);

}  // namespace specinfer
