// specinfer bench: plain decoding against each configured drafter (and coupler) on a prompt set.
// Prompt-major order: for each prompt every configuration runs back to back, so slow drifts of the
// machine's load hit all configurations alike. Prints a table (tokens/s, speedup, acceptance, mean
// tokens per round, outputs identical to plain) and writes a PNG chart of tokens/s per prompt.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "png_chart.h"
#include "specinfer.h"

namespace {

void usage(FILE *out) {
  std::fprintf(
      out,
      "usage: specinfer bench --target PLUGIN[:CONFIG] --prompts FILE.jsonl [options]\n\n"
      "  --target P[:K=V,...]   target model, e.g. gguf:path=model.gguf\n"
      "  --prompts FILE         JSON lines with a \"prompt\" string each (bench/prompts/*.jsonl)\n"
      "  --drafter P[:K=V,...]  a drafter to compare with plain decoding (repeatable)\n"
      "  --coupler SPEC         coupler (repeatable; default: greedy at --temp 0, else rejection)\n"
      "  --limit N              first N prompts only (default: all)\n"
      "  -n, --max-tokens N     tokens generated per prompt (default 64)\n"
      "  --max-draft K          most tokens drafted per round (default 8)\n"
      "  --fixed-draft          no adaptive draft length\n"
      "  --temp T, --seed S     sampling (default greedy, seed 0)\n"
      "  --threads N            backend threads (default: all cores)\n"
      "  --chart FILE.png       write a chart of tokens/s per prompt (default: none)\n"
      "  --verbose              one line per prompt and configuration\n");
}

// Reads the "prompt" string of one JSON object line (enough JSON for the prompt files).
bool json_prompt(const std::string &line, std::string *out) {
  size_t key = line.find("\"prompt\"");
  if (key == std::string::npos) return false;
  size_t i = line.find(':', key + 8);
  if (i == std::string::npos) return false;
  i = line.find('"', i);
  if (i == std::string::npos) return false;
  out->clear();
  auto put_utf8 = [&](uint32_t c) {
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (c >> 6)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (c >> 12)));
      out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (c >> 18)));
      out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  };
  auto hex4 = [&](size_t at, uint32_t *v) {
    if (at + 4 > line.size()) return false;
    *v = 0;
    for (size_t j = at; j < at + 4; ++j) {
      char c = line[j];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return false;
      *v = *v * 16 + static_cast<uint32_t>(d);
    }
    return true;
  };
  for (++i; i < line.size(); ++i) {
    char c = line[i];
    if (c == '"') return true;
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i >= line.size()) return false;
    switch (line[i]) {
      case 'n':
        out->push_back('\n');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case '/':
        out->push_back('/');
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '"':
        out->push_back('"');
        break;
      case 'u': {
        uint32_t v = 0;
        if (!hex4(i + 1, &v)) return false;
        i += 4;
        if (v >= 0xD800 && v < 0xDC00 && i + 6 < line.size() && line[i + 1] == '\\' &&
            line[i + 2] == 'u') {
          uint32_t lo = 0;
          if (hex4(i + 3, &lo) && lo >= 0xDC00 && lo < 0xE000) {
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
          }
        }
        put_utf8(v);
        break;
      }
      default:
        return false;
    }
  }
  return false;
}

// "draft-model:path=/a/b/m.gguf,p_min=0.3" -> "draft-model:path=m.gguf,p_min=0.3"
std::string short_label(const std::string &spec) {
  std::string s = spec;
  size_t at = 0;
  while ((at = s.find("path=", at)) != std::string::npos) {
    size_t start = at + 5, end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    size_t slash = s.rfind('/', end);
    if (slash != std::string::npos && slash >= start) s.erase(start, slash + 1 - start);
    at = start;
  }
  static const char *kStatic = "static=";
  if ((at = s.find(kStatic)) != std::string::npos) {
    size_t start = at + std::strlen(kStatic), end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    size_t slash = s.rfind('/', end);
    if (slash != std::string::npos && slash >= start) s.erase(start, slash + 1 - start);
  }
  return s;
}

struct Config {
  std::string label, drafter_spec, coupler_spec;
  specinfer_drafter *drafter = nullptr;
  specinfer_coupler *coupler = nullptr;
  int plain_index = -1;  // the plain configuration with the same coupler
  // totals
  double gen_ms = 0;
  int64_t generated = 0, rounds = 0, drafted = 0, accepted = 0, identical = 0;
  std::vector<double> tps;  // per prompt
  std::vector<std::vector<int32_t>> outputs;
};

}  // namespace

int cmd_bench(int argc, char **argv) {
  std::string target_spec, prompts_file, chart;
  std::vector<std::string> drafters, couplers;
  int32_t limit = -1, max_tokens = 64, max_draft = 8, threads = 0;
  bool adaptive = true, verbose = false;
  float temp = 0;
  uint64_t seed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char *name) -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "specinfer bench: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--target") {
      target_spec = value("--target");
    } else if (a == "--prompts") {
      prompts_file = value("--prompts");
    } else if (a == "--drafter") {
      drafters.push_back(value("--drafter"));
    } else if (a == "--coupler") {
      couplers.push_back(value("--coupler"));
    } else if (a == "--limit") {
      if (!cli::parse_int(value("--limit"), 1, 1 << 24, &limit)) return 2;
    } else if (a == "-n" || a == "--max-tokens") {
      if (!cli::parse_int(value("--max-tokens"), 1, 1 << 20, &max_tokens)) return 2;
    } else if (a == "--max-draft") {
      if (!cli::parse_int(value("--max-draft"), 0, 64, &max_draft)) return 2;
    } else if (a == "--fixed-draft") {
      adaptive = false;
    } else if (a == "--temp") {
      if (!cli::parse_float(value("--temp"), 0, 100, &temp)) return 2;
    } else if (a == "--seed") {
      if (!cli::parse_u64(value("--seed"), &seed)) return 2;
    } else if (a == "--threads") {
      if (!cli::parse_int(value("--threads"), 0, 1024, &threads)) return 2;
    } else if (a == "--chart") {
      chart = value("--chart");
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr, "specinfer bench: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (target_spec.empty() || prompts_file.empty()) {
    std::fprintf(stderr, "specinfer bench: --target and --prompts are required\n\n");
    usage(stderr);
    return 2;
  }

  std::vector<std::string> prompts;
  {
    std::ifstream in(prompts_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "specinfer bench: cannot read %s: %s\n", prompts_file.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::string line, p;
    size_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (!json_prompt(line, &p)) {
        std::fprintf(stderr, "specinfer bench: %s:%zu: no \"prompt\" string\n",
                     prompts_file.c_str(), lineno);
        return 1;
      }
      prompts.push_back(p);
      if (limit > 0 && static_cast<int32_t>(prompts.size()) >= limit) break;
    }
  }
  if (prompts.empty()) {
    std::fprintf(stderr, "specinfer bench: %s holds no prompts\n", prompts_file.c_str());
    return 1;
  }
  if (couplers.empty()) couplers.push_back(temp > 0 ? "rejection" : "greedy");

  specinfer_registry_params rp;
  specinfer_registry_params_init(&rp);
  rp.n_threads = threads;
  specinfer_registry *reg = nullptr;
  char *err = nullptr;
  if (specinfer_registry_create(&rp, &reg, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  specinfer_target *target = nullptr;
  std::vector<Config> configs;
  int rc = 1;
  std::string plugin, config;
  cli::split_spec(target_spec, &plugin, &config);
  if (specinfer_target_open(reg, plugin.c_str(), config.c_str(), &target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer bench: cannot open target: %s\n", err);
    specinfer_free(err);
    specinfer_registry_destroy(reg);
    return 1;
  }
  do {
    bool ok = true;
    for (const std::string &cs : couplers) {
      Config plain;
      plain.label = "plain";
      plain.coupler_spec = cs;
      if (specinfer_coupler_create(cs.c_str(), &plain.coupler, &err) != SPECINFER_OK) {
        std::fprintf(stderr, "specinfer bench: bad coupler '%s': %s\n", cs.c_str(), err);
        ok = false;
        break;
      }
      int plain_index = static_cast<int>(configs.size());
      plain.plain_index = plain_index;
      configs.push_back(plain);
      for (const std::string &ds : drafters) {
        Config c;
        c.label = short_label(ds);
        c.drafter_spec = ds;
        c.coupler_spec = cs;
        c.plain_index = plain_index;
        specinfer_coupler_create(cs.c_str(), &c.coupler, nullptr);
        cli::split_spec(ds, &plugin, &config);
        if (specinfer_drafter_open(reg, plugin.c_str(), config.c_str(), target, &c.drafter, &err) !=
            SPECINFER_OK) {
          std::fprintf(stderr, "specinfer bench: cannot open drafter '%s': %s\n", ds.c_str(), err);
          specinfer_coupler_destroy(c.coupler);
          ok = false;
          break;
        }
        configs.push_back(c);
      }
      if (!ok) break;
    }
    if (!ok) break;

    std::fprintf(stderr, "bench: %zu prompts x %zu configurations, %d tokens each, %d threads\n",
                 prompts.size(), configs.size(), max_tokens, specinfer_registry_threads(reg));
    for (size_t pi = 0; pi < prompts.size() && ok; ++pi) {
      for (Config &c : configs) {
        specinfer_session_params p;
        specinfer_session_params_init(&p);
        p.max_draft = max_draft;
        p.adaptive_draft = adaptive;
        p.temperature = temp;
        p.seed = seed;
        specinfer_session *s = nullptr;
        if (specinfer_session_create(target, c.drafter, c.coupler, &p, &s, &err) != SPECINFER_OK) {
          std::fprintf(stderr, "specinfer bench: cannot create a session: %s\n", err);
          ok = false;
          break;
        }
        specinfer_status st =
            specinfer_session_feed_text(s, prompts[pi].data(), prompts[pi].size());
        if (st == SPECINFER_OK) st = specinfer_session_generate(s, max_tokens, nullptr, nullptr);
        if (st != SPECINFER_OK) {
          std::fprintf(stderr, "specinfer bench: prompt %zu, %s: %s\n", pi + 1, c.label.c_str(),
                       specinfer_session_errmsg(s));
          specinfer_session_destroy(s);
          ok = false;
          break;
        }
        specinfer_session_stats ss;
        specinfer_session_stats_init(&ss);
        specinfer_session_get_stats(s, &ss);
        const int32_t *toks = nullptr;
        size_t n = 0;
        specinfer_session_tokens(s, &toks, &n);
        size_t first = static_cast<size_t>(ss.n_prompt_tokens);
        c.outputs.emplace_back(toks + std::min(first, n), toks + n);
        specinfer_session_destroy(s);
        double gen_ms = ss.t_total_ms - ss.t_prefill_ms;
        c.gen_ms += gen_ms;
        c.generated += ss.n_generated;
        c.rounds += ss.n_rounds;
        c.drafted += ss.n_drafted;
        c.accepted += ss.n_accepted;
        c.tps.push_back(ss.tokens_per_second);
        if (c.outputs.back() == configs[static_cast<size_t>(c.plain_index)].outputs.back())
          ++c.identical;
        if (verbose)
          std::fprintf(stderr,
                       "  prompt %3zu  %-44s %-10s %7.2f tok/s  %4lld tokens  accept %.3f\n",
                       pi + 1, c.label.c_str(), c.coupler_spec.c_str(), ss.tokens_per_second,
                       static_cast<long long>(ss.n_generated), ss.acceptance_rate);
      }
      if (!verbose) std::fprintf(stderr, "\rbench: %zu/%zu prompts", pi + 1, prompts.size());
    }
    if (!verbose) std::fprintf(stderr, "\n");
    if (!ok) break;

    std::printf(
        "| configuration | coupler | tokens/s | speedup | acceptance | tokens/round | drafted | "
        "identical to plain |\n");
    std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Config &c : configs) {
      const Config &pl = configs[static_cast<size_t>(c.plain_index)];
      double tps = c.gen_ms > 0 ? c.generated * 1000.0 / c.gen_ms : 0;
      double ptps = pl.gen_ms > 0 ? pl.generated * 1000.0 / pl.gen_ms : 0;
      char acc[32] = "-";
      if (c.drafted > 0)
        std::snprintf(acc, sizeof acc, "%.3f", static_cast<double>(c.accepted) / c.drafted);
      std::printf("| %s | %s | %.2f | %.2fx | %s | %.2f | %lld | %lld/%zu |\n", c.label.c_str(),
                  c.coupler_spec.c_str(), tps, ptps > 0 ? tps / ptps : 0.0, acc,
                  c.rounds ? static_cast<double>(c.generated) / c.rounds : 0.0,
                  static_cast<long long>(c.drafted), static_cast<long long>(c.identical),
                  prompts.size());
    }
    if (!chart.empty()) {
      pngchart::Chart ch;
      ch.title = "specinfer bench: " + short_label(target_spec);
      ch.x_label = "prompt";
      ch.y_label = "tokens/s";
      for (const Config &c : configs) {
        pngchart::Series se;
        se.name = couplers.size() > 1 ? c.label + " / " + c.coupler_spec : c.label;
        for (size_t i = 0; i < c.tps.size(); ++i) {
          se.x.push_back(static_cast<double>(i + 1));
          se.y.push_back(c.tps[i]);
        }
        ch.series.push_back(se);
      }
      std::string e;
      if (!pngchart::write_png(chart, ch, &e)) {
        std::fprintf(stderr, "specinfer bench: cannot write %s: %s\n", chart.c_str(), e.c_str());
        break;
      }
      std::fprintf(stderr, "bench: chart written to %s\n", chart.c_str());
    }
    rc = 0;
  } while (false);
  specinfer_free(err);
  for (Config &c : configs) {
    specinfer_drafter_destroy(c.drafter);
    specinfer_coupler_destroy(c.coupler);
  }
  specinfer_target_destroy(target);
  specinfer_registry_destroy(reg);
  return rc;
}
