// mhsa/tensor.h — strided float32 views (up to 4-D) and a small owning Tensor.
//
// A View is a pointer plus shape and strides in elements (int64, may be zero or negative), so a
// slice of a KV cache, a head split of a fused QKV buffer or a transposed NumPy array is a view,
// not a copy. Tensor owns 64-byte-aligned, zero-initialised, contiguous storage.
// Deliberately not a tensor library: no arithmetic, no broadcasting. Tensors are float32; views
// may also be of bfloat16 / float16 elements (kept as their bits; see bfloat16 below), for the
// attention entry points that take 16-bit inputs.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mhsa/error.h"

namespace mhsa {

inline constexpr int kMaxDims = 4;

// 16-bit floating-point elements as their bits, so that a View<const bfloat16> of a torch bf16
// tensor or a NumPy float16 array is read in place. bfloat16: the upper half of a float32 (8-bit
// exponent); float16: IEEE binary16 (5-bit exponent). No arithmetic: widened to float32 (exactly)
// before use, narrowed back with round-to-nearest-even.
struct bfloat16 {
  uint16_t bits;
};
struct float16 {
  uint16_t bits;
};
// 8-bit elements in GGUF's Q8_0 blocks (ggml's block_q8_0, byte for byte): 32 values as int8 with
// one IEEE float16 scale d, value = d · q. A View<const BlockQ8_0> of a Q8_0 KV cache is a view of
// blocks: its last dimension counts blocks (head size / 32) and its strides are in blocks.
struct BlockQ8_0 {
  uint16_t d;     // scale, IEEE f16
  int8_t qs[32];  // quants
};
static_assert(sizeof(BlockQ8_0) == 34, "BlockQ8_0 must match ggml's 34-byte block_q8_0");

template <class T>
struct View {
  T* data = nullptr;
  int ndim = 0;  // 0 means "no tensor" (an absent optional argument)
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements

  View() = default;
  // Contiguous row-major view.
  View(T* ptr, std::initializer_list<int64_t> dims) : View(ptr, std::vector<int64_t>(dims)) {}
  View(T* ptr, const std::vector<int64_t>& dims) : data(ptr), ndim(static_cast<int>(dims.size())) {
    if (dims.size() > kMaxDims) throw Error("View: dims: expected at most 4 dimensions, got " + std::to_string(dims.size()));
    std::copy(dims.begin(), dims.end(), shape.begin());
    const bool empty = std::find(dims.begin(), dims.end(), 0) != dims.end();  // no element to address
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      stride[i] = step;
      if (__builtin_mul_overflow(step, shape[i], &step) && !empty)  // a wrapped stride addresses the wrong memory
        throw Error("View: dims: expected a shape whose strides fit in int64, got " + shape_string(*this));
    }
  }
  // Explicit strides (in elements).
  View(T* ptr, std::initializer_list<int64_t> dims, std::initializer_list<int64_t> strides)
      : data(ptr), ndim(static_cast<int>(dims.size())) {
    if (dims.size() > kMaxDims || strides.size() != dims.size())
      throw Error("View: strides: expected as many as dims (at most 4), got " + std::to_string(strides.size()) +
                  " strides for " + std::to_string(dims.size()) + " dims");
    std::copy(dims.begin(), dims.end(), shape.begin());
    std::copy(strides.begin(), strides.end(), stride.begin());
  }
  // A mutable view converts to a const one.
  template <class U>
    requires(std::is_convertible_v<U*, T*> && !std::is_same_v<U, T>)
  View(const View<U>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data), ndim(other.ndim), shape(other.shape), stride(other.stride) {}

  bool defined() const { return ndim > 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return ndim > 0 ? n : 0;
  }
  T& at(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
    return data[i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]];
  }
};

using TensorView = View<float>;
using ConstTensorView = View<const float>;

// "[2, 12, 97, 64]"
template <class T>
std::string shape_string(const View<T>& v) {
  std::string s = "[";
  for (int i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
  return s + "]";
}

namespace detail {
// Memory for tensors: 64-byte aligned; blocks of 2 MiB and more are aligned to 2 MiB (rounded up
// to whole 2 MiB pages) and, on Linux, offered transparent huge pages (madvise): a weight matrix
// streamed once per decoded token is read at ~36 GB/s from 2 MiB pages against 24–31 GB/s from
// 4 KiB ones on the development machine (the hardware prefetchers stop at every 4 KiB page).
// From 2 MiB rather than 4 so that a 135M model's 3.4 MiB MLP matrices get them too. Freed blocks of
// 256 KiB and more are kept for reuse, up to an eighth of the machine's memory (128 MiB to 4 GiB; see
// core/tensor.cpp and release_cached_memory below).
void* allocate_tensor_memory(std::size_t bytes);
void free_tensor_memory(void* p, std::size_t bytes) noexcept;
}  // namespace detail

// Freed tensor blocks of 256 KiB and more are kept for the next tensor of the same size (see
// detail:: above), the longest-unused given back first when the limit is reached.
// release_cached_memory() gives them all back to the operating system (after a training run,
// say: a step's activations stay cached for the next step until then); set_cached_memory_limit
// changes the limit (0: keep nothing; default: 1/8 of RAM, 128 MiB to 4 GiB) and trims to it;
// cached_memory_bytes() is what is held now.
void release_cached_memory();
void set_cached_memory_limit(std::size_t bytes);
std::size_t cached_memory_bytes();

template <class T, std::size_t Align = 64>
struct AlignedAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = AlignedAllocator<U, Align>;
  };
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U, Align>&) {}  // NOLINT(google-explicit-constructor)
  static_assert(Align <= 64, "tensor memory is 64-byte aligned");
  T* allocate(std::size_t n) { return static_cast<T*>(detail::allocate_tensor_memory(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { detail::free_tensor_memory(p, n * sizeof(T)); }
  friend bool operator==(const AlignedAllocator&, const AlignedAllocator&) { return true; }
};

// Owning, contiguous, row-major float32 tensor of up to 4 dimensions.
class Tensor {
 public:
  Tensor() = default;
  // Zero-filled. Throws mhsa::Error, naming the tensor by `what` ("<function>: <argument>"), for
  // bad dims, a size beyond the address space (checked, never wrapped) or an allocation the
  // system refuses (with the bytes asked for).
  explicit Tensor(std::vector<int64_t> dims, std::string_view what = "Tensor: dims");

  float* data() { return storage_.data(); }
  const float* data() const { return storage_.data(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t numel() const { return static_cast<int64_t>(storage_.size()); }
  bool defined() const { return !shape_.empty(); }

  TensorView view() { return {data(), shape_}; }
  ConstTensorView view() const { return {data(), shape_}; }

 private:
  std::vector<int64_t> shape_;
  std::vector<float, AlignedAllocator<float>> storage_;
};

// A contiguous copy of any view (any strides, 1 to 4 dimensions).
Tensor contiguous(const ConstTensorView& v);

}  // namespace mhsa
