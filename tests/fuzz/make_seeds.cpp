// Writes the GGUF seed corpus of the gguf and gguf_model fuzz targets (tests/fuzz/corpus/gguf and
// corpus/gguf_model): tiny models of each architecture the loader knows, in F32, F16 and Q8_0, a
// file with every metadata type, a SentencePiece-style vocabulary, and (given a real model) the
// first 4 KiB of a real file's header. Built on demand only (target make_fuzz_seeds):
//   build-fuzzcheck/make_fuzz_seeds tests/fuzz/corpus [~/.cache/specinfer/models/x.gguf]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/gguf/gguf_writer.h"
#include "data/gguf/tiny_model.h"

using namespace gguf_test;

namespace {

bool write(const std::string &dir, const std::string &name, const std::vector<uint8_t> &bytes) {
  if (!write_file(dir + "/" + name, bytes)) {
    std::fprintf(stderr, "make_fuzz_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    return false;
  }
  std::printf("%s/%s: %zu bytes\n", dir.c_str(), name.c_str(), bytes.size());
  return true;
}

TinyConfig tiny(const std::string &arch, uint32_t wtype) {
  TinyConfig c;
  c.arch = arch;
  c.n_vocab = 40;
  c.n_embd = 32;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.n_ff = 32;
  c.n_ctx = 64;
  c.wtype = wtype;
  return c;
}

// Every metadata value type once, scalars and arrays, and no tensors.
std::vector<uint8_t> all_types() {
  Writer w;
  w.version = 2;
  w.kv_u8("t.u8", 200);
  w.kv_i8("t.i8", -5);
  w.kv_u16("t.u16", 60000);
  w.kv_i16("t.i16", -300);
  w.kv_u32("t.u32", 4000000000u);
  w.kv_i32("t.i32", -70000);
  w.kv_u64("t.u64", 1ull << 63);
  w.kv_i64("t.i64", -(1ll << 40));
  w.kv_f32("t.f32", 0.5f);
  w.kv_f64("t.f64", -2.25);
  w.kv_bool("t.bool", true);
  w.kv_str("t.str", "text");
  w.kv_u32("general.alignment", 64);
  w.kv_str_array("t.strs", {"a", "", "c"});
  w.kv_array<float>("t.f32s", T_F32, {1.0f, 2.0f});
  w.kv_array<int64_t>("t.i64s", T_I64, {-1, 2, 3});
  w.kv_array<uint8_t>("t.bools", T_BOOL, {0, 1});
  w.alignment = 64;
  return w.build();
}

// A SentencePiece-style ("llama") vocabulary: control tokens, byte tokens, pieces with scores.
std::vector<uint8_t> spm_vocab() {
  Writer w;
  std::vector<std::string> toks = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; b += 17) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    toks.push_back(buf);
    types.push_back(6);
  }
  for (const char *p : {"\xe2\x96\x81", "a", "b", "ab",
                        "\xe2\x96\x81"
                        "ab",
                        "<user>"}) {
    toks.push_back(p);
    types.push_back(toks.back() == "<user>" ? 4 : 1);
  }
  std::vector<float> scores;
  for (size_t i = 0; i < toks.size(); i++) scores.push_back(-float(i));
  w.kv_str("general.architecture", "llama");
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_str_array("tokenizer.ggml.tokens", toks);
  w.kv_array<float>("tokenizer.ggml.scores", T_F32, scores);
  w.kv_array<int32_t>("tokenizer.ggml.token_type", T_I32, types);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_bos_token", true);
  w.kv_bool("tokenizer.ggml.add_space_prefix", true);
  return w.build();
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds CORPUS_DIR [REAL_MODEL.gguf]\n");
    return 2;
  }
  const std::string root = argv[1];
  bool ok = true;
  for (const char *target : {"gguf", "gguf_model"}) {
    const std::string dir = root + "/" + target;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ok &= write(dir, "tiny-qwen2-q8_0.gguf", make_tiny_model(tiny("qwen2", 8), nullptr));
    ok &= write(dir, "tiny-qwen2-f32.gguf", make_tiny_model(tiny("qwen2", 0), nullptr));
    TinyConfig llama = tiny("llama", 1);
    llama.tied = true;
    ok &= write(dir, "tiny-llama-f16-tied.gguf", make_tiny_model(llama, nullptr));
    ok &= write(dir, "tiny-qwen3-q8_0.gguf", make_tiny_model(tiny("qwen3", 8), nullptr));
    TinyConfig gemma = tiny("gemma3", 8);
    gemma.swa = 16;
    ok &= write(dir, "tiny-gemma3-q8_0.gguf", make_tiny_model(gemma, nullptr));
    ok &= write(dir, "all-value-types.gguf", all_types());
    ok &= write(dir, "spm-vocab.gguf", spm_vocab());
    if (argc > 2) {
      std::ifstream in(argv[2], std::ios::binary);
      std::vector<uint8_t> head(4096);
      in.read(reinterpret_cast<char *>(head.data()), std::streamsize(head.size()));
      head.resize(size_t(in.gcount()));
      ok &= !head.empty() && write(dir, "real-header-4k.gguf", head);
    }
  }
  return ok ? 0 : 1;
}
