// Backend kernel benchmarks: a streaming-read memory bandwidth reference (2 threads) and matmul for
// the Qwen2.5-Coder-1.5B shapes, weight types and token counts. Bytes processed = weight bytes
// streamed per call, so bytes_per_second compares directly with the bandwidth benchmark.
//
//   ./bench_kernels --benchmark_filter='Bandwidth|Matmul' --benchmark_repetitions=3
//                   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "backend/attention.h"
#include "backend/attention_args.h"
#include "backend/attention_sketch.h"
#include "backend/matmul.h"
#include "backend/ops.h"
#include "backend/packed.h"
#include "backend/quant.h"

using namespace specinfer;

namespace {

// Threads for every benchmark: 2 (the two-core machines the library is tuned on), or
// SPECINFER_BENCH_THREADS.
int bench_threads() {
  const char *s = std::getenv("SPECINFER_BENCH_THREADS");
  const int n = s ? std::atoi(s) : 2;
  return n > 0 ? n : 2;
}
const int kThreads = bench_threads();

tbb::task_arena &arena() {
  static tbb::task_arena a(kThreads);
  return a;
}

// Four independent 8-wide accumulators: enough loads in flight to saturate memory.
__attribute__((target("avx2"))) void stream_sum(const float *p, size_t n, float out[8]) {
  float a[4][8] = {};
  for (size_t i = 0; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 8; ++j)
        a[k][j] += p[i + 8 * static_cast<size_t>(k) + static_cast<size_t>(j)];
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) out[j] += a[k][j];
}

// Sums a 512 MiB buffer (far beyond the caches) on kThreads threads.
void BM_Bandwidth(benchmark::State &state) {
  const size_t bytes = size_t{512} << 20;
  static std::vector<float> buf;
  if (buf.empty()) {
    buf.resize(bytes / sizeof(float));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i & 1023);
  }
  const size_t n = buf.size();
  float sink = 0;
  for (auto _ : state) {
    std::vector<float> part(kThreads, 0.0f);
    arena().execute([&] {
      tbb::parallel_for(0, kThreads, [&](int t) {
        const size_t b = n / kThreads * static_cast<size_t>(t),
                     e = t == kThreads - 1 ? n : b + n / kThreads;
        float tmp[8] = {};
        stream_sum(buf.data() + b, e - b, tmp);
        for (float v : tmp) part[static_cast<size_t>(t)] += v;
      });
    });
    for (float v : part) sink += v;
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Bandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();

#if defined(__x86_64__)
// Instruction throughput of the kernels' multiply-class instructions, one thread: twelve
// independent register chains per loop iteration (no loads), so only the issue pipes limit it.
// per_cycle = instructions per clock, the clock taken from a chain of dependent integer adds (one
// per cycle on any x86-64). kind: 0 vpmaddubsw, 1 vpmaddwd, 2 vfmadd231ps, 3 six vpmaddubsw + six
// vfmadd231ps (do they share pipes?), 4 vpaddw.
#define SI_X12(op)                                                   \
  op " %%ymm14, %%ymm0, %%ymm0\n" op " %%ymm14, %%ymm1, %%ymm1\n" op \
     " %%ymm14, %%ymm2, %%ymm2\n" op " %%ymm14, %%ymm3, %%ymm3\n" op \
     " %%ymm14, %%ymm4, %%ymm4\n" op " %%ymm14, %%ymm5, %%ymm5\n" op \
     " %%ymm14, %%ymm6, %%ymm6\n" op " %%ymm14, %%ymm7, %%ymm7\n" op \
     " %%ymm14, %%ymm8, %%ymm8\n" op " %%ymm14, %%ymm9, %%ymm9\n" op \
     " %%ymm14, %%ymm10, %%ymm10\n" op " %%ymm14, %%ymm11, %%ymm11\n"
#define SI_MIX                                                                   \
  "vpmaddubsw %%ymm14, %%ymm0, %%ymm0\n vfmadd231ps %%ymm14, %%ymm6, %%ymm6\n"   \
  "vpmaddubsw %%ymm14, %%ymm1, %%ymm1\n vfmadd231ps %%ymm14, %%ymm7, %%ymm7\n"   \
  "vpmaddubsw %%ymm14, %%ymm2, %%ymm2\n vfmadd231ps %%ymm14, %%ymm8, %%ymm8\n"   \
  "vpmaddubsw %%ymm14, %%ymm3, %%ymm3\n vfmadd231ps %%ymm14, %%ymm9, %%ymm9\n"   \
  "vpmaddubsw %%ymm14, %%ymm4, %%ymm4\n vfmadd231ps %%ymm14, %%ymm10, %%ymm10\n" \
  "vpmaddubsw %%ymm14, %%ymm5, %%ymm5\n vfmadd231ps %%ymm14, %%ymm11, %%ymm11\n"
#define SI_CLOBBER \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

double seconds_for(void (*fn)(long), long n) {
  const auto t0 = std::chrono::steady_clock::now();
  fn(n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
void add_chain(long n) {  // 12 dependent adds per iteration
  for (long i = 0; i < n; ++i)
    __asm__ volatile(
        "add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, "
        "%%rax\n"
        "add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n add $1, "
        "%%rax\n" ::
            : "rax");
}
__attribute__((target("avx2"))) void run_maddubs(long n) {
  for (long i = 0; i < n; ++i) __asm__ volatile(SI_X12("vpmaddubsw")::: SI_CLOBBER);
}
__attribute__((target("avx2"))) void run_maddwd(long n) {
  for (long i = 0; i < n; ++i) __asm__ volatile(SI_X12("vpmaddwd")::: SI_CLOBBER);
}
__attribute__((target("avx2,fma"))) void run_fma(long n) {
  for (long i = 0; i < n; ++i) __asm__ volatile(SI_X12("vfmadd231ps")::: SI_CLOBBER);
}
__attribute__((target("avx2,fma"))) void run_mix(long n) {
  for (long i = 0; i < n; ++i) __asm__ volatile(SI_MIX ::: SI_CLOBBER);
}
__attribute__((target("avx2"))) void run_paddw(long n) {
  for (long i = 0; i < n; ++i) __asm__ volatile(SI_X12("vpaddw")::: SI_CLOBBER);
}

void BM_PipeThroughput(benchmark::State &state) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    state.SkipWithError("needs AVX2 and FMA");
    return;
  }
  void (*const fns[])(long) = {run_maddubs, run_maddwd, run_fma, run_mix, run_paddw};
  const auto fn = fns[state.range(0)];
  const long n = 2000000;
  double instr_s = 0, clock_s = 0;
  for (auto _ : state) {
    clock_s += seconds_for(add_chain, n);
    instr_s += seconds_for(fn, n);
  }
  // Both loops run n iterations of 12 instructions; the add chain takes 12 cycles per iteration.
  state.counters["per_cycle"] = 12.0 * clock_s / (12.0 * instr_s);
  state.counters["GHz"] =
      12.0 * static_cast<double>(n) * static_cast<double>(state.iterations()) / clock_s * 1e-9;
}
BENCHMARK(BM_PipeThroughput)->DenseRange(0, 4)->ArgName("kind")->Unit(benchmark::kMillisecond);
#endif

struct Weights {
  std::vector<uint8_t> data;
};

// Random valid weights, cached per (type, shape): generating 151936 x 1536 takes a moment.
const Weights &weights(int32_t wtype, int64_t rows, int64_t cols) {
  static std::vector<std::pair<std::tuple<int32_t, int64_t, int64_t>, Weights>> cache;
  for (auto &e : cache)
    if (e.first == std::make_tuple(wtype, rows, cols)) return e.second;
  if (cache.size() >= 2) cache.erase(cache.begin());  // keep memory bounded
  Weights w;
  const size_t rs = wtype_row_size(wtype, cols);
  w.data.resize(rs * static_cast<size_t>(rows));
  std::mt19937 rng(1);
  for (size_t i = 0; i < w.data.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(&w.data[i], &v, std::min<size_t>(4, w.data.size() - i));
  }
  // Finite scales: overwrite every fp16 in the float types, and the scale fields of the blocks.
  const size_t bb = wtype_block_bytes(wtype);
  const uint16_t h = fp32_to_fp16(0.01f);
  for (size_t off = 0; off < w.data.size(); off += bb) {
    uint8_t *p = w.data.data() + off;
    switch (wtype) {
      case SPECINFER_WTYPE_F16: {
        const uint16_t v = fp32_to_fp16(static_cast<float>(off % 97) * 0.01f);
        std::memcpy(p, &v, 2);
        break;
      }
      case SPECINFER_WTYPE_Q8_0:
      case SPECINFER_WTYPE_Q4_0:
      case SPECINFER_WTYPE_Q5_0:
        std::memcpy(p, &h, 2);
        break;
      case SPECINFER_WTYPE_Q4_K:
      case SPECINFER_WTYPE_Q5_K:
        std::memcpy(p, &h, 2);
        std::memcpy(p + 2, &h, 2);
        break;
      case SPECINFER_WTYPE_Q6_K:
        std::memcpy(p + 208, &h, 2);
        break;
      default:
        break;
    }
  }
  cache.emplace_back(std::make_tuple(wtype, rows, cols), std::move(w));
  return cache.back().second;
}

// args: wtype, rows, cols, n_tok
void BM_Matmul(benchmark::State &state) {
  const auto wtype = static_cast<int32_t>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tok = state.range(3);
  const Weights &w = weights(wtype, rows, cols);
  std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto &v : x) v = nd(rng);
  for (auto _ : state) {
    arena().execute([&] { matmul(wtype, w.data.data(), rows, cols, x.data(), n_tok, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.data.size()));
  state.SetLabel(std::string(wtype_name(wtype)) + " " + isa_name(active_isa()));
}

void matmul_args(benchmark::internal::Benchmark *b) {
  const int64_t shapes[][2] = {{1536, 1536}, {8960, 1536}, {1536, 8960}, {151936, 1536}};
  const int32_t types[] = {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q8_0,
                           SPECINFER_WTYPE_F16};
  const int64_t toks[] = {1, 2, 4, 5, 8, 16};
  for (auto &s : shapes)
    for (int32_t t : types)
      for (int64_t n : toks) b->Args({t, s[0], s[1], n});
  // The 0.5B's Q5_0 and Q8_0 shape in L2 (against BM_MatmulPacked's q32_r16).
  for (int32_t t : {SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q8_0})
    for (int64_t n : toks) b->Args({t, 896, 896, n});
  b->ArgNames({"type", "rows", "cols", "tok"});
}
BENCHMARK(BM_Matmul)->Apply(matmul_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The packed path (pack_weight / matmul_packed): Q4_K on the same shapes, and the other types that
// pack (each in its layout for the active instruction set) in L2.
void BM_MatmulPacked(benchmark::State &state) {
  const auto wtype = static_cast<int32_t>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tok = state.range(3);
  const Weights &w = weights(wtype, rows, cols);
  const auto pw = pack_weight(wtype, w.data.data(), rows, cols);
  std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto &v : x) v = nd(rng);
  for (auto _ : state) {
    arena().execute([&] { matmul_packed(*pw, x.data(), n_tok, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.data.size()));
  state.SetLabel(std::string(wtype_name(wtype)) + " packed " + isa_name(active_isa()));
}

void matmul_packed_args(benchmark::internal::Benchmark *b) {
  const int64_t shapes[][2] = {{1536, 1536}, {8960, 1536}, {1536, 8960}, {256, 1536}};
  const int64_t toks[] = {1, 2, 4, 5, 8, 16};
  for (auto &s : shapes)
    for (int64_t n : toks) b->Args({SPECINFER_WTYPE_Q4_K, s[0], s[1], n});
  for (int64_t n : toks) b->Args({SPECINFER_WTYPE_Q4_0, 256, 1536, n});  // q40_x4, in L2
  for (int64_t n : toks) b->Args({SPECINFER_WTYPE_Q6_K, 256, 1536, n});  // q6k_x16, in L2
  // q32_r16 (AVX-512; plain elsewhere), in L2.
  for (int32_t t : {SPECINFER_WTYPE_Q5_0, SPECINFER_WTYPE_Q8_0})
    for (int64_t n : toks) b->Args({t, 896, 896, n});
  // The re-quantized 0.5B draft's shapes, one token (drafting): k/v, q/o, gate/up.
  for (int64_t r : {128, 896, 4864}) b->Args({SPECINFER_WTYPE_Q4_0, r, 896, 1});
  b->ArgNames({"type", "rows", "cols", "tok"});
}
BENCHMARK(BM_MatmulPacked)->Apply(matmul_packed_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Matmuls (packed where the type packs) on weights streamed from memory: copies of one matrix,
// ~200 MB in all, used in turn so that none is in cache. Against BM_MatmulPacked (in cache) this
// shows whether a multi-token matmul's compute overlaps the memory stream (time = the larger of the
// two) or adds to it.
void BM_MatmulStream(benchmark::State &state) {
  const auto wtype = static_cast<int32_t>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tok = state.range(3);
  static std::tuple<int32_t, int64_t, int64_t> key;
  static std::vector<std::vector<uint8_t>> data;
  static std::vector<std::unique_ptr<PackedWeight>> copies;
  if (key != std::make_tuple(wtype, rows, cols)) {
    copies.clear();
    data.clear();
    const Weights &w = weights(wtype, rows, cols);
    for (size_t b = 0; b < (size_t{200} << 20); b += w.data.size()) data.push_back(w.data);
    for (auto &d : data) copies.push_back(pack_weight(wtype, d.data(), rows, cols));
    key = std::make_tuple(wtype, rows, cols);
  }
  std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto &v : x) v = nd(rng);
  size_t k = 0;
  for (auto _ : state) {
    const PackedWeight &pw = *copies[k++ % copies.size()];
    arena().execute([&] { matmul_packed(pw, x.data(), n_tok, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(data[0].size()));
  state.SetLabel(std::string(wtype_name(wtype)) + " " + isa_name(active_isa()));
}
BENCHMARK(BM_MatmulStream)
    ->ArgsProduct(
        {{SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K}, {1536}, {8960}, {1, 2, 3, 4, 5, 8}})
    ->ArgsProduct(
        {{SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K}, {8960}, {1536}, {1, 2, 3, 4, 5, 8}})
    // The re-quantized 0.5B draft (q40_x4), one token: q/o, gate/up.
    ->ArgsProduct({{SPECINFER_WTYPE_Q4_0}, {896, 4864}, {896}, {1}})
    ->ArgNames({"type", "rows", "cols", "tok"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The AVX-512 kernels on Q4_K's two layouts, weights streamed from memory: q4k_x8 (row pairs; what
// an AVX2 machine packs) and q4k_r16 (sixteen interleaved rows; what an AVX-512 one packs),
// alternated every iteration so that both see the same memory bandwidth (on a shared machine it
// swings by half from one minute to the next). Counters: median microseconds of each and their
// ratio (r16 / pairs).
void BM_LayoutAB(benchmark::State &state) {
  if (!isa_available(Isa::avx512)) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const auto wtype = static_cast<int32_t>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tok = state.range(3);
  const Weights &w = weights(wtype, rows, cols);
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::unique_ptr<PackedWeight>> pairs, r16;
  for (size_t b = 0; b < (size_t{160} << 20); b += w.data.size()) data.push_back(w.data);
  for (auto &d : data) {
    pairs.push_back(pack_weight_for(Isa::avx2, wtype, d.data(), rows, cols));
    r16.push_back(pack_weight_for(Isa::avx512, wtype, d.data(), rows, cols));
  }
  std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto &v : x) v = nd(rng);
  std::vector<double> ta, tb;
  size_t k = 0;
  const auto time = [&](const PackedWeight &pw) {
    const auto t0 = std::chrono::steady_clock::now();
    arena().execute([&] { matmul_packed_with(Isa::avx512, pw, x.data(), n_tok, y.data()); });
    benchmark::DoNotOptimize(y.data());
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    ta.push_back(time(*pairs[k % pairs.size()]));
    tb.push_back(time(*r16[k % r16.size()]));
    ++k;
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  state.counters["pairs_us"] = median(ta);
  state.counters["r16_us"] = median(tb);
  state.counters["ratio"] = median(tb) / median(ta);
  state.SetLabel(std::string(wtype_name(wtype)) + " " +
                 std::to_string(static_cast<int>(pairs[0]->layout)) + " vs " +
                 std::to_string(static_cast<int>(r16[0]->layout)));
}
BENCHMARK(BM_LayoutAB)
    ->ArgsProduct({{SPECINFER_WTYPE_Q4_K}, {1536, 8960}, {1536}, {1, 5, 8, 16}})
    ->ArgsProduct({{SPECINFER_WTYPE_Q4_K}, {1536}, {8960}, {1, 5, 8, 16}})
    ->ArgNames({"type", "rows", "cols", "tok"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The same kernels on a weight matrix that stays in L2 (256 x 1536): compute cost alone, without
// memory stalls. Compare cpu_time per token count (SPECINFER_BENCH_THREADS=1).
void matmul_l2_args(benchmark::internal::Benchmark *b) {
  const int32_t types[] = {SPECINFER_WTYPE_Q4_K, SPECINFER_WTYPE_Q6_K, SPECINFER_WTYPE_Q5_0,
                           SPECINFER_WTYPE_Q8_0, SPECINFER_WTYPE_Q4_0};
  const int64_t toks[] = {1, 2, 4, 5, 8, 16};
  for (int32_t t : types)
    for (int64_t n : toks) b->Args({t, 256, 1536, n});
  b->ArgNames({"type", "rows", "cols", "tok"});
}
BENCHMARK(BM_Matmul)
    ->Name("BM_MatmulL2")
    ->Apply(matmul_l2_args)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Activation quantization per call (n_tok x 1536 floats -> ActQ8K / ActQ8), single thread.
// kind: 0 = q8 scalar, 1 = q8k scalar, 2 = q8 AVX2, 3 = q8k AVX2.
void BM_QuantizeAct(benchmark::State &state) {
  const int64_t cols = 1536, n_tok = state.range(1);
  const bool k = state.range(0) % 2 != 0, simd = state.range(0) >= 2;
  std::vector<float> x(static_cast<size_t>(n_tok * cols));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto &v : x) v = nd(rng);
  std::vector<ActQ8K> qk(static_cast<size_t>(n_tok * cols / kQKK));
  std::vector<ActQ8> q(static_cast<size_t>(n_tok * cols / kQK));
  for (auto _ : state) {
    for (int64_t t = 0; t < n_tok; ++t) {
      if (k && simd)
        quantize_act_q8k_avx2(x.data() + t * cols, qk.data() + t * (cols / kQKK), cols);
      else if (k)
        quantize_act_q8k(x.data() + t * cols, qk.data() + t * (cols / kQKK), cols);
      else if (simd)
        quantize_act_q8_avx2(x.data() + t * cols, q.data() + t * (cols / kQK), cols);
      else
        quantize_act_q8(x.data() + t * cols, q.data() + t * (cols / kQK), cols);
    }
    benchmark::DoNotOptimize(qk.data());
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n_tok * cols);
}
BENCHMARK(BM_QuantizeAct)
    ->ArgsProduct({{0, 1, 2, 3}, {1, 5}})
    ->ArgNames({"kind", "tok"})
    ->Unit(benchmark::kMicrosecond);

void BM_Attention(benchmark::State &state) {
  const int n_q = static_cast<int>(state.range(0)), n_kv = static_cast<int>(state.range(1));
  const int n_head = 12, n_head_kv = 2, hd = 128;
  std::vector<float> q(static_cast<size_t>(n_q * n_head * hd), 0.1f),
      k(static_cast<size_t>(n_kv * n_head_kv * hd), 0.2f), v(k.size(), 0.3f), out(q.size());
  const specinfer_attention_args a =
      attention_args(n_q, n_head, n_head_kv, hd, n_kv, q.data(), k.data(), v.data(), out.data());
  for (auto _ : state) {
    arena().execute([&] { attention(a); });
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_Attention)
    ->Args({1, 1024})
    ->Args({5, 1024})
    ->Args({5, 4096})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Decode (tok=1) or verify (tok=5) attention over a long cache through all 28 layers of
// Qwen2.5-Coder-1.5B's shape (12 query heads on 2 kv heads of 128; each layer its own cache, so
// that they stream from memory as in the model rather than sit in the L3 cache), exact (qjl:0) or
// sketched (128 bits, a window of 256 and 4 sinks; qjl:1 picks 1024 keys by the estimate alone as
// attn=qjl's defaults do, qjl:2 picks 1024 among 4096 candidates rescored exactly
// (attn_rescore=4096), qjl:3 2048 among 4096 (attn_keys=2048,attn_rescore=4096), qjl:4 1024
// among 2048 (attn_rescore=2048)), in the cache
// types the gguf plugin offers. The time is per pass (tok tokens):
//   ./bench_kernels --benchmark_filter=AttentionLong
void BM_AttentionLong(benchmark::State &state) {
  const int n_kv = static_cast<int>(state.range(0));
  const int32_t type = static_cast<int32_t>(state.range(1));
  const bool sketched = state.range(2) != 0;
  const int n_q = static_cast<int>(state.range(3));
  const bool tiles = state.range(4) != 0;  // q8_0 keys in tiles of 16 (the gguf plugin's default)
  const int n_head = 12, n_head_kv = 2, hd = 128, n_layer = 28;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(n_q * n_head * hd)),
      x(static_cast<size_t>(n_head_kv * hd)), out(q.size());
  for (auto &e : q) e = nd(rng) * 0.3f;
  // Head-major rows, as the gguf plugin keeps them: each kv head's n_kv rows one after another.
  const size_t row = wtype_row_size(type, hd), head = row * size_t(n_kv),
               srow = key_sketch_bytes(128) * n_head_kv;
  const size_t kv_bytes = head * n_head_kv, sk_bytes = sketched ? srow * size_t(n_kv) : 0;
  // Layer 0's cache is filled, then copied to the others (sketching every key is slow).
  std::vector<uint8_t> k(kv_bytes * n_layer), v(k.size()), ks(sk_bytes * n_layer), key(row);
  for (int j = 0; j < n_kv; ++j) {
    for (auto &e : x) e = nd(rng);
    for (int h = 0; h < n_head_kv; ++h) {
      uint8_t *at = k.data() + h * head + size_t(j) * row;
      if (!tiles) {
        kv_store(type, x.data() + h * hd, at, hd);
        continue;
      }
      const int lane = j % SPECINFER_KEY_TILE;
      kv_store(type, x.data() + h * hd, key.data(), hd);
      specinfer_key_tile_put(at - size_t(lane) * row, lane, key.data(), hd);
    }
    if (sketched) key_sketch(x.data(), n_head_kv, hd, 128, ks.data() + size_t(j) * srow);
    for (auto &e : x) e = nd(rng);
    for (int h = 0; h < n_head_kv; ++h)
      kv_store(type, x.data() + h * hd, v.data() + h * head + size_t(j) * row, hd);
  }
  for (int l = 1; l < n_layer; ++l) {
    std::memcpy(k.data() + l * kv_bytes, k.data(), kv_bytes);
    std::memcpy(v.data() + l * kv_bytes, v.data(), kv_bytes);
    if (sketched) std::memcpy(ks.data() + l * sk_bytes, ks.data(), sk_bytes);
  }
  std::vector<specinfer_attention_args> args;
  for (int l = 0; l < n_layer; ++l) {
    specinfer_attention_args a =
        attention_args(n_q, n_head, n_head_kv, hd, n_kv, q.data(),
                       reinterpret_cast<const float *>(k.data() + l * kv_bytes),
                       reinterpret_cast<const float *>(v.data() + l * kv_bytes), out.data());
    a.k_type = a.v_type = type;
    a.k_pos_stride = a.v_pos_stride = int64_t(row);
    a.k_head_stride = a.v_head_stride = int64_t(head);
    if (tiles) a.k_tile = SPECINFER_KEY_TILE;
    if (sketched) {
      a.k_sketch = ks.data() + l * sk_bytes;
      a.sketch_bits = 128;
      a.n_select = state.range(2) == 3 ? 2048 : 1024;
      a.n_window = 256;
      a.n_sink = 4;
      a.n_rescore = state.range(2) == 4 ? 2048 : state.range(2) >= 2 ? 4096 : 0;
    }
    args.push_back(a);
  }
  for (auto _ : state) {
    arena().execute([&] {
      for (const auto &a : args) attention(a);
    });
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(wtype_name(type)) + (tiles ? " tiles" : "") +
                 (!sketched             ? " exact"
                  : state.range(2) == 1 ? " qjl"
                  : state.range(2) == 2 ? " qjl rescored"
                  : state.range(2) == 3 ? " qjl 2048 of 4096 rescored"
                                        : " qjl 1024 of 2048 rescored") +
                 ", 28 layers");
}
BENCHMARK(BM_AttentionLong)
    ->Apply([](benchmark::internal::Benchmark *b) {
      const int64_t f32 = SPECINFER_WTYPE_F32, f16 = SPECINFER_WTYPE_F16, q8 = SPECINFER_WTYPE_Q8_0;
      const int64_t layouts[][2] = {{f32, 0}, {f16, 0}, {q8, 0}, {q8, 1}};
      for (int64_t n_kv : {16384, 32768})
        for (const auto &l : layouts)
          for (int64_t qjl : {0, 1, 2, 3, 4})
            for (int64_t tok : {1, 2, 5}) b->Args({n_kv, l[0], qjl, tok, l[1]});
    })
    ->ArgNames({"n_kv", "type", "qjl", "tok", "tiles"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
