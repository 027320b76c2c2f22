// Context shift (specinfer_session_params.context_shift, n_keep): when a round finds the context
// window full, the session keeps the first n_keep tokens, drops the older half of the rest and
// scores the kept tokens again.
//  - kgram target with a 64-token window: without the shift generation fails with CONTEXT_FULL
//    once the window is full; with it 300 tokens come, in every mode (generate, step with a cap,
//    step_many scoring the kept text in chunks of 8), the session's tokens never exceed the window,
//    the statistics count the shifts, and prompt lookup drafting gives the same tokens as plain
//    decoding.
//  - A prompt three times the window is fed whole and shifted until it fits.
//  - Bad parameters (context_shift 2, n_keep -1) are refused at creation; an n_keep that leaves
//    nothing to drop is CONTEXT_FULL with a message when the window fills.
//  - Qwen2.5-Coder 0.5B and Gemma 3 270M (skipped when absent), greedy, a 48-token window: the
//    tokens after the first shift equal those a fresh session fed the kept tokens generates (the
//    cache really was scored again), for plain decoding and prompt lookup alike.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "specinfer.h"
#include "support/models.h"
#include "support/test_util.h"  // includes cmocka: last

namespace {

struct Env {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  specinfer_drafter *ngram = nullptr;
};

Env open_env(const char *plugin, const std::string &cfg) {
  Env e;
  e.reg = new_registry();
  char *err = nullptr;
  const specinfer_status rc = specinfer_target_open(e.reg, plugin, cfg.c_str(), &e.target, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "%s: %s\n", plugin, err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  specinfer_free(err);
  e.ngram = open_drafter(e.reg, e.target, "ngram", "");
  return e;
}

void close_env(Env &e) {
  specinfer_drafter_destroy(e.ngram);
  specinfer_target_destroy(e.target);
  specinfer_registry_destroy(e.reg);
}

enum class Mode { kGenerate, kStep, kStepMany };

struct Run {
  specinfer_status status = SPECINFER_OK;
  std::vector<int32_t> prompt, generated;  // the prompt's tokens; every token emitted
  size_t most_tokens = 0;                  // the longest the session's sequence was
  int64_t shifts = 0;
  std::string error;
};

int collect(void *user, const int32_t *toks, size_t n, const char *, size_t) {
  auto *r = static_cast<Run *>(user);
  r->generated.insert(r->generated.end(), toks, toks + n);
  return 0;
}

Run run(specinfer_target *t, specinfer_drafter *d, const std::vector<int32_t> &prompt,
        int32_t max_tokens, int32_t shift, int32_t n_keep, Mode mode = Mode::kGenerate) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = 6;
  p.context_shift = shift;
  p.n_keep = n_keep;
  specinfer_session *s = nullptr;
  char *err = nullptr;
  assert_int_equal(specinfer_session_create(t, d, nullptr, &p, &s, &err), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_tokens(s, prompt.data(), prompt.size()), SPECINFER_OK);
  Run r;
  r.prompt = prompt;
  const int32_t *toks = nullptr;
  size_t n_all = 0;
  if (mode == Mode::kGenerate) {
    r.status = specinfer_session_generate(s, max_tokens, collect, &r);
  } else {
    std::vector<int32_t> room(7);
    while (r.status == SPECINFER_OK && static_cast<int32_t>(r.generated.size()) < max_tokens) {
      size_t n = 0;
      int32_t done = 0;
      const size_t cap = 1 + r.generated.size() % 7;  // caps 1 .. 7 in turn
      if (mode == Mode::kStep) {
        r.status = specinfer_session_step(s, room.data(), cap, &n, &done);
      } else {
        specinfer_step_result res{};
        res.struct_size = sizeof res;
        res.tokens = room.data();
        res.cap = cap;
        specinfer_session *one[1] = {s};
        specinfer_step_params sp;
        specinfer_step_params_init(&sp);
        sp.prefill_chunk = 8;  // the kept text scored again over several calls
        r.status = specinfer_session_step_many(one, &res, 1, &sp);
        if (r.status == SPECINFER_OK) r.status = res.status;
        n = res.n_tokens;
        done = res.done;
      }
      r.generated.insert(r.generated.end(), room.begin(), room.begin() + long(n));
      assert_int_equal(specinfer_session_tokens(s, &toks, &n_all), SPECINFER_OK);
      r.most_tokens = std::max(r.most_tokens, n_all);
      if (done) break;
    }
  }
  assert_int_equal(specinfer_session_tokens(s, &toks, &n_all), SPECINFER_OK);
  r.most_tokens = std::max(r.most_tokens, n_all);
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
  r.shifts = st.n_context_shifts;
  r.error = specinfer_session_errmsg(s);
  specinfer_session_destroy(s);
  return r;
}

std::vector<int32_t> bytes(const char *text) {  // kgram: token id = byte
  std::vector<int32_t> v;
  for (const char *c = text; *c; ++c) v.push_back(static_cast<unsigned char>(*c));
  return v;
}

void test_kgram(void **) {
  Env e = open_env("kgram", kgram_config("abi/specinfer.h", "k=4,n_ctx=64"));
  const auto prompt = bytes("/* Creates a session that generates with ");
  const Run full = run(e.target, nullptr, prompt, 300, 0, 0);
  assert_int_equal(full.status, SPECINFER_ERR_CONTEXT_FULL);
  assert_int_equal(prompt.size() + full.generated.size(), 64);
  assert_int_equal(full.shifts, 0);

  const Run ref = run(e.target, nullptr, prompt, 300, 1, 8);
  assert_int_equal(ref.status, SPECINFER_OK);
  assert_int_equal(ref.generated.size(), 300);
  assert_true(ref.shifts >= 5);  // each shift makes room for (64 - 8) / 2 tokens
  assert_true(ref.most_tokens <= 64);
  // The tokens before the first shift are the unshifted run's.
  assert_memory_equal(ref.generated.data(), full.generated.data(),
                      full.generated.size() * sizeof(int32_t));
  for (Mode mode : {Mode::kGenerate, Mode::kStep, Mode::kStepMany})
    for (specinfer_drafter *d : {static_cast<specinfer_drafter *>(nullptr), e.ngram}) {
      const Run r = run(e.target, d, prompt, 300, 1, 8, mode);
      assert_int_equal(r.status, SPECINFER_OK);
      assert_true(r.generated.size() >= 300);
      assert_true(r.most_tokens <= 64);
      assert_int_equal(r.shifts, ref.shifts);
      assert_memory_equal(r.generated.data(), ref.generated.data(), 300 * sizeof(int32_t));
    }

  // Refused parameters, and an n_keep that leaves nothing to drop.
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  assert_int_equal(p.context_shift, 0);
  assert_int_equal(p.n_keep, 0);
  specinfer_session *s = nullptr;
  char *err = nullptr;
  p.context_shift = 2;
  assert_int_equal(specinfer_session_create(e.target, nullptr, nullptr, &p, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err, "context_shift"));
  specinfer_free(err);
  err = nullptr;
  p.context_shift = 1;
  p.n_keep = -1;
  assert_int_equal(specinfer_session_create(e.target, nullptr, nullptr, &p, &s, &err),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(err, "n_keep"));
  specinfer_free(err);
  // A prompt longer than the window: fed whole, then shifted as often as it takes.
  std::string text;
  for (int i = 0; i < 4; ++i) text += "/* Creates a session that generates with a target. */ ";
  const std::vector<int32_t> longer = bytes(text.c_str());
  assert_true(longer.size() > 3 * 64);
  const Run shifted = run(e.target, nullptr, longer, 50, 1, 8);
  assert_int_equal(shifted.status, SPECINFER_OK);
  assert_int_equal(shifted.generated.size(), 50);
  assert_true(shifted.shifts >= 3);
  const Run stuck = run(e.target, nullptr, prompt, 300, 1, 63);
  assert_int_equal(stuck.status, SPECINFER_ERR_CONTEXT_FULL);
  assert_non_null(std::strstr(stuck.error.c_str(), "n_keep 63"));
  close_env(e);
}

// Greedy on a real model with a 48-token window: the first shift happens when the sequence
// reaches 48 tokens; it keeps n_keep (4) and drops (48 - 4) / 2 = 22, and the 22 tokens after it
// are what a fresh session (no shift) fed the kept 26 generates.
void check_real_model(const char *file) {
  char path[4096];
  if (!model_path(file, path, sizeof path)) {
    std::printf("skipped: %s is absent (scripts/fetch-models)\n", path);
    return;
  }
  const int n_ctx = 48, keep = 4, drop = (n_ctx - keep) / 2;
  Env e = open_env("gguf", std::string("path=") + path + ",n_ctx=48");
  const char *text = "def merge_sorted(a, b):\n    \"\"\"Merges two sorted lists.\"\"\"\n";
  std::vector<int32_t> prompt(64);
  size_t n = 0;
  assert_int_equal(specinfer_target_tokenize(e.target, text, std::strlen(text), 1, 1, prompt.data(),
                                             prompt.size(), &n),
                   SPECINFER_OK);
  prompt.resize(n);
  assert_true(n > size_t(keep) && n < size_t(n_ctx - 8));
  const int32_t want = n_ctx - int32_t(n) + drop;  // up to the second shift
  const Run ref = run(e.target, nullptr, prompt, want, 1, keep);
  if (ref.generated.size() < size_t(want)) {  // the text ended before the shift's effect shows
    std::printf("skipped: %s ended its text after %zu tokens\n", file, ref.generated.size());
    close_env(e);
    return;
  }
  assert_int_equal(ref.status, SPECINFER_OK);
  assert_int_equal(ref.shifts, 1);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), ref.generated.begin(), ref.generated.end());
  std::vector<int32_t> kept(seq.begin(), seq.begin() + keep);
  kept.insert(kept.end(), seq.begin() + keep + drop, seq.begin() + n_ctx);
  const Run fresh = run(e.target, nullptr, kept, drop, 0, 0);
  assert_int_equal(fresh.status, SPECINFER_OK);
  assert_int_equal(fresh.generated.size(), size_t(drop));
  assert_memory_equal(fresh.generated.data(), seq.data() + n_ctx, size_t(drop) * sizeof(int32_t));
  const Run spec = run(e.target, e.ngram, prompt, want, 1, keep, Mode::kStep);
  assert_int_equal(spec.status, SPECINFER_OK);
  assert_memory_equal(spec.generated.data(), ref.generated.data(), size_t(want) * sizeof(int32_t));
  close_env(e);
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
      cmocka_unit_test(test_kgram),
      cmocka_unit_test(test_qwen),
      cmocka_unit_test(test_gemma),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
