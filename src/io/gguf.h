// io/gguf.h — GGUF files, llama.cpp's format (version 3; version 2, the same layout, is read too):
// the magic "GGUF", a version, tensor and key-value counts, typed metadata (scalars, strings and
// arrays of them), one info per tensor (name, dims, ggml type, offset), then the data section at
// general.alignment (32 by default).
//
// GgufFile memory-maps a file and validates all of it before anything is used: the counts against
// the bytes that could hold them, every string and array length, arrays of arrays (refused, as
// llama.cpp does), keys and tensor names once each, each tensor's type (a ggml type id, named in
// errors), dims (1 to 4, products checked for overflow, rows whole blocks), offsets (aligned,
// inside the data section, no two tensors overlapping). A malformed or hostile file gives an
// mhsa::Error "gguf <file>: <what>: expected …, got …". GgufWriter writes one atomically. Tensors
// load as float32 from F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; the writer stores F32, F16, BF16,
// Q8_0 and Q4_K (mhsa's own Q4_K quantiser, kernels/q4_k.h). Not public, not a model: model/gguf_model.cpp maps names and metadata to a Model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mhsa/tensor.h"

namespace mhsa::detail {

// ggml's type ids of the types this reader loads and this writer stores; every other ggml type is
// known by name and size (so its extent is validated) and refused when loaded.
enum class GgufType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30
};
// "F32", "Q5_K", …; "type <id>" for an id ggml does not have.
std::string gguf_type_name(uint32_t type);
// "f32", "f16", "bf16", "q8_0", "q4_k" (any case) → the type; anything else throws naming `what`.
GgufType parse_gguf_type(std::string_view name, std::string_view what);

enum class GgufValueType : uint32_t { u8, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };

// One metadata value, validated; `bytes` lie in the file: a scalar's bytes, a string's text, or
// an array's `count` elements of type `elem` (strings each with their 8-byte length).
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType elem = GgufValueType::u8;  // arrays only
  uint64_t count = 1;                      // arrays only
  std::span<const uint8_t> bytes;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;          // a ggml type id (gguf_type_name)
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row (contiguous); numpy's shape reversed
  uint64_t offset = 0;        // into the data section
  uint64_t bytes = 0;
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
};

class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);
  // Validates a whole file held in memory (the bytes must outlive the object).
  static GgufFile parse(std::span<const uint8_t> bytes, std::string source = "<memory>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& source() const { return source_; }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufValue* value(std::string_view key) const;       // null when absent
  const GgufTensorInfo* find(std::string_view name) const;  // null when absent

  // Typed metadata: nullopt when absent; an mhsa::Error naming the key when of another type.
  std::optional<uint64_t> get_uint(std::string_view key) const;  // any integer type, >= 0
  std::optional<double> get_float(std::string_view key) const;   // f32 or f64
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // Arrays (empty when absent): of strings, of f32, of any integer type.
  std::vector<std::string_view> get_strings(std::string_view key) const;
  std::vector<float> get_floats(std::string_view key) const;
  std::vector<int64_t> get_ints(std::string_view key) const;

  std::span<const uint8_t> data(const GgufTensorInfo& t) const { return data_.subspan(t.offset, t.bytes); }
  // The tensor as float32 in numpy order (dims reversed), dequantised; throws naming a type it
  // cannot load.
  Tensor load(const GgufTensorInfo& t) const;

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

 private:
  GgufFile() = default;
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::span<const uint8_t> data_;
};

// Builds a GGUF file (version 3) in memory order: metadata in the order added, then tensors, each
// at a multiple of 32 bytes. Tensors are float32 values converted as they are written.
class GgufWriter {
 public:
  void add_u32(std::string key, uint32_t v);
  void add_i32(std::string key, int32_t v);
  void add_f32(std::string key, float v);
  void add_bool(std::string key, bool v);
  void add_string(std::string key, std::string_view v);
  void add_strings(std::string key, const std::vector<std::string>& v);
  void add_f32s(std::string key, std::span<const float> v);
  void add_i32s(std::string key, std::span<const int32_t> v);
  // values: float32 [.., rows, row] (numpy order) stored as `type`; Q8_0 needs rows
  // of whole 32-value blocks, Q4_K of whole 256-value blocks, and both finite values. The writer keeps the tensor until written.
  void add_tensor(std::string name, Tensor values, GgufType type);
  // Atomically: a temporary file beside `path`, renamed into place (never replacing an existing
  // file unless `overwrite`). Throws mhsa::Error naming the problem; leaves no partial file.
  void write(const std::filesystem::path& path, bool overwrite) const;

 private:
  struct Entry {
    std::string name;
    Tensor values;
    GgufType type;
    uint64_t bytes;
  };
  void key(std::string&& k, GgufValueType t);
  std::vector<std::string> keys_;
  std::string kv_bytes_;
  uint64_t kv_count_ = 0;
  std::vector<Entry> tensors_;
};

}  // namespace mhsa::detail
