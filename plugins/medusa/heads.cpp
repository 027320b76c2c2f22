// The heads file: GGUF v3 written here, read with the gguf plugin's reader (gguf_file.h), which
// checks every count, length, shape and data range against the file size before anything is
// touched. On top of that, load_heads checks what a heads file must hold (architecture, keys,
// tensor names, shapes and types, finite values, token ids inside the target's vocabulary).
//
// Layout (ne[0] is the fastest dimension, as in GGUF):
//   general.architecture            "medusa-heads"
//   medusa-heads.n_heads            u32
//   medusa-heads.hidden_size        u32
//   medusa-heads.n_vocab            u32  (truncated vocabulary)
//   medusa-heads.n_ranks            u32  (kRanks)
//   medusa-heads.trained_tokens     u64
//   medusa-heads.target.name        string
//   medusa-heads.target.arch        string
//   medusa-heads.target.vocab_size  u32
//   medusa-heads.target.hidden_size u32
//   medusa-heads.target.fingerprint string, 16 hex digits (GGUF readers take u64 > INT64_MAX badly)
//   medusa-heads.token_inputs       u32, 0, 1 or 2 (heads.h; absent: 0)
//   tensor medusa.vocab     i32 [n_vocab]
//   tensor medusa.w         f16 [input, hidden, n_heads] (f32 is read too; input = (1 +
//                           token_inputs) * hidden)
//   tensor medusa.b         f32 [hidden, n_heads]
//   tensor medusa.accuracy  f32 [n_ranks, n_heads]
// W is written as f16: half the file, and W is a small correction to h (the head starts at zero)
// whose rounding error is far below what training resolves.
#include "heads.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/plugin_error.h"
#include "f16.h"
#include "gguf_file.h"

namespace medusa {
namespace {

using specinfer_plugin::fail;
using specinfer_plugin::Failure;

constexpr const char *kArch = "medusa-heads";
constexpr uint64_t kAlignment = 32;
constexpr int32_t kTypeF32 = 0, kTypeF16 = 1, kTypeI32 = 26;
constexpr int32_t kMaxHeads = 64;
constexpr int32_t kMaxHidden = 1 << 16;

// ---- writer ----------------------------------------------------------------------------------

class Writer {
 public:
  void key_string(const std::string &key, const std::string &value) {
    str(kv_, key);
    u32(kv_, 8);
    str(kv_, value);
    ++n_kv_;
  }
  void key_u32(const std::string &key, uint32_t value) {
    str(kv_, key);
    u32(kv_, 4);
    u32(kv_, value);
    ++n_kv_;
  }
  void key_u64(const std::string &key, uint64_t value) {
    str(kv_, key);
    u32(kv_, 10);
    u64(kv_, value);
    ++n_kv_;
  }
  // A tensor of `bytes` bytes with dims ne (fastest first).
  void tensor(const std::string &name, int32_t type, std::initializer_list<uint64_t> ne,
              const void *data, size_t bytes) {
    str(info_, name);
    u32(info_, static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(info_, d);
    u32(info_, static_cast<uint32_t>(type));
    // Padding goes before a tensor, not after: the file ends with the last tensor's last byte, so
    // that any truncation cuts into data the reader checks for.
    data_.resize((data_.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
    u64(info_, data_.size());
    const auto *p = static_cast<const uint8_t *>(data);
    data_.insert(data_.end(), p, p + bytes);
    ++n_tensors_;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    u32(out, 0x46554747u);  // "GGUF"
    u32(out, 3);
    u64(out, n_tensors_);
    u64(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), info_.begin(), info_.end());
    out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  static void u32(std::vector<uint8_t> &v, uint32_t x) {
    for (int i = 0; i < 4; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  }
  static void u64(std::vector<uint8_t> &v, uint64_t x) {
    for (int i = 0; i < 8; ++i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
  }
  static void str(std::vector<uint8_t> &v, const std::string &s) {
    u64(v, s.size());
    v.insert(v.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> kv_, info_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// Writes `bytes` to path through a temporary file renamed into place, so that a reader never sees
// half a file and a failed write leaves any previous file intact.
void write_file_atomically(const std::string &path, const std::vector<uint8_t> &bytes) {
  const std::string tmp = path + ".tmp";
  FILE *f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    fail(SPECINFER_ERR_IO, "medusa: cannot write '%s': %s", tmp.c_str(), std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    fail(SPECINFER_ERR_IO, "medusa: cannot write '%s' (disk full?)", tmp.c_str());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail(SPECINFER_ERR_IO, "medusa: cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(),
         std::strerror(e));
  }
}

// ---- reader helpers --------------------------------------------------------------------------

[[noreturn]] void bad(const std::string &path, const std::string &what) {
  throw Failure(SPECINFER_ERR_FORMAT, "medusa: heads file '" + path + "': " + what);
}

int64_t need_int(const specinfer::gguf::File &f, const std::string &path, const char *key,
                 int64_t lo, int64_t hi) {
  std::optional<int64_t> v = f.get_int(key);
  if (!v) bad(path, std::string("missing key ") + key);
  if (*v < lo || *v > hi)
    bad(path, specinfer_plugin::format("%s = %lld is outside [%lld, %lld]", key, (long long)*v,
                                       (long long)lo, (long long)hi));
  return *v;
}

std::string need_string(const specinfer::gguf::File &f, const std::string &path, const char *key) {
  std::optional<std::string> v = f.get_string(key);
  if (!v) bad(path, std::string("missing key ") + key);
  return *v;
}

// The tensor `name` with type `type` and exactly the dims `ne`.
const specinfer::gguf::TensorInfo &need_tensor(const specinfer::gguf::File &f,
                                               const std::string &path, const char *name,
                                               std::initializer_list<int32_t> types,
                                               std::initializer_list<int64_t> ne) {
  const specinfer::gguf::TensorInfo *t = f.find_tensor(name);
  if (!t) bad(path, std::string("missing tensor ") + name);
  if (std::find(types.begin(), types.end(), t->type) == types.end())
    bad(path, specinfer_plugin::format("tensor %s has type %s", name,
                                       specinfer::gguf::type_name(t->type)));
  std::string want, got;
  bool same = t->n_dims == static_cast<int32_t>(ne.size());
  int d = 0;
  for (int64_t n : ne) {
    want += (want.empty() ? "" : " x ") + std::to_string(n);
    if (d < 4 && t->ne[d] != n) same = false;
    ++d;
  }
  for (int i = 0; i < t->n_dims; ++i) got += (i ? " x " : "") + std::to_string(t->ne[i]);
  if (!same)
    bad(path, specinfer_plugin::format("tensor %s has shape [%s], expected [%s]", name, got.c_str(),
                                       want.c_str()));
  return *t;
}

std::vector<float> read_floats(const specinfer::gguf::TensorInfo &t, const std::string &path) {
  const size_t n = static_cast<size_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
  std::vector<float> out(n);
  if (t.type == kTypeF16) {
    const auto *p = static_cast<const uint8_t *>(t.data);
    for (size_t i = 0; i < n; ++i)
      out[i] = f16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
  } else {
    std::memcpy(out.data(), t.data, n * sizeof(float));
  }
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      bad(path,
          specinfer_plugin::format("tensor %s holds a non-finite value at %zu", t.name.c_str(), i));
  return out;
}

uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const auto *p = static_cast<const uint8_t *>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

TargetIdentity identify_target(const specinfer_model_info &info,
                               const specinfer_host_target &target) {
  const specinfer_target_vtable *vt = target.vtable;
  if (!vt ||
      vt->struct_size < offsetof(specinfer_target_vtable, output_rows) + sizeof(vt->output_rows) ||
      !vt->output_rows)
    fail(SPECINFER_ERR_UNSUPPORTED,
         "medusa: the target (%s) cannot hand out its output rows, which Medusa heads need",
         info.name ? info.name : "?");
  if (info.vocab_size <= 0 || info.hidden_size <= 0 || info.hidden_size > kMaxHidden)
    fail(SPECINFER_ERR_UNSUPPORTED, "medusa: the target reports vocab_size %d, hidden_size %d",
         info.vocab_size, info.hidden_size);
  TargetIdentity id;
  id.name = info.name ? info.name : "";
  id.arch = info.arch ? info.arch : "";
  id.vocab_size = info.vocab_size;
  id.hidden_size = info.hidden_size;
  // Low ids: a draft-style target that computes logits only below a limit still hands out the
  // same rows for them.
  std::vector<int32_t> ids;
  for (int32_t t : {0, 1, 2, 3, 100, 1000, 5000, 10000, 20000})
    if (t < info.vocab_size) ids.push_back(t);
  std::vector<float> rows(ids.size() * static_cast<size_t>(info.hidden_size));
  specinfer_plugin_error e{};
  specinfer_status rc =
      vt->output_rows(target.self, ids.data(), static_cast<int32_t>(ids.size()), rows.data(), &e);
  if (rc != SPECINFER_OK)
    throw Failure(rc, std::string("medusa: the target's output_rows failed: ") + e.message);
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(h, &id.vocab_size, sizeof id.vocab_size);
  h = fnv1a(h, &id.hidden_size, sizeof id.hidden_size);
  h = fnv1a(h, rows.data(), rows.size() * sizeof(float));
  id.fingerprint = h;
  return id;
}

void token_row(float *row, int32_t hidden_size) {
  double ss = 0;
  for (int32_t i = 0; i < hidden_size; ++i) ss += static_cast<double>(row[i]) * row[i];
  const float scale = ss > 0 ? static_cast<float>(std::sqrt(hidden_size / ss)) : 0.0f;
  for (int32_t i = 0; i < hidden_size; ++i) row[i] *= scale;
}

void save_heads(const Heads &heads, const std::string &path) {
  const int32_t K = heads.n_heads, H = heads.hidden_size, V = heads.n_vocab();
  const int32_t D = heads.input_size();
  if (K < 1 || K > kMaxHeads || H < 1 || H > kMaxHidden || V < 1 || heads.token_inputs < 0 ||
      heads.token_inputs > 2 || heads.w.size() != static_cast<size_t>(K) * H * D ||
      heads.b.size() != static_cast<size_t>(K) * H ||
      heads.accuracy.size() != static_cast<size_t>(K) * kRanks)
    fail(SPECINFER_ERR_INVALID_ARGUMENT,
         "medusa: cannot save heads with inconsistent sizes (heads %d, hidden %d, vocab %d)", K, H,
         V);
  Writer w;
  w.key_string("general.architecture", kArch);
  w.key_u32("medusa-heads.n_heads", static_cast<uint32_t>(K));
  w.key_u32("medusa-heads.hidden_size", static_cast<uint32_t>(H));
  w.key_u32("medusa-heads.n_vocab", static_cast<uint32_t>(V));
  w.key_u32("medusa-heads.n_ranks", static_cast<uint32_t>(kRanks));
  w.key_u64("medusa-heads.trained_tokens", static_cast<uint64_t>(heads.trained_tokens));
  w.key_string("medusa-heads.target.name", heads.target.name);
  w.key_string("medusa-heads.target.arch", heads.target.arch);
  w.key_u32("medusa-heads.target.vocab_size", static_cast<uint32_t>(heads.target.vocab_size));
  w.key_u32("medusa-heads.target.hidden_size", static_cast<uint32_t>(heads.target.hidden_size));
  w.key_string("medusa-heads.target.fingerprint",
               specinfer_plugin::format("%016llx", (unsigned long long)heads.target.fingerprint));
  w.key_u32("medusa-heads.token_inputs", static_cast<uint32_t>(heads.token_inputs));
  w.tensor("medusa.vocab", kTypeI32, {static_cast<uint64_t>(V)}, heads.vocab.data(),
           heads.vocab.size() * sizeof(int32_t));
  std::vector<uint16_t> w16(heads.w.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_f16(heads.w[i]);
  w.tensor("medusa.w", kTypeF16,
           {static_cast<uint64_t>(D), static_cast<uint64_t>(H), static_cast<uint64_t>(K)},
           w16.data(), w16.size() * sizeof(uint16_t));
  w.tensor("medusa.b", kTypeF32, {static_cast<uint64_t>(H), static_cast<uint64_t>(K)},
           heads.b.data(), heads.b.size() * sizeof(float));
  w.tensor("medusa.accuracy", kTypeF32, {static_cast<uint64_t>(kRanks), static_cast<uint64_t>(K)},
           heads.accuracy.data(), heads.accuracy.size() * sizeof(float));
  write_file_atomically(path, w.bytes());
}

Heads load_heads(const std::string &path) {
  std::unique_ptr<specinfer::gguf::File> f;
  specinfer_plugin_error err{};
  specinfer_status rc =
      specinfer_plugin::guarded(&err, "medusa", [&] { f = specinfer::gguf::File::open(path); });
  if (rc != SPECINFER_OK)  // an unknown GGUF version or tensor type: a malformed heads file
    throw Failure(rc == SPECINFER_ERR_UNSUPPORTED ? SPECINFER_ERR_FORMAT : rc,
                  std::string("medusa: heads file '") + path + "': " + err.message);
  try {
    const std::string arch = f->get_string("general.architecture").value_or("");
    if (arch != kArch)
      bad(path, "not a Medusa heads file (general.architecture is '" + arch + "', expected '" +
                    kArch + "')");
    Heads h;
    h.n_heads = static_cast<int32_t>(need_int(*f, path, "medusa-heads.n_heads", 1, kMaxHeads));
    h.hidden_size =
        static_cast<int32_t>(need_int(*f, path, "medusa-heads.hidden_size", 1, kMaxHidden));
    const int64_t V = need_int(*f, path, "medusa-heads.n_vocab", 1, int64_t(1) << 30);
    need_int(*f, path, "medusa-heads.n_ranks", kRanks, kRanks);
    h.trained_tokens =
        need_int(*f, path, "medusa-heads.trained_tokens", 0, std::numeric_limits<int64_t>::max());
    h.target.name = need_string(*f, path, "medusa-heads.target.name");
    h.target.arch = need_string(*f, path, "medusa-heads.target.arch");
    h.target.vocab_size = static_cast<int32_t>(need_int(*f, path, "medusa-heads.target.vocab_size",
                                                        1, std::numeric_limits<int32_t>::max()));
    h.target.hidden_size =
        static_cast<int32_t>(need_int(*f, path, "medusa-heads.target.hidden_size", 1, kMaxHidden));
    if (h.target.hidden_size != h.hidden_size)
      bad(path, specinfer_plugin::format("hidden_size %d differs from the target's %d",
                                         h.hidden_size, h.target.hidden_size));
    if (V > h.target.vocab_size)
      bad(path, specinfer_plugin::format("n_vocab %lld exceeds the target's vocabulary %d",
                                         (long long)V, h.target.vocab_size));
    const std::string fp = need_string(*f, path, "medusa-heads.target.fingerprint");
    if (fp.size() != 16 || fp.find_first_not_of("0123456789abcdef") != std::string::npos)
      bad(path, "medusa-heads.target.fingerprint '" + fp + "' is not 16 hex digits");
    h.target.fingerprint = std::strtoull(fp.c_str(), nullptr, 16);
    if (f->get_int("medusa-heads.token_inputs"))
      h.token_inputs = static_cast<int32_t>(need_int(*f, path, "medusa-heads.token_inputs", 0, 2));

    const int64_t K = h.n_heads, H = h.hidden_size, D = h.input_size();
    const auto &tv = need_tensor(*f, path, "medusa.vocab", {kTypeI32}, {V});
    h.vocab.resize(static_cast<size_t>(V));
    std::memcpy(h.vocab.data(), tv.data, h.vocab.size() * sizeof(int32_t));
    for (size_t i = 0; i < h.vocab.size(); ++i)
      if (h.vocab[i] < 0 || h.vocab[i] >= h.target.vocab_size)
        bad(path, specinfer_plugin::format("vocabulary entry %zu is token %d, outside [0, %d)", i,
                                           h.vocab[i], h.target.vocab_size));
    h.w = read_floats(need_tensor(*f, path, "medusa.w", {kTypeF16, kTypeF32}, {D, H, K}), path);
    h.b = read_floats(need_tensor(*f, path, "medusa.b", {kTypeF32}, {H, K}), path);
    h.accuracy =
        read_floats(need_tensor(*f, path, "medusa.accuracy", {kTypeF32}, {kRanks, K}), path);
    for (float a : h.accuracy)
      if (a < 0.0f || a > 1.0f) bad(path, "an accuracy lies outside [0, 1]");
    return h;
  } catch (const Failure &e) {
    if (std::strncmp(e.what(), "medusa: ", 8) == 0) throw;
    // The reader's own type errors (a key holding a string where a number belongs, ...).
    throw Failure(SPECINFER_ERR_FORMAT,
                  std::string("medusa: heads file '") + path + "': " + e.what());
  }
}

void check_identity(const Heads &heads, const TargetIdentity &id, const std::string &path) {
  const TargetIdentity &h = heads.target;
  auto describe = [](const TargetIdentity &t) {
    return specinfer_plugin::format("'%s' (%s, vocabulary %d, hidden %d, fingerprint %016llx)",
                                    t.name.c_str(), t.arch.c_str(), t.vocab_size, t.hidden_size,
                                    (unsigned long long)t.fingerprint);
  };
  if (h.arch != id.arch || h.vocab_size != id.vocab_size || h.hidden_size != id.hidden_size ||
      h.fingerprint != id.fingerprint || heads.hidden_size != id.hidden_size)
    throw Failure(SPECINFER_ERR_CONFIG, "medusa: heads file '" + path + "' was trained for " +
                                            describe(h) + ", not for this target " + describe(id));
}

}  // namespace medusa
