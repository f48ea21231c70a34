// python/src/arrays16.h — 16-bit float NumPy arrays (float16, and ml_dtypes' bfloat16, known by its
// dtype name so that ml_dtypes is not needed to build) in and out of mhsa's bfloat16 / float16
// views, for the attention entry points. Strides are kept (a view in place) unless they are not
// whole elements.
#pragma once

#include <string_view>
#include <vector>

#include "arrays.h"

namespace mhsa::python {

enum class Precision { f32, bf16, f16 };

// The element type `obj` would be read as: f16 or bf16 for NumPy arrays of those dtypes, f32 for
// anything else (float_array then accepts or names it).
Precision precision_of(py::handle obj);

template <class T>
struct HalfInput {
  py::array array;
  View<const T> view;
};
// `obj` as an array of `ndim` dimensions with exactly `dtype` (the first input's), `dims` naming them.
template <class T>
HalfInput<T> half_array(py::handle obj, std::string_view fn, std::string_view arg, int ndim, std::string_view dims,
                        const py::dtype& dtype);

template <class T>
struct HalfOutput {
  py::array array;
  View<T> view;
};
// A new C-contiguous array of `dtype` (2-byte elements); `what` names it when the size overflows.
template <class T>
HalfOutput<T> new_half_array(const std::vector<int64_t>& dims, const py::dtype& dtype, std::string_view what);

}  // namespace mhsa::python
