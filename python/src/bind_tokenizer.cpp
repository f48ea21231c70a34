// python/src/bind_tokenizer.cpp — mhsa.Tokenizer: tokenizer.json (Hugging Face's names:
// encode(text, add_special_tokens), decode(ids, skip_special_tokens), eos_token_ids, ...) and
// GPT-2's vocab.json + merges.txt; encode takes str or bytes, decode gives str (invalid UTF-8 as
// U+FFFD) and decode_bytes the bytes. The GIL is released while text is encoded. Not a Hugging
// Face `tokenizers` look-alike: no offsets, no batching, no padding.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "arrays.h"
#include "mhsa/error.h"
#include "mhsa/model_config.h"
#include "mhsa/models.h"
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

// Token ids from a list, tuple or 1-D integer array, each in [0, 2^32) as tokenizers' u32 ids;
// those past the vocabulary are left out, as tokenizers' decode leaves them out.
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
    if (overflow != 0 || id < 0 || id > UINT32_MAX)
      throw Error(detail::message(fn, ": ids[", i, "]: expected a token id in [0, 2^32), got ", std::string(py::str(value))));
    if (id < t.vocab_size()) ids.push_back(static_cast<int32_t>(id));
    ++i;
  }
  return ids;
}

std::string decode_bytes(const Tokenizer& t, py::handle ids_obj, std::string_view fn, bool skip_special) {
  const std::vector<int32_t> ids = token_ids(t, ids_obj, fn);
  GilReleased unlocked;
  return t.decode(ids, skip_special);
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", R"(A model's tokenizer: Hugging Face tokenizer.json, or GPT-2's files.

Tokenizer.load(dir) reads tokenizer.json (with tokenizer_config.json and generation_config.json
when present) and encodes and decodes exactly as the `tokenizers` library does; without it,
vocab.json + merges.txt (a Hugging Face GPT-2 directory) or OpenAI's encoder.json + vocab.bpe,
whose ids equal tiktoken's "gpt2" encoding for every text. Tokenizer.load("FILE.gguf") reads the
tokenizer in a GGUF file's metadata (SentencePiece or byte-level BPE), encoding as llama.cpp does.)")
      .def_static(
          "load",
          [](const std::optional<std::filesystem::path>& path) {
            const ResolvedModel r = resolve_model(path ? path->string() : "", "Tokenizer.load: path");
            GilReleased unlocked;
            namespace fs = std::filesystem;
            std::error_code ec;
            // A directory without tokenizer files is a byte-level model's when its config.json says so (the
            // kjv model, what `mhsa train` writes), as the CLI reads it.
            const bool files = fs::exists(r.path / "tokenizer.json", ec) || fs::exists(r.path / "vocab.json", ec) ||
                               fs::exists(r.path / "encoder.json", ec);
            if (fs::is_directory(r.path, ec) && !files && fs::exists(r.path / "config.json", ec))
              return Tokenizer::for_model(r.path, ModelConfig::load(r.path / "config.json").vocab_size);
            const bool byte_level = !r.name.empty() && fs::is_directory(r.path, ec) && !files;
            return byte_level ? Tokenizer::bytes() : Tokenizer::load_dir(r.path);
          },
          "path"_a = py::none(),
          "The tokenizer in a directory (str or os.PathLike): tokenizer.json, else vocab.json + merges.txt or "
          "encoder.json + vocab.bpe; or the tokenizer of a GGUF file's metadata; or a named model's (None: the "
          "default model's; \"kjv\": bytes); a directory without tokenizer files whose config.json has 256 tokens "
          "(a byte-level model, such as `mhsa train` writes): bytes.")
      .def(
          "encode",
          [](const Tokenizer& t, py::handle text, bool add_special_tokens, std::optional<bool> allow_special) {
            py::object owner;
            const std::string_view bytes = text_bytes(text, "Tokenizer.encode", owner);
            std::vector<int32_t> ids;
            {
              GilReleased unlocked;
              ids = t.encode(bytes, EncodeOptions{add_special_tokens, allow_special.value_or(t.is_tokenizer_json())});
            }
            return ids;
          },
          "text"_a, "add_special_tokens"_a = true, "allow_special"_a = py::none(),
          R"(Token ids of a str (as UTF-8) or of any bytes, invalid UTF-8 included.

add_special_tokens: add the post-processor's tokens (tokenizer.json's template, e.g. BOS).
allow_special: special tokens written in the text become their ids; otherwise their text is
ordinary text. By default as the file's reference does: True for tokenizer.json (Hugging Face
tokenizers), False for GPT-2's files (tiktoken's encode_ordinary).)")
      .def(
          "decode",
          [](const Tokenizer& t, py::handle ids, bool skip_special_tokens) {
            const std::string bytes = decode_bytes(t, ids, "Tokenizer.decode", skip_special_tokens);
            PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "replace");
            if (!text) throw py::error_already_set();
            return py::reinterpret_steal<py::str>(text);
          },
          "ids"_a, "skip_special_tokens"_a = false,
          "The text of token ids (tokenizer.json: as Hugging Face decodes it); bytes that are not valid UTF-8 (a cut "
          "character) become U+FFFD. Ids past the vocabulary are left out, as Hugging Face's decode does.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, py::handle ids, bool skip_special_tokens) {
            return py::bytes(decode_bytes(t, ids, "Tokenizer.decode_bytes", skip_special_tokens));
          },
          "ids"_a, "skip_special_tokens"_a = false,
          "The bytes of token ids: GPT-2's files exactly; tokenizer.json the text decode gives, as UTF-8.")
      .def(
          "token_bytes", [](const Tokenizer& t, int32_t id) { return py::bytes(t.token_bytes(id)); },
          "id"_a, "The bytes one token adds in the middle of a text.")
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
      .def_property_readonly("eos_id", &Tokenizer::eos_id, "The first of eos_token_ids (-1 if none).")
      .def_property_readonly("eos_token_ids", &Tokenizer::eos_ids,
                             "The ids that end a generation: <|endoftext|>; tokenizer.json: tokenizer_config.json's "
                             "eos_token and generation_config.json's eos_token_id.")
      .def_property_readonly("bos_token_id", &Tokenizer::bos_id,
                             "tokenizer_config.json's bos_token (else generation_config.json's, else the template's "
                             "first token), or None.")
      .def_property_readonly("bos_token", &Tokenizer::bos_token, "tokenizer_config.json's bos_token ('' if none).")
      .def_property_readonly("eos_token", &Tokenizer::eos_token, "tokenizer_config.json's eos_token ('' if none).")
      .def_property_readonly("chat_template", &Tokenizer::chat_template,
                             "tokenizer_config.json's chat_template (Jinja source; '' if none).")
      .def(
          "apply_chat_template",
          [](const Tokenizer& t, const py::object& messages, bool add_generation_prompt, bool tokenize,
             const py::object& continue_final_message, const std::optional<std::string>& chat_template,
             const py::kwargs& variables) -> py::object {
            const auto dumps = py::module_::import("json").attr("dumps");
            const auto to_json = [&](const py::handle& obj) {
              return dumps(obj, "ensure_ascii"_a = false, "allow_nan"_a = false).cast<std::string>();
            };
            const std::string m = to_json(messages), v = to_json(variables);
            std::string field;  // True means "content"; a string names the field
            if (py::isinstance<py::str>(continue_final_message)) field = continue_final_message.cast<std::string>();
            else if (continue_final_message.cast<bool>()) field = "content";
            std::string text;
            std::vector<int32_t> ids;
            {
              GilReleased unlocked;
              const std::string source = chat_template.value_or("");
              text = t.apply_chat_template(m, ChatTemplateOptions{add_generation_prompt, v, field, source});
              if (tokenize) ids = t.encode(text, EncodeOptions{false, true});
            }
            if (tokenize) return py::cast(ids);
            return py::str(text);
          },
          "messages"_a, "add_generation_prompt"_a = false, "tokenize"_a = false, "continue_final_message"_a = false,
          "chat_template"_a = py::none(),
          R"(The chat template rendered as transformers' apply_chat_template renders it.

messages: a list of dicts ({"role": "user", "content": "Hi"}); keyword arguments (tools=...,
documents=..., anything the template reads) are template variables, overriding the special tokens
(bos_token, eos_token, ...) tokenizer_config.json sets. All must be JSON-serialisable. Returns the
prompt, or with tokenize=True its ids encoded without added special tokens (as transformers does).
continue_final_message=True (or a field name such as "reasoning_content") ends the prompt inside
the final message, for the model to continue it; chat_template= names one of the tokenizer's
templates or gives a Jinja template to use instead.
Raises mhsa.Error when the tokenizer has no chat template.)")
      .def_property_readonly(
          "special_tokens", [](const Tokenizer& t) {
            py::dict d;
            for (const auto& [text, id] : t.special_tokens()) d[py::str(text)] = id;
            return d;
          },
          "Every special token: its text → its id.")
      .def("is_special", &Tokenizer::is_special, "id"_a, "Whether the id is a special token's.")
      .def("__len__", &Tokenizer::vocab_size)
      .def("__repr__", [](const Tokenizer& t) {
        return detail::message("mhsa.Tokenizer(vocab_size=", t.vocab_size(), ", eos_id=", t.eos_id(), ")");
      });
}

}  // namespace mhsa::python
