// A decoder-only transformer (Llama / Qwen2 / Qwen3 family, Gemma 3) read from a GGUF file: its
// Weights, loaded once, and any number of sequences (Model), each with its own KV cache. All heavy
// math (matmul, attention, norms, rope, activations) runs through the host's kernel table; the
// model only arranges buffers.
//
// Threads: one thread at a time per Model (the kernels parallelize internally); Models on the same
// Weights run concurrently, and forward_many runs several of them in one pass.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gguf_file.h"
#include "page_array.h"
#include "specinfer_plugin.h"

namespace specinfer::gguf {

struct Hparams {
  std::string arch;     // general.architecture
  std::string name;     // general.name (or the arch)
  int32_t n_vocab = 0;  // rows of the output matrix
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;  // attention.key_length, default n_embd / n_head
  int32_t n_ff = 0;
  int32_t n_ctx_train = 0;
  int32_t n_rot = 0;  // rope.dimension_count, default head_dim
  float norm_eps = 1e-6f;
  float rope_base = 10000.0f;
  bool rope_neox = false;  // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
  // Gemma 3: embeddings scaled by sqrt(n_embd), GELU-gated FFN, norms after attention and FFN,
  // sliding-window attention in all but every swa_pattern-th layer (with its own rope base).
  bool gemma = false;
  float embd_scale = 1.0f;
  float attn_scale = 0.0f;         // 1/sqrt(head_dim) unless the architecture says otherwise
  int32_t swa_window = 0;          // 0 = no sliding window
  int32_t swa_pattern = 0;         // layer il is global iff (il + 1) % swa_pattern == 0
  float rope_base_swa = 10000.0f;  // rope base of the sliding-window layers
  // Scaled RoPE (rope.scaling.*) of the layers that use rope_base: "none", "linear" (positions
  // divided by rope_factor) or "yarn" (YaRN: low-frequency pairs interpolated, high-frequency ones
  // kept, a ramp between the pairs that turn yarn_beta_slow and yarn_beta_fast times over
  // rope_orig_ctx positions; rotated values scaled by rope_attn_factor * (1 + 0.1 ln factor)).
  std::string rope_scaling = "none";
  double rope_factor = 1.0;
  int32_t rope_orig_ctx = 0;  // rope.scaling.original_context_length, default n_ctx_train
  double yarn_ext_factor = 1.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double rope_attn_factor = 1.0;
};

// The per-pair frequencies (n_rot / 2 of them) and the rotation's scale for a layer of rope base
// `base` under hp's scaling, divided by freq_factors[i] when given (rope_freqs.weight: Llama 3's
// long-context factors). Same formulas as llama.cpp's ggml rope.
struct RopeFreqs {
  std::vector<double> inv_freq;
  float mscale = 1.0f;
};
RopeFreqs rope_freqs_for(const Hparams &hp, double base, const float *freq_factors);

// A weight matrix: rows of cols values of a (possibly quantized) type, in the mapping.
struct Weight {
  int32_t type = 0;
  const void *data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  const specinfer_packed_weight *packed = nullptr;  // the kernels' packed form (owned by the Model)
};

// Sketched attention (specinfer_attention_args.k_sketch): every key also kept as a sketch of
// `bits` sign bits, and a query that sees more than sink + keys + window keys attends exactly to
// its first `sink`, its last `window` and the `keys` others of largest estimated q.k (with
// `rescore` above `keys`: of largest exact q.k among the `rescore` of largest estimate). Lossy.
struct SketchedAttention {
  bool on = false;
  int32_t bits = 128, keys = 1024, window = 256, sink = 4;
  // Candidates of largest estimate scored exactly before the `keys` are picked among them
  // (specinfer_attention_args.n_rescore); 0: picked by the estimate alone.
  int32_t rescore = 0;
};

// How to load: see Weights' constructor.
struct ModelOptions {
  bool pack = true;         // hand every matrix to the host's pack_weight
  int32_t vocab_limit = 0;  // logits only for token ids below it; 0 = all
  // SPECINFER_WTYPE_Q4_0, _Q3_0 or _Q8_0: re-quantize wider matrices; -1 = keep.
  int32_t requant = -1;
  // How every sequence stores its keys and values: SPECINFER_WTYPE_F32, _F16, _Q8_0 or _Q4_0 (the
  // host's kv_store writes them, its attention reads them directly); -1: F16, or F32 on a host
  // without kv_store.
  int32_t kv_type = -1;
  SketchedAttention attn;  // off: exact attention
  // Keep every position in the sliding-window layers too. Off (the default), a sequence hands back
  // the pages of those layers' keys and values that no query can see any more (Model::kv_truncate
  // says what that costs), when the host accepts a truncation that keeps less than asked.
  bool swa_full = false;
  // Keys of a Q8_0 cache in tiles of 16 positions (specinfer_attention_args.k_tile), which the
  // host's attention scores with 8-bit integer products, when the host reads them (and the cache
  // is head-major). Off: rows, as values are kept.
  bool kv_tiles = true;
};

// What a model's sequences share: hyperparameters and every weight, immutable once loaded, so
// that any number of Models (sequences, each with its own KV cache) on other threads read it at
// once.
// Ids above a vocabulary limit whose logits a sequence keeps computing, unpinned (Model::
// add_output_ids): the rows of 8192 ids are 4 MB for the 0.5B draft re-quantized to Q4_0.
constexpr int32_t kDefaultExtraCap = 8192;

class Weights {
 public:
  // Reads hyperparameters and weights (checking every shape); n_ctx <= 0 picks the trained
  // context_length (each sequence's cache only reserves address space for it: see Model). The File
  // must outlive the Weights. Throws gguf::Error (UNSUPPORTED for an unknown architecture or a
  // weight type the kernels lack, FORMAT for missing or misshapen tensors, CONFIG for a bad n_ctx).
  // pack: hand every matrix to the host's pack_weight once (faster kernels; Q4_K, Q6_K and Q4_0
  // matrices, and with AVX-512 Q5_0 and Q8_0 ones, are copied into packed layouts), if the host has
  // it. vocab_limit in (0, n_vocab): compute logits only for token ids below it, for every token a
  // sequence has been fed and for ids given to its add_output_ids, and write -inf for the rest (a
  // cheaper output matrix for draft models: ids are roughly in frequency order in BPE vocabularies,
  // and the rarer tokens a continuation needs are mostly in its context); 0 = all. requant (a draft
  // model's cheaper copy): every matrix stored with more bits per weight than that type (and a
  // multiple of 32 columns) is decoded and re-quantized to it in memory (the file is not touched):
  // for the Qwen2.5 0.5B draft, Q5_0 / Q8_0 -> Q4_0 is 491 -> 278 MB read per token. Lossy: the
  // draft's proposals change, the target's output does not. kv_type: CONFIG error for a type the
  // cache cannot hold, a head_dim that is not whole blocks of it, or (other than F32) a host
  // without kv_store.
  Weights(const File &file, const specinfer_host *host, int32_t n_ctx, const ModelOptions &opt);
  Weights(const Weights &) = delete;
  Weights &operator=(const Weights &) = delete;

  struct Layer {
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, post_attn_norm,
        post_ffn_norm;
    bool swa = false;  // sliding-window layer
    float rope_base = 0.0f;
    RopeFreqs rope;  // empty inv_freq: plain rope at rope_base (the kernels' rope)
    Weight wq, wk, wv, wo, gate, up, down;
  };
  struct PackedFree {
    const specinfer_kernels *k;
    void operator()(specinfer_packed_weight *p) const noexcept { k->free_packed(p); }
  };

  const File &file;
  const specinfer_host *host;
  const specinfer_kernels *k = nullptr;
  Hparams hp;
  int32_t n_ctx = 0;
  int32_t kv_type = SPECINFER_WTYPE_F32;  // the KV cache's storage type (ModelOptions::kv_type)
  size_t kv_head_bytes = 0;               // one head's key (or value) row in that type
  // Caches are head-major (each kv head's rows of a layer one after another) when the host's
  // attention reads row strides; else rows back to back by position (the attention ABI's default).
  bool kv_head_major = false;
  // Keys in tiles of 16 positions (ModelOptions::kv_tiles, a Q8_0 head-major cache, a host with
  // SPECINFER_ATTN_KEY_TILES).
  bool kv_tiles = false;
  // Sequences hand back their sliding-window layers' old keys and values (ModelOptions::swa_full
  // off, a sliding window, a host with SPECINFER_HOST_SHORT_TRUNCATE).
  bool swa_release = false;
  SketchedAttention attn;       // ModelOptions::attn
  size_t sketch_pos_bytes = 0;  // one position's key sketches, every kv head (attn.on)
  Weight tok_embd, output;
  int32_t n_out = 0;   // output rows computed (n_vocab, or the vocab limit)
  Weight output_file;  // with a vocabulary limit: the file's output matrix, all rows
  std::vector<float> output_norm;
  std::vector<Layer> layers;

  void matmul(const Weight &w, const float *x, int64_t n_tok, float *y) const;

  // Activations of every token of one pass and the logits of a shared pass's rows. A pass borrows
  // one from its Weights' pool for its duration, so the sequences of a model hold only as many as
  // passes ever ran at once (one per thread), not one each: eight server slots stepped together
  // by one thread use one.
  struct Scratch {
    std::vector<float> x, h, q, att, gate, up, kn, vn, lg;
  };
  class ScratchLease {
   public:
    explicit ScratchLease(const Weights &w);
    ~ScratchLease();
    ScratchLease(const ScratchLease &) = delete;
    ScratchLease &operator=(const ScratchLease &) = delete;
    Scratch &operator*() const { return *s_; }

   private:
    const Weights &w_;
    std::unique_ptr<Scratch> s_;
  };

 private:
  // The constructor's steps, in order.
  void read_hparams();
  std::vector<float> read_rope_freqs();
  void read_layers(const std::vector<float> &freq_factors);
  void prepare_matrices(const ModelOptions &opt);
  void choose_kv_cache(const ModelOptions &opt);
  Weight weight(const std::string &name, int64_t rows, int64_t cols) const;
  std::vector<float> vec(const std::string &name, int64_t n, bool required) const;
  void pack(Weight &w);
  void requant(Weight &w, int32_t wtype);
  std::vector<std::unique_ptr<specinfer_packed_weight, PackedFree>> packed_;
  std::vector<std::unique_ptr<uint8_t, void (*)(void *)>> owned_;  // re-quantized matrices
  mutable std::mutex scratch_mu_;
  mutable std::vector<std::unique_ptr<Scratch>> scratch_free_;  // scratch no pass holds
};

// One batch of a forward pass (see Model::forward).
struct Batch {
  const int32_t *tokens = nullptr;
  const int32_t *positions = nullptr;
  int32_t n = 0;
  const uint8_t *tree_mask = nullptr;
  int32_t n_logits = 0;
  float *logits = nullptr;
  float *hidden = nullptr;
};

// One sequence of a model: its KV cache and scratch on shared Weights.
class Model {
 public:
  // Loads the weights (see Weights) for a first sequence.
  Model(const File &file, const specinfer_host *host, int32_t n_ctx, const ModelOptions &opt = {});
  // A new, empty sequence on weights already loaded.
  explicit Model(std::shared_ptr<const Weights> weights);
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  const Hparams &hparams() const { return w_->hp; }
  int32_t n_ctx() const { return w_->n_ctx; }
  int32_t kv_size() const { return n_cached_; }
  const std::shared_ptr<const Weights> &weights() const { return w_; }

  // One batched forward pass of n tokens at the given positions, appended to the KV cache.
  // tree_mask: NULL = causal within the batch, else [n][n] (1 = token i may see batch token j);
  // cached positions are always visible. Writes logits [n_logits][n_vocab] for the last n_logits
  // tokens and, if hidden != NULL, their final hidden state after the output norm (the input of
  // the output matrix) [n_logits][n_embd]. Throws gguf::Error: INVALID_ARGUMENT (bad token,
  // position or count), CONTEXT_FULL (cache would exceed n_ctx). On error the cache is unchanged.
  void forward(const int32_t *tokens, const int32_t *positions, int32_t n, const uint8_t *tree_mask,
               int32_t n_logits, float *logits, float *hidden);

  // One pass for several sequences on the same Weights (each at most once), seqs[i] taking
  // batches[i] as forward() would: every matrix is streamed once for all their tokens, and each
  // sequence's results equal those of its own forward() (the kernels' results for a token do not
  // depend on how many tokens share the pass). Throws as forward(), INVALID_ARGUMENT also for
  // sequences on other weights or repeated; on error no cache changes.
  static void forward_many(Model *const *seqs, const Batch *batches, int32_t n);

  // Observer of each layer's attention inputs, for analysis tools (sketch-eval on real vectors):
  // called once per layer and forward with the n tokens' queries [n][n_head * head_dim] and keys
  // [n][n_head_kv * head_dim], both after bias, norm and RoPE (what the attention scores use).
  // Empty (the default) costs nothing.
  using QkObserver = std::function<void(int32_t layer, const float *q, const float *k, int32_t n)>;
  void set_qk_observer(QkObserver fn) { qk_observer_ = std::move(fn); }

  // With a vocabulary limit: also compute logits for these ids from now on, in this sequence (ids
  // below the limit or already added are skipped). The plugin adds the end-of-generation tokens
  // when it creates a sequence, pinned; forward adds every token it is fed. At most
  // extra_cap() unpinned ids are kept: when a call's new ids would pass that, the unpinned ones
  // added before are dropped first (their rows and logits go; the draft model no longer proposes
  // them until it is fed them again), so that a long-lived sequence that sees ever new rare tokens
  // stays bounded. Throws INVALID_ARGUMENT for an id outside the vocabulary.
  void add_output_ids(const int32_t *ids, int32_t n, bool pinned = false);
  void set_extra_cap(int32_t cap) { extra_cap_ = cap < 0 ? 0 : cap; }
  int32_t extra_cap() const { return extra_cap_; }
  // Ids at or above the limit whose logits are computed (empty without a limit).
  const std::vector<int32_t> &extra_output_ids() const { return extra_ids_; }

  // Writes the output matrix's rows for token ids[0..n) as floats, out[i][n_embd] (the rows the
  // logits are computed with: a logit is the row's dot product with the final hidden state).
  // Throws INVALID_ARGUMENT for an id outside the vocabulary. Touches no cache.
  void output_rows(const int32_t *ids, int32_t n, float *out) const;

  // Drops cached positions from n_keep on (n_keep >= kv_size() is a no-op); their pages go back to
  // the system when that frees 64 KiB or more of a layer's keys. With Weights::swa_release, the
  // sliding-window layers hold only the keys that a query at kSwaRollback positions before the
  // latest pass's first could see: a cut that leaves the next position needing older ones keeps
  // nothing (kv_size() is then 0 and the sequence is fed again).
  void kv_truncate(int32_t n_keep);
  // Keeps positions base + idx[0..n) (strictly increasing), moved to base..base+n; drops the rest.
  void kv_keep(int32_t base, const int32_t *idx, int32_t n);
  // Makes this sequence's cache the first n positions of src's, a sequence on the same Weights
  // (and its extra output ids this one's too, as forward would have added them). Throws
  // INVALID_ARGUMENT for other weights or n outside 0..src.kv_size(), UNSUPPORTED when src's
  // sliding-window layers have handed keys back (what they dropped cannot be copied); the cache
  // is empty after a throw.
  void kv_copy(const Model &src, int32_t n);
  // How far before a pass's first position a later cut may go and still keep what it asks, with
  // Weights::swa_release (a speculative round cuts only inside its own pass).
  static constexpr int32_t kSwaRollback = 256;
  // Bytes of the KV cache resident now: the cache reserves the whole context but holds pages only
  // where positions were written, and hands them back when it is cut back by 64 KiB or more.
  size_t kv_resident_bytes() const { return kv_.resident() + sk_.resident(); }

 private:
  using PackedPtr = std::unique_ptr<specinfer_packed_weight, Weights::PackedFree>;

  void check(const Batch &b) const;
  // With Weights::swa_release, after a pass whose first position is p0: hands back the
  // sliding-window layers' pages of the leading slots no query at p0 - kSwaRollback or later can
  // see (in steps of at least 32 KiB of a layer's keys).
  void release_window(int32_t p0);
  void ensure_capacity(int32_t n_pos);
  // Sets slot positions of the batch's cache slots and builds its attention masks (mask, and for
  // sliding-window layers swa_mask: NULL = causal).
  void prepare_masks(const Batch &b, const uint8_t **mask, const uint8_t **swa_mask);
  // Logits (and hidden states) of rows h[0..b.n_logits), the batch's last tokens after the
  // output norm, with this sequence's extra output rows.
  void limited_logits(const Batch &b, const float *h);
  // forward_many's steps. check_many: throws unless every sequence and batch may run together.
  static void check_many(Model *const *seqs, const Batch *batches, int32_t n_seq);
  // Layer li's new keys kb and values vb (the batch's rows) into the cache after n_cached_, and
  // their key sketches.
  void store_kv(size_t li, const Batch &b, const float *kb, const float *vb);
  // Layer li's attention of the batch's queries q over the cache (kb: its new keys, for the
  // observer), with `mask`, completing a.
  void attend(size_t li, const Batch &b, const float *q, const float *kb, const uint8_t *mask,
              specinfer_attention_args &a);
  // The final norm of every batch's last n_logits rows of x, then their hidden states and logits.
  static void output_logits(Model *const *seqs, const Batch *batches, int32_t n_seq,
                            const std::vector<int64_t> &off, const float *x, Weights::Scratch &sc);

  std::shared_ptr<const Weights> w_;
  const specinfer_kernels *k_;
  int32_t n_cached_ = 0;
  std::vector<uint8_t> key_row_;  // one key head's Q8_0 row, on its way into a tile
  int32_t used_ = 0;              // positions written since the cache's pages were last handed back
  // Every layer's keys and values, reserved for the whole context at the first pass and resident
  // as far as positions were written.
  PageArray kv_;
  struct Cache {
    // Rows of Weights::kv_head_bytes in Weights::kv_type (inside kv_): position p's row of kv
    // head h at p * pos_stride_ + h * head_stride_.
    uint8_t *k = nullptr, *v = nullptr;
    uint8_t *s = nullptr;  // [n_ctx][n_head_kv] key sketches (sketched attention), inside sk_
  };
  std::vector<Cache> cache_;  // per layer
  // Calls fn(array, start, stride) for each region of a layer's cache whose slot j starts at
  // start + j * stride in array: its keys and values per unit (kv head, or all heads) and its
  // key sketches.
  template <typename Fn>
  void each_region(const Cache &c, Fn &&fn);
  size_t kv_region_ = 0;  // bytes of one layer's keys (or values), whole pages
  // Head-major: a row apart, and n_ctx rows rounded up to whole pages apart; by position: a
  // position's rows of every head apart, and a row apart.
  size_t pos_stride_ = 0, head_stride_ = 0;
  // Where position p's rows start in each unit u < kv_units_ of a layer's keys (or values):
  // u * head_stride_ + p * pos_stride_, pos_stride_ bytes long (a head's row, or all heads' rows).
  int32_t kv_units_ = 1;
  PageArray sk_;                   // every layer's key sketches (sketched attention)
  size_t sk_region_ = 0;           // bytes of one layer's sketches, whole pages
  std::vector<int32_t> slot_pos_;  // rope position of each cache slot (for sliding windows)
  // Leading slots whose sliding-window keys were handed back, and the largest position among
  // every slot ever handed back (a query at p sees none of them when p >= it + window).
  int32_t swa_released_ = 0;
  int64_t swa_released_pos_ = INT64_MIN;
  std::vector<float> out_rows_;  // scratch for limited logits
  // With a vocabulary limit, the rows of ids above it that are computed too: their rows in the
  // output matrix's type in the order of extra_ids_, and which ids are in.
  std::vector<uint8_t> extra_rows_;
  std::vector<int32_t> extra_ids_;  // the pinned ones first
  size_t n_pinned_ = 0;
  int32_t extra_cap_ = kDefaultExtraCap;
  std::vector<uint8_t> is_extra_;
  std::vector<float> extra_logits_, extra_row_f_;
  // With a packed output matrix, the extra rows packed the same way, the last row repeated up to
  // whole groups of sixteen (so that layouts of sixteen-row tiles apply to them as to the rest,
  // with the same arithmetic per row: bit-identical logits); rebuilt after add_output_ids.
  std::vector<uint8_t> extra_padded_;
  PackedPtr extra_packed_{nullptr, Weights::PackedFree{nullptr}};
  QkObserver qk_observer_;

  // This sequence's attention masks, grown as needed (a pass's activations are in the Weights'
  // scratch pool).
  std::vector<uint8_t> mask_, swa_mask_;
};

}  // namespace specinfer::gguf
