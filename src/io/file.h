// io/file.h — opening the files the library reads (safetensors, config.json, vocab.json,
// merges.txt, training text): regular files only. A FIFO would block the reader forever, a
// directory or a device is never what was meant; each is refused with an mhsa::Error naming the
// file and what it is. And the one way the library writes a file (safetensors, GGUF): a
// temporary file beside it, moved into place only when complete. Not a general file API.
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

// The one check every writer that renames a finished file into place makes (OutputFile below,
// a checkpoint's swap, the CLI's reports): rename(2) replaces whatever node is at the
// destination, so writing over a device, a FIFO or a socket would replace the node itself with a
// regular file (as root, `--out /dev/full` would delete the machine's /dev/full) and over an empty
// directory would remove it. Returns nullptr when `path` names nothing or a regular file
// (directly or through symbolic links: renaming onto a link replaces the link, never what it
// points to), else what is there: "a character device", "a directory", ...
const char* irreplaceable(const std::filesystem::path& path);
// Throws mhsa::Error "<fn>: <arg>: expected a regular file or a path that does not exist (a new
// file is renamed into place), got a character device '<path>'" where irreplaceable(path) says so.
void check_replaceable(const std::filesystem::path& path, std::string_view fn, std::string_view arg);

// A file written beside its destination and moved onto it only when complete, so that a reader,
// a crash or a full disk never sees half a file where a whole one was: created O_EXCL as
// "<dest>.tmp.<pid>.<n>" (n counts this process's writers, so two threads writing the same
// destination never share a temporary file), every write checked, fsync'd before it is moved,
// removed unless committed. Errors: "<fn>: path: expected ..., got '<dest>': <strerror>". A
// destination that is neither a regular file nor absent is refused (check_replaceable) when the
// writer is made, before any work, and again just before the rename.
class OutputFile {
 public:
  OutputFile(std::string dest, std::string fn);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  void write(const void* data, size_t bytes);
  // Flushes the file to disk and moves it onto the destination: replacing a file there
  // (replace, rename(2)), or only when there is none (link(2): never replacing one, even in a race).
  void commit(bool replace = true);

 private:
  [[noreturn]] void failed(const char* expected, int err);
  std::string dest_, tmp_, fn_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace mhsa::detail
