// tests/cpp/test_tokenizer_json.cpp — the pieces under tokenizer.json support, checked directly:
// the regex engine's leftmost-first semantics (alternation order, greedy and lazy repeats,
// lookahead, (?i) with Unicode folds, categories), its refusals and its step bound; Unicode
// normalisation on composed, decomposed, reordered and Hangul text; lossy UTF-8 as Rust and
// Python do it. Their agreement with Hugging Face tokenizers on whole files is
// tests/python/test_tokenizer_json.py's.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "mhsa/error.h"
#include "test_util.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"
#include "text/normalize.h"
#include "text/regex.h"
#include "text/word_cache.h"

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

// $ as Oniguruma reads it without ONIG_OPTION_SINGLELINE: the end of the text or right before a
// "\n" (not before "\r", not after the "\n"); DeepSeek LLM's \s+$ takes a trailing whitespace run.
TEST(Regex, DollarIsTheEndOfTheTextOrOfALine) {
  EXPECT_EQ(matches(R"(\s+$)", "a b  "), (std::vector<std::string>{"  "}));
  EXPECT_EQ(matches(R"(\s+$)", "  a b"), (std::vector<std::string>{}));
  EXPECT_EQ(matches(R"(\s+$)", "\xe3\x80\x80 "), (std::vector<std::string>{"\xe3\x80\x80 "}));  // U+3000 is \s
  EXPECT_EQ(matches("a$", "a\nab\ra"), (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(matches(R"([a-z]+$|\d)", "ab\ncd1\ref"), (std::vector<std::string>{"ab", "1", "ef"}));
  EXPECT_EQ(matches("$", "ab"), (std::vector<std::string>{""}));
  EXPECT_EQ(matches("$", "a\n"), (std::vector<std::string>{"", ""}));
  EXPECT_EQ(matches(R"(x?$)", "x\n"), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(matches(R"((?:a$|b)+)", "aab"), (std::vector<std::string>{"b"}));  // through the general matcher
  EXPECT_EQ(matches(R"(\s?(?=\S)|\s+$)", " a  "), (std::vector<std::string>{" ", "  "}));
}

TEST(Regex, RefusesWhatItDoesNotSupport) {
  for (const char* p : {"(?<=a)b", R"(\w)", "^a", R"(a\Z)", R"(a\z)", R"(\bx)", R"(\1)", "a++", R"(\p{Greek})", "(?s:a)", "[[a]]",
                        "(a"})
    EXPECT_THROW(Regex(p, "test", "pattern"), Error) << p;
  expect_error([] { Regex("a|^b", "test", "pattern"); }, {"the unsupported construct anchor ^"});
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

// The direct path (no continuations) against the general matcher, on random strings over an
// alphabet of letters, digits, spaces, newlines, apostrophes, punctuation and non-ASCII
// characters of several categories, for real Split patterns and for constructs that push the
// direct path's backtracking (lazy and bounded repeats, look-aheads, alternatives in sequences).
TEST(Regex, DirectPathEqualsGeneralMatcher) {
  const std::vector<std::string> patterns = {
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3})",
      R"(a*?b|\s{2,3}?x|[ab]{1,2}(?=a)|(?!a)\p{L}+?|x?y??z*)",
      R"(\s*\s+a|\p{L}{0,2}\p{L}\p{L}*?\d|'?(?=\S)|a(?!b)|)",
      R"(\s+$|\s?[a-z]+$|x*?$|(?=\s$)|[^\n]$)",
  };
  const std::vector<std::string> alphabet = {"a", "b", "x", "y", "z", "S", "s", "'", "t", "1", "7", " ", " ", "\n", "\r",
                                             "\t", "!", "-", "\xc3\xa9", "\xc3\x89", "\xe2\x80\x83", "\xd9\xa3", "\xcc\x81",
                                             "\xc5\xbf", "\xe4\xb8\xad", "\xff"};
  auto rng = test::test_rng();
  std::vector<Unit> units;
  for (const std::string& p : patterns) {
    const Regex re(p, "test", "pattern");
    for (int trial = 0; trial < 300; ++trial) {
      std::string text;
      const size_t len = rng() % 40;
      for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      decode_units(text, units);
      std::vector<std::pair<size_t, size_t>> direct, general;
      re.find_all(units, direct);
      re.find_all_ref(units, general);
      std::string shown;  // the text with its bytes as hex
      for (const char c : text) shown += detail::message(static_cast<int>(static_cast<unsigned char>(c)), " ");
      ASSERT_EQ(direct, general) << p << " on bytes " << shown;
    }
  }
}

// GPT-2's, Llama 3's and Qwen2's patterns go to hand-written scanners of the bytes; each must
// give what the general matcher gives, on random strings of characters of every kind: any ASCII
// character, runs of digits, spaces, \r and \n, characters of every general category and
// White_Space outside ASCII (U+017F LONG S and U+212A KELVIN SIGN for (?i)), random code points
// anywhere, and invalid UTF-8.
TEST(Regex, ScannersEqualGeneralMatcher) {
  const std::vector<std::string> patterns = {
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
  };
  std::vector<std::string> alphabet = {"'", "'", " ", " ", " ", "\n", "\r", "\t", "1", "2", "s", "S", "t", "r", "E", "v",
                                       "l", "L", "m", "D", "x", "!", "."};
  for (const char32_t cp : {0xE9, 0xC9, 0x17F, 0x212A, 0x1C5, 0x2B0, 0x4E2D, 0x10400,  // letters
                            0x301, 0x903, 0x20DD,                                         // marks
                            0x663, 0x2160, 0xB2,                                          // numbers
                            0x2014, 0xAB, 0x20AC, 0x1F600, 0x200D, 0xFEFF, 0xE000, 0x378,  // others
                            0xA0, 0x85, 0x2003, 0x2028, 0x3000, 0x1680}) {                 // White_Space
    alphabet.emplace_back();
    append_utf8(alphabet.back(), cp);
  }
  for (const char* bad : {"\xff", "\x80", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) alphabet.emplace_back(bad);
  auto rng = test::test_rng();
  std::vector<Unit> units;
  for (const std::string& p : patterns) {
    const Regex re(p, "test", "pattern");
    ASSERT_NE(re.scanner(), nullptr) << p;
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      const size_t len = rng() % 30;
      for (size_t i = 0; i < len; ++i) {
        const uint64_t kind = rng() % 4;
        if (kind == 0) text += static_cast<char>(rng() % 128);
        else if (kind == 1) append_utf8(text, static_cast<char32_t>(0x80 + rng() % (0x110000 - 0x80)));
        else text += alphabet[rng() % alphabet.size()];
      }
      std::vector<std::pair<size_t, size_t>> scanned, general;
      re.find_all(text, units, scanned);
      decode_units(text, units);
      re.find_all_ref(units, general);
      for (auto& [b, e] : general) {
        b = b < units.size() ? units[b].offset : text.size();
        e = e < units.size() ? units[e].offset : text.size();
      }
      std::string shown;  // the text with its bytes as hex
      for (const char c : text) shown += detail::message(static_cast<int>(static_cast<unsigned char>(c)), " ");
      ASSERT_EQ(scanned, general) << p << " on bytes " << shown;
    }
  }
  EXPECT_EQ(Regex(R"(\p{N}{1,3}| ?\p{L}+|\s+)", "test", "pattern").scanner(), nullptr);
}

// The scanners classify characters with char_class, the regex with the general categories: for
// every code point, char_class's letters are \p{L} and its numbers \p{N}.
TEST(Unicode, CharClassLettersAndNumbersAreTheCategories) {
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const Category c = category(cp);
    const bool letter = c <= Category::Lo, number = c >= Category::Nd && c <= Category::No;
    const CharClass cls = char_class(cp);
    ASSERT_EQ(cls == CharClass::letter, letter) << "U+" << std::hex << static_cast<uint32_t>(cp);
    ASSERT_EQ(cls == CharClass::number, number) << "U+" << std::hex << static_cast<uint32_t>(cp);
  }
}

TEST(BpeMerges, AgreesWithAMapAsItGrows) {
  auto rng = test::test_rng();
  BpeMerges merges;
  std::map<std::pair<int32_t, int32_t>, BpeMerges::Merge> model;
  for (int step = 0; step < 20000; ++step) {
    const bool wide = rng() % 8 == 0;  // ids up to 2^31 - 1, else a few (many collisions)
    const auto id = [&] { return static_cast<int32_t>(wide ? rng() % (uint64_t{1} << 31) : rng() % 150); };
    const int32_t left = id(), right = id();
    const BpeMerges::Merge m{static_cast<int32_t>(rng() % 100000), static_cast<int32_t>(rng() % 100000)};
    ASSERT_EQ(merges.add(left, right, m), model.emplace(std::pair{left, right}, m).second);
    const int32_t a = id(), b = id();
    const BpeMerges::Merge* found = merges.find(a, b);
    const auto it = model.find({a, b});
    ASSERT_EQ(found != nullptr, it != model.end());
    if (found) ASSERT_TRUE(found->rank == it->second.rank && found->id == it->second.id);
  }
}

TEST(WordCache, AgreesWithAMapAndStartsAfreshWhenFull) {
  auto rng = test::test_rng();
  WordCache cache(200);
  std::map<std::string, std::vector<int32_t>> model;
  for (int step = 0; step < 5000; ++step) {
    std::string word(1 + rng() % (rng() % 4 ? 10 : WordCache::kMaxWordBytes), ' ');
    for (char& c : word) c = static_cast<char>("ab\0\xff"[rng() % 4]);
    const uint64_t h = WordCache::hash(word);
    std::vector<int32_t> found{-7};
    if (cache.find(word, h, found)) {
      ASSERT_TRUE(model.contains(word));
      ASSERT_EQ(std::vector<int32_t>(found.begin() + 1, found.end()), model[word]);
      continue;
    }
    ASSERT_FALSE(model.contains(word));
    ASSERT_EQ(found.size(), 1u);
    std::vector<int32_t> ids(1 + rng() % (rng() % 2 ? 1 : 5));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (1u << 24));
    if (model.size() == 200) model.clear();  // the cache's own reset
    model[word] = ids;
    cache.insert(word, h, ids);
  }
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
