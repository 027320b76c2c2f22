// The AVX-512 row kernels (lib/backend/matmul_avx512.cpp) compiled over software intrinsics
// (avx512_emulation.h) as matmul_kernel_avx512_emulated, for test_backend_matmul.
#define SPECINFER_AVX512_EMULATED 1
#include "../../lib/backend/matmul_avx512.cpp"
