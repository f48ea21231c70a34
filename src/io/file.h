// io/file.h — opening the files the library reads (safetensors, config.json, vocab.json,
// merges.txt, training text): regular files only. A FIFO would block the reader forever, a
// directory or a device is never what was meant; each is refused with an mhsa::Error naming the
// file and what it is. Not a general file API: reading only, whole files or a descriptor to map.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace mhsa::detail {

// An open regular file (O_RDONLY, close-on-exec) and its size; closes itself.
class InputFile {
 public:
  // Throws mhsa::Error "<fn>: <arg>: expected a readable file, got '<path>': <why>" when it cannot
  // be opened, and "... expected a regular file, got a FIFO '<path>'" (a directory, a socket, ...)
  // without opening anything but a regular file.
  InputFile(const std::filesystem::path& path, std::string_view fn, std::string_view arg);
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // The rest of the file's bytes (all of them on a fresh InputFile); errors name fn and arg.
  std::string read_all();

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_, fn_, arg_;
};

// The bytes of a regular file (see InputFile).
std::string read_file(const std::filesystem::path& path, std::string_view fn, std::string_view arg);

}  // namespace mhsa::detail
