// serve/block_image.h — the prompt cache's block image (serve/prompt_cache.h): one full KV block
// with everything needed to know whether it may be used — the model's identity, the pool's
// geometry and KV type, every token of the prefix it ends, and a checksum — the same bytes in RAM
// and as a file. check_image is the parser of files read back from disk, so it takes any bytes
// (fuzzed: tests/fuzz/block_image_fuzz.cpp). Not a KV layout: the block's bytes are the pool's,
// copied whole.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mhsa::serve {

using Digest = std::array<uint8_t, 32>;  // SHA-256
std::string hex(const Digest& d);

// XXH64 (Yann Collet's xxHash, 64-bit), the images' checksum: ~10 GB/s on one core where SHA-256
// reads 0.3–0.5, and a 2,000-token prefix of the default model is 92 MB of f32 keys and values.
uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed = 0);

// What every block image of a server must match.
struct BlockFormat {
  Digest model{};           // serve::model_identity()
  std::string kv_type;      // the pool's KV type by name: "f32", "bf16", ... (at most 15 bytes)
  int64_t block_tokens = 0, layers = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0;
  int64_t block_bytes = 0;  // KVBlockPool::block_bytes()
};

// The layout (little-endian): 96 bytes of header — "MHSAKVC\n", u32 version (1), u32
// block_tokens, layers, kv_heads, head_dim, v_head_dim, char[16] kv_type (NUL-padded), u8[32]
// model, u64 tokens, u64 payload bytes — then int32 tokens[tokens], the payload (the block's
// bytes), and the u64 XXH64 of everything before it.
constexpr size_t kImageHeaderBytes = 96;
// The size of the image of a block ending a prefix of `tokens` tokens.
uint64_t image_bytes(const BlockFormat& f, uint64_t tokens);
// The image of a block: `prefix` is every token up to the block's end, `block` its bytes
// (f.block_bytes of them).
std::vector<std::byte> make_image(const BlockFormat& f, std::span<const int32_t> prefix, std::span<const std::byte> block);
// Checks `image` (any bytes) against the format and the prefix it must end; returns "" when it
// is that block's image, else why not ("truncated: ...", "a bad checksum", "another model ...").
// On success *payload is the block's bytes inside `image`. Reads nothing past `image` and
// allocates nothing by a length read from it.
std::string check_image(std::span<const std::byte> image, const BlockFormat& f, std::span<const int32_t> prefix,
                        std::span<const std::byte>* payload = nullptr);
// Where the block's bytes begin in an image of `tokens` tokens.
inline size_t image_payload_offset(size_t tokens) { return kImageHeaderBytes + 4 * tokens; }

}  // namespace mhsa::serve
