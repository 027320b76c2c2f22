/*
 * specinfer_plugin.h — the plugin ABI of specinfer.
 *
 * A plugin is a shared object that exports one data symbol, `specinfer_plugin_entry`, of type
 * `specinfer_plugin_descriptor`; or the same descriptor registered in-process with
 * specinfer_registry_register_plugin(). It never links libspecinfer: everything it needs from the
 * host (logging, memory, the backend's kernels and threads, opening another target) comes in the
 * `specinfer_host` table handed to init() and to every factory.
 *
 * Versioning: `abi_version` must equal SPECINFER_PLUGIN_ABI_VERSION of the host, otherwise the
 * loader refuses the plugin with a message naming both versions. Factories are found by versioned
 * string ids; a breaking change to a factory gets a new id and old ids keep working. Every struct
 * begins with its size and only grows at the end: read a field only if struct_size covers it.
 *
 * Errors: plugin calls return a specinfer_status and may write a message into `err` (always
 * non-NULL, NUL-terminated by the plugin). Plugins must not throw or abort across this boundary.
 *
 * Threads: the host calls a target or drafter instance from one thread at a time. init/deinit are
 * called with the registry lock held; init may be called again after deinit.
 */
#ifndef SPECINFER_PLUGIN_H
#define SPECINFER_PLUGIN_H

#include "specinfer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPECINFER_PLUGIN_ABI_VERSION 1u

#define SPECINFER_TARGET_FACTORY_ID "specinfer.target-factory/1"
#define SPECINFER_DRAFTER_FACTORY_ID "specinfer.drafter-factory/1"
#define SPECINFER_CONSTRAINT_FACTORY_ID "specinfer.constraint-factory/1"

#if defined(__GNUC__)
#define SPECINFER_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define SPECINFER_PLUGIN_EXPORT
#endif

/* An error message buffer; a plugin writes a NUL-terminated message into `message`. */
typedef struct specinfer_plugin_error {
  char message[512];
} specinfer_plugin_error;

/* ---------------------------------------------------------------------------------------------
 * Weight types (numbered as in GGUF / ggml, so that file values pass through unchanged)
 * ------------------------------------------------------------------------------------------- */

typedef enum specinfer_wtype {
  SPECINFER_WTYPE_F32 = 0,
  SPECINFER_WTYPE_F16 = 1,
  SPECINFER_WTYPE_Q4_0 = 2,
  SPECINFER_WTYPE_Q4_1 = 3,
  SPECINFER_WTYPE_Q5_0 = 6,
  SPECINFER_WTYPE_Q5_1 = 7,
  SPECINFER_WTYPE_Q8_0 = 8,
  SPECINFER_WTYPE_Q8_1 = 9,
  SPECINFER_WTYPE_Q2_K = 10,
  SPECINFER_WTYPE_Q3_K = 11,
  SPECINFER_WTYPE_Q4_K = 12,
  SPECINFER_WTYPE_Q5_K = 13,
  SPECINFER_WTYPE_Q6_K = 14,
  SPECINFER_WTYPE_Q8_K = 15,
  SPECINFER_WTYPE_BF16 = 30,
  /* specinfer's own, never in a file (GGUF has no such type): blocks of 32 values of 3 bits and
   * one fp16 scale, 14 bytes: d, then 8 bytes holding value j's low 2 bits at bits 2 * (j / 8) of
   * byte j % 8, then 4 bytes holding its third bit at bit j; value = d * (q - 4). For re-quantized
   * draft models (quantize_row), which read 3.5 bits per weight instead of Q4_0's 4.5. */
  SPECINFER_WTYPE_Q3_0 = 1024
} specinfer_wtype;

/* ---------------------------------------------------------------------------------------------
 * Host services: the backend's kernels
 *
 * Layouts: a weight matrix W has n_rows rows of n_cols values, each row row_size(wtype, n_cols)
 * bytes, rows consecutive. Activations X are n_tok rows of n_cols floats; outputs Y are n_tok rows
 * of n_rows floats. Kernels parallelize on the host's thread pool; they are safe to call from any
 * thread, and from inside a forward() call they run on the registry's threads.
 * ------------------------------------------------------------------------------------------- */

typedef struct specinfer_attention_args {
  uint32_t struct_size;
  int32_t n_q;       /* query tokens */
  int32_t n_head;    /* query heads */
  int32_t n_head_kv; /* key/value heads (grouped-query attention: n_head % n_head_kv == 0) */
  int32_t head_dim;
  int32_t n_kv;   /* cached positions attended over, the n_q new ones included (they are last) */
  const float *q; /* [n_q][n_head][head_dim] */
  const float *k; /* [n_kv][n_head_kv][head_dim] */
  const float *v; /* [n_kv][n_head_kv][head_dim] */
  /* [n_q][n_kv], 1 = may attend; NULL = causal: query i attends kv j iff j <= n_kv - n_q + i. */
  const uint8_t *mask;
  float scale; /* usually 1/sqrt(head_dim) */
  float *out;  /* [n_q][n_head][head_dim] */
  /* Added after out (read only if struct_size covers them; a host reads them only if its kernel
   * table has kv_store). How k and v are stored: SPECINFER_WTYPE_F32 (0, the layout above),
   * _F16, _Q8_0 or _Q4_0 (the last two need head_dim a multiple of 32). For a type other than F32
   * the pointer (cast to const float *) holds [n_kv][n_head_kv] rows of row_size(type, head_dim)
   * bytes each, as kv_store writes them. */
  int32_t k_type;
  int32_t v_type;
  /* Added after v_type (read only if struct_size covers them; a host reads them only if its kernel
   * table has key_sketch). Sketched attention, lossy and opt-in: k_sketch NULL = exact attention.
   * Otherwise k_sketch holds [n_kv][n_head_kv] key sketches as key_sketch writes them (rows of
   * 4 + sketch_bits / 8 bytes, sketch_bits a multiple of 32 in 32..1024). A query that sees more
   * than n_sink + n_select + n_window keys attends exactly to its first n_sink visible keys, its
   * last n_window, and the n_select others whose 1-bit QJL estimate of q.k is largest (the
   * largest over the query heads that share a key head); a query that sees fewer attends to all.
   * The choice depends only on the keys the query sees, in order, so a tree node still equals
   * plain decoding of its path. */
  const uint8_t *k_sketch;
  int32_t sketch_bits;
  int32_t n_select;
  int32_t n_window;
  int32_t n_sink;
  /* Added after n_sink (read only if struct_size covers them; a host reads them only if its kernel
   * table's attention_features has SPECINFER_ATTN_STRIDES). Where the rows of k and v are: the row
   * of position j and kv head h starts j * k_pos_stride + h * k_head_stride bytes into k (v alike
   * with v_pos_stride and v_head_stride). All four 0 = the layout above, rows back to back by
   * position. Otherwise each is at least a row's size and no two rows overlap. A head-major cache
   * ([n_head_kv][capacity] rows: pos_stride = a row's size, head_stride = capacity rows) lets each
   * kv head's keys stream from memory in order, which long contexts read faster. k_sketch keeps
   * the layout above. */
  int64_t k_pos_stride;
  int64_t k_head_stride;
  int64_t v_pos_stride;
  int64_t v_head_stride;
  /* Added after v_head_stride (read only if struct_size covers it; a host reads it only if its
   * kernel table's attention_features has SPECINFER_ATTN_KEY_TILES). 0 = keys in rows as above;
   * SPECINFER_KEY_TILE (16) = keys in tiles of 16 positions, for k_type SPECINFER_WTYPE_Q8_0 with
   * k_pos_stride equal to a row's size: the 16 rows of positions 16t .. 16t + 15 of a kv head
   * hold those keys transposed (see specinfer_key_tile_put), so that attention scores 16 keys at
   * once with 8-bit integer products. The query is then rounded to 8 bits per 32 values
   * (d = amax / 127, round to nearest even): a key's score is the integer dot product of the two
   * blocks times both scales, summed over the blocks in order, the same on every instruction
   * set. The whole tile of position n_kv - 1 must be readable; lanes past the keys attended to
   * are read and ignored. */
  int32_t k_tile;
  /* Added after k_tile (read only if struct_size covers it; a host reads it only if its kernel
   * table's attention_features has SPECINFER_ATTN_RESCORE). Sketched attention only: 0 (or at
   * most n_select) = the n_select keys of largest sketch estimate, as above. Larger = the
   * n_rescore keys of largest sketch estimate are candidates, each scored exactly (as exact
   * attention scores it, in k_type and k_tile's layout), and the n_select among them whose exact
   * score comes closest to the largest exact score of one of the query heads that share the key
   * head are attended to: closer to exact attention than the estimate alone, at the cost of
   * the candidates' exact scores. */
  int32_t n_rescore;
} specinfer_attention_args;

/* Bits of specinfer_kernels.attention_features. */
#define SPECINFER_ATTN_STRIDES 1u   /* attention reads k_pos_stride .. v_head_stride */
#define SPECINFER_ATTN_KEY_TILES 2u /* attention reads k_tile */
#define SPECINFER_ATTN_RESCORE 4u   /* attention reads n_rescore */

/* Positions per key tile (specinfer_attention_args.k_tile). */
#define SPECINFER_KEY_TILE 16

/* A key tile of head_dim values (a multiple of 32) is head_dim / 32 blocks of 544 bytes, one per
 * 32 values of the key: the 16 lanes' f16 scales (lane l at byte 2 * l), then 8 groups of 64
 * bytes, group g holding values 4g .. 4g + 3 of each lane (lane l at bytes 32 + 64g + 4l ..), each
 * stored as its Q8_0 value plus 128 (an unsigned byte). A tile takes exactly the bytes of 16 Q8_0
 * rows. specinfer_key_tile_put writes lane `lane` of `tile` from one Q8_0 row (as kv_store writes
 * it); specinfer_key_tile_get reads it back; specinfer_key_tile_move copies lane `from` of one
 * tile to lane `to` of another (or the same) tile, byte for byte. */
static inline void specinfer_key_tile_put(unsigned char *tile, int lane, const unsigned char *row,
                                          int64_t head_dim) {
  for (int64_t b = 0; b < head_dim / 32; ++b) {
    unsigned char *blk = tile + b * 544;
    const unsigned char *src = row + b * 34;
    blk[2 * lane] = src[0];
    blk[2 * lane + 1] = src[1];
    for (int i = 0; i < 32; ++i)
      blk[32 + 64 * (i / 4) + 4 * lane + i % 4] = (unsigned char)(src[2 + i] ^ 0x80u);
  }
}

static inline void specinfer_key_tile_get(const unsigned char *tile, int lane, unsigned char *row,
                                          int64_t head_dim) {
  for (int64_t b = 0; b < head_dim / 32; ++b) {
    const unsigned char *blk = tile + b * 544;
    unsigned char *dst = row + b * 34;
    dst[0] = blk[2 * lane];
    dst[1] = blk[2 * lane + 1];
    for (int i = 0; i < 32; ++i)
      dst[2 + i] = (unsigned char)(blk[32 + 64 * (i / 4) + 4 * lane + i % 4] ^ 0x80u);
  }
}

static inline void specinfer_key_tile_move(const unsigned char *src, int from, unsigned char *dst,
                                           int to, int64_t head_dim) {
  for (int64_t b = 0; b < head_dim / 32; ++b) {
    const unsigned char *s = src + b * 544;
    unsigned char *d = dst + b * 544;
    d[2 * to] = s[2 * from];
    d[2 * to + 1] = s[2 * from + 1];
    for (int g = 0; g < 8; ++g)
      for (int i = 0; i < 4; ++i) d[32 + 64 * g + 4 * to + i] = s[32 + 64 * g + 4 * from + i];
  }
}

/* Opaque: a weight matrix prepared by pack_weight. */
typedef struct specinfer_packed_weight specinfer_packed_weight;

typedef struct specinfer_kernels {
  uint32_t struct_size;
  /* Bytes in one row of n_cols values of type wtype; 0 if the type is unknown or n_cols is not a
   * multiple of the type's block size. */
  size_t (*row_size)(int32_t wtype, int64_t n_cols);
  /* Values per block of wtype (1 for float types, 32 or 256 for quantized); 0 if unknown. */
  int64_t (*block_size)(int32_t wtype);
  /* Decodes n values (a multiple of the block size) of type wtype to floats. */
  specinfer_status (*dequantize_row)(int32_t wtype, const void *src, float *dst, int64_t n);
  /* Y[t][r] = sum_c W[r][c] * X[t][c], for t < n_tok and r < n_rows. Streams W once for all n_tok
   * columns, so n_tok tokens cost about what one does while memory-bound. */
  specinfer_status (*matmul)(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols,
                             const float *x, int64_t n_tok, float *y);
  /* y = x / rms(x) * w (w may be NULL: no scale). y may equal x. */
  void (*rmsnorm)(const float *x, const float *w, int64_t n, float eps, float *y);
  /* Rotary embedding in place on x[n_heads][head_dim] at position pos for the first n_rot dims of
   * each head. neox = 1: rotate pairs (i, i + n_rot/2) (Qwen2, GPT-NeoX); 0: adjacent pairs (Llama
   * GGUF layout). */
  void (*rope)(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
               float freq_base, int32_t neox);
  /* In-place softmax over n values. */
  void (*softmax)(float *x, int64_t n);
  /* Scaled dot-product attention; see specinfer_attention_args. */
  specinfer_status (*attention)(const specinfer_attention_args *args);
  /* gate[i] = silu(gate[i]) * up[i]. */
  void (*silu_mul)(float *gate, const float *up, int64_t n);
  /* y[i] += x[i]. */
  void (*add)(float *y, const float *x, int64_t n);
  /* The instruction set the kernels dispatched to: "avx512", "avx2" or "scalar". */
  const char *(*isa)(void);

  /* Packed weights (added in 0.1; check struct_size before use). pack_weight prepares W for
   * repeated matmuls, reordering it into a faster layout when the type has one (a copy of the
   * weights, see packed_bytes) or else referring to w, which must then outlive the handle. Results
   * equal matmul's up to float summation order, and a token's result never depends on n_tok. */
  specinfer_status (*pack_weight)(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols,
                                  specinfer_packed_weight **out);
  specinfer_status (*matmul_packed)(const specinfer_packed_weight *pw, const float *x,
                                    int64_t n_tok, float *y);
  /* Frees a handle (NULL is a no-op). */
  void (*free_packed)(specinfer_packed_weight *pw);

  /* Added in 0.1 after free_packed (check struct_size before use). Quantizes n floats (a multiple
   * of 32) into row_size(wtype, n) bytes of wtype: SPECINFER_WTYPE_Q4_0 (scale: the block's value
   * of largest magnitude / -8, refitted by least squares), SPECINFER_WTYPE_Q3_0 (the same with
   * -4) or SPECINFER_WTYPE_Q8_0 (amax / 127);
   * UNSUPPORTED for other types, INVALID_ARGUMENT for a bad n, NULL, or inf / NaN in the input.
   * Slow-ish (load time). */
  specinfer_status (*quantize_row)(int32_t wtype, const float *src, void *dst, int64_t n);

  /* Added after quantize_row (check struct_size; may be NULL): bytes of the packed copy a handle
   * owns; 0 when it refers to the matrix given to pack_weight. A caller that gets a copy may let go
   * of the original (free it, or drop its mapped pages). NULL pw gives 0. */
  size_t (*packed_bytes)(const specinfer_packed_weight *pw);

  /* Added after packed_bytes (check struct_size; may be NULL): writes n floats (a multiple of the
   * type's block size) as row_size(wtype, n) bytes of a KV cache type that attention reads
   * (k_type, v_type): SPECINFER_WTYPE_F32 (a copy), _F16 (round to nearest even), _Q8_0 (per 32
   * values d = amax / 127) or _Q4_0 (as quantize_row). UNSUPPORTED for any other type,
   * INVALID_ARGUMENT for a bad n, NULL, or (block types) inf / NaN in the input. Fast enough to
   * run on every new key and value. A host whose table has this entry reads k_type and v_type. */
  specinfer_status (*kv_store)(int32_t wtype, const float *src, void *dst, int64_t n);

  /* Added after kv_store (check struct_size; may be NULL): rope with a frequency per pair, for
   * scaled RoPE (linear, YaRN, Llama 3's per-pair factors). Pair i (as rope numbers them) turns by
   * the angle pos * inv_freq[i]; inv_freq holds n_rot / 2 values. Both rotated values are then
   * multiplied by mscale (YaRN's attention factor; 1 for none). */
  void (*rope_freqs)(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
                     const double *inv_freq, float mscale, int32_t neox);

  /* Added after rope_freqs (check struct_size; may be NULL): the key sketches of sketched
   * attention (specinfer_attention_args.k_sketch). Writes n_rows rows of head_dim floats (keys
   * after RoPE) as n_rows sketches of 4 + bits / 8 bytes each: the key's norm (float32), then the
   * signs of a fixed random Gaussian projection to `bits` dimensions (the library's qjl
   * sketcher), bit r of byte r / 8 set when coordinate r is >= 0. INVALID_ARGUMENT for NULL,
   * bits not a multiple of 32 in 32..1024, a bad size, or inf / NaN in the input. */
  specinfer_status (*key_sketch)(const float *k, int64_t n_rows, int64_t head_dim, int32_t bits,
                                 void *dst);

  /* Added after key_sketch (check struct_size): what attention reads beyond the fields a host
   * announces through the entries above, as SPECINFER_ATTN_* bits. */
  uint32_t attention_features;
} specinfer_kernels;

/* ---------------------------------------------------------------------------------------------
 * Targets
 * ------------------------------------------------------------------------------------------- */

/* One batched forward pass. The n_tokens tokens are appended to the KV cache after the positions
 * already cached (their cache slots are n_cached .. n_cached + n_tokens - 1). */
typedef struct specinfer_forward_batch {
  uint32_t struct_size;
  int32_t n_tokens;
  const int32_t *tokens;    /* [n_tokens] */
  const int32_t *positions; /* [n_tokens] positions for the rotary embedding */
  /* [n_tokens][n_tokens], 1 = batch token i may attend batch token j; every cached position is
   * always visible. NULL = causal within the batch. A token tree sets it from parent links. */
  const uint8_t *tree_mask;
  int32_t n_logits; /* logits for the last n_logits batch tokens (0 .. n_tokens) */
  float *logits;    /* out: [n_logits][vocab_size] */
  float *hidden;    /* out, optional (NULL): [n_logits][hidden_size] last hidden state */
  /* Added after hidden (read only if struct_size covers them). Optional (NULL: none): a target
   * that exposes its attention inputs calls qk_observer(qk_ctx, view) once per layer of the pass,
   * in layer order, during the call and one at a time (specinfer_qk_view); one that does not
   * ignores it. */
  specinfer_qk_observer qk_observer;
  void *qk_ctx;
} specinfer_forward_batch;

typedef struct specinfer_target_vtable {
  uint32_t struct_size;
  void (*destroy)(void *self);
  specinfer_status (*info)(void *self, specinfer_model_info *info);
  specinfer_status (*tokenize)(void *self, const char *text, size_t len, int32_t add_special,
                               int32_t parse_special, int32_t *tokens, size_t cap, size_t *n_tokens,
                               specinfer_plugin_error *err);
  /* The raw bytes of one token (possibly part of a UTF-8 character). BUFFER_TOO_SMALL with
   * *n_bytes = size needed when cap is too small. */
  specinfer_status (*token_bytes)(void *self, int32_t token, char *buf, size_t cap, size_t *n_bytes,
                                  specinfer_plugin_error *err);
  /* The host checks every pass (forward and forward_many alike): the cache must hold exactly
   * n_tokens more positions afterwards (kv_size), and every logit row must be finite except for
   * -inf, which rules a token out; a row needs at least one finite logit. A NaN or +inf logit, a
   * row of only -inf, or a wrong cache size fails the call with SPECINFER_ERR_PLUGIN and a
   * message naming the row and token; so does an error status, the plugin's own. In every such
   * case the host truncates the cache back to its size before the pass, so the session's next
   * call starts from a cache that matches its text: a session never samples or takes the argmax
   * of NaN, and never emits a token chosen from a broken row. */
  specinfer_status (*forward)(void *self, const specinfer_forward_batch *batch,
                              specinfer_plugin_error *err);
  /* Number of positions in the KV cache. */
  int32_t (*kv_size)(void *self);
  /* Drops every cached position from n_keep on. When the host's features have
   * SPECINFER_HOST_SHORT_TRUNCATE, a target may keep fewer positions than n_keep (down to 0): a
   * cache whose sliding-window layers have dropped keys that the position after n_keep would
   * see. The caller reads kv_size afterwards and feeds again from there. */
  specinfer_status (*kv_truncate)(void *self, int32_t n_keep, specinfer_plugin_error *err);
  /* Tree acceptance: keeps cached positions base + idx[0..n) (increasing), moved to base .. base+n,
   * and drops the rest from base on. */
  specinfer_status (*kv_keep)(void *self, int32_t base, const int32_t *idx, int32_t n,
                              specinfer_plugin_error *err);

  /* Added after kv_keep (check struct_size; may be NULL): writes the rows of the output
   * (unembedding) matrix for token ids[0..n) as floats, out[i][hidden_size], so that a token's
   * logit is its row's dot product with forward_batch.hidden. For drafters that score the target's
   * hidden state with its own output layer (Medusa heads). No KV cache is touched: a drafter may
   * call it. UNSUPPORTED when logits are not a plain product of the hidden state. */
  specinfer_status (*output_rows)(void *self, const int32_t *ids, int32_t n, float *out,
                                  specinfer_plugin_error *err);
  /* Added after output_rows (check struct_size; either may be NULL): one loaded model, many
   * sequences.
   * share: a new instance on the same loaded model, with an empty KV cache of its own. The weights
   * (and tokenizer) are shared, not copied, and stay loaded until the last instance sharing them is
   * destroyed, in any order. Instances sharing a model may be called from different threads at
   * the same time (each instance still by one thread at a time). */
  specinfer_status (*share)(void *self, void **out, specinfer_plugin_error *err);
  /* One pass for n instances that share a model (each at most once): selves[i] takes batches[i]
   * as forward() would, and gets the results its own forward() would give; the weights are read
   * once for all their tokens, which on a memory-bound CPU costs about what one instance's pass
   * does. The caller holds all n instances for the call. On error no instance's cache changes. */
  specinfer_status (*forward_many)(void *const *selves, const specinfer_forward_batch *batches,
                                   int32_t n, specinfer_plugin_error *err);
  /* Added after forward_many (check struct_size; may be NULL): makes self's cache hold the first
   * n positions of src's (0 <= n <= src's kv_size), src being an instance on self's loaded model
   * (share), as if self had been fed src's first n tokens: the keys and values are copied, not
   * computed again (a prompt scored once for several continuations). UNSUPPORTED when this cache
   * cannot be copied (the caller then scores the tokens itself). The caller holds both instances
   * for the call; src does not change. On error self's cache is empty. */
  specinfer_status (*kv_copy)(void *self, void *src, int32_t n, specinfer_plugin_error *err);
} specinfer_target_vtable;

typedef struct specinfer_host specinfer_host;

typedef struct specinfer_target_factory {
  uint32_t struct_size;
  /* Creates a target instance from a key=value,... config; unknown keys must be refused with
   * SPECINFER_ERR_CONFIG. On success *self is handed to the vtable's functions. */
  specinfer_status (*create)(const specinfer_host *host, const char *config, void **self,
                             const specinfer_target_vtable **vtable, specinfer_plugin_error *err);
} specinfer_target_factory;

/* A target opened for a plugin through the host (for instance a draft model inside a drafter). */
typedef struct specinfer_host_target {
  void *self;
  const specinfer_target_vtable *vtable;
  void *host_handle; /* the host's, pass back to close_target */
} specinfer_host_target;

/* ---------------------------------------------------------------------------------------------
 * Drafters
 * ------------------------------------------------------------------------------------------- */

/* Draws one token from a draft distribution q the way the session's coupler wants the draft side
 * sampled (shared randomness for the Gumbel and MinHash couplers). `position` is the index in the
 * whole token sequence of the token being drafted. */
typedef int32_t (*specinfer_draft_sample_fn)(const void *ctx, const float *q, int32_t vocab,
                                             int64_t position);

typedef struct specinfer_draft_request {
  uint32_t struct_size;
  int32_t max_tokens;     /* draft at most this many nodes */
  int32_t allow_tree;     /* 1 if the session verifies trees; 0 = propose a chain */
  const int32_t *context; /* the whole committed sequence, prompt included */
  size_t n_context;
  float temperature; /* the session's sampling settings, for drafters that sample */
  uint64_t seed;
  specinfer_draft_sample_fn sample; /* the coupler's draft side */
  const void *sample_ctx;

  /* Added after sample_ctx (read only if struct_size covers them). */
  /* The target's last hidden state (the input of its output layer, see forward_batch.hidden) at
   * sequence index hidden_position, which is n_context - 2: the position whose logits chose the
   * last committed token. NULL when the session has none (then hidden_position is -1). */
  const float *hidden;
  int32_t hidden_size;
  int64_t hidden_position;
  /* pass_cost[i], i < n_pass_cost: the time of one target pass over i + 1 tokens (the last
   * committed token and i nodes) relative to a one-token pass, as measured by the session on this
   * machine (interpolated where not measured yet). A drafter that chooses its own tree size
   * weighs the tokens a node is expected to add against this cost. n_pass_cost = max_tokens + 1.
   * When sessions share a pass (specinfer_session_step_many), pass_cost[i] is 1 plus the time i
   * nodes add to the shared pass over the step's time per expected token without them: a node
   * pays where it raises the tokens per second of the whole step. */
  const float *pass_cost;
  int32_t n_pass_cost;
} specinfer_draft_request;

/* A draft, written by the drafter into arrays the host allocated for `cap` nodes. */
typedef struct specinfer_draft {
  uint32_t struct_size;
  int32_t cap; /* room for this many nodes */
  int32_t vocab_size;
  int32_t n_nodes;  /* out: nodes proposed (0 = nothing to propose) */
  int32_t *tokens;  /* out: [cap] */
  int32_t *parents; /* out: [cap] parent node, -1 = the last committed token; chain: i-1 */
  /* out: [cap][vocab_size] the distribution q each node's token was drawn from. The drafter sets
   * has_probs = 0 for point masses (deterministic drafters), then `probs` is ignored. */
  float *probs;
  int32_t has_probs;
  /* Added after has_probs (written only if struct_size covers it). out, optional: how many of the
   * nodes the drafter expects the target to keep, by its own estimates (the expected length of
   * the accepted path, 0 .. n_nodes). The host sets -1 (no estimate) before the call; a drafter
   * without estimates leaves it. The session reports it beside what the target kept
   * (specinfer_session_stats), so that a user sees how well a drafter knows its own drafts. */
  double expected_accepted;
} specinfer_draft;

typedef struct specinfer_drafter_vtable {
  uint32_t struct_size;
  void (*destroy)(void *self);
  /* A new sequence begins (after reset, or when a session is created). */
  specinfer_status (*begin)(void *self, const int32_t *context, size_t n,
                            specinfer_plugin_error *err);
  specinfer_status (*propose)(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                              specinfer_plugin_error *err);
  /* Tokens appended to the sequence (prompt, or accepted draft plus the corrected token). */
  specinfer_status (*commit)(void *self, const int32_t *tokens, size_t n,
                             specinfer_plugin_error *err);

  /* Added after commit (read only if struct_size covers it; may be NULL): drafts for n drafters
   * of this plugin at once, each as its own propose would (the same nodes and distributions):
   * selves[i] answers reqs[i] into outs[i], with status[i] and errs[i] its result. A drafter that
   * runs a model of its own can then run one pass for all of them per draft depth (the target's
   * forward_many) instead of one after another. The host calls it for the sessions stepped
   * together (specinfer_session_step_many) whose drafters come from this plugin, each drafter at
   * most once. Returns SPECINFER_OK when every status[i] is; a failure of one drafter is its own
   * and leaves the others' drafts standing. */
  specinfer_status (*propose_many)(void *const *selves, const specinfer_draft_request *reqs,
                                   specinfer_draft *outs, int32_t n, specinfer_status *status,
                                   specinfer_plugin_error *errs);
} specinfer_drafter_vtable;

typedef struct specinfer_drafter_factory {
  uint32_t struct_size;
  /* Creates a drafter for a target whose info is `target_info`; unknown config keys must be
   * refused with SPECINFER_ERR_CONFIG. `target` is the session's target (do not run forward on it:
   * its KV cache belongs to the session); use its tokenizer if needed. It stays open while the
   * drafter is, so the drafter may keep it and make the calls that do not touch the KV cache
   * (info, tokenize, token_bytes, output_rows) from its own functions as well. */
  specinfer_status (*create)(const specinfer_host *host, const char *config,
                             const specinfer_model_info *target_info,
                             const specinfer_host_target *target, void **self,
                             const specinfer_drafter_vtable **vtable, specinfer_plugin_error *err);

  /* Added after create (check struct_size; NULL = the drafter needs no training). Trains the
   * drafter's weights for `target` and writes them to params->out_path (see
   * specinfer_drafter_train). The target is the trainer's alone for the call: it may run forward
   * and reset the KV cache. Calls params->progress (if set) now and then; a nonzero return from it
   * stops the training with SPECINFER_ERR_CANCELLED. */
  specinfer_status (*train)(const specinfer_host *host, const specinfer_train_params *params,
                            const specinfer_model_info *target_info,
                            const specinfer_host_target *target, specinfer_plugin_error *err);
} specinfer_drafter_factory;

/* ---------------------------------------------------------------------------------------------
 * Constraints: which tokens may come next (JSON schemas, regular expressions, grammars)
 *
 * A constraint instance holds a grammar's state over the tokens generated so far. The host calls
 * an instance from one thread at a time; instances (forks included) are independent of each other
 * and may be used from different threads at once.
 * ------------------------------------------------------------------------------------------- */

/* Bits of specinfer_constraint_vtable.state's result. */
#define SPECINFER_CONSTRAINT_ACCEPTING 1u /* the text so far is complete: it may end here */
#define SPECINFER_CONSTRAINT_STOPPED                          \
  2u /* the grammar has ended: nothing but the end may follow \
      */

typedef struct specinfer_constraint_vtable {
  uint32_t struct_size;
  void (*destroy)(void *self);
  /* Writes the tokens allowed next as a bitmask of n_words = (vocab_size + 31) / 32 words: token
   * t is allowed when bit t % 32 of mask[t / 32] is set. Where the text may end (ACCEPTING) the
   * target's end-of-generation tokens are allowed. The host asks only before the constraint has
   * STOPPED (the text ends there), and refuses a mask that allows no token. */
  specinfer_status (*mask)(void *self, uint32_t *mask, int32_t n_words,
                           specinfer_plugin_error *err);
  /* Advances by one token. A token the mask does not allow is refused with INVALID_ARGUMENT and
   * changes nothing. */
  specinfer_status (*consume)(void *self, int32_t token, specinfer_plugin_error *err);
  /* Takes back the last n consumed tokens (n at most the tokens consumed since creation or the
   * fork); INVALID_ARGUMENT beyond that. */
  specinfer_status (*rollback)(void *self, int32_t n, specinfer_plugin_error *err);
  /* A new instance in this one's state that goes on independently (a tree branch, another
   * session on the same grammar without compiling it again). Destroyed with destroy. */
  specinfer_status (*fork)(void *self, void **out, specinfer_plugin_error *err);
  /* The tokens the constraint forces from here: the only way the text can go on, as the target
   * tokenizes it (at most cap of them into tokens, their number in *n; 0 when there is a choice).
   * Each is allowed by the mask at its position. */
  specinfer_status (*forced)(void *self, int32_t *tokens, int32_t cap, int32_t *n,
                             specinfer_plugin_error *err);
  /* SPECINFER_CONSTRAINT_* bits of the current state into *state. */
  specinfer_status (*state)(void *self, uint32_t *state, specinfer_plugin_error *err);
} specinfer_constraint_vtable;

typedef struct specinfer_constraint_factory {
  uint32_t struct_size;
  /* Compiles `grammar` (NUL-terminated) of `kind` ("json_schema", "json_object", "regex",
   * "lark", or others the plugin names) for the vocabulary of `target`, whose info is
   * `target_info`; unknown config keys must be refused with SPECINFER_ERR_CONFIG, an unknown kind
   * with SPECINFER_ERR_UNSUPPORTED and a grammar that does not compile with
   * SPECINFER_ERR_INVALID_ARGUMENT, each with a message saying why. `target` is open while the
   * instance (and any fork of it) is; only the calls that do not touch its KV cache (info,
   * tokenize, token_bytes) may be made on it, from any of the instance's functions. */
  specinfer_status (*create)(const specinfer_host *host, const char *config,
                             const specinfer_model_info *target_info,
                             const specinfer_host_target *target, const char *kind,
                             const char *grammar, void **self,
                             const specinfer_constraint_vtable **vtable,
                             specinfer_plugin_error *err);
} specinfer_constraint_factory;

/* ---------------------------------------------------------------------------------------------
 * The host table and the plugin descriptor
 * ------------------------------------------------------------------------------------------- */

struct specinfer_host {
  uint32_t struct_size;
  uint32_t abi_version; /* SPECINFER_PLUGIN_ABI_VERSION of the host */
  void *host_data;      /* the host's; do not touch */
  /* Logs one message at a level (specinfer_log_level). */
  void (*log)(const specinfer_host *host, int32_t level, const char *message);
  /* Aligned allocation (align a power of two, at least sizeof(void*)); NULL on failure. */
  void *(*alloc)(size_t size, size_t align);
  void (*free)(void *ptr);
  /* Runs fn(ctx, begin, end) over [0, n) in chunks of at least `grain` on the host's threads and
   * returns when all are done. */
  void (*parallel_for)(const specinfer_host *host, int64_t n, int64_t grain,
                       void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);
  int32_t n_threads;
  const specinfer_kernels *kernels;
  /* Opens another target (e.g. a draft model) through the registry; close it with close_target. */
  specinfer_status (*open_target)(const specinfer_host *host, const char *plugin,
                                  const char *config, specinfer_host_target *out,
                                  specinfer_plugin_error *err);
  void (*close_target)(const specinfer_host *host, specinfer_host_target *target);
  /* Added after close_target (read only if struct_size covers it): SPECINFER_HOST_* bits. */
  uint32_t features;
};

/* Bits of specinfer_host.features. */
#define SPECINFER_HOST_SHORT_TRUNCATE 1u /* kv_truncate may keep fewer positions than asked */

typedef struct specinfer_plugin_descriptor {
  uint32_t abi_version; /* SPECINFER_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size; /* sizeof(specinfer_plugin_descriptor) */
  const char *name;     /* short unique name: "kgram", "ngram", "gguf" */
  const char *version;  /* the plugin's own version */
  const char *description;
  /* Called before any factory is used; may be NULL. Nonzero return = failure. */
  int32_t (*init)(const specinfer_host *host);
  /* Called before unload; may be NULL. */
  void (*deinit)(void);
  /* Returns the factory for an id such as SPECINFER_TARGET_FACTORY_ID, or NULL. */
  const void *(*get_factory)(const char *factory_id);
} specinfer_plugin_descriptor;

/* In a plugin:  SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry =
 * { SPECINFER_PLUGIN_ABI_VERSION, sizeof(specinfer_plugin_descriptor), "name", ... }; */

#ifdef __cplusplus
}
#endif

#endif /* SPECINFER_PLUGIN_H */
