// serve/block_image.cpp — block images (see block_image.h): XXH64, writing an image, and the
// checks that an image read back from a file is exactly the block asked for.
#include "serve/block_image.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>

#include "mhsa/error.h"

namespace mhsa::serve {
namespace {

static_assert(std::endian::native == std::endian::little, "block images are little-endian, read in place");

constexpr char kMagic[8] = {'M', 'H', 'S', 'A', 'K', 'V', 'C', '\n'};
constexpr uint32_t kVersion = 1;
constexpr size_t kChecksumBytes = 8;
constexpr size_t kKvTypeBytes = 16;

// Header offsets.
constexpr size_t kVersionAt = 8, kGeometryAt = 12, kKvTypeAt = 32, kModelAt = 48, kTokensAt = 80, kPayloadAt = 88;

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

constexpr uint64_t P1 = 11400714785074694791ull, P2 = 14029467366897019727ull, P3 = 1609587929392839161ull,
                   P4 = 9650029242287828579ull, P5 = 2870177450012600261ull;

uint64_t xxh_round(uint64_t acc, uint64_t input) { return std::rotl(acc + input * P2, 31) * P1; }
uint64_t xxh_merge(uint64_t acc, uint64_t v) { return (acc ^ xxh_round(0, v)) * P1 + P4; }

std::string geometry(int64_t bt, int64_t l, int64_t h, int64_t d, int64_t dv, std::string_view kv, int64_t bytes) {
  return detail::message(kv, " KV, ", bt, "-token blocks of ", l, " layers × ", h, " heads × (", d, " + ", dv,
                         "), ", bytes, " bytes");
}

}  // namespace

std::string hex(const Digest& d) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) s += {digits[b >> 4], digits[b & 15]};
  return s;
}

uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed) {
  const std::byte* p = bytes.data();
  const std::byte* const end = p + bytes.size();
  uint64_t h;
  if (bytes.size() >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    for (; end - p >= 32; p += 32) {
      v1 = xxh_round(v1, load<uint64_t>(p));
      v2 = xxh_round(v2, load<uint64_t>(p + 8));
      v3 = xxh_round(v3, load<uint64_t>(p + 16));
      v4 = xxh_round(v4, load<uint64_t>(p + 24));
    }
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + P5;
  }
  h += bytes.size();
  for (; end - p >= 8; p += 8) h = std::rotl(h ^ xxh_round(0, load<uint64_t>(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    h = std::rotl(h ^ (uint64_t{load<uint32_t>(p)} * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; ++p) h = std::rotl(h ^ (static_cast<uint64_t>(*p) * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  return h ^ (h >> 32);
}

uint64_t image_bytes(const BlockFormat& f, uint64_t tokens) {
  return kImageHeaderBytes + 4 * tokens + static_cast<uint64_t>(f.block_bytes) + kChecksumBytes;
}

std::vector<std::byte> make_image(const BlockFormat& f, std::span<const int32_t> prefix, std::span<const std::byte> block) {
  std::vector<std::byte> out(image_bytes(f, prefix.size()));
  std::byte* p = out.data();
  std::memcpy(p, kMagic, sizeof kMagic);
  store<uint32_t>(p + kVersionAt, kVersion);
  const int64_t dims[] = {f.block_tokens, f.layers, f.kv_heads, f.head_dim, f.v_head_dim};
  for (size_t i = 0; i < 5; ++i) store<uint32_t>(p + kGeometryAt + 4 * i, static_cast<uint32_t>(dims[i]));
  std::memcpy(p + kKvTypeAt, f.kv_type.data(), std::min(f.kv_type.size(), kKvTypeBytes - 1));
  std::memcpy(p + kModelAt, f.model.data(), f.model.size());
  store<uint64_t>(p + kTokensAt, prefix.size());
  store<uint64_t>(p + kPayloadAt, block.size());
  std::memcpy(p + kImageHeaderBytes, prefix.data(), prefix.size_bytes());
  std::memcpy(p + image_payload_offset(prefix.size()), block.data(), block.size());
  const size_t body = out.size() - kChecksumBytes;
  store<uint64_t>(p + body, xxh64({p, body}));
  return out;
}

std::string check_image(std::span<const std::byte> image, const BlockFormat& f, std::span<const int32_t> prefix,
                        std::span<const std::byte>* payload) {
  using detail::message;
  const size_t size = image.size();
  const std::byte* p = image.data();
  if (size < kImageHeaderBytes + kChecksumBytes)
    return message("truncated: ", size, " bytes, fewer than a header and a checksum (", kImageHeaderBytes + kChecksumBytes, ")");
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) return "not a prompt cache block (no MHSAKVC magic)";
  if (const uint32_t v = load<uint32_t>(p + kVersionAt); v != kVersion)
    return message("version ", v, ", expected ", kVersion);
  // The lengths before anything is read by them: the tokens and the payload must fill the file exactly.
  const uint64_t tokens = load<uint64_t>(p + kTokensAt), payload_bytes = load<uint64_t>(p + kPayloadAt);
  const uint64_t room = size - kImageHeaderBytes - kChecksumBytes;
  if (tokens > room / 4)
    return message("truncated or a bad token count: ", tokens, " tokens, the file has room for ", room / 4);
  if (payload_bytes != room - 4 * tokens)
    return message("truncated or a bad length: a block of ", payload_bytes, " bytes, the file holds ", room - 4 * tokens);
  if (load<uint64_t>(p + size - kChecksumBytes) != xxh64(image.first(size - kChecksumBytes))) return "a bad checksum";
  // Then what it is: the same model, format and tokens, or another block.
  int64_t dims[5];
  for (size_t i = 0; i < 5; ++i) dims[i] = load<uint32_t>(p + kGeometryAt + 4 * i);
  char kv[kKvTypeBytes + 1] = {};
  std::memcpy(kv, p + kKvTypeAt, kKvTypeBytes);
  const std::string_view kv_type(kv);
  char want_kv[kKvTypeBytes] = {};  // the whole field, NUL-padded: nothing after the name goes unchecked
  std::memcpy(want_kv, f.kv_type.data(), std::min(f.kv_type.size(), kKvTypeBytes - 1));
  if (dims[0] != f.block_tokens || dims[1] != f.layers || dims[2] != f.kv_heads || dims[3] != f.head_dim ||
      dims[4] != f.v_head_dim || std::memcmp(want_kv, p + kKvTypeAt, kKvTypeBytes) != 0 ||
      payload_bytes != static_cast<uint64_t>(f.block_bytes))
    return "another KV format: " + geometry(dims[0], dims[1], dims[2], dims[3], dims[4], kv_type, static_cast<int64_t>(payload_bytes)) +
           ", expected " + geometry(f.block_tokens, f.layers, f.kv_heads, f.head_dim, f.v_head_dim, f.kv_type, f.block_bytes);
  if (std::memcmp(p + kModelAt, f.model.data(), f.model.size()) != 0)
    return "another model (or weights, weight type or model files changed since it was written)";
  if (tokens != prefix.size()) return message("another prefix: ", tokens, " tokens, expected ", prefix.size());
  if (std::memcmp(p + kImageHeaderBytes, prefix.data(), prefix.size_bytes()) != 0) return "another prefix: other tokens";
  if (payload) *payload = image.subspan(image_payload_offset(tokens), payload_bytes);
  return {};
}

}  // namespace mhsa::serve
