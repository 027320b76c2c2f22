// Decoding and encoding go through utf8proc; the GPT-2 byte map is built here.
#include "unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>

namespace specinfer::gguf::unicode {

size_t utf8_seq_len(unsigned char lead) {
  // utf8proc's class is 0 for continuation bytes and 0xF8..0xFF, else the sequence length.
  return std::max<size_t>(1, static_cast<size_t>(utf8proc_utf8class[lead]));
}

namespace {

// utf8proc refuses overlong forms (a code point spelt with more bytes than it needs, such as
// C0 80 for U+0000); llama.cpp, whose tokenization this tokenizer reproduces, decodes them to
// their value, and so does decode_utf8. Returns the form's length, or 0 if the bytes at p are not
// an overlong form of a code point outside the surrogates.
utf8proc_ssize_t decode_overlong(const utf8proc_uint8_t *p, utf8proc_ssize_t left,
                                 utf8proc_int32_t *cp) {
  const utf8proc_ssize_t len = utf8proc_utf8class[p[0]];
  if (len < 2 || len > left) return 0;
  uint32_t value = p[0] & (0xFFu >> (len + 1));
  for (utf8proc_ssize_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    value = (value << 6) | (p[i] & 0x3F);
  }
  static constexpr uint32_t kShortest[5] = {0, 0, 0x80, 0x800, 0x10000};  // least value per length
  if (value >= kShortest[len] || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  *cp = static_cast<utf8proc_int32_t>(value);
  return len;
}

}  // namespace

bool decode_utf8(std::string_view s, size_t &offset, uint32_t &cp) {
  const auto *p = reinterpret_cast<const utf8proc_uint8_t *>(s.data()) + offset;
  const auto left = static_cast<utf8proc_ssize_t>(s.size() - offset);
  utf8proc_int32_t value = -1;
  utf8proc_ssize_t len = utf8proc_iterate(p, left, &value);
  if (len <= 0) len = decode_overlong(p, left, &value);
  if (len <= 0) {
    offset += 1;
    return false;
  }
  cp = static_cast<uint32_t>(value);
  offset += static_cast<size_t>(len);
  return true;
}

void append_utf8(std::string &out, uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char *>(buf), static_cast<size_t>(n));
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
