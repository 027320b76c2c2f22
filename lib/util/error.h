// Internal error type. Core code throws specinfer::Error; the extern "C" shims in lib/api catch it
// (and std::bad_alloc, and anything else) and turn it into a status code plus message.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "specinfer.h"

namespace specinfer {

class Error : public std::runtime_error {
 public:
  Error(specinfer_status code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  specinfer_status code() const noexcept { return code_; }

 private:
  specinfer_status code_;
};

// printf-style message formatting for errors.
template <typename... Args>
std::string format(const char *fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return std::string(fmt);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.resize(static_cast<size_t>(n));
  return out;
}

template <typename... Args>
[[noreturn]] void fail(specinfer_status code, const char *fmt, Args... args) {
  throw Error(code, format(fmt, args...));
}

}  // namespace specinfer
