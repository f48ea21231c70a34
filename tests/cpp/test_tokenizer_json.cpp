// tests/cpp/test_tokenizer_json.cpp — the pieces under tokenizer.json support, checked directly:
// the regex engine's leftmost-first semantics (alternation order, greedy and lazy repeats,
// lookahead, (?i) with Unicode folds, categories), its refusals and its step bound; Unicode
// normalisation on composed, decomposed, reordered and Hangul text; lossy UTF-8 as Rust and
// Python do it. Their agreement with Hugging Face tokenizers on whole files is
// tests/python/test_tokenizer_json.py's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mhsa/error.h"
#include "test_util.h"
#include "text/hf_tokenizer.h"
#include "text/normalize.h"
#include "text/regex.h"

namespace mhsa::text {
namespace {

using test::expect_error;

// The matches of `pattern` in `text`, as strings.
std::vector<std::string> matches(std::string_view pattern, const std::string& text) {
  const Regex re(pattern, "test", "pattern");
  std::vector<Unit> units;
  decode_units(text, units);
  std::vector<std::pair<size_t, size_t>> found;
  re.find_all(units, found);
  std::vector<std::string> out;
  for (const auto& [b, e] : found) {
    const size_t from = b < units.size() ? units[b].offset : text.size();
    const size_t to = e < units.size() ? units[e].offset : text.size();
    out.push_back(text.substr(from, to - from));
  }
  return out;
}

TEST(Regex, AlternativesInOrderAndRepeats) {
  EXPECT_EQ(matches("a|ab", "ab"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(matches("ab|a", "ab"), (std::vector<std::string>{"ab"}));
  EXPECT_EQ(matches("a+?", "aaa"), (std::vector<std::string>{"a", "a", "a"}));
  EXPECT_EQ(matches("a{1,2}", "aaaaa"), (std::vector<std::string>{"aa", "aa", "a"}));
  EXPECT_EQ(matches("(?:ab)+c", "ababc abc"), (std::vector<std::string>{"ababc", "abc"}));
  EXPECT_EQ(matches(R"(\s+(?!\S)|\s+)", "a   b"), (std::vector<std::string>{"  ", " "}));
  EXPECT_EQ(matches(R"(\p{N}{1,3})", "12345"), (std::vector<std::string>{"123", "45"}));
  EXPECT_EQ(matches(R"([^\s\p{L}]+)", "ab!?\xc3\xa9 ;"), (std::vector<std::string>{"!?", ";"}));
  EXPECT_EQ(matches("x{,2}", "x{,2}"), (std::vector<std::string>{"x{,2}"}));  // not a quantifier: literal
}

TEST(Regex, CaseInsensitiveUsesUnicodeFolds) {
  // (?i)s matches S and U+017F LONG S; k matches U+212A KELVIN SIGN.
  EXPECT_EQ(matches("(?i:'s|k)", "'S '\xc5\xbf \xe2\x84\xaa x"), (std::vector<std::string>{"'S", "'\xc5\xbf", "\xe2\x84\xaa"}));
  EXPECT_EQ(matches("'s", "'S"), (std::vector<std::string>{}));
}

TEST(Regex, CategoriesAndInvalidBytes) {
  EXPECT_EQ(matches(R"(\p{Lu}+)", "abCD\xc3\x89" "f"), (std::vector<std::string>{"CD\xc3\x89"}));
  EXPECT_EQ(matches(R"(\p{M})", "e\xcc\x81"), (std::vector<std::string>{"\xcc\x81"}));
  EXPECT_EQ(matches(R"([\p{P}\p{S}]+)", "a+-=!b"), (std::vector<std::string>{"+-=!"}));
  EXPECT_EQ(matches(R"([^\p{L}])", "a\xff"), (std::vector<std::string>{"\xff"}));  // an invalid byte is "other"
}

TEST(Regex, RefusesWhatItDoesNotSupport) {
  for (const char* p : {"(?<=a)b", R"(\w)", "^a", "a$", R"(\bx)", R"(\1)", "a++", R"(\p{Greek})", "(?s:a)", "[[a]]", "(a"})
    EXPECT_THROW(Regex(p, "test", "pattern"), Error) << p;
  expect_error([] { Regex("(?<=a)", "Tokenizer::load", "pre_tokenizer.pattern.Regex"); },
               {"Tokenizer::load: pre_tokenizer.pattern.Regex: expected a regex of the supported subset", "lookbehind"});
}

TEST(Regex, BacktrackingIsBounded) {
  const Regex re("(?:a|a)*b", "test", "pattern");  // exponential without a bound
  std::vector<Unit> units;
  decode_units(std::string(60, 'a'), units);
  std::vector<std::pair<size_t, size_t>> found;
  expect_error([&] { re.find_all(units, found); }, {"expected a regex that matches without heavy backtracking"});
}

TEST(Normalize, ComposesDecomposesAndReorders) {
  EXPECT_EQ(normalize("e\xcc\x81", NormalForm::nfc), "\xc3\xa9");
  EXPECT_EQ(normalize("\xc3\xa9", NormalForm::nfd), "e\xcc\x81");
  // a + dot below (220) + acute (230), given in the other order: reordered, then composed.
  EXPECT_EQ(normalize("a\xcc\x81\xcc\xa3", NormalForm::nfd), "a\xcc\xa3\xcc\x81");
  EXPECT_EQ(normalize("\xef\xac\x81", NormalForm::nfkc), "fi");  // U+FB01 LIGATURE FI
  EXPECT_EQ(normalize("\xef\xac\x81", NormalForm::nfc), "\xef\xac\x81");
  EXPECT_EQ(normalize("\xea\xb0\x81", NormalForm::nfd), "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8");  // Hangul
  EXPECT_EQ(normalize("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", NormalForm::nfc), "\xea\xb0\x81");
  EXPECT_EQ(normalize("ascii \xff stays", NormalForm::nfc), "ascii \xff stays");
}

TEST(LossyUtf8, OneReplacementPerMaximalSubpart) {
  EXPECT_EQ(lossy_utf8("a\xe4\xb8z"), "a\xef\xbf\xbdz");               // a cut 3-byte sequence: one
  EXPECT_EQ(lossy_utf8("\xff\xfe"), "\xef\xbf\xbd\xef\xbf\xbd");       // two bytes that start nothing: two
  EXPECT_EQ(lossy_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate: three
  EXPECT_EQ(lossy_utf8("\xe4\xb8\xad"), "\xe4\xb8\xad");
}

}  // namespace
}  // namespace mhsa::text
