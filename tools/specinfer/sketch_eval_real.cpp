// specinfer sketch-eval --model PATH: the sketch experiment of cmd_sketch_eval.cpp on real query
// and key vectors. The model (the gguf plugin, opened through the public API like any target)
// reads a text in chunks (specinfer_target_eval), and its attention observer
// (specinfer_eval_params.qk_observer) hands over each layer's queries and keys after bias, norm
// and RoPE, with the layer's sliding window.
//
// Evaluation, per selected layer and kv head g (query heads map to g as h / (n_head / n_head_kv)):
// for every storage budget S, method and trial seed one sketcher of dimension head_dim is made;
// it sketches every key of g (key role) and, for each query head of g, `queries` sampled query
// positions t (query role; only qjl tells the roles apart). Each query is then scored against every
// key it attends to (positions <= t, inside the sliding window on such layers) with
// specinfer_sketcher_estimate_many, which is how attention would use the sketches. Reported:
//   error   mean over all those (q, k) pairs of |est - <q,k>| / (||q|| ||k||);
//   top-1   share of queries whose highest estimated score is a key with the highest exact score;
//   top-8   mean |estimated top 8 ∩ exact top 8| / 8.
// Storage accounting as in the synthetic experiment: S 64-bit words give jl, countsketch and qjl
// m = S rows and threshold, priority m = S / 1.5 samples. The mean serialized key sketch size is
// printed too (qjl keys hold m bits, so they are far smaller than S words).
#include "sketch_eval_real.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "../../common/splitmix64.h"
#include "cli_options.h"
#include "png_chart.h"
#include "prompts.h"
#include "specinfer.h"

namespace {

struct RealConfig : SketchOptions {
  std::string model, text_file;
  int64_t tokens = 1024, chunk = 256;
  std::string layers = "all";
  std::vector<int64_t> storage;  // empty: head_dim / 16, / 8, / 4, / 2, / 1
  int64_t trials = 3;
  int64_t queries = 16;
  int64_t min_pos = 64;
  uint64_t seed = 1;
  RealConfig() {
    methods = {"jl", "countsketch", "qjl", "threshold", "priority"};
    png_prefix = "sketch-eval-real";
  }
};

constexpr int kTopK = 8;

using cli::split;

bool parse_int(const std::string &s, int64_t lo, int64_t hi, int64_t *out) {
  if (s.empty()) return false;
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// "all", or a comma-separated list of layer numbers and ranges "a-b".
bool parse_layers(const std::string &spec, int32_t n_layer, std::vector<int32_t> *out) {
  out->clear();
  if (spec == "all") {
    for (int32_t l = 0; l < n_layer; ++l) out->push_back(l);
    return true;
  }
  for (const std::string &part : split(spec, ',')) {
    const size_t dash = part.find('-');
    int64_t a = 0, b = 0;
    if (dash == std::string::npos) {
      if (!parse_int(part, 0, n_layer - 1, &a)) return false;
      b = a;
    } else if (!parse_int(part.substr(0, dash), 0, n_layer - 1, &a) ||
               !parse_int(part.substr(dash + 1), 0, n_layer - 1, &b) || b < a) {
      return false;
    }
    for (int64_t l = a; l <= b; ++l) out->push_back(static_cast<int32_t>(l));
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return !out->empty();
}

// The text to run: the file as it is, or for *.jsonl the prompts of its lines (the format of
// bench/prompts) joined by blank lines.
bool read_text(const std::string &path, std::string *text, std::string *error) {
  const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  if (jsonl) {
    try {
      text->clear();
      for (const std::string &prompt : read_prompts(path)) {
        if (!text->empty()) *text += "\n\n";
        *text += prompt;
      }
    } catch (const std::exception &e) {
      *error = e.what();
      return false;
    }
    if (text->empty()) *error = path + ": no prompts found";
    return !text->empty();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

// splitmix64, for sampling query positions and deriving sketch seeds.
uint64_t mix(uint64_t z) {
  return specinfer::splitmix64(z);
}

// ---- captured vectors ----

struct Capture {
  int32_t n_head = 0, n_kv = 0, hd = 0, n_tok = 0, n_layer = 0;
  std::vector<int32_t> layers;        // model layer of each slot
  std::vector<int32_t> window;        // per slot: the layer's sliding window, 0 = none
  std::vector<int32_t> slot_of;       // per model layer: its slot, -1 = not selected
  std::vector<std::vector<float>> q;  // per slot: [n_tok][n_head * hd]
  std::vector<std::vector<float>> k;  // per slot: [n_tok][n_kv * hd]
  std::string error;                  // what made the observer give up
  bool layers_bad = false;            // --layers names layers the model does not have
};

// ---- accumulators: one cell per (slot, budget, method) ----

struct Cell {
  double err_sum = 0;
  int64_t pairs = 0;
  int64_t top1 = 0, topk_hits = 0, topk_den = 0, queries = 0;  // topk_den: sum of min(8, keys seen)
  double key_bytes = 0;
  int64_t keys = 0;
  void add(const Cell &o) {
    err_sum += o.err_sum;
    pairs += o.pairs;
    top1 += o.top1;
    topk_hits += o.topk_hits;
    topk_den += o.topk_den;
    queries += o.queries;
    key_bytes += o.key_bytes;
    keys += o.keys;
  }
};

// One sketcher through the C ABI; throws SketchFailure.
struct Sketcher {
  specinfer_sketcher *s = nullptr;
  Sketcher(const std::string &kind, int64_t d, int64_t m, uint64_t seed, const std::string &opt) {
    char *err = nullptr;
    if (specinfer_sketcher_create(kind.c_str(), d, m, seed, opt.c_str(), &s, &err) !=
        SPECINFER_OK) {
      SketchFailure f{kind + ": " + (err ? err : "sketcher_create failed")};
      specinfer_free(err);
      throw f;
    }
  }
  ~Sketcher() { specinfer_sketcher_destroy(s); }
  Sketcher(const Sketcher &) = delete;
  Sketcher &operator=(const Sketcher &) = delete;

  void check(specinfer_status rc, char *err, const char *what) const {
    if (rc == SPECINFER_OK) return;
    SketchFailure f{std::string(what) + ": " + specinfer_status_str(rc) +
                    (err ? std::string(": ") + err : "")};
    specinfer_free(err);
    throw f;
  }
  // Sketches n rows of length dim (stride floats apart) into buf/offsets.
  void rows(const float *x, size_t n, size_t stride, int32_t flags, std::vector<unsigned char> &buf,
            std::vector<size_t> &offsets) const {
    offsets.assign(n + 1, 0);
    size_t total = 0;
    char *err = nullptr;
    specinfer_status rc =
        specinfer_sketcher_sketch_rows(s, x, n, stride, flags, nullptr, 0, nullptr, &total, &err);
    if (rc != SPECINFER_ERR_BUFFER_TOO_SMALL && rc != SPECINFER_OK) check(rc, err, "sketch_rows");
    specinfer_free(err);
    err = nullptr;
    buf.resize(std::max<size_t>(total, 1));
    check(specinfer_sketcher_sketch_rows(s, x, n, stride, flags, buf.data(), buf.size(),
                                         offsets.data(), &total, &err),
          err, "sketch_rows");
  }
};

// The exact side of one sampled query: its position, head, and exact scores over its visible keys.
struct Query {
  int32_t head = 0, pos = 0, lo = 0;  // keys lo..pos are visible
  double norm = 0;
  std::vector<double> exact;  // <q, k_s> for s = lo..pos
  std::vector<int32_t> top;   // exact top-k key offsets (relative to lo)
  double best = 0;            // the highest exact score
};

std::vector<int32_t> top_indices(const double *x, int32_t n, int k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const int kk = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  idx.resize(static_cast<size_t>(kk));
  return idx;
}

// Evaluates one (slot, kv head) unit into cells[budget][method].
void eval_unit(const RealConfig &cfg, const Capture &cap, size_t slot, int32_t g,
               const std::vector<int64_t> &storages, std::vector<std::vector<Cell>> &cells) {
  const int32_t layer = cap.layers[slot], hd = cap.hd, N = cap.n_tok;
  const int32_t group = cap.n_head / cap.n_kv;
  const size_t qstride = size_t(cap.n_head) * hd, kstride = size_t(cap.n_kv) * hd;
  const float *K = cap.k[slot].data() + size_t(g) * hd;
  std::vector<double> knorm(static_cast<size_t>(N));
  for (int32_t s = 0; s < N; ++s) {
    double a = 0;
    for (int32_t i = 0; i < hd; ++i) a += double(K[s * kstride + i]) * K[s * kstride + i];
    knorm[size_t(s)] = std::sqrt(a);
  }

  // Sample query positions per head of the group, and the exact scores.
  std::vector<Query> qs;
  std::vector<float> qrows;  // the sampled queries, [qs.size()][hd]
  for (int32_t h = g * group; h < (g + 1) * group; ++h) {
    std::vector<int32_t> cand;
    for (int32_t t = static_cast<int32_t>(cfg.min_pos); t < N; ++t) cand.push_back(t);
    uint64_t st = mix(cfg.seed ^ (uint64_t(layer) << 32) ^ (uint64_t(h) << 16));
    const size_t want = std::min<size_t>(cand.size(), static_cast<size_t>(cfg.queries));
    for (size_t i = 0; i < want; ++i) {
      st = mix(st);
      std::swap(cand[i], cand[i + st % (cand.size() - i)]);
    }
    cand.resize(want);
    std::sort(cand.begin(), cand.end());
    for (int32_t t : cand) {
      Query q;
      q.head = h;
      q.pos = t;
      q.lo = cap.window[slot] > 0 ? std::max<int32_t>(0, t - cap.window[slot] + 1) : 0;
      const float *qv = cap.q[slot].data() + size_t(t) * qstride + size_t(h) * hd;
      qrows.insert(qrows.end(), qv, qv + hd);
      for (int32_t i = 0; i < hd; ++i) q.norm += double(qv[i]) * qv[i];
      q.norm = std::sqrt(q.norm);
      for (int32_t s = q.lo; s <= t; ++s) {
        double a = 0;
        for (int32_t i = 0; i < hd; ++i) a += double(qv[i]) * K[s * kstride + i];
        q.exact.push_back(a);
      }
      q.top = top_indices(q.exact.data(), int32_t(q.exact.size()), kTopK);
      q.best = q.exact[size_t(q.top[0])];
      qs.push_back(std::move(q));
    }
  }
  if (qs.empty()) return;
  int32_t kmax = 0;  // the last key any sampled query sees
  for (const Query &q : qs) kmax = std::max(kmax, q.pos);

  std::vector<unsigned char> kbuf, qbuf;
  std::vector<size_t> koff, qoff;
  std::vector<double> est;
  for (size_t bi = 0; bi < storages.size(); ++bi) {
    for (size_t mi = 0; mi < cfg.methods.size(); ++mi) {
      const std::string &method = cfg.methods[mi];
      const std::string opt = method == "jl" ? "dist=" + cfg.jl_dist : "";
      Cell &c = cells[bi][mi];
      for (int64_t t = 0; t < cfg.trials; ++t) {
        const uint64_t seed = mix(cfg.seed * 0x100000001b3ULL + uint64_t(layer) * 1000003ULL +
                                  uint64_t(g) * 7919ULL + uint64_t(t)) |
                              1;
        Sketcher sk(method, hd, sketch_size_for(method, storages[bi]), seed, opt);
        sk.rows(K, size_t(kmax) + 1, kstride, 0, kbuf, koff);
        sk.rows(qrows.data(), qs.size(), size_t(hd), SPECINFER_SKETCH_QUERY, qbuf, qoff);
        c.key_bytes += double(koff[size_t(kmax) + 1]);
        c.keys += kmax + 1;
        for (size_t qi = 0; qi < qs.size(); ++qi) {
          const Query &q = qs[qi];
          const int32_t n = q.pos - q.lo + 1;
          est.resize(size_t(n));
          char *err = nullptr;
          sk.check(specinfer_sketcher_estimate_many(
                       sk.s, qbuf.data() + qoff[qi], qoff[qi + 1] - qoff[qi], kbuf.data(),
                       koff.data() + q.lo, size_t(n), est.data(), &err),
                   err, "estimate_many");
          for (int32_t s = 0; s < n; ++s) {
            const double scale = q.norm * knorm[size_t(q.lo + s)];
            if (scale > 0) {
              c.err_sum += std::fabs(est[size_t(s)] - q.exact[size_t(s)]) / scale;
              c.pairs++;
            }
          }
          const std::vector<int32_t> et = top_indices(est.data(), n, kTopK);
          if (q.exact[size_t(et[0])] >= q.best) c.top1++;
          for (int32_t a : et)
            if (std::find(q.top.begin(), q.top.end(), a) != q.top.end()) c.topk_hits++;
          c.topk_den += int64_t(et.size());
          c.queries++;
        }
      }
    }
  }
}

// The options of the --model mode, into *cfg.
void define_options(CLI::App &app, RealConfig *cfg) {
  app.add_option("--model", cfg->model, "GGUF model whose attention queries and keys are used")
      ->type_name("PATH")
      ->required();
  app.add_option("--text,--prompt-file", cfg->text_file,
                 "text the model reads (*.jsonl: the \"prompt\" strings, as in "
                 "bench/prompts/*.jsonl)")
      ->type_name("FILE")
      ->required();
  cli::add_number(app, "--tokens", cfg->tokens, "tokens of the text to run", "N", int64_t{16},
                  int64_t{1} << 20);
  cli::add_number(app, "--chunk", cfg->chunk, "tokens per forward pass", "N", int64_t{1},
                  int64_t{1} << 16);
  app.add_option("--layers", cfg->layers, "all, or layers and ranges, e.g. 0,5-7,27")
      ->type_name("LIST")
      ->check(CLI::Validator(
          [](std::string &v) { return v.empty() ? std::string("no layers given") : ""; }, ""));
  cli::add_number(app, "--storage", cfg->storage,
                  "budgets in 64-bit words, e.g. 8,16,32 (default head_dim/16, /8, /4, /2, /1)",
                  "LIST", int64_t{2}, int64_t{1} << 24)
      ->delimiter(',')
      ->default_str("");
  cli::add_number(app, "--trials", cfg->trials, "sketch seeds per layer, kv head and point", "T",
                  int64_t{1}, int64_t{100000});
  cli::add_number(app, "--queries", cfg->queries,
                  "query positions sampled per layer and query head", "Q", int64_t{1},
                  int64_t{1} << 20);
  cli::add_number(app, "--min-pos", cfg->min_pos, "queries at positions >= P", "P", int64_t{0},
                  int64_t{1} << 20);
  cli::add_seed(app, "--seed", cfg->seed, "seed of the query sampling and the sketches");
  add_sketch_options(app, cfg, "PREFIX-error.png and PREFIX-top8.png");
}

const char *const kRealName = "specinfer sketch-eval";
const char *const kRealAbout =
    "The sketch experiment on real query/key vectors from a model's attention layers: mean "
    "|est - <q,k>| / (||q|| ||k||), top-1 agreement and top-8 recall of the keys a query attends "
    "to, against storage.";

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The registry and the opened target, destroyed together.
struct OpenModel {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  std::string name;  // the model's own name, else its path
  OpenModel() = default;
  OpenModel(const OpenModel &) = delete;
  OpenModel &operator=(const OpenModel &) = delete;
  ~OpenModel() {
    if (target) specinfer_target_destroy(target);
    if (reg) specinfer_registry_destroy(reg);
  }
};

// Opens cfg.model through the gguf plugin into *m; false after printing why not.
bool open_model(const RealConfig &cfg, OpenModel *m) {
  char *err = nullptr;
  m->reg = cli::create_registry(cli::RunOptions{}, "sketch-eval");
  if (!m->reg) return false;
  // Enough context for the tokens asked for (the cache is only resident as far as it is used).
  const std::string config =
      "path=" + cfg.model + ",n_ctx=" + std::to_string(std::max<int64_t>(cfg.tokens, 64));
  if (specinfer_target_open(m->reg, "gguf", config.c_str(), &m->target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "sketch-eval: %s: %s\n", cfg.model.c_str(), err ? err : "?");
    specinfer_free(err);
    return false;
  }
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  if (specinfer_target_info(m->target, &info) != SPECINFER_OK) {
    std::fprintf(stderr, "sketch-eval: %s\n", specinfer_target_errmsg(m->target));
    return false;
  }
  m->name = info.name ? info.name : cfg.model;
  return true;
}

// The first cfg.tokens tokens of text into *ids; false after printing why not.
bool tokenize_text(const RealConfig &cfg, specinfer_target *target, const std::string &text,
                   std::vector<int32_t> *ids) {
  // Tokenize a prefix that surely holds enough tokens (a token has at least one byte).
  size_t cut = std::min(text.size(), static_cast<size_t>(cfg.tokens) * 16 + 64);
  while (cut < text.size() && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80)
    --cut;
  ids->assign(cut + 8, 0);
  size_t n_ids = 0;
  if (specinfer_target_tokenize(target, text.data(), cut, 1, 0, ids->data(), ids->size(), &n_ids) !=
      SPECINFER_OK) {
    std::fprintf(stderr, "sketch-eval: %s\n", specinfer_target_errmsg(target));
    return false;
  }
  ids->resize(std::min(n_ids, static_cast<size_t>(cfg.tokens)));
  if (static_cast<int64_t>(ids->size()) <= cfg.min_pos + kTopK) {
    std::fprintf(stderr,
                 "sketch-eval: %s gives only %zu tokens; need more than --min-pos %lld + %d\n",
                 cfg.text_file.c_str(), ids->size(), static_cast<long long>(cfg.min_pos), kTopK);
    return false;
  }
  return true;
}

struct ObserverCtx {
  Capture *cap;
  const RealConfig *cfg;
};

// The qk observer: the first layer seen sets the shapes and the selection; every layer copies its
// selected vectors into place.
void observe_qk(void *p, const specinfer_qk_view *v) {
  auto &c = *static_cast<ObserverCtx *>(p);
  Capture &cap = *c.cap;
  if (!cap.error.empty() || cap.layers_bad) return;
  if (cap.n_layer == 0) {
    if (v->n_layer <= 0 || v->n_head <= 0 || v->n_head_kv <= 0 || v->head_dim <= 0 ||
        v->n_head % v->n_head_kv != 0) {
      cap.error = "the model's attention shapes do not group query heads onto kv heads";
      return;
    }
    if (!parse_layers(c.cfg->layers, v->n_layer, &cap.layers)) {
      cap.layers_bad = true;
      cap.n_layer = v->n_layer;
      return;
    }
    cap.n_layer = v->n_layer;
    cap.n_head = v->n_head;
    cap.n_kv = v->n_head_kv;
    cap.hd = v->head_dim;
    cap.slot_of.assign(size_t(v->n_layer), -1);
    for (size_t i = 0; i < cap.layers.size(); ++i) cap.slot_of[size_t(cap.layers[i])] = int32_t(i);
    cap.window.assign(cap.layers.size(), 0);
    const size_t qw = size_t(cap.n_head) * cap.hd, kw = size_t(cap.n_kv) * cap.hd;
    cap.q.assign(cap.layers.size(), std::vector<float>(size_t(cap.n_tok) * qw));
    cap.k.assign(cap.layers.size(), std::vector<float>(size_t(cap.n_tok) * kw));
  }
  if (v->layer < 0 || v->layer >= cap.n_layer || v->n_head != cap.n_head ||
      v->n_head_kv != cap.n_kv || v->head_dim != cap.hd || v->first_pos < 0 || v->n_tokens < 0 ||
      int64_t(v->first_pos) + v->n_tokens > cap.n_tok) {
    cap.error = "the target reported queries and keys that do not fit the text";
    return;
  }
  const int32_t slot = cap.slot_of[size_t(v->layer)];
  if (slot < 0) return;
  const size_t qw = size_t(cap.n_head) * cap.hd, kw = size_t(cap.n_kv) * cap.hd;
  cap.window[size_t(slot)] = v->window;
  std::memcpy(cap.q[size_t(slot)].data() + size_t(v->first_pos) * qw, v->q,
              size_t(v->n_tokens) * qw * sizeof(float));
  std::memcpy(cap.k[size_t(slot)].data() + size_t(v->first_pos) * kw, v->k,
              size_t(v->n_tokens) * kw * sizeof(float));
}

// Runs the model over ids in chunks of cfg.chunk, capturing the selected layers' queries and keys
// into *cap. Returns 0, or the exit code after printing why not.
int capture_vectors(const RealConfig &cfg, const OpenModel &m, const std::vector<int32_t> &ids,
                    Capture *cap, Clock::time_point t0) {
  const int32_t N = static_cast<int32_t>(ids.size());
  cap->n_tok = N;
  ObserverCtx ctx{cap, &cfg};
  std::fprintf(stderr, "sketch-eval: %s: %d tokens\n", m.name.c_str(), N);
  for (int32_t at = 0; at < N;) {
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(cfg.chunk, N - at));
    specinfer_eval_params p;
    specinfer_eval_params_init(&p);
    p.tokens = ids.data() + at;
    p.n_tokens = size_t(n);
    p.n_past = at;
    p.qk_observer = observe_qk;
    p.qk_ctx = &ctx;
    if (specinfer_target_eval(m.target, &p, nullptr) != SPECINFER_OK) {
      std::fprintf(stderr, "\nsketch-eval: %s\n", specinfer_target_errmsg(m.target));
      return 1;
    }
    at += n;
    if (cap->layers_bad || !cap->error.empty()) break;
    std::fprintf(stderr, "\r  forward: %d/%d tokens (%.1f s)", at, N, seconds_since(t0));
  }
  std::fprintf(stderr, "\n");
  if (cap->layers_bad) {
    std::fprintf(stderr, "sketch-eval: bad --layers '%s' (the model has layers 0-%d)\n",
                 cfg.layers.c_str(), cap->n_layer - 1);
    return 2;
  }
  if (!cap->error.empty() || cap->n_layer == 0) {
    std::fprintf(
        stderr, "sketch-eval: %s: %s\n", cfg.model.c_str(),
        cap->n_layer == 0 ? "the target does not expose its queries and keys" : cap->error.c_str());
    return 1;
  }
  return 0;
}

// The storage budgets: --storage, or head_dim / 16 ... / 1. Returns 0, or 2 after printing that
// one is too large.
int choose_storages(const RealConfig &cfg, const Capture &cap, std::vector<int64_t> *storages) {
  *storages = cfg.storage;
  if (storages->empty())
    for (int div : {16, 8, 4, 2, 1}) storages->push_back(std::max<int64_t>(2, cap.hd / div));
  for (int64_t s : *storages)
    for (const std::string &m : cfg.methods)
      if (sketch_size_for(m, s) > (int64_t{1} << 24)) {
        std::fprintf(stderr, "sketch-eval: storage %lld is too large\n", static_cast<long long>(s));
        return 2;
      }
  return 0;
}

// The results, [budget][method] over all units and [slot][method] at the middle budget.
struct Results {
  std::vector<std::vector<Cell>> total, per_layer;
  size_t mid = 0;  // the budget of per_layer
};

// Evaluates every (layer, kv head) unit in parallel into *res; results per unit, summed in order
// (deterministic). Returns 0, or 1 after printing the first failure.
int sketch_all(const RealConfig &cfg, const Capture &cap, const std::vector<int64_t> &storages,
               Results *res, Clock::time_point t0) {
  const size_t n_units = cap.layers.size() * size_t(cap.n_kv);
  const size_t nb = storages.size(), nm = cfg.methods.size();
  std::vector<std::vector<std::vector<Cell>>> unit_cells(
      n_units, std::vector<std::vector<Cell>>(nb, std::vector<Cell>(nm)));
  std::atomic<size_t> done{0};
  std::mutex mu;
  std::string failure;
  std::fprintf(stderr,
               "  sketching: %zu layers x %d kv heads, %zu budgets x %zu methods x %lld seeds\n",
               cap.layers.size(), cap.n_kv, nb, nm, static_cast<long long>(cfg.trials));
  tbb::parallel_for(size_t(0), n_units, [&](size_t u) {
    try {
      eval_unit(cfg, cap, u / size_t(cap.n_kv), int32_t(u % size_t(cap.n_kv)), storages,
                unit_cells[u]);
    } catch (const SketchFailure &f) {
      std::lock_guard<std::mutex> lock(mu);
      if (failure.empty()) failure = f.message;
    }
    const size_t d = ++done;
    std::lock_guard<std::mutex> lock(mu);
    std::fprintf(stderr, "\r  sketching: %zu/%zu layer-heads (%.1f s)", d, n_units,
                 seconds_since(t0));
  });
  std::fprintf(stderr, "\n");
  if (!failure.empty()) {
    std::fprintf(stderr, "sketch-eval: %s\n", failure.c_str());
    return 1;
  }

  res->total.assign(nb, std::vector<Cell>(nm));
  res->per_layer.assign(cap.layers.size(), std::vector<Cell>(nm));
  res->mid = nb / 2;
  for (size_t u = 0; u < n_units; ++u)
    for (size_t b = 0; b < nb; ++b)
      for (size_t m = 0; m < nm; ++m) {
        res->total[b][m].add(unit_cells[u][b][m]);
        if (b == res->mid) res->per_layer[u / size_t(cap.n_kv)][m].add(unit_cells[u][b][m]);
      }
  return 0;
}

// The tables on stdout.
void print_tables(const RealConfig &cfg, const Capture &cap, const std::string &model_name,
                  const std::vector<int64_t> &storages, const Results &res) {
  const size_t nb = storages.size(), nm = cfg.methods.size();
  std::string layer_desc =
      cfg.layers == "all" ? "all " + std::to_string(cap.layers.size()) : cfg.layers;
  std::printf("sketch-eval on real attention vectors: %s (%s)\n", model_name.c_str(),
              cfg.model.c_str());
  std::printf("text %s: %d tokens; layers %s; %d query heads on %d kv heads; head_dim d = %d\n",
              cfg.text_file.c_str(), cap.n_tok, layer_desc.c_str(), cap.n_head, cap.n_kv, cap.hd);
  std::printf(
      "%lld queries per layer and query head at positions >= %lld, each against every key it "
      "attends to: %lld (q, k) pairs x %lld seeds; jl dist=%s\n",
      static_cast<long long>(cfg.queries), static_cast<long long>(cfg.min_pos),
      static_cast<long long>(res.total[0][0].pairs / std::max<int64_t>(1, cfg.trials)),
      static_cast<long long>(cfg.trials), cfg.jl_dist.c_str());
  std::printf(
      "storage S in 64-bit words: jl/countsketch/qjl m = S, threshold/priority m = S/1.5 "
      "samples\n");

  auto table = [&](const char *title, auto value, const char *fmt) {
    std::printf("\n%s\n%8s", title, "storage");
    for (const std::string &m : cfg.methods) std::printf(" %12s", m.c_str());
    std::printf("\n");
    for (size_t b = 0; b < nb; ++b) {
      std::printf("%8lld", static_cast<long long>(storages[b]));
      for (size_t m = 0; m < nm; ++m) std::printf(fmt, value(res.total[b][m]));
      std::printf("\n");
    }
  };
  table(
      "mean |est - <q,k>| / (||q|| ||k||)",
      [](const Cell &c) { return c.pairs ? c.err_sum / double(c.pairs) : NAN; }, " %12.5f");
  table(
      "top-1: share of queries whose best estimated key is an exact best key",
      [](const Cell &c) { return c.queries ? double(c.top1) / double(c.queries) : NAN; },
      " %12.3f");
  table(
      "top-8 recall: |estimated top 8 & exact top 8| / 8",
      [](const Cell &c) { return c.topk_den ? double(c.topk_hits) / double(c.topk_den) : NAN; },
      " %12.3f");
  char bytes_title[160];
  std::snprintf(bytes_title, sizeof bytes_title,
                "mean key sketch bytes, header included (the key itself: %d bytes f32, %d f16)",
                4 * cap.hd, 2 * cap.hd);
  table(
      bytes_title, [](const Cell &c) { return c.keys ? c.key_bytes / double(c.keys) : NAN; },
      " %12.1f");

  std::printf("\nper layer at storage %lld: mean |est - <q,k>| / (||q|| ||k||)\n%8s",
              static_cast<long long>(storages[res.mid]), "layer");
  for (const std::string &m : cfg.methods) std::printf(" %12s", m.c_str());
  std::printf("\n");
  for (size_t s = 0; s < cap.layers.size(); ++s) {
    std::printf("%8d", cap.layers[s]);
    for (size_t m = 0; m < nm; ++m) {
      const Cell &c = res.per_layer[s][m];
      std::printf(" %12.5f", c.pairs ? c.err_sum / double(c.pairs) : NAN);
    }
    std::printf("\n");
  }
}

// The error and top-8 recall charts, PREFIX-error.png and PREFIX-top8.png. Returns 0, or 1 after
// printing why one could not be written.
int write_charts(const RealConfig &cfg, const Capture &cap, const std::vector<int64_t> &storages,
                 const Results &res) {
  const size_t nb = storages.size(), nm = cfg.methods.size();
  std::string model_stem = cfg.model.substr(cfg.model.find_last_of('/') + 1);  // npos + 1 = 0
  if (model_stem.size() > 5 && model_stem.compare(model_stem.size() - 5, 5, ".gguf") == 0)
    model_stem.resize(model_stem.size() - 5);
  for (int which = 0; which < 2; ++which) {
    pngchart::Chart chart;
    char title[160];
    std::snprintf(title, sizeof title, "%s on real q/k: %s (d = %d)",
                  which == 0 ? "Error" : "Top-8 recall", model_stem.c_str(), cap.hd);
    chart.title = title;
    chart.x_label = "storage (64-bit words)";
    chart.y_label = which == 0 ? "mean |est - <q,k>| / (|q| |k|)" : "|est top 8 & exact top 8| / 8";
    chart.log_x = true;
    chart.log_y = which == 0;
    for (size_t m = 0; m < nm; ++m) {
      pngchart::Series s{cfg.methods[m], {}, {}, 0, true};
      for (size_t b = 0; b < nb; ++b) {
        const Cell &c = res.total[b][m];
        s.x.push_back(double(storages[b]));
        s.y.push_back(which == 0 ? (c.pairs ? c.err_sum / double(c.pairs) : NAN)
                                 : (c.topk_den ? double(c.topk_hits) / double(c.topk_den) : NAN));
      }
      chart.series.push_back(std::move(s));
    }
    const std::string path = cfg.png_prefix + (which == 0 ? "-error.png" : "-top8.png");
    std::string werr;
    if (!pngchart::write_png(path, chart, &werr)) {
      std::fprintf(stderr, "sketch-eval: %s\n", werr.c_str());
      return 1;
    }
    std::printf("chart: %s\n", path.c_str());
  }
  return 0;
}

int run(const RealConfig &cfg) {
  const Clock::time_point t0 = Clock::now();
  std::string text, error;
  if (!read_text(cfg.text_file, &text, &error)) {
    std::fprintf(stderr, "sketch-eval: %s\n", error.c_str());
    return 1;
  }
  OpenModel model;
  if (!open_model(cfg, &model)) return 1;
  std::vector<int32_t> ids;
  if (!tokenize_text(cfg, model.target, text, &ids)) return 1;

  Capture cap;
  if (int rc = capture_vectors(cfg, model, ids, &cap, t0)) return rc;
  std::vector<int64_t> storages;
  if (int rc = choose_storages(cfg, cap, &storages)) return rc;
  Results res;
  if (int rc = sketch_all(cfg, cap, storages, &res, t0)) return rc;

  print_tables(cfg, cap, model.name, storages, res);
  if (!cfg.no_png)
    if (int rc = write_charts(cfg, cap, storages, res)) return rc;
  std::fprintf(stderr, "sketch-eval: done in %.1f s\n", seconds_since(t0));
  return 0;
}

}  // namespace

bool sketch_eval_real_requested(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--model") == 0 || std::strncmp(argv[i], "--model=", 8) == 0)
      return true;
  return false;
}

std::string sketch_eval_real_help() {
  cli::App app{kRealAbout, kRealName};
  RealConfig cfg;
  define_options(app, &cfg);
  return app.help();
}

int sketch_eval_real(int argc, char **argv) {
  cli::App app{kRealAbout, kRealName};
  RealConfig cfg;
  define_options(app, &cfg);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  return run(cfg);
}
