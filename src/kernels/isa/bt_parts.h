// kernels/isa/bt_parts.h — how the B·Aᵀ streams (matmul_bt.cpp, matmul_q4_k.cpp) share a list of
// parts (matrices streamed against the same rows of A) among the threads. Included by per-ISA
// sources after kernels/isa/simd.h; not a kernel itself.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace mhsa::kernels::MHSA_ISA {

inline constexpr int kRows = 4;   // rows of A per pass over a group of B rows
inline constexpr int kGroup = 4;  // rows of B per group: the unit the threads split
inline constexpr int64_t kParallel = int64_t{1} << 15;  // below this many multiply-adds per A row: one thread
inline constexpr int64_t kMinClaim = 4;                  // groups: the smallest range a thread claims

// Every part's rows in groups of kGroup (a part's last group may be short) form one row space of
// groups, which the threads share in one of two ways:
// - even (one row of A: a decode step of one sequence): thread t takes the t-th of `threads`
//   equal contiguous ranges. range() reads a range as four streams side by side, and every range
//   more is four streams more to start from memory: SmolLM2's Q8_0 projections (0.1–1.9 MB)
//   read 1.2–1.3× faster split evenly than claimed (docs/performance-history.md,
//   "Decode streams split evenly; Q8_0 on VNNI").
// - claimed (several rows of A, where a group is read again from L1 for each pass over A's rows):
//   the threads claim contiguous ranges from the front, each claim a fraction of what is left
//   (1/(2·threads) of it, at least kMinClaim groups): a thread's first range is a long sequential
//   stream, and the short ones at the end let a thread that streamed faster take more.
// Which thread computes a row does not change its bits. range(part, n0, n) computes rows
// [n0, n0 + n) of a part.
template <class Part, class Range>
inline void parts_product(int64_t K, const Part* parts, int count, bool even, Range range) {
  int64_t groups = 0, total_rows = 0;
  for (int p = 0; p < count; ++p) {
    groups += (parts[p].N + kGroup - 1) / kGroup;
    total_rows += parts[p].N;
  }
  // rows of the groups [g0, g1) of the row space, part by part
  const auto run = [&](int64_t g0, int64_t g1) {
    int64_t first = 0;  // the part's first group
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
  };
  if (total_rows * K < kParallel || omp_get_max_threads() == 1 || omp_in_parallel()) {
    run(0, groups);
    return;
  }
  if (even) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t share = (groups + threads - 1) / threads;
      run(std::min(groups, t * share), std::min(groups, (t + 1) * share));
    }
    return;
  }
  std::atomic<int64_t> next{0};
#pragma omp parallel
  {
    const int64_t divisor = 2 * static_cast<int64_t>(omp_get_num_threads());
    int64_t g0 = next.load(std::memory_order_relaxed);
    while (g0 < groups) {
      const int64_t g1 = std::min(groups, g0 + std::max(kMinClaim, (groups - g0) / divisor));
      if (next.compare_exchange_weak(g0, g1, std::memory_order_relaxed)) {
        run(g0, g1);
        g0 = next.load(std::memory_order_relaxed);
      }
    }
  }
}

// The rows [0, rows) of a range of B against M rows of A, for the integer-dot streams (Q8_0,
// Q4_K): with one row of A, kStreams rows of B at a time, row i of each kStreams-th part of the
// range side by side (each its own ascending stream), the rows past the parts one at a time; with
// more, each group of kGroup rows in turn against kRows rows of A at a time (the group stays in L1
// while the passes over A's rows read it again). dot(R, J, m, n, apart) computes rows m to
// m + R − 1 of A against rows n, n + apart, ..., of B (J of them); R and J are
// std::integral_constant<int, ...>.
template <int kStreams, class Dot>
inline void stream_rows(int64_t M, int64_t rows, Dot dot) {
  using One = std::integral_constant<int, 1>;
  if (M == 1) {
    const int64_t part = rows / kStreams;
    for (int64_t n = 0; n < part; ++n) dot(One{}, std::integral_constant<int, kStreams>{}, 0, n, part);
    for (int64_t n = kStreams * part; n < rows; ++n) dot(One{}, One{}, 0, n, 0);
    return;
  }
  for (int64_t n0 = 0; n0 < rows; n0 += kGroup)
    for (int64_t m = 0; m < M; m += kRows)
      for (int64_t n = n0; n < std::min<int64_t>(rows, n0 + kGroup); ++n) switch (std::min<int64_t>(kRows, M - m)) {
          case 4: dot(std::integral_constant<int, 4>{}, One{}, m, n, 0); break;
          case 3: dot(std::integral_constant<int, 3>{}, One{}, m, n, 0); break;
          case 2: dot(std::integral_constant<int, 2>{}, One{}, m, n, 0); break;
          default: dot(One{}, One{}, m, n, 0); break;
        }
}

}  // namespace mhsa::kernels::MHSA_ISA
