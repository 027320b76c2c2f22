// specinfer sketch-eval: the synthetic inner-product experiment of "Sampling Methods for Inner
// Product Sketching" (Daliri, Freire, Musco, Santos, Zhang, VLDB 2024), run on this library's
// sketchers through the public C ABI.
//
// Data (as in the paper's generator): two vectors of length 5 * nnz with nnz nonzeros each,
// values uniform in [-1, 1], a fraction `outliers` of the value slots replaced by round(N(5, 1)
// truncated to [4, 6]) in both vectors, and a fraction `overlap` of the nonzero positions shared.
// For each storage budget S (in 64-bit words) a method gets: jl, countsketch, qjl: m = S rows
// (qjl's stored key is m bits + one double; its query side is m floats); threshold, priority:
// m = S / 1.5 samples (a sample is an index and a value). Error: |est - <a,b>| / (||a|| ||b||),
// averaged over `trials` seeds. The vectors are fixed; only the sketch seed changes per trial.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "png_chart.h"
#include "sketch_eval_real.h"
#include "specinfer.h"

namespace {

struct Config {
  int64_t nnz = 20000;
  std::vector<double> overlaps = {0.01, 0.1, 0.5, 1.0};
  double outliers = 0.02;
  int64_t storage_lo = 200, storage_hi = 2000, storage_step = 200;
  int trials = 100;
  std::vector<std::string> methods = {"jl", "countsketch", "threshold", "priority"};
  std::string jl_dist = "sign";
  uint64_t data_seed = 9;
  std::string png_prefix = "sketch-eval";
  bool png = true;
};

void usage(FILE *out) {
  std::fprintf(
      out,
      "usage: specinfer sketch-eval [options]\n\n"
      "Reproduces the synthetic experiment of \"Sampling Methods for Inner Product Sketching\"\n"
      "(VLDB 2024): mean relative error |est - <a,b>| / (||a|| ||b||) against storage.\n\n"
      "options:\n"
      "  --nnz N             nonzeros per vector (default 20000; length is 5 N)\n"
      "  --overlaps LIST     shared fraction of the nonzeros (default 0.01,0.1,0.5,1)\n"
      "  --outliers F        fraction of outlier values (default 0.02)\n"
      "  --storage LO:HI:STEP  storage budgets in 64-bit words (default 200:2000:200)\n"
      "  --trials T          sketch seeds per point (default 100)\n"
      "  --methods LIST      of jl,countsketch,qjl,threshold,priority\n"
      "                      (default jl,countsketch,threshold,priority)\n"
      "  --jl-dist D         sign (default, as in the paper) or gaussian\n"
      "  --data-seed S       seed of the synthetic vectors (default 9)\n"
      "  --png PREFIX        write PREFIX-overlap-<pct>.png charts (default sketch-eval)\n"
      "  --no-png            do not write charts\n\n"
      "usage: specinfer sketch-eval --model PATH --text FILE [options]\n\n"
      "The same on real query/key vectors from a model's attention layers (plus top-1 / top-8\n"
      "agreement of the keys each query ranks highest); options:\n");
  if (out == stdout)
    sketch_eval_real_usage("  ");
  else
    std::fprintf(out, "  see `specinfer sketch-eval --help`\n");
}

using cli::split;

bool parse_double(const std::string &s, double *out) {
  char *end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0' && std::isfinite(*out);
}

bool parse_int(const std::string &s, int64_t *out) {
  char *end = nullptr;
  *out = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && *end == '\0';
}

// splitmix64: the synthetic data's generator (independent of the library's sketch hashing).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  uint64_t below(uint64_t n) { return next() % n; }
  double normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

void make_pair(const Config &cfg, double overlap, std::vector<float> &a, std::vector<float> &b) {
  Rng rng{cfg.data_seed};
  const size_t nnz = static_cast<size_t>(cfg.nnz), d = 5 * nnz;
  std::vector<float> va(nnz), vb(nnz);
  for (size_t k = 0; k < nnz; ++k) va[k] = static_cast<float>(2 * rng.uniform() - 1);
  for (size_t k = 0; k < nnz; ++k) vb[k] = static_cast<float>(2 * rng.uniform() - 1);
  // Outliers: the same value slots in both vectors, round(N(5,1) truncated to [4,6]).
  const size_t n_out = static_cast<size_t>(std::llround(static_cast<double>(nnz) * cfg.outliers));
  std::vector<size_t> slots(nnz);
  for (size_t k = 0; k < nnz; ++k) slots[k] = k;
  for (size_t k = 0; k < n_out; ++k) std::swap(slots[k], slots[k + rng.below(nnz - k)]);
  auto outlier = [&] {
    double v;
    do v = 5.0 + rng.normal();
    while (v < 4.0 || v > 6.0);
    return static_cast<float>(std::round(v));
  };
  for (size_t k = 0; k < n_out; ++k) va[slots[k]] = outlier();
  for (size_t k = 0; k < n_out; ++k) vb[slots[k]] = outlier();
  // Positions: 2 nnz distinct indices; b reuses the first `overlap` share of a's.
  std::vector<uint32_t> perm(d);
  for (size_t i = 0; i < d; ++i) perm[i] = static_cast<uint32_t>(i);
  for (size_t k = 0; k < 2 * nnz; ++k) std::swap(perm[k], perm[k + rng.below(d - k)]);
  const size_t shared = static_cast<size_t>(std::llround(static_cast<double>(nnz) * overlap));
  a.assign(d, 0.0f);
  b.assign(d, 0.0f);
  for (size_t k = 0; k < nnz; ++k) a[perm[k]] = va[k];
  for (size_t k = 0; k < nnz; ++k) b[k < shared ? perm[k] : perm[nnz + k]] = vb[k];
}

int64_t size_for(const std::string &method, int64_t storage) {
  if (method == "threshold" || method == "priority") return static_cast<int64_t>(storage / 1.5);
  return storage;
}

struct Failure {
  std::string message;
};

// One estimate of <a, b> with a fresh sketcher of `seed`.
double one_trial(const std::string &method, const Config &cfg, int64_t m, uint64_t seed,
                 const std::vector<float> &ab, size_t d, double *samples) {
  std::string options;
  if (method == "jl") options = "dist=" + cfg.jl_dist;
  specinfer_sketcher *s = nullptr;
  char *err = nullptr;
  if (specinfer_sketcher_create(method.c_str(), static_cast<int64_t>(d), m, seed, options.c_str(),
                                &s, &err) != SPECINFER_OK) {
    Failure f{err ? err : "sketcher_create failed"};
    specinfer_free(err);
    throw f;
  }
  std::vector<unsigned char> buf;
  size_t offsets[3] = {0, 0, 0}, total = 0;
  specinfer_status rc;
  if (method == "qjl") {  // a as a key, b as a query
    size_t na = 0, nb = 0;
    specinfer_sketcher_sketch(s, ab.data(), d, 0, nullptr, 0, &na, nullptr);
    specinfer_sketcher_sketch(s, ab.data() + d, d, SPECINFER_SKETCH_QUERY, nullptr, 0, &nb,
                              nullptr);
    buf.resize(na + nb);
    rc = specinfer_sketcher_sketch(s, ab.data(), d, 0, buf.data(), na, &na, &err);
    if (rc == SPECINFER_OK)
      rc = specinfer_sketcher_sketch(s, ab.data() + d, d, SPECINFER_SKETCH_QUERY, buf.data() + na,
                                     nb, &nb, &err);
    offsets[1] = na;
    offsets[2] = na + nb;
  } else {  // both rows at once, in parallel
    specinfer_sketcher_sketch_rows(s, ab.data(), 2, d, 0, nullptr, 0, nullptr, &total, nullptr);
    buf.resize(total);
    rc = specinfer_sketcher_sketch_rows(s, ab.data(), 2, d, 0, buf.data(), buf.size(), offsets,
                                        &total, &err);
  }
  double est = 0.0;
  if (rc == SPECINFER_OK)
    rc = specinfer_sketcher_estimate(s, buf.data(), offsets[1], buf.data() + offsets[1],
                                     offsets[2] - offsets[1], &est, &err);
  if (rc == SPECINFER_OK && samples) {
    specinfer_sketch_header h;
    std::memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    if (specinfer_sketch_read_header(buf.data(), offsets[1], &h, nullptr) == SPECINFER_OK)
      *samples = static_cast<double>(h.count);
  }
  specinfer_sketcher_destroy(s);
  if (rc != SPECINFER_OK) {
    Failure f{std::string(specinfer_status_str(rc)) + ": " + (err ? err : "")};
    specinfer_free(err);
    throw f;
  }
  return est;
}

}  // namespace

int cmd_sketch_eval(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--model")) return sketch_eval_real(argc, argv);
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string *out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sketch-eval: %s needs a value\n", arg.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string v;
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    } else if (arg == "--nnz") {
      ok = value(&v) && parse_int(v, &cfg.nnz) && cfg.nnz >= 10 && cfg.nnz <= 10000000;
    } else if (arg == "--overlaps") {
      ok = value(&v);
      cfg.overlaps.clear();
      for (const std::string &p : split(v, ',')) {
        double x = 0.0;
        ok = ok && parse_double(p, &x) && x >= 0 && x <= 1;
        cfg.overlaps.push_back(x);
      }
    } else if (arg == "--outliers") {
      ok = value(&v) && parse_double(v, &cfg.outliers) && cfg.outliers >= 0 && cfg.outliers <= 1;
    } else if (arg == "--storage") {
      ok = value(&v);
      const auto parts = split(v, ':');
      ok = ok && parts.size() == 3 && parse_int(parts[0], &cfg.storage_lo) &&
           parse_int(parts[1], &cfg.storage_hi) && parse_int(parts[2], &cfg.storage_step) &&
           cfg.storage_lo >= 2 && cfg.storage_hi >= cfg.storage_lo && cfg.storage_step >= 1;
    } else if (arg == "--trials") {
      int64_t t = 0;
      ok = value(&v) && parse_int(v, &t) && t >= 1 && t <= 1000000;
      cfg.trials = static_cast<int>(t);
    } else if (arg == "--methods") {
      ok = value(&v);
      cfg.methods = split(v, ',');
      for (const std::string &m : cfg.methods)
        ok = ok &&
             (m == "jl" || m == "countsketch" || m == "qjl" || m == "threshold" || m == "priority");
    } else if (arg == "--jl-dist") {
      ok = value(&cfg.jl_dist) && (cfg.jl_dist == "sign" || cfg.jl_dist == "gaussian");
    } else if (arg == "--data-seed") {
      int64_t s = 0;
      ok = value(&v) && parse_int(v, &s);
      cfg.data_seed = static_cast<uint64_t>(s);
    } else if (arg == "--png") {
      ok = value(&cfg.png_prefix);
      cfg.png = true;
    } else if (arg == "--no-png") {
      cfg.png = false;
    } else {
      std::fprintf(stderr, "sketch-eval: unknown option '%s'\n\n", arg.c_str());
      usage(stderr);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "sketch-eval: bad value for %s\n\n", arg.c_str());
      usage(stderr);
      return 2;
    }
  }

  std::vector<int64_t> storages;
  for (int64_t s = cfg.storage_lo; s <= cfg.storage_hi; s += cfg.storage_step)
    storages.push_back(s);
  std::printf("sketch-eval: nnz %lld, length %lld, outliers %.3g, %d trials, jl dist=%s\n",
              static_cast<long long>(cfg.nnz), static_cast<long long>(5 * cfg.nnz), cfg.outliers,
              cfg.trials, cfg.jl_dist.c_str());
  std::printf(
      "storage S in 64-bit words: jl/countsketch/qjl m = S, threshold/priority m = S/1.5 "
      "samples\n");

  for (double overlap : cfg.overlaps) {
    std::vector<float> a, b;
    make_pair(cfg, overlap, a, b);
    const size_t d = a.size();
    double ip = 0, na = 0, nb = 0;
    for (size_t i = 0; i < d; ++i) {
      ip += static_cast<double>(a[i]) * b[i];
      na += static_cast<double>(a[i]) * a[i];
      nb += static_cast<double>(b[i]) * b[i];
    }
    const double scale = std::sqrt(na) * std::sqrt(nb);
    std::vector<float> ab(a);
    ab.insert(ab.end(), b.begin(), b.end());
    std::printf("\noverlap %g%%: <a,b> = %.4f, ||a|| = %.3f, ||b|| = %.3f\n", overlap * 100, ip,
                std::sqrt(na), std::sqrt(nb));
    std::printf("%8s", "storage");
    for (const std::string &m : cfg.methods) std::printf(" %12s", m.c_str());
    std::printf("   (mean |est - <a,b>| / (||a|| ||b||))\n");

    pngchart::Chart chart;
    char title[96];
    std::snprintf(title, sizeof title, "Inner product error, overlap %g%%", overlap * 100);
    chart.title = title;
    chart.x_label = "storage (64-bit words)";
    chart.y_label = "mean |est - <a,b>| / (|a| |b|)";
    chart.log_y = true;
    for (const std::string &m : cfg.methods) chart.series.push_back({m, {}, {}, 0, true});

    for (int64_t storage : storages) {
      std::printf("%8lld", static_cast<long long>(storage));
      for (size_t mi = 0; mi < cfg.methods.size(); ++mi) {
        const std::string &method = cfg.methods[mi];
        double err_sum = 0.0;
        try {
          for (int t = 0; t < cfg.trials; ++t) {
            const double est = one_trial(method, cfg, size_for(method, storage),
                                         static_cast<uint64_t>(t) + 1, ab, d, nullptr);
            err_sum += std::fabs(est - ip) / scale;
          }
        } catch (const Failure &f) {
          std::fprintf(stderr, "\nsketch-eval: %s, storage %lld: %s\n", method.c_str(),
                       static_cast<long long>(storage), f.message.c_str());
          return 1;
        }
        const double mean = err_sum / cfg.trials;
        std::printf(" %12.6f", mean);
        std::fflush(stdout);
        chart.series[mi].x.push_back(static_cast<double>(storage));
        chart.series[mi].y.push_back(mean);
      }
      std::printf("\n");
    }
    if (cfg.png) {
      char path[512];
      std::snprintf(path, sizeof path, "%s-overlap-%g.png", cfg.png_prefix.c_str(), overlap * 100);
      std::string error;
      if (!pngchart::write_png(path, chart, &error)) {
        std::fprintf(stderr, "sketch-eval: %s\n", error.c_str());
        return 1;
      }
      std::printf("chart: %s\n", path);
    }
  }
  return 0;
}
