// The host services table handed to plugins: logging, memory, the backend's kernels and threads,
// and opening another target through the registry.
#pragma once

#include "specinfer_plugin.h"

namespace specinfer {

class Registry;

// A host table bound to no registry: kernels, memory, logging to stderr at WARN and above, and the
// calling thread's TBB arena. open_target fails with SPECINFER_ERR_STATE. For white-box tests and
// tools that drive a plugin's internals directly.
const specinfer_host *default_host();

}  // namespace specinfer
