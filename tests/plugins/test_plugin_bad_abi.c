/* A plugin that claims a future plugin ABI version: the loader must refuse it with a message. */
#include <stddef.h>

#include "specinfer_plugin.h"

static const void *get_factory(const char *id) {
  (void)id;
  return NULL;
}

SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    99u,
    sizeof(specinfer_plugin_descriptor),
    "bad-abi",
    "0",
    "built for plugin ABI 99",
    NULL,
    NULL,
    get_factory};
