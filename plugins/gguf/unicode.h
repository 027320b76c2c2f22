// UTF-8 and byte-level helpers for the tokenizer.
//
// The byte-level BPE vocabularies (GPT-2, Qwen2, Llama 3) store every token as text in which each
// raw byte has been replaced by one printable code point (the GPT-2 "bytes to unicode" map: the
// printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100..U+0143 in order).
// These helpers convert between raw bytes and that spelling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace specinfer::gguf::unicode {

// Length of the UTF-8 sequence announced by a lead byte: 1 for ASCII and for bytes that cannot
// start a sequence, else 2..4. Callers clamp it to the bytes left in the string.
size_t utf8_seq_len(unsigned char lead);

// Decodes one code point at `offset` and advances it. Returns false (advancing by one byte) when
// the bytes there do not form a sequence (bad lead byte, missing continuation bytes, a surrogate,
// or a value above U+10FFFF). Overlong forms are accepted and decoded to their value.
bool decode_utf8(std::string_view s, size_t &offset, uint32_t &cp);

// Appends the UTF-8 encoding of a code point (<= U+10FFFF).
void append_utf8(std::string &out, uint32_t cp);

// The text re-encoded as strictly valid UTF-8: each byte that does not start a decodable
// sequence becomes U+FFFD, overlong forms are re-encoded shortest. (llama.cpp treats invalid input
// the same way before byte-level BPE.) Returns true in `changed` if anything was replaced.
std::string sanitize_utf8(std::string_view s, bool *changed = nullptr);

// The GPT-2 map: the code point that stands for a raw byte, and back (-1 if the code point does
// not stand for a byte).
uint32_t byte_to_codepoint(uint8_t b);
int codepoint_to_byte(uint32_t cp);

// Raw bytes -> their byte-level spelling.
std::string bytes_to_byte_level(std::string_view raw);
// Byte-level spelling -> raw bytes; nullopt if some code point does not stand for a byte.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace specinfer::gguf::unicode
