// The llguidance plugin: constraints whose grammars llguidance compiles (JSON Schema, regular
// expressions, Lark), over the vocabulary of the target they are opened for.
//
// The vocabulary (a token trie and llguidance's precomputed token classes) costs a pass over
// every token, so it is built once per target and shared by every constraint opened for that
// target and their forks; it goes when the last of them does. Its tokenizer is the target's own
// (forced tokens are then the tokens the target itself would see), called under a lock, since
// constraints over one vocabulary may run on different threads.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/plugin_config.h"
#include "../common/plugin_error.h"
#include "llg_bridge.h"
#include "specinfer_plugin.h"

namespace {

using specinfer_plugin::fail;
using specinfer_plugin::guarded;

constexpr const char *kName = "llguidance";

struct Vocab {
  specinfer_host_target target{};
  LlgBridgeVocab *vocab = nullptr;
  int32_t n_vocab = 0;
  std::mutex tokenize_mu;
  ~Vocab() { llg_bridge_vocab_free(vocab); }
};

size_t tokenize_cb(const void *user, const uint8_t *text, size_t len, uint32_t *out, size_t cap) {
  auto *v = static_cast<Vocab *>(const_cast<void *>(user));
  std::lock_guard<std::mutex> lock(v->tokenize_mu);
  specinfer_plugin_error err{};
  size_t n = 0;
  const specinfer_status rc =
      v->target.vtable->tokenize(v->target.self, reinterpret_cast<const char *>(text), len, 0, 0,
                                 reinterpret_cast<int32_t *>(out), cap, &n, &err);
  // Too small a buffer: the count asked for. Any other failure: no tokens, and so no forced
  // tokens from this text (the grammar's masks do not depend on it).
  if (rc == SPECINFER_OK || rc == SPECINFER_ERR_BUFFER_TOO_SMALL) return n;
  return 0;
}

// The bytes of every token of the target: a token with none (a control token) and every
// end-of-generation token become special tokens (0xFF, then "[id]"), which no grammar text
// matches.
std::shared_ptr<Vocab> build_vocab(const specinfer_model_info &info,
                                   const specinfer_host_target &target) {
  auto v = std::make_shared<Vocab>();
  v->target = target;
  v->n_vocab = info.vocab_size;
  std::vector<uint32_t> eos;
  if (info.eog_tokens && info.n_eog_tokens > 0)
    eos.assign(info.eog_tokens, info.eog_tokens + info.n_eog_tokens);
  else if (info.eos_token >= 0)
    eos.push_back(static_cast<uint32_t>(info.eos_token));
  // A target without an end-of-generation token (a k-gram byte model) gets one of llguidance's
  // own past its vocabulary, which it never emits: its text ends where the grammar does.
  const bool virtual_eos = eos.empty();
  if (virtual_eos) eos.push_back(static_cast<uint32_t>(info.vocab_size));
  std::vector<uint32_t> lens(static_cast<size_t>(info.vocab_size) + (virtual_eos ? 1 : 0));
  std::string bytes;
  std::vector<char> buf(256);
  specinfer_plugin_error err{};
  for (int32_t t = 0; t < info.vocab_size; ++t) {
    size_t n = 0;
    specinfer_status rc =
        target.vtable->token_bytes(target.self, t, buf.data(), buf.size(), &n, &err);
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL) {
      buf.resize(n);
      rc = target.vtable->token_bytes(target.self, t, buf.data(), buf.size(), &n, &err);
    }
    if (rc != SPECINFER_OK)
      fail(rc, "%s: reading token %d of the target: %s", kName, t, err.message);
    bool special = n == 0;
    for (uint32_t e : eos) special = special || e == static_cast<uint32_t>(t);
    const size_t before = bytes.size();
    if (special) {
      bytes += "\xff[";
      bytes += std::to_string(t);
      bytes += ']';
    } else {
      bytes.append(buf.data(), n);
    }
    lens[static_cast<size_t>(t)] = static_cast<uint32_t>(bytes.size() - before);
  }
  if (virtual_eos) {
    const size_t before = bytes.size();
    bytes += "\xff[end]";
    lens.back() = static_cast<uint32_t>(bytes.size() - before);
  }
  char msg[512] = "";
  v->vocab = llg_bridge_vocab_new(static_cast<uint32_t>(lens.size()), lens.data(),
                                  reinterpret_cast<const uint8_t *>(bytes.data()), eos.data(),
                                  static_cast<uint32_t>(eos.size()), tokenize_cb, v.get(), msg,
                                  sizeof msg);
  if (!v->vocab) fail(SPECINFER_ERR_PLUGIN, "%s: building the vocabulary: %s", kName, msg);
  return v;
}

// Vocabularies by the target instance they read; an entry lives while a constraint uses it (a
// target cannot be closed meanwhile, so a live entry's target is the one at that address).
std::mutex vocabs_mu;
std::map<const void *, std::weak_ptr<Vocab>> vocabs;

std::shared_ptr<Vocab> vocab_for(const specinfer_model_info &info,
                                 const specinfer_host_target &target) {
  std::lock_guard<std::mutex> lock(vocabs_mu);
  for (auto it = vocabs.begin(); it != vocabs.end();)
    it = it->second.expired() ? vocabs.erase(it) : std::next(it);
  if (auto it = vocabs.find(target.self); it != vocabs.end())
    if (auto v = it->second.lock()) return v;
  auto v = build_vocab(info, target);
  vocabs[target.self] = v;
  return v;
}

struct Constraint {
  std::shared_ptr<Vocab> vocab;
  LlgBridgeMatcher *matcher = nullptr;
  ~Constraint() { llg_bridge_matcher_free(matcher); }
};

Constraint *self_of(void *self) {
  if (!self) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: NULL constraint", kName);
  return static_cast<Constraint *>(self);
}

void constraint_destroy(void *self) {
  delete static_cast<Constraint *>(self);
}

specinfer_status constraint_mask(void *self, uint32_t *mask, int32_t n_words,
                                 specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    if (!mask || n_words != (c.vocab->n_vocab + 31) / 32)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: mask needs %d words", kName,
           (c.vocab->n_vocab + 31) / 32);
    char msg[512] = "";
    if (llg_bridge_matcher_mask(c.matcher, mask, static_cast<size_t>(n_words), msg, sizeof msg))
      fail(SPECINFER_ERR_PLUGIN, "%s: %s", kName, msg);
  });
}

specinfer_status constraint_consume(void *self, int32_t token, specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    char msg[512] = "";
    const int32_t r = token < 0 ? 1
                                : llg_bridge_matcher_consume(
                                      c.matcher, static_cast<uint32_t>(token), msg, sizeof msg);
    if (r == 1)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: the grammar does not allow token %d here", kName,
           token);
    if (r != 0) fail(SPECINFER_ERR_PLUGIN, "%s: %s", kName, msg);
  });
}

specinfer_status constraint_rollback(void *self, int32_t n, specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    if (n < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: rollback of %d tokens", kName, n);
    char msg[512] = "";
    if (llg_bridge_matcher_rollback(c.matcher, static_cast<size_t>(n), msg, sizeof msg))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: %s", kName, msg);
  });
}

specinfer_status constraint_fork(void *self, void **out, specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    if (!out) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: fork: NULL out", kName);
    *out = nullptr;
    auto f = std::make_unique<Constraint>();
    f->vocab = c.vocab;
    char msg[512] = "";
    f->matcher = llg_bridge_matcher_fork(c.matcher, msg, sizeof msg);
    if (!f->matcher) fail(SPECINFER_ERR_PLUGIN, "%s: %s", kName, msg);
    *out = f.release();
  });
}

specinfer_status constraint_forced(void *self, int32_t *tokens, int32_t cap, int32_t *n,
                                   specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    if (!n || cap < 0 || (cap > 0 && !tokens))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: forced: bad arguments", kName);
    *n = 0;
    char msg[512] = "";
    const int32_t r = llg_bridge_matcher_forced(c.matcher, reinterpret_cast<uint32_t *>(tokens),
                                                static_cast<size_t>(cap), msg, sizeof msg);
    if (r < 0) fail(SPECINFER_ERR_PLUGIN, "%s: %s", kName, msg);
    *n = r;
  });
}

specinfer_status constraint_state(void *self, uint32_t *state, specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    Constraint &c = *self_of(self);
    if (!state) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: state: NULL out", kName);
    char msg[512] = "";
    const int32_t r = llg_bridge_matcher_state(c.matcher, msg, sizeof msg);
    if (r < 0) fail(SPECINFER_ERR_PLUGIN, "%s: %s", kName, msg);
    *state =
        (r & 1 ? SPECINFER_CONSTRAINT_ACCEPTING : 0u) | (r & 2 ? SPECINFER_CONSTRAINT_STOPPED : 0u);
  });
}

constexpr specinfer_constraint_vtable kVtable = {
    sizeof(specinfer_constraint_vtable),
    constraint_destroy,
    constraint_mask,
    constraint_consume,
    constraint_rollback,
    constraint_fork,
    constraint_forced,
    constraint_state,
};

specinfer_status constraint_create(const specinfer_host *host, const char *config,
                                   const specinfer_model_info *target_info,
                                   const specinfer_host_target *target, const char *kind,
                                   const char *grammar, void **self,
                                   const specinfer_constraint_vtable **vtable,
                                   specinfer_plugin_error *err) {
  return guarded(err, kName, [&] {
    if (!self || !vtable) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: NULL out-parameter", kName);
    *self = nullptr;
    *vtable = nullptr;
    if (!host || !target_info || !target || !target->vtable || !kind)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: NULL argument", kName);
    specinfer_plugin::Config cfg(config, {});
    const std::string k = kind;
    if (k != "json_schema" && k != "json_object" && k != "regex" && k != "lark")
      fail(SPECINFER_ERR_UNSUPPORTED,
           "%s: unknown grammar kind '%s' (known: json_schema, json_object, regex, lark)", kName,
           kind);
    if (!grammar) fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: the grammar is NULL", kName);
    auto c = std::make_unique<Constraint>();
    c->vocab = vocab_for(*target_info, *target);
    char msg[512] = "";
    c->matcher = llg_bridge_matcher_new(c->vocab->vocab, kind, grammar, msg, sizeof msg);
    if (!c->matcher)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "%s: the %s does not compile: %s", kName, kind, msg);
    *self = c.release();
    *vtable = &kVtable;
  });
}

constexpr specinfer_constraint_factory kFactory = {sizeof(specinfer_constraint_factory),
                                                   constraint_create};

const void *get_factory(const char *id) {
  return id && !std::strcmp(id, SPECINFER_CONSTRAINT_FACTORY_ID) ? &kFactory : nullptr;
}

void deinit() {
  std::lock_guard<std::mutex> lock(vocabs_mu);
  vocabs.clear();
}

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    SPECINFER_PLUGIN_ABI_VERSION,
    sizeof(specinfer_plugin_descriptor),
    kName,
    "1.0",
    "constraints: JSON Schema, regular expressions and Lark grammars compiled by llguidance",
    nullptr,
    deinit,
    get_factory,
};
