// python/src/bind_tokenizer.cpp — mhsa.Tokenizer: GPT-2's byte-level BPE, with tiktoken's
// conventions: encode takes str or bytes, decode gives str (invalid UTF-8 as U+FFFD) and
// decode_bytes the exact bytes. The GIL is released while text is encoded. Not a Hugging Face
// `tokenizers` look-alike: no offsets, no batching, no padding.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <string_view>

#include "arrays.h"
#include "mhsa/error.h"
#include "mhsa/tokenizer.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")); }

// The UTF-8 bytes of a str, or a bytes object's bytes, viewed in place: `owner` keeps them alive.
// A str with lone surrogates (from surrogateescape, say) has no UTF-8 form; like tiktoken, each
// becomes U+FFFD.
std::string_view text_bytes(py::handle text, std::string_view fn, py::object& owner) {
  if (py::isinstance<py::bytes>(text)) {
    owner = py::reinterpret_borrow<py::object>(text);
    return {PyBytes_AS_STRING(text.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(text.ptr()))};
  }
  if (!py::isinstance<py::str>(text))
    throw Error(detail::message(fn, ": text: expected str or bytes, got ", type_name(text)));
  owner = py::reinterpret_borrow<py::object>(text);
  Py_ssize_t size = 0;
  if (const char* data = PyUnicode_AsUTF8AndSize(owner.ptr(), &size)) return {data, static_cast<size_t>(size)};
  PyErr_Clear();
  owner = owner.attr("encode")("utf-16", "surrogatepass").attr("decode")("utf-16", "replace");
  const char* data = PyUnicode_AsUTF8AndSize(owner.ptr(), &size);
  if (!data) throw py::error_already_set();
  return {data, static_cast<size_t>(size)};
}

// Token ids from a list, tuple or 1-D integer array, checked against the vocab.
std::vector<int32_t> token_ids(const Tokenizer& t, py::handle obj, std::string_view fn) {
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) || !py::isinstance<py::iterable>(obj))
    throw Error(detail::message(fn, ": ids: expected a sequence of token ids, got ", type_name(obj)));
  std::vector<int32_t> ids;
  size_t i = 0;
  for (py::handle item : py::reinterpret_borrow<py::iterable>(obj)) {
    if (!PyIndex_Check(item.ptr()) || PyBool_Check(item.ptr()))
      throw Error(detail::message(fn, ": ids[", i, "]: expected an integer token id, got ", type_name(item)));
    const py::int_ value = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr()));
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0 || id < 0 || id >= t.vocab_size())
      throw Error(detail::message(fn, ": ids[", i, "]: expected an id in [0, ", t.vocab_size(), "), got ",
                                  std::string(py::str(value))));
    ids.push_back(static_cast<int32_t>(id));
    ++i;
  }
  return ids;
}

std::string decode_bytes(const Tokenizer& t, py::handle ids_obj, std::string_view fn) {
  const std::vector<int32_t> ids = token_ids(t, ids_obj, fn);
  GilReleased unlocked;
  return t.decode(ids);
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", R"(GPT-2's byte-level BPE tokenizer.

Tokenizer.load(dir) reads vocab.json + merges.txt (a Hugging Face GPT-2 directory) or OpenAI's
encoder.json + vocab.bpe. Its ids equal tiktoken's "gpt2" encoding and Hugging Face's GPT-2
tokenizer for every text.)")
      .def_static(
          "load",
          [](const std::filesystem::path& dir) {
            GilReleased unlocked;
            return Tokenizer::load_dir(dir);
          },
          "path"_a, "The tokenizer in a directory (str or os.PathLike): vocab.json + merges.txt or encoder.json + vocab.bpe.")
      .def(
          "encode",
          [](const Tokenizer& t, py::handle text, bool allow_special) {
            py::object owner;
            const std::string_view bytes = text_bytes(text, "Tokenizer.encode", owner);
            std::vector<int32_t> ids;
            {
              GilReleased unlocked;
              ids = t.encode(bytes, allow_special);
            }
            return ids;
          },
          "text"_a, "allow_special"_a = false,
          R"(Token ids of a str (as UTF-8) or of any bytes, invalid UTF-8 included. With allow_special,
"<|endoftext|>" in the text becomes eos_id; otherwise it is ordinary text.)")
      .def(
          "decode",
          [](const Tokenizer& t, py::handle ids) {
            const std::string bytes = decode_bytes(t, ids, "Tokenizer.decode");
            PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace");
            if (!text) throw py::error_already_set();
            return py::reinterpret_steal<py::str>(text);
          },
          "ids"_a, "The text of token ids; bytes that are not valid UTF-8 (a cut character) become U+FFFD.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, py::handle ids) { return py::bytes(decode_bytes(t, ids, "Tokenizer.decode_bytes")); },
          "ids"_a, "The exact bytes of token ids.")
      .def(
          "token_bytes", [](const Tokenizer& t, int32_t id) { return py::bytes(std::string(t.token_bytes(id))); },
          "id"_a, "The bytes of one token.")
      .def_static(
          "pretokenize",
          [](py::handle text) {
            py::object owner;
            const std::string_view bytes = text_bytes(text, "Tokenizer.pretokenize", owner);
            const bool is_str = py::isinstance<py::str>(text);
            py::list out;
            for (std::string_view piece : Tokenizer::pretokenize(bytes)) {
              if (is_str)
                out.append(py::reinterpret_steal<py::object>(
                    PyUnicode_DecodeUTF8(piece.data(), static_cast<Py_ssize_t>(piece.size()), "replace")));
              else
                out.append(py::bytes(std::string(piece)));
            }
            return out;
          },
          "text"_a, "The pieces GPT-2's regex cuts the text into before BPE (str in, str out; bytes in, bytes out).")
      .def("token_string", &Tokenizer::token_string, "id"_a,
           "The token as vocab.json spells it, in GPT-2's printable byte alphabet ('Ġworld' for b' world').")
      .def(
          "token_id",
          [](const Tokenizer& t, py::handle token) {
            py::object owner;
            return t.token_id(text_bytes(token, "Tokenizer.token_id", owner));
          },
          "token"_a, "The id of a token given as bytes (or str, as UTF-8), or None when the vocab has no such token.")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eos_id", &Tokenizer::eos_id, "The id of <|endoftext|>.")
      .def("__len__", &Tokenizer::vocab_size)
      .def("__repr__", [](const Tokenizer& t) {
        return detail::message("mhsa.Tokenizer(vocab_size=", t.vocab_size(), ", eos_id=", t.eos_id(), ")");
      });
}

}  // namespace mhsa::python
