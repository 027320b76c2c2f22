// specinfer train-heads: trains Medusa heads (or another trainable drafter's weights) for a target
// on a text corpus, with a progress bar, through specinfer_drafter_train.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "cli_options.h"
#include "clock_text.h"
#include "commands.h"
#include "specinfer.h"

namespace fs = std::filesystem;

namespace {

struct TrainHeadsOptions {
  std::string target, plugin = "medusa", out, options;
  std::vector<std::string> corpus;
  int32_t heads = 0, tokens = 0, epochs = 0, threads = 0;
  double minutes = -1;
  bool resume = false;
};

// Files a corpus path names: the file itself, or every text file below a directory, sorted.
bool is_text_file(const fs::path &p) {
  static const char *const kExt[] = {".py",  ".txt",  ".md",   ".rst",  ".c",    ".h",  ".cc",
                                     ".cpp", ".hpp",  ".rs",   ".go",   ".js",   ".ts", ".java",
                                     ".sh",  ".toml", ".json", ".yaml", ".html", ".css"};
  const std::string ext = p.extension().string();
  return std::any_of(std::begin(kExt), std::end(kExt), [&](const char *e) { return ext == e; });
}

bool expand_corpus(const std::vector<std::string> &paths, std::vector<std::string> *files) {
  for (const std::string &path : paths) {
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) {
      files->push_back(path);
      continue;
    }
    if (!fs::is_directory(path, ec)) {
      std::fprintf(stderr, "specinfer train-heads: corpus path '%s' is not a file or directory\n",
                   path.c_str());
      return false;
    }
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(
             path, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec) && is_text_file(it->path())) found.push_back(it->path().string());
    }
    if (ec) {
      std::fprintf(stderr, "specinfer train-heads: cannot read '%s': %s\n", path.c_str(),
                   ec.message().c_str());
      return false;
    }
    std::sort(found.begin(), found.end());
    files->insert(files->end(), found.begin(), found.end());
  }
  return true;
}

// The Python standard library's source, which every machine with python3 has.
std::string default_corpus() {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const char *root : {"/usr/lib", "/usr/local/lib"}) {
    for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("python3.", 0) == 0 && fs::exists(it->path() / "os.py", ec))
        dirs.push_back(it->path().string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs.empty() ? std::string() : dirs.back();
}

// "/m/qwen2.5-coder-1.5b.gguf" -> "/m/qwen2.5-coder-1.5b.medusa.gguf".
std::string default_out(const std::string &target_spec) {
  const std::string key = "path=";
  size_t at = target_spec.find(key);
  if (at == std::string::npos) return "heads.medusa.gguf";
  std::string path = target_spec.substr(at + key.size());
  path = path.substr(0, path.find(','));
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0)
    path.resize(path.size() - 5);
  return path + ".medusa.gguf";
}

// Draws the progress: one line rewritten in place on a terminal, a line every few seconds
// otherwise (logs, CI). During collection the ETA is the earlier of the corpus's end and the time
// budget's end (the trainer stops collecting before the budget ends, in time to train), and says
// which.
struct ProgressBar {
  using Clock = std::chrono::steady_clock;
  bool tty = isatty(fileno(stderr)) != 0;
  std::string stage;
  Clock::time_point stage_start = Clock::now(), last_print{};
  Clock::time_point run_start = Clock::now();
  double budget_seconds = 0;  // the run's time budget; 0 = none or unknown
  bool line_open = false;

  void finish_line() {
    if (line_open) std::fputc('\n', stderr);
    line_open = false;
  }

  void update(const specinfer_train_progress &p) {
    const auto now = Clock::now();
    const std::string s = p.stage ? p.stage : "";
    const bool new_stage = s != stage;
    if (new_stage) {
      finish_line();
      stage = s;
      stage_start = now;
    }
    const bool last = p.total > 0 && p.done >= p.total;
    const double since_print = std::chrono::duration<double>(now - last_print).count();
    if (!new_stage && !last && since_print < (tty ? 0.2 : 10.0)) return;
    last_print = now;

    const double elapsed = std::chrono::duration<double>(now - stage_start).count();
    const double frac = p.total > 0 ? std::clamp(double(p.done) / double(p.total), 0.0, 1.0) : 0;
    double eta = frac > 0 ? elapsed * (1 - frac) / frac : NAN;
    const char *eta_of = "";
    if (stage == "collect" && budget_seconds > 0) {
      const double left = budget_seconds - std::chrono::duration<double>(now - run_start).count();
      eta_of = " (corpus end)";
      if (!(eta <= left)) {
        eta = std::max(left, 0.0);
        eta_of = " (time budget end)";
      }
    }
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::string line =
        "  " + stage + " [" + bar + "] " + std::to_string(p.done) + "/" + std::to_string(p.total);
    char buf[64];
    if (stage == "collect" && elapsed > 0) {
      std::snprintf(buf, sizeof buf, "  %.0f tok/s", double(p.done) / elapsed);
      line += buf;
    }
    if (std::isfinite(p.loss)) {
      std::snprintf(buf, sizeof buf, "  loss %.3f", p.loss);
      line += buf;
    }
    if (p.accuracy && p.n_heads > 0) {
      line += "  held-out top-1";
      for (int32_t k = 0; k < p.n_heads; ++k) {
        std::snprintf(buf, sizeof buf, " %.2f", double(p.accuracy[k]));
        line += buf;
      }
    }
    line += "  " + cli::clock_text(elapsed) + " elapsed, ETA " + cli::clock_text(eta) + eta_of;
    if (tty) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
      line_open = true;
      if (last) finish_line();
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }
};

// The run's time budget in minutes: the config's minutes=, else medusa's default (15, train.h);
// 0 when there is none or it is not known.
double budget_minutes(const std::string &config, const std::string &plugin) {
  for (size_t at = 0; at < config.size();) {
    size_t end = config.find(',', at);
    if (end == std::string::npos) end = config.size();
    const size_t eq = config.find('=', at);
    if (eq < end) {
      std::string name = config.substr(at, eq - at);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (name == "minutes") return std::atof(config.substr(eq + 1, end - eq - 1).c_str());
    }
    at = end + 1;
  }
  return plugin == "medusa" ? 15.0 : 0.0;
}

int on_progress(void *user, const specinfer_train_progress *p) {
  static_cast<ProgressBar *>(user)->update(*p);
  return 0;
}

// The trainer's messages (where collection stopped and why, the vocabulary's coverage, each
// epoch's losses, the final accuracy), each on a line of its own below the progress.
void on_log(void *user, specinfer_log_level level, const char *message) {
  auto *bar = static_cast<ProgressBar *>(user);
  bar->finish_line();
  std::fprintf(stderr, "%s%s\n", level >= SPECINFER_LOG_WARN ? "warning: " : "", message);
  std::fflush(stderr);
}

void define_options(cli::App &app, TrainHeadsOptions &o) {
  app.add_option("--target", o.target, "target model, e.g. gguf:path=model.gguf")
      ->type_name(cli::kSpec)
      ->required();
  app.add_option("--corpus", o.corpus,
                 "text files or directories (every text file below them) to learn from; default: "
                 "the Python standard library's source")
      ->type_name("PATH");
  app.add_option("--out", o.out,
                 "heads file to write; default: the target's path with .medusa.gguf")
      ->type_name("FILE");
  cli::add_number(app, "--heads", o.heads,
                  "heads to train (head k drafts k + 1 tokens ahead; 0: the trainer's default)",
                  "K", 0, 16);
  cli::add_number(app, "--tokens", o.tokens,
                  "corpus tokens to learn from (0: the trainer's default)", "N", 0, 1 << 26);
  cli::add_number(app, "--epochs", o.epochs, "passes over the collected data (0: the default)", "N",
                  0, 1000);
  cli::add_number(app, "--minutes", o.minutes,
                  "time budget: the target's pass over the corpus stops in time for training to "
                  "end within it (0: none; default: the trainer's, 15)",
                  "M", 0.0, 1e6);
  app.add_flag("--resume", o.resume, "go on from the checkpoints beside --out");
  app.add_option("--options", o.options, "further training options of the plugin (key=value,...)")
      ->type_name("K=V,...");
  app.add_option("--plugin", o.plugin, "the drafter plugin to train")->type_name("NAME");
  cli::add_number(app, "--threads", o.threads, "backend threads (0: all cores)", "N", 0, 1024);
}

// The plugin's training config from the options (its defaults stand where nothing is given).
std::string training_config(const TrainHeadsOptions &o) {
  std::vector<std::string> settings;
  if (o.heads > 0) settings.push_back("heads=" + std::to_string(o.heads));
  if (o.tokens > 0) settings.push_back("tokens=" + std::to_string(o.tokens));
  if (o.epochs > 0) settings.push_back("epochs=" + std::to_string(o.epochs));
  if (o.minutes >= 0) settings.push_back("minutes=" + std::to_string(o.minutes));
  if (o.resume) settings.push_back("resume=1");
  if (!o.options.empty()) settings.push_back(o.options);
  std::string config;
  for (const std::string &kv : settings) config += (config.empty() ? "" : ",") + kv;
  return config;
}

// Trains on `files` with the registry's target and writes o.out; the exit status.
int train(specinfer_registry *reg, const TrainHeadsOptions &o,
          const std::vector<std::string> &files, const std::string &config, ProgressBar &bar) {
  specinfer_target *target = nullptr;
  char *err = nullptr;
  int rc = 1;
  if (cli::open_target(reg, o.target, &target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer train-heads: cannot open target: %s\n", err);
    specinfer_free(err);
    return 1;
  }
  std::vector<const char *> paths;
  for (const std::string &f : files) paths.push_back(f.c_str());
  const std::string count = o.heads > 0 ? std::to_string(o.heads) + " " : "";
  std::fprintf(stderr, "training %s%s heads on %zu corpus files (%s%s) -> %s\n", count.c_str(),
               o.plugin.c_str(), files.size(), o.corpus.front().c_str(),
               o.corpus.size() > 1 ? ", ..." : "", o.out.c_str());
  specinfer_train_params tp;
  specinfer_train_params_init(&tp);
  tp.config = config.c_str();
  tp.corpus = paths.data();
  tp.n_corpus = static_cast<int32_t>(paths.size());
  tp.out_path = o.out.c_str();
  tp.progress = on_progress;
  tp.user = &bar;
  const auto t0 = std::chrono::steady_clock::now();
  bar.run_start = t0;
  const specinfer_status s = specinfer_drafter_train(reg, o.plugin.c_str(), target, &tp, &err);
  bar.finish_line();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer train-heads: %s: %s\n", specinfer_status_str(s),
                 err ? err : "");
  } else {
    std::printf("wrote %s in %s\n", o.out.c_str(), cli::clock_text(secs).c_str());
    rc = 0;
  }
  specinfer_free(err);
  specinfer_target_destroy(target);
  return rc;
}

}  // namespace

int cmd_train_heads(int argc, char **argv) {
  TrainHeadsOptions o;
  cli::App app{
      "Trains Medusa heads for a target: self-distillation on a text corpus (the labels are the "
      "target's own predictions), written as a GGUF heads file for `--drafter "
      "medusa:path=FILE`. Checkpoints are kept beside the output, so an interrupted run goes on "
      "with --resume.",
      "specinfer train-heads"};
  define_options(app, o);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;

  if (o.corpus.empty()) {
    const std::string dir = default_corpus();
    if (dir.empty())
      return cli::usage_error(app,
                              "no --corpus given and no Python standard library found "
                              "(/usr/lib/python3.*)");
    o.corpus.push_back(dir);
  }
  std::vector<std::string> files;
  if (!expand_corpus(o.corpus, &files)) return 1;
  if (files.empty()) {
    std::fprintf(stderr, "specinfer train-heads: the corpus has no text files\n");
    return 1;
  }
  if (o.out.empty()) o.out = default_out(o.target);

  const std::string config = training_config(o);
  ProgressBar bar;
  bar.budget_seconds = 60.0 * budget_minutes(config, o.plugin);
  cli::RunOptions ro;
  ro.threads = o.threads;
  specinfer_registry *reg = cli::create_registry(ro, "specinfer train-heads", on_log, &bar);
  if (!reg) return 1;
  const int rc = train(reg, o, files, config, bar);
  specinfer_registry_destroy(reg);
  return rc;
}
