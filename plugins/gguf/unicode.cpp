#include "unicode.h"

#include <array>

namespace specinfer::gguf::unicode {

size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;  // a continuation byte or 0xF8..0xFF: stands alone
}

bool decode_utf8(std::string_view s, size_t &offset, uint32_t &cp) {
  const size_t n = s.size();
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = at(offset);
  size_t len = 0;
  uint32_t value = 0;
  if (lead < 0x80) {
    cp = lead;
    offset += 1;
    return true;
  } else if ((lead & 0xE0) == 0xC0) {
    len = 2;
    value = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
    value = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
    value = lead & 0x07;
  } else {
    offset += 1;
    return false;
  }
  if (offset + len > n) {
    offset += 1;
    return false;
  }
  for (size_t i = 1; i < len; ++i) {
    const unsigned char c = at(offset + i);
    if ((c & 0xC0) != 0x80) {
      offset += 1;
      return false;
    }
    value = (value << 6) | (c & 0x3F);
  }
  if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    offset += 1;
    return false;
  }
  cp = value;
  offset += len;
  return true;
}

void append_utf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string sanitize_utf8(std::string_view s, bool *changed) {
  std::string out;
  out.reserve(s.size());
  bool any = false;
  size_t offset = 0;
  while (offset < s.size()) {
    const size_t start = offset;
    uint32_t cp = 0;
    if (decode_utf8(s, offset, cp)) {
      const size_t before = out.size();
      append_utf8(out, cp);
      // An overlong form re-encodes shorter; note it as a change.
      if (out.size() - before != offset - start) any = true;
    } else {
      append_utf8(out, 0xFFFD);
      any = true;
    }
  }
  if (changed) *changed = any;
  return out;
}

namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points 0..323 cover the whole image of the map
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap &byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) {
  return byte_map().to_cp[b];
}

int codepoint_to_byte(uint32_t cp) {
  const ByteMap &m = byte_map();
  return cp < m.to_byte.size() ? m.to_byte[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) append_utf8(out, byte_to_codepoint(static_cast<uint8_t>(c)));
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    uint32_t cp = 0;
    if (!decode_utf8(text, offset, cp)) return std::nullopt;
    const int b = codepoint_to_byte(cp);
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

}  // namespace specinfer::gguf::unicode
