// train/distributed_mpi.cpp — train/distributed.h over MPI: MPI starts on first use in a process
// that mpirun (or another PMI launcher) started, and ends at exit. Every collective is a plain
// data movement on MPI_COMM_WORLD (MPI_Ialltoallv, MPI_Allgatherv, MPI_Gatherv, MPI_Bcast); the
// arithmetic stays with the caller. MPI is called from the main thread only, between OpenMP's
// parallel regions (MPI_THREAD_FUNNELED).
#include "train/distributed.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <vector>

#include "core/check.h"

namespace mhsa::detail {
namespace {

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI's int counts and displacements of a collective, checked to fit.
struct Layout {
  std::vector<int> counts, displs;
  Layout(std::span<const int64_t> c, int64_t total) {
    int64_t at = 0;
    for (int64_t n : c) {
      if (n < 0 || n > INT_MAX || at > INT_MAX)
        fail("Ranks", "counts", "parts below 2^31 elements", std::to_string(n));
      counts.push_back(static_cast<int>(n));
      displs.push_back(static_cast<int>(at));
      at += n;
    }
    if (at > total) fail("Ranks", "counts", message("parts within the buffer of ", total), std::to_string(at));
  }
};

template <class T>
void gather_all(std::span<T> data, std::span<const int64_t> counts, MPI_Datatype type, int rank, int64_t& received) {
  const Layout l(counts, static_cast<int64_t>(data.size()));
  MPI_Allgatherv(MPI_IN_PLACE, 0, type, data.data(), l.counts.data(), l.displs.data(), type, MPI_COMM_WORLD);
  for (size_t q = 0; q < counts.size(); ++q)
    if (static_cast<int>(q) != rank) received += counts[q] * static_cast<int64_t>(sizeof(T));
}

}  // namespace

Ranks& Ranks::world() {
  static Ranks ranks = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      if (!launched_by_mpirun()) return Ranks(0, 1);
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit(finalize_at_exit);
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return Ranks(rank, size);
  }();
  return ranks;
}

struct Ranks::Pending {
  Layout send, recv;  // MPI reads the counts until the all-to-all completes
  MPI_Request request = MPI_REQUEST_NULL;
};

void Ranks::start_all_to_all(std::span<const float> send, std::span<const int64_t> send_counts, std::span<float> recv,
                             std::span<const int64_t> recv_counts) {
  auto p = std::make_shared<Pending>(Pending{Layout(send_counts, static_cast<int64_t>(send.size())),
                                             Layout(recv_counts, static_cast<int64_t>(recv.size()))});
  if (size_ == 1) {  // MPI not started: a copy
    std::copy(send.begin(), send.begin() + send_counts[0], recv.begin());
    return;
  }
  MPI_Ialltoallv(send.data(), p->send.counts.data(), p->send.displs.data(), MPI_FLOAT, recv.data(),
                 p->recv.counts.data(), p->recv.displs.data(), MPI_FLOAT, MPI_COMM_WORLD, &p->request);
  pending_.push_back(std::move(p));
  for (int q = 0; q < size_; ++q)
    if (q != rank_) bytes_received_ += recv_counts[static_cast<size_t>(q)] * static_cast<int64_t>(sizeof(float));
}

void Ranks::progress() {
  for (const auto& p : pending_) {
    int done = 0;
    MPI_Test(&p->request, &done, MPI_STATUS_IGNORE);
  }
}

void Ranks::wait_all() {
  if (pending_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : pending_) MPI_Wait(&p->request, MPI_STATUS_IGNORE);
  pending_.clear();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Ranks::all_gather(std::span<float> data, std::span<const int64_t> counts) {
  if (size_ > 1) gather_all(data, counts, MPI_FLOAT, rank_, bytes_received_);
}

void Ranks::all_gather(std::span<double> data, std::span<const int64_t> counts) {
  if (size_ > 1) gather_all(data, counts, MPI_DOUBLE, rank_, bytes_received_);
}

void Ranks::gather(std::span<const float> part, std::span<float> all, std::span<const int64_t> counts) {
  if (size_ == 1) {
    std::copy(part.begin(), part.end(), all.begin());
    return;
  }
  const Layout l(counts, rank_ == 0 ? static_cast<int64_t>(all.size()) : INT64_MAX);
  if (static_cast<int64_t>(part.size()) != counts[static_cast<size_t>(rank_)])
    fail("Ranks::gather", "part", message(counts[static_cast<size_t>(rank_)], " elements"), std::to_string(part.size()));
  MPI_Gatherv(part.data(), l.counts[static_cast<size_t>(rank_)], MPI_FLOAT, all.data(), l.counts.data(),
              l.displs.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank_ == 0)
    for (int q = 1; q < size_; ++q) bytes_received_ += counts[static_cast<size_t>(q)] * static_cast<int64_t>(sizeof(float));
}

bool Ranks::broadcast(bool value) {
  if (size_ == 1) return value;
  int v = value ? 1 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return v != 0;
}

std::string Ranks::broadcast(const std::string& value) {
  if (size_ == 1) return value;
  if (value.size() > INT_MAX) fail("Ranks::broadcast", "value", "below 2^31 bytes", std::to_string(value.size()));
  int n = static_cast<int>(value.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string out = rank_ == 0 ? value : std::string(static_cast<size_t>(n), '\0');
  MPI_Bcast(out.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return out;
}

void Ranks::abort(int status) {
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

}  // namespace mhsa::detail
