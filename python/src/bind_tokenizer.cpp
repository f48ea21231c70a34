// python/src/bind_tokenizer.cpp — placeholder.
#include <pybind11/pybind11.h>
namespace mhsa::python { void bind_tokenizer(pybind11::module_&) {} }
