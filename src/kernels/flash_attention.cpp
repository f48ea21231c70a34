// kernels/flash_attention.cpp — the fast attention forward, compiled once per ISA (MHSA_ISA).
//
// FlashAttention on the CPU. For each (batch, kv head) the keys are packed once, transposed, into
// key blocks Kt [D, Bc] and the values into V [Tk, Dv] padded to whole vectors; the query heads of
// the group then walk their query blocks (Br rows) over the key blocks:
//   S = Q Ktᵀ  [Br, Bc]             register-blocked outer products (kRows × kCols vectors)
//   S = cap(scale·S) + mask; S = -inf outside each row's key_range (finish_scores)
//   online softmax: m' = max(m, rowmax S); O, l rescaled by e^(m − m') only when m moves;
//   P = e^(S − m') (vector exp fused with the row sum); l += Σ P
//   O += P V  [Br, Dv]               register-blocked again, each block's sum added to O (blocked
//                                    summation: the error does not grow with Tk)
// and finally out = O / l, lse = m + log l. Dropout, when asked, scales P after its row sum.
// Memory is O(Br·Bc + Tk·D) per thread, never Tq×Tk.
// Blocks of keys wholly outside every row's key range are skipped (the causal upper triangle, the
// keys before a sliding window): a causal window of W keys costs ~T·(W + Br + Bc) pairs, not T²/2.
//
// Few queries against many keys (decode: Tq <= kDecodeQueries, and at most kDecodeRows query rows
// per kv head counting the group's heads) take a split-K path instead:
// the keys are cut into fixed slices of kSplitKeys, each slice's partial (m, l, O) is computed
// by any thread straight from the unpacked cache, and the partials are merged in slice order.
// Keys and values of a 16-bit KV cache (bfloat16, float16) are widened exactly as they are packed,
// or in registers on the decode path, and those of a q8_0 cache dequantised the same way (a block's
// f16 scale times its int8s, exact in float32; keys and values may differ in type): bit for bit the
// float32 result on the widened cache, with no widened copy of it.
//
// Every output row is computed by one thread, in an order that depends only on the shapes, so
// results are bitwise identical for any thread count. Not a backward kernel (see the gradients).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/isa/attention_tiles.h"
#include "kernels/isa/simd.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Block sizes. Measured with `mhsa bench --filter attention` (AVX-512, 2 threads, Zen 4, best
// runs; GFLOP/s for H12·D64 full / causal, H8·D128 full / causal), Br × Bc:
//   24 × 64: 166 / 144 / 157 / 182    24 × 128: 172 / 155 / 177 / 177    24 × 256: 162 / 159 / 169 / 160
//   48 × 64: 153 / 152 / 153 / 173    48 × 128: 173 / 170 / 194 / 181    48 × 256: 182 / 165 / 198 / 181
//   96 × 128: 169 / 141 / 154 / 159   96 × 256: 181 / 172 / 184 / 178
// (±10% run to run on this shared machine). 48 × 256: the scores [48, 256] and a key block
// [D, 256] live in L2 (1 MiB), the microkernels stream them from L1.
constexpr int64_t kBr = 8 * kRows;           // query rows per block
constexpr int64_t kBc = 4 * kCols * kLanes;  // keys per block: a multiple of the S microkernel width
constexpr int64_t kSplitKeys = 512;      // keys per split-K slice (fixed: results do not depend on threads)

// One (batch, kv head)'s keys and values, packed for the microkernels.
struct PackedKV {
  int64_t blocks = 0;  // key blocks of kBc
  int64_t dv_pad = 0;  // Dv rounded up to whole vectors
  AlignedFloats kt;    // [blocks, D, kBc]   keys transposed per block, zero past Tk
  AlignedFloats v;     // [blocks·kBc, dv_pad]  zero past Tk and Dv
};

// TK, TV: the keys' and values' element types (16-bit ones are widened here, Q8_0 ones
// dequantised, exactly).
template <class TK, class TV>
void pack_block(const AttentionParams& p, int64_t b, int64_t hk, int64_t kb, PackedKV& kv) {
  float* kt = kv.kt.data() + kb * p.D * kBc;
  float* vp = kv.v.data() + kb * kBc * kv.dv_pad;
  const int64_t real = std::clamp<int64_t>(p.Tk - kb * kBc, 0, kBc);  // keys of the block before Tk
  for (int64_t jj = 0; jj < real; ++jj) {
    const int64_t j = kb * kBc + jj;
    const TK* k = key_row<TK>(p, b, hk, j);
    if constexpr (std::is_same_v<TK, BlockQ8_0>) {
      for (int64_t d = 0; d < p.D; ++d) kt[d * kBc + jj] = kv_scalar_at(k, d);
    } else {
      for (int64_t d = 0; d < p.D; ++d) kt[d * kBc + jj] = widen_kv(k[d * p.k_stride[3]]);
    }
    if (kv.dv_pad == 0) continue;  // no values
    const TV* v = value_row<TV>(p, b, hk, j);
    float* vrow = vp + jj * kv.dv_pad;
    if constexpr (std::is_same_v<TV, BlockQ8_0>) {  // Dv a multiple of 32: whole vectors
      for (int64_t d = 0; d < p.Dv; d += kLanes) store(vrow + d, load_kv_at(v, d));
    } else {
      for (int64_t d = 0; d < p.Dv; ++d) vrow[d] = widen_kv(v[d * p.v_stride[3]]);
    }
    std::fill(vrow + p.Dv, vrow + kv.dv_pad, 0.0f);
  }
  // The padding: a run of each key row (a short prompt's block is mostly padding, written a
  // float 1 KiB apart when it went key by key).
  for (int64_t d = 0; d < p.D; ++d) std::fill(kt + d * kBc + real, kt + (d + 1) * kBc, 0.0f);
  std::fill(vp + real * kv.dv_pad, vp + kBc * kv.dv_pad, 0.0f);
}

// Per-thread working set for one query block.
struct Scratch {
  AlignedFloats q;  // [kBr, D]       scaled queries
  AlignedFloats s;  // [kBr, kBc]     scores, then probabilities
  AlignedFloats o;  // [kBr, dv_pad]  unnormalised output
  std::vector<float> m, l;           // [kBr] running max and sum
  std::vector<int64_t> begin, end;   // [kBr] each row's visible keys (key_range)
  AlignedFloats z;                   // [kBc] one row's dropout factors
  Scratch(int64_t D, int64_t dv_pad)
      : q(static_cast<size_t>(kBr * D)), s(static_cast<size_t>(kBr * kBc)), o(static_cast<size_t>(kBr * dv_pad)),
        m(kBr), l(kBr), begin(kBr), end(kBr), z(kBc) {}
};

// Rows [i0, i0 + rows) of query head h against the packed keys of its kv head.
void query_block(const AttentionParams& p, const PackedKV& kv, int64_t b, int64_t h, int64_t i0, int64_t rows,
                 Scratch& w) {
  const int64_t D = p.D, dv_pad = kv.dv_pad;
  const float* q = p.q + b * p.q_stride[0] + h * p.q_stride[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) w.q[r * D + d] = q[(i0 + r) * p.q_stride[2] + d * p.q_stride[3]];
  int64_t min_begin, max_end;
  start_rows(p, b, i0, rows, w.begin.data(), w.end.data(), w.m.data(), w.l.data(), min_begin, max_end);
  std::fill(w.o.begin(), w.o.begin() + rows * dv_pad, 0.0f);
  // Blocks wholly before every row's window or past every row's limit are skipped.
  const int64_t first = min_begin / kBc, blocks = (max_end + kBc - 1) / kBc;
  for (int64_t kb = first; kb < blocks; ++kb) {
    const int64_t j0 = kb * kBc;
    const float* kt = kv.kt.data() + kb * D * kBc;
    for (int64_t r = 0; r < rows; r += kRows)
      for (int64_t c = 0; c < kBc; c += kCols * kLanes)
        tile_fn<ScoresTile>(std::min<int64_t>(kRows, rows - r), kCols)(w.q.data() + r * D, D, kt + c, kBc, D,
                                                                     w.s.data() + r * kBc + c, kBc);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t lo = std::clamp<int64_t>(w.begin[r] - j0, 0, kBc), hi = std::clamp<int64_t>(w.end[r] - j0, lo, kBc);
      const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] +
                                       (i0 + r) * p.mask_stride[2] + j0 * p.mask_stride[3]
                                 : nullptr;
      float* s = w.s.data() + r * kBc;
      const float scale = finish_scores(s, kBc, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr);
      softmax_row(s, kBc, scale, w.m[r], w.l[r], w.o.data() + r * dv_pad, dv_pad);
      if (p.dropout > 0.0f) {  // after the row sum: dropout changes what P·V adds, not l
        dropout_scales(p, b, h, i0 + r, j0, kBc, w.z.data());
        for (int64_t jj = 0; jj < kBc; jj += kLanes) store(s + jj, load(s + jj) * load(w.z.data() + jj));
      }
    }
    // P is 0 before every row's window: P·V starts at the first key some row sees.
    const int64_t skip = std::clamp<int64_t>(min_begin - j0, 0, kBc), keys = std::min(kBc, max_end - j0) - skip;
    const float* vb = kv.v.data() + (j0 + skip) * dv_pad;
    for (int64_t r = 0; r < rows; r += kRows)
      for (int64_t c = 0; c < dv_pad; c += kCols * kLanes)
        tile_fn<AccumulateTile>(std::min<int64_t>(kRows, rows - r), std::min<int64_t>(kCols, (dv_pad - c) / kLanes))(
            w.s.data() + r * kBc + skip, kBc, vb + c, dv_pad, keys, w.o.data() + r * dv_pad + c, dv_pad);
  }
  write_rows(p, b, h, i0, rows, w.m.data(), w.l.data(), w.o.data(), dv_pad);
}

// ---- Split-K decode: few query rows per kv head, many keys. ----

// Asks for the cache lines of [p, p + bytes) (a prefetch never faults), into L1 (locality 3,
// prefetcht0) or L2 (locality 2, prefetcht1).
template <int kLocality = 3>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, kLocality);
}

// Keys and values [j0, j1) of kv head hk in batch b, asked for into L2 (prefetcht1).
template <class TK, class TV>
void prefetch_keys_values(const AttentionParams& p, int64_t b, int64_t hk, int64_t j0, int64_t j1) {
  const bool values = p.v || p.v_pages;
  for (int64_t f = j0; f < j1; ++f) {
    prefetch_bytes<2>(key_row<TK>(p, b, hk, f), kv_bytes<TK>(p.D));
    if (values) prefetch_bytes<2>(value_row<TV>(p, b, hk, f), kv_bytes<TV>(p.Dv));
  }
}

// orow[d0, d0 + NV·kLanes) += Σ_{jj in [lo, hi)} sr[jj] · value jb + jj, key by key in order: each
// element the same chain of FMAs as one load-FMA-store per key, the NV vectors kept in registers.
template <int NV, class T>
void accumulate_values(const AttentionParams& p, int64_t b, int64_t hk, int64_t jb, int64_t lo, int64_t hi,
                       const float* sr, int64_t d0, float* orow) {
  Vec acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = load(orow + d0 + v * kLanes);
  for (int64_t jj = lo; jj < hi; ++jj) {
    const T* vj = value_row<T>(p, b, hk, jb + jj);
    const Vec pj = splat(sr[jj]);
    if constexpr (std::is_same_v<T, BlockQ8_0>) {
      // d0 is a multiple of 8 vectors, so of 32: each block's scale widened once, not once a vector
      // (the same products, so the same bits).
      constexpr int kPerBlock = 32 / kLanes;
      const BlockQ8_0* blocks = vj + (d0 >> 5);
      Vec scale = splat(0.0f);
      for (int v = 0; v < NV; ++v) {
        if (v % kPerBlock == 0) scale = splat(f16_scalar(blocks[v / kPerBlock].d));
        acc[v] = fma(pj, scale * load_i8(blocks[v / kPerBlock].qs + (v % kPerBlock) * kLanes), acc[v]);
      }
    } else {
      for (int v = 0; v < NV; ++v) acc[v] = fma(pj, load_kv_at(vj, d0 + v * kLanes), acc[v]);
    }
  }
  for (int v = 0; v < NV; ++v) store(orow + d0 + v * kLanes, acc[v]);
}

// decode_slice takes keys a chunk of kDecodeChunk at a time, the chunks at j0 + multiples of it.
constexpr int64_t kDecodeChunk = 4 * kLanes;

// Of keys [j0, j1), those that some row sees (keys[r]: row r's range): `end` the end of the last,
// `first` the start of the chunk that holds the first. Chunks that no row sees are skipped (they
// would change nothing); the others keep their places whatever is skipped.
struct SeenKeys {
  int64_t first, end;
};
inline SeenKeys seen_keys(const KeyRange* keys, int64_t n_rows, int64_t j0, int64_t j1) {
  int64_t lo = j1, hi = j0;
  for (int64_t r = 0; r < n_rows; ++r) {
    lo = std::min(lo, std::max(j0, keys[r].begin));
    hi = std::max(hi, std::min(j1, keys[r].end));
  }
  return {j0 + (lo - j0) / kDecodeChunk * kDecodeChunk, hi};
}

// Rows `rows` (query head, query index) of kv head hk, over keys [j0, j1), straight from the
// strided (or paged) cache. Keys are taken kLanes·4 at a time: scores by dot products, then the same
// online softmax and P·V as the blocked path. TK, TV: the keys' and values' element types (16-bit
// ones are widened in registers, Q8_0 ones dequantised, so the result is the float32 one on the
// widened cache).
template <class TK, class TV>
void decode_slice(const AttentionParams& p, int64_t b, int64_t hk, int64_t j0, int64_t j1, int64_t n_rows,
                  const int64_t* heads, const int64_t* queries, float* o, float* m, float* l) {
  constexpr int64_t kKeys = kDecodeChunk;
  float s[kDecodeRows][kKeys];
  const bool values = p.v || p.v_pages;
  const int64_t D = p.D, Dv = p.out ? p.Dv : 0;
  const float* q[kDecodeRows];
  KeyRange keys[kDecodeRows];
  for (int64_t r = 0; r < n_rows; ++r) {
    q[r] = p.q + b * p.q_stride[0] + heads[r] * p.q_stride[1] + queries[r] * p.q_stride[2];
    keys[r] = key_range(p, b, queries[r]);
  }
  const SeenKeys seen = seen_keys(keys, n_rows, j0, j1);
  const int64_t jb0 = seen.first, hi_all = seen.end;
  // The first chunk's keys and values asked for into L2 (prefetcht1) before its keys are read: at
  // a serving step's short contexts a slice is one chunk, so nothing else overlaps their misses.
  // (attention_decode has asked for them already when it guessed this task right.) Later chunks
  // are prefetched one chunk ahead, below.
  prefetch_keys_values<TK, TV>(p, b, hk, jb0, std::min(hi_all, jb0 + kKeys));
  for (int64_t jb = jb0; jb < hi_all; jb += kKeys) {
    const int64_t n = std::min(kKeys, j1 - jb);
    for (int64_t r = 0; r < n_rows; ++r) std::fill(s[r] + n, s[r] + kKeys, 0.0f);  // finish_scores reads them
    int64_t jj = 0;
    for (; jj + 4 <= n; jj += 4) {  // 4 keys at a time: independent chains, each decode_dot's
      const TK *k0 = key_row<TK>(p, b, hk, jb + jj), *k1 = key_row<TK>(p, b, hk, jb + jj + 1),
               *k2 = key_row<TK>(p, b, hk, jb + jj + 2), *k3 = key_row<TK>(p, b, hk, jb + jj + 3);
      // The next chunk's keys and values (those the slice reads), while this chunk computes.
      for (int64_t f = jb + kKeys + jj, end = std::min(hi_all, f + 4); f < end; ++f) {
        prefetch_bytes(key_row<TK>(p, b, hk, f), kv_bytes<TK>(D));
        if (values) prefetch_bytes(value_row<TV>(p, b, hk, f), kv_bytes<TV>(Dv));
      }
      for (int64_t r = 0; r < n_rows; ++r) decode_dot4(q[r], k0, k1, k2, k3, D, s[r] + jj);
    }
    for (; jj < n; ++jj) {
      const TK* kj = key_row<TK>(p, b, hk, jb + jj);
      for (int64_t r = 0; r < n_rows; ++r) s[r][jj] = decode_dot(q[r], kj, D);
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t lo = std::clamp<int64_t>(keys[r].begin - jb, 0, n), hi = std::clamp<int64_t>(keys[r].end - jb, lo, n);
      const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + heads[r] * p.mask_stride[1] +
                                       queries[r] * p.mask_stride[2] + jb * p.mask_stride[3]
                                 : nullptr;
      const float scale = finish_scores(s[r], kKeys, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr);
      softmax_row(s[r], kKeys, scale, m[r], l[r], o + r * Dv, Dv);
      // o += P V key by key, a running sum over the slice's 512 keys at most (the slices are
      // merged afterwards, so the error does not grow with Tk); Dv vectors are independent chains,
      // held in registers up to 8 at a time across the chunk's keys.
      if (values && lo < hi) {
        float* orow = o + r * Dv;
        const int64_t vectors = Dv / kLanes;
        int64_t v0 = 0;
        for (; v0 + 8 <= vectors; v0 += 8) accumulate_values<8, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow);
        switch (vectors - v0) {
          case 7: accumulate_values<7, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 6: accumulate_values<6, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 5: accumulate_values<5, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 4: accumulate_values<4, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 3: accumulate_values<3, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 2: accumulate_values<2, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          case 1: accumulate_values<1, TV>(p, b, hk, jb, lo, hi, s[r], v0 * kLanes, orow); break;
          default: break;
        }
        for (int64_t d = vectors * kLanes; d < Dv; ++d)
          for (int64_t jj = lo; jj < hi; ++jj) orow[d] += s[r][jj] * kv_scalar_at(value_row<TV>(p, b, hk, jb + jj), d);
      }
    }
  }
}

// The decode path over several calls' parameters at once (the sequences of a continuous-batching
// step, each with its own keys and length): every call's (batch, kv head, key slice) is a task
// of one parallel region, then every row's slices are merged. A call's results do not depend on
// which other calls share the region: its tasks and merges are its own, in its own order.
template <class TK, class TV>
void attention_decode(const AttentionParams* ps, int64_t count) {
  struct Item {
    int64_t group, rows, Dv, splits, stride;
    int64_t first_task, first_merge;  // its tasks and merges in the region's numbering
    size_t partials;                  // its first partial
    int64_t heads[kDecodeRows], queries[kDecodeRows];  // row r: query head (within the group), query
  };
  std::vector<Item> items(static_cast<size_t>(count));
  int64_t tasks = 0, merges = 0;
  size_t floats = 0;
  for (int64_t i = 0; i < count; ++i) {
    const AttentionParams& p = ps[i];
    Item& it = items[static_cast<size_t>(i)];
    it.group = p.Hq / p.Hkv;
    it.rows = it.group * p.Tq;
    it.Dv = p.out ? p.Dv : 0;
    it.splits = std::max<int64_t>(1, (p.Tk + kSplitKeys - 1) / kSplitKeys);
    it.stride = it.rows * (it.Dv + 2);  // one slice's partials: per row [Dv] output, m, l
    it.first_task = tasks;
    it.first_merge = merges;
    it.partials = floats;
    for (int64_t r = 0; r < it.rows; ++r) {
      it.heads[r] = r / p.Tq;
      it.queries[r] = r % p.Tq;
    }
    tasks += p.B * p.Hkv * it.splits;
    merges += p.B * p.Hkv;
    floats += static_cast<size_t>(p.B * p.Hkv * it.splits * it.stride);
  }
  AlignedFloats partials(floats);
  // the call whose numbering (first_task or first_merge) holds n
  const auto owner = [&](int64_t n, int64_t Item::*first) {
    const auto next = std::upper_bound(items.begin(), items.end(), n,
                                       [&](int64_t value, const Item& it) { return value < it.*first; });
    return static_cast<int64_t>(next - items.begin()) - 1;
  };
  // Tasks are handed out in runs of consecutive ones (`run`: at a serving step's short contexts,
  // about one sequence's kv heads), so that a thread reads the heads of one sequence in turn, page
  // by page of its blocks, rather than every other one of all the sequences'. At short contexts a
  // task is one chunk (64 keys), whose misses would start only when it does; so the thread asks
  // for the first chunk of the tasks ahead of it in its run, in three steps: two tasks ahead its
  // keys into L2 (prefetcht1); one task ahead its keys into L1 (prefetcht0) and its values into
  // L2; as a task starts, its values into L1 (its scores come first). An 8-sequence GPT-2 step's
  // attention (8 x 12 heads over ~80 paged keys, pass-by-pass alternation, Zen 5): 123-129 -> 91
  // us a layer from memory against keys and values both into L1 one task ahead, 26-29% less; 17%
  // less over ~200 keys, 10% over ~1000 (docs/performance-history.md,
  // "Decode streams split evenly; Q8_0 on VNNI").
  // With runs of one task (a single sequence's few heads), the task one ahead is t + threads, the
  // one the thread will likely take next.
  // Task t: its call, its number within the call (((b · Hkv) + hk) · splits + sp) and its keys [j0, j1).
  struct Task {
    int64_t call, local, b, hk, j0, j1;
  };
  const auto task_at = [&](int64_t t) {
    const int64_t i = owner(t, &Item::first_task);
    const AttentionParams& p = ps[i];
    const Item& it = items[static_cast<size_t>(i)];
    const int64_t local = t - it.first_task;
    const int64_t sp = local % it.splits;
    return Task{i, local, local / it.splits / p.Hkv, local / it.splits % p.Hkv, sp * kSplitKeys,
                std::min(p.Tk, (sp + 1) * kSplitKeys)};
  };
  enum class Ahead { two, one, now };  // how far task t is ahead of the thread's current one
  const auto prefetch_task = [&](int64_t t, Ahead ahead) {
    if (t >= tasks) return;
    const Task k = task_at(t);
    const AttentionParams& p = ps[k.call];
    const Item& it = items[static_cast<size_t>(k.call)];
    KeyRange keys[kDecodeRows];
    for (int64_t r = 0; r < it.rows; ++r) keys[r] = key_range(p, k.b, it.queries[r]);
    const SeenKeys seen = seen_keys(keys, it.rows, k.j0, k.j1);
    const int64_t key_bytes = kv_bytes<TK>(p.D);
    const int64_t value_bytes = kv_bytes<TV>(p.Dv);
    const bool values = p.v || p.v_pages;
    for (int64_t f = seen.first, end = std::min(seen.end, seen.first + kDecodeChunk); f < end; ++f) {
      if (ahead == Ahead::two) prefetch_bytes<2>(key_row<TK>(p, k.b, k.hk, f), key_bytes);
      if (ahead == Ahead::one) prefetch_bytes<3>(key_row<TK>(p, k.b, k.hk, f), key_bytes);
      if (ahead == Ahead::one && values) prefetch_bytes<2>(value_row<TV>(p, k.b, k.hk, f), value_bytes);
      if (ahead == Ahead::now && values) prefetch_bytes<3>(value_row<TV>(p, k.b, k.hk, f), value_bytes);
    }
  };
  // Merges the slices of (b, hk) = local of call i, row by row in slice order:
  // out = Σ e^(m_s − M) O_s / Σ e^(m_s − M) l_s.
  const auto merge = [&](int64_t i, int64_t local) {
    const AttentionParams& p = ps[i];
    const Item& it = items[static_cast<size_t>(i)];
    const int64_t hk = local % p.Hkv, b = local / p.Hkv;
    const int64_t rows = it.rows, Dv = it.Dv, splits = it.splits, stride = it.stride;
    const float* first = partials.data() + it.partials + static_cast<size_t>(local * splits * stride);
    for (int64_t r = 0; r < rows; ++r) {
      float big_m = kNegInf;
      for (int64_t sp = 0; sp < splits; ++sp) big_m = std::max(big_m, first[sp * stride + rows * Dv + r]);
      const int64_t h = hk * it.group + it.heads[r], q = it.queries[r];
      float* out = p.out ? p.out + b * p.out_stride[0] + h * p.out_stride[1] + q * p.out_stride[2] : nullptr;
      float sum = 0.0f;
      for (int64_t d = 0; d < Dv; ++d) out[d * p.out_stride[3]] = 0.0f;
      for (int64_t sp = 0; sp < splits; ++sp) {
        const float* part = first + sp * stride;
        const float ms = part[rows * Dv + r], ls = part[rows * Dv + rows + r];
        if (ls == 0.0f) continue;  // every key of the slice masked (a NaN slice has l NaN)
        const float w = std::exp(ms - big_m);  // NaN when the row's scores so far are all NaN
        sum += w * ls;
        for (int64_t d = 0; d < Dv; ++d) out[d * p.out_stride[3]] += w * part[r * Dv + d];
      }
      const bool masked = sum == 0.0f;  // no visible key
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < Dv; ++d) out[d * p.out_stride[3]] = masked ? 0.0f : out[d * p.out_stride[3]] * inv;
      if (p.lse)
        p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + q * p.lse_stride[2]] =
            masked ? kNegInf : big_m + std::log(sum);
    }
  };
  // A (b, hk) of a single slice is merged by the thread that computed it, straight after, while
  // its partial is in that thread's cache; the others once every slice is done.
  const bool any_split =
      std::any_of(items.begin(), items.end(), [](const Item& it) { return it.splits > 1; });
#pragma omp parallel  // one region: the slices, then (after a barrier) the merges of split ones
  {
    const int64_t run = std::max<int64_t>(1, tasks / (4 * omp_get_num_threads()));
#pragma omp for schedule(dynamic, run) nowait
    for (int64_t t = 0; t < tasks; ++t) {
      const auto [i, local, b, hk, j0, j1] = task_at(t);
      const AttentionParams& p = ps[i];
      const Item& it = items[static_cast<size_t>(i)];
      float* part = partials.data() + it.partials + static_cast<size_t>(local * it.stride);
      float* m = part + it.rows * it.Dv;
      float* l = m + it.rows;
      std::fill(m, m + it.rows, kNegInf);
      int64_t abs_heads[kDecodeRows];
      for (int64_t r = 0; r < it.rows; ++r) abs_heads[r] = hk * it.group + it.heads[r];
      if (run == 1) {  // (few tasks, which go round the threads in turn: the one it will likely take next)
        prefetch_task(t + omp_get_num_threads(), Ahead::one);
      } else {  // (a run starts at a multiple of `run`)
        if (t % run == 0) prefetch_task(t, Ahead::one);
        if ((t + 1) % run != 0) prefetch_task(t + 1, Ahead::one);
        if ((t + 1) % run != 0 && (t + 2) % run != 0) prefetch_task(t + 2, Ahead::two);
      }
      prefetch_task(t, Ahead::now);
      decode_slice<TK, TV>(p, b, hk, j0, j1, it.rows, abs_heads, it.queries, part, m, l);
      if (it.splits == 1) merge(i, local);  // (local = b · Hkv + hk)
    }
    if (any_split) {
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t g = 0; g < merges; ++g) {
        const int64_t i = owner(g, &Item::first_merge);
        if (items[static_cast<size_t>(i)].splits > 1) merge(i, g - items[static_cast<size_t>(i)].first_merge);
      }
    }
  }
}

template <class TK, class TV>
void forward(const AttentionParams& p) {
  if (takes_decode_path(p)) return attention_decode<TK, TV>(&p, 1);
  const int64_t group = p.Hq / p.Hkv;
  const int64_t q_blocks = (p.Tq + kBr - 1) / kBr;
  PackedKV kv;  // shared by all threads: packed once per (batch, kv head)
  kv.blocks = (p.Tk + kBc - 1) / kBc;
  kv.dv_pad = p.out ? round_up(p.Dv, kLanes) : 0;  // no values when only lse is wanted
  kv.kt.resize(static_cast<size_t>(kv.blocks * p.D * kBc));
  kv.v.resize(static_cast<size_t>(kv.blocks * kBc * kv.dv_pad));
  // Query blocks of the group's heads, the most expensive first (causal rows near the bottom see
  // the most keys), handed out dynamically: which thread runs a block never changes its result.
  const int64_t tasks = group * q_blocks;
#pragma omp parallel
  {
    Scratch w(p.D, kv.dv_pad);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
#pragma omp for schedule(static)
        for (int64_t kb = 0; kb < kv.blocks; ++kb) pack_block<TK, TV>(p, b, hk, kb, kv);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
          const int64_t i0 = (q_blocks - 1 - t / group) * kBr;
          query_block(p, kv, b, hk * group + t % group, i0, std::min(kBr, p.Tq - i0), w);
        }
      }
  }
}

}  // namespace

// Calls that take the decode path run together, one region for all those of a pair of key and
// value element types (in a batched step they all are); the others one after another.
void attention_forward(const AttentionParams* ps, int64_t count) {
  std::vector<AttentionParams> decode[kKVElements * kKVElements];  // by (k_element, v_element)
  for (int64_t i = 0; i < count; ++i) {
    if (takes_decode_path(ps[i]))
      decode[static_cast<int>(ps[i].k_element) * kKVElements + static_cast<int>(ps[i].v_element)].push_back(ps[i]);
    else
      with_kv_element(ps[i], [&](auto key, auto value) { forward<decltype(key), decltype(value)>(ps[i]); });
  }
  for (const std::vector<AttentionParams>& list : decode)
    if (!list.empty())
      with_kv_element(list[0], [&](auto key, auto value) {
        attention_decode<decltype(key), decltype(value)>(list.data(), static_cast<int64_t>(list.size()));
      });
}

}  // namespace mhsa::kernels::MHSA_ISA
