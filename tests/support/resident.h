/* Resident memory of the test process, for the tests that check what loading and sharing cost. */
#ifndef SPECINFER_TEST_RESIDENT_H
#define SPECINFER_TEST_RESIDENT_H

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes resident now (VmRSS of /proc/self/status); 0 if unknown. */
static inline long long resident_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kib = atoll(line + 6);
  fclose(f);
  return kib * 1024;
}

/* Bytes the process has allocated with malloc and friends and not freed (every arena, and the
 * blocks malloc maps on its own). Unlike resident memory it does not depend on whether freed
 * memory was given back to the system. 0 under sanitizers, whose allocators glibc does not see. */
static inline long long allocated_bytes(void) {
  const struct mallinfo2 m = mallinfo2();
  return (long long)(m.uordblks + m.hblkhd);
}

#endif
