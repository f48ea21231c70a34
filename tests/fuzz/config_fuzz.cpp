// tests/fuzz/config_fuzz.cpp — libFuzzer target for the JSON files of a model directory:
// config.json (Gpt2Config::parse and ModelConfig::parse, every family), generation_config.json
// (ModelConfig::read_generation_config) and model.safetensors.index.json (parse_safetensors_index). Any input must either give a config that
// passes validate() (an index whose shard names are plain file names) or throw mhsa::Error;
// anything else — a crash, a sanitizer report (stack overflow on deep nesting, a float-to-int
// overflow), another exception type — is a bug. scripts/test.sh runs it for a bounded time from
// the seed files in tests/fuzz/config_corpus.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/gpt2.h"
#include "mhsa/model_config.h"
#include "mhsa/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const mhsa::Gpt2Config c = mhsa::Gpt2Config::parse(text, "fuzz");
    c.validate("fuzz");
  } catch (const mhsa::Error&) {
  }
  try {
    const mhsa::ModelConfig c = mhsa::ModelConfig::parse(text, "fuzz");
    c.validate("fuzz");
  } catch (const mhsa::Error&) {
  }
  try {
    mhsa::ModelConfig c;
    c.vocab_size = 1000;
    c.read_generation_config(text, "fuzz");
    for (int32_t id : c.eos_token_ids)
      if (id < 0 || id >= c.vocab_size) __builtin_trap();
  } catch (const mhsa::Error&) {
  }
  try {
    for (const auto& [name, shard] : mhsa::parse_safetensors_index(text, "fuzz"))
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") __builtin_trap();
  } catch (const mhsa::Error&) {
  }
  return 0;
}
