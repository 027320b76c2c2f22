// A read-only GGUF file (versions 2 and 3) mapped into memory.
//
// open() validates the whole header up front: every count, string length, array length, tensor
// shape, type and data range is checked against the file size before anything is allocated, so a
// truncated or corrupt file throws gguf::Error (SPECINFER_ERR_IO if it cannot be read,
// SPECINFER_ERR_FORMAT if it is malformed, SPECINFER_ERR_UNSUPPORTED for an unknown version or
// tensor type) and never crashes. Tensor data pointers point into the mapping and stay valid while
// the File lives. A File is immutable after open() and may be read from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf_error.h"

namespace specinfer::gguf {

// GGUF metadata value types, numbered as in the file.
enum class ValueType : int32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

struct TensorInfo {
  std::string name;
  int32_t type;      // a ggml / specinfer_wtype number
  int32_t n_dims;    // 1..4
  int64_t ne[4];     // elements per dimension, ne[0] fastest; unused dims are 1
  uint64_t offset;   // from the start of the tensor data section
  uint64_t n_bytes;  // bytes of data
  const void *data;  // into the mapping
};

// Block layout of a weight type: values per block and bytes per block; {0, 0} if unknown.
struct TypeBlock {
  int64_t block_values;
  int64_t block_bytes;
};
TypeBlock type_block(int32_t type);
// The name of a weight type ("f32", "q8_0", ...), "unknown" if not known.
const char *type_name(int32_t type);

class File {
 public:
  // Maps and parses a file. Throws gguf::Error (IO, FORMAT, UNSUPPORTED).
  static std::unique_ptr<File> open(const std::string &path);
  // Parses a file already in memory (copied; for tests and embedded files). Same errors as open().
  static std::unique_ptr<File> from_memory(const void *data, size_t size);
  ~File();
  File(const File &) = delete;
  File &operator=(const File &) = delete;

  uint32_t version() const { return version_; }
  // Alignment of the tensor data (general.alignment, default 32).
  uint64_t alignment() const { return alignment_; }

  bool has(std::string_view key) const;
  // Type of a key's value; nullopt if absent.
  std::optional<ValueType> type_of(std::string_view key) const;
  // For arrays: the element type and count; nullopt if absent or not an array.
  std::optional<ValueType> array_type(std::string_view key) const;
  std::optional<uint64_t> array_size(std::string_view key) const;

  // Scalar getters: nullopt if absent; throw gguf::Error(FORMAT) if present with an incompatible
  // type (get_int on a string, say). get_int accepts any integer type (u64 > INT64_MAX throws);
  // get_float accepts any float or integer type; get_bool accepts bool.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;

  // Array getters: empty if absent; throw gguf::Error(FORMAT) if the key holds something else.
  // get_float_array accepts float or integer elements, get_int_array integer (or bool) elements.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  const std::vector<TensorInfo> &tensors() const { return tensors_; }
  const TensorInfo *find_tensor(std::string_view name) const;
  // Metadata keys in file order.
  std::vector<std::string> keys() const;

  // Bytes of the whole file and of the header (where the tensor data section begins).
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }

  // Tells the kernel the pages wholly inside [p, p + n) of the mapping are not needed for now: they
  // leave the process's resident memory and are read back from the file (page cache) if touched
  // again. For data the caller has copied elsewhere (packed or re-quantized weights). The bytes
  // stay valid to read. No effect on a file parsed from memory or on a range outside the mapping.
  void release(const void *p, size_t n) const;

  struct Value;  // parsed metadata value (defined in gguf_file.cpp)

 private:
  File() = default;
  void parse();
  const Value *find(std::string_view key) const;

  const uint8_t *base_ = nullptr;
  uint64_t size_ = 0;
  void *map_ = nullptr;        // mmap'd region (or nullptr)
  std::vector<uint8_t> copy_;  // from_memory's copy
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, std::unique_ptr<Value>>> kv_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace specinfer::gguf
