// specinfer bench: plain decoding against each configured drafter (and coupler) on a prompt set.
// Prompt-major order: for each prompt every configuration runs back to back, so slow drifts of the
// machine's load hit all configurations alike. Prints a table (tokens/s, speedup over the plain row
// of the table, acceptance, mean tokens per round, outputs identical to plain) and writes a PNG
// chart of tokens/s per prompt. With --batch, many sessions at once on one shared model instead
// (bench_batch.h), and each row's ratio to plain decoding at the smallest and at its own batch.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench_batch.h"
#include "cli_options.h"
#include "commands.h"
#include "png_chart.h"
#include "prompts.h"
#include "specinfer.h"

namespace {

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
  // Rounds whose drafter estimated its accepted length: the estimates' and the kept tokens' sums.
  int64_t estimated_rounds = 0;
  double expected = 0, estimated_accepted = 0;
  std::vector<double> tps;  // per prompt
  std::vector<std::vector<int32_t>> outputs;
};

// --batch: every configuration at every batch size, `runs` times over; one table.
struct BatchRow {
  size_t config;
  int32_t batch;
  std::vector<BatchRun> runs;
};

double tokens_per_second(const BatchRun &r) {
  return r.wall_ms > 0 ? static_cast<double>(r.generated) * 1000.0 / r.wall_ms : 0.0;
}

// The median of the row's runs' tokens/s.
double median_tps(const BatchRow &r) {
  std::vector<double> v;
  for (const BatchRun &x : r.runs) v.push_back(tokens_per_second(x));
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0.0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One run of a configuration at a batch size, with its line on stderr; false after printing why
// not.
bool run_row(specinfer_registry *reg, specinfer_target *target, const Config &c,
             const cli::RunOptions &o, const std::vector<std::string> &prompts,
             int32_t prefill_chunk, const std::string &which, BatchRow &row) {
  BatchRun x;
  if (!run_batched(reg, target, c.drafter_spec, c.coupler, o, prompts, row.batch, prefill_chunk,
                   &x))
    return false;
  const StepTally &t = x.step;
  const double per_step = t.steps ? 1.0 / static_cast<double>(t.steps) : 0.0;
  std::fprintf(stderr,
               "bench: %s%s, batch %d: %.1f s (prompts %.1f s, drafting %.1f s); per step: "
               "%.2f sessions, draft %.2f of %.2f allowed per session, pass %.1f ms (predicted "
               "%.1f ms)\n",
               which.c_str(), c.label.c_str(), row.batch, x.wall_ms / 1000, x.prefill_ms / 1000,
               x.draft_ms / 1000, static_cast<double>(t.rounds) * per_step,
               t.rounds ? static_cast<double>(t.drafted) / t.rounds : 0.0,
               t.rounds ? static_cast<double>(t.budget) / t.rounds : 0.0, t.pass_ms * per_step,
               t.predicted_pass_ms * per_step);
  row.runs.push_back(std::move(x));
  return true;
}

// The table: each row's tokens/s is the median of its runs, its ratios those medians' (so that
// they add up); with several runs, also each run's own ratio to plain in that run. The other
// columns are over all runs.
void print_batch_table(const std::vector<Config> &configs, const std::vector<BatchRow> &rows,
                       size_t n_prompts, int32_t smallest, int32_t runs) {
  std::printf(
      "| configuration | coupler | batch | tokens/s%s | vs plain at batch %d | x of plain "
      "at this batch |%s tokens/round | draft/session/step | pass ms (predicted) | "
      "identical to plain |\n",
      runs > 1 ? ", median of runs" : "", smallest,
      runs > 1 ? " x of plain at this batch, each run |" : "");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: |%s ---: | ---: | ---: | ---: |\n",
              runs > 1 ? " ---: |" : "");
  for (const BatchRow &r : rows) {
    const Config &c = configs[r.config];
    const BatchRow *base = nullptr, *plain = nullptr;
    for (const BatchRow &q : rows) {
      if (q.config != static_cast<size_t>(c.plain_index)) continue;
      if (q.batch == smallest) base = &q;
      if (q.batch == r.batch) plain = &q;
    }
    const double tps = median_tps(r);
    const auto ratio = [&](const BatchRow *p) {
      return p && median_tps(*p) > 0 ? tps / median_tps(*p) : 0.0;
    };
    std::string each;
    if (runs > 1) {
      for (size_t k = 0; k < r.runs.size(); ++k) {
        const double p = plain && k < plain->runs.size() ? tokens_per_second(plain->runs[k]) : 0;
        char cell[32];
        std::snprintf(cell, sizeof cell, "%s%.2f", k ? " / " : " ",
                      p > 0 ? tokens_per_second(r.runs[k]) / p : 0.0);
        each += cell;
      }
      each += " |";
    }
    int64_t generated = 0, rounds = 0, tally_rounds = 0, drafted = 0, steps = 0;
    double pass_ms = 0, predicted_ms = 0;
    size_t same = 0, outputs = 0;
    for (size_t k = 0; k < r.runs.size(); ++k) {
      const BatchRun &x = r.runs[k];
      generated += x.generated;
      rounds += x.rounds;
      tally_rounds += x.step.rounds;
      drafted += x.step.drafted;
      steps += x.step.steps;
      pass_ms += x.step.pass_ms;
      predicted_ms += x.step.predicted_pass_ms;
      for (size_t i = 0; plain && k < plain->runs.size() && i < n_prompts; ++i)
        same += x.outputs[i] == plain->runs[k].outputs[i];
      outputs += n_prompts;
    }
    std::printf("| %s | %s | %d | %.2f | %.2fx | %.2fx |%s %.2f | %.2f | %.1f (%.1f) | %zu/%zu |\n",
                c.label.c_str(), c.coupler_spec.c_str(), r.batch, tps, ratio(base), ratio(plain),
                each.c_str(), rounds ? static_cast<double>(generated) / rounds : 0.0,
                tally_rounds ? static_cast<double>(drafted) / tally_rounds : 0.0,
                steps ? pass_ms / steps : 0.0, steps ? predicted_ms / steps : 0.0, same, outputs);
  }
}

bool run_batches(specinfer_registry *reg, specinfer_target *target,
                 const std::vector<Config> &configs, const cli::RunOptions &o,
                 const std::vector<std::string> &prompts, const std::vector<int32_t> &batches,
                 int32_t prefill_chunk, int32_t runs) {
  std::fprintf(stderr,
               "bench: %zu prompts x %zu configurations x %zu batch sizes x %d runs, %d tokens "
               "each, %d threads\n",
               prompts.size(), configs.size(), batches.size(), runs, o.max_tokens,
               specinfer_registry_threads(reg));
  std::vector<BatchRow> rows;
  for (size_t ci = 0; ci < configs.size(); ++ci)
    for (int32_t b : batches) rows.push_back({ci, b, {}});
  // Batch-major within a run: the configurations at one batch size run one after another, so
  // that a ratio to plain compares runs minutes apart at most on a machine whose speed drifts.
  for (int32_t k = 0; k < runs; ++k)
    for (size_t bi = 0; bi < batches.size(); ++bi)
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const std::string which =
            runs > 1 ? "run " + std::to_string(k + 1) + "/" + std::to_string(runs) + ", " : "";
        if (!run_row(reg, target, configs[ci], o, prompts, prefill_chunk, which,
                     rows[ci * batches.size() + bi]))
          return false;
      }
  // Both ratios are of tokens/s in this table: to the plain row of the same coupler at the
  // smallest batch (what batching gains overall) and at the row's own batch (what speculation
  // gains inside a batch).
  print_batch_table(configs, rows, prompts.size(),
                    *std::min_element(batches.begin(), batches.end()), runs);
  return true;
}

// The command line of specinfer bench.
struct BenchOptions {
  cli::RunOptions o;
  std::string prompts_file, chart;
  std::vector<std::string> drafters, couplers;
  int32_t limit = 0, prefill_chunk = 64, runs = 1;
  std::vector<int32_t> batches;
  bool verbose = false;
};

void define_options(cli::App &app, BenchOptions *b) {
  b->o.max_tokens = 64;
  cli::add_run_options(app, &b->o, 1);
  app.add_option("--prompts", b->prompts_file,
                 "JSON lines with a \"prompt\" string each (bench/prompts/*.jsonl)")
      ->type_name("FILE")
      ->required();
  app.add_option("--drafter", b->drafters, "a drafter to compare with plain decoding (repeatable)")
      ->type_name(cli::kSpec)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->default_str("");
  app.add_option("--coupler", b->couplers,
                 "coupler (repeatable; default: greedy at --temp 0, else rejection)")
      ->type_name("SPEC")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->default_str("");
  cli::add_number(app, "--limit", b->limit, "the first N prompts only", "N", 1, 1 << 24)
      ->default_str("all");
  app.add_option("--chart", b->chart, "write a chart of tokens/s per prompt")
      ->type_name("FILE.png");
  app.add_flag("--verbose", b->verbose, "one line per prompt and configuration");
  app.add_option("--batch", b->batches,
                 "run the prompts N at a time, sessions on one shared model stepped together "
                 "(continuous batching); tokens/s is then the aggregate, prompts included "
                 "(repeatable: one row per N)")
      ->type_name("N")
      ->check(CLI::Range(1, 64))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli::add_number(app, "--prefill-chunk", b->prefill_chunk,
                  "with --batch: most prompt tokens a session scores per step (0: all at once)",
                  "N", 0, 1 << 20)
      ->default_val(64);
  cli::add_number(app, "--runs", b->runs,
                  "with --batch: run every row N times over (batch sizes in turn each time); "
                  "tokens/s is then the median, and each run's ratio to plain is shown",
                  "N", 1, 100)
      ->default_val(1);
}

// The registry, the target and every configuration's drafter and coupler, destroyed together.
struct BenchModels {
  specinfer_registry *reg = nullptr;
  specinfer_target *target = nullptr;
  std::vector<Config> configs;
  BenchModels() = default;
  BenchModels(const BenchModels &) = delete;
  BenchModels &operator=(const BenchModels &) = delete;
  ~BenchModels() {
    for (Config &c : configs) {
      specinfer_drafter_destroy(c.drafter);
      specinfer_coupler_destroy(c.coupler);
    }
    specinfer_target_destroy(target);
    specinfer_registry_destroy(reg);
  }
};

// Per coupler, a plain configuration followed by one per drafter, into m->configs; false after
// printing why not.
bool open_configs(const BenchOptions &b, BenchModels *m) {
  char *err = nullptr;
  for (const std::string &cs : b.couplers) {
    Config plain;
    plain.label = "plain";
    plain.coupler_spec = cs;
    if (specinfer_coupler_create(cs.c_str(), &plain.coupler, &err) != SPECINFER_OK) {
      std::fprintf(stderr, "specinfer bench: bad coupler '%s': %s\n", cs.c_str(), err);
      specinfer_free(err);
      return false;
    }
    int plain_index = static_cast<int>(m->configs.size());
    plain.plain_index = plain_index;
    m->configs.push_back(plain);
    for (const std::string &ds : b.drafters) {
      Config c;
      c.label = short_label(ds);
      c.drafter_spec = ds;
      c.coupler_spec = cs;
      c.plain_index = plain_index;
      specinfer_coupler_create(cs.c_str(), &c.coupler, nullptr);
      if (cli::open_drafter(m->reg, ds, m->target, &c.drafter, &err) != SPECINFER_OK) {
        std::fprintf(stderr, "specinfer bench: cannot open drafter '%s': %s\n", ds.c_str(), err);
        specinfer_free(err);
        specinfer_coupler_destroy(c.coupler);
        return false;
      }
      m->configs.push_back(c);
    }
  }
  return true;
}

// Generates from prompt number pi (0-based) with configuration c and adds the run to its totals;
// false after printing why not.
bool run_one(const BenchOptions &b, specinfer_target *target, const std::string &prompt, size_t pi,
             Config &c, const std::vector<Config> &configs) {
  char *err = nullptr;
  const specinfer_session_params p = cli::session_params(b.o);
  specinfer_session *s = nullptr;
  if (specinfer_session_create(target, c.drafter, c.coupler, &p, &s, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer bench: cannot create a session: %s\n", err);
    specinfer_free(err);
    return false;
  }
  specinfer_status st = specinfer_session_feed_text(s, prompt.data(), prompt.size());
  if (st == SPECINFER_OK) st = specinfer_session_generate(s, b.o.max_tokens, nullptr, nullptr);
  if (st != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer bench: prompt %zu, %s: %s\n", pi + 1, c.label.c_str(),
                 specinfer_session_errmsg(s));
    specinfer_session_destroy(s);
    return false;
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
  c.estimated_rounds += ss.n_estimated_rounds;
  c.expected += ss.expected_accepted;
  c.estimated_accepted += ss.estimated_rounds_accepted;
  c.tps.push_back(ss.tokens_per_second);
  if (c.outputs.back() == configs[static_cast<size_t>(c.plain_index)].outputs.back()) ++c.identical;
  if (b.verbose)
    std::fprintf(stderr, "  prompt %3zu  %-44s %-10s %7.2f tok/s  %4lld tokens  accept %.3f\n",
                 pi + 1, c.label.c_str(), c.coupler_spec.c_str(), ss.tokens_per_second,
                 static_cast<long long>(ss.n_generated), ss.acceptance_rate);
  return true;
}

// Prompt-major: every configuration on each prompt in turn; false after printing why not.
bool run_prompts(const BenchOptions &b, BenchModels *m, const std::vector<std::string> &prompts) {
  std::fprintf(stderr, "bench: %zu prompts x %zu configurations, %d tokens each, %d threads\n",
               prompts.size(), m->configs.size(), b.o.max_tokens,
               specinfer_registry_threads(m->reg));
  bool ok = true;
  for (size_t pi = 0; pi < prompts.size() && ok; ++pi) {
    for (Config &c : m->configs)
      if (!(ok = run_one(b, m->target, prompts[pi], pi, c, m->configs))) break;
    if (!b.verbose) std::fprintf(stderr, "\rbench: %zu/%zu prompts", pi + 1, prompts.size());
  }
  if (!b.verbose) std::fprintf(stderr, "\n");
  return ok;
}

// A speedup is the row's tokens/s over the tokens/s of the plain row with the same coupler. The
// accepted length per round, expected against kept, is over the rounds whose drafter estimated it.
void print_table(const std::vector<Config> &configs, size_t n_prompts) {
  std::printf(
      "| configuration | coupler | tokens/s | speedup | acceptance | tokens/round | nodes/round "
      "| accepted/round expected, kept | drafted | identical to plain |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Config &c : configs) {
    const Config &pl = configs[static_cast<size_t>(c.plain_index)];
    double tps = c.gen_ms > 0 ? c.generated * 1000.0 / c.gen_ms : 0;
    double ptps = pl.gen_ms > 0 ? pl.generated * 1000.0 / pl.gen_ms : 0;
    char acc[32] = "-";
    if (c.drafted > 0)
      std::snprintf(acc, sizeof acc, "%.3f", static_cast<double>(c.accepted) / c.drafted);
    char est[48] = "-";
    if (c.estimated_rounds > 0)
      std::snprintf(est, sizeof est, "%.2f, %.2f",
                    c.expected / static_cast<double>(c.estimated_rounds),
                    c.estimated_accepted / static_cast<double>(c.estimated_rounds));
    std::printf("| %s | %s | %.2f | %.2fx | %s | %.2f | %.2f | %s | %lld | %lld/%zu |\n",
                c.label.c_str(), c.coupler_spec.c_str(), tps, ptps > 0 ? tps / ptps : 0.0, acc,
                c.rounds ? static_cast<double>(c.generated) / c.rounds : 0.0,
                c.rounds ? static_cast<double>(c.drafted) / c.rounds : 0.0, est,
                static_cast<long long>(c.drafted), static_cast<long long>(c.identical), n_prompts);
  }
}

// The chart of tokens/s per prompt; false after printing why it could not be written.
bool write_chart(const BenchOptions &b, const std::vector<Config> &configs) {
  pngchart::Chart ch;
  ch.title = "specinfer bench: " + short_label(b.o.target);
  ch.x_label = "prompt";
  ch.y_label = "tokens/s";
  for (const Config &c : configs) {
    pngchart::Series se;
    se.name = b.couplers.size() > 1 ? c.label + " / " + c.coupler_spec : c.label;
    for (size_t i = 0; i < c.tps.size(); ++i) {
      se.x.push_back(static_cast<double>(i + 1));
      se.y.push_back(c.tps[i]);
    }
    ch.series.push_back(se);
  }
  std::string e;
  if (!pngchart::write_png(b.chart, ch, &e)) {
    std::fprintf(stderr, "specinfer bench: %s\n", e.c_str());
    return false;
  }
  std::fprintf(stderr, "bench: chart written to %s\n", b.chart.c_str());
  return true;
}

}  // namespace

int cmd_bench(int argc, char **argv) {
  cli::App app{
      "Plain decoding against each drafter (and coupler) on a prompt set: prints a table "
      "(tokens/s, speedup, acceptance, tokens per round, outputs identical to plain) and "
      "can write a PNG chart of tokens/s per prompt.",
      "specinfer bench"};
  BenchOptions b;
  define_options(app, &b);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;

  if (b.runs > 1 && b.batches.empty()) {
    std::fprintf(stderr, "specinfer bench: --runs needs --batch\n");
    return 2;
  }
  std::vector<std::string> prompts;
  try {
    prompts = read_prompts(b.prompts_file, static_cast<size_t>(b.limit));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "specinfer bench: %s\n", e.what());
    return 1;
  }
  if (prompts.empty()) {
    std::fprintf(stderr, "specinfer bench: %s holds no prompts\n", b.prompts_file.c_str());
    return 1;
  }
  if (b.couplers.empty()) b.couplers.push_back(b.o.temp > 0 ? "rejection" : "greedy");

  BenchModels m;
  m.reg = cli::create_registry(b.o, "specinfer");
  if (!m.reg) return 1;
  char *err = nullptr;
  if (cli::open_target(m.reg, b.o.target, &m.target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer bench: cannot open target: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  if (!open_configs(b, &m)) return 1;
  if (!b.batches.empty()) {
    const bool ok =
        run_batches(m.reg, m.target, m.configs, b.o, prompts, b.batches, b.prefill_chunk, b.runs);
    return ok ? 0 : 1;
  }
  if (!run_prompts(b, &m, prompts)) return 1;
  print_table(m.configs, prompts.size());
  if (!b.chart.empty() && !write_chart(b, m.configs)) return 1;
  return 0;
}
