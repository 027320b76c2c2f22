#include "shim.h"

#include <string.h>

#include "_cgo_export.h"

static int si_go_on_tokens(void *user, const int32_t *tokens, size_t n_tokens, const char *text,
                           size_t text_len) {
  return goSpecinferOnTokens((uintptr_t)user, (int32_t *)tokens, n_tokens, (char *)text, text_len);
}

specinfer_status si_go_generate(specinfer_session *s, int32_t max_tokens, uintptr_t handle) {
  return specinfer_session_generate(s, max_tokens, si_go_on_tokens, (void *)handle);
}

static int si_go_on_train_progress(void *user, const specinfer_train_progress *progress) {
  return goSpecinferTrainProgress((uintptr_t)user, (specinfer_train_progress *)progress);
}

specinfer_status si_go_drafter_train(specinfer_registry *registry, const char *plugin,
                                     specinfer_target *target, specinfer_train_params *params,
                                     uintptr_t handle, char **errmsg) {
  if (params && handle) {
    params->progress = si_go_on_train_progress;
    params->user = (void *)handle;
  }
  return specinfer_drafter_train(registry, plugin, target, params, errmsg);
}

int32_t si_go_sample(const specinfer_draft_request *req, const float *q, int32_t vocab,
                     int64_t position) {
  if (!req->sample) return -1;
  return req->sample(req->sample_ctx, q, vocab, position);
}

void si_go_set_error(specinfer_plugin_error *err, const char *msg) {
  if (!err) return;
  strncpy(err->message, msg, sizeof err->message - 1);
  err->message[sizeof err->message - 1] = '\0';
}

/* ---- drafter instances: self points at the instance's cgo.Handle ---- */

typedef struct si_go_instance {
  uintptr_t handle;
} si_go_instance;

static void inst_destroy(void *self) {
  si_go_instance *inst = self;
  goSpecinferDrafterDestroy(inst->handle);
  free(inst);
}

static specinfer_status inst_begin(void *self, const int32_t *context, size_t n,
                                   specinfer_plugin_error *err) {
  return (specinfer_status)goSpecinferDrafterBegin(((si_go_instance *)self)->handle,
                                                   (int32_t *)context, n, err);
}

static specinfer_status inst_propose(void *self, const specinfer_draft_request *req,
                                     specinfer_draft *out, specinfer_plugin_error *err) {
  return (specinfer_status)goSpecinferDrafterPropose(((si_go_instance *)self)->handle,
                                                     (specinfer_draft_request *)req, out, err);
}

static specinfer_status inst_commit(void *self, const int32_t *tokens, size_t n,
                                    specinfer_plugin_error *err) {
  return (specinfer_status)goSpecinferDrafterCommit(((si_go_instance *)self)->handle,
                                                    (int32_t *)tokens, n, err);
}

static const specinfer_drafter_vtable si_go_vtable = {
    sizeof(specinfer_drafter_vtable), inst_destroy, inst_begin, inst_propose, inst_commit, NULL};

static specinfer_status si_go_create(int slot, const char *config, const specinfer_model_info *info,
                                     void **self, const specinfer_drafter_vtable **vt,
                                     specinfer_plugin_error *err) {
  si_go_instance *inst = malloc(sizeof *inst);
  if (!inst) {
    si_go_set_error(err, "out of memory");
    return SPECINFER_ERR_OUT_OF_MEMORY;
  }
  uintptr_t handle = 0;
  int st =
      goSpecinferDrafterCreate(slot, (char *)config, (specinfer_model_info *)info, &handle, err);
  if (st != SPECINFER_OK) {
    free(inst);
    return (specinfer_status)st;
  }
  inst->handle = handle;
  *self = inst;
  *vt = &si_go_vtable;
  return SPECINFER_OK;
}

/* Slot N's create, factory and get_factory. The factory's train is NULL: a drafter written in Go
 * has no weights to train (specinfer_drafter_train says so). */
#define SI_GO_SLOT(N)                                                                        \
  static specinfer_status create_##N(                                                        \
      const specinfer_host *host, const char *config, const specinfer_model_info *info,      \
      const specinfer_host_target *target, void **self, const specinfer_drafter_vtable **vt, \
      specinfer_plugin_error *err) {                                                         \
    (void)host;                                                                              \
    (void)target;                                                                            \
    return si_go_create(N, config, info, self, vt, err);                                     \
  }                                                                                          \
  static const specinfer_drafter_factory factory_##N = {sizeof(specinfer_drafter_factory),   \
                                                        create_##N, NULL};                   \
  static const void *get_factory_##N(const char *id) {                                       \
    return id && strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) == 0 ? &factory_##N : NULL;        \
  }

// clang-format off
SI_GO_SLOT(0)
SI_GO_SLOT(1)
SI_GO_SLOT(2)
SI_GO_SLOT(3)
SI_GO_SLOT(4)
SI_GO_SLOT(5)
SI_GO_SLOT(6)
SI_GO_SLOT(7)
SI_GO_SLOT(8)
SI_GO_SLOT(9)
SI_GO_SLOT(10)
SI_GO_SLOT(11)
SI_GO_SLOT(12)
SI_GO_SLOT(13)
SI_GO_SLOT(14)
SI_GO_SLOT(15)
SI_GO_SLOT(16)
SI_GO_SLOT(17)
SI_GO_SLOT(18)
SI_GO_SLOT(19)
SI_GO_SLOT(20)
SI_GO_SLOT(21)
SI_GO_SLOT(22)
SI_GO_SLOT(23)
SI_GO_SLOT(24)
SI_GO_SLOT(25)
SI_GO_SLOT(26)
SI_GO_SLOT(27)
SI_GO_SLOT(28)
SI_GO_SLOT(29)
SI_GO_SLOT(30)
SI_GO_SLOT(31)
// clang-format on

typedef const void *(*si_get_factory_fn)(const char *);
static const si_get_factory_fn get_factories[SI_GO_SLOTS] = {
    get_factory_0,  get_factory_1,  get_factory_2,  get_factory_3,  get_factory_4,  get_factory_5,
    get_factory_6,  get_factory_7,  get_factory_8,  get_factory_9,  get_factory_10, get_factory_11,
    get_factory_12, get_factory_13, get_factory_14, get_factory_15, get_factory_16, get_factory_17,
    get_factory_18, get_factory_19, get_factory_20, get_factory_21, get_factory_22, get_factory_23,
    get_factory_24, get_factory_25, get_factory_26, get_factory_27, get_factory_28, get_factory_29,
    get_factory_30, get_factory_31};

static char *dup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

specinfer_plugin_descriptor *si_go_descriptor(int slot, const char *name, const char *version,
                                              const char *description) {
  if (slot < 0 || slot >= SI_GO_SLOTS) return NULL;
  specinfer_plugin_descriptor *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->abi_version = SPECINFER_PLUGIN_ABI_VERSION;
  d->struct_size = sizeof *d;
  d->name = dup(name);
  d->version = dup(version);
  d->description = dup(description);
  d->get_factory = get_factories[slot];
  if (!d->name || !d->version || !d->description) {
    si_go_free_descriptor(d);
    return NULL;
  }
  return d;
}

void si_go_free_descriptor(specinfer_plugin_descriptor *d) {
  if (!d) return;
  free((void *)d->name);
  free((void *)d->version);
  free((void *)d->description);
  free(d);
}
