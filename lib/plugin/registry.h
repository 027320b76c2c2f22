// The plugin registry: loaded plugins (from files or registered in-process), the plugin search
// path, the host services table handed to plugins, and the thread arena they run in.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <tbb/task_arena.h>

#include "specinfer_plugin.h"

namespace specinfer {

class TargetObject;

struct LoadedPlugin {
  std::string name, version, description, path;
  const specinfer_plugin_descriptor *descriptor = nullptr;
  void *dl_handle = nullptr;  // nullptr for an in-process plugin
  const specinfer_target_factory *target_factory = nullptr;
  const specinfer_drafter_factory *drafter_factory = nullptr;
  const specinfer_constraint_factory *constraint_factory = nullptr;
  std::atomic<int> open_objects{0};  // targets, drafters and constraints made by it still open
};

class Registry {
 public:
  explicit Registry(const specinfer_registry_params &params);
  ~Registry();
  Registry(const Registry &) = delete;
  Registry &operator=(const Registry &) = delete;

  // Each throws specinfer::Error with a message naming the plugin and file.
  void load_file(const std::string &path);
  int load_dir(const std::string &dir);
  void register_plugin(const specinfer_plugin_descriptor *descriptor);
  void unload(const std::string &name);

  // The plugin named `name`; loads specinfer-<name>.so from the search path when needed.
  LoadedPlugin &find(const std::string &name);

  int plugin_count() const;
  // Copies out the info of plugin `index`; false when out of range.
  bool plugin_info(int index, specinfer_plugin_info *info) const;

  const std::string &search_path() const { return search_path_; }
  const specinfer_host *host() const { return &host_; }
  int threads() const { return n_threads_; }
  bool busy() const;  // plugins with open objects

  // Runs fn on the registry's threads (so kernels inside parallelize over n_threads).
  template <typename F>
  void run(F &&fn) {
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer builds: on the calling thread, and oneTBB is held to one thread
    // (registry.cpp). libtbb is not instrumented, so TSan cannot see its hand-offs between threads
    // and would report every task as a race; this way each application thread's work stays on it
    // and the races TSan reports are between the application's threads (docs/RELIABILITY.md).
    fn();
#else
    arena_.execute(std::forward<F>(fn));
#endif
  }

  void log(specinfer_log_level level, const std::string &message) const;

  // Open targets offered for sharing their loaded model, by the plugin and config they were
  // opened with (objects.cpp keeps it: a target is added once open and removed before it is
  // destroyed, both under the mutex, so a share never starts from a target being destroyed).
  std::mutex targets_mu;
  std::vector<std::pair<std::string, TargetObject *>> shareable_targets;

 private:
  void add(const specinfer_plugin_descriptor *descriptor, const std::string &path, void *dl);
  void release(LoadedPlugin &plugin);

  mutable std::mutex mu_;
  // Held across find()'s look-up-then-load from the plugin path, so that two threads opening the
  // same not-yet-loaded plugin do not both load it (the second would fail: already loaded).
  std::mutex autoload_mu_;
  std::vector<std::unique_ptr<LoadedPlugin>> plugins_;
  std::string search_path_;
  int n_threads_ = 1;
  tbb::task_arena arena_;
  specinfer_log_fn log_fn_ = nullptr;
  void *log_user_ = nullptr;
  specinfer_log_level log_level_ = SPECINFER_LOG_INFO;
  specinfer_host host_{};
};

// The registry that owns a host table (host->host_data).
Registry *registry_of(const specinfer_host *host);

}  // namespace specinfer
