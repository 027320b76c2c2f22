// Fuzz target: the byte-level BPE tokenizer on a real vocabulary (Qwen2.5's: the tokenizer.ggml.*
// keys of the Qwen2.5-Coder 0.5B GGUF, see fuzz::model_path). Any bytes -> ids -> bytes:
//  - every id is inside the vocabulary, and decoding never throws;
//  - valid UTF-8 comes back byte for byte, with special tokens parsed or spelt out;
//  - invalid UTF-8 comes back as unicode::sanitize_utf8 makes it (each undecodable byte U+FFFD);
//  - add_special only adds the bos / eos the model asks for around the same ids.
// Without the model file the target exits 77 (skipped) before the first input.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "gguf_file.h"
#include "tokenizer.h"
#include "unicode.h"

using specinfer::gguf::File;
using specinfer::gguf::Tokenizer;
namespace unicode = specinfer::gguf::unicode;

namespace {

std::unique_ptr<Tokenizer> g_tok;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  const std::string path = fuzz::model_path();
  if (path.empty()) {
    std::fprintf(stderr,
                 "fuzz_tokenizer: no qwen2.5-coder-0.5b.gguf in $SPECINFER_MODELS or "
                 "~/.cache/specinfer/models (scripts/fetch-models), nor $SPECINFER_FUZZ_GGUF: "
                 "skipped\n");
    std::exit(fuzz::kSkip);
  }
  const std::unique_ptr<File> f = File::open(path);
  g_tok = Tokenizer::from_gguf(*f);
  FUZZ_CHECK(g_tok->is_byte_level());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  const Tokenizer &tok = *g_tok;
  bool changed = false;
  const std::string clean = unicode::sanitize_utf8(text, &changed);
  for (bool parse_special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, false, parse_special);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    const std::string back = tok.decode(ids);
    if (!changed) FUZZ_CHECK(back == text);
    FUZZ_CHECK(back == clean);
    if (!text.empty()) FUZZ_CHECK(!ids.empty());

    const std::vector<int32_t> with = tok.encode(text, true, parse_special);
    const size_t front = tok.add_bos() && tok.bos() >= 0 ? 1 : 0;
    const size_t back_n = tok.add_eos() && tok.eos() >= 0 ? 1 : 0;
    FUZZ_CHECK(with.size() == ids.size() + front + back_n);
    FUZZ_CHECK(std::equal(ids.begin(), ids.end(), with.begin() + front));
  }
  return 0;
}
