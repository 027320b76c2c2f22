// Builds the specinfer_host table that plugins receive.
#pragma once

#include "specinfer_plugin.h"

namespace specinfer {

class Registry;

// Fills `host` for `registry` (nullptr: a host bound to no registry, see default_host()).
void fill_host_table(specinfer_host &host, Registry *registry);

}  // namespace specinfer
