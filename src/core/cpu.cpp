// core/cpu.cpp — CPUID-based ISA choice (see cpu.h).
#include "core/cpu.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "mhsa/error.h"

namespace mhsa::cpu {
namespace {

Isa hardware_isa() {
#if defined(__x86_64__) && defined(MHSA_HAVE_X86_KERNELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::portable;
}

Isa capped(Isa hw) {
  const char* env = std::getenv("MHSA_ISA");
  if (!env) return hw;
  const std::string want(env);
  const Isa cap = want == "portable" ? Isa::portable : want == "avx2" ? Isa::avx2 : Isa::avx512;
  return static_cast<int>(cap) < static_cast<int>(hw) ? cap : hw;
}

}  // namespace

Isa best_isa() {
  static const Isa isa = capped(hardware_isa());
  return isa;
}

std::vector<Isa> usable_isas() {
  std::vector<Isa> all;
  for (int i = 0; i <= static_cast<int>(hardware_isa()); ++i) all.push_back(static_cast<Isa>(i));
  return all;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "portable";
  }
}

bool bf16_dot() {
  static const bool yes = [] {
#if defined(__x86_64__) && defined(MHSA_HAVE_X86_KERNELS)
    const char* env = std::getenv("MHSA_BF16_DOT");
    if (env && std::string(env) == "0") return false;
    return best_isa() == Isa::avx512 && __builtin_cpu_supports("avx512bf16");  // MHSA_ISA=avx2 turns it off
#else
    return false;
#endif
  }();
  return yes;
}

bool vnni(Isa isa) {
#if defined(__x86_64__) && defined(MHSA_HAVE_X86_KERNELS)
  static const bool off = [] {
    const char* env = std::getenv("MHSA_VNNI");
    return env && std::string(env) == "0";
  }();
  if (off || isa > best_isa()) return false;
  __builtin_cpu_init();
  if (isa == Isa::avx512) return __builtin_cpu_supports("avx512vnni");
#if defined(MHSA_HAVE_AVX2VNNI)  // (the compiler built the AVX-VNNI variant)
  if (isa == Isa::avx2) return __builtin_cpu_supports("avxvnni");
#endif
#endif
  (void)isa;
  return false;
}

int max_threads() { return std::min(1024, 16 * std::max(1, omp_get_num_procs())); }

std::string limit_threads() {
  const int asked = omp_get_max_threads(), most = max_threads();
  if (asked <= most) return "";
  omp_set_num_threads(most);
  const char* env = std::getenv("OMP_NUM_THREADS");
  return detail::message(env ? "OMP_NUM_THREADS=" + std::string(env).substr(0, 40) : std::to_string(asked) + " threads",
                         ": more threads than mhsa runs (16 \u00d7 the ", omp_get_num_procs(),
                         " processors, 1024 at most); using ", most);
}

}  // namespace mhsa::cpu
