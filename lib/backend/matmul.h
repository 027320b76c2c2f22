// Matrix times several activation columns: Y[t][r] = sum_c W[r][c] * X[t][c].
//
// Decoding is memory-bound, so the kernels stream each weight row once and apply it to a tile of
// up to several tokens while it sits in L1. Quantized weights multiply int8-quantized activations
// (ActQ8 / ActQ8K, quantized once per call); float weights multiply float activations. Rows are
// split over oneTBB tasks (in the caller's task_arena). F32 weights with kBlasMinTokens tokens or
// more go to OpenBLAS sgemm instead (prefill). Quantized weights always take the row kernels: they
// are as fast as dequantize + sgemm for prefill on this class of CPU, and a token's result then
// never depends on the batch it is computed in, at any batch size (exact speculative decoding).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "backend/quant.h"
#include "util/isa.h"

namespace specinfer {

// The tokens from which the sgemm path is used.
constexpr int64_t kBlasMinTokens = 32;

enum class MatmulPath {
  automatic,  // row kernels; sgemm for F32 weights from kBlasMinTokens tokens on
  kernels,    // always the row kernels of the chosen instruction set
  blas        // always dequantize + sgemm (panels one after another: OpenBLAS gives wrong or
              // run-to-run different results when called concurrently from several threads)
};

// One call's operands, as seen by a row kernel.
struct MatmulArgs {
  int32_t wtype = 0;
  const uint8_t *w = nullptr;  // n_rows rows of row_bytes
  size_t row_bytes = 0;
  int64_t n_rows = 0, n_cols = 0, n_tok = 0;
  const float *x = nullptr;     // [n_tok][n_cols]
  const void *xq = nullptr;     // [n_tok][xq_blocks] ActQ8 or ActQ8K (per act_kind), or null
  int64_t xq_blocks = 0;        // activation blocks per token
  const float *xaux = nullptr;  // kernel-specific per-block activation data (see below), or null
  float *y = nullptr;           // [n_tok][n_rows]
};

// Computes rows [r0, r1) of Y for every token.
using MatmulRowsFn = void (*)(const MatmulArgs &args, int64_t r0, int64_t r1);

// Row kernels per instruction set; nullptr when that set has no kernel for the type (the caller
// then falls back to the next lower set). The scalar set covers every type.
MatmulRowsFn matmul_kernel_scalar(int32_t wtype) noexcept;
MatmulRowsFn matmul_kernel_avx2(int32_t wtype) noexcept;
MatmulRowsFn matmul_kernel_avx512(int32_t wtype) noexcept;

// How an AVX2 kernel wants its ActQ8K activations prepared (once per call, by the dispatcher):
//  quarters_subsums: qs in act_pair_quarters order, and MatmulArgs::xaux = act_sub_sums;
//  lanes16: qs in act_pair_lanes16 order.
// (Q4_K: quarters_subsums; Q6_K with more than one token: lanes16; everything else: none.)
enum class ActPrep { none, quarters_subsums, lanes16 };
ActPrep matmul_avx2_act_prep(int32_t wtype, int64_t n_tok) noexcept;
// Paired order: in every 64-value chunk of the activation blocks' qs, the 16-byte quarters 1 and 2
// are swapped (bsums and d unchanged). Its own inverse.
void act_pair_quarters(ActQ8K *a, int64_t n_blocks) noexcept;
// Lane-paired order: every 64-value chunk of qs, seen as 32 int16 lanes A[0..15] | B[0..15],
// becomes C | D with C[k] = A[k] (k even) or B[k] (k odd) and D[k] = A[k + 1] (k even) or
// B[k - 1] (k odd); bsums and d unchanged.
void act_pair_lanes16(ActQ8K *a, int64_t n_blocks) noexcept;
// AVX2 versions of quantize_act_q8 / quantize_act_q8k (quant.h), bit-identical to them; only on
// a CPU with AVX2.
void quantize_act_q8_avx2(const float *x, ActQ8 *out, int64_t n) noexcept;
void quantize_act_q8k_avx2(const float *x, ActQ8K *out, int64_t n) noexcept;
// out[8 * b + j] = a[b].d * (bsums[2j] + bsums[2j + 1]).
void act_sub_sums(const ActQ8K *a, int64_t n_blocks, float *out) noexcept;

// The matmul of the active instruction set (see isa.h). Throws specinfer::Error:
// INVALID_ARGUMENT for NULL pointers, non-positive sizes or n_cols not a multiple of the block;
// UNSUPPORTED for an unknown type.
void matmul(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
            int64_t n_tok, float *y);

// The same with an explicit instruction set (must be available on this CPU) and path; for tests
// and benchmarks.
void matmul_with(Isa isa, MatmulPath path, int32_t wtype, const void *w, int64_t n_rows,
                 int64_t n_cols, const float *x, int64_t n_tok, float *y);
// The row kernel fn, written for instruction set fn_isa (which decides how its activations are
// prepared), run as matmul runs its own (tests: the AVX-512 kernels in emulation). Throws like
// matmul; UNSUPPORTED if this CPU cannot prepare the activations (AVX2 for fn_isa >= avx2).
void matmul_rows_with(MatmulRowsFn fn, Isa fn_isa, int32_t wtype, const void *w, int64_t n_rows,
                      int64_t n_cols, const float *x, int64_t n_tok, float *y);

// Rows (or groups of rows) per oneTBB task for a matmul over n_rows of row_bytes each (in the
// caller's arena).
int64_t matmul_row_grain(int64_t n_rows, size_t row_bytes);

// Calls fn(r0, r1) over [0, n_rows) in matmul_row_grain chunks: inline when one chunk covers it,
// else as oneTBB tasks in the caller's arena. Chunks start at multiples of kUnit rows and hold
// whole groups of kUnit (but the last): the AVX-512 packed kernels run four rows at a time, or
// sixteen (q4k_r16).
template <int64_t kUnit = 4, class Fn>
void for_row_ranges(int64_t n_rows, size_t row_bytes, Fn &&fn) {
  const int64_t units = (n_rows + kUnit - 1) / kUnit;
  const int64_t grain = matmul_row_grain(units, row_bytes * kUnit);
  if (units <= grain) {
    fn(int64_t{0}, n_rows);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, units, grain),
                    [&](const tbb::blocked_range<int64_t> &r) {
                      fn(r.begin() * kUnit, std::min(r.end() * kUnit, n_rows));
                    });
}

// Fast dequantization of n values (a multiple of the block size); same results as
// dequantize_row_ref. Throws like dequantize_row_ref.
void dequantize_row(int32_t wtype, const void *src, float *dst, int64_t n);

}  // namespace specinfer
