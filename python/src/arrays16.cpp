// python/src/arrays16.cpp — 16-bit float arrays (see arrays16.h).
#include "arrays16.h"

#include "core/check.h"
#include "mhsa/error.h"

namespace mhsa::python {
namespace {

std::string dtype_name(const py::dtype& d) { return py::str(d); }

bool is_bfloat16(const py::dtype& d) { return d.itemsize() == 2 && dtype_name(d) == "bfloat16"; }
bool is_float16(const py::dtype& d) { return d.kind() == 'f' && d.itemsize() == 2; }

}  // namespace

Precision precision_of(py::handle obj) {
  if (!py::isinstance<py::array>(obj)) return Precision::f32;
  const py::dtype d = py::reinterpret_borrow<py::array>(obj).dtype();
  return is_float16(d) ? Precision::f16 : is_bfloat16(d) ? Precision::bf16 : Precision::f32;
}

template <class T>
HalfInput<T> half_array(py::handle obj, std::string_view fn, std::string_view arg, int ndim, std::string_view dims,
                        const py::dtype& dtype) {
  const std::string wanted = detail::message("a ", ndim, "-D ", dtype_name(dtype), " array ", dims, " (as q)");
  if (!py::isinstance<py::array>(obj))
    throw Error(detail::message(fn, ": ", arg, ": expected ", wanted, ", got an object of type ",
                                std::string(py::str(py::type::of(obj).attr("__name__")))));
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (!arr.dtype().equal(dtype))
    throw Error(detail::message(fn, ": ", arg, ": expected ", wanted, ", got dtype ", dtype_name(arr.dtype())));
  if (arr.ndim() != ndim)
    throw Error(detail::message(fn, ": ", arg, ": expected ", wanted, ", got a ", arr.ndim(), "-D array"));
  for (py::ssize_t i = 0; i < arr.ndim(); ++i)
    if (arr.strides(i) % 2 != 0) {
      arr = py::module_::import("numpy").attr("ascontiguousarray")(arr);
      break;
    }
  View<const T> v;
  v.data = static_cast<const T*>(arr.data());
  v.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    v.shape[i] = arr.shape(i);
    v.stride[i] = arr.strides(i) / 2;
  }
  return {arr, v};
}

template <class T>
HalfOutput<T> new_half_array(const std::vector<int64_t>& dims, const py::dtype& dtype, std::string_view what) {
  detail::checked_count(what, dims, 2);
  py::array arr(dtype, std::vector<py::ssize_t>(dims.begin(), dims.end()));
  return {arr, View<T>(static_cast<T*>(arr.mutable_data()), dims)};
}

template HalfInput<bfloat16> half_array(py::handle, std::string_view, std::string_view, int, std::string_view,
                                        const py::dtype&);
template HalfInput<float16> half_array(py::handle, std::string_view, std::string_view, int, std::string_view,
                                       const py::dtype&);
template HalfOutput<bfloat16> new_half_array(const std::vector<int64_t>&, const py::dtype&, std::string_view);
template HalfOutput<float16> new_half_array(const std::vector<int64_t>&, const py::dtype&, std::string_view);

}  // namespace mhsa::python
