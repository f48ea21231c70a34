// tests/fuzz/grammar_fuzz.cpp — libFuzzer target for constrained decoding (mhsa/grammar.h). The
// input's first byte picks the compiler (even: GBNF, odd: JSON Schema); up to a NUL byte is the
// grammar or schema, the rest a text. A grammar that compiles is matched against the text, and a
// constraint over a small vocabulary (single bytes and a few longer tokens) walks it token by token,
// each mask computed. Any input must compile or throw mhsa::Error; anything else — a crash, a hang
// (left recursion, {0,1000000000}, deep nesting), a sanitizer report, another exception — is a bug.
// scripts/test.sh runs it from the seeds in tests/fuzz/grammar_corpus.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mhsa/error.h"
#include "mhsa/grammar.h"

namespace {

std::shared_ptr<const mhsa::TokenVocabulary> vocabulary() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\": ", "true", "null", "ab", "\xC3\xA9", "  ", "\n"}) bytes.emplace_back(t);
    bytes.emplace_back();  // end
    const int32_t end = static_cast<int32_t>(bytes.size() - 1);
    return std::make_shared<const mhsa::TokenVocabulary>(bytes, std::vector<int32_t>{end});
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = in.find('\0');
  const std::string_view source = in.substr(0, nul), text = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  try {
    const mhsa::Grammar g =
        data[0] % 2 == 0 ? mhsa::Grammar::from_gbnf(source) : mhsa::Grammar::from_json_schema(source);
    (void)g.accepts(text);
    const mhsa::Constraint c(g, vocabulary());
    mhsa::ConstraintState s = c.start();
    for (const char ch : text.substr(0, 64)) {
      const int32_t t = static_cast<unsigned char>(ch);
      if (!s.allows(t)) break;
      s.advance(t);
    }
    (void)s.allowed();
  } catch (const mhsa::Error&) {
  }
  return 0;
}
