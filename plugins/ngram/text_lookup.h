// Prompt lookup on the text instead of the tokens, for spans copied where their tokens differ from
// the prompt's: a value copied into JSON follows a quote ("Northwind" after `"name":"`) where the
// prompt's prose had a space (" Northwind"), so its tokens, and every n-gram over them, differ
// from the prompt's although the characters are the same.
//
// TextLookup keeps the bytes of the sequence (each token's, through the target's token_bytes),
// finds the longest suffix of them, at least min_bytes long, that occurs earlier (the most recent
// occurrence), and tokenizes what followed it there with the target's tokenizer. The suffix ends
// at a token boundary, so the continuation's tokens start where the next token does; the last
// token of a continuation cut short is dropped (it may be part of a word). Header-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "specinfer_plugin.h"

namespace specinfer_ngram {

class TextLookup {
 public:
  // The target whose tokenizer spells and splits the text (kept: it outlives the drafter).
  void configure(const specinfer_host_target &target, int32_t min_bytes) {
    target_ = target;
    min_bytes_ = std::max<int32_t>(1, min_bytes);
  }

  // Makes the text the bytes of ctx[0 .. n): appends when the tokens it holds are a prefix of
  // ctx, else starts over.
  void sync(const int32_t *ctx, size_t n) {
    const bool prefix = toks_.size() <= n && std::equal(toks_.begin(), toks_.end(), ctx);
    if (!prefix) {
      toks_.clear();
      text_.clear();
    }
    for (size_t i = toks_.size(); i < n; ++i) {
      append_bytes(ctx[i]);
      toks_.push_back(ctx[i]);
    }
  }

  // Up to `want` tokens (ids below vocab) that the text after the latest earlier occurrence of
  // its longest suffix (min_bytes at least, 64 at most) spells; none when there is no such
  // occurrence.
  void draft(int32_t want, int32_t vocab, std::vector<int32_t> &out) {
    out.clear();
    if (want <= 0 || text_.size() < static_cast<size_t>(min_bytes_) + 1) return;
    const std::string_view t(text_);
    // The occurrence of the suffix of length len before it ends the text, or npos. A suffix that
    // occurs earlier has its own suffixes occur there too: the longest is found by bisection.
    const auto find = [&](size_t len) {
      return t.substr(0, t.size() - 1).rfind(t.substr(t.size() - len));
    };
    size_t lo = static_cast<size_t>(min_bytes_), hi = std::min<size_t>(kMaxSuffix, t.size() - 1);
    if (lo > hi || find(lo) == std::string_view::npos) return;
    while (lo < hi) {
      const size_t mid = (lo + hi + 1) / 2;
      if (find(mid) != std::string_view::npos)
        lo = mid;
      else
        hi = mid - 1;
    }
    const size_t from = find(lo) + lo;
    // About four bytes a token; a cut moved back to the start of a UTF-8 character.
    size_t end = std::min(t.size(), from + static_cast<size_t>(want) * 4 + 8);
    const bool cut = end < t.size();
    while (cut && end > from && (static_cast<unsigned char>(t[end]) & 0xC0) == 0x80) --end;
    if (end <= from) return;
    tokens_.resize(end - from + 8);
    size_t n = 0;
    specinfer_plugin_error err{};
    if (target_.vtable->tokenize(target_.self, t.data() + from, end - from, 0, 0, tokens_.data(),
                                 tokens_.size(), &n, &err) != SPECINFER_OK)
      return;  // a span the tokenizer refuses is not drafted
    if (cut && n > 0) --n;
    for (size_t i = 0; i < n && static_cast<int32_t>(out.size()) < want; ++i) {
      if (tokens_[i] < 0 || tokens_[i] >= vocab) break;
      out.push_back(tokens_[i]);
    }
  }

 private:
  static constexpr size_t kMaxSuffix = 64;

  void append_bytes(int32_t token) {
    char buf[64];
    size_t n = 0;
    specinfer_plugin_error err{};
    specinfer_status rc =
        target_.vtable->token_bytes(target_.self, token, buf, sizeof buf, &n, &err);
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL) {
      std::string big(n, '\0');
      rc = target_.vtable->token_bytes(target_.self, token, big.data(), big.size(), &n, &err);
      if (rc == SPECINFER_OK) text_.append(big.data(), std::min(n, big.size()));
    } else if (rc == SPECINFER_OK) {
      text_.append(buf, std::min(n, sizeof buf));
    }
    // A token without bytes (a special one, or one the target cannot spell) adds none: the text
    // around it still matches.
  }

  specinfer_host_target target_{};
  int32_t min_bytes_ = 5;
  std::vector<int32_t> toks_;
  std::string text_;
  std::vector<int32_t> tokens_;
};

}  // namespace specinfer_ngram
