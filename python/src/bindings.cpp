// python/src/bindings.cpp — the mhsa._core extension: the library's API with PyTorch's names.
// Arrays are float32 NumPy arrays (or anything NumPy can view, such as CPU torch tensors) with any
// strides; every mhsa::Error is raised as mhsa.Error, a subclass of ValueError, with the same
// message (an mhsa::WriteError as mhsa.WriteError, a subclass of mhsa.Error with .errno). The GIL is released while kernels run; objects with mutable state are locked meanwhile
// (locks.h), so that threads may share them. Not a tensor type: results are NumPy arrays.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "arrays.h"
#include "call_options.h"
#include "core/cpu.h"
#include "locks.h"
#include "mhsa/mhsa.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

// The Python layer: the C++ layer plus what training needs between calls, the tape of the last
// forward run with requires_grad and the accumulated parameter gradients. Calls that write the
// tape, the gradients or the weights hold `lock` exclusively; the others share it.
struct Layer {
  MultiHeadAttention m;
  std::optional<MhaTape> tape;
  MhaGradients grads;
  ObjectLock lock;
};

// mhsa.KVCache: a cache and its lock (a step appends to it; reads share it).
struct Cache {
  KVCache cache;
  ObjectLock lock;
};

Layer make_mha(int64_t embed_dim, int64_t num_heads, const std::optional<int64_t>& num_kv_heads, bool bias,
               uint64_t seed) {
  if (num_kv_heads && *num_kv_heads <= 0)
    throw Error(detail::message("MultiHeadAttention: num_kv_heads: expected None or a count > 0 dividing num_heads = ",
                                num_heads, ", got ", *num_kv_heads));
  MultiHeadAttention m(embed_dim, num_heads, num_kv_heads.value_or(0), bias, seed);
  MhaGradients grads = m.zero_gradients();
  return Layer{std::move(m), std::nullopt, std::move(grads), {}};
}

py::object mha_call(Layer& layer, const py::object& x_obj, const py::object& memory, bool is_causal,
                    const py::object& kv_lengths, bool need_weights, const py::object& attn_mask, bool requires_grad) {
  const MultiHeadAttention& m = layer.m;
  constexpr std::string_view fn = "MultiHeadAttention";
  const InputArray x = float_array(x_obj, fn, "x", 3, "[B, T, C]");
  const CallOptions c = call_options(fn, attn_mask, is_causal, std::nullopt, kv_lengths);
  MhaOptions o;
  o.causal = c.options.causal;
  o.kv_lengths = c.options.kv_lengths;
  o.attn_mask = c.options.attn_mask;
  Tensor weights;
  if (need_weights) o.weights = &weights;
  MhaTape tape;
  if (requires_grad) o.tape = &tape;
  // With requires_grad the call replaces the tape: it writes the layer.
  const Use use_layer = requires_grad ? writing(layer.lock) : reading(layer.lock);
  const auto keep_tape = [&] {
    if (requires_grad) layer.tape = std::move(tape);
  };
  Tensor y;
  if (memory.is_none()) {
    y = locked([&] {
      Tensor out = m.forward(x.view, o);
      keep_tape();
      return out;
    }, use_layer);
  } else if (py::isinstance<Cache>(memory)) {
    if (requires_grad)
      throw Error("MultiHeadAttention: memory: expected an array [B, S, C] with requires_grad=True, got a KVCache");
    Cache& kv = memory.cast<Cache&>();
    y = locked([&] { return m.forward(x.view, kv.cache, o); }, use_layer, reading(kv.lock));
  } else {
    const InputArray mem = float_array(memory, fn, "memory", 3, "[B, S, C]");
    y = locked([&] {
      Tensor out = m.forward(x.view, mem.view, o);
      keep_tape();
      return out;
    }, use_layer);
  }
  if (need_weights) return py::make_tuple(to_numpy(std::move(y)), to_numpy(std::move(weights)));
  return to_numpy(std::move(y));
}

// torch.nn.MultiheadAttention(batch_first=True)'s call, mapped onto this layer: keys and values
// come from one memory (key and value the same array), the query's own tokens when it is that
// array too. Torch's bool masks mark what is masked out (True), this layer's what is attended, so
// they are turned into additive masks; key_padding_mask [B, S] is added to attn_mask ([T, S], or
// torch's [B*H, T, S]). Returns (attn_output, weights averaged over heads [B, T, S], per head
// [B, H, T, S] with average_attn_weights=False, or None).
py::tuple mha_torch_call(Layer& layer, const py::object& query, const py::object& key, const py::object& value,
                         const py::object& key_padding_mask, bool need_weights, const py::object& attn_mask,
                         bool average_attn_weights, bool is_causal) {
  constexpr std::string_view fn = "MultiHeadAttention";
  const py::module_ np = py::module_::import("numpy");
  const auto same = [&](const py::object& a, const py::object& b) {
    return a.is(b) || (np.attr("shape")(a).equal(np.attr("shape")(b)) && np.attr("array_equal")(a, b).cast<bool>());
  };
  if (!same(key, value))
    throw Error("MultiHeadAttention: value: expected the array given as key (this layer projects keys and values "
                "from one memory, as GPT-2's does), got a different one");
  const bool self_attention = same(query, key);
  const InputArray q = float_array(query, fn, "query", 3, "[B, T, C]");
  const int64_t B = q.view.shape[0], T = q.view.shape[1], H = layer.m.num_heads();
  const int64_t S = self_attention ? T : float_array(key, fn, "key", 3, "[B, S, C]").view.shape[1];
  const float inf = std::numeric_limits<float>::infinity();
  const auto additive = [&](const py::object& mask) -> py::object {  // torch's True = masked out
    const py::array a = np.attr("asarray")(mask);
    if (a.dtype().kind() == 'b') return np.attr("where")(a, -inf, 0.0f).attr("astype")("float32");
    return a;
  };
  py::object mask = py::none();
  if (!attn_mask.is_none()) {
    mask = additive(attn_mask);
    const int ndim = py::array(mask).ndim();
    if (ndim == 3)
      mask = mask.attr("reshape")(B, H, T, S);  // torch's [B*H, T, S], batch-major
    else if (ndim != 2)
      throw Error(detail::message("MultiHeadAttention: attn_mask: expected [T, S] or [B*num_heads, T, S], got a ",
                                  ndim, "-D array"));
  }
  if (!key_padding_mask.is_none()) {
    const py::object padding = np.attr("broadcast_to")(additive(key_padding_mask).attr("reshape")(B, 1, 1, S),
                                                       py::make_tuple(B, 1, T, S));
    mask = mask.is_none() ? padding : np.attr("add")(padding, mask);
  }
  const py::object out = mha_call(layer, query, self_attention ? py::object(py::none()) : key, is_causal, py::none(),
                                  need_weights, mask, false);
  if (!need_weights) return py::make_tuple(out, py::none());
  const py::tuple both = out.cast<py::tuple>();
  return py::make_tuple(both[0], average_attn_weights ? both[1].attr("mean")("axis"_a = 1) : py::object(both[1]));
}

py::object mha_backward(Layer& layer, const py::object& dy_obj) {
  const InputArray dy = float_array(dy_obj, "MultiHeadAttention.backward", "dy", 3, "[B, T, C]");
  bool cross = false;
  MhaInputGradients g = locked([&] {  // the tape is read and the gradients written under the lock
    if (!layer.tape)
      throw Error("MultiHeadAttention.backward: tape: expected a forward run with requires_grad=True first, got none");
    cross = layer.tape->cross;
    return layer.m.backward(*layer.tape, dy.view, layer.grads);
  }, writing(layer.lock));
  if (cross) return py::make_tuple(to_numpy(std::move(g.dx)), to_numpy(std::move(g.dmemory)));
  return to_numpy(std::move(g.dx));
}

py::dict mha_grads(py::object self) {
  Layer& layer = self.cast<Layer&>();
  py::dict out;
  const std::pair<const char*, Tensor*> all[] = {
      {"w_qkv", &layer.grads.w_qkv}, {"b_qkv", &layer.grads.b_qkv}, {"w_o", &layer.grads.w_o}, {"b_o", &layer.grads.b_o}};
  for (const auto& [name, t] : all)
    if (t->defined()) out[name] = view_of(*t, self, true);
  return out;
}

void def_parameter(py::class_<Layer>& cls, const char* name, const char* doc) {
  cls.def_property(
      name, [name](py::object self) { return view_of(self.cast<Layer&>().m.parameter(name), self, true); },
      [name](Layer& layer, const py::object& value) {
        MultiHeadAttention& m = layer.m;
        const int ndim = static_cast<int>(m.parameter(name).shape().size());
        const InputArray a = float_array(value, "MultiHeadAttention", name, ndim, ndim == 2 ? "[rows, cols]" : "[n]");
        locked([&] { m.set_parameter(name, a.view); }, writing(layer.lock));
      },
      doc);
}

py::dict load_safetensors(const std::string& path) {
  const SafeTensors file = SafeTensors::open(path);
  py::dict out;
  for (const auto& info : file.tensors()) {
    Tensor t = file.load(info.name);
    py::array a = to_numpy(std::move(t));
    out[py::str(info.name)] = info.shape.empty() ? a.attr("reshape")(py::tuple()) : a;
  }
  return out;
}

void save_safetensors_py(const std::string& path, const py::dict& tensors, const py::object& metadata,
                         const std::string& dtype) {
  std::vector<InputArray> keep;
  std::vector<std::pair<std::string, ConstTensorView>> views;
  for (const auto& [key, value] : tensors) {
    const std::string name = py::str(key);
    py::array arr = py::array::ensure(value);
    if (!arr) throw Error("save_safetensors: tensor '" + name + "': expected an array, got " +
                          std::string(py::str(py::type::of(value).attr("__name__"))));
    if (arr.ndim() == 0) arr = arr.attr("reshape")(1);
    keep.push_back(float_array(arr, "save_safetensors", "tensor '" + name + "'", static_cast<int>(arr.ndim()), ""));
    views.emplace_back(name, keep.back().view);
  }
  std::map<std::string, std::string> meta;
  if (!metadata.is_none())
    for (const auto& [k, v] : metadata.cast<py::dict>()) meta[py::str(k)] = py::str(v);
  const DType t = dtype == "F32" ? DType::f32 : dtype == "F16" ? DType::f16 : dtype == "BF16" ? DType::bf16
      : throw Error("save_safetensors: dtype: expected 'F32', 'F16' or 'BF16', got '" + dtype + "'");
  save_safetensors(path, views, meta, t);
}

}  // namespace

void bind_tokenizer(py::module_& m);  // bind_tokenizer.cpp
void bind_model(py::module_& m);      // bind_model.cpp
void bind_weights(py::module_& m);    // bind_weights.cpp
void bind_chat_template(py::module_& m);  // bind_chat_template.cpp
void bind_chat(py::module_& m);           // bind_chat.cpp
void bind_gguf(py::module_& m);           // bind_gguf.cpp

}  // namespace mhsa::python

PYBIND11_MODULE(_core, m) {
  using namespace mhsa;
  using namespace mhsa::python;
  m.doc() = "mhsa: multi-head self-attention on the CPU (C++ core)";
  // OMP_NUM_THREADS=100000 crashes OpenMP at the first parallel region: cap it (for the importing thread) now.
  if (const std::string warning = cpu::limit_threads(); !warning.empty())
    if (PyErr_WarnEx(PyExc_RuntimeWarning, ("mhsa: " + warning).c_str(), 1) != 0) throw py::error_already_set();
  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  static py::exception<WriteError> write_error(m, "WriteError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    // Messages may quote bytes of a hostile file: never fail to decode.
    const auto text = [](const Error& e) {
      const std::string msg = e.what();
      return py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace"));
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const WriteError& e) {  // with the errno, as an OSError would have it
      py::object exc = py::reinterpret_borrow<py::object>(write_error.ptr())(text(e));
      exc.attr("errno") = e.os_error();
      PyErr_SetObject(write_error.ptr(), exc.ptr());
    } catch (const Error& e) {
      PyErr_SetObject(error.ptr(), text(e).ptr());
    }
  });

  bind_tokenizer(m);
  bind_model(m);
  bind_weights(m);
  bind_chat_template(m);
  bind_chat(m);
  bind_gguf(m);
  bind_attention(m);
  m.def("bf16_dot_product", &mhsa::cpu::bf16_dot,
        "Whether bfloat16 work runs on AVX512_BF16's dot product here: a bfloat16 model's GEMMs over more "
        "than 8 rows (prefill, training) round their activations to bfloat16, and bfloat16 attention's "
        "forward rounds P to bfloat16. False without the instruction or with MHSA_BF16_DOT=0.");
  m.def("release_cached_memory", &mhsa::release_cached_memory,
        "Give the freed tensor memory that mhsa keeps for reuse (up to 1/8 of RAM) back to the system.");
  m.def("set_cached_memory_limit", &mhsa::set_cached_memory_limit, "bytes"_a,
        "Keep at most this many bytes of freed tensor memory for reuse (0: none); trims to it now.");
  m.def("cached_memory_bytes", &mhsa::cached_memory_bytes, "Bytes of freed tensor memory kept for reuse now.");
  m.def("load_safetensors", &load_safetensors, "path"_a,
        "Every tensor of a safetensors file (F32, F16, BF16) as float32 arrays, by name; the file is validated first.");
  m.def("save_safetensors", &save_safetensors_py, "path"_a, "tensors"_a, "metadata"_a = py::none(), "dtype"_a = "F32",
        "Writes float32 arrays (up to 4-D) as a safetensors file, atomically, stored as F32, F16 or BF16.");
  m.def(
      "sinusoidal_positional_encoding",
      [](int64_t tokens, int64_t channels) { return to_numpy(sinusoidal_positional_encoding(tokens, channels)); },
      "tokens"_a, "channels"_a, "Sinusoidal positional encoding [tokens, channels] (Vaswani et al.).");

  const auto read_cache = [](const auto& get) {
    return [get](Cache& c) { return locked([&] { return get(c.cache); }, reading(c.lock)); };
  };
  py::class_<Cache>(m, "KVCache", "Keys and values of past tokens, for MultiHeadAttention.step.")
      .def_property_readonly("length", read_cache([](const KVCache& c) { return c.length(); }))
      .def_property_readonly("capacity", read_cache([](const KVCache& c) { return c.capacity(); }))
      .def_property_readonly("batch", read_cache([](const KVCache& c) { return c.batch(); }))
      .def_property_readonly(
          "keys",
          [read_cache](py::object self) {
            return view_of(read_cache([](const KVCache& c) { return c.keys(); })(self.cast<Cache&>()), self, false);
          },
          "Read-only view [B, Hkv, length, D] of the cached keys.")
      .def_property_readonly(
          "values",
          [read_cache](py::object self) {
            return view_of(read_cache([](const KVCache& c) { return c.values(); })(self.cast<Cache&>()), self, false);
          },
          "Read-only view [B, Hkv, length, D] of the cached values.")
      .def(
          "reset", [](Cache& c) { locked([&] { c.cache.reset(); }, writing(c.lock)); },
          "Forget every token; the capacity is kept.")
      .def("__len__", read_cache([](const KVCache& c) { return c.length(); }));

  py::class_<Layer> mha(m, "MultiHeadAttention", R"(Multi-head attention in the GPT-2 weight layout.

w_qkv [C, C + 2*Ckv] (input-major: y = x @ w_qkv + b_qkv), w_o [C, C]; Ckv = num_kv_heads * head_dim.)");
  mha.def(py::init(&make_mha), "embed_dim"_a, "num_heads"_a, "num_kv_heads"_a = py::none(), "bias"_a = true,
          "seed"_a = 0)
      .def_property_readonly("embed_dim", [](const Layer& l) { return l.m.embed_dim(); })
      .def_property_readonly("num_heads", [](const Layer& l) { return l.m.num_heads(); })
      .def_property_readonly("num_kv_heads", [](const Layer& l) { return l.m.num_kv_heads(); })
      .def_property_readonly("head_dim", [](const Layer& l) { return l.m.head_dim(); })
      .def("__call__", &mha_torch_call, "query"_a, "key"_a, "value"_a, py::kw_only(), "key_padding_mask"_a = py::none(),
           "need_weights"_a = true, "attn_mask"_a = py::none(), "average_attn_weights"_a = true, "is_causal"_a = false,
           R"(torch.nn.MultiheadAttention(batch_first=True)'s call: m(query, key, value) with query [B, T, C] and
key [B, S, C] the same array as value (this layer projects keys and values from one memory; query
too for self-attention). Masks as torch's: bool True masks out, float is added; key_padding_mask
[B, S], attn_mask [T, S] or [B*num_heads, T, S]. Returns (attn_output [B, T, C], weights): the
weights averaged over heads [B, T, S], per head [B, H, T, S] with average_attn_weights=False, or
None with need_weights=False. A different value array, or the sequence-first layout
(batch_first=False), is not supported.)")
      .def("__call__", &mha_call, "x"_a, "memory"_a = py::none(), py::kw_only(), "is_causal"_a = false,
           "kv_lengths"_a = py::none(), "need_weights"_a = false, "attn_mask"_a = py::none(), "requires_grad"_a = false,
           R"(y [B, T, C] = attention of x [B, T, C] over itself, or over memory [B, S, C] (an array or the
KVCache from project_memory). kv_lengths: [B] valid tokens of x (self) or memory (cross). With
need_weights, returns (y, weights [B, H, T, S]), per head. With requires_grad, the call is recorded
for backward().)")
      .def("backward", &mha_backward, "dy"_a,
           R"(Gradients from dy [B, T, C] for the last call made with requires_grad=True: returns dx, or
(dx, dmemory) for cross-attention, and adds the parameters' gradients into `grads`.)")
      .def_property_readonly("grads", &mha_grads,
                             "Accumulated parameter gradients {'w_qkv', 'b_qkv', 'w_o', 'b_o'} (views; zero_grad() clears).")
      .def(
          "zero_grad",
          [](Layer& l) {  // in place: arrays from `grads` stay valid
            locked([&] {
              for (Tensor* t : {&l.grads.w_qkv, &l.grads.b_qkv, &l.grads.w_o, &l.grads.b_o})
                std::fill(t->data(), t->data() + t->numel(), 0.0f);
            }, writing(l.lock));
          },
          "Sets every parameter gradient to 0.")
      .def(
          "project_memory", [](Layer& self, const py::object& memory) {
            const InputArray mem = float_array(memory, "MultiHeadAttention.project_memory", "memory", 3, "[B, S, C]");
            return Cache{locked([&] { return self.m.project_memory(mem.view); }, reading(self.lock)), {}};
          },
          "memory"_a, "Keys and values of an encoder memory [B, S, C], projected once for reuse as `memory=`.")
      .def(
          "new_cache",
          [](const Layer& l, int64_t batch, int64_t max_tokens) {  // the layer's shape only: no lock
            GilReleased unlocked;  // a large cache takes a while to clear
            return Cache{l.m.new_cache(batch, max_tokens), {}};
          },
          "batch"_a, "max_tokens"_a,
           "An empty KVCache for `batch` sequences of up to `max_tokens` tokens.")
      .def(
          "step",
          [](Layer& self, const py::object& x_obj, Cache& cache) {
            const InputArray x = float_array(x_obj, "MultiHeadAttention.step", "x", 3, "[B, T, C]");
            Tensor y = locked([&] { return self.m.step(x.view, cache.cache); }, reading(self.lock), writing(cache.lock));
            return to_numpy(std::move(y));
          },
          "x"_a, "cache"_a, "Appends x [B, T, C] to the cache and attends causally over all of it; returns y [B, T, C].");
  def_parameter(mha, "w_qkv", "Fused Q|K|V projection [C, C + 2*Ckv] (a writeable view; assign to replace).");
  def_parameter(mha, "b_qkv", "Fused Q|K|V bias [C + 2*Ckv].");
  def_parameter(mha, "w_o", "Output projection [C, C].");
  def_parameter(mha, "b_o", "Output projection bias [C].");
}
