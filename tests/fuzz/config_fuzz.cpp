// tests/fuzz/config_fuzz.cpp — libFuzzer target for reading a Hugging Face config.json
// (Gpt2Config::parse). Any input must either give a config that passes validate() or throw
// mhsa::Error; anything else — a crash, a sanitizer report (stack overflow on deep nesting, a
// float-to-int overflow), another exception type — is a bug. scripts/test.sh runs it for a
// bounded time from the seed files in tests/fuzz/config_corpus.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/gpt2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mhsa::Gpt2Config c = mhsa::Gpt2Config::parse({reinterpret_cast<const char*>(data), size}, "fuzz");
    c.validate("fuzz");
  } catch (const mhsa::Error&) {
  }
  return 0;
}
