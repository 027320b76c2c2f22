// specinfer plugins: loads every plugin on the plugin path and lists them.
#include <cstdio>
#include <string>
#include <utility>

#include "cli_options.h"
#include "commands.h"
#include "specinfer.h"

int cmd_plugins(int argc, char **argv) {
  cli::App app{
      "Lists the plugins on the plugin path (SPECINFER_PLUGIN_PATH, then the library's "
      "own directories).",
      "specinfer plugins"};
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  specinfer_registry *reg = nullptr;
  char *err = nullptr;
  if (specinfer_registry_create(nullptr, &reg, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  std::string path = specinfer_registry_plugin_path(reg);
  std::printf("plugin path: %s\n", path.c_str());
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    start = end + 1;
    if (!dir.empty()) specinfer_registry_load_dir(reg, dir.c_str(), nullptr, nullptr);
  }
  for (int32_t i = 0; i < specinfer_registry_plugin_count(reg); ++i) {
    specinfer_plugin_info info;
    info.struct_size = sizeof(info);
    if (specinfer_registry_plugin_info(reg, i, &info) != SPECINFER_OK) continue;
    // What it provides: target, drafter, constraint, joined by '+'.
    std::string roles;
    for (const auto &[has, role] :
         {std::pair{info.has_target, "target"}, std::pair{info.has_drafter, "drafter"},
          std::pair{info.has_constraint, "constraint"}})
      if (has) roles.append(roles.empty() ? "" : "+").append(role);
    std::printf("%-12s %-8s %s  %s\n    %s\n", info.name, info.version, roles.c_str(), info.path,
                info.description);
  }
  specinfer_registry_destroy(reg);
  return 0;
}
