// tests/fuzz/gguf_fuzz.cpp — libFuzzer target for the GGUF reader, its model mapping and its
// tokenizer. Any input must either parse (and then every metadata value must read through the
// typed getters or throw mhsa::Error, every tensor up to a bounded size load, the model config be
// read or refused, and the tokenizer of the metadata be read or refused — when read, it encodes and
// decodes a few texts) or throw mhsa::Error; anything else — a crash, a sanitizer report, another exception type — is a
// bug. scripts/test.sh runs it for a bounded time from the seed files in tests/fuzz/gguf_corpus.
#include <cstddef>
#include <cstdint>

#include "io/gguf.h"
#include "mhsa/error.h"
#include "model/gguf_model.h"
#include "mhsa/tokenizer.h"

namespace {
template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const mhsa::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mhsa::detail;
  try {
    const GgufFile file = GgufFile::parse({data, size}, "fuzz");
    for (const auto& kv : file.metadata()) {
      const std::string& key = kv.first;
      attempt([&] { (void)file.get_uint(key); });
      attempt([&] { (void)file.get_float(key); });
      attempt([&] { (void)file.get_string(key); });
      attempt([&] { (void)file.get_bool(key); });
      attempt([&] { (void)file.get_strings(key); });
      attempt([&] { (void)file.get_floats(key); });
      attempt([&] { (void)file.get_ints(key); });
    }
    for (const GgufTensorInfo& t : file.tensors())
      if (t.bytes <= (uint64_t{1} << 20)) attempt([&] { (void)file.load(t); });
    attempt([&] {
      const mhsa::Tokenizer tok = mhsa::text::gguf_tokenizer(file, -1);
      for (const char* text : {"Hello world", " a  b\n\n12345 \xe4\xb8\xad\xe6\x96\x87 <s></s><|endoftext|>", "\xff\xfe x", ""}) {
        (void)tok.decode(tok.encode(text, mhsa::EncodeOptions{true, true}));
        (void)tok.decode(tok.encode(text, mhsa::EncodeOptions{false, false}), true);
      }
    });
    (void)GgufModelFile::config_of(file);
  } catch (const mhsa::Error&) {
  }
  return 0;
}
