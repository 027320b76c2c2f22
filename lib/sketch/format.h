// The serialized form of a sketch: a self-describing byte string, so that bytes from another
// sketcher, another program or a truncated file are recognised rather than misread.
//
//   offset  size  field
//   0       4     magic "SKch"
//   4       2     format version (kFormatVersion), little-endian like every field
//   6       1     kind (Kind)
//   7       1     role (0 key / plain, 1 query)
//   8       4     dimension d
//   12      4     size m
//   16      8     config hash: seed, kind, d, m and the options that change the randomness
//   24      4     count: entries in the payload (m for projections, samples for samplers)
//   28      4     payload bytes (the sketch is exactly 32 + this long)
//   32      ...   payload, laid out per kind (see the sketchers)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace specinfer::sketch {

enum class Kind : uint8_t { jl = 1, countsketch = 2, qjl = 3, threshold = 4, priority = 5 };
enum class Role : uint8_t { key = 0, query = 1 };

constexpr size_t kHeaderBytes = 32;
constexpr uint16_t kFormatVersion = 1;
constexpr unsigned char kMagic[4] = {'S', 'K', 'c', 'h'};

struct Header {
  Kind kind = Kind::jl;
  Role role = Role::key;
  uint32_t dim = 0;
  uint32_t size = 0;
  uint64_t config = 0;
  uint32_t count = 0;
  uint32_t payload_bytes = 0;
};

// A parsed, structurally checked sketch; `payload` points into the caller's bytes.
struct View {
  Header h;
  const unsigned char *payload = nullptr;
};

// Writes the 32-byte header.
void write_header(unsigned char *out, const Header &h);
// Parses and checks magic, version, kind, role and that `len` is exactly 32 + payload bytes.
// Throws SPECINFER_ERR_FORMAT (with what is wrong) otherwise; INVALID_ARGUMENT for NULL.
View parse_sketch(const void *bytes, size_t len);
// The name of a kind ("jl", ...).
const char *kind_name(Kind kind);

template <typename T>
inline T load_le(const unsigned char *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void store_le(unsigned char *p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace specinfer::sketch
