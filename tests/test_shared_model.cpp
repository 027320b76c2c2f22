// One loaded model, many users, through the public ABI on a real model (Qwen2.5-Coder 0.5B;
// scripts/fetch-models; skips with a message when absent):
//  - targets shared from one (specinfer_target_share, and specinfer_target_open of the same
//    config) run sessions on four threads at once, plain and speculative, and every text equals
//    the one a lone session gives;
//  - sharing costs no second copy of the weights: resident memory grows by far less than the
//    model's file for three more targets and their sessions, and for a second draft-model
//    drafter (its draft model is shared too);
//  - the first target may be destroyed before its shares;
//  - specinfer_session_step_many: sessions on shared targets stepped together (one target pass
//    per round) emit what each emits alone, greedy and Gumbel-sampled, with no drafter, prompt
//    lookup and draft-model drafters (theirs drafting in one call when both draft), with prompts
//    scored whole or in chunks alongside the others' rounds; bad calls are refused per session;
//  - a session fed another's text (specinfer_session_feed_from) copies its scored prompt and
//    continues as a session fed the prompt does;
//  - a pass's activations are allocated once per loaded model, not once per target.
#include <stdint.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "specinfer.h"

#include "support/cmocka_setup.h"
#include "support/models.h"
#include "support/real_sessions.h"
#include "support/resident.h"
#include "support/same_tokens.h"
#include "support/step_together.h"

namespace {

std::string g_model;
int g_tokens = 24;
// ThreadSanitizer (SPECINFER_TSAN=1, scripts/test --tsan) keeps shadow memory for every byte the
// process touches, so resident memory no longer shows what sharing saves: not checked then.
bool g_tsan = false;

const auto &kPrompts = kCodePrompts;

// Resident memory of this process in bytes (VmRSS), 0 when unknown.
long long file_bytes(const std::string &path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : 0;
}

// One generation off the test thread: no cmocka asserts here, the result is checked afterwards.
struct Job {
  specinfer_target *target = nullptr;
  specinfer_drafter *drafter = nullptr;
  const char *prompt = nullptr;
  std::vector<int32_t> tokens;
  std::string error;

  void run() {
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    specinfer_session *s = nullptr;
    char *err = nullptr;
    if (specinfer_session_create(target, drafter, nullptr, &p, &s, &err) != SPECINFER_OK) {
      error = std::string("session: ") + (err ? err : "?");
      specinfer_free(err);
      return;
    }
    const int32_t *toks = nullptr;
    size_t len = 0;
    if (specinfer_session_feed_text(s, prompt, std::strlen(prompt)) != SPECINFER_OK ||
        specinfer_session_generate(s, g_tokens, nullptr, nullptr) != SPECINFER_OK ||
        specinfer_session_tokens(s, &toks, &len) != SPECINFER_OK)
      error = std::string("generate: ") + specinfer_session_errmsg(s);
    else
      tokens.assign(toks, toks + len);
    specinfer_session_destroy(s);
  }
};

specinfer_drafter *open_drafter(specinfer_registry *reg, const char *plugin, const std::string &cfg,
                                specinfer_target *target) {
  specinfer_drafter *d = nullptr;
  char *err = nullptr;
  const specinfer_status rc = specinfer_drafter_open(reg, plugin, cfg.c_str(), target, &d, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "drafter %s: %s\n", plugin, err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  return d;
}

void test_sessions_on_shared_targets(void **) {
  if (g_model.empty()) {
    std::printf("skipped: qwen2.5-coder-0.5b.gguf is not in %s (scripts/fetch-models)\n",
                models_dir());
    return;
  }
  const long long start = resident_bytes();
  RealTarget env;
  assert_true(env.open(g_model));
  // What lone sessions say: plain decoding of each prompt.
  const size_t n_prompts = sizeof kPrompts / sizeof kPrompts[0];
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < n_prompts; ++i)
    expected.push_back(run_session(env.target, nullptr, kPrompts[i], g_tokens, RunParams{}));

  const long long before = resident_bytes(), model = file_bytes(g_model);
  assert_true(before > 0 && model > 0);
  // Packing (the default) hands the file's pages of each packed matrix back: the loaded model
  // holds its weights once. (Sanitizers add shadow memory to every allocation.)
  std::printf("resident: %lld MiB before loading, %lld MiB with the model and its sessions run\n",
              start >> 20, before >> 20);
  if (!std::getenv("SPECINFER_SANITIZED")) assert_true(before - start < model + model / 10);
  specinfer_target *t[4] = {env.target, nullptr, nullptr, nullptr};
  char *err = nullptr;
  assert_int_equal(specinfer_target_share(env.target, &t[1], &err), SPECINFER_OK);
  assert_int_equal(specinfer_target_share(t[1], &t[2], &err), SPECINFER_OK);
  // Opening the same model with the same config again shares it as well.
  const std::string cfg = "path=" + g_model + ",n_ctx=1024";
  assert_int_equal(specinfer_target_open(env.reg, "gguf", cfg.c_str(), &t[3], &err), SPECINFER_OK);
  specinfer_target *none = nullptr;
  assert_int_equal(specinfer_target_share(nullptr, &none, &err), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_null(none);
  assert_non_null(err);
  specinfer_free(err);
  err = nullptr;

  // Four sessions at once: two plain, two with prompt lookup (ngram).
  std::vector<specinfer_drafter *> drafters(4, nullptr);
  drafters[1] = open_drafter(env.reg, "ngram", "", t[1]);
  drafters[3] = open_drafter(env.reg, "ngram", "", t[3]);
  std::vector<Job> jobs(4);
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].target = t[i];
    jobs[i].drafter = drafters[i];
    jobs[i].prompt = kPrompts[(i + 1) % n_prompts];
  }
  std::vector<std::thread> threads;
  for (Job &j : jobs) threads.emplace_back([&j] { j.run(); });
  for (std::thread &th : threads) th.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].error.empty()) std::fprintf(stderr, "session %zu: %s\n", i, jobs[i].error.c_str());
    assert_true(jobs[i].error.empty());
    expect_same_tokens(expected[(i + 1) % n_prompts], jobs[i].tokens, "shared session",
                       jobs[i].prompt);
  }
  const long long shared = resident_bytes();
  std::printf(
      "resident: %lld MiB with one target, %lld MiB with four sharing it (model file %lld "
      "MiB)\n",
      before >> 20, shared >> 20, model >> 20);
  if (!g_tsan) assert_true(shared - before < model / 4);
  for (specinfer_drafter *d : drafters) specinfer_drafter_destroy(d);

  // A draft-model drafter per session: the second one's draft model is the first one's.
  specinfer_drafter *d1 = open_drafter(env.reg, "draft-model", "path=" + g_model, t[1]);
  const long long one_draft = resident_bytes();
  specinfer_drafter *d2 = open_drafter(env.reg, "draft-model", "path=" + g_model, t[2]);
  const long long two_drafts = resident_bytes();
  std::printf("resident: %lld MiB with one draft-model drafter, %lld MiB with two\n",
              one_draft >> 20, two_drafts >> 20);
  if (!g_tsan) assert_true(two_drafts - one_draft < model / 4);
  Job a{t[1], d1, kPrompts[0], {}, {}}, b{t[2], d2, kPrompts[2], {}, {}};
  std::thread ta([&a] { a.run(); }), tb([&b] { b.run(); });
  ta.join();
  tb.join();
  assert_true(a.error.empty() && b.error.empty());
  expect_same_tokens(expected[0], a.tokens, "draft-model", a.prompt);
  expect_same_tokens(expected[2], b.tokens, "draft-model", b.prompt);
  specinfer_drafter_destroy(d1);
  specinfer_drafter_destroy(d2);

  // The first target goes first; its shares keep the model.
  assert_int_equal(specinfer_target_destroy(env.target), SPECINFER_OK);
  env.target = t[3];
  expect_same_tokens(expected[1], run_session(t[2], nullptr, kPrompts[1], g_tokens, RunParams{}),
                     "after the first target is gone", kPrompts[1]);
  specinfer_target_destroy(t[1]);
  specinfer_target_destroy(t[2]);
  env.close();
}

// A session for step_many: the prompt fed, nothing generated yet.
specinfer_session *new_session(specinfer_target *t, specinfer_drafter *d,
                               const specinfer_coupler *c, float temperature, const char *prompt) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.temperature = temperature;
  p.seed = 7;
  specinfer_session *s = nullptr;
  assert_int_equal(specinfer_session_create(t, d, c, &p, &s, nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, std::strlen(prompt)), SPECINFER_OK);
  return s;
}

// Sessions stepped together (one target pass per round for all of them) emit what each emits
// alone: greedy plain and speculative, and Gumbel-sampled (drafter-invariant) at a fixed seed.
void test_step_many_equals_lone_sessions(void **) {
  if (g_model.empty()) {
    std::printf("skipped: qwen2.5-coder-0.5b.gguf is not in %s\n", models_dir());
    return;
  }
  RealTarget env;
  assert_true(env.open(g_model));
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  struct Case {
    const char *drafter;  // nullptr: plain decoding
    const specinfer_coupler *coupler;
    float temperature;
    const char *prompt;
  };
  // Two draft-model drafters: their drafts are made in one call (propose_many) when the budget
  // rule lets both draft in a step.
  const Case cases[] = {
      {nullptr, nullptr, 0.0f, kPrompts[0]},       {"ngram", nullptr, 0.0f, kPrompts[1]},
      {"ngram", gumbel, 0.8f, kPrompts[2]},        {nullptr, gumbel, 0.8f, kPrompts[0]},
      {"draft-model", nullptr, 0.0f, kPrompts[1]}, {"draft-model", gumbel, 0.8f, kPrompts[2]}};
  const size_t n = sizeof cases / sizeof cases[0];
  std::vector<specinfer_target *> t(n, nullptr);
  std::vector<specinfer_drafter *> d(n, nullptr);
  std::vector<specinfer_session *> s(n, nullptr);
  std::vector<std::vector<int32_t>> lone(n);
  for (size_t i = 0; i < n; ++i) {
    assert_int_equal(specinfer_target_share(env.target, &t[i], nullptr), SPECINFER_OK);
    if (cases[i].drafter)
      d[i] = open_drafter(env.reg, cases[i].drafter,
                          std::strcmp(cases[i].drafter, "ngram") ? "path=" + g_model : "", t[i]);
    RunParams rp;
    rp.coupler = cases[i].coupler;
    rp.temperature = cases[i].temperature;
    rp.seed = 7;
    lone[i] = run_session(t[i], nullptr, cases[i].prompt, g_tokens, rp);
  }
  // Rounds of every session still short of the lone text's length, stepped together: with the
  // prompts scored whole (chunk 0) and in chunks of 5 tokens, so that sessions still scoring
  // their prompt share passes with sessions that emit tokens.
  for (const int32_t chunk : {0, 5}) {
    std::vector<std::vector<int32_t>> got(n);
    std::vector<std::string> texts(n);
    std::vector<size_t> prompt_len(n);
    for (size_t i = 0; i < n; ++i) {
      if (s[i]) specinfer_session_destroy(s[i]);
      s[i] = new_session(t[i], d[i], cases[i].coupler, cases[i].temperature, cases[i].prompt);
      size_t len = 0;
      const int32_t *toks = nullptr;
      assert_int_equal(specinfer_session_tokens(s[i], &toks, &len), SPECINFER_OK);
      got[i].assign(toks, toks + len);
      prompt_len[i] = len;
    }
    specinfer_step_params params;
    specinfer_step_params_init(&params);
    params.prefill_chunk = chunk;
    std::vector<size_t> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = lone[i].size();
    // Steps in which one session scored a prompt chunk (no token) and another emitted.
    std::vector<std::pair<bool, bool>> empty_emitted;
    step_together(s, got, want, params, 4 * g_tokens + 64,
                  [&](int step, size_t i, const specinfer_step_result &r) {
                    if (chunk == 0) assert_true(r.n_tokens >= 1);
                    if (empty_emitted.size() <= static_cast<size_t>(step))
                      empty_emitted.resize(static_cast<size_t>(step) + 1);
                    auto &[empty, emitted] = empty_emitted[static_cast<size_t>(step)];
                    (r.n_tokens == 0 ? empty : emitted) = true;
                    const char *text = nullptr;
                    size_t text_len = 0;
                    assert_int_equal(specinfer_session_step_text(s[i], &text, &text_len),
                                     SPECINFER_OK);
                    texts[i].append(text, text_len);
                  });
    const auto mixed = std::count_if(empty_emitted.begin(), empty_emitted.end(),
                                     [](const auto &e) { return e.first && e.second; });
    if (chunk > 0) assert_true(mixed > 0);
    for (size_t i = 0; i < n; ++i) {
      got[i].resize(lone[i].size());  // a last round may emit past the lone run's end
      expect_same_tokens(lone[i], got[i], chunk ? "step_many, chunked prefill" : "step_many",
                         cases[i].prompt);
      // The results' text is the generated tokens' text (a last round past the lone run's end may
      // add more).
      std::vector<char> buf(4096);
      size_t nb = 0;
      assert_int_equal(
          specinfer_target_detokenize(t[i], got[i].data() + prompt_len[i],
                                      got[i].size() - prompt_len[i], buf.data(), buf.size(), &nb),
          SPECINFER_OK);
      assert_true(texts[i].compare(0, nb, std::string(buf.data(), nb)) == 0);
    }
  }

  // Refused: a session twice, a small buffer; the other session of the call still steps.
  int32_t buf[64];
  specinfer_step_result r[2]{};
  for (auto &x : r) {
    x.struct_size = sizeof x;
    x.tokens = buf;
    x.cap = 64;
  }
  specinfer_session *twice[2] = {s[0], s[0]};
  assert_int_equal(specinfer_session_step_many(twice, r, 2, nullptr),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(specinfer_session_errmsg(s[0]), "twice"));
  specinfer_session *pair[2] = {s[1], s[0]};
  r[0].cap = 0;  // no room for a token
  assert_int_equal(specinfer_session_step_many(pair, r, 2, nullptr),
                   SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(r[0].status, SPECINFER_ERR_BUFFER_TOO_SMALL);
  assert_int_equal(r[1].status, SPECINFER_OK);
  assert_true(r[1].n_tokens >= 1);
  r[1].struct_size = 4;
  assert_int_equal(specinfer_session_step_many(pair, r, 2, nullptr),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_step_many(nullptr, r, 2, nullptr),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_step_many(pair, r, 0, nullptr), SPECINFER_OK);
  specinfer_step_params bad;
  specinfer_step_params_init(&bad);
  bad.prefill_chunk = -1;
  r[1].struct_size = sizeof r[1];
  assert_int_equal(specinfer_session_step_many(pair, r, 2, &bad), SPECINFER_ERR_INVALID_ARGUMENT);

  for (size_t i = 0; i < n; ++i) {
    specinfer_session_destroy(s[i]);
    specinfer_drafter_destroy(d[i]);
    specinfer_target_destroy(t[i]);
  }
  specinfer_coupler_destroy(gumbel);
  env.close();
}

}  // namespace

// A pass's activations come from a pool on the loaded model, not from each target: the first
// prefill on a model allocates them, prefills of the same length on its shares allocate only
// their own KV caches.
// A session fed another's text (specinfer_session_feed_from) continues it as a session fed the
// same prompt does, the prompt's positions copied rather than scored: greedy plain and with a
// draft model, and Gumbel-sampled at another seed; the source's own generated tokens stay out of
// the copy. Bad calls are refused.
void test_feed_from_shares_the_prompt(void **) {
  if (g_model.empty()) {
    std::printf("skipped: qwen2.5-coder-0.5b.gguf is not in %s\n", models_dir());
    return;
  }
  RealTarget env;
  assert_true(env.open(g_model));
  specinfer_target *t = nullptr;
  assert_int_equal(specinfer_target_share(env.target, &t, nullptr), SPECINFER_OK);
  specinfer_coupler *gumbel = nullptr;
  assert_int_equal(specinfer_coupler_create("gumbel", &gumbel, nullptr), SPECINFER_OK);
  const char *prompt = kPrompts[1];
  // The source has generated past its prompt: its cache holds more than the prompt.
  specinfer_session *src = new_session(env.target, nullptr, nullptr, 0.0f, prompt);
  assert_int_equal(specinfer_session_generate(src, g_tokens, nullptr, nullptr), SPECINFER_OK);
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(src, &st), SPECINFER_OK);
  const auto n_prompt = static_cast<size_t>(st.n_prompt_tokens);

  RunParams sampled;
  sampled.coupler = gumbel;
  sampled.temperature = 0.8f;
  sampled.seed = 11;
  struct Case {
    bool draft_model;
    const RunParams *rp;
  };
  const RunParams greedy;
  for (const Case c : {Case{false, &greedy}, Case{true, &greedy}, Case{false, &sampled}}) {
    const std::vector<int32_t> want = run_session(t, nullptr, prompt, g_tokens, *c.rp);
    specinfer_drafter *d =
        c.draft_model ? open_drafter(env.reg, "draft-model", "path=" + g_model, t) : nullptr;
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    p.temperature = c.rp->temperature;
    p.seed = c.rp->seed;
    specinfer_session *s = nullptr;
    assert_int_equal(specinfer_session_create(t, d, c.rp->coupler, &p, &s, nullptr), SPECINFER_OK);
    assert_int_equal(specinfer_session_feed_from(s, src, n_prompt), SPECINFER_OK);
    assert_int_equal(specinfer_session_generate(s, g_tokens, nullptr, nullptr), SPECINFER_OK);
    const int32_t *toks = nullptr;
    size_t len = 0;
    assert_int_equal(specinfer_session_tokens(s, &toks, &len), SPECINFER_OK);
    expect_same_tokens(want, std::vector<int32_t>(toks, toks + len),
                       c.draft_model ? "fed from a session, draft-model" : "fed from a session",
                       prompt);
    specinfer_session_stats_init(&st);
    assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
    assert_int_equal(st.n_prompt_tokens, static_cast<int64_t>(n_prompt));
    // No pass scored the prompt (a drafter's hidden state needs its last position again).
    assert_true(st.n_target_passes <= st.n_rounds + (c.draft_model ? 1 : 0));
    // A session with text takes none from another.
    assert_int_equal(specinfer_session_feed_from(s, src, n_prompt), SPECINFER_ERR_STATE);
    specinfer_session_destroy(s);
    specinfer_drafter_destroy(d);
  }

  specinfer_session *s = nullptr;
  assert_int_equal(specinfer_session_create(t, nullptr, nullptr, nullptr, &s, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_from(s, nullptr, 1), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_from(nullptr, src, 1), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_from(s, src, 0), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_from(s, src, n_prompt + g_tokens + 1),
                   SPECINFER_ERR_INVALID_ARGUMENT);
  assert_int_equal(specinfer_session_feed_from(s, s, 1), SPECINFER_ERR_INVALID_ARGUMENT);
  specinfer_session_destroy(s);
  // A target on another loaded model (another context size: another config).
  specinfer_target *other = nullptr;
  const std::string cfg = "path=" + g_model + ",n_ctx=512";
  assert_int_equal(specinfer_target_open(env.reg, "gguf", cfg.c_str(), &other, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_create(other, nullptr, nullptr, nullptr, &s, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_from(s, src, n_prompt), SPECINFER_ERR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(specinfer_session_errmsg(s), "loaded model"));
  specinfer_session_destroy(s);
  specinfer_target_destroy(other);
  specinfer_session_destroy(src);
  specinfer_coupler_destroy(gumbel);
  specinfer_target_destroy(t);
  env.close();
}

void test_pass_scratch_is_shared(void **) {
  if (g_model.empty()) {
    std::printf("skipped: qwen2.5-coder-0.5b.gguf is not in %s\n", models_dir());
    return;
  }
  if (allocated_bytes() == 0) {
    std::printf("skipped: malloc statistics are not the allocator's (sanitizer build)\n");
    return;
  }
  RealTarget env;
  assert_true(env.open(g_model));
  specinfer_target *t[3] = {env.target, nullptr, nullptr};
  assert_int_equal(specinfer_target_share(t[0], &t[1], nullptr), SPECINFER_OK);
  assert_int_equal(specinfer_target_share(t[0], &t[2], nullptr), SPECINFER_OK);
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += kPrompts[1];  // about 240 tokens
  long long delta[3];
  for (int i = 0; i < 3; ++i) {
    specinfer_session *s = new_session(t[i], nullptr, nullptr, 0.0f, prompt.c_str());
    const long long before = allocated_bytes();
    int32_t out[1];
    size_t n = 0;
    int32_t done = 0;
    assert_int_equal(specinfer_session_step(s, out, 1, &n, &done), SPECINFER_OK);
    delta[i] = allocated_bytes() - before;
    specinfer_session_destroy(s);
  }
  std::printf("allocated by a prefill: %.1f MiB on the first target, %.1f and %.1f on its shares\n",
              delta[0] / 1048576.0, delta[1] / 1048576.0, delta[2] / 1048576.0);
  // The 0.5B's activations are 54 KiB a token (13 MiB for 240 tokens); its KV cache 12 KiB.
  for (int i = 1; i < 3; ++i) assert_true(delta[i] + (4 << 20) < delta[0]);
  specinfer_target_destroy(t[1]);
  specinfer_target_destroy(t[2]);
  env.close();
}

int main(void) {
  const std::string path = std::string(models_dir()) + "/qwen2.5-coder-0.5b.gguf";
  if (is_regular_file(path.c_str())) g_model = path;
  const char *san = std::getenv("SPECINFER_SANITIZED");
  if (san && std::strcmp(san, "1") == 0) g_tokens = 8;
  g_tsan = std::getenv("SPECINFER_TSAN") != nullptr;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sessions_on_shared_targets),
                                     cmocka_unit_test(test_step_many_equals_lone_sessions),
                                     cmocka_unit_test(test_feed_from_shares_the_prompt),
                                     cmocka_unit_test(test_pass_scratch_is_shared)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
