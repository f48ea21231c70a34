// tests/cpp/test_sharded_safetensors.cpp — a model directory's weights through
// ShardedSafeTensors: one model.safetensors, or shards named by model.safetensors.index.json
// (random tensors spread over random shards, read back exactly), and hostile indexes — shard names
// reaching outside the directory, missing shards, a tensor in two shards, an index that disagrees
// with its shards, an index too large to read — each a short mhsa::Error naming the index.
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <cstring>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace mhsa::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Dir {
  fs::path path;
  Dir() : path(fs::temp_directory_path() / ("mhsa_shards_" + std::to_string(test_seed()) + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected mhsa::Error, nothing was thrown";
  return "";
}

void expect_error(const std::string& msg, const std::string& part) {
  EXPECT_LT(msg.size(), 400u) << msg;
  EXPECT_NE(msg.find(part), std::string::npos) << "wanted '" << part << "' in: " << msg;
}

// Random tensors "t0".."tN" spread over `shards` files and the index naming them.
struct Sharded {
  std::map<std::string, Tensor> tensors;
  json weight_map = json::object();
};
Sharded write_shards(const Dir& d, std::mt19937_64& gen, int shards) {
  Sharded s;
  std::vector<std::vector<std::pair<std::string, ConstTensorView>>> files(static_cast<size_t>(shards));
  const int n = shards + 1 + static_cast<int>(gen() % 4);  // some shard holds two
  for (int i = 0; i < n; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".weight";
    s.tensors.emplace(name, random_tensor(gen, {1 + static_cast<int64_t>(gen() % 5), 1 + static_cast<int64_t>(gen() % 3)}));
  }
  int i = 0;
  for (const auto& [name, t] : s.tensors) {
    const size_t f = i < shards ? static_cast<size_t>(i) : gen() % static_cast<size_t>(shards);  // none empty
    ++i;
    files[f].emplace_back(name, t.view());
    s.weight_map[name] = "model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
  }
  for (size_t f = 0; f < files.size(); ++f)
    save_safetensors((d.path / ("model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(shards) + ".safetensors")).string(),
                     files[f]);
  d.write("model.safetensors.index.json", json{{"metadata", {{"total_size", 0}}}, {"weight_map", s.weight_map}}.dump());
  return s;
}

void expect_same(const ShardedSafeTensors& set, const Sharded& s) {
  std::vector<std::string> names;
  for (const auto& [name, t] : s.tensors) names.push_back(name);
  EXPECT_EQ(set.names(), names);
  for (const auto& [name, t] : s.tensors) {
    const Tensor got = set.load(name);
    ASSERT_EQ(got.numel(), t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(got.data()[i], t.data()[i]) << name;
    ASSERT_NE(set.find(name), nullptr);
    EXPECT_EQ(set.find(name)->shape[0], t.shape()[0]);
  }
  EXPECT_EQ(set.find("absent"), nullptr);
  expect_error(error_of([&] { set.load("absent"); }), "'absent' (absent)");
}

TEST(ShardedSafeTensors, ReadsShardsAsOneSet) {
  auto gen = test_rng();
  const Dir d;
  const int shards = 2 + static_cast<int>(gen() % 3);
  const Sharded s = write_shards(d, gen, shards);
  const ShardedSafeTensors set = ShardedSafeTensors::open_dir(d.path);
  EXPECT_EQ(set.files().size(), static_cast<size_t>(shards));
  expect_same(set, s);
  expect_same(ShardedSafeTensors::open_index(d.path / "model.safetensors.index.json"), s);
}

TEST(ShardedSafeTensors, SingleFileFirst) {
  auto gen = test_rng();
  const Dir d;
  write_shards(d, gen, 2);
  Sharded single;
  single.tensors.emplace("wte", random_tensor(gen, {3, 5}));
  save_safetensors((d.path / "model.safetensors").string(), {{"wte", single.tensors.at("wte").view()}});
  const ShardedSafeTensors set = ShardedSafeTensors::open_dir(d.path);  // as transformers: the single file wins
  EXPECT_EQ(set.files().size(), 1u);
  expect_same(set, single);
  const Dir empty;
  expect_error(error_of([&] { ShardedSafeTensors::open_dir(empty.path); }),
               "model.safetensors or model.safetensors.index.json");
  expect_error(error_of([&] { ShardedSafeTensors::open_dir(empty.path / "nope"); }), "no such directory");
}

// The writer's header is JSON: a tensor name or metadata entry that is not UTF-8 (a C++ caller's
// bytes) is an mhsa::Error naming it, no file is left behind, and valid multi-byte names round-trip.
TEST(SaveSafeTensors, RefusesNamesAndMetadataThatAreNotUtf8) {
  auto gen = test_rng();
  const Dir d;
  const Tensor t = random_tensor(gen, {2, 3});
  const std::string path = (d.path / "x.safetensors").string();
  const std::string bad = "w\xff", overlong = "w\xc0\xaf", surrogate = "w\xed\xa0\x80";
  for (const std::string& b : {bad, overlong, surrogate}) {
    expect_error(error_of([&] { save_safetensors(path, {{b, t.view()}}); }), "tensor name: expected valid UTF-8");
    expect_error(error_of([&] { save_safetensors(path, {{"w", t.view()}}, {{"k", b}}); }),
                 "metadata 'k': expected valid UTF-8");
    expect_error(error_of([&] { save_safetensors(path, {{"w", t.view()}}, {{b, "v"}}); }), "metadata key");
    expect_error(error_of([&] { save_safetensors(path, {{b, t.view()}}); }), "invalid at byte 1");
  }
  EXPECT_TRUE(fs::is_empty(d.path));
  save_safetensors(path, {{"w\u00e9\U0001F600", t.view()}}, {{"n\u00e9", "\u4e2d"}});
  const SafeTensors f = SafeTensors::open(path);
  EXPECT_EQ(f.metadata().at("n\u00e9"), "\u4e2d");
  const Tensor back = f.load("w\u00e9\U0001F600");
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back.data()[i], t.data()[i]);
}

// Threads saving to one path at once: each write goes through a temporary file of its own, so
// the file is always one writer's whole file (before, the threads shared "<path>.tmp.<pid>",
// truncating and interleaving each other's bytes), and no temporary file is left.
TEST(SaveSafeTensors, ThreadsWritingOnePathLeaveOneWholeFile) {
  auto gen = test_rng();
  const Dir d;
  const std::string path = (d.path / "x.safetensors").string();
  constexpr int kThreads = 4;
  std::vector<Tensor> mine;
  for (int t = 0; t < kThreads; ++t) mine.push_back(random_tensor(gen, {256, 1024}));  // 1 MiB each
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) save_safetensors(path, {{"w", mine[t].view()}}, {{"writer", std::to_string(t)}});
    });
  for (std::thread& t : threads) t.join();
  const SafeTensors f = SafeTensors::open(path);
  const int writer = std::stoi(f.metadata().at("writer"));
  ASSERT_TRUE(writer >= 0 && writer < kThreads);
  const Tensor back = f.load("w");
  ASSERT_EQ(back.numel(), mine[writer].numel());
  EXPECT_EQ(std::memcmp(back.data(), mine[writer].data(), sizeof(float) * back.numel()), 0);
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator{}), 1);
}

// A file that cannot be written is an mhsa::WriteError carrying the system's errno (what the CLI
// reports as an output error, exit status 1), and a file already at the path is left whole.
TEST(SaveSafeTensors, AFailedWriteIsAWriteErrorAndKeepsTheOldFile) {
  auto gen = test_rng();
  const Dir d;
  const Tensor t = random_tensor(gen, {3, 5});
  const std::string missing = (d.path / "no-such-dir" / "x.safetensors").string();
  try {
    save_safetensors(missing, {{"w", t.view()}});
    ADD_FAILURE() << "no error";
  } catch (const WriteError& e) {
    EXPECT_EQ(e.os_error(), ENOENT);
    expect_error(e.what(), "save_safetensors: path: expected a writable location, got '" + missing + "'");
  }
  // A full disk, as a file-size limit (EFBIG; works for root too): the old file stays.
  const std::string path = (d.path / "x.safetensors").string();
  save_safetensors(path, {{"w", t.view()}});
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  int err = 0;
  try {
    save_safetensors(path, {{"w", random_tensor(gen, {64, 64}).view()}});  // 16 KiB
  } catch (const WriteError& e) {
    err = e.os_error();
    expect_error(e.what(), "expected a complete write, got '" + path + "': File too large");
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(err, EFBIG);
  const Tensor back = SafeTensors::open(path).load("w");
  ASSERT_EQ(back.numel(), t.numel());
  EXPECT_EQ(std::memcmp(back.data(), t.data(), sizeof(float) * t.numel()), 0);
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator{}), 1);  // no temporary left
}

TEST(ShardedSafeTensors, RefusesHostileIndexes) {
  auto gen = test_rng();
  const Dir d;
  const Sharded s = write_shards(d, gen, 2);
  const std::string first = s.weight_map.begin().key();
  const fs::path index = d.path / "model.safetensors.index.json";
  const auto with_map = [&](const json& map) {
    d.write("model.safetensors.index.json", json{{"weight_map", map}}.dump());
    return error_of([&] { ShardedSafeTensors::open_dir(d.path); });
  };
  for (const char* shard : {"../model-00001-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".",
                            "a\\b", ""}) {
    json map = s.weight_map;
    map[first] = shard;
    const std::string msg = with_map(map);
    expect_error(msg, "the name of a file in the index's directory");
    expect_error(msg, index.string());
  }
  json map = s.weight_map;
  map[first] = "model-00009-of-00009.safetensors";
  expect_error(with_map(map), "(no such file)");
  map = s.weight_map;
  map[first] = 7;
  expect_error(with_map(map), "the name of a file");
  // The index names the other shard for a tensor: it disagrees with the shards.
  map = s.weight_map;
  const std::string other = map[first] == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                                            : "model-00001-of-00002.safetensors";
  map[first] = other;
  expect_error(with_map(map), first);
  // A tensor of the shards the index leaves out (one whose shard is still opened for another);
  // one the index names that no shard holds.
  std::string shared;
  for (const auto& [name, shard] : s.weight_map.items())
    for (const auto& [other_name, other_shard] : s.weight_map.items())
      if (name != other_name && shard == other_shard) shared = name;
  map = s.weight_map;
  map[shared] = map[shared] == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                                   : "model-00001-of-00002.safetensors";
  expect_error(with_map(map), "the shard holding it");
  map = s.weight_map;
  map.erase(shared);
  expect_error(with_map(map), "an entry for every tensor of the shards");
  map = s.weight_map;
  map["lm_head.weight"] = "model-00001-of-00002.safetensors";
  expect_error(with_map(map), "none (absent from the shard)");
  // One tensor in two shards.
  save_safetensors((d.path / "extra.safetensors").string(), {{first, s.tensors.at(first).view()}});
  map = s.weight_map;
  map["zz"] = "extra.safetensors";
  expect_error(with_map(map), "one shard holding it");
  // Not an index at all; an empty map; too large to read (a sparse file).
  expect_error(with_map(json::object()), "a non-empty object of tensor name");
  d.write("model.safetensors.index.json", "[1, 2]");
  expect_error(error_of([&] { ShardedSafeTensors::open_dir(d.path); }), "a JSON object");
  d.write("model.safetensors.index.json", "{\"weight_map\": ");
  expect_error(error_of([&] { ShardedSafeTensors::open_dir(d.path); }), index.string());
  fs::resize_file(index, uint64_t{1} << 40);
  expect_error(error_of([&] { ShardedSafeTensors::open_dir(d.path); }), "at most 67108864 bytes");
}

TEST(ShardedSafeTensors, IndexParser) {
  const auto map = parse_safetensors_index(R"({"weight_map": {"a": "x.safetensors", "b": "y.safetensors"}})", "idx");
  EXPECT_EQ(map.size(), 2u);
  EXPECT_EQ(map.at("b"), "y.safetensors");
  expect_error(error_of([] { parse_safetensors_index("{}", "idx"); }), "safetensors index idx: weight_map");
  expect_error(error_of([] { parse_safetensors_index(std::string(100000, '[') + std::string(100000, ']'), "idx"); }),
               "idx");
  expect_error(error_of([] { parse_safetensors_index(R"({"weight_map": {"a": ")" + std::string(100000, 'x') + "\"}}", "idx"); }),
               "the name of a file");
}

}  // namespace
}  // namespace mhsa::test
