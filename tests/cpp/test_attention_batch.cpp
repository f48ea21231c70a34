// tests/cpp/test_attention_batch.cpp — the batched attention call (several sequences, each over its
// own contiguous or paged keys and values, as a continuous-batching step runs them): each
// sequence's output equal bit for bit to its own call, on the fast and the reference kernels,
// float32 and bfloat16 keys and values, decode rows and prefill chunks mixed, grouped heads,
// several key slices (Tk past 512), keyless rows; and the errors that name the item.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mhsa/attention.h"
#include "mhsa/error.h"
#include "test_util.h"

namespace mhsa {
namespace {

// A float's bfloat16 (truncated: any bfloat16 will do as test data), or the float itself.
template <class E>
E element(float x) {
  if constexpr (std::is_same_v<E, float>) {
    return x;
  } else {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return E{static_cast<uint16_t>(bits >> 16)};
  }
}

// One sequence of the batch: its queries, its keys and values (contiguous, or in shuffled blocks),
// and two outputs (the batched call's and its own call's), NaN until written.
template <class E>
struct Seq {
  int64_t Hq = 0, Hkv = 0, D = 0, Tq = 0, Tk = 0;
  Tensor q, out_batch, out_alone;
  std::vector<E> k, v;                  // [1, Hkv, Tk, D] (at least one element: a valid pointer)
  std::vector<E> store;                 // paged: the blocks, in shuffled places
  std::vector<const E*> kb, vb;
  std::unique_ptr<PagedKVOf<E>> paged;  // null: contiguous
};

template <class E>
std::unique_ptr<Seq<E>> random_seq(std::mt19937_64& gen, bool causal) {
  auto s = std::make_unique<Seq<E>>();
  const auto pick = [&](std::initializer_list<int64_t> from) { return *(from.begin() + gen() % from.size()); };
  s->Hkv = pick({1, 2, 3});
  s->Hq = s->Hkv * pick({1, 2, 3});
  s->D = pick({16, 40, 64, 80});
  s->Tq = pick({1, 1, 1, 2, 5, 33});  // decode rows, and now and then a prefill chunk
  s->Tk = s->Tq + static_cast<int64_t>(gen() % 1100);  // past 512: several key slices
  if (!causal && gen() % 6 == 0) s->Tk = 0;             // no keys: rows fully masked
  s->q = test::random_tensor(gen, {1, s->Hq, s->Tq, s->D});
  for (Tensor* t : {&s->out_batch, &s->out_alone}) {
    *t = Tensor({1, s->Hq, s->Tq, s->D});
    std::fill(t->data(), t->data() + t->numel(), NAN);
  }
  const Tensor k = test::random_tensor(gen, {1, s->Hkv, s->Tk, s->D}), v = test::random_tensor(gen, {1, s->Hkv, s->Tk, s->D});
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, k.numel()));
  s->k.assign(n, element<E>(0.0f));
  s->v.assign(n, element<E>(0.0f));
  for (int64_t i = 0; i < k.numel(); ++i) {
    s->k[static_cast<size_t>(i)] = element<E>(k.data()[i]);
    s->v[static_cast<size_t>(i)] = element<E>(v.data()[i]);
  }
  if (gen() % 2) {  // paged: blocks of bs tokens [Hkv, bs, D], in shuffled places
    const int64_t bs = pick({1, 4, 16}), blocks = (s->Tk + bs - 1) / bs, block = s->Hkv * bs * s->D;
    std::vector<int64_t> where(static_cast<size_t>(blocks));
    std::iota(where.begin(), where.end(), 0);
    std::shuffle(where.begin(), where.end(), gen);
    s->store.assign(static_cast<size_t>(std::max<int64_t>(1, 2 * blocks * block)), element<E>(NAN));
    for (int64_t b = 0; b < blocks; ++b) {
      E* kp = s->store.data() + where[static_cast<size_t>(b)] * 2 * block;
      E* vp = kp + block;
      for (int64_t h = 0; h < s->Hkv; ++h)
        for (int64_t t = 0; t < bs && b * bs + t < s->Tk; ++t)
          for (int64_t d = 0; d < s->D; ++d) {
            const size_t from = static_cast<size_t>((h * s->Tk + b * bs + t) * s->D + d);
            kp[(h * bs + t) * s->D + d] = s->k[from];
            vp[(h * bs + t) * s->D + d] = s->v[from];
          }
      s->kb.push_back(kp);
      s->vb.push_back(vp);
    }
    s->paged = std::make_unique<PagedKVOf<E>>(PagedKVOf<E>{s->kb, s->vb, bs, s->Tk, s->Hkv, s->D, s->D});
  }
  return s;
}

template <class E>
AttentionBatchItem<E> item_of(Seq<E>& s, TensorView out) {
  AttentionBatchItem<E> it;
  it.q = s.q.view();
  it.out = out;
  if (s.paged) {
    it.paged = s.paged.get();
  } else {
    it.k = View<const E>(s.k.data(), {1, s.Hkv, s.Tk, s.D});
    it.v = View<const E>(s.v.data(), {1, s.Hkv, s.Tk, s.D});
  }
  return it;
}

template <class E>
void check_batches(std::mt19937_64& gen, const AttentionOptions& options, bool causal) {
  for (int round = 0; round < 6; ++round) {
    std::vector<std::unique_ptr<Seq<E>>> seqs;
    const int count = 1 + static_cast<int>(gen() % 9);
    for (int i = 0; i < count; ++i) seqs.push_back(random_seq<E>(gen, causal));
    for (Backend backend : {Backend::automatic, Backend::reference}) {
      AttentionOptions o = options;
      o.backend = backend;
      std::vector<AttentionBatchItem<E>> items;
      for (auto& s : seqs) items.push_back(item_of(*s, s->out_batch.view()));
      scaled_dot_product_attention<E>(std::span<const AttentionBatchItem<E>>(items), o);
      for (size_t i = 0; i < seqs.size(); ++i) {
        Seq<E>& s = *seqs[i];
        SCOPED_TRACE(testing::Message() << "round " << round << " sequence " << i << " of " << count << ": Hq " << s.Hq
                                        << " Hkv " << s.Hkv << " D " << s.D << " Tq " << s.Tq << " Tk " << s.Tk
                                        << (s.paged ? " paged" : " contiguous") << " backend "
                                        << (backend == Backend::reference ? "reference" : "automatic"));
        const AttentionBatchItem<E> alone = item_of(s, s.out_alone.view());
        if (s.paged)
          scaled_dot_product_attention(alone.q, *alone.paged, alone.out, o);
        else
          scaled_dot_product_attention(alone.q, alone.k, alone.v, alone.out, o);
        for (int64_t j = 0; j < s.out_alone.numel(); ++j) {
          ASSERT_FALSE(std::isnan(s.out_alone.data()[j])) << j;
          ASSERT_EQ(s.out_batch.data()[j], s.out_alone.data()[j]) << j;
        }
      }
    }
  }
}

TEST(AttentionBatch, EachSequenceEqualsItsOwnCall) {
  auto gen = test::test_rng();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;  // Mistral's and Gemma 2's options
  window.window.left = 37;
  window.softcap = 30.0f;
  const AttentionOptions plain;
  check_batches<float>(gen, causal, true);
  check_batches<float>(gen, window, true);
  check_batches<float>(gen, plain, false);
  check_batches<bfloat16>(gen, causal, true);
  check_batches<bfloat16>(gen, plain, false);
}

// The fast kernels' batch against the reference kernel (float64 sums) on the same batch: the
// batched region computes attention, not only the same bits as the single call.
TEST(AttentionBatch, FastBatchIsCloseToTheReference) {
  auto gen = test::test_rng();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 37;
  window.softcap = 30.0f;
  for (const AttentionOptions& options : {causal, window, causal}) {
    std::vector<std::unique_ptr<Seq<float>>> seqs;
    for (int i = 0; i < 8; ++i) seqs.push_back(random_seq<float>(gen, true));
    std::vector<AttentionBatchItem<float>> fast, ref;
    for (auto& s : seqs) {
      fast.push_back(item_of(*s, s->out_batch.view()));
      ref.push_back(item_of(*s, s->out_alone.view()));
    }
    AttentionOptions o = options;
    scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(fast), o);
    o.backend = Backend::reference;
    scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(ref), o);
    for (auto& s : seqs) {
      double err = 0, norm = 0;
      for (int64_t j = 0; j < s->out_alone.numel(); ++j) {
        err += std::pow(double(s->out_batch.data()[j]) - s->out_alone.data()[j], 2);
        norm += std::pow(double(s->out_alone.data()[j]), 2);
      }
      EXPECT_LE(std::sqrt(err / norm), 1e-5) << "Tq " << s->Tq << " Tk " << s->Tk << " D " << s->D;
    }
  }
}

TEST(AttentionBatch, ErrorsNameTheItem) {
  auto gen = test::test_rng();
  std::vector<std::unique_ptr<Seq<float>>> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(random_seq<float>(gen, true));
  std::vector<AttentionBatchItem<float>> items;
  for (auto& s : seqs) items.push_back(item_of(*s, s->out_batch.view()));
  const auto message_of = [&](const AttentionOptions& o) {
    try {
      scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(items), o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message_of({}), "no error");
  Tensor wrong({1, seqs[1]->Hq, seqs[1]->Tq + 1, seqs[1]->D});
  items[1].out = wrong.view();
  const std::string m = message_of({});
  EXPECT_NE(m.find("batch[1]"), std::string::npos) << m;
  EXPECT_NE(m.find("out"), std::string::npos) << m;
  EXPECT_EQ(m.rfind("scaled_dot_product_attention (batch[1]): out: expected shape [", 0), 0u) << m;
  items[1].out = seqs[1]->out_batch.view();
  // An input's error names its item too (the name is written only once a check fails).
  Tensor wrong_q({1, seqs[2]->Hq, seqs[2]->Tq, seqs[2]->D + 1});
  items[2].q = wrong_q.view();
  const std::string mq = message_of({});
  EXPECT_EQ(mq.rfind("scaled_dot_product_attention (batch[2]): ", 0), 0u) << mq;
  items[2].q = seqs[2]->q.view();
  EXPECT_EQ(message_of({}), "no error");
  AttentionOptions masked;
  const Tensor mask({1, 1, 1, 1});
  masked.attn_mask = mask.view();
  EXPECT_NE(message_of(masked).find("options.attn_mask"), std::string::npos) << message_of(masked);
  AttentionOptions lengths;
  const int64_t len[] = {1};
  lengths.kv_lengths = len;
  EXPECT_NE(message_of(lengths).find("options.kv_lengths"), std::string::npos) << message_of(lengths);
  // An empty batch does nothing.
  EXPECT_NO_THROW(scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(), {}));
}

}  // namespace
}  // namespace mhsa
