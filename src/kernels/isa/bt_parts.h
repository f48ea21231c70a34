// kernels/isa/bt_parts.h — how the B·Aᵀ streams (matmul_bt.cpp, matmul_q4_k.cpp) share a list of
// parts (matrices streamed against the same rows of A) among the threads. Included by per-ISA
// sources after kernels/isa/simd.h; not a kernel itself.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace mhsa::kernels::MHSA_ISA {

inline constexpr int kRows = 4;   // rows of A per pass over a group of B rows
inline constexpr int kGroup = 4;  // rows of B per group: the unit the threads split
inline constexpr int64_t kParallel = int64_t{1} << 15;  // below this many multiply-adds per A row: one thread

// Every part's rows in groups of kGroup (a part's last group may be short), split evenly across
// the threads, each thread one contiguous range of groups; range(part, n0, n) computes rows
// [n0, n0 + n) of a part.
template <class Part, class Range>
inline void parts_product(int64_t K, const Part* parts, int count, Range range) {
  int64_t groups = 0, total_rows = 0;
  for (int p = 0; p < count; ++p) {
    groups += (parts[p].N + kGroup - 1) / kGroup;
    total_rows += parts[p].N;
  }
#pragma omp parallel if (total_rows * K >= kParallel)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t g0 = groups * t / threads, g1 = groups * (t + 1) / threads;  // this thread's groups
    int64_t first = 0;                                                          // the part's first group
    for (int p = 0; p < count && first < g1; ++p) {
      const Part& part = parts[p];
      const int64_t part_groups = (part.N + kGroup - 1) / kGroup;
      const int64_t lo = std::max(g0, first) - first, hi = std::min(g1, first + part_groups) - first;
      if (lo < hi) {
        const int64_t n0 = lo * kGroup, n1 = std::min(part.N, hi * kGroup);
        range(part, n0, n1 - n0);
      }
      first += part_groups;
    }
  }
}

}  // namespace mhsa::kernels::MHSA_ISA
