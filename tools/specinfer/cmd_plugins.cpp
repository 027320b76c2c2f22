// specinfer plugins: loads every plugin on the plugin path and lists them.
#include <cstdio>
#include <string>

#include "commands.h"
#include "specinfer.h"

int cmd_plugins(int argc, char **argv) {
  if (argc > 1) {
    std::fprintf(argc == 2 && std::string(argv[1]) == "--help" ? stdout : stderr,
                 "usage: specinfer plugins\n  lists the plugins on the plugin path "
                 "(SPECINFER_PLUGIN_PATH, then the library's own directories)\n");
    return argc == 2 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
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
    std::printf("%-12s %-8s %s%s  %s\n    %s\n", info.name, info.version,
                info.has_target ? "target" : "",
                info.has_drafter ? (info.has_target ? "+drafter" : "drafter") : "", info.path,
                info.description);
  }
  specinfer_registry_destroy(reg);
  return 0;
}
