// kernels/attention_backends.h — the attention entry point with the kernel named by the caller,
// for tests and benchmarks that compare every kernel on one machine. Not public: users pick
// only between Backend::automatic and Backend::reference.
#pragma once

#include <optional>

#include "core/cpu.h"
#include "mhsa/attention.h"

namespace mhsa::detail {

// scaled_dot_product_attention with the same validation, on `isa`'s fast kernels, or on the
// reference kernel when `isa` is empty.
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, ConstTensorView k,
                                     ConstTensorView v, TensorView out, const AttentionOptions& options,
                                     TensorView lse);

// scaled_dot_product_attention of float32 queries that hold bfloat16 values (the bfloat16 entry
// point's widened q) against bfloat16 keys and values: where the CPU has AVX512_BF16, the forward
// multiplies them as bfloat16 pairs and rounds P to bfloat16 for P·V
// (kernels/flash_attention_bf16.cpp); elsewhere the 16-bit KV cache's entry point.
void scaled_dot_product_attention_bf16_values(ConstTensorView q, View<const bfloat16> k, View<const bfloat16> v,
                                              TensorView out, const AttentionOptions& options, TensorView lse);

// The 16-bit KV cache entry points (contiguous and paged), likewise.
template <class K, class V>
  requires NarrowKV<K, V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, View<const K> k, View<const V> v,
                                     TensorView out, const AttentionOptions& options, TensorView lse);
template <KVElementType K, KVElementType V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, const PagedKVOf<K, V>& kv,
                                     TensorView out, const AttentionOptions& options, TensorView lse);

// The batched call (several sequences in one region), likewise.
template <KVElementType K, KVElementType V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, std::span<const AttentionBatchItem<K, V>> batch,
                                     const AttentionOptions& options);

// scaled_dot_product_attention_backward, likewise. bf16_values: every input holds bfloat16 values
// (the bfloat16 entry point's widened copies): where the CPU has AVX512_BF16 the backward multiplies
// them as bfloat16 pairs and rounds P and dS to bfloat16 (kernels/flash_backward_bf16.cpp).
void scaled_dot_product_attention_backward_on(std::optional<cpu::Isa> isa, ConstTensorView dout, ConstTensorView q,
                                              ConstTensorView k, ConstTensorView v, ConstTensorView out,
                                              ConstTensorView lse, TensorView dq, TensorView dk, TensorView dv,
                                              const AttentionOptions& options, bool bf16_values = false,
                                              TensorView dsinks = {});

// scaled_dot_product_attention_backward of float32 inputs that all hold bfloat16 values (the
// bfloat16 entry point's widened copies), on the kernels options.backend picks, with bf16_values set.
void scaled_dot_product_attention_backward_bf16_values(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                                       ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                                       TensorView dq, TensorView dk, TensorView dv,
                                                       const AttentionOptions& options);

}  // namespace mhsa::detail
