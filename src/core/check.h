// core/check.h — argument validation helpers shared by every public entry point.
//
// Each throws mhsa::Error with "<function>: <argument>: expected <what>, got <what>". They are
// for the API boundary only; kernels below it trust their inputs. Not public.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/tensor.h"

namespace mhsa::detail {

[[noreturn]] void fail(std::string_view fn, std::string_view arg, const std::string& expected,
                       const std::string& given);

template <class T>
std::string strides_string(const View<T>& v) {
  std::string s = "[";
  for (int i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.stride[i]);
  return s + "]";
}

// A defined view with `ndim` dimensions (named like "[B, Hq, Tq, D]"), non-negative sizes and
// data when it holds elements.
template <class T>
void check_tensor(std::string_view fn, std::string_view arg, const View<T>& v, int ndim,
                  std::string_view dims) {
  if (!v.defined() || v.ndim != ndim)
    fail(fn, arg, message("a ", ndim, "-D tensor ", dims),
         v.defined() ? message(v.ndim, "-D ", shape_string(v)) : std::string("no tensor"));
  for (int i = 0; i < v.ndim; ++i)
    if (v.shape[i] < 0) fail(fn, arg, "non-negative sizes", shape_string(v));
  if (v.numel() > 0 && v.data == nullptr) fail(fn, arg, "data for " + shape_string(v), "a null pointer");
}

// v.shape[axis] == expected; `what` says where the expected value comes from ("B, as q").
template <class T>
void check_dim(std::string_view fn, std::string_view arg, const View<T>& v, int axis,
               int64_t expected, std::string_view what) {
  if (v.shape[axis] != expected)
    fail(fn, message(arg, ".shape[", axis, "]"), message(expected, " (", what, ")"),
         std::to_string(v.shape[axis]));
}

// An output must not have two index tuples aliasing one element (races, lost results).
void check_no_self_overlap(std::string_view fn, std::string_view arg, const TensorView& v);

}  // namespace mhsa::detail
