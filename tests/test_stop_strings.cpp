// Stop strings (specinfer_session_set_stop_strings): the generated text ends right before the first
// stop string, whatever tokens and rounds it arrives in; the stop string is never delivered, the
// session's tokens end at the token that completes it, and text that could begin one is held back
// only until it is known not to.
//  - The matcher (specinfer::StopStrings) on every way of cutting a text into three pieces.
//  - Sessions on a kgram target (one token per byte, so every stop string longer than one byte
//    spans tokens): generate, step with a budget (cap), and step_many, plainly and with prompt
//    lookup drafting; each against the text of a run without stop strings.
//  - The real models (Qwen2.5-Coder 0.5B and Gemma 3 270M, skipped when absent): stop strings
//    that begin inside a multi-byte token, with and without drafting.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "session/stop_strings.h"
#include "specinfer.h"
#include "support/cmocka_setup.h"
#include "support/models.h"

namespace {

// ---- the matcher ----

// Feeds `pieces` and returns everything released, the end's flush included.
std::string run_matcher(std::vector<std::string> stops, const std::vector<std::string> &pieces,
                        bool *stopped) {
  specinfer::StopStrings m;
  m.set(std::move(stops));
  std::string out;
  *stopped = false;
  for (const std::string &p : pieces) {
    if (m.push(p, out)) {
      *stopped = true;
      return out;
    }
  }
  m.flush(out);
  return out;
}

// Every way of cutting `text` into three pieces gives the same result as one piece.
void check_all_splits(const std::vector<std::string> &stops, const std::string &text,
                      const std::string &expected, bool expect_stop) {
  bool stopped = false;
  assert_string_equal(run_matcher(stops, {text}, &stopped).c_str(), expected.c_str());
  assert_int_equal(stopped, expect_stop);
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      const std::vector<std::string> pieces = {text.substr(0, i), text.substr(i, j - i),
                                               text.substr(j)};
      assert_string_equal(run_matcher(stops, pieces, &stopped).c_str(), expected.c_str());
      assert_int_equal(stopped, expect_stop);
    }
}

void test_matcher(void **) {
  check_all_splits({}, "hello world", "hello world", false);
  check_all_splits({""}, "hello world", "hello world", false);  // "" is no stop string
  check_all_splits({"\n\n"}, "def f():\n    pass\n\nprint(1)", "def f():\n    pass", true);
  check_all_splits({"world"}, "hello world and more", "hello ", true);
  check_all_splits({"hello"}, "hello", "", true);
  // The earliest stop string wins, whichever is listed first.
  check_all_splits({"more", "world"}, "hello world and more", "hello ", true);
  check_all_splits({"lo w", "hello"}, "hello world", "", true);
  // Overlapping prefixes: the text's "aa" could begin "aab" twice over; only the second does.
  check_all_splits({"aab"}, "xaaab", "xa", true);
  check_all_splits({"abab"}, "abaabab", "aba", true);
  // A tail that looked like a stop string's start but was not is released at the end.
  check_all_splits({"abc"}, "xxab", "xxab", false);
  // A stop string starting with a multi-byte character.
  check_all_splits({"ü!"}, "grüße ü!", "grüße ", true);
}

void test_matcher_holds_back(void **) {
  specinfer::StopStrings m;
  m.set({"</s>"});
  std::string out;
  assert_false(m.push("text<", out));
  assert_string_equal(out.c_str(), "text");  // "<" may begin the stop string
  assert_false(m.push("/", out));
  assert_string_equal(out.c_str(), "text");
  assert_false(m.push("x", out));
  assert_string_equal(out.c_str(), "text</x");  // it did not
  assert_true(m.push("</s>tail", out));
  assert_string_equal(out.c_str(), "text</x");
  m.flush(out);  // nothing held after a stop
  assert_string_equal(out.c_str(), "text</x");
  // clear() forgets held text.
  assert_false(m.push("ab</", out));
  m.clear();
  m.flush(out);
  assert_string_equal(out.c_str(), "text</xab");
}

// ---- sessions on a kgram target ----

#define CORPUS_FILE "abi/specinfer.h"

struct Kgram {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  specinfer_drafter *ngram = nullptr;
};

Kgram g_kgram;

int kgram_setup(void **) {
  specinfer_registry_params p;
  specinfer_registry_params_init(&p);
  p.n_threads = 1;
  char *err = nullptr;
  if (specinfer_registry_create(&p, &g_kgram.reg, &err) != SPECINFER_OK) return -1;
  const char *src = std::getenv("SPECINFER_SOURCE_DIR");
  const std::string cfg = std::string("path=") + (src ? src : ".") + "/" CORPUS_FILE + ",k=4";
  if (specinfer_target_open(g_kgram.reg, "kgram", cfg.c_str(), &g_kgram.target, &err) !=
          SPECINFER_OK ||
      specinfer_drafter_open(g_kgram.reg, "ngram", "", g_kgram.target, &g_kgram.ngram, &err) !=
          SPECINFER_OK) {
    std::fprintf(stderr, "kgram: %s\n", err ? err : "?");
    specinfer_free(err);
    return -1;
  }
  return 0;
}

int kgram_teardown(void **) {
  specinfer_drafter_destroy(g_kgram.ngram);
  specinfer_target_destroy(g_kgram.target);
  specinfer_registry_destroy(g_kgram.reg);
  return 0;
}

enum class Mode { kGenerate, kStep, kStepMany };

struct Run {
  std::string text;             // everything delivered, end_text included
  std::vector<int32_t> tokens;  // generated tokens (the session's after the prompt)
  bool ended = false;           // a round set done
  size_t most_per_round = 0;    // most tokens one round emitted
  size_t most_held = 0;         // most bytes emitted but not yet delivered after a round
};

int on_tokens(void *user, const int32_t *, size_t n, const char *text, size_t len) {
  auto *r = static_cast<Run *>(user);
  r->text.append(text, len);
  r->most_per_round = std::max(r->most_per_round, n);
  return 0;
}

// Generates up to max_tokens on `t` after `prompt` with stop strings `stops`, in the given mode;
// `cap` bounds the tokens per round in the step modes.
Run generate(specinfer_target *t, specinfer_drafter *d, const std::string &prompt,
             const std::vector<std::string> &stops, int32_t max_tokens, Mode mode,
             size_t cap = 64) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 6;
  specinfer_session *s = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_session_create(t, d, nullptr, &p, &s, &err), SPECINFER_OK);
  std::vector<const char *> ptrs;
  for (const std::string &x : stops) ptrs.push_back(x.c_str());
  assert_int_equal(specinfer_session_set_stop_strings(s, ptrs.data(), ptrs.size()), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt.data(), prompt.size()), SPECINFER_OK);
  size_t n_prompt = 0;
  const int32_t *toks = nullptr;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n_prompt), SPECINFER_OK);
  Run r;
  if (mode == Mode::kGenerate) {
    assert_int_equal(specinfer_session_generate(s, max_tokens, on_tokens, &r), SPECINFER_OK);
  } else {
    std::vector<int32_t> room(64);
    int32_t left = max_tokens;
    size_t emitted_bytes = 0;
    while (left > 0 && !r.ended) {
      size_t n = 0;
      int32_t done = 0;
      const size_t want = std::min(cap, static_cast<size_t>(left));
      if (mode == Mode::kStep) {
        assert_int_equal(specinfer_session_step(s, room.data(), want, &n, &done), SPECINFER_OK);
      } else {
        specinfer_step_result res{};
        res.struct_size = sizeof res;
        res.tokens = room.data();
        res.cap = want;
        specinfer_session *one[1] = {s};
        assert_int_equal(specinfer_session_step_many(one, &res, 1, nullptr), SPECINFER_OK);
        n = res.n_tokens;
        done = res.done;
      }
      assert_true(n <= want);
      const char *text = nullptr;
      size_t len = 0;
      assert_int_equal(specinfer_session_step_text(s, &text, &len), SPECINFER_OK);
      r.text.append(text, len);
      left -= static_cast<int32_t>(n);
      r.ended = done != 0;
      r.most_per_round = std::max(r.most_per_round, n);
      emitted_bytes += n;
      if (!r.ended) r.most_held = std::max(r.most_held, emitted_bytes - r.text.size());
    }
    const char *tail = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_end_text(s, &tail, &len), SPECINFER_OK);
    r.text.append(tail, len);
  }
  size_t n_all = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n_all), SPECINFER_OK);
  r.tokens.assign(toks + n_prompt, toks + n_all);
  specinfer_session_destroy(s);
  return r;
}

std::string bytes_of(const std::vector<int32_t> &toks) {  // kgram: token id = byte
  std::string s;
  for (int32_t t : toks) s.push_back(static_cast<char>(t));
  return s;
}

void test_sessions_stop_at_stop_strings(void **) {
  const std::string prompt = "SPECINFER_API specinfer_status specinfer_session_";
  const int32_t kTokens = 240;
  const Run ref = generate(g_kgram.target, nullptr, prompt, {}, kTokens, Mode::kGenerate);
  const std::string all = bytes_of(ref.tokens);
  assert_int_equal(all.size(), kTokens);
  assert_string_equal(ref.text.c_str(), all.c_str());

  // Stop strings taken from the text at several places and lengths, one that never occurs, and
  // pairs; the expected cut is at the earliest occurrence of any.
  std::vector<std::vector<std::string>> cases = {{"\x01never"}};
  for (size_t at : {3, 40, 117, 200})
    for (size_t len : {1, 2, 5, 11}) cases.push_back({all.substr(at, len)});
  cases.push_back({all.substr(150, 6), all.substr(60, 3)});
  cases.push_back({all.substr(60, 3) + "\x01", all.substr(61, 4)});  // a prefix that fails
  for (const auto &stops : cases) {
    size_t cut = std::string::npos, stop_len = 0;
    for (const std::string &x : stops) {
      const size_t p = all.find(x);
      if (p == std::string::npos) continue;
      // Two starting at the same place: the text ends with the token that completes the shorter.
      if (cut == std::string::npos || p < cut || (p == cut && x.size() < stop_len)) {
        cut = p;
        stop_len = x.size();
      }
    }
    const bool stops_inside = cut != std::string::npos;
    const std::string want_text = stops_inside ? all.substr(0, cut) : all;
    const size_t want_tokens = stops_inside ? cut + stop_len : all.size();
    for (specinfer_drafter *d : {static_cast<specinfer_drafter *>(nullptr), g_kgram.ngram})
      for (Mode mode : {Mode::kGenerate, Mode::kStep, Mode::kStepMany})
        for (size_t cap : {1, 3, 64}) {
          if (mode == Mode::kGenerate && cap != 64) continue;
          const Run r = generate(g_kgram.target, d, prompt, stops, kTokens, mode, cap);
          assert_string_equal(r.text.c_str(), want_text.c_str());
          assert_int_equal(r.tokens.size(), want_tokens);
          assert_string_equal(bytes_of(r.tokens).c_str(), all.substr(0, want_tokens).c_str());
          if (mode != Mode::kGenerate) {
            assert_int_equal(r.ended, stops_inside);
            assert_true(r.most_per_round <= cap);
            // Held text is never more than the longest stop string's prefix.
            size_t longest = 0;
            for (const std::string &x : stops) longest = std::max(longest, x.size());
            assert_true(r.most_held < longest);
          }
        }
  }
}

void test_held_text_at_the_callers_end(void **) {
  const std::string prompt = "SPECINFER_API specinfer_status specinfer_session_";
  const Run ref = generate(g_kgram.target, nullptr, prompt, {}, 60, Mode::kGenerate);
  const std::string all = bytes_of(ref.tokens);
  // A stop string that begins with the 30th byte and cannot complete: at a budget of 30 tokens
  // that byte is held back by the rounds and comes with end_text (step modes) or with generate's
  // last callback.
  const std::vector<std::string> stops = {all.substr(29, 1) + "\x01"};
  for (Mode mode : {Mode::kGenerate, Mode::kStep, Mode::kStepMany}) {
    const Run r = generate(g_kgram.target, nullptr, prompt, stops, 30, mode);
    assert_string_equal(r.text.c_str(), all.substr(0, 30).c_str());
  }

  // Feeding forgets held text: what follows is prompt, not generated text.
  specinfer_session *s = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_session_create(g_kgram.target, nullptr, nullptr, nullptr, &s, &err),
                   SPECINFER_OK);
  const char *stop = stops[0].c_str();
  assert_int_equal(specinfer_session_set_stop_strings(s, &stop, 1), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt.data(), prompt.size()), SPECINFER_OK);
  std::string text;
  int32_t room[8];
  for (int i = 0; i < 30; ++i) {
    size_t n = 0;
    int32_t done = 0;
    assert_int_equal(specinfer_session_step(s, room, 8, &n, &done), SPECINFER_OK);
    const char *t = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_step_text(s, &t, &len), SPECINFER_OK);
    text.append(t, len);
  }
  assert_string_equal(text.c_str(), all.substr(0, 29).c_str());
  assert_int_equal(specinfer_session_feed_text(s, "\n", 1), SPECINFER_OK);
  const char *t = nullptr;
  size_t len = 0;
  assert_int_equal(specinfer_session_end_text(s, &t, &len), SPECINFER_OK);
  assert_int_equal(len, 0);
  specinfer_session_destroy(s);
}

void test_bad_stop_strings(void **) {
  specinfer_session *s = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_session_create(g_kgram.target, nullptr, nullptr, nullptr, &s, &err),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_set_stop_strings(nullptr, nullptr, 0),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_set_stop_strings(s, nullptr, 2),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(specinfer_session_errmsg(s), "NULL"));
  const char *with_null[2] = {"a", nullptr};
  assert_int_equal(specinfer_session_set_stop_strings(s, with_null, 2),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(specinfer_session_errmsg(s), "stop string 1 is NULL"));
  const std::string long_one(1025, 'x');
  const char *too_long[1] = {long_one.c_str()};
  assert_int_equal(specinfer_session_set_stop_strings(s, too_long, 1),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(specinfer_session_errmsg(s), "at most 1024"));
  std::vector<const char *> many(65, "x");
  assert_int_equal(specinfer_session_set_stop_strings(s, many.data(), many.size()),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_set_stop_strings(s, many.data(), 64), SPECINFER_OK);
  assert_int_equal(specinfer_session_set_stop_strings(s, nullptr, 0), SPECINFER_OK);
  const char *t = nullptr;
  size_t len = 0;
  assert_int_equal(specinfer_session_end_text(nullptr, &t, &len), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_end_text(s, nullptr, &len), SPECINFER_ERR_INVALID_ARGUMENT);
  int32_t room[4];
  size_t n = 0;
  int32_t done = 0;
  assert_int_equal(specinfer_session_feed_text(s, "ab", 2), SPECINFER_OK);
  assert_int_equal(specinfer_session_step(s, room, 0, &n, &done), SPECINFER_ERR_BUFFER_TOO_SMALL);
  specinfer_session_destroy(s);
}

// ---- real models ----

// On a real tokenizer: a stop string that begins inside a multi-byte token of the greedy text
// cuts the text there and the tokens after the one that completes it, plainly and with prompt
// lookup drafting.
void check_real_model(const char *file) {
  char path[4096];
  if (!model_path(file, path, sizeof path)) {
    std::printf("skipped: %s is absent (scripts/fetch-models)\n", path);
    return;
  }
  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = 2;
  specinfer_registry *reg = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_registry_create(&rp, &reg, &err), SPECINFER_OK);
  specinfer_target *t = nullptr;
  const std::string cfg = std::string("path=") + path + ",n_ctx=512";
  assert_int_equal(specinfer_target_open(reg, "gguf", cfg.c_str(), &t, &err), SPECINFER_OK);
  specinfer_drafter *d = nullptr;
  assert_int_equal(specinfer_drafter_open(reg, "ngram", "", t, &d, &err), SPECINFER_OK);

  const std::string prompt =
      "def count_words(text):\n    \"\"\"Counts each word of text.\"\"\"\n    counts = {}\n";
  const Run ref = generate(t, nullptr, prompt, {}, 48, Mode::kGenerate);
  // Each token's bytes, and where each begins in the text.
  std::string all;
  std::vector<size_t> begin;
  for (int32_t tok : ref.tokens) {
    char buf[256];
    size_t nb = 0;
    assert_int_equal(specinfer_target_detokenize(t, &tok, 1, buf, sizeof buf, &nb), SPECINFER_OK);
    begin.push_back(all.size());
    all.append(buf, nb);
  }
  assert_true(all.compare(0, ref.text.size(), ref.text) == 0);
  // Tokens of three or more bytes after the first few: the stop string starts at the second byte
  // of one and runs into the next token.
  int checked = 0;
  for (size_t j = 4; j + 1 < ref.tokens.size() && checked < 3; ++j) {
    const size_t len = (j + 1 < begin.size() ? begin[j + 1] : all.size()) - begin[j];
    if (len < 3) continue;
    const std::string stop = all.substr(begin[j] + 1, len + 1);
    const size_t cut = all.find(stop);
    const size_t last_byte = cut + stop.size() - 1;
    const size_t last_token =
        static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), last_byte) -
                            begin.begin()) -
        1;
    for (specinfer_drafter *dd : {static_cast<specinfer_drafter *>(nullptr), d})
      for (Mode mode : {Mode::kGenerate, Mode::kStepMany}) {
        const Run r = generate(t, dd, prompt, {stop}, 48, mode);
        assert_string_equal(r.text.c_str(), all.substr(0, cut).c_str());
        assert_int_equal(r.tokens.size(), last_token + 1);
        assert_memory_equal(r.tokens.data(), ref.tokens.data(), r.tokens.size() * sizeof(int32_t));
      }
    ++checked;
    j += 4;
  }
  assert_true(checked > 0);
  specinfer_drafter_destroy(d);
  specinfer_target_destroy(t);
  specinfer_registry_destroy(reg);
}

void test_qwen(void **) {
  check_real_model("qwen2.5-coder-0.5b.gguf");
}

void test_gemma(void **) {
  check_real_model("gemma-3-270m.gguf");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matcher),
      cmocka_unit_test(test_matcher_holds_back),
      cmocka_unit_test(test_sessions_stop_at_stop_strings),
      cmocka_unit_test(test_held_text_at_the_callers_end),
      cmocka_unit_test(test_bad_stop_strings),
      cmocka_unit_test(test_qwen),
      cmocka_unit_test(test_gemma),
  };
  return cmocka_run_group_tests(tests, kgram_setup, kgram_teardown);
}
