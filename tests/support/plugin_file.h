// Loading a built plugin file directly (dlopen), for the tests of a plugin through its own ABI.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "specinfer_plugin.h"
#include "support/cmocka_setup.h"

// The descriptor of specinfer-<name>.so from $SPECINFER_PLUGIN_PATH (else ./plugins), checked to
// be plugin `name` of this plugin ABI; *so receives the handle (dlclose it after use). nullptr
// after printing why.
inline const specinfer_plugin_descriptor *open_plugin_file(const char *name, void **so) {
  const char *dir = std::getenv("SPECINFER_PLUGIN_PATH");
  const std::string path = std::string(dir ? dir : "plugins") + "/specinfer-" + name + ".so";
  *so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!*so) {
    print_error("dlopen %s: %s\n", path.c_str(), dlerror());
    return nullptr;
  }
  auto *desc =
      static_cast<const specinfer_plugin_descriptor *>(dlsym(*so, "specinfer_plugin_entry"));
  if (!desc || desc->abi_version != SPECINFER_PLUGIN_ABI_VERSION ||
      std::strcmp(desc->name, name) != 0) {
    print_error("%s is not the %s plugin of this ABI\n", path.c_str(), name);
    dlclose(*so);
    *so = nullptr;
    return nullptr;
  }
  return desc;
}
