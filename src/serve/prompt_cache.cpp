// serve/prompt_cache.cpp — PromptCache (see prompt_cache.h): the hash chain, the RAM tier's LRU,
// and the directory: reading a file back (checked whole before use), the writer thread, the limit.
#include "serve/prompt_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <system_error>
#include <type_traits>

#include "core/check.h"
#include "io/sha256.h"
#include "mhsa/kv_cache.h"

namespace mhsa::serve {
namespace {

using detail::message;

constexpr std::string_view kSuffix = ".kvc";
constexpr std::string_view kTempPrefix = ".tmp-";
// A temporary file older than this is a writer's that died (a crash, a full disk then a kill): removed.
constexpr auto kStaleTemp = std::chrono::minutes(10);

void log(const std::string& line) { std::fprintf(stderr, "mhsa serve: prompt cache: %s\n", line.c_str()); }

std::string errno_text(int err) { return std::system_category().message(err); }

// The pool's element types by name: one type, or keys'/values' where each has its own.
std::string kv_types_name(KVType t) { return std::string(kv_type_name(t)); }
template <class T>
  requires requires(const T& t) { t.key; t.value; }
std::string kv_types_name(const T& t) {
  return t.key == t.value ? kv_types_name(t.key) : kv_types_name(t.key) + "/" + kv_types_name(t.value);
}

bool is_block_name(std::string_view name) {
  if (name.size() != 64 + kSuffix.size() || !name.ends_with(kSuffix)) return false;
  return std::all_of(name.begin(), name.begin() + 64, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool parse_name(std::string_view name, Digest& d) {
  if (!is_block_name(name)) return false;
  const auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(nibble(name[2 * i]) << 4 | nibble(name[2 * i + 1]));
  return true;
}

std::string file_name(const Digest& d) { return hex(d) + std::string(kSuffix); }

int64_t mtime_ns(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

void hash_line(detail::Sha256& h, const std::string& line) { h.update(line.data(), line.size()); }

}  // namespace

Digest model_identity(const std::filesystem::path& model, std::string_view extra) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path where = fs::absolute(model, ec);
  if (ec) throw Error(message("--model: expected a path whose identity can be read, got '", model.string(), "': ", ec.message()));
  detail::Sha256 h;
  hash_line(h, message("mhsa prompt cache model\n", where.string(), "\n", extra, "\n"));
  std::vector<std::string> lines;
  const auto add = [&](const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    lines.push_back(message(p.filename().string(), " ", st.st_size, " ", mtime_ns(st), "\n"));
  };
  if (fs::is_directory(where, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(where, ec)) add(e.path());
    if (ec) throw Error(message("--model: expected a readable directory, got '", where.string(), "': ", ec.message()));
  } else {
    add(where);
  }
  if (lines.empty()) throw Error(message("--model: expected a model file or a directory holding one, got '", where.string(), "'"));
  std::sort(lines.begin(), lines.end());
  for (const std::string& l : lines) hash_line(h, l);
  return h.finish();
}

BlockFormat block_format(const KVBlockPool& pool, const Digest& model) {
  BlockFormat f;
  f.model = model;
  f.kv_type = kv_types_name(pool.type());
  f.block_tokens = pool.block_tokens();
  f.layers = pool.layers();
  f.kv_heads = pool.kv_heads();
  f.head_dim = pool.head_dim();
  f.v_head_dim = pool.v_head_dim();
  f.block_bytes = pool.block_bytes();
  return f;
}

PromptCache::PromptCache(PromptCacheOptions options, const KVBlockPool& pool)
    : options_(std::move(options)), format_(block_format(pool, options_.model)) {
  detail::Sha256 h;
  hash_line(h, message("mhsa prompt cache chain\n", hex(format_.model), "\n", format_.kv_type, " ", format_.block_tokens, " ",
                       format_.layers, " ", format_.kv_heads, " ", format_.head_dim, " ", format_.v_head_dim, " ",
                       format_.block_bytes, "\n"));
  root_ = h.finish();
  if (options_.dir.empty()) return;
  const std::string dir = options_.dir.string();
  const auto refuse_dir = [&](const std::string& got) {
    throw Error(message("mhsa serve: --cache-dir: expected a directory of yours that no one else can write, got '", dir,
                        "': ", got));
  };
  std::error_code ec;
  std::filesystem::path path = options_.dir.lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "dir/"
  if (!std::filesystem::exists(path, ec)) {  // the parents as the umask says, the directory the user's alone
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    if (!ec && ::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) ec = std::error_code(errno, std::system_category());
  }
  if (ec) refuse_dir(ec.message());
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) refuse_dir(errno_text(errno));
  struct stat st {};
  if (::fstat(dir_fd_, &st) != 0) {
    const int err = errno;
    ::close(dir_fd_);
    refuse_dir(errno_text(err));
  }
  // Whoever can write the directory can plant blocks that the server would copy into its caches
  // (a checksum does not stop one who can compute it): the directory must be the user's alone.
  std::string why;
  if (st.st_uid != ::geteuid()) why = message("owned by user ", st.st_uid);
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = message("writable by its group or others (mode ", mode, ")");
  }
  if (!why.empty()) {
    ::close(dir_fd_);
    refuse_dir(why);
  }
  {
    std::lock_guard lock(disk_mutex_);
    scan_dir();
    trim_dir(options_.dir_max_bytes);
  }
  writer_ = std::thread([this] { writer(); });
}

PromptCache::~PromptCache() {
  if (writer_.joinable()) {
    {
      std::lock_guard lock(disk_mutex_);
      stopping_ = true;
    }
    queued_.notify_one();
    writer_.join();
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::vector<Digest> PromptCache::chain(std::span<const int32_t> tokens, int64_t n) const {
  std::vector<Digest> names;
  const auto bs = static_cast<size_t>(format_.block_tokens);
  names.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < static_cast<size_t>(std::max<int64_t>(n, 0)) && (i + 1) * bs <= tokens.size(); ++i) {
    detail::Sha256 h;
    const Digest& parent = i == 0 ? root_ : names.back();
    h.update(parent.data(), parent.size());
    h.update(tokens.data() + i * bs, bs * sizeof(int32_t));
    names.push_back(h.finish());
  }
  return names;
}

void PromptCache::put_ram(const Digest& name, std::shared_ptr<const std::vector<std::byte>> bytes) {
  const auto size = static_cast<int64_t>(bytes->size());
  if (size > options_.ram_bytes) return;
  if (const auto it = ram_.find(name); it != ram_.end()) {
    touch_ram(name);
    return;
  }
  int64_t evicted = 0;
  while (ram_total_ + size > options_.ram_bytes && !ram_lru_.empty()) {  // least recently used first
    const auto oldest = ram_lru_.begin();
    const auto it = ram_.find(oldest->second);
    ram_total_ -= static_cast<int64_t>(it->second.bytes->size());
    ram_.erase(it);
    ram_lru_.erase(oldest);
    ++evicted;
  }
  ram_.emplace(name, Image{std::move(bytes), ++tick_});
  ram_lru_.emplace(tick_, name);
  ram_total_ += size;
  std::lock_guard lock(stats_mutex_);
  stats_.ram_evicted += evicted;
  stats_.ram_images = static_cast<int64_t>(ram_.size());
  stats_.ram_bytes = ram_total_;
}

void PromptCache::touch_ram(const Digest& name) {
  Image& im = ram_.at(name);
  ram_lru_.erase(im.tick);
  im.tick = ++tick_;
  ram_lru_.emplace(im.tick, name);
}

void PromptCache::keep(KVBlockPool& pool, const PagedSequence& s, std::span<const int32_t> tokens, int64_t blocks) {
  blocks = std::min<int64_t>(blocks, static_cast<int64_t>(s.blocks.size()));
  const std::vector<Digest> names = chain(tokens, blocks);
  const auto bs = static_cast<size_t>(format_.block_tokens);
  const bool files = dir_fd_ >= 0;
  // Images of the blocks kept nowhere yet, queued for files from the first block on (a queue that
  // fills keeps a prefix's beginning, which is what a later prompt can use).
  std::vector<std::shared_ptr<const std::vector<std::byte>>> made(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (ram_.count(names[i])) continue;
    bool on_disk = false;
    if (files) {
      std::lock_guard lock(disk_mutex_);
      on_disk = files_.count(names[i]) > 0;
    }
    if (on_disk && options_.ram_bytes == 0) continue;
    try {
      made[i] = std::make_shared<const std::vector<std::byte>>(
          make_image(format_, tokens.first((i + 1) * bs), pool.block_data(s.blocks[i])));
    } catch (const std::bad_alloc&) {
      log("out of memory for a block's copy: the rest of the prefix is not kept");
      break;
    }
    if (files && !on_disk) queue_write(names[i], made[i]);
  }
  // RAM from the last block to the first: the first is the most recent, so a prefix's end goes
  // before its beginning (a beginning without its end still saves a prefill; an end alone never).
  for (size_t i = names.size(); i-- > 0;) {
    if (made[i]) put_ram(names[i], std::move(made[i]));
    else if (ram_.count(names[i])) touch_ram(names[i]);
  }
}

Restored PromptCache::restore(KVBlockPool& pool, PagedSequence& s, std::span<const int32_t> tokens, int64_t max_blocks) {
  Restored got;
  const auto bs = static_cast<size_t>(format_.block_tokens);
  const std::vector<Digest> names = chain(tokens, max_blocks);
  for (size_t i = s.blocks.size(); i < names.size(); ++i) {
    const std::span<const int32_t> prefix = tokens.first((i + 1) * bs);
    std::shared_ptr<const std::vector<std::byte>> image;
    bool from_disk = false;
    if (const auto it = ram_.find(names[i]); it != ram_.end()) {
      // The name is the prefix's hash; the image holds the prefix itself, compared exactly.
      const std::vector<std::byte>& b = *it->second.bytes;
      if (b.size() == image_bytes(format_, prefix.size()) &&
          std::memcmp(b.data() + kImageHeaderBytes, prefix.data(), prefix.size_bytes()) == 0) {
        image = it->second.bytes;
        touch_ram(names[i]);
      }
    }
    if (!image && dir_fd_ >= 0) {
      image = read_file(names[i], prefix);
      from_disk = image != nullptr;
    }
    if (!image) break;
    try {
      pool.grow(s, static_cast<int64_t>((i + 1) * bs));  // from s's promise
    } catch (const std::exception& e) {  // out of memory for the pool's slab: the rest is prefilled
      log(message("no pool block for a kept prefix block (", e.what(), ")"));
      break;
    }
    const std::span<std::byte> block = pool.block_data(s.blocks.back());
    std::memcpy(block.data(), image->data() + image_payload_offset(prefix.size()), block.size());
    s.length = static_cast<int64_t>((i + 1) * bs);
    if (from_disk) {
      ++got.disk;
      put_ram(names[i], std::move(image));
    } else {
      ++got.ram;
    }
  }
  std::lock_guard lock(stats_mutex_);
  stats_.ram_hits += got.ram > 0;
  stats_.ram_blocks += got.ram;
  stats_.ram_tokens += got.ram * format_.block_tokens;
  stats_.disk_hits += got.disk > 0;
  stats_.disk_blocks += got.disk;
  stats_.disk_tokens += got.disk * format_.block_tokens;
  return got;
}

PromptCacheStats PromptCache::stats() const {
  PromptCacheStats s;
  {
    std::lock_guard lock(stats_mutex_);
    s = stats_;
  }
  {
    std::lock_guard lock(disk_mutex_);
    s.disk_files = static_cast<int64_t>(files_.size());
    s.disk_bytes = files_total_;
  }
  return s;
}

void PromptCache::refuse(const std::string& file, const std::string& why) {
  log(message("refused ", file, ": ", why, "; its tokens are computed again"));
  ::unlinkat(dir_fd_, file.c_str(), 0);  // a link goes, never what it points to
  std::lock_guard lock(stats_mutex_);
  ++stats_.disk_refused;
}

std::shared_ptr<const std::vector<std::byte>> PromptCache::read_file(const Digest& name, std::span<const int32_t> prefix) {
  const std::string file = file_name(name);
  const auto forget = [&] {
    std::lock_guard lock(disk_mutex_);
    if (const auto it = files_.find(name); it != files_.end()) {
      files_total_ -= it->second.bytes;
      files_.erase(it);
    }
  };
  // O_NONBLOCK: a FIFO planted under the name does not block the open; O_NOFOLLOW: nor is a link followed.
  const int fd = ::openat(dir_fd_, file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    forget();
    if (err != ENOENT) refuse(file, err == ELOOP ? "a symbolic link" : errno_text(err));
    return nullptr;
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  const uint64_t want = image_bytes(format_, prefix.size());
  std::string why;
  if (::fstat(fd, &st) != 0) why = errno_text(errno);
  else if (!S_ISREG(st.st_mode)) why = "not a regular file";
  else if (static_cast<uint64_t>(st.st_size) != want) why = message("truncated or another format: ", st.st_size, " bytes, expected ", want);
  std::shared_ptr<std::vector<std::byte>> bytes;
  if (why.empty()) {
    try {
      bytes = std::make_shared<std::vector<std::byte>>(want);
    } catch (const std::bad_alloc&) {
      log(message("out of memory reading ", file));
      return nullptr;
    }
    for (uint64_t at = 0; at < want && why.empty();) {
      const ssize_t n = ::pread(fd, bytes->data() + at, want - at, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) why = errno_text(errno);
      else if (n == 0) why = message("truncated while read: ", at, " bytes, expected ", want);
      else at += static_cast<uint64_t>(n);
    }
  }
  if (why.empty()) why = check_image(*bytes, format_, prefix);
  if (!why.empty()) {
    forget();
    refuse(file, why);
    return nullptr;
  }
  ::futimens(fd, nullptr);  // its mtime says when it was last used: the order of deletion, across restarts
  {
    std::lock_guard lock(disk_mutex_);
    auto [it, added] = files_.try_emplace(name, DiskFile{static_cast<int64_t>(want), 0});
    if (added) files_total_ += static_cast<int64_t>(want);  // written by another server
    it->second.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  }
  std::lock_guard lock(stats_mutex_);
  stats_.disk_bytes_read += static_cast<int64_t>(want);
  return bytes;
}

void PromptCache::queue_write(const Digest& name, std::shared_ptr<const std::vector<std::byte>> bytes) {
  const auto size = static_cast<int64_t>(bytes->size());
  {
    std::lock_guard lock(disk_mutex_);
    if (size > options_.dir_max_bytes) return;  // one block over the limit: never on disk
    if (queued_bytes_ + size > options_.write_queue_bytes) {
      std::lock_guard slock(stats_mutex_);
      if (stats_.disk_write_failures++ == 0) log("the writer is behind: blocks are skipped (not written)");
      return;
    }
    queued_bytes_ += size;
    writes_.push_back({name, std::move(bytes)});
  }
  queued_.notify_one();
}

void PromptCache::writer() {
  for (;;) {
    Write w;
    {
      std::unique_lock lock(disk_mutex_);
      queued_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
      if (writes_.empty()) return;  // stopping, and everything queued is written
      w = std::move(writes_.front());
      writes_.pop_front();
      queued_bytes_ -= static_cast<int64_t>(w.bytes->size());
      if (files_.count(w.name)) continue;
    }
    write_file(w);
  }
}

void PromptCache::write_file(const Write& w) {
  const std::string file = file_name(w.name);
  const std::string temp = message(kTempPrefix, hex(w.name).substr(0, 16), "-", ::getpid(), "-", ++temp_counter_);
  const std::vector<std::byte>& bytes = *w.bytes;
  std::string why;
  const int fd = ::openat(dir_fd_, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = errno_text(errno);
  } else {
    for (size_t at = 0; at < bytes.size() && why.empty();) {
      const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) why = errno_text(n < 0 ? errno : EIO);
      else at += static_cast<size_t>(n);
    }
    if (why.empty() && ::fsync(fd) != 0) why = errno_text(errno);  // complete on disk before its name exists
    if (::close(fd) != 0 && why.empty()) why = errno_text(errno);
    if (why.empty() && ::renameat(dir_fd_, temp.c_str(), dir_fd_, file.c_str()) != 0) why = errno_text(errno);
  }
  if (!why.empty()) {
    if (fd >= 0) ::unlinkat(dir_fd_, temp.c_str(), 0);
    std::lock_guard lock(stats_mutex_);
    // Logged the first time and then every 100th: a full disk fails every write.
    if (stats_.disk_write_failures++ % 100 == 0) log(message("could not write ", file, ": ", why, " (skipped)"));
    return;
  }
  {
    std::lock_guard lock(stats_mutex_);
    stats_.disk_bytes_written += static_cast<int64_t>(bytes.size());
  }
  std::lock_guard lock(disk_mutex_);
  const auto [it, added] = files_.try_emplace(w.name, DiskFile{static_cast<int64_t>(bytes.size()), 0});
  if (added) files_total_ += it->second.bytes;
  it->second.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  if (files_total_ > options_.dir_max_bytes) trim_dir(options_.dir_max_bytes);
}

void PromptCache::scan_dir() {
  files_.clear();
  files_total_ = 0;
  const int fd = ::dup(dir_fd_);
  if (fd < 0) return;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return;
  }
  ::rewinddir(d);
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    struct stat st {};
    if (::fstatat(dir_fd_, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    Digest digest;
    if (parse_name(name, digest)) {
      files_[digest] = {static_cast<int64_t>(st.st_size), mtime_ns(st)};
      files_total_ += static_cast<int64_t>(st.st_size);
    } else if (name.starts_with(kTempPrefix) &&
               now - mtime_ns(st) > std::chrono::duration_cast<std::chrono::nanoseconds>(kStaleTemp).count()) {
      ::unlinkat(dir_fd_, e->d_name, 0);
    }
  }
  ::closedir(d);
}

void PromptCache::trim_dir(int64_t max_bytes) {
  if (files_total_ <= max_bytes) return;
  scan_dir();  // another server may have written or deleted files: the directory as it is now
  std::vector<std::pair<int64_t, Digest>> order;
  for (const auto& [name, f] : files_) order.emplace_back(f.mtime_ns, name);
  std::sort(order.begin(), order.end());
  int64_t evicted = 0;
  for (const auto& [mtime, name] : order) {
    if (files_total_ <= max_bytes) break;
    ::unlinkat(dir_fd_, file_name(name).c_str(), 0);
    files_total_ -= files_[name].bytes;
    files_.erase(name);
    ++evicted;
  }
  std::lock_guard lock(stats_mutex_);
  stats_.disk_evicted += evicted;
}

}  // namespace mhsa::serve
