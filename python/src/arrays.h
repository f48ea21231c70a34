// python/src/arrays.h — NumPy arrays in and out of the library's views, with the checks a Python
// caller needs (dtype, dimensionality) phrased like the library's own errors. Not a general
// converter: float32 in, float32 out; integer lengths; bool masks become additive -inf masks.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/cpu.h"
#include "mhsa/tensor.h"

namespace mhsa::python {

namespace py = pybind11;

// Releases the GIL while the library runs, and caps the calling thread's OpenMP thread count
// first: OpenMP keeps that count per thread, and a Python thread other than the one that imported
// mhsa would otherwise start OMP_NUM_THREADS=100000 threads (the import already warned).
struct GilReleased {
  GilReleased() { (void)cpu::limit_threads(); }
  py::gil_scoped_release release;
};

// A float32 array held alive together with its view. Arrays whose strides are not a multiple of
// 4 bytes are copied; any other strides are viewed in place.
struct InputArray {
  py::array array;
  ConstTensorView view;
};

// `obj` as a float32 array of `ndim` dimensions, `dims` naming them ("[B, Hq, Tq, D]").
InputArray float_array(py::handle obj, std::string_view fn, std::string_view arg, int ndim, std::string_view dims);
// An additive float32 mask, or a bool mask (True = attend, as PyTorch) turned into 0 / -inf.
InputArray mask_array(py::handle obj, std::string_view fn);
// A 1-D array or sequence of integers.
std::vector<int64_t> int_vector(py::handle obj, std::string_view fn, std::string_view arg);

// A new C-contiguous float32 array and a view of it.
struct OutputArray {
  py::array_t<float> array;
  TensorView view;
};
// `what` ("<function>: <argument>") names it when the size overflows (mhsa.Error); NumPy raises
// MemoryError when it cannot be allocated.
OutputArray new_array(const std::vector<int64_t>& dims, std::string_view what);
// Moves the tensor into a NumPy array without copying.
py::array to_numpy(Tensor&& t);
// A NumPy view of a tensor owned by `owner` (kept alive by the array).
py::array view_of(const Tensor& t, py::handle owner, bool writeable);
py::array view_of(const ConstTensorView& v, py::handle owner, bool writeable);

}  // namespace mhsa::python
