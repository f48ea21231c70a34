// mhsa/chat.h — a conversation with an instruction-tuned model: the messages, rendered through the
// model's chat template, and the KV cache that holds what the model has already read, so that a
// turn evaluates only the tokens that are new (the CLI's `mhsa chat`, and the engine a server can
// run per conversation).
//
// A turn renders the whole conversation with the generation prompt, encodes it as transformers'
// apply_chat_template(tokenize=True) does, keeps the longest common prefix of those ids and the ids
// in the cache (rewinding the cache when the template renders the history differently from what
// was generated), runs only the rest, and then samples the answer token by token, streaming its
// text through an IncrementalDecoder. It stops at an end-of-turn token (the config's and the
// tokenizer's EOS ids, and the special token the template puts after an assistant message), at
// max_new_tokens, at a stop request or when the model's context is full; the text shown becomes
// the assistant message. Not thread-safe: one conversation, one thread at a time (the Model and
// Tokenizer may be shared by many sessions). Not a scheduler: one sequence, no batching.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mhsa/model.h"
#include "mhsa/tokenizer.h"

namespace mhsa {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", or any role the template knows
  std::string content;
};

// Text of a stream of tokens, given as it becomes final: never part of a UTF-8 character (an
// unfinished one, shown by the decoder as U+FFFD or a cut byte sequence, is held back until the
// token that completes it), special tokens left out, and the pieces together equal to
// decode(ids, skip_special_tokens = true) (GPT-2's files: with invalid bytes as U+FFFD). Each
// token decodes only the tokens since the last piece given out, so a long answer costs linear
// time. Keeps a reference to the tokenizer.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  // Adds one token; returns the text that is now final (often empty).
  std::string push(int32_t id);
  // The rest, held back so far (an unfinished character as U+FFFD); call once, at the end.
  std::string finish();
  const std::string& text() const { return text_; }  // every piece given out

 private:
  std::string piece(bool final);

  const Tokenizer* tokenizer_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;  // ids_[prefix_, read_) were given out; decoding starts at prefix_
  std::string text_;
};

enum class FinishReason {
  end_of_turn,   // the model emitted an end-of-turn or end-of-sequence token
  max_tokens,    // max_new_tokens were generated
  stopped,       // the caller asked to stop (the stop flag or the text callback)
  context_full,  // the model's context is full (nothing is generated if the prompt alone fills it)
};
// "stop", "length", "cancelled", "context_full" (OpenAI's names where it has them).
const char* finish_reason_name(FinishReason reason);

struct ChatOptions {
  GenerationOptions generation;  // max_new_tokens and the sampler; stop_at_eos is not used
  std::string system;            // a system message at the start of every conversation ("": none)
  // The name of one of the tokenizer's named templates, or a Jinja chat template to use instead of
  // the tokenizer's ("": the tokenizer's); rendered as transformers' apply_chat_template(
  // chat_template=...) renders it, with all of tokenizer_config.json's special tokens as variables.
  std::string chat_template;
};

struct ChatTurn {
  std::string text;  // the assistant message added to the conversation (the text streamed)
  FinishReason finish = FinishReason::end_of_turn;
  int64_t prompt_tokens = 0;     // the rendered conversation with the generation prompt
  int64_t reused_tokens = 0;     // of those, already in the cache
  int64_t evaluated_tokens = 0;  // of those, run through the model in this turn
  int64_t generated_tokens = 0;  // the answer's tokens (an end-of-turn token not counted)
  double prefill_seconds = 0, decode_seconds = 0;
  SpeculationStats speculation;  // with ChatOptions::generation.speculation
};

// A piece of the answer's text; returning false stops the answer.
using TextCallback = std::function<bool(std::string_view)>;

class ChatSession {
 public:
  // References model and tokenizer, which must outlive the session. The tokenizer may have fewer
  // tokens than the model's vocabulary (a padded embedding: Qwen2.5's 151665 of 151936); a
  // generated id past the tokenizer's counts as a token of the answer but adds no text, as
  // transformers' decode skips it. Throws mhsa::Error for a larger tokenizer, when there
  // is no chat template (neither options.chat_template nor the tokenizer's), the template does not
  // parse, or the generation options are out of range (as Model::generate checks them).
  ChatSession(const Model& model, const Tokenizer& tokenizer, ChatOptions options = {});

  // Adds a user message and answers it. The text (valid UTF-8, else mhsa::Error and nothing
  // changes) goes into the conversation; the answer streams through on_text. `stop`, when given,
  // is read between tokens (and between chunks of the prompt): set it from another thread or a
  // signal handler to end the answer, which is kept as far as it was shown. When the prompt alone
  // fills the context, the message is taken back out and the turn returns context_full with
  // nothing generated. A template error (raise_exception) throws, the conversation unchanged.
  ChatTurn send(std::string_view user_text, const TextCallback& on_text = {}, const std::atomic<bool>* stop = nullptr);
  // Answers the conversation as it stands (after set_messages): the same turn without a new message.
  ChatTurn reply(const TextCallback& on_text = {}, const std::atomic<bool>* stop = nullptr);

  // Replaces the conversation (the system option is not added); the cache keeps what it can.
  void set_messages(std::vector<ChatMessage> messages);
  // An empty conversation (with the system message) and an empty cache.
  void reset();

  const std::vector<ChatMessage>& messages() const { return messages_; }
  // The conversation as the template renders it, and its ids.
  std::string render(bool add_generation_prompt) const;
  std::vector<int32_t> encode(bool add_generation_prompt) const;
  // The ids whose keys and values the cache holds, in order.
  std::span<const int32_t> cached_ids() const { return cached_; }
  // The tokens that end an answer.
  const std::vector<int32_t>& end_of_turn_ids() const { return stop_ids_; }

  // A conversation from JSON: an array of {"role": string, "content": string} objects, or an
  // object whose "messages" is one (other keys ignored). Throws mhsa::Error naming the message and
  // key for anything else: invalid JSON or UTF-8, nesting past the JSON bound, no messages, a
  // message without role or content, a value that is not a string.
  static std::vector<ChatMessage> parse_messages(std::string_view json);

 private:
  ChatTurn answer(const TextCallback& on_text, const std::atomic<bool>* stop, bool pop_on_full);
  void ensure_capacity(int64_t tokens);

  const Model* model_;
  const Tokenizer* tokenizer_;
  ChatOptions options_;
  std::vector<int32_t> stop_ids_;
  std::vector<ChatMessage> messages_;
  ModelCache cache_;
  std::vector<int32_t> cached_;
  uint64_t rng_;
};

}  // namespace mhsa
