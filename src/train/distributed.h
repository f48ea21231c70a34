// train/distributed.h — the ranks of a data-parallel training run (`mpirun -np N mhsa train`):
// which rank this process is, and the few collectives the trainer needs, on plain buffers. Built
// over MPI (distributed_mpi.cpp) when CMake finds it (MHSA_MPI), else as a single rank
// (distributed_single.cpp) with the same interface. The collectives only move data: every sum is
// the caller's, in its own fixed order (train/gradient_tree.h), so results do not depend on how
// an MPI library orders its arithmetic. Not public; not the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mhsa::detail {

class Ranks {
 public:
  // This process's ranks. A process started by mpirun (Open MPI's or a PMI launcher's
  // environment) starts MPI here on first use and finalizes it at exit; any other process is
  // rank 0 of 1. Throws mhsa::Error from a build without MPI started by mpirun with N > 1 (each
  // process would train alone).
  static Ranks& world();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Starts sending send_counts[q] floats (consecutive in send, in rank order) to each rank q and
  // receiving recv_counts[q] floats from each rank q into recv (in rank order), and returns at
  // once (MPI_Ialltoallv; counts checked < 2^31): send and recv must stay as they are until
  // wait_all(). Every rank starts its all-to-alls in the same order. One rank: a copy.
  void start_all_to_all(std::span<const float> send, std::span<const int64_t> send_counts, std::span<float> recv,
                        std::span<const int64_t> recv_counts);
  // Lets the started all-to-alls move data: MPI libraries (Open MPI over TCP) progress them only
  // inside MPI calls, so the backward calls this between layers.
  void progress();
  // Waits until every started all-to-all has completed.
  void wait_all();
  // Seconds spent in wait_all so far: the communication the computation did not hide.
  double wait_seconds() const { return wait_seconds_; }
  // data holds every rank's part in rank order, counts[q] elements each: this rank's part is read,
  // the others are filled in.
  void all_gather(std::span<float> data, std::span<const int64_t> counts);
  void all_gather(std::span<double> data, std::span<const int64_t> counts);
  // Every rank's part (counts[q] elements from rank q) into all on rank 0, in rank order; all is
  // not touched on other ranks.
  void gather(std::span<const float> part, std::span<float> all, std::span<const int64_t> counts);
  // Rank 0's value, on every rank.
  bool broadcast(bool value);
  std::string broadcast(const std::string& value);
  // Ends every rank of the job with this exit status (MPI_Abort; exit() on a single rank). For the
  // CLI's error path only: the library itself never ends the process.
  [[noreturn]] void abort(int status);
  // The bytes this rank has received from other ranks so far (the payloads of all_to_all,
  // all_gather and gather): what a step's reduction costs, for measurement and tests.
  int64_t bytes_received() const { return bytes_received_; }

 private:
  struct Pending;  // a started all-to-all (distributed_mpi.cpp)
  Ranks(int rank, int size) : rank_(rank), size_(size) {}
  int rank_ = 0, size_ = 1;
  int64_t bytes_received_ = 0;
  double wait_seconds_ = 0;
  std::vector<std::shared_ptr<Pending>> pending_;
};

}  // namespace mhsa::detail
