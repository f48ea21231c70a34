// apps/mhsa/serve_http.cpp — see serve_http.h.
#include "serve_http.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

#include "core/check.h"

namespace mhsa::cli {

void ConnectionThreads::enqueue(std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  tasks_.push_back(std::move(fn));
  // idle_ counts threads not yet woken for earlier tasks too: a new thread whenever the waiting
  // threads are fewer than the tasks.
  if (idle_ < tasks_.size() && threads_.size() < kMaxHttpThreads)
    threads_.emplace_back([this] { work(); });
  else
    wake_.notify_one();
}

void ConnectionThreads::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();  // threads_ no longer grows: no enqueue after shutdown
}

void ConnectionThreads::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    ++idle_;
    wake_.wait(lock, [this] { return !tasks_.empty() || stopping_; });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

AccessLog::AccessLog(bool on) {
  if (on) writer_ = std::thread([this] { write_lines(); });
}

AccessLog::~AccessLog() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

void AccessLog::add(std::string line) {
  {
    std::lock_guard lock(mutex_);
    if (lines_.size() >= kBacklog) {
      ++dropped_;
      return;
    }
    lines_.push_back(std::move(line));
  }
  wake_.notify_one();
}

void AccessLog::write_lines() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return !lines_.empty() || stopping_; });
    if (lines_.empty()) return;
    std::deque<std::string> batch;
    batch.swap(lines_);
    const int64_t dropped = std::exchange(dropped_, 0);
    lock.unlock();
    std::string text;
    if (dropped > 0)
      text += detail::message("mhsa serve: ", dropped, " access-log lines dropped (stderr was not keeping up)\n");
    for (const std::string& line : batch) text += line;
    std::fwrite(text.data(), 1, text.size(), stderr);  // one write per batch: lines never interleave
    lock.lock();
  }
}

std::string loggable(std::string_view s) {
  std::string out;
  static const char hex[] = "0123456789ABCDEF";
  for (const char c : s.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u > 0x20 && u < 0x7f && c != '%' && c != '"')
      out += c;
    else
      out += {'%', hex[u >> 4], hex[u & 15]};
  }
  return s.size() > 200 ? out + "..." : out;
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

}  // namespace mhsa::cli
