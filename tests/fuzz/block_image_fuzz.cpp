// tests/fuzz/block_image_fuzz.cpp — libFuzzer target for the prompt cache's block files
// (serve/block_image.h): any bytes read back from --cache-dir must be accepted only as the exact
// block asked for, or refused with a reason — never a crash, a read past the input or an
// allocation by a length read from it. The format and prefix asked for come from the input's
// first bytes; when the first byte is odd the checksum is made right, so that the checks past it
// (format, model, tokens) are reached too. scripts/test.sh runs it for a bounded time from
// tests/fuzz/block_image_corpus.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "serve/block_image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mhsa::serve;
  if (size < 2) return 0;
  BlockFormat f;
  f.model.fill(0x5a);
  f.kv_type = (data[1] & 1) ? "bf16" : "f32";
  f.block_tokens = 4;
  f.layers = 1 + (data[1] >> 1 & 1);
  f.kv_heads = 1;
  f.head_dim = f.v_head_dim = 4;
  f.block_bytes = f.layers * f.kv_heads * f.block_tokens * (f.head_dim + f.v_head_dim) * ((data[1] & 1) ? 2 : 4);
  std::vector<std::byte> file(reinterpret_cast<const std::byte*>(data) + 2, reinterpret_cast<const std::byte*>(data) + size);
  if ((data[0] & 1) && file.size() >= 8) {
    const uint64_t sum = xxh64(std::span(file).first(file.size() - 8));
    std::memcpy(file.data() + file.size() - 8, &sum, 8);
  }
  // The prefix asked for: the tokens the file claims to hold where it has them, else 1, 2, 3, ...
  std::vector<int32_t> prefix(4 * (1 + (data[0] >> 1 & 3)));
  for (size_t i = 0; i < prefix.size(); ++i) {
    const size_t at = kImageHeaderBytes + 4 * i;
    prefix[i] = static_cast<int32_t>(i + 1);
    if (!(data[0] & 8) && at + 4 <= file.size()) std::memcpy(&prefix[i], file.data() + at, 4);
  }
  std::span<const std::byte> payload;
  if (check_image(file, f, prefix, &payload).empty()) {
    // Accepted: it is the image of exactly that block, and making it again gives the same bytes.
    if (payload.size() != static_cast<size_t>(f.block_bytes)) __builtin_trap();
    if (make_image(f, prefix, payload) != file) __builtin_trap();
  }
  return 0;
}
