// python/src/arrays.cpp — NumPy <-> view conversions (see arrays.h).
#include "arrays.h"

#include <limits>

#include "core/check.h"
#include "mhsa/error.h"

namespace mhsa::python {
namespace {

[[noreturn]] void fail(std::string_view fn, std::string_view arg, const std::string& expected,
                       const std::string& given) {
  throw Error(detail::message(fn, ": ", arg, ": expected ", expected, ", got ", given));
}

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

py::array as_array(py::handle obj, std::string_view fn, std::string_view arg, const std::string& wanted) {
  if (obj.is_none()) fail(fn, arg, wanted, "None");
  // NumPy would turn a str into a 0-D string array: name what was really given instead.
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) || py::isinstance<py::dict>(obj))
    fail(fn, arg, wanted, "an object of type " + type_name(obj));
  py::array arr = py::array::ensure(obj);
  if (!arr) {
    PyErr_Clear();
    fail(fn, arg, wanted, "an object of type " + type_name(obj));
  }
  return arr;
}

std::string dtype_name(const py::array& arr) { return py::str(arr.dtype()); }

ConstTensorView view_of_array(const py::array& arr) {
  ConstTensorView v;
  v.data = static_cast<const float*>(arr.data());
  v.ndim = static_cast<int>(arr.ndim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = arr.shape(i);
    v.stride[i] = arr.strides(i) / static_cast<py::ssize_t>(sizeof(float));
  }
  return v;
}

InputArray checked_float(py::array arr, std::string_view fn, std::string_view arg) {
  if (!arr.dtype().is(py::dtype::of<float>())) {
    // Never converted silently (float64 halved in precision, integers made floats): NumPy's default
    // dtype is float64 (np.random.randn, np.array([1.0])), so the message says how to convert.
    const char kind = arr.dtype().kind();
    const std::string how = kind == 'f' || kind == 'i' || kind == 'u'
                                ? detail::message(" (", arg, ".astype(numpy.float32) converts it; .float() a torch tensor)")
                                : "";
    fail(fn, arg, "dtype float32", "dtype " + dtype_name(arr) + how);
  }
  for (py::ssize_t i = 0; i < arr.ndim(); ++i)
    if (arr.strides(i) % static_cast<py::ssize_t>(sizeof(float)) != 0) {
      arr = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr);
      break;
    }
  return {arr, view_of_array(arr)};
}

}  // namespace

InputArray float_array(py::handle obj, std::string_view fn, std::string_view arg, int ndim, std::string_view dims) {
  const std::string wanted = detail::message("a ", ndim, "-D float32 array ", dims);
  py::array arr = as_array(obj, fn, arg, wanted);
  if (arr.ndim() != ndim) fail(fn, arg, wanted, detail::message(arr.ndim(), "-D array"));
  return checked_float(std::move(arr), fn, arg);
}

InputArray mask_array(py::handle obj, std::string_view fn) {
  const std::string wanted = "a 2-D to 4-D float32 or bool array";
  py::array arr = as_array(obj, fn, "attn_mask", wanted);
  if (arr.ndim() < 2 || arr.ndim() > 4) fail(fn, "attn_mask", wanted, detail::message(arr.ndim(), "-D array"));
  if (arr.dtype().kind() == 'b') {
    py::module_ np = py::module_::import("numpy");
    arr = np.attr("where")(arr, 0.0f, -std::numeric_limits<float>::infinity()).attr("astype")("float32");
  }
  return checked_float(std::move(arr), fn, "attn_mask");
}

std::vector<int64_t> int_vector(py::handle obj, std::string_view fn, std::string_view arg) {
  const std::string wanted = "a 1-D sequence of integers";
  py::array arr = as_array(obj, fn, arg, wanted);
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u') fail(fn, arg, wanted, "dtype " + dtype_name(arr));
  if (arr.ndim() != 1) fail(fn, arg, wanted, detail::message(arr.ndim(), "-D array"));
  auto ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  if (kind == 'u') {  // values above INT64_MAX would wrap to negative lengths: name them instead
    const auto big = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    for (py::ssize_t i = 0; i < big.size(); ++i)
      if (big.data()[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(fn, detail::message(arg, "[", i, "]"), "a value that fits in int64", std::to_string(big.data()[i]));
  }
  return {ints.data(), ints.data() + ints.size()};
}

OutputArray new_array(const std::vector<int64_t>& dims, std::string_view what) {
  detail::checked_count(what, dims, sizeof(float));
  py::array_t<float> arr(std::vector<py::ssize_t>(dims.begin(), dims.end()));
  return {arr, TensorView(arr.mutable_data(), dims)};
}

py::array to_numpy(Tensor&& t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  return view_of(*owned, free_when_done, true);
}

py::array view_of(const ConstTensorView& v, py::handle owner, bool writeable) {
  std::vector<py::ssize_t> shape, strides;
  for (int i = 0; i < v.ndim; ++i) {
    shape.push_back(v.shape[i]);
    strides.push_back(v.stride[i] * static_cast<py::ssize_t>(sizeof(float)));
  }
  py::array arr(py::dtype::of<float>(), shape, strides, v.data, owner);
  if (!writeable) arr.attr("setflags")(py::arg("write") = false);
  return arr;
}

py::array view_of(const Tensor& t, py::handle owner, bool writeable) { return view_of(t.view(), owner, writeable); }

}  // namespace mhsa::python
