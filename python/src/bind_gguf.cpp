// python/src/bind_gguf.cpp — GGUF files from Python: mhsa.read_gguf (metadata, tensor types and
// shapes, and the tensors as float32 arrays, read and validated as Model.load reads them),
// mhsa.read_gguf_config (the ModelConfig a llama/gpt2 GGUF file gives), mhsa.save_gguf (a Model
// as `mhsa quantize` writes it) and mhsa.model_parameters (a Model's weights, to compare). For
// tests and tools; models load through Model.load.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstring>
#include <filesystem>

#include "arrays.h"
#include "io/gguf.h"
#include "mhsa/model.h"
#include "model/gguf_model.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {

py::dict full_config_dict(const ModelConfig& c);  // bind_weights.cpp

namespace {

using detail::GgufValueType;

py::str text(std::string_view s) {
  return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// One scalar of type t at p.
py::object scalar(GgufValueType t, const uint8_t* p) {
  const auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t) {
    case GgufValueType::u8: return py::int_(get(uint8_t{}));
    case GgufValueType::i8: return py::int_(get(int8_t{}));
    case GgufValueType::u16: return py::int_(get(uint16_t{}));
    case GgufValueType::i16: return py::int_(get(int16_t{}));
    case GgufValueType::u32: return py::int_(get(uint32_t{}));
    case GgufValueType::i32: return py::int_(get(int32_t{}));
    case GgufValueType::u64: return py::int_(get(uint64_t{}));
    case GgufValueType::i64: return py::int_(get(int64_t{}));
    case GgufValueType::f32: return py::float_(get(float{}));
    case GgufValueType::f64: return py::float_(get(double{}));
    default: return py::bool_(*p != 0);
  }
}

constexpr size_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

py::object value(const detail::GgufFile& f, const std::string& key, const detail::GgufValue& v) {
  if (v.type == GgufValueType::string) return text({reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()});
  if (v.type != GgufValueType::array) return scalar(v.type, v.bytes.data());
  py::list out;
  if (v.elem == GgufValueType::string) {
    for (std::string_view s : f.get_strings(key)) out.append(text(s));
  } else {
    for (uint64_t i = 0; i < v.count; ++i) out.append(scalar(v.elem, v.bytes.data() + i * kSizes[static_cast<int>(v.elem)]));
  }
  return out;
}

}  // namespace

void bind_gguf(py::module_& m) {
  m.def(
      "read_gguf",
      [](const std::filesystem::path& path, bool load) {
        const detail::GgufFile f = detail::GgufFile::open(path);
        py::dict metadata, types, shapes, tensors;
        for (const auto& [key, v] : f.metadata()) metadata[text(key)] = value(f, key, v);
        for (const detail::GgufTensorInfo& t : f.tensors()) {
          types[text(t.name)] = detail::gguf_type_name(t.type);
          shapes[text(t.name)] = t.shape();
          if (load) tensors[text(t.name)] = to_numpy(f.load(t));
        }
        return py::dict("version"_a = f.version(), "alignment"_a = f.alignment(), "metadata"_a = metadata,
                        "types"_a = types, "shapes"_a = shapes, "tensors"_a = tensors);
      },
      "path"_a, "load"_a = true,
      R"(A GGUF file read and validated as Model.load reads it: a dict with "version", "alignment",
"metadata" (key → value; arrays as lists), "types" and "shapes" (tensor name → ggml type name,
numpy-order shape) and, with load, "tensors" (name → float32 array, dequantised). A malformed
file raises mhsa.Error naming what is wrong.)");
  m.def(
      "read_gguf_config",
      [](const std::filesystem::path& path) {
        return full_config_dict(detail::GgufModelFile::config_of(detail::GgufFile::open(path)));
      },
      "path"_a, "The ModelConfig a llama or gpt2 GGUF file gives (a dict, as read_model_config).");
  m.def(
      "model_parameters",
      [](const Model& model) {
        py::dict out;
        for (const auto& [name, t] : model.parameters()) out[py::str(name)] = to_numpy(contiguous(t->view()));
        return out;
      },
      "model"_a,
      "Every parameter of a Model by Hugging Face name, as float32 copies (empty for a bf16 model's 16-bit ones).");
  m.def(
      "save_gguf",
      [](const Model& model, const std::filesystem::path& path, const std::string& dtype, bool overwrite,
         const std::filesystem::path& tokenizer_dir) {
        const detail::GgufType type = detail::parse_gguf_type(dtype, "save_gguf: dtype");
        py::gil_scoped_release release;
        detail::save_gguf(model, path, type, overwrite, tokenizer_dir);
      },
      "model"_a, "path"_a, "dtype"_a = "f32", "overwrite"_a = false, "tokenizer_dir"_a = std::filesystem::path(),
      R"(Writes a llama or gpt2 Model as a GGUF file llama.cpp loads (as `mhsa quantize` does): matrices as
dtype ("f32", "f16", "bf16", "q8_0", "q4_k": the output matrix Q8_0), norms and biases F32; the tokenizer of tokenizer_dir when
it is byte-level BPE. Refuses an existing path unless overwrite.)");
}

}  // namespace mhsa::python
