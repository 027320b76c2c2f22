// The ngram plugin: prompt-lookup drafting. Finds the most recent earlier occurrence of the
// context's last n tokens (longest n first, from n_max down to n_min) and proposes the tokens that
// followed it. Deterministic: proposes point masses. Works with any target's vocabulary.
//   config: n_min=<1..>, n_max=<..16>, max_draft=<1..64> (default 1, 4, 16)
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../common/plugin_config.h"
#include "specinfer_plugin.h"

using specinfer_plugin::Config;

namespace {

void set_err(specinfer_plugin_error *err, const std::string &msg) {
  if (err) std::snprintf(err->message, sizeof(err->message), "%s", msg.c_str());
}

struct Drafter {
  int32_t n_min = 1, n_max = 4, max_draft = 16;
};

void d_destroy(void *self) { delete static_cast<Drafter *>(self); }

specinfer_status d_begin(void *, const int32_t *, size_t, specinfer_plugin_error *) {
  return SPECINFER_OK;  // stateless: the context arrives with every request
}

specinfer_status d_commit(void *, const int32_t *, size_t, specinfer_plugin_error *) {
  return SPECINFER_OK;
}

// Index of the token after the most recent earlier occurrence of ctx's last n tokens, or -1.
ptrdiff_t find_continuation(const int32_t *ctx, size_t len, size_t n) {
  if (len < n + 1) return -1;
  const int32_t *pattern = ctx + len - n;
  // Candidate starts s with s + n < len (the match must be followed by at least one token), the
  // suffix itself (s = len - n) excluded; scan from the most recent.
  for (ptrdiff_t s = static_cast<ptrdiff_t>(len - n) - 1; s >= 0; --s) {
    if (ctx[s + static_cast<ptrdiff_t>(n) - 1] != pattern[n - 1]) continue;
    if (std::equal(pattern, pattern + n, ctx + s)) return s + static_cast<ptrdiff_t>(n);
  }
  return -1;
}

specinfer_status d_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  if (!req || !out || (!req->context && req->n_context)) {
    set_err(err, "malformed draft request");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  out->n_nodes = 0;
  out->has_probs = 0;
  int32_t want = std::min({req->max_tokens, out->cap, d->max_draft});
  if (want <= 0) return SPECINFER_OK;
  const int32_t *ctx = req->context;
  size_t len = req->n_context;
  for (int32_t n = d->n_max; n >= d->n_min; --n) {
    ptrdiff_t at = find_continuation(ctx, len, static_cast<size_t>(n));
    if (at < 0) continue;
    int32_t k = 0;
    // Copy what followed; the continuation may run into the suffix itself (repeating text).
    for (; k < want; ++k) {
      size_t src = static_cast<size_t>(at) + static_cast<size_t>(k);
      int32_t tok = src < len ? ctx[src] : out->tokens[src - len];
      out->tokens[k] = tok;
      out->parents[k] = k - 1;
    }
    out->n_nodes = k;
    return SPECINFER_OK;
  }
  return SPECINFER_OK;
}

const specinfer_drafter_vtable kVtable = {sizeof(specinfer_drafter_vtable), d_destroy, d_begin,
                                          d_propose, d_commit};

specinfer_status drafter_create(const specinfer_host *, const char *config,
                                const specinfer_model_info *, const specinfer_host_target *,
                                void **self, const specinfer_drafter_vtable **vtable,
                                specinfer_plugin_error *err) {
  try {
    Config cfg(config, {"n_min", "n_max", "max_draft"});
    auto d = std::make_unique<Drafter>();
    d->n_min = static_cast<int32_t>(cfg.get_int("n_min", 1, 1, 16));
    d->n_max = static_cast<int32_t>(cfg.get_int("n_max", 4, 1, 16));
    d->max_draft = static_cast<int32_t>(cfg.get_int("max_draft", 16, 1, 64));
    if (d->n_min > d->n_max) throw specinfer_plugin::ConfigError("n_min must not exceed n_max");
    *self = d.release();
    *vtable = &kVtable;
    return SPECINFER_OK;
  } catch (const specinfer_plugin::ConfigError &e) {
    set_err(err, e.what());
    return SPECINFER_ERR_CONFIG;
  } catch (const std::bad_alloc &) {
    set_err(err, "out of memory");
    return SPECINFER_ERR_OUT_OF_MEMORY;
  }
}

const specinfer_drafter_factory kFactory = {sizeof(specinfer_drafter_factory), drafter_create};

const void *get_factory(const char *id) {
  return id && !std::strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) ? &kFactory : nullptr;
}

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    SPECINFER_PLUGIN_ABI_VERSION,
    sizeof(specinfer_plugin_descriptor),
    "ngram",
    "1.0",
    "prompt lookup: proposes what followed the most recent match of the context's last n tokens",
    nullptr,
    nullptr,
    get_factory};
