/*
 * A drafter plugin for the bindings' tests of specinfer_drafter_train. The Rust, Go and Python
 * tests compile it with the system C compiler (cc -shared -fPIC -I<specinfer includedir>) and
 * load it with the registry's load_plugin, so that their training calls and progress callbacks
 * are exercised end to end without a real trainer.
 *
 * "train-probe" drafts nothing (opening it fails UNSUPPORTED). Its train function:
 *  - reports progress, in order:
 *      "collect"  done 0, 1, 2 of total 2, loss NaN, no accuracy
 *      "train"    done 1, 2 of total 2, loss 2.5 then 1.5, no accuracy
 *      "evaluate" done 1 of total 1, loss 1.5, accuracy {0.5, 0.25} (n_heads 2)
 *    and stops with SPECINFER_ERR_CANCELLED, "train-probe: cancelled during <stage> <done>",
 *    as soon as the callback returns nonzero;
 *  - with config "fail=1" fails SPECINFER_ERR_CONFIG, "train-probe: asked to fail", first;
 *  - then writes to out_path what it was given, one item a line:
 *      config=<config, or (null)>
 *      corpus=<n_corpus>
 *      <each corpus path>
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "specinfer_plugin.h"

static void set_error(specinfer_plugin_error *err, const char *stage, int64_t done) {
  if (!err) return;
  if (stage)
    snprintf(err->message, sizeof err->message, "train-probe: cancelled during %s %lld", stage,
             (long long)done);
  else
    snprintf(err->message, sizeof err->message, "train-probe: asked to fail");
}

/* Reports one step; nonzero when the callback asks to stop. */
static int report(const specinfer_train_params *params, const char *stage, int64_t done,
                  int64_t total, double loss, int32_t n_heads, const float *accuracy) {
  if (!params->progress) return 0;
  specinfer_train_progress p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.stage = stage;
  p.done = done;
  p.total = total;
  p.loss = loss;
  p.n_heads = n_heads;
  p.accuracy = accuracy;
  return params->progress(params->user, &p);
}

static specinfer_status probe_train(const specinfer_host *host,
                                    const specinfer_train_params *params,
                                    const specinfer_model_info *target_info,
                                    const specinfer_host_target *target,
                                    specinfer_plugin_error *err) {
  (void)host, (void)target_info, (void)target;
  if (params->config && strcmp(params->config, "fail=1") == 0) {
    set_error(err, NULL, 0);
    return SPECINFER_ERR_CONFIG;
  }
  static const float accuracy[2] = {0.5f, 0.25f};
  static const struct {
    const char *stage;
    int64_t done, total;
    double loss;
    int32_t n_heads;
  } steps[] = {
      {"collect", 0, 2, NAN, 0}, {"collect", 1, 2, NAN, 0}, {"collect", 2, 2, NAN, 0},
      {"train", 1, 2, 2.5, 0},   {"train", 2, 2, 1.5, 0},   {"evaluate", 1, 1, 1.5, 2},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i) {
    if (report(params, steps[i].stage, steps[i].done, steps[i].total, steps[i].loss,
               steps[i].n_heads, steps[i].n_heads ? accuracy : NULL)) {
      set_error(err, steps[i].stage, steps[i].done);
      return SPECINFER_ERR_CANCELLED;
    }
  }
  FILE *f = fopen(params->out_path, "w");
  if (!f) {
    snprintf(err->message, sizeof err->message, "train-probe: cannot write '%s'", params->out_path);
    return SPECINFER_ERR_IO;
  }
  fprintf(f, "config=%s\ncorpus=%d\n", params->config ? params->config : "(null)",
          (int)params->n_corpus);
  for (int32_t i = 0; i < params->n_corpus; ++i) fprintf(f, "%s\n", params->corpus[i]);
  fclose(f);
  return SPECINFER_OK;
}

static specinfer_status probe_create(const specinfer_host *host, const char *config,
                                     const specinfer_model_info *target_info,
                                     const specinfer_host_target *target, void **self,
                                     const specinfer_drafter_vtable **vtable,
                                     specinfer_plugin_error *err) {
  (void)host, (void)config, (void)target_info, (void)target, (void)self, (void)vtable;
  snprintf(err->message, sizeof err->message, "train-probe drafts nothing");
  return SPECINFER_ERR_UNSUPPORTED;
}

static const specinfer_drafter_factory probe_factory = {sizeof(specinfer_drafter_factory),
                                                        probe_create, probe_train};

static const void *probe_get_factory(const char *id) {
  return id && strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) == 0 ? &probe_factory : NULL;
}

SPECINFER_PLUGIN_EXPORT const specinfer_plugin_descriptor specinfer_plugin_entry = {
    SPECINFER_PLUGIN_ABI_VERSION,
    sizeof(specinfer_plugin_descriptor),
    "train-probe",
    "1.0",
    "tests of training through the bindings",
    NULL,
    NULL,
    probe_get_factory};
