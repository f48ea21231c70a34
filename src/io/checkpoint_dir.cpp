// io/checkpoint_dir.cpp — directory locks, the writer's claim and the checkpoint swap (see
// checkpoint_dir.h).
#include "io/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "io/file.h"

namespace mhsa::detail {
namespace {

namespace fs = std::filesystem;

int lock(int fd, int operation) {
  int rc;
  do rc = ::flock(fd, operation);
  while (rc != 0 && errno == EINTR);
  return rc;
}

constexpr const char* kProbe = "write-probe";

// Whether fd is still the file at path: a holder removes the lock file before it lets go, so a
// lock won on a file that has since been removed (or replaced) claims nothing.
bool still_at(int fd, const fs::path& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace

DirLock::DirLock(const fs::path& dir, Mode mode) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ >= 0 && lock(fd_, mode == Mode::shared ? LOCK_SH : LOCK_EX) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

WriterClaim::WriterClaim(const fs::path& dir, std::string_view fn, std::string_view arg) : file_(dir / "train.lock") {
  const fs::path& file = file_;
  int locked;
  for (;;) {  // until the lock is refused, or won on the file that is at the path
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail(fn, arg, "a writable directory",
           message("'", dir.string(), "' (", std::strerror(errno), " opening train.lock)"));
    locked = lock(fd_, LOCK_EX | LOCK_NB);
    if (locked != 0 || still_at(fd_, file)) break;
    ::close(fd_);  // its holder removed it as it finished: try the new one
  }
  if (locked != 0) {
    if (errno != EWOULDBLOCK) return;  // a file system without flock: the run goes on unclaimed, as readers do
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string text = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string();
    const std::string holder = text.substr(0, text.find_first_not_of("0123456789"));  // the pid the holder wrote
    fail(fn, arg, "a directory no other training run is writing",
         message("'", dir.string(), "' in use by ", holder.empty() ? "another process" : "process " + holder, " (it holds ",
                 file.string(), ")"));
  }
  // Best effort: without the pid, a second writer's message names no process. (A stale pid left
  // in the file is harmless: only a held lock refuses a writer.)
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool recorded = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  static_cast<void>(recorded);
  held_ = true;
}

WriterClaim::~WriterClaim() {
  if (held_) ::unlink(file_.c_str());  // while still held: a waiter that then wins the old file sees it gone
  if (fd_ >= 0) ::close(fd_);          // releases the lock
}

fs::path staged_name(const fs::path& dir, const std::string& name) {
  return dir / (name + ".tmp." + std::to_string(::getpid()));
}

void check_writable(const fs::path& dir, std::string_view fn, std::string_view arg) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(fn, arg, "a writable directory", message("'", dir.string(), "' (", ec.message(), ")"));
  const fs::path probe = staged_name(dir, kProbe);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const bool written = fd >= 0 && ::write(fd, "\n", 1) == 1;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (!written) fail(fn, arg, "a writable directory", message("'", dir.string(), "' (", std::strerror(err), ")"));
}

void remove_temporaries(const fs::path& dir, const std::vector<std::string>& names) {
  std::vector<std::string> prefixes{std::string(kProbe) + ".tmp"};
  for (const std::string& name : names) prefixes.push_back(name + ".tmp");
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string file = e.path().filename().string();
    if (!e.is_regular_file(ec) || e.is_symlink(ec)) continue;  // ours are regular files: never remove a node
    for (const std::string& tmp : prefixes)
      if (file == tmp || file.rfind(tmp + ".", 0) == 0) {
        fs::remove(e.path(), ec);
        break;
      }
  }
}

void swap_in(const fs::path& dir, const std::vector<std::string>& obsolete,
             const std::vector<std::pair<fs::path, std::string>>& staged, std::string_view fn) {
  const DirLock lock(dir, DirLock::Mode::exclusive);
  const auto failed = [&](const fs::path& file, int err) {
    std::error_code ec;
    for (const auto& [from, name] : staged) fs::remove(from, ec);
    throw WriteError(message(fn, ": out: expected a directory whose files can be replaced, got '", file.string(), "' (",
                             std::strerror(err), ")"),
                     err);
  };
  // Every name checked before anything changes, so that a refused checkpoint leaves the last one
  // whole: a rename or unlink would replace or delete a device or FIFO put in its place.
  try {
    for (const std::string& name : obsolete) check_replaceable(dir / name, fn, "out");
    for (const auto& [from, name] : staged) check_replaceable(dir / name, fn, "out");
  } catch (const Error&) {
    std::error_code ec;
    for (const auto& [from, name] : staged) fs::remove(from, ec);
    throw;
  }
  for (const std::string& name : obsolete)
    if (::unlink((dir / name).c_str()) != 0 && errno != ENOENT) failed(dir / name, errno);
  for (const auto& [from, name] : staged)
    if (std::rename(from.c_str(), (dir / name).c_str()) != 0) failed(dir / name, errno);
  // The renames themselves on disk, so that a power cut after a checkpoint was reported keeps it
  // (best effort: some file systems cannot fsync a directory).
  if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    static_cast<void>(::fsync(fd));
    ::close(fd);
  }
}

}  // namespace mhsa::detail
