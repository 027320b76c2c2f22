// White-box tests of the Medusa heads file (plugins/medusa/heads.{h,cpp}):
//  - save -> load gives back every field (W through f16, values chosen to be exact in f16);
//  - the f16 conversions round to nearest even and keep infinities and NaN;
//  - a file cut at any length, and files with a corrupt header, key, shape, type or value, are
//    refused with SPECINFER_ERR_FORMAT and a message naming the file (never a crash; CI runs this
//    under ASan + UBSan);
//  - identify_target fingerprints the target's output rows, and refuses a target without them;
//  - check_identity refuses heads trained for another model, naming both.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/plugin_error.h"
#include "gguf/gguf_file.h"
#include "medusa/f16.h"
#include "medusa/heads.h"

#include <stdint.h>

#include "support/cmocka_setup.h"

namespace {

using medusa::Heads;
using medusa::kRanks;

// Runs fn and returns the status it throws (through the plugins' own guarded()); the message goes
// into *msg.
template <typename Fn>
specinfer_status status_of(Fn &&fn, std::string *msg = nullptr) {
  specinfer_plugin_error err{};
  specinfer_status rc = specinfer_plugin::guarded(&err, "test", fn);
  if (msg) *msg = err.message;
  return rc;
}

std::string temp_path(const char *tag) {
  char path[] = "/tmp/test_medusa_heads_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  return std::string(path) + tag;
}

std::vector<uint8_t> read_all(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

void write_all(const std::string &path, const std::vector<uint8_t> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  assert_true(out.good());
}

Heads sample_heads(int32_t token_inputs = 0) {
  Heads h;
  h.token_inputs = token_inputs;
  h.target.name = "Tiny Model 0.1B";
  h.target.arch = "qwen2";
  h.target.vocab_size = 1000;
  h.target.hidden_size = 8;
  h.target.fingerprint = 0xfedcba9876543210ull;  // above INT64_MAX: kept whole
  h.n_heads = 3;
  h.hidden_size = 8;
  h.vocab = {0, 3, 17, 256, 999};
  const size_t K = 3, H = 8;
  h.w.resize(K * H * static_cast<size_t>(h.input_size()));
  for (size_t i = 0; i < h.w.size(); ++i) h.w[i] = static_cast<float>(int(i % 37) - 18) / 64.0f;
  h.b.resize(K * H);
  for (size_t i = 0; i < h.b.size(); ++i) h.b[i] = 0.001f * static_cast<float>(i) - 0.01f;
  h.accuracy.resize(K * kRanks);
  for (size_t i = 0; i < h.accuracy.size(); ++i) h.accuracy[i] = 1.0f / static_cast<float>(i + 2);
  h.trained_tokens = 123456789012ll;
  return h;
}

// Expects load_heads(path) to fail with FORMAT and a message naming the file and containing
// `what` (if given).
void expect_format_error(const std::string &path, const char *what = nullptr) {
  std::string msg;
  specinfer_status rc = status_of([&] { medusa::load_heads(path); }, &msg);
  if (rc != SPECINFER_ERR_FORMAT || msg.find(path) == std::string::npos ||
      (what && msg.find(what) == std::string::npos))
    std::fprintf(stderr, "status %d, message: %s (expected FORMAT naming %s%s%s)\n", rc,
                 msg.c_str(), path.c_str(), what ? " and " : "", what ? what : "");
  assert_int_equal(rc, SPECINFER_ERR_FORMAT);
  assert_true(msg.find(path) != std::string::npos);
  if (what) assert_true(msg.find(what) != std::string::npos);
}

void test_round_trip(void **) {
  const Heads h = sample_heads();
  const std::string path = temp_path(".gguf");
  assert_int_equal(status_of([&] { medusa::save_heads(h, path); }), SPECINFER_OK);
  Heads g;
  std::string msg;
  assert_int_equal(status_of([&] { g = medusa::load_heads(path); }, &msg), SPECINFER_OK);
  assert_string_equal(g.target.name.c_str(), h.target.name.c_str());
  assert_string_equal(g.target.arch.c_str(), h.target.arch.c_str());
  assert_int_equal(g.target.vocab_size, h.target.vocab_size);
  assert_int_equal(g.target.hidden_size, h.target.hidden_size);
  assert_true(g.target.fingerprint == h.target.fingerprint);
  assert_int_equal(g.n_heads, h.n_heads);
  assert_int_equal(g.hidden_size, h.hidden_size);
  assert_true(g.vocab == h.vocab);
  assert_true(g.w == h.w);  // exact in f16
  assert_true(g.b == h.b);
  assert_true(g.accuracy == h.accuracy);
  assert_true(g.trained_tokens == h.trained_tokens);
  // W is stored as f16: the file is about half what f32 would take.
  auto f = specinfer::gguf::File::open(path);
  assert_int_equal(f->find_tensor("medusa.w")->type, 1);
  assert_int_equal(g.token_inputs, 0);
  unlink(path.c_str());
}

void test_f16(void **) {
  using medusa::f16_to_f32;
  using medusa::f32_to_f16;
  // Every finite half survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;
    assert_int_equal(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
  }
  assert_true(f16_to_f32(f32_to_f16(1.0f)) == 1.0f);
  assert_true(f16_to_f32(f32_to_f16(-2.5f)) == -2.5f);
  assert_true(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
  assert_true(std::isinf(f16_to_f32(f32_to_f16(65520.0f))));  // rounds up past the largest half
  assert_true(std::isinf(f16_to_f32(f32_to_f16(INFINITY))));
  assert_true(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  assert_true(f16_to_f32(f32_to_f16(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
  assert_true(f16_to_f32(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))) ==
              1.0f + std::ldexp(1.0f, -9));
  // Subnormals: the smallest half, and half of it (a tie, to even: zero).
  assert_true(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));
  assert_true(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -25))) == 0.0f);
  assert_true(f16_to_f32(f32_to_f16(std::ldexp(1.5f, -25))) == std::ldexp(1.0f, -24));
}

void test_truncated_everywhere(void **) {
  const std::string path = temp_path(".gguf");
  assert_int_equal(status_of([&] { medusa::save_heads(sample_heads(), path); }), SPECINFER_OK);
  const std::vector<uint8_t> bytes = read_all(path);
  const std::string cut = path + ".cut";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_all(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n)));
    expect_format_error(cut);
  }
  unlink(cut.c_str());
  unlink(path.c_str());
}

// Offset of the first occurrence of `s` in bytes.
size_t find(const std::vector<uint8_t> &bytes, const std::string &s) {
  auto it = std::search(bytes.begin(), bytes.end(), s.begin(), s.end());
  assert_true(it != bytes.end());
  return static_cast<size_t>(it - bytes.begin());
}

void put_u32(std::vector<uint8_t> &b, size_t at, uint32_t v) {
  assert_true(at + 4 <= b.size());
  const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                         static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
  std::memcpy(b.data() + at, le, 4);
}

// Heads with token inputs: W reads [h, e] or [h, e, e'], two or three times the columns, and the
// count survives the file; a count that does not fit W's width, or above 2, is refused.
void test_token_input(void **) {
  const std::string path = temp_path(".gguf");
  const std::string bad = path + ".bad";
  for (int32_t n = 1; n <= 2; ++n) {
    const Heads h = sample_heads(n);
    assert_int_equal(h.input_size(), (1 + n) * h.hidden_size);
    assert_int_equal(status_of([&] { medusa::save_heads(h, path); }), SPECINFER_OK);
    Heads g;
    assert_int_equal(status_of([&] { g = medusa::load_heads(path); }), SPECINFER_OK);
    assert_int_equal(g.token_inputs, n);
    assert_true(g.w == h.w);
    std::vector<uint8_t> b = read_all(path);
    const size_t at =
        find(b, "medusa-heads.token_inputs") + std::strlen("medusa-heads.token_inputs") + 4;
    put_u32(b, at, static_cast<uint32_t>(n - 1));  // W keeps its width: the shape no longer fits
    write_all(bad, b);
    expect_format_error(bad, "shape");
    put_u32(b, at, 3);
    write_all(bad, b);
    expect_format_error(bad, "token_inputs");
  }
  // The scaled output row: unit root-mean-square, direction kept; a zero row stays zero.
  float row[4] = {3.0f, 0.0f, -4.0f, 0.0f};
  medusa::token_row(row, 4);
  assert_float_equal(row[0], 1.2f, 1e-6);
  assert_float_equal(row[2], -1.6f, 1e-6);
  float zero[2] = {0.0f, 0.0f};
  medusa::token_row(zero, 2);
  assert_true(zero[0] == 0.0f && zero[1] == 0.0f);
  unlink(bad.c_str());
  unlink(path.c_str());
}

void test_corrupt(void **) {
  const std::string path = temp_path(".gguf");
  const Heads h = sample_heads();
  assert_int_equal(status_of([&] { medusa::save_heads(h, path); }), SPECINFER_OK);
  const std::vector<uint8_t> good = read_all(path);
  const std::string bad = path + ".bad";
  auto data_of = [&](const char *tensor) {
    auto f = specinfer::gguf::File::open(path);
    const auto *t = f->find_tensor(tensor);
    return static_cast<size_t>(f->data_offset() + t->offset);
  };
  {  // not GGUF at all
    std::vector<uint8_t> b = good;
    b[0] = 'X';
    write_all(bad, b);
    expect_format_error(bad, "magic");
  }
  {  // GGUF version 1
    std::vector<uint8_t> b = good;
    put_u32(b, 4, 1);
    write_all(bad, b);
    expect_format_error(bad, "version");
  }
  {  // another architecture (a model file, say)
    std::vector<uint8_t> b = good;
    const size_t at = find(b, "medusa-heads");
    std::memcpy(&b[at], "llama-heads!", 12);
    write_all(bad, b);
    expect_format_error(bad, "architecture");
  }
  {  // n_heads says 2, the tensors hold 3
    std::vector<uint8_t> b = good;
    const size_t at = find(b, "medusa-heads.n_heads") + std::strlen("medusa-heads.n_heads") + 4;
    put_u32(b, at, 2);
    write_all(bad, b);
    expect_format_error(bad, "shape");
  }
  {  // n_heads 0
    std::vector<uint8_t> b = good;
    const size_t at = find(b, "medusa-heads.n_heads") + std::strlen("medusa-heads.n_heads") + 4;
    put_u32(b, at, 0);
    write_all(bad, b);
    expect_format_error(bad, "n_heads");
  }
  {  // a key renamed: missing
    std::vector<uint8_t> b = good;
    const size_t at = find(b, "medusa-heads.hidden_size");
    b[at + 13] = 'X';
    write_all(bad, b);
    expect_format_error(bad, "hidden_size");
  }
  {  // the bias stored as f16 (the type field of tensor info "medusa.b")
    std::vector<uint8_t> b = good;
    const size_t name = find(b, std::string("\x08\0\0\0\0\0\0\0medusa.b", 16));
    // name (8 + 8 bytes), n_dims (4), ne[2] (16), then the type.
    put_u32(b, name + 16 + 4 + 16, 1);
    write_all(bad, b);
    expect_format_error(bad, "type");
  }
  {  // an unknown tensor type
    std::vector<uint8_t> b = good;
    const size_t name = find(b, std::string("\x08\0\0\0\0\0\0\0medusa.b", 16));
    put_u32(b, name + 16 + 4 + 16, 77);
    write_all(bad, b);
    expect_format_error(bad);
  }
  {  // NaN in W (f16 0x7e00)
    std::vector<uint8_t> b = good;
    const size_t at = data_of("medusa.w") + 10;
    b[at] = 0x00;
    b[at + 1] = 0x7e;
    write_all(bad, b);
    expect_format_error(bad, "non-finite");
  }
  {  // a vocabulary id outside the target's vocabulary
    std::vector<uint8_t> b = good;
    put_u32(b, data_of("medusa.vocab") + 4, 1000);
    write_all(bad, b);
    expect_format_error(bad, "vocabulary");
  }
  {  // an accuracy above 1
    std::vector<uint8_t> b = good;
    const float x = 1.5f;
    std::memcpy(&b[data_of("medusa.accuracy")], &x, 4);
    write_all(bad, b);
    expect_format_error(bad, "accuracy");
  }
  {  // a fingerprint that is not hex
    std::vector<uint8_t> b = good;
    const size_t at = find(b, "fedcba9876543210");
    b[at] = 'z';
    write_all(bad, b);
    expect_format_error(bad, "fingerprint");
  }
  {  // every single byte of the header flipped: refused or loaded, never a crash
    const size_t header = static_cast<size_t>(specinfer::gguf::File::open(path)->data_offset());
    for (size_t i = 0; i < header; ++i) {
      std::vector<uint8_t> b = good;
      b[i] ^= 0x5a;
      write_all(bad, b);
      std::string msg;
      specinfer_status rc = status_of([&] { medusa::load_heads(bad); }, &msg);
      assert_true(rc == SPECINFER_OK || rc == SPECINFER_ERR_FORMAT);
      if (rc != SPECINFER_OK) assert_true(msg.find(bad) != std::string::npos);
    }
  }
  // A missing file.
  std::string msg;
  assert_int_not_equal(status_of([&] { medusa::load_heads(path + ".absent"); }, &msg),
                       SPECINFER_OK);
  assert_true(msg.find(path + ".absent") != std::string::npos);
  unlink(bad.c_str());
  unlink(path.c_str());
}

// A fake target whose output rows are a function of (id, salt).
struct FakeTarget {
  int32_t hidden = 8;
  float salt = 0.0f;
};

specinfer_status fake_output_rows(void *self, const int32_t *ids, int32_t n, float *out,
                                  specinfer_plugin_error *) {
  auto *t = static_cast<FakeTarget *>(self);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t c = 0; c < t->hidden; ++c)
      out[i * t->hidden + c] = std::sin(static_cast<float>(ids[i] * 31 + c)) + t->salt;
  return SPECINFER_OK;
}

void test_identity(void **) {
  specinfer_target_vtable vt{};
  vt.struct_size = sizeof vt;
  vt.output_rows = fake_output_rows;
  FakeTarget a, b;
  b.salt = 1e-3f;
  specinfer_model_info info{};
  info.struct_size = sizeof info;
  info.vocab_size = 1000;
  info.hidden_size = 8;
  info.name = "Tiny Model 0.1B";
  info.arch = "qwen2";
  specinfer_host_target ta{&a, &vt, nullptr}, tb{&b, &vt, nullptr};
  medusa::TargetIdentity ia, ia2, ib;
  assert_int_equal(status_of([&] { ia = medusa::identify_target(info, ta); }), SPECINFER_OK);
  assert_int_equal(status_of([&] { ia2 = medusa::identify_target(info, ta); }), SPECINFER_OK);
  info.name = "Other Model 0.1B";
  assert_int_equal(status_of([&] { ib = medusa::identify_target(info, tb); }), SPECINFER_OK);
  assert_true(ia.fingerprint == ia2.fingerprint);
  assert_true(ia.fingerprint != ib.fingerprint);

  Heads h = sample_heads();
  h.target = ia;
  assert_int_equal(status_of([&] { medusa::check_identity(h, ia2, "x.gguf"); }), SPECINFER_OK);
  std::string msg;
  assert_int_equal(status_of([&] { medusa::check_identity(h, ib, "x.gguf"); }, &msg),
                   SPECINFER_ERR_CONFIG);
  assert_true(msg.find("Tiny Model 0.1B") != std::string::npos);
  assert_true(msg.find("Other Model 0.1B") != std::string::npos);
  assert_true(msg.find("x.gguf") != std::string::npos);
  // Same weights, another vocabulary size: refused too.
  medusa::TargetIdentity ic = ia;
  ic.vocab_size = 1001;
  assert_int_equal(status_of([&] { medusa::check_identity(h, ic, "x.gguf"); }),
                   SPECINFER_ERR_CONFIG);

  // A target without output_rows (an older vtable): UNSUPPORTED, with a message.
  specinfer_target_vtable old{};
  old.struct_size = offsetof(specinfer_target_vtable, output_rows);
  specinfer_host_target to{&a, &old, nullptr};
  assert_int_equal(status_of([&] { medusa::identify_target(info, to); }, &msg),
                   SPECINFER_ERR_UNSUPPORTED);
  assert_true(msg.find("output rows") != std::string::npos);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_f16),
      cmocka_unit_test(test_token_input), cmocka_unit_test(test_truncated_everywhere),
      cmocka_unit_test(test_corrupt),     cmocka_unit_test(test_identity)};
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
