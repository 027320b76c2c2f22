/* The real models the end-to-end tests use (scripts/fetch-models puts them there); for C and C++
 * tests. A test whose model is absent skips with a message. */
#ifndef SPECINFER_TEST_MODELS_H
#define SPECINFER_TEST_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* The model directory: $SPECINFER_MODELS when set and not empty, else
 * ~/.cache/specinfer/models. In a static buffer. */
static inline const char *models_dir(void) {
  static char buf[4096];
  const char *dir = getenv("SPECINFER_MODELS");
  const char *home = getenv("HOME");
  if (dir && *dir)
    snprintf(buf, sizeof buf, "%s", dir);
  else
    snprintf(buf, sizeof buf, "%s/.cache/specinfer/models", home ? home : ".");
  return buf;
}

static inline int is_regular_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Writes the path of model file `name` (e.g. "qwen2.5-coder-0.5b.gguf") to buf; returns 1 when it
 * fits and is a regular file. */
static inline int model_path(const char *name, char *buf, size_t cap) {
  const int n = snprintf(buf, cap, "%s/%s", models_dir(), name);
  return n > 0 && (size_t)n < cap && is_regular_file(buf);
}

#endif
