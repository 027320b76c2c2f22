// Fault injection: every allocation and every file read of a registry's, a model's and a
// session's life is made to fail in turn, and each failure must come back as an error status with
// a message, leak nothing (the sanitizer build checks), and leave the library, and the very object
// whose call failed, usable: the life then goes on without faults and its text must be the text
// of a life that never saw one.
//
// How the failures are made: this executable replaces C++'s operator new and operator delete
// (every form), which the library and the plugins it loads use through ELF interposition, and
// defines specinfer_fault_point (common/fault_point.h), which the library's and the plugins' own
// allocations (the host's alloc, PageBuffer, packed weights, error strings) and file reads (the
// GGUF reader's open, stat and map; the ngram drafter's corpus) ask. Both count the calls made
// while a walk is armed; the call numbered N fails:
//  - once: the N-th call fails and every later one succeeds (a transient failure);
//  - for good: every call from the N-th fails until the test disarms (memory that stays short),
//    which also makes the error paths themselves (messages, clean-up) meet failures.
// N walks 1, 2, ... past the last call of the life (a stride keeps the sanitizer build's walk
// short; the release build takes every N). The life: create a registry (one backend thread, so
// that the calls come in the same order every time), open a tiny Qwen2-shaped Q8_0 GGUF model
// (written to a temporary directory) with packed weights, open an ngram drafter with a static
// corpus file, create a greedy session, feed a prompt, step until 24 tokens, reset, feed another
// prompt, step until 16 tokens, destroy everything.
//
// Also here: a model file truncated before it is opened is refused at open (its tensor table
// points past the end), and a model file replaced while it is mapped (written anew and renamed
// over the path, as an update should be made) leaves the open model's text unchanged.
// Truncating a file in place while it is mapped is the documented limit (docs/RELIABILITY.md).
// The replaced operator new and delete below allocate with malloc and free with free: GCC, once
// it inlines the replacement into a container's destructor, takes that free for a mismatch.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "data/gguf/tiny_model.h"
#include "specinfer.h"

#include "support/cmocka_setup.h"

// ---------------------------------------------------------------------------------------------
// The switch: calls counted while armed; the N-th fails (and, for good, every later one).
// ---------------------------------------------------------------------------------------------

namespace {

std::atomic<bool> g_armed{false};      // inside a library call of an armed walk
std::atomic<bool> g_walk_live{false};  // an armed walk that has not failed a call yet
std::atomic<bool> g_for_good{false};
std::atomic<int64_t> g_calls{0};    // calls counted since arming
std::atomic<int64_t> g_fail_at{0};  // the call that fails (1-based); 0: none
std::atomic<int> g_fired_kind{-1};  // what kind of call failed first: 0 memory, 1 file
std::atomic<int64_t> g_failed{0};   // calls failed since arming
int64_t g_walk_n = 0;               // the walk's N, for messages

const bool g_trace = std::getenv("SPECINFER_FAULT_TRACE") != nullptr;

}  // namespace

// LeakSanitizer's check on demand (sanitizer builds only): with SPECINFER_FAULT_TRACE, after each
// life, so that a leak is reported with the N that caused it.
extern "C" __attribute__((weak)) int __lsan_do_recoverable_leak_check();

namespace {

bool should_fail(int kind) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  const int64_t n = g_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t at = g_fail_at.load(std::memory_order_relaxed);
  if (at == 0 || n < at) return false;
  if (n > at && !g_for_good.load(std::memory_order_relaxed)) return false;
  if (n == at) {
    g_fired_kind.store(kind, std::memory_order_relaxed);
    if (g_trace) {  // where the failing call is made (SPECINFER_FAULT_TRACE=1)
      void *frames[24];
      std::fprintf(stderr, "N=%lld fails here (%s):\n", (long long)n, kind ? "file" : "memory");
      backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
    }
  }
  g_failed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void arm(int64_t fail_at, bool for_good) {
  g_calls = 0;
  g_failed = 0;
  g_fired_kind = -1;
  g_fail_at = fail_at;
  g_for_good = for_good;
  g_walk_live = true;
}

// Ends the walk's failures: the rest of the life runs clean.
void disarm() {
  g_walk_live = false;
  g_armed = false;
}

void *counted_alloc(size_t n, size_t align) {
  if (should_fail(0)) return nullptr;
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  void *p = nullptr;
  return posix_memalign(&p, align, n) == 0 ? p : nullptr;
}

void *alloc_or_throw(size_t n, size_t align) {
  void *p = counted_alloc(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int specinfer_fault_point(int kind) {
  return should_fail(kind) ? 1 : 0;
}

void *operator new(size_t n) {
  return alloc_or_throw(n, 0);
}
void *operator new[](size_t n) {
  return alloc_or_throw(n, 0);
}
void *operator new(size_t n, const std::nothrow_t &) noexcept {
  return counted_alloc(n, 0);
}
void *operator new[](size_t n, const std::nothrow_t &) noexcept {
  return counted_alloc(n, 0);
}
void *operator new(size_t n, std::align_val_t a) {
  return alloc_or_throw(n, size_t(a));
}
void *operator new[](size_t n, std::align_val_t a) {
  return alloc_or_throw(n, size_t(a));
}
void *operator new(size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return counted_alloc(n, size_t(a));
}
void *operator new[](size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return counted_alloc(n, size_t(a));
}
void operator delete(void *p) noexcept {
  std::free(p);
}
void operator delete[](void *p) noexcept {
  std::free(p);
}
void operator delete(void *p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void *p, size_t) noexcept {
  std::free(p);
}
void operator delete(void *p, const std::nothrow_t &) noexcept {
  std::free(p);
}
void operator delete[](void *p, const std::nothrow_t &) noexcept {
  std::free(p);
}
void operator delete(void *p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void *p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void *p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void *p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept {
  std::free(p);
}
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept {
  std::free(p);
}

namespace {

// ---------------------------------------------------------------------------------------------
// The life of a registry, a model and a session.
// ---------------------------------------------------------------------------------------------

constexpr const char *kPrompt1 = "#$%&'()*#$%&'()*#$%&'()*#$%&";
constexpr const char *kPrompt2 = "*)('&%$#*)('&%$#*)(";
constexpr size_t kTokens1 = 24, kTokens2 = 16;

struct Files {
  std::string dir, model, corpus;
};

Files g_files;

// The tokens of both halves of a life.
struct Text {
  std::vector<int32_t> first, second;
  bool operator==(const Text &o) const { return first == o.first && second == o.second; }
};

// What one walk step saw.
struct Outcome {
  int failures = 0;           // calls of the life that returned an error
  bool fired = false;         // the armed call was reached
  bool unclassified = false;  // an error whose status does not name what failed
  std::string first_error;
  Text text;     // the session's sequences (specinfer_session_tokens)
  Text emitted;  // the tokens its steps returned
};

// Runs one library call, counted if the walk is armed; an error is recorded (it must carry a
// message), the walk is disarmed for the rest of the life, and the call is retried until it
// succeeds (the object must stay usable).
template <typename Call, typename Message>
void run(Outcome &o, const char *what, Call &&call, Message &&message) {
  for (int attempt = 0;; ++attempt) {
    // Only the library's calls are counted, not the test's own allocations between them.
    g_armed = g_walk_live.load();
    const specinfer_status rc = call();
    g_armed = false;
    if (rc == SPECINFER_OK) return;
    disarm();
    const std::string msg = message();
    // A message needs memory too: with memory refused for good it may be empty (an errmsg
    // out-parameter is then NULL), but only then.
    if (msg.empty() && !(g_for_good && rc == SPECINFER_ERR_OUT_OF_MEMORY)) {
      std::fprintf(stderr, "N=%lld: %s failed with %s and no message\n", (long long)g_walk_n, what,
                   specinfer_status_str(rc));
      fail();
    }
    // The status names what failed: memory, or a file (the ngram plugin reports a corpus it
    // cannot open as a CONFIG error). With failures for good, both kinds may meet in one call.
    const bool memory = rc == SPECINFER_ERR_OUT_OF_MEMORY;
    const bool file =
        rc == SPECINFER_ERR_IO || rc == SPECINFER_ERR_NOT_FOUND || rc == SPECINFER_ERR_CONFIG;
    const int kind = g_fired_kind.load();
    if (g_for_good ? !(memory || file) : !(kind == 0 ? memory : file)) {
      std::fprintf(stderr, "N=%lld: %s failed with %s: %s\n", (long long)g_walk_n, what,
                   specinfer_status_str(rc), msg.c_str());
      o.unclassified = true;
    }
    if (o.failures++ == 0) o.first_error = std::string(what) + ": " + msg;
    if (attempt >= 2) {
      std::fprintf(stderr, "N=%lld: %s still fails without faults: %s\n", (long long)g_walk_n, what,
                   msg.c_str());
      fail();
    }
  }
}

std::string take(char *err) {
  std::string s = err ? err : "";
  specinfer_free(err);
  return s;
}

// Steps the session until it has generated `want` tokens or its text ended.
std::vector<int32_t> generate(Outcome &o, specinfer_session *s, size_t want) {
  std::vector<int32_t> out;
  int32_t buf[16];
  int32_t done = 0;
  int rounds = 0;
  while (out.size() < want && !done) {
    size_t n = 0;
    const size_t cap = std::min(sizeof buf / sizeof buf[0], want - out.size());
    run(
        o, "specinfer_session_step", [&] { return specinfer_session_step(s, buf, cap, &n, &done); },
        [&] { return std::string(specinfer_session_errmsg(s)); });
    out.insert(out.end(), buf, buf + n);
    assert_true(++rounds < 1000);
  }
  return out;
}

// The session's whole sequence, prompt and generated tokens.
std::vector<int32_t> session_tokens(specinfer_session *s) {
  const int32_t *all = nullptr;
  size_t n = 0;
  assert_int_equal(specinfer_session_tokens(s, &all, &n), SPECINFER_OK);
  return std::vector<int32_t>(all, all + n);
}

void life(Outcome &o) {
  specinfer_registry *reg = nullptr;
  specinfer_target *t = nullptr;
  specinfer_drafter *d = nullptr;
  specinfer_session *s = nullptr;
  char *err = nullptr;
  std::string msg;

  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = 1;
  rp.log_level = SPECINFER_LOG_NONE;
  run(
      o, "specinfer_registry_create", [&] { return specinfer_registry_create(&rp, &reg, &err); },
      [&] { return take(err); });

  const std::string tcfg = "path=" + g_files.model;
  run(
      o, "specinfer_target_open",
      [&] { return specinfer_target_open(reg, "gguf", tcfg.c_str(), &t, &err); },
      [&] { return take(err); });

  const std::string dcfg = "static=" + g_files.corpus;
  run(
      o, "specinfer_drafter_open",
      [&] { return specinfer_drafter_open(reg, "ngram", dcfg.c_str(), t, &d, &err); },
      [&] { return take(err); });

  specinfer_session_params sp;
  specinfer_session_params_init(&sp);
  sp.max_draft = 6;
  run(
      o, "specinfer_session_create",
      [&] { return specinfer_session_create(t, d, nullptr, &sp, &s, &err); },
      [&] { return take(err); });

  run(
      o, "specinfer_session_feed_text",
      [&] { return specinfer_session_feed_text(s, kPrompt1, std::strlen(kPrompt1)); },
      [&] { return std::string(specinfer_session_errmsg(s)); });
  o.emitted.first = generate(o, s, kTokens1);
  o.text.first = session_tokens(s);

  run(
      o, "specinfer_session_reset", [&] { return specinfer_session_reset(s); },
      [&] { return std::string(specinfer_session_errmsg(s)); });
  run(
      o, "specinfer_session_feed_text",
      [&] { return specinfer_session_feed_text(s, kPrompt2, std::strlen(kPrompt2)); },
      [&] { return std::string(specinfer_session_errmsg(s)); });
  o.emitted.second = generate(o, s, kTokens2);
  o.text.second = session_tokens(s);

  specinfer_session_destroy(s);
  run(
      o, "specinfer_drafter_destroy", [&] { return specinfer_drafter_destroy(d); },
      [&] { return std::string(specinfer_drafter_errmsg(d)); });
  run(
      o, "specinfer_target_destroy", [&] { return specinfer_target_destroy(t); },
      [&] { return std::string(specinfer_target_errmsg(t)); });
  run(
      o, "specinfer_registry_destroy", [&] { return specinfer_registry_destroy(reg); },
      [&] { return std::string("registry destroy failed"); });
}

// The life with no fault, and how many calls it makes.
Text g_clean, g_clean_emitted;
int64_t g_life_calls = 0;

Outcome life_armed(int64_t fail_at, bool for_good) {
  Outcome o;
  g_walk_n = fail_at;
  arm(fail_at, for_good);
  life(o);
  o.fired = g_fired_kind.load() >= 0;
  disarm();
  return o;
}

int setup(void **) {
  char tmpl[] = "/tmp/test_fault_injection_XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  g_files.dir = tmpl;
  g_files.model = g_files.dir + "/tiny.gguf";
  g_files.corpus = g_files.dir + "/corpus.txt";
  gguf_test::TinyConfig c;
  c.n_vocab = 40;
  c.n_embd = 32;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.n_ff = 32;
  c.n_ctx = 128;
  c.wtype = 8;  // Q8_0: packed by the plugin through the host's kernels
  FILE *f = std::fopen(g_files.corpus.c_str(), "w");
  if (!f) return -1;
  std::fputs("#$%&'()*+,-./#$%&'()*+,-./\n*)('&%$#*)('&%$#\n", f);
  std::fclose(f);

  // The first random model whose greedy texts run to full length (a random model may well choose
  // its end-of-text token early). The first life also warms the process's one-time state (CPU
  // detection, the kernel table), so that the counted life below is what every later life is.
  Outcome warm;
  for (c.seed = 1; c.seed <= 64; ++c.seed) {
    gguf_test::TinyWeights w;
    if (!gguf_test::write_file(g_files.model, gguf_test::make_tiny_model(c, &w))) return -1;
    warm = Outcome();
    life(warm);
    if (warm.failures) return -1;
    if (warm.emitted.first.size() == kTokens1 && warm.emitted.second.size() == kTokens2) break;
  }
  if (c.seed > 64) return -1;
  Outcome counted = life_armed(0, false);
  if (counted.failures || !(counted.text == warm.text) || !(counted.emitted == warm.emitted))
    return -1;
  g_clean = warm.text;
  g_clean_emitted = warm.emitted;
  g_life_calls = g_calls.load();
  std::printf("life: %lld counted calls; %zu + %zu tokens generated\n", (long long)g_life_calls,
              g_clean_emitted.first.size(), g_clean_emitted.second.size());
  return 0;
}

int teardown(void **) {
  std::error_code ec;
  std::filesystem::remove_all(g_files.dir, ec);
  return 0;
}

// The stride of a walk: 1 unless SPECINFER_SANITIZED is set (the sanitizer build runs each life
// about 20 times slower), where it keeps the walk near 400 lives; the start is offset so that
// repeated runs with SPECINFER_FAULT_OFFSET cover the rest.
int64_t stride() {
  if (const char *s = std::getenv("SPECINFER_FAULT_STRIDE")) return std::max(1L, std::atol(s));
  if (std::getenv("SPECINFER_SANITIZED")) return std::max<int64_t>(1, g_life_calls / 400);
  return 1;
}

void walk(bool for_good) {
  const int64_t step = stride();
  int64_t lives = 0, failed = 0, absorbed = 0, unclassified = 0;
  const char *from = std::getenv("SPECINFER_FAULT_FROM");
  for (int64_t n = from ? std::max(1L, std::atol(from)) : 1;; n += step) {
    Outcome o = life_armed(n, for_good);
    ++lives;
    if (g_trace && __lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
      std::fprintf(stderr, "N=%lld leaked (above)\n", (long long)n);
      fail();
    }
    if (!o.fired) {
      // Past the last call: the life ran clean.
      assert_int_equal(o.failures, 0);
      assert_true(o.text == g_clean && o.emitted == g_clean_emitted);
      assert_true(n > g_life_calls / 2);
      break;
    }
    if (o.failures) {
      ++failed;
    } else {
      ++absorbed;  // a failure the library recovered from by itself
      if (g_trace) std::fprintf(stderr, "N=%lld: no error reached the caller\n", (long long)n);
    }
    if (o.unclassified) ++unclassified;
    if (!(o.text == g_clean) || !(o.emitted == g_clean_emitted)) {
      std::fprintf(stderr, "call %lld (%s): the text differs from the clean life's%s%s\n",
                   (long long)n, g_fired_kind.load() == 0 ? "memory" : "file",
                   o.first_error.empty() ? "" : " after ", o.first_error.c_str());
      for (const auto *v : {&g_clean.first, &o.text.first, &g_clean.second, &o.text.second}) {
        for (int32_t t : *v) std::fprintf(stderr, " %d", t);
        std::fprintf(stderr, "\n");
      }
      fail();
    }
  }
  std::printf(
      "%s: %lld lives (every %lld-th of %lld calls): %lld with an error status, %lld "
      "recovered without one, %lld with a status that names another failure\n",
      for_good ? "failing for good" : "failing once", (long long)lives, (long long)step,
      (long long)g_life_calls, (long long)failed, (long long)absorbed, (long long)unclassified);
  assert_int_equal(unclassified, 0);
}

void test_fail_once(void **) {
  walk(false);
}
void test_fail_for_good(void **) {
  walk(true);
}

std::vector<uint8_t> read_all(const std::string &path) {
  std::vector<uint8_t> bytes;
  FILE *f = std::fopen(path.c_str(), "rb");
  assert_non_null(f);
  for (int c; (c = std::fgetc(f)) != EOF;) bytes.push_back(uint8_t(c));
  std::fclose(f);
  return bytes;
}

// Greedy tokens of a fresh session on `t` for kPrompt1.
std::vector<int32_t> greedy(specinfer_target *t) {
  specinfer_session *s = nullptr;
  assert_int_equal(specinfer_session_create(t, nullptr, nullptr, nullptr, &s, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, kPrompt1, std::strlen(kPrompt1)), SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, int32_t(kTokens1), nullptr, nullptr),
                   SPECINFER_OK);
  std::vector<int32_t> out = session_tokens(s);
  specinfer_session_destroy(s);
  return out;
}

// A model file cut short anywhere is refused when it is opened: the header's counts and the
// tensor table are checked against the file's size before anything is read from it.
void test_truncated_file(void **) {
  const std::vector<uint8_t> whole = read_all(g_files.model);
  const std::string path = g_files.dir + "/cut.gguf";
  const std::string cfg = "path=" + path;
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  for (size_t cut : {size_t(100), whole.size() / 4, whole.size() / 2, whole.size() - 1}) {
    gguf_test::write_file(path, std::vector<uint8_t>(whole.begin(), whole.begin() + long(cut)));
    specinfer_target *t = nullptr;
    char *err = nullptr;
    assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &t, &err),
                     SPECINFER_ERR_FORMAT);
    assert_null(t);
    assert_non_null(err);
    std::printf("cut at %zu of %zu bytes: %s\n", cut, whole.size(), err);
    assert_non_null(std::strstr(err, path.c_str()));
    specinfer_free(err);
  }
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

// A model file replaced while a target has it mapped, the way an update should be made (a new
// file renamed over the old path), leaves the open target reading the old file: the mapping holds
// the old file's pages, whatever the path now names.
void test_replaced_file(void **) {
  const std::string path = g_files.dir + "/live.gguf", next = g_files.dir + "/live.gguf.new";
  gguf_test::write_file(path, read_all(g_files.model));
  const std::string cfg = "path=" + path;
  specinfer_registry *reg = nullptr;
  assert_int_equal(specinfer_registry_create(nullptr, &reg, nullptr), SPECINFER_OK);
  specinfer_target *t = nullptr;
  assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &t, nullptr), SPECINFER_OK);
  const std::vector<int32_t> before = greedy(t);

  // A file of the same shape with other weights (the second half's bytes changed).
  std::vector<uint8_t> other = read_all(g_files.model);
  for (size_t i = other.size() / 2; i < other.size(); ++i) other[i] = uint8_t(other[i] * 7 + 3);
  gguf_test::write_file(next, other);
  assert_int_equal(std::rename(next.c_str(), path.c_str()), 0);
  assert_true(greedy(t) == before);

  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fail_once),
      cmocka_unit_test(test_fail_for_good),
      cmocka_unit_test(test_truncated_file),
      cmocka_unit_test(test_replaced_file),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
