// `specinfer sketch-eval`: the inner-product sketch experiment, on synthetic vectors
// (cmd_sketch_eval.cpp) or, with --model PATH, on real query and key vectors captured from the
// attention layers of a GGUF model while it reads a text (sketch_eval_real.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

// The options both modes take alike: the methods compared, the JL distribution and the charts.
// A mode sets its defaults before add_sketch_options; `charts` says which files --png names.
struct SketchOptions {
  std::vector<std::string> methods;
  std::string jl_dist = "sign";
  std::string png_prefix;
  bool no_png = false;
};
void add_sketch_options(CLI::App &app, SketchOptions *o, const char *charts);

// The sketch size (m) that `storage` bytes of a sketch hold for `method`: threshold and priority
// sampling store an index beside each value, the others m values.
int64_t sketch_size_for(const std::string &method, int64_t storage);
// What a trial throws when the library refuses a sketcher call; the mode reports it and goes on.
struct SketchFailure {
  std::string message;
};

// True if the command line (argv[0] is "sketch-eval") asks for the --model mode.
bool sketch_eval_real_requested(int argc, char **argv);
// Runs the --model mode; returns the process exit code (0 ok, 1 failure, 2 usage error).
int sketch_eval_real(int argc, char **argv);
// The --model mode's --help text.
std::string sketch_eval_real_help();
