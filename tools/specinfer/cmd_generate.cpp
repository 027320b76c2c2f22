// specinfer generate: speculative generation from the command line.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_options.h"
#include "commands.h"
#include "specinfer.h"

namespace {

struct Options {
  cli::RunOptions run;
  std::string drafter, coupler, prompt;
  std::vector<std::string> stops;
  // A constraint on the text (llguidance plugin): its kind ("" = none) and grammar.
  std::string constraint_kind, constraint;
  bool compare = false, quiet = false;
};

// Where the streamed text goes: stdout, or nowhere when quiet.
struct TextStream {
  bool quiet = false;
  bool at_line_start = true;  // nothing written yet, or the text so far ends in a newline
};

int stream_text(void *user, const int32_t *, size_t, const char *text, size_t len) {
  auto *out = static_cast<TextStream *>(user);
  if (out->quiet || len == 0) return 0;
  std::fwrite(text, 1, len, stdout);
  std::fflush(stdout);
  out->at_line_start = text[len - 1] == '\n';
  return 0;
}

// A stop string as typed: \n, \t and \\ become newline, tab and backslash; any other
// backslash stays as it is.
std::string unescape(const std::string &s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (s[i] == '\\' && (next == 'n' || next == 't' || next == '\\')) {
      out += next == 'n' ? '\n' : next == 't' ? '\t' : '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Runs one generation; returns 0 and fills stats, or prints the error and returns 1.
int run(specinfer_registry *reg, const Options &o, bool with_drafter, bool print,
        specinfer_session_stats *stats, std::string *text_out) {
  specinfer_target *target = nullptr;
  specinfer_drafter *drafter = nullptr;
  specinfer_coupler *coupler = nullptr;
  specinfer_session *session = nullptr;
  specinfer_constraint *constraint = nullptr;
  char *err = nullptr;
  int rc = 1;
  if (cli::open_target(reg, o.run.target, &target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer: cannot open target: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  do {
    if (with_drafter && !o.drafter.empty()) {
      if (cli::open_drafter(reg, o.drafter, target, &drafter, &err)) {
        std::fprintf(stderr, "specinfer: cannot open drafter: %s\n", err);
        break;
      }
    }
    if (!o.coupler.empty() && specinfer_coupler_create(o.coupler.c_str(), &coupler, &err)) {
      std::fprintf(stderr, "specinfer: bad coupler: %s\n", err);
      break;
    }
    const specinfer_session_params p = cli::session_params(o.run);
    if (specinfer_session_create(target, drafter, coupler, &p, &session, &err)) {
      std::fprintf(stderr, "specinfer: cannot create session: %s\n", err);
      break;
    }
    if (!o.constraint_kind.empty()) {
      if (specinfer_constraint_open(reg, "llguidance", nullptr, target, o.constraint_kind.c_str(),
                                    o.constraint.c_str(), &constraint, &err)) {
        std::fprintf(stderr, "specinfer: bad constraint: %s\n", err);
        break;
      }
      if (specinfer_session_set_constraint(session, constraint)) {
        std::fprintf(stderr, "specinfer: %s\n", specinfer_session_errmsg(session));
        break;
      }
    }
    std::vector<const char *> stops;
    for (const std::string &x : o.stops) stops.push_back(x.c_str());
    if (specinfer_session_set_stop_strings(session, stops.data(), stops.size()) ||
        specinfer_session_feed_text(session, o.prompt.data(), o.prompt.size())) {
      std::fprintf(stderr, "specinfer: %s\n", specinfer_session_errmsg(session));
      break;
    }
    TextStream out;
    out.quiet = !print;
    specinfer_status s = specinfer_session_generate(session, o.run.max_tokens, stream_text, &out);
    // The statistics (on stderr) start on a line of their own, also when both streams go to one
    // file: end the text's last line and flush it before anything is written to stderr.
    if (!out.at_line_start) std::fputc('\n', stdout);
    std::fflush(stdout);
    if (s != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer: generation failed: %s\n", specinfer_session_errmsg(session));
      break;
    }
    specinfer_session_stats_init(stats);
    specinfer_session_get_stats(session, stats);
    if (text_out) {
      const int32_t *toks = nullptr;
      size_t n = 0;
      specinfer_session_tokens(session, &toks, &n);
      text_out->assign(reinterpret_cast<const char *>(toks), n * sizeof(int32_t));
    }
    rc = 0;
  } while (false);
  specinfer_free(err);
  specinfer_session_destroy(session);
  specinfer_constraint_destroy(constraint);
  specinfer_coupler_destroy(coupler);
  specinfer_drafter_destroy(drafter);
  specinfer_target_destroy(target);
  return rc;
}

void print_stats(const char *label, const specinfer_session_stats &s) {
  std::fprintf(
      stderr,
      "[%s] prompt %lld tokens, generated %lld tokens in %lld rounds (%lld target passes)\n"
      "[%s] drafted %lld, accepted %lld, acceptance rate %.3f, mean tokens per round %.2f\n"
      "[%s] per round: %.2f nodes verified, accepted path length %.2f\n"
      "[%s] prefill %.1f ms, draft %.1f ms, verify %.1f ms, sample %.1f ms; %.2f tokens/s\n",
      label, (long long)s.n_prompt_tokens, (long long)s.n_generated, (long long)s.n_rounds,
      (long long)s.n_target_passes, label, (long long)s.n_drafted, (long long)s.n_accepted,
      s.acceptance_rate, s.mean_accepted, label,
      s.n_rounds ? double(s.n_drafted) / double(s.n_rounds) : 0.0,
      s.n_rounds ? double(s.n_accepted) / double(s.n_rounds) : 0.0, label, s.t_prefill_ms,
      s.t_draft_ms, s.t_verify_ms, s.t_sample_ms, s.tokens_per_second);
  if (s.n_estimated_rounds > 0)
    std::fprintf(stderr,
                 "[%s] in the %lld rounds the drafter estimated: it expected %.2f accepted "
                 "tokens per round, the target kept %.2f\n",
                 label, (long long)s.n_estimated_rounds,
                 s.expected_accepted / double(s.n_estimated_rounds),
                 s.estimated_rounds_accepted / double(s.n_estimated_rounds));
  if (s.n_forced_drafted > 0 || s.t_constraint_ms > 0)
    std::fprintf(stderr,
                 "[%s] constraint: %lld forced tokens drafted, %lld accepted; %.2f ms per "
                 "generated token\n",
                 label, (long long)s.n_forced_drafted, (long long)s.n_forced_accepted,
                 s.n_generated ? s.t_constraint_ms / double(s.n_generated) : 0.0);
  if (s.n_context_shifts > 0)
    std::fprintf(stderr, "[%s] context shifts %lld (their scoring counts as prefill)\n", label,
                 (long long)s.n_context_shifts);
}

}  // namespace

int cmd_generate(int argc, char **argv) {
  cli::App app{
      "Generates text with a target, a drafter and a coupler; prints the text, then the "
      "statistics of the run.",
      "specinfer generate"};
  Options o;
  std::string prompt_file;
  cli::add_run_options(app, &o.run, 0);
  app.add_option("--drafter", o.drafter, "drafter, e.g. ngram or kgram:path=text.txt,k=3")
      ->type_name(cli::kSpec)
      ->default_str("none");
  app.add_option("--coupler", o.coupler,
                 "greedy | rejection | lenient:L | gumbel | minhash | typical (default: greedy "
                 "at --temp 0, else rejection)")
      ->type_name("SPEC");
  app.add_option("--prompt", o.prompt, "the prompt");
  app.add_option("--prompt-file", prompt_file, "read the prompt from FILE (instead of --prompt)")
      ->type_name("FILE");
  app.add_option("--stop", o.stops,
                 "end the text right before this string (repeatable; \\n, \\t and \\\\ are "
                 "read as newline, tab and backslash); the string itself is not printed")
      ->type_name("TEXT");
  std::string schema_file, grammar_file, regex;
  auto *schema_opt =
      app.add_option("--json-schema", schema_file,
                     "constrain the text to JSON that satisfies the JSON Schema in FILE")
          ->type_name("FILE");
  auto *regex_opt =
      app.add_option("--regex", regex, "constrain the whole text to match this regular expression")
          ->type_name("RE")
          ->excludes(schema_opt);
  app.add_option("--grammar", grammar_file,
                 "constrain the text to the context-free grammar (Lark syntax) in FILE")
      ->type_name("FILE")
      ->excludes(schema_opt)
      ->excludes(regex_opt);
  app.add_flag("--compare-plain", o.compare,
               "also decode without the drafter and print the speedup");
  app.add_flag("--quiet", o.quiet, "do not print the text, only the statistics");
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  if (!app.count("--prompt") && prompt_file.empty())
    return cli::usage_error(app, "--prompt or --prompt-file is required");
  if (o.drafter == "none") o.drafter.clear();
  for (std::string &x : o.stops) x = unescape(x);
  const auto read_file = [](const std::string &path, std::string *out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "specinfer generate: cannot read %s: %s\n", path.c_str(),
                   std::strerror(errno));
      return false;
    }
    out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return true;
  };
  if (!prompt_file.empty() && !read_file(prompt_file, &o.prompt)) return 1;
  if (!schema_file.empty()) {
    o.constraint_kind = "json_schema";
    if (!read_file(schema_file, &o.constraint)) return 1;
  } else if (!grammar_file.empty()) {
    o.constraint_kind = "lark";
    if (!read_file(grammar_file, &o.constraint)) return 1;
  } else if (app.count("--regex")) {
    o.constraint_kind = "regex";
    o.constraint = regex;
  }

  specinfer_registry *reg = cli::create_registry(o.run, "specinfer");
  if (!reg) return 1;
  specinfer_session_stats spec{}, plain{};
  std::string spec_tokens, plain_tokens;
  int rc = run(reg, o, true, !o.quiet, &spec, &spec_tokens);
  if (rc == 0) print_stats(o.drafter.empty() ? "plain" : "speculative", spec);
  if (rc == 0 && o.compare && !o.drafter.empty()) {
    rc = run(reg, o, false, false, &plain, &plain_tokens);
    if (rc == 0) {
      print_stats("plain", plain);
      double speedup =
          plain.tokens_per_second > 0 ? spec.tokens_per_second / plain.tokens_per_second : 0;
      std::fprintf(stderr, "speedup over plain decoding: %.2fx (%s output)\n", speedup,
                   spec_tokens == plain_tokens ? "identical" : "DIFFERENT");
    }
  }
  specinfer_registry_destroy(reg);
  return rc;
}
