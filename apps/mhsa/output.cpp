// apps/mhsa/output.cpp — see output.h.
#include "output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "io/file.h"
#include "mhsa/error.h"

namespace mhsa::cli {

namespace {

// The length of a leading "Name::name: " (C++ identifiers joined by "::"), or 0.
size_t cpp_name_length(std::string_view s) {
  size_t i = 0;
  bool scoped = false;
  while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_' || s[i] == ':')) {
    if (s.compare(i, 3, ":: ") == 0) break;
    if (s.compare(i, 2, "::") == 0) scoped = true, ++i;
    else if (s[i] == ':') break;
    ++i;
  }
  return scoped && s.compare(i, 2, ": ") == 0 ? i + 2 : 0;
}

}  // namespace

std::string error_line(std::string_view what) {
  if (what.starts_with("mhsa ")) {  // "mhsa chat: ..."
    const size_t colon = what.find(": ");
    if (colon != std::string_view::npos && what.substr(5, colon - 5).find(' ') == std::string_view::npos)
      what.remove_prefix(colon + 2);
  }
  while (const size_t n = cpp_name_length(what)) what.remove_prefix(n);
  return "mhsa: error: " + std::string(what) + "\n";
}

namespace fs = std::filesystem;
using detail::message;

namespace {

[[noreturn]] void stdout_failed(int error) {
  throw OutputError(message("writing standard output: ", error ? std::strerror(error) : "a write failed"));
}

}  // namespace

void write_stdout(std::string_view bytes) {
  errno = 0;
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size()) stdout_failed(errno);
}

void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) stdout_failed(errno);
}

OutputFile::OutputFile(fs::path path, std::string option) : path_(std::move(path)), option_(std::move(option)) {
  std::error_code ec;
  const fs::file_status status = fs::status(path_, ec);  // of what a link points to
  if (detail::irreplaceable(path_)) {  // /dev/stdout, a FIFO: written into, never replaced
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) fail("opening");
    return;
  }
  target_ = fs::exists(status) ? fs::canonical(path_, ec) : path_;  // replace the file, not a link to it
  if (ec) target_ = path_;
  std::string name = (target_.parent_path() / ("." + target_.filename().string() + ".XXXXXX")).string();
  const int fd = mkstemp(name.data());
  if (fd < 0 && errno == EACCES && fs::exists(status)) {  // a writable file in a directory that is not: in place
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) fail("opening");
    return;
  }
  if (fd < 0) fail("creating a temporary file beside");
  temp_ = name;
  struct stat old {};
  mode_t mode = 0;
  if (::stat(target_.c_str(), &old) == 0) {
    mode = old.st_mode & 07777;  // keep the replaced file's permissions
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;  // a new file's, as open(2) would give it
  }
  file_ = fchmod(fd, mode) == 0 ? fdopen(fd, "wb") : nullptr;
  if (!file_) {
    const int error = errno;
    ::close(fd);
    ::unlink(temp_.c_str());  // the destructor does not run when the constructor throws
    temp_.clear();
    errno = error;
    fail("creating");
  }
}

OutputFile::~OutputFile() {
  if (file_) std::fclose(file_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::write(std::string_view bytes) {
  errno = 0;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) fail("writing");
}

void OutputFile::commit() {
  errno = 0;
  if (std::fflush(file_) != 0 || std::ferror(file_)) fail("writing");
  if (!temp_.empty() && ::fsync(fileno(file_)) != 0) fail("writing");
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) fail("writing");
  if (temp_.empty()) return;
  // The path was a regular file or nothing when the report was opened (else it is written in
  // place); a device or FIFO put there since would be replaced by the rename: refused instead.
  if (const char* what = detail::irreplaceable(target_))
    throw OutputError(message(option_, ": replacing '", path_.string(), "': expected a regular file or a path that does "
                              "not exist, got ", what));
  if (std::rename(temp_.c_str(), target_.c_str()) != 0) fail("replacing");
  temp_.clear();
}

void OutputFile::fail(std::string_view doing) {
  const int error = errno;
  throw OutputError(message(option_, ": ", doing, " '", path_.string(), "': ",
                            error ? std::strerror(error) : "a write failed"));
}

}  // namespace mhsa::cli
