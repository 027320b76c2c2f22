// specinfer perplexity: a target's perplexity on a text, computed the way llama.cpp's
// llama-perplexity computes it, so that the two implementations' numbers compare directly; and,
// against a reference run's saved log-probabilities (llama-perplexity's --kl-divergence-base file
// format, written by either tool), the mean KL divergence and top-1 agreement. Logits come from
// the public ABI (specinfer_target_eval).
//
// The rules (those of llama-perplexity): the text is tokenized once, with bos when the model adds
// one; it is cut into non-overlapping chunks of --ctx tokens (the tail that does not fill a chunk
// is dropped); each chunk is scored from an empty cache, its first token replaced by bos when the
// model adds one; the logits of positions ctx/2 .. ctx-2 score the tokens after them, so each
// chunk contributes ctx - ctx/2 - 1 predictions, every one with at least ctx/2 tokens of context.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_options.h"
#include "clock_text.h"
#include "commands.h"
#include "specinfer.h"

namespace {

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};

struct PerplexityOptions {
  std::string target, file, kl_base;
  bool kl = false;
  int32_t ctx = 512, batch = 0, chunks = -1, threads = 0;
};

// One row's log-softmax summary: the log of the normalizer (max + log of the sum of exponentials,
// the sum taken in double as llama-perplexity does) and the first index of the largest logit.
struct RowNorm {
  double log_z;
  float max;
  int32_t argmax;
};

RowNorm normalize(const float *logits, int32_t vocab) {
  float max = logits[0];
  int32_t argmax = 0;
  for (int32_t i = 1; i < vocab; ++i)
    if (logits[i] > max) {
      max = logits[i];
      argmax = i;
    }
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  return {double(max) + std::log(sum), max, argmax};
}

// Mean of n values from their sum and sum of squares, and the standard error of that mean (0 for
// ten values or fewer, as llama-perplexity reports it).
struct MeanErr {
  double mean, err;
};
MeanErr mean_err(double sum, double sum2, int64_t n) {
  if (n < 1) return {0, 0};
  const double mean = sum / double(n);
  const double var = sum2 / double(n) - mean * mean;
  return {mean, var > 0 && n > 10 ? std::sqrt(var / double(n - 1)) : 0};
}

// Width of one saved row in uint16 units: two floats (scale, least log-probability), then one
// value per id, padded to an even count.
int64_t row_width(int32_t vocab) {
  return 2 * ((int64_t(vocab) + 1) / 2) + 4;
}

// A row's log-probabilities in 16 bits, in the layout of llama-perplexity's base files: values
// more than 16 nats below the largest logit are clamped to the floor, the rest mapped linearly
// onto 0 .. 65535 above it.
void quantize_row(const float *logits, int32_t vocab, const RowNorm &norm, uint16_t *out) {
  float lo = logits[0];
  for (int32_t i = 1; i < vocab; ++i) lo = std::min(lo, logits[i]);
  lo = std::max(lo, norm.max - 16.0f);
  const float log_sum = float(norm.log_z - double(norm.max));
  const float floor_logprob = lo - norm.max - log_sum;
  const float scale = (norm.max - lo) / 65535.0f;
  std::memcpy(out, &scale, sizeof scale);
  std::memcpy(out + 2, &floor_logprob, sizeof floor_logprob);
  uint16_t *q = out + 4;
  std::fill(q, q + (row_width(vocab) - 4), uint16_t{0});
  if (scale == 0) return;
  const float inv = 1.0f / scale;
  for (int32_t i = 0; i < vocab; ++i)
    if (logits[i] > lo) q[i] = static_cast<uint16_t>(std::lround(inv * (logits[i] - lo)));
}

// Running sums over the scored predictions.
struct Totals {
  int64_t count = 0;
  double nll = 0, nll2 = 0;
  // against a base run
  double nll_base = 0, nll_base2 = 0, nll_cross = 0, kld = 0, kld2 = 0;
  int64_t same_top = 0;
  std::vector<float> kld_values;
};

// Compares one of our rows with a base row and adds to the totals.
void add_kl_row(const float *logits, int32_t vocab, const RowNorm &norm, const uint16_t *base,
                int32_t next, Totals *t) {
  float scale, floor_logprob;
  std::memcpy(&scale, base, sizeof scale);
  std::memcpy(&floor_logprob, base + 2, sizeof floor_logprob);
  const uint16_t *q = base + 4;
  const double nll = norm.log_z - logits[next];
  const double nll_base = -(double(scale) * q[next] + floor_logprob);
  t->nll += nll;
  t->nll2 += nll * nll;
  t->nll_base += nll_base;
  t->nll_base2 += nll_base * nll_base;
  t->nll_cross += nll * nll_base;
  double kld = 0;
  float best = 0;
  int32_t best_id = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float lp_base = scale * q[i] + floor_logprob;
    if (i == 0 || lp_base > best) {
      best = lp_base;
      best_id = i;
    }
    // Ids the base gave less than e^-16 add (almost) nothing; llama-perplexity skips them too.
    if (lp_base > -16.0f) kld += std::exp(lp_base) * (lp_base - (logits[i] - norm.log_z));
  }
  t->kld += kld;
  t->kld2 += kld * kld;
  t->kld_values.push_back(float(kld));
  t->same_top += best_id == norm.argmax;
  ++t->count;
}

// Chunks done, tokens per second, time left and the running perplexity: one line rewritten in
// place on a terminal, a line every ten seconds otherwise.
struct Progress {
  using Clock = std::chrono::steady_clock;
  bool tty = isatty(fileno(stderr)) != 0;
  Clock::time_point start = Clock::now(), last{};
  bool open = false;

  void update(int32_t done, int32_t total, int64_t tokens, double ppl) {
    const auto now = Clock::now();
    const bool end = done >= total;
    if (!end && done > 0 && std::chrono::duration<double>(now - last).count() < (tty ? 0.2 : 10))
      return;
    last = now;
    const double elapsed = std::chrono::duration<double>(now - start).count();
    const double frac = total > 0 ? double(done) / double(total) : 1;
    constexpr int kWidth = 24;
    std::string bar(static_cast<size_t>(frac * kWidth), '#');
    bar.resize(kWidth, '.');
    char buf[160];
    std::snprintf(buf, sizeof buf, "  chunks [%s] %d/%d  %.0f tok/s  ppl %.4f  %s left",
                  bar.c_str(), done, total, elapsed > 0 ? double(tokens) / elapsed : 0.0, ppl,
                  cli::clock_text(done > 0 ? elapsed * (1 - frac) / frac : NAN).c_str());
    std::fprintf(stderr, tty ? "\r%s\033[K" : "%s\n", buf);
    open = tty;
    if (end && open) {
      std::fputc('\n', stderr);
      open = false;
    }
  }
};

bool read_text(const std::string &path, std::string *out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

bool tokenize(specinfer_target *target, const std::string &text, std::vector<int32_t> *out) {
  size_t n = 0;
  specinfer_status s =
      specinfer_target_tokenize(target, text.data(), text.size(), 1, 0, nullptr, 0, &n);
  if (s == SPECINFER_ERR_BUFFER_TOO_SMALL) {
    out->resize(n);
    s = specinfer_target_tokenize(target, text.data(), text.size(), 1, 0, out->data(), n, &n);
  }
  if (s != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer perplexity: cannot tokenize: %s\n",
                 specinfer_target_errmsg(target));
    return false;
  }
  out->resize(n);
  return true;
}

// The base file: header, then the rows chunk after chunk.
struct BaseFile {
  std::fstream f;
  int32_t n_ctx = 0, vocab = 0, chunks = 0;
  std::vector<int32_t> tokens;
};

bool open_base(const std::string &path, BaseFile *b) {
  b->f.open(path, std::ios::in | std::ios::binary);
  if (!b->f) {
    std::fprintf(stderr, "specinfer perplexity: cannot read %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  char magic[8];
  b->f.read(magic, 8);
  b->f.read(reinterpret_cast<char *>(&b->n_ctx), 4);
  b->f.read(reinterpret_cast<char *>(&b->vocab), 4);
  b->f.read(reinterpret_cast<char *>(&b->chunks), 4);
  if (!b->f || std::memcmp(magic, kMagic, 8) != 0 || b->n_ctx < 4 || b->vocab < 1 ||
      b->chunks < 1) {
    std::fprintf(stderr,
                 "specinfer perplexity: %s is not a log-probability file "
                 "(--kl-divergence-base of llama-perplexity or specinfer perplexity)\n",
                 path.c_str());
    return false;
  }
  b->tokens.resize(size_t(b->n_ctx) * size_t(b->chunks));
  b->f.read(reinterpret_cast<char *>(b->tokens.data()),
            std::streamsize(b->tokens.size() * sizeof(int32_t)));
  if (!b->f) {
    std::fprintf(stderr, "specinfer perplexity: %s ends inside its tokens\n", path.c_str());
    return false;
  }
  return true;
}

// The tokens to score into *tokens and the chunk length into *n_ctx: the base file's with
// --kl-divergence (opened into *base), else the text's; false after printing why not.
bool load_tokens(const PerplexityOptions &o, specinfer_target *target,
                 const specinfer_model_info &info, BaseFile *base, std::vector<int32_t> *tokens,
                 int32_t *n_ctx) {
  const int32_t vocab = info.vocab_size;
  *n_ctx = o.ctx;
  if (o.kl) {
    if (!open_base(o.kl_base, base)) return false;
    if (base->vocab != vocab) {
      std::fprintf(stderr, "specinfer perplexity: %s has a vocabulary of %d ids, the target %d\n",
                   o.kl_base.c_str(), base->vocab, vocab);
      return false;
    }
    *n_ctx = base->n_ctx;
    *tokens = base->tokens;
  }
  if (!o.file.empty()) {
    std::string text;
    if (!read_text(o.file, &text)) {
      std::fprintf(stderr, "specinfer perplexity: cannot read %s: %s\n", o.file.c_str(),
                   std::strerror(errno));
      return false;
    }
    std::vector<int32_t> ours;
    if (!tokenize(target, text, &ours)) return false;
    if (o.kl) {
      // The base run's tokens are scored; say whether our tokenizer gives the same ones.
      size_t i = 0;
      while (i < tokens->size() && i < ours.size() && (*tokens)[i] == ours[i]) ++i;
      if (i == tokens->size())
        std::printf("tokenization: the base file's %zu tokens equal ours\n", tokens->size());
      else
        std::printf("tokenization: ours differs from the base file's from token %zu on\n", i);
    } else {
      *tokens = std::move(ours);
    }
  }
  if (*n_ctx > info.n_ctx) {
    std::fprintf(stderr, "specinfer perplexity: a context of %d exceeds the model's %d\n", *n_ctx,
                 info.n_ctx);
    return false;
  }
  if (int64_t(tokens->size()) < 2 * int64_t(*n_ctx)) {
    std::fprintf(stderr,
                 "specinfer perplexity: the text gives %zu tokens; a context of %d needs at "
                 "least %d\n",
                 tokens->size(), *n_ctx, 2 * *n_ctx);
    return false;
  }
  for (int32_t t : *tokens)
    if (t < 0 || t >= vocab) {
      std::fprintf(stderr, "specinfer perplexity: token %d is outside the vocabulary\n", t);
      return false;
    }
  return true;
}

// How the tokens are cut and scored.
struct Plan {
  int32_t vocab = 0, n_ctx = 0, n_chunk = 0, batch = 0;
  int32_t first = 0;  // the first position whose logits are kept
  int32_t rows = 0;   // positions with logits; the last predicts nothing
  int64_t width = 0;  // of a saved row, in uint16 units
  bool save = false;  // writing a base file
};

Plan make_plan(const PerplexityOptions &o, int32_t vocab, int32_t n_ctx, size_t n_tokens) {
  Plan p;
  p.vocab = vocab;
  p.n_ctx = n_ctx;
  p.n_chunk = static_cast<int32_t>(n_tokens / size_t(n_ctx));
  if (o.chunks > 0) p.n_chunk = std::min(p.n_chunk, o.chunks);
  p.batch = o.batch > 0 ? std::min(o.batch, n_ctx) : n_ctx;
  p.first = n_ctx / 2;
  p.rows = n_ctx - p.first;
  p.width = row_width(vocab);
  p.save = !o.kl_base.empty() && !o.kl;
  return p;
}

// Creates the base file o.kl_base and writes its header and tokens; false after printing why not.
bool open_output(const PerplexityOptions &o, const Plan &p, const std::vector<int32_t> &tokens,
                 std::ofstream *out) {
  out->open(o.kl_base, std::ios::binary | std::ios::trunc);
  if (!*out) {
    std::fprintf(stderr, "specinfer perplexity: cannot write %s: %s\n", o.kl_base.c_str(),
                 std::strerror(errno));
    return false;
  }
  out->write(kMagic, 8);
  out->write(reinterpret_cast<const char *>(&p.n_ctx), 4);
  out->write(reinterpret_cast<const char *>(&p.vocab), 4);
  out->write(reinterpret_cast<const char *>(&p.n_chunk), 4);
  out->write(reinterpret_cast<const char *>(tokens.data()),
             std::streamsize(size_t(p.n_chunk) * size_t(p.n_ctx) * sizeof(int32_t)));
  return true;
}

// Runs one chunk from an empty cache in passes of p.batch tokens, the logits of positions
// p.first .. into logits; false after printing why not.
bool eval_chunk(specinfer_target *target, const Plan &p, const std::vector<int32_t> &chunk,
                std::vector<float> &logits, const Progress &progress) {
  for (int32_t at = 0; at < p.n_ctx; at += p.batch) {
    const int32_t n = std::min(p.batch, p.n_ctx - at);
    specinfer_eval_params ep;
    specinfer_eval_params_init(&ep);
    ep.tokens = chunk.data() + at;
    ep.n_tokens = size_t(n);
    ep.n_past = at;
    ep.n_logits = std::max(0, at + n - std::max(at, p.first));
    ep.logits = logits.data() + size_t(std::max(at, p.first) - p.first) * size_t(p.vocab);
    if (specinfer_target_eval(target, &ep, nullptr) != SPECINFER_OK) {
      if (progress.open) std::fputc('\n', stderr);
      std::fprintf(stderr, "specinfer perplexity: forward pass failed: %s\n",
                   specinfer_target_errmsg(target));
      return false;
    }
  }
  return true;
}

// Adds the predictions of one chunk's rows to *t: against the base rows in rows16 with kl, else
// the negative log-likelihood (and, when saving, the quantized rows into rows16).
void score_rows(const Plan &p, bool kl, const std::vector<int32_t> &chunk,
                const std::vector<float> &logits, std::vector<uint16_t> &rows16, Totals *t) {
  for (int32_t r = 0; r + 1 < p.rows; ++r) {
    const float *row = logits.data() + size_t(r) * size_t(p.vocab);
    const int32_t next = chunk[size_t(p.first + r + 1)];
    const RowNorm norm = normalize(row, p.vocab);
    if (kl) {
      add_kl_row(row, p.vocab, norm, rows16.data() + size_t(r) * size_t(p.width), next, t);
    } else {
      const double nll = norm.log_z - row[next];
      t->nll += nll;
      t->nll2 += nll * nll;
      ++t->count;
      if (p.save) quantize_row(row, p.vocab, norm, rows16.data() + size_t(r) * size_t(p.width));
    }
  }
}

// Scores every chunk into *t; false after printing why not.
bool score_chunks(const PerplexityOptions &o, specinfer_target *target,
                  const specinfer_model_info &info, const Plan &p,
                  const std::vector<int32_t> &tokens, BaseFile *base, std::ofstream *out,
                  Totals *t) {
  std::vector<float> logits(size_t(p.rows) * size_t(p.vocab));
  std::vector<uint16_t> rows16(size_t(p.rows - 1) * size_t(p.width));
  std::vector<int32_t> chunk(static_cast<size_t>(p.n_ctx));
  Progress progress;
  progress.update(0, p.n_chunk, 0, NAN);
  for (int32_t c = 0; c < p.n_chunk; ++c) {
    std::copy_n(tokens.begin() + ptrdiff_t(c) * p.n_ctx, p.n_ctx, chunk.begin());
    if (info.add_bos && info.bos_token >= 0) chunk[0] = info.bos_token;
    if (!eval_chunk(target, p, chunk, logits, progress)) return false;
    if (o.kl) {
      base->f.read(reinterpret_cast<char *>(rows16.data()),
                   std::streamsize(rows16.size() * sizeof(uint16_t)));
      if (!base->f) {
        std::fprintf(stderr, "specinfer perplexity: %s ends inside chunk %d\n", o.kl_base.c_str(),
                     c + 1);
        return false;
      }
    }
    score_rows(p, o.kl, chunk, logits, rows16, t);
    if (p.save)
      out->write(reinterpret_cast<const char *>(rows16.data()),
                 std::streamsize(rows16.size() * sizeof(uint16_t)));
    progress.update(c + 1, p.n_chunk, int64_t(c + 1) * p.n_ctx,
                    std::exp(t->nll / double(t->count)));
  }
  return true;
}

// The perplexity and, with kl, the comparison with the base run, in llama-perplexity's words.
void print_results(const PerplexityOptions &o, const Plan &p, const Totals &t) {
  const MeanErr lp = mean_err(t.nll, t.nll2, t.count);
  const double ppl = std::exp(lp.mean);
  std::printf("scored %lld tokens in %d chunks of %d (ctx %d)\n", (long long)t.count, p.n_chunk,
              p.n_ctx, p.n_ctx);
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * lp.err);
  if (o.kl) {
    const MeanErr lb = mean_err(t.nll_base, t.nll_base2, t.count);
    const double cov =
        t.count > 10 ? (t.nll_cross / double(t.count) - lp.mean * lb.mean) / double(t.count - 1)
                     : 0;
    const double ratio_err = std::sqrt(std::max(0.0, lp.err * lp.err + lb.err * lb.err - 2 * cov));
    const MeanErr kl = mean_err(t.kld, t.kld2, t.count);
    const double top = double(t.same_top) / double(t.count);
    std::vector<float> k = t.kld_values;
    std::sort(k.begin(), k.end());
    auto pct = [&](double q) { return k[size_t(q * double(k.size() - 1))]; };
    std::printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", ppl, ppl * lp.err);
    std::printf("Mean PPL(base)                : %10.6f +/- %10.6f\n", std::exp(lb.mean),
                std::exp(lb.mean) * lb.err);
    std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", lp.mean - lb.mean,
                ratio_err);
    std::printf("Mean KLD                      : %10.6f +/- %10.6f\n", kl.mean, kl.err);
    std::printf("Median KLD                    : %10.6f\n", double(pct(0.5)));
    std::printf("99.0%%   KLD                   : %10.6f\n", double(pct(0.99)));
    std::printf("Maximum KLD                   : %10.6f\n", double(k.back()));
    std::printf("Same top p                    : %6.3f +/- %6.3f %%\n", 100 * top,
                t.count > 1 ? 100 * std::sqrt(top * (1 - top) / double(t.count - 1)) : 0.0);
  }
  if (p.save) std::printf("log-probabilities saved to %s\n", o.kl_base.c_str());
}

// Loads, cuts and scores the tokens with an open target; the exit code.
int score(const PerplexityOptions &o, specinfer_target *target) {
  specinfer_model_info info;
  specinfer_model_info_init(&info);
  specinfer_target_info(target, &info);

  BaseFile base;
  std::vector<int32_t> tokens;
  int32_t n_ctx = 0;
  if (!load_tokens(o, target, info, &base, &tokens, &n_ctx)) return 1;
  const Plan p = make_plan(o, info.vocab_size, n_ctx, tokens.size());
  std::ofstream out;
  if (p.save && !open_output(o, p, tokens, &out)) return 1;
  std::fprintf(stderr,
               "specinfer perplexity: %zu tokens, %d chunks of %d, passes of %d tokens, bos %s\n",
               tokens.size(), p.n_chunk, p.n_ctx, p.batch, info.add_bos ? "first" : "none");
  Totals t;
  if (!score_chunks(o, target, info, p, tokens, &base, &out, &t)) return 1;
  if (p.save && !out.flush()) {
    std::fprintf(stderr, "specinfer perplexity: cannot write %s\n", o.kl_base.c_str());
    return 1;
  }
  print_results(o, p, t);
  return 0;
}

int run(const PerplexityOptions &o) {
  cli::RunOptions ro;
  ro.threads = o.threads;
  specinfer_registry *reg = cli::create_registry(ro, "specinfer perplexity");
  if (!reg) return 1;
  specinfer_target *target = nullptr;
  char *err = nullptr;
  if (cli::open_target(reg, o.target, &target, &err) != SPECINFER_OK) {
    std::fprintf(stderr, "specinfer perplexity: cannot open target: %s\n", err);
    specinfer_free(err);
    specinfer_registry_destroy(reg);
    return 1;
  }
  const int rc = score(o, target);
  specinfer_target_destroy(target);
  specinfer_registry_destroy(reg);
  return rc;
}

}  // namespace

int cmd_perplexity(int argc, char **argv) {
  cli::App app{
      "Perplexity of a target on a text, computed as llama.cpp's llama-perplexity computes it: "
      "non-overlapping chunks of --ctx tokens, each starting from an empty cache (its first token "
      "bos when the model adds one), the second half of each chunk scored. With "
      "--kl-divergence-base FILE alone, the log-probabilities of every scored position are "
      "saved to FILE (llama-perplexity's format); with --kl-divergence too, the tokens of FILE "
      "are scored and compared with it: mean KL divergence and top-1 agreement.",
      "specinfer perplexity"};
  PerplexityOptions o;
  app.add_option("--target", o.target, "target, e.g. gguf:path=model.gguf")
      ->type_name(cli::kSpec)
      ->required();
  app.add_option("-f,--file", o.file, "the text to score")->type_name("FILE");
  cli::add_number(app, "-c,--ctx", o.ctx, "tokens per chunk", "N", int32_t{8}, int32_t{1 << 20});
  cli::add_number(app, "-b,--batch", o.batch, "tokens per forward pass (0: a whole chunk)", "N",
                  int32_t{0}, int32_t{1 << 20});
  cli::add_number(app, "--chunks", o.chunks, "score at most N chunks (-1: all)", "N", int32_t{-1},
                  int32_t{1 << 30});
  app.add_option("--kl-divergence-base", o.kl_base,
                 "log-probability file: written by this run, or with --kl-divergence read")
      ->type_name("FILE");
  app.add_flag("--kl-divergence", o.kl,
               "compare with the run saved in --kl-divergence-base (its tokens are scored; "
               "--file, if given, only checks the tokenization)");
  cli::add_number(app, "-t,--threads", o.threads, "backend threads (0: all cores)", "N", int32_t{0},
                  int32_t{4096});
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  if (o.kl && o.kl_base.empty())
    return cli::usage_error(app, "--kl-divergence needs --kl-divergence-base FILE");
  if (o.kl && app.count("--ctx"))
    return cli::usage_error(app, "--ctx is the base file's with --kl-divergence");
  if (!o.kl && o.file.empty()) return cli::usage_error(app, "--file is required");
  return run(o);
}
