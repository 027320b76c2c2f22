#include "backend/kernel_table.h"

#include <new>

#include "backend/attention.h"
#include "backend/attention_sketch.h"
#include "backend/matmul.h"
#include "backend/ops.h"
#include "backend/packed.h"
#include "backend/quant.h"
#include "util/error.h"
#include "util/isa.h"

namespace specinfer {

namespace {

// Runs fn, turning exceptions into status codes (the table is a C ABI).
template <class F>
specinfer_status guarded(F &&fn) noexcept {
  try {
    fn();
    return SPECINFER_OK;
  } catch (const Error &e) {
    return e.code();
  } catch (const std::bad_alloc &) {
    return SPECINFER_ERR_OUT_OF_MEMORY;
  } catch (...) {
    return SPECINFER_ERR_INTERNAL;
  }
}

size_t k_row_size(int32_t wtype, int64_t n_cols) {
  return wtype_row_size(wtype, n_cols);
}

int64_t k_block_size(int32_t wtype) {
  return wtype_block_size(wtype);
}

specinfer_status k_dequantize_row(int32_t wtype, const void *src, float *dst, int64_t n) {
  return guarded([&] { dequantize_row(wtype, src, dst, n); });
}

specinfer_status k_matmul(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols,
                          const float *x, int64_t n_tok, float *y) {
  return guarded([&] { matmul(wtype, w, n_rows, n_cols, x, n_tok, y); });
}

void k_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
  rmsnorm(x, w, n, eps, y);
}

void k_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
            float freq_base, int32_t neox) {
  rope(x, n_heads, head_dim, n_rot, pos, freq_base, neox);
}

void k_rope_freqs(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, int64_t pos,
                  const double *inv_freq, float mscale, int32_t neox) {
  rope_freqs(x, n_heads, head_dim, n_rot, pos, inv_freq, mscale, neox);
}

void k_softmax(float *x, int64_t n) {
  softmax(x, n);
}

specinfer_status k_attention(const specinfer_attention_args *args) {
  if (args == nullptr) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guarded([&] { attention(*args); });
}

void k_silu_mul(float *gate, const float *up, int64_t n) {
  silu_mul(gate, up, n);
}

void k_add(float *y, const float *x, int64_t n) {
  add(y, x, n);
}

const char *k_isa() {
  return backend_isa();
}

// The opaque ABI handle is the backend's PackedWeight.
specinfer_status k_pack_weight(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols,
                               specinfer_packed_weight **out) {
  if (out == nullptr) return SPECINFER_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded([&] {
    *out = reinterpret_cast<specinfer_packed_weight *>(
        pack_weight(wtype, w, n_rows, n_cols).release());
  });
}

specinfer_status k_matmul_packed(const specinfer_packed_weight *pw, const float *x, int64_t n_tok,
                                 float *y) {
  if (pw == nullptr) return SPECINFER_ERR_INVALID_ARGUMENT;
  return guarded([&] { matmul_packed(*reinterpret_cast<const PackedWeight *>(pw), x, n_tok, y); });
}

void k_free_packed(specinfer_packed_weight *pw) {
  delete reinterpret_cast<PackedWeight *>(pw);
}

specinfer_status k_quantize_row(int32_t wtype, const float *src, void *dst, int64_t n) {
  return guarded([&] { quantize_row_ref(wtype, src, dst, n); });
}

size_t k_packed_bytes(const specinfer_packed_weight *pw) {
  if (pw == nullptr) return 0;
  const auto &p = *reinterpret_cast<const PackedWeight *>(pw);
  return p.owned ? p.packed_bytes : 0;
}

specinfer_status k_kv_store(int32_t wtype, const float *src, void *dst, int64_t n) {
  return guarded([&] { kv_store(wtype, src, dst, n); });
}

specinfer_status k_key_sketch(const float *k, int64_t n_rows, int64_t head_dim, int32_t bits,
                              void *dst) {
  return guarded([&] { key_sketch(k, n_rows, head_dim, bits, dst); });
}

// What attention reads beyond the first arguments (specinfer_kernels.attention_features).
constexpr uint32_t kAttentionFeatures =
    SPECINFER_ATTN_STRIDES | SPECINFER_ATTN_KEY_TILES | SPECINFER_ATTN_RESCORE;

}  // namespace

const specinfer_kernels *backend_kernel_table() {
  static const specinfer_kernels table = {sizeof(specinfer_kernels),
                                          k_row_size,
                                          k_block_size,
                                          k_dequantize_row,
                                          k_matmul,
                                          k_rmsnorm,
                                          k_rope,
                                          k_softmax,
                                          k_attention,
                                          k_silu_mul,
                                          k_add,
                                          k_isa,
                                          k_pack_weight,
                                          k_matmul_packed,
                                          k_free_packed,
                                          k_quantize_row,
                                          k_packed_bytes,
                                          k_kv_store,
                                          k_rope_freqs,
                                          k_key_sketch,
                                          kAttentionFeatures};
  return &table;
}

const char *backend_isa() {
  return isa_name(active_isa());
}

}  // namespace specinfer
