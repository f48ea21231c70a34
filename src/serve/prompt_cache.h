// serve/prompt_cache.h — the server's prompt cache: full KV blocks kept past the live pool
// (mhsa/kv_pool.h), in RAM under a budget and, with a directory, in files that outlive the server.
// A block is named by a hash chain: SHA-256 of the model's identity and the block format (the
// chain's root), then of the previous block's name and the block's tokens, so one name stands for
// the whole prefix up to the block's end. Each kept block is one "block image": a header (magic,
// version, the model's identity, the pool's geometry and KV type), every token of the prefix it
// ends, its bytes as the pool holds them, and an XXH64 checksum of all that — the same image in
// RAM and as a file, so writing one is copying it and reading one back checks everything before a
// byte of it reaches the pool. A file that is not exactly what the prompt asks for (truncated,
// another model, another KV type or block size, other tokens, a bad checksum) is refused, logged,
// deleted, and its tokens are prefilled again.
//
// RAM: least recently used images go first when the budget is exceeded (a prefix's later blocks
// before its earlier ones: a chain is touched from its end). Disk: files are written by a thread of
// their own (a temporary file in the directory, fsync'd, renamed into place; a failure is logged
// and the block skipped), their total kept under a limit by deleting the least recently used
// (each hit renews a file's mtime, so the order survives a restart). The directory is opened once
// and every file is reached relative to it without following links (O_NOFOLLOW): a link planted in
// it is refused, never read or written through; the directory must be the user's own and writable
// by no one else. Two servers may share a directory: a name is the same content for both, a
// rename is atomic, and a file deleted by the other is a miss.
//
// Not thread-safe but for stats() and the writer: one owner (the scheduler's thread) calls keep
// and restore. Internal (not installed).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "mhsa/kv_pool.h"
#include "serve/block_image.h"

namespace mhsa::serve {

// The identity of a model as loaded: SHA-256 of the path (made absolute), the name, size and
// mtime (ns) of the file, or of each regular file directly in the directory, and `extra` (the
// weight type, ...). Stat calls only: cheap at start-up. Throws mhsa::Error when the path cannot be read.
Digest model_identity(const std::filesystem::path& model, std::string_view extra);
// The format of the pool's blocks, for the model of that identity.
BlockFormat block_format(const KVBlockPool& pool, const Digest& model);

struct PromptCacheOptions {
  int64_t ram_bytes = 0;            // the RAM tier's budget (images' bytes); 0: none kept in RAM
  std::filesystem::path dir;        // empty: no files
  int64_t dir_max_bytes = int64_t{4} << 30;  // the files' total at most
  Digest model{};                   // model_identity()
  // Written but not yet on disk at most (beyond it new writes are skipped): the writer is behind.
  int64_t write_queue_bytes = int64_t{512} << 20;
};

struct PromptCacheStats {
  int64_t ram_hits = 0, ram_blocks = 0, ram_tokens = 0;     // requests served from RAM, blocks, tokens
  int64_t disk_hits = 0, disk_blocks = 0, disk_tokens = 0;  // the same from files
  int64_t disk_bytes_read = 0, disk_bytes_written = 0;
  int64_t disk_refused = 0;         // files refused (corrupt, truncated, another model, ...)
  int64_t disk_write_failures = 0;  // writes that failed (full disk, ...) or were skipped (queue full)
  int64_t disk_evicted = 0;         // files deleted to stay under dir_max_bytes
  int64_t ram_evicted = 0;          // images dropped to stay under ram_bytes
  int64_t ram_images = 0, ram_bytes = 0;    // now
  int64_t disk_files = 0, disk_bytes = 0;   // now, as this server sees the directory
};

// Blocks a restore took from each tier.
struct Restored {
  int64_t ram = 0, disk = 0;
};

class PromptCache {
 public:
  // Opens (creating it when missing, mode 0700) the directory and lists its files; throws
  // mhsa::Error naming --cache-dir when it is not a directory, is another user's, or is writable
  // by others.
  PromptCache(PromptCacheOptions options, const KVBlockPool& pool);
  ~PromptCache();  // writes what is queued, then stops the writer
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // Keeps s's first `blocks` blocks (full ones holding tokens[0, blocks·block_tokens)): those not
  // kept already are copied into images (RAM, and queued for a file); those kept are renewed.
  void keep(KVBlockPool& pool, const PagedSequence& s, std::span<const int32_t> tokens, int64_t blocks);
  // Extends s (its blocks so far hold tokens' beginning; whole blocks) by the kept blocks that
  // continue it, at most to max_blocks blocks: each taken from s's promise (pool.grow) and filled
  // from RAM, else from its file; stops at the first block kept nowhere. s.length is updated.
  Restored restore(KVBlockPool& pool, PagedSequence& s, std::span<const int32_t> tokens, int64_t max_blocks);
  PromptCacheStats stats() const;

 private:
  struct Image {
    std::shared_ptr<const std::vector<std::byte>> bytes;
    uint64_t tick = 0;
  };
  struct Write {
    Digest name;
    std::shared_ptr<const std::vector<std::byte>> bytes;
  };
  struct DiskFile {
    int64_t bytes = 0;
    int64_t mtime_ns = 0;
  };
  // The names of blocks [0, n) of tokens: names[i] is the chain up to block i's end.
  std::vector<Digest> chain(std::span<const int32_t> tokens, int64_t n) const;
  void put_ram(const Digest& name, std::shared_ptr<const std::vector<std::byte>> bytes);
  void touch_ram(const Digest& name);
  // The image of `name` from its file, checked against prefix; null when there is none or it is refused.
  std::shared_ptr<const std::vector<std::byte>> read_file(const Digest& name, std::span<const int32_t> prefix);
  void queue_write(const Digest& name, std::shared_ptr<const std::vector<std::byte>> bytes);
  void writer();
  void write_file(const Write& w);
  void scan_dir();                   // (under disk_mutex_) the files as the directory has them now
  void trim_dir(int64_t max_bytes);  // (under disk_mutex_) deletes the least recently used past max_bytes
  void refuse(const std::string& file, const std::string& why);

  const PromptCacheOptions options_;
  const BlockFormat format_;
  Digest root_{};  // the chain's root: the format's hash

  // RAM tier (the owner's thread).
  std::map<Digest, Image> ram_;
  std::map<uint64_t, Digest> ram_lru_;  // tick → name
  uint64_t tick_ = 0;
  int64_t ram_total_ = 0;

  // Disk tier: the directory, its files as this server knows them, the write queue.
  int dir_fd_ = -1;
  mutable std::mutex disk_mutex_;
  std::condition_variable queued_;
  std::map<Digest, DiskFile> files_;
  int64_t files_total_ = 0;
  std::deque<Write> writes_;
  int64_t queued_bytes_ = 0;
  bool stopping_ = false;
  uint64_t temp_counter_ = 0;
  std::thread writer_;

  mutable std::mutex stats_mutex_;
  PromptCacheStats stats_;
};

}  // namespace mhsa::serve
