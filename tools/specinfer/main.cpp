// specinfer — command-line front end of the library.
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "specinfer.h"

namespace {

struct Command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
};

const Command kCommands[] = {
    {"bench", cmd_bench, "plain decoding vs drafters on a prompt set: table and PNG chart"},
    {"generate", cmd_generate, "generate text with a target, a drafter and a coupler"},
    {"plugins", cmd_plugins, "list the plugins found on the plugin path"},
    {"sketch-eval", cmd_sketch_eval,
     "inner-product sketch accuracy vs storage (VLDB 2024 experiment)"},
};

void usage(FILE *out) {
  std::fprintf(out,
               "specinfer %s — speculative decoding on the CPU\n\nusage: specinfer <command> "
               "[options]\n\ncommands:\n",
               specinfer_version_string());
  for (const Command &c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.help);
  std::fprintf(out, "\n`specinfer <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("specinfer %s\n", specinfer_version_string());
    return 0;
  }
  for (const Command &c : kCommands)
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "specinfer: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
