// tests/cpp/test_tokenizer.cpp — the GPT-2 tokenizer: pre-tokenisation edge cases against the
// regex's semantics worked out by hand, BPE merge order on tiny hand-made vocabularies, round trips
// of random bytes, long inputs, and every malformed file giving mhsa::Error. Agreement with
// tiktoken and Hugging Face on real text is tests/python/test_tokenizer.py's job.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "mhsa/tokenizer.h"
#include "test_util.h"
#include "text/unicode_data.h"

namespace mhsa::test {
namespace {

namespace fs = std::filesystem;

const fs::path kGpt2Dir = fs::path(MHSA_TEST_DATA_DIR) / "gpt2-tokenizer";

const Tokenizer& gpt2() {
  static const Tokenizer tok = Tokenizer::load_dir(kGpt2Dir);
  return tok;
}

std::vector<std::string> pretokens(std::string_view text) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text::pretoken_end(text, pos);
    EXPECT_GT(end, pos);
    EXPECT_LE(end, text.size());
    if (end <= pos || end > text.size()) break;
    out.emplace_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerPretokens, SpacesLeadWords) {
  EXPECT_EQ(pretokens(""), Pieces{});
  EXPECT_EQ(pretokens("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pretokens(" hello"), (Pieces{" hello"}));
  EXPECT_EQ(pretokens("  hello"), (Pieces{" ", " hello"}));    // \s+(?!\S) leaves the last space
  EXPECT_EQ(pretokens("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pretokens("hello  "), (Pieces{"hello", "  "}));     // trailing run: all of it
  EXPECT_EQ(pretokens("x "), (Pieces{"x", " "}));
  EXPECT_EQ(pretokens(" "), (Pieces{" "}));
  EXPECT_EQ(pretokens("   "), (Pieces{"   "}));
}

TEST(TokenizerPretokens, OtherWhitespace) {
  // Only U+0020 may lead a word; a lone other space before a word is `\s+`'s.
  EXPECT_EQ(pretokens("a\tb"), (Pieces{"a", "\t", "b"}));
  EXPECT_EQ(pretokens("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pretokens("a \tb"), (Pieces{"a", " ", "\t", "b"}));
  EXPECT_EQ(pretokens("a\t b"), (Pieces{"a", "\t", " b"}));
  EXPECT_EQ(pretokens("a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
  EXPECT_EQ(pretokens("a\r\n"), (Pieces{"a", "\r\n"}));
  EXPECT_EQ(pretokens("a\n \n b"), (Pieces{"a", "\n \n", " b"}));
  EXPECT_EQ(pretokens("a\xC2\xA0" "b"), (Pieces{"a", "\xC2\xA0", "b"}));                        // NBSP
  EXPECT_EQ(pretokens("a\xE3\x80\x80\xE3\x80\x80" "b"), (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));  // U+3000
  EXPECT_EQ(pretokens("a \xE3\x80\x80" "b"), (Pieces{"a", " ", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(pretokens("a\xC2\x85 b"), (Pieces{"a", "\xC2\x85", " b"}));                          // NEL is \s
  EXPECT_EQ(pretokens("a\x1C" "b"), (Pieces{"a", "\x1C", "b"}));  // U+001C: isspace() in Python, not \s
  EXPECT_EQ(pretokens("a\xE1\xA0\x8E" "b"), (Pieces{"a", "\xE1\xA0\x8E", "b"}));  // U+180E: White_Space no more
}

TEST(TokenizerPretokens, Contractions) {
  EXPECT_EQ(pretokens("I'm"), (Pieces{"I", "'m"}));
  EXPECT_EQ(pretokens("don't they're we've you'll he'd she's"),
            (Pieces{"don", "'t", " they", "'re", " we", "'ve", " you", "'ll", " he", "'d", " she", "'s"}));
  EXPECT_EQ(pretokens("IT'S"), (Pieces{"IT", "'", "S"}));  // case-sensitive
  EXPECT_EQ(pretokens("'sup"), (Pieces{"'s", "up"}));      // no word boundary needed
  EXPECT_EQ(pretokens("'l"), (Pieces{"'", "l"}));
  EXPECT_EQ(pretokens("'"), (Pieces{"'"}));
  EXPECT_EQ(pretokens("''s"), (Pieces{"''", "s"}));        // the run of punctuation wins first
  EXPECT_EQ(pretokens(" 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(pretokens("x'llve'ven"), (Pieces{"x", "'ll", "ve", "'ve", "n"}));
  EXPECT_EQ(pretokens("\xE2\x80\x99s"), (Pieces{"\xE2\x80\x99", "s"}));  // U+2019 is not '
}

TEST(TokenizerPretokens, LettersNumbersAndOthers) {
  EXPECT_EQ(pretokens("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(pretokens("in 2024, 3.14"), (Pieces{"in", " 2024", ",", " 3", ".", "14"}));
  EXPECT_EQ(pretokens("x\xC2\xB2"), (Pieces{"x", "\xC2\xB2"}));                  // ² is No: a number
  EXPECT_EQ(pretokens("\xE2\x85\xAB" "a"), (Pieces{"\xE2\x85\xAB", "a"}));       // Ⅻ is Nl
  EXPECT_EQ(pretokens("hello!!! world?"), (Pieces{"hello", "!!!", " world", "?"}));
  EXPECT_EQ(pretokens(" !?# x"), (Pieces{" !?#", " x"}));
  EXPECT_EQ(pretokens("a_b"), (Pieces{"a", "_", "b"}));
  EXPECT_EQ(pretokens("\xE6\x97\xA5\xE6\x9C\xAC" "3"), (Pieces{"\xE6\x97\xA5\xE6\x9C\xAC", "3"}));  // 日本3
  // A combining accent (Mn) is neither letter nor number: decomposed "café" splits.
  EXPECT_EQ(pretokens("cafe\xCC\x81 x"), (Pieces{"cafe", "\xCC\x81", " x"}));
  EXPECT_EQ(pretokens("hi\xF0\x9F\x98\x80\xF0\x9F\x98\x80 \xF0\x9F\x91\x8D"),
            (Pieces{"hi", "\xF0\x9F\x98\x80\xF0\x9F\x98\x80", " \xF0\x9F\x91\x8D"}));
}

TEST(TokenizerPretokens, InvalidUtf8IsOther) {
  EXPECT_EQ(pretokens("a\xFF" "b"), (Pieces{"a", "\xFF", "b"}));
  EXPECT_EQ(pretokens(" \xFF\xFE!"), (Pieces{" \xFF\xFE!"}));
  EXPECT_EQ(pretokens("ab\xE6\x97"), (Pieces{"ab", "\xE6\x97"}));              // truncated 日
  EXPECT_EQ(pretokens("\xC0\xAF" "a"), (Pieces{"\xC0\xAF", "a"}));             // overlong '/'
  EXPECT_EQ(pretokens("\xED\xA0\x80" "a"), (Pieces{"\xED\xA0\x80", "a"}));     // a surrogate
  EXPECT_EQ(pretokens("\xF4\x90\x80\x80" "a"), (Pieces{"\xF4\x90\x80\x80", "a"}));  // past U+10FFFF
  EXPECT_EQ(pretokens("\x80" "abc"), (Pieces{"\x80", "abc"}));
  EXPECT_EQ(pretokens("x\xE6\x97\xA5\xE6"), (Pieces{"x\xE6\x97\xA5", "\xE6"}));
}

TEST(TokenizerPretokens, ClassTables) {
  const auto ranges = text::class_ranges();
  ASSERT_FALSE(ranges.empty());
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i].first, ranges[i].last);
    if (i) EXPECT_LT(ranges[i - 1].last, ranges[i].first);
  }
  EXPECT_LE(ranges.back().last, char32_t{0x10FFFF});
  // char_class's ASCII fast path and the binary search over the ranges agree.
  for (char32_t cp = 0; cp < 0x3000; ++cp) {
    text::CharClass want = text::CharClass::other;
    for (const auto& r : ranges)
      if (cp >= r.first && cp <= r.last) want = r.cls;
    ASSERT_EQ(text::char_class(cp), want) << "U+" << std::hex << static_cast<uint32_t>(cp);
  }
  using text::CharClass;
  EXPECT_EQ(text::char_class(U'a'), CharClass::letter);
  EXPECT_EQ(text::char_class(U'7'), CharClass::number);
  EXPECT_EQ(text::char_class(U'\v'), CharClass::space);
  EXPECT_EQ(text::char_class(U'\''), CharClass::other);
  EXPECT_EQ(text::char_class(U'\u00E9'), CharClass::letter);    // é
  EXPECT_EQ(text::char_class(U'\u0663'), CharClass::number);    // Arabic-Indic 3
  EXPECT_EQ(text::char_class(U'\u2028'), CharClass::space);     // line separator
  EXPECT_EQ(text::char_class(U'\u0301'), CharClass::other);     // combining acute
  EXPECT_EQ(text::char_class(U'\U0001F600'), CharClass::other); // 😀
  EXPECT_EQ(text::char_class(U'\U00020000'), CharClass::letter);  // CJK extension B
  EXPECT_EQ(text::char_class(char32_t{0x10FFFF}), CharClass::other);
}

TEST(Tokenizer, KnownIds) {
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_string(995), "\xC4\xA0world");  // Ġworld
  EXPECT_EQ(tok.token_string(198), "\xC4\x8A");       // "\n" is Ċ
  EXPECT_EQ(tok.token_id(" world"), 995);
  EXPECT_EQ(tok.token_id("<|endoftext|>"), 50256);
  EXPECT_EQ(tok.token_id("no such token, surely"), std::nullopt);
  const std::vector<int32_t> ids = {15496, 995};
  EXPECT_EQ(tok.decode(ids), "Hello world");
}

TEST(Tokenizer, SpecialTokenOnlyWhenAllowed) {
  const Tokenizer& tok = gpt2();
  const std::string text = "a<|endoftext|>b<|endoftext|>";
  const std::vector<int32_t> special = tok.encode(text, true);
  EXPECT_EQ(special, (std::vector<int32_t>{64, 50256, 65, 50256}));
  const std::vector<int32_t> ordinary = tok.encode(text);
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 50256), 0);
  EXPECT_EQ(tok.decode(ordinary), text);
  EXPECT_EQ(tok.decode(special), text);
  EXPECT_EQ(tok.encode("<|endoftext", true), tok.encode("<|endoftext"));
}

// Random bytes of several flavours: uniform bytes, ASCII, and UTF-8 with cut sequences.
std::string random_text(std::mt19937_64& gen, size_t n) {
  static const std::vector<std::string> pieces = {
      " ", "  ", "\n", "\r\n", "\t", "a", "Z", "'s", "'ll", "7", "42", "!", "...", "\xC3\xA9", "\xE6\x97\xA5",
      "\xF0\x9F\x98\x80", "\xCC\x81", "\xC2\xA0", "\xE3\x80\x80", "\xE6\x97", "\xFF", "\x80", "\xED\xA0\x80"};
  std::string s;
  switch (gen() % 3) {
    case 0:
      while (s.size() < n) s += static_cast<char>(gen() & 0xFF);
      break;
    case 1:
      while (s.size() < n) s += static_cast<char>(0x20 + gen() % 0x5F);
      break;
    default:
      while (s.size() < n) s += pieces[gen() % pieces.size()];
  }
  return s;
}

TEST(Tokenizer, RandomBytesRoundTrip) {
  auto gen = test_rng();
  const Tokenizer& tok = gpt2();
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_text(gen, gen() % 400);
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text) << "trial " << trial;
    for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    // Pre-tokens never merge with each other: encoding piece by piece gives the same ids.
    std::vector<int32_t> by_piece;
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = text::pretoken_end(text, pos);
      const std::vector<int32_t> part = tok.encode(std::string_view(text).substr(pos, end - pos));
      by_piece.insert(by_piece.end(), part.begin(), part.end());
      pos = end;
    }
    ASSERT_EQ(by_piece, ids) << "trial " << trial;
  }
}

TEST(Tokenizer, LongInputsAreQuick) {
  auto gen = test_rng();
  const Tokenizer& tok = gpt2();
  std::string letters(1 << 20, 'x');  // one pre-token of 1 MiB: the merge loop must be O(n log n)
  for (char& c : letters) c = static_cast<char>('a' + gen() % 26);
  for (const std::string& text : {std::string(1 << 20, 'x'), letters, random_text(gen, 1 << 20)}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[tokenizer] %zu bytes -> %zu tokens in %.0f ms (%.1f MB/s)\n", text.size(), ids.size(), s * 1e3,
                static_cast<double>(text.size()) / s * 1e-6);
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  auto gen = test_rng();
  const Tokenizer tok = Tokenizer::load_dir(kGpt2Dir);  // a fresh, empty cache
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_text(gen, 2000));
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(gpt2().encode(t));
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 4; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) wrong[w] += tok.encode(texts[i]) != want[i];
    });
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(wrong[w], 0) << "thread " << w;
}

// A scratch directory holding a tiny vocabulary, removed afterwards.
struct TinyVocab {
  fs::path dir;
  explicit TinyVocab(const std::string& tag)
      : dir(fs::temp_directory_path() / ("mhsa_tok_" + tag + "_" + std::to_string(test_seed()))) {
    fs::create_directories(dir);
  }
  ~TinyVocab() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  }
};

// GPT-2's printable spelling of a byte (see the tokenizer's byte alphabet).
std::string byte_char(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// vocab.json with the 256 byte tokens (ids 0..255), `extra` tokens after them, then <|endoftext|>.
std::string vocab_json(const std::vector<std::string>& extra) {
  std::string json = "{";
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    const std::string c = byte_char(b);
    json += "\"" + (c == "\"" || c == "\\" ? "\\" + c : c) + "\": " + std::to_string(id++) + ", ";
  }
  for (const std::string& t : extra) json += "\"" + t + "\": " + std::to_string(id++) + ", ";
  return json + "\"<|endoftext|>\": " + std::to_string(id) + "}";
}

std::vector<std::string> strings(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (const int32_t id : ids) out.emplace_back(tok.token_bytes(id));
  return out;
}

TEST(Tokenizer, MergesLowestRankFirstLeftmostOnTies) {
  TinyVocab v("ranks");
  const auto vocab = v.write("vocab.json", vocab_json({"ab", "bc", "aa", "aaaa"}));
  const Tokenizer ab_first = Tokenizer::load(vocab, v.write("ab.txt", "#version: 0.2\na b\nb c\n"));
  const Tokenizer bc_first = Tokenizer::load(vocab, v.write("bc.txt", "#version: 0.2\nb c\na b\n"));
  EXPECT_EQ(strings(ab_first, ab_first.encode("abc")), (Pieces{"ab", "c"}));
  EXPECT_EQ(strings(bc_first, bc_first.encode("abc")), (Pieces{"a", "bc"}));
  const Tokenizer aa = Tokenizer::load(vocab, v.write("aa.txt", "a a\naa aa\n"));  // no #version line: fine
  EXPECT_EQ(strings(aa, aa.encode("aaa")), (Pieces{"aa", "a"}));
  EXPECT_EQ(strings(aa, aa.encode("aaaaa")), (Pieces{"aaaa", "a"}));
  EXPECT_EQ(strings(aa, aa.encode("aaaaaa")), (Pieces{"aaaa", "aa"}));
  EXPECT_EQ(aa.vocab_size(), 261);
  EXPECT_EQ(aa.eos_id(), 260);
}

TEST(Tokenizer, LoadDirAcceptsBothNamings) {
  TinyVocab v("names");
  fs::copy_file(kGpt2Dir / "encoder.json", v.dir / "vocab.json");
  fs::copy_file(kGpt2Dir / "vocab.bpe", v.dir / "merges.txt");
  const Tokenizer hf = Tokenizer::load_dir(v.dir);
  const std::string text = "Hugging Face's names, same tokens: 12345 \xF0\x9F\x98\x80";
  EXPECT_EQ(hf.encode(text), gpt2().encode(text));
  fs::remove(v.dir / "merges.txt");
  expect_error([&] { Tokenizer::load_dir(v.dir); }, {"Tokenizer::load: merges: expected a readable file", "merges.txt': No such file"});
  fs::remove(v.dir / "vocab.json");
  expect_error([&] { Tokenizer::load_dir(v.dir); },
               {"Tokenizer::load_dir: dir: expected a directory with tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe"});
  expect_error([&] { Tokenizer::load_dir(v.dir / "absent"); }, {"expected a directory", "(no such directory)"});
}

TEST(TokenizerErrors, MissingFiles) {
  TinyVocab v("missing");
  const auto merges = v.write("merges.txt", "");
  expect_error([&] { Tokenizer::load(v.dir / "nope.json", merges); },
               {"Tokenizer::load: vocab: expected a readable file", "nope.json': No such file"});
  expect_error([&] { Tokenizer::load(v.dir, merges); }, {"vocab: expected a regular file, got a directory"});
}

// Loading `vocab` (with valid merges) fails with every fragment in the message.
void expect_vocab_error(const std::string& vocab, std::initializer_list<std::string> fragments) {
  TinyVocab v("vocab");
  const auto path = v.write("vocab.json", vocab);
  expect_error([&] { Tokenizer::load(path, v.write("merges.txt", "")); }, fragments);
}

TEST(TokenizerErrors, MalformedVocab) {
  expect_vocab_error("", {"vocab '", "vocab.json': expected JSON, got parse error at line 1, column 1"});
  expect_vocab_error("{\"a\": 1,", {"expected JSON, got parse error"});
  expect_vocab_error("{\"a\": 0} trailing", {"expected JSON, got parse error"});
  expect_vocab_error("[1, 2]", {"vocab.json': expected a JSON object of token → id, got an array"});
  expect_vocab_error("7", {"expected a JSON object of token → id, got 7"});
  expect_vocab_error("{\"a\": 1.5}", {"key 'a': expected an integer id, got 1.5"});
  expect_vocab_error("{\"a\": \"1\"}", {"key 'a': expected an integer id, got the string '1'"});
  expect_vocab_error("{\"a\": {\"b\": 1}}", {"key 'a': expected an integer id, got an object"});
  expect_vocab_error("{\"a\": null}", {"key 'a': expected an integer id, got null"});
  expect_vocab_error("{\"a\": -1}", {"key 'a': expected a non-negative id, got -1"});
  expect_vocab_error("{\"a\": 99999999999}", {"key 'a': expected an id below 2^31, got 99999999999"});
  expect_vocab_error("{\"a b\": 0}", {"key 'a b': expected characters of GPT-2's byte alphabet"});
  expect_vocab_error("{\"\\n\": 0}", {"key '\\x0a': expected characters of GPT-2's byte alphabet"});
  expect_vocab_error("{\"a\": 0, \"b\": 2}", {"key 'b': expected an id in [0, 2) (the file has 2 tokens), got 2"});
  expect_vocab_error("{\"a\": 0, \"b\": 0}", {"key 'b': expected a unique id, got 0, the id of 'a' too"});
  expect_vocab_error("{\"a\": 0, \"a\": 1}", {"key 'a': expected each token once, got a second entry"});
  expect_vocab_error("{\"a\": 0}", {"expected a token for every byte, got none for byte 0 ('Ā')"});
  std::string no_eos = vocab_json({});
  no_eos = no_eos.substr(0, no_eos.rfind(", ")) + "}";
  expect_vocab_error(no_eos, {"expected the special token <|endoftext|>, got none"});
}

// Loading `merges` with the tiny vocab (tokens ab and abc besides the bytes) fails with every fragment.
void expect_merges_error(const std::string& merges, std::initializer_list<std::string> fragments) {
  TinyVocab v("merges");
  const auto vocab = v.write("vocab.json", vocab_json({"ab", "abc"}));
  const auto path = v.write("merges.txt", merges);
  expect_error([&] { Tokenizer::load(vocab, path); }, fragments);
}

TEST(TokenizerErrors, MalformedMerges) {
  expect_merges_error("#version: 0.2\na b c\n",
                      {"Tokenizer::load: merges '", "merges.txt' line 2: expected two tokens separated by one space, got 'a b c'"});
  expect_merges_error("ab\n", {"line 1: expected two tokens separated by one space, got 'ab'"});
  expect_merges_error("a b\n\nab c\n", {"line 2: expected two tokens separated by one space, got ''"});
  expect_merges_error("a  b\n", {"line 1: expected two tokens separated by one space"});
  expect_merges_error("a b\nab x\n", {"line 2: expected a merge whose result is in the vocab, got 'ab' + 'x'"});
  expect_merges_error("a b\nabq c\n", {"line 2: expected tokens of the vocab, got 'abq', which it does not have"});
  expect_merges_error("a b\nab zz\n", {"line 2: expected tokens of the vocab, got 'zz'"});
  expect_merges_error("a b\na b\n", {"line 2: expected each merge once, got 'a b' again"});
  expect_merges_error("a\tb\n", {"line 1: expected two tokens separated by one space, got 'a\\x09b'"});
  expect_merges_error("a \xFF\n", {"line 1: expected characters of GPT-2's byte alphabet", "'a \\xff'"});
  // Windows line ends are fine.
  TinyVocab v("crlf");
  const Tokenizer tok = Tokenizer::load(v.write("vocab.json", vocab_json({"ab", "abc"})),
                                        v.write("merges.txt", "#version: 0.2\r\na b\r\nab c\r\n"));
  EXPECT_EQ(strings(tok, tok.encode("abc")), (Pieces{"abc"}));
}

TEST(TokenizerErrors, MutatedFilesLoadOrThrow) {
  auto gen = test_rng();
  TinyVocab v("mutated");
  const std::string vocab = vocab_json({"ab", "abc", "\xC4\xA0" "a"}), merges = "#version: 0.2\na b\nab c\n\xC4\xA0 a\n";
  const auto mutate = [&](std::string s) {
    for (int k = 0, n = 1 + static_cast<int>(gen() % 4); k < n && !s.empty(); ++k) {
      const size_t at = gen() % s.size();
      switch (gen() % 3) {
        case 0: s[at] = static_cast<char>(gen() & 0xFF); break;
        case 1: s.erase(at, 1 + gen() % 8); break;
        default: s.resize(at);
      }
    }
    return s;
  };
  int loaded = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool vocab_side = trial % 2 == 0;
    const auto vocab_path = v.write("vocab.json", vocab_side ? mutate(vocab) : vocab);
    const auto merges_path = v.write("merges.txt", vocab_side ? merges : mutate(merges));
    try {
      const Tokenizer tok = Tokenizer::load(vocab_path, merges_path);
      const std::string text = "abc \xC4\xA0" "a 'll \xFF";
      EXPECT_EQ(tok.decode(tok.encode(text)), text);
      ++loaded;
    } catch (const Error&) {
    }
  }
  std::printf("[tokenizer] %d of 300 mutated files still loaded\n", loaded);
}

// decode leaves out ids past the vocabulary, as Hugging Face's decode does, and refuses negative ones.
TEST(TokenizerErrors, IdsOutOfRange) {
  const Tokenizer& tok = gpt2();
  const std::vector<int32_t> ids = {15496, 50257, INT32_MAX, 11};
  EXPECT_EQ(tok.decode(ids), tok.decode(std::vector<int32_t>{15496, 11}));
  const std::vector<int32_t> negative = {15496, -1};
  expect_error([&] { tok.decode(negative); }, {"Tokenizer::decode: ids[1]: expected a token id >= 0, got -1"});
  expect_error([&] { tok.token_bytes(-5); }, {"Tokenizer::token_bytes: id: expected an id in [0, 50257), got -5"});
  expect_error([&] { tok.token_string(50257); }, {"expected an id in [0, 50257), got 50257"});
}

// The byte-level tokenizer has no special token: allowing special tokens changes nothing (it read
// the token at index -1 once, a crash under `mhsa chat` on the default model).
TEST(TokenizerBytes, AllowSpecialWithoutSpecialTokens) {
  const Tokenizer tok = Tokenizer::bytes();
  const std::string text = "a<|endoftext|>\xff\n";
  const std::vector<int32_t> ids = tok.encode(text, EncodeOptions{true, true});
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(tok.decode(ids), text);
}

}  // namespace
}  // namespace mhsa::test
