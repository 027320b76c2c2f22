// Helpers of the backend kernel tests (C++): the instruction sets this CPU runs, random inputs.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "backend/isa.h"

namespace specinfer_test {

// Every instruction set of the backend this CPU can run, scalar first.
inline std::vector<specinfer::Isa> isas() {
  std::vector<specinfer::Isa> v;
  for (int i = 0; i <= 2; ++i)
    if (specinfer::isa_available(static_cast<specinfer::Isa>(i)))
      v.push_back(static_cast<specinfer::Isa>(i));
  return v;
}

// n normal values of standard deviation sd.
inline std::vector<float> randn(size_t n, std::mt19937 &rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto &x : v) x = nd(rng);
  return v;
}

}  // namespace specinfer_test
