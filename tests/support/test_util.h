/* Helpers shared by the black-box tests. */
#ifndef SPECINFER_TEST_UTIL_H
#define SPECINFER_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Path of a file below the source tree (SPECINFER_SOURCE_DIR), in a static buffer. */
static inline const char *source_path(const char *rel) {
  static char buf[4096];
  const char *root = getenv("SPECINFER_SOURCE_DIR");
  snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
  return buf;
}

/* "path=<source>/<rel>,<extra>" for the kgram plugin. */
static inline const char *kgram_config(const char *rel, const char *extra) {
  static char buf[4200];
  const char *root = getenv("SPECINFER_SOURCE_DIR");
  snprintf(buf, sizeof buf, "path=%s/%s%s%s", root ? root : ".", rel, extra && *extra ? "," : "",
           extra ? extra : "");
  return buf;
}

#endif
