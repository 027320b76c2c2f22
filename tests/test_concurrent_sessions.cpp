// Many sessions on many threads, on small kgram models, through the public ABI: fast enough for
// ThreadSanitizer in CI (scripts/test --tsan), where tests/test_shared_model.cpp does the same on
// a real model.
//  - eight threads each share a target from one kgram model, open an ngram drafter on it and
//    generate; every text equals the one a lone session gives;
//  - eight threads race to create a session on one target: exactly one gets it, the others get
//    STATE, and once it is gone the next one may;
//  - meanwhile threads open, share and destroy targets and drafters while others generate;
//  - a session fed another's text (specinfer_session_feed_from) on a target that cannot copy its
//    cache (kgram has no kv_copy) scores the tokens itself and continues as a fed session does.
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "specinfer.h"

#include "support/test_util.h"

namespace {

constexpr const char *kCorpus = "abi/specinfer.h";
constexpr int kThreads = 8;
constexpr int kTokens = 64;
const char *const kPrompts[] = {"SPECINFER_API specinfer_status specinfer_", "/* Creates a ",
                                "typedef struct specinfer_"};

std::vector<int32_t> generate(specinfer_target *t, specinfer_drafter *d, const char *prompt,
                              std::string *error) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  specinfer_session *s = nullptr;
  char *err = nullptr;
  std::vector<int32_t> out;
  if (specinfer_session_create(t, d, nullptr, &p, &s, &err) != SPECINFER_OK) {
    *error = std::string("session: ") + (err ? err : "?");
    specinfer_free(err);
    return out;
  }
  const int32_t *toks = nullptr;
  size_t n = 0;
  if (specinfer_session_feed_text(s, prompt, std::strlen(prompt)) != SPECINFER_OK ||
      specinfer_session_generate(s, kTokens, nullptr, nullptr) != SPECINFER_OK ||
      specinfer_session_tokens(s, &toks, &n) != SPECINFER_OK)
    *error = specinfer_session_errmsg(s);
  else
    out.assign(toks, toks + n);
  specinfer_session_destroy(s);
  return out;
}

void test_sessions_on_threads(void **) {
  specinfer_registry *reg = new_registry();
  specinfer_target *first = open_kgram(reg, kCorpus, 6);
  std::vector<std::vector<int32_t>> lone;
  for (const char *prompt : kPrompts) {
    std::string error;
    lone.push_back(generate(first, nullptr, prompt, &error));
    assert_true(error.empty());
  }
  struct Job {
    specinfer_target *target = nullptr;
    specinfer_drafter *drafter = nullptr;
    std::vector<int32_t> tokens;
    std::string error;
  };
  std::vector<Job> jobs(kThreads);
  const std::string config = kgram_config(kCorpus, "k=6");  // (a static buffer: not on threads)
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      Job &j = jobs[static_cast<size_t>(i)];
      char *err = nullptr;
      // Half share the first target, half open the same config (which shares it too).
      specinfer_status rc =
          i % 2 ? specinfer_target_share(first, &j.target, &err)
                : specinfer_target_open(reg, "kgram", config.c_str(), &j.target, &err);
      if (rc == SPECINFER_OK && i % 4 < 2)
        rc = specinfer_drafter_open(reg, "ngram", "n_max=3", j.target, &j.drafter, &err);
      if (rc != SPECINFER_OK) {
        j.error = err ? err : "?";
        specinfer_free(err);
        return;
      }
      for (int round = 0; round < 2 && j.error.empty(); ++round)
        j.tokens = generate(j.target, j.drafter, kPrompts[(i + round) % 3], &j.error);
    });
  for (std::thread &t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    Job &j = jobs[static_cast<size_t>(i)];
    if (!j.error.empty()) std::fprintf(stderr, "thread %d: %s\n", i, j.error.c_str());
    assert_true(j.error.empty());
    assert_true(j.tokens == lone[static_cast<size_t>((i + 1) % 3)]);
    assert_int_equal(specinfer_drafter_destroy(j.drafter), SPECINFER_OK);
    assert_int_equal(specinfer_target_destroy(j.target), SPECINFER_OK);
  }
  assert_int_equal(specinfer_target_destroy(first), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

void test_one_session_per_target(void **) {
  specinfer_registry *reg = new_registry();
  specinfer_target *t = open_kgram(reg, kCorpus, 4);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::atomic<int> go{0}, won{0}, refused{0};
    std::vector<specinfer_session *> sessions(kThreads, nullptr);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        while (go.load() == 0) {
        }
        char *err = nullptr;
        const specinfer_status rc =
            specinfer_session_create(t, nullptr, nullptr, nullptr, &sessions[i], &err);
        if (rc == SPECINFER_OK)
          ++won;
        else if (rc == SPECINFER_ERR_STATE && err && std::strstr(err, "already used"))
          ++refused;
        specinfer_free(err);
      });
    go = 1;
    for (std::thread &th : threads) th.join();
    assert_int_equal(won.load(), 1);
    assert_int_equal(refused.load(), kThreads - 1);
    for (specinfer_session *s : sessions) specinfer_session_destroy(s);
  }
  assert_int_equal(specinfer_target_destroy(t), SPECINFER_OK);
  assert_int_equal(specinfer_registry_destroy(reg), SPECINFER_OK);
}

}  // namespace

void test_feed_from_scores_what_it_cannot_copy(void **) {
  specinfer_registry *reg = new_registry();
  specinfer_target *first = open_kgram(reg, kCorpus, 6);
  specinfer_target *other = nullptr;
  assert_int_equal(specinfer_target_share(first, &other, nullptr), SPECINFER_OK);
  std::string error;
  const std::vector<int32_t> want = generate(other, nullptr, kPrompts[0], &error);
  assert_true(error.empty());
  specinfer_session *src = nullptr, *s = nullptr;
  assert_int_equal(specinfer_session_create(first, nullptr, nullptr, nullptr, &src, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(src, kPrompts[0], std::strlen(kPrompts[0])),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(src, 8, nullptr, nullptr), SPECINFER_OK);
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(src, &st), SPECINFER_OK);
  assert_int_equal(specinfer_session_create(other, nullptr, nullptr, nullptr, &s, nullptr),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_from(s, src, static_cast<size_t>(st.n_prompt_tokens)),
                   SPECINFER_OK);
  assert_int_equal(specinfer_session_generate(s, kTokens, nullptr, nullptr), SPECINFER_OK);
  const int32_t *toks = nullptr;
  size_t n = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &n), SPECINFER_OK);
  assert_true(std::vector<int32_t>(toks, toks + n) == want);
  specinfer_session_stats_init(&st);
  assert_int_equal(specinfer_session_get_stats(s, &st), SPECINFER_OK);
  assert_true(st.n_target_passes > st.n_rounds);  // the prompt's pass: nothing was copied
  specinfer_session_destroy(s);
  specinfer_session_destroy(src);
  specinfer_target_destroy(other);
  specinfer_target_destroy(first);
  specinfer_registry_destroy(reg);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sessions_on_threads),
                                     cmocka_unit_test(test_one_session_per_target),
                                     cmocka_unit_test(test_feed_from_scores_what_it_cannot_copy)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
