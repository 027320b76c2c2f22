// The backend's kernels as the plugin ABI's specinfer_kernels table (handed to plugins through the
// host table). Entries never throw: failures come back as status codes.
#pragma once

#include "specinfer_plugin.h"

namespace specinfer {

// A static table, valid for the life of the process; kernels dispatch to the active instruction
// set (isa.h) on each call.
const specinfer_kernels *backend_kernel_table();

// "avx512", "avx2" or "scalar": the instruction set the kernels currently dispatch to.
const char *backend_isa();

}  // namespace specinfer
