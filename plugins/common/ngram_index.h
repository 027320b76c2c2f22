// N-gram lookup structures shared by the ngram drafter and the draft-model drafter (header-only,
// no dependency on the library).
//
//  - ContextIndex: the current sequence with, for every n in [1, n_max], a hash map from an n-gram
//    to the position right after its most recent occurrence. Appending a token costs n_max hash
//    updates; finding the most recent continuation of a pattern is one probe (prompt lookup
//    without the linear scan).
//  - CountTable: n-gram -> how often each token followed it, over many sequences (the "dynamic"
//    cache over the session's own earlier output; a static corpus is indexed by corpus.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specinfer_ngram {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Hash of the n tokens t[0 .. n); n is part of the key.
inline uint64_t hash_ngram(const int32_t *t, int n) {
  uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(n + 1);
  for (int i = 0; i < n; ++i) h = mix64(h ^ static_cast<uint32_t>(t[i]));
  return h;
}

class ContextIndex {
 public:
  void configure(int n_max) {
    n_max_ = std::max(1, n_max);
    clear();
  }
  void clear() {
    seq_.clear();
    maps_.assign(static_cast<size_t>(n_max_) + 1, {});
  }
  size_t size() const { return seq_.size(); }
  const std::vector<int32_t> &tokens() const { return seq_; }

  void append(const int32_t *toks, size_t n) {
    for (size_t j = 0; j < n; ++j) {
      seq_.push_back(toks[j]);
      size_t i = seq_.size() - 1;  // the new token follows the n-grams ending at i - 1
      for (int k = 1; k <= n_max_ && static_cast<size_t>(k) <= i; ++k)
        maps_[static_cast<size_t>(k)][hash_ngram(&seq_[i - static_cast<size_t>(k)], k)] =
            static_cast<uint32_t>(i);
    }
  }

  // Makes the index hold exactly ctx[0 .. n): appends when the index is a prefix of ctx, else
  // rebuilds.
  void sync(const int32_t *ctx, size_t n) {
    bool prefix = seq_.size() <= n && std::equal(seq_.begin(), seq_.end(), ctx);
    if (!prefix) clear();
    append(ctx + seq_.size(), n - seq_.size());
  }

  // Position p (< size()) whose preceding k tokens equal pattern[0 .. k), the most recent such;
  // -1 when there is none (or k is out of range).
  ptrdiff_t find(const int32_t *pattern, int k) const {
    if (k < 1 || k > n_max_) return -1;
    const auto &m = maps_[static_cast<size_t>(k)];
    auto it = m.find(hash_ngram(pattern, k));
    if (it == m.end()) return -1;
    size_t p = it->second;
    if (p < static_cast<size_t>(k) ||
        !std::equal(pattern, pattern + k, seq_.begin() + static_cast<ptrdiff_t>(p - k)))
      return -1;  // a hash collision
    return static_cast<ptrdiff_t>(p);
  }

 private:
  int n_max_ = 4;
  std::vector<int32_t> seq_;
  std::vector<std::unordered_map<uint64_t, uint32_t>> maps_;
};

class CountTable {
 public:
  struct Followers {
    uint32_t total = 0;
    std::vector<std::pair<int32_t, uint32_t>> counts;  // token, count
  };

  // Counts every n-gram of seq (n in [n_min, n_max]) followed by a token.
  void add(const int32_t *seq, size_t len, int n_min, int n_max) {
    for (size_t i = 1; i < len; ++i) {
      for (int k = n_min; k <= n_max && static_cast<size_t>(k) <= i; ++k) {
        Followers &f = map_[hash_ngram(seq + i - static_cast<size_t>(k), k)];
        ++f.total;
        auto it = std::find_if(f.counts.begin(), f.counts.end(),
                               [&](const auto &c) { return c.first == seq[i]; });
        if (it != f.counts.end())
          ++it->second;
        else
          f.counts.emplace_back(seq[i], 1u);
      }
    }
  }

  // The most frequent follower of pattern[0 .. k) when it was seen at least min_count times and
  // makes up at least min_share of what followed; -1 otherwise.
  int32_t best(const int32_t *pattern, int k, uint32_t min_count, double min_share) const {
    auto it = map_.find(hash_ngram(pattern, k));
    if (it == map_.end()) return -1;
    const Followers &f = it->second;
    int32_t tok = -1;
    uint32_t top = 0;
    for (const auto &c : f.counts)
      if (c.second > top || (c.second == top && c.first < tok)) {
        top = c.second;
        tok = c.first;
      }
    if (top < min_count || top < min_share * f.total) return -1;
    return tok;
  }

  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

 private:
  std::unordered_map<uint64_t, Followers> map_;
};

// The follower `table` (a CountTable, or a CorpusIndex of corpus.h) gives for the longest suffix of
// the text ending at `end` (avail tokens long) that it knows, n from min(n_max, avail) down to
// n_min; -1 when no n gives one.
template <typename Table>
int32_t longest_follower(const Table &table, const int32_t *end, int avail, int n_min, int n_max,
                         uint32_t min_count, double min_share) {
  for (int n = std::min(n_max, avail); n >= n_min; --n) {
    const int32_t t = table.best(end - n, n, min_count, min_share);
    if (t >= 0) return t;
  }
  return -1;
}

}  // namespace specinfer_ngram
