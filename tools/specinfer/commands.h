// Subcommands of the `specinfer` tool. Each is defined in its own cmd_<name>.cpp and returns the
// process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

int cmd_bench(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_plugins(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_sketch_eval(int argc, char **argv);
int cmd_train_heads(int argc, char **argv);
