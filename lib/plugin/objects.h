// Targets, drafters and constraints as the core sees them: a plugin instance (self + vtable) with
// its plugin kept loaded, plugin errors turned into specinfer::Error, and calls run on the
// registry's threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "specinfer_plugin.h"

namespace specinfer {

class Registry;
struct LoadedPlugin;
class PassCost;

class TargetObject {
 public:
  TargetObject(Registry &registry, LoadedPlugin *plugin, void *self,
               const specinfer_target_vtable *vtable);
  ~TargetObject();
  TargetObject(const TargetObject &) = delete;
  TargetObject &operator=(const TargetObject &) = delete;

  const specinfer_model_info &info() const { return info_; }
  std::vector<int32_t> tokenize(const char *text, size_t len, bool add_special, bool parse_special);
  std::string token_bytes(int32_t token);
  // Runs the plugin's forward and checks its result: the cache grew by batch.n_tokens, and no
  // logit is NaN or +inf nor a row all -inf. On any failure the cache is cut back to what it held.
  void forward(const specinfer_forward_batch &batch);
  int32_t kv_size();
  // Drops cached positions from n_keep on and returns how many the target kept: n_keep (or fewer
  // cached), or less when a sliding-window cache cannot serve the position after n_keep
  // (SPECINFER_HOST_SHORT_TRUNCATE); callers feed again from the returned size.
  int32_t kv_truncate(int32_t n_keep);
  void kv_keep(int32_t base, const int32_t *idx, int32_t n);
  // The plugin can open more instances on this one's loaded model (vtable share).
  bool can_share() const;
  // A new instance on this one's loaded model (weights shared, empty KV cache), owned by the
  // caller; may run while another thread uses this one. Throws UNSUPPORTED when !can_share().
  TargetObject *share();
  // One pass for n instances sharing a model, as the plugin's forward_many (all of them held by
  // the caller for the call). Throws UNSUPPORTED when the plugin has no forward_many.
  static void forward_many(TargetObject *const *targets, const specinfer_forward_batch *batches,
                           int32_t n);
  // Makes this cache the first n positions of src's (a target on this one's loaded model):
  // true when copied; false, with this cache empty, when the plugin cannot copy it (no kv_copy,
  // or UNSUPPORTED for this cache): the caller then scores the tokens. Throws for other errors.
  bool kv_copy(TargetObject &src, int32_t n);

  // Equal for targets on one loaded model (opened with the same plugin and config, or shared);
  // "" when the plugin cannot share.
  const std::string &model_key() const { return key_; }
  // The measured time of a pass by its token count (session/pass_cost.h): one table per loaded
  // model, held by every target shared from it, for the sessions that run on them.
  const std::shared_ptr<PassCost> &pass_cost() const { return pass_cost_; }

  Registry &registry() { return registry_; }
  void *self() const { return self_; }
  const specinfer_target_vtable *vtable() const { return vtable_; }

  // What the cache holds when a session on this target ends: that session's cached tokens (the
  // cache may hold more positions after them), for
  // the next session to start from (it keeps the prefix its text shares with them). They stay
  // valid until anything else changes the cache (a pass, a truncation, a copy into it):
  // take_cached() then returns none.
  void leave_cached(std::vector<int32_t> tokens);
  std::vector<int32_t> take_cached();

  std::string last_error;
  // Atomic: sessions on other targets, and the application's threads, read and change them while
  // this target's session runs (claiming is an exchange, so two sessions never both get it).
  std::atomic<int> users{0};  // sessions and drafters that borrow it
  std::atomic<bool> in_session{false};

 private:
  void copy_info(specinfer_model_info &info);
  Registry &registry_;
  // Counts the calls that change the cache; left_ is valid while it is still left_at_.
  uint64_t kv_changes_ = 0, left_at_ = 0;
  std::vector<int32_t> left_;
  LoadedPlugin *plugin_;
  void *self_;
  const specinfer_target_vtable *vtable_;
  specinfer_model_info info_{};
  std::string name_, arch_;
  std::optional<std::string> chat_template_;  // info_.chat_template (none: NULL)
  std::vector<int32_t> eog_;                  // info_.eog_tokens: checked, sorted, unique
  std::string key_;  // plugin and config it was opened with ("" = not offered for sharing)
  std::shared_ptr<PassCost> pass_cost_;
  TargetObject *share_locked();  // share() with the registry's targets_mu held
  template <typename Pass>
  static void forward_checked(TargetObject *const *targets, const specinfer_forward_batch *batches,
                              int32_t n, Pass &&pass, const char *what);
  friend TargetObject *open_target_object(Registry &, const std::string &, const std::string &);
};

class DrafterObject {
 public:
  DrafterObject(Registry &registry, LoadedPlugin *plugin, void *self,
                const specinfer_drafter_vtable *vtable, TargetObject *target);
  ~DrafterObject();
  DrafterObject(const DrafterObject &) = delete;
  DrafterObject &operator=(const DrafterObject &) = delete;

  void begin(const int32_t *context, size_t n);
  // Runs the plugin's propose and checks what it wrote: node count within the capacity, tokens
  // inside the vocabulary, parents earlier nodes, and with has_probs each q row a distribution
  // (finite, >= 0, summing to 1) that gives its node's token a positive probability.
  void propose(const specinfer_draft_request &request, specinfer_draft &draft);
  void commit(const int32_t *tokens, size_t n);
  // The plugin drafts for several of its drafters in one call (vtable propose_many).
  bool can_propose_many() const;
  // Drafts for drafters[0..n), all of one plugin that can_propose_many(), in one call: each
  // request into its draft, checked as propose() checks it. A drafter that fails gets its error
  // in errors[i] (the others' drafts stand); errors[i] stays empty otherwise.
  static void propose_many(DrafterObject *const *drafters, const specinfer_draft_request *requests,
                           specinfer_draft *drafts, int32_t n, std::exception_ptr *errors);
  const specinfer_drafter_vtable *vtable() const { return vtable_; }

  TargetObject *target() const { return target_; }
  std::string last_error;
  std::atomic<bool> in_session{false};  // claimed by exchange, as TargetObject::in_session
  // Measured time of begin() per token of its text (a draft model scores the text): what a
  // session weighs before a drafter that has yet to hear of a long text drafts in a group. Kept
  // here, across the sessions that use this drafter one after another; 0 until measured.
  double begin_ms_per_token = 0;

 private:
  Registry &registry_;
  LoadedPlugin *plugin_;
  void *self_;
  const specinfer_drafter_vtable *vtable_;
  TargetObject *target_;
  void check_draft(const specinfer_draft &draft);
};

// A grammar's state over the generated tokens (specinfer_constraint_vtable), opened for one
// target's vocabulary; it keeps that target open. Its calls run on the caller's thread.
class ConstraintObject {
 public:
  ConstraintObject(LoadedPlugin *plugin, void *self, const specinfer_constraint_vtable *vtable,
                   TargetObject *target);
  ~ConstraintObject();
  ConstraintObject(const ConstraintObject &) = delete;
  ConstraintObject &operator=(const ConstraintObject &) = delete;

  // The allowed next tokens as bits (words: (vocab + 31) / 32 of them); checked to allow at
  // least one token inside the vocabulary.
  void mask(uint32_t *words, int32_t n_words);
  // Advances by `token`: false (nothing changed) when the constraint does not allow it.
  bool consume(int32_t token);
  void rollback(int32_t n);
  // The tokens it forces from here (at most cap), checked to be inside the vocabulary.
  int32_t forced(int32_t *tokens, int32_t cap);
  uint32_t state();
  // A new object in this one's state, for the same target (owned by the caller).
  ConstraintObject *fork();

  TargetObject *target() const { return target_; }
  std::string last_error;
  std::atomic<bool> in_session{false};  // claimed by exchange, as TargetObject::in_session

 private:
  LoadedPlugin *plugin_;
  void *self_;
  const specinfer_constraint_vtable *vtable_;
  TargetObject *target_;
  int32_t vocab_;
};

// Opens a target / drafter through `registry` (loading the plugin from the search path if needed).
// The returned object is owned by the caller (delete it, or hand it to a public handle). A target
// whose plugin and config equal those of a target still open is a share() of it when the plugin
// can share: one loaded model, however many times it is opened (a draft model inside every
// session's drafter, or a model served and also drafting for another).
TargetObject *open_target_object(Registry &registry, const std::string &plugin,
                                 const std::string &config);
DrafterObject *open_drafter_object(Registry &registry, const std::string &plugin,
                                   const std::string &config, TargetObject &target);

// Compiles `grammar` of `kind` with the constraint plugin `plugin` for target's vocabulary.
ConstraintObject *open_constraint_object(Registry &registry, const std::string &plugin,
                                         const std::string &config, TargetObject &target,
                                         const std::string &kind, const std::string &grammar);

// Runs the drafter plugin's trainer (specinfer_drafter_factory.train) for `target`, which it
// uses alone meanwhile. Throws UNSUPPORTED when the plugin has no trainer.
void train_drafter(Registry &registry, const std::string &plugin, TargetObject &target,
                   const specinfer_train_params &params);

// Turns a plugin's failure into specinfer::Error; the message names the plugin call.
void check_plugin(specinfer_status rc, const specinfer_plugin_error &err, const char *what);

}  // namespace specinfer
