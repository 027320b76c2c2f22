// The kgram plugin: Shannon's k-gram byte model as a target and as a drafter.
//   target config: path=<text file>, k=<1..7, default 6>, smoothing=<s > 0, default 1>,
//                  n_ctx=<default 8192>
//                  share() gives another instance on the same table (one copy, however many
//                  sequences); forward_many() scores several such instances in one call.
//   drafter config: the same keys; proposes greedily (point masses) when the session decodes
//                   greedily, else samples each token with the coupler's draft side and reports q.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../common/plugin_config.h"
#include "kgram_model.h"
#include "specinfer_plugin.h"

using specinfer_kgram::kVocab;
using specinfer_kgram::Model;
using specinfer_plugin::Config;
using specinfer_plugin::guarded;
using specinfer_plugin::set_error;

namespace {

std::shared_ptr<Model> make_model(const Config &cfg, std::string *name) {
  if (!cfg.has("path"))
    throw specinfer_plugin::ConfigError("kgram needs path=<training text file>");
  int k = static_cast<int>(cfg.get_int("k", 6, 1, specinfer_kgram::kMaxOrder));
  double s = cfg.get_float("smoothing", 1.0, 1e-6, 1e6);
  auto m = std::make_shared<Model>(cfg.get("path", ""), k, s);
  *name = "kgram-k" + std::to_string(k);
  return m;
}

/* ---------------- target ---------------- */

// One instance: a sequence on a k-gram table. The table is immutable once trained, so instances
// made by share() hold the same one (reference-counted: destroyed in any order) and may run on
// different threads at once; everything mutable is the instance's own.
struct Target {
  std::shared_ptr<const Model> model;
  std::string name;
  int32_t n_ctx = 8192;
  std::vector<uint8_t> cache;  // the "KV cache" of a k-gram model is the text itself
  std::vector<uint8_t> ctx;    // scratch, reserved for kMaxOrder bytes: scoring never allocates

  Target() { ctx.reserve(specinfer_kgram::kMaxOrder); }
};

void t_destroy(void *self) {
  delete static_cast<Target *>(self);
}

specinfer_status t_info(void *self, specinfer_model_info *info) {
  auto *t = static_cast<Target *>(self);
  info->vocab_size = kVocab;
  info->n_ctx = t->n_ctx;
  info->hidden_size = 0;
  info->bos_token = info->eos_token = info->eot_token = -1;
  info->add_bos = 0;
  info->name = t->name.c_str();
  info->arch = "kgram";
  return SPECINFER_OK;
}

specinfer_status t_tokenize(void *, const char *text, size_t len, int32_t, int32_t, int32_t *tokens,
                            size_t cap, size_t *n_tokens, specinfer_plugin_error *err) {
  *n_tokens = len;
  if (len > cap) {
    set_error(err, "token buffer too small");
    return SPECINFER_ERR_BUFFER_TOO_SMALL;
  }
  for (size_t i = 0; i < len; ++i) tokens[i] = static_cast<uint8_t>(text[i]);
  return SPECINFER_OK;
}

specinfer_status t_token_bytes(void *, int32_t token, char *buf, size_t cap, size_t *n_bytes,
                               specinfer_plugin_error *err) {
  if (token < 0 || token >= kVocab) {
    set_error(err, "token " + std::to_string(token) + " is not a byte");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  *n_bytes = 1;
  if (cap < 1) return SPECINFER_ERR_BUFFER_TOO_SMALL;
  buf[0] = static_cast<char>(token);
  return SPECINFER_OK;
}

// Whether `t` can take batch `b` (`what` names it in the message); changes nothing.
specinfer_status check_batch(const Target &t, const specinfer_forward_batch *b,
                             const std::string &what, specinfer_plugin_error *err) {
  if (!b || b->n_tokens < 0 || (b->n_tokens > 0 && (!b->tokens || !b->positions)) ||
      b->n_logits < 0 || b->n_logits > b->n_tokens || (b->n_logits > 0 && !b->logits)) {
    set_error(err, "malformed forward batch" + what);
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  if (t.cache.size() + static_cast<size_t>(b->n_tokens) > static_cast<size_t>(t.n_ctx)) {
    set_error(err, "context window full" + what);
    return SPECINFER_ERR_CONTEXT_FULL;
  }
  for (int32_t i = 0; i < b->n_tokens; ++i)
    if (b->tokens[i] < 0 || b->tokens[i] >= kVocab) {
      set_error(err, "token " + std::to_string(b->tokens[i]) + " is not a byte" + what);
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
  return SPECINFER_OK;
}

// Scores a batch check_batch accepted and appends it to the cache. Does not allocate once the
// cache has room for the batch (reserve it first), so it cannot fail half-way.
void run_batch(Target &t, const specinfer_forward_batch &b) {
  const int32_t n = b.n_tokens;
  const size_t base = t.cache.size();
  const int k = t.model->order();
  for (int32_t i = n - b.n_logits; i < n; ++i) {
    // The context of batch token i: the cache, then the batch tokens it may attend (itself last).
    t.ctx.clear();
    uint8_t seen[specinfer_kgram::kMaxOrder];
    int n_seen = 0;
    for (int32_t j = i; j >= 0 && n_seen < k; --j) {
      bool visible = b.tree_mask ? b.tree_mask[static_cast<size_t>(i) * n + j] != 0 : true;
      if (visible) seen[n_seen++] = static_cast<uint8_t>(b.tokens[j]);
    }
    size_t from_cache = std::min(static_cast<size_t>(k - n_seen), base);
    t.ctx.insert(t.ctx.end(), t.cache.end() - static_cast<std::ptrdiff_t>(from_cache),
                 t.cache.end());
    for (int j = n_seen - 1; j >= 0; --j) t.ctx.push_back(seen[j]);
    float *out = b.logits + static_cast<size_t>(i - (n - b.n_logits)) * kVocab;
    t.model->distribution(t.ctx.data(), t.ctx.size(), out);
    for (int x = 0; x < kVocab; ++x) out[x] = std::log(out[x]);
  }
  for (int32_t i = 0; i < n; ++i) t.cache.push_back(static_cast<uint8_t>(b.tokens[i]));
}

specinfer_status t_forward(void *self, const specinfer_forward_batch *b,
                           specinfer_plugin_error *err) {
  auto *t = static_cast<Target *>(self);
  return guarded(err, "kgram", [&] {
    specinfer_status rc = check_batch(*t, b, "", err);
    if (rc != SPECINFER_OK) return rc;
    t->cache.reserve(t->cache.size() + static_cast<size_t>(b->n_tokens));
    run_batch(*t, *b);
    return SPECINFER_OK;
  });
}

specinfer_status t_share(void *self, void **out, specinfer_plugin_error *err) {
  return guarded(err, "kgram", [&] {
    if (!self || !out) {
      set_error(err, "kgram: share: NULL argument");
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
    *out = nullptr;
    // Reads only what never changes after creation: safe while another thread uses `self`.
    const auto *t = static_cast<const Target *>(self);
    auto s = std::make_unique<Target>();
    s->model = t->model;
    s->name = t->name;
    s->n_ctx = t->n_ctx;
    *out = s.release();
    return SPECINFER_OK;
  });
}

// The table is in memory, so one pass for several instances is each instance's own forward in
// turn; what it adds is checking the whole call first, so that an error changes no instance.
specinfer_status t_forward_many(void *const *selves, const specinfer_forward_batch *batches,
                                int32_t n, specinfer_plugin_error *err) {
  return guarded(err, "kgram", [&] {
    if (n <= 0 || !selves || !batches) {
      set_error(err, "kgram: forward_many: NULL arrays or n " + std::to_string(n) + " <= 0");
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
    std::vector<Target *> ts(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      auto *t = static_cast<Target *>(selves[i]);
      if (!t) {
        set_error(err, "kgram: forward_many: instance " + std::to_string(i) + " is NULL");
        return SPECINFER_ERR_INVALID_ARGUMENT;
      }
      for (int32_t j = 0; j < i; ++j)
        if (ts[static_cast<size_t>(j)] == t) {
          set_error(err, "kgram: forward_many: instances " + std::to_string(j) + " and " +
                             std::to_string(i) + " are the same instance");
          return SPECINFER_ERR_INVALID_ARGUMENT;
        }
      if (i > 0 && t->model != ts[0]->model) {
        set_error(err, "kgram: forward_many: instance " + std::to_string(i) +
                           " is on another k-gram table (not a share of instance 0)");
        return SPECINFER_ERR_INVALID_ARGUMENT;
      }
      ts[static_cast<size_t>(i)] = t;
      specinfer_status rc = check_batch(*t, &batches[i], " (batch " + std::to_string(i) + ")", err);
      if (rc != SPECINFER_OK) return rc;
    }
    // Room first (may throw, changing nothing), then the passes, which cannot fail.
    for (int32_t i = 0; i < n; ++i)
      ts[static_cast<size_t>(i)]->cache.reserve(ts[static_cast<size_t>(i)]->cache.size() +
                                                static_cast<size_t>(batches[i].n_tokens));
    for (int32_t i = 0; i < n; ++i) run_batch(*ts[static_cast<size_t>(i)], batches[i]);
    return SPECINFER_OK;
  });
}

int32_t t_kv_size(void *self) {
  return static_cast<int32_t>(static_cast<Target *>(self)->cache.size());
}

specinfer_status t_kv_truncate(void *self, int32_t n_keep, specinfer_plugin_error *err) {
  auto *t = static_cast<Target *>(self);
  if (n_keep < 0 || static_cast<size_t>(n_keep) > t->cache.size()) {
    set_error(err, "kv_truncate: " + std::to_string(n_keep) + " is outside [0, " +
                       std::to_string(t->cache.size()) + "]");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  t->cache.resize(static_cast<size_t>(n_keep));
  return SPECINFER_OK;
}

specinfer_status t_kv_keep(void *self, int32_t base, const int32_t *idx, int32_t n,
                           specinfer_plugin_error *err) {
  auto *t = static_cast<Target *>(self);
  int32_t size = static_cast<int32_t>(t->cache.size());
  if (base < 0 || base > size || n < 0 || (n > 0 && !idx)) {
    set_error(err, "kv_keep: bad arguments");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  for (int32_t i = 0; i < n; ++i)
    if (base + idx[i] >= size || idx[i] < 0 || (i > 0 && idx[i] <= idx[i - 1])) {
      set_error(err, "kv_keep: indices must increase and lie in the cache");
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
  for (int32_t i = 0; i < n; ++i)
    t->cache[static_cast<size_t>(base + i)] = t->cache[static_cast<size_t>(base + idx[i])];
  t->cache.resize(static_cast<size_t>(base + n));
  return SPECINFER_OK;
}

const specinfer_target_vtable kTargetVtable = {sizeof(specinfer_target_vtable),
                                               t_destroy,
                                               t_info,
                                               t_tokenize,
                                               t_token_bytes,
                                               t_forward,
                                               t_kv_size,
                                               t_kv_truncate,
                                               t_kv_keep,
                                               nullptr,  // no hidden state: no output rows
                                               t_share,
                                               t_forward_many,
                                               nullptr};  // no kv_copy: feed_from scores

specinfer_status target_create(const specinfer_host *, const char *config, void **self,
                               const specinfer_target_vtable **vtable,
                               specinfer_plugin_error *err) {
  return guarded(err, "kgram", [&] {
    Config cfg(config, {"path", "k", "smoothing", "n_ctx"});
    auto t = std::make_unique<Target>();
    t->model = make_model(cfg, &t->name);
    t->n_ctx = static_cast<int32_t>(cfg.get_int("n_ctx", 8192, 16, 1 << 24));
    *self = t.release();
    *vtable = &kTargetVtable;
    return SPECINFER_OK;
  });
}

const specinfer_target_factory kTargetFactory = {sizeof(specinfer_target_factory), target_create};

/* ---------------- drafter ---------------- */

struct Drafter {
  std::shared_ptr<Model> model;
  std::string name;
  std::vector<uint8_t> text;  // committed sequence
  std::vector<uint8_t> ctx;   // scratch: text + draft so far
  std::vector<float> probs;
};

void d_destroy(void *self) {
  delete static_cast<Drafter *>(self);
}

specinfer_status d_begin(void *self, const int32_t *context, size_t n,
                         specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  d->text.clear();
  for (size_t i = 0; i < n; ++i) {
    if (context[i] < 0 || context[i] >= kVocab) {
      set_error(err, "context token is not a byte");
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
    d->text.push_back(static_cast<uint8_t>(context[i]));
  }
  return SPECINFER_OK;
}

specinfer_status d_commit(void *self, const int32_t *tokens, size_t n,
                          specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= kVocab) {
      set_error(err, "committed token is not a byte");
      return SPECINFER_ERR_INVALID_ARGUMENT;
    }
    d->text.push_back(static_cast<uint8_t>(tokens[i]));
  }
  return SPECINFER_OK;
}

specinfer_status d_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "kgram", [&] {
    if (out->vocab_size != kVocab) {
      set_error(err, "kgram drafts bytes (vocabulary 256); the target's vocabulary is " +
                         std::to_string(out->vocab_size));
      return SPECINFER_ERR_UNSUPPORTED;
    }
    const int k = d->model->order();
    const bool sample = req->temperature > 0 && req->sample;
    int32_t n = std::min(req->max_tokens, out->cap);
    d->ctx.assign(d->text.end() - static_cast<std::ptrdiff_t>(std::min<size_t>(d->text.size(), k)),
                  d->text.end());
    d->probs.resize(kVocab);
    for (int32_t i = 0; i < n; ++i) {
      float *q = sample ? out->probs + static_cast<size_t>(i) * kVocab : d->probs.data();
      d->model->distribution(d->ctx.data(), d->ctx.size(), q);
      int32_t tok = 0;
      if (sample) {
        // The same temperature the target's distribution gets: q ∝ P^(1/T).
        double inv_t = 1.0 / req->temperature, sum = 0;
        for (int x = 0; x < kVocab; ++x) sum += (q[x] = static_cast<float>(std::pow(q[x], inv_t)));
        for (int x = 0; x < kVocab; ++x) q[x] = static_cast<float>(q[x] / sum);
        tok = req->sample(req->sample_ctx, q, kVocab, static_cast<int64_t>(req->n_context) + i);
        if (tok < 0 || tok >= kVocab) {
          set_error(err, "the coupler's draft sampler failed");
          return SPECINFER_ERR_PLUGIN;
        }
      } else {
        for (int x = 1; x < kVocab; ++x)
          if (q[x] > q[tok]) tok = x;
      }
      out->tokens[i] = tok;
      out->parents[i] = i - 1;
      d->ctx.push_back(static_cast<uint8_t>(tok));
      if (d->ctx.size() > static_cast<size_t>(k)) d->ctx.erase(d->ctx.begin());
    }
    out->n_nodes = n;
    out->has_probs = sample ? 1 : 0;
    return SPECINFER_OK;
  });
}

const specinfer_drafter_vtable kDrafterVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, nullptr};

specinfer_status drafter_create(const specinfer_host *, const char *config,
                                const specinfer_model_info *target_info,
                                const specinfer_host_target *, void **self,
                                const specinfer_drafter_vtable **vtable,
                                specinfer_plugin_error *err) {
  return guarded(err, "kgram", [&] {
    if (!target_info || target_info->vocab_size != kVocab) {
      set_error(err, "the kgram drafter needs a byte-level target (vocabulary 256)");
      return SPECINFER_ERR_UNSUPPORTED;
    }
    Config cfg(config, {"path", "k", "smoothing"});
    auto d = std::make_unique<Drafter>();
    d->model = make_model(cfg, &d->name);
    *self = d.release();
    *vtable = &kDrafterVtable;
    return SPECINFER_OK;
  });
}

const specinfer_drafter_factory kDrafterFactory = {sizeof(specinfer_drafter_factory),
                                                   drafter_create, nullptr};

const void *get_factory(const char *id) {
  if (!id) return nullptr;
  if (!std::strcmp(id, SPECINFER_TARGET_FACTORY_ID)) return &kTargetFactory;
  if (!std::strcmp(id, SPECINFER_DRAFTER_FACTORY_ID)) return &kDrafterFactory;
  return nullptr;
}

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    SPECINFER_PLUGIN_ABI_VERSION,
    sizeof(specinfer_plugin_descriptor),
    "kgram",
    "1.0",
    "Shannon's k-gram byte language model, trained from a text file (target and drafter)",
    nullptr,
    nullptr,
    get_factory};
