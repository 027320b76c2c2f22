// Stop strings: generated text arrives in pieces (one per round, cut at token boundaries); the
// matcher releases only text that cannot be the start of a stop string, so a stop string split
// across pieces is still found and never released, and the text ends right before the earliest
// stop string.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace specinfer {

class StopStrings {
 public:
  // Replaces the stop strings (empty ones are ignored) and forgets any text held back.
  void set(std::vector<std::string> stops);
  bool empty() const { return stops_.empty(); }

  // Takes the next piece of text and appends to `out` what may be released now. Returns true when
  // a stop string completed in this piece: `out` then ends right before it, and the held text is
  // gone (the bytes of the piece after the stop string are dropped).
  bool push(const std::string &piece, std::string &out);
  // Appends the held-back text to `out` and forgets it (the text ended without a stop string).
  void flush(std::string &out);
  // Forgets the held-back text (a new prompt begins).
  void clear() { held_.clear(); }
  // The held-back text, and putting it back: a caller whose round fails after push() undoes it.
  const std::string &held() const { return held_; }
  void restore(std::string held) noexcept { held_ = std::move(held); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // the longest suffix of the text so far that is a proper prefix of a stop
};

}  // namespace specinfer
