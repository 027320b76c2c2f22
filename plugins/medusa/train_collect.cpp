// Medusa head training, steps 1 and 2 of train.h: the corpus plan, and the target's pass over its
// documents into the data cache.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "f16.h"
#include "train_internal.h"

namespace medusa::train_detail {
namespace {

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

}  // namespace

Plan plan_corpus(const Options &o, const specinfer_model_info &info, const specinfer_host_target &t,
                 const specinfer_train_params &p) {
  return Planner(o, info, t, p).make();
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

}  // namespace medusa::train_detail
