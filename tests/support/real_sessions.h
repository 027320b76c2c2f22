// Sessions on a real model for the C++ end-to-end tests: a registry and a gguf target opened
// once per test program, and one generation run through the public ABI.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "specinfer.h"
#include "specinfer_plugin.h"
#include "support/cmocka_setup.h"

// A registry with two threads (plus `extra`, an in-process plugin, when given) and the gguf
// target at `model` with a 1024-token context. Prints what failed and returns false (for a
// cmocka group setup to fail) when either cannot be made.
struct RealTarget {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;

  bool open(const std::string &model, const specinfer_plugin_descriptor *extra = nullptr) {
    specinfer_registry_params p;
    specinfer_registry_params_init(&p);
    p.n_threads = 2;
    char *err = nullptr;
    if (specinfer_registry_create(&p, &reg, &err) != SPECINFER_OK ||
        (extra && specinfer_registry_register_plugin(reg, extra, &err) != SPECINFER_OK)) {
      std::fprintf(stderr, "registry: %s\n", err ? err : "?");
      specinfer_free(err);
      return false;
    }
    const std::string cfg = "path=" + model + ",n_ctx=1024";
    if (specinfer_target_open(reg, "gguf", cfg.c_str(), &target, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "target: %s\n", err ? err : "?");
      specinfer_free(err);
      return false;
    }
    return true;
  }

  void close() {
    if (target) specinfer_target_destroy(target);
    if (reg) specinfer_registry_destroy(reg);
    target = nullptr;
    reg = nullptr;
  }
};

// Prompts of the end-to-end tests: a completion, an edit of input text, a chat turn.
inline const char *const kCodePrompts[] = {
    "def fib(n):\n",
    "# Rename `total` to `acc` in this function.\n"
    "def add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n\n"
    "# The same function with `total` renamed to `acc`:\n",
    "<|im_start|>user\nWrite a Python function that reverses a "
    "string.<|im_end|>\n<|im_start|>assistant\n",
};

struct RunParams {
  const specinfer_coupler *coupler = nullptr;  // NULL: the session's default
  float temperature = 0.0f;
  uint64_t seed = 0;
  int max_draft = 8;
  bool adaptive = true;
  specinfer_constraint *constraint = nullptr;  // set on the session before the prompt (NULL: none)
};

// Feeds `prompt` and generates n tokens on `target` with drafter d (NULL: plain decoding), under
// rp.constraint when set (destroying the session releases it, back in its state when set);
// returns the whole token sequence and, when st is given, the session's statistics. Fails the
// test on any error.
inline std::vector<int32_t> run_session(specinfer_target *target, specinfer_drafter *d,
                                        const char *prompt, int n, const RunParams &rp,
                                        specinfer_session_stats *st = nullptr) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.temperature = rp.temperature;
  p.seed = rp.seed;
  p.max_draft = rp.max_draft;
  p.adaptive_draft = rp.adaptive ? 1 : 0;
  specinfer_session *s = nullptr;
  char *err = nullptr;
  specinfer_status rc = specinfer_session_create(target, d, rp.coupler, &p, &s, &err);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "session: %s\n", err ? err : "?");
  specinfer_free(err);
  assert_int_equal(rc, SPECINFER_OK);
  if (rp.constraint)
    assert_int_equal(specinfer_session_set_constraint(s, rp.constraint), SPECINFER_OK);
  assert_int_equal(specinfer_session_feed_text(s, prompt, std::strlen(prompt)), SPECINFER_OK);
  rc = specinfer_session_generate(s, n, nullptr, nullptr);
  if (rc != SPECINFER_OK) std::fprintf(stderr, "generate: %s\n", specinfer_session_errmsg(s));
  assert_int_equal(rc, SPECINFER_OK);
  const int32_t *toks = nullptr;
  size_t len = 0;
  assert_int_equal(specinfer_session_tokens(s, &toks, &len), SPECINFER_OK);
  std::vector<int32_t> out(toks, toks + len);
  if (st) {
    specinfer_session_stats_init(st);
    assert_int_equal(specinfer_session_get_stats(s, st), SPECINFER_OK);
  }
  specinfer_session_destroy(s);
  return out;
}

// The draft a proposal writes (a drafter called directly): up to `cap` nodes into tokens and
// parents, and their distributions into probs (cap x vocab floats; NULL: point masses only).
inline specinfer_draft draft_into(int32_t *tokens, int32_t *parents, int32_t cap, int32_t vocab,
                                  float *probs = nullptr) {
  specinfer_draft out{};
  out.struct_size = sizeof out;
  out.cap = cap;
  out.vocab_size = vocab;
  out.tokens = tokens;
  out.parents = parents;
  out.probs = probs;
  return out;
}
