// apps/mhsa/output.h — the CLI's results written so that a failed write (a full disk, a closed
// file) is an error and exit status 1, never a silent exit 0: standard output checked where it is
// flushed, files written whole or not at all. Not for stderr (there is nowhere left to report to).
#pragma once

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mhsa::cli {

// A failed write of a command's output; main.cpp prints "mhsa: error: <what>" and exits 1.
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "mhsa: error: <what>" for stderr, in a CLI user's words: the library names the C++ function
// that refused ("Model::load: dir: ..."), which an API user wants and a CLI user cannot act on, and
// a command may name itself ("mhsa chat: --prompt: ...") where "mhsa: error: " already says who.
std::string error_line(std::string_view what);

// Writes to standard output; throws OutputError when the bytes cannot be written.
void write_stdout(std::string_view bytes);
// Flushes standard output; throws OutputError ("writing standard output: No space left on
// device") when this or any earlier write to it failed.
void flush_stdout();

// A file written whole or not at all: the bytes go to a temporary file beside it, which replaces
// it (rename) only once all of them are written and synced, so a failed write leaves the file
// that was there before as it was, and no temporary file behind. A path that exists and is not a
// regular file (/dev/stdout, a FIFO), or a file in a directory where no other can be created, is
// written in place. Errors name the option: "--out: writing 'r.html': No space left on device".
class OutputFile {
 public:
  OutputFile(std::filesystem::path path, std::string option);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();  // removes the temporary file unless commit() succeeded

  void write(std::string_view bytes);
  void commit();  // flush, sync, close, rename over the path

 private:
  [[noreturn]] void fail(std::string_view doing);

  std::filesystem::path path_, target_, temp_;  // as given; the file replaced; the one written
  std::string option_;
  std::FILE* file_ = nullptr;
};

}  // namespace mhsa::cli
