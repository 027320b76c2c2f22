// Small helpers shared by the subcommands: option parsing and PLUGIN:CONFIG specs.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cli {

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""}.
inline std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

// "gguf:path=a.gguf,n_ctx=2048" -> ("gguf", "path=a.gguf,n_ctx=2048"); "ngram" -> ("ngram", "").
inline void split_spec(const std::string &spec, std::string *plugin, std::string *config) {
  size_t colon = spec.find(':');
  *plugin = spec.substr(0, colon);
  *config = colon == std::string::npos ? "" : spec.substr(colon + 1);
}

inline bool parse_int(const char *s, long lo, long hi, int32_t *out) {
  errno = 0;
  char *end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    std::fprintf(stderr, "specinfer: '%s' is not an integer in [%ld, %ld]\n", s, lo, hi);
    return false;
  }
  *out = static_cast<int32_t>(v);
  return true;
}

inline bool parse_u64(const char *s, uint64_t *out) {
  errno = 0;
  char *end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-') {
    std::fprintf(stderr, "specinfer: '%s' is not an unsigned integer\n", s);
    return false;
  }
  *out = v;
  return true;
}

inline bool parse_float(const char *s, double lo, double hi, float *out) {
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    std::fprintf(stderr, "specinfer: '%s' is not a number in [%g, %g]\n", s, lo, hi);
    return false;
  }
  *out = static_cast<float>(v);
  return true;
}

}  // namespace cli
