/* Helpers shared by the black-box tests written in C against the public ABI. Includes cmocka
 * (through cmocka_setup.h): include this header last. */
#ifndef SPECINFER_TEST_UTIL_H
#define SPECINFER_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specinfer.h"
#include "specinfer_plugin.h"

#include "support/cmocka_setup.h"

/* Path of a file below the source tree (SPECINFER_SOURCE_DIR), in a static buffer. */
static inline const char *source_path(const char *rel) {
  static char buf[4096];
  const char *root = getenv("SPECINFER_SOURCE_DIR");
  snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
  return buf;
}

/* "path=<source>/<rel>,<extra>" for the kgram plugin, in a static buffer. */
static inline const char *kgram_config(const char *rel, const char *extra) {
  static char buf[4200];
  const char *root = getenv("SPECINFER_SOURCE_DIR");
  snprintf(buf, sizeof buf, "path=%s/%s%s%s", root ? root : ".", rel, extra && *extra ? "," : "",
           extra ? extra : "");
  return buf;
}

/* A registry with two threads; fails the test if it cannot be made. */
static inline specinfer_registry *new_registry(void) {
  specinfer_registry *reg = NULL;
  char *err = NULL;
  specinfer_registry_params p;
  specinfer_registry_params_init(&p);
  p.n_threads = 2;
  assert_int_equal(specinfer_registry_create(&p, &reg, &err), SPECINFER_OK);
  assert_null(err);
  assert_non_null(reg);
  return reg;
}

/* A kgram target of order k trained on the file `corpus` (relative to the source tree). */
static inline specinfer_target *open_kgram(specinfer_registry *reg, const char *corpus, int k) {
  char extra[32];
  snprintf(extra, sizeof extra, "k=%d", k);
  specinfer_target *t = NULL;
  char *err = NULL;
  specinfer_status rc = specinfer_target_open(reg, "kgram", kgram_config(corpus, extra), &t, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "open kgram: %s\n", err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  specinfer_free(err);
  return t;
}

/* A drafter opened through the registry; fails the test with the library's message otherwise. */
static inline specinfer_drafter *open_drafter(specinfer_registry *reg, specinfer_target *t,
                                              const char *plugin, const char *config) {
  specinfer_drafter *d = NULL;
  char *err = NULL;
  specinfer_status rc = specinfer_drafter_open(reg, plugin, config, t, &d, &err);
  if (rc != SPECINFER_OK) fprintf(stderr, "open drafter %s: %s\n", plugin, err ? err : "?");
  assert_int_equal(rc, SPECINFER_OK);
  specinfer_free(err);
  return d;
}

/* Defines `static const specinfer_plugin_descriptor PREFIX_plugin`: an in-process drafter plugin
 * named NAME whose factory is CREATE (a specinfer_drafter_factory create function). */
#define TEST_DRAFTER_PLUGIN(PREFIX, NAME, DESCRIPTION, CREATE)                                     \
  static const specinfer_drafter_factory PREFIX##_factory = {sizeof(specinfer_drafter_factory),    \
                                                             CREATE, NULL};                        \
  static const void *PREFIX##_get_factory(const char *id) {                                        \
    return strcmp(id, SPECINFER_DRAFTER_FACTORY_ID) == 0 ? &PREFIX##_factory : NULL;               \
  }                                                                                                \
  static const specinfer_plugin_descriptor PREFIX##_plugin = {SPECINFER_PLUGIN_ABI_VERSION,        \
                                                              sizeof(specinfer_plugin_descriptor), \
                                                              NAME,                                \
                                                              "1",                                 \
                                                              DESCRIPTION,                         \
                                                              NULL,                                \
                                                              NULL,                                \
                                                              PREFIX##_get_factory}

#endif
