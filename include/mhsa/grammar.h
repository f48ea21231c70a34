// mhsa/grammar.h — constrained decoding: a grammar (GBNF, or JSON Schema compiled to GBNF) over
// bytes, matched by a pushdown automaton, and the set of a vocabulary's tokens that may come next,
// computed incrementally as tokens are drawn (a token mask). GenerationOptions::constraint carries
// one into Model::generate, the chat session and the server's scheduler; each sequence starts its
// own ConstraintState.
//
// What it is not: a regex engine (JSON Schema's `pattern` is refused), nor a validator of
// JSON Schema's value keywords (minimum, format, ...: refused by name, never silently ignored).
// docs/structured-output.md says what is supported and how the mask is made fast.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa {

class Tokenizer;
namespace detail {
struct GrammarRules;
struct VocabularyTrie;
class ByteMatcher;
struct MaskCache;
}  // namespace detail

// A grammar compiled to rules over bytes. Immutable; copies share the rules.
class Grammar {
 public:
  // llama.cpp's GBNF: `name ::= alternatives` rules (the start rule is `root`), alternatives `|`,
  // sequences, groups `( )`, `*` `+` `?` `{m}` `{m,}` `{m,n}`, "literals", [classes] with ranges
  // and ^negation (over Unicode code points, matched as their UTF-8 bytes), `.` (any character),
  // escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, `#` comments. Throws mhsa::Error
  // "<source>:<line>:<column>: <problem>" for a syntax error, an undefined rule, a left-recursive
  // rule, a repetition count over 10,000 or a grammar over the size limits.
  static Grammar from_gbnf(std::string_view text, std::string_view source = "grammar");
  // JSON Schema (the subset OpenAI's strict structured outputs takes: see json_schema_to_gbnf).
  static Grammar from_json_schema(std::string_view schema_json, std::string_view source = "schema");
  // Any JSON object (response_format {"type": "json_object"}).
  static Grammar json_object();
  // The GBNF a JSON Schema compiles to. Supported: type (one or a list), object properties /
  // required / additionalProperties, enum, const, array items / minItems / maxItems, string
  // minLength / maxLength, integer, number, boolean, null, anyOf, $ref into the document
  // (recursion included) with $defs / definitions, and annotations (title, description, ...).
  // Anything else throws mhsa::Error "<source> at <JSON pointer>: '<keyword>' is not supported ...".
  static std::string json_schema_to_gbnf(std::string_view schema_json, std::string_view source = "schema");

  // Whether the grammar derives exactly these bytes (tests and tools).
  bool accepts(std::string_view bytes) const;
  // Whether some sentence of the grammar starts with these bytes.
  bool accepts_prefix(std::string_view bytes) const;
  const detail::GrammarRules& rules() const { return *rules_; }

 private:
  explicit Grammar(std::shared_ptr<const detail::GrammarRules> rules) : rules_(std::move(rules)) {}
  std::shared_ptr<const detail::GrammarRules> rules_;
};

// A vocabulary as byte strings in a trie (what a mask walks). Tokens without bytes and special
// tokens are never allowed; end tokens only where the grammar is complete.
class TokenVocabulary {
 public:
  // bytes[id]: token id's bytes ("" for never); end_ids: tokens that end a text (EOS, end of turn).
  TokenVocabulary(const std::vector<std::string>& bytes, std::span<const int32_t> end_ids);
  // The tokenizer's tokens (special ones left out), ids up to vocab_size (a model's padded
  // embedding rows never allowed); end tokens: the tokenizer's EOS ids and end_ids.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size,
                                                               std::span<const int32_t> end_ids = {});
  ~TokenVocabulary();
  int64_t size() const { return size_; }
  std::span<const int32_t> end_ids() const { return end_ids_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const detail::VocabularyTrie& trie() const { return *trie_; }

 private:
  int64_t size_;
  std::vector<std::string> bytes_;
  std::vector<int32_t> end_ids_;
  std::unique_ptr<const detail::VocabularyTrie> trie_;
};

class ConstraintState;

// A grammar over a vocabulary: what GenerationOptions::constraint holds (shared by sequences).
class Constraint {
 public:
  Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary);
  ConstraintState start() const;  // a sequence's state before its first token
  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
};

// One sequence's place in the grammar. Not thread-safe; one per sequence.
class ConstraintState {
 public:
  ConstraintState(ConstraintState&&) noexcept;
  ConstraintState& operator=(ConstraintState&&) noexcept;
  ConstraintState(const ConstraintState&);  // an independent copy (its caches copied too)
  ~ConstraintState();

  // The tokens allowed next, one bit per token id (bit id % 64 of word id / 64). Where the grammar
  // is complete, the end tokens; where it is complete and can go no further, only them; where no
  // token fits (a grammar that needs bytes no token has), only the end tokens too.
  const std::vector<uint64_t>& allowed();
  bool allows(int32_t token) { return token >= 0 && token < size() && (allowed()[static_cast<size_t>(token) / 64] >> (token % 64) & 1); }
  // logits [V ≥ vocabulary size] of the disallowed tokens set to −∞ (ids past the vocabulary too).
  void mask(std::span<float> logits);
  // Moves past a token; throws mhsa::Error naming it if the grammar does not allow it.
  void advance(int32_t token);
  bool complete() const;             // the bytes so far are a sentence of the grammar
  bool ended() const { return ended_; }  // an end token was taken
  int64_t size() const;              // the vocabulary's size

 private:
  friend class Constraint;
  ConstraintState(const Constraint& c);
  const Constraint* constraint_;
  std::unique_ptr<detail::ByteMatcher> matcher_;
  std::unique_ptr<detail::MaskCache> cache_;
  int32_t state_ = 0;
  bool ended_ = false;
};

}  // namespace mhsa
