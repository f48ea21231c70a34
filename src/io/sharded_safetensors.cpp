// io/sharded_safetensors.cpp — a model directory's weights as one set of named tensors: a single
// model.safetensors, or the shards of model.safetensors.index.json (see mhsa/safetensors.h). The
// index is untrusted input like any file: its shard names are kept inside the directory, its size
// is bounded, and it must agree with the shards exactly. Not a writer (the library writes single
// files).
#include <algorithm>
#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "mhsa/safetensors.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::json_excerpt;
using detail::message;
using detail::quote;
using json = nlohmann::json;
namespace fs = std::filesystem;

// Indexes of the largest models are a few hundred KiB; the bound keeps a hostile one from being
// read into memory whole.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
// Shards are each opened and mapped; no real checkpoint has more than a few hundred.
constexpr size_t kMaxShards = 10000;

// A shard's name from the index: a plain file name, so that the index cannot reach outside its
// directory (an absolute path, "../x", "a/b") or name the directory itself.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::string_view json_text, const std::string& source) {
  const std::string fn = "safetensors index " + source;
  const json j = detail::parse_json(json_text, fn, "file", "UTF-8 JSON");
  if (!j.is_object()) fail(fn, "file", "a JSON object with a \"weight_map\"", json_excerpt(j));
  if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
    fail(fn, "weight_map", "a non-empty object of tensor name → shard file",
         j.contains("weight_map") ? json_excerpt(j["weight_map"]) : "none");
  std::map<std::string, std::string> map;
  std::set<std::string> shards;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    const std::string arg = "weight_map " + quote(name);
    if (!shard.is_string() || !plain_file_name(shard.get<std::string>()))
      fail(fn, arg, "the name of a file in the index's directory (no \"/\", \"\\\", \".\" or \"..\")", json_excerpt(shard));
    shards.insert(shard.get<std::string>());
    if (shards.size() > kMaxShards) fail(fn, "weight_map", message("at most ", kMaxShards, " shard files"), "more");
    map.emplace(name, shard.get<std::string>());
  }
  return map;
}

ShardedSafeTensors ShardedSafeTensors::open_dir(const fs::path& dir) {
  const std::string fn = "ShardedSafeTensors::open_dir";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(fn, "dir", "a directory", "'" + dir.string() + "' (no such directory)");
  if (fs::exists(dir / "model.safetensors", ec)) {
    ShardedSafeTensors set;
    set.source_ = (dir / "model.safetensors").string();
    set.files_.push_back(SafeTensors::open(set.source_));
    for (size_t t = 0; t < set.files_[0].tensors().size(); ++t) set.where_.emplace(set.files_[0].tensors()[t].name, std::pair{0, t});
    return set;
  }
  if (fs::exists(dir / "model.safetensors.index.json", ec)) return open_index(dir / "model.safetensors.index.json");
  fail(fn, "dir", "a directory holding model.safetensors or model.safetensors.index.json",
       "'" + dir.string() + "' (neither)");
}

ShardedSafeTensors ShardedSafeTensors::open_index(const fs::path& index_json) {
  const std::string source = index_json.string();
  const std::string fn = "safetensors index " + source;
  std::string text;
  {
    detail::InputFile file(index_json, fn, "path");
    if (file.size() > kMaxIndexBytes)
      fail(fn, "file size", message("at most ", detail::bytes_string(kMaxIndexBytes)), detail::bytes_string(file.size()));
    text = file.read_all();
  }
  const std::map<std::string, std::string> weight_map = parse_safetensors_index(text, source);
  ShardedSafeTensors set;
  set.source_ = source;
  std::map<std::string, size_t> shard_index;  // shard file name → files_ index
  for (const auto& [name, shard] : weight_map) {
    if (shard_index.count(shard)) continue;
    const fs::path path = index_json.parent_path() / shard;
    std::error_code ec;
    if (!fs::exists(path, ec))
      fail(fn, "weight_map " + quote(name), "an existing shard file", quote(path.string()) + " (no such file)");
    shard_index.emplace(shard, set.files_.size());
    set.files_.push_back(SafeTensors::open(path.string()));
  }
  // Every tensor the shards hold, in exactly one shard, and in the one the index names.
  std::vector<std::string> shard_name(set.files_.size());
  for (const auto& [shard, i] : shard_index) shard_name[i] = shard;
  for (size_t f = 0; f < set.files_.size(); ++f) {
    const auto& tensors = set.files_[f].tensors();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const std::string& name = tensors[t].name;
      const auto [it, fresh] = set.where_.emplace(name, std::pair{f, t});
      if (!fresh)
        fail(fn, "tensor " + quote(name), "one shard holding it",
             message("two: ", quote(shard_name[it->second.first]), " and ", quote(shard_name[f])));
      const auto mapped = weight_map.find(name);
      if (mapped == weight_map.end())
        fail(fn, "weight_map", message("an entry for every tensor of the shards"),
             message("none for ", quote(name), " (in ", quote(shard_name[f]), ")"));
      if (mapped->second != shard_name[f])
        fail(fn, "weight_map " + quote(name), message("the shard holding it, ", quote(shard_name[f])),
             quote(mapped->second));
    }
  }
  for (const auto& [name, shard] : weight_map)
    if (!set.where_.count(name))
      fail(fn, "weight_map " + quote(name), message("a tensor of shard ", quote(shard)), "none (absent from the shard)");
  return set;
}

std::vector<std::string> ShardedSafeTensors::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, at] : where_) out.push_back(name);
  return out;
}

const SafeTensorInfo* ShardedSafeTensors::find(std::string_view name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second.first].tensors()[it->second.second];
}

Tensor ShardedSafeTensors::load(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end())
    fail("safetensors " + source_, "name", "a tensor of the checkpoint", message(quote(name), " (absent)"));
  return files_[it->second.first].load(name);
}

}  // namespace mhsa
