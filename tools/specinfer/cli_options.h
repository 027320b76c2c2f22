// What the subcommands share in reading their command line: CLI11 set up alike for every command
// (--help, error messages, exit code 2 on a usage error), the PLUGIN[:CONFIG] specs, and the
// options of the commands that run sessions (generate, bench), defined here once.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "specinfer.h"

namespace cli {

// The type name shown in --help for a PLUGIN[:CONFIG] spec.
inline constexpr const char *kSpec = "P[:K=V,...]";

// A command's CLI11 application, set up alike for every command: a repeated option keeps its last
// value (so that a script can pass defaults and let its caller override them), and --help shows
// the defaults.
class App : public CLI::App {
 public:
  App(std::string description, std::string name);
};

// Parses the command line (argv[0] is the command's name). Returns -1 when the command should run,
// else the exit code: 0 after --help or --version (printed to stdout), 2 after a usage error (the
// message, which names the option, printed to stderr).
int parse(CLI::App &app, int argc, char **argv);

// Prints a usage error found after parsing the way parse() prints CLI11's; returns 2.
int usage_error(const CLI::App &app, const std::string &message);

// An option holding a number (or, for a vector, numbers) in [lo, hi], shown as `type` in --help;
// NaN is refused too.
template <typename V, typename T>
CLI::Option *add_number(CLI::App &app, const std::string &name, V &value, const std::string &help,
                        const char *type, T lo, T hi);

// An unsigned 64-bit option (a seed): decimal digits only.
CLI::Option *add_seed(CLI::App &app, const std::string &name, uint64_t &value,
                      const std::string &help);

// Refuses NaN (CLI::Range lets it through); goes after a CLI::Range on a floating-point option.
extern const CLI::Validator kNotNaN;
// Accepts decimal digits only: CLI11 would take "-1" for an unsigned option and wrap it around.
extern const CLI::Validator kUnsigned;

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""}.
std::vector<std::string> split(const std::string &s, char sep);

// "gguf:path=a.gguf,n_ctx=2048" -> ("gguf", "path=a.gguf,n_ctx=2048"); "ngram" -> ("ngram", "").
void split_spec(const std::string &spec, std::string *plugin, std::string *config);

// The options of the commands that run sessions: the target, how a session drafts and samples, the
// backend's threads. Set max_tokens to the command's default before add_run_options.
struct RunOptions {
  std::string target;
  int32_t max_tokens = 128;
  int32_t max_draft = 8;
  bool fixed_draft = false;
  bool context_shift = false;
  int32_t n_keep = 0;
  float temp = 0, top_p = 1, min_p = 0;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int32_t threads = 0;
};

// Defines --target (required), -n/--max-tokens (at least min_tokens), --max-draft, --fixed-draft,
// --temp, --top-k, --top-p, --min-p, --seed and --threads on `app`, writing into *o.
void add_run_options(CLI::App &app, RunOptions *o, int32_t min_tokens);

// Session parameters as the options ask.
specinfer_session_params session_params(const RunOptions &o);

// A registry with o.threads backend threads and its messages to `log` (NULL: warnings and errors
// to stderr), or nullptr after printing why not (after `who: `).
specinfer_registry *create_registry(const RunOptions &o, const char *who,
                                    specinfer_log_fn log = nullptr, void *log_user = nullptr);

// Open a PLUGIN[:CONFIG] spec as a target or a drafter; on failure *err holds the message (free it
// with specinfer_free).
specinfer_status open_target(specinfer_registry *reg, const std::string &spec,
                             specinfer_target **out, char **err);
specinfer_status open_drafter(specinfer_registry *reg, const std::string &spec,
                              specinfer_target *target, specinfer_drafter **out, char **err);

template <typename V, typename T>
CLI::Option *add_number(CLI::App &app, const std::string &name, V &value, const std::string &help,
                        const char *type, T lo, T hi) {
  CLI::Option *option = app.add_option(name, value, help)->type_name(type);
  option->check(CLI::Range(lo, hi));
  if constexpr (std::is_floating_point_v<T>) option->check(kNotNaN);
  return option;
}

}  // namespace cli
