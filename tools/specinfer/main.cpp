// specinfer — command-line front end of the library. The command is the first argument; each
// command parses the rest itself (cmd_*.cpp).
#include <algorithm>
#include <string>

#include "cli_options.h"
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
    {"perplexity", cmd_perplexity,
     "perplexity on a text as llama-perplexity computes it; KL divergence against a saved run"},
    {"plugins", cmd_plugins, "list the plugins found on the plugin path"},
    {"serve", cmd_serve, "serve the target over HTTP with an OpenAI-compatible API"},
    {"sketch-eval", cmd_sketch_eval,
     "inner-product sketch accuracy vs storage (VLDB 2024 experiment)"},
    {"train-heads", cmd_train_heads, "train Medusa heads for a target on a text corpus"},
};

}  // namespace

int main(int argc, char **argv) {
  cli::App app{
      std::string("specinfer ") + specinfer_version_string() + " — speculative decoding on the CPU",
      "specinfer"};
  app.set_version_flag("--version", std::string("specinfer ") + specinfer_version_string(),
                       "Print the version and exit");
  app.footer("`specinfer <command> --help` describes a command's options.");
  for (const Command &c : kCommands) app.add_subcommand(c.name, c.help);
  const Command *command = nullptr;
  for (const Command &c : kCommands)
    if (argc >= 2 && argv[1] == std::string(c.name)) command = &c;
  if (!command && argc >= 2 && argv[1][0] != '-')
    return cli::usage_error(app, std::string("unknown command '") + argv[1] + "'");
  // Only the command's name is parsed here: the command reads the arguments after it.
  if (const int rc = cli::parse(app, std::min(argc, 2), argv); rc >= 0) return rc;
  if (!command) return cli::usage_error(app, "a command is required");
  return command->run(argc - 1, argv + 1);
}
