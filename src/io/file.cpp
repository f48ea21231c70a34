// io/file.cpp — see io/file.h.
#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace mhsa::detail
