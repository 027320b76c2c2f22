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
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../common/splitmix64.h"
#include "cli_options.h"
#include "commands.h"
#include "png_chart.h"
#include "sketch_eval_real.h"
#include "specinfer.h"

namespace {

struct SyntheticConfig : SketchOptions {
  int64_t nnz = 20000;
  std::vector<double> overlaps = {0.01, 0.1, 0.5, 1.0};
  double outliers = 0.02;
  int64_t storage_lo = 200, storage_hi = 2000, storage_step = 200;
  int trials = 100;
  uint64_t data_seed = 9;
  SyntheticConfig() {
    methods = {"jl", "countsketch", "threshold", "priority"};
    png_prefix = "sketch-eval";
  }
};

// "LO:HI:STEP" with 2 <= LO <= HI <= 2^24 and STEP >= 1 into the config; false if it is not.
bool parse_storage(const std::string &s, SyntheticConfig *cfg) {
  const std::vector<std::string> parts = cli::split(s, ':');
  if (parts.size() != 3) return false;
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    char *end = nullptr;
    errno = 0;
    v[i] = std::strtoll(parts[size_t(i)].c_str(), &end, 10);
    if (parts[size_t(i)].empty() || errno || *end) return false;
  }
  if (v[0] < 2 || v[1] < v[0] || v[1] > (int64_t{1} << 24) || v[2] < 1) return false;
  cfg->storage_lo = v[0];
  cfg->storage_hi = v[1];
  cfg->storage_step = v[2];
  return true;
}

// splitmix64: the synthetic data's generator (independent of the library's sketch hashing).
struct Rng : specinfer::SplitMix64 {
  double normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

void make_pair(const SyntheticConfig &cfg, double overlap, std::vector<float> &a,
               std::vector<float> &b) {
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

// One estimate of <a, b> with a fresh sketcher of `seed`.
double one_trial(const std::string &method, const SyntheticConfig &cfg, int64_t m, uint64_t seed,
                 const std::vector<float> &ab, size_t d, double *samples) {
  std::string options;
  if (method == "jl") options = "dist=" + cfg.jl_dist;
  specinfer_sketcher *s = nullptr;
  char *err = nullptr;
  if (specinfer_sketcher_create(method.c_str(), static_cast<int64_t>(d), m, seed, options.c_str(),
                                &s, &err) != SPECINFER_OK) {
    SketchFailure f{err ? err : "sketcher_create failed"};
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
    SketchFailure f{std::string(specinfer_status_str(rc)) + ": " + (err ? err : "")};
    specinfer_free(err);
    throw f;
  }
  return est;
}

}  // namespace

int64_t sketch_size_for(const std::string &method, int64_t storage) {
  if (method == "threshold" || method == "priority")
    return std::max<int64_t>(1, static_cast<int64_t>(storage / 1.5));
  return storage;
}

void add_sketch_options(CLI::App &app, SketchOptions *o, const char *charts) {
  app.add_option("--methods", o->methods, "the sketchers to compare")
      ->type_name("LIST")
      ->delimiter(',')
      ->check(CLI::IsMember({"jl", "countsketch", "qjl", "threshold", "priority"}));
  app.add_option("--jl-dist", o->jl_dist, "entries of the JL matrix")
      ->type_name("D")
      ->check(CLI::IsMember({"sign", "gaussian"}));
  CLI::Option *png =
      app.add_option("--png", o->png_prefix, std::string("write the charts ") + charts)
          ->type_name("PREFIX")
          ->check(CLI::Validator(
              [](std::string &v) { return v.empty() ? std::string("empty prefix") : ""; }, ""));
  app.add_flag("--no-png", o->no_png, "do not write charts")->excludes(png);
}

namespace {

// The synthetic experiment's options (with the sketch options shared with --model) into cfg.
void define_options(cli::App &app, SyntheticConfig &cfg) {
  cli::add_number(app, "--nnz", cfg.nnz, "nonzeros per vector (the length is 5 N)", "N",
                  int64_t{10}, int64_t{10000000});
  cli::add_number(app, "--overlaps", cfg.overlaps, "shared fractions of the nonzeros", "LIST", 0.0,
                  1.0)
      ->delimiter(',');
  cli::add_number(app, "--outliers", cfg.outliers, "fraction of outlier values", "F", 0.0, 1.0);
  app.add_option_function<std::string>(
         "--storage",
         [&cfg](const std::string &v) {
           if (!parse_storage(v, &cfg))
             throw CLI::ValidationError("--storage", "Value " + v +
                                                         " is not LO:HI:STEP with 2 <= LO <= "
                                                         "HI <= 16777216, STEP >= 1");
         },
         "storage budgets in 64-bit words")
      ->type_name("LO:HI:STEP")
      ->default_str("200:2000:200");
  cli::add_number(app, "--trials", cfg.trials, "sketch seeds per point", "T", 1, 1000000);
  cli::add_seed(app, "--data-seed", cfg.data_seed, "seed of the synthetic vectors");
  add_sketch_options(app, &cfg, "PREFIX-overlap-<percent>.png");
  app.footer(
      "With --model, the same on real query/key vectors from a model's attention "
      "layers:\n\n" +
      sketch_eval_real_help());
}

// One overlap: the pair of vectors, every method's mean error at every storage (a table row per
// storage) and its chart; false after printing why not.
bool run_overlap(const SyntheticConfig &cfg, double overlap, const std::vector<int64_t> &storages) {
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
          const double est = one_trial(method, cfg, sketch_size_for(method, storage),
                                       static_cast<uint64_t>(t) + 1, ab, d, nullptr);
          err_sum += std::fabs(est - ip) / scale;
        }
      } catch (const SketchFailure &f) {
        std::fprintf(stderr, "\nsketch-eval: %s, storage %lld: %s\n", method.c_str(),
                     static_cast<long long>(storage), f.message.c_str());
        return false;
      }
      const double mean = err_sum / cfg.trials;
      std::printf(" %12.6f", mean);
      std::fflush(stdout);
      chart.series[mi].x.push_back(static_cast<double>(storage));
      chart.series[mi].y.push_back(mean);
    }
    std::printf("\n");
  }
  if (cfg.no_png) return true;
  char path[512];
  std::snprintf(path, sizeof path, "%s-overlap-%g.png", cfg.png_prefix.c_str(), overlap * 100);
  std::string error;
  if (!pngchart::write_png(path, chart, &error)) {
    std::fprintf(stderr, "sketch-eval: %s\n", error.c_str());
    return false;
  }
  std::printf("chart: %s\n", path);
  return true;
}

}  // namespace

int cmd_sketch_eval(int argc, char **argv) {
  if (sketch_eval_real_requested(argc, argv)) return sketch_eval_real(argc, argv);
  cli::App app{
      "Reproduces the synthetic experiment of \"Sampling Methods for Inner Product "
      "Sketching\" (VLDB 2024): mean relative error |est - <a,b>| / (||a|| ||b||) "
      "against storage.",
      "specinfer sketch-eval"};
  SyntheticConfig cfg;
  define_options(app, cfg);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;

  std::vector<int64_t> storages;
  for (int64_t s = cfg.storage_lo; s <= cfg.storage_hi; s += cfg.storage_step)
    storages.push_back(s);
  std::printf("sketch-eval: nnz %lld, length %lld, outliers %.3g, %d trials, jl dist=%s\n",
              static_cast<long long>(cfg.nnz), static_cast<long long>(5 * cfg.nnz), cfg.outliers,
              cfg.trials, cfg.jl_dist.c_str());
  std::printf(
      "storage S in 64-bit words: jl/countsketch/qjl m = S, threshold/priority m = S/1.5 "
      "samples\n");
  for (double overlap : cfg.overlaps)
    if (!run_overlap(cfg, overlap, storages)) return 1;
  return 0;
}
