// Fuzz target: the built-in plugins' `key=value,...` config parser (plugins/common/
// plugin_config.h; the part after `PLUGIN:` in a target or drafter spec). The input, up to its
// first NUL as a C string would end, is parsed with the gguf plugin's keys. The only failure
// allowed is ConfigError; an accepted config written back as key=value entries parses to the same
// values; get_int and get_float return defaults for absent keys and values inside their range.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "common/plugin_config.h"
#include "fuzz_common.h"

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;

namespace {

constexpr std::initializer_list<const char *> kKeys = {"path", "n_ctx", "pack", "vocab_limit",
                                                       "requant"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  std::unique_ptr<Config> c;
  try {
    c = std::make_unique<Config>(text.c_str(), kKeys);
  } catch (const ConfigError &) {
    return 0;
  }
  std::string again;
  for (const char *k : kKeys) {
    if (!c->has(k)) {
      FUZZ_CHECK(c->get(k, "default") == "default");
      FUZZ_CHECK(c->get_int(k, -7, -10, 10) == -7);
      FUZZ_CHECK(c->get_float(k, 0.5, 0, 1) == 0.5);
      continue;
    }
    const std::string v = c->get(k, "");
    FUZZ_CHECK(v.find(',') == std::string::npos);
    again += std::string(again.empty() ? "" : ",") + k + "=" + v;
    try {
      const long i = c->get_int(k, 0, -1000, 1000);
      FUZZ_CHECK(i >= -1000 && i <= 1000);
    } catch (const ConfigError &) {
    }
    try {
      const double d = c->get_float(k, 0, -1e6, 1e6);
      FUZZ_CHECK(std::isfinite(d) && d >= -1e6 && d <= 1e6);
    } catch (const ConfigError &) {
    }
  }
  const Config round(again.c_str(), kKeys);
  for (const char *k : kKeys) {
    FUZZ_CHECK(round.has(k) == c->has(k));
    FUZZ_CHECK(round.get(k, "") == c->get(k, ""));
  }
  return 0;
}
