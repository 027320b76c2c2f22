#include "sketch/format.h"

#include "util/error.h"

namespace specinfer::sketch {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the sketch format assumes little-endian");

const char *kind_name(Kind kind) {
  switch (kind) {
    case Kind::jl:
      return "jl";
    case Kind::countsketch:
      return "countsketch";
    case Kind::qjl:
      return "qjl";
    case Kind::threshold:
      return "threshold";
    case Kind::priority:
      return "priority";
  }
  return "unknown";
}

void write_header(unsigned char *out, const Header &h) {
  std::memcpy(out, kMagic, 4);
  store_le<uint16_t>(out + 4, kFormatVersion);
  out[6] = static_cast<unsigned char>(h.kind);
  out[7] = static_cast<unsigned char>(h.role);
  store_le<uint32_t>(out + 8, h.dim);
  store_le<uint32_t>(out + 12, h.size);
  store_le<uint64_t>(out + 16, h.config);
  store_le<uint32_t>(out + 24, h.count);
  store_le<uint32_t>(out + 28, h.payload_bytes);
}

View parse_sketch(const void *bytes, size_t len) {
  if (!bytes) fail(SPECINFER_ERR_INVALID_ARGUMENT, "sketch bytes are NULL");
  const auto *p = static_cast<const unsigned char *>(bytes);
  if (len < kHeaderBytes)
    fail(SPECINFER_ERR_FORMAT, "sketch truncated: %zu bytes, a header alone is %zu", len,
         kHeaderBytes);
  if (std::memcmp(p, kMagic, 4) != 0) fail(SPECINFER_ERR_FORMAT, "not a sketch (bad magic)");
  const uint16_t version = load_le<uint16_t>(p + 4);
  if (version != kFormatVersion)
    fail(SPECINFER_ERR_FORMAT, "sketch format version %u, this library reads version %u",
         static_cast<unsigned>(version), static_cast<unsigned>(kFormatVersion));
  View v;
  const unsigned kind = p[6], role = p[7];
  if (kind < 1 || kind > 5) fail(SPECINFER_ERR_FORMAT, "unknown sketch kind %u", kind);
  if (role > 1) fail(SPECINFER_ERR_FORMAT, "unknown sketch role %u", role);
  v.h.kind = static_cast<Kind>(kind);
  v.h.role = static_cast<Role>(role);
  v.h.dim = load_le<uint32_t>(p + 8);
  v.h.size = load_le<uint32_t>(p + 12);
  v.h.config = load_le<uint64_t>(p + 16);
  v.h.count = load_le<uint32_t>(p + 24);
  v.h.payload_bytes = load_le<uint32_t>(p + 28);
  if (len - kHeaderBytes != v.h.payload_bytes)
    fail(SPECINFER_ERR_FORMAT, "sketch is %zu bytes but its header says %zu (truncated or padded)",
         len, kHeaderBytes + static_cast<size_t>(v.h.payload_bytes));
  v.payload = p + kHeaderBytes;
  return v;
}

}  // namespace specinfer::sketch
