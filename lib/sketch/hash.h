// Counter-based randomness for the sketchers: every random number is a pure function of
// (key, counter), so a sketch never depends on the order or the thread in which it is computed.
#pragma once

#include <cmath>
#include <cstdint>

#include "../../common/splitmix64.h"

namespace specinfer::sketch {

// The splitmix64 finalizer: a bijection on 64 bits with full avalanche.
inline uint64_t mix64(uint64_t x) {
  return splitmix64_mix(x);
}

// A stream key: one per (seed, purpose), so that different purposes draw independent numbers.
inline uint64_t stream_key(uint64_t seed, uint64_t purpose) {
  return mix64(mix64(seed ^ 0x5eed5eed5eed5eedULL) + purpose * kSplitMix64Gamma);
}

// The counter-th 64-bit word of the stream `key`.
inline uint64_t hash_at(uint64_t key, uint64_t counter) {
  return mix64(key + (counter + 1) * kSplitMix64Gamma);
}

// Uniform in [0, 1) with 53 random bits.
inline double to_unit(uint64_t x) {
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}
// Uniform in (0, 1]: never 0, so logs and divisions are safe.
inline double to_unit_open0(uint64_t x) {
  return static_cast<double>((x >> 11) + 1) * 0x1.0p-53;
}

// A uniform integer in [0, n) for n < 2^32 (multiply-high, no modulo bias worth mentioning).
inline uint32_t to_range(uint64_t x, uint32_t n) {
  return static_cast<uint32_t>(((x >> 32) * static_cast<uint64_t>(n)) >> 32);
}

// A pair of independent standard normals from one counter (Box-Muller on two hashed uniforms).
inline void normal_pair(uint64_t key, uint64_t counter, double *z0, double *z1) {
  const double u1 = to_unit_open0(hash_at(key, 2 * counter));
  const double u2 = to_unit(hash_at(key, 2 * counter + 1));
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 6.283185307179586476925 * u2;
  *z0 = r * std::cos(t);
  *z1 = r * std::sin(t);
}

}  // namespace specinfer::sketch
