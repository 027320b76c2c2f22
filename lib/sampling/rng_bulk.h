// Many Philox blocks at once (internal to lib/sampling; CounterRng::blocks is the entry point).
#pragma once

#include <cstddef>
#include <cstdint>

#include "sampling/rng.h"

namespace specinfer {

// Blocks first_block .. first_block + n_blocks - 1 of counter (·, c1, c2, c3) and key (k0, k1),
// four words each, into out[4 * n_blocks]. Same values as philox4x32_10().
void philox_blocks_avx2(uint32_t first_block, size_t n_blocks, uint32_t c1, uint32_t c2,
                        uint32_t c3, uint32_t k0, uint32_t k1, uint32_t *out);

}  // namespace specinfer
