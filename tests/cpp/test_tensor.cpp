// tests/cpp/test_tensor.cpp — tensor memory: big blocks are reused after they are freed (the same
// block comes back, zeroed like a fresh one), and release_cached_memory gives them back to the
// system (the resident set shrinks).
#include <fstream>

#include "test_util.h"

namespace mhsa::test {
namespace {

double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * 4096.0 / (1 << 20);
}

TEST(TensorMemory, FreedBlocksAreReusedZeroedAndReleasedOnRequest) {
  release_cached_memory();
  const float* first = nullptr;
  {
    Tensor t({16, 1 << 20});  // 64 MiB
    first = t.data();
    std::fill(t.data(), t.data() + t.numel(), 3.0f);
  }
  {
    Tensor again({16, 1 << 20});
    EXPECT_EQ(again.data(), first) << "a freed block of the same size should be reused";
    for (int64_t i = 0; i < again.numel(); i += 4099) ASSERT_EQ(again.data()[i], 0.0f) << "element " << i;
  }
#if defined(__linux__) && !defined(__SANITIZE_ADDRESS__)  // ASan keeps freed memory in quarantine
  const double held = resident_mib();
  release_cached_memory();
  EXPECT_LT(resident_mib(), held - 48.0) << "the cached 64 MiB block should have been given back";
#endif
}

// With a limit, a freed block that does not fit pushes out the longest-unused ones; a block larger
// than the limit is not kept; the limit 0 keeps nothing.
TEST(TensorMemory, TheCacheKeepsTheMostRecentBlocksWithinItsLimit) {
  const std::size_t MiB = std::size_t{1} << 20;
  release_cached_memory();
  set_cached_memory_limit(100 * MiB);
  { Tensor a({16, 1 << 20}); }  // 64 MiB
  EXPECT_EQ(cached_memory_bytes(), 64 * MiB);
  { Tensor b({12, 1 << 20}); }  // 48 MiB: 112 > 100, so the 64 MiB block goes
  EXPECT_EQ(cached_memory_bytes(), 48 * MiB);
  { Tensor c({32, 1 << 20}); }  // 128 MiB: over the limit by itself
  EXPECT_EQ(cached_memory_bytes(), 48 * MiB);
  {
    Tensor d({12, 1 << 20});  // takes the cached 48 MiB block
    EXPECT_EQ(cached_memory_bytes(), 0u);
  }
  { Tensor small({1000}); }  // small tensors are never cached
  EXPECT_EQ(cached_memory_bytes(), 48 * MiB);
  set_cached_memory_limit(0);
  EXPECT_EQ(cached_memory_bytes(), 0u);
  { Tensor e({16, 1 << 20}); }
  EXPECT_EQ(cached_memory_bytes(), 0u);
  set_cached_memory_limit(std::size_t{1} << 30);
}

}  // namespace
}  // namespace mhsa::test
