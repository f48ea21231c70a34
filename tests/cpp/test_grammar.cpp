// tests/cpp/test_grammar.cpp — constrained decoding (mhsa/grammar.h).
//
// - GBNF: hand-checkable grammars accept and reject exactly the strings they should (repetition
//   bounds, classes with ranges, negation and UTF-8, groups, escapes); syntax errors, undefined
//   and left-recursive rules, hostile repetition counts and nesting are refused with the position.
// - JSON Schema: the keywords supported compile to grammars that accept valid instances and reject
//   invalid ones (Python's jsonschema is the reference on generated instances in
//   tests/python/test_structured_output.py); the others are refused by name with their path.
// - Masks: on states reached by random walks through three grammars, the trie walk's mask equals
//   the brute-force one (every token's bytes fed through a separate matcher from the state, and a
//   sample of tokens through a matcher started afresh on the whole text), over the real SmolLM2
//   vocabulary when models/smollm2 is there and over a byte vocabulary always.
// - Generation: a random model's greedy output under a grammar is a sentence of it, ended by EOS,
//   and speculative decoding gives the same tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/rules.h"
#include "mhsa/error.h"
#include "mhsa/grammar.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"

namespace mhsa {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Grammar, GbnfAcceptsExactly) {
  const Grammar g = Grammar::from_gbnf(R"(
# a comment
root ::= "id-" digit{2,3} ( "-" word )* suffix?
digit ::= [0-9]
word ::= [a-zA-Z_]+   # letters
suffix ::= "!" | "\x3f" | [^\x00-\x7F]
)");
  for (const char* ok : {"id-12", "id-123", "id-12-ab", "id-12-a-B_c", "id-12!", "id-12?", "id-12é", "id-12-x€"})
    EXPECT_TRUE(g.accepts(ok)) << ok;
  for (const char* bad : {"id-1", "id-1234", "id-12-", "id-12-a!!", "id-12\x80", "id-12é!", "ID-12", ""})
    EXPECT_FALSE(g.accepts(bad)) << bad;
  EXPECT_TRUE(g.accepts_prefix("id-1"));
  EXPECT_TRUE(g.accepts_prefix("id-12\xC3"));  // inside a character's bytes
  EXPECT_FALSE(g.accepts_prefix("id-x"));

  const Grammar nested = Grammar::from_gbnf("root ::= (\"a\" (\"b\" | \"c\")? ){0,2} \"\\\"\" [\\]\\-\\\\]\n");
  for (const char* ok : {"\"]", "a\"-", "ab\"\\", "acab\"]", "aa\"]"}) EXPECT_TRUE(nested.accepts(ok)) << ok;
  for (const char* bad : {"\"", "aaa\"]", "b\"]", "a\"x"}) EXPECT_FALSE(nested.accepts(bad)) << bad;

  const Grammar any = Grammar::from_gbnf("root ::= .{2} [α-ω]\n");
  EXPECT_TRUE(any.accepts("a€β"));
  EXPECT_FALSE(any.accepts("a€b"));
  EXPECT_FALSE(any.accepts("a\xFF\xCE\xB2"));  // not UTF-8
}

TEST(Grammar, GbnfErrorsNamePosition) {
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("root ::= \"a\" (\"b\"\n", "g.gbnf"); }),
            "g.gbnf:2:1: expected ')' to close the group");
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("root ::= x\n"); }), "grammar:1:10: rule 'x' is used but not defined");
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("start ::= \"a\"\n"); }),
            "grammar:2:1: no rule named 'root' (the start rule)");
  EXPECT_NE(error_of([] { Grammar::from_gbnf("root ::= x\nx ::= y? x \"a\" | \"b\"\ny ::= \"c\"\n"); })
                .find("rule 'x' is left-recursive"),
            std::string::npos);
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("root ::= \"a\"{0,1000000000}"); }),
            "grammar:1:16: repetition count over the limit of 10000");
  EXPECT_NE(error_of([] { Grammar::from_gbnf("root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')')); })
                .find("groups nested deeper than 100"),
            std::string::npos);
  std::string big = "root ::= r0\n";  // 120 rules of 10,000 elements each: past the 2^20 elements
  for (int i = 0; i < 120; ++i) big += "r" + std::to_string(i) + " ::= \"a\"{10000}\n";
  EXPECT_NE(error_of([&] { Grammar::from_gbnf(big); }).find("too large"), std::string::npos);
  // Nested repetitions are rule references, not copies: linear in size. Matching them is ambiguous
  // (every split of the a's): bounded, an error rather than a hang.
  const Grammar nested = Grammar::from_gbnf("root ::= ((\"a\"{0,10000}){0,10000}){0,10000}");
  EXPECT_NE(error_of([&] { (void)nested.accepts(std::string(300, 'a')); }).find("too ambiguous"), std::string::npos);
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("root ::= [z-a]"); }), "grammar:1:10: character range out of order");
  EXPECT_EQ(error_of([] { Grammar::from_gbnf("root ::= \"\\q\""); }), "grammar:1:11: unknown escape '\\q'");
}

TEST(Grammar, JsonSchemaSubset) {
  const Grammar g = Grammar::from_json_schema(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 3},
      "kind": {"enum": ["a", "b", 1, null]},
      "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 2},
      "score": {"type": ["number", "null"]},
      "v": {"const": {"x": true}},
      "child": {"anyOf": [{"$ref": "#"}, {"type": "boolean"}]}
    },
    "required": ["name", "kind"],
    "additionalProperties": false,
    "$defs": {"tag": {"type": "integer"}}
  })");
  for (const char* ok : {R"({"name":"abc","kind":"a"})", R"({ "name": "", "kind": 1, "tags": [1, -20] })",
                         R"({"name":"x","kind":null,"score":1.5e3,"v":{"x":true}})",
                         R"({"name":"x","kind":"b","child":{"name":"y","kind":"a","child":false}})",
                         "{\"name\":\"\\u00e9\",\n  \"kind\":\"a\"}"})
    EXPECT_TRUE(g.accepts(ok)) << ok;
  for (const char* bad : {R"({"name":"abcd","kind":"a"})", R"({"kind":"a"})", R"({"name":"x","kind":"c"})",
                          R"({"name":"x","kind":"a","tags":[]})", R"({"name":"x","kind":"a","tags":[1,2,3]})",
                          R"({"name":"x","kind":"a","tags":[1.5]})", R"({"name":"x","kind":"a","extra":1})",
                          R"({"kind":"a","name":"x"})", R"({"name":"x","kind":"a"} )", R"({"name":"x","kind":"a","score":01})"})
    EXPECT_FALSE(g.accepts(bad)) << bad;

  const Grammar object = Grammar::json_object();
  EXPECT_TRUE(object.accepts(R"({"a": [1, {"b": "c\"d"}, true], "e": -0.5E+2})"));
  for (const char* bad : {"[]", "{\"a\"}", "{\"a\":1,}", "{} ", "\"x\""}) EXPECT_FALSE(object.accepts(bad)) << bad;
}

TEST(Grammar, JsonSchemaRefusalsNameThePath) {
  const auto err = [](const char* schema) { return error_of([&] { Grammar::from_json_schema(schema, "s.json"); }); };
  EXPECT_EQ(err(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^x"}}})"),
            "s.json at /properties/a/pattern: 'pattern' is not supported (regular expressions and formats are not enforced)");
  EXPECT_EQ(err(R"({"type":"integer","minimum":0})"), "s.json at /minimum: 'minimum' is not supported");
  EXPECT_EQ(err(R"({"oneOf":[{"type":"null"}]})"), "s.json at /oneOf: 'oneOf' is not supported (anyOf is)");
  EXPECT_EQ(err(R"({"type":"strin"})"),
            "s.json at /type: unknown type 'strin' (expected string, integer, number, boolean, null, array or object)");
  EXPECT_EQ(err(R"({"type":"array","maxItems":1000000000})"),
            "s.json at /maxItems: at most 10000 is supported, got 1000000000");
  EXPECT_EQ(err(R"({"$ref":"#/$defs/none"})"), "s.json at /$ref: '#/$defs/none' does not point into this schema");
  EXPECT_EQ(err(R"({"type":"object","required":["x"]})"), "s.json at /required: 'x' is required but not among the properties");
  EXPECT_NE(err("{\"type\": ").find("s.json"), std::string::npos);
}

// The byte strings of a vocabulary: SmolLM2's when the default model is there.
struct Vocab {
  std::vector<std::string> bytes;
  std::vector<int32_t> ends;
  std::shared_ptr<const TokenVocabulary> vocab;
};

const Vocab& smollm2() {
  static const Vocab v = [] {
    Vocab out;
    const std::filesystem::path gguf =
        std::filesystem::path(MHSA_SOURCE_DIR) / "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(gguf)) return out;
    const Tokenizer tok = Tokenizer::load_dir(gguf);
    out.vocab = TokenVocabulary::from_tokenizer(tok, tok.vocab_size());
    for (int32_t id = 0; id < tok.vocab_size(); ++id) out.bytes.push_back(out.vocab->bytes(id));
    out.ends.assign(out.vocab->end_ids().begin(), out.vocab->end_ids().end());
    return out;
  }();
  return v;
}

Vocab byte_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\": \"", "true", "null", "12", "\n  ", "ab", "é", "\xA9"}) v.bytes.emplace_back(t);
  v.bytes.emplace_back();  // a special token: no bytes
  v.bytes.emplace_back();  // the end token
  v.ends = {static_cast<int32_t>(v.bytes.size() - 1)};
  v.vocab = std::make_shared<const TokenVocabulary>(v.bytes, v.ends);
  return v;
}

// Random walks through the grammar; at each state the mask against brute force.
void check_masks(const Grammar& g, const Vocab& v, int walks, int steps, uint64_t seed) {
  const Constraint c(g, v.vocab);
  std::mt19937_64 gen(seed);
  const int64_t V = static_cast<int64_t>(v.bytes.size());
  for (int w = 0; w < walks; ++w) {
    ConstraintState state = c.start();
    std::string text;
    for (int step = 0; step < steps && !state.ended(); ++step) {
      const std::vector<uint64_t> mask = state.allowed();
      // Brute force: a separate matcher, fed the text, then each token's bytes from there.
      detail::ByteMatcher m(g.rules());
      int32_t at = m.start();
      for (const char b : text) at = m.step(at, static_cast<uint8_t>(b));
      ASSERT_GE(at, 0);
      std::vector<int32_t> allowed;
      bool any = false;
      for (int32_t id = 0; id < V; ++id) {
        const bool end = std::find(v.ends.begin(), v.ends.end(), id) != v.ends.end();
        bool ok = false;
        if (!end && !v.bytes[static_cast<size_t>(id)].empty()) {
          int32_t s = at;
          for (const char b : v.bytes[static_cast<size_t>(id)])
            if ((s = m.step(s, static_cast<uint8_t>(b))) < 0) break;
          ok = s >= 0;
          any |= ok;
        }
        if (ok) allowed.push_back(id);
        ASSERT_EQ(ok && !end, !end && (mask[static_cast<size_t>(id) / 64] >> (id % 64) & 1))
            << "token " << id << " after " << text.size() << " bytes";
      }
      for (const int32_t e : v.ends)
        EXPECT_EQ(m.accepting(at) || !any, (mask[static_cast<size_t>(e) / 64] >> (e % 64) & 1) != 0);
      // A sample through a matcher started afresh on the whole text.
      for (int k = 0; k < 64; ++k) {
        const int32_t id = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(V) - 1)(gen);
        if (v.bytes[static_cast<size_t>(id)].empty()) continue;
        EXPECT_EQ(g.accepts_prefix(text + v.bytes[static_cast<size_t>(id)]), std::binary_search(allowed.begin(), allowed.end(), id));
      }
      if (allowed.empty()) break;
      // Mostly the allowed token that closes things soonest is not what a walk wants: pick at random.
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(gen)];
      state.advance(t);
      text += v.bytes[static_cast<size_t>(t)];
    }
  }
}

const char* kMaskSchema = R"({"type":"object","properties":{"a":{"type":"string"},"n":{"type":"integer"},
  "e":{"enum":["x","yz"]},"l":{"type":"array","items":{"type":"boolean"},"maxItems":3}},"required":["a","n"]})";
const char* kMaskGbnf = "root ::= ( [^\\x00-\\x1F]{1,4} \" \" | [α-ω]+ | \"{\\\"\" [0-9]* )+ \"\\n\"\n";

TEST(Grammar, MasksEqualBruteForceBytes) {
  const Vocab v = byte_vocab();
  check_masks(Grammar::json_object(), v, 6, 30, 1);
  check_masks(Grammar::from_json_schema(kMaskSchema), v, 6, 30, 2);
  check_masks(Grammar::from_gbnf(kMaskGbnf), v, 6, 30, 3);
}

TEST(Grammar, MasksEqualBruteForceSmolLM2) {
  const Vocab& v = smollm2();
  if (!v.vocab) GTEST_SKIP() << "models/smollm2 is not there (scripts/setup.sh fetches it)";
  check_masks(Grammar::json_object(), v, 1, 12, 4);
  check_masks(Grammar::from_json_schema(kMaskSchema), v, 1, 12, 5);
  check_masks(Grammar::from_gbnf(kMaskGbnf), v, 1, 8, 6);
}

TEST(Grammar, EndOnlyWhenComplete) {
  const Vocab v = byte_vocab();
  const Constraint c(Grammar::from_gbnf("root ::= \"ab\" \"c\"?\n"), v.vocab);
  ConstraintState s = c.start();
  const int32_t end = v.ends[0];
  EXPECT_FALSE(s.allows(end));
  EXPECT_TRUE(s.allows('a'));
  EXPECT_TRUE(s.allows(256 + 7));  // "ab"
  s.advance('a');
  EXPECT_FALSE(s.allows(end));
  s.advance('b');
  EXPECT_TRUE(s.complete());
  EXPECT_TRUE(s.allows(end));
  EXPECT_TRUE(s.allows('c'));
  s.advance('c');
  std::vector<uint64_t> only_end(s.allowed().size(), 0);  // complete, and nothing can follow
  only_end[static_cast<size_t>(end) / 64] |= uint64_t{1} << (end % 64);
  EXPECT_EQ(s.allowed(), only_end);
  EXPECT_NE(error_of([&] { s.advance('c'); }).find("a token the grammar allows here"), std::string::npos);
  std::vector<float> logits(static_cast<size_t>(v.bytes.size()) + 3, 1.0f);
  s.mask(logits);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_EQ(logits[i] == 1.0f, static_cast<int32_t>(i) == end) << i;
  s.advance(end);
  EXPECT_TRUE(s.ended());
}

TEST(Grammar, GenerationFollowsGrammarWithAndWithoutSpeculation) {
  const Vocab v = byte_vocab();
  const int64_t V = static_cast<int64_t>(v.bytes.size());
  const nlohmann::json config = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}},
                                 {"vocab_size", V},       {"hidden_size", 64},
                                 {"intermediate_size", 128}, {"num_hidden_layers", 2},
                                 {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                 {"max_position_embeddings", 256}, {"eos_token_id", v.ends[0]}};
  const Model model = Model::random(ModelConfig::parse(config.dump()), 7);
  const Grammar g = Grammar::from_gbnf("root ::= \"{\\\"\" [a-z]{1,6} \"\\\": \" ( [0-9]{1,4} | \"true\" ) \"}\"\n");
  GenerationOptions o;
  o.max_new_tokens = 40;
  o.constraint = std::make_shared<const Constraint>(g, v.vocab);
  const std::vector<int32_t> prompt = {'a', 'b', 'a', 'b', '{', '"', 'a', 'b'};
  const auto text_of = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (const int32_t id : ids)
      if (id != v.ends[0]) s += v.bytes[static_cast<size_t>(id)];
    return s;
  };
  const std::vector<int32_t> plain = model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), o)[0];
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain.back(), v.ends[0]);
  EXPECT_TRUE(g.accepts(text_of(plain))) << text_of(plain);
  o.speculation.draft_tokens = 4;
  o.speculation.adaptive = false;
  GenerationStats stats;
  EXPECT_EQ(model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), o, {}, &stats)[0], plain);
  EXPECT_GT(stats.speculation.drafted, 0);
  // Sampled, two sequences side by side: each a sentence.
  o.speculation.draft_tokens = 0;
  o.temperature = 1.0f;
  o.seed = 3;
  std::vector<int32_t> two = prompt;
  two.insert(two.end(), prompt.begin(), prompt.end());
  for (const std::vector<int32_t>& out : model.generate(two, 2, static_cast<int64_t>(prompt.size()), o)) {
    EXPECT_EQ(out.back(), v.ends[0]);
    EXPECT_TRUE(g.accepts(text_of(out))) << text_of(out);
  }
}

}  // namespace
}  // namespace mhsa
