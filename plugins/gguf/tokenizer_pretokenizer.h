// The pre-tokenizer of byte-level BPE models: regular expressions that cut text into words before
// the merges run (merges never cross a word boundary).
//
// A GGUF file names its pre-tokenizer in tokenizer.ggml.pre ("qwen2", "llama-bpe", "gpt2", ...);
// the expressions themselves are not in the file, so they are listed here per name. They are
// compiled with PCRE2 in UTF + UCP mode (so \s, \p{L}, \p{N} follow Unicode) and JIT-compiled
// once. Several expressions apply in sequence: each cuts every piece the previous one produced,
// and text between two matches stays a piece of its own.
//
// Threads: a PreTokenizer is immutable after construction; split() may run on several threads.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specinfer::gguf {

class PreTokenizer {
 public:
  // Compiles the expressions. Throws gguf::Error(SPECINFER_ERR_INTERNAL) if one does not compile.
  explicit PreTokenizer(std::vector<std::string> patterns);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer &) = delete;
  PreTokenizer &operator=(const PreTokenizer &) = delete;

  // The expressions for a tokenizer.ggml.pre name. Unknown or empty names get the "default" set
  // (as llama.cpp does); *known is set to whether the name was recognised.
  static std::vector<std::string> patterns_for(std::string_view pre_name, bool *known = nullptr);

  // Cuts `text` (which must be valid UTF-8) into pieces covering it in order, as byte ranges
  // [first, second). Throws gguf::Error(SPECINFER_ERR_INTERNAL) if the matcher fails.
  std::vector<std::pair<size_t, size_t>> split(std::string_view text) const;

  const std::vector<std::string> &patterns() const { return patterns_; }

 private:
  struct Compiled;
  std::vector<std::string> patterns_;
  std::vector<Compiled *> compiled_;
};

}  // namespace specinfer::gguf
