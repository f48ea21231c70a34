// python/src/bind_model.cpp — placeholder.
#include <pybind11/pybind11.h>
namespace mhsa::python { void bind_model(pybind11::module_&) {} }
