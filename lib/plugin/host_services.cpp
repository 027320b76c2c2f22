#include "plugin/host_services.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "../../common/fault_point.h"
#include "api/handles.h"
#include "backend/kernel_table.h"
#include "plugin/host.h"
#include "plugin/registry.h"
#include "util/error.h"

namespace specinfer {

namespace {

void host_log(const specinfer_host *host, int32_t level, const char *message) {
  if (!message) return;
  if (level < SPECINFER_LOG_DEBUG || level > SPECINFER_LOG_ERROR) level = SPECINFER_LOG_ERROR;
  if (Registry *r = registry_of(host)) {
    r->log(static_cast<specinfer_log_level>(level), message);
  } else if (level >= SPECINFER_LOG_WARN) {
    std::fprintf(stderr, "specinfer: %s\n", message);
  }
}

void *host_alloc(size_t size, size_t align) {
  if (align < sizeof(void *) || (align & (align - 1)) != 0) return nullptr;
  if (size == 0) size = align;
  size_t rounded = (size + align - 1) / align * align;
  if (rounded < size || fault_injected(FAULT_ALLOC)) return nullptr;
  return std::aligned_alloc(align, rounded);
}

void host_free(void *ptr) {
  std::free(ptr);
}

void host_parallel_for(const specinfer_host *, int64_t n, int64_t grain,
                       void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
  if (!fn || n <= 0) return;
  if (grain < 1) grain = 1;
  if (n <= grain) {
    fn(ctx, 0, n);
    return;
  }
  // Runs in the caller's arena: inside a registry call that is the registry's thread pool.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t> &r) { fn(ctx, r.begin(), r.end()); });
}

void write_error(specinfer_plugin_error *err, const char *msg) {
  if (!err) return;
  std::snprintf(err->message, sizeof(err->message), "%s", msg);
}

specinfer_status host_open_target(const specinfer_host *host, const char *plugin,
                                  const char *config, specinfer_host_target *out,
                                  specinfer_plugin_error *err) {
  Registry *r = registry_of(host);
  if (!out || !plugin) {
    write_error(err, "open_target: plugin name and out must not be NULL");
    return SPECINFER_ERR_INVALID_ARGUMENT;
  }
  std::memset(out, 0, sizeof(*out));
  if (!r) {
    write_error(err, "open_target: this host is bound to no registry");
    return SPECINFER_ERR_STATE;
  }
  try {
    TargetObject *t = open_target_object(*r, plugin, config ? config : "");
    out->self = t->self();
    out->vtable = t->vtable();
    out->host_handle = t;
    return SPECINFER_OK;
  } catch (const Error &e) {
    write_error(err, e.what());
    return e.code();
  } catch (const std::bad_alloc &) {
    write_error(err, "out of memory");
    return SPECINFER_ERR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    write_error(err, e.what());
    return SPECINFER_ERR_INTERNAL;
  }
}

void host_close_target(const specinfer_host *, specinfer_host_target *target) {
  if (!target || !target->host_handle) return;
  delete static_cast<TargetObject *>(target->host_handle);
  std::memset(target, 0, sizeof(*target));
}

}  // namespace

void fill_host_table(specinfer_host &host, Registry *registry) {
  std::memset(&host, 0, sizeof(host));
  host.struct_size = sizeof(specinfer_host);
  host.abi_version = SPECINFER_PLUGIN_ABI_VERSION;
  host.host_data = registry;
  host.log = host_log;
  host.alloc = host_alloc;
  host.free = host_free;
  host.parallel_for = host_parallel_for;
  host.n_threads = registry ? registry->threads() : tbb::this_task_arena::max_concurrency();
  host.kernels = backend_kernel_table();
  host.open_target = host_open_target;
  host.close_target = host_close_target;
  host.features = SPECINFER_HOST_SHORT_TRUNCATE;
}

const specinfer_host *default_host() {
  static const specinfer_host host = [] {
    specinfer_host h;
    fill_host_table(h, nullptr);
    return h;
  }();
  return &host;
}

}  // namespace specinfer
