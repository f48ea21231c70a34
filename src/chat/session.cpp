// chat/session.cpp — ChatSession and IncrementalDecoder (see mhsa/chat.h).
#include "mhsa/chat.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json.h"
#include "mhsa/chat_template.h"
#include "mhsa/grammar.h"
#include "model/access.h"
#include "model/decoder.h"
#include "model/speculative.h"
#include "text/hf_tokenizer.h"
#include "text/unicode_data.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;
using json = nlohmann::json;

constexpr int64_t kPrefillChunk = 512;  // prompt tokens run between two looks at the stop flag
constexpr int64_t kFirstCapacity = 256;

// The offset of the first byte that is not part of valid UTF-8, or npos.
size_t invalid_utf8_at(std::string_view s) {
  const std::string lossy = text::lossy_utf8(s);
  if (lossy == s) return std::string_view::npos;
  return static_cast<size_t>(std::mismatch(s.begin(), s.end(), lossy.begin(), lossy.end()).first - s.begin());
}

// Text a decoder may still change: a cut character, or U+FFFD, which a byte-fallback or
// byte-level decoder writes for a character whose remaining bytes are still to come.
bool unfinished(std::string_view s) { return text::incomplete_utf8_tail(s) > 0 || s.ends_with("\xEF\xBF\xBD"); }

std::string messages_json(const std::vector<ChatMessage>& messages) {
  json a = json::array();
  for (const ChatMessage& m : messages) a.push_back({{"role", m.role}, {"content", m.content}});
  return a.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

// ---- IncrementalDecoder ----------------------------------------------------------------------

std::string IncrementalDecoder::piece(bool final) {
  const std::span<const int32_t> ids(ids_);
  // Both decodings start at the same token, so whatever a decoder does at the start of a text
  // (Metaspace's stripped space) is the same in both and the difference is the new text...
  const std::string before = tokenizer_->decode(ids.subspan(prefix_, read_ - prefix_), true);
  std::string added = tokenizer_->decode(ids.subspan(prefix_), true);
  if (added.starts_with(before))
    added.erase(0, before.size());
  else  // ...unless the decoder joined tokens across the cut (a character given out, then fallback bytes
    added = tokenizer_->decode(ids.subspan(read_), true);  // that make the run invalid): the new ones alone
  if (added.empty() || (!final && unfinished(added))) return {};
  std::string out = text::lossy_utf8(added);
  prefix_ = read_;
  read_ = ids_.size();
  text_ += out;
  return out;
}

std::string IncrementalDecoder::push(int32_t id) {
  if (tokenizer_->is_special(id)) return {};
  (void)tokenizer_->token_bytes(id);  // throws for an id out of range, before it is kept
  ids_.push_back(id);
  return piece(false);
}

std::string IncrementalDecoder::finish() { return piece(true); }

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::end_of_turn: return "stop";
    case FinishReason::max_tokens: return "length";
    case FinishReason::stopped: return "cancelled";
    case FinishReason::context_full: return "context_full";
  }
  return "?";
}

// ---- ChatSession -----------------------------------------------------------------------------

ChatSession::ChatSession(const Model& model, const Tokenizer& tokenizer, ChatOptions options)
    : model_(&model), tokenizer_(&tokenizer), options_(std::move(options)) {
  constexpr std::string_view fn = "ChatSession";
  const GenerationOptions& o = options_.generation;
  if (o.max_new_tokens < 0) fail(fn, "max_new_tokens", "a count >= 0", std::to_string(o.max_new_tokens));
  detail::check_sampling(fn, o, model.config().vocab_size);
  detail::check_speculation(fn, o.speculation, model.config().vocab_size);
  if (tokenizer.vocab_size() > model.config().vocab_size)  // a padded embedding may have more rows
    fail(fn, "tokenizer", message("a tokenizer of at most the model's ", model.config().vocab_size, " tokens"),
         message(tokenizer.vocab_size(), " tokens"));
  if (invalid_utf8_at(options_.system) != std::string_view::npos)
    fail(fn, "system", "UTF-8 text", "invalid UTF-8");
  if (!options_.chat_template.empty())
    (void)ChatTemplate(options_.chat_template);  // a template that does not parse fails here, not at a turn
  else if (tokenizer.chat_template().empty())
    fail(fn, "tokenizer",
         "a chat template (chat_template in tokenizer_config.json, or chat_template.jinja) or options.chat_template",
         "none");

  // The answer ends at an end-of-sequence token, or at the special token the template writes right
  // after an assistant message (<|im_end|>, <|eot_id|>, <end_of_turn>, ...), found by rendering one.
  stop_ids_ = model.config().eos_token_ids;
  for (int32_t id : tokenizer.eos_ids()) stop_ids_.push_back(id);
  const std::string answer = "mhsa probe answer";
  try {
    messages_ = {{"user", "mhsa probe question"}, {"assistant", answer}};
    const std::string text = render(false);
    if (size_t at = text.find(answer); at != std::string::npos) {
      at = text.find_first_not_of(" \t\r\n", at + answer.size());
      if (at != std::string::npos) {
        const std::vector<int32_t> after =
            tokenizer.encode(std::string_view(text).substr(at), EncodeOptions{false, true});
        if (!after.empty() && tokenizer.is_special(after[0])) stop_ids_.push_back(after[0]);
      }
    }
  } catch (const Error&) {  // a template that wants other messages (a system one first, ...)
  }
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  // A constraint ends its text with an end token: this session's end-of-turn tokens must be among
  // its vocabulary's, else the answer could never end where the grammar is complete.
  if (const std::shared_ptr<const Constraint>& c = options_.generation.constraint) {
    const std::span<const int32_t> ends = c->vocabulary().end_ids();
    if (!std::all_of(stop_ids_.begin(), stop_ids_.end(),
                     [&](int32_t id) { return std::find(ends.begin(), ends.end(), id) != ends.end(); }))
      options_.generation.constraint = std::make_shared<const Constraint>(
          c->grammar(), TokenVocabulary::from_tokenizer(tokenizer, model.config().vocab_size, stop_ids_));
  }
  reset();
}

void ChatSession::reset() {
  messages_.clear();
  if (!options_.system.empty()) messages_.push_back({"system", options_.system});
  cache_.reset();
  cached_.clear();
  rng_ = options_.generation.seed * 0x2545F4914F6CDD1Dull;  // Model::generate's first sequence
}

void ChatSession::set_messages(std::vector<ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i)
    for (const auto* s : {&messages[i].role, &messages[i].content})
      if (invalid_utf8_at(*s) != std::string_view::npos)
        fail("ChatSession::set_messages", message("messages[", i, "]"), "UTF-8 text", "invalid UTF-8");
  messages_ = std::move(messages);
}

std::string ChatSession::render(bool add_generation_prompt) const {
  ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.chat_template = options_.chat_template;  // "": the tokenizer's
  return tokenizer_->apply_chat_template(messages_json(messages_), o);
}

std::vector<int32_t> ChatSession::encode(bool add_generation_prompt) const {
  // transformers' apply_chat_template(tokenize=True): special tokens' text matched, none added.
  return tokenizer_->encode(render(add_generation_prompt), EncodeOptions{false, true});
}

ChatTurn ChatSession::send(std::string_view user_text, const TextCallback& on_text, const std::atomic<bool>* stop) {
  if (const size_t at = invalid_utf8_at(user_text); at != std::string_view::npos)
    fail("ChatSession::send", "user_text", "UTF-8 text", message("an invalid byte at offset ", at));
  messages_.push_back({"user", std::string(user_text)});
  try {
    return answer(on_text, stop, true);
  } catch (...) {
    if (!messages_.empty() && messages_.back().role == "user") messages_.pop_back();  // not answered
    throw;
  }
}

ChatTurn ChatSession::reply(const TextCallback& on_text, const std::atomic<bool>* stop) {
  return answer(on_text, stop, false);
}

void ChatSession::ensure_capacity(int64_t tokens) {
  if (cache_.capacity() >= tokens) return;
  const int64_t context = model_->config().max_positions;
  const int64_t capacity = std::min(context, std::max({tokens, 2 * cache_.capacity(), kFirstCapacity}));
  ModelCache grown = model_->new_cache(1, capacity);
  if (cache_.length() > 0) {
    std::vector<KVCache>& from = ModelAccess::layers(cache_);
    std::vector<KVCache>& to = ModelAccess::layers(grown);
    for (size_t l = 0; l < from.size(); ++l) to[l].append(from[l]);
  }
  cache_ = std::move(grown);
}

ChatTurn ChatSession::answer(const TextCallback& on_text, const std::atomic<bool>* stop, bool pop_on_full) {
  using clock = std::chrono::steady_clock;
  const auto stopped = [&] { return stop && stop->load(std::memory_order_relaxed); };
  const GenerationOptions& o = options_.generation;
  const int64_t context = model_->config().max_positions, V = model_->config().vocab_size;
  ChatTurn turn;
  std::vector<int32_t> ids = encode(true);
  if (ids.empty()) fail("ChatSession", "chat template", "a non-empty prompt", "an empty rendering");
  turn.prompt_tokens = static_cast<int64_t>(ids.size());
  if (turn.prompt_tokens >= context) {  // no room for even one token of answer
    if (pop_on_full) messages_.pop_back();
    turn.finish = FinishReason::context_full;
    return turn;
  }
  // Keep the longest common prefix, and at least one token to run: its logits start the answer.
  size_t keep = static_cast<size_t>(std::mismatch(ids.begin(), ids.end(), cached_.begin(), cached_.end()).first - ids.begin());
  keep = std::min(keep, ids.size() - 1);
  IncrementalDecoder decoder(*tokenizer_);
  try {
    cache_.truncate(static_cast<int64_t>(std::min(keep, cached_.size())));
    cached_.resize(keep);
    turn.reused_tokens = static_cast<int64_t>(keep);
    ensure_capacity(turn.prompt_tokens);
    auto t0 = clock::now();
    Tensor logits;
    for (size_t at = keep; at < ids.size() && !stopped();) {
      const size_t n = std::min<size_t>(kPrefillChunk, ids.size() - at);
      logits = model_->extend(cache_, std::span(ids).subspan(at, n), 1, static_cast<int64_t>(n), true);
      cached_.insert(cached_.end(), ids.begin() + static_cast<std::ptrdiff_t>(at),
                     ids.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
      turn.evaluated_tokens += static_cast<int64_t>(n);
    }
    turn.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    t0 = clock::now();
    std::vector<int32_t> history = ids;  // what the penalties look at (the answer's tokens: after ids)
    if (cached_.size() < ids.size()) {
      turn.finish = FinishReason::stopped;
    } else if (o.max_new_tokens == 0) {
      turn.finish = FinishReason::max_tokens;
    } else {
      const detail::SequenceRunner run{
          [&](std::span<const int32_t> fed) {
            return model_->extend(cache_, fed, 1, static_cast<int64_t>(fed.size()), false);
          },
          [&](int64_t n) { cache_.truncate(n); }, [&] { return cache_.length(); },
          [&](int64_t n) { ensure_capacity(n); }};
      const std::unique_ptr<detail::Drafter> drafter = detail::make_drafter(o.speculation, context);
      const detail::DecodeLimits limits{o.max_new_tokens, context, detail::exact_rows(ModelAccess::stack(*model_)),
                                        "ChatSession"};
      turn.finish = FinishReason::max_tokens;  // unless something below ends it first
      const detail::DecodeResult r = detail::decode_sequence(
          run, history, ids.size(), {logits.data(), static_cast<size_t>(V)}, o, rng_, drafter.get(), limits,
          [&](int32_t t) {
            if (stopped()) {
              turn.finish = FinishReason::stopped;
              return detail::Take::drop;
            }
            if (std::binary_search(stop_ids_.begin(), stop_ids_.end(), t)) {
              turn.finish = FinishReason::end_of_turn;
              return detail::Take::drop;
            }
            ++turn.generated_tokens;
            // An id past the tokenizer's (a padded embedding's row) has no text, as in transformers' decode.
            const std::string piece = t < tokenizer_->vocab_size() ? decoder.push(t) : std::string();
            if (!piece.empty() && on_text && !on_text(piece)) {
              turn.finish = FinishReason::stopped;
              return detail::Take::last;
            }
            return detail::Take::more;
          });
      if (r.context_full) turn.finish = FinishReason::context_full;
      turn.speculation = r.stats;
      cached_.assign(history.begin(), history.begin() + cache_.length());
    }
    turn.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  } catch (...) {
    cache_.reset();  // a failed step may have left the layers at different lengths
    cached_.clear();
    throw;
  }
  const std::string rest = decoder.finish();
  if (!rest.empty() && on_text) on_text(rest);
  turn.text = decoder.text();
  messages_.push_back({"assistant", turn.text});
  return turn;
}

std::vector<ChatMessage> ChatSession::parse_messages(std::string_view text) {
  constexpr std::string_view fn = "ChatSession::parse_messages";
  if (const size_t at = invalid_utf8_at(text); at != std::string_view::npos)
    fail(fn, "messages", "UTF-8 text", message("an invalid byte at offset ", at));
  const json j = detail::parse_json(text, fn, "messages");
  const json* list = &j;
  if (j.is_object()) {
    const auto it = j.find("messages");
    if (it == j.end()) fail(fn, "messages", "an array of messages or an object with \"messages\"", "an object without \"messages\"");
    list = &*it;
  }
  if (!list->is_array())
    fail(fn, "messages", "an array of {\"role\", \"content\"} objects", detail::json_excerpt(*list));
  if (list->empty()) fail(fn, "messages", "at least one message", "an empty array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string where = message("messages[", i, "]");
    if (!m.is_object()) fail(fn, where, "an object with \"role\" and \"content\"", detail::json_excerpt(m));
    ChatMessage msg;
    for (auto [key, field] : {std::pair{"role", &msg.role}, std::pair{"content", &msg.content}}) {
      const auto it = m.find(key);
      if (it == m.end()) fail(fn, where, message("an object with \"", key, "\""), detail::json_excerpt(m));
      if (!it->is_string()) fail(fn, message(where, ".", key), "a string", detail::json_excerpt(*it));
      *field = it->get<std::string>();
    }
    if (msg.role.empty()) fail(fn, where + ".role", "a role (\"system\", \"user\", \"assistant\", ...)", "\"\"");
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace mhsa
