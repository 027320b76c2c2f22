#include "util/isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace specinfer {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C (CPUID leaf 1, ECX bit 29), read directly: clang before 16 has no "f16c" for
// __builtin_cpu_supports.
bool has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}
#endif

Isa detect() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
                    __builtin_cpu_supports("bmi2");
  if (!avx2) return Isa::scalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  return avx512 ? Isa::avx512 : Isa::avx2;
#else
  return Isa::scalar;
#endif
}

Isa from_env(Isa best) noexcept {
  const char *s = std::getenv("SPECINFER_ISA");
  if (s == nullptr || *s == '\0') return best;
  Isa want = best;
  if (std::strcmp(s, "scalar") == 0)
    want = Isa::scalar;
  else if (std::strcmp(s, "avx2") == 0)
    want = Isa::avx2;
  else if (std::strcmp(s, "avx512") == 0)
    want = Isa::avx512;
  return static_cast<int>(want) < static_cast<int>(best) ? want : best;
}

// AMD family 19h (base family 0xF plus extended family 0xA) with AVX-512 is Zen 4; Zen 3, the
// other 19h parts, has no AVX-512 and Zen 5 (1Ah) runs 512-bit operations at full width.
bool detect_split() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if (cpu_isa() != Isa::avx512) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  if (std::strcmp(vendor, "AuthenticAMD") != 0 || __get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const unsigned family = ((a >> 8) & 0xF) + ((a >> 20) & 0xFF);
  return family == 0x19;
#else
  return false;
#endif
}

std::atomic<int> g_active{-1};

}  // namespace

Isa cpu_isa() noexcept {
  static const Isa best = detect();
  return best;
}

bool avx512_split() noexcept {
  static const bool split = detect_split();
  return split;
}

bool isa_available(Isa isa) noexcept {
  return static_cast<int>(isa) <= static_cast<int>(cpu_isa());
}

Isa active_isa() noexcept {
  int v = g_active.load(std::memory_order_relaxed);
  if (v < 0) {
    static const Isa env = from_env(cpu_isa());
    v = static_cast<int>(env);
    int expected = -1;
    if (!g_active.compare_exchange_strong(expected, v)) v = expected;
  }
  return static_cast<Isa>(v);
}

Isa set_active_isa(Isa isa) noexcept {
  const Isa prev = active_isa();
  if (!isa_available(isa)) isa = cpu_isa();
  g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
  return prev;
}

const char *isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

}  // namespace specinfer
