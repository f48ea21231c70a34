// tests/cpp/test_input_files.cpp — hostile files where the library expects its inputs: JSON nested
// 100,000 levels deep (a stack overflow while formatting the message, before the fix), values and
// names megabytes long (megabyte messages), integers beyond the type they land in (silently
// truncated), and FIFOs, directories and sockets in place of regular files (a FIFO blocked the
// reader forever). Each gives a short mhsa::Error naming the file.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "io/gguf.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& tag)
      : dir(fs::temp_directory_path() / ("mhsa_input_" + tag + "_" + std::to_string(test_seed()) + "_" +
                                         std::to_string(getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  }
  fs::path fifo(const std::string& name) const {
    EXPECT_EQ(0, mkfifo((dir / name).c_str(), 0600)) << std::strerror(errno);
    return dir / name;
  }
};

const char* kConfig = R"({"model_type": "gpt2", "vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2)";

std::string nested(size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); }

// A safetensors file whose header is `header` (and no data).
std::string safetensors_bytes(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  return out + header;
}

// The message of the mhsa::Error fn() throws; a test failure for anything else.
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

// Short, names `file`, says `expected`.
void expect_short_error(const std::string& msg, const std::string& file, const std::string& expected) {
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 400);
  EXPECT_NE(msg.find(file), std::string::npos) << msg.substr(0, 400);
  EXPECT_NE(msg.find(expected), std::string::npos) << msg.substr(0, 400);
}

// error_of(fn) on another thread: a reader blocked on `fifo` fails the test and is released by
// opening the FIFO's write end (and closing it: end of file), so that a regression cannot hang.
template <class Fn>
std::string error_within(const fs::path& fifo, Fn fn) {
  auto result = std::async(std::launch::async, [&] { return error_of(fn); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked reading the FIFO " << fifo;
    while (result.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  return result.get();
}

TEST(InputFiles, DeepSafetensorsHeaderIsRefusedBriefly) {
  Scratch s("deep_st");
  for (const std::string& header : {nested(100000), "{\"a\": " + nested(100000) + "}",
                                    "{\"a\": {\"dtype\": \"F32\", \"shape\": " + nested(100000) + "}}"}) {
    const std::string bytes = safetensors_bytes(header);
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    expect_short_error(error_of([&] { SafeTensors::parse({data, bytes.size()}, "deep.safetensors"); }),
                       "deep.safetensors", "header: expected UTF-8 JSON nested at most 64 levels deep");
  }
  const fs::path file = s.write("deep.safetensors", safetensors_bytes(nested(100000)));
  expect_short_error(error_of([&] { SafeTensors::open(file.string()); }), file.string(), "nested at most");
}

TEST(InputFiles, LongHeaderValuesAndNamesAreCut) {
  const std::string mega(1 << 20, 'x');
  std::string long_array = "[0";
  for (int i = 0; i < 200000; ++i) long_array += ", 0";
  long_array += "]";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"t\": {\"dtype\": " + long_array + ", \"shape\": [], \"data_offsets\": [0, 0]}}", "dtype: expected F32"},
      {"{\"t\": {\"dtype\": \"" + mega + "\", \"shape\": [], \"data_offsets\": [0, 0]}}", "dtype: expected F32"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": " + long_array + ", \"data_offsets\": [0, 0]}}", "shape: expected an array of at most 8"},
      {"{\"" + mega + "\": 1}", "expected an object with dtype"},
      {"{\"__metadata__\": {\"" + mega + "\": " + long_array + "}}", "expected a string, got an array [0, 0"},
      {"{\"t\": \"" + mega, "expected UTF-8 JSON, got invalid JSON"},  // the parser's "last read" is the whole token
      {"{\"t\": 1" + std::string(1 << 20, '0') + "}", "got invalid JSON (number overflow parsing"},  // and so is this
      {long_array, "expected a JSON object, got an array [0, 0, 0"},
  };
  for (const auto& [header, expected] : cases) {
    const std::string bytes = safetensors_bytes(header);
    expect_short_error(
        error_of([&] { SafeTensors::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "long.st"); }),
        "long.st", expected);
  }
}

TEST(InputFiles, DeepConfigIsRefusedBriefly) {
  Scratch s("deep_config");
  for (const std::string& value : {nested(100000), std::string(100000, '[') + "1"}) {
    const fs::path config = s.write("config.json", std::string(kConfig) + ", \"task_specific_params\": " + value + "}");
    expect_short_error(error_of([&] { Gpt2Config::load(config); }), config.string(),
                       "expected a JSON object nested at most 64 levels deep");
    expect_short_error(error_of([&] { Gpt2::load(s.dir); }), config.string(), "nested at most 64 levels");
  }
  const std::string long_string(1 << 20, 'y');
  const fs::path config = s.write("config.json", std::string(kConfig) + ", \"model_type\": \"" + long_string + "\"}");
  expect_short_error(error_of([&] { Gpt2Config::load(config); }), config.string(), "model_type: expected \"gpt2\"");
}

TEST(InputFiles, DeepOrLongVocabIsRefusedBriefly) {
  for (const auto& [vocab, expected] : std::vector<std::pair<std::string, std::string>>{
           {nested(100000), "expected a JSON object of token → id, got an array"},
           {"{\"a\": " + nested(100000) + "}", "key 'a': expected an integer id, got an array"},
           {"{\"a\": \"" + std::string(1 << 20, 'z'), "vocab 'v.json': expected JSON, got"},
           {"{\"a\": 1" + std::string(1 << 20, '0') + ".5}", "vocab 'v.json': expected JSON, got number overflow parsing"}})
    expect_short_error(error_of([&] { Tokenizer::parse(vocab, "", "v.json"); }), "v.json", expected);
}

TEST(InputFiles, ConfigIntegersMustFitTheirType) {
  Scratch s("ints");
  const std::string base = R"({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_head": 2)";
  const fs::path c = s.dir / "c.json";
  const auto error = [&](const std::string& extra) {
    s.write("c.json", base + ", " + extra + "}");
    return error_of([&] { Gpt2Config::load(c); });
  };
  s.write("c.json", base + R"(, "n_layer": 1, "eos_token_id": 3})");
  EXPECT_EQ(Gpt2Config::load(c).eos_token_id, 3);
  expect_short_error(error(R"("n_layer": 1, "eos_token_id": 1099511627776)"), c.string() + ": eos_token_id",
                     "expected an integer in [-2147483648, 2147483647], got 1099511627776");
  expect_short_error(error(R"("n_layer": 1, "eos_token_id": -1099511627776)"), c.string() + ": eos_token_id",
                     "got -1099511627776");
  expect_short_error(error(R"("n_layer": 18446744073709551615)"), c.string() + ": n_layer",
                     "expected an integer in [-9223372036854775808, 9223372036854775807], got 18446744073709551615");
  expect_short_error(error(R"("n_layer": 1.5)"), c.string() + ": n_layer", "expected a positive integer, got 1.5");
  expect_short_error(error(R"("n_layer": 1, "layer_norm_epsilon": 1e300)"), c.string() + ": layer_norm_epsilon",
                     "expected a finite number > 0, got 1e+300");
  expect_short_error(error(R"("n_layer": 1, "eos_token_id": "2")"), c.string() + ": eos_token_id", "got a string \"2\"");
}

TEST(InputFiles, FifosAreRefusedWithoutBlocking) {
  Scratch s("fifo");
  // config.json, then model.safetensors (after a valid config.json)
  s.fifo("config.json");
  std::string msg = error_within(s.dir / "config.json", [&] { Gpt2::load(s.dir); });
  expect_short_error(msg, (s.dir / "config.json").string(), "expected a regular file, got a FIFO");
  fs::remove(s.dir / "config.json");
  s.write("config.json", std::string(kConfig) + "}");
  s.fifo("model.safetensors");
  msg = error_within(s.dir / "model.safetensors", [&] { Gpt2::load(s.dir); });
  expect_short_error(msg, (s.dir / "model.safetensors").string(), "path: expected a regular file, got a FIFO");
  // vocab.json, merges.txt
  const fs::path vocab = s.fifo("vocab.json"), merges = s.fifo("merges.txt");
  msg = error_within(vocab, [&] { Tokenizer::load(vocab, merges); });
  expect_short_error(msg, vocab.string(), "vocab: expected a regular file, got a FIFO");
  fs::remove(vocab);
  fs::copy_file(fs::path(MHSA_TEST_DATA_DIR) / "gpt2-tokenizer/encoder.json", vocab);
  msg = error_within(merges, [&] { Tokenizer::load(vocab, merges); });
  expect_short_error(msg, merges.string(), "merges: expected a regular file, got a FIFO");
  // training text
  const fs::path data = s.fifo("data.txt");
  msg = error_within(data, [&] { TextCorpus::load(data, 0.1, 8, Tokenizer::bytes()); });
  expect_short_error(msg, data.string(), "data: expected a regular file, got a FIFO");
}

TEST(InputFiles, DirectoriesAndSocketsAreNamed) {
  Scratch s("kinds");
  fs::create_directories(s.dir / "config.json");
  expect_short_error(error_of([&] { Gpt2Config::load(s.dir / "config.json"); }), (s.dir / "config.json").string(),
                     "expected a regular file, got a directory");
  const fs::path sock = s.dir / "model.safetensors";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(0, ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr)) << std::strerror(errno);
  expect_short_error(error_of([&] { SafeTensors::open(sock.string()); }), sock.string(),
                     "expected a regular file, got a socket");
  ::close(fd);
  expect_short_error(error_of([&] { SafeTensors::open("/dev/null"); }), "/dev/null",
                     "expected a regular file, got a character device");
  expect_short_error(error_of([&] { SafeTensors::open((s.dir / "absent").string()); }), "absent",
                     "path: expected a readable file");
}

// Writers rename a finished temporary file onto the destination, and rename(2) replaces whatever
// node is there: `quantize --out X --force` replaced a character device X with a regular file
// (as root, --out /dev/full would delete the machine's /dev/full). Only a regular file or nothing
// may be replaced; the node is left as it was, and no temporary file.
TEST(OutputFiles, WritersNeverReplaceANodeThatIsNotARegularFile) {
  Scratch s("replace");
  std::vector<std::pair<fs::path, std::string>> nodes = {{s.fifo("fifo"), "a FIFO"}};
  fs::create_directories(s.dir / "dir");
  nodes.emplace_back(s.dir / "dir", "a directory");
  if (::mknod((s.dir / "full").c_str(), S_IFCHR | 0600, ::makedev(1, 7)) == 0)  // a copy of /dev/full (root only)
    nodes.emplace_back(s.dir / "full", "a character device");
  fs::create_symlink(s.dir / "fifo", s.dir / "link");  // what a link names counts, not the link
  nodes.emplace_back(s.dir / "link", "a FIFO");
  const Tensor t({2, 3});
  const std::string want = "path: expected a regular file or a path that does not exist (a new file is renamed into place), got ";
  for (const auto& [path, what] : nodes) {
    const std::vector<std::pair<std::string, ConstTensorView>> tensors = {{"w", t.view()}};
    expect_short_error(error_of([&] { save_safetensors(path.string(), tensors); }), path.string(), want + what);
    detail::GgufWriter gguf;
    gguf.add_u32("general.alignment", 32);
    expect_short_error(error_of([&] { gguf.write(path, /*overwrite=*/true); }), path.string(), want + what);
    struct stat st{};
    ASSERT_EQ(0, ::lstat(path.c_str(), &st));
    EXPECT_FALSE(S_ISREG(st.st_mode)) << path << " was replaced by a regular file";
  }
  // The node is checked again just before the rename: one put there while the file was written.
  {
    detail::OutputFile out((s.dir / "late").string(), "late_writer");
    out.write("abc", 3);
    s.fifo("late");
    EXPECT_EQ(error_of([&] { out.commit(); }),
              "late_writer: " + want + "a FIFO '" + (s.dir / "late").string() + "'");
  }
  // A checkpoint's swap checks every name before it changes any: the staged files go, the old stay.
  s.write("config.json", "old");
  s.fifo("model.safetensors");
  const fs::path staged_config = s.write("config.json.tmp.1", "new"), staged_model = s.write("model.safetensors.tmp.1", "new");
  expect_short_error(error_of([&] {
                       detail::swap_in(s.dir, {"config.json", "model.safetensors"},
                                       {{staged_config, "config.json"}, {staged_model, "model.safetensors"}}, "train");
                     }),
                     (s.dir / "model.safetensors").string(), "train: out: expected a regular file or a path that does not exist");
  EXPECT_EQ(detail::read_file(s.dir / "config.json", "t", "t"), "old");
  EXPECT_TRUE(fs::is_fifo(s.dir / "model.safetensors"));
  // Regular files, links to them and new paths are still written; no temporary file is left.
  s.write("old.safetensors", "old");
  fs::create_symlink(s.dir / "old.safetensors", s.dir / "old_link");
  for (const char* name : {"old.safetensors", "old_link", "new.safetensors"})
    save_safetensors((s.dir / name).string(), {{"w", t.view()}});
  EXPECT_EQ(SafeTensors::open((s.dir / "new.safetensors").string()).tensors().size(), 1u);
  for (const auto& e : fs::directory_iterator(s.dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// A writer's claim removes train.lock as it ends. Claims taken and given back as fast as three
// threads can (a claim is per open file, so threads of one process exclude each other as
// processes do) never overlap: a claim won on a lock file that its holder has just removed would
// otherwise sit beside one on the new file.
TEST(OutputFiles, WriterClaimsExcludeEachOtherAndRemoveTheLockFile) {
  Scratch s("claims");
  std::atomic<int> holders{0}, overlaps{0}, wins{0};
  const auto claim_often = [&] {
    for (int i = 0; i < 2000; ++i) {
      try {
        const detail::WriterClaim claim(s.dir, "train", "out");
        if (holders.fetch_add(1) != 0) overlaps.fetch_add(1);
        wins.fetch_add(1);
        holders.fetch_sub(1);
      } catch (const Error& e) {
        // "in use by process N", or "by another process" before the holder has written its pid
        EXPECT_NE(std::string(e.what()).find("in use by"), std::string::npos) << e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(claim_often);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(wins.load(), 0);
  EXPECT_FALSE(fs::exists(s.dir / "train.lock"));
}

// A config.json claiming 300,000 layers beside a weights file of a few tensors was refused only
// after ~600 MB of per-layer names and indices had been built (the memory bound is an estimate
// against physical memory). Sizes are checked against the file first.
TEST(InputFiles, LayerCountIsCheckedAgainstTheWeightsFirst) {
  Scratch s("layers");
  s.write("config.json", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 16,
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 300000, "num_attention_heads": 2,
    "num_key_value_heads": 2, "max_position_embeddings": 32, "tie_word_embeddings": true})");
  const Tensor embed({16, 8}), norm({8});
  save_safetensors((s.dir / "model.safetensors").string(),
                   {{"model.embed_tokens.weight", embed.view()}, {"model.norm.weight", norm.view()}});
  const auto start = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { Model::load(s.dir); });
  EXPECT_EQ(e, "Model::load: " + s.dir.string() +
                   ": config.num_layers: expected at most the 2 tensors' worth of layers in the weights (6 or more a "
                   "layer), got 300000");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

}  // namespace
}  // namespace mhsa::test
