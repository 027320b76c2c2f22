// A minimal JSON reader for the reference files of the gguf tests (objects, arrays, strings with
// escapes, numbers, true/false/null). Throws std::runtime_error on malformed input.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gguf_test {

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json *get(const std::string &key) const {
    for (const auto &kv : obj)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  const Json &at(const std::string &key) const {
    const Json *j = get(key);
    if (!j) throw std::runtime_error("json: missing key " + key);
    return *j;
  }

  static Json parse(const std::string &text) {
    size_t pos = 0;
    Json j = parse_value(text, pos);
    skip_ws(text, pos);
    if (pos != text.size()) throw std::runtime_error("json: trailing data");
    return j;
  }

 private:
  static void skip_ws(const std::string &t, size_t &p) {
    while (p < t.size() && (t[p] == ' ' || t[p] == '\n' || t[p] == '\r' || t[p] == '\t')) p++;
  }
  static void expect(const std::string &t, size_t &p, char c) {
    skip_ws(t, p);
    if (p >= t.size() || t[p] != c) throw std::runtime_error(std::string("json: expected ") + c);
    p++;
  }
  static void put_utf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  static uint32_t hex4(const std::string &t, size_t &p) {
    if (p + 4 > t.size()) throw std::runtime_error("json: short \\u escape");
    uint32_t v = uint32_t(std::strtoul(t.substr(p, 4).c_str(), nullptr, 16));
    p += 4;
    return v;
  }
  static std::string parse_string(const std::string &t, size_t &p) {
    expect(t, p, '"');
    std::string out;
    while (p < t.size() && t[p] != '"') {
      char c = t[p++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= t.size()) break;
      char e = t[p++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          uint32_t cp = hex4(t, p);
          if (cp >= 0xD800 && cp < 0xDC00 && p + 6 <= t.size() && t[p] == '\\' && t[p + 1] == 'u') {
            p += 2;
            uint32_t lo = hex4(t, p);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          out += e;
          break;
      }
    }
    expect(t, p, '"');
    return out;
  }
  static Json parse_value(const std::string &t, size_t &p) {
    skip_ws(t, p);
    if (p >= t.size()) throw std::runtime_error("json: unexpected end");
    Json j;
    char c = t[p];
    if (c == '{') {
      j.kind = Object;
      p++;
      skip_ws(t, p);
      if (p < t.size() && t[p] == '}') {
        p++;
        return j;
      }
      for (;;) {
        std::string k = parse_string(t, p);
        expect(t, p, ':');
        j.obj.emplace_back(std::move(k), parse_value(t, p));
        skip_ws(t, p);
        if (p < t.size() && t[p] == ',') {
          p++;
          continue;
        }
        expect(t, p, '}');
        return j;
      }
    }
    if (c == '[') {
      j.kind = Array;
      p++;
      skip_ws(t, p);
      if (p < t.size() && t[p] == ']') {
        p++;
        return j;
      }
      for (;;) {
        j.arr.push_back(parse_value(t, p));
        skip_ws(t, p);
        if (p < t.size() && t[p] == ',') {
          p++;
          continue;
        }
        expect(t, p, ']');
        return j;
      }
    }
    if (c == '"') {
      j.kind = String;
      j.str = parse_string(t, p);
      return j;
    }
    if (t.compare(p, 4, "true") == 0) {
      j.kind = Bool;
      j.b = true;
      p += 4;
      return j;
    }
    if (t.compare(p, 5, "false") == 0) {
      j.kind = Bool;
      p += 5;
      return j;
    }
    if (t.compare(p, 4, "null") == 0) {
      p += 4;
      return j;
    }
    char *end = nullptr;
    j.kind = Number;
    j.num = std::strtod(t.c_str() + p, &end);
    if (end == t.c_str() + p) throw std::runtime_error("json: bad value");
    p = size_t(end - t.c_str());
    return j;
  }
};

}  // namespace gguf_test
