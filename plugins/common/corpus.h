// A static corpus for n-gram drafting, shared by the ngram and medusa drafters (header-only): a
// text file tokenized with the target's tokenizer, and an index that answers what CountTable
// (ngram_index.h) answers, the most frequent follower of an n-gram, without a hash table per
// n-gram.
//
//  - tokenize_corpus: the file's tokens, a line-aligned chunk of 16 KiB at a time.
//  - CorpusIndex: the corpus's positions sorted by the `depth` tokens that start there (a suffix
//    array cut at that depth). The occurrences of an n-gram (n < depth) form one range of it, in
//    which the tokens that follow are sorted, so the most frequent follower is found by jumping
//    from one run of equal followers to the next. Two int32 per corpus token (the Python standard
//    library's 2.8 million tokens: 22 MB, about 5 s with tokenizing), where a CountTable over
//    n = 2..8 takes 0.9 GB and half a minute.
//  - shared_corpus: one index per file, tokenizer and depth in the process, shared by every
//    drafter that asks for it while any of them holds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "../../common/fault_point.h"
#include "plugin_config.h"
#include "plugin_error.h"
#include "shared_cache.h"
#include "specinfer_plugin.h"

namespace specinfer_ngram {

// The corpus size refused with a message (its tokens and index would take about 2 GB).
constexpr size_t kMaxCorpusBytes = size_t{256} << 20;

// Tokenizes the text file at `path` with the target's tokenizer. Throws ConfigError (no
// tokenizer, a file that cannot be opened, one over kMaxCorpusBytes) or Failure (a read error,
// the tokenizer's own failure); messages start with `plugin`.
inline std::vector<int32_t> tokenize_corpus(const std::string &path,
                                            const specinfer_host_target *target,
                                            const std::string &plugin) {
  using specinfer_plugin::ConfigError;
  using specinfer_plugin::Failure;
  if (!target || !target->vtable || !target->vtable->tokenize)
    throw ConfigError(plugin + ": static=... needs the target's tokenizer");
  std::ifstream in;
  if (!specinfer::fault_injected(specinfer::FAULT_READ)) in.open(path, std::ios::binary);
  if (!in) throw ConfigError(plugin + ": cannot read the static corpus '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad() || specinfer::fault_injected(specinfer::FAULT_READ))
    throw Failure(SPECINFER_ERR_IO, plugin + ": cannot read the static corpus '" + path + "'");
  if (text.size() > kMaxCorpusBytes)
    throw ConfigError(plugin + ": the static corpus exceeds 256 MiB");
  std::vector<int32_t> all, buf;
  specinfer_plugin_error e{};
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + 16384);
    if (end < text.size()) {
      size_t nl = text.rfind('\n', end);
      if (nl != std::string::npos && nl > pos) end = nl + 1;
    }
    size_t n = 0;
    buf.resize((end - pos) + 16);
    specinfer_status rc = target->vtable->tokenize(target->self, text.data() + pos, end - pos, 0, 0,
                                                   buf.data(), buf.size(), &n, &e);
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL) {
      buf.resize(n);
      rc = target->vtable->tokenize(target->self, text.data() + pos, end - pos, 0, 0, buf.data(),
                                    buf.size(), &n, &e);
    }
    if (rc != SPECINFER_OK)  // the target's status (out of memory, say), not a config error
      throw Failure(rc, plugin + ": tokenizing the static corpus failed: " + e.message);
    all.insert(all.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    pos = end;
  }
  return all;
}

class CorpusIndex {
 public:
  // Indexes `tokens` for patterns of up to depth - 1 tokens (depth >= 2).
  CorpusIndex(std::vector<int32_t> tokens, int depth)
      : tok_(std::move(tokens)), depth_(std::max(2, depth)) {
    sa_.resize(tok_.size());
    for (size_t i = 0; i < sa_.size(); ++i) sa_[i] = static_cast<uint32_t>(i);
    const size_t N = tok_.size(), d = static_cast<size_t>(depth_);
    std::sort(sa_.begin(), sa_.end(), [&](uint32_t a, uint32_t b) {
      const size_t na = std::min(d, N - a), nb = std::min(d, N - b);
      for (size_t i = 0; i < std::min(na, nb); ++i)
        if (tok_[a + i] != tok_[b + i]) return tok_[a + i] < tok_[b + i];
      return na != nb ? na < nb : a < b;  // a proper prefix first
    });
  }

  bool empty() const { return tok_.empty(); }
  size_t tokens() const { return tok_.size(); }

  // As CountTable::best over the corpus with this n: the token that most often followed
  // pattern[0 .. k) (the lower id on a tie) when it did so at least min_count times and at least
  // min_share of the times the pattern was followed by a token; -1 otherwise, and for k outside
  // [1, depth).
  int32_t best(const int32_t *pattern, int k, uint32_t min_count, double min_share) const {
    if (k < 1 || k >= depth_ || tok_.empty()) return -1;
    const size_t n = static_cast<size_t>(k);
    size_t lo = bound(pattern, n, false), hi = bound(pattern, n, true);
    // The one occurrence that ends the corpus has no follower; it sorts first among its equals.
    if (lo < hi && tok_.size() - sa_[lo] == n) ++lo;
    const size_t total = hi - lo;
    if (total == 0) return -1;
    int32_t best_tok = -1;
    size_t best_n = 0;
    for (size_t i = lo; i < hi;) {
      const int32_t t = tok_[sa_[i] + n];
      // The end of the run of follower t (followers are sorted within [lo, hi)).
      const size_t j =
          static_cast<size_t>(std::partition_point(sa_.begin() + static_cast<ptrdiff_t>(i),
                                                   sa_.begin() + static_cast<ptrdiff_t>(hi),
                                                   [&](uint32_t p) { return tok_[p + n] <= t; }) -
                              sa_.begin());
      if (j - i > best_n) {
        best_n = j - i;
        best_tok = t;
      }
      if (best_n >= hi - j) break;  // no later run can have more
      i = j;
    }
    if (best_n < min_count || static_cast<double>(best_n) < min_share * static_cast<double>(total))
      return -1;
    return best_tok;
  }

 private:
  // Compares the corpus's tokens at position a (up to the corpus's end) with p[0 .. n): negative
  // when they sort first (a proper prefix of p sorts first), 0 when the first n are equal.
  int compare(size_t a, const int32_t *p, size_t n) const {
    const size_t avail = tok_.size() - a;
    const size_t m = std::min(avail, n);
    for (size_t i = 0; i < m; ++i)
      if (tok_[a + i] != p[i]) return tok_[a + i] < p[i] ? -1 : 1;
    return avail < n ? -1 : 0;
  }

  // The first entry of sa_ whose n tokens sort after the pattern (upper) or not before it.
  size_t bound(const int32_t *pattern, size_t n, bool upper) const {
    return static_cast<size_t>(std::partition_point(sa_.begin(), sa_.end(),
                                                    [&](uint32_t p) {
                                                      const int c = compare(p, pattern, n);
                                                      return upper ? c <= 0 : c < 0;
                                                    }) -
                               sa_.begin());
  }

  std::vector<int32_t> tok_;
  std::vector<uint32_t> sa_;
  int depth_;
};

// The index of the corpus at `path` tokenized by `target`'s tokenizer, for patterns of up to
// depth - 1 tokens: built once per process for a file (its size and modification time), model
// (name and vocabulary size) and depth, and shared while any drafter holds it. Throws as
// tokenize_corpus.
inline std::shared_ptr<const CorpusIndex> shared_corpus(const std::string &path,
                                                        const specinfer_model_info *info,
                                                        const specinfer_host_target *target,
                                                        int depth, const std::string &plugin) {
  struct stat st {};
  if (specinfer::fault_injected(specinfer::FAULT_READ) || ::stat(path.c_str(), &st) != 0)
    throw specinfer_plugin::ConfigError(plugin + ": cannot read the static corpus '" + path + "'");
  const std::string key =
      path + '|' + std::to_string(st.st_size) + '|' + std::to_string(st.st_mtim.tv_sec) + '.' +
      std::to_string(st.st_mtim.tv_nsec) + '|' + (info && info->name ? info->name : "") + '|' +
      std::to_string(info ? info->vocab_size : 0) + '|' + std::to_string(depth);
  static specinfer_plugin::SharedCache<CorpusIndex> cache;
  return cache.get(key, [&] {
    return std::make_shared<const CorpusIndex>(tokenize_corpus(path, target, plugin), depth);
  });
}

}  // namespace specinfer_ngram
