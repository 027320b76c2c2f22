// Logits -> the distribution a coupler sees: temperature, then top-k, top-p and min-p, each on the
// result of the one before, then renormalized. Couplers always work on these transformed
// distributions, never on raw logits (greedy excepted, which only needs the argmax).
#pragma once

#include <cstdint>

namespace specinfer {

struct SamplingParams {
  float temperature = 0;  // 0 = greedy: a point mass on the argmax; > 0 divides the logits
  int32_t top_k = 0;      // keep the k most probable tokens (the k largest logits); 0 = off
  float top_p = 1;        // keep the smallest most-probable set with mass >= top_p; 1 = off
  float min_p = 0;        // drop tokens below min_p * (largest probability); 0 = off
};

// Throws Error(INVALID_ARGUMENT) when a parameter is out of range: temperature < 0 or not finite,
// top_k < 0, top_p outside (0, 1], min_p outside [0, 1].
void check_sampling_params(const SamplingParams &params);

// Writes `vocab` probabilities (summing to 1) to `probs`. Ties are broken towards the lower token
// id everywhere (argmax, top-k and top-p cut-offs), so the result is a pure function of the input.
// Logits may be -inf (a masked token) but not NaN or +inf, and not all -inf.
// Throws Error(INVALID_ARGUMENT) on bad params or logits. `probs` may not alias `logits`.
void logits_to_probs(const float *logits, int32_t vocab, const SamplingParams &params,
                     float *probs);

// Index of the largest value (the lowest index among equal maxima; NaN entries are skipped).
// Returns -1 when n <= 0 or every entry is NaN.
int32_t argmax(const float *values, int64_t n);

// Inverse-CDF draw from a distribution `probs` of n entries with uniform u in (0, 1): the first
// index whose cumulative mass exceeds u * total (total = the sum of probs, so the row need not be
// exactly normalized). Never returns an index with zero probability; -1 when total <= 0.
int32_t sample_index(const float *probs, int64_t n, double u);

}  // namespace specinfer
