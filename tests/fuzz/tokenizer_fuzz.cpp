// tests/fuzz/tokenizer_fuzz.cpp — libFuzzer target for the tokenizer's pre-tokeniser and BPE on
// arbitrary bytes (invalid UTF-8 included), with GPT-2's real vocabulary. Every input must encode
// to ids that decode to exactly the input, with and without special tokens, and the pre-tokens
// must tile the input; anything else (a crash, a sanitizer report, a mismatch) aborts.
// MHSA_TOKENIZER_DIR names the vocabulary directory (scripts/test.sh sets tests/data/gpt2-tokenizer).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "mhsa/tokenizer.h"

namespace {
const mhsa::Tokenizer& tokenizer() {
  static const mhsa::Tokenizer t = [] {
    const char* dir = std::getenv("MHSA_TOKENIZER_DIR");
    return mhsa::Tokenizer::load_dir(dir ? dir : "tests/data/gpt2-tokenizer");
  }();
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const mhsa::Tokenizer& t = tokenizer();
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    if (t.decode(ids) != text) {
      std::fprintf(stderr, "round trip failed (allow_special=%d)\n", special);
      std::abort();
    }
  }
  size_t covered = 0;
  for (std::string_view piece : mhsa::Tokenizer::pretokenize(text)) {
    if (piece.empty() || piece.data() != text.data() + covered) std::abort();
    covered += piece.size();
  }
  if (covered != text.size()) std::abort();
  return 0;
}
