// The command-line handling the subcommands share (see cli_options.h).
#include "cli_options.h"

#include <cmath>
#include <cstdio>
#include <utility>

namespace cli {

App::App(std::string description, std::string name)
    : CLI::App(std::move(description), std::move(name)) {
  option_defaults()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->always_capture_default();
  get_formatter()->column_width(34);
}

int usage_error(const CLI::App &app, const std::string &message) {
  std::fprintf(stderr, "%s: %s\nRun `%s --help` for the options.\n", app.get_name().c_str(),
               message.c_str(), app.get_name().c_str());
  return 2;
}

int parse(CLI::App &app, int argc, char **argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp &) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion &e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError &e) {
    return usage_error(app, e.what());
  }
}

const CLI::Validator kNotNaN(
    [](std::string &value) {
      double v = 0;
      if (CLI::detail::lexical_cast(value, v) && !std::isnan(v)) return std::string();
      return "Value " + value + " is not a number";
    },
    "");

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

CLI::Option *add_seed(CLI::App &app, const std::string &name, uint64_t &value,
                      const std::string &help) {
  return app.add_option(name, value, help)->type_name("S")->check(kUnsigned);
}

const CLI::Validator kUnsigned(
    [](std::string &value) {
      if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos)
        return std::string();
      return "Value " + value + " is not an unsigned integer";
    },
    "");

void split_spec(const std::string &spec, std::string *plugin, std::string *config) {
  const size_t colon = spec.find(':');
  *plugin = spec.substr(0, colon);
  *config = colon == std::string::npos ? "" : spec.substr(colon + 1);
}

void add_run_options(CLI::App &app, RunOptions *o, int32_t min_tokens) {
  app.add_option("--target", o->target,
                 "target model, e.g. gguf:path=model.gguf or kgram:path=text.txt,k=6")
      ->type_name(kSpec)
      ->required();
  add_number(app, "-n,--max-tokens", o->max_tokens, "tokens to generate (per prompt)", "N",
             min_tokens, 1 << 24);
  add_number(app, "--max-draft", o->max_draft, "most tokens drafted per round", "K", 0, 16);
  app.add_flag("--fixed-draft", o->fixed_draft,
               "always draft --max-draft tokens (no adaptive draft length)");
  app.add_flag("--context-shift", o->context_shift,
               "when the context window is full, drop the older half of the text after --keep "
               "tokens and go on (else generation stops there)");
  add_number(app, "--keep", o->n_keep, "tokens at the start a context shift keeps", "N", 0,
             1 << 24);
  add_number(app, "--temp", o->temp, "temperature (0: greedy)", "T", 0.0, 100.0);
  add_number(app, "--top-k", o->top_k, "sample among the K most likely tokens (0: all)", "K", 0,
             1 << 24);
  add_number(app, "--top-p", o->top_p, "sample among the most likely tokens of mass P", "P", 0.0,
             1.0);
  add_number(app, "--min-p", o->min_p,
             "drop tokens below P times the most likely one's probability", "P", 0.0, 1.0);
  add_seed(app, "--seed", o->seed, "randomness for sampling and coupling");
  add_number(app, "--threads", o->threads, "backend threads (0: all cores)", "N", 0, 1024);
}

specinfer_session_params session_params(const RunOptions &o) {
  specinfer_session_params p;
  specinfer_session_params_init(&p);
  p.max_draft = o.max_draft;
  p.adaptive_draft = !o.fixed_draft;
  p.temperature = o.temp;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  p.seed = o.seed;
  p.context_shift = o.context_shift ? 1 : 0;
  p.n_keep = o.n_keep;
  return p;
}

specinfer_registry *create_registry(const RunOptions &o, const char *who, specinfer_log_fn log,
                                    void *log_user) {
  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = o.threads;
  rp.log = log;
  rp.log_user = log_user;
  specinfer_registry *reg = nullptr;
  char *err = nullptr;
  if (specinfer_registry_create(&rp, &reg, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "%s: %s\n", who, err ? err : "cannot create the registry");
    specinfer_free(err);
    return nullptr;
  }
  return reg;
}

specinfer_status open_target(specinfer_registry *reg, const std::string &spec,
                             specinfer_target **out, char **err) {
  std::string plugin, config;
  split_spec(spec, &plugin, &config);
  return specinfer_target_open(reg, plugin.c_str(), config.c_str(), out, err);
}

specinfer_status open_drafter(specinfer_registry *reg, const std::string &spec,
                              specinfer_target *target, specinfer_drafter **out, char **err) {
  std::string plugin, config;
  split_spec(spec, &plugin, &config);
  return specinfer_drafter_open(reg, plugin.c_str(), config.c_str(), target, out, err);
}

}  // namespace cli
