// python/src/bindings.cpp — the mhsa._core extension: the library's API with PyTorch's names.
// Arrays are float32 NumPy arrays (or anything NumPy can view, such as CPU torch tensors) with any
// strides; every mhsa::Error is raised as mhsa.Error, a subclass of ValueError, with the same
// message. The GIL is released while kernels run. Not a tensor type: results are NumPy arrays.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "arrays.h"
#include "mhsa/mhsa.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

struct CallOptions {
  AttentionOptions options;
  std::vector<int64_t> kv_lengths;  // storage behind options.kv_lengths
  InputArray mask;                  // storage behind options.attn_mask
};

CallOptions call_options(std::string_view fn, const py::object& attn_mask, bool is_causal,
                         const std::optional<float>& scale, const py::object& kv_lengths) {
  CallOptions c;
  c.options.causal = is_causal;
  c.options.scale = scale;
  if (!kv_lengths.is_none()) {
    c.kv_lengths = int_vector(kv_lengths, fn, "kv_lengths");
    c.options.kv_lengths = c.kv_lengths;
  }
  if (!attn_mask.is_none()) {
    c.mask = mask_array(attn_mask, fn);
    c.options.attn_mask = c.mask.view;
  }
  return c;
}

py::object sdpa(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::object& attn_mask,
                bool is_causal, std::optional<float> scale, const py::object& kv_lengths, bool return_lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  const InputArray v = float_array(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]");
  const CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  const auto [B, Hq, Tq] = std::tuple(q.view.shape[0], q.view.shape[1], q.view.shape[2]);
  OutputArray out = new_array({B, Hq, Tq, v.view.shape[3]});
  OutputArray lse = new_array({B, Hq, Tq});
  {
    py::gil_scoped_release unlocked;
    scaled_dot_product_attention(q.view, k.view, v.view, out.view, c.options, lse.view);
  }
  if (return_lse) return py::make_tuple(out.array, lse.array);
  return out.array;
}

py::tuple sdpa_backward(const py::object& dout_obj, const py::object& q_obj, const py::object& k_obj,
                        const py::object& v_obj, const py::object& out_obj, const py::object& lse_obj,
                        const py::object& attn_mask, bool is_causal, std::optional<float> scale,
                        const py::object& kv_lengths) {
  constexpr std::string_view fn = "scaled_dot_product_attention_backward";
  const InputArray dout = float_array(dout_obj, fn, "dout", 4, "[B, Hq, Tq, Dv]");
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  const InputArray v = float_array(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]");
  const InputArray out = float_array(out_obj, fn, "out", 4, "[B, Hq, Tq, Dv]");
  const InputArray lse = float_array(lse_obj, fn, "lse", 3, "[B, Hq, Tq]");
  const CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  const auto shape = [](const ConstTensorView& t) {
    return std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  };
  OutputArray dq = new_array(shape(q.view)), dk = new_array(shape(k.view)), dv = new_array(shape(v.view));
  {
    py::gil_scoped_release unlocked;
    scaled_dot_product_attention_backward(dout.view, q.view, k.view, v.view, out.view, lse.view, dq.view, dk.view,
                                          dv.view, c.options);
  }
  return py::make_tuple(dq.array, dk.array, dv.array);
}

py::array probabilities(const py::object& q_obj, const py::object& k_obj, const py::object& attn_mask, bool is_causal,
                        std::optional<float> scale, const py::object& kv_lengths) {
  constexpr std::string_view fn = "attention_probabilities";
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  const CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  OutputArray probs = new_array({q.view.shape[0], q.view.shape[1], q.view.shape[2], k.view.shape[2]});
  py::gil_scoped_release unlocked;
  attention_probabilities(q.view, k.view, ConstTensorView{}, probs.view, c.options);
  return probs.array;
}

MultiHeadAttention make_mha(int64_t embed_dim, int64_t num_heads, const std::optional<int64_t>& num_kv_heads, bool bias,
                            uint64_t seed) {
  if (num_kv_heads && *num_kv_heads <= 0)
    throw Error(detail::message("MultiHeadAttention: num_kv_heads: expected None or a count > 0 dividing num_heads = ",
                                num_heads, ", got ", *num_kv_heads));
  return MultiHeadAttention(embed_dim, num_heads, num_kv_heads.value_or(0), bias, seed);
}

py::object mha_call(const MultiHeadAttention& m, const py::object& x_obj, const py::object& memory, bool is_causal,
                    const py::object& kv_lengths, bool need_weights, const py::object& attn_mask) {
  constexpr std::string_view fn = "MultiHeadAttention";
  const InputArray x = float_array(x_obj, fn, "x", 3, "[B, T, C]");
  const CallOptions c = call_options(fn, attn_mask, is_causal, std::nullopt, kv_lengths);
  MhaOptions o;
  o.causal = c.options.causal;
  o.kv_lengths = c.options.kv_lengths;
  o.attn_mask = c.options.attn_mask;
  Tensor weights;
  if (need_weights) o.weights = &weights;
  Tensor y;
  if (memory.is_none()) {
    py::gil_scoped_release unlocked;
    y = m.forward(x.view, o);
  } else if (py::isinstance<KVCache>(memory)) {
    const auto& kv = memory.cast<const KVCache&>();
    py::gil_scoped_release unlocked;
    y = m.forward(x.view, kv, o);
  } else {
    const InputArray mem = float_array(memory, fn, "memory", 3, "[B, S, C]");
    py::gil_scoped_release unlocked;
    y = m.forward(x.view, m.project_memory(mem.view), o);
  }
  if (need_weights) return py::make_tuple(to_numpy(std::move(y)), to_numpy(std::move(weights)));
  return to_numpy(std::move(y));
}

void def_parameter(py::class_<MultiHeadAttention>& cls, const char* name, const char* doc) {
  cls.def_property(
      name, [name](py::object self) { return view_of(self.cast<MultiHeadAttention&>().parameter(name), self, true); },
      [name](MultiHeadAttention& m, const py::object& value) {
        const int ndim = static_cast<int>(m.parameter(name).shape().size());
        const InputArray a = float_array(value, "MultiHeadAttention", name, ndim, ndim == 2 ? "[rows, cols]" : "[n]");
        m.set_parameter(name, a.view);
      },
      doc);
}

}  // namespace
}  // namespace mhsa::python

PYBIND11_MODULE(_core, m) {
  using namespace mhsa;
  using namespace mhsa::python;
  m.doc() = "mhsa: multi-head self-attention on the CPU (C++ core)";
  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::set_error(error, e.what());
    }
  });

  m.def("scaled_dot_product_attention", &sdpa, "q"_a, "k"_a, "v"_a, "attn_mask"_a = py::none(), "is_causal"_a = false,
        "scale"_a = py::none(), "kv_lengths"_a = py::none(), "return_lse"_a = false,
        R"(Attention of q [B, Hq, Tq, D] over k [B, Hkv, Tk, D] and v [B, Hkv, Tk, Dv] -> out [B, Hq, Tq, Dv].

float32 arrays with any strides. Hq % Hkv == 0 (grouped-query heads). attn_mask: additive float32 or
bool (True = attend) of shape [Tq, Tk], [Hq|1, Tq, Tk] or [B|1, Hq|1, Tq, Tk]. is_causal: query i sees keys
j <= i + Tk - Tq. scale: default 1/sqrt(D). kv_lengths: [B] valid keys per batch. A row with no visible key
gives 0. With return_lse, returns (out, lse [B, Hq, Tq]).)");
  m.def("scaled_dot_product_attention_backward", &sdpa_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a,
        "attn_mask"_a = py::none(), "is_causal"_a = false, "scale"_a = py::none(), "kv_lengths"_a = py::none(),
        R"(Gradients (dq, dk, dv) of scaled_dot_product_attention from dout [B, Hq, Tq, Dv] and the forward's
inputs, out and lse (from return_lse=True), with the forward's options. dk and dv sum over the query heads
of a group; rows with no visible key get zero gradients.)");
  m.def("attention_probabilities", &probabilities, "q"_a, "k"_a, "attn_mask"_a = py::none(), "is_causal"_a = false,
        "scale"_a = py::none(), "kv_lengths"_a = py::none(),
        "The exact softmax matrix [B, Hq, Tq, Tk] that scaled_dot_product_attention applies (same options).");
  m.def(
      "sinusoidal_positional_encoding",
      [](int64_t tokens, int64_t channels) { return to_numpy(sinusoidal_positional_encoding(tokens, channels)); },
      "tokens"_a, "channels"_a, "Sinusoidal positional encoding [tokens, channels] (Vaswani et al.).");

  py::class_<KVCache>(m, "KVCache", "Keys and values of past tokens, for MultiHeadAttention.step.")
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("batch", &KVCache::batch)
      .def_property_readonly(
          "keys", [](py::object self) { return view_of(self.cast<const KVCache&>().keys(), self, false); },
          "Read-only view [B, Hkv, length, D] of the cached keys.")
      .def_property_readonly(
          "values", [](py::object self) { return view_of(self.cast<const KVCache&>().values(), self, false); },
          "Read-only view [B, Hkv, length, D] of the cached values.")
      .def("reset", &KVCache::reset, "Forget every token; the capacity is kept.")
      .def("__len__", &KVCache::length);

  py::class_<MultiHeadAttention> mha(m, "MultiHeadAttention", R"(Multi-head attention in the GPT-2 weight layout.

w_qkv [C, C + 2*Ckv] (input-major: y = x @ w_qkv + b_qkv), w_o [C, C]; Ckv = num_kv_heads * head_dim.)");
  mha.def(py::init(&make_mha), "embed_dim"_a, "num_heads"_a, "num_kv_heads"_a = py::none(), "bias"_a = true,
          "seed"_a = 0)
      .def_property_readonly("embed_dim", &MultiHeadAttention::embed_dim)
      .def_property_readonly("num_heads", &MultiHeadAttention::num_heads)
      .def_property_readonly("num_kv_heads", &MultiHeadAttention::num_kv_heads)
      .def_property_readonly("head_dim", &MultiHeadAttention::head_dim)
      .def("__call__", &mha_call, "x"_a, "memory"_a = py::none(), "is_causal"_a = false, "kv_lengths"_a = py::none(),
           "need_weights"_a = false, "attn_mask"_a = py::none(),
           R"(y [B, T, C] = attention of x [B, T, C] over itself, or over memory [B, S, C] (an array or the
KVCache from project_memory). kv_lengths: [B] valid tokens of x (self) or memory (cross). With
need_weights, returns (y, weights [B, H, T, S]), per head.)")
      .def(
          "project_memory", [](const MultiHeadAttention& self, const py::object& memory) {
            const InputArray mem = float_array(memory, "MultiHeadAttention.project_memory", "memory", 3, "[B, S, C]");
            py::gil_scoped_release unlocked;
            return self.project_memory(mem.view);
          },
          "memory"_a, "Keys and values of an encoder memory [B, S, C], projected once for reuse as `memory=`.")
      .def("new_cache", &MultiHeadAttention::new_cache, "batch"_a, "max_tokens"_a,
           "An empty KVCache for `batch` sequences of up to `max_tokens` tokens.")
      .def(
          "step",
          [](const MultiHeadAttention& self, const py::object& x_obj, KVCache& cache) {
            const InputArray x = float_array(x_obj, "MultiHeadAttention.step", "x", 3, "[B, T, C]");
            Tensor y;
            {
              py::gil_scoped_release unlocked;
              y = self.step(x.view, cache);
            }
            return to_numpy(std::move(y));
          },
          "x"_a, "cache"_a, "Appends x [B, T, C] to the cache and attends causally over all of it; returns y [B, T, C].");
  def_parameter(mha, "w_qkv", "Fused Q|K|V projection [C, C + 2*Ckv] (a writeable view; assign to replace).");
  def_parameter(mha, "b_qkv", "Fused Q|K|V bias [C + 2*Ckv].");
  def_parameter(mha, "w_o", "Output projection [C, C].");
  def_parameter(mha, "b_o", "Output projection bias [C].");
}
