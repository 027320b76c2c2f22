// extern "C" shims for couplers and the sampler: checks of sizes and pointers at the boundary,
// then the core (lib/coupling, lib/sampling); exceptions become a status plus *errmsg.
#include <cstring>
#include <memory>

#include "api/guard.h"
#include "api/handles.h"
#include "coupling/coupler.h"
#include "sampling/sampler.h"
#include "specinfer.h"

using specinfer::fail;
using specinfer::guard;

namespace {

const specinfer::Coupler &coupler_of(const specinfer_coupler *c) {
  if (!c || !c->impl) fail(SPECINFER_ERR_INVALID_ARGUMENT, "coupler is NULL");
  return *c->impl;
}

void check_vocab_rows(int32_t vocab, int64_t rows, size_t len, const char *what) {
  if (vocab <= 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "vocab must be > 0 (got %d)", vocab);
  const unsigned long long need =
      static_cast<unsigned long long>(rows) * static_cast<unsigned long long>(vocab);
  if (len != need)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s has %zu floats; %lld rows of vocab %d need %llu", what,
         len, static_cast<long long>(rows), vocab, need);
}

// q may be NULL (point masses) only with q_len 0; a non-NULL q needs `rows` rows.
void check_q(const float *q, size_t q_len, int32_t vocab, int64_t rows) {
  if (!q) {
    if (q_len != 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "q is NULL but q_len is %zu", q_len);
    return;
  }
  check_vocab_rows(vocab, rows, q_len, "q");
}

}  // namespace

extern "C" {

SPECINFER_API specinfer_status specinfer_coupler_create(const char *spec, specinfer_coupler **out,
                                                        char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!spec) fail(SPECINFER_ERR_INVALID_ARGUMENT, "spec is NULL");
    auto h = std::make_unique<specinfer_coupler>();
    h->impl = specinfer::make_coupler(spec);
    *out = h.release();
  });
}

SPECINFER_API void specinfer_coupler_destroy(specinfer_coupler *coupler) {
  delete coupler;
}

SPECINFER_API const char *specinfer_coupler_name(const specinfer_coupler *coupler) {
  if (!coupler || !coupler->impl) return "";
  return coupler->impl->name().c_str();
}

SPECINFER_API int32_t specinfer_coupler_is_exact(const specinfer_coupler *coupler) {
  if (!coupler || !coupler->impl) return 0;
  return coupler->impl->exact() ? 1 : 0;
}

SPECINFER_API specinfer_status specinfer_coupler_verify(const specinfer_coupler *coupler,
                                                        int32_t vocab, int32_t k, const float *p,
                                                        size_t p_len, const float *q, size_t q_len,
                                                        const int32_t *draft, uint64_t seed,
                                                        int64_t position, int32_t *n_accepted,
                                                        int32_t *token, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const specinfer::Coupler &c = coupler_of(coupler);
    if (!n_accepted || !token) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_accepted or token is NULL");
    if (k < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "k must be >= 0 (got %d)", k);
    if (!p) fail(SPECINFER_ERR_INVALID_ARGUMENT, "p is NULL");
    if (k > 0 && !draft) fail(SPECINFER_ERR_INVALID_ARGUMENT, "draft is NULL with k = %d", k);
    check_vocab_rows(vocab, static_cast<int64_t>(k) + 1, p_len, "p");
    check_q(q, q_len, vocab, k);
    specinfer::VerifyResult r = c.verify(vocab, k, p, q, draft, seed, position);
    *n_accepted = r.n_accepted;
    *token = r.token;
  });
}

SPECINFER_API specinfer_status specinfer_coupler_draft_sample(const specinfer_coupler *coupler,
                                                              int32_t vocab, const float *q,
                                                              size_t q_len, uint64_t seed,
                                                              int64_t position, int32_t *token,
                                                              char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const specinfer::Coupler &c = coupler_of(coupler);
    if (!token) fail(SPECINFER_ERR_INVALID_ARGUMENT, "token is NULL");
    if (!q) fail(SPECINFER_ERR_INVALID_ARGUMENT, "q is NULL");
    check_vocab_rows(vocab, 1, q_len, "q");
    if (position < 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "position must be >= 0 (got %lld)",
           static_cast<long long>(position));
    *token = c.draft_sample(vocab, q, seed, position);
  });
}

SPECINFER_API specinfer_status specinfer_coupler_verify_tree(
    const specinfer_coupler *coupler, int32_t vocab, int32_t n_nodes, const int32_t *tokens,
    const int32_t *parents, const float *p, size_t p_len, const float *q, size_t q_len,
    uint64_t seed, int64_t position, int32_t *path, size_t path_cap, int32_t *n_accepted,
    int32_t *token, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    const specinfer::Coupler &c = coupler_of(coupler);
    if (!n_accepted || !token) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_accepted or token is NULL");
    if (n_nodes < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_nodes must be >= 0 (got %d)", n_nodes);
    if (!p) fail(SPECINFER_ERR_INVALID_ARGUMENT, "p is NULL");
    if (n_nodes > 0 && (!tokens || !parents || !path))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokens, parents or path is NULL with %d nodes",
           n_nodes);
    if (path_cap < static_cast<size_t>(n_nodes))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "path has room for %zu nodes; the tree has %d", path_cap,
           n_nodes);
    check_vocab_rows(vocab, static_cast<int64_t>(n_nodes) + 1, p_len, "p");
    check_q(q, q_len, vocab, n_nodes);
    specinfer::VerifyResult r =
        c.verify_tree(vocab, n_nodes, p, q, tokens, parents, seed, position, path);
    *n_accepted = r.n_accepted;
    *token = r.token;
  });
}

SPECINFER_API void specinfer_sampling_params_init(specinfer_sampling_params *params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  params->temperature = 0.0f;
  params->top_k = 0;
  params->top_p = 1.0f;
  params->min_p = 0.0f;
}

SPECINFER_API specinfer_status specinfer_sample_probs(const float *logits, int32_t vocab,
                                                      const specinfer_sampling_params *params,
                                                      float *probs, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!logits || !probs) fail(SPECINFER_ERR_INVALID_ARGUMENT, "logits or probs is NULL");
    if (vocab <= 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "vocab must be > 0 (got %d)", vocab);
    specinfer_sampling_params given;
    specinfer_sampling_params_init(&given);
    if (params) {
      if (params->struct_size < sizeof(uint32_t) || params->struct_size > (1u << 16))
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "sampling params: bad struct_size %u",
             params->struct_size);
      // Read only the fields the caller's struct has (it may come from an older header).
      std::memcpy(&given, params, std::min<size_t>(params->struct_size, sizeof(given)));
      given.struct_size = sizeof(given);
    }
    const char *lo = reinterpret_cast<const char *>(logits), *hi = lo + sizeof(float) * vocab;
    const char *po = reinterpret_cast<const char *>(probs), *pe = po + sizeof(float) * vocab;
    if (lo < pe && po < hi) fail(SPECINFER_ERR_INVALID_ARGUMENT, "probs overlaps logits");
    specinfer::SamplingParams sp;
    sp.temperature = given.temperature;
    sp.top_k = given.top_k;
    sp.top_p = given.top_p;
    sp.min_p = given.min_p;
    specinfer::logits_to_probs(logits, vocab, sp, probs);
  });
}

}  // extern "C"
