// GGUF parsing. The header is walked once with a bounds-checked cursor; metadata values keep a
// pointer to their bytes in the mapping and are decoded on demand (they were validated here).
#include "gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "../../common/fault_point.h"

namespace specinfer::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxStringLen = uint64_t(1) << 30;

}  // namespace

struct File::Value {
  ValueType type;
  const uint8_t *raw;   // the value's bytes (for a string: the length prefix)
  ValueType elem_type;  // arrays only
  uint64_t count = 0;   // arrays only
};

TypeBlock type_block(int32_t type) {
  switch (type) {
    case 0:
      return {1, 4};  // F32
    case 1:
      return {1, 2};  // F16
    case 2:
      return {32, 18};  // Q4_0
    case 3:
      return {32, 20};  // Q4_1
    case 6:
      return {32, 22};  // Q5_0
    case 7:
      return {32, 24};  // Q5_1
    case 8:
      return {32, 34};  // Q8_0
    case 9:
      return {32, 36};  // Q8_1
    case 10:
      return {256, 84};  // Q2_K
    case 11:
      return {256, 110};  // Q3_K
    case 12:
      return {256, 144};  // Q4_K
    case 13:
      return {256, 176};  // Q5_K
    case 14:
      return {256, 210};  // Q6_K
    case 15:
      return {256, 292};  // Q8_K
    case 16:
      return {256, 66};  // IQ2_XXS
    case 17:
      return {256, 74};  // IQ2_XS
    case 18:
      return {256, 98};  // IQ3_XXS
    case 19:
      return {256, 50};  // IQ1_S
    case 20:
      return {32, 18};  // IQ4_NL
    case 21:
      return {256, 110};  // IQ3_S
    case 22:
      return {256, 82};  // IQ2_S
    case 23:
      return {256, 136};  // IQ4_XS
    case 24:
      return {1, 1};  // I8
    case 25:
      return {1, 2};  // I16
    case 26:
      return {1, 4};  // I32
    case 27:
      return {1, 8};  // I64
    case 28:
      return {1, 8};  // F64
    case 29:
      return {256, 56};  // IQ1_M
    case 30:
      return {1, 2};  // BF16
    default:
      return {0, 0};
  }
}

const char *type_name(int32_t type) {
  static const char *const names[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  "?4",     "?5",    "q5_0",  "q5_1",
      "q8_0",    "q8_1",   "q2_k",    "q3_k",  "q4_k",   "q5_k",  "q6_k",  "q8_k",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
      "i8",      "i16",    "i32",     "i64",   "f64",    "iq1_m", "bf16"};
  if (type < 0 || type >= int32_t(sizeof(names) / sizeof(names[0])) ||
      type_block(type).block_values == 0)
    return "unknown";
  return names[type];
}

namespace {

const char *value_type_name(uint32_t t) {
  static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return t < 13 ? names[t] : "invalid";
}

// Fixed size of a scalar value type; 0 for string/array/invalid.
uint64_t scalar_size(uint32_t t) {
  switch (t) {
    case 0:
    case 1:
    case 7:
      return 1;
    case 2:
    case 3:
      return 2;
    case 4:
    case 5:
    case 6:
      return 4;
    case 10:
    case 11:
    case 12:
      return 8;
    default:
      return 0;
  }
}

// The smallest number of bytes a value of type t can occupy (for bounding counts).
uint64_t min_size(uint32_t t) {
  if (t == 8) return 8;   // length prefix
  if (t == 9) return 12;  // element type + count
  return scalar_size(t);
}

// A bounds-checked reader over [base, base + size).
struct Cursor {
  const uint8_t *base;
  uint64_t size;
  uint64_t pos = 0;

  uint64_t remaining() const { return size - pos; }
  void need(uint64_t n, const char *what) const {
    if (n > size - pos)
      fail(SPECINFER_ERR_FORMAT,
           "gguf: file truncated: %s needs %llu bytes at offset %llu, only %llu left", what,
           (unsigned long long)n, (unsigned long long)pos, (unsigned long long)(size - pos));
  }
  template <typename T>
  T read(const char *what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  void skip(uint64_t n, const char *what) {
    need(n, what);
    pos += n;
  }
  std::string_view read_string(const char *what) {
    uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringLen)
      fail(SPECINFER_ERR_FORMAT, "gguf: %s: string length %llu at offset %llu is absurd", what,
           (unsigned long long)len, (unsigned long long)(pos - 8));
    need(len, what);
    std::string_view s(reinterpret_cast<const char *>(base + pos), size_t(len));
    pos += len;
    return s;
  }
};

// Validates (and skips) one value of type t at the cursor.
void skip_value(Cursor &c, uint32_t t, int depth, const std::string &key) {
  if (uint64_t n = scalar_size(t)) {
    if (t == 7) {
      c.need(1, "bool value");
      if (c.base[c.pos] > 1)
        fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': bool value %u at offset %llu is not 0 or 1",
             key.c_str(), unsigned(c.base[c.pos]), (unsigned long long)c.pos);
    }
    c.skip(n, "metadata value");
    return;
  }
  if (t == 8) {
    c.read_string("metadata string");
    return;
  }
  if (t == 9) {
    if (depth >= kMaxArrayDepth)
      fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': arrays nested deeper than %d", key.c_str(),
           kMaxArrayDepth);
    uint32_t et = c.read<uint32_t>("array element type");
    uint64_t count = c.read<uint64_t>("array length");
    if (et > 12)
      fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': invalid array element type %u at offset %llu",
           key.c_str(), et, (unsigned long long)(c.pos - 12));
    uint64_t ms = min_size(et);
    if (count > c.remaining() / ms)
      fail(SPECINFER_ERR_FORMAT,
           "gguf: key '%s': array of %llu %s elements does not fit in the %llu bytes left",
           key.c_str(), (unsigned long long)count, value_type_name(et),
           (unsigned long long)c.remaining());
    if (uint64_t es = scalar_size(et)) {
      if (et == 7) {
        for (uint64_t i = 0; i < count; i++)
          if (c.base[c.pos + i] > 1)
            fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': bool element %llu is not 0 or 1",
                 key.c_str(), (unsigned long long)i);
      }
      c.skip(count * es, "array data");
      return;
    }
    for (uint64_t i = 0; i < count; i++) skip_value(c, et, depth + 1, key);
    return;
  }
  fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': invalid value type %u", key.c_str(), t);
}

bool is_int_type(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
      return true;
    default:
      return false;
  }
}
bool is_float_type(ValueType t) {
  return t == ValueType::F32 || t == ValueType::F64;
}

template <typename T>
T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes an integer of type t at p; throws if a u64 does not fit in int64.
int64_t decode_int(ValueType t, const uint8_t *p, std::string_view key) {
  switch (t) {
    case ValueType::U8:
      return load<uint8_t>(p);
    case ValueType::I8:
      return load<int8_t>(p);
    case ValueType::U16:
      return load<uint16_t>(p);
    case ValueType::I16:
      return load<int16_t>(p);
    case ValueType::U32:
      return load<uint32_t>(p);
    case ValueType::I32:
      return load<int32_t>(p);
    case ValueType::I64:
      return load<int64_t>(p);
    case ValueType::U64: {
      uint64_t v = load<uint64_t>(p);
      if (v > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(SPECINFER_ERR_FORMAT, "gguf: key '%.*s': u64 value %llu does not fit in int64",
             int(key.size()), key.data(), (unsigned long long)v);
      return int64_t(v);
    }
    case ValueType::BOOL:
      return load<uint8_t>(p);
    default:
      break;
  }
  fail(SPECINFER_ERR_FORMAT, "gguf: key '%.*s' is not an integer", int(key.size()), key.data());
}

double decode_float(ValueType t, const uint8_t *p, std::string_view key) {
  if (t == ValueType::F32) return load<float>(p);
  if (t == ValueType::F64) return load<double>(p);
  return double(decode_int(t, p, key));
}

[[noreturn]] void wrong_type(std::string_view key, const char *want, ValueType have) {
  fail(SPECINFER_ERR_FORMAT, "gguf: key '%.*s' holds a %s, not %s", int(key.size()), key.data(),
       value_type_name(uint32_t(have)), want);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::unique_ptr<File> File::open(const std::string &path) {
  // Each system call below can be made to fail by a fault-injection test (common/fault_point.h),
  // with the errno the system gives for an unreadable file.
  int fd =
      fault_injected(FAULT_READ) ? (errno = EIO, -1) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    fail(e == ENOENT ? SPECINFER_ERR_NOT_FOUND : SPECINFER_ERR_IO, "gguf: cannot open '%s': %s",
         path.c_str(), std::strerror(e));
  }
  struct stat st;
  if (fault_injected(FAULT_READ) ? (errno = EIO, true) : fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(SPECINFER_ERR_IO, "gguf: cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(SPECINFER_ERR_IO, "gguf: '%s' is not a regular file", path.c_str());
  }
  if (st.st_size < 24) {
    ::close(fd);
    fail(SPECINFER_ERR_FORMAT, "gguf: '%s' is too small (%lld bytes) to be a GGUF file",
         path.c_str(), (long long)st.st_size);
  }
  // The File exists before the mapping, so that the mapping is never without its owner.
  std::unique_ptr<File> f;
  try {
    f.reset(new File());
  } catch (...) {
    ::close(fd);
    throw;
  }
  void *m = fault_injected(FAULT_READ)
                ? (errno = ENOMEM, MAP_FAILED)
                : mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED)
    fail(SPECINFER_ERR_IO, "gguf: cannot map '%s': %s", path.c_str(), std::strerror(e));
  f->map_ = m;
  f->base_ = static_cast<const uint8_t *>(m);
  f->size_ = uint64_t(st.st_size);
  try {
    f->parse();
  } catch (const Error &err) {
    throw Error(err.code(), std::string(err.what()) + " (in '" + path + "')");
  }
  return f;
}

std::unique_ptr<File> File::from_memory(const void *data, size_t size) {
  if (data == nullptr && size != 0) fail(SPECINFER_ERR_INVALID_ARGUMENT, "gguf: NULL buffer");
  std::unique_ptr<File> f(new File());
  f->copy_.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + size);
  f->base_ = f->copy_.data();
  f->size_ = size;
  f->parse();
  return f;
}

void File::release(const void *p, size_t n) const {
  if (map_ == nullptr || p == nullptr) return;
  const auto begin = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(map_);
  if (begin < base || n > size_ || begin - base > size_ - n) return;
  const long page_size = sysconf(_SC_PAGESIZE);
  if (page_size <= 0) return;
  const auto page = uintptr_t(page_size);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + n) / page * page;
  // Read-only private mapping, never written: dropped pages come back from the file unchanged.
  if (first < last) madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
}

File::~File() {
  if (map_ != nullptr) munmap(map_, size_t(size_));
}

namespace {

using KeyValues = std::vector<std::pair<std::string, std::unique_ptr<File::Value>>>;

// Reads and checks the fixed header; the version into *version, the counts into *n_tensors and
// *n_kv.
void read_header(Cursor &c, uint32_t *version, uint64_t *n_tensors, uint64_t *n_kv) {
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic)
    fail(SPECINFER_ERR_FORMAT, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
  *version = c.read<uint32_t>("version");
  if (*version == 1)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: version 1 files are not supported (only 2 and 3)");
  if (*version != 2 && *version != 3) {
    if ((*version & 0xffffu) == 0 && *version != 0)
      fail(SPECINFER_ERR_UNSUPPORTED, "gguf: big-endian GGUF files are not supported");
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: unsupported version %u (only 2 and 3)", *version);
  }
  *n_tensors = c.read<uint64_t>("tensor count");
  *n_kv = c.read<uint64_t>("metadata count");
  // Every key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes, every tensor info at
  // least 8 + 4 + 8 + 4 + 8; so counts larger than this are corrupt, whatever else follows.
  if (*n_kv > c.remaining() / 13)
    fail(SPECINFER_ERR_FORMAT, "gguf: metadata count %llu cannot fit in a %llu-byte file",
         (unsigned long long)*n_kv, (unsigned long long)c.size);
  if (*n_tensors > c.remaining() / 32)
    fail(SPECINFER_ERR_FORMAT, "gguf: tensor count %llu cannot fit in a %llu-byte file",
         (unsigned long long)*n_tensors, (unsigned long long)c.size);
}

// Reads n_kv metadata pairs into *kv, each value checked and pointed at in place.
void read_metadata(Cursor &c, uint64_t n_kv, KeyValues *kv) {
  kv->reserve(size_t(n_kv));
  std::unordered_set<std::string_view> seen;
  for (uint64_t i = 0; i < n_kv; i++) {
    std::string_view key = c.read_string("metadata key");
    if (key.empty())
      fail(SPECINFER_ERR_FORMAT, "gguf: metadata key %llu is empty", (unsigned long long)i);
    std::string k(key);
    if (!seen.insert(key).second)
      fail(SPECINFER_ERR_FORMAT, "gguf: duplicate metadata key '%s'", k.c_str());
    uint32_t t = c.read<uint32_t>("metadata value type");
    if (t > 12) fail(SPECINFER_ERR_FORMAT, "gguf: key '%s': invalid value type %u", k.c_str(), t);
    auto v = std::make_unique<File::Value>();
    v->type = ValueType(t);
    v->raw = c.base + c.pos;
    if (t == 9) {
      c.need(12, "array header");
      v->elem_type = ValueType(load<uint32_t>(c.base + c.pos));
      v->count = load<uint64_t>(c.base + c.pos + 4);
    }
    skip_value(c, t, 0, k);
    kv->emplace_back(std::move(k), std::move(v));
  }
}

// Reads and checks one tensor info; `names` are the names read so far.
TensorInfo read_tensor_info(Cursor &c, uint64_t alignment,
                            std::unordered_set<std::string_view> &names) {
  TensorInfo t{};
  std::string_view name = c.read_string("tensor name");
  t.name = std::string(name);
  if (!names.insert(name).second)
    fail(SPECINFER_ERR_FORMAT, "gguf: duplicate tensor name '%s'", t.name.c_str());
  uint32_t nd = c.read<uint32_t>("tensor dimension count");
  if (nd == 0 || nd > 4)
    fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' has %u dimensions (must be 1..4)", t.name.c_str(),
         nd);
  t.n_dims = int32_t(nd);
  uint64_t n_elem = 1;
  for (int d = 0; d < 4; d++) t.ne[d] = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne = c.read<uint64_t>("tensor dimension");
    if (ne == 0 || ne > (uint64_t(1) << 40))
      fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' dimension %u is %llu (must be 1..2^40)",
           t.name.c_str(), d, (unsigned long long)ne);
    if (n_elem > (uint64_t(1) << 50) / ne)
      fail(SPECINFER_ERR_FORMAT, "gguf: tensor '%s' has too many elements", t.name.c_str());
    n_elem *= ne;
    t.ne[d] = int64_t(ne);
  }
  uint32_t type = c.read<uint32_t>("tensor type");
  t.type = int32_t(type);
  TypeBlock b = type_block(t.type);
  if (type > 1000 || b.block_values == 0)
    fail(SPECINFER_ERR_UNSUPPORTED, "gguf: tensor '%s' has unknown type %u", t.name.c_str(), type);
  if (t.ne[0] % b.block_values != 0)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s': row length %lld is not a multiple of the %s block size %lld",
         t.name.c_str(), (long long)t.ne[0], type_name(t.type), (long long)b.block_values);
  t.n_bytes = n_elem / uint64_t(b.block_values) * uint64_t(b.block_bytes);
  t.offset = c.read<uint64_t>("tensor offset");
  if (t.offset % alignment != 0)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: tensor '%s' offset %llu is not a multiple of the alignment %llu", t.name.c_str(),
         (unsigned long long)t.offset, (unsigned long long)alignment);
  return t;
}

// Points every tensor at its data, which must lie inside the data section (data_size bytes from
// base + data_offset) without overlapping another tensor's.
void place_tensors(std::vector<TensorInfo> &tensors, const uint8_t *base, uint64_t data_offset,
                   uint64_t data_size) {
  for (TensorInfo &t : tensors) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail(SPECINFER_ERR_FORMAT,
           "gguf: tensor '%s' data [%llu, +%llu) lies past the end of the file (data section is "
           "%llu bytes)",
           t.name.c_str(), (unsigned long long)t.offset, (unsigned long long)t.n_bytes,
           (unsigned long long)data_size);
    t.data = base + data_offset + t.offset;
  }
  // Tensor data ranges must not overlap.
  std::vector<const TensorInfo *> order;
  order.reserve(tensors.size());
  for (const TensorInfo &t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo *a, const TensorInfo *b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); i++) {
    const TensorInfo *p = order[i - 1], *q = order[i];
    if (p->offset + p->n_bytes > q->offset)
      fail(SPECINFER_ERR_FORMAT, "gguf: tensors '%s' and '%s' overlap in the data section",
           p->name.c_str(), q->name.c_str());
  }
}

}  // namespace

void File::parse() {
  Cursor c{base_, size_};
  uint64_t n_tensors = 0, n_kv = 0;
  read_header(c, &version_, &n_tensors, &n_kv);
  read_metadata(c, n_kv, &kv_);

  if (const Value *a = find("general.alignment")) {
    if (!is_int_type(a->type))
      fail(SPECINFER_ERR_FORMAT, "gguf: general.alignment is a %s, not an integer",
           value_type_name(uint32_t(a->type)));
    int64_t al = decode_int(a->type, a->raw, "general.alignment");
    if (al <= 0 || al > (int64_t(1) << 20) || (al & (al - 1)) != 0)
      fail(SPECINFER_ERR_FORMAT, "gguf: general.alignment %lld is not a power of two <= 1 MiB",
           (long long)al);
    alignment_ = uint64_t(al);
  }

  tensors_.reserve(size_t(n_tensors));
  std::unordered_set<std::string_view> names;
  for (uint64_t i = 0; i < n_tensors; i++)
    tensors_.push_back(read_tensor_info(c, alignment_, names));

  // The data section starts at the next multiple of the alignment after the header.
  uint64_t header_end = c.pos;
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_)
    fail(SPECINFER_ERR_FORMAT,
         "gguf: file truncated: tensor data would start at %llu, file has %llu bytes",
         (unsigned long long)data_offset_, (unsigned long long)size_);
  uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  place_tensors(tensors_, base_, data_offset_, data_size);
}

// ---------------------------------------------------------------------------------------------

const File::Value *File::find(std::string_view key) const {
  for (const auto &kv : kv_)
    if (kv.first == key) return kv.second.get();
  return nullptr;
}

bool File::has(std::string_view key) const {
  return find(key) != nullptr;
}

std::optional<ValueType> File::type_of(std::string_view key) const {
  const Value *v = find(key);
  if (!v) return std::nullopt;
  return v->type;
}

std::optional<ValueType> File::array_type(std::string_view key) const {
  const Value *v = find(key);
  if (!v || v->type != ValueType::ARRAY) return std::nullopt;
  return v->elem_type;
}

std::optional<uint64_t> File::array_size(std::string_view key) const {
  const Value *v = find(key);
  if (!v || v->type != ValueType::ARRAY) return std::nullopt;
  return v->count;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value *v = find(key);
  if (!v) return std::nullopt;
  if (!is_int_type(v->type)) wrong_type(key, "an integer", v->type);
  return decode_int(v->type, v->raw, key);
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value *v = find(key);
  if (!v) return std::nullopt;
  if (!is_int_type(v->type) && !is_float_type(v->type)) wrong_type(key, "a number", v->type);
  return decode_float(v->type, v->raw, key);
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value *v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(key, "a bool", v->type);
  return v->raw[0] != 0;
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value *v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(key, "a string", v->type);
  uint64_t len = load<uint64_t>(v->raw);
  return std::string(reinterpret_cast<const char *>(v->raw + 8), size_t(len));
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
  std::vector<std::string> out;
  const Value *v = find(key);
  if (!v) return out;
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
    wrong_type(key, "an array of strings", v->type);
  out.reserve(size_t(v->count));
  const uint8_t *p = v->raw + 12;
  for (uint64_t i = 0; i < v->count; i++) {
    uint64_t len = load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char *>(p + 8), size_t(len));
    p += 8 + len;
  }
  return out;
}

std::vector<float> File::get_float_array(std::string_view key) const {
  std::vector<float> out;
  const Value *v = find(key);
  if (!v) return out;
  if (v->type != ValueType::ARRAY || !(is_int_type(v->elem_type) || is_float_type(v->elem_type)))
    wrong_type(key, "an array of numbers", v->type);
  uint64_t es = scalar_size(uint32_t(v->elem_type));
  out.reserve(size_t(v->count));
  const uint8_t *p = v->raw + 12;
  for (uint64_t i = 0; i < v->count; i++)
    out.push_back(float(decode_float(v->elem_type, p + i * es, key)));
  return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  std::vector<int64_t> out;
  const Value *v = find(key);
  if (!v) return out;
  if (v->type != ValueType::ARRAY ||
      !(is_int_type(v->elem_type) || v->elem_type == ValueType::BOOL))
    wrong_type(key, "an array of integers", v->type);
  uint64_t es = scalar_size(uint32_t(v->elem_type));
  out.reserve(size_t(v->count));
  const uint8_t *p = v->raw + 12;
  for (uint64_t i = 0; i < v->count; i++) out.push_back(decode_int(v->elem_type, p + i * es, key));
  return out;
}

const TensorInfo *File::find_tensor(std::string_view name) const {
  for (const TensorInfo &t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<std::string> File::keys() const {
  std::vector<std::string> out;
  out.reserve(kv_.size());
  for (const auto &kv : kv_) out.push_back(kv.first);
  return out;
}

}  // namespace specinfer::gguf
