// The draft-model plugin: a drafter that runs any target (opened through the host services, for
// instance a small GGUF model of the same family) autoregressively.
//
//  - Its KV cache follows the accepted text: before each draft it keeps the longest prefix of what
//    it cached that still agrees with the session's sequence, drops the rest (its own rejected
//    draft tokens) and feeds the new tokens in one batch. The prompt is fed at begin().
//  - Greedy sessions (temperature 0) draft the argmax (point masses). Sampling sessions draft
//    from q = softmax(logits / T) with the coupler's draft side (shared randomness for gumbel and
//    minhash) and hand q to the coupler, so the output stays exact.
//  - A draft ends early when the model's confidence (its largest probability at temperature 1
//    for greedy, the largest probability of q when sampling) drops below p_min, and after at most
//    max_draft tokens. The defaults (0.4, 4) come from replaying a HumanEval trace of 10-token
//    drafts (draft confidence and acceptance at every position) under each stopping rule with the
//    measured costs: a confidence cut with a cap of 4 beats lower cuts, longer caps and any fixed
//    length, and a verify pass of more than 5 tokens costs markedly more than one of 5
//    (docs/benchmarks/verify-cost.md).
//  - Staged drafting (stage=N, 3 by default): up to N tokens that prompt lookup predicts after the
//    context (matches of lookup_n_max down to stage_n_min tokens) are fed along in the draft's
//    first forward, with logits for each. While the model's own choice equals the staged token,
//    the next distribution is already there and the sequential forward is skipped; at the first
//    difference the staged rest is dropped from the cache. The draft is the same as without
//    staging (the kernels score each token of a batch as they would alone), only cheaper: a
//    forward of a few tokens costs far less than as many single ones, one skipped forward saves a
//    whole one, and half the staged tokens match on HumanEval.
//  - Token trees (tree=1): the model is still run down one path, its most likely token at each
//    depth, but at every row it reads (the one where its confidence ends the path included) its
//    `branch` most likely tokens become candidates under that path's node, valued by the draft
//    model's own probability. The best-first builder of plugins/common/token_tree.h keeps the
//    nodes whose path is most likely accepted, as many as pay for their share of the target's
//    pass (the session's measured pass costs, req.pass_cost). The siblings are point masses on
//    distinct tokens, so every coupler stays exact (greedy and gumbel/minhash walk down the
//    target's own choices; rejection sampling takes distinct point masses without replacement);
//    a sampling session's draft follows the most likely path rather than samples. The siblings
//    cost no draft-model pass, only their share of the target's; on HumanEval they add about
//    0.12 tokens per round for 0.37 nodes (docs/BENCHMARKS.md).
//  - lookup=1 first tries prompt lookup (the ngram plugin's context index, n from lookup_n_max
//    down to lookup_n_min) and runs the model only when the context has no match: the two
//    drafters combined.
//
//  - At a long context the draft model reads only the recent text (window=N, 2048 by default):
//    its cache holds the context from a start `base` on, at positions from 0, and when that grows
//    past 2N tokens the start moves to N tokens before the end and the window is prefilled again.
//    So its prefill and its attention cost what N to 2N tokens cost, not the whole context: at 16k
//    tokens a draft model that read everything would add a third to the target's prefill time
//    before the first token and its own 16k-token attention to every drafted token. What is kept
//    is only a speed choice: the target checks every token.
//  - With the gguf plugin the draft's matrices are re-quantized to Q4_0 in memory unless
//    requant=none (the gguf plugin's requant option): drafting is memory-bound, and for the
//    Qwen2.5-Coder 0.5B draft this reads 278 instead of 491 MB per token while its acceptance
//    stays (HumanEval, 3-token drafts: 0.855 either way); requant=q3_0 reads 169 MB and accepts
//    somewhat less (0.822 against 0.862 on HumanEval), a small net gain on AVX-512 (docs/
//    BENCHMARKS.md) that is not the default. And unless vocab_limit is given (0 =
//    off), the draft computes logits only for ids below 32768 plus the tokens of its context and
//    the end-of-text ids (gguf's vocab_limit): the 0.5B's output matrix is 28% of its bytes, and
//    1.6% of HumanEval's solution tokens fall outside that set. The target's output never changes.
//
// config: path=<model file> (required unless the plugin's config needs none), plugin=<target
// plugin> (gguf), n_ctx=<..>, k=<..>, vocab_limit=<..> (32768 by default with gguf) and
// requant=<..> (q4_0 by default with gguf) passed on to the target, p_min=<0..1> (0.4),
// max_draft=<1..64> (4; the model's drafts only: prompt-lookup drafts are as long as the session
// allows), lookup=0|1 (0), lookup_n_min=<1..16> (3), lookup_n_max=<1..16> (5), stage=<0..16> (3; 0
// = off), stage_n_min=<1..16> (2), window=<0..16777216> (2048, at most about half the draft model's
// n_ctx; 0 = the whole context), tree=0|1 (0), branch=<1..8> (3; candidates per row in a tree).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/drafter_plugin.h"
#include "../common/ngram_index.h"
#include "../common/plugin_config.h"
#include "../common/token_tree.h"
#include "../common/tree_draft.h"
#include "specinfer_plugin.h"

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;
using specinfer_plugin::Failure;
using specinfer_plugin::guarded;
using specinfer_plugin::set_error;

namespace {

struct Drafter {
  const specinfer_host *host = nullptr;
  specinfer_host_target model{};
  int32_t vocab = 0;  // the draft model's logits per position
  int32_t n_ctx = 0;  // the draft model's context window
  float p_min = 0.4f;
  int32_t max_draft = 4;  // for the model's drafts
  bool lookup = false;
  int32_t lookup_n_min = 3, lookup_n_max = 5;

  int32_t stage = 3;  // most prompt-lookup tokens checked along in a draft's first forward
  int32_t stage_n_min = 2;
  int64_t window = 2048;  // recent tokens the draft model reads at least (0: all)
  bool tree = false;      // propose token trees (see the top of the file)
  int32_t branch = 3;     // candidates per row in a tree

  size_t base = 0;             // the context index of the draft cache's position 0
  std::vector<int32_t> kv;     // what the draft model's KV cache holds: context[base ..]
  std::vector<float> logits;   // [(stage + 1) x vocab] logits after the last tokens fed
  std::vector<float> scratch;  // [vocab]
  std::vector<int32_t> batch_tokens, batch_pos;
  specinfer_ngram::ContextIndex index;
  std::vector<int32_t> tail, cand, pending;
  token_tree::TreeSpec spec;  // tree=1: each row's candidates (spec.levels) and the budget
  token_tree::Tree built;
  token_tree::DraftClock clock;  // the draft's time in one-token target passes
  std::vector<token_tree::TreeQueueEntry> queue;

  ~Drafter() {
    if (host && model.host_handle) host->close_target(host, &model);
  }

  void check(specinfer_status rc, const specinfer_plugin_error &e, const char *what) const {
    if (rc != SPECINFER_OK)
      throw Failure(
          rc, std::string("draft-model: the draft model's ") + what + " failed: " + e.message);
  }

  void truncate(size_t keep) {
    if (keep >= kv.size()) return;
    specinfer_plugin_error e{};
    check(model.vtable->kv_truncate(model.self, static_cast<int32_t>(keep), &e), e, "kv_truncate");
    // A sliding-window draft model may keep less (SPECINFER_HOST_SHORT_TRUNCATE).
    const int32_t kept = model.vtable->kv_size(model.self);
    kv.resize(std::min(keep, static_cast<size_t>(std::max(kept, 0))));
  }

  // The window's start for a context of n tokens: kept while the draft reads at most 2 * window
  // tokens from it; else window tokens before the end.
  size_t window_start(size_t n) const {
    if (window <= 0 || n <= static_cast<size_t>(window)) return 0;
    if (n > base && n - base <= 2 * static_cast<size_t>(window)) return base;
    return n - static_cast<size_t>(window);
  }

  // Readies the cache for the window of ctx[0 .. n) followed by extra[0 .. n_extra): keeps the
  // longest cached prefix that agrees with it and leaves the rest in `pending` (at least the last
  // token of ctx, whose logits are wanted), to be fed in one batch.
  void prepare_sync(const int32_t *ctx, size_t n, const int32_t *extra, size_t n_extra) {
    const size_t start = window_start(n);
    if (start != base) {  // a new window: its text is fed from position 0
      truncate(0);
      base = start;
    }
    ctx += base;
    n -= base;
    size_t keep = 0, limit = std::min(kv.size(), n - 1);  // at least the last token is re-fed
    while (keep < limit && kv[keep] == ctx[keep]) ++keep;
    truncate(keep);
    keep = kv.size();
    pending.assign(ctx + keep, ctx + n);
    pending.insert(pending.end(), extra, extra + n_extra);
  }

  // Brings the cache to the window of ctx[0 .. n) (batches of at most 512 tokens); the logits
  // row is the distribution after it.
  void sync(const int32_t *ctx, size_t n) {
    prepare_sync(ctx, n, nullptr, 0);
    fed_n = 0;
    n_out = 1;
    while (fed_n < pending.size()) {
      forward_alone();
      took_batch();
    }
  }

  // Up to `want` tokens that prompt lookup predicts after ctx (the context index's continuation,
  // longest match first, matches of lookup_n_max down to n_min tokens); brings the index to ctx.
  size_t lookup_tokens(const int32_t *ctx, size_t n, int32_t want, int n_min,
                       std::vector<int32_t> &outv) {
    index.sync(ctx, n);
    outv.clear();
    size_t keep = std::min<size_t>(n, static_cast<size_t>(lookup_n_max));
    tail.assign(ctx + n - keep, ctx + n);
    while (static_cast<int32_t>(outv.size()) < want) {
      int32_t tok = -1;
      for (int k = std::min<int>(lookup_n_max, static_cast<int>(tail.size())); k >= n_min; --k) {
        ptrdiff_t p = index.find(tail.data() + tail.size() - k, k);
        if (p >= 0) {
          tok = index.tokens()[static_cast<size_t>(p)];
          break;
        }
      }
      if (tok < 0 || tok >= vocab) break;
      outv.push_back(tok);
      tail.push_back(tok);
    }
    return outv.size();
  }

  int32_t lookup_draft(const specinfer_draft_request &req, specinfer_draft &out, int32_t want) {
    lookup_tokens(req.context, req.n_context, want, lookup_n_min, cand);
    int32_t k = 0;
    for (; k < static_cast<int32_t>(cand.size()) && cand[static_cast<size_t>(k)] < out.vocab_size;
         ++k) {
      out.tokens[k] = cand[static_cast<size_t>(k)];
      out.parents[k] = k - 1;
    }
    return k;
  }

  // A draft is made in steps, so that drafts for several sessions can share the draft model's
  // passes (propose_many) and still be the drafts each would make alone: start() readies the
  // first forward (the text the cache lacks, then the staged tokens), next_batch() gives the
  // pending forward's next batch and fed() takes its result; after the last batch of a forward,
  // advance() picks tokens from the logits until the draft ends or the next token needs a
  // forward of its own. Each returns whether a forward is pending.
  const specinfer_draft_request *req = nullptr;
  specinfer_draft *out = nullptr;
  int32_t want = 0, k = 0;  // tokens wanted down the model's path, tokens drafted
  int32_t max_nodes = 0;    // nodes wanted (a tree's budget)
  // Greedy chains: the model's probability of its path so far, and the sum of those over the
  // path's prefixes (the expected accepted length, by the model's own estimate).
  double path_p = 1, expected = 0;
  size_t n_cand = 0;  // staged tokens in the cache after the context
  size_t first = 0;   // cache index of the first drafted token
  size_t fed_n = 0;   // tokens of `pending` fed so far
  size_t n_out = 1;   // logits rows wanted from the pending forward's last tokens
  const float *row = nullptr;

  bool start(const specinfer_draft_request &r, specinfer_draft &o) {
    req = &r;
    out = &o;
    k = 0;
    o.n_nodes = 0;
    o.has_probs = 0;
    want = std::min(r.max_tokens, o.cap);
    max_nodes = want;
    spec.levels.clear();
    path_p = 1;
    expected = 0;
    if (tree) clock.start();
    if (want <= 0 || r.n_context == 0) return false;
    if (o.vocab_size <= 0)
      throw Failure(SPECINFER_ERR_INVALID_ARGUMENT, "draft-model: bad vocab_size");
    for (size_t i = 0; i < r.n_context; ++i)
      if (r.context[i] < 0 || r.context[i] >= vocab)
        throw Failure(SPECINFER_ERR_INVALID_ARGUMENT,
                      "draft-model: a context token is outside the draft model's vocabulary");
    if (lookup) {
      k = lookup_draft(r, o, want);
      if (k > 0) {
        o.n_nodes = k;
        return false;
      }
    }
    // The draft model's context window: stop drafting where it ends.
    want = std::min(want, max_draft);
    want =
        std::min<int64_t>(want, static_cast<int64_t>(n_ctx) -
                                    static_cast<int64_t>(r.n_context - window_start(r.n_context)));
    if (want <= 0) return false;
    // Staged drafting: the tokens prompt lookup predicts ride along in the first forward; while
    // the model's own choice equals them, its next distribution is already computed. The draft
    // is the same as without them (up to float rounding: the kernels score each token alike).
    n_cand = 0;
    if (stage > 0)
      n_cand = lookup_tokens(r.context, r.n_context, std::min(stage, want - 1), stage_n_min, cand);
    prepare_sync(r.context, r.n_context, cand.data(), n_cand);
    first = r.n_context - base;
    fed_n = 0;
    n_out = n_cand + 1;
    return true;
  }

  // The pending forward's next batch (at most 512 tokens; the last one holds the n_out tokens
  // whose logits are wanted), referring to this drafter's buffers.
  void next_batch(specinfer_forward_batch &b) {
    const size_t chunk = 512, rest = pending.size() - fed_n;
    size_t m = std::min(chunk, rest);
    if (m < rest && rest - m < n_out) m = rest - n_out;
    batch_tokens.assign(pending.begin() + static_cast<std::ptrdiff_t>(fed_n),
                        pending.begin() + static_cast<std::ptrdiff_t>(fed_n + m));
    batch_pos.resize(m);
    for (size_t i = 0; i < m; ++i) batch_pos[i] = static_cast<int32_t>(kv.size() + i);
    const bool last = fed_n + m == pending.size();
    b = specinfer_forward_batch{};
    b.struct_size = sizeof(b);
    b.n_tokens = static_cast<int32_t>(m);
    b.tokens = batch_tokens.data();
    b.positions = batch_pos.data();
    b.n_logits = last ? static_cast<int32_t>(n_out) : 0;
    b.logits = last ? logits.data() : nullptr;
  }

  // The batch of next_batch() went through the model: the cache holds its tokens.
  void took_batch() {
    kv.insert(kv.end(), batch_tokens.begin(), batch_tokens.end());
    fed_n += batch_tokens.size();
  }

  // After the batch of next_batch() went through the model.
  bool fed() {
    took_batch();
    if (fed_n < pending.size()) return true;
    row = logits.data();
    return advance();
  }

  bool advance() {
    specinfer_draft &o = *out;
    const bool sample = !tree && req->temperature > 0 && req->sample != nullptr;
    const int32_t v = std::min(vocab, o.vocab_size);
    for (; k < want; ++k) {
      float *q = sample ? o.probs + static_cast<size_t>(k) * o.vocab_size : scratch.data();
      // q = softmax(logits / T) over the shared vocabulary (T = 1 for the greedy confidence).
      const float inv_t = sample ? 1.0f / req->temperature : 1.0f;
      float mx = -INFINITY;
      int32_t arg = 0;
      for (int32_t i = 0; i < v; ++i)
        if (row[i] > mx) {
          mx = row[i];
          arg = i;
        }
      // The host's vectorized softmax: a scalar exp loop over 152k logits is a noticeable part of
      // a drafted token's time.
      for (int32_t i = 0; i < v; ++i) q[i] = row[i] * inv_t;
      host->kernels->softmax(q, v);
      for (int32_t i = v; i < o.vocab_size; ++i) q[i] = 0.0f;
      if (tree) add_level(q, v);
      if (q[arg] < p_min) break;  // not confident: end the draft here
      int32_t tok = arg;
      if (sample) {
        tok =
            req->sample(req->sample_ctx, q, o.vocab_size, static_cast<int64_t>(req->n_context) + k);
        if (tok < 0 || tok >= v)
          throw Failure(SPECINFER_ERR_PLUGIN, "draft-model: the coupler's draft sampler failed");
      }
      o.tokens[k] = tok;
      o.parents[k] = k - 1;
      path_p *= q[tok];
      expected += path_p;
      if (k + 1 >= want) continue;
      if (static_cast<size_t>(k) < n_cand) {
        if (tok == cand[static_cast<size_t>(k)]) {  // the staged token: its row is ready
          row = logits.data() + static_cast<size_t>(k + 1) * static_cast<size_t>(vocab);
          continue;
        }
        truncate(first + static_cast<size_t>(k));         // drop the staged tokens from here on
        if (kv.size() != first + static_cast<size_t>(k))  // a cut inside the latest pass
          throw Failure(SPECINFER_ERR_PLUGIN, "draft-model: the draft model's cache kept too few");
        n_cand = static_cast<size_t>(k);
      }
      ++k;  // the token is drafted; its forward gives the next row
      pending.assign(1, tok);
      fed_n = 0;
      n_out = 1;
      return true;
    }
    if (tree) {
      build();
      return false;
    }
    o.n_nodes = k;
    o.has_probs = sample && k > 0 ? 1 : 0;
    if (!sample && k > 0) specinfer_plugin::set_expected_accepted(o, expected);
    return false;
  }

  // tree=1: the `branch` most likely tokens of q[0 .. v) (the row at the next depth down the
  // model's path), most likely first, as that depth's candidates.
  void add_level(const float *q, int32_t v) {
    std::vector<token_tree::Candidate> &level = spec.levels.emplace_back();
    for (int32_t i = 0; i < v; ++i) {
      if (static_cast<int32_t>(level.size()) == branch && !(q[i] > level.back().p)) continue;
      if (static_cast<int32_t>(level.size()) == branch) level.pop_back();
      auto at = level.begin();
      while (at != level.end() && at->p >= q[i]) ++at;
      level.insert(at, token_tree::Candidate{i, q[i]});
    }
  }

  // tree=1: the draft is the tree of the candidates that pays most for the target's pass.
  void build() {
    spec.chains.clear();
    spec.path_levels = true;
    spec.max_nodes = max_nodes;
    spec.allow_tree = req->allow_tree != 0;
    spec.draft_cost = clock.cost();
    token_tree::take_pass_cost(*req, spec);
    token_tree::build_tree(spec, built, queue);
    const auto n = static_cast<int32_t>(built.tokens.size());
    clock.drafted(n > 0 ? token_tree::pass_cost(spec, n) : 0.0, true);
    token_tree::write_draft(built, *out);
  }

  // One forward of this drafter's pending batch.
  void forward_alone() {
    specinfer_forward_batch b{};
    next_batch(b);
    specinfer_plugin_error e{};
    check(model.vtable->forward(model.self, &b, &e), e, "forward");
  }

  bool can_forward_many() const {
    const specinfer_target_vtable *vt = model.vtable;
    return vt->struct_size >=
               offsetof(specinfer_target_vtable, forward_many) + sizeof(vt->forward_many) &&
           vt->forward_many != nullptr;
  }
};

// Drafts for ds[0..n) (requests reqs, drafts outs; statuses and errors per drafter). The forwards
// of the drafts in progress run as one pass of the draft model (forward_many) when their models
// are one loaded model (drafters opened with one config share it); when such a pass fails, each
// runs its own, so that a failure is the failing drafter's alone.
void draft_many(Drafter *const *ds, const specinfer_draft_request *reqs, specinfer_draft *outs,
                int32_t n, specinfer_status *status, specinfer_plugin_error *errs) {
  std::vector<bool> active(static_cast<size_t>(n), false);
  for (int32_t i = 0; i < n; ++i)
    status[i] = guarded(&errs[i], "draft-model", [&] {
      if (!ds[i] || (!reqs[i].context && reqs[i].n_context) || !outs[i].tokens || !outs[i].parents)
        throw Failure(SPECINFER_ERR_INVALID_ARGUMENT, "draft-model: malformed draft request");
      if (reqs[i].temperature > 0 && reqs[i].sample && !outs[i].probs)
        throw Failure(SPECINFER_ERR_INVALID_ARGUMENT,
                      "draft-model: no room for the draft distributions");
      active[static_cast<size_t>(i)] = ds[i]->start(reqs[i], outs[i]);
    });
  std::vector<int32_t> run;
  std::vector<void *> selves;
  std::vector<specinfer_forward_batch> batches;
  for (;;) {
    run.clear();
    for (int32_t i = 0; i < n; ++i)
      if (active[static_cast<size_t>(i)]) run.push_back(i);
    if (run.empty()) return;
    bool together = run.size() > 1 && ds[run[0]]->can_forward_many();
    if (together) {
      selves.clear();
      batches.assign(run.size(), specinfer_forward_batch{});
      for (size_t r = 0; r < run.size(); ++r) {
        selves.push_back(ds[run[r]]->model.self);
        ds[run[r]]->next_batch(batches[r]);
      }
      specinfer_plugin_error e{};
      together =
          ds[run[0]]->model.vtable->forward_many(
              selves.data(), batches.data(), static_cast<int32_t>(run.size()), &e) == SPECINFER_OK;
      const specinfer_host *host = ds[run[0]]->host;
      if (!together && host->log) {
        const std::string msg = "draft-model: one pass for " + std::to_string(run.size()) +
                                " drafts failed (" +
                                std::string(e.message, strnlen(e.message, sizeof e.message)) +
                                "): they draft one after another";
        host->log(host, SPECINFER_LOG_WARN, msg.c_str());
      }
    }
    for (int32_t i : run) {
      const auto u = static_cast<size_t>(i);
      status[i] = guarded(&errs[i], "draft-model", [&] {
        if (!together) ds[i]->forward_alone();
        active[u] = ds[i]->fed();
      });
      if (status[i] != SPECINFER_OK) active[u] = false;
    }
  }
}

void d_destroy(void *self) {
  delete static_cast<Drafter *>(self);
}

specinfer_status d_begin(void *self, const int32_t *context, size_t n,
                         specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "draft-model", [&] {
    if (!context && n) throw Failure(SPECINFER_ERR_INVALID_ARGUMENT, "draft-model: NULL context");
    for (size_t i = 0; i < n; ++i)
      if (context[i] < 0 || context[i] >= d->vocab)
        throw Failure(SPECINFER_ERR_INVALID_ARGUMENT,
                      "draft-model: a prompt token is outside the draft model's vocabulary");
    // Prefill the prompt (its window) now, so the first draft costs what later drafts cost.
    if (n > 0 && n - d->window_start(n) <= static_cast<size_t>(d->n_ctx)) d->sync(context, n);
    if (d->lookup) d->index.sync(context, n);
    d->clock.forget();
  });
}

specinfer_status d_commit(void *, const int32_t *tokens, size_t n, specinfer_plugin_error *err) {
  // The cache follows the request's context lazily (at the next propose), in one batch.
  if (!tokens && n) {
    set_error(err, "draft-model: NULL tokens");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  return SPECINFER_OK;
}

specinfer_status d_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  if (!req || !out) {
    set_error(err, "draft-model: malformed draft request");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  auto *d = static_cast<Drafter *>(self);
  specinfer_status status = SPECINFER_OK;
  specinfer_plugin_error own{};
  draft_many(&d, req, out, 1, &status, err ? err : &own);
  return status;
}

specinfer_status d_propose_many(void *const *selves, const specinfer_draft_request *reqs,
                                specinfer_draft *outs, int32_t n, specinfer_status *status,
                                specinfer_plugin_error *errs) {
  if (!selves || !reqs || !outs || !status || !errs || n <= 0)
    return SPECINFER_ERR_INVALID_ARGUMENT;
  std::vector<Drafter *> ds(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ds[static_cast<size_t>(i)] = static_cast<Drafter *>(selves[i]);
  draft_many(ds.data(), reqs, outs, n, status, errs);
  for (int32_t i = 0; i < n; ++i)
    if (status[i] != SPECINFER_OK) return status[i];
  return SPECINFER_OK;
}

const specinfer_drafter_vtable kVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, d_propose_many};

// The draft model must speak the target's vocabulary: same size, and the same bytes for a spread
// of token ids.
void check_vocabulary(Drafter &d, const specinfer_model_info &dinfo,
                      const specinfer_model_info *tinfo, const specinfer_host_target *target) {
  if (!tinfo) return;
  if (dinfo.vocab_size != tinfo->vocab_size)
    throw Failure(SPECINFER_ERR_UNSUPPORTED,
                  "draft-model: the draft model has " + std::to_string(dinfo.vocab_size) +
                      " tokens but the target " + std::to_string(tinfo->vocab_size) +
                      ": they must share a vocabulary");
  if (!target || !target->vtable || !target->vtable->token_bytes) return;
  char a[256], b[256];
  int32_t step = std::max<int32_t>(1, dinfo.vocab_size / 257);
  for (int32_t t = 0; t < dinfo.vocab_size; t += step) {
    size_t na = 0, nb = 0;
    specinfer_plugin_error e{};
    specinfer_status ra = d.model.vtable->token_bytes(d.model.self, t, a, sizeof a, &na, &e);
    specinfer_status rb = target->vtable->token_bytes(target->self, t, b, sizeof b, &nb, &e);
    if (ra != rb || (ra == SPECINFER_OK && (na != nb || std::memcmp(a, b, na) != 0)))
      throw Failure(SPECINFER_ERR_UNSUPPORTED,
                    "draft-model: token " + std::to_string(t) +
                        " differs between the draft model and the target: "
                        "they must share a vocabulary");
  }
}

specinfer_status drafter_create(const specinfer_host *host, const char *config,
                                const specinfer_model_info *target_info,
                                const specinfer_host_target *target, void **self,
                                const specinfer_drafter_vtable **vtable,
                                specinfer_plugin_error *err) {
  return guarded(err, "draft-model", [&] {
    if (!host || !self || !vtable)
      throw Failure(SPECINFER_ERR_INVALID_ARGUMENT, "draft-model: NULL argument");
    if (!host->open_target || !host->close_target)
      throw Failure(SPECINFER_ERR_UNSUPPORTED, "draft-model: the host cannot open targets");
    if (!host->kernels || !host->kernels->softmax)
      throw Failure(SPECINFER_ERR_UNSUPPORTED, "draft-model: the host has no softmax kernel");
    Config cfg(config, {"plugin", "path", "n_ctx", "k", "vocab_limit", "requant", "p_min",
                        "max_draft", "lookup", "lookup_n_min", "lookup_n_max", "stage",
                        "stage_n_min", "window", "tree", "branch"});
    auto d = std::make_unique<Drafter>();
    d->p_min = static_cast<float>(cfg.get_float("p_min", 0.4, 0.0, 1.0));
    d->max_draft = static_cast<int32_t>(cfg.get_int("max_draft", 4, 1, 64));
    d->lookup = cfg.get_int("lookup", 0, 0, 1) != 0;
    d->lookup_n_min = static_cast<int32_t>(cfg.get_int("lookup_n_min", 3, 1, 16));
    d->lookup_n_max = static_cast<int32_t>(cfg.get_int("lookup_n_max", 5, 1, 16));
    if (d->lookup_n_min > d->lookup_n_max)
      throw ConfigError("draft-model: lookup_n_min must not exceed lookup_n_max");
    d->stage = static_cast<int32_t>(cfg.get_int("stage", 3, 0, 16));
    d->stage_n_min = static_cast<int32_t>(cfg.get_int("stage_n_min", 2, 1, 16));
    if (d->stage_n_min > d->lookup_n_max)
      throw ConfigError("draft-model: stage_n_min must not exceed lookup_n_max");
    d->window = cfg.get_int("window", 2048, 0, 1 << 24);
    d->tree = cfg.get_int("tree", 0, 0, 1) != 0;
    d->branch = static_cast<int32_t>(cfg.get_int("branch", 3, 1, 8));
    d->index.configure(d->lookup_n_max);
    std::string plugin = cfg.get("plugin", "gguf");
    if (plugin.empty() || plugin == "draft-model")
      throw ConfigError("draft-model: bad plugin '" + plugin + "'");
    std::string tcfg;
    for (const char *key : {"path", "n_ctx", "k", "vocab_limit", "requant"})
      if (cfg.has(key)) {
        if (!tcfg.empty()) tcfg.push_back(',');
        tcfg.append(key).push_back('=');
        tcfg.append(cfg.get(key, ""));
      }
    if (plugin == "gguf" && !cfg.has("requant"))
      tcfg.append(tcfg.empty() ? "requant=q4_0" : ",requant=q4_0");
    if (plugin == "gguf" && !cfg.has("vocab_limit")) tcfg.append(",vocab_limit=32768");
    specinfer_plugin_error e{};
    specinfer_status rc = host->open_target(host, plugin.c_str(), tcfg.c_str(), &d->model, &e);
    if (rc != SPECINFER_OK)
      throw Failure(rc, std::string("draft-model: cannot open the draft model: ") + e.message);
    d->host = host;
    specinfer_model_info info{};
    info.struct_size = sizeof info;
    rc = d->model.vtable->info(d->model.self, &info);
    if (rc != SPECINFER_OK) throw Failure(rc, "draft-model: the draft model's info failed");
    if (info.vocab_size <= 0 || info.n_ctx <= 0)
      throw Failure(SPECINFER_ERR_PLUGIN, "draft-model: the draft model reports no vocabulary");
    check_vocabulary(*d, info, target_info, target);
    d->vocab = info.vocab_size;
    d->n_ctx = info.n_ctx;
    // Twice the window, and a draft, must fit the draft model's context.
    d->window = std::min<int64_t>(d->window, std::max(1, d->n_ctx / 2 - 64));
    d->logits.resize(static_cast<size_t>(d->stage + 1) * static_cast<size_t>(d->vocab));
    d->scratch.resize(static_cast<size_t>(d->vocab));
    *self = d.release();
    *vtable = &kVtable;
  });
}

constexpr specinfer_drafter_factory kFactory = specinfer_plugin::drafter_factory(drafter_create);

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry =
    specinfer_plugin::drafter_plugin_descriptor<kFactory>(
        "draft-model", "1.0",
        "runs a small model (any target plugin) as the drafter; optional prompt lookup first");
