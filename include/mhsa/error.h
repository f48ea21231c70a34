// mhsa/error.h — the exception types the library throws.
//
// Every public entry point validates its arguments and throws mhsa::Error with a message that
// names the argument, what was expected and what was given. A file the caller asked the library
// to write that cannot be written (a full disk, a file-size limit, a read-only directory) is an
// mhsa::WriteError, an Error that also carries the system's errno: the file's previous contents,
// if any, are then left as they were. The library never calls exit or abort. Not an error-code
// mechanism: errors are exceptional, results are return values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mhsa {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class WriteError : public Error {
 public:
  WriteError(const std::string& what, int os_error) : Error(what), os_error_(os_error) {}
  // The errno of the failed call (ENOSPC, EFBIG, EACCES, ...).
  int os_error() const noexcept { return os_error_; }

 private:
  int os_error_;
};

namespace detail {
// Concatenates streamable pieces into one message (g++ 12 has no <format>).
template <class... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace mhsa
