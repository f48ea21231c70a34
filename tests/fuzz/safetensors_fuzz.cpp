// tests/fuzz/safetensors_fuzz.cpp — libFuzzer target for the safetensors reader. Any input must
// either parse (and then every tensor must load) or throw mhsa::Error; anything else — a crash,
// a sanitizer report, another exception type — is a bug. scripts/test.sh runs it for a bounded
// time from the seed files in tests/fuzz/corpus.
#include <cstddef>
#include <cstdint>

#include "mhsa/error.h"
#include "mhsa/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mhsa::SafeTensors file = mhsa::SafeTensors::parse({data, size}, "fuzz");
    for (const auto& info : file.tensors())
      if (info.shape.size() <= 4) (void)file.load(info.name);
  } catch (const mhsa::Error&) {
  }
  return 0;
}
