// specinfer::StopStrings (stop_strings.h).
#include "session/stop_strings.h"

#include <algorithm>
#include <utility>

namespace specinfer {

void StopStrings::set(std::vector<std::string> stops) {
  stops_.clear();
  for (std::string &s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
  held_.clear();
}

bool StopStrings::push(const std::string &piece, std::string &out) {
  if (stops_.empty()) {
    out += piece;
    return false;
  }
  held_ += piece;
  // The earliest stop string in the held text ends it. Text released before held_ holds no part
  // of one: held_ always keeps the longest suffix that could begin a stop string.
  size_t first = std::string::npos;
  for (const std::string &s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    out.append(held_, 0, first);
    held_.clear();
    return true;
  }
  size_t keep = 0;
  for (const std::string &s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  out.append(held_, 0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return false;
}

void StopStrings::flush(std::string &out) {
  out += held_;
  held_.clear();
}

}  // namespace specinfer
