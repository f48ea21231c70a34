// core/tensor.cpp — the owning Tensor.
#include "mhsa/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <iterator>
#include <limits>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "core/check.h"

namespace mhsa {

namespace detail {

std::size_t physical_memory_bytes() {
#if defined(__linux__)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
  return std::size_t{1} << 30;
}

std::size_t available_memory_bytes() {
#if defined(__linux__)
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found && kib <= std::numeric_limits<std::size_t>::max() / 1024) return static_cast<std::size_t>(kib) * 1024;
  }
#endif
  return physical_memory_bytes();
}

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kHugeFrom = std::size_t{2} << 20;
constexpr std::size_t kCacheFrom = std::size_t{256} << 10;

// Cached blocks are rounded to whole pages: 2 MiB from kHugeFrom on, else 4 KiB. The rounded
// size alone then tells the alignment a block was allocated with.
std::size_t rounded(std::size_t bytes) {
  const std::size_t unit = bytes > kHugeFrom - 4096 ? kHugePage : 4096;  // 4 KiB units stay below kHugeFrom
  return (bytes + unit - 1) / unit * unit;
}
std::align_val_t alignment(std::size_t rounded_bytes) {
  return std::align_val_t{rounded_bytes >= kHugeFrom ? kHugePage : 64};
}

// How much freed memory the cache may hold: by default an eighth of the machine's memory, between
// 128 MiB and 4 GiB (a GPT-2 124M training step at B·T = 1024 frees about 1 GiB of activations
// and allocates it again in the next step; with 128 MiB the kernel's page clearing was 15% of it).
std::atomic<std::size_t>& cache_limit() {
  static std::atomic<std::size_t> bytes =
      std::clamp(physical_memory_bytes() / 8, std::size_t{128} << 20, std::size_t{4} << 30);
  return bytes;
}
std::size_t cache_bytes() { return cache_limit().load(std::memory_order_relaxed); }

// Freed blocks of kCacheFrom bytes and more, kept (up to cache_bytes() in all) for the next request
// of the same size: a transformer allocates the same activation shapes in every layer and every
// step, and a fresh block costs an mmap, a page fault per page and the kernel clearing each page
// (11% of a 512-token GPT-2 prefill without this cache). Blocks are kept in the order they were
// freed; a request takes the most recently freed block of its size, and when a new block would
// not fit, the longest-unused ones are given back first, so the cache follows the shapes in use
// now rather than filling up with sizes an earlier workload left behind.
class BlockCache {
 public:
  void* take(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
      if (it->first == bytes) {
        void* p = it->second;
        held_ -= bytes;
        blocks_.erase(std::next(it).base());
        return p;
      }
    return nullptr;
  }
  bool keep(void* p, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > cache_bytes()) return false;
    while (held_ + bytes > cache_bytes()) {  // evict the oldest
      ::operator delete(blocks_.front().second, alignment(blocks_.front().first));
      held_ -= blocks_.front().first;
      blocks_.pop_front();
    }
    blocks_.emplace_back(bytes, p);
    held_ += bytes;
    return true;
  }
  void release() { trim(0); }
  // Gives back the oldest blocks until at most `limit` bytes are held.
  void trim(std::size_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (held_ > limit) {
      ::operator delete(blocks_.front().second, alignment(blocks_.front().first));
      held_ -= blocks_.front().first;
      blocks_.pop_front();
    }
  }
  std::size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  ~BlockCache() { release(); }

 private:
  std::mutex mutex_;
  std::deque<std::pair<std::size_t, void*>> blocks_;  // oldest first
  std::size_t held_ = 0;
};

BlockCache& block_cache() {
  static BlockCache cache;
  return cache;
}

}  // namespace

// Blocks from kCacheFrom (256 KiB) up are cached when freed: below 4 MiB glibc serves them with
// mmap or from the top of the heap, and either gives the pages back on free, so a training step's
// 3 MiB activations faulted in fresh pages every step.
void* allocate_tensor_memory(std::size_t bytes) {
  if (bytes < kCacheFrom) return ::operator new(bytes, std::align_val_t{64});
  const std::size_t size = rounded(bytes);
  if (void* p = block_cache().take(size)) return p;
  void* p = ::operator new(size, alignment(size));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (size >= kHugeFrom) (void)madvise(p, size, MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
#endif
  return p;
}

void free_tensor_memory(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kCacheFrom) {
    ::operator delete(p, std::align_val_t{64});
    return;
  }
  const std::size_t size = rounded(bytes);
  bool kept = false;
  try {
    kept = block_cache().keep(p, size);
  } catch (...) {  // no room to remember it: give it back
  }
  if (!kept) ::operator delete(p, alignment(size));
}

}  // namespace detail

void release_cached_memory() { detail::block_cache().release(); }

void set_cached_memory_limit(std::size_t bytes) {
  detail::cache_limit().store(bytes, std::memory_order_relaxed);
  detail::block_cache().trim(bytes);
}

std::size_t cached_memory_bytes() { return detail::block_cache().held(); }

Tensor::Tensor(std::vector<int64_t> dims, std::string_view what) : shape_(std::move(dims)) {
  if (shape_.empty() || shape_.size() > kMaxDims)
    throw Error(detail::message(what, ": expected 1 to 4 dimensions, got ", shape_.size()));
  for (int64_t d : shape_)
    if (d < 0) throw Error(detail::message(what, ": expected non-negative sizes, got ", d));
  const int64_t n = detail::checked_count(what, shape_, sizeof(float));
  try {
    storage_.assign(static_cast<size_t>(n), 0.0f);
  } catch (const std::bad_alloc&) {
    detail::out_of_memory(what, shape_, sizeof(float));
  }
}

Tensor contiguous(const ConstTensorView& v) {
  Tensor t(std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
  std::array<int64_t, 4> n{1, 1, 1, 1}, st{0, 0, 0, 0};  // right-aligned to 4 dimensions
  for (int i = 0; i < v.ndim; ++i) n[4 - v.ndim + i] = v.shape[i], st[4 - v.ndim + i] = v.stride[i];
  float* out = t.data();
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d) *out++ = v.data[a * st[0] + b * st[1] + c * st[2] + d * st[3]];
  return t;
}

}  // namespace mhsa
