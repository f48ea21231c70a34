// nn/blocked_matrix.h — an output matrix [V, C] (the LM head; GPT-2's token embedding, tied to it)
// kept transposed and blocked as kernels::gemm_blocked reads B (kernels/gemm.h), for the CLI's
// float GPT-2 models (ModelAccess::block_weights). Serving several sequences, the head is the
// largest product of a decode step (GPT-2 124M: 154 of its 497 MB); the B·Aᵀ stream over [V, C]
// reads it at 8 rows ~1.5× slower than gemm_blocked's tiles read the same bytes blocked
// (docs/performance.md, 2026-12-01). The vocabulary is cut where it stops filling 32 columns:
// `main` holds the first `full` rows of w as [C, full] blocked, `tail` the rest as [C, 32]
// blocked, zero-padded, so that the logits are written in place, no padded copy of them. A
// logit is then gemm's chain on wᵀ (the M class's, kernels/gemm.cpp), not the stream's: the same
// values to float rounding, not the same bits. Inference only; the embedding reads its rows back
// exactly. Not public.
#pragma once

#include <cstdint>

#include "mhsa/tensor.h"

namespace mhsa::nn {

struct BlockedMatrix {
  int64_t rows = 0, cols = 0;  // the matrix [V, C]
  int64_t full = 0;            // rows in main: rows rounded down to a multiple of 32
  Tensor main;                 // [C, full] blocked (undefined when full == 0)
  Tensor tail;                 // [C, 32] blocked: rows [full, rows) and zeros (undefined when full == rows)

  // Whether w [rows, cols] can be kept this way: cols a multiple of 16 (a row block of B).
  static bool fits(int64_t rows, int64_t cols) { return rows > 0 && cols > 0 && cols % 16 == 0; }
  // w [rows, cols] (fits) transposed and blocked.
  static BlockedMatrix of(const Tensor& w);
  // out[0:cols] = row r of the matrix (exact).
  void row(int64_t r, float* out) const;
};

}  // namespace mhsa::nn
