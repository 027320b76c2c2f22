// Philox4x32-10: ten rounds of two 32x32->64 multiplications; the key is bumped by the Weyl
// constants between rounds.
#include "sampling/rng.h"

#include "sampling/rng_bulk.h"
#include "util/isa.h"

#include <algorithm>

namespace specinfer {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t m0 = static_cast<uint64_t>(kMul0) * c[0];
    uint64_t m1 = static_cast<uint64_t>(kMul1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(m0 >> 32), lo0 = static_cast<uint32_t>(m0);
    uint32_t hi1 = static_cast<uint32_t>(m1 >> 32), lo1 = static_cast<uint32_t>(m1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

void CounterRng::blocks(uint32_t first, size_t n, uint32_t *out) const {
  if (n >= 8 && active_isa() != Isa::scalar) {
    philox_blocks_avx2(first, n, stream_, pos_lo_, pos_hi_, key_[0], key_[1], out);
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    std::array<uint32_t, 4> b = block(first + static_cast<uint32_t>(j));
    for (size_t w = 0; w < 4; ++w) out[4 * j + w] = b[w];
  }
}

void CounterRng::uniforms(uint64_t first, size_t n, double *out) const {
  size_t j = 0;
  if (n > 0 && (first & 1)) {
    out[j++] = uniform(first);
  }
  uint64_t idx = first + j;
  constexpr size_t kBatch = 64;  // blocks per batch
  uint32_t words[4 * kBatch];
  while (j + 1 < n) {
    size_t nb = std::min(kBatch, (n - j) / 2);
    blocks(static_cast<uint32_t>(idx >> 1), nb, words);
    for (size_t b = 0; b < nb; ++b) {
      const uint32_t *w = words + 4 * b;
      out[j++] = to_open_unit(static_cast<uint64_t>(w[0]) | (static_cast<uint64_t>(w[1]) << 32));
      out[j++] = to_open_unit(static_cast<uint64_t>(w[2]) | (static_cast<uint64_t>(w[3]) << 32));
    }
    idx += 2 * nb;
  }
  if (j < n) out[j] = uniform(idx);
}

}  // namespace specinfer
