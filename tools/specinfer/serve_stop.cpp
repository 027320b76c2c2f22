// serve::StopMatcher (serve_stop.h).
#include "serve_stop.h"

#include <algorithm>
#include <utility>

namespace serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string &s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(const std::string &piece) {
  if (stopped_) return "";
  held_ += piece;
  // The earliest stop string in the held text ends it. Text released before held_ cannot hold the
  // start of one: held_ always keeps the longest suffix that begins a stop string.
  size_t first = std::string::npos;
  for (const std::string &s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  size_t keep = 0;  // length of the longest suffix of held_ that is a proper prefix of a stop
  for (const std::string &s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace serve
