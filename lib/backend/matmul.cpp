// Matmul dispatch: argument checks, activation quantization, the row split over oneTBB tasks, and
// the dequantize + OpenBLAS sgemm path for many tokens.
#include "backend/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "util/error.h"

namespace specinfer {

namespace {

// The kernel of the highest set up to `isa` that has one for wtype; *picked = its set.
MatmulRowsFn pick_kernel(Isa isa, int32_t wtype, Isa *picked) {
  MatmulRowsFn fn = nullptr;
  *picked = isa;
  if (isa == Isa::avx512) fn = matmul_kernel_avx512(wtype);
  if (fn == nullptr && static_cast<int>(isa) >= static_cast<int>(Isa::avx2)) {
    fn = matmul_kernel_avx2(wtype);
    *picked = Isa::avx2;
  }
  if (fn == nullptr) {
    fn = matmul_kernel_scalar(wtype);
    *picked = Isa::scalar;
  }
  return fn;
}

// Checks one call's operands and returns them as MatmulArgs.
MatmulArgs checked_args(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols,
                        const float *x, int64_t n_tok, float *y) {
  const int64_t bs = wtype_block_size(wtype);
  if (bs == 0) fail(SPECINFER_ERR_UNSUPPORTED, "matmul: unknown weight type %d", wtype);
  if (n_rows <= 0 || n_cols <= 0 || n_tok <= 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "matmul: sizes must be positive (rows %lld, cols %lld, tokens %lld)",
         static_cast<long long>(n_rows), static_cast<long long>(n_cols),
         static_cast<long long>(n_tok));
  if (n_cols % bs != 0)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: %lld columns is not a multiple of %lld (%s)",
         static_cast<long long>(n_cols), static_cast<long long>(bs), wtype_name(wtype));
  if (w == nullptr || x == nullptr || y == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: NULL weight, input or output");
  if (n_cols > (int64_t{1} << 30) || n_rows >= (int64_t{1} << 31) || n_tok > (int64_t{1} << 24))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: sizes too large");
  MatmulArgs a;
  a.wtype = wtype;
  a.w = static_cast<const uint8_t *>(w);
  a.row_bytes = wtype_row_size(wtype, n_cols);
  a.n_rows = n_rows;
  a.n_cols = n_cols;
  a.n_tok = n_tok;
  a.x = x;
  a.y = y;
  return a;
}

// Quantizes and prepares the activations as row kernel fn of instruction set `picked` wants them,
// then runs it over all rows.
void run_rows(MatmulRowsFn fn, Isa picked, const MatmulArgs &base) {
  MatmulArgs a = base;
  const ActKind kind = act_kind(a.wtype);
  std::vector<uint8_t> act;
  std::vector<float> aux;
  if (kind == ActKind::q8) {
    a.xq_blocks = a.n_cols / kQK;
    act.resize(static_cast<size_t>(a.n_tok * a.xq_blocks) * sizeof(ActQ8));
    auto *q = reinterpret_cast<ActQ8 *>(act.data());
    const bool simd = static_cast<int>(picked) >= static_cast<int>(Isa::avx2);
    for (int64_t t = 0; t < a.n_tok; ++t) {
      if (simd)
        quantize_act_q8_avx2(a.x + t * a.n_cols, q + t * a.xq_blocks, a.n_cols);
      else
        quantize_act_q8(a.x + t * a.n_cols, q + t * a.xq_blocks, a.n_cols);
    }
    a.xq = q;
  } else if (kind == ActKind::q8k) {
    a.xq_blocks = a.n_cols / kQKK;
    act.resize(static_cast<size_t>(a.n_tok * a.xq_blocks) * sizeof(ActQ8K));
    auto *q = reinterpret_cast<ActQ8K *>(act.data());
    const bool simd = static_cast<int>(picked) >= static_cast<int>(Isa::avx2);
    for (int64_t t = 0; t < a.n_tok; ++t) {
      if (simd)
        quantize_act_q8k_avx2(a.x + t * a.n_cols, q + t * a.xq_blocks, a.n_cols);
      else
        quantize_act_q8k(a.x + t * a.n_cols, q + t * a.xq_blocks, a.n_cols);
    }
    const ActPrep prep =
        picked == Isa::avx2 ? matmul_avx2_act_prep(a.wtype, a.n_tok) : ActPrep::none;
    if (prep == ActPrep::quarters_subsums) {
      act_pair_quarters(q, a.n_tok * a.xq_blocks);
      aux.resize(static_cast<size_t>(a.n_tok * a.xq_blocks) * 8);
      act_sub_sums(q, a.n_tok * a.xq_blocks, aux.data());
      a.xaux = aux.data();
    } else if (prep == ActPrep::lanes16) {
      act_pair_lanes16(q, a.n_tok * a.xq_blocks);
    }
    a.xq = q;
  }
  for_row_ranges(a.n_rows, a.row_bytes, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
}

void run_kernels(Isa isa, const MatmulArgs &a) {
  Isa picked;
  MatmulRowsFn fn = pick_kernel(isa, a.wtype, &picked);
  if (fn == nullptr)
    fail(SPECINFER_ERR_UNSUPPORTED, "matmul: no kernel for %s", wtype_name(a.wtype));
  run_rows(fn, picked, a);
}

void blas_single_thread() {
  // OpenBLAS's own threads would fight the host's oneTBB threads. Note: this setting is
  // process-wide for OpenBLAS.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Held around every OpenBLAS call. Which libopenblas.so.0 the process gets is the system's choice
// (Debian's alternatives: pthread, openmp or serial builds); the serial one and builds without
// USE_LOCKING share buffers between concurrent calls. Sessions on other threads may prefill at
// once, so the calls are serialized; only F32 weights at kBlasMinTokens tokens or more get here.
std::mutex &blas_mutex() {
  static std::mutex mu;
  return mu;
}

void run_blas(const MatmulArgs &a) {
  blas_single_thread();
  const int n_cols = static_cast<int>(a.n_cols);
  if (a.wtype == SPECINFER_WTYPE_F32) {
    // No conversion needed: one call straight on the weights.
    const auto *wp = reinterpret_cast<const float *>(a.w);
    std::lock_guard<std::mutex> lock(blas_mutex());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.n_tok),
                static_cast<int>(a.n_rows), n_cols, 1.0f, a.x, n_cols, wp, n_cols, 0.0f, a.y,
                static_cast<int>(a.n_rows));
    return;
  }
  // Panels of about 256 KiB of floats so the dequantized panel stays in L2.
  const int64_t panel = std::clamp<int64_t>(65536 / a.n_cols, 4, 256);
  // Panels one after another (OpenBLAS is not safe to call concurrently); rows of a panel are
  // dequantized in parallel.
  std::vector<float> buf(static_cast<size_t>(std::min(panel, a.n_rows)) *
                         static_cast<size_t>(a.n_cols));
  for (int64_t p0 = 0; p0 < a.n_rows; p0 += panel) {
    const int64_t p1 = std::min(a.n_rows, p0 + panel);
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(p0, p1), [&](const tbb::blocked_range<int64_t> &r) {
          for (int64_t row = r.begin(); row < r.end(); ++row)
            dequantize_row(a.wtype, a.w + static_cast<size_t>(row) * a.row_bytes,
                           buf.data() + static_cast<size_t>(row - p0) * a.n_cols, a.n_cols);
        });
    std::lock_guard<std::mutex> lock(blas_mutex());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.n_tok),
                static_cast<int>(p1 - p0), n_cols, 1.0f, a.x, n_cols, buf.data(), n_cols, 0.0f,
                a.y + p0, static_cast<int>(a.n_rows));
  }
}

}  // namespace

// Rows per task: enough that each task streams a good chunk of weights, small enough that the
// threads balance.
int64_t matmul_row_grain(int64_t n_rows, size_t row_bytes) {
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t by_bytes = static_cast<int64_t>(16384 / std::max<size_t>(row_bytes, 1));
  const int64_t by_split = std::max<int64_t>(1, n_rows / (threads * 8));
  return std::max<int64_t>(1, std::min(by_bytes, by_split));
}

void matmul_with(Isa isa, MatmulPath path, int32_t wtype, const void *w, int64_t n_rows,
                 int64_t n_cols, const float *x, int64_t n_tok, float *y) {
  const MatmulArgs a = checked_args(wtype, w, n_rows, n_cols, x, n_tok, y);
  if (!isa_available(isa))
    fail(SPECINFER_ERR_UNSUPPORTED, "matmul: this CPU cannot run %s kernels", isa_name(isa));
  const bool blas =
      path == MatmulPath::blas ||
      (path == MatmulPath::automatic && n_tok >= kBlasMinTokens && wtype == SPECINFER_WTYPE_F32);
  if (blas)
    run_blas(a);
  else
    run_kernels(isa, a);
}

void matmul_rows_with(MatmulRowsFn fn, Isa fn_isa, int32_t wtype, const void *w, int64_t n_rows,
                      int64_t n_cols, const float *x, int64_t n_tok, float *y) {
  const MatmulArgs a = checked_args(wtype, w, n_rows, n_cols, x, n_tok, y);
  if (fn == nullptr) fail(SPECINFER_ERR_INVALID_ARGUMENT, "matmul: NULL row kernel");
  const Isa prep =
      static_cast<int>(fn_isa) >= static_cast<int>(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  if (!isa_available(prep))
    fail(SPECINFER_ERR_UNSUPPORTED, "matmul: this CPU cannot prepare activations for %s kernels",
         isa_name(fn_isa));
  run_rows(fn, fn_isa, a);
}

void matmul(int32_t wtype, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
            int64_t n_tok, float *y) {
  matmul_with(active_isa(), MatmulPath::automatic, wtype, w, n_rows, n_cols, x, n_tok, y);
}

void act_pair_quarters(ActQ8K *a, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int c = 0; c < kQKK; c += 64) {
      int8_t tmp[16];
      std::memcpy(tmp, a[b].qs + c + 16, 16);
      std::memcpy(a[b].qs + c + 16, a[b].qs + c + 32, 16);
      std::memcpy(a[b].qs + c + 32, tmp, 16);
    }
}

void act_pair_lanes16(ActQ8K *a, int64_t n_blocks) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int c = 0; c < kQKK; c += 64) {
      int16_t in[32], out[32];
      std::memcpy(in, a[b].qs + c, 64);
      for (int k = 0; k < 16; ++k) {
        out[k] = (k % 2 == 0) ? in[k] : in[16 + k];
        out[16 + k] = (k % 2 == 0) ? in[k + 1] : in[16 + k - 1];
      }
      std::memcpy(a[b].qs + c, out, 64);
    }
}

void act_sub_sums(const ActQ8K *a, int64_t n_blocks, float *out) noexcept {
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int j = 0; j < 8; ++j)
      out[8 * b + j] = a[b].d * static_cast<float>(a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
}

void dequantize_row(int32_t wtype, const void *src, float *dst, int64_t n) {
  dequantize_row_ref(wtype, src, dst, n);
}

}  // namespace specinfer
