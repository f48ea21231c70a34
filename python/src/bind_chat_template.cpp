// python/src/bind_chat_template.cpp — mhsa.ChatTemplate: a chat template compiled once, rendered
// like transformers' apply_chat_template(..., tokenize=False). Messages and keyword variables are
// passed through json.dumps (so they must be JSON-serialisable: dicts, lists, tuples as lists,
// str, int, float, bool, None); the GIL is released while the template renders. A template is
// immutable: any number of threads may render it at once. Not a tokenizer: Tokenizer calls this.
#include <pybind11/pybind11.h>

#include <string>

#include "arrays.h"
#include "mhsa/chat_template.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

std::string to_json(const py::handle& obj) {
  return py::module_::import("json").attr("dumps")(obj, "ensure_ascii"_a = false, "allow_nan"_a = false).cast<std::string>();
}

}  // namespace

void bind_chat_template(py::module_& m) {
  py::class_<ChatTemplate>(m, "ChatTemplate", R"(A Jinja chat template, compiled once.

ChatTemplate(source).render(messages, add_generation_prompt=False, **variables) gives the string that
transformers' apply_chat_template(messages, tokenize=False, ...) gives for the same template, with
bos_token, eos_token, tools, documents, ... passed as keyword variables. Errors in the template
(raise_exception included) are raised as mhsa.Error with the template's line and column.)")
      .def(py::init([](const std::string& source) {
             GilReleased unlocked;
             return ChatTemplate(source);
           }),
           "source"_a)
      .def(
          "render",
          [](const ChatTemplate& t, const py::object& messages, bool add_generation_prompt,
             const py::object& continue_final_message, const py::kwargs& variables) {
            const std::string m = to_json(messages), v = to_json(variables);
            std::string field;  // True means "content"; a string names the field
            if (py::isinstance<py::str>(continue_final_message)) field = continue_final_message.cast<std::string>();
            else if (continue_final_message.cast<bool>()) field = "content";
            GilReleased unlocked;
            return t.render(m, add_generation_prompt, v, field);
          },
          "messages"_a, "add_generation_prompt"_a = false, "continue_final_message"_a = false,
          R"(The rendered prompt; keyword arguments become template variables (bos_token=..., tools=...).
continue_final_message=True (or a field name) ends it inside the final message, as transformers does.)");
}

}  // namespace mhsa::python
