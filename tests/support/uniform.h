// A fixed pseudo-random sequence for tests that simulate acceptance (C++, header-only).
#pragma once

#include <cstdint>

// Uniform in [0, 1), from a linear congruential generator seeded with `state`.
struct Uniform {
  uint32_t state;
  double operator()() {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) / 16777216.0;
  }
};
