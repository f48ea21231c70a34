// kernels/dispatch.cpp — the per-ISA kernel tables (see dispatch.h).
#include "kernels/dispatch.h"

namespace mhsa::kernels {

const KernelTable& kernels_for(cpu::Isa isa) {
  static const KernelTable portable_table{&portable::gemm, &portable::gemm_ex, &portable::gemm_blocked, &portable::attention_forward, &portable::attention_backward,
                                         &portable::layer_norm, &portable::gelu_tanh, &portable::gelu_tanh_backward, &portable::matmul_bt, &portable::matmul_bt_parts,
      &portable::softmax_cross_entropy, &portable::adamw,
      &portable::layer_norm_backward, &portable::rms_norm, &portable::rms_norm_backward, &portable::glu, &portable::glu_backward,
      &portable::softcap, &portable::softcap_backward, &portable::rope,
      &portable::matmul_bt_bf16, &portable::matmul_bt_parts_bf16, &portable::gemm_bt_bf16,
      &portable::matmul_bt_q8_0, &portable::matmul_bt_parts_q8_0, &portable::gemm_bt_q8_0,
      &portable::matmul_bt_q4_k, &portable::matmul_bt_parts_q4_k, &portable::gemm_bt_q4_k,
      &portable::gemm_bf16,
      &portable::matmul_bt_f16, &portable::matmul_bt_parts_f16, &portable::gemm_bt_f16};
#if defined(MHSA_HAVE_X86_KERNELS)
  static const KernelTable avx2_table{&avx2::gemm, &avx2::gemm_ex, &avx2::gemm_blocked, &avx2::attention_forward, &avx2::attention_backward,
                                         &avx2::layer_norm, &avx2::gelu_tanh, &avx2::gelu_tanh_backward, &avx2::matmul_bt, &avx2::matmul_bt_parts,
      &avx2::softmax_cross_entropy, &avx2::adamw,
      &avx2::layer_norm_backward, &avx2::rms_norm, &avx2::rms_norm_backward, &avx2::glu, &avx2::glu_backward,
      &avx2::softcap, &avx2::softcap_backward, &avx2::rope,
      &avx2::matmul_bt_bf16, &avx2::matmul_bt_parts_bf16, &avx2::gemm_bt_bf16,
      &avx2::matmul_bt_q8_0, &avx2::matmul_bt_parts_q8_0, &avx2::gemm_bt_q8_0,
      &avx2::matmul_bt_q4_k, &avx2::matmul_bt_parts_q4_k, &avx2::gemm_bt_q4_k,
      &avx2::gemm_bf16,
      &avx2::matmul_bt_f16, &avx2::matmul_bt_parts_f16, &avx2::gemm_bt_f16};
  static const KernelTable avx512_table{&avx512::gemm, &avx512::gemm_ex, &avx512::gemm_blocked, &avx512::attention_forward, &avx512::attention_backward,
                                         &avx512::layer_norm, &avx512::gelu_tanh, &avx512::gelu_tanh_backward, &avx512::matmul_bt, &avx512::matmul_bt_parts,
      &avx512::softmax_cross_entropy, &avx512::adamw,
      &avx512::layer_norm_backward, &avx512::rms_norm, &avx512::rms_norm_backward, &avx512::glu, &avx512::glu_backward,
      &avx512::softcap, &avx512::softcap_backward, &avx512::rope,
      &avx512::matmul_bt_bf16, &avx512::matmul_bt_parts_bf16, &avx512::gemm_bt_bf16,
      &avx512::matmul_bt_q8_0, &avx512::matmul_bt_parts_q8_0, &avx512::gemm_bt_q8_0,
      &avx512::matmul_bt_q4_k, &avx512::matmul_bt_parts_q4_k, &avx512::gemm_bt_q4_k,
      &avx512::gemm_bf16,
      &avx512::matmul_bt_f16, &avx512::matmul_bt_parts_f16, &avx512::gemm_bt_f16};
  // the AVX-512 table with the extensions this CPU has (cpu::bf16_dot, cpu::vnni)
  static const KernelTable avx512_extended_table = [] {
    KernelTable t = avx512_table;
    if (cpu::bf16_dot()) {
      t.gemm_bt_bf16_dot = &avx512bf16::gemm_bt_bf16_dot;
      t.attention_forward_bf16_dot = &avx512bf16::attention_forward_bf16_dot;
      t.attention_backward_bf16_dot = &avx512bf16::attention_backward_bf16_dot;
    }
    if (cpu::vnni(cpu::Isa::avx512)) {
      t.matmul_bt_q8_0 = &avx512vnni::matmul_bt_q8_0;
      t.matmul_bt_parts_q8_0 = &avx512vnni::matmul_bt_parts_q8_0;
    }
    return t;
  }();
  static const KernelTable avx2_extended_table = [] {
    KernelTable t = avx2_table;
#if defined(MHSA_HAVE_AVX2VNNI)
    if (cpu::vnni(cpu::Isa::avx2)) {
      t.matmul_bt_q8_0 = &avx2vnni::matmul_bt_q8_0;
      t.matmul_bt_parts_q8_0 = &avx2vnni::matmul_bt_parts_q8_0;
    }
#endif
    return t;
  }();
  if (isa == cpu::Isa::avx512) return avx512_extended_table;
  if (isa == cpu::Isa::avx2) return avx2_extended_table;
#endif
  (void)isa;
  return portable_table;
}

}  // namespace mhsa::kernels
