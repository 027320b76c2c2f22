// The pieces of Medusa head training (train.h describes the method) that its stages share: the
// options, the corpus plan, the collected data, the heads' trainer and the small utilities. The
// stages: train_collect.cpp (the corpus plan and the target's pass over it), train_optimizer.cpp
// (minibatch AdamW), train_eval.cpp (held-out accuracy), train_checkpoint.cpp (the optimizer's
// checkpoint file) and train.cpp (the run from options to the heads file, heads.cpp's format).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../../common/splitmix64.h"
#include "../common/plugin_config.h"
#include "../common/plugin_error.h"
#include "heads.h"
#include "specinfer_plugin.h"

namespace medusa::train_detail {

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;
using specinfer_plugin::fail;
using specinfer_plugin::Failure;
using specinfer_plugin::format;

constexpr int kTop = 8;            // target probabilities kept per position
constexpr int kMinDocTokens = 32;  // shorter windows (near-empty files) are skipped
constexpr int kBytesPerToken = 5;  // a window's bytes per wanted token (code: ~3.5 per token)
// Training positions of the probe that measures training's cost (measure_training): 16 minibatches
// of the default size, a few seconds.
constexpr int64_t kProbeTokens = 2048;

// The config keys of train.h.
struct Options {
  int32_t heads = 2;
  int64_t tokens = 196608;
  int64_t heldout = 4096;
  int32_t vocab = 8192;
  int32_t epochs = 2;
  double minutes = 15;
  double lr = 1e-3;
  double wd = 0.1;
  double warmup = 0.05;
  double offpath = 1.0;
  int32_t rank = 0;
  int32_t token = 1;
  int32_t batch = 128;
  int32_t chunk = 512;
  uint64_t seed = 1;
  bool resume = true;
  bool keep_data = true;
};

// ---- small utilities ------------------------------------------------------------------------

// splitmix64: a fixed generator, so that plans and shuffles are the same on every platform.
struct Rng : specinfer::SplitMix64 {
  explicit Rng(uint64_t seed) : SplitMix64{seed} {}
  template <typename T>
  void shuffle(std::vector<T> &v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(below(i))]);
  }
};

inline uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const auto *p = static_cast<const uint8_t *>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
template <typename T>
uint64_t fnv_value(uint64_t h, const T &v) {
  return fnv1a(h, &v, sizeof v);
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Context {
 public:
  Context(const specinfer_host *host, const specinfer_train_params *params)
      : host_(host), params_(params) {}

  void log(int32_t level, const std::string &msg) const {
    if (host_ && host_->log) host_->log(host_, level, ("medusa: " + msg).c_str());
  }

  // Reports progress; throws CANCELLED when the callback asks to stop.
  void progress(const char *stage, int64_t done, int64_t total, double loss,
                const std::vector<float> *acc) const {
    if (!params_->progress) return;
    specinfer_train_progress p{};
    p.struct_size = sizeof p;
    p.stage = stage;
    p.done = done;
    p.total = total;
    p.loss = loss;
    p.n_heads = acc ? static_cast<int32_t>(acc->size()) : 0;
    p.accuracy = acc ? acc->data() : nullptr;
    if (params_->progress(params_->user, &p) != 0)
      fail(SPECINFER_ERR_CANCELLED, "medusa: training cancelled (during %s)", stage);
  }

  const specinfer_host *host() const { return host_; }

 private:
  const specinfer_host *host_;
  const specinfer_train_params *params_;
};

// Runs fn(i) for i in [0, n) on the host's threads (inline without parallel_for); the first
// failure is rethrown here (nothing is thrown across the host's threads).
template <typename Fn>
void parallel(const specinfer_host *host, int64_t n, Fn &&fn) {
  struct Ctx {
    Fn *fn = nullptr;
    std::atomic<bool> failed{false};
    specinfer_status code = SPECINFER_OK;
    specinfer_plugin_error err{};
  } ctx;
  ctx.fn = &fn;
  auto body = [](void *p, int64_t b, int64_t e) {
    auto *c = static_cast<Ctx *>(p);
    for (int64_t i = b; i < e; ++i) {
      specinfer_plugin_error err{};
      specinfer_status rc = specinfer_plugin::guarded(&err, "medusa", [&] { (*c->fn)(i); });
      if (rc != SPECINFER_OK && !c->failed.exchange(true)) {
        c->code = rc;
        c->err = err;
      }
    }
  };
  if (host && host->parallel_for)
    host->parallel_for(host, n, 1, body, &ctx);
  else
    body(&ctx, 0, n);
  if (ctx.failed) throw Failure(ctx.code, ctx.err.message);
}

// ---- the corpus plan and the collected data (train_collect.cpp) -----------------------------

struct Doc {
  std::vector<int32_t> tokens;
};

struct Plan {
  std::vector<Doc> docs;  // held-out documents first
  size_t n_heldout_docs = 0;
  int64_t n_heldout = 0, n_tokens = 0;
};

struct Data {
  int32_t H = 0;
  int64_t n = 0;                 // positions
  int64_t n_heldout = 0;         // positions [0, n_heldout) are held out
  std::vector<int32_t> token;    // [n] the text
  std::vector<int64_t> end;      // [n] one past the last position of the position's document
  std::vector<uint16_t> hidden;  // [n][H] f16
  std::vector<int32_t> top_id;   // [n][kTop] the target's most probable next tokens, best first
  std::vector<float> top_p;      // [n][kTop] their probabilities
};

inline void check_target(specinfer_status rc, const specinfer_plugin_error &e, const char *what) {
  if (rc != SPECINFER_OK)
    throw Failure(rc, std::string("medusa: the target's ") + what + " failed: " + e.message);
}

// What training costs on this machine (measure_training): seconds that do not grow with the data
// (preparation, every evaluation on the held-out documents) and seconds per training token (all
// epochs).
struct TrainCost {
  double fixed = 0, per_token = 0;
};

// The share of the budget the estimate may fill: the rest covers the estimate's error and what
// the caller spent before the run (loading the target).
constexpr double kBudgetShare = 0.98;

// The time budget of a run (Options::minutes): collection stops before the document whose pass,
// added to the time spent and to training's cost on everything collected, would end past
// kBudgetShare of it. Training's cost is measured once, when the held-out documents and one to
// train on are in.
struct Budget {
  double start = 0;    // now_seconds() at the run's start
  double seconds = 0;  // the whole run's budget; 0 = none
  std::function<TrainCost(const Data &)> measure;
};

// The documents of the corpus, held-out ones first (train.h, step 1).
Plan plan_corpus(const Options &o, const specinfer_model_info &info, const specinfer_host_target &t,
                 const specinfer_train_params &p);

// The target's pass over the plan's documents (train.h, step 2), resuming from the data cache at
// cache_path. Collection stops before the document that would end the run past the budget
// (Budget), once every held-out document and at least one to train on are in; `plan` keeps the
// documents collected.
Data collect(const Context &cx, const Options &o, Plan &plan, const specinfer_model_info &info,
             const specinfer_host_target &t, const TargetIdentity &id,
             const std::string &cache_path, const Budget &budget);

// ---- what the heads train against -----------------------------------------------------------

// The heads' token input: for every token of the corpus, the target's output row scaled as
// token_row() does, kept once per distinct token.
struct TokenInput {
  int32_t H = 0;
  std::vector<int32_t> slot;  // [target vocabulary] row index, -1 if the token is not in the corpus
  std::vector<float> rows;    // [distinct tokens][H]

  void row(int32_t token, float *dst) const {
    const float *src = rows.data() + static_cast<size_t>(slot[static_cast<size_t>(token)]) * H;
    std::copy(src, src + H, dst);
  }

  static TokenInput make(const Data &data, int32_t vocab_size,
                         const specinfer_host_target &target) {
    TokenInput t;
    t.H = data.H;
    t.slot.assign(static_cast<size_t>(vocab_size), -1);
    std::vector<int32_t> ids;
    for (int32_t tok : data.token)
      if (t.slot[static_cast<size_t>(tok)] < 0) {
        t.slot[static_cast<size_t>(tok)] = static_cast<int32_t>(ids.size());
        ids.push_back(tok);
      }
    t.rows.resize(ids.size() * static_cast<size_t>(t.H));
    specinfer_plugin_error e{};
    check_target(target.vtable->output_rows(target.self, ids.data(),
                                            static_cast<int32_t>(ids.size()), t.rows.data(), &e),
                 e, "output_rows");
    for (size_t i = 0; i < ids.size(); ++i)
      token_row(t.rows.data() + i * static_cast<size_t>(t.H), t.H);
    return t;
  }
};

// Per position: the target's distribution there restricted to the vocabulary (indices into it,
// renormalized; -1 = none) and the vocabulary index of its top-1 (-1 if outside).
struct Labels {
  std::vector<int32_t> idx;  // [n][kTop]
  std::vector<float> q;      // [n][kTop]
  std::vector<int32_t> top;  // [n]
  bool any(int64_t g) const { return idx[static_cast<size_t>(g) * kTop] >= 0; }
};

// ---- the heads and their training (train_optimizer.cpp, train_eval.cpp) ---------------------

inline float silu(float z) {
  return z / (1.0f + std::exp(-z));
}

// A trained tensor: values, gradient and AdamW moments.
struct Param {
  std::vector<float> p, g, m, v;
  bool decay = true;  // weight decay applies (matrices, not biases)
  void init(size_t n, bool with_decay) {
    p.assign(n, 0.0f);
    g.assign(n, 0.0f);
    m.assign(n, 0.0f);
    v.assign(n, 0.0f);
    decay = with_decay;
  }
};

// One head's parameters, optimizer state and scratch. Full rank: W (w). Low rank r: W = A B with
// A [H][r] (a, from zero) and B [r][H] (bm, small random), so the head still starts at zero.
struct Head {
  Param w, b, a, bm;
  std::vector<Param *> params;  // the ones trained
  std::vector<float> z, y, logits, dy, t, dt, weight;
  std::vector<float> x;  // [batch][input]: the head's inputs
  double loss_sum = 0;
  int64_t loss_n = 0;
};

class Trainer {
 public:
  // emb: the heads' token input (TokenInput), empty without one. Trains on at most max_train
  // positions (the first ones).
  Trainer(const Context &cx, const Options &o, const Data &data, const Labels &labels,
          const std::vector<float> &u, int32_t V, const TokenInput &emb,
          int64_t max_train = std::numeric_limits<int64_t>::max());

  int64_t steps_per_epoch() const {
    return (static_cast<int64_t>(train_pos_.size()) + o_.batch - 1) / o_.batch;
  }
  int64_t train_tokens() const { return static_cast<int64_t>(train_pos_.size()); }
  std::vector<Head> &heads() { return heads_; }
  int64_t &step() { return step_; }
  // W of head k as [H][D] (D = input_size()).
  void head_matrix(size_t k, float *w) const { matrix(heads_[k], w); }
  int32_t input_size() const { return D_; }

  // One epoch (index e) of minibatch AdamW steps; returns the epoch's mean training loss.
  double epoch(int32_t e);

  struct Eval {
    std::vector<float> accuracy;  // [K][kRanks], on greedy-path positions
    std::vector<float> top1;      // [K] = accuracy[k][0]
    std::vector<float> top1_all;  // [K] top-1 agreement on every position
    std::vector<int64_t> n_path;  // [K] greedy-path positions
    double loss = NAN;            // held-out cross-entropy, every position
  };

  // Every head on the held-out documents (train.h, step 5); train_eval.cpp.
  Eval evaluate();

 private:
  // Every head's inputs at positions pos[0..nb): the hidden state h at g, then the token input:
  // token=1, e(token g + 1) (the token h chose); token=2, head k reads e(token g + k) and
  // e(token g + k + 1), the last two tokens of the path before the one it predicts (zeros past
  // the document's end, where no label is either).
  void load_x(const int64_t *pos, size_t nb);

  // Whether the text at g follows the target's greedy path for head k: tokens g+1 .. g+k+1 were
  // each the target's top-1 at the position before.
  bool on_path(int64_t g, int64_t k) const;

  // Head k on the batch: z = x W^T + b, y = h + silu(z) (h the first H values of x),
  // logits = y U^T, then softmax in place;
  // with `grad`, replaced by d(loss)/d(logits) = (softmax - labels) * weight / total weight. Adds
  // the (unweighted) loss to h.loss_*.
  void forward(Head &h, int32_t k, const int64_t *pos, size_t nb, bool grad);

  void backward_and_update(Head &h, size_t nb, double lr);

  // W of head k as [H][D] (low rank: A B).
  void matrix(const Head &h, float *w) const;

  void adamw(Param &p, double lr) const;

  const Context &cx_;
  const Options &o_;
  const Data &data_;
  const Labels &lab_;
  const std::vector<float> &u_;
  const TokenInput &emb_;
  const int32_t H_, D_, V_, K_;
  void (*const softmax_)(float *, int64_t);
  std::vector<Head> heads_;
  std::vector<int64_t> train_pos_, eval_pos_;
  int64_t step_ = 0;
};

// ---- checkpoints (train_checkpoint.cpp) -----------------------------------------------------

// The checkpoint's key: everything the training's result depends on.
uint64_t checkpoint_key(const Options &o, const Data &data, const std::vector<int32_t> &vocab,
                        uint64_t fingerprint);
// Writes the heads and their optimizer state after epochs_done epochs (step steps) to path.
void save_checkpoint(const std::string &path, uint64_t key, int32_t epochs_done, int64_t step,
                     const std::vector<Head> &heads, int32_t H);
// Loads a checkpoint with this key into `heads`; returns the epochs it had finished (0 if none).
int32_t load_checkpoint(const std::string &path, uint64_t key, std::vector<Head> &heads, int32_t H,
                        int64_t &step);

}  // namespace medusa::train_detail
