// Fuzz target: the GGUF reader. Any bytes go through File::from_memory (header, metadata, tensor
// table); a file it accepts has every key read through every getter, every tensor's range checked
// against the file, and its tokenizer built and run when it has one. The only failure allowed is
// gguf::Error; anything else (a crash, a sanitizer report, another exception, a tensor outside
// the file) is a bug.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "gguf_file.h"
#include "tokenizer.h"

using specinfer::gguf::Error;
using specinfer::gguf::File;
using specinfer::gguf::Tokenizer;
using specinfer::gguf::ValueType;

namespace {

template <typename Fn>
void allow_error(Fn &&fn) {
  try {
    fn();
  } catch (const Error &) {
  }
}

void read_metadata(const File &f) {
  const std::vector<std::string> keys = f.keys();
  for (const std::string &key : keys) {
    FUZZ_CHECK(f.has(key));
    const auto type = f.type_of(key);
    FUZZ_CHECK(type.has_value());
    allow_error([&] { (void)f.get_int(key); });
    allow_error([&] { (void)f.get_float(key); });
    allow_error([&] { (void)f.get_bool(key); });
    allow_error([&] {
      const auto s = f.get_string(key);
      FUZZ_CHECK(s.has_value() == (*type == ValueType::STRING));
    });
    const auto n = f.array_size(key);
    FUZZ_CHECK(n.has_value() == (*type == ValueType::ARRAY));
    FUZZ_CHECK(f.array_type(key).has_value() == n.has_value());
    allow_error([&] { FUZZ_CHECK(f.get_string_array(key).size() == n.value_or(0)); });
    allow_error([&] { FUZZ_CHECK(f.get_float_array(key).size() == n.value_or(0)); });
    allow_error([&] { FUZZ_CHECK(f.get_int_array(key).size() == n.value_or(0)); });
  }
  // A key the file does not have (the fuzzer learns string constants, so check first).
  const std::string absent = "specinfer.fuzz.absent";
  if (std::find(keys.begin(), keys.end(), absent) == keys.end()) {
    FUZZ_CHECK(!f.has(absent));
    FUZZ_CHECK(!f.get_int(absent).has_value());
    FUZZ_CHECK(f.get_string_array(absent).empty());
  }
}

void read_tensors(const File &f, const uint8_t *base) {
  FUZZ_CHECK(f.data_offset() <= f.file_size());
  for (const auto &t : f.tensors()) {
    FUZZ_CHECK(f.find_tensor(t.name) != nullptr);
    FUZZ_CHECK(t.n_dims >= 1 && t.n_dims <= 4);
    int64_t n = 1;
    for (int d = 0; d < 4; d++) {
      FUZZ_CHECK(t.ne[d] >= 1);
      FUZZ_CHECK(!__builtin_mul_overflow(n, t.ne[d], &n));
    }
    const auto block = specinfer::gguf::type_block(t.type);
    FUZZ_CHECK(block.block_values > 0 && block.block_bytes > 0);
    FUZZ_CHECK(n % block.block_values == 0);
    FUZZ_CHECK(uint64_t(n / block.block_values) * uint64_t(block.block_bytes) == t.n_bytes);
    FUZZ_CHECK(std::strcmp(specinfer::gguf::type_name(t.type), "unknown") != 0);
    // The data lies inside the file, after the header.
    FUZZ_CHECK(t.offset <= f.file_size() && t.n_bytes <= f.file_size() - f.data_offset() &&
               f.data_offset() + t.offset <= f.file_size() - t.n_bytes);
    const auto *p = static_cast<const uint8_t *>(t.data);
    FUZZ_CHECK(p == base + f.data_offset() + t.offset);
    // Touch the first and last byte, so ASan sees a read outside the copy.
    if (t.n_bytes > 0) {
      volatile uint8_t first = p[0], last = p[t.n_bytes - 1];
      (void)first;
      (void)last;
    }
  }
}

void run_tokenizer(const File &f) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::from_gguf(f);
  } catch (const Error &) {
    return;
  }
  const int32_t n = tok->vocab_size();
  FUZZ_CHECK(n > 0);
  for (int32_t id = 0; id < n && id < 4096; id++) {
    (void)tok->token_bytes(id, true);
    (void)tok->token_bytes(id, false);
    (void)tok->token_type(id);
    (void)tok->is_eog(id);
  }
  for (const char *text : {"Hello, world! 123", "  def f(x):\n\treturn x\n",
                           "\xe4\xbd\xa0\xe5\xa5\xbd", "<|im_end|><s></s>", "\xff\xfe"}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok->encode(text, special, special);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < n);
      (void)tok->decode(ids);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::unique_ptr<File> f;
  try {
    f = File::from_memory(data, size);
  } catch (const Error &) {
    return 0;
  }
  FUZZ_CHECK(f->file_size() == size);
  // from_memory reads a copy; find its base through a tensor or not at all.
  const uint8_t *base = nullptr;
  if (!f->tensors().empty()) {
    const auto &t = f->tensors().front();
    base = static_cast<const uint8_t *>(t.data) - f->data_offset() - t.offset;
  }
  read_metadata(*f);
  if (base) read_tensors(*f, base);
  run_tokenizer(*f);
  return 0;
}
