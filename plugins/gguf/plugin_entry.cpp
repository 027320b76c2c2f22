// The gguf plugin: a target factory over GGUF transformer models. This file is the ABI seam: every
// vtable function catches all exceptions and turns them into a status plus message.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../common/plugin_config.h"
#include "gguf_error.h"
#include "gguf_file.h"
#include "model.h"
#include "specinfer_plugin.h"
#include "tokenizer.h"

namespace specinfer::gguf {
namespace {

using specinfer_plugin::guarded;

// What the targets sharing one loaded model have in common (share()): the file mapping, the
// tokenizer and the weights, immutable once loaded.
struct Loaded {
  std::unique_ptr<File> file;  // declared first: the weights point into it
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const Weights> weights;
  std::vector<int32_t> eog;  // with a vocabulary limit: ids every sequence computes logits for
  // With a vocabulary limit: the most other ids above it a sequence keeps (Model::extra_cap).
  int32_t vocab_extra = kDefaultExtraCap;
  std::string name, arch;
  std::optional<std::string> chat_template;  // tokenizer.chat_template
};

// One target instance: a sequence (KV cache) on a loaded model.
struct Target {
  std::shared_ptr<const Loaded> loaded;
  std::unique_ptr<Model> model;
};

// A new sequence on `loaded`, its end-of-generation logits computed as the first one's.
std::unique_ptr<Target> new_sequence(std::shared_ptr<const Loaded> loaded) {
  auto t = std::make_unique<Target>();
  t->model = std::make_unique<Model>(loaded->weights);
  t->model->set_extra_cap(loaded->vocab_extra);
  t->model->add_output_ids(loaded->eog.data(), static_cast<int32_t>(loaded->eog.size()), true);
  t->loaded = std::move(loaded);
  return t;
}

struct Config {
  std::string path;
  int32_t n_ctx = 0;        // 0 = the model's trained context
  bool pack = true;         // repack weights at load for the faster kernels
  int32_t vocab_limit = 0;  // logits only for ids below it (draft models); 0 = all
  int32_t requant = -1;     // re-quantize wider matrices to this type (draft models); -1 = keep
  int32_t kv_type = -1;     // the KV cache's storage type; -1 = f16 (f32 without kv_store)
  SketchedAttention attn;   // attn=qjl and its sizes
  bool swa_full = false;    // keep every position in sliding-window layers
  // A q8_0 cache's keys in tiles of 16 positions (1) or rows (0); -1: tiles unless attn=qjl, whose
  // picked keys are gathered faster from rows than lane by lane from tiles.
  int32_t kv_tiles = -1;
  // With vocab_limit: the most other ids above it a sequence keeps (Model::extra_cap).
  int32_t vocab_extra = kDefaultExtraCap;
};

Config parse_config(const char *text) {
  const specinfer_plugin::Config kv(
      text, {"path", "n_ctx", "pack", "vocab_limit", "vocab_extra", "requant", "kv_type", "attn",
             "attn_bits", "attn_keys", "attn_window", "attn_sink", "attn_rescore", "swa_full",
             "kv_tiles"});
  const auto int_of = [&](const char *key, int32_t def, long lo) {
    return int32_t(kv.get_int(key, def, lo, 1L << 24));
  };
  Config cfg;
  cfg.path = kv.get("path", "");
  if (cfg.path.empty()) fail(SPECINFER_ERR_CONFIG, "config key 'path' is required");
  cfg.n_ctx = int_of("n_ctx", cfg.n_ctx, 1);
  cfg.vocab_limit = int_of("vocab_limit", cfg.vocab_limit, 0);
  cfg.vocab_extra = int_of("vocab_extra", cfg.vocab_extra, 0);
  cfg.requant = kv.get_choice<int32_t>("requant", cfg.requant,
                                       {{"q4_0", SPECINFER_WTYPE_Q4_0},
                                        {"q3_0", SPECINFER_WTYPE_Q3_0},
                                        {"q8_0", SPECINFER_WTYPE_Q8_0},
                                        {"none", -1},
                                        {"0", -1}});
  cfg.kv_type = kv.get_choice<int32_t>("kv_type", cfg.kv_type,
                                       {{"f32", SPECINFER_WTYPE_F32},
                                        {"f16", SPECINFER_WTYPE_F16},
                                        {"q8_0", SPECINFER_WTYPE_Q8_0},
                                        {"q4_0", SPECINFER_WTYPE_Q4_0}});
  cfg.attn.on = kv.get_choice<bool>("attn", false, {{"exact", false}, {"qjl", true}});
  cfg.attn.bits = int32_t(kv.get_int("attn_bits", cfg.attn.bits, 32, 1024));
  if (cfg.attn.bits % 32 != 0)
    fail(SPECINFER_ERR_CONFIG, "config key 'attn_bits' needs a multiple of 32, got %d",
         cfg.attn.bits);
  cfg.attn.keys = int_of("attn_keys", cfg.attn.keys, 1);
  cfg.attn.window = int_of("attn_window", cfg.attn.window, 0);
  cfg.attn.sink = int_of("attn_sink", cfg.attn.sink, 0);
  cfg.attn.rescore = int_of("attn_rescore", cfg.attn.rescore, 0);
  cfg.pack = kv.get_int("pack", 1, 0, 1) != 0;
  cfg.swa_full = kv.get_int("swa_full", 0, 0, 1) != 0;
  cfg.kv_tiles = int32_t(kv.get_int("kv_tiles", cfg.kv_tiles, 0, 1));
  return cfg;
}

Target *self_of(void *p) {
  return static_cast<Target *>(p);
}

Batch batch_of(const specinfer_forward_batch &b) {
  if (b.struct_size < offsetof(specinfer_forward_batch, hidden) + sizeof(b.hidden))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward batch struct_size %u too small",
         unsigned(b.struct_size));
  return Batch{b.tokens, b.positions, b.n_tokens, b.tree_mask, b.n_logits, b.logits, b.hidden};
}

void target_destroy(void *self) {
  delete self_of(self);
}

specinfer_status target_info(void *self, specinfer_model_info *info) {
  if (self == nullptr || info == nullptr) return SPECINFER_ERR_INVALID_ARGUMENT;
  const Target *t = self_of(self);
  const Loaded &l = *t->loaded;
  const Hparams &hp = t->model->hparams();
  // Fill only the fields the caller's struct has room for.
  specinfer_model_info full;
  std::memset(&full, 0, sizeof full);
  full.struct_size = info->struct_size;
  full.vocab_size = hp.n_vocab;
  full.n_ctx = t->model->n_ctx();
  full.hidden_size = hp.n_embd;
  full.bos_token = l.tokenizer->bos();
  full.eos_token = l.tokenizer->eos();
  full.eot_token = l.tokenizer->eot();
  full.add_bos = l.tokenizer->add_bos() ? 1 : 0;
  full.name = l.name.c_str();
  full.arch = l.arch.c_str();
  full.eog_tokens = l.tokenizer->eog().empty() ? nullptr : l.tokenizer->eog().data();
  full.n_eog_tokens = static_cast<int32_t>(l.tokenizer->eog().size());
  full.chat_template = l.chat_template ? l.chat_template->c_str() : nullptr;
  size_t n = info->struct_size < sizeof full ? info->struct_size : sizeof full;
  if (n < sizeof(uint32_t)) return SPECINFER_ERR_INVALID_ARGUMENT;
  std::memcpy(info, &full, n);
  return SPECINFER_OK;
}

specinfer_status target_tokenize(void *self, const char *text, size_t len, int32_t add_special,
                                 int32_t parse_special, int32_t *tokens, size_t cap,
                                 size_t *n_tokens, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || n_tokens == nullptr || (text == nullptr && len > 0) ||
        (tokens == nullptr && cap > 0))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: tokenize: NULL argument");
    std::vector<int32_t> ids = self_of(self)->loaded->tokenizer->encode(
        std::string_view(text ? text : "", len), add_special != 0, parse_special != 0);
    *n_tokens = ids.size();
    if (ids.size() > cap)
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "gguf: tokenize needs room for %zu tokens, have %zu",
           ids.size(), cap);
    if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
  });
}

specinfer_status target_token_bytes(void *self, int32_t token, char *buf, size_t cap,
                                    size_t *n_bytes, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || n_bytes == nullptr || (buf == nullptr && cap > 0))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: token_bytes: NULL argument");
    const Tokenizer &tk = *self_of(self)->loaded->tokenizer;
    if (token < 0 || token >= tk.vocab_size())
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: token %d is outside the vocabulary of %d", token,
           tk.vocab_size());
    std::string bytes = tk.token_bytes(token);
    *n_bytes = bytes.size();
    if (bytes.size() > cap)
      fail(SPECINFER_ERR_BUFFER_TOO_SMALL, "gguf: token %d needs %zu bytes, have %zu", token,
           bytes.size(), cap);
    if (!bytes.empty()) std::memcpy(buf, bytes.data(), bytes.size());
  });
}

specinfer_status target_forward(void *self, const specinfer_forward_batch *b,
                                specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || b == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward: NULL argument");
    const Batch batch = batch_of(*b);
    Model &m = *self_of(self)->model;
    const bool observed =
        b->struct_size >= offsetof(specinfer_forward_batch, qk_ctx) + sizeof(b->qk_ctx) &&
        b->qk_observer != nullptr;
    // The model's per-layer queries and keys, handed on as the ABI's view of them (hp and first
    // live through the pass: the observer refers to them).
    const Hparams &hp = m.hparams();
    const int32_t first = batch.n > 0 && batch.positions ? batch.positions[0] : 0;
    if (observed) {
      m.set_qk_observer([&](int32_t layer, const float *q, const float *k, int32_t n) {
        specinfer_qk_view v{};
        v.struct_size = sizeof v;
        v.layer = layer;
        v.n_layer = hp.n_layer;
        v.n_tokens = n;
        v.first_pos = first;
        v.n_head = hp.n_head;
        v.n_head_kv = hp.n_head_kv;
        v.head_dim = hp.head_dim;
        v.window = m.weights()->layers[size_t(layer)].swa ? hp.swa_window : 0;
        v.q = q;
        v.k = k;
        b->qk_observer(b->qk_ctx, &v);
      });
    }
    struct Reset {
      Model &m;
      bool on;
      ~Reset() {
        if (on) m.set_qk_observer(nullptr);
      }
    } reset{m, observed};
    m.forward(batch.tokens, batch.positions, batch.n, batch.tree_mask, batch.n_logits, batch.logits,
              batch.hidden);
  });
}

specinfer_status target_share(void *self, void **out, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || out == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: share: NULL argument");
    *out = nullptr;
    *out = new_sequence(self_of(self)->loaded).release();
  });
}

specinfer_status target_forward_many(void *const *selves, const specinfer_forward_batch *batches,
                                     int32_t n, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (n <= 0 || selves == nullptr || batches == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many: NULL argument or n %d <= 0", n);
    std::vector<Model *> seqs(static_cast<size_t>(n));
    std::vector<Batch> bs(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      if (selves[i] == nullptr)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many: instance %d is NULL", i);
      seqs[static_cast<size_t>(i)] = self_of(selves[i])->model.get();
      bs[static_cast<size_t>(i)] = batch_of(batches[i]);
    }
    Model::forward_many(seqs.data(), bs.data(), n);
  });
}

int32_t target_kv_size(void *self) {
  return self ? self_of(self)->model->kv_size() : 0;
}

specinfer_status target_kv_truncate(void *self, int32_t n_keep, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_truncate: NULL target");
    self_of(self)->model->kv_truncate(n_keep);
  });
}

specinfer_status target_kv_keep(void *self, int32_t base, const int32_t *idx, int32_t n,
                                specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_keep: NULL target");
    self_of(self)->model->kv_keep(base, idx, n);
  });
}

specinfer_status target_output_rows(void *self, const int32_t *ids, int32_t n, float *out,
                                    specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: output_rows: NULL target");
    self_of(self)->model->output_rows(ids, n, out);
  });
}

specinfer_status target_kv_copy(void *self, void *src, int32_t n, specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || src == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_copy: NULL target");
    self_of(self)->model->kv_copy(*self_of(src)->model, n);
  });
}

const specinfer_target_vtable kVtable = {
    sizeof(specinfer_target_vtable),
    target_destroy,
    target_info,
    target_tokenize,
    target_token_bytes,
    target_forward,
    target_kv_size,
    target_kv_truncate,
    target_kv_keep,
    target_output_rows,
    target_share,
    target_forward_many,
    target_kv_copy,
};

specinfer_status target_create(const specinfer_host *host, const char *config, void **self,
                               const specinfer_target_vtable **vtable,
                               specinfer_plugin_error *err) {
  return guarded(err, "gguf", [&] {
    if (self == nullptr || vtable == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: create: NULL out-parameter");
    *self = nullptr;
    *vtable = nullptr;
    if (host == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: create: NULL host");
    Config cfg = parse_config(config);
    auto l = std::make_shared<Loaded>();
    l->file = File::open(cfg.path);
    ModelOptions opt;
    opt.pack = cfg.pack;
    opt.vocab_limit = cfg.vocab_limit;
    opt.requant = cfg.requant;
    opt.kv_type = cfg.kv_type;
    opt.attn = cfg.attn;
    opt.swa_full = cfg.swa_full;
    opt.kv_tiles = cfg.kv_tiles < 0 ? !cfg.attn.on : cfg.kv_tiles == 1;
    l->weights = std::make_shared<const Weights>(*l->file, host, cfg.n_ctx, opt);
    l->tokenizer = Tokenizer::from_gguf(*l->file);
    const Hparams &hp = l->weights->hp;
    if (l->tokenizer->vocab_size() > hp.n_vocab)
      fail(SPECINFER_ERR_FORMAT, "gguf: the tokenizer has %d tokens but the model only %d outputs",
           l->tokenizer->vocab_size(), hp.n_vocab);
    if (cfg.vocab_limit > 0) {
      // A draft must be able to propose the end of the text, whatever its id.
      for (int32_t id = 0; id < l->tokenizer->vocab_size(); ++id)
        if (l->tokenizer->is_eog(id)) l->eog.push_back(id);
    }
    l->vocab_extra = cfg.vocab_extra;
    l->name = hp.name;
    l->arch = hp.arch;
    try {  // a template of the wrong type is no template, not a model that fails to load
      l->chat_template = l->file->get_string("tokenizer.chat_template");
    } catch (const Error &) {
      l->chat_template.reset();
    }
    auto t = new_sequence(std::move(l));
    *self = t.release();
    *vtable = &kVtable;
  });
}

const specinfer_target_factory kTargetFactory = {sizeof(specinfer_target_factory), target_create};

const void *get_factory(const char *id) {
  if (id != nullptr && std::strcmp(id, SPECINFER_TARGET_FACTORY_ID) == 0) return &kTargetFactory;
  return nullptr;
}

}  // namespace
}  // namespace specinfer::gguf

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    SPECINFER_PLUGIN_ABI_VERSION,
    sizeof(specinfer_plugin_descriptor),
    "gguf",
    "0.1.0",
    "GGUF transformer targets (Llama / Qwen2 / Qwen3 family) on the host's CPU kernels",
    nullptr,
    nullptr,
    specinfer::gguf::get_factory,
};
