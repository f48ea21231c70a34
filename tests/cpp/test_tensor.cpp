// tests/cpp/test_tensor.cpp — tensor memory: big blocks are reused after they are freed (the same
// block comes back, zeroed like a fresh one), and release_cached_memory gives them back to the
// system (the resident set shrinks); sizes are checked, never wrapped, and an allocation the
// system refuses is an mhsa::Error naming the tensor and the bytes.
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

// Products of dims that wrap around 2^64 (to 0 here) once gave a small buffer that was then
// written past its end (`mhsa attention -T 16 -D 2^60` crashed); sizes beyond PTRDIFF_MAX bytes
// cannot be addressed either.
TEST(TensorSizes, ProductsBeyondTheAddressSpaceAreErrors) {
  expect_error([] { Tensor({1, 1, 16, int64_t{1} << 60}); },
               {"Tensor: dims: expected a size that fits in memory (at most 9223372036854775807 bytes",
                "got [1, 1, 16, 1152921504606846976] = 7.38e+19 bytes"});
  expect_error([] { Tensor({1, 1, 1 << 20, int64_t{1} << 44}); }, {"got [1, 1, 1048576, 17592186044416] = "});
  expect_error([] { Tensor({int64_t{1} << 61}, "KVCache: keys"); },  // 2^63 bytes: one past PTRDIFF_MAX
               {"KVCache: keys: expected a size that fits in memory", "got [2305843009213693952] = 9.22e+18 bytes"});
  EXPECT_EQ(Tensor({0, int64_t{1} << 62, int64_t{1} << 62}).numel(), 0) << "an empty tensor has no size to overflow";
  float x = 0.0f;
  expect_error([&] { ConstTensorView(&x, {int64_t{1} << 40, int64_t{1} << 40}); },
               {"View: dims: expected a shape whose strides fit in int64, got [1099511627776, 1099511627776]"});
  // A strided view may claim any shape; an entry point refuses one whose element count overflows.
  const ConstTensorView huge{&x, {int64_t{1} << 40, int64_t{1} << 40, 1, 1}, {0, 0, 0, 0}};
  Tensor out({1, 1, 1, 1}), lse({1, 1, 1});
  expect_error([&] { scaled_dot_product_attention(huge, huge, huge, out.view(), {}, lse.view()); },
               {"scaled_dot_product_attention: q: expected a size that fits in memory"});
}

// An addressable size the system cannot give (2^62 bytes) is an mhsa::Error, not std::bad_alloc.
TEST(TensorSizes, AllocationFailureIsAnErrorWithTheBytes) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation this large instead of throwing";
#else
  expect_error([] { Tensor({int64_t{1} << 40, 1 << 20}, "Gpt2::random: wte.weight"); },
               {"Gpt2::random: wte.weight: expected 4611686018427387904 bytes (4 EiB) of free memory for "
                "[1099511627776, 1048576], got out of memory"});
  const MultiHeadAttention m(16, 4);
  expect_error([&] { m.new_cache(int64_t{1} << 20, int64_t{1} << 30); },
               {"KVCache: keys [B, Hkv, capacity, D]: expected", "(64 PiB) of free memory", "got out of memory"});
#endif
}

// The KV cache, the layer and the GPT-2 config check their sizes before anything is allocated.
TEST(TensorSizes, CachesLayersAndModelsCheckTheirSizes) {
  const MultiHeadAttention m(16, 4);
  expect_error([&] { m.new_cache(1, int64_t{1} << 60); },  // was a cache of capacity 2^60 over 0 bytes
               {"KVCache: keys [B, Hkv, capacity, D]: expected a size that fits in memory",
                "got [1, 4, 1152921504606846976, 4] = "});
  expect_error([] { MultiHeadAttention(int64_t{1} << 62, 1); }, {"MultiHeadAttention: w_o [C, C]: expected a size"});
  Gpt2Config c;
  c.vocab_size = int64_t{1} << 62;
  expect_error([&] { Gpt2::random(c, 0); }, {"config.vocab_size: expected at most 2147483647 (token ids are int32), got 4611686018427387904"});
  c.vocab_size = 50257;
  c.n_layer = int64_t{1} << 40;
  expect_error([&] { Gpt2::random(c, 0); },
               {"Gpt2::random: config: expected weights that fit in memory (at most ", "of weights for vocab_size 50257"});
  c.n_layer = 1;
  c.n_embd = int64_t{1} << 62;
  c.n_head = 1;
  expect_error([&] { Gpt2::random(c, 0); }, {"Gpt2::random: config: expected weights that fit in memory"});
}

}  // namespace
}  // namespace mhsa::test
