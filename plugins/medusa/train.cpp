// Medusa head training (see train.h for the method and the config keys).
#include "train.h"

#include <cblas.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "../../common/splitmix64.h"
#include "../common/plugin_config.h"
#include "../common/plugin_error.h"
#include "f16.h"
#include "heads.h"

namespace medusa {
namespace {

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;
using specinfer_plugin::fail;
using specinfer_plugin::Failure;
using specinfer_plugin::format;

constexpr int kTop = 8;            // target probabilities kept per position
constexpr int kMinDocTokens = 32;  // shorter windows (near-empty files) are skipped
constexpr int kBytesPerToken = 5;  // a window's bytes per wanted token (code: ~3.5 per token)
// Training positions of the probe that measures training's cost (measure_training): 16 minibatches
// of the default size, a few seconds.
constexpr int64_t kProbeTokens = 2048;

struct Options {
  int32_t heads = 2;
  int64_t tokens = 196608;
  int64_t heldout = 4096;
  int32_t vocab = 8192;
  int32_t epochs = 2;
  double minutes = 15;
  double lr = 1e-3;
  double wd = 0.1;
  double warmup = 0.05;
  double offpath = 1.0;
  int32_t rank = 0;
  int32_t token = 1;
  int32_t batch = 128;
  int32_t chunk = 512;
  uint64_t seed = 1;
  bool resume = true;
  bool keep_data = true;
};

Options parse_options(const char *text, const specinfer_model_info &info) {
  Config cfg(text, {"heads", "tokens", "heldout", "vocab", "epochs", "lr", "wd", "batch", "warmup",
                    "chunk", "seed", "resume", "keep_data", "offpath", "rank", "token", "minutes"});
  Options o;
  o.heads = static_cast<int32_t>(cfg.get_int("heads", o.heads, 1, 16));
  o.tokens = cfg.get_int("tokens", o.tokens, 512, int64_t(1) << 34);
  o.heldout = cfg.get_int("heldout", std::min<int64_t>(o.heldout, o.tokens / 8), 64, o.tokens / 2);
  o.vocab = static_cast<int32_t>(
      cfg.get_int("vocab", std::min(o.vocab, info.vocab_size), 16, info.vocab_size));
  o.epochs = static_cast<int32_t>(cfg.get_int("epochs", o.epochs, 1, 1000));
  o.minutes = cfg.get_float("minutes", o.minutes, 0.0, 1e6);
  o.lr = cfg.get_float("lr", o.lr, 1e-7, 1.0);
  o.wd = cfg.get_float("wd", o.wd, 0.0, 10.0);
  o.batch = static_cast<int32_t>(cfg.get_int("batch", o.batch, 1, 4096));
  o.warmup = cfg.get_float("warmup", o.warmup, 0.0, 0.5);
  o.offpath = cfg.get_float("offpath", o.offpath, 0.0, 1.0);
  o.rank = static_cast<int32_t>(cfg.get_int("rank", 0, 0, 2 * info.hidden_size));
  o.token = static_cast<int32_t>(cfg.get_int("token", o.token, 0, 2));
  o.chunk = static_cast<int32_t>(
      cfg.get_int("chunk", std::min(o.chunk, info.n_ctx), kMinDocTokens, info.n_ctx));
  o.seed = static_cast<uint64_t>(cfg.get_int("seed", 1, 0, std::numeric_limits<long>::max()));
  o.resume = cfg.get_int("resume", 1, 0, 1) != 0;
  o.keep_data = cfg.get_int("keep_data", 1, 0, 1) != 0;
  return o;
}

// ---- small utilities ------------------------------------------------------------------------

// splitmix64: a fixed generator, so that plans and shuffles are the same on every platform.
struct Rng : specinfer::SplitMix64 {
  explicit Rng(uint64_t seed) : SplitMix64{seed} {}
  template <typename T>
  void shuffle(std::vector<T> &v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(below(i))]);
  }
};

uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const auto *p = static_cast<const uint8_t *>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
template <typename T>
uint64_t fnv_value(uint64_t h, const T &v) {
  return fnv1a(h, &v, sizeof v);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Context {
 public:
  Context(const specinfer_host *host, const specinfer_train_params *params)
      : host_(host), params_(params) {}

  void log(int32_t level, const std::string &msg) const {
    if (host_ && host_->log) host_->log(host_, level, ("medusa: " + msg).c_str());
  }

  // Reports progress; throws CANCELLED when the callback asks to stop.
  void progress(const char *stage, int64_t done, int64_t total, double loss,
                const std::vector<float> *acc) const {
    if (!params_->progress) return;
    specinfer_train_progress p{};
    p.struct_size = sizeof p;
    p.stage = stage;
    p.done = done;
    p.total = total;
    p.loss = loss;
    p.n_heads = acc ? static_cast<int32_t>(acc->size()) : 0;
    p.accuracy = acc ? acc->data() : nullptr;
    if (params_->progress(params_->user, &p) != 0)
      fail(SPECINFER_ERR_CANCELLED, "medusa: training cancelled (during %s)", stage);
  }

  const specinfer_host *host() const { return host_; }

 private:
  const specinfer_host *host_;
  const specinfer_train_params *params_;
};

// Runs fn(i) for i in [0, n) on the host's threads (inline without parallel_for); the first
// failure is rethrown here (nothing is thrown across the host's threads).
template <typename Fn>
void parallel(const specinfer_host *host, int64_t n, Fn &&fn) {
  struct Ctx {
    Fn *fn = nullptr;
    std::atomic<bool> failed{false};
    specinfer_status code = SPECINFER_OK;
    specinfer_plugin_error err{};
  } ctx;
  ctx.fn = &fn;
  auto body = [](void *p, int64_t b, int64_t e) {
    auto *c = static_cast<Ctx *>(p);
    for (int64_t i = b; i < e; ++i) {
      specinfer_plugin_error err{};
      specinfer_status rc = specinfer_plugin::guarded(&err, "medusa", [&] { (*c->fn)(i); });
      if (rc != SPECINFER_OK && !c->failed.exchange(true)) {
        c->code = rc;
        c->err = err;
      }
    }
  };
  if (host && host->parallel_for)
    host->parallel_for(host, n, 1, body, &ctx);
  else
    body(&ctx, 0, n);
  if (ctx.failed) throw Failure(ctx.code, ctx.err.message);
}

// ---- the corpus plan ------------------------------------------------------------------------

struct Doc {
  std::vector<int32_t> tokens;
};

struct Plan {
  std::vector<Doc> docs;  // held-out documents first
  size_t n_heldout_docs = 0;
  int64_t n_heldout = 0, n_tokens = 0;
};

// Reads bytes [begin, end) of an open file (less at the end of the file).
std::string read_range(FILE *f, const std::string &path, uint64_t begin, uint64_t end) {
  std::string out(static_cast<size_t>(end - begin), '\0');
  if (std::fseek(f, static_cast<long>(begin), SEEK_SET) != 0)
    fail(SPECINFER_ERR_IO, "medusa: cannot seek in corpus file '%s'", path.c_str());
  size_t got = std::fread(out.data(), 1, out.size(), f);
  if (got < out.size() && std::ferror(f))
    fail(SPECINFER_ERR_IO, "medusa: cannot read corpus file '%s': %s", path.c_str(),
         std::strerror(errno));
  out.resize(got);
  return out;
}

class Planner {
 public:
  Planner(const Options &o, const specinfer_model_info &info, const specinfer_host_target &t,
          const specinfer_train_params &p)
      : o_(o),
        info_(info),
        t_(t),
        p_(p),
        window_(static_cast<uint64_t>(o.chunk) * kBytesPerToken) {}

  Plan make() {
    struct File {
      std::string path;
      uint64_t size;
      uint64_t windows;
    };
    std::vector<File> files;
    for (int32_t i = 0; i < p_.n_corpus; ++i) {
      const char *path = p_.corpus[i];
      if (!path || !*path)
        fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: corpus file %d is NULL", i);
      std::string s = path;
      if (s.find("bench/prompts/") != std::string::npos)
        fail(SPECINFER_ERR_CONFIG,
             "medusa: '%s' is an evaluation prompt file; training on it would make measured "
             "acceptance meaningless",
             path);
      struct stat st;
      if (::stat(path, &st) != 0)
        fail(errno == ENOENT ? SPECINFER_ERR_NOT_FOUND : SPECINFER_ERR_IO,
             "medusa: cannot open corpus file '%s': %s", path, std::strerror(errno));
      if (!S_ISREG(st.st_mode))
        fail(SPECINFER_ERR_IO, "medusa: corpus entry '%s' is not a regular file", path);
      if (st.st_size == 0) continue;
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      files.push_back({s, size, (size + window_ - 1) / window_});
    }
    Rng rng(o_.seed * 0x2545f4914f6cdd1dull + 17);
    rng.shuffle(files);

    Plan plan;
    std::vector<std::pair<uint32_t, uint64_t>> windows;  // (file, window) to train on, in order
    // Held-out: with enough files, one window from each of the first files (at most half of
    // them), which then stay out of training altogether.
    size_t next_file = 0;
    if (files.size() >= 8) {
      for (; next_file < files.size() / 2 && o_.heldout - plan.n_heldout >= kMinDocTokens;
           ++next_file) {
        const File &f = files[next_file];
        Rng wr(o_.seed ^ fnv1a(0xcbf29ce484222325ull, f.path.data(), f.path.size()));
        add(plan, f.path, wr.below(f.windows), o_.heldout - plan.n_heldout);
        plan.n_heldout = plan.n_tokens;
      }
      for (size_t i = next_file; i < files.size(); ++i)
        for (uint64_t w = 0; w < files[i].windows; ++w)
          windows.emplace_back(static_cast<uint32_t>(i), w);
      rng.shuffle(windows);
    }
    // Otherwise (few files), the held-out documents are the first windows of all in a shuffled
    // order, and training takes the rest.
    if (o_.heldout - plan.n_heldout >= kMinDocTokens) {
      plan = Plan();
      windows.clear();
      for (size_t i = 0; i < files.size(); ++i)
        for (uint64_t w = 0; w < files[i].windows; ++w)
          windows.emplace_back(static_cast<uint32_t>(i), w);
      rng.shuffle(windows);
      size_t used = 0;
      for (; used < windows.size() && o_.heldout - plan.n_heldout >= kMinDocTokens; ++used) {
        add(plan, files[windows[used].first].path, windows[used].second,
            o_.heldout - plan.n_heldout);
        plan.n_heldout = plan.n_tokens;
      }
      windows.erase(windows.begin(), windows.begin() + static_cast<ptrdiff_t>(used));
    }
    plan.n_heldout_docs = plan.docs.size();
    if (o_.heldout - plan.n_heldout >= kMinDocTokens)
      fail(SPECINFER_ERR_CONFIG,
           "medusa: the corpus (%d files) gives only %lld tokens, not even the %lld held out for "
           "evaluation",
           p_.n_corpus, (long long)plan.n_tokens, (long long)o_.heldout);
    for (const auto &[fi, w] : windows) {
      if (o_.tokens - plan.n_tokens < kMinDocTokens) break;
      add(plan, files[fi].path, w, o_.tokens - plan.n_tokens);
    }
    const int64_t n_train = plan.n_tokens - plan.n_heldout;
    if (n_train < 256)
      fail(SPECINFER_ERR_CONFIG,
           "medusa: the corpus gives only %lld training tokens after %lld held out; give more "
           "text",
           (long long)n_train, (long long)plan.n_heldout);
    return plan;
  }

 private:
  // Appends window w of `path` (at most `room` tokens) as a document, unless it is too short.
  void add(Plan &plan, const std::string &path, uint64_t w, int64_t room) {
    if (room < kMinDocTokens) return;
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f)
      fail(SPECINFER_ERR_IO, "medusa: cannot open corpus file '%s': %s", path.c_str(),
           std::strerror(errno));
    std::string text;
    try {
      // The window runs from the first line start at or after w * window_ to the first line start
      // at or after (w + 1) * window_, so the windows of a file partition its lines.
      const uint64_t slack = 4096;
      uint64_t begin = w * window_, end = begin + window_;
      std::string buf = read_range(f, path, begin, end + slack);
      size_t b = 0;
      if (begin > 0) {
        // A line starts at `begin` if the byte before it is a newline.
        std::string prev = read_range(f, path, begin - 1, begin);
        if (prev != "\n") {
          size_t nl = buf.find('\n');
          b = nl == std::string::npos ? buf.size() : nl + 1;
        }
      }
      size_t e = std::min<size_t>(buf.size(), window_);
      if (e < buf.size()) {
        size_t nl = buf.find('\n', e > 0 ? e - 1 : 0);
        e = nl == std::string::npos ? buf.size() : nl + 1;
      }
      if (b < e) text = buf.substr(b, e - b);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
    if (text.size() < kMinDocTokens) return;
    std::vector<int32_t> tok(text.size() + 16);
    size_t n = 0;
    specinfer_plugin_error e{};
    specinfer_status rc = t_.vtable->tokenize(t_.self, text.data(), text.size(), 1, 0, tok.data(),
                                              tok.size(), &n, &e);
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL) {
      tok.resize(n);
      rc = t_.vtable->tokenize(t_.self, text.data(), text.size(), 1, 0, tok.data(), tok.size(), &n,
                               &e);
    }
    if (rc != SPECINFER_OK)
      throw Failure(rc, "medusa: the target cannot tokenize '" + path + "': " + e.message);
    n = std::min<size_t>({n, static_cast<size_t>(o_.chunk), static_cast<size_t>(room)});
    if (n < static_cast<size_t>(kMinDocTokens)) return;
    for (size_t i = 0; i < n; ++i)
      if (tok[i] < 0 || tok[i] >= info_.vocab_size)
        fail(SPECINFER_ERR_PLUGIN, "medusa: the target's tokenizer returned token %d", tok[i]);
    tok.resize(n);
    plan.docs.push_back({std::move(tok)});
    plan.n_tokens += static_cast<int64_t>(n);
  }

  const Options &o_;
  const specinfer_model_info &info_;
  const specinfer_host_target &t_;
  const specinfer_train_params &p_;
  const uint64_t window_;
};

// ---- collection -----------------------------------------------------------------------------

struct Data {
  int32_t H = 0;
  int64_t n = 0;                 // positions
  int64_t n_heldout = 0;         // positions [0, n_heldout) are held out
  std::vector<int32_t> token;    // [n] the text
  std::vector<int64_t> end;      // [n] one past the last position of the position's document
  std::vector<uint16_t> hidden;  // [n][H] f16
  std::vector<int32_t> top_id;   // [n][kTop] the target's most probable next tokens, best first
  std::vector<float> top_p;      // [n][kTop] their probabilities
};

constexpr char kDataMagic[8] = {'M', 'E', 'D', 'U', 'S', 'A', 'D', '1'};

struct DataHeader {
  char magic[8];
  uint32_t hidden;
  uint32_t top;
  uint64_t fingerprint;
};

// The data cache: a header, then one record per document in plan order:
//   u32 n, i32 tokens[n], u16 hidden[n][H], i32 top_id[n][kTop], f32 top_p[n][kTop].
class DataCache {
 public:
  DataCache(std::string path, const DataHeader &h) : path_(std::move(path)), header_(h) {}
  ~DataCache() {
    if (f_) std::fclose(f_);
  }

  // Loads the stored documents that match the plan into `data` (documents [0, k)); returns k. A
  // stored document may be longer than the plan's (a run with more tokens stored it whole, this
  // plan cuts it at `tokens`): its prefix is used. Records after the last one used stay in the
  // file (a run with fewer tokens keeps a larger run's data); if the plan needs more, the file is
  // cut after the last matching record and left open for appending.
  size_t open(const Plan &plan, Data &data, bool reuse) {
    size_t k = 0;
    long good = 0;
    if (reuse) {
      if (FILE *f = std::fopen(path_.c_str(), "rb")) {
        struct stat st;
        const uint64_t file_size = fstat(fileno(f), &st) == 0 ? uint64_t(st.st_size) : 0;
        const size_t H = header_.hidden;
        const uint64_t row_bytes = 4 + 2 * uint64_t(H) + 8 * kTop;
        DataHeader h{};
        if (std::fread(&h, sizeof h, 1, f) == 1 && std::memcmp(&h, &header_, sizeof h) == 0) {
          good = static_cast<long>(sizeof h);
          std::vector<int32_t> tok;
          for (; k < plan.docs.size(); ++k) {
            const auto &doc = plan.docs[k].tokens;
            uint32_t n = 0;
            if (std::fread(&n, 4, 1, f) != 1 || n < doc.size() ||
                uint64_t(n) * row_bytes > file_size - uint64_t(good) - 4)
              break;
            tok.resize(n);
            if (std::fread(tok.data(), 4, n, f) != n ||
                !std::equal(doc.begin(), doc.end(), tok.begin()))
              break;
            const size_t off = data.token.size();
            grow(data, n);
            if (std::fread(data.hidden.data() + off * H, 2, n * H, f) != n * H ||
                std::fread(data.top_id.data() + off * kTop, 4, size_t(n) * kTop, f) !=
                    size_t(n) * kTop ||
                std::fread(data.top_p.data() + off * kTop, 4, size_t(n) * kTop, f) !=
                    size_t(n) * kTop) {
              shrink(data, off);
              break;
            }
            shrink(data, off + doc.size());
            std::copy(doc.begin(), doc.end(), data.token.begin() + static_cast<ptrdiff_t>(off));
            good = std::ftell(f);
          }
        }
        std::fclose(f);
      }
    }
    if (k == plan.docs.size()) return k;  // all there: nothing to append
    if (good > 0) {
      if (::truncate(path_.c_str(), good) != 0 || !(f_ = std::fopen(path_.c_str(), "r+b")) ||
          std::fseek(f_, good, SEEK_SET) != 0)
        fail(SPECINFER_ERR_IO, "medusa: cannot reopen the data cache '%s': %s", path_.c_str(),
             std::strerror(errno));
    } else {
      f_ = std::fopen(path_.c_str(), "wb");
      if (!f_ || std::fwrite(&header_, sizeof header_, 1, f_) != 1)
        fail(SPECINFER_ERR_IO, "medusa: cannot write the data cache '%s': %s", path_.c_str(),
             std::strerror(errno));
    }
    return k;
  }

  void append(const Data &data, int64_t off, uint32_t n) {
    const size_t H = header_.hidden, o = static_cast<size_t>(off);
    bool ok =
        std::fwrite(&n, 4, 1, f_) == 1 && std::fwrite(data.token.data() + o, 4, n, f_) == n &&
        std::fwrite(data.hidden.data() + o * H, 2, n * H, f_) == n * H &&
        std::fwrite(data.top_id.data() + o * kTop, 4, size_t(n) * kTop, f_) == size_t(n) * kTop &&
        std::fwrite(data.top_p.data() + o * kTop, 4, size_t(n) * kTop, f_) == size_t(n) * kTop &&
        std::fflush(f_) == 0;
    if (!ok)
      fail(SPECINFER_ERR_IO, "medusa: cannot write the data cache '%s' (disk full?)",
           path_.c_str());
  }

  void close() {
    if (f_ && std::fclose(f_) != 0)
      fail(SPECINFER_ERR_IO, "medusa: cannot write the data cache '%s'", path_.c_str());
    f_ = nullptr;
  }

  static void grow(Data &d, size_t n) {
    const size_t m = d.token.size() + n;
    d.token.resize(m);
    d.hidden.resize(m * static_cast<size_t>(d.H));
    d.top_id.resize(m * kTop);
    d.top_p.resize(m * kTop);
  }
  static void shrink(Data &d, size_t m) {
    d.token.resize(m);
    d.hidden.resize(m * static_cast<size_t>(d.H));
    d.top_id.resize(m * kTop);
    d.top_p.resize(m * kTop);
  }

 private:
  std::string path_;
  DataHeader header_;
  FILE *f_ = nullptr;
};

void check_target(specinfer_status rc, const specinfer_plugin_error &e, const char *what) {
  if (rc != SPECINFER_OK)
    throw Failure(rc, std::string("medusa: the target's ") + what + " failed: " + e.message);
}

// What training costs on this machine (measure_training): seconds that do not grow with the data
// (preparation, every evaluation on the held-out documents) and seconds per training token (all
// epochs).
struct TrainCost {
  double fixed = 0, per_token = 0;
};

// The share of the budget the estimate may fill: the rest covers the estimate's error and what
// the caller spent before the run (loading the target).
constexpr double kBudgetShare = 0.98;

// The time budget of a run (Options::minutes): collection stops before the document whose pass,
// added to the time spent and to training's cost on everything collected, would end past
// kBudgetShare of it. Training's cost is measured once, when the held-out documents and one to
// train on are in.
struct Budget {
  double start = 0;    // now_seconds() at the run's start
  double seconds = 0;  // the whole run's budget; 0 = none
  std::function<TrainCost(const Data &)> measure;
};

// Sets data.n, data.end and data.n_heldout for the first n_docs documents of the plan (the ones in
// data).
void index_documents(Data &data, const Plan &plan, size_t n_docs) {
  data.n = static_cast<int64_t>(data.token.size());
  data.end.resize(static_cast<size_t>(data.n));
  int64_t pos = 0;
  for (size_t d = 0; d < n_docs; ++d) {
    const int64_t end = pos + static_cast<int64_t>(plan.docs[d].tokens.size());
    for (int64_t i = pos; i < end; ++i) data.end[static_cast<size_t>(i)] = end;
    if (d + 1 == plan.n_heldout_docs) data.n_heldout = end;
    pos = end;
  }
}

// Collection stops before the document that would end the run past the budget (Budget), once
// every held-out document and at least one to train on are in; `plan` keeps the documents
// collected.
Data collect(const Context &cx, const Options &o, Plan &plan, const specinfer_model_info &info,
             const specinfer_host_target &t, const TargetIdentity &id,
             const std::string &cache_path, const Budget &budget) {
  Data data;
  data.H = info.hidden_size;
  const size_t H = static_cast<size_t>(data.H), vocab = static_cast<size_t>(info.vocab_size);
  DataHeader header{};
  std::memcpy(header.magic, kDataMagic, sizeof kDataMagic);
  header.hidden = static_cast<uint32_t>(H);
  header.top = kTop;
  header.fingerprint = id.fingerprint;
  DataCache cache(cache_path, header);
  size_t first = cache.open(plan, data, o.resume);
  if (first > 0)
    cx.log(SPECINFER_LOG_INFO, format("reusing %zu of %zu collected documents from '%s'", first,
                                      plan.docs.size(), cache_path.c_str()));
  cx.progress("collect", static_cast<int64_t>(data.token.size()), plan.n_tokens, NAN, nullptr);

  const specinfer_kernels *k = cx.host()->kernels;
  std::vector<float> logits, hidden;
  std::vector<int32_t> positions;
  double pass_seconds = 0;  // the target's pass over the fresh tokens, with their top-kTop
  int64_t fresh = 0;
  std::optional<TrainCost> cost;
  for (size_t d = first; d < plan.docs.size(); ++d) {
    const auto &doc = plan.docs[d].tokens;
    const int32_t n = static_cast<int32_t>(doc.size());
    if (budget.seconds > 0 && d > plan.n_heldout_docs) {
      if (!cost) {
        index_documents(data, plan, d);
        cost = budget.measure(data);
        cx.log(SPECINFER_LOG_INFO, format("training's cost measured: %.1f s and %.2f ms per token",
                                          cost->fixed, 1e3 * cost->per_token));
      }
      const double pass = fresh > 0 ? pass_seconds / static_cast<double>(fresh) : 0.0;
      const double train_tokens =
          static_cast<double>(static_cast<int64_t>(data.token.size()) - data.n_heldout + n);
      if (now_seconds() - budget.start + pass * n + cost->fixed + cost->per_token * train_tokens >
          kBudgetShare * budget.seconds) {
        cx.log(SPECINFER_LOG_INFO,
               format("time budget: collection stops after %zu of %zu documents (%zu tokens of "
                      "%lld)",
                      d, plan.docs.size(), data.token.size(), (long long)plan.n_tokens));
        plan.docs.resize(d);
        break;
      }
    }
    const double t0 = now_seconds();
    logits.resize(static_cast<size_t>(n) * vocab);
    hidden.assign(static_cast<size_t>(n) * H, NAN);
    positions.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = i;
    specinfer_plugin_error e{};
    check_target(t.vtable->kv_truncate(t.self, 0, &e), e, "kv_truncate");
    specinfer_forward_batch b{};
    b.struct_size = sizeof b;
    b.n_tokens = n;
    b.tokens = doc.data();
    b.positions = positions.data();
    b.n_logits = n;
    b.logits = logits.data();
    b.hidden = hidden.data();
    check_target(t.vtable->forward(t.self, &b, &e), e, "forward");
    if (!std::isfinite(hidden[0]) || !std::isfinite(hidden[hidden.size() - 1]))
      fail(SPECINFER_ERR_UNSUPPORTED,
           "medusa: the target (%s) does not return its hidden state, which Medusa heads need",
           id.name.c_str());
    const size_t off = data.token.size();
    DataCache::grow(data, static_cast<size_t>(n));
    std::copy(doc.begin(), doc.end(), data.token.begin() + static_cast<ptrdiff_t>(off));
    for (size_t i = 0; i < static_cast<size_t>(n) * H; ++i)
      data.hidden[off * H + i] = f32_to_f16(hidden[i]);
    // Softmax and top-kTop per position, in parallel.
    parallel(cx.host(), n, [&](int64_t i) {
      float *row = logits.data() + static_cast<size_t>(i) * vocab;
      k->softmax(row, static_cast<int64_t>(vocab));
      int32_t *ids = data.top_id.data() + (off + static_cast<size_t>(i)) * kTop;
      float *ps = data.top_p.data() + (off + static_cast<size_t>(i)) * kTop;
      for (int j = 0; j < kTop; ++j) {
        ids[j] = 0;
        ps[j] = -1.0f;
      }
      for (size_t v = 0; v < vocab; ++v) {
        const float p = row[v];
        if (p <= ps[kTop - 1]) continue;
        int j = kTop - 1;
        for (; j > 0 && ps[j - 1] < p; --j) {
          ps[j] = ps[j - 1];
          ids[j] = ids[j - 1];
        }
        ps[j] = p;
        ids[j] = static_cast<int32_t>(v);
      }
    });
    cache.append(data, static_cast<int64_t>(off), static_cast<uint32_t>(n));
    fresh += n;
    pass_seconds += now_seconds() - t0;
    cx.progress("collect", static_cast<int64_t>(data.token.size()), plan.n_tokens, NAN, nullptr);
  }
  cache.close();
  if (fresh > 0)
    cx.log(SPECINFER_LOG_INFO,
           format("collected %lld tokens in %.1f s (%.1f tokens/s)", (long long)fresh, pass_seconds,
                  fresh / std::max(pass_seconds, 1e-9)));
  specinfer_plugin_error e{};
  check_target(t.vtable->kv_truncate(t.self, 0, &e), e, "kv_truncate");
  index_documents(data, plan, plan.docs.size());
  return data;
}

// ---- vocabulary and labels ------------------------------------------------------------------

// The `n` tokens the target chose most often as its top-1 on the training positions (ties: more
// top-kTop probability mass, then the lower id), sorted by id.
std::vector<int32_t> choose_vocab(const Data &data, int32_t vocab_size, int32_t n) {
  std::vector<double> score(static_cast<size_t>(vocab_size), 0.0);
  for (int64_t g = data.n_heldout; g < data.n; ++g) {
    const int32_t *ids = data.top_id.data() + static_cast<size_t>(g) * kTop;
    const float *ps = data.top_p.data() + static_cast<size_t>(g) * kTop;
    score[static_cast<size_t>(ids[0])] += 1.0;
    // The mass term (< 1 per position) only breaks ties between equal top-1 counts... mostly.
    for (int j = 0; j < kTop; ++j) score[static_cast<size_t>(ids[j])] += 1e-3 * ps[j];
  }
  std::vector<int32_t> order;
  for (int32_t v = 0; v < vocab_size; ++v)
    if (score[static_cast<size_t>(v)] > 0) order.push_back(v);
  const size_t m = std::min(order.size(), static_cast<size_t>(n));
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(m), order.end(),
                    [&](int32_t a, int32_t b) {
                      const double sa = score[static_cast<size_t>(a)],
                                   sb = score[static_cast<size_t>(b)];
                      return sa != sb ? sa > sb : a < b;
                    });
  order.resize(m);
  std::sort(order.begin(), order.end());
  return order;
}

// The heads' token input: for every token of the corpus, the target's output row scaled as
// token_row() does, kept once per distinct token.
struct TokenInput {
  int32_t H = 0;
  std::vector<int32_t> slot;  // [target vocabulary] row index, -1 if the token is not in the corpus
  std::vector<float> rows;    // [distinct tokens][H]

  void row(int32_t token, float *dst) const {
    const float *src = rows.data() + static_cast<size_t>(slot[static_cast<size_t>(token)]) * H;
    std::copy(src, src + H, dst);
  }

  static TokenInput make(const Data &data, int32_t vocab_size,
                         const specinfer_host_target &target) {
    TokenInput t;
    t.H = data.H;
    t.slot.assign(static_cast<size_t>(vocab_size), -1);
    std::vector<int32_t> ids;
    for (int32_t tok : data.token)
      if (t.slot[static_cast<size_t>(tok)] < 0) {
        t.slot[static_cast<size_t>(tok)] = static_cast<int32_t>(ids.size());
        ids.push_back(tok);
      }
    t.rows.resize(ids.size() * static_cast<size_t>(t.H));
    specinfer_plugin_error e{};
    check_target(target.vtable->output_rows(target.self, ids.data(),
                                            static_cast<int32_t>(ids.size()), t.rows.data(), &e),
                 e, "output_rows");
    for (size_t i = 0; i < ids.size(); ++i)
      token_row(t.rows.data() + i * static_cast<size_t>(t.H), t.H);
    return t;
  }
};

// Per position: the target's distribution there restricted to the vocabulary (indices into it,
// renormalized; -1 = none) and the vocabulary index of its top-1 (-1 if outside).
struct Labels {
  std::vector<int32_t> idx;  // [n][kTop]
  std::vector<float> q;      // [n][kTop]
  std::vector<int32_t> top;  // [n]
  bool any(int64_t g) const { return idx[static_cast<size_t>(g) * kTop] >= 0; }
};

Labels make_labels(const Data &data, const std::vector<int32_t> &vocab, int32_t vocab_size) {
  std::vector<int32_t> index(static_cast<size_t>(vocab_size), -1);
  for (size_t i = 0; i < vocab.size(); ++i)
    index[static_cast<size_t>(vocab[i])] = static_cast<int32_t>(i);
  Labels l;
  l.idx.assign(static_cast<size_t>(data.n) * kTop, -1);
  l.q.assign(static_cast<size_t>(data.n) * kTop, 0.0f);
  l.top.assign(static_cast<size_t>(data.n), -1);
  for (int64_t g = 0; g < data.n; ++g) {
    const size_t o = static_cast<size_t>(g) * kTop;
    l.top[static_cast<size_t>(g)] = index[static_cast<size_t>(data.top_id[o])];
    float sum = 0.0f;
    int m = 0;
    for (int j = 0; j < kTop; ++j) {
      const int32_t vi = index[static_cast<size_t>(data.top_id[o + j])];
      if (vi < 0 || !(data.top_p[o + j] > 0.0f)) continue;
      l.idx[o + m] = vi;
      l.q[o + m] = data.top_p[o + j];
      sum += data.top_p[o + j];
      ++m;
    }
    for (int j = 0; j < m; ++j) l.q[o + j] /= sum;
  }
  return l;
}

// ---- the heads and their training -----------------------------------------------------------

float silu(float z) {
  return z / (1.0f + std::exp(-z));
}

// A trained tensor: values, gradient and AdamW moments.
struct Param {
  std::vector<float> p, g, m, v;
  bool decay = true;  // weight decay applies (matrices, not biases)
  void init(size_t n, bool with_decay) {
    p.assign(n, 0.0f);
    g.assign(n, 0.0f);
    m.assign(n, 0.0f);
    v.assign(n, 0.0f);
    decay = with_decay;
  }
};

// One head's parameters, optimizer state and scratch. Full rank: W (w). Low rank r: W = A B with
// A [H][r] (a, from zero) and B [r][H] (bm, small random), so the head still starts at zero.
struct Head {
  Param w, b, a, bm;
  std::vector<Param *> params;  // the ones trained
  std::vector<float> z, y, logits, dy, t, dt, weight;
  std::vector<float> x;  // [batch][input]: the head's inputs
  double loss_sum = 0;
  int64_t loss_n = 0;
};

class Trainer {
 public:
  // emb: the heads' token input (TokenInput), empty without one. Trains on at most max_train
  // positions (the first ones).
  Trainer(const Context &cx, const Options &o, const Data &data, const Labels &labels,
          const std::vector<float> &u, int32_t V, const TokenInput &emb,
          int64_t max_train = std::numeric_limits<int64_t>::max())
      : cx_(cx),
        o_(o),
        data_(data),
        lab_(labels),
        u_(u),
        emb_(emb),
        H_(data.H),
        D_((1 + o.token) * data.H),
        V_(V),
        K_(o.heads),
        softmax_(cx.host()->kernels->softmax) {
    const size_t H = static_cast<size_t>(H_), D = static_cast<size_t>(D_),
                 B = static_cast<size_t>(o.batch);
    const size_t R = static_cast<size_t>(o.rank);
    heads_.resize(static_cast<size_t>(K_));
    for (size_t k = 0; k < heads_.size(); ++k) {
      Head &h = heads_[k];
      h.b.init(H, false);
      if (R == 0) {
        h.w.init(H * D, true);
        h.params = {&h.w, &h.b};
      } else {
        h.a.init(H * R, true);
        h.bm.init(R * D, true);
        Rng rng(o.seed * 31 + k + 7);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        for (float &x : h.bm.p)  // uniform with the variance of N(0, 1/D)
          x = scale * std::sqrt(3.0f) *
              (2.0f * static_cast<float>(rng.next() >> 40) / 16777216.0f - 1.0f);
        h.t.resize(B * R);
        h.dt.resize(B * R);
        h.params = {&h.a, &h.bm, &h.b};
      }
      h.z.resize(B * H);
      h.y.resize(B * H);
      h.logits.resize(B * static_cast<size_t>(V_));
      h.dy.resize(B * H);
      h.x.resize(B * D);
    }
    for (int64_t g = data.n_heldout; g < data.n && train_tokens() < max_train; ++g)
      if (g + 1 < data.end[static_cast<size_t>(g)]) train_pos_.push_back(g);
    for (int64_t g = 0; g < data.n_heldout; ++g)
      if (g + 1 < data.end[static_cast<size_t>(g)]) eval_pos_.push_back(g);
  }

  int64_t steps_per_epoch() const {
    return (static_cast<int64_t>(train_pos_.size()) + o_.batch - 1) / o_.batch;
  }
  int64_t train_tokens() const { return static_cast<int64_t>(train_pos_.size()); }
  std::vector<Head> &heads() { return heads_; }
  int64_t &step() { return step_; }
  // W of head k as [H][D] (D = input_size()).
  void head_matrix(size_t k, float *w) const { matrix(heads_[k], w); }
  int32_t input_size() const { return D_; }

  // One epoch (index e) of minibatch AdamW steps; returns the epoch's mean training loss.
  double epoch(int32_t e) {
    std::vector<int64_t> order = train_pos_;
    Rng rng(o_.seed * specinfer::kSplitMix64Gamma + static_cast<uint64_t>(e) + 1);
    rng.shuffle(order);
    const int64_t total = steps_per_epoch() * o_.epochs;
    const int64_t warm = std::max<int64_t>(1, static_cast<int64_t>(o_.warmup * total));
    double epoch_loss = 0;
    int64_t epoch_n = 0;
    double recent = NAN;
    for (size_t s = 0; s < order.size(); s += static_cast<size_t>(o_.batch)) {
      const size_t nb = std::min(order.size() - s, static_cast<size_t>(o_.batch));
      load_x(order.data() + s, nb);
      double lr;
      if (step_ < warm)
        lr = o_.lr * static_cast<double>(step_ + 1) / static_cast<double>(warm);
      else
        lr = o_.lr * 0.5 *
             (1.0 + std::cos(std::numbers::pi * static_cast<double>(step_ - warm) /
                             static_cast<double>(std::max<int64_t>(1, total - warm))));
      ++step_;
      parallel(cx_.host(), K_, [&](int64_t k) {
        Head &h = heads_[static_cast<size_t>(k)];
        h.loss_sum = 0;
        h.loss_n = 0;
        forward(h, static_cast<int32_t>(k), order.data() + s, nb, true);
        backward_and_update(h, nb, lr);
      });
      double loss = 0;
      int64_t n = 0;
      for (const Head &h : heads_) {
        loss += h.loss_sum;
        n += h.loss_n;
      }
      if (n > 0) {
        const double mean = loss / static_cast<double>(n);
        recent = std::isnan(recent) ? mean : 0.95 * recent + 0.05 * mean;
        epoch_loss += loss;
        epoch_n += n;
      }
      cx_.progress("train", step_, total, recent, nullptr);
    }
    return epoch_n ? epoch_loss / static_cast<double>(epoch_n) : NAN;
  }

  struct Eval {
    std::vector<float> accuracy;  // [K][kRanks], on greedy-path positions
    std::vector<float> top1;      // [K] = accuracy[k][0]
    std::vector<float> top1_all;  // [K] top-1 agreement on every position
    std::vector<int64_t> n_path;  // [K] greedy-path positions
    double loss = NAN;            // held-out cross-entropy, every position
  };

  Eval evaluate() {
    const size_t K = static_cast<size_t>(K_);
    std::vector<std::vector<int64_t>> hits(K, std::vector<int64_t>(kRanks, 0));
    std::vector<int64_t> n_path(K, 0), hit_all(K, 0), n_all(K, 0);
    double loss = 0;
    int64_t loss_n = 0;
    // The rank of the target's top-1 among the logits of rows [0, nb) of h, as head k's guesses.
    auto score = [&](const Head &h, int64_t k, const int64_t *pos, size_t nb) {
      const size_t kk = static_cast<size_t>(k);
      for (size_t r = 0; r < nb; ++r) {
        const int64_t g = pos[r], s2 = g + k + 1;
        if (s2 >= data_.end[static_cast<size_t>(g)]) continue;
        const bool path = on_path(g, k);
        const int32_t want = lab_.top[static_cast<size_t>(s2)];
        int64_t rank = kRanks;
        if (want >= 0) {
          const float *row = h.logits.data() + r * static_cast<size_t>(V_);
          const float lw = row[want];
          rank = 0;
          for (int32_t v = 0; v < V_ && rank < kRanks; ++v)
            rank += row[v] > lw || (row[v] == lw && v < want);
        }
        ++n_all[kk];
        hit_all[kk] += rank == 0;
        if (path) {
          ++n_path[kk];
          if (rank < kRanks) ++hits[kk][static_cast<size_t>(rank)];
        }
      }
    };
    for (size_t s = 0; s < eval_pos_.size(); s += static_cast<size_t>(o_.batch)) {
      const size_t nb = std::min(eval_pos_.size() - s, static_cast<size_t>(o_.batch));
      const int64_t *pos = eval_pos_.data() + s;
      load_x(pos, nb);
      parallel(cx_.host(), K_, [&](int64_t k) {
        Head &h = heads_[static_cast<size_t>(k)];
        h.loss_sum = 0;
        h.loss_n = 0;
        forward(h, static_cast<int32_t>(k), pos, nb, false);
        score(h, k, pos, nb);
      });
      for (const Head &h : heads_) {
        loss += h.loss_sum;
        loss_n += h.loss_n;
      }
    }
    Eval ev;
    ev.accuracy.assign(K * kRanks, 0.0f);
    ev.top1.assign(K, 0.0f);
    ev.top1_all.assign(K, 0.0f);
    ev.n_path = n_path;
    for (size_t k = 0; k < K; ++k) {
      for (int r = 0; r < kRanks; ++r)
        ev.accuracy[k * kRanks + r] =
            n_path[k] ? static_cast<float>(hits[k][static_cast<size_t>(r)]) / n_path[k] : 0.0f;
      ev.top1[k] = ev.accuracy[k * kRanks];
      ev.top1_all[k] = n_all[k] ? static_cast<float>(hit_all[k]) / n_all[k] : 0.0f;
    }
    ev.loss = loss_n ? loss / static_cast<double>(loss_n) : NAN;
    return ev;
  }

 private:
  // Every head's inputs at positions pos[0..nb): the hidden state h at g, then the token input:
  // token=1, e(token g + 1) (the token h chose); token=2, head k reads e(token g + k) and
  // e(token g + k + 1), the last two tokens of the path before the one it predicts (zeros past
  // the document's end, where no label is either).
  void load_x(const int64_t *pos, size_t nb) {
    const size_t H = static_cast<size_t>(H_), D = static_cast<size_t>(D_);
    for (size_t r = 0; r < nb; ++r) {
      const size_t g = static_cast<size_t>(pos[r]);
      const int64_t end = data_.end[g];
      const uint16_t *src = data_.hidden.data() + g * H;
      const float *h0 = heads_[0].x.data() + r * D;  // h, converted once
      for (size_t k = 0; k < heads_.size(); ++k) {
        float *dst = heads_[k].x.data() + r * D;
        if (k == 0)
          for (size_t i = 0; i < H; ++i) dst[i] = f16_to_f32(src[i]);
        else
          std::copy(h0, h0 + H, dst);
        for (int32_t j = 0; j < o_.token; ++j) {
          const int64_t t = static_cast<int64_t>(o_.token == 1 ? g + 1 : g + k + j);
          float *e = dst + H * static_cast<size_t>(1 + j);
          if (t < end)
            emb_.row(data_.token[static_cast<size_t>(t)], e);
          else
            std::fill(e, e + H, 0.0f);
        }
      }
    }
  }

  // Whether the text at g follows the target's greedy path for head k: tokens g+1 .. g+k+1 were
  // each the target's top-1 at the position before.
  bool on_path(int64_t g, int64_t k) const {
    for (int64_t i = g; i <= g + k; ++i)
      if (data_.token[static_cast<size_t>(i + 1)] != data_.top_id[static_cast<size_t>(i) * kTop])
        return false;
    return true;
  }

  // Head k on the batch: z = x W^T + b, y = h + silu(z) (h the first H values of x),
  // logits = y U^T, then softmax in place;
  // with `grad`, replaced by d(loss)/d(logits) = (softmax - labels) * weight / total weight. Adds
  // the (unweighted) loss to h.loss_*.
  void forward(Head &h, int32_t k, const int64_t *pos, size_t nb, bool grad) {
    const int H = H_, D = D_, V = V_, B = static_cast<int>(nb);
    for (int r = 0; r < B; ++r)
      std::copy(h.b.p.begin(), h.b.p.end(), h.z.begin() + static_cast<ptrdiff_t>(r) * H);
    if (o_.rank == 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, D, 1.0f, h.x.data(), D,
                  h.w.p.data(), D, 1.0f, h.z.data(), H);
    } else {  // t = x B^T, z += t A^T
      const int R = o_.rank;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, R, D, 1.0f, h.x.data(), D,
                  h.bm.p.data(), D, 0.0f, h.t.data(), R);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, R, 1.0f, h.t.data(), R,
                  h.a.p.data(), R, 1.0f, h.z.data(), H);
    }
    for (size_t r = 0; r < static_cast<size_t>(B); ++r)
      for (size_t i = 0; i < static_cast<size_t>(H); ++i)
        h.y[r * H + i] = h.x[r * D + i] + silu(h.z[r * H + i]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, V, H, 1.0f, h.y.data(), H, u_.data(), H,
                0.0f, h.logits.data(), V);
    // Rows with a label, weighted: positions off the target's greedy path count `offpath`.
    double total_w = 0;
    h.weight.assign(nb, 0.0f);
    for (size_t r = 0; r < nb; ++r) {
      const int64_t s = pos[r] + k + 1;
      if (s < data_.end[static_cast<size_t>(pos[r])] && lab_.any(s)) {
        h.weight[r] = on_path(pos[r], k) ? 1.0f : static_cast<float>(o_.offpath);
        total_w += h.weight[r];
      }
    }
    for (size_t r = 0; r < nb; ++r) {
      float *row = h.logits.data() + r * static_cast<size_t>(V);
      const int64_t s = pos[r] + k + 1;
      if (s >= data_.end[static_cast<size_t>(pos[r])] || !lab_.any(s)) {
        if (grad) std::fill(row, row + V, 0.0f);
        continue;
      }
      const int32_t *idx = lab_.idx.data() + static_cast<size_t>(s) * kTop;
      const float *q = lab_.q.data() + static_cast<size_t>(s) * kTop;
      softmax_(row, V);
      double l = 0;
      for (int j = 0; j < kTop && idx[j] >= 0; ++j)
        l -= q[j] * std::log(std::max(row[idx[j]], 1e-30f));
      h.loss_sum += l;
      ++h.loss_n;
      if (grad) {
        const float scale = total_w > 0 ? h.weight[r] / static_cast<float>(total_w) : 0.0f;
        for (int v = 0; v < V; ++v) row[v] *= scale;
        for (int j = 0; j < kTop && idx[j] >= 0; ++j) row[idx[j]] -= q[j] * scale;
      }
    }
  }

  void backward_and_update(Head &h, size_t nb, double lr) {
    const int H = H_, D = D_, V = V_, B = static_cast<int>(nb);
    // dy = G U; dz = dy * silu'(z); dW = dz^T x (low rank: dA = dz^T t, dt = dz A,
    // dB = dt^T x); db = sum of dz.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, V, 1.0f, h.logits.data(), V,
                u_.data(), H, 0.0f, h.dy.data(), H);
    for (size_t i = 0; i < static_cast<size_t>(B) * H; ++i) {
      const float z = h.z[i], sg = 1.0f / (1.0f + std::exp(-z));
      h.dy[i] *= sg * (1.0f + z * (1.0f - sg));
    }
    if (o_.rank == 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, D, B, 1.0f, h.dy.data(), H,
                  h.x.data(), D, 0.0f, h.w.g.data(), D);
    } else {
      const int R = o_.rank;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, R, B, 1.0f, h.dy.data(), H,
                  h.t.data(), R, 0.0f, h.a.g.data(), R);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, R, H, 1.0f, h.dy.data(), H,
                  h.a.p.data(), R, 0.0f, h.dt.data(), R);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, D, B, 1.0f, h.dt.data(), R,
                  h.x.data(), D, 0.0f, h.bm.g.data(), D);
    }
    std::fill(h.b.g.begin(), h.b.g.end(), 0.0f);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < H; ++i)
        h.b.g[static_cast<size_t>(i)] += h.dy[static_cast<size_t>(r) * H + i];
    for (Param *p : h.params) adamw(*p, lr);
  }

  // W of head k as [H][D] (low rank: A B).
  void matrix(const Head &h, float *w) const {
    const int H = H_, D = D_;
    if (o_.rank == 0) {
      std::copy(h.w.p.begin(), h.w.p.end(), w);
    } else {
      const int R = o_.rank;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, H, D, R, 1.0f, h.a.p.data(), R,
                  h.bm.p.data(), D, 0.0f, w, D);
    }
  }

  void adamw(Param &p, double lr) const {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const double t = static_cast<double>(step_);
    const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(b1, t)));
    const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(b2, t)));
    const float a = static_cast<float>(lr);
    const float decay = static_cast<float>(1.0 - (p.decay ? lr * o_.wd : 0.0));
    for (size_t i = 0; i < p.p.size(); ++i) {
      const float g = p.g[i];
      p.m[i] = b1 * p.m[i] + (1.0f - b1) * g;
      p.v[i] = b2 * p.v[i] + (1.0f - b2) * g * g;
      p.p[i] = p.p[i] * decay - a * (p.m[i] * c1) / (std::sqrt(p.v[i] * c2) + eps);
    }
  }

  const Context &cx_;
  const Options &o_;
  const Data &data_;
  const Labels &lab_;
  const std::vector<float> &u_;
  const TokenInput &emb_;
  const int32_t H_, D_, V_, K_;
  void (*const softmax_)(float *, int64_t);
  std::vector<Head> heads_;
  std::vector<int64_t> train_pos_, eval_pos_;
  int64_t step_ = 0;
};

// ---- checkpoints ----------------------------------------------------------------------------

constexpr char kCkptMagic[8] = {'M', 'E', 'D', 'U', 'S', 'A', 'C', '1'};

// The checkpoint's key: everything the training's result depends on.
uint64_t checkpoint_key(const Options &o, const Data &data, const std::vector<int32_t> &vocab,
                        uint64_t fingerprint) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv_value(h, fingerprint);
  h = fnv_value(h, data.n);
  h = fnv_value(h, data.n_heldout);
  h = fnv1a(h, data.token.data(), data.token.size() * sizeof(int32_t));
  h = fnv1a(h, vocab.data(), vocab.size() * sizeof(int32_t));
  for (double v : {double(o.heads), double(o.epochs), o.lr, o.wd, double(o.batch), o.warmup,
                   o.offpath, double(o.rank), double(o.token), double(o.seed)})
    h = fnv_value(h, v);
  return h;
}

struct CkptHeader {
  char magic[8];
  uint64_t key;
  int64_t step;
  int32_t epochs_done;
  int32_t heads;
  int32_t hidden;
  int32_t reserved;
};

void save_checkpoint(const std::string &path, uint64_t key, int32_t epochs_done, int64_t step,
                     const std::vector<Head> &heads, int32_t H) {
  const std::string tmp = path + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    fail(SPECINFER_ERR_IO, "medusa: cannot write checkpoint '%s': %s", tmp.c_str(),
         std::strerror(errno));
  CkptHeader h{};
  std::memcpy(h.magic, kCkptMagic, sizeof kCkptMagic);
  h.key = key;
  h.step = step;
  h.epochs_done = epochs_done;
  h.heads = static_cast<int32_t>(heads.size());
  h.hidden = H;
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1;
  for (const Head &hd : heads)
    for (const Param *p : hd.params)
      for (const std::vector<float> *v : {&p->p, &p->m, &p->v})
        ok = ok && std::fwrite(v->data(), sizeof(float), v->size(), f) == v->size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(SPECINFER_ERR_IO, "medusa: cannot write checkpoint '%s'", path.c_str());
  }
}

// Loads a checkpoint with this key into `heads`; returns the epochs it had finished (0 if none).
int32_t load_checkpoint(const std::string &path, uint64_t key, std::vector<Head> &heads, int32_t H,
                        int64_t &step) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  CkptHeader h{};
  bool ok = std::fread(&h, sizeof h, 1, f) == 1 &&
            std::memcmp(h.magic, kCkptMagic, sizeof kCkptMagic) == 0 && h.key == key &&
            h.heads == static_cast<int32_t>(heads.size()) && h.hidden == H && h.epochs_done > 0;
  // Read into copies: a bad checkpoint leaves the fresh heads as they are.
  std::vector<std::vector<float>> values;
  for (Head &hd : heads)
    for (Param *p : hd.params)
      for (std::vector<float> *v : {&p->p, &p->m, &p->v}) {
        values.emplace_back(v->size());
        ok = ok && std::fread(values.back().data(), sizeof(float), v->size(), f) == v->size();
      }
  ok = ok && std::fgetc(f) == EOF;
  std::fclose(f);
  if (!ok) return 0;
  size_t i = 0;
  for (Head &hd : heads)
    for (Param *p : hd.params)
      for (std::vector<float> *v : {&p->p, &p->m, &p->v}) *v = std::move(values[i++]);
  step = h.step;
  return h.epochs_done;
}

// What the heads train against: the vocabulary, the target's output rows for it (U), the labels
// and the token input.
struct Prepared {
  std::vector<int32_t> vocab;
  std::vector<float> u;
  Labels labels;
  TokenInput emb;
};

// pad: fill the vocabulary up to `vocab` tokens with the lowest ids not chosen, so that a probe on
// little data does the work of the whole run's vocabulary.
Prepared prepare(const Options &o, const Data &data, const specinfer_model_info &info,
                 const specinfer_host_target &target, bool pad) {
  Prepared p;
  p.vocab = choose_vocab(data, info.vocab_size, o.vocab);
  if (pad && p.vocab.size() < static_cast<size_t>(o.vocab)) {
    std::vector<bool> in(static_cast<size_t>(info.vocab_size), false);
    for (int32_t v : p.vocab) in[static_cast<size_t>(v)] = true;
    for (int32_t v = 0; v < info.vocab_size && p.vocab.size() < static_cast<size_t>(o.vocab); ++v)
      if (!in[static_cast<size_t>(v)]) p.vocab.push_back(v);
    std::sort(p.vocab.begin(), p.vocab.end());
  }
  const int32_t V = static_cast<int32_t>(p.vocab.size());
  if (V < 2) fail(SPECINFER_ERR_CONFIG, "medusa: the corpus yields a vocabulary of %d tokens", V);
  p.u.resize(static_cast<size_t>(V) * static_cast<size_t>(info.hidden_size));
  specinfer_plugin_error e{};
  check_target(target.vtable->output_rows(target.self, p.vocab.data(), V, p.u.data(), &e), e,
               "output_rows");
  p.labels = make_labels(data, p.vocab, info.vocab_size);
  if (o.token > 0) p.emb = TokenInput::make(data, info.vocab_size, target);
  return p;
}

// Measures training's cost on this machine with the data collected so far (the held-out documents
// and at least one to train on): the preparation, one evaluation and one epoch over at most
// kProbeTokens positions at the run's vocabulary size, scaled to the run's epochs and evaluations
// (one before training, one after each epoch). Progress reports are muted meanwhile.
TrainCost measure_training(const specinfer_host *host, const specinfer_train_params &params,
                           const Options &o, const Data &data, const specinfer_model_info &info,
                           const specinfer_host_target &target) {
  specinfer_train_params quiet = params;
  quiet.progress = nullptr;
  const Context cx(host, &quiet);
  const double t0 = now_seconds();
  const Prepared p = prepare(o, data, info, target, true);
  Trainer tr(cx, o, data, p.labels, p.u, static_cast<int32_t>(p.vocab.size()), p.emb, kProbeTokens);
  const double t1 = now_seconds();
  tr.evaluate();
  const double t2 = now_seconds();
  tr.epoch(0);
  const double t3 = now_seconds();
  TrainCost c;
  c.fixed = (t1 - t0) + (o.epochs + 1) * (t2 - t1);
  c.per_token = o.epochs * (t3 - t2) / static_cast<double>(std::max<int64_t>(1, tr.train_tokens()));
  return c;
}

std::string join_accuracy(const std::vector<float> &a) {
  std::string s;
  for (float x : a) s += format("%s%.3f", s.empty() ? "" : " ", x);
  return s;
}

void train(const specinfer_host *host, const specinfer_train_params *params,
           const specinfer_model_info *info_in, const specinfer_host_target *target) {
  if (!host || !params || !target || !target->vtable)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: NULL argument");
  if (params->struct_size < offsetof(specinfer_train_params, user) + sizeof(params->user))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: params struct too small");
  if (!params->out_path || !*params->out_path)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: no output path");
  if (params->n_corpus <= 0 || !params->corpus)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: no corpus files");
  if (!host->kernels || !host->kernels->softmax)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the host has no softmax kernel");
  const specinfer_target_vtable *vt = target->vtable;
  if (!vt->info || !vt->tokenize || !vt->forward || !vt->kv_truncate)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the target lacks tokenize, forward or kv_truncate");
  specinfer_model_info info{};
  info.struct_size = sizeof info;
  if (info_in && info_in->struct_size >= sizeof info) {
    info = *info_in;
  } else {
    specinfer_status rc = vt->info(target->self, &info);
    if (rc != SPECINFER_OK) throw Failure(rc, "medusa: the target's info failed");
  }
  const double start = now_seconds();
  const Options o = parse_options(params->config, info);
  // Through OpenBLAS from several threads at once (one head each): its own threads would
  // oversubscribe the host's. (The host's backend makes the same process-wide choice.)
  openblas_set_num_threads(1);
  Context cx(host, params);
  const TargetIdentity id = identify_target(info, *target);
  const std::string out = params->out_path;

  Plan plan = Planner(o, info, *target, *params).make();
  cx.log(SPECINFER_LOG_INFO,
         format("corpus: %zu documents, %lld tokens (%lld held out)", plan.docs.size(),
                (long long)plan.n_tokens, (long long)plan.n_heldout));
  Budget budget;
  budget.start = start;
  budget.seconds = 60.0 * o.minutes;
  budget.measure = [&](const Data &d) {
    return measure_training(host, *params, o, d, info, *target);
  };
  Data data = collect(cx, o, plan, info, *target, id, out + ".data", budget);
  plan.docs.clear();
  plan.docs.shrink_to_fit();

  const Prepared prep = prepare(o, data, info, *target, false);
  const std::vector<int32_t> &vocab = prep.vocab;
  const int32_t V = static_cast<int32_t>(vocab.size());
  const Labels &labels = prep.labels;
  {
    int64_t covered = 0;
    for (int64_t g = 0; g < data.n_heldout; ++g) covered += labels.top[static_cast<size_t>(g)] >= 0;
    cx.log(SPECINFER_LOG_INFO,
           format("vocabulary: %d tokens; they hold the target's top-1 at %.1f%% of held-out "
                  "positions",
                  V, 100.0 * static_cast<double>(covered) / std::max<int64_t>(1, data.n_heldout)));
  }

  Trainer tr(cx, o, data, labels, prep.u, V, prep.emb);
  const std::string ckpt = out + ".ckpt";
  const uint64_t key = checkpoint_key(o, data, vocab, id.fingerprint);
  int32_t done = o.resume ? load_checkpoint(ckpt, key, tr.heads(), data.H, tr.step()) : 0;
  done = std::min(done, o.epochs);
  if (done > 0)
    cx.log(SPECINFER_LOG_INFO, format("resuming after epoch %d from '%s'", done, ckpt.c_str()));

  Trainer::Eval ev = tr.evaluate();
  cx.log(SPECINFER_LOG_INFO,
         format("epoch %d: held-out loss %.4f, top-1 on the greedy path [%s], "
                "on all positions [%s]",
                done, ev.loss, join_accuracy(ev.top1).c_str(), join_accuracy(ev.top1_all).c_str()));
  cx.progress("evaluate", done, o.epochs, NAN, &ev.top1);
  for (int32_t e = done; e < o.epochs; ++e) {
    const double t0 = now_seconds();
    const double loss = tr.epoch(e);
    const double t1 = now_seconds();
    ev = tr.evaluate();
    cx.log(SPECINFER_LOG_INFO,
           format("epoch %d: train loss %.4f (%.1f s), held-out loss %.4f (%.1f s), top-1 on the "
                  "greedy path [%s], on all positions [%s]",
                  e + 1, loss, t1 - t0, ev.loss, now_seconds() - t1, join_accuracy(ev.top1).c_str(),
                  join_accuracy(ev.top1_all).c_str()));
    cx.progress("evaluate", e + 1, o.epochs, loss, &ev.top1);
    if (e + 1 < o.epochs) save_checkpoint(ckpt, key, e + 1, tr.step(), tr.heads(), data.H);
  }

  Heads heads;
  heads.target = id;
  heads.n_heads = o.heads;
  heads.hidden_size = data.H;
  heads.token_inputs = o.token;
  heads.vocab = vocab;
  const size_t HH = static_cast<size_t>(data.H) * static_cast<size_t>(tr.input_size());
  heads.w.resize(static_cast<size_t>(o.heads) * HH);
  heads.b.resize(static_cast<size_t>(o.heads) * static_cast<size_t>(data.H));
  for (int32_t k = 0; k < o.heads; ++k) {
    const Head &h = tr.heads()[static_cast<size_t>(k)];
    tr.head_matrix(static_cast<size_t>(k), heads.w.data() + static_cast<size_t>(k) * HH);
    std::copy(h.b.p.begin(), h.b.p.end(),
              heads.b.begin() + static_cast<ptrdiff_t>(k) * static_cast<ptrdiff_t>(data.H));
  }
  heads.accuracy = ev.accuracy;
  {
    std::string line;
    for (int32_t k = 0; k < o.heads; ++k) {
      float top4 = 0, top16 = 0;
      for (int r = 0; r < kRanks; ++r) {
        const float a = ev.accuracy[static_cast<size_t>(k) * kRanks + r];
        if (r < 4) top4 += a;
        top16 += a;
      }
      line += format("%shead %d: top-1 %.3f, top-4 %.3f, top-16 %.3f (%lld positions)",
                     k ? "; " : "", k + 1, ev.top1[static_cast<size_t>(k)], top4, top16,
                     (long long)ev.n_path[static_cast<size_t>(k)]);
    }
    cx.log(SPECINFER_LOG_INFO, "held-out accuracy on the greedy path: " + line);
  }
  heads.trained_tokens = tr.train_tokens();
  save_heads(heads, out);
  std::remove(ckpt.c_str());
  if (!o.keep_data) std::remove((out + ".data").c_str());
}

}  // namespace
}  // namespace medusa

specinfer_status medusa_train(const specinfer_host *host, const specinfer_train_params *params,
                              const specinfer_model_info *target_info,
                              const specinfer_host_target *target, specinfer_plugin_error *err) {
  return specinfer_plugin::guarded(err, "medusa",
                                   [&] { medusa::train(host, params, target_info, target); });
}
