// The instruction sets the library has kernels for (the backend's, the sketchers'), and the one
// choice of which to use.
#pragma once

namespace specinfer {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

// The best set this CPU supports (checked once with __builtin_cpu_supports). avx2 needs
// AVX2 + FMA + F16C + BMI2; avx512 additionally AVX-512 F/BW/VL/DQ/VNNI.
Isa cpu_isa() noexcept;
// True if the CPU can run kernels of `isa`.
bool isa_available(Isa isa) noexcept;
// The set the kernels dispatch to: cpu_isa() capped by the environment variable SPECINFER_ISA
// (scalar | avx2 | avx512; read once), or the override below.
Isa active_isa() noexcept;
// Makes every kernel use `isa` (capped at cpu_isa()) until called again; returns the previous
// active set. For tests and benchmarks; not meant to race with running kernels.
Isa set_active_isa(Isa isa) noexcept;
// True when the CPU runs AVX-512 and executes 512-bit operations as two 256-bit halves (AMD
// family 19h: Zen 4), where some of the AVX-512 kernels run faster on 256-bit registers
// (packed_kernels in lib/backend/packed.cpp). Read once from CPUID.
bool avx512_split() noexcept;
// "scalar", "avx2", "avx512".
const char *isa_name(Isa isa) noexcept;

}  // namespace specinfer
