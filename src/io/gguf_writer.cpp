// io/gguf_writer.cpp — writing GGUF files (see io/gguf.h): version 3, little-endian, data aligned
// to 32 bytes (ggml's default, so no general.alignment key), written to a temporary file in the
// same directory, every write checked, then moved into place (link(2) when the target must not
// exist, so that an existing file is never replaced by a race; rename(2) with overwrite).

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "io/file.h"
#include "io/gguf.h"
#include "io/json.h"
#include "kernels/bf16.h"
#include "kernels/half.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"

namespace mhsa::detail {
namespace {

constexpr uint64_t kAlignment = 32;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

uint64_t padded(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// One tensor's stored bytes: values [numel] in numpy order converted to `type`.
std::string encode(const Tensor& t, GgufType type) {
  const int64_t n = t.numel();
  const float* x = t.data();
  std::string out;
  switch (type) {
    case GgufType::f32: out.assign(reinterpret_cast<const char*>(x), static_cast<size_t>(n) * 4); break;
    case GgufType::f16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, kernels::float_to_f16(x[i]));
      break;
    case GgufType::bf16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, kernels::float_to_bf16(x[i]));
      break;
    case GgufType::q8_0: {
      std::vector<kernels::BlockQ8_0> blocks(static_cast<size_t>(n / kernels::kQ8Block));
      kernels::quantize_row_q8_0(x, n, blocks.data());
      out.assign(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(kernels::BlockQ8_0));
      break;
    }
    case GgufType::q4_k: {
      std::vector<kernels::BlockQ4_K> blocks(static_cast<size_t>(n / kernels::kQ4KBlock));
      const int64_t row = t.shape().back(), rows = n / row;
#pragma omp parallel for schedule(dynamic, 16) if (n >= (int64_t{1} << 16))
      for (int64_t r = 0; r < rows; ++r)
        kernels::quantize_row_q4_k(x + r * row, row, blocks.data() + r * (row / kernels::kQ4KBlock));
      out.assign(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(kernels::BlockQ4_K));
      break;
    }
    default: break;  // refused by add_tensor
  }
  return out;
}

}  // namespace

void GgufWriter::key(std::string&& k, GgufValueType t) {
  for (const std::string& old : keys_)
    if (old == k) fail("GgufWriter", "key", "each key once", quote(k));
  put_string(kv_bytes_, k);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(t));
  keys_.push_back(std::move(k));
  ++kv_count_;
}

void GgufWriter::add_u32(std::string k, uint32_t v) { key(std::move(k), GgufValueType::u32), put(kv_bytes_, v); }
void GgufWriter::add_i32(std::string k, int32_t v) { key(std::move(k), GgufValueType::i32), put(kv_bytes_, v); }
void GgufWriter::add_f32(std::string k, float v) { key(std::move(k), GgufValueType::f32), put(kv_bytes_, v); }
void GgufWriter::add_bool(std::string k, bool v) {
  key(std::move(k), GgufValueType::boolean);
  put<uint8_t>(kv_bytes_, v ? 1 : 0);
}
void GgufWriter::add_string(std::string k, std::string_view v) {
  key(std::move(k), GgufValueType::string);
  put_string(kv_bytes_, v);
}
void GgufWriter::add_strings(std::string k, const std::vector<std::string>& v) {
  key(std::move(k), GgufValueType::array);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::string));
  put<uint64_t>(kv_bytes_, v.size());
  for (const std::string& s : v) put_string(kv_bytes_, s);
}
void GgufWriter::add_f32s(std::string k, std::span<const float> v) {
  key(std::move(k), GgufValueType::array);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::f32));
  put<uint64_t>(kv_bytes_, v.size());
  kv_bytes_.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}
void GgufWriter::add_i32s(std::string k, std::span<const int32_t> v) {
  key(std::move(k), GgufValueType::array);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::i32));
  put<uint64_t>(kv_bytes_, v.size());
  kv_bytes_.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

void GgufWriter::add_tensor(std::string name, Tensor values, GgufType type) {
  const std::string fn = "GgufWriter::add_tensor";
  const std::string what = "tensor " + quote(name);
  for (const Entry& e : tensors_)
    if (e.name == name) fail(fn, what, "each tensor name once", "a second tensor of that name");
  if (!values.defined()) fail(fn, what, "a tensor of 1 to 4 dimensions", "none");
  const int64_t row = values.shape().back(), n = values.numel();
  uint64_t bytes = static_cast<uint64_t>(n) * 4;
  if (type == GgufType::f16 || type == GgufType::bf16) {
    bytes = static_cast<uint64_t>(n) * 2;
  } else if (type == GgufType::q8_0 || type == GgufType::q4_k) {
    const bool q8 = type == GgufType::q8_0;
    const int64_t block = q8 ? kernels::kQ8Block : kernels::kQ4KBlock;
    if (row % block != 0)
      fail(fn, what, q8 ? "rows of whole Q8_0 blocks (a multiple of 32 values)" : "rows of whole Q4_K blocks (a multiple of 256 values)",
           message("rows of ", row));
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(values.data()[i])) fail(fn, what, "finite values to quantise", message(values.data()[i], " at ", i));
    bytes = static_cast<uint64_t>(n / block) * (q8 ? sizeof(kernels::BlockQ8_0) : sizeof(kernels::BlockQ4_K));
  } else if (type != GgufType::f32) {
    fail(fn, what + " type", "F32, F16, BF16, Q8_0 or Q4_K (the types mhsa writes)",
         gguf_type_name(static_cast<uint32_t>(type)));
  }
  tensors_.push_back({std::move(name), std::move(values), type, bytes});
}

void GgufWriter::write(const std::filesystem::path& path, bool overwrite) const {
  const std::string fn = "GgufWriter::write";
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    fail(fn, "path", "a file that does not exist yet (or overwrite)", quote(path.string()) + " (exists)");
  std::string head = "GGUF";
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_count_);
  head += kv_bytes_;
  uint64_t offset = 0;
  for (const Entry& e : tensors_) {
    put_string(head, e.name);
    const std::vector<int64_t>& shape = e.values.shape();
    put<uint32_t>(head, static_cast<uint32_t>(shape.size()));
    for (auto d = shape.rbegin(); d != shape.rend(); ++d) put<uint64_t>(head, static_cast<uint64_t>(*d));
    put<uint32_t>(head, static_cast<uint32_t>(e.type));
    put<uint64_t>(head, offset);
    offset += padded(e.bytes);
  }
  head.resize(padded(head.size()), '\0');
  OutputFile tmp(path.string(), fn);
  tmp.write(head.data(), head.size());
  const char zeros[kAlignment] = {};
  for (const Entry& e : tensors_) {
    const std::string bytes = encode(e.values, e.type);
    tmp.write(bytes.data(), bytes.size());
    tmp.write(zeros, padded(bytes.size()) - bytes.size());
  }
  tmp.commit(overwrite);
}

}  // namespace mhsa::detail
