// core/cpu.h — which SIMD instruction set the kernels run with, decided once per process.
//
// Fast kernels are compiled once per ISA, each in its own translation unit and namespace
// (kernels/isa/*.cpp), and picked here by CPUID. MHSA_ISA=portable|avx2|avx512 in the
// environment caps the choice (for tests and benchmarks of the slower paths); it never raises it
// above what the CPU supports. Not a feature-detection library: three levels, nothing else.
//
// Also the bound on OpenMP's thread count: libgomp crashes (SIGSEGV) asked for a team of 100000
// threads and spends minutes starting 20000, so front ends check -t and OMP_NUM_THREADS here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mhsa::cpu {

enum class Isa { portable = 0, avx2 = 1, avx512 = 2 };

Isa best_isa();                  // the ISA the dispatching entry points use
std::vector<Isa> usable_isas();  // every ISA this CPU and this build can run, lowest first
std::string_view isa_name(Isa isa);

// Whether the AVX-512 kernels may use AVX512_BF16's dot product (vdpbf16ps) for GEMMs over
// bfloat16 weights, which round the activations to bfloat16 (kernels/dispatch.h:
// gemm_bt_bf16_dot): the CPU has it, this is an x86 build, the kernels are AVX-512's (not capped
// by MHSA_ISA=avx2 or portable), and MHSA_BF16_DOT=0 is not set. Not an ISA level: the AVX-512
// table carries the kernels as extra entries.
bool bf16_dot();

// Whether an ISA's kernel table takes the Q8_0 streams built with its VNNI extension's vpdpbusd
// (kernels/matmul_q8_0.cpp: namespace avx512vnni with AVX512_VNNI, avx2vnni with AVX-VNNI; the
// same bits, fewer instructions): this is an x86 build (for AVX-VNNI, by a compiler that has it),
// the ISA is usable (isa <= best_isa()), the CPU has the extension, and MHSA_VNNI=0 is not set.
bool vnni(Isa isa);

// The most threads mhsa lets OpenMP run: 16 × the processors this process may use, at most 1024.
int max_threads();

// When OpenMP would start more than max_threads() threads (OMP_NUM_THREADS=100000), lowers the
// calling thread's count to max_threads() and returns a warning that says so; else returns "".
// Front ends (the CLI's main, the Python module's import) call it before the first parallel
// region. OpenMP keeps the count per thread: a thread started elsewhere keeps the environment's.
std::string limit_threads();

}  // namespace mhsa::cpu
