// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11).
//
// A random value is a pure function of (seed, position, stream, index): no state is carried from
// one call to the next, so the randomness used for sequence position t is the same whoever asks
// for it (drafter or target, this round or the next), in whatever order, on however many threads.
//
// Counter layout: word 0 = index / 2 (two 64-bit values per block), word 1 = stream,
// words 2-3 = position (low, high); key = seed (low, high).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace specinfer {

// One Philox4x32-10 block.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// What a random value is used for. Different uses at the same position never share values.
enum class RngStream : uint32_t {
  kDraft = 1,     // a drafter sampling from q (rejection, lenient, typical couplers)
  kAccept = 2,    // acceptance uniforms (index = which child of a tree node is tested)
  kResidual = 3,  // sampling the residual distribution after a rejection
  kSample = 4,    // plain sampling from p (bonus token, k = 0 decoding)
  kGumbel = 5,    // the shared uniforms u_i of the Gumbel coupler (index = token id)
  kMinHash = 16,  // the shared darts of the MinHash coupler: stream kMinHash + step, index = token
};

class CounterRng {
 public:
  CounterRng(uint64_t seed, int64_t position, uint32_t stream)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        pos_lo_(static_cast<uint32_t>(static_cast<uint64_t>(position))),
        pos_hi_(static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32)),
        stream_(stream) {}
  CounterRng(uint64_t seed, int64_t position, RngStream stream)
      : CounterRng(seed, position, static_cast<uint32_t>(stream)) {}

  // The 128 random bits of block `block` (values 2*block and 2*block + 1).
  std::array<uint32_t, 4> block(uint32_t block) const {
    return philox4x32_10({block, stream_, pos_lo_, pos_hi_}, key_);
  }
  // Random 64-bit value number `index` (index < 2^33).
  uint64_t bits(uint64_t index) const {
    std::array<uint32_t, 4> b = block(static_cast<uint32_t>(index >> 1));
    size_t o = (index & 1) * 2;
    return static_cast<uint64_t>(b[o]) | (static_cast<uint64_t>(b[o + 1]) << 32);
  }
  // Uniform double in the open interval (0, 1), 53 bits: never 0, never 1.
  double uniform(uint64_t index) const { return to_open_unit(bits(index)); }
  // Uniforms number first .. first + n - 1 (same values as uniform(first + j)). Uses the AVX2
  // generator when the backend's active instruction set allows it.
  void uniforms(uint64_t first, size_t n, double *out) const;
  // Blocks first .. first + n - 1 into out[4 * n] (same values as block(first + j)).
  void blocks(uint32_t first, size_t n, uint32_t *out) const;

  static double to_open_unit(uint64_t bits) {
    return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
  }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t pos_lo_, pos_hi_, stream_;
};

}  // namespace specinfer
