// apps/mhsa/serve_http.h — the connection plumbing of `mhsa serve` around cpp-httplib: a task
// queue with a thread per connection, and the access log's writer and formatting helpers. Not the
// endpoints (serve_cmd.cpp) nor the API's JSON (serve_api.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <httplib.h>

namespace mhsa::cli {

// cpp-httplib gives each connection a thread of its task queue until the connection closes, and a
// connection holds it while httplib waits for its bytes (up to the read timeout between two reads:
// a client that trickles its headers holds it as long as it trickles). A fixed pool of 256 let 900
// connections that sent only their headers delay a request by 11.6 s, 900 trickling ones by 60 s
// (bench/serve_slow_clients.py); so a thread per connection, started as connections come, up to
// kMaxHttpThreads (then they queue). Idle threads cost address space, not memory, and are kept.
constexpr size_t kMaxHttpThreads = 4096;

// A thread per connection (see kMaxHttpThreads): a task waits only when every thread is busy and
// there are kMaxHttpThreads of them.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;  // after the last enqueue: runs what is queued, joins every thread

 private:
  void work();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// Access-log lines, written by a thread of their own so that a stderr that blocks (a full pipe)
// holds back that thread and not the HTTP threads; past kBacklog lines waiting, lines are dropped
// and the count written when it catches up.
class AccessLog {
 public:
  explicit AccessLog(bool on);  // off: add is never called, no thread
  ~AccessLog();                 // writes what is queued, then stops
  bool on() const { return writer_.joinable(); }
  void add(std::string line);  // one line, with its newline

 private:
  static constexpr size_t kBacklog = 4096;
  void write_lines();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::string> lines_;
  int64_t dropped_ = 0;
  bool stopping_ = false;
  std::thread writer_;
};

// A request target or method as the log writes it: printable ASCII, no spaces, at most 200 bytes.
std::string loggable(std::string_view s);
// The UTC time as 2026-12-07T11:40:00.123Z.
std::string utc_now();

}  // namespace mhsa::cli
