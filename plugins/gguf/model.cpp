// Transformer forward over the host kernels. Activations are row-major [token][feature]; the KV
// cache of a layer is [position][n_head_kv * head_dim], so the rows a forward appends are
// contiguous and the matmuls for K and V write straight into the cache.
#include "model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

namespace specinfer::gguf {

namespace {

int32_t checked_int(const File &f, const std::string &key, int64_t lo, int64_t hi,
                    std::optional<int64_t> dflt = std::nullopt) {
  if (f.array_type(key))
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: '%s' is a per-layer array; not supported", key.c_str());
  std::optional<int64_t> v = f.get_int(key);
  if (!v) {
    if (!dflt) fail(SPECINFER_ERR_FORMAT, "gguf: required key '%s' is missing", key.c_str());
    v = dflt;
  }
  if (*v < lo || *v > hi)
    fail(SPECINFER_ERR_FORMAT, "gguf: '%s' = %lld is out of range [%lld, %lld]", key.c_str(),
         (long long)*v, (long long)lo, (long long)hi);
  return int32_t(*v);
}

// gate[i] = gelu(gate[i]) * up[i], GELU in its tanh form (Gemma). Elementwise and cheap next to
// the matmuls around it, so it is not a host kernel.
void gelu_mul(float *gate, const float *up, int64_t n) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; i++) {
    float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x))) * up[i];
  }
}

void check_status(specinfer_status st, const char *what) {
  if (st != SPECINFER_OK) fail(st, "gguf: kernel '%s' failed (status %d)", what, int(st));
}

}  // namespace

Model::Model(const File &file, const specinfer_host *host, int32_t n_ctx, const ModelOptions &opt)
    : file_(file), host_(host) {
  const int32_t vocab_limit = opt.vocab_limit;
  if (host == nullptr || host->kernels == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: the host provides no kernel table");
  k_ = host->kernels;
  if (k_->struct_size < offsetof(specinfer_kernels, add) + sizeof(k_->add))
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: the host's kernel table is too old (struct_size %u)",
         unsigned(k_->struct_size));

  std::optional<std::string> arch = file.get_string("general.architecture");
  if (!arch) fail(SPECINFER_ERR_FORMAT, "gguf: general.architecture is missing");
  hp_.arch = *arch;
  if (hp_.arch == "qwen2" || hp_.arch == "qwen3") {
    hp_.rope_neox = true;
  } else if (hp_.arch == "gemma3") {
    hp_.rope_neox = true;
    hp_.gemma = true;
  } else if (hp_.arch == "llama" || hp_.arch == "mistral") {
    hp_.rope_neox = false;
  } else {
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: architecture '%s' is not supported (supported: llama, mistral, qwen2, qwen3, "
         "gemma3)",
         hp_.arch.c_str());
  }
  hp_.name = file.get_string("general.name").value_or(hp_.arch);
  const std::string a = hp_.arch + ".";
  hp_.n_embd = checked_int(file, a + "embedding_length", 1, 1 << 16);
  hp_.n_layer = checked_int(file, a + "block_count", 1, 1024);
  hp_.n_head = checked_int(file, a + "attention.head_count", 1, 1024);
  hp_.n_head_kv = checked_int(file, a + "attention.head_count_kv", 1, hp_.n_head, hp_.n_head);
  if (hp_.n_head % hp_.n_head_kv != 0)
    fail(SPECINFER_ERR_FORMAT, "gguf: head_count %d is not a multiple of head_count_kv %d",
         hp_.n_head, hp_.n_head_kv);
  hp_.head_dim = checked_int(file, a + "attention.key_length", 2, 1024, hp_.n_embd / hp_.n_head);
  int32_t v_len = checked_int(file, a + "attention.value_length", 2, 1024, hp_.head_dim);
  if (v_len != hp_.head_dim || hp_.head_dim % 2 != 0)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: key length %d / value length %d not supported",
         hp_.head_dim, v_len);
  hp_.n_ff = checked_int(file, a + "feed_forward_length", 1, 1 << 20);
  hp_.n_ctx_train = checked_int(file, a + "context_length", 1, 1 << 24, 4096);
  hp_.n_rot = checked_int(file, a + "rope.dimension_count", 2, hp_.head_dim, hp_.head_dim);
  if (hp_.n_rot % 2 != 0)
    fail(SPECINFER_ERR_FORMAT, "gguf: rope.dimension_count %d is odd", hp_.n_rot);
  hp_.norm_eps = float(file.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  hp_.rope_base = float(file.get_float(a + "rope.freq_base").value_or(10000.0));
  if (!(hp_.norm_eps > 0.0f) || !(hp_.rope_base > 0.0f) || !std::isfinite(hp_.rope_base))
    fail(SPECINFER_ERR_FORMAT, "gguf: bad rms epsilon %g or rope base %g", double(hp_.norm_eps),
         double(hp_.rope_base));
  if (std::optional<std::string> st = file.get_string(a + "rope.scaling.type");
      st && *st != "none" && *st != "linear")
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: rope scaling '%s' is not supported", st->c_str());
  if (double f = file.get_float(a + "rope.scaling.factor").value_or(1.0); f != 1.0 && f != 0.0)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: rope scaling factor %g is not supported", f);
  hp_.attn_scale = 1.0f / std::sqrt(float(hp_.head_dim));
  if (hp_.gemma) {
    hp_.embd_scale = std::sqrt(float(hp_.n_embd));
    hp_.swa_window = checked_int(file, a + "attention.sliding_window", 0, 1 << 24, 0);
    hp_.swa_pattern = 6;  // five sliding-window layers, then one global (as llama.cpp)
    hp_.rope_base_swa = float(file.get_float(a + "rope.freq_base_swa").value_or(10000.0));
    if (file.has(a + "final_logit_softcapping") || file.has(a + "attn_logit_softcapping"))
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: logit soft-capping is not supported");
  }
  if (file.find_tensor("rope_freqs.weight"))
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: rope frequency factors (rope_freqs.weight) are not supported");

  const TensorInfo *emb = file.find_tensor("token_embd.weight");
  if (!emb) fail(SPECINFER_ERR_FORMAT, "gguf: tensor 'token_embd.weight' is missing");
  if (emb->ne[1] < 1 || emb->ne[1] > (int64_t(1) << 24))
    fail(SPECINFER_ERR_FORMAT, "gguf: token_embd.weight has %lld rows", (long long)emb->ne[1]);
  const int64_t n_vocab = emb->ne[1];
  tok_embd_ = weight("token_embd.weight", n_vocab, hp_.n_embd);
  output_ =
      file.find_tensor("output.weight") ? weight("output.weight", n_vocab, hp_.n_embd) : tok_embd_;
  hp_.n_vocab = int32_t(n_vocab);
  output_norm_ = vec("output_norm.weight", hp_.n_embd, true);

  const int64_t E = hp_.n_embd, QD = int64_t(hp_.n_head) * hp_.head_dim,
                KV = int64_t(hp_.n_head_kv) * hp_.head_dim, F = hp_.n_ff;
  layers_.resize(size_t(hp_.n_layer));
  for (int32_t i = 0; i < hp_.n_layer; i++) {
    Layer &L = layers_[size_t(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    L.attn_norm = vec(p + "attn_norm.weight", E, true);
    L.ffn_norm = vec(p + "ffn_norm.weight", E, true);
    L.wq = weight(p + "attn_q.weight", QD, E);
    L.wk = weight(p + "attn_k.weight", KV, E);
    L.wv = weight(p + "attn_v.weight", KV, E);
    L.wo = weight(p + "attn_output.weight", E, QD);
    L.gate = weight(p + "ffn_gate.weight", F, E);
    L.up = weight(p + "ffn_up.weight", F, E);
    L.down = weight(p + "ffn_down.weight", E, F);
    L.bq = vec(p + "attn_q.bias", QD, false);
    L.bk = vec(p + "attn_k.bias", KV, false);
    L.bv = vec(p + "attn_v.bias", KV, false);
    L.q_norm = vec(p + "attn_q_norm.weight", hp_.head_dim, false);
    L.k_norm = vec(p + "attn_k_norm.weight", hp_.head_dim, false);
    if (hp_.gemma) {
      L.post_attn_norm = vec(p + "post_attention_norm.weight", E, true);
      L.post_ffn_norm = vec(p + "post_ffw_norm.weight", E, true);
      L.swa = hp_.swa_window > 0 && (i + 1) % hp_.swa_pattern != 0;
    }
    L.rope_base = L.swa ? hp_.rope_base_swa : hp_.rope_base;
    if (file.find_tensor(p + "attn_output.bias"))
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: '%sattn_output.bias' is not supported", p.c_str());
  }

  if (vocab_limit < 0) fail(SPECINFER_ERR_CONFIG, "gguf: vocab_limit %d is negative", vocab_limit);
  n_out_ = vocab_limit > 0 && vocab_limit < hp_.n_vocab ? vocab_limit : hp_.n_vocab;
  output_file_ = output_;
  output_.rows = n_out_;  // rows are contiguous: the first n_out_ rows are a matrix of their own
  if (n_out_ < hp_.n_vocab) is_extra_.assign(size_t(hp_.n_vocab), 0);
  if (opt.requant >= 0) {
    if (opt.requant != SPECINFER_WTYPE_Q4_0 && opt.requant != SPECINFER_WTYPE_Q8_0)
      fail(SPECINFER_ERR_CONFIG, "gguf: requant to type %d is not supported (q4_0, q8_0)",
           opt.requant);
    if (k_->struct_size < offsetof(specinfer_kernels, quantize_row) + sizeof(k_->quantize_row) ||
        !k_->quantize_row)
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: requant needs a host kernel table with quantize_row");
    for (Layer &L : layers_)
      for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down})
        requant(*w, opt.requant);
    requant(output_, opt.requant);
  }
  const bool can_pack =
      k_->struct_size >= offsetof(specinfer_kernels, free_packed) + sizeof(k_->free_packed) &&
      k_->pack_weight && k_->matmul_packed && k_->free_packed;
  if (opt.pack && can_pack) {
    for (Layer &L : layers_)
      for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) pack(*w);
    pack(output_);
  }

  if (n_ctx <= 0) n_ctx = std::min<int32_t>(hp_.n_ctx_train, 4096);
  if (n_ctx > (1 << 24)) fail(SPECINFER_ERR_CONFIG, "gguf: n_ctx %d is too large", n_ctx);
  n_ctx_ = n_ctx;
}

Weight Model::weight(const std::string &name, int64_t rows, int64_t cols) const {
  const TensorInfo *t = file_.find_tensor(name);
  if (!t) fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' is missing", name.c_str());
  if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
         name.c_str(), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
         (long long)t->ne[3], (long long)cols, (long long)rows);
  size_t rb = k_->row_size(t->type, cols);
  if (rb == 0)
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: tensor '%s' has type %s (%d), which the kernels do not support", name.c_str(),
         type_name(t->type), int(t->type));
  if (uint64_t(rb) * uint64_t(rows) != t->n_bytes)
    fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s': %lld rows of %zu bytes != %llu bytes of data",
         name.c_str(), (long long)rows, rb, (unsigned long long)t->n_bytes);
  Weight w;
  w.type = t->type;
  w.data = t->data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = rb;
  return w;
}

std::vector<float> Model::vec(const std::string &name, int64_t n, bool required) const {
  const TensorInfo *t = file_.find_tensor(name);
  if (!t) {
    if (required) fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' is missing", name.c_str());
    return {};
  }
  if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s' has %lld x %lld values, expected a vector of %lld", name.c_str(),
         (long long)t->ne[0], (long long)(t->ne[1] * t->ne[2] * t->ne[3]), (long long)n);
  size_t rb = k_->row_size(t->type, n);
  if (rb == 0 || rb != t->n_bytes)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: tensor '%s' has unsupported type %s", name.c_str(),
         type_name(t->type));
  std::vector<float> out(static_cast<size_t>(n));
  check_status(k_->dequantize_row(t->type, t->data, out.data(), n), "dequantize_row");
  return out;
}

void Model::pack(Weight &w) {
  specinfer_packed_weight *p = nullptr;
  check_status(k_->pack_weight(w.type, w.data, w.rows, w.cols, &p), "pack_weight");
  packed_.emplace_back(p, PackedFree{k_});
  w.packed = p;
}

void Model::requant(Weight &w, int32_t wtype) {
  const size_t rb = k_->row_size(wtype, w.cols);
  if (rb == 0 || rb >= w.row_bytes) return;  // columns not a multiple of 32, or not wider
  const size_t bytes = rb * size_t(w.rows);
  void *mem = host_->alloc(bytes, 64);
  if (mem == nullptr)
    fail(SPECINFER_ERR_OUT_OF_MEMORY, "gguf: requant: cannot allocate %zu bytes", bytes);
  owned_.emplace_back(static_cast<uint8_t *>(mem), host_->free);
  struct Job {
    const specinfer_kernels *k;
    const Weight *w;
    int32_t wtype;
    size_t rb;
    uint8_t *dst;
    std::atomic<int32_t> status{SPECINFER_OK};
  } job{k_, &w, wtype, rb, static_cast<uint8_t *>(mem)};
  // Rows in parallel; a failing row (inf / NaN weights) records its status, the others go on.
  host_->parallel_for(
      host_, w.rows, 16,
      [](void *ctx, int64_t begin, int64_t end) {
        Job &j = *static_cast<Job *>(ctx);
        std::vector<float> row;
        try {
          row.resize(size_t(j.w->cols));
        } catch (...) {
          j.status.store(SPECINFER_ERR_OUT_OF_MEMORY);
          return;
        }
        for (int64_t r = begin; r < end; ++r) {
          const auto *src = static_cast<const uint8_t *>(j.w->data) + size_t(r) * j.w->row_bytes;
          specinfer_status st = j.k->dequantize_row(j.w->type, src, row.data(), j.w->cols);
          if (st == SPECINFER_OK)
            st = j.k->quantize_row(j.wtype, row.data(), j.dst + size_t(r) * j.rb, j.w->cols);
          if (st != SPECINFER_OK) {
            j.status.store(st);
            return;
          }
        }
      },
      &job);
  if (const auto st = specinfer_status(job.status.load()); st != SPECINFER_OK)
    fail(st,
         "gguf: requant of a %lld x %lld %s matrix to %s failed (status %d: inf or NaN weights?)",
         (long long)w.rows, (long long)w.cols, type_name(w.type), type_name(wtype), int(st));
  w.type = wtype;
  w.data = mem;
  w.row_bytes = rb;
}

void Model::add_output_ids(const int32_t *ids, int32_t n) {
  if (n > 0 && ids == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: add_output_ids: NULL ids");
  if (n_out_ == hp_.n_vocab) return;
  const int64_t E = hp_.n_embd;
  for (int32_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= hp_.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: add_output_ids: id %d is outside the vocabulary of %d", id, hp_.n_vocab);
    if (id < n_out_ || is_extra_[size_t(id)]) continue;
    // The file's row, in the output matrix's type (re-quantized like the rest if it was).
    const auto *src =
        static_cast<const uint8_t *>(output_file_.data) + size_t(id) * output_file_.row_bytes;
    const size_t at = extra_rows_.size();
    extra_rows_.resize(at + output_.row_bytes);
    if (output_.type == output_file_.type) {
      std::memcpy(extra_rows_.data() + at, src, output_.row_bytes);
    } else {
      extra_row_f_.resize(size_t(E));
      check_status(k_->dequantize_row(output_file_.type, src, extra_row_f_.data(), E),
                   "dequantize_row");
      check_status(k_->quantize_row(output_.type, extra_row_f_.data(), extra_rows_.data() + at, E),
                   "quantize_row");
    }
    extra_ids_.push_back(id);
    is_extra_[size_t(id)] = 1;
    extra_packed_.reset();
  }
}

void Model::matmul(const Weight &w, const float *x, int64_t n_tok, float *y) const {
  if (w.packed)
    check_status(k_->matmul_packed(w.packed, x, n_tok, y), "matmul_packed");
  else
    check_status(k_->matmul(w.type, w.data, w.rows, w.cols, x, n_tok, y), "matmul");
}

void Model::ensure_capacity(int32_t n_pos) {
  if (n_pos <= capacity_) return;
  int32_t cap = std::max<int32_t>(capacity_ * 2, 256);
  cap = std::min(std::max(cap, n_pos), n_ctx_);
  const size_t row = size_t(hp_.n_head_kv) * size_t(hp_.head_dim);
  for (Layer &L : layers_) {
    L.k_cache.resize(size_t(cap) * row);
    L.v_cache.resize(size_t(cap) * row);
  }
  slot_pos_.resize(size_t(cap));
  capacity_ = cap;
}

void Model::ensure_scratch(int32_t n, int32_t n_kv) {
  const size_t E = size_t(hp_.n_embd), QD = size_t(hp_.n_head) * size_t(hp_.head_dim),
               F = size_t(hp_.n_ff), N = size_t(n);
  auto grow = [](auto &v, size_t size) {
    if (v.size() < size) v.resize(size);
  };
  grow(x_, N * E);
  grow(h_, N * E);
  grow(q_, N * QD);
  grow(att_, N * QD);
  grow(gate_, N * F);
  grow(up_, N * F);
  grow(mask_, N * size_t(n_kv));
  if (hp_.swa_window > 0) grow(swa_mask_, N * size_t(n_kv));
}

void Model::forward(const int32_t *tokens, const int32_t *positions, int32_t n,
                    const uint8_t *tree_mask, int32_t n_logits, float *logits, float *hidden) {
  if (n <= 0 || tokens == nullptr || positions == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward needs n_tokens > 0, tokens and positions");
  if (n_logits < 0 || n_logits > n || (n_logits > 0 && logits == nullptr))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: n_logits %d invalid for %d tokens (or logits NULL)",
         n_logits, n);
  if (n > n_ctx_ - n_cached_)
    fail(SPECINFER_ERR_CONTEXT_FULL, "gguf: %d cached + %d new tokens exceed the context of %d",
         n_cached_, n, n_ctx_);
  for (int32_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= hp_.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: token %d at batch index %d is outside the vocabulary of %d", tokens[i], i,
           hp_.n_vocab);
    if (positions[i] < 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: position %d at batch index %d is negative",
           positions[i], i);
    if (tree_mask && tree_mask[size_t(i) * size_t(n) + size_t(i)] == 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: tree mask hides token %d from itself", i);
  }

  // Tokens in the context are likely to come again: with a vocabulary limit their logits are
  // computed from now on (before anything changes, so that a failure leaves the cache as it was).
  add_output_ids(tokens, n);

  const int32_t n_kv = n_cached_ + n;
  ensure_capacity(n_kv);
  ensure_scratch(n, n_kv);

  const int64_t E = hp_.n_embd, hd = hp_.head_dim, H = hp_.n_head, Hkv = hp_.n_head_kv;
  const int64_t QD = H * hd, KV = Hkv * hd, F = hp_.n_ff;
  const float eps = hp_.norm_eps;
  float *x = x_.data(), *h = h_.data(), *q = q_.data(), *att = att_.data();
  float *g = gate_.data(), *u = up_.data();

  for (int32_t i = 0; i < n; i++) {
    const auto *row =
        static_cast<const uint8_t *>(tok_embd_.data) + size_t(tokens[i]) * tok_embd_.row_bytes;
    check_status(k_->dequantize_row(tok_embd_.type, row, x + i * E, E), "dequantize_row");
    if (hp_.embd_scale != 1.0f)
      for (int64_t j = 0; j < E; j++) x[i * E + j] *= hp_.embd_scale;
    slot_pos_[size_t(n_cached_ + i)] = positions[i];
  }

  const uint8_t *mask = nullptr;
  if (tree_mask) {
    for (int32_t i = 0; i < n; i++) {
      uint8_t *m = mask_.data() + size_t(i) * size_t(n_kv);
      std::memset(m, 1, size_t(n_cached_));
      for (int32_t j = 0; j < n; j++)
        m[n_cached_ + j] = tree_mask[size_t(i) * size_t(n) + size_t(j)] ? 1 : 0;
    }
    mask = mask_.data();
  }

  // Sliding-window layers: a query at position p sees cached positions q with p - q < window.
  // Only built when some pair in this forward is that far apart.
  const uint8_t *swa_mask = mask;
  if (hp_.swa_window > 0) {
    int32_t min_kv = slot_pos_[0], max_q = positions[0];
    for (int32_t j = 0; j < n_kv; j++) min_kv = std::min(min_kv, slot_pos_[size_t(j)]);
    for (int32_t i = 0; i < n; i++) max_q = std::max(max_q, positions[i]);
    if (int64_t(max_q) - int64_t(min_kv) >= hp_.swa_window) {
      for (int32_t i = 0; i < n; i++) {
        uint8_t *m = swa_mask_.data() + size_t(i) * size_t(n_kv);
        for (int32_t j = 0; j < n_kv; j++) {
          bool base = mask ? mask[size_t(i) * size_t(n_kv) + size_t(j)] != 0 : j <= n_cached_ + i;
          m[j] = base && int64_t(positions[i]) - int64_t(slot_pos_[size_t(j)]) < hp_.swa_window;
        }
      }
      swa_mask = swa_mask_.data();
    }
  }

  specinfer_attention_args args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.n_q = n;
  args.n_head = int32_t(H);
  args.n_head_kv = int32_t(Hkv);
  args.head_dim = int32_t(hd);
  args.n_kv = n_kv;
  args.q = q;
  args.mask = mask;
  args.scale = hp_.attn_scale;
  args.out = att;

  for (size_t li = 0; li < layers_.size(); li++) {
    Layer &L = layers_[li];
    float *kc = L.k_cache.data() + size_t(n_cached_) * size_t(KV);
    float *vc = L.v_cache.data() + size_t(n_cached_) * size_t(KV);
    for (int32_t i = 0; i < n; i++) k_->rmsnorm(x + i * E, L.attn_norm.data(), E, eps, h + i * E);
    matmul(L.wq, h, n, q);
    matmul(L.wk, h, n, kc);
    matmul(L.wv, h, n, vc);
    for (int32_t i = 0; i < n; i++) {
      if (!L.bq.empty()) k_->add(q + i * QD, L.bq.data(), QD);
      if (!L.bk.empty()) k_->add(kc + i * KV, L.bk.data(), KV);
      if (!L.bv.empty()) k_->add(vc + i * KV, L.bv.data(), KV);
      if (!L.q_norm.empty())
        for (int64_t j = 0; j < H; j++)
          k_->rmsnorm(q + i * QD + j * hd, L.q_norm.data(), hd, eps, q + i * QD + j * hd);
      if (!L.k_norm.empty())
        for (int64_t j = 0; j < Hkv; j++)
          k_->rmsnorm(kc + i * KV + j * hd, L.k_norm.data(), hd, eps, kc + i * KV + j * hd);
      k_->rope(q + i * QD, H, hd, hp_.n_rot, positions[i], L.rope_base, hp_.rope_neox ? 1 : 0);
      k_->rope(kc + i * KV, Hkv, hd, hp_.n_rot, positions[i], L.rope_base, hp_.rope_neox ? 1 : 0);
    }
    if (qk_observer_) qk_observer_(int32_t(li), q, kc, n);
    args.k = L.k_cache.data();
    args.v = L.v_cache.data();
    args.mask = L.swa ? swa_mask : mask;
    check_status(k_->attention(&args), "attention");
    matmul(L.wo, att, n, h);
    if (!L.post_attn_norm.empty())
      for (int32_t i = 0; i < n; i++)
        k_->rmsnorm(h + i * E, L.post_attn_norm.data(), E, eps, h + i * E);
    k_->add(x, h, n * E);

    for (int32_t i = 0; i < n; i++) k_->rmsnorm(x + i * E, L.ffn_norm.data(), E, eps, h + i * E);
    matmul(L.gate, h, n, g);
    matmul(L.up, h, n, u);
    if (hp_.gemma)
      gelu_mul(g, u, n * F);
    else
      k_->silu_mul(g, u, n * F);
    matmul(L.down, g, n, h);
    if (!L.post_ffn_norm.empty())
      for (int32_t i = 0; i < n; i++)
        k_->rmsnorm(h + i * E, L.post_ffn_norm.data(), E, eps, h + i * E);
    k_->add(x, h, n * E);
  }

  const int32_t first = n - n_logits;
  for (int32_t i = first; i < n; i++)
    k_->rmsnorm(x + i * E, output_norm_.data(), E, eps, h + i * E);
  if (n_logits > 0) {
    if (hidden) std::memcpy(hidden, h + first * E, size_t(n_logits) * size_t(E) * sizeof(float));
    if (n_out_ == hp_.n_vocab) {
      matmul(output_, h + first * E, n_logits, logits);
    } else {
      out_rows_.resize(size_t(n_logits) * size_t(n_out_));
      matmul(output_, h + first * E, n_logits, out_rows_.data());
      const auto n_extra = static_cast<int64_t>(extra_ids_.size());
      // Rows of extra_logits_: with the packed output, the extra rows padded to whole groups of 16.
      const int64_t stride = output_.packed ? (n_extra + 15) / 16 * 16 : n_extra;
      extra_logits_.resize(size_t(n_logits) * size_t(stride));
      if (n_extra > 0 && output_.packed) {
        if (!extra_packed_) {
          const size_t rb = output_.row_bytes;
          extra_padded_.resize(size_t(stride) * rb);
          std::memcpy(extra_padded_.data(), extra_rows_.data(), size_t(n_extra) * rb);
          for (int64_t r = n_extra; r < stride; r++)
            std::memcpy(extra_padded_.data() + size_t(r) * rb,
                        extra_rows_.data() + size_t(n_extra - 1) * rb, rb);
          specinfer_packed_weight *p = nullptr;
          check_status(k_->pack_weight(output_.type, extra_padded_.data(), stride, E, &p),
                       "pack_weight");
          extra_packed_ = std::unique_ptr<specinfer_packed_weight, PackedFree>(p, PackedFree{k_});
        }
        check_status(
            k_->matmul_packed(extra_packed_.get(), h + first * E, n_logits, extra_logits_.data()),
            "matmul_packed");
      } else if (n_extra > 0) {
        check_status(k_->matmul(output_.type, extra_rows_.data(), n_extra, E, h + first * E,
                                n_logits, extra_logits_.data()),
                     "matmul");
      }
      for (int32_t i = 0; i < n_logits; i++) {
        float *row = logits + size_t(i) * size_t(hp_.n_vocab);
        std::memcpy(row, out_rows_.data() + size_t(i) * size_t(n_out_),
                    size_t(n_out_) * sizeof(float));
        std::fill(row + n_out_, row + hp_.n_vocab, -std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < n_extra; j++)
          row[extra_ids_[size_t(j)]] = extra_logits_[size_t(i) * size_t(stride) + size_t(j)];
      }
    }
  }
  n_cached_ = n_kv;
}

void Model::kv_truncate(int32_t n_keep) {
  if (n_keep < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_truncate(%d): negative", n_keep);
  if (n_keep < n_cached_) n_cached_ = n_keep;
}

void Model::output_rows(const int32_t *ids, int32_t n, float *out) const {
  if (n < 0 || (n > 0 && (ids == nullptr || out == nullptr)))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: output_rows: NULL ids or out, or n %d < 0", n);
  const int64_t E = hp_.n_embd;
  for (int32_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= hp_.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: output_rows: token %d outside the vocabulary %d",
           id, hp_.n_vocab);
    // Below a vocabulary limit the rows logits use (re-quantized, if so); above it the file's.
    const Weight &w = id < n_out_ ? output_ : output_file_;
    const auto *row = static_cast<const uint8_t *>(w.data) + size_t(id) * w.row_bytes;
    check_status(k_->dequantize_row(w.type, row, out + size_t(i) * size_t(E), E), "output row");
  }
}

void Model::kv_keep(int32_t base, const int32_t *idx, int32_t n) {
  if (base < 0 || base > n_cached_ || n < 0 || (n > 0 && idx == nullptr))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_keep(base %d, n %d) invalid with %d cached",
         base, n, n_cached_);
  for (int32_t j = 0; j < n; j++) {
    if (idx[j] < 0 || idx[j] >= n_cached_ - base || (j > 0 && idx[j] <= idx[j - 1]))
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: kv_keep: index %d (= %d) is out of range or not increasing (%d positions after "
           "base %d)",
           j, idx[j], n_cached_ - base, base);
  }
  const size_t row = size_t(hp_.n_head_kv) * size_t(hp_.head_dim);
  for (Layer &L : layers_) {
    for (int32_t j = 0; j < n; j++) {
      if (idx[j] == j) continue;
      size_t dst = size_t(base + j) * row, src = size_t(base + idx[j]) * row;
      std::memmove(L.k_cache.data() + dst, L.k_cache.data() + src, row * sizeof(float));
      std::memmove(L.v_cache.data() + dst, L.v_cache.data() + src, row * sizeof(float));
    }
  }
  for (int32_t j = 0; j < n; j++) slot_pos_[size_t(base + j)] = slot_pos_[size_t(base + idx[j])];
  n_cached_ = base + n;
}

}  // namespace specinfer::gguf
