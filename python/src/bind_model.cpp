// python/src/bind_model.cpp — mhsa.GPT2, mhsa.Model and mhsa.Lora: a Hugging Face directory, logits,
// generation, the training loss and gradients; both classes get the same methods from one template
// (bind_decoder). Token ids come in as any integer array (or nested sequence) [B, T] or [T]; logits
// go out as float32 NumPy arrays. The GIL is released while the model runs. A model is never
// changed from Python, so threads share it freely; a cache is locked while a call extends it
// (locks.h).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <atomic>
#include <filesystem>
#include <limits>
#include <map>

#include "arrays.h"
#include "constraint_arg.h"
#include "core/check.h"
#include "locks.h"
#include "mhsa/gpt2.h"
#include "mhsa/evaluate.h"
#include "mhsa/lora.h"
#include "mhsa/model.h"
#include "mhsa/models.h"
#include "nn/profile.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {

py::dict full_config_dict(const ModelConfig& c);  // bind_weights.cpp

namespace {

// Token ids [B, T] (a 1-D input is one sequence), checked to be integers and copied to int32.
struct Ids {
  std::vector<int32_t> data;
  int64_t B = 0, T = 0;
  bool one_sequence = false;
};

Ids token_ids(py::handle obj, std::string_view fn) {
  py::array arr = py::array::ensure(obj);
  if (!arr) throw Error(detail::message(fn, ": ids: expected an integer array [B, T] or [T], got ",
                                        std::string(py::str(py::type::of(obj).attr("__name__")))));
  const char kind = arr.dtype().kind();
  if (arr.size() > 0 && kind != 'i' && kind != 'u')
    throw Error(detail::message(fn, ": ids: expected integer token ids, got dtype ", std::string(py::str(arr.dtype()))));
  if (arr.ndim() != 1 && arr.ndim() != 2)
    throw Error(detail::message(fn, ": ids: expected an array [B, T] or [T], got ", arr.ndim(), "-D"));
  Ids ids;
  ids.one_sequence = arr.ndim() == 1;
  ids.B = ids.one_sequence ? 1 : arr.shape(0);
  ids.T = arr.shape(arr.ndim() - 1);
  auto a64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  const int64_t* p = a64.data();
  ids.data.resize(static_cast<size_t>(ids.B * ids.T));
  for (size_t i = 0; i < ids.data.size(); ++i) {
    if (p[i] < INT32_MIN || p[i] > INT32_MAX)
      throw Error(detail::message(fn, ": ids: expected token ids, got ", p[i]));
    ids.data[i] = static_cast<int32_t>(p[i]);
  }
  return ids;
}

// mhsa.GPT2Cache: a cache and its lock.
struct Cache {
  Gpt2Cache cache;
  ObjectLock lock;
};

py::dict config_dict(const Gpt2Config& c) {
  return py::dict("vocab_size"_a = c.vocab_size, "n_positions"_a = c.n_positions, "n_embd"_a = c.n_embd,
                  "n_layer"_a = c.n_layer, "n_head"_a = c.n_head, "n_inner"_a = c.mlp_dim(),
                  "layer_norm_epsilon"_a = c.layer_norm_epsilon, "eos_token_id"_a = c.eos_token_id);
}


int32_t pad_token(const Gpt2& g) { return g.config().eos_token_id; }
int32_t pad_token(const Model& g) {
  return g.config().eos_token_ids.empty() ? 0 : g.config().eos_token_ids[0];
}

// The methods GPT2 and Model share: forward, loss_and_grad, loss, new_cache, extend, generate.
template <class M>
void bind_decoder(py::class_<M>& cls, const std::string& name) {
  cls
      .def(
          "forward",
          [name](const M& g, const py::object& ids_obj) {
            const Ids ids = token_ids(ids_obj, name + ".forward");
            Tensor logits;
            {
              GilReleased unlocked;
              logits = g.forward(ids.data, ids.B, ids.T);
            }
            py::array out = to_numpy(std::move(logits));
            if (ids.one_sequence) out = out.attr("reshape")(ids.T, g.config().vocab_size);
            return out;
          },
          "ids"_a, "Logits float32 [B, T, V] of token ids [B, T] (or [T, V] of [T]).")
      .def("__call__", [](const py::object& self, const py::object& ids) { return self.attr("forward")(ids); })
      .def(
          "loss_and_grad",
          [name](const M& g, const py::object& ids_obj, const py::object& targets_obj) {
            const Ids ids = token_ids(ids_obj, name + ".loss_and_grad");
            const Ids targets = token_ids(targets_obj, name + ".loss_and_grad");
            if (targets.B != ids.B || targets.T != ids.T)
              throw Error(detail::message(name + ".loss_and_grad: targets: expected the shape of ids [", ids.B, ", ",
                                          ids.T, "], got [", targets.B, ", ", targets.T, "]"));
            std::vector<Tensor> grads = g.zero_gradients();
            double loss = 0;
            {
              GilReleased unlocked;
              loss = g.loss_and_gradients(ids.data, targets.data, ids.B, ids.T, grads);
            }
            py::dict out;
            const auto params = g.parameters();
            for (size_t i = 0; i < params.size(); ++i) out[py::str(params[i].first)] = to_numpy(std::move(grads[i]));
            return py::make_tuple(loss, out);
          },
          "ids"_a, "targets"_a,
          "Mean cross-entropy of predicting targets [B, T] (-1: ignored) from ids [B, T], and every parameter's "
          "gradient by Hugging Face name.")
      .def(
          "loss",
          [name](const M& g, const py::object& ids_obj, const py::object& targets_obj) {
            const Ids ids = token_ids(ids_obj, name + ".loss");
            const Ids targets = token_ids(targets_obj, name + ".loss");
            GilReleased unlocked;
            return g.loss(ids.data, targets.data, ids.B, ids.T);
          },
          "ids"_a, "targets"_a, "Mean cross-entropy (nats per token) of predicting targets from ids.")
      .def(
          "new_cache",
          [](const M& g, int64_t batch, int64_t max_tokens) {
            GilReleased unlocked;
            return Cache{g.new_cache(batch, max_tokens), {}};
          },
          "batch"_a, "max_tokens"_a)
      .def(
          "extend",
          [name](const M& g, Cache& cache, const py::object& ids_obj, bool last_only) {
            const Ids ids = token_ids(ids_obj, name + ".extend");
            Tensor logits = locked([&] { return g.extend(cache.cache, ids.data, ids.B, ids.T, last_only); },
                                   writing(cache.lock));
            return to_numpy(std::move(logits));
          },
          "cache"_a, "ids"_a, "last_only"_a = false,
          "Runs ids [B, n] after the cached tokens; logits [B, n, V] (or [B, 1, V] with last_only).")
      .def(
          "generate",
          [name](const M& g, const py::object& ids_obj, int64_t max_new_tokens, float temperature, int64_t top_k,
             float top_p, uint64_t seed, float repetition_penalty, bool stop_at_eos, float presence_penalty,
             float frequency_penalty, const std::map<int64_t, float>& logit_bias, int64_t draft_tokens,
             const py::object& draft_model, int64_t lookup_ngram, bool adaptive, bool return_stats,
             const py::object& json_schema, const std::optional<std::string>& grammar,
             const Tokenizer* tokenizer) -> py::object {
            const Ids ids = token_ids(ids_obj, name + ".generate");
            GenerationOptions o;
            const int32_t eos = pad_token(g);
            o.constraint = constraint_arg(json_schema, grammar, tokenizer, g.config().vocab_size, std::span(&eos, 1),
                                          name + ".generate");
            o.speculation.draft_tokens = draft_tokens;
            o.speculation.draft_model = draft_model.is_none() ? nullptr : draft_model.cast<const Model*>();
            o.speculation.ngram_max = lookup_ngram;
            o.speculation.adaptive = adaptive;
            o.presence_penalty = presence_penalty;
            o.frequency_penalty = frequency_penalty;
            for (const auto& [id, bias] : logit_bias) {  // ids checked against the vocabulary by generate
              if (id < 0 || id > std::numeric_limits<int32_t>::max())
                throw Error(name + ".generate: logit_bias: expected token ids, got " + std::to_string(id));
              o.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
            }
            o.max_new_tokens = max_new_tokens;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
            o.seed = seed;
            o.repetition_penalty = repetition_penalty;
            o.stop_at_eos = stop_at_eos;
            std::vector<std::vector<int32_t>> out;
            GenerationStats stats;
            {
              GilReleased unlocked;
              out = g.generate(ids.data, ids.B, ids.T, o, {}, &stats);
            }
            size_t longest = 0;
            for (const auto& row : out) longest = std::max(longest, row.size());
            const int64_t W = ids.T + static_cast<int64_t>(longest);
            py::array_t<int64_t> seq({ids.B, W});
            int64_t* p = seq.mutable_data();
            for (int64_t b = 0; b < ids.B; ++b) {
              const auto& row = out[static_cast<size_t>(b)];
              for (int64_t t = 0; t < W; ++t)
                p[b * W + t] = t < ids.T                            ? ids.data[static_cast<size_t>(b * ids.T + t)]
                               : t - ids.T < static_cast<int64_t>(row.size()) ? row[static_cast<size_t>(t - ids.T)]
                                                                               : pad_token(g);
            }
            py::object result = ids.one_sequence ? py::array(seq.attr("reshape")(W)) : py::array(seq);
            if (!return_stats) return result;
            const py::dict d("prefill_tokens"_a = stats.prefill_tokens, "prefill_seconds"_a = stats.prefill_seconds,
                             "decode_tokens"_a = stats.decode_tokens, "decode_seconds"_a = stats.decode_seconds,
                             "forwards"_a = stats.speculation.forwards, "drafted"_a = stats.speculation.drafted,
                             "accepted"_a = stats.speculation.accepted);
            return py::make_tuple(result, d);
          },
          "ids"_a, "max_new_tokens"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = 0,
          "repetition_penalty"_a = 1.0f, "stop_at_eos"_a = true, "presence_penalty"_a = 0.0f,
          "frequency_penalty"_a = 0.0f, "logit_bias"_a = std::map<int64_t, float>{}, "draft_tokens"_a = 0,
          "draft_model"_a = py::none(), "lookup_ngram"_a = 4, "adaptive"_a = true, "return_stats"_a = false,
          "json_schema"_a = py::none(), "grammar"_a = py::none(), "tokenizer"_a = py::none(),
          R"(Prompt + continuation, int64 [B, T + n] (like Hugging Face's generate): greedy at temperature 0,
otherwise sampled (top_k, top_p, seeded). Sequences that end early are padded with eos.
presence_penalty, frequency_penalty and logit_bias ({token id: bias}) as OpenAI defines them: a
token's logit plus its bias, minus frequency_penalty per time it was generated and presence_penalty
once it was (the prompt not counted).
Speculative decoding (one sequence): draft_tokens > 0 guesses up to that many tokens a step and checks
them in one forward (greedy output unchanged bit for bit; sampled output keeps its distribution),
from the text's own repeats (prompt lookup, n-grams up to lookup_ngram long) or from draft_model, a
Model with the same vocabulary; adaptive: each step checks only as many guesses as pay, from the guesses
kept so far and the measured cost of a forward's rows (False: always draft_tokens). return_stats: also a dict of prefill/decode tokens and seconds,
forwards, drafted and accepted guesses.
Constrained decoding: json_schema (a dict or JSON text; docs/structured-output.md says which keywords)
or grammar (GBNF text, start rule root) with tokenizer, the model's mhsa.Tokenizer: every token is
drawn among those that keep the text a prefix of the grammar's, and once it is complete only EOS.)");
}

}  // namespace

namespace {

// mhsa.profile's two halves (python/mhsa/__init__.py): the switch is process-wide, so it stays on
// while any thread's profile is open; the totals are the calling thread's.
std::atomic<int>& open_profiles() {
  static std::atomic<int> open{0};
  return open;
}

void bind_profile(py::module_& m) {
  m.def("_profile_begin", [] {
    if (open_profiles().fetch_add(1) == 0) nn::profile::set_enabled(true);
    (void)nn::profile::take();  // this thread's totals from zero
  });
  m.def("_profile_end", [] {
    const nn::profile::Totals t = nn::profile::take();
    if (open_profiles().fetch_sub(1) == 1) nn::profile::set_enabled(false);
    py::dict seconds, calls;
    for (int i = 0; i < nn::profile::kPhases; ++i) {
      const char* name = nn::profile::phase_name(static_cast<nn::profile::Phase>(i));
      seconds[name] = t.seconds[static_cast<size_t>(i)];
      calls[name] = t.calls[static_cast<size_t>(i)];
    }
    return py::make_tuple(seconds, calls);
  });
}

// mhsa.Lora: an adapter and its lock (set() changes it; the other calls read it).
struct LoraObject {
  Lora lora;
  ObjectLock lock;
};

// ids and targets of the same shape, for Lora's calls.
std::pair<Ids, Ids> ids_and_targets(const py::object& ids_obj, const py::object& targets_obj, const std::string& fn) {
  Ids ids = token_ids(ids_obj, fn), targets = token_ids(targets_obj, fn);
  if (targets.B != ids.B || targets.T != ids.T)
    throw Error(detail::message(fn, ": targets: expected the shape of ids [", ids.B, ", ", ids.T, "], got [",
                                targets.B, ", ", targets.T, "]"));
  return {std::move(ids), std::move(targets)};
}

void bind_lora(py::module_& m) {
  py::class_<LoraObject>(m, "Lora", R"(A LoRA adapter on a frozen mhsa.Model, as peft makes them (see mhsa/lora.h):
for each targeted layer W [out, in], A [r, in] and B [out, r], and y = x W^T + (alpha / r) (x A^T) B^T.

Lora.create(model, rank=8, alpha=0 (2 rank), targets=["q", "k", "v", "o", "gate", "up", "down"], seed=0)
initialises as peft does (A uniform in +-1/sqrt(in), B zero); Lora.load(dir, model) reads peft's
adapter_config.json + adapter_model.safetensors; save(dir) writes them.)")
      .def_static(
          "create",
          [](const Model& base, int64_t rank, double alpha, std::vector<std::string> targets, uint64_t seed) {
            LoraOptions o;
            o.rank = rank;
            o.alpha = alpha;
            o.targets = std::move(targets);
            return LoraObject{Lora::create(base, o, seed), {}};
          },
          "model"_a, "rank"_a = 8, "alpha"_a = 0.0,
          "targets"_a = std::vector<std::string>{"q", "k", "v", "o", "gate", "up", "down"}, "seed"_a = 0)
      .def_static(
          "load", [](const std::filesystem::path& dir, const Model& base) { return LoraObject{Lora::load(dir, base), {}}; },
          "dir"_a, "model"_a)
      .def(
          "save",
          [](LoraObject& l, const std::filesystem::path& dir, const std::string& base_model) {
            const Held held(reading(l.lock));
            GilReleased unlocked;
            l.lora.save(dir, base_model);
          },
          "dir"_a, "base_model"_a = "", "Writes adapter_config.json and adapter_model.safetensors (peft's format).")
      .def_property_readonly("rank", [](const LoraObject& l) { return l.lora.options().rank; })
      .def_property_readonly("scale", [](const LoraObject& l) { return l.lora.options().scale(); })
      .def(
          "parameters",
          [](LoraObject& l) {
            const Held held(reading(l.lock));
            py::dict out;
            for (const auto& [name, t] : std::as_const(l.lora).parameters()) out[py::str(name)] = to_numpy(Tensor(*t));
            return out;
          },
          "A and B of every adapter by peft's name (copies).")
      .def(
          "set",
          [](LoraObject& l, const std::string& name, const py::object& value) {
            Tensor given = contiguous(float_array(value, "Lora.set", "value", 2, "[rows, cols]").view);
            const Held held(writing(l.lock));
            for (const auto& [n, t] : l.lora.parameters())
              if (n == name) {
                if (given.shape() != t->shape())
                  throw Error(detail::message("Lora.set: value: expected the shape of ", name, ", got another shape"));
                *t = std::move(given);
                return;
              }
            throw Error(detail::message("Lora.set: name: expected a parameter of this adapter, got '", name, "'"));
          },
          "name"_a, "value"_a, "Sets one of parameters() to a float32 array of its shape.")
      .def(
          "forward",
          [](LoraObject& l, const Model& base, const py::object& ids_obj) {
            const Ids ids = token_ids(ids_obj, "Lora.forward");
            Tensor logits;
            {
              const Held held(reading(l.lock));
              GilReleased unlocked;
              logits = l.lora.forward(base, ids.data, ids.B, ids.T);
            }
            py::array out = to_numpy(std::move(logits));
            if (ids.one_sequence) out = out.attr("reshape")(ids.T, base.config().vocab_size);
            return out;
          },
          "model"_a, "ids"_a, "Logits float32 [B, T, V] of the model with this adapter.")
      .def(
          "loss",
          [](LoraObject& l, const Model& base, const py::object& ids_obj, const py::object& targets_obj) {
            const auto [ids, targets] = ids_and_targets(ids_obj, targets_obj, "Lora.loss");
            const Held held(reading(l.lock));
            GilReleased unlocked;
            return l.lora.loss(base, ids.data, targets.data, ids.B, ids.T);
          },
          "model"_a, "ids"_a, "targets"_a)
      .def(
          "loss_and_grad",
          [](LoraObject& l, const Model& base, const py::object& ids_obj, const py::object& targets_obj) {
            const auto [ids, targets] = ids_and_targets(ids_obj, targets_obj, "Lora.loss_and_grad");
            const Held held(reading(l.lock));
            std::vector<Tensor> grads = l.lora.zero_gradients();
            double loss = 0;
            {
              GilReleased unlocked;
              loss = l.lora.loss_and_gradients(base, ids.data, targets.data, ids.B, ids.T, grads);
            }
            py::dict out;
            const auto params = std::as_const(l.lora).parameters();
            for (size_t i = 0; i < params.size(); ++i) out[py::str(params[i].first)] = to_numpy(std::move(grads[i]));
            return py::make_tuple(loss, out);
          },
          "model"_a, "ids"_a, "targets"_a,
          "Mean cross-entropy of targets [B, T] (-1: ignored) given ids, and the gradients of A and B by peft's name "
          "(the model's weights are frozen).");
}

}  // namespace

void bind_model(py::module_& m) {
  bind_profile(m);
  m.def(
      "named_models",
      [] {
        py::list out;
        for (const NamedModel& n : named_models())
          out.append(py::dict("name"_a = n.name, "description"_a = n.description, "path"_a = n.path,
                              "sha256"_a = n.sha256, "dtype"_a = n.dtype));
        return out;
      },
      "The models mhsa knows by name (mhsa/models.h), the default first: name, description, path (in a models "
      "directory), sha256, dtype.");
  m.def(
      "resolve_model",
      [](const std::string& name) {
        const ResolvedModel r = resolve_model(name, "resolve_model: name");
        return r.path;
      },
      "name"_a = "",
      "Where a model name (or \"\": the default) is: its checked file or directory; any other string is returned as a path.");
  const auto read_cache = [](int64_t (Gpt2Cache::*get)() const) {
    return [get](Cache& c) { return locked([&] { return (c.cache.*get)(); }, reading(c.lock)); };
  };
  py::class_<Cache>(m, "GPT2Cache", "Keys and values of every layer for a batch of sequences.")
      .def_property_readonly("batch", read_cache(&Gpt2Cache::batch))
      .def_property_readonly("length", read_cache(&Gpt2Cache::length))
      .def_property_readonly("capacity", read_cache(&Gpt2Cache::capacity))
      .def("reset", [](Cache& c) { locked([&] { c.cache.reset(); }, writing(c.lock)); });

  py::class_<Gpt2> gpt2(m, "GPT2", R"(GPT-2 on mhsa's attention (float32).

GPT2.load(dir) reads a Hugging Face directory: config.json and model.safetensors.)");
  gpt2
      .def_static(
          "load", [](const std::filesystem::path& dir) {
            GilReleased unlocked;
            return Gpt2::load(dir);
          },
          "path"_a, "Loads config.json + model.safetensors from a directory.")
      .def_static(
          "random",
          [](int64_t vocab_size, int64_t n_positions, int64_t n_embd, int64_t n_layer, int64_t n_head, uint64_t seed) {
            Gpt2Config c;
            c.vocab_size = vocab_size;
            c.n_positions = n_positions;
            c.n_embd = n_embd;
            c.n_layer = n_layer;
            c.n_head = n_head;
            c.eos_token_id = vocab_size > 50256 ? 50256 : -1;
            GilReleased unlocked;
            return Gpt2::random(c, seed);
          },
          "vocab_size"_a = 50257, "n_positions"_a = 1024, "n_embd"_a = 768, "n_layer"_a = 12, "n_head"_a = 12,
          "seed"_a = 0, "Random weights of the given shape (GPT-2 small by default), for benchmarks.")
      .def_property_readonly("config", [](const Gpt2& g) { return config_dict(g.config()); });
  bind_decoder(gpt2, "GPT2");

  py::class_<Model> model(m, "Model", R"(A decoder-only language model of any family mhsa knows (float32, or bfloat16, Q8_0 or Q4_K weights): GPT-2, Llama, Mistral,
Qwen2, Qwen3, Gemma 2.

Model.load(dir) reads a Hugging Face directory: config.json and model.safetensors (or its shards), or a
GGUF file; Model.load() the default model (SmolLM2-135M-Instruct, fetched by scripts/setup.sh), and
Model.load("kjv") the byte-level model mhsa trained itself (mhsa.named_models()).)");
  model
      .def_static(
          "load",
          [](const std::optional<std::filesystem::path>& path, const std::optional<std::string>& dtype,
             const std::string& kv_dtype) {
            const ResolvedModel r = resolve_model(path ? path->string() : "", "Model.load: path");
            const std::string type = dtype ? *dtype : r.dtype.empty() ? "f32" : r.dtype;
            const WeightType wt = parse_weight_type(type, "Model.load: dtype");
            const KVTypes kv = parse_kv_types(kv_dtype, "Model.load: kv_dtype");
            GilReleased unlocked;
            Model model = Model::load(r.path, wt);
            model.set_kv_type(kv);
            return model;
          },
          "path"_a = py::none(), "dtype"_a = py::none(), "kv_dtype"_a = "f32",
          "Loads a model directory (config.json + the safetensors weights), a GGUF file, or a named model "
          "(\"smollm2\", the default when path is None; \"kjv\"). dtype None: the named model's own type "
          "(smollm2: see mhsa.named_models()), else \"f32\". dtype \"bf16\" keeps the weight matrices "
          "(linear layers, embedding, output) as bfloat16, rounded to nearest-even: about half the bytes per "
          "decoded token; dtype \"f16\" keeps them as IEEE float16 (an F16 checkpoint exactly as stored; a weight "
          "beyond float16's range of 65504 is refused): the same bytes; dtype \"q8_0\" quantises them to GGUF's Q8_0 blocks (32 int8 weights and an f16 scale; "
          "a matrix whose rows are not a multiple of 32 stays float32): about a quarter; dtype \"q4_k\" to GGUF's "
          "Q4_K blocks (256 4-bit weights with 6-bit scales and mins per 32; the output matrix, and rows not a "
          "multiple of 256, Q8_0): about an eighth. All inference only (loss_and_grad refuses). kv_dtype \"bf16\" "
          "or \"f16\": the KV caches the model makes (new_cache, generate, ChatSession) hold 16-bit keys and "
          "values, rounded once to nearest-even: half the cache's memory; \"q8_0\": GGUF Q8_0 blocks of 32 along "
          "the head dimension (head size a multiple of 32): 17/64 of it; \"KEY/VALUE\" (\"q8_0/f16\") sets keys "
          "and values apart. Attention still computes in float32.")
      .def_static(
          "random",
          [](const py::dict& config, uint64_t seed, const std::string& kv_dtype) {
            const std::string text = py::module_::import("json").attr("dumps")(config).cast<std::string>();
            const ModelConfig c = ModelConfig::parse(text, "config");
            const KVTypes kv = parse_kv_types(kv_dtype, "Model.random: kv_dtype");
            GilReleased unlocked;
            Model model = Model::random(c, seed);
            model.set_kv_type(kv);
            return model;
          },
          "config"_a, "seed"_a = 0, "kv_dtype"_a = "f32",
          R"(Random weights (normal, std 0.02; norm weights 1, biases 0) for a Hugging Face config.json given as a dict,
e.g. {"model_type": "llama", "hidden_size": 576, ...}: the keys and defaults of that family's
config class, checked as Model.load checks config.json. For benchmarks and tests.)")
      .def(
          "perplexity",
          [](const Model& g, const py::object& ids_obj, int64_t context, int64_t chunks, int32_t bos) {
            const Ids ids = token_ids(ids_obj, "Model.perplexity");
            PerplexityOptions o;
            o.context = context;
            o.max_chunks = chunks;
            o.bos = bos;
            PerplexityResult r;
            {
              GilReleased unlocked;
              r = perplexity(g, ids.data, o);
            }
            return py::dict("ppl"_a = r.ppl, "ppl_error"_a = r.ppl_error, "nll_mean"_a = r.nll_mean,
                            "chunks"_a = r.chunks, "context"_a = r.context, "scored_tokens"_a = r.scored_tokens,
                            "running"_a = r.running);
          },
          "ids"_a, "context"_a = 512, "chunks"_a = 0, "bos"_a = -1,
          "Perplexity of a tokenized text as llama.cpp's llama-perplexity computes it: ids cut into chunks of "
          "`context` tokens (at most `chunks`; 0: all), each run alone, the tokens of each chunk's second half "
          "scored (token j+1 from the logits at j, context/2 <= j < context-1), exp of the mean negative "
          "log-likelihood. bos >= 0 replaces each chunk's first token (as llama-perplexity does for a model "
          "that adds BOS; then put BOS before the text's ids too). Returns a dict: ppl, ppl_error (its standard "
          "error), nll_mean, chunks, context, scored_tokens, running (the estimate after each chunk).")
      .def(
          "token_logprobs",
          [](const Model& g, const py::object& ids_obj) {
            const Ids ids = token_ids(ids_obj, "Model.token_logprobs");
            if (!ids.one_sequence) throw Error("Model.token_logprobs: ids: expected one sequence [T], got a batch");
            std::vector<TokenScore> scores;
            {
              GilReleased unlocked;
              scores = score_tokens(g, ids.data);
            }
            py::array_t<double> out(static_cast<py::ssize_t>(scores.size()));
            for (size_t i = 0; i < scores.size(); ++i) out.mutable_at(static_cast<py::ssize_t>(i)) = scores[i].logprob;
            return out;
          },
          "ids"_a,
          "float64 [T]: log p(ids[t] | ids[:t]) for each token (NaN for the first, which nothing precedes), from "
          "the logits of one pass over the sequence.")
      .def_property_readonly("config", [](const Model& g) { return full_config_dict(g.config()); },
                             "Every ModelConfig field, by its C++ name (as mhsa.read_model_config gives them).")
      .def_property_readonly("family", [](const Model& g) { return std::string(family_name(g.family())); })
      .def_property_readonly("dtype", [](const Model& g) { return std::string(weight_type_name(g.weight_type())); },
                             "How the weight matrices are kept: \"f32\", \"bf16\", \"f16\", \"q8_0\" or \"q4_k\".")
      .def_property_readonly("kv_dtype", [](const Model& g) { return std::string(kv_type_name(g.kv_type())); },
                             "The element types of the KV caches the model makes: \"f32\", \"bf16\", \"f16\", \"q8_0\", "
                             "or \"KEY/VALUE\" when keys and values differ (\"q8_0/f16\").")
      .def_property_readonly(
          "parameter_names",
          [](const Model& g) {
            std::vector<std::string> names;
            for (const auto& [n, t] : g.parameters()) names.push_back(n);
            return names;
          },
          "Every parameter's Hugging Face name, in the order of loss_and_grad's gradients.");
  bind_decoder(model, "Model");
  bind_lora(m);
}

}  // namespace mhsa::python
