// tests/fuzz/tokenizer_json_fuzz.cpp — libFuzzer target for tokenizer.json: loading
// (Tokenizer::parse_json: the JSON, every component, the Split regexes) and encoding with what
// loads. The input is the file, a NUL byte, then text to encode (no NUL: the file alone, encoding
// a fixed sample). Malformed or unsupported files must throw mhsa::Error; a tokenizer that loads
// must encode the text (any bytes) to ids within its vocabulary, each of which token_bytes and
// decode accept. Anything else — a crash, a hang, a sanitizer report, another exception type —
// is a bug. scripts/test.sh runs it for a bounded time from tests/fuzz/tokenizer_json_corpus
// (small files written by the `tokenizers` library, one per supported family).
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
  const std::string_view file = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view("Hello <s> w\xc3\xb6rld's 123\n\n x \xff")
                                                              : input.substr(nul + 1);
  try {
    const mhsa::Tokenizer t = mhsa::Tokenizer::parse_json(file);
    for (const bool add : {false, true}) {
      const std::vector<int32_t> ids = t.encode(text, mhsa::EncodeOptions{add, add});
      for (const int32_t id : ids) {
        if (id < 0 || id >= t.vocab_size()) {
          std::fprintf(stderr, "id %d out of range\n", id);
          std::abort();
        }
        (void)t.token_bytes(id);
      }
      (void)t.decode(ids, add);
    }
  } catch (const mhsa::Error&) {
  }
  return 0;
}
