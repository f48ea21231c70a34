// io/safetensors.cpp — safetensors reading (memory-mapped, validated) and atomic writing.
#include "mhsa/safetensors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "kernels/half.h"
#include "text/unicode_data.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::json_excerpt;
using detail::message;
using detail::quote;
using json = nlohmann::json;

constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the format's own limit: 100 MB of JSON

int64_t itemsize(DType t) { return t == DType::f32 ? 4 : 2; }
std::string dtype_name(DType t) { return t == DType::f32 ? "F32" : t == DType::f16 ? "F16" : "BF16"; }

uint16_t f32_to_bf16(float f) {  // round to nearest even; nan stays nan
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// A non-negative integer of the header, or a clear error.
uint64_t header_uint(const json& v, const std::string& fn, const std::string& arg) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail(fn, arg, "a non-negative integer", json_excerpt(v));
  return v.get<uint64_t>();
}

SafeTensorInfo parse_entry(const std::string& fn, const std::string& name, const json& e, uint64_t data_size) {
  const std::string arg = "tensor " + quote(name);
  if (!e.is_object()) fail(fn, arg, "an object with dtype, shape and data_offsets", json_excerpt(e));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail(fn, arg, message("a '", key, "' entry"), "none");
  SafeTensorInfo info;
  info.name = name;
  const json& dt = e["dtype"];
  const std::string dtype = dt.is_string() ? detail::printable(dt.get<std::string>()) : json_excerpt(dt);
  if (dtype == "F32") info.dtype = DType::f32;
  else if (dtype == "F16") info.dtype = DType::f16;
  else if (dtype == "BF16") info.dtype = DType::bf16;
  else fail(fn, arg + " dtype", "F32, F16 or BF16", dtype);
  const json& shape = e["shape"];
  if (!shape.is_array() || shape.size() > 8) fail(fn, arg + " shape", "an array of at most 8 sizes", json_excerpt(shape));
  uint64_t numel = 1;
  for (const json& d : shape) {
    const uint64_t n = header_uint(d, fn, arg + " shape");
    // The element count can never exceed the data's size; checking against it avoids overflow.
    if (n != 0 && numel > data_size / n) fail(fn, arg + " shape", message("a size within the file's ", data_size, " data bytes"), json_excerpt(shape));
    numel *= n;
    info.shape.push_back(static_cast<int64_t>(n));
  }
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2) fail(fn, arg + " data_offsets", "[begin, end]", json_excerpt(off));
  info.begin = header_uint(off[0], fn, arg + " data_offsets");
  info.end = header_uint(off[1], fn, arg + " data_offsets");
  if (info.begin > info.end || info.end > data_size)
    fail(fn, arg + " data_offsets", message("0 <= begin <= end <= ", data_size, " (the data section's size)"), json_excerpt(off));
  const uint64_t bytes = numel * static_cast<uint64_t>(itemsize(info.dtype));
  if (info.end - info.begin != bytes)
    fail(fn, arg + " data_offsets",
         message(bytes, " bytes for shape ", shape.dump(), " of ", dtype),  // shape: at most 8 checked sizes
         message(info.end - info.begin, " bytes ", off.dump()));           // off: two checked offsets
  return info;
}

}  // namespace

struct SafeTensors::Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address) munmap(address, size);
  }
};

SafeTensors::SafeTensors(SafeTensors&&) noexcept = default;
SafeTensors& SafeTensors::operator=(SafeTensors&&) noexcept = default;
SafeTensors::~SafeTensors() = default;

SafeTensors SafeTensors::open(const std::string& path) {
  const std::string fn = "safetensors";
  auto mapping = std::make_unique<Mapping>();
  {
    const detail::InputFile file(path, fn, "path");
    mapping->size = static_cast<size_t>(file.size());
    if (mapping->size > 0) {
      void* p = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (p == MAP_FAILED)
        fail(fn, "path", "a file that can be memory-mapped", message("'", path, "': ", std::strerror(errno)));
      mapping->address = p;
    }
  }
  SafeTensors file = parse({static_cast<const uint8_t*>(mapping->address), mapping->size}, path);
  file.mapping_ = std::move(mapping);
  return file;
}

SafeTensors SafeTensors::parse(std::span<const uint8_t> bytes, std::string source) {
  const std::string fn = "safetensors " + source;
  if (bytes.size() < 8) fail(fn, "header length", "8 bytes", message(bytes.size(), " bytes in the file"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  if (n > bytes.size() - 8 || n > kMaxHeader)
    fail(fn, "header length", message("at most ", std::min<uint64_t>(bytes.size() - 8, kMaxHeader), " bytes"),
         std::to_string(n));
  const json header = detail::parse_json({reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(n)},
                                         fn, "header", "UTF-8 JSON");
  if (!header.is_object()) fail(fn, "header", "a JSON object", json_excerpt(header));
  SafeTensors file;
  file.source_ = std::move(source);
  file.data_ = bytes.subspan(8 + n);
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(fn, "__metadata__", "an object of strings", json_excerpt(entry));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(fn, "__metadata__ " + quote(key), "a string", json_excerpt(value));
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    file.tensors_.push_back(parse_entry(fn, name, entry, file.data_.size()));
  }
  std::vector<const SafeTensorInfo*> by_offset;
  for (const auto& t : file.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail(fn, "tensor " + quote(by_offset[i]->name) + " data_offsets",
           message("bytes apart from tensor ", quote(by_offset[i - 1]->name), " (which ends at ", by_offset[i - 1]->end, ")"),
           message("a start at ", by_offset[i]->begin));
  return file;
}

const SafeTensorInfo* SafeTensors::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Tensor SafeTensors::load(std::string_view name) const {
  const SafeTensorInfo* info = find(name);
  if (!info) fail("safetensors " + source_, "name", "a tensor in the file", message("'", name, "' (absent)"));
  std::vector<int64_t> dims = info->shape;
  if (dims.empty()) dims = {1};  // a scalar
  if (dims.size() > kMaxDims)
    fail("safetensors " + source_, "tensor " + quote(info->name) + " shape", "at most 4 dimensions to load",
         std::to_string(dims.size()));
  Tensor t(dims);
  const uint8_t* src = data_.data() + info->begin;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (info->dtype == DType::f32) {
      std::memcpy(t.data() + i, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if (info->dtype == DType::f16) {
        t.data()[i] = kernels::f16_to_float(h);
      } else {
        const uint32_t bits = uint32_t{h} << 16;
        std::memcpy(t.data() + i, &bits, 4);
      }
    }
  }
  return t;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, ConstTensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata, DType dtype) {
  const std::string fn = "save_safetensors";
  // The header is JSON, which holds UTF-8 text only: a name or metadata entry that is not is refused
  // here, by name, rather than by the JSON library's exception.
  const auto utf8 = [&](const std::string& what, const std::string& s) {
    if (const size_t at = text::invalid_utf8_at(s); at != std::string::npos)
      fail(fn, what, "valid UTF-8 (the header is JSON)", message(quote(s), ", invalid at byte ", at));
  };
  for (const auto& [key, value] : metadata) {
    utf8("metadata key", key);
    utf8("metadata '" + key + "'", value);
  }
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, view] : tensors) {
    utf8("tensor name", name);
    if (name == "__metadata__" || header.contains(name)) fail(fn, "tensors", "unique names other than __metadata__", "'" + name + "'");
    if (view.numel() > 0 && !view.data) fail(fn, "tensor '" + name + "'", "data", "a null pointer");
    const uint64_t bytes = static_cast<uint64_t>(view.numel()) * static_cast<uint64_t>(itemsize(dtype));
    std::vector<int64_t> shape(view.shape.begin(), view.shape.begin() + view.ndim);
    header[name] = {{"dtype", dtype_name(dtype)}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  detail::OutputFile out(path, fn);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const auto& [name, v] : tensors) {
    std::vector<char> buf;
    const auto put = [&](float x) {
      if (dtype == DType::f32) {
        buf.insert(buf.end(), reinterpret_cast<const char*>(&x), reinterpret_cast<const char*>(&x) + 4);
      } else {
        const uint16_t h = dtype == DType::f16 ? kernels::float_to_f16(x) : f32_to_bf16(x);
        buf.insert(buf.end(), reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + 2);
      }
    };
    const Tensor dense = contiguous(v);
    for (int64_t i = 0; i < dense.numel(); ++i) put(dense.data()[i]);
    out.write(buf.data(), buf.size());
  }
  out.commit();
}

}  // namespace mhsa
