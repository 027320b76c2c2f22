// Soak and load run of the library through its public C ABI (abi/specinfer.h), shaped like a
// server: N session slots (default 8) on targets shared from one loaded model, each slot with its
// own drafter (cycling through the --drafter list: plain decoding, ngram, draft-model, medusa),
// split over a few application threads that each step their slots together with
// specinfer_session_step_many (continuous batching: a slot that finishes a request takes the next
// one at once, in a fresh session, as `specinfer serve` does). For the given time it cycles through
// requests (a prompt, greedy or Gumbel-sampled at a fixed seed) and checks every finished text
// against a lone run of the same request made before the soak: plain decoding, greedy or with the
// same seed (the Gumbel coupler makes a seeded text the same whatever the drafter). Meanwhile it
// samples resident memory (VmRSS) every few seconds.
//
// Warm-up ends when every slot has finished --warmup requests (default 2) and a fifth of the run
// has passed, or at half the run if the slots are slower. Each slot's first request is the one
// with the longest prompt, so that by then every slot's caches (a target's KV cache grows by
// doubling, up to the context) have grown to what the longest request needs. Resident memory moves
// by a percent or two between samples (the buffers of a step come and go with its batch), so the
// figures compared are peaks: "after warm-up" is the highest sample in the first tenth of the
// samples after warm-up (at least 3 samples), "at the end" the highest in the last tenth (the last
// one taken as the time is up, before the requests still running drain). The run fails (exit 1)
// when a text differs from its lone run, a call fails, or the end figure exceeds the one after
// warm-up by more than
// --max-growth percent (default 2; not checked when SPECINFER_SANITIZED is set: a sanitizer's
// shadow memory and quarantine grow by design). Exits 77 when the target model's file does not
// exist.
//
//   soak --target {models}/qwen2.5-coder-1.5b.gguf --drafter none --drafter ngram
//        --drafter draft-model:path={models}/qwen2.5-coder-0.5b.gguf --minutes 10
//
// `{models}` in a path or drafter config stands for $SPECINFER_MODELS, else
// ~/.cache/specinfer/models. bench/soak picks the models and drafters and runs this.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <nlohmann/json.hpp>

#include "specinfer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string target;
  std::vector<std::string> drafters;  // "none" or "plugin[:config]"
  std::string prompts;
  int sessions = 8;
  int threads = 2;           // application threads stepping the slots
  int registry_threads = 2;  // the backend's threads
  double minutes = 10;
  int tokens = 48;  // per request
  int n_prompts = 8;
  int n_ctx = 1024;
  int warmup = 2;
  double warmup_fraction = 0.2;  // of the run, at least
  double sample_seconds = 5;
  double max_growth = 2;  // percent
};

[[noreturn]] void usage(const char *why) {
  std::fprintf(stderr,
               "soak: %s\nusage: soak --target GGUF [--drafter none|PLUGIN[:CONFIG]]... "
               "[--prompts JSONL] [--sessions N] [--threads N] [--registry-threads N] "
               "[--minutes M] [--tokens N] [--n-prompts N] [--n-ctx N] [--warmup N] "
               "[--warmup-fraction F] "
               "[--sample-seconds S] [--max-growth PERCENT]\n",
               why);
  std::exit(2);
}

std::string models_dir() {
  if (const char *m = std::getenv("SPECINFER_MODELS"); m && *m) return m;
  const char *home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/specinfer/models";
}

std::string expand(std::string s) {
  const std::string key = "{models}", dir = models_dir();
  for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + dir.size()))
    s.replace(at, key.size(), dir);
  return s;
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char *v = argv[++i];
    char *end = nullptr;
    const double num = std::strtod(v, &end);
    const bool is_num = end && *end == '\0' && end != v;
    const auto count = [&](int lo) {
      if (!is_num || num < lo || num > 1e6 || num != static_cast<int>(num))
        usage((a + " needs a whole number >= " + std::to_string(lo)).c_str());
      return static_cast<int>(num);
    };
    if (a == "--target") {
      o.target = expand(v);
    } else if (a == "--drafter") {
      o.drafters.push_back(expand(v));
    } else if (a == "--prompts") {
      o.prompts = expand(v);
    } else if (a == "--sessions") {
      o.sessions = count(1);
    } else if (a == "--threads") {
      o.threads = count(1);
    } else if (a == "--registry-threads") {
      o.registry_threads = count(1);
    } else if (a == "--tokens") {
      o.tokens = count(1);
    } else if (a == "--n-prompts") {
      o.n_prompts = count(1);
    } else if (a == "--n-ctx") {
      o.n_ctx = count(64);
    } else if (a == "--warmup") {
      o.warmup = count(0);
    } else if (a == "--warmup-fraction") {
      if (!is_num || !(num >= 0 && num <= 0.5)) usage("--warmup-fraction is 0 to 0.5");
      o.warmup_fraction = num;
    } else if (a == "--minutes" || a == "--sample-seconds" || a == "--max-growth") {
      if (!is_num || !(num > 0) || num > 1e4) usage((a + " needs a positive number").c_str());
      (a == "--minutes"          ? o.minutes
       : a == "--sample-seconds" ? o.sample_seconds
                                 : o.max_growth) = num;
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.target.empty()) usage("--target is required");
  if (o.drafters.empty()) o.drafters = {"none", "ngram"};
  o.threads = std::min(o.threads, o.sessions);
  return o;
}

// Resident memory (VmRSS) in bytes, 0 when unknown.
long long resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return 0;
}

// Bytes malloc has handed out and not had back (0 under sanitizers, whose allocator it is not).
long long heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<long long>(m.uordblks + m.hblkhd);
}

double mib(long long bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// One request: a prompt, greedy or sampled at a seed, and what a lone plain-decoding run of it
// gives.
struct Request {
  std::string prompt;
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // generated (prompt excluded)
  std::string text;
};

std::vector<std::string> read_prompts(const std::string &path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "soak: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<std::string> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      std::fprintf(stderr, "soak: %s:%d: not a JSON object with a \"prompt\" string\n",
                   path.c_str(), n);
      std::exit(2);
    }
    out.push_back(j["prompt"].get<std::string>());
  }
  return out;
}

void params_for(const Request &r, specinfer_session_params *p) {
  specinfer_session_params_init(p);
  p->temperature = r.temperature;
  p->top_p = r.top_p;
  p->seed = r.seed;
}

int append_text(void *user, const int32_t *, size_t, const char *text, size_t len) {
  static_cast<std::string *>(user)->append(text, len);
  return 0;
}

// What every thread reports into; guarded by `mutex`.
struct Tally {
  std::mutex mutex;
  std::condition_variable wake;
  int64_t checked = 0, mismatches = 0, errors = 0, tokens = 0, drafted = 0, accepted = 0;
  std::map<std::string, int64_t> checked_by_drafter;
  std::vector<int> finished_per_slot;
  std::vector<std::string> failures;  // the first few, printed at the end
  std::atomic<bool> failed{false};    // an error: no new requests start

  void fail(const std::string &what) {
    if (failures.size() < 10) failures.push_back(what);
  }
};

struct Slot {
  int index = 0;
  std::string drafter_name;
  specinfer_target *target = nullptr;
  specinfer_drafter *drafter = nullptr;
  specinfer_session *session = nullptr;
  size_t request = 0;
  size_t prompt_len = 0;
  std::vector<int32_t> tokens;  // generated so far
  std::string text;
  std::vector<int32_t> room = std::vector<int32_t>(64);
};

class Soak {
 public:
  Soak(const Options &o, const std::vector<Request> &requests, const specinfer_coupler *gumbel,
       Tally *tally)
      : o_(o), requests_(requests), gumbel_(gumbel), tally_(tally) {}

  // Steps `slots` until `stop` is set and every started request has finished.
  void run(std::vector<Slot *> slots, const std::atomic<bool> &stop) {
    specinfer_step_params sp;
    specinfer_step_params_init(&sp);
    for (;;) {
      std::vector<specinfer_session *> active;
      std::vector<specinfer_step_result> results;
      std::vector<Slot *> which;
      for (Slot *s : slots) {
        if (!s->session && !stop.load() && !tally_->failed.load() && !start(*s)) continue;
        if (!s->session) continue;
        specinfer_step_result r{};
        r.struct_size = sizeof r;
        r.tokens = s->room.data();
        // The round emits at most what is left of the request's tokens, as the server asks.
        r.cap = std::min(s->room.size(), static_cast<size_t>(o_.tokens) - s->tokens.size());
        active.push_back(s->session);
        results.push_back(r);
        which.push_back(s);
      }
      if (active.empty()) return;
      specinfer_session_step_many(active.data(), results.data(), active.size(), &sp);
      for (size_t k = 0; k < which.size(); ++k) {
        Slot &s = *which[k];
        if (results[k].status != SPECINFER_OK) {
          finish(s, std::string("step: ") + specinfer_status_str(results[k].status) + ": " +
                        specinfer_session_errmsg(s.session));
          continue;
        }
        s.tokens.insert(s.tokens.end(), results[k].tokens, results[k].tokens + results[k].n_tokens);
        const char *text = nullptr;
        size_t len = 0;
        if (specinfer_session_step_text(s.session, &text, &len) == SPECINFER_OK)
          s.text.append(text, len);
        if (results[k].done || s.tokens.size() >= static_cast<size_t>(o_.tokens)) finish(s, "");
      }
    }
  }

 private:
  // A fresh session on the slot for the next request, its prompt fed.
  bool start(Slot &s) {
    // Each slot's first request is the longest prompt (greedy or sampled), so that warm-up
    // grows every slot's caches to the most any request needs; then the requests in turn.
    const size_t k = next_.fetch_add(1);
    const size_t first = static_cast<size_t>(o_.sessions);
    s.request = k < first ? k % 2 : (k - first) % requests_.size();
    const Request &r = requests_[s.request];
    specinfer_session_params p;
    params_for(r, &p);
    char *err = nullptr;
    if (specinfer_session_create(s.target, s.drafter, r.temperature > 0 ? gumbel_ : nullptr, &p,
                                 &s.session, &err) != SPECINFER_OK) {
      std::lock_guard<std::mutex> lock(tally_->mutex);
      tally_->errors++;
      tally_->failed.store(true);
      tally_->fail("slot " + std::to_string(s.index) + ": session: " + (err ? err : "?"));
      specinfer_free(err);
      return false;
    }
    const int32_t *toks = nullptr;
    if (specinfer_session_feed_text(s.session, r.prompt.data(), r.prompt.size()) != SPECINFER_OK ||
        specinfer_session_tokens(s.session, &toks, &s.prompt_len) != SPECINFER_OK) {
      finish(s, std::string("feed: ") + specinfer_session_errmsg(s.session));
      return false;
    }
    s.tokens.clear();
    s.text.clear();
    return true;
  }

  // Checks the slot's request against its lone run and ends the session.
  void finish(Slot &s, const std::string &error) {
    const Request &r = requests_[s.request];
    specinfer_session_stats st;
    specinfer_session_stats_init(&st);
    specinfer_session_get_stats(s.session, &st);
    specinfer_session_destroy(s.session);
    s.session = nullptr;
    if (s.tokens.size() > static_cast<size_t>(o_.tokens)) s.tokens.resize(o_.tokens);
    const std::string &a = s.text, &b = r.text;
    const bool same =
        s.tokens == r.tokens &&
        (a.size() <= b.size() ? b.compare(0, a.size(), a) : a.compare(0, b.size(), b)) == 0;
    std::lock_guard<std::mutex> lock(tally_->mutex);
    const std::string what = "slot " + std::to_string(s.index) + " (" + s.drafter_name +
                             "), request " + std::to_string(s.request);
    if (!error.empty()) {
      tally_->errors++;
      tally_->failed.store(true);
      tally_->fail(what + ": " + error);
    } else {
      tally_->checked++;
      tally_->checked_by_drafter[s.drafter_name]++;
      tally_->tokens += static_cast<int64_t>(s.tokens.size());
      tally_->drafted += st.n_drafted;
      tally_->accepted += st.n_accepted;
      if (!same) {
        tally_->mismatches++;
        size_t at = 0;
        while (at < s.tokens.size() && at < r.tokens.size() && s.tokens[at] == r.tokens[at]) ++at;
        tally_->fail(what + ": differs from its lone run at generated token " + std::to_string(at) +
                     " (" + std::to_string(s.tokens.size()) + " vs " +
                     std::to_string(r.tokens.size()) + " tokens)");
      }
    }
    tally_->finished_per_slot[s.index]++;
    tally_->wake.notify_all();
  }

  const Options &o_;
  const std::vector<Request> &requests_;
  const specinfer_coupler *gumbel_;
  Tally *tally_;
  std::atomic<size_t> next_{0};
};

bool file_exists(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

int main(int argc, char **argv) {
  const Options o = parse(argc, argv);
  if (!file_exists(o.target)) {
    std::printf("soak: skipped: %s does not exist (scripts/fetch-models)\n", o.target.c_str());
    return 77;
  }
  const bool sanitized = std::getenv("SPECINFER_SANITIZED") != nullptr;
  const auto t_begin = Clock::now();
  const auto since = [&t_begin] {
    return std::chrono::duration<double>(Clock::now() - t_begin).count();
  };
  const long long rss_start = resident_bytes();

  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = o.registry_threads;
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  specinfer_coupler *gumbel = nullptr;
  char *err = nullptr;
  const std::string cfg = "path=" + o.target + ",n_ctx=" + std::to_string(o.n_ctx);
  if (specinfer_registry_create(&rp, &reg, &err) != SPECINFER_OK ||
      specinfer_target_open(reg, "gguf", cfg.c_str(), &target, &err) != SPECINFER_OK ||
      specinfer_coupler_create("gumbel", &gumbel, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "soak: %s\n", err ? err : "?");
    return 1;
  }

  // Requests: the first prompts that leave room for the tokens, each greedy and sampled, the
  // longest prompt first (see Soak::start).
  const std::vector<std::string> prompts = read_prompts(o.prompts);
  std::vector<std::pair<size_t, std::string>> chosen;  // (tokens, prompt)
  for (const std::string &p : prompts) {
    if (static_cast<int>(chosen.size()) >= o.n_prompts) break;
    size_t n = 0;
    specinfer_target_tokenize(target, p.data(), p.size(), 1, 1, nullptr, 0, &n);
    if (static_cast<int>(n) + o.tokens + 32 <= o.n_ctx) chosen.emplace_back(n, p);
  }
  std::stable_sort(chosen.begin(), chosen.end(),
                   [](const auto &a, const auto &b) { return a.first > b.first; });
  std::vector<Request> requests;
  for (const auto &[n, p] : chosen) {
    const uint64_t seed = 1000 + requests.size();
    requests.push_back(Request{p, 0.0f, 1.0f, 0, {}, {}});
    requests.push_back(Request{p, 0.8f, 0.95f, seed, {}, {}});
  }
  if (requests.empty()) {
    std::fprintf(stderr, "soak: no prompt of %s fits in %d tokens\n", o.prompts.c_str(), o.n_ctx);
    return 2;
  }
  // The lone runs: plain decoding, one session at a time.
  for (Request &r : requests) {
    specinfer_session_params p;
    params_for(r, &p);
    specinfer_session *s = nullptr;
    const int32_t *toks = nullptr;
    size_t n = 0, n_prompt = 0;
    if (specinfer_session_create(target, nullptr, r.temperature > 0 ? gumbel : nullptr, &p, &s,
                                 &err) != SPECINFER_OK ||
        specinfer_session_feed_text(s, r.prompt.data(), r.prompt.size()) != SPECINFER_OK ||
        specinfer_session_tokens(s, &toks, &n_prompt) != SPECINFER_OK ||
        specinfer_session_generate(s, o.tokens, append_text, &r.text) != SPECINFER_OK ||
        specinfer_session_tokens(s, &toks, &n) != SPECINFER_OK) {
      std::fprintf(stderr, "soak: lone run: %s\n", s ? specinfer_session_errmsg(s) : err);
      return 1;
    }
    r.tokens.assign(toks + n_prompt, toks + n);
    specinfer_session_destroy(s);
  }
  std::printf("soak: %zu requests (%zu prompts, greedy and sampled), their lone runs in %.1f s\n",
              requests.size(), requests.size() / 2, since());

  // The slots: a target shared from the loaded one and a drafter each.
  std::vector<Slot> slots(o.sessions);
  Tally tally;
  tally.finished_per_slot.assign(o.sessions, 0);
  for (int i = 0; i < o.sessions; ++i) {
    Slot &s = slots[i];
    s.index = i;
    s.drafter_name = o.drafters[i % o.drafters.size()];
    if (specinfer_target_share(target, &s.target, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "soak: share: %s\n", err ? err : "?");
      return 1;
    }
    if (s.drafter_name == "none") continue;
    const size_t colon = s.drafter_name.find(':');
    const std::string plugin = s.drafter_name.substr(0, colon);
    const std::string dcfg = colon == std::string::npos ? "" : s.drafter_name.substr(colon + 1);
    if (specinfer_drafter_open(reg, plugin.c_str(), dcfg.c_str(), s.target, &s.drafter, &err) !=
        SPECINFER_OK) {
      std::fprintf(stderr, "soak: drafter %s: %s\n", s.drafter_name.c_str(), err ? err : "?");
      return 1;
    }
  }

  const double seconds = o.minutes * 60;
  std::printf("soak: %d sessions on %d threads for %.1f min, %d tokens per request; drafters:",
              o.sessions, o.threads, o.minutes, o.tokens);
  for (const std::string &d : o.drafters) std::printf(" %s", d.c_str());
  std::printf("\n");
  std::fflush(stdout);

  Soak soak(o, requests, gumbel, &tally);
  std::atomic<bool> stop{false};
  const double t_soak = since();
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    std::vector<Slot *> mine;
    for (int i = t; i < o.sessions; i += o.threads) mine.push_back(&slots[i]);
    threads.emplace_back([&soak, mine, &stop] { soak.run(mine, stop); });
  }

  // Samples until the time is up: resident memory and malloc'd bytes, kept from the end of
  // warm-up on.
  struct Sample {
    long long rss, heap;
  };
  std::vector<Sample> after;  // from the end of warm-up on
  double t_warm = -1;
  int64_t checked_warm = 0;
  {
    std::unique_lock<std::mutex> lock(tally.mutex);
    for (double next = o.sample_seconds;;) {
      const double now = since() - t_soak;
      if (t_warm < 0) {
        const bool all_warm =
            std::all_of(tally.finished_per_slot.begin(), tally.finished_per_slot.end(),
                        [&o](int n) { return n >= o.warmup; });
        if ((all_warm && now >= o.warmup_fraction * seconds) || now >= seconds / 2) {
          t_warm = now;
          checked_warm = tally.checked;
          std::printf("  %6.0f s  warm-up done (%s), %lld texts checked\n", now,
                      all_warm ? "every session finished its requests" : "half the run",
                      static_cast<long long>(tally.checked));
          next = now;  // a sample now
        }
      }
      const bool last = now >= seconds || tally.failed.load();
      if (now >= next || last) {
        const Sample x{resident_bytes(), heap_bytes()};
        if (t_warm >= 0) after.push_back(x);
        std::printf(
            "  %6.0f s  %8.1f MiB resident  %8.1f MiB malloc'd  %6lld texts checked  "
            "%lld mismatches\n",
            now, mib(x.rss), mib(x.heap), static_cast<long long>(tally.checked),
            static_cast<long long>(tally.mismatches));
        std::fflush(stdout);
        next += o.sample_seconds;
      }
      if (last) break;
      const double wait = std::min(next, seconds) - now;
      tally.wake.wait_for(lock, std::chrono::duration<double>(std::max(wait, 0.01)));
    }
  }
  stop.store(true);
  for (std::thread &t : threads) t.join();
  const double t_run = since() - t_soak;

  for (Slot &s : slots) {
    if (s.drafter) specinfer_drafter_destroy(s.drafter);
    specinfer_target_destroy(s.target);
  }
  specinfer_target_destroy(target);
  specinfer_coupler_destroy(gumbel);
  specinfer_registry_destroy(reg);

  // Resident memory moves by a percent or two from one sample to the next (buffers sized by the
  // step's batch come and go), so the figures compared are the highest sample of the first and of
  // the last window after warm-up, each a tenth of those samples (at least 3).
  const size_t window = std::max<size_t>(3, after.size() / 10);
  const auto peak = [&after, window](bool first, bool heap) {
    long long m = 0;
    const size_t n = std::min(window, after.size());
    for (size_t i = 0; i < n; ++i) {
      const Sample &x = after[first ? i : after.size() - 1 - i];
      m = std::max(m, heap ? x.heap : x.rss);
    }
    return m;
  };
  const long long rss_base = peak(true, false), rss_end = peak(false, false);
  long long rss_min = rss_base, rss_max = rss_base;
  for (const Sample &x : after) {
    rss_min = std::min(rss_min, x.rss);
    rss_max = std::max(rss_max, x.rss);
  }
  const double growth = rss_base ? 100.0 * double(rss_end - rss_base) / double(rss_base) : 0;
  const bool memory_ok = sanitized || (after.size() >= 2 && growth <= o.max_growth);
  std::printf("\nsoak: %d sessions, %.1f min (%.0f s with the last requests draining)\n",
              o.sessions, o.minutes, t_run);
  std::printf("soak: texts checked %lld (", static_cast<long long>(tally.checked));
  bool first = true;
  for (const auto &[name, n] : tally.checked_by_drafter) {
    std::printf("%s%s %lld", first ? "" : ", ", name.c_str(), static_cast<long long>(n));
    first = false;
  }
  std::printf("), mismatches %lld, errors %lld\n", static_cast<long long>(tally.mismatches),
              static_cast<long long>(tally.errors));
  std::printf("soak: %lld tokens, %.1f tokens/s; drafted %lld, accepted %lld\n",
              static_cast<long long>(tally.tokens), double(tally.tokens) / t_run,
              static_cast<long long>(tally.drafted), static_cast<long long>(tally.accepted));
  std::printf(
      "soak: resident %.1f MiB at start; warm-up %.0f s (%lld texts); %zu samples after "
      "it, %.1f to %.1f MiB\n",
      mib(rss_start), t_warm, static_cast<long long>(checked_warm), after.size(), mib(rss_min),
      mib(rss_max));
  std::printf(
      "soak: resident after warm-up %.1f MiB, at the end %.1f MiB (highest of %zu samples "
      "each): %+.2f%% (limit %.1f%%%s)\n",
      mib(rss_base), mib(rss_end), window, growth, o.max_growth,
      sanitized ? ", not checked under sanitizers" : "");
  if (peak(true, true))
    std::printf("soak: malloc'd after warm-up %.1f MiB, at the end %.1f MiB\n",
                mib(peak(true, true)), mib(peak(false, true)));
  for (const std::string &f : tally.failures) std::printf("soak: FAILED: %s\n", f.c_str());
  const bool ok = tally.mismatches == 0 && tally.errors == 0 && tally.checked > 0 && memory_ok;
  std::printf("soak: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
