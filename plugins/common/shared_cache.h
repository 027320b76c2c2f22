// Immutable objects a plugin builds once per process and shares (header-only): a heads file's
// prepared matrices, a static corpus's index. The cache holds them weakly, so an object lives
// while any drafter holds it and is built again once none does.
#pragma once

#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace specinfer_plugin {

template <typename T>
class SharedCache {
 public:
  // The object held for `key`, or the one build() returns (a std::shared_ptr<T>) when none is.
  // build runs without the lock, so two threads may build the same key; the first one stored is
  // the one both get. An exception from build leaves the cache as it was.
  template <typename Build>
  std::shared_ptr<const T> get(const std::string &key, Build &&build) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_key_.find(key);
      if (it != by_key_.end())
        if (auto held = it->second.lock()) return held;
    }
    std::shared_ptr<const T> built = build();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = by_key_.begin(); it != by_key_.end();)
      it = it->second.expired() ? by_key_.erase(it) : std::next(it);
    auto &slot = by_key_[key];
    if (auto held = slot.lock()) return held;
    slot = built;
    return built;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::weak_ptr<const T>> by_key_;
};

}  // namespace specinfer_plugin
