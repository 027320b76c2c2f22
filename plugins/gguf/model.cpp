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

// Positions rounded down / up to whole key tiles.
int32_t tile_floor(int32_t n) {
  return n / SPECINFER_KEY_TILE * SPECINFER_KEY_TILE;
}
int64_t tile_ceil(int64_t n) {
  return (n + SPECINFER_KEY_TILE - 1) / SPECINFER_KEY_TILE * SPECINFER_KEY_TILE;
}

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

// v's storage, grown to at least `size` floats (scratch kept from pass to pass).
float *grow(std::vector<float> &v, int64_t size) {
  if (v.size() < size_t(size)) v.resize(size_t(size));
  return v.data();
}

}  // namespace

Weights::Weights(const File &f, const specinfer_host *h, int32_t ctx, const ModelOptions &opt)
    : file(f), host(h) {
  if (h == nullptr || h->kernels == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: the host provides no kernel table");
  k = h->kernels;
  if (k->struct_size < offsetof(specinfer_kernels, add) + sizeof(k->add))
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: the host's kernel table is too old (struct_size %u)",
         unsigned(k->struct_size));
  read_hparams();
  const std::vector<float> freq_factors = read_rope_freqs();
  const TensorInfo *emb = file.find_tensor("token_embd.weight");
  if (!emb) fail(SPECINFER_ERR_FORMAT, "gguf: tensor 'token_embd.weight' is missing");
  if (emb->ne[1] < 1 || emb->ne[1] > (int64_t(1) << 24))
    fail(SPECINFER_ERR_FORMAT, "gguf: token_embd.weight has %lld rows", (long long)emb->ne[1]);
  const int64_t n_vocab = emb->ne[1];
  tok_embd = weight("token_embd.weight", n_vocab, hp.n_embd);
  output =
      file.find_tensor("output.weight") ? weight("output.weight", n_vocab, hp.n_embd) : tok_embd;
  hp.n_vocab = int32_t(n_vocab);
  output_norm = vec("output_norm.weight", hp.n_embd, true);
  read_layers(freq_factors);
  prepare_matrices(opt);
  choose_kv_cache(opt);
  if (ctx <= 0) ctx = hp.n_ctx_train;
  if (ctx > (1 << 24)) fail(SPECINFER_ERR_CONFIG, "gguf: n_ctx %d is too large", ctx);
  n_ctx = ctx;
}

// The architecture and hyperparameters from the file's metadata, checked.
void Weights::read_hparams() {
  std::optional<std::string> arch = file.get_string("general.architecture");
  if (!arch) fail(SPECINFER_ERR_FORMAT, "gguf: general.architecture is missing");
  hp.arch = *arch;
  if (hp.arch == "qwen2" || hp.arch == "qwen3") {
    hp.rope_neox = true;
  } else if (hp.arch == "gemma3") {
    hp.rope_neox = true;
    hp.gemma = true;
  } else if (hp.arch == "llama" || hp.arch == "mistral") {
    hp.rope_neox = false;
  } else {
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: architecture '%s' is not supported (supported: llama, mistral, qwen2, qwen3, "
         "gemma3)",
         hp.arch.c_str());
  }
  hp.name = file.get_string("general.name").value_or(hp.arch);
  const std::string a = hp.arch + ".";
  hp.n_embd = checked_int(file, a + "embedding_length", 1, 1 << 16);
  hp.n_layer = checked_int(file, a + "block_count", 1, 1024);
  hp.n_head = checked_int(file, a + "attention.head_count", 1, 1024);
  hp.n_head_kv = checked_int(file, a + "attention.head_count_kv", 1, hp.n_head, hp.n_head);
  if (hp.n_head % hp.n_head_kv != 0)
    fail(SPECINFER_ERR_FORMAT, "gguf: head_count %d is not a multiple of head_count_kv %d",
         hp.n_head, hp.n_head_kv);
  hp.head_dim = checked_int(file, a + "attention.key_length", 2, 1024, hp.n_embd / hp.n_head);
  int32_t v_len = checked_int(file, a + "attention.value_length", 2, 1024, hp.head_dim);
  if (v_len != hp.head_dim || hp.head_dim % 2 != 0)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: key length %d / value length %d not supported",
         hp.head_dim, v_len);
  hp.n_ff = checked_int(file, a + "feed_forward_length", 1, 1 << 20);
  hp.n_ctx_train = checked_int(file, a + "context_length", 1, 1 << 24, 4096);
  hp.n_rot = checked_int(file, a + "rope.dimension_count", 2, hp.head_dim, hp.head_dim);
  if (hp.n_rot % 2 != 0)
    fail(SPECINFER_ERR_FORMAT, "gguf: rope.dimension_count %d is odd", hp.n_rot);
  hp.norm_eps = float(file.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  hp.rope_base = float(file.get_float(a + "rope.freq_base").value_or(10000.0));
  if (!(hp.norm_eps > 0.0f) || !(hp.rope_base > 0.0f) || !std::isfinite(hp.rope_base))
    fail(SPECINFER_ERR_FORMAT, "gguf: bad rms epsilon %g or rope base %g", double(hp.norm_eps),
         double(hp.rope_base));
  hp.rope_scaling = file.get_string(a + "rope.scaling.type").value_or("none");
  hp.rope_factor = file.get_float(a + "rope.scaling.factor").value_or(0.0);
  if (hp.rope_factor == 0.0) {
    // The older key of linear scaling: a factor with no type.
    hp.rope_factor = file.get_float(a + "rope.scale_linear").value_or(1.0);
    if (hp.rope_factor != 1.0 && hp.rope_scaling == "none") hp.rope_scaling = "linear";
  }
  if (hp.rope_scaling != "none" && hp.rope_scaling != "linear" && hp.rope_scaling != "yarn")
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: rope scaling '%s' is not supported (supported: none, linear, yarn)",
         hp.rope_scaling.c_str());
  if (!(hp.rope_factor >= 1.0 && hp.rope_factor <= 1024.0))
    fail(SPECINFER_ERR_FORMAT, "gguf: rope scaling factor %g is not in [1, 1024]", hp.rope_factor);
  if (hp.rope_factor == 1.0) hp.rope_scaling = "none";
  hp.rope_orig_ctx =
      checked_int(file, a + "rope.scaling.original_context_length", 1, 1 << 24, hp.n_ctx_train);
  hp.yarn_ext_factor = file.get_float(a + "rope.scaling.yarn_ext_factor").value_or(1.0);
  hp.yarn_beta_fast = file.get_float(a + "rope.scaling.yarn_beta_fast").value_or(32.0);
  hp.yarn_beta_slow = file.get_float(a + "rope.scaling.yarn_beta_slow").value_or(1.0);
  hp.rope_attn_factor = file.get_float(a + "rope.scaling.yarn_attn_factor")
                            .value_or(file.get_float(a + "rope.scaling.attn_factor").value_or(1.0));
  for (double v : {hp.yarn_ext_factor, hp.yarn_beta_fast, hp.yarn_beta_slow, hp.rope_attn_factor})
    if (!std::isfinite(v) || v < 0.0 || v > 1e6)
      fail(SPECINFER_ERR_FORMAT, "gguf: YaRN parameter %g is out of range", v);
  if (!(hp.yarn_beta_fast > 0.0 && hp.yarn_beta_slow > 0.0))
    fail(SPECINFER_ERR_FORMAT, "gguf: YaRN betas must be positive (fast %g, slow %g)",
         hp.yarn_beta_fast, hp.yarn_beta_slow);
  hp.attn_scale = 1.0f / std::sqrt(float(hp.head_dim));
  if (hp.gemma) {
    hp.embd_scale = std::sqrt(float(hp.n_embd));
    hp.swa_window = checked_int(file, a + "attention.sliding_window", 0, 1 << 24, 0);
    hp.swa_pattern = 6;  // five sliding-window layers, then one global (as llama.cpp)
    hp.rope_base_swa = float(file.get_float(a + "rope.freq_base_swa").value_or(10000.0));
    if (file.has(a + "final_logit_softcapping") || file.has(a + "attn_logit_softcapping"))
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: logit soft-capping is not supported");
  }
}

// The file's RoPE frequency factors (empty: none), checked; and the host's scaled rope, which
// scaling of any kind needs.
std::vector<float> Weights::read_rope_freqs() {
  std::vector<float> freq_factors;
  if (file.find_tensor("rope_freqs.weight"))
    freq_factors = vec("rope_freqs.weight", hp.n_rot / 2, true);
  for (float f : freq_factors)
    if (!(f > 0.0f) || !std::isfinite(f))
      fail(SPECINFER_ERR_FORMAT, "gguf: rope_freqs.weight holds %g (factors must be positive)",
           double(f));
  const bool scaled = hp.rope_scaling != "none" || !freq_factors.empty();
  if (scaled && (k->struct_size < offsetof(specinfer_kernels, rope_freqs) + sizeof(k->rope_freqs) ||
                 !k->rope_freqs))
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: the host's kernels have no scaled rope (rope_freqs)");
  return freq_factors;
}

// Every layer's weights, checked against the hyperparameters.
void Weights::read_layers(const std::vector<float> &freq_factors) {
  // RoPE scaling of any kind, or frequency factors: each layer gets its own frequencies.
  const bool scaled = hp.rope_scaling != "none" || !freq_factors.empty();
  const int64_t E = hp.n_embd, QD = int64_t(hp.n_head) * hp.head_dim,
                KV = int64_t(hp.n_head_kv) * hp.head_dim, F = hp.n_ff;
  layers.resize(size_t(hp.n_layer));
  for (int32_t i = 0; i < hp.n_layer; i++) {
    Layer &L = layers[size_t(i)];
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
    L.q_norm = vec(p + "attn_q_norm.weight", hp.head_dim, false);
    L.k_norm = vec(p + "attn_k_norm.weight", hp.head_dim, false);
    if (hp.gemma) {
      L.post_attn_norm = vec(p + "post_attention_norm.weight", E, true);
      L.post_ffn_norm = vec(p + "post_ffw_norm.weight", E, true);
      L.swa = hp.swa_window > 0 && (i + 1) % hp.swa_pattern != 0;
    }
    L.rope_base = L.swa ? hp.rope_base_swa : hp.rope_base;
    // Sliding-window layers (Gemma 3) keep their own base and no scaling, as llama.cpp does.
    if (scaled && !L.swa)
      L.rope =
          rope_freqs_for(hp, L.rope_base, freq_factors.empty() ? nullptr : freq_factors.data());
    if (file.find_tensor(p + "attn_output.bias"))
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: '%sattn_output.bias' is not supported", p.c_str());
  }
}

// The output rows computed (vocab_limit), then every matrix re-quantized (requant) and packed
// (pack) as the options ask.
void Weights::prepare_matrices(const ModelOptions &opt) {
  const int32_t vocab_limit = opt.vocab_limit;
  if (vocab_limit < 0) fail(SPECINFER_ERR_CONFIG, "gguf: vocab_limit %d is negative", vocab_limit);
  n_out = vocab_limit > 0 && vocab_limit < hp.n_vocab ? vocab_limit : hp.n_vocab;
  output_file = output;
  output.rows = n_out;  // rows are contiguous: the first n_out rows are a matrix of their own
  if (opt.requant >= 0) {
    if (opt.requant != SPECINFER_WTYPE_Q4_0 && opt.requant != SPECINFER_WTYPE_Q3_0 &&
        opt.requant != SPECINFER_WTYPE_Q8_0)
      fail(SPECINFER_ERR_CONFIG, "gguf: requant to type %d is not supported (q4_0, q3_0, q8_0)",
           opt.requant);
    if (k->struct_size < offsetof(specinfer_kernels, quantize_row) + sizeof(k->quantize_row) ||
        !k->quantize_row)
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: requant needs a host kernel table with quantize_row");
    for (Layer &L : layers)
      for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down})
        requant(*w, opt.requant);
    requant(output, opt.requant);
  }
  const bool can_pack =
      k->struct_size >= offsetof(specinfer_kernels, free_packed) + sizeof(k->free_packed) &&
      k->pack_weight && k->matmul_packed && k->free_packed;
  if (opt.pack && can_pack) {
    for (Layer &L : layers)
      for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) pack(*w);
    pack(output);
  }
}

// The KV cache's type and layout, and sketched attention, from the options and what the host's
// kernels read.
void Weights::choose_kv_cache(const ModelOptions &opt) {
  const bool has_kv_store =
      k->struct_size >= offsetof(specinfer_kernels, kv_store) + sizeof(k->kv_store) && k->kv_store;
  kv_type = opt.kv_type >= 0 ? opt.kv_type
            : has_kv_store   ? SPECINFER_WTYPE_F16
                             : SPECINFER_WTYPE_F32;
  if (kv_type != SPECINFER_WTYPE_F32 && kv_type != SPECINFER_WTYPE_F16 &&
      kv_type != SPECINFER_WTYPE_Q8_0 && kv_type != SPECINFER_WTYPE_Q4_0)
    fail(SPECINFER_ERR_CONFIG, "gguf: KV cache type %d is not one of f32, f16, q8_0, q4_0",
         kv_type);
  if (kv_type != SPECINFER_WTYPE_F32 && !has_kv_store)
    fail(SPECINFER_ERR_CONFIG, "gguf: the host's kernels store no KV cache other than f32");
  // What the host's attention reads beyond its first arguments (none in an older table).
  const uint32_t attn_features = k->struct_size >= offsetof(specinfer_kernels, attention_features) +
                                                       sizeof(k->attention_features)
                                     ? k->attention_features
                                     : 0;
  kv_head_major = (attn_features & SPECINFER_ATTN_STRIDES) != 0;
  swa_release = hp.swa_window > 0 && !opt.swa_full &&
                host->struct_size >= offsetof(specinfer_host, features) + sizeof(host->features) &&
                (host->features & SPECINFER_HOST_SHORT_TRUNCATE) != 0;
  kv_tiles = opt.kv_tiles && kv_head_major && kv_type == SPECINFER_WTYPE_Q8_0 &&
             hp.head_dim % 32 == 0 && (attn_features & SPECINFER_ATTN_KEY_TILES) != 0;
  kv_head_bytes = k->row_size(kv_type, hp.head_dim);
  if (kv_head_bytes == 0)
    fail(SPECINFER_ERR_CONFIG, "gguf: head_dim %d is not whole blocks of the KV cache type %d",
         hp.head_dim, kv_type);
  attn = opt.attn;
  if (attn.on) {
    const bool has_key_sketch =
        k->struct_size >= offsetof(specinfer_kernels, key_sketch) + sizeof(k->key_sketch) &&
        k->key_sketch;
    if (!has_key_sketch)
      fail(SPECINFER_ERR_CONFIG,
           "gguf: the host's kernels have no sketched attention (key_sketch)");
    if (attn.bits < 32 || attn.bits > 1024 || attn.bits % 32 != 0 || attn.keys < 1 ||
        attn.window < 0 || attn.sink < 0)
      fail(SPECINFER_ERR_CONFIG,
           "gguf: sketched attention needs attn_bits a multiple of 32 in 32..1024, attn_keys >= 1, "
           "attn_window >= 0 and attn_sink >= 0");
    if (attn.rescore < 0)
      fail(SPECINFER_ERR_CONFIG, "gguf: attn_rescore needs 0 or more candidates");
    // A host whose attention does not rescore picks the keys by the estimate alone.
    if ((attn_features & SPECINFER_ATTN_RESCORE) == 0) attn.rescore = 0;
    sketch_pos_bytes = size_t(hp.n_head_kv) * (4 + size_t(attn.bits) / 8);
  }
}

RopeFreqs rope_freqs_for(const Hparams &hp, double base, const float *freq_factors) {
  RopeFreqs r;
  const int32_t n = hp.n_rot, half = n / 2;
  r.inv_freq.resize(size_t(half));
  const bool yarn = hp.rope_scaling == "yarn" && hp.yarn_ext_factor != 0.0;
  const double scale = hp.rope_scaling == "none" ? 1.0 : 1.0 / hp.rope_factor;
  // YaRN's ramp runs between the pairs that turn beta_fast and beta_slow times over the original
  // context: pair i turns orig_ctx * base^(-2i/n) / (2 pi) times.
  auto corr_dim = [&](double turns) {
    return n * std::log(hp.rope_orig_ctx / (turns * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr_dim(hp.yarn_beta_fast)));
  const double high = std::min(double(n - 1), std::ceil(corr_dim(hp.yarn_beta_slow)));
  for (int32_t i = 0; i < half; i++) {
    double extrap = std::pow(base, -2.0 * i / double(n));
    if (freq_factors) extrap /= double(freq_factors[i]);
    const double interp = extrap * scale;
    double f = interp;
    if (yarn) {
      const double y = (i - low) / std::max(0.001, high - low);
      const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * hp.yarn_ext_factor;
      f = interp * (1.0 - mix) + extrap * mix;
    }
    r.inv_freq[size_t(i)] = f;
  }
  double mscale = hp.rope_scaling == "none" ? 1.0 : hp.rope_attn_factor;
  if (yarn) mscale *= 1.0 + 0.1 * std::log(hp.rope_factor);
  r.mscale = float(mscale);
  return r;
}

Weight Weights::weight(const std::string &name, int64_t rows, int64_t cols) const {
  const TensorInfo *t = file.find_tensor(name);
  if (!t) fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' is missing", name.c_str());
  if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
         name.c_str(), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
         (long long)t->ne[3], (long long)cols, (long long)rows);
  size_t rb = k->row_size(t->type, cols);
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

std::vector<float> Weights::vec(const std::string &name, int64_t n, bool required) const {
  const TensorInfo *t = file.find_tensor(name);
  if (!t) {
    if (required) fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' is missing", name.c_str());
    return {};
  }
  if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s' has %lld x %lld values, expected a vector of %lld", name.c_str(),
         (long long)t->ne[0], (long long)(t->ne[1] * t->ne[2] * t->ne[3]), (long long)n);
  size_t rb = k->row_size(t->type, n);
  if (rb == 0 || rb != t->n_bytes)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: tensor '%s' has unsupported type %s", name.c_str(),
         type_name(t->type));
  std::vector<float> out(static_cast<size_t>(n));
  check_status(k->dequantize_row(t->type, t->data, out.data(), n), "dequantize_row");
  return out;
}

void Weights::pack(Weight &w) {
  specinfer_packed_weight *p = nullptr;
  check_status(k->pack_weight(w.type, w.data, w.rows, w.cols, &p), "pack_weight");
  std::unique_ptr<specinfer_packed_weight, PackedFree> owned(p, PackedFree{k});  // if push fails
  packed_.push_back(std::move(owned));
  w.packed = p;
  // A packed copy replaces the matrix: give back its pages (the file's) or its buffer (requant's).
  // Embedding lookups and vocab-limited output rows still read the file; its pages come back.
  const bool has_bytes =
      k->struct_size >= offsetof(specinfer_kernels, packed_bytes) + sizeof(k->packed_bytes) &&
      k->packed_bytes;
  if (!has_bytes || k->packed_bytes(p) == 0) return;
  if (&w == &output && w.data != output_file.data) return;  // output_rows reads re-quantized rows
  for (auto it = owned_.begin(); it != owned_.end(); ++it)
    if (it->get() == w.data) {
      owned_.erase(it);
      w.data = nullptr;
      return;
    }
  file.release(w.data, w.row_bytes * size_t(w.rows));
}

void Weights::requant(Weight &w, int32_t wtype) {
  const size_t rb = k->row_size(wtype, w.cols);
  if (rb == 0 || rb >= w.row_bytes) return;  // columns not a multiple of 32, or not wider
  const size_t bytes = rb * size_t(w.rows);
  void *mem = host->alloc(bytes, 64);
  if (mem == nullptr)
    fail(SPECINFER_ERR_OUT_OF_MEMORY, "gguf: requant: cannot allocate %zu bytes", bytes);
  owned_.emplace_back(static_cast<uint8_t *>(mem), host->free);
  struct Job {
    const specinfer_kernels *k;
    const Weight *w;
    int32_t wtype;
    size_t rb;
    uint8_t *dst;
    std::atomic<int32_t> status{SPECINFER_OK};
  } job{k, &w, wtype, rb, static_cast<uint8_t *>(mem)};
  // Rows in parallel; a failing row (inf / NaN weights) records its status, the others go on.
  host->parallel_for(
      host, w.rows, 16,
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
         (long long)w.rows, (long long)w.cols, type_name(w.type),
         wtype == SPECINFER_WTYPE_Q3_0 ? "q3_0" : type_name(wtype), int(st));
  file.release(w.data, w.row_bytes * size_t(w.rows));  // the copy replaces the file's matrix
  w.type = wtype;
  w.data = mem;
  w.row_bytes = rb;
}

void Weights::matmul(const Weight &w, const float *x, int64_t n_tok, float *y) const {
  if (w.packed)
    check_status(k->matmul_packed(w.packed, x, n_tok, y), "matmul_packed");
  else
    check_status(k->matmul(w.type, w.data, w.rows, w.cols, x, n_tok, y), "matmul");
}

Model::Model(const File &file, const specinfer_host *host, int32_t n_ctx, const ModelOptions &opt)
    : Model(std::make_shared<const Weights>(file, host, n_ctx, opt)) {}

Model::Model(std::shared_ptr<const Weights> weights) : w_(std::move(weights)) {
  if (!w_) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: a sequence needs loaded weights");
  k_ = w_->k;
  cache_.resize(w_->layers.size());
  if (w_->kv_tiles) key_row_.resize(w_->kv_head_bytes);
  if (w_->n_out < w_->hp.n_vocab) is_extra_.assign(size_t(w_->hp.n_vocab), 0);
}

void Model::add_output_ids(const int32_t *ids, int32_t n, bool pinned) {
  if (n > 0 && ids == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: add_output_ids: NULL ids");
  const Weights &W = *w_;
  if (W.n_out == W.hp.n_vocab) return;
  const int64_t E = W.hp.n_embd;
  int32_t n_new = 0;
  for (int32_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= W.hp.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: add_output_ids: id %d is outside the vocabulary of %d", id, W.hp.n_vocab);
    if (id >= W.n_out && !is_extra_[size_t(id)]) ++n_new;
  }
  if (n_new == 0) return;
  // Over the cap: the unpinned ids added before go (see the header).
  if (!pinned && extra_ids_.size() + size_t(n_new) > n_pinned_ + size_t(extra_cap_)) {
    for (size_t j = n_pinned_; j < extra_ids_.size(); j++) is_extra_[size_t(extra_ids_[j])] = 0;
    extra_ids_.resize(n_pinned_);
    extra_rows_.resize(n_pinned_ * W.output.row_bytes);
    extra_packed_.reset();
  }
  for (int32_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    if (id < W.n_out || is_extra_[size_t(id)]) continue;
    if (!pinned && extra_ids_.size() >= n_pinned_ + size_t(extra_cap_)) break;
    // The file's row, in the output matrix's type (re-quantized like the rest if it was).
    const auto *src =
        static_cast<const uint8_t *>(W.output_file.data) + size_t(id) * W.output_file.row_bytes;
    const size_t at = extra_rows_.size();
    extra_rows_.resize(at + W.output.row_bytes);
    if (W.output.type == W.output_file.type) {
      std::memcpy(extra_rows_.data() + at, src, W.output.row_bytes);
    } else {
      extra_row_f_.resize(size_t(E));
      check_status(k_->dequantize_row(W.output_file.type, src, extra_row_f_.data(), E),
                   "dequantize_row");
      check_status(k_->quantize_row(W.output.type, extra_row_f_.data(), extra_rows_.data() + at, E),
                   "quantize_row");
    }
    extra_ids_.push_back(id);
    is_extra_[size_t(id)] = 1;
    extra_packed_.reset();
  }
  if (pinned) n_pinned_ = extra_ids_.size();
}

void Model::ensure_capacity(int32_t n_pos) {
  if (kv_.data() || n_pos <= 0) return;
  slot_pos_.resize(size_t(w_->n_ctx));  // first: once kv_ exists, this is not done again
  const size_t hkv = size_t(w_->hp.n_head_kv), page = PageArray::page_size();
  const auto pages = [&](size_t bytes) { return (bytes + page - 1) / page * page; };
  if (w_->kv_head_major) {
    pos_stride_ = w_->kv_head_bytes;
    // Whole key tiles: the last one's positions past n_ctx are read and ignored.
    head_stride_ = pages(size_t(tile_ceil(w_->n_ctx)) * pos_stride_);
    kv_units_ = int32_t(hkv);
    kv_region_ = hkv * head_stride_;
  } else {
    pos_stride_ = hkv * w_->kv_head_bytes;
    head_stride_ = w_->kv_head_bytes;
    kv_units_ = 1;
    kv_region_ = pages(size_t(w_->n_ctx) * pos_stride_);
  }
  kv_ = PageArray(kv_region_ * 2 * cache_.size());
  for (size_t li = 0; li < cache_.size(); li++) {
    cache_[li].k = kv_.data() + (2 * li) * kv_region_;
    cache_[li].v = kv_.data() + (2 * li + 1) * kv_region_;
  }
  if (w_->attn.on) {
    sk_region_ = (size_t(w_->n_ctx) * w_->sketch_pos_bytes + page - 1) / page * page;
    sk_ = PageArray(sk_region_ * cache_.size());
    for (size_t li = 0; li < cache_.size(); li++) cache_[li].s = sk_.data() + li * sk_region_;
  }
}

Weights::ScratchLease::ScratchLease(const Weights &w) : w_(w) {
  std::lock_guard<std::mutex> lock(w.scratch_mu_);
  if (!w.scratch_free_.empty()) {
    s_ = std::move(w.scratch_free_.back());
    w.scratch_free_.pop_back();
  }
  if (!s_) s_ = std::make_unique<Scratch>();
}

Weights::ScratchLease::~ScratchLease() {
  std::lock_guard<std::mutex> lock(w_.scratch_mu_);
  try {
    w_.scratch_free_.push_back(std::move(s_));
  } catch (...) {  // no room to keep it: it is freed instead
  }
}

void Model::check(const Batch &b) const {
  const int32_t n = b.n;
  if (n <= 0 || b.tokens == nullptr || b.positions == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward needs n_tokens > 0, tokens and positions");
  if (b.n_logits < 0 || b.n_logits > n || (b.n_logits > 0 && b.logits == nullptr))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: n_logits %d invalid for %d tokens (or logits NULL)",
         b.n_logits, n);
  if (n > w_->n_ctx - n_cached_)
    fail(SPECINFER_ERR_CONTEXT_FULL, "gguf: %d cached + %d new tokens exceed the context of %d",
         n_cached_, n, w_->n_ctx);
  for (int32_t i = 0; i < n; i++) {
    if (b.tokens[i] < 0 || b.tokens[i] >= w_->hp.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: token %d at batch index %d is outside the vocabulary of %d", b.tokens[i], i,
           w_->hp.n_vocab);
    if (b.positions[i] < 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: position %d at batch index %d is negative",
           b.positions[i], i);
    if (b.tree_mask && b.tree_mask[size_t(i) * size_t(n) + size_t(i)] == 0)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: tree mask hides token %d from itself", i);
    if (swa_released_ > 0 && int64_t(b.positions[i]) - swa_released_pos_ < w_->hp.swa_window)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: position %d would see keys at positions up to %lld that the sliding-window "
           "layers no longer hold (they keep %d positions before a pass; swa_full=1 keeps all)",
           b.positions[i], (long long)swa_released_pos_, kSwaRollback + w_->hp.swa_window);
  }
}

template <typename Fn>
void Model::each_region(const Cache &c, Fn &&fn) {
  for (int32_t u = 0; u < kv_units_; u++) {
    fn(kv_, size_t(c.k - kv_.data()) + size_t(u) * head_stride_, pos_stride_);
    fn(kv_, size_t(c.v - kv_.data()) + size_t(u) * head_stride_, pos_stride_);
  }
  if (c.s) fn(sk_, size_t(c.s - sk_.data()), w_->sketch_pos_bytes);
}

void Model::release_window(int32_t p0) {
  if (!w_->swa_release) return;
  const int64_t bound = int64_t(p0) - w_->hp.swa_window - kSwaRollback;
  int32_t r = swa_released_;
  while (r < n_cached_ && slot_pos_[size_t(r)] <= bound) r++;
  // Whole key tiles only: a tile's lanes spread over all of its bytes.
  if (w_->kv_tiles) r = std::max(swa_released_, tile_floor(r));
  int64_t top = swa_released_pos_;
  for (int32_t i = swa_released_; i < r; i++) top = std::max<int64_t>(top, slot_pos_[size_t(i)]);
  if (size_t(r - swa_released_) * pos_stride_ < (size_t(32) << 10)) return;
  const size_t page = PageArray::page_size();
  for (size_t li = 0; li < cache_.size(); li++) {
    if (!w_->layers[li].swa) continue;
    // From the page holding the first slot not handed back yet (the slots before it on that page
    // are old too) to the new boundary; PageArray::release keeps the last, partial page.
    each_region(cache_[li], [&](PageArray &pa, size_t start, size_t stride) {
      pa.release((start + size_t(swa_released_) * stride) / page * page,
                 start + size_t(r) * stride);
    });
  }
  swa_released_ = r;
  swa_released_pos_ = top;
}

void Model::prepare_masks(const Batch &b, const uint8_t **mask_out, const uint8_t **swa_out) {
  const int32_t n = b.n, n_kv = n_cached_ + n;
  const int32_t window = w_->hp.swa_window;
  for (int32_t i = 0; i < n; i++) slot_pos_[size_t(n_cached_ + i)] = b.positions[i];

  const uint8_t *mask = nullptr;
  if (b.tree_mask) {
    if (mask_.size() < size_t(n) * size_t(n_kv)) mask_.resize(size_t(n) * size_t(n_kv));
    for (int32_t i = 0; i < n; i++) {
      uint8_t *m = mask_.data() + size_t(i) * size_t(n_kv);
      std::memset(m, 1, size_t(n_cached_));
      for (int32_t j = 0; j < n; j++)
        m[n_cached_ + j] = b.tree_mask[size_t(i) * size_t(n) + size_t(j)] ? 1 : 0;
    }
    mask = mask_.data();
  }

  // Sliding-window layers: a query at position p sees cached positions q with p - q < window.
  // Only built when some pair in this forward is that far apart.
  const uint8_t *swa_mask = mask;
  if (window > 0) {
    int32_t min_kv = slot_pos_[0], max_q = b.positions[0];
    for (int32_t j = 0; j < n_kv; j++) min_kv = std::min(min_kv, slot_pos_[size_t(j)]);
    for (int32_t i = 0; i < n; i++) max_q = std::max(max_q, b.positions[i]);
    if (int64_t(max_q) - int64_t(min_kv) >= window) {
      if (swa_mask_.size() < size_t(n) * size_t(n_kv)) swa_mask_.resize(size_t(n) * size_t(n_kv));
      for (int32_t i = 0; i < n; i++) {
        uint8_t *m = swa_mask_.data() + size_t(i) * size_t(n_kv);
        for (int32_t j = 0; j < n_kv; j++) {
          bool base = mask ? mask[size_t(i) * size_t(n_kv) + size_t(j)] != 0 : j <= n_cached_ + i;
          m[j] = base && int64_t(b.positions[i]) - int64_t(slot_pos_[size_t(j)]) < window;
        }
      }
      swa_mask = swa_mask_.data();
    }
  }
  *mask_out = mask;
  *swa_out = swa_mask;
}

void Model::forward(const int32_t *tokens, const int32_t *positions, int32_t n,
                    const uint8_t *tree_mask, int32_t n_logits, float *logits, float *hidden) {
  Model *self = this;
  const Batch b{tokens, positions, n, tree_mask, n_logits, logits, hidden};
  forward_many(&self, &b, 1);
}

namespace {

// The batch's token embeddings (scaled where the model scales them) into rows x[0..b.n).
void embed_tokens(const Weights &W, const Batch &b, float *x) {
  const specinfer_kernels *k = W.k;
  const int64_t E = W.hp.n_embd;
  for (int32_t i = 0; i < b.n; i++) {
    const auto *row =
        static_cast<const uint8_t *>(W.tok_embd.data) + size_t(b.tokens[i]) * W.tok_embd.row_bytes;
    float *xi = x + i * E;
    check_status(k->dequantize_row(W.tok_embd.type, row, xi, E), "dequantize_row");
    if (W.hp.embd_scale != 1.0f)
      for (int64_t j = 0; j < E; j++) xi[j] *= W.hp.embd_scale;
  }
}

// The attention arguments of a batch that do not change from layer to layer: queries at q,
// output at out, n_kv positions after the batch.
specinfer_attention_args attention_args(const Weights &W, const Batch &b, int32_t n_kv, float *q,
                                        float *out) {
  const Hparams &hp = W.hp;
  specinfer_attention_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.n_q = b.n;
  a.n_head = int32_t(hp.n_head);
  a.n_head_kv = int32_t(hp.n_head_kv);
  a.head_dim = int32_t(hp.head_dim);
  a.n_kv = n_kv;
  a.q = q;
  a.scale = hp.attn_scale;
  a.out = out;
  a.k_type = W.kv_type;
  a.v_type = W.kv_type;
  a.sketch_bits = W.attn.bits;
  a.n_select = W.attn.keys;
  a.n_window = W.attn.window;
  a.n_sink = W.attn.sink;
  a.n_rescore = W.attn.rescore;
  return a;
}

// Biases, per-head norms and RoPE of layer L on a batch's query rows q and key rows kn (and the
// value bias on vn), in place.
void finish_qkv(const Weights &W, const Weights::Layer &L, const Batch &b, float *q, float *kn,
                float *vn) {
  const Hparams &hp = W.hp;
  const specinfer_kernels *k = W.k;
  const int64_t hd = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;
  const int64_t QD = H * hd, KV = Hkv * hd;
  const float eps = hp.norm_eps;
  for (int32_t i = 0; i < b.n; i++) {
    if (!L.bq.empty()) k->add(q + i * QD, L.bq.data(), QD);
    if (!L.bk.empty()) k->add(kn + i * KV, L.bk.data(), KV);
    if (!L.bv.empty()) k->add(vn + i * KV, L.bv.data(), KV);
    if (!L.q_norm.empty())
      for (int64_t j = 0; j < H; j++)
        k->rmsnorm(q + i * QD + j * hd, L.q_norm.data(), hd, eps, q + i * QD + j * hd);
    if (!L.k_norm.empty())
      for (int64_t j = 0; j < Hkv; j++)
        k->rmsnorm(kn + i * KV + j * hd, L.k_norm.data(), hd, eps, kn + i * KV + j * hd);
    const int32_t neox = hp.rope_neox ? 1 : 0;
    if (L.rope.inv_freq.empty()) {
      k->rope(q + i * QD, H, hd, hp.n_rot, b.positions[i], L.rope_base, neox);
      k->rope(kn + i * KV, Hkv, hd, hp.n_rot, b.positions[i], L.rope_base, neox);
    } else {
      const double *f = L.rope.inv_freq.data();
      k->rope_freqs(q + i * QD, H, hd, hp.n_rot, b.positions[i], f, L.rope.mscale, neox);
      k->rope_freqs(kn + i * KV, Hkv, hd, hp.n_rot, b.positions[i], f, L.rope.mscale, neox);
    }
  }
}

// Rows y[0..n) of width E: normed with `norm` (if the layer has one) and added to x.
void add_residual(const Weights &W, const std::vector<float> &norm, int32_t n, float *y, float *x) {
  const specinfer_kernels *k = W.k;
  const int64_t E = W.hp.n_embd;
  if (!norm.empty())
    for (int32_t i = 0; i < n; i++) k->rmsnorm(y + i * E, norm.data(), E, W.hp.norm_eps, y + i * E);
  k->add(x, y, n * E);
}

// The feed-forward block of layer L on the pass's N rows x, with h, g, u as scratch.
void feed_forward(const Weights &W, const Weights::Layer &L, int32_t N, float *x, float *h,
                  float *g, float *u) {
  const specinfer_kernels *k = W.k;
  const int64_t E = W.hp.n_embd, F = W.hp.n_ff;
  for (int32_t i = 0; i < N; i++)
    k->rmsnorm(x + i * E, L.ffn_norm.data(), E, W.hp.norm_eps, h + i * E);
  W.matmul(L.gate, h, N, g);
  W.matmul(L.up, h, N, u);
  if (W.hp.gemma)
    gelu_mul(g, u, N * F);
  else
    k->silu_mul(g, u, N * F);
  W.matmul(L.down, g, N, h);
  add_residual(W, L.post_ffn_norm, N, h, x);
}

}  // namespace

void Model::check_many(Model *const *seqs, const Batch *batches, int32_t n_seq) {
  if (n_seq <= 0 || seqs == nullptr || batches == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many needs sequences and their batches");
  for (int32_t s = 0; s < n_seq; s++) {
    if (seqs[s] == nullptr)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many: sequence %d is NULL", s);
    if (seqs[s]->w_ != seqs[0]->w_)
      fail(SPECINFER_ERR_INVALID_ARGUMENT,
           "gguf: forward_many: sequence %d is on other weights than sequence 0", s);
    for (int32_t r = 0; r < s; r++)
      if (seqs[r] == seqs[s])
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many: sequences %d and %d are the same",
             r, s);
    seqs[s]->check(batches[s]);
  }
}

void Model::store_kv(size_t li, const Batch &b, const float *kb, const float *vb) {
  const Weights &W = *w_;
  const specinfer_kernels *k = W.k;
  const int64_t hd = W.hp.head_dim, KV = W.hp.n_head_kv * hd;
  Cache &c = cache_[li];
  for (int32_t t = 0; t < b.n; t++)
    for (int32_t u = 0; u < kv_units_; u++) {
      // Unit u of position n_cached + t: kv head u's row, or every head's rows.
      const size_t at = size_t(u) * head_stride_ + size_t(n_cached_ + t) * pos_stride_;
      const int64_t from = int64_t(t) * KV + int64_t(u) * hd, n = KV / kv_units_;
      if (W.kv_tiles) {
        uint8_t *row = key_row_.data();
        const int32_t p = n_cached_ + t, lane = p % SPECINFER_KEY_TILE;
        check_status(k->kv_store(W.kv_type, kb + from, row, n), "kv_store");
        specinfer_key_tile_put(c.k + at - size_t(lane) * pos_stride_, lane, row, n);
        check_status(k->kv_store(W.kv_type, vb + from, c.v + at, n), "kv_store");
      } else if (W.kv_type == SPECINFER_WTYPE_F32) {
        std::memcpy(c.k + at, kb + from, size_t(n) * sizeof(float));
        std::memcpy(c.v + at, vb + from, size_t(n) * sizeof(float));
      } else {
        check_status(k->kv_store(W.kv_type, kb + from, c.k + at, n), "kv_store");
        check_status(k->kv_store(W.kv_type, vb + from, c.v + at, n), "kv_store");
      }
    }
  if (c.s)
    check_status(k->key_sketch(kb, int64_t(b.n) * W.hp.n_head_kv, hd, W.attn.bits,
                               c.s + size_t(n_cached_) * W.sketch_pos_bytes),
                 "key_sketch");
}

void Model::attend(size_t li, const Batch &b, const float *q, const float *kb, const uint8_t *mask,
                   specinfer_attention_args &a) {
  const Weights &W = *w_;
  const Cache &c = cache_[li];
  if (qk_observer_) qk_observer_(int32_t(li), q, kb, b.n);
  // The cache's bytes, read in their own type (k_type, v_type); the ABI types the pointers as
  // floats.
  a.k = reinterpret_cast<const float *>(c.k);
  a.v = reinterpret_cast<const float *>(c.v);
  if (W.kv_head_major) {
    a.k_pos_stride = a.v_pos_stride = int64_t(pos_stride_);
    a.k_head_stride = a.v_head_stride = int64_t(head_stride_);
  }
  a.k_tile = W.kv_tiles ? SPECINFER_KEY_TILE : 0;
  a.mask = mask;
  a.k_sketch = c.s;
  check_status(W.k->attention(&a), "attention");
}

void Model::forward_many(Model *const *seqs, const Batch *batches, int32_t n_seq) {
  check_many(seqs, batches, n_seq);
  const Weights &W = *seqs[0]->w_;
  const Hparams &hp = W.hp;
  const specinfer_kernels *k = W.k;
  // Where each sequence's tokens lie in the pass: rows off[s] .. off[s + 1].
  std::vector<int64_t> off(size_t(n_seq) + 1, 0);
  for (int32_t s = 0; s < n_seq; s++) off[size_t(s) + 1] = off[size_t(s)] + batches[s].n;
  if (off.back() > (int64_t(1) << 24))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: forward_many: %lld tokens in one pass",
         (long long)off.back());
  const auto N = int32_t(off.back());

  // Tokens in the context are likely to come again: with a vocabulary limit their logits are
  // computed from now on (before anything changes, so that a failure leaves the cache as it was).
  for (int32_t s = 0; s < n_seq; s++) seqs[s]->add_output_ids(batches[s].tokens, batches[s].n);

  for (int32_t s = 0; s < n_seq; s++) seqs[s]->ensure_capacity(seqs[s]->n_cached_ + batches[s].n);

  const int64_t E = hp.n_embd, hd = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;
  const int64_t QD = H * hd, KV = Hkv * hd, F = hp.n_ff;
  const float eps = hp.norm_eps;
  const Weights::ScratchLease lease(W);
  Weights::Scratch &sc = *lease;
  float *x = grow(sc.x, N * E), *h = grow(sc.h, N * E), *q = grow(sc.q, N * QD),
        *att = grow(sc.att, N * QD);
  float *g = grow(sc.gate, N * F), *u = grow(sc.up, N * F), *kn = grow(sc.kn, N * KV),
        *vn = grow(sc.vn, N * KV);

  std::vector<const uint8_t *> mask(static_cast<size_t>(n_seq)),
      swa_mask(static_cast<size_t>(n_seq));
  std::vector<specinfer_attention_args> args(static_cast<size_t>(n_seq));
  for (int32_t s = 0; s < n_seq; s++) {
    const Batch &b = batches[s];
    const int64_t o = off[size_t(s)];
    embed_tokens(W, b, x + o * E);
    seqs[s]->prepare_masks(b, &mask[size_t(s)], &swa_mask[size_t(s)]);
    args[size_t(s)] = attention_args(W, b, seqs[s]->n_cached_ + b.n, q + o * QD, att + o * QD);
  }

  for (size_t li = 0; li < W.layers.size(); li++) {
    const Weights::Layer &L = W.layers[li];
    for (int32_t i = 0; i < N; i++) k->rmsnorm(x + i * E, L.attn_norm.data(), E, eps, h + i * E);
    W.matmul(L.wq, h, N, q);
    W.matmul(L.wk, h, N, kn);
    W.matmul(L.wv, h, N, vn);
    for (int32_t s = 0; s < n_seq; s++) {
      const Batch &b = batches[s];
      float *qs = q + off[size_t(s)] * QD, *ks = kn + off[size_t(s)] * KV,
            *vs = vn + off[size_t(s)] * KV;
      finish_qkv(W, L, b, qs, ks, vs);
      // The new keys and values into the sequence's cache, after the positions it holds.
      seqs[s]->store_kv(li, b, ks, vs);
      seqs[s]->attend(li, b, qs, ks, L.swa ? swa_mask[size_t(s)] : mask[size_t(s)],
                      args[size_t(s)]);
    }
    W.matmul(L.wo, att, N, h);
    add_residual(W, L.post_attn_norm, N, h, x);
    feed_forward(W, L, N, x, h, g, u);
  }

  output_logits(seqs, batches, n_seq, off, x, sc);
  for (int32_t s = 0; s < n_seq; s++) {
    Model &m = *seqs[s];
    m.n_cached_ += batches[s].n;
    m.used_ = std::max(m.used_, m.n_cached_);
    m.release_window(*std::min_element(batches[s].positions, batches[s].positions + batches[s].n));
  }
}

void Model::output_logits(Model *const *seqs, const Batch *batches, int32_t n_seq,
                          const std::vector<int64_t> &off, const float *x, Weights::Scratch &sc) {
  const Weights &W = *seqs[0]->w_;
  const Hparams &hp = W.hp;
  const specinfer_kernels *k = W.k;
  const int64_t E = hp.n_embd;
  float *h = sc.h.data();
  // The rows that get logits (each batch's last n_logits), normed and gathered in order into h.
  int64_t n_rows = 0;
  for (int32_t s = 0; s < n_seq; s++) {
    const Batch &b = batches[s];
    for (int64_t i = off[size_t(s) + 1] - b.n_logits; i < off[size_t(s) + 1]; i++, n_rows++)
      k->rmsnorm(x + i * E, W.output_norm.data(), E, hp.norm_eps, h + n_rows * E);
  }
  int64_t row = 0;
  for (int32_t s = 0; s < n_seq; s++) {
    const Batch &b = batches[s];
    if (b.hidden && b.n_logits > 0)
      std::memcpy(b.hidden, h + row * E, size_t(b.n_logits) * size_t(E) * sizeof(float));
    if (W.n_out < hp.n_vocab && b.n_logits > 0) seqs[s]->limited_logits(b, h + row * E);
    row += b.n_logits;
  }
  if (W.n_out != hp.n_vocab || n_rows == 0) return;
  // Rows the caller laid out one after another in the pass's order (a session step_many's
  // arena) take the product directly; otherwise it goes through the scratch and is copied out.
  const size_t V = size_t(hp.n_vocab);
  float *first = nullptr;
  bool in_order = true;
  int64_t before = 0;
  for (int32_t s = 0; s < n_seq; s++) {
    const Batch &b = batches[s];
    if (b.n_logits == 0) continue;
    if (!first) first = b.logits - size_t(before) * V;
    in_order = in_order && b.logits == first + size_t(before) * V;
    before += b.n_logits;
  }
  if (in_order) {
    W.matmul(W.output, h, n_rows, first);
    return;
  }
  // One pass over the output matrix for every sequence's rows, then each its own.
  float *lg = grow(sc.lg, n_rows * int64_t(V));
  W.matmul(W.output, h, n_rows, lg);
  row = 0;
  for (int32_t s = 0; s < n_seq; s++) {
    const Batch &b = batches[s];
    if (b.n_logits > 0)
      std::memcpy(b.logits, lg + size_t(row) * V, size_t(b.n_logits) * V * sizeof(float));
    row += b.n_logits;
  }
}

void Model::limited_logits(const Batch &b, const float *h) {
  const Weights &W = *w_;
  const int64_t E = W.hp.n_embd;
  const int32_t n_logits = b.n_logits;
  out_rows_.resize(size_t(n_logits) * size_t(W.n_out));
  W.matmul(W.output, h, n_logits, out_rows_.data());
  const auto n_extra = static_cast<int64_t>(extra_ids_.size());
  // Rows of extra_logits_: with the packed output, the extra rows padded to whole groups of 16.
  const int64_t stride = W.output.packed ? (n_extra + 15) / 16 * 16 : n_extra;
  extra_logits_.resize(size_t(n_logits) * size_t(stride));
  if (n_extra > 0 && W.output.packed) {
    if (!extra_packed_) {
      const size_t rb = W.output.row_bytes;
      extra_padded_.resize(size_t(stride) * rb);
      std::memcpy(extra_padded_.data(), extra_rows_.data(), size_t(n_extra) * rb);
      for (int64_t r = n_extra; r < stride; r++)
        std::memcpy(extra_padded_.data() + size_t(r) * rb,
                    extra_rows_.data() + size_t(n_extra - 1) * rb, rb);
      specinfer_packed_weight *p = nullptr;
      check_status(k_->pack_weight(W.output.type, extra_padded_.data(), stride, E, &p),
                   "pack_weight");
      extra_packed_ = PackedPtr(p, Weights::PackedFree{k_});
    }
    check_status(k_->matmul_packed(extra_packed_.get(), h, n_logits, extra_logits_.data()),
                 "matmul_packed");
  } else if (n_extra > 0) {
    check_status(k_->matmul(W.output.type, extra_rows_.data(), n_extra, E, h, n_logits,
                            extra_logits_.data()),
                 "matmul");
  }
  for (int32_t i = 0; i < n_logits; i++) {
    float *out = b.logits + size_t(i) * size_t(W.hp.n_vocab);
    std::memcpy(out, out_rows_.data() + size_t(i) * size_t(W.n_out),
                size_t(W.n_out) * sizeof(float));
    std::fill(out + W.n_out, out + W.hp.n_vocab, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n_extra; j++)
      out[extra_ids_[size_t(j)]] = extra_logits_[size_t(i) * size_t(stride) + size_t(j)];
  }
}

void Model::kv_truncate(int32_t n_keep) {
  if (n_keep < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_truncate(%d): negative", n_keep);
  // The position after the cut must not see keys the sliding-window layers handed back.
  if (swa_released_ > 0 && n_keep > 0 && n_keep < n_cached_ &&
      int64_t(slot_pos_[size_t(n_keep - 1)]) + 1 - swa_released_pos_ < w_->hp.swa_window)
    n_keep = 0;
  if (n_keep < n_cached_) n_cached_ = n_keep;
  swa_released_ = std::min(swa_released_, n_cached_);
  if (n_cached_ == 0) swa_released_pos_ = INT64_MIN;
  // A cache cut far back (a new prompt) hands its pages back; the small cuts of rejected drafts
  // (16 positions are 16 KiB of a layer's keys on a 1.5B model) keep them for the next round.
  const size_t row = size_t(w_->hp.n_head_kv) * w_->kv_head_bytes;
  if (size_t(used_ - n_cached_) * row >= (size_t(64) << 10)) {
    // From the end of the tile of the last kept key (a tile's lanes spread over all its bytes).
    const size_t from = size_t(w_->kv_tiles ? tile_ceil(n_cached_) : n_cached_);
    for (const Cache &c : cache_)
      each_region(c, [&](PageArray &pa, size_t start, size_t stride) {
        pa.release(start + from * stride, start + size_t(used_) * stride);
      });
    used_ = n_cached_;
  }
}

void Model::output_rows(const int32_t *ids, int32_t n, float *out) const {
  if (n < 0 || (n > 0 && (ids == nullptr || out == nullptr)))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: output_rows: NULL ids or out, or n %d < 0", n);
  const Weights &W = *w_;
  const int64_t E = W.hp.n_embd;
  // A packed matrix's rows are read from the file, whose pages of it were handed back once the
  // packed copy was made: they go back again afterwards, so that a drafter asking for many rows
  // (Medusa's heads' vocabulary) does not leave a second copy of the matrix resident.
  int32_t lo = W.hp.n_vocab, hi = -1;
  for (int32_t i = 0; i < n; i++) {
    const int32_t id = ids[i];
    if (id < 0 || id >= W.hp.n_vocab)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: output_rows: token %d outside the vocabulary %d",
           id, W.hp.n_vocab);
    // Below a vocabulary limit the rows logits use (re-quantized, if so); above it the file's.
    const Weight &w = id < W.n_out ? W.output : W.output_file;
    const auto *row = static_cast<const uint8_t *>(w.data) + size_t(id) * w.row_bytes;
    check_status(k_->dequantize_row(w.type, row, out + size_t(i) * size_t(E), E), "output row");
    if (&w == &W.output && w.packed) {
      lo = std::min(lo, id);
      hi = std::max(hi, id);
    }
  }
  if (hi >= lo) {
    const Weight &w = W.output;
    W.file.release(static_cast<const uint8_t *>(w.data) + size_t(lo) * w.row_bytes,
                   size_t(hi - lo + 1) * w.row_bytes);
  }
}

void Model::kv_copy(const Model &src, int32_t n) {
  kv_truncate(0);
  if (&src == this || src.w_ != w_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_copy: the source is %s",
         &src == this ? "this sequence" : "a sequence on other weights");
  if (n < 0 || n > src.n_cached_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: kv_copy(%d): the source holds %d positions", n,
         src.n_cached_);
  if (src.swa_released_ > 0)
    fail(SPECINFER_ERR_UNSUPPORTED,
         "gguf: kv_copy: the source's sliding-window layers handed keys back");
  if (n == 0) return;
  ensure_capacity(n);
  if (!src.extra_ids_.empty())
    add_output_ids(src.extra_ids_.data() + src.n_pinned_,
                   int32_t(src.extra_ids_.size() - src.n_pinned_));
  // Both caches have one layout (it follows from the weights and the context): each region's
  // first n slots (whole key tiles: a tile's lanes spread over all of its bytes) are copied at
  // the same offsets.
  const size_t slots = size_t(w_->kv_tiles ? tile_ceil(n) : n);
  for (const Cache &c : cache_)
    each_region(c, [&](PageArray &pa, size_t start, size_t stride) {
      const PageArray &from = &pa == &kv_ ? src.kv_ : src.sk_;
      std::memcpy(pa.data() + start, from.data() + start, slots * stride);
    });
  std::copy(src.slot_pos_.begin(), src.slot_pos_.begin() + n, slot_pos_.begin());
  n_cached_ = n;
  used_ = std::max(used_, n);
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
  for (Cache &c : cache_) {
    for (int32_t j = 0; j < n; j++) {
      if (idx[j] == j) continue;
      for (int32_t u = 0; u < kv_units_; u++) {
        const size_t dst = size_t(u) * head_stride_ + size_t(base + j) * pos_stride_,
                     src = size_t(u) * head_stride_ + size_t(base + idx[j]) * pos_stride_;
        if (w_->kv_tiles) {
          const int32_t ls = (base + idx[j]) % SPECINFER_KEY_TILE,
                        ld = (base + j) % SPECINFER_KEY_TILE;
          specinfer_key_tile_move(c.k + src - size_t(ls) * pos_stride_, ls,
                                  c.k + dst - size_t(ld) * pos_stride_, ld, w_->hp.head_dim);
        } else {
          std::memmove(c.k + dst, c.k + src, pos_stride_);
        }
        std::memmove(c.v + dst, c.v + src, pos_stride_);
      }
      const size_t srow = w_->sketch_pos_bytes;
      if (c.s)
        std::memmove(c.s + size_t(base + j) * srow, c.s + size_t(base + idx[j]) * srow, srow);
    }
  }
  for (int32_t j = 0; j < n; j++) slot_pos_[size_t(base + j)] = slot_pos_[size_t(base + idx[j])];
  n_cached_ = base + n;
  // Slots from base on now hold moved keys (their positions stay counted in swa_released_pos_).
  swa_released_ = std::min(swa_released_, base);
}

}  // namespace specinfer::gguf
