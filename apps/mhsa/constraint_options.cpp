// apps/mhsa/constraint_options.cpp — see constraint_options.h.
#include "constraint_options.h"

#include <optional>

#include "core/check.h"
#include "io/file.h"

namespace mhsa::cli {

void add_constraint_options(CLI::App* cmd, ConstraintArgs& a) {
  auto* schema = cmd->add_option("--json-schema", a.json_schema,
                                 "answer with JSON valid against this JSON Schema file (docs/structured-output.md)");
  auto* grammar = cmd->add_option("--grammar", a.grammar, "answer with text this GBNF grammar file derives (start rule: root)");
  schema->excludes(grammar);
}

std::shared_ptr<const Constraint> load_constraint(const ConstraintArgs& a, const Tokenizer& tokenizer, int64_t vocab_size,
                                                  std::span<const int32_t> end_ids, std::string_view cmd) {
  if (a.json_schema.empty() && a.grammar.empty()) return nullptr;
  std::optional<Grammar> g;
  if (!a.json_schema.empty())
    g = Grammar::from_json_schema(detail::read_file(a.json_schema, cmd, "--json-schema"), a.json_schema);
  else
    g = Grammar::from_gbnf(detail::read_file(a.grammar, cmd, "--grammar"), a.grammar);
  return std::make_shared<const Constraint>(std::move(*g), TokenVocabulary::from_tokenizer(tokenizer, vocab_size, end_ids));
}

}  // namespace mhsa::cli
