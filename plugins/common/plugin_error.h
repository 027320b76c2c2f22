// Errors inside the built-in plugins (header-only, no dependency on the library): code throws
// Failure (a specinfer_status and a message, see common/status_error.h), and each vtable function
// runs its body through guarded(), which turns any exception into the status and message the
// plugin ABI returns.
#pragma once

#include <cstdio>
#include <new>
#include <string>
#include <type_traits>

#include "../../common/status_error.h"
#include "specinfer.h"
#include "specinfer_plugin.h"

namespace specinfer_plugin {

// A plugin's failure is the status-carrying exception the core uses too (common/status_error.h).
using Failure = specinfer::Error;
using specinfer::fail;
using specinfer::format;

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
    return e.code();
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
