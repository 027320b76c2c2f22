// The ngram plugin: n-gram drafting without a model. Deterministic: proposes point masses. Works
// with any target's vocabulary. Each drafted token comes from the first of three sources that
// knows a continuation of the text so far (context plus the draft):
//   1. context: prompt lookup - the token after the most recent earlier occurrence of the last n
//      tokens in the current sequence, longest n first (n_max down to n_min);
//   2. dynamic: n-gram counts over the sequences this drafter saw before (earlier prompts and the
//      session's own earlier output, merged when a new sequence begins);
//   3. static: the followers of n-grams in a corpus file (tokenized with the target's tokenizer,
//      indexed as corpus.h says).
// The count caches propose the most frequent follower when it was seen at least min_count times
// and makes up at least min_share of the followers; n runs from n_max down to cache_n_min.
// With text=1, a draft of fewer than two tokens from those sources gives way to prompt lookup on
// the text (text_lookup.h: the longest suffix of the text, text_min bytes at least, found earlier
// and what followed it tokenized), when that drafts more: spans copied where their tokens differ
// from the prompt's, as values copied into JSON.
// Each draft carries an estimate of how many of its tokens the target keeps: per source (context
// lookup per match length, dynamic, static, text) the share of its tokens kept when their parent
// was, learned from what each commit after a draft appends (Laplace's rule, counts halved past
// 512 so that they follow the text), multiplied down the chain and summed.
//   config: n_min=<1..16> (3), n_max=<1..16> (8), max_draft=<1..64> (16), dynamic=0|1 (1),
//           static=<path of a text file> (none), cache_n_min=<1..16> (2), min_count=<1..> (2),
//           min_share=<0..1> (0.5), text=0|1 (0), text_min=<1..64> (5)
#include <algorithm>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "../common/corpus.h"
#include "../common/drafter_plugin.h"
#include "../common/ngram_index.h"
#include "../common/plugin_config.h"
#include "specinfer_plugin.h"
#include "text_lookup.h"

using specinfer_plugin::Config;
using specinfer_plugin::ConfigError;
using specinfer_plugin::fail;
using specinfer_plugin::guarded;

namespace {

// Where a drafted token came from: context lookup with a match of n tokens (n = 1..16), or one
// of the three sources after it.
constexpr int kFromDynamic = 17, kFromStatic = 18, kFromText = 19, kSources = 20;

// Tokens of one source kept by the target when their parent was, and those that were offered.
struct SourceStats {
  double offered = 0.0, kept = 0.0;
  double p() const { return (kept + 1.0) / (offered + 2.0); }
  void add(bool was_kept) {
    offered += 1.0;
    kept += was_kept ? 1.0 : 0.0;
    if (offered > 512.0) {
      offered /= 2.0;
      kept /= 2.0;
    }
  }
};

struct Drafter {
  int32_t n_min = 3, n_max = 8, max_draft = 16;
  bool use_dynamic = true;
  int32_t cache_n_min = 2;
  uint32_t min_count = 2;
  double min_share = 0.5;
  specinfer_ngram::ContextIndex context;
  specinfer_ngram::CountTable dynamic;
  std::shared_ptr<const specinfer_ngram::CorpusIndex> stat;  // static=: the corpus, or null
  std::vector<int32_t> tail;  // scratch: the last n_max tokens of the context, then the draft
  bool use_text = false;
  specinfer_ngram::TextLookup text;
  std::vector<int32_t> text_draft;  // scratch
  SourceStats sources[kSources];
  // The last draft (its tokens and their sources) and the context length it followed; the commit
  // after it tells which of its tokens the target kept.
  std::vector<int32_t> drafted;
  std::vector<int> drafted_from;
  size_t drafted_at = 0;

  // Learns from the tokens a commit appends right after the last draft.
  void learn(const int32_t *tokens, size_t n) {
    if (drafted.empty() || context.size() != drafted_at || n == 0) return;
    size_t kept = 0;  // the target's own token ends what was appended
    while (kept + 1 < n && kept < drafted.size() && tokens[kept] == drafted[kept]) ++kept;
    for (size_t i = 0; i <= kept && i < drafted.size(); ++i) sources[drafted_from[i]].add(i < kept);
    drafted.clear();
  }
};

void d_destroy(void *self) {
  delete static_cast<Drafter *>(self);
}

void check_tokens(const int32_t *t, size_t n) {
  if (!t && n) fail(SPECINFER_ERR_INVALID_ARGUMENT, "ngram: NULL tokens");
  for (size_t i = 0; i < n; ++i)
    if (t[i] < 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "ngram: negative token id %d", t[i]);
}

specinfer_status d_begin(void *self, const int32_t *context, size_t n,
                         specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "ngram", [&] {
    check_tokens(context, n);
    // The sequence that ends here feeds the dynamic cache.
    const auto &prev = d->context.tokens();
    if (d->use_dynamic && prev.size() > 1)
      d->dynamic.add(prev.data(), prev.size(), d->cache_n_min, d->n_max);
    d->context.clear();
    d->context.append(context, n);
    d->drafted.clear();
  });
}

specinfer_status d_commit(void *self, const int32_t *tokens, size_t n,
                          specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "ngram", [&] {
    check_tokens(tokens, n);
    d->learn(tokens, n);
    d->context.append(tokens, n);
  });
}

// Next token after the text ending in tail (all of it is the suffix of context + draft), or -1;
// *from = its source.
int32_t next_token(const Drafter &d, int *from) {
  const int32_t *end = d.tail.data() + d.tail.size();
  const int avail = static_cast<int>(d.tail.size());
  for (int n = std::min(d.n_max, avail); n >= d.n_min; --n) {
    ptrdiff_t p = d.context.find(end - n, n);
    *from = n;
    if (p >= 0) return d.context.tokens()[static_cast<size_t>(p)];
  }
  using specinfer_ngram::longest_follower;
  if (!d.dynamic.empty()) {
    const int32_t t =
        longest_follower(d.dynamic, end, avail, d.cache_n_min, d.n_max, d.min_count, d.min_share);
    *from = kFromDynamic;
    if (t >= 0) return t;
  }
  *from = kFromStatic;
  if (d.stat)
    return longest_follower(*d.stat, end, avail, d.cache_n_min, d.n_max, d.min_count, d.min_share);
  return -1;
}

specinfer_status d_propose(void *self, const specinfer_draft_request *req, specinfer_draft *out,
                           specinfer_plugin_error *err) {
  auto *d = static_cast<Drafter *>(self);
  return guarded(err, "ngram", [&] {
    if (!req || !out || (!req->context && req->n_context))
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "ngram: malformed draft request");
    out->n_nodes = 0;
    out->has_probs = 0;
    d->drafted.clear();
    const int32_t want = std::min({req->max_tokens, out->cap, d->max_draft});
    if (want <= 0 || req->n_context == 0) return;
    // The request carries the whole sequence; follow it if begin/commit were not called.
    if (d->context.size() != req->n_context) d->context.sync(req->context, req->n_context);
    const size_t keep = std::min<size_t>(req->n_context, static_cast<size_t>(d->n_max));
    d->tail.assign(req->context + req->n_context - keep, req->context + req->n_context);
    d->drafted_from.clear();
    int32_t k = 0;
    for (; k < want; ++k) {
      int from = 0;
      const int32_t tok = next_token(*d, &from);
      if (tok < 0 || tok >= out->vocab_size) break;
      out->tokens[k] = tok;
      out->parents[k] = k - 1;
      d->tail.push_back(tok);
      d->drafted_from.push_back(from);
    }
    if (d->use_text && k < 2) {
      d->text.sync(req->context, req->n_context);
      d->text.draft(want, out->vocab_size, d->text_draft);
      if (static_cast<int32_t>(d->text_draft.size()) > k) {
        k = static_cast<int32_t>(d->text_draft.size());
        for (int32_t i = 0; i < k; ++i) {
          out->tokens[i] = d->text_draft[static_cast<size_t>(i)];
          out->parents[i] = i - 1;
        }
        d->drafted_from.assign(static_cast<size_t>(k), kFromText);
      }
    }
    out->n_nodes = k;
    // Remembered for the commit after it; the estimate: the chance that each prefix is kept.
    d->drafted.assign(out->tokens, out->tokens + k);
    d->drafted_at = req->n_context;
    double path = 1.0, expected = 0.0;
    for (int32_t i = 0; i < k; ++i) {
      path *= d->sources[d->drafted_from[static_cast<size_t>(i)]].p();
      expected += path;
    }
    if (k > 0) specinfer_plugin::set_expected_accepted(*out, expected);
  });
}

const specinfer_drafter_vtable kVtable = {
    sizeof(specinfer_drafter_vtable), d_destroy, d_begin, d_propose, d_commit, nullptr};

specinfer_status drafter_create(const specinfer_host *, const char *config,
                                const specinfer_model_info *info,
                                const specinfer_host_target *target, void **self,
                                const specinfer_drafter_vtable **vtable,
                                specinfer_plugin_error *err) {
  return guarded(err, "ngram", [&] {
    Config cfg(config, {"n_min", "n_max", "max_draft", "dynamic", "static", "cache_n_min",
                        "min_count", "min_share", "text", "text_min"});
    auto d = std::make_unique<Drafter>();
    d->n_min = static_cast<int32_t>(cfg.get_int("n_min", 3, 1, 16));
    d->n_max = static_cast<int32_t>(cfg.get_int("n_max", 8, 1, 16));
    d->max_draft = static_cast<int32_t>(cfg.get_int("max_draft", 16, 1, 64));
    d->use_dynamic = cfg.get_int("dynamic", 1, 0, 1) != 0;
    d->cache_n_min = static_cast<int32_t>(cfg.get_int("cache_n_min", 2, 1, 16));
    d->min_count = static_cast<uint32_t>(cfg.get_int("min_count", 2, 1, 1 << 30));
    d->min_share = cfg.get_float("min_share", 0.5, 0.0, 1.0);
    if (d->n_min > d->n_max) throw ConfigError("ngram: n_min must not exceed n_max");
    if (d->cache_n_min > d->n_max) throw ConfigError("ngram: cache_n_min must not exceed n_max");
    d->context.configure(d->n_max);
    d->use_text = cfg.get_int("text", 0, 0, 1) != 0;
    const auto text_min = static_cast<int32_t>(cfg.get_int("text_min", 5, 1, 64));
    if (d->use_text) {
      if (!target || !target->vtable || !target->vtable->tokenize || !target->vtable->token_bytes)
        throw ConfigError("ngram: text=1 needs the target's tokenizer, and this target has none");
      d->text.configure(*target, text_min);
    }
    if (cfg.has("static"))
      d->stat = specinfer_ngram::shared_corpus(cfg.get("static", ""), info, target, d->n_max + 1,
                                               "ngram");
    *self = d.release();
    *vtable = &kVtable;
  });
}

constexpr specinfer_drafter_factory kFactory = specinfer_plugin::drafter_factory(drafter_create);

}  // namespace

extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry =
    specinfer_plugin::drafter_plugin_descriptor<kFactory>(
        "ngram", "1.1",
        "n-gram drafting: prompt lookup in the context, then n-gram caches over earlier output "
        "and a corpus");
