// The factory and the exported descriptor of a plugin that provides one drafter and nothing else
// (header-only, no dependency on the library). A drafter plugin writes its create function (and
// its vtable), then ends its entry file with:
//
//   namespace {
//   ...
//   constexpr specinfer_drafter_factory kFactory = specinfer_plugin::drafter_factory(create);
//   }  // namespace
//
//   extern "C" SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry =
//       specinfer_plugin::drafter_plugin_descriptor<kFactory>("name", "1.0", "what it drafts");
//
// drafter_factory() sets struct_size and create and leaves every later field of the factory NULL;
// a drafter that implements one of them sets it on the result before it becomes kFactory:
//
//   constexpr specinfer_drafter_factory kFactory = [] {
//     specinfer_drafter_factory f = specinfer_plugin::drafter_factory(create);
//     f.train = train;  // a field the ABI added after create
//     return f;
//   }();
//
// The descriptor has no init or deinit, and its get_factory returns kFactory for
// SPECINFER_DRAFTER_FACTORY_ID and NULL for any other id. Everything is a constant expression, so
// the descriptor is filled in before any code of the plugin runs. A plugin with more than one
// factory (kgram: a target and a drafter) or with init/deinit writes its descriptor itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "specinfer_plugin.h"

namespace specinfer_plugin {

// Reports how many of the draft's nodes the drafter expects the target to keep
// (specinfer_draft.expected_accepted), when the host's struct has the field; clamped to the
// draft's node count.
inline void set_expected_accepted(specinfer_draft &out, double expected) {
  if (out.struct_size >=
      offsetof(specinfer_draft, expected_accepted) + sizeof(out.expected_accepted))
    out.expected_accepted = std::clamp(expected, 0.0, static_cast<double>(out.n_nodes));
}

// A drafter factory whose create is `create`: struct_size set, the fields after create NULL.
constexpr specinfer_drafter_factory drafter_factory(
    decltype(specinfer_drafter_factory::create) create) {
  specinfer_drafter_factory f{};
  f.struct_size = sizeof f;
  f.create = create;
  return f;
}

// get_factory of a plugin whose only factory is `Factory`.
template <const specinfer_drafter_factory &Factory>
const void *drafter_get_factory(const char *id) {
  return id && !std::strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) ? &Factory : nullptr;
}

// The descriptor of a plugin whose only factory is `Factory`; no init, no deinit.
template <const specinfer_drafter_factory &Factory>
constexpr specinfer_plugin_descriptor drafter_plugin_descriptor(const char *name,
                                                                const char *version,
                                                                const char *description) {
  return {SPECINFER_PLUGIN_ABI_VERSION,
          sizeof(specinfer_plugin_descriptor),
          name,
          version,
          description,
          nullptr,
          nullptr,
          drafter_get_factory<Factory>};
}

}  // namespace specinfer_plugin
