// Fuzz target: the `specinfer` command's prompt-file reader (tools/specinfer/prompts.cpp: JSON
// lines with a "prompt" string each). The input is written to an in-memory file (memfd) that
// read_prompts opens by its /proc path. The only failure allowed is std::runtime_error naming
// the file; a limit returns a prefix of the whole list; there are never more prompts than lines.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "prompts.h"

namespace {

int g_fd = -1;
std::string g_path;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  g_fd = memfd_create("fuzz_prompts", 0);
  FUZZ_CHECK(g_fd >= 0);
  g_path = "/proc/self/fd/" + std::to_string(g_fd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FUZZ_CHECK(ftruncate(g_fd, 0) == 0);
  FUZZ_CHECK(pwrite(g_fd, data, size, 0) == ssize_t(size));
  std::vector<std::string> all;
  try {
    all = read_prompts(g_path);
  } catch (const std::runtime_error &e) {
    FUZZ_CHECK(std::string(e.what()).rfind(g_path, 0) == 0 ||
               std::string(e.what()).rfind("cannot read " + g_path, 0) == 0);
    return 0;
  }
  const size_t lines = std::count(data, data + size, uint8_t('\n')) + 1;
  FUZZ_CHECK(all.size() <= lines);
  if (!all.empty()) {
    const std::vector<std::string> first = read_prompts(g_path, 1);
    FUZZ_CHECK(first.size() == 1 && first[0] == all[0]);
  }
  return 0;
}
