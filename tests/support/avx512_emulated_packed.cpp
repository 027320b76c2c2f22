// The AVX-512 packed-weight kernels (lib/backend/packed_avx512.cpp) compiled over software
// intrinsics (avx512_emulation.h) as q4k_x8_rows_avx512_emulated, q40_x4_rows_avx512_emulated and
// q6k_x16_rows_avx512_emulated, for test_backend_packed.
#define SPECINFER_AVX512_EMULATED 1
#include "../../lib/backend/packed_avx512.cpp"
