// Fuzz target: the gguf model loader's checks. A file the reader accepts is loaded as a model
// (Weights: hyperparameters, every tensor's presence, type and shape; then one sequence, Model,
// with a small context) on the library's default host. The loader must accept it or throw
// gguf::Error; a crash, a sanitizer report or another exception is a bug. The context is kept at
// 8 positions so that the KV cache stays small whatever sizes the file claims.
#include <cstdint>
#include <memory>

#include "fuzz_common.h"
#include "gguf_file.h"
#include "model.h"
#include "plugin/host.h"

using specinfer::gguf::Error;
using specinfer::gguf::File;
using specinfer::gguf::Model;
using specinfer::gguf::ModelOptions;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::unique_ptr<File> f;
  try {
    f = File::from_memory(data, size);
  } catch (const Error &) {
    return 0;
  }
  // The two layouts: the file's (pack = 0) and the kernels' packed copies.
  for (bool pack : {false, true}) {
    ModelOptions opt;
    opt.pack = pack;
    try {
      Model m(*f, specinfer::default_host(), 8, opt);
      FUZZ_CHECK(m.weights() != nullptr);
    } catch (const Error &) {
      return 0;
    }
  }
  return 0;
}
