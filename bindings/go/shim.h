/* C side of the Go bindings: trampolines from the library's callbacks into exported Go
 * functions. The plugin ABI passes no user pointer to get_factory or to a factory's create, so
 * each in-process Go drafter takes one of SI_GO_SLOTS slots with its own entry points. */
#ifndef SPECINFER_GO_SHIM_H
#define SPECINFER_GO_SHIM_H

#include <stdint.h>
#include <stdlib.h>

#include <specinfer.h>
#include <specinfer_plugin.h>

#define SI_GO_SLOTS 32

/* session_generate with a Go callback identified by a runtime/cgo.Handle. */
specinfer_status si_go_generate(specinfer_session *s, int32_t max_tokens, uintptr_t handle);

/* A descriptor for slot `slot` (malloc'd; free with si_go_free_descriptor). Strings are copied. */
specinfer_plugin_descriptor *si_go_descriptor(int slot, const char *name, const char *version,
                                              const char *description);
void si_go_free_descriptor(specinfer_plugin_descriptor *d);

/* Calls the coupler's draft-side sampler of a draft request. */
int32_t si_go_sample(const specinfer_draft_request *req, const float *q, int32_t vocab,
                     int64_t position);

/* drafter_train reporting progress to a Go callback identified by a runtime/cgo.Handle (0: no
 * callback); sets params->progress and params->user. */
specinfer_status si_go_drafter_train(specinfer_registry *registry, const char *plugin,
                                     specinfer_target *target, specinfer_train_params *params,
                                     uintptr_t handle, char **errmsg);

/* Copies a NUL-terminated message into a plugin error buffer. */
void si_go_set_error(specinfer_plugin_error *err, const char *msg);

#endif
