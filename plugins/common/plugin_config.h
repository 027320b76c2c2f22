// Parsing of `key=value,key=value` plugin configs, shared by the built-in plugins (header-only,
// no dependency on the library). Unknown keys are an error: the caller lists the keys it knows.
// Spaces and tabs around keys and values are dropped.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "plugin_error.h"
#include "specinfer.h"

namespace specinfer_plugin {

// A bad config: SPECINFER_ERR_CONFIG with the message.
struct ConfigError : Failure {
  explicit ConfigError(const std::string &message) : Failure(SPECINFER_ERR_CONFIG, message) {}
};

class Config {
 public:
  // Throws ConfigError on a malformed entry, a duplicate key or a key not in `known`.
  Config(const char *text, std::initializer_list<const char *> known) {
    std::string s = text ? text : "";
    size_t start = 0;
    while (start < s.size()) {
      size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      std::string item = trim(s.substr(start, end - start));
      start = end + 1;
      if (item.empty()) continue;
      size_t eq = item.find('=');
      if (eq == std::string::npos || trim(item.substr(0, eq)).empty())
        throw ConfigError("config entry '" + item + "' is not key=value");
      std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
      bool ok = false;
      std::string list;
      for (const char *k : known) {
        if (key == k) ok = true;
        list += list.empty() ? k : std::string(", ") + k;
      }
      if (!ok) throw ConfigError("unknown config key '" + key + "' (known keys: " + list + ")");
      if (values_.count(key)) throw ConfigError("config key '" + key + "' given twice");
      values_[key] = value;
    }
  }

  bool has(const std::string &key) const { return values_.count(key) != 0; }

  std::string get(const std::string &key, const std::string &def) const {
    auto it = values_.find(key);
    return it == values_.end() ? def : it->second;
  }

  long get_int(const std::string &key, long def, long lo, long hi) const {
    auto it = values_.find(key);
    if (it == values_.end()) return def;
    errno = 0;
    char *end = nullptr;
    long v = std::strtol(it->second.c_str(), &end, 10);
    if (errno || end == it->second.c_str() || *end || v < lo || v > hi)
      throw ConfigError("config key '" + key + "' must be an integer in [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "], got '" + it->second + "'");
    return v;
  }

  double get_float(const std::string &key, double def, double lo, double hi) const {
    auto it = values_.find(key);
    if (it == values_.end()) return def;
    errno = 0;
    char *end = nullptr;
    double v = std::strtod(it->second.c_str(), &end);
    if (errno || end == it->second.c_str() || *end || !std::isfinite(v) || v < lo || v > hi)
      throw ConfigError("config key '" + key + "' must be a number in [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "], got '" + it->second + "'");
    return v;
  }

  // The value of an enumerated key: the code paired with the name given, `def` when absent.
  // Throws ConfigError, listing the names, for any other value.
  template <class T>
  T get_choice(const std::string &key, T def,
               std::initializer_list<std::pair<const char *, T>> names) const {
    auto it = values_.find(key);
    if (it == values_.end()) return def;
    std::string list;
    for (const auto &[name, code] : names) {
      if (it->second == name) return code;
      list += list.empty() ? name : std::string(", ") + name;
    }
    throw ConfigError("config key '" + key + "' must be one of " + list + ", got '" + it->second +
                      "'");
  }

 private:
  // s without the spaces and tabs around it.
  static std::string trim(const std::string &s) {
    const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  }

  std::map<std::string, std::string> values_;
};

}  // namespace specinfer_plugin
