// python/src/constraint_arg.h — the json_schema= / grammar= arguments of Model.generate and
// ChatSession: a schema as JSON text or a dict, a grammar as GBNF text, compiled over the
// tokenizer's tokens (mhsa/grammar.h).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "mhsa/error.h"
#include "mhsa/grammar.h"
#include "mhsa/tokenizer.h"

namespace mhsa::python {

// Null when neither is given. Throws mhsa::Error naming fn and the argument.
inline std::shared_ptr<const Constraint> constraint_arg(const pybind11::object& json_schema,
                                                        const std::optional<std::string>& grammar,
                                                        const Tokenizer* tokenizer, int64_t vocab_size,
                                                        std::span<const int32_t> end_ids, const std::string& fn) {
  if (json_schema.is_none() && !grammar) return nullptr;
  if (!json_schema.is_none() && grammar) throw Error(fn + ": json_schema and grammar: expected one of them, got both");
  if (!tokenizer)
    throw Error(fn + ": tokenizer: expected the model's mhsa.Tokenizer with json_schema or grammar (a mask needs each "
                     "token's bytes), got None");
  std::optional<Grammar> g;
  if (grammar) {
    g = Grammar::from_gbnf(*grammar, "grammar");
  } else {
    std::string text;
    if (pybind11::isinstance<pybind11::str>(json_schema))
      text = json_schema.cast<std::string>();
    else if (pybind11::isinstance<pybind11::dict>(json_schema) || pybind11::isinstance<pybind11::bool_>(json_schema))
      text = pybind11::module_::import("json").attr("dumps")(json_schema).cast<std::string>();
    else
      throw Error(fn + ": json_schema: expected a dict or JSON text, got " +
                  std::string(pybind11::str(json_schema.get_type().attr("__name__"))));
    g = Grammar::from_json_schema(text, "json_schema");
  }
  return std::make_shared<const Constraint>(std::move(*g), TokenVocabulary::from_tokenizer(*tokenizer, vocab_size, end_ids));
}

}  // namespace mhsa::python
