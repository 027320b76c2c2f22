// The status-carrying exception of specinfer's C++ code, shared by the core (lib/) and the
// built-in plugins (plugins/). Header-only and built on abi/specinfer.h alone, so that either side
// includes it without depending on the other: the core through lib/util/error.h, the plugins
// through plugins/common/plugin_error.h (where it is also named Failure).
//
// Code throws specinfer::Error, usually through fail(). No exception crosses the C boundary: the
// extern "C" shims in lib/api (for the core) and guarded() in plugin_error.h (for a plugin) turn
// it into its status code and its message.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "specinfer.h"

namespace specinfer {

// A failure with the status the C boundary returns for it; what() is the message.
class Error : public std::runtime_error {
 public:
  Error(specinfer_status code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  specinfer_status code() const noexcept { return code_; }

 private:
  specinfer_status code_;
};

// printf-style formatting for messages.
template <typename... Args>
std::string format(const char *fmt, Args... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return std::string(fmt);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.resize(static_cast<size_t>(n));
  return out;
}

// Throws Error(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(specinfer_status code, const char *fmt, Args... args) {
  throw Error(code, format(fmt, args...));
}

}  // namespace specinfer
