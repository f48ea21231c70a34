// io/gguf.cpp — reading GGUF files (see io/gguf.h): the memory map, the validating parse and the
// typed metadata access. Every length and count read from the file is checked against the bytes
// left before it is used to size or index anything. Loading tensors is io/gguf_load.cpp's.
#include "io/gguf.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"

namespace mhsa::detail {
namespace {

struct TypeInfo {
  uint32_t id;
  const char* name;
  int64_t block, size;  // values per block, bytes per block
};
// ggml's types (ggml.h's ggml_type, sizes from ggml-common.h); ids 4, 5, 31–33, 36–38 are removed
// types no file holds.
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},       {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},     {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},  {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},  {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},       {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},  {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},     {41, "Q1_0", 128, 18},
};

const TypeInfo* type_info(uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

constexpr const char* kValueTypeNames[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32", "float32",
                                           "bool",  "string", "array", "uint64", "int64", "float64"};
constexpr uint64_t kValueSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // 0: variable
constexpr int kMaxDims = 4;                                                   // GGML_MAX_DIMS

std::string value_type_name(GgufValueType t) { return kValueTypeNames[static_cast<uint32_t>(t)]; }

// A bounded reader over the file's bytes: every read checks the bytes left first.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& fn) : bytes_(bytes), fn_(fn) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }
  const uint8_t* here() const { return bytes_.data() + pos_; }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const uint8_t> take(uint64_t n, const std::string& what) {
    need(n, what);
    const auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " length");
    const auto s = take(n, what);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }
  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail(fn_, what, message(n, " bytes at offset ", pos_), message(left(), " bytes left in the file"));
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  const std::string& fn_;
};

GgufValueType value_type(uint32_t id, const std::string& fn, const std::string& what) {
  if (id > static_cast<uint32_t>(GgufValueType::f64))
    fail(fn, what, "a GGUF value type (0 to 12)", std::to_string(id));
  return static_cast<GgufValueType>(id);
}

// One value of type t at the cursor: validated, its bytes kept (see GgufValue).
GgufValue read_value(Cursor& in, GgufValueType t, const std::string& fn, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t == GgufValueType::string) {
    const std::string_view s = in.string(what);
    v.bytes = {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
  } else if (t == GgufValueType::array) {
    v.elem = value_type(in.read<uint32_t>(what + " element type"), fn, what + " element type");
    if (v.elem == GgufValueType::array)
      fail(fn, what, "an array of scalars or strings", "an array of arrays (nested arrays are not read, as in llama.cpp)");
    v.count = in.read<uint64_t>(what + " length");
    const uint8_t* start = in.here();
    if (v.elem == GgufValueType::string) {
      if (v.count > in.left() / 8)
        fail(fn, what + " length", message("at most ", in.left() / 8, " strings (the bytes left)"), std::to_string(v.count));
      for (uint64_t i = 0; i < v.count; ++i) in.string(message(what, "[", i, "]"));
    } else {
      const uint64_t size = kValueSizes[static_cast<uint32_t>(v.elem)];
      if (v.count > in.left() / size)
        fail(fn, what + " length", message("at most ", in.left() / size, " ", value_type_name(v.elem), " values (the bytes left)"),
             std::to_string(v.count));
      in.take(v.count * size, what);
    }
    v.bytes = {start, in.here()};
  } else {
    v.bytes = in.take(kValueSizes[static_cast<uint32_t>(t)], what);
    if (t == GgufValueType::boolean && v.bytes[0] > 1) fail(fn, what, "a bool (0 or 1)", std::to_string(v.bytes[0]));
  }
  return v;
}

template <class T>
T get(std::span<const uint8_t> b, uint64_t i = 0) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}

// An integer value of any integer type as int64 (uint64 beyond int64's range: -1).
int64_t integer(GgufValueType t, std::span<const uint8_t> b, uint64_t i) {
  switch (t) {
    case GgufValueType::u8: return get<uint8_t>(b, i);
    case GgufValueType::i8: return get<int8_t>(b, i);
    case GgufValueType::u16: return get<uint16_t>(b, i);
    case GgufValueType::i16: return get<int16_t>(b, i);
    case GgufValueType::u32: return get<uint32_t>(b, i);
    case GgufValueType::i32: return get<int32_t>(b, i);
    case GgufValueType::i64: return get<int64_t>(b, i);
    case GgufValueType::u64: {
      const uint64_t u = get<uint64_t>(b, i);
      return u > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(u);
    }
    default: return -1;
  }
}

bool is_integer(GgufValueType t) {
  return t <= GgufValueType::i32 || t == GgufValueType::u64 || t == GgufValueType::i64;
}

}  // namespace

std::string gguf_type_name(uint32_t type) {
  const TypeInfo* t = type_info(type);
  return t ? t->name : message("type ", type);
}

GgufType parse_gguf_type(std::string_view name, std::string_view what) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "f32") return GgufType::f32;
  if (lower == "f16") return GgufType::f16;
  if (lower == "bf16") return GgufType::bf16;
  if (lower == "q8_0") return GgufType::q8_0;
  if (lower == "q4_k") return GgufType::q4_k;
  throw Error(message(what, ": expected \"f32\", \"f16\", \"bf16\", \"q8_0\" or \"q4_k\", got ", quote(name)));
}

struct GgufFile::Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address) munmap(address, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::filesystem::path& path) {
  const std::string fn = "gguf";
  auto mapping = std::make_unique<Mapping>();
  {
    const InputFile file(path, fn, "path");
    mapping->size = static_cast<size_t>(file.size());
    if (mapping->size > 0) {
      void* p = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (p == MAP_FAILED)
        fail(fn, "path", "a file that can be memory-mapped", message(quote(path.string()), ": ", std::strerror(errno)));
      mapping->address = p;
    }
  }
  GgufFile file = parse({static_cast<const uint8_t*>(mapping->address), mapping->size}, path.string());
  file.mapping_ = std::move(mapping);
  return file;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string source) {
  const std::string fn = "gguf " + source;
  GgufFile f;
  f.source_ = std::move(source);
  Cursor in(bytes, fn);
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "GGUF", 4) != 0)
    fail(fn, "magic", "\"GGUF\" (a GGUF file)",
         bytes.size() < 4 ? message(bytes.size(), " bytes in the file") : quote({reinterpret_cast<const char*>(bytes.data()), 4}));
  in.take(4, "magic");
  f.version_ = in.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3)
    fail(fn, "version", "2 or 3",
         (f.version_ & 0xffff) == 0 ? message(f.version_, " (a big-endian file: not supported)") : std::to_string(f.version_));
  const uint64_t n_tensors = in.read<uint64_t>("tensor count"), n_kvs = in.read<uint64_t>("metadata count");
  // Each key-value takes at least 13 bytes (length, type, one byte), each tensor info at least 24.
  if (n_kvs > in.left() / 13)
    fail(fn, "metadata count", message("at most ", in.left() / 13, " (what the file's size can hold)"), std::to_string(n_kvs));
  if (n_tensors > in.left() / 24)
    fail(fn, "tensor count", message("at most ", in.left() / 24, " (what the file's size can hold)"), std::to_string(n_tensors));
  std::map<std::string_view, size_t> keys;
  f.kvs_.reserve(n_kvs);
  for (uint64_t i = 0; i < n_kvs; ++i) {
    const std::string_view key = in.string(message("metadata key ", i));
    const std::string what = "metadata " + quote(key);
    if (!keys.emplace(key, i).second) fail(fn, what, "each key once", "a second value");
    const GgufValueType t = value_type(in.read<uint32_t>(what + " type"), fn, what + " type");
    f.kvs_.emplace_back(std::string(key), read_value(in, t, fn, what));
  }
  if (const GgufValue* a = f.value("general.alignment")) {
    if (a->type != GgufValueType::u32) fail(fn, "metadata 'general.alignment'", "a uint32", value_type_name(a->type));
    f.alignment_ = get<uint32_t>(a->bytes);
    if (f.alignment_ == 0 || (f.alignment_ & (f.alignment_ - 1)) != 0)
      fail(fn, "metadata 'general.alignment'", "a power of two", std::to_string(f.alignment_));
  }
  std::map<std::string_view, size_t> names;
  f.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = in.string(message("tensor ", i, " name"));
    const std::string what = "tensor " + quote(t.name);
    const uint32_t n_dims = in.read<uint32_t>(what + " n_dims");
    if (n_dims > kMaxDims) fail(fn, what + " n_dims", message("at most ", kMaxDims), std::to_string(n_dims));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = in.read<uint64_t>(what + " dims");
      if (n > static_cast<uint64_t>(INT64_MAX) || (n != 0 && numel > static_cast<uint64_t>(INT64_MAX) / n))
        fail(fn, what + " dims", "sizes whose product fits in int64", message("a size of ", n, " at dims[", d, "]"));
      numel *= n;
      t.dims.push_back(static_cast<int64_t>(n));
    }
    if (t.dims.empty()) t.dims.push_back(1);
    t.type = in.read<uint32_t>(what + " type");
    const TypeInfo* type = type_info(t.type);
    if (!type) fail(fn, what + " type", "a ggml type id (F32 0, F16 1, Q4_0 2, Q8_0 8, Q4_K 12, BF16 30, …)", std::to_string(t.type));
    if (t.dims[0] % type->block != 0)
      fail(fn, what + " dims[0]", message("a multiple of ", type->name, "'s block of ", type->block, " values"),
           std::to_string(t.dims[0]));
    const uint64_t blocks = numel / static_cast<uint64_t>(type->block);
    if (blocks > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(type->size))
      fail(fn, what + " dims", "a size in bytes that fits in int64", message(numel, " values of ", type->name));
    t.bytes = blocks * static_cast<uint64_t>(type->size);
    t.offset = in.read<uint64_t>(what + " offset");
    if (t.offset % f.alignment_ != 0)
      fail(fn, what + " offset", message("a multiple of the alignment, ", f.alignment_), std::to_string(t.offset));
    f.tensors_.push_back(std::move(t));
  }
  // Names checked once all are stored (the string_views then stay valid).
  for (size_t i = 0; i < f.tensors_.size(); ++i)
    if (!names.emplace(f.tensors_[i].name, i).second)
      fail(fn, "tensor " + quote(f.tensors_[i].name), "each tensor name once", "a second tensor of that name");
  const uint64_t start = (in.pos() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  f.data_ = start <= bytes.size() ? bytes.subspan(start) : std::span<const uint8_t>();
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f.tensors_) {
    if (t.offset > f.data_.size() || t.bytes > f.data_.size() - t.offset)
      fail(fn, "tensor " + quote(t.name) + " offset",
           message("bytes [offset, offset + ", t.bytes, ") inside the data section of ", f.data_.size(), " bytes (at ", start, ")"),
           std::to_string(t.offset));
    if (t.bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
      fail(fn, "tensor " + quote(by_offset[i]->name) + " offset",
           message("bytes apart from tensor ", quote(by_offset[i - 1]->name), " (which ends at ",
                   by_offset[i - 1]->offset + by_offset[i - 1]->bytes, ")"),
           std::to_string(by_offset[i]->offset));
  return f;
}

const GgufValue* GgufFile::value(std::string_view key) const {
  for (const auto& [k, v] : kvs_)
    if (k == key) return &v;
  return nullptr;
}

const GgufTensorInfo* GgufFile::find(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {
[[noreturn]] void wrong_type(const std::string& source, std::string_view key, const char* expected, const GgufValue& v) {
  fail("gguf " + source, "metadata " + quote(key), expected,
       v.type == GgufValueType::array ? "an array of " + value_type_name(v.elem) : value_type_name(v.type));
}
}  // namespace

std::optional<uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type)) wrong_type(source_, key, "an integer", *v);
  if (v->type == GgufValueType::u64) return get<uint64_t>(v->bytes);
  const int64_t i = integer(v->type, v->bytes, 0);
  if (i < 0) fail("gguf " + source_, "metadata " + quote(key), "an integer >= 0", std::to_string(i));
  return static_cast<uint64_t>(i);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return std::nullopt;
  if (v->type == GgufValueType::f32) return get<float>(v->bytes);
  if (v->type == GgufValueType::f64) return get<double>(v->bytes);
  wrong_type(source_, key, "a float32 or float64", *v);
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::string) wrong_type(source_, key, "a string", *v);
  return std::string(reinterpret_cast<const char*>(v->bytes.data()), v->bytes.size());
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::boolean) wrong_type(source_, key, "a bool", *v);
  return v->bytes[0] != 0;
}

std::vector<std::string_view> GgufFile::get_strings(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return {};
  if (v->type != GgufValueType::array || v->elem != GgufValueType::string) wrong_type(source_, key, "an array of strings", *v);
  std::vector<std::string_view> out;
  out.reserve(v->count);
  const uint8_t* p = v->bytes.data();
  for (uint64_t i = 0; i < v->count; ++i) {  // lengths validated by the parse
    const uint64_t n = get<uint64_t>({p, 8});
    out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
    p += 8 + n;
  }
  return out;
}

std::vector<float> GgufFile::get_floats(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return {};
  if (v->type != GgufValueType::array || v->elem != GgufValueType::f32) wrong_type(source_, key, "an array of float32", *v);
  std::vector<float> out(v->count);
  if (v->count) std::memcpy(out.data(), v->bytes.data(), v->count * 4);
  return out;
}

std::vector<int64_t> GgufFile::get_ints(std::string_view key) const {
  const GgufValue* v = value(key);
  if (!v) return {};
  if (v->type != GgufValueType::array || !is_integer(v->elem)) wrong_type(source_, key, "an array of integers", *v);
  std::vector<int64_t> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) out[i] = integer(v->elem, v->bytes, i);
  return out;
}

}  // namespace mhsa::detail
