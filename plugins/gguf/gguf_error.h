// The gguf plugin's errors are the built-in plugins' Failure (a specinfer_status and a message);
// the vtable functions in plugin_entry.cpp turn them into status + message through guarded().
#pragma once

#include "../common/plugin_error.h"

namespace specinfer::gguf {

using Error = specinfer_plugin::Failure;
using specinfer_plugin::fail;
using specinfer_plugin::format;

}  // namespace specinfer::gguf
