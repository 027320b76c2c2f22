// Test-only fault injection: the places where specinfer's own code asks the system for memory
// or reads a file, and that do not go through C++'s operator new, ask fault_injected() first and
// fail as if the system had refused when it says so.
//
// The switch is a function, specinfer_fault_point, that no part of specinfer defines: a test
// executable defines it (with its own operator new counting the same calls, see
// tests/test_fault_injection.cpp) and exports it, and the library and the plugins it loads find
// it through the weak reference below. In any other process the reference is null and each site
// costs one test of a pointer. Header-only and built on nothing, so that the core (lib/) and the
// built-in plugins (plugins/) both include it, as common/status_error.h.
#pragma once

// Returns nonzero when the call at this site is to fail. `kind` is a FaultKind.
extern "C" __attribute__((weak, visibility("default"))) int specinfer_fault_point(int kind);

namespace specinfer {

enum FaultKind : int {
  FAULT_ALLOC = 0,  // memory: the host's alloc, PageBuffer's mmap, packed weights, error strings
  FAULT_READ = 1,   // files: open, stat, map or read
};

// True when a test has armed a failure for this call. Never true outside such a test.
inline bool fault_injected(FaultKind kind) {
  return specinfer_fault_point != nullptr && specinfer_fault_point(kind) != 0;
}

}  // namespace specinfer
