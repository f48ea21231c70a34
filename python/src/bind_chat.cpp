// python/src/bind_chat.cpp — mhsa.ChatSession: a conversation with an instruction-tuned Model
// through its tokenizer's chat template, the history kept in the KV cache so that a turn
// evaluates only its new tokens (mhsa/chat.h). The GIL is released while the model runs and taken
// back for each piece of streamed text given to on_text. Not a server: one conversation, one call
// at a time (a second call while an answer runs, from another thread or from on_text, raises
// mhsa.Error rather than waiting).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "constraint_arg.h"
#include "mhsa/chat.h"
#include "mhsa/error.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

struct Chat {
  ChatSession session;
  ChatTurn last;
  std::unique_ptr<std::atomic<bool>> busy = std::make_unique<std::atomic<bool>>(false);
};

// Marks the session busy for the length of a call; a call that finds it busy raises.
class Busy {
 public:
  Busy(Chat& c, const char* fn) : flag_(*c.busy) {
    if (flag_.exchange(true))
      throw Error(std::string(fn) + ": expected a session that is not answering, got one in the middle of an answer");
  }
  ~Busy() { flag_.store(false); }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  std::atomic<bool>& flag_;
};

py::dict turn_dict(const ChatTurn& t) {
  return py::dict("finish_reason"_a = finish_reason_name(t.finish), "prompt_tokens"_a = t.prompt_tokens,
                  "reused_tokens"_a = t.reused_tokens, "evaluated_tokens"_a = t.evaluated_tokens,
                  "generated_tokens"_a = t.generated_tokens, "prefill_seconds"_a = t.prefill_seconds,
                  "decode_seconds"_a = t.decode_seconds, "forwards"_a = t.speculation.forwards,
                  "drafted"_a = t.speculation.drafted, "accepted"_a = t.speculation.accepted);
}

std::string send(Chat& c, const std::string& text, const py::object& on_text) {
  const Busy busy(c, "ChatSession.send");
  // An exception raised by on_text (KeyboardInterrupt from Ctrl-C included) ends the answer where
  // it is, which stays in the conversation, and is raised again once the session is consistent.
  std::optional<py::error_already_set> raised;
  const TextCallback cb = [&](std::string_view piece) {
    py::gil_scoped_acquire gil;
    if (raised) return false;  // the rest of an answer already ended
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C with no on_text too
      if (!on_text.is_none()) on_text(py::str(piece.data(), piece.size()));
      return true;
    } catch (py::error_already_set& e) {
      raised.emplace(std::move(e));
      return false;
    }
  };
  {
    GilReleased unlocked;
    c.last = c.session.send(text, cb);
  }
  if (raised) throw std::move(*raised);
  return c.last.text;
}

}  // namespace

void bind_chat(py::module_& m) {
  py::class_<Chat>(m, "ChatSession", R"(A conversation with an instruction-tuned mhsa.Model through its chat template.

ChatSession(model, tokenizer, system=None, max_new_tokens=512, temperature=0, top_k=0, top_p=1, seed=0,
repetition_penalty=1, chat_template=None, draft_tokens=0, draft_model=None, lookup_ngram=4, adaptive=True,
json_schema=None, grammar=None): the sampler's, speculative decoding's and constrained decoding's options as
Model.generate's (every answer then follows the schema or grammar); system: a system
message at the start of every conversation; chat_template: the name of one of the tokenizer's templates
or a Jinja template to use instead of its own. Each send() renders the whole conversation as
transformers' apply_chat_template(add_generation_prompt=True, tokenize=True) and runs only the tokens
the KV cache does not hold yet. One call at a time per session.)")
      .def(py::init([](const Model& model, const Tokenizer& tokenizer, const std::optional<std::string>& system,
                       int64_t max_new_tokens, float temperature, int64_t top_k, float top_p, uint64_t seed,
                       float repetition_penalty, const std::optional<std::string>& chat_template,
                       int64_t draft_tokens, const py::object& draft_model, int64_t lookup_ngram, bool adaptive,
                       const py::object& json_schema, const std::optional<std::string>& grammar) {
             ChatOptions o;
             o.generation.constraint = constraint_arg(json_schema, grammar, &tokenizer, model.config().vocab_size,
                                                      model.config().eos_token_ids, "ChatSession");
             o.generation.speculation.draft_tokens = draft_tokens;
             o.generation.speculation.draft_model = draft_model.is_none() ? nullptr : draft_model.cast<const Model*>();
             o.generation.speculation.ngram_max = lookup_ngram;
             o.generation.speculation.adaptive = adaptive;
             o.generation.max_new_tokens = max_new_tokens;
             o.generation.temperature = temperature;
             o.generation.top_k = top_k;
             o.generation.top_p = top_p;
             o.generation.seed = seed;
             o.generation.repetition_penalty = repetition_penalty;
             o.system = system.value_or("");
             o.chat_template = chat_template.value_or("");
             return Chat{ChatSession(model, tokenizer, std::move(o)), {}};
           }),
           "model"_a, "tokenizer"_a, "system"_a = py::none(), "max_new_tokens"_a = 512, "temperature"_a = 0.0f,
           "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = 0, "repetition_penalty"_a = 1.0f,
           "chat_template"_a = py::none(), "draft_tokens"_a = 0, "draft_model"_a = py::none(),
           "lookup_ngram"_a = 4, "adaptive"_a = true, "json_schema"_a = py::none(), "grammar"_a = py::none(),
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::keep_alive<1, 13>())
      .def("send", &send, "text"_a, "on_text"_a = py::none(),
           R"(Adds a user message and returns the assistant's answer (also added to the conversation).
on_text(piece) is called with each piece of text as it is made. An exception in on_text (or Ctrl-C)
ends the answer where it is, keeps it in the conversation (finish_reason "cancelled") and is raised.)")
      .def(
          "reset",
          [](Chat& c) {
            const Busy busy(c, "ChatSession.reset");
            c.session.reset();
            c.last = ChatTurn{};
          },
          "An empty conversation (with the system message) and an empty cache.")
      .def_property_readonly(
          "messages",
          [](Chat& c) {
            const Busy busy(c, "ChatSession.messages");
            py::list out;
            for (const ChatMessage& msg : c.session.messages())
              out.append(py::dict("role"_a = msg.role, "content"_a = msg.content));
            return out;
          },
          "The conversation: a list of {\"role\", \"content\"} dicts (a copy).")
      .def_property_readonly(
          "cached_ids",
          [](Chat& c) {
            const Busy busy(c, "ChatSession.cached_ids");
            const auto ids = c.session.cached_ids();
            return std::vector<int32_t>(ids.begin(), ids.end());
          },
          "The token ids whose keys and values the KV cache holds, in order.")
      .def_property_readonly(
          "cached_tokens",
          [](Chat& c) {
            const Busy busy(c, "ChatSession.cached_tokens");
            return c.session.cached_ids().size();
          },
          "len(cached_ids).")
      .def_property_readonly(
          "finish_reason",
          [](Chat& c) -> py::object {
            const Busy busy(c, "ChatSession.finish_reason");
            if (c.last.prompt_tokens == 0) return py::none();
            return py::str(finish_reason_name(c.last.finish));
          },
          "Why the last answer ended: \"stop\", \"length\", \"cancelled\" or \"context_full\" (None before one).")
      .def_property_readonly(
          "last_turn",
          [](Chat& c) -> py::object {
            const Busy busy(c, "ChatSession.last_turn");
            if (c.last.prompt_tokens == 0) return py::none();
            return turn_dict(c.last);
          },
          "The last turn's numbers: finish_reason, prompt_tokens, reused_tokens (from the cache), "
          "evaluated_tokens, generated_tokens, prefill_seconds, decode_seconds (None before one).");
}

}  // namespace mhsa::python
