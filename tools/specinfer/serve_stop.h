// Stop strings for `specinfer serve`: text arrives in pieces (one per round); the matcher releases
// only text that cannot be the start of a stop string, so a stop string split across pieces is
// still found and never sent, and the text ends right before the first stop string.
#pragma once

#include <string>
#include <vector>

namespace serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Takes the next piece of text; returns the text that may be sent now. After a stop string is
  // found, stopped() is true and later pieces are ignored.
  std::string push(const std::string &piece);
  // At the end of the text: what was held back (nothing after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix of the text so far that starts a stop string
  bool stopped_ = false;
};

}  // namespace serve
