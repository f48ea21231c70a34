// tests/fuzz/tokenizer_files_fuzz.cpp — libFuzzer target for loading a tokenizer's vocab.json and
// merges.txt (Tokenizer::parse). The input is the vocab, a NUL byte, then the merges (no NUL: all
// vocab, no merges). Malformed files must throw mhsa::Error; a tokenizer that loads must encode
// text to ids that decode back to it. Anything else — a crash, a sanitizer report, another
// exception type, a round-trip mismatch — is a bug. scripts/test.sh runs it for a bounded time
// from the seed files in tests/fuzz/tokenizer_files_corpus.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view vocab = input.substr(0, nul);
  const std::string_view merges = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  try {
    const mhsa::Tokenizer t = mhsa::Tokenizer::parse(vocab, merges);
    for (const std::string_view text : {std::string_view("hello world <|endoftext|> abcabc"), input.substr(0, 200)})
      for (bool special : {false, true})
        if (t.decode(t.encode(text, special)) != text) {
          std::fprintf(stderr, "round trip failed (allow_special=%d)\n", special);
          std::abort();
        }
  } catch (const mhsa::Error&) {
  }
  return 0;
}
