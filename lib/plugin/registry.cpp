#include "plugin/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#if defined(__SANITIZE_THREAD__)
#include <tbb/global_control.h>
#endif

#include "plugin/host_services.h"
#include "util/error.h"

namespace specinfer {

namespace {

std::string library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&specinfer_version_number), &info) && info.dli_fname) {
    std::string path = info.dli_fname;
    auto slash = path.rfind('/');
    if (slash != std::string::npos) return path.substr(0, slash);
  }
  return {};
}

bool is_file(const std::string &path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<std::string> split_path(const std::string &path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

bool valid_name(const char *name) {
  if (!name || !*name) return false;
  for (const char *c = name; *c; ++c)
    if (!(std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '_')) return false;
  return std::strlen(name) < 64;
}

int env_threads() {
  const char *s = std::getenv("SPECINFER_THREADS");
  if (s && *s) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

}  // namespace

Registry::Registry(const specinfer_registry_params &params)
    : n_threads_(params.n_threads > 0 ? params.n_threads : env_threads()),
      arena_(params.n_threads > 0 ? params.n_threads : env_threads()),
      log_fn_(params.log),
      log_user_(params.log_user),
      log_level_(params.log_level) {
#if defined(__SANITIZE_THREAD__)
  // No oneTBB worker threads under ThreadSanitizer: see run() in registry.h.
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
#endif
  std::string path;
  if (const char *env = std::getenv("SPECINFER_PLUGIN_PATH"); env && *env) path = env;
  std::string lib = library_dir();
  auto append = [&](const std::string &dir) {
    if (dir.empty()) return;
    if (!path.empty()) path += ':';
    path += dir;
  };
  if (!lib.empty()) {
    append(lib + "/specinfer/plugins");
    append(lib + "/plugins");
  }
  append(SPECINFER_DEFAULT_PLUGIN_DIR);
  search_path_ = path;
  fill_host_table(host_, this);
}

Registry::~Registry() {
  std::lock_guard<std::mutex> lock(mu_);
  // Unload in reverse order of loading.
  while (!plugins_.empty()) {
    release(*plugins_.back());
    plugins_.pop_back();
  }
}

void Registry::log(specinfer_log_level level, const std::string &message) const {
  if (level < log_level_ || level >= SPECINFER_LOG_NONE) return;
  if (log_fn_) {
    log_fn_(log_user_, level, message.c_str());
  } else if (level >= SPECINFER_LOG_WARN) {
    static const char *names[] = {"debug", "info", "warning", "error"};
    std::fprintf(stderr, "specinfer: %s: %s\n", names[level], message.c_str());
  }
}

void Registry::release(LoadedPlugin &plugin) {
  if (plugin.descriptor && plugin.descriptor->deinit) plugin.descriptor->deinit();
  if (plugin.dl_handle) dlclose(plugin.dl_handle);
  plugin.dl_handle = nullptr;
}

void Registry::add(const specinfer_plugin_descriptor *d, const std::string &path, void *dl) {
  // Caller holds mu_. On failure the caller closes `dl`.
  const std::string where = path.empty() ? std::string("(in-process)") : path;
  if (!d) fail(SPECINFER_ERR_INVALID_ARGUMENT, "plugin descriptor is NULL");
  if (d->abi_version != SPECINFER_PLUGIN_ABI_VERSION)
    fail(SPECINFER_ERR_ABI_MISMATCH,
         "plugin %s was built for plugin ABI version %u, but this library (specinfer %s) speaks "
         "plugin ABI version %u; rebuild the plugin against this version's specinfer_plugin.h",
         where.c_str(), d->abi_version, SPECINFER_VERSION_STRING, SPECINFER_PLUGIN_ABI_VERSION);
  if (d->struct_size < sizeof(specinfer_plugin_descriptor))
    fail(SPECINFER_ERR_ABI_MISMATCH, "plugin %s: descriptor struct_size %u is smaller than %zu",
         where.c_str(), d->struct_size, sizeof(specinfer_plugin_descriptor));
  if (!valid_name(d->name))
    fail(SPECINFER_ERR_FORMAT,
         "plugin %s: name must be 1-63 characters of letters, digits, '-' or '_'", where.c_str());
  if (!d->get_factory)
    fail(SPECINFER_ERR_FORMAT, "plugin %s ('%s') has no get_factory", where.c_str(), d->name);
  for (auto &p : plugins_)
    if (p->name == d->name)
      fail(SPECINFER_ERR_STATE, "a plugin named '%s' is already loaded (from %s)", d->name,
           p->path.empty() ? "in-process" : p->path.c_str());

  auto plugin = std::make_unique<LoadedPlugin>();
  plugin->name = d->name;
  plugin->version = d->version ? d->version : "";
  plugin->description = d->description ? d->description : "";
  plugin->path = path;
  plugin->descriptor = d;
  auto tf =
      static_cast<const specinfer_target_factory *>(d->get_factory(SPECINFER_TARGET_FACTORY_ID));
  auto df =
      static_cast<const specinfer_drafter_factory *>(d->get_factory(SPECINFER_DRAFTER_FACTORY_ID));
  if (tf && (tf->struct_size < sizeof(specinfer_target_factory) || !tf->create))
    fail(SPECINFER_ERR_FORMAT, "plugin '%s': malformed target factory", d->name);
  // `train` was added after create and is optional: older plugins stop before it.
  if (df && (df->struct_size < offsetof(specinfer_drafter_factory, train) || !df->create))
    fail(SPECINFER_ERR_FORMAT, "plugin '%s': malformed drafter factory", d->name);
  auto cf = static_cast<const specinfer_constraint_factory *>(
      d->get_factory(SPECINFER_CONSTRAINT_FACTORY_ID));
  if (cf && (cf->struct_size < sizeof(specinfer_constraint_factory) || !cf->create))
    fail(SPECINFER_ERR_FORMAT, "plugin '%s': malformed constraint factory", d->name);
  if (!tf && !df && !cf)
    fail(SPECINFER_ERR_FORMAT, "plugin '%s' provides none of %s, %s, %s", d->name,
         SPECINFER_TARGET_FACTORY_ID, SPECINFER_DRAFTER_FACTORY_ID,
         SPECINFER_CONSTRAINT_FACTORY_ID);
  plugin->target_factory = tf;
  plugin->drafter_factory = df;
  plugin->constraint_factory = cf;
  // Nothing may fail once init has run: the caller would close a plugin that is listed, or one
  // whose deinit is never called.
  plugins_.reserve(plugins_.size() + 1);
  if (d->init) {
    int32_t rc = d->init(&host_);
    if (rc != 0) fail(SPECINFER_ERR_PLUGIN, "plugin '%s': init failed (returned %d)", d->name, rc);
  }
  plugin->dl_handle = dl;
  plugins_.push_back(std::move(plugin));
  try {
    log(SPECINFER_LOG_DEBUG, format("loaded plugin '%s' from %s", d->name, where.c_str()));
  } catch (const std::bad_alloc &) {  // the plugin is loaded; only the line is lost
  }
}

void Registry::load_file(const std::string &path) {
  if (!is_file(path)) fail(SPECINFER_ERR_NOT_FOUND, "no plugin file at %s", path.c_str());
  void *dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *msg = dlerror();
    fail(SPECINFER_ERR_IO, "cannot load plugin %s: %s", path.c_str(), msg ? msg : "dlopen failed");
  }
  auto d = static_cast<const specinfer_plugin_descriptor *>(dlsym(dl, "specinfer_plugin_entry"));
  if (!d) {
    dlclose(dl);
    fail(SPECINFER_ERR_FORMAT,
         "%s is not a specinfer plugin: it exports no 'specinfer_plugin_entry'", path.c_str());
  }
  std::lock_guard<std::mutex> lock(mu_);
  try {
    add(d, path, dl);
  } catch (...) {
    dlclose(dl);
    throw;
  }
}

int Registry::load_dir(const std::string &dir) {
  DIR *dp = opendir(dir.c_str());
  if (!dp) fail(SPECINFER_ERR_NOT_FOUND, "cannot open plugin directory %s", dir.c_str());
  std::vector<std::string> files;
  while (dirent *e = readdir(dp)) {
    std::string name = e->d_name;
    if (name.rfind("specinfer-", 0) == 0 && name.size() > 3 &&
        name.substr(name.size() - 3) == ".so")
      files.push_back(dir + "/" + name);
  }
  closedir(dp);
  std::sort(files.begin(), files.end());
  int loaded = 0;
  for (auto &f : files) {
    try {
      load_file(f);
      ++loaded;
    } catch (const Error &e) {
      log(SPECINFER_LOG_WARN, e.what());
    }
  }
  return loaded;
}

void Registry::register_plugin(const specinfer_plugin_descriptor *d) {
  std::lock_guard<std::mutex> lock(mu_);
  add(d, "", nullptr);
}

void Registry::unload(const std::string &name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = plugins_.begin(); it != plugins_.end(); ++it) {
    if ((*it)->name != name) continue;
    if ((*it)->open_objects.load() > 0)
      fail(SPECINFER_ERR_STATE,
           "plugin '%s' still has %d open target(s), drafter(s) or constraint(s)", name.c_str(),
           (*it)->open_objects.load());
    release(**it);
    plugins_.erase(it);
    return;
  }
  fail(SPECINFER_ERR_NOT_FOUND, "no plugin named '%s' is loaded", name.c_str());
}

LoadedPlugin &Registry::find(const std::string &name) {
  const auto loaded = [&]() -> LoadedPlugin * {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &p : plugins_)
      if (p->name == name) return p.get();
    return nullptr;
  };
  if (LoadedPlugin *p = loaded()) return *p;
  if (!valid_name(name.c_str()))
    fail(SPECINFER_ERR_NOT_FOUND, "'%s' is not a plugin name", name.c_str());
  std::lock_guard<std::mutex> autoload(autoload_mu_);
  if (LoadedPlugin *p = loaded()) return *p;  // another thread may have loaded it meanwhile
  for (const std::string &dir : split_path(search_path_)) {
    std::string file = dir + "/specinfer-" + name + ".so";
    if (!is_file(file)) continue;
    load_file(file);
    if (LoadedPlugin *p = loaded()) return *p;
    std::lock_guard<std::mutex> lock(mu_);
    fail(SPECINFER_ERR_FORMAT, "%s calls itself '%s', not '%s'", file.c_str(),
         plugins_.back()->name.c_str(), name.c_str());
  }
  fail(SPECINFER_ERR_NOT_FOUND, "no plugin named '%s' is loaded or found on the plugin path %s",
       name.c_str(), search_path_.c_str());
}

int Registry::plugin_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(plugins_.size());
}

bool Registry::plugin_info(int index, specinfer_plugin_info *info) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || index >= static_cast<int>(plugins_.size())) return false;
  const LoadedPlugin &p = *plugins_[static_cast<size_t>(index)];
  specinfer_plugin_info out{};
  out.struct_size = info->struct_size;
  out.name = p.name.c_str();
  out.version = p.version.c_str();
  out.description = p.description.c_str();
  out.path = p.path.c_str();
  out.has_target = p.target_factory != nullptr;
  out.has_drafter = p.drafter_factory != nullptr;
  out.abi_version = p.descriptor->abi_version;
  out.has_constraint = p.constraint_factory != nullptr;
  std::memcpy(info, &out, std::min<size_t>(info->struct_size, sizeof(out)));
  return true;
}

bool Registry::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto &p : plugins_)
    if (p->open_objects.load() > 0) return true;
  return false;
}

Registry *registry_of(const specinfer_host *host) {
  return host ? static_cast<Registry *>(host->host_data) : nullptr;
}

}  // namespace specinfer
