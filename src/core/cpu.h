// core/cpu.h — which SIMD instruction set the kernels run with, decided once per process.
//
// Fast kernels are compiled once per ISA, each in its own translation unit and namespace
// (kernels/isa/*.cpp), and picked here by CPUID. MHSA_ISA=portable|avx2|avx512 in the
// environment caps the choice (for tests and benchmarks of the slower paths); it never raises it
// above what the CPU supports. Not a feature-detection library: three levels, nothing else.
#pragma once

#include <string_view>
#include <vector>

namespace mhsa::cpu {

enum class Isa { portable = 0, avx2 = 1, avx512 = 2 };

Isa best_isa();                  // the ISA the dispatching entry points use
std::vector<Isa> usable_isas();  // every ISA this CPU and this build can run, lowest first
std::string_view isa_name(Isa isa);

}  // namespace mhsa::cpu
