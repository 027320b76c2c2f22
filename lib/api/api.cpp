// extern "C" shims for the core of the public ABI: versions, statuses, the registry, targets,
// drafters and sessions. (Couplers: coupler_api.cpp; sketchers: sketch_api.cpp.)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "api/guard.h"
#include "api/handles.h"
#include "plugin/registry.h"
#include "session/session.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

using specinfer::fail;
using specinfer::guard;

struct specinfer_registry {
  std::unique_ptr<specinfer::Registry> impl;
};

struct specinfer_session {
  std::unique_ptr<specinfer::Session> impl;
};

namespace {

template <typename T>
bool struct_ok(const T *p) {
  return p && p->struct_size >= sizeof(uint32_t) && p->struct_size <= (1u << 16);
}

// Copies a caller's versioned struct over defaults: fields the caller's version lacks keep them.
template <typename T>
T merge_params(const T *given, void (*init)(T *)) {
  T out;
  init(&out);
  if (given) std::memcpy(&out, given, std::min<size_t>(given->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

const char *nonnull(const std::string &s) {
  return s.c_str();
}

}  // namespace

extern "C" {

SPECINFER_API int specinfer_version_number(void) {
  return SPECINFER_VERSION_NUMBER;
}
SPECINFER_API const char *specinfer_version_string(void) {
  return SPECINFER_VERSION_STRING;
}

SPECINFER_API const char *specinfer_status_str(int status) {
  switch (status) {
    case SPECINFER_OK:
      return "SPECINFER_OK";
    case SPECINFER_ERR_INVALID_ARGUMENT:
      return "SPECINFER_ERR_INVALID_ARGUMENT";
    case SPECINFER_ERR_OUT_OF_MEMORY:
      return "SPECINFER_ERR_OUT_OF_MEMORY";
    case SPECINFER_ERR_NOT_FOUND:
      return "SPECINFER_ERR_NOT_FOUND";
    case SPECINFER_ERR_IO:
      return "SPECINFER_ERR_IO";
    case SPECINFER_ERR_FORMAT:
      return "SPECINFER_ERR_FORMAT";
    case SPECINFER_ERR_ABI_MISMATCH:
      return "SPECINFER_ERR_ABI_MISMATCH";
    case SPECINFER_ERR_UNSUPPORTED:
      return "SPECINFER_ERR_UNSUPPORTED";
    case SPECINFER_ERR_CONFIG:
      return "SPECINFER_ERR_CONFIG";
    case SPECINFER_ERR_STATE:
      return "SPECINFER_ERR_STATE";
    case SPECINFER_ERR_CANCELLED:
      return "SPECINFER_ERR_CANCELLED";
    case SPECINFER_ERR_PLUGIN:
      return "SPECINFER_ERR_PLUGIN";
    case SPECINFER_ERR_CONTEXT_FULL:
      return "SPECINFER_ERR_CONTEXT_FULL";
    case SPECINFER_ERR_BUFFER_TOO_SMALL:
      return "SPECINFER_ERR_BUFFER_TOO_SMALL";
    case SPECINFER_ERR_INTERNAL:
      return "SPECINFER_ERR_INTERNAL";
    default:
      return "SPECINFER_UNKNOWN_STATUS";
  }
}

SPECINFER_API void specinfer_free(void *ptr) {
  std::free(ptr);
}

/* ---- registry ---- */

SPECINFER_API void specinfer_registry_params_init(specinfer_registry_params *p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->n_threads = 0;
  p->load_builtin = 1;
  p->log = nullptr;
  p->log_user = nullptr;
  p->log_level = SPECINFER_LOG_INFO;
}

SPECINFER_API specinfer_status specinfer_registry_create(const specinfer_registry_params *params,
                                                         specinfer_registry **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (params && !struct_ok(params))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->struct_size %u is not valid",
           params->struct_size);
    specinfer_registry_params p = merge_params(params, specinfer_registry_params_init);
    if (p.n_threads < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_threads must be >= 0");
    if (p.log_level < SPECINFER_LOG_DEBUG || p.log_level > SPECINFER_LOG_NONE)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "log_level %d is not a specinfer_log_level",
           p.log_level);
    auto r = std::make_unique<specinfer_registry>();
    r->impl = std::make_unique<specinfer::Registry>(p);
    *out = r.release();
  });
}

SPECINFER_API specinfer_status specinfer_registry_destroy(specinfer_registry *registry) {
  if (!registry) return SPECINFER_OK;
  if (registry->impl->busy()) return SPECINFER_ERR_STATE;
  delete registry;
  return SPECINFER_OK;
}

SPECINFER_API const char *specinfer_registry_plugin_path(const specinfer_registry *registry) {
  return registry ? registry->impl->search_path().c_str() : "";
}

SPECINFER_API specinfer_status specinfer_registry_load_plugin(specinfer_registry *registry,
                                                              const char *path, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!registry || !path)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry and path must not be NULL");
    registry->impl->load_file(path);
  });
}

SPECINFER_API specinfer_status specinfer_registry_load_dir(specinfer_registry *registry,
                                                           const char *dir, int32_t *n_loaded,
                                                           char **errmsg) {
  if (n_loaded) *n_loaded = 0;
  return guard(nullptr, errmsg, [&] {
    if (!registry || !dir)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry and dir must not be NULL");
    int n = registry->impl->load_dir(dir);
    if (n_loaded) *n_loaded = n;
  });
}

SPECINFER_API specinfer_status specinfer_registry_register_plugin(
    specinfer_registry *registry, const struct specinfer_plugin_descriptor *descriptor,
    char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!registry || !descriptor)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry and descriptor must not be NULL");
    registry->impl->register_plugin(descriptor);
  });
}

SPECINFER_API specinfer_status specinfer_registry_unload_plugin(specinfer_registry *registry,
                                                                const char *name, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!registry || !name)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry and name must not be NULL");
    registry->impl->unload(name);
  });
}

SPECINFER_API int32_t specinfer_registry_plugin_count(const specinfer_registry *registry) {
  return registry ? registry->impl->plugin_count() : 0;
}

SPECINFER_API specinfer_status specinfer_registry_plugin_info(const specinfer_registry *registry,
                                                              int32_t index,
                                                              specinfer_plugin_info *info) {
  if (!registry || !struct_ok(info)) return SPECINFER_ERR_INVALID_ARGUMENT;
  return registry->impl->plugin_info(index, info) ? SPECINFER_OK : SPECINFER_ERR_INVALID_ARGUMENT;
}

SPECINFER_API int32_t specinfer_registry_threads(const specinfer_registry *registry) {
  return registry ? registry->impl->threads() : 0;
}

/* ---- targets ---- */

SPECINFER_API specinfer_status specinfer_target_open(specinfer_registry *registry,
                                                     const char *plugin, const char *config,
                                                     specinfer_target **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!registry || !plugin)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry and plugin must not be NULL");
    *out = static_cast<specinfer_target *>(
        specinfer::open_target_object(*registry->impl, plugin, config ? config : ""));
  });
}

SPECINFER_API specinfer_status specinfer_target_share(specinfer_target *target,
                                                      specinfer_target **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!target) fail(SPECINFER_ERR_INVALID_ARGUMENT, "target is NULL");
    *out = static_cast<specinfer_target *>(target->share());
  });
}

SPECINFER_API specinfer_status specinfer_target_destroy(specinfer_target *target) {
  if (!target) return SPECINFER_OK;
  if (target->users > 0) {
    target->last_error = "the target is still used by a session, drafter or constraint";
    return SPECINFER_ERR_STATE;
  }
  delete target;
  return SPECINFER_OK;
}

SPECINFER_API const char *specinfer_target_errmsg(const specinfer_target *target) {
  return target ? nonnull(target->last_error) : "target is NULL";
}

SPECINFER_API void specinfer_model_info_init(specinfer_model_info *info) {
  if (!info) return;
  std::memset(info, 0, sizeof(*info));
  info->struct_size = sizeof(*info);
  info->bos_token = info->eos_token = info->eot_token = -1;
  info->name = info->arch = "";
}

SPECINFER_API specinfer_status specinfer_target_info(specinfer_target *target,
                                                     specinfer_model_info *info) {
  if (!target || !struct_ok(info)) return SPECINFER_ERR_INVALID_ARGUMENT;
  uint32_t size = info->struct_size;
  std::memcpy(info, &target->info(), std::min<size_t>(size, sizeof(specinfer_model_info)));
  info->struct_size = size;
  return SPECINFER_OK;
}

SPECINFER_API specinfer_status specinfer_target_tokenize(specinfer_target *target, const char *text,
                                                         size_t len, int32_t add_special,
                                                         int32_t parse_special, int32_t *tokens,
                                                         size_t cap, size_t *n_tokens) {
  if (!target) return SPECINFER_ERR_INVALID_ARGUMENT;
  if (n_tokens) *n_tokens = 0;
  return guard(&target->last_error, nullptr, [&] {
    if ((!text && len) || !n_tokens || (!tokens && cap))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "text, tokens or n_tokens is NULL");
    std::vector<int32_t> ids = target->tokenize(text ? text : "", len, add_special, parse_special);
    *n_tokens = ids.size();
    if (ids.size() > cap)
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "%zu tokens do not fit a buffer of %zu", ids.size(),
           cap);
    if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
  });
}

SPECINFER_API specinfer_status specinfer_target_detokenize(specinfer_target *target,
                                                           const int32_t *tokens, size_t n,
                                                           char *text, size_t cap,
                                                           size_t *n_bytes) {
  if (!target) return SPECINFER_ERR_INVALID_ARGUMENT;
  if (n_bytes) *n_bytes = 0;
  return guard(&target->last_error, nullptr, [&] {
    if ((!tokens && n) || !n_bytes || (!text && cap))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokens, text or n_bytes is NULL");
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (tokens[i] < 0 || tokens[i] >= target->info().vocab_size)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "token %d is outside the vocabulary", tokens[i]);
      out += target->token_bytes(tokens[i]);
    }
    *n_bytes = out.size();
    if (out.size() > cap)
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "%zu bytes do not fit a buffer of %zu", out.size(), cap);
    if (!out.empty()) std::memcpy(text, out.data(), out.size());
  });
}

SPECINFER_API void specinfer_eval_params_init(specinfer_eval_params *params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
}

SPECINFER_API specinfer_status specinfer_target_eval(specinfer_target *target,
                                                     const specinfer_eval_params *params,
                                                     int32_t *n_cached) {
  if (!target) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&target->last_error, nullptr, [&] {
    if (n_cached) *n_cached = target->kv_size();
    if (!params) return;
    if (!struct_ok(params))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->struct_size %u is not valid",
           params->struct_size);
    specinfer_eval_params p = merge_params(params, specinfer_eval_params_init);
    if (target->in_session) fail(SPECINFER_ERR_STATE, "the target is used by a session");
    const int32_t cached = target->kv_size();
    if (p.n_past < 0 || p.n_past > cached)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_past %d is outside the %d cached positions", p.n_past,
           cached);
    if (p.n_tokens > 0 && !p.tokens) fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokens is NULL");
    if (p.n_logits < 0 || static_cast<size_t>(p.n_logits) > p.n_tokens)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "n_logits %d is outside 0 .. %zu", p.n_logits,
           p.n_tokens);
    if (p.n_logits > 0 && !p.logits) fail(SPECINFER_ERR_INVALID_ARGUMENT, "logits is NULL");
    const specinfer_model_info &info = target->info();
    if (p.n_tokens > static_cast<size_t>(INT32_MAX) ||
        static_cast<int64_t>(p.n_past) + static_cast<int64_t>(p.n_tokens) > info.n_ctx)
      fail(SPECINFER_ERR_CONTEXT_FULL, "%d + %zu positions exceed the context window of %d",
           p.n_past, p.n_tokens, info.n_ctx);
    for (size_t i = 0; i < p.n_tokens; ++i)
      if (p.tokens[i] < 0 || p.tokens[i] >= info.vocab_size)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "token %d is outside the vocabulary", p.tokens[i]);
    if (p.n_past < cached) {
      const int32_t kept = target->kv_truncate(p.n_past);
      if (n_cached) *n_cached = kept;
      if (kept < p.n_past)
        fail(SPECINFER_ERR_STATE,
             "the target kept %d of the %d positions asked: its sliding-window layers no longer "
             "hold keys that position %d would see (evaluate again from position %d, or load it "
             "with swa_full=1)",
             kept, p.n_past, p.n_past, kept);
    }
    if (p.n_tokens > 0) {
      const auto n = static_cast<int32_t>(p.n_tokens);
      std::vector<int32_t> positions(p.n_tokens);
      for (int32_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = p.n_past + i;
      specinfer_forward_batch batch{};
      batch.struct_size = sizeof(batch);
      batch.n_tokens = n;
      batch.tokens = p.tokens;
      batch.positions = positions.data();
      batch.n_logits = p.n_logits;
      batch.logits = p.logits;
      batch.qk_observer = p.qk_observer;
      batch.qk_ctx = p.qk_ctx;
      target->forward(batch);
    }
    if (n_cached) *n_cached = target->kv_size();
  });
}

/* ---- drafters ---- */

SPECINFER_API specinfer_status specinfer_drafter_open(specinfer_registry *registry,
                                                      const char *plugin, const char *config,
                                                      specinfer_target *target,
                                                      specinfer_drafter **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!registry || !plugin || !target)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry, plugin and target must not be NULL");
    *out = static_cast<specinfer_drafter *>(
        specinfer::open_drafter_object(*registry->impl, plugin, config ? config : "", *target));
  });
}

SPECINFER_API specinfer_status specinfer_drafter_destroy(specinfer_drafter *drafter) {
  if (!drafter) return SPECINFER_OK;
  if (drafter->in_session) {
    drafter->last_error = "the drafter is still used by a session";
    return SPECINFER_ERR_STATE;
  }
  delete drafter;
  return SPECINFER_OK;
}

SPECINFER_API const char *specinfer_drafter_errmsg(const specinfer_drafter *drafter) {
  return drafter ? nonnull(drafter->last_error) : "drafter is NULL";
}

SPECINFER_API void specinfer_train_params_init(specinfer_train_params *params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
}

SPECINFER_API specinfer_status specinfer_drafter_train(specinfer_registry *registry,
                                                       const char *plugin, specinfer_target *target,
                                                       const specinfer_train_params *params,
                                                       char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!registry || !plugin || !target || !params)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry, plugin, target and params must not be NULL");
    if (params->struct_size < sizeof(specinfer_train_params))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->struct_size %u is smaller than %zu",
           params->struct_size, sizeof(specinfer_train_params));
    if (!params->out_path || !*params->out_path)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->out_path is empty");
    if (params->n_corpus < 0 || (params->n_corpus > 0 && !params->corpus))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->corpus is NULL with n_corpus %d",
           params->n_corpus);
    for (int32_t i = 0; i < params->n_corpus; ++i)
      if (!params->corpus[i]) fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->corpus[%d] is NULL", i);
    specinfer::train_drafter(*registry->impl, plugin, *target, *params);
  });
}

/* ---- sessions ---- */

SPECINFER_API void specinfer_session_params_init(specinfer_session_params *p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(*p);
  p->max_draft = 8;
  p->adaptive_draft = 1;
  p->temperature = 0.0f;
  p->top_k = 0;
  p->top_p = 1.0f;
  p->min_p = 0.0f;
  p->seed = 0;
  p->context_shift = 0;
  p->n_keep = 0;
}

SPECINFER_API specinfer_status specinfer_session_create(specinfer_target *target,
                                                        specinfer_drafter *drafter,
                                                        const specinfer_coupler *coupler,
                                                        const specinfer_session_params *params,
                                                        specinfer_session **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!target) fail(SPECINFER_ERR_INVALID_ARGUMENT, "target is NULL");
    if (params && !struct_ok(params))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "params->struct_size %u is not valid",
           params->struct_size);
    specinfer_session_params p = merge_params(params, specinfer_session_params_init);
    auto s = std::make_unique<specinfer_session>();
    s->impl = std::make_unique<specinfer::Session>(*target, drafter,
                                                   coupler ? coupler->impl.get() : nullptr, p);
    *out = s.release();
  });
}

SPECINFER_API void specinfer_session_destroy(specinfer_session *session) {
  delete session;
}

SPECINFER_API const char *specinfer_session_errmsg(const specinfer_session *session) {
  return session ? nonnull(session->impl->last_error) : "session is NULL";
}

SPECINFER_API specinfer_status specinfer_session_feed_text(specinfer_session *session,
                                                           const char *text, size_t len) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] { session->impl->feed_text(text, len); });
}

SPECINFER_API specinfer_status specinfer_session_feed_tokens(specinfer_session *session,
                                                             const int32_t *tokens, size_t n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] { session->impl->feed_tokens(tokens, n); });
}

SPECINFER_API specinfer_status specinfer_session_feed_from(specinfer_session *session,
                                                           specinfer_session *src,
                                                           size_t n_tokens) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] {
    if (!src) fail(SPECINFER_ERR_INVALID_ARGUMENT, "src is NULL");
    session->impl->continue_from(*src->impl, n_tokens);
  });
}

SPECINFER_API specinfer_status specinfer_session_generate(specinfer_session *session,
                                                          int32_t max_tokens,
                                                          specinfer_token_fn on_tokens,
                                                          void *user) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr,
               [&] { session->impl->generate(max_tokens, on_tokens, user); });
}

SPECINFER_API specinfer_status specinfer_session_step(specinfer_session *session, int32_t *tokens,
                                                      size_t cap, size_t *n_tokens, int32_t *done) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  if (n_tokens) *n_tokens = 0;
  if (done) *done = 0;
  return guard(&session->impl->last_error, nullptr, [&] {
    if (!tokens || !n_tokens)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "tokens and n_tokens must not be NULL");
    if (cap == 0) fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "cap is 0: no room for a token");
    std::vector<int32_t> out;
    bool finished = false;
    session->impl->step(static_cast<int32_t>(std::min(cap, session->impl->max_emit())), out,
                        finished);
    std::memcpy(tokens, out.data(), out.size() * sizeof(int32_t));
    *n_tokens = out.size();
    if (done) *done = finished;
  });
}

namespace {

specinfer_status step_many(specinfer_session *const *sessions, specinfer_step_result *results,
                           size_t n, int32_t prefill_chunk) {
  std::vector<specinfer::Session *> ready;
  std::vector<size_t> index;
  std::vector<int32_t> max_emits;
  for (size_t i = 0; i < n; ++i) {
    specinfer_step_result &r = results[i];
    r.n_tokens = 0;
    r.done = 0;
    r.status = SPECINFER_OK;
    specinfer_session *s = sessions[i];
    if (!s) {
      r.status = SPECINFER_ERR_INVALID_ARGUMENT;
      continue;
    }
    r.status = guard(&s->impl->last_error, nullptr, [&] {
      if (!r.tokens) fail(SPECINFER_ERR_INVALID_ARGUMENT, "result %zu: tokens is NULL", i);
      if (r.cap == 0) fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "result %zu: cap is 0", i);
    });
    if (r.status == SPECINFER_OK) {
      ready.push_back(s->impl.get());
      index.push_back(i);
      max_emits.push_back(static_cast<int32_t>(std::min(r.cap, s->impl->max_emit())));
    }
  }
  std::vector<std::vector<int32_t>> outs(ready.size());
  std::unique_ptr<bool[]> dones(new bool[ready.size()]());
  std::vector<std::exception_ptr> errors(ready.size());
  specinfer::Session::step_many(ready.data(), ready.size(), max_emits.data(), prefill_chunk,
                                outs.data(), dones.get(), errors.data());
  for (size_t k = 0; k < ready.size(); ++k) {
    specinfer_step_result &r = results[index[k]];
    specinfer_session *s = sessions[index[k]];
    r.status = guard(&s->impl->last_error, nullptr, [&] {
      if (errors[k]) std::rethrow_exception(errors[k]);
      if (!outs[k].empty())  // a session scoring its prompt in chunks emits nothing
        std::memcpy(r.tokens, outs[k].data(), outs[k].size() * sizeof(int32_t));
      r.n_tokens = outs[k].size();
      r.done = dones[k] ? 1 : 0;
    });
  }
  for (size_t i = 0; i < n; ++i)
    if (results[i].status != SPECINFER_OK) return results[i].status;
  return SPECINFER_OK;
}

}  // namespace

SPECINFER_API void specinfer_step_params_init(specinfer_step_params *params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  params->prefill_chunk = 64;
}

SPECINFER_API specinfer_status specinfer_session_step_many(specinfer_session *const *sessions,
                                                           specinfer_step_result *results, size_t n,
                                                           const specinfer_step_params *params) {
  specinfer_step_params p;
  specinfer_step_params_init(&p);
  if (params) {
    if (params->struct_size < sizeof(specinfer_step_params) || params->prefill_chunk < 0)
      return SPECINFER_ERR_INVALID_ARGUMENT;
    p.prefill_chunk = params->prefill_chunk;
  }
  if (n == 0) return SPECINFER_OK;
  if (!sessions || !results) return SPECINFER_ERR_INVALID_ARGUMENT;
  // A caller's mistake in the call itself runs nothing.
  for (size_t i = 0; i < n; ++i) {
    if (results[i].struct_size < sizeof(specinfer_step_result))
      return SPECINFER_ERR_INVALID_ARGUMENT;
    for (size_t j = 0; j < i; ++j)
      if (sessions[j] == sessions[i] && sessions[i]) {
        sessions[i]->impl->last_error = "step_many: the same session twice in one call";
        return SPECINFER_ERR_INVALID_ARGUMENT;
      }
  }
  try {
    return step_many(sessions, results, n, p.prefill_chunk);
  } catch (...) {  // allocations of the batch itself
    return SPECINFER_ERR_OUT_OF_MEMORY;
  }
}

SPECINFER_API specinfer_status specinfer_session_step_text(const specinfer_session *session,
                                                           const char **text, size_t *len) {
  if (!session || !text || !len) return SPECINFER_ERR_INVALID_ARGUMENT;
  const std::string &t = session->impl->last_step_text();
  *text = t.data();
  *len = t.size();
  return SPECINFER_OK;
}

SPECINFER_API specinfer_status specinfer_session_set_logprobs(specinfer_session *session,
                                                              int32_t top_n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] { session->impl->set_logprobs(top_n); });
}

namespace {

// The arrays of a session's log-probabilities into the caller's pointers (any may be NULL).
specinfer_status give_logprobs(const specinfer::Session::RoundLogprobs &lp, const int32_t **tokens,
                               const float **logprobs, const int32_t **top_tokens,
                               const float **top_logprobs, size_t *n, int32_t *top_n) {
  if (tokens) *tokens = lp.tokens.data();
  if (logprobs) *logprobs = lp.logprobs.data();
  if (top_tokens) *top_tokens = lp.top_tokens.data();
  if (top_logprobs) *top_logprobs = lp.top_logprobs.data();
  if (n) *n = lp.tokens.size();
  if (top_n) *top_n = lp.top_n;
  return SPECINFER_OK;
}

}  // namespace

SPECINFER_API specinfer_status specinfer_session_step_logprobs(
    const specinfer_session *session, const int32_t **tokens, const float **logprobs,
    const int32_t **top_tokens, const float **top_logprobs, size_t *n, int32_t *top_n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return give_logprobs(session->impl->last_logprobs(), tokens, logprobs, top_tokens, top_logprobs,
                       n, top_n);
}

SPECINFER_API specinfer_status specinfer_session_set_prompt_logprobs(specinfer_session *session,
                                                                     int32_t top_n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr,
               [&] { session->impl->set_prompt_logprobs(top_n); });
}

SPECINFER_API specinfer_status specinfer_session_prompt_logprobs(
    const specinfer_session *session, const int32_t **tokens, const float **logprobs,
    const int32_t **top_tokens, const float **top_logprobs, size_t *n, int32_t *top_n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return give_logprobs(session->impl->prompt_logprobs(), tokens, logprobs, top_tokens, top_logprobs,
                       n, top_n);
}

SPECINFER_API specinfer_status specinfer_session_set_stop_strings(specinfer_session *session,
                                                                  const char *const *stops,
                                                                  size_t n) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] {
    constexpr size_t kMaxStops = 64, kMaxStopBytes = 1024;
    if (n > 0 && !stops) fail(SPECINFER_ERR_INVALID_ARGUMENT, "stops is NULL");
    if (n > kMaxStops)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%zu stop strings: at most %zu", n, kMaxStops);
    std::vector<std::string> list;
    for (size_t i = 0; i < n; ++i) {
      if (!stops[i]) fail(SPECINFER_ERR_INVALID_ARGUMENT, "stop string %zu is NULL", i);
      const size_t len = std::strlen(stops[i]);
      if (len > kMaxStopBytes)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "stop string %zu is %zu bytes: at most %zu", i, len,
             kMaxStopBytes);
      list.emplace_back(stops[i], len);
    }
    session->impl->set_stop_strings(std::move(list));
  });
}

SPECINFER_API specinfer_status specinfer_session_end_text(specinfer_session *session,
                                                          const char **text, size_t *len) {
  if (!session || !text || !len) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] {
    const std::string &t = session->impl->end_text();
    *text = t.data();
    *len = t.size();
  });
}

SPECINFER_API void specinfer_session_stats_init(specinfer_session_stats *stats) {
  if (!stats) return;
  std::memset(stats, 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

SPECINFER_API specinfer_status specinfer_session_get_stats(const specinfer_session *session,
                                                           specinfer_session_stats *stats) {
  if (!session || !struct_ok(stats)) return SPECINFER_ERR_INVALID_ARGUMENT;
  session->impl->stats(*stats);
  return SPECINFER_OK;
}

SPECINFER_API void specinfer_round_info_init(specinfer_round_info *info) {
  if (!info) return;
  std::memset(info, 0, sizeof(*info));
  info->struct_size = sizeof(*info);
}

SPECINFER_API specinfer_status specinfer_session_round_info(const specinfer_session *session,
                                                            specinfer_round_info *info) {
  if (!session || !struct_ok(info)) return SPECINFER_ERR_INVALID_ARGUMENT;
  // A caller built with an older, shorter struct gets the fields its version has.
  const uint32_t size = info->struct_size;
  specinfer_round_info full = session->impl->round_info();
  full.struct_size = size;
  std::memcpy(info, &full, std::min<size_t>(size, sizeof full));
  return SPECINFER_OK;
}

SPECINFER_API specinfer_status specinfer_session_reset(specinfer_session *session) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr, [&] { session->impl->reset(); });
}

SPECINFER_API specinfer_status specinfer_session_tokens(const specinfer_session *session,
                                                        const int32_t **tokens, size_t *n) {
  if (!session || !tokens || !n) return SPECINFER_ERR_INVALID_ARGUMENT;
  *tokens = session->impl->tokens().data();
  *n = session->impl->tokens().size();
  return SPECINFER_OK;
}

SPECINFER_API specinfer_status specinfer_constraint_open(
    specinfer_registry *registry, const char *plugin, const char *config, specinfer_target *target,
    const char *kind, const char *grammar, specinfer_constraint **out, char **errmsg) {
  return guard(nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!registry || !plugin || !target || !kind)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "registry, plugin, target and kind must not be NULL");
    *out = static_cast<specinfer_constraint *>(specinfer::open_constraint_object(
        *registry->impl, plugin, config ? config : "", *target, kind, grammar ? grammar : ""));
  });
}

SPECINFER_API specinfer_status specinfer_constraint_fork(specinfer_constraint *constraint,
                                                         specinfer_constraint **out,
                                                         char **errmsg) {
  return guard(constraint ? &constraint->last_error : nullptr, errmsg, [&] {
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!constraint) fail(SPECINFER_ERR_INVALID_ARGUMENT, "constraint is NULL");
    *out = static_cast<specinfer_constraint *>(constraint->fork());
  });
}

SPECINFER_API specinfer_status specinfer_constraint_destroy(specinfer_constraint *constraint) {
  if (!constraint) return SPECINFER_OK;
  if (constraint->in_session) {
    constraint->last_error = "the constraint is still used by a session";
    return SPECINFER_ERR_STATE;
  }
  delete constraint;
  return SPECINFER_OK;
}

SPECINFER_API const char *specinfer_constraint_errmsg(const specinfer_constraint *constraint) {
  return constraint ? nonnull(constraint->last_error) : "constraint is NULL";
}

SPECINFER_API specinfer_status specinfer_session_set_constraint(specinfer_session *session,
                                                                specinfer_constraint *constraint) {
  if (!session) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guard(&session->impl->last_error, nullptr,
               [&] { session->impl->set_constraint(constraint); });
}

}  // extern "C"
