// White-box tests of the GGUF reader: valid files with every metadata type round-trip; a corpus of
// truncated and corrupt files gives gguf::Error with a message (never a crash; CI runs this under
// ASan + UBSan).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "data/gguf/gguf_writer.h"
#include "gguf/gguf_file.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

using namespace gguf_test;
using specinfer::gguf::Error;
using specinfer::gguf::File;
using specinfer::gguf::ValueType;

namespace {

std::vector<float> iota_f32(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = start + float(i);
  return v;
}

// A valid file holding every value type and three tensors.
Writer full_writer(uint32_t version = 3) {
  Writer w;
  w.version = version;
  w.kv_str("general.architecture", "test");
  w.kv_u8("v.u8", 200);
  w.kv_i8("v.i8", -100);
  w.kv_u16("v.u16", 60000);
  w.kv_i16("v.i16", -30000);
  w.kv_u32("v.u32", 4000000000u);
  w.kv_i32("v.i32", -2000000000);
  w.kv_u64("v.u64", 1ull << 40);
  w.kv_u64("v.u64big", ~0ull);
  w.kv_i64("v.i64", -(1ll << 50));
  w.kv_f32("v.f32", 1.5f);
  w.kv_f64("v.f64", -2.25);
  w.kv_bool("v.true", true);
  w.kv_bool("v.false", false);
  w.kv_str("v.str", std::string("hello\0world", 11));
  w.kv_str("v.empty", "");
  w.kv_str_array("v.strs", {"a", "", "ccc"});
  w.kv_array<float>("v.f32s", T_F32, {0.5f, -1.0f, 3.0f});
  w.kv_array<int32_t>("v.i32s", T_I32, {1, -2, 3});
  w.kv_array<uint8_t>("v.u8s", T_U8, {7, 255});
  w.kv_array<uint8_t>("v.bools", T_BOOL, {1, 0, 1});
  w.kv_array<double>("v.f64s", T_F64, {0.25});
  w.kv_array<int64_t>("v.empty_arr", T_I64, {});
  {  // array of arrays of u16
    Bytes b;
    b.put<uint32_t>(T_ARRAY);
    b.put<uint64_t>(2);
    for (int i = 0; i < 2; i++) {
      b.put<uint32_t>(T_U16);
      b.put<uint64_t>(2);
      b.put<uint16_t>(uint16_t(i));
      b.put<uint16_t>(uint16_t(i + 10));
    }
    w.kv_raw("v.nested", T_ARRAY, b.b);
  }
  std::vector<float> a = iota_f32(8, 1.0f), c = iota_f32(64, -5.0f);
  w.tensor_f32("a", {8}, a);
  std::vector<uint16_t> half(6, 0x3c00);  // 1.0 in fp16
  w.tensor("b", 1, {2, 3}, half.data(), half.size() * 2);
  w.tensor_f32("c", {4, 4, 2, 2}, c);
  return w;
}

// Expects parsing to fail with gguf::Error whose message contains `needle` (if given).
void expect_error(const std::vector<uint8_t> &bytes, const char *needle,
                  specinfer_status code = SPECINFER_ERR_FORMAT) {
  try {
    File::from_memory(bytes.data(), bytes.size());
  } catch (const Error &e) {
    if (needle && std::strstr(e.what(), needle) == nullptr) {
      print_error("message '%s' lacks '%s'\n", e.what(), needle);
      fail();
    }
    if (e.code() != code) {
      print_error("message '%s': code %d, expected %d\n", e.what(), int(e.code()), int(code));
      fail();
    }
    assert_true(std::strlen(e.what()) > 10);
    return;
  }
  print_error("no error for a file expected to fail with '%s'\n", needle ? needle : "");
  fail();
}

template <typename T>
void patch(std::vector<uint8_t> &b, size_t at, T v) {
  assert_true(at + sizeof(T) <= b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Offset of a key's string (its length prefix) inside a built file.
size_t find_bytes(const std::vector<uint8_t> &b, const std::string &s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  assert_true(it != b.end());
  return size_t(it - b.begin());
}

void check_full(const File &f, uint32_t version) {
  assert_int_equal(f.version(), version);
  assert_true(f.has("v.u8"));
  assert_false(f.has("v.missing"));
  assert_int_equal(*f.get_int("v.u8"), 200);
  assert_int_equal(*f.get_int("v.i8"), -100);
  assert_int_equal(*f.get_int("v.u16"), 60000);
  assert_int_equal(*f.get_int("v.i16"), -30000);
  assert_int_equal(*f.get_int("v.u32"), 4000000000ll);
  assert_int_equal(*f.get_int("v.i32"), -2000000000ll);
  assert_true(*f.get_int("v.u64") == (1ll << 40));
  assert_true(*f.get_int("v.i64") == -(1ll << 50));
  assert_true(*f.get_float("v.f32") == 1.5);
  assert_true(*f.get_float("v.f64") == -2.25);
  assert_true(*f.get_float("v.i32") == -2000000000.0);
  assert_true(*f.get_bool("v.true"));
  assert_false(*f.get_bool("v.false"));
  assert_true(*f.get_string("v.str") == std::string("hello\0world", 11));
  assert_true(f.get_string("v.empty")->empty());
  assert_false(f.get_int("v.missing").has_value());
  assert_false(f.get_string("v.missing").has_value());
  assert_true(f.get_string_array("v.missing").empty());
  assert_true(*f.type_of("v.f64") == ValueType::F64);
  assert_true(*f.array_type("v.strs") == ValueType::STRING);
  assert_int_equal(*f.array_size("v.strs"), 3);
  std::vector<std::string> strs = f.get_string_array("v.strs");
  assert_int_equal(strs.size(), 3);
  assert_true(strs[0] == "a" && strs[1].empty() && strs[2] == "ccc");
  std::vector<float> fl = f.get_float_array("v.f32s");
  assert_true(fl.size() == 3 && fl[0] == 0.5f && fl[1] == -1.0f && fl[2] == 3.0f);
  std::vector<int64_t> in = f.get_int_array("v.i32s");
  assert_true(in.size() == 3 && in[0] == 1 && in[1] == -2 && in[2] == 3);
  assert_true(f.get_int_array("v.u8s") == std::vector<int64_t>({7, 255}));
  assert_true(f.get_int_array("v.bools") == std::vector<int64_t>({1, 0, 1}));
  assert_true(f.get_float_array("v.f64s") == std::vector<float>({0.25f}));
  assert_true(f.get_float_array("v.i32s") == std::vector<float>({1.0f, -2.0f, 3.0f}));
  assert_true(f.get_int_array("v.empty_arr").empty());
  assert_true(*f.array_type("v.nested") == ValueType::ARRAY);
  assert_int_equal(*f.array_size("v.nested"), 2);

  // Wrong types throw with the key's name in the message.
  const char *wrong[] = {"v.str", "v.strs"};
  for (const char *k : wrong) {
    try {
      f.get_int(k);
      fail();
    } catch (const Error &e) {
      assert_non_null(std::strstr(e.what(), k));
      assert_int_equal(e.code(), SPECINFER_ERR_FORMAT);
    }
  }
  try {
    f.get_int("v.u64big");
    fail();
  } catch (const Error &e) {
    assert_non_null(std::strstr(e.what(), "int64"));
  }
  bool threw = false;
  try {
    f.get_string_array("v.f32s");
  } catch (const Error &) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  try {
    f.get_float_array("v.nested");
  } catch (const Error &) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  try {
    f.get_bool("v.u8");
  } catch (const Error &) {
    threw = true;
  }
  assert_true(threw);
  threw = false;
  try {
    f.get_string("v.u8");
  } catch (const Error &) {
    threw = true;
  }
  assert_true(threw);

  std::vector<std::string> keys = f.keys();
  assert_int_equal(keys.size(), 24);
  assert_true(keys[0] == "general.architecture" && keys[1] == "v.u8" && keys.back() == "v.nested");

  assert_int_equal(f.tensors().size(), 3);
  const auto *a = f.find_tensor("a");
  const auto *b = f.find_tensor("b");
  const auto *c = f.find_tensor("c");
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_null(f.find_tensor("d"));
  assert_int_equal(a->n_dims, 1);
  assert_int_equal(a->ne[0], 8);
  assert_int_equal(a->ne[1], 1);
  assert_int_equal(a->n_bytes, 32);
  assert_int_equal(b->type, 1);
  assert_int_equal(b->n_dims, 2);
  assert_int_equal(b->ne[1], 3);
  assert_int_equal(b->n_bytes, 12);
  assert_int_equal(c->n_dims, 4);
  assert_int_equal(c->ne[3], 2);
  assert_int_equal(c->n_bytes, 256);
  const float *ad = static_cast<const float *>(a->data);
  for (int i = 0; i < 8; i++) assert_true(ad[i] == 1.0f + float(i));
  const float *cd = static_cast<const float *>(c->data);
  for (int i = 0; i < 64; i++) assert_true(cd[i] == -5.0f + float(i));
  const uint16_t *bd = static_cast<const uint16_t *>(b->data);
  for (int i = 0; i < 6; i++) assert_int_equal(bd[i], 0x3c00);
  for (const auto &t : f.tensors())
    assert_int_equal(
        (static_cast<const uint8_t *>(t.data) - static_cast<const uint8_t *>(a->data)) % 32, 0);
}

void test_valid_v3_and_v2(void **) {
  for (uint32_t v : {2u, 3u}) {
    Writer w = full_writer(v);
    std::vector<uint8_t> bytes = w.build();
    auto f = File::from_memory(bytes.data(), bytes.size());
    check_full(*f, v);
    assert_int_equal(f->data_offset(), w.data_at);
    assert_int_equal(f->alignment(), 32);
  }
}

void test_open_from_disk(void **) {
  Writer w = full_writer();
  std::vector<uint8_t> bytes = w.build();
  char path[] = "/tmp/test_gguf_reader_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_true(write_file(path, bytes));
  auto f = File::open(path);
  check_full(*f, 3);
  assert_int_equal(f->file_size(), bytes.size());
  f.reset();
  // Truncated on disk: the path is in the message.
  assert_true(write_file(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100)));
  try {
    File::open(path);
    fail();
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_FORMAT);
    assert_non_null(std::strstr(e.what(), path));
  }
  unlink(path);
  try {
    File::open(path);
    fail();
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_NOT_FOUND);
    assert_non_null(std::strstr(e.what(), "cannot open"));
  }
  try {
    File::open("/tmp");
    fail();
  } catch (const Error &e) {
    assert_int_equal(e.code(), SPECINFER_ERR_IO);
  }
}

void test_alignment(void **) {
  Writer w;
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  std::vector<float> a = iota_f32(3, 0.0f), b = iota_f32(5, 10.0f);
  w.tensor_f32("a", {3}, a);
  w.tensor_f32("b", {5}, b);
  std::vector<uint8_t> bytes = w.build();
  auto f = File::from_memory(bytes.data(), bytes.size());
  assert_int_equal(f->alignment(), 64);
  assert_int_equal(f->data_offset() % 64, 0);
  assert_int_equal(f->find_tensor("b")->offset, 64);
  assert_true(static_cast<const float *>(f->find_tensor("b")->data)[4] == 14.0f);

  // The same layout read with the default alignment 32 is still valid (64 is a multiple of 32),
  // but an alignment of 48 is refused, and so is a tensor offset that is not a multiple of it.
  Writer bad;
  bad.kv_u32("general.alignment", 48);
  expect_error(bad.build(), "power of two");
  Writer zero;
  zero.kv_u32("general.alignment", 0);
  expect_error(zero.build(), "power of two");
  Writer str;
  str.kv_str("general.alignment", "32");
  expect_error(str.build(), "general.alignment");
  // Misaligned tensor offset.
  Writer mis;
  mis.tensor_f32("a", {3}, a);
  mis.tensor_f32("b", {5}, b);
  std::vector<uint8_t> mb = mis.build();
  patch<uint64_t>(mb, mis.offset_field_at[1], 36);
  expect_error(mb, "alignment");
}

void test_truncated_everywhere(void **) {
  std::vector<uint8_t> bytes = full_writer().build();
  // Every strict prefix is invalid: the last tensor's data ends at the end of the file.
  for (size_t n = 0; n < bytes.size(); n++) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    try {
      File::from_memory(cut.data(), cut.size());
      print_error("prefix of %zu bytes parsed\n", n);
      fail();
    } catch (const Error &e) {
      assert_int_equal(e.code(), SPECINFER_ERR_FORMAT);
      assert_true(std::strlen(e.what()) > 10);
    }
  }
  expect_error(std::vector<uint8_t>(), "truncated");
  expect_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 40), "cannot fit");
}

void test_bad_header(void **) {
  std::vector<uint8_t> good = full_writer().build();
  std::vector<uint8_t> b = good;
  b[0] = 'X';
  expect_error(b, "magic");
  b = good;
  patch<uint32_t>(b, 4, 1);
  expect_error(b, "version 1", SPECINFER_ERR_UNSUPPORTED);
  patch<uint32_t>(b, 4, 4);
  expect_error(b, "version 4", SPECINFER_ERR_UNSUPPORTED);
  patch<uint32_t>(b, 4, 0x03000000);
  expect_error(b, "big-endian", SPECINFER_ERR_UNSUPPORTED);
  // Absurd counts are refused before anything is allocated.
  b = good;
  patch<uint64_t>(b, 8, uint64_t(1) << 60);
  expect_error(b, "tensor count");
  b = good;
  patch<uint64_t>(b, 16, ~uint64_t(0));
  expect_error(b, "metadata count");
  b = good;
  patch<uint64_t>(b, 16, 1000);  // plausible but more than the file holds
  expect_error(b, nullptr);
  b = good;
  patch<uint64_t>(b, 8, 50);
  expect_error(b, nullptr);
}

void test_bad_metadata(void **) {
  // Key length past the end / absurd.
  std::vector<uint8_t> good = full_writer().build();
  std::vector<uint8_t> b = good;
  patch<uint64_t>(b, 24, uint64_t(1) << 62);
  expect_error(b, "absurd");
  b = good;
  patch<uint64_t>(b, 24, good.size());
  expect_error(b, "truncated");
  // String value length past the end.
  b = good;
  size_t at = find_bytes(b, "v.str") + 5 + 4;  // after the key: the type, then the length
  assert_int_equal(b[at - 4], T_STRING);
  patch<uint64_t>(b, at, good.size() - 10);
  expect_error(b, "truncated");
  // Invalid value type.
  b = good;
  patch<uint32_t>(b, at - 4, 13);
  expect_error(b, "invalid value type 13");
  // Array: huge count, bad element type.
  b = good;
  at = find_bytes(b, "v.f32s") + 6;
  assert_int_equal(b[at], T_ARRAY);
  patch<uint64_t>(b, at + 8, uint64_t(1) << 61);
  expect_error(b, "does not fit");
  b = good;
  patch<uint32_t>(b, at + 4, 77);
  expect_error(b, "invalid array element type 77");
  // String array whose count is too large for the remaining bytes.
  b = good;
  at = find_bytes(b, "v.strs") + 6;
  patch<uint64_t>(b, at + 8, uint64_t(1) << 40);
  expect_error(b, "does not fit");
  // Bool with value 2.
  b = good;
  at = find_bytes(b, "v.true") + 6;
  assert_int_equal(b[at], T_BOOL);
  b[at + 4] = 2;
  expect_error(b, "bool");

  Writer dup;
  dup.kv_u32("k", 1);
  dup.kv_u32("k", 2);
  expect_error(dup.build(), "duplicate metadata key 'k'");
  Writer empty_key;
  empty_key.kv_u32("", 1);
  expect_error(empty_key.build(), "empty");

  // Arrays nested too deep.
  Bytes deep;
  for (int i = 0; i < 20; i++) {
    deep.put<uint32_t>(T_ARRAY);
    deep.put<uint64_t>(1);
  }
  deep.put<uint32_t>(T_U8);
  deep.put<uint64_t>(0);
  Writer nest;
  nest.kv_raw("deep", T_ARRAY, deep.b);
  expect_error(nest.build(), "nested");
}

void test_bad_tensors(void **) {
  std::vector<float> a = iota_f32(16, 0.0f);
  {  // 5 dimensions
    Writer w;
    w.tensor_f32("t", {2, 2, 2, 1, 2}, a);
    expect_error(w.build(), "5 dimensions");
  }
  {  // 0 dimensions
    Writer w;
    w.tensor_f32("t", {}, a);
    expect_error(w.build(), "0 dimensions");
  }
  {  // a zero dimension
    Writer w;
    w.tensor_f32("t", {4, 0}, a);
    expect_error(w.build(), "dimension 1 is 0");
  }
  {  // absurd dimensions (element count overflow)
    Writer w;
    w.tensor_f32("t", {1ull << 40, 1ull << 40}, a);
    expect_error(w.build(), "too many elements");
  }
  {  // unknown type id
    Writer w;
    w.tensor("t", 99, {16}, a.data(), 64);
    expect_error(w.build(), "unknown type 99", SPECINFER_ERR_UNSUPPORTED);
  }
  {  // Q8_0 row not a multiple of 32
    Writer w;
    w.tensor("t", 8, {16}, a.data(), 17);
    expect_error(w.build(), "block size");
  }
  {  // declared shape larger than the data in the file
    Writer w;
    w.tensor("t", 0, {1000}, a.data(), 64);
    expect_error(w.build(), "past the end");
  }
  {  // duplicate names
    Writer w;
    w.tensor_f32("t", {4}, a);
    w.tensor_f32("t", {4}, a);
    expect_error(w.build(), "duplicate tensor name 't'");
  }
  {  // offsets: past the end, overflow, overlapping
    Writer w;
    w.tensor_f32("x", {16}, a);
    w.tensor_f32("y", {16}, a);
    std::vector<uint8_t> good = w.build();
    assert_non_null(File::from_memory(good.data(), good.size()).get());
    std::vector<uint8_t> b = good;
    patch<uint64_t>(b, w.offset_field_at[1], 4096);
    expect_error(b, "past the end");
    b = good;
    patch<uint64_t>(b, w.offset_field_at[1], ~uint64_t(0) - 31);
    expect_error(b, nullptr);
    b = good;
    patch<uint64_t>(b, w.offset_field_at[1], 32);  // x is 64 bytes at 0
    expect_error(b, "overlap");
    b = good;
    patch<uint64_t>(b, w.offset_field_at[1], 0);
    expect_error(b, "overlap");
    // Wrong type id in place: f32 -> q8_0 with 16 values is not a whole block.
    b = good;
    patch<uint32_t>(b, w.offset_field_at[0] - 4, 8);
    expect_error(b, "block size");
    // f32 -> f16: valid shape, smaller data; still fine (no overlap, inside the file).
    b = good;
    patch<uint32_t>(b, w.offset_field_at[0] - 4, 1);
    auto f = File::from_memory(b.data(), b.size());
    assert_int_equal(f->find_tensor("x")->n_bytes, 32);
  }
}

// Random corruption with a fixed seed: every mutated file either parses or fails with gguf::Error,
// and whatever parses can be read through every getter without a crash.
void test_random_corruption(void **) {
  std::vector<uint8_t> good = full_writer().build();
  std::mt19937_64 rng(12345);
  int parsed = 0, failed = 0;
  for (int iter = 0; iter < 3000; iter++) {
    std::vector<uint8_t> b = good;
    int n_flips = 1 + int(rng() % 4);
    for (int k = 0; k < n_flips; k++) {
      size_t at = size_t(rng() % b.size());
      switch (rng() % 3) {
        case 0:
          b[at] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:
          b[at] = uint8_t(rng());
          break;
        default:
          b[at] = 0xff;
          break;
      }
    }
    if (rng() % 4 == 0) b.resize(size_t(rng() % b.size()));
    try {
      auto f = File::from_memory(b.data(), b.size());
      parsed++;
      for (const std::string &k : f->keys()) {
        try {
          (void)f->get_int(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_float(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_bool(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_string(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_string_array(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_float_array(k);
        } catch (const Error &) {
        }
        try {
          (void)f->get_int_array(k);
        } catch (const Error &) {
        }
      }
      for (const auto &t : f->tensors()) {
        const uint8_t *p = static_cast<const uint8_t *>(t.data);
        unsigned sum = 0;
        for (uint64_t i = 0; i < t.n_bytes; i++) sum += p[i];
        (void)sum;
      }
    } catch (const Error &e) {
      failed++;
      assert_true(std::strlen(e.what()) > 0);
    }
  }
  // Both outcomes must occur, or the mutation did not exercise anything.
  assert_true(parsed > 100);
  assert_true(failed > 100);
}

void test_type_blocks(void **) {
  using specinfer::gguf::type_block;
  assert_int_equal(type_block(0).block_bytes, 4);
  assert_int_equal(type_block(8).block_values, 32);
  assert_int_equal(type_block(8).block_bytes, 34);
  assert_int_equal(type_block(12).block_bytes, 144);
  assert_int_equal(type_block(14).block_bytes, 210);
  assert_int_equal(type_block(6).block_bytes, 22);
  assert_int_equal(type_block(4).block_values, 0);
  assert_int_equal(type_block(-1).block_values, 0);
  assert_string_equal(specinfer::gguf::type_name(12), "q4_k");
  assert_string_equal(specinfer::gguf::type_name(5), "unknown");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_v3_and_v2), cmocka_unit_test(test_open_from_disk),
      cmocka_unit_test(test_alignment),       cmocka_unit_test(test_truncated_everywhere),
      cmocka_unit_test(test_bad_header),      cmocka_unit_test(test_bad_metadata),
      cmocka_unit_test(test_bad_tensors),     cmocka_unit_test(test_random_corruption),
      cmocka_unit_test(test_type_blocks),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
