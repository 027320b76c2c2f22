// Tests of the `specinfer` command (tools/specinfer) run as a user runs it: every command's
// --help, --opt=value beside --opt value, a repeated option keeping its last value (scripts/demo
// relies on it), exit code 2 and a message naming the option for unknown options, missing and
// out-of-range values, and the prompt files of bench: a malformed line named by its line number,
// a good file through bench with a chart, and bench's tables adding up (every speedup the tokens/s
// of its row over a plain row's in the same table), and generate's constraints (--regex, --grammar,
// --json-schema). The kgram and ngram plugins stand in for real models.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/cmocka_setup.h"

namespace {

std::string g_dir;  // a temporary directory for this run's files

using Result = CliResult;

// Runs `specinfer args...` with stdout and stderr caught.
Result run(const std::vector<std::string> &args) {
  return run_cli(SPECINFER_CLI, g_dir, args);
}

std::string args_str(const std::vector<std::string> &args) {
  std::string s;
  for (const std::string &a : args) s.append(" ").append(a);
  return s;
}

// Fails unless `specinfer args` exits with `status` and `text` appears in its stdout (to_stdout) or
// stderr.
void expect(const std::vector<std::string> &args, int status, const std::string &text,
            bool to_stdout) {
  const Result r = run(args);
  const std::string &where = to_stdout ? r.out : r.err;
  if (r.status != status || where.find(text) == std::string::npos) {
    print_error("specinfer%s: exit %d (want %d), want \"%s\" in its %s\nstdout:\n%s\nstderr:\n%s\n",
                args_str(args).c_str(), r.status, status, text.c_str(),
                to_stdout ? "stdout" : "stderr", r.out.c_str(), r.err.c_str());
    fail();
  }
}

void write_file(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string training_text() {
  return g_dir + "/train.txt";
}

std::string kgram(int k) {
  return "kgram:path=" + training_text() + ",k=" + std::to_string(k);
}

int setup(void **) {
  char tmpl[] = "/tmp/specinfer-test-cli-XXXXXX";
  if (!mkdtemp(tmpl)) return -1;
  g_dir = tmpl;
  std::string text;
  for (int i = 0; i < 40; ++i)
    text +=
        "The target scores the draft in one pass, and the coupler keeps the longest prefix "
        "that the target agrees with. The drafter proposes tokens cheaply. ";
  write_file(training_text(), text);
  return 0;
}

int teardown(void **) {
  return std::system(("rm -rf " + quote(g_dir)).c_str()) == 0 ? 0 : -1;
}

void test_help(void **) {
  expect({"--help"}, 0, "Usage: specinfer", true);
  expect({"--help"}, 0, "sketch-eval", true);
  expect({"--version"}, 0, "specinfer ", true);
  const struct {
    const char *command, *option;
  } commands[] = {{"generate", "--prompt-file"},
                  {"bench", "--prompts"},
                  {"plugins", "--help"},
                  {"sketch-eval", "--overlaps"}};
  for (const auto &c : commands) {
    expect({c.command, "--help"}, 0, std::string("Usage: specinfer ") + c.command, true);
    expect({c.command, "-h"}, 0, c.option, true);
  }
  // The options every session-running command shares.
  for (const char *command : {"generate", "bench"})
    for (const char *option : {"--target", "--max-tokens", "--max-draft", "--fixed-draft", "--temp",
                               "--top-k", "--top-p", "--min-p", "--seed", "--threads"})
      expect({command, "--help"}, 0, option, true);
  // sketch-eval describes its --model mode too, and that mode has a help of its own.
  expect({"sketch-eval", "--help"}, 0, "--min-pos", true);
  expect({"sketch-eval", "--model", "m.gguf", "--help"}, 0, "--queries", true);
}

void test_usage_errors(void **) {
  const std::string t = kgram(3);
  const std::string f = g_dir + "/unused.jsonl";
  const struct {
    std::vector<std::string> args;
    const char *names;  // what the message must name
  } cases[] = {
      {{}, "a command is required"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"--frobnicate"}, "--frobnicate"},
      {{"generate", "--target", t, "--prompt", "x", "--frobnicate", "1"}, "--frobnicate"},
      {{"generate", "--prompt", "x"}, "--target is required"},
      {{"generate", "--target", t}, "--prompt or --prompt-file is required"},
      {{"generate", "--target", t, "--prompt"}, "--prompt"},
      {{"generate", "--target", t, "--prompt", "x", "--max-draft", "17"}, "--max-draft"},
      {{"generate", "--target", t, "--prompt", "x", "--max-draft=17"}, "--max-draft"},
      {{"generate", "--target", t, "--prompt", "x", "--temp=-1"}, "--temp"},
      {{"generate", "--target", t, "--prompt", "x", "--temp", "nan"}, "--temp"},
      {{"generate", "--target", t, "--prompt", "x", "--top-p", "1.5"}, "--top-p"},
      {{"generate", "--target", t, "--prompt", "x", "--min-p=2"}, "--min-p"},
      {{"generate", "--target", t, "--prompt", "x", "--top-k", "-1"}, "--top-k"},
      {{"generate", "--target", t, "--prompt", "x", "--seed", "-1"}, "--seed"},
      {{"generate", "--target", t, "--prompt", "x", "-n", "many"}, "--max-tokens"},
      {{"generate", "--target", t, "--prompt", "x", "--threads", "5000"}, "--threads"},
      {{"bench", "--target", t}, "--prompts is required"},
      {{"bench", "--target", t, "--prompts", f, "--limit", "0"}, "--limit"},
      {{"bench", "--target", t, "--prompts", f, "--max-tokens=0"}, "--max-tokens"},
      {{"bench", "--target", t, "--prompts", f, "--verbose=maybe"}, "--verbose"},
      {{"plugins", "extra"}, "extra"},
      {{"sketch-eval", "--nnz", "5"}, "--nnz"},
      {{"sketch-eval", "--overlaps=0.5,2"}, "--overlaps"},
      {{"sketch-eval", "--outliers", "-0.1"}, "--outliers"},
      {{"sketch-eval", "--storage", "10:5:1"}, "--storage"},
      {{"sketch-eval", "--storage", "10:20"}, "--storage"},
      {{"sketch-eval", "--trials", "0"}, "--trials"},
      {{"sketch-eval", "--methods", "jl,nope"}, "--methods"},
      {{"sketch-eval", "--jl-dist", "uniform"}, "--jl-dist"},
      {{"sketch-eval", "--png", "a", "--no-png"}, "--png"},
      {{"sketch-eval", "--bogus"}, "--bogus"},
      {{"sketch-eval", "--model", "m.gguf"}, "--text is required"},
      {{"sketch-eval", "--model=m.gguf", "--text", "t", "--tokens", "3"}, "--tokens"},
      {{"sketch-eval", "--model", "m.gguf", "--text", "t", "--storage", "8,1"}, "--storage"},
  };
  for (const auto &c : cases) {
    expect(c.args, 2, c.names, false);
    expect(c.args, 2, "--help` for the options", false);
  }
}

void test_option_forms(void **) {
  // --opt value and --opt=value read alike: the same text (at a seed, with a Gumbel coupler the
  // text does not depend on the drafter's timing).
  const Result spaced =
      run({"generate", "--target", kgram(4), "--drafter", kgram(2), "--prompt", "The ", "-n", "24",
           "--temp", "0.8", "--coupler", "gumbel", "--seed", "42", "--max-draft", "4"});
  const Result joined =
      run({"generate", "--target=" + kgram(4), "--drafter=" + kgram(2), "--prompt=The ",
           "--max-tokens=24", "--temp=0.8", "--coupler=gumbel", "--seed=42", "--max-draft=4"});
  assert_int_equal(spaced.status, 0);
  assert_int_equal(joined.status, 0);
  assert_true(spaced.out.size() > 5);
  assert_true(spaced.out == joined.out);
  assert_true(spaced.err.find("[speculative] prompt") != std::string::npos);
  // A repeated option keeps its last value; --drafter none means plain decoding.
  const Result last =
      run({"generate", "--target", kgram(4), "--prompt", "The ", "-n", "3", "-n", "24", "--drafter",
           kgram(2), "--drafter", "none", "--temp", "0.8", "--coupler", "gumbel", "--seed", "42"});
  assert_int_equal(last.status, 0);
  assert_true(last.out == spaced.out);
  assert_true(last.err.find("[plain] prompt") != std::string::npos);
  assert_true(last.err.find("generated 24 tokens") != std::string::npos);
  // --prompt-file reads the prompt from a file.
  write_file(g_dir + "/prompt.txt", "The ");
  const Result file = run({"generate", "--target", kgram(4), "--prompt-file", g_dir + "/prompt.txt",
                           "-n", "24", "--temp", "0.8", "--coupler", "gumbel", "--seed", "42"});
  assert_int_equal(file.status, 0);
  assert_true(file.out == spaced.out);
}

void test_generate_stop(void **) {
  // --stop ends the printed text right before the first of its strings; escapes are read.
  const std::vector<std::string> base = {"generate", "--target", kgram(4), "--drafter", kgram(2),
                                         "--prompt", "The ",     "-n",     "60"};
  const Result whole = run(base);
  assert_int_equal(whole.status, 0);
  const std::string text = whole.out;
  const size_t at = text.find(" The");
  assert_true(at != std::string::npos && at > 0 && at < 50);
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--stop", "\\n\\n", "--stop", " The"});
  const Result cut = run(args);
  assert_int_equal(cut.status, 0);
  assert_string_equal(cut.out.c_str(), (text.substr(0, at) + "\n").c_str());
  // A newline written as an escape is a newline.
  std::string lines;
  for (int i = 0; i < 40; ++i) lines += "line one\nline two\n";
  write_file(g_dir + "/lines.txt", lines);
  const Result line = run({"generate", "--target", "kgram:path=" + g_dir + "/lines.txt,k=4",
                           "--prompt", "line", "-n", "40", "--stop", "\\n"});
  assert_int_equal(line.status, 0);
  assert_string_equal(line.out.c_str(), " one\n");
}

// --regex, --grammar, --json-schema (the llguidance plugin): the text matches, with a drafter too
// and identical to plain decoding; a bad grammar is refused with llguidance's reason. The k-gram
// target has no end-of-generation token: its text ends where the grammar does.
void test_generate_constraints(void **) {
  const char *plugins = std::getenv("SPECINFER_PLUGIN_PATH");
  if (!plugins || read_all(std::string(plugins) + "/specinfer-llguidance.so").empty()) {
    std::fprintf(stderr, "SKIP: the llguidance plugin is not built (it needs a newer cargo)\n");
    skip();
  }
  // `plugins` names what each plugin provides.
  expect({"plugins"}, 0, "llguidance   1.0      constraint  ", true);
  const std::string re = "(The|the) (target|drafter|coupler) [a-z ]{4,40}\\.";
  const Result r = run({"generate", "--target", kgram(4), "--drafter", kgram(2), "--prompt",
                        "In speculative decoding, ", "-n", "80", "--regex", re, "--compare-plain"});
  if (r.status != 0) print_error("stderr:\n%s\n", r.err.c_str());
  assert_int_equal(r.status, 0);
  std::string text = r.out;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!std::regex_match(text, std::regex(re))) print_error("does not match: '%s'\n", text.c_str());
  assert_true(std::regex_match(text, std::regex(re)));
  assert_true(r.err.find("(identical output)") != std::string::npos);
  assert_true(r.err.find("forced tokens drafted") != std::string::npos);

  write_file(g_dir + "/answer.lark",
             "start: \"The \" WORD \" scores the draft.\"\nWORD: /[a-z]+/\n");
  const Result g = run({"generate", "--target", kgram(4), "--prompt", "So: ", "-n", "60",
                        "--grammar", g_dir + "/answer.lark"});
  assert_int_equal(g.status, 0);
  assert_true(std::regex_match(g.out, std::regex("The [a-z]+ scores the draft\\.\n")));

  write_file(g_dir + "/digits.json",
             "{\"type\": \"array\", \"items\": {\"enum\": [\"the\", "
             "\"target\"]}, \"minItems\": 2, \"maxItems\": 2, "
             "\"x-guidance\": {\"whitespace_flexible\": false}}");
  const Result j = run({"generate", "--target", kgram(4), "--prompt", "List: ", "-n", "60",
                        "--json-schema", g_dir + "/digits.json"});
  assert_int_equal(j.status, 0);
  assert_true(
      std::regex_match(j.out, std::regex("\\[(\"the\"|\"target\"),(\"the\"|\"target\")\\]\n")));

  write_file(g_dir + "/bad.json", "{\"type\": ");
  expect({"generate", "--target", kgram(4), "--prompt", "x", "--json-schema", g_dir + "/bad.json"},
         1, "json_schema does not compile", false);
  expect({"generate", "--target", kgram(4), "--prompt", "x", "--regex", "(ab"}, 1,
         "regex does not compile", false);
  expect({"generate", "--target", kgram(4), "--prompt", "x", "--regex", "a", "--json-schema",
          g_dir + "/bad.json"},
         2, "excludes", false);
}

void test_generate_context_shift(void **) {
  // A 64-token window: generation stops with the context full, or goes on with --context-shift.
  const std::vector<std::string> base = {
      "generate", "--target", kgram(4) + ",n_ctx=64", "--prompt", "The ", "-n", "200"};
  expect(base, 1, "the context window of 64 tokens is full", false);
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--context-shift", "--keep", "2", "--drafter", kgram(2)});
  expect(args, 0, "context shifts", false);
  const Result r = run(args);
  assert_int_equal(r.status, 0);
  assert_true(r.out.size() >= 200);  // one byte per token, and a newline
  expect({"generate", "--target", kgram(4), "--prompt", "The ", "--keep", "-3"}, 2, "--keep",
         false);
}

void test_bench_prompt_files(void **) {
  const std::string bad = g_dir + "/bad.jsonl", good = g_dir + "/good.jsonl",
                    chart = g_dir + "/chart.png";
  // Malformed lines: exit 1 and the file and line number in the message.
  write_file(bad, "{\"prompt\": \"one\"}\n\n{\"prompt\": \"two\",}\n");
  expect({"bench", "--target", kgram(3), "--prompts", bad}, 1, bad + ":3: not valid JSON", false);
  write_file(bad, "{\"prompt\": \"one\"}\n[\"two\"]\n");
  expect({"bench", "--target", kgram(3), "--prompts", bad}, 1, bad + ":2: not a JSON object",
         false);
  write_file(bad, "{\"text\": \"one\"}\n");
  expect({"bench", "--target", kgram(3), "--prompts", bad}, 1, bad + ":1: no \"prompt\" string",
         false);
  expect({"bench", "--target", kgram(3), "--prompts", g_dir + "/missing.jsonl"}, 1,
         "cannot read " + g_dir + "/missing.jsonl", false);
  // A good file (escapes, other keys, a blank line), two drafters, a chart.
  write_file(good,
             "{\"id\": 1, \"prompt\": \"The target\\u0020scores\"}\n\n"
             "{\"prompt\": \"The drafter \\\"proposes\\\"\", \"id\": 2}\n"
             "this line is past --limit and never read\n");
  const Result r = run({"bench", "--target=" + kgram(4), "--prompts=" + good, "--drafter=ngram",
                        "--drafter", kgram(2), "-n", "8", "--limit=2", "--chart=" + chart});
  if (r.status != 0) print_error("%s\n", r.err.c_str());
  assert_int_equal(r.status, 0);
  assert_true(r.out.find("| plain | greedy |") != std::string::npos);
  assert_true(r.out.find("| ngram | greedy |") != std::string::npos);
  assert_true(r.out.find("| kgram:path=train.txt,k=2 | greedy |") != std::string::npos);
  assert_true(r.err.find("2 prompts x 3 configurations") != std::string::npos);
  const std::string png = read_all(chart);
  assert_true(png.size() > 8 && png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  // --batch: the prompts two at a time and one at a time on shares of the target, each
  // configuration's texts equal to plain decoding's.
  const Result b =
      run({"bench", "--target", kgram(4), "--prompts", good, "--drafter", "ngram", "-n", "8",
           "--limit", "2", "--batch", "1", "--batch", "2", "--prefill-chunk", "1"});
  if (b.status != 0) print_error("%s\n", b.err.c_str());
  assert_int_equal(b.status, 0);
  assert_true(b.out.find("| plain | greedy | 2 |") != std::string::npos);
  assert_true(b.out.find("| ngram | greedy | 2 |") != std::string::npos);
  assert_true(b.out.find("2/2 |") != std::string::npos &&
              b.out.find("1/2 |") == std::string::npos && b.out.find("0/2 |") == std::string::npos);
  expect({"bench", "--target", kgram(4), "--prompts", good, "--batch", "0"}, 2, "--batch", false);
  // A chart that cannot be written: exit 1, the path named.
  expect({"bench", "--target", kgram(4), "--prompts", good, "-n", "2", "--limit", "1", "--chart",
          g_dir + "/no/such/dir/c.png"},
         1, g_dir + "/no/such/dir/c.png", false);
}

// A markdown table's cells, the first row the header (the --- row left out); other lines skipped.
std::vector<std::vector<std::string>> table_rows(const std::string &text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.size() < 2 || line[0] != '|' || line.compare(0, 5, "| ---") == 0) continue;
    std::vector<std::string> cells;
    size_t at = 1;
    for (size_t bar; (bar = line.find('|', at)) != std::string::npos; at = bar + 1) {
      std::string cell = line.substr(at, bar - at);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
    }
    rows.push_back(cells);
  }
  return rows;
}

// Half a unit of the last printed digit of "24.13" or "1.80x".
double half_unit(const std::string &number) {
  const size_t dot = number.find('.');
  int decimals = 0;
  for (size_t i = dot + 1; dot != std::string::npos && i < number.size(); ++i)
    decimals += number[i] >= '0' && number[i] <= '9';
  double h = 0.5;
  while (decimals-- > 0) h /= 10;
  return h;
}

// Whether the printed ratio is num / den for some true values that print as num and den.
bool ratio_agrees(const std::string &ratio, const std::string &num, const std::string &den) {
  const double r = std::atof(ratio.c_str()), n = std::atof(num.c_str()), d = std::atof(den.c_str());
  const double hr = half_unit(ratio), hn = half_unit(num), hd = half_unit(den);
  if (d - hd <= 0) return false;
  return r >= (n - hn) / (d + hd) - hr - 1e-9 && r <= (n + hn) / (d - hd) + hr + 1e-9;
}

// The index of the header cell that starts with `name`; fails when there is none.
size_t column(const std::vector<std::string> &header, const std::string &name) {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i].compare(0, name.size(), name) == 0) return i;
  print_error("no column '%s'\n", name.c_str());
  fail();
  return 0;
}

// Fails unless every ratio in column `ratio_col` of the table is the row's tokens/s over the
// tokens/s of the row that plain_for(row) picks.
template <typename PlainFor>
void expect_ratios(const std::string &out, const std::vector<std::vector<std::string>> &rows,
                   size_t ratio_col, PlainFor plain_for) {
  const size_t tps = column(rows[0], "tokens/s");
  for (size_t i = 1; i < rows.size(); ++i) {
    const std::vector<std::string> *plain = plain_for(rows[i]);
    if (!plain || !ratio_agrees(rows[i][ratio_col], rows[i][tps], (*plain)[tps])) {
      print_error("row %zu: %s is not %s / %s\n%s\n", i, rows[i][ratio_col].c_str(),
                  rows[i][tps].c_str(), plain ? (*plain)[tps].c_str() : "(no plain row)",
                  out.c_str());
      fail();
    }
  }
}

void test_bench_tables_add_up(void **) {
  // The check itself: the demo table that asked for this test did not add up.
  assert_false(ratio_agrees("1.80x", "35.01", "24.13"));
  assert_true(ratio_agrees("1.45x", "35.01", "24.13"));
  assert_true(ratio_agrees("2.00x", "10.00", "5.00"));

  const std::string prompts = g_dir + "/tables.jsonl";
  write_file(prompts, "{\"prompt\": \"The target\"}\n{\"prompt\": \"The drafter\"}\n");
  // Sequential: each speedup against the plain row of its coupler.
  const Result r =
      run({"bench", "--target", kgram(4), "--prompts", prompts, "--drafter", "ngram", "--drafter",
           kgram(2), "--coupler", "greedy", "--coupler", "rejection", "-n", "32"});
  if (r.status != 0) print_error("%s\n", r.err.c_str());
  assert_int_equal(r.status, 0);
  const auto rows = table_rows(r.out);
  assert_int_equal(rows.size(), 1 + 6);
  const size_t config = column(rows[0], "configuration"), coupler = column(rows[0], "coupler");
  expect_ratios(r.out, rows, column(rows[0], "speedup"), [&](const std::vector<std::string> &row) {
    for (const auto &p : rows)
      if (p[config] == "plain" && p[coupler] == row[coupler]) return &p;
    return static_cast<const std::vector<std::string> *>(nullptr);
  });
  // --batch, two runs: the median tokens/s against plain at the smallest batch, and at the row's
  // own batch; each run's own ratio beside them.
  const Result b = run({"bench", "--target", kgram(4), "--prompts", prompts, "--drafter", "ngram",
                        "-n", "32", "--batch", "2", "--batch", "1", "--runs", "2"});
  if (b.status != 0) print_error("%s\n", b.err.c_str());
  assert_int_equal(b.status, 0);
  const auto brows = table_rows(b.out);
  assert_int_equal(brows.size(), 1 + 4);
  const size_t bconfig = column(brows[0], "configuration"), batch = column(brows[0], "batch");
  const size_t vs_smallest = column(brows[0], "vs plain at batch ");
  assert_string_equal(brows[0][vs_smallest].c_str(), "vs plain at batch 1");
  const auto plain_at = [&](const std::string &n) {
    for (const auto &p : brows)
      if (p[bconfig] == "plain" && p[batch] == n) return &p;
    return static_cast<const std::vector<std::string> *>(nullptr);
  };
  expect_ratios(b.out, brows, vs_smallest,
                [&](const std::vector<std::string> &) { return plain_at("1"); });
  expect_ratios(b.out, brows, column(brows[0], "x of plain at this batch"),
                [&](const std::vector<std::string> &row) { return plain_at(row[batch]); });
  // What each run drafted per session and step, and its pass time beside the predicted one.
  const size_t drafts = column(brows[0], "draft/session/step");
  const size_t each = column(brows[0], "x of plain at this batch, each run");
  const size_t same = column(brows[0], "identical to plain");
  for (size_t i = 1; i < brows.size(); ++i) {
    const auto &row = brows[i];
    if (row[bconfig] == "plain") {
      assert_string_equal(row[drafts].c_str(), "0.00");
      assert_string_equal(row[each].c_str(), "1.00 / 1.00");
    }
    assert_string_equal(row[same].c_str(), "4/4");  // two prompts, two runs
  }
  assert_true(b.err.find("bench: run 2/2, ngram, batch 1: ") != std::string::npos);
  // --runs repeats the batched rows only.
  const Result lone = run({"bench", "--target", kgram(4), "--prompts", prompts, "--runs", "2"});
  assert_int_equal(lone.status, 2);
  assert_true(lone.err.find("--runs needs --batch") != std::string::npos);
  assert_true(b.err.find("per step: ") != std::string::npos &&
              b.err.find("allowed per session, pass ") != std::string::npos);
}

void test_sketch_eval_synthetic(void **) {
  const std::string prefix = g_dir + "/se";
  const Result r = run({"sketch-eval", "--nnz=100", "--storage", "10:20:10", "--trials", "2",
                        "--overlaps", "0.5", "--methods=jl,priority", "--png", prefix});
  if (r.status != 0) print_error("%s\n", r.err.c_str());
  assert_int_equal(r.status, 0);
  assert_true(r.out.find("overlap 50%") != std::string::npos);
  const std::string png = read_all(prefix + "-overlap-50.png");
  assert_true(png.size() > 8 && png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  // --no-png writes none.
  const Result quiet = run({"sketch-eval", "--nnz", "100", "--storage=10:10:1", "--trials=1",
                            "--overlaps=1", "--no-png"});
  assert_int_equal(quiet.status, 0);
  assert_true(quiet.out.find("chart:") == std::string::npos);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_option_forms),
      cmocka_unit_test(test_generate_stop),
      cmocka_unit_test(test_generate_context_shift),
      cmocka_unit_test(test_generate_constraints),
      cmocka_unit_test(test_bench_prompt_files),
      cmocka_unit_test(test_bench_tables_add_up),
      cmocka_unit_test(test_sketch_eval_synthetic),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
