// specinfer generate: speculative generation from the command line.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "specinfer.h"

namespace {

void usage(FILE *out) {
  std::fprintf(
      out,
      "usage: specinfer generate --target PLUGIN[:CONFIG] [options]\n\n"
      "  --target P[:K=V,...]   target model, e.g. gguf:path=model.gguf or "
      "kgram:path=text.txt,k=6\n"
      "  --drafter P[:K=V,...]  drafter, e.g. ngram or kgram:path=text.txt,k=3 (default: none)\n"
      "  --coupler SPEC         greedy | rejection | lenient:L | gumbel | minhash | typical\n"
      "                         (default: greedy at --temp 0, else rejection)\n"
      "  --prompt TEXT          the prompt (or --prompt-file FILE)\n"
      "  -n, --max-tokens N     tokens to generate (default 128)\n"
      "  --max-draft K          most tokens drafted per round, 0..16 (default 8)\n"
      "  --fixed-draft          always draft --max-draft tokens (no adaptive draft length)\n"
      "  --temp T               temperature (default 0: greedy)\n"
      "  --top-k K, --top-p P, --min-p P   sampling filters\n"
      "  --seed S               randomness for sampling and coupling (default 0)\n"
      "  --threads N            backend threads (default: all cores)\n"
      "  --compare-plain        also decode without the drafter and print the speedup\n"
      "  --quiet                do not print the text, only the statistics\n");
}

struct Options {
  std::string target, drafter, coupler, prompt;
  int32_t max_tokens = 128, max_draft = 8, threads = 0;
  bool adaptive = true, compare = false, quiet = false;
  float temp = 0, top_p = 1, min_p = 0;
  int32_t top_k = 0;
  uint64_t seed = 0;
};

int stream_text(void *user, const int32_t *, size_t, const char *text, size_t len) {
  if (*static_cast<bool *>(user)) return 0;
  std::fwrite(text, 1, len, stdout);
  std::fflush(stdout);
  return 0;
}

// Runs one generation; returns 0 and fills stats, or prints the error and returns 1.
int run(specinfer_registry *reg, const Options &o, bool with_drafter, bool print,
        specinfer_session_stats *stats, std::string *text_out) {
  specinfer_target *target = nullptr;
  specinfer_drafter *drafter = nullptr;
  specinfer_coupler *coupler = nullptr;
  specinfer_session *session = nullptr;
  char *err = nullptr;
  int rc = 1;
  std::string plugin, config;
  cli::split_spec(o.target, &plugin, &config);
  if (specinfer_target_open(reg, plugin.c_str(), config.c_str(), &target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer: cannot open target: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  do {
    if (with_drafter && !o.drafter.empty()) {
      cli::split_spec(o.drafter, &plugin, &config);
      if (specinfer_drafter_open(reg, plugin.c_str(), config.c_str(), target, &drafter, &err)) {
        std::fprintf(stderr, "specinfer: cannot open drafter: %s\n", err);
        break;
      }
    }
    if (!o.coupler.empty() && specinfer_coupler_create(o.coupler.c_str(), &coupler, &err)) {
      std::fprintf(stderr, "specinfer: bad coupler: %s\n", err);
      break;
    }
    specinfer_session_params p;
    specinfer_session_params_init(&p);
    p.max_draft = o.max_draft;
    p.adaptive_draft = o.adaptive;
    p.temperature = o.temp;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.min_p = o.min_p;
    p.seed = o.seed;
    if (specinfer_session_create(target, drafter, coupler, &p, &session, &err)) {
      std::fprintf(stderr, "specinfer: cannot create session: %s\n", err);
      break;
    }
    if (specinfer_session_feed_text(session, o.prompt.data(), o.prompt.size())) {
      std::fprintf(stderr, "specinfer: %s\n", specinfer_session_errmsg(session));
      break;
    }
    bool quiet = !print;
    specinfer_status s = specinfer_session_generate(session, o.max_tokens, stream_text, &quiet);
    if (print) std::printf("\n");
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
      "[%s] prefill %.1f ms, draft %.1f ms, verify %.1f ms, sample %.1f ms; %.2f tokens/s\n",
      label, (long long)s.n_prompt_tokens, (long long)s.n_generated, (long long)s.n_rounds,
      (long long)s.n_target_passes, label, (long long)s.n_drafted, (long long)s.n_accepted,
      s.acceptance_rate, s.mean_accepted, label, s.t_prefill_ms, s.t_draft_ms, s.t_verify_ms,
      s.t_sample_ms, s.tokens_per_second);
}

}  // namespace

int cmd_generate(int argc, char **argv) {
  Options o;
  std::string prompt_file;
  bool have_prompt = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char *name) -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "specinfer generate: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--target") {
      o.target = value("--target");
    } else if (a == "--drafter") {
      o.drafter = value("--drafter");
      if (o.drafter == "none") o.drafter.clear();
    } else if (a == "--coupler") {
      o.coupler = value("--coupler");
    } else if (a == "--prompt") {
      o.prompt = value("--prompt");
      have_prompt = true;
    } else if (a == "--prompt-file") {
      prompt_file = value("--prompt-file");
      have_prompt = true;
    } else if (a == "-n" || a == "--max-tokens") {
      if (!cli::parse_int(value("--max-tokens"), 0, 1 << 24, &o.max_tokens)) return 2;
    } else if (a == "--max-draft") {
      if (!cli::parse_int(value("--max-draft"), 0, 16, &o.max_draft)) return 2;
    } else if (a == "--fixed-draft") {
      o.adaptive = false;
    } else if (a == "--temp") {
      if (!cli::parse_float(value("--temp"), 0, 100, &o.temp)) return 2;
    } else if (a == "--top-k") {
      if (!cli::parse_int(value("--top-k"), 0, 1 << 24, &o.top_k)) return 2;
    } else if (a == "--top-p") {
      if (!cli::parse_float(value("--top-p"), 0, 1, &o.top_p)) return 2;
    } else if (a == "--min-p") {
      if (!cli::parse_float(value("--min-p"), 0, 1, &o.min_p)) return 2;
    } else if (a == "--seed") {
      if (!cli::parse_u64(value("--seed"), &o.seed)) return 2;
    } else if (a == "--threads") {
      if (!cli::parse_int(value("--threads"), 0, 1024, &o.threads)) return 2;
    } else if (a == "--compare-plain") {
      o.compare = true;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else {
      std::fprintf(stderr, "specinfer generate: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (o.target.empty() || !have_prompt) {
    std::fprintf(stderr,
                 "specinfer generate: --target and --prompt (or --prompt-file) are required\n\n");
    usage(stderr);
    return 2;
  }
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "specinfer generate: cannot read %s: %s\n", prompt_file.c_str(),
                   std::strerror(errno));
      return 1;
    }
    o.prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = o.threads;
  specinfer_registry *reg = nullptr;
  char *err = nullptr;
  if (specinfer_registry_create(&rp, &reg, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer: %s\n", err);
    specinfer_free(err);
    return 1;
  }
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
