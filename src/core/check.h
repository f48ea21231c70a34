// core/check.h — argument validation helpers shared by every public entry point.
//
// Each throws mhsa::Error with "<function>: <argument>: expected <what>, got <what>". They are
// for the API boundary only; kernels below it trust their inputs. Not public.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/tensor.h"

namespace mhsa::detail {

[[noreturn]] void fail(std::string_view fn, std::string_view arg, const std::string& expected,
                       const std::string& given);

// ---- sizes of buffers ------------------------------------------------------------------------
// Every buffer the library sizes from caller-given dimensions (Tensor, KVCache, GPT-2 configs,
// training batches, ...) is counted here, so that no product of sizes wraps around into a small
// buffer that is then written past its end. `what` names the buffer as "<function>: <argument>".

// The bytes of `dims` (each >= 0) elements of elem_bytes, or -1 when that overflows or exceeds
// what one object may span (PTRDIFF_MAX bytes).
inline int64_t bytes_of(std::span<const int64_t> dims, int64_t elem_bytes) noexcept {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return 0;
  int64_t bytes = elem_bytes;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(bytes, d, &bytes)) return -1;
  return bytes <= PTRDIFF_MAX ? bytes : -1;
}
// The number of elements of `dims` (each >= 0). Throws mhsa::Error, "<what>: expected a size that
// fits in memory (at most PTRDIFF_MAX bytes), got [dims] = N bytes", when the product of the dims
// times elem_bytes overflows or exceeds what one object may span (PTRDIFF_MAX bytes).
int64_t checked_count(std::string_view what, std::span<const int64_t> dims, int64_t elem_bytes);
inline int64_t checked_count(std::string_view what, std::initializer_list<int64_t> dims, int64_t elem_bytes) {
  return checked_count(what, std::span<const int64_t>(dims.begin(), dims.size()), elem_bytes);
}
// The mhsa::Error for an allocation the system refused (std::bad_alloc): "<what>: expected N bytes
// of free memory for [dims], got out of memory".
[[noreturn]] void out_of_memory(std::string_view what, std::span<const int64_t> dims, int64_t elem_bytes);
// The machine's RAM (1 GiB where it cannot be read).
std::size_t physical_memory_bytes();
// Memory a new allocation can have now without swapping: Linux's MemAvailable (/proc/meminfo),
// else the RAM.
std::size_t available_memory_bytes();
// "17179869184 bytes (16 GiB)"; sizes beyond int64 in scientific notation.
std::string bytes_string(long double bytes);

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
  const std::span<const int64_t> shape(v.shape.data(), static_cast<size_t>(v.ndim));
  if (bytes_of(shape, 1) < 0) checked_count(message(fn, ": ", arg), shape, 1);  // throws: numel() would overflow
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
