// apps/mhsa/constraint_options.h — --json-schema FILE and --grammar FILE of generate and chat:
// the file read and compiled (mhsa/grammar.h) into the constraint GenerationOptions carries.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "mhsa/grammar.h"
#include "mhsa/tokenizer.h"

namespace mhsa::cli {

struct ConstraintArgs {
  std::string json_schema;  // --json-schema FILE
  std::string grammar;      // --grammar FILE (GBNF)
};

void add_constraint_options(CLI::App* cmd, ConstraintArgs& a);

// The constraint the options ask for (null: none) over the tokenizer's tokens, ended by end_ids.
// Throws mhsa::Error "<cmd>: --json-schema: ..." for a file that cannot be read, and the
// compiler's "<file>:<line>:<column>: ..." / "<file> at <JSON pointer>: ..." for its content.
std::shared_ptr<const Constraint> load_constraint(const ConstraintArgs& a, const Tokenizer& tokenizer, int64_t vocab_size,
                                                  std::span<const int32_t> end_ids, std::string_view cmd);

}  // namespace mhsa::cli
