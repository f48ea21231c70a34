// core/error.cpp — validation helpers behind core/check.h.
#include <algorithm>
#include <cstdlib>
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

}  // namespace mhsa::detail
