// splitmix64: the fixed 64-bit generator and mixer that specinfer uses wherever it needs
// reproducible numbers that are the same on every platform (training plans and shuffles,
// synthetic data, sampled positions, sketch hashing). Header-only and built on nothing, so that
// the core (lib/), the plugins, the tools and the tests all include it.
#pragma once

#include <cstdint>

namespace specinfer {

// The golden-ratio increment of the generator's state.
constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// The finalizer: a bijection on 64 bits with full avalanche.
inline uint64_t splitmix64_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One step of the generator: advances `state` and returns the next number.
inline uint64_t splitmix64_next(uint64_t &state) {
  state += kSplitMix64Gamma;
  return splitmix64_mix(state);
}

// The number that follows `x` as a state: a well-spread function of x.
inline uint64_t splitmix64(uint64_t x) {
  return splitmix64_next(x);
}

// A generator object, for code that draws many numbers.
struct SplitMix64 {
  uint64_t state = 0;
  uint64_t next() { return splitmix64_next(state); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) (modulo; n = 0 gives 0).
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};

}  // namespace specinfer
