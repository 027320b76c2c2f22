// What the fuzz targets share: a check that aborts (so libFuzzer and the replay test both see a
// failure), and the path of a real model's file for the targets that need its vocabulary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

// Aborts with the condition's text when an invariant of the code under test does not hold.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace fuzz {

// Exit status of a target whose fixture is missing (ctest's SKIP_RETURN_CODE).
constexpr int kSkip = 77;

// The Qwen2.5-Coder 0.5B GGUF (its tokenizer.ggml.* keys are the tokenizer fixture): the file
// named by $SPECINFER_FUZZ_GGUF, else qwen2.5-coder-0.5b.gguf in $SPECINFER_MODELS or
// ~/.cache/specinfer/models. Empty when none exists.
inline std::string model_path() {
  const char *env = std::getenv("SPECINFER_FUZZ_GGUF");
  if (env && *env) return access(env, R_OK) == 0 ? env : "";
  std::string dir;
  if (const char *m = std::getenv("SPECINFER_MODELS"); m && *m) {
    dir = m;
  } else if (const char *home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/specinfer/models";
  }
  const std::string path = dir + "/qwen2.5-coder-0.5b.gguf";
  return !dir.empty() && access(path.c_str(), R_OK) == 0 ? path : "";
}

}  // namespace fuzz
