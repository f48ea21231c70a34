// core/error.cpp — validation helpers behind core/check.h.
#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/check.h"

namespace mhsa::detail {

void fail(std::string_view fn, std::string_view arg, const std::string& expected,
          const std::string& given) {
  throw Error(message(fn, ": ", arg, ": expected ", expected, ", got ", given));
}

void check_no_self_overlap(std::string_view fn, std::string_view arg, const TensorView& v) {
  // Sufficient condition: ordered by |stride|, every stride steps past the whole span of the
  // smaller ones. Dimensions of size 1 never alias.
  if (v.numel() == 0) return;  // nothing to alias
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  for (int i = 0; i < v.ndim; ++i)
    if (v.shape[i] > 1) dims.emplace_back(std::llabs(v.stride[i]), v.shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < span)
      fail(fn, arg, "strides that do not overlap",
           message("shape ", shape_string(v), " with strides ", strides_string(v)));
    span = stride * size;
  }
}

namespace {
std::string dims_string(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}
}  // namespace

std::string bytes_string(long double bytes) {
  std::ostringstream os;
  if (bytes > static_cast<long double>(PTRDIFF_MAX)) {
    os << std::setprecision(3) << static_cast<double>(bytes) << " bytes";
    return os.str();
  }
  os << static_cast<int64_t>(bytes) << " bytes";
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes >= 1024) {
    int unit = -1;
    while (bytes >= 1024 && unit < 5) bytes /= 1024, ++unit;
    os << " (" << std::setprecision(3) << static_cast<double>(bytes) << " " << kUnits[unit] << ")";
  }
  return os.str();
}

int64_t checked_count(std::string_view what, std::span<const int64_t> dims, int64_t elem_bytes) {
  const int64_t bytes = bytes_of(dims, elem_bytes);
  if (bytes < 0) {
    long double exact = static_cast<long double>(elem_bytes);
    for (int64_t d : dims) exact *= static_cast<long double>(d);
    throw Error(message(what, ": expected a size that fits in memory (at most ", bytes_string(PTRDIFF_MAX), "), got ",
                        dims_string(dims), " = ", bytes_string(exact)));
  }
  return bytes / elem_bytes;
}

void out_of_memory(std::string_view what, std::span<const int64_t> dims, int64_t elem_bytes) {
  const int64_t bytes = bytes_of(dims, elem_bytes);
  throw Error(message(what, ": expected ", bytes_string(static_cast<long double>(bytes)), " of free memory for ",
                      dims_string(dims), ", got out of memory"));
}

}  // namespace mhsa::detail
