// mhsa/error.h — the one exception type the library throws.
//
// Every public entry point validates its arguments and throws mhsa::Error with a message that
// names the argument, what was expected and what was given. The library never calls exit or
// abort. Not an error-code mechanism: errors are exceptional, results are return values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mhsa {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
