// io/sha256.h — SHA-256 (FIPS 180-4) of bytes or of a file, for checking that a downloaded model
// file is the one its registry entry names. Portable C++, about 0.3–0.5 GB/s on one core: a
// model file is hashed once and the result remembered (src/model/registry.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace mhsa::detail {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::array<uint8_t, 32> finish();  // the digest; the object must not be updated afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// Lower-case hex of the digest of `bytes`.
std::string sha256_hex(std::string_view bytes);
// Lower-case hex of the digest of a regular file's bytes; errors name fn and arg (InputFile's).
std::string sha256_file_hex(const std::filesystem::path& path, std::string_view fn, std::string_view arg);

}  // namespace mhsa::detail
