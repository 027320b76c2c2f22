#include "plugin/objects.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>

#include "api/handles.h"
#include "plugin/registry.h"
#include "session/pass_cost.h"
#include "util/error.h"

namespace specinfer {

void check_plugin(specinfer_status rc, const specinfer_plugin_error &err, const char *what) {
  if (rc == SPECINFER_OK) return;
  // The plugin may have left the buffer unterminated; never read past it.
  std::string msg(err.message, strnlen(err.message, sizeof(err.message)));
  const bool known = rc > SPECINFER_OK && rc <= SPECINFER_ERR_INTERNAL;
  if (!known) {
    msg = format("the plugin returned unknown status %d%s%s", static_cast<int>(rc),
                 msg.empty() ? "" : ": ", msg.c_str());
    rc = SPECINFER_ERR_PLUGIN;
  } else if (msg.empty()) {
    msg = format("the plugin failed with %s and no message", specinfer_status_str(rc));
  }
  throw Error(rc, format("%s: %s", what, msg.c_str()));
}

namespace {

// Vocabularies beyond this are refused: the session keeps (max_draft + 1) rows of vocab floats,
// and index arithmetic stays far from overflow. The largest real vocabularies are ~262k.
constexpr int32_t kMaxVocab = 1 << 24;

specinfer_plugin_error fresh_error() {
  specinfer_plugin_error e;
  e.message[0] = '\0';
  return e;
}

// A status a plugin returned, read as an int: loading a value outside the enum as
// specinfer_status would be undefined (UBSan's enum check stops the process on it). An unknown
// one becomes SPECINFER_ERR_PLUGIN, its value put before the plugin's message in err.
specinfer_status known_status(const specinfer_status &r, specinfer_plugin_error &err) noexcept {
  int v;
  static_assert(sizeof v == sizeof r);
  std::memcpy(&v, &r, sizeof v);
  if (v >= SPECINFER_OK && v <= SPECINFER_ERR_INTERNAL) return static_cast<specinfer_status>(v);
  try {
    const std::string own(err.message, strnlen(err.message, sizeof(err.message)));
    snprintf(err.message, sizeof(err.message), "the plugin returned unknown status %d%s%s", v,
             own.empty() ? "" : ": ", own.c_str());
  } catch (...) {  // no memory for the copy: the status alone
    snprintf(err.message, sizeof(err.message), "the plugin returned unknown status %d", v);
  }
  return SPECINFER_ERR_PLUGIN;
}

// Calls a plugin function; an exception it lets out (which the ABI forbids) becomes
// SPECINFER_ERR_PLUGIN with a message instead of unwinding through the host.
template <typename F>
specinfer_status call_plugin(specinfer_plugin_error &err, F &&fn) noexcept {
  const char *why = "an exception of unknown type";
  std::string what;
  try {
    const specinfer_status r = fn();
    return known_status(r, err);
  } catch (const std::exception &e) {
    try {
      what = e.what();
    } catch (...) {
    }
    why = what.c_str();
  } catch (...) {
  }
  snprintf(err.message, sizeof(err.message), "the plugin threw (%s)", why);
  return SPECINFER_ERR_PLUGIN;
}

// A destroy function that throws must not take the host down.
void destroy_quietly(void (*destroy)(void *), void *self) noexcept {
  if (!destroy) return;
  try {
    destroy(self);
  } catch (...) {
  }
}

// The object that takes over a plugin instance, made by `make` with `new (std::nothrow)`: when
// its memory is refused the instance is destroyed here instead of leaking (a constructor that
// throws destroys the instance itself).
template <typename Make>
auto adopt(void *self, void (*destroy)(void *), Make &&make) {
  auto *o = make();
  if (!o) {
    destroy_quietly(destroy, self);
    throw std::bad_alloc();
  }
  return std::unique_ptr<std::remove_pointer_t<decltype(o)>>(o);
}

// Checks n_rows rows of vocab logits: a NaN or +inf logit, or a row with no finite logit, is the
// target's bug (-inf alone is allowed: a token the target rules out). Bit tests, so that the scan
// vectorizes: one row costs far less than the sampler's pass over it.
void check_logits(const float *logits, int32_t n_rows, int32_t vocab, const char *what) {
  constexpr uint32_t kExp = 0x7f800000u, kNegInf = 0xff800000u;
  for (int32_t r = 0; r < n_rows; ++r) {
    const float *row = logits + static_cast<size_t>(r) * vocab;
    uint32_t bad = 0, finite = 0;
    for (int32_t j = 0; j < vocab; ++j) {
      uint32_t bits;
      std::memcpy(&bits, row + j, sizeof bits);
      const uint32_t nonfinite = (bits & kExp) == kExp;
      bad |= nonfinite & (bits != kNegInf);
      finite |= nonfinite ^ 1u;
    }
    if (!bad && finite) continue;
    for (int32_t j = 0; bad && j < vocab; ++j)
      if (std::isnan(row[j]) || row[j] == INFINITY)
        fail(SPECINFER_ERR_PLUGIN, "%s: the target returned a %s logit (row %d, token %d)", what,
             std::isnan(row[j]) ? "NaN" : "+inf", r, j);
    fail(SPECINFER_ERR_PLUGIN, "%s: the target returned a row of logits that are all -inf (row %d)",
         what, r);
  }
}

// Checks that a draft's q row is a distribution that can have drawn `token`.
void check_draft_probs(const float *q, int32_t vocab, int32_t node, int32_t token) {
  // 16 independent float sums (vector lanes, no serial add chain); each sums a sixteenth of the
  // row, so rounding stays far below the tolerance even for 262k-token vocabularies.
  float acc[16] = {};
  int bad = 0;
  int32_t j = 0;
  for (; j + 16 <= vocab; j += 16)
    for (int l = 0; l < 16; ++l) {
      bad |= !(q[j + l] >= 0.0f);  // NaN too
      acc[l] += q[j + l];
    }
  for (; j < vocab; ++j) {
    bad |= !(q[j] >= 0.0f);
    acc[0] += q[j];
  }
  double sum = 0;
  for (float a : acc) sum += a;
  if (bad) {
    for (j = 0; j < vocab; ++j)
      if (!(q[j] >= 0.0f))
        fail(SPECINFER_ERR_PLUGIN,
             "drafter node %d's probabilities are not a distribution: q[%d] is %s", node, j,
             std::isnan(q[j]) ? "NaN" : "negative");
  }
  if (!(std::fabs(sum - 1.0) <= 1e-3))
    fail(SPECINFER_ERR_PLUGIN,
         "drafter node %d's probabilities are not a distribution: they sum to %g, not 1", node,
         sum);
  if (!(q[token] > 0.0f))
    fail(SPECINFER_ERR_PLUGIN, "drafter node %d's token %d has probability 0 in its own q", node,
         token);
}

}  // namespace

TargetObject::TargetObject(Registry &registry, LoadedPlugin *plugin, void *self,
                           const specinfer_target_vtable *vtable)
    : registry_(registry), plugin_(plugin), self_(self), vtable_(vtable) {
  // Fields after kv_keep were added later and are optional: older plugins stop before them.
  if (!vtable_ || vtable_->struct_size < offsetof(specinfer_target_vtable, output_rows) ||
      !vtable_->info || !vtable_->tokenize || !vtable_->token_bytes || !vtable_->forward ||
      !vtable_->kv_size || !vtable_->kv_truncate) {
    if (vtable_) destroy_quietly(vtable_->destroy, self_);
    vtable_ = nullptr;
    fail(SPECINFER_ERR_PLUGIN, "target plugin returned an incomplete vtable");
  }
  specinfer_model_info info{};
  info.struct_size = sizeof(info);
  info.bos_token = info.eos_token = info.eot_token = -1;
  auto err = fresh_error();
  specinfer_status rc = call_plugin(err, [&] { return vtable_->info(self_, &info); });
  const int32_t v = info.vocab_size;
  auto special_ok = [v](int32_t t) { return t >= -1 && t < v; };
  const char *bad = rc != SPECINFER_OK            ? "its info call failed"
                    : v <= 0 || v > kMaxVocab     ? "vocabulary size"
                    : info.n_ctx <= 0             ? "context size"
                    : info.hidden_size < 0        ? "hidden size"
                    : !special_ok(info.bos_token) ? "bos token"
                    : !special_ok(info.eos_token) ? "eos token"
                    : !special_ok(info.eot_token) ? "eot token"
                                                  : nullptr;
  if (bad) {
    destroy_quietly(vtable_->destroy, self_);
    vtable_ = nullptr;
    fail(SPECINFER_ERR_PLUGIN,
         "target plugin gave no valid model info (%s: vocab %d, n_ctx %d, hidden %d, bos %d, "
         "eos %d, eot %d)",
         bad, v, info.n_ctx, info.hidden_size, info.bos_token, info.eos_token, info.eot_token);
  }
  try {
    pass_cost_ = std::make_shared<PassCost>();
    copy_info(info);
  } catch (...) {  // out of memory: the instance is not taken over
    if (vtable_) destroy_quietly(vtable_->destroy, self_);
    vtable_ = nullptr;
    throw;
  }
  if (plugin_) plugin_->open_objects++;  // last: a constructor that throws must not count
}

// The rest of the constructor: the model info's strings and end-of-generation list, kept.
void TargetObject::copy_info(specinfer_model_info &info) {
  name_ = info.name ? info.name : "";
  arch_ = info.arch ? info.arch : "";
  info.name = name_.c_str();
  info.arch = arch_.c_str();
  if (info.chat_template) chat_template_ = info.chat_template;
  info.chat_template = chat_template_ ? chat_template_->c_str() : nullptr;
  // End of generation: the plugin's list (ids in the vocabulary), else eos and eot.
  if (info.n_eog_tokens < 0 || info.n_eog_tokens > info.vocab_size ||
      (info.n_eog_tokens > 0 && info.eog_tokens == nullptr)) {
    vtable_->destroy(self_);
    vtable_ = nullptr;
    fail(SPECINFER_ERR_PLUGIN, "target plugin gave an invalid end-of-generation list (%d tokens)",
         info.n_eog_tokens);
  }
  eog_.assign(info.eog_tokens, info.eog_tokens + info.n_eog_tokens);
  for (int32_t id : {info.eos_token, info.eot_token})
    if (id >= 0) eog_.push_back(id);
  for (int32_t id : eog_)
    if (id < 0 || id >= info.vocab_size) {
      vtable_->destroy(self_);
      vtable_ = nullptr;
      fail(SPECINFER_ERR_PLUGIN,
           "target plugin gave end-of-generation token %d outside its vocabulary of %d", id,
           info.vocab_size);
    }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
  info.eog_tokens = eog_.empty() ? nullptr : eog_.data();
  info.n_eog_tokens = static_cast<int32_t>(eog_.size());
  info_ = info;
}

TargetObject::~TargetObject() {
  if (!key_.empty()) {
    std::lock_guard<std::mutex> lock(registry_.targets_mu);
    auto &v = registry_.shareable_targets;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it->second == this) {
        v.erase(it);
        break;
      }
  }
  if (vtable_) destroy_quietly(vtable_->destroy, self_);
  if (plugin_) plugin_->open_objects--;
}

std::vector<int32_t> TargetObject::tokenize(const char *text, size_t len, bool add_special,
                                            bool parse_special) {
  std::vector<int32_t> out(len + 16);
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t n = 0;
    auto err = fresh_error();
    specinfer_status rc = call_plugin(err, [&] {
      return vtable_->tokenize(self_, text, len, add_special, parse_special, out.data(), out.size(),
                               &n, &err);
    });
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL && attempt == 0 && n > out.size()) {
      out.resize(n);
      continue;
    }
    check_plugin(rc, err, "tokenize");
    if (n > out.size()) fail(SPECINFER_ERR_PLUGIN, "tokenize: plugin reported %zu tokens", n);
    out.resize(n);
    for (int32_t t : out)
      if (t < 0 || t >= info_.vocab_size)
        fail(SPECINFER_ERR_PLUGIN, "tokenize: plugin produced token %d outside the vocabulary", t);
    return out;
  }
  fail(SPECINFER_ERR_PLUGIN, "tokenize: plugin kept asking for a larger buffer");
}

std::string TargetObject::token_bytes(int32_t token) {
  std::string out(32, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t n = 0;
    auto err = fresh_error();
    specinfer_status rc = call_plugin(
        err, [&] { return vtable_->token_bytes(self_, token, out.data(), out.size(), &n, &err); });
    if (rc == SPECINFER_ERR_BUFFER_TOO_SMALL && attempt == 0 && n > out.size() && n < (1u << 20)) {
      out.resize(n);
      continue;
    }
    check_plugin(rc, err, "token_bytes");
    if (n > out.size()) fail(SPECINFER_ERR_PLUGIN, "token_bytes: bad length %zu", n);
    out.resize(n);
    return out;
  }
  fail(SPECINFER_ERR_PLUGIN, "token_bytes: plugin kept asking for a larger buffer");
}

void TargetObject::forward(const specinfer_forward_batch &batch) {
  TargetObject *self = this;
  forward_checked(
      &self, &batch, 1,
      [&](specinfer_plugin_error &err) {
        specinfer_status rc = SPECINFER_OK;
        registry_.run(
            [&] { rc = call_plugin(err, [&] { return vtable_->forward(self_, &batch, &err); }); });
        return rc;
      },
      "forward");
}

// Runs `pass` (a forward or forward_many over targets[0..n) with batches[0..n)), then checks each
// target's cache grew by its batch and its logits are sound. On any failure every target's cache
// is cut back to its size before the pass, so that the caller's idea of it stays true.
template <typename Pass>
void TargetObject::forward_checked(TargetObject *const *targets,
                                   const specinfer_forward_batch *batches, int32_t n, Pass &&pass,
                                   const char *what) {
  std::vector<int32_t> before(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    before[static_cast<size_t>(i)] = targets[i]->kv_size();
    targets[i]->kv_changes_++;
  }
  try {
    auto err = fresh_error();
    check_plugin(pass(err), err, what);
    for (int32_t i = 0; i < n; ++i) {
      TargetObject &t = *targets[i];
      const specinfer_forward_batch &b = batches[i];
      const int32_t after = t.vtable_->kv_size(t.self_);
      const int32_t expect = before[static_cast<size_t>(i)] + b.n_tokens;
      if (after != expect)
        fail(SPECINFER_ERR_PLUGIN,
             "%s: the target's cache holds %d positions after a pass over %d tokens on %d "
             "(expected %d)",
             what, after, b.n_tokens, before[static_cast<size_t>(i)], expect);
      if (b.n_logits > 0 && b.logits) check_logits(b.logits, b.n_logits, t.info_.vocab_size, what);
    }
  } catch (...) {
    for (int32_t i = 0; i < n; ++i) {  // best effort: the error at hand is the one to report
      TargetObject &t = *targets[i];
      auto e = fresh_error();
      const int32_t keep = before[static_cast<size_t>(i)];
      if (call_plugin(e, [&] {
            return t.vtable_->kv_size(t.self_) > keep ? t.vtable_->kv_truncate(t.self_, keep, &e)
                                                      : SPECINFER_OK;
          }) != SPECINFER_OK)
        t.registry_.log(
            SPECINFER_LOG_WARN,
            format("%s: the target's cache could not be cut back to %d positions", what, keep));
    }
    throw;
  }
}

void TargetObject::leave_cached(std::vector<int32_t> tokens) {
  left_ = std::move(tokens);
  left_at_ = kv_changes_;
}

std::vector<int32_t> TargetObject::take_cached() {
  std::vector<int32_t> out;
  out.swap(left_);
  // The cache may hold more than the session listed (a round's last positions): the next trim
  // cuts those.
  if (left_at_ != kv_changes_ || static_cast<size_t>(kv_size()) < out.size()) out.clear();
  return out;
}

int32_t TargetObject::kv_size() {
  auto err = fresh_error();
  int32_t n = -1;
  check_plugin(call_plugin(err,
                           [&] {
                             n = vtable_->kv_size(self_);
                             return SPECINFER_OK;
                           }),
               err, "kv_size");
  if (n < 0) fail(SPECINFER_ERR_PLUGIN, "kv_size: the target reported %d cached positions", n);
  return n;
}

int32_t TargetObject::kv_truncate(int32_t n_keep) {
  const int32_t before = kv_size();
  kv_changes_++;
  auto err = fresh_error();
  check_plugin(call_plugin(err, [&] { return vtable_->kv_truncate(self_, n_keep, &err); }), err,
               "kv_truncate");
  const int32_t after = kv_size(), expect = std::min(before, std::max(n_keep, 0));
  if (after > expect)
    fail(SPECINFER_ERR_PLUGIN,
         "kv_truncate: the target's cache holds %d positions after keeping %d of %d (expected at "
         "most %d)",
         after, n_keep, before, expect);
  return after;
}

void TargetObject::kv_keep(int32_t base, const int32_t *idx, int32_t n) {
  kv_changes_++;
  if (!vtable_->kv_keep)
    fail(SPECINFER_ERR_UNSUPPORTED, "this target cannot keep a token tree's path");
  auto err = fresh_error();
  check_plugin(call_plugin(err, [&] { return vtable_->kv_keep(self_, base, idx, n, &err); }), err,
               "kv_keep");
  const int32_t after = kv_size();
  if (after != base + n)
    fail(SPECINFER_ERR_PLUGIN,
         "kv_keep: the target's cache holds %d positions after keeping %d from %d (expected %d)",
         after, n, base, base + n);
}

bool TargetObject::kv_copy(TargetObject &src, int32_t n) {
  kv_changes_++;
  if (src.model_key().empty() || src.model_key() != key_)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "kv_copy: the source target is on another loaded model");
  if (vtable_->struct_size <
          offsetof(specinfer_target_vtable, kv_copy) + sizeof(vtable_->kv_copy) ||
      !vtable_->kv_copy) {
    kv_truncate(0);
    return false;
  }
  auto err = fresh_error();
  const specinfer_status rc =
      call_plugin(err, [&] { return vtable_->kv_copy(self_, src.self_, n, &err); });
  if (rc != SPECINFER_OK) {
    kv_truncate(0);  // the plugin's promise, kept for one that breaks it
    if (rc == SPECINFER_ERR_UNSUPPORTED) return false;
    check_plugin(rc, err, "kv_copy");
  }
  const int32_t after = kv_size();
  if (after != n)
    fail(SPECINFER_ERR_PLUGIN, "kv_copy: the target's cache holds %d positions after copying %d",
         after, n);
  return true;
}

bool TargetObject::can_share() const {
  return vtable_->struct_size >=
             offsetof(specinfer_target_vtable, share) + sizeof(vtable_->share) &&
         vtable_->share != nullptr;
}

TargetObject *TargetObject::share() {
  std::lock_guard<std::mutex> lock(registry_.targets_mu);
  return share_locked();
}

TargetObject *TargetObject::share_locked() {
  if (!can_share())
    fail(SPECINFER_ERR_UNSUPPORTED,
         "target plugin cannot share a loaded model (open the target again instead)");
  void *other = nullptr;
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  registry_.run(
      [&] { rc = call_plugin(err, [&] { return vtable_->share(self_, &other, &err); }); });
  check_plugin(rc, err, "share");
  if (other == nullptr) fail(SPECINFER_ERR_PLUGIN, "share: the plugin returned no instance");
  if (other == self_)  // two owners of one instance: it would be destroyed twice
    fail(SPECINFER_ERR_PLUGIN, "share: the plugin returned the instance it was asked to share");
  auto t = adopt(other, vtable_->destroy, [&] {
    return new (std::nothrow) specinfer_target(registry_, plugin_, other, vtable_);
  });
  t->pass_cost_ = pass_cost_;  // one loaded model: one table of its pass times
  if (!key_.empty()) {
    // Listed, then given its key without a step that can fail in between: the destructor
    // unlists what has a key (and a target listed without one would be left behind, dangling).
    std::string key = key_;
    registry_.shareable_targets.emplace_back(key, t.get());
    t->key_ = std::move(key);
  }
  return t.release();
}

void TargetObject::forward_many(TargetObject *const *targets,
                                const specinfer_forward_batch *batches, int32_t n) {
  if (n <= 0 || targets == nullptr || batches == nullptr || targets[0] == nullptr)
    fail(SPECINFER_ERR_INVALID_ARGUMENT, "forward_many: no targets");
  const specinfer_target_vtable *vt = targets[0]->vtable_;
  if (vt->struct_size <
          offsetof(specinfer_target_vtable, forward_many) + sizeof(vt->forward_many) ||
      vt->forward_many == nullptr)
    fail(SPECINFER_ERR_UNSUPPORTED, "target plugin cannot run several sequences in one pass");
  std::vector<void *> selves(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    if (targets[i] == nullptr || targets[i]->vtable_ != vt)
      fail(SPECINFER_ERR_INVALID_ARGUMENT, "forward_many: target %d is NULL or of another plugin",
           i);
    selves[static_cast<size_t>(i)] = targets[i]->self_;
  }
  forward_checked(
      targets, batches, n,
      [&](specinfer_plugin_error &err) {
        specinfer_status rc = SPECINFER_OK;
        targets[0]->registry_.run([&] {
          rc = call_plugin(err, [&] { return vt->forward_many(selves.data(), batches, n, &err); });
        });
        return rc;
      },
      "forward_many");
}

DrafterObject::DrafterObject(Registry &registry, LoadedPlugin *plugin, void *self,
                             const specinfer_drafter_vtable *vtable, TargetObject *target)
    : registry_(registry), plugin_(plugin), self_(self), vtable_(vtable), target_(target) {
  if (!vtable_ ||
      vtable_->struct_size < offsetof(specinfer_drafter_vtable, commit) + sizeof(vtable_->commit) ||
      !vtable_->begin || !vtable_->propose || !vtable_->commit) {
    if (vtable_) destroy_quietly(vtable_->destroy, self_);
    vtable_ = nullptr;
    fail(SPECINFER_ERR_PLUGIN, "drafter plugin returned an incomplete vtable");
  }
  if (target_) target_->users++;
  if (plugin_) plugin_->open_objects++;
}

DrafterObject::~DrafterObject() {
  if (vtable_) destroy_quietly(vtable_->destroy, self_);
  if (plugin_) plugin_->open_objects--;
  if (target_) target_->users--;
}

void DrafterObject::begin(const int32_t *context, size_t n) {
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  registry_.run(
      [&] { rc = call_plugin(err, [&] { return vtable_->begin(self_, context, n, &err); }); });
  check_plugin(rc, err, "drafter begin");
}

void DrafterObject::propose(const specinfer_draft_request &request, specinfer_draft &draft) {
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  registry_.run([&] {
    rc = call_plugin(err, [&] { return vtable_->propose(self_, &request, &draft, &err); });
  });
  check_plugin(rc, err, "drafter propose");
  check_draft(draft);
}

bool DrafterObject::can_propose_many() const {
  return vtable_->struct_size >=
             offsetof(specinfer_drafter_vtable, propose_many) + sizeof(vtable_->propose_many) &&
         vtable_->propose_many != nullptr;
}

void DrafterObject::propose_many(DrafterObject *const *drafters,
                                 const specinfer_draft_request *requests, specinfer_draft *drafts,
                                 int32_t n, std::exception_ptr *errors) {
  if (n <= 0) return;
  const specinfer_drafter_vtable *vt = drafters[0]->vtable_;
  std::vector<void *> selves(static_cast<size_t>(n));
  std::vector<specinfer_status> status(static_cast<size_t>(n), SPECINFER_ERR_PLUGIN);
  std::vector<specinfer_plugin_error> errs(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    if (drafters[i]->vtable_ != vt || !drafters[i]->can_propose_many())
      fail(SPECINFER_ERR_INTERNAL, "propose_many: drafter %d is of another plugin", i);
    selves[static_cast<size_t>(i)] = drafters[i]->self_;
    errs[static_cast<size_t>(i)] = fresh_error();
  }
  // The call's own error (a crash caught by call_plugin) is every drafter's.
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  drafters[0]->registry_.run([&] {
    rc = call_plugin(err, [&] {
      return vt->propose_many(selves.data(), requests, drafts, n, status.data(), errs.data());
    });
  });
  // A message of the call's own (an exception the plugin let out, an unknown status) is every
  // drafter's error; else each drafter's status says.
  const bool call_failed = rc != SPECINFER_OK && err.message[0] != '\0';
  for (int32_t i = 0; i < n; ++i) {
    const auto u = static_cast<size_t>(i);
    try {
      if (call_failed) check_plugin(rc, err, "drafter propose_many");
      check_plugin(known_status(status[u], errs[u]), errs[u], "drafter propose");
      drafters[i]->check_draft(drafts[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
}

void DrafterObject::check_draft(const specinfer_draft &draft) {
  if (draft.n_nodes < 0 || draft.n_nodes > draft.cap)
    fail(SPECINFER_ERR_PLUGIN, "drafter proposed %d nodes with room for %d", draft.n_nodes,
         draft.cap);
  for (int32_t i = 0; i < draft.n_nodes; ++i) {
    if (draft.tokens[i] < 0 || draft.tokens[i] >= draft.vocab_size)
      fail(SPECINFER_ERR_PLUGIN, "drafter proposed token %d outside the vocabulary",
           draft.tokens[i]);
    if (draft.parents[i] < -1 || draft.parents[i] >= i)
      fail(SPECINFER_ERR_PLUGIN, "drafter node %d has parent %d (must be -1 or an earlier node)", i,
           draft.parents[i]);
  }
  // A negative estimate is none; NaN or more than the nodes is a broken drafter.
  if (!(draft.expected_accepted < 0) && !(draft.expected_accepted <= draft.n_nodes))
    fail(SPECINFER_ERR_PLUGIN, "drafter expects %g of its %d nodes to be accepted",
         draft.expected_accepted, draft.n_nodes);
  if (draft.has_probs && draft.probs)
    for (int32_t i = 0; i < draft.n_nodes; ++i)
      check_draft_probs(draft.probs + static_cast<size_t>(i) * draft.vocab_size, draft.vocab_size,
                        i, draft.tokens[i]);
}

void DrafterObject::commit(const int32_t *tokens, size_t n) {
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  registry_.run(
      [&] { rc = call_plugin(err, [&] { return vtable_->commit(self_, tokens, n, &err); }); });
  check_plugin(rc, err, "drafter commit");
}

ConstraintObject::ConstraintObject(LoadedPlugin *plugin, void *self,
                                   const specinfer_constraint_vtable *vtable, TargetObject *target)
    : plugin_(plugin), self_(self), vtable_(vtable), target_(target) {
  if (!vtable_ || vtable_->struct_size < sizeof(specinfer_constraint_vtable) || !vtable_->mask ||
      !vtable_->consume || !vtable_->rollback || !vtable_->fork || !vtable_->forced ||
      !vtable_->state) {
    if (vtable_) destroy_quietly(vtable_->destroy, self_);
    vtable_ = nullptr;
    fail(SPECINFER_ERR_PLUGIN, "constraint plugin returned an incomplete vtable");
  }
  vocab_ = target_->info().vocab_size;
  target_->users++;
  if (plugin_) plugin_->open_objects++;
}

ConstraintObject::~ConstraintObject() {
  if (vtable_) destroy_quietly(vtable_->destroy, self_);
  if (plugin_) plugin_->open_objects--;
  target_->users--;
}

void ConstraintObject::mask(uint32_t *words, int32_t n_words) {
  auto err = fresh_error();
  const specinfer_status rc =
      call_plugin(err, [&] { return vtable_->mask(self_, words, n_words, &err); });
  check_plugin(rc, err, "constraint mask");
  // Bits past the vocabulary are cleared; a mask that allows nothing would leave no token.
  if (vocab_ % 32 != 0) words[n_words - 1] &= (1u << (vocab_ % 32)) - 1u;
  uint32_t any = 0;
  for (int32_t i = 0; i < n_words; ++i) any |= words[i];
  if (!any) fail(SPECINFER_ERR_PLUGIN, "constraint mask allows no token");
}

bool ConstraintObject::consume(int32_t token) {
  auto err = fresh_error();
  const specinfer_status rc =
      call_plugin(err, [&] { return vtable_->consume(self_, token, &err); });
  if (rc == SPECINFER_ERR_INVALID_ARGUMENT) return false;
  check_plugin(rc, err, "constraint consume");
  return true;
}

void ConstraintObject::rollback(int32_t n) {
  if (n == 0) return;
  auto err = fresh_error();
  const specinfer_status rc = call_plugin(err, [&] { return vtable_->rollback(self_, n, &err); });
  check_plugin(rc, err, "constraint rollback");
}

int32_t ConstraintObject::forced(int32_t *tokens, int32_t cap) {
  auto err = fresh_error();
  int32_t n = 0;
  const specinfer_status rc =
      call_plugin(err, [&] { return vtable_->forced(self_, tokens, cap, &n, &err); });
  check_plugin(rc, err, "constraint forced");
  if (n < 0 || n > cap)
    fail(SPECINFER_ERR_PLUGIN, "constraint forced %d tokens with room for %d", n, cap);
  for (int32_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      fail(SPECINFER_ERR_PLUGIN, "constraint forced token %d outside the vocabulary", tokens[i]);
  return n;
}

uint32_t ConstraintObject::state() {
  auto err = fresh_error();
  uint32_t st = 0;
  const specinfer_status rc = call_plugin(err, [&] { return vtable_->state(self_, &st, &err); });
  check_plugin(rc, err, "constraint state");
  return st;
}

ConstraintObject *ConstraintObject::fork() {
  auto err = fresh_error();
  void *self = nullptr;
  const specinfer_status rc = call_plugin(err, [&] { return vtable_->fork(self_, &self, &err); });
  if (rc != SPECINFER_OK) check_plugin(rc, err, "constraint fork");
  return adopt(self, vtable_->destroy,
               [&] {
                 return new (std::nothrow) specinfer_constraint(plugin_, self, vtable_, target_);
               })
      .release();
}

TargetObject *open_target_object(Registry &registry, const std::string &plugin,
                                 const std::string &config) {
  LoadedPlugin &p = registry.find(plugin);
  if (!p.target_factory)
    fail(SPECINFER_ERR_NOT_FOUND, "plugin '%s' provides no target (it is a drafter)",
         plugin.c_str());
  std::string key = plugin;
  key += '\0';
  key += config;
  {
    std::lock_guard<std::mutex> lock(registry.targets_mu);
    for (auto &[k, open] : registry.shareable_targets)
      if (k == key) return open->share_locked();  // (a key with a load count never equals one)
  }
  void *self = nullptr;
  const specinfer_target_vtable *vt = nullptr;
  auto err = fresh_error();
  specinfer_status rc = SPECINFER_OK;
  registry.run([&] {
    rc = call_plugin(err, [&] {
      return p.target_factory->create(registry.host(), config.c_str(), &self, &vt, &err);
    });
  });
  // The message only on failure: building it could fail too, and leave the new instance behind.
  if (rc != SPECINFER_OK) check_plugin(rc, err, ("opening target '" + plugin + "'").c_str());
  auto t = adopt(self, vt ? vt->destroy : nullptr,
                 [&] { return new (std::nothrow) specinfer_target(registry, &p, self, vt); });
  if (t->can_share()) {
    std::lock_guard<std::mutex> lock(registry.targets_mu);
    // Another thread may have loaded the same model meanwhile: the key names one loaded model,
    // so this one gets a key of its own (later opens share the first).
    static uint64_t loads = 0;
    for (auto &[k, open] : registry.shareable_targets)
      if (k == key) {
        key += '\0';
        key += std::to_string(++loads);
        break;
      }
    registry.shareable_targets.emplace_back(key, t.get());
    t->key_ = std::move(key);  // cannot fail: listed and keyed together
  }
  return t.release();
}

DrafterObject *open_drafter_object(Registry &registry, const std::string &plugin,
                                   const std::string &config, TargetObject &target) {
  LoadedPlugin &p = registry.find(plugin);
  if (!p.drafter_factory)
    fail(SPECINFER_ERR_NOT_FOUND, "plugin '%s' provides no drafter (it is a target only)",
         plugin.c_str());
  void *self = nullptr;
  const specinfer_drafter_vtable *vt = nullptr;
  auto err = fresh_error();
  specinfer_host_target ht{target.self(), target.vtable(), &target};
  specinfer_model_info info = target.info();
  specinfer_status rc = SPECINFER_OK;
  registry.run([&] {
    rc = call_plugin(err, [&] {
      return p.drafter_factory->create(registry.host(), config.c_str(), &info, &ht, &self, &vt,
                                       &err);
    });
  });
  // The message only on failure: building it could fail too, and leave the new instance behind.
  if (rc != SPECINFER_OK) check_plugin(rc, err, ("opening drafter '" + plugin + "'").c_str());
  return adopt(
             self, vt ? vt->destroy : nullptr,
             [&] { return new (std::nothrow) specinfer_drafter(registry, &p, self, vt, &target); })
      .release();
}

ConstraintObject *open_constraint_object(Registry &registry, const std::string &plugin,
                                         const std::string &config, TargetObject &target,
                                         const std::string &kind, const std::string &grammar) {
  LoadedPlugin &p = registry.find(plugin);
  if (!p.constraint_factory)
    fail(SPECINFER_ERR_NOT_FOUND, "plugin '%s' provides no constraints", plugin.c_str());
  void *self = nullptr;
  const specinfer_constraint_vtable *vt = nullptr;
  auto err = fresh_error();
  specinfer_host_target ht{target.self(), target.vtable(), &target};
  specinfer_model_info info = target.info();
  const specinfer_status rc = call_plugin(err, [&] {
    return p.constraint_factory->create(registry.host(), config.c_str(), &info, &ht, kind.c_str(),
                                        grammar.c_str(), &self, &vt, &err);
  });
  if (rc != SPECINFER_OK) check_plugin(rc, err, ("opening constraint '" + plugin + "'").c_str());
  return adopt(self, vt ? vt->destroy : nullptr,
               [&] { return new (std::nothrow) specinfer_constraint(&p, self, vt, &target); })
      .release();
}

void train_drafter(Registry &registry, const std::string &plugin, TargetObject &target,
                   const specinfer_train_params &params) {
  // The trainer runs the target: no session may start meanwhile (nor be running).
  if (target.in_session.exchange(true))
    fail(SPECINFER_ERR_STATE, "the target is used by a session; training needs it alone");
  struct Release {
    TargetObject &t;
    ~Release() { t.in_session = false; }
  } release{target};
  LoadedPlugin &p = registry.find(plugin);
  if (!p.drafter_factory)
    fail(SPECINFER_ERR_NOT_FOUND, "plugin '%s' provides no drafter", plugin.c_str());
  if (p.drafter_factory->struct_size <
          offsetof(specinfer_drafter_factory, train) + sizeof(p.drafter_factory->train) ||
      !p.drafter_factory->train)
    fail(SPECINFER_ERR_UNSUPPORTED, "drafter '%s' has nothing to train", plugin.c_str());
  auto err = fresh_error();
  specinfer_host_target ht{target.self(), target.vtable(), &target};
  specinfer_model_info info = target.info();
  specinfer_status rc = SPECINFER_OK;
  registry.run([&] {
    rc = call_plugin(
        err, [&] { return p.drafter_factory->train(registry.host(), &params, &info, &ht, &err); });
  });
  check_plugin(rc, err, ("training drafter '" + plugin + "'").c_str());
}

}  // namespace specinfer
