// Errors inside the built-in plugins (header-only, no dependency on the library): code throws
// Failure (a specinfer_status and a message), and each vtable function runs its body through
// guarded(), which turns any exception into the status and message the plugin ABI returns.
#pragma once

#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "specinfer.h"
#include "specinfer_plugin.h"

namespace specinfer_plugin {

struct Failure : std::runtime_error {
  specinfer_status code;
  Failure(specinfer_status c, const std::string &message) : std::runtime_error(message), code(c) {}
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

// Throws Failure(code, formatted message).
template <typename... Args>
[[noreturn]] void fail(specinfer_status code, const char *fmt, Args... args) {
  throw Failure(code, format(fmt, args...));
}

// Copies a message into the ABI's error buffer (truncated to fit); err may be NULL.
inline void set_error(specinfer_plugin_error *err, const std::string &message) {
  if (err) std::snprintf(err->message, sizeof(err->message), "%s", message.c_str());
}

// Runs fn (returning void, meaning OK, or a specinfer_status) and turns what it throws into a
// status and message: a Failure keeps its code; out of memory is OUT_OF_MEMORY; any other
// exception is PLUGIN, its message prefixed with `plugin`.
template <typename Fn>
specinfer_status guarded(specinfer_plugin_error *err, const char *plugin, Fn &&fn) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
      fn();
      return SPECINFER_OK;
    } else {
      return fn();
    }
  } catch (const Failure &e) {
    set_error(err, e.what());
    return e.code;
  } catch (const std::bad_alloc &) {
    set_error(err, std::string(plugin) + ": out of memory");
    return SPECINFER_ERR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_error(err, std::string(plugin) + ": " + e.what());
    return SPECINFER_ERR_PLUGIN;
  } catch (...) {
    set_error(err, std::string(plugin) + ": unknown exception");
    return SPECINFER_ERR_INTERNAL;
  }
}

}  // namespace specinfer_plugin
