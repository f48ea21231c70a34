// io/file.cpp — see io/file.h.
#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.h"

namespace mhsa::detail {
namespace {

const char* kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

InputFile::InputFile(const std::filesystem::path& path, std::string_view fn, std::string_view arg)
    : path_(path.string()), fn_(fn), arg_(arg) {
  const auto unreadable = [&](int err) {
    fail(fn_, arg_, "a readable file", message("'", path_, "': ", std::strerror(err)));
  };
  const auto irregular = [&](mode_t mode) { fail(fn_, arg_, "a regular file", message(kind(mode), " '", path_, "'")); };
  // stat first, so that nothing but a regular file is ever opened (opening a device can act);
  // then O_NONBLOCK and fstat, so that a FIFO swapped in between fails instead of blocking.
  struct stat st{};
  if (::stat(path_.c_str(), &st) != 0) unreadable(errno);
  if (!S_ISREG(st.st_mode)) irregular(st.st_mode);
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd_ < 0) unreadable(errno);
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (S_ISREG(st.st_mode)) unreadable(err);
    irregular(st.st_mode);
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // a regular file never blocks anyway
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read_all() {
  std::string bytes;
  bytes.reserve(static_cast<size_t>(size_));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n == 0) return bytes;
    if (n > 0) {
      bytes.append(buf, static_cast<size_t>(n));
    } else if (errno != EINTR) {
      fail(fn_, arg_, "a readable file", message("'", path_, "': ", std::strerror(errno)));
    }
  }
}

std::string read_file(const std::filesystem::path& path, std::string_view fn, std::string_view arg) {
  return InputFile(path, fn, arg).read_all();
}

const char* irreplaceable(const std::filesystem::path& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return nullptr;  // nothing there (or a dangling link): a new file
  if (S_ISREG(st.st_mode)) return nullptr;
  // A link to a device is replaced as a link, but what the path names is not a file to overwrite.
  return kind(st.st_mode);
}

void check_replaceable(const std::filesystem::path& path, std::string_view fn, std::string_view arg) {
  if (const char* what = irreplaceable(path))
    fail(fn, arg, "a regular file or a path that does not exist (a new file is renamed into place)",
         message(what, " '", path.string(), "'"));
}

OutputFile::OutputFile(std::string dest, std::string fn) : dest_(std::move(dest)), fn_(std::move(fn)) {
  check_replaceable(dest_, fn_, "path");
  static std::atomic<uint64_t> writers{0};
  tmp_ = message(dest_, ".tmp.", ::getpid(), ".", writers.fetch_add(1));
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) failed("a writable location", errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) std::remove(tmp_.c_str());
}

void OutputFile::failed(const char* expected, int err) {
  throw WriteError(message(fn_, ": path: expected ", expected, ", got '", dest_, "': ", std::strerror(err)), err);
}

void OutputFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed("a complete write", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void OutputFile::commit(bool replace) {
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    failed("a complete write", err);
  }
  if (::close(fd) != 0) failed("a complete write", errno);
  if (replace) {
    check_replaceable(dest_, fn_, "path");  // again: the node may have changed while the file was written
    if (std::rename(tmp_.c_str(), dest_.c_str()) != 0) failed("a location the file can be renamed into", errno);
  } else {
    if (::link(tmp_.c_str(), dest_.c_str()) != 0) failed("a file that does not exist yet (or overwrite)", errno);
    std::remove(tmp_.c_str());
  }
  committed_ = true;
}

}  // namespace mhsa::detail
