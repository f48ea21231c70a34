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

}  // namespace
}  // namespace mhsa::test
