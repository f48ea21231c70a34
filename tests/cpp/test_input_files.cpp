// tests/cpp/test_input_files.cpp — hostile files where the library expects its inputs: JSON nested
// 100,000 levels deep (a stack overflow while formatting the message, before the fix), values and
// names megabytes long (megabyte messages), integers beyond the type they land in (silently
// truncated), and FIFOs, directories and sockets in place of regular files (a FIFO blocked the
// reader forever). Each gives a short mhsa::Error naming the file.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

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

}  // namespace
}  // namespace mhsa::test
