// A small GGUF writer for tests: builds valid files (every metadata value type, tensors of any
// type given as raw bytes) in memory, so that tests can write them out or corrupt them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gguf_test {

enum : uint32_t {
  T_U8 = 0,
  T_I8 = 1,
  T_U16 = 2,
  T_I16 = 3,
  T_U32 = 4,
  T_I32 = 5,
  T_F32 = 6,
  T_BOOL = 7,
  T_STRING = 8,
  T_ARRAY = 9,
  T_U64 = 10,
  T_I64 = 11,
  T_F64 = 12
};

// Little-endian byte buffer helpers.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  void put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  void str(const std::string &s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void raw(const void *p, size_t n) {
    const uint8_t *c = static_cast<const uint8_t *>(p);
    b.insert(b.end(), c, c + n);
  }
};

class Writer {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // used for layout; add a general.alignment key yourself to change it

  // A metadata pair with an already encoded value.
  void kv_raw(const std::string &key, uint32_t type, const std::vector<uint8_t> &value) {
    kv_.str(key);
    kv_.put<uint32_t>(type);
    kv_.raw(value.data(), value.size());
    n_kv_++;
  }
  template <typename T>
  void kv(const std::string &key, uint32_t type, T v) {
    Bytes b;
    b.put<T>(v);
    kv_raw(key, type, b.b);
  }
  void kv_u8(const std::string &k, uint8_t v) { kv(k, T_U8, v); }
  void kv_i8(const std::string &k, int8_t v) { kv(k, T_I8, v); }
  void kv_u16(const std::string &k, uint16_t v) { kv(k, T_U16, v); }
  void kv_i16(const std::string &k, int16_t v) { kv(k, T_I16, v); }
  void kv_u32(const std::string &k, uint32_t v) { kv(k, T_U32, v); }
  void kv_i32(const std::string &k, int32_t v) { kv(k, T_I32, v); }
  void kv_u64(const std::string &k, uint64_t v) { kv(k, T_U64, v); }
  void kv_i64(const std::string &k, int64_t v) { kv(k, T_I64, v); }
  void kv_f32(const std::string &k, float v) { kv(k, T_F32, v); }
  void kv_f64(const std::string &k, double v) { kv(k, T_F64, v); }
  void kv_bool(const std::string &k, bool v) { kv(k, T_BOOL, uint8_t(v ? 1 : 0)); }
  void kv_str(const std::string &k, const std::string &v) {
    Bytes b;
    b.str(v);
    kv_raw(k, T_STRING, b.b);
  }
  void kv_str_array(const std::string &k, const std::vector<std::string> &v) {
    Bytes b;
    b.put<uint32_t>(T_STRING);
    b.put<uint64_t>(v.size());
    for (const auto &s : v) b.str(s);
    kv_raw(k, T_ARRAY, b.b);
  }
  template <typename T>
  void kv_array(const std::string &k, uint32_t elem_type, const std::vector<T> &v) {
    Bytes b;
    b.put<uint32_t>(elem_type);
    b.put<uint64_t>(v.size());
    for (const T &x : v) b.put<T>(x);
    kv_raw(k, T_ARRAY, b.b);
  }

  // A tensor with shape ne[0..n_dims) (ne[0] fastest) and its raw data bytes.
  void tensor(const std::string &name, uint32_t type, std::vector<uint64_t> ne, const void *data,
              size_t n_bytes) {
    Tensor t{name, type, std::move(ne), {}};
    t.data.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + n_bytes);
    tensors_.push_back(std::move(t));
  }
  void tensor_f32(const std::string &name, std::vector<uint64_t> ne, const std::vector<float> &v) {
    tensor(name, 0, std::move(ne), v.data(), v.size() * sizeof(float));
  }

  // Offsets of interesting places in the last build(): where the tensor infos begin, where each
  // tensor's offset field is, and where the data section begins.
  size_t tensor_infos_at = 0, data_at = 0;
  std::vector<size_t> offset_field_at;

  std::vector<uint8_t> build() {
    Bytes out;
    out.put<uint32_t>(0x46554747u);
    out.put<uint32_t>(version);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(n_kv_);
    out.raw(kv_.b.data(), kv_.b.size());
    tensor_infos_at = out.b.size();
    offset_field_at.clear();
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor &t : tensors_) {
      out.str(t.name);
      out.put<uint32_t>(uint32_t(t.ne.size()));
      for (uint64_t d : t.ne) out.put<uint64_t>(d);
      out.put<uint32_t>(t.type);
      offset_field_at.push_back(out.b.size());
      out.put<uint64_t>(off);
      offsets.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.b.size() % alignment) out.b.push_back(0);
    data_at = out.b.size();
    for (size_t i = 0; i < tensors_.size(); i++) {
      out.b.resize(data_at + offsets[i], 0);
      out.raw(tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out.b;
  }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  Bytes kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

inline bool write_file(const std::string &path, const std::vector<uint8_t> &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace gguf_test
