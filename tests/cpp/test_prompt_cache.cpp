// tests/cpp/test_prompt_cache.cpp — the server's prompt cache (serve/prompt_cache.h) on a small
// KVBlockPool: XXH64 against the reference's values; a block image refused when cut at any length,
// with any byte changed, or from another model, format or prefix; blocks kept and restored from
// RAM and, by a new cache over the same directory (a restart), from files, bit for bit; a file
// corrupted, truncated or replaced by a link refused (the link's target untouched) and the prefix
// cut there; the RAM budget and the directory's limit hold; a directory others can write refused.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "mhsa/kv_pool.h"
#include "serve/block_image.h"
#include "serve/prompt_cache.h"

namespace mhsa {
namespace {

namespace fs = std::filesystem;
using serve::BlockFormat;
using serve::PromptCache;
using serve::PromptCacheOptions;

std::span<const std::byte> bytes_of(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

TEST(PromptCache, Xxh64MatchesTheReference) {
  EXPECT_EQ(serve::xxh64(bytes_of("")), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(serve::xxh64(bytes_of("abc")), 0x44BC2CF5AD770999ull);
  EXPECT_EQ(serve::xxh64(bytes_of("Nobody inspects the spammish repetition")), 0xFBCEA83C8A378BF1ull);
}

BlockFormat small_format() {
  BlockFormat f;
  f.model.fill(7);
  f.kv_type = "f32";
  f.block_tokens = 4;
  f.layers = 2;
  f.kv_heads = 1;
  f.head_dim = 4;
  f.v_head_dim = 4;
  f.block_bytes = 2 * 1 * 4 * 8 * 4;
  return f;
}

TEST(PromptCache, ImageRefusedUnlessExactlyTheBlockAskedFor) {
  const BlockFormat f = small_format();
  const std::vector<int32_t> prefix = {5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<std::byte> block(static_cast<size_t>(f.block_bytes));
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 37 + 1);
  const std::vector<std::byte> image = serve::make_image(f, prefix, block);
  ASSERT_EQ(image.size(), serve::image_bytes(f, prefix.size()));
  std::span<const std::byte> payload;
  ASSERT_EQ(serve::check_image(image, f, prefix, &payload), "");
  ASSERT_EQ(payload.size(), block.size());
  EXPECT_EQ(std::memcmp(payload.data(), block.data(), block.size()), 0);
  for (size_t n = 0; n < image.size(); ++n)  // every truncation
    EXPECT_NE(serve::check_image(std::span(image).first(n), f, prefix), "") << n;
  for (size_t i = 0; i < image.size(); ++i) {  // every byte changed
    std::vector<std::byte> bad = image;
    bad[i] ^= std::byte{0x20};
    EXPECT_NE(serve::check_image(bad, f, prefix), "") << i;
  }
  std::vector<std::byte> longer = image;
  longer.push_back(std::byte{0});
  EXPECT_NE(serve::check_image(longer, f, prefix), "");
  BlockFormat other = f;
  other.model[0] ^= 1;
  EXPECT_NE(serve::check_image(image, other, prefix).find("another model"), std::string::npos);
  other = f;
  other.kv_type = "bf16";
  EXPECT_NE(serve::check_image(image, other, prefix).find("another KV format"), std::string::npos);
  std::vector<int32_t> others = prefix;
  others[1] = 99;
  EXPECT_NE(serve::check_image(image, f, others).find("another prefix"), std::string::npos);
  EXPECT_NE(serve::check_image(image, f, std::span(prefix).first(4)).find("another prefix"), std::string::npos);
  // A huge token count is refused by the file's size, never used to read or allocate.
  std::vector<std::byte> huge = image;
  const uint64_t count = ~uint64_t{0} / 2;
  std::memcpy(huge.data() + 80, &count, 8);
  EXPECT_NE(serve::check_image(huge, f, prefix).find("token count"), std::string::npos);
}

// A pool of 16 blocks of 4 tokens and a sequence of `tokens` holding recognisable bytes.
struct Fixture {
  KVBlockPool pool{2, 1, 4, 4, 4, 16};
  PagedSequence filled(const std::vector<int32_t>& tokens, uint8_t salt) {
    PagedSequence s;
    EXPECT_TRUE(pool.reserve(s, pool.blocks_for(static_cast<int64_t>(tokens.size()))));
    pool.grow(s, static_cast<int64_t>(tokens.size()));
    for (size_t b = 0; b < s.blocks.size(); ++b) {
      const std::span<std::byte> data = pool.block_data(s.blocks[b]);
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(salt + b * 13 + i);
    }
    s.length = static_cast<int64_t>(tokens.size());
    return s;
  }
  // A fresh sequence with room for `tokens`, restored from the cache; its blocks' bytes.
  std::vector<std::vector<std::byte>> restored(PromptCache& cache, const std::vector<int32_t>& tokens,
                                               serve::Restored* got = nullptr) {
    PagedSequence s;
    EXPECT_TRUE(pool.reserve(s, pool.blocks_for(static_cast<int64_t>(tokens.size()))));
    const serve::Restored r = cache.restore(pool, s, tokens, static_cast<int64_t>(tokens.size()) / 4);
    if (got) *got = r;
    EXPECT_EQ(s.length, static_cast<int64_t>(s.blocks.size()) * 4);
    std::vector<std::vector<std::byte>> out;
    for (int32_t b : s.blocks) {
      const std::span<std::byte> d = pool.block_data(b);
      out.emplace_back(d.begin(), d.end());
    }
    pool.release(s);
    return out;
  }
};

std::vector<std::byte> bytes_of_block(KVBlockPool& pool, int32_t b) {
  const std::span<std::byte> d = pool.block_data(b);
  return {d.begin(), d.end()};
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mhsa_prompt_cache_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kvc") out.push_back(e.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return fs::file_size(a) < fs::file_size(b); });
  return out;  // by size: the prefix's first block first (each file holds its whole prefix)
}

TEST(PromptCache, KeepsAndRestoresFromRamThenFromFilesAfterARestart) {
  Fixture fx;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};  // 3 full blocks
  const fs::path dir = fresh_dir("restart");
  PagedSequence s = fx.filled(tokens, 3);
  std::vector<std::vector<std::byte>> want;
  for (size_t b = 0; b < 3; ++b) want.push_back(bytes_of_block(fx.pool, s.blocks[b]));
  PromptCacheOptions o;
  o.ram_bytes = 1 << 20;
  o.dir = dir;
  o.model.fill(1);
  {
    PromptCache cache(o, fx.pool);
    cache.keep(fx.pool, s, tokens, 3);
    fx.pool.release(s);
    serve::Restored got;
    EXPECT_EQ(fx.restored(cache, tokens, &got), want);
    EXPECT_EQ(got.ram, 3);
    EXPECT_EQ(got.disk, 0);
    // Another prompt: only the blocks that begin it alike.
    std::vector<int32_t> other = tokens;
    other[5] = 77;
    EXPECT_EQ(fx.restored(cache, other).size(), 1u);
    EXPECT_EQ(cache.stats().ram_tokens, 12 + 4);
  }  // the writer finishes its files
  ASSERT_EQ(block_files(dir).size(), 3u);
  PromptCacheOptions cold = o;
  cold.ram_bytes = 0;
  {
    PromptCache cache(cold, fx.pool);  // a restart: files only
    serve::Restored got;
    EXPECT_EQ(fx.restored(cache, tokens, &got), want);
    EXPECT_EQ(got.disk, 3);
    EXPECT_EQ(cache.stats().disk_files, 3);
    EXPECT_EQ(cache.stats().disk_tokens, 12);
    PromptCacheOptions other_model = cold;
    other_model.model.fill(2);
    PromptCache other(other_model, fx.pool);
    EXPECT_TRUE(fx.restored(other, tokens).empty());
  }
  fs::remove_all(dir);
}

TEST(PromptCache, BadFilesAreRefusedAndThePrefixCutThere) {
  Fixture fx;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const fs::path dir = fresh_dir("bad");
  PromptCacheOptions o;
  o.dir = dir;  // no RAM: every restore reads the files
  o.model.fill(1);
  {
    PagedSequence s = fx.filled(tokens, 9);
    PromptCache cache(o, fx.pool);
    cache.keep(fx.pool, s, tokens, 4);
    fx.pool.release(s);
  }
  std::vector<fs::path> files = block_files(dir);
  ASSERT_EQ(files.size(), 4u);
  // Block 3: one byte changed. Block 2: truncated. Block 1: a link to a file outside.
  {
    std::fstream f(files[3], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x55');
  }
  fs::resize_file(files[2], fs::file_size(files[2]) - 1);
  const fs::path outside = dir.parent_path() / (dir.filename().string() + "_outside");
  fs::copy_file(files[1], outside, fs::copy_options::overwrite_existing);
  const auto outside_size = fs::file_size(outside);
  fs::remove(files[1]);
  fs::create_symlink(outside, files[1]);
  {
    PromptCache cache(o, fx.pool);
    EXPECT_EQ(fx.restored(cache, tokens).size(), 1u);  // the link is refused: only block 0
    EXPECT_EQ(cache.stats().disk_refused, 1);
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(files[1])));  // the link is gone...
  EXPECT_EQ(fs::file_size(outside), outside_size);          // ...not what it pointed to
  {
    PromptCache cache(o, fx.pool);
    EXPECT_EQ(fx.restored(cache, tokens).size(), 1u);  // block 1 is missing now
  }
  fs::remove(files[0]);
  {
    PagedSequence s = fx.filled(tokens, 9);  // computed again and kept: blocks 0 and 1 written anew
    PromptCache cache(o, fx.pool);
    cache.keep(fx.pool, s, tokens, 4);
    fx.pool.release(s);
  }
  {
    PromptCache cache(o, fx.pool);  // blocks 2 and 3 (truncated, changed) were not rewritten: on disk as before
    EXPECT_EQ(fx.restored(cache, tokens).size(), 2u);
    EXPECT_EQ(cache.stats().disk_refused, 1);
  }
  fs::remove_all(dir);
  fs::remove(outside);
}

TEST(PromptCache, RamBudgetAndDirectoryLimitHold) {
  Fixture fx;
  const fs::path dir = fresh_dir("limits");
  const BlockFormat f = serve::block_format(fx.pool, {});
  const auto one = static_cast<int64_t>(serve::image_bytes(f, 8));  // an image of about 2 blocks' prefix
  PromptCacheOptions o;
  o.ram_bytes = 3 * one;
  o.dir = dir;
  o.dir_max_bytes = 5 * one;
  std::mt19937 rng(5);
  {
    PromptCache cache(o, fx.pool);
    for (int round = 0; round < 6; ++round) {  // six different 3-block prefixes
      std::vector<int32_t> tokens(12);
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 1000);
      PagedSequence s = fx.filled(tokens, static_cast<uint8_t>(round));
      cache.keep(fx.pool, s, tokens, 3);
      fx.pool.release(s);
      EXPECT_LE(cache.stats().ram_bytes, o.ram_bytes);
    }
    EXPECT_GT(cache.stats().ram_evicted, 0);
  }
  int64_t total = 0;
  for (const fs::path& p : block_files(dir)) total += static_cast<int64_t>(fs::file_size(p));
  EXPECT_LE(total, o.dir_max_bytes);
  EXPECT_GT(total, 0);
  // A restart over a directory above a lower limit trims it at once.
  o.dir_max_bytes = one;
  { PromptCache cache(o, fx.pool); }
  total = 0;
  for (const fs::path& p : block_files(dir)) total += static_cast<int64_t>(fs::file_size(p));
  EXPECT_LE(total, one);
  fs::remove_all(dir);
}

TEST(PromptCache, DirectoryOthersCanWriteIsRefused) {
  Fixture fx;
  const fs::path dir = fresh_dir("open");
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0777);
  PromptCacheOptions o;
  o.dir = dir;
  try {
    PromptCache cache(o, fx.pool);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cache-dir: expected a directory of yours that no one else can write"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("0777"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mhsa
