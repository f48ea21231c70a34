// train/distributed_single.cpp — train/distributed.h without MPI: one rank, collectives that copy
// or do nothing. A process that mpirun started with N > 1 is refused (N copies would each train
// alone and fight over --out).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "train/distributed.h"

namespace mhsa::detail {

Ranks& Ranks::world() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* n = std::getenv(name); n != nullptr && std::string(n) != "1")
      fail("train", "mpirun", "an mhsa built with MPI (CMake finds MPI, or -DMHSA_MPI=ON)",
           message("a build without MPI started as ", n, " processes"));
  static Ranks ranks(0, 1);
  return ranks;
}

void Ranks::start_all_to_all(std::span<const float> send, std::span<const int64_t> send_counts, std::span<float> recv,
                             std::span<const int64_t>) {
  std::copy(send.begin(), send.begin() + send_counts[0], recv.begin());
}
void Ranks::progress() {}
void Ranks::wait_all() {}

void Ranks::all_gather(std::span<float>, std::span<const int64_t>) {}
void Ranks::all_gather(std::span<double>, std::span<const int64_t>) {}
void Ranks::gather(std::span<const float> part, std::span<float> all, std::span<const int64_t>) {
  std::copy(part.begin(), part.end(), all.begin());
}
bool Ranks::broadcast(bool value) { return value; }
std::string Ranks::broadcast(const std::string& value) { return value; }
[[noreturn]] void Ranks::abort(int status) { std::exit(status); }

}  // namespace mhsa::detail
