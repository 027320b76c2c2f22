#include "tokenizer_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include "gguf_error.h"

namespace specinfer::gguf {

namespace {

// The expressions, written after the models' tokenizer.json files. PCRE2 takes them as they are
// (the case-insensitive contractions, the negative lookahead in \s+(?!\S)).

// GPT-2: contractions, letters, digits, other symbols, each optionally after one space; then
// whitespace that is not followed by a non-space (so the last space stays with the next word).
constexpr const char *kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (and the tiktoken cl100k family): contractions in either case (spelt out rather than
// (?i:...), which in Unicode mode would also take U+017F for 's'), a letter run with at
// most one leading non-letter/non-digit, digits in groups of up to three, symbol runs that swallow
// following newlines, newline runs with their leading blanks, then whitespace.
constexpr const char *kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but every digit is a word of its own.
constexpr const char *kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Family {
  std::initializer_list<const char *> names;
  std::initializer_list<const char *> patterns;
};

const std::array<Family, 5> &families() {
  static const std::array<Family, 5> table = {{
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe",
        "chatglm-bpe", "glm4"},
       {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan", "kormo"}, {kQwen2}},
      {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", "jina-v1-en",
        "jina-v2-code", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "exaone4", "trillion",
        "mellum"},
       {kGpt2}},
      // Code models that cut every digit first, then apply GPT-2.
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
  }};
  return table;
}

// What llama.cpp uses for a missing or unknown name.
const std::initializer_list<const char *> kDefault = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)",
                                                      "[0-9][0-9][0-9]"};

// Per-thread matching state: a JIT stack bigger than the default 32 KiB (long runs of one class
// can need more), a match context that points at it, and room for one match.
struct MatchState {
  pcre2_jit_stack *stack = nullptr;
  pcre2_match_context *context = nullptr;
  pcre2_match_data *data = nullptr;
  MatchState() {
    stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    data = pcre2_match_data_create(1, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  MatchState(const MatchState &) = delete;
  MatchState &operator=(const MatchState &) = delete;
};

MatchState &match_state() {
  thread_local MatchState state;
  if (!state.context || !state.data)
    fail(SPECINFER_ERR_OUT_OF_MEMORY, "pre-tokenizer: out of memory");
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "unknown PCRE2 error";
  return std::string(reinterpret_cast<const char *>(buf));
}

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code *code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::vector<std::string> patterns) : patterns_(std::move(patterns)) {
  try {
    compiled_.reserve(patterns_.size());  // so that push_back cannot fail and drop c
    for (const std::string &p : patterns_) {
      auto *c = new Compiled;
      compiled_.push_back(c);
      int err = 0;
      PCRE2_SIZE err_offset = 0;
      c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
      if (!c->code) {
        fail(SPECINFER_ERR_INTERNAL, "pre-tokenizer: expression %s does not compile at %zu: %s",
             p.c_str(), static_cast<size_t>(err_offset), pcre2_message(err).c_str());
      }
      // Without JIT support PCRE2 falls back to its interpreter; results are the same.
      (void)pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);
    }
  } catch (...) {
    for (Compiled *c : compiled_) delete c;
    throw;
  }
}

PreTokenizer::~PreTokenizer() {
  for (Compiled *c : compiled_) delete c;
}

std::vector<std::string> PreTokenizer::patterns_for(std::string_view pre_name, bool *known) {
  for (const Family &f : families()) {
    for (const char *name : f.names) {
      if (pre_name == name) {
        if (known) *known = true;
        return std::vector<std::string>(f.patterns.begin(), f.patterns.end());
      }
    }
  }
  if (known) *known = (pre_name == "default");
  return std::vector<std::string>(kDefault.begin(), kDefault.end());
}

std::vector<std::pair<size_t, size_t>> PreTokenizer::split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (text.empty()) return pieces;
  pieces.emplace_back(0, text.size());
  MatchState &ms = match_state();
  std::vector<std::pair<size_t, size_t>> next;
  for (const Compiled *c : compiled_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const auto &[begin, end] : pieces) {
      // Each expression sees only its piece: lookaheads stop at the piece's end.
      const auto *subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
      const size_t len = end - begin;
      size_t pos = 0;   // where the next search starts
      size_t last = 0;  // end of the previous piece pushed
      while (pos < len) {
        const int rc =
            pcre2_match(c->code, subject, len, pos, PCRE2_NO_UTF_CHECK, ms.data, ms.context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0)
          fail(SPECINFER_ERR_INTERNAL, "pre-tokenizer: match failed: %s",
               pcre2_message(rc).c_str());
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ms.data);
        const size_t ms_begin = ov[0], ms_end = ov[1];
        if (ms_end == ms_begin) {
          // An empty match cuts nothing; step over one character.
          pos = ms_begin + 1;
          while (pos < len && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (ms_begin > last) next.emplace_back(begin + last, begin + ms_begin);
        next.emplace_back(begin + ms_begin, begin + ms_end);
        last = pos = ms_end;
      }
      if (last < len) next.emplace_back(begin + last, end);
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace specinfer::gguf
