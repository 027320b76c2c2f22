// The error type of the gguf plugin. Its code is a specinfer_status; the vtable functions in
// plugin_entry.cpp catch it and hand code + message back through the plugin ABI.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "specinfer.h"

namespace specinfer::gguf {

struct Error : std::runtime_error {
  specinfer_status code;
  Error(specinfer_status c, const std::string &message) : std::runtime_error(message), code(c) {}
};

// printf-style formatting for error messages.
template <typename... Args>
std::string strfmt(const char *fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return std::string(fmt);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.resize(static_cast<size_t>(n));
  return out;
}

// Throws gguf::Error(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(specinfer_status code, const char *fmt, Args... args) {
  throw Error(code, strfmt(fmt, args...));
}

}  // namespace specinfer::gguf
