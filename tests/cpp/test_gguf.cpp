// tests/cpp/test_gguf.cpp — the GGUF reader and writer (io/gguf.h) and the model mapping
// (model/gguf_model.h, gguf_names.h): every metadata type and tensor type written and read back,
// the writer's refusals, the q/k permutation against its definition, and random llama (grouped
// heads) and gpt2 models written as GGUF and loaded back with the same logits, llama3 RoPE scaling
// as a rope_freqs tensor. The gguf package
// and llama.cpp's own files are compared in tests/python/test_gguf.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "kernels/bf16.h"
#include "kernels/half.h"
#include "kernels/q8_0.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "model/gguf_model.h"
#include "model/gguf_names.h"
#include "test_util.h"

namespace mhsa {
namespace {

namespace fs = std::filesystem;
using detail::GgufFile;
using detail::GgufType;
using detail::GgufWriter;

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("mhsa_gguf_" + std::to_string(test::test_seed()) + "_" +
                                              std::to_string(getpid()));
  TempDir() { fs::create_directories(dir); }
  ~TempDir() { fs::remove_all(dir); }
};

TEST(Gguf, MetadataOfEveryTypeReadsBack) {
  TempDir tmp;
  GgufWriter w;
  w.add_u32("a.u32", 4000000000u);
  w.add_i32("a.i32", -7);
  w.add_f32("a.f32", 0.1f);
  w.add_bool("a.bool", true);
  w.add_string("a.string", "héllo");
  w.add_strings("a.strings", {"x", "", "yz"});
  const std::vector<float> floats = {1.5f, -2.0f};
  const std::vector<int32_t> ints = {3, -4, 5};
  w.add_f32s("a.f32s", floats);
  w.add_i32s("a.i32s", ints);
  EXPECT_THROW(w.add_u32("a.u32", 1), Error);  // each key once
  w.write(tmp.dir / "m.gguf", false);
  const GgufFile f = GgufFile::open(tmp.dir / "m.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_uint("a.u32"), 4000000000u);
  EXPECT_EQ(f.get_float("a.f32"), 0.1f);
  EXPECT_EQ(f.get_bool("a.bool"), true);
  EXPECT_EQ(f.get_string("a.string"), "héllo");
  EXPECT_EQ(f.get_strings("a.strings"), (std::vector<std::string_view>{"x", "", "yz"}));
  EXPECT_EQ(f.get_floats("a.f32s"), floats);
  EXPECT_EQ(f.get_ints("a.i32s"), (std::vector<int64_t>{3, -4, 5}));
  EXPECT_FALSE(f.get_uint("absent").has_value());
  EXPECT_THROW((void)f.get_uint("a.i32"), Error);  // negative
  EXPECT_THROW((void)f.get_string("a.u32"), Error);
  EXPECT_THROW((void)f.get_floats("a.strings"), Error);
  try {
    (void)f.get_bool("a.string");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metadata 'a.string': expected a bool, got string"), std::string::npos) << e.what();
  }
}

TEST(Gguf, TensorsOfEveryStoredTypeReadBack) {
  TempDir tmp;
  auto gen = test::test_rng();
  const Tensor a = test::random_tensor(gen, {3, 5}), b = test::random_tensor(gen, {7}),
               c = test::random_tensor(gen, {2, 3, 64}), d = test::random_tensor(gen, {1, 1, 2, 33});
  GgufWriter w;
  w.add_tensor("a", a, GgufType::f32);
  w.add_tensor("b", b, GgufType::f16);
  w.add_tensor("c", c, GgufType::q8_0);
  w.add_tensor("d", d, GgufType::bf16);
  EXPECT_THROW(w.add_tensor("a", a, GgufType::f32), Error);   // a second "a"
  EXPECT_THROW(w.add_tensor("e", d, GgufType::q8_0), Error);  // rows of 33
  Tensor nan = a;
  nan.data()[3] = NAN;
  EXPECT_THROW(w.add_tensor("f", nan, GgufType::q8_0), Error);
  EXPECT_THROW(w.add_tensor("g", a, GgufType::q4_0), Error);  // not written
  EXPECT_THROW(w.add_tensor("g", a, GgufType::q4_k), Error);  // rows of 5: no whole Q4_K block
  w.write(tmp.dir / "m.gguf", false);
  EXPECT_THROW(w.write(tmp.dir / "m.gguf", false), Error);    // exists
  w.write(tmp.dir / "m.gguf", true);
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()), 1);  // no temporary left
  const GgufFile f = GgufFile::open(tmp.dir / "m.gguf");
  ASSERT_EQ(f.tensors().size(), 4u);
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
  EXPECT_EQ(f.find("c")->dims, (std::vector<int64_t>{64, 3, 2}));
  EXPECT_EQ(detail::gguf_type_name(f.find("c")->type), "Q8_0");
  const Tensor la = f.load(*f.find("a")), lb = f.load(*f.find("b")), lc = f.load(*f.find("c")), ld = f.load(*f.find("d"));
  EXPECT_EQ(la.shape(), a.shape());
  EXPECT_EQ(lc.shape(), c.shape());
  EXPECT_EQ(ld.shape(), d.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(la.data()[i], a.data()[i]);
  for (int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(lb.data()[i], kernels::f16_to_float(kernels::float_to_f16(b.data()[i])));
  for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(ld.data()[i], kernels::bf16_to_float(kernels::float_to_bf16(d.data()[i])));
  std::vector<kernels::BlockQ8_0> blocks(static_cast<size_t>(c.numel() / 32));
  kernels::quantize_row_q8_0(c.data(), c.numel(), blocks.data());
  std::vector<float> want(static_cast<size_t>(c.numel()));
  kernels::dequantize_row_q8_0(blocks.data(), c.numel(), want.data());
  for (int64_t i = 0; i < c.numel(); ++i) EXPECT_EQ(lc.data()[i], want[static_cast<size_t>(i)]);
}

TEST(Gguf, ParseRefusesWhatIsNotGguf) {
  const std::string cases[] = {"", "GGU", "GGML\3\0\0\0", std::string("GGUF\1\0\0\0", 8), std::string("GGUF\3\0\0\0", 8)};
  for (const std::string& bytes : cases) {
    try {
      (void)GgufFile::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "x.gguf");
      FAIL() << bytes.size();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("gguf x.gguf: ", 0), 0u) << e.what();
    }
  }
}

TEST(Gguf, PermutationIsConvertersDefinition) {
  // convert_hf_to_gguf.py: w.reshape(heads, 2, D/2, ...).swapaxes(1, 2): HF row s·D/2 + i of a
  // head is GGUF row 2i + s.
  auto gen = test::test_rng();
  const int64_t heads = 3, D = 6, W = 5;
  const Tensor hf = test::random_tensor(gen, {heads * D, W});
  const Tensor g = detail::permute_rows(hf, heads, true);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < D / 2; ++i)
        for (int64_t x = 0; x < W; ++x)
          EXPECT_EQ(g.data()[(h * D + 2 * i + s) * W + x], hf.data()[(h * D + s * D / 2 + i) * W + x]);
  const Tensor back = detail::permute_rows(g, heads, false);
  for (int64_t i = 0; i < hf.numel(); ++i) EXPECT_EQ(back.data()[i], hf.data()[i]);
}

TEST(Gguf, NamesAreLlamaCpps) {
  ModelConfig llama = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 32, "intermediate_size": 4,
                                                "num_attention_heads": 8, "num_key_value_heads": 2})");
  EXPECT_EQ(detail::gguf_name(llama, "model.layers.11.self_attn.k_proj.weight").name, "blk.11.attn_k.weight");
  EXPECT_EQ(detail::gguf_name(llama, "model.layers.11.self_attn.k_proj.weight").heads, 2);
  EXPECT_EQ(detail::gguf_name(llama, "model.layers.0.self_attn.q_proj.bias").heads, 8);
  EXPECT_EQ(detail::gguf_name(llama, "lm_head.weight").name, "output.weight");
  EXPECT_THROW((void)detail::gguf_name(llama, "model.layers.x.mlp.up_proj.weight"), Error);
  ModelConfig gpt2 = ModelConfig::parse(R"({"model_type": "gpt2"})");
  EXPECT_EQ(detail::gguf_name(gpt2, "h.3.attn.c_attn.weight").layout, detail::GgufLayout::transposed);
  EXPECT_EQ(detail::gguf_name(gpt2, "h.3.attn.c_attn.bias").layout, detail::GgufLayout::as_is);
  EXPECT_EQ(detail::gguf_name(gpt2, "wpe.weight").name, "position_embd.weight");
  ModelConfig qwen = ModelConfig::parse(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 4})");
  EXPECT_THROW((void)detail::gguf_name(qwen, "model.norm.weight"), Error);
}

// Random models of each family written as GGUF (F32) load back with the same logits.
TEST(Gguf, ModelsRoundTripWithTheSameLogits) {
  TempDir tmp;
  const uint64_t seed = test::test_seed();
  const char* configs[] = {
      R"({"model_type": "llama", "vocab_size": 37, "hidden_size": 24, "intermediate_size": 41, "num_hidden_layers": 2,
          "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 32, "tie_word_embeddings": false,
          "attention_bias": true, "rope_theta": 5000.0})",
      R"({"model_type": "gpt2", "vocab_size": 29, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 24})"};
  for (const char* json : configs) {
    const Model m = Model::random(ModelConfig::parse(json), seed);
    const fs::path path = tmp.dir / (std::string(family_name(m.family())) + ".gguf");
    detail::save_gguf(m, path, GgufType::f32, false);
    const Model back = Model::load(path);
    EXPECT_EQ(back.config().num_kv_heads, m.config().num_kv_heads);
    EXPECT_EQ(back.config().tie_word_embeddings, m.config().tie_word_embeddings);
    const std::vector<int32_t> ids = {1, 5, 3, 0, 7, 2, 2};
    const Tensor a = m.forward(ids, 1, 7), b = back.forward(ids, 1, 7);
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]) << json;
  }
}

// llama3 RoPE scaling goes to GGUF as llama.cpp's converter writes it, a rope_freqs tensor of
// per-frequency divisors, and comes back as those factors: the same frequencies up to float32
// rounding (logits close), and the factors written again unchanged (logits bit for bit).
TEST(Gguf, Llama3RopeScalingRoundTripsAsRopeFreqs) {
  TempDir tmp;
  const Model m = Model::random(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 41, "hidden_size": 32,
      "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "max_position_embeddings": 128, "rope_theta": 500000.0, "tie_word_embeddings": true,
      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 64}})"),
                                test::test_seed());
  detail::save_gguf(m, tmp.dir / "a.gguf", GgufType::f32, false);
  const Model back = Model::load(tmp.dir / "a.gguf");
  const RopeScaling& s = back.config().rope_scaling;
  ASSERT_EQ(s.kind, RopeScalingKind::factors);
  ASSERT_EQ(s.factors.size(), 8u);
  EXPECT_EQ(s.factors.front(), 1.0f);  // the shortest wavelength is kept, the longest divided by 32
  EXPECT_EQ(s.factors.back(), 32.0f);
  EXPECT_TRUE(std::any_of(s.factors.begin(), s.factors.end(), [](float f) { return f > 1 && f < 32; }));
  detail::save_gguf(back, tmp.dir / "b.gguf", GgufType::f32, false);
  const Model again = Model::load(tmp.dir / "b.gguf");
  EXPECT_EQ(again.config().rope_scaling.factors, s.factors);
  std::mt19937 rng(static_cast<uint32_t>(test::test_seed()));
  std::vector<int32_t> ids(80 + rng() % 40);  // positions past original_max_position_embeddings
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 41);
  const int64_t T = static_cast<int64_t>(ids.size());
  const Tensor a = m.forward(ids, 1, T), b = back.forward(ids, 1, T), c = again.forward(ids, 1, T);
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += std::pow(double(a.data()[i]) - b.data()[i], 2);
    norm += std::pow(double(a.data()[i]), 2);
    ASSERT_EQ(b.data()[i], c.data()[i]);
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
}

}  // namespace
}  // namespace mhsa
