// Fuzz target: grammars handed to the llguidance constraint plugin (plugins/llguidance) through
// the public API, on a real vocabulary (the Qwen2.5-Coder 0.5B's, fuzz::model_path). The first
// byte picks the kind (json_schema, regex, lark, json_object), the rest up to a NUL is the
// grammar. specinfer_constraint_open either opens it or refuses it with INVALID_ARGUMENT or
// UNSUPPORTED and a message; an opened constraint forks, and a greedy session under it generates
// a few tokens that end with OK or STATE (the grammar ended), never a crash or another status.
// Runs with the plugin from $SPECINFER_PLUGIN_PATH (the build's plugins). Without the model, or
// without the plugin (no cargo new enough), the target exits 77 (skipped) before the first input.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fuzz_common.h"
#include "specinfer.h"

namespace {

specinfer_registry *g_reg = nullptr;
specinfer_target *g_target = nullptr;

const char *const kKinds[] = {"json_schema", "regex", "lark", "json_object"};
const char kPrompt[] = "<|im_start|>user\nAnswer.<|im_end|>\n<|im_start|>assistant\n";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  const std::string path = fuzz::model_path();
  if (path.empty()) {
    std::fprintf(stderr,
                 "fuzz_constraint: no qwen2.5-coder-0.5b.gguf (scripts/fetch-models): "
                 "skipped\n");
    std::exit(fuzz::kSkip);
  }
  specinfer_registry_params p;
  specinfer_registry_params_init(&p);
  p.n_threads = 1;
  FUZZ_CHECK(specinfer_registry_create(&p, &g_reg, nullptr) == SPECINFER_OK);
  const std::string cfg = "path=" + path + ",n_ctx=128";
  FUZZ_CHECK(specinfer_target_open(g_reg, "gguf", cfg.c_str(), &g_target, nullptr) == SPECINFER_OK);
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status rc =
      specinfer_constraint_open(g_reg, "llguidance", nullptr, g_target, "regex", "a", &c, &err);
  if (rc == SPECINFER_ERR_NOT_FOUND) {
    std::fprintf(stderr, "fuzz_constraint: no llguidance plugin (%s): skipped\n", err ? err : "");
    std::exit(fuzz::kSkip);
  }
  specinfer_free(err);
  FUZZ_CHECK(rc == SPECINFER_OK);
  FUZZ_CHECK(specinfer_constraint_destroy(c) == SPECINFER_OK);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const char *kind = kKinds[data[0] % 4];
  const std::string grammar(reinterpret_cast<const char *>(data) + 1,
                            strnlen(reinterpret_cast<const char *>(data) + 1, size - 1));
  specinfer_constraint *c = nullptr;
  char *err = nullptr;
  const specinfer_status rc = specinfer_constraint_open(g_reg, "llguidance", nullptr, g_target,
                                                        kind, grammar.c_str(), &c, &err);
  if (rc != SPECINFER_OK) {
    FUZZ_CHECK(rc == SPECINFER_ERR_INVALID_ARGUMENT || rc == SPECINFER_ERR_UNSUPPORTED);
    FUZZ_CHECK(err && *err);
    FUZZ_CHECK(c == nullptr);
    specinfer_free(err);
    return 0;
  }
  specinfer_constraint *fork = nullptr;
  FUZZ_CHECK(specinfer_constraint_fork(c, &fork, nullptr) == SPECINFER_OK);
  specinfer_session *s = nullptr;
  FUZZ_CHECK(specinfer_session_create(g_target, nullptr, nullptr, nullptr, &s, nullptr) ==
             SPECINFER_OK);
  FUZZ_CHECK(specinfer_session_set_constraint(s, fork) == SPECINFER_OK);
  FUZZ_CHECK(specinfer_session_feed_text(s, kPrompt, sizeof kPrompt - 1) == SPECINFER_OK);
  const specinfer_status gen = specinfer_session_generate(s, 3, nullptr, nullptr);
  if (gen != SPECINFER_OK && gen != SPECINFER_ERR_STATE)
    std::fprintf(stderr, "generate: %s: %s\n", specinfer_status_str(gen),
                 specinfer_session_errmsg(s));
  FUZZ_CHECK(gen == SPECINFER_OK || gen == SPECINFER_ERR_STATE);
  specinfer_session_destroy(s);
  FUZZ_CHECK(specinfer_constraint_destroy(fork) == SPECINFER_OK);
  FUZZ_CHECK(specinfer_constraint_destroy(c) == SPECINFER_OK);
  return 0;
}
