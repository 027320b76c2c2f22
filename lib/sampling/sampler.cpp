#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "util/error.h"

namespace specinfer {

void check_sampling_params(const SamplingParams &p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: temperature must be finite and >= 0 (got %g)",
         static_cast<double>(p.temperature));
  if (p.top_k < 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: top_k must be >= 0 (got %d)", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: top_p must be in (0, 1] (got %g)",
         static_cast<double>(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: min_p must be in [0, 1] (got %g)",
         static_cast<double>(p.min_p));
}

int32_t argmax(const float *v, int64_t n) {
  int32_t best = -1;
  float bv = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) continue;
    if (best < 0 || v[i] > bv) {
      best = static_cast<int32_t>(i);
      bv = v[i];
    }
  }
  return best;
}

int32_t sample_index(const float *probs, int64_t n, double u) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += probs[i];
  if (!(total > 0)) return -1;
  double target = u * total, acc = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last = static_cast<int32_t>(i);
    if (acc > target) return last;
  }
  return last;  // rounding left the cumulative sum a hair below target
}

namespace {

// Orders candidate token ids by probability, high first, ties towards the lower id.
struct ByProbDesc {
  const float *probs;
  bool operator()(int32_t a, int32_t b) const {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  }
};

// The index of the largest logit (the first of equals) and its value; refuses NaN and +inf, and a
// row of only -inf.
int32_t checked_argmax(const float *logits, int32_t vocab, float &maxv) {
  maxv = -std::numeric_limits<float>::infinity();
  int32_t amax = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    float x = logits[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: logit %d is %s", i,
           std::isnan(x) ? "NaN" : "+inf");
    if (x > maxv) {
      maxv = x;
      amax = i;
    }
  }
  if (amax < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: every logit is -inf");
  return amax;
}

// top_k: the k largest logits (ties to the lower id) into cand, with a heap whose top is the worst
// kept; most tokens are turned away by one comparison, and only the k survivors are exponentiated
// into probs (the rest 0). exp may underflow to 0 for a far-off survivor at a small temperature:
// those are dropped.
template <class Weight>
void top_k_candidates(const float *logits, int32_t vocab, int32_t top_k, const Weight &weight,
                      float *probs, std::vector<int32_t> &cand) {
  auto better = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const size_t k = static_cast<size_t>(top_k);
  for (int32_t i = 0; i < vocab; ++i) {
    if (logits[i] == -std::numeric_limits<float>::infinity()) continue;
    if (cand.size() < k) {
      cand.push_back(i);
      std::push_heap(cand.begin(), cand.end(), better);
    } else if (logits[i] >= logits[cand.front()] && better(i, cand.front())) {
      std::pop_heap(cand.begin(), cand.end(), better);
      cand.back() = i;
      std::push_heap(cand.begin(), cand.end(), better);
    }
  }
  std::fill(probs, probs + vocab, 0.0f);
  for (int32_t i : cand) probs[i] = weight(i);
  cand.erase(
      std::remove_if(cand.begin(), cand.end(), [probs](int32_t i) { return !(probs[i] > 0); }),
      cand.end());
}

// top_p: keeps the most probable candidates until they hold top_p of the candidates' mass,
// sorting only as much of the head as needed (the sorted prefix grows until it holds top_p).
void keep_top_p(const float *probs, float top_p, std::vector<int32_t> &cand) {
  ByProbDesc order{probs};
  const size_t n = cand.size();
  double total = 0;
  for (size_t j = 0; j < n; ++j) total += probs[cand[j]];
  const double need = static_cast<double>(top_p) * total;
  size_t sorted = 0;
  double acc = 0;
  size_t keep = n;
  size_t chunk = 256;
  while (sorted < n) {
    size_t end = std::min(n, sorted + chunk);
    if (end < n) std::nth_element(cand.begin() + sorted, cand.begin() + end, cand.end(), order);
    std::sort(cand.begin() + sorted, cand.begin() + end, order);
    bool done = false;
    for (size_t j = sorted; j < end; ++j) {
      acc += probs[cand[j]];
      if (acc >= need) {
        keep = j + 1;
        done = true;
        break;
      }
    }
    if (done) break;
    sorted = end;
    chunk *= 4;
  }
  cand.resize(keep);
}

// min_p: keeps the candidates at least min_p times the most probable one's probability.
void keep_min_p(const float *probs, float min_p, std::vector<int32_t> &cand) {
  float pmax = 0;
  for (int32_t i : cand) pmax = std::max(pmax, probs[i]);
  const float cut = min_p * pmax;
  size_t w = 0;
  for (size_t j = 0; j < cand.size(); ++j)
    if (probs[cand[j]] >= cut) cand[w++] = cand[j];
  cand.resize(w);
}

// Zeroes every probability but the candidates'; returns the candidates' sum.
double keep_only(const std::vector<int32_t> &cand, int32_t vocab, float *probs) {
  thread_local std::vector<float> kept;
  const size_t n = cand.size();
  kept.resize(n);
  double sum = 0;
  for (size_t j = 0; j < n; ++j) {
    kept[j] = probs[cand[j]];
    sum += kept[j];
  }
  std::fill(probs, probs + vocab, 0.0f);
  for (size_t j = 0; j < n; ++j) probs[cand[j]] = kept[j];
  return sum;
}

}  // namespace

void logits_to_probs(const float *logits, int32_t vocab, const SamplingParams &params,
                     float *probs) {
  check_sampling_params(params);
  if (!logits || !probs) fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: NULL logits or probs");
  if (vocab <= 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling: vocab must be > 0 (got %d)", vocab);
  float maxv;
  const int32_t amax = checked_argmax(logits, vocab, maxv);
  if (params.temperature == 0) {
    std::fill(probs, probs + vocab, 0.0f);
    probs[amax] = 1.0f;
    return;
  }

  // Softmax of logits / T, relative to the maximum so the largest term is exactly 1.
  // In float: expf is correctly rounded in glibc and several times faster than exp; the result
  // is a deterministic function of the logits either way.
  const float inv_t = 1.0f / params.temperature;
  auto weight = [&](int32_t i) { return std::exp((logits[i] - maxv) * inv_t); };
  thread_local std::vector<int32_t> cand;  // the tokens still in, once a filter is on
  cand.clear();
  double sum = 0;
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  const bool filter = top_k || params.top_p < 1 || params.min_p > 0;
  if (top_k) {
    top_k_candidates(logits, vocab, params.top_k, weight, probs, cand);
  } else {
    for (int32_t i = 0; i < vocab; ++i) {
      probs[i] = weight(i);
      sum += probs[i];
    }
    if (filter)
      for (int32_t i = 0; i < vocab; ++i)
        if (probs[i] > 0) cand.push_back(i);
  }
  if (filter) {
    if (params.top_p < 1) keep_top_p(probs, params.top_p, cand);
    if (params.min_p > 0) keep_min_p(probs, params.min_p, cand);
    sum = keep_only(cand, vocab, probs);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int32_t i = 0; i < vocab; ++i) probs[i] *= inv;
}

}  // namespace specinfer
