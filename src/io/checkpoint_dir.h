// io/checkpoint_dir.h — a model directory that one process writes checkpoints into while others
// read it (`mhsa train --out DIR` while `mhsa generate --model DIR` runs). Not public.
//
// Readers (Gpt2::load, Tokenizer::load_dir) hold a shared flock(2) on the directory itself while
// they open its files; the writer renames a checkpoint's staged files into place under the
// exclusive lock (swap_in), so a reader opens all the old files or all the new ones, never some
// of each. A writer also claims the directory for its whole run (WriterClaim: DIR/train.lock), so
// that two never write into one directory, and removes the temporaries a killed writer left.
// Not a general lock manager: advisory locks on one machine (where a file system does not support
// flock, readers, swaps and claims go on unlocked, as they did before these locks).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mhsa::detail {

// flock(2) on a directory for this object's lifetime; blocks until granted. Best effort: a
// directory that cannot be opened or locked is read unlocked (the caller's own open then reports
// what is wrong with it).
class DirLock {
 public:
  enum class Mode { shared, exclusive };
  DirLock(const std::filesystem::path& dir, Mode mode);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// An exclusive flock on dir/train.lock held for one writer's run; the file holds the writer's pid
// and is removed when the claim ends (any orderly end: a finished run, an error; a killed one
// leaves it, and a later claim reuses it). Removing a lock file races with a process that opened
// it before the removal and locks it after: a claim therefore holds only a lock won on the file
// still at the path, and tries again otherwise. Throws mhsa::Error ("<fn>: <arg>: ...") naming
// the directory and the holder's pid when another process (or another claim in this one) holds it.
class WriterClaim {
 public:
  WriterClaim(const std::filesystem::path& dir, std::string_view fn, std::string_view arg);
  ~WriterClaim();
  WriterClaim(const WriterClaim&) = delete;
  WriterClaim& operator=(const WriterClaim&) = delete;

 private:
  std::filesystem::path file_;
  int fd_ = -1;
  bool held_ = false;  // the lock is ours (not where the file system has no flock)
};

// Creates dir (and its parents) and a probe file in it, then removes the probe: throws mhsa::Error
// ("<fn>: <arg>: expected a writable directory, got '<dir>' (<why>)") when either fails.
void check_writable(const std::filesystem::path& dir, std::string_view fn, std::string_view arg);

// A staged file's name in dir for this process: "<name>.tmp.<pid>".
std::filesystem::path staged_name(const std::filesystem::path& dir, const std::string& name);

// Removes the files "<name>.tmp" and "<name>.tmp.<anything>" in dir for each of `names`: what a
// writer killed mid-checkpoint left. Only for the holder of the WriterClaim (any such file is then
// stale: no other writer can be staging).
void remove_temporaries(const std::filesystem::path& dir, const std::vector<std::string>& names);

// Under the directory's exclusive DirLock: removes the files named in `obsolete` (absent ones are
// fine), then renames each staged file onto its name in dir, in order. A crash part-way leaves
// some files replaced: callers put the file that makes the directory a model (config.json) last,
// and in `obsolete` when the new files need not match the old ones.
void swap_in(const std::filesystem::path& dir, const std::vector<std::string>& obsolete,
             const std::vector<std::pair<std::filesystem::path, std::string>>& staged, std::string_view fn);

}  // namespace mhsa::detail
