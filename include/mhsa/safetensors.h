// mhsa/safetensors.h — read and write Hugging Face safetensors files.
//
// The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows)
// plus an optional "__metadata__" object of strings, then the raw little-endian tensor bytes.
// Reading memory-maps the file and checks the header length, the JSON, every dtype, shape and
// offset against the file size, and that no two tensors overlap, before any tensor byte is read;
// a malformed or hostile file gives mhsa::Error naming the tensor and the problem. Writing is
// atomic (a temporary file renamed into place). F32, F16 and BF16; other dtypes are named and
// refused. Not a general tensor store: no other dtypes, no lazy partial writes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mhsa/tensor.h"

namespace mhsa {

enum class DType { f32, f16, bf16 };

struct SafeTensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafeTensors {
 public:
  // Memory-maps and validates `path`.
  static SafeTensors open(const std::string& path);
  // Validates a whole file held in memory (the bytes must outlive the object).
  static SafeTensors parse(std::span<const uint8_t> bytes, std::string source = "<memory>");

  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafeTensorInfo* find(std::string_view name) const;  // null when absent
  // The named tensor as float32 (F16 and BF16 widened); throws naming it when it is absent.
  Tensor load(std::string_view name) const;

  SafeTensors(SafeTensors&&) noexcept;
  SafeTensors& operator=(SafeTensors&&) noexcept;
  ~SafeTensors();

 private:
  SafeTensors() = default;
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;  // the mapped file, when opened from a path
  std::span<const uint8_t> data_;     // the data section
  std::string source_;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model directory as one set of named tensors: its
// model.safetensors, or (when there is none) the shards that model.safetensors.index.json's
// "weight_map" names — the order transformers looks for them in. Every file is opened as
// SafeTensors::open opens one (memory-mapped, validated) before anything is looked up. The index
// is checked as hostile input: shard names must be plain file names in the same directory (no
// "/", "\\", "." or ".."), every shard must exist, no tensor may be held by two shards, and the
// weight_map must name exactly the tensors its shards hold, each in the shard that holds it.
class ShardedSafeTensors {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json and its shards.
  static ShardedSafeTensors open_dir(const std::filesystem::path& dir);
  // An index file; its shards are read from the directory it is in.
  static ShardedSafeTensors open_index(const std::filesystem::path& index_json);

  const std::vector<SafeTensors>& files() const { return files_; }
  std::vector<std::string> names() const;                   // every tensor's name, sorted
  const SafeTensorInfo* find(std::string_view name) const;  // null when absent
  // The named tensor as float32 (see SafeTensors::load); throws naming it when it is absent.
  Tensor load(std::string_view name) const;

 private:
  ShardedSafeTensors() = default;
  std::string source_;                                            // the file or index opened
  std::vector<SafeTensors> files_;
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> where_;  // name → (file, tensor)
};

// The "weight_map" of a model.safetensors.index.json's text (tensor name → shard file name),
// validated: a JSON object whose weight_map is a non-empty object of plain file names (see
// ShardedSafeTensors). `source` names the file in errors.
std::map<std::string, std::string> parse_safetensors_index(std::string_view json_text, const std::string& source);

// Writes float32 tensors (any strides) stored as `dtype`, atomically: `path` is either the old
// file or the complete new one, never a partial write.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, ConstTensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, DType dtype = DType::f32);

}  // namespace mhsa
