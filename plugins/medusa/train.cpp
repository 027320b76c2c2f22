// Medusa head training (see train.h for the method and the config keys).
#include "train.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "train_internal.h"

namespace medusa::train_detail {
namespace {

Options parse_options(const char *text, const specinfer_model_info &info) {
  Config cfg(text, {"heads", "tokens", "heldout", "vocab", "epochs", "lr", "wd", "batch", "warmup",
                    "chunk", "seed", "resume", "keep_data", "offpath", "rank", "token", "minutes"});
  Options o;
  o.heads = static_cast<int32_t>(cfg.get_int("heads", o.heads, 1, 16));
  o.tokens = cfg.get_int("tokens", o.tokens, 512, int64_t(1) << 34);
  o.heldout = cfg.get_int("heldout", std::min<int64_t>(o.heldout, o.tokens / 8), 64, o.tokens / 2);
  o.vocab = static_cast<int32_t>(
      cfg.get_int("vocab", std::min(o.vocab, info.vocab_size), 16, info.vocab_size));
  o.epochs = static_cast<int32_t>(cfg.get_int("epochs", o.epochs, 1, 1000));
  o.minutes = cfg.get_float("minutes", o.minutes, 0.0, 1e6);
  o.lr = cfg.get_float("lr", o.lr, 1e-7, 1.0);
  o.wd = cfg.get_float("wd", o.wd, 0.0, 10.0);
  o.batch = static_cast<int32_t>(cfg.get_int("batch", o.batch, 1, 4096));
  o.warmup = cfg.get_float("warmup", o.warmup, 0.0, 0.5);
  o.offpath = cfg.get_float("offpath", o.offpath, 0.0, 1.0);
  o.rank = static_cast<int32_t>(cfg.get_int("rank", 0, 0, 2 * info.hidden_size));
  o.token = static_cast<int32_t>(cfg.get_int("token", o.token, 0, 2));
  o.chunk = static_cast<int32_t>(
      cfg.get_int("chunk", std::min(o.chunk, info.n_ctx), kMinDocTokens, info.n_ctx));
  o.seed = static_cast<uint64_t>(cfg.get_int("seed", 1, 0, std::numeric_limits<long>::max()));
  o.resume = cfg.get_int("resume", 1, 0, 1) != 0;
  o.keep_data = cfg.get_int("keep_data", 1, 0, 1) != 0;
  return o;
}

// ---- vocabulary and labels ------------------------------------------------------------------

// The `n` tokens the target chose most often as its top-1 on the training positions (ties: more
// top-kTop probability mass, then the lower id), sorted by id.
std::vector<int32_t> choose_vocab(const Data &data, int32_t vocab_size, int32_t n) {
  std::vector<double> score(static_cast<size_t>(vocab_size), 0.0);
  for (int64_t g = data.n_heldout; g < data.n; ++g) {
    const int32_t *ids = data.top_id.data() + static_cast<size_t>(g) * kTop;
    const float *ps = data.top_p.data() + static_cast<size_t>(g) * kTop;
    score[static_cast<size_t>(ids[0])] += 1.0;
    // The mass term (< 1 per position) only breaks ties between equal top-1 counts... mostly.
    for (int j = 0; j < kTop; ++j) score[static_cast<size_t>(ids[j])] += 1e-3 * ps[j];
  }
  std::vector<int32_t> order;
  for (int32_t v = 0; v < vocab_size; ++v)
    if (score[static_cast<size_t>(v)] > 0) order.push_back(v);
  const size_t m = std::min(order.size(), static_cast<size_t>(n));
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(m), order.end(),
                    [&](int32_t a, int32_t b) {
                      const double sa = score[static_cast<size_t>(a)],
                                   sb = score[static_cast<size_t>(b)];
                      return sa != sb ? sa > sb : a < b;
                    });
  order.resize(m);
  std::sort(order.begin(), order.end());
  return order;
}

Labels make_labels(const Data &data, const std::vector<int32_t> &vocab, int32_t vocab_size) {
  std::vector<int32_t> index(static_cast<size_t>(vocab_size), -1);
  for (size_t i = 0; i < vocab.size(); ++i)
    index[static_cast<size_t>(vocab[i])] = static_cast<int32_t>(i);
  Labels l;
  l.idx.assign(static_cast<size_t>(data.n) * kTop, -1);
  l.q.assign(static_cast<size_t>(data.n) * kTop, 0.0f);
  l.top.assign(static_cast<size_t>(data.n), -1);
  for (int64_t g = 0; g < data.n; ++g) {
    const size_t o = static_cast<size_t>(g) * kTop;
    l.top[static_cast<size_t>(g)] = index[static_cast<size_t>(data.top_id[o])];
    float sum = 0.0f;
    int m = 0;
    for (int j = 0; j < kTop; ++j) {
      const int32_t vi = index[static_cast<size_t>(data.top_id[o + j])];
      if (vi < 0 || !(data.top_p[o + j] > 0.0f)) continue;
      l.idx[o + m] = vi;
      l.q[o + m] = data.top_p[o + j];
      sum += data.top_p[o + j];
      ++m;
    }
    for (int j = 0; j < m; ++j) l.q[o + j] /= sum;
  }
  return l;
}

// What the heads train against: the vocabulary, the target's output rows for it (U), the labels
// and the token input.
struct Prepared {
  std::vector<int32_t> vocab;
  std::vector<float> u;
  Labels labels;
  TokenInput emb;
};

// pad: fill the vocabulary up to `vocab` tokens with the lowest ids not chosen, so that a probe on
// little data does the work of the whole run's vocabulary.
Prepared prepare(const Options &o, const Data &data, const specinfer_model_info &info,
                 const specinfer_host_target &target, bool pad) {
  Prepared p;
  p.vocab = choose_vocab(data, info.vocab_size, o.vocab);
  if (pad && p.vocab.size() < static_cast<size_t>(o.vocab)) {
    std::vector<bool> in(static_cast<size_t>(info.vocab_size), false);
    for (int32_t v : p.vocab) in[static_cast<size_t>(v)] = true;
    for (int32_t v = 0; v < info.vocab_size && p.vocab.size() < static_cast<size_t>(o.vocab); ++v)
      if (!in[static_cast<size_t>(v)]) p.vocab.push_back(v);
    std::sort(p.vocab.begin(), p.vocab.end());
  }
  const int32_t V = static_cast<int32_t>(p.vocab.size());
  if (V < 2) fail(SPECINFER_ERR_CONFIG, "medusa: the corpus yields a vocabulary of %d tokens", V);
  p.u.resize(static_cast<size_t>(V) * static_cast<size_t>(info.hidden_size));
  specinfer_plugin_error e{};
  check_target(target.vtable->output_rows(target.self, p.vocab.data(), V, p.u.data(), &e), e,
               "output_rows");
  p.labels = make_labels(data, p.vocab, info.vocab_size);
  if (o.token > 0) p.emb = TokenInput::make(data, info.vocab_size, target);
  return p;
}

// Measures training's cost on this machine with the data collected so far (the held-out documents
// and at least one to train on): the preparation, one evaluation and one epoch over at most
// kProbeTokens positions at the run's vocabulary size, scaled to the run's epochs and evaluations
// (one before training, one after each epoch). Progress reports are muted meanwhile.
TrainCost measure_training(const specinfer_host *host, const specinfer_train_params &params,
                           const Options &o, const Data &data, const specinfer_model_info &info,
                           const specinfer_host_target &target) {
  specinfer_train_params quiet = params;
  quiet.progress = nullptr;
  const Context cx(host, &quiet);
  const double t0 = now_seconds();
  const Prepared p = prepare(o, data, info, target, true);
  Trainer tr(cx, o, data, p.labels, p.u, static_cast<int32_t>(p.vocab.size()), p.emb, kProbeTokens);
  const double t1 = now_seconds();
  tr.evaluate();
  const double t2 = now_seconds();
  tr.epoch(0);
  const double t3 = now_seconds();
  TrainCost c;
  c.fixed = (t1 - t0) + (o.epochs + 1) * (t2 - t1);
  c.per_token = o.epochs * (t3 - t2) / static_cast<double>(std::max<int64_t>(1, tr.train_tokens()));
  return c;
}

std::string join_accuracy(const std::vector<float> &a) {
  std::string s;
  for (float x : a) s += format("%s%.3f", s.empty() ? "" : " ", x);
  return s;
}

// How much of the held-out text the vocabulary covers, in the log.
void log_vocabulary(const Context &cx, const Data &data, const Labels &labels, int32_t V) {
  int64_t covered = 0;
  for (int64_t g = 0; g < data.n_heldout; ++g) covered += labels.top[static_cast<size_t>(g)] >= 0;
  cx.log(SPECINFER_LOG_INFO,
         format("vocabulary: %d tokens; they hold the target's top-1 at %.1f%% of held-out "
                "positions",
                V, 100.0 * static_cast<double>(covered) / std::max<int64_t>(1, data.n_heldout)));
}

// Each head's top-1, top-4 and top-16 accuracy on the greedy path, in the log.
void log_accuracy(const Context &cx, const Options &o, const Trainer::Eval &ev) {
  std::string line;
  for (int32_t k = 0; k < o.heads; ++k) {
    float top4 = 0, top16 = 0;
    for (int r = 0; r < kRanks; ++r) {
      const float a = ev.accuracy[static_cast<size_t>(k) * kRanks + r];
      if (r < 4) top4 += a;
      top16 += a;
    }
    line += format("%shead %d: top-1 %.3f, top-4 %.3f, top-16 %.3f (%lld positions)", k ? "; " : "",
                   k + 1, ev.top1[static_cast<size_t>(k)], top4, top16,
                   (long long)ev.n_path[static_cast<size_t>(k)]);
  }
  cx.log(SPECINFER_LOG_INFO, "held-out accuracy on the greedy path: " + line);
}

// The trained heads as the heads file holds them (heads.h), with their held-out accuracy.
Heads export_heads(const Options &o, const TargetIdentity &id, const std::vector<int32_t> &vocab,
                   Trainer &tr, const Trainer::Eval &ev, int32_t H) {
  Heads heads;
  heads.target = id;
  heads.n_heads = o.heads;
  heads.hidden_size = H;
  heads.token_inputs = o.token;
  heads.vocab = vocab;
  const size_t HH = static_cast<size_t>(H) * static_cast<size_t>(tr.input_size());
  heads.w.resize(static_cast<size_t>(o.heads) * HH);
  heads.b.resize(static_cast<size_t>(o.heads) * static_cast<size_t>(H));
  for (int32_t k = 0; k < o.heads; ++k) {
    const Head &h = tr.heads()[static_cast<size_t>(k)];
    tr.head_matrix(static_cast<size_t>(k), heads.w.data() + static_cast<size_t>(k) * HH);
    std::copy(h.b.p.begin(), h.b.p.end(),
              heads.b.begin() + static_cast<ptrdiff_t>(k) * static_cast<ptrdiff_t>(H));
  }
  heads.accuracy = ev.accuracy;
  heads.trained_tokens = tr.train_tokens();
  return heads;
}

// Checks train's arguments; the target's info (info_in when it is whole, else the target's own).
specinfer_model_info checked_target_info(const specinfer_host *host,
                                         const specinfer_train_params *params,
                                         const specinfer_model_info *info_in,
                                         const specinfer_host_target *target) {
  if (!host || !params || !target || !target->vtable)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: NULL argument");
  if (params->struct_size < offsetof(specinfer_train_params, user) + sizeof(params->user))
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: params struct too small");
  if (!params->out_path || !*params->out_path)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: no output path");
  if (params->n_corpus <= 0 || !params->corpus)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "medusa: train: no corpus files");
  if (!host->kernels || !host->kernels->softmax)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the host has no softmax kernel");
  const specinfer_target_vtable *vt = target->vtable;
  if (!vt->info || !vt->tokenize || !vt->forward || !vt->kv_truncate)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the target lacks tokenize, forward or kv_truncate");
  specinfer_model_info info{};
  info.struct_size = sizeof info;
  if (info_in && info_in->struct_size >= sizeof info) {
    info = *info_in;
  } else {
    specinfer_status rc = vt->info(target->self, &info);
    if (rc != SPECINFER_OK) throw Failure(rc, "medusa: the target's info failed");
  }
  return info;
}

void train(const specinfer_host *host, const specinfer_train_params *params,
           const specinfer_model_info *info_in, const specinfer_host_target *target) {
  const specinfer_model_info info = checked_target_info(host, params, info_in, target);
  const double start = now_seconds();
  const Options o = parse_options(params->config, info);
  // Through OpenBLAS from several threads at once (one head each): its own threads would
  // oversubscribe the host's. (The host's backend makes the same process-wide choice.)
  openblas_set_num_threads(1);
  Context cx(host, params);
  const TargetIdentity id = identify_target(info, *target);
  const std::string out = params->out_path;

  Plan plan = plan_corpus(o, info, *target, *params);
  cx.log(SPECINFER_LOG_INFO,
         format("corpus: %zu documents, %lld tokens (%lld held out)", plan.docs.size(),
                (long long)plan.n_tokens, (long long)plan.n_heldout));
  Budget budget;
  budget.start = start;
  budget.seconds = 60.0 * o.minutes;
  budget.measure = [&](const Data &d) {
    return measure_training(host, *params, o, d, info, *target);
  };
  Data data = collect(cx, o, plan, info, *target, id, out + ".data", budget);
  plan.docs.clear();
  plan.docs.shrink_to_fit();

  const Prepared prep = prepare(o, data, info, *target, false);
  const std::vector<int32_t> &vocab = prep.vocab;
  const int32_t V = static_cast<int32_t>(vocab.size());
  const Labels &labels = prep.labels;
  log_vocabulary(cx, data, labels, V);

  Trainer tr(cx, o, data, labels, prep.u, V, prep.emb);
  const std::string ckpt = out + ".ckpt";
  const uint64_t key = checkpoint_key(o, data, vocab, id.fingerprint);
  int32_t done = o.resume ? load_checkpoint(ckpt, key, tr.heads(), data.H, tr.step()) : 0;
  done = std::min(done, o.epochs);
  if (done > 0)
    cx.log(SPECINFER_LOG_INFO, format("resuming after epoch %d from '%s'", done, ckpt.c_str()));

  Trainer::Eval ev = tr.evaluate();
  cx.log(SPECINFER_LOG_INFO,
         format("epoch %d: held-out loss %.4f, top-1 on the greedy path [%s], "
                "on all positions [%s]",
                done, ev.loss, join_accuracy(ev.top1).c_str(), join_accuracy(ev.top1_all).c_str()));
  cx.progress("evaluate", done, o.epochs, NAN, &ev.top1);
  for (int32_t e = done; e < o.epochs; ++e) {
    const double t0 = now_seconds();
    const double loss = tr.epoch(e);
    const double t1 = now_seconds();
    ev = tr.evaluate();
    cx.log(SPECINFER_LOG_INFO,
           format("epoch %d: train loss %.4f (%.1f s), held-out loss %.4f (%.1f s), top-1 on the "
                  "greedy path [%s], on all positions [%s]",
                  e + 1, loss, t1 - t0, ev.loss, now_seconds() - t1, join_accuracy(ev.top1).c_str(),
                  join_accuracy(ev.top1_all).c_str()));
    cx.progress("evaluate", e + 1, o.epochs, loss, &ev.top1);
    if (e + 1 < o.epochs) save_checkpoint(ckpt, key, e + 1, tr.step(), tr.heads(), data.H);
  }

  log_accuracy(cx, o, ev);
  save_heads(export_heads(o, id, vocab, tr, ev, data.H), out);
  std::remove(ckpt.c_str());
  if (!o.keep_data) std::remove((out + ".data").c_str());
}

}  // namespace
}  // namespace medusa::train_detail

specinfer_status medusa_train(const specinfer_host *host, const specinfer_train_params *params,
                              const specinfer_model_info *target_info,
                              const specinfer_host_target *target, specinfer_plugin_error *err) {
  return specinfer_plugin::guarded(
      err, "medusa", [&] { medusa::train_detail::train(host, params, target_info, target); });
}
